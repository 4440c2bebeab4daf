//! The drain engine: evicts a node's pods like `kubectl drain` (docs/design.md §4) and waits until
//! every one of them is really gone, retrying refused evictions and saying why they are
//! refused instead of giving up.
//!
//! Data flow: one watch on the node's pods (`spec.nodeName=<node>`) keeps a map of what is
//! on the node. The first complete list is run through [`filters::plan`]; a refusal ends
//! the drain before any eviction. Each planned pod gets a task that POSTs a `policy/v1`
//! Eviction (built here, with the pod's UID as precondition) and retries refusals with a
//! capped, jittered exponential backoff that honours `Retry-After`; at most
//! `concurrency` requests are in flight. A pod counts as gone when the watch no longer has
//! it or has a new pod (new UID) under its name. Pods isolated by our webhook or still
//! terminating count as remaining. Progress is published on a `watch` channel after every
//! change.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use http::{Method, Request, StatusCode};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use rand::Rng;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::filters::{self, DaemonSetLookup, FilterOptions, PodKey, Refused};
use super::node::API_TIMEOUT;
use super::progress::{Blocker, PlannedTier, PodState, Progress, TierStep};
use super::report::{EventType, EvictionOutcome, Metrics, NodeEvents, reason};
use super::tiers::Tiers;
use graceful_drain_core::labels::DRAINING_LABEL;

/// First retry delay of a refused eviction.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest delay between retries of a refused eviction: a PDB usually frees a disruption
/// seconds after a replacement pod turns ready, so waiting longer only slows the drain,
/// while 15 s keeps a blocked pod at four requests a minute.
const RETRY_CAP: Duration = Duration::from_secs(15);
/// Longest `Retry-After` we honour; a larger value would stall the drain past what a PDB
/// status refresh takes (the API server sends 0 or 10).
const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// Evictions refused because several PDBs select the pod are retried this many times (about
/// 30 s with the backoff, time for an operator fixing overlapping budgets), then the drain
/// fails naming them: the API server refuses such pods until the budgets change, and
/// `kubectl drain` gives up on them at once.
const MULTIPLE_PDB_ATTEMPTS: u32 = 5;

/// An accepted eviction shows on the pod within a second (a deletionTimestamp, or our
/// webhook's draining label); if neither appeared after this long the eviction was lost
/// (e.g. another webhook turned it into a dry run), so it is sent again.
const REEVICT_AFTER: Duration = Duration::from_secs(30);
/// Shortest pause between two computations of a drain's progress while its pods change
/// (the drain notices its last pod gone at most this late).
const REFRESH: Duration = Duration::from_millis(50);

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
    Refused { node: String, refused: Refused },
    /// The drain timeout passed.
    #[error("drain node {node}: timed out after {after:?} with {message}")]
    TimedOut {
        node: String,
        after: Duration,
        message: String,
    },
    /// The watch on the node's pods ended (it retries on its own, so this is a bug).
    #[error("drain node {node}: the watch on its pods ended")]
    WatchEnded { node: String },
    /// A pod cannot be evicted until its budgets change.
    #[error(
        "drain node {node}: evict pod {pod}: {blocker} select it, which the eviction API refuses: {message}"
    )]
    Unevictable {
        node: String,
        pod: PodKey,
        blocker: Blocker,
        message: String,
    },
    /// The drain's LifecycleEvent carries an override that cannot be used.
    #[error("drain node {node}: lifecycleevent {event}: annotation {annotation}")]
    Override {
        node: String,
        event: String,
        annotation: &'static str,
        #[source]
        error: super::tiers::Error,
    },
    /// Listing the pods `--pod-selector` selects failed.
    #[error("drain node {node}: list pods matching {selector:?}: {message}")]
    Select {
        node: String,
        selector: String,
        message: String,
    },
}

/// What an eviction (or delete) request got back, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The pod is (being) removed or already gone: stop sending requests for it.
    Done(EvictionOutcome),
    /// Refused; retry after the delay, telling people what blocks it.
    Blocked {
        outcome: EvictionOutcome,
        blocker: Blocker,
        retry_after: Option<Duration>,
        message: String,
    },
}

/// The `policy/v1` Eviction request for one pod: POST
/// `/api/v1/namespaces/{ns}/pods/{name}/eviction` with a complete Eviction body (apiVersion,
/// kind, metadata, `deleteOptions` with the UID precondition, grace period and dry run).
pub fn eviction_request(
    key: &PodKey,
    uid: &str,
    grace_period: Option<i64>,
    dry_run: bool,
) -> Result<Request<Vec<u8>>, http::Error> {
    let mut delete_options = json!({ "preconditions": { "uid": uid } });
    if let Some(grace) = grace_period {
        delete_options["gracePeriodSeconds"] = json!(grace);
    }
    if dry_run {
        delete_options["dryRun"] = json!(["All"]);
    }
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": { "name": key.name, "namespace": key.namespace },
        "deleteOptions": delete_options,
    });
    Request::builder()
        .method(Method::POST)
        .uri(format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            key.namespace, key.name
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
}

