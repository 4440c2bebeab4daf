//! `DELETE pods`: the DELETE's fast path (neither isolated nor listed nor selected), the
//! live checks that stand behind the webhook deleting a pod itself (the ReplicaSet's
//! surplus), the hold slots, and the answers — allowed after a hold, or refused for a
//! ReplicaSet controller whose pod the deferred deleter removes after its delay.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use tokio::time::Instant;

use crate::decide::{self, Pass, PodFacts, is_replicaset_controller, of_replicaset};
use crate::review;
use crate::settle::{Settled, settle, settle_until};
use crate::state::AppState;

pub(super) async fn respond(
    state: &AppState,
    request: &AdmissionRequest<DynamicObject>,
    del: review::Deletion,
    deadline: Instant,
) -> (AdmissionResponse, &'static str) {
    let namespace = request.namespace.clone().unwrap_or_default();
    let name = del.request.name.clone();
    if let Some(pass) = decide::pass_for_request(&del.request, &state.settings) {
        return (review::allow(request), pass.as_str());
    }
    // Fast path: neither isolated (its own labels say so) nor listed as a ready endpoint,
    // nor selected by a Service whose slice may list it any moment.
    let labels = del.object.metadata.labels.as_ref();
    let draining =
        labels.is_some_and(|l| l.contains_key(graceful_drain_core::labels::DRAINING_LABEL));
    let cache = &state.ctx.cache;
    if !draining
        && !cache.has_ready_endpoint(&namespace, &name)
        && !labels.is_some_and(|l| cache.service_selects(&namespace, l))
    {
        return (review::allow(request), Pass::NotExposed.as_str());
    }
    let mut req = del.request.clone();
    let Some(pod) = del.pod() else {
        return (review::allow(request), "not_ours");
    };
    let pod = review::pod_facts(&pod);
    // The DELETE is about this incarnation of the pod: if a re-read after a conflict finds
    // a same-name replacement, it is left alone.
    req.preconditions.uid.get_or_insert_with(|| pod.uid.clone());
    let owned_by_rs = of_replicaset(&pod);
    let scale_down = owned_by_rs && is_replicaset_controller(&req.user);
    if scale_down && !draining {
        // The webhook deletes this pod itself once it is due, so the review's word must not
        // be all there is: the live ReplicaSet must really have more pods than it wants
        // (the ReplicaSet controller deletes only then, and writes `status.replicas` after
        // every sync: `syncReplicaSet` in pkg/controller/replicaset/replica_set.go). A
        // stale status is answered with a refusal that isolates nothing; the controller
        // counts the failed DELETE, requeues the ReplicaSet and asks again after its next
        // status write.
        match replicaset_has_surplus(state, &pod).await {
            Ok(None) => {}
            Ok(Some(why)) => {
                tracing::info!(%why, "ReplicaSet DELETE not backed by the live ReplicaSet; refused without isolating");
                let message = format!(
                    "graceful-drain: not isolating pod {}/{}: {why}; retry once the ReplicaSet's status is current",
                    pod.namespace, pod.name
                );
                return (review::allow(request).deny(message), "unverified");
            }
            Err(error) => {
                let message = format!(
                    "graceful-drain: could not read the ReplicaSet of pod {}/{} ({error}); retry",
                    pod.namespace, pod.name
                );
                return (review::allow(request).deny(message), "error");
            }
        }
    }
    // A DELETE this replica would hold takes a slot first; with every slot taken it goes
    // through at once, unprotected, rather than tie up one more of the API server's seats.
    // A pod already isolated (a repeated call for one DELETE) continues without one.
    let _slot = match (scale_down || draining, state.holds.slot()) {
        (true, _) => None,
        (false, Some(slot)) => Some(slot),
        (false, None) => {
            tracing::warn!(
                max = state.holds.max,
                "every hold slot is taken; letting the DELETE through unprotected"
            );
            return (review::allow(request), "hold_limit");
        }
    };
    // A DELETE is never denied for want of time: past the deadline it is allowed (the
    // pod isolated if that finished, as it usually has).
    let settled = settle_until(deadline, || settle(state, &req, pod.clone(), true));
    let settled = tokio::time::timeout_at(deadline, settled)
        .await
        .unwrap_or(Settled::Deadline);
    let outcome = settled.outcome();
    let delete_at = match settled {
        Settled::Isolated(t) | Settled::Pending(t) => t,
        _ => return (review::allow(request), outcome),
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
        return (review::allow(request).deny(message), "refused");
    }
    let deadline = state.holds.deadline_for(&pod.uid, deadline);
    hold(state, delete_at, deadline).await;
    (review::allow(request), outcome)
}

/// Reads the pod's ReplicaSet live: `None` when it has more pods than it wants
/// (`status.replicas > spec.replicas`), else why not.
async fn replicaset_has_surplus(
    state: &AppState,
    pod: &PodFacts,
) -> Result<Option<String>, kube::Error> {
    let Some(name) = pod
        .owner_refs
        .iter()
        .find(|r| r.get("kind").and_then(serde_json::Value::as_str) == Some("ReplicaSet"))
        .and_then(|r| r.get("name").and_then(serde_json::Value::as_str))
    else {
        return Ok(Some("it names no ReplicaSet".to_string()));
    };
    let api = Api::<ReplicaSet>::namespaced(state.ctx.client.clone(), &pod.namespace);
    let Some(rs) = api.get_opt(name).await? else {
        return Ok(Some(format!("ReplicaSet {name} does not exist")));
    };
    let wanted = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let has = rs.status.as_ref().map_or(0, |s| s.replicas);
    Ok((has <= wanted)
        .then(|| format!("ReplicaSet {name} has {has} replicas and wants {wanted}: none to spare")))
}

/// Holds until `delete_at` or `deadline`, whichever is first, or until shutdown.
async fn hold(state: &AppState, delete_at: Timestamp, deadline: Instant) {
    let until_delete = Timestamp::now()
        .duration_until(delete_at)
        .try_into()
        .unwrap_or(Duration::ZERO);
    let until = deadline.min(Instant::now() + until_delete);
    state.metrics.holds_in_flight.inc();
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        () = state.shutdown.cancelled() => {}
    }
    state.metrics.holds_in_flight.dec();
}
