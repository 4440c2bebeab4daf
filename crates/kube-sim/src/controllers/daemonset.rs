//! The simulated DaemonSet controller, as
//! `system:serviceaccount:kube-system:daemon-set-controller`, modelled on upstream's
//! `pkg/controller/daemon/daemon_controller.go` (`manage`, `podsShouldBeOnNode`,
//! `NodeShouldRunDaemonPod`, `updateDaemonSetStatus`), `update.go` (`rollingUpdate`,
//! `updatedDesiredNodeCounts`, `findUpdatedPodsOnNode`) and `util/daemonset_util.go`
//! (`AddOrUpdateDaemonPodTolerations`, `SurgeCount`, `UnavailableCount`).
//!
//! Per DaemonSet, a pass claims pods (adopt orphans matching the selector, release owned
//! pods that no longer match it), then decides per node: a node that should run the daemon
//! (template `nodeName`, `nodeSelector`, NoSchedule/NoExecute taints tolerated) and has no
//! pod gets one, created with `spec.nodeName` already set — upstream pins the pod with a
//! node affinity and lets the scheduler bind it; the simulated scheduler only binds pods
//! without a node, so it never touches these. Every daemon pod carries upstream's default
//! tolerations, among them `node.kubernetes.io/unschedulable:NoSchedule`, so cordoning a
//! node neither removes its daemon pod nor stops a new one. Surplus, failed and
//! finished pods are deleted; a node whose only pod is terminating waits for it to be gone.
//! When that left nothing to do, a RollingUpdate replaces pods whose
//! `controller-revision-hash` differs from the template's: without surge it deletes old
//! pods while at most `maxUnavailable` nodes lack an available pod; with `maxSurge` it
//! starts a new pod next to an old one on at most `maxSurge` nodes and deletes the old
//! pod once the new one is Ready. Both limits are percentages of the nodes that should
//! run the daemon, rounded up as upstream does.
//!
//! Not modelled: node affinity, `minReadySeconds`, the failed-pod backoff and
//! ControllerRevision objects (the revision is the template hash).
//!
//! This file holds the DaemonSet's rules (per-node placement, plan, rolling update,
//! status, the sync of a plan); the pass around them, which reads the nodes once per pass
//! for every DaemonSet, the expectations and the shared API calls are the workload
//! skeleton's (`workload.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::PostParams;
use kube::runtime::reflector::Store;

use super::deployment::template_hash;
use super::statefulset::REVISION_LABEL;
use super::workload::{self, Kind, Work, owner_ref, status_differs};
use super::{
    Result, controller_of, key, labels_of, pod_finished, pod_ready, ready, scaled, selector_matches,
};
use tokio_util::sync::CancellationToken;

/// The tolerations every daemon pod gets (upstream `AddOrUpdateDaemonPodTolerations`):
/// it survives the node turning not-ready or unreachable, and is placed on nodes under
/// pressure or cordoned. `network-unavailable` only for host-network pods.
pub fn daemon_tolerations(host_network: bool) -> Vec<Toleration> {
    let exists = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Toleration::default()
    };
    let mut out = vec![
        exists("node.kubernetes.io/not-ready", "NoExecute"),
        exists("node.kubernetes.io/unreachable", "NoExecute"),
        exists("node.kubernetes.io/disk-pressure", "NoSchedule"),
        exists("node.kubernetes.io/memory-pressure", "NoSchedule"),
        exists("node.kubernetes.io/pid-pressure", "NoSchedule"),
        exists("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        out.push(exists(
            "node.kubernetes.io/network-unavailable",
            "NoSchedule",
        ));
    }
    out
}

/// Adds the daemon tolerations to `spec`, replacing any with the same key, operator and
/// effect (upstream `AddOrUpdateTolerationInPodSpec`).
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let defaults = daemon_tolerations(spec.host_network == Some(true));
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for t in defaults {
        tolerations
            .retain(|o| (&o.key, &o.operator, &o.effect) != (&t.key, &t.operator, &t.effect));
        tolerations.push(t);
    }
}

/// Whether `tolerations` tolerate `taint` (upstream `Toleration.ToleratesTaint`).
fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == taint.key,
        };
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => {
                t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
            }
        };
        effect_ok && key_ok && value_ok
    })
}

