//! `CREATE pods/eviction`: the eviction's fast path (a pod no slice lists and no Service
//! may select is not exposed), the pod read from a drained node's watch or the API, and
//! the answers — allowed, refused by a PDB, or 429 with a `Retry-After` until the pod has
//! left its load balancers. The webhook never deletes on an eviction review's word: the
//! caller's retry, which the API server authenticated, removes the pod.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::answer::{Answer, Outcome};
use super::gather;
use super::settle::{Settled, settle, settle_until};
use crate::decide::{self, Pass, PodFacts};
use crate::deleter;
use crate::isolate::{self, Budget};
use crate::review;
use crate::state::AppState;
use crate::throttle::Admit;
use graceful_drain_core::labels::{DESCHEDULER_EVICT_IN_BACKGROUND_ANNOTATION, webhook_reason};

/// Retry-After (seconds) of our own 429s for transient failures and deadlines: kubectl
/// retries every 5 s whatever it is told; other callers get the same pace.
pub(super) const RETRY_AFTER_SECONDS: u32 = 5;
/// Retry-After of a PDB whose latest generation is not observed yet (the API server's
/// own value for the same answer).
const UNOBSERVED_RETRY_SECONDS: u32 = 10;

/// The answer to eviction `ev`, by `deadline`.
pub(super) async fn answer_eviction(
    state: &AppState,
    ev: review::Eviction,
    deadline: Instant,
) -> Answer {
    let settled = settle_until(deadline, || settle_eviction(state, &ev));
    let settled = tokio::time::timeout_at(deadline, settled)
        .await
        .unwrap_or(Settled::Deadline);
    let outcome = settled.outcome();
    let pod = format!("{}/{}", ev.namespace, ev.pod);
    let mut delete_at = match settled {
        Settled::Isolated(t) | Settled::Pending(t) => t,
        Settled::Pass(_) | Settled::Permanent(_) => return Answer::Allow(outcome),
        Settled::Refused(budget) => {
            let (pdb, retry) = match &budget {
                Budget::NotObserved { pdb } => (pdb.clone(), UNOBSERVED_RETRY_SECONDS),
                Budget::Exhausted { pdb } => (pdb.clone(), 0),
                Budget::Consumed | Budget::Listed => (String::new(), 0),
            };
            let message = format!(
                "Cannot evict pod {pod} as it would violate the pod's disruption budget {pdb}"
            );
            return Answer::TooManyRequests(outcome, message, retry);
        }
        Settled::Unconfirmed(why) => {
            // Like a PDB that allows no disruption now: the caller retries, and goes through
            // once fewer of the Service's pods are held (or once a drain confirms it).
            let message =
                format!("graceful-drain: not isolating pod {pod} now: {why}; retry the eviction");
            return Answer::TooManyRequests(outcome, message, RETRY_AFTER_SECONDS);
        }
        Settled::Failed(why) => {
            // Letting the eviction through would delete a pod that still serves traffic;
            // every eviction caller (kubectl drain, our node agent, autoscalers) retries a
            // 429, so ask it to come back instead of failing open.
            let message = format!(
                "graceful-drain could not isolate pod {pod} yet ({why}); retry the eviction"
            );
            deferred(state, &ev, &message).await;
            return Answer::TooManyRequests(outcome, message, RETRY_AFTER_SECONDS);
        }
        Settled::Deadline => {
            let message = format!(
                "graceful-drain could not isolate pod {pod} within the admission deadline; retry the eviction"
            );
            deferred(state, &ev, &message).await;
            return Answer::TooManyRequests(outcome, message, RETRY_AFTER_SECONDS);
        }
    };
    if let Some(answer) = in_background(state, &ev, delete_at).await {
        return answer;
    }
    // A pod due within moments is not sent away for another whole second: the call is held
    // until the pod is due and then allowed, so the caller's eviction lands when the
    // deregistration ends instead of up to a second (client-go's Retry-After) or five
    // (kubectl's own pause) later. Allowing goes no further than the API server's own
    // eviction: a forged review's answer reaches only its forger.
    // Once due it is decided afresh: a pod a slice still lists stays until it is dropped.
    let left = Timestamp::now().duration_until(delete_at);
    let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
    let fits = !left.is_zero() && left <= DUE_HOLD && Instant::now() + left + DUE_MARGIN < deadline;
    if let Some(_slot) = fits.then(|| state.holds.due_slot()).flatten() {
        tokio::select! {
            // A little past: the timer may wake a hair before the wall clock's due time.
            () = tokio::time::sleep(left + DUE_MARGIN) => {}
            () = state.shutdown.cancelled() => {}
        }
        let live = gather::pod_object(state, &ev.namespace, &ev.pod).await;
        if gone_by_deleter(state, &ev, &live, deadline).await {
            let message = format!(
                "pod {pod} is gone: graceful-drain deleted it at {delete_at}, once it had left its load balancers"
            );
            return Answer::Gone(Outcome::HeldUntilGone, message);
        }
        if let Some(why) = removed_from_cordoned_node(state, &ev, &live, deadline).await {
            let message = format!(
                "pod {pod} is gone: graceful-drain removed it at {delete_at}, once it had left its load balancers and {why}"
            );
            return Answer::Gone(Outcome::HeldUntilGone, message);
        }
        let again = tokio::time::timeout_at(deadline, settle_eviction(state, &ev)).await;
        match again {
            Ok(Settled::Pass(_)) => return Answer::Allow(Outcome::HeldUntilDue),
            Ok(Settled::Isolated(t) | Settled::Pending(t)) => delete_at = t,
            _ => {}
        }
    }
    // The webhook never deletes on a review's word (anyone reaching its port could forge
    // one): the caller, whose eviction the API server authenticated, evicts again once the
    // pod has left its load balancers, and that eviction goes through (the pod is due, and
    // no PDB selects it any more). Every eviction caller retries a 429.
    let retry = retry_after_until(delete_at, Timestamp::now());
    let message = format!(
        "graceful-drain: pod {pod} is leaving its load balancers; evict it again at {delete_at} (in {retry} s)"
    );
    Answer::Deregistering(outcome, message, retry)
}

