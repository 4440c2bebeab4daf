//! `graceful-drain status [NODE]`: a table of LifecycleEvents (name, transition, node,
//! claim status, age), one of the nodes' lifecycle condition reasons
//! (`LifecycleTransition`, `DrainInProgress`, `Drained`), and which lifecycle APIs the
//! cluster serves (ours, and Kubernetes' own EvictionRequest API).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::{Error, Result};
use graceful_drain_core::labels::node_condition::{DRAIN_IN_PROGRESS, DRAINED};
use graceful_drain_core::lifecycle::{LifecycleEvent, TRANSITION_CONDITION};

/// Renders both tables for `node` (or every node) as of `now`.
pub async fn render(client: &kube::Client, node: Option<&str>, now: Timestamp) -> Result<String> {
    let events: Api<LifecycleEvent> = Api::all(client.clone());
    let events = match events.list(&ListParams::default()).await {
        Ok(list) => Some(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => return Err(Error::kube("list lifecycleevents", e)),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let nodes = match node {
        Some(name) => match nodes.get_opt(name).await {
            Ok(Some(n)) => vec![n],
            Ok(None) => {
                return Err(Error::NodeNotFound {
                    node: name.to_string(),
                });
            }
            Err(e) => return Err(Error::kube(format!("get node {name}"), e)),
        },
        None => {
            nodes
                .list(&ListParams::default())
                .await
                .map_err(|e| Error::kube("list nodes", e))?
                .items
        }
    };
    let mut out = match events {
        Some(events) => events_table(&events, node, now),
        None => {
            "lifecycle.graceful-drain.io CRDs not installed; run: graceful-drain crds | kubectl apply -f -\n"
                .to_string()
        }
    };
    out.push('\n');
    out.push_str(&nodes_table(&nodes));
    let hooks = hooks_table(&nodes, now);
    if !hooks.is_empty() {
        out.push('\n');
        out.push_str(&hooks);
    }
    let mut served = Vec::new();
    for group_version in [OURS, UPSTREAM] {
        let resources = client
            .list_api_group_resources(group_version)
            .await
            .ok()
            .map(|list| list.resources.into_iter().map(|r| r.name).collect());
        served.push((group_version, resources));
    }
    out.push('\n');
    out.push_str(&apis_table(&served));
    Ok(out)
}

/// Our lifecycle API.
const OURS: &str = "lifecycle.graceful-drain.io/v1alpha1";
/// Kubernetes' EvictionRequest API (KEP-4563), built in since 1.37 behind a feature gate.
const UPSTREAM: &str = "lifecycle.k8s.io/v1alpha1";

/// Which lifecycle APIs discovery lists, with their resources (`None`: not served).
pub fn apis_table(served: &[(&str, Option<Vec<String>>)]) -> String {
    let mut table = vec![["API", "SERVED", "RESOURCES", "NOTE"].map(String::from)];
    for (group_version, resources) in served {
        let (yes, names) = match resources {
            Some(names) => ("yes", names.join(",")),
            None => ("no", String::new()),
        };
        let seed = resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|n| n == "lifecycleevents"));
        let note = match (*group_version, resources.is_some()) {
            (OURS, true) => "LifecycleEvents and transitions",
            (OURS, false) => "install the CRDs: graceful-drain crds | kubectl apply -f -",
            (_, true) if seed => {
                "the seed group's CRDs (lifecycleCrds.seedGroup): node agents carry its LifecycleEvents over to lifecycle.graceful-drain.io"
            }
            (_, true) => {
                "Kubernetes' EvictionRequest API; no controller acts on it in 1.37, graceful-drain does not use it yet"
            }
            (_, false) => "Kubernetes' EvictionRequest API (feature gate EvictionRequestAPI)",
        };
        table.push([
            group_version.to_string(),
            yes.to_string(),
            names,
            note.to_string(),
        ]);
    }
    format_table(&table)
}

