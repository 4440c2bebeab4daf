//! The deferred deleter: deletes isolated pods once their recorded time has come, or puts
//! them back when their isolation was left to a caller that never came.
//!
//! A pod isolated for a ReplicaSet scale-down (no `graceful-drain.io/restore-at`) is
//! deleted here at its delete time. Any other isolated pod is removed by its own caller's
//! retried eviction or held DELETE, which the API server authenticated; if it is still
//! there, not terminating, at its restore time, it is restored ([`super::restore`]).
//!
//! It watches only pods carrying the draining label (metadata only) and keeps what each
//! pod's own annotations say: the delete time and the caller's grace period. So a
//! restarted or failed-over replica resumes every pending deletion from the first list.
//! It acts only while this replica holds the Lease ([`super::lease`]), deletes with a UID
//! precondition (a same-name replacement is never touched), records an Event, and never
//! deletes a pod that lacks our isolation annotations.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tracing::Instrument;

use super::cache::Cache;
use super::decide::PodFacts;
use super::isolate;
use super::metrics::Metrics;
use graceful_drain_core::backoff::Backoff;
use graceful_drain_core::labels::{
    DELAY_ANNOTATION, DELETE_AT_ANNOTATION, DRAINING_LABEL, GRACE_PERIOD_ANNOTATION,
    ORIGINAL_LABELS_ANNOTATION, RELEASED_AT_ANNOTATION, RESTORE_AT_ANNOTATION, webhook_reason,
};
use graceful_drain_core::runtime::Shutdown;

/// Longest pause between two scans of the pending pods (the deleter also wakes at each
/// pod's delete time).
const TICK: Duration = Duration::from_secs(1);
/// After a failed removal, the first pause before trying the same pod again; it doubles
/// with each failure up to [`RETRY_MAX`]. A pod past its delete time holds the drain, so
/// a one-off refusal (a throttled request, a connection the server closed) is retried
/// within a second.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest pause between removals of the same pod, and the pause after a removal the API
/// server accepted (the watch shows the pod terminating well before).
const RETRY_MAX: Duration = Duration::from_secs(10);
/// How long after a delete time its scan runs: system time and the runtime's clock are
/// read apart, and a scan a hair early would find nothing due.
const SCAN_SLACK: Duration = Duration::from_millis(5);
/// Removals in flight at once: a drained node's pods fall due together (a 100-pod node
/// within a second or two), and one at a time they would wait for each other's round
/// trips; 16 matches the node agent's eviction concurrency.
const REMOVALS_IN_FLIGHT: usize = 16;
/// Longest wait for the API server to answer one removal: pods are removed one after
/// another, so an unanswered call must not hold the others.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
pub use super::decide::MAX_ENDPOINT_WAIT;

/// Why a restore failed (it is tried again).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The pod's metadata was not seen by the watch.
    #[error("pod {0} not seen by the watch yet")]
    Unknown(String),
    /// The pod's metadata cannot be restored from.
    #[error(transparent)]
    Patch(#[from] super::restore::Error),
    /// The API server refused the patch (a 422 or 409 when the pod changed meanwhile).
    #[error("patch pod: {0}")]
    Api(kube::Error),
}

/// Deleter errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The watch of isolated pods ended.
    #[error("watch of isolated pods ended")]
    WatchEnded,
}

/// One isolated pod waiting for deletion, as recorded on the pod itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID, sent as the removal's precondition so a same-name replacement is
    /// never touched.
    pub uid: String,
    /// The pod's `graceful-drain.io/delete-at` annotation: the earliest time it may go.
    pub delete_at: Timestamp,
    /// The caller's grace period in seconds, from the grace-period annotation (negative
    /// values are dropped); passed on when the pod is removed.
    pub grace_period: Option<i64>,
    /// The pod already has a `deletionTimestamp`; nothing more to do but wait for it.
    pub terminating: bool,
    /// The pod's controller reference, which groups the Events of its pods.
    pub controller: Option<serde_json::Value>,
    /// When the pod goes back into its Services if its caller has not removed it; `None`
    /// when the deleter removes it at `delete_at`.
    pub restore_at: Option<Timestamp>,
    /// The pod's labels as isolated: which PDBs still select it.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The pod's `graceful-drain.io/deregistration-delay` annotation, if it has one.
    pub delay: Option<String>,
    /// When the configured load balancer was seen letting go of it
    /// (`graceful-drain.io/released-at`, [`super::release`]).
    pub released_at: Option<Timestamp>,
}

