//! The resources the simulated API server serves: built-in kinds, plus those added by
//! CustomResourceDefinitions at run time, and the discovery documents describing them.
//!
//! Built-in kinds are round-tripped through their `k8s-openapi` types on every write, so
//! unknown (misspelled) fields vanish the way the real API server drops them.

use std::sync::{Arc, RwLock};

use k8s_openapi::api::{
    admissionregistration::v1 as admv1, apps::v1 as apps, batch::v1 as batch,
    coordination::v1 as coord, core::v1 as core, discovery::v1 as disc, events::v1 as events,
    networking::v1 as net, policy::v1 as policy, rbac::v1 as rbac,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub(crate) use super::convert::View;

/// Round-trips a JSON object through a typed representation (drops unknown fields).
pub(crate) type Normalize = fn(Value) -> Result<Value, serde_json::Error>;

fn roundtrip<K: DeserializeOwned + Serialize>(value: Value) -> Result<Value, serde_json::Error> {
    let typed: K = serde_json::from_value(value)?;
    serde_json::to_value(&typed)
}

/// One served resource (one group/version/plural).
#[derive(Clone, Debug)]
pub(crate) struct ResourceDef {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    /// Subresources served: `status`, `eviction`, `binding`.
    pub subresources: Vec<String>,
    /// Field paths usable in field selectors besides metadata.name/namespace.
    pub selectable_fields: Vec<String>,
    pub normalize: Option<Normalize>,
    /// Defined by a CustomResourceDefinition (no strategic merge patch).
    pub custom: bool,
    /// How the served form maps to the stored one.
    pub view: View,
    /// (name, type, jsonPath) Table columns of a custom resource.
    pub printer_columns: Vec<(String, String, String)>,
    /// A custom resource's `openAPIV3Schema`, whose `default`s the API server applies.
    pub schema: Option<Arc<Value>>,
}

impl ResourceDef {
    /// `v1` or `group/version`.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Storage table key shared by every version of the resource (events.k8s.io
    /// Events live with core Events).
    pub(crate) fn table(&self) -> String {
        match self.view {
            View::EventsV1 => "/events".to_string(),
            View::Native => format!("{}/{}", self.group, self.plural),
        }
    }

    pub(crate) fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }

    /// Storage key of an object.
    pub(crate) fn key(&self, namespace: &str, name: &str) -> String {
        if self.namespaced {
            format!("{namespace}/{name}")
        } else {
            name.to_string()
        }
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    subresources: &'static [&'static str],
    fields: &'static [&'static str],
    normalize: Normalize,
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "reason",
    "reportingController",
    "type",
];

macro_rules! builtin {
    ($g:expr, $v:expr, $p:expr, $ty:ty, $ns:expr, $short:expr, $subs:expr, $fields:expr) => {
        Builtin {
            group: $g,
            version: $v,
            plural: $p,
            kind: <$ty as k8s_openapi::Resource>::KIND,
            namespaced: $ns,
            short: $short,
            subresources: $subs,
            fields: $fields,
            normalize: roundtrip::<$ty>,
        }
    };
}

