//! Benchmark: drain a node running 500 pods on the simulated cluster (plain evictions,
//! every controller and kubelet running) and report wall time and API requests per
//! drained pod. `SIM_BENCH_PODS` overrides the pod count.

use std::time::{Duration, Instant};

use graceful_drain_core::runtime::Shutdown;
use graceful_drain_sim::scenario::actions;
use kube_sim::cluster::{ClusterConfig, WebSpec};
use kube_sim::controllers::kubelet::KubeletConfig;

/// Bound of each step; a 500-pod drain takes seconds.
const TIMEOUT: Duration = Duration::from_secs(300);

struct Line {
    case: &'static str,
    pods: usize,
    wall: Duration,
    requests: u64,
}

async fn bench(pods: usize) -> Result<Vec<Line>, Box<dyn std::error::Error>> {
    let cfg = ClusterConfig {
        nodes: 2,
        kubelet: KubeletConfig {
            start_delay: Duration::from_millis(100),
            accept_after_sigterm: Duration::ZERO,
            exit_after_sigterm: Duration::from_millis(100),
        },
        ..ClusterConfig::default()
    };
    let cluster = graceful_drain_sim::setup::start(cfg, Shutdown::new()).await?;
    let client = cluster.client();
    let (drained, spare) = (cluster.nodes()[0].clone(), cluster.nodes()[1].clone());
    // Every pod on the first node: cordon the other one while scaling up.
    actions::cordon(&client, &spare, true).await?;
    let replicas = i32::try_from(pods)?;
    let spec = WebSpec {
        replicas,
        min_available: 0,
        ..WebSpec::default()
    };
    let stats = cluster.api().stats().total();
    let start = Instant::now();
    cluster.deploy_web(&spec, TIMEOUT).await?;
    let up = Line {
        case: "scale up",
        pods,
        wall: start.elapsed(),
        requests: cluster.api().stats().total() - stats,
    };
    actions::cordon(&client, &spare, false).await?;
    let stats = cluster.api().stats().total();
    let start = Instant::now();
    actions::plain_drain(&client, &drained, TIMEOUT).await?;
    let wall = start.elapsed();
    let requests = cluster.api().stats().total() - stats;
    cluster.wait_web_ready(&spec, TIMEOUT).await?;
    let drain = Line {
        case: "plain drain (evictions)",
        pods,
        wall,
        requests,
    };
    Ok(vec![up, drain])
}

fn main() {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    let pods = std::env::var("SIM_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return eprintln!("runtime: {e}"),
    };
    match rt.block_on(bench(pods)) {
        Ok(lines) => {
            println!(
                "{:<26} {:>6} {:>9} {:>13} {:>14}",
                "case", "pods", "wall", "API requests", "requests/pod"
            );
            for l in lines {
                println!(
                    "{:<26} {:>6} {:>8.2}s {:>13} {:>14.1}",
                    l.case,
                    l.pods,
                    l.wall.as_secs_f64(),
                    l.requests,
                    l.requests as f64 / l.pods as f64
                );
            }
        }
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            std::process::exit(1);
        }
    }
}
