//! The simulated StatefulSet controller, as
//! `system:serviceaccount:kube-system:statefulset-controller`, modelled on upstream's
//! `pkg/controller/statefulset/stateful_set_control.go` (`updateStatefulSet`,
//! `processReplica`, `processCondemned`) and `stateful_set_utils.go`.
//!
//! Per StatefulSet, a pass claims pods (adopts orphans named `<set>-<ordinal>` that match
//! the selector, releases owned pods that no longer match it, as upstream's `ClaimPods`),
//! then walks the ordinals `0..replicas`: a missing ordinal gets a pod named
//! `<set>-<ordinal>`, but only once no pod object of that name exists any more — a
//! terminating or released pod holds its name, so its replacement waits until the API
//! server has really removed it. With `podManagementPolicy: OrderedReady` (upstream's
//! "monotonic" mode) the walk stops at the first ordinal that is missing, terminating or
//! not Running and Ready, so ordinal `i` is created only when `0..i` are Ready, and surplus
//! pods are deleted from the highest ordinal down, one at a time; `Parallel` creates and
//! deletes all at once. Then the RollingUpdate strategy deletes, from the highest ordinal
//! down to `partition`, the first pod whose `controller-revision-hash` is not the update
//! revision, and waits for its replacement to be Ready before the next one.
//!
//! Simplifications: no ControllerRevision objects are written (revisions are
//! `<set>-<template hash>`, and `status.currentRevision` remembers the old one), so a pod
//! recreated below the partition gets the current template rather than the old revision's;
//! `minReadySeconds`, PVCs and `maxUnavailable` (alpha upstream) are not modelled.
//!
//! This file holds the StatefulSet's rules (claim, plan, status, the sync of a plan); the
//! pass around them, the expectations and the shared API calls are the workload
//! skeleton's (`workload.rs`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::PostParams;

use super::deployment::template_hash;
use super::workload::{self, Kind, Work, owner_ref, status_differs};
use super::{
    Result, controller_of, key, labels_of, pod_finished, pod_ready, selector_matches, status_code,
};
use tokio_util::sync::CancellationToken;

/// Label naming the pod, so a Service can select exactly one replica (upstream
/// `apps.StatefulSetPodNameLabel`).
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// Label carrying the pod's ordinal (upstream `apps.PodIndexLabel`).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// Label naming the revision a pod was created from (upstream
/// `apps.ControllerRevisionHashLabelKey`).
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The ordinal of `pod_name` if it is `<set>-<ordinal>` (upstream `getParentNameAndOrdinal`,
/// whose pattern is `(.*)-([0-9]+)$`).
pub fn ordinal(set: &str, pod_name: &str) -> Option<i32> {
    let digits = pod_name.strip_prefix(set)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The update revision of `set`: `<set>-<hash of its template>` (upstream names its
/// ControllerRevisions the same way).
pub fn update_revision(set: &StatefulSet) -> String {
    let template = set.spec.as_ref().map(|s| s.template.clone());
    format!(
        "{}-{}",
        set.name_any(),
        template_hash(&template.unwrap_or_default())
    )
}

fn revision_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(REVISION_LABEL)
        .map(String::as_str)
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Upstream `isRunningAndReady`.
fn running_and_ready(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && pod_ready(pod)
}

/// Upstream `isHealthy`: Running, Ready and not terminating. Anything else is
/// unavailable (`isUnavailable` with `minReadySeconds` 0).
fn healthy(pod: &Pod) -> bool {
    running_and_ready(pod) && !terminating(pod)
}

/// What one sync of a StatefulSet decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Orphans to adopt (pod names).
    pub adopt: Vec<String>,
    /// Owned pods to release (pod names).
    pub release: Vec<String>,
    /// Ordinals to create.
    pub create: Vec<i32>,
    /// Pods to delete: (name, uid).
    pub delete: Vec<(String, String)>,
}

/// The pods of a set, as upstream's `getPodsForStatefulSet` claims them.
struct Claimed<'a> {
    /// Claimed pods with a valid ordinal.
    members: BTreeMap<i32, &'a Pod>,
    adopt: Vec<String>,
    release: Vec<String>,
    /// Names of every pod in the namespace: a name held by any pod cannot be created.
    taken: HashSet<String>,
}

fn claim<'a>(set: &StatefulSet, pods: &'a [Arc<Pod>]) -> Claimed<'a> {
    let uid = set.uid().unwrap_or_default();
    let name = set.name_any();
    let selector = set
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    let mut out = Claimed {
        members: BTreeMap::new(),
        adopt: Vec::new(),
        release: Vec::new(),
        taken: pods.iter().map(|p| p.name_any()).collect(),
    };
    for pod in pods {
        let pod_name = pod.name_any();
        let matches = selector_matches(&selector, &labels_of(&**pod));
        let ord = ordinal(&name, &pod_name);
        match controller_of(&**pod) {
            Some(owner) if owner.uid == uid => {
                if !matches {
                    out.release.push(pod_name);
                } else if let Some(ord) = ord {
                    out.members.insert(ord, pod);
                }
            }
            Some(_) => {}
            // Upstream adopts only pods that are members by name (`isMemberOf`) and not
            // being deleted.
            None if matches && !terminating(pod) => {
                if let Some(ord) = ord {
                    out.adopt.push(pod_name);
                    out.members.insert(ord, pod);
                }
            }
            None => {}
        }
    }
    out
}

