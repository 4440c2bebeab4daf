//! The scoreboard on a real control plane: the disruptions whose outcome depends on the
//! real kube-controller-manager, kube-scheduler and admission chain, each under traffic
//! through the simulated load balancer, without and then with graceful-drain.
//!
//! One [`RealCluster`] serves every row: its simulated kubelets and load balancers are
//! attached once, and each row deploys its own workload in a namespace of its own, so a
//! row never sees another's pods. The rows without protection run first; then the webhook
//! and node agents start (with ServiceAccount tokens under the chart's RBAC) and the same
//! rows run again with protection. A row that fails on the real controllers today is a
//! [`Expect::KnownFailure`]: it stays in the table with the issue that removes it.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;

use super::actions::ready_live;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::components::Components;
use super::{
    Error, Measured, Protection, ScenarioConfig, actions, busiest_node, measure, workloads,
};
use super::{drainers, forged, karpenter};
use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{DataPlane, RealCluster, WebSpec, wait_for};

/// What a row is expected to show on the real controllers today.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// It finishes; with protection, with no 5xx.
    Pass,
    /// It does not finish on the real controllers yet; the issue that fixes it.
    KnownFailure(&'static str),
}

/// A disruption the real tier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// `kubectl drain` of the busiest node (plain evictions), or with protection
    /// `kubectl apply -f` of deploy/examples/drain-event.yaml naming it (the node agents
    /// drain it).
    Drain,
    /// `kubectl drain` of the busiest node, with and without graceful-drain: a drainer we
    /// did not write, whose time is compared with the bound no drain can beat (the
    /// deregistration delay plus the app's exit after SIGTERM).
    KubectlDrain,
    /// One pass of the descheduler (RemoveDuplicates, one eviction per node at most) over
    /// a Deployment of its own packed onto one or two nodes (`drainers::Layout`); only where the descheduler is built
    /// ([`drainers::descheduler`]). With `background`, the descheduler's
    /// `EvictionsInBackground` gate is on, the pods ask for it, and with protection the
    /// webhook requires kube-apiserver's client certificate (every review authenticated):
    /// only on a control plane that presents one.
    Descheduler {
        /// Evictions in the background.
        background: bool,
    },
    /// Karpenter (KWOK provider) provisions nodes for a Deployment of 21 pods, then, under
    /// traffic, consolidates them after a scale-down to 6 or replaces every one of them
    /// after its NodePool drifted ([`karpenter`]); only where Karpenter is built
    /// ([`karpenter::karpenter`]).
    Karpenter(karpenter::Disruption),
    /// `kubectl rollout restart` of the Deployment.
    RolloutRestart,
    /// Scale to half the replicas, then back (what an autoscaler does).
    ScaleDownUp,
    /// `kubectl rollout restart` of a Deployment with the Recreate strategy: old and new
    /// pods must never run together (a 5xx gap is what Recreate means).
    RecreateRollout,
    /// The drain row with HAProxy retrying a failed request on another server (`retry-on
    /// all-retryable-errors`, `option redispatch`); the other rows run with HAProxy's
    /// defaults. Only behind HAProxy (`--load-balancer haproxy`).
    DrainHaProxyRetries,
    /// A LifecycleEvent drain of the busiest node with confirmed release: the webhook asks
    /// the row's HAProxy (`--balancer-config`, its statistics) whether it still routes to
    /// each isolated pod, and ends the pod's delay once it no longer does. Every isolated
    /// pod must be let go so, before its delay, with no 5xx. Protected only, behind HAProxy
    /// only.
    LbConfirmedDrain,
    /// `kubectl rollout restart` with confirmed release, as [`Disruption::LbConfirmedDrain`]:
    /// the DELETEs the webhook holds go through once HAProxy let go of their pods.
    LbConfirmedRollout,
    /// Drain of a node running pods of a StatefulSet behind its governing headless Service
    /// (whose selector is the StatefulSet's own) and a LoadBalancer Service.
    StatefulSetDrain,
    /// AdmissionReviews forged by someone who reaches the webhook's port (none reached the
    /// API server) about pods of `0` ([`forged`]): an eviction and two DELETEs, one
    /// claiming the pods' controller, or a flood of evictions. Nothing is deleted, the
    /// Service never drops below its budget, and every isolated pod goes back into its
    /// Service at its restore time. Protected only.
    Forged(forged::Target),
    /// No review at all: `kubectl drain` of the busiest node while clients hold the
    /// webhook's port with stalled bodies, silent and bare connections from addresses of
    /// their own (`hostile::row`). The drain must finish with no 5xx within the
    /// kubectl-drain row's bound. Protected only.
    ForgedTransport,
    /// `kubectl apply -f` of the example LifecycleEvent written in the seed group
    /// `lifecycle.k8s.io` (the SLM seeds' YAML), with deploy/seed-group.yaml applied (the
    /// chart's `lifecycleCrds.seedGroup`): the node agents carry it over to our group and
    /// drain the node. Protected only, and only where Kubernetes leaves that group free
    /// (the EvictionRequest API off).
    SeedGroupDrain,
    /// Two members of a StatefulSet behind a PDB on the StatefulSet's own key, with a
    /// deregistration delay over the disruption controller's two-minute DeletionTimeout:
    /// the first is evicted, the second's eviction is retried as a drain does, and it
    /// must be refused until the first is gone — never fewer than `minAvailable` pods
    /// serving. Protected only.
    StatefulSetLongDelay,
    /// A LifecycleEvent drain of the busiest node; once the first pod is isolated,
    /// kube-apiserver is restarted. The drain must finish with no 5xx. Protected only, and
    /// only on a control plane the tier started itself.
    ApiServerRestartDrain,
    /// `kubectl rollout restart`; once the first pod is isolated, kube-controller-manager
    /// is restarted. The rollout must finish with no 5xx. Protected only, and only on a
    /// control plane the tier started itself.
    ControllerManagerRestartRollout,
    /// A LifecycleEvent drain of the busiest node with two webhook replicas behind one
    /// address (the chart's default), the Lease holder in an OS process of its own; once
    /// the first pod is isolated, that process is killed with SIGKILL, and the other
    /// replica takes over. The drain must finish with no 5xx and nothing isolated left
    /// behind. Protected only.
    WebhookKillDrain,
    /// `helm uninstall` while a `kubectl drain` has pods isolated: Helm's deletions in
    /// Helm's order, then the webhook replica stops; nothing isolated may be left and the
    /// webhook's rights must go once it is done. Protected only, and last (it removes the
    /// webhook).
    UninstallMidDrain,
}

