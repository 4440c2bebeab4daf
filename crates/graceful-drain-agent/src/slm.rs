//! The SLMPlugin gRPC service (docs/design.md §3): `StartLifecycleTransition` and
//! `EndLifecycleTransition` for our two transitions, answered from the agent's in-memory
//! state at once — the work itself runs in [`super::ops`] tasks, because the
//! kubelet gives up on a call after 45 s.
//!
//! Start begins the operation (idempotent) and returns the transition's start reason. End
//! returns the start reason while work remains ("call me again"), the end reason once it
//! is done, or an `error` (failed or stopped operation, SLA expired, unknown transition,
//! another node) which fails the LifecycleEvent.

use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::ops::{Agent, OpKind, Phase};
use graceful_drain_core::lifecycle::{
    DRAIN_COMPLETE, DRAIN_STARTED, MAINTENANCE_COMPLETE, UNCORDONING,
};
use graceful_drain_core::proto::slm::slm_plugin_server::SlmPlugin;
use graceful_drain_core::proto::slm::{
    EndLifecycleTransitionRequest, LifecycleTransitionResponse, StartLifecycleTransitionRequest,
};

/// The names of the transitions this driver offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitionNames {
    /// Name of the drain LifecycleTransition (`--drain-transition`).
    pub drain: String,
    /// Name of the maintenance-complete LifecycleTransition (`--maintenance-transition`).
    pub maintenance: String,
}

/// Why a Start or End request is refused; the message goes back in the response's `error`.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The request names another node than the one this agent serves.
    #[error("transition {transition:?} for node {node:?}: this driver serves node {ours:?}")]
    OtherNode {
        /// The transition the request names.
        transition: String,
        /// The node the request names.
        node: String,
        /// The node this agent serves.
        ours: String,
    },
    /// The request names a transition this driver does not offer.
    #[error(
        "unknown transition {transition:?} on node {node:?}: this driver offers {drain:?} and {maintenance:?}"
    )]
    UnknownTransition {
        /// The transition the request names.
        transition: String,
        /// The node the request names.
        node: String,
        /// Our drain transition's name.
        drain: String,
        /// Our maintenance-complete transition's name.
        maintenance: String,
    },
}

/// The SLMPlugin service: answers Start and End from the [`Agent`]'s state at once.
#[derive(Clone)]
pub struct SlmService {
    agent: Agent,
    transitions: TransitionNames,
}

/// What a request asks for, once checked.
struct Target {
    kind: OpKind,
    start: String,
    end: String,
}

impl SlmService {
    /// A service answering for `agent`'s node.
    pub fn new(agent: Agent, transitions: TransitionNames) -> Self {
        Self { agent, transitions }
    }

    /// Checks the node and transition of a request. The reasons come from the request
    /// (they are the published transition's `start`/`end`), defaulting to ours.
    fn target(
        &self,
        transition: &str,
        node: &str,
        start: &str,
        end: &str,
    ) -> Result<Target, Refused> {
        if node != self.agent.node() {
            return Err(Refused::OtherNode {
                transition: transition.to_owned(),
                node: node.to_owned(),
                ours: self.agent.node().to_owned(),
            });
        }
        let (kind, default_start, default_end) = if transition == self.transitions.drain {
            (OpKind::Drain, DRAIN_STARTED, DRAIN_COMPLETE)
        } else if transition == self.transitions.maintenance {
            (OpKind::Maintenance, UNCORDONING, MAINTENANCE_COMPLETE)
        } else {
            return Err(Refused::UnknownTransition {
                transition: transition.to_owned(),
                node: node.to_owned(),
                drain: self.transitions.drain.clone(),
                maintenance: self.transitions.maintenance.clone(),
            });
        };
        let pick = |given: &str, default: &str| {
            if given.is_empty() {
                default.to_string()
            } else {
                given.to_string()
            }
        };
        Ok(Target {
            kind,
            start: pick(start, default_start),
            end: pick(end, default_end),
        })
    }

    fn answer(&self, condition: String, error: String) -> Response<LifecycleTransitionResponse> {
        Response::new(LifecycleTransitionResponse {
            lifecycle_condition: condition,
            node_name: self.agent.node().to_string(),
            error,
        })
    }

    /// Start: begin the operation and answer with the start reason.
    pub fn start(&self, req: &StartLifecycleTransitionRequest) -> LifecycleTransitionResponse {
        let span = tracing::info_span!("start", transition = %req.transition_name, event = %req.event_name, node = %req.node_name);
        let _guard = span.enter();
        match self.target(&req.transition_name, &req.node_name, &req.start, &req.end) {
            Err(error) => {
                tracing::warn!(%error, "refused StartLifecycleTransition");
                self.answer(String::new(), error.to_string()).into_inner()
            }
            Ok(target) => {
                self.agent.begin(target.kind, event_name(&req.event_name));
                tracing::info!("transition started");
                self.answer(target.start, String::new()).into_inner()
            }
        }
    }

    /// End: report where the operation is.
    pub async fn end(&self, req: &EndLifecycleTransitionRequest) -> LifecycleTransitionResponse {
        let span = tracing::info_span!("end", transition = %req.transition_name, event = %req.event_name, node = %req.node_name);
        self.end_in_span(req).instrument(span).await
    }

    async fn end_in_span(
        &self,
        req: &EndLifecycleTransitionRequest,
    ) -> LifecycleTransitionResponse {
        let target = match self.target(&req.transition_name, &req.node_name, &req.start, &req.end) {
            Ok(target) => target,
            Err(error) => {
                tracing::warn!(%error, "refused EndLifecycleTransition");
                return self.answer(String::new(), error.to_string()).into_inner();
            }
        };
        let node = self.agent.node();
        if req.sla_expired {
            let reason = format!("SLA of transition {:?} expired", req.transition_name);
            self.agent.stop(target.kind, reason.clone());
            tracing::warn!("SLA expired; operation stopped");
            let message = format!("{reason} on node {node}; {}", self.agent.snapshot().message);
            return self.answer(String::new(), message).into_inner();
        }
        // The operation of this event, or — for an event the agent has no operation for (a
        // restarted agent; a Node still showing the start reason of an earlier, failed
        // event) — a fresh one, never an old outcome.
        let event = event_name(&req.event_name);
        match self.agent.poll_settled(target.kind, event).await {
            Phase::Running => self.answer(target.start, String::new()),
            Phase::Complete => self.answer(target.end, String::new()),
            Phase::Failed(reason) | Phase::Stopped(reason) => {
                let error = format!(
                    "transition {:?} on node {node}: {reason}",
                    req.transition_name
                );
                self.answer(String::new(), error)
            }
        }
        .into_inner()
    }
}

/// The request's event name; `None` when the caller sent none.
fn event_name(name: &str) -> Option<&str> {
    Some(name).filter(|n| !n.is_empty())
}

#[tonic::async_trait]
impl SlmPlugin for SlmService {
    async fn start_lifecycle_transition(
        &self,
        request: Request<StartLifecycleTransitionRequest>,
    ) -> Result<Response<LifecycleTransitionResponse>, Status> {
        Ok(Response::new(self.start(request.get_ref())))
    }

    async fn end_lifecycle_transition(
        &self,
        request: Request<EndLifecycleTransitionRequest>,
    ) -> Result<Response<LifecycleTransitionResponse>, Status> {
        Ok(Response::new(self.end(request.get_ref()).await))
    }
}
