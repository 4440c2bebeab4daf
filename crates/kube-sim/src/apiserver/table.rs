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
    /// An integer at a path, 0 when unset.
    Int(&'static str),
    /// Any other rendering.
    With(fn(&Value) -> Value),
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

/// An integer column read from `path` (0 when unset, like upstream's printers).
fn int(name: &str, path: &'static str) -> Column {
    col(name, "integer", 0, Cell::Int(path))
}

/// A column rendered by `f`.
fn with(name: &str, kind: &'static str, f: fn(&Value) -> Value) -> Column {
    col(name, kind, 0, Cell::With(f))
}

/// The columns upstream's printers show for built-in kinds
/// (`pkg/printers/internalversion/printers.go`, AddHandlers; kinds without a handler
/// get the default table's Name and Created At).
fn builtin_columns(def: &ResourceDef) -> Option<Vec<Column>> {
    if let Some(cols) = more_columns(def) {
        return Some(cols);
    }
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
        ("apps", "deployments") => vec![
            text("Ready", Cell::Replicas("readyReplicas", "replicas")),
            int("Up-to-date", "status.updatedReplicas"),
            int("Available", "status.availableReplicas"),
            text("Age", Cell::Age),
        ],
        ("apps", "statefulsets") => vec![
            text("Ready", Cell::Replicas("readyReplicas", "replicas")),
            text("Age", Cell::Age),
        ],
        _ => return None,
    })
}

/// Columns of the remaining built-in kinds.
fn more_columns(def: &ResourceDef) -> Option<Vec<Column>> {
    let age = || text("Age", Cell::Age);
    Some(match (def.group.as_str(), def.plural.as_str()) {
        ("", "namespaces") => vec![text("Status", path("status.phase")), age()],
        ("", "configmaps") => vec![
            with("Data", "string", |o| count(o, &["data", "binaryData"])),
            age(),
        ],
        ("", "secrets") => vec![
            text("Type", path("type")),
            with("Data", "string", |o| count(o, &["data"])),
            age(),
        ],
        ("", "serviceaccounts") => {
            vec![with("Secrets", "string", |o| count(o, &["secrets"])), age()]
        }
        ("", "endpoints") => vec![with("Endpoints", "string", endpoints), age()],
        ("", "events") | ("events.k8s.io", "events") => vec![
            with("Last Seen", "string", event_last_seen),
            text("Type", path("type")),
            text("Reason", path("reason")),
            with("Object", "string", event_object),
            text(
                "Message",
                path(if def.group.is_empty() {
                    "message"
                } else {
                    "note"
                }),
            ),
        ],
        ("discovery.k8s.io", "endpointslices") => vec![
            text("AddressType", path("addressType")),
            with("Ports", "string", slice_ports),
            with("Endpoints", "string", slice_endpoints),
            age(),
        ],
        ("apps", "replicasets") => vec![
            int("Desired", "spec.replicas"),
            int("Current", "status.replicas"),
            int("Ready", "status.readyReplicas"),
            age(),
        ],
        ("apps", "daemonsets") => vec![
            int("Desired", "status.desiredNumberScheduled"),
            int("Current", "status.currentNumberScheduled"),
            int("Ready", "status.numberReady"),
            int("Up-to-date", "status.updatedNumberScheduled"),
            int("Available", "status.numberAvailable"),
            with("Node Selector", "string", |o| {
                json!(pairs(o.pointer("/spec/template/spec/nodeSelector"), "="))
            }),
            age(),
        ],
        ("apps", "controllerrevisions") => vec![
            with("Controller", "string", controller_of),
            int("Revision", "revision"),
            age(),
        ],
        ("batch", "jobs") => vec![
            with("Status", "string", job_status),
            with("Completions", "string", job_completions),
            with("Duration", "string", job_duration),
            age(),
        ],
        ("policy", "poddisruptionbudgets") => vec![
            with("Min Available", "string", |o| {
                int_or_na(o, "/spec/minAvailable")
            }),
            with("Max Unavailable", "string", |o| {
                int_or_na(o, "/spec/maxUnavailable")
            }),
            int("Allowed Disruptions", "status.disruptionsAllowed"),
            age(),
        ],
        ("coordination.k8s.io", "leases") => {
            vec![text("Holder", path("spec.holderIdentity")), age()]
        }
        ("admissionregistration.k8s.io", _) => vec![
            with("Webhooks", "integer", |o| json!(len_at(o, "/webhooks"))),
            age(),
        ],
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => vec![
            with("Role", "string", |o| {
                json!(format!(
                    "{}/{}",
                    str_at(o, "/roleRef/kind"),
                    str_at(o, "/roleRef/name")
                ))
            }),
            age(),
        ],
        ("networking.k8s.io", "networkpolicies") => vec![
            with("Pod-Selector", "string", |o| {
                json!(selector(o.pointer("/spec/podSelector")))
            }),
            age(),
        ],
        ("networking.k8s.io", "ingresses") => vec![
            with("Class", "string", |o| {
                json!(non_empty(str_at(o, "/spec/ingressClassName")))
            }),
            with("Hosts", "string", ingress_hosts),
            with("Address", "string", |o| json!(lb_addresses(o))),
            with("Ports", "string", |o| {
                json!(if len_at(o, "/spec/tls") > 0 {
                    "80, 443"
                } else {
                    "80"
                })
            }),
            age(),
        ],
        // No printer upstream: the default table's "Created At".
        ("rbac.authorization.k8s.io", _) | ("apiextensions.k8s.io", _) => {
            vec![with("Created At", "date", |o| {
                json!(str_at(o, "/metadata/creationTimestamp"))
            })]
        }
        _ => return None,
    })
}

