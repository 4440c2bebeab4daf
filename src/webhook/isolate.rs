//! Acting on a decision to isolate: PDB accounting, the relabelling patch and the Event.
//!
//! Order matters and follows the API server's eviction code: first the disruption is
//! recorded in the PDB (`status.disruptedPods` + `disruptionsAllowed - 1` in one
//! resourceVersion-guarded status update, re-read and retried on 409), then the pod is
//! patched with a JSON patch whose `test` ops on `resourceVersion` and `labels` make a
//! concurrent change fail instead of being overwritten. A failed test surfaces as
//! [`Error::Conflict`] so the caller re-reads the pod and decides again.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PatchParams, PostParams};
use serde_json::Value;

use super::cache::{Cache, selector_keys};
use super::decide::{OwnerKind, OwnerPolicy, PodFacts, Snapshot, labels_to_remove};
use crate::labels::{
    DELETE_AT_ANNOTATION, DRAINING_LABEL, FIELD_MANAGER, GRACE_PERIOD_ANNOTATION,
    ORIGINAL_LABELS_ANNOTATION,
};

/// How often a PDB status update is retried after a 409 before giving up. Each retry
/// re-reads the PDB; more than a handful means heavy contention and the caller should
/// rather pass the request through than hold the API server's call.
const PDB_ATTEMPTS: usize = 5;

/// Event reason recorded on a pod when it is isolated.
pub const REASON_ISOLATED: &str = "graceful-drain.io/Isolated";
/// Event reason recorded on a pod when the deferred deleter deletes it.
pub const REASON_DELETED: &str = "graceful-drain.io/Deleted";

/// Errors while isolating a pod.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pod changed under us (a `test` op failed or the resourceVersion moved).
    #[error("isolate pod {pod}: changed concurrently")]
    Conflict { pod: String },
    /// An API call failed.
    #[error("isolate pod {pod}: {action}: {source}")]
    Api {
        pod: String,
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The PDB kept changing under us.
    #[error("isolate pod {pod}: PDB {pdb} kept conflicting after {PDB_ATTEMPTS} attempts")]
    PdbContention { pod: String, pdb: String },
}

/// Result of the PDB accounting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budget {
    /// The disruption was recorded (or the pod was already listed).
    Consumed,
    /// No disruption left.
    Exhausted { pdb: String },
    /// The disruption controller has not observed the PDB's latest generation.
    NotObserved { pdb: String },
}

/// Result of [`isolate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The pod is isolated; the labels removed are returned.
    Isolated { removed: BTreeMap<String, String> },
    /// A PDB refused.
    Refused(Budget),
}

/// What [`isolate`] needs to reach the cluster.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    pub cache: std::sync::Arc<Cache>,
    /// Our identity, for Events (`reportingInstance`).
    pub identity: String,
}

fn is_status(err: &kube::Error, codes: &[u16]) -> bool {
    matches!(err, kube::Error::Api(s) if codes.contains(&s.code))
}

