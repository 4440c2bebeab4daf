//! Drain benchmark on the simulated cluster: 100- and 500-pod nodes drained by the node
//! agent through the SLM Start/End loop (as the kubelet drives it), and the same nodes
//! drained with the real webhook through a LifecycleEvent; each compared with the lower
//! bound — the slowest pod's exit after SIGTERM, plus the deregistration delay when the
//! webhook holds pods for load balancers — with the API requests the agent made per pod
//! (and, with the webhook, the webhook's per pod) and the share of the cores the process
//! (simulator included) kept busy. A floor row per size drains the same node with every
//! eviction sent at once and no agent: what the simulated cluster itself needs, so the
//! agent's own cost is its row's difference to the floor. ("all evictions answered" is
//! measured in the agent rows only.)
//!
//! Run: `cargo bench --bench drain` (or, without an optimised build,
//! `cargo test --bench drain`: wall times are dominated by the simulated timings).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark may panic

use std::time::{Duration, Instant};

use graceful_drain_agent as agent;
use graceful_drain_core::lifecycle::{LifecycleEvent, LifecycleEventSpec};
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_sim::scenario::components::{self, Components, ComponentsConfig};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec};
use kube_sim::controllers::kubelet::KubeletConfig;
use serde_json::json;

#[path = "support/agent.rs"]
mod agent_cli;

use graceful_drain_e2e::kubelet;

const NODE: &str = "worker-1";
const AGENT_USER: &str = "system:serviceaccount:graceful-drain:node-agent";
/// How long a pod takes to exit after SIGTERM: the lower bound of any drain.
const EXIT_AFTER_SIGTERM: Duration = Duration::from_secs(1);
/// Bound for setting up and for one drain.
const TIMEOUT: Duration = Duration::from_secs(300);

struct Row {
    setup: &'static str,
    pods: usize,
    wall: Duration,
    /// When the last eviction request was answered.
    evictions_sent: Option<Duration>,
    /// When the API first listed no pod on the node (agent rows only).
    last_pod_gone: Option<Duration>,
    /// Share of the machine's cores the whole process (simulated cluster, kubelets,
    /// controllers, agent and webhook together) kept busy during the drain.
    cpu_busy: f64,
    lower_bound: Duration,
    requests: u64,
    /// The webhook's API requests (Lease renewals aside), in the webhook rows.
    webhook_requests: Option<u64>,
    evictions: u64,
}

/// CPU seconds this process has used (user + system, from /proc/self/stat in USER_HZ
/// ticks, 100 a second on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is the 12th, stime
    // the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Share of all cores busy between `cpu0` (CPU seconds) and now, over `wall`.
fn busy_since(cpu0: f64, wall: Duration) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    (cpu_seconds() - cpu0) / wall.as_secs_f64() / cores
}

async fn set_unschedulable(client: &kube::Client, node: &str, on: bool) {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = Patch::Merge(json!({"spec": {"unschedulable": on}}));
    nodes
        .patch(node, &PatchParams::default(), &patch)
        .await
        .unwrap();
}

/// A two-node simulated cluster with `pods` replicas of the web Deployment, all on
/// `worker-1` (the node the benchmark drains); with `webhook`, graceful-drain's webhook
/// (holding each evicted pod for that delay) and node agents run in it from the start.
async fn cluster_with_web(
    pods: usize,
    webhook: Option<Duration>,
) -> (Shutdown, Cluster, Option<Components>) {
    let cfg = ClusterConfig {
        nodes: 2,
        kubelet: KubeletConfig {
            start_delay: Duration::from_millis(200),
            accept_after_sigterm: Duration::ZERO,
            exit_after_sigterm: EXIT_AFTER_SIGTERM,
        },
        // Every pod on one node, as a kubelet with `--max-pods` above the count allows.
        max_pods: pods + 10,
        ..ClusterConfig::default()
    };
    let shutdown = Shutdown::new();
    let cluster = graceful_drain_sim::setup::start(cfg, shutdown.clone())
        .await
        .unwrap();
    let components = match webhook {
        Some(delay) => {
            let config = ComponentsConfig {
                deregistration_delay: delay,
                timeout_seconds: 10,
                agent_program: None,
                confirmed_release: false,
                balancer_stats: None,
            };
            Some(Components::start(&cluster, &config).await.unwrap())
        }
        None => None,
    };
    let admin = cluster.client();
    // Every replica on the drained node: keep the other one cordoned while deploying.
    set_unschedulable(&admin, "worker-2", true).await;
    let web = WebSpec {
        replicas: i32::try_from(pods).unwrap(),
        min_available: 0,
        grace_period_seconds: 30,
        ..WebSpec::default()
    };
    cluster.deploy_web(&web, TIMEOUT).await.unwrap();
    set_unschedulable(&admin, "worker-2", false).await;
    (shutdown, cluster, components)
}

