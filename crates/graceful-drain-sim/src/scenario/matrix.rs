//! `graceful-drain simulate --matrix`: the scoreboard. Named scenarios, each run on two
//! fresh clusters side by side — without protection (plain evictions and deletions, what
//! `kubectl drain` and the Deployment controller do alone) and with graceful-drain's real
//! webhook and node agents — and one table: requests, 5xx, pods deleted unprotected,
//! duration and the lower bound of the disruption.
//!
//! "Deleted unprotected" counts pods whose app stopped accepting new requests while the
//! load balancer still routed new requests to them (no deregistration between its last
//! registration and that moment), read from the cluster's timeline. Each scenario states
//! what it expects; a row that differs (a protected row with a 5xx or an unprotected
//! deletion it does not expect, an unprotected row without the 5xx it should show, an
//! error) is flagged, and [`Report::passed`] is false, so CI fails on it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::components::Components;
use super::spec::{
    Budget, Disruption, Outcome, Scenario, Workload, no_tweak, set_budget, unprotected_deletions,
};
use super::{
    Error, Measured, Protection, ScenarioConfig, actions, busiest_node, measure, tiered, workloads,
};
use graceful_drain_core::labels::DRAINING_LABEL;
use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{Access, DataPlane, wait_for};
use kube_sim::traffic::timeline::Event;

/// Every scenario of `--matrix`, in table order.
pub fn scenarios() -> Vec<Scenario> {
    let mut all = workload_scenarios();
    all.extend(super::lb_scenarios::scenarios());
    all
}