impl fmt::Display for Disruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Disruption::Drain => "drain",
            Disruption::DrainHaProxyRetries => "drain-haproxy-retries",
            Disruption::LbConfirmedDrain => "lb-confirmed-drain",
            Disruption::LbConfirmedRollout => "lb-confirmed-rollout",
            Disruption::KubectlDrain => "kubectl-drain",
            Disruption::Descheduler { background: false } => "descheduler",
            Disruption::Descheduler { background: true } => "descheduler-in-background",
            Disruption::Karpenter(karpenter::Disruption::Consolidation) => {
                "karpenter-consolidation"
            }
            Disruption::Karpenter(karpenter::Disruption::Drift) => "karpenter-drift",
            Disruption::RolloutRestart => "rollout-restart",
            Disruption::ScaleDownUp => "scale-down-up",
            Disruption::RecreateRollout => "recreate-rollout",
            Disruption::StatefulSetDrain => "statefulset-drain",
            Disruption::Forged(forged::Target::Deployment) => "forged-review",
            Disruption::Forged(forged::Target::StatefulSet) => "forged-statefulset",
            Disruption::Forged(forged::Target::DaemonSet) => "forged-daemonset",
            Disruption::Forged(forged::Target::BarePods) => "forged-bare-pods",
            Disruption::Forged(forged::Target::Flood { pdb: true }) => "forged-flood",
            Disruption::Forged(forged::Target::Flood { pdb: false }) => "forged-flood-no-pdb",
            Disruption::Forged(forged::Target::Cordoned) => "forged-cordoned",
            Disruption::Forged(forged::Target::TwoReplicas) => "forged-two-replicas",
            Disruption::Forged(forged::Target::StalledStatefulSet) => "forged-statefulset-stalled",
            Disruption::ForgedTransport => "forged-transport",
            Disruption::SeedGroupDrain => "seed-group-drain",
            Disruption::StatefulSetLongDelay => "statefulset-long-delay",
            Disruption::ApiServerRestartDrain => "apiserver-restart-drain",
            Disruption::ControllerManagerRestartRollout => "controller-manager-restart-rollout",
            Disruption::WebhookKillDrain => "webhook-kill-drain",
            Disruption::UninstallMidDrain => "uninstall-mid-drain",
        })
    }
}

/// One row of the real tier.
#[derive(Clone, Copy, Debug)]
pub struct RealScenario {
    /// What the row does to the workload; its name is the row's name (`--row`).
    pub disruption: Disruption,
    /// Whether graceful-drain runs.
    pub protection: Protection,
    /// Whether the row is expected to pass today.
    pub expect: Expect,
}

/// Every row, unprotected ones first; the seed-group and long-delay rows only where
/// `upstream` (Kubernetes' own lifecycle.k8s.io API) is off; the fault rows only with
/// `faults` (a control plane the tier started, whose components it can restart); the
/// drain with HAProxy's retries only `behind_haproxy`. No row is a known failure today; a
/// row that fails on the real controllers before its fix lands is marked
/// [`Expect::KnownFailure`] with the issue that removes it.
pub fn scenarios(upstream: bool, faults: bool, behind_haproxy: bool) -> Vec<RealScenario> {
    use Disruption::*;
    let mut all = Vec::new();
    for protection in [Protection::None, Protection::GracefulDrain] {
        if behind_haproxy {
            all.push(RealScenario {
                disruption: DrainHaProxyRetries,
                protection,
                expect: Expect::Pass,
            });
        }
        for disruption in [
            Drain,
            KubectlDrain,
            RolloutRestart,
            ScaleDownUp,
            RecreateRollout,
            StatefulSetDrain,
        ] {
            all.push(RealScenario {
                disruption,
                protection,
                expect: Expect::Pass,
            });
        }
        if drainers::descheduler().is_some() {
            for background in [false, true] {
                all.push(RealScenario {
                    disruption: Descheduler { background },
                    protection,
                    expect: Expect::Pass,
                });
            }
        }
        if karpenter::karpenter().is_some() {
            for disruption in [
                karpenter::Disruption::Consolidation,
                karpenter::Disruption::Drift,
            ] {
                all.push(RealScenario {
                    disruption: Karpenter(disruption),
                    protection,
                    expect: Expect::Pass,
                });
            }
        }
    }
    if behind_haproxy {
        for disruption in [LbConfirmedDrain, LbConfirmedRollout] {
            all.push(RealScenario {
                disruption,
                protection: Protection::GracefulDrain,
                expect: Expect::Pass,
            });
        }
    }
    for target in [
        forged::Target::Deployment,
        forged::Target::StatefulSet,
        forged::Target::DaemonSet,
        forged::Target::BarePods,
        forged::Target::Flood { pdb: true },
        forged::Target::Flood { pdb: false },
        forged::Target::Cordoned,
        forged::Target::TwoReplicas,
        forged::Target::StalledStatefulSet,
    ] {
        all.push(RealScenario {
            disruption: Forged(target),
            protection: Protection::GracefulDrain,
            expect: Expect::Pass,
        });
    }
    all.push(RealScenario {
        disruption: ForgedTransport,
        protection: Protection::GracefulDrain,
        expect: Expect::Pass,
    });
    if !upstream {
        all.push(RealScenario {
            disruption: SeedGroupDrain,
            protection: Protection::GracefulDrain,
            expect: Expect::Pass,
        });
    }
    // It does not touch the lifecycle API, and takes over two minutes: once is enough.
    if !upstream {
        all.push(RealScenario {
            disruption: StatefulSetLongDelay,
            protection: Protection::GracefulDrain,
            expect: Expect::Pass,
        });
    }
    if faults {
        // Seen in CI before the fix: a replacement that turned ready while kube-apiserver
        // was down was evicted as not exposed (no slice listed it yet), and the
        // EndpointSlice controller, relisting after the outage, then listed it ready while
        // it was terminating: 46 5xx. A ready pod its Service selects now counts as exposed.
        all.push(RealScenario {
            disruption: ApiServerRestartDrain,
            protection: Protection::GracefulDrain,
            expect: Expect::Pass,
        });
        all.push(RealScenario {
            disruption: ControllerManagerRestartRollout,
            protection: Protection::GracefulDrain,
            expect: Expect::Pass,
        });
    }
    // Needs nothing of the control plane: it runs against any cluster.
    all.push(RealScenario {
        disruption: WebhookKillDrain,
        protection: Protection::GracefulDrain,
        expect: Expect::Pass,
    });
    all.push(RealScenario {
        disruption: UninstallMidDrain,
        protection: Protection::GracefulDrain,
        expect: Expect::Pass,
    });
    all
}

/// `rows` in an order drawn from `seed`: the unprotected rows still before the protected
/// ones (the webhook, once started, protects every later row), and uninstall-mid-drain
/// still last (it removes the webhook); within that, any order.
pub fn shuffled(rows: Vec<RealScenario>, seed: u64) -> Vec<RealScenario> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut unprotected, rest): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .partition(|s| s.protection == Protection::None);
    let (mut last, mut protected): (Vec<_>, Vec<_>) = rest
        .into_iter()
        .partition(|s| s.disruption == Disruption::UninstallMidDrain);
    unprotected.shuffle(&mut rng);
    protected.shuffle(&mut rng);
    unprotected.append(&mut protected);
    unprotected.append(&mut last);
    unprotected
}

/// Says whether Kubernetes' own `lifecycle.k8s.io` is served: our LifecycleEvent and
/// LifecycleTransition live in `lifecycle.graceful-drain.io`, so the rows must pass either way.
fn progress_note(upstream: bool) {
    let state = if upstream { "on" } else { "off" };
    eprintln!("EvictionRequest API (lifecycle.k8s.io/v1alpha1) {state}");
}

/// Whether the API server serves Kubernetes' own EvictionRequest API.
async fn serves_eviction_requests(client: &kube::Client) -> bool {
    client
        .list_api_group_resources("lifecycle.k8s.io/v1alpha1")
        .await
        .is_ok_and(|list| list.resources.iter().any(|r| r.name == "evictionrequests"))
}