impl Pending {
    /// When the deleter next has something to do about the pod.
    fn acts_at(&self) -> Timestamp {
        self.restore_at.unwrap_or(self.delete_at)
    }
}

/// Whether the deleter removes the pod of `meta` itself at its delete time: we isolated it
/// ([`pending_from`]) and no caller is left to (no restore time).
pub fn removes(meta: &ObjectMeta) -> bool {
    pending_from(meta).is_some_and(|p| p.restore_at.is_none())
}

/// Reads a pending deletion from pod metadata; `None` unless we isolated the pod (the
/// draining label, the original-labels annotation and a valid delete time).
pub fn pending_from(meta: &ObjectMeta) -> Option<Pending> {
    meta.labels.as_ref()?.get(DRAINING_LABEL)?;
    let annotations = meta.annotations.as_ref()?;
    annotations.get(ORIGINAL_LABELS_ANNOTATION)?;
    let delete_at = annotations.get(DELETE_AT_ANNOTATION)?.parse().ok()?;
    Some(Pending {
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        delete_at,
        grace_period: annotations
            .get(GRACE_PERIOD_ANNOTATION)
            .and_then(|g| g.parse().ok())
            .filter(|g: &i64| *g >= 0),
        terminating: meta.deletion_timestamp.is_some(),
        controller: meta
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .and_then(|r| serde_json::to_value(r).ok()),
        restore_at: annotations
            .get(RESTORE_AT_ANNOTATION)
            .and_then(|a| a.parse().ok()),
        labels: meta.labels.clone().unwrap_or_default(),
        delay: annotations.get(DELAY_ANNOTATION).cloned(),
        released_at: annotations
            .get(RELEASED_AT_ANNOTATION)
            .and_then(|a| a.parse().ok()),
    })
}

/// Whether `pod` may be deleted at `now` (never one its caller removes): not before its
/// delete time, never while an EndpointSlice lists it (`listed`), and not before `margin`
/// has passed since it left the last one (`left_slices_at`); [`MAX_ENDPOINT_WAIT`] past
/// its delete time it goes whatever the slices say ([`super::decide::due_at`]).
pub fn is_due(
    pod: &Pending,
    now: Timestamp,
    margin: Duration,
    listed: bool,
    left_slices_at: Option<Timestamp>,
) -> bool {
    if pod.terminating || pod.restore_at.is_some() {
        return false;
    }
    let released = pod.released_at;
    super::decide::due_at(pod.delete_at, listed, left_slices_at, released, margin, now)
        .is_some_and(|due| now >= due)
}

