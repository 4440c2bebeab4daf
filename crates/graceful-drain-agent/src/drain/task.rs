//! The eviction task of one pod: sends its eviction until the API server accepts it,
//! retrying refusals and reporting what blocks it to the engine and on the Node.

use std::sync::Arc;
use std::time::Duration;

use http::Request;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::sync::{Semaphore, mpsc};

use super::DrainConfig;
use super::pdb::selecting_pdbs;
use super::request::{
    Answer, RETRY_AFTER_CAP, RETRY_BASE, delete_request, eviction_backoff, eviction_request,
    retry_delay, send,
};
use crate::filters::PodKey;
use crate::progress::Blocker;
use crate::report::{EventType, Metrics, NodeEvents};
use graceful_drain_core::labels::agent_reason;

/// Evictions refused because several PDBs select the pod are retried this many times (about
/// 30 s with the backoff, time for an operator fixing overlapping budgets), then the drain
/// fails naming them: the API server refuses such pods until the budgets change, and
/// `kubectl drain` gives up on them at once.
const MULTIPLE_PDB_ATTEMPTS: u32 = 5;

/// What an eviction task reports to the engine.
#[derive(Debug)]
pub(super) enum Update {
    Blocked(PodKey, Blocker),
    Accepted(PodKey),
    /// The pod cannot be evicted as things stand: the drain fails.
    Unevictable(PodKey, Blocker, String),
}

/// Everything an eviction task needs.
pub(super) struct TaskCtx {
    pub(super) client: kube::Client,
    pub(super) config: Arc<DrainConfig>,
    pub(super) metrics: Metrics,
    pub(super) events: NodeEvents,
    pub(super) permits: Semaphore,
    pub(super) updates: mpsc::UnboundedSender<Update>,
}

impl TaskCtx {
    fn request(&self, key: &PodKey, uid: &str) -> Result<Request<Vec<u8>>, http::Error> {
        if self.config.disable_eviction {
            delete_request(key, uid, self.config.grace_period)
        } else {
            eviction_request(key, uid, self.config.grace_period, false)
        }
    }

    /// Whether the pod with `uid` still exists under `key`. Read before retrying a
    /// refused eviction: the API server charges the PDB before it checks the UID
    /// precondition (pkg/registry/core/pod/storage/eviction.go), so an eviction naming a
    /// pod that was meanwhile replaced under the same name (a StatefulSet's `web-0`) would
    /// spend the replacement's disruption and then fail with 409. An unreadable pod counts
    /// as present: the precondition still protects the replacement from deletion.
    async fn still_there(&self, key: &PodKey, uid: &str) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        match api.get_metadata_opt(&key.name).await {
            Ok(Some(meta)) => meta.metadata.uid.as_deref() == Some(uid),
            Ok(None) => false,
            Err(error) => {
                tracing::debug!(pod = %key, error = %graceful_drain_core::error::chain(&error), "re-read pod before retrying its eviction");
                true
            }
        }
    }

    /// Names the PDB(s) behind a 429 or 500 (one API list per new block).
    async fn resolve(&self, pod: &Pod, blocker: Blocker) -> Blocker {
        match blocker {
            Blocker::Pdb(_) => match selecting_pdbs(&self.client, pod).await {
                Ok(names) if names.len() == 1 => Blocker::Pdb(names.join("")),
                Ok(names) if names.len() > 1 => Blocker::MultiplePdbs(names),
                Ok(_) => Blocker::Pdb("(unknown)".into()),
                Err(error) => Blocker::Pdb(format!(
                    "(unknown: {})",
                    graceful_drain_core::error::chain(&error)
                )),
            },
            Blocker::MultiplePdbs(_) => match selecting_pdbs(&self.client, pod).await {
                Ok(names) => Blocker::MultiplePdbs(names),
                Err(_) => Blocker::MultiplePdbs(Vec::new()),
            },
            other => other,
        }
    }
}

/// Evicts one pod until the API server accepts it (or says it is gone).
pub(super) async fn evict_pod(ctx: Arc<TaskCtx>, pod: Pod) {
    let key = PodKey::of(&pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut last: Option<Blocker> = None;
    let mut backoff = eviction_backoff();
    for attempt in 0u32.. {
        if attempt > 0 && !ctx.still_there(&key, &uid).await {
            tracing::info!(pod = %key, "gone or replaced while its eviction was refused");
            let _ = ctx.updates.send(Update::Accepted(key));
            return;
        }
        let answer = {
            let Ok(_permit) = ctx.permits.acquire().await else {
                return;
            };
            match ctx.request(&key, &uid) {
                Ok(request) => send(&ctx.client, request).await,
                Err(error) => {
                    tracing::error!(pod = %key, error = %graceful_drain_core::error::chain(&error), "build eviction request");
                    return;
                }
            }
        };
        match answer {
            Answer::Done(outcome) => {
                ctx.metrics.eviction(outcome);
                tracing::info!(pod = %key, outcome = outcome.as_str(), "eviction accepted");
                ctx.events.forget(&key.to_string());
                let _ = ctx.updates.send(Update::Accepted(key));
                return;
            }
            Answer::Blocked {
                outcome,
                blocker,
                retry_after,
                message,
            } => {
                ctx.metrics.eviction(outcome);
                if blocker == Blocker::Deregistering {
                    // Isolated by our webhook: not a fault, so no Warning Event; come back
                    // at the time the webhook named (the pod shows as isolated meanwhile).
                    let delay = retry_after
                        .unwrap_or(RETRY_BASE)
                        .clamp(RETRY_BASE, RETRY_AFTER_CAP);
                    tracing::info!(pod = %key, retry_in = ?delay, "isolated by the webhook; evicting again once it is due");
                    let _ = ctx.updates.send(Update::Blocked(key.clone(), blocker));
                    last = None;
                    tokio::time::sleep(delay).await;
                    continue;
                }
                let same_kind = last
                    .as_ref()
                    .is_some_and(|l| std::mem::discriminant(l) == std::mem::discriminant(&blocker));
                let blocker = match (&last, same_kind) {
                    (Some(previous), true) => previous.clone(),
                    _ => ctx.resolve(&pod, blocker).await,
                };
                if matches!(blocker, Blocker::MultiplePdbs(_))
                    && attempt + 1 >= MULTIPLE_PDB_ATTEMPTS
                {
                    let _ = ctx.updates.send(Update::Unevictable(key, blocker, message));
                    return;
                }
                let delay = retry_delay(backoff.next_pause(), retry_after);
                report_block(&ctx, &key, &blocker, &message, delay).await;
                last = Some(blocker);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

async fn report_block(
    ctx: &TaskCtx,
    key: &PodKey,
    blocker: &Blocker,
    message: &str,
    delay: Duration,
) {
    tracing::warn!(pod = %key, %blocker, message, retry_in = ?delay, "eviction refused");
    let _ = ctx
        .updates
        .send(Update::Blocked(key.clone(), blocker.clone()));
    let text = format!("evict pod {key}: blocked by {blocker}: {message} (retrying)");
    ctx.events
        .post(
            EventType::Warning,
            agent_reason::EVICTION_BLOCKED,
            &key.to_string(),
            text,
        )
        .await;
}
