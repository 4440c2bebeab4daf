//! What a scenario of the matrix is (its workload, disruption and budget), what one run
//! of it yields, and the two helpers the scenarios of other modules share with the matrix:
//! setting the budget and counting pods deleted unprotected.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

use super::{Error, Measured, ScenarioConfig};
use kube_sim::cluster::{DataPlane, wait_for};
use kube_sim::traffic::timeline::{Event, EventKind};

/// What a scenario disrupts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// Drain the node running most pods.
    Drain,
    /// Drain the two nodes running most pods, at the same time.
    DrainTwoNodes,
    /// Drain the busiest node; restart its node agent once the first pod is isolated.
    DrainRestartingAgent,
    /// Drain the busiest node; roll the webhook over to a new replica once the first pod
    /// is isolated.
    DrainRollingWebhook,
    /// Drain the busiest node of a cluster whose nodes also host VMs (the simulated VM
    /// host, [`crate::vmhost`]), then return it to service; with graceful-drain its
    /// maintenance hooks move the VMs away before any eviction and enable the node again
    /// after the uncordon (the `vm-evacuation-drain` scenario).
    DrainWithVms,
    /// `kubectl rollout restart` of the Deployment.
    Rollout,
}

/// The PodDisruptionBudget of a scenario's workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budget {
    /// `minAvailable: replicas - 1`, what `simulate` deploys by default.
    Default,
    /// This `minAvailable`, a pod count or a percentage.
    MinAvailable(IntOrString),
    /// `minAvailable` = replicas: no disruption to spare.
    AllReplicas,
    /// This `maxUnavailable`, a pod count or a percentage, instead of `minAvailable`.
    MaxUnavailable(IntOrString),
    /// No PDB at all.
    None,
}

/// The workload a scenario runs behind its load balancer (named `cfg.web.name`, with a
/// LoadBalancer Service and the PDB of [`Budget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// The standard Deployment of `simulate`.
    Deployment,
    /// A StatefulSet (Parallel pod management) selecting `app` only; its Service selects
    /// `app` and `role`, a key of its own, so the webhook can take a pod out of the
    /// Service without releasing it from the StatefulSet.
    StatefulSet,
    /// The same StatefulSet behind a Service that selects only the StatefulSet's own key:
    /// the webhook refuses to release the pods, so they go unprotected (with a Warning).
    StatefulSetSharedSelector,
    /// A DaemonSet (maxUnavailable 1) behind a Service with a key of its own.
    DaemonSet,
    /// The standard Deployment with the `Recreate` strategy: its old and new pods must
    /// never serve together, so graceful-drain lets them go unprotected (with a Warning
    /// Event) and the rollout has a gap with or without it.
    DeploymentRecreate,
    /// The standard Deployment plus a batch Job spread over every node, whose
    /// podFailurePolicy ignores disruptions: it must complete without a counted failure.
    DeploymentWithJob,
    /// The standard Deployment plus, on the drained node, a DNS-like pod of priority class
    /// `system-cluster-critical` and an ingress-like pod the node agents'
    /// `--last-pod-selector` picks (see [`super::tiered`]): with protection, each tier
    /// must be gone before the next one is evicted.
    DeploymentWithTiers,
}

/// One named scenario of the matrix.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Unique name, what `--scenario` takes and the table shows.
    pub name: &'static str,
    /// One line for `--help`-like listings and docs/simulate.md.
    pub about: &'static str,
    /// What runs behind the load balancer.
    pub workload: Workload,
    /// What is done to it.
    pub disruption: Disruption,
    /// The PodDisruptionBudget that guards it.
    pub budget: Budget,
    /// Changes to the base configuration (timings, faults, grace periods).
    pub tweak: fn(&mut ScenarioConfig),
    /// Whether the protected row is expected to show 5xx (a lag beyond the delay).
    pub protected_5xx: bool,
    /// Whether the unprotected row is expected to show 5xx (not when nothing serving is
    /// disrupted, as in a drain that leaves DaemonSet pods alone).
    pub unprotected_5xx: bool,
}

/// A scenario that keeps the base configuration.
pub fn no_tweak(_: &mut ScenarioConfig) {}

impl Scenario {
    /// A Deployment scenario expecting no 5xx with protection; refine with struct update
    /// syntax (`Scenario { protected_5xx: true, ..Scenario::new(...) }`).
    pub fn new(
        name: &'static str,
        about: &'static str,
        disruption: Disruption,
        budget: Budget,
        tweak: fn(&mut ScenarioConfig),
    ) -> Self {
        Self {
            name,
            about,
            workload: Workload::Deployment,
            disruption,
            budget,
            tweak,
            protected_5xx: false,
            unprotected_5xx: true,
        }
    }
}