/// The scenarios of the standard Deployment behind an ALB-like load balancer.
fn workload_scenarios() -> Vec<Scenario> {
    let s = Scenario::new;
    vec![
        s(
            "deployment-drain",
            "drain the busiest node of a Deployment behind an ALB-like load balancer (PDB minAvailable = replicas - 1)",
            Disruption::Drain,
            Budget::Default,
            no_tweak,
        ),
        s(
            "deployment-rollout",
            "rollout restart of the Deployment (maxSurge 25%, maxUnavailable 25%)",
            Disruption::Rollout,
            Budget::Default,
            no_tweak,
        ),
        s(
            "pdb-max-unavailable-drain",
            "drain with a PDB of maxUnavailable: 1",
            Disruption::Drain,
            Budget::MaxUnavailable(IntOrString::Int(1)),
            no_tweak,
        ),
        s(
            "pdb-percent-drain",
            "drain with a PDB of minAvailable: 50%",
            Disruption::Drain,
            Budget::MinAvailable(IntOrString::String("50%".into())),
            no_tweak,
        ),
        s(
            "no-pdb-drain",
            "drain with no PDB: every pod of the node is evicted at once",
            Disruption::Drain,
            Budget::None,
            no_tweak,
        ),
        s(
            "pdb-full-rollout",
            "rollout under a PDB with no disruption to spare (minAvailable = replicas): PDBs never block the ReplicaSet's DELETEs",
            Disruption::Rollout,
            Budget::AllReplicas,
            no_tweak,
        ),
        Scenario {
            workload: Workload::DeploymentRecreate,
            protected_5xx: true,
            ..s(
                "recreate-rollout",
                "rollout restart of a Recreate Deployment: old and new pods never serve together (checked every 100 ms), so not protected (Warning Event): 5xx expected",
                Disruption::Rollout,
                Budget::Default,
                no_tweak,
            )
        },
        s(
            "two-nodes-drain",
            "the two busiest nodes drained at the same time, sharing one PDB",
            Disruption::DrainTwoNodes,
            Budget::MaxUnavailable(IntOrString::Int(2)),
            |cfg| cfg.cluster.nodes = 4,
        ),
        s(
            "api-throttled-drain",
            "drain while the API server answers 10% of requests 429 with Retry-After (API Priority and Fairness)",
            Disruption::Drain,
            Budget::Default,
            |cfg| cfg.cluster.api.faults.throttle_share = 0.1,
        ),
        s(
            "agent-restart-drain",
            "the node agent is restarted while the webhook holds the drained pods (without protection: a plain drain)",
            Disruption::DrainRestartingAgent,
            Budget::Default,
            no_tweak,
        ),
        s(
            "webhook-rollout-drain",
            "the webhook's Deployment is rolled (new replica, Lease handed over) while it holds the drained pods",
            Disruption::DrainRollingWebhook,
            Budget::Default,
            no_tweak,
        ),
        s(
            "grace-zero-drain",
            "drain of pods with terminationGracePeriodSeconds: 0 (killed at once when deleted)",
            Disruption::Drain,
            Budget::Default,
            |cfg| cfg.web.grace_period_seconds = 0,
        ),
        Scenario {
            workload: Workload::StatefulSet,
            ..s(
                "statefulset-drain",
                "drain of a StatefulSet whose Service selects a key of its own: pods leave the Service, never their StatefulSet",
                Disruption::Drain,
                Budget::Default,
                no_tweak,
            )
        },
        Scenario {
            workload: Workload::StatefulSet,
            ..s(
                "statefulset-rollout",
                "rolling update of that StatefulSet: each DELETE is held while the pod leaves the Service",
                Disruption::Rollout,
                Budget::Default,
                no_tweak,
            )
        },
        Scenario {
            workload: Workload::StatefulSetSharedSelector,
            protected_5xx: true,
            ..s(
                "statefulset-shared-selector-drain",
                "StatefulSet whose Service selects only the StatefulSet's own key: not released, so unprotected (Warning Event names the Service): 5xx expected",
                Disruption::Drain,
                Budget::Default,
                no_tweak,
            )
        },
        Scenario {
            workload: Workload::DaemonSet,
            unprotected_5xx: false,
            ..s(
                "daemonset-drain",
                "drain of a node running a DaemonSet's serving pod: like kubectl drain --ignore-daemonsets, it stays and serves",
                Disruption::Drain,
                Budget::None,
                no_tweak,
            )
        },
        Scenario {
            workload: Workload::DeploymentWithJob,
            ..s(
                "job-drain",
                "drain while a Job (podFailurePolicy: Ignore on DisruptionTarget) runs on every node: it completes with no counted failure",
                Disruption::Drain,
                Budget::Default,
                no_tweak,
            )
        },
        Scenario {
            workload: Workload::DaemonSet,
            ..s(
                "daemonset-rollout",
                "rolling update of a DaemonSet (maxUnavailable 1) whose Service selects a key of its own",
                Disruption::Rollout,
                Budget::None,
                no_tweak,
            )
        },
        s(
            "vm-evacuation-drain",
            "drain of a node that also hosts VMs: maintenance hooks move them away before any eviction and enable the node after uncordon (without protection they are stranded)",
            Disruption::DrainWithVms,
            Budget::Default,
            no_tweak,
        ),
        Scenario {
            workload: Workload::DeploymentWithTiers,
            ..s(
                "tiered-drain",
                "drain of a node whose web pods go first, then a system-critical DNS-like pod, then an ingress-like pod picked by --last-pod-selector: each tier gone before the next is evicted",
                Disruption::Drain,
                Budget::Default,
                no_tweak,
            )
        },
        Scenario {
            protected_5xx: true,
            ..s(
                "lag-beyond-delay-drain",
                "the load balancer keeps routing for 7 s, longer than the 4 s delay: 5xx expected with protection too",
                Disruption::Drain,
                Budget::Default,
                |cfg| cfg.cluster.lb.deregistration_lag = Duration::from_secs(7),
            )
        },
    ]
}

/// One row of the matrix.
#[derive(Debug)]
pub struct Row {
    /// The scenario's name (see [`find`]).
    pub scenario: &'static str,
    /// Whether graceful-drain ran.
    pub protection: Protection,
    /// The figures, or why the run failed (the error with its causes).
    pub result: Result<Measured, String>,
    /// Pods whose app stopped accepting while the load balancer still routed to them.
    pub unprotected: usize,
    /// The shortest the disruption could have taken ([`lower_bound`], adjusted for the
    /// scenario's workload), to compare with the measured duration.
    pub lower_bound: Duration,
    /// Why the row differs from what its scenario expects, if it does.
    pub unexpected: Option<String>,
    /// What the scenario checked beyond requests, shown in the check column.
    pub note: Option<String>,
    /// The cluster's events from the disruption on, also for a run that failed.
    pub timeline: Vec<Event>,
}

