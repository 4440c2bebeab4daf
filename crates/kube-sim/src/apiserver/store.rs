//! Object storage: one table per resource, a single resourceVersion counter, and a
//! bounded per-table event history from which watches resume.
//!
//! Every mutation happens under one lock, assigns the next resourceVersion, records a
//! watch event in the table's history and broadcasts it. Callers compare-and-swap on
//! resourceVersion to get optimistic concurrency.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::broadcast;

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub table: String,
    pub kind: EventType,
    pub object: Value,
    /// The object before a modification (selectors that stop matching become DELETED).
    pub old: Option<Value>,
}

/// Why a storage operation failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StoreError {
    NotFound,
    AlreadyExists,
    /// The stored resourceVersion differs from the expected one.
    Conflict,
}

#[derive(Default)]
struct Table {
    objects: BTreeMap<String, Value>,
    /// Whether this is the pod table, whose objects `by_node` indexes.
    indexed: bool,
    /// Pods' keys by `spec.nodeName` (empty for other tables). kube-apiserver's watch
    /// cache keeps the same index for pods (pkg/registry/core/pod/strategy.go, `Indexers`:
    /// `storage.FieldIndex("spec.nodeName"): NodeNameIndexFunc`), so a kubelet's or a
    /// drain's list of one node's pods does not walk every pod of the cluster.
    by_node: HashMap<String, BTreeSet<String>>,
    history: VecDeque<Arc<Change>>,
    /// Highest resourceVersion dropped from the history: watches from older versions get 410.
    compacted: u64,
}

/// The table whose objects are indexed by `spec.nodeName`.
const POD_TABLE: &str = "/pods";

