//! The node agent over real unix sockets, with a test playing the kubelet (registration
//! handshake, then the SLM Start/End loop) against the simulated API server
//! (`graceful_drain_e2e::sim_api`), whose requests from the agent are recorded: drains to
//! `drain-complete`, PDB-blocked evictions are retried and reported, filter refusals fail
//! the transition, a restarted agent resumes a drain, and the RPCs answer even when the
//! API server hangs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use graceful_drain_agent as agent;
use graceful_drain_core::labels::{
    DRAIN_EVENT_ANNOTATION, LAST_POD_SELECTOR_ANNOTATION, TIERS_ANNOTATION, agent_reason,
};
use graceful_drain_core::proto::registration::RegistrationStatus;
use graceful_drain_core::proto::registration::registration_client::RegistrationClient;
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_testing::fixtures::{PdbFixture, PodFixture, pdb, pod};
use http::Method;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{Node, PodTemplateSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube_sim::apiserver::{Faults, Forbidden};
use serde_json::{Value, json};

mod agent_support {
    pub mod harness;
}
use agent_support::harness::{args, condition, node_json};
use graceful_drain_e2e::kubelet::{DEADLINE, Kubelet, connect};
use graceful_drain_e2e::sim_api::{AGENT_USER, EVENT, NODE, SHOP, SimApi, shop_pod};
use graceful_drain_testing::eventually::{eventually, eventually_some};
use std::future::ready;

async fn readyz(addr: std::net::SocketAddr) -> (u16, String) {
    get(addr, "/readyz").await
}

/// A plain HTTP/1.1 GET on the admin port: (status, whole response).
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let code = text[9..12].parse().unwrap();
    (code, text)
}

/// The node of the first test: web-1 and web-2 (ReplicaSet pods, gone at once when
/// evicted), web-2 protected by PDB `web-pdb` with no disruption allowed; a DaemonSet pod
/// and a mirror pod, which stay. Returns the web pods' UIDs by name.
async fn mixed_node(api: &SimApi) -> Vec<(String, String)> {
    let web = |name: &str| {
        shop_pod(name)
            .label("app", "web")
            .owned_by_rs("web")
            .grace_period(0)
    };
    let web_1 = api.create(web("web-1")).await;
    // The budget protects web-2 only, so web-1 goes at its first eviction.
    let web_2 = api.create(web("web-2").label("role", "primary")).await;
    let budget = pdb("web-pdb")
        .ns(SHOP)
        .selecting(&[("app", "web"), ("role", "primary")])
        .min_available(1);
    api.create(budget).await;
    // What the disruption controller writes for one healthy pod that must stay.
    let blocked = json!({"observedGeneration": 1, "disruptionsAllowed": 0,
        "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1});
    api.patch_status::<PodDisruptionBudget>(Some(SHOP), "web-pdb", blocked)
        .await;
    api.create(proxy_daemon_set()).await;
    let proxy = pod("proxy-1")
        .ns("kube-system")
        .on_node(NODE)
        .container("registry.example/proxy:1")
        .owned_by("DaemonSet", "proxy");
    api.create(proxy).await;
    let mirror = pod("etcd-n1")
        .ns("kube-system")
        .on_node(NODE)
        .container("registry.example/etcd:1")
        .annotate("kubernetes.io/config.mirror", "hash");
    api.create(mirror).await;
    [web_1, web_2]
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap()))
        .collect()
}