/// Whether a daemon pod with `spec` (tolerations already added) should run on `node`, and
/// whether one already there should keep running (upstream `NodeShouldRunDaemonPod`).
/// Cordoning needs no check of its own: upstream sees it as the
/// `node.kubernetes.io/unschedulable` taint, which every daemon pod tolerates.
pub fn node_should_run(spec: &PodSpec, node: &Node) -> (bool, bool) {
    let name = node.name_any();
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return (false, false);
    }
    let node_labels = labels_of(node);
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node_labels.get(k) == Some(v));
    if !selector_ok {
        return (false, false);
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let untolerated = |effects: &[&str]| {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|t| effects.contains(&t.effect.as_str()) && !tolerated(tolerations, t))
    };
    if untolerated(&["NoSchedule", "NoExecute"]) {
        return (false, !untolerated(&["NoExecute"]));
    }
    (true, true)
}

/// Upstream `util.SurgeCount`: `maxSurge` of `desired` nodes, percentages rounded up; 0
/// unless the strategy is RollingUpdate.
pub fn surge_count(ds: &DaemonSet, desired: i32) -> Result<i32> {
    let Some(rolling) = rolling_update(ds) else {
        return Ok(0);
    };
    scaled(rolling.max_surge.as_ref(), desired, "0", true)
}

/// Upstream `util.UnavailableCount`: `maxUnavailable` of `desired` nodes, percentages
/// rounded up too (unlike a Deployment's, which round down); the API server defaults it
/// to 1.
pub fn unavailable_count(ds: &DaemonSet, desired: i32) -> Result<i32> {
    let Some(rolling) = rolling_update(ds) else {
        return Ok(0);
    };
    scaled(rolling.max_unavailable.as_ref(), desired, "1", true)
}

fn rolling_update(ds: &DaemonSet) -> Option<k8s_openapi::api::apps::v1::RollingUpdateDaemonSet> {
    let strategy = ds.spec.as_ref()?.update_strategy.as_ref()?;
    if strategy
        .type_
        .as_deref()
        .is_some_and(|t| t != "RollingUpdate")
    {
        return None;
    }
    Some(strategy.rolling_update.clone().unwrap_or_default())
}

/// `(maxSurge, maxUnavailable)` for `desired` nodes; both 0 would never progress, so
/// upstream (`updatedDesiredNodeCounts`) then allows one unavailable node.
pub fn rolling_limits(ds: &DaemonSet, desired: i32) -> Result<(i32, i32)> {
    let surge = surge_count(ds, desired)?;
    let mut unavailable = unavailable_count(ds, desired)?;
    if desired > 0 && surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok((surge, unavailable))
}

/// The revision of the DaemonSet's template, the value of its pods' `controller-revision-hash`.
pub fn revision(ds: &DaemonSet) -> String {
    let template = ds.spec.as_ref().map(|s| s.template.clone());
    template_hash(&template.unwrap_or_default())
}

/// The template's pod spec with the daemon tolerations added.
fn daemon_spec(ds: &DaemonSet) -> PodSpec {
    let mut spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .unwrap_or_default();
    add_daemon_tolerations(&mut spec);
    spec
}

/// What one sync of a DaemonSet decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Orphans to adopt (pod names).
    pub adopt: Vec<String>,
    /// Owned pods to release (pod names).
    pub release: Vec<String>,
    /// Nodes to create a daemon pod on.
    pub create: Vec<String>,
    /// Pods to delete: (name, uid).
    pub delete: Vec<(String, String)>,
}

/// Everything a sync decides from: the set, the nodes by name, its pods per node.
struct View<'a> {
    ds: &'a DaemonSet,
    spec: PodSpec,
    hash: String,
    nodes: BTreeMap<String, &'a Node>,
    /// Claimed pods per node, without terminal pods already being deleted (upstream
    /// `getNodesToDaemonPods`), oldest first.
    by_node: BTreeMap<String, Vec<&'a Pod>>,
}

