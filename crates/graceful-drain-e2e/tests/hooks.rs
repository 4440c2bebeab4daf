//! Maintenance hooks, end to end: the node agent over its real sockets with a test playing
//! the kubelet, the simulated API server, and the simulated VM host's HTTPS hook service
//! (`sim::vmhost`). A hook that evacuates VMs runs before any eviction and its enable hook
//! after the uncordon; a failing, a hung and an optional failing hook; an agent restarted
//! while a hook is in progress polls it instead of starting it twice; Job hooks.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::time::Duration;

use graceful_drain_agent::{self as agent, Agent};
use graceful_drain_core::labels::{HOOKS_ANNOTATION, agent_reason};
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_sim::vmhost::{Behaviour, VmHost};
use graceful_drain_testing::fixtures::PodFixture;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams};
use kube_sim::apiserver::Faults;
use serde_json::{Value, json};

mod agent_support {
    pub mod harness;
}
use agent_support::harness::{args, condition, node_json};
use graceful_drain_e2e::kubelet::Kubelet;
use graceful_drain_e2e::sim_api::{NODE, SimApi, shop_pod};
use graceful_drain_testing::eventually::eventually;
use std::future::ready;

const DRAIN: &str = "graceful-drain";
const MAINTENANCE: &str = "graceful-maintenance-complete";

/// A running agent and the kubelet's connection to it.
struct Running {
    agent: Agent,
    kubelet: Kubelet,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(api: &SimApi, hooks: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(api, hooks, dir).await
    }

