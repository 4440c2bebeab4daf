//! The drain of one node: the [`Engine`] that watches the node's pods, plans and starts
//! the eviction tiers, takes in newcomers and waits until every planned pod is gone; the
//! view of the node it keeps meanwhile is [`state`]'s.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::task::{TaskCtx, Update, evict_pod};
use super::{DrainConfig, Error};
use crate::filters::{self, DaemonSetLookup, PodKey, UNSCHEDULABLE_TAINT, tolerates_cordon};
use crate::node::API_TIMEOUT;
use crate::progress::{PlannedTier, PodState, Progress};
use crate::report::{EventType, Metrics, NodeEvents};
use graceful_drain_core::labels::agent_reason;

/// An accepted eviction shows on the pod within a second (a deletionTimestamp, or our
/// webhook's draining label); if neither appeared after this long the eviction was lost
/// (e.g. another webhook turned it into a dry run), so it is sent again.
const REEVICT_AFTER: Duration = Duration::from_secs(30);
/// Shortest pause between two computations of a drain's progress while its pods change
/// (the drain notices its last pod gone at most this late).
const REFRESH: Duration = Duration::from_millis(50);

mod state;

use state::{State, Tracked, pod_state};

/// Looks up the DaemonSets controlling the given pods, once each.
async fn daemonset_lookups<'a>(
    client: &kube::Client,
    pods: impl Iterator<Item = &'a Pod>,
) -> HashMap<(String, String), DaemonSetLookup> {
    let mut out = HashMap::new();
    for pod in pods {
        let Some(owner) = filters::controller_of(pod).filter(|o| o.kind == "DaemonSet") else {
            continue;
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let entry = (ns.clone(), owner.name.clone());
        if out.contains_key(&entry) {
            continue;
        }
        let api: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
        let lookup = match tokio::time::timeout(API_TIMEOUT, api.get_opt(&owner.name)).await {
            Ok(Ok(Some(_))) => DaemonSetLookup::Exists,
            Ok(Ok(None)) => DaemonSetLookup::NotFound,
            Ok(Err(error)) => DaemonSetLookup::Failed(error.to_string()),
            Err(_) => DaemonSetLookup::Failed("get DaemonSet: timed out".into()),
        };
        out.insert(entry, lookup);
    }
    out
}

/// One drain of one node.
pub struct Engine {
    /// Client for the pod watch, the evictions and the PDB and DaemonSet lookups.
    pub client: kube::Client,
    /// The node being drained.
    pub node: String,
    /// The drain's options (the agent's flags, possibly overridden by the event).
    pub config: Arc<DrainConfig>,
    /// Where eviction outcomes and the count of remaining pods are recorded.
    pub metrics: Metrics,
    /// Posts the drain's Events (plan, tiers, blocked evictions) on the Node.
    pub events: NodeEvents,
    /// When this drain cordoned the node: pods created later that tolerate the cordon
    /// would be scheduled straight back, so they are not evicted.
    pub cordoned_at: jiff::Timestamp,
}

/// Whether the (optional) `--pod-selector` set of UIDs holds `pod`.
fn is_selected(selected: Option<&HashSet<String>>, pod: &Pod) -> bool {
    selected.is_none_or(|uids| pod.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)))
}

type PodStream = futures::stream::BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>;

impl Engine {
    /// Every pod on the node, whatever its labels: `--pod-selector` is applied to a LIST
    /// (see [`Engine::selected`]), never to this watch, because our webhook's relabelling
    /// takes an isolated pod out of a label-selected watch, which would make a pod the
    /// drain still waits for look gone.
    fn watch(&self) -> PodStream {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        watcher(api, config).default_backoff().boxed()
    }

    /// UIDs of the node's pods that `--pod-selector` selects (optionally only the pod
    /// `name` in `namespace`), from a LIST with both selectors, as kubectl selects them;
    /// `None` without a selector.
    async fn selected(&self, pod: Option<&PodKey>) -> Result<Option<HashSet<String>>, Error> {
        self.matching(self.config.pod_selector.as_deref(), pod)
            .await
    }

