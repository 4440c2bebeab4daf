//! Unit tests of the status report: objects in, report fields and text out; the releases
//! found from the chart's own rendered workloads (deploy/graceful-drain.yaml); and one
//! whole `fetch` against the scripted mock API.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use serde_json::json;

use super::release::{self, Release};
use super::report::{self, RemovedBy, Section};
use super::text;
use super::*;
use graceful_drain_core::labels::{
    DELETE_AT_ANNOTATION, PROTECTION_ANNOTATION, PROTECTION_CHECKED_AT_ANNOTATION,
    PROTECTION_MESSAGE_ANNOTATION, PROTECTION_VERIFIED_AT_ANNOTATION, RESTORE_AT_ANNOTATION,
};
use graceful_drain_core::lifecycle::{
    ClaimStatus, LifecycleEvent, LifecycleEventSpec, LifecycleEventStatus,
};
use graceful_drain_testing::fixtures::as_release_ops;
use graceful_drain_testing::fixtures::mock::{self, Scenario, Step};
use graceful_drain_testing::fixtures::to_json;
use graceful_drain_webhook::lease::DEFAULT_NAME as LEASE_NAME;
use http::Method;

fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn lease(annotations: serde_json::Value, holder: &str, renewed: Timestamp) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": LEASE_NAME, "namespace": "gd", "annotations": annotations},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
    }))
    .unwrap()
}

fn pod(ns: &str, name: &str, node: &str, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": annotations,
                     "labels": {DRAINING_LABEL: "true"}},
        "spec": {"nodeName": node, "containers": []},
    }))
    .unwrap()
}

fn node(name: &str, transition: Option<&str>) -> Node {
    let conditions: Vec<_> = transition
        .map(|r| json!({"type": "LifecycleTransition", "status": "True", "reason": r}))
        .into_iter()
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name},
        "status": {"conditions": conditions}}))
    .unwrap()
}

/// The install namespace `gd`, found by no labels.
fn gd() -> Release {
    release::fallback(
        "gd",
        "no Deployment or DaemonSet labelled … in any namespace".into(),
    )
}

fn fetched() -> Fetched {
    Fetched {
        node: None,
        release: FetchedRelease {
            release: gd(),
            lease: Ok(None),
            agents: Ok(vec![]),
        },
        other_releases: vec![],
        isolated: Ok(vec![]),
        nodes: Ok(vec![]),
        events: Ok(Some(Listed::default())),
        served: vec![
            (OURS, Some(vec!["lifecycleevents".into()])),
            (UPSTREAM, None),
        ],
    }
}

#[test]
fn protection_reads_the_probe_annotations_on_the_lease() {
    let now = ts(100);
    let l = lease(
        json!({PROTECTION_ANNOTATION: "lost",
               PROTECTION_CHECKED_AT_ANNOTATION: ts(95).to_string(),
               PROTECTION_VERIFIED_AT_ANNOTATION: ts(-500).to_string(),
               PROTECTION_MESSAGE_ANNOTATION: "dry-run eviction never reached the webhook"}),
        "webhook-0",
        ts(99),
    );
    let p = report::protection(&gd(), Some(&l), now);
    assert_eq!(p.state, "lost");
    assert_eq!(p.reason, None);
    assert_eq!(p.checked_at, Some(ts(95)));
    assert_eq!(p.checked_age.as_deref(), Some("5s"));
    assert_eq!(p.verified_age.as_deref(), Some("10m"));
    assert_eq!(
        p.message.as_deref(),
        Some("dry-run eviction never reached the webhook")
    );
    assert_eq!(
        text::protection_line(&p),
        "Protection: lost (checked 5s ago, verified 10m ago): dry-run eviction never reached the webhook\n"
    );
}

#[test]
fn protection_is_unknown_with_a_reason_without_lease_or_annotations() {
    let none = report::protection(&gd(), None, ts(0));
    assert_eq!(none.state, "unknown");
    assert_eq!(
        none.reason.as_deref(),
        Some(&*format!(
            "no webhook Lease gd/{LEASE_NAME}: is graceful-drain installed in namespace gd?"
        ))
    );
    let old = report::protection(&gd(), Some(&lease(json!({}), "w", ts(0))), ts(0));
    assert_eq!(old.state, "unknown");
    assert_eq!(
        old.reason.as_deref(),
        Some("this webhook version does not probe")
    );
    let odd = lease(json!({PROTECTION_ANNOTATION: "maybe"}), "w", ts(0));
    let odd = report::protection(&gd(), Some(&odd), ts(0));
    assert_eq!(odd.state, "unknown");
    assert!(odd.reason.unwrap().contains("\"maybe\""));
}

