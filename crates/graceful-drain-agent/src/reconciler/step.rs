//! One reconcile pass over the node's LifecycleEvents: read (events, Node condition,
//! transitions, plugin registrations), decide per event ([`super::decide`]), act. Every
//! write carries the resourceVersion it was computed from; a conflict means another
//! writer won, and the next pass starts from fresh reads.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use super::decide::{self, Action, ConditionView, EventView, Input, TransitionView};
use super::metrics::CallOutcome;
use super::plugin::{self, Registered};
use super::{Context, Error, Result, target};
use graceful_drain_core::labels::{
    CLAIM_FINALIZER, LIFECYCLE_MESSAGE_ANNOTATION, LIFECYCLE_STARTED_ANNOTATION, agent_reason,
};
use graceful_drain_core::lifecycle::{
    ClaimStatus, LifecycleEvent, LifecycleEventStatus, LifecycleTransition,
    LifecycleTransitionSpec, TRANSITION_CONDITION,
};
use graceful_drain_core::proto::slm::{
    EndLifecycleTransitionRequest, LifecycleTransitionResponse, StartLifecycleTransitionRequest,
};

/// Attempts at the Node condition's read-modify-write before leaving it to the next pass.
const CONDITION_ATTEMPTS: usize = 3;
/// Bound on posting one Kubernetes Event: Events are best effort and must never hold up
/// a transition.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a pass skips an event whose stored version it already acted on: a watch
/// delivers our own write within milliseconds, and a write that changed nothing must not
/// park its event for longer than this.
const STALE_GRACE: Duration = Duration::from_secs(3);

/// Whether acting on the event writes the event itself (so the store's copy is stale until
/// the watch delivers it); End only talks to the driver and the Node.
fn writes_event(action: &Action) -> bool {
    !matches!(action, Action::Wait(_) | Action::End)
}
/// The reporting controller named on our Kubernetes Events.
const REPORTER: &str = "graceful-drain-lifecycle-reconciler";