#[rustfmt::skip]
fn builtins() -> Vec<Builtin> {
    const ST: &[&str] = &["status"];
    const SCALE: &[&str] = &["status", "scale"];
    const ADM: &str = "admissionregistration.k8s.io";
    vec![
        builtin!("", "v1", "namespaces", core::Namespace, false, &["ns"], ST, &["status.phase"]),
        builtin!("", "v1", "nodes", core::Node, false, &["no"], ST, &["spec.unschedulable"]),
        builtin!("", "v1", "pods", core::Pod, true, &["po"], &["status", "eviction", "binding"], POD_FIELDS),
        builtin!("", "v1", "services", core::Service, true, &["svc"], ST, &[]),
        builtin!("", "v1", "events", core::Event, true, &["ev"], &[], EVENT_FIELDS),
        builtin!("", "v1", "configmaps", core::ConfigMap, true, &["cm"], &[], &[]),
        builtin!("", "v1", "secrets", core::Secret, true, &[], &[], &["type"]),
        builtin!("", "v1", "serviceaccounts", core::ServiceAccount, true, &["sa"], &[], &[]),
        builtin!("", "v1", "endpoints", core::Endpoints, true, &["ep"], &[], &[]),
        builtin!("events.k8s.io", "v1", "events", events::Event, true, &["ev"], &[], EVENTS_V1_FIELDS),
        builtin!("discovery.k8s.io", "v1", "endpointslices", disc::EndpointSlice, true, &[], &[], &[]),
        builtin!("apps", "v1", "replicasets", apps::ReplicaSet, true, &["rs"], SCALE, &[]),
        builtin!("apps", "v1", "deployments", apps::Deployment, true, &["deploy"], SCALE, &[]),
        builtin!("apps", "v1", "daemonsets", apps::DaemonSet, true, &["ds"], ST, &[]),
        builtin!("apps", "v1", "statefulsets", apps::StatefulSet, true, &["sts"], SCALE, &[]),
        builtin!("apps", "v1", "controllerrevisions", apps::ControllerRevision, true, &[], &[], &[]),
        builtin!("batch", "v1", "jobs", batch::Job, true, &[], ST, &["status.successful"]),
        builtin!("policy", "v1", "poddisruptionbudgets", policy::PodDisruptionBudget, true, &["pdb"], ST, &[]),
        builtin!("coordination.k8s.io", "v1", "leases", coord::Lease, true, &[], &[], &[]),
        builtin!(ADM, "v1", "mutatingwebhookconfigurations", admv1::MutatingWebhookConfiguration, false, &[], &[], &[]),
        builtin!(ADM, "v1", "validatingwebhookconfigurations", admv1::ValidatingWebhookConfiguration, false, &[], &[], &[]),
        builtin!("rbac.authorization.k8s.io", "v1", "roles", rbac::Role, true, &[], &[], &[]),
        builtin!("rbac.authorization.k8s.io", "v1", "rolebindings", rbac::RoleBinding, true, &[], &[], &[]),
        builtin!("rbac.authorization.k8s.io", "v1", "clusterroles", rbac::ClusterRole, false, &[], &[], &[]),
        builtin!("rbac.authorization.k8s.io", "v1", "clusterrolebindings", rbac::ClusterRoleBinding, false, &[], &[], &[]),
        builtin!("networking.k8s.io", "v1", "networkpolicies", net::NetworkPolicy, true, &["netpol"], &[], &[]),
        builtin!("networking.k8s.io", "v1", "ingresses", net::Ingress, true, &["ing"], ST, &[]),
        builtin!("apiextensions.k8s.io", "v1", "customresourcedefinitions", apiext::CustomResourceDefinition, false, &["crd", "crds"], ST, &[]),
    ]
}

/// Every served resource; CRDs add and remove entries.
#[derive(Clone)]
pub(crate) struct Registry {
    defs: Arc<RwLock<Vec<Arc<ResourceDef>>>>,
}

impl Default for Registry {
    fn default() -> Self {
        let defs = builtins()
            .into_iter()
            .map(|b| {
                Arc::new(ResourceDef {
                    group: b.group.into(),
                    version: b.version.into(),
                    plural: b.plural.into(),
                    singular: b.kind.to_lowercase(),
                    kind: b.kind.into(),
                    namespaced: b.namespaced,
                    short_names: b.short.iter().map(|s| s.to_string()).collect(),
                    subresources: b.subresources.iter().map(|s| s.to_string()).collect(),
                    selectable_fields: b.fields.iter().map(|s| s.to_string()).collect(),
                    normalize: Some(b.normalize),
                    custom: false,
                    view: if b.group == "events.k8s.io" {
                        View::EventsV1
                    } else {
                        View::Native
                    },
                    printer_columns: Vec::new(),
                    schema: None,
                })
            })
            .collect();
        Self {
            defs: Arc::new(RwLock::new(defs)),
        }
    }
}

