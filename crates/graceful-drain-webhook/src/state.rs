//! What the admission handlers share: the acting context, the decision settings, the
//! metrics, and the bounded table of held DELETEs.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::decide::Settings;
use super::isolate;
use super::metrics::Metrics;
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
}

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
        }
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
