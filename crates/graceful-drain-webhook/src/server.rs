//! The admission endpoints and the HTTPS server around them.
//!
//! Each review runs parse → decide → act → respond inside one `review` span (uid,
//! operation, namespace, pod, outcome). Business outcomes are HTTP 200 AdmissionReviews;
//! only a body that is not an AdmissionReview gets a 400. The server accepts TCP, does the
//! TLS handshake with [`super::tls`], and serves HTTP/1.1 or h2 on each connection. The
//! act phase is [`super::settle`]; what the handlers share is [`super::state`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tracing::Instrument;

use super::configurations;
use super::decide::{self, Pass, Path, PodFacts, is_replicaset_controller, of_replicaset};
use super::isolate::{self, Budget};
use super::review::{self, Parsed};
use super::settle::{Settled, settle, settle_eviction, settle_until};
pub use super::state::{AppState, Holds, MAX_HELD_DELETES};
use graceful_drain_core::labels::webhook_reason;
use graceful_drain_core::runtime::Shutdown;

/// How long before the API server's deadline a held DELETE is answered. Covers the
/// response's trip back and clock granularity; capped at half the budget for tiny timeouts.
const HOLD_MARGIN: Duration = Duration::from_secs(2);

/// A TLS handshake that takes longer than this is dropped (slowloris protection).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed accept (e.g. out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Server errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listener failed.
    #[error("accept on {addr}")]
    Accept {
        /// The listener's local address.
        addr: SocketAddr,
        /// The operating system's error (one that a retry would not cure).
        #[source]
        source: std::io::Error,
    },
}

/// The admission router: `POST /mutate/eviction`, `POST /validate/delete`.
pub fn router(state: Arc<AppState>, max_body: usize) -> axum::Router {
    axum::Router::new()
        .route(configurations::EVICTION_PATH, post(evict))
        .route(configurations::DELETE_PATH, post(delete))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

#[derive(Debug, serde::Deserialize)]
struct TimeoutQuery {
    timeout: Option<String>,
}

async fn evict(
    State(state): State<Arc<AppState>>,
    Query(q): Query<TimeoutQuery>,
    body: Bytes,
) -> Response {
    handle(state, Path::Evict, q.timeout, body).await
}

async fn delete(
    State(state): State<Arc<AppState>>,
    Query(q): Query<TimeoutQuery>,
    body: Bytes,
) -> Response {
    handle(state, Path::Delete, q.timeout, body).await
}

/// When a held DELETE must be answered: the API server's budget minus a margin.
fn hold_deadline(started: Instant, budget: Duration) -> Instant {
    let margin = HOLD_MARGIN.min(budget / 2);
    started + budget.saturating_sub(margin)
}

async fn handle(
    state: Arc<AppState>,
    path: Path,
    timeout: Option<String>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let review = match review::parse(&body, path) {
        Ok(review) => review,
        Err(error) => {
            state
                .metrics
                .review(path.as_str(), "malformed", started.elapsed().as_secs_f64());
            tracing::warn!(operation = path.as_str(), error = %graceful_drain_core::error::chain(&error), "malformed admission review");
            return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response();
        }
    };
    let budget = timeout
        .as_deref()
        .and_then(graceful_drain_core::duration::parse_go_duration)
        .unwrap_or(state.default_timeout);
    let span = tracing::info_span!(
        "review",
        uid = %review.request.uid,
        operation = path.as_str(),
        namespace = review.request.namespace.as_deref().unwrap_or_default(),
        pod = %review.request.name,
        outcome = tracing::field::Empty,
    );
    let deadline = hold_deadline(started, budget);
    let (response, outcome) = respond(&state, review, deadline)
        .instrument(span.clone())
        .await;
    span.record("outcome", outcome);
    state
        .metrics
        .review(path.as_str(), outcome, started.elapsed().as_secs_f64());
    match review::to_body(response) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encode review: {error}\n"),
        )
            .into_response(),
    }
}

async fn respond(
    state: &AppState,
    review: review::Review,
    deadline: Instant,
) -> (AdmissionResponse, &'static str) {
    let request = review.request;
    match review.parsed {
        Parsed::NotOurs(reason) => {
            tracing::debug!(reason, "not ours; allowing unchanged");
            (review::allow(&request), "not_ours")
        }
        Parsed::Evict(ev) => respond_evict(state, &request, ev, deadline).await,
        Parsed::Delete(del) => respond_delete(state, &request, del, deadline).await,
    }
}

