//! Maintenance hooks: the side effects a node's maintenance needs beyond its pods (move a
//! hypervisor's VMs away, detach storage, tell an inventory system), run by the node agent
//! at four points of its two transitions:
//!
//! * `drain-start` — a drain begins, before the cordon (a check that may refuse the drain
//!   while the node is still untouched);
//! * `before-eviction` — the node is cordoned and out of the load balancers, no pod has been
//!   evicted yet (evacuate what pods cannot carry);
//! * `after-last-pod` — every pod is gone, before the drain reports `drain-complete`;
//! * `after-uncordon` — the node is schedulable again, before `maintenance-complete`.
//!
//! A hook is either an HTTPS call or a Kubernetes Job run on the node. Hooks of one point
//! run one after the other, in the order configured. A hook that fails or outlives its
//! `timeout` fails the transition with its message, unless it is `optional` (then a
//! Warning Event says so and the transition goes on).
//!
//! **The HTTPS protocol.** The agent POSTs a [`HookRequest`] (JSON) to the hook's URL and
//! expects `200` with a [`HookResponse`]: `done`, `inProgress` or `failed`, and a message.
//! `inProgress` is polled, like the SLM `End` call: the same POST with `action: poll` and
//! the same `id`, every `pollInterval`. A poll answered `404` means the hook never saw that
//! id (it lost its state, or the start never reached it): the agent starts it again. Any
//! other status, a body that does not parse, or no answer is retried until the timeout.
//!
//! **The Job protocol.** The Job is created from the template, pinned to the node
//! (`spec.template.spec.nodeName`), named after the hook and its id, and told where it runs
//! (`GRACEFUL_DRAIN_NODE`, `GRACEFUL_DRAIN_HOOK_AT`, `GRACEFUL_DRAIN_LIFECYCLE_EVENT` in
//! every container). Its `Complete` condition is success; `Failed` is failure.
//!
//! **Restarts.** Each hook's state lives in the Node's `graceful-drain.io/hooks`
//! annotation ([`HookRecord`]): written before the first call, updated as answers change.
//! An agent restarted while a hook is in progress finds the record of the same
//! LifecycleEvent and polls the hook with the recorded id — it never starts it twice — and
//! the timeout keeps counting from the recorded start; a hook recorded done is skipped.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use k8s_openapi::api::batch::v1::{Job, JobTemplateSpec};
use k8s_openapi::api::core::v1::{EnvVar, Node, Toleration};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};

use super::node::{self, API_TIMEOUT};
use super::report::{EventType, NodeEvents, reason as ev};
use graceful_drain_core::labels::HOOKS_ANNOTATION;

/// How long a hook may take when its configuration does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// How often an unfinished hook is polled when its configuration does not say.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Longest one HTTPS call may take (connect, TLS, answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A finished hook Job is kept this long (unless its template says) for `kubectl logs`.
const JOB_TTL_SECONDS: i32 = 86_400;
/// Longest hook name: the Job is named `gd-<name>-<8 hex>` and must stay a 63-byte label.
const MAX_NAME: usize = 50;
/// Reads and writes of a hook's record on the Node are tried this often (200 ms doubling
/// in between, about 3 s in all) before the hook goes on without.
const RECORD_ATTEMPTS: u32 = 5;
/// `apiVersion` of the HTTPS hook messages.
pub const HOOK_API_VERSION: &str = "graceful-drain.io/v1";

/// Where in a transition a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HookPoint {
    DrainStart,
    BeforeEviction,
    AfterLastPod,
    AfterUncordon,
}

impl HookPoint {
    /// The name used in configuration, messages and requests.
    pub fn name(self) -> &'static str {
        match self {
            Self::DrainStart => "drain-start",
            Self::BeforeEviction => "before-eviction",
            Self::AfterLastPod => "after-last-pod",
            Self::AfterUncordon => "after-uncordon",
        }
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One hook as configured (`--hooks`, a JSON list; the chart's `agent.hooks`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HookSpec {
    /// Unique, a DNS label of at most 50 characters.
    pub name: String,
    pub at: HookPoint,
    /// A failure or timeout is reported and the transition goes on.
    #[serde(default)]
    pub optional: bool,
    /// Go duration (`10m`); [`DEFAULT_TIMEOUT`] when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Go duration (`5s`); [`DEFAULT_POLL_INTERVAL`] when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<HttpsSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobSpec>,
}

/// An HTTPS hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpsSpec {
    /// `https://host[:port]/path`.
    pub url: String,
    /// Base64 of the PEM CA certificates that sign the hook's certificate (as a webhook
    /// configuration's `caBundle`); the system's roots when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
}

