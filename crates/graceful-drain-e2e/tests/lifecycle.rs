//! The lifecycle reconciler against a scripted SLM driver (real gRPC over unix sockets)
//! and the simulated API server: every branch of docs/design.md §3, SLA expiry, driver
//! errors, missing registration, restarts, racing reconcilers and the stale-condition case.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "lifecycle_support/plugin.rs"]
mod plugin;
use graceful_drain_e2e::sim_api;
use graceful_drain_testing::eventually::eventually;
use std::future::ready;

use std::time::Duration;

use graceful_drain_agent::reconciler::decide::Action;
use graceful_drain_agent::reconciler::{self, Context, Mode, Reconciler, ReconcilerArgs};
use graceful_drain_core::labels::{
    CLAIM_FINALIZER, LIFECYCLE_MESSAGE_ANNOTATION, LIFECYCLE_STARTED_ANNOTATION,
};
use graceful_drain_core::lifecycle::{ClaimStatus, LifecycleEvent, LifecycleEventSpec};
use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use plugin::{Call, Dirs, Reply};
use serde_json::{Value, json};
use sim_api::SimApi;
use tokio_util::sync::CancellationToken;

const NODE: &str = "worker-1";
const DRIVER: &str = "graceful-drain.io";

struct Harness {
    api: SimApi,
    /// Events created so far: names sort in creation order, so "the first event" is the
    /// one every reconciler lists first (the API server's generateName suffixes are random).
    created: std::sync::atomic::AtomicUsize,
    dirs: Dirs,
    stop: CancellationToken,
    metrics: reconciler::metrics::Metrics,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn transition(name: &str, start: &str, end: &str, sla: &str) -> Value {
    json!({"apiVersion": "lifecycle.graceful-drain.io/v1alpha1", "kind": "LifecycleTransition",
        "metadata": {"name": name},
        "spec": {"start": start, "end": end, "allNodes": true, "sla": sla, "driver": DRIVER}})
}

impl Harness {
    async fn new() -> Self {
        let api = SimApi::new().await;
        api.put("nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": {"conditions": []}})).await;
        api.put(
            "lifecycletransitions",
            transition("graceful-drain", "drain-started", "drain-complete", "15m0s"),
        )
        .await;
        api.put(
            "lifecycletransitions",
            transition(
                "graceful-maintenance-complete",
                "uncordoning",
                "maintenance-complete",
                "5m0s",
            ),
        )
        .await;
        Self {
            api,
            created: std::sync::atomic::AtomicUsize::new(0),
            dirs: Dirs::new(),
            stop: CancellationToken::new(),
            metrics: reconciler::metrics::Metrics::default(),
        }
    }

    fn driver(&self) -> plugin::Driver {
        plugin::serve(&self.dirs, DRIVER, "SLMPlugin", self.stop.clone())
    }

    fn context(&self) -> Context {
        Context {
            client: self.api.client(),
            node_name: NODE.into(),
            driver_name: DRIVER.into(),
            registry_dir: self.dirs.registry.clone(),
            plugins_dir: self.dirs.plugins.clone(),
            metrics: self.metrics.clone(),
        }
    }

    async fn reconciler(&self) -> Reconciler {
        Reconciler::new(self.context(), Duration::from_secs(5)).await
    }

    async fn create_event(&self, transition: &str) -> String {
        let api: Api<LifecycleEvent> = Api::all(self.api.client());
        let mut event = LifecycleEvent::new(
            "",
            LifecycleEventSpec {
                transition_name: transition.into(),
                binding_node: NODE.into(),
            },
        );
        let n = self
            .created
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        event.metadata = ObjectMeta {
            name: Some(format!("{NODE}-drain-{n:03}")),
            ..ObjectMeta::default()
        };
        api.create(&PostParams::default(), &event)
            .await
            .unwrap()
            .metadata
            .name
            .unwrap()
    }

    async fn event(&self, name: &str) -> Option<Value> {
        self.api.get("lifecycleevents", name).await
    }

    /// The claim statuses an event went through, in order, without repeats.
    async fn statuses(&self, name: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, obj) in self.api.history("lifecycleevents", name).await {
            let s = obj["status"]["claimStatus"]
                .as_str()
                .unwrap_or("Pending")
                .to_string();
            if out.last() != Some(&s) {
                out.push(s);
            }
        }
        out
    }

    async fn condition(&self) -> Option<Value> {
        let node = self.api.get("nodes", NODE).await.unwrap();
        node["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "LifecycleTransition")
            .cloned()
    }

    async fn set_condition(&self, reason: &str, at: Timestamp) {
        let mut node = self.api.get("nodes", NODE).await.unwrap();
        node["status"]["conditions"] = json!([{"type": "LifecycleTransition", "status": "True", "reason": reason,
            "message": "Lifecycle Transition 'graceful-drain'", "lastTransitionTime": reconciler_time(at)}]);
        self.api.put("nodes", node).await;
    }
}

