//! The load-balancer model: one load balancer per `LoadBalancer` Service, whose targets
//! follow the ready endpoints of the Service's EndpointSlices with lags, like a cloud
//! load balancer in IP-target mode. Two kinds, chosen per Service by the
//! [`LB_KIND_ANNOTATION`] annotation (default [`LbModel::default_kind`]):
//!
//! * [`LbKind::Alb`] routes every request on its own. It runs [`LbModel::alb_nodes`] LB
//!   nodes, each with its own deregistration lag drawn around the configured one, and a
//!   request goes through a random node; a change of the EndpointSlices reaches the
//!   targets [`LbModel::alb_controller_latency`] later (the load-balancer controller's
//!   reconcile).
//! * [`LbKind::Nlb`] (and kube-proxy) balances connections: [`LoadBalancers::route`] picks
//!   the target of a new connection, which then stays on it until it is closed — a
//!   deregistered target keeps its open connections. The client (`traffic`) holds them.
//!
//! A ready endpoint becomes a target `registration_lag` after it is first seen ready.
//! An endpoint that stops being ready (or leaves the slice) keeps receiving new requests
//! (new connections) for `deregistration_lag` (an ALB was seen routing to draining
//! targets for 15–19 s), then is dropped. The state is pure ([`LoadBalancers::sync`],
//! [`LoadBalancers::route`]); [`run`] feeds it from a watch on Services and EndpointSlices.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::watcher;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::traffic::timeline::{EventKind, Timeline};
use tokio_util::sync::CancellationToken;

/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Service annotation choosing the kind of its load balancer (`alb` or `nlb`).
pub const LB_KIND_ANNOTATION: &str = "sim.graceful-drain.io/load-balancer";

/// Lags of the simulated load balancers.
#[derive(Clone, Copy, Debug)]
pub struct LbConfig {
    /// From "ready in the slice" to "receives requests".
    pub registration_lag: Duration,
    /// From "not ready / gone from the slice" to "receives no new requests".
    pub deregistration_lag: Duration,
}

/// How a load balancer balances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LbKind {
    /// Per request, through several LB nodes (an AWS ALB, most L7 proxies).
    #[default]
    Alb,
    /// Per connection (an AWS NLB, kube-proxy): a connection stays on its target.
    Nlb,
}

impl fmt::Display for LbKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LbKind::Alb => "alb",
            LbKind::Nlb => "nlb",
        })
    }
}

impl FromStr for LbKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "alb" => Ok(LbKind::Alb),
            "nlb" => Ok(LbKind::Nlb),
            other => Err(format!("{other:?} is not a load-balancer kind (alb, nlb)")),
        }
    }
}

/// The kinds' shape. The default is one ALB node with the configured lags exactly and no
/// controller latency: the model `simulate` has always shown.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LbModel {
    /// The kind of a Service without the [`LB_KIND_ANNOTATION`] annotation.
    pub default_kind: LbKind,
    /// LB nodes of an ALB, each with its own deregistration lag.
    pub alb_nodes: usize,
    /// Each ALB node's deregistration lag is drawn uniformly within ± this share of the
    /// configured one (0.2: 3 s becomes 2.4–3.6 s).
    pub alb_lag_jitter: f64,
    /// From an EndpointSlice change to the ALB's target change.
    pub alb_controller_latency: Duration,
    /// Seed of the lag draws and of the choice of LB node.
    pub seed: u64,
}

impl Default for LbModel {
    fn default() -> Self {
        Self {
            default_kind: LbKind::Alb,
            alb_nodes: 1,
            alb_lag_jitter: 0.0,
            alb_controller_latency: Duration::ZERO,
            seed: 0,
        }
    }
}

#[derive(Debug)]
struct Target {
    pod: String,
    /// The endpoint's address, as the slice gave it.
    address: Option<String>,
    seen_ready: Instant,
    removed: Option<Instant>,
}