/// A Job hook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    /// Where the Job is created.
    pub namespace: String,
    /// The Job's metadata and spec; its pod is pinned to the node being maintained.
    pub template: JobTemplateSpec,
}

/// What `action` the agent asks of an HTTPS hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookAction {
    Start,
    Poll,
}

/// The body the agent POSTs to an HTTPS hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRequest {
    pub api_version: String,
    pub kind: String,
    pub action: HookAction,
    /// Stable for one run of one hook: a poll carries the id of its start.
    pub id: String,
    pub hook: String,
    pub at: HookPoint,
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_event: Option<String>,
}

/// Where a hook says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookStatus {
    Done,
    InProgress,
    Failed,
}

/// A hook's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookResponse {
    pub status: HookStatus,
    #[serde(default)]
    pub message: String,
}

/// A configuration that cannot be used; names the hook.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--hooks is not a JSON list of hooks: {0}")]
    Json(#[from] serde_json::Error),
    #[error("hook {name:?}: {message}")]
    Invalid { name: String, message: String },
}

/// A validated hook.
#[derive(Clone)]
pub struct Hook {
    pub spec: HookSpec,
    pub timeout: Duration,
    pub poll_interval: Duration,
    target: Target,
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hook").field("spec", &self.spec).finish()
    }
}

type HttpsClient = HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>;

#[derive(Clone)]
enum Target {
    Https {
        uri: http::Uri,
        client: Box<HttpsClient>,
    },
    Job(Box<JobSpec>),
}

/// The node agent's hooks. Cheap to clone; empty by default.
#[derive(Clone, Debug, Default)]
pub struct Hooks {
    hooks: Arc<Vec<Hook>>,
}

impl Hooks {
    /// Parses and validates `--hooks` (a JSON list of [`HookSpec`]); an empty string is no
    /// hooks.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let specs: Vec<HookSpec> = serde_json::from_str(text)?;
        Self::new(specs)
    }

    /// Validates `specs`.
    pub fn new(specs: Vec<HookSpec>) -> Result<Self, ConfigError> {
        let mut hooks = Vec::with_capacity(specs.len());
        for spec in specs {
            if hooks.iter().any(|h: &Hook| h.spec.name == spec.name) {
                return Err(invalid(&spec.name, "two hooks have this name"));
            }
            hooks.push(Hook::new(spec)?);
        }
        Ok(Self {
            hooks: Arc::new(hooks),
        })
    }

    /// The hooks of `point`, in configured order.
    pub fn at(&self, point: HookPoint) -> impl Iterator<Item = &Hook> {
        self.hooks.iter().filter(move |h| h.spec.at == point)
    }

    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Runs the hooks of `point` one after the other; the first that fails (and is not
    /// optional) stops the others and is the error. `on_step` hears where each stands.
    pub async fn run(
        &self,
        point: HookPoint,
        ctx: &HookContext<'_>,
        on_step: &(dyn Fn(Option<HookStep>) + Sync),
    ) -> Result<(), HookError> {
        for hook in self.at(point) {
            let result = hook.run(ctx, on_step).await;
            on_step(None);
            result?;
        }
        Ok(())
    }
}

/// For clap: `--hooks`.
pub fn parse_arg(text: &str) -> Result<Hooks, String> {
    Hooks::parse(text).map_err(|e| e.to_string())
}

fn invalid(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name: name.to_string(),
        message: message.into(),
    }
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