/// What one row measured, and whether that is what it expects.
#[derive(Debug)]
pub struct RealRow {
    /// The row that ran.
    pub scenario: RealScenario,
    /// The figures, or why the row failed.
    pub result: Result<Measured, String>,
}

impl RealRow {
    /// Whether the row shows what it expects: a passing row finished (with protection,
    /// without a 5xx); a known failure may fail or pass.
    pub fn as_expected(&self) -> bool {
        match (self.scenario.expect, &self.result) {
            (Expect::KnownFailure(_), _) => true,
            (Expect::Pass, Err(_)) => false,
            (Expect::Pass, Ok(m)) => {
                // Recreate means a gap; after an uninstall the drain's evictions go
                // through unprotected.
                let haproxy_clean = m.haproxy.as_ref().is_none_or(|h| h.five_xx == 0);
                // Confirmed release asks HAProxy alone: the simulated ALB in front of the
                // same pods, never asked, shows what a second balancer would see.
                let confirmed = matches!(
                    self.scenario.disruption,
                    Disruption::LbConfirmedDrain | Disruption::LbConfirmedRollout
                );
                self.scenario.protection == Protection::None
                    || self.scenario.disruption == Disruption::RecreateRollout
                    || self.scenario.disruption == Disruption::UninstallMidDrain
                    || (haproxy_clean && (confirmed || m.errors_5xx == 0))
            }
        }
    }
}

/// Restarts one control-plane component (`kube-apiserver`, `kube-controller-manager`) and
/// returns once it is back; blocking.
pub type Restart = std::sync::Arc<dyn Fn(&'static str) -> Result<(), String> + Send + Sync>;

/// Which rows of the real tier run, and how.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Just the rows whose disruption it names, when not empty.
    pub only: Vec<String>,
    /// The rows in an order shuffled by this seed ([`shuffled`]).
    pub shuffle: Option<u64>,
    /// Restarts the control plane's components: the fault rows run only with it.
    pub restart: Option<Restart>,
    /// Every row behind HAProxy too ([`super::balancer`]): the pods listen on loopback,
    /// and each row counts the 5xx HAProxy answered.
    pub haproxy: bool,
}

/// Attaches the data plane to the API server of `kubeconfig` and runs the rows of
/// [`scenarios`] that `options` selects, printing each as it finishes through `progress`.
pub async fn run(
    kubeconfig: &Path,
    cfg: &ScenarioConfig,
    options: RunOptions,
    shutdown: &Shutdown,
    progress: &mut dyn FnMut(&RealRow),
) -> Result<Vec<RealRow>, Error> {
    let RunOptions {
        only,
        shuffle,
        restart,
        haproxy,
    } = options;
    let mut cfg = cfg.clone();
    if haproxy {
        // A port picked at start: every KWOK hands out the same pod addresses.
        cfg.cluster.pod_port = Some(0);
    }
    let cluster = crate::setup::attach(cfg.cluster.clone(), kubeconfig, shutdown.clone()).await?;
    // Kept until the rows are done: HAProxy's and CoreDNS's files and logs.
    let mut balancer_dir = None;
    if haproxy {
        let port = cluster
            .pod_net()
            .map(|p| p.port())
            .ok_or(Error::Component {
                name: "load balancer".into(),
                reason: "the data plane has no pod network".into(),
            })?;
        let dir = super::components::TempDir::new("gd-haproxy").map_err(|e| Error::Component {
            name: "load balancer".into(),
            reason: format!("temporary directory: {e}"),
        })?;
        let balancer = super::balancer::Balancer::start(kubeconfig, dir.path(), port).await?;
        eprintln!(
            "every row behind HAProxy too (its files and logs in {})",
            dir.path().display()
        );
        // Confirmed release on, asking the statistics relay: it answers 503 (every pod
        // keeps its whole delay) except during lb-confirmed-drain.
        cfg.components.confirmed_release = true;
        cfg.components.balancer_stats = Some(balancer.stats_url());
        cfg.balancer = Some(super::balancer::RealBalancer {
            balancer: std::sync::Arc::new(balancer),
            retries: false,
            confirm: false,
        });
        balancer_dir = Some(dir);
    }
    let cfg = &cfg;
    let upstream = serves_eviction_requests(&cluster.client()).await;
    progress_note(upstream);
    let mut rows = Vec::new();
    // Started before the first protected row; a failure to start is that row's result
    // and every later protected row's.
    let mut components: Option<Result<Components, String>> = None;
    if drainers::descheduler().is_none() {
        eprintln!(
            "descheduler, descheduler-in-background: not run, not built (bash .ci/drainers.sh)"
        );
    }
    let client_ca = kube_control_plane::ControlPlane::webhook_client_ca_of(kubeconfig);
    if client_ca.is_none() && drainers::descheduler().is_some() {
        eprintln!(
            "descheduler-in-background: not run, kube-apiserver presents no client certificate to webhooks here"
        );
    }
    if karpenter::karpenter().is_none() {
        eprintln!(
            "karpenter-consolidation, karpenter-drift: not run, Karpenter not built (bash .ci/drainers.sh)"
        );
    }
    if upstream {
        eprintln!("seed-group-drain: not run, Kubernetes serves lifecycle.k8s.io itself");
        eprintln!("statefulset-long-delay: not run, it runs once, with the API off");
    }
    let selected: Vec<RealScenario> = scenarios(upstream, restart.is_some(), haproxy)
        .into_iter()
        .filter(|s| only.is_empty() || only.contains(&s.disruption.to_string()))
        .filter(|s| {
            client_ca.is_some() || s.disruption != Disruption::Descheduler { background: true }
        })
        .collect();
    let selected = match shuffle {
        Some(seed) => {
            let rows = shuffled(selected, seed);
            let names: Vec<String> = rows
                .iter()
                .map(|s| format!("{}/{}", s.disruption, s.protection))
                .collect();
            eprintln!("rows shuffled with seed {seed}: {}", names.join(" "));
            rows
        }
        None => selected,
    };
    for scenario in selected {
        if scenario.protection == Protection::GracefulDrain && components.is_none() {
            let started = async {
                apply_chart_rbac(&cluster).await?;
                // Before the agents start, so their bridge finds the seed group served.
                if !upstream {
                    apply_manifests(&cluster, SEED_GROUP_MANIFESTS, "deploy/seed-group.yaml")
                        .await?;
                }
                Components::start(&cluster, &cfg.components).await
            };
            components = Some(
                started
                    .await
                    .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
            );
        }
        let result = match (&mut components, scenario.disruption) {
            (Some(Err(e)), _) => Err(format!("graceful-drain did not start: {e}")),
            (Some(Ok(c)), Disruption::Descheduler { background: true }) => {
                let namespace = format!("{}-{}", scenario.disruption, scenario.protection);
                match client_ca.as_deref() {
                    Some(ca) => drainers::authenticated_row(&cluster, cfg, c, ca, namespace)
                        .await
                        .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
                    None => Err("kube-apiserver presents no client certificate here".into()),
                }
            }
            (Some(Ok(c)), Disruption::ForgedTransport) => super::hostile::row(&cluster, cfg, c)
                .await
                .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
            (Some(Ok(c)), Disruption::Forged(target)) => forged::row(&cluster, cfg, c, target)
                .await
                .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
            (Some(Ok(c)), Disruption::StatefulSetLongDelay) => {
                statefulset_long_delay(&cluster, cfg, c)
                    .await
                    .map_err(|e| graceful_drain_core::error::chain(&e).to_string())
            }
            (
                Some(Ok(_)),
                fault @ (Disruption::ApiServerRestartDrain
                | Disruption::ControllerManagerRestartRollout),
            ) => match &restart {
                Some(restart) => restart_mid_row(&cluster, cfg, fault, restart.clone())
                    .await
                    .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
                None => Err("no control plane of our own to restart".to_string()),
            },
            (
                Some(Ok(c)),
                confirmed @ (Disruption::LbConfirmedDrain | Disruption::LbConfirmedRollout),
            ) => lb_confirmed(&cluster, cfg, c, confirmed)
                .await
                .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
            (Some(Ok(c)), Disruption::WebhookKillDrain) => webhook_kill_drain(&cluster, cfg, c)
                .await
                .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
            (Some(Ok(c)), Disruption::UninstallMidDrain) => uninstall_mid_drain(&cluster, cfg, c)
                .await
                .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
            (_, Disruption::Karpenter(disruption)) => {
                // The protected row's time bound starts from the unprotected one's.
                let unprotected = rows
                    .iter()
                    .find(|r: &&RealRow| {
                        r.scenario.disruption == scenario.disruption
                            && r.scenario.protection == Protection::None
                    })
                    .and_then(|r| r.result.as_ref().ok())
                    .map(|m| m.duration);
                karpenter::row(&cluster, cfg, disruption, scenario.protection, unprotected)
                    .await
                    .map_err(|e| graceful_drain_core::error::chain(&e).to_string())
            }
            _ => run_row(&cluster, cfg, scenario)
                .await
                .map_err(|e| graceful_drain_core::error::chain(&e).to_string()),
        };
        let row = RealRow { scenario, result };
        progress(&row);
        rows.push(row);
    }
    if let Some(Ok(mut c)) = components {
        c.remove_configurations(&cluster).await?;
        c.check().await?;
    }
    if let Some(dir) = balancer_dir
        && !rows.iter().all(RealRow::as_expected)
    {
        eprintln!(
            "HAProxy's and CoreDNS's files and logs kept in {}",
            dir.keep().display()
        );
    }
    Ok(rows)
}

