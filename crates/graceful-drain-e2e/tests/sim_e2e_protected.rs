//! End-to-end scenarios with graceful-drain's real webhook and node agents running
//! in-process against the simulated cluster, started from their documented flags.

// Helpers outside #[test] functions unwrap too: a failed step fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_sim::scenario::actions;
use graceful_drain_sim::scenario::components::{Components, ComponentsConfig};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec, wait_for};
use kube_sim::lb::LbConfig;
use kube_sim::traffic::{TrafficConfig, TrafficReport};

/// Bound for any convergence in these tests.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Load-balancer lags short enough for tests; the webhook's delay covers the
/// deregistration lag with a second to spare.
fn config() -> ClusterConfig {
    config_with_lag(Duration::from_secs(2))
}

fn config_with_lag(deregistration_lag: Duration) -> ClusterConfig {
    ClusterConfig {
        lb: LbConfig {
            registration_lag: Duration::from_millis(300),
            deregistration_lag,
        },
        ..ClusterConfig::default()
    }
}

fn components_config() -> ComponentsConfig {
    ComponentsConfig {
        deregistration_delay: Duration::from_secs(3),
        timeout_seconds: 10,
        agent_program: None,
        confirmed_release: false,
        balancer_stats: None,
    }
}

fn traffic() -> TrafficConfig {
    TrafficConfig {
        rate: 100.0,
        request_duration: Duration::from_millis(10),
        max_requests: 20_000,
        max_duration: TIMEOUT * 2,
    }
}

async fn protected(spec: &WebSpec) -> (Cluster, Components) {
    protected_with(spec, config()).await
}

async fn protected_with(spec: &WebSpec, config: ClusterConfig) -> (Cluster, Components) {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    let cluster = graceful_drain_sim::setup::start(config, Shutdown::new())
        .await
        .unwrap();
    let components = Components::start(&cluster, &components_config())
        .await
        .unwrap();
    cluster.deploy_web(spec, TIMEOUT).await.unwrap();
    (cluster, components)
}

/// Waits until the load balancer routes only to pods that accept, then reports.
async fn settle(
    cluster: &Cluster,
    spec: &WebSpec,
    traffic: kube_sim::traffic::Traffic,
) -> TrafficReport {
    let service = spec.service_key();
    wait_for("load balancer settled", TIMEOUT, || async {
        cluster
            .lbs()
            .routable(&service, Instant::now())
            .iter()
            .all(|uid| cluster.apps().accepting(uid))
    })
    .await
    .unwrap();
    traffic.stop().await
}