impl Hook {
    fn new(spec: HookSpec) -> Result<Self, ConfigError> {
        let name = spec.name.clone();
        if !is_dns_label(&name) {
            return Err(invalid(
                &name,
                format!("a name must be lowercase letters, digits and '-', at most {MAX_NAME}"),
            ));
        }
        let duration = |field: &str, text: &Option<String>, default| match text {
            None => Ok(default),
            Some(text) => graceful_drain_core::duration::parse_go_duration(text)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| invalid(&name, format!("{field} {text:?} is not a duration"))),
        };
        let timeout = duration("timeout", &spec.timeout, DEFAULT_TIMEOUT)?;
        let poll_interval = duration("pollInterval", &spec.poll_interval, DEFAULT_POLL_INTERVAL)?;
        let target = match (&spec.https, &spec.job) {
            (Some(https), None) => https_target(&name, https)?,
            (None, Some(job)) => job_target(&name, job)?,
            _ => return Err(invalid(&name, "set exactly one of https and job")),
        };
        Ok(Self {
            spec,
            timeout,
            poll_interval,
            target,
        })
    }

    fn label(&self) -> String {
        format!("hook {} ({})", self.spec.name, self.spec.at)
    }
}

fn https_target(name: &str, spec: &HttpsSpec) -> Result<Target, ConfigError> {
    let uri: http::Uri = spec
        .url
        .parse()
        .map_err(|e| invalid(name, format!("url {:?}: {e}", spec.url)))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none() {
        return Err(invalid(
            name,
            format!("url {:?} is not https://host/…", spec.url),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let connector = match &spec.ca_bundle {
        Some(bundle) => {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(bundle.trim())
                .map_err(|e| invalid(name, format!("caBundle is not base64: {e}")))?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| invalid(name, format!("caBundle: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| invalid(name, format!("caBundle: {e}")))?;
            }
            if roots.is_empty() {
                return Err(invalid(name, "caBundle holds no certificate"));
            }
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| invalid(name, e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
        }
        None => hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| {
                invalid(
                    name,
                    format!("no caBundle, and the system's CA certificates: {e}"),
                )
            })?,
    }
    .https_only()
    .enable_http1()
    .build();
    let client = HttpClient::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
    Ok(Target::Https {
        uri,
        client: Box::new(client),
    })
}

fn job_target(name: &str, spec: &JobSpec) -> Result<Target, ConfigError> {
    if !is_dns_label(&spec.namespace) {
        return Err(invalid(
            name,
            format!("job namespace {:?} is not a namespace name", spec.namespace),
        ));
    }
    let containers = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map_or(0, |p| p.containers.len());
    if containers == 0 {
        return Err(invalid(
            name,
            "job template has no containers (template.spec.template.spec.containers)",
        ));
    }
    Ok(Target::Job(Box::new(spec.clone())))
}

/// Who runs a hook and for what.
pub struct HookContext<'a> {
    pub client: &'a kube::Client,
    pub node: &'a str,
    /// The LifecycleEvent of the transition, if it names one.
    pub event: Option<&'a str>,
    /// What ties records to this transition across agent restarts: the event's name, or
    /// an id of the operation when it names none.
    pub operation: &'a str,
    pub events: &'a NodeEvents,
}

/// Where a running hook stands (for the condition message and `/status`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookStep {
    pub name: String,
    pub at: HookPoint,
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

/// A hook that failed the transition.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("hook {name} ({at}) failed: {message}")]
    Failed {
        name: String,
        at: HookPoint,
        message: String,
    },
    #[error("hook {name} ({at}) timed out after {after}: {message}")]
    TimedOut {
        name: String,
        at: HookPoint,
        after: String,
        message: String,
    },
}

/// The state of one hook as the Node remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RecordState {
    /// Written before the first call: the hook may or may not have heard of it.
    Starting,
    InProgress,
    Done,
    Failed,
}

/// One hook's entry in the Node's `graceful-drain.io/hooks` annotation (a JSON object
/// keyed by hook name): its last run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRecord {
    pub at: HookPoint,
    /// The LifecycleEvent (or operation id) of the run.
    pub operation: String,
    pub id: String,
    pub state: RecordState,
    #[serde(default)]
    pub message: String,
    pub started_at: jiff::Timestamp,
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

/// What one call to a hook learned.
#[derive(Debug)]
enum Answer {
    Said(HookResponse),
    /// A poll for an id the hook does not know: start it.
    Unknown,
}

/// A call that did not give an answer; retried.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("{0}")]
    Transport(String),
    #[error("answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("answer is not a hook response: {0}")]
    Body(String),
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl Hook {
    /// Runs this hook to its end (see the module documentation).
    async fn run(
        &self,
        ctx: &HookContext<'_>,
        on_step: &(dyn Fn(Option<HookStep>) + Sync),
    ) -> Result<(), HookError> {
        let name = &self.spec.name;
        let at = self.spec.at;
        let step = |message: &str| {
            on_step(Some(HookStep {
                name: name.clone(),
                at,
                message: message.to_string(),
            }))
        };
        let prior = self.prior_record(ctx).await;
        let resumed = prior
            .as_ref()
            .is_some_and(|r| matches!(r.state, RecordState::Starting | RecordState::InProgress));
        let mut record = match prior {
            Some(record) if record.state == RecordState::Done => {
                tracing::info!(hook = %name, %at, "hook already done for this transition; not run again");
                return Ok(());
            }
            Some(record)
                if matches!(
                    record.state,
                    RecordState::Starting | RecordState::InProgress
                ) =>
            {
                tracing::info!(hook = %name, %at, id = %record.id, "hook in progress before a restart; polling it");
                record
            }
            _ => {
                let record = HookRecord {
                    at,
                    operation: ctx.operation.to_string(),
                    id: uuid::Uuid::new_v4().simple().to_string(),
                    state: RecordState::Starting,
                    message: String::new(),
                    started_at: jiff::Timestamp::now(),
                    finished_at: None,
                };
                self.write_record(ctx, &record).await;
                let message = format!("{} started", self.label());
                ctx.events
                    .post(EventType::Normal, ev::HOOK_STARTED, "", message)
                    .await;
                record
            }
        };
        step(if record.message.is_empty() {
            "starting"
        } else {
            &record.message
        });
        // A run an earlier agent began is polled, never started again.
        let mut action = if resumed {
            HookAction::Poll
        } else {
            HookAction::Start
        };
        let deadline = deadline_of(&record, self.timeout);
        let mut last_error = String::new();
        loop {
            let left = until(deadline);
            if left.is_zero() {
                let message = if last_error.is_empty() {
                    record.message.clone()
                } else {
                    last_error
                };
                return self.timed_out(ctx, record, message).await;
            }
            let answer =
                tokio::time::timeout(left.min(CALL_TIMEOUT), self.call(action, ctx, &record.id))
                    .await;
            // Whatever came of a start, the next call polls: a start that may have
            // reached the hook is never sent twice (a poll the hook does not know is
            // answered 404 and starts it then).
            let sent = action;
            action = HookAction::Poll;
            match answer {
                Ok(Ok(Answer::Said(response))) => match response.status {
                    HookStatus::Done => {
                        return self.finished(ctx, record, true, response.message).await;
                    }
                    HookStatus::Failed => {
                        return self.finished(ctx, record, false, response.message).await;
                    }
                    HookStatus::InProgress => {
                        last_error.clear();
                        if record.state != RecordState::InProgress
                            || record.message != response.message
                        {
                            record.state = RecordState::InProgress;
                            record.message = response.message;
                            self.write_record(ctx, &record).await;
                            step(&record.message);
                        }
                    }
                },
                Ok(Ok(Answer::Unknown)) => {
                    tracing::info!(hook = %name, %at, id = %record.id, "the hook does not know this run; starting it");
                    action = HookAction::Start;
                    if sent == HookAction::Poll {
                        continue;
                    }
                }
                Ok(Err(error)) => {
                    last_error = graceful_drain_core::error::chain(&error).to_string();
                    tracing::warn!(hook = %name, %at, error = %last_error, "call hook (retrying)");
                    let message = format!("{} (retrying): {last_error}", self.label());
                    ctx.events
                        .post(EventType::Warning, ev::HOOK_UNREACHABLE, name, message)
                        .await;
                }
                Err(_) => {
                    last_error = format!("no answer within {:?}", left.min(CALL_TIMEOUT));
                    tracing::warn!(hook = %name, %at, error = %last_error, "call hook (retrying)");
                }
            }
            tokio::time::sleep(self.poll_interval.min(until(deadline))).await;
        }
    }

    /// The record of this hook for this transition, if an earlier agent left one.
    async fn prior_record(&self, ctx: &HookContext<'_>) -> Option<HookRecord> {
        let mut delay = Duration::from_millis(200);
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
            tokio::time::sleep(delay).await;
            delay *= 2;
            attempt += 1;
        };
        records(&node)
            .remove(&self.spec.name)
            .filter(|r| r.operation == ctx.operation && r.at == self.spec.at)
    }

    /// Writes `record` into the Node's annotation (retried a few times; a record that
    /// cannot be written is logged, and the hook goes on).
    async fn write_record(&self, ctx: &HookContext<'_>, record: &HookRecord) {
        let mut delay = Duration::from_millis(200);
        for attempt in 1..=RECORD_ATTEMPTS {
            match write_record(ctx.client, ctx.node, &self.spec.name, record).await {
                Ok(()) => return,
                Err(error) => {
                    let error = graceful_drain_core::error::chain(&error).to_string();
                    tracing::warn!(hook = %self.spec.name, attempt, %error, "record hook state on the node");
                }
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }

    async fn finished(
        &self,
        ctx: &HookContext<'_>,
        mut record: HookRecord,
        ok: bool,
        message: String,
    ) -> Result<(), HookError> {
        record.state = if ok {
            RecordState::Done
        } else {
            RecordState::Failed
        };
        record.message = message.clone();
        let now = jiff::Timestamp::now();
        record.finished_at = Some(now);
        self.write_record(ctx, &record).await;
        let took = now.duration_since(record.started_at).as_secs();
        if ok {
            let text = format!("{} done after {took}s: {message}", self.label());
            ctx.events
                .post(EventType::Normal, ev::HOOK_SUCCEEDED, "", text)
                .await;
            return Ok(());
        }
        let error = HookError::Failed {
            name: self.spec.name.clone(),
            at: self.spec.at,
            message,
        };
        self.fail(ctx, error).await
    }

    async fn timed_out(
        &self,
        ctx: &HookContext<'_>,
        mut record: HookRecord,
        message: String,
    ) -> Result<(), HookError> {
        if let Target::Job(job) = &self.target {
            self.delete_job(ctx, job, &record.id).await;
        }
        let after = humantime::format_duration(self.timeout).to_string();
        record.state = RecordState::Failed;
        record.message = format!("timed out after {after}: {message}");
        record.finished_at = Some(jiff::Timestamp::now());
        self.write_record(ctx, &record).await;
        let error = HookError::TimedOut {
            name: self.spec.name.clone(),
            at: self.spec.at,
            after,
            message,
        };
        self.fail(ctx, error).await
    }

    async fn fail(&self, ctx: &HookContext<'_>, error: HookError) -> Result<(), HookError> {
        if self.spec.optional {
            let text = format!("{error}; optional, continuing");
            tracing::warn!(hook = %self.spec.name, "{text}");
            ctx.events
                .post(EventType::Warning, ev::HOOK_FAILED, "", text)
                .await;
            return Ok(());
        }
        tracing::warn!(hook = %self.spec.name, error = %error, "hook failed the transition");
        ctx.events
            .post(EventType::Warning, ev::HOOK_FAILED, "", error.to_string())
            .await;
        Err(error)
    }

    async fn call(
        &self,
        action: HookAction,
        ctx: &HookContext<'_>,
        id: &str,
    ) -> Result<Answer, CallError> {
        match &self.target {
            Target::Https { uri, client } => {
                let request = HookRequest {
                    api_version: HOOK_API_VERSION.into(),
                    kind: "HookRequest".into(),
                    action,
                    id: id.to_string(),
                    hook: self.spec.name.clone(),
                    at: self.spec.at,
                    node: ctx.node.to_string(),
                    lifecycle_event: ctx.event.map(str::to_string),
                };
                post(client, uri, &request).await
            }
            Target::Job(job) => match action {
                HookAction::Start => self.start_job(ctx, job, id).await,
                HookAction::Poll => self.poll_job(ctx, job, id).await,
            },
        }
    }

    fn job_name(&self, id: &str) -> String {
        format!("gd-{}-{}", self.spec.name, &id[..id.len().min(8)])
    }

    async fn start_job(
        &self,
        ctx: &HookContext<'_>,
        spec: &JobSpec,
        id: &str,
    ) -> Result<Answer, CallError> {
        let name = self.job_name(id);
        let job = job_for(spec, &name, &self.spec, ctx.node, ctx.event);
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &spec.namespace);
        let what = format!("create job {}/{name}", spec.namespace);
        match bounded(what, api.create(&PostParams::default(), &job)).await {
            Ok(_) => {}
            // Created by the start before a restart: it is this run's Job.
            Err(CallError::Kube {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 => {}
            Err(error) => return Err(error),
        }
        Ok(Answer::Said(HookResponse {
            status: HookStatus::InProgress,
            message: format!("job {}/{name} created", spec.namespace),
        }))
    }

    async fn poll_job(
        &self,
        ctx: &HookContext<'_>,
        spec: &JobSpec,
        id: &str,
    ) -> Result<Answer, CallError> {
        let name = self.job_name(id);
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &spec.namespace);
        let what = format!("read job {}/{name}", spec.namespace);
        let Some(job) = bounded(what, api.get_opt(&name)).await? else {
            return Ok(Answer::Unknown);
        };
        Ok(Answer::Said(job_progress(&job, &spec.namespace, &name)))
    }

    async fn delete_job(&self, ctx: &HookContext<'_>, spec: &JobSpec, id: &str) {
        let name = self.job_name(id);
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &spec.namespace);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match tokio::time::timeout(API_TIMEOUT, api.delete(&name, &params)).await {
            Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => {}
            Ok(Err(error)) => {
                tracing::warn!(job = %name, error = %graceful_drain_core::error::chain(&error), "delete timed-out hook job")
            }
            Err(_) => tracing::warn!(job = %name, "delete timed-out hook job: timed out"),
        }
    }
}

/// `call` within [`API_TIMEOUT`]; `what` names it in errors.
async fn bounded<T>(
    what: String,
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(CallError::Kube { what, source }),
        Err(_) => Err(CallError::Transport(format!("{what}: timed out"))),
    }
}

