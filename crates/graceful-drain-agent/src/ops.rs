//! The agent's operations on its node — a drain, or the return to service
//! (maintenance-complete) — each run in a background task, with their state kept in memory
//! so the SLM RPCs answer from it at once.
//!
//! At most one operation exists; starting one stops the other first (the new task awaits
//! the old one, so their Node writes never interleave). Every operation belongs to the
//! LifecycleEvent that asked for it: a repeated Start or End of the same event answers from
//! the running operation, while a new event — or a Start once the operation ended — gets a
//! fresh one, so a second drain after an uncordon cordons and evicts again and an old
//! failure is never replayed to a new event.
//!
//! A drain writes its progress into the `DrainInProgress` condition and its event's name
//! into a Node annotation, so a restarted agent finds `cordoned + DrainInProgress` and
//! resumes ([`Agent::resume`]) — but only while that event is still live. While it runs, a
//! drain re-reads its event every [`DrainConfig::event_check`] and stops once the event
//! ended (SlaExpired, Failed, deleted) or its SLA passed. A drain that stops without
//! completing keeps the cordon and gives the node back to the load balancers. Process
//! shutdown stops a task without touching the Node, precisely so that the next agent
//! resumes.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::drain::{self, DrainConfig, Engine};
use super::hooks::{HookContext, HookError, HookPoint, HookStep, Hooks};
use super::node::{self, Condition, DRAIN_IN_PROGRESS, DRAINED, reason as cond};
use super::progress::Progress;
use super::report::{DrainOutcome, EventType, Metrics, NodeEvents};
use super::tiers;
use graceful_drain_core::backoff::Backoff;
use graceful_drain_core::labels::{LAST_POD_SELECTOR_ANNOTATION, TIERS_ANNOTATION, agent_reason};
use graceful_drain_core::lifecycle::{ClaimStatus, LifecycleEvent};
use graceful_drain_core::runtime::Shutdown;

/// The DrainInProgress message is rewritten at most this often: each write is a Node
/// status PATCH, and a 500-pod drain changes its counts hundreds of times.
const CONDITION_UPDATE_INTERVAL: Duration = Duration::from_secs(5);
/// Longest wait between retries of a failed Node read or write.
const NODE_RETRY_CAP: Duration = Duration::from_secs(30);
/// Longest an End waits for a finished drain to record its outcome: well inside the
/// kubelet's 45 s call timeout, and longer than one Node write normally takes.
const SETTLE_WAIT: Duration = Duration::from_secs(5);
/// What a drain that stops without completing leaves on the Node, as its message says.
const RELEASED: &str = "node left cordoned and returned to the load balancers";

/// The two operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum OpKind {
    /// Cordon, evict everything, wait until it is gone.
    Drain,
    /// Uncordon and clear what the drain left on the Node.
    Maintenance,
}

/// Where an operation is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "phase", content = "reason", rename_all = "camelCase")]
pub enum Phase {
    /// Still working (also while a finished drain is writing its outcome on the Node).
    Running,
    /// Finished: the node is drained, or back in service.
    Complete,
    /// It cannot finish (filters refused, timeout); the message says why.
    Failed(String),
    /// Stopped on request (SLA expired, superseded).
    Stopped(String),
}

/// A snapshot of the agent's state for the CLI, the reconciler and tests.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The node this agent serves.
    pub node: String,
    /// The current (or last) operation; `None` until one was started.
    pub operation: Option<OpKind>,
    /// Where that operation is; `None` when there is none.
    pub phase: Option<Phase>,
    /// The operation's progress: pod counts of a drain and the hook running now (a
    /// maintenance operation only ever shows a hook); empty when there is no operation.
    pub progress: Progress,
    /// The DrainInProgress condition message.
    pub message: String,
}

struct Operation {
    kind: OpKind,
    /// The drain returned and its outcome is being written on the Node.
    finishing: Arc<std::sync::atomic::AtomicBool>,
    /// The LifecycleEvent it serves; `None` when the caller named none.
    event: Arc<Mutex<Option<String>>>,
    token: CancellationToken,
    stop_reason: Arc<Mutex<Option<String>>>,
    phase: watch::Receiver<Phase>,
    progress: watch::Receiver<Progress>,
    handle: JoinHandle<()>,
}