#[derive(Debug)]
struct Balancer {
    kind: LbKind,
    /// Targets by pod UID.
    targets: BTreeMap<String, Target>,
    /// Deregistration lag of each LB node (one for an NLB).
    node_lags: Vec<Duration>,
    /// From a slice change to the target change.
    latency: Duration,
    /// Ready sets seen but not yet applied (controller latency), with when they apply.
    pending: VecDeque<(Instant, Vec<ReadyEndpoint>)>,
    /// The last ready set seen, and the last applied.
    seen: Vec<ReadyEndpoint>,
    applied: Vec<ReadyEndpoint>,
    rng: StdRng,
    next: usize,
}

impl Balancer {
    fn new(kind: LbKind, cfg: LbConfig, model: &LbModel, service: &str) -> Self {
        // Each Service draws its own lags, the same ones for the same seed.
        let salt = service
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        let mut rng = StdRng::seed_from_u64(model.seed ^ salt);
        let (node_lags, latency) = match kind {
            LbKind::Nlb => (vec![cfg.deregistration_lag], Duration::ZERO),
            LbKind::Alb => {
                let jitter = model.alb_lag_jitter.clamp(0.0, 1.0);
                let lags = (0..model.alb_nodes.max(1))
                    .map(|_| {
                        let share = if jitter > 0.0 {
                            rng.random_range(-jitter..=jitter)
                        } else {
                            0.0
                        };
                        cfg.deregistration_lag.mul_f64(1.0 + share)
                    })
                    .collect();
                (lags, model.alb_controller_latency)
            }
        };
        Balancer {
            kind,
            targets: BTreeMap::new(),
            node_lags,
            latency,
            pending: VecDeque::new(),
            seen: Vec::new(),
            applied: Vec::new(),
            rng,
            next: 0,
        }
    }

    /// The longest deregistration lag of its nodes: when the last one lets go.
    fn max_lag(&self) -> Duration {
        self.node_lags.iter().copied().max().unwrap_or_default()
    }

    fn routable_on(&self, t: &Target, node: usize, reg: Duration, now: Instant) -> bool {
        let lag = self.node_lags.get(node).copied().unwrap_or_default();
        t.seen_ready + reg <= now && t.removed.is_none_or(|r| now < r + lag)
    }

    fn routable_anywhere(&self, t: &Target, reg: Duration, now: Instant) -> bool {
        (0..self.node_lags.len()).any(|n| self.routable_on(t, n, reg, now))
    }

    /// Applies the ready sets whose controller latency has passed, then expires
    /// deregistrations.
    fn advance(&mut self, cfg: LbConfig, timeline: &Timeline, now: Instant) {
        while let Some((at, _)) = self.pending.front()
            && *at <= now
        {
            let Some((at, ready)) = self.pending.pop_front() else {
                break;
            };
            self.apply(cfg, timeline, &ready, at);
            self.applied = ready;
        }
        let applied = std::mem::take(&mut self.applied);
        self.apply(cfg, timeline, &applied, now);
        self.applied = applied;
    }

    /// Updates the targets from the ready endpoints as applied at `now`.
    fn apply(&mut self, cfg: LbConfig, timeline: &Timeline, ready: &[ReadyEndpoint], now: Instant) {
        let max_lag = self.max_lag();
        for ep in ready {
            let revive = self.targets.get(&ep.uid).map(|t| match t.removed {
                None => true,
                Some(removed) => now < removed + max_lag,
            });
            match revive {
                Some(true) => {
                    if let Some(t) = self.targets.get_mut(&ep.uid) {
                        t.removed = None;
                    }
                }
                Some(false) | None => {
                    let target = Target {
                        pod: ep.pod.clone(),
                        address: ep.address.clone(),
                        seen_ready: now,
                        removed: None,
                    };
                    self.targets.insert(ep.uid.clone(), target);
                    let at = now + cfg.registration_lag;
                    timeline.record_at(at, EventKind::Registered, &ep.pod);
                }
            }
        }
        let ready_uids: HashSet<&str> = ready.iter().map(|e| e.uid.as_str()).collect();
        self.targets.retain(|uid, t| {
            if t.removed.is_some() || ready_uids.contains(uid.as_str()) {
                return t.removed.is_none_or(|r| now < r + max_lag);
            }
            timeline.record_at(now, EventKind::RemovedFromSlice, &t.pod);
            if t.seen_ready + cfg.registration_lag > now {
                // Never registered: the load balancer simply never routes to it.
                return false;
            }
            t.removed = Some(now);
            // Recorded when the last LB node lets go: until then some requests still come.
            timeline.record_at(now + max_lag, EventKind::Deregistered, &t.pod);
            true
        });
    }
}

