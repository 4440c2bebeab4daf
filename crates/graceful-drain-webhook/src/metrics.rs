//! Prometheus metrics of the webhook (prefix `graceful_drain_webhook_`), with bounded
//! labels only: the admission path and a fixed set of outcomes, never a pod name.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of the review counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// `evict` or `delete`.
    pub operation: &'static str,
    /// `isolated`, `pending`, `refused`, `error`, `not_ours`, a pass-through reason, or why
    /// the request was refused before it was read (`transport::BodyError::outcome`).
    pub outcome: &'static str,
}

/// Labels of the isolation-failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// `evict` or `delete`.
    pub operation: &'static str,
    /// `controller_selector`, `recreate`, `bad_request`, `unauthorized`, `forbidden`,
    /// `invalid` or `rejected`.
    pub reason: &'static str,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `evict` or `delete`.
    pub operation: &'static str,
}

/// Labels of the balancer-wait histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// Why the wait ended: `let_go` (the balancer no longer routes to the pod), or the
    /// delay kept whole because the balancer `still_routes` to it, `never_routed` to it,
    /// could not be asked (`unreachable`) or the pod's `address_unknown`.
    pub ended: &'static str,
}

/// Labels of the balancer-ask counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AskLabels {
    /// `answered`, or `failed` (timeout, error, an answer that could not be read).
    pub result: &'static str,
}

/// Every webhook metric.
#[derive(Debug)]
pub struct Metrics {
    /// `reviews`: admission reviews answered, by operation and outcome.
    pub reviews: Family<ReviewLabels, Counter>,
    /// `isolation_failures`: requests let through unprotected because isolation failed
    /// permanently, by operation and reason.
    pub isolation_failures: Family<FailureLabels, Counter>,
    /// `review_duration_seconds`: time to answer a review, holds included, by operation.
    pub latency: Family<OperationLabels, Histogram, fn() -> Histogram>,
    /// `pods_isolated`: pods taken out of their Services and controller.
    pub pods_isolated: Counter,
    /// `pods_deleted`: isolated pods the deferred deleter removed.
    pub pods_deleted: Counter,
    /// `pods_restored`: isolated pods put back because no eviction or DELETE removed them.
    pub pods_restored: Counter,
    /// `pending_deletions`: isolated pods the deleter tracks that are not yet terminating.
    pub pending_deletions: Gauge,
    /// `holds_in_flight`: DELETE reviews held open right now.
    pub holds_in_flight: Gauge,
    /// `leader`: 1 while this replica holds the deleter Lease, else 0.
    pub leader: Gauge,
    /// From the pod seen isolated to its leaving the last EndpointSlice.
    pub endpoint_removal: Histogram,
    /// `balancer_wait_seconds`: with `--balancer-config`, from a pod seen isolated to the
    /// end of its wait for the balancer, by why it ended (the release module).
    pub balancer_wait: Family<WaitLabels, Histogram, fn() -> Histogram>,
    /// `balancer_asks`: with `--balancer-config`, the questions put to the balancer, by
    /// whether it answered; while it fails, every isolated pod keeps its whole delay.
    pub balancer_asks: Family<AskLabels, Counter>,
    /// `disruptedPods` entries of held pods rewritten before the disruption controller
    /// would drop them (or recorded again after it did).
    pub disruptions_renewed: Counter,
    /// `protection_active`: 1 while this replica's last probe reached the webhook through
    /// the API server, 0 once one did not (see `crate::probe`).
    pub protection_active: Gauge,
    /// `protection_verified_timestamp_seconds`: when a probe last reached the webhook
    /// (Unix time); its age is how long protection has not been proven.
    pub protection_verified: Gauge<f64, std::sync::atomic::AtomicU64>,
}

/// Removal lag buckets (seconds): an idle EndpointSlice controller drops a pod within a
/// second; a busy or throttled one takes tens of seconds or minutes.
fn removal_histogram() -> Histogram {
    Histogram::new([
        0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    ])
}

/// Review latency buckets (seconds): sub-millisecond pass-through up to the 30 s maximum
/// webhook timeout, since held DELETEs last seconds.
fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