fn node_of(obj: &Value) -> &str {
    obj.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

impl Table {
    /// An empty table named `name` (the pod table is indexed by node).
    fn named(name: &str) -> Self {
        Table {
            indexed: name == POD_TABLE,
            ..Table::default()
        }
    }

    /// Stores `obj` at `key`, keeping the node index of a pod table in step.
    fn put(&mut self, key: &str, obj: Value) {
        if self.indexed {
            let node = node_of(&obj).to_string();
            if let Some(old) = self.objects.get(key) {
                let before = node_of(old);
                if before != node {
                    self.unindex(before.to_string(), key);
                }
            }
            self.by_node
                .entry(node)
                .or_default()
                .insert(key.to_string());
        }
        self.objects.insert(key.to_string(), obj);
    }

    /// Removes the object at `key`, and its entry in the node index.
    fn take(&mut self, key: &str) -> Option<Value> {
        let obj = self.objects.remove(key)?;
        if self.indexed {
            self.unindex(node_of(&obj).to_string(), key);
        }
        Some(obj)
    }

    fn unindex(&mut self, node: String, key: &str) {
        if let Some(keys) = self.by_node.get_mut(&node) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    /// Visits the objects under `scope` whose key comes after `after`, in key order,
    /// until `visit` returns false. A node scope narrows only the indexed pod table; other
    /// tables are walked whole under the prefix.
    fn visit(
        &self,
        scope: Scope<'_>,
        after: Option<&str>,
        mut visit: impl FnMut(&str, &Value) -> bool,
    ) {
        use std::ops::Bound;
        let start = match after {
            Some(key) if key >= scope.prefix => Bound::Excluded(key.to_string()),
            _ => Bound::Included(scope.prefix.to_string()),
        };
        let range = (start, Bound::Unbounded);
        match scope.node.filter(|_| self.indexed) {
            Some(node) => {
                let Some(keys) = self.by_node.get(node) else {
                    return;
                };
                for key in keys
                    .range::<String, _>(range)
                    .take_while(|k| k.starts_with(scope.prefix))
                {
                    if let Some(obj) = self.objects.get(key)
                        && !visit(key, obj)
                    {
                        break;
                    }
                }
            }
            None => {
                for (key, obj) in self
                    .objects
                    .range::<String, _>(range)
                    .take_while(|(k, _)| k.starts_with(scope.prefix))
                {
                    if !visit(key, obj) {
                        break;
                    }
                }
            }
        }
    }
}

/// Which objects of a table a list or watch walks: those under a key prefix (a
/// namespace, or all), narrowed to one node's pods when the request selects on
/// `spec.nodeName`. The caller still applies its whole selector to what it visits.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Scope<'a> {
    pub prefix: &'a str,
    pub node: Option<&'a str>,
}

struct State {
    rv: u64,
    tables: HashMap<String, Table>,
}

/// The object store.
pub(crate) struct Store {
    state: Mutex<State>,
    changes: broadcast::Sender<Arc<Change>>,
    history_limit: usize,
}

/// A watch's starting point: the past changes to replay and the live feed after them.
pub(crate) struct Subscription {
    pub replay: Vec<Arc<Change>>,
    pub live: broadcast::Receiver<Arc<Change>>,
}

/// The object stored at `table`/`key`, provided its resourceVersion is still
/// `expected_rv`: the compare half of every compare-and-swap write.
fn current(state: &State, table: &str, key: &str, expected_rv: u64) -> Result<Value, StoreError> {
    let old = state
        .tables
        .get(table)
        .and_then(|t| t.objects.get(key))
        .cloned()
        .ok_or(StoreError::NotFound)?;
    if rv_of(&old) != expected_rv {
        return Err(StoreError::Conflict);
    }
    Ok(old)
}

pub(crate) fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

impl Store {
    /// A store keeping `history_limit` changes per table for watch resumption.
    pub(crate) fn new(history_limit: usize) -> Self {
        // The live feed only has to absorb bursts between a watcher's polls; a lagging
        // watcher is closed and resumes from its last resourceVersion.
        let (changes, _) = broadcast::channel(16_384);
        Self {
            state: Mutex::new(State {
                rv: 1,
                tables: HashMap::new(),
            }),
            changes,
            history_limit: history_limit.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The current resourceVersion.
    pub(crate) fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub(crate) fn get(&self, table: &str, key: &str) -> Option<Value> {
        self.lock()
            .tables
            .get(table)
            .and_then(|t| t.objects.get(key).cloned())
    }

    /// Every object of a table whose key starts with `prefix`, in key order, and the
    /// resourceVersion of the snapshot.
    pub(crate) fn list(&self, table: &str, prefix: &str) -> (Vec<(String, Value)>, u64) {
        let state = self.lock();
        let items = state
            .tables
            .get(table)
            .map(|t| {
                t.objects
                    .range(prefix.to_string()..)
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        (items, state.rv)
    }

    /// Visits, in key order, the objects of `table` under `scope` whose key comes after
    /// `after`, until `visit` returns false; returns the store's resourceVersion. A page
    /// of a long list clones only what it serves.
    pub(crate) fn scan(
        &self,
        table: &str,
        scope: Scope<'_>,
        after: Option<&str>,
        visit: impl FnMut(&str, &Value) -> bool,
    ) -> u64 {
        let state = self.lock();
        if let Some(t) = state.tables.get(table) {
            t.visit(scope, after, visit);
        }
        state.rv
    }

    fn record(&self, state: &mut State, change: Change) -> Arc<Change> {
        let change = Arc::new(change);
        let table = state
            .tables
            .entry(change.table.clone())
            .or_insert_with(|| Table::named(&change.table));
        table.history.push_back(change.clone());
        while table.history.len() > self.history_limit {
            if let Some(dropped) = table.history.pop_front() {
                table.compacted = dropped.rv;
            }
        }
        let _ = self.changes.send(change.clone());
        change
    }

    /// Stores a new object; fails if the key exists.
    pub(crate) fn create(
        &self,
        table: &str,
        key: &str,
        mut obj: Value,
    ) -> Result<Value, StoreError> {
        let mut state = self.lock();
        let t = state
            .tables
            .entry(table.to_string())
            .or_insert_with(|| Table::named(table));
        if t.objects.contains_key(key) {
            return Err(StoreError::AlreadyExists);
        }
        state.rv += 1;
        let rv = state.rv;
        set_rv(&mut obj, rv);
        state
            .tables
            .entry(table.to_string())
            .or_insert_with(|| Table::named(table))
            .put(key, obj.clone());
        self.record(
            &mut state,
            Change {
                rv,
                table: table.to_string(),
                kind: EventType::Added,
                object: obj.clone(),
                old: None,
            },
        );
        Ok(obj)
    }

    /// Replaces an object if its stored resourceVersion equals `expected_rv`.
    pub(crate) fn update(
        &self,
        table: &str,
        key: &str,
        expected_rv: u64,
        mut obj: Value,
    ) -> Result<Value, StoreError> {
        let mut state = self.lock();
        let old = current(&state, table, key, expected_rv)?;
        state.rv += 1;
        let rv = state.rv;
        set_rv(&mut obj, rv);
        if let Some(t) = state.tables.get_mut(table) {
            t.put(key, obj.clone());
        }
        self.record(
            &mut state,
            Change {
                rv,
                table: table.to_string(),
                kind: EventType::Modified,
                object: obj.clone(),
                old: Some(old),
            },
        );
        Ok(obj)
    }

    /// Removes an object if its stored resourceVersion equals `expected_rv`; `final_obj`
    /// is what the DELETED event carries (the last state, with a fresh resourceVersion).
    pub(crate) fn remove(
        &self,
        table: &str,
        key: &str,
        expected_rv: u64,
        mut final_obj: Value,
    ) -> Result<Value, StoreError> {
        let mut state = self.lock();
        let old = current(&state, table, key, expected_rv)?;
        state.rv += 1;
        let rv = state.rv;
        set_rv(&mut final_obj, rv);
        if let Some(t) = state.tables.get_mut(table) {
            t.take(key);
        }
        self.record(
            &mut state,
            Change {
                rv,
                table: table.to_string(),
                kind: EventType::Deleted,
                object: final_obj.clone(),
                old: Some(old),
            },
        );
        Ok(final_obj)
    }

    /// Removes every object of namespace `ns` (the namespace itself is gone already).
    pub(crate) fn remove_namespace(&self, ns: &str) {
        let prefix = format!("{ns}/");
        let mut state = self.lock();
        let tables: Vec<String> = state.tables.keys().cloned().collect();
        for table in tables {
            let keys: Vec<String> = state
                .tables
                .get(&table)
                .map(|t| {
                    t.objects
                        .keys()
                        .filter(|k| k.starts_with(&prefix))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for key in keys {
                self.remove_locked(&mut state, &table, &key);
            }
        }
    }

    /// Removes every object of a table (a deleted CRD's resources).
    pub(crate) fn remove_table(&self, table: &str) {
        let mut state = self.lock();
        let keys: Vec<String> = state
            .tables
            .get(table)
            .map(|t| t.objects.keys().cloned().collect())
            .unwrap_or_default();
        for key in keys {
            self.remove_locked(&mut state, table, &key);
        }
    }

    fn remove_locked(&self, state: &mut State, table: &str, key: &str) {
        let Some(mut obj) = state.tables.get_mut(table).and_then(|t| t.take(key)) else {
            return;
        };
        let old = obj.clone();
        state.rv += 1;
        let rv = state.rv;
        set_rv(&mut obj, rv);
        self.record(
            state,
            Change {
                rv,
                table: table.to_string(),
                kind: EventType::Deleted,
                object: obj,
                old: Some(old),
            },
        );
    }

    /// Starts a watch of `table` after resourceVersion `since`: the recorded changes
    /// newer than it plus the live feed, or `None` when the history no longer reaches
    /// back that far (410 Gone).
    pub(crate) fn subscribe(&self, table: &str, since: u64) -> Option<Subscription> {
        let state = self.lock();
        let live = self.changes.subscribe();
        let Some(t) = state.tables.get(table) else {
            return Some(Subscription {
                replay: Vec::new(),
                live,
            });
        };
        if since < t.compacted {
            return None;
        }
        let replay = t.history.iter().filter(|c| c.rv > since).cloned().collect();
        Some(Subscription { replay, live })
    }

    /// The objects of a table under `scope` that `select` keeps, plus a live feed
    /// starting right after them (for watches without a resourceVersion, which begin with
    /// synthetic ADDED events).
    pub(crate) fn snapshot_and_subscribe<T>(
        &self,
        table: &str,
        scope: Scope<'_>,
        mut select: impl FnMut(&Value) -> Option<T>,
    ) -> (Vec<T>, u64, broadcast::Receiver<Arc<Change>>) {
        let state = self.lock();
        let live = self.changes.subscribe();
        let mut items = Vec::new();
        if let Some(t) = state.tables.get(table) {
            t.visit(scope, None, |_, obj| {
                items.extend(select(obj));
                true
            });
        }
        (items, state.rv, live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compare_and_swap_and_history() {
        let store = Store::new(2);
        let a = store
            .create("/pods", "ns/a", json!({"metadata": {}}))
            .unwrap();
        let rv = rv_of(&a);
        assert_eq!(
            store.create("/pods", "ns/a", json!({"metadata": {}})),
            Err(StoreError::AlreadyExists)
        );
        let b = store
            .update("/pods", "ns/a", rv, json!({"metadata": {}}))
            .unwrap();
        assert_eq!(
            store.update("/pods", "ns/a", rv, json!({"metadata": {}})),
            Err(StoreError::Conflict)
        );
        store
            .update("/pods", "ns/a", rv_of(&b), json!({"metadata": {}}))
            .unwrap();
        // Three changes with a history of two: the first is compacted away.
        assert!(store.subscribe("/pods", rv - 1).is_none());
        assert_eq!(store.subscribe("/pods", rv).unwrap().replay.len(), 2);
    }

    fn keys(store: &Store, table: &str, scope: Scope<'_>, after: Option<&str>) -> Vec<String> {
        let mut keys = Vec::new();
        store.scan(table, scope, after, |key, _| {
            keys.push(key.to_string());
            true
        });
        keys
    }

    #[test]
    fn a_node_scope_visits_that_nodes_pods_as_they_are_now() {
        let store = Store::new(16);
        let pod = |node: &str| json!({"metadata": {}, "spec": {"nodeName": node}});
        store.create("/pods", "a/p1", pod("n1")).unwrap();
        store.create("/pods", "b/p2", pod("n1")).unwrap();
        let moving = store.create("/pods", "a/p3", pod("")).unwrap();
        store.create("/pods", "a/p4", pod("n2")).unwrap();
        // A pod bound after its creation moves from the unscheduled entry to its node.
        store
            .update("/pods", "a/p3", rv_of(&moving), pod("n1"))
            .unwrap();
        let n1 = Scope {
            prefix: "",
            node: Some("n1"),
        };
        assert_eq!(keys(&store, "/pods", n1, None), ["a/p1", "a/p3", "b/p2"]);
        assert_eq!(keys(&store, "/pods", n1, Some("a/p1")), ["a/p3", "b/p2"]);
        let in_a = Scope {
            prefix: "a/",
            node: Some("n1"),
        };
        assert_eq!(keys(&store, "/pods", in_a, None), ["a/p1", "a/p3"]);
        let unscheduled = Scope {
            prefix: "",
            node: Some(""),
        };
        assert!(keys(&store, "/pods", unscheduled, None).is_empty());
        // A deleted pod leaves the index with its object.
        let p1 = store.get("/pods", "a/p1").unwrap();
        store
            .remove("/pods", "a/p1", rv_of(&p1), p1.clone())
            .unwrap();
        assert_eq!(keys(&store, "/pods", n1, None), ["a/p3", "b/p2"]);
        store.remove_namespace("b");
        assert_eq!(keys(&store, "/pods", n1, None), ["a/p3"]);
        // Tables other than pods are not indexed: a node scope walks them whole, and the
        // caller's selector decides.
        store.create("/other", "a/x", pod("n9")).unwrap();
        assert_eq!(keys(&store, "/other", n1, None), ["a/x"]);
    }
}