/// An event's status as the API server sets it on create, before anyone claims it.
fn created_status() -> Value {
    json!({"claimStatus": "Pending"})
}

fn reconciler_time(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second()).unwrap().to_string()
}

/// Steps until a pass makes no progress (bounded), as the run loop does.
async fn settle(r: &Reconciler, now: Timestamp) -> Vec<(String, Action)> {
    let mut actions = Vec::new();
    for _ in 0..20 {
        let report = r.step(now).await.unwrap();
        actions.extend(report.actions);
        if !report.progressed {
            return actions;
        }
    }
    panic!("reconciler kept making progress: {actions:?}");
}

fn later(now: Timestamp, secs: i64) -> Timestamp {
    now.checked_add(SignedDuration::from_secs(secs)).unwrap()
}

#[tokio::test]
async fn drain_event_is_claimed_started_polled_and_succeeds() {
    let h = Harness::new().await;
    let driver = h.driver();
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    let now = Timestamp::now();

    let report = r.step(now).await.unwrap();
    assert!(matches!(report.actions[0].1, Action::Claim { .. }));
    let ev = h.event(&name).await.unwrap();
    assert_eq!(ev["status"]["claimStatus"], "Claimed");
    assert_eq!(ev["status"]["driver"], DRIVER);
    assert_eq!(ev["status"]["sla"], reconciler_time(later(now, 900)));
    assert_eq!(ev["metadata"]["finalizers"], json!([CLAIM_FINALIZER]));

    settle(&r, now).await;
    assert_eq!(
        driver.calls()[0],
        Call::Start {
            event: name.clone(),
            node: NODE.into(),
            transition: "graceful-drain".into(),
            start: "drain-started".into(),
            end: "drain-complete".into(),
        }
    );
    let c = h.condition().await.unwrap();
    assert_eq!(c["reason"], "drain-started");
    assert_eq!(c["status"], "True");
    assert_eq!(c["message"], "Lifecycle Transition 'graceful-drain'");
    assert!(c["lastTransitionTime"].is_string());
    assert!(h.event(&name).await.is_some(), "still draining");

    settle(&r, later(now, 10)).await;
    assert!(h.event(&name).await.is_none(), "deleted once succeeded");
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);
    assert_eq!(h.condition().await.unwrap()["reason"], "drain-complete");
    assert_eq!(h.metrics.events_with(ClaimStatus::Claimed), 1);
    assert_eq!(h.metrics.events_with(ClaimStatus::Succeeded), 1);
    let calls = driver.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(matches!(
        &calls[1],
        Call::End {
            sla_expired: false,
            ..
        }
    ));
}

#[tokio::test]
async fn unregistered_or_foreign_plugin_leaves_event_pending() {
    let h = Harness::new().await;
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    let actions = settle(&r, Timestamp::now()).await;
    assert_eq!(
        actions,
        [(
            name.clone(),
            Action::Wait(reconciler::decide::WaitReason::PluginNotRegistered)
        )]
    );

    // A stale socket nobody listens on (a crashed driver): GetInfo fails.
    let stale = h.dirs.registry.join(format!("{DRIVER}-reg.sock"));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    settle(&r, Timestamp::now()).await;
    assert!(
        h.event(&name).await.unwrap()["status"] == created_status(),
        "still Pending"
    );

    // A socket answering as another plugin type is not an SLM driver.
    let other = plugin::serve(&h.dirs, DRIVER, "CSIPlugin", h.stop.clone());
    settle(&r, Timestamp::now()).await;
    assert!(
        h.event(&name).await.unwrap()["status"] == created_status(),
        "still Pending"
    );
    assert!(other.calls().is_empty());
    assert!(
        h.api
            .writes()
            .iter()
            .all(|w| !w.path.contains("lifecycleevents/")),
        "no writes to a pending event"
    );
}

