//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl's
//! `create` subcommands and Helm's typed clients send for built-in kinds.
//!
//! Wire format (upstream `k8s.io/apimachinery/pkg/runtime/serializer/protobuf`,
//! protobuf.go): the 4-byte magic `k8s\0`, then a `runtime.Unknown` whose `typeMeta`
//! names apiVersion and kind and whose `raw` is the typed message. The typed messages
//! come from the `k8s-pb` crate; each kind served here is converted to the JSON the
//! server stores. Conversion takes every field it understands out of the message; if
//! anything is left, the body carries fields this simulator does not decode and the
//! request is refused (415) rather than silently losing them.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{Map, Value, json};

use super::status::ApiError;

/// The protobuf media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The prefix of every protobuf-encoded object.
const MAGIC: &[u8] = b"k8s\0";

/// Whether a Content-Type is protobuf.
pub(crate) fn is_protobuf(content_type: &str) -> bool {
    content_type.split(';').next().map(str::trim) == Some(MEDIA_TYPE)
}

fn unsupported(message: String) -> ApiError {
    ApiError::new(415, "UnsupportedMediaType", message)
}

/// Decodes a protobuf body into the object's JSON.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let raw = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request("protobuf body does not start with the k8s\\0 magic")
    })?;
    let unknown = Unknown::decode(raw)
        .map_err(|e| ApiError::bad_request(format!("decode protobuf envelope: {e}")))?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let bytes = unknown.raw.unwrap_or_default();
    let bad = |e: prost::DecodeError| ApiError::bad_request(format!("decode protobuf {kind}: {e}"));
    // Parts taken out whole whose undecoded leftovers the top-level check cannot see.
    let mut left = Vec::new();
    let (mut object, rest) = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => {
            let mut m = core::Namespace::decode(bytes.as_slice()).map_err(bad)?;
            (namespace(&mut m), m.encode_to_vec())
        }
        ("v1", "ConfigMap") => {
            let mut m = core::ConfigMap::decode(bytes.as_slice()).map_err(bad)?;
            (config_map(&mut m), m.encode_to_vec())
        }
        ("v1", "Secret") => {
            let mut m = core::Secret::decode(bytes.as_slice()).map_err(bad)?;
            (secret(&mut m), m.encode_to_vec())
        }
        ("apps/v1", "Deployment") => {
            let mut m = apps::Deployment::decode(bytes.as_slice()).map_err(bad)?;
            (deployment(&mut m, &mut left), m.encode_to_vec())
        }
        ("v1" | "meta.k8s.io/v1", "DeleteOptions") => {
            let mut m = meta::DeleteOptions::decode(bytes.as_slice()).map_err(bad)?;
            (delete_options(&mut m), m.encode_to_vec())
        }
        _ => {
            return Err(unsupported(format!(
                "the simulated API server does not decode protobuf bodies of {api_version} {kind}; send application/json"
            )));
        }
    };
    if !is_zero(&rest) || !left.is_empty() {
        return Err(unsupported(format!(
            "the protobuf {kind} carries fields the simulated API server does not decode; send application/json"
        )));
    }
    object.insert("apiVersion".into(), json!(api_version));
    object.insert("kind".into(), json!(kind));
    Ok(Value::Object(object))
}

/// Whether an encoded message sets nothing but zero values. Go's generated marshallers
/// write every non-pointer field, so an "empty" message arrives full of `""`, `0` and
/// `false`, which JSON's `omitempty` would have left out. A length-delimited field
/// counts as zero when empty or when it is itself a message of zero values.
fn is_zero(mut bytes: &[u8]) -> bool {
    fn varint(bytes: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = bytes.split_first()?;
            *bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    while !bytes.is_empty() {
        let Some(key) = varint(&mut bytes) else {
            return false;
        };
        let zero = match key & 7 {
            0 => varint(&mut bytes) == Some(0),
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                let Some((field, rest)) = bytes.split_at_checked(width) else {
                    return false;
                };
                bytes = rest;
                field.iter().all(|b| *b == 0)
            }
            2 => {
                let Some(len) = varint(&mut bytes).and_then(|l| usize::try_from(l).ok()) else {
                    return false;
                };
                let Some((field, rest)) = bytes.split_at_checked(len) else {
                    return false;
                };
                bytes = rest;
                is_zero(field)
            }
            _ => false,
        };
        if !zero {
            return false;
        }
    }
    true
}

