//! The pods of nodes being drained, so that evictions need no read of their pod.
//!
//! An eviction names its pod and nothing else, so deciding about it takes the pod's
//! labels, owner, readiness and resourceVersion from the API: one GET per evicted pod.
//! A drain evicts every pod of one node within seconds, so the first eviction of an
//! exposed pod on node N (the node its EndpointSlice endpoint names) opens a watch of
//! N's pods, selected by `spec.nodeName=N` as a kubelet selects its own, and later
//! evictions on N are decided from it: one LIST and one WATCH per drained node instead
//! of a GET per pod. A node's watch ends after [`IDLE`] without a lookup, and at most
//! [`MAX_NODES`] are watched at once (evictions beyond read their pod as before), so the
//! webhook's memory stays bounded by the nodes under maintenance, not by the cluster.
//!
//! Watched facts may lag behind the API. That is safe where they are used: an isolation
//! patch tests the pod's resourceVersion (a stale pod is re-read and decided again), a
//! pod already isolated is only refused again, and a decision to let the eviction
//! through unprotected is confirmed from a fresh read first (see `settle.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use super::decide::PodFacts;
use graceful_drain_core::runtime::Shutdown;

/// A node's watch ends after this long without a lookup.
pub const IDLE: Duration = Duration::from_secs(120);
/// Most nodes watched at once (20 nodes drained together fit with room to spare).
pub const MAX_NODES: usize = 64;
/// How long an eviction waits for its node's watch to list before reading its pod: a
/// drain sends many evictions at once, and without the wait each would read its pod.
pub const SYNC_WAIT: Duration = Duration::from_secs(1);

type Key = (String, String);

/// The pods of one watched node.
#[derive(Debug)]
struct NodeEntry {
    pods: RwLock<HashMap<Key, PodFacts>>,
    /// The watch has listed the node's pods once and not lost its place since.
    synced: tokio::sync::watch::Sender<bool>,
    /// Milliseconds after [`NodePods::epoch`] of the last lookup.
    used: AtomicU64,
}

impl Default for NodeEntry {
    fn default() -> Self {
        NodeEntry {
            pods: RwLock::default(),
            synced: tokio::sync::watch::Sender::new(false),
            used: AtomicU64::default(),
        }
    }
}