/// Evicts `pod` ([`evict_pod`]); deletes it when the eviction cannot pass although its
/// disruption is already accounted for: a PDB that still selects it refuses (429) while
/// listing it as disrupted — the webhook charged it at isolation, so the budget counts it
/// already ([`counted`]) — or several PDBs select it (500, which no eviction ever gets
/// past). Never past a budget that has not counted it: that refusal is returned, and the
/// removal tried again later. `grace_period` as in [`evict_pod`].
pub(crate) async fn remove_pod(
    ctx: &isolate::Context,
    pod: &Pending,
    grace_period: Option<i64>,
) -> Result<(), kube::Error> {
    match evict_pod(&ctx.client, pod, grace_period).await {
        Err(kube::Error::Api(s))
            if s.code == 500 || (s.code == 429 && counted(&ctx.cache, pod)) =>
        {
            tracing::info!(code = s.code, message = %s.message, "eviction refused; its budget counts it already: deleting");
            let api = Api::<Pod>::namespaced(ctx.client.clone(), &pod.namespace);
            let params = DeleteParams {
                grace_period_seconds: grace_period.and_then(|g| u32::try_from(g).ok()),
                preconditions: Some(Preconditions {
                    uid: Some(pod.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            bounded(api.delete(&pod.name, &params)).await.map(|_| ())
        }
        other => other,
    }
}

/// Whether every cached PDB still selecting `pod` lists it in `status.disruptedPods` (true
/// when none selects it).
pub(crate) fn counted(cache: &Cache, pod: &Pending) -> bool {
    all_list(
        &cache.pdbs_selecting(&pod.namespace, &pod.labels),
        &pod.name,
    )
}

/// Whether each of `pdbs` lists pod `name` in `status.disruptedPods`.
pub(crate) fn all_list(pdbs: &[Arc<PodDisruptionBudget>], name: &str) -> bool {
    pdbs.iter().all(|pdb| {
        pdb.status
            .as_ref()
            .and_then(|s| s.disrupted_pods.as_ref())
            .is_some_and(|d| d.contains_key(name))
    })
}

/// Evicts `pod` with a proper `policy/v1` Eviction (kube's `Api::evict` sends options the
/// API server drops): its UID as precondition, so a same-name replacement is never
/// touched, and `grace_period` if given (else the pod's own).
pub(crate) async fn evict_pod(
    client: &kube::Client,
    pod: &Pending,
    grace_period: Option<i64>,
) -> Result<(), kube::Error> {
    let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace);
    let mut options = serde_json::json!({"preconditions": {"uid": pod.uid}});
    if let Some(grace) = grace_period {
        options["gracePeriodSeconds"] = grace.into();
    }
    let eviction = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "deleteOptions": options});
    let params = PostParams::default();
    let call =
        api.create_subresource::<_, serde_json::Value>("eviction", &pod.name, &params, &eviction);
    bounded(call).await.map(|_| ())
}

/// `call`, abandoned (as a transport error) when the API server has not answered within
/// [`CALL_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the API server did not answer within {CALL_TIMEOUT:?}"),
        )))),
    }
}

/// The last removal tried for one pod.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    at: tokio::time::Instant,
    /// Removals refused in a row (0 after an accepted one).
    failures: u32,
}

impl Attempt {
    /// When the pod may be tried again.
    fn next_try(&self) -> tokio::time::Instant {
        let pause = Backoff::new(RETRY_FIRST, RETRY_MAX)
            .after_failures(self.failures)
            .unwrap_or(RETRY_MAX);
        self.at + pause
    }

    /// Whether the pod may be tried again.
    fn elapsed(&self) -> bool {
        tokio::time::Instant::now() >= self.next_try()
    }
}

/// The deleter and its state.
pub struct Deleter {
    /// Client, cache, identity and Event sink shared with admission.
    pub ctx: isolate::Context,
    /// Where deletions, restores, leadership and endpoint-removal times are recorded.
    pub metrics: Arc<Metrics>,
    /// How long, past its deregistration delay, after the pod left every EndpointSlice it
    /// may be deleted (it never is while one lists it).
    pub margin: Duration,
    /// The deregistration delay of a pod and namespace that ask for none, and the longest
    /// one may ask for ([`Deleter::counting_delays`]).
    delays: (Duration, Duration),
    pending: HashMap<String, Pending>,
    /// UIDs of pods carrying an isolation record in namespaces the webhook never handles,
    /// already reported.
    foreign: std::collections::HashSet<String>,
    /// The watched metadata of pods their callers remove, to restore them from.
    metas: HashMap<String, ObjectMeta>,
    /// When each pending pod was first seen isolated, until its departure from the slices
    /// is measured (the `endpoint_removal_seconds` histogram).
    isolated_seen: HashMap<String, Timestamp>,
    attempted: HashMap<String, Attempt>,
    /// The webhook's own Deployment (namespace, name): gone or being deleted at shutdown
    /// means the webhook is being uninstalled, and pending pods are removed before exit.
    release: Option<(String, String)>,
    /// Age after which a held pod's entry in a PDB still selecting it is rewritten
    /// ([`super::disruption`]).
    renew_after: Duration,
    /// When each PDB (namespace, name) was last renewed without success.
    renew_failed: HashMap<(String, String), tokio::time::Instant>,
    /// Where the pending pods are published for confirmed release ([`super::release`]).
    board: Option<super::release::Board>,
}