/// The rows of a matrix run.
#[derive(Debug, Default)]
pub struct Report {
    /// Two rows per scenario, without then with graceful-drain, in the order run.
    pub rows: Vec<Row>,
}

impl Report {
    /// Every row as its scenario expects.
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.unexpected.is_none())
    }
}

/// Runs `selected` (all scenarios when empty), each without and with graceful-drain on
/// two clusters side by side, one scenario after the other.
pub async fn run(
    base: &ScenarioConfig,
    selected: &[Scenario],
    shutdown: &Shutdown,
    progress: impl Fn(&Row),
) -> Report {
    let mut report = Report::default();
    for scenario in selected {
        let mut cfg = base.clone();
        (scenario.tweak)(&mut cfg);
        let (without, with) = tokio::join!(
            run_one(&cfg, scenario, Protection::None, shutdown),
            run_one(&cfg, scenario, Protection::GracefulDrain, shutdown)
        );
        for row in [without, with] {
            progress(&row);
            report.rows.push(row);
        }
    }
    report
}

/// Why `scenario` cannot run on a real control plane, if it cannot: its tweak injects a
/// fault only the simulated API server has (429s from API Priority and Fairness on demand).
pub fn simulator_only(base: &ScenarioConfig, scenario: &Scenario) -> Option<&'static str> {
    let mut cfg = base.clone();
    (scenario.tweak)(&mut cfg);
    (cfg.cluster.api.faults != base.cluster.api.faults)
        .then_some("its fault is injected by the simulated API server")
}

/// A fresh real control plane for one row: its admin kubeconfig, and what keeps it running
/// until dropped.
pub type Plane = (std::path::PathBuf, Box<dyn std::any::Any + Send>);

/// `--matrix --real`: runs `selected` on real control planes, each row (a scenario without,
/// then with graceful-drain) on a fresh one from `fresh`, with the simulated data plane
/// (kubelets, load balancers, traffic) attached to it; the same columns and expectations as
/// on the simulated cluster. Scenarios that need the simulated API server
/// ([`simulator_only`]) are left out and named on stderr.
pub async fn run_real<F, Fut>(
    base: &ScenarioConfig,
    selected: &[Scenario],
    mut fresh: F,
    shutdown: &Shutdown,
    progress: impl Fn(&Row),
) -> Report
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Plane, String>>,
{
    let mut report = Report::default();
    for scenario in selected {
        if let Some(why) = simulator_only(base, scenario) {
            eprintln!("{}: not run on a real control plane, {why}", scenario.name);
            continue;
        }
        let mut cfg = base.clone();
        (scenario.tweak)(&mut cfg);
        for protection in [Protection::None, Protection::GracefulDrain] {
            let (outcome, timeline) = match fresh().await {
                Ok((kubeconfig, plane)) => {
                    let ran = run_on_plane(&cfg, scenario, protection, &kubeconfig, shutdown);
                    let ran = ran.await;
                    drop(plane);
                    ran
                }
                Err(why) => (
                    Err(Error::Component {
                        name: "control plane".into(),
                        reason: why,
                    }),
                    Vec::new(),
                ),
            };
            let row = to_row(&cfg, scenario, protection, outcome, timeline);
            progress(&row);
            report.rows.push(row);
        }
    }
    report
}

/// One row of [`run_real`] on the control plane of `kubeconfig`.
async fn run_on_plane(
    cfg: &ScenarioConfig,
    scenario: &Scenario,
    protection: Protection,
    kubeconfig: &std::path::Path,
    shutdown: &Shutdown,
) -> (Result<Outcome, Error>, Vec<Event>) {
    let cluster =
        match crate::setup::attach(cfg.cluster.clone(), kubeconfig, shutdown.clone()).await {
            Ok(cluster) => cluster,
            Err(e) => return (Err(e.into()), Vec::new()),
        };
    if protection == Protection::GracefulDrain
        && let Err(e) = super::real::apply_chart_rbac(&cluster).await
    {
        return (Err(e), Vec::new());
    }
    disrupt_timed(&cluster, cfg, scenario, protection).await
}

/// Looks a scenario up by name.
pub fn find(name: &str) -> Option<Scenario> {
    scenarios().into_iter().find(|s| s.name == name)
}

