//! The simulated disruption controller, as
//! `system:serviceaccount:kube-system:disruption-controller`: keeps every
//! PodDisruptionBudget's status (currentHealthy, desiredHealthy, expectedPods,
//! disruptionsAllowed, disruptedPods, observedGeneration, the DisruptionAllowed
//! condition) in line with its pods, which is what the API server's eviction reads.
//!
//! The arithmetic is upstream's (pkg/controller/disruption/disruption.go): an integer
//! minAvailable counts the selected pods; a percentage or maxUnavailable counts the
//! replicas of the pods' controllers, read from their scale (ReplicaSets, Deployments and
//! StatefulSets from watches, other owners through their `scale` subresource), rounding
//! percentages up. Pods without a controller are skipped (event `UnmanagedPods`); an
//! owner without a scale subresource, or one that cannot be found, fails the sync, which
//! leaves `disruptionsAllowed` at 0 (`failSafe`); so does an `expectedPods` of 0.
//!
//! A pod listed in `status.disruptedPods` (put there by an eviction) counts as disrupted
//! until it is deleting or gone, or the deletion timeout (upstream `DeletionTimeout`,
//! [`DELETION_TIMEOUT`], a setting here) has passed; then it counts as healthy again if
//! Ready. Status writes carry the cached resourceVersion, so they never overwrite an
//! eviction's decrement unseen.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DynamicObject, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};

use super::{
    Reconciler, Result, Watches, api_err, by_namespace, controller_of, labels_of, ns_name,
    pod_ready, ready, run_passes, scaled, selector_matches, status_code,
};
use tokio_util::sync::CancellationToken;

/// How long a pod listed in `disruptedPods` counts as disrupted without being deleted
/// (the upstream `DeletionTimeout`, two minutes).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// A pod controller's scale, as upstream's scale finders see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scale {
    /// The controller counted (by uid) and the replicas it asks for.
    Found {
        /// UID of the controller whose replicas count (a Deployment for its ReplicaSets),
        /// so pods of one controller are counted once.
        uid: String,
        /// Its `spec.replicas` (1 when unset).
        replicas: i32,
    },
    /// No such controller ("found no controllers for pod").
    Missing,
    /// The owner cannot be scaled; the message says why.
    Unscalable(String),
}

/// Scale lookups: the watched ReplicaSets, Deployments and StatefulSets, plus the scales
/// of other owners fetched through their `scale` subresource (by owner uid).
pub struct Scales<'a> {
    /// Every watched ReplicaSet (all namespaces).
    pub sets: &'a [Arc<ReplicaSet>],
    /// Every watched Deployment (all namespaces).
    pub deployments: &'a [Arc<Deployment>],
    /// Every watched StatefulSet (all namespaces).
    pub statefulsets: &'a [Arc<StatefulSet>],
    /// Scales of any other controlling owner, by the owner's UID; an owner missing here
    /// counts as [`Scale::Missing`].
    pub others: &'a HashMap<String, Scale>,
}

fn found<K: Resource>(obj: &K, replicas: Option<i32>) -> Scale {
    Scale::Found {
        uid: obj.meta().uid.clone().unwrap_or_default(),
        replicas: replicas.unwrap_or(1),
    }
}

fn by_ref<'a, K: Resource>(list: &'a [Arc<K>], ns: &str, owner: &OwnerReference) -> Option<&'a K> {
    list.iter().map(|o| &**o).find(|o| {
        o.meta().name.as_deref() == Some(owner.name.as_str())
            && o.meta().namespace.as_deref() == Some(ns)
            && o.meta().uid.as_deref() == Some(owner.uid.as_str())
    })
}

