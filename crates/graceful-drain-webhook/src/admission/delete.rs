//! `DELETE pods`: the DELETE's fast path (neither isolated nor listed nor selected), the
//! live checks that stand behind the webhook deleting a pod itself (the ReplicaSet's
//! surplus), the hold slots, and the answers — allowed after a hold, or refused for a
//! ReplicaSet controller whose pod the deferred deleter removes after its delay.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use tokio::time::Instant;

use super::answer::{Answer, Outcome};
use super::gather;
use super::settle::{Settled, settle, settle_until};
use crate::decide::{
    self, CONTROLLER_MANAGER, DAEMONSET_CONTROLLER, OwnerKind, PodFacts, STATEFULSET_CONTROLLER,
    is_replicaset_controller, of_replicaset,
};
use crate::review;
use crate::state::AppState;

/// The answer to DELETE `del`, by `deadline`.
pub(super) async fn answer_deletion(
    state: &AppState,
    del: review::Deletion,
    deadline: Instant,
) -> Answer {
    let glance = gather::deletion_glance(state, &del);
    if let Some(pass) = decide::fast_pass(&del.request, &glance, &state.settings) {
        return Answer::Allow(Outcome::Pass(pass));
    }
    let mut req = del.request.clone();
    let pod = match live(state, del, deadline).await {
        Ok(pod) => pod,
        Err(answer) => return answer,
    };
    // The DELETE is about this incarnation of the pod: if a re-read after a conflict finds
    // a same-name replacement, it is left alone.
    req.preconditions.uid.get_or_insert_with(|| pod.uid.clone());
    let scale_down = of_replicaset(&pod) && is_replicaset_controller(&req.user);
    let draining = pod
        .labels
        .contains_key(graceful_drain_core::labels::DRAINING_LABEL);
    // The ReplicaSet's turn, held until the pod is isolated: the next DELETE of one of its
    // pods counts this isolation.
    let _turn = if scale_down && !draining {
        match surplus_turn(state, &pod).await {
            Ok(turn) => Some(turn),
            Err(answer) => return answer,
        }
    } else {
        None
    };
    req.owner_backed = owner_backs(state, &req, &pod).await;
    // Every DELETE this replica would hold takes a slot first, a repeated call for one
    // DELETE too (the first call's slot was freed when it was answered); with every slot
    // taken it goes through at once, unprotected, rather than tie up one more of the API
    // server's seats. A ReplicaSet's scale-down is answered at once and needs none.
    let _slot = match (scale_down, state.holds.slot()) {
        (true, _) => None,
        (false, Some(slot)) => Some(slot),
        (false, None) => {
            tracing::warn!(
                max = state.holds.max,
                "every hold slot is taken; letting the DELETE through unprotected"
            );
            return Answer::Allow(Outcome::HoldLimit);
        }
    };
    // A DELETE is never denied for want of time: past the deadline it is allowed (the
    // pod isolated if that finished, as it usually has).
    let settled = settle_until(deadline, || settle(state, &req, pod.clone(), true));
    let settled = tokio::time::timeout_at(deadline, settled)
        .await
        .unwrap_or(Settled::Deadline);
    if let (Settled::Isolated(_), Some((_, owner))) = (&settled, &pod.owner) {
        state.controllers.isolated_one_of(&pod.namespace, owner);
    }
    settled_answer(state, &pod, settled, scale_down, deadline).await
}

/// The DELETE's pod, read live: nothing past the fast path is taken on the review's word
/// (anyone reaching the port can post one, docs/security.md), and a review of a pod that
/// does not exist, or of an earlier incarnation, changes and writes nothing (`Err`: the
/// answer then).
async fn live(
    state: &AppState,
    del: review::Deletion,
    deadline: Instant,
) -> Result<PodFacts, Answer> {
    let Some(claimed) = del.pod() else {
        return Err(Answer::Allow(Outcome::NotOurs));
    };
    let claimed = review::pod_facts(&claimed);
    let live =
        tokio::time::timeout_at(deadline, gather::claimed_pod(state, &claimed, deadline)).await;
    match live {
        Ok(Ok(Some(pod))) => Ok(pod),
        Ok(Ok(None)) => Err(Answer::Allow(Outcome::NotLive)),
        Ok(Err(why)) => {
            tracing::warn!(%why, "could not read the pod of a DELETE; letting it through");
            Err(Answer::Allow(Outcome::Error))
        }
        Err(_) => Err(Answer::Allow(Settled::Deadline.outcome())),
    }
}

