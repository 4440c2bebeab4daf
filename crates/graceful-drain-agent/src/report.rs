//! How the agent tells people what it does: Prometheus metrics (bounded labels, never a
//! pod name) and core/v1 Events on the Node, where `kubectl describe node` shows them
//! (their reasons are [`graceful_drain_core::labels::agent_reason`]).
//!
//! Events for the same pod and reason are rate-limited, so a drain blocked by a PDB and
//! retrying every few seconds leaves one Event per pod every few minutes, not hundreds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, PostParams};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::node::API_TIMEOUT;

/// A repeated Event (same pod, same reason) is posted at most this often: long enough not
/// to flood `kubectl describe node` while a blocked eviction retries every few seconds,
/// short enough that a stuck drain keeps showing among the recent Events.
const EVENT_REPEAT_INTERVAL: Duration = Duration::from_secs(300);
/// Component name on our Events.
const COMPONENT: &str = "graceful-drain-node-agent";
/// Namespace of Events about cluster-scoped objects such as Nodes (as the kubelet does).
const NODE_EVENT_NAMESPACE: &str = "default";

/// Outcome of one eviction (or delete) request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// 201: the eviction was accepted.
    Evicted,
    /// 200/202 on a DELETE (`--disable-eviction`).
    Deleted,
    /// 404: the pod was already gone.
    Gone,
    /// 409: the UID precondition failed (a new pod took the name); ours is gone.
    Conflict,
    /// 429: a PDB has no disruption left.
    BlockedPdb,
    /// 500: more than one PDB selects the pod.
    MultiplePdbs,
    /// An admission webhook denied the request.
    DeniedWebhook,
    /// 429 without a disruption-budget cause: API Priority and Fairness shed the request.
    Throttled,
    /// 429 from our webhook: the pod is isolated and leaving its load balancers; the
    /// eviction goes through once it is due.
    Deregistering,
    /// Any other failure (retried).
    Error,
}

impl EvictionOutcome {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::Deleted => "deleted",
            Self::Gone => "gone",
            Self::Conflict => "conflict",
            Self::BlockedPdb => "blocked_pdb",
            Self::MultiplePdbs => "multiple_pdbs",
            Self::DeniedWebhook => "denied_webhook",
            Self::Throttled => "throttled",
            Self::Deregistering => "deregistering",
            Self::Error => "error",
        }
    }
}

impl EncodeLabelValue for EvictionOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: EvictionOutcome,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every planned pod is gone (label `complete`).
    Complete,
    /// The drain could not finish: a drain error (refused pods, timeout, …) or a failed
    /// hook (label `failed`).
    Failed,
    /// The drain was stopped: SLA expired, event ended, superseded (label `stopped`).
    Stopped,
}

impl EncodeLabelValue for DrainOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let value = match self {
            Self::Complete => "complete",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        };
        std::fmt::Write::write_str(encoder, value)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DrainLabels {
    outcome: DrainOutcome,
}

/// The agent's metrics (prefix `graceful_drain_`).
#[derive(Clone)]
pub struct Metrics {
    evictions: Family<OutcomeLabels, Counter>,
    drain_duration: Family<DrainLabels, Histogram, fn() -> Histogram>,
    pods_remaining: Gauge,
    plugin_registered: Gauge,
}

fn duration_histogram() -> Histogram {
    // 1 s .. ~4.5 h: a drain takes from seconds (empty node) to hours (PDB-limited).
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            evictions: Family::default(),
            drain_duration: Family::new_with_constructor(duration_histogram),
            pods_remaining: Gauge::default(),
            plugin_registered: Gauge::default(),
        };
        let sub = registry.sub_registry_with_prefix("graceful_drain");
        sub.register(
            "evictions",
            "Eviction (or delete) requests sent by the node agent, by outcome",
            metrics.evictions.clone(),
        );
        sub.register(
            "drain_duration_seconds",
            "Wall time of finished drains, by outcome",
            metrics.drain_duration.clone(),
        );
        sub.register(
            "drain_pods_remaining",
            "Pods the current drain still waits for",
            metrics.pods_remaining.clone(),
        );
        sub.register(
            "plugin_registered",
            "1 when the kubelet reported the plugin registered, 0 otherwise",
            metrics.plugin_registered.clone(),
        );
        metrics
    }

    /// Counts one eviction request.
    pub fn eviction(&self, outcome: EvictionOutcome) {
        self.evictions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Records a finished drain.
    pub fn drain_finished(&self, outcome: DrainOutcome, took: Duration) {
        self.drain_duration
            .get_or_create(&DrainLabels { outcome })
            .observe(took.as_secs_f64());
    }

    /// Sets the remaining-pods gauge.
    pub fn set_remaining(&self, n: usize) {
        self.pods_remaining
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Records the kubelet's registration verdict.
    pub fn set_registered(&self, registered: bool) {
        self.plugin_registered.set(i64::from(registered));
    }
}

/// Whether an Event reports a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Progress worth seeing in `kubectl describe node`.
    Normal,
    /// A problem: something refused, failed or needs an operator.
    Warning,
}

