//! The admission endpoints and the HTTPS server around them.
//!
//! Each review runs parse → decide → act → respond inside one `review` span (uid,
//! operation, namespace, pod, outcome). Business outcomes are HTTP 200 AdmissionReviews;
//! only a body that is not an AdmissionReview gets a 400. The server accepts TCP, does the
//! TLS handshake with [`super::tls`], and serves HTTP/1.1 or h2 on each connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use tokio::net::TcpListener;
use tracing::Instrument;

use super::decide::{self, Decision, OwnerKind, Pass, Path, PodFacts, Request, Settings};
use super::isolate::{self, Outcome};
use super::metrics::Metrics;
use super::review::{self, Parsed};
use crate::runtime::Shutdown;

/// Username of the ReplicaSet controller (kube-controller-manager with
/// `--use-service-account-credentials`, the default of every distribution we know).
pub const REPLICASET_CONTROLLER: &str = "system:serviceaccount:kube-system:replicaset-controller";
/// How long before the API server's deadline a held DELETE is answered. Covers the
/// response's trip back and clock granularity; capped at half the budget for tiny timeouts.
const HOLD_MARGIN: Duration = Duration::from_secs(2);
/// How often a review retries after the pod changed under it (re-read, decide again).
const CONFLICT_ATTEMPTS: usize = 3;
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
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Everything the handlers share.
pub struct AppState {
    pub ctx: isolate::Context,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    /// Refuse the ReplicaSet controller's DELETE of isolated pods (see docs).
    pub refuse_replicaset_deletes: bool,
    /// Budget when the API server sends no `timeout` parameter (= `--timeout-seconds`).
    pub default_timeout: Duration,
    /// Cancelled at shutdown: held DELETEs are answered at once.
    pub shutdown: Shutdown,
}

/// The admission router: `POST /mutate/eviction`, `POST /validate/delete`.
pub fn router(state: Arc<AppState>, max_body: usize) -> axum::Router {
    axum::Router::new()
        .route("/mutate/eviction", post(evict))
        .route("/validate/delete", post(delete))
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
            tracing::warn!(operation = path.as_str(), error = %crate::error::chain(&error), "malformed admission review");
            return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response();
        }
    };
    let budget = timeout
        .as_deref()
        .and_then(crate::duration::parse_go_duration)
        .unwrap_or(state.default_timeout);
    let span = tracing::info_span!(
        "review",
        uid = %review.request.uid,
        operation = path.as_str(),
        namespace = review.request.namespace.as_deref().unwrap_or_default(),
        pod = tracing::field::Empty,
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

/// What the act phase settled on.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Settled {
    Pass(Pass),
    Isolated(Timestamp),
    Pending(Timestamp),
    /// Isolation could not be done; the reason, for the caller and the logs.
    Failed(String),
}

impl Settled {
    fn outcome(&self) -> &'static str {
        match self {
            Settled::Pass(p) => p.as_str(),
            Settled::Isolated(_) => "isolated",
            Settled::Pending(_) => "pending",
            Settled::Failed(_) => "error",
        }
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
        Parsed::Evict(ev) => respond_evict(state, &request, ev).await,
        Parsed::Delete(del) => respond_delete(state, &request, del, deadline).await,
    }
}

async fn respond_evict(
    state: &AppState,
    request: &AdmissionRequest<DynamicObject>,
    ev: review::Eviction,
) -> (AdmissionResponse, &'static str) {
    tracing::Span::current().record("pod", ev.pod.as_str());
    let allow = review::allow(request);
    let settled = settle_eviction(state, &ev).await;
    let outcome = settled.outcome();
    let delete_at = match settled {
        Settled::Isolated(t) | Settled::Pending(t) => t,
        Settled::Pass(_) => return (allow, outcome),
        Settled::Failed(why) => {
            // Letting the eviction through would delete a pod that still serves traffic;
            // every eviction caller (kubectl drain, our node agent, autoscalers) retries a
            // 429, so ask it to come back instead of failing open.
            let message = format!(
                "graceful-drain could not isolate pod {}/{} yet ({why}); retry the eviction",
                ev.namespace, ev.pod
            );
            return (review::too_many_requests(request, message), outcome);
        }
    };
    match allow.with_patch(review::dry_run_patch(&ev.delete_options)) {
        Ok(mut response) => {
            response.warnings = Some(vec![format!(
                "graceful-drain: pod {}/{} left its load balancers and will be deleted at {delete_at}",
                ev.namespace, ev.pod
            )]);
            (response, outcome)
        }
        Err(error) => {
            tracing::error!(error = %crate::error::chain(&error), "serialise dry-run patch");
            (review::allow(request), "error")
        }
    }
}

