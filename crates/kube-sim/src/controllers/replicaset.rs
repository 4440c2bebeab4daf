//! The simulated ReplicaSet controller, as
//! `system:serviceaccount:kube-system:replicaset-controller`.
//!
//! Per ReplicaSet: adopt orphan pods matching the selector (controller ownerReference),
//! release owned pods that no longer match it (what takes a pod relabelled by the webhook
//! out of its ReplicaSet: it keeps running, and a replacement is created), create pods
//! from the template up to `replicas`, delete the surplus preferring pods that are
//! unscheduled, pending or not ready, and newest first. Deletions are plain DELETE calls,
//! so admission webhooks see them. Expectations (names created, UIDs deleted) keep a
//! stale cache from causing a second round of creations, with upstream's rules
//! (pkg/controller/replicaset/replica_set.go and pkg/controller/controller_utils.go in
//! k8s.io/kubernetes v1.37): a deletion counts as observed only when the ReplicaSet sees
//! a pod *it controls* become terminating or disappear (`updatePod`, `deletePod`:
//! `DeletionObserved` needs the pod's controller ownerReference to name it), or when its
//! own DELETE call failed (`manageReplicas`); otherwise the ReplicaSet waits for the
//! five-minute `ExpectationsTimeout`, and only a later event about it syncs it again
//! (no periodic requeue: kube-controller-manager's informers resync every 12 hours or
//! more).

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::workload::{owner_ref, set_owner, status_differs};
use super::{
    Reconciler, Result, Watches, Workers, api_err, by_namespace, controller_of, key, labels_of,
    ns_name, pod_active, pod_ready, ready, run_passes, selector_matches,
};
use tokio_util::sync::CancellationToken;

/// Concurrent pod creations/deletions for one ReplicaSet.
const CALL_CONCURRENCY: usize = 16;
/// Upper bound of pods created or deleted in one sync (the upstream `burstReplicas`).
const BURST: usize = 500;
/// How long an unobserved creation or deletion holds the ReplicaSet back: upstream's
/// `ExpectationsTimeout` (pkg/controller/controller_utils.go), five minutes.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// What one sync decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Orphans to adopt (pod names).
    pub adopt: Vec<String>,
    /// Owned pods to release (pod names).
    pub release: Vec<String>,
    /// Pods to create.
    pub create: usize,
    /// Pods to delete: (name, uid).
    pub delete: Vec<(String, String)>,
}

/// Deletion preference: `Less` means "delete first" (upstream `ActivePods` order,
/// without the co-location and restart ranks).
fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let assigned = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    let phase_rank = |p: &Pod| match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Running") => 2,
        _ => 1,
    };
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    assigned(a)
        .cmp(&assigned(b))
        .then(phase_rank(a).cmp(&phase_rank(b)))
        .then(pod_ready(a).cmp(&pod_ready(b)))
        .then(created(b).cmp(&created(a)))
}

/// Decides what to do for `rs` given the pods of its namespace.
pub fn plan(rs: &ReplicaSet, pods: &[Arc<Pod>]) -> Plan {
    let uid = rs.uid().unwrap_or_default();
    let selector = rs
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let mut out = Plan::default();
    let mut active: Vec<&Pod> = Vec::new();
    for pod in pods {
        let matches = selector_matches(&selector, &labels_of(&**pod));
        match controller_of(&**pod) {
            Some(owner) if owner.uid == uid => {
                if !matches {
                    out.release.push(pod.name_any());
                } else if pod_active(pod) {
                    active.push(pod);
                }
            }
            Some(_) => {}
            None if matches && pod_active(pod) => {
                out.adopt.push(pod.name_any());
                active.push(pod);
            }
            None => {}
        }
    }
    let have = active.len();
    let want = usize::try_from(replicas).unwrap_or(0);
    if have < want {
        out.create = (want - have).min(BURST);
    } else if have > want {
        active.sort_by(|a, b| deletion_order(a, b));
        out.delete = active
            .iter()
            .take((have - want).min(BURST))
            .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
            .collect();
    }
    out
}

