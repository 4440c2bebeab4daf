//! `CREATE pods/eviction`: the eviction's fast path (a pod no slice lists and no Service
//! may select is not exposed), the pod read from a drained node's watch or the API, and
//! the answers — allowed, refused by a PDB, or 429 with a `Retry-After` until the pod has
//! left its load balancers. The webhook never deletes on an eviction review's word: the
//! caller's retry, which the API server authenticated, removes the pod.

use std::time::Duration;

use jiff::Timestamp;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use tokio::time::Instant;

use crate::decide::{self, Pass, PodFacts};
use crate::isolate::{self, Budget};
use crate::nodepods::{self, Lookup};
use crate::review;
use crate::settle::{Settled, fetch_pod, settle, settle_until};
use crate::state::AppState;
use graceful_drain_core::labels::webhook_reason;

/// Retry-After (seconds) of our own 429s for transient failures and deadlines: kubectl
/// retries every 5 s whatever it is told; other callers get the same pace.
pub(super) const RETRY_AFTER_SECONDS: u32 = 5;
/// Retry-After of a PDB whose latest generation is not observed yet (the API server's
/// own value for the same answer).
const UNOBSERVED_RETRY_SECONDS: u32 = 10;

pub(super) async fn respond(
    state: &AppState,
    request: &AdmissionRequest<DynamicObject>,
    ev: review::Eviction,
    deadline: Instant,
) -> (AdmissionResponse, &'static str) {
    let allow = review::allow(request);
    let settled = settle_until(deadline, || settle_eviction(state, &ev));
    let settled = tokio::time::timeout_at(deadline, settled)
        .await
        .unwrap_or(Settled::Deadline);
    let outcome = settled.outcome();
    let pod = format!("{}/{}", ev.namespace, ev.pod);
    let mut delete_at = match settled {
        Settled::Isolated(t) | Settled::Pending(t) => t,
        Settled::Pass(_) | Settled::Permanent(_) => return (allow, outcome),
        Settled::Refused(budget) => {
            let (pdb, retry) = match &budget {
                Budget::NotObserved { pdb } => (pdb.clone(), UNOBSERVED_RETRY_SECONDS),
                Budget::Exhausted { pdb } => (pdb.clone(), 0),
                Budget::Consumed | Budget::Listed => (String::new(), 0),
            };
            let message = format!(
                "Cannot evict pod {pod} as it would violate the pod's disruption budget {pdb}"
            );
            return (review::too_many_requests(request, message, retry), outcome);
        }
        Settled::Unconfirmed(why) => {
            // Like a PDB that allows no disruption now: the caller retries, and goes through
            // once fewer of the Service's pods are held (or once a drain confirms it).
            let message =
                format!("graceful-drain: not isolating pod {pod} now: {why}; retry the eviction");
            return (
                review::too_many_requests(request, message, RETRY_AFTER_SECONDS),
                outcome,
            );
        }
        Settled::Failed(why) => {
            // Letting the eviction through would delete a pod that still serves traffic;
            // every eviction caller (kubectl drain, our node agent, autoscalers) retries a
            // 429, so ask it to come back instead of failing open.
            let message = format!(
                "graceful-drain could not isolate pod {pod} yet ({why}); retry the eviction"
            );
            deferred(state, &ev, &message).await;
            return (
                review::too_many_requests(request, message, RETRY_AFTER_SECONDS),
                outcome,
            );
        }
        Settled::Deadline => {
            let message = format!(
                "graceful-drain could not isolate pod {pod} within the admission deadline; retry the eviction"
            );
            deferred(state, &ev, &message).await;
            return (
                review::too_many_requests(request, message, RETRY_AFTER_SECONDS),
                outcome,
            );
        }
    };
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
        let again = tokio::time::timeout_at(deadline, settle_eviction(state, &ev)).await;
        match again {
            Ok(Settled::Pass(_)) => return (allow, "held_until_due"),
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
    (review::deregistering(request, message, retry), outcome)
}

/// Records on the pod that its eviction was refused for now because isolation could not
/// finish (a Warning Event `graceful-drain.io/IsolationDeferred`; the metric
/// `graceful_drain_webhook_reviews{operation="evict",outcome="error"|"deadline"}` counts
/// them): the caller's retry is expected, and a pod that keeps coming back here points at
/// a slow or throttled API server. The Event is sent beside the answer, never before it:
/// the API server that could not serve the isolation in time must not hold the 429 too.
async fn deferred(state: &AppState, ev: &review::Eviction, message: &str) {
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
    if let Some(pass) = decide::pass_for_request(&ev.request, &state.settings) {
        return Settled::Pass(pass);
    }
    let cache = &state.ctx.cache;
    if cache.namespace(&ev.namespace).opted_out {
        return Settled::Pass(Pass::OptedOut);
    }
    // Fast path: a pod no slice lists as ready, in a namespace with no Service that could
    // select it before its slice lists it, is not exposed, whatever else is true.
    let exposed = cache.has_ready_endpoint(&ev.namespace, &ev.pod)
        || cache.has_selecting_service(&ev.namespace);
    if !exposed && cache.isolated(&ev.namespace, &ev.pod).is_none() {
        return Settled::Pass(Pass::NotExposed);
    }
    let (read, fresh) = match watched_pod(state, &ev.namespace, &ev.pod).await {
        Some(pod) => (Ok(Some(pod)), false),
        None => (fetch_pod(state, &ev.namespace, &ev.pod).await, true),
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

/// Pod `namespace/name` from the watch of its node (the node its endpoints name), which
/// the first eviction there starts; an eviction arriving while that watch lists waits
/// for it up to [`nodepods::SYNC_WAIT`]. `None` when the pod must be read from the API.
async fn watched_pod(state: &AppState, namespace: &str, name: &str) -> Option<PodFacts> {
    if !state.watch_drained_nodes {
        return None;
    }
    let cache = &state.ctx.cache;
    let node = cache.node_of(namespace, name)?;
    let pods = &cache.node_pods;
    match pods.lookup(&node, namespace, name) {
        Lookup::Found(pod) => return Some(*pod),
        Lookup::Unknown => {}
        Lookup::NotWatched => nodepods::watch(
            pods.clone(),
            state.ctx.client.clone(),
            &node,
            state.shutdown.clone(),
        ),
    }
    if !pods.wait_synced(&node, nodepods::SYNC_WAIT).await {
        return None;
    }
    match pods.lookup(&node, namespace, name) {
        Lookup::Found(pod) => Some(*pod),
        Lookup::Unknown | Lookup::NotWatched => None,
    }
}
