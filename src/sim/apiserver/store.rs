//! Object storage: one table per resource, a single resourceVersion counter, and a
//! bounded per-table event history from which watches resume.
//!
//! Every mutation happens under one lock, assigns the next resourceVersion, records a
//! watch event in the table's history and broadcasts it. Callers compare-and-swap on
//! resourceVersion to get optimistic concurrency.

use std::collections::{BTreeMap, HashMap, VecDeque};
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
    history: VecDeque<Arc<Change>>,
    /// Highest resourceVersion dropped from the history: watches from older versions get 410.
    compacted: u64,
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

    /// Visits, in key order, the objects of `table` under `prefix` whose key comes after
    /// `after`, until `visit` returns false; returns the store's resourceVersion. A page
    /// of a long list clones only what it serves.
    pub(crate) fn scan(
        &self,
        table: &str,
        prefix: &str,
        after: Option<&str>,
        mut visit: impl FnMut(&str, &Value) -> bool,
    ) -> u64 {
        use std::ops::Bound;
        let state = self.lock();
        if let Some(t) = state.tables.get(table) {
            let start = match after {
                Some(key) if key >= prefix => Bound::Excluded(key.to_string()),
                _ => Bound::Included(prefix.to_string()),
            };
            for (key, obj) in t
                .objects
                .range((start, Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix))
            {
                if !visit(key, obj) {
                    break;
                }
            }
        }
        state.rv
    }

    fn record(&self, state: &mut State, change: Change) -> Arc<Change> {
        let change = Arc::new(change);
        let table = state.tables.entry(change.table.clone()).or_default();
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
        let t = state.tables.entry(table.to_string()).or_default();
        if t.objects.contains_key(key) {
            return Err(StoreError::AlreadyExists);
        }
        state.rv += 1;
        let rv = state.rv;
        set_rv(&mut obj, rv);
        state
            .tables
            .entry(table.to_string())
            .or_default()
            .objects
            .insert(key.to_string(), obj.clone());
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
            t.objects.insert(key.to_string(), obj.clone());
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
            t.objects.remove(key);
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
        let Some(mut obj) = state
            .tables
            .get_mut(table)
            .and_then(|t| t.objects.remove(key))
        else {
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

    /// A snapshot of a table plus a live feed starting right after it (for watches
    /// without a resourceVersion, which begin with synthetic ADDED events).
    pub(crate) fn snapshot_and_subscribe(
        &self,
        table: &str,
    ) -> (Vec<Value>, u64, broadcast::Receiver<Arc<Change>>) {
        let state = self.lock();
        let live = self.changes.subscribe();
        let items = state
            .tables
            .get(table)
            .map(|t| t.objects.values().cloned().collect())
            .unwrap_or_default();
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
}