#[test]
fn the_deleter_lease_shows_its_holder_and_whether_it_expired() {
    let l = lease(json!({}), "webhook-0", ts(0));
    let live = report::deleter(&l, ts(10));
    assert_eq!(live.lease, format!("gd/{LEASE_NAME}"));
    assert_eq!(live.holder.as_deref(), Some("webhook-0"));
    assert_eq!(live.renewed_age.as_deref(), Some("10s"));
    assert_eq!(live.expires_at, Some(ts(15)));
    assert!(!live.expired);
    assert!(report::deleter(&l, ts(16)).expired, "renewTime + 15s < now");
    let released = report::deleter(&lease(json!({}), "", ts(0)), ts(1));
    assert_eq!(released.holder, None);
    assert!(released.expired, "nobody holds it");
    assert!(text::deleter_line(&released).contains("not held"));
}

#[test]
fn isolated_pods_show_their_delete_time_and_who_removes_them() {
    let caller = pod(
        "shop",
        "web-2",
        "w1",
        json!({DELETE_AT_ANNOTATION: ts(30).to_string(), RESTORE_AT_ANNOTATION: ts(90).to_string()}),
    );
    let mut deleter = pod(
        "shop",
        "web-1",
        "w2",
        json!({DELETE_AT_ANNOTATION: ts(-5).to_string()}),
    );
    deleter.metadata.deletion_timestamp = Some(Time(ts(-1)));
    let rows = report::isolated(&[caller.clone(), deleter.clone()], None, ts(0));
    assert_eq!(rows.len(), 2);
    let (d, c) = (&rows[0], &rows[1]);
    assert_eq!((d.name.as_str(), c.name.as_str()), ("web-1", "web-2"));
    assert_eq!(c.removed_by, RemovedBy::Caller);
    assert_eq!(c.delete_at, Some(ts(30)));
    assert_eq!(c.delete_in.as_deref(), Some("in 30s"));
    assert_eq!(c.restore_in.as_deref(), Some("in 90s"));
    assert!(!c.terminating);
    assert_eq!(d.removed_by, RemovedBy::Deleter);
    assert_eq!(d.delete_in.as_deref(), Some("5s ago"));
    assert!(d.terminating);
    let table = text::isolated_table(&rows);
    assert!(table.contains("shop/web-2") && table.contains("caller (else restored at"));
    assert!(table.contains("deleter, terminating"), "{table}");
    let on_w1 = report::isolated(&[caller, deleter], Some("w1"), ts(0));
    assert_eq!(on_w1.len(), 1);
    assert_eq!(text::isolated_table(&[]), "No isolated pods.\n");
}

