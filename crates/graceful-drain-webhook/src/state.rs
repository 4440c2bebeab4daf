//! What the admission handlers share: the acting context, the decision settings, the
//! metrics, and the bounded table of held DELETEs.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::decide::Settings;
use super::isolate;
use super::metrics::Metrics;
pub use super::share::{UNCONFIRMED_SHARE_PERCENT, Unconfirmed};
use graceful_drain_core::runtime::Shutdown;

/// Everything the handlers share.
pub struct AppState {
    /// What isolating a pod needs; its client makes no hidden retries.
    pub ctx: isolate::Context,
    /// The decision's settings from the command line.
    pub settings: Settings,
    /// Where each review's outcome and latency are counted.
    pub metrics: Arc<Metrics>,
    /// Budget when the API server sends no `timeout` parameter (= `--timeout-seconds`).
    pub default_timeout: Duration,
    /// Cancelled at shutdown: held DELETEs are answered at once.
    pub shutdown: Shutdown,
    /// The hold deadline of each DELETE in flight, so a repeated call continues it.
    pub holds: Holds,
    /// Evictions open a watch of their pod's node and later ones read their pod from it
    /// (see [`super::nodepods`]); off, every eviction reads its pod.
    pub watch_drained_nodes: bool,
    /// The isolations nothing authenticated confirmed, bounded per Service over every
    /// replica.
    pub unconfirmed: Unconfirmed,
    /// Every connection presents a client certificate signed by `--client-ca`
    /// (kube-apiserver's, docs/security.md): each review comes from the API server, which
    /// authenticated and authorised its caller, so an eviction is the caller's own word and
    /// confirms its isolation as a drain does.
    pub reviews_authenticated: bool,
    /// Bounds on the Events and log lines a caller of the port could multiply.
    pub throttles: super::throttle::Throttles,
    /// One ReplicaSet scale-down DELETE at a time per ReplicaSet.
    pub scale_downs: ScaleDowns,
    /// Live reads of pods' controllers, shared by the reviews that claim them.
    pub controllers: super::admission::ControllerReads,
}

/// Turns for the ReplicaSet controller's DELETEs: a DELETE counts the ReplicaSet's pods
/// and isolates its own inside one turn of that ReplicaSet, so concurrent DELETEs (the
/// controller's burst, or forged reviews claiming it) each see the isolations before theirs
/// and together take no more than the ReplicaSet's surplus. Striped: a ReplicaSet maps to
/// one of a fixed number of locks, so the table never grows.
#[derive(Debug)]
pub struct ScaleDowns {
    stripes: Vec<tokio::sync::Mutex<()>>,
}

/// Locks of [`ScaleDowns`]: two ReplicaSets share one at times, which only orders their
/// DELETEs.
const SCALE_DOWN_STRIPES: usize = 64;

impl Default for ScaleDowns {
    fn default() -> ScaleDowns {
        ScaleDowns {
            stripes: (0..SCALE_DOWN_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        }
    }
}

impl ScaleDowns {
    /// Waits for the turn of ReplicaSet `namespace/name`; it lasts until the guard drops.
    pub async fn turn(&self, namespace: &str, name: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (namespace, name).hash(&mut hasher);
        let stripe = usize::try_from(hasher.finish() % SCALE_DOWN_STRIPES as u64).unwrap_or(0);
        self.stripes[stripe].lock().await
    }
}

/// How long the hold of a DELETE is remembered: the API server's own request deadline
/// (60 s). The API server calls the validating webhook again within the same request when
/// the pod changed during the call (our relabel, the ReplicaSet releasing it); such a
/// call continues the first hold instead of starting a new one.
const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

/// Default bound of the DELETEs one replica holds at once (`--max-held-deletes`).
///
/// A held DELETE keeps one of the API server's seats in its caller's priority level for
/// up to the webhook timeout. kube-apiserver has 600 seats by default
/// (`--max-requests-inflight` 400 + `--max-mutating-requests-inflight` 200), of which the
/// built-in priority levels the usual DELETE callers fall in get about 245
/// (`workload-low`, every ServiceAccount) and 49 (`global-default`, people): 32 per
/// replica keeps held requests to a small part of those.
pub const MAX_HELD_DELETES: usize = 32;

/// Hold deadlines of recent DELETEs, by pod UID, and the slots bounding how many are held
/// at once.
#[derive(Debug)]
pub struct Holds {
    deadlines: std::sync::Mutex<std::collections::HashMap<String, (Instant, Instant)>>,
    slots: Arc<tokio::sync::Semaphore>,
    pub(crate) max: usize,
    /// Slots of evictions held for the last moments before their pod is due, apart from
    /// the DELETEs' so that evictions (which anyone reaching the port can send) never take
    /// a DELETE's protection away.
    due: Arc<tokio::sync::Semaphore>,
}

/// Evictions one replica holds at once until their pod is due (see
/// `admission::evict::DUE_HOLD`); past it an eviction is answered 429 as before.
pub const MAX_DUE_HOLDS: usize = 64;

impl Default for Holds {
    fn default() -> Holds {
        Holds::bounded(MAX_HELD_DELETES)
    }
}

impl Holds {
    /// No DELETE held yet; at most `max` at once.
    pub fn bounded(max: usize) -> Holds {
        Holds {
            deadlines: std::sync::Mutex::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
            due: Arc::new(tokio::sync::Semaphore::new(MAX_DUE_HOLDS)),
        }
    }

    /// A slot for one more eviction held until its pod is due, or `None` when
    /// [`MAX_DUE_HOLDS`] are held.
    pub(crate) fn due_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.due.clone().try_acquire_owned().ok()
    }

    /// A slot for one more held DELETE, or `None` when `max` are held.
    pub(crate) fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// The deadline of a hold of pod `uid` starting now with `deadline`: the first hold's
    /// deadline when the same DELETE is already being held or was just answered.
    pub(crate) fn deadline_for(&self, uid: &str, deadline: Instant) -> Instant {
        let now = Instant::now();
        let mut holds = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        holds.retain(|_, (_, forget_at)| *forget_at > now);
        let (first, _) = holds
            .entry(uid.to_string())
            .or_insert((deadline, now + REQUEST_DEADLINE));
        (*first).min(deadline)
    }
}
