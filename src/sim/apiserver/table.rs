//! `meta.k8s.io/v1` Table answers for clients that ask for them (kubectl's `get`), so
//! `kubectl get pods,nodes` prints the usual columns (READY, STATUS, ROLES, ...).
//! Custom resources use their CRD's `additionalPrinterColumns`.

use serde_json::{Value, json};

use super::resources::ResourceDef;

/// Whether an Accept header asks for a `meta.k8s.io/v1` Table.
pub(crate) fn wants_table(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        params.contains(&"as=Table")
            && params.contains(&"v=v1")
            && params.contains(&"g=meta.k8s.io")
    })
}

/// One column: name, type, priority (1 = `-o wide` only) and how to render a cell.
struct Column {
    name: String,
    kind: &'static str,
    priority: u8,
    cell: Cell,
}

enum Cell {
    Name,
    Age,
    Path(String),
    PodReady,
    PodStatus,
    PodRestarts,
    NodeStatus,
    NodeRoles,
    Replicas(&'static str, &'static str),
}

fn col(name: &str, kind: &'static str, priority: u8, cell: Cell) -> Column {
    Column {
        name: name.to_string(),
        kind,
        priority,
        cell,
    }
}

fn columns(def: &ResourceDef) -> Vec<Column> {
    let mut cols = vec![col("Name", "string", 0, Cell::Name)];
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => {
            cols.push(col("Ready", "string", 0, Cell::PodReady));
            cols.push(col("Status", "string", 0, Cell::PodStatus));
            cols.push(col("Restarts", "string", 0, Cell::PodRestarts));
            cols.push(col("Age", "string", 0, Cell::Age));
            cols.push(col("IP", "string", 1, Cell::Path("status.podIP".into())));
            cols.push(col("Node", "string", 1, Cell::Path("spec.nodeName".into())));
        }
        ("", "nodes") => {
            cols.push(col("Status", "string", 0, Cell::NodeStatus));
            cols.push(col("Roles", "string", 0, Cell::NodeRoles));
            cols.push(col("Age", "string", 0, Cell::Age));
            cols.push(col(
                "Version",
                "string",
                0,
                Cell::Path("status.nodeInfo.kubeletVersion".into()),
            ));
        }
        ("apps", "deployments" | "replicasets" | "statefulsets") => {
            cols.push(col(
                "Ready",
                "string",
                0,
                Cell::Replicas("readyReplicas", "replicas"),
            ));
            cols.push(col(
                "Available",
                "integer",
                0,
                Cell::Path("status.availableReplicas".into()),
            ));
            cols.push(col("Age", "string", 0, Cell::Age));
        }
        _ => {
            for (name, kind, path) in &def.printer_columns {
                let kind = if kind == "integer" {
                    "integer"
                } else {
                    "string"
                };
                cols.push(col(
                    name,
                    kind,
                    0,
                    Cell::Path(path.trim_start_matches('.').into()),
                ));
            }
            if !def.printer_columns.iter().any(|(n, _, _)| n == "Age") {
                cols.push(col("Age", "string", 0, Cell::Age));
            }
        }
    }
    cols
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn path_value(obj: &Value, path: &str) -> Value {
    let pointer = format!("/{}", path.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => v.clone(),
        Some(other) if !other.is_null() => json!(other.to_string()),
        _ => json!("<none>"),
    }
}

/// Ages the way kubectl prints them (`42s`, `3m12s`, `5h`, `2d`).
pub(crate) fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..28_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28_800..172_800 => format!("{}h", s / 3600),
        172_800..691_200 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn age(obj: &Value) -> String {
    let created = str_at(obj, "/metadata/creationTimestamp");
    match created.parse::<jiff::Timestamp>() {
        Ok(t) => human_age(jiff::Timestamp::now().as_second() - t.as_second()),
        Err(_) => "<unknown>".into(),
    }
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(kind)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

fn render(cell: &Cell, obj: &Value) -> Value {
    match cell {
        Cell::Name => json!(str_at(obj, "/metadata/name")),
        Cell::Age => json!(age(obj)),
        Cell::Path(path) => path_value(obj, path),
        Cell::PodReady => {
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .map_or(0, |cs| {
                    cs.iter()
                        .filter(|c| c.get("ready") == Some(&json!(true)))
                        .count()
                });
            json!(format!("{ready}/{total}"))
        }
        Cell::PodStatus if obj.pointer("/metadata/deletionTimestamp").is_some() => {
            json!("Terminating")
        }
        Cell::PodStatus => json!(str_at(obj, "/status/phase")),
        Cell::PodRestarts => {
            let restarts: i64 = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .map_or(0, |cs| {
                    cs.iter()
                        .filter_map(|c| c.get("restartCount")?.as_i64())
                        .sum()
                });
            json!(restarts.to_string())
        }
        Cell::NodeStatus => {
            let mut status = if condition_true(obj, "Ready") {
                "Ready"
            } else {
                "NotReady"
            }
            .to_string();
            if obj.pointer("/spec/unschedulable") == Some(&json!(true)) {
                status.push_str(",SchedulingDisabled");
            }
            json!(status)
        }
        Cell::NodeRoles => {
            let roles: Vec<&str> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            json!(if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            })
        }
        Cell::Replicas(have, want) => {
            let n = |f: &str| {
                obj.pointer(&format!("/status/{f}"))
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
            };
            let want = obj
                .pointer(&format!("/spec/{want}"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            json!(format!("{}/{want}", n(have)))
        }
    }
}

/// One Table row; the object is the full object or its PartialObjectMetadata.
fn row(cols: &[Column], obj: &Value, full: bool) -> Value {
    let cells: Vec<Value> = cols.iter().map(|c| render(&c.cell, obj)).collect();
    let object = if full {
        obj.clone()
    } else {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
               "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({}))})
    };
    json!({"cells": cells, "object": object})
}

/// A Table of `items`, with the list's metadata (resourceVersion, continue).
pub(crate) fn table(
    def: &ResourceDef,
    items: &[Value],
    metadata: Value,
    include_object: bool,
) -> Value {
    let cols = columns(def);
    let definitions: Vec<Value> = cols
        .iter()
        .map(|c| {
            let format = if matches!(c.cell, Cell::Name) { "name" } else { "" };
            json!({"name": c.name, "type": c.kind, "format": format, "description": "", "priority": c.priority})
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| row(&cols, o, include_object))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
           "columnDefinitions": definitions, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::apiserver::resources::Registry;

    #[test]
    fn accept_header_selects_tables() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }

    #[test]
    fn node_rows_show_readiness_and_cordons() {
        let reg = Registry::default();
        let def = reg.find("", "v1", "nodes").unwrap();
        let node = json!({"metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}},
                          "spec": {"unschedulable": true},
                          "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                     "nodeInfo": {"kubeletVersion": "v1.33.0"}}});
        let t = table(&def, &[node], json!({}), false);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "n1");
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "worker");
        assert_eq!(cells[4], "v1.33.0");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(42), "42s");
        assert_eq!(human_age(192), "3m12s");
        assert_eq!(human_age(3 * 86_400 + 7200), "3d2h");
    }
}