impl Deleter {
    /// A deleter with no known pods.
    pub fn new(ctx: isolate::Context, metrics: Arc<Metrics>, wait: Option<Duration>) -> Deleter {
        Deleter {
            ctx,
            metrics,
            margin: wait.unwrap_or(Duration::ZERO),
            delays: (Duration::ZERO, Duration::ZERO),
            pending: HashMap::new(),
            foreign: std::collections::HashSet::new(),
            metas: HashMap::new(),
            isolated_seen: HashMap::new(),
            attempted: HashMap::new(),
            release: None,
            renew_after: super::disruption::RENEW_AFTER,
            renew_failed: HashMap::new(),
            board: None,
        }
    }

    /// Publishes the pending pods on `board`, for confirmed release
    /// ([`super::release::Release`]).
    pub fn publishing_to(mut self, board: super::release::Board) -> Deleter {
        self.board = Some(board);
        self
    }

    /// Counts each pod's deregistration delay (its annotation, its namespace's, else
    /// `default`; at most `max`) from its leaving the last EndpointSlice, as admission
    /// does: when the EndpointSlice controller lags (seconds after a kube-apiserver
    /// restart, while it relists), a pod due at its isolation time plus the delay would
    /// otherwise die before load balancers let go of it.
    pub fn counting_delays(mut self, default: Duration, max: Duration) -> Deleter {
        self.delays = (default, max);
        self
    }

    /// The deregistration delay of `pod`.
    fn delay_of(&self, pod: &Pending) -> Duration {
        let (default, max) = self.delays;
        let namespace = self.cache().namespace(&pod.namespace);
        super::decide::delay_from(pod.delay.as_deref(), &namespace, default).min(max)
    }

    /// Rewrites a held pod's `disruptedPods` entry once it is older than `after` (the
    /// default, [`super::disruption::RENEW_AFTER`], keeps it well within the disruption
    /// controller's two minutes; tests shorten both).
    pub fn renewing_disruptions_after(mut self, after: Duration) -> Deleter {
        self.renew_after = after;
        self
    }

    /// At shutdown when Deployment `namespace/name` is gone or being deleted (`helm
    /// uninstall`), deletes the pods the deleter was to delete and restores those left to
    /// their callers: nobody would do either afterwards.
    pub fn finishing_on_uninstall(mut self, namespace: &str, name: &str) -> Deleter {
        self.release = Some((namespace.to_string(), name.to_string()));
        self
    }

    /// Whether our own Deployment is gone or being deleted.
    async fn uninstalling(&self) -> bool {
        let Some((namespace, name)) = &self.release else {
            return false;
        };
        let api = Api::<Deployment>::namespaced(self.ctx.client.clone(), namespace);
        match api.get_opt(name).await {
            Ok(None) => true,
            Ok(Some(d)) => d.metadata.deletion_timestamp.is_some(),
            Err(error) => {
                tracing::warn!(%error, deployment = %format!("{namespace}/{name}"), "read own Deployment at shutdown");
                false
            }
        }
    }

    /// At shutdown during an uninstall: act on every pending pod now, cutting its delay
    /// short, instead of leaving it isolated with nobody to act on it.
    async fn finish_on_uninstall(&mut self) {
        if !self.uninstalling().await {
            return;
        }
        let (restore, delete): (Vec<Pending>, Vec<Pending>) = self
            .pending
            .values()
            .filter(|p| !p.terminating)
            .cloned()
            .partition(|p| p.restore_at.is_some());
        tracing::info!(
            delete = delete.len(),
            restore = restore.len(),
            "uninstalling: deleting the isolated pods of ReplicaSet scale-downs, restoring the others"
        );
        self.delete_all(delete).await;
        self.restore_all(restore).await;
    }