async fn run_row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    s: RealScenario,
) -> Result<Measured, Error> {
    if let Disruption::Descheduler { background } = s.disruption {
        let namespace = format!("{}-{}", s.disruption, s.protection);
        return drainers::descheduler_row(cluster, cfg, namespace, background, s.protection).await;
    }
    let mut cfg = cfg.clone();
    cfg.web.namespace = format!("{}-{}", s.disruption, s.protection);
    if s.disruption == Disruption::DrainHaProxyRetries
        && let Some(real) = cfg.balancer.as_mut()
    {
        real.retries = true;
    }
    if s.disruption == Disruption::KubectlDrain {
        // A budget the drained node's pods fit in at once: the row measures the drainer
        // against the delay, not kubectl's 5 s pause after a budget's refusal.
        cfg.web.min_available = cfg.web.replicas / 2;
    }
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    match s.disruption {
        Disruption::StatefulSetDrain => {
            super::workloads::deploy(
                cluster,
                &cfg.web,
                cfg.phase_timeout,
                super::spec::Workload::StatefulSet,
            )
            .await?;
        }
        _ => cluster.deploy_web(&cfg.web, cfg.phase_timeout).await?,
    }
    let client = cluster.client();
    let timeout = cfg.phase_timeout;
    let outcome = match s.disruption {
        Disruption::Drain | Disruption::DrainHaProxyRetries | Disruption::StatefulSetDrain => {
            let node = busiest_node(cluster, &cfg.web).await?;
            let drain = async {
                cluster.step(format!("drain node {node}"));
                match s.protection {
                    Protection::None => actions::plain_drain(&client, &node, timeout).await,
                    // The drain row runs what the README tells users: `kubectl apply` of
                    // the example LifecycleEvent.
                    Protection::GracefulDrain if s.disruption == Disruption::Drain => {
                        let kubeconfig = cluster.kubeconfig();
                        let group = actions::OUR_EVENTS;
                        actions::kubectl_apply_drain(kubeconfig, &client, &node, group, timeout)
                            .await
                    }
                    Protection::GracefulDrain => {
                        actions::lifecycle_drain(&client, &node, timeout).await
                    }
                }
            };
            let measured = measure(cluster, &cfg, drain).await;
            uncordon(cluster, &node, s.protection, timeout).await?;
            measured
        }
        Disruption::KubectlDrain => {
            let node = busiest_node(cluster, &cfg.web).await?;
            let drain = async {
                cluster.step(format!("kubectl drain {node}"));
                actions::kubectl_drain(cluster.kubeconfig(), &node, timeout).await
            };
            let measured = measure(cluster, &cfg, drain).await;
            uncordon(cluster, &node, s.protection, timeout).await?;
            let measured = measured?;
            let bound =
                cfg.components.deregistration_delay + cfg.cluster.kubelet.exit_after_sigterm;
            let summary = drainers::against_bound("kubectl drain", measured.duration, bound);
            cluster.step(summary);
            if s.protection == Protection::GracefulDrain {
                drainers::within_bound("kubectl drain", measured.duration, bound)?;
            }
            Ok(measured)
        }
        Disruption::SeedGroupDrain => {
            let node = busiest_node(cluster, &cfg.web).await?;
            let drain = async {
                cluster.step(format!(
                    "kubectl apply a lifecycle.k8s.io LifecycleEvent for {node}"
                ));
                let kubeconfig = cluster.kubeconfig();
                let group = actions::SEED_EVENTS;
                actions::kubectl_apply_drain(kubeconfig, &client, &node, group, timeout).await
            };
            let measured = measure(cluster, &cfg, drain).await;
            uncordon(cluster, &node, s.protection, timeout).await?;
            measured
        }
        Disruption::RolloutRestart => {
            let rollout = async {
                cluster.step("rollout restart");
                actions::rollout(&client, &cfg.web, timeout).await
            };
            measure(cluster, &cfg, rollout).await
        }
        Disruption::RecreateRollout => {
            super::workloads::set_recreate(&client, &cfg.web).await?;
            let rollout = async {
                cluster.step("rollout restart (Recreate)");
                let overlap = super::workloads::never_together(&client, &cfg.web.namespace);
                tokio::select! {
                    done = actions::rollout(&client, &cfg.web, timeout) => done,
                    seen = overlap => Err(seen),
                }
            };
            measure(cluster, &cfg, rollout).await
        }
        // Answered above, before the standard workload.
        Disruption::Descheduler { .. } | Disruption::Karpenter(_) => Err(Error::Component {
            name: s.disruption.to_string(),
            reason: "runs through a drainer's own row (drainers, karpenter)".into(),
        }),
        // Need the running components (`forged::row`, `statefulset_long_delay`,
        // `uninstall_mid_drain`).
        Disruption::Forged(_)
        | Disruption::LbConfirmedDrain
        | Disruption::LbConfirmedRollout
        | Disruption::ForgedTransport
        | Disruption::StatefulSetLongDelay
        | Disruption::ApiServerRestartDrain
        | Disruption::ControllerManagerRestartRollout
        | Disruption::WebhookKillDrain
        | Disruption::UninstallMidDrain => Err(Error::Component {
            name: s.disruption.to_string(),
            reason: "runs only once graceful-drain's components have started".into(),
        }),
        Disruption::ScaleDownUp => {
            let scale = async {
                let half = (cfg.web.replicas / 2).max(1);
                cluster.step(format!("scale to {half}"));
                scale_and_wait(&client, &cfg.web, half, timeout).await?;
                cluster.step(format!("scale back to {}", cfg.web.replicas));
                scale_and_wait(&client, &cfg.web, cfg.web.replicas, timeout).await
            };
            measure(cluster, &cfg, scale).await
        }
    };
    // The next row starts from a quiet cluster whatever this one left behind.
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    outcome
}

