//! The gather stage of a review: every live read its decision needs, in one place, and the
//! one retry policy over them ([`retry_until`]). Nothing past a review's fast path is taken
//! on the review's word: anyone reaching the port can post one (docs/security.md).
//!
//! * what the watch caches say of the pod, for the fast path ([`eviction_glance`],
//!   [`deletion_glance`]);
//! * the pod: from a drained node's watch ([`watched_pod`]) or the API ([`pod`],
//!   [`pod_object`]); the incarnation a DELETE names ([`claimed_pod`]); its going
//!   ([`until_gone`]);
//! * its controller, read live and shared by the reviews around it for
//!   [`CONTROLLER_READ_TTL`] ([`ControllerReads`]): a ReplicaSet ([`replicaset`],
//!   [`replicaset_surplus`]), a StatefulSet and its members ([`statefulset`], [`members`]),
//!   a DaemonSet ([`daemonset`]);
//! * its Services, EndpointSlices, PDBs and namespace come from the watch caches
//!   (`crate::cache`, one snapshot per decision), its node from `crate::isolate`'s node
//!   reads.
//!
//! What is gathered is facts; what they mean for the review is decided by `crate::decide`
//! and by the controllers' rules beside the DELETE's answers (the StatefulSet's step, the
//! DaemonSet's template generation).

mod controlled;
mod reads;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::conditions;
use kube::runtime::wait::await_condition;
use tokio::time::Instant;

use crate::decide::{self, Glance, PodFacts};
use crate::nodepods::{self, Lookup};
use crate::recent::Recent;
use crate::review;
use crate::state::AppState;
use controlled::{controlled_pods, read};
use graceful_drain_core::backoff::Backoff;
use graceful_drain_core::labels::DRAINING_LABEL;
pub use reads::{CONTROLLER_READ_TTL, ControllerReads};

/// First pause before trying a review's step again after a transient failure; it doubles
/// up to [`TRANSIENT_PAUSE_MAX`].
const TRANSIENT_PAUSE: Duration = Duration::from_millis(250);
/// Longest pause between two attempts at one step of a review.
const TRANSIENT_PAUSE_MAX: Duration = Duration::from_secs(2);

/// The one retry policy of a review: `attempt` again after a transient failure (a
/// throttled or failed API call, a pod that kept changing) while the deadline leaves room
/// for a pause, which doubles from [`TRANSIENT_PAUSE`] to [`TRANSIENT_PAUSE_MAX`]: one 429
/// from Priority and Fairness must not cost an eviction the caller's whole retry pause (5 s
/// for kubectl), nor let a DELETE through unprotected. The last failure is returned when
/// time runs out.
pub(super) async fn retry_until<T, E, F, Fut>(deadline: Instant, mut attempt: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = Backoff::new(TRANSIENT_PAUSE, TRANSIENT_PAUSE_MAX);
    loop {
        let error = match attempt().await {
            Ok(done) => return Ok(done),
            Err(error) => error,
        };
        let pause = backoff.next_pause();
        if Instant::now() + pause >= deadline {
            return Err(error);
        }
        tracing::info!(%error, retry_in = ?pause, "transient failure; trying again");
        tokio::time::sleep(pause).await;
    }
}

/// What the caches say of an eviction's pod (an eviction names a pod and carries none
/// of its labels).
pub(super) fn eviction_glance(state: &AppState, ev: &review::Eviction) -> Glance {
    let cache = &state.ctx.cache;
    Glance {
        opted_out: cache.opted_out(&ev.namespace),
        isolated: cache.isolated(&ev.namespace, &ev.pod).is_some(),
        listed_ready: cache.has_ready_endpoint(&ev.namespace, &ev.pod),
        may_be_selected: cache.has_selecting_service(&ev.namespace),
    }
}

/// What the caches, and the labels of the object the DELETE names, say of its pod.
pub(super) fn deletion_glance(state: &AppState, del: &review::Deletion) -> Glance {
    let cache = &state.ctx.cache;
    let (namespace, name) = (&del.namespace, &del.request.name);
    let labels = del.object.metadata.labels.as_ref();
    Glance {
        opted_out: cache.opted_out(namespace),
        isolated: labels.is_some_and(|l| l.contains_key(DRAINING_LABEL)),
        listed_ready: cache.has_ready_endpoint(namespace, name),
        may_be_selected: labels.is_some_and(|l| cache.service_selects(namespace, l)),
    }
}