    fn cache(&self) -> &Cache {
        &self.ctx.cache
    }

    fn apply(&mut self, meta: &ObjectMeta) {
        let uid = meta.uid.clone().unwrap_or_default();
        match pending_from(meta) {
            // The webhook never isolates there (the configurations never send those
            // namespaces): a record there is someone else's, and the deleter is nobody's
            // deputy. Said once per pod.
            Some(p) if self.cache().excluded(&p.namespace) => {
                if self.foreign.insert(uid.clone()) {
                    tracing::warn!(namespace = %p.namespace, pod = %p.name, "a pod in a namespace graceful-drain never handles carries an isolation record; leaving it alone");
                }
                self.forget(&uid);
            }
            Some(p) => {
                self.cache()
                    .set_isolated(&p.namespace, &p.name, Some(p.delete_at));
                self.cache()
                    .set_released(&p.namespace, &p.name, p.released_at.is_some());
                if p.restore_at.is_some() {
                    self.metas.insert(uid.clone(), meta.clone());
                } else {
                    self.metas.remove(&uid);
                }
                if !self.pending.contains_key(&uid) && !p.terminating {
                    self.isolated_seen.insert(uid.clone(), Timestamp::now());
                }
                if let Some(board) = &self.board {
                    let entry = super::release::Entry {
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        released: p.released_at.is_some(),
                        terminating: p.terminating,
                    };
                    board.put(&uid, entry);
                }
                self.pending.insert(uid, p);
            }
            None => self.forget(&uid),
        }
    }

    fn forget(&mut self, uid: &str) {
        if let Some(board) = &self.board {
            board.remove(uid);
        }
        if let Some(p) = self.pending.remove(uid) {
            self.cache().set_isolated(&p.namespace, &p.name, None);
            self.cache().set_released(&p.namespace, &p.name, false);
        }
        self.metas.remove(uid);
        self.isolated_seen.remove(uid);
        self.attempted.remove(uid);
    }