async fn drain(pods: usize) -> Row {
    let (shutdown, cluster, _) = cluster_with_web(pods, None).await;
    let admin = cluster.client();

    let dir = tempfile::tempdir().unwrap();
    let client = cluster.api().client(AGENT_USER);
    let started = agent::start(agent_cli::args(dir.path(), NODE), client, shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = kubelet::Kubelet::register(&started.registration_socket, NODE).await;
    // The agent's drain lives as long as the LifecycleEvent the kubelet drives (`ev-1`).
    let event = LifecycleEvent::new(
        "ev-1",
        LifecycleEventSpec {
            transition_name: graceful_drain_core::lifecycle::DRAIN_TRANSITION.into(),
            binding_node: NODE.into(),
        },
    );
    Api::<LifecycleEvent>::all(admin.clone())
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
    let on_node: Api<Pod> = Api::all(admin.clone());
    let on_node_params = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
    let before = cluster.api().stats();
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    kubelet.start("graceful-drain", NODE).await;
    let deadline = Instant::now() + TIMEOUT;
    let mut all_evicted = None;
    let mut last_pod_gone = None;
    loop {
        let evicted = cluster.api().stats().count("create", "pods/eviction")
            - before.count("create", "pods/eviction");
        if all_evicted.is_none() && evicted >= pods as u64 {
            all_evicted = Some(t0.elapsed());
        }
        if last_pod_gone.is_none()
            && on_node
                .list_metadata(&on_node_params)
                .await
                .is_ok_and(|l| l.items.is_empty())
        {
            last_pod_gone = Some(t0.elapsed());
        }
        let answer = kubelet.end("graceful-drain", false).await;
        assert_eq!(answer.error, "");
        if answer.lifecycle_condition == "drain-complete" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "drain of {pods} pods did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wall = t0.elapsed();
    let cpu_busy = busy_since(cpu0, wall);
    let after = cluster.api().stats();
    let user = |s: &kube_sim::apiserver::Stats| s.of_user(AGENT_USER, &[]);
    let row = Row {
        setup: "agent only",
        pods,
        wall,
        evictions_sent: all_evicted,
        last_pod_gone,
        cpu_busy,
        lower_bound: EXIT_AFTER_SIGTERM,
        requests: user(&after) - user(&before),
        webhook_requests: None,
        evictions: after.count("create", "pods/eviction") - before.count("create", "pods/eviction"),
    };
    shutdown.cancel();
    started.wait().await;
    row
}

/// The simulator's floor for the same node: a client that cordons and sends every
/// eviction at once (`actions::plain_drain`, no pacing, no agent), timed until the last
/// pod object has left the API. What the agent adds is the difference to this row.
async fn plain_drain(pods: usize) -> Row {
    use graceful_drain_sim::scenario::actions;
    let (shutdown, cluster, _) = cluster_with_web(pods, None).await;
    let admin = cluster.client();
    let before = cluster.api().stats();
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    actions::plain_drain(&admin, NODE, TIMEOUT).await.unwrap();
    let wall = t0.elapsed();
    let cpu_busy = busy_since(cpu0, wall);
    let after = cluster.api().stats();
    shutdown.cancel();
    Row {
        setup: "floor: every eviction at once, no agent",
        pods,
        wall,
        evictions_sent: None,
        last_pod_gone: Some(wall),
        cpu_busy,
        lower_bound: EXIT_AFTER_SIGTERM,
        requests: 0,
        webhook_requests: None,
        evictions: after.count("create", "pods/eviction") - before.count("create", "pods/eviction"),
    }
}

/// The same drain with graceful-drain's real webhook holding each evicted pod for
/// `delay`, driven through a LifecycleEvent and the lifecycle reconciler, as in
/// production; or, as its `floor`, with every eviction sent at once through the webhook
/// and no agent.
async fn drain_with_webhook(pods: usize, delay: Duration, floor: bool) -> Row {
    use graceful_drain_sim::scenario::actions;
    let (shutdown, cluster, _components) = cluster_with_web(pods, Some(delay)).await;
    let admin = cluster.client();
    let user = |s: &kube_sim::apiserver::Stats| s.of_user(components::AGENT_USER, &[]);
    let before = cluster.api().stats();
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    if floor {
        // Every eviction at once through the webhook, no agent: timed until the last
        // isolated pod was deleted and left the API.
        actions::plain_drain(&admin, NODE, TIMEOUT).await.unwrap();
    } else {
        actions::lifecycle_drain(&admin, NODE, TIMEOUT)
            .await
            .unwrap();
    }
    let wall = t0.elapsed();
    let cpu_busy = busy_since(cpu0, wall);
    let after = cluster.api().stats();
    shutdown.cancel();
    let during = after.since(&before);
    eprintln!("webhook requests, {pods} pods:");
    for (kind, n) in during.breakdown(components::WEBHOOK_USER) {
        eprintln!("  {n:>6} {kind}");
    }
    Row {
        setup: if floor {
            "floor with webhook: every eviction at once, no agent"
        } else {
            "with webhook"
        },
        pods,
        wall,
        evictions_sent: None,
        last_pod_gone: floor.then_some(wall),
        cpu_busy,
        lower_bound: delay + EXIT_AFTER_SIGTERM,
        requests: user(&after) - user(&before),
        webhook_requests: Some(during.of_user(components::WEBHOOK_USER, &["leases"])),
        evictions: after.count("create", "pods/eviction") - before.count("create", "pods/eviction"),
    }
}

fn main() {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows: Vec<Row> = Vec::new();
    for n in [100, 500] {
        rows.push(rt.block_on(plain_drain(n)));
        rows.push(rt.block_on(drain(n)));
    }
    for n in [100, 500] {
        rows.push(rt.block_on(drain_with_webhook(n, Duration::from_secs(3), true)));
        rows.push(rt.block_on(drain_with_webhook(n, Duration::from_secs(3), false)));
    }
    println!();
    println!(
        "| setup | pods | drain wall time | all evictions answered | last pod gone | lower bound | ratio | CPU busy | agent API requests | per pod | webhook API requests per pod | evictions |"
    );
    println!(
        "|-------|-----:|----------------:|-----------------------:|--------------:|------------:|------:|---------:|-------------------:|--------:|--------:|----------:|"
    );
    for r in &rows {
        let answered = r
            .evictions_sent
            .map_or("—".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
        let gone = r
            .last_pod_gone
            .map_or("—".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
        let webhook = r.webhook_requests.map_or("—".to_string(), |n| {
            format!("{:.2}", n as f64 / r.pods as f64)
        });
        println!(
            "| {} | {} | {:.2} s | {answered} | {gone} | {:.2} s | {:.1}x | {:.0}% | {} | {:.2} | {webhook} | {} |",
            r.setup,
            r.pods,
            r.wall.as_secs_f64(),
            r.lower_bound.as_secs_f64(),
            r.wall.as_secs_f64() / r.lower_bound.as_secs_f64(),
            r.cpu_busy * 100.0,
            r.requests,
            r.requests as f64 / r.pods as f64,
            r.evictions,
        );
    }
}