async fn run_one(
    cfg: &ScenarioConfig,
    scenario: &Scenario,
    protection: Protection,
    shutdown: &Shutdown,
) -> Row {
    let (outcome, timeline) = run_disruption(cfg, scenario, protection, shutdown).await;
    to_row(cfg, scenario, protection, outcome, timeline)
}

/// The row of one run of `scenario`, judged against what the scenario expects.
fn to_row(
    cfg: &ScenarioConfig,
    scenario: &Scenario,
    protection: Protection,
    outcome: Result<Outcome, Error>,
    timeline: Vec<Event>,
) -> Row {
    let lower_bound = match (scenario.workload, scenario.disruption) {
        // A drain evicts no DaemonSet pod: nothing to wait for.
        (Workload::DaemonSet, Disruption::Drain) => Duration::ZERO,
        // With protection the two later tiers (no Service, so no delay) each wait for an
        // exit after the web tier's.
        (Workload::DeploymentWithTiers, Disruption::Drain) => {
            let later = match protection {
                Protection::None => Duration::ZERO,
                Protection::GracefulDrain => {
                    2 * lower_bound(cfg, Disruption::Drain, Protection::None)
                }
            };
            lower_bound(cfg, Disruption::Drain, protection) + later
        }
        (_, disruption) => lower_bound(cfg, disruption, protection),
    };
    let mut unprotected = 0;
    let mut checked = None;
    let result = match outcome {
        Ok(outcome) => {
            unprotected = outcome.unprotected;
            checked = outcome.checked;
            Ok(outcome.measured)
        }
        Err(e) => Err(graceful_drain_core::error::chain(&e).to_string()),
    };
    let mut row = Row {
        scenario: scenario.name,
        protection,
        result,
        unprotected,
        lower_bound,
        unexpected: None,
        note: None,
        timeline,
    };
    row.unexpected = judge(&row, scenario);
    match checked {
        Some(Ok(note)) => row.note = Some(note),
        Some(Err(problem)) => {
            row.unexpected.get_or_insert(problem);
        }
        None => {}
    }
    row
}

/// Why `row` differs from what `scenario` expects, if it does.
fn judge(row: &Row, scenario: &Scenario) -> Option<String> {
    let measured = match &row.result {
        Ok(m) => m,
        Err(e) => return Some(format!("failed: {e}")),
    };
    let errors = measured.errors_5xx > 0 || row.unprotected > 0;
    match row.protection {
        Protection::None if !errors && scenario.unprotected_5xx => {
            Some("expected 5xx without protection, saw none".into())
        }
        Protection::None if errors && !scenario.unprotected_5xx => Some(format!(
            "{} 5xx and {} pods deleted unprotected where nothing serving is disrupted",
            measured.errors_5xx, row.unprotected
        )),
        Protection::GracefulDrain if errors && !scenario.protected_5xx => Some(format!(
            "{} 5xx and {} pods deleted unprotected",
            measured.errors_5xx, row.unprotected
        )),
        Protection::GracefulDrain if !errors && scenario.protected_5xx => {
            Some("expected 5xx (lag beyond the delay), saw none".into())
        }
        _ => None,
    }
}

/// The shortest the disruption can take, plus the deregistration delay when the webhook
/// isolates the pods: a drain waits for the slowest pod's exit after SIGTERM; a rollout
/// for one pod start per wave of `maxSurge + maxUnavailable` pods (an old pod's exit
/// overlaps the next wave's start).
pub fn lower_bound(
    cfg: &ScenarioConfig,
    disruption: Disruption,
    protection: Protection,
) -> Duration {
    let kubelet = &cfg.cluster.kubelet;
    let exit = if cfg.web.grace_period_seconds == 0 {
        Duration::ZERO
    } else {
        kubelet.exit_after_sigterm.min(Duration::from_secs(
            cfg.web.grace_period_seconds.unsigned_abs(),
        ))
    };
    let delay = match protection {
        Protection::None => Duration::ZERO,
        // Released once the fastest a load balancer can let go (its nodes' shortest lag
        // after the controller's latency), the delay staying the bound.
        Protection::GracefulDrain if cfg.components.confirmed_release => {
            let (lb, model) = (&cfg.cluster.lb, &cfg.cluster.lb_model);
            let fastest = lb
                .deregistration_lag
                .mul_f64(1.0 - model.alb_lag_jitter.clamp(0.0, 1.0));
            (fastest + model.alb_controller_latency).min(cfg.components.deregistration_delay)
        }
        Protection::GracefulDrain => cfg.components.deregistration_delay,
    };
    let work = match disruption {
        Disruption::Rollout => {
            let replicas = u32::try_from(cfg.web.replicas).unwrap_or(0);
            let surge = scaled(&cfg.web.max_surge, replicas, true);
            let unavailable = scaled(&cfg.web.max_unavailable, replicas, false);
            kubelet.start_delay * replicas.div_ceil((surge + unavailable).max(1))
        }
        _ => exit,
    };
    work + delay
}