/// What every operation task needs.
pub struct Inner {
    /// Client for every API call of the operations.
    pub client: kube::Client,
    /// The node this agent serves.
    pub node: String,
    /// Label the node out of external load balancers while it drains.
    pub exclude_from_lb: bool,
    /// The drain options from the flags; a LifecycleEvent may override the tiers.
    pub config: Arc<DrainConfig>,
    /// Maintenance hooks run at the points of both transitions.
    pub hooks: Hooks,
    /// Drain and eviction metrics.
    pub metrics: Metrics,
    /// Posts the operations' Events on the Node.
    pub events: NodeEvents,
    /// The process's shutdown: cancels every operation without touching the Node.
    pub shutdown: Shutdown,
}

/// The node agent's state. Cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
    current: Arc<Mutex<Option<Operation>>>,
}

impl Agent {
    /// An agent with no operation running.
    pub fn new(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
            current: Arc::default(),
        }
    }

    /// The node this agent serves.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// Start of `kind` for `event`: a repeated Start of the running operation of the same
    /// event answers from it (idempotent); anything else — another event, or a Start after
    /// the operation ended — starts a fresh operation, stopping the current one first.
    /// Returns at once.
    pub fn begin(&self, kind: OpKind, event: Option<&str>) -> Phase {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(op) = current.as_ref().filter(|op| op.serves(kind, event)) {
            let phase = op.phase.borrow().clone();
            if phase == Phase::Running {
                op.adopt(event);
                return phase;
            }
        }
        self.replace(&mut current, kind, event)
    }

    /// End of `kind` for `event`: the phase of the operation serving that event, or — when
    /// the agent has none (a restarted agent, or the Node still shows the start reason of
    /// an earlier, failed event) — a fresh operation for it, reported as running.
    pub fn poll(&self, kind: OpKind, event: Option<&str>) -> Phase {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(op) = current.as_ref().filter(|op| op.serves(kind, event)) {
            op.adopt(event);
            return op.phase.borrow().clone();
        }
        self.replace(&mut current, kind, event)
    }

    /// [`Agent::poll`], but when the operation has ended and is writing its outcome on the
    /// Node, waits (at most `SETTLE_WAIT`, 5 s) for that write, so the answer follows the
    /// Node: the reconciler's pass triggered by that write learns the end at once, and a
    /// Node that says Drained never lags an End that says complete.
    pub async fn poll_settled(&self, kind: OpKind, event: Option<&str>) -> Phase {
        let phase = self.poll(kind, event);
        let settling = {
            let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            current
                .as_ref()
                .filter(|op| op.kind == kind && op.finishing.load(Ordering::SeqCst))
                .map(|op| op.phase.clone())
        };
        match settling {
            Some(mut changes) if phase == Phase::Running => {
                let settled = changes.wait_for(|p| *p != Phase::Running);
                match tokio::time::timeout(SETTLE_WAIT, settled).await {
                    Ok(Ok(settled)) => settled.clone(),
                    _ => phase,
                }
            }
            _ => phase,
        }
    }

    fn replace(&self, current: &mut Option<Operation>, kind: OpKind, event: Option<&str>) -> Phase {
        let previous = current.take().map(|op| {
            stop_op(&op, format!("superseded by {kind:?}"));
            op.handle
        });
        *current = Some(self.spawn(kind, event, previous));
        Phase::Running
    }

    /// The phase of `kind`, if it is the current operation.
    pub fn phase(&self, kind: OpKind) -> Option<Phase> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current
            .as_ref()
            .filter(|op| op.kind == kind)
            .map(|op| op.phase.borrow().clone())
    }

    /// Stops `kind` if it is running, recording `reason` on the Node.
    pub fn stop(&self, kind: OpKind, reason: String) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(op) = current.as_ref().filter(|op| op.kind == kind) {
            stop_op(op, reason);
        } else if kind == OpKind::Drain {
            // Not running here (a restarted agent): still record the stop on the Node, or
            // the next restart would resume a drain whose SLA expired.
            let inner = self.inner.clone();
            let shutdown = inner.shutdown.clone();
            graceful_drain_core::runtime::spawn_owned("record-drain-stop", shutdown, async move {
                record_stop(&inner, reason).await;
                Ok::<(), std::convert::Infallible>(())
            });
        }
    }

    /// The Events of this agent's node.
    pub fn events(&self) -> super::report::NodeEvents {
        self.inner.events.clone()
    }

    /// The current state.
    pub fn snapshot(&self) -> Snapshot {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let progress = current
            .as_ref()
            .map(|op| op.progress.borrow().clone())
            .unwrap_or_default();
        Snapshot {
            node: self.inner.node.clone(),
            operation: current.as_ref().map(|op| op.kind),
            phase: current.as_ref().map(|op| op.phase.borrow().clone()),
            message: progress.message(),
            progress,
        }
    }

    /// Resumes a drain a previous agent left running (cordoned + DrainInProgress=True) if
    /// the LifecycleEvent it served is still live; otherwise records that drain as stopped
    /// and gives the node back to the load balancers (the cordon stays). Retries reading
    /// the Node until it succeeds or the process stops.
    pub async fn resume(&self) {
        let inner = &self.inner;
        let read = retry("read node", inner, &inner.shutdown, || {
            node::get(&inner.client, &inner.node)
        });
        let Some(node) = read.await else { return };
        if !node::drain_was_running(&node) || self.phase(OpKind::Drain).is_some() {
            return;
        }
        let event = node::drain_event(&node);
        let liveness = match &event {
            Some(name) => event_liveness(&inner.client, name).await,
            None => Liveness::Ended("the drain names no LifecycleEvent".into()),
        };
        match liveness {
            Liveness::Ended(why) => {
                tracing::info!(node = %inner.node, %why, "not resuming the drain a previous agent started");
                let reason = format!("drain not resumed after an agent restart: {why}");
                record_stop(inner, reason).await;
            }
            Liveness::Live | Liveness::Unknown(_) => {
                tracing::info!(node = %inner.node, ?event, "resuming the drain a previous agent started");
                let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
                if current.is_none() {
                    self.replace(&mut current, OpKind::Drain, event.as_deref());
                }
            }
        }
    }

    fn spawn(
        &self,
        kind: OpKind,
        event: Option<&str>,
        previous: Option<JoinHandle<()>>,
    ) -> Operation {
        let event = Arc::new(Mutex::new(event.map(str::to_string)));
        let finishing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let token = self.inner.shutdown.child_token();
        let stop_reason = Arc::new(Mutex::new(None));
        let (phase_tx, phase) = watch::channel(Phase::Running);
        let (progress_tx, progress) = watch::channel(Progress::default());
        let run = Run {
            inner: self.inner.clone(),
            operation_id: uuid::Uuid::new_v4().simple().to_string(),
            event: event.clone(),
            finishing: finishing.clone(),
            token: token.clone(),
            stop_reason: stop_reason.clone(),
            phase: phase_tx,
            progress: progress_tx,
            written: Mutex::default(),
        };
        let span = tracing::info_span!(parent: None, "operation", node = %self.inner.node, ?kind);
        let handle = tokio::spawn(tracing::Instrument::instrument(
            async move {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                match kind {
                    OpKind::Drain => run.drain().await,
                    OpKind::Maintenance => run.maintenance().await,
                }
            },
            span,
        ));
        Operation {
            kind,
            finishing,
            event,
            token,
            stop_reason,
            phase,
            progress,
            handle,
        }
    }
}