/// The DELETE request of `--disable-eviction`, with the same UID precondition.
pub fn delete_request(
    key: &PodKey,
    uid: &str,
    grace_period: Option<i64>,
) -> Result<Request<Vec<u8>>, http::Error> {
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": { "uid": uid },
    });
    if let Some(grace) = grace_period {
        body["gracePeriodSeconds"] = json!(grace);
    }
    Request::builder()
        .method(Method::DELETE)
        .uri(format!(
            "/api/v1/namespaces/{}/pods/{}",
            key.namespace, key.name
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
}

/// The name of the webhook in an API server denial message
/// (`admission webhook "name" denied the request: ...`).
fn webhook_name(message: &str) -> Option<&str> {
    let rest = message.split("admission webhook \"").nth(1)?;
    rest.split('"').next()
}

/// Classifies an answer to an eviction or delete request (docs/design.md §4: 201 evicted,
/// 404 gone, 409 precondition failed, 429 PDB, 500 several PDBs).
pub fn classify_answer(status: StatusCode, retry_after: Option<Duration>, body: &[u8]) -> Answer {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let blocked = |outcome, blocker| Answer::Blocked {
        outcome,
        blocker,
        retry_after,
        message: message.clone(),
    };
    match status {
        StatusCode::CREATED => Answer::Done(EvictionOutcome::Evicted),
        StatusCode::OK | StatusCode::ACCEPTED => Answer::Done(EvictionOutcome::Deleted),
        StatusCode::NOT_FOUND => Answer::Done(EvictionOutcome::Gone),
        StatusCode::CONFLICT => Answer::Done(EvictionOutcome::Conflict),
        StatusCode::TOO_MANY_REQUESTS if has_cause(body, DEREGISTERING_CAUSE) => {
            blocked(EvictionOutcome::Deregistering, Blocker::Deregistering)
        }
        _ if webhook_name(&message).is_some() => {
            let name = webhook_name(&message).unwrap_or_default().to_string();
            blocked(EvictionOutcome::DeniedWebhook, Blocker::Webhook(name))
        }
        StatusCode::TOO_MANY_REQUESTS if is_disruption_budget(body, &message) => {
            blocked(EvictionOutcome::BlockedPdb, Blocker::Pdb(String::new()))
        }
        StatusCode::TOO_MANY_REQUESTS => blocked(EvictionOutcome::Throttled, Blocker::Throttled),
        StatusCode::INTERNAL_SERVER_ERROR if message.contains("more than one") => blocked(
            EvictionOutcome::MultiplePdbs,
            Blocker::MultiplePdbs(Vec::new()),
        ),
        _ => blocked(
            EvictionOutcome::Error,
            Blocker::Other(format!("HTTP {}: {message}", status.as_u16())),
        ),
    }
}

/// Whether a 429 comes from a PodDisruptionBudget: the eviction REST code answers with a
/// `DisruptionBudget` cause (upstream `pkg/registry/core/pod/storage/eviction.go`,
/// `createTooManyRequestsError`), while API Priority and Fairness answers a bare
/// TooManyRequests ("Too many requests, please try again later.").
fn is_disruption_budget(body: &[u8], message: &str) -> bool {
    has_cause(body, "DisruptionBudget")
        || message.to_ascii_lowercase().contains("disruption budget")
}

/// Cause reason of our webhook's 429 while an isolated pod leaves its load balancers
/// (the webhook crate's `review::DEREGISTERING_CAUSE`; the API server passes a webhook's
/// status details through to the caller).
pub const DEREGISTERING_CAUSE: &str = "graceful-drain.io/Deregistering";

/// Whether a Status body lists a cause with `reason`.
fn has_cause(body: &[u8], reason: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.pointer("/details/causes").cloned())
        .as_ref()
        .and_then(|c| c.as_array())
        .is_some_and(|c| c.iter().any(|c| c["reason"] == reason))
}

/// Delay before retry number `attempt` (0-based): exponential from `RETRY_BASE`, capped
/// at `RETRY_CAP`, with `jitter` in [0, 1) spreading it over its upper half so pods
/// blocked by the same PDB do not retry in lockstep; never shorter than `Retry-After`.
pub fn retry_delay(attempt: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
    let exp = RETRY_BASE.saturating_mul(2u32.saturating_pow(attempt.min(16)));
    let capped = exp.min(RETRY_CAP);
    let jittered = capped.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0));
    jittered.max(retry_after.unwrap_or_default().min(RETRY_AFTER_CAP))
}

fn parse_retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Sends one eviction (or delete) request and classifies the answer. Transport failures
/// and timeouts come back as [`Answer::Blocked`] so they are retried like refusals.
pub async fn send(client: &kube::Client, request: Request<Vec<u8>>) -> Answer {
    let transport = |message: String| Answer::Blocked {
        outcome: EvictionOutcome::Error,
        blocker: Blocker::Other(message.clone()),
        retry_after: None,
        message,
    };
    let exchange = async {
        let response = client.send(request.map(kube::client::Body::from)).await?;
        let status = response.status();
        let retry_after = parse_retry_after(response.headers());
        let body = response.into_body().collect_bytes().await?;
        Ok::<_, kube::Error>(classify_answer(status, retry_after, &body))
    };
    match tokio::time::timeout(API_TIMEOUT, exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => transport(error.to_string()),
        Err(_) => transport(format!("no answer within {API_TIMEOUT:?}")),
    }
}

/// Why the PDBs selecting a pod could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum PdbLookupError {
    /// The API server did not answer in time.
    #[error("list PDBs in namespace {namespace}: no answer within {API_TIMEOUT:?}")]
    TimedOut { namespace: String },
    /// The list failed.
    #[error("list PDBs in namespace {namespace}")]
    Api {
        namespace: String,
        #[source]
        source: kube::Error,
    },
}

/// `namespace/name` of every PDB in the pod's namespace whose selector matches it. An
/// empty selector selects nothing, as the eviction API reads it
/// (pkg/registry/core/pod/storage/eviction.go `getPodDisruptionBudgets`).
pub async fn selecting_pdbs(
    client: &kube::Client,
    pod: &Pod,
) -> Result<Vec<String>, PdbLookupError> {
    let key = PodKey::of(pod);
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &key.namespace);
    let namespace = key.namespace.clone();
    let list = tokio::time::timeout(API_TIMEOUT, api.list(&ListParams::default()))
        .await
        .map_err(|_| PdbLookupError::TimedOut {
            namespace: namespace.clone(),
        })?
        .map_err(|source| PdbLookupError::Api { namespace, source })?;
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    Ok(list
        .items
        .iter()
        .filter(|pdb| {
            let selector = pdb.spec.as_ref().and_then(|s| s.selector.clone());
            selector
                .filter(|s| {
                    s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                        || s.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
                })
                .and_then(|s| Selector::try_from(s).ok())
                .is_some_and(|s| s.matches(&labels))
        })
        .map(|pdb| {
            let name = pdb.metadata.name.as_deref().unwrap_or_default();
            format!("{}/{name}", key.namespace)
        })
        .collect())
}

/// What an eviction task reports to the engine.
#[derive(Debug)]
enum Update {
    Blocked(PodKey, Blocker),
    Accepted(PodKey),
    /// The pod cannot be evicted as things stand: the drain fails.
    Unevictable(PodKey, Blocker, String),
}