/// An int-or-percent of `total`, rounded up or down like the Deployment controller does.
fn scaled(value: &IntOrString, total: u32, round_up: bool) -> u32 {
    match value {
        IntOrString::Int(i) => u32::try_from(*i).unwrap_or(0),
        IntOrString::String(s) => {
            let percent: u32 = s.trim_end_matches('%').parse().unwrap_or(0);
            let exact = total * percent;
            if round_up {
                exact.div_ceil(100)
            } else {
                exact / 100
            }
        }
    }
}

/// One scenario on a fresh cluster: deploy, set the budget, disrupt under traffic. The
/// timeline of the disruption comes back whatever the outcome, so a failed row can be
/// explained.
async fn run_disruption(
    cfg: &ScenarioConfig,
    scenario: &Scenario,
    protection: Protection,
    shutdown: &Shutdown,
) -> (Result<Outcome, Error>, Vec<Event>) {
    let cluster = match crate::setup::start(cfg.cluster.clone(), shutdown.clone()).await {
        Ok(cluster) => cluster,
        Err(e) => return (Err(e.into()), Vec::new()),
    };
    disrupt_timed(&cluster, cfg, scenario, protection).await
}

/// [`disrupt`] on `cluster`, with the cluster's events from the disruption's start on
/// (from now when it failed before starting).
async fn disrupt_timed(
    cluster: &impl Access,
    cfg: &ScenarioConfig,
    scenario: &Scenario,
    protection: Protection,
) -> (Result<Outcome, Error>, Vec<Event>) {
    let started = std::sync::Mutex::new(None);
    let outcome = disrupt(cluster, cfg, scenario, protection, &started).await;
    let from = started
        .lock()
        .ok()
        .and_then(|s| *s)
        .unwrap_or_else(Instant::now);
    (outcome, cluster.timeline().between(from, Instant::now()))
}

