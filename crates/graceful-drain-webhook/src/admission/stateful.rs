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
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::ListParams;

use crate::decide::PodFacts;
use crate::state::AppState;
use graceful_drain_core::labels::DRAINING_LABEL;

/// The label the StatefulSet controller puts its revision in (`apps/v1`
/// `ControllerRevisionHashLabelKey`).
pub(super) const REVISION_LABEL: &str = "controller-revision-hash";

/// Whether the StatefulSet controller deletes `pod` now: a pod whose ordinal is outside
/// the StatefulSet's range (a scale-down), or of another revision than `status.
/// updateRevision` at or past the rolling update's partition (`updateStatefulSet` in
/// pkg/controller/statefulset/stateful_set_control.go deletes exactly those; under
/// `OnDelete` it deletes none for an update). `Err` says why not.
pub(crate) fn statefulset_deletes(sts: &StatefulSet, pod: &PodFacts) -> Result<(), String> {
    let name = sts.metadata.name.as_deref().unwrap_or_default();
    let spec = sts.spec.as_ref();
    let ordinal = ordinal(name, &pod.name)
        .ok_or_else(|| format!("pod {} has no ordinal of StatefulSet {name}", pod.name))?;
    let start = spec
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .map_or(0, i64::from);
    let replicas = i64::from(spec.and_then(|s| s.replicas).unwrap_or(1));
    if ordinal < start || ordinal >= start + replicas {
        return Ok(());
    }
    let strategy = spec.and_then(|s| s.update_strategy.as_ref());
    if strategy.and_then(|u| u.type_.as_deref()) == Some("OnDelete") {
        return Err(format!(
            "StatefulSet {name} updates OnDelete and keeps ordinal {ordinal}"
        ));
    }
    let partition = strategy
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .map_or(0, i64::from);
    let update = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref());
    let revision = pod.labels.get(REVISION_LABEL).map(String::as_str);
    match update {
        Some(update) if revision != Some(update) && ordinal >= start + partition => Ok(()),
        _ => Err(format!(
            "StatefulSet {name} keeps pod {} (ordinal {ordinal} of {replicas}, its revision current)",
            pod.name
        )),
    }
}

/// What the step rule needs of one member.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub name: String,
    pub ordinal: i64,
    /// Its `controller-revision-hash`.
    pub revision: Option<String>,
    /// `Ready` is `True` and it is not terminating.
    pub available: bool,
    pub terminating: bool,
    /// It carries our isolation.
    pub isolated: bool,
}

/// The ordinal of pod `pod` of StatefulSet `set` (`<set>-<ordinal>`).
pub(super) fn ordinal(set: &str, pod: &str) -> Option<i64> {
    pod.strip_prefix(set)?.strip_prefix('-')?.parse().ok()
}

/// How many members the controller takes down at once (`getStatefulSetMaxUnavailable`:
/// a percentage of the replicas rounded up, at least one).
fn max_unavailable(sts: &StatefulSet) -> i64 {
    let spec = sts.spec.as_ref();
    let replicas = i64::from(spec.and_then(|s| s.replicas).unwrap_or(1));
    let given = spec
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.as_ref());
    let value = match given {
        None => 1,
        Some(IntOrString::Int(n)) => i64::from(*n),
        Some(IntOrString::String(s)) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map_or(1, |p| (p * replicas + 99) / 100),
    };
    value.max(1)
}

