//! Who runs a hook and for what ([`HookContext`]), and where a running hook stands
//! ([`HookStep`]): what the run of a hook, its Job target and its records on the Node share.

use std::fmt;

use serde::Serialize;

use super::config::HookPoint;
use crate::report::NodeEvents;

/// Who runs a hook and for what.
pub struct HookContext<'a> {
    /// Client for Jobs and for the hook records on the Node.
    pub client: &'a kube::Client,
    /// The node being maintained (Jobs are pinned to it; records live on it).
    pub node: &'a str,
    /// The LifecycleEvent of the transition, if it names one.
    pub event: Option<&'a str>,
    /// What ties records to this transition across agent restarts: the event's name, or
    /// an id of the operation when it names none.
    pub operation: &'a str,
    /// Posts the hooks' Events on the Node.
    pub events: &'a NodeEvents,
}

/// Where a running hook stands (for the condition message and `/status`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookStep {
    /// The hook's configured name.
    pub name: String,
    /// The point it runs at.
    pub at: HookPoint,
    /// The hook's latest message, or `starting` before it said anything.
    pub message: String,
}

impl fmt::Display for HookStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hook {} ({})", self.name, self.at)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}