/// Decides what to do for `set` given the pods of its namespace.
pub fn plan(set: &StatefulSet, pods: &[Arc<Pod>]) -> Plan {
    let claimed = claim(set, pods);
    let mut out = Plan {
        adopt: claimed.adopt.clone(),
        release: claimed.release.clone(),
        ..Plan::default()
    };
    if set.metadata.deletion_timestamp.is_some() {
        return out;
    }
    let spec = set.spec.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");
    if !replicas_step(set, &claimed, replicas, monotonic, &mut out)
        || !condemned_step(&claimed, replicas, monotonic, &mut out)
    {
        return out;
    }
    let strategy = spec.update_strategy.unwrap_or_default();
    if strategy.type_.as_deref() == Some("OnDelete") {
        return out;
    }
    let partition = strategy
        .rolling_update
        .and_then(|r| r.partition)
        .unwrap_or(0);
    let update = update_revision(set);
    // Upstream: terminate the pod with the largest ordinal that does not match the update
    // revision, then wait for it (and every pod above the partition) to be healthy again.
    for ord in (partition.max(0)..replicas).rev() {
        let Some(pod) = claimed.members.get(&ord) else {
            return out;
        };
        if revision_of(pod) != Some(update.as_str()) && !terminating(pod) {
            out.delete.push(name_uid(pod));
            return out;
        }
        if !healthy(pod) {
            return out;
        }
    }
    out
}

fn name_uid(pod: &Pod) -> (String, String) {
    (pod.name_any(), pod.uid().unwrap_or_default())
}

/// Upstream `processReplica` over `0..replicas`; `false` when a monotonic set must stop.
fn replicas_step(
    set: &StatefulSet,
    claimed: &Claimed<'_>,
    replicas: i32,
    monotonic: bool,
    out: &mut Plan,
) -> bool {
    let name = set.name_any();
    for ord in 0..replicas {
        let blocked = match claimed.members.get(&ord) {
            // A released or terminating pod of that name still exists: the replacement
            // waits for it to be gone (upstream's create would fail with AlreadyExists).
            None if claimed.taken.contains(&format!("{name}-{ord}")) => true,
            None => {
                out.create.push(ord);
                true
            }
            Some(pod) if pod_finished(pod) => {
                if !terminating(pod) {
                    out.delete.push(name_uid(pod));
                }
                true
            }
            Some(pod) => !healthy(pod),
        };
        if blocked && monotonic {
            return false;
        }
    }
    // Parallel sets go on to scale down and update whatever happened above.
    true
}

