//! The node agent's promise — `drain-complete` only when the node is really drained — under
//! what operators meet every week, each on the simulated cluster with the real webhook,
//! node agents and lifecycle reconcilers: a second drain after an uncordon; an agent
//! restarted while the webhook holds isolated pods; a failed drain followed by a new one
//! (through our reconciler and through a kubelet that calls End first); an event that ends
//! while its drain is blocked; a `--pod-selector` drain whose pods the webhook relabels.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::time::Duration;

use graceful_drain::ctl::{self, Request};
use graceful_drain_core::labels::{
    DRAINING_LABEL, EXCLUDE_FROM_LB_LABEL, HOOK_LABEL, agent_reason,
};
use graceful_drain_core::lifecycle::{
    ClaimStatus, DRAIN_TRANSITION, LifecycleEvent, LifecycleEventSpec,
};
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_sim::scenario::actions;
use graceful_drain_sim::scenario::components::{
    self as sim_components, Components, ComponentsConfig,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec, wait_for};
use serde_json::json;

use graceful_drain_e2e::kubelet::Kubelet;
use graceful_drain_sim::command::AgentCommand;

/// Bound for any convergence in these tests.
const TIMEOUT: Duration = Duration::from_secs(90);
const NODE: &str = "worker-1";
/// Fast reconciler ticks and event checks, so each scenario takes seconds.
const FAST_AGENT: &[&str] = &["--lifecycle-tick", "1s", "--event-check-interval", "1s"];

async fn cluster() -> Cluster {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    let cfg = ClusterConfig {
        nodes: 2,
        ..ClusterConfig::default()
    };
    graceful_drain_sim::setup::start(cfg, Shutdown::new())
        .await
        .unwrap()
}

fn web() -> WebSpec {
    WebSpec {
        replicas: 4,
        min_available: 2,
        grace_period_seconds: 1,
        ..WebSpec::default()
    }
}

fn components(delay: Duration) -> ComponentsConfig {
    ComponentsConfig {
        deregistration_delay: delay,
        timeout_seconds: 10,
        agent_program: None,
        confirmed_release: false,
        balancer_stats: None,
    }
}

/// A two-node cluster running the webhook (with `delay`) and node agents (with `flags`),
/// and the web Deployment deployed and ready.
async fn protected_cluster(delay: Duration, flags: &[&str]) -> (Cluster, Components) {
    let cluster = cluster().await;
    let components = Components::start_with(&cluster, &components(delay), flags)
        .await
        .unwrap();
    cluster.deploy_web(&web(), TIMEOUT).await.unwrap();
    (cluster, components)
}

/// `graceful-drain drain NODE` (or `uncordon`), as the CLI runs it: create the event and
/// follow it to its end.
async fn cli(client: &kube::Client, verb: &'static str) -> ctl::Result<String> {
    let transition = match verb {
        "drain" => DRAIN_TRANSITION,
        _ => graceful_drain_core::lifecycle::MAINTENANCE_TRANSITION,
    };
    let request = Request {
        verb,
        node: NODE.into(),
        transition: transition.into(),
        wait: true,
        timeout: Some(TIMEOUT),
        claim_timeout: None,
        poll: Duration::from_millis(200),
    };
    ctl::execute(client, &request, &Shutdown::new()).await
}

/// The unfinished pods on the node, by name.
async fn pods_here(client: &kube::Client) -> Vec<Pod> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
    Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .unwrap()
        .items
}

async fn node(client: &kube::Client) -> Node {
    Api::<Node>::all(client.clone()).get(NODE).await.unwrap()
}

fn is_cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

fn has_lb_label(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LB_LABEL))
}

fn drain_condition(node: &Node) -> Option<(String, String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DrainInProgress")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

fn is_web(pod: &Pod) -> bool {
    pod.metadata
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with("web-"))
}

/// The drain said complete: no web pod (isolated or not) may remain on the node.
async fn assert_no_web_pods_left(client: &kube::Client) {
    let left: Vec<String> = pods_here(client)
        .await
        .iter()
        .filter(|p| is_web(p))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(
        left.is_empty(),
        "drain-complete with web pods left: {left:?}"
    );
}

fn is_isolated(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(DRAINING_LABEL))
}

/// Puts a pod no controller recreates on the node: kubectl's filters refuse to drain it.
async fn bare_pod(client: &kube::Client) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bare", "namespace": "default", "labels": {"app": "bare"}},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "c", "image": "registry.example/app:1"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

