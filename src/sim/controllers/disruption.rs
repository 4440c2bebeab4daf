//! The simulated disruption controller, as
//! `system:serviceaccount:kube-system:disruption-controller`: keeps every
//! PodDisruptionBudget's status (currentHealthy, desiredHealthy, expectedPods,
//! disruptionsAllowed, disruptedPods, observedGeneration, the DisruptionAllowed
//! condition) in line with its pods, which is what the API server's eviction reads.
//!
//! A pod listed in `status.disruptedPods` (put there by an eviction) counts as disrupted
//! until it is deleting or gone, or [`DELETION_TIMEOUT`] has passed. Status writes carry
//! the cached resourceVersion, so they never overwrite an eviction's decrement unseen.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::PostParams;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::{
    Result, Watches, api_err, controller_of, labels_of, next_pass, ns_name, pod_ready, ready,
    scaled, selector_matches, status_code,
};
use crate::runtime::Shutdown;

/// How long a pod listed in `disruptedPods` counts as disrupted without being deleted
/// (the upstream `DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// Scale lookups for percentages and maxUnavailable: the replicas of a pod's
/// controller (a ReplicaSet owned by a Deployment counts with the Deployment's).
pub struct Scales<'a> {
    pub sets: &'a [Arc<ReplicaSet>],
    pub deployments: &'a [Arc<Deployment>],
}

impl Scales<'_> {
    fn of(&self, pod: &Pod) -> Option<(String, i32)> {
        let owner = controller_of(pod)?;
        if owner.kind != "ReplicaSet" {
            return None;
        }
        let rs = self
            .sets
            .iter()
            .find(|r| r.uid().as_deref() == Some(owner.uid.as_str()))?;
        if let Some(d_ref) = controller_of(&**rs).filter(|o| o.kind == "Deployment") {
            let d = self
                .deployments
                .iter()
                .find(|d| d.uid().as_deref() == Some(d_ref.uid.as_str()))?;
            return Some((
                d_ref.uid.clone(),
                d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            ));
        }
        Some((
            owner.uid.clone(),
            rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        ))
    }
}

/// The status `pdb` should have at `now` given the pods of its namespace.
pub fn compute_status(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    scales: &Scales<'_>,
    now: jiff::Timestamp,
) -> Result<PodDisruptionBudgetStatus> {
    let spec = pdb.spec.clone().unwrap_or_default();
    let selector = spec.selector.clone().unwrap_or_default();
    let matching: Vec<&Pod> = pods
        .iter()
        .map(|p| &**p)
        .filter(|p| selector_matches(&selector, &labels_of(*p)))
        .collect();
    let old = pdb.status.as_ref().and_then(|s| s.disrupted_pods.clone());
    let disrupted = still_disrupted(old.unwrap_or_default(), &matching, now);
    let healthy = matching
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && pod_ready(p)
                && !disrupted.contains_key(&p.name_any())
        })
        .count();
    let current_healthy = i32::try_from(healthy).unwrap_or(i32::MAX);
    let (expected, desired) = expected_and_desired(&spec, &matching, scales)?;
    let allowed = (current_healthy - desired).max(0);
    Ok(PodDisruptionBudgetStatus {
        current_healthy,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        observed_generation: pdb.metadata.generation,
        conditions: Some(vec![condition(pdb, allowed > 0, now)]),
    })
}

/// The `disruptedPods` entries still in force: the pod exists, is not being deleted,
/// and was disrupted less than [`DELETION_TIMEOUT`] ago.
fn still_disrupted(
    old: BTreeMap<String, Time>,
    matching: &[&Pod],
    now: jiff::Timestamp,
) -> BTreeMap<String, Time> {
    let timeout = i64::try_from(DELETION_TIMEOUT.as_secs()).unwrap_or(i64::MAX);
    old.into_iter()
        .filter(|(name, at)| {
            let live = matching
                .iter()
                .any(|p| &p.name_any() == name && p.metadata.deletion_timestamp.is_none());
            live && at.0.as_second().saturating_add(timeout) > now.as_second()
        })
        .collect()
}

/// `(expectedPods, desiredHealthy)`: an integer minAvailable counts the pods; a
/// percentage or maxUnavailable counts the replicas their controllers ask for.
fn expected_and_desired(
    spec: &PodDisruptionBudgetSpec,
    matching: &[&Pod],
    scales: &Scales<'_>,
) -> Result<(i32, i32)> {
    let pod_count = i32::try_from(matching.len()).unwrap_or(i32::MAX);
    let controller_scale = || {
        let mut seen = HashSet::new();
        let sum: i32 = matching
            .iter()
            .filter_map(|p| scales.of(p))
            .filter(|(uid, _)| seen.insert(uid.clone()))
            .map(|(_, n)| n)
            .sum();
        sum.max(pod_count)
    };
    let (expected, desired) = match (spec.max_unavailable.as_ref(), spec.min_available.as_ref()) {
        (Some(max_unavailable), _) => {
            let expected = controller_scale();
            (
                expected,
                expected - scaled(Some(max_unavailable), expected, "0", true)?,
            )
        }
        (None, Some(v @ IntOrString::String(_))) => {
            let expected = controller_scale();
            (expected, scaled(Some(v), expected, "0", true)?)
        }
        (None, Some(v)) => (pod_count, scaled(Some(v), pod_count, "0", true)?),
        (None, None) => (pod_count, pod_count),
    };
    Ok((expected, desired.max(0)))
}