#[tokio::test]
async fn event_claims_once_the_driver_registers() {
    let h = Harness::new().await;
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    settle(&r, Timestamp::now()).await;
    let driver = h.driver();
    settle(&r, Timestamp::now()).await;
    assert_eq!(
        h.event(&name).await.unwrap()["status"]["claimStatus"],
        "Claimed"
    );
    assert_eq!(driver.starts(), 1);
}

#[tokio::test]
async fn driver_error_or_grpc_failure_fails_the_event() {
    for (reply, expect) in [
        (
            Reply::Error("node carries the control plane"),
            "node carries the control plane",
        ),
        (Reply::Grpc(tonic::Code::Internal), "scripted failure"),
    ] {
        let h = Harness::new().await;
        let driver = h.driver();
        driver.set_script(move |_, _| reply.clone());
        let r = h.reconciler().await;
        let name = h.create_event("graceful-drain").await;
        settle(&r, Timestamp::now()).await;
        assert!(h.event(&name).await.is_none());
        assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Failed"]);
        let history = h.api.history("lifecycleevents", &name).await;
        let message = history
            .iter()
            .rev()
            .find_map(|(_, o)| {
                o["metadata"]["annotations"][LIFECYCLE_MESSAGE_ANNOTATION]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap();
        assert!(message.contains(expect), "{message}");
        assert!(
            h.condition().await.is_none(),
            "a failed call does not touch the node"
        );
    }
}

#[tokio::test]
async fn sla_expiry_stops_the_driver_and_ends_sla_expired() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(plugin::draining(usize::MAX));
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    let now = Timestamp::now();
    settle(&r, now).await;
    settle(&r, later(now, 600)).await;
    assert!(h.event(&name).await.is_some());
    settle(&r, later(now, 901)).await;
    assert!(h.event(&name).await.is_none());
    assert_eq!(
        h.statuses(&name).await,
        ["Pending", "Claimed", "SlaExpired"]
    );
    assert_eq!(
        driver.calls().last(),
        Some(&Call::End {
            event: name.clone(),
            sla_expired: true
        })
    );
}

#[tokio::test]
async fn stale_end_reason_does_not_complete_a_new_event() {
    let h = Harness::new().await;
    let driver = h.driver();
    let now = Timestamp::now();
    h.set_condition("drain-complete", later(now, -3600)).await;
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    settle(&r, now).await;
    assert_eq!(driver.starts(), 1, "the drain really ran");
    assert!(
        h.event(&name).await.is_some(),
        "not succeeded on the stale condition"
    );
    settle(&r, later(now, 10)).await;
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);

    // A second drain of the same node later runs again, although drain-complete shows.
    driver.set_script(plugin::draining(2));
    let second = h.create_event("graceful-drain").await;
    settle(&r, later(now, 20)).await;
    assert_eq!(driver.starts(), 2);
    assert!(h.event(&second).await.is_some());
    settle(&r, later(now, 30)).await;
    settle(&r, later(now, 40)).await;
    assert_eq!(
        h.statuses(&second).await,
        ["Pending", "Claimed", "Succeeded"]
    );
}

#[tokio::test]
async fn restart_mid_transition_resumes_without_a_second_start() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(plugin::draining(3));
    let name = h.create_event("graceful-drain").await;
    let now = Timestamp::now();
    {
        let first = h.reconciler().await;
        settle(&first, now).await;
    }
    assert_eq!(driver.starts(), 1);
    let ev = h.event(&name).await.unwrap();
    assert!(ev["metadata"]["annotations"][LIFECYCLE_STARTED_ANNOTATION].is_string());

    let second = h.reconciler().await;
    for i in 1..=4 {
        settle(&second, later(now, 10 * i)).await;
    }
    assert_eq!(driver.starts(), 1, "{:?}", driver.calls());
    assert!(h.event(&name).await.is_none());
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);
}