impl Metrics {
    /// Creates the metrics and registers them under `graceful_drain_webhook`.
    pub fn new(registry: &mut Registry) -> Metrics {
        let metrics = Metrics {
            reviews: Family::default(),
            isolation_failures: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            pods_isolated: Counter::default(),
            pods_deleted: Counter::default(),
            pods_restored: Counter::default(),
            pending_deletions: Gauge::default(),
            holds_in_flight: Gauge::default(),
            leader: Gauge::default(),
            endpoint_removal: removal_histogram(),
            balancer_wait: Family::new_with_constructor(removal_histogram),
            balancer_asks: Family::default(),
            disruptions_renewed: Counter::default(),
            protection_active: Gauge::default(),
            protection_verified: Gauge::default(),
        };
        let reg = registry.sub_registry_with_prefix("graceful_drain_webhook");
        metrics.register_reviews(reg);
        metrics.register_pods(reg);
        metrics
    }

    /// Registers what counts the reviews and the protection.
    fn register_reviews(&self, reg: &mut Registry) {
        reg.register(
            "reviews",
            "Admission reviews by operation and outcome",
            self.reviews.clone(),
        );
        reg.register(
            "isolation_failures",
            "Requests let through unprotected because isolation failed permanently",
            self.isolation_failures.clone(),
        );
        reg.register(
            "review_duration_seconds",
            "Time to answer an admission review, holds included",
            self.latency.clone(),
        );
        reg.register(
            "holds_in_flight",
            "DELETE reviews currently held",
            self.holds_in_flight.clone(),
        );
        reg.register(
            "protection_active",
            "1 while this replica's last probe (a dry-run eviction) reached the webhook through the API server, 0 once one did not",
            self.protection_active.clone(),
        );
        reg.register(
            "protection_verified_timestamp_seconds",
            "When a probe last reached the webhook through the API server (Unix time)",
            self.protection_verified.clone(),
        );
    }

    /// Registers what counts the pods isolated, deleted and put back.
    fn register_pods(&self, reg: &mut Registry) {
        reg.register(
            "pods_isolated",
            "Pods isolated from their Services and controller",
            self.pods_isolated.clone(),
        );
        reg.register(
            "pods_deleted",
            "Isolated pods deleted by the deferred deleter",
            self.pods_deleted.clone(),
        );
        reg.register(
            "pods_restored",
            "Isolated pods put back into their Services because no eviction or DELETE removed them",
            self.pods_restored.clone(),
        );
        reg.register(
            "pending_deletions",
            "Isolated pods waiting for deletion",
            self.pending_deletions.clone(),
        );
        reg.register(
            "leader",
            "1 while this replica holds the deleter Lease",
            self.leader.clone(),
        );
        reg.register(
            "endpoint_removal_seconds",
            "Time from a pod seen isolated to its leaving the last EndpointSlice that listed it",
            self.endpoint_removal.clone(),
        );
        reg.register(
            "balancer_wait_seconds",
            "Time from a pod seen isolated to the end of its wait for the configured load balancer, by why it ended",
            self.balancer_wait.clone(),
        );
        reg.register(
            "balancer_asks",
            "Questions put to the configured load balancer, by whether it answered",
            self.balancer_asks.clone(),
        );
        reg.register(
            "disruptions_renewed",
            "PDB disruptedPods entries of held pods rewritten so the disruption controller keeps counting them as disrupted",
            self.disruptions_renewed.clone(),
        );
    }

    /// Records how long one pod waited for the configured balancer and why it stopped.
    pub fn balancer_wait(&self, ended: &'static str, seconds: f64) {
        self.balancer_wait
            .get_or_create(&WaitLabels { ended })
            .observe(seconds);
    }

    /// Counts one request let through because its pod could not be isolated.
    pub fn isolation_failure(&self, operation: &'static str, reason: &'static str) {
        self.isolation_failures
            .get_or_create(&FailureLabels { operation, reason })
            .inc();
    }

    /// Counts one review.
    pub fn review(&self, operation: &'static str, outcome: &'static str, seconds: f64) {
        self.reviews
            .get_or_create(&ReviewLabels { operation, outcome })
            .inc();
        self.latency
            .get_or_create(&OperationLabels { operation })
            .observe(seconds);
    }
}