impl Registry {
    fn read(&self) -> Vec<Arc<ResourceDef>> {
        match self.defs.read() {
            Ok(defs) => defs.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Finds a served resource.
    pub(crate) fn find(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceDef>> {
        self.read()
            .into_iter()
            .find(|d| d.group == group && d.version == version && d.plural == plural)
    }

    /// Served group/versions, in registration order, without duplicates.
    /// (group, version, plural) of every built-in resource.
    #[cfg(test)]
    pub(crate) fn builtin_resources(&self) -> Vec<(String, String, String)> {
        self.read()
            .iter()
            .filter(|d| !d.custom)
            .map(|d| (d.group.clone(), d.version.clone(), d.plural.clone()))
            .collect()
    }

    pub(crate) fn group_versions(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for d in self.read() {
            let gv = (d.group.clone(), d.version.clone());
            if !out.contains(&gv) {
                out.push(gv);
            }
        }
        out
    }

    /// Serves the resources a CustomResourceDefinition describes (replacing earlier ones).
    pub(crate) fn install_crd(&self, crd: &Value) {
        let defs = crd_defs(crd);
        let Some(first) = defs.first().cloned() else {
            return;
        };
        let mut guard = match self.defs.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.retain(|d| !(d.custom && d.group == first.group && d.plural == first.plural));
        guard.extend(defs.into_iter().map(Arc::new));
    }

    /// Stops serving a CustomResourceDefinition's resources.
    pub(crate) fn remove_crd(&self, crd: &Value) {
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut guard = match self.defs.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.retain(|d| !(d.custom && d.group == group && d.plural == plural));
    }

    /// `GET /api` (APIVersions).
    pub(crate) fn api_versions(&self, server_address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        })
    }

    /// `GET /apis` (APIGroupList).
    pub(crate) fn api_group_list(&self) -> Value {
        let mut groups: Vec<String> = Vec::new();
        for (g, _) in self.group_versions() {
            if !g.is_empty() && !groups.contains(&g) {
                groups.push(g);
            }
        }
        let groups: Vec<Value> = groups.iter().filter_map(|g| self.api_group(g)).collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `GET /apis/{group}` (APIGroup).
    pub(crate) fn api_group(&self, group: &str) -> Option<Value> {
        let versions: Vec<Value> = self
            .group_versions()
            .into_iter()
            .filter(|(g, _)| g == group)
            .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
            .collect();
        let preferred = versions.first()?.clone();
        Some(json!({
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": versions,
            "preferredVersion": preferred,
        }))
    }

    /// `GET /openapi/v3`: one entry per served group/version.
    pub(crate) fn openapi_root(&self) -> Value {
        let mut paths = serde_json::Map::new();
        for (group, version) in self.group_versions() {
            let path = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            let url = format!("/openapi/v3/{path}?hash=0");
            paths.insert(path, json!({"serverRelativeURL": url}));
        }
        json!({"paths": paths})
    }

    /// `GET /openapi/v3/{api/v1 | apis/g/v}`: a minimal document declaring, for each
    /// kind, the PATCH operation with its `fieldValidation` parameter, which is what
    /// kubectl checks before relying on server-side field validation.
    pub(crate) fn openapi_group_version(&self, group: &str, version: &str) -> Option<Value> {
        let defs: Vec<Arc<ResourceDef>> = self
            .read()
            .into_iter()
            .filter(|d| d.group == group && d.version == version)
            .collect();
        if defs.is_empty() {
            return None;
        }
        let mut paths = serde_json::Map::new();
        for d in defs {
            let prefix = if group.is_empty() {
                format!("/api/{version}")
            } else {
                format!("/apis/{group}/{version}")
            };
            let path = if d.namespaced {
                format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
            } else {
                format!("{prefix}/{}/{{name}}", d.plural)
            };
            let gvk = json!({"group": group, "version": version, "kind": d.kind});
            let params = json!([
                {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            ]);
            let op = |verb: &str| {
                json!({"operationId": format!("{verb}{}", d.kind), "parameters": params,
                       "x-kubernetes-action": verb, "x-kubernetes-group-version-kind": gvk,
                       "responses": {"200": {"description": "OK"}}})
            };
            paths.insert(
                path,
                json!({"get": op("get"), "put": op("put"), "patch": op("patch")}),
            );
        }
        Some(json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths,
            "components": {"schemas": {}},
        }))
    }

    /// `GET /api/v1` or `/apis/{group}/{version}` (APIResourceList).
    pub(crate) fn api_resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let defs: Vec<Arc<ResourceDef>> = self
            .read()
            .into_iter()
            .filter(|d| d.group == group && d.version == version)
            .collect();
        if defs.is_empty() {
            return None;
        }
        let mut resources = Vec::new();
        for d in &defs {
            resources.push(json!({
                "name": d.plural,
                "singularName": d.singular,
                "namespaced": d.namespaced,
                "kind": d.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                "shortNames": d.short_names,
                "categories": categories(d),
            }));
            for sub in &d.subresources {
                resources.push(subresource_entry(d, sub));
            }
        }
        let group_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }))
    }
}

/// `kubectl get all` expands the `all` category.
fn categories(d: &ResourceDef) -> Vec<&'static str> {
    let all = matches!(
        (d.group.as_str(), d.plural.as_str()),
        ("", "pods" | "services")
            | (
                "apps",
                "deployments" | "replicasets" | "daemonsets" | "statefulsets"
            )
            | ("batch", "jobs")
    );
    if all { vec!["all"] } else { Vec::new() }
}