/// Every simulated load balancer, keyed by Service (`ns/name`). Cheap to clone.
#[derive(Clone, Debug)]
pub struct LoadBalancers {
    cfg: LbConfig,
    model: LbModel,
    timeline: Timeline,
    inner: Arc<Mutex<HashMap<String, Balancer>>>,
}

/// A ready endpoint: pod UID and `ns/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyEndpoint {
    /// The pod's UID, the key of its app in the app registry.
    pub uid: String,
    /// The pod as `ns/name`, for the timeline and error reports.
    pub pod: String,
    /// The endpoint's first address (the pod's IP), which the admin API reports.
    pub address: Option<String>,
}

impl LoadBalancers {
    /// No load balancers yet; every one is of the default model (one ALB node).
    pub fn new(cfg: LbConfig, timeline: Timeline) -> Self {
        Self::with_model(cfg, LbModel::default(), timeline)
    }

    /// No load balancers yet; they follow `model`.
    pub fn with_model(cfg: LbConfig, model: LbModel, timeline: Timeline) -> Self {
        Self {
            cfg,
            model,
            timeline,
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Balancer>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The balancer of `service` brought up to `now`, if it exists.
    fn with_balancer<T>(
        &self,
        service: &str,
        now: Instant,
        f: impl FnOnce(&mut Balancer) -> T,
    ) -> Option<T> {
        let mut all = self.lock();
        let lb = all.get_mut(service)?;
        lb.advance(self.cfg, &self.timeline, now);
        Some(f(lb))
    }

    /// Updates the targets of `service` (of the default kind) from its ready endpoints
    /// as seen at `now`.
    pub fn sync(&self, service: &str, ready: &[ReadyEndpoint], now: Instant) {
        self.sync_as(service, None, ready, now);
    }

    /// [`LoadBalancers::sync`] for a Service whose annotation asks for `kind` (`None`:
    /// the default kind). A Service that changes kind gets a new load balancer.
    pub fn sync_as(
        &self,
        service: &str,
        kind: Option<LbKind>,
        ready: &[ReadyEndpoint],
        now: Instant,
    ) {
        let kind = kind.unwrap_or(self.model.default_kind);
        let mut all = self.lock();
        if all.get(service).is_some_and(|lb| lb.kind != kind) {
            all.remove(service);
        }
        let lb = all
            .entry(service.to_string())
            .or_insert_with(|| Balancer::new(kind, self.cfg, &self.model, service));
        if lb.seen.as_slice() != ready {
            lb.seen = ready.to_vec();
            lb.pending.push_back((now + lb.latency, ready.to_vec()));
        }
        lb.advance(self.cfg, &self.timeline, now);
    }

    /// The kind of the load balancer of `service`, if it exists.
    pub fn kind(&self, service: &str) -> Option<LbKind> {
        self.lock().get(service).map(|lb| lb.kind)
    }

    /// The deregistration lag of each LB node of `service` (one for an NLB).
    pub fn node_lags(&self, service: &str) -> Vec<Duration> {
        self.lock()
            .get(service)
            .map(|lb| lb.node_lags.clone())
            .unwrap_or_default()
    }

    /// Pod UIDs `service` routes new requests (new connections) to at `now` through at
    /// least one of its nodes, in a stable order.
    pub fn routable(&self, service: &str, now: Instant) -> Vec<String> {
        let reg = self.cfg.registration_lag;
        self.with_balancer(service, now, |lb| {
            lb.targets
                .iter()
                .filter(|(_, t)| lb.routable_anywhere(t, reg, now))
                .map(|(uid, _)| uid.clone())
                .collect()
        })
        .unwrap_or_default()
    }

    /// The addresses `service` routes new requests to at `now` through at least one of
    /// its nodes (those of [`LoadBalancers::routable`] that have one): what its admin API
    /// reports ([`serve_admin`]).
    pub fn routable_addresses(&self, service: &str, now: Instant) -> Vec<String> {
        let reg = self.cfg.registration_lag;
        self.with_balancer(service, now, |lb| {
            lb.targets
                .values()
                .filter(|t| lb.routable_anywhere(t, reg, now))
                .filter_map(|t| t.address.clone())
                .collect()
        })
        .unwrap_or_default()
    }

    /// Every load balancer's key (`ns/name` of its Service).
    pub fn services(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Pod UIDs registered in `service` at `now` and still in its slices (routable and
    /// not being deregistered).
    pub fn registered(&self, service: &str, now: Instant) -> Vec<String> {
        let reg = self.cfg.registration_lag;
        self.with_balancer(service, now, |lb| {
            lb.targets
                .iter()
                .filter(|(_, t)| t.removed.is_none() && lb.routable_anywhere(t, reg, now))
                .map(|(uid, _)| uid.clone())
                .collect()
        })
        .unwrap_or_default()
    }

    /// Picks the target of the next request to `service` — for an NLB, of the next new
    /// connection — if any: `(pod UID, ns/name)`. An ALB sends it through a random LB
    /// node; each node round-robins over the targets it still routes to.
    pub fn route(&self, service: &str, now: Instant) -> Option<(String, String)> {
        let reg = self.cfg.registration_lag;
        self.with_balancer(service, now, |lb| {
            let node = match lb.node_lags.len() {
                0 | 1 => 0,
                n => lb.rng.random_range(0..n),
            };
            let live: Vec<(&String, &Target)> = lb
                .targets
                .iter()
                .filter(|(_, t)| lb.routable_on(t, node, reg, now))
                .collect();
            if live.is_empty() {
                return None;
            }
            let (uid, target) = live[lb.next % live.len()];
            let pick = (uid.clone(), target.pod.clone());
            lb.next = lb.next.wrapping_add(1);
            Some(pick)
        })
        .flatten()
    }
}

/// The ready endpoints of one Service's slices.
pub fn ready_endpoints<'a>(slices: impl Iterator<Item = &'a EndpointSlice>) -> Vec<ReadyEndpoint> {
    let mut out = Vec::new();
    for slice in slices {
        for ep in &slice.endpoints {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready) == Some(true);
            let Some(target) = ep.target_ref.as_ref().filter(|_| ready) else {
                continue;
            };
            let (Some(uid), Some(name)) = (&target.uid, &target.name) else {
                continue;
            };
            let ns = target.namespace.clone().unwrap_or_default();
            out.push(ReadyEndpoint {
                uid: uid.clone(),
                pod: format!("{ns}/{name}"),
                address: ep.addresses.first().cloned(),
            });
        }
    }
    out
}

/// The kind a Service's annotation asks for; an unknown value is logged and ignored.
fn kind_of(svc: &Service) -> Option<LbKind> {
    let value = svc.metadata.annotations.as_ref()?.get(LB_KIND_ANNOTATION)?;
    match value.parse() {
        Ok(kind) => Some(kind),
        Err(error) => {
            let (ns, name) = super::controllers::ns_name(svc);
            tracing::warn!(service = %format!("{ns}/{name}"), %error, "ignoring {LB_KIND_ANNOTATION}");
            None
        }
    }
}

/// Gives a LoadBalancer Service its external hostname (`<name>.<ns>.lb.sim`), as a
/// cloud controller does once the load balancer exists. Returns whether it is set.
async fn publish_ingress(client: &kube::Client, svc: &Service) -> bool {
    let has_ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    if has_ingress {
        return true;
    }
    let (ns, name) = super::controllers::ns_name(svc);
    let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"hostname": format!("{name}.{ns}.lb.sim")}]}}});
    let api: Api<Service> = Api::namespaced(client.clone(), &ns);
    match api
        .patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => true,
        Err(error) => {
            tracing::debug!(service = %format!("{ns}/{name}"), %error, "publish load balancer hostname failed");
            false
        }
    }
}

