//! The drain engine: evicts a node's pods like `kubectl drain` (docs/design.md §4) and waits until
//! every one of them is really gone, retrying refused evictions and saying why they are
//! refused instead of giving up. This file holds the drain's options and errors; each job
//! has a file of its own.
//!
//! Data flow: one watch on the node's pods (`spec.nodeName=<node>`) keeps a map of what is
//! on the node ([`Engine`], in `engine.rs`). The first complete list is run through
//! [`filters::plan`](crate::filters::plan); a refusal ends the drain before any eviction.
//! Each planned pod gets a task (`task.rs`) that POSTs a `policy/v1` Eviction (built in
//! `request.rs`, with the pod's UID as precondition) and retries refusals with a capped,
//! jittered exponential backoff that honours `Retry-After`, naming the PDBs that block it
//! (`pdb.rs`); at most `concurrency` requests are in flight. A pod counts as gone when the
//! watch no longer has it or has a new pod (new UID) under its name. Pods isolated by our
//! webhook or still terminating count as remaining. Progress is published on a `watch`
//! channel after every change.

mod engine;
mod pdb;
mod request;
mod task;

use std::time::Duration;

use crate::filters::{FilterOptions, PodKey, Refused};
use crate::progress::Blocker;
use crate::tiers::Tiers;

pub use crate::filters::{UNSCHEDULABLE_TAINT, tolerates_cordon};
pub use engine::Engine;
pub use pdb::{PdbLookupError, selecting_pdbs};
pub use request::{
    Answer, classify_answer, delete_request, eviction_backoff, eviction_request, retry_delay, send,
};

/// How often a drain re-reads its LifecycleEvent: the kubelet's reconciler tick, so a drain
/// stops at most one tick after its event ended (SLA expired, failed, deleted), at one GET
/// per tick per draining node.
pub const DEFAULT_EVENT_CHECK: Duration = Duration::from_secs(10);

/// Options of a drain (the kubectl flags, see `node-agent --help`).
#[derive(Clone, Debug)]
pub struct DrainConfig {
    /// Which pods may be evicted.
    pub filters: FilterOptions,
    /// Grace period for the evicted pods; `None` keeps each pod's own.
    pub grace_period: Option<i64>,
    /// Label selector restricting the drained pods (on the list, not a filter).
    pub pod_selector: Option<String>,
    /// The eviction tiers (`--tiers`, `--last-pod-selector`; see [`super::tiers`]).
    pub tiers: Tiers,
    /// DELETE pods instead of evicting them (bypasses PDBs).
    pub disable_eviction: bool,
    /// Give up after this long; `None` waits until done or stopped.
    pub timeout: Option<Duration>,
    /// Eviction requests in flight at once.
    pub concurrency: usize,
    /// How often a running drain re-reads its LifecycleEvent to stop once it ended.
    pub event_check: Duration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            filters: FilterOptions::default(),
            grace_period: None,
            pod_selector: None,
            tiers: Tiers::default(),
            disable_eviction: false,
            timeout: None,
            concurrency: 16,
            event_check: DEFAULT_EVENT_CHECK,
        }
    }
}

/// Errors of a drain.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The filters refused some pods; nothing was evicted.
    #[error("drain node {node}: {refused}")]
    Refused {
        /// The node being drained.
        node: String,
        /// Every pod the filters refused, with the reason for each.
        refused: Refused,
    },
    /// The drain timeout passed.
    #[error("drain node {node}: timed out after {after:?} with {message}")]
    TimedOut {
        /// The node being drained.
        node: String,
        /// The configured drain timeout that ran out.
        after: Duration,
        /// The drain's progress when it gave up (what was still left on the node).
        message: String,
    },
    /// The watch on the node's pods ended (it retries on its own, so this is a bug).
    #[error("drain node {node}: the watch on its pods ended")]
    WatchEnded {
        /// The node being drained.
        node: String,
    },
    /// A pod cannot be evicted until its budgets change.
    #[error(
        "drain node {node}: evict pod {pod}: {blocker} select it, which the eviction API refuses: {message}"
    )]
    Unevictable {
        /// The node being drained.
        node: String,
        /// The pod whose eviction keeps being refused.
        pod: PodKey,
        /// What refuses it (today always several PDBs selecting the pod).
        blocker: Blocker,
        /// The API server's message on the last refusal.
        message: String,
    },
    /// The drain's LifecycleEvent carries an override that cannot be used.
    #[error("drain node {node}: lifecycleevent {event}: annotation {annotation}")]
    Override {
        /// The node being drained.
        node: String,
        /// Name of the LifecycleEvent carrying the annotation.
        event: String,
        /// The annotation whose value is unusable.
        annotation: &'static str,
        /// Why the annotation's value was rejected.
        #[source]
        error: super::tiers::Error,
    },
    /// Listing the pods `--pod-selector` selects failed.
    #[error("drain node {node}: list pods matching {selector:?}: {message}")]
    Select {
        /// The node being drained.
        node: String,
        /// The label selector of the failed list.
        selector: String,
        /// The API error, or that no answer came within the API timeout.
        message: String,
    },
}

/// Helpers shared by the tests of the drain's files.
#[cfg(test)]
mod test_support {
    use crate::filters::PodKey;

    pub(super) use graceful_drain_testing::fixtures::mock::Handle;

    /// A client whose requests go to the returned handle: the shared scripted mock's.
    pub(super) fn mock() -> (kube::Client, Handle) {
        graceful_drain_testing::fixtures::mock::client()
    }

    pub(super) fn key() -> PodKey {
        PodKey {
            namespace: "shop".into(),
            name: "web-1".into(),
        }
    }
}
