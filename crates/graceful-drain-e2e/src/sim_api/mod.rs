//! The simulated API server of the in-process tests (`kube_sim::apiserver`, with its
//! resourceVersions, UID preconditions, eviction and PDB rules, graceful pod deletion, the
//! status subresource, JSON patch `test` ops, finalizers, field selectors and watch
//! replay), serving the lifecycle CRDs, wrapped so a test sees what its component did.
//!
//! No controller and no kubelet run: a pod deleted with a grace period stays terminating
//! until [`SimApi::finish_terminating`], and a PodDisruptionBudget's status is what the
//! test writes. Two starting points: [`SimApi::new`] is an empty cluster (the lifecycle
//! reconciler's tests), [`SimApi::start`] adds node [`NODE`] and the claimed
//! LifecycleEvent [`EVENT`] the scripted kubelet drives (the node agent's tests).
//!
//! A recording client ([`SimApi::client`], [`SimApi::agent_client`]) keeps every request
//! with the status it got ([`SimApi::requests`], [`SimApi::writes`]) and wakes
//! [`SimApi::until`] after each answer, so a wait for a component's write is event-driven.
//! Two faults only a real cluster can show are played on that client: a built-in
//! lifecycle API whose CRD objects are not found ([`SimApi::hide_lifecycle_crds`]) and
//! GETs throttled by API Priority and Fairness ([`SimApi::throttle_gets`]).

mod objects;
mod resources;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use graceful_drain_core::runtime::Shutdown;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use kube_sim::apiserver::{ApiServer, Config, Faults};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::kubelet::DEADLINE;
use graceful_drain_testing::fixtures::{NodeFixture, node};

pub use objects::shop_pod;

/// The node the agent serves.
pub const NODE: &str = "n1";
/// The LifecycleEvent the scripted kubelet's calls are for.
pub const EVENT: &str = "ev-1";
/// The agent's identity (faults name it; its requests are counted per user).
pub const AGENT_USER: &str = "system:serviceaccount:graceful-drain:node-agent";
/// Namespace of the test workloads (besides the built-in ones).
pub const SHOP: &str = "shop";

const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// One request of a recording client and the status it got.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The HTTP method.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The request body as JSON (`Null` when it had none or it was not JSON).
    pub body: Value,
    /// The HTTP status the server answered.
    pub code: u16,
}

impl Recorded {
    /// The pod name of an eviction (`/api/v1/namespaces/NS/pods/NAME/eviction`).
    pub fn pod(&self) -> &str {
        self.path.split('/').nth(6).unwrap_or_default()
    }
}

/// What the recording clients share with the [`SimApi`] that made them.
#[derive(Default)]
struct Tap {
    requests: Mutex<Vec<Recorded>>,
    answered: watch::Sender<usize>,
    crds_hidden: AtomicBool,
    /// GETs whose path contains this are answered 429 (API Priority and Fairness).
    throttled: Mutex<Option<String>>,
    /// How many GETs were answered 429.
    throttled_count: AtomicUsize,
}

impl Tap {
    /// The answer a fault gives `request` in place of the server's, if one does.
    fn fault(&self, request: &Request<Body>) -> Option<Response<Body>> {
        let path = request.uri().path();
        let throttled = self.throttled.lock().unwrap();
        if request.method() == Method::GET
            && throttled.as_deref().is_some_and(|part| path.contains(part))
        {
            self.throttled_count.fetch_add(1, Ordering::SeqCst);
            self.answered.send_modify(|n| *n += 1);
            let body = status(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            );
            return Some(answer(429, body, Some("1")));
        }
        let hidden = self.crds_hidden.load(Ordering::SeqCst)
            && path.starts_with(CRD_PATH)
            && path.ends_with(".lifecycle.graceful-drain.io");
        hidden.then(|| answer(404, status(404, "NotFound", "not found"), None))
    }
}

/// A simulated API server and what its recording clients saw; stops when dropped.
pub struct SimApi {
    server: ApiServer,
    shutdown: Shutdown,
    tap: Arc<Tap>,
}

impl Drop for SimApi {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl SimApi {
    /// An empty simulated API server serving the lifecycle CRDs.
    pub async fn new() -> Self {
        let config = Config {
            // `history` waits for a bookmark to know it has seen every change.
            bookmark_interval: Duration::from_millis(20),
            ..Config::default()
        };
        Self::serving_crds(config).await
    }

    /// A simulated API server with `faults`, the lifecycle CRDs, namespace [`SHOP`], node
    /// [`NODE`] (Ready) and LifecycleEvent [`EVENT`] of the drain transition, claimed with
    /// an SLA an hour ahead (a drain lives only as long as its event).
    pub async fn start(faults: Faults) -> Self {
        let mut config = Config {
            faults,
            ..Config::default()
        };
        config.namespaces.push(SHOP.into());
        let api = Self::serving_crds(config).await;
        api.create(node(NODE).ready_is(true)).await;
        api.create_event(EVENT, graceful_drain_core::lifecycle::DRAIN_TRANSITION)
            .await;
        api
    }