    async fn start_in(api: &SimApi, hooks: &str, dir: tempfile::TempDir) -> Self {
        let shutdown = Shutdown::new();
        let flags = ["--hooks", hooks];
        let started = agent::start(
            args(dir.path(), &flags),
            api.agent_client(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        let agent = started.agent.clone();
        let kubelet = Kubelet::register(&started.registration_socket, NODE).await;
        let task = tokio::spawn(started.wait());
        Self {
            agent,
            kubelet,
            shutdown,
            task,
            _dir: dir,
        }
    }

    async fn stop(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        self.task.await.unwrap();
        self._dir
    }
}

/// Two pods of a ReplicaSet that leave as soon as they are evicted.
async fn two_pods(api: &SimApi) {
    for name in ["web-1", "web-2"] {
        api.create(shop_pod(name).label("app", "web").owned_by_rs("web"))
            .await;
    }
}

async fn vmhost(shutdown: &Shutdown) -> VmHost {
    let nodes = [NODE.to_string(), "n2".to_string()];
    VmHost::start(&nodes, 3, Duration::from_millis(150), shutdown)
        .await
        .unwrap()
}

fn messages(events: &[k8s_openapi::api::core::v1::Event]) -> Vec<String> {
    events.iter().filter_map(|e| e.message.clone()).collect()
}

/// The worked example: the VMs leave the node before any pod is evicted (the node
/// condition shows the migration's progress meanwhile), the drain completes, and after the
/// uncordon the node takes VMs again. Each hook is started once; both leave Events and a
/// record on the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_are_evacuated_before_any_eviction_and_the_node_enabled_after_uncordon() {
    let api = SimApi::start(Faults::default()).await;
    two_pods(&api).await;
    let hosts = vmhost(&Shutdown::new()).await;
    let mut run = Running::start(&api, &hosts.hooks_json("1m")).await;
    run.kubelet.start(DRAIN, NODE).await;
    let agent_state = run.agent.clone();
    eventually("the migration under way", || {
        ready(
            agent_state
                .snapshot()
                .message
                .starts_with("hook evacuate-vms (before-eviction): migrating:"),
        )
    })
    .await;
    assert!(api.evictions().is_empty(), "no eviction while VMs move");
    assert!(!hosts.enabled(NODE), "the node takes no new VMs");
    assert!(!hosts.vms_on(NODE).is_empty(), "still migrating");
    api.until("the condition shows the hook", || async {
        let node = node_json(&api).await;
        let message = condition(&node, "DrainInProgress")["message"].clone();
        message
            .as_str()
            .is_some_and(|m| m.starts_with("hook evacuate-vms (before-eviction)"))
    })
    .await;
    api.until("first eviction", || async { !api.evictions().is_empty() })
        .await;
    assert!(
        hosts.vms_on(NODE).is_empty(),
        "every VM left before the first eviction"
    );
    assert_eq!(hosts.vms_on("n2").len(), 6);
    api.until("both evicted", || async { api.evictions().len() == 2 })
        .await;
    api.finish_terminating().await;
    let done = run.kubelet.end_until(DRAIN, "drain-complete").await;
    assert_eq!(done.error, "");
    assert!(
        !hosts.enabled(NODE),
        "still disabled while the node is down"
    );

    api.create_event("ev-uncordon", MAINTENANCE).await;
    run.kubelet.event = "ev-uncordon".into();
    run.kubelet.start(MAINTENANCE, NODE).await;
    let back = run
        .kubelet
        .end_until(MAINTENANCE, "maintenance-complete")
        .await;
    assert_eq!(back.error, "");
    assert!(hosts.enabled(NODE), "the node takes VMs again");
    let record = hosts.record();
    assert_eq!(record.starts.get("evacuate-vms"), Some(&1));
    assert_eq!(record.starts.get("enable-vms"), Some(&1));
    assert!(record.polls >= 1, "the migration was polled");

    let started = messages(&api.events(agent_reason::HOOK_STARTED).await);
    assert_eq!(started.len(), 2, "{started:?}");
    let succeeded = messages(&api.events(agent_reason::HOOK_SUCCEEDED).await);
    assert!(
        succeeded.iter().any(
            |m| m.starts_with("hook evacuate-vms (before-eviction) done")
                && m.ends_with("3 VMs moved off n1")
        ),
        "{succeeded:?}"
    );
    let node = node_json(&api).await;
    let records: Value = serde_json::from_str(
        node["metadata"]["annotations"][HOOKS_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(records["evacuate-vms"]["state"], "done");
    assert_eq!(records["evacuate-vms"]["operation"], "ev-1");
    assert_eq!(records["enable-vms"]["state"], "done");
    assert_eq!(records["enable-vms"]["operation"], "ev-uncordon");
    run.stop().await;
}

/// A hook that answers failed fails the drain with its message before any eviction, and
/// the node is given back to the load balancers (the cordon stays, as for any failed
/// drain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_hook_fails_the_drain_before_any_eviction() {
    let api = SimApi::start(Faults::default()).await;
    two_pods(&api).await;
    let hosts = vmhost(&Shutdown::new()).await;
    hosts.set_behaviour(Behaviour::Fail("hypervisor n1 is in error state".into()));
    let mut run = Running::start(&api, &hosts.hooks_json("1m")).await;
    run.kubelet.start(DRAIN, NODE).await;
    let answer = run.kubelet.end_until(DRAIN, "drain-complete").await;
    assert!(
        answer.error.contains(
            "hook evacuate-vms (before-eviction) failed: hypervisor n1 is in error state"
        ),
        "{}",
        answer.error
    );
    assert!(api.evictions().is_empty(), "no pod evicted");
    assert_eq!(api.pod_names().await.len(), 2);
    let node = node_json(&api).await;
    let cond = condition(&node, "DrainInProgress");
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "DrainFailed");
    assert!(
        node["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"]
            .is_null()
    );
    let failed = messages(&api.events(agent_reason::HOOK_FAILED).await);
    assert_eq!(failed.len(), 1, "{failed:?}");
    run.stop().await;
}

/// A hook that stays in progress past its timeout fails the drain, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_past_its_timeout_fails_the_drain() {
    let api = SimApi::start(Faults::default()).await;
    two_pods(&api).await;
    let hosts = vmhost(&Shutdown::new()).await;
    hosts.set_behaviour(Behaviour::Hang);
    let mut run = Running::start(&api, &hosts.hooks_json("1s")).await;
    run.kubelet.start(DRAIN, NODE).await;
    let answer = run.kubelet.end_until(DRAIN, "drain-complete").await;
    assert!(
        answer
            .error
            .contains("hook evacuate-vms (before-eviction) timed out after 1s: migrating:"),
        "{}",
        answer.error
    );
    assert!(api.evictions().is_empty(), "no pod evicted");
    run.stop().await;
}

