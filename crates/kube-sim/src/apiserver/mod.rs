//! The simulated cluster's API server: an in-process HTTP server on loopback speaking
//! the Kubernetes REST API well enough for kube-rs and the real `kubectl` (docs/design.md §7).
//!
//! Data flow: `handler` parses each request into a verb on a resource of the
//! `resources` registry; reads come from the `store`; writes are prepared
//! (defaults, dropped unknown fields), sent through `admission` webhooks — custom
//! resources checked against their CRD's `schema` between mutation and validation —,
//! their field owners recorded by `managed`, then stored with resourceVersion
//! compare-and-swap;
//! `watch` streams the store's change feed.
//! `eviction` implements `pods/eviction` with the upstream PodDisruptionBudget rules.
//! Every request is counted in [`Stats`], runs under a deadline (60 s or `?timeout=`)
//! and may meet the `faults` a test asked for. Benchmarks fill the store without HTTP
//! through `bulk` ([`ApiServer::load`]).

mod admission;
mod apply;
mod bulk;
mod convert;
mod defaults;
mod delete;
mod eviction;
mod faults;
mod handler;
mod managed;
mod matchcond;
mod meta;
mod patch;
mod protobuf;
mod request;
mod resources;
mod routing;
mod scale;
mod schema;
mod selector;
mod selfsubject;
mod status;
mod store;
mod table;
mod validation;
mod watch;
mod write;
pub(crate) use write::DAEMONSET_TEMPLATE_GENERATION;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{Request, Uri};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

use tokio_util::sync::CancellationToken;

pub use self::bulk::LoadError;
pub use self::faults::{Burst, Faults, Forbidden};
pub use routing::{Route, RouteFrom};

/// Taint kube-apiserver's TaintNodesByCondition admission (and this API server's) puts on
/// every new Node, which the node lifecycle controller lifts once the kubelet reports Ready.
/// The real tier runs kube-controller-manager without that controller (no kubelet
/// heartbeats) and the simulator has none, so node registration in the `cluster` module
/// lifts it.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// Errors starting the simulated API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("bind simulated API server on {addr}")]
    Bind {
        /// The address from [`Config::addr`].
        addr: SocketAddr,
        /// Why binding or reading back the bound address failed.
        #[source]
        source: std::io::Error,
    },
    /// The built-in namespaces could not be created.
    #[error("create namespace {name}: {message}")]
    Bootstrap {
        /// The namespace from [`Config::namespaces`] that could not be created.
        name: String,
        /// Why its create failed.
        message: String,
    },
}

/// Result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of the simulated API server.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen (loopback; port 0 picks a free port).
    pub addr: SocketAddr,
    /// Changes kept per resource for watch resumption; older resourceVersions get 410 Gone.
    pub watch_history: usize,
    /// How often watches that allow bookmarks receive one.
    pub bookmark_interval: Duration,
    /// Namespaces that exist from the start.
    pub namespaces: Vec<String>,
    /// Injected faults (throttling, latency, cut watches); none by default.
    pub faults: Faults,
    /// Where calls to service webhooks' endpoints really go (see [`Route`]).
    pub routes: Vec<Route>,
    /// The client certificate presented to webhooks, like the kubeconfig that
    /// kube-apiserver's `--admission-control-config-file` names for them.
    pub webhook_client_cert: Option<ClientCert>,
}

/// A PEM certificate chain and its private key, read at every webhook call so a
/// rotated pair is picked up without a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCert {
    /// PEM file of the client certificate, leaf first, then any intermediates.
    pub cert: PathBuf,
    /// PEM file of the certificate's private key.
    pub key: PathBuf,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            // Large enough that no watcher of a simulated run falls behind, small enough to
            // bound memory; tests lower it to provoke 410 Gone.
            watch_history: 10_000,
            // Real API servers send bookmarks about once a minute; a second keeps simulated
            // runs, which last seconds, exercising the bookmark path.
            bookmark_interval: Duration::from_secs(1),
            namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .map(String::from)
                .to_vec(),
            routes: Vec::new(),
            webhook_client_cert: None,
            faults: Faults::default(),
        }
    }
}

/// Request and admission counters, for "API requests per drained pod" figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests by (verb, resource[/subresource]), e.g. `("create", "pods/eviction")`.
    pub requests: BTreeMap<(String, String), u64>,
    /// Requests by (authenticated user name, verb, resource[/subresource]).
    pub by_user_request: BTreeMap<(String, String, String), u64>,
    /// Admission webhook calls by webhook name.
    pub admission_calls: BTreeMap<String, u64>,
    /// Failed admission webhook calls (transport, timeout, malformed response) by name.
    pub admission_failures: BTreeMap<String, u64>,
    /// Requests refused with 429 by injected throttling (not in `requests`).
    pub throttled: u64,
}