fn deadline_of(record: &HookRecord, timeout: Duration) -> jiff::Timestamp {
    let timeout = jiff::SignedDuration::try_from(timeout).unwrap_or(jiff::SignedDuration::MAX);
    record
        .started_at
        .checked_add(timeout)
        .unwrap_or(jiff::Timestamp::MAX)
}

/// Time left until `deadline` (zero once it passed).
fn until(deadline: jiff::Timestamp) -> Duration {
    let left = deadline.duration_since(jiff::Timestamp::now());
    Duration::try_from(left).unwrap_or(Duration::ZERO)
}

async fn post(
    client: &HttpsClient,
    uri: &http::Uri,
    request: &HookRequest,
) -> Result<Answer, CallError> {
    let body = serde_json::to_vec(request).map_err(|e| CallError::Body(e.to_string()))?;
    let http_request = http::Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| CallError::Transport(e.to_string()))?;
    let response = client.request(http_request).await.map_err(|e| {
        CallError::Transport(format!(
            "POST {uri}: {}",
            graceful_drain_core::error::chain(&e)
        ))
    })?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| CallError::Transport(format!("POST {uri}: {e}")))?
        .to_bytes();
    // A poll for an id the hook never saw; a start answered 404 is a wrong URL.
    if status == http::StatusCode::NOT_FOUND && request.action == HookAction::Poll {
        return Ok(Answer::Unknown);
    }
    if !status.is_success() {
        let body = String::from_utf8_lossy(&bytes).chars().take(200).collect();
        return Err(CallError::Status {
            status: status.as_u16(),
            body,
        });
    }
    serde_json::from_slice(&bytes)
        .map(Answer::Said)
        .map_err(|e| CallError::Body(e.to_string()))
}