/// Everything an eviction task needs.
struct TaskCtx {
    client: kube::Client,
    config: Arc<DrainConfig>,
    metrics: Metrics,
    events: NodeEvents,
    permits: Semaphore,
    updates: mpsc::UnboundedSender<Update>,
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
async fn evict_pod(ctx: Arc<TaskCtx>, pod: Pod) {
    let key = PodKey::of(&pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut last: Option<Blocker> = None;
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
                let delay = retry_delay(attempt, retry_after, rand::rng().random());
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
            reason::EVICTION_BLOCKED,
            &key.to_string(),
            text,
        )
        .await;
}

/// A pod the drain waits for.
#[derive(Clone, Debug)]
struct Tracked {
    uid: String,
    blocked: Option<Blocker>,
    /// When the API server accepted the eviction (cleared when it is sent again).
    accepted_at: Option<tokio::time::Instant>,
}

/// The engine's view of the node.
#[derive(Default)]
struct State {
    /// Pods on the node now, from the watch.
    pods: BTreeMap<PodKey, Pod>,
    /// Planned pods not yet gone.
    tracked: BTreeMap<PodKey, Tracked>,
    /// Pods classified so far (planned or skipped), by UID, so new pods are noticed.
    seen: std::collections::HashSet<String>,
    /// The pods of a re-list in progress (the watch restarted): swapped in at its end, so
    /// a half-done re-list never makes tracked pods look gone.
    relist: Option<BTreeMap<PodKey, Pod>>,
    planned: usize,
    skipped: usize,
    done: usize,
    /// Names of the configured tiers, by position (see [`Tiers::names`]).
    tier_names: Vec<String>,
    /// Later eviction tiers (by position among the configured ones), not started yet, in
    /// order.
    waiting: VecDeque<(usize, Vec<Pod>)>,
    /// The tier being evicted, its 1-based position among the drain's tiers and their
    /// number.
    tier: Option<(usize, usize, usize)>,
    /// The tiers as planned from the first list, before any eviction.
    plan: Vec<PlannedTier>,
}

impl State {
    /// Starts the next tier: returns its pods, `None` when no tier is left.
    fn next_tier(&mut self) -> Option<(usize, Vec<Pod>)> {
        let (tier, pods) = self.waiting.pop_front()?;
        let index = self.tier.map_or(1, |(_, i, _)| i + 1);
        let count = self.tier.map_or(self.waiting.len() + 1, |(_, _, c)| c);
        self.tier = Some((tier, index, count.max(index)));
        Some((tier, pods))
    }

    /// Keeps a newcomer of a later tier than the one being evicted for its tier; returns
    /// it when its tier has started (or passed) and it is to be evicted now.
    fn defer(&mut self, tier: usize, pod: Pod) -> Option<Pod> {
        if self.tier.is_none_or(|(current, _, _)| tier <= current) {
            return Some(pod);
        }
        match self.waiting.iter_mut().find(|(t, _)| *t == tier) {
            Some((_, pods)) => pods.push(pod),
            None => {
                let at = self.waiting.partition_point(|(t, _)| *t < tier);
                self.waiting.insert(at, (tier, vec![pod]));
                if let Some((_, _, count)) = self.tier.as_mut() {
                    *count += 1;
                }
            }
        }
        None
    }

    /// Applies one watch event; returns a pod never seen before (a newcomer to classify).
    fn apply(&mut self, event: watcher::Event<Pod>) -> Option<Pod> {
        match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                let new = pod
                    .metadata
                    .uid
                    .as_ref()
                    .is_some_and(|u| !self.seen.contains(u));
                let target = self.relist.as_mut().unwrap_or(&mut self.pods);
                target.insert(PodKey::of(&pod), pod.clone());
                new.then_some(pod)
            }
            watcher::Event::Delete(pod) => {
                let key = PodKey::of(&pod);
                for map in [Some(&mut self.pods), self.relist.as_mut()]
                    .into_iter()
                    .flatten()
                {
                    if map.get(&key).map(|p| &p.metadata.uid) == Some(&pod.metadata.uid) {
                        map.remove(&key);
                    }
                }
                None
            }
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                None
            }
            watcher::Event::InitDone => {
                if let Some(pods) = self.relist.take() {
                    self.pods = pods;
                }
                None
            }
        }
    }

    fn is_gone(
        &self,
        key: &PodKey,
        t: &Tracked,
        opts: &FilterOptions,
        now: jiff::Timestamp,
    ) -> bool {
        match self.pods.get(key) {
            None => true,
            Some(pod) if pod.metadata.uid.as_deref() != Some(t.uid.as_str()) => true,
            Some(pod) => {
                matches!(
                    filters::classify(pod, opts, now, |_| DaemonSetLookup::Exists),
                    filters::Verdict::Skip(filters::Skip::LongTerminating)
                )
            }
        }
    }

    /// Drops tracked pods that are gone and returns the progress.
    fn progress(&mut self, opts: &FilterOptions) -> Progress {
        let now = jiff::Timestamp::now();
        let gone: Vec<PodKey> = self
            .tracked
            .iter()
            .filter(|(k, t)| self.is_gone(k, t, opts, now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.tracked.remove(&key);
            self.done += 1;
        }
        let remaining = self
            .tracked
            .iter()
            .map(|(key, t)| (key.clone(), pod_state(self.pods.get(key), t)))
            .collect();
        Progress {
            planned: self.planned,
            skipped: self.skipped,
            done: self.done,
            remaining,
            tier: self.tier.map(|(tier, index, count)| TierStep {
                index,
                count,
                name: self.tier_name(tier),
            }),
            plan: self.plan.clone(),
            waiting: self.waiting.iter().map(|(_, pods)| pods.len()).sum(),
            hook: None,
        }
    }
}

impl State {
    fn tier_name(&self, tier: usize) -> String {
        self.tier_names.get(tier).cloned().unwrap_or_default()
    }

    /// Records the plan: the waiting tiers, numbered as the drain will evict them.
    fn record_plan(&mut self) {
        self.plan = self
            .waiting
            .iter()
            .map(|(tier, pods)| PlannedTier {
                name: self.tier_name(*tier),
                pods: pods.iter().map(PodKey::of).collect(),
            })
            .collect();
    }
}

fn pod_state(pod: Option<&Pod>, tracked: &Tracked) -> PodState {
    let Some(pod) = pod else {
        return PodState::Evicting;
    };
    if pod.metadata.deletion_timestamp.is_some() {
        PodState::Terminating
    } else if pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(DRAINING_LABEL))
    {
        PodState::Isolated
    } else if let Some(blocker) = &tracked.blocked {
        PodState::Blocked(blocker.clone())
    } else {
        PodState::Evicting
    }
}