    async fn serving_crds(config: Config) -> Self {
        let shutdown = Shutdown::new();
        let server = ApiServer::start(config, shutdown.clone()).await.unwrap();
        let api = Self {
            server,
            shutdown,
            tap: Arc::default(),
        };
        for crd in graceful_drain_core::lifecycle::crds::crds().unwrap() {
            api.create(crd).await;
        }
        api
    }

    /// A cluster admin's client (setup and reads; not recorded).
    pub fn admin(&self) -> kube::Client {
        self.server.client("admin")
    }

    /// A cluster admin's client whose requests are recorded (the lifecycle reconciler's).
    pub fn client(&self) -> kube::Client {
        self.recording_client("admin")
    }

    /// The node agent's client ([`AGENT_USER`]), its requests recorded.
    pub fn agent_client(&self) -> kube::Client {
        self.recording_client(AGENT_USER)
    }

    /// A client of `user` whose every request is recorded with its status, then announced
    /// to [`SimApi::until`]; a fault's answer stands in for the server's and is not recorded
    /// (a throttled GET is announced and counted, see [`SimApi::throttled_gets`]).
    pub fn recording_client(&self, user: &str) -> kube::Client {
        let inner = self.server.client(user);
        let tap = self.tap.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let (inner, tap) = (inner.clone(), tap.clone());
            async move {
                if let Some(response) = tap.fault(&request) {
                    return Ok::<_, Infallible>(response);
                }
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await.unwrap().to_bytes();
                let (method, path) = (parts.method.clone(), parts.uri.path().to_string());
                let request = Request::from_parts(parts, Body::from(bytes.to_vec()));
                let response: Response<Body> = inner.send(request).await.unwrap();
                tap.requests.lock().unwrap().push(Recorded {
                    method,
                    path,
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    code: response.status().as_u16(),
                });
                tap.answered.send_modify(|n| *n += 1);
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    /// The recording clients' lookups of the lifecycle CRD objects answer 404 while the
    /// API stays served: a cluster whose API server has lifecycle.k8s.io built in, which
    /// the simulator (serving it through CRDs only) cannot be.
    pub fn hide_lifecycle_crds(&self) {
        self.tap.crds_hidden.store(true, Ordering::SeqCst);
    }

    /// The recording clients' GETs whose path contains `part` are answered 429 with
    /// Retry-After, as API Priority and Fairness answers under load; `None` ends it.
    pub fn throttle_gets(&self, part: Option<&str>) {
        *self.tap.throttled.lock().unwrap() = part.map(str::to_string);
    }

    /// How many GETs were answered 429 so far.
    pub fn throttled_gets(&self) -> usize {
        self.tap.throttled_count.load(Ordering::SeqCst)
    }

    /// Every request the recording clients sent, in the order answered.
    pub fn requests(&self) -> Vec<Recorded> {
        self.tap.requests.lock().unwrap().clone()
    }

    /// The recorded requests that were not reads (every method but GET).
    pub fn writes(&self) -> Vec<Recorded> {
        let mut requests = self.requests();
        requests.retain(|r| r.method != Method::GET);
        requests
    }

    /// The recorded eviction requests.
    pub fn evictions(&self) -> Vec<Recorded> {
        let mut requests = self.requests();
        requests.retain(|r| r.method == Method::POST && r.path.ends_with("/eviction"));
        requests
    }

    /// Returns once `check` holds, trying again after each answer to a recording client,
    /// within [`DEADLINE`]; panics with the requests seen when it does not.
    pub async fn until<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let mut answered = self.tap.answered.subscribe();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            answered.borrow_and_update();
            if check().await {
                return;
            }
            let next = tokio::time::timeout_at(deadline, answered.changed()).await;
            assert!(
                matches!(next, Ok(Ok(()))),
                "timed out waiting for {what}; the recording clients sent {:?}",
                self.requests()
                    .iter()
                    .map(|r| format!("{} {} {}", r.method, r.path, r.code))
                    .collect::<Vec<_>>()
            );
        }
    }
}

/// A Kubernetes Status body of a failure.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": reason, "message": message, "code": code})
}

/// An HTTP answer carrying `body`, with `Retry-After` when given.
fn answer(code: u16, body: Value, retry_after: Option<&str>) -> Response<Body> {
    let mut response = Response::builder()
        .status(code)
        .header("content-type", "application/json");
    if let Some(seconds) = retry_after {
        response = response.header("retry-after", seconds);
    }
    response
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap()
}
