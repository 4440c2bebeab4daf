//! Acting on a decision to isolate: PDB accounting, the relabelling patch and the Event.
//!
//! Order matters and follows the API server's eviction code: first the disruption is
//! recorded in the PDB (`status.disruptedPods` + `disruptionsAllowed - 1` in one
//! resourceVersion-guarded status update, re-read and retried on 409), then the pod is
//! patched with a JSON patch whose `test` ops on `resourceVersion` and `labels` make a
//! concurrent change fail instead of being overwritten. A failed test surfaces as
//! [`Error::Conflict`] so the caller re-reads the pod and decides again.
//!
//! One job per file: this one orders the steps; `owners` reads the pod's controller
//! (`owner_reads` remembers what was read), `pdb` charges and refunds budgets against the
//! API server (`budget` holds their arithmetic and this replica's turns at them),
//! `relabel` builds the patch, `record` writes the Events, `context` holds what they
//! share and `error` their errors. Uses run one way, never back to a caller: `mod` first,
//! then `record`, `pdb`, `relabel`, `owners`, then `context`, and last the leaves
//! `budget`, `owner_reads` and `error`.

mod budget;
mod context;
mod error;
mod node_reads;
mod owner_reads;
mod owners;
mod pdb;
mod record;
mod relabel;
#[cfg(test)]
pub(crate) mod scenarios;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PatchParams;

use super::decide::{Charge, PodFacts, Snapshot, labels_to_remove, service_left_only_by_pinned};
use graceful_drain_core::labels::{FIELD_MANAGER, webhook_reason};

pub use budget::{Budget, PdbGate, PdbGates, charge, charge_all};
pub use context::{Context, EVENT_QUEUE, EventSink};
pub use error::Error;
use error::{api_err, pod_ref};
pub use node_reads::{NODE_READ_TTL, NodeReads};
pub use owner_reads::{OwnerFacts, OwnerReads};
use owners::owner_policy;
use pdb::{Accounting, account};
pub(crate) use pdb::{Change, Retries, StatusError, update_status};
pub use pdb::{consume_disruption, refund_disruption};
pub use record::{Severity, record_event};
pub use relabel::{
    IDENTITY_LABELS, controller_handover, draining_value, isolation_patch, leave_selectors,
};

/// Result of [`isolate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The pod is isolated; the labels removed are returned. `uncharged` names the PDB
    /// that could not record the disruption (a DELETE isolates anyway).
    Isolated {
        /// The labels taken off the pod, with their values (also stored on the pod to
        /// restore from).
        removed: BTreeMap<String, String>,
        /// The PDB (`namespace/name`) that did not record the disruption: its budget was
        /// spent, its update failed, or several PDBs select the pod.
        uncharged: Option<String>,
        /// When the deferred deleter may delete it (see [`Plan::counted_from_now`]).
        delete_at: Timestamp,
    },
    /// A PDB refused (evictions only).
    Refused(Budget),
}

/// What to isolate for: the decision's delete time, grace period and PDB accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// When the pod may be deleted, as decided; moved later by
    /// [`Plan::counted_from_now`] when the work before the relabel was slow.
    pub delete_at: Timestamp,
    /// The caller's grace period in seconds, recorded on the pod for its removal.
    pub grace_period: Option<i64>,
    /// Whether the PDB must allow the disruption (eviction) or is charged when it can
    /// (DELETE).
    pub charge: Charge,
    /// Who removes the pod once it is due (see [`OnDue`]).
    pub on_due: OnDue,
    /// Something only an authenticated user can do stands behind this isolation: the
    /// pod's node is being drained ([`NodeDrain::Draining`]) or the live ReplicaSet has a pod too
    /// many. Only then may an evicted pod go to the deferred deleter.
    pub confirmed: bool,
}

/// Who removes an isolated pod once its delay is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDue {
    /// The caller, retrying its eviction (refused with 429 until then) or its held DELETE;
    /// if nobody has [`Context::restore_after`] past the delete time, the webhook puts the
    /// pod back. A review's word alone (which anyone reaching the webhook's port could forge)
    /// never deletes anything.
    Caller,
    /// The deferred deleter: a ReplicaSet scale-down the webhook refused after checking on
    /// the live ReplicaSet that it has a replica too many, or an eviction from a node
    /// being drained.
    Deleter,
}

/// How long after its delete time an isolated pod that nobody evicted or deleted goes back
/// into its Services (the default of [`Context::restore_after`]): every eviction caller
/// retries within seconds (kubectl every 5 s, Cluster Autoscaler every 10 s, our node
/// agent at the Retry-After we send), so a minute without one means none is coming (a
/// forged or replayed review, a caller that gave up).
pub const RESTORE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// When a pod due at `delete_at` that no caller removed by `restore_after` later goes
/// back into its Services.
pub fn restore_at(delete_at: Timestamp, restore_after: std::time::Duration) -> Timestamp {
    super::decide::add(delete_at, restore_after)
}