    /// UIDs of the node's pods (or of pod `pod` only) that `selector` selects, from a LIST
    /// with both selectors; `None` without a selector.
    async fn matching(
        &self,
        selector: Option<&str>,
        pod: Option<&PodKey>,
    ) -> Result<Option<HashSet<String>>, Error> {
        let Some(selector) = selector else {
            return Ok(None);
        };
        let mut fields = format!("spec.nodeName={}", self.node);
        let api: Api<Pod> = match pod {
            Some(key) => {
                fields.push_str(&format!(",metadata.name={}", key.name));
                Api::namespaced(self.client.clone(), &key.namespace)
            }
            None => Api::all(self.client.clone()),
        };
        let params = ListParams::default().fields(&fields).labels(selector);
        let failed = |message: String| Error::Select {
            node: self.node.clone(),
            selector: selector.to_string(),
            message,
        };
        let list = tokio::time::timeout(API_TIMEOUT, api.list_metadata(&params))
            .await
            .map_err(|_| failed(format!("no answer within {API_TIMEOUT:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        Ok(Some(
            list.items
                .into_iter()
                .filter_map(|p| p.metadata.uid)
                .collect(),
        ))
    }

    /// Reads the watch until its first complete list.
    async fn initial_list(&self, stream: &mut PodStream) -> Result<BTreeMap<PodKey, Pod>, Error> {
        let mut pods = BTreeMap::new();
        loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Init)) => pods.clear(),
                Ok(Some(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod))) => {
                    pods.insert(PodKey::of(&pod), pod);
                }
                Ok(Some(watcher::Event::Delete(pod))) => {
                    pods.remove(&PodKey::of(&pod));
                }
                Ok(Some(watcher::Event::InitDone)) => return Ok(pods),
                Ok(None) => {
                    return Err(Error::WatchEnded {
                        node: self.node.clone(),
                    });
                }
                Err(error) => self.watch_failed(&error).await,
            }
        }
    }

    /// A failed watch retries on its own; say so in the log and (rate-limited) on the Node,
    /// so a drain stuck on, say, missing permissions is not silent.
    async fn watch_failed(&self, error: &watcher::Error) {
        tracing::warn!(node = %self.node, error = %graceful_drain_core::error::chain(error), "watch pods");
        let message = format!("watch pods on node {} (retrying): {error}", self.node);
        let reason = agent_reason::POD_WATCH_FAILED;
        self.events
            .post(EventType::Warning, reason, "watch", message)
            .await;
    }

    /// Runs the filters on the first list (DaemonSets looked up once each).
    async fn plan(&self, initial: &BTreeMap<PodKey, Pod>) -> Result<filters::Plan, Error> {
        let lookups = daemonset_lookups(&self.client, initial.values()).await;
        let now = jiff::Timestamp::now();
        let plan = filters::plan(initial.values(), &self.config.filters, now, |ns, owner| {
            lookups
                .get(&(ns.to_string(), owner.name.clone()))
                .cloned()
                .unwrap_or(DaemonSetLookup::Exists)
        })
        .map_err(|refused| Error::Refused {
            node: self.node.clone(),
            refused,
        })?;
        for (key, warning) in &plan.warnings {
            tracing::warn!(pod = %key, %warning, "evicting with a warning");
        }
        Ok(plan)
    }

    fn task_ctx(&self) -> (Arc<TaskCtx>, mpsc::UnboundedReceiver<Update>) {
        let (tx, updates) = mpsc::unbounded_channel();
        let ctx = Arc::new(TaskCtx {
            client: self.client.clone(),
            config: self.config.clone(),
            metrics: self.metrics.clone(),
            events: self.events.clone(),
            permits: Semaphore::new(self.config.concurrency.max(1)),
            updates: tx,
        });
        (ctx, updates)
    }

    /// The drain's starting state from the node's `initial` pods: those the drain selects,
    /// planned into tiers (the plan posted as an Event); with the pods already isolated,
    /// which are awaited like the evicted ones.
    async fn planned(&self, initial: BTreeMap<PodKey, Pod>) -> Result<(State, Vec<Pod>), Error> {
        let selected = self.selected(None).await?;
        let candidates: BTreeMap<PodKey, Pod> = initial
            .iter()
            .filter(|(_, pod)| is_selected(selected.as_ref(), pod))
            .map(|(key, pod)| (key.clone(), pod.clone()))
            .collect();
        let plan = self.plan(&candidates).await?;
        let mut state = State {
            pods: initial,
            skipped: plan.skipped.len(),
            ..State::default()
        };
        state
            .seen
            .extend(state.pods.values().filter_map(|p| p.metadata.uid.clone()));
        state.tier_names = self.config.tiers.names();
        state.waiting = self.config.tiers.split(plan.evict).into();
        state.record_plan();
        self.post_plan(&state.plan).await;
        Ok((state, plan.awaited))
    }

    /// Runs the drain until nothing remains; publishes progress on `progress`. Dropping the
    /// future stops it (and every eviction task).
    pub async fn run(&self, progress: &watch::Sender<Progress>) -> Result<Progress, Error> {
        let started = tokio::time::Instant::now();
        let mut stream = self.watch();
        let initial = self.initial_list(&mut stream).await?;
        let (mut state, awaited) = self.planned(initial).await?;
        let (ctx, mut updates) = self.task_ctx();
        let mut tasks = JoinSet::new();
        self.start_tier(&mut state, &mut tasks, &ctx).await;
        // Pods our webhook already isolated (a restarted agent, another drain): evicted
        // like the others; the webhook refuses with 429 until each is due, then lets the
        // eviction through (it deletes nothing on its own).
        for pod in awaited {
            track(&mut state, &mut tasks, &ctx, pod);
        }
        let deadline = self.config.timeout.map(|t| started + t);
        let mut recheck = tokio::time::interval(REEVICT_AFTER / 3);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Progress (which pods are gone, what is left) is worked out again only after
        // something changed, and at most every REFRESH: a 500-pod drain brings thousands
        // of watch events, and recomputing it for every one cost O(pods) each.
        let mut changed = true;
        let mut refreshed_at: Option<tokio::time::Instant> = None;
        loop {
            let due = refreshed_at.is_none_or(|at| at.elapsed() >= REFRESH);
            if changed && due {
                changed = false;
                refreshed_at = Some(tokio::time::Instant::now());
                let current = state.progress(&self.config.filters);
                self.metrics.set_remaining(current.left());
                progress.send_if_modified(|p| replace_if_changed(p, &current));
                if current.remaining.is_empty() {
                    if self.start_tier(&mut state, &mut tasks, &ctx).await {
                        changed = true;
                        refreshed_at = None;
                        continue;
                    }
                    return Ok(current);
                }
            }
            let refresh_at = changed
                .then(|| refreshed_at.map(|at| at + REFRESH))
                .flatten();
            tokio::select! {
                event = stream.try_next() => {
                    changed = true;
                    match event {
                        Ok(Some(event)) => self.apply(&mut state, &mut tasks, &ctx, event).await,
                        Ok(None) => return Err(Error::WatchEnded { node: self.node.clone() }),
                        Err(error) => self.watch_failed(&error).await,
                    }
                }
                Some(update) = updates.recv() => {
                    changed = true;
                    if let Some(error) = self.apply_update(&mut state, update) {
                        return Err(error);
                    }
                }
                _ = recheck.tick() => {
                    changed = true;
                    evict_lost(&mut state, &mut tasks, &ctx);
                }
                Some(joined) = tasks.join_next() => {
                    if let Err(error) = joined {
                        tracing::error!(error = %graceful_drain_core::error::chain(&error), "eviction task failed");
                    }
                }
                () = sleep_until(refresh_at) => {}
                () = sleep_until(deadline) => {
                    return Err(Error::TimedOut {
                        node: self.node.clone(),
                        after: self.config.timeout.unwrap_or_default(),
                        message: state.progress(&self.config.filters).message(),
                    });
                }
            }
        }
    }

    /// Starts evicting the next tier (the first at the start); false when none is left.
    async fn start_tier(
        &self,
        state: &mut State,
        tasks: &mut JoinSet<()>,
        ctx: &Arc<TaskCtx>,
    ) -> bool {
        let Some((tier, pods)) = state.next_tier() else {
            return false;
        };
        if let Some((_, index, count)) = state.tier.filter(|(_, _, count)| *count > 1) {
            let n = pods.len();
            let name = state.tier_name(tier);
            let message = format!(
                "eviction tier {index}/{count} ({name}): {n} {}",
                crate::progress::pods(n)
            );
            tracing::info!(node = %self.node, tier = %name, index, count, pods = n, "eviction tier starts");
            self.events
                .post(EventType::Normal, agent_reason::EVICTION_TIER, "", message)
                .await;
        }
        for pod in pods {
            track(state, tasks, ctx, pod);
        }
        true
    }

    /// Posts the plan on the Node before the first eviction (see [`PlannedTier`]); a drain
    /// with nothing to evict posts none.
    async fn post_plan(&self, plan: &[PlannedTier]) {
        if plan.is_empty() {
            return;
        }
        let message = crate::progress::plan_message(plan);
        tracing::info!(node = %self.node, %message, "drain plan");
        self.events
            .post(EventType::Normal, agent_reason::DRAIN_PLAN, "", message)
            .await;
    }

    /// Applies one watch event; pods that appear after the first list and pass the
    /// filters are evicted too (a pod scheduled just before the cordon).
    async fn apply(
        &self,
        state: &mut State,
        tasks: &mut JoinSet<()>,
        ctx: &Arc<TaskCtx>,
        event: watcher::Event<Pod>,
    ) {
        if let Some(pod) = state.apply(event) {
            self.consider_newcomer(state, tasks, ctx, pod).await;
        }
    }

    async fn consider_newcomer(
        &self,
        state: &mut State,
        tasks: &mut JoinSet<()>,
        ctx: &Arc<TaskCtx>,
        pod: Pod,
    ) {
        if let Some(uid) = &pod.metadata.uid {
            state.seen.insert(uid.clone());
        }
        let key = PodKey::of(&pod);
        let lookups = daemonset_lookups(&self.client, std::iter::once(&pod)).await;
        let lookup = |owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
            lookups
                .get(&(key.namespace.clone(), owner.name.clone()))
                .cloned()
                .unwrap_or(DaemonSetLookup::Exists)
        };
        match self.selected(Some(&key)).await {
            Ok(Some(uids)) if !is_selected(Some(&uids), &pod) => return,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(pod = %key, error = %graceful_drain_core::error::chain(&error), "new pod left alone: cannot tell whether --pod-selector selects it");
                return;
            }
        }
        match filters::classify(&pod, &self.config.filters, jiff::Timestamp::now(), lookup) {
            filters::Verdict::Evict(_) if self.would_return(&pod) => {
                state.skipped += 1;
                let message = format!(
                    "pod {key} was created after the node was cordoned and tolerates \
                     {UNSCHEDULABLE_TAINT}; it is left on the node, since evicting it would \
                     only bring it back"
                );
                tracing::info!(pod = %key, "new pod tolerates the cordon; not evicted");
                let reason = agent_reason::EVICTION_SKIPPED;
                self.events
                    .post(EventType::Normal, reason, &key.to_string(), message)
                    .await;
            }
            filters::Verdict::Evict(_) => {
                if let Some(pod) = state.defer(self.config.tiers.tier_of(&pod), pod) {
                    track(state, tasks, ctx, pod);
                }
            }
            filters::Verdict::Await => track(state, tasks, ctx, pod),
            filters::Verdict::Skip(_) => state.skipped += 1,
            filters::Verdict::Refuse(refusal) => {
                let message = format!(
                    "pod {key} appeared during the drain and is left on the node: {refusal}"
                );
                tracing::warn!(pod = %key, %refusal, "new pod not evicted");
                self.events
                    .post(
                        EventType::Warning,
                        agent_reason::EVICTION_BLOCKED,
                        &key.to_string(),
                        message,
                    )
                    .await;
            }
        }
    }
}