/// The last run of each maintenance hook on the nodes (the `graceful-drain.io/hooks`
/// annotation); empty when no node has run one.
pub fn hooks_table(nodes: &[Node], now: Timestamp) -> String {
    let mut table =
        vec![["NODE", "HOOK", "AT", "EVENT", "STATE", "AGE", "MESSAGE"].map(String::from)];
    for n in nodes {
        let mut records: Vec<_> = graceful_drain_agent::hooks::records(n)
            .into_iter()
            .collect();
        records.sort_by_key(|(_, r)| r.started_at);
        for (name, r) in records {
            let state = serde_json::to_value(r.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            table.push([
                n.name_any(),
                name,
                r.at.name().to_string(),
                r.operation,
                state,
                age(now, r.started_at),
                r.message,
            ]);
        }
    }
    if table.len() == 1 {
        return String::new();
    }
    format_table(&table)
}

/// The events table (sorted by creation), or a line saying there are none.
pub fn events_table(events: &[LifecycleEvent], node: Option<&str>, now: Timestamp) -> String {
    let mut rows: Vec<&LifecycleEvent> = events
        .iter()
        .filter(|e| node.is_none_or(|n| e.spec.binding_node == n))
        .collect();
    if rows.is_empty() {
        return "No lifecycleevents.\n".to_string();
    }
    rows.sort_by_key(|e| {
        (
            e.metadata.creation_timestamp.as_ref().map(|t| t.0),
            e.name_any(),
        )
    });
    let mut table = vec![["NAME", "TRANSITION", "NODE", "STATUS", "AGE"].map(String::from)];
    for e in rows {
        let status = e
            .status
            .as_ref()
            .and_then(|s| s.claim_status)
            .map_or("Pending".to_string(), |s| s.to_string());
        let age = e
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or("<unknown>".to_string(), |t| age(now, t.0));
        table.push([
            e.name_any(),
            e.spec.transition_name.clone(),
            e.spec.binding_node.clone(),
            status,
            age,
        ]);
    }
    format_table(&table)
}

/// The nodes table: reason of each lifecycle condition, `-` when absent.
pub fn nodes_table(nodes: &[Node]) -> String {
    let mut table = vec![
        [
            "NODE",
            TRANSITION_CONDITION,
            DRAIN_IN_PROGRESS,
            DRAINED,
            "SCHEDULABLE",
        ]
        .map(String::from),
    ];
    for n in nodes {
        let conditions = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let reason = |t: &str| {
            conditions
                .iter()
                .find(|c| c.type_ == t)
                .map_or("-".to_string(), |c| {
                    let reason = c.reason.clone().unwrap_or_default();
                    if c.status == "True" {
                        reason
                    } else {
                        format!("{reason} ({})", c.status)
                    }
                })
        };
        let cordoned = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        table.push([
            n.name_any(),
            reason(TRANSITION_CONDITION),
            reason(DRAIN_IN_PROGRESS),
            reason(DRAINED),
            if cordoned { "no (cordoned)" } else { "yes" }.to_string(),
        ]);
    }
    format_table(&table)
}

fn format_table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// kubectl-style age: `45s`, `12m`, `3h`, `2d`.
pub fn age(now: Timestamp, then: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_api_table_says_what_the_cluster_serves_and_what_to_do_when_ours_is_missing() {
        let text = apis_table(&[
            (OURS, None),
            (
                UPSTREAM,
                Some(vec!["evictionrequests".into(), "evictions".into()]),
            ),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("lifecycle.graceful-drain.io/v1alpha1"));
        assert!(lines[1].contains(" no ") && lines[1].contains("graceful-drain crds"));
        assert!(lines[2].contains(" yes ") && lines[2].contains("evictionrequests,evictions"));
        assert!(lines[2].contains("EvictionRequest API"));
        // Where the seed group is free and its CRDs installed, the table says so.
        let seed = apis_table(&[(
            UPSTREAM,
            Some(vec![
                "lifecycleevents".into(),
                "lifecycletransitions".into(),
            ]),
        )]);
        assert!(seed.contains("seedGroup"), "{seed}");
        assert!(!seed.contains("EvictionRequest API"), "{seed}");
    }

    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    use super::*;
    use graceful_drain_core::lifecycle::{ClaimStatus, LifecycleEventSpec, LifecycleEventStatus};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
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
        let all = events_table(&[e.clone(), other.clone()], None, ts(190));
        assert_eq!(
            all,
            "NAME                 TRANSITION       NODE       STATUS    AGE\n\
             worker-1-drain-abc   graceful-drain   worker-1   Claimed   3m\n\
             worker-2-drain-x     graceful-drain   worker-2   Pending   3m\n"
        );
        let one = events_table(&[e, other], Some("worker-2"), ts(190));
        assert!(!one.contains("worker-1-drain"), "{one}");
        assert_eq!(events_table(&[], None, ts(0)), "No lifecycleevents.\n");
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
        let table = nodes_table(&[node]);
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
        let records = serde_json::json!({
            "evacuate-vms": {"at": "before-eviction", "operation": "drain-w1", "id": "a1",
                "state": "inProgress", "message": "migrating: 2/6 VMs moved",
                "startedAt": "2027-01-15T08:00:00Z"},
            "enable-vms": {"at": "after-uncordon", "operation": "uncordon-w1", "id": "b2",
                "state": "done", "message": "node w1 accepts VMs again",
                "startedAt": "2027-01-15T07:00:00Z"},
        });
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w1", "annotations": {graceful_drain_core::labels::HOOKS_ANNOTATION: records.to_string()}},
        }))
        .unwrap();
        let now: Timestamp = "2027-01-15T08:00:45Z".parse().unwrap();
        assert_eq!(
            hooks_table(std::slice::from_ref(&node), now),
            "NODE   HOOK           AT                EVENT         STATE        AGE   MESSAGE\n\
             w1     enable-vms     after-uncordon    uncordon-w1   done         60m   node w1 accepts VMs again\n\
             w1     evacuate-vms   before-eviction   drain-w1      inProgress   45s   migrating: 2/6 VMs moved\n"
        );
        let plain: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "w2"}})).unwrap();
        assert_eq!(hooks_table(&[plain], now), "", "no table without hooks");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(ts(100), ts(55)), "45s");
        assert_eq!(age(ts(1000), ts(0)), "16m");
        assert_eq!(age(ts(3 * 3600), ts(0)), "3h");
        assert_eq!(age(ts(3 * 86_400), ts(0)), "3d");
        assert_eq!(age(ts(0), ts(10)), "0s", "clock skew");
    }
}