#[test]
fn agents_are_listed_per_node_with_the_lifecycle_transition() {
    let mut ready: Pod = serde_json::from_value(json!({
        "metadata": {"name": "graceful-drain-agent-a", "namespace": "gd"},
        "spec": {"nodeName": "w1", "containers": []},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap();
    let pending: Pod = serde_json::from_value(json!({
        "metadata": {"name": "graceful-drain-agent-b", "namespace": "gd"},
        "spec": {"containers": []},
    }))
    .unwrap();
    let nodes = [node("w1", Some("drain-complete")), node("w2", None)];
    let rows = report::agents(Some(&nodes), &[ready.clone(), pending.clone()], None);
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].node.as_deref(), Some("w1"));
    assert_eq!(rows[0].pod.as_deref(), Some("graceful-drain-agent-a"));
    assert_eq!(rows[0].ready, Some(true));
    assert_eq!(
        rows[0].lifecycle_transition.as_deref(),
        Some("drain-complete")
    );
    assert_eq!(
        (rows[1].node.as_deref(), rows[1].pod.as_deref()),
        (Some("w2"), None)
    );
    assert_eq!(rows[2].pod.as_deref(), Some("graceful-drain-agent-b"));
    assert_eq!(rows[2].ready, Some(false));
    let table = text::agents_table(&rows);
    let w2: Vec<&str> = table.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(w2, ["none", "w2", "-", "-"], "{table}");
    ready.status = None;
    assert_eq!(
        report::agents(None, &[ready], Some("w1"))[0].ready,
        Some(false)
    );
}

#[test]
fn the_text_report_starts_with_protection_and_shows_unreadable_parts() {
    let mut f = fetched();
    f.release.lease = Ok(Some(lease(
        json!({PROTECTION_ANNOTATION: "active",
               PROTECTION_CHECKED_AT_ANNOTATION: ts(-3).to_string(),
               PROTECTION_VERIFIED_AT_ANNOTATION: ts(-3).to_string()}),
        "webhook-0",
        ts(-1),
    )));
    f.isolated = Err("list pods -l graceful-drain.io/draining in all namespaces: forbidden".into());
    let r = report::report(&f, ts(0));
    let out = text::text(&r);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "Release: none found (no Deployment or DaemonSet labelled … in any namespace); \
         showing namespace gd"
    );
    assert_eq!(
        lines[1],
        "Protection: active (checked 3s ago, verified 3s ago)"
    );
    assert_eq!(
        lines[2],
        format!("Deleter Lease gd/{LEASE_NAME}: held by webhook-0 (renewed 1s ago, live)")
    );
    assert!(
        out.contains("Isolated pods: unavailable (list pods -l graceful-drain.io/draining in all namespaces: forbidden)"),
        "{out}"
    );
    assert!(out.contains("No lifecycleevents."), "{out}");

    // The same report as JSON: the unreadable part says why, the rest is there.
    let value: serde_json::Value =
        serde_json::from_str(&format(&r, Output::Json).unwrap()).unwrap();
    assert_eq!(value["release"]["namespace"], "gd");
    assert!(value.get("otherReleases").is_none(), "{value:#}");
    assert_eq!(value["protection"]["state"], "active");
    assert_eq!(value["deleterLease"]["holder"], "webhook-0");
    assert_eq!(value["deleterLease"]["expired"], false);
    assert!(
        value["isolatedPods"]["unavailable"]
            .as_str()
            .unwrap()
            .contains("forbidden")
    );
    assert_eq!(value["lifecycleApis"][0]["served"], true);
    // And as YAML, the same document.
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&format(&r, Output::Yaml).unwrap()).unwrap();
    assert_eq!(yaml, value);
}

#[test]
fn without_a_lease_or_crds_the_report_says_what_is_missing() {
    let mut f = fetched();
    f.events = Ok(None);
    let r = report::report(&f, ts(0));
    let missing =
        format!("no webhook Lease gd/{LEASE_NAME}: is graceful-drain installed in namespace gd?");
    let Section::Available(p) = &r.release.protection else {
        panic!("{r:?}")
    };
    assert_eq!(p.reason.as_deref(), Some(&*missing));
    assert_eq!(
        r.release.deleter_lease,
        Section::Unavailable {
            unavailable: missing.clone()
        }
    );
    let out = text::text(&r);
    assert_eq!(
        out.lines().nth(1),
        Some(&*format!("Protection: unknown ({missing})")),
        "{out}"
    );
    assert!(out.contains("graceful-drain crds | kubectl apply"), "{out}");
}

#[test]
fn the_api_table_says_what_the_cluster_serves_and_what_to_do_when_ours_is_missing() {
    let served = ["evictionrequests".to_string(), "evictions".to_string()];
    let text = text::apis_table(&[
        report::api(OURS, None),
        report::api(UPSTREAM, Some(&served)),
    ]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].starts_with("lifecycle.graceful-drain.io/v1alpha1"));
    assert!(lines[1].contains(" no ") && lines[1].contains("graceful-drain crds"));
    assert!(lines[2].contains(" yes ") && lines[2].contains("evictionrequests,evictions"));
    assert!(lines[2].contains("EvictionRequest API"));
    // Where the seed group is free and its CRDs installed, the table says so.
    let seed_resources = [
        "lifecycleevents".to_string(),
        "lifecycletransitions".to_string(),
    ];
    let seed = text::apis_table(&[report::api(UPSTREAM, Some(&seed_resources))]);
    assert!(seed.contains("seedGroup"), "{seed}");
    assert!(!seed.contains("EvictionRequest API"), "{seed}");
}

