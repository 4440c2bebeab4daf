//! Undoing an isolation that no authenticated request followed.
//!
//! An eviction review isolates the pod and asks the caller to come back once it is due
//! (429); a DELETE review is held and then allowed. Either way the API server, acting for
//! a caller it authenticated, removes the pod. When nothing does by the pod's
//! `graceful-drain.io/restore-at` time — the review was forged or replayed, the caller
//! gave up, another admission webhook refused the request — the pod is put back exactly as
//! it was: its removed labels return, the draining label and our annotations go, and a
//! controller role handed to the Deployment goes back to the ReplicaSet. The pod rejoins
//! its Services, its PodDisruptionBudget and its ReplicaSet (which may then scale one pod
//! down through the ordinary path).

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use graceful_drain_core::labels::{
    DELETE_AT_ANNOTATION, DO_NOT_DISRUPT_OWNED_ANNOTATION, DRAINING_LABEL, GRACE_PERIOD_ANNOTATION,
    KARPENTER_DO_NOT_DISRUPT_ANNOTATION, ORIGINAL_LABELS_ANNOTATION, RELEASED_AT_ANNOTATION,
    RESTORE_AT_ANNOTATION,
};

/// Why a pod cannot be restored from its metadata.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The pod carries no resourceVersion (not read from the API server).
    #[error("pod {0} has no resourceVersion")]
    NoResourceVersion(String),
    /// The original-labels annotation is missing or not a JSON map of strings.
    #[error("pod {0}: annotation {ORIGINAL_LABELS_ANNOTATION} is missing or not a label map")]
    OriginalLabels(String),
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// The JSON patch putting an isolated pod back: guarded by its resourceVersion (a pod that
/// changed meanwhile is read again by the watch and restored on the next attempt).
pub fn restore_patch(meta: &ObjectMeta) -> Result<Patch, Error> {
    let name = format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    );
    let version = meta
        .resource_version
        .clone()
        .ok_or_else(|| Error::NoResourceVersion(name.clone()))?;
    let annotations = meta.annotations.clone().unwrap_or_default();
    let original: BTreeMap<String, String> = annotations
        .get(ORIGINAL_LABELS_ANNOTATION)
        .and_then(|a| serde_json::from_str(a).ok())
        .ok_or_else(|| Error::OriginalLabels(name.clone()))?;
    let labels = meta.labels.clone().unwrap_or_default();
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: ptr(&["metadata", "resourceVersion"]),
        value: Value::from(version),
    })];
    if labels.contains_key(DRAINING_LABEL) {
        ops.push(PatchOperation::Remove(RemoveOperation {
            path: ptr(&["metadata", "labels", DRAINING_LABEL]),
        }));
    }
    for (key, value) in &original {
        ops.push(PatchOperation::Add(AddOperation {
            path: ptr(&["metadata", "labels", key]),
            value: Value::from(value.clone()),
        }));
    }
    let ours = annotations.contains_key(DO_NOT_DISRUPT_OWNED_ANNOTATION);
    for key in [
        ORIGINAL_LABELS_ANNOTATION,
        DELETE_AT_ANNOTATION,
        GRACE_PERIOD_ANNOTATION,
        RESTORE_AT_ANNOTATION,
        RELEASED_AT_ANNOTATION,
        DO_NOT_DISRUPT_OWNED_ANNOTATION,
    ]
    .into_iter()
    // Karpenter's annotation goes only if isolation added it.
    .chain(ours.then_some(KARPENTER_DO_NOT_DISRUPT_ANNOTATION))
    {
        if annotations.contains_key(key) {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: ptr(&["metadata", "annotations", key]),
            }));
        }
    }
    if let Some(refs) = controller_given_back(meta) {
        let current = serde_json::to_value(meta.owner_references.clone().unwrap_or_default())
            .unwrap_or(Value::Null);
        ops.push(PatchOperation::Test(TestOperation {
            path: ptr(&["metadata", "ownerReferences"]),
            value: current,
        }));
        ops.push(PatchOperation::Replace(ReplaceOperation {
            path: ptr(&["metadata", "ownerReferences"]),
            value: refs,
        }));
    }
    Ok(Patch(ops))
}

