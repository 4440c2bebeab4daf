//! The act phase of a review: the pod read (from a drained node's watch or the API), the
//! decision on it, and the isolation, settled again after a conflict or a transient
//! failure until the review's deadline; permanent failures are recorded on the pod.

use jiff::Timestamp;
use tokio::time::Instant;

use super::answer::Outcome;
use super::gather;
use crate::decide::{self, Charge, Decision, Evidence, Operation, Pass, PodFacts, Removal};
use crate::isolate::{self, Budget};
use crate::share::{Ask, Seen};
use crate::state::AppState;
use graceful_drain_core::labels::webhook_reason;

/// How often a review retries after the pod changed under it (re-read, decide again).
pub(crate) const CONFLICT_ATTEMPTS: usize = 3;

/// What the act phase settled on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    Pass(Pass),
    Isolated(Timestamp),
    Pending(Timestamp),
    /// The live PDB refuses the eviction.
    Refused(Budget),
    /// Isolation could not be done for now (the API server is unavailable, the pod kept
    /// changing); the reason, for the caller and the logs.
    Failed(String),
    /// Isolation can never succeed for this request (RBAC, another admission webhook or
    /// policy refusing our relabel): let through unchanged, with a Warning Event.
    Permanent(&'static str),
    /// The API server's deadline for this call came first.
    Deadline,
    /// Isolating the pod, which no drain or rollout confirms, would take one of its
    /// Services below what unconfirmed isolations may take; why.
    Unconfirmed(String),
}

impl Settled {
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Settled::Pass(p) => Outcome::Pass(*p),
            Settled::Isolated(_) => Outcome::Isolated,
            Settled::Pending(_) => Outcome::Pending,
            Settled::Refused(Budget::NotObserved { .. }) => Outcome::PdbNotObserved,
            Settled::Refused(_) => Outcome::PdbExhausted,
            Settled::Failed(_) => Outcome::Error,
            Settled::Permanent(_) => Outcome::FailedPermanently,
            Settled::Deadline => Outcome::Deadline,
            Settled::Unconfirmed(_) => Outcome::UnconfirmedLimit,
        }
    }
}

/// [`gather::retry_until`] for settling a request: a [`Settled::Failed`] is tried again.
pub(crate) async fn settle_until<F, Fut>(deadline: Instant, mut attempt: F) -> Settled
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Settled>,
{
    let attempt = || {
        let settling = attempt();
        async move {
            match settling.await {
                Settled::Failed(why) => Err(why),
                settled => Ok(settled),
            }
        }
    };
    gather::retry_until(deadline, attempt)
        .await
        .unwrap_or_else(Settled::Failed)
}

/// Reads `pod` again; `Err` is the answer when it is gone (nothing left to protect) or
/// cannot be read.
async fn reread(state: &AppState, pod: &PodFacts) -> Result<PodFacts, Settled> {
    match gather::pod(state, &pod.namespace, &pod.name).await {
        Ok(Some(read)) => Ok(read),
        Ok(None) => Err(Settled::Pass(Pass::NotRunning)),
        Err(error) => {
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "re-read pod");
            Err(Settled::Failed(format!("re-read pod: {error}")))
        }
    }
}

/// Decide, act, and on a concurrent change re-read the pod and decide again. A pod that
/// is not `fresh` (from a node's watch, which may lag) is read again before the request
/// goes through unprotected.
pub(crate) async fn settle(
    state: &AppState,
    req: &Removal,
    mut pod: PodFacts,
    mut fresh: bool,
) -> Settled {
    let attempts = CONFLICT_ATTEMPTS + usize::from(!fresh);
    for _ in 0..attempts {
        let snap = state.ctx.cache.snapshot(&pod);
        let now = Timestamp::now();
        let plan = match decide::decide(req, &pod, &snap, &state.settings, now) {
            Decision::Pass(p) if !fresh => {
                tracing::debug!(pass = ?p, "confirming a watched pod's pass with a read");
                match reread(state, &pod).await {
                    Ok(read) => {
                        (pod, fresh) = (read, true);
                        continue;
                    }
                    Err(settled) => return settled,
                }
            }
            Decision::Pass(p) => return Settled::Pass(p),
            Decision::Pending { delete_at } => return Settled::Pending(delete_at),
            Decision::Isolate {
                delete_at,
                grace_period,
                charge,
                capped,
            } => {
                let asked = (delete_at, grace_period, charge);
                match plan(state, req, &pod, &snap, now, asked).await {
                    Ok(plan) if capped => {
                        delay_capped(state, &pod).await;
                        plan
                    }
                    Ok(plan) => plan,
                    Err(settled) => return settled,
                }
            }
        };
        let result = isolate::isolate(&state.ctx, &pod, &snap, plan, now).await;
        match landed(state, req, &pod, fresh, &snap, plan, result).await {
            Landed::Settled(settled) => return settled,
            Landed::Again(read) => (pod, fresh) = (*read, true),
        }
    }
    tracing::warn!("pod kept changing while isolating");
    Settled::Failed("the pod kept changing while it was being isolated".to_string())
}