#[test]
fn events_table_lists_name_transition_node_status_age() {
    let mut e = LifecycleEvent::new(
        "worker-1-drain-abc",
        LifecycleEventSpec {
            transition_name: "graceful-drain".into(),
            binding_node: "worker-1".into(),
        },
    );
    e.metadata.creation_timestamp = Some(Time(ts(0)));
    e.status = Some(LifecycleEventStatus {
        claim_status: Some(ClaimStatus::Claimed),
        ..Default::default()
    });
    let mut other = e.clone();
    other.metadata.name = Some("worker-2-drain-x".into());
    other.spec.binding_node = "worker-2".into();
    other.status = None;
    let table = |node| {
        text::events_table(&report::events_rows(
            &[e.clone(), other.clone()],
            node,
            ts(190),
        ))
    };
    assert_eq!(
        table(None),
        "NAME                 TRANSITION       NODE       STATUS    AGE\n\
         worker-1-drain-abc   graceful-drain   worker-1   Claimed   3m\n\
         worker-2-drain-x     graceful-drain   worker-2   Pending   3m\n"
    );
    let one = table(Some("worker-2"));
    assert!(!one.contains("worker-1-drain"), "{one}");
    assert_eq!(text::events_table(&[]), "No lifecycleevents.\n");
}

#[test]
fn nodes_table_shows_condition_reasons() {
    let cond = |t: &str, reason: &str| NodeCondition {
        type_: t.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        ..Default::default()
    };
    let node = Node {
        metadata: ObjectMeta {
            name: Some("worker-1".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![
                cond("LifecycleTransition", "drain-complete"),
                cond("Drained", "DrainComplete"),
            ]),
            ..Default::default()
        }),
    };
    let table = text::nodes_table(&[report::node_row(&node)]);
    let row = table.lines().nth(1).unwrap();
    assert!(row.starts_with("worker-1"), "{table}");
    let cells: Vec<&str> = row
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "worker-1",
            "drain-complete",
            "-",
            "DrainComplete",
            "no (cordoned)"
        ]
    );
}

#[test]
fn hooks_table_shows_each_hooks_last_run() {
    let records = json!({
        "evacuate-vms": {"at": "before-eviction", "operation": "drain-w1", "id": "a1",
            "state": "inProgress", "message": "migrating: 2/6 VMs moved",
            "startedAt": "2027-01-15T08:00:00Z"},
        "enable-vms": {"at": "after-uncordon", "operation": "uncordon-w1", "id": "b2",
            "state": "done", "message": "node w1 accepts VMs again",
            "startedAt": "2027-01-15T07:00:00Z"},
    });
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "w1", "annotations": {graceful_drain_core::labels::HOOKS_ANNOTATION: records.to_string()}},
    }))
    .unwrap();
    let now: Timestamp = "2027-01-15T08:00:45Z".parse().unwrap();
    assert_eq!(
        text::hooks_table(&report::hooks(std::slice::from_ref(&node), now)),
        "NODE   HOOK           AT                EVENT         STATE        AGE   MESSAGE\n\
         w1     enable-vms     after-uncordon    uncordon-w1   done         60m   node w1 accepts VMs again\n\
         w1     evacuate-vms   before-eviction   drain-w1      inProgress   45s   migrating: 2/6 VMs moved\n"
    );
    let plain: Node = serde_json::from_value(json!({"metadata": {"name": "w2"}})).unwrap();
    assert!(
        report::hooks(&[plain], now).is_empty(),
        "no table without hooks"
    );
}

#[test]
fn ages_read_like_kubectl() {
    use report::{age, relative};
    assert_eq!(age(ts(100), ts(55)), "45s");
    assert_eq!(age(ts(1000), ts(0)), "16m");
    assert_eq!(age(ts(3 * 3600), ts(0)), "3h");
    assert_eq!(age(ts(3 * 86_400), ts(0)), "3d");
    assert_eq!(age(ts(0), ts(10)), "0s", "clock skew");
    assert_eq!(relative(ts(0), ts(12)), "in 12s");
    assert_eq!(relative(ts(12), ts(0)), "12s ago");
}