/// The `lb-confirmed-drain` and `lb-confirmed-rollout` rows: a LifecycleEvent drain of
/// the busiest node, or a rollout restart, with the webhook's confirmed release asking the
/// row's HAProxy. Every pod the webhook isolated must have been let go when HAProxy no
/// longer routed to it (the webhook's `balancer_wait_seconds{ended="let_go"}`), except
/// one HAProxy had already dropped before the webhook first asked (`never_routed`: the
/// webhook then cannot tell it from an address HAProxy never knew, and keeps the whole
/// delay, as documented); at least one must be let go.
async fn lb_confirmed(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &mut Components,
    row: Disruption,
) -> Result<Measured, Error> {
    let mut cfg = cfg.clone();
    let Some(real) = cfg.balancer.as_mut() else {
        return Err(Error::Component {
            name: row.to_string(),
            reason: "runs behind HAProxy only (--load-balancer haproxy)".into(),
        });
    };
    real.confirm = true;
    cfg.web.namespace = format!("{row}-{}", Protection::GracefulDrain);
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    cluster.deploy_web(&cfg.web, cfg.phase_timeout).await?;
    let client = cluster.client();
    let node = match row {
        Disruption::LbConfirmedDrain => Some(busiest_node(cluster, &cfg.web).await?),
        _ => None,
    };
    let counts = async || {
        let isolated = components
            .webhook_metric("graceful_drain_webhook_pods_isolated_total")
            .await
            .unwrap_or(0.0);
        let ended = async |why: &str| {
            let sample =
                format!(r#"graceful_drain_webhook_balancer_wait_seconds_count{{ended="{why}"}}"#);
            components.webhook_metric(&sample).await.unwrap_or(0.0)
        };
        (isolated, ended("let_go").await, ended("never_routed").await)
    };
    let before = counts().await;
    let disruption = async {
        match &node {
            Some(node) => {
                cluster.step(format!("drain node {node}, releases confirmed by HAProxy"));
                actions::lifecycle_drain(&client, node, cfg.phase_timeout).await
            }
            None => {
                cluster.step("rollout restart, releases confirmed by HAProxy");
                actions::rollout(&client, &cfg.web, cfg.phase_timeout).await
            }
        }
    };
    let measured = measure(cluster, &cfg, disruption).await;
    let after = counts().await;
    if let Some(node) = &node {
        uncordon(cluster, node, Protection::GracefulDrain, cfg.phase_timeout).await?;
    }
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    let measured = measured?;
    let isolated = after.0 - before.0;
    let (let_go, never_routed) = (after.1 - before.1, after.2 - before.2);
    let summary = format!(
        "{let_go} of {isolated} isolated pods let go when HAProxy no longer routed to them, {never_routed} dropped by HAProxy before the webhook first asked"
    );
    cluster.step(summary.clone());
    if let_go < 1.0 || let_go + never_routed < isolated {
        return Err(Error::Component {
            name: row.to_string(),
            reason: format!("{summary}; the others kept their whole delay"),
        });
    }
    Ok(measured)
}

/// The `statefulset-long-delay` row's deregistration delay: past the disruption
/// controller's `DeletionTimeout` (two minutes, pkg/controller/disruption/disruption.go).
const LONG_DELAY: Duration = Duration::from_secs(150);

/// Two StatefulSet members in turn with a delay over two minutes, on the real
/// kube-controller-manager's disruption controller: the first member's eviction is
/// refused while it deregisters (isolated, held, still selected by the PDB on the
/// StatefulSet's key); the second's is retried every second as a drain does and must be
/// refused until the first is gone, and at no moment may fewer than `minAvailable` pods
/// serve. The row ends when the second member is let go.
async fn statefulset_long_delay(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &mut Components,
) -> Result<Measured, Error> {
    let usual = cfg.components.clone();
    let mut cfg = cfg.clone();
    cfg.web.namespace = "statefulset-long-delay-graceful-drain".to_string();
    cfg.components.deregistration_delay = LONG_DELAY;
    // Traffic stays bounded, by the longer row.
    cfg.traffic.max_duration += LONG_DELAY;
    cfg.traffic.max_requests += (cfg.traffic.rate * LONG_DELAY.as_secs_f64()) as u64;
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    super::workloads::deploy(
        cluster,
        &cfg.web,
        cfg.phase_timeout,
        super::spec::Workload::StatefulSet,
    )
    .await?;
    components.roll_webhook(cluster, &cfg.components).await?;
    let client = cluster.client();
    // Each refusal must come back to the row, not be retried inside the client.
    let evictor = cluster.client_without_retries()?;
    let ns = cfg.web.namespace.clone();
    let (first, second) = (format!("{}-0", cfg.web.name), format!("{}-1", cfg.web.name));
    let within = LONG_DELAY + cfg.phase_timeout;
    let turns = async {
        cluster.step(format!(
            "evict {first}, retry {second} every second; delay {}",
            humantime::format_duration(LONG_DELAY)
        ));
        tokio::select! {
            done = evict_in_turn(&evictor, &ns, &first, &second, within) => done,
            seen = below_min_available(&client, &ns, cfg.web.min_available) => Err(seen),
        }
    };
    let measured = measure(cluster, &cfg, turns).await;
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    // Later rows run with the usual delay and every node schedulable again.
    components.roll_webhook(cluster, &usual).await?;
    uncordon_all(&client).await?;
    measured
}

/// Makes every cordoned Node schedulable again.
async fn uncordon_all(client: &kube::Client) -> Result<(), Error> {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api("list", "nodes".to_string()))?;
    for node in nodes.items {
        if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
            actions::cordon(client, &node.name_any(), false).await?;
        }
    }
    Ok(())
}

