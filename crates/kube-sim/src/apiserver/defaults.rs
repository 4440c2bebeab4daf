//! Server-side defaulting and the few validations clients trip over: the values a real
//! API server fills in on every write (pod restart policy and grace period, workload
//! replicas and rollout strategy, Service type and cluster IP, ...), so controllers see
//! the objects they would see on a real cluster, and the pod-update restriction
//! (only images, tolerations, activeDeadlineSeconds and the grace period may change).
//! Custom resources get the `default`s their CRD's schema declares ([`from_schema`]).

use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Map, Value, json};

use super::resources::ResourceDef;

/// Sets `key` to `value` when absent or null.
fn default(map: &mut Map<String, Value>, key: &str, value: Value) {
    if map.get(key).is_none_or(Value::is_null) {
        map.insert(key.to_string(), value);
    }
}

fn object_at<'a>(obj: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut cur = obj;
    for key in path {
        cur = cur.as_object_mut()?.get_mut(*key)?;
    }
    cur.as_object_mut()
}

fn container_defaults(spec: &mut Map<String, Value>, list: &str) {
    let Some(Value::Array(containers)) = spec.get_mut(list) else {
        return;
    };
    for container in containers.iter_mut().filter_map(Value::as_object_mut) {
        let image = container.get("image").and_then(Value::as_str).unwrap_or("");
        let latest = !image.contains(':') || image.ends_with(":latest");
        let policy = if latest { "Always" } else { "IfNotPresent" };
        default(container, "imagePullPolicy", json!(policy));
        default(
            container,
            "terminationMessagePath",
            json!("/dev/termination-log"),
        );
        default(container, "terminationMessagePolicy", json!("File"));
        if let Some(Value::Array(ports)) = container.get_mut("ports") {
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                default(port, "protocol", json!("TCP"));
            }
        }
    }
}

/// Defaults of a PodSpec (pods and workload templates).
fn pod_spec_defaults(spec: &mut Map<String, Value>) {
    default(spec, "restartPolicy", json!("Always"));
    // Upstream default grace period; the eviction and delete paths read it.
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "schedulerName", json!("default-scheduler"));
    default(spec, "securityContext", json!({}));
    container_defaults(spec, "containers");
    container_defaults(spec, "initContainers");
}

fn template_defaults(obj: &mut Value, path: &[&str]) {
    if let Some(spec) = object_at(obj, path) {
        pod_spec_defaults(spec);
    }
}

/// Cluster IPs handed out to Services (10.96.0.0/12, like kubeadm's default range).
static NEXT_CLUSTER_IP: AtomicU32 = AtomicU32::new(10);
/// NodePorts handed out to NodePort/LoadBalancer Services (30000–32767).
static NEXT_NODE_PORT: AtomicU32 = AtomicU32::new(30000);

fn service_defaults(spec: &mut Map<String, Value>) {
    default(spec, "type", json!("ClusterIP"));
    default(spec, "sessionAffinity", json!("None"));
    default(spec, "internalTrafficPolicy", json!("Cluster"));
    let kind = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if kind != "ExternalName" && spec.get("clusterIP").is_none_or(Value::is_null) {
        let n = NEXT_CLUSTER_IP.fetch_add(1, Ordering::Relaxed);
        let ip = format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff);
        spec.insert("clusterIP".into(), json!(ip));
        spec.insert("clusterIPs".into(), json!([ip]));
        default(spec, "ipFamilies", json!(["IPv4"]));
        default(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
    let external = matches!(kind.as_str(), "NodePort" | "LoadBalancer");
    if external {
        default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    let Some(Value::Array(ports)) = spec.get_mut("ports") else {
        return;
    };
    for port in ports.iter_mut().filter_map(Value::as_object_mut) {
        default(port, "protocol", json!("TCP"));
        if let Some(number) = port.get("port").cloned() {
            default(port, "targetPort", number);
        }
        if external {
            let node_port = 30000 + (NEXT_NODE_PORT.fetch_add(1, Ordering::Relaxed) - 30000) % 2768;
            default(port, "nodePort", json!(node_port));
        }
    }
}

fn workload_defaults(plural: &str, obj: &mut Value) {
    let Some(spec) = object_at(obj, &["spec"]) else {
        return;
    };
    match plural {
        "deployments" => {
            default(spec, "replicas", json!(1));
            default(spec, "revisionHistoryLimit", json!(10));
            default(spec, "progressDeadlineSeconds", json!(600));
            default(spec, "strategy", json!({"type": "RollingUpdate"}));
            if let Some(strategy) = spec.get_mut("strategy").and_then(Value::as_object_mut)
                && strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate")
            {
                default(strategy, "rollingUpdate", json!({}));
                if let Some(ru) = strategy
                    .get_mut("rollingUpdate")
                    .and_then(Value::as_object_mut)
                {
                    default(ru, "maxUnavailable", json!("25%"));
                    default(ru, "maxSurge", json!("25%"));
                }
            }
        }
        "replicasets" => default(spec, "replicas", json!(1)),
        "statefulsets" => {
            default(spec, "replicas", json!(1));
            default(spec, "podManagementPolicy", json!("OrderedReady"));
            default(spec, "revisionHistoryLimit", json!(10));
            default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
        }
        "daemonsets" => {
            default(spec, "revisionHistoryLimit", json!(10));
            default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
        }
        _ => {}
    }
    template_defaults(obj, &["spec", "template", "spec"]);
}

/// Applies the API server's defaults for built-in kinds.
pub(crate) fn apply(def: &ResourceDef, obj: &mut Value) {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => template_defaults(obj, &["spec"]),
        ("", "services") => {
            if let Some(spec) = object_at(obj, &["spec"]) {
                service_defaults(spec);
            }
        }
        ("apps", plural) => workload_defaults(plural, obj),
        ("batch", "jobs") => template_defaults(obj, &["spec", "template", "spec"]),
        _ => {}
    }
}

/// Applies the `default`s of a custom resource's structural schema, the way
/// kube-apiserver does (`structuraldefaulting.Default` in k8s.io/apiextensions-apiserver
/// pkg/apiserver/schema/defaulting/algorithm.go): a property that is absent, or `null`
/// without `nullable: true`, gets its default, and defaulting continues into every
/// property present afterwards, defaulted ones included, into array `items` and into
/// `additionalProperties` values.
pub(crate) fn from_schema(schema: &Value, obj: &mut Value) {
    match obj {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            for (name, property) in properties.into_iter().flatten() {
                default_property(map, name, property);
            }
            let extra = schema.get("additionalProperties").filter(|s| s.is_object());
            for (name, value) in map.iter_mut() {
                if let Some(property) = properties.and_then(|p| p.get(name)).or(extra) {
                    from_schema(property, value);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                items.iter_mut().for_each(|value| from_schema(item, value));
            }
        }
        _ => {}
    }
}

/// Sets property `name` to its schema default when it is missing or a null it may not be.
fn default_property(map: &mut Map<String, Value>, name: &str, property: &Value) {
    let Some(default) = property.get("default") else {
        return;
    };
    let nullable = property.get("nullable").and_then(Value::as_bool) == Some(true);
    let unset = match map.get(name) {
        None => true,
        Some(Value::Null) => !nullable,
        Some(_) => false,
    };
    if unset {
        map.insert(name.to_string(), default.clone());
    }
}

/// Pod spec fields an update may change (upstream ValidatePodUpdate).
fn mutable_pod_spec_view(spec: &Value) -> Value {
    let mut view = spec.clone();
    if let Some(map) = view.as_object_mut() {
        for key in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
        ] {
            map.remove(key);
        }
        for list in ["containers", "initContainers"] {
            if let Some(Value::Array(items)) = map.get_mut(list) {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    item.remove("image");
                }
            }
        }
    }
    view
}

