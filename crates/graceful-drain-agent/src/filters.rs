//! Which pods a drain evicts, skips or refuses: kubectl's drain filters (docs/design.md §4), as
//! pure functions of a pod, the drain options and the current time.
//!
//! Filters run in kubectl's order and the first one that does not pass decides:
//! already-deleting (only with `skip_wait_for_delete_timeout`) → DaemonSet-owned → mirror
//! pods → isolated by our webhook (evicted whatever else holds: the webhook lets the
//! eviction through once the pod is due) → emptyDir → unreplicated.
//! Finished pods (Succeeded/Failed) pass the DaemonSet,
//! emptyDir and unreplicated filters. [`plan`] applies them to a node's pods and either
//! returns what to evict, or every refusal at once so the operator can fix them together
//! before anything was evicted.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use graceful_drain_core::labels::{DRAINING_LABEL, MIRROR_POD_ANNOTATION};

/// The kubectl drain options that decide what a drain may touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterOptions {
    /// Skip DaemonSet-managed pods instead of refusing the drain.
    pub ignore_daemonsets: bool,
    /// Evict pods with emptyDir volumes (their data is lost).
    pub delete_emptydir_data: bool,
    /// Evict pods no controller would recreate.
    pub force: bool,
    /// Pods whose deletion began longer ago than this are skipped (and not waited for).
    pub skip_wait_for_delete_timeout: Option<Duration>,
}

impl Default for FilterOptions {
    /// Production defaults: DaemonSet pods are skipped (they tolerate the cordon and would
    /// come back at once), everything else refuses like kubectl.
    fn default() -> Self {
        Self {
            ignore_daemonsets: true,
            delete_emptydir_data: false,
            force: false,
            skip_wait_for_delete_timeout: None,
        }
    }
}

/// `namespace/name` of a pod, for messages and maps.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    /// The pod's namespace (empty if the pod had none).
    pub namespace: String,
    /// The pod's name (empty if the pod had none).
    pub name: String,
}

impl PodKey {
    /// The key of `pod`.
    pub fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the DaemonSet controlling a pod looks like in the cluster (the only fact the
/// filters need from outside the pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DaemonSetLookup {
    /// The DaemonSet exists.
    Exists,
    /// The DaemonSet is gone: the pod is an orphan, evictable with `force`.
    NotFound,
    /// The lookup failed.
    Failed(String),
}

/// Why a pod is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// Its deletion began longer ago than `skip_wait_for_delete_timeout`.
    LongTerminating,
    /// Managed by a DaemonSet (which tolerates the cordon and would recreate it).
    DaemonSet,
    /// A mirror of a static pod; only the kubelet's manifest can remove it.
    Mirror,
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LongTerminating => "terminating longer than the skip-wait-for-delete timeout",
            Self::DaemonSet => "ignoring DaemonSet-managed Pods",
            Self::Mirror => "ignoring mirror Pods",
        })
    }
}

/// Why a pod stops the drain.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// Managed by a DaemonSet and `ignore_daemonsets` is off.
    DaemonSet,
    /// Has emptyDir volumes and `delete_emptydir_data` is off.
    LocalStorage,
    /// No controller and `force` is off.
    Unreplicated,
    /// The controlling DaemonSet could not be looked up.
    DaemonSetLookup(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DaemonSet => f.write_str(
                "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore)",
            ),
            Self::LocalStorage => f.write_str(
                "cannot delete Pods with local storage (use --delete-emptydir-data to override)",
            ),
            Self::Unreplicated => f.write_str(
                "cannot delete Pods that declare no controller (use --force to override)",
            ),
            Self::DaemonSetLookup(error) => {
                write!(f, "cannot look up the Pods' DaemonSet ({error})")
            }
        }
    }
}

/// A warning kubectl prints while still evicting the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warning {
    /// Evicting a pod whose DaemonSet is gone (`force`).
    OrphanedDaemonSetPod,
    /// Evicting a pod with emptyDir data (`delete_emptydir_data`).
    LocalStorage,
    /// Evicting a pod no controller recreates (`force`).
    Unreplicated,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OrphanedDaemonSetPod => "deleting orphaned DaemonSet Pods",
            Self::LocalStorage => "deleting Pods with local storage",
            Self::Unreplicated => "deleting Pods that declare no controller",
        })
    }
}

/// The decision for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Evict it, possibly with a warning.
    Evict(Option<Warning>),
    /// Our webhook already isolated it for an earlier eviction (label
    /// `graceful-drain.io/draining`): it is evicted whatever the other filters say (the
    /// webhook answers 429 until the load balancers have let go, then lets the eviction
    /// through). Its labels left its controller's selector, so without this it could look
    /// like a bare pod and refuse the drain.
    Await,
    /// Leave it alone; it does not count as remaining.
    Skip(Skip),
    /// The drain cannot proceed with these options.
    Refuse(Refusal),
}

/// The controller owner reference of `pod`, if any.
pub fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|owner| owner.controller == Some(true))
}

fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn has_empty_dir(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.volumes.as_ref())
        .is_some_and(|volumes| volumes.iter().any(|v| v.empty_dir.is_some()))
}

fn is_isolated(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(DRAINING_LABEL))
}

fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// Whether the pod's deletion began more than `timeout` before `now`.
fn terminating_longer_than(pod: &Pod, timeout: Duration, now: jiff::Timestamp) -> bool {
    let Some(deleted_at) = pod.metadata.deletion_timestamp.as_ref() else {
        return false;
    };
    let limit = jiff::SignedDuration::try_from(timeout).unwrap_or(jiff::SignedDuration::MAX);
    now.duration_since(deleted_at.0) > limit
}

/// Runs the filters on one pod in kubectl's order. `daemonset` is asked about the pod's
/// controlling DaemonSet only when the answer matters.
pub fn classify(
    pod: &Pod,
    opts: &FilterOptions,
    now: jiff::Timestamp,
    daemonset: impl FnOnce(&OwnerReference) -> DaemonSetLookup,
) -> Verdict {
    if let Some(timeout) = opts.skip_wait_for_delete_timeout.filter(|t| !t.is_zero())
        && terminating_longer_than(pod, timeout, now)
    {
        return Verdict::Skip(Skip::LongTerminating);
    }
    let finished = is_finished(pod);
    let controller = controller_of(pod);
    if let Some(owner) = controller.filter(|o| o.kind == "DaemonSet")
        && !finished
    {
        match daemonset(owner) {
            DaemonSetLookup::NotFound if opts.force => {
                return Verdict::Evict(Some(Warning::OrphanedDaemonSetPod));
            }
            DaemonSetLookup::NotFound => {
                return Verdict::Refuse(Refusal::DaemonSetLookup(format!(
                    "daemonsets.apps \"{}\" not found",
                    owner.name
                )));
            }
            DaemonSetLookup::Failed(error) => {
                return Verdict::Refuse(Refusal::DaemonSetLookup(error));
            }
            DaemonSetLookup::Exists if !opts.ignore_daemonsets => {
                return Verdict::Refuse(Refusal::DaemonSet);
            }
            DaemonSetLookup::Exists => return Verdict::Skip(Skip::DaemonSet),
        }
    }
    if is_mirror(pod) {
        return Verdict::Skip(Skip::Mirror);
    }
    if is_isolated(pod) && !finished {
        return Verdict::Await;
    }
    let mut warning = None;
    if has_empty_dir(pod) && !finished {
        if !opts.delete_emptydir_data {
            return Verdict::Refuse(Refusal::LocalStorage);
        }
        warning = Some(Warning::LocalStorage);
    }
    if controller.is_none() && !finished {
        if !opts.force {
            return Verdict::Refuse(Refusal::Unreplicated);
        }
        warning = Some(Warning::Unreplicated);
    }
    Verdict::Evict(warning)
}

/// What a drain will do with a node's pods.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Pods to evict, in list order.
    pub evict: Vec<Pod>,
    /// Pods already isolated by our webhook: evicted once due, whatever else holds.
    pub awaited: Vec<Pod>,
    /// Pods left alone, and why.
    pub skipped: Vec<(PodKey, Skip)>,
    /// Pods evicted with a warning.
    pub warnings: Vec<(PodKey, Warning)>,
}

/// Every refusal of a plan, grouped by reason (each group lists its pods).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refused(pub BTreeMap<Refusal, Vec<PodKey>>);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (reason, pods)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let names: Vec<String> = pods.iter().map(ToString::to_string).collect();
            write!(f, "{reason}: {}", names.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

/// Applies [`classify`] to every pod. Any refusal refuses the whole plan, listing all of
/// them, like `kubectl drain` does before it evicts anything.
pub fn plan<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    opts: &FilterOptions,
    now: jiff::Timestamp,
    mut daemonset: impl FnMut(&str, &OwnerReference) -> DaemonSetLookup,
) -> Result<Plan, Refused> {
    let mut plan = Plan::default();
    let mut refused = Refused::default();
    for pod in pods {
        let key = PodKey::of(pod);
        match classify(pod, opts, now, |owner| daemonset(&key.namespace, owner)) {
            Verdict::Evict(warning) => {
                if let Some(warning) = warning {
                    plan.warnings.push((key, warning));
                }
                plan.evict.push(pod.clone());
            }
            Verdict::Await => plan.awaited.push(pod.clone()),
            Verdict::Skip(skip) => plan.skipped.push((key, skip)),
            Verdict::Refuse(reason) => refused.0.entry(reason).or_default().push(key),
        }
    }
    if refused.0.is_empty() {
        Ok(plan)
    } else {
        Err(refused)
    }
}

pub use graceful_drain_core::labels::UNSCHEDULABLE_TAINT;

/// Whether `pod` tolerates the cordon's NoSchedule taint (a toleration for its key, or an
/// `Exists` toleration without a key), so the scheduler may place it on a cordoned node.
pub fn tolerates_cordon(pod: &Pod) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations.into_iter().flatten().any(|t| {
        let exists = t.operator.as_deref() == Some("Exists");
        let key = match t.key.as_deref() {
            None | Some("") => exists,
            Some(key) => key == UNSCHEDULABLE_TAINT,
        };
        let value = exists || t.value.as_deref().unwrap_or_default().is_empty();
        let effect = matches!(t.effect.as_deref(), None | Some("" | "NoSchedule"));
        key && value && effect
    })
}

#[cfg(test)]
mod tests;