/// Evicts `first`, which must be refused while it deregisters, then retries `second`
/// every second until it is let go (isolated or evicted); fails if that happens while
/// `first` is still there, or if nothing happens `within`.
async fn evict_in_turn(
    client: &kube::Client,
    ns: &str,
    first: &str,
    second: &str,
    within: Duration,
) -> Result<(), Error> {
    use kube::api::PostParams;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let failed = |reason: String| Error::Drain {
        node: "-".into(),
        reason,
    };
    let evict = |name: &str| {
        let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns}});
        let pods = pods.clone();
        let name = name.to_string();
        async move {
            let answer: kube::Result<serde_json::Value> = pods
                .create_subresource("eviction", &name, &PostParams::default(), &body)
                .await;
            answer
        }
    };
    let held = pods
        .get(first)
        .await
        .map_err(api("get", format!("pod {ns}/{first}")))?;
    // A drain cordons the node first and retries every eviction (kubectl every 5 s, here
    // every second): once the first member is due, its retry finds the webhook removing it
    // (its PDB counted it at isolation, so the API server's own eviction would be refused)
    // and is answered 404. A cordon alone confirms nothing, so without that retry the
    // member would be put back at its restore time.
    let node = held
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .ok_or_else(|| failed(format!("{ns}/{first} is not scheduled")))?;
    actions::cordon(client, &node, true)
        .await
        .map_err(|e| failed(format!("cordon {node}: {e}")))?;
    let answer = evict(first).await;
    if !is_deregistering(&answer) {
        return Err(failed(format!(
            "eviction of {ns}/{first} answered {answer:?}, not refused while it deregisters"
        )));
    }
    let started = std::time::Instant::now();
    let mut refused = 0_u32;
    loop {
        let still = pods
            .get_opt(first)
            .await
            .map_err(api("get", format!("pod {ns}/{first}")))?
            .is_some_and(|p| {
                p.metadata.uid == held.metadata.uid && p.metadata.deletion_timestamp.is_none()
            });
        if still {
            // The drain's retry of the first member: refused while it deregisters, then
            // held until it is gone (404), or allowed.
            match evict(first).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 429 || s.code == 404 => {}
                other => {
                    return Err(failed(format!("eviction of {ns}/{first}: {other:?}")));
                }
            }
        }
        let answer = evict(second).await;
        let let_go = answer.is_ok() || is_deregistering(&answer);
        match (let_go, still) {
            (true, true) => {
                return Err(failed(format!(
                    "{ns}/{second} was let go while {first} was still held, {:?} after its isolation (refused {refused} times before)",
                    started.elapsed()
                )));
            }
            (true, false) => {
                eprintln!(
                    "  {second} let go {:?} after {first}'s isolation, refused {refused} times before",
                    started.elapsed()
                );
                return Ok(());
            }
            (false, _) => match &answer {
                Err(kube::Error::Api(s)) if s.code == 429 => refused += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                other => {
                    return Err(failed(format!("eviction of {ns}/{second}: {other:?}")));
                }
            },
        }
        if started.elapsed() > within {
            return Err(failed(format!(
                "{ns}/{second} was never let go within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether `answer` is the webhook's 429 for a pod leaving its load balancers.
fn is_deregistering(answer: &kube::Result<serde_json::Value>) -> bool {
    matches!(answer, Err(kube::Error::Api(s)) if s.code == 429
        && s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == graceful_drain_core::labels::DEREGISTERING_CAUSE)))
}

/// Returns once fewer than `min` pods of `namespace` serve (ready, not being deleted, not
/// isolated), as the failure it is.
async fn below_min_available(client: &kube::Client, namespace: &str, min: i32) -> Error {
    // Sampling period: far shorter than a pod's start (500 ms) or its exit (1 s).
    const SAMPLE: Duration = Duration::from_millis(100);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            let serving: Vec<String> = list
                .items
                .iter()
                .filter(|p| kube_sim::controllers::pod_ready(p))
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    !p.labels()
                        .contains_key(graceful_drain_core::labels::DRAINING_LABEL)
                })
                .map(|p| p.name_any())
                .collect();
            if i32::try_from(serving.len()).unwrap_or(i32::MAX) < min {
                return Error::Drain {
                    node: "-".into(),
                    reason: format!(
                        "only {serving:?} served in {namespace}, below the PDB's minAvailable {min}"
                    ),
                };
            }
        }
        tokio::time::sleep(SAMPLE).await;
    }
}

/// Waits until a pod of `pods` is isolated (carries the draining label): the moment the
/// fault rows strike.
async fn first_isolation(pods: &Api<Pod>, timeout: Duration) -> Result<(), Error> {
    let isolated = ListParams::default().labels(graceful_drain_core::labels::DRAINING_LABEL);
    wait_for("a pod isolated", timeout, || async {
        pods.list_metadata(&isolated)
            .await
            .is_ok_and(|l| !l.items.is_empty())
    })
    .await?;
    Ok(())
}

/// A drain (kube-apiserver restarted) or a rollout restart (kube-controller-manager
/// restarted) with graceful-drain: the component is restarted once the first pod of the
/// row is isolated, and the drain or rollout must still finish with no 5xx.
async fn restart_mid_row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    fault: Disruption,
    restart: Restart,
) -> Result<Measured, Error> {
    let mut cfg = cfg.clone();
    cfg.web.namespace = format!("{fault}-graceful-drain");
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    cluster.deploy_web(&cfg.web, cfg.phase_timeout).await?;
    let client = cluster.client();
    let timeout = cfg.phase_timeout;
    let component = match fault {
        Disruption::ApiServerRestartDrain => "kube-apiserver",
        _ => "kube-controller-manager",
    };
    let pods = Api::<Pod>::namespaced(client.clone(), &cfg.web.namespace);
    let node = busiest_node(cluster, &cfg.web).await?;
    let row = async {
        let disruption = async {
            if fault == Disruption::ApiServerRestartDrain {
                cluster.step(format!("LifecycleEvent drain of {node}"));
                actions::lifecycle_drain(&client, &node, timeout * 2).await
            } else {
                cluster.step("rollout restart");
                actions::rollout(&client, &cfg.web, timeout * 2).await
            }
        };
        let fault_at_first_isolation = async {
            first_isolation(&pods, timeout).await?;
            cluster.step(format!("restart {component}"));
            let restarted = tokio::task::spawn_blocking(move || restart(component))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            restarted.map_err(|reason| Error::Component {
                name: component.into(),
                reason,
            })?;
            cluster.step(format!("{component} back"));
            Ok::<(), Error>(())
        };
        let (done, restarted) = tokio::join!(disruption, fault_at_first_isolation);
        restarted?;
        done
    };
    let measured = measure(cluster, &cfg, row).await;
    if fault == Disruption::ApiServerRestartDrain {
        uncordon(cluster, &node, Protection::GracefulDrain, timeout).await?;
    }
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    measured
}