impl Scales<'_> {
    /// The scale that counts for a pod controlled by `owner` in `ns`: a ReplicaSet owned
    /// by a Deployment counts with the Deployment's.
    pub fn of(&self, ns: &str, owner: &OwnerReference) -> Scale {
        let apps = owner.api_version.starts_with("apps/");
        match owner.kind.as_str() {
            "ReplicaSet" if apps => {
                let Some(rs) = by_ref(self.sets, ns, owner) else {
                    return Scale::Missing;
                };
                match controller_of(rs).filter(|o| o.kind == "Deployment") {
                    Some(d_ref) => self.deployment(ns, d_ref),
                    None => found(rs, rs.spec.as_ref().and_then(|s| s.replicas)),
                }
            }
            "Deployment" if apps => self.deployment(ns, owner),
            "StatefulSet" if apps => match by_ref(self.statefulsets, ns, owner) {
                Some(sts) => found(sts, sts.spec.as_ref().and_then(|s| s.replicas)),
                None => Scale::Missing,
            },
            _ => self
                .others
                .get(&owner.uid)
                .cloned()
                .unwrap_or(Scale::Missing),
        }
    }

    fn deployment(&self, ns: &str, owner: &OwnerReference) -> Scale {
        match by_ref(self.deployments, ns, owner) {
            Some(d) => found(d, d.spec.as_ref().and_then(|s| s.replicas)),
            None => Scale::Missing,
        }
    }

    /// Whether `owner` is looked up through its scale subresource.
    fn generic(owner: &OwnerReference) -> bool {
        let apps = owner.api_version.starts_with("apps/");
        !(apps
            && matches!(
                owner.kind.as_str(),
                "ReplicaSet" | "Deployment" | "StatefulSet"
            ))
    }
}

/// One PDB's sync: the status to store and what to report.
#[derive(Clone, Debug, PartialEq)]
pub struct Sync {
    /// The PDB's new status: computed from its pods, or the fail-safe one (the old status
    /// with `disruptionsAllowed` 0 and `DisruptionAllowed=False`, reason `SyncFailed`) when
    /// `error` is set.
    pub status: PodDisruptionBudgetStatus,
    /// Selected pods without a controller (upstream reports them in an event).
    pub unmanaged: Vec<String>,
    /// When the earliest `disruptedPods` entry expires.
    pub recheck: Option<jiff::Timestamp>,
    /// Why the sync failed (the status is then the fail-safe one).
    pub error: Option<String>,
}

/// The pods a PDB selects: none without a selector, all with an empty one (policy/v1).
fn selected<'a>(pdb: &PodDisruptionBudget, pods: &'a [Arc<Pod>]) -> Vec<&'a Pod> {
    let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return Vec::new();
    };
    pods.iter()
        .map(|p| &**p)
        .filter(|p| selector_matches(selector, &labels_of(*p)))
        .collect()
}

/// The status `pdb` should have at `now` given the pods of its namespace.
pub fn compute_status(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    scales: &Scales<'_>,
    now: jiff::Timestamp,
    deletion_timeout: Duration,
) -> Sync {
    let spec = pdb.spec.clone().unwrap_or_default();
    let matching = selected(pdb, pods);
    let (expected, desired, unmanaged) = match expected_and_desired(&spec, &matching, scales) {
        Ok(counts) => counts,
        Err(error) => {
            return Sync {
                status: fail_safe(pdb, &error, now),
                unmanaged: Vec::new(),
                recheck: None,
                error: Some(error),
            };
        }
    };
    let old = pdb.status.as_ref().and_then(|s| s.disrupted_pods.clone());
    let (disrupted, recheck) =
        still_disrupted(old.unwrap_or_default(), &matching, now, deletion_timeout);
    let healthy = matching
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && !disrupted.contains_key(&p.name_any())
                && pod_ready(p)
        })
        .count();
    let current_healthy = i32::try_from(healthy).unwrap_or(i32::MAX);
    // Upstream requires expectedPods > 0, so a PDB whose pods just appeared is safe
    // until this controller has counted them.
    let allowed = match current_healthy - desired {
        n if expected <= 0 || n <= 0 => 0,
        n => n,
    };
    let status = PodDisruptionBudgetStatus {
        current_healthy,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        observed_generation: pdb.metadata.generation,
        conditions: Some(vec![condition(pdb, allowed > 0, None, now)]),
    };
    Sync {
        status,
        unmanaged,
        recheck,
        error: None,
    }
}

/// Upstream `failSafe`: the old status with no disruption allowed and a SyncFailed
/// condition (observedGeneration untouched).
fn fail_safe(
    pdb: &PodDisruptionBudget,
    error: &str,
    now: jiff::Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    status.conditions = Some(vec![condition(pdb, false, Some(error), now)]);
    status
}

