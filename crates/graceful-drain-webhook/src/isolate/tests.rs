use std::sync::Arc;

use serde_json::json;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::PostParams;
use serde_json::Value;

use super::scenarios::Scenario::*;
use super::*;
use crate::cache::Cache;
use crate::decide::{PdbFacts, ServiceFacts, ServiceType};
use crate::review::IntoFacts as _;
use graceful_drain_core::labels::DRAINING_LABEL;
use graceful_drain_testing::fixtures::mock;
use graceful_drain_testing::fixtures::{self, PdbFixture, PodFixture, to_json};

pub(crate) fn now() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

/// `web/web-1` of ReplicaSet `web-abc`, serving, at resourceVersion 41.
pub(crate) fn pod() -> PodFacts {
    fixtures::pod("web-1")
        .ns("web")
        .with_uid("uid-1")
        .at_version("41")
        .with_labels(&[("app", "web"), ("pod-template-hash", "abc"), ("team", "a")])
        .annotate("note", "x")
        .running()
        .ready()
        .owned_by_rs("web-abc")
        .facts()
}

/// The budget `web/web` (minAvailable 2 of 3 healthy) at resourceVersion `rv`; the
/// server's tests use it too.
pub(crate) fn pdb_json(rv: &str, allowed: i32) -> Value {
    to_json(
        &fixtures::pdb("web")
            .ns("web")
            .at_version(rv)
            .generation(1)
            .selecting(&[("app", "web")])
            .min_available(2)
            .healthy(3, 2, 3)
            .allowing(allowed),
    )
}

fn evict_plan() -> Plan {
    Plan {
        delete_at: now(),
        grace_period: None,
        charge: Charge::Required,
        on_due: OnDue::Caller,
        confirmed: true,
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        services: vec![ServiceFacts {
            name: "web".into(),
            service_type: ServiceType::LoadBalancer,
            selector: [("app".to_string(), "web".to_string())].into(),
            selects_pod: false,
        }],
        pdbs: vec![PdbFacts {
            name: "web".into(),
            disruptions_allowed: 1,
            observed: true,
            lists_pod: false,
            selector_keys: ["app".to_string()].into(),
        }],
        ..Snapshot::default()
    }
}

fn context(client: kube::Client) -> Context {
    let cache = Arc::new(Cache::default());
    cache.apply_pdb(&serde_json::from_value(pdb_json("1", 1)).unwrap());
    Context {
        client,
        cache,
        identity: "webhook-0".into(),
        events: EventSink::Inline,
        keep_labels: Default::default(),
        restore_after: RESTORE_AFTER,
        gates: Default::default(),
        owners: Default::default(),
        nodes: Default::default(),
    }
}

/// An eviction's isolation: the PDB first, then the guarded relabel, then the Event. Its
/// caller removes the pod, else it goes back a minute after its delete time — unless its
/// node is being drained (`confirmed`): then the deleter removes it at its delete time and
/// the pod carries no restore time.
#[tokio::test]
async fn isolation_sends_pdb_update_then_guarded_patch_then_event() {
    for confirmed in [false, true] {
        isolates_for_an_eviction(confirmed).await;
    }
}