/// The body of [`run_disruption`]; `started` records when the disruption began.
pub(super) async fn disrupt(
    cluster: &impl Access,
    cfg: &ScenarioConfig,
    scenario: &Scenario,
    protection: Protection,
    started_at: &std::sync::Mutex<Option<Instant>>,
) -> Result<Outcome, Error> {
    if scenario.disruption == Disruption::DrainWithVms {
        return super::vm_scenario::run(cluster, cfg, scenario, protection, started_at).await;
    }
    let tiered = scenario.workload == Workload::DeploymentWithTiers;
    let flags = if tiered { tiered::AGENT_FLAGS } else { &[] };
    let mut components = match protection {
        Protection::None => None,
        Protection::GracefulDrain => {
            Some(Components::start_with(cluster, &cfg.components, flags).await?)
        }
    };
    workloads::deploy(cluster, &cfg.web, cfg.phase_timeout, scenario.workload).await?;
    set_budget(cluster, cfg, &scenario.budget).await?;
    let tiers = if tiered {
        let node = busiest_node(cluster, &cfg.web).await?;
        Some(tiered::place(cluster, cfg, &node).await?)
    } else {
        None
    };
    let client = cluster.client();
    let started = Instant::now();
    if let Ok(mut at) = started_at.lock() {
        *at = Some(started);
    }
    let action = async {
        let nodes = match scenario.disruption {
            Disruption::Rollout => Vec::new(),
            Disruption::DrainTwoNodes => busiest_nodes(cluster, cfg, 2).await?,
            _ => vec![busiest_node(cluster, &cfg.web).await?],
        };
        cluster.step(format!("{}: {}", scenario.name, scenario.about));
        match (scenario.disruption, protection) {
            (Disruption::Rollout, _) => workloads::rollout(cluster, cfg, scenario.workload).await,
            (
                restart @ (Disruption::DrainRestartingAgent | Disruption::DrainRollingWebhook),
                Protection::GracefulDrain,
            ) => {
                let Some(components) = components.as_mut() else {
                    return Ok(());
                };
                drain_restarting(cluster, cfg, components, &nodes[0], restart).await
            }
            (_, protection) => {
                let drains = nodes.iter().map(|node| async {
                    match protection {
                        Protection::None => {
                            actions::plain_drain(&client, node, cfg.phase_timeout).await
                        }
                        Protection::GracefulDrain => {
                            actions::lifecycle_drain(&client, node, cfg.phase_timeout).await
                        }
                    }
                });
                futures::future::try_join_all(drains).await.map(|_| ())
            }
        }
    };
    let measured = measure(cluster, cfg, action).await?;
    if scenario.workload == Workload::DeploymentWithJob {
        workloads::job_completed(cluster, &cfg.web, cfg.phase_timeout).await?;
    }
    if let Some(c) = components.as_mut() {
        c.check().await?;
    }
    let events = cluster
        .timeline()
        .between(cluster.timeline().start(), Instant::now());
    let mut checked = tiers
        .filter(|_| protection == Protection::GracefulDrain)
        .map(|tiers| match tiered::check_order(&tiers, &events) {
            Ok(()) => Ok(format!(
                "{} tiers, each gone before the next was evicted",
                tiers.len()
            )),
            Err(e) => Err(graceful_drain_core::error::chain(&e).to_string()),
        });
    if let Some(c) = components
        .as_ref()
        .filter(|_| cfg.components.confirmed_release)
    {
        checked = Some(released(c).await);
    }
    let window = started.saturating_duration_since(cluster.timeline().start());
    Ok(Outcome {
        measured,
        unprotected: unprotected_deletions(&events, window),
        checked,
    })
}

/// Whether confirmed release ended the delay of every pod the webhook isolated: each was
/// released when the load balancers let go of it, none kept its whole delay.
async fn released(components: &Components) -> Result<String, String> {
    let isolated = components
        .webhook_metric("graceful_drain_webhook_pods_isolated_total")
        .await
        .unwrap_or(0.0);
    let let_go = components
        .webhook_metric(r#"graceful_drain_webhook_balancer_wait_seconds_count{ended="let_go"}"#)
        .await
        .unwrap_or(0.0);
    if isolated > 0.0 && let_go >= isolated {
        Ok(format!(
            "{let_go} of {isolated} isolated pods released when the load balancers let go"
        ))
    } else {
        Err(format!(
            "{let_go} of {isolated} isolated pods released when the load balancers let go; the others kept their whole delay"
        ))
    }
}

/// The `count` nodes running most pods of the workload, busiest first.
async fn busiest_nodes(
    cluster: &DataPlane,
    cfg: &ScenarioConfig,
    count: usize,
) -> Result<Vec<String>, Error> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &cfg.web.namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("app={}", cfg.web.name)))
        .await
        .map_err(|source| Error::Api {
            action: "list pods of",
            object: cfg.web.service_key(),
            source,
        })?;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for pod in &list.items {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *per_node.entry(node).or_default() += 1;
        }
    }
    let mut nodes: Vec<(String, usize)> = per_node.into_iter().collect();
    nodes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(nodes.into_iter().take(count).map(|(n, _)| n).collect())
}

/// A LifecycleEvent drain of `node` during which, as soon as the webhook has isolated one
/// of the node's pods, either the node agent is stopped and started again (it must
/// resume the drain and wait for the isolated pods, not fail on them) or the webhook is
/// rolled to a new replica (which must delete the pods the old one isolated).
async fn drain_restarting(
    cluster: &impl Access,
    cfg: &ScenarioConfig,
    components: &mut Components,
    node: &str,
    restart: Disruption,
) -> Result<(), Error> {
    let client = cluster.client();
    let drain = actions::lifecycle_drain(&client, node, cfg.phase_timeout);
    tokio::pin!(drain);
    let isolated = async {
        wait_for(
            &format!("a pod of node {node} isolated"),
            cfg.phase_timeout,
            || async {
                actions::pods_on(&client, node)
                    .await
                    .is_ok_and(|pods| pods.iter().any(|p| p.labels().contains_key(DRAINING_LABEL)))
            },
        )
        .await
    };
    tokio::select! {
        done = &mut drain => return done,
        seen = isolated => seen?,
    }
    if restart == Disruption::DrainRollingWebhook {
        cluster.step("roll the webhook to a new replica");
        components.roll_webhook(cluster, &cfg.components).await?;
    } else {
        cluster.step(format!("restart the node agent of {node}"));
        components.stop_agent(node).await?;
        components.start_agent(cluster, node).await?;
    }
    drain.await
}