/// The isolation of `pod` that [`decide::decide`] asked for (`asked`: its delete time,
/// the caller's grace period, the PDB charge), confirmed ([`decide::confirm`]) and counted
/// against the unconfirmed share when nothing confirms it; `Err` with the answer when it
/// must not go ahead.
async fn plan(
    state: &AppState,
    req: &Removal,
    pod: &PodFacts,
    snap: &decide::Snapshot,
    now: Timestamp,
    (delete_at, grace_period, charge): (Timestamp, Option<i64>, Charge),
) -> Result<isolate::Plan, Settled> {
    let mut evidence = Evidence {
        reviews_authenticated: state.reviews_authenticated,
        node_draining: false,
    };
    if decide::needs_node(req, evidence.reviews_authenticated) {
        let drain = isolate::node_drain(&state.ctx, pod.node_name.as_deref()).await;
        evidence.node_draining = matches!(drain, isolate::NodeDrain::Draining(_));
    }
    let confirmation = decide::confirm(req, pod, snap, evidence, grace_period, charge)
        .map_err(Settled::Unconfirmed)?;
    if !confirmation.confirmed {
        let until = isolate::restore_at(delete_at, state.ctx.restore_after);
        if let Some(why) = unconfirmed_refusal(state, pod, snap, now, until).await {
            state.unconfirmed.release(&pod.namespace, &pod.name).await;
            tracing::info!(%why, "isolation not confirmed by a drain or rollout; refused");
            return Err(Settled::Unconfirmed(why));
        }
    }
    Ok(isolate::Plan {
        delete_at,
        grace_period: confirmation.grace_period,
        charge: confirmation.charge,
        on_due: if confirmation.deleter_removes {
            isolate::OnDue::Deleter
        } else {
            isolate::OnDue::Caller
        },
        confirmed: confirmation.confirmed,
    })
}

/// What an isolation attempt came to: the answer, or the pod read again to decide anew.
enum Landed {
    Settled(Settled),
    Again(Box<PodFacts>),
}

/// Accounts for an isolation attempt's `result`: the share's entry recorded or released,
/// the answer, or (after a conflict, or a refusal seen on a watched pod that may lag) the
/// pod read again.
async fn landed(
    state: &AppState,
    req: &Removal,
    pod: &PodFacts,
    fresh: bool,
    snap: &decide::Snapshot,
    plan: isolate::Plan,
    result: Result<isolate::Outcome, isolate::Error>,
) -> Landed {
    if !plan.confirmed && !matches!(result, Ok(isolate::Outcome::Isolated { .. })) {
        state.unconfirmed.release(&pod.namespace, &pod.name).await;
    }
    let error = match result {
        Ok(isolate::Outcome::Isolated {
            removed,
            uncharged,
            delete_at,
        }) => {
            state.metrics.pods_isolated.inc();
            if !plan.confirmed {
                let until = isolate::restore_at(delete_at, state.ctx.restore_after);
                state
                    .unconfirmed
                    .record(&pod.namespace, balancing(snap), &pod.name, until)
                    .await;
            }
            let removed: Vec<&String> = removed.keys().collect();
            tracing::info!(%delete_at, ?removed, ?uncharged, "pod isolated");
            return Landed::Settled(Settled::Isolated(delete_at));
        }
        // The node's watch can still show the pod as it was before our own isolation
        // of it (which took it out of its PDB): refuse on a read, never on that view.
        Ok(isolate::Outcome::Refused(budget)) if !fresh => {
            tracing::debug!(
                ?budget,
                "confirming a watched pod's PDB refusal with a read"
            );
            return match reread(state, pod).await {
                Ok(read) => Landed::Again(Box::new(read)),
                Err(settled) => Landed::Settled(settled),
            };
        }
        Ok(isolate::Outcome::Refused(budget)) => {
            tracing::info!(?budget, "PDB refuses the eviction");
            return Landed::Settled(Settled::Refused(budget));
        }
        Err(error) => error,
    };
    match error {
        isolate::Error::Conflict { code, .. } => {
            tracing::debug!(code, "pod changed while isolating; re-reading");
            match reread(state, pod).await {
                // A 422 on an unchanged pod is no failed `test`: our relabel is invalid.
                Ok(read) if code == 422 && read.resource_version == pod.resource_version => {
                    Landed::Settled(permanent(state, req, pod, &error).await)
                }
                Ok(read) => Landed::Again(Box::new(read)),
                Err(settled) => Landed::Settled(settled),
            }
        }
        error if error.is_permanent() => Landed::Settled(permanent(state, req, pod, &error).await),
        error => {
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "isolation failed");
            Landed::Settled(Settled::Failed(
                graceful_drain_core::error::chain(&error).to_string(),
            ))
        }
    }
}