impl<'a> View<'a> {
    fn new(
        ds: &'a DaemonSet,
        nodes: &'a [Arc<Node>],
        pods: &'a [Arc<Pod>],
        out: &mut Plan,
    ) -> View<'a> {
        let uid = ds.uid().unwrap_or_default();
        let selector = ds
            .spec
            .as_ref()
            .map(|s| s.selector.clone())
            .unwrap_or_default();
        let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
        for pod in pods {
            let matches = selector_matches(&selector, &labels_of(&**pod));
            let member = match controller_of(&**pod) {
                Some(owner) if owner.uid == uid && !matches => {
                    out.release.push(pod.name_any());
                    false
                }
                Some(owner) => owner.uid == uid,
                None if matches && pod.metadata.deletion_timestamp.is_none() => {
                    out.adopt.push(pod.name_any());
                    true
                }
                None => false,
            };
            let gone = pod_finished(pod) && pod.metadata.deletion_timestamp.is_some();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let (true, false, Some(node)) = (member, gone, node) {
                by_node.entry(node).or_default().push(&**pod);
            }
        }
        for pods in by_node.values_mut() {
            pods.sort_by_key(|p| {
                (
                    p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    p.name_any(),
                )
            });
        }
        View {
            ds,
            spec: daemon_spec(ds),
            hash: revision(ds),
            nodes: nodes.iter().map(|n| (n.name_any(), &**n)).collect(),
            by_node,
        }
    }

    fn should_run(&self, node: &str) -> (bool, bool) {
        self.nodes
            .get(node)
            .map_or((false, false), |n| node_should_run(&self.spec, n))
    }

    fn updated(&self, pod: &Pod) -> bool {
        labels_of(pod).get(REVISION_LABEL) == Some(&self.hash)
    }

    /// The nodes that should run the daemon.
    fn desired(&self) -> Vec<&str> {
        self.nodes
            .keys()
            .filter(|n| self.should_run(n).0)
            .map(String::as_str)
            .collect()
    }
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Upstream `IsPodAvailable` with `minReadySeconds` 0; a terminating pod never is.
fn available(pod: &Pod) -> bool {
    pod_ready(pod) && !terminating(pod)
}

fn name_uid(pod: &Pod) -> (String, String) {
    (pod.name_any(), pod.uid().unwrap_or_default())
}

/// Decides what to do for `ds` given the nodes and the pods of its namespace.
pub fn plan(ds: &DaemonSet, nodes: &[Arc<Node>], pods: &[Arc<Pod>]) -> Result<Plan> {
    let mut out = Plan::default();
    let view = View::new(ds, nodes, pods, &mut out);
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(out);
    }
    let surge = surge_count(ds, 1)? > 0;
    for node in view.nodes.keys() {
        pods_should_be_on_node(&view, node, surge, &mut out);
    }
    // Pods on nodes that no longer exist.
    for (node, pods) in &view.by_node {
        if !view.nodes.contains_key(node) {
            out.delete
                .extend(pods.iter().filter(|p| !terminating(p)).map(|p| name_uid(p)));
        }
    }
    // Upstream runs the rolling update only once the creations and deletions above are
    // observed; here, only in a pass that had none.
    if out.create.is_empty() && out.delete.is_empty() && rolling_update(ds).is_some() {
        rolling(&view, &mut out)?;
    }
    Ok(out)
}

/// Upstream `podsShouldBeOnNode`.
fn pods_should_be_on_node(view: &View<'_>, node: &str, surge: bool, out: &mut Plan) {
    let (should_run, should_continue) = view.should_run(node);
    let pods = view.by_node.get(node).map_or(&[][..], Vec::as_slice);
    if pods.is_empty() {
        if should_run {
            out.create.push(node.to_string());
        }
        return;
    }
    if !should_continue {
        out.delete
            .extend(pods.iter().filter(|p| !terminating(p)).map(|p| name_uid(p)));
        return;
    }
    let mut running = Vec::new();
    for pod in pods.iter().filter(|p| !terminating(p)) {
        if pod_finished(pod) {
            out.delete.push(name_uid(pod));
        } else {
            running.push(*pod);
        }
    }
    if !surge {
        // One pod per node: keep the oldest. A node whose pod is terminating waits.
        out.delete
            .extend(running.iter().skip(1).map(|p| name_uid(p)));
        return;
    }
    if running.is_empty() {
        if should_run {
            out.create.push(node.to_string());
        }
        return;
    }
    // Surging: at most the oldest new and the oldest old pod; the old one goes once the
    // new one is available (or at once if it is not ready itself).
    let (mut oldest_new, mut oldest_old) = (None, None);
    for pod in running {
        let slot = if view.updated(pod) {
            &mut oldest_new
        } else {
            &mut oldest_old
        };
        match slot {
            None => *slot = Some(pod),
            Some(_) => out.delete.push(name_uid(pod)),
        }
    }
    if let (Some(new), Some(old)) = (oldest_new, oldest_old)
        && (!pod_ready(old) || available(new))
    {
        out.delete.push(name_uid(old));
    }
}