#[test]
fn output_and_namespace_flags() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        status: crate::ctl::StatusArgs,
    }
    let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().status;
    let plain = parse(&["x"]);
    assert_eq!(plain.output, Output::Text);
    assert_eq!((plain.namespace, plain.release), (None, None));
    let yaml = parse(&[
        "x",
        "-o",
        "yaml",
        "--namespace",
        "ops",
        "w1",
        "--release=gd",
    ]);
    assert_eq!(
        (yaml.output, yaml.namespace.as_deref(), yaml.node.as_deref()),
        (Output::Yaml, Some("ops"), Some("w1"))
    );
    assert_eq!(yaml.release.as_deref(), Some("gd"));
    assert_eq!(parse(&["x", "--output=json"]).output, Output::Json);
    assert!(Cli::try_parse_from(["x", "-o", "wide"]).is_err());
}

// ---- Releases, found by the chart's labels ----

/// The chart's default render: release `graceful-drain` in namespace `graceful-drain`.
const CHART: &str = include_str!("../../../../../deploy/graceful-drain.yaml");

fn chart_object(kind: &str) -> serde_json::Value {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(CHART).unwrap();
    docs.into_iter().find(|d| d["kind"] == kind).unwrap()
}

fn typed<K: serde::de::DeserializeOwned>(value: &serde_json::Value) -> K {
    serde_json::from_value(value.clone()).unwrap()
}

#[test]
fn the_charts_workloads_make_one_release_with_the_lease_its_webhook_is_told_to_use() {
    let deployment: Deployment = typed(&chart_object("Deployment"));
    let daemonset: DaemonSet = typed(&chart_object("DaemonSet"));
    let found = release::discover(&[deployment], &[daemonset]);
    assert_eq!(found.len(), 1, "{found:?}");
    let r = &found[0];
    assert_eq!(
        (r.namespace.as_str(), r.name.as_deref()),
        ("graceful-drain", Some("graceful-drain"))
    );
    assert_eq!(r.webhook.as_deref(), Some("graceful-drain-webhook"));
    assert_eq!(r.agent.as_deref(), Some("graceful-drain-agent"));
    assert_eq!(
        r.lease,
        Some(("graceful-drain".into(), "graceful-drain-webhook".into())),
        "--lease-name and GRACEFUL_DRAIN_NAMESPACE (the pod's namespace) of the chart"
    );
    assert_eq!(
        r.agent_selector.as_deref(),
        Some(
            "app.kubernetes.io/component=agent,app.kubernetes.io/instance=graceful-drain,\
             app.kubernetes.io/name=graceful-drain"
        )
    );
    assert_eq!(
        text::release_line(r),
        "Release graceful-drain in namespace graceful-drain: webhook \
         deployment/graceful-drain-webhook, node agents daemonset/graceful-drain-agent\n"
    );
}

#[test]
fn a_release_of_another_name_is_found_by_its_labels_not_its_name() {
    let deployments: Vec<Deployment> = vec![
        typed(&as_release_ops(&chart_object("Deployment"))),
        typed(&chart_object("Deployment")),
    ];
    let daemonsets: Vec<DaemonSet> = vec![typed(&as_release_ops(&chart_object("DaemonSet")))];
    let found = release::discover(&deployments, &daemonsets);
    let names: Vec<String> = found.iter().map(Release::describe).collect();
    assert_eq!(
        names,
        [
            "graceful-drain in namespace graceful-drain",
            "ops in namespace ops-system"
        ],
        "by namespace and name"
    );
    let ops = &found[1];
    assert_eq!(
        ops.lease,
        Some(("ops-system".into(), "ops-graceful-drain-webhook".into()))
    );
    assert_eq!(ops.agent.as_deref(), Some("ops-graceful-drain-agent"));
    assert!(
        ops.agent_selector
            .as_deref()
            .unwrap()
            .contains("app.kubernetes.io/instance=ops"),
        "its own agents, not the other release's"
    );
    assert_eq!(
        found[0].agent, None,
        "the default release has no DaemonSet here"
    );
}