/// The status `rs` should report given its pods.
pub fn status_counts(rs: &ReplicaSet, pods: &[Arc<Pod>]) -> serde_json::Value {
    let uid = rs.uid().unwrap_or_default();
    let selector = rs
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    let template_labels = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let owned: Vec<&Pod> = pods
        .iter()
        .map(|p| &**p)
        .filter(|p| controller_of(*p).is_some_and(|o| o.uid == uid))
        .filter(|p| pod_active(p) && selector_matches(&selector, &labels_of(*p)))
        .collect();
    let ready = owned.iter().filter(|p| pod_ready(p)).count();
    let fully_labeled = owned
        .iter()
        .filter(|p| {
            let labels = labels_of(**p);
            template_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
        })
        .count();
    serde_json::json!({
        "replicas": owned.len(),
        "fullyLabeledReplicas": fully_labeled,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": rs.metadata.generation.unwrap_or(0),
    })
}

/// Creations and deletions not yet seen in the cache.
#[derive(Debug)]
struct Expectation {
    created: HashSet<String>,
    deleted: HashSet<String>,
    until: Instant,
}

/// What the cache shows, indexed for expectation checks.
#[derive(Default)]
struct Seen {
    /// `ns/name` of every pod.
    names: HashSet<String>,
    /// UIDs of pods not being deleted.
    live: HashSet<String>,
    /// UIDs of every pod, terminating ones too.
    uids: HashSet<String>,
    /// Every pod's controller UID, by pod UID (terminating pods too).
    controllers: HashMap<String, String>,
}

impl Seen {
    fn new(pods: &[Arc<Pod>]) -> Seen {
        let mut seen = Seen::default();
        for pod in pods {
            seen.names.insert(key(&**pod));
            let Some(uid) = pod.uid() else { continue };
            seen.uids.insert(uid.clone());
            if pod.metadata.deletion_timestamp.is_none() {
                seen.live.insert(uid.clone());
            }
            if let Some(owner) = controller_of(&**pod) {
                seen.controllers.insert(uid, owner.uid.clone());
            }
        }
        seen
    }
}

/// The controller each pod had when last seen, kept for pods that disappeared between two
/// passes: a deletion is observed by the ReplicaSet that controlled the pod then.
#[derive(Default)]
struct LastControllers(HashMap<String, String>);

impl LastControllers {
    /// Records `seen` and returns, for each pod UID of `previous` that is gone now, the
    /// controller it had (what upstream's `deletePod` reads from the deleted object).
    fn update(&mut self, seen: &Seen) -> HashMap<String, String> {
        let previous = std::mem::replace(&mut self.0, seen.controllers.clone());
        previous
            .into_iter()
            .filter(|(uid, _)| !seen.uids.contains(uid))
            .collect()
    }
}

/// Whether `rs` observed the deletion of pod `uid`: the pod is terminating and still
/// controlled by `rs`, or it disappeared while controlled by `rs`.
fn deletion_observed(rs: &str, uid: &str, seen: &Seen, gone: &HashMap<String, String>) -> bool {
    let controlled = |c: Option<&String>| c.is_some_and(|c| c == rs);
    (seen.uids.contains(uid) && !seen.live.contains(uid) && controlled(seen.controllers.get(uid)))
        || controlled(gone.get(uid))
}

fn satisfied(exp: &Expectation, seen: &Seen, now: Instant) -> bool {
    now >= exp.until
        || (exp.created.iter().all(|name| seen.names.contains(name)) && exp.deleted.is_empty())
}

type Expectations = Arc<Mutex<HashMap<String, Expectation>>>;

struct Controller {
    client: kube::Client,
    sets: Store<ReplicaSet>,
    pods: Store<Pod>,
    workers: Workers,
    expectations: Expectations,
    last: LastControllers,
}

impl Reconciler for Controller {
    async fn pass(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let all = self.pods.state();
        let seen = Seen::new(&all);
        let gone = self.last.update(&seen);
        let by_ns = by_namespace(&all);
        // Deletions each ReplicaSet observed in this pass lower its expectations for good,
        // as upstream's `DeletionObserved` does when the event arrives.
        {
            let mut exps = self.expectations.lock().unwrap_or_else(|e| e.into_inner());
            for (rs, exp) in exps.iter_mut() {
                exp.deleted
                    .retain(|uid| !deletion_observed(rs, uid, &seen, &gone));
            }
        }
        for rs in self.sets.state() {
            let uid = rs.uid().unwrap_or_default();
            if rs.metadata.deletion_timestamp.is_some() || self.workers.busy(&uid) {
                continue;
            }
            if self.workers.full() {
                break;
            }
            let pods = by_ns
                .get(&rs.namespace().unwrap_or_default())
                .cloned()
                .unwrap_or_default();
            {
                let mut exps = self.expectations.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(exp) = exps.get(&uid) {
                    // Unsatisfied: wait for an event about this ReplicaSet, or for the
                    // timeout to have passed when one comes (nothing requeues it).
                    if !satisfied(exp, &seen, now) {
                        continue;
                    }
                    exps.remove(&uid);
                }
            }
            let plan = plan(&rs, &pods);
            let status = status_counts(&rs, &pods);
            let needs_status = status_differs(rs.status.as_ref(), &status);
            if plan == Plan::default() && !needs_status {
                continue;
            }
            let ctx = Sync {
                client: self.client.clone(),
                rs: rs.clone(),
                expectations: self.expectations.clone(),
            };
            self.workers
                .spawn(uid, ctx.run(plan, needs_status.then_some(status)));
        }
        None
    }
}