fn len_at(obj: &Value, pointer: &str) -> usize {
    match obj.pointer(pointer) {
        Some(Value::Array(a)) => a.len(),
        Some(Value::Object(m)) => m.len(),
        _ => 0,
    }
}

fn count(obj: &Value, fields: &[&str]) -> Value {
    json!(
        fields
            .iter()
            .map(|f| len_at(obj, &format!("/{f}")))
            .sum::<usize>()
            .to_string()
    )
}

fn non_empty(s: &str) -> &str {
    if s.is_empty() { "<none>" } else { s }
}

/// `k=v,k2=v2` of a string map, `<none>` when empty.
fn pairs(map: Option<&Value>, sep: &str) -> String {
    let items: Vec<String> = map
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}{sep}{}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    non_empty(&items.join(",")).to_string()
}

/// A label selector the way `metav1.FormatLabelSelector` prints it.
fn selector(sel: Option<&Value>) -> String {
    let mut parts = Vec::new();
    if let Some(labels) = sel
        .and_then(|s| s.get("matchLabels"))
        .and_then(Value::as_object)
    {
        parts.extend(
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))),
        );
    }
    let expressions = sel
        .and_then(|s| s.get("matchExpressions"))
        .and_then(Value::as_array);
    for e in expressions.into_iter().flatten() {
        let key = str_at(e, "/key");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        parts.push(match str_at(e, "/operator") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        });
    }
    non_empty(&parts.join(",")).to_string()
}

fn int_or_na(obj: &Value, pointer: &str) -> Value {
    match obj.pointer(pointer) {
        Some(Value::Number(n)) => json!(n.to_string()),
        Some(Value::String(s)) => json!(s),
        _ => json!("N/A"),
    }
}

/// Up to three items then `+ N more...`, as upstream's endpoint printers do.
fn at_most_three(list: Vec<String>) -> String {
    match list.len() {
        0 => "<none>".into(),
        1..=3 => list.join(","),
        n => format!("{} + {} more...", list[..3].join(","), n - 3),
    }
}

fn endpoints(obj: &Value) -> Value {
    let mut list = Vec::new();
    for subset in obj
        .get("subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let ips: Vec<&str> = subset
            .get("addresses")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|x| str_at(x, "/ip")).collect())
            .unwrap_or_default();
        let ports: Vec<i64> = subset
            .get("ports")
            .and_then(Value::as_array)
            .map(|p| p.iter().filter_map(|x| x.get("port")?.as_i64()).collect())
            .unwrap_or_default();
        for port in &ports {
            list.extend(ips.iter().map(|ip| format!("{ip}:{port}")));
        }
        if ports.is_empty() {
            list.extend(ips.iter().map(|ip| ip.to_string()));
        }
    }
    json!(at_most_three(list))
}