/// Upstream `findUpdatedPodsOnNode`: the node's new and old pod, ignoring terminating
/// ones; `None` if it has more than one of either (the manage step cleans that up).
fn updated_and_old<'a>(
    view: &View<'a>,
    pods: &[&'a Pod],
) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for pod in pods.iter().filter(|p| !terminating(p)) {
        let slot = if view.updated(pod) {
            &mut new
        } else {
            &mut old
        };
        if slot.replace(*pod).is_some() {
            return None;
        }
    }
    Some((new, old))
}

/// Upstream `rollingUpdate`.
fn rolling(view: &View<'_>, out: &mut Plan) -> Result<()> {
    let desired = view.desired();
    let count = i32::try_from(desired.len()).unwrap_or(i32::MAX);
    let (max_surge, max_unavailable) = rolling_limits(view.ds, count)?;
    let mut by_node: BTreeMap<&str, &[&Pod]> = view
        .by_node
        .iter()
        .map(|(n, p)| (n.as_str(), p.as_slice()))
        .collect();
    for node in desired {
        by_node.entry(node).or_insert(&[]);
    }
    if max_surge == 0 {
        roll_without_surge(view, &by_node, max_unavailable, out);
    } else {
        roll_with_surge(view, &by_node, count, max_surge, out);
    }
    Ok(())
}

/// Deletes old pods while at most `max_unavailable` nodes lack an available pod; the
/// manage step then creates the new pod once the old one is gone.
fn roll_without_surge(
    view: &View<'_>,
    by_node: &BTreeMap<&str, &[&Pod]>,
    max_unavailable: i32,
    out: &mut Plan,
) {
    let mut unavailable = 0;
    let mut replace_now = Vec::new();
    let mut candidates = Vec::new();
    for pods in by_node.values() {
        match updated_and_old(view, pods) {
            None | Some((None, None) | (Some(_), Some(_))) => unavailable += 1,
            Some((Some(new), None)) => unavailable += i32::from(!available(new)),
            Some((None, Some(old))) if !available(old) => {
                replace_now.push(name_uid(old));
                unavailable += 1;
            }
            Some((None, Some(old))) => candidates.push(name_uid(old)),
        }
    }
    let room = usize::try_from((max_unavailable - unavailable).max(0)).unwrap_or(0);
    out.delete.extend(replace_now);
    out.delete.extend(candidates.into_iter().take(room));
}

/// Starts new pods next to old ones on at most `max_surge` nodes; deletes an old pod
/// once the new one beside it is available.
fn roll_with_surge(
    view: &View<'_>,
    by_node: &BTreeMap<&str, &[&Pod]>,
    desired: i32,
    max_surge: i32,
    out: &mut Plan,
) {
    let (mut surging, mut available_nodes) = (0, 0);
    let mut allowed = Vec::new();
    let mut candidates = Vec::new();
    let mut leaving = Vec::new();
    for (node, pods) in by_node {
        let Some((new, old)) = updated_and_old(view, pods) else {
            surging += 1;
            continue;
        };
        if old.or(new).is_some_and(available) {
            available_nodes += 1;
        }
        let should_run = view.should_run(node).0;
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) if !should_run => match available(old) {
                false => out.delete.push(name_uid(old)),
                true => leaving.push(name_uid(old)),
            },
            (None, Some(old)) if !available(old) => allowed.push(node.to_string()),
            (None, Some(_)) => candidates.push(node.to_string()),
            (Some(new), Some(_)) if !available(new) => surging += 1,
            (Some(_), Some(old)) => out.delete.push(name_uid(old)),
        }
    }
    // Pods on nodes that no longer qualify go only while the others keep every
    // desired node covered.
    let spare = usize::try_from((available_nodes - desired).max(0)).unwrap_or(0);
    out.delete.extend(leaving.into_iter().take(spare));
    let room = usize::try_from((max_surge - surging).max(0)).unwrap_or(0);
    out.create.extend(allowed);
    out.create.extend(candidates.into_iter().take(room));
}