async fn settle_eviction(state: &AppState, ev: &review::Eviction) -> Settled {
    if let Some(pass) = request_pass(&ev.request, &state.settings) {
        return Settled::Pass(pass);
    }
    let cache = &state.ctx.cache;
    if cache.namespace(&ev.namespace).opted_out {
        return Settled::Pass(Pass::OptedOut);
    }
    // Fast path: a pod no slice lists as ready is not exposed, whatever else is true.
    let exposed = cache.has_ready_endpoint(&ev.namespace, &ev.pod);
    if !exposed && cache.isolated(&ev.namespace, &ev.pod).is_none() {
        return Settled::Pass(Pass::NotExposed);
    }
    match fetch_pod(state, &ev.namespace, &ev.pod).await {
        Ok(Some(pod)) => settle(state, &ev.request, pod).await,
        Ok(None) => Settled::Pass(Pass::NotRunning),
        Err(error) => {
            tracing::warn!(error = %crate::error::chain(&error), "read pod for eviction");
            Settled::Failed(format!("read pod: {error}"))
        }
    }
}

fn request_pass(req: &Request, settings: &Settings) -> Option<Pass> {
    let probe = PodFacts::default();
    match decide::decide(
        req,
        &probe,
        &decide::Snapshot::default(),
        settings,
        Timestamp::now(),
    ) {
        Decision::Pass(p @ (Pass::DryRun | Pass::OwnRequest | Pass::ForceDelete)) => Some(p),
        _ => None,
    }
}