/// Looks up the DaemonSets controlling the given pods, once each.
async fn daemonset_lookups<'a>(
    client: &kube::Client,
    pods: impl Iterator<Item = &'a Pod>,
) -> HashMap<(String, String), DaemonSetLookup> {
    let mut out = HashMap::new();
    for pod in pods {
        let Some(owner) = filters::controller_of(pod).filter(|o| o.kind == "DaemonSet") else {
            continue;
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let entry = (ns.clone(), owner.name.clone());
        if out.contains_key(&entry) {
            continue;
        }
        let api: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
        let lookup = match tokio::time::timeout(API_TIMEOUT, api.get_opt(&owner.name)).await {
            Ok(Ok(Some(_))) => DaemonSetLookup::Exists,
            Ok(Ok(None)) => DaemonSetLookup::NotFound,
            Ok(Err(error)) => DaemonSetLookup::Failed(error.to_string()),
            Err(_) => DaemonSetLookup::Failed("get DaemonSet: timed out".into()),
        };
        out.insert(entry, lookup);
    }
    out
}

/// One drain of one node.
pub struct Engine {
    pub client: kube::Client,
    pub node: String,
    pub config: Arc<DrainConfig>,
    pub metrics: Metrics,
    pub events: NodeEvents,
    /// When this drain cordoned the node: pods created later that tolerate the cordon
    /// would be scheduled straight back, so they are not evicted.
    pub cordoned_at: jiff::Timestamp,
}

/// The taint a cordoned node carries (upstream `node.kubernetes.io/unschedulable`).
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Whether `pod` tolerates the cordon's NoSchedule taint (a toleration for its key, or an
/// `Exists` toleration without a key), so the scheduler may place it on a cordoned node.
pub fn tolerates_cordon(pod: &Pod) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations.into_iter().flatten().any(|t| {
        let exists = t.operator.as_deref() == Some("Exists");
        let key = match t.key.as_deref() {
            None | Some("") => exists,
            Some(key) => key == UNSCHEDULABLE_TAINT,
        };
        let value = exists || t.value.as_deref().unwrap_or_default().is_empty();
        let effect = matches!(t.effect.as_deref(), None | Some("" | "NoSchedule"));
        key && value && effect
    })
}

/// Whether the (optional) `--pod-selector` set of UIDs holds `pod`.
fn is_selected(selected: Option<&HashSet<String>>, pod: &Pod) -> bool {
    selected.is_none_or(|uids| pod.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)))
}

type PodStream = futures::stream::BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>;

impl Engine {
    /// Every pod on the node, whatever its labels: `--pod-selector` is applied to a LIST
    /// (see [`Engine::selected`]), never to this watch, because our webhook's relabelling
    /// takes an isolated pod out of a label-selected watch, which would make a pod the
    /// drain still waits for look gone.
    fn watch(&self) -> PodStream {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        watcher(api, config).default_backoff().boxed()
    }

    /// UIDs of the node's pods that `--pod-selector` selects (optionally only the pod
    /// `name` in `namespace`), from a LIST with both selectors, as kubectl selects them;
    /// `None` without a selector.
    async fn selected(&self, pod: Option<&PodKey>) -> Result<Option<HashSet<String>>, Error> {
        self.matching(self.config.pod_selector.as_deref(), pod)
            .await
    }