/// Posts Events about one Node.
#[derive(Clone)]
pub struct NodeEvents {
    client: kube::Client,
    node: String,
    /// The Node's UID once known (`kubectl describe node` matches Events on it).
    uid: Arc<Mutex<Option<String>>>,
    /// Last time each (reason, key) was posted, for rate-limiting repeats.
    recent: Arc<Mutex<HashMap<(String, String), Instant>>>,
}

impl NodeEvents {
    /// Events about `node`.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        Self {
            client,
            node: node.into(),
            uid: Arc::default(),
            recent: Arc::default(),
        }
    }

    /// Records the Node's UID for the Events' `involvedObject`.
    pub fn set_node_uid(&self, uid: Option<String>) {
        if uid.is_some() {
            *self.uid.lock().unwrap_or_else(|e| e.into_inner()) = uid;
        }
    }

    /// Posts an Event unless one with the same `reason` and non-empty `key` was posted
    /// within `EVENT_REPEAT_INTERVAL` (an empty key is never rate-limited). Failures are
    /// logged, never fatal: an Event is a report, not part of the drain.
    pub async fn post(&self, type_: EventType, reason: &str, key: &str, message: String) {
        if !key.is_empty() && !self.first_in_interval(reason, key) {
            return;
        }
        let uid = self.uid.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let event = self.build(type_, reason, uid.as_deref(), message);
        let api: Api<Event> = Api::namespaced(self.client.clone(), NODE_EVENT_NAMESPACE);
        match tokio::time::timeout(API_TIMEOUT, api.create(&PostParams::default(), &event)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %graceful_drain_core::error::chain(&error), reason, "post node event")
            }
            Err(_) => tracing::warn!(reason, "post node event: timed out"),
        }
    }

    fn first_in_interval(&self, reason: &str, key: &str) -> bool {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        recent.retain(|_, at| now.duration_since(*at) < EVENT_REPEAT_INTERVAL);
        let entry = (reason.to_string(), key.to_string());
        if recent.contains_key(&entry) {
            return false;
        }
        recent.insert(entry, now);
        true
    }

    /// Forgets the rate limit of `key` (a blocked pod that got through and blocks again
    /// later deserves a fresh Event).
    pub fn forget(&self, key: &str) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.retain(|(_, k), _| k != key);
    }

    fn build(&self, type_: EventType, reason: &str, uid: Option<&str>, message: String) -> Event {
        let now = jiff::Timestamp::now();
        let mut event = Event {
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.node.clone()),
                uid: uid.map(str::to_string),
                ..ObjectReference::default()
            },
            reason: Some(reason.into()),
            message: Some(graceful_drain_core::event::message(message)),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some("Drain".into()),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(format!("{COMPONENT}-{}", self.node)),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.node.clone()),
            }),
            ..Event::default()
        };
        event.metadata.name = Some(format!("{}.{:x}", self.node, now.as_nanosecond()));
        event.metadata.namespace = Some(NODE_EVENT_NAMESPACE.into());
        event
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graceful_drain_core::labels::agent_reason;

    #[tokio::test]
    async fn repeats_are_rate_limited_per_reason_and_key() {
        let (client, _api) = graceful_drain_testing::fixtures::mock::client();
        let events = NodeEvents::new(client, "n1");
        assert!(events.first_in_interval(agent_reason::EVICTION_BLOCKED, "default/web-1"));
        assert!(!events.first_in_interval(agent_reason::EVICTION_BLOCKED, "default/web-1"));
        assert!(events.first_in_interval(agent_reason::EVICTION_BLOCKED, "default/web-2"));
        assert!(events.first_in_interval(agent_reason::DRAIN_FAILED, "default/web-1"));
        events.forget("default/web-1");
        assert!(events.first_in_interval(agent_reason::EVICTION_BLOCKED, "default/web-1"));
    }

    #[test]
    fn metrics_are_exposed_with_bounded_labels() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.eviction(EvictionOutcome::BlockedPdb);
        metrics.eviction(EvictionOutcome::Evicted);
        metrics.set_remaining(3);
        metrics.drain_finished(DrainOutcome::Complete, Duration::from_secs(5));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("graceful_drain_evictions_total{outcome=\"blocked_pdb\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("graceful_drain_drain_pods_remaining 3"),
            "{text}"
        );
        assert!(
            text.contains("graceful_drain_drain_duration_seconds_count{outcome=\"complete\"} 1"),
            "{text}"
        );
    }
}