async fn fetch_pod(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<PodFacts>, kube::Error> {
    let api = Api::<Pod>::namespaced(state.ctx.client.clone(), namespace);
    Ok(api.get_opt(name).await?.map(|p| review::pod_facts(&p)))
}

/// Decide, act, and on a concurrent change re-read the pod and decide again.
async fn settle(state: &AppState, req: &Request, mut pod: PodFacts) -> Settled {
    for _ in 0..CONFLICT_ATTEMPTS {
        let snap = state.ctx.cache.snapshot(&pod);
        let now = Timestamp::now();
        let (delete_at, grace) = match decide::decide(req, &pod, &snap, &state.settings, now) {
            Decision::Pass(p) => return Settled::Pass(p),
            Decision::Pending { delete_at } => return Settled::Pending(delete_at),
            Decision::Isolate {
                delete_at,
                grace_period,
            } => (delete_at, grace_period),
        };
        match isolate::isolate(&state.ctx, &pod, &snap, delete_at, grace, now).await {
            Ok(Outcome::Isolated { removed }) => {
                state.metrics.pods_isolated.inc();
                tracing::info!(%delete_at, removed = ?removed.keys().collect::<Vec<_>>(), "pod isolated");
                return Settled::Isolated(delete_at);
            }
            Ok(Outcome::Refused(budget)) => {
                tracing::info!(?budget, "PDB refuses the disruption; allowing unchanged");
                return Settled::Pass(match budget {
                    isolate::Budget::NotObserved { .. } => Pass::PdbNotObserved,
                    _ => Pass::PdbExhausted,
                });
            }
            Err(isolate::Error::Conflict { .. }) => {
                tracing::debug!("pod changed while isolating; re-reading");
                match fetch_pod(state, &pod.namespace, &pod.name).await {
                    Ok(Some(fresh)) => pod = fresh,
                    Ok(None) => return Settled::Pass(Pass::NotRunning),
                    Err(error) => {
                        tracing::warn!(error = %crate::error::chain(&error), "re-read pod");
                        return Settled::Failed(format!("re-read pod: {error}"));
                    }
                }
            }
            Err(error) => {
                tracing::warn!(error = %crate::error::chain(&error), "isolation failed");
                return Settled::Failed(crate::error::chain(&error).to_string());
            }
        }
    }
    tracing::warn!("pod kept changing while isolating");
    Settled::Failed("the pod kept changing while it was being isolated".to_string())
}

async fn respond_delete(
    state: &AppState,
    request: &AdmissionRequest<DynamicObject>,
    del: review::Deletion,
    deadline: Instant,
) -> (AdmissionResponse, &'static str) {
    let meta = &del.object.metadata;
    let (namespace, name) = (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    tracing::Span::current().record("pod", name.as_str());
    if let Some(pass) = request_pass(&del.request, &state.settings) {
        return (review::allow(request), pass.as_str());
    }
    // Fast path: neither isolated (its own labels say so) nor listed as a ready endpoint.
    let draining = meta
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(crate::labels::DRAINING_LABEL));
    if !draining && !state.ctx.cache.has_ready_endpoint(&namespace, &name) {
        return (review::allow(request), Pass::NotExposed.as_str());
    }
    let req = del.request.clone();
    let Some(pod) = del.pod() else {
        return (review::allow(request), "not_ours");
    };
    let pod = review::pod_facts(&pod);
    let owned_by_rs = matches!(pod.owner, Some((OwnerKind::ReplicaSet, _)));
    let settled = settle(state, &req, pod.clone()).await;
    let outcome = settled.outcome();
    let delete_at = match settled {
        Settled::Isolated(t) | Settled::Pending(t) => t,
        Settled::Pass(_) | Settled::Failed(_) => return (review::allow(request), outcome),
    };
    if state.refuse_replicaset_deletes && owned_by_rs && req.user == REPLICASET_CONTROLLER {
        let message = format!(
            "graceful-drain: pod {}/{} is isolated and will be deleted at {delete_at}",
            pod.namespace, pod.name
        );
        return (review::allow(request).deny(message), "refused");
    }
    hold(state, delete_at, deadline).await;
    (review::allow(request), outcome)
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
        () = tokio::time::sleep_until(until.into()) => {}
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
                    tracing::warn!(error = %crate::error::chain(&source), "accept; retrying");
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
                    tracing::debug!(%peer, error = %crate::error::chain(&error), "TLS handshake failed");
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
                tracing::debug!(%peer, error = %crate::error::chain(&*error), "connection ended with an error");
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

    use crate::fixtures::mock::{self, expect};
    use crate::webhook::cache::Cache;
    use http::Method;
    use http_body_util::BodyExt;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    fn state(client: kube::Client) -> Arc<AppState> {
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
            },
            settings: Settings {
                default_delay: Duration::from_secs(30),
                exposure: decide::Exposure::EndpointSlice,
                own_users: Default::default(),
            },
            metrics: Arc::new(Metrics::new(&mut registry)),
            refuse_replicaset_deletes: false,
            default_timeout: Duration::from_secs(10),
            shutdown: Shutdown::new(),
        })
    }

    fn eviction_body(pod: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "ev-1",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction", "name": pod, "namespace": "web", "operation": "CREATE",
                "userInfo": {"username": "system:node:n1"},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": pod, "namespace": "web"},
                           "deleteOptions": {"gracePeriodSeconds": 15}}}
        }))
        .unwrap()
    }

    async fn call(state: Arc<AppState>, uri: &str, body: Vec<u8>) -> (u16, Value) {
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

    #[tokio::test]
    async fn eviction_of_an_exposed_pod_isolates_it_and_becomes_a_dry_run() {
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
        expect(
            &mut api,
            Method::GET,
            "/api/v1/namespaces/web/pods/web-1",
            200,
            pod,
        )
        .await;
        let patch = expect(
            &mut api,
            Method::PATCH,
            "/api/v1/namespaces/web/pods/web-1",
            200,
            json!({}),
        )
        .await;
        assert_eq!(patch.body[1]["path"], "/metadata/labels");
        assert_eq!(
            patch.body[2],
            json!({"op": "remove", "path": "/metadata/labels/app"})
        );
        let annotations = &patch.body[4]["value"];
        assert_eq!(
            annotations["graceful-drain.io/grace-period-seconds"], "15",
            "{}",
            patch.body
        );
        let delete_at: Timestamp = annotations["graceful-drain.io/delete-at"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let delay = Timestamp::now().duration_until(delete_at).as_secs_f64();
        assert!(
            (28.0..=31.0).contains(&delay),
            "deletion scheduled {delay}s ahead"
        );
        expect(
            &mut api,
            Method::POST,
            "/api/v1/namespaces/web/events",
            201,
            json!({}),
        )
        .await;
        let (status, review) = call.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["response"]["uid"], "ev-1");
        assert_eq!(review["response"]["allowed"], true);
        assert_eq!(review["response"]["patchType"], "JSONPatch");
        use base64::Engine as _;
        let patch = base64::engine::general_purpose::STANDARD
            .decode(review["response"]["patch"].as_str().unwrap())
            .unwrap();
        let patch: Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(patch[0]["value"]["dryRun"], json!(["All"]));
        assert!(
            review["response"]["warnings"][0]
                .as_str()
                .unwrap()
                .contains("web/web-1")
        );
        assert_eq!(metrics_state.metrics.pods_isolated.get(), 1);
    }

    #[tokio::test]
    async fn eviction_that_cannot_be_isolated_is_refused_with_429_not_let_through() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction_body("web-1"),
        ));
        let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
            "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
        expect(
            &mut api,
            Method::GET,
            "/api/v1/namespaces/web/pods/web-1",
            500,
            status,
        )
        .await;
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
    async fn eviction_of_a_pod_in_no_slice_needs_no_api_call() {
        let (client, _api) = mock::client();
        let (status, review) =
            call(state(client), "/mutate/eviction", eviction_body("batch-7")).await;
        assert_eq!(status, 200);
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
    }
}