/// `Err(message)` when a pod update changes an immutable part of the spec.
pub(crate) fn check_pod_update(old: &Value, new: &Value) -> Result<(), String> {
    let (Some(old_spec), Some(new_spec)) = (old.get("spec"), new.get("spec")) else {
        return Ok(());
    };
    if mutable_pod_spec_view(old_spec) == mutable_pod_spec_view(new_spec) {
        return Ok(());
    }
    Err("spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::Registry;

    #[test]
    fn schema_defaults_fill_absent_and_non_nullable_null_properties_top_down() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "size": {"type": "integer", "default": 1},
                "note": {"type": "string", "nullable": true, "default": "n"},
                "ports": {"type": "array", "items": {"type": "object", "properties": {
                    "protocol": {"type": "string", "default": "TCP"}}}},
                "labels": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {"weight": {"type": "integer", "default": 0}}}}}},
            "status": {"type": "object", "default": {}, "properties": {
                "phase": {"type": "string", "default": "Pending"}}}}});
        let mut obj = json!({"spec": {"size": null, "note": null,
            "ports": [{"port": 80}, {"protocol": "UDP"}], "labels": {"a": {}}}});
        from_schema(&schema, &mut obj);
        assert_eq!(
            obj,
            json!({"spec": {"size": 1, "note": null,
                "ports": [{"port": 80, "protocol": "TCP"}, {"protocol": "UDP"}],
                "labels": {"a": {"weight": 0}}},
                "status": {"phase": "Pending"}})
        );
    }

    #[test]
    fn workloads_and_services_get_upstream_defaults() {
        let reg = Registry::default();
        let mut deploy = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "web:1"}]}}}});
        apply(&reg.find("apps", "v1", "deployments").unwrap(), &mut deploy);
        assert_eq!(deploy["spec"]["replicas"], 1);
        assert_eq!(
            deploy["spec"]["strategy"]["rollingUpdate"]["maxSurge"],
            "25%"
        );
        assert_eq!(
            deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
            30
        );
        assert_eq!(
            deploy["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        let mut svc = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        apply(&reg.find("", "v1", "services").unwrap(), &mut svc);
        assert!(
            svc["spec"]["clusterIP"]
                .as_str()
                .unwrap()
                .starts_with("10.96.")
        );
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80);
        assert!(svc["spec"]["ports"][0]["nodePort"].as_u64().unwrap() >= 30000);
    }

    #[test]
    fn pod_updates_may_only_change_images_and_a_few_fields() {
        let old = json!({"spec": {"nodeName": "", "containers": [{"name": "a", "image": "x:1"}]}});
        let image =
            json!({"spec": {"nodeName": "", "containers": [{"name": "a", "image": "x:2"}]}});
        assert!(check_pod_update(&old, &image).is_ok());
        let moved =
            json!({"spec": {"nodeName": "n1", "containers": [{"name": "a", "image": "x:1"}]}});
        assert!(check_pod_update(&old, &moved).is_err());
    }
}