impl Operation {
    /// Whether this operation answers for `event`'s `kind`: the same event, or a caller or
    /// an operation that names none.
    fn serves(&self, kind: OpKind, event: Option<&str>) -> bool {
        let mine = self.event.lock().unwrap_or_else(|e| e.into_inner());
        self.kind == kind && (event.is_none() || mine.is_none() || mine.as_deref() == event)
    }

    /// Records `event` on an operation that did not know its event yet.
    fn adopt(&self, event: Option<&str>) {
        let mut mine = self.event.lock().unwrap_or_else(|e| e.into_inner());
        if mine.is_none() {
            *mine = event.map(str::to_string);
        }
    }
}

/// Whether a LifecycleEvent still asks for its transition.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Liveness {
    Live,
    /// It ended; why.
    Ended(String),
    /// It could not be read; why (the drain goes on: an API outage is no reason to stop).
    Unknown(String),
}

/// Reads `name` and says whether it is still live: not gone, not being deleted, not in a
/// terminal claim status, and (when claimed) not past its SLA deadline.
async fn event_liveness(client: &kube::Client, name: &str) -> Liveness {
    let api: kube::Api<LifecycleEvent> = kube::Api::all(client.clone());
    let read = tokio::time::timeout(node::API_TIMEOUT, api.get_opt(name)).await;
    let event = match read {
        Ok(Ok(Some(event))) => event,
        Ok(Ok(None)) => return Liveness::Ended(format!("lifecycleevent {name} is gone")),
        Ok(Err(error)) => return Liveness::Unknown(format!("read lifecycleevent {name}: {error}")),
        Err(_) => return Liveness::Unknown(format!("read lifecycleevent {name}: timed out")),
    };
    event_view_liveness(&event, jiff::Timestamp::now())
}