/// What one run measured and checked.
pub(super) struct Outcome {
    pub(super) measured: Measured,
    /// Pods deleted unprotected (see [`unprotected_deletions`]).
    pub(super) unprotected: usize,
    /// A scenario's own check: a note when it held, the problem when not.
    pub(super) checked: Option<Result<String, String>>,
}

/// Replaces the default PDB as `budget` says.
pub(super) async fn set_budget(
    cluster: &DataPlane,
    cfg: &ScenarioConfig,
    budget: &Budget,
) -> Result<(), Error> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), &cfg.web.namespace);
    let name = &cfg.web.name;
    let object = format!("pdb {}", cfg.web.service_key());
    let spec = match budget {
        Budget::Default => return Ok(()),
        Budget::None => {
            return api
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ())
                .map_err(|source| Error::Api {
                    action: "delete",
                    object,
                    source,
                });
        }
        Budget::MinAvailable(v) => serde_json::json!({"minAvailable": v, "maxUnavailable": null}),
        Budget::AllReplicas => {
            serde_json::json!({"minAvailable": cfg.web.replicas, "maxUnavailable": null})
        }
        Budget::MaxUnavailable(v) => serde_json::json!({"minAvailable": null, "maxUnavailable": v}),
    };
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": spec })),
    )
    .await
    .map_err(|source| Error::Api {
        action: "patch",
        object: object.clone(),
        source,
    })?;
    // Wait until the disruption controller has observed the new spec, as a user would
    // before draining.
    wait_for(&format!("{object} observed"), cfg.phase_timeout, || async {
        api.get(name).await.is_ok_and(|p| {
            let observed = p.status.as_ref().and_then(|s| s.observed_generation);
            observed.is_some() && observed == p.metadata.generation
        })
    })
    .await?;
    Ok(())
}

/// Pods whose app stopped accepting new requests while the load balancer still routed
/// to them: no deregistration since the last registration. Only stops at or after
/// `from` (time since the timeline's start) count.
pub fn unprotected_deletions(events: &[Event], from: Duration) -> usize {
    let mut registered: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut deregistered: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut unprotected: BTreeSet<&str> = BTreeSet::new();
    for event in events {
        let pod = event.subject.as_str();
        match event.kind {
            EventKind::Registered => {
                registered.insert(pod, event.at);
            }
            EventKind::Deregistered => {
                deregistered.insert(pod, event.at);
            }
            EventKind::StoppedAccepting if event.at >= from => {
                let Some(&since) = registered.get(pod) else {
                    continue;
                };
                let left = deregistered
                    .get(pod)
                    .is_some_and(|&d| d >= since && d <= event.at);
                if !left {
                    unprotected.insert(pod);
                }
            }
            _ => {}
        }
    }
    unprotected.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(at_ms: u64, kind: EventKind, pod: &str) -> Event {
        Event {
            at: Duration::from_millis(at_ms),
            kind,
            subject: pod.into(),
        }
    }

    #[test]
    fn a_pod_stopping_before_its_deregistration_counts_as_unprotected() {
        let events = vec![
            ev(100, EventKind::Registered, "d/a"),
            ev(100, EventKind::Registered, "d/b"),
            ev(100, EventKind::Registered, "d/c"),
            // a: deregistered, then stopped: protected.
            ev(5_000, EventKind::Deregistered, "d/a"),
            ev(6_000, EventKind::StoppedAccepting, "d/a"),
            // b: stopped while still routed (its deregistration comes later).
            ev(6_000, EventKind::StoppedAccepting, "d/b"),
            ev(9_000, EventKind::Deregistered, "d/b"),
            // c: stopped before the window: not this disruption's.
            ev(500, EventKind::StoppedAccepting, "d/c"),
            // A same-name replacement registered again, stopped while routed.
            ev(7_000, EventKind::Registered, "d/a"),
            ev(8_000, EventKind::StoppedAccepting, "d/a"),
            // Never registered: the load balancer never routed to it.
            ev(8_000, EventKind::StoppedAccepting, "d/never"),
        ];
        assert_eq!(unprotected_deletions(&events, Duration::from_secs(1)), 2);
        let protected = &events[..5];
        assert_eq!(unprotected_deletions(protected, Duration::from_secs(1)), 0);
    }
}
