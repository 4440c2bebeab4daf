//! Lifecycle reconciler benchmark on the simulated cluster, two tables:
//!
//! 1. **Idle API load**: N node agents (each with its lifecycle reconciler) on N idle
//!    nodes; the API requests they make in a measured window, per node per second. The
//!    reconcilers hold two watches each (the node's LifecycleEvents and its Node), which
//!    the API server ends after kube-rs's watch timeout (290 s), so the steady state is
//!    also shown amortised over that renewal.
//! 2. **Completion latency**: a node drained through a LifecycleEvent with the default
//!    10 s reconciler tick; the time from the last pod leaving the API to the event's
//!    `Succeeded`.
//!
//! Run: `cargo bench --bench reconciler` (`-- --nodes 1000` for a larger idle run).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark may panic

use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use graceful_drain_agent as agent;
use graceful_drain_core::lifecycle::{
    ClaimStatus, DRAIN_TRANSITION, LifecycleEvent, LifecycleEventSpec,
};
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_sim::command::AgentCommand;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec};

const AGENT_USER: &str = "system:serviceaccount:graceful-drain:node-agent";
/// kube-rs asks the API server to end each watch after this long; the watcher then
/// starts a new one (one request).
const WATCH_RENEWAL: Duration = Duration::from_secs(290);
/// Watches each idle reconciler holds: its node's events and its Node.
const WATCHES_PER_NODE: f64 = 2.0;
const TIMEOUT: Duration = Duration::from_secs(120);

fn agent_args(dir: &std::path::Path, node: &str) -> agent::Args {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: agent::Args,
    }
    let command = AgentCommand::new(node, &dir.join(node)).reconciler("on");
    Cli::try_parse_from(command.argv()).unwrap().args
}

async fn cluster(nodes: usize) -> Cluster {
    let cfg = ClusterConfig {
        nodes,
        ..ClusterConfig::default()
    };
    graceful_drain_sim::setup::start(cfg, Shutdown::new())
        .await
        .unwrap()
}

/// Idle load of `nodes` agents over `window`: (requests in the window, per node per s).
/// Longest wait for every reconciler to be watching before the idle window.
const STARTUP_BOUND: Duration = Duration::from_secs(300);

async fn idle(nodes: usize, warmup: Duration, window: Duration) -> (u64, f64) {
    let cluster = cluster(nodes).await;
    let dir = tempfile::tempdir().unwrap();
    let shutdown = Shutdown::new();
    for node in cluster.nodes() {
        let client = cluster.api().client(AGENT_USER);
        agent::start(agent_args(dir.path(), node), client, shutdown.clone())
            .await
            .unwrap();
    }
    // Idle means every reconciler has started and watches its events and its Node: with
    // many nodes start-up takes longer than any fixed warm-up, and its lists and gets
    // would be counted as idle load.
    let api = cluster.api();
    let started = tokio::time::Instant::now();
    while started.elapsed() < STARTUP_BOUND {
        let stats = api.stats();
        let n = u64::try_from(nodes).unwrap_or(u64::MAX);
        if stats.count("watch", "lifecycleevents") >= n && stats.count("watch", "nodes") >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "  {nodes} reconcilers watching after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(warmup).await;
    let before = cluster.api().stats();
    tokio::time::sleep(window).await;
    let during = cluster.api().stats().since(&before);
    shutdown.cancel();
    cluster.shutdown().cancel();
    let requests = during.of_user(AGENT_USER, &[]);
    let rate = requests as f64 / nodes as f64 / window.as_secs_f64();
    // Where the window's requests went (every user), most frequent first.
    let mut kinds: Vec<_> = during.requests.iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1));
    for ((verb, resource), count) in kinds.into_iter().take(6) {
        eprintln!("  window: {count:>6} {verb} {resource}");
    }
    (requests, rate)
}

/// One drain through a LifecycleEvent: seconds from the last pod leaving to Succeeded.
async fn completion_latency(round: usize) -> Duration {
    let cluster = cluster(2).await;
    let node = cluster.nodes()[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let shutdown = Shutdown::new();
    let client = cluster.api().client(AGENT_USER);
    agent::start(agent_args(dir.path(), &node), client, shutdown.clone())
        .await
        .unwrap();
    let web = WebSpec {
        replicas: 4,
        min_available: 0,
        grace_period_seconds: 1,
        ..WebSpec::default()
    };
    cluster.deploy_web(&web, TIMEOUT).await.unwrap();
    let admin = cluster.client();
    let pods: Api<Pod> = Api::all(admin.clone());
    let pod_config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let (store, writer) = kube::runtime::reflector::store();
    let mut pod_changes = watcher(pods, pod_config)
        .default_backoff()
        .reflect(writer)
        .boxed();
    let name = format!("drain-{round}");
    let events: Api<LifecycleEvent> = Api::all(admin.clone());
    let event = LifecycleEvent::new(
        &name,
        LifecycleEventSpec {
            transition_name: DRAIN_TRANSITION.into(),
            binding_node: node.clone(),
        },
    );
    let created = events.create(&PostParams::default(), &event).await.unwrap();
    let rv = created
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let params = kube::api::WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut event_changes = events.watch(&params, &rv).await.unwrap().boxed();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut last_pod_gone: Option<Instant> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => panic!("drain {name} did not succeed"),
            Some(_) = pod_changes.next() => {
                let left = store.state().iter().filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("web-"))).count();
                let listed = store.wait_until_ready().now_or_never().is_some();
                if listed && left == 0 && last_pod_gone.is_none() {
                    last_pod_gone = Some(Instant::now());
                }
            }
            Some(change) = event_changes.next() => {
                if let Ok(kube::api::WatchEvent::Modified(e)) = change
                    && e.status.and_then(|s| s.claim_status) == Some(ClaimStatus::Succeeded)
                {
                    shutdown.cancel();
                    cluster.shutdown().cancel();
                    let gone = last_pod_gone.expect("Succeeded before the last pod left");
                    return gone.elapsed();
                }
            }
        }
    }
}

fn flag(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    graceful_drain_core::runtime::install_crypto_provider();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let nodes = flag("--nodes", 200);
    let window = Duration::from_secs(flag("--window-seconds", 60) as u64);
    rt.block_on(async {
        let (requests, rate) = idle(nodes, Duration::from_secs(10), window).await;
        let amortised = WATCHES_PER_NODE / WATCH_RENEWAL.as_secs_f64();
        println!("\nIdle API load of the node agent and its lifecycle reconciler");
        println!("| nodes | window | requests | per node per s (measured) | per node per s (with watch renewals) | goal |");
        println!("|---:|---:|---:|---:|---:|---:|");
        println!(
            "| {nodes} | {}s | {requests} | {rate:.4} | {:.4} | ≤ 0.02 |",
            window.as_secs(),
            rate + amortised
        );
        let mut latencies = Vec::new();
        for round in 0..3 {
            latencies.push(completion_latency(round).await);
        }
        latencies.sort();
        println!("\nFrom the last pod leaving to the event's Succeeded (reconciler tick 10 s)");
        println!("| drains | min | median | max | goal |");
        println!("|---:|---:|---:|---:|---:|");
        println!(
            "| {} | {:.2}s | {:.2}s | {:.2}s | ≤ 1 s |",
            latencies.len(),
            latencies[0].as_secs_f64(),
            latencies[latencies.len() / 2].as_secs_f64(),
            latencies[latencies.len() - 1].as_secs_f64()
        );
    });
}
