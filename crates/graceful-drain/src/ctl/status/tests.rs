//! Unit tests of the status report: objects in, report fields and text out.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use serde_json::json;

use super::report::{self, RemovedBy, Section};
use super::text;
use super::*;
use graceful_drain_core::labels::{
    DELETE_AT_ANNOTATION, PROTECTION_ANNOTATION, PROTECTION_CHECKED_AT_ANNOTATION,
    PROTECTION_MESSAGE_ANNOTATION, PROTECTION_VERIFIED_AT_ANNOTATION, RESTORE_AT_ANNOTATION,
};
use graceful_drain_core::lifecycle::{ClaimStatus, LifecycleEventSpec, LifecycleEventStatus};

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

fn fetched() -> Fetched {
    Fetched {
        namespace: "gd".into(),
        node: None,
        lease: Ok(None),
        isolated: Ok(vec![]),
        agents: Ok(vec![]),
        nodes: Ok(vec![]),
        events: Ok(Some(vec![])),
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
    let p = report::protection("gd", Some(&l), now);
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
    let none = report::protection("gd", None, ts(0));
    assert_eq!(none.state, "unknown");
    assert_eq!(
        none.reason.as_deref(),
        Some("no webhook Lease in namespace gd: is graceful-drain installed there?")
    );
    let old = report::protection("gd", Some(&lease(json!({}), "w", ts(0))), ts(0));
    assert_eq!(old.state, "unknown");
    assert_eq!(
        old.reason.as_deref(),
        Some("this webhook version does not probe")
    );
    let odd = lease(json!({PROTECTION_ANNOTATION: "maybe"}), "w", ts(0));
    let odd = report::protection("gd", Some(&odd), ts(0));
    assert_eq!(odd.state, "unknown");
    assert!(odd.reason.unwrap().contains("\"maybe\""));
}

#[test]
fn the_deleter_lease_shows_its_holder_and_whether_it_expired() {
    let l = lease(json!({}), "webhook-0", ts(0));
    let live = report::deleter("gd", &l, ts(10));
    assert_eq!(live.lease, format!("gd/{LEASE_NAME}"));
    assert_eq!(live.holder.as_deref(), Some("webhook-0"));
    assert_eq!(live.renewed_age.as_deref(), Some("10s"));
    assert_eq!(live.expires_at, Some(ts(15)));
    assert!(!live.expired);
    assert!(
        report::deleter("gd", &l, ts(16)).expired,
        "renewTime + 15s < now"
    );
    let released = report::deleter("gd", &lease(json!({}), "", ts(0)), ts(1));
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
    f.lease = Ok(Some(lease(
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
        "Protection: active (checked 3s ago, verified 3s ago)"
    );
    assert_eq!(
        lines[1],
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
    let missing = "no webhook Lease in namespace gd: is graceful-drain installed there?";
    let Section::Available(p) = &r.protection else {
        panic!("{r:?}")
    };
    assert_eq!(p.reason.as_deref(), Some(missing));
    assert_eq!(
        r.deleter_lease,
        Section::Unavailable {
            unavailable: missing.into()
        }
    );
    let out = text::text(&r);
    assert!(
        out.starts_with(&format!("Protection: unknown ({missing})\n")),
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
    assert_eq!(plain.namespace, DEFAULT_NAMESPACE);
    let yaml = parse(&["x", "-o", "yaml", "--namespace", "ops", "w1"]);
    assert_eq!(
        (yaml.output, yaml.namespace.as_str(), yaml.node.as_deref()),
        (Output::Yaml, "ops", Some("w1"))
    );
    assert_eq!(parse(&["x", "--output=json"]).output, Output::Json);
    assert!(Cli::try_parse_from(["x", "-o", "wide"]).is_err());
}