/// The admin API of the simulated load balancers, as a real balancer's (HAProxy's
/// statistics, Envoy's `/clusters`) tells which servers it routes to:
/// `GET /load-balancers` answers a JSON list with one entry per load balancer,
/// `{"service": "ns/name", "servers": [{"address": "10.100.0.5"}, …]}`, the servers being
/// the addresses it routes new requests to now. Serves on `listener` (loopback) until
/// `shutdown`.
pub async fn serve_admin(
    lbs: LoadBalancers,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let answer = move || {
        let lbs = lbs.clone();
        async move {
            let now = Instant::now();
            let list: Vec<serde_json::Value> = lbs
                .services()
                .into_iter()
                .map(|service| {
                    let servers: Vec<serde_json::Value> = lbs
                        .routable_addresses(&service, now)
                        .into_iter()
                        .map(|address| serde_json::json!({ "address": address }))
                        .collect();
                    serde_json::json!({ "service": service, "servers": servers })
                })
                .collect();
            axum::Json(list)
        }
    };
    let app = axum::Router::new().route("/load-balancers", axum::routing::get(answer));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Feeds `lbs` from watches on Services and EndpointSlices (as the cloud controller
/// would) until `shutdown`. A timer also runs `sync`, so deregistrations expire.
pub async fn run(
    client: kube::Client,
    lbs: LoadBalancers,
    shutdown: CancellationToken,
) -> Result<(), super::controllers::Error> {
    let watches = super::controllers::Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let services = watches.all::<Service>();
    let slices =
        watches.matching::<EndpointSlice>(watcher::Config::default().labels(SERVICE_NAME_LABEL));
    // Expired deregistrations are dropped on the next sync; half a second keeps the
    // target map small without mattering to routing (routing checks the time itself).
    let tick = Duration::from_millis(500);
    let mut published = std::collections::HashSet::new();
    loop {
        let now = Instant::now();
        for svc in services.state() {
            if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer") {
                continue;
            }
            let (ns, name) = super::controllers::ns_name(&*svc);
            let mine = slices.state();
            let mine = mine.iter().map(|s| &**s).filter(|s| {
                s.metadata.namespace.as_deref() == Some(ns.as_str())
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SERVICE_NAME_LABEL))
                        == Some(&name)
            });
            let key = format!("{ns}/{name}");
            lbs.sync_as(&key, kind_of(&svc), &ready_endpoints(mine), now);
            if !published.contains(&key) && publish_ingress(&client, &svc).await {
                published.insert(key);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn cfg() -> LbConfig {
        LbConfig {
            registration_lag: Duration::from_secs(2),
            deregistration_lag: Duration::from_secs(10),
        }
    }

    fn ep(uid: &str) -> ReadyEndpoint {
        ReadyEndpoint {
            uid: uid.into(),
            pod: format!("ns/{uid}"),
            address: None,
        }
    }

    #[test]
    fn targets_follow_endpoints_with_lags() {
        let lbs = LoadBalancers::new(cfg(), Timeline::new());
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        lbs.sync("ns/web", &[ep("a"), ep("b")], t0);
        assert!(lbs.routable("ns/web", s(1)).is_empty(), "still registering");
        assert_eq!(lbs.routable("ns/web", s(2)), vec!["a", "b"]);
        lbs.sync("ns/web", &[ep("b")], s(3));
        // `a` left the slice but still gets new requests for the deregistration lag.
        assert_eq!(lbs.routable("ns/web", s(12)), vec!["a", "b"]);
        assert_eq!(lbs.registered("ns/web", s(12)), vec!["b"]);
        assert_eq!(lbs.routable("ns/web", s(13)), vec!["b"]);
        lbs.sync("ns/web", &[ep("b")], s(14));
        assert_eq!(
            lbs.route("ns/web", s(14)),
            Some(("b".into(), "ns/b".into()))
        );
        assert_eq!(lbs.route("ns/other", s(14)), None);
    }

    /// The admin API reports the addresses a balancer routes to, for as long as it still
    /// routes to them (a target that left its slice stays until its lag is over).
    #[tokio::test]
    async fn the_admin_api_reports_routed_addresses() {
        let lbs = LoadBalancers::new(cfg(), Timeline::new());
        let t0 = Instant::now() - Duration::from_secs(20);
        let with_address = |uid: &str, ip: &str| ReadyEndpoint {
            address: Some(ip.into()),
            ..ep(uid)
        };
        let a = with_address("a", "10.100.0.1");
        let b = with_address("b", "10.100.0.2");
        lbs.sync("ns/web", &[a, b.clone()], t0);
        lbs.sync("ns/web", &[b], t0 + Duration::from_secs(3));
        // 5 s after `a` left: still within its 10 s deregistration lag.
        let at = |n| t0 + Duration::from_secs(n);
        assert_eq!(
            lbs.routable_addresses("ns/web", at(8)),
            vec!["10.100.0.1", "10.100.0.2"]
        );
        assert_eq!(lbs.routable_addresses("ns/web", at(14)), vec!["10.100.0.2"]);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let serving = tokio::spawn(serve_admin(lbs.clone(), listener, stop.clone()));
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = "GET /load-balancers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let list: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            list,
            serde_json::json!([{"service": "ns/web", "servers": [{"address": "10.100.0.2"}]}])
        );
        stop.cancel();
        serving.await.unwrap().unwrap();
    }

    #[test]
    fn round_robin_and_unregistered_removal() {
        let lbs = LoadBalancers::new(cfg(), Timeline::new());
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        lbs.sync("x", &[ep("a"), ep("b")], t0);
        let picks: Vec<_> = (0..4)
            .filter_map(|_| lbs.route("x", s(3)).map(|r| r.0))
            .collect();
        assert_eq!(picks, vec!["a", "b", "a", "b"]);
        lbs.sync("x", &[ep("a"), ep("b"), ep("c")], s(4));
        // `c` leaves before it was ever registered: it never receives traffic.
        lbs.sync("x", &[ep("a"), ep("b")], s(5));
        assert_eq!(lbs.routable("x", s(7)), vec!["a", "b"]);
    }

    fn alb(nodes: usize, jitter: f64, latency: Duration) -> LbModel {
        LbModel {
            alb_nodes: nodes,
            alb_lag_jitter: jitter,
            alb_controller_latency: latency,
            seed: 7,
            ..LbModel::default()
        }
    }

    #[test]
    fn alb_nodes_let_go_of_a_target_each_after_its_own_lag() {
        let model = alb(3, 0.3, Duration::ZERO);
        let lbs = LoadBalancers::with_model(cfg(), model, Timeline::new());
        let t0 = Instant::now();
        lbs.sync("x", &[ep("a"), ep("b")], t0);
        let lags = lbs.node_lags("x");
        assert_eq!(lags.len(), 3);
        assert!(
            lags.iter().all(|l| (7.0..=13.0).contains(&l.as_secs_f64())),
            "{lags:?}"
        );
        let (shortest, longest) = (lags.iter().min().unwrap(), lags.iter().max().unwrap());
        assert!(longest > shortest, "the nodes' lags differ: {lags:?}");
        let removed = t0 + Duration::from_secs(3);
        lbs.sync("x", &[ep("b")], removed);
        // Between the shortest and the longest lag some nodes still send requests to `a`.
        let between = removed + (*shortest + *longest) / 2;
        let picks: Vec<String> = (0..200)
            .filter_map(|_| lbs.route("x", between).map(|r| r.0))
            .collect();
        let to_a = picks.iter().filter(|p| *p == "a").count();
        assert!(
            to_a > 0 && to_a < 100,
            "{to_a} of 200 through the nodes that still route to a"
        );
        assert_eq!(lbs.routable("x", between), vec!["a", "b"]);
        // Once the slowest node lets go, nobody routes to `a`.
        let after = removed + *longest;
        assert_eq!(lbs.routable("x", after), vec!["b"]);
        assert!((0..50).all(|_| lbs.route("x", after).is_some_and(|r| r.0 == "b")));
    }

    #[test]
    fn alb_targets_follow_slices_after_the_controller_latency() {
        let model = alb(1, 0.0, Duration::from_secs(1));
        let timeline = Timeline::new();
        let lbs = LoadBalancers::with_model(cfg(), model, timeline.clone());
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        lbs.sync("x", &[ep("a"), ep("b")], t0);
        // Registered 1 s (latency) + 2 s (registration lag) after the slice said ready.
        assert!(lbs.routable("x", ms(2_900)).is_empty());
        assert_eq!(lbs.routable("x", ms(3_000)), vec!["a", "b"]);
        lbs.sync("x", &[ep("b")], ms(5_000));
        // The target changes at 6 s, then `a` gets requests for the 10 s lag.
        assert_eq!(lbs.registered("x", ms(5_900)), vec!["a", "b"]);
        assert_eq!(lbs.registered("x", ms(6_000)), vec!["b"]);
        assert_eq!(lbs.routable("x", ms(15_900)), vec!["a", "b"]);
        assert_eq!(lbs.routable("x", ms(16_000)), vec!["b"]);
        let deregistered = timeline
            .between(t0, ms(20_000))
            .into_iter()
            .find(|e| e.kind == EventKind::Deregistered)
            .map(|e| timeline.start() + e.at);
        assert_eq!(deregistered, Some(ms(16_000)));
    }

    #[test]
    fn nlb_new_connections_follow_the_target_set() {
        let model = LbModel {
            default_kind: LbKind::Nlb,
            ..alb(3, 0.5, Duration::from_secs(1))
        };
        let lbs = LoadBalancers::with_model(cfg(), model, Timeline::new());
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        lbs.sync("x", &[ep("a"), ep("b")], t0);
        assert_eq!(lbs.kind("x"), Some(LbKind::Nlb));
        // One node, the configured lag exactly, no controller latency.
        assert_eq!(lbs.node_lags("x"), vec![Duration::from_secs(10)]);
        assert_eq!(lbs.routable("x", s(2)), vec!["a", "b"]);
        lbs.sync("x", &[ep("b"), ep("c")], s(3));
        // New connections still reach `a` during its deregistration lag, `c` once registered.
        let picks: BTreeSet<String> = (0..4)
            .filter_map(|_| lbs.route("x", s(5)).map(|r| r.0))
            .collect();
        assert_eq!(picks, ["a", "b", "c"].map(String::from).into());
        let picks: BTreeSet<String> = (0..4)
            .filter_map(|_| lbs.route("x", s(13)).map(|r| r.0))
            .collect();
        assert_eq!(picks, ["b", "c"].map(String::from).into());
        // The annotation switches a Service's kind.
        lbs.sync_as("x", Some(LbKind::Alb), &[ep("b")], s(14));
        assert_eq!(lbs.kind("x"), Some(LbKind::Alb));
        assert_eq!("nlb".parse::<LbKind>(), Ok(LbKind::Nlb));
        assert!("elb".parse::<LbKind>().is_err());
    }
}