/// A JSON object under construction; absent values and empty strings are skipped like
/// Go's `omitempty` on the non-pointer string fields they come from.
#[derive(Default)]
struct Obj(Map<String, Value>);

impl Obj {
    fn opt<T: Into<Value>>(mut self, key: &str, value: Option<T>) -> Self {
        match value.map(Into::into) {
            Some(Value::String(s)) if s.is_empty() => {}
            Some(v) => {
                self.0.insert(key.into(), v);
            }
            None => {}
        }
        self
    }

    fn val(mut self, key: &str, value: Option<Value>) -> Self {
        if let Some(v) = value.filter(|v| !v.is_null()) {
            self.0.insert(key.into(), v);
        }
        self
    }

    fn strings(self, key: &str, list: Vec<String>) -> Self {
        let value = (!list.is_empty()).then(|| json!(list));
        self.val(key, value)
    }

    fn list(self, key: &str, list: Vec<Value>) -> Self {
        let value = (!list.is_empty()).then_some(Value::Array(list));
        self.val(key, value)
    }

    fn map(self, key: &str, map: BTreeMap<String, String>) -> Self {
        let value = (!map.is_empty()).then(|| json!(map));
        self.val(key, value)
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

fn time(t: Option<meta::Time>) -> Option<Value> {
    // A zero Go time arrives empty, or as year 1 (negative seconds): both mean unset.
    let seconds = t?.seconds.filter(|s| *s > 0)?;
    jiff::Timestamp::from_second(seconds)
        .ok()
        .map(|ts| json!(ts.to_string()))
}

fn object_meta(m: Option<meta::ObjectMeta>) -> Option<Value> {
    let mut m = m?;
    let owners = std::mem::take(&mut m.owner_references)
        .into_iter()
        .map(|o| {
            Obj::default()
                .opt("apiVersion", o.api_version)
                .opt("kind", o.kind)
                .opt("name", o.name)
                .opt("uid", o.uid)
                .opt("controller", o.controller)
                .opt("blockOwnerDeletion", o.block_owner_deletion)
                .done()
        })
        .collect();
    // managedFields are the server's to set; a client's copy is dropped on every write.
    m.managed_fields.clear();
    Some(
        Obj::default()
            .opt("name", m.name)
            .opt("generateName", m.generate_name)
            .opt("namespace", m.namespace)
            .opt("selfLink", m.self_link)
            .opt("uid", m.uid)
            .opt("resourceVersion", m.resource_version)
            .opt("generation", m.generation.filter(|g| *g != 0))
            .val("creationTimestamp", time(m.creation_timestamp))
            .val("deletionTimestamp", time(m.deletion_timestamp))
            .opt(
                "deletionGracePeriodSeconds",
                m.deletion_grace_period_seconds,
            )
            .map("labels", m.labels)
            .map("annotations", m.annotations)
            .list("ownerReferences", owners)
            .strings("finalizers", m.finalizers)
            .done(),
    )
}

fn namespace(m: &mut core::Namespace) -> Map<String, Value> {
    let spec = m
        .spec
        .take()
        .map(|s| Obj::default().strings("finalizers", s.finalizers).done());
    // Status is the server's (PrepareForCreate sets the phase).
    m.status = None;
    Obj::default()
        .val("metadata", object_meta(m.metadata.take()))
        .val("spec", spec)
        .0
}

fn bytes_map(map: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    map.into_iter().map(|(k, v)| (k, b64.encode(v))).collect()
}

fn config_map(m: &mut core::ConfigMap) -> Map<String, Value> {
    Obj::default()
        .val("metadata", object_meta(m.metadata.take()))
        .opt("immutable", m.immutable.take())
        .map("data", std::mem::take(&mut m.data))
        .map("binaryData", bytes_map(std::mem::take(&mut m.binary_data)))
        .0
}

fn secret(m: &mut core::Secret) -> Map<String, Value> {
    Obj::default()
        .val("metadata", object_meta(m.metadata.take()))
        .opt("immutable", m.immutable.take())
        .map("data", bytes_map(std::mem::take(&mut m.data)))
        .map("stringData", std::mem::take(&mut m.string_data))
        .opt("type", m.r#type.take())
        .0
}

fn delete_options(m: &mut meta::DeleteOptions) -> Map<String, Value> {
    let preconditions = m.preconditions.take().map(|p| {
        Obj::default()
            .opt("uid", p.uid)
            .opt("resourceVersion", p.resource_version)
            .done()
    });
    Obj::default()
        .opt("gracePeriodSeconds", m.grace_period_seconds.take())
        .val("preconditions", preconditions)
        .opt("orphanDependents", m.orphan_dependents.take())
        .opt("propagationPolicy", m.propagation_policy.take())
        .strings("dryRun", std::mem::take(&mut m.dry_run))
        .opt(
            "ignoreStoreReadErrorWithClusterBreakingPotential",
            m.ignore_store_read_error_with_cluster_breaking_potential
                .take(),
        )
        .0
}

fn int_or_string(v: Option<IntOrString>) -> Option<Value> {
    let v = v?;
    match v.r#type {
        Some(1) => v.str_val.map(Value::from),
        _ => v.int_val.map(Value::from),
    }
}

fn label_selector(s: &mut Option<meta::LabelSelector>) -> Option<Value> {
    let s = s.take()?;
    let expressions = s
        .match_expressions
        .into_iter()
        .map(|e| {
            Obj::default()
                .opt("key", e.key)
                .opt("operator", e.operator)
                .strings("values", e.values)
                .done()
        })
        .collect();
    Some(
        Obj::default()
            .map("matchLabels", s.match_labels)
            .list("matchExpressions", expressions)
            .done(),
    )
}

fn deployment(m: &mut apps::Deployment, left: &mut Vec<String>) -> Map<String, Value> {
    let spec = m.spec.as_mut().map(|s| {
        let strategy = s.strategy.take().map(|st| {
            let rolling = st.rolling_update.map(|r| {
                Obj::default()
                    .val("maxUnavailable", int_or_string(r.max_unavailable))
                    .val("maxSurge", int_or_string(r.max_surge))
                    .done()
            });
            Obj::default()
                .opt("type", st.r#type)
                .val("rollingUpdate", rolling)
                .done()
        });
        Obj::default()
            .opt("replicas", s.replicas.take())
            .val("selector", label_selector(&mut s.selector))
            .val(
                "template",
                s.template.as_mut().map(|t| pod_template(t, left)),
            )
            .val("strategy", strategy)
            .opt(
                "minReadySeconds",
                s.min_ready_seconds.take().filter(|n| *n != 0),
            )
            .opt("revisionHistoryLimit", s.revision_history_limit.take())
            .opt("paused", s.paused.take().filter(|p| *p))
            .opt(
                "progressDeadlineSeconds",
                s.progress_deadline_seconds.take(),
            )
            .done()
    });
    m.status = None;
    Obj::default()
        .val("metadata", object_meta(m.metadata.take()))
        .val("spec", spec)
        .0
}

fn pod_template(t: &mut core::PodTemplateSpec, left: &mut Vec<String>) -> Value {
    let spec = t.spec.as_mut().map(|s| {
        let containers = std::mem::take(&mut s.containers)
            .into_iter()
            .map(|c| container(c, left))
            .collect();
        let init = std::mem::take(&mut s.init_containers)
            .into_iter()
            .map(|c| container(c, left))
            .collect();
        Obj::default()
            .list("initContainers", init)
            .list("containers", containers)
            .opt("restartPolicy", s.restart_policy.take())
            .opt(
                "terminationGracePeriodSeconds",
                s.termination_grace_period_seconds.take(),
            )
            .opt("dnsPolicy", s.dns_policy.take())
            .map("nodeSelector", std::mem::take(&mut s.node_selector))
            .opt("serviceAccountName", s.service_account_name.take())
            .opt("nodeName", s.node_name.take())
            .done()
    });
    Obj::default()
        .val("metadata", object_meta(t.metadata.take()))
        .val("spec", spec)
        .done()
}

/// A container; a field outside this list is reported in `left`, so the body is refused.
fn container(mut c: core::Container, left: &mut Vec<String>) -> Value {
    let ports = std::mem::take(&mut c.ports)
        .into_iter()
        .map(|p| {
            Obj::default()
                .opt("name", p.name)
                .opt("hostPort", p.host_port.filter(|p| *p != 0))
                .opt("containerPort", p.container_port)
                .opt("protocol", p.protocol)
                .opt("hostIP", p.host_ip)
                .done()
        })
        .collect();
    let mut env_rest = Vec::new();
    let env = std::mem::take(&mut c.env)
        .into_iter()
        .filter_map(|e| {
            if e.value_from.is_some() {
                env_rest.push(e);
                return None;
            }
            Some(
                Obj::default()
                    .opt("name", e.name)
                    .opt("value", e.value)
                    .done(),
            )
        })
        .collect();
    let quantities = |m: BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>| {
        m.into_iter()
            .filter_map(|(k, q)| q.string.map(|s| (k, s)))
            .collect::<BTreeMap<String, String>>()
    };
    let resources = c.resources.take().map(|mut r| {
        let out = Obj::default()
            .map("limits", quantities(std::mem::take(&mut r.limits)))
            .map("requests", quantities(std::mem::take(&mut r.requests)))
            .done();
        c.resources = Some(r);
        out
    });
    let out = Obj::default()
        .opt("name", c.name.take())
        .opt("image", c.image.take())
        .strings("command", std::mem::take(&mut c.command))
        .strings("args", std::mem::take(&mut c.args))
        .opt("workingDir", c.working_dir.take())
        .list("ports", ports)
        .list("env", env)
        .val("resources", resources)
        .opt("imagePullPolicy", c.image_pull_policy.take())
        .opt("terminationMessagePath", c.termination_message_path.take())
        .opt(
            "terminationMessagePolicy",
            c.termination_message_policy.take(),
        )
        .done();
    c.env = env_rest;
    if !is_zero(&c.encode_to_vec()) {
        left.push(format!("container {:?}", out.get("name")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut out = MAGIC.to_vec();
        out.extend(unknown.encode_to_vec());
        out
    }

    #[test]
    fn secrets_decode_to_the_json_the_server_stores() {
        let secret = core::Secret {
            metadata: Some(meta::ObjectMeta {
                name: Some("sh.helm.release.v1.gd.v1".into()),
                labels: [("owner".to_string(), "helm".to_string())].into(),
                ..Default::default()
            }),
            data: [("release".to_string(), b"H4sI".to_vec())].into(),
            r#type: Some("helm.sh/release.v1".into()),
            ..Default::default()
        };
        let body = envelope("v1", "Secret", secret.encode_to_vec());
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "sh.helm.release.v1.gd.v1", "labels": {"owner": "helm"}},
                   "data": {"release": "SDRzSQ=="}, "type": "helm.sh/release.v1"})
        );
    }

    #[test]
    fn undecoded_fields_and_kinds_are_refused_not_dropped() {
        let mut pod_spec = core::PodSpec::default();
        pod_spec.containers.push(core::Container {
            name: Some("c".into()),
            tty: Some(true),
            ..Default::default()
        });
        let deployment = apps::Deployment {
            spec: Some(apps::DeploymentSpec {
                template: Some(core::PodTemplateSpec {
                    spec: Some(pod_spec),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let body = envelope("apps/v1", "Deployment", deployment.encode_to_vec());
        assert_eq!(decode(&body).unwrap_err().code, 415);
        assert_eq!(
            decode(&envelope("v1", "Pod", Vec::new())).unwrap_err().code,
            415
        );
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
    }
}