    fn update_gauge(&self) {
        let count = self.pending.values().filter(|p| !p.terminating).count();
        self.metrics
            .pending_deletions
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Measures, once per pod, how long after it was seen isolated it left the last
    /// EndpointSlice that listed it.
    fn observe_slices(&mut self) {
        let cache = self.ctx.cache.clone();
        let pending = &self.pending;
        let metrics = &self.metrics;
        self.isolated_seen.retain(|uid, seen| {
            let Some(pod) = pending.get(uid) else {
                return false;
            };
            let Some(left) = cache.left_slices_at(&pod.namespace, &pod.name) else {
                return true;
            };
            let lag = left.duration_since(*seen).as_secs_f64().max(0.0);
            metrics.endpoint_removal.observe(lag);
            false
        });
    }

    /// Whether an EndpointSlice that load balancers follow lists `pod`.
    fn listed(&self, pod: &Pending) -> bool {
        self.cache().routed(&pod.namespace, &pod.name, &pod.uid)
    }

    /// The pods to delete now.
    pub fn due(&self, now: Timestamp) -> Vec<Pending> {
        self.pending
            .iter()
            .filter(|(uid, _)| self.attempted.get(*uid).is_none_or(Attempt::elapsed))
            .filter(|(_, p)| {
                let left = self.cache().left_slices_at(&p.namespace, &p.name);
                let wait = self.delay_of(p) + self.margin;
                is_due(p, now, wait, self.listed(p), left)
            })
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Removes due pods, [`REMOVALS_IN_FLIGHT`] at a time: by eviction, so each gets the
    /// `DisruptionTarget` condition and its controllers see an eviction; by DELETE when a
    /// PDB still selecting it refuses (its disruption was accounted at isolation and its
    /// delay is over). Both carry a UID precondition and the recorded grace period.
    async fn delete_all(&mut self, pods: Vec<Pending>) {
        let now = tokio::time::Instant::now();
        // Each pod with the failures before this attempt, which starts its new record.
        let started: Vec<(Pending, u32)> = pods
            .into_iter()
            .map(|pod| {
                let attempt = Attempt {
                    at: now,
                    failures: 0,
                };
                let before = self.attempted.insert(pod.uid.clone(), attempt);
                (pod, before.map_or(0, |a| a.failures))
            })
            .collect();
        let this = &*self;
        let results: Vec<(Pending, u32, Result<(), kube::Error>)> = futures::stream::iter(started)
            .map(|(pod, failures)| async move {
                let span =
                    tracing::info_span!("delete", namespace = %pod.namespace, pod = %pod.name);
                let result = this.remove(&pod).instrument(span).await;
                (pod, failures, result)
            })
            .buffer_unordered(REMOVALS_IN_FLIGHT)
            .collect()
            .await;
        for (pod, failures, result) in results {
            self.conclude(pod, result, failures).await;
        }
    }

    /// Removes `pod` with the recorded grace period ([`remove_pod`]).
    async fn remove(&self, pod: &Pending) -> Result<(), kube::Error> {
        remove_pod(&self.ctx, pod, pod.grace_period).await
    }

    /// Records what became of one removal; `failures` is how many failed before it.
    async fn conclude(&mut self, pod: Pending, result: Result<(), kube::Error>, failures: u32) {
        let span = tracing::info_span!("delete", namespace = %pod.namespace, pod = %pod.name);
        let _enter = span.enter();
        match result {
            Ok(()) => {
                tracing::info!(delete_at = %pod.delete_at, "removed isolated pod");
                self.metrics.pods_deleted.inc();
                let facts = PodFacts {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    owner_refs: pod.controller.clone().into_iter().collect(),
                    ..PodFacts::default()
                };
                let message = format!("Deleted after deregistration (due at {})", pod.delete_at);
                isolate::record_event(
                    &self.ctx,
                    &facts,
                    isolate::Severity::Normal,
                    webhook_reason::DELETED,
                    &message,
                    Timestamp::now(),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                tracing::info!(code = s.code, "isolated pod already gone or replaced");
                self.forget(&pod.uid);
            }
            Err(error) => {
                let failures = failures.saturating_add(1);
                if let Some(attempt) = self.attempted.get_mut(&pod.uid) {
                    attempt.failures = failures;
                }
                tracing::warn!(error = %graceful_drain_core::error::chain(&error), failures, "remove isolated pod; will retry")
            }
        }
    }

    /// When the next scan should run: the earliest delete time (or retry) of a pending pod,
    /// and at least every [`TICK`] (for the slices and the gauge). Waking at the delete
    /// time itself, not at the next tick after it, takes up to a second off every drain.
    fn next_scan(&self, leading: bool) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let tick = now + TICK;
        if !leading {
            return tick;
        }
        let wall = Timestamp::now();
        let due = self
            .pending
            .iter()
            .filter(|(_, p)| !p.terminating)
            .map(|(uid, p)| {
                let until = wall.duration_until(p.acts_at());
                // A little past, so the scan finds the pod due on the wall clock.
                let until = Duration::try_from(until).unwrap_or(Duration::ZERO) + SCAN_SLACK;
                let at = now + until;
                self.attempted.get(uid).map_or(at, |a| at.max(a.next_try()))
            })
            .min();
        due.map_or(tick, |at| at.min(tick))
    }

    /// One scan: delete every due pod when leading.
    pub async fn tick(&mut self, leading: bool) {
        let now = Timestamp::now();
        self.observe_slices();
        self.update_gauge();
        self.metrics.leader.set(i64::from(leading));
        if !leading {
            return;
        }
        let due = self.due(now);
        self.renew_disruptions(&due, now).await;
        self.delete_all(due).await;
        let forsaken = self.forsaken(now);
        self.restore_all(forsaken).await;
    }

    /// The held pods each cached PDB still selecting them lists as disrupted too long ago
    /// (or no longer), by PDB; `leaving` are about to be removed and need nothing.
    pub fn stale_disruptions(
        &self,
        leaving: &[Pending],
        now: Timestamp,
    ) -> std::collections::BTreeMap<(String, String), Vec<String>> {
        let mut stale = std::collections::BTreeMap::<_, Vec<String>>::new();
        for pod in self.pending.values() {
            if pod.terminating || leaving.iter().any(|l| l.uid == pod.uid) {
                continue;
            }
            for pdb in self.cache().pdbs_selecting(&pod.namespace, &pod.labels) {
                if super::disruption::needs_renewal(&pdb, &pod.name, now, self.renew_after) {
                    let name = pdb.metadata.name.clone().unwrap_or_default();
                    stale
                        .entry((pod.namespace.clone(), name))
                        .or_default()
                        .push(pod.name.clone());
                }
            }
        }
        stale
    }

    /// Keeps every held pod recorded as disrupted in the PDBs that still select it
    /// ([`super::disruption`]); a PDB whose renewal failed is tried again after
    /// [`RETRY_MAX`].
    async fn renew_disruptions(&mut self, leaving: &[Pending], now: Timestamp) {
        let stale = self.stale_disruptions(leaving, now);
        let clock = tokio::time::Instant::now();
        for ((namespace, name), pods) in stale {
            let key = (namespace.clone(), name.clone());
            if self
                .renew_failed
                .get(&key)
                .is_some_and(|at| clock < *at + RETRY_MAX)
            {
                continue;
            }
            let renewal =
                super::disruption::renew(&self.ctx, &namespace, &name, &pods, self.renew_after);
            match bounded(renewal).await {
                Ok(done) => {
                    self.renew_failed.remove(&key);
                    if done.renewed + done.recharged > 0 {
                        tracing::info!(pdb = %format!("{namespace}/{name}"), ?pods, renewed = done.renewed, recorded_again = done.recharged, "kept held pods recorded as disrupted");
                        self.metrics
                            .disruptions_renewed
                            .inc_by(u64::try_from(done.renewed + done.recharged).unwrap_or(0));
                    }
                    if done.unrecorded > 0 {
                        tracing::warn!(pdb = %format!("{namespace}/{name}"), ?pods, unrecorded = done.unrecorded, "held pods no longer recorded as disrupted and the budget is spent: the PDB counts them as healthy until they are deleted");
                    }
                }
                Err(error) => {
                    self.renew_failed.insert(key, clock);
                    tracing::warn!(pdb = %format!("{namespace}/{name}"), error = %graceful_drain_core::error::chain(&error), "renew held pods' disruptions; will retry");
                }
            }
        }
    }

    /// The pods their callers left isolated past their restore time.
    pub fn forsaken(&self, now: Timestamp) -> Vec<Pending> {
        self.pending
            .iter()
            .filter(|(uid, _)| self.attempted.get(*uid).is_none_or(Attempt::elapsed))
            .filter(|(_, p)| !p.terminating && p.restore_at.is_some_and(|at| now >= at))
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Puts each pod back into its Services and controller, one after another (a rare
    /// event: a forged review, a caller that gave up).
    async fn restore_all(&mut self, pods: Vec<Pending>) {
        for pod in pods {
            let before = self.attempted.insert(
                pod.uid.clone(),
                Attempt {
                    at: tokio::time::Instant::now(),
                    failures: 0,
                },
            );
            let span = tracing::info_span!("restore", namespace = %pod.namespace, pod = %pod.name);
            let result = self.restore(&pod).instrument(span.clone()).await;
            let _enter = span.enter();
            match result {
                Ok(()) => {
                    tracing::warn!(delete_at = %pod.delete_at, "no eviction or DELETE removed the isolated pod; restored it");
                    self.metrics.pods_restored.inc();
                }
                Err(RestoreError::Api(kube::Error::Api(s))) if s.code == 404 => {
                    tracing::info!("isolated pod already gone");
                    self.forget(&pod.uid);
                }
                Err(error) => {
                    let failures = before.map_or(0, |a| a.failures).saturating_add(1);
                    if let Some(attempt) = self.attempted.get_mut(&pod.uid) {
                        attempt.failures = failures;
                    }
                    tracing::warn!(error = %graceful_drain_core::error::chain(&error), failures, "restore isolated pod; will retry");
                }
            }
        }
    }

    /// Restores one pod from its watched metadata, with a UID-checked patch and an Event.
    async fn restore(&self, pod: &Pending) -> Result<(), RestoreError> {
        let meta = self
            .metas
            .get(&pod.uid)
            .ok_or_else(|| RestoreError::Unknown(format!("{}/{}", pod.namespace, pod.name)))?;
        let mut patch = super::restore::restore_patch(meta)?;
        patch.0.insert(
            1,
            json_patch::PatchOperation::Test(json_patch::TestOperation {
                path: json_patch::jsonptr::PointerBuf::from_tokens(["metadata", "uid"]),
                value: pod.uid.clone().into(),
            }),
        );
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &pod.namespace);
        let params = kube::api::PatchParams {
            field_manager: Some(graceful_drain_core::labels::FIELD_MANAGER.to_string()),
            ..kube::api::PatchParams::default()
        };
        bounded(api.patch(&pod.name, &params, &kube::api::Patch::Json::<()>(patch)))
            .await
            .map_err(RestoreError::Api)?;
        let facts = PodFacts {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            owner_refs: pod.controller.clone().into_iter().collect(),
            ..PodFacts::default()
        };
        let message = format!(
            "Put back into its Services and controller: no eviction or DELETE removed it by {} (due at {})",
            pod.restore_at.unwrap_or(pod.delete_at),
            pod.delete_at
        );
        isolate::record_event(
            &self.ctx,
            &facts,
            isolate::Severity::Warning,
            webhook_reason::RESTORED,
            &message,
            Timestamp::now(),
        )
        .await;
        Ok(())
    }

    /// Watches isolated pods and deletes them when due, while `leader` says so.
    pub async fn run(
        mut self,
        leader: watch::Receiver<bool>,
        shutdown: Shutdown,
    ) -> Result<(), Error> {
        let api = Api::<PartialObjectMeta<Pod>>::all(self.ctx.client.clone());
        let config = watcher::Config::default()
            .labels(DRAINING_LABEL)
            .any_semantic();
        let events = watcher::watcher(api, config).default_backoff();
        let mut events = std::pin::pin!(events);
        let mut scan_at = tokio::time::Instant::now();
        let mut relist: Option<Vec<ObjectMeta>> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    self.finish_on_uninstall().await;
                    return Ok(());
                }
                event = events.next() => match event {
                    None => return Err(Error::WatchEnded),
                    Some(Ok(Event::Apply(m) | Event::InitApply(m))) => {
                        if let Some(list) = relist.as_mut() { list.push(m.metadata.clone()); }
                        self.apply(&m.metadata);
                        scan_at = scan_at.min(self.next_scan(*leader.borrow()));
                    }
                    Some(Ok(Event::Delete(m))) => {
                        let uid = m.metadata.uid.as_deref().unwrap_or_default();
                        self.foreign.remove(uid);
                        self.forget(uid);
                    }
                    Some(Ok(Event::Init)) => relist = Some(Vec::new()),
                    Some(Ok(Event::InitDone)) => self.finish_relist(relist.take()),
                    Some(Err(error)) => tracing::warn!(error = %graceful_drain_core::error::chain(&error), "watch isolated pods; retrying"),
                },
                () = tokio::time::sleep_until(scan_at) => {
                    let leading = *leader.borrow();
                    self.tick(leading).await;
                    scan_at = self.next_scan(leading);
                }
            }
        }
    }

    fn finish_relist(&mut self, listed: Option<Vec<ObjectMeta>>) {
        self.cache().set_isolated_synced();
        let Some(listed) = listed else { return };
        let keep: std::collections::HashSet<String> =
            listed.iter().filter_map(|m| m.uid.clone()).collect();
        let gone: Vec<String> = self
            .pending
            .keys()
            .filter(|u| !keep.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            self.forget(&uid);
        }
        tracing::info!(
            pending = self.pending.len(),
            "isolated pods listed; resuming deletions"
        );
    }
}

#[cfg(test)]
mod tests;
