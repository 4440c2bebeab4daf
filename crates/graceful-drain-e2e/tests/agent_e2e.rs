//! The node agent on the simulated cluster: a node carrying a PDB-protected Deployment, a
//! DaemonSet pod, a mirror pod, an emptyDir pod and a bare pod is drained with the same
//! options as a real `kubectl drain --dry-run=client` against the same cluster, and each
//! pod must be handled as kubectl would; a PDB that blocks evictions is retried and
//! reported (Event + condition message) until it allows them. A second scenario drives
//! the agent the production way: LifecycleEvents through the lifecycle reconciler; a third
//! runs it with the real webhook and checks isolated pods count as remaining. The second
//! and third run on both tiers (`graceful_drain_e2e::tier`): the simulated cluster and a
//! real control plane, the agent acting as the chart's ServiceAccount under its RBAC.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use graceful_drain_e2e::kubectl;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use graceful_drain_agent::{self as agent, Args};
use graceful_drain_core::labels::agent_reason;
use graceful_drain_core::lifecycle::{LifecycleEvent, LifecycleEventSpec};
use graceful_drain_core::runtime::Shutdown;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Event, Node, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec, wait_for};
use serde_json::json;

use graceful_drain_core::proto::registration::RegistrationStatus;
use graceful_drain_core::proto::registration::registration_client::RegistrationClient;
use graceful_drain_e2e::kubelet::{Kubelet, connect};
use graceful_drain_e2e::tier::{TestCluster, Tier};
use graceful_drain_sim::command::AgentCommand;

/// Bound for any convergence in these tests.
const TIMEOUT: Duration = Duration::from_secs(60);
const NODE: &str = "worker-1";
/// The agent's identity on the simulated API server (its requests are counted per user).
const AGENT_USER: &str = "system:serviceaccount:graceful-drain:node-agent";
/// The chart's node-agent ServiceAccount, which the real tier's RBAC knows.
const CHART_AGENT_USER: &str = graceful_drain_sim::scenario::components::AGENT_USER;

fn args(dir: &Path, flags: &[&str]) -> Args {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let command = AgentCommand::new(NODE, dir).with(flags);
    Cli::try_parse_from(command.argv()).unwrap().args
}

fn two_nodes() -> ClusterConfig {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    ClusterConfig {
        nodes: 2,
        ..ClusterConfig::default()
    }
}

async fn cluster() -> Cluster {
    graceful_drain_sim::setup::start(two_nodes(), Shutdown::new())
        .await
        .unwrap()
}

/// Two nodes on `tier`; `None` when the real tier is not available here.
async fn tiered(tier: Tier) -> Option<TestCluster> {
    TestCluster::start(tier, two_nodes()).await.unwrap()
}

fn pod_on_node(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "c", "image": "registry.example/app:1"}]},
    }))
    .unwrap()
}

fn owned_by(mut pod: Pod, kind: &str, api_version: &str, name: &str, uid: &str) -> Pod {
    pod.metadata.owner_references =
        Some(vec![serde_json::from_value(json!({
        "apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true,
    }))
    .unwrap()]);
    pod
}

