//! The default scenario of `graceful-drain simulate`: on a fresh simulated cluster with
//! the standard workload and steady traffic, drain the busiest node, then roll out the
//! Deployment — once without protection (a plain eviction loop, like `kubectl drain`) and
//! once with graceful-drain's real webhook and node agents (the drain goes through a
//! LifecycleEvent) — and measure requests, 5xx and how long each disruption took.

pub mod actions;
pub mod balancer;
pub mod components;
pub mod drainers;
pub mod forged;
pub mod holds;
mod hostile;
pub mod karpenter;
pub mod lb_scenarios;
pub mod matrix;
pub mod real;
pub mod shipped;
pub mod spec;
pub mod tiered;
mod vm_scenario;
pub mod workloads;

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use self::components::{Components, ComponentsConfig};
use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{self, ClusterConfig, DataPlane, WebSpec, wait_for};
use kube_sim::traffic::TrafficConfig;
use kube_sim::traffic::clients::Clients;
use kube_sim::traffic::timeline::Event;

/// Errors of a scenario run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The simulated cluster failed.
    #[error(transparent)]
    Cluster(#[from] cluster::Error),
    /// An API call of the scenario failed.
    #[error("{action} {object}")]
    Api {
        /// What was attempted, a verb phrase such as `evict` or `list pods on`.
        action: &'static str,
        /// The object acted on, such as `pod default/web-1` or `node n1`.
        object: String,
        /// The API server's or the client's error.
        #[source]
        source: kube::Error,
    },
    /// One of graceful-drain's components could not run.
    #[error("{name}: {reason}")]
    Component {
        /// The component or step, such as `webhook`, `node-agent` or `temp dir`.
        name: String,
        /// What went wrong, as text.
        reason: String,
    },
    /// A drain did not complete.
    #[error("drain node {node}: {reason}")]
    Drain {
        /// The node being drained.
        node: String,
        /// Why the drain did not complete, such as a LifecycleEvent that ended Failed or
        /// did not complete in time.
        reason: String,
    },
    /// graceful-drain's CRDs could not be built for the cluster.
    #[error(transparent)]
    Crds(#[from] graceful_drain_core::lifecycle::crds::Error),
    /// A drain evicted a pod of a tier before the tier before it had left the node.
    #[error("eviction tiers out of order: {reason}")]
    TierOrder {
        /// Which pod went too early, and which pod of an earlier tier was still there.
        reason: String,
    },
}

impl From<crate::setup::Error> for Error {
    fn from(error: crate::setup::Error) -> Error {
        match error {
            crate::setup::Error::Crds(error) => Error::Crds(error),
            crate::setup::Error::Cluster(error) => Error::Cluster(error),
        }
    }
}

/// Whether graceful-drain protects the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protection {
    /// No webhook; drains are plain eviction loops.
    None,
    /// graceful-drain's webhook and node agents; drains go through LifecycleEvents.
    GracefulDrain,
}

impl Protection {
    /// `without graceful-drain` or `with graceful-drain`, for sentences.
    pub fn phrase(self) -> &'static str {
        match self {
            Protection::None => "without graceful-drain",
            Protection::GracefulDrain => "with graceful-drain",
        }
    }
}

impl fmt::Display for Protection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protection::None => "none",
            Protection::GracefulDrain => "graceful-drain",
        })
    }
}

/// Everything a scenario run needs.
#[derive(Clone, Debug)]
pub struct ScenarioConfig {
    /// The simulated cluster: nodes, kubelets, load balancers, API server and faults.
    pub cluster: ClusterConfig,
    /// The workload disrupted: a Deployment behind a LoadBalancer Service, with a PDB.
    pub web: WebSpec,
    /// Traffic shape; its bounds apply to each phase.
    pub traffic: TrafficConfig,
    /// Where the traffic comes from: a connection per request, or keep-alive clients.
    pub clients: Clients,
    /// graceful-drain's flags, for the protected runs.
    pub components: ComponentsConfig,
    /// Bound of each phase (deploy, drain, rollout).
    pub phase_timeout: Duration,
    /// A real load balancer (HAProxy through CoreDNS) in front of the workload too, with
    /// traffic and a 5xx count of its own (the real tier's `--load-balancer haproxy`).
    pub balancer: Option<balancer::RealBalancer>,
}

/// What one phase measured.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Requests sent during the phase and until the load balancer settled, failed ones
    /// included.
    pub requests: u64,
    /// Requests of [`Measured::requests`] that failed, whatever the reason: no target,
    /// refused, cut in flight or sent on a reset connection.
    pub errors_5xx: u64,
    /// From the start of the disruption until it completed (settling not included).
    pub duration: Duration,
    /// The cluster's significant events during the phase, with the 5xx bursts.
    pub timeline: Vec<Event>,
    /// What the real load balancer counted, when one ran ([`ScenarioConfig::balancer`]).
    pub haproxy: Option<balancer::HaProxyCount>,
}