/// The ReplicaSet's turn for a DELETE claiming its controller, once the live ReplicaSet
/// backs it; `Err` with the refusal otherwise.
///
/// The webhook deletes this pod itself once it is due, so the review's word must not
/// be all there is: the ReplicaSet, read live with its pods, must really control
/// more active pods than it wants (the ReplicaSet controller deletes only then:
/// `manageReplicas` in pkg/controller/replicaset/replica_set.go), counting the
/// pods isolated before this one. Otherwise the answer is a refusal that isolates
/// nothing; the controller counts the failed DELETE, requeues the ReplicaSet and
/// decides again from what it then sees.
async fn surplus_turn<'a>(
    state: &'a AppState,
    pod: &PodFacts,
) -> Result<tokio::sync::MutexGuard<'a, ()>, Answer> {
    let rs = match &pod.owner {
        Some((OwnerKind::ReplicaSet, rs)) => rs.clone(),
        _ => String::new(),
    };
    let turn = state.scale_downs.turn(&pod.namespace, &rs).await;
    match gather::replicaset_surplus(state, &pod.namespace, &rs).await {
        Ok(None) => Ok(turn),
        Ok(Some(why)) => {
            tracing::info!(%why, "ReplicaSet DELETE not backed by the live ReplicaSet; refused without isolating");
            let message = format!(
                "graceful-drain: not isolating pod {}/{}: {why}; retry once the ReplicaSet's status is current",
                pod.namespace, pod.name
            );
            Err(Answer::Deny(Outcome::Unverified, message))
        }
        Err(error) => {
            let message = format!(
                "graceful-drain: could not read the ReplicaSet of pod {}/{} ({error}); retry",
                pod.namespace, pod.name
            );
            Err(Answer::Deny(Outcome::Error, message))
        }
    }
}

/// Whether the pod's live owner backs a DELETE claiming its controller: a StatefulSet's
/// or DaemonSet's DELETE is confirmed only then; anything else the review claims counts
/// as unconfirmed (bound by the pod's budget and the unconfirmed share).
async fn owner_backs(state: &AppState, req: &decide::Removal, pod: &PodFacts) -> bool {
    match &pod.owner {
        Some((OwnerKind::StatefulSet, owner))
            if is_controller(&req.user, STATEFULSET_CONTROLLER) =>
        {
            super::stateful::backs(state, pod, owner).await
        }
        Some((OwnerKind::DaemonSet, owner)) if is_controller(&req.user, DAEMONSET_CONTROLLER) => {
            daemonset_backs(state, pod, owner).await
        }
        _ => false,
    }
}

/// The answer once the DELETE is settled: a pod isolated (or already) is held until its
/// delete time, or — a ReplicaSet's scale-down — refused, for the deferred deleter.
async fn settled_answer(
    state: &AppState,
    pod: &PodFacts,
    settled: Settled,
    scale_down: bool,
    deadline: Instant,
) -> Answer {
    let outcome = settled.outcome();
    let delete_at = match settled {
        Settled::Isolated(t) | Settled::Pending(t) => t,
        _ => return Answer::Allow(outcome),
    };
    // The ReplicaSet controller counts a deletion it asked for only when it sees a pod it
    // still controls go away, and the isolated pod is no longer its own: holding and then
    // allowing its DELETE leaves its expectations waiting five minutes, and the rollout or
    // scale-up with them (docs/design.md §9). A refused DELETE it counts at once
    // (`manageReplicas` in pkg/controller/replicaset/replica_set.go calls
    // `DeletionObserved` when DeletePod fails), and the deferred deleter removes the pod
    // after its full delay.
    if scale_down {
        let message = format!(
            "graceful-drain: pod {}/{} is isolated (out of its ReplicaSet and Services) and will be deleted at {delete_at}",
            pod.namespace, pod.name
        );
        return Answer::Deny(Outcome::Refused, message);
    }
    let deadline = state.holds.deadline_for(&pod.uid, deadline);
    hold(state, pod, delete_at, deadline).await;
    Answer::Allow(outcome)
}