/// Retry-After (seconds) of our own 429s for transient failures and deadlines: kubectl
/// retries every 5 s whatever it is told; other callers get the same pace.
const RETRY_AFTER_SECONDS: u32 = 5;
/// Retry-After of a PDB whose latest generation is not observed yet (the API server's
/// own value for the same answer).
const UNOBSERVED_RETRY_SECONDS: u32 = 10;

async fn respond_evict(
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
    let delete_at = match settled {
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

/// Seconds from `now` until `delete_at`, at least 1 and at most
/// [`DEREGISTERING_RETRY_MAX`].
fn retry_after_until(delete_at: Timestamp, now: Timestamp) -> u32 {
    let left = now.duration_until(delete_at).as_secs_f64().ceil();
    // Clamped first, so the cast cannot overflow or go negative.
    left.clamp(1.0, f64::from(DEREGISTERING_RETRY_MAX)) as u32
}

async fn respond_delete(
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

/// Serves `app` over TLS on `listener` until `shutdown`, then lets open connections finish
/// (their held reviews are answered at once by the shutdown signal).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(source) if is_transient(&source) => {
                    tracing::warn!(error = %graceful_drain_core::error::chain(&source), "accept; retrying");
                    // Back off briefly so running out of descriptors is not a busy loop.
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
                Err(source) => return Err(Error::Accept { addr, source }),
            },
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, error = %graceful_drain_core::error::chain(&error), "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let conn = builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            if let Err(error) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %graceful_drain_core::error::chain(&*error), "connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut
    ) || error.raw_os_error() == Some(24) // EMFILE: too many open files, retry later
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Settings;
    use crate::metrics::Metrics;
    use graceful_drain_core::labels::{
        DELETE_AT_ANNOTATION, DEREGISTERING_CAUSE, GRACE_PERIOD_ANNOTATION, RESTORE_AT_ANNOTATION,
    };

    #[test]
    fn holds_end_before_the_api_server_gives_up() {
        let start = Instant::now();
        assert_eq!(
            hold_deadline(start, Duration::from_secs(10)),
            start + Duration::from_secs(8)
        );
        assert_eq!(
            hold_deadline(start, Duration::from_secs(1)),
            start + Duration::from_millis(500)
        );
    }

    use crate::cache::Cache;
    use crate::isolate::scenarios::Scenario::*;
    use graceful_drain_testing::fixtures::mock;
    use http::Method;
    use http_body_util::BodyExt;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    pub(super) fn state(client: kube::Client) -> Arc<AppState> {
        let cache = Arc::new(Cache::new([]));
        cache.apply_slice(&serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "web-x1", "namespace": "web", "labels": {"kubernetes.io/service-name": "web"}},
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "web", "uid": "uid-1"}}]
        })).unwrap());
        cache.apply_service(&serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "web"},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"}}
        })).unwrap());
        let mut registry = prometheus_client::registry::Registry::default();
        Arc::new(AppState {
            ctx: isolate::Context {
                client,
                cache,
                identity: "w".into(),
                events: isolate::EventSink::Inline,
                keep_labels: Default::default(),
                restore_after: isolate::RESTORE_AFTER,
                gates: Default::default(),
                owners: Default::default(),
            },
            settings: Settings {
                default_delay: Duration::from_secs(30),
                max_delay: Duration::from_secs(600),
                exposure: decide::Exposure::EndpointSlice,
                own_users: Default::default(),
            },
            metrics: Arc::new(Metrics::new(&mut registry)),
            default_timeout: Duration::from_secs(10),
            shutdown: Shutdown::new(),
            holds: Holds::default(),
            watch_drained_nodes: false,
        })
    }

    fn eviction_body(pod: &str) -> Vec<u8> {
        eviction_body_in("web", pod)
    }

    fn eviction_body_in(namespace: &str, pod: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "ev-1",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction", "name": pod, "namespace": namespace, "operation": "CREATE",
                "userInfo": {"username": "system:node:n1"},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": pod, "namespace": namespace},
                           "deleteOptions": {"gracePeriodSeconds": 15}}}
        }))
        .unwrap()
    }

    pub(super) async fn call(state: Arc<AppState>, uri: &str, body: Vec<u8>) -> (u16, Value) {
        let req = http::Request::post(uri)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let resp = router(state, 1 << 20).oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// The first eviction of an exposed pod isolates it and is refused with a 429 whose
    /// Retry-After is the pod's delete time: the pod stays alive, and the caller's retry
    /// once the pod is due evicts it for real. Nothing is deleted on the review's word.
    #[tokio::test]
    async fn eviction_of_an_exposed_pod_isolates_it_and_asks_the_caller_to_come_back_when_due() {
        let (client, mut api) = mock::client();
        let st = state(client);
        let metrics_state = st.clone();
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction_body("web-1"),
        ));
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "web", "uid": "uid-1", "resourceVersion": "12",
                         "labels": {"app": "web", "pod-template-hash": "h"}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        let [_read, patch, _event] =
            mock::play(&mut api, [PodIs(pod), Relabeled("web-1"), EventPosted])
                .await
                .try_into()
                .unwrap();
        assert_eq!(patch.body[1]["path"], "/metadata/labels");
        assert_eq!(
            patch.body[2],
            json!({"op": "remove", "path": "/metadata/labels/app"})
        );
        let annotations = &patch.body[4]["value"];
        assert_eq!(annotations[GRACE_PERIOD_ANNOTATION], "15", "{}", patch.body);
        let delete_at: Timestamp = annotations[DELETE_AT_ANNOTATION]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let delay = Timestamp::now().duration_until(delete_at).as_secs_f64();
        assert!(
            (28.0..=31.0).contains(&delay),
            "deletion scheduled {delay}s ahead"
        );
        let restore_at: Timestamp = annotations[RESTORE_AT_ANNOTATION]
            .as_str()
            .expect("the pod goes back if no retried eviction removes it")
            .parse()
            .unwrap();
        assert_eq!(
            delete_at.duration_until(restore_at).as_secs(),
            60,
            "restored a minute after its delete time"
        );
        let (status, review) = call.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        let response = &review["response"];
        assert_eq!(response["uid"], "ev-1");
        assert_eq!(response["allowed"], false);
        assert!(response.get("patch").is_none(), "no dry run any more");
        let refusal = &response["status"];
        assert_eq!(refusal["code"], 429);
        assert_eq!(refusal["reason"], "TooManyRequests");
        let retry = refusal["details"]["retryAfterSeconds"].as_u64().unwrap();
        // The delete time is whole seconds, so up to a second past the 30 s delay.
        assert!((29..=31).contains(&retry), "Retry-After {retry} s");
        assert_eq!(
            refusal["details"]["causes"][0]["reason"],
            DEREGISTERING_CAUSE
        );
        let message = refusal["message"].as_str().unwrap();
        assert!(
            message.contains("web/web-1") && message.contains("evict it again"),
            "{message}"
        );
        assert_eq!(metrics_state.metrics.pods_isolated.get(), 1);
    }

    /// A deregistering pod's Retry-After is the time left until its delete time, rounded
    /// up so the caller never comes back early, and between 1 s and a minute.
    #[test]
    fn retry_after_until_rounds_up_and_stays_within_a_minute() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |millis: i64| now + jiff::SignedDuration::from_millis(millis);
        assert_eq!(retry_after_until(at(200), now), 1);
        assert_eq!(retry_after_until(at(1_000), now), 1);
        assert_eq!(retry_after_until(at(1_001), now), 2);
        assert_eq!(retry_after_until(at(29_100), now), 30);
        assert_eq!(retry_after_until(at(59_999), now), 60);
        assert_eq!(retry_after_until(at(60_000), now), 60);
        assert_eq!(retry_after_until(at(600_000), now), 60, "at most a minute");
        assert_eq!(retry_after_until(now, now), 1, "never 0: no busy retry");
        assert_eq!(retry_after_until(at(-5_000), now), 1, "already due");
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_that_cannot_be_isolated_is_refused_with_429_not_let_through() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction_body("web-1"),
        ));
        let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
            "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
        // Every read of the pod fails until the webhook gives up and says why on the pod.
        let mut reads = 0;
        let event = loop {
            let seen = mock::answer(&mut api, |seen| match seen.method {
                Method::GET => (500, status.clone()),
                _ => (201, json!({})),
            })
            .await;
            match (seen.method.clone(), seen.path.as_str()) {
                (Method::GET, "/api/v1/namespaces/web/pods/web-1") => reads += 1,
                (Method::POST, "/api/v1/namespaces/web/events") => break seen,
                _ => panic!("unexpected request {seen:?}"),
            }
        };
        assert!(reads >= 1);
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], webhook_reason::ISOLATION_DEFERRED);
        assert_eq!(event.body["involvedObject"]["name"], "web-1");
        let (http_status, review) = call.await.unwrap();
        assert_eq!(http_status, 200);
        assert_eq!(review["response"]["uid"], "ev-1");
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("web/web-1"), "{message}");
        assert!(review["response"].get("patch").is_none());
    }

    #[tokio::test]
    async fn eviction_of_a_pod_in_no_slice_and_no_service_needs_no_api_call() {
        let (client, _api) = mock::client();
        let (status, review) = call(
            state(client),
            "/mutate/eviction",
            eviction_body_in("batch", "batch-7"),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
    }

    /// The EndpointSlice controller lists a pod some time after it turns ready (seconds
    /// after a kube-apiserver restart). A ready pod its load-balanced Service selects is
    /// isolated in that time too, or the slice would list it ready while it terminates.
    #[tokio::test]
    async fn eviction_of_a_ready_pod_its_service_selects_isolates_it_before_any_slice_lists_it() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction_body("web-2"),
        ));
        let pod = |labels: Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-2", "namespace": "web", "uid": "uid-2", "resourceVersion": "7",
                         "labels": labels},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
        };
        let scenarios = [
            PodIs(pod(json!({"app": "web"}))),
            Relabeled("web-2"),
            EventPosted,
        ];
        let [_read, patch, _event] = mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert!(
            patch
                .body
                .as_array()
                .unwrap()
                .contains(&json!({"op": "remove", "path": "/metadata/labels/app"})),
            "it leaves the Service: {}",
            patch.body
        );
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);

        // A pod of that namespace the Service does not select goes at once.
        let (client, mut api) = mock::client();
        let call = tokio::spawn(super::tests::call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction_body("web-2"),
        ));
        mock::play(&mut api, [PodIs(pod(json!({"app": "batch"})))]).await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true, "{review}");
    }
}