async fn isolates_for_an_eviction(confirmed: bool) {
    let (client, mut api) = mock::client();
    let ctx = context(client);
    let delete_at: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
    let task = tokio::spawn(async move {
        let plan = Plan {
            delete_at,
            grace_period: Some(20),
            charge: Charge::Required,
            on_due: OnDue::Caller,
            confirmed,
        };
        isolate(&ctx, &pod(), &snapshot(), plan, now()).await
    });
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-abc", "namespace": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}}});
    // The cached PDB is stale: the first update conflicts, we re-read and retry.
    let scenarios = [
        ReplicaSetIs(rs),
        PdbChargeConflicts,
        PdbIs(pdb_json("2", 1)),
        PdbCharged(pdb_json("3", 0)),
        Relabeled("web-1"),
        EventPosted,
    ];
    let [_rs, first, _reread, update, patch, event] =
        mock::play(&mut api, scenarios).await.try_into().unwrap();
    assert_eq!(first.body["metadata"]["resourceVersion"], "1");
    assert_eq!(update.body["metadata"]["resourceVersion"], "2");
    assert_eq!(update.body["status"]["disruptionsAllowed"], 0);
    assert_eq!(
        update.body["status"]["disruptedPods"]["web-1"],
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(patch.content_type, "application/json-patch+json");
    let mut expected = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
        {"op": "test", "path": "/metadata/labels",
         "value": {"app": "web", "pod-template-hash": "abc", "team": "a"}},
        {"op": "remove", "path": "/metadata/labels/app"},
        {"op": "remove", "path": "/metadata/labels/pod-template-hash"},
        {"op": "add", "path": "/metadata/labels/graceful-drain.io~1draining", "value": "web"},
        {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1delete-at",
         "value": "2026-01-01T00:01:00Z"},
        // Karpenter plans no node for it and starts no second disruption.
        {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1do-not-disrupt-set",
         "value": "true"},
        {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1grace-period-seconds",
         "value": "20"},
        {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1original-labels",
         "value": "{\"app\":\"web\",\"pod-template-hash\":\"abc\"}"},
        {"op": "add", "path": "/metadata/annotations/karpenter.sh~1do-not-disrupt",
         "value": "true"},
    ]);
    if !confirmed {
        // Isolated for an eviction nothing confirms: its caller removes it, else it goes
        // back a minute after its delete time.
        let restore = json!({"op": "add", "path": "/metadata/annotations/graceful-drain.io~1restore-at",
             "value": "2026-01-01T00:02:00Z"});
        expected.as_array_mut().unwrap().insert(9, restore);
    }
    assert_eq!(patch.body, expected, "confirmed: {confirmed}");
    assert_eq!(event.body["reason"], webhook_reason::ISOLATED);
    assert_eq!(event.body["involvedObject"]["uid"], "uid-1");
    let outcome = task.await.unwrap().unwrap();
    assert_eq!(
        outcome,
        Outcome::Isolated {
            removed: [("app", "web"), ("pod-template-hash", "abc")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            uncharged: None,
            delete_at,
        }
    );
}

/// The second pod of a ReplicaSet is isolated without reading the ReplicaSet again;
/// a ReplicaSet of the same name but another UID is read afresh.
#[tokio::test]
async fn a_replica_set_read_once_serves_its_other_pods() {
    let (client, mut api) = mock::client();
    let ctx = context(client);
    let unbudgeted = Snapshot {
        pdbs: vec![],
        ..snapshot()
    };
    let task = tokio::spawn(async move {
        let plan = || Plan {
            delete_at: "2026-01-01T00:01:00Z".parse().unwrap(),
            grace_period: None,
            charge: Charge::Required,
            on_due: OnDue::Caller,
            confirmed: true,
        };
        let mut second = pod();
        second.name = "web-2".into();
        second.uid = "uid-2".into();
        let mut recreated = pod();
        recreated.name = "web-3".into();
        recreated.owner_refs[0]["uid"] = json!("web-abc-uid-2");
        let mut outcomes = Vec::new();
        for p in [pod(), second, recreated] {
            outcomes.push(isolate(&ctx, &p, &unbudgeted, plan(), now()).await);
        }
        outcomes
    });
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-abc", "namespace": "web", "uid": "web-abc-uid"},
        "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}}});
    let scenarios = [
        ReplicaSetIs(rs.clone()),
        Relabeled("web-1"),
        EventPosted,
        Relabeled("web-2"),
        EventPosted,
        ReplicaSetIs(rs),
        Relabeled("web-3"),
        EventPosted,
    ];
    mock::play(&mut api, scenarios).await;
    for outcome in task.await.unwrap() {
        assert!(
            matches!(outcome, Ok(Outcome::Isolated { .. })),
            "{outcome:?}"
        );
    }
}