    /// UIDs of the node's pods (or of pod `pod` only) that `selector` selects, from a LIST
    /// with both selectors; `None` without a selector.
    async fn matching(
        &self,
        selector: Option<&str>,
        pod: Option<&PodKey>,
    ) -> Result<Option<HashSet<String>>, Error> {
        let Some(selector) = selector else {
            return Ok(None);
        };
        let mut fields = format!("spec.nodeName={}", self.node);
        let api: Api<Pod> = match pod {
            Some(key) => {
                fields.push_str(&format!(",metadata.name={}", key.name));
                Api::namespaced(self.client.clone(), &key.namespace)
            }
            None => Api::all(self.client.clone()),
        };
        let params = ListParams::default().fields(&fields).labels(selector);
        let failed = |message: String| Error::Select {
            node: self.node.clone(),
            selector: selector.to_string(),
            message,
        };
        let list = tokio::time::timeout(API_TIMEOUT, api.list_metadata(&params))
            .await
            .map_err(|_| failed(format!("no answer within {API_TIMEOUT:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        Ok(Some(
            list.items
                .into_iter()
                .filter_map(|p| p.metadata.uid)
                .collect(),
        ))
    }

    /// Reads the watch until its first complete list.
    async fn initial_list(&self, stream: &mut PodStream) -> Result<BTreeMap<PodKey, Pod>, Error> {
        let mut pods = BTreeMap::new();
        loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Init)) => pods.clear(),
                Ok(Some(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod))) => {
                    pods.insert(PodKey::of(&pod), pod);
                }
                Ok(Some(watcher::Event::Delete(pod))) => {
                    pods.remove(&PodKey::of(&pod));
                }
                Ok(Some(watcher::Event::InitDone)) => return Ok(pods),
                Ok(None) => {
                    return Err(Error::WatchEnded {
                        node: self.node.clone(),
                    });
                }
                Err(error) => self.watch_failed(&error).await,
            }
        }
    }

    /// A failed watch retries on its own; say so in the log and (rate-limited) on the Node,
    /// so a drain stuck on, say, missing permissions is not silent.
    async fn watch_failed(&self, error: &watcher::Error) {
        tracing::warn!(node = %self.node, error = %graceful_drain_core::error::chain(error), "watch pods");
        let message = format!("watch pods on node {} (retrying): {error}", self.node);
        let reason = reason::POD_WATCH_FAILED;
        self.events
            .post(EventType::Warning, reason, "watch", message)
            .await;
    }

    /// Runs the filters on the first list (DaemonSets looked up once each).
    async fn plan(&self, initial: &BTreeMap<PodKey, Pod>) -> Result<filters::Plan, Error> {
        let lookups = daemonset_lookups(&self.client, initial.values()).await;
        let now = jiff::Timestamp::now();
        let plan = filters::plan(initial.values(), &self.config.filters, now, |ns, owner| {
            lookups
                .get(&(ns.to_string(), owner.name.clone()))
                .cloned()
                .unwrap_or(DaemonSetLookup::Exists)
        })
        .map_err(|refused| Error::Refused {
            node: self.node.clone(),
            refused,
        })?;
        for (key, warning) in &plan.warnings {
            tracing::warn!(pod = %key, %warning, "evicting with a warning");
        }
        Ok(plan)
    }

    fn task_ctx(&self) -> (Arc<TaskCtx>, mpsc::UnboundedReceiver<Update>) {
        let (tx, updates) = mpsc::unbounded_channel();
        let ctx = Arc::new(TaskCtx {
            client: self.client.clone(),
            config: self.config.clone(),
            metrics: self.metrics.clone(),
            events: self.events.clone(),
            permits: Semaphore::new(self.config.concurrency.max(1)),
            updates: tx,
        });
        (ctx, updates)
    }

    /// Runs the drain until nothing remains; publishes progress on `progress`. Dropping the
    /// future stops it (and every eviction task).
    pub async fn run(&self, progress: &watch::Sender<Progress>) -> Result<Progress, Error> {
        let started = tokio::time::Instant::now();
        let mut stream = self.watch();
        let initial = self.initial_list(&mut stream).await?;
        let selected = self.selected(None).await?;
        let candidates: BTreeMap<PodKey, Pod> = initial
            .iter()
            .filter(|(_, pod)| is_selected(selected.as_ref(), pod))
            .map(|(key, pod)| (key.clone(), pod.clone()))
            .collect();
        let plan = self.plan(&candidates).await?;
        let (ctx, mut updates) = self.task_ctx();
        let mut state = State {
            pods: initial,
            skipped: plan.skipped.len(),
            ..State::default()
        };
        state
            .seen
            .extend(state.pods.values().filter_map(|p| p.metadata.uid.clone()));
        state.tier_names = self.config.tiers.names();
        state.waiting = self.config.tiers.split(plan.evict).into();
        state.record_plan();
        self.post_plan(&state.plan).await;
        let mut tasks = JoinSet::new();
        self.start_tier(&mut state, &mut tasks, &ctx).await;
        // Pods our webhook already isolated (a restarted agent, another drain): evicted
        // like the others; the webhook refuses with 429 until each is due, then lets the
        // eviction through (it deletes nothing on its own).
        for pod in plan.awaited {
            track(&mut state, &mut tasks, &ctx, pod);
        }
        let deadline = self.config.timeout.map(|t| started + t);
        let mut recheck = tokio::time::interval(REEVICT_AFTER / 3);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Progress (which pods are gone, what is left) is worked out again only after
        // something changed, and at most every REFRESH: a 500-pod drain brings thousands
        // of watch events, and recomputing it for every one cost O(pods) each.
        let mut changed = true;
        let mut refreshed_at: Option<tokio::time::Instant> = None;
        loop {
            let due = refreshed_at.is_none_or(|at| at.elapsed() >= REFRESH);
            if changed && due {
                changed = false;
                refreshed_at = Some(tokio::time::Instant::now());
                let current = state.progress(&self.config.filters);
                self.metrics.set_remaining(current.left());
                progress.send_if_modified(|p| replace_if_changed(p, &current));
                if current.remaining.is_empty() {
                    if self.start_tier(&mut state, &mut tasks, &ctx).await {
                        changed = true;
                        refreshed_at = None;
                        continue;
                    }
                    return Ok(current);
                }
            }
            let refresh_at = changed
                .then(|| refreshed_at.map(|at| at + REFRESH))
                .flatten();
            tokio::select! {
                event = stream.try_next() => {
                    changed = true;
                    match event {
                        Ok(Some(event)) => self.apply(&mut state, &mut tasks, &ctx, event).await,
                        Ok(None) => return Err(Error::WatchEnded { node: self.node.clone() }),
                        Err(error) => self.watch_failed(&error).await,
                    }
                }
                Some(update) = updates.recv() => {
                    changed = true;
                    if let Some(error) = self.apply_update(&mut state, update) {
                        return Err(error);
                    }
                }
                _ = recheck.tick() => {
                    changed = true;
                    evict_lost(&mut state, &mut tasks, &ctx);
                }
                Some(joined) = tasks.join_next() => {
                    if let Err(error) = joined {
                        tracing::error!(error = %graceful_drain_core::error::chain(&error), "eviction task failed");
                    }
                }
                () = sleep_until(refresh_at) => {}
                () = sleep_until(deadline) => {
                    return Err(Error::TimedOut {
                        node: self.node.clone(),
                        after: self.config.timeout.unwrap_or_default(),
                        message: state.progress(&self.config.filters).message(),
                    });
                }
            }
        }
    }

    /// Starts evicting the next tier (the first at the start); false when none is left.
    async fn start_tier(
        &self,
        state: &mut State,
        tasks: &mut JoinSet<()>,
        ctx: &Arc<TaskCtx>,
    ) -> bool {
        let Some((tier, pods)) = state.next_tier() else {
            return false;
        };
        if let Some((_, index, count)) = state.tier.filter(|(_, _, count)| *count > 1) {
            let n = pods.len();
            let name = state.tier_name(tier);
            let message = format!(
                "eviction tier {index}/{count} ({name}): {n} {}",
                super::progress::pods(n)
            );
            tracing::info!(node = %self.node, tier = %name, index, count, pods = n, "eviction tier starts");
            self.events
                .post(EventType::Normal, reason::EVICTION_TIER, "", message)
                .await;
        }
        for pod in pods {
            track(state, tasks, ctx, pod);
        }
        true
    }

    /// Posts the plan on the Node before the first eviction (see [`PlannedTier`]); a drain
    /// with nothing to evict posts none.
    async fn post_plan(&self, plan: &[PlannedTier]) {
        if plan.is_empty() {
            return;
        }
        let message = super::progress::plan_message(plan);
        tracing::info!(node = %self.node, %message, "drain plan");
        self.events
            .post(EventType::Normal, reason::DRAIN_PLAN, "", message)
            .await;
    }

    /// Applies one watch event; pods that appear after the first list and pass the
    /// filters are evicted too (a pod scheduled just before the cordon).
    async fn apply(
        &self,
        state: &mut State,
        tasks: &mut JoinSet<()>,
        ctx: &Arc<TaskCtx>,
        event: watcher::Event<Pod>,
    ) {
        if let Some(pod) = state.apply(event) {
            self.consider_newcomer(state, tasks, ctx, pod).await;
        }
    }

    async fn consider_newcomer(
        &self,
        state: &mut State,
        tasks: &mut JoinSet<()>,
        ctx: &Arc<TaskCtx>,
        pod: Pod,
    ) {
        if let Some(uid) = &pod.metadata.uid {
            state.seen.insert(uid.clone());
        }
        let key = PodKey::of(&pod);
        let lookups = daemonset_lookups(&self.client, std::iter::once(&pod)).await;
        let lookup = |owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
            lookups
                .get(&(key.namespace.clone(), owner.name.clone()))
                .cloned()
                .unwrap_or(DaemonSetLookup::Exists)
        };
        match self.selected(Some(&key)).await {
            Ok(Some(uids)) if !is_selected(Some(&uids), &pod) => return,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(pod = %key, error = %graceful_drain_core::error::chain(&error), "new pod left alone: cannot tell whether --pod-selector selects it");
                return;
            }
        }
        match filters::classify(&pod, &self.config.filters, jiff::Timestamp::now(), lookup) {
            filters::Verdict::Evict(_) if self.would_return(&pod) => {
                state.skipped += 1;
                let message = format!(
                    "pod {key} was created after the node was cordoned and tolerates \
                     {UNSCHEDULABLE_TAINT}; it is left on the node, since evicting it would \
                     only bring it back"
                );
                tracing::info!(pod = %key, "new pod tolerates the cordon; not evicted");
                let reason = reason::EVICTION_SKIPPED;
                self.events
                    .post(EventType::Normal, reason, &key.to_string(), message)
                    .await;
            }
            filters::Verdict::Evict(_) => {
                if let Some(pod) = state.defer(self.config.tiers.tier_of(&pod), pod) {
                    track(state, tasks, ctx, pod);
                }
            }
            filters::Verdict::Await => track(state, tasks, ctx, pod),
            filters::Verdict::Skip(_) => state.skipped += 1,
            filters::Verdict::Refuse(refusal) => {
                let message = format!(
                    "pod {key} appeared during the drain and is left on the node: {refusal}"
                );
                tracing::warn!(pod = %key, %refusal, "new pod not evicted");
                self.events
                    .post(
                        EventType::Warning,
                        reason::EVICTION_BLOCKED,
                        &key.to_string(),
                        message,
                    )
                    .await;
            }
        }
    }
}