/// The `disruptedPods` entries still in force (the pod exists, is not being deleted,
/// and was disrupted less than `timeout` ago) and when the earliest one expires.
fn still_disrupted(
    old: BTreeMap<String, Time>,
    matching: &[&Pod],
    now: jiff::Timestamp,
    timeout: Duration,
) -> (BTreeMap<String, Time>, Option<jiff::Timestamp>) {
    let timeout = jiff::SignedDuration::try_from(timeout).unwrap_or(jiff::SignedDuration::MAX);
    let mut recheck: Option<jiff::Timestamp> = None;
    let mut kept = BTreeMap::new();
    for pod in matching
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let name = pod.name_any();
        let Some(at) = old.get(&name) else {
            continue;
        };
        let expires = at.0.checked_add(timeout).unwrap_or(jiff::Timestamp::MAX);
        if expires > now {
            recheck = Some(recheck.map_or(expires, |r| r.min(expires)));
            kept.insert(name, at.clone());
        }
    }
    (kept, recheck)
}

/// A percentage (or a plain number) of `total`, rounded up, as
/// `intstr.GetScaledValueFromIntOrPercent(v, total, true)`.
fn scaled_up(value: &IntOrString, total: i32) -> std::result::Result<i32, String> {
    scaled(Some(value), total, "0", true).map_err(|e| e.to_string())
}

/// `(expectedPods, desiredHealthy, unmanaged pods)` per upstream `getExpectedPodCount`.
fn expected_and_desired(
    spec: &PodDisruptionBudgetSpec,
    matching: &[&Pod],
    scales: &Scales<'_>,
) -> std::result::Result<(i32, i32, Vec<String>), String> {
    match (spec.max_unavailable.as_ref(), spec.min_available.as_ref()) {
        (Some(max_unavailable), _) => {
            let (expected, unmanaged) = expected_scale(matching, scales)?;
            let desired = (expected - scaled_up(max_unavailable, expected)?).max(0);
            Ok((expected, desired, unmanaged))
        }
        (None, Some(IntOrString::Int(n))) => {
            let count = i32::try_from(matching.len()).unwrap_or(i32::MAX);
            Ok((count, *n, Vec::new()))
        }
        (None, Some(v)) => {
            let (expected, unmanaged) = expected_scale(matching, scales)?;
            Ok((expected, scaled_up(v, expected)?, unmanaged))
        }
        (None, None) => Ok((0, 0, Vec::new())),
    }
}

/// Upstream `getExpectedScale`: the sum of the scales of the pods' controllers, each
/// counted once; pods without a controller are skipped and reported.
fn expected_scale(
    matching: &[&Pod],
    scales: &Scales<'_>,
) -> std::result::Result<(i32, Vec<String>), String> {
    let mut by_controller: HashMap<String, i32> = HashMap::new();
    let mut unmanaged = Vec::new();
    for pod in matching {
        let Some(owner) = controller_of(*pod) else {
            unmanaged.push(pod.name_any());
            continue;
        };
        let ns = pod.namespace().unwrap_or_default();
        match scales.of(&ns, owner) {
            Scale::Found { uid, replicas } => {
                by_controller.insert(uid, replicas);
            }
            Scale::Missing => {
                return Err(format!("found no controllers for pod {:?}", pod.name_any()));
            }
            Scale::Unscalable(why) => return Err(why),
        }
    }
    Ok((by_controller.values().sum(), unmanaged))
}

/// The DisruptionAllowed condition, keeping its transition time while unchanged.
fn condition(
    pdb: &PodDisruptionBudget,
    allowed: bool,
    failure: Option<&str>,
    now: jiff::Timestamp,
) -> Condition {
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
    let reason = match (failure, allowed) {
        (Some(_), _) => "SyncFailed",
        (None, true) => "SufficientPods",
        (None, false) => "InsufficientPods",
    };
    let observed = match failure {
        Some(_) => pdb.status.as_ref().and_then(|s| s.observed_generation),
        None => pdb.metadata.generation,
    };
    Condition {
        type_: "DisruptionAllowed".into(),
        status: status.into(),
        reason: reason.into(),
        message: failure.unwrap_or_default().into(),
        observed_generation: observed,
        last_transition_time: since.unwrap_or(Time(now)),
    }
}