fn subresource_entry(d: &ResourceDef, sub: &str) -> Value {
    let name = format!("{}/{sub}", d.plural);
    match sub {
        "eviction" => json!({
            "name": name, "singularName": "", "namespaced": d.namespaced,
            "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"],
        }),
        "scale" => json!({
            "name": name, "singularName": "", "namespaced": d.namespaced,
            "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"],
        }),
        "binding" => json!({
            "name": name, "singularName": "", "namespaced": d.namespaced,
            "kind": "Binding", "verbs": ["create"],
        }),
        _ => json!({
            "name": name, "singularName": "", "namespaced": d.namespaced,
            "kind": d.kind, "verbs": ["get", "patch", "update"],
        }),
    }
}

/// A CRD version's `selectableFields` as field-selector paths. As in kube-apiserver
/// (CustomResourceFieldSelectors, GA in 1.32), a custom resource can be selected on
/// `metadata.name`, `metadata.namespace` and exactly these fields.
fn selectable_fields(version: &Value) -> Vec<String> {
    version
        .get("selectableFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.get("jsonPath")?.as_str())
                .map(|p| p.trim_start_matches('.').to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A CRD version's `additionalPrinterColumns` as (name, type, jsonPath).
fn printer_columns(version: &Value) -> Vec<(String, String, String)> {
    let columns = version
        .get("additionalPrinterColumns")
        .and_then(Value::as_array);
    columns
        .map(|cs| {
            cs.iter()
                .filter_map(|c| {
                    let field = |k: &str| c.get(k).and_then(Value::as_str).map(String::from);
                    Some((
                        field("name")?,
                        field("type").unwrap_or_default(),
                        field("jsonPath")?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The resource definitions a CRD object describes (one per served version).
fn crd_defs(crd: &Value) -> Vec<ResourceDef> {
    let s = |p: &str| {
        crd.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let group = s("/spec/group");
    let plural = s("/spec/names/plural");
    let kind = s("/spec/names/kind");
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Vec::new();
    }
    let singular = match s("/spec/names/singular") {
        x if x.is_empty() => kind.to_lowercase(),
        x => x,
    };
    let namespaced = s("/spec/scope") != "Cluster";
    let short_names: Vec<String> = crd
        .pointer("/spec/names/shortNames")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
        .filter_map(|v| {
            let version = v.get("name")?.as_str()?.to_string();
            let status = v.pointer("/subresources/status").is_some();
            Some(ResourceDef {
                group: group.clone(),
                version,
                plural: plural.clone(),
                singular: singular.clone(),
                kind: kind.clone(),
                namespaced,
                short_names: short_names.clone(),
                subresources: if status {
                    vec!["status".into()]
                } else {
                    vec![]
                },
                selectable_fields: selectable_fields(v),
                normalize: None,
                custom: true,
                view: View::Native,
                printer_columns: printer_columns(v),
                schema: v.pointer("/schema/openAPIV3Schema").cloned().map(Arc::new),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_pod_eviction_in_policy_group() {
        let reg = Registry::default();
        let list = reg.api_resource_list("", "v1").unwrap();
        let eviction = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .unwrap();
        assert_eq!(eviction["group"], "policy");
        assert_eq!(eviction["version"], "v1");
        assert_eq!(eviction["kind"], "Eviction");
    }

    #[test]
    fn normalize_drops_unknown_fields() {
        let reg = Registry::default();
        let def = reg.find("", "v1", "pods").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "spec": {"containers": [{"name": "c", "imagee": "x"}], "nodeNmae": "n"}});
        let out = (def.normalize.unwrap())(pod).unwrap();
        assert!(out.pointer("/spec/nodeNmae").is_none());
        assert!(out.pointer("/spec/containers/0/imagee").is_none());
        assert_eq!(out.pointer("/spec/containers/0/name").unwrap(), "c");
    }

    #[test]
    fn crd_installs_cluster_scoped_resources() {
        let reg = Registry::default();
        let crd = json!({"spec": {"group": "example.com", "scope": "Cluster",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1alpha1", "served": true, "subresources": {"status": {}}}]}});
        reg.install_crd(&crd);
        let def = reg.find("example.com", "v1alpha1", "widgets").unwrap();
        assert!(!def.namespaced);
        assert!(def.has_status());
        reg.remove_crd(&crd);
        assert!(reg.find("example.com", "v1alpha1", "widgets").is_none());
    }
}