/// Isolates `pod`: PDB accounting, then the relabelling patch, then an Event.
pub async fn isolate(
    ctx: &Context,
    pod: &PodFacts,
    snap: &Snapshot,
    delete_at: Timestamp,
    grace_period: Option<i64>,
    now: Timestamp,
) -> Result<Outcome, Error> {
    let policy = owner_policy(ctx, pod).await?;
    let leave = leave_selectors(snap, policy.leave);
    let removed = labels_to_remove(&pod.labels, &leave, &policy.keep);
    if let [pdb] = snap.pdbs.as_slice() {
        let budget = consume_disruption(ctx, &pod.namespace, &pdb.name, &pod.name, now).await?;
        if budget != Budget::Consumed {
            return Ok(Outcome::Refused(budget));
        }
    }
    let patch = isolation_patch(pod, &removed, delete_at, grace_period);
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &pod.namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match api
        .patch(&pod.name, &params, &kube::api::Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => {}
        // 409: resourceVersion moved; 422: a `test` op failed (how the API server reports it).
        Err(e) if is_status(&e, &[409, 422]) => {
            return Err(Error::Conflict { pod: pod_ref(pod) });
        }
        Err(source) => return Err(api_err(pod, "patch pod", source)),
    }
    let message = format!(
        "Isolated from its Services and controller (removed labels: {}); deletion at {delete_at}",
        removed.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    record_event(ctx, pod, REASON_ISOLATED, &message, now).await;
    Ok(Outcome::Isolated { removed })
}

fn pod_ref(pod: &PodFacts) -> String {
    format!("{}/{}", pod.namespace, pod.name)
}

fn api_err(pod: &PodFacts, action: &str, source: kube::Error) -> Error {
    Error::Api {
        pod: pod_ref(pod),
        action: action.to_string(),
        source,
    }
}

/// The selectors to leave: selecting Services (with a selector), selecting PDBs (so the
/// isolated pod stops counting as healthy) and whatever the owner policy adds.
pub fn leave_selectors(snap: &Snapshot, owner: Vec<BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let mut leave = owner;
    leave.extend(
        snap.services
            .iter()
            .filter(|s| !s.selector.is_empty())
            .map(|s| s.selector.keys().cloned().collect()),
    );
    leave.extend(
        snap.pdbs
            .iter()
            .filter(|p| !p.selector_keys.is_empty())
            .map(|p| p.selector_keys.clone()),
    );
    leave
}

/// Reads the controlling owner's selector and derives the relabelling policy. A missing
/// owner (already deleted) is treated as a bare pod.
async fn owner_policy(ctx: &Context, pod: &PodFacts) -> Result<OwnerPolicy, Error> {
    let Some((kind, name)) = &pod.owner else {
        return Ok(OwnerPolicy::default());
    };
    let gvk = match kind {
        OwnerKind::ReplicaSet => GroupVersionKind::gvk("apps", "v1", "ReplicaSet"),
        OwnerKind::StatefulSet => GroupVersionKind::gvk("apps", "v1", "StatefulSet"),
        OwnerKind::DaemonSet => GroupVersionKind::gvk("apps", "v1", "DaemonSet"),
        OwnerKind::Job => GroupVersionKind::gvk("batch", "v1", "Job"),
        OwnerKind::Other(_) => return Ok(OwnerPolicy::default()),
    };
    let resource = ApiResource::from_gvk(&gvk);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &pod.namespace, &resource);
    let owner = match api.get_opt(name).await {
        Ok(Some(owner)) => owner,
        Ok(None) => return Ok(OwnerPolicy::default()),
        Err(source) => return Err(api_err(pod, &format!("get {} {name}", gvk.kind), source)),
    };
    let keys = owner
        .data
        .pointer("/spec/selector")
        .cloned()
        .and_then(|v| serde_json::from_value::<LabelSelector>(v).ok())
        .map(|s| selector_keys(&s))
        .unwrap_or_default();
    Ok(OwnerPolicy::for_owner(kind, keys))
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// The JSON patch isolating `pod`: tests on resourceVersion and labels, removal of
/// `removed`, the draining label and the annotations the deleter resumes from.
pub fn isolation_patch(
    pod: &PodFacts,
    removed: &BTreeMap<String, String>,
    delete_at: Timestamp,
    grace_period: Option<i64>,
) -> Patch {
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: ptr(&["metadata", "resourceVersion"]),
        value: Value::from(pod.resource_version.clone()),
    })];
    let add = |path: PointerBuf, value: Value| PatchOperation::Add(AddOperation { path, value });
    if pod.labels.is_empty() {
        let labels = serde_json::json!({ DRAINING_LABEL: "true" });
        ops.push(add(ptr(&["metadata", "labels"]), labels));
    } else {
        ops.push(PatchOperation::Test(TestOperation {
            path: ptr(&["metadata", "labels"]),
            value: serde_json::to_value(&pod.labels).unwrap_or(Value::Null),
        }));
        for key in removed.keys() {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: ptr(&["metadata", "labels", key]),
            }));
        }
        ops.push(add(
            ptr(&["metadata", "labels", DRAINING_LABEL]),
            "true".into(),
        ));
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ORIGINAL_LABELS_ANNOTATION,
        serde_json::to_string(removed).unwrap_or_else(|_| "{}".into()),
    );
    annotations.insert(DELETE_AT_ANNOTATION, delete_at.to_string());
    if let Some(grace) = grace_period {
        annotations.insert(GRACE_PERIOD_ANNOTATION, grace.to_string());
    }
    if pod.annotations.is_empty() {
        let value = serde_json::to_value(&annotations).unwrap_or(Value::Null);
        ops.push(add(ptr(&["metadata", "annotations"]), value));
    } else {
        for (key, value) in annotations {
            ops.push(add(ptr(&["metadata", "annotations", key]), value.into()));
        }
    }
    Patch(ops)
}

