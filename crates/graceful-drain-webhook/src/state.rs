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

/// Percentage of a Service's pods (rounded up, at least one) that isolations nothing
/// authenticated confirmed may hold at once; never its last ready endpoint.
///
/// An isolation is confirmed when something only an authenticated user can do stands
/// behind it: the pod's node is being drained (cordoned, or a drainer's taint), or the live
/// ReplicaSet has a pod too many for its controller's DELETE. Anything else — an eviction on
/// a schedulable node (the descheduler, or a review forged by anyone who reaches the port),
/// a DELETE by a person or another controller — could be a forged review, so a flood of
/// them must not empty a Service (docs/security.md). An eviction of a pod a
/// PodDisruptionBudget selects is bounded by that budget instead (it is charged); a DELETE,
/// which no budget blocks, by this share. Half keeps most of a Service serving while
/// replacements start and still lets people delete a few pods of a small Deployment at once
/// (two of four); drains and rollouts are confirmed and never counted.
pub const UNCONFIRMED_SHARE_PERCENT: usize = 50;

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
    /// ready; with `budgeted`, a PodDisruptionBudget charged for this isolation bounds it
    /// and only the last endpoint is kept; `isolated` says whether a pod of the namespace is
    /// still isolated (one deleted or restored, or replaced by a pod of the same name, no
    /// longer counts).
    #[allow(clippy::too_many_arguments)] // the facts of one decision, each named
    pub(crate) fn refusal(
        &self,
        namespace: &str,
        service: &str,
        pod: &str,
        ready_others: usize,
        budgeted: bool,
        now: jiff::Timestamp,
        isolated: impl Fn(&str) -> bool,
    ) -> Option<String> {
        if ready_others == 0 {
            return Some(format!(
                "pod {namespace}/{pod} is the last ready endpoint of Service {service}"
            ));
        }
        if budgeted {
            return None;
        }
        let mut table = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let held = table
            .get_mut(&(namespace.to_string(), service.to_string()))
            .map_or(0, |pods| {
                pods.retain(|(name, until)| *until > now && name != pod && isolated(name));
                pods.len()
            });
        let total = ready_others + 1 + held;
        let allowed = (total * UNCONFIRMED_SHARE_PERCENT).div_ceil(100).max(1);
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
        let why = table
            .refusal("web", "web", "web-1", 0, false, now, |_| true)
            .unwrap();
        assert!(why.contains("last ready endpoint of Service web"), "{why}");
    }

    #[test]
    fn unconfirmed_isolations_hold_at_most_half_a_service_at_once() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        let until = at("2026-01-01T00:02:00Z");
        // Five pods: three may be held at once (half, rounded up).
        for (n, pod) in ["web-0", "web-1", "web-2"].into_iter().enumerate() {
            assert_eq!(
                table.refusal("web", "web", pod, 4 - n, false, now, |_| true),
                None
            );
            table.record("web", ["web"], pod, until);
        }
        let why = table
            .refusal("web", "web", "web-3", 1, false, now, |_| true)
            .unwrap();
        assert!(why.contains("3 of its 5 pods"), "{why}");
        // A budget charged for it bounds it instead; another Service, or the same pod
        // asked again, is not held back by them.
        assert_eq!(
            table.refusal("web", "web", "web-3", 1, true, now, |_| true),
            None
        );
        assert_eq!(
            table.refusal("web", "api", "web-3", 1, false, now, |_| true),
            None
        );
        assert_eq!(
            table.refusal("web", "web", "web-2", 2, false, now, |_| true),
            None
        );
        // Once gone or restored they no longer count, nor past their restore time.
        let gone = |p: &str| p != "web-0";
        assert_eq!(
            table.refusal("web", "web", "web-3", 1, false, now, gone),
            None
        );
        let later = at("2026-01-01T00:02:01Z");
        assert_eq!(
            table.refusal("web", "web", "web-3", 4, false, later, |_| true),
            None
        );
    }

    #[test]
    fn a_two_pod_service_lets_one_unconfirmed_isolation_through_at_a_time() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        assert_eq!(
            table.refusal("web", "web", "web-0", 1, false, now, |_| true),
            None
        );
        table.record("web", ["web"], "web-0", at("2026-01-01T00:01:00Z"));
        // Its replacement is ready: still one of three held, within half.
        assert_eq!(
            table.refusal("web", "web", "web-1", 1, false, now, |_| true),
            None
        );
        table.record("web", ["web"], "web-1", at("2026-01-01T00:01:00Z"));
        let why = table
            .refusal("web", "web", "web-2", 1, false, now, |_| true)
            .unwrap();
        assert!(why.contains("2 of its 4 pods"), "{why}");
    }
}