/// An optional hook that fails is reported and the drain goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_hook_that_fails_lets_the_drain_go_on() {
    let api = SimApi::start(Faults::default()).await;
    two_pods(&api).await;
    let hosts = vmhost(&Shutdown::new()).await;
    hosts.set_behaviour(Behaviour::Fail("inventory read-only".into()));
    let hooks = json!([{"name": "notify", "at": "drain-start", "optional": true,
        "https": {"url": hosts.url("/evacuate"), "caBundle": hosts.ca_bundle()}}]);
    let mut run = Running::start(&api, &hooks.to_string()).await;
    run.kubelet.start(DRAIN, NODE).await;
    api.until("evictions", || async { api.evictions().len() == 2 })
        .await;
    api.finish_terminating().await;
    let done = run.kubelet.end_until(DRAIN, "drain-complete").await;
    assert_eq!(done.error, "");
    let failed = messages(&api.events(agent_reason::HOOK_FAILED).await);
    assert_eq!(
        failed,
        ["hook notify (drain-start) failed: inventory read-only; optional, continuing"]
    );
    run.stop().await;
}

/// An agent restarted while a hook is in progress polls that run (same id) instead of
/// starting the hook again, and the drain then completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_polls_the_hook_in_progress_instead_of_starting_it_again() {
    let api = SimApi::start(Faults::default()).await;
    two_pods(&api).await;
    let hosts = vmhost(&Shutdown::new()).await;
    hosts.set_behaviour(Behaviour::Hang);
    let hooks = hosts.hooks_json("1m");
    let mut first = Running::start(&api, &hooks).await;
    first.kubelet.start(DRAIN, NODE).await;
    api.until("the hook in progress on the Node", || async {
        let node = node_json(&api).await;
        node["metadata"]["annotations"][HOOKS_ANNOTATION]
            .as_str()
            .is_some_and(|r| r.contains("\"state\":\"inProgress\""))
    })
    .await;
    let dir = first.stop().await;
    assert_eq!(hosts.record().starts.get("evacuate-vms"), Some(&1));

    hosts.set_behaviour(Behaviour::Normal);
    let polls_before = hosts.record().polls;
    let mut second = Running::start_in(&api, &hooks, dir).await;
    let done = {
        let api = &api;
        let waiting = async {
            api.until("evictions", || async { api.evictions().len() == 2 })
                .await;
            api.finish_terminating().await;
        };
        let ending = second.kubelet.end_until(DRAIN, "drain-complete");
        let (_, done) = tokio::join!(waiting, ending);
        done
    };
    assert_eq!(done.error, "");
    let record = hosts.record();
    assert_eq!(
        record.starts.get("evacuate-vms"),
        Some(&1),
        "never started twice"
    );
    assert!(record.polls > polls_before, "the new agent polled the run");
    assert!(hosts.vms_on(NODE).is_empty());
    second.stop().await;
}

