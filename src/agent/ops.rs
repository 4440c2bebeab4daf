//! The agent's operations on its node — a drain, or the return to service
//! (maintenance-complete) — each run in a background task, with their state kept in memory
//! so the SLM RPCs answer from it at once.
//!
//! At most one operation exists; starting one stops the other first (the new task awaits
//! the old one, so their Node writes never interleave). A drain writes its progress into
//! the `DrainInProgress` condition, so a restarted agent finds `cordoned + DrainInProgress`
//! on the Node and resumes ([`Agent::resume`]). Process shutdown stops a task without
//! touching the Node, precisely so that the next agent resumes.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::drain::{self, DrainConfig, Engine};
use super::node::{self, Condition, DRAIN_IN_PROGRESS, DRAINED, reason as cond};
use super::progress::Progress;
use super::report::{DrainOutcome, EventType, Metrics, NodeEvents, reason as ev};
use crate::runtime::Shutdown;

/// The DrainInProgress message is rewritten at most this often: each write is a Node
/// status PATCH, and a 500-pod drain changes its counts hundreds of times.
const CONDITION_UPDATE_INTERVAL: Duration = Duration::from_secs(5);
/// Longest wait between retries of a failed Node read or write.
const NODE_RETRY_CAP: Duration = Duration::from_secs(30);

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
    Running,
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
    pub node: String,
    pub operation: Option<OpKind>,
    pub phase: Option<Phase>,
    pub progress: Progress,
    /// The DrainInProgress condition message.
    pub message: String,
}

struct Operation {
    kind: OpKind,
    token: CancellationToken,
    stop_reason: Arc<Mutex<Option<String>>>,
    phase: watch::Receiver<Phase>,
    progress: watch::Receiver<Progress>,
    handle: JoinHandle<()>,
}

/// What every operation task needs.
pub struct Inner {
    pub client: kube::Client,
    pub node: String,
    pub exclude_from_lb: bool,
    pub config: Arc<DrainConfig>,
    pub metrics: Metrics,
    pub events: NodeEvents,
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

    /// Starts `kind` unless it is already running or complete (idempotent); stops the other
    /// operation first. Returns at once.
    pub fn begin(&self, kind: OpKind) -> Phase {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(op) = current.as_ref().filter(|op| op.kind == kind) {
            let phase = op.phase.borrow().clone();
            if matches!(phase, Phase::Running | Phase::Complete) {
                return phase;
            }
        }
        let previous = current.take().map(|op| {
            stop_op(&op, format!("superseded by {kind:?}"));
            op.handle
        });
        *current = Some(self.spawn(kind, previous));
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
            crate::runtime::spawn_owned("record-drain-stop", shutdown, async move {
                record_stop(&inner, reason).await;
                Ok::<(), std::convert::Infallible>(())
            });
        }
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

    /// Resumes a drain a previous agent left running (cordoned + DrainInProgress=True).
    /// Retries reading the Node until it succeeds or the process stops.
    pub async fn resume(&self) {
        let inner = &self.inner;
        let read = retry("read node", inner, &inner.shutdown, || {
            node::get(&inner.client, &inner.node)
        });
        let Some(node) = read.await else { return };
        if node::drain_was_running(&node) && self.phase(OpKind::Drain).is_none() {
            tracing::info!(node = %inner.node, "resuming the drain a previous agent started");
            self.begin(OpKind::Drain);
        }
    }

    fn spawn(&self, kind: OpKind, previous: Option<JoinHandle<()>>) -> Operation {
        let token = self.inner.shutdown.child_token();
        let stop_reason = Arc::new(Mutex::new(None));
        let (phase_tx, phase) = watch::channel(Phase::Running);
        let (progress_tx, progress) = watch::channel(Progress::default());
        let run = Run {
            inner: self.inner.clone(),
            token: token.clone(),
            stop_reason: stop_reason.clone(),
            phase: phase_tx,
            progress: progress_tx,
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
            token,
            stop_reason,
            phase,
            progress,
            handle,
        }
    }
}