#[tokio::test]
async fn a_node_store_behind_our_own_condition_write_never_starts_twice() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(plugin::draining(3));
    let now = Timestamp::now();
    // The previous event ended within the same second this one starts in.
    h.set_condition("maintenance-complete", now).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.api.client());
    let before_start = nodes.get(NODE).await.unwrap();
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    settle(&r, now).await;
    assert_eq!(driver.starts(), 1);
    assert_eq!(h.condition().await.unwrap()["reason"], "drain-started");

    // A pass woken by the event watch (our started annotation arrived) while the Node
    // watch has not yet delivered the drain-started condition: the stored Node still
    // shows the last event's reason, stamped within the same second.
    let events: Api<LifecycleEvent> = Api::all(h.api.client());
    let stored = events.list(&Default::default()).await.unwrap().items;
    let stored = stored.into_iter().map(std::sync::Arc::new).collect();
    let report = r
        .step_cached(stored, Some(std::sync::Arc::new(before_start)), now)
        .await
        .unwrap();
    assert_eq!(report.actions, [(name.clone(), Action::End)]);
    assert_eq!(driver.starts(), 1, "{:?}", driver.calls());
}

#[tokio::test]
async fn a_throttled_read_of_the_transition_never_fails_a_claimed_event() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(plugin::draining(2));
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    let now = Timestamp::now();
    settle(&r, now).await;
    assert_eq!(driver.starts(), 1);

    // API Priority and Fairness answers 429 to reads of the transition for a while.
    h.api.throttle_gets(Some("/lifecycletransitions/"));
    settle(&r, later(now, 10)).await;
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed"]);
    assert!(
        h.event(&name).await.is_some(),
        "not concluded on an unknown transition"
    );

    h.api.throttle_gets(None);
    settle(&r, later(now, 20)).await;
    settle(&r, later(now, 30)).await;
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);
    assert_eq!(driver.starts(), 1, "{:?}", driver.calls());
}

#[tokio::test]
async fn two_reconcilers_on_one_node_claim_once() {
    let h = Harness::new().await;
    let _driver = h.driver();
    let name = h.create_event("graceful-drain").await;
    let (a, b) = (h.reconciler().await, h.reconciler().await);
    let now = Timestamp::now();
    let (ra, rb) = tokio::join!(a.step(now), b.step(now));
    ra.unwrap();
    rb.unwrap();
    let claims: Vec<_> = h
        .api
        .writes()
        .into_iter()
        .filter(|w| {
            w.path.ends_with(&format!("{name}/status"))
                && w.body["status"]["claimStatus"] == "Claimed"
        })
        .collect();
    let won = claims.iter().filter(|w| w.code == 200).count();
    assert_eq!(won, 1, "{claims:?}");
    for i in 0..4 {
        settle(&a, later(now, 10 * i)).await;
        settle(&b, later(now, 10 * i)).await;
    }
    assert!(h.event(&name).await.is_none());
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);
}

#[tokio::test]
async fn one_claimed_event_per_node() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(plugin::draining(usize::MAX));
    let first = h.create_event("graceful-drain").await;
    let second = h.create_event("graceful-maintenance-complete").await;
    let r = h.reconciler().await;
    let now = Timestamp::now();
    settle(&r, now).await;
    assert_eq!(
        h.event(&first).await.unwrap()["status"]["claimStatus"],
        "Claimed"
    );
    assert!(
        h.event(&second).await.unwrap()["status"] == created_status(),
        "waits for the first"
    );
    let first_name = first.clone();
    driver.set_script(move |call, _| match call {
        Call::Start { .. } => Reply::Condition("uncordoning"),
        Call::End { event, .. } if *event == first_name => Reply::Condition("drain-complete"),
        Call::End { .. } => Reply::Condition("maintenance-complete"),
    });
    settle(&r, later(now, 10)).await;
    settle(&r, later(now, 20)).await;
    assert!(h.event(&first).await.is_none());
    assert!(h.event(&second).await.is_none());
    assert_eq!(
        h.statuses(&second).await,
        ["Pending", "Claimed", "Succeeded"]
    );
    assert_eq!(
        h.condition().await.unwrap()["reason"],
        "maintenance-complete"
    );
}