#[test]
fn the_lease_follows_the_webhooks_command_line() {
    let webhook = |args: serde_json::Value, env: serde_json::Value| -> Deployment {
        typed(&json!({
            "metadata": {"name": "gd-webhook", "namespace": "tools"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "sidecar", "image": "proxy"},
                {"name": "webhook", "image": "gd", "args": args, "env": env},
            ]}}},
        }))
    };
    let from_field = json!([{"name": "GRACEFUL_DRAIN_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]);
    let cases = [
        (
            webhook(json!(["webhook", "--lease-name=held"]), from_field.clone()),
            ("tools", "held"),
        ),
        (
            webhook(
                json!([
                    "webhook",
                    "--lease-name",
                    "a",
                    "--lease-namespace",
                    "elsewhere"
                ]),
                from_field,
            ),
            ("elsewhere", "a"),
        ),
        (
            webhook(
                json!(["webhook"]),
                json!([{"name": "GRACEFUL_DRAIN_NAMESPACE", "value": "fixed"}]),
            ),
            ("fixed", LEASE_NAME),
        ),
        (
            webhook(json!(["webhook"]), json!([])),
            ("graceful-drain", LEASE_NAME),
        ),
    ];
    for (deployment, (ns, name)) in cases {
        assert_eq!(
            release::lease_of(&deployment),
            (ns.to_string(), name.to_string())
        );
    }
}

// ---- One whole `fetch` on the scripted mock ----

/// What the API server holds, in the order `status` reads it.
enum Cluster {
    /// The webhook Deployments and agent DaemonSets (in every namespace).
    ReleasesAre(Vec<serde_json::Value>, Vec<serde_json::Value>),
    /// The Lease `ns/name` (as JSON), or none.
    LeaseIs(&'static str, &'static str, Option<serde_json::Value>),
    /// The agent pods in `ns`.
    AgentsIn(&'static str, Vec<Pod>),
    /// No pod carries the draining label.
    NoIsolatedPods,
    /// The LifecycleEvents.
    EventsAre(Vec<serde_json::Value>),
    /// The nodes.
    NodesAre(Vec<Node>),
    /// Discovery lists our lifecycle API, not the upstream one.
    ServesOurs,
}

fn list_of(kind: &str, items: Vec<serde_json::Value>) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

impl Scenario for Cluster {
    fn steps(self) -> Vec<Step> {
        let get = |path: String, reply| Step::new(Method::GET, path, 200, reply);
        let json_of = |items: Vec<Pod>| items.iter().map(to_json).collect();
        match self {
            Cluster::ReleasesAre(deployments, daemonsets) => vec![
                get(
                    "/apis/apps/v1/deployments".into(),
                    list_of("DeploymentList", deployments),
                ),
                get(
                    "/apis/apps/v1/daemonsets".into(),
                    list_of("DaemonSetList", daemonsets),
                ),
            ],
            Cluster::LeaseIs(ns, name, lease) => {
                let path = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}");
                match lease {
                    Some(lease) => vec![get(path, lease)],
                    None => vec![Step::refused(Method::GET, path, 404, "NotFound")],
                }
            }
            Cluster::AgentsIn(ns, pods) => vec![get(
                format!("/api/v1/namespaces/{ns}/pods"),
                list_of("PodList", json_of(pods)),
            )],
            Cluster::NoIsolatedPods => vec![get("/api/v1/pods".into(), list_of("PodList", vec![]))],
            Cluster::EventsAre(items) => vec![get(
                "/apis/lifecycle.graceful-drain.io/v1alpha1/lifecycleevents".into(),
                list_of("LifecycleEventList", items),
            )],
            Cluster::NodesAre(nodes) => vec![get(
                "/api/v1/nodes".into(),
                list_of("NodeList", nodes.iter().map(to_json).collect()),
            )],
            Cluster::ServesOurs => vec![
                get(
                    format!("/apis/{OURS}"),
                    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": OURS,
                        "resources": [{"name": "lifecycleevents", "singularName": "lifecycleevent",
                            "namespaced": false, "kind": "LifecycleEvent", "verbs": ["list"]}]}),
                ),
                Step::refused(Method::GET, format!("/apis/{UPSTREAM}"), 404, "NotFound"),
            ],
        }
    }
}