/// A LifecycleEvent drain while a webhook replica's process is killed (see
/// [`Disruption::WebhookKillDrain`]): two replicas serve behind one address, as the
/// chart's two behind their Service; the one that holds the Lease dies at the first
/// isolation, and the other serves on, waits out the dead one's Lease, then deletes or
/// restores what it left. The drain must finish with no 5xx, and no pod may stay isolated
/// afterwards.
async fn webhook_kill_drain(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &mut Components,
) -> Result<Measured, Error> {
    let mut cfg = cfg.clone();
    cfg.web.namespace = "webhook-kill-drain-graceful-drain".to_string();
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    cluster.deploy_web(&cfg.web, cfg.phase_timeout).await?;
    cluster.step("two webhook replicas, the Lease holder in a process of its own");
    let holder = components
        .two_replicas_one_a_process(cluster, &cfg.components)
        .await?;
    let client = cluster.client();
    let timeout = cfg.phase_timeout;
    let pods = Api::<Pod>::namespaced(client.clone(), &cfg.web.namespace);
    let isolated = ListParams::default().labels(graceful_drain_core::labels::DRAINING_LABEL);
    let node = busiest_node(cluster, &cfg.web).await?;
    let row = async {
        let drain = async {
            cluster.step(format!("LifecycleEvent drain of {node}"));
            actions::lifecycle_drain(&client, &node, timeout * 2).await
        };
        let kill_at_first_isolation = async {
            first_isolation(&pods, timeout).await?;
            cluster.step(format!(
                "kill -9 the webhook replica {holder}, holding the Lease"
            ));
            components.kill_webhook_process().await?;
            Ok::<(), Error>(())
        };
        let (done, killed) = tokio::join!(drain, kill_at_first_isolation);
        killed?;
        done?;
        // Nothing the dead replica isolated is left: the drain's retried evictions removed
        // its pods, or the replica beside it deletes or restores them once it holds the
        // Lease, which it must take once the dead one's expires (15 s).
        wait_for("no pod left isolated", timeout * 2, || async {
            pods.list_metadata(&isolated)
                .await
                .is_ok_and(|l| l.items.is_empty())
        })
        .await?;
        wait_for(
            "the surviving replica holding the deleter Lease",
            timeout,
            || async {
                super::components::deleter_lease_holder(&client)
                    .await
                    .is_some_and(|h| h != holder)
            },
        )
        .await?;
        cluster.step("the surviving replica holds the Lease");
        Ok::<(), Error>(())
    };
    let measured = measure(cluster, &cfg, row).await;
    uncordon(cluster, &node, Protection::GracefulDrain, timeout).await?;
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    measured
}

/// The webhook's Deployment as the chart names it (`--deployment`).
const WEBHOOK_DEPLOYMENT: &str = "graceful-drain-webhook";

/// `helm uninstall` in the middle of a drain, on the real API server with its real RBAC
/// and token checks: a replica that knows its Deployment starts (a rolling update hands
/// it the Lease), a `kubectl drain` gets pods isolated, then Helm's deletions come in
/// Helm's order (webhook configurations, the Deployment, bindings, roles, the
/// ServiceAccount) and the replica stops. It must delete or restore every pod it isolated
/// with the rights the chart's finalizers keep for it, then release them.
async fn uninstall_mid_drain(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &mut Components,
) -> Result<Measured, Error> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let ns = super::components::NAMESPACE;
    let mut cfg = cfg.clone();
    cfg.web.namespace = "uninstall-mid-drain-graceful-drain".to_string();
    // A long delay, so the pods are still isolated when the uninstall comes.
    cfg.components.deregistration_delay = cfg.phase_timeout;
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    cluster.deploy_web(&cfg.web, cfg.phase_timeout).await?;
    let client = cluster.client();
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": WEBHOOK_DEPLOYMENT, "namespace": ns},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": WEBHOOK_DEPLOYMENT}},
                 "template": {"metadata": {"labels": {"app": WEBHOOK_DEPLOYMENT}},
                              "spec": {"containers": [{"name": "webhook", "image": "graceful-drain"}]}}}
    }))
    .map_err(|e| Error::Component {
        name: "uninstall".into(),
        reason: e.to_string(),
    })?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    deployments
        .create(&kube::api::PostParams::default(), &deployment)
        .await
        .map_err(api(
            "create",
            format!("deployment {ns}/{WEBHOOK_DEPLOYMENT}"),
        ))?;
    components.set_webhook_deployment(WEBHOOK_DEPLOYMENT);
    components.roll_webhook(cluster, &cfg.components).await?;
    let node = busiest_node(cluster, &cfg.web).await?;
    let timeout = cfg.phase_timeout;
    let pods = Api::<Pod>::namespaced(client.clone(), &cfg.web.namespace);
    let isolated = ListParams::default().labels(graceful_drain_core::labels::DRAINING_LABEL);
    let uninstall = async {
        cluster.step(format!("kubectl drain {node}"));
        let drain = {
            let (client, node) = (client.clone(), node.clone());
            tokio::spawn(async move { actions::plain_drain(&client, &node, timeout * 3).await })
        };
        first_isolation(&pods, timeout).await?;
        cluster.step("helm uninstall");
        components.remove_configurations(cluster).await?;
        let dp = DeleteParams::default();
        let deleted = |what: &'static str, name: &str| api("delete", format!("{what} {name}"));
        deployments
            .delete(WEBHOOK_DEPLOYMENT, &dp)
            .await
            .map_err(deleted("deployment", WEBHOOK_DEPLOYMENT))?;
        // The chart marks the ClusterRole, Role and RoleBinding `helm.sh/resource-policy:
        // keep`: Helm leaves them (to the garbage collector, once the webhook let their
        // owners go) and deletes the rest.
        Api::<ClusterRoleBinding>::all(client.clone())
            .delete(WEBHOOK_DEPLOYMENT, &dp)
            .await
            .map_err(deleted("clusterrolebinding", WEBHOOK_DEPLOYMENT))?;
        Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .delete(WEBHOOK_DEPLOYMENT, &dp)
            .await
            .map_err(deleted("serviceaccount", WEBHOOK_DEPLOYMENT))?;
        // The kubelet stops the Deployment's pod: SIGTERM to the replica.
        components.stop_webhook().await?;
        let left: Vec<String> = pods
            .list_metadata(&isolated)
            .await
            .map_err(api(
                "list",
                format!("isolated pods in {}", cfg.web.namespace),
            ))?
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        if !left.is_empty() {
            return Err(Error::Component {
                name: "uninstall".into(),
                reason: format!("isolated pods left behind: {}", left.join(", ")),
            });
        }
        let leader = format!("{WEBHOOK_DEPLOYMENT}-leader-election");
        wait_for("the webhook's rights gone", timeout, || async {
            let gone = |found: kube::Result<bool>| matches!(found, Ok(false));
            let exists = |r: kube::Result<Option<()>>| r.map(|o| o.is_some());
            gone(exists(
                Api::<ClusterRoleBinding>::all(client.clone())
                    .get_opt(WEBHOOK_DEPLOYMENT)
                    .await
                    .map(|o| o.map(|_| ())),
            )) && gone(exists(
                Api::<ClusterRole>::all(client.clone())
                    .get_opt(WEBHOOK_DEPLOYMENT)
                    .await
                    .map(|o| o.map(|_| ())),
            )) && gone(exists(
                Api::<Role>::namespaced(client.clone(), ns)
                    .get_opt(&leader)
                    .await
                    .map(|o| o.map(|_| ())),
            )) && gone(exists(
                Api::<RoleBinding>::namespaced(client.clone(), ns)
                    .get_opt(&leader)
                    .await
                    .map(|o| o.map(|_| ())),
            )) && gone(exists(
                Api::<ServiceAccount>::namespaced(client.clone(), ns)
                    .get_opt(WEBHOOK_DEPLOYMENT)
                    .await
                    .map(|o| o.map(|_| ())),
            ))
        })
        .await?;
        cluster.step("drain finishes unprotected");
        drain.await.map_err(|e| Error::Component {
            name: "drain".into(),
            reason: e.to_string(),
        })?
    };
    let measured = measure(cluster, &cfg, uninstall).await;
    workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    measured
}