/// The status `ds` should report (upstream `updateDaemonSetStatus`).
pub fn status_counts(ds: &DaemonSet, nodes: &[Arc<Node>], pods: &[Arc<Pod>]) -> serde_json::Value {
    let mut ignored = Plan::default();
    let view = View::new(ds, nodes, pods, &mut ignored);
    let (mut desired, mut current, mut misscheduled) = (0, 0, 0);
    let (mut ready, mut available_count, mut updated) = (0, 0, 0);
    for node in view.nodes.keys() {
        let (should_run, _) = view.should_run(node);
        let oldest = view.by_node.get(node).and_then(|p| p.first());
        match (should_run, oldest) {
            (false, Some(_)) => misscheduled += 1,
            (false, None) => {}
            (true, None) => desired += 1,
            (true, Some(pod)) => {
                desired += 1;
                current += 1;
                ready += i32::from(available(pod));
                available_count += i32::from(available(pod));
                updated += i32::from(view.updated(pod));
            }
        }
    }
    serde_json::json!({
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled,
        "numberReady": ready,
        "numberAvailable": available_count,
        "numberUnavailable": desired - available_count,
        "updatedNumberScheduled": updated,
        "observedGeneration": ds.metadata.generation.unwrap_or(0),
    })
}

/// The label with the template generation of a DaemonSet's pod
/// (`DaemonSetTemplateGenerationKey`, pkg/apis/apps/types.go, v1.37.2).
const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