/// Upstream `processCondemned` over the ordinals at or above `replicas`, highest first;
/// `false` when a monotonic set must stop.
fn condemned_step(claimed: &Claimed<'_>, replicas: i32, monotonic: bool, out: &mut Plan) -> bool {
    let condemned: Vec<&Pod> = claimed
        .members
        .range(replicas..)
        .rev()
        .map(|(_, p)| *p)
        .collect();
    // Every replica is healthy here in monotonic mode, so the first unhealthy pod is the
    // lowest unhealthy condemned one.
    let first_unhealthy = condemned
        .iter()
        .rev()
        .find(|p| !healthy(p))
        .map(|p| p.uid());
    for pod in &condemned {
        if terminating(pod) {
            if monotonic {
                return false;
            }
            continue;
        }
        if monotonic && !healthy(pod) && pod.uid() != first_unhealthy.clone().flatten() {
            return false;
        }
        out.delete.push(name_uid(pod));
        if monotonic {
            return false;
        }
    }
    true
}

/// The status `set` should report given the pods of its namespace (upstream
/// `computeReplicaStatus` and `completeRollingUpdate`).
pub fn status_counts(set: &StatefulSet, pods: &[Arc<Pod>]) -> serde_json::Value {
    let claimed = claim(set, pods);
    let update = update_revision(set);
    let mut current = set
        .status
        .as_ref()
        .and_then(|s| s.current_revision.clone())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| update.clone());
    let members: Vec<&Pod> = claimed.members.values().copied().collect();
    let count = |f: &dyn Fn(&Pod) -> bool| members.iter().filter(|p| f(p)).count();
    let replicas = members.len();
    // Terminating pods are never counted as ready (upstream counts a terminating pod that
    // still reports Ready; the simulated kubelet turns it NotReady at once anyway).
    let ready = count(&healthy);
    let revision_count =
        |rev: &str| count(&|p: &Pod| !terminating(p) && revision_of(p) == Some(rev));
    let mut current_replicas = revision_count(&current);
    let updated = revision_count(&update);
    let rolling = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        != Some("OnDelete");
    if rolling && updated == replicas && ready == replicas {
        current = update.clone();
        current_replicas = updated;
    }
    serde_json::json!({
        "replicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": current_replicas,
        "updatedReplicas": updated,
        "currentRevision": current,
        "updateRevision": update,
        "observedGeneration": set.metadata.generation.unwrap_or(0),
    })
}