/// Sets DrainInProgress=False (DrainStopped) if the Node says a drain is in progress.
async fn record_stop(inner: &Inner, reason: String) {
    let result = async {
        let node = node::get(&inner.client, &inner.node).await?;
        if node::condition_is_true(&node, DRAIN_IN_PROGRESS) {
            let stopped = condition(DRAIN_IN_PROGRESS, false, cond::DRAIN_STOPPED, reason);
            node::set_conditions(&inner.client, &node, &[stopped]).await?;
        }
        Ok::<(), node::Error>(())
    };
    if let Err(error) = result.await {
        tracing::warn!(node = %inner.node, error = %crate::error::chain(&error), "record the stopped drain");
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
    let mut delay = Duration::from_secs(1);
    loop {
        tokio::select! {
            () = token.cancelled() => return None,
            result = f() => match result {
                Ok(value) => return Some(value),
                Err(error) => {
                    let error = crate::error::chain(&error).to_string();
                    tracing::warn!(node = %inner.node, %error, retry_in = ?delay, "{what}");
                    // Said on the Node too (rate-limited), so a stuck step is visible.
                    let message = format!("{what} (retrying): {error}");
                    let events = &inner.events;
                    events.post(EventType::Warning, ev::NODE_UPDATE_FAILED, what, message).await;
                }
            },
        }
        tokio::select! {
            () = token.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(NODE_RETRY_CAP);
    }
}

/// One operation's task.
struct Run {
    inner: Arc<Inner>,
    token: CancellationToken,
    stop_reason: Arc<Mutex<Option<String>>>,
    phase: watch::Sender<Phase>,
    progress: watch::Sender<Progress>,
}

enum Ended {
    Done(Result<Progress, drain::Error>),
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
        let inner = self.inner.clone();
        let prepared = retry("prepare node for drain", &inner, &self.token, || {
            self.prepare()
        });
        let ended = match prepared.await {
            None => self.ended_by_token(),
            Some(()) => {
                let engine = Engine {
                    client: inner.client.clone(),
                    node: inner.node.clone(),
                    config: inner.config.clone(),
                    metrics: inner.metrics.clone(),
                    events: inner.events.clone(),
                };
                tokio::select! {
                    result = engine.run(&self.progress) => Ended::Done(result),
                    () = self.publish_progress() => Ended::Shutdown,
                    () = self.token.cancelled() => self.ended_by_token(),
                }
            }
        };
        self.finish_drain(ended, started.elapsed()).await;
    }

    /// Cordons and labels the node and marks the drain in progress.
    async fn prepare(&self) -> Result<(), node::Error> {
        let inner = &self.inner;
        let current = node::get(&inner.client, &inner.node).await?;
        let cordoned = node::cordon(&inner.client, &current, inner.exclude_from_lb).await?;
        let condition = Condition {
            type_: DRAIN_IN_PROGRESS,
            status: true,
            reason: cond::DRAINING,
            message: "listing pods".into(),
        };
        let node = node::set_conditions(&inner.client, &cordoned, &[condition]).await?;
        inner.events.set_node_uid(node.metadata.uid.clone());
        let message = "node cordoned; evicting its pods".to_string();
        inner
            .events
            .post(EventType::Normal, ev::DRAIN_STARTED, "", message)
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
                        tracing::warn!(error = %crate::error::chain(&error), "update drain progress condition")
                    }
                }
            }
            tokio::time::sleep(CONDITION_UPDATE_INTERVAL).await;
        }
    }

    async fn write_conditions(&self, conditions: &[Condition]) -> Result<(), node::Error> {
        let inner = &self.inner;
        let current = node::get(&inner.client, &inner.node).await?;
        node::set_conditions(&inner.client, &current, conditions).await?;
        Ok(())
    }

    /// Writes the outcome on the Node (retrying), posts an Event and sets the phase.
    async fn finish_drain(self, ended: Ended, took: Duration) {
        let inner = self.inner.clone();
        let remaining = self.progress.borrow().message();
        let Some(outcome) = drain_outcome(ended, took, &remaining) else {
            return;
        };
        inner.metrics.drain_finished(outcome.metric, took);
        inner
            .metrics
            .set_remaining(self.progress.borrow().remaining.len());
        // Written even when the operation was stopped, but never past process shutdown.
        let shutdown = inner.shutdown.clone();
        let written = retry("record drain outcome", &inner, &shutdown, || {
            self.write_conditions(&outcome.conditions)
        });
        if written.await.is_none() {
            return;
        }
        let (type_, reason, message) = outcome.event;
        inner.events.post(type_, reason, "", message).await;
        self.phase.send_replace(outcome.phase);
    }

    async fn maintenance(self) {
        let inner = self.inner.clone();
        let done = retry("return node to service", &inner, &self.token, || {
            self.uncordon()
        });
        match done.await {
            Some(()) => {
                let message = "node uncordoned and back in service".to_string();
                inner
                    .events
                    .post(EventType::Normal, ev::UNCORDONED, "", message)
                    .await;
                self.phase.send_replace(Phase::Complete);
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
                ev::DRAIN_FAILED
            } else {
                ev::DRAIN_STOPPED
            },
            message,
        ),
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
                event: (EventType::Normal, ev::DRAIN_COMPLETE, summary),
            })
        }
        Ended::Done(Err(error)) => {
            let message = crate::error::chain(&error).to_string();
            let phase = Phase::Failed(message.clone());
            Some(stopped(
                phase,
                DrainOutcome::Failed,
                cond::DRAIN_FAILED,
                message,
            ))
        }
        Ended::Stopped(reason) => {
            let message = format!("{reason}; {remaining}");
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