/// The scale of an owner that is not watched here, through its `scale` subresource
/// (upstream `getScaleController`).
async fn fetch_scale(client: &kube::Client, ns: &str, owner: &OwnerReference) -> Scale {
    let (group, version) = owner
        .api_version
        .split_once('/')
        .unwrap_or(("", owner.api_version.as_str()));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, &owner.kind);
    let (resource, caps) = match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(found) => found,
        Err(_) => {
            return Scale::Unscalable(format!(
                "no matches for kind {:?} in version {:?}",
                owner.kind, owner.api_version
            ));
        }
    };
    let resource_name = match resource.group.as_str() {
        "" => resource.plural.clone(),
        g => format!("{}.{g}", resource.plural),
    };
    if !caps.subresources.iter().any(|(r, _)| r.plural == "scale") {
        return Scale::Unscalable(format!(
            "{resource_name} does not implement the scale subresource"
        ));
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    match api.get_scale(&owner.name).await {
        Ok(scale) if scale.metadata.uid.as_deref() == Some(owner.uid.as_str()) => Scale::Found {
            uid: owner.uid.clone(),
            replicas: scale.spec.and_then(|s| s.replicas).unwrap_or(0),
        },
        _ => Scale::Missing,
    }
}

struct Controller {
    client: kube::Client,
    deletion_timeout: Duration,
    pdbs: Store<PodDisruptionBudget>,
    pods: Store<Pod>,
    sets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
    statefulsets: Store<StatefulSet>,
    /// The unmanaged pods last reported per PDB, so each change is one event.
    reported: HashMap<String, Vec<String>>,
}