/// The pod of `set` with `ordinal` (upstream `newStatefulSetPod`): the template, the
/// identity labels and a controller reference; hostname and subdomain give it its DNS name.
pub fn pod_for(set: &StatefulSet, ordinal: i32) -> Pod {
    let name = format!("{}-{ordinal}", set.name_any());
    let spec = set.spec.clone().unwrap_or_default();
    let meta = spec.template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(REVISION_LABEL.into(), update_revision(set));
    let mut pod_spec = spec.template.spec.unwrap_or_default();
    pod_spec.hostname = Some(name.clone());
    pod_spec.subdomain = spec.service_name.filter(|s| !s.is_empty());
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.namespace(),
            labels: Some(labels),
            annotations: meta.annotations,
            owner_references: Some(vec![owner_ref(set)]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The StatefulSet's rules, handed to the workload skeleton.
struct StatefulSets;

impl Kind for StatefulSets {
    type Owner = StatefulSet;
    type Plan = Plan;
    type Snapshot = ();

    fn snapshot(&self) {}

    fn plan(&self, set: &StatefulSet, _: &(), pods: &[Arc<Pod>]) -> Option<Plan> {
        Some(plan(set, pods))
    }

    fn status(&self, set: &StatefulSet, _: &(), pods: &[Arc<Pod>]) -> Option<serde_json::Value> {
        let want = status_counts(set, pods);
        status_differs(set.status.as_ref(), &want).then_some(want)
    }

    async fn sync(
        work: Work<StatefulSet>,
        plan: Plan,
        status: Option<serde_json::Value>,
    ) -> Result<()> {
        let api = work.pods();
        work.claim(&api, &plan.adopt, &plan.release).await?;
        let mut created = Vec::new();
        for ord in &plan.create {
            match api
                .create(&PostParams::default(), &pod_for(&work.owner, *ord))
                .await
            {
                Ok(pod) => created.push(key(&pod)),
                // The name is still taken: the next pass sees the pod that holds it.
                Err(e) if status_code(&e) == Some(409) => {}
                Err(error) => {
                    tracing::info!(statefulset = %work.key(), %error, "create pod failed")
                }
            }
        }
        let deleted = work.delete(&api, &plan.delete).await;
        work.expect(created, deleted);
        if let Some(status) = status {
            work.patch_status(serde_json::json!({ "status": status }))
                .await?;
        }
        Ok(())
    }
}

/// Runs the StatefulSet controller until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    workload::run(client, shutdown, |_| StatefulSets).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, PodFixture, StatefulSetFixture};

    fn set(replicas: i32) -> StatefulSet {
        fixtures::stateful_set("web")
            .ns("ns")
            .replicas(replicas)
            .selecting(&[("app", "web")])
            .container("sim/web:1")
    }

    /// Pod `web-<ord>` of `set` as the controller would create it, Running and Ready or not.
    fn member(set: &StatefulSet, ord: i32, ready: bool) -> Arc<Pod> {
        let mut pod = pod_for(set, ord);
        pod.metadata.uid = Some(format!("web-{ord}-uid"));
        let pod = pod
            .phase(if ready { "Running" } else { "Pending" })
            .ready_is(ready);
        Arc::new(pod)
    }

    fn deleting(pod: &Pod) -> Arc<Pod> {
        Arc::new(pod.clone().deleting(jiff::Timestamp::UNIX_EPOCH, Some(30)))
    }

    fn deleted_names(plan: &Plan) -> Vec<&str> {
        plan.delete.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn ordinals_parse_only_the_sets_own_names() {
        assert_eq!(ordinal("web", "web-0"), Some(0));
        assert_eq!(ordinal("web", "web-12"), Some(12));
        assert_eq!(ordinal("web", "web-x"), None);
        assert_eq!(ordinal("web", "web-"), None);
        assert_eq!(ordinal("web", "web-1-2"), None);
        assert_eq!(ordinal("web", "webby-1"), None);
        assert_eq!(ordinal("web-a", "web-a-3"), Some(3));
    }

    #[test]
    fn pods_carry_identity_labels_and_a_controller_reference() {
        let s = set(3);
        let pod = pod_for(&s, 2);
        assert_eq!(pod.metadata.name.as_deref(), Some("web-2"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["app"], "web");
        assert_eq!(labels[POD_NAME_LABEL], "web-2");
        assert_eq!(labels[POD_INDEX_LABEL], "2");
        assert_eq!(labels[REVISION_LABEL], update_revision(&s));
        let owner = controller_of(&pod).unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("StatefulSet", "web-uid")
        );
        assert_eq!(pod.spec.unwrap().hostname.as_deref(), Some("web-2"));
    }

    #[test]
    fn ordered_ready_creates_one_ordinal_after_its_predecessors_are_ready() {
        let s = set(3);
        assert_eq!(plan(&s, &[]).create, vec![0]);
        // web-0 exists but is not Ready yet: nothing else happens.
        let p = plan(&s, &[member(&s, 0, false)]);
        assert_eq!(p, Plan::default());
        let p = plan(&s, &[member(&s, 0, true)]);
        assert_eq!(p.create, vec![1]);
        let p = plan(&s, &[member(&s, 0, true), member(&s, 1, true)]);
        assert_eq!(p.create, vec![2]);
        // A gap below a Ready pod is filled first, and only it.
        let p = plan(&s, &[member(&s, 0, true), member(&s, 2, true)]);
        assert_eq!(p.create, vec![1]);
    }

    #[test]
    fn parallel_creates_every_missing_ordinal_at_once() {
        let s = set(3).parallel();
        assert_eq!(plan(&s, &[]).create, vec![0, 1, 2]);
        let p = plan(&s, &[member(&s, 1, false)]);
        assert_eq!(p.create, vec![0, 2]);
    }

    #[test]
    fn a_replacement_waits_until_the_old_pod_is_gone() {
        let s = set(3);
        let old = member(&s, 1, true);
        let pods = vec![member(&s, 0, true), deleting(&old), member(&s, 2, true)];
        // Terminating web-1 holds its name and, OrderedReady, blocks everything above it.
        assert_eq!(plan(&s, &pods), Plan::default());
        assert_eq!(plan(&s.clone().parallel(), &pods), Plan::default());
        // Once the object is gone from the API, web-1 is created again.
        let pods = vec![member(&s, 0, true), member(&s, 2, true)];
        assert_eq!(plan(&s, &pods).create, vec![1]);
    }

    #[test]
    fn a_relabelled_pod_is_released_and_still_holds_its_name() {
        let s = set(2);
        let relabelled = Arc::new((*member(&s, 1, true)).clone().label("app", "draining"));
        let pods = vec![member(&s, 0, true), relabelled];
        let p = plan(&s, &pods);
        assert_eq!(p.release, vec!["web-1"]);
        assert!(p.create.is_empty(), "web-1 is still taken: {p:?}");
        let status = status_counts(&s, &pods);
        assert_eq!(status["replicas"], 1);
    }

    #[test]
    fn orphans_named_like_members_are_adopted() {
        let s = set(1);
        let orphan = fixtures::pod("web-0")
            .ns("ns")
            .label("app", "web")
            .running()
            .ready();
        let stranger = fixtures::pod("db-0").ns("ns").label("app", "web");
        let p = plan(&s, &[Arc::new(orphan), Arc::new(stranger)]);
        assert_eq!(p.adopt, vec!["web-0"]);
        assert!(p.create.is_empty());
    }

    #[test]
    fn ordered_scale_down_removes_the_highest_ordinal_one_at_a_time() {
        let s = set(1);
        let pods: Vec<_> = (0..3).map(|i| member(&s, i, true)).collect();
        assert_eq!(deleted_names(&plan(&s, &pods)), vec!["web-2"]);
        // web-2 terminating: wait for it before web-1.
        let waiting = vec![pods[0].clone(), pods[1].clone(), deleting(&pods[2])];
        assert_eq!(plan(&s, &waiting), Plan::default());
        let p = plan(&s.clone().parallel(), &pods);
        assert_eq!(deleted_names(&p), vec!["web-2", "web-1"]);
    }

    #[test]
    fn rolling_update_goes_from_the_highest_ordinal_down_one_at_a_time() {
        let old = set(3);
        let pods: Vec<_> = (0..3).map(|i| member(&old, i, true)).collect();
        let new = set(3).container("sim/web:2");
        assert_ne!(update_revision(&old), update_revision(&new));
        assert_eq!(deleted_names(&plan(&new, &pods)), vec!["web-2"]);
        // web-2 replaced but not Ready yet: wait.
        let mut pods = pods;
        pods[2] = member(&new, 2, false);
        assert_eq!(plan(&new, &pods), Plan::default());
        pods[2] = member(&new, 2, true);
        assert_eq!(deleted_names(&plan(&new, &pods)), vec!["web-1"]);
        // With partition 2, web-1 and web-0 keep the old revision.
        assert_eq!(plan(&new.clone().partition(2), &pods), Plan::default());
    }

    #[test]
    fn status_counts_revisions_and_completes_the_rollout() {
        let old = set(3);
        let new = set(3).container("sim/web:2");
        let mut rolling = new.clone();
        rolling.status = Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
            current_revision: Some(update_revision(&old)),
            ..Default::default()
        });
        let pods = vec![
            member(&old, 0, true),
            deleting(&member(&old, 1, true)),
            member(&new, 2, true),
        ];
        let st = status_counts(&rolling, &pods);
        assert_eq!(st["replicas"], 3);
        assert_eq!(st["readyReplicas"], 2, "a terminating pod is not ready");
        assert_eq!(st["currentReplicas"], 1);
        assert_eq!(st["updatedReplicas"], 1);
        assert_eq!(st["currentRevision"], update_revision(&old));
        let done: Vec<_> = (0..3).map(|i| member(&new, i, true)).collect();
        let st = status_counts(&rolling, &done);
        assert_eq!(st["currentRevision"], update_revision(&new));
        assert_eq!(st["currentReplicas"], 3);
        assert_eq!(st["observedGeneration"], 1);
    }
}