/// A Job hook: the Job is created pinned to the node once every pod is gone, and the drain
/// completes only when the Job does; a failed Job fails the next drain with its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_hook_runs_on_the_node_and_the_drain_waits_for_it() {
    let api = SimApi::start(Faults::default()).await;
    two_pods(&api).await;
    api.create(k8s_openapi::api::core::v1::Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some("ops".into()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let hooks = json!([{"name": "report", "at": "after-last-pod", "pollInterval": "100ms",
        "job": {"namespace": "ops", "template": {"spec": {"backoffLimit": 0, "template": {"spec": {
            "containers": [{"name": "report", "image": "busybox", "command": ["true"]}]}}}}}}]);
    let mut run = Running::start(&api, &hooks.to_string()).await;
    run.kubelet.start(DRAIN, NODE).await;
    api.until("evictions", || async { api.evictions().len() == 2 })
        .await;
    api.finish_terminating().await;
    let jobs: Api<Job> = Api::namespaced(api.agent_client(), "ops");
    let list = || async { jobs.list(&ListParams::default()).await.unwrap().items };
    api.until("the hook's Job", || async { !list().await.is_empty() })
        .await;
    let job = list().await.remove(0);
    let name = job.metadata.name.clone().unwrap();
    assert!(name.starts_with("gd-report-"), "{name}");
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.node_name.as_deref(), Some(NODE));
    let env = pod.containers[0].env.as_ref().unwrap();
    assert!(
        env.iter()
            .any(|e| e.name == "GRACEFUL_DRAIN_NODE" && e.value.as_deref() == Some(NODE))
    );
    assert!(env.iter().any(
        |e| e.name == "GRACEFUL_DRAIN_HOOK_AT" && e.value.as_deref() == Some("after-last-pod")
    ));
    assert_eq!(
        run.kubelet.end(DRAIN, false).await.lifecycle_condition,
        "drain-started",
        "not complete while the Job runs"
    );
    api.patch_status::<Job>(
        Some("ops"),
        &name,
        json!({"conditions": [
        {"type": "Complete", "status": "True"}]}),
    )
    .await;
    let done = run.kubelet.end_until(DRAIN, "drain-complete").await;
    assert_eq!(done.error, "");

    // A second drain (another event) runs the hook again; its Job fails.
    api.create_event("ev-2", DRAIN).await;
    run.kubelet.event = "ev-2".into();
    api.create(shop_pod("web-3").label("app", "web").owned_by_rs("web"))
        .await;
    run.kubelet.start(DRAIN, NODE).await;
    api.until("eviction", || async { api.evictions().len() == 3 })
        .await;
    api.finish_terminating().await;
    api.until("the second drain's Job", || async {
        list().await.len() == 2
    })
    .await;
    let second = list()
        .await
        .into_iter()
        .filter_map(|j| j.metadata.name)
        .find(|n| *n != name)
        .unwrap();
    api.patch_status::<Job>(
        Some("ops"),
        &second,
        json!({"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}),
    )
    .await;
    let failed = run.kubelet.end_until(DRAIN, "drain-complete").await;
    assert!(
        failed.error.contains(&format!(
            "hook report (after-last-pod) failed: job ops/{second} failed: Job has reached the specified backoff limit"
        )),
        "{}",
        failed.error
    );
    run.stop().await;
}

/// Bad configurations are refused at start with a message naming the hook.
#[test]
fn bad_hooks_are_refused_naming_the_hook() {
    use graceful_drain_agent::hooks::Hooks;
    let cases = [
        (
            json!([{"name": "a", "at": "before-eviction"}]),
            "hook \"a\": set exactly one of https and job",
        ),
        (
            json!([{"name": "a", "at": "before-eviction", "https": {"url": "http://x/"}}]),
            "hook \"a\": url \"http://x/\" is not https://host/…",
        ),
        (
            json!([{"name": "a", "at": "sometime", "https": {"url": "https://x/"}}]),
            "unknown variant `sometime`",
        ),
        (
            json!([{"name": "a", "at": "drain-start", "timeout": "soon", "https": {"url": "https://x/", "caBundle": "eA=="}}]),
            "hook \"a\": timeout \"soon\" is not a duration",
        ),
        (
            json!([{"name": "a", "at": "drain-start", "https": {"url": "https://x/", "caBundle": "eA=="}}]),
            "hook \"a\": caBundle holds no certificate",
        ),
        (
            json!([{"name": "Bad_Name", "at": "drain-start", "https": {"url": "https://x/"}}]),
            "hook \"Bad_Name\": a name must be",
        ),
        (
            json!([{"name": "j", "at": "drain-start", "job": {"namespace": "ops", "template": {"spec": {"template": {"spec": {"containers": []}}}}}}]),
            "hook \"j\": job template has no containers",
        ),
    ];
    for (config, want) in cases {
        let error = Hooks::parse(&config.to_string()).unwrap_err().to_string();
        assert!(error.contains(want), "{config}: {error}");
    }
    let pem = graceful_drain_core::certs::generate("t", &["localhost".into()], &[])
        .unwrap()
        .ca_cert;
    use base64::Engine as _;
    let bundle = base64::engine::general_purpose::STANDARD.encode(pem);
    let twice = json!([
        {"name": "a", "at": "drain-start", "https": {"url": "https://x/", "caBundle": bundle}},
        {"name": "a", "at": "after-uncordon", "https": {"url": "https://x/", "caBundle": bundle}}]);
    assert!(
        Hooks::parse(&twice.to_string())
            .unwrap_err()
            .to_string()
            .contains("two hooks have this name")
    );
    assert!(Hooks::parse("").unwrap().is_empty());
}

/// A Job hook may run in any namespace Kubernetes accepts: up to 63 characters, more than
/// a hook's own name may have; a 64-character one is refused naming the hook.
#[test]
fn a_job_hook_runs_in_any_valid_namespace() {
    use graceful_drain_agent::hooks::Hooks;
    let job = |namespace: &str| {
        json!([{"name": "j", "at": "drain-start", "job": {"namespace": namespace,
            "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}}}])
        .to_string()
    };
    let longest = "n".repeat(63);
    assert!(Hooks::parse(&job(&longest)).is_ok(), "63 characters");
    let error = Hooks::parse(&job(&"n".repeat(64))).unwrap_err().to_string();
    assert!(error.contains("hook \"j\": job namespace"), "{error}");
}