fn track(state: &mut State, tasks: &mut JoinSet<()>, ctx: &Arc<TaskCtx>, pod: Pod) {
    let key = PodKey::of(&pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    state.seen.insert(uid.clone());
    state.planned += 1;
    let span = tracing::info_span!("evict", pod = %key);
    let tracked = Tracked {
        uid,
        blocked: None,
        accepted_at: None,
    };
    state.tracked.insert(key, tracked);
    tasks.spawn(evict_pod(ctx.clone(), pod).instrument(span));
}

/// Sends the eviction again for pods whose accepted eviction left no trace after
/// [`REEVICT_AFTER`]: still there, same UID, neither terminating nor isolated.
fn evict_lost(state: &mut State, tasks: &mut JoinSet<()>, ctx: &Arc<TaskCtx>) {
    let now = tokio::time::Instant::now();
    let lost: Vec<Pod> = state
        .tracked
        .iter_mut()
        .filter(|(_, t)| {
            t.accepted_at
                .is_some_and(|at| now.duration_since(at) >= REEVICT_AFTER)
        })
        .filter_map(|(key, t)| {
            let pod = state.pods.get(key)?;
            if pod_state(Some(pod), t) != PodState::Evicting {
                return None;
            }
            t.accepted_at = None;
            Some(pod.clone())
        })
        .collect();
    for pod in lost {
        let key = PodKey::of(&pod);
        tracing::warn!(pod = %key, "eviction was accepted but the pod is still running; evicting again");
        let span = tracing::info_span!("evict", pod = %key);
        tasks.spawn(evict_pod(ctx.clone(), pod).instrument(span));
    }
}

impl Engine {
    /// A newcomer that would be scheduled straight back after its eviction: created after
    /// the cordon and tolerating it (evicting it would loop).
    fn would_return(&self, pod: &Pod) -> bool {
        let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created.is_some_and(|c| c >= self.cordoned_at) && tolerates_cordon(pod)
    }

    /// Applies an eviction task's report; an unevictable pod fails the drain.
    fn apply_update(&self, state: &mut State, update: Update) -> Option<Error> {
        match update {
            Update::Blocked(key, blocker) => {
                if let Some(t) = state.tracked.get_mut(&key) {
                    t.blocked = Some(blocker);
                }
            }
            Update::Accepted(key) => {
                if let Some(t) = state.tracked.get_mut(&key) {
                    t.blocked = None;
                    t.accepted_at = Some(tokio::time::Instant::now());
                }
            }
            Update::Unevictable(pod, blocker, message) => {
                return Some(Error::Unevictable {
                    node: self.node.clone(),
                    pod,
                    blocker,
                    message,
                });
            }
        }
        None
    }
}

fn replace_if_changed(slot: &mut Progress, new: &Progress) -> bool {
    if slot == new {
        false
    } else {
        *slot = new.clone();
        true
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Response;
    use kube::client::Body;
    use serde_json::Value;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn mock() -> (kube::Client, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (kube::Client::new(service, "default"), handle)
    }

    fn key() -> PodKey {
        PodKey {
            namespace: "shop".into(),
            name: "web-1".into(),
        }
    }

    async fn body_json(request: Request<Body>) -> (http::request::Parts, Value) {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        (parts, serde_json::from_slice(&bytes).unwrap())
    }

    fn status_body(code: u16, message: &str) -> Body {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": message, "code": code});
        Body::from(status.to_string().into_bytes())
    }

    #[test]
    fn tiers_start_in_order_and_newcomers_wait_for_theirs() {
        use graceful_drain_testing::fixtures::{self, PodFixture};
        let pod = |name: &str| fixtures::pod(name).with_uid(name);
        let names = |pods: &[Pod]| -> Vec<String> {
            pods.iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect()
        };
        // Tier positions of the plan workloads, system-critical, last.
        let (workloads, critical, last) = (0, 1, 2);
        let mut state = State {
            tier_names: vec!["workloads".into(), "system-critical".into(), "last".into()],
            waiting: VecDeque::from([(workloads, vec![pod("web")]), (last, vec![pod("ingress")])]),
            ..State::default()
        };
        state.record_plan();
        let (tier, pods) = state.next_tier().unwrap();
        assert_eq!((tier, names(&pods)), (workloads, vec!["web".into()]));
        assert_eq!(state.tier, Some((workloads, 1, 2)));
        // A critical pod arriving now waits, in a tier of its own between the two.
        assert!(state.defer(critical, pod("dns")).is_none());
        assert_eq!(state.tier, Some((workloads, 1, 3)));
        // A newcomer of the tier being evicted goes now.
        assert!(state.defer(workloads, pod("web-2")).is_some());
        let progress = state.progress(&FilterOptions::default());
        assert_eq!(progress.waiting, 2);
        let planned: Vec<(&str, usize)> = progress
            .plan
            .iter()
            .map(|t| (t.name.as_str(), t.pods.len()))
            .collect();
        assert_eq!(
            planned,
            [("workloads", 1), ("last", 1)],
            "the plan as first listed"
        );
        let (tier, pods) = state.next_tier().unwrap();
        assert_eq!((tier, names(&pods)), (critical, vec!["dns".into()]));
        assert_eq!(state.tier, Some((critical, 2, 3)));
        assert_eq!(
            state
                .progress(&FilterOptions::default())
                .tier
                .map(|t| t.name),
            Some("system-critical".to_string())
        );
        // A workload pod arriving after its tier is evicted at once.
        assert!(state.defer(workloads, pod("web-3")).is_some());
        let (tier, _) = state.next_tier().unwrap();
        assert_eq!(state.tier, Some((last, 3, 3)));
        assert_eq!(tier, last);
        assert!(state.next_tier().is_none());
    }

    #[tokio::test]
    async fn eviction_is_a_complete_policy_v1_body_with_uid_precondition() {
        let (client, mut handle) = mock();
        let request = eviction_request(&key(), "uid-123", Some(30), true).unwrap();
        let call = tokio::spawn(async move { send(&client, request).await });
        let (request, respond) = handle.next_request().await.unwrap();
        let (parts, body) = body_json(request).await;
        assert_eq!(parts.method, Method::POST);
        assert_eq!(
            parts.uri.path(),
            "/api/v1/namespaces/shop/pods/web-1/eviction"
        );
        assert_eq!(
            body,
            json!({
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "web-1", "namespace": "shop"},
                "deleteOptions": {
                    "gracePeriodSeconds": 30,
                    "preconditions": {"uid": "uid-123"},
                    "dryRun": ["All"],
                },
            })
        );
        let response = Response::builder()
            .status(429)
            .header("Retry-After", "10")
            .body(status_body(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ))
            .unwrap();
        respond.send_response(response);
        let answer = call.await.unwrap();
        assert_eq!(
            answer,
            Answer::Blocked {
                outcome: EvictionOutcome::BlockedPdb,
                blocker: Blocker::Pdb(String::new()),
                retry_after: Some(Duration::from_secs(10)),
                message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            }
        );
    }

    #[test]
    fn eviction_without_grace_period_or_dry_run_omits_them() {
        let request = eviction_request(&key(), "u", None, false).unwrap();
        let body: Value = serde_json::from_slice(request.body()).unwrap();
        assert_eq!(
            body["deleteOptions"],
            json!({"preconditions": {"uid": "u"}})
        );
    }

    #[tokio::test]
    async fn disable_eviction_deletes_with_the_uid_precondition() {
        let (client, mut handle) = mock();
        let request = delete_request(&key(), "uid-9", Some(0)).unwrap();
        let call = tokio::spawn(async move { send(&client, request).await });
        let (request, respond) = handle.next_request().await.unwrap();
        let (parts, body) = body_json(request).await;
        assert_eq!(parts.method, Method::DELETE);
        assert_eq!(parts.uri.path(), "/api/v1/namespaces/shop/pods/web-1");
        assert_eq!(body["preconditions"], json!({"uid": "uid-9"}));
        assert_eq!(body["gracePeriodSeconds"], 0);
        assert_eq!(body["kind"], "DeleteOptions");
        respond.send_response(
            Response::builder()
                .status(200)
                .body(Body::from(b"{}".to_vec()))
                .unwrap(),
        );
        assert_eq!(call.await.unwrap(), Answer::Done(EvictionOutcome::Deleted));
    }

    #[test]
    fn answers_are_classified_like_the_eviction_rest_code() {
        let answer = |code: u16, message: &str| {
            let body = json!({"kind": "Status", "message": message}).to_string();
            classify_answer(StatusCode::from_u16(code).unwrap(), None, body.as_bytes())
        };
        assert_eq!(answer(201, ""), Answer::Done(EvictionOutcome::Evicted));
        assert_eq!(
            answer(404, "not found"),
            Answer::Done(EvictionOutcome::Gone)
        );
        assert_eq!(
            answer(409, "Precondition failed: UID"),
            Answer::Done(EvictionOutcome::Conflict)
        );
        let blocker = |a: Answer| match a {
            Answer::Blocked {
                outcome, blocker, ..
            } => (outcome, blocker),
            Answer::Done(o) => panic!("expected a block, got {o:?}"),
        };
        assert_eq!(
            blocker(answer(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            )),
            (EvictionOutcome::MultiplePdbs, Blocker::MultiplePdbs(vec![]))
        );
        assert_eq!(
            blocker(answer(
                400,
                "admission webhook \"deny.example.com\" denied the request: no"
            )),
            (
                EvictionOutcome::DeniedWebhook,
                Blocker::Webhook("deny.example.com".into())
            )
        );
        assert_eq!(
            blocker(answer(503, "etcd down")),
            (
                EvictionOutcome::Error,
                Blocker::Other("HTTP 503: etcd down".into())
            )
        );
        let plain = classify_answer(StatusCode::BAD_GATEWAY, None, b"upstream reset");
        assert_eq!(
            blocker(plain).1,
            Blocker::Other("HTTP 502: upstream reset".into())
        );
    }

    #[test]
    fn a_429_is_a_pdb_only_with_a_disruption_budget_cause() {
        let class = |body: Value| {
            let body = body.to_string();
            match classify_answer(StatusCode::TOO_MANY_REQUESTS, None, body.as_bytes()) {
                Answer::Blocked {
                    outcome, blocker, ..
                } => (outcome, blocker),
                Answer::Done(o) => panic!("expected a block, got {o:?}"),
            }
        };
        // What eviction.go answers for an exhausted budget.
        let pdb = json!({"kind": "Status", "code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget web needs 4 healthy pods and has 4 currently"}]}});
        assert_eq!(
            class(pdb),
            (EvictionOutcome::BlockedPdb, Blocker::Pdb(String::new()))
        );
        // What API Priority and Fairness answers when it sheds load.
        let apf = json!({"kind": "Status", "code": 429, "reason": "TooManyRequests",
            "message": "Too many requests, please try again later.",
            "details": {"retryAfterSeconds": 1}});
        assert_eq!(class(apf), (EvictionOutcome::Throttled, Blocker::Throttled));
        // What the API server relays of our webhook's answer while the pod deregisters.
        let ours = json!({"kind": "Status", "code": 429, "reason": "TooManyRequests",
            "message": "admission webhook \"evict.graceful-drain.io\" denied the request: graceful-drain: pod web/a is leaving its load balancers",
            "details": {"retryAfterSeconds": 7, "causes": [{"reason": DEREGISTERING_CAUSE}]}});
        assert_eq!(
            class(ours),
            (EvictionOutcome::Deregistering, Blocker::Deregistering)
        );
    }

    #[test]
    fn only_pods_tolerating_the_cordon_come_back_after_eviction() {
        let with = |toleration: Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"},
                "spec": {"containers": [], "tolerations": [toleration]}}))
            .unwrap()
        };
        assert!(tolerates_cordon(&with(
            json!({"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"})
        )));
        assert!(
            tolerates_cordon(&with(json!({"operator": "Exists"}))),
            "tolerates everything"
        );
        assert!(
            tolerates_cordon(&with(json!({"key": UNSCHEDULABLE_TAINT}))),
            "Equal with an empty value"
        );
        assert!(!tolerates_cordon(&with(
            json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoExecute"})
        )));
        assert!(!tolerates_cordon(&with(
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists"})
        )));
        assert!(!tolerates_cordon(&with(
            json!({"key": UNSCHEDULABLE_TAINT, "value": "x"})
        )));
        assert!(!tolerates_cordon(&Pod::default()));
    }

    #[test]
    fn retry_delay_backs_off_capped_jittered_and_honours_retry_after() {
        assert_eq!(retry_delay(0, None, 1.0), RETRY_BASE);
        assert_eq!(retry_delay(0, None, 0.0), RETRY_BASE / 2);
        assert_eq!(retry_delay(3, None, 1.0), Duration::from_secs(8));
        assert_eq!(retry_delay(30, None, 1.0), RETRY_CAP);
        assert!(retry_delay(30, None, 0.0) >= RETRY_CAP / 2);
        assert_eq!(
            retry_delay(0, Some(Duration::from_secs(10)), 0.0),
            Duration::from_secs(10)
        );
        assert_eq!(
            retry_delay(0, Some(Duration::from_secs(3600)), 0.0),
            RETRY_AFTER_CAP
        );
        assert_eq!(retry_delay(5, Some(Duration::ZERO), 1.0), RETRY_CAP);
    }

    #[tokio::test]
    async fn the_pdb_blocking_a_pod_is_found_by_its_selector() {
        let (client, mut handle) = mock();
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-1".into());
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        let call = tokio::spawn(async move { selecting_pdbs(&client, &pod).await });
        let (request, respond) = handle.next_request().await.unwrap();
        assert_eq!(
            request.uri().path(),
            "/apis/policy/v1/namespaces/shop/poddisruptionbudgets"
        );
        let list = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList",
            "metadata": {"resourceVersion": "1"}, "items": [
            {"metadata": {"name": "web-pdb", "namespace": "shop"},
             "spec": {"selector": {"matchLabels": {"app": "web"}}}},
            {"metadata": {"name": "db-pdb", "namespace": "shop"},
             "spec": {"selector": {"matchLabels": {"app": "db"}}}},
            {"metadata": {"name": "nil-selector", "namespace": "shop"}, "spec": {}},
            {"metadata": {"name": "empty-selector", "namespace": "shop"},
             "spec": {"selector": {}}},
        ]});
        respond.send_response(Response::new(Body::from(list.to_string().into_bytes())));
        assert_eq!(
            call.await.unwrap().unwrap(),
            vec!["shop/web-pdb".to_string()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_accepted_eviction_that_left_no_trace_is_sent_again() {
        let (client, mut handle) = mock();
        let mut registry = prometheus_client::registry::Registry::default();
        let (tx, mut updates) = mpsc::unbounded_channel();
        let ctx = Arc::new(TaskCtx {
            client: client.clone(),
            config: Arc::new(DrainConfig::default()),
            metrics: Metrics::register(&mut registry),
            events: NodeEvents::new(client, "n1"),
            permits: Semaphore::new(1),
            updates: tx,
        });
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-1".into());
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.uid = Some("u1".into());
        let mut state = State::default();
        state.pods.insert(key(), pod.clone());
        let mut isolated = pod.clone();
        isolated.metadata.name = Some("web-2".into());
        isolated.metadata.labels = Some([(DRAINING_LABEL.to_string(), "true".to_string())].into());
        let isolated_key = PodKey::of(&isolated);
        state.pods.insert(isolated_key.clone(), isolated);
        let mut tasks = JoinSet::new();
        for k in [key(), isolated_key] {
            let accepted_at = Some(tokio::time::Instant::now());
            let tracked = Tracked {
                uid: "u1".into(),
                blocked: None,
                accepted_at,
            };
            state.tracked.insert(k, tracked);
        }
        evict_lost(&mut state, &mut tasks, &ctx);
        assert!(tasks.is_empty(), "too early to call an eviction lost");
        tokio::time::advance(REEVICT_AFTER).await;
        evict_lost(&mut state, &mut tasks, &ctx);
        assert_eq!(
            tasks.len(),
            1,
            "only the pod that is neither isolated nor terminating"
        );
        let (request, respond) = handle.next_request().await.unwrap();
        assert_eq!(
            request.uri().path(),
            "/api/v1/namespaces/shop/pods/web-1/eviction"
        );
        respond.send_response(
            Response::builder()
                .status(201)
                .body(Body::from(b"{}".to_vec()))
                .unwrap(),
        );
        assert!(matches!(updates.recv().await, Some(Update::Accepted(k)) if k == key()));
    }

    #[test]
    fn a_restarted_watch_never_makes_tracked_pods_look_gone_halfway() {
        let pod = |name: &str, uid: &str| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            p.metadata.namespace = Some("shop".into());
            p.metadata.uid = Some(uid.into());
            p
        };
        let mut state = State::default();
        for (name, uid) in [("web-1", "u1"), ("web-2", "u2")] {
            state
                .pods
                .insert(PodKey::of(&pod(name, uid)), pod(name, uid));
            state.seen.insert(uid.into());
            let tracked = Tracked {
                uid: uid.into(),
                blocked: None,
                accepted_at: None,
            };
            state.tracked.insert(PodKey::of(&pod(name, uid)), tracked);
        }
        let opts = FilterOptions::default();
        assert!(state.apply(watcher::Event::Init).is_none());
        assert!(
            state
                .apply(watcher::Event::InitApply(pod("web-2", "u2")))
                .is_none()
        );
        assert_eq!(
            state.progress(&opts).remaining.len(),
            2,
            "mid re-list: nothing is gone"
        );
        let newcomer = state.apply(watcher::Event::InitApply(pod("late", "u9")));
        assert_eq!(
            newcomer.and_then(|p| p.metadata.name),
            Some("late".to_string())
        );
        state.apply(watcher::Event::InitDone);
        let progress = state.progress(&opts);
        assert_eq!(progress.done, 1, "web-1 is gone once the re-list completed");
        assert_eq!(
            progress
                .remaining
                .keys()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>(),
            ["web-2"]
        );
        // A same-name pod with a new UID counts as the old one being gone.
        state.apply(watcher::Event::Apply(pod("web-2", "u3")));
        assert!(state.progress(&opts).remaining.is_empty());
    }
}