impl NodeEntry {
    fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    fn set_synced(&self, synced: bool) {
        self.synced
            .send_if_modified(|s| std::mem::replace(s, synced) != synced);
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// The watched node lists the pod.
    Found(Box<PodFacts>),
    /// The node is watched, but its pods are not listed yet or this one is not among them.
    Unknown,
    /// Nobody watches the node: the caller may start a watch ([`watch`]).
    NotWatched,
}

/// The watched nodes, shared by admission calls and the watch tasks.
#[derive(Debug)]
pub struct NodePods {
    nodes: Mutex<HashMap<String, Arc<NodeEntry>>>,
    epoch: Instant,
}

impl Default for NodePods {
    fn default() -> Self {
        NodePods {
            nodes: Mutex::default(),
            epoch: Instant::now(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl NodePods {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn entry(&self, node: &str) -> Option<Arc<NodeEntry>> {
        lock(&self.nodes).get(node).cloned()
    }

    /// Pod `namespace/name` as the watch of `node` knows it.
    pub fn lookup(&self, node: &str, namespace: &str, name: &str) -> Lookup {
        let Some(entry) = self.entry(node) else {
            return Lookup::NotWatched;
        };
        entry.used.store(self.now_ms(), Ordering::Relaxed);
        if !entry.is_synced() {
            return Lookup::Unknown;
        }
        let pods = entry.pods.read().unwrap_or_else(|e| e.into_inner());
        match pods.get(&(namespace.to_string(), name.to_string())) {
            Some(pod) => Lookup::Found(Box::new(pod.clone())),
            None => Lookup::Unknown,
        }
    }

    /// Waits up to `bound` for the watch of `node` to have listed; false if it has not
    /// (or nobody watches the node).
    pub async fn wait_synced(&self, node: &str, bound: Duration) -> bool {
        let Some(entry) = self.entry(node) else {
            return false;
        };
        let mut synced = entry.synced.subscribe();
        matches!(
            tokio::time::timeout(bound, synced.wait_for(|s| *s)).await,
            Ok(Ok(_))
        )
    }

    /// Registers a watch of `node`; false when it has one or [`MAX_NODES`] are watched.
    fn claim(&self, node: &str) -> Option<Arc<NodeEntry>> {
        let mut nodes = lock(&self.nodes);
        if nodes.contains_key(node) || nodes.len() >= MAX_NODES {
            return None;
        }
        let entry = Arc::new(NodeEntry::default());
        entry.used.store(self.now_ms(), Ordering::Relaxed);
        nodes.insert(node.to_string(), entry.clone());
        Some(entry)
    }

    fn release(&self, node: &str) {
        lock(&self.nodes).remove(node);
    }

    fn idle(&self, entry: &NodeEntry) -> bool {
        let used = entry.used.load(Ordering::Relaxed);
        self.now_ms().saturating_sub(used) >= u64::try_from(IDLE.as_millis()).unwrap_or(0)
    }

    /// Nodes watched now (metrics and tests).
    pub fn watched(&self) -> Vec<String> {
        let mut nodes: Vec<String> = lock(&self.nodes).keys().cloned().collect();
        nodes.sort();
        nodes
    }
}

/// Starts watching the pods of `node` unless it is watched already or the table is full;
/// the watch runs until it has been idle for [`IDLE`] or `shutdown`.
pub fn watch(pods: Arc<NodePods>, client: kube::Client, node: &str, shutdown: Shutdown) {
    let Some(entry) = pods.claim(node) else {
        return;
    };
    let node = node.to_string();
    tokio::spawn(async move {
        tracing::debug!(%node, "watching the pods of a drained node");
        run(&pods, &entry, client, &node, shutdown).await;
        pods.release(&node);
        tracing::debug!(%node, "stopped watching the pods of the node");
    });
}

async fn run(
    pods: &NodePods,
    entry: &NodeEntry,
    client: kube::Client,
    node: &str,
    shutdown: Shutdown,
) {
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .any_semantic();
    let events = watcher::watcher(Api::<Pod>::all(client), config).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut check = tokio::time::interval(IDLE / 8);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<HashSet<Key>> = None;
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            _ = check.tick() => {
                if pods.idle(entry) {
                    return;
                }
                continue;
            }
            event = events.next() => match event {
                Some(event) => event,
                None => return,
            },
        };
        let mut table = entry.pods.write().unwrap_or_else(|e| e.into_inner());
        match event {
            Ok(Event::Apply(pod)) => {
                let facts = super::review::pod_facts(&pod);
                table.insert((facts.namespace.clone(), facts.name.clone()), facts);
            }
            Ok(Event::Delete(pod)) => {
                let meta = pod.metadata;
                table.remove(&(
                    meta.namespace.unwrap_or_default(),
                    meta.name.unwrap_or_default(),
                ));
            }
            Ok(Event::Init) => {
                entry.set_synced(false);
                seen = Some(HashSet::new());
            }
            Ok(Event::InitApply(pod)) => {
                let facts = super::review::pod_facts(&pod);
                let key = (facts.namespace.clone(), facts.name.clone());
                if let Some(seen) = seen.as_mut() {
                    seen.insert(key.clone());
                }
                table.insert(key, facts);
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = seen.take() {
                    table.retain(|key, _| seen.contains(key));
                }
                entry.set_synced(true);
            }
            Err(error) => {
                // Until the watcher lists again, lookups read their pod from the API.
                entry.set_synced(false);
                tracing::warn!(%node, error = %graceful_drain_core::error::chain(&error), "watch of the node's pods failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::IntoFacts as _;
    use graceful_drain_testing::fixtures::PodFixture;

    #[test]
    fn lookups_follow_the_watch_and_the_table_is_bounded() {
        let pods = NodePods::default();
        assert!(matches!(pods.lookup("n1", "web", "p"), Lookup::NotWatched));
        let entry = pods.claim("n1").unwrap();
        assert!(pods.claim("n1").is_none(), "one watch per node");
        assert!(
            matches!(pods.lookup("n1", "web", "p"), Lookup::Unknown),
            "not listed yet"
        );
        let facts = graceful_drain_testing::fixtures::pod("p").ns("web").facts();
        entry
            .pods
            .write()
            .unwrap()
            .insert(("web".into(), "p".into()), facts);
        entry.set_synced(true);
        assert!(matches!(pods.lookup("n1", "web", "p"), Lookup::Found(f) if f.name == "p"));
        assert!(matches!(pods.lookup("n1", "web", "q"), Lookup::Unknown));
        assert!(!pods.idle(&entry), "just used");
        entry.used.store(0, Ordering::Relaxed);
        let later = NodePods {
            nodes: Mutex::default(),
            epoch: Instant::now() - IDLE,
        };
        assert!(
            later.idle(&entry),
            "idle once IDLE has passed since the last use"
        );
        for i in 1..MAX_NODES {
            assert!(pods.claim(&format!("m{i}")).is_some());
        }
        assert!(pods.claim("one-too-many").is_none());
        pods.release("n1");
        assert!(matches!(pods.lookup("n1", "web", "p"), Lookup::NotWatched));
        assert_eq!(pods.watched().len(), MAX_NODES - 1);
    }
}
