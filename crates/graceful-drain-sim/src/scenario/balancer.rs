//! A real load balancer in front of a row's workload (`simulate --real --load-balancer
//! haproxy`): HAProxy resolving a headless Service of the workload through CoreDNS, which
//! reads the cluster's EndpointSlices, with traffic of its own and HAProxy's count of the
//! 5xx it answered. The pods are real listeners on the loopback twins of their IPs
//! (kube-sim's pod network), so HAProxy connects, health-checks and retries as it does in
//! production; what it learns of a pod leaving, it learns from DNS.
//!
//! One [`Balancer`] (CoreDNS and the relay in front of it) serves a whole run; each
//! measured phase gets a [`Front`]: its own HAProxy and load generator, started once
//! HAProxy routes to every ready pod and stopped once it routes to no pod that is gone.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use kube_sim::cluster::{DataPlane, WebSpec};
use kube_sim::podnet::loopback_twin;
use real_lb::{
    BackendStats, CoreDns, HaProxy, HaProxyConfig, Load, LoadReport, PodNetwork, StatsRelay,
};

use super::Error;

/// The suffix of the headless Service HAProxy resolves (`web-pods` for `web`).
pub const HEADLESS_SUFFIX: &str = "-pods";
/// How often HAProxy's statistics are read while waiting for it.
const POLL: Duration = Duration::from_millis(200);

/// What HAProxy counted for one phase, beside the load generator's own count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HaProxyCount {
    /// Requests the load generator sent.
    pub requests: u64,
    /// 5xx answers HAProxy's backend counted (`hrsp_5xx`).
    pub five_xx: u64,
    /// 5xx answers the load generator received.
    pub five_xx_seen: u64,
    /// Requests that got no answer at all (connection to HAProxy refused or cut, timed
    /// out): none is expected, HAProxy is never restarted.
    pub unanswered: u64,
    /// Failed connections to pods (`econ`), failed responses (`eresp`), retries (`wretr`)
    /// and redispatches (`wredis`), as HAProxy counted them.
    pub econ: u64,
    /// See [`HaProxyCount::econ`].
    pub eresp: u64,
    /// See [`HaProxyCount::econ`].
    pub wretr: u64,
    /// See [`HaProxyCount::econ`].
    pub wredis: u64,
    /// Why the first unanswered requests failed, as the load generator saw it.
    pub failures: Vec<String>,
}

impl HaProxyCount {
    fn of(stats: &BackendStats, report: &LoadReport) -> Self {
        HaProxyCount {
            requests: report.sent,
            five_xx: stats.hrsp_5xx,
            five_xx_seen: report.five_xx(),
            unanswered: report.failed(),
            econ: stats.econ,
            eresp: stats.eresp,
            wretr: stats.wretr,
            wredis: stats.wredis,
            failures: report.errors.clone(),
        }
    }

    /// Whether HAProxy and the load generator agree on every failure: the same 5xx, and
    /// no request left unanswered.
    pub fn agrees(&self) -> bool {
        self.five_xx == self.five_xx_seen && self.unanswered == 0
    }
}

/// The real load balancer a scenario runs behind, and whether HAProxy retries.
#[derive(Clone, Debug)]
pub struct RealBalancer {
    /// CoreDNS and its relay, shared by every row.
    pub balancer: std::sync::Arc<Balancer>,
    /// `retry-on all-retryable-errors` and `option redispatch` on.
    pub retries: bool,
    /// The webhook's confirmed release asks this phase's HAProxy (through the
    /// [`Balancer::stats_url`] relay); otherwise the relay answers 503 and every pod keeps
    /// its whole delay.
    pub confirm: bool,
}

/// CoreDNS reading the cluster and the relay that gives HAProxy the pods' loopback twins;
/// stops when dropped.
pub struct Balancer {
    haproxy: PathBuf,
    dir: PathBuf,
    relay: PodNetwork,
    stats: StatsRelay,
    _coredns: CoreDns,
    pod_port: u16,
    /// Fronts started so far, naming each one's directory (a unix socket's path is short).
    fronts: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("dns", &self.relay.addr())
            .field("pod_port", &self.pod_port)
            .finish_non_exhaustive()
    }
}