/// Records the disruption of `pod` in PDB `namespace/name`, serialised by resourceVersion.
pub async fn consume_disruption(
    ctx: &Context,
    namespace: &str,
    name: &str,
    pod: &str,
    now: Timestamp,
) -> Result<Budget, Error> {
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace);
    let pod_name = format!("{namespace}/{pod}");
    let err = |action: &str, source| Error::Api {
        pod: pod_name.clone(),
        action: format!("{action} PDB {namespace}/{name}"),
        source,
    };
    let mut current = match ctx.cache.pdb(namespace, name) {
        Some(pdb) => (*pdb).clone(),
        None => api.get(name).await.map_err(|e| err("get", e))?,
    };
    for _ in 0..PDB_ATTEMPTS {
        let next = match charge(&current, pod, now) {
            Ok(next) => next,
            Err(budget) => return Ok(budget),
        };
        let Some(next) = next else {
            return Ok(Budget::Consumed);
        };
        match api
            .replace_status(name, &PostParams::default(), &next)
            .await
        {
            Ok(updated) => {
                ctx.cache.apply_pdb(&updated);
                return Ok(Budget::Consumed);
            }
            Err(e) if is_status(&e, &[409]) => {
                current = api.get(name).await.map_err(|e| err("get", e))?;
            }
            Err(e) => return Err(err("update status of", e)),
        }
    }
    Err(Error::PdbContention {
        pod: pod_name,
        pdb: format!("{namespace}/{name}"),
    })
}

/// The PDB with `pod` charged as disrupted: `Ok(None)` when already listed, `Err` when
/// the budget refuses. Pure, so the accounting rules are table-tested.
pub fn charge(
    pdb: &PodDisruptionBudget,
    pod: &str,
    now: Timestamp,
) -> Result<Option<PodDisruptionBudget>, Budget> {
    let name = format!(
        "{}/{}",
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
        pdb.metadata.name.as_deref().unwrap_or_default()
    );
    let status = pdb.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(-1) < pdb.metadata.generation.unwrap_or(0) {
        return Err(Budget::NotObserved { pdb: name });
    }
    if status
        .disrupted_pods
        .as_ref()
        .is_some_and(|d| d.contains_key(pod))
    {
        return Ok(None);
    }
    if status.disruptions_allowed <= 0 {
        return Err(Budget::Exhausted { pdb: name });
    }
    let mut next = pdb.clone();
    let mut status = status;
    status.disruptions_allowed -= 1;
    status
        .disrupted_pods
        .get_or_insert_with(BTreeMap::new)
        .insert(pod.to_string(), Time(now));
    next.status = Some(status);
    Ok(Some(next))
}

/// Records a core/v1 Event on `pod`; failures are logged, never fatal.
pub async fn record_event(
    ctx: &Context,
    pod: &PodFacts,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", pod.name)),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some("Normal".into()),
        source: Some(EventSource {
            component: Some("graceful-drain-webhook".into()),
            host: None,
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some("graceful-drain.io/webhook".into()),
        reporting_instance: Some(ctx.identity.clone()),
        ..Event::default()
    };
    let api = Api::<Event>::namespaced(ctx.client.clone(), &pod.namespace);
    if let Err(error) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(pod = %pod_ref(pod), reason, %error, "record event");
    }
}