/// One ReplicaSet's sync, run as owned work.
struct Sync {
    client: kube::Client,
    rs: Arc<ReplicaSet>,
    expectations: Expectations,
}

impl Sync {
    async fn run(self, plan: Plan, status: Option<serde_json::Value>) -> Result<()> {
        let (ns, rs_name) = ns_name(&*self.rs);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let uid = self.rs.uid().unwrap_or_default();
        for name in &plan.adopt {
            set_owner(&api, name, &uid, Some(owner_ref(&*self.rs))).await?;
        }
        for name in &plan.release {
            set_owner(&api, name, &uid, None).await?;
        }
        let until = Instant::now() + EXPECTATION_TIMEOUT;
        // Deletions are expected before they are asked for (upstream `ExpectDeletions`),
        // so a pod that is gone by the next pass still counts; a DELETE that fails is
        // observed at once, since no event will report it.
        if !plan.delete.is_empty() {
            self.expect(&uid, until, |exp| {
                exp.deleted
                    .extend(plan.delete.iter().map(|(_, u)| u.clone()));
            });
        }
        let created = self.create(&api, plan.create).await;
        let deleted: HashSet<String> = self.delete(&api, &plan.delete).await.into_iter().collect();
        self.expect(&uid, until, |exp| {
            exp.created.extend(created.iter().cloned());
            exp.deleted
                .retain(|u| deleted.contains(u) || !plan.delete.iter().any(|(_, d)| d == u));
        });
        if let Some(status) = status {
            let rs_api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
            let patch = Patch::Merge(serde_json::json!({ "status": status }));
            rs_api
                .patch_status(&rs_name, &PatchParams::default(), &patch)
                .await
                .map_err(api_err(
                    "update status of",
                    format!("replicaset {ns}/{rs_name}"),
                ))?;
        }
        Ok(())
    }

    /// Adds to (or starts) the expectations of this ReplicaSet; drops them once empty.
    fn expect(&self, uid: &str, until: Instant, change: impl FnOnce(&mut Expectation)) {
        let mut exps = self.expectations.lock().unwrap_or_else(|e| e.into_inner());
        let exp = exps.entry(uid.to_string()).or_insert_with(|| Expectation {
            created: HashSet::new(),
            deleted: HashSet::new(),
            until,
        });
        change(exp);
        if exp.created.is_empty() && exp.deleted.is_empty() {
            exps.remove(uid);
        }
    }

    fn pod_from_template(&self) -> Pod {
        let template = self
            .rs
            .spec
            .as_ref()
            .and_then(|s| s.template.clone())
            .unwrap_or_default();
        let meta = template.metadata.unwrap_or_default();
        Pod {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", self.rs.name_any())),
                namespace: self.rs.namespace(),
                labels: meta.labels,
                annotations: meta.annotations,
                owner_references: Some(vec![owner_ref(&*self.rs)]),
                ..ObjectMeta::default()
            },
            spec: template.spec,
            status: None,
        }
    }

    async fn create(&self, api: &Api<Pod>, count: usize) -> Vec<String> {
        let pod = self.pod_from_template();
        let rs = key(&*self.rs);
        let calls = (0..count).map(|_| {
            let (api, pod, rs) = (api.clone(), pod.clone(), rs.clone());
            async move {
                match api.create(&PostParams::default(), &pod).await {
                    Ok(created) => Some(key(&created)),
                    Err(error) => {
                        tracing::info!(replicaset = %rs, %error, "create pod failed");
                        None
                    }
                }
            }
        });
        run_bounded(calls.collect()).await
    }

    async fn delete(&self, api: &Api<Pod>, pods: &[(String, String)]) -> Vec<String> {
        let rs = key(&*self.rs);
        let calls = pods.iter().cloned().map(|(name, uid)| {
            let (api, rs) = (api.clone(), rs.clone());
            async move {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                // A pod already gone (404) is observed at once, like any failure
                // (upstream `manageReplicas` calls `DeletionObserved` for every error).
                match api.delete(&name, &dp).await {
                    Ok(_) => Some(uid),
                    Err(error) => {
                        tracing::info!(replicaset = %rs, pod = %name, %error, "delete pod failed");
                        None
                    }
                }
            }
        });
        run_bounded(calls.collect()).await
    }
}

