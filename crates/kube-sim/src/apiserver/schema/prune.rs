//! Decoding a custom resource: unknown fields pruned (their paths reported) and
//! non-nullable `null`s without a default dropped.

use serde_json::{Map, Value};

/// Fields kube-apiserver keeps at the root of a resource and of an embedded resource
/// whatever the schema says (`metaFields` in pruning/algorithm.go).
const META_FIELDS: &[&str] = &["apiVersion", "kind", "metadata"];

/// The JSON names of `metav1.ObjectMeta`'s fields: any other key under `metadata` is
/// unknown.
const OBJECT_META_FIELDS: &[&str] = &[
    "annotations",
    "creationTimestamp",
    "deletionGracePeriodSeconds",
    "deletionTimestamp",
    "finalizers",
    "generateName",
    "generation",
    "labels",
    "managedFields",
    "name",
    "namespace",
    "ownerReferences",
    "resourceVersion",
    "selfLink",
    "uid",
];

/// Removes from the custom resource `obj` every field its structural `schema` does not
/// declare and returns their paths: unknown `metadata` fields first, then the pruned
/// ones sorted, as `unstructuredSchemaCoercer.apply` collects them (customresource_handler.go).
pub(crate) fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut unknown = prune_metadata(obj);
    let mut pruned = Vec::new();
    if let Value::Object(map) = obj {
        if preserves_unknown(schema) {
            skip_prune_object(map, schema, true, "", &mut pruned);
        } else {
            prune_object(map, Some(schema), true, "", &mut pruned);
        }
    }
    pruned.sort();
    unknown.extend(pruned);
    unknown
}

/// Drops unknown top-level keys of `metadata`, returning `metadata.<key>` for each.
fn prune_metadata(obj: &mut Value) -> Vec<String> {
    let Some(Value::Object(meta)) = obj.get_mut("metadata") else {
        return Vec::new();
    };
    let mut unknown = Vec::new();
    meta.retain(|key, _| {
        let known = OBJECT_META_FIELDS.contains(&key.as_str());
        if !known {
            unknown.push(format!("metadata.{key}"));
        }
        known
    });
    unknown
}

fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

fn embedded(schema: &Value) -> bool {
    schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
}

/// The schema of `key` in an object: its property, else the `additionalProperties`
/// schema; `Some(None)` when `additionalProperties` is present without a schema.
fn member_schema<'a>(schema: &'a Value, key: &str) -> Option<Option<&'a Value>> {
    if let Some(property) = schema.get("properties").and_then(|p| p.get(key)) {
        return Some(Some(property));
    }
    match schema.get("additionalProperties") {
        None | Some(Value::Null) => None,
        Some(extra) => Some(extra.is_object().then_some(extra)),
    }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `prune` of pruning/algorithm.go.
fn prune_value(value: &mut Value, schema: Option<&Value>, path: &str, out: &mut Vec<String>) {
    match (value, schema) {
        (Value::Object(map), Some(s)) if preserves_unknown(s) => {
            skip_prune_object(map, s, embedded(s), path, out);
        }
        (Value::Array(items), Some(s)) if preserves_unknown(s) => {
            for (i, item) in items.iter_mut().enumerate() {
                skip_prune_value(item, s.get("items"), &format!("{path}[{i}]"), out);
            }
        }
        (Value::Object(map), s) => {
            let embedded = s.is_some_and(embedded);
            prune_object(map, s, embedded, path, out);
        }
        (Value::Array(items), s) => {
            for (i, item) in items.iter_mut().enumerate() {
                let items_schema = s.and_then(|s| s.get("items"));
                prune_value(item, items_schema, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn prune_object(
    map: &mut Map<String, Value>,
    schema: Option<&Value>,
    embedded: bool,
    path: &str,
    out: &mut Vec<String>,
) {
    let Some(schema) = schema else {
        out.extend(map.keys().map(|k| child(path, k)));
        map.clear();
        return;
    };
    map.retain(|key, value| {
        if embedded && META_FIELDS.contains(&key.as_str()) {
            return true;
        }
        match member_schema(schema, key) {
            Some(member) => {
                prune_value(value, member, &child(path, key), out);
                true
            }
            None => {
                if !path.is_empty() || !META_FIELDS.contains(&key.as_str()) {
                    out.push(child(path, key));
                }
                false
            }
        }
    });
}

/// `skipPrune`: under `x-kubernetes-preserve-unknown-fields` unknown keys stay, declared
/// ones are pruned by their own schema.
fn skip_prune_value(value: &mut Value, schema: Option<&Value>, path: &str, out: &mut Vec<String>) {
    let Some(schema) = schema else {
        return;
    };
    match value {
        Value::Object(map) => skip_prune_object(map, schema, embedded(schema), path, out),
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                skip_prune_value(item, schema.get("items"), &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn skip_prune_object(
    map: &mut Map<String, Value>,
    schema: &Value,
    embedded: bool,
    path: &str,
    out: &mut Vec<String>,
) {
    for (key, value) in map.iter_mut() {
        if embedded && META_FIELDS.contains(&key.as_str()) {
            continue;
        }
        if let Some(member) = member_schema(schema, key) {
            prune_value(value, member, &child(path, key), out);
        }
    }
}

/// Removes `null`s whose schema is neither `nullable` nor defaulted (those get their
/// default later), like `PruneNonNullableNullsWithoutDefaults` in
/// schema/defaulting/prunenulls.go; `null` list items stay.
pub(crate) fn drop_nulls(schema: Option<&Value>, value: &mut Value) {
    match value {
        Value::Object(map) => map.retain(|key, member| {
            let member_schema = schema.and_then(|s| member_schema(s, key)).flatten();
            if member.is_null() && member_schema.is_some_and(drops_null) {
                return false;
            }
            drop_nulls(member_schema, member);
            true
        }),
        Value::Array(items) => {
            let items_schema = schema.and_then(|s| s.get("items"));
            items
                .iter_mut()
                .for_each(|item| drop_nulls(items_schema, item));
        }
        _ => {}
    }
}

fn drops_null(schema: &Value) -> bool {
    let nullable = schema.get("nullable") == Some(&Value::Bool(true));
    let defaulted = schema.get("default").is_some_and(|d| !d.is_null());
    !nullable && !defaulted
}
