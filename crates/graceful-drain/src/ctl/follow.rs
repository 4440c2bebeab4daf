//! Following one LifecycleEvent to its end. A watch on the event (from the
//! resourceVersion it was created at) sees every status it passes through, even when the
//! reconciler deletes it right after writing a terminal status; the Node's conditions and
//! Events are re-read every poll to show why pods are still there. [`verdict`] turns what
//! was seen into the outcome and is a pure function.

use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use tokio::time::Instant;

use super::display::{Display, format_elapsed};
use super::{Error, Request, Result};
use graceful_drain_core::labels::node_condition::{self, DRAIN_IN_PROGRESS};
use graceful_drain_core::labels::{LIFECYCLE_MESSAGE_ANNOTATION, agent_reason};
use graceful_drain_core::lifecycle::{
    ClaimStatus, LifecycleEvent, LifecycleTransition, TRANSITION_CONDITION,
};

/// Reason the node agent gives `DrainInProgress` when it sets it False after a finished
/// drain (other reasons, such as `DrainStopped`, mean the drain did not finish).
const DRAINED_REASON: &str = node_condition::reason::DRAINED;
/// Pods named in a failure message; the rest are counted (the condition and
/// `kubectl get pods --field-selector spec.nodeName=NODE` have them all).
const MAX_PODS_NAMED: usize = 10;

/// What the follower knows about the event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The latest claim status; once terminal, it no longer changes.
    pub claim: Option<ClaimStatus>,
    /// The driver that claimed it, once one did.
    pub driver: Option<String>,
    /// The claim's RFC3339 SLA deadline, once claimed.
    pub sla: Option<String>,
    /// Why it ended, from the reconciler's message annotation.
    pub message: Option<String>,
    /// The event is gone from the API server.
    pub deleted: bool,
    /// When the event was created, to tell a Node condition written for it from a stale
    /// one.
    pub created: Option<Timestamp>,
}

impl Seen {
    fn update(&mut self, event: &LifecycleEvent) {
        if let Some(status) = &event.status {
            // Never step back from a terminal status already seen.
            if !self.claim.is_some_and(ClaimStatus::is_terminal) {
                self.claim = status.claim_status.or(self.claim);
            }
            self.driver = status.driver.clone().or(self.driver.take());
            self.sla = status.sla.clone().or(self.sla.take());
        }
        if let Some(m) = event.annotations().get(LIFECYCLE_MESSAGE_ANNOTATION) {
            self.message = Some(m.clone());
        }
        self.created = event.metadata.creation_timestamp.as_ref().map(|t| t.0);
    }
}

/// What the follower knows about the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// `LifecycleTransition` condition: reason and lastTransitionTime.
    pub transition: Option<(String, Option<Timestamp>)>,
    /// `DrainInProgress` message (pods left, what blocks them).
    pub drain_in_progress: Option<String>,
    /// The agent reported the drain finished (`DrainInProgress` False, reason `Drained`).
    pub drained: bool,
}

/// How the event ended, if it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not finished: keep following.
    Running,
    /// The transition completed.
    Succeeded,
    /// It ended without success.
    Ended {
        /// `Failed`, `SlaExpired`, or `deleted` when the event vanished unfinished.
        status: String,
        /// The reconciler's message and what still blocked the node, or `no reason
        /// recorded`.
        reason: String,
    },
}

/// Succeeded when the Succeeded status was seen, or when the event vanished while the
/// node shows the transition's end reason set after the event was created.
pub fn verdict(seen: &Seen, node: &NodeState, end_reason: &str) -> Verdict {
    let reason = || {
        let mut parts: Vec<String> = seen.message.iter().cloned().collect();
        if let Some(blocked) = &node.drain_in_progress {
            parts.push(format!("still blocked: {blocked}"));
        }
        if parts.is_empty() {
            "no reason recorded".to_string()
        } else {
            parts.join("; ")
        }
    };
    match seen.claim {
        Some(ClaimStatus::Succeeded) => return Verdict::Succeeded,
        Some(status @ (ClaimStatus::Failed | ClaimStatus::SlaExpired)) => {
            return Verdict::Ended {
                status: status.to_string(),
                reason: reason(),
            };
        }
        _ => {}
    }
    if !seen.deleted {
        return Verdict::Running;
    }
    let ended_here = node.transition.as_ref().is_some_and(|(r, at)| {
        r == end_reason
            && match (at, seen.created) {
                (Some(at), Some(created)) => at.as_second() >= created.as_second(),
                _ => false,
            }
    });
    if ended_here {
        Verdict::Succeeded
    } else {
        Verdict::Ended {
            status: "deleted".to_string(),
            reason: format!("the event was deleted before it finished; {}", reason()),
        }
    }
}