/// Renders the matrix table.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "{:<33} {:<15} {:>8} {:>5} {:>11} {:>9} {:>11}  {}\n",
        "scenario",
        "protection",
        "requests",
        "5xx",
        "unprotected",
        "duration",
        "lower bound",
        "check"
    );
    for r in &report.rows {
        let check = match (&r.unexpected, &r.note) {
            (Some(why), _) => format!("UNEXPECTED: {why}"),
            (None, Some(note)) => format!("ok: {note}"),
            (None, None) => "ok".to_string(),
        };
        let _ = match &r.result {
            Ok(m) => writeln!(
                out,
                "{:<33} {:<15} {:>8} {:>5} {:>11} {:>8.1}s {:>10.1}s  {check}",
                r.scenario,
                r.protection.to_string(),
                m.requests,
                m.errors_5xx,
                r.unprotected,
                m.duration.as_secs_f64(),
                r.lower_bound.as_secs_f64(),
            ),
            Err(_) => writeln!(
                out,
                "{:<33} {:<15} {:>8} {:>5} {:>11} {:>9} {:>10.1}s  {check}",
                r.scenario,
                r.protection.to_string(),
                "-",
                "-",
                "-",
                "-",
                r.lower_bound.as_secs_f64(),
            ),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn rows_are_judged_against_their_scenario() {
        let measured = |errors| {
            Ok(Measured {
                requests: 100,
                errors_5xx: errors,
                duration: Duration::from_secs(1),
                timeline: Vec::new(),
                haproxy: None,
            })
        };
        let scenario = find("deployment-drain").unwrap();
        let lag = find("lag-beyond-delay-drain").unwrap();
        let row = |protection, result, unprotected| Row {
            scenario: "x",
            protection,
            result,
            unprotected,
            lower_bound: Duration::ZERO,
            unexpected: None,
            note: None,
            timeline: Vec::new(),
        };
        assert!(judge(&row(Protection::None, measured(3), 1), &scenario).is_none());
        assert!(judge(&row(Protection::None, measured(0), 0), &scenario).is_some());
        assert!(judge(&row(Protection::GracefulDrain, measured(0), 0), &scenario).is_none());
        assert!(judge(&row(Protection::GracefulDrain, measured(1), 0), &scenario).is_some());
        assert!(judge(&row(Protection::GracefulDrain, measured(0), 1), &scenario).is_some());
        assert!(judge(&row(Protection::GracefulDrain, measured(2), 1), &lag).is_none());
        assert!(judge(&row(Protection::GracefulDrain, measured(0), 0), &lag).is_some());
        let failed = row(Protection::GracefulDrain, Err("boom".into()), 0);
        assert!(judge(&failed, &scenario).unwrap().contains("boom"));
    }

    #[test]
    fn scenario_names_are_unique_and_lower_bounds_add_the_delay_when_protected() {
        let all = scenarios();
        let names: BTreeSet<&str> = all.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), all.len());
        #[derive(clap::Parser)]
        struct Simulate {
            #[command(flatten)]
            args: crate::Args,
        }
        let cfg = <Simulate as clap::Parser>::parse_from(["simulate"])
            .args
            .scenario();
        let none = lower_bound(&cfg, Disruption::Drain, Protection::None);
        let gd = lower_bound(&cfg, Disruption::Drain, Protection::GracefulDrain);
        assert_eq!(gd - none, cfg.components.deregistration_delay);
        assert_eq!(scaled(&IntOrString::String("25%".into()), 4, true), 1);
        assert_eq!(scaled(&IntOrString::String("30%".into()), 4, true), 2);
        assert_eq!(scaled(&IntOrString::String("30%".into()), 4, false), 1);
    }
}