#[tokio::test]
async fn deleting_a_claimed_event_stops_the_driver_and_releases_it() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(plugin::draining(usize::MAX));
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    let now = Timestamp::now();
    settle(&r, now).await;
    h.api.delete("lifecycleevents", &name).await;
    assert!(h.event(&name).await.is_some(), "held by the finalizer");
    settle(&r, later(now, 1)).await;
    assert!(h.event(&name).await.is_none());
    assert_eq!(
        driver.calls().last(),
        Some(&Call::End {
            event: name,
            sla_expired: true
        })
    );
}

#[tokio::test]
async fn writes_are_guarded_by_resource_version() {
    let h = Harness::new().await;
    let _driver = h.driver();
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    settle(&r, Timestamp::now()).await;
    let writes = h.api.writes();
    for w in writes.iter().filter(|w| w.method == http::Method::PUT) {
        assert!(
            w.body["metadata"]["resourceVersion"].is_string(),
            "{} unguarded",
            w.path
        );
    }
    let node_patch = writes
        .iter()
        .find(|w| w.path == format!("/api/v1/nodes/{NODE}/status"))
        .unwrap();
    assert_eq!(node_patch.body[0]["op"], "test");
    assert_eq!(node_patch.body[0]["path"], "/metadata/resourceVersion");
    assert!(
        writes
            .iter()
            .any(|w| w.path.ends_with(&format!("lifecycleevents/{name}/status")))
    );
}

/// Runs the reconciler in `mode` with `tick` until the returned token is cancelled.
fn run_reconciler(
    h: &Harness,
    mode: Mode,
    tick: Duration,
) -> (
    tokio::task::JoinHandle<Result<(), reconciler::Error>>,
    CancellationToken,
) {
    let args = ReconcilerArgs {
        mode,
        tick,
        call_timeout: Duration::from_secs(5),
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (ctx, shutdown) = (h.context(), shutdown.clone());
        async move { reconciler::run(&args, ctx, shutdown).await }
    });
    (task, shutdown)
}