/// One line of the result table.
#[derive(Debug)]
pub struct Row {
    /// The phase: `drain` or `rollout`.
    pub scenario: &'static str,
    /// Whether graceful-drain ran.
    pub protection: Protection,
    /// The figures, or why the phase failed (the error with its causes).
    pub result: Result<Measured, String>,
}

/// A phase of [`run_all_reporting`] starting or ending, for a progress report.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// Phase `scenario` (`drain`, `rollout`) with `protection` begins, traffic flowing.
    Started {
        /// The phase.
        scenario: &'static str,
        /// Whether graceful-drain runs.
        protection: Protection,
    },
    /// A phase ended (or could not run): its row of the table.
    Finished(&'a Row),
    /// Both phases ended; graceful-drain's components stop, and are waited for, before
    /// the cluster.
    Stopping,
}

/// Receives [`Progress`] as the phases of both clusters start and end.
pub type ProgressFn<'r> = &'r (dyn Fn(Progress<'_>) + Sync);

/// The pods of `spec` (label `app=<name>`), whatever their state.
pub(crate) async fn pods_of(cluster: &DataPlane, spec: &WebSpec) -> Result<Vec<Pod>, Error> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("app={}", spec.name)))
        .await
        .map_err(|source| Error::Api {
            action: "list pods of",
            object: spec.service_key(),
            source,
        })?;
    Ok(list.items)
}

/// The node running most pods of `spec` (ties by name).
pub(crate) async fn busiest_node(cluster: &DataPlane, spec: &WebSpec) -> Result<String, Error> {
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for pod in &pods_of(cluster, spec).await? {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *per_node.entry(node).or_default() += 1;
        }
    }
    per_node
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(n, _)| n)
        .ok_or_else(|| Error::Drain {
            node: "?".into(),
            reason: "no pod of the workload is bound to a node".into(),
        })
}

/// Runs `action` under traffic and waits until the load balancer only routes to pods
/// that accept, so late 5xx (deregistration lag) are counted too.
pub(crate) async fn measure<F>(
    cluster: &DataPlane,
    cfg: &ScenarioConfig,
    action: F,
) -> Result<Measured, Error>
where
    F: std::future::Future<Output = Result<(), Error>>,
{
    let front = match &cfg.balancer {
        Some(real) => {
            let front =
                balancer::Balancer::front(real, cluster, &cfg.web, &cfg.traffic, cfg.phase_timeout);
            Some(front.await?)
        }
        None => None,
    };
    let traffic = cluster.traffic_with(&cfg.web, cfg.traffic, cfg.clients);
    let start = Instant::now();
    let outcome = action.await;
    let duration = start.elapsed();
    let service = cfg.web.service_key();
    let settled = wait_for("load balancer to settle", settle_bound(cfg), || async {
        let targets = cluster.lbs().routable(&service, Instant::now());
        // Connection-level balancing settles once no client connection is left on a pod
        // that no longer accepts (each ends in a reconnection or a counted reset).
        targets.iter().all(|uid| cluster.apps().accepting(uid))
            && cluster.apps().stranded_connections() == 0
    })
    .await;
    // HAProxy lets go of a pod on its own clock (DNS, health checks): its traffic runs
    // until it routes to ready pods only.
    let haproxy = match front {
        Some(front) => Some(front.finish(cluster, &cfg.web, settle_bound(cfg)).await),
        None => None,
    };
    let report = traffic.stop().await;
    outcome?;
    settled?;
    let haproxy = haproxy.transpose()?;
    if let Some(count) = haproxy.as_ref().filter(|c| !c.agrees()) {
        return Err(Error::Component {
            name: "haproxy".into(),
            reason: format!(
                "its count and the load generator's disagree: HAProxy answered {} 5xx, the load generator saw {} and {} requests unanswered ({})",
                count.five_xx,
                count.five_xx_seen,
                count.unanswered,
                count.failures.join("; ")
            ),
        });
    }
    Ok(Measured {
        requests: report.requests,
        errors_5xx: report.errors_5xx,
        duration,
        timeline: report.timeline,
        haproxy,
    })
}