#[tokio::test]
async fn status_reports_each_release_and_names_a_malformed_event_it_skips() {
    let (client, mut api) = mock::client();
    let task = tokio::spawn(async move {
        let fetched = fetch(&client, &Scope::default(), None).await.unwrap();
        report::report(&fetched, ts(0))
    });
    let mut held = lease(json!({}), "webhook-7d9", ts(-2));
    held.metadata.namespace = Some("graceful-drain".into());
    held.metadata.name = Some("graceful-drain-webhook".into());
    let agent: Pod = typed(&json!({
        "metadata": {"name": "graceful-drain-agent-x1", "namespace": "graceful-drain"},
        "spec": {"nodeName": "w1", "containers": []},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }));
    let event = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": OURS, "kind": "LifecycleEvent",
            "metadata": {"name": name, "creationTimestamp": "2027-01-15T08:00:00Z"}, "spec": spec})
    };
    let (deployment, daemonset) = (chart_object("Deployment"), chart_object("DaemonSet"));
    mock::play(
        &mut api,
        [
            Cluster::ReleasesAre(
                vec![deployment.clone(), as_release_ops(&deployment)],
                vec![daemonset.clone(), as_release_ops(&daemonset)],
            ),
            Cluster::LeaseIs(
                "graceful-drain",
                "graceful-drain-webhook",
                Some(to_json(&held)),
            ),
            Cluster::AgentsIn("graceful-drain", vec![agent]),
            Cluster::LeaseIs("ops-system", "ops-graceful-drain-webhook", None),
            Cluster::AgentsIn("ops-system", vec![]),
            Cluster::NoIsolatedPods,
            Cluster::EventsAre(vec![
                event(
                    "w1-drain-a",
                    json!({"transitionName": "graceful-drain", "bindingNode": "w1"}),
                ),
                event("by-hand", json!({"transitionName": "graceful-drain"})),
            ]),
            Cluster::NodesAre(vec![node("w1", None)]),
            Cluster::ServesOurs,
        ],
    )
    .await;
    let report = task.await.unwrap();

    let out = text::text(&report);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "2 graceful-drain releases: graceful-drain in namespace graceful-drain, ops in \
         namespace ops-system; each is shown below (pick one with --release NAME or \
         --namespace NS)",
        "{out}"
    );
    assert!(
        lines[2].starts_with("Release graceful-drain in namespace graceful-drain: "),
        "{out}"
    );
    assert!(
        out.contains(
            "Deleter Lease graceful-drain/graceful-drain-webhook: held by webhook-7d9 (renewed 2s ago, live)"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "Deleter Lease: unavailable (no webhook Lease ops-system/ops-graceful-drain-webhook: \
             has a replica of deployment ops-system/ops-graceful-drain-webhook started?)"
        ),
        "{out}"
    );
    assert!(
        out.contains("graceful-drain-agent-x1   w1     yes"),
        "{out}"
    );
    assert!(out.contains("w1-drain-a"), "{out}");
    assert!(
        out.contains("warning: skipping LifecycleEvent by-hand: missing field `bindingNode`\n"),
        "{out}"
    );

    // The same as JSON: the first release where a single one would be, the others beside.
    let value: serde_json::Value =
        serde_json::from_str(&format(&report, Output::Json).unwrap()).unwrap();
    assert_eq!(value["release"]["name"], "graceful-drain");
    assert_eq!(value["deleterLease"]["holder"], "webhook-7d9");
    assert_eq!(
        value["otherReleases"][0]["release"]["namespace"],
        "ops-system"
    );
    assert_eq!(
        value["otherReleases"][0]["release"]["webhook"],
        "ops-graceful-drain-webhook"
    );
    assert_eq!(value["otherReleases"][0]["protection"]["state"], "unknown");
    assert_eq!(
        value["skippedLifecycleEvents"],
        json!([{"name": "by-hand", "reason": "missing field `bindingNode`"}])
    );
    assert_eq!(value["lifecycleEvents"][0]["name"], "w1-drain-a");
}

#[tokio::test]
async fn a_release_asked_for_by_name_that_is_not_there_is_an_error() {
    let (client, mut api) = mock::client();
    let task = tokio::spawn(async move {
        let scope = Scope {
            namespace: Some("tools".into()),
            release: Some("gd".into()),
        };
        fetch(&client, &scope, None).await.map(|_| ())
    });
    let deployments = "/apis/apps/v1/namespaces/tools/deployments";
    let daemonsets = "/apis/apps/v1/namespaces/tools/daemonsets";
    mock::expect(
        &mut api,
        Method::GET,
        deployments,
        200,
        list_of("DeploymentList", vec![]),
    )
    .await;
    mock::expect(
        &mut api,
        Method::GET,
        daemonsets,
        200,
        list_of("DaemonSetList", vec![]),
    )
    .await;
    let error = task.await.unwrap().unwrap_err();
    assert_eq!(
        error.to_string(),
        "no graceful-drain release gd in namespace tools (no Deployment or DaemonSet labelled \
         app.kubernetes.io/name=graceful-drain,app.kubernetes.io/instance=gd); `helm list -A` \
         lists the releases"
    );
}