#[test]
fn the_delay_counts_from_the_relabel_when_the_work_before_it_was_slow() {
    let plan = Plan {
        delete_at: "2026-01-01T00:01:00Z".parse().unwrap(),
        grace_period: None,
        charge: Charge::Required,
        on_due: OnDue::Caller,
        confirmed: true,
    };
    let quick = plan.counted_from_now(std::time::Duration::from_millis(40));
    assert_eq!(quick, plan, "a quick relabel keeps the decided time");
    let throttled = plan.counted_from_now(std::time::Duration::from_millis(2_500));
    assert_eq!(
        throttled.delete_at,
        "2026-01-01T00:01:02.5Z".parse::<Timestamp>().unwrap(),
        "2.5 s of throttled accounting move the delete time by as much"
    );
}

/// `--keep-label app`: the pod leaves its Service (app+tier) and ReplicaSet
/// (app+pod-template-hash) by losing only `tier` and `pod-template-hash`; `app` stays
/// for NetworkPolicies and dashboards, and the draining label names the app. The
/// controller role goes to the Deployment, the ReplicaSet stays a plain owner.
#[tokio::test]
async fn kept_labels_stay_and_the_deployment_becomes_the_controller() {
    let (client, mut api) = mock::client();
    let mut ctx = context(client);
    ctx.keep_labels = ["app".to_string()].into();
    let mut facts = pod();
    facts.labels = [
        ("app", "web"),
        ("tier", "front"),
        ("pod-template-hash", "abc"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let rs_ref = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
        "uid": "rs-uid", "controller": true, "blockOwnerDeletion": true});
    facts.owner_refs = vec![rs_ref];
    let snap = Snapshot {
        services: vec![ServiceFacts {
            name: "web".into(),
            service_type: ServiceType::LoadBalancer,
            selector: [("app", "web"), ("tier", "front")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            selects_pod: false,
        }],
        ..Snapshot::default()
    };
    let task = tokio::spawn(async move {
        let plan = Plan {
            delete_at: now(),
            grace_period: None,
            charge: Charge::IfPossible,
            on_due: OnDue::Caller,
            confirmed: true,
        };
        isolate(&ctx, &facts, &snap, plan, now()).await
    });
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-abc", "namespace": "web", "uid": "rs-uid",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                 "uid": "deploy-uid", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}}});
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "web", "uid": "deploy-uid"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {},
                 "strategy": {"type": "RollingUpdate"}}});
    let scenarios = [
        ReplicaSetIs(rs),
        DeploymentIs(deployment),
        Relabeled("web-1"),
        EventPosted,
    ];
    let [_rs, _deployment, patch, _event] =
        mock::play(&mut api, scenarios).await.try_into().unwrap();
    let ops = patch.body.as_array().unwrap();
    let removed: Vec<&str> = ops
        .iter()
        .filter(|op| op["op"] == "remove")
        .map(|op| op["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        removed,
        [
            "/metadata/labels/pod-template-hash",
            "/metadata/labels/tier"
        ]
    );
    assert!(ops.contains(&json!({"op": "add",
        "path": "/metadata/labels/graceful-drain.io~1draining", "value": "web"})));
    let owners = ops
        .iter()
        .find(|op| op["op"] == "replace" && op["path"] == "/metadata/ownerReferences")
        .expect("controller handed over");
    assert_eq!(
        owners["value"],
        json!([
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs-uid", "controller": false},
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "deploy-uid", "controller": true},
        ])
    );
    assert!(matches!(task.await.unwrap(), Ok(Outcome::Isolated { .. })));
}

