//! Prometheus metrics of the lifecycle reconciler, served on the node agent's admin port:
//! LifecycleEvents by the claim status they reached, and calls to the SLM driver by
//! method and outcome. Labels are bounded (statuses, two methods, three outcomes).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use graceful_drain_core::lifecycle::ClaimStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: &'static str,
    outcome: &'static str,
}

/// The reconciler's metrics. Cloning shares the same series; [`Metrics::default`] gives
/// unregistered series (tests, embedders without an admin port).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    events: Family<StatusLabels, Counter>,
    calls: Family<CallLabels, Counter>,
}

/// How a driver call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// The driver answered without an `error`.
    Ok,
    /// The driver answered with a non-empty `error`.
    DriverError,
    /// The call failed (unreachable driver, gRPC error, timeout).
    Failed,
}

impl Metrics {
    /// Registers the series under `graceful_drain_lifecycle_…` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let sub = registry.sub_registry_with_prefix("graceful_drain_lifecycle");
        sub.register(
            "events",
            "LifecycleEvents this reconciler moved to a claim status (Claimed, Succeeded, Failed, SlaExpired)",
            metrics.events.clone(),
        );
        sub.register(
            "driver_calls",
            "SLM driver calls by method and outcome (ok, driver_error, failed)",
            metrics.calls.clone(),
        );
        metrics
    }

    /// Counts an event reaching `status`.
    pub fn event(&self, status: ClaimStatus) {
        self.events
            .get_or_create(&StatusLabels {
                status: status.to_string(),
            })
            .inc();
    }

    /// Counts one driver call.
    pub fn call(&self, method: &'static str, outcome: CallOutcome) {
        let outcome = match outcome {
            CallOutcome::Ok => "ok",
            CallOutcome::DriverError => "driver_error",
            CallOutcome::Failed => "failed",
        };
        self.calls
            .get_or_create(&CallLabels { method, outcome })
            .inc();
    }

    /// Events counted with `status` so far.
    pub fn events_with(&self, status: ClaimStatus) -> u64 {
        self.events
            .get_or_create(&StatusLabels {
                status: status.to_string(),
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_series_are_exported_with_the_prefix() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.event(ClaimStatus::Claimed);
        metrics.event(ClaimStatus::Succeeded);
        metrics.call("StartLifecycleTransition", CallOutcome::Ok);
        metrics.call("EndLifecycleTransition", CallOutcome::DriverError);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"graceful_drain_lifecycle_events_total{status="Succeeded"} 1"#),
            "{text}"
        );
        assert!(text.contains(
            r#"graceful_drain_lifecycle_driver_calls_total{method="EndLifecycleTransition",outcome="driver_error"} 1"#
        ), "{text}");
        assert_eq!(metrics.events_with(ClaimStatus::Claimed), 1);
        assert_eq!(metrics.events_with(ClaimStatus::Failed), 0);
    }
}
