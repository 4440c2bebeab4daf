//! What `--hooks` configures: the hook specs as written, and their validation into
//! [`Hooks`] ready to run (HTTPS clients built, Job templates checked).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use k8s_openapi::api::batch::v1::JobTemplateSpec;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};

/// How long a hook may take when its configuration does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// How often an unfinished hook is polled when its configuration does not say.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Longest hook name: the Job is named `gd-<name>-<8 hex>` and must stay a 63-byte label.
const MAX_NAME: usize = 50;

/// Where in a transition a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HookPoint {
    /// A drain begins, before the cordon: a hook here may refuse the drain while the node
    /// is still untouched.
    DrainStart,
    /// The node is cordoned and out of the load balancers; no pod has been evicted yet.
    BeforeEviction,
    /// Every pod is gone; the drain reports `drain-complete` only after these hooks.
    AfterLastPod,
    /// The node is schedulable again; `maintenance-complete` is reported after these hooks.
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
    /// The point of the transition at which the hook runs.
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
    /// Run the hook as an HTTPS call; exactly one of `https` and `job` must be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<HttpsSpec>,
    /// Run the hook as a Job on the node; exactly one of `https` and `job` must be set.
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

/// A configuration that cannot be used; names the hook.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The text is not a JSON list of hook specs (bad JSON, a missing or unknown field).
    #[error("--hooks is not a JSON list of hooks: {0}")]
    Json(#[from] serde_json::Error),
    /// One hook's spec parsed but cannot be used.
    #[error("hook {name:?}: {message}")]
    Invalid {
        /// The hook's configured name.
        name: String,
        /// What is wrong with it (name, durations, target, URL, CA bundle, Job template).
        message: String,
    },
}

/// A validated hook.
#[derive(Clone)]
pub struct Hook {
    /// The spec as configured.
    pub spec: HookSpec,
    /// How long the hook may take, counted from its recorded start; never zero.
    pub timeout: Duration,
    /// How often an unfinished hook is polled; never zero.
    pub poll_interval: Duration,
    pub(super) target: Target,
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hook").field("spec", &self.spec).finish()
    }
}

pub(super) type HttpsClient = HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>;

#[derive(Clone)]
pub(super) enum Target {
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

    /// Whether no hook is configured at any point.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
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

/// Whether `name` is a hook name: an RFC 1123 label of at most [`MAX_NAME`] characters.
fn is_dns_label(name: &str) -> bool {
    name.len() <= MAX_NAME && is_rfc1123_label(name)
}

/// Longest RFC 1123 label, hence longest namespace name (upstream
/// `validation.DNS1123LabelMaxLength`).
const LABEL_MAX: usize = 63;

/// Whether `name` is an RFC 1123 label (lowercase letters, digits and `-`, at most 63
/// characters, starting and ending with a letter or digit), as a namespace name must be.
fn is_rfc1123_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= LABEL_MAX
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
    if !is_rfc1123_label(&spec.namespace) {
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