/// Whether `user` is the controller `own` (or kube-controller-manager's own identity,
/// which every controller uses without `--use-service-account-credentials`).
fn is_controller(user: &str, own: &str) -> bool {
    user == own || user == CONTROLLER_MANAGER
}

/// Whether the pod's DaemonSet `name`, read live (shared with the reviews around it),
/// deletes the pod now ([`daemonset_deletes`]); a failed read or a missing DaemonSet backs
/// nothing.
async fn daemonset_backs(state: &AppState, pod: &PodFacts, name: &str) -> bool {
    match gather::daemonset(state, &pod.namespace, name).await {
        Ok(Some(ds)) => match daemonset_deletes(&ds, pod) {
            Ok(()) => true,
            Err(why) => {
                tracing::info!(%why, "DaemonSet DELETE not backed by the live DaemonSet; unconfirmed");
                false
            }
        },
        Ok(None) => false,
        Err(error) => {
            tracing::warn!(%error, "could not read DaemonSet {}/{name}; the DELETE counts as unconfirmed", pod.namespace);
            false
        }
    }
}

/// Whether the DaemonSet controller deletes `pod` now for an update: its
/// `pod-template-generation` label differs from the DaemonSet's template generation (the
/// API server bumps it on every template change, pkg/registry/apps/daemonset/strategy.go;
/// `IsPodUpdated` in pkg/controller/daemon/util/daemonset_util.go compares the two).
pub(crate) fn daemonset_deletes(ds: &DaemonSet, pod: &PodFacts) -> Result<(), String> {
    let name = ds.metadata.name.as_deref().unwrap_or_default();
    let current = ds
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DAEMONSET_TEMPLATE_GENERATION));
    let of_pod = pod.labels.get(POD_TEMPLATE_GENERATION);
    match (current, of_pod) {
        (Some(current), Some(of_pod)) if current != of_pod => Ok(()),
        _ => Err(format!(
            "pod {} is of DaemonSet {name}'s current template generation",
            pod.name
        )),
    }
}

/// A DaemonSet's template generation, kept by the API server (`apps/v1`
/// `DeprecatedTemplateGeneration`).
const DAEMONSET_TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";
/// The label with the template generation of a DaemonSet's pod
/// (`DaemonSetTemplateGenerationKey` in pkg/apis/apps/types.go).
const POD_TEMPLATE_GENERATION: &str = "pod-template-generation";

/// Holds until `delete_at` or `deadline`, whichever is first, until the load balancer let
/// go of the pod (confirmed release), or until shutdown.
async fn hold(state: &AppState, pod: &PodFacts, delete_at: Timestamp, deadline: Instant) {
    let until_delete = Timestamp::now()
        .duration_until(delete_at)
        .try_into()
        .unwrap_or(Duration::ZERO);
    let until = deadline.min(Instant::now() + until_delete);
    // Counted through a guard: a caller that hangs up drops this future mid-hold.
    let _counted = HoldCounted::new(&state.metrics.holds_in_flight);
    let cache = &state.ctx.cache;
    // Subscribed before the first look, so a release between the two still wakes it.
    let mut releases = cache.releases();
    let released = async {
        while !cache.released(&pod.namespace, &pod.name) {
            if releases.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
        tracing::info!("the load balancer let go of the pod; its DELETE goes through now");
    };
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        () = released => {}
        () = state.shutdown.cancelled() => {}
    }
}

/// One held DELETE on the `holds_in_flight` gauge, for as long as it lives.
struct HoldCounted<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> HoldCounted<'a> {
    fn new(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        HoldCounted(gauge)
    }
}

impl Drop for HoldCounted<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
