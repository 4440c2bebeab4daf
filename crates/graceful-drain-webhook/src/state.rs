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
    /// The isolations nothing authenticated confirmed, bounded per Service.
    pub unconfirmed: Unconfirmed,
}

/// Percentage of a Service's ready endpoints that isolations nothing authenticated
/// confirmed may hold at once (at least one), and never its last ready endpoint.
///
/// An isolation is confirmed when something only an authenticated user can do stands
/// behind it: the pod's node is being drained (cordoned, or a drainer's taint), or the live
/// ReplicaSet has a pod too many for its controller's DELETE. Anything else — an eviction on
/// a schedulable node (the descheduler, or a review forged by anyone who reaches the port),
/// a DELETE by a person or another controller — could be a forged review, so a flood of
/// them must not empty a Service (docs/security.md). A quarter keeps three quarters serving
/// while replacements start, and lets a descheduler or a StatefulSet's one-at-a-time update
/// through at once; drains and rollouts are confirmed and never counted.
pub const UNCONFIRMED_SHARE_PERCENT: usize = 25;

/// Unconfirmed isolations by Service, each until the pod is restored if nobody removes it.
/// Per replica: with the chart's two replicas, an attacker splitting a flood between them
/// reaches at most twice the share, and never a Service's last endpoint.
#[derive(Debug, Default)]
pub struct Unconfirmed {
    by_service: std::sync::Mutex<std::collections::HashMap<ServiceKey, Vec<Held>>>,
}

/// A Service by namespace and name.
type ServiceKey = (String, String);
/// An unconfirmed isolation: the pod's name and when it is restored at the latest.
type Held = (String, jiff::Timestamp);

impl Unconfirmed {
    /// Why isolating pod `namespace/pod` unconfirmed now would take Service `service` too
    /// far, if it would: `ready_others` is how many other pods the Service's slices list as
    /// ready.
    pub(crate) fn refusal(
        &self,
        namespace: &str,
        service: &str,
        pod: &str,
        ready_others: usize,
        now: jiff::Timestamp,
    ) -> Option<String> {
        if ready_others == 0 {
            return Some(format!(
                "pod {namespace}/{pod} is the last ready endpoint of Service {service}"
            ));
        }
        let mut table = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let held = table
            .get_mut(&(namespace.to_string(), service.to_string()))
            .map_or(0, |pods| {
                pods.retain(|(name, until)| *until > now && name != pod);
                pods.len()
            });
        let total = ready_others + 1 + held;
        let allowed = (total * UNCONFIRMED_SHARE_PERCENT / 100).max(1);
        (held >= allowed).then(|| {
            format!(
                "Service {service} already has {held} of its {total} pods isolated by evictions or deletions no drain or rollout confirms (at most {allowed} at once)"
            )
        })
    }

    /// Counts pod `namespace/pod`, isolated unconfirmed, against `services` until `until`.
    pub(crate) fn record<'a>(
        &self,
        namespace: &str,
        services: impl IntoIterator<Item = &'a str>,
        pod: &str,
        until: jiff::Timestamp,
    ) {
        let mut table = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        for service in services {
            let pods = table
                .entry((namespace.to_string(), service.to_string()))
                .or_default();
            pods.retain(|(name, _)| name != pod);
            pods.push((pod.to_string(), until));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_services_last_ready_endpoint_is_never_isolated_unconfirmed() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        let why = table.refusal("web", "web", "web-1", 0, now).unwrap();
        assert!(why.contains("last ready endpoint of Service web"), "{why}");
    }

    #[test]
    fn unconfirmed_isolations_hold_at_most_a_quarter_of_a_service_at_once() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        let until = at("2026-01-01T00:02:00Z");
        // Eight pods: two may be held at once.
        assert_eq!(table.refusal("web", "web", "web-0", 7, now), None);
        table.record("web", ["web"], "web-0", until);
        assert_eq!(table.refusal("web", "web", "web-1", 6, now), None);
        table.record("web", ["web"], "web-1", until);
        let why = table.refusal("web", "web", "web-2", 5, now).unwrap();
        assert!(why.contains("2 of its 8 pods"), "{why}");
        // Another Service, or the same pod asked again, is not held back by them.
        assert_eq!(table.refusal("web", "api", "web-2", 5, now), None);
        assert_eq!(table.refusal("web", "web", "web-1", 6, now), None);
        // Once restored (past their time) they no longer count.
        let later = at("2026-01-01T00:02:01Z");
        assert_eq!(table.refusal("web", "web", "web-2", 7, later), None);
    }

    #[test]
    fn a_small_service_still_lets_one_unconfirmed_isolation_through() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        assert_eq!(table.refusal("web", "web", "web-0", 1, now), None);
        table.record("web", ["web"], "web-0", at("2026-01-01T00:01:00Z"));
        assert!(table.refusal("web", "web", "web-1", 1, now).is_some());
    }
}