/// `Ok` when the controller of `sts` takes down member `pod` now, judged on its live
/// `members` (this pod among them or not); else why not.
pub(crate) fn is_the_step(sts: &StatefulSet, pod: &str, members: &[Member]) -> Result<(), String> {
    let set = sts.metadata.name.as_deref().unwrap_or_default();
    let own = ordinal(set, pod)
        .ok_or_else(|| format!("pod {pod} has no ordinal of StatefulSet {set}"))?;
    let spec = sts.spec.as_ref();
    let start = spec
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .map_or(0, i64::from);
    let replicas = i64::from(spec.and_then(|s| s.replicas).unwrap_or(1));
    let partition = spec
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .map_or(0, i64::from);
    let update = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref());
    let others = members.iter().filter(|m| m.name != pod);
    let taken: Vec<&str> = others
        .clone()
        .filter(|m| !m.available || m.terminating || m.isolated)
        .map(|m| m.name.as_str())
        .collect();
    let most = max_unavailable(sts);
    if i64::try_from(taken.len()).unwrap_or(i64::MAX) >= most {
        return Err(format!(
            "StatefulSet {set} already has {} of its members unavailable, terminating or being isolated ({}); its controller takes down at most {most} at once",
            taken.len(),
            taken.join(", ")
        ));
    }
    let first = others
        .filter(|m| {
            m.ordinal > own && m.ordinal < start + replicas && m.ordinal >= start + partition
        })
        .filter(|m| m.revision.as_deref() != update && !m.terminating)
        .max_by_key(|m| m.ordinal);
    if let Some(first) = first {
        return Err(format!(
            "StatefulSet {set} updates {} (a higher ordinal) before {pod}",
            first.name
        ));
    }
    Ok(())
}

/// The live members of `sts` (pods it controls, by UID).
async fn members(
    state: &AppState,
    namespace: &str,
    sts: &StatefulSet,
) -> Result<Vec<Member>, kube::Error> {
    let set = sts.metadata.name.as_deref().unwrap_or_default();
    let uid = sts.metadata.uid.clone().unwrap_or_default();
    let labels = sts
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let pods = Api::<Pod>::namespaced(state.ctx.client.clone(), namespace)
        .list(&ListParams::default().labels(&labels))
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| {
            p.metadata.owner_references.as_ref().is_some_and(|refs| {
                refs.iter()
                    .any(|r| r.controller == Some(true) && r.uid == uid)
            })
        })
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            let labels = p.metadata.labels.as_ref();
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let terminating = p.metadata.deletion_timestamp.is_some();
            Some(Member {
                ordinal: ordinal(set, &name)?,
                revision: labels.and_then(|l| l.get(REVISION_LABEL)).cloned(),
                available: ready && !terminating,
                terminating,
                isolated: labels.is_some_and(|l| l.contains_key(DRAINING_LABEL)),
                name,
            })
        })
        .collect())
}

/// Whether StatefulSet `name`, read live with its members, backs a DELETE of `pod` by its
/// controller: its controller deletes the pod for a scale-down or an update
/// ([`statefulset_deletes`]), and for an update this is its step now ([`is_the_step`]).
/// A failed read or a missing StatefulSet backs nothing.
pub(super) async fn backs(state: &AppState, pod: &PodFacts, name: &str) -> bool {
    let api = Api::<StatefulSet>::namespaced(state.ctx.client.clone(), &pod.namespace);
    let sts = match api.get_opt(name).await {
        Ok(Some(sts)) => sts,
        Ok(None) => return false,
        Err(error) => {
            tracing::warn!(%error, "could not read StatefulSet {}/{name}; the DELETE counts as unconfirmed", pod.namespace);
            return false;
        }
    };
    let step = match statefulset_deletes(&sts, pod) {
        Err(why) => Err(why),
        // Out of its range: a scale-down, which the controller takes from the top.
        Ok(()) if scaled_away(&sts, pod) => Ok(()),
        Ok(()) => match members(state, &pod.namespace, &sts).await {
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

/// Whether `pod`'s ordinal is outside `sts`'s range.
fn scaled_away(sts: &StatefulSet, pod: &PodFacts) -> bool {
    let set = sts.metadata.name.as_deref().unwrap_or_default();
    let spec = sts.spec.as_ref();
    let start = spec
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .map_or(0, i64::from);
    let replicas = i64::from(spec.and_then(|s| s.replicas).unwrap_or(1));
    ordinal(set, &pod.name).is_some_and(|o| o < start || o >= start + replicas)
}
