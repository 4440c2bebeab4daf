//! Field ownership, `metadata.managedFields`: the fields an object sets and their
//! `fieldsV1` encoding, each manager's entry, and the `Update` entry every write that is
//! not an apply records.
//!
//! Modelled on upstream's field manager
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager`, the
//! `k8s.io/apimachinery/pkg/util/managedfields/internal` package it wraps, and
//! structured-merge-diff). Non-apply writes record an `Update` entry for the fields they
//! changed and take those fields from other managers, which is what later makes an apply
//! conflict with `kubectl scale` or `kubectl edit`. `write` records every create and
//! update here; `apply` reads and replaces the entries for server-side apply.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::meta::now;
use super::patch;
use super::request::{Req, Target};
use super::resources::ResourceDef;

/// Content type of an apply request.
pub(crate) const APPLY_YAML: &str = "application/apply-patch+yaml";

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Seg {
    /// A map field (`f:name`).
    Field(String),
    /// A list item identified by its key fields (`k:{"name":"c"}`), kept as JSON text.
    Key(String),
    /// A member of a set list (`v:"x"`), kept as JSON text.
    Value(String),
}

pub(super) type FieldPath = Vec<Seg>;
type FieldSet = BTreeSet<FieldPath>;

impl Seg {
    fn encode(&self) -> String {
        match self {
            Seg::Field(name) => format!("f:{name}"),
            Seg::Key(key) => format!("k:{key}"),
            Seg::Value(value) => format!("v:{value}"),
        }
    }

    fn decode(text: &str) -> Option<Seg> {
        let (kind, rest) = text.split_at_checked(2)?;
        match kind {
            "f:" => Some(Seg::Field(rest.to_string())),
            "k:" => Some(Seg::Key(rest.to_string())),
            "v:" => Some(Seg::Value(rest.to_string())),
            _ => None,
        }
    }
}

/// A path the way structured-merge-diff prints it: `.spec.containers[name="c"].image`.
pub(super) fn display(path: &FieldPath) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Field(name) => {
                out.push('.');
                out.push_str(name);
            }
            Seg::Key(key) => {
                let pairs: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
                let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("[{}]", inner.join(",")));
            }
            Seg::Value(value) => out.push_str(&format!("[={value}]")),
        }
    }
    out
}

/// Metadata fields the server owns; they are never part of a manager's set.
const SERVER_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// The leaf fields (and list items) an object sets.
pub(super) fn fields_of(def: &ResourceDef, obj: &Value) -> FieldSet {
    let mut set = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return set;
    };
    for (key, value) in map {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "status" if def.has_status() => {}
            "metadata" => {
                if let Some(meta) = value.as_object() {
                    for (k, v) in meta
                        .iter()
                        .filter(|(k, _)| !SERVER_META.contains(&k.as_str()))
                    {
                        walk(k, v, vec![Seg::Field(key.clone())], &mut set);
                    }
                }
            }
            _ => walk(key, value, Vec::new(), &mut set),
        }
    }
    set
}

fn walk(field: &str, value: &Value, mut path: FieldPath, set: &mut FieldSet) {
    path.push(Seg::Field(field.to_string()));
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                walk(k, v, path.clone(), set);
            }
        }
        Value::Array(items) if patch::merges_primitives(field) => {
            for item in items {
                let mut p = path.clone();
                p.push(Seg::Value(item.to_string()));
                set.insert(p);
            }
        }
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            let Some(key) = patch::merge_key(field, items) else {
                set.insert(path);
                return;
            };
            for item in items {
                let id = json!({key: item.get(key).cloned().unwrap_or(Value::Null)});
                let mut p = path.clone();
                p.push(Seg::Key(id.to_string()));
                set.insert(p.clone());
                if let Some(fields) = item.as_object() {
                    for (k, v) in fields {
                        walk(k, v, p.clone(), set);
                    }
                }
            }
        }
        _ => {
            set.insert(path);
        }
    }
}

/// The value at `path`, if present.
pub(super) fn get_at<'a>(obj: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    let mut current = obj;
    for seg in path {
        current = match seg {
            Seg::Field(name) => current.get(name)?,
            Seg::Key(key) => {
                let id: Map<String, Value> = serde_json::from_str(key).ok()?;
                current
                    .as_array()?
                    .iter()
                    .find(|item| id.iter().all(|(k, v)| item.get(k) == Some(v)))?
            }
            Seg::Value(value) => {
                let wanted: Value = serde_json::from_str(value).ok()?;
                current.as_array()?.iter().find(|item| **item == wanted)?
            }
        };
    }
    Some(current)
}

/// Removes the value at `path` (nothing when absent).
pub(super) fn remove_at(obj: &mut Value, path: &[Seg]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut current = obj;
    for seg in parents {
        let next = match seg {
            Seg::Field(name) => current.get_mut(name),
            Seg::Key(_) | Seg::Value(_) => {
                let position = position_in(current, seg);
                match (current.as_array_mut(), position) {
                    (Some(items), Some(i)) => items.get_mut(i),
                    _ => None,
                }
            }
        };
        let Some(next) = next else {
            return;
        };
        current = next;
    }
    match last {
        Seg::Field(name) => {
            if let Some(map) = current.as_object_mut() {
                map.remove(name);
            }
        }
        Seg::Key(_) | Seg::Value(_) => {
            let position = position_in(current, last);
            if let (Some(items), Some(i)) = (current.as_array_mut(), position) {
                items.remove(i);
            }
        }
    }
}

fn position_in(list: &Value, seg: &Seg) -> Option<usize> {
    let items = list.as_array()?;
    match seg {
        Seg::Key(key) => {
            let id: Map<String, Value> = serde_json::from_str(key).ok()?;
            items
                .iter()
                .position(|item| id.iter().all(|(k, v)| item.get(k) == Some(v)))
        }
        Seg::Value(value) => {
            let wanted: Value = serde_json::from_str(value).ok()?;
            items.iter().position(|item| *item == wanted)
        }
        Seg::Field(_) => None,
    }
}

/// A `fieldsV1` tree of a set (`{"f:spec":{"f:replicas":{}}}`, list items with `.`).
fn to_tree(set: &FieldSet) -> Value {
    fn insert(node: &mut Map<String, Value>, path: &[Seg]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let child = node
            .entry(first.encode())
            .or_insert_with(|| Value::Object(Map::new()));
        if !child.is_object() {
            *child = Value::Object(Map::new());
        }
        if let Some(map) = child.as_object_mut() {
            if rest.is_empty() && matches!(first, Seg::Key(_)) {
                map.insert(".".into(), json!({}));
            }
            insert(map, rest);
        }
    }
    let mut root = Map::new();
    for path in set {
        insert(&mut root, path);
    }
    Value::Object(root)
}

/// The set a `fieldsV1` tree describes.
fn from_tree(tree: &Value) -> FieldSet {
    fn go(node: &Map<String, Value>, path: &mut FieldPath, out: &mut FieldSet) {
        let children: Vec<(&String, &Value)> = node.iter().filter(|(k, _)| *k != ".").collect();
        if (children.is_empty() || node.contains_key(".")) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (key, child) in children {
            let (Some(seg), Some(map)) = (Seg::decode(key), child.as_object()) else {
                continue;
            };
            path.push(seg);
            go(map, path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Some(map) = tree.as_object() {
        go(map, &mut Vec::new(), &mut out);
    }
    out
}

/// One `managedFields` entry.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) manager: String,
    pub(super) apply: bool,
    pub(super) api_version: String,
    pub(super) subresource: String,
    pub(super) fields: FieldSet,
}

impl Entry {
    pub(super) fn to_json(&self) -> Value {
        let mut v = json!({
            "manager": self.manager,
            "operation": if self.apply { "Apply" } else { "Update" },
            "apiVersion": self.api_version,
            "time": now(),
            "fieldsType": "FieldsV1",
            "fieldsV1": to_tree(&self.fields),
        });
        if !self.subresource.is_empty() {
            v["subresource"] = json!(self.subresource);
        }
        v
    }

    /// How upstream's `printManager` names a manager in conflict messages.
    pub(super) fn printed(&self) -> String {
        let mut name = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            name = format!("{name} with subresource {:?}", self.subresource);
        }
        if self.apply {
            name
        } else {
            format!("{name} using {}", self.api_version)
        }
    }
}

pub(super) fn entries_of(obj: &Value) -> Vec<Entry> {
    let list = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            Entry {
                manager: s("manager"),
                apply: s("operation") == "Apply",
                api_version: s("apiVersion"),
                subresource: s("subresource"),
                fields: from_tree(e.get("fieldsV1").unwrap_or(&Value::Null)),
            }
        })
        .collect()
}

pub(super) fn set_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(Entry::to_json)
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// The manager of a non-apply write: `fieldManager`, else the User-Agent's program
/// name like upstream's `prefixFromUserAgent`.
fn update_manager(req: &Req) -> String {
    if let Some(manager) = req.param("fieldManager") {
        return manager.to_string();
    }
    let agent = req.user_agent.split('/').next().unwrap_or("").trim();
    if agent.is_empty() {
        "unknown".into()
    } else {
        agent.chars().take(128).collect()
    }
}

/// Records a non-apply write in `new`'s managedFields: the manager's Update entry gains
/// the fields whose value changed, and other managers lose them.
pub(crate) fn record_update(target: &Target, req: &Req, old: Option<&Value>, new: &mut Value) {
    let def = &target.def;
    let subresource = target.sub.clone().unwrap_or_default();
    let mut entries = old.map(entries_of).unwrap_or_default();
    let changed: FieldSet = {
        let mut all = fields_of(def, new);
        if subresource == "status" {
            all = walk_status(new);
        }
        all.into_iter()
            .filter(|p| old.and_then(|o| get_at(o, p)) != get_at(new, p))
            .collect()
    };
    if changed.is_empty() {
        set_entries(new, &entries);
        return;
    }
    let manager = update_manager(req);
    for entry in &mut entries {
        entry.fields.retain(|p| !changed.contains(p));
    }
    let position = entries
        .iter()
        .position(|e| !e.apply && e.manager == manager && e.subresource == subresource);
    match position {
        Some(i) => entries[i].fields.extend(changed),
        None => entries.push(Entry {
            manager,
            apply: false,
            api_version: def.api_version(),
            subresource,
            fields: changed,
        }),
    }
    set_entries(new, &entries);
}

fn walk_status(obj: &Value) -> FieldSet {
    let mut set = FieldSet::new();
    if let Some(status) = obj.get("status") {
        walk("status", status, Vec::new(), &mut set);
    }
    set
}

#[cfg(test)]
pub(in crate::apiserver) mod tests {
    use super::*;

    /// The Deployment resource as the registry serves it (the apply tests use it too).
    pub(in crate::apiserver) fn deployment_def() -> ResourceDef {
        super::super::resources::Registry::default()
            .find("apps", "v1", "deployments")
            .map(|d| (*d).clone())
            .unwrap()
    }

    #[test]
    fn field_sets_round_trip_through_fields_v1() {
        let def = deployment_def();
        let obj = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}, "finalizers": ["x"]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let set = fields_of(&def, &obj);
        let tree = to_tree(&set);
        assert_eq!(
            tree["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"],
            json!({".": {}, "f:image": {}, "f:name": {}})
        );
        assert_eq!(tree["f:metadata"]["f:finalizers"], json!({"v:\"x\"": {}}));
        assert!(tree["f:metadata"].get("f:name").is_none());
        assert_eq!(from_tree(&tree), set);
        let image: FieldPath = ["spec", "template", "spec", "containers"]
            .iter()
            .map(|f| Seg::Field(f.to_string()))
            .chain([
                Seg::Key("{\"name\":\"c\"}".into()),
                Seg::Field("image".into()),
            ])
            .collect();
        assert_eq!(get_at(&obj, &image), Some(&json!("i")));
        assert_eq!(
            display(&image),
            ".spec.template.spec.containers[name=\"c\"].image"
        );
        let mut copy = obj.clone();
        remove_at(&mut copy, &image);
        assert_eq!(
            copy["spec"]["template"]["spec"]["containers"],
            json!([{"name": "c"}])
        );
    }
}
