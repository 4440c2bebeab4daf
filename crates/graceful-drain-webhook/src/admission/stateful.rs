//! Whether a DELETE claiming the StatefulSet controller is the step that controller takes
//! now, judged on the live StatefulSet and its live members.
//!
//! kube-controller-manager v1.37 updates a StatefulSet from its highest ordinal down and
//! deletes no more members than `maxUnavailable` (1 unless set; the
//! `MaxUnavailableStatefulSet` gate is on by default from v1.37) less those already
//! unavailable or terminating; it waits while any member is unavailable
//! (`updateStatefulSetAfterInvariantEstablished` in
//! pkg/controller/statefulset/stateful_set_control.go; `getStatefulSetMaxUnavailable` rounds
//! a percentage up and never gives less than one). So a DELETE of an outdated member is
//! backed only when no member of a higher ordinal is still due for the update, and fewer
//! than `maxUnavailable` other members are unavailable, terminating or being isolated by
//! us (each of those is a member the controller already took, or a step it waits on).
//! During a stalled rollout (a new member never turns ready) nothing is backed; a burst of
//! DELETEs claiming the controller gets one member at most.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::gather::{self, Member, REVISION_LABEL, ordinal};
use crate::decide::PodFacts;
use crate::state::AppState;

/// What a StatefulSet's spec and status say of the members its controller deletes.
struct Rollout<'a> {
    set: &'a str,
    /// `spec.ordinals.start`.
    start: i64,
    replicas: i64,
    /// The rolling update's partition, as an offset from `start`.
    partition: i64,
    on_delete: bool,
    /// `status.updateRevision`.
    update: Option<&'a str>,
    /// `maxUnavailable` (`getStatefulSetMaxUnavailable`: a percentage of the replicas
    /// rounded up, at least one).
    max_unavailable: i64,
}

impl<'a> Rollout<'a> {
    fn of(sts: &'a StatefulSet) -> Rollout<'a> {
        let spec = sts.spec.as_ref();
        let replicas = i64::from(spec.and_then(|s| s.replicas).unwrap_or(1));
        let strategy = spec.and_then(|s| s.update_strategy.as_ref());
        let rolling = strategy.and_then(|u| u.rolling_update.as_ref());
        let max_unavailable = match rolling.and_then(|r| r.max_unavailable.as_ref()) {
            None => 1,
            Some(IntOrString::Int(n)) => i64::from(*n),
            Some(IntOrString::String(s)) => s
                .strip_suffix('%')
                .and_then(|p| p.parse::<i64>().ok())
                .map_or(1, |p| (p * replicas + 99) / 100),
        };
        Rollout {
            set: sts.metadata.name.as_deref().unwrap_or_default(),
            start: spec
                .and_then(|s| s.ordinals.as_ref())
                .and_then(|o| o.start)
                .map_or(0, i64::from),
            replicas,
            partition: rolling.and_then(|r| r.partition).map_or(0, i64::from),
            on_delete: strategy.and_then(|u| u.type_.as_deref()) == Some("OnDelete"),
            update: sts
                .status
                .as_ref()
                .and_then(|s| s.update_revision.as_deref()),
            max_unavailable: max_unavailable.max(1),
        }
    }

    /// The ordinal of pod `pod`, or why it has none.
    fn ordinal(&self, pod: &str) -> Result<i64, String> {
        ordinal(self.set, pod)
            .ok_or_else(|| format!("pod {pod} has no ordinal of StatefulSet {}", self.set))
    }

    fn in_range(&self, ordinal: i64) -> bool {
        ordinal >= self.start && ordinal < self.start + self.replicas
    }

    /// In range and at or past the partition: updated by a rolling update.
    fn rolled(&self, ordinal: i64) -> bool {
        self.in_range(ordinal) && ordinal >= self.start + self.partition
    }
}

/// Why the StatefulSet controller deletes a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deletes {
    /// Its ordinal is outside the replicas.
    ScaleDown,
    /// It is of an older revision, at or past the partition.
    Update,
}

