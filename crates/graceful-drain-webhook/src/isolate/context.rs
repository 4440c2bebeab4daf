//! What acting on a pod needs: the client, the caches, where Events go, and this
//! replica's turns at controllers and PDBs.

use std::collections::BTreeSet;

use super::budget::PdbGates;
use super::owner_reads::OwnerReads;
use crate::cache::Cache;

/// Where Events go: sent inline (tests, the deleter's own task) or handed to a background
/// sender so no admission call waits for an Event.
#[derive(Clone, Debug, Default)]
pub enum EventSink {
    /// Create the Event in the calling task.
    #[default]
    Inline,
    /// Queue it for the sender task ([`crate::events::send`], which groups the Events of
    /// one controller's pods); dropped (and logged) when full.
    Queue(tokio::sync::mpsc::Sender<crate::events::Queued>),
}

/// Events waiting for the background sender; beyond this they are dropped (logged), so a
/// slow API server never makes admission calls queue behind Events. The sender empties
/// the queue into its batch as Events come, so a 500-pod drain fits.
pub const EVENT_QUEUE: usize = 1024;

/// What [`super::isolate`] needs to reach the cluster.
#[derive(Clone)]
pub struct Context {
    /// Client for every call made while acting on a pod (admission uses one without
    /// kube's hidden retries).
    pub client: kube::Client,
    /// The shared caches, also told which pods this replica isolated.
    pub cache: std::sync::Arc<Cache>,
    /// Our identity, for Events (`reportingInstance`).
    pub identity: String,
    /// Where Events about pods go.
    pub events: EventSink,
    /// Label keys the relabelling keeps unless a selector can only be left by removing
    /// them (`--keep-label`), so selectors of NetworkPolicies, monitors and dashboards on
    /// those keys keep matching the isolated pod.
    pub keep_labels: BTreeSet<String>,
    /// How long after its delete time a pod isolated for a caller goes back into its
    /// Services if that caller never removed it ([`super::RESTORE_AFTER`] unless tests
    /// shorten it).
    pub restore_after: std::time::Duration,
    /// This replica's turns at charging each PDB.
    pub gates: std::sync::Arc<PdbGates>,
    /// This replica's reads of pods' controllers.
    pub owners: std::sync::Arc<OwnerReads>,
    /// This replica's recent reads of nodes' drains.
    pub nodes: std::sync::Arc<super::NodeReads>,
}