/// Puts a DaemonSet pod (made by the simulated DaemonSet controller), a mirror pod, an
/// emptyDir (Job) pod and a bare pod on `NODE`, next to the two web replicas the
/// least-loaded scheduler placed there. Returns the DaemonSet pod's name.
async fn mixed_node(cluster: &Cluster) -> String {
    let client = cluster.client();
    let pp = PostParams::default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "proxy", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "proxy"}},
                 "template": {"metadata": {"labels": {"app": "proxy"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
    .unwrap();
    let ds = Api::<DaemonSet>::namespaced(client.clone(), "default")
        .create(&pp, &ds)
        .await
        .unwrap();
    let ds_uid = ds.metadata.uid.unwrap();
    let daemon_pod = || async {
        let on_node = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
        pods.list(&on_node)
            .await
            .ok()?
            .items
            .into_iter()
            .find_map(|p| {
                let owned = p
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.uid == ds_uid && r.controller == Some(true));
                owned.then(|| p.metadata.name.unwrap_or_default())
            })
    };
    wait_for("the DaemonSet's pod on the node", TIMEOUT, || async {
        daemon_pod().await.is_some()
    })
    .await
    .unwrap();
    let daemon = daemon_pod().await.unwrap();
    let mut mirror = pod_on_node("etcd-worker-1");
    mirror.metadata.annotations =
        Some([("kubernetes.io/config.mirror".to_string(), "h".to_string())].into());
    pods.create(&pp, &mirror).await.unwrap();
    let job = Job {
        metadata: serde_json::from_value(json!({"name": "cache", "namespace": "default"})).unwrap(),
        spec: Some(JobSpec {
            template: PodTemplateSpec {
                spec: Some(PodSpec::default()),
                ..PodTemplateSpec::default()
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    };
    let job = Api::<Job>::namespaced(client.clone(), "default")
        .create(&pp, &job)
        .await
        .unwrap();
    let mut cache = owned_by(
        pod_on_node("cache-0"),
        "Job",
        "batch/v1",
        "cache",
        &job.metadata.uid.unwrap(),
    );
    cache.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(json!({"name": "scratch", "emptyDir": {}})).unwrap(),
    ]);
    pods.create(&pp, &cache).await.unwrap();
    pods.create(&pp, &pod_on_node("bare")).await.unwrap();
    daemon
}

async fn pods_on_node(client: &kube::Client) -> BTreeSet<String> {
    let api: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
    api.list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.metadata.name.clone().unwrap())
        .collect()
}

/// Pod names kubectl says it would evict (`evicting pod default/x (dry run)`).
fn kubectl_evictions(output: &str) -> BTreeSet<String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("evicting pod "))
        .map(|rest| {
            rest.split_whitespace()
                .next()
                .unwrap()
                .trim_start_matches("default/")
                .to_string()
        })
        .collect()
}

