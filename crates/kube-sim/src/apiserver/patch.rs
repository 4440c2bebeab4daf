//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902, `test` ops
//! included), and enough of strategic merge patch for what kubectl and controllers send:
//! maps merge, `null` deletes, lists of objects merge by their key (`name` for
//! containers, `type` for conditions, ...), `$patch: delete|replace`,
//! `$deleteFromPrimitiveList/…`, and other `$` directives are ignored.

use serde_json::{Map, Value};

use super::status::ApiError;

/// The patch flavours the server understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Json,
    Merge,
    Strategic,
}

impl PatchKind {
    /// Maps a request Content-Type to a patch kind; `None` for unsupported ones
    /// (server-side apply included), which the caller answers with 415.
    pub(crate) fn from_content_type(ct: &str) -> Option<Self> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            _ => None,
        }
    }
}

/// Applies `patch` to a copy of `target`.
pub(crate) fn apply(kind: PatchKind, target: &Value, patch: &Value) -> Result<Value, ApiError> {
    let mut doc = target.clone();
    match kind {
        PatchKind::Merge => json_patch::merge(&mut doc, patch),
        PatchKind::Strategic => {
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "strategic merge patch must be an object",
                ));
            }
            strategic_merge(&mut doc, patch);
        }
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut doc, &ops.0).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
        }
    }
    Ok(doc)
}

/// The key by which list items merge, if the list is merged rather than replaced.
pub(crate) fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    let has = |k: &str| items.iter().any(|i| i.get(k).is_some());
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "readinessGates"
        | "webhooks"
            if has("name") || items.is_empty() =>
        {
            Some(if field == "readinessGates" {
                "conditionType"
            } else {
                "name"
            })
        }
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "volumeMounts" => Some("mountPath"),
        "hostAliases" => Some("ip"),
        "ports" if has("containerPort") => Some("containerPort"),
        "ports" => Some("port"),
        _ => None,
    }
}

/// Primitive lists with patch strategy `merge` (union instead of replace).
pub(crate) fn merges_primitives(field: &str) -> bool {
    field == "finalizers"
}

fn strategic_merge(target: &mut Value, patch: &Value) {
    let Some(patch_map) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replacement = patch_map.clone();
        replacement.remove("$patch");
        *target = Value::Object(replacement);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(target_map) = target.as_object_mut() else {
        return;
    };
    for (key, value) in patch_map {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) =
                (target_map.get_mut(field), value.as_array())
            {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        match value {
            Value::Null => {
                target_map.remove(key);
            }
            Value::Object(inner) => {
                if inner.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target_map.remove(key);
                } else {
                    strategic_merge(target_map.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
            Value::Array(items) => {
                let current = target_map.remove(key);
                target_map.insert(key.clone(), merge_list(key, current, items));
            }
            other => {
                target_map.insert(key.clone(), other.clone());
            }
        }
    }
}

fn merge_list(field: &str, current: Option<Value>, patch: &[Value]) -> Value {
    let mut current = match current {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Value::Array(
            patch
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .cloned()
                .collect(),
        );
    }
    if merges_primitives(field) {
        for item in patch {
            if !current.contains(item) {
                current.push(item.clone());
            }
        }
        return Value::Array(current);
    }
    let all_objects = patch.iter().all(Value::is_object);
    let Some(key) = merge_key(field, patch).filter(|_| all_objects) else {
        return Value::Array(patch.to_vec());
    };
    for item in patch {
        let id = item.get(key).cloned();
        let position = current.iter().position(|c| c.get(key) == id.as_ref());
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                current.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut current[i], item),
            (None, false) => {
                let mut fresh = Value::Object(Map::new());
                strategic_merge(&mut fresh, item);
                current.push(fresh);
            }
        }
    }
    Value::Array(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_keeps_webhooks_it_does_not_name_and_merges_by_name() {
        let config = json!({"webhooks": [
            {"name": "a.example.com", "clientConfig": {"caBundle": "old"}, "timeoutSeconds": 10},
            {"name": "b.example.com", "timeoutSeconds": 5}]});
        let patch =
            json!({"webhooks": [{"name": "a.example.com", "clientConfig": {"caBundle": "new"}}]});
        let out = apply(PatchKind::Strategic, &config, &patch).unwrap();
        assert_eq!(
            out["webhooks"],
            json!([{"name": "a.example.com", "clientConfig": {"caBundle": "new"}, "timeoutSeconds": 10},
                   {"name": "b.example.com", "timeoutSeconds": 5}])
        );
    }

    #[test]
    fn strategic_merges_containers_and_conditions_by_key() {
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
                         "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                         "metadata": {"finalizers": ["f1"], "labels": {"keep": "1", "drop": "1"}}});
        let patch = json!({"spec": {"containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}],
                                    "$setElementOrder/containers": [{"name": "a"}]},
                           "status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}]},
                           "metadata": {"finalizers": ["f2"], "labels": {"drop": null}}});
        let out = apply(PatchKind::Strategic, &pod, &patch).unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "a", "image": "x"}, {"name": "b", "image": "z"}, {"name": "c", "image": "w"}])
        );
        assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(out["metadata"]["finalizers"], json!(["f1", "f2"]));
        assert_eq!(out["metadata"]["labels"], json!({"keep": "1"}));
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn strategic_patch_directives_delete_items() {
        let obj = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}, "metadata": {"finalizers": ["x", "y"]}});
        let patch = json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]},
                           "metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}});
        let out = apply(PatchKind::Strategic, &obj, &patch).unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b"}]));
        assert_eq!(out["metadata"]["finalizers"], json!(["y"]));
    }

    #[test]
    fn json_patch_test_op_failure_is_rejected() {
        let obj = json!({"metadata": {"labels": {"a": "1"}}});
        let ok = json!([{"op": "test", "path": "/metadata/labels/a", "value": "1"},
                        {"op": "remove", "path": "/metadata/labels/a"}]);
        assert_eq!(
            apply(PatchKind::Json, &obj, &ok).unwrap()["metadata"]["labels"],
            json!({})
        );
        let bad = json!([{"op": "test", "path": "/metadata/labels/a", "value": "2"}]);
        assert_eq!(apply(PatchKind::Json, &obj, &bad).unwrap_err().code, 422);
    }

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let obj = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}, "x": 1});
        let out = apply(
            PatchKind::Merge,
            &obj,
            &json!({"spec": {"containers": [{"name": "c"}]}, "x": null}),
        )
        .unwrap();
        assert_eq!(out, json!({"spec": {"containers": [{"name": "c"}]}}));
    }
}