fn slice_ports(obj: &Value) -> Value {
    let ports: Vec<String> = obj
        .get("ports")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    match (
                        p.get("port").and_then(Value::as_i64),
                        p.get("name").and_then(Value::as_str),
                    ) {
                        (Some(n), _) => n.to_string(),
                        (None, Some(name)) => name.to_string(),
                        (None, None) => "*".to_string(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    json!(at_most_three(ports))
}

fn slice_endpoints(obj: &Value) -> Value {
    let addresses: Vec<String> = obj
        .get("endpoints")
        .and_then(Value::as_array)
        .map(|es| {
            es.iter()
                .flat_map(|e| {
                    e.get("addresses")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|a| a.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    json!(at_most_three(addresses))
}

fn event_last_seen(obj: &Value) -> Value {
    let last = [
        "/lastTimestamp",
        "/eventTime",
        "/series/lastObservedTime",
        "/deprecatedLastTimestamp",
    ]
    .iter()
    .map(|p| str_at(obj, p))
    .find(|t| !t.is_empty())
    .unwrap_or_else(|| str_at(obj, "/metadata/creationTimestamp"));
    json!(since(last))
}

fn event_object(obj: &Value) -> Value {
    let regarding = obj.get("involvedObject").or_else(|| obj.get("regarding"));
    let r = regarding.unwrap_or(&Value::Null);
    json!(format!(
        "{}/{}",
        str_at(r, "/kind").to_lowercase(),
        str_at(r, "/name")
    ))
}

fn controller_of(obj: &Value) -> Value {
    let owners = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array);
    let controller = owners
        .into_iter()
        .flatten()
        .find(|o| o.get("controller") == Some(&json!(true)));
    json!(match controller {
        Some(o) => {
            let api = str_at(o, "/apiVersion");
            let group = api.split_once('/').map_or("", |(g, _)| g);
            let kind = str_at(o, "/kind").to_lowercase();
            let kind = if group.is_empty() {
                kind
            } else {
                format!("{kind}.{group}")
            };
            format!("{kind}/{}", str_at(o, "/name"))
        }
        None => "<none>".into(),
    })
}

fn job_status(obj: &Value) -> Value {
    let status = if condition_true(obj, "Complete") {
        "Complete"
    } else if condition_true(obj, "Failed") {
        "Failed"
    } else if obj.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else if condition_true(obj, "Suspended") {
        "Suspended"
    } else {
        "Running"
    };
    json!(status)
}

fn job_completions(obj: &Value) -> Value {
    let succeeded = obj
        .pointer("/status/succeeded")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    match obj.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(n) => json!(format!("{succeeded}/{n}")),
        None => {
            let parallelism = obj
                .pointer("/spec/parallelism")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            json!(format!("{succeeded}/1 of {parallelism}"))
        }
    }
}

fn job_duration(obj: &Value) -> Value {
    let start = str_at(obj, "/status/startTime").parse::<jiff::Timestamp>();
    let Ok(start) = start else {
        return json!("");
    };
    let end = str_at(obj, "/status/completionTime")
        .parse::<jiff::Timestamp>()
        .unwrap_or_else(|_| jiff::Timestamp::now());
    json!(human_age(end.as_second() - start.as_second()))
}

fn ingress_hosts(obj: &Value) -> Value {
    let hosts: Vec<String> = obj
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .map(|rules| {
            rules
                .iter()
                .filter_map(|r| r.get("host")?.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    json!(if hosts.is_empty() {
        "*".to_string()
    } else {
        at_most_three(hosts)
    })
}

fn lb_addresses(obj: &Value) -> String {
    let ingress = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array);
    let list: Vec<&str> = ingress
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("ip").or(e.get("hostname"))?.as_str())
        .collect();
    list.join(",")
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
        Cell::Int(path) => json!(
            obj.pointer(&format!("/{}", path.replace('.', "/")))
                .and_then(Value::as_i64)
                .unwrap_or(0)
        ),
        Cell::With(f) => f(obj),
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
            let kind = if c.kind == "date" { "date" } else { c.kind };
            json!({"name": c.name, "type": kind, "format": format, "description": "", "priority": c.priority})
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
    use crate::apiserver::resources::Registry;

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
    fn disruption_budget_rows_show_upstreams_columns() {
        let reg = Registry::default();
        let def = reg.find("policy", "v1", "poddisruptionbudgets").unwrap();
        let pdb = json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2},
                         "status": {"disruptionsAllowed": 1}});
        let t = table(&def, &[pdb], json!({}), false);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "Min Available",
                "Max Unavailable",
                "Allowed Disruptions",
                "Age"
            ]
        );
        let cells = &t["rows"][0]["cells"];
        assert_eq!(
            (&cells[1], &cells[2], &cells[3]),
            (&json!("2"), &json!("N/A"), &json!(1))
        );
    }

    #[test]
    fn every_served_builtin_kind_has_upstreams_columns() {
        let reg = Registry::default();
        for (group, version, plural) in reg.builtin_resources() {
            let def = reg.find(&group, &version, &plural).unwrap();
            assert!(
                builtin_columns(&def).is_some(),
                "{group}/{plural} has no columns"
            );
        }
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(42), "42s");
        assert_eq!(human_age(192), "3m12s");
        assert_eq!(human_age(3 * 86_400 + 7200), "3d2h");
    }
}
