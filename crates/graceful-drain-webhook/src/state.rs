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
    /// Every connection presents a client certificate signed by `--client-ca`
    /// (kube-apiserver's, docs/security.md): each review comes from the API server, which
    /// authenticated and authorised its caller, so an eviction is the caller's own word and
    /// confirms its isolation as a drain does.
    pub reviews_authenticated: bool,
    /// Bounds on the Events and log lines a caller of the port could multiply.
    pub throttles: super::throttle::Throttles,
    /// One ReplicaSet scale-down DELETE at a time per ReplicaSet.
    pub scale_downs: ScaleDowns,
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
/// An unconfirmed isolation, or a reservation for one under way.
#[derive(Debug)]
struct Held {
    /// The pod's name.
    pod: String,
    /// When it is restored at the latest, or when the reservation lapses.
    until: jiff::Timestamp,
    /// Reserved by an isolation still under way: it counts although the cache does not
    /// show the pod isolated yet, so concurrent reviews cannot all pass the check before
    /// any of them isolates.
    reserved: bool,
}

/// How long a reservation counts when its isolation never reports back (a review whose
/// caller hung up mid-way): a whole request's time.
const RESERVATION: jiff::SignedDuration = jiff::SignedDuration::from_secs(35);

/// What the webhook's cache shows of a pod the table holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    /// The pod carries our isolation (it is neither deleted, restored nor replaced).
    pub isolated: bool,
    /// An EndpointSlice still lists it as a ready endpoint.
    pub listed_ready: bool,
}

impl Unconfirmed {
    /// Why isolating pod `namespace/pod` unconfirmed now would take Service `service` too
    /// far, if it would; if not, the isolation is reserved until [`Unconfirmed::record`]
    /// or [`Unconfirmed::release`]. `ready_others` is how many other pods the Service's
    /// slices list as ready; with `budgeted`, a PodDisruptionBudget charged for this
    /// isolation bounds it and only the last endpoint is kept; `seen` tells what the cache
    /// shows of a held pod.
    #[allow(clippy::too_many_arguments)] // the facts of one decision, each named
    pub(crate) fn reserve(
        &self,
        namespace: &str,
        service: &str,
        pod: &str,
        ready_others: usize,
        budgeted: bool,
        now: jiff::Timestamp,
        seen: impl Fn(&str) -> Seen,
    ) -> Option<String> {
        let mut table = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let held = table
            .entry((namespace.to_string(), service.to_string()))
            .or_default();
        held.retain(|h| h.until > now && h.pod != pod && (h.reserved || seen(&h.pod).isolated));
        // A reserved pod the slices still list is among `ready_others`: count it once.
        let still_listed = held.iter().filter(|h| seen(&h.pod).listed_ready).count();
        let ready_others = ready_others.saturating_sub(still_listed);
        if ready_others == 0 {
            return Some(format!(
                "pod {namespace}/{pod} is the last ready endpoint of Service {service}"
            ));
        }
        if budgeted {
            return None;
        }
        let total = ready_others + 1 + held.len();
        let allowed = (total * UNCONFIRMED_SHARE_PERCENT).div_ceil(100).max(1);
        if held.len() >= allowed {
            return Some(format!(
                "Service {service} already has {} of its {total} pods isolated by evictions or deletions no drain or rollout confirms (at most {allowed} at once)",
                held.len()
            ));
        }
        held.push(Held {
            pod: pod.to_string(),
            until: now.checked_add(RESERVATION).unwrap_or(jiff::Timestamp::MAX),
            reserved: true,
        });
        None
    }

