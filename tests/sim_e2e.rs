//! End-to-end scenarios on the simulated cluster: the controllers, kubelets and load
//! balancers against the in-process API server, driven over HTTP like a real cluster.

use std::time::{Duration, Instant};

use graceful_drain::runtime::Shutdown;
use graceful_drain::sim::cluster::{Cluster, ClusterConfig, WebSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;

/// Bound for any convergence in these tests; runs take a few seconds.
const TIMEOUT: Duration = Duration::from_secs(30);

fn init() {
    graceful_drain::runtime::install_crypto_provider();
    graceful_drain::runtime::init_tracing(graceful_drain::runtime::LogFormat::Text);
}

async fn cluster(cfg: ClusterConfig) -> Cluster {
    init();
    Cluster::start(cfg, Shutdown::new()).await.unwrap()
}

async fn web_pods(cluster: &Cluster, spec: &WebSpec) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    api.list(&ListParams::default().labels(&format!("app={}", spec.name)))
        .await
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_scales_up_and_pods_join_the_slice() {
    let cluster = cluster(ClusterConfig::default()).await;
    let spec = WebSpec {
        replicas: 5,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let pods = web_pods(&cluster, &spec).await;
    assert_eq!(pods.len(), 5);
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client(), "default");
    let slice = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap()
        .items;
    assert_eq!(slice.len(), 1, "one slice per Service");
    for pod in &pods {
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let ep = slice[0]
            .endpoints
            .iter()
            .find(|e| {
                e.target_ref.as_ref().and_then(|t| t.uid.as_ref()) == pod.metadata.uid.as_ref()
            })
            .expect("pod in slice");
        assert_eq!(ep.conditions.as_ref().unwrap().ready, Some(true));
        assert_eq!(ep.addresses, vec![status.pod_ip.clone().unwrap()]);
        assert_eq!(ep.node_name, pod.spec.as_ref().unwrap().node_name);
    }
    // Least-loaded placement spreads 5 pods over 3 nodes as 2/2/1.
    let mut per_node = std::collections::BTreeMap::new();
    for pod in &pods {
        *per_node
            .entry(pod.spec.as_ref().unwrap().node_name.clone().unwrap())
            .or_insert(0) += 1;
    }
    let mut counts: Vec<i32> = per_node.values().copied().collect();
    counts.sort();
    assert_eq!(counts, vec![1, 2, 2]);
    assert_eq!(
        cluster
            .lbs()
            .routable(&spec.service_key(), Instant::now())
            .len(),
        5
    );
}