/// The Job a hook run creates: the template's, named `name`, pinned to the node,
/// tolerating its cordon, labelled with the hook, and told where it runs.
fn job_for(spec: &JobSpec, name: &str, hook: &HookSpec, node: &str, event: Option<&str>) -> Job {
    let mut metadata = spec.template.metadata.clone().unwrap_or_default();
    metadata.name = Some(name.to_string());
    metadata.namespace = Some(spec.namespace.clone());
    let labels = metadata.labels.get_or_insert_with(Default::default);
    labels.insert(
        graceful_drain_core::labels::HOOK_LABEL.into(),
        hook.name.clone(),
    );
    let mut job_spec = spec.template.spec.clone().unwrap_or_default();
    if job_spec.ttl_seconds_after_finished.is_none() {
        job_spec.ttl_seconds_after_finished = Some(JOB_TTL_SECONDS);
    }
    let pod = &mut job_spec.template;
    pod.metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            graceful_drain_core::labels::HOOK_LABEL.into(),
            hook.name.clone(),
        );
    let pod_spec = pod.spec.get_or_insert_with(Default::default);
    pod_spec.node_name = Some(node.to_string());
    if pod_spec.restart_policy.is_none() {
        pod_spec.restart_policy = Some("Never".into());
    }
    pod_spec
        .tolerations
        .get_or_insert_with(Vec::new)
        .push(Toleration {
            key: Some("node.kubernetes.io/unschedulable".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        });
    let env = [
        ("GRACEFUL_DRAIN_NODE", node.to_string()),
        ("GRACEFUL_DRAIN_HOOK_AT", hook.at.name().to_string()),
        (
            "GRACEFUL_DRAIN_LIFECYCLE_EVENT",
            event.unwrap_or_default().to_string(),
        ),
    ];
    for container in &mut pod_spec.containers {
        let vars = container.env.get_or_insert_with(Vec::new);
        for (key, value) in &env {
            vars.retain(|v| v.name != *key);
            vars.push(EnvVar {
                name: (*key).to_string(),
                value: Some(value.clone()),
                ..EnvVar::default()
            });
        }
    }
    Job {
        metadata,
        spec: Some(job_spec),
        status: None,
    }
}