/// Whether the API server can select events by `spec.bindingNode` (a CRD selectable
/// field, Kubernetes ≥ 1.30): `Some(false)` on a 400, `Some(true)` on an answer, `None`
/// when it cannot tell yet — the CRDs are not installed (404) or the call failed — so the
/// caller asks again later instead of deciding once on an answer that says nothing.
pub async fn probe_selector(events: &Api<LifecycleEvent>, node: &str) -> Option<bool> {
    let probe = ListParams::default()
        .fields(&format!("spec.bindingNode={node}"))
        .limit(1);
    match events.list(&probe).await {
        Ok(_) => Some(true),
        Err(kube::Error::Api(status)) if status.code == 400 => Some(false),
        Err(error) => {
            tracing::debug!(%error, "probe spec.bindingNode selector support");
            None
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// The decision taken for each event, in the order they were examined.
    pub actions: Vec<(String, Action)>,
    /// Something changed (or a write lost a race); another pass may act at once.
    pub progressed: bool,
    /// A read or an action failed (a throttled or failed API call): the pass left work
    /// for the next one, which should come soon rather than at the next tick.
    pub unfinished: bool,
}

/// The transition of one event, resolved for this pass.
struct Resolved {
    name: String,
    spec: LifecycleTransitionSpec,
    view: TransitionView,
    plugin: Option<Registered>,
}

/// The reconciler of one node.
pub struct Reconciler {
    ctx: Context,
    call_timeout: Duration,
    events: Api<LifecycleEvent>,
    transitions: Api<LifecycleTransition>,
    nodes: Api<Node>,
    selector_supported: bool,
    recorder: Recorder,
    /// The node as Events reference it (with its UID, so `kubectl describe node` finds
    /// them); refreshed every pass.
    node_ref: std::sync::Mutex<ObjectReference>,
    /// Events this reconciler just wrote, with the resourceVersion it acted on: a pass over
    /// a watch store that has not yet seen the write skips them (see [`STALE_GRACE`]).
    acted: std::sync::Mutex<HashMap<String, (String, std::time::Instant)>>,
}

impl Reconciler {
    /// Builds the reconciler and probes whether the API server can select events by
    /// `spec.bindingNode` (a CRD selectable field, Kubernetes ≥ 1.30); without it, the
    /// node's events are filtered client-side.
    pub async fn new(ctx: Context, call_timeout: Duration) -> Self {
        let events: Api<LifecycleEvent> = Api::all(ctx.client.clone());
        let selector_supported = probe_selector(&events, &ctx.node_name)
            .await
            .unwrap_or(true);
        Self::build(ctx, call_timeout, selector_supported)
    }

    /// Builds the reconciler once [`probe_selector`] has answered.
    pub fn build(ctx: Context, call_timeout: Duration, selector_supported: bool) -> Self {
        let client = ctx.client.clone();
        let events: Api<LifecycleEvent> = Api::all(client.clone());
        if !selector_supported {
            tracing::warn!("spec.bindingNode is not a selectable field here; filtering events");
        }
        let reporter = Reporter {
            controller: REPORTER.to_string(),
            instance: Some(format!("{REPORTER}-{}", ctx.node_name)),
        };
        let node_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(ctx.node_name.clone()),
            ..ObjectReference::default()
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            node_ref: std::sync::Mutex::new(node_ref),
            acted: std::sync::Mutex::default(),
            ctx,
            call_timeout,
            events,
            transitions: Api::all(client.clone()),
            nodes: Api::all(client),
            selector_supported,
        }
    }

    /// The client every request of the reconciler goes through.
    pub fn client(&self) -> &kube::Client {
        &self.ctx.client
    }

    /// The node whose events this reconciler drives.
    pub fn node_name(&self) -> &str {
        &self.ctx.node_name
    }

    /// The field selector for this node's events, when the server supports it.
    pub fn field_selector(&self) -> Option<String> {
        self.selector_supported
            .then(|| format!("spec.bindingNode={}", self.ctx.node_name))
    }

    /// One pass at time `now`, reading the events and the Node from the API.
    pub async fn step(&self, now: Timestamp) -> Result<StepReport> {
        let events = self.list_events().await?;
        let node = self.get_node().await?;
        self.step_on(events, &node, true, now).await
    }

    /// One pass at time `now` over what the watches' stores hold: the node's events and,
    /// when the Node store has it, the Node. A node without events costs no request at
    /// all, which keeps an idle reconciler at the cost of its two watches.
    pub async fn step_cached(
        &self,
        events: Vec<std::sync::Arc<LifecycleEvent>>,
        node: Option<std::sync::Arc<Node>>,
        now: Timestamp,
    ) -> Result<StepReport> {
        let events = self.of_this_node(events.iter().map(|e| e.as_ref().clone()).collect());
        if events.is_empty() {
            return Ok(StepReport::default());
        }
        let (node, live) = match node {
            Some(node) => (node.as_ref().clone(), false),
            None => (self.get_node().await?, true),
        };
        self.step_on(events, &node, live, now).await
    }

    /// Whether `event` is the very version a previous pass acted on (and wrote), seen again
    /// because the watch store has not delivered that write yet: acting again would, for
    /// instance, call Start twice. Forgotten once the store moves on or after
    /// [`STALE_GRACE`], in case the write left the object unchanged.
    fn already_acted_on(&self, event: &LifecycleEvent) -> bool {
        let Ok(mut acted) = self.acted.lock() else {
            return false;
        };
        let name = event.name_any();
        let rv = event.resource_version().unwrap_or_default();
        match acted.get(&name) {
            Some((seen, at)) if *seen == rv && at.elapsed() < STALE_GRACE => true,
            Some(_) => {
                acted.remove(&name);
                false
            }
            None => false,
        }
    }

    fn remember_acted(&self, event: &LifecycleEvent) {
        if let Ok(mut acted) = self.acted.lock() {
            let rv = event.resource_version().unwrap_or_default();
            acted.insert(event.name_any(), (rv, std::time::Instant::now()));
        }
    }

    async fn get_node(&self) -> Result<Node> {
        let node_name = &self.ctx.node_name;
        self.nodes
            .get(node_name)
            .await
            .map_err(|e| Error::kube(format!("get node {node_name}"), e))
    }

    /// The pass itself, on `events` (this node's, oldest first) and `node`; `live` says
    /// whether `node` was just read from the API rather than taken from the watch store.
    async fn step_on(
        &self,
        events: Vec<LifecycleEvent>,
        node: &Node,
        live: bool,
        now: Timestamp,
    ) -> Result<StepReport> {
        let node_name = &self.ctx.node_name;
        let mut condition = condition_view(node);
        let mut live = live;
        if let Ok(mut r) = self.node_ref.lock() {
            *r = node.object_ref(&());
        }
        let mut claimed = events
            .iter()
            .find(|e| claim_of(e) == ClaimStatus::Claimed)
            .map(|e| e.name_any());
        let mut resolved: HashMap<String, Result<Option<Resolved>, ()>> = HashMap::new();
        let mut report = StepReport::default();
        for event in &events {
            let name = event.name_any();
            if self.already_acted_on(event) {
                continue;
            }
            let view = event_view(event);
            let transition = if view.claim.is_terminal() {
                None
            } else {
                let key = event.spec.transition_name.clone();
                if !resolved.contains_key(&key) {
                    let value = self.resolve(&key, node).await;
                    resolved.insert(key.clone(), value);
                }
                match resolved.get(&key) {
                    Some(Ok(found)) => found.as_ref(),
                    // Unknown is not missing: a claimed event must not fail because one
                    // read of its transition was throttled or timed out.
                    _ => {
                        report.unfinished = true;
                        continue;
                    }
                }
            };
            let decide_on = |condition: Option<&ConditionView>| {
                decide::decide(&Input {
                    event: &view,
                    transition: transition.map(|t| &t.view),
                    condition,
                    now,
                    plugin_registered: transition.is_some_and(|t| t.plugin.is_some()),
                    other_claimed: claimed.as_ref().is_some_and(|c| *c != name),
                })
            };
            let mut action = decide_on(condition.as_ref());
            if action == Action::Start && view.started_at.is_some() && !live {
                // Started already, yet the stored Node shows no condition of this event:
                // the Node watch may not have delivered the condition our Start wrote.
                // Calling Start again on that view would loop; decide on the live Node.
                condition = condition_view(&self.get_node().await?);
                live = true;
                action = decide_on(condition.as_ref());
            }
            let span = tracing::info_span!("lifecycleevent", event = %name, node = %node_name);
            let outcome = self
                .apply(event, &action, transition, now)
                .instrument(span)
                .await;
            match outcome {
                Ok(progress) => {
                    if progress && matches!(action, Action::Claim { .. }) {
                        claimed = Some(name.clone());
                    }
                    if progress && writes_event(&action) {
                        self.remember_acted(event);
                    }
                    report.progressed |= progress;
                }
                Err(Error::Conflict { what }) => {
                    tracing::info!(event = %name, "{what}: lost a race to another writer");
                    report.progressed = true;
                }
                Err(error) => {
                    report.unfinished = true;
                    tracing::warn!(event = %name, error = %graceful_drain_core::error::chain(&error), "lifecycle action failed")
                }
            }
            report.actions.push((name, action));
        }
        Ok(report)
    }

    async fn list_events(&self) -> Result<Vec<LifecycleEvent>> {
        let node = &self.ctx.node_name;
        let params = match self.field_selector() {
            Some(selector) => ListParams::default().fields(&selector),
            None => ListParams::default(),
        };
        let events = match self.events.list(&params).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                tracing::debug!("lifecycleevents not served (CRDs not installed)");
                Vec::new()
            }
            Err(e) => return Err(Error::kube(format!("list lifecycleevents of {node}"), e)),
        };
        Ok(self.of_this_node(events))
    }

    /// This node's events, oldest first.
    fn of_this_node(&self, mut events: Vec<LifecycleEvent>) -> Vec<LifecycleEvent> {
        let node = &self.ctx.node_name;
        events.retain(|e| e.spec.binding_node == *node);
        events.sort_by_key(|e| {
            let created = e.metadata.creation_timestamp.as_ref().map(|t| t.0);
            (created, e.name_any())
        });
        events
    }

    /// Reads the transition and looks its driver up; `Ok(None)` when the transition is
    /// missing or unusable, `Err` when it could not be read (both logged).
    async fn resolve(&self, name: &str, node: &Node) -> Result<Option<Resolved>, ()> {
        let spec = match self.transitions.get_opt(name).await {
            Ok(Some(t)) => t.spec,
            Ok(None) => return Ok(None),
            Err(error) => {
                tracing::warn!(transition = name, error = %graceful_drain_core::error::chain(&error), "read lifecycletransition; its events wait for the next pass");
                return Err(());
            }
        };
        let sla = match spec.sla.as_deref() {
            None | Some("") => None,
            Some(text) => match graceful_drain_core::duration::parse_go_duration(text) {
                Some(d) => Some(d),
                None => {
                    tracing::warn!(transition = name, sla = text, "transition sla is invalid");
                    return Ok(None);
                }
            },
        };
        let view = TransitionView {
            start: spec.start.clone(),
            end: spec.end.clone(),
            sla,
            targets_node: target::targets(&spec, node),
        };
        let ctx = &self.ctx;
        let timeout = self.call_timeout;
        let plugin = plugin::lookup(&ctx.registry_dir, &spec.driver, &ctx.plugins_dir, timeout)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(driver = %spec.driver, error = %graceful_drain_core::error::chain(&error), "driver registration check failed");
                None
            });
        Ok(Some(Resolved {
            name: name.to_string(),
            spec,
            view,
            plugin,
        }))
    }

    async fn apply(
        &self,
        event: &LifecycleEvent,
        action: &Action,
        transition: Option<&Resolved>,
        now: Timestamp,
    ) -> Result<bool> {
        match (action, transition) {
            (Action::Wait(reason), _) => {
                tracing::debug!(%reason, "event waits");
                Ok(false)
            }
            (Action::Claim { sla }, Some(t)) => self.claim(event, t, *sla).await,
            (Action::Start, Some(t)) => self.call(event, t, Call::Start, now).await,
            (Action::End, Some(t)) => self.call(event, t, Call::End, now).await,
            (Action::Expire, _) => {
                self.stop_driver(event, transition, now).await;
                let message = expiry_message(event);
                self.conclude(event, ClaimStatus::SlaExpired, Some(message))
                    .await
            }
            (Action::Cancel, _) => {
                self.stop_driver(event, transition, now).await;
                self.finalize(event).await
            }
            (Action::Conclude(status), _) => {
                let message = (*status == ClaimStatus::Failed)
                    .then(|| "the LifecycleTransition was deleted while claimed".to_string());
                self.conclude(event, *status, message).await
            }
            (Action::Finalize, _) => self.finalize(event).await,
            (_, None) => Ok(false),
        }
    }

    /// Claim: finalizer first, then the status compare-and-swap to Claimed.
    async fn claim(
        &self,
        event: &LifecycleEvent,
        t: &Resolved,
        sla: Option<Timestamp>,
    ) -> Result<bool> {
        let name = event.name_any();
        let mut ev = event.clone();
        if !ev.finalizers().iter().any(|f| f == CLAIM_FINALIZER) {
            ev.finalizers_mut().push(CLAIM_FINALIZER.to_string());
            ev = self
                .events
                .replace(&name, &PostParams::default(), &ev)
                .await
                .map_err(|e| Error::kube(format!("add finalizer to lifecycleevent {name}"), e))?;
        }
        ev.status = Some(LifecycleEventStatus {
            claim_status: Some(ClaimStatus::Claimed),
            driver: Some(t.spec.driver.clone()),
            sla: sla.map(rfc3339),
        });
        self.events
            .replace_status(&name, &PostParams::default(), &ev)
            .await
            .map_err(|e| Error::kube(format!("claim lifecycleevent {name}"), e))?;
        self.ctx.metrics.event(ClaimStatus::Claimed);
        tracing::info!(transition = %t.name, driver = %t.spec.driver, sla = ?sla, "claimed");
        let deadline = sla.map_or("none".to_string(), rfc3339);
        let note = format!(
            "claimed lifecycleevent {name} (transition {}, driver {}, SLA deadline {deadline})",
            t.name, t.spec.driver
        );
        self.record(
            EventType::Normal,
            agent_reason::LIFECYCLE_EVENT_CLAIMED,
            "Claim",
            note,
        )
        .await;
        Ok(true)
    }

    /// Calls Start or End; patches the Node condition; records Start on the event.
    async fn call(
        &self,
        event: &LifecycleEvent,
        t: &Resolved,
        call: Call,
        now: Timestamp,
    ) -> Result<bool> {
        let Some(plugin) = &t.plugin else {
            return Ok(false);
        };
        let response = self.grpc(event, t, plugin, call, false).await;
        let response = match response {
            Ok(r) if r.error.is_empty() => r,
            Ok(r) => {
                let message = format!("{} returned error: {}", call.method(), r.error);
                return self
                    .conclude(event, ClaimStatus::Failed, Some(message))
                    .await;
            }
            Err(error) if error.is_transient() => {
                // The kubelet fails the event here; a driver restarting during a
                // DaemonSet rollout must not fail a drain, so retry (the SLA bounds it).
                tracing::warn!(error = %graceful_drain_core::error::chain(&error), "driver unreachable; retrying");
                return Ok(false);
            }
            Err(error) => {
                let message = graceful_drain_core::error::chain(&error).to_string();
                return self
                    .conclude(event, ClaimStatus::Failed, Some(message))
                    .await;
            }
        };
        tracing::info!(method = call.method(), condition = %response.lifecycle_condition, "driver answered");
        let mut progressed = false;
        if !response.lifecycle_condition.is_empty() {
            let after_start = call == Call::Start;
            progressed = self
                .set_condition(&response.lifecycle_condition, &t.name, after_start, now)
                .await?;
        }
        if call == Call::Start {
            self.mark_started(event, now).await?;
            progressed = true;
        }
        Ok(progressed)
    }

    async fn grpc(
        &self,
        event: &LifecycleEvent,
        t: &Resolved,
        plugin: &Registered,
        call: Call,
        sla_expired: bool,
    ) -> Result<LifecycleTransitionResponse, plugin::Error> {
        let (transition_name, event_name) = (t.name.clone(), event.name_any());
        let node_name = self.ctx.node_name.clone();
        let (start, end) = (t.spec.start.clone(), t.spec.end.clone());
        let result = match call {
            Call::Start => {
                let request = StartLifecycleTransitionRequest {
                    transition_name,
                    event_name,
                    node_name,
                    start,
                    end,
                };
                plugin::start(plugin, request, self.call_timeout).await
            }
            Call::End => {
                let request = EndLifecycleTransitionRequest {
                    transition_name,
                    event_name,
                    node_name,
                    start,
                    end,
                    sla_expired,
                };
                plugin::end(plugin, request, self.call_timeout).await
            }
        };
        let outcome = match &result {
            Ok(r) if r.error.is_empty() => CallOutcome::Ok,
            Ok(_) => CallOutcome::DriverError,
            Err(_) => CallOutcome::Failed,
        };
        self.ctx.metrics.call(call.method(), outcome);
        result
    }

    /// Tells the driver to stop (End with `sla_expired`); best effort, the event ends
    /// either way.
    async fn stop_driver(&self, event: &LifecycleEvent, t: Option<&Resolved>, now: Timestamp) {
        let Some((t, plugin)) = t.and_then(|t| t.plugin.as_ref().map(|p| (t, p))) else {
            return;
        };
        match self.grpc(event, t, plugin, Call::End, true).await {
            Ok(r) if !r.lifecycle_condition.is_empty() => {
                let set = self.set_condition(&r.lifecycle_condition, &t.name, false, now);
                if let Err(error) = set.await {
                    tracing::warn!(error = %graceful_drain_core::error::chain(&error), "record condition after expiry");
                }
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(error = %graceful_drain_core::error::chain(&error), "tell driver the event ended")
            }
        }
    }

    async fn mark_started(&self, event: &LifecycleEvent, now: Timestamp) -> Result<()> {
        let name = event.name_any();
        let mut ev = event.clone();
        ev.annotations_mut()
            .insert(LIFECYCLE_STARTED_ANNOTATION.to_string(), rfc3339(now));
        self.events
            .replace(&name, &PostParams::default(), &ev)
            .await
            .map_err(|e| Error::kube(format!("record start on lifecycleevent {name}"), e))?;
        Ok(())
    }

    /// Writes the terminal status (after the reason annotation), then finalizes.
    async fn conclude(
        &self,
        event: &LifecycleEvent,
        status: ClaimStatus,
        message: Option<String>,
    ) -> Result<bool> {
        let name = event.name_any();
        let mut ev = event.clone();
        if let Some(message) = message {
            tracing::warn!(%status, %message, "lifecycle event ends");
            ev.annotations_mut()
                .insert(LIFECYCLE_MESSAGE_ANNOTATION.to_string(), message);
            ev = self
                .events
                .replace(&name, &PostParams::default(), &ev)
                .await
                .map_err(|e| Error::kube(format!("annotate lifecycleevent {name}"), e))?;
        } else {
            tracing::info!(%status, "lifecycle event ends");
        }
        let mut new_status = ev.status.clone().unwrap_or_default();
        new_status.claim_status = Some(status);
        ev.status = Some(new_status);
        let ev = self
            .events
            .replace_status(&name, &PostParams::default(), &ev)
            .await
            .map_err(|e| Error::kube(format!("set lifecycleevent {name} {status}"), e))?;
        self.ctx.metrics.event(status);
        let (type_, why) = match ev.annotations().get(LIFECYCLE_MESSAGE_ANNOTATION) {
            Some(m) if status != ClaimStatus::Succeeded => (EventType::Warning, format!(": {m}")),
            _ => (EventType::Normal, String::new()),
        };
        let note = format!(
            "lifecycleevent {name} ({}) {status}{why}",
            ev.spec.transition_name
        );
        self.record(
            type_,
            agent_reason::lifecycle_event(status),
            "Conclude",
            note,
        )
        .await;
        self.finalize(&ev).await
    }

    /// Posts a Kubernetes Event on the node, best effort.
    async fn record(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let reference = match self.node_ref.lock() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        match tokio::time::timeout(EVENT_TIMEOUT, self.recorder.publish(&event, &reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::debug!(error = %graceful_drain_core::error::chain(&error), reason, "post node event")
            }
            Err(_) => tracing::debug!(reason, "post node event: timed out"),
        }
    }

    /// Removes the claim finalizer and deletes the event (UID-guarded).
    async fn finalize(&self, event: &LifecycleEvent) -> Result<bool> {
        let name = event.name_any();
        let mut ev = event.clone();
        if ev.finalizers().iter().any(|f| f == CLAIM_FINALIZER) {
            ev.finalizers_mut().retain(|f| f != CLAIM_FINALIZER);
            match self
                .events
                .replace(&name, &PostParams::default(), &ev)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(true),
                Err(e) => return Err(Error::kube(format!("release lifecycleevent {name}"), e)),
            }
        }
        if ev.metadata.deletion_timestamp.is_none() {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: ev.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.events.delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(Error::kube(format!("delete lifecycleevent {name}"), e)),
            }
        }
        Ok(true)
    }

    /// Read-modify-write of the Node's `LifecycleTransition` condition, guarded by the
    /// Node's resourceVersion (a JSON patch `test`), retried on conflict. Returns whether
    /// the condition changed. `after_start` moves lastTransitionTime even when the reason
    /// is unchanged: the condition now belongs to the event just started.
    async fn set_condition(
        &self,
        reason: &str,
        transition: &str,
        after_start: bool,
        now: Timestamp,
    ) -> Result<bool> {
        let name = &self.ctx.node_name;
        for _ in 0..CONDITION_ATTEMPTS {
            let node = self
                .nodes
                .get(name)
                .await
                .map_err(|e| Error::kube(format!("get node {name}"), e))?;
            let Some(patch) = condition_patch(&node, reason, transition, after_start, now) else {
                return Ok(false);
            };
            let params = PatchParams::default();
            match self
                .nodes
                .patch_status(name, &params, &Patch::Json::<()>(patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(reason, "node condition {TRANSITION_CONDITION} set");
                    return Ok(true);
                }
                // A failed `test` is 422 on a real API server; a stale write 409.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => continue,
                Err(e) => return Err(Error::kube(format!("patch node {name} status"), e)),
            }
        }
        Err(Error::Conflict {
            what: format!("set condition {TRANSITION_CONDITION} on node {name}"),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Start,
    End,
}

impl Call {
    fn method(self) -> &'static str {
        match self {
            Self::Start => "StartLifecycleTransition",
            Self::End => "EndLifecycleTransition",
        }
    }
}

/// The JSON patch setting the condition, or `None` when nothing would change.
fn condition_patch(
    node: &Node,
    reason: &str,
    transition: &str,
    after_start: bool,
    now: Timestamp,
) -> Option<json_patch::Patch> {
    let mut conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let existing = conditions
        .iter()
        .position(|c| c.type_ == TRANSITION_CONDITION);
    let changed = existing.is_none_or(|i| {
        let c = &conditions[i];
        c.status != "True" || c.reason.as_deref() != Some(reason)
    });
    if !changed && !after_start {
        return None;
    }
    let now = Time(Timestamp::from_second(now.as_second()).unwrap_or(now));
    let condition = NodeCondition {
        type_: TRANSITION_CONDITION.to_string(),
        status: "True".to_string(),
        reason: Some(reason.to_string()),
        message: Some(format!("Lifecycle Transition '{transition}'")),
        last_transition_time: Some(now.clone()),
        last_heartbeat_time: Some(now),
    };
    match existing {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
    let rv = node.resource_version().unwrap_or_default();
    let set = if node.status.is_some() {
        json!({"op": "add", "path": "/status/conditions", "value": conditions})
    } else {
        json!({"op": "add", "path": "/status", "value": {"conditions": conditions}})
    };
    let ops = json!([{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, set]);
    serde_json::from_value(ops).ok()
}

fn claim_of(event: &LifecycleEvent) -> ClaimStatus {
    event
        .status
        .as_ref()
        .and_then(|s| s.claim_status)
        .unwrap_or(ClaimStatus::Pending)
}

fn event_view(event: &LifecycleEvent) -> EventView {
    let parse = |s: &str| s.parse::<Timestamp>().ok();
    EventView {
        claim: claim_of(event),
        sla_deadline: event
            .status
            .as_ref()
            .and_then(|s| s.sla.as_deref())
            .and_then(parse),
        started_at: event
            .annotations()
            .get(LIFECYCLE_STARTED_ANNOTATION)
            .and_then(|s| parse(s)),
        deleting: event.metadata.deletion_timestamp.is_some(),
    }
}

fn condition_view(node: &Node) -> Option<ConditionView> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    let c = conditions
        .iter()
        .find(|c| c.type_ == TRANSITION_CONDITION)?;
    Some(ConditionView {
        reason: c.reason.clone().unwrap_or_default(),
        last_transition: c.last_transition_time.as_ref().map(|t| t.0),
    })
}

fn expiry_message(event: &LifecycleEvent) -> String {
    let deadline = event
        .status
        .as_ref()
        .and_then(|s| s.sla.clone())
        .unwrap_or_default();
    format!("the transition did not complete before its SLA deadline {deadline}")
}

/// RFC3339 with whole seconds, as Kubernetes writes times.
pub(crate) fn rfc3339(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}