/// A Recreate Deployment promises old and new pods never run together; an isolated
/// pod would keep serving while the new ones start, so it is not isolated at all
/// (the request goes through with a Warning Event saying why).
#[tokio::test]
async fn a_recreate_deployments_pod_is_not_isolated() {
    let (client, mut api) = mock::client();
    let ctx = context(client);
    let mut facts = pod();
    facts.owner_refs = vec![json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "web-abc", "uid": "rs-uid", "controller": true})];
    let task = tokio::spawn(async move {
        let plan = Plan {
            delete_at: now(),
            grace_period: None,
            charge: Charge::IfPossible,
            on_due: OnDue::Caller,
            confirmed: true,
        };
        isolate(&ctx, &facts, &Snapshot::default(), plan, now()).await
    });
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-abc", "namespace": "web", "uid": "rs-uid",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                 "uid": "deploy-uid", "controller": true}]},
        "spec": {"selector": {"matchLabels": {"app": "web"}}}});
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "web", "uid": "deploy-uid"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {},
                 "strategy": {"type": "Recreate"}}});
    mock::play(&mut api, [ReplicaSetIs(rs), DeploymentIs(deployment)]).await;
    let err = task.await.unwrap().unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert_eq!(err.reason(), "recreate");
    assert!(
        err.to_string()
            .contains("Deployment web/web uses the Recreate strategy"),
        "{err}"
    );
}
/// The relabel is refused after the PDB was charged: the disruption is given back at
/// once, so a pass-through eviction is not refused by a budget we spent for nothing.
#[tokio::test]
async fn a_failed_relabel_refunds_the_disruption_it_charged() {
    let (client, mut api) = mock::client();
    let ctx = context(client);
    let mut bare = pod();
    bare.owner = None;
    let task =
        tokio::spawn(async move { isolate(&ctx, &bare, &snapshot(), evict_plan(), now()).await });
    let mut charged = pdb_json("2", 0);
    charged["status"]["disruptedPods"] = json!({"web-1": "2026-01-01T00:00:00Z"});
    let scenarios = [
        PdbCharged(pdb_json("2", 0)),
        RelabelForbidden,
        PdbIs(charged),
        PdbRefunded(pdb_json("3", 1)),
    ];
    let [_charge, _relabel, _reread, refund] =
        mock::play(&mut api, scenarios).await.try_into().unwrap();
    assert_eq!(refund.body["metadata"]["resourceVersion"], "2");
    assert_eq!(refund.body["status"]["disruptionsAllowed"], 1);
    assert_eq!(refund.body["status"]["disruptedPods"], json!({}));
    let error = task.await.unwrap().unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert!(
        error.to_string().contains("isolate pod web/web-1"),
        "{error}"
    );
}

#[tokio::test]
async fn exhausted_pdb_after_reread_leaves_the_pod_alone() {
    let (client, mut api) = mock::client();
    let ctx = context(client);
    let task =
        tokio::spawn(async move { isolate(&ctx, &pod(), &snapshot(), evict_plan(), now()).await });
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-abc", "namespace": "web"}, "spec": {"selector": {}}});
    // Another replica took the last disruption in between.
    let scenarios = [
        ReplicaSetIs(rs),
        PdbChargeConflicts,
        PdbIs(pdb_json("2", 0)),
    ];
    mock::play(&mut api, scenarios).await;
    let outcome = task.await.unwrap().unwrap();
    assert_eq!(
        outcome,
        Outcome::Refused(Budget::Exhausted {
            pdb: "web/web".into()
        })
    );
}

#[tokio::test]
async fn failed_test_op_is_a_conflict() {
    let (client, mut api) = mock::client();
    let ctx = context(client);
    let mut bare = pod();
    bare.owner = None;
    let snap = Snapshot {
        pdbs: Vec::new(),
        ..snapshot()
    };
    let task = tokio::spawn(async move { isolate(&ctx, &bare, &snap, evict_plan(), now()).await });
    mock::play(&mut api, [RelabelInvalid]).await;
    assert!(matches!(task.await.unwrap(), Err(Error::Conflict { .. })));
}

/// A namespace `web` on the simulated API server: `count` serving pods `app=web` and
/// PDB `web` (minAvailable `min_available`) whose status allows `allowed` disruptions.
struct SimBudget {
    server: kube_sim::apiserver::ApiServer,
    shutdown: graceful_drain_core::runtime::Shutdown,
    pods: Api<Pod>,
    pdbs: Api<PodDisruptionBudget>,
    created: Vec<Pod>,
    pdb: PodDisruptionBudget,
}

