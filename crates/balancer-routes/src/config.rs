//! What a user configures to have one balancer asked: [`BalancerConfig`], read from a
//! file or chart values with serde (camelCase keys, unknown keys refused).
//!
//! ```yaml
//! source:
//!   haproxy:
//!     url: http://haproxy-stats.ingress:8404/stats
//!     backend: be_web
//! tokenFile: /var/run/secrets/balancer/token
//! timeout: 2s
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// How long one question may take when the configuration does not say: balancers are
/// asked from inside the cluster and answer in milliseconds. A slower answer counts as
/// none (so the drain keeps its full delay) rather than stalling the loop that asks.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// One balancer to ask, and how.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BalancerConfig {
    /// What to ask and how to read the answer.
    pub source: Source,
    /// A file holding a bearer token sent as `Authorization: Bearer …`; read again for
    /// every question, so a rotated token is used at once.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificates that sign an `https` balancer's certificate, read again for
    /// every question; the system's roots when unset.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// How long one question may take, a duration such as `2s` or `500ms`;
    /// [`DEFAULT_TIMEOUT`] when unset.
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
}

impl BalancerConfig {
    /// A configuration for `source` with no token, the system's roots and the default
    /// timeout.
    pub fn new(source: Source) -> Self {
        Self {
            source,
            token_file: None,
            ca_file: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// What a balancer is asked, and how its answer is read.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Source {
    /// HAProxy's statistics page, asked for CSV (see [`crate::haproxy`]).
    #[serde(rename = "haproxy")]
    HaProxy {
        /// The statistics page (`stats uri`), such as `http://haproxy:8404/stats`;
        /// `;csv` is appended unless already there.
        url: String,
        /// Only this backend's servers count; every backend's when unset.
        #[serde(default)]
        backend: Option<String>,
    },
    /// Any HTTP URL answering JSON (see [`crate::json`]).
    #[serde(rename = "generic", rename_all = "camelCase")]
    Generic {
        /// The URL, such as `http://envoy-admin:9901/clusters?format=json`.
        url: String,
        /// Where the servers are: a JSON pointer whose `*` segments match every element.
        pointer: String,
        /// Where each server holds its address (a JSON pointer relative to it, or a
        /// member name); unset when each server is an address string.
        #[serde(default)]
        address_field: Option<String>,
        /// Where each server holds its port, for addresses written without one.
        #[serde(default)]
        port_field: Option<String>,
    },
}

impl Source {
    /// The URL as configured.
    pub fn url(&self) -> &str {
        match self {
            Self::HaProxy { url, .. } | Self::Generic { url, .. } => url,
        }
    }
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text)
        .map_err(|e| serde::de::Error::custom(format!("timeout {text:?}: {e}")))
}