/// Runs `calls` with at most [`CALL_CONCURRENCY`] in flight; keeps the `Some` results.
async fn run_bounded<F>(calls: Vec<F>) -> Vec<String>
where
    F: std::future::Future<Output = Option<String>>,
{
    futures::stream::iter(calls)
        .buffer_unordered(CALL_CONCURRENCY)
        .filter_map(|x| async move { x })
        .collect()
        .await
}

/// Upstream's `--concurrent-replicaset-syncs` default.
pub const DEFAULT_WORKERS: usize = 5;

/// Runs the ReplicaSet controller with `workers` workers until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken, workers: usize) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let sets = watches.all::<ReplicaSet>();
    let pods = watches.all::<Pod>();
    if !(ready(&sets, &shutdown).await && ready(&pods, &shutdown).await) {
        return Ok(());
    }
    let ctl = Controller {
        client,
        sets,
        pods,
        workers: Workers::new(wake.clone()).with_limit(workers),
        expectations: Arc::default(),
        last: LastControllers::default(),
    };
    run_passes(ctl, &wake, &shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, PodFixture, ReplicaSetFixture};

    fn rs(replicas: i32) -> ReplicaSet {
        fixtures::replica_set("web-1")
            .ns("ns")
            .with_uid("rs-uid")
            .replicas(replicas)
            .selecting(&[("app", "web")])
    }

    fn pod(
        name: &str,
        labels: &[(&str, &str)],
        owner: Option<&str>,
        node: bool,
        ready: bool,
        age: i64,
    ) -> Arc<Pod> {
        let created = jiff::Timestamp::from_second(1_700_000_000 - age).unwrap();
        let mut pod = fixtures::pod(name)
            .ns("ns")
            .with_labels(labels)
            .created_at(created)
            .phase(if node { "Running" } else { "Pending" })
            .ready_is(ready);
        if let Some(uid) = owner {
            pod = pod.owned_by_rs_uid(uid);
        }
        if node {
            pod = pod.on_node("n1");
        }
        Arc::new(pod)
    }

    #[test]
    fn relabelled_pod_is_released_and_replaced() {
        let pods = vec![
            pod("a", &[("app", "web")], Some("rs-uid"), true, true, 30),
            pod(
                "b",
                &[("example.com/isolated", "true")],
                Some("rs-uid"),
                true,
                true,
                20,
            ),
        ];
        let p = plan(&rs(2), &pods);
        assert_eq!(p.release, vec!["b"]);
        assert_eq!(p.create, 1);
        assert!(p.delete.is_empty() && p.adopt.is_empty());
    }

    #[test]
    fn orphans_are_adopted_and_other_owners_left_alone() {
        let pods = vec![
            pod("a", &[("app", "web")], None, true, true, 30),
            pod("b", &[("app", "web")], Some("other"), true, true, 20),
        ];
        let p = plan(&rs(1), &pods);
        assert_eq!(p.adopt, vec!["a"]);
        assert_eq!(p.create, 0);
    }

    #[test]
    fn surplus_deletion_prefers_unready_then_newest() {
        let pods = vec![
            pod(
                "old-ready",
                &[("app", "web")],
                Some("rs-uid"),
                true,
                true,
                300,
            ),
            pod(
                "new-ready",
                &[("app", "web")],
                Some("rs-uid"),
                true,
                true,
                10,
            ),
            pod(
                "unready",
                &[("app", "web")],
                Some("rs-uid"),
                true,
                false,
                200,
            ),
            pod(
                "pending",
                &[("app", "web")],
                Some("rs-uid"),
                false,
                false,
                100,
            ),
        ];
        let p = plan(&rs(1), &pods);
        let names: Vec<_> = p.delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["pending", "unready", "new-ready"]);
        let status = status_counts(&rs(1), &pods);
        assert_eq!(status["replicas"], 4);
        assert_eq!(status["readyReplicas"], 2);
    }
}