#[tokio::test]
async fn run_drives_events_from_the_watch_until_shutdown() {
    let h = Harness::new().await;
    let _driver = h.driver();
    // The lifecycle CRDs the harness installs make `auto` turn the reconciler on.
    let (task, shutdown) = run_reconciler(&h, Mode::Auto, Duration::from_millis(100));
    let name = h.create_event("graceful-drain").await;
    h.api.wait_deleted("lifecycleevents", &name).await;
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A pass that could not read the transition (a 429 from Priority and Fairness) is run
/// again within a second, not at the next tick: with an hour-long tick and nothing else
/// changing, the event is still claimed once the reads are answered again.
#[tokio::test]
async fn a_failed_pass_is_retried_without_waiting_for_the_tick() {
    let h = Harness::new().await;
    let driver = h.driver();
    h.api.throttle_gets(Some("/lifecycletransitions/"));
    let (task, shutdown) = run_reconciler(&h, Mode::On, Duration::from_secs(3600));
    let name = h.create_event("graceful-drain").await;
    // Two throttled passes: the one the new event woke, and a retry of it.
    let throttled_twice = || ready(h.api.throttled_gets() >= 2);
    h.api
        .until("the throttled pass run again", throttled_twice)
        .await;
    assert_eq!(h.statuses(&name).await, ["Pending"]);
    h.api.throttle_gets(None);
    eventually("the driver started before the tick", || {
        ready(driver.starts() > 0)
    })
    .await;
    assert_eq!(h.statuses(&name).await[..2], ["Pending", "Claimed"]);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn auto_stays_off_when_the_api_is_built_in_and_off_returns_at_once() {
    let h = Harness::new().await;
    let off = ReconcilerArgs {
        mode: Mode::Off,
        ..ReconcilerArgs::default()
    };
    reconciler::run(&off, h.context(), CancellationToken::new())
        .await
        .unwrap();
    assert!(
        reconciler::auto_enabled(&h.api.client()).await.unwrap(),
        "served by a CRD: on"
    );
    h.api.remove_lifecycle_api().await;
    assert!(
        reconciler::auto_enabled(&h.api.client()).await.unwrap(),
        "API not served: on, waiting for CRDs"
    );
    // Served without a CRD object behind it (built in): the discovery says
    // lifecycleevents exist, the CRD lookup finds nothing.
    let h = Harness::new().await;
    h.api.hide_lifecycle_crds();
    assert!(!reconciler::auto_enabled(&h.api.client()).await.unwrap());
}

// ---- CLI: `drain` / `uncordon` follow the event the reconciler drives ----

use graceful_drain::ctl::{self, Request};

fn request(verb: &'static str, transition: &str, timeout: Duration) -> Request {
    Request {
        verb,
        node: NODE.into(),
        transition: transition.into(),
        wait: true,
        timeout: Some(timeout),
        claim_timeout: None,
        poll: Duration::from_millis(50),
    }
}

/// Runs the reconciler loop in the background, as the node agent does.
fn spawn_reconciler(h: &Harness) -> CancellationToken {
    run_reconciler(h, Mode::On, Duration::from_millis(50)).1
}

#[tokio::test]
async fn cli_drain_follows_the_event_to_success() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(plugin::draining(3));
    let stop = spawn_reconciler(&h);
    let client = h.api.client();
    let name = ctl::execute(
        &client,
        &request("drain", "graceful-drain", Duration::from_secs(20)),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(name.starts_with("worker-1-drain-"), "{name}");
    h.api.wait_deleted("lifecycleevents", &name).await;
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);
    assert_eq!(h.condition().await.unwrap()["reason"], "drain-complete");

    // uncordon runs the maintenance-complete transition the same way.
    driver.set_script(|call, _| match call {
        Call::Start { .. } => Reply::Condition("uncordoning"),
        Call::End { .. } => Reply::Condition("maintenance-complete"),
    });
    let name = ctl::execute(
        &client,
        &request(
            "uncordon",
            "graceful-maintenance-complete",
            Duration::from_secs(20),
        ),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(name.starts_with("worker-1-uncordon-"), "{name}");
    assert_eq!(
        h.condition().await.unwrap()["reason"],
        "maintenance-complete"
    );
    stop.cancel();
}

#[tokio::test]
async fn cli_drain_past_its_sla_fails_naming_the_blocking_pods() {
    let h = Harness::new().await;
    h.api
        .put(
            "lifecycletransitions",
            transition("graceful-drain", "drain-started", "drain-complete", "1s"),
        )
        .await;
    let driver = h.driver();
    driver.set_script(plugin::draining(usize::MAX));
    let mut node = h.api.get("nodes", NODE).await.unwrap();
    node["status"]["conditions"] = json!([{"type": "DrainInProgress", "status": "True", "reason": "PodsBlocked",
        "message": "1 pod left: shop/web-0 blocked by PodDisruptionBudget shop/web"}]);
    h.api.put("nodes", node).await;
    let stop = spawn_reconciler(&h);
    let err = ctl::execute(
        &h.api.client(),
        &request("drain", "graceful-drain", Duration::from_secs(20)),
        &CancellationToken::new(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("ended SlaExpired"), "{text}");
    assert!(
        text.contains("shop/web-0 blocked by PodDisruptionBudget shop/web"),
        "{text}"
    );
    assert!(driver.calls().iter().any(|c| matches!(
        c,
        Call::End {
            sla_expired: true,
            ..
        }
    )));
    stop.cancel();
}

#[tokio::test]
async fn cli_reports_missing_node_transition_and_crds() {
    let h = Harness::new().await;
    let client = h.api.client();
    let none = CancellationToken::new();
    let mut r = request("drain", "graceful-drain", Duration::from_secs(1));
    r.node = "no-such-node".into();
    let err = ctl::execute(&client, &r, &none).await.unwrap_err();
    assert_eq!(err.to_string(), "node no-such-node not found");

    let err = ctl::execute(
        &client,
        &request("drain", "no-such-transition", Duration::from_secs(1)),
        &none,
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("lifecycletransition no-such-transition not found"),
        "{err}"
    );

    h.api.remove_lifecycle_api().await;
    let err = ctl::execute(
        &client,
        &request("drain", "graceful-drain", Duration::from_secs(1)),
        &none,
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("lifecycle.graceful-drain.io CRDs not installed"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("graceful-drain crds | kubectl apply -f -"),
        "{err}"
    );
    assert!(
        h.api.list("lifecycleevents").await.is_empty(),
        "nothing created"
    );
}

#[tokio::test]
async fn cli_timeout_without_a_driver_says_the_event_was_never_claimed() {
    let h = Harness::new().await;
    let err = ctl::execute(
        &h.api.client(),
        &request("drain", "graceful-drain", Duration::from_millis(300)),
        &CancellationToken::new(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("not finished after"), "{text}");
    assert!(text.contains("never claimed"), "{text}");
    assert_eq!(
        h.api.list("lifecycleevents").await.len(),
        1,
        "the event stays for the agent"
    );
}

#[tokio::test]
async fn cli_without_wait_creates_once_and_joins_a_running_drain() {
    let h = Harness::new().await;
    let mut r = request("drain", "graceful-drain", Duration::from_secs(1));
    r.wait = false;
    let client = h.api.client();
    let first = ctl::execute(&client, &r, &CancellationToken::new())
        .await
        .unwrap();
    let again = ctl::execute(&client, &r, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(first, again, "a second drain joins the running one");
    assert_eq!(h.api.list("lifecycleevents").await.len(), 1);
}

#[tokio::test]
async fn status_lists_events_and_node_conditions() {
    let h = Harness::new().await;
    h.set_condition("drain-complete", Timestamp::now()).await;
    let name = h.create_event("graceful-drain").await;
    let text = ctl::status::render(&h.api.client(), Some(NODE), Timestamp::now())
        .await
        .unwrap();
    let event_row = text.lines().find(|l| l.starts_with(&name)).unwrap();
    assert!(
        event_row.contains("graceful-drain") && event_row.contains("Pending"),
        "{text}"
    );
    let node_row = text
        .lines()
        .find(|l| l.starts_with(&format!("{NODE} ")))
        .unwrap();
    assert!(node_row.contains("drain-complete"), "{text}");
}

#[tokio::test]
async fn status_and_drain_go_on_beside_a_malformed_event() {
    let h = Harness::new().await;
    let good = h.create_event("graceful-drain").await;
    // Without bindingNode, as a schema without `required` (an older CRD) lets in: the CRD
    // loses it for this event, as kube-apiserver would otherwise refuse the event.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(h.api.client());
    let name = "lifecycleevents.lifecycle.graceful-drain.io";
    let mut crd = serde_json::to_value(crds.get(name).await.unwrap()).unwrap();
    for version in crd["spec"]["versions"].as_array_mut().unwrap() {
        let spec = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        spec.as_object_mut().unwrap().remove("required");
    }
    let older = serde_json::from_value(crd).unwrap();
    crds.replace(name, &Default::default(), &older)
        .await
        .unwrap();
    h.api
        .put(
            "lifecycleevents",
            json!({"apiVersion": "lifecycle.graceful-drain.io/v1alpha1", "kind": "LifecycleEvent",
                "metadata": {"name": "by-hand"}, "spec": {"transitionName": "graceful-drain"}}),
        )
        .await;
    let client = h.api.client();
    let text = ctl::status::render(&client, None, Timestamp::now())
        .await
        .unwrap();
    assert!(text.lines().any(|l| l.starts_with(&good)), "{text}");
    assert!(
        text.contains("warning: skipping LifecycleEvent by-hand: missing field `bindingNode`"),
        "{text}"
    );

    let mut r = request("drain", "graceful-drain", Duration::from_secs(1));
    r.wait = false;
    let joined = ctl::execute(&client, &r, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        joined, good,
        "the running drain of the node is found and joined"
    );
}

/// The chart's webhook Deployment and agent DaemonSet (deploy/graceful-drain.yaml), and the
/// same renamed as `helm install ops -n ops-system` renders them.
fn chart_workloads() -> Vec<Value> {
    let objects = graceful_drain_sim::scenario::shipped::objects().unwrap();
    let workloads: Vec<Value> = objects
        .into_iter()
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "DaemonSet")
        .collect();
    let ops: Vec<Value> = workloads
        .iter()
        .map(graceful_drain_testing::fixtures::as_release_ops)
        .collect();
    workloads.into_iter().chain(ops).collect()
}

#[tokio::test]
async fn status_finds_every_release_by_its_labels() {
    use graceful_drain::ctl::status::{Scope, fetch};
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::core::v1::Namespace;

    let h = Harness::new().await;
    let client = h.api.client();
    for ns in ["graceful-drain", "ops-system", "tools"] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    // Another product's webhook: the component label alone does not make a release.
    let mut unrelated = chart_workloads()
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    unrelated["metadata"]["namespace"] = json!("tools");
    unrelated["metadata"]["labels"]["app.kubernetes.io/name"] = json!("other");
    for object in chart_workloads().into_iter().chain([unrelated]) {
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_string();
        if object["kind"] == "Deployment" {
            let d: Deployment = serde_json::from_value(object).unwrap();
            Api::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &d)
                .await
                .unwrap();
        } else {
            let ds: DaemonSet = serde_json::from_value(object).unwrap();
            Api::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &ds)
                .await
                .unwrap();
        }
    }

    let everywhere = fetch(&client, &Scope::default(), None).await.unwrap();
    let found: Vec<String> = std::iter::once(&everywhere.release)
        .chain(&everywhere.other_releases)
        .map(|r| r.release.describe())
        .collect();
    assert_eq!(
        found,
        [
            "graceful-drain in namespace graceful-drain",
            "ops in namespace ops-system"
        ]
    );
    assert_eq!(
        everywhere.other_releases[0].release.lease,
        Some(("ops-system".into(), "ops-graceful-drain-webhook".into()))
    );
    let text = ctl::status::render(&client, None, Timestamp::now())
        .await
        .unwrap();
    assert!(text.starts_with("2 graceful-drain releases: "), "{text}");

    for scope in [
        Scope {
            namespace: Some("ops-system".into()),
            release: None,
        },
        Scope {
            namespace: None,
            release: Some("ops".into()),
        },
    ] {
        let one = fetch(&client, &scope, None).await.unwrap();
        assert_eq!(
            one.release.release.name.as_deref(),
            Some("ops"),
            "{scope:?}"
        );
        assert!(one.other_releases.is_empty(), "{scope:?}");
    }
}

#[tokio::test]
async fn unreachable_driver_is_retried_not_failed() {
    let h = Harness::new().await;
    let driver = h.driver();
    driver.set_script(|_, _| Reply::Grpc(tonic::Code::Unavailable));
    let r = h.reconciler().await;
    let name = h.create_event("graceful-drain").await;
    let now = Timestamp::now();
    settle(&r, now).await;
    settle(&r, later(now, 10)).await;
    assert_eq!(
        h.event(&name).await.unwrap()["status"]["claimStatus"],
        "Claimed",
        "not failed"
    );
    assert_eq!(driver.starts(), 2, "retried at the next pass");

    // The driver goes away, leaving its registration socket behind (a crash), then
    // comes back: retried meanwhile, then done.
    h.stop.cancel();
    let stale = h.dirs.registry.join(format!("{DRIVER}-reg.sock"));
    eventually("the driver stopped", || ready(!stale.exists())).await;
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    settle(&r, later(now, 20)).await;
    assert_eq!(
        h.event(&name).await.unwrap()["status"]["claimStatus"],
        "Claimed"
    );
    let restarted = CancellationToken::new();
    let back = plugin::serve(&h.dirs, DRIVER, "SLMPlugin", restarted.clone());
    for i in 3..6 {
        settle(&r, later(now, 10 * i)).await;
    }
    assert!(h.event(&name).await.is_none());
    assert_eq!(h.statuses(&name).await, ["Pending", "Claimed", "Succeeded"]);
    assert!(back.starts() >= 1);
    restarted.cancel();
}
