//! The deferred deleter: deletes isolated pods once their recorded time has come.
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
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use super::cache::Cache;
use super::decide::PodFacts;
use super::isolate::{self, REASON_DELETED};
use super::metrics::Metrics;
use crate::labels::{
    DELETE_AT_ANNOTATION, DRAINING_LABEL, GRACE_PERIOD_ANNOTATION, ORIGINAL_LABELS_ANNOTATION,
};
use crate::runtime::Shutdown;

/// Period of the due-pod scan. Delete times are whole seconds; one second keeps the
/// deletion within a second of the recorded time at negligible cost.
const TICK: Duration = Duration::from_secs(1);
/// After a failed delete, wait this long before trying the same pod again.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// In wait-for-endpoints mode, give up waiting for the slices this long after the delete
/// time: a Service selecting the draining label would otherwise keep the pod forever.
pub const MAX_ENDPOINT_WAIT: Duration = Duration::from_secs(600);

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
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub delete_at: Timestamp,
    pub grace_period: Option<i64>,
    pub terminating: bool,
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
    })
}

/// Whether `pod` may be deleted at `now`. `left_slices_at` is when the pod was first seen
/// in no EndpointSlice (wait-for-endpoints mode, with `margin`), `None` while it is listed.
pub fn is_due(
    pod: &Pending,
    now: Timestamp,
    wait_margin: Option<Duration>,
    left_slices_at: Option<Timestamp>,
) -> bool {
    if pod.terminating || now < pod.delete_at {
        return false;
    }
    let Some(margin) = wait_margin else {
        return true;
    };
    if now >= super::decide::add(pod.delete_at, MAX_ENDPOINT_WAIT) {
        return true;
    }
    left_slices_at.is_some_and(|t| now >= super::decide::add(t, margin))
}

/// The deleter and its state.
pub struct Deleter {
    pub ctx: isolate::Context,
    pub metrics: Arc<Metrics>,
    /// `Some(margin)` to wait until the pod left every EndpointSlice plus `margin`.
    pub wait_for_endpoints: Option<Duration>,
    pending: HashMap<String, Pending>,
    left_slices: HashMap<String, Timestamp>,
    attempted: HashMap<String, tokio::time::Instant>,
}

impl Deleter {
    /// A deleter with no known pods.
    pub fn new(ctx: isolate::Context, metrics: Arc<Metrics>, wait: Option<Duration>) -> Deleter {
        Deleter {
            ctx,
            metrics,
            wait_for_endpoints: wait,
            pending: HashMap::new(),
            left_slices: HashMap::new(),
            attempted: HashMap::new(),
        }
    }

    fn cache(&self) -> &Cache {
        &self.ctx.cache
    }

    fn apply(&mut self, meta: &ObjectMeta) {
        let uid = meta.uid.clone().unwrap_or_default();
        match pending_from(meta) {
            Some(p) => {
                self.cache()
                    .set_isolated(&p.namespace, &p.name, Some(p.delete_at));
                self.pending.insert(uid, p);
            }
            None => self.forget(&uid),
        }
    }

    fn forget(&mut self, uid: &str) {
        if let Some(p) = self.pending.remove(uid) {
            self.cache().set_isolated(&p.namespace, &p.name, None);
        }
        self.left_slices.remove(uid);
        self.attempted.remove(uid);
    }

    fn update_gauge(&self) {
        let count = self.pending.values().filter(|p| !p.terminating).count();
        self.metrics
            .pending_deletions
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Tracks when each pending pod left every EndpointSlice.
    fn observe_slices(&mut self, now: Timestamp) {
        if self.wait_for_endpoints.is_none() {
            return;
        }
        for (uid, pod) in &self.pending {
            let listed = self
                .cache()
                .endpoints_of(&pod.namespace, &pod.name)
                .iter()
                .any(|e| e.uid.as_deref().is_none_or(|u| u == uid));
            if listed {
                self.left_slices.remove(uid);
            } else {
                self.left_slices.entry(uid.clone()).or_insert(now);
            }
        }
    }

    /// The pods to delete now.
    pub fn due(&self, now: Timestamp) -> Vec<Pending> {
        self.pending
            .iter()
            .filter(|(uid, _)| {
                self.attempted
                    .get(*uid)
                    .is_none_or(|t| t.elapsed() >= RETRY_AFTER)
            })
            .filter(|(uid, p)| {
                is_due(
                    p,
                    now,
                    self.wait_for_endpoints,
                    self.left_slices.get(*uid).copied(),
                )
            })
            .map(|(_, p)| p.clone())
            .collect()
    }

    async fn delete(&mut self, pod: Pending) {
        self.attempted
            .insert(pod.uid.clone(), tokio::time::Instant::now());
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &pod.namespace);
        let params = DeleteParams {
            grace_period_seconds: pod.grace_period.and_then(|g| u32::try_from(g).ok()),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let span = tracing::info_span!("delete", namespace = %pod.namespace, pod = %pod.name);
        let _enter = span.enter();
        match api.delete(&pod.name, &params).await {
            Ok(_) => {
                tracing::info!(delete_at = %pod.delete_at, "deleted isolated pod");
                self.metrics.pods_deleted.inc();
                let facts = PodFacts {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    ..PodFacts::default()
                };
                let message = format!("Deleted after deregistration (due at {})", pod.delete_at);
                isolate::record_event(
                    &self.ctx,
                    &facts,
                    REASON_DELETED,
                    &message,
                    Timestamp::now(),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                tracing::info!(code = s.code, "isolated pod already gone or replaced");
                self.forget(&pod.uid);
            }
            Err(error) => tracing::warn!(%error, "delete isolated pod; will retry"),
        }
    }

    /// One scan: delete every due pod when leading.
    pub async fn tick(&mut self, leading: bool) {
        let now = Timestamp::now();
        self.observe_slices(now);
        self.update_gauge();
        if !leading {
            return;
        }
        for pod in self.due(now) {
            self.delete(pod).await;
        }
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
        let mut tick = tokio::time::interval(TICK);
        let mut relist: Option<Vec<ObjectMeta>> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                event = events.next() => match event {
                    None => return Err(Error::WatchEnded),
                    Some(Ok(Event::Apply(m) | Event::InitApply(m))) => {
                        if let Some(list) = relist.as_mut() { list.push(m.metadata.clone()); }
                        self.apply(&m.metadata);
                    }
                    Some(Ok(Event::Delete(m))) => self.forget(m.metadata.uid.as_deref().unwrap_or_default()),
                    Some(Ok(Event::Init)) => relist = Some(Vec::new()),
                    Some(Ok(Event::InitDone)) => self.finish_relist(relist.take()),
                    Some(Err(error)) => tracing::warn!(%error, "watch isolated pods; retrying"),
                },
                _ = tick.tick() => {
                    let leading = *leader.borrow();
                    self.tick(leading).await;
                }
            }
        }
    }

    fn finish_relist(&mut self, listed: Option<Vec<ObjectMeta>>) {
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