/// Work before the relabel shorter than this leaves the delete time as decided: the
/// delay is counted in seconds, and tests compare exact times.
const LATE_RELABEL: std::time::Duration = std::time::Duration::from_millis(250);

impl Plan {
    /// The deregistration delay counts from the relabel, which takes the pod out of its
    /// Services, not from the decision: when the owner lookup and PDB accounting before it
    /// took `spent` (a throttled API server, PDB conflicts), the delete time moves by as
    /// much, so the load balancers still get the whole delay.
    pub fn counted_from_now(self, spent: std::time::Duration) -> Self {
        if spent < LATE_RELABEL {
            return self;
        }
        let shift = jiff::SignedDuration::try_from(spent).unwrap_or(jiff::SignedDuration::ZERO);
        Self {
            delete_at: self.delete_at.checked_add(shift).unwrap_or(self.delete_at),
            ..self
        }
    }
}

/// Taints only a drainer puts on a node, just before it evicts the node's pods: Karpenter's
/// (`karpenter.sh/disrupted`, pkg/apis/v1/taints.go) and Cluster Autoscaler's
/// (`ToBeDeletedByClusterAutoscaler`, cluster-autoscaler/utils/taints/taints.go). The
/// cordon's own taint (`node.kubernetes.io/unschedulable`) is not one: a cordon alone
/// says nothing is scheduled there, not that the node is being emptied.
pub const DRAIN_TAINTS: [&str; 2] = ["karpenter.sh/disrupted", "ToBeDeletedByClusterAutoscaler"];

/// What a pod's node, read live, says about a drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeDrain {
    /// Schedulable, gone, or unknown (a failed read): the safe side, nothing confirmed.
    No,
    /// Cordoned and nothing more. People cordon nodes for many reasons, and anyone who
    /// reaches the port can send an eviction of its pods: an eviction there is not
    /// confirmed, and its caller's retry has the webhook remove the due pod only once the
    /// pod's ReplicaSet has a ready replacement or its budgets count it
    /// (`admission::evict`).
    Cordoned,
    /// A drainer is emptying it, by a mark only an authenticated drainer writes: one of
    /// [`DRAIN_TAINTS`], or our node agent's `DrainInProgress=True` condition. Why, for the
    /// logs.
    Draining(String),
}

/// What pod `node` says about a drain, read live (see [`NodeDrain`]).
pub async fn node_drain(ctx: &Context, node: Option<&str>) -> NodeDrain {
    let Some(node) = node else {
        return NodeDrain::No;
    };
    ctx.nodes.drain(&ctx.client, node).await
}

/// [`NodeDrain`] of `node` as read.
pub fn drain_of(node: &k8s_openapi::api::core::v1::Node) -> NodeDrain {
    let spec = node.spec.as_ref();
    let taints = spec.and_then(|s| s.taints.as_deref()).unwrap_or_default();
    if let Some(taint) = taints
        .iter()
        .find(|t| DRAIN_TAINTS.contains(&t.key.as_str()))
    {
        return NodeDrain::Draining(format!("taint {}", taint.key));
    }
    let agent_drains = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == graceful_drain_core::labels::node_condition::DRAIN_IN_PROGRESS
                    && c.status == "True"
            })
        });
    if agent_drains {
        return NodeDrain::Draining("graceful-drain's node agent drains it".to_string());
    }
    let cordoned = spec.and_then(|s| s.unschedulable) == Some(true)
        || taints
            .iter()
            .any(|t| t.key == graceful_drain_core::labels::UNSCHEDULABLE_TAINT);
    if cordoned {
        NodeDrain::Cordoned
    } else {
        NodeDrain::No
    }
}

/// Isolates `pod`: PDB accounting, then the relabelling patch, then an Event.
pub async fn isolate(
    ctx: &Context,
    pod: &PodFacts,
    snap: &Snapshot,
    plan: Plan,
    now: Timestamp,
) -> Result<Outcome, Error> {
    let started = std::time::Instant::now();
    let (removed, controller) = what_leaves(ctx, pod, snap).await?;
    let (charged, uncharged) = match account(ctx, pod, snap, plan.charge, now).await? {
        Accounting::Refused(budget) => return Ok(Outcome::Refused(budget)),
        Accounting::Charged(pdb) => (Some(pdb), None),
        Accounting::Free => (None, None),
        Accounting::Uncharged(pdb) => (None, Some(pdb)),
    };
    let plan = plan.counted_from_now(started.elapsed());
    let on_due = who_removes(&plan, snap, &removed);
    let restore = (on_due == OnDue::Caller).then(|| restore_at(plan.delete_at, ctx.restore_after));
    let mut patch = isolation_patch(pod, &removed, plan.delete_at, plan.grace_period, restore);
    if let Some(controller) = controller {
        patch.0.extend(controller_handover(pod, controller));
    }
    if let Err(error) = relabel(ctx, pod, patch).await {
        // The pod was not isolated: give the disruption back, or the budget stays spent
        // (and real evictions refused) until the disruption controller drops the entry.
        if let Some(pdb) = &charged {
            refund_disruption(ctx, &pod.namespace, pdb, &pod.name).await;
        }
        return Err(error);
    }
    ctx.cache
        .set_isolated(&pod.namespace, &pod.name, Some(plan.delete_at));
    let mut message = format!(
        "Isolated from its Services and controller (removed labels: {}); deletion at {}",
        removed.keys().cloned().collect::<Vec<_>>().join(", "),
        plan.delete_at
    );
    if let Some(pdb) = &uncharged {
        message.push_str(&format!(
            "; PDB {pdb} had no disruption left, not charged (a DELETE is never blocked by a PDB)"
        ));
    }
    record_event(
        ctx,
        pod,
        Severity::Normal,
        webhook_reason::ISOLATED,
        &message,
        now,
    )
    .await;
    Ok(Outcome::Isolated {
        removed,
        uncharged,
        delete_at: plan.delete_at,
    })
}