async fn delete_bare_pod(client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("bare", &DeleteParams::default()).await.unwrap();
    wait_for("the bare pod gone", TIMEOUT, || async {
        matches!(pods.get_opt("bare").await, Ok(None))
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_drain_after_kubectl_uncordon_cordons_and_evicts_again() {
    let (cluster, _components) = protected_cluster(Duration::from_secs(1), FAST_AGENT).await;
    let web = web();
    let admin = cluster.client();

    cli(&admin, "drain").await.unwrap();
    assert!(is_cordoned(&node(&admin).await));
    assert!(!pods_here(&admin).await.iter().any(is_web));

    // `kubectl uncordon` (not our maintenance transition), then a rollout brings web pods
    // back onto the emptiest node.
    actions::cordon(&admin, NODE, false).await.unwrap();
    actions::rollout(&admin, &web, TIMEOUT).await.unwrap();
    let back = pods_here(&admin).await.into_iter().filter(is_web).count();
    assert!(back > 0, "the rollout put web pods on {NODE} again");
    let evictions = cluster.api().stats().count("create", "pods/eviction");

    cli(&admin, "drain").await.unwrap();
    let drained = node(&admin).await;
    assert!(
        is_cordoned(&drained),
        "the second drain cordoned the node again"
    );
    assert_no_web_pods_left(&admin).await;
    let again = cluster.api().stats().count("create", "pods/eviction") - evictions;
    assert!(again >= back as u64, "{again} evictions for {back} pods");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_completes_when_the_agent_restarts_while_the_webhook_holds_isolated_pods() {
    // Long enough that the restart happens while the pods wait out their delay.
    let (cluster, mut components) = protected_cluster(Duration::from_secs(6), FAST_AGENT).await;
    let admin = cluster.client();

    let drain = tokio::spawn({
        let admin = admin.clone();
        async move { cli(&admin, "drain").await }
    });
    wait_for("a web pod isolated on the node", TIMEOUT, || async {
        pods_here(&admin).await.iter().any(is_isolated)
    })
    .await
    .unwrap();
    components.stop_agent(NODE).await.unwrap();
    components.start_agent(&cluster, NODE).await.unwrap();

    let outcome = tokio::time::timeout(TIMEOUT, drain).await.unwrap().unwrap();
    outcome.expect("the restarted agent finishes the drain instead of refusing released pods");
    assert_no_web_pods_left(&admin).await;
    components.check().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_drain_does_not_poison_the_next_one_through_the_reconciler() {
    let (cluster, _components) = protected_cluster(Duration::from_secs(1), FAST_AGENT).await;
    let admin = cluster.client();
    bare_pod(&admin).await;

    let failed = cli(&admin, "drain").await.unwrap_err().to_string();
    assert!(failed.contains("declare no controller"), "{failed}");
    let after_failure = node(&admin).await;
    assert!(
        is_cordoned(&after_failure),
        "the cordon stays, as kubectl leaves it"
    );
    assert!(
        !has_lb_label(&after_failure),
        "a failed drain gives the node back to the load balancers"
    );
    let (status, reason, message) = drain_condition(&after_failure).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "DrainFailed"));
    assert!(
        message.contains("returned to the load balancers"),
        "{message}"
    );

    delete_bare_pod(&admin).await;
    cli(&admin, "drain").await.unwrap();
    assert!(!pods_here(&admin).await.iter().any(is_web));
    assert!(has_lb_label(&node(&admin).await));
}

/// Creates a LifecycleEvent for the drain, as a user would, and (with `sla`) marks it
/// claimed with that deadline, as the kubelet's reconciler would.
async fn drain_event(admin: &kube::Client, name: &str, sla: Option<Duration>) {
    let events: Api<LifecycleEvent> = Api::all(admin.clone());
    let event = LifecycleEvent::new(
        name,
        LifecycleEventSpec {
            transition_name: DRAIN_TRANSITION.into(),
            binding_node: NODE.into(),
        },
    );
    events.create(&PostParams::default(), &event).await.unwrap();
    if let Some(sla) = sla {
        let deadline = (jiff::Timestamp::now() + sla).to_string();
        let status = json!({"status": {"claimStatus": "Claimed", "driver": "graceful-drain.io", "sla": deadline}});
        events
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
        let claimed = events.get(name).await.unwrap();
        assert_eq!(
            claimed.status.unwrap().claim_status,
            Some(ClaimStatus::Claimed)
        );
    }
}

/// The agent alone (no reconciler), driven by a scripted kubelet over its sockets.
async fn kubelet_driven_agent(
    cluster: &Cluster,
    dir: &std::path::Path,
) -> (graceful_drain_agent::Started, Kubelet, Shutdown) {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: graceful_drain_agent::Args,
    }
    let command = AgentCommand::new(NODE, dir)
        .reconciler("off")
        .with(&["--event-check-interval", "1s"]);
    let args = Cli::try_parse_from(command.argv()).unwrap().args;
    let client = cluster
        .api()
        .client("system:serviceaccount:graceful-drain:node-agent");
    let shutdown = Shutdown::new();
    let started = graceful_drain_agent::start(args, client, shutdown.clone())
        .await
        .unwrap();
    let kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    (started, kubelet, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_calling_end_first_after_a_failed_drain_gets_a_fresh_drain() {
    let cluster = cluster().await;
    cluster.deploy_web(&web(), TIMEOUT).await.unwrap();
    let admin = cluster.client();
    bare_pod(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let (_started, mut kubelet, shutdown) = kubelet_driven_agent(&cluster, dir.path()).await;

    drain_event(&admin, "ev-1", None).await;
    kubelet.start("graceful-drain", NODE).await;
    let failed = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert!(failed.error.contains("declare no controller"), "{failed:?}");

    // A real SLM kubelet leaves the Node reason at `drain-started` after a failure, so
    // for the next event it calls End first.
    delete_bare_pod(&admin).await;
    drain_event(&admin, "ev-2", None).await;
    kubelet.event = "ev-2".into();
    let first = kubelet.end("graceful-drain", false).await;
    assert_eq!(
        (first.lifecycle_condition.as_str(), first.error.as_str()),
        ("drain-started", ""),
        "End of a new event starts its drain instead of replaying the old failure"
    );
    let done = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert_eq!(
        (done.lifecycle_condition.as_str(), done.error.as_str()),
        ("drain-complete", "")
    );
    assert!(!pods_here(&admin).await.iter().any(is_web));
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_stops_evicting_once_its_event_is_past_its_sla_and_the_kubelet_stopped_asking() {
    let cluster = cluster().await;
    // No disruption allowed: every eviction is refused and retried.
    let web = WebSpec {
        min_available: 4,
        ..web()
    };
    cluster.deploy_web(&web, TIMEOUT).await.unwrap();
    let admin = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let (started, mut kubelet, shutdown) = kubelet_driven_agent(&cluster, dir.path()).await;

    drain_event(&admin, "ev-1", Some(Duration::from_secs(3))).await;
    kubelet.start("graceful-drain", NODE).await;
    wait_for("evictions refused by the PDB", TIMEOUT, || async {
        cluster.api().stats().count("create", "pods/eviction") > 0
    })
    .await
    .unwrap();
    assert!(has_lb_label(&node(&admin).await));

    // The kubelet never calls again (it restarted, or lost the event): the agent notices
    // the SLA passed on its own.
    wait_for("the drain stopped", TIMEOUT, || async {
        drain_condition(&node(&admin).await).is_some_and(|(status, _, _)| status == "False")
    })
    .await
    .unwrap();
    let stopped = node(&admin).await;
    let (_, reason, message) = drain_condition(&stopped).unwrap();
    assert_eq!(reason, "DrainStopped");
    assert!(
        message.contains("SLA of lifecycleevent ev-1 passed"),
        "{message}"
    );
    assert!(is_cordoned(&stopped), "the cordon stays");
    assert!(
        !has_lb_label(&stopped),
        "the node is back behind the load balancers"
    );
    let phase = started.agent.phase(graceful_drain_agent::OpKind::Drain);
    assert!(
        matches!(phase, Some(graceful_drain_agent::Phase::Stopped(_))),
        "no eviction task is left running: {phase:?}"
    );
    assert!(pods_here(&admin).await.iter().filter(|p| is_web(p)).count() > 0);
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_selector_drain_waits_for_the_pods_the_webhook_relabelled() {
    let mut flags = FAST_AGENT.to_vec();
    flags.extend(["--pod-selector", "app=web"]);
    let (cluster, _components) = protected_cluster(Duration::from_secs(4), &flags).await;
    let admin = cluster.client();
    bare_pod(&admin).await;

    // The bare pod is not selected, so it does not refuse the drain.
    cli(&admin, "drain").await.unwrap();
    let here = pods_here(&admin).await;
    let isolated: Vec<String> = here
        .iter()
        .filter(|p| is_isolated(p))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(
        isolated.is_empty(),
        "drain-complete while isolated pods still run: {isolated:?}"
    );
    assert!(!here.iter().any(is_web));
    assert!(
        here.iter()
            .any(|p| p.metadata.name.as_deref() == Some("bare")),
        "pods the selector does not select stay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_nobody_claims_times_out_with_its_own_exit_code() {
    let cluster = cluster().await;
    let admin = cluster.client();
    // The transition exists (an agent published it once) but no agent runs now.
    let transitions = graceful_drain_agent::transitions::transitions(
        DRAIN_TRANSITION,
        graceful_drain_core::lifecycle::MAINTENANCE_TRANSITION,
        "graceful-drain.io",
        Duration::from_secs(60),
    );
    for transition in &transitions {
        graceful_drain_agent::transitions::publish(&admin, transition)
            .await
            .unwrap();
    }
    let request = Request {
        verb: "drain",
        node: NODE.into(),
        transition: DRAIN_TRANSITION.into(),
        wait: true,
        timeout: None,
        claim_timeout: Some(Duration::from_secs(1)),
        poll: Duration::from_millis(200),
    };
    let error = ctl::execute(&admin, &request, &Shutdown::new())
        .await
        .unwrap_err();
    assert_eq!(error.exit_code(), ctl::exit::TIMED_OUT, "{error}");
    assert!(error.to_string().contains("never claimed"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_drivers_event_is_left_for_its_owner() {
    use graceful_drain_core::lifecycle::{LifecycleTransition, LifecycleTransitionSpec};
    let (cluster, _components) = protected_cluster(Duration::from_secs(1), FAST_AGENT).await;
    let admin = cluster.client();
    // A transition of a driver that has no socket on this node (say, a firmware updater).
    let theirs = LifecycleTransition::new(
        "firmware-update",
        LifecycleTransitionSpec {
            start: "firmware-updating".into(),
            end: "firmware-updated".into(),
            node_name: None,
            node_selector: None,
            all_nodes: Some(true),
            sla: Some("5m0s".into()),
            driver: "firmware.example.com".into(),
        },
    );
    Api::<LifecycleTransition>::all(admin.clone())
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let events: Api<LifecycleEvent> = Api::all(admin.clone());
    let event = LifecycleEvent::new(
        "firmware-w1",
        LifecycleEventSpec {
            transition_name: "firmware-update".into(),
            binding_node: NODE.into(),
        },
    );
    events.create(&PostParams::default(), &event).await.unwrap();

    // Our own drain, created after it, goes through: by then the reconciler has examined
    // the older event in every pass.
    cli(&admin, "drain").await.unwrap();
    let left = events.get("firmware-w1").await.unwrap();
    let claim = left.status.as_ref().and_then(|s| s.claim_status);
    assert!(
        matches!(claim, None | Some(ClaimStatus::Pending)),
        "another driver's event was claimed: {claim:?}"
    );
    assert!(
        left.metadata
            .finalizers
            .as_ref()
            .is_none_or(|f| f.is_empty()),
        "no claim finalizer on another driver's event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_client_hands_every_429_to_the_drain_instead_of_retrying_it() {
    graceful_drain_core::runtime::install_crypto_provider();
    // Every request of a non-admin user is shed, as API Priority and Fairness does.
    let config = kube_sim::apiserver::Config {
        faults: kube_sim::apiserver::Faults {
            throttle_share: 1.0,
            throttle_retry_after: 30,
            ..Default::default()
        },
        ..Default::default()
    };
    let shutdown = Shutdown::new();
    let api = kube_sim::apiserver::ApiServer::start(config, shutdown.clone())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("agent.kubeconfig");
    api.write_kubeconfig(
        &kubeconfig,
        "system:serviceaccount:graceful-drain:node-agent",
    )
    .unwrap();
    let args = graceful_drain_core::kubeclient::KubeArgs {
        kubeconfig: Some(kubeconfig),
        context: None,
    };
    let client = args.client_without_retries().await.unwrap();
    // kube's default client would sleep and retry here; the drain's own backoff must see it.
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        Api::<Node>::all(client).get_opt("worker-1"),
    )
    .await
    .expect("a throttled request is answered, not retried behind the caller's back");
    match answer {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 429, "{status:?}"),
        other => panic!("expected the 429, got {other:?}"),
    }
}

/// A Job hook on the simulated cluster's own Job controller and kubelets: once every pod
/// has left the node, the Job's pod runs on that (cordoned) node, and the drain completes
/// only after the Job does, with an Event on the Node saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_hook_runs_on_the_drained_node_before_drain_complete() {
    let hooks = json!([{"name": "report", "at": "after-last-pod", "pollInterval": "200ms",
        "job": {"namespace": "ops", "template": {"spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {"sim.graceful-drain.io/run-for": "2s"}},
            "spec": {"containers": [{"name": "report", "image": "busybox"}]}}}}}}])
    .to_string();
    let mut flags = FAST_AGENT.to_vec();
    flags.extend(["--hooks", hooks.as_str()]);
    let (cluster, _components) = protected_cluster(Duration::from_secs(1), &flags).await;
    let admin = cluster.client();
    let ns = k8s_openapi::api::core::v1::Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some("ops".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    cli(&admin, "drain").await.unwrap();
    assert_no_web_pods_left(&admin).await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), "default");
    let done = events
        .list(&ListParams::default().fields(&format!("reason={}", agent_reason::HOOK_SUCCEEDED)))
        .await
        .unwrap()
        .items;
    let message = done
        .first()
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    assert!(
        message.starts_with("hook report (after-last-pod) done after"),
        "{done:?}"
    );
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(admin.clone(), "ops");
    let job = jobs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(job.len(), 1);
    let complete = job[0]
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        });
    assert!(complete, "drain-complete came after the Job completed");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "ops");
    let ran = pods
        .list(&ListParams::default().labels(&format!("{HOOK_LABEL}=report")))
        .await
        .unwrap()
        .items;
    assert_eq!(ran.len(), 1);
    assert_eq!(
        ran[0].spec.as_ref().unwrap().node_name.as_deref(),
        Some(NODE)
    );
    assert_eq!(
        ran[0].status.as_ref().unwrap().phase.as_deref(),
        Some("Succeeded")
    );
}

/// `graceful-drain drain NODE` prints the drain's plan — each tier with its pods — as the
/// node agent posts it, before the first tier starts: here the web pods, then the pods of
/// an `edge` Deployment that `--tiers` puts in a tier of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_prints_the_drain_plan_before_any_eviction() {
    let tiers = r#"[{"name":"edge","match":[{"podSelector":"app=edge"}]}]"#;
    let mut flags = FAST_AGENT.to_vec();
    flags.extend(["--tiers", tiers]);
    let (cluster, _components) = protected_cluster(Duration::from_secs(1), &flags).await;
    let edge = WebSpec {
        name: "edge".into(),
        replicas: 2,
        min_available: 1,
        grace_period_seconds: 1,
        ..WebSpec::default()
    };
    cluster.deploy_web(&edge, TIMEOUT).await.unwrap();
    let admin = cluster.client();
    let here: Vec<String> = pods_here(&admin)
        .await
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(
        here.iter().any(|n| n.starts_with("edge-")) && here.iter().any(|n| n.starts_with("web-")),
        "both Deployments have a pod on {NODE}: {here:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("admin.kubeconfig");
    cluster
        .api()
        .write_kubeconfig(&kubeconfig, "admin")
        .unwrap();
    let drain = tokio::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain-e2e"))
        .args(["drain", NODE, "--timeout=60s", "--kubeconfig"])
        .arg(&kubeconfig)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(TIMEOUT, drain)
        .await
        .expect("drain finished in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at = |text: &str| {
        stdout
            .find(text)
            .unwrap_or_else(|| panic!("{text:?} in {stdout}"))
    };
    let plan = at("graceful-drain.io/DrainPlan: eviction plan\n    1/2 workloads: ");
    let edge_line = &stdout[plan..].lines().nth(2).unwrap_or_default();
    assert!(edge_line.starts_with("    2/2 edge: "), "{stdout}");
    assert!(plan < at("eviction tier 1/2 (workloads)"), "{stdout}");
    assert!(plan < at(" remaining"), "{stdout}");
    assert_no_web_pods_left(&admin).await;

    // `graceful-drain status -o json` afterwards: the webhook replica holding the deleter
    // Lease, no pod left isolated and the node's finished transition, as a script would
    // read them.
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_graceful-drain-e2e"))
        .args([
            "status",
            "-o",
            "json",
            "--namespace",
            sim_components::NAMESPACE,
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(TIMEOUT, status)
        .await
        .expect("status answered in time")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let holder = sim_components::deleter_lease_holder(&admin).await;
    assert!(holder.is_some(), "the webhook holds its Lease");
    assert_eq!(
        report["deleterLease"]["holder"].as_str(),
        holder.as_deref(),
        "{report:#}"
    );
    assert_eq!(report["deleterLease"]["expired"], false, "{report:#}");
    assert!(report["protection"]["state"].is_string(), "{report:#}");
    assert_eq!(
        report["isolatedPods"],
        json!([]),
        "the drain left no isolated pod"
    );
    assert!(report["lifecycleEvents"].is_array(), "{report:#}");
    let node_row = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == NODE)
        .unwrap();
    assert_eq!(node_row["lifecycleTransition"]["reason"], "drain-complete");
    assert_eq!(node_row["schedulable"], false);
}
