//! What this replica remembers of pods' controllers: the reads of recent isolations
//! ([`OwnerFacts`], kept a minute by UID) and the turns that make concurrent isolations
//! read each controller once. `owners` does the reading.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// What isolations read from pods' controllers, shared by this replica's admission calls
/// and its deleter.
#[derive(Debug, Default)]
pub struct OwnerReads {
    /// Controllers read by recent isolations, by UID (see [`Owners`]).
    owners: std::sync::Mutex<Owners>,
    /// Controller reads in flight, by controller UID: `kubectl drain` sends every eviction
    /// of a node at once, and without a turn each of a ReplicaSet's pods would miss
    /// [`Owners`] and read the ReplicaSet itself (257 reads for 500 pods in the drain
    /// bench).
    in_flight: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl OwnerReads {
    /// The controller with `uid` as an isolation read it less than `OWNER_TTL` (a minute) ago.
    pub fn get(&self, uid: &str) -> Option<OwnerFacts> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.get(uid, std::time::Instant::now())
    }

    /// Remembers what an isolation read from the controller with `uid`.
    pub fn remember(&self, uid: &str, facts: OwnerFacts) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.put(uid.to_string(), facts, std::time::Instant::now());
    }

    /// Waits for the turn to read the controller with `uid`; the isolations that waited
    /// behind the reader find its answer in [`OwnerReads::get`]. The turn ends when the
    /// returned guard is dropped.
    pub async fn turn(&self, uid: &str) -> OwnerReadTurn<'_> {
        let lock = {
            let mut reads = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            reads.entry(uid.to_string()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        OwnerReadTurn {
            reads: self,
            uid: uid.to_string(),
            _guard: guard,
        }
    }
}

/// One isolation's turn to read a controller (see [`OwnerReads::turn`]). Dropping it
/// lets the next waiter in, and forgets the turn's lock once nobody else holds it.
pub struct OwnerReadTurn<'a> {
    reads: &'a OwnerReads,
    uid: String,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for OwnerReadTurn<'_> {
    fn drop(&mut self) {
        let mut reads = self
            .reads
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Held by the map and by this turn's guard only: no isolation waits behind it.
        if reads
            .get(&self.uid)
            .is_some_and(|lock| Arc::strong_count(lock) <= 2)
        {
            reads.remove(&self.uid);
        }
    }
}

/// What the relabelling needs from a pod's controller: its selector's keys and, for a
/// ReplicaSet, its own controller reference (the Deployment the pod is handed to).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnerFacts {
    /// Label keys of the controller's `spec.selector` (empty when it has none we can read).
    pub selector_keys: BTreeSet<String>,
    /// A ReplicaSet's own controller reference (its Deployment's), as the JSON
    /// ownerReference the isolation hands the pod to; `None` for other kinds.
    pub controller: Option<serde_json::Value>,
    /// `namespace/name` of the ReplicaSet's Deployment when it rolls out with the
    /// `Recreate` strategy.
    pub recreate: Option<String>,
}

/// How long a controller read stays in [`Owners`]. A drain evicts the pods of one
/// ReplicaSet within seconds, so most of them reuse the first pod's read.
pub const OWNER_TTL: std::time::Duration = std::time::Duration::from_secs(60);
/// Most controllers remembered at once.
const OWNERS_MAX: usize = 4096;

/// Controllers read by recent isolations, keyed by UID. Keyed by UID, an entry never
/// describes a newer object of the same name; the selector of a ReplicaSet, StatefulSet,
/// DaemonSet or Job is immutable, so only a ReplicaSet's own controller reference could
/// change (an orphaned and re-adopted ReplicaSet), which the TTL bounds.
#[derive(Debug, Default)]
pub struct Owners {
    by_uid: HashMap<String, (std::time::Instant, OwnerFacts)>,
}

impl Owners {
    fn get(&self, uid: &str, now: std::time::Instant) -> Option<OwnerFacts> {
        let (read_at, facts) = self.by_uid.get(uid)?;
        (now.duration_since(*read_at) < OWNER_TTL).then(|| facts.clone())
    }

    fn put(&mut self, uid: String, facts: OwnerFacts, now: std::time::Instant) {
        if self.by_uid.len() >= OWNERS_MAX {
            self.by_uid
                .retain(|_, (read_at, _)| now.duration_since(*read_at) < OWNER_TTL);
        }
        if self.by_uid.len() >= OWNERS_MAX {
            self.by_uid.clear();
        }
        self.by_uid.insert(uid, (now, facts));
    }
}