/// The status line.
fn status_line(name: &str, seen: &Seen, node: &NodeState, news: Option<&str>) -> String {
    let mut line = format!("lifecycleevent/{name}: ");
    match seen.claim {
        None | Some(ClaimStatus::Pending) => {
            line.push_str("Pending (waiting for the node's driver)")
        }
        Some(status) => line.push_str(&status.to_string()),
    }
    if let Some(driver) = &seen.driver {
        line.push_str(&format!(" by {driver}"));
    }
    if let Some(sla) = &seen.sla {
        line.push_str(&format!(", SLA {sla}"));
    }
    if let Some((reason, _)) = &node.transition {
        line.push_str(&format!(", node {TRANSITION_CONDITION}={reason}"));
    }
    match (&node.drain_in_progress, news) {
        (Some(progress), _) => line.push_str(&format!(" — {progress}")),
        (None, Some(news)) => line.push_str(&format!(" — {news}")),
        _ => {}
    }
    line
}

type Watch = BoxStream<'static, kube::Result<WatchEvent<LifecycleEvent>>>;

struct Follower<'a> {
    events: Api<LifecycleEvent>,
    nodes: Api<Node>,
    node_events: Api<Event>,
    request: &'a Request,
    name: String,
    rv: String,
    seen: Seen,
    node: NodeState,
    printed_events: std::collections::HashSet<String>,
    since: Timestamp,
    news: Option<String>,
    /// The latest Warning Event on the node (an eviction refused, for instance).
    last_warning: Option<String>,
}

/// Follows `event` until it ends, the timeout passes or `shutdown`.
pub async fn follow(
    client: &kube::Client,
    request: &Request,
    transition: &LifecycleTransition,
    event: LifecycleEvent,
    shutdown: &graceful_drain_core::runtime::Shutdown,
) -> Result<()> {
    let started = Instant::now();
    let mut f = Follower {
        events: Api::all(client.clone()),
        nodes: Api::all(client.clone()),
        node_events: Api::all(client.clone()),
        request,
        name: event.name_any(),
        rv: event.resource_version().unwrap_or_default(),
        seen: Seen::default(),
        node: NodeState::default(),
        printed_events: Default::default(),
        since: Timestamp::from_second(Timestamp::now().as_second())
            .unwrap_or_else(|_| Timestamp::now()),
        news: None,
        last_warning: None,
    };
    f.seen.update(&event);
    let mut display = Display::detect();
    let outcome = f.run(&mut display, transition, started, shutdown).await;
    display.finish();
    let elapsed = format_elapsed(started.elapsed());
    match outcome {
        Ok(()) => {
            println!(
                "node {} {}: lifecycleevent/{} Succeeded ({}) after {elapsed}",
                request.node,
                if request.verb == "drain" {
                    "drained"
                } else {
                    "back in service"
                },
                f.name,
                transition.spec.end,
            );
            Ok(())
        }
        Err(e) => Err(e),
    }
}

