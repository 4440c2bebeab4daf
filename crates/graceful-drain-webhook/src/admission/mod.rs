//! The admission endpoints: each review runs parse → gather → decide → act → answer
//! inside one `review` span (uid, operation, namespace, pod, outcome). Business outcomes
//! are HTTP 200 AdmissionReviews; only a body that is not an AdmissionReview gets a 400.
//!
//! One module per operation, each the pipeline's call for it: `evict` for
//! `CREATE pods/eviction` (mutating), `delete` for `DELETE pods` (validating). Every live
//! read and the retry policy are `gather`'s; the decisions `crate::decide`'s (and the
//! StatefulSet rule, `stateful`); the act phase they share is `settle`, the answer and its
//! outcome `answer`; the state they share is [`crate::state`]. The connections, TLS and
//! their bounds are [`crate::transport`]'s, which knows nothing of admission.

mod answer;
mod delete;
mod evict;
mod gather;
mod settle;
mod stateful;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::time::Instant;
use tracing::Instrument;

use crate::configurations;
use crate::decide::Operation;
use crate::review::{self, Parsed};
pub use crate::state::{AppState, Holds, MAX_HELD_DELETES};
use crate::transport::{Received, Refused};
use answer::{Answer, Outcome};
pub use gather::{CONTROLLER_READ_TTL, ControllerReads};

/// How long before the API server's deadline a held DELETE is answered. Covers the
/// response's trip back and clock granularity; capped at half the budget for tiny timeouts.
const HOLD_MARGIN: Duration = Duration::from_secs(2);

/// The admission router: `POST /mutate/eviction`, `POST /validate/delete`.
pub fn router(state: Arc<AppState>, max_body: usize) -> axum::Router {
    let router = axum::Router::new()
        .route(configurations::EVICTION_PATH, post(evict))
        .route(configurations::DELETE_PATH, post(delete))
        .with_state(state);
    crate::transport::bounded(router, max_body)
}

#[derive(Debug, serde::Deserialize)]
struct TimeoutQuery {
    timeout: Option<String>,
}

async fn evict(
    State(state): State<Arc<AppState>>,
    Query(q): Query<TimeoutQuery>,
    body: Result<Received, Refused>,
) -> Response {
    handle(state, Operation::Evict, q.timeout, body).await
}

async fn delete(
    State(state): State<Arc<AppState>>,
    Query(q): Query<TimeoutQuery>,
    body: Result<Received, Refused>,
) -> Response {
    handle(state, Operation::Delete, q.timeout, body).await
}

/// The longest webhook timeout kube-apiserver accepts (`timeoutSeconds` is validated to
/// 1–30 s, `ValidateWebhook` in pkg/apis/admissionregistration/validation): a `timeout`
/// parameter beyond it did not come from an API server, and no answer waits longer.
pub(crate) const MAX_CALL_BUDGET: Duration = Duration::from_secs(30);

/// How long this call may take: the API server's `timeout` parameter (a Go duration),
/// else `default`, never more than [`MAX_CALL_BUDGET`].
pub(crate) fn call_budget(timeout: Option<&str>, default: Duration) -> Duration {
    timeout
        .and_then(graceful_drain_core::duration::parse_go_duration)
        .unwrap_or(default)
        .min(MAX_CALL_BUDGET)
}

/// When a held DELETE must be answered: the API server's budget minus a margin.
fn hold_deadline(started: Instant, budget: Duration) -> Instant {
    let margin = HOLD_MARGIN.min(budget / 2);
    started + budget.saturating_sub(margin)
}

async fn handle(
    state: Arc<AppState>,
    operation: Operation,
    timeout: Option<String>,
    body: Result<Received, Refused>,
) -> Response {
    let started = Instant::now();
    // A body refused on arrival is counted like any answer, so a flood of them shows.
    let body = match body {
        Ok(body) => body,
        Err(refused) => {
            state.metrics.review(
                operation.as_str(),
                refused.outcome(),
                started.elapsed().as_secs_f64(),
            );
            return refused.into_response();
        }
    };
    // What the parsed review costs is taken from the replica's budget before it is built
    // and held until the answer is sent: a held DELETE keeps its pod.
    let mut parsed_cost = body.more();
    let parsed = match review::parse_cost(&body.bytes) {
        Ok(cost) => match body.budget.take(&mut parsed_cost, cost).await {
            Ok(()) => review::parse(&body.bytes, operation),
            Err(exhausted) => {
                state.metrics.review(
                    operation.as_str(),
                    exhausted.outcome(),
                    started.elapsed().as_secs_f64(),
                );
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("graceful-drain: {exhausted}; retry\n"),
                )
                    .into_response();
            }
        },
        Err(error) => Err(error),
    };
    drop(body);
    let review = match parsed {
        Ok(review) => review,
        Err(error) => {
            state.metrics.review(
                operation.as_str(),
                Outcome::Malformed.as_str(),
                started.elapsed().as_secs_f64(),
            );
            // Anyone who reaches the port can send these: a few lines, then a count.
            if let crate::throttle::Admit::Yes { dropped } =
                state.throttles.malformed_logs.admit("", started)
            {
                tracing::warn!(operation = operation.as_str(), error = %graceful_drain_core::error::chain(&error), dropped, "malformed admission review (dropped: not logged since the last)");
            }
            return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response();
        }
    };
    let budget = call_budget(timeout.as_deref(), state.default_timeout);
    let span = tracing::info_span!(
        "review",
        uid = %review.request.uid,
        operation = operation.as_str(),
        namespace = review.request.namespace.as_deref().unwrap_or_default(),
        pod = %review.request.name,
        outcome = tracing::field::Empty,
    );
    let deadline = hold_deadline(started, budget);
    let request = review.request.clone();
    let answer = answer_review(&state, review, deadline)
        .instrument(span.clone())
        .await;
    drop(parsed_cost);
    let outcome = answer.outcome().as_str();
    let response = answer.response(&request);
    span.record("outcome", outcome);
    state
        .metrics
        .review(operation.as_str(), outcome, started.elapsed().as_secs_f64());
    match review::to_body(response) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encode review: {error}\n"),
        )
            .into_response(),
    }
}

/// The review's answer: the protection probe's, or its operation's.
async fn answer_review(state: &AppState, review: review::Review, deadline: Instant) -> Answer {
    let request = review.request;
    // The protection probe (crate::probe): its arrival is its answer, handed back to the
    // prober by the API server as a warning.
    if crate::probe::is_probe(&request.name, request.dry_run) {
        let seen = format!(
            "{} (replica {})",
            crate::probe::SEEN_WARNING,
            state.ctx.identity
        );
        return Answer::AllowWarning(Outcome::Probe, vec![seen]);
    }
    match review.parsed {
        Parsed::NotOurs(reason) => {
            tracing::debug!(reason, "not ours; allowing unchanged");
            Answer::Allow(Outcome::NotOurs)
        }
        Parsed::Evict(ev) => evict::answer_eviction(state, ev, deadline).await,
        Parsed::Delete(del) => delete::answer_deletion(state, del, deadline).await,
    }
}