/// The owner references with the controller role back on the ReplicaSet, when isolation
/// handed it to the ReplicaSet's own controller: the last reference is the added
/// controller and a ReplicaSet reference without the flag precedes it.
fn controller_given_back(meta: &ObjectMeta) -> Option<Value> {
    let refs = meta.owner_references.as_ref()?;
    let (added, before) = refs.split_last()?;
    if added.controller != Some(true) {
        return None;
    }
    let rs = before
        .iter()
        .position(|r| r.kind == "ReplicaSet" && r.controller != Some(true))?;
    let mut back = before.to_vec();
    back[rs].controller = Some(true);
    back[rs].block_owner_deletion = Some(true);
    serde_json::to_value(back).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn isolated(handover: bool) -> ObjectMeta {
        let mut refs = vec![json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "web-abc", "uid": "rs-1", "controller": !handover})];
        if handover {
            refs.push(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                "uid": "d-1", "controller": true}),
            );
        } else {
            refs[0]["blockOwnerDeletion"] = json!(true);
        }
        serde_json::from_value(json!({
            "name": "web-1", "namespace": "shop", "resourceVersion": "77",
            "labels": {DRAINING_LABEL: "web", "team": "a"},
            "annotations": {
                ORIGINAL_LABELS_ANNOTATION: "{\"app\":\"web\",\"pod-template-hash\":\"abc\"}",
                DELETE_AT_ANNOTATION: "2026-01-01T00:01:00Z",
                RESTORE_AT_ANNOTATION: "2026-01-01T00:02:00Z",
                "owner-note": "kept"},
            "ownerReferences": refs,
        }))
        .unwrap()
    }

    /// Applies `patch` to the pod's metadata as the API server would.
    fn applied(meta: &ObjectMeta, patch: &Patch) -> Value {
        let mut pod = json!({"metadata": serde_json::to_value(meta).unwrap()});
        json_patch::patch(&mut pod, patch).unwrap();
        pod["metadata"].clone()
    }

    #[test]
    fn a_restored_pod_gets_its_labels_and_controller_back_and_loses_our_marks() {
        let meta = isolated(true);
        let back = applied(&meta, &restore_patch(&meta).unwrap());
        assert_eq!(
            back["labels"],
            json!({"app": "web", "pod-template-hash": "abc", "team": "a"})
        );
        assert_eq!(back["annotations"], json!({"owner-note": "kept"}));
        assert_eq!(
            back["ownerReferences"],
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                    "uid": "rs-1", "controller": true, "blockOwnerDeletion": true}])
        );
    }

    #[test]
    fn karpenter_s_do_not_disrupt_goes_only_when_isolation_added_it() {
        let mut ours = isolated(false);
        let annotations = ours.annotations.get_or_insert_with(Default::default);
        annotations.insert(KARPENTER_DO_NOT_DISRUPT_ANNOTATION.into(), "true".into());
        annotations.insert(DO_NOT_DISRUPT_OWNED_ANNOTATION.into(), "true".into());
        let back = applied(&ours, &restore_patch(&ours).unwrap());
        assert_eq!(back["annotations"], json!({"owner-note": "kept"}));

        let mut users = isolated(false);
        let annotations = users.annotations.get_or_insert_with(Default::default);
        annotations.insert(KARPENTER_DO_NOT_DISRUPT_ANNOTATION.into(), "true".into());
        let back = applied(&users, &restore_patch(&users).unwrap());
        assert_eq!(
            back["annotations"],
            json!({"owner-note": "kept", KARPENTER_DO_NOT_DISRUPT_ANNOTATION: "true"})
        );
    }

    #[test]
    fn owner_references_without_a_handover_are_left_alone() {
        let meta = isolated(false);
        let patch = restore_patch(&meta).unwrap();
        let back = applied(&meta, &patch);
        assert_eq!(
            back["ownerReferences"],
            serde_json::to_value(&meta.owner_references).unwrap()
        );
        assert!(
            !serde_json::to_string(&patch)
                .unwrap()
                .contains("ownerReferences")
        );
    }

    #[test]
    fn a_changed_pod_fails_the_patch_instead_of_being_overwritten() {
        let meta = isolated(true);
        let patch = restore_patch(&meta).unwrap();
        let mut moved = json!({"metadata": serde_json::to_value(&meta).unwrap()});
        moved["metadata"]["resourceVersion"] = json!("78");
        assert!(json_patch::patch(&mut moved, &patch).is_err());
    }

    #[test]
    fn a_pod_without_original_labels_is_named_in_the_error() {
        let mut meta = isolated(true);
        meta.annotations
            .as_mut()
            .unwrap()
            .remove(ORIGINAL_LABELS_ANNOTATION);
        assert_eq!(
            restore_patch(&meta),
            Err(Error::OriginalLabels("shop/web-1".into()))
        );
    }
}