impl Controller {
    /// Scales of the owners of `pods` that no watch here covers.
    async fn other_scales(&self, pods: &[&Pod]) -> HashMap<String, Scale> {
        let mut others = HashMap::new();
        for pod in pods {
            let Some(owner) = controller_of(*pod).filter(|o| Scales::generic(o)) else {
                continue;
            };
            if others.contains_key(&owner.uid) {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let scale = fetch_scale(&self.client, &ns, owner).await;
            others.insert(owner.uid.clone(), scale);
        }
        others
    }
}

impl Reconciler for Controller {
    async fn pass(&mut self) -> Option<Instant> {
        let now = jiff::Timestamp::now();
        let (sets, deployments) = (self.sets.state(), self.deployments.state());
        let statefulsets = self.statefulsets.state();
        let by_ns = by_namespace(&self.pods.state());
        let mut next = None;
        for pdb in self.pdbs.state() {
            let pods = by_ns
                .get(&pdb.namespace().unwrap_or_default())
                .cloned()
                .unwrap_or_default();
            let others = self.other_scales(&selected(&pdb, &pods)).await;
            let scales = Scales {
                sets: &sets,
                deployments: &deployments,
                statefulsets: &statefulsets,
                others: &others,
            };
            let sync = compute_status(&pdb, &pods, &scales, now, self.deletion_timeout);
            let (ns, name) = ns_name(&*pdb);
            if let Some(error) = &sync.error {
                tracing::info!(pdb = %format!("{ns}/{name}"), %error, "failed to sync PDB");
            }
            self.report_unmanaged(&pdb, &sync.unmanaged).await;
            if let Some(at) = sync.recheck {
                let left = at.duration_since(now).unsigned_abs();
                let at = Instant::now() + left + Duration::from_millis(10);
                next = Some(next.map_or(at, |n: Instant| n.min(at)));
            }
            if pdb.status.as_ref() == Some(&sync.status) {
                continue;
            }
            tracing::debug!(
                pdb = %format!("{ns}/{name}"),
                healthy = sync.status.current_healthy,
                allowed = sync.status.disruptions_allowed,
                disrupted = ?sync.status.disrupted_pods.as_ref().map(|d| d.keys().collect::<Vec<_>>()),
                "pdb status"
            );
            if let Err(error) = self.write(&pdb, sync.status).await {
                tracing::debug!(%error, "pdb status write failed; will retry");
            }
        }
        next
    }
}

impl Controller {
    /// A Warning event `UnmanagedPods` on the PDB when its set of unmanaged pods changed.
    async fn report_unmanaged(&mut self, pdb: &PodDisruptionBudget, unmanaged: &[String]) {
        let (ns, name) = ns_name(pdb);
        let key = format!("{ns}/{name}");
        if self
            .reported
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default()
            == unmanaged
        {
            return;
        }
        self.reported.insert(key, unmanaged.to_vec());
        if unmanaged.is_empty() {
            return;
        }
        let selector = pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .map(|s| serde_json::to_string(s).unwrap_or_default())
            .unwrap_or_default();
        let message = format!(
            "Pods selected by this PodDisruptionBudget (selector: {selector}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value."
        );
        let now = Time(jiff::Timestamp::now());
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.")),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("policy/v1".into()),
                kind: Some("PodDisruptionBudget".into()),
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                uid: pdb.metadata.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some("UnmanagedPods".into()),
            message: Some(message),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some("controllermanager".into()),
                host: None,
            }),
            ..Event::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        if let Err(error) = events.create(&PostParams::default(), &event).await {
            tracing::debug!(%error, "record UnmanagedPods event");
        }
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

/// Runs the disruption controller until `shutdown`; a pod in `disruptedPods` counts as
/// disrupted for at most `deletion_timeout`.
pub async fn run(
    client: kube::Client,
    shutdown: CancellationToken,
    deletion_timeout: Duration,
) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let pdbs = watches.all::<PodDisruptionBudget>();
    let pods = watches.all::<Pod>();
    let sets = watches.all::<ReplicaSet>();
    let deployments = watches.all::<Deployment>();
    let statefulsets = watches.all::<StatefulSet>();
    if !(ready(&pdbs, &shutdown).await
        && ready(&pods, &shutdown).await
        && ready(&sets, &shutdown).await
        && ready(&deployments, &shutdown).await
        && ready(&statefulsets, &shutdown).await)
    {
        return Ok(());
    }
    let ctl = Controller {
        client,
        deletion_timeout,
        pdbs,
        pods,
        sets,
        deployments,
        statefulsets,
        reported: HashMap::new(),
    };
    run_passes(ctl, &wake, &shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, PdbFixture, PodFixture};
    use k8s_openapi::api::apps::v1::{DeploymentSpec, ReplicaSetSpec};

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
        let others = HashMap::new();
        let scales = Scales {
            sets: &[],
            deployments: &[],
            statefulsets: &[],
            others: &others,
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
            DELETION_TIMEOUT,
        )
        .status;
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
        let s = compute_status(
            &pdb(2, &[("a", 1_000_000 - 121)]),
            &pods,
            &scales,
            now,
            DELETION_TIMEOUT,
        )
        .status;
        assert_eq!((s.current_healthy, s.disruptions_allowed), (3, 1));
        assert!(s.disrupted_pods.is_none());
    }

    fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            ..Default::default()
        }
    }

    fn owned(name: &str, ready: bool, by: Option<OwnerReference>) -> Arc<Pod> {
        let mut pod = (*pod(name, ready)).clone();
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.owner_references = by.map(|o| vec![o]);
        Arc::new(pod)
    }

    fn budget(spec: PodDisruptionBudgetSpec) -> PodDisruptionBudget {
        let mut pdb = pdb(0, &[]);
        pdb.spec = Some(PodDisruptionBudgetSpec {
            selector: pdb.spec.and_then(|s| s.selector),
            ..spec
        });
        pdb
    }

    fn deployment_with_set(replicas: i32) -> (Vec<Arc<ReplicaSet>>, Vec<Arc<Deployment>>) {
        let d = Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("d-uid".into()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: None,
        };
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some("web-1".into()),
                namespace: Some("ns".into()),
                uid: Some("rs-uid".into()),
                owner_references: Some(vec![owner("Deployment", "web", "d-uid")]),
                ..Default::default()
            },
            // The ReplicaSet's own count is not what counts: the Deployment's scale is.
            spec: Some(ReplicaSetSpec {
                replicas: Some(1),
                ..Default::default()
            }),
            status: None,
        };
        (vec![Arc::new(rs)], vec![Arc::new(d)])
    }

    #[test]
    fn percentages_count_the_controllers_scale_rounded_up_like_get_scaled_value() {
        let (sets, deployments) = deployment_with_set(5);
        let others = HashMap::new();
        let scales = Scales {
            sets: &sets,
            deployments: &deployments,
            statefulsets: &[],
            others: &others,
        };
        let by_rs = Some(owner("ReplicaSet", "web-1", "rs-uid"));
        // Three pods exist of five wanted; one is unmanaged and skipped.
        let pods = vec![
            owned("a", true, by_rs.clone()),
            owned("b", true, by_rs.clone()),
            owned("c", true, by_rs),
            owned("stray", true, None),
        ];
        let now = jiff::Timestamp::from_second(1_000_000).unwrap();
        let min = budget(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::String("50%".into())),
            ..Default::default()
        });
        let sync = compute_status(&min, &pods, &scales, now, DELETION_TIMEOUT);
        // 50% of 5 rounds up to 3; the stray pod is ready, so 4 are healthy.
        let s = &sync.status;
        assert_eq!((s.expected_pods, s.desired_healthy), (5, 3));
        assert_eq!((s.current_healthy, s.disruptions_allowed), (4, 1));
        assert_eq!(sync.unmanaged, vec!["stray".to_string()]);
        let max = budget(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::String("30%".into())),
            ..Default::default()
        });
        // 30% of 5 is 1.5, rounded up to 2 unavailable: 3 must stay healthy.
        let s = compute_status(&max, &pods, &scales, now, DELETION_TIMEOUT).status;
        assert_eq!((s.expected_pods, s.desired_healthy), (5, 3));
    }

    #[test]
    fn owners_without_scale_or_no_expected_pods_allow_no_disruption() {
        let now = jiff::Timestamp::from_second(1_000_000).unwrap();
        let mut others = HashMap::new();
        others.insert(
            "ds-uid".to_string(),
            Scale::Unscalable("daemonsets.apps does not implement the scale subresource".into()),
        );
        let scales = Scales {
            sets: &[],
            deployments: &[],
            statefulsets: &[],
            others: &others,
        };
        let by_ds = Some(owner("DaemonSet", "agent", "ds-uid"));
        let pods = vec![owned("a", true, by_ds.clone()), owned("b", true, by_ds)];
        let max = budget(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            ..Default::default()
        });
        let mut old = max.clone();
        old.status = Some(PodDisruptionBudgetStatus {
            disruptions_allowed: 1,
            observed_generation: Some(2),
            ..Default::default()
        });
        let sync = compute_status(&old, &pods, &scales, now, DELETION_TIMEOUT);
        assert_eq!(sync.status.disruptions_allowed, 0);
        assert_eq!(
            sync.status.observed_generation,
            Some(2),
            "failSafe keeps it"
        );
        let condition = &sync.status.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "SyncFailed")
        );
        assert!(
            condition
                .message
                .contains("does not implement the scale subresource")
        );
        // A ReplicaSet that cannot be found fails the sync the same way.
        let by_gone = Some(owner("ReplicaSet", "gone", "gone-uid"));
        let pods = vec![owned("c", true, by_gone)];
        let sync = compute_status(&max, &pods, &scales, now, DELETION_TIMEOUT);
        assert!(sync.error.unwrap().contains("found no controllers for pod"));
        // Only unmanaged pods: expectedPods 0, so nothing may be disrupted.
        let pods = vec![owned("x", true, None), owned("y", true, None)];
        let s = compute_status(&max, &pods, &scales, now, DELETION_TIMEOUT).status;
        assert_eq!((s.expected_pods, s.current_healthy), (0, 2));
        assert_eq!(s.disruptions_allowed, 0);
    }

    #[test]
    fn the_deletion_timeout_is_a_setting() {
        let now = jiff::Timestamp::from_second(1_000_000).unwrap();
        let others = HashMap::new();
        let scales = Scales {
            sets: &[],
            deployments: &[],
            statefulsets: &[],
            others: &others,
        };
        let pods = vec![pod("a", true), pod("b", true)];
        let recorded = pdb(1, &[("a", 1_000_000 - 3)]);
        let s = compute_status(&recorded, &pods, &scales, now, Duration::from_secs(5));
        assert_eq!(s.status.current_healthy, 1);
        assert_eq!(s.recheck, jiff::Timestamp::from_second(1_000_002).ok());
        let s = compute_status(&recorded, &pods, &scales, now, Duration::from_secs(2));
        assert_eq!(
            (s.status.current_healthy, s.status.disruptions_allowed),
            (2, 1)
        );
        assert_eq!(s.recheck, None);
    }
}