/// The daemon pod for `node`: the template with the daemon tolerations, the revision
/// and template-generation labels (`CreatePodTemplate` in
/// pkg/controller/daemon/util/daemonset_util.go, v1.37.2) and `spec.nodeName` set, so no
/// scheduler is involved.
pub fn pod_for(ds: &DaemonSet, node: &str) -> Pod {
    let meta = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), revision(ds));
    let generation = ds
        .annotations()
        .get(crate::apiserver::DAEMONSET_TEMPLATE_GENERATION);
    if let Some(generation) = generation {
        labels.insert(TEMPLATE_GENERATION_LABEL.into(), generation.clone());
    }
    let mut spec = daemon_spec(ds);
    spec.node_name = Some(node.to_string());
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", ds.name_any())),
            namespace: ds.namespace(),
            labels: Some(labels),
            annotations: meta.annotations,
            owner_references: Some(vec![owner_ref(ds)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The DaemonSet's rules, handed to the workload skeleton; it also follows the nodes.
struct DaemonSets {
    nodes: Store<Node>,
}

impl Kind for DaemonSets {
    type Owner = DaemonSet;
    type Plan = Plan;
    type Snapshot = Vec<Arc<Node>>;

    async fn ready(&self, shutdown: &CancellationToken) -> bool {
        ready(&self.nodes, shutdown).await
    }

    fn snapshot(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }

    fn plan(&self, ds: &DaemonSet, nodes: &Vec<Arc<Node>>, pods: &[Arc<Pod>]) -> Option<Plan> {
        plan(ds, nodes, pods)
            .inspect_err(|error| {
                tracing::info!(daemonset = %key(ds), %error, "invalid update strategy");
            })
            .ok()
    }

    fn status(
        &self,
        ds: &DaemonSet,
        nodes: &Vec<Arc<Node>>,
        pods: &[Arc<Pod>],
    ) -> Option<serde_json::Value> {
        let want = status_counts(ds, nodes, pods);
        status_differs(ds.status.as_ref(), &want).then_some(want)
    }

    async fn sync(
        work: Work<DaemonSet>,
        plan: Plan,
        status: Option<serde_json::Value>,
    ) -> Result<()> {
        let api = work.pods();
        work.claim(&api, &plan.adopt, &plan.release).await?;
        let mut created = Vec::new();
        for node in &plan.create {
            match api
                .create(&PostParams::default(), &pod_for(&work.owner, node))
                .await
            {
                Ok(pod) => created.push(key(&pod)),
                Err(error) => {
                    tracing::info!(daemonset = %work.key(), %node, %error, "create pod failed")
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

/// Runs the DaemonSet controller until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    workload::run(client, shutdown, |watches| DaemonSets {
        nodes: watches.all(),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, DaemonSetFixture, NodeFixture, PodFixture};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn ds() -> DaemonSet {
        fixtures::daemon_set("agent")
            .ns("ns")
            .selecting(&[("app", "agent")])
            .container("sim/agent:1")
    }

    fn nodes(n: usize) -> Vec<Arc<Node>> {
        (1..=n)
            .map(|i| Arc::new(fixtures::node(&format!("n{i}")).ready_is(true)))
            .collect()
    }

    /// A daemon pod of `ds` on `node`, Ready or not.
    fn daemon(ds: &DaemonSet, node: &str, ready: bool) -> Arc<Pod> {
        let mut pod = pod_for(ds, node);
        let name = format!("{}-{node}-{}", ds.name_any(), revision(ds));
        pod.metadata.name = Some(name.clone());
        pod.metadata.uid = Some(format!("{name}-uid"));
        pod.metadata.owner_references.as_mut().unwrap()[0].uid = "agent-uid".into();
        Arc::new(pod.running().ready_is(ready))
    }

    fn names(pods: &[(String, String)]) -> Vec<&str> {
        pods.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    #[test]
    fn surge_and_unavailable_percentages_round_up() {
        let with = |u: IntOrString, s: IntOrString| ds().rolling(u, s);
        // 10% of 3 nodes is 0.3: upstream rounds both up to 1.
        assert_eq!(
            rolling_limits(&with(pct("10%"), pct("10%")), 3).unwrap(),
            (1, 1)
        );
        assert_eq!(
            rolling_limits(&with(pct("50%"), IntOrString::Int(0)), 5).unwrap(),
            (0, 3)
        );
        assert_eq!(
            rolling_limits(&with(IntOrString::Int(0), pct("34%")), 3).unwrap(),
            (2, 0)
        );
        assert_eq!(
            rolling_limits(&with(IntOrString::Int(2), IntOrString::Int(1)), 9).unwrap(),
            (1, 2)
        );
        // Both zero would never progress: one node may be unavailable.
        assert_eq!(
            rolling_limits(&with(IntOrString::Int(0), IntOrString::Int(0)), 3).unwrap(),
            (0, 1)
        );
        assert_eq!(
            rolling_limits(&with(pct("0%"), pct("0%")), 0).unwrap(),
            (0, 0)
        );
        assert!(rolling_limits(&with(pct("x%"), IntOrString::Int(0)), 3).is_err());
        let mut on_delete = ds();
        on_delete
            .spec
            .as_mut()
            .unwrap()
            .update_strategy
            .as_mut()
            .unwrap()
            .type_ = Some("OnDelete".into());
        assert_eq!(surge_count(&on_delete, 3).unwrap(), 0);
    }

    #[test]
    fn daemon_pods_tolerate_cordons_and_node_problems() {
        let pod = pod_for(&ds(), "n1");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let tolerated_keys: Vec<_> = spec
            .tolerations
            .unwrap()
            .iter()
            .map(|t| (t.key.clone().unwrap(), t.effect.clone().unwrap()))
            .collect();
        for (key, effect) in [
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
            ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
        ] {
            assert!(
                tolerated_keys.contains(&(key.into(), effect.into())),
                "{key}"
            );
        }
        assert_eq!(
            pod.metadata.labels.unwrap()[REVISION_LABEL],
            revision(&ds())
        );
    }

    #[test]
    fn daemon_pods_carry_their_daemonsets_template_generation() {
        let mut set = ds();
        set.metadata.annotations = Some(
            [(
                crate::apiserver::DAEMONSET_TEMPLATE_GENERATION.to_string(),
                "3".to_string(),
            )]
            .into(),
        );
        let labels = pod_for(&set, "n1").metadata.labels.unwrap();
        assert_eq!(labels[TEMPLATE_GENERATION_LABEL], "3");
    }

    #[test]
    fn one_pod_per_matching_node_cordoned_or_not() {
        let mut nodes = nodes(3);
        nodes[0] = Arc::new(
            fixtures::node("n1")
                .unschedulable_is(true)
                .taints(vec![Taint {
                    key: "node.kubernetes.io/unschedulable".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]),
        );
        nodes[2] = Arc::new(fixtures::node("n3").taints(vec![Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]));
        let p = plan(&ds(), &nodes, &[]).unwrap();
        assert_eq!(p.create, vec!["n1", "n2"], "n3's taint is not tolerated");
        // A node selector narrows it down; the cordoned node's pod stays.
        let pods = vec![daemon(&ds(), "n1", true)];
        let p = plan(&ds(), &nodes, &pods).unwrap();
        assert_eq!((p.create, p.delete), (vec!["n2".to_string()], vec![]));
        let labelled = nodes.clone().into_iter().map(|n| {
            let name = n.name_any();
            Arc::new(
                (*n).clone()
                    .with_labels(&[("pool", if name == "n2" { "a" } else { "b" })]),
            )
        });
        let labelled: Vec<_> = labelled.collect();
        let p = plan(&ds().node_selector(&[("pool", "a")]), &labelled, &pods).unwrap();
        assert_eq!(p.create, vec!["n2"]);
        assert_eq!(names(&p.delete), vec![pods[0].name_any()]);
    }

    #[test]
    fn a_node_with_a_terminating_pod_waits_for_it() {
        let old = daemon(&ds(), "n1", true);
        let going = Arc::new(
            (*old)
                .clone()
                .deleting(jiff::Timestamp::UNIX_EPOCH, Some(30)),
        );
        let p = plan(&ds(), &nodes(1), &[going]).unwrap();
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn rolling_update_without_surge_keeps_unavailable_nodes_under_the_limit() {
        let old = ds();
        let new = ds().container("sim/agent:2");
        let pods: Vec<_> = ["n1", "n2", "n3"]
            .iter()
            .map(|n| daemon(&old, n, true))
            .collect();
        let p = plan(&new, &nodes(3), &pods).unwrap();
        assert_eq!(names(&p.delete), vec![pods[0].name_any()]);
        // n1's old pod is terminating: that node counts as unavailable, nothing more goes.
        let mut rolling = pods.clone();
        rolling[0] = Arc::new(
            (*pods[0])
                .clone()
                .deleting(jiff::Timestamp::UNIX_EPOCH, Some(30)),
        );
        assert_eq!(plan(&new, &nodes(3), &rolling).unwrap(), Plan::default());
        // Its replacement not Ready yet: still nothing.
        rolling[0] = daemon(&new, "n1", false);
        assert_eq!(plan(&new, &nodes(3), &rolling).unwrap(), Plan::default());
        rolling[0] = daemon(&new, "n1", true);
        let p = plan(&new, &nodes(3), &rolling).unwrap();
        assert_eq!(names(&p.delete), vec![pods[1].name_any()]);
        // 67% of 3 rounds up to 3: every old pod may go at once; an unready one always may.
        let wide = new.clone().rolling(pct("67%"), IntOrString::Int(0));
        assert_eq!(plan(&wide, &nodes(3), &pods).unwrap().delete.len(), 3);
    }

    #[test]
    fn rolling_update_with_surge_starts_new_pods_before_deleting_old_ones() {
        let old = ds();
        let new = ds()
            .container("sim/agent:2")
            .rolling(IntOrString::Int(0), IntOrString::Int(1));
        let pods: Vec<_> = ["n1", "n2", "n3"]
            .iter()
            .map(|n| daemon(&old, n, true))
            .collect();
        let p = plan(&new, &nodes(3), &pods).unwrap();
        assert_eq!((p.create, p.delete), (vec!["n1".to_string()], vec![]));
        // The surge pod is not Ready yet: wait.
        let mut surged = pods.clone();
        surged.push(daemon(&new, "n1", false));
        assert_eq!(plan(&new, &nodes(3), &surged).unwrap(), Plan::default());
        // Ready: the manage step deletes the old pod beside it.
        surged[3] = daemon(&new, "n1", true);
        let p = plan(&new, &nodes(3), &surged).unwrap();
        assert_eq!(names(&p.delete), vec![pods[0].name_any()]);
    }

    #[test]
    fn status_counts_nodes_not_pods() {
        let old = ds();
        let new = ds().container("sim/agent:2");
        let pods = vec![
            daemon(&new, "n1", true),
            Arc::new(
                (*daemon(&old, "n2", true))
                    .clone()
                    .deleting(jiff::Timestamp::UNIX_EPOCH, Some(30)),
            ),
        ];
        let st = status_counts(&new, &nodes(3), &pods);
        assert_eq!(st["desiredNumberScheduled"], 3);
        assert_eq!(st["currentNumberScheduled"], 2);
        assert_eq!(st["numberReady"], 1, "a terminating pod is not ready");
        assert_eq!(st["numberAvailable"], 1);
        assert_eq!(st["numberUnavailable"], 2);
        assert_eq!(st["updatedNumberScheduled"], 1);
        assert_eq!(st["observedGeneration"], 1);
    }
}