/// How long the load balancer may take to settle after a disruption: the slowest ALB
/// node's deregistration lag, the controller latency and registration lag, and for
/// keep-alive clients the longest request plus one client's pause between requests.
fn settle_bound(cfg: &ScenarioConfig) -> Duration {
    let (lb, model) = (&cfg.cluster.lb, &cfg.cluster.lb_model);
    let slowest_node = lb
        .deregistration_lag
        .mul_f64(1.0 + model.alb_lag_jitter.clamp(0.0, 1.0));
    let clients = match cfg.clients {
        Clients::PerRequest => Duration::ZERO,
        Clients::KeepAlive(ka) => {
            let pause = ka.connections as f64 / cfg.traffic.rate.max(0.001);
            ka.longest(&cfg.traffic) + Duration::from_secs_f64(pause)
        }
    };
    slowest_node
        + model.alb_controller_latency
        + lb.registration_lag
        + clients
        + Duration::from_secs(2)
}

/// Runs the drain and rollout phases on one cluster with `protection`.
pub async fn run_protection(
    cfg: &ScenarioConfig,
    protection: Protection,
    shutdown: &Shutdown,
) -> Vec<Row> {
    run_protection_reporting(cfg, protection, shutdown, &|_| {}).await
}

/// [`run_protection`], telling `progress` as each phase starts and ends.
async fn run_protection_reporting(
    cfg: &ScenarioConfig,
    protection: Protection,
    shutdown: &Shutdown,
    progress: ProgressFn<'_>,
) -> Vec<Row> {
    let row = |scenario, result: Result<Measured, Error>| Row {
        scenario,
        protection,
        result: result.map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
    };
    // Set-up failed: neither phase can run.
    let failed = |reason: String| -> Vec<Row> {
        let rows: Vec<Row> = ["drain", "rollout"]
            .into_iter()
            .map(|scenario| Row {
                scenario,
                protection,
                result: Err(reason.clone()),
            })
            .collect();
        for row in &rows {
            progress(Progress::Finished(row));
        }
        rows
    };
    let cluster = match crate::setup::start(cfg.cluster.clone(), shutdown.clone()).await {
        Ok(c) => c,
        Err(e) => return failed(graceful_drain_core::error::chain(&e).to_string()),
    };
    let mut components = None;
    if protection == Protection::GracefulDrain {
        match Components::start(&cluster, &cfg.components).await {
            Ok(c) => components = Some(c),
            Err(e) => return failed(graceful_drain_core::error::chain(&e).to_string()),
        }
    }
    if let Err(e) = cluster.deploy_web(&cfg.web, cfg.phase_timeout).await {
        return failed(graceful_drain_core::error::chain(&e).to_string());
    }
    let client = cluster.client();
    let drain = async {
        let node = busiest_node(&cluster, &cfg.web).await?;
        cluster.step(format!("drain node {node}"));
        match protection {
            Protection::None => actions::plain_drain(&client, &node, cfg.phase_timeout).await,
            Protection::GracefulDrain => {
                actions::lifecycle_drain(&client, &node, cfg.phase_timeout).await
            }
        }
    };
    progress(Progress::Started {
        scenario: "drain",
        protection,
    });
    let mut rows = vec![row("drain", measure(&cluster, cfg, drain).await)];
    progress(Progress::Finished(&rows[0]));
    let rollout = async {
        cluster.wait_web_ready(&cfg.web, cfg.phase_timeout).await?;
        cluster.step("rollout restart");
        actions::rollout(&client, &cfg.web, cfg.phase_timeout).await
    };
    progress(Progress::Started {
        scenario: "rollout",
        protection,
    });
    rows.push(row("rollout", measure(&cluster, cfg, rollout).await));
    progress(Progress::Finished(&rows[1]));
    // The components stop before the cluster (dropped on return), so none calls a
    // stopped API server.
    if let Some(c) = components {
        progress(Progress::Stopping);
        stop_components(c, &mut rows).await;
    }
    rows
}

/// Stops `components` and waits until they exited; one that died during the run, or
/// failed to stop, makes the figures of `rows` meaningless.
async fn stop_components(mut components: Components, rows: &mut [Row]) {
    let outcome = match components.check().await {
        Ok(()) => components.shut_down().await,
        Err(e) => Err(e),
    };
    if let Err(e) = outcome {
        for r in rows {
            r.result = Err(graceful_drain_core::error::chain(&e).to_string());
        }
    }
}

/// Runs every phase without and with graceful-drain, both clusters side by side.
pub async fn run_all(cfg: &ScenarioConfig, shutdown: &Shutdown) -> Vec<Row> {
    run_all_reporting(cfg, shutdown, &|_| {}).await
}

/// [`run_all`], telling `progress` as each phase of either cluster starts and ends.
pub async fn run_all_reporting(
    cfg: &ScenarioConfig,
    shutdown: &Shutdown,
    progress: ProgressFn<'_>,
) -> Vec<Row> {
    let (mut without, with) = tokio::join!(
        run_protection_reporting(cfg, Protection::None, shutdown, progress),
        run_protection_reporting(cfg, Protection::GracefulDrain, shutdown, progress)
    );
    without.extend(with);
    without.sort_by_key(|r| (r.scenario, r.protection));
    without
}