/// What the descheduler writes in its Evictions' `requested-by` annotation.
const DESCHEDULER: &str = "sigs.k8s.io/descheduler";
/// The words the descheduler looks for in a 429 to count an eviction as under way.
const EVACUATION_TRIGGERED: &str = "Eviction triggered evacuation";

/// The descheduler evicts one pod at a time under a lock and waits for each answer, so
/// every pod the webhook keeps for its delay would hold all the pods after it (sigs.k8s.io/
/// descheduler v0.36.0, `PodEvictor.EvictPod` in pkg/descheduler/evictions/evictions.go).
/// With its `EvictionsInBackground` gate on, a pod annotated
/// [`DESCHEDULER_EVICT_IN_BACKGROUND_ANNOTATION`] whose eviction is refused with a 429 saying
/// [`EVACUATION_TRIGGERED`] counts as being evicted — toward its per-node and
/// per-namespace limits, until the pod is gone — and it goes on to the next pod at once.
/// That answer, with no `Retry-After` (client-go would retry it itself), is given only
/// when the deferred deleter removes the pod at its delete time (its node is being
/// drained, or the review is authenticated): nothing then waits on a retry that will
/// not come. Any other eviction, or a descheduler without the gate, gets the usual 429.
async fn in_background(
    state: &AppState,
    ev: &review::Eviction,
    delete_at: Timestamp,
) -> Option<Answer> {
    if ev.requested_by.as_deref() != Some(DESCHEDULER) {
        return None;
    }
    let pod = gather::pod_object(state, &ev.namespace, &ev.pod)
        .await
        .ok()??;
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(DESCHEDULER_EVICT_IN_BACKGROUND_ANNOTATION));
    (annotated && deleter::removes(&pod.metadata)).then(|| {
        let message = format!(
            "{EVACUATION_TRIGGERED}: graceful-drain takes pod {}/{} out of its load balancers and deletes it at {delete_at}",
            ev.namespace, ev.pod
        );
        Answer::TooManyRequests(Outcome::EvictingInBackground, message, 0)
    })
}