/// The Services of the snapshot that balance traffic (not headless): those an isolation
/// takes the pod out of.
fn balancing(snap: &decide::Snapshot) -> impl Iterator<Item = &str> + Clone {
    snap.services
        .iter()
        .filter(|s| s.service_type != decide::ServiceType::Headless)
        .map(|s| s.name.as_str())
}

/// Why an isolation nothing authenticated confirmed would take one of the pod's Services
/// too far (see [`crate::state::UNCONFIRMED_SHARE_PERCENT`]), if it would; if not, it
/// counts against each of them until `until` (its restore time).
async fn unconfirmed_refusal(
    state: &AppState,
    pod: &PodFacts,
    snap: &decide::Snapshot,
    now: Timestamp,
    until: Timestamp,
) -> Option<String> {
    // An unconfirmed isolation is charged to the budget that selects the pod, which
    // bounds it.
    let budgeted = !snap.pdbs.is_empty();
    let cache = &state.ctx.cache;
    for service in balancing(snap) {
        let ask = Ask {
            namespace: &pod.namespace,
            service,
            pod: &pod.name,
            ready_others: cache.ready_pods_of(&pod.namespace, service, &pod.name),
            budgeted,
            until,
        };
        let seen = |name: &str| Seen {
            isolated: cache.isolated(&pod.namespace, name).is_some(),
            listed_ready: cache.has_ready_endpoint(&pod.namespace, name),
        };
        if let Some(why) = state.unconfirmed.reserve(ask, now, seen).await {
            return Some(why);
        }
    }
    None
}

/// Warns on the pod that its annotated delay exceeds `--max-deregistration-delay`.
async fn delay_capped(state: &AppState, pod: &PodFacts) {
    let message = format!(
        "The deregistration delay annotated on the pod or its namespace exceeds the maximum of {}; using the maximum",
        humantime::format_duration(state.settings.max_delay)
    );
    isolate::record_event(
        &state.ctx,
        pod,
        isolate::Severity::Warning,
        webhook_reason::DELAY_CAPPED,
        &message,
        Timestamp::now(),
    )
    .await;
}

/// A failure retrying cannot cure: counted, logged, and shown on the pod as a Warning
/// Event; the request goes through unchanged.
async fn permanent(
    state: &AppState,
    req: &Removal,
    pod: &PodFacts,
    error: &isolate::Error,
) -> Settled {
    let reason = match error {
        isolate::Error::Conflict { .. } => "invalid",
        other => other.reason(),
    };
    state
        .metrics
        .isolation_failure(req.operation.as_str(), reason);
    tracing::warn!(%error, reason, "isolation refused permanently; letting the request through");
    let message = format!(
        "Could not isolate the pod before its {}; it went through unprotected: {error}",
        match req.operation {
            Operation::Evict => "eviction",
            Operation::Delete => "deletion",
        }
    );
    isolate::record_event(
        &state.ctx,
        pod,
        isolate::Severity::Warning,
        webhook_reason::ISOLATION_FAILED,
        &message,
        Timestamp::now(),
    )
    .await;
    Settled::Permanent(reason)
}