/// The DisruptionAllowed condition, keeping its transition time while unchanged.
fn condition(pdb: &PodDisruptionBudget, allowed: bool, now: jiff::Timestamp) -> Condition {
    let status = if allowed { "True" } else { "False" };
    let since = pdb
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "DisruptionAllowed" && c.status == status)
        })
        .map(|c| c.last_transition_time.clone());
    Condition {
        type_: "DisruptionAllowed".into(),
        status: status.into(),
        reason: if allowed {
            "SufficientPods"
        } else {
            "InsufficientPods"
        }
        .into(),
        message: String::new(),
        observed_generation: pdb.metadata.generation,
        last_transition_time: since.unwrap_or(Time(now)),
    }
}

/// When the earliest `disruptedPods` entry of `status` expires.
fn next_expiry(status: &PodDisruptionBudgetStatus, now: jiff::Timestamp) -> Option<Instant> {
    let earliest = status
        .disrupted_pods
        .as_ref()?
        .values()
        .map(|t| t.0)
        .min()?;
    let left = earliest.as_second() + DELETION_TIMEOUT.as_secs() as i64 - now.as_second();
    Some(Instant::now() + Duration::from_secs(u64::try_from(left.max(0)).unwrap_or(0) + 1))
}

struct Controller {
    client: kube::Client,
    pdbs: Store<PodDisruptionBudget>,
    pods: Store<Pod>,
    sets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
}

impl Controller {
    async fn pass(&mut self) -> Option<Instant> {
        let now = jiff::Timestamp::now();
        let (sets, deployments) = (self.sets.state(), self.deployments.state());
        let scales = Scales {
            sets: &sets,
            deployments: &deployments,
        };
        let mut by_ns: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for pod in self.pods.state() {
            by_ns
                .entry(pod.namespace().unwrap_or_default())
                .or_default()
                .push(pod);
        }
        let mut next = None;
        for pdb in self.pdbs.state() {
            let pods = by_ns
                .get(&pdb.namespace().unwrap_or_default())
                .cloned()
                .unwrap_or_default();
            let (ns, name) = ns_name(&*pdb);
            let status = match compute_status(&pdb, &pods, &scales, now) {
                Ok(status) => status,
                Err(error) => {
                    tracing::info!(pdb = %format!("{ns}/{name}"), %error, "cannot compute status");
                    continue;
                }
            };
            if let Some(at) = next_expiry(&status, now) {
                next = Some(next.map_or(at, |n: Instant| n.min(at)));
            }
            if pdb.status.as_ref() == Some(&status) {
                continue;
            }
            if let Err(error) = self.write(&pdb, status).await {
                tracing::debug!(%error, "pdb status write failed; will retry");
            }
        }
        next
    }

    async fn write(
        &self,
        pdb: &PodDisruptionBudget,
        status: PodDisruptionBudgetStatus,
    ) -> Result<()> {
        let (ns, name) = ns_name(pdb);
        let mut updated = pdb.clone();
        updated.status = Some(status);
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &ns);
        match api
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            Err(e) if status_code(&e) != Some(404) => {
                Err(api_err("update status of", format!("pdb {ns}/{name}"))(e))
            }
            _ => Ok(()),
        }
    }
}

/// Runs the disruption controller until `shutdown`.
pub async fn run(client: kube::Client, shutdown: Shutdown) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let pdbs = watches.all::<PodDisruptionBudget>();
    let pods = watches.all::<Pod>();
    let sets = watches.all::<ReplicaSet>();
    let deployments = watches.all::<Deployment>();
    if !(ready(&pdbs, &shutdown).await
        && ready(&pods, &shutdown).await
        && ready(&sets, &shutdown).await
        && ready(&deployments, &shutdown).await)
    {
        return Ok(());
    }
    let mut ctl = Controller {
        client,
        pdbs,
        pods,
        sets,
        deployments,
    };
    loop {
        let next = ctl.pass().await;
        if !next_pass(&wake, &shutdown, next).await {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, PdbFixture, PodFixture};

    fn pdb(min_available: i32, disrupted: &[(&str, i64)]) -> PodDisruptionBudget {
        fixtures::pdb("web")
            .ns("ns")
            .generation(3)
            .min_available(min_available)
            .selecting(&[("app", "web")])
            .disrupted(disrupted)
    }

    fn pod(name: &str, ready: bool) -> Arc<Pod> {
        Arc::new(fixtures::pod(name).label("app", "web").ready_is(ready))
    }

    #[test]
    fn disrupted_pods_count_until_timeout() {
        let now = jiff::Timestamp::from_second(1_000_000).unwrap();
        let scales = Scales {
            sets: &[],
            deployments: &[],
        };
        let pods = vec![
            pod("a", true),
            pod("b", true),
            pod("c", true),
            pod("d", false),
        ];
        let s = compute_status(
            &pdb(2, &[("a", 1_000_000 - 10), ("gone", 999_999)]),
            &pods,
            &scales,
            now,
        )
        .unwrap();
        assert_eq!(
            (
                s.current_healthy,
                s.desired_healthy,
                s.expected_pods,
                s.disruptions_allowed
            ),
            (2, 2, 4, 0)
        );
        assert_eq!(
            s.disrupted_pods
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            vec!["a"]
        );
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.conditions.as_ref().unwrap()[0].reason, "InsufficientPods");
        // Two minutes later the entry expires and the pod counts as healthy again.
        let s = compute_status(&pdb(2, &[("a", 1_000_000 - 121)]), &pods, &scales, now).unwrap();
        assert_eq!((s.current_healthy, s.disruptions_allowed), (3, 1));
        assert!(s.disrupted_pods.is_none());
    }
}