/// The labels the isolation removes (taking the pod out of its Services and, for a
/// ReplicaSet, its controller's selector) and the controller reference it hands the pod
/// to; an error when the pod cannot leave a Service without leaving its controller's
/// selector, or its Deployment rolls out with `Recreate`.
async fn what_leaves(
    ctx: &Context,
    pod: &PodFacts,
    snap: &Snapshot,
) -> Result<(BTreeMap<String, String>, Option<serde_json::Value>), Error> {
    let (mut policy, controller, recreate) = owner_policy(ctx, pod).await?;
    if let Some(deployment) = recreate {
        return Err(Error::Recreate {
            pod: pod_ref(pod),
            deployment,
        });
    }
    if let Some(service) = service_left_only_by_pinned(&pod.labels, &snap.services, &policy.pinned)
    {
        let owner = pod
            .owner
            .as_ref()
            .map(|(kind, name)| format!("{} {name}", kind.name()))
            .unwrap_or_default();
        return Err(Error::ControllerSelector {
            pod: pod_ref(pod),
            owner,
            service: service.name.clone(),
        });
    }
    policy.keep.extend(ctx.keep_labels.iter().cloned());
    let leave = leave_selectors(snap, policy.leave);
    let removed = labels_to_remove(&pod.labels, &leave, &policy.keep, &policy.pinned);
    Ok((removed, controller))
}

/// Who removes the pod once it is due.
///
/// An evicted pod whose node is being drained (cordoned, or a drainer's taint: only an
/// authenticated user can start that) goes to the deleter, which removes it at its
/// delete time; the caller's retry, held until then, then finds it gone (404) and is
/// done at once instead of evicting it itself and polling for its deletion (kubectl
/// drain polls every second, docs/design.md §4). A pod its PDB still selects after
/// isolation (a StatefulSet's pod behind a budget on the StatefulSet's own labels)
/// could not be evicted by its caller anyway: its own disruption spent the budget, and
/// the API server charges every eviction again (`checkAndDecrement` in
/// pkg/registry/core/pod/storage/eviction.go exempts no pod already in
/// `disruptedPods`).
///
/// The deleter acts on the webhook's own authority, so a review's word alone never
/// sends a pod there (anyone reaching the port can post one, docs/security.md): off a
/// drained node the caller comes back itself, and a pod nobody removes is restored.
fn who_removes(plan: &Plan, snap: &Snapshot, removed: &BTreeMap<String, String>) -> OnDue {
    let in_pdb = snap
        .pdbs
        .iter()
        .any(|pdb| !removed.keys().any(|k| pdb.selector_keys.contains(k)));
    match plan.on_due {
        OnDue::Caller if plan.charge == Charge::Required && plan.confirmed => OnDue::Deleter,
        OnDue::Caller if in_pdb && plan.charge == Charge::Required => {
            tracing::info!(
                "pod stays in its PDB once isolated but its node is not being drained: the caller must remove it"
            );
            OnDue::Caller
        }
        on_due => on_due,
    }
}

/// Sends the isolation `patch` of `pod`.
async fn relabel(ctx: &Context, pod: &PodFacts, patch: json_patch::Patch) -> Result<(), Error> {
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &pod.namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let patched = api
        .patch(&pod.name, &params, &kube::api::Patch::Json::<()>(patch))
        .await;
    patched.map(|_| ()).map_err(|source| match source {
        // 409: resourceVersion moved; 422: a `test` op failed (how the API server
        // reports it) — or a real validation error, told apart by re-reading the pod;
        // 404: the pod (read from a node's watch) is gone, which the re-read tells.
        kube::Error::Api(status) if matches!(status.code, 404 | 409 | 422) => Error::Conflict {
            pod: pod_ref(pod),
            code: status.code,
        },
        source => api_err(pod, "patch pod", source),
    })
}

#[cfg(test)]
pub(crate) mod tests;
