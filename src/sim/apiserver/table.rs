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
    Date(String),
    ServicePorts,
    ExternalIp,
}

fn col(name: &str, kind: &'static str, priority: u8, cell: Cell) -> Column {
    Column {
        name: name.to_string(),
        kind,
        priority,
        cell,
    }
}

/// A string column shown by default.
fn text(name: &str, cell: Cell) -> Column {
    col(name, "string", 0, cell)
}

fn path(p: &str) -> Cell {
    Cell::Path(p.to_string())
}

/// The columns upstream's printers show for built-in kinds.
fn builtin_columns(def: &ResourceDef) -> Option<Vec<Column>> {
    Some(match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => vec![
            text("Ready", Cell::PodReady),
            text("Status", Cell::PodStatus),
            text("Restarts", Cell::PodRestarts),
            text("Age", Cell::Age),
            col("IP", "string", 1, path("status.podIP")),
            col("Node", "string", 1, path("spec.nodeName")),
        ],
        ("", "nodes") => vec![
            text("Status", Cell::NodeStatus),
            text("Roles", Cell::NodeRoles),
            text("Age", Cell::Age),
            text("Version", path("status.nodeInfo.kubeletVersion")),
        ],
        ("", "services") => vec![
            text("Type", path("spec.type")),
            text("Cluster-IP", path("spec.clusterIP")),
            text("External-IP", Cell::ExternalIp),
            text("Port(s)", Cell::ServicePorts),
            text("Age", Cell::Age),
        ],
        ("apps", "deployments" | "replicasets" | "statefulsets") => vec![
            text("Ready", Cell::Replicas("readyReplicas", "replicas")),
            col("Available", "integer", 0, path("status.availableReplicas")),
            text("Age", Cell::Age),
        ],
        _ => return None,
    })
}

/// A custom resource's `additionalPrinterColumns` (dates shown as ages), then Age.
fn custom_columns(def: &ResourceDef) -> Vec<Column> {
    let mut cols: Vec<Column> = def
        .printer_columns
        .iter()
        .map(|(name, kind, json_path)| {
            let p = json_path.trim_start_matches('.').to_string();
            match kind.as_str() {
                "date" => col(name, "string", 0, Cell::Date(p)),
                "integer" => col(name, "integer", 0, Cell::Path(p)),
                _ => col(name, "string", 0, Cell::Path(p)),
            }
        })
        .collect();
    if !def.printer_columns.iter().any(|(n, _, _)| n == "Age") {
        cols.push(text("Age", Cell::Age));
    }
    cols
}

fn columns(def: &ResourceDef) -> Vec<Column> {
    let mut cols = vec![text("Name", Cell::Name)];
    cols.extend(builtin_columns(def).unwrap_or_else(|| custom_columns(def)));
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
    since(str_at(obj, "/metadata/creationTimestamp"))
}

fn since(timestamp: &str) -> String {
    match timestamp.parse::<jiff::Timestamp>() {
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
        Cell::Date(path) => json!(since(str_at(obj, &format!("/{}", path.replace('.', "/"))))),
        Cell::ServicePorts => json!(service_ports(obj)),
        Cell::ExternalIp => json!(external_ip(obj)),
        other => render_workload(other, obj),
    }
}

fn render_workload(cell: &Cell, obj: &Value) -> Value {
    match cell {
        Cell::PodReady => json!(pod_ready(obj)),
        Cell::PodStatus if obj.pointer("/metadata/deletionTimestamp").is_some() => {
            json!("Terminating")
        }
        Cell::PodStatus => json!(str_at(obj, "/status/phase")),
        Cell::PodRestarts => json!(pod_restarts(obj).to_string()),
        Cell::NodeStatus => json!(node_status(obj)),
        Cell::NodeRoles => json!(node_roles(obj)),
        Cell::Replicas(have, want) => {
            let have = obj
                .pointer(&format!("/status/{have}"))
                .and_then(Value::as_i64);
            let want = obj
                .pointer(&format!("/spec/{want}"))
                .and_then(Value::as_i64);
            json!(format!("{}/{}", have.unwrap_or(0), want.unwrap_or(0)))
        }
        _ => Value::Null,
    }
}

fn container_statuses(obj: &Value) -> &[Value] {
    obj.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn pod_ready(obj: &Value) -> String {
    let total = obj
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = container_statuses(obj)
        .iter()
        .filter(|c| c.get("ready") == Some(&json!(true)))
        .count();
    format!("{ready}/{total}")
}

fn pod_restarts(obj: &Value) -> i64 {
    container_statuses(obj)
        .iter()
        .filter_map(|c| c.get("restartCount")?.as_i64())
        .sum()
}

fn node_status(obj: &Value) -> String {
    let ready = if condition_true(obj, "Ready") {
        "Ready"
    } else {
        "NotReady"
    };
    if obj.pointer("/spec/unschedulable") == Some(&json!(true)) {
        format!("{ready},SchedulingDisabled")
    } else {
        ready.to_string()
    }
}

fn node_roles(obj: &Value) -> String {
    let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
    let roles: Vec<&str> = labels
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

fn external_ip(obj: &Value) -> String {
    let ingress = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array);
    let ips: Vec<&str> = ingress
        .map(|i| {
            i.iter()
                .filter_map(|e| e.get("ip").or(e.get("hostname"))?.as_str())
                .collect()
        })
        .unwrap_or_default();
    match (ips.is_empty(), str_at(obj, "/spec/type") == "LoadBalancer") {
        (false, _) => ips.join(","),
        (true, true) => "<pending>".into(),
        (true, false) => "<none>".into(),
    }
}

fn service_ports(obj: &Value) -> String {
    let ports = obj.pointer("/spec/ports").and_then(Value::as_array);
    let rendered: Vec<String> = ports
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                    let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                    match p.get("nodePort").and_then(Value::as_i64) {
                        Some(node) => format!("{port}:{node}/{proto}"),
                        None => format!("{port}/{proto}"),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if rendered.is_empty() {
        "<none>".into()
    } else {
        rendered.join(",")
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
