//! The relabelling patch: which labels an isolated pod loses, the annotations that
//! record its isolation, and the hand-over of a ReplicaSet pod to its Deployment.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use json_patch::jsonptr::PointerBuf;
use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation,
};
use serde_json::Value;

use crate::decide::{PodFacts, ServiceType, Snapshot};
use graceful_drain_core::labels::{
    DELETE_AT_ANNOTATION, DO_NOT_DISRUPT_OWNED_ANNOTATION, DRAINING_LABEL, GRACE_PERIOD_ANNOTATION,
    KARPENTER_DO_NOT_DISRUPT_ANNOTATION, ORIGINAL_LABELS_ANNOTATION, RELEASED_AT_ANNOTATION,
    RESTORE_AT_ANNOTATION,
};

/// JSON-patch ops handing the controller role of an isolated ReplicaSet pod to the
/// ReplicaSet's own controller (the Deployment): the ReplicaSet then ignores the pod
/// instead of releasing it, `kubectl drain` still sees a pod with a controller, and the
/// garbage collector still deletes it with the Deployment. The ReplicaSet stays an owner,
/// without the controller flag.
pub fn controller_handover(pod: &PodFacts, controller: Value) -> Vec<PatchOperation> {
    let mut refs: Vec<Value> = pod
        .owner_refs
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                r["controller"] = Value::Bool(false);
                if let Some(map) = r.as_object_mut() {
                    map.remove("blockOwnerDeletion");
                }
            }
            r
        })
        .collect();
    refs.push(controller);
    vec![
        PatchOperation::Test(TestOperation {
            path: ptr(&["metadata", "ownerReferences"]),
            value: Value::Array(pod.owner_refs.clone()),
        }),
        PatchOperation::Replace(ReplaceOperation {
            path: ptr(&["metadata", "ownerReferences"]),
            value: Value::Array(refs),
        }),
    ]
}

/// The selectors to leave: selecting Services (with a selector; not headless ones, which
/// balance nothing — a StatefulSet's governing Service keeps its pods' DNS names while they
/// serve, and its selector is usually the StatefulSet's own, which the pod must keep),
/// selecting PDBs (so the isolated pod stops counting as healthy) and whatever the owner
/// policy adds.
pub fn leave_selectors(snap: &Snapshot, owner: Vec<BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let mut leave = owner;
    leave.extend(
        snap.services
            .iter()
            .filter(|s| !s.selector.is_empty() && s.service_type != ServiceType::Headless)
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

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// Label keys naming the application, in order of preference; the first one the pod
/// carries gives the draining label its value.
pub const IDENTITY_LABELS: [&str; 3] = ["app.kubernetes.io/name", "app", "k8s-app"];

/// The value of the draining label: the application's name from the first identity label
/// the pod carries (so `kubectl get pods -L graceful-drain.io/draining` and selectors like
/// `graceful-drain.io/draining=web` still tell whose pod it is after its `app` label was
/// removed), else `true`.
pub fn draining_value(labels: &BTreeMap<String, String>) -> String {
    IDENTITY_LABELS
        .iter()
        .find_map(|key| labels.get(*key))
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| "true".to_string())
}

/// The JSON patch isolating `pod`: tests on resourceVersion and labels, removal of
/// `removed`, the draining label and the annotations the deleter resumes from.
pub fn isolation_patch(
    pod: &PodFacts,
    removed: &BTreeMap<String, String>,
    delete_at: Timestamp,
    grace_period: Option<i64>,
    restore_at: Option<Timestamp>,
) -> Patch {
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: ptr(&["metadata", "resourceVersion"]),
        value: Value::from(pod.resource_version.clone()),
    })];
    let add = |path: PointerBuf, value: Value| PatchOperation::Add(AddOperation { path, value });
    let draining = draining_value(&pod.labels);
    if pod.labels.is_empty() {
        let labels = serde_json::json!({ DRAINING_LABEL: draining });
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
            draining.into(),
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
    if let Some(at) = restore_at {
        annotations.insert(RESTORE_AT_ANNOTATION, at.to_string());
    }
    if !pod
        .annotations
        .contains_key(KARPENTER_DO_NOT_DISRUPT_ANNOTATION)
    {
        annotations.insert(KARPENTER_DO_NOT_DISRUPT_ANNOTATION, "true".into());
        annotations.insert(DO_NOT_DISRUPT_OWNED_ANNOTATION, "true".into());
    }
    // A release recorded before this isolation (by an earlier one, or written by anyone
    // who may annotate the pod) must not end this one's delay.
    if pod.annotations.contains_key(RELEASED_AT_ANNOTATION) {
        ops.push(PatchOperation::Remove(RemoveOperation {
            path: ptr(&["metadata", "annotations", RELEASED_AT_ANNOTATION]),
        }));
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::isolate::tests::{now, pod};

    #[test]
    fn patch_for_a_pod_without_labels_or_annotations_creates_both_maps() {
        let mut bare = pod();
        bare.labels.clear();
        bare.annotations.clear();
        let patch =
            serde_json::to_value(isolation_patch(&bare, &BTreeMap::new(), now(), None, None))
                .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                {"op": "add", "path": "/metadata/labels", "value": {DRAINING_LABEL: "true"}},
                {"op": "add", "path": "/metadata/annotations", "value": {
                    DELETE_AT_ANNOTATION: "2026-01-01T00:00:00Z",
                    DO_NOT_DISRUPT_OWNED_ANNOTATION: "true",
                    KARPENTER_DO_NOT_DISRUPT_ANNOTATION: "true",
                    ORIGINAL_LABELS_ANNOTATION: "{}"}},
            ])
        );
    }

    #[test]
    fn a_pod_the_user_marked_do_not_disrupt_keeps_the_user_s_value() {
        let mut marked = pod();
        marked
            .annotations
            .insert(KARPENTER_DO_NOT_DISRUPT_ANNOTATION.into(), "10m".into());
        let patch = serde_json::to_value(isolation_patch(
            &marked,
            &BTreeMap::new(),
            now(),
            None,
            None,
        ))
        .unwrap();
        let text = patch.to_string();
        assert!(!text.contains(DO_NOT_DISRUPT_OWNED_ANNOTATION), "{text}");
        assert!(!text.contains("karpenter.sh~1do-not-disrupt"), "{text}");
    }
}