/// The pure part of [`event_liveness`].
fn event_view_liveness(event: &LifecycleEvent, now: jiff::Timestamp) -> Liveness {
    let name = event.metadata.name.as_deref().unwrap_or_default();
    if event.metadata.deletion_timestamp.is_some() {
        return Liveness::Ended(format!("lifecycleevent {name} is being deleted"));
    }
    let status = event.status.as_ref();
    let claim = status.and_then(|s| s.claim_status);
    if let Some(claim) = claim.filter(|c| c.is_terminal()) {
        return Liveness::Ended(format!("lifecycleevent {name} ended {claim:?}"));
    }
    let deadline = status
        .and_then(|s| s.sla.as_deref())
        .and_then(|sla| sla.parse::<jiff::Timestamp>().ok());
    if claim == Some(ClaimStatus::Claimed) && deadline.is_some_and(|d| now > d) {
        return Liveness::Ended(format!("the SLA of lifecycleevent {name} passed"));
    }
    Liveness::Live
}

/// Sets DrainInProgress=False (DrainStopped) if the Node says a drain is in progress, and
/// gives the node back to the load balancers (the cordon stays).
async fn record_stop(inner: &Inner, reason: String) {
    let result = async {
        let node = node::get(&inner.client, &inner.node).await?;
        if node::condition_is_true(&node, DRAIN_IN_PROGRESS) {
            let message = format!("{reason}; {RELEASED}");
            let stopped = condition(DRAIN_IN_PROGRESS, false, cond::DRAIN_STOPPED, message);
            let node = node::release(&inner.client, &node).await?;
            node::set_conditions(&inner.client, &node, &[stopped]).await?;
        }
        Ok::<(), node::Error>(())
    };
    if let Err(error) = result.await {
        tracing::warn!(node = %inner.node, error = %graceful_drain_core::error::chain(&error), "record the stopped drain");
    }
}

fn stop_op(op: &Operation, reason: String) {
    if matches!(*op.phase.borrow(), Phase::Running) {
        let mut slot = op.stop_reason.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(reason);
    }
    op.token.cancel();
}