impl Stats {
    /// Requests with this verb on this resource (`pods`, `pods/eviction`, ...).
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.requests
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests of `user`, leaving out those on the resources in `except` (`leases`;
    /// `&[]` for all of them).
    pub fn of_user(&self, user: &str, except: &[&str]) -> u64 {
        self.by_user_request
            .iter()
            .filter(|((u, _, resource), _)| u == user && !except.contains(&resource.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// The requests of `user` by verb and resource, most frequent first.
    pub fn breakdown(&self, user: &str) -> Vec<(String, u64)> {
        let mut kinds: Vec<(String, u64)> = self
            .by_user_request
            .iter()
            .filter(|((u, _, _), _)| u == user)
            .map(|((_, verb, resource), n)| (format!("{verb} {resource}"), *n))
            .collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        kinds
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.requests.values().sum()
    }

    /// All admission webhook calls.
    pub fn admission_total(&self) -> u64 {
        self.admission_calls.values().sum()
    }

    /// What happened since `earlier` (a snapshot of the same server), e.g. the requests
    /// one drain cost.
    pub fn since(&self, earlier: &Stats) -> Stats {
        fn diff<K: Ord + Clone>(
            now: &BTreeMap<K, u64>,
            then: &BTreeMap<K, u64>,
        ) -> BTreeMap<K, u64> {
            now.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(then.get(k).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, v)| *v > 0)
                .collect()
        }
        Stats {
            requests: diff(&self.requests, &earlier.requests),
            by_user_request: diff(&self.by_user_request, &earlier.by_user_request),
            admission_calls: diff(&self.admission_calls, &earlier.admission_calls),
            admission_failures: diff(&self.admission_failures, &earlier.admission_failures),
            throttled: self.throttled.saturating_sub(earlier.throttled),
        }
    }
}

/// State shared by every request.
pub(crate) struct Ctx {
    pub store: store::Store,
    pub registry: resources::Registry,
    pub stats: Mutex<Stats>,
    pub routes: Mutex<routing::Routes>,
    pub url: String,
    pub config: Config,
    pub shutdown: CancellationToken,
    pub faults: faults::Injector,
}

impl Ctx {
    pub(crate) fn stats(&self) -> MutexGuard<'_, Stats> {
        match self.stats.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub(crate) fn routes(&self) -> MutexGuard<'_, routing::Routes> {
        match self.routes.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// Most retries of one request by [`ApiServer::retrying_client`] (client-go's
/// `maxRetries` default).
const MAX_RETRY_AFTER_RETRIES: u32 = 10;

/// client-go's retry rule: an answer that is 429 or 5xx and carries `Retry-After` is
/// retried after that many seconds; anything else is the answer.
#[derive(Clone, Debug, Default)]
struct RetryAfter {
    attempts: u32,
}

impl<B, E> tower::retry::Policy<Request<kube::client::Body>, http::Response<B>, E> for RetryAfter {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _req: &mut Request<kube::client::Body>,
        result: &mut Result<http::Response<B>, E>,
    ) -> Option<Self::Future> {
        let response = result.as_ref().ok()?;
        let code = response.status().as_u16();
        if !(code == 429 || code >= 500) || self.attempts >= MAX_RETRY_AFTER_RETRIES {
            return None;
        }
        let seconds: u64 = response
            .headers()
            .get(http::header::RETRY_AFTER)?
            .to_str()
            .ok()?
            .parse()
            .ok()?;
        self.attempts += 1;
        Some(tokio::time::sleep(Duration::from_secs(seconds)))
    }

    fn clone_request(
        &mut self,
        req: &Request<kube::client::Body>,
    ) -> Option<Request<kube::client::Body>> {
        let body = req.body().try_clone()?;
        let mut copy = Request::new(body);
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.version_mut() = req.version();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

/// A client's HTTP stack.
type HttpService = tower::util::BoxCloneService<
    Request<kube::client::Body>,
    http::Response<hyper::body::Incoming>,
    hyper_util::client::legacy::Error,
>;

/// HTTP to the server at `url` as `user`.
fn http_service(url: &str, user: &str) -> HttpService {
    let base: Uri = url.parse().unwrap_or_default();
    let authorization = format!("Bearer {user}");
    let http = HyperClient::builder(TokioExecutor::new()).build_http();
    let service = tower::ServiceBuilder::new()
        .map_request(move |mut req: Request<kube::client::Body>| {
            let path = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| "/".into());
            let mut parts = base.clone().into_parts();
            parts.path_and_query = path.parse().ok();
            if let Ok(uri) = Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
            if let Ok(value) = authorization.parse() {
                req.headers_mut().insert(http::header::AUTHORIZATION, value);
            }
            req
        })
        .service(http);
    tower::util::BoxCloneService::new(service)
}

/// A running simulated API server. Cloning shares it.
#[derive(Clone)]
pub struct ApiServer {
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.ctx.url)
            .finish()
    }
}

impl ApiServer {
    /// Binds the listener, creates the built-in namespaces and serves until `shutdown`.
    pub async fn start(config: Config, shutdown: CancellationToken) -> Result<ApiServer> {
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.addr,
            source,
        })?;
        let ctx = Arc::new(Ctx {
            store: store::Store::new(config.watch_history),
            registry: resources::Registry::default(),
            stats: Mutex::new(Stats::default()),
            routes: Mutex::new(routing::Routes::default()),
            url: format!("http://{addr}"),
            config: config.clone(),
            shutdown: shutdown.clone(),
            faults: faults::Injector::new(config.faults.clone(), shutdown.clone()),
        });
        for route in &config.routes {
            ctx.routes().insert(route.clone());
        }
        for name in &config.namespaces {
            write::bootstrap_namespace(&ctx, name).map_err(|e| Error::Bootstrap {
                name: name.clone(),
                message: e.to_string(),
            })?;
        }
        let router = handler::router(ctx.clone());
        let stop = shutdown.clone();
        crate::task::spawn_owned("sim-apiserver", shutdown, async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        });
        tracing::info!(url = %ctx.url, "simulated API server listening");
        Ok(ApiServer { ctx })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.ctx.url.clone()
    }

    /// A client authenticating as `user` (the bearer token is the user name). It
    /// retries nothing: callers see every refusal.
    pub fn client(&self, user: &str) -> kube::Client {
        kube::Client::new(http_service(&self.ctx.url, user), "default")
    }

    /// Like [`ApiServer::client`], but retrying answers that carry `Retry-After` (429
    /// and 5xx) after that delay, as client-go's REST client does for the controllers
    /// and kubelets this simulator stands in for (`checkWait` in
    /// staging/src/k8s.io/client-go/rest/request.go; at most 10 retries).
    pub fn retrying_client(&self, user: &str) -> kube::Client {
        let service = tower::ServiceBuilder::new()
            .layer(tower::retry::RetryLayer::new(RetryAfter::default()))
            .service(http_service(&self.ctx.url, user));
        kube::Client::new(service, "default")
    }

    /// A kubeconfig with one context for `user` (token authentication over plain HTTP).
    pub fn kubeconfig(&self, user: &str) -> Kubeconfig {
        let name = "graceful-drain-sim".to_string();
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: name.clone(),
                cluster: Some(Cluster {
                    server: Some(self.url()),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: user.to_string(),
                auth_info: Some(AuthInfo {
                    token: Some(user.to_string().into()),
                    ..AuthInfo::default()
                }),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: name.clone(),
                context: Some(Context {
                    cluster: name.clone(),
                    user: Some(user.to_string()),
                    namespace: Some("default".into()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some(name),
            kind: Some("Config".into()),
            api_version: Some("v1".into()),
            ..Kubeconfig::default()
        }
    }

    /// Writes [`ApiServer::kubeconfig`] to `path` (JSON, which kubectl reads as YAML).
    pub fn write_kubeconfig(&self, path: &Path, user: &str) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(&self.kubeconfig(user))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        std::fs::write(path, text)
    }

    /// Routes webhook calls that reach any endpoint of Service `namespace/name` to
    /// `addr` (the Service still needs an endpoint, like in a real cluster).
    pub fn route_service(&self, namespace: &str, name: &str, addr: SocketAddr) {
        self.route(Route {
            from: RouteFrom::Service {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            to: addr,
        });
    }

    /// Adds a route for webhook calls (see [`Route`]).
    pub fn route(&self, route: Route) {
        self.ctx.routes().insert(route);
    }

    /// A snapshot of the request counters.
    pub fn stats(&self) -> Stats {
        self.ctx.stats().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_since_an_earlier_snapshot_count_only_new_requests() {
        let mut earlier = Stats::default();
        earlier
            .requests
            .insert(("create".into(), "pods/eviction".into()), 2);
        let mut now = earlier.clone();
        now.requests
            .insert(("create".into(), "pods/eviction".into()), 5);
        now.requests.insert(("get".into(), "pods".into()), 7);
        let delta = now.since(&earlier);
        assert_eq!(delta.count("create", "pods/eviction"), 3);
        assert_eq!(delta.count("get", "pods"), 7);
        assert_eq!(delta.total(), 10);
    }
}
