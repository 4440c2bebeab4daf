//! The one error a [`crate::Lister`] returns: what failed, on which balancer URL. As
//! everywhere in graceful-drain, a message never embeds its cause; the cause is the
//! `#[source]`, and printers show the chain (`balancer http://…: answer is not JSON:
//! expected value at line 1 column 1`).

use std::path::PathBuf;
use std::time::Duration;

use crate::haproxy::CsvError;
use crate::json::JsonError;

/// Why a balancer could not be asked, or its answer not read. Every variant names the
/// balancer's URL.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot be used.
    #[error("balancer {url}: {reason}")]
    Config {
        /// The URL as configured.
        url: String,
        /// What is wrong (URL, path, field, timeout).
        reason: String,
    },
    /// The bearer token file could not be read, is empty or is not a header value.
    #[error("balancer {url}: read bearer token from {path}")]
    Token {
        /// The balancer's URL.
        url: String,
        /// The token file.
        path: PathBuf,
        /// What reading it reported.
        #[source]
        source: std::io::Error,
    },
    /// The CA file could not be read or holds no usable certificate, or the system's
    /// roots could not be loaded.
    #[error("balancer {url}: TLS roots: {reason}")]
    Tls {
        /// The balancer's URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// No complete answer within the configured timeout.
    #[error("balancer {url}: no answer within {timeout:?}")]
    Timeout {
        /// The balancer's URL.
        url: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The request failed: no connection, a TLS failure, a broken exchange.
    #[error("balancer {url}: request failed")]
    Request {
        /// The balancer's URL.
        url: String,
        /// What the HTTP client reported.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// The balancer answered with a status other than 2xx.
    #[error("balancer {url}: answered HTTP {status}")]
    Status {
        /// The balancer's URL.
        url: String,
        /// The status it answered.
        status: hyper::StatusCode,
    },
    /// The answer's body is larger than [`crate::MAX_ANSWER_BYTES`].
    #[error("balancer {url}: answer is larger than {limit} bytes")]
    TooLarge {
        /// The balancer's URL.
        url: String,
        /// The bound.
        limit: usize,
    },
    /// The answer's body broke off.
    #[error("balancer {url}: reading the answer")]
    Body {
        /// The balancer's URL.
        url: String,
        /// What reading it reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The answer is one page of several (an `X-Next-Page` header, as Traefik's API
    /// sends): the servers on the other pages would be missed.
    #[error(
        "balancer {url}: answer is one page of several (X-Next-Page: {next}); ask for one page holding all"
    )]
    Paginated {
        /// The balancer's URL.
        url: String,
        /// The header's value.
        next: String,
    },
    /// The answer is not HAProxy statistics CSV, or names servers that cannot be read.
    #[error("balancer {url}: answer is not usable HAProxy statistics CSV")]
    Csv {
        /// The balancer's URL.
        url: String,
        /// What is wrong with it.
        #[source]
        source: CsvError,
    },
    /// The answer is not JSON.
    #[error("balancer {url}: answer is not JSON")]
    NotJson {
        /// The balancer's URL.
        url: String,
        /// What the JSON parser reported.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON answer holds no servers where configured, or servers that cannot be read.
    #[error("balancer {url}: answer does not list servers as configured")]
    Json {
        /// The balancer's URL.
        url: String,
        /// What is wrong with it.
        #[source]
        source: JsonError,
    },
}