    /// Counts pod `namespace/pod`, isolated unconfirmed, against `services` until `until`
    /// (its reservation becomes the isolation).
    pub(crate) fn record<'a>(
        &self,
        namespace: &str,
        services: impl IntoIterator<Item = &'a str>,
        pod: &str,
        until: jiff::Timestamp,
    ) {
        let mut table = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        for service in services {
            let held = table
                .entry((namespace.to_string(), service.to_string()))
                .or_default();
            held.retain(|h| h.pod != pod);
            held.push(Held {
                pod: pod.to_string(),
                until,
                reserved: false,
            });
        }
    }

    /// Drops the reservations of pod `namespace/pod`: its isolation did not happen.
    pub(crate) fn release(&self, namespace: &str, pod: &str) {
        let mut table = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        for ((ns, _), held) in table.iter_mut() {
            if ns == namespace {
                held.retain(|h| !(h.reserved && h.pod == pod));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    /// What the cache shows of a held pod: isolated and out of its slices.
    fn out(_: &str) -> Seen {
        Seen {
            isolated: true,
            listed_ready: false,
        }
    }

    #[test]
    fn a_services_last_ready_endpoint_is_never_isolated_unconfirmed() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        let why = table
            .reserve("web", "web", "web-1", 0, false, now, out)
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
                table.reserve("web", "web", pod, 4 - n, false, now, out),
                None
            );
            table.record("web", ["web"], pod, until);
        }
        let why = table
            .reserve("web", "web", "web-3", 1, false, now, out)
            .unwrap();
        assert!(why.contains("3 of its 5 pods"), "{why}");
        // A budget charged for it bounds it instead; another Service, or the same pod
        // asked again, is not held back by them.
        assert_eq!(
            table.reserve("web", "web", "web-3", 1, true, now, out),
            None
        );
        assert_eq!(
            table.reserve("web", "api", "web-3", 1, false, now, out),
            None
        );
        assert_eq!(
            table.reserve("web", "web", "web-2", 2, false, now, out),
            None
        );
        table.release("web", "web-2");
        // Once gone or restored they no longer count, nor past their restore time.
        let gone = |p: &str| Seen {
            isolated: p != "web-0",
            listed_ready: false,
        };
        assert_eq!(
            table.reserve("web", "web", "web-3", 1, false, now, gone),
            None
        );
        table.release("web", "web-3");
        let later = at("2026-01-01T00:02:01Z");
        assert_eq!(
            table.reserve("web", "web", "web-3", 4, false, later, out),
            None
        );
    }

    #[test]
    fn a_two_pod_service_lets_one_unconfirmed_isolation_through_at_a_time() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        assert_eq!(
            table.reserve("web", "web", "web-0", 1, false, now, out),
            None
        );
        table.record("web", ["web"], "web-0", at("2026-01-01T00:01:00Z"));
        // Its replacement is ready: still one of three held, within half.
        assert_eq!(
            table.reserve("web", "web", "web-1", 1, false, now, out),
            None
        );
        table.record("web", ["web"], "web-1", at("2026-01-01T00:01:00Z"));
        let why = table
            .reserve("web", "web", "web-2", 1, false, now, out)
            .unwrap();
        assert!(why.contains("2 of its 4 pods"), "{why}");
    }

    /// Six forged evictions arriving at once, before any isolation shows in the cache
    /// (every pod still listed ready, none isolated yet): the reservations bound them to
    /// half the Service, and one whose isolation did not happen frees its place.
    #[test]
    fn concurrent_unconfirmed_isolations_are_bounded_before_any_of_them_lands() {
        let table = Unconfirmed::default();
        let now = at("2026-01-01T00:00:00Z");
        let pending = |_: &str| Seen {
            isolated: false,
            listed_ready: true,
        };
        let pods = ["web-0", "web-1", "web-2", "web-3", "web-4", "web-5"];
        let passed: Vec<&str> = pods
            .into_iter()
            .filter(|pod| {
                table
                    .reserve("web", "web", pod, 5, false, now, pending)
                    .is_none()
            })
            .collect();
        assert_eq!(passed, ["web-0", "web-1", "web-2"]);
        table.release("web", "web-1");
        assert_eq!(
            table.reserve("web", "web", "web-5", 5, false, now, pending),
            None
        );
        // A reservation whose isolation never reports back lapses.
        let later = now.checked_add(RESERVATION).unwrap();
        assert_eq!(
            table.reserve("web", "web", "web-4", 5, false, later, pending),
            None
        );
    }
}
