//! The hook records on the Node (its `graceful-drain.io/hooks` annotation): how a hook's
//! state outlives an agent restart, read before a hook runs and written as it changes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};

use super::config::{Hook, HookPoint};
use super::context::HookContext;
use crate::node;
use graceful_drain_core::backoff::Backoff;
use graceful_drain_core::labels::HOOKS_ANNOTATION;

/// Reads and writes of a hook's record on the Node are tried this often (200 ms doubling
/// in between, about 3 s in all) before the hook goes on without.
const RECORD_ATTEMPTS: u32 = 5;
/// First pause between two tries at a hook's record.
const RECORD_PAUSE: Duration = Duration::from_millis(200);
/// Longest pause between two tries: the fourth pause (1.6 s) is the last one taken.
const RECORD_PAUSE_MAX: Duration = Duration::from_millis(1600);

/// The state of one hook as the Node remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RecordState {
    /// Written before the first call: the hook may or may not have heard of it.
    Starting,
    /// The hook answered `inProgress`: a restarted agent polls it under the same id.
    InProgress,
    /// The hook finished; a restarted agent skips it for the same operation.
    Done,
    /// The hook failed or timed out; it runs afresh if the transition is tried again.
    Failed,
}

/// One hook's entry in the Node's `graceful-drain.io/hooks` annotation (a JSON object
/// keyed by hook name): its last run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRecord {
    /// The point the hook ran at; a record of another point is not resumed.
    pub at: HookPoint,
    /// The LifecycleEvent (or operation id) of the run.
    pub operation: String,
    /// The run's id, sent in every request of the run and part of a Job's name.
    pub id: String,
    /// Where the run stood when last written.
    pub state: RecordState,
    /// The hook's last message (or why it timed out).
    #[serde(default)]
    pub message: String,
    /// When the run started; its timeout counts from here, across restarts.
    pub started_at: jiff::Timestamp,
    /// When the run ended (done, failed or timed out); unset while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<jiff::Timestamp>,
}

/// The hook records on `node` (none when the annotation is missing or unreadable).
pub fn records(node: &Node) -> BTreeMap<String, HookRecord> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HOOKS_ANNOTATION))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

impl Hook {
    /// The record of this hook for this transition, if an earlier agent left one.
    pub(super) async fn prior_record(&self, ctx: &HookContext<'_>) -> Option<HookRecord> {
        let mut backoff = Backoff::new(RECORD_PAUSE, RECORD_PAUSE_MAX);
        let mut attempt = 1;
        let node = loop {
            match node::get(ctx.client, ctx.node).await {
                Ok(node) => break node,
                Err(error) if attempt < RECORD_ATTEMPTS => {
                    let error = graceful_drain_core::error::chain(&error).to_string();
                    tracing::warn!(hook = %self.spec.name, attempt, %error, "read hook records from the node (retrying)");
                }
                Err(error) => {
                    // Without the record a restarted agent cannot tell a hook in progress
                    // from a new one; the error is loud, and the hook is started afresh.
                    let error = graceful_drain_core::error::chain(&error).to_string();
                    tracing::warn!(hook = %self.spec.name, %error, "read hook records from the node; starting the hook afresh");
                    return None;
                }
            }
            backoff.wait().await;
            attempt += 1;
        };
        records(&node)
            .remove(&self.spec.name)
            .filter(|r| r.operation == ctx.operation && r.at == self.spec.at)
    }

    /// Writes `record` into the Node's annotation (retried a few times; a record that
    /// cannot be written is logged, and the hook goes on).
    pub(super) async fn write_record(&self, ctx: &HookContext<'_>, record: &HookRecord) {
        let mut backoff = Backoff::new(RECORD_PAUSE, RECORD_PAUSE_MAX);
        for attempt in 1..=RECORD_ATTEMPTS {
            match write_record(ctx.client, ctx.node, &self.spec.name, record).await {
                Ok(()) => return,
                Err(error) => {
                    let error = graceful_drain_core::error::chain(&error).to_string();
                    tracing::warn!(hook = %self.spec.name, attempt, %error, "record hook state on the node");
                }
            }
            backoff.wait().await;
        }
    }
}

/// Writes one hook's record into the Node's hooks annotation, keeping the others'.
async fn write_record(
    client: &kube::Client,
    node_name: &str,
    hook: &str,
    record: &HookRecord,
) -> Result<(), node::Error> {
    let current = node::get(client, node_name).await?;
    let mut all = records(&current);
    all.insert(hook.to_string(), record.clone());
    let text = serde_json::to_string(&all).unwrap_or_default();
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": current.metadata.resource_version,
            "annotations": { HOOKS_ANNOTATION: text },
        }
    });
    node::patch(
        client,
        node_name,
        "record hook state on",
        Patch::Merge(patch),
        PatchParams::default(),
    )
    .await?;
    Ok(())
}