/// Calls `f` until it succeeds, with capped exponential backoff, reporting each failure
/// in the log and (rate-limited) as a Node Event; `None` once `token` is cancelled.
async fn retry<T, E, F, Fut>(
    what: &str,
    inner: &Inner,
    token: &CancellationToken,
    mut f: F,
) -> Option<T>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = Backoff::new(Duration::from_secs(1), NODE_RETRY_CAP);
    loop {
        let delay = tokio::select! {
            () = token.cancelled() => return None,
            result = f() => match result {
                Ok(value) => return Some(value),
                Err(error) => {
                    let delay = backoff.next_pause();
                    let error = graceful_drain_core::error::chain(&error).to_string();
                    tracing::warn!(node = %inner.node, %error, retry_in = ?delay, "{what}");
                    // Said on the Node too (rate-limited), so a stuck step is visible.
                    let message = format!("{what} (retrying): {error}");
                    let events = &inner.events;
                    events.post(EventType::Warning, agent_reason::NODE_UPDATE_FAILED, what, message).await;
                    delay
                }
            },
        };
        tokio::select! {
            () = token.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// One operation's task.
struct Run {
    inner: Arc<Inner>,
    /// Ties hook records to this operation when it serves no LifecycleEvent.
    operation_id: String,
    event: Arc<Mutex<Option<String>>>,
    finishing: Arc<std::sync::atomic::AtomicBool>,
    token: CancellationToken,
    stop_reason: Arc<Mutex<Option<String>>>,
    phase: watch::Sender<Phase>,
    progress: watch::Sender<Progress>,
    /// The Node as this drain's last condition write returned it. A progress update
    /// patches from it instead of reading the Node first: the patch merges conditions by
    /// type, and the only fact taken from the Node — when our own condition last changed
    /// status — is one this drain wrote. Cleared when a write fails.
    written: Mutex<Option<k8s_openapi::api::core::v1::Node>>,
}

enum Ended {
    Done(Result<Progress, drain::Error>),
    /// A maintenance hook failed the drain.
    Hook(HookError),
    /// Stopped on request, with the reason.
    Stopped(String),
    /// The process is shutting down: leave the Node as it is so the next agent resumes.
    Shutdown,
}

impl Run {
    fn ended_by_token(&self) -> Ended {
        if self.inner.shutdown.is_cancelled() {
            return Ended::Shutdown;
        }
        let reason = self
            .stop_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ended::Stopped(reason.unwrap_or_else(|| "stopped".into()))
    }

    async fn drain(self) {
        let started = Instant::now();
        let ended = tokio::select! {
            ended = self.drain_steps() => ended,
            () = self.publish_progress() => Ended::Shutdown,
            reason = self.watch_event() => Ended::Stopped(reason),
            () = self.token.cancelled() => self.ended_by_token(),
        };
        self.finish_drain(ended, started.elapsed()).await;
    }

    /// The drain itself: the event's overrides, the drain-start hooks, the cordon, the
    /// before-eviction hooks, the evictions until every pod is gone, the after-last-pod
    /// hooks.
    async fn drain_steps(&self) -> Ended {
        let inner = &self.inner;
        // A LifecycleEvent whose overrides are unusable fails the drain before anything
        // is touched.
        let config = match self.config_for_event().await {
            Ok(config) => config,
            Err(error) => return Ended::Done(Err(error)),
        };
        if let Err(error) = self.hooks(HookPoint::DrainStart).await {
            return Ended::Hook(error);
        }
        let prepared = retry("prepare node for drain", inner, &self.token, || {
            self.prepare()
        });
        if prepared.await.is_none() {
            return self.ended_by_token();
        }
        if let Err(error) = self.hooks(HookPoint::BeforeEviction).await {
            return Ended::Hook(error);
        }
        let engine = Engine {
            client: inner.client.clone(),
            node: inner.node.clone(),
            config,
            metrics: inner.metrics.clone(),
            events: inner.events.clone(),
            cordoned_at: jiff::Timestamp::now(),
        };
        let progress = match engine.run(&self.progress).await {
            Ok(progress) => progress,
            Err(error) => return Ended::Done(Err(error)),
        };
        if let Err(error) = self.hooks(HookPoint::AfterLastPod).await {
            return Ended::Hook(error);
        }
        Ended::Done(Ok(progress))
    }

    /// Runs the hooks of `point`, showing the running one in the progress.
    async fn hooks(&self, point: HookPoint) -> Result<(), HookError> {
        let hooks = &self.inner.hooks;
        if hooks.at(point).next().is_none() {
            return Ok(());
        }
        let event = self.event();
        let ctx = HookContext {
            client: &self.inner.client,
            node: &self.inner.node,
            event: event.as_deref(),
            operation: event.as_deref().unwrap_or(&self.operation_id),
            events: &self.inner.events,
        };
        let show = |step: Option<HookStep>| {
            self.progress.send_modify(|p| p.hook = step);
        };
        hooks.run(point, &ctx, &show).await
    }

    /// The drain's configuration with what its LifecycleEvent overrides: the annotation
    /// `graceful-drain.io/tiers` replaces `--tiers`, and `graceful-drain.io/last-pod-selector`
    /// replaces `--last-pod-selector` (empty: no last tier). An annotation that cannot be
    /// used fails the drain, naming it; an event that cannot be read leaves the agent's own
    /// configuration.
    async fn config_for_event(&self) -> Result<Arc<DrainConfig>, drain::Error> {
        let base = self.inner.config.clone();
        let Some(name) = self.event() else {
            return Ok(base);
        };
        let api: kube::Api<LifecycleEvent> = kube::Api::all(self.inner.client.clone());
        let event = match tokio::time::timeout(node::API_TIMEOUT, api.get_opt(&name)).await {
            Ok(Ok(Some(event))) => event,
            Ok(Ok(None)) => return Ok(base),
            Ok(Err(error)) => {
                tracing::warn!(event = %name, error = %graceful_drain_core::error::chain(&error), "read the drain's lifecycle event for overrides; using the agent's settings");
                return Ok(base);
            }
            Err(_) => {
                tracing::warn!(event = %name, "read the drain's lifecycle event for overrides: timed out; using the agent's settings");
                return Ok(base);
            }
        };
        let annotations = event.metadata.annotations.unwrap_or_default();
        let (specs, last) = (
            annotations.get(TIERS_ANNOTATION),
            annotations.get(LAST_POD_SELECTOR_ANNOTATION),
        );
        if specs.is_none() && last.is_none() {
            return Ok(base);
        }
        let invalid = |annotation, error| drain::Error::Override {
            node: self.inner.node.clone(),
            event: name.clone(),
            annotation,
            error,
        };
        let mut tiers = base.tiers.clone();
        if let Some(text) = specs {
            tiers = tiers::parse_specs(text)
                .and_then(|specs| tiers.overridden(Some(specs), None))
                .map_err(|e| invalid(TIERS_ANNOTATION, e))?;
        }
        if let Some(selector) = last {
            tiers = tiers
                .overridden(None, Some(selector.clone()))
                .map_err(|e| invalid(LAST_POD_SELECTOR_ANNOTATION, e))?;
        }
        tracing::info!(event = %name, tiers = ?tiers.names(), "the event overrides the eviction tiers");
        let mut config = (*base).clone();
        config.tiers = tiers;
        Ok(Arc::new(config))
    }

    fn event(&self) -> Option<String> {
        self.event.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Re-reads the drain's LifecycleEvent every [`DrainConfig::event_check`] and returns
    /// why the drain must stop once the event ended, so a drain never outlives its event
    /// (SLA expired, failed, deleted, or a kubelet that stopped asking). Never returns for
    /// a drain that names no event.
    async fn watch_event(&self) -> String {
        let every = self.inner.config.event_check;
        loop {
            tokio::time::sleep(every).await;
            let Some(name) = self.event() else { continue };
            match event_liveness(&self.inner.client, &name).await {
                Liveness::Live => {}
                Liveness::Unknown(why) => tracing::warn!(%why, "check the drain's lifecycle event"),
                Liveness::Ended(why) => return why,
            }
        }
    }

    /// Cordons and labels the node and marks the drain in progress.
    async fn prepare(&self) -> Result<(), node::Error> {
        let inner = &self.inner;
        let current = node::get(&inner.client, &inner.node).await?;
        let event = self.event();
        let cordoned = node::cordon(
            &inner.client,
            &current,
            inner.exclude_from_lb,
            event.as_deref(),
        )
        .await?;
        let condition = Condition {
            type_: DRAIN_IN_PROGRESS,
            status: true,
            reason: cond::DRAINING,
            message: "listing pods".into(),
        };
        let node = node::set_conditions(&inner.client, &cordoned, &[condition]).await?;
        inner.events.set_node_uid(node.metadata.uid.clone());
        *self.written.lock().unwrap_or_else(|e| e.into_inner()) = Some(node);
        let message = "node cordoned; evicting its pods".to_string();
        inner
            .events
            .post(EventType::Normal, agent_reason::DRAIN_STARTED, "", message)
            .await;
        Ok(())
    }

    /// Rewrites the DrainInProgress message as progress changes, at most every
    /// [`CONDITION_UPDATE_INTERVAL`]. Never returns while the drain runs.
    async fn publish_progress(&self) {
        let mut changes = self.progress.subscribe();
        let mut written = String::new();
        loop {
            if changes.changed().await.is_err() {
                return futures::future::pending().await;
            }
            let message = changes.borrow_and_update().message();
            if message != written {
                let condition = Condition {
                    type_: DRAIN_IN_PROGRESS,
                    status: true,
                    reason: cond::DRAINING,
                    message: message.clone(),
                };
                match self.write_conditions(&[condition]).await {
                    Ok(()) => written = message,
                    Err(error) => {
                        tracing::warn!(error = %graceful_drain_core::error::chain(&error), "update drain progress condition")
                    }
                }
            }
            tokio::time::sleep(CONDITION_UPDATE_INTERVAL).await;
        }
    }

    /// Writes the final conditions; a drain that did not complete first gives the node
    /// back to the load balancers (see [`node::release_patch`]).
    async fn write_outcome(
        &self,
        conditions: &[Condition],
        release: bool,
    ) -> Result<(), node::Error> {
        let inner = &self.inner;
        let mut current = node::get(&inner.client, &inner.node).await?;
        if release {
            current = node::release(&inner.client, &current).await?;
        }
        node::set_conditions(&inner.client, &current, conditions).await?;
        Ok(())
    }

    /// Writes the progress condition: one patch from the Node the last write returned,
    /// or a read and a patch when there is none.
    async fn write_conditions(&self, conditions: &[Condition]) -> Result<(), node::Error> {
        let inner = &self.inner;
        let known = self
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let current = match known {
            Some(node) => node,
            None => node::get(&inner.client, &inner.node).await?,
        };
        let patched = node::set_conditions(&inner.client, &current, conditions).await?;
        *self.written.lock().unwrap_or_else(|e| e.into_inner()) = Some(patched);
        Ok(())
    }

    /// Writes the outcome on the Node (retrying), posts an Event and sets the phase.
    async fn finish_drain(self, ended: Ended, took: Duration) {
        let inner = self.inner.clone();
        let remaining = self.progress.borrow().message();
        let Some(outcome) = drain_outcome(ended, took, &remaining) else {
            return;
        };
        self.finishing.store(true, Ordering::SeqCst);
        inner.metrics.drain_finished(outcome.metric, took);
        inner.metrics.set_remaining(self.progress.borrow().left());
        // Written even when the operation was stopped, but never past process shutdown.
        let shutdown = inner.shutdown.clone();
        let release = outcome.phase != Phase::Complete;
        let written = retry("record drain outcome", &inner, &shutdown, || {
            self.write_outcome(&outcome.conditions, release)
        });
        if written.await.is_none() {
            return;
        }
        self.phase.send_replace(outcome.phase);
        let (type_, reason, message) = outcome.event;
        inner.events.post(type_, reason, "", message).await;
    }

    async fn maintenance(self) {
        let inner = self.inner.clone();
        let steps = async {
            let done = retry("return node to service", &inner, &self.token, || {
                self.uncordon()
            });
            done.await?;
            let message = "node uncordoned and back in service".to_string();
            inner
                .events
                .post(EventType::Normal, agent_reason::UNCORDONED, "", message)
                .await;
            Some(self.hooks(HookPoint::AfterUncordon).await)
        };
        let ended = tokio::select! {
            ended = steps => ended,
            () = self.token.cancelled() => None,
        };
        match ended {
            Some(Ok(())) => {
                self.phase.send_replace(Phase::Complete);
            }
            Some(Err(error)) => {
                let reason = format!("{error}; the node is uncordoned");
                self.phase.send_replace(Phase::Failed(reason));
            }
            None => {
                if let Ended::Stopped(reason) = self.ended_by_token() {
                    self.phase.send_replace(Phase::Stopped(reason));
                }
            }
        }
    }

    /// Uncordons, removes our label, clears the drain conditions, and confirms the node is
    /// schedulable by reading it back.
    async fn uncordon(&self) -> node::Result<()> {
        let inner = &self.inner;
        let current = node::get(&inner.client, &inner.node).await?;
        let patched = node::uncordon(&inner.client, &current).await?;
        let message = "node returned to service".to_string();
        let conditions: Vec<Condition> = [DRAIN_IN_PROGRESS, DRAINED]
            .into_iter()
            .filter(|t| node::condition(&patched, t).is_some())
            .map(|t| condition(t, false, cond::UNCORDONED, message.clone()))
            .collect();
        if !conditions.is_empty() {
            node::set_conditions(&inner.client, &patched, &conditions).await?;
        }
        let confirmed = node::get(&inner.client, &inner.node).await?;
        if node::is_cordoned(&confirmed) {
            return Err(node::Error::StillCordoned {
                node: inner.node.clone(),
            });
        }
        Ok(())
    }
}

/// How a drain ended, as written to the Node, the metrics and an Event.
struct DrainEnd {
    phase: Phase,
    metric: DrainOutcome,
    conditions: Vec<Condition>,
    event: (EventType, &'static str, String),
}

/// The record of a drain that `ended` after `took`; `None` on process shutdown (the Node
/// is left as it is, so the next agent resumes). `remaining` is the last progress message.
fn drain_outcome(ended: Ended, took: Duration, remaining: &str) -> Option<DrainEnd> {
    let stopped = |phase, metric, reason, message: String| DrainEnd {
        phase,
        metric,
        conditions: vec![condition(DRAIN_IN_PROGRESS, false, reason, message.clone())],
        event: (
            EventType::Warning,
            if metric == DrainOutcome::Failed {
                agent_reason::DRAIN_FAILED
            } else {
                agent_reason::DRAIN_STOPPED
            },
            message,
        ),
    };
    let failed = |error: String| {
        let message = format!("{error}; {RELEASED}");
        stopped(
            Phase::Failed(error),
            DrainOutcome::Failed,
            cond::DRAIN_FAILED,
            message,
        )
    };
    match ended {
        Ended::Shutdown => None,
        Ended::Done(Ok(progress)) => {
            let summary = format!(
                "drained in {}s: {} pods evicted, {} skipped",
                took.as_secs(),
                progress.done,
                progress.skipped
            );
            Some(DrainEnd {
                phase: Phase::Complete,
                metric: DrainOutcome::Complete,
                conditions: vec![
                    condition(DRAINED, true, cond::DRAINED, summary.clone()),
                    condition(DRAIN_IN_PROGRESS, false, cond::DRAINED, progress.message()),
                ],
                event: (EventType::Normal, agent_reason::DRAIN_COMPLETE, summary),
            })
        }
        Ended::Done(Err(error)) => Some(failed(
            graceful_drain_core::error::chain(&error).to_string(),
        )),
        Ended::Hook(error) => Some(failed(error.to_string())),
        Ended::Stopped(reason) => {
            let message = format!("{reason}; {remaining}; {RELEASED}");
            let phase = Phase::Stopped(reason);
            Some(stopped(
                phase,
                DrainOutcome::Stopped,
                cond::DRAIN_STOPPED,
                message,
            ))
        }
    }
}

fn condition(
    type_: &'static str,
    status: bool,
    reason: &'static str,
    message: String,
) -> Condition {
    Condition {
        type_,
        status,
        reason,
        message,
    }
}

#[cfg(test)]
mod tests;