impl SimBudget {
    async fn start(count: usize, min_available: usize, allowed: i32) -> SimBudget {
        use kube_sim::apiserver::{ApiServer, Config};
        let shutdown = graceful_drain_core::runtime::Shutdown::new();
        let mut config = Config::default();
        config.namespaces.push("web".into());
        let server = ApiServer::start(config, shutdown.clone()).await.unwrap();
        let pods: Api<Pod> = Api::namespaced(server.client("admin"), "web");
        // The pods' ReplicaSet, which each isolation must read for its selector.
        let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
            Api::namespaced(server.client("admin"), "web");
        use graceful_drain_testing::fixtures::ReplicaSetFixture;
        let set = fixtures::replica_set("web-rs")
            .ns("web")
            .replicas(count as i32)
            .selecting(&[("app", "web")]);
        let set = sets.create(&PostParams::default(), &set).await.unwrap();
        let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "web-rs".into(),
            uid: set.metadata.uid.clone().unwrap(),
            controller: Some(true),
            ..Default::default()
        };
        let mut created = Vec::new();
        for i in 0..count {
            let mut pod = fixtures::pod(&format!("web-{i}"))
                .ns("web")
                .label("app", "web")
                .container("web:1");
            pod.metadata.owner_references = Some(vec![owner.clone()]);
            created.push(pods.create(&PostParams::default(), &pod).await.unwrap());
        }
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(server.client("admin"), "web");
        let budget = fixtures::pdb("web")
            .ns("web")
            .selecting(&[("app", "web")])
            .min_available(min_available as i32);
        let budget = pdbs.create(&PostParams::default(), &budget).await.unwrap();
        let (n, min) = (count as i32, min_available as i32);
        let budget = budget.healthy(n, min, n).allowing(allowed);
        let pdb = pdbs
            .replace_status("web", &PostParams::default(), &budget)
            .await
            .unwrap();
        SimBudget {
            server,
            shutdown,
            pods,
            pdbs,
            created,
            pdb,
        }
    }

    /// A webhook replica acting as `user`, whose cache holds the PDB as set up.
    fn replica(&self, user: &str) -> Context {
        let cache = Arc::new(Cache::default());
        cache.apply_pdb(&self.pdb);
        Context {
            client: self.server.client(user),
            cache,
            identity: user.into(),
            events: EventSink::Inline,
            keep_labels: Default::default(),
            restore_after: RESTORE_AFTER,
            gates: Default::default(),
            owners: Default::default(),
            nodes: Default::default(),
        }
    }

    /// Evicts every pod at once, pod `i` through `replicas[i % replicas.len()]`;
    /// returns how many were isolated (the others must be refused by the budget).
    async fn evict_all(&mut self, replicas: &[Context]) -> usize {
        let tasks: Vec<_> = std::mem::take(&mut self.created)
            .into_iter()
            .enumerate()
            .map(|(i, pod)| {
                let ctx = replicas[i % replicas.len()].clone();
                tokio::spawn(async move {
                    isolate(&ctx, &pod.facts(), &snapshot(), evict_plan(), now()).await
                })
            })
            .collect();
        let mut isolated = 0;
        for task in tasks {
            match task.await.unwrap().unwrap() {
                Outcome::Isolated { .. } => isolated += 1,
                Outcome::Refused(Budget::Exhausted { .. }) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        isolated
    }
}

/// Twelve evictions at once behind one budget allowing eight: eight pods are
/// isolated, the budget is written in a few grouped updates, not eight, and their
/// ReplicaSet is read once, not by every isolation that found it missing.
#[tokio::test]
async fn concurrent_charges_to_one_budget_are_written_together() {
    let mut sim = SimBudget::start(12, 4, 8).await;
    let replica = sim.replica("webhook");
    let before = sim.server.stats();
    assert_eq!(sim.evict_all(&[replica]).await, 8);
    let status = sim.pdbs.get("web").await.unwrap().status.unwrap();
    assert_eq!(status.disruptions_allowed, 0);
    assert_eq!(status.disrupted_pods.unwrap().len(), 8);
    let writes = sim
        .server
        .stats()
        .count("update", "poddisruptionbudgets/status")
        - before.count("update", "poddisruptionbudgets/status");
    assert!(writes <= 3, "{writes} status updates for 8 charges");
    let reads = sim.server.stats().count("get", "replicasets") - before.count("get", "replicasets");
    assert_eq!(
        reads, 1,
        "the ReplicaSet of 12 concurrent isolations read {reads} times"
    );
    sim.shutdown.cancel();
}

/// Three replicas with stale caches race to isolate six pods behind a PDB with
/// minAvailable 4, on the simulated API server (resourceVersion-guarded status
/// updates, JSON-patch `test` ops): exactly two are isolated and the budget lists
/// both. An isolated pod never gets its labels back, so the four still serving at
/// the end are the fewest that ever served.
#[tokio::test]
async fn concurrent_isolations_never_break_min_available() {
    use kube::api::ListParams;

    const MIN_AVAILABLE: usize = 4;
    let mut sim = SimBudget::start(6, MIN_AVAILABLE, 2).await;
    let replicas: Vec<Context> = (0..3).map(|r| sim.replica(&format!("w{r}"))).collect();
    assert_eq!(sim.evict_all(&replicas).await, 2);
    let draining = ListParams::default().labels(DRAINING_LABEL);
    assert_eq!(sim.pods.list(&draining).await.unwrap().items.len(), 2);
    let serving = ListParams::default().labels("app=web");
    let serving = sim.pods.list(&serving).await.unwrap().items.len();
    assert!(serving >= MIN_AVAILABLE, "only {serving} served");
    let status = sim.pdbs.get("web").await.unwrap().status.unwrap();
    assert_eq!(status.disruptions_allowed, 0);
    assert_eq!(status.disrupted_pods.unwrap().len(), 2);
    sim.shutdown.cancel();
}

/// Only a drainer's own mark says a node is being emptied; a cordon alone does not.
#[test]
fn a_node_is_draining_by_a_drainers_mark_not_by_a_cordon() {
    use super::{NodeDrain, drain_of};
    let node = |value: serde_json::Value| -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(value).unwrap()
    };
    let cordon = serde_json::json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}});
    assert_eq!(drain_of(&node(cordon.clone())), NodeDrain::Cordoned);
    let tainted = serde_json::json!({"metadata": {"name": "n"}, "spec": {"taints": [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}});
    assert_eq!(drain_of(&node(tainted)), NodeDrain::Cordoned);
    assert_eq!(
        drain_of(&node(serde_json::json!({"metadata": {"name": "n"}}))),
        NodeDrain::No
    );
    for key in ["karpenter.sh/disrupted", "ToBeDeletedByClusterAutoscaler"] {
        let marked = serde_json::json!({"metadata": {"name": "n"}, "spec": {"taints": [
            {"key": key, "effect": "NoSchedule"}]}});
        assert!(
            matches!(drain_of(&node(marked)), NodeDrain::Draining(_)),
            "{key}"
        );
    }
    let mut agent = cordon.clone();
    agent["status"] = serde_json::json!({"conditions": [
        {"type": "DrainInProgress", "status": "True", "reason": "Draining"}]});
    assert!(matches!(
        drain_of(&node(agent.clone())),
        NodeDrain::Draining(_)
    ));
    agent["status"]["conditions"][0]["status"] = "False".into();
    assert_eq!(drain_of(&node(agent)), NodeDrain::Cordoned);
}