/// Creates the LifecycleEvent a scripted kubelet drives (no reconciler claims it here).
async fn lifecycle_event(admin: &kube::Client, name: &str, transition: &str) {
    let event = LifecycleEvent::new(
        name,
        LifecycleEventSpec {
            transition_name: transition.into(),
            binding_node: NODE.into(),
        },
    );
    Api::<LifecycleEvent>::all(admin.clone())
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

/// A plain HTTP/1.1 GET on the admin port; the whole response.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

fn condition_message(node: &Node, type_: &str) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .and_then(|c| c.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_each_kind_of_pod_like_kubectl_and_waits_out_a_blocking_pdb() {
    if !kubectl::available("drains_each_kind_of_pod_like_kubectl_and_waits_out_a_blocking_pdb") {
        return;
    }
    let cluster = cluster().await;
    let web = WebSpec {
        replicas: 4,
        // No disruption allowed at first: the web evictions must be retried and reported.
        min_available: 4,
        grace_period_seconds: 5,
        ..WebSpec::default()
    };
    cluster.deploy_web(&web, TIMEOUT).await.unwrap();
    let daemon = mixed_node(&cluster).await;
    let admin = cluster.client();
    let before = pods_on_node(&admin).await;
    let web_here: BTreeSet<String> = before
        .iter()
        .filter(|n| n.starts_with("web-"))
        .cloned()
        .collect();
    assert_eq!(
        web_here.len(),
        2,
        "least-loaded placement puts 2 of 4 replicas here: {before:?}"
    );

    // What kubectl does with the same options.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster
        .api()
        .write_kubeconfig(&kubeconfig, "admin")
        .unwrap();
    let (ok, strict) = kubectl::run(
        &kubeconfig,
        &["drain", NODE, "--ignore-daemonsets", "--dry-run=client"],
    )
    .outcome();
    assert!(!ok, "kubectl refuses: {strict}");
    let (ok, lax) = kubectl::run(
        &kubeconfig,
        &[
            "drain",
            NODE,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
            "--dry-run=client",
        ],
    )
    .outcome();
    assert!(ok, "{lax}");
    let kubectl_evicts = kubectl_evictions(&lax);
    let mut expected: BTreeSet<String> = web_here.clone();
    expected.extend(["cache-0".to_string(), "bare".to_string()]);
    assert_eq!(kubectl_evicts, expected, "{lax}");

    // The agent with kubectl's default refusals: the transition fails naming the same pods,
    // before any eviction. The scripted kubelet drives event ev-1, which must exist: a
    // drain lives only as long as its event.
    lifecycle_event(&admin, "ev-1", "graceful-drain").await;
    let client = cluster.api().client(AGENT_USER);
    let shutdown = Shutdown::new();
    let started = agent::start(
        args(dir.path(), &["--lifecycle-reconciler", "off"]),
        client.clone(),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    let refused = kubelet.end_until("graceful-drain", "drain-complete").await;
    for needle in [
        "cannot delete Pods with local storage",
        "default/cache-0",
        "cannot delete Pods that declare no controller",
        "default/bare",
    ] {
        assert!(
            refused.error.contains(needle),
            "{needle} in {}",
            refused.error
        );
        assert!(
            strict.contains(needle.trim_start_matches("default/")),
            "kubectl agrees on {needle}: {strict}"
        );
    }
    assert_eq!(cluster.api().stats().count("create", "pods/eviction"), 0);
    shutdown.cancel();
    started.wait().await;

    // With --delete-emptydir-data --force: same pods as kubectl, web ones blocked by the PDB.
    let shutdown = Shutdown::new();
    let flags = [
        "--lifecycle-reconciler",
        "off",
        "--delete-emptydir-data",
        "--force",
    ];
    let started = agent::start(args(dir.path(), &flags), client.clone(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    assert_eq!(
        kubelet
            .start("graceful-drain", NODE)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    let blocked = "2 pods remaining: 2 blocked by PDB default/web";
    wait_for("the PDB block on the Node condition", TIMEOUT, || async {
        let node = nodes.get(NODE).await.unwrap();
        condition_message(&node, "DrainInProgress").as_deref() == Some(blocked)
    })
    .await
    .unwrap();
    assert_eq!(
        kubelet
            .end("graceful-drain", false)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let events = events.list(&ListParams::default()).await.unwrap().items;
    let reported: Vec<&str> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(agent_reason::EVICTION_BLOCKED))
        .filter_map(|e| e.message.as_deref())
        .collect();
    for pod in &web_here {
        assert!(
            reported
                .iter()
                .any(|m| m.contains(&format!("default/{pod}")) && m.contains("PDB default/web")),
            "{pod} in {reported:?}"
        );
    }

    // The PDB relents: the drain completes.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "default");
    let relax = Patch::Merge(json!({"spec": {"minAvailable": 3}}));
    pdbs.patch("web", &PatchParams::default(), &relax)
        .await
        .unwrap();
    let done = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert_eq!(
        (done.lifecycle_condition.as_str(), done.error.as_str()),
        ("drain-complete", "")
    );

    let after = pods_on_node(&admin).await;
    assert_eq!(
        after,
        ["etcd-worker-1".to_string(), daemon].into(),
        "DaemonSet and mirror pods stay, everything else is gone"
    );
    let evicted: BTreeSet<String> = before.difference(&after).cloned().collect();
    assert_eq!(
        evicted, kubectl_evicts,
        "the agent evicted exactly what kubectl would"
    );
    let node = nodes.get(NODE).await.unwrap();
    assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    assert!(
        condition_message(&node, "Drained")
            .unwrap()
            .contains("4 pods evicted, 2 skipped")
    );
    cluster.wait_web_ready(&web, TIMEOUT).await.unwrap();

    let stats = cluster.api().stats();
    let requests = stats.of_user(AGENT_USER, &[]);
    println!(
        "agent API requests: {requests} for {} drained pods",
        evicted.len()
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_events_drain_and_return_the_node_through_the_reconciler() {
    lifecycle_events_drain_and_return_the_node(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_lifecycle_events_drain_and_return_the_node_through_the_reconciler() {
    lifecycle_events_drain_and_return_the_node(Tier::Real).await;
}

async fn lifecycle_events_drain_and_return_the_node(tier: Tier) {
    let Some(cluster) = tiered(tier).await else {
        return;
    };
    let web = WebSpec {
        replicas: 4,
        min_available: 3,
        grace_period_seconds: 5,
        ..WebSpec::default()
    };
    cluster.deploy_web(&web, TIMEOUT).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = cluster
        .client_on_node(CHART_AGENT_USER, NODE)
        .await
        .unwrap();
    let shutdown = Shutdown::new();
    // `auto` sees the CRDs the simulator installs: the reconciler runs, so a kubelet that
    // refuses SLM plugins (its gate is off) does not make the agent unready.
    let flags = ["--lifecycle-reconciler", "auto", "--lifecycle-tick", "1s"];
    let started = agent::start(args(dir.path(), &flags), client, shutdown.clone())
        .await
        .unwrap();
    let mut reg = RegistrationClient::new(connect(started.registration_socket.clone()).await);
    let refusal = RegistrationStatus {
        plugin_registered: false,
        error: "no handler registered for plugin type: SLMPlugin".into(),
    };
    reg.notify_registration_status(refusal).await.unwrap();
    let admin = cluster.client();
    let events: Api<LifecycleEvent> = Api::all(admin.clone());
    let nodes: Api<Node> = Api::all(admin.clone());
    let transition_reason = |node: &Node| {
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "LifecycleTransition"))
            .and_then(|c| c.reason.clone())
    };

    for (name, transition, end) in [
        ("drain-w1", "graceful-drain", "drain-complete"),
        (
            "back-w1",
            "graceful-maintenance-complete",
            "maintenance-complete",
        ),
    ] {
        // The agent publishes its transitions at start; the event needs them.
        let event = LifecycleEvent::new(
            name,
            LifecycleEventSpec {
                transition_name: transition.into(),
                binding_node: NODE.into(),
            },
        );
        let transitions: Api<graceful_drain_core::lifecycle::LifecycleTransition> =
            Api::all(admin.clone());
        wait_for("transition published", TIMEOUT, || async {
            matches!(transitions.get_opt(transition).await, Ok(Some(_)))
        })
        .await
        .unwrap();
        events.create(&PostParams::default(), &event).await.unwrap();
        wait_for(&format!("{name} to end with {end}"), TIMEOUT, || async {
            let node = nodes.get(NODE).await.unwrap();
            transition_reason(&node).as_deref() == Some(end)
        })
        .await
        .unwrap();
        wait_for(
            &format!("{name} concluded and deleted"),
            TIMEOUT,
            || async { matches!(events.get_opt(name).await, Ok(None)) },
        )
        .await
        .unwrap();
        if transition == "graceful-drain" {
            let left: Vec<String> = pods_on_node(&admin)
                .await
                .into_iter()
                .filter(|n| n.starts_with("web-"))
                .collect();
            assert!(
                left.is_empty(),
                "web pods left on the drained node: {left:?}"
            );
            let node = nodes.get(NODE).await.unwrap();
            assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
        }
    }
    let node = nodes.get(NODE).await.unwrap();
    assert_ne!(
        node.spec.as_ref().unwrap().unschedulable,
        Some(true),
        "back in service"
    );
    let ready = http_get(started.admin_addr, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_isolated_by_the_webhook_count_as_remaining_until_deleted() {
    isolated_pods_count_as_remaining(Tier::Simulated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_pods_isolated_by_the_webhook_count_as_remaining_until_deleted() {
    isolated_pods_count_as_remaining(Tier::Real).await;
}

async fn isolated_pods_count_as_remaining(tier: Tier) {
    use graceful_drain_sim::scenario::actions;
    use graceful_drain_sim::scenario::components::{Components, ComponentsConfig};
    let Some(cluster) = tiered(tier).await else {
        return;
    };
    // The webhook holds each evicted pod this long for the load balancers: long enough
    // that the agent's progress (rewritten every 5 s) shows the pods isolated.
    let delay = Duration::from_secs(8);
    let cfg = ComponentsConfig {
        deregistration_delay: delay,
        timeout_seconds: 10,
        agent_program: None,
        confirmed_release: false,
        balancer_stats: None,
    };
    let mut components = Components::start(&cluster, &cfg).await.unwrap();
    let web = WebSpec {
        replicas: 4,
        min_available: 2,
        grace_period_seconds: 5,
        ..WebSpec::default()
    };
    cluster.deploy_web(&web, TIMEOUT).await.unwrap();
    let admin = cluster.client();
    let drain = tokio::spawn({
        let admin = admin.clone();
        async move { actions::lifecycle_drain(&admin, NODE, TIMEOUT).await }
    });
    // Every version of the Node the drain wrote, from a watch, until the drain is done.
    let nodes: Api<Node> = Api::all(admin.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={NODE}"));
    let versions = watcher(nodes, config).default_backoff().applied_objects();
    let mut versions = std::pin::pin!(versions);
    let mut drain = std::pin::pin!(drain);
    let mut messages = Vec::new();
    let drained = loop {
        tokio::select! {
            drained = &mut drain => break drained,
            node = versions.next() => {
                let node = node.expect("the Node watch ended").unwrap();
                if let Some(message) = condition_message(&node, "DrainInProgress")
                    && messages.last() != Some(&message)
                {
                    messages.push(message);
                }
            }
        }
    };
    drained.unwrap().unwrap();
    assert!(
        messages.iter().any(|m| m.contains("isolated")),
        "the condition showed isolated pods: {messages:?}"
    );
    let left: Vec<String> = pods_on_node(&admin)
        .await
        .into_iter()
        .filter(|n| n.starts_with("web-"))
        .collect();
    assert!(
        left.is_empty(),
        "drain-complete with web pods left: {left:?}"
    );
    components.check().await.unwrap();
}