#[cfg(test)]
mod tests_support {
    pub(super) use super::tests::{call, state};
    use serde_json::{Value, json};

    pub(super) use crate::isolate::tests::pdb_json;
    use graceful_drain_testing::fixtures::{self, PodFixture, to_json};

    /// `web/web-1`, running and ready, at resourceVersion 12.
    pub(super) fn pod_json(uid: &str) -> Value {
        to_json(
            &fixtures::pod("web-1")
                .ns("web")
                .with_uid(uid)
                .at_version("12")
                .label("app", "web")
                .container("web:1")
                .running()
                .ready(),
        )
    }

    /// An eviction review of `web/web-1` with these deleteOptions.
    pub(super) fn eviction(options: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "ev-1",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction", "name": "web-1", "namespace": "web", "operation": "CREATE",
                "userInfo": {"username": "system:node:n1"},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": "web-1", "namespace": "web"},
                           "deleteOptions": options}}
        }))
        .unwrap()
    }

    /// A DELETE review of the bare pod `web/web-1`.
    pub(super) fn deletion() -> Vec<u8> {
        deletion_of(pod_json("uid-1"))
    }

    /// A DELETE review of `pod`.
    pub(super) fn deletion_of(pod: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "del-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "web-1", "namespace": "web", "operation": "DELETE",
                "userInfo": {"username": "alice"},
                "oldObject": pod,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}}
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod issue_tests {
    //! Mock-API tests of the answers that keep exposed pods protected whatever the
    //! cluster does: live PDB reads, preconditions, permanent failures and deadlines.
    use super::tests_support::*;
    use super::*;
    use crate::decide::REPLICASET_CONTROLLER;
    use crate::isolate::scenarios::Scenario::*;
    use graceful_drain_core::labels::{
        DELETE_AT_ANNOTATION, DEREGISTERING_CAUSE, DRAINING_LABEL, ORIGINAL_LABELS_ANNOTATION,
    };
    use graceful_drain_testing::fixtures::mock;
    use serde_json::{Value, json};

    /// The API server may call the webhook twice for one DELETE, the second time with the
    /// pod as the first call's isolation left it (controller role handed to the
    /// Deployment, the ReplicaSet kept as a plain owner): both calls must see a ReplicaSet
    /// pod, or the second would be held and allowed and the ReplicaSet's expectations
    /// would wait five minutes. A pod merely owned (not controlled) by a ReplicaSet and not
    /// isolated by us, or a StatefulSet's pod, is no ReplicaSet pod.
    #[test]
    fn a_replicaset_pod_is_recognised_on_the_second_call_for_one_delete() {
        use crate::decide::OwnerKind;
        let rs_ref = |controller: bool| {
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9",
                "uid": "rs-1", "controller": controller})
        };
        let first = PodFacts {
            owner: Some((OwnerKind::ReplicaSet, "web-7d9".into())),
            owner_refs: vec![rs_ref(true)],
            ..PodFacts::default()
        };
        assert!(of_replicaset(&first));
        let mut second = PodFacts {
            owner: Some((OwnerKind::Other("Deployment".into()), "web".into())),
            owner_refs: vec![
                rs_ref(false),
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                    "uid": "d-1", "controller": true}),
            ],
            ..PodFacts::default()
        };
        assert!(
            !of_replicaset(&second),
            "not isolated by us: not ours to judge"
        );
        second.labels.insert(DRAINING_LABEL.into(), "true".into());
        assert!(of_replicaset(&second), "isolated by the first call");
        let stateful = PodFacts {
            owner: Some((OwnerKind::StatefulSet, "db".into())),
            owner_refs: vec![json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": "db", "uid": "s-1", "controller": true})],
            ..PodFacts::default()
        };
        assert!(!of_replicaset(&stateful));
    }

    /// The cache says the PDB has no disruption left, the live PDB has one: the eviction
    /// is charged on the live PDB and isolated (before, it passed unchanged on the stale
    /// view — a real eviction if the API server then allowed it).
    #[tokio::test]
    async fn eviction_behind_a_stale_exhausted_pdb_reads_it_live_and_isolates() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 0)).unwrap());
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        let scenarios = [
            PodIs(pod_json("uid-1")),
            PdbIs(pdb_json("2", 1)),
            PdbCharged(pdb_json("3", 0)),
            Relabeled("web-1"),
            EventPosted,
        ];
        let [_pod, _pdb, put, _relabel, _event] =
            mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert_eq!(put.body["metadata"]["resourceVersion"], "2");
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert!(review["response"].get("patch").is_none());
        let refusal = &review["response"]["status"];
        assert_eq!(refusal["code"], 429);
        assert_eq!(
            refusal["details"]["causes"][0]["reason"], DEREGISTERING_CAUSE,
            "isolated, not refused by the PDB: {refusal}"
        );
    }

    /// Cache and live PDB agree the budget is exhausted: we answer 429 ourselves and
    /// change nothing, instead of passing an eviction the API server might let through.
    #[tokio::test]
    async fn eviction_behind_an_exhausted_pdb_is_answered_429_by_us() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 0)).unwrap());
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        mock::play(
            &mut api,
            [PodIs(pod_json("uid-1")), PdbIs(pdb_json("2", 0))],
        )
        .await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("web/web-1") && message.contains("web/web"),
            "{message}"
        );
        assert!(review["response"].get("patch").is_none());
    }

    /// A DELETE behind an exhausted PDB isolates the pod anyway (PDBs never block a
    /// DELETE) and is held; before, it passed at once and the pod died unprotected.
    #[tokio::test]
    async fn delete_behind_an_exhausted_pdb_is_isolated_and_held() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 0)).unwrap());
        let call = tokio::spawn(call(st, "/validate/delete?timeout=2s", deletion()));
        let scenarios = [PdbIs(pdb_json("2", 0)), Relabeled("web-1"), EventPosted];
        let [_pdb, patch, event] = mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert!(
            patch
                .body
                .to_string()
                .contains("graceful-drain.io~1draining")
        );
        assert!(
            event.body["message"]
                .as_str()
                .unwrap()
                .contains("not charged")
        );
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
    }

    /// A DELETE of `web/web-1`, a pod of ReplicaSet `web-abc`, by the ReplicaSet controller.
    fn scale_down_deletion() -> Vec<u8> {
        let mut pod = pod_json("uid-1");
        pod["metadata"]["labels"]["pod-template-hash"] = json!("abc");
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "web-abc", "uid": "rs-1",
            "controller": true, "blockOwnerDeletion": true}]);
        let mut review: Value = serde_json::from_slice(&deletion_of(pod)).unwrap();
        review["request"]["userInfo"]["username"] = json!(REPLICASET_CONTROLLER);
        serde_json::to_vec(&review).unwrap()
    }

    /// ReplicaSet `web-abc` wanting `wanted` pods and reporting `has`.
    fn replicaset(wanted: i32, has: i32) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "web", "uid": "rs-1"},
            "spec": {"replicas": wanted,
                     "selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}},
            "status": {"replicas": has}})
    }

    /// A DELETE claiming to come from the ReplicaSet controller while the live ReplicaSet
    /// has no pod to spare (a forged review, or a status not written yet) is refused
    /// without isolating: the deferred deleter would otherwise delete the pod on the
    /// review's word alone.
    #[tokio::test]
    async fn a_replicaset_delete_without_a_surplus_is_refused_and_isolates_nothing() {
        let (client, mut api) = mock::client();
        let st = state(client);
        // The metrics only: the state's client must go with the call, ending the mock API.
        let metrics = st.metrics.clone();
        let call = tokio::spawn(call(
            st,
            "/validate/delete?timeout=10s",
            scale_down_deletion(),
        ));
        mock::play(&mut api, [ReplicaSetIs(replicaset(2, 2))]).await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("web/web-1") && message.contains("none to spare"),
            "{message}"
        );
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the pod was touched");
        assert_eq!(metrics.pods_isolated.get(), 0);
    }

    /// A ReplicaSet scale-down the live ReplicaSet backs (one pod more than it wants) is
    /// isolated for the deferred deleter, without a restore time, and refused so the
    /// controller counts the deletion at once.
    #[tokio::test]
    async fn a_replicaset_delete_with_a_surplus_isolates_the_pod_for_the_deferred_deleter() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/validate/delete?timeout=10s",
            scale_down_deletion(),
        ));
        let scenarios = [
            ReplicaSetIs(replicaset(2, 3)),
            ReplicaSetIs(replicaset(2, 3)),
            Relabeled("web-1"),
            EventPosted,
        ];
        let [_rs, _reread, patch, _event] =
            mock::play(&mut api, scenarios).await.try_into().unwrap();
        let patch = patch.body.to_string();
        assert!(patch.contains(DELETE_AT_ANNOTATION), "{patch}");
        assert!(
            !patch.contains("restore-at"),
            "the deferred deleter removes it: {patch}"
        );
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("will be deleted at"), "{message}");
    }

    /// An eviction carrying the UID precondition of an earlier pod with the same name is
    /// let through unchanged (the API server answers 409): the live pod is not touched.
    #[tokio::test]
    async fn eviction_with_another_pods_uid_precondition_changes_nothing() {
        let (client, mut api) = mock::client();
        let options = json!({"preconditions": {"uid": "uid-0"}});
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction(options),
        ));
        mock::play(&mut api, [PodIs(pod_json("uid-1"))]).await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
        drop(api);
    }

    /// Our relabel refused for good (RBAC 403): the eviction goes through unchanged with a
    /// Warning Event and a metric, never an endless 429.
    #[tokio::test]
    async fn permanently_refused_relabel_lets_the_eviction_through_with_a_warning() {
        let (client, mut api) = mock::client();
        let st = state(client);
        let metrics = st.clone();
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        let scenarios = [PodIs(pod_json("uid-1")), RelabelForbidden, EventPosted];
        let [_pod, _relabel, event] = mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], webhook_reason::ISOLATION_FAILED);
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
        let failures = metrics
            .metrics
            .isolation_failures
            .get_or_create(&crate::metrics::FailureLabels {
                operation: "evict",
                reason: "forbidden",
            })
            .get();
        assert_eq!(failures, 1);
    }

    /// A 422 that is not our `test` op failing (another webhook or policy refusing the
    /// relabel: the re-read pod is unchanged) is permanent too.
    #[tokio::test]
    async fn invalid_relabel_on_an_unchanged_pod_is_permanent() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        let scenarios = [
            PodIs(pod_json("uid-1")),
            RelabelInvalid,
            PodIs(pod_json("uid-1")),
            EventPosted,
        ];
        let [_pod, _relabel, _reread, event] =
            mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert_eq!(event.body["type"], "Warning");
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
    }

    /// The API server never answers: the eviction is answered 429 with Retry-After before
    /// the API server's deadline (virtual time: the API server's 3 s budget).
    #[tokio::test(start_paused = true)]
    async fn eviction_is_answered_429_at_the_deadline() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=3s",
            eviction(json!({})),
        ));
        let (_request, _never_answered) = api.next_request().await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(3), call).await;
        let (_, review) = answered
            .expect("answered within the API server's deadline")
            .unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);
        assert_eq!(
            review["response"]["status"]["details"]["retryAfterSeconds"],
            RETRY_AFTER_SECONDS
        );
    }

    /// The API server calls again within the same DELETE (the pod changed during the
    /// call): the second call continues the first hold and is answered at once, so the
    /// caller waits one webhook timeout, not two.
    #[tokio::test(start_paused = true)]
    async fn a_repeated_call_for_one_delete_continues_the_first_hold() {
        let (client, _api) = mock::client();
        let st = state(client);
        let mut pod = pod_json("uid-1");
        pod["metadata"]["labels"] = json!({DRAINING_LABEL: "true"});
        pod["metadata"]["annotations"] = json!({
            DELETE_AT_ANNOTATION: "2999-01-01T00:00:00Z",
            ORIGINAL_LABELS_ANNOTATION: "{\"app\":\"web\"}"});
        let body = deletion_of(pod);
        let started = tokio::time::Instant::now();
        let (_, first) = call(st.clone(), "/validate/delete?timeout=4s", body.clone()).await;
        assert_eq!(first["response"]["allowed"], true);
        let first_held = started.elapsed();
        assert_eq!(
            first_held,
            Duration::from_secs(2),
            "held until the deadline minus the margin"
        );
        let (_, second) = call(st, "/validate/delete?timeout=4s", body).await;
        assert_eq!(second["response"]["allowed"], true);
        assert_eq!(
            started.elapsed(),
            first_held,
            "the second call is not held again"
        );
    }

    /// With every hold slot taken, a DELETE of an exposed pod is answered at once and
    /// isolates nothing (outcome `hold_limit`); once a slot is free, the next is held.
    #[tokio::test]
    async fn a_delete_past_the_hold_slots_goes_through_at_once_and_isolates_nothing() {
        let (client, mut api) = mock::client();
        let mut st = state(client);
        Arc::get_mut(&mut st).unwrap().holds = Holds::bounded(1);
        let taken = st.holds.slot().expect("the only slot");
        assert!(st.holds.slot().is_none(), "bounded at one");
        let (_, review) = call(st.clone(), "/validate/delete?timeout=4s", deletion()).await;
        assert_eq!(review["response"]["allowed"], true);
        let counted = st
            .metrics
            .reviews
            .get_or_create(&crate::metrics::ReviewLabels {
                operation: "delete",
                outcome: "hold_limit",
            })
            .get();
        assert_eq!(counted, 1);
        drop(taken);
        assert!(st.holds.slot().is_some(), "the slot is back");
        drop(st);
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the pod was touched");
    }

    /// The pod was replaced under a DELETE (same name, new UID): the re-read after the
    /// failed patch finds the replacement, which is left alone.
    #[tokio::test]
    async fn delete_never_isolates_a_same_name_replacement() {
        let (client, mut api) = mock::client();
        let st = state(client);
        // The replacement is a ready endpoint too.
        st.ctx.cache.apply_slice(&serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "web-x2", "namespace": "web", "labels": {"kubernetes.io/service-name": "web"}},
            "endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "web", "uid": "uid-2"}}]
        })).unwrap());
        let call = tokio::spawn(call(st, "/validate/delete?timeout=4s", deletion()));
        let mut replacement = pod_json("uid-2");
        replacement["metadata"]["resourceVersion"] = json!("20");
        mock::play(&mut api, [RelabelConflicts, PodIs(replacement)]).await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the replacement was touched");
    }

    /// The relabel never completes: the DELETE is allowed before the API server's deadline.
    #[tokio::test(start_paused = true)]
    async fn delete_is_allowed_at_the_deadline() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/validate/delete?timeout=3s",
            deletion(),
        ));
        let (_request, _never_answered) = api.next_request().await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(3), call).await;
        let (_, review) = answered
            .expect("answered within the API server's deadline")
            .unwrap();
        assert_eq!(review["response"]["allowed"], true);
    }
}