/// Whether the StatefulSet controller deletes `pod` now: a pod whose ordinal is outside
/// the StatefulSet's range (a scale-down), or of another revision than `status.
/// updateRevision` at or past the rolling update's partition (`updateStatefulSet` in
/// pkg/controller/statefulset/stateful_set_control.go deletes exactly those; under
/// `OnDelete` it deletes none for an update). `Err` says why not.
pub(crate) fn statefulset_deletes(sts: &StatefulSet, pod: &PodFacts) -> Result<Deletes, String> {
    let rollout = Rollout::of(sts);
    let name = rollout.set;
    let ordinal = rollout.ordinal(&pod.name)?;
    if !rollout.in_range(ordinal) {
        return Ok(Deletes::ScaleDown);
    }
    if rollout.on_delete {
        return Err(format!(
            "StatefulSet {name} updates OnDelete and keeps ordinal {ordinal}"
        ));
    }
    let revision = pod.labels.get(REVISION_LABEL).map(String::as_str);
    match rollout.update {
        Some(update) if revision != Some(update) && rollout.rolled(ordinal) => Ok(Deletes::Update),
        _ => Err(format!(
            "StatefulSet {name} keeps pod {} (ordinal {ordinal} of {}, its revision current)",
            pod.name, rollout.replicas
        )),
    }
}

/// `Ok` when the controller of `sts` takes down member `pod` now, judged on its live
/// `members` (this pod among them or not); else why not.
pub(crate) fn is_the_step(sts: &StatefulSet, pod: &str, members: &[Member]) -> Result<(), String> {
    let rollout = Rollout::of(sts);
    let set = rollout.set;
    let own = rollout.ordinal(pod)?;
    let others = members.iter().filter(|m| m.name != pod);
    let taken: Vec<&str> = others
        .clone()
        .filter(|m| !m.available || m.terminating || m.isolated)
        .map(|m| m.name.as_str())
        .collect();
    let most = rollout.max_unavailable;
    if i64::try_from(taken.len()).unwrap_or(i64::MAX) >= most {
        return Err(format!(
            "StatefulSet {set} already has {} of its members unavailable, terminating or being isolated ({}); its controller takes down at most {most} at once",
            taken.len(),
            taken.join(", ")
        ));
    }
    let first = others
        .filter(|m| m.ordinal > own && rollout.rolled(m.ordinal))
        .filter(|m| m.revision.as_deref() != rollout.update && !m.terminating)
        .max_by_key(|m| m.ordinal);
    if let Some(first) = first {
        return Err(format!(
            "StatefulSet {set} updates {} (a higher ordinal) before {pod}",
            first.name
        ));
    }
    Ok(())
}

/// Whether StatefulSet `name`, read live with its members, backs a DELETE of `pod` by its
/// controller: its controller deletes the pod for a scale-down or an update
/// ([`statefulset_deletes`]), and for an update this is its step now ([`is_the_step`]).
/// A failed read or a missing StatefulSet backs nothing. The reads are shared with the
/// reviews around it ([`super::gather::ControllerReads`]).
pub(super) async fn backs(state: &AppState, pod: &PodFacts, name: &str) -> bool {
    let namespace = pod.namespace.as_str();
    let sts = match gather::statefulset(state, namespace, name).await {
        Ok(Some(sts)) => sts,
        Ok(None) => return false,
        Err(error) => {
            tracing::warn!(%error, "could not read StatefulSet {namespace}/{name}; the DELETE counts as unconfirmed");
            return false;
        }
    };
    let step = match statefulset_deletes(&sts, pod) {
        Err(why) => Err(why),
        Ok(Deletes::ScaleDown) => Ok(()),
        Ok(Deletes::Update) => match gather::members(state, namespace, &sts).await {
            Ok(members) => is_the_step(&sts, &pod.name, &members),
            Err(error) => Err(format!("could not list its members: {error}")),
        },
    };
    match step {
        Ok(()) => true,
        Err(why) => {
            tracing::info!(%why, "StatefulSet DELETE not backed by the live StatefulSet; unconfirmed");
            false
        }
    }
}