/// Returns a drained node to service: a LifecycleEvent of the maintenance transition with
/// protection (the agents cordoned it), a plain uncordon without.
async fn uncordon(
    cluster: &RealCluster,
    node: &str,
    protection: Protection,
    timeout: Duration,
) -> Result<(), Error> {
    let client = cluster.client();
    match protection {
        Protection::None => actions::cordon(&client, node, false).await,
        Protection::GracefulDrain => actions::lifecycle_uncordon(&client, node, timeout).await,
    }
}

/// Scales the Deployment to `replicas` and waits until it has exactly that many ready
/// pods in the namespace and its status agrees.
async fn scale_and_wait(
    client: &kube::Client,
    spec: &WebSpec,
    replicas: i32,
    timeout: Duration,
) -> Result<(), Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &spec.namespace);
    let object = format!("deployment {}", spec.service_key());
    let patch = serde_json::json!({"spec": {"replicas": replicas}});
    deployments
        .patch(&spec.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(api("scale", object.clone()))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &spec.namespace);
    let want = usize::try_from(replicas).unwrap_or(0);
    let what = format!("{object} at {replicas} ready replicas");
    wait_for(&what, timeout, || async {
        let complete = deployments
            .get(&spec.name)
            .await
            .ok()
            .is_some_and(|d| actions::rolled_out(&d, replicas));
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return false;
        };
        let ready = ready_live(&list.items);
        complete && list.items.len() == want && ready == want
    })
    .await
    .map_err(Error::Cluster)
}

/// Applies the chart's ServiceAccounts, Roles, ClusterRoles, their bindings, its
/// ValidatingAdmissionPolicies and FlowSchema as `deploy/graceful-drain.yaml` renders them
/// (server-side apply, [`super::shipped::access_objects`]), so the components' tokens get
/// exactly the chart's rights and every isolation and restore passes the chart's policies.
pub async fn apply_chart_rbac(cluster: &DataPlane) -> Result<(), Error> {
    cluster
        .ensure_namespace(super::components::NAMESPACE)
        .await?;
    let access = super::shipped::access_objects()?;
    apply_objects(cluster, &access, super::shipped::FILE).await
}

/// The chart's objects for `lifecycleCrds.seedGroup` (its CRDs and the agents'
/// ClusterRole with the bridge's rights), rendered by `.ci/checks/chart.sh --update`.
const SEED_GROUP_MANIFESTS: &str = include_str!("../../../../deploy/seed-group.yaml");

/// Applies every object of the manifest `yaml` (named `file` in errors) and, for
/// CustomResourceDefinitions, waits until they are Established.
async fn apply_manifests(cluster: &DataPlane, yaml: &str, file: &str) -> Result<(), Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let docs = super::shipped::parse(yaml, file)?;
    apply_objects(cluster, &docs, file).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
    {
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let established = || async {
            crds.get_opt(&name).await.ok().flatten().is_some_and(|c| {
                c.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
        };
        kube_sim::cluster::wait_for(&format!("crd {name} Established"), CRD_WAIT, established)
            .await
            .map_err(Error::Cluster)?;
    }
    Ok(())
}

/// How long a CRD may take to be Established.
const CRD_WAIT: Duration = Duration::from_secs(30);

/// Server-side applies `docs` (from `file`).
async fn apply_objects(
    cluster: &DataPlane,
    docs: &[serde_json::Value],
    file: &str,
) -> Result<(), Error> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let params = PatchParams::apply("graceful-drain-sim").force();
    for doc in docs {
        let object: DynamicObject =
            serde_json::from_value(doc.clone()).map_err(|e| Error::Component {
                name: "chart".into(),
                reason: format!("{file}: {e}"),
            })?;
        let Some(types) = object.types.clone() else {
            continue;
        };
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", &types.api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
        let name = object.name_any();
        let objects: Api<DynamicObject> = match object.metadata.namespace.as_deref() {
            Some(ns) => Api::namespaced_with(cluster.client(), ns, &resource),
            None => Api::all_with(cluster.client(), &resource),
        };
        objects
            .patch(&name, &params, &Patch::Apply(&object))
            .await
            .map_err(api("apply", format!("{} {name}", types.kind)))?;
    }
    Ok(())
}

fn api(action: &'static str, object: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api {
        action,
        object,
        source,
    }
}

/// Renders the real tier's table: the same columns as the matrix's, plus what is expected;
/// behind HAProxy, the 5xx HAProxy answered beside ours (`5xx-haproxy`).
pub fn table(rows: &[RealRow]) -> String {
    let haproxy = rows
        .iter()
        .any(|r| r.result.as_ref().is_ok_and(|m| m.haproxy.is_some()));
    let column = |text: &str| {
        if haproxy {
            format!(" {text:>11}")
        } else {
            String::new()
        }
    };
    let mut out = format!(
        "{:<34} {:<15} {:>9} {:>6}{} {:>10}  {}\n",
        "scenario",
        "protection",
        "requests",
        "5xx",
        column("5xx-haproxy"),
        "duration",
        "expected"
    );
    for r in rows {
        let expected = match r.scenario.expect {
            Expect::Pass => "pass".to_string(),
            Expect::KnownFailure(issue) => format!("known failure ({issue})"),
        };
        let mark = if r.as_expected() { "" } else { "  UNEXPECTED" };
        match &r.result {
            Ok(m) => {
                let counted = m
                    .haproxy
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |h| h.five_xx.to_string());
                out.push_str(&format!(
                    "{:<34} {:<15} {:>9} {:>6}{} {:>9.1}s  {expected}{mark}\n",
                    r.scenario.disruption.to_string(),
                    r.scenario.protection.to_string(),
                    m.requests,
                    m.errors_5xx,
                    column(&counted),
                    m.duration.as_secs_f64()
                ))
            }
            Err(e) => out.push_str(&format!(
                "{:<34} {:<15} error: {e}  [{expected}{mark}]\n",
                r.scenario.disruption.to_string(),
                r.scenario.protection.to_string(),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(rows: &[RealScenario]) -> Vec<String> {
        rows.iter()
            .map(|s| format!("{}/{}", s.disruption, s.protection))
            .collect()
    }

    #[test]
    fn a_shuffle_keeps_the_phases_and_every_row() {
        let rows = scenarios(false, true, true);
        let mut orders = std::collections::BTreeSet::new();
        for seed in 0..8 {
            let order = shuffled(rows.clone(), seed);
            assert_eq!(order.len(), rows.len());
            let first_protected = order
                .iter()
                .position(|s| s.protection == Protection::GracefulDrain)
                .unwrap();
            assert!(
                order[first_protected..]
                    .iter()
                    .all(|s| s.protection == Protection::GracefulDrain),
                "{:?}",
                names(&order)
            );
            assert_eq!(
                order.last().unwrap().disruption,
                Disruption::UninstallMidDrain
            );
            let mut sorted = names(&order);
            sorted.sort();
            let mut expected = names(&rows);
            expected.sort();
            assert_eq!(sorted, expected);
            // The same seed, the same order: a failing order can be run again.
            assert_eq!(names(&shuffled(rows.clone(), seed)), names(&order));
            orders.insert(names(&order));
        }
        assert!(orders.len() > 1, "the seed changes nothing");
    }
}
