//! End-to-end scenarios on the simulated cluster: the controllers, kubelets and load
//! balancers against the in-process API server, driven over HTTP like a real cluster.

// Helpers outside #[test] functions unwrap too: a failed step fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use graceful_drain_e2e::kubectl;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use graceful_drain_core::labels::DRAINING_LABEL;
use graceful_drain_core::runtime::Shutdown;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec, wait_for};
use kube_sim::traffic::TrafficConfig;
use kube_sim::traffic::timeline::EventKind;

/// Bound for any convergence in these tests; runs take a few seconds.
const TIMEOUT: Duration = Duration::from_secs(30);

fn init() {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
}

async fn cluster(cfg: ClusterConfig) -> Cluster {
    init();
    graceful_drain_sim::setup::start(cfg, Shutdown::new())
        .await
        .unwrap()
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

async fn ready_count(cluster: &Cluster, spec: &WebSpec) -> usize {
    web_pods(cluster, spec)
        .await
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordoned_node_gets_no_new_pods() {
    let cluster = cluster(ClusterConfig::default()).await;
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let cordoned = cluster.nodes()[0].clone();
    let on = |pods: &[Pod]| -> BTreeSet<String> {
        pods.iter()
            .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(cordoned.as_str()))
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    };
    let before = on(&web_pods(&cluster, &spec).await);
    graceful_drain_sim::scenario::actions::cordon(&cluster.client(), &cordoned, true)
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), "default");
    let patch = serde_json::json!({"spec": {"replicas": 8}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let spec = WebSpec {
        replicas: 8,
        ..spec
    };
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
    let pods = web_pods(&cluster, &spec).await;
    assert_eq!(on(&pods), before, "no new pod on cordoned node {cordoned}");
    assert_eq!(pods.len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relabelled_pod_leaves_its_replicaset_and_slice_but_keeps_serving() {
    let cluster = cluster(ClusterConfig::default()).await;
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let victim = web_pods(&cluster, &spec).await.remove(0);
    let uid = victim.metadata.uid.clone().unwrap();
    let name = victim.metadata.name.clone().unwrap();
    // What the webhook does on isolation: drop the selected label, add the draining one.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let patch = serde_json::json!({"metadata": {"labels": {"app": null, DRAINING_LABEL: "true"}}});
    pods.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    // The ReplicaSet releases the pod and a replacement comes up; the isolated pod leaves
    // the slice and the load balancer while its app keeps serving.
    wait_for("isolated pod released and replaced", TIMEOUT, || async {
        let released = pods
            .get(&name)
            .await
            .unwrap()
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty();
        released && ready_count(&cluster, &spec).await == 2
    })
    .await
    .unwrap();
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
    let isolated = pods.get(&name).await.unwrap();
    assert_eq!(isolated.metadata.uid.as_deref(), Some(uid.as_str()));
    assert!(
        isolated
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty(),
        "released by its ReplicaSet"
    );
    assert!(
        isolated.metadata.deletion_timestamp.is_none(),
        "nobody deleted it"
    );
    let slices: Api<EndpointSlice> = Api::namespaced(cluster.client(), "default");
    let slice = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap()
        .items
        .remove(0);
    assert!(
        slice
            .endpoints
            .iter()
            .all(|e| e.target_ref.as_ref().unwrap().uid.as_deref() != Some(uid.as_str()))
    );
    assert!(
        cluster.apps().accepting(&uid),
        "the isolated pod's app still serves"
    );
    // Deleting it then runs the normal termination: the object goes once the app exits.
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    wait_for("isolated pod gone", TIMEOUT, || async {
        pods.get_opt(&name).await.unwrap().is_none()
    })
    .await
    .unwrap();
    assert!(!cluster.apps().accepting(&uid));
    let pods = web_pods(&cluster, &spec).await;
    let names: Vec<_> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(ready_count(&cluster, &spec).await, 2, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_replaces_every_pod() {
    let cluster = cluster(ClusterConfig::default()).await;
    let spec = WebSpec::default();
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let before: BTreeSet<String> = web_pods(&cluster, &spec)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    graceful_drain_sim::scenario::actions::rollout(&cluster.client(), &spec, TIMEOUT)
        .await
        .unwrap();
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
    let after: BTreeSet<String> = web_pods(&cluster, &spec)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    assert_eq!(after.len(), 4);
    assert!(before.is_disjoint(&after), "every pod was replaced");
    let sets: Api<ReplicaSet> = Api::namespaced(cluster.client(), "default");
    let sets = sets.list(&ListParams::default()).await.unwrap().items;
    let mut replicas: Vec<i32> = sets
        .iter()
        .map(|r| r.spec.as_ref().unwrap().replicas.unwrap())
        .collect();
    replicas.sort();
    assert_eq!(
        replicas,
        vec![0, 4],
        "old ReplicaSet scaled to zero, new one to four"
    );
    let d: Deployment = Api::namespaced(cluster.client(), "default")
        .get("web")
        .await
        .unwrap();
    let status = d.status.unwrap();
    assert_eq!(
        (status.updated_replicas, status.available_replicas),
        (Some(4), Some(4))
    );
    assert_eq!(status.observed_generation, d.metadata.generation);
}

/// The `simulate --serve` process, killed when dropped.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubectl_against_serve() {
    if !kubectl::available("real_kubectl_against_serve") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain-e2e"))
        .args(["simulate", "--serve", "--kubeconfig-out"])
        .arg(&kc)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _served = Served(child);
    wait_for("kubeconfig written", Duration::from_secs(60), || async {
        kc.exists()
    })
    .await
    .unwrap();

    let (ok, nodes) = kubectl::run(&kc, &["get", "nodes"]).outcome();
    assert!(
        ok && nodes.contains("worker-1") && nodes.contains("worker-2"),
        "{nodes}"
    );
    let (ok, pods) = kubectl::run(
        &kc,
        &["get", "pods", "-o", "jsonpath={.items[*].status.phase}"],
    )
    .outcome();
    assert!(ok && pods.matches("Running").count() == 4, "{pods}");

    let (ok, lb) = kubectl::run(
        &kc,
        &[
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[0].hostname}",
        ],
    )
    .outcome();
    assert!(ok && lb == "web.default.lb.sim", "{lb}");
    let (ok, out) = kubectl::run(&kc, &["cordon", "worker-1"]).outcome();
    assert!(ok && out.contains("cordoned"), "{out}");
    let (ok, node) = kubectl::run(
        &kc,
        &[
            "get",
            "node",
            "worker-1",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ],
    )
    .outcome();
    assert!(ok && node == "true", "{node}");

    let manifest = dir.path().join("cm.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\ndata:\n  a: b\n",
    )
    .unwrap();
    let (ok, out) = kubectl::run(&kc, &["apply", "-f", manifest.to_str().unwrap()]).outcome();
    assert!(ok, "{out}");
    let (ok, out) = kubectl::run(&kc, &["delete", "configmap", "probe"]).outcome();
    assert!(ok && out.contains("deleted"), "{out}");

    let (ok, out) = kubectl::run(
        &kc,
        &["drain", "worker-1", "--ignore-daemonsets", "--timeout=60s"],
    )
    .outcome();
    assert!(ok && out.contains("drained"), "{out}");
    let (ok, left) = kubectl::run(
        &kc,
        &[
            "get",
            "pods",
            "--field-selector",
            "spec.nodeName=worker-1",
            "-o",
            "name",
        ],
    )
    .outcome();
    assert!(
        ok && left.trim().is_empty(),
        "pods left on worker-1: {left}"
    );
    // The Deployment is whole again on the other nodes.
    let (ok, ready) = kubectl::run(
        &kc,
        &[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.status.availableReplicas}",
        ],
    )
    .outcome();
    assert!(ok, "{ready}");
    let (ok, out) = kubectl::run(&kc, &["uncordon", "worker-1"]).outcome();
    assert!(ok && out.contains("uncordoned"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_drain_under_deregistration_lag_yields_5xx() {
    let cluster = cluster(ClusterConfig::default()).await;
    let spec = WebSpec::default();
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let node = cluster.nodes()[0].clone();
    let client = cluster.client();
    let before = graceful_drain_sim::scenario::actions::pods_on(&client, &node)
        .await
        .unwrap();
    assert!(!before.is_empty(), "the first node runs some of the pods");
    let traffic = cluster.traffic(
        &spec,
        TrafficConfig {
            rate: 200.0,
            request_duration: Duration::from_millis(5),
            max_requests: 10_000,
            max_duration: TIMEOUT,
        },
    );
    graceful_drain_sim::scenario::actions::plain_drain(&client, &node, TIMEOUT)
        .await
        .unwrap();
    assert!(
        graceful_drain_sim::scenario::actions::pods_on(&client, &node)
            .await
            .unwrap()
            .is_empty()
    );
    // Requests keep reaching the evicted pods until the load balancer deregisters them.
    wait_for("5xx to show", TIMEOUT, || async {
        traffic.counts().errors_5xx > 0
    })
    .await
    .unwrap();
    cluster.wait_web_ready(&spec, TIMEOUT).await.unwrap();
    let report = traffic.stop().await;
    assert!(
        report.errors_5xx > 0 && report.errors_5xx < report.requests,
        "{} of {}",
        report.errors_5xx,
        report.requests
    );
    let evicted: BTreeSet<String> = before
        .iter()
        .map(|p| format!("default/{}", p.metadata.name.clone().unwrap()))
        .collect();
    let bursts: Vec<_> = report
        .timeline
        .iter()
        .filter(|e| e.kind == EventKind::Burst5xx)
        .collect();
    assert!(!bursts.is_empty());
    assert!(
        bursts
            .iter()
            .all(|b| evicted.iter().any(|p| b.subject.contains(p.as_str()))),
        "5xx come from the evicted pods: {bursts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pdb_makes_eviction_answer_429() {
    let cluster = cluster(ClusterConfig::default()).await;
    let spec = WebSpec {
        replicas: 3,
        min_available: 2,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "default");
    let status = || async { pdbs.get("web").await.unwrap().status.unwrap_or_default() };
    wait_for("pdb observed", TIMEOUT, || async {
        status().await.disruptions_allowed == 1
    })
    .await
    .unwrap();
    let s = status().await;
    assert_eq!(
        (s.current_healthy, s.desired_healthy, s.expected_pods),
        (3, 2, 3)
    );
    assert_eq!(
        s.observed_generation,
        pdbs.get("web").await.unwrap().metadata.generation
    );
    let pods = web_pods(&cluster, &spec).await;
    let evict = |pod: &Pod| {
        let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
        let name = pod.metadata.name.clone().unwrap();
        let body = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}});
        async move {
            pods.create_subresource::<_, serde_json::Value>(
                "eviction",
                &name,
                &Default::default(),
                &body,
            )
            .await
        }
    };
    evict(&pods[0]).await.unwrap();
    match evict(&pods[1]).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("second eviction should be refused: {other:?}"),
    }
    // Once the replacement is ready the budget allows one disruption again.
    wait_for("budget back", TIMEOUT, || async {
        status().await.disruptions_allowed == 1
    })
    .await
    .unwrap();
    assert_eq!(ready_count(&cluster, &spec).await, 3);
    evict(&pods[1]).await.unwrap();
}

/// The disruption controller's `disruptedPods` timeout is a setting: a pod recorded as
/// disrupted but never deleted counts as healthy again once it passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disrupted_pod_never_deleted_counts_again_after_the_configured_timeout() {
    let cluster = cluster(ClusterConfig {
        disruption_timeout: Duration::from_secs(2),
        ..ClusterConfig::default()
    })
    .await;
    let spec = WebSpec {
        replicas: 3,
        min_available: 2,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "default");
    let status = || async { pdbs.get("web").await.unwrap().status.unwrap_or_default() };
    wait_for("pdb observed", TIMEOUT, || async {
        status().await.disruptions_allowed == 1
    })
    .await
    .unwrap();
    // Record a disruption as an eviction would, without deleting the pod.
    let victim = web_pods(&cluster, &spec).await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let now = jiff::Timestamp::now().to_string();
    let recorded = serde_json::json!({"status": {"disruptionsAllowed": 0,
        "disruptedPods": {victim.clone(): now}}});
    let started = Instant::now();
    pdbs.patch_status("web", &PatchParams::default(), &Patch::Merge(recorded))
        .await
        .unwrap();
    let s = status().await;
    assert!(s.disrupted_pods.unwrap_or_default().contains_key(&victim));
    wait_for("disruption expired", TIMEOUT, || async {
        let s = status().await;
        s.disrupted_pods.is_none_or(|d| d.is_empty())
            && s.current_healthy == 3
            && s.disruptions_allowed == 1
    })
    .await
    .unwrap();
    // Counted until the timeout passed (the record has a one-second resolution).
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// What a person sees of `simulate`: progress on stderr, the table and a verdict on
/// stdout, and the components' logs in the file stderr names; no error anywhere, the
/// teardown included.
#[test]
fn simulate_shows_progress_table_and_verdict_and_keeps_component_logs_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain-e2e"))
        .arg("simulate")
        // The default log file goes under the temporary directory.
        .env("TMPDIR", tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let both = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{both}");

    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("scenario  protection"), "{both}");
    for (scenario, protection) in [
        ("drain", "none"),
        ("drain", "graceful-drain"),
        ("rollout", "none"),
        ("rollout", "graceful-drain"),
    ] {
        assert!(
            lines[1..5].iter().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells[..2] == [scenario, protection]
            }),
            "row {scenario} / {protection}: {both}"
        );
    }
    assert!(
        lines[5].starts_with("verdict: with graceful-drain 0 5xx in every scenario (without: "),
        "{both}"
    );

    let log = stderr
        .lines()
        .find_map(|l| l.strip_prefix("component logs: "))
        .unwrap_or_else(|| panic!("stderr names the log file: {both}"));
    let log = std::path::Path::new(log);
    assert!(log.starts_with(tmp.path()), "{both}");
    let logged = std::fs::read_to_string(log).unwrap();
    assert!(
        logged.contains("graceful_drain_webhook"),
        "the webhook logs to the file: {logged}"
    );
    for phase in ["drain", "rollout"] {
        for protection in ["without", "with"] {
            let started = format!("running {phase} {protection} graceful-drain…");
            let done = format!("{phase} {protection} graceful-drain: done in ");
            assert!(stderr.lines().any(|l| l == started), "{started}: {both}");
            assert!(
                stderr.lines().any(|l| l.starts_with(&done)),
                "{done}: {both}"
            );
        }
    }
    assert!(
        !stderr.contains("graceful_drain_"),
        "no component log on the console: {both}"
    );
    assert!(!both.contains("ERROR"), "{both}");
    assert!(
        !logged.contains("ERROR"),
        "a clean teardown logs no error: {logged}"
    );
}