impl Follower<'_> {
    async fn run(
        &mut self,
        display: &mut Display,
        transition: &LifecycleTransition,
        started: Instant,
        shutdown: &graceful_drain_core::runtime::Shutdown,
    ) -> Result<()> {
        let deadline = self.request.timeout.map(|t| started + t);
        let claim_deadline = self.request.claim_timeout.map(|t| started + t);
        let mut watch = self.open_watch().await;
        let mut tick = tokio::time::interval(self.request.poll);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    return Err(Error::Interrupted { event: self.name.clone() });
                }
                () = sleep_until(claim_deadline), if self.unclaimed() => {
                    return Err(self.timed_out(started.elapsed()));
                }
                () = sleep_until(deadline) => {
                    let mut error = self.timed_out(started.elapsed());
                    if let Error::TimedOut { reason, .. } = &mut error {
                        *reason = self.with_pods_left(std::mem::take(reason)).await;
                    }
                    return Err(error);
                }
                _ = tick.tick() => {
                    self.refresh_node(display).await;
                    if watch.is_none() {
                        watch = self.open_watch().await;
                    }
                }
                item = next(&mut watch) => {
                    if !self.on_watch(item).await {
                        watch = None;
                    }
                }
            }
            match verdict(&self.seen, &self.node, &transition.spec.end) {
                Verdict::Running => {
                    let line =
                        status_line(&self.name, &self.seen, &self.node, self.news.as_deref());
                    display.status(&line, started.elapsed());
                }
                Verdict::Succeeded => {
                    // The Events posted since the last poll (the drain's last tier, its
                    // end) are printed before the verdict.
                    self.refresh_node(display).await;
                    return Ok(());
                }
                Verdict::Ended { status, reason } => {
                    let reason = self.with_pods_left(reason).await;
                    return Err(Error::Ended {
                        verb: self.request.verb,
                        node: self.request.node.clone(),
                        status,
                        elapsed: format_elapsed(started.elapsed()),
                        reason,
                    });
                }
            }
        }
    }

    /// No reconciler has claimed the event yet.
    fn unclaimed(&self) -> bool {
        matches!(self.seen.claim, None | Some(ClaimStatus::Pending))
    }

    fn timed_out(&self, elapsed: Duration) -> Error {
        let status = self.seen.claim.unwrap_or(ClaimStatus::Pending).to_string();
        let reason = match (&self.node.drain_in_progress, &self.news) {
            (Some(p), _) => format!("still blocked: {p}"),
            (None, Some(news)) => format!("last node event: {news}"),
            (None, None) if status == "Pending" => {
                "the event was never claimed: is the graceful-drain node agent running on the node?"
                    .to_string()
            }
            (None, None) => "no progress reported".to_string(),
        };
        Error::TimedOut {
            verb: self.request.verb,
            node: self.request.node.clone(),
            event: self.name.clone(),
            status,
            elapsed: format_elapsed(elapsed),
            reason,
        }
    }

    async fn open_watch(&mut self) -> Option<Watch> {
        let params = WatchParams::default().fields(&format!("metadata.name={}", self.name));
        match self.events.watch(&params, &self.rv).await {
            Ok(stream) => Some(stream.boxed()),
            Err(error) => {
                tracing::debug!(error = %graceful_drain_core::error::chain(&error), "watch lifecycleevent; retrying");
                None
            }
        }
    }

    /// Applies one watch item; false when the watch must be reopened.
    async fn on_watch(&mut self, item: Option<kube::Result<WatchEvent<LifecycleEvent>>>) -> bool {
        match item {
            Some(Ok(WatchEvent::Added(e) | WatchEvent::Modified(e))) => {
                self.rv = e.resource_version().unwrap_or_default();
                self.seen.update(&e);
                true
            }
            Some(Ok(WatchEvent::Deleted(e))) => {
                self.seen.update(&e);
                self.seen.deleted = true;
                self.reload_node().await;
                true
            }
            Some(Ok(WatchEvent::Bookmark(b))) => {
                self.rv = b.metadata.resource_version;
                true
            }
            Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                self.resync().await;
                false
            }
            Some(Ok(WatchEvent::Error(_)) | Err(_)) | None => false,
        }
    }

    /// After the watch history expired: read the event directly.
    async fn resync(&mut self) {
        match self.events.get_opt(&self.name).await {
            Ok(Some(e)) => {
                self.rv = e.resource_version().unwrap_or_default();
                self.seen.update(&e);
            }
            Ok(None) => {
                self.seen.deleted = true;
                self.reload_node().await;
            }
            Err(error) => {
                tracing::debug!(error = %graceful_drain_core::error::chain(&error), "get lifecycleevent")
            }
        }
    }

    /// Re-reads the node; the last `DrainInProgress` message seen is kept when the
    /// condition turns False because the drain stopped (the agent stops a drain at SLA
    /// expiry), so a failure can still say what blocked it — but not once the drain
    /// finished, when that message is stale.
    async fn reload_node(&mut self) {
        let node = self.read_node().await;
        self.keep_node(node);
    }

    /// Takes a fresh read of the node (see [`carry_progress`]); none keeps the last one.
    fn keep_node(&mut self, node: Option<NodeState>) {
        if let Some(node) = node {
            let previous = std::mem::take(&mut self.node);
            self.node = carry_progress(previous, node);
        }
    }

    /// Pods still bound to the node that a drain would evict (not DaemonSet-owned, not
    /// mirror pods, not finished), as `ns/name`, for failure messages.
    async fn pods_left(&self) -> Vec<String> {
        let pods: Api<Pod> = Api::all(self.nodes.clone().into_client());
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.request.node));
        let Ok(list) = pods.list(&params).await else {
            return Vec::new();
        };
        list.items
            .iter()
            .filter(|p| {
                let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
                let mirror = p
                    .annotations()
                    .contains_key(graceful_drain_core::labels::MIRROR_POD_ANNOTATION);
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !daemon && !mirror && !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect()
    }

    /// Adds the last warning on the node and the pods left on it to a failure reason.
    async fn with_pods_left(&self, mut reason: String) -> String {
        if let Some(warning) = &self.last_warning {
            reason.push_str(&format!("; last warning on the node: {warning}"));
        }
        let pods = self.pods_left().await;
        if pods.is_empty() || self.request.verb != "drain" {
            return reason;
        }
        let shown: Vec<&str> = pods
            .iter()
            .take(MAX_PODS_NAMED)
            .map(String::as_str)
            .collect();
        let more = pods.len().saturating_sub(MAX_PODS_NAMED);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!(
            "{reason}; pods left on the node: {}{tail}",
            shown.join(", ")
        )
    }

    /// Re-reads the node, then its Events, and prints the new Events. The node is read
    /// first and kept only when the Events could be listed too: the agent posts an Event
    /// (the drain plan) before the progress it leads to, so the status line printed next
    /// never runs ahead of the Events printed above it.
    async fn refresh_node(&mut self, display: &mut Display) {
        let node = self.read_node().await;
        let params = ListParams::default().fields(&format!(
            "involvedObject.kind=Node,involvedObject.name={}",
            self.request.node
        ));
        let list = match self.node_events.list(&params).await {
            Ok(list) => list,
            Err(error) => {
                tracing::debug!(error = %graceful_drain_core::error::chain(&error), "list the node's events; next poll");
                return;
            }
        };
        self.keep_node(node);
        let mut fresh: Vec<&Event> = list
            .items
            .iter()
            .filter(|e| event_time(e).is_some_and(|t| t >= self.since))
            .collect();
        // Ties within a second (the plan and the first tier) keep their order by eventTime.
        fresh.sort_by_key(|e| (event_time(e), e.event_time.as_ref().map(|t| t.0)));
        for e in fresh {
            let key = format!("{}/{}", e.name_any(), e.count.unwrap_or(1));
            if self.printed_events.insert(key) {
                let text = format!(
                    "{} {}: {}",
                    e.type_.as_deref().unwrap_or("Normal"),
                    e.reason.as_deref().unwrap_or_default(),
                    e.message.as_deref().unwrap_or_default()
                );
                display.note(&event_note(e));
                if e.type_.as_deref() == Some("Warning") {
                    self.last_warning = Some(text.clone());
                }
                self.news = Some(text);
            }
        }
    }

    async fn read_node(&self) -> Option<NodeState> {
        let node = self.nodes.get(&self.request.node).await.ok()?;
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
        Some(NodeState {
            transition: find(TRANSITION_CONDITION).map(|c| {
                let at = c.last_transition_time.as_ref().map(|t| t.0);
                (c.reason.clone().unwrap_or_default(), at)
            }),
            drain_in_progress: find(DRAIN_IN_PROGRESS)
                .filter(|c| c.status == "True")
                .and_then(|c| c.message.clone())
                .filter(|m| !m.is_empty()),
            drained: find(DRAIN_IN_PROGRESS).is_some_and(|c| {
                c.status == "False" && c.reason.as_deref() == Some(DRAINED_REASON)
            }),
        })
    }
}