/// Pod `namespace/name` as the API server has it now (`None`: gone), as a decision sees it.
pub(super) async fn pod(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<PodFacts>, kube::Error> {
    Ok(pod_read(state, namespace, name)
        .await?
        .map(|p| review::pod_facts(&p)))
}

/// Pod `namespace/name` as the API server has it now, whole (`None`: gone); a failed read
/// is logged and answered `Err`, which callers take as "nothing known".
pub(super) async fn pod_object(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<Pod>, ()> {
    pod_read(state, namespace, name).await.map_err(|error| {
        tracing::warn!(error = %graceful_drain_core::error::chain(&error), "read pod {namespace}/{name}");
    })
}

async fn pod_read(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<Pod>, kube::Error> {
    Api::<Pod>::namespaced(state.ctx.client.clone(), namespace)
        .get_opt(name)
        .await
}

/// The live pod a DELETE review `claimed`: `None` when it is gone or is another
/// incarnation (another UID). A failed read is retried until `deadline` ([`retry_until`]).
pub(super) async fn claimed_pod(
    state: &AppState,
    claimed: &PodFacts,
    deadline: Instant,
) -> Result<Option<PodFacts>, String> {
    let read = || async {
        pod(state, &claimed.namespace, &claimed.name)
            .await
            .map_err(|error| graceful_drain_core::error::chain(&error).to_string())
    };
    let live = retry_until(deadline, read).await?;
    Ok(live.filter(|live| live.uid == claimed.uid))
}

/// Pod `namespace/name` from the watch of its node (the node its endpoints name), which
/// the first eviction there starts; an eviction arriving while that watch lists waits
/// for it up to [`nodepods::SYNC_WAIT`]. `None` when the pod must be read from the API.
/// A watch may lag: what it shows lets a review act, never pass unprotected.
pub(super) async fn watched_pod(state: &AppState, namespace: &str, name: &str) -> Option<PodFacts> {
    if !state.watch_drained_nodes {
        return None;
    }
    let cache = &state.ctx.cache;
    let node = cache.node_of(namespace, name)?;
    let pods = &cache.node_pods;
    match pods.lookup(&node, namespace, name) {
        Lookup::Found(pod) => return Some(*pod),
        Lookup::Unknown => {}
        Lookup::NotWatched => nodepods::watch(
            pods.clone(),
            state.ctx.client.clone(),
            &node,
            state.shutdown.clone(),
        ),
    }
    if !pods.wait_synced(&node, nodepods::SYNC_WAIT).await {
        return None;
    }
    match pods.lookup(&node, namespace, name) {
        Lookup::Found(pod) => Some(*pod),
        Lookup::Unknown | Lookup::NotWatched => None,
    }
}

/// Whether pod `namespace/name` of UID `uid` is gone by `deadline` (false at shutdown).
pub(super) async fn until_gone(
    state: &AppState,
    namespace: &str,
    name: &str,
    uid: &str,
    deadline: Instant,
) -> bool {
    let api = Api::<Pod>::namespaced(state.ctx.client.clone(), namespace);
    let removed = await_condition(api, name, conditions::is_deleted(uid));
    tokio::select! {
        gone = tokio::time::timeout_at(deadline, removed) => matches!(gone, Ok(Ok(_))),
        () = state.shutdown.cancelled() => false,
    }
}

/// Object `namespace/name` of kind `K` read live through `reads`, which shares one read
/// among the reviews around it.
async fn shared<K>(
    reads: &Recent<Option<Arc<K>>>,
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Arc<K>>, kube::Error>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let key = format!("{namespace}/{name}");
    reads.get(&key, || read::<K>(client, namespace, name)).await
}

/// ReplicaSet `namespace/name`, shared with the reviews around it.
pub(super) async fn replicaset(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<Arc<ReplicaSet>>, kube::Error> {
    shared(
        &state.controllers.replicasets,
        &state.ctx.client,
        namespace,
        name,
    )
    .await
}

/// Why ReplicaSet `namespace/name` has no pod to spare (`None`: it has one), from the
/// ReplicaSet and its pods read live, shared with the reviews around it
/// ([`decide::replicaset_spares`] on the pods it counts as active).
pub(super) async fn replicaset_surplus(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, kube::Error> {
    let key = format!("{namespace}/{name}");
    let read = || async {
        if name.is_empty() {
            return Ok(Some("it names no ReplicaSet".to_string()));
        }
        let client = &state.ctx.client;
        let Some(rs) = read::<ReplicaSet>(client, namespace, name).await? else {
            return Ok(Some(format!("ReplicaSet {name} does not exist")));
        };
        let wanted = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let selector = rs.spec.as_ref().map(|s| &s.selector);
        let uid = rs.metadata.uid.as_deref().unwrap_or_default();
        let pods = controlled_pods(client, namespace, selector, uid).await?;
        let active = pods.iter().filter(|p| active(p)).count();
        Ok(decide::replicaset_spares(name, wanted, active))
    };
    state.controllers.surplus.get(&key, read).await
}

/// Whether the ReplicaSet controller counts `pod` as active (`FilterActivePods`,
/// pkg/controller/controller_utils.go): not terminating, neither succeeded nor failed.
/// One we isolated is not counted either: it keeps the controller reference until the
/// controller lets it go, and is on its way out.
fn active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let isolated = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(DRAINING_LABEL));
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some("Succeeded" | "Failed"))
        && !isolated
}

/// DaemonSet `namespace/name`, shared with the reviews around it.
pub(super) async fn daemonset(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<Arc<DaemonSet>>, kube::Error> {
    shared(
        &state.controllers.daemonsets,
        &state.ctx.client,
        namespace,
        name,
    )
    .await
}

/// StatefulSet `namespace/name`, shared with the reviews around it.
pub(super) async fn statefulset(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<Option<Arc<StatefulSet>>, kube::Error> {
    shared(
        &state.controllers.statefulsets,
        &state.ctx.client,
        namespace,
        name,
    )
    .await
}

/// The label the StatefulSet controller puts its revision in (`apps/v1`
/// `ControllerRevisionHashLabelKey`).
pub(super) const REVISION_LABEL: &str = "controller-revision-hash";

/// What the StatefulSet rules need of one member.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub name: String,
    pub ordinal: i64,
    /// Its `controller-revision-hash`.
    pub revision: Option<String>,
    /// `Ready` is `True` and it is not terminating.
    pub available: bool,
    pub terminating: bool,
    /// It carries our isolation.
    pub isolated: bool,
}

/// The ordinal of pod `pod` of StatefulSet `set` (`<set>-<ordinal>`).
pub(super) fn ordinal(set: &str, pod: &str) -> Option<i64> {
    pod.strip_prefix(set)?.strip_prefix('-')?.parse().ok()
}

/// The live members of `sts` in `namespace` (the pods it controls, by UID), shared with
/// the reviews around it.
pub(super) async fn members(
    state: &AppState,
    namespace: &str,
    sts: &StatefulSet,
) -> Result<Arc<Vec<Member>>, kube::Error> {
    let set = sts.metadata.name.as_deref().unwrap_or_default();
    let key = format!("{namespace}/{set}");
    let read = || async {
        let selector = sts.spec.as_ref().map(|s| &s.selector);
        let uid = sts.metadata.uid.as_deref().unwrap_or_default();
        let pods = controlled_pods(&state.ctx.client, namespace, selector, uid).await?;
        Ok(Arc::new(
            pods.iter().filter_map(|p| member(set, p)).collect(),
        ))
    };
    state.controllers.members.get(&key, read).await
}

/// Pod `pod` as a member of StatefulSet `set`; `None` when it has no ordinal of it.
fn member(set: &str, pod: &Pod) -> Option<Member> {
    let name = pod.metadata.name.clone()?;
    let labels = pod.metadata.labels.as_ref();
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let terminating = pod.metadata.deletion_timestamp.is_some();
    Some(Member {
        ordinal: ordinal(set, &name)?,
        revision: labels.and_then(|l| l.get(REVISION_LABEL)).cloned(),
        available: ready && !terminating,
        terminating,
        isolated: labels.is_some_and(|l| l.contains_key(DRAINING_LABEL)),
        name,
    })
}