fn describe(report: &TrafficReport) -> String {
    let lines: Vec<String> = report.timeline.iter().map(|e| e.to_string()).collect();
    format!(
        "{} 5xx of {} requests\n{}",
        report.errors_5xx,
        report.requests,
        lines.join("\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_through_the_delete_path_has_no_5xx() {
    let spec = WebSpec::default();
    let (cluster, mut components) = protected(&spec).await;
    let traffic = cluster.traffic(&spec, traffic());
    actions::rollout(&cluster.client(), &spec, TIMEOUT)
        .await
        .unwrap();
    let report = settle(&cluster, &spec, traffic).await;
    components.check().await.unwrap();
    assert!(report.requests > 0);
    assert_eq!(report.errors_5xx, 0, "{}", describe(&report));
    // The ReplicaSet controller's DELETEs went through the validating webhook.
    let calls = cluster.api().stats().admission_calls;
    assert!(
        calls.get("delete.graceful-drain.io").copied().unwrap_or(0) >= 4,
        "{calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_with_a_lag_beyond_the_delay_shows_5xx() {
    // The same rollout, but the load balancer keeps routing to removed pods for 6 s
    // while the webhook only waits 3 s: the measurement must see the difference.
    let spec = WebSpec::default();
    let (cluster, mut components) =
        protected_with(&spec, config_with_lag(Duration::from_secs(6))).await;
    let traffic = cluster.traffic(&spec, traffic());
    actions::rollout(&cluster.client(), &spec, TIMEOUT)
        .await
        .unwrap();
    let report = settle(&cluster, &spec, traffic).await;
    components.check().await.unwrap();
    assert!(report.errors_5xx > 0, "{}", describe(&report));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_drain_has_no_5xx_when_the_delay_covers_the_lag() {
    let spec = WebSpec::default();
    let (cluster, mut components) = protected(&spec).await;
    let node = cluster.nodes()[0].clone();
    let traffic = cluster.traffic(&spec, traffic());
    actions::lifecycle_drain(&cluster.client(), &node, TIMEOUT)
        .await
        .unwrap();
    assert!(
        actions::pods_on(&cluster.client(), &node)
            .await
            .unwrap()
            .is_empty(),
        "drain-complete means every pod is gone"
    );
    let report = settle(&cluster, &spec, traffic).await;
    components.check().await.unwrap();
    assert_eq!(report.errors_5xx, 0, "{}", describe(&report));
}

/// A Service of more than 100 endpoints has several EndpointSlices, as kube-controller-
/// manager splits them; a drain of the busiest node still drops nothing: the webhook
/// finds each pod in whichever slice holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_behind_a_service_of_several_slices_has_no_5xx() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let spec = WebSpec {
        replicas: 150,
        min_available: 140,
        ..WebSpec::default()
    };
    let (cluster, mut components) = protected(&spec).await;
    let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(cluster.client(), &spec.namespace);
    let label = format!("kubernetes.io/service-name={}", spec.name);
    let list = slices
        .list(&kube::api::ListParams::default().labels(&label))
        .await
        .unwrap()
        .items;
    let sizes: Vec<usize> = list.iter().map(|s| s.endpoints.len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 150, "{sizes:?}");
    assert!(
        sizes.len() >= 2 && sizes.iter().all(|n| *n <= 100),
        "{sizes:?}"
    );
    let node = busiest(&cluster, &spec).await;
    let traffic = cluster.traffic(&spec, traffic());
    actions::lifecycle_drain(&cluster.client(), &node, TIMEOUT * 2)
        .await
        .unwrap();
    let report = settle(&cluster, &spec, traffic).await;
    components.check().await.unwrap();
    assert!(report.requests > 0);
    assert_eq!(report.errors_5xx, 0, "{}", describe(&report));
}

async fn busiest(cluster: &Cluster, spec: &WebSpec) -> String {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(cluster.client(), &spec.namespace);
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for pod in pods.list(&Default::default()).await.unwrap().items {
        if let Some(node) = pod.spec.and_then(|s| s.node_name) {
            *per_node.entry(node).or_default() += 1;
        }
    }
    per_node.into_iter().max_by_key(|(_, n)| *n).unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_holds_under_concurrent_evictions() {
    let spec = WebSpec {
        replicas: 6,
        min_available: 4,
        max_surge: IntOrString::Int(1),
        max_unavailable: IntOrString::Int(0),
        ..WebSpec::default()
    };
    let (cluster, mut components) = protected(&spec).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    // Pods of the workload that serve: selected by the PDB (isolated pods lose the
    // label), Ready, not deleting; counted after every change a watch of them brings.
    let (store, writer) = reflector::store();
    let changes = watcher(pods, watcher::Config::default().labels("app=web"))
        .default_backoff()
        .reflect(writer);
    let serving = |store: &reflector::Store<Pod>| {
        store
            .state()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count()
    };
    let client = cluster.client();
    let (a, b) = (cluster.nodes()[0].clone(), cluster.nodes()[1].clone());
    let done = tokio_util::sync::CancellationToken::new();
    let sampler = async {
        let mut changes = std::pin::pin!(changes);
        let mut lowest = usize::MAX;
        loop {
            tokio::select! {
                () = done.cancelled() => return lowest,
                change = changes.next() => {
                    change.expect("the pod watch ended").unwrap();
                    if store.wait_until_ready().now_or_never().is_some() {
                        lowest = lowest.min(serving(&store));
                    }
                }
            }
        }
    };
    let work = async {
        // Two drains at once, as two operators (or an autoscaler and a person) would.
        let (ra, rb) = tokio::join!(
            actions::plain_drain(&client, &a, TIMEOUT),
            actions::plain_drain(&client, &b, TIMEOUT)
        );
        ra.unwrap();
        rb.unwrap();
        cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
        done.cancel();
    };
    let (lowest, ()) = tokio::join!(sampler, work);
    components.check().await.unwrap();
    assert!(
        lowest >= 4,
        "only {lowest} pods served at some moment; the PDB asks for 4"
    );
    assert!(
        actions::pods_on(&client, &a).await.unwrap().is_empty()
            && actions::pods_on(&client, &b).await.unwrap().is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_outage_with_failure_policy_ignore_still_lets_the_drain_finish() {
    let spec = WebSpec {
        replicas: 3,
        min_available: 2,
        ..WebSpec::default()
    };
    let (cluster, mut components) = protected(&spec).await;
    components.stop_webhook().await.unwrap();
    let node = cluster.nodes()[0].clone();
    actions::lifecycle_drain(&cluster.client(), &node, TIMEOUT)
        .await
        .unwrap();
    assert!(
        actions::pods_on(&cluster.client(), &node)
            .await
            .unwrap()
            .is_empty()
    );
    let stats = cluster.api().stats();
    assert!(
        stats.admission_failures.values().sum::<u64>() > 0,
        "the API server tried the webhook: {stats:?}"
    );
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
}

#[derive(clap::Parser)]
struct SimulateCli {
    #[command(flatten)]
    args: graceful_drain_sim::Args,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_scenario_shows_5xx_only_without_protection() {
    use clap::Parser;
    use graceful_drain_sim::scenario::{self, Protection};
    graceful_drain_core::runtime::install_crypto_provider();
    let cli = SimulateCli::try_parse_from(["simulate"]).unwrap();
    let rows = scenario::run_all(&cli.args.scenario(), &Shutdown::new()).await;
    let table = scenario::table(&rows);
    assert_eq!(rows.len(), 4, "{table}");
    for row in &rows {
        let m = row
            .result
            .as_ref()
            .unwrap_or_else(|e| panic!("{} / {}: {e}\n{table}", row.scenario, row.protection));
        assert!(m.requests > 0, "{table}");
        match row.protection {
            Protection::None => assert!(m.errors_5xx > 0, "{table}"),
            Protection::GracefulDrain => assert_eq!(m.errors_5xx, 0, "{table}"),
        }
    }
}