/// The one-line summary of [`run_all`]'s rows, and whether they behaved as expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `verdict: …`, naming the rows that did not behave as expected.
    pub line: String,
    /// Every row ran and none with graceful-drain saw a 5xx.
    pub passed: bool,
}

/// Judges the rows: every phase must run, and with graceful-drain none may see a 5xx.
/// The 5xx without it are what graceful-drain saves, counted for the summary.
pub fn verdict(rows: &[Row]) -> Verdict {
    let mut problems = Vec::new();
    let mut unprotected_5xx = 0;
    for r in rows {
        match (&r.result, r.protection) {
            (Err(_), _) => problems.push(format!(
                "{} {} failed",
                r.scenario,
                Protection::phrase(r.protection)
            )),
            (Ok(m), Protection::None) => unprotected_5xx += m.errors_5xx,
            (Ok(m), Protection::GracefulDrain) if m.errors_5xx > 0 => problems.push(format!(
                "{} with graceful-drain had {} 5xx",
                r.scenario, m.errors_5xx
            )),
            (Ok(_), Protection::GracefulDrain) => {}
        }
    }
    if problems.is_empty() {
        Verdict {
            line: format!(
                "verdict: with graceful-drain 0 5xx in every scenario (without: {unprotected_5xx})"
            ),
            passed: true,
        }
    } else {
        Verdict {
            line: format!("verdict: not as expected: {}", problems.join("; ")),
            passed: false,
        }
    }
}

/// Renders the result table.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<9} {:<15} {:>9} {:>6} {:>10}\n",
        "scenario", "protection", "requests", "5xx", "duration"
    );
    for r in rows {
        match &r.result {
            Ok(m) => out.push_str(&format!(
                "{:<9} {:<15} {:>9} {:>6} {:>9.1}s\n",
                r.scenario,
                r.protection.to_string(),
                m.requests,
                m.errors_5xx,
                m.duration.as_secs_f64()
            )),
            Err(e) => out.push_str(&format!(
                "{:<9} {:<15} error: {e}\n",
                r.scenario,
                r.protection.to_string()
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(requests: u64, errors_5xx: u64) -> Result<Measured, String> {
        Ok(Measured {
            requests,
            errors_5xx,
            duration: Duration::from_secs(2),
            timeline: vec![],
            haproxy: None,
        })
    }

    fn rows(results: [Result<Measured, String>; 4]) -> Vec<Row> {
        let keys = [
            ("drain", Protection::None),
            ("drain", Protection::GracefulDrain),
            ("rollout", Protection::None),
            ("rollout", Protection::GracefulDrain),
        ];
        keys.into_iter()
            .zip(results)
            .map(|((scenario, protection), result)| Row {
                scenario,
                protection,
                result,
            })
            .collect()
    }

    #[test]
    fn verdict_passes_when_graceful_drain_saves_every_request() {
        let v = verdict(&rows([
            measured(400, 119),
            measured(700, 0),
            measured(450, 196),
            measured(700, 0),
        ]));
        assert_eq!(
            v.line,
            "verdict: with graceful-drain 0 5xx in every scenario (without: 315)"
        );
        assert!(v.passed);
    }

    #[test]
    fn verdict_names_the_rows_that_misbehaved() {
        let v = verdict(&rows([
            measured(400, 119),
            measured(700, 3),
            Err("cluster: api server gone".into()),
            measured(700, 0),
        ]));
        assert_eq!(
            v.line,
            "verdict: not as expected: drain with graceful-drain had 3 5xx; \
             rollout without graceful-drain failed"
        );
        assert!(!v.passed);
    }

    #[test]
    fn table_shows_figures_and_errors() {
        let rows = vec![
            Row {
                scenario: "drain",
                protection: Protection::None,
                result: Ok(Measured {
                    requests: 812,
                    errors_5xx: 96,
                    duration: Duration::from_millis(1234),
                    timeline: vec![],
                    haproxy: None,
                }),
            },
            Row {
                scenario: "drain",
                protection: Protection::GracefulDrain,
                result: Err("webhook: not ready".into()),
            },
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("scenario"));
        assert!(
            lines[1].contains("none")
                && lines[1].contains("812")
                && lines[1].contains("96")
                && lines[1].ends_with("1.2s"),
            "{t}"
        );
        assert!(
            lines[2].contains("graceful-drain") && lines[2].contains("error: webhook: not ready"),
            "{t}"
        );
    }
}