/// Waits, within the call's `deadline`, for a due pod the deferred deleter removes (its
/// node is being drained, `isolate::OnDue::Deleter`) to be gone; true once it is (or was
/// already). The caller's eviction is then answered 404 NotFound ([`review::gone`]), which
/// every eviction caller counts as done: kubectl drain returns at once instead of polling
/// for the deletion every second, Karpenter completes the pod. False for a pod its caller
/// removes (it has a restore time) or one still there at the deadline: that eviction is
/// decided again and the API server evicts the pod as usual.
async fn gone_by_deleter(
    state: &AppState,
    ev: &review::Eviction,
    live: &Result<Option<Pod>, ()>,
    deadline: Instant,
) -> bool {
    let pod = match live {
        Ok(Some(pod)) => pod,
        Ok(None) => return true,
        Err(()) => return false,
    };
    let ours = deleter::removes(&pod.metadata);
    let Some(uid) = pod.metadata.uid.as_deref().filter(|_| ours) else {
        return false;
    };
    gather::until_gone(state, &ev.namespace, &ev.pod, uid, deadline).await
}

/// A due pod of a merely cordoned node (`isolate::NodeDrain::Cordoned`), isolated for an
/// eviction nothing confirmed (so left to its caller, with a restore time): the webhook
/// removes it now ([`deleter::remove_pod`]: an eviction with the pod's own grace period and
/// its UID as precondition) when what it leaves behind is already accounted for — its
/// ReplicaSet serves every replica ready without it, or the disruption budgets selecting it
/// all list it as disrupted (the webhook charged them at isolation; the API server's own
/// eviction would be refused by that very charge) — so the caller's retry is answered 404
/// when it is gone, as on a drained node. Why, when it did. Anyone reaching the port could
/// send this retry too: all it can do is move a pod off a cordoned node once its replacement
/// serves or its budget counted it. Any other pod (a bare pod, one no budget counts, a
/// ReplicaSet still short of ready replicas, a node uncordoned) is decided again and the
/// caller's own eviction goes through the API server.
async fn removed_from_cordoned_node(
    state: &AppState,
    ev: &review::Eviction,
    live: &Result<Option<Pod>, ()>,
    deadline: Instant,
) -> Option<String> {
    let Ok(Some(pod)) = live else {
        return None;
    };
    let pending = deleter::pending_from(&pod.metadata)
        .filter(|p| p.restore_at.is_some() && !p.terminating)?;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if isolate::node_drain(&state.ctx, node).await == isolate::NodeDrain::No {
        return None;
    }
    let why = match replaced_by(state, pod).await {
        Some(replica_set) => format!("ReplicaSet {replica_set} served a ready replacement"),
        None => {
            let budgets = state
                .ctx
                .cache
                .pdbs_selecting(&pending.namespace, &pending.labels);
            if budgets.is_empty() || !deleter::all_list(&budgets, &pending.name) {
                return None;
            }
            let names: Vec<String> = budgets
                .iter()
                .filter_map(|b| b.metadata.name.clone())
                .collect();
            format!("its disruption budget {} counted it", names.join(", "))
        }
    };
    if let Err(error) = deleter::remove_pod(&state.ctx, &pending, None).await {
        tracing::info!(error = %graceful_drain_core::error::chain(&error), "remove the due pod of a cordoned node; the caller evicts it");
        return None;
    }
    tracing::info!(%why, "removed the due pod of a cordoned node");
    gather::until_gone(state, &ev.namespace, &ev.pod, &pending.uid, deadline)
        .await
        .then_some(why)
}

/// The ReplicaSet owning `pod` (`namespace/name`) when, read live, it has observed its
/// latest spec and every replica it wants is ready — the isolated pod, no longer its
/// controller's, is not among them; `None` otherwise. The read is shared with the
/// reviews around it ([`super::gather::ControllerReads`]): a forger's evictions of a due pod
/// cannot multiply it.
async fn replaced_by(state: &AppState, pod: &Pod) -> Option<String> {
    let namespace = pod.metadata.namespace.as_deref()?;
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.kind == "ReplicaSet" && r.api_version == "apps/v1")?;
    let rs = match gather::replicaset(state, namespace, &owner.name).await {
        Ok(rs) => rs?,
        Err(error) => {
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "read the isolated pod's ReplicaSet");
            return None;
        }
    };
    let status = rs.status.as_ref()?;
    let wanted = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let observed = status.observed_generation.unwrap_or(0) >= rs.metadata.generation.unwrap_or(0);
    (rs.metadata.uid.as_deref() == Some(owner.uid.as_str())
        && observed
        && status.ready_replicas.unwrap_or(0) >= wanted)
        .then(|| format!("{namespace}/{}", owner.name))
}