/// DaemonSet `kube-system/proxy`, owner of pod proxy-1.
fn proxy_daemon_set() -> DaemonSet {
    let labels = graceful_drain_testing::fixtures::labels(&[("app", "proxy")]);
    DaemonSet {
        metadata: ObjectMeta {
            name: Some("proxy".into()),
            namespace: Some("kube-system".into()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: pod("t").container("registry.example/proxy:1").spec,
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_drives_a_drain_to_completion_and_back_to_service() {
    graceful_drain_core::runtime::init_tracing(Default::default());
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    let uids = mixed_node(&api).await;
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let admin = started.admin_addr;
    let reg_socket = started.registration_socket.clone();
    let agent_state = started.agent.clone();
    let running = tokio::spawn(started.wait());
    let mut kubelet = Kubelet::register(&reg_socket, NODE).await;

    // Both transitions are published for all nodes with our driver; /readyz follows.
    api.until("transitions published", || async {
        api.transitions().await.len() == 2
    })
    .await;
    let transitions = api.transitions().await;
    let t = transitions
        .iter()
        .find(|t| t.name_any() == "graceful-drain")
        .unwrap();
    assert_eq!(t.spec.all_nodes, Some(true));
    assert_eq!(t.spec.driver, "graceful-drain.io");
    assert_eq!(t.spec.sla.as_deref(), Some("15m0s"));
    eventually("the agent ready", || async { readyz(admin).await.0 == 200 }).await;

    let started = kubelet.start("graceful-drain", NODE).await;
    assert_eq!(
        (started.lifecycle_condition.as_str(), started.error.as_str()),
        ("drain-started", "")
    );
    assert_eq!(started.node_name, NODE);
    // Start is idempotent.
    assert_eq!(
        kubelet
            .start("graceful-drain", NODE)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    // Two refusals of web-2, then the budget allows one disruption, as the disruption
    // controller writes once a replacement turned ready (the agent waits at least a
    // second before its third attempt).
    let refused = |r: &graceful_drain_e2e::sim_api::Recorded| r.pod() == "web-2" && r.code == 429;
    api.until("two refusals of web-2", || async {
        api.evictions().iter().filter(|r| refused(r)).count() == 2
    })
    .await;
    let relaxed = json!({"disruptionsAllowed": 1, "currentHealthy": 2});
    api.patch_status::<PodDisruptionBudget>(Some(SHOP), "web-pdb", relaxed)
        .await;
    let done = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert_eq!(done.error, "");
    assert_eq!(done.lifecycle_condition, "drain-complete");

    let node = node_json(&api).await;
    assert_eq!(node["spec"]["unschedulable"], true);
    assert_eq!(
        node["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"],
        "true"
    );
    assert_eq!(condition(&node, "Drained")["status"], "True");
    assert_eq!(condition(&node, "DrainInProgress")["status"], "False");
    assert_eq!(
        condition(&node, "Ready")["status"],
        "True",
        "other conditions untouched"
    );

    // Evicted: the two web pods (web-2 after two PDB refusals), each with its UID as
    // precondition; the DaemonSet and mirror pods stay.
    let evicted = api.evictions();
    let paths: Vec<&str> = evicted.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths.iter().filter(|p| p.contains("/web-2/")).count(),
        3,
        "{paths:?}"
    );
    assert_eq!(
        paths.iter().filter(|p| p.contains("/web-1/")).count(),
        1,
        "{paths:?}"
    );
    assert!(
        paths.iter().all(|p| p.contains("/shop/pods/web-")),
        "{paths:?}"
    );
    for eviction in &evicted {
        let (_, uid) = uids.iter().find(|(n, _)| n == eviction.pod()).unwrap();
        assert_eq!(eviction.body["deleteOptions"]["preconditions"]["uid"], *uid);
    }
    assert_eq!(api.pod_names().await, ["etcd-n1", "proxy-1"]);
    // The block was reported on the Node, naming the pod and its PDB.
    let blocked = api.events(agent_reason::EVICTION_BLOCKED).await;
    assert_eq!(blocked.len(), 1, "repeats are rate-limited: {blocked:?}");
    let message = blocked[0].message.as_deref().unwrap();
    assert!(
        message.contains("shop/web-2") && message.contains("PDB shop/web-pdb"),
        "{message}"
    );
    assert_eq!(blocked[0].involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(blocked[0].involved_object.name.as_deref(), Some(NODE));
    let snapshot = agent_state.snapshot();
    assert_eq!(snapshot.message, "0 pods remaining: 2 evicted, 2 skipped");
    let (code, status) = get(admin, "/status").await;
    assert_eq!(code, 200);
    let status: Value = serde_json::from_str(status.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(status["operation"], "drain");
    assert_eq!(status["phase"]["phase"], "complete");
    assert_eq!(status["progress"]["done"], 2);
    let (_, metrics) = get(admin, "/metrics").await;
    assert!(
        metrics.contains("graceful_drain_evictions_total{outcome=\"blocked_pdb\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("graceful_drain_evictions_total{outcome=\"evicted\"} 2"),
        "{metrics}"
    );

    // Back to service.
    let answer = kubelet.start("graceful-maintenance-complete", NODE).await;
    assert_eq!(answer.lifecycle_condition, "uncordoning");
    let done = kubelet
        .end_until("graceful-maintenance-complete", "maintenance-complete")
        .await;
    assert_eq!(done.error, "");
    let node = node_json(&api).await;
    assert_eq!(node["spec"]["unschedulable"], false);
    assert!(
        node["metadata"]["labels"]
            .get("node.kubernetes.io/exclude-from-external-load-balancers")
            .is_none()
    );
    assert_eq!(condition(&node, "Drained")["status"], "False");
    assert_eq!(condition(&node, "DrainInProgress")["status"], "False");

    // Shutdown removes the registration socket (deregistration).
    shutdown.cancel();
    running.await.unwrap();
    assert!(!reg_socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_clear_error_and_no_work() {
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    // No kubelet finishes it: once evicted, the pod stays terminating (30 s grace).
    api.create(shop_pod("web-1").label("app", "web").owned_by_rs("web"))
        .await;
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;

    let answer = kubelet.start("firmware-upgrade", NODE).await;
    assert_eq!(answer.lifecycle_condition, "");
    assert!(
        answer
            .error
            .contains("unknown transition \"firmware-upgrade\""),
        "{}",
        answer.error
    );
    let answer = kubelet.start("graceful-drain", "n2").await;
    assert!(
        answer.error.contains("\"n2\"") && answer.error.contains("\"n1\""),
        "{}",
        answer.error
    );
    let answer = kubelet.end("firmware-upgrade", false).await;
    assert!(
        answer.error.contains("firmware-upgrade"),
        "{}",
        answer.error
    );
    assert!(api.evictions().is_empty());
    let patched = api.requests().iter().any(|r| r.method == Method::PATCH);
    assert!(!patched, "no node change for refused requests");

    // An expired SLA stops the drain and fails the transition with a message.
    kubelet.start("graceful-drain", NODE).await;
    api.until("eviction sent", || async { !api.evictions().is_empty() })
        .await;
    let answer = kubelet.end("graceful-drain", true).await;
    assert!(answer.error.contains("SLA"), "{}", answer.error);
    assert!(answer.error.contains(NODE), "{}", answer.error);
    api.until("DrainInProgress stopped", || async {
        condition(&node_json(&api).await, "DrainInProgress")["reason"] == "DrainStopped"
    })
    .await;
    let again = kubelet.end("graceful-drain", false).await;
    assert!(
        again.error.contains("SLA"),
        "a stopped drain stays stopped: {again:?}"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_refusal_fails_the_transition_before_any_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    api.create(shop_pod("web-1").label("app", "web").owned_by_rs("web"))
        .await;
    api.create(shop_pod("bare").label("app", "bare")).await;
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    let answer = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert!(
        answer
            .error
            .contains("cannot delete Pods that declare no controller")
            && answer.error.contains("shop/bare"),
        "{}",
        answer.error
    );
    assert!(api.evictions().is_empty(), "nothing evicted");
    let node = node_json(&api).await;
    let cond = condition(&node, "DrainInProgress");
    assert_eq!(cond["reason"], "DrainFailed");
    assert!(cond["message"].as_str().unwrap().contains("shop/bare"));
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_resumes_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    // Evicted pods stay terminating (30 s grace) until the test plays the kubelet.
    for name in ["web-1", "web-2"] {
        api.create(shop_pod(name).label("app", "web").owned_by_rs("web"))
            .await;
    }

    let first = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), first.clone())
        .await
        .unwrap();
    let reg_socket = started.registration_socket.clone();
    let running = tokio::spawn(started.wait());
    let mut kubelet = Kubelet::register(&reg_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    api.until("both evicted", || async { api.evictions().len() == 2 })
        .await;
    // The pods are terminating: the drain is not done.
    assert_eq!(
        kubelet
            .end("graceful-drain", false)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    api.until("progress on the Node", || async {
        let node = node_json(&api).await;
        condition(&node, "DrainInProgress")["message"] == "2 pods remaining: 2 terminating"
    })
    .await;
    first.cancel();
    running.await.unwrap();
    assert!(!reg_socket.exists(), "deregistered");
    let node = node_json(&api).await;
    assert_eq!(
        node["metadata"]["annotations"][DRAIN_EVENT_ANNOTATION], EVENT,
        "the drain names its event on the Node"
    );
    // Its event (ev-1) is still claimed and within its SLA.

    // A new agent finds cordoned + DrainInProgress and resumes without a Start.
    let second = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), second.clone())
        .await
        .unwrap();
    let resumed = started.agent.clone();
    eventually("drain resumed", || {
        ready(resumed.phase(agent::OpKind::Drain).is_some())
    })
    .await;
    api.finish_terminating().await;
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    let done = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert_eq!(done.error, "");
    assert_eq!(done.lifecycle_condition, "drain-complete");
    let node = node_json(&api).await;
    assert_eq!(condition(&node, "Drained")["status"], "True");
    second.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpcs_answer_while_the_api_server_hangs() {
    let dir = tempfile::tempdir().unwrap();
    // The agent's requests are never answered.
    let api = SimApi::start(Faults {
        hung_users: vec![AGENT_USER.into()],
        ..Faults::default()
    })
    .await;
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    // Kubelet::start/end fail the test if no answer comes (bounded wait).
    assert_eq!(
        kubelet
            .start("graceful-drain", NODE)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    assert_eq!(
        kubelet
            .end("graceful-drain", false)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    assert_eq!(
        kubelet
            .start("graceful-maintenance-complete", NODE)
            .await
            .lifecycle_condition,
        "uncordoning"
    );
    assert_eq!(
        kubelet
            .end("graceful-maintenance-complete", false)
            .await
            .lifecycle_condition,
        "uncordoning"
    );
    assert!(api.requests().is_empty(), "no request was answered");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_shows_on_readyz() {
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let admin = started.admin_addr;
    let mut reg = RegistrationClient::new(connect(started.registration_socket.clone()).await);
    let status = RegistrationStatus {
        plugin_registered: false,
        error: "no handler registered for plugin type: SLMPlugin".into(),
    };
    reg.notify_registration_status(status).await.unwrap();
    let (code, body) = readyz(admin).await;
    assert_eq!(code, 503);
    assert!(
        body.contains("kubelet refused plugin graceful-drain.io: no handler registered"),
        "{body}"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_reconciler_a_refusal_counts_when_the_kubelet_owns_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    // `auto` finds the SLM API built in (no CRD): the kubelet must drive us, so its
    // refusal is a real problem.
    api.hide_lifecycle_crds();
    let flags = ["--lifecycle-reconciler", "auto"];
    let shutdown = Shutdown::new();
    let started = agent::start(
        args(dir.path(), &flags),
        api.agent_client(),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let admin = started.admin_addr;
    eventually("the agent ready", || async { readyz(admin).await.0 == 200 }).await;
    let mut reg = RegistrationClient::new(connect(started.registration_socket.clone()).await);
    let status = RegistrationStatus {
        plugin_registered: false,
        error: "plugin version not supported".into(),
    };
    reg.notify_registration_status(status).await.unwrap();
    let (_, body) = eventually_some("the refusal on /readyz", DEADLINE, || async {
        let (code, body) = readyz(admin).await;
        if code == 503 {
            Ok((code, body))
        } else {
            Err((code, body))
        }
    })
    .await;
    assert!(body.contains("plugin version not supported"), "{body}");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_agent_may_not_patch_is_reported_not_silently_retried() {
    let dir = tempfile::tempdir().unwrap();
    // Deployed without RBAC to patch Nodes.
    let api = SimApi::start(Faults {
        forbidden: vec![
            Forbidden::new(AGENT_USER, "patch", "nodes"),
            Forbidden::new(AGENT_USER, "patch", "nodes/status"),
        ],
        ..Faults::default()
    })
    .await;
    api.create(shop_pod("web-1").label("app", "web").owned_by_rs("web"))
        .await;
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    api.until("a NodeUpdateFailed event", || async {
        api.events(agent_reason::NODE_UPDATE_FAILED)
            .await
            .iter()
            .any(|e| {
                let message = e.message.as_deref().unwrap_or_default();
                message.contains("prepare node for drain") && message.contains("forbidden")
            })
    })
    .await;
    // Still retrying: End says "call me again", and nothing was evicted before the cordon.
    let answer = kubelet.end("graceful-drain", false).await;
    assert_eq!(
        (answer.lifecycle_condition.as_str(), answer.error.as_str()),
        ("drain-started", "")
    );
    assert!(api.evictions().is_empty());
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_sla_is_recorded_even_for_a_drain_this_agent_does_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    // Left by an earlier agent: a drain marked in progress on an uncordoned node (so this
    // agent does not resume it).
    let in_progress = json!({"status": {"conditions": [
        {"type": "DrainInProgress", "status": "True", "reason": "Draining"}]}});
    Api::<Node>::all(api.admin())
        .patch_status(
            NODE,
            &PatchParams::default(),
            &Patch::Strategic(in_progress),
        )
        .await
        .unwrap();
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    let answer = kubelet.end("graceful-drain", true).await;
    assert!(answer.error.contains("SLA"), "{}", answer.error);
    api.until("DrainInProgress=False recorded", || async {
        condition(&node_json(&api).await, "DrainInProgress")["status"] == "False"
    })
    .await;
    let node = node_json(&api).await;
    assert_eq!(
        condition(&node, "DrainInProgress")["reason"],
        "DrainStopped"
    );
    assert!(api.evictions().is_empty());
    shutdown.cancel();
}

/// A pod of the `shop` namespace owned by its own ReplicaSet, whose grace period keeps it
/// terminating after its eviction until the test plays the kubelet.
fn lingering(name: &str) -> k8s_openapi::api::core::v1::Pod {
    shop_pod(name).owned_by_rs(name).grace_period(30)
}

/// Runs a drain with the agent's `flags` through `steps`: at each, waits for the node
/// condition `message`, checks that exactly `evicted` (in any order) have been evicted so far,
/// then lets the terminating pods go; the drain must then complete. Checks that the
/// `graceful-drain.io/DrainPlan` Event went out before the first eviction and returns its
/// message and the agent's `/status` once done.
async fn drain_in_tiers(
    api: &SimApi,
    flags: &[&str],
    steps: &[(&str, &[&str])],
) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let shutdown = Shutdown::new();
    let started = agent::start(
        args(dir.path(), flags),
        api.agent_client(),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let (agent_state, admin) = (started.agent.clone(), started.admin_addr);
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    let running = tokio::spawn(started.wait());
    kubelet.start("graceful-drain", NODE).await;
    for (message, evicted) in steps {
        eventually(message, || {
            ready(agent_state.snapshot().message == *message)
        })
        .await;
        let mut pods: Vec<String> = api
            .evictions()
            .iter()
            .map(|r| r.pod().to_string())
            .collect();
        pods.sort();
        pods.dedup();
        let mut want = evicted.to_vec();
        want.sort();
        assert_eq!(pods, want, "at {message}");
        api.finish_terminating().await;
    }
    let done = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert_eq!(done.error, "");
    assert!(api.pod_names().await.is_empty());
    let requests = api.requests();
    let is_plan = |r: &graceful_drain_e2e::sim_api::Recorded| {
        r.path.ends_with("/events") && r.body["reason"] == agent_reason::DRAIN_PLAN
    };
    let plan_at = requests
        .iter()
        .position(is_plan)
        .expect("a DrainPlan Event");
    let first_eviction = requests.iter().position(|r| r.path.ends_with("/eviction"));
    assert!(
        first_eviction.is_some_and(|at| plan_at < at),
        "the plan comes first"
    );
    let plan = requests[plan_at].body["message"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, status) = get(admin, "/status").await;
    let status = serde_json::from_str(status.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    shutdown.cancel();
    running.await.unwrap();
    (plan, status)
}

/// Eviction tiers: an ordinary pod first, a system-critical one once it is gone, and the
/// pod `--last-pod-selector` picks last; each tier starts only when the one before it has
/// left the node, and the node condition says which tier the drain is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_evicted_tier_by_tier() {
    let api = SimApi::start(Faults::default()).await;
    api.create(lingering("web-1")).await;
    let mut dns = lingering("dns-1");
    dns.spec.as_mut().unwrap().priority_class_name = Some("system-cluster-critical".into());
    api.create(dns).await;
    api.create(lingering("ingress-1").label("app", "ingress"))
        .await;
    let steps: [(&str, &[&str]); 3] = [
        (
            "tier 1/3 (workloads): 1 pod remaining: 1 terminating; 2 in later tiers",
            &["web-1"],
        ),
        (
            "tier 2/3 (system-critical): 1 pod remaining: 1 terminating; 1 in later tiers",
            &["web-1", "dns-1"],
        ),
        (
            "tier 3/3 (last): 1 pod remaining: 1 terminating",
            &["web-1", "dns-1", "ingress-1"],
        ),
    ];
    let (plan, status) =
        drain_in_tiers(&api, &["--last-pod-selector", "app=ingress"], &steps).await;
    assert_eq!(
        plan,
        "plan: 1/3 workloads: 1 pod (shop/web-1); 2/3 system-critical: 1 pod (shop/dns-1); \
         3/3 last: 1 pod (shop/ingress-1)"
    );
    assert_eq!(
        status["progress"]["plan"],
        json!([{"name": "workloads", "pods": ["shop/web-1"]},
               {"name": "system-critical", "pods": ["shop/dns-1"]},
               {"name": "last", "pods": ["shop/ingress-1"]}])
    );
    let tiers = api.events(agent_reason::EVICTION_TIER).await;
    let messages: Vec<&str> = tiers.iter().filter_map(|e| e.message.as_deref()).collect();
    assert_eq!(
        messages,
        [
            "eviction tier 1/3 (workloads): 1 pod",
            "eviction tier 2/3 (system-critical): 1 pod",
            "eviction tier 3/3 (last): 1 pod",
        ]
    );
}

/// A LifecycleEvent's `graceful-drain.io/last-pod-selector` annotation sets the last tier
/// for its drain, though the agent has no `--last-pod-selector`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_annotation_sets_the_last_tier_of_its_drain() {
    use graceful_drain_core::lifecycle::LifecycleEvent;
    let api = SimApi::start(Faults::default()).await;
    api.create(lingering("web-1")).await;
    api.create(lingering("ingress-1").label("app", "ingress"))
        .await;
    let annotate = Patch::Merge(json!({"metadata": {"annotations": {
        LAST_POD_SELECTOR_ANNOTATION: "app=ingress"}}}));
    Api::<LifecycleEvent>::all(api.admin())
        .patch(EVENT, &PatchParams::default(), &annotate)
        .await
        .unwrap();
    let steps: [(&str, &[&str]); 2] = [
        (
            "tier 1/2 (workloads): 1 pod remaining: 1 terminating; 1 in later tiers",
            &["web-1"],
        ),
        (
            "tier 2/2 (last): 1 pod remaining: 1 terminating",
            &["web-1", "ingress-1"],
        ),
    ];
    drain_in_tiers(&api, &[], &steps).await;
}

/// Tiers configured with `--tiers`: by namespace, then by PriorityClass, with the
/// `--last-pod-selector` tier after them. A pod goes to the first tier matching it (the
/// database pod of the critical class is a database), and a system-critical pod is an
/// ordinary workload once the tiers are configured without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_tiers_evict_by_namespace_then_priority_class() {
    use k8s_openapi::api::core::v1::Namespace;
    let api = SimApi::start(Faults::default()).await;
    api.create(Namespace {
        metadata: ObjectMeta {
            name: Some("db".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    })
    .await;
    let with_class = |mut pod: k8s_openapi::api::core::v1::Pod, class: &str| {
        pod.spec.as_mut().unwrap().priority_class_name = Some(class.into());
        pod
    };
    api.create(lingering("web-1")).await;
    api.create(with_class(lingering("dns-1"), "system-cluster-critical"))
        .await;
    api.create(lingering("pg-0").ns("db")).await;
    api.create(with_class(lingering("pg-1").ns("db"), "critical-queue"))
        .await;
    api.create(with_class(lingering("queue-0"), "critical-queue"))
        .await;
    api.create(lingering("ingress-1").label("app", "ingress"))
        .await;
    let tiers = r#"[{"name":"databases","match":[{"namespaces":["db"]}]},
        {"name":"queues","match":[{"priorityClassNames":["critical-queue"]}]}]"#;
    let steps: [(&str, &[&str]); 4] = [
        (
            "tier 1/4 (workloads): 2 pods remaining: 2 terminating; 4 in later tiers",
            &["dns-1", "web-1"],
        ),
        (
            "tier 2/4 (databases): 2 pods remaining: 2 terminating; 2 in later tiers",
            &["dns-1", "pg-0", "pg-1", "web-1"],
        ),
        (
            "tier 3/4 (queues): 1 pod remaining: 1 terminating; 1 in later tiers",
            &["dns-1", "pg-0", "pg-1", "queue-0", "web-1"],
        ),
        (
            "tier 4/4 (last): 1 pod remaining: 1 terminating",
            &["dns-1", "ingress-1", "pg-0", "pg-1", "queue-0", "web-1"],
        ),
    ];
    let flags = ["--tiers", tiers, "--last-pod-selector", "app=ingress"];
    let (plan, _) = drain_in_tiers(&api, &flags, &steps).await;
    assert_eq!(
        plan,
        "plan: 1/4 workloads: 2 pods (shop/dns-1, shop/web-1); 2/4 databases: 2 pods \
         (db/pg-0, db/pg-1); 3/4 queues: 1 pod (shop/queue-0); 4/4 last: 1 pod (shop/ingress-1)"
    );
}

/// A LifecycleEvent's `graceful-drain.io/tiers` annotation replaces `--tiers` for its
/// drain; one that cannot be used fails the drain before any eviction, naming the event
/// and what is wrong, instead of draining with the agent's tiers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_annotation_sets_the_tiers_and_a_bad_one_fails_the_drain() {
    use graceful_drain_core::lifecycle::LifecycleEvent;
    let annotate = |api: &SimApi, tiers: &str| {
        let patch = Patch::Merge(json!({"metadata": {"annotations": {
            TIERS_ANNOTATION: tiers}}}));
        let events = Api::<LifecycleEvent>::all(api.admin());
        async move {
            events
                .patch(EVENT, &PatchParams::default(), &patch)
                .await
                .unwrap();
        }
    };
    let api = SimApi::start(Faults::default()).await;
    api.create(lingering("web-1")).await;
    api.create(lingering("batch-1").label("kind", "batch"))
        .await;
    annotate(
        &api,
        r#"[{"name":"batch","match":[{"podSelector":"kind=batch"}]},{"name":"rest"}]"#,
    )
    .await;
    let steps: [(&str, &[&str]); 2] = [
        (
            "tier 1/2 (batch): 1 pod remaining: 1 terminating; 1 in later tiers",
            &["batch-1"],
        ),
        (
            "tier 2/2 (rest): 1 pod remaining: 1 terminating",
            &["batch-1", "web-1"],
        ),
    ];
    drain_in_tiers(&api, &[], &steps).await;

    let api = SimApi::start(Faults::default()).await;
    api.create(lingering("web-1")).await;
    annotate(&api, r#"[{"name":"a"},{"name":"b"}]"#).await;
    let dir = tempfile::tempdir().unwrap();
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), api.agent_client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    let answer = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert!(
        answer.error.contains(
            "drain node n1: lifecycleevent ev-1: annotation graceful-drain.io/tiers: \
             eviction tiers: tiers \"a\" and \"b\" both have no `match`"
        ),
        "{}",
        answer.error
    );
    assert!(api.evictions().is_empty(), "nothing evicted");
    let node = node_json(&api).await;
    assert_eq!(condition(&node, "DrainInProgress")["reason"], "DrainFailed");
    shutdown.cancel();
}

/// A bad `--tiers` stops the agent at startup, naming the tier.
#[tokio::test]
async fn a_bad_tiers_flag_stops_the_agent_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let api = SimApi::start(Faults::default()).await;
    let tiers = r#"[{"name":"edge","match":[{"podSelector":"app in ingress"}]}]"#;
    let started = agent::start(
        args(dir.path(), &["--tiers", tiers]),
        api.agent_client(),
        Shutdown::new(),
    )
    .await;
    let error = started.err().expect("refused").to_string();
    assert!(
        error.starts_with(r#"eviction tiers: tier "edge": podSelector "app in ingress""#),
        "{error}"
    );
}