/// Reviews of one node's pods arriving together (a `kubectl drain`, or a forger's flood)
/// read the node once: the others wait for that read and take its answer.
#[tokio::test]
async fn concurrent_reviews_of_one_nodes_pods_read_it_once() {
    let (client, mut api) = mock::client();
    let ctx = context(client);
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": DRAIN_TAINTS[0], "effect": "NoSchedule"}]}});
    let reviews: Vec<_> = (0..20)
        .map(|_| {
            let ctx = ctx.clone();
            tokio::spawn(async move { node_drain(&ctx, Some("n1")).await })
        })
        .collect();
    mock::play(&mut api, [NodeIs(node)]).await;
    for review in reviews {
        // A review that made a read of its own would wait for an answer nobody plays.
        let drain = tokio::time::timeout(std::time::Duration::from_secs(10), review)
            .await
            .expect("a review read the node again")
            .unwrap();
        assert!(matches!(drain, NodeDrain::Draining(_)), "{drain:?}");
    }
    // Another node is read on its own.
    let other = tokio::spawn(async move { node_drain(&ctx, Some("n2")).await });
    let n2 = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"},
        "spec": {"unschedulable": true}});
    mock::play(&mut api, [NodeIs(n2)]).await;
    assert_eq!(other.await.unwrap(), NodeDrain::Cordoned);
}