/// Records on the pod that its eviction was refused for now because isolation could not
/// finish (a Warning Event `graceful-drain.io/IsolationDeferred`; the metric
/// `graceful_drain_webhook_reviews{operation="evict",outcome="error"|"deadline"}` counts
/// them): the caller's retry is expected, and a pod that keeps coming back here points at
/// a slow or throttled API server. The Event is sent beside the answer, never before it:
/// the API server that could not serve the isolation in time must not hold the 429 too.
///
/// Anyone who reaches the port can ask for this answer as fast as they can send (a
/// `?timeout=0s` review of any name), so the Events are throttled
/// ([`crate::throttle::DEFERRED_EVENTS`]: one per pod a minute, 30 a minute in all).
async fn deferred(state: &AppState, ev: &review::Eviction, message: &str) {
    let key = format!("{}/{}", ev.namespace, ev.pod);
    match state.throttles.deferred_events.admit(&key, Instant::now()) {
        Admit::No => return,
        Admit::Yes { dropped: 0 } => {}
        Admit::Yes { dropped } => tracing::warn!(
            dropped,
            "IsolationDeferred Events not recorded: more than one per pod a minute or 30 a minute in all"
        ),
    }
    let pod = PodFacts {
        namespace: ev.namespace.clone(),
        name: ev.pod.clone(),
        ..PodFacts::default()
    };
    let ctx = state.ctx.clone();
    let message = message.to_string();
    tokio::spawn(async move {
        isolate::record_event(
            &ctx,
            &pod,
            isolate::Severity::Warning,
            webhook_reason::ISOLATION_DEFERRED,
            &message,
            Timestamp::now(),
        )
        .await;
    });
}

/// Longest Retry-After of a deregistering pod: callers that honour it (our node agent)
/// come back at least this often, so a drain's progress stays fresh.
const DEREGISTERING_RETRY_MAX: u32 = 60;

/// How long before its pod is due an eviction is held rather than answered 429: a little
/// over the whole second a `Retry-After` can be early by (see [`retry_after_until`]).
pub(super) const DUE_HOLD: Duration = Duration::from_millis(1500);
/// How far past its due time a held eviction is decided again.
const DUE_MARGIN: Duration = Duration::from_millis(5);

/// Whole seconds from `now` until `delete_at`, rounded down (a caller sleeps at least
/// this long and comes back at most a second before the pod is due, where
/// [`DUE_HOLD`] catches it), at least 1 and at most [`DEREGISTERING_RETRY_MAX`].
pub(super) fn retry_after_until(delete_at: Timestamp, now: Timestamp) -> u32 {
    let left = now.duration_until(delete_at).as_secs_f64().floor();
    // Clamped first, so the cast cannot overflow or go negative.
    left.clamp(1.0, f64::from(DEREGISTERING_RETRY_MAX)) as u32
}

/// The eviction's act phase: its fast path, then the pod read and [`settle`].
async fn settle_eviction(state: &AppState, ev: &review::Eviction) -> Settled {
    let glance = gather::eviction_glance(state, ev);
    if let Some(pass) = decide::fast_pass(&ev.request, &glance, &state.settings) {
        return Settled::Pass(pass);
    }
    let (read, fresh) = match gather::watched_pod(state, &ev.namespace, &ev.pod).await {
        Some(pod) => (Ok(Some(pod)), false),
        None => (gather::pod(state, &ev.namespace, &ev.pod).await, true),
    };
    match read {
        Ok(Some(pod)) => settle(state, &ev.request, pod, fresh).await,
        Ok(None) => Settled::Pass(Pass::NotRunning),
        Err(error) => {
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "read pod for eviction");
            Settled::Failed(format!("read pod: {error}"))
        }
    }
}