/// A Job's progress as a hook answer: `Complete` (or `SuccessCriteriaMet`) is done,
/// `Failed` is failed, anything else in progress.
fn job_progress(job: &Job, namespace: &str, name: &str) -> HookResponse {
    let status = job.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let is = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if let Some(failed) = is("Failed") {
        let why = failed
            .message
            .clone()
            .or_else(|| failed.reason.clone())
            .unwrap_or_default();
        return HookResponse {
            status: HookStatus::Failed,
            message: format!("job {namespace}/{name} failed: {why}"),
        };
    }
    if is("Complete").is_some() || is("SuccessCriteriaMet").is_some() {
        return HookResponse {
            status: HookStatus::Done,
            message: format!("job {namespace}/{name} complete"),
        };
    }
    let active = status.and_then(|s| s.active).unwrap_or(0);
    HookResponse {
        status: HookStatus::InProgress,
        message: format!("job {namespace}/{name}: {active} active"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job_spec() -> JobSpec {
        serde_json::from_value(json!({"namespace": "ops", "template": {
            "metadata": {"labels": {"team": "infra"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "a", "image": "busybox", "env": [{"name": "GRACEFUL_DRAIN_NODE", "value": "stale"}]},
                {"name": "b", "image": "busybox"}]}}}}}))
        .unwrap()
    }

    #[test]
    fn a_hook_job_is_pinned_to_the_node_and_told_where_it_runs() {
        let spec = job_spec();
        let hook: HookSpec =
            serde_json::from_value(json!({"name": "report", "at": "after-last-pod",
            "job": serde_json::to_value(&spec).unwrap()}))
            .unwrap();
        let job = job_for(&spec, "gd-report-0123abcd", &hook, "w1", Some("drain-w1"));
        let value = serde_json::to_value(&job).unwrap();
        assert_eq!(value["metadata"]["name"], "gd-report-0123abcd");
        assert_eq!(value["metadata"]["namespace"], "ops");
        assert_eq!(
            value["metadata"]["labels"],
            json!({"team": "infra", "graceful-drain.io/hook": "report"})
        );
        assert_eq!(value["spec"]["ttlSecondsAfterFinished"], JOB_TTL_SECONDS);
        let pod = &value["spec"]["template"]["spec"];
        assert_eq!(pod["nodeName"], "w1");
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(
            pod["tolerations"][0]["key"],
            "node.kubernetes.io/unschedulable"
        );
        for container in pod["containers"].as_array().unwrap() {
            let env: BTreeMap<String, String> = container["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap().into(),
                        e["value"].as_str().unwrap().into(),
                    )
                })
                .collect();
            assert_eq!(
                env["GRACEFUL_DRAIN_NODE"], "w1",
                "ours replaces the template's"
            );
            assert_eq!(env["GRACEFUL_DRAIN_HOOK_AT"], "after-last-pod");
            assert_eq!(env["GRACEFUL_DRAIN_LIFECYCLE_EVENT"], "drain-w1");
            assert_eq!(env.len(), 3);
        }
    }

    #[test]
    fn a_jobs_conditions_are_its_answer() {
        let job = |conditions: serde_json::Value, active: i32| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j"}, "status": {"conditions": conditions, "active": active}}))
                .unwrap()
        };
        let answer = |j: &Job| job_progress(j, "ops", "j");
        assert_eq!(answer(&job(json!([]), 1)).status, HookStatus::InProgress);
        assert_eq!(answer(&job(json!([]), 1)).message, "job ops/j: 1 active");
        let done = job(json!([{"type": "Complete", "status": "True"}]), 0);
        assert_eq!(answer(&done).status, HookStatus::Done);
        let criteria = job(json!([{"type": "SuccessCriteriaMet", "status": "True"}]), 0);
        assert_eq!(answer(&criteria).status, HookStatus::Done);
        let failed = job(
            json!([{"type": "FailureTarget", "status": "True"},
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]),
            0,
        );
        assert_eq!(
            answer(&failed),
            HookResponse {
                status: HookStatus::Failed,
                message: "job ops/j failed: DeadlineExceeded".into()
            }
        );
        let not_yet = job(json!([{"type": "Complete", "status": "False"}]), 0);
        assert_eq!(answer(&not_yet).status, HookStatus::InProgress);
    }

    #[test]
    fn the_wire_format_is_camel_case() {
        let request = HookRequest {
            api_version: HOOK_API_VERSION.into(),
            kind: "HookRequest".into(),
            action: HookAction::Poll,
            id: "abc".into(),
            hook: "evacuate-vms".into(),
            at: HookPoint::BeforeEviction,
            node: "w1".into(),
            lifecycle_event: Some("drain-w1".into()),
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"apiVersion": "graceful-drain.io/v1", "kind": "HookRequest", "action": "poll",
                "id": "abc", "hook": "evacuate-vms", "at": "before-eviction", "node": "w1",
                "lifecycleEvent": "drain-w1"})
        );
        let answer: HookResponse = serde_json::from_value(json!({"status": "inProgress"})).unwrap();
        assert_eq!(answer.status, HookStatus::InProgress);
        assert!(serde_json::from_value::<HookResponse>(json!({"status": "maybe"})).is_err());
        let step = HookStep {
            name: "evacuate-vms".into(),
            at: HookPoint::BeforeEviction,
            message: "2/6 VMs moved".into(),
        };
        assert_eq!(
            step.to_string(),
            "hook evacuate-vms (before-eviction): 2/6 VMs moved"
        );
    }

    #[test]
    fn the_timeout_counts_from_the_recorded_start() {
        let started: jiff::Timestamp = "2025-01-15T08:00:00Z".parse().unwrap();
        let record = HookRecord {
            at: HookPoint::BeforeEviction,
            operation: "drain-w1".into(),
            id: "a".into(),
            state: RecordState::InProgress,
            message: String::new(),
            started_at: started,
            finished_at: None,
        };
        let deadline = deadline_of(&record, Duration::from_secs(600));
        assert_eq!(deadline.to_string(), "2025-01-15T08:10:00Z");
        assert_eq!(
            until(started),
            Duration::ZERO,
            "a past deadline leaves nothing"
        );
    }
}