impl Balancer {
    /// Starts CoreDNS on `kubeconfig`'s cluster, writing its files and logs under `dir`;
    /// HAProxy, started for each phase, connects to the pods on `pod_port` (the pod
    /// network's).
    pub async fn start(kubeconfig: &Path, dir: &Path, pod_port: u16) -> Result<Balancer, Error> {
        let err = |reason: String| Error::Component {
            name: "load balancer".into(),
            reason,
        };
        let coredns_bin = real_lb::binaries::coredns().map_err(|e| err(e.to_string()))?;
        let haproxy = real_lb::binaries::haproxy().map_err(|e| err(e.to_string()))?;
        std::fs::create_dir_all(dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
        let coredns = CoreDns::start(&coredns_bin, kubeconfig, dir)
            .await
            .map_err(|e| err(graceful_drain_core::error::chain(&e).to_string()))?;
        let relay = PodNetwork::start(coredns.addr())
            .await
            .map_err(|e| err(format!("start the pod network's DNS relay: {e}")))?;
        let stats = StatsRelay::start()
            .await
            .map_err(|e| err(format!("start the statistics relay: {e}")))?;
        Ok(Balancer {
            haproxy,
            dir: dir.to_path_buf(),
            relay,
            stats,
            _coredns: coredns,
            pod_port,
            fronts: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The statistics page the webhook's `--balancer-config` names: the HAProxy of the
    /// phase that confirms releases, with pod addresses ([`StatsRelay`]).
    pub fn stats_url(&self) -> String {
        self.stats.url()
    }

    /// Puts HAProxy in front of `spec`'s pods: the headless Service it resolves, HAProxy,
    /// then once it routes to every ready pod, traffic at `traffic`'s rate and within its
    /// bounds; with `real.retries`, HAProxy retries a failed request on another server;
    /// with `real.confirm`, the webhook's confirmed release asks it.
    pub async fn front(
        real: &RealBalancer,
        cluster: &DataPlane,
        spec: &WebSpec,
        traffic: &kube_sim::traffic::TrafficConfig,
        timeout: Duration,
    ) -> Result<Front, Error> {
        let this = &real.balancer;
        let name = format!("{}{HEADLESS_SUFFIX}", spec.name);
        let err = |reason: String| Error::Component {
            name: format!("haproxy in front of service {}/{name}", spec.namespace),
            reason,
        };
        ensure_headless(cluster, spec, &name).await?;
        let fqdn = format!("{name}.{}.svc.{}", spec.namespace, real_lb::coredns::ZONE);
        let mut config = HaProxyConfig::new(this.relay.addr(), fqdn, this.pod_port);
        config.retries = real.retries;
        config.slots = usize::try_from(spec.replicas)
            .unwrap_or(8)
            .saturating_mul(2)
            + 2;
        // Numbered, not named after the namespace: HAProxy's stats socket path must stay
        // under 98 bytes. The configuration names the Service, hence the namespace.
        let index = this
            .fronts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = this.dir.join(format!("haproxy-{index}"));
        std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
        let haproxy = HaProxy::start(&this.haproxy, &config, &dir)
            .await
            .map_err(|e| err(graceful_drain_core::error::chain(&e).to_string()))?;
        let mut front = Front {
            haproxy,
            load: None,
            stop: CancellationToken::new(),
            pod_port: this.pod_port,
            confirming: real.confirm.then(|| this.clone()),
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ready = ready_twins(cluster, spec, this.pod_port).await?;
            let routed = front.up().await?;
            if !ready.is_empty() && ready.is_subset(&routed) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(err(format!(
                    "HAProxy routes to {} of the {} ready pods after {timeout:?}",
                    ready.intersection(&routed).count(),
                    ready.len()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        let url = format!("http://{}/", front.haproxy.frontend());
        let rate = traffic.rate.round().clamp(1.0, 10_000.0) as u32;
        let load = Load::start(
            &url,
            rate,
            traffic.max_requests,
            traffic.max_duration,
            front.stop.clone(),
        )
        .map_err(|e| err(e.to_string()))?;
        front.load = Some(load);
        if let Some(balancer) = &front.confirming {
            let socket = front.haproxy.stats_socket().to_path_buf();
            balancer.stats.point_at(Some(socket));
        }
        Ok(front)
    }
}

/// HAProxy and its traffic for one phase; both stop when dropped.
pub struct Front {
    haproxy: HaProxy,
    load: Option<Load>,
    stop: CancellationToken,
    pod_port: u16,
    /// The balancer whose statistics relay points at this HAProxy, until dropped.
    confirming: Option<std::sync::Arc<Balancer>>,
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(balancer) = &self.confirming {
            balancer.stats.point_at(None);
        }
    }
}

impl Front {
    /// The addresses HAProxy routes to now (servers fully UP, not the ones still counting
    /// their first health checks).
    async fn up(&self) -> Result<BTreeSet<SocketAddr>, Error> {
        let stats = self.stats().await?;
        Ok(stats
            .servers
            .iter()
            .filter(|s| s.status == "UP")
            .filter_map(|s| s.addr)
            .collect())
    }

    async fn stats(&self) -> Result<BackendStats, Error> {
        self.haproxy.stats().await.map_err(|e| Error::Component {
            name: "haproxy".into(),
            reason: format!(
                "read its statistics: {}",
                graceful_drain_core::error::chain(&e)
            ),
        })
    }

    /// Waits (at most `bound`) until HAProxy routes to no address but a ready pod's, so
    /// that 5xx of its discovery lag are counted too, then stops the traffic and reads
    /// HAProxy's counts.
    pub async fn finish(
        mut self,
        cluster: &DataPlane,
        spec: &WebSpec,
        bound: Duration,
    ) -> Result<HaProxyCount, Error> {
        let pod_port = self.pod_port;
        let deadline = tokio::time::Instant::now() + bound;
        let settled = loop {
            let ready = ready_twins(cluster, spec, pod_port).await?;
            let stats = self.stats().await?;
            if stats.routed().is_subset(&ready) {
                break Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let stale: Vec<String> = stats
                    .routed()
                    .difference(&ready)
                    .map(ToString::to_string)
                    .collect();
                break Err(Error::Component {
                    name: "haproxy".into(),
                    reason: format!(
                        "still routes to {} after {bound:?}, no ready pod's address",
                        stale.join(", ")
                    ),
                });
            }
            tokio::time::sleep(POLL).await;
        };
        let report = match self.load.take() {
            Some(load) => load.stop().await,
            None => LoadReport::default(),
        };
        settled?;
        let stats = self.stats().await?;
        Ok(HaProxyCount::of(&stats, &report))
    }
}

/// The loopback twins (on `pod_port`) of the pods of `spec` that are ready and not
/// terminating: where HAProxy should route.
async fn ready_twins(
    cluster: &DataPlane,
    spec: &WebSpec,
    pod_port: u16,
) -> Result<BTreeSet<SocketAddr>, Error> {
    Ok(super::pods_of(cluster, spec)
        .await?
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && kube_sim::controllers::pod_ready(p))
        .filter_map(|p| p.status.as_ref()?.pod_ip.as_deref()?.parse::<IpAddr>().ok())
        .filter_map(loopback_twin)
        .map(|ip| SocketAddr::new(ip, pod_port))
        .collect())
}

/// Creates the headless Service `name` (what an HAProxy with DNS service discovery
/// resolves) with the selector of the workload's own Service, unless it exists: the pods
/// the traffic Service selects, and that isolation takes out of it (a StatefulSet's pods
/// keep their StatefulSet's labels; its traffic Service selects one more).
async fn ensure_headless(cluster: &DataPlane, spec: &WebSpec, name: &str) -> Result<(), Error> {
    let services: Api<Service> = Api::namespaced(cluster.client(), &spec.namespace);
    let selector = services
        .get_opt(&spec.name)
        .await
        .map_err(|source| Error::Api {
            action: "read service",
            object: spec.service_key(),
            source,
        })?
        .and_then(|s| s.spec?.selector)
        .unwrap_or_else(|| [("app".to_string(), spec.name.clone())].into());
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(spec.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 8080,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    match services.create(&PostParams::default(), &service).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(Error::Api {
            action: "create headless service",
            object: format!("{}/{}", spec.namespace, service.name_any()),
            source,
        }),
    }
}