/// The freshly read node state, keeping the previous `DrainInProgress` message when the
/// condition stopped being True without the drain finishing (so a failure can still name
/// what blocked it); after a finished drain the old message is stale and dropped.
fn carry_progress(previous: NodeState, mut fresh: NodeState) -> NodeState {
    if fresh.drain_in_progress.is_none() && !fresh.drained {
        fresh.drain_in_progress = previous.drain_in_progress;
    }
    fresh
}

/// How a node Event is printed: one line, except the drain plan, whose tiers go on lines
/// of their own under it.
fn event_note(e: &Event) -> String {
    let type_ = e.type_.as_deref().unwrap_or("Normal");
    let reason = e.reason.as_deref().unwrap_or_default();
    let message = e.message.as_deref().unwrap_or_default();
    let plan = (reason == agent_reason::DRAIN_PLAN)
        .then(|| message.strip_prefix("plan: "))
        .flatten();
    match plan {
        Some(tiers) => {
            let lines: Vec<String> = tiers.split("; ").map(|t| format!("    {t}")).collect();
            format!(
                "  node event: {type_} {reason}: eviction plan\n{}",
                lines.join("\n")
            )
        }
        None => format!("  node event: {type_} {reason}: {message}"),
    }
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn next(watch: &mut Option<Watch>) -> Option<kube::Result<WatchEvent<LifecycleEvent>>> {
    match watch {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn seen(claim: Option<ClaimStatus>, deleted: bool) -> Seen {
        Seen {
            claim,
            deleted,
            created: Some(ts(100)),
            ..Seen::default()
        }
    }

    fn node(reason: &str, at: i64, progress: Option<&str>) -> NodeState {
        NodeState {
            transition: Some((reason.into(), Some(ts(at)))),
            drain_in_progress: progress.map(str::to_string),
            drained: false,
        }
    }

    #[test]
    fn progress_message_outlives_a_stopped_drain_but_not_a_finished_one() {
        let blocked = node(
            "drain-started",
            1,
            Some("2 pods remaining: 2 blocked by PDB shop/web"),
        );
        let stopped = node("drain-started", 1, None);
        let kept = carry_progress(blocked.clone(), stopped);
        assert_eq!(kept.drain_in_progress, blocked.drain_in_progress);
        let finished = NodeState {
            drained: true,
            ..node("drain-complete", 2, None)
        };
        assert_eq!(carry_progress(blocked, finished).drain_in_progress, None);
    }

    #[test]
    fn the_drain_plan_prints_one_tier_a_line() {
        let event = |reason: &str, message: &str| Event {
            type_: Some("Normal".into()),
            reason: Some(reason.into()),
            message: Some(message.into()),
            ..Event::default()
        };
        let plan = event(
            agent_reason::DRAIN_PLAN,
            "plan: 1/2 workloads: 2 pods (shop/web-1, shop/web-2); 2/2 last: 1 pod (edge/in-1)",
        );
        assert_eq!(
            event_note(&plan),
            "  node event: Normal graceful-drain.io/DrainPlan: eviction plan\n    \
             1/2 workloads: 2 pods (shop/web-1, shop/web-2)\n    2/2 last: 1 pod (edge/in-1)"
        );
        let started = event(agent_reason::DRAIN_STARTED, "node cordoned");
        assert_eq!(
            event_note(&started),
            "  node event: Normal graceful-drain.io/DrainStarted: node cordoned"
        );
    }

    #[test]
    fn verdicts() {
        let blocked = "1 pod left: shop/web-0 blocked by PodDisruptionBudget shop/web";
        let cases = [
            (
                seen(Some(ClaimStatus::Claimed), false),
                node("drain-started", 101, None),
                Verdict::Running,
            ),
            (seen(None, false), NodeState::default(), Verdict::Running),
            (
                seen(Some(ClaimStatus::Succeeded), true),
                NodeState::default(),
                Verdict::Succeeded,
            ),
            (
                seen(Some(ClaimStatus::Claimed), true),
                node("drain-complete", 105, None),
                Verdict::Succeeded,
            ),
            (
                seen(Some(ClaimStatus::Claimed), true),
                node("drain-complete", 50, None),
                Verdict::Ended {
                    status: "deleted".into(),
                    reason: "the event was deleted before it finished; no reason recorded".into(),
                },
            ),
            (
                seen(Some(ClaimStatus::SlaExpired), true),
                node("drain-started", 101, Some(blocked)),
                Verdict::Ended {
                    status: "SlaExpired".into(),
                    reason: format!("still blocked: {blocked}"),
                },
            ),
        ];
        for (seen, node, want) in cases {
            assert_eq!(
                verdict(&seen, &node, "drain-complete"),
                want,
                "{seen:?} {node:?}"
            );
        }
    }

    #[test]
    fn failed_verdict_carries_the_reconciler_message() {
        let mut s = seen(Some(ClaimStatus::Failed), false);
        s.message = Some("StartLifecycleTransition returned error: boom".into());
        let Verdict::Ended { status, reason } = verdict(&s, &NodeState::default(), "x") else {
            panic!("not ended");
        };
        assert_eq!(status, "Failed");
        assert_eq!(reason, "StartLifecycleTransition returned error: boom");
    }

    #[test]
    fn terminal_status_is_never_overwritten_by_an_older_version() {
        let mut s = seen(Some(ClaimStatus::SlaExpired), false);
        let mut e = LifecycleEvent::new("e", Default::default());
        e.status = Some(graceful_drain_core::lifecycle::LifecycleEventStatus {
            claim_status: Some(ClaimStatus::Claimed),
            ..Default::default()
        });
        s.update(&e);
        assert_eq!(s.claim, Some(ClaimStatus::SlaExpired));
    }

    #[test]
    fn status_line_names_claim_driver_and_blockers() {
        let mut s = seen(Some(ClaimStatus::Claimed), false);
        s.driver = Some("graceful-drain.io".into());
        let line = status_line(
            "w-drain-1",
            &s,
            &node("drain-started", 1, Some("2 pods left")),
            None,
        );
        assert_eq!(
            line,
            "lifecycleevent/w-drain-1: Claimed by graceful-drain.io, node LifecycleTransition=drain-started — 2 pods left"
        );
    }
}