fn track(state: &mut State, tasks: &mut JoinSet<()>, ctx: &Arc<TaskCtx>, pod: Pod) {
    let key = PodKey::of(&pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    state.seen.insert(uid.clone());
    state.planned += 1;
    let span = tracing::info_span!("evict", pod = %key);
    let tracked = Tracked {
        uid,
        blocked: None,
        accepted_at: None,
    };
    state.tracked.insert(key, tracked);
    tasks.spawn(evict_pod(ctx.clone(), pod).instrument(span));
}

/// Sends the eviction again for pods whose accepted eviction left no trace after
/// [`REEVICT_AFTER`]: still there, same UID, neither terminating nor isolated.
fn evict_lost(state: &mut State, tasks: &mut JoinSet<()>, ctx: &Arc<TaskCtx>) {
    let now = tokio::time::Instant::now();
    let lost: Vec<Pod> = state
        .tracked
        .iter_mut()
        .filter(|(_, t)| {
            t.accepted_at
                .is_some_and(|at| now.duration_since(at) >= REEVICT_AFTER)
        })
        .filter_map(|(key, t)| {
            let pod = state.pods.get(key)?;
            if pod_state(Some(pod), t) != PodState::Evicting {
                return None;
            }
            t.accepted_at = None;
            Some(pod.clone())
        })
        .collect();
    for pod in lost {
        let key = PodKey::of(&pod);
        tracing::warn!(pod = %key, "eviction was accepted but the pod is still running; evicting again");
        let span = tracing::info_span!("evict", pod = %key);
        tasks.spawn(evict_pod(ctx.clone(), pod).instrument(span));
    }
}

impl Engine {
    /// A newcomer that would be scheduled straight back after its eviction: created after
    /// the cordon and tolerating it (evicting it would loop).
    fn would_return(&self, pod: &Pod) -> bool {
        let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created.is_some_and(|c| c >= self.cordoned_at) && tolerates_cordon(pod)
    }

    /// Applies an eviction task's report; an unevictable pod fails the drain.
    fn apply_update(&self, state: &mut State, update: Update) -> Option<Error> {
        match update {
            Update::Blocked(key, blocker) => {
                if let Some(t) = state.tracked.get_mut(&key) {
                    t.blocked = Some(blocker);
                }
            }
            Update::Accepted(key) => {
                if let Some(t) = state.tracked.get_mut(&key) {
                    t.blocked = None;
                    t.accepted_at = Some(tokio::time::Instant::now());
                }
            }
            Update::Unevictable(pod, blocker, message) => {
                return Some(Error::Unevictable {
                    node: self.node.clone(),
                    pod,
                    blocker,
                    message,
                });
            }
        }
        None
    }
}

fn replace_if_changed(slot: &mut Progress, new: &Progress) -> bool {
    if slot == new {
        false
    } else {
        *slot = new.clone();
        true
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{key, mock};
    use super::*;
    use graceful_drain_core::labels::DRAINING_LABEL;
    use http::Response;
    use kube::client::Body;

    #[tokio::test(start_paused = true)]
    async fn an_accepted_eviction_that_left_no_trace_is_sent_again() {
        let (client, mut handle) = mock();
        let mut registry = prometheus_client::registry::Registry::default();
        let (tx, mut updates) = mpsc::unbounded_channel();
        let ctx = Arc::new(TaskCtx {
            client: client.clone(),
            config: Arc::new(DrainConfig::default()),
            metrics: Metrics::register(&mut registry),
            events: NodeEvents::new(client, "n1"),
            permits: Semaphore::new(1),
            updates: tx,
        });
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-1".into());
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.uid = Some("u1".into());
        let mut state = State::default();
        state.pods.insert(key(), pod.clone());
        let mut isolated = pod.clone();
        isolated.metadata.name = Some("web-2".into());
        isolated.metadata.labels = Some([(DRAINING_LABEL.to_string(), "true".to_string())].into());
        let isolated_key = PodKey::of(&isolated);
        state.pods.insert(isolated_key.clone(), isolated);
        let mut tasks = JoinSet::new();
        for k in [key(), isolated_key] {
            let accepted_at = Some(tokio::time::Instant::now());
            let tracked = Tracked {
                uid: "u1".into(),
                blocked: None,
                accepted_at,
            };
            state.tracked.insert(k, tracked);
        }
        evict_lost(&mut state, &mut tasks, &ctx);
        assert!(tasks.is_empty(), "too early to call an eviction lost");
        tokio::time::advance(REEVICT_AFTER).await;
        evict_lost(&mut state, &mut tasks, &ctx);
        assert_eq!(
            tasks.len(),
            1,
            "only the pod that is neither isolated nor terminating"
        );
        let (request, respond) = handle.next_request().await.unwrap();
        assert_eq!(
            request.uri().path(),
            "/api/v1/namespaces/shop/pods/web-1/eviction"
        );
        respond.send_response(
            Response::builder()
                .status(201)
                .body(Body::from(b"{}".to_vec()))
                .unwrap(),
        );
        assert!(matches!(updates.recv().await, Some(Update::Accepted(k)) if k == key()));
    }
}
