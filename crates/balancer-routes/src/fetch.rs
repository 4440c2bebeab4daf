//! One GET to a balancer, bounded: the whole exchange (token and CA read, connection,
//! answer) within the configured timeout, a 2xx status, a body of at most
//! [`MAX_ANSWER_BYTES`].
//!
//! The token file is read for every question, so a rotated token is sent at once; the
//! CA file too, and the HTTP client (whose connections are pooled between questions) is
//! rebuilt only when its content changed. Plain `http` URLs need no TLS roots at all.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Request, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::error::Error;

/// The largest answer read: HAProxy's CSV takes about 1 KiB a server and Envoy's
/// `/clusters` JSON about 2 KiB a host, so this holds thousands of servers while a
/// balancer that answers without end costs at most this much memory, however often it
/// is asked.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// What identifies this client to a balancer's access log.
const USER_AGENT: &str = concat!("graceful-drain-balancer-routes/", env!("CARGO_PKG_VERSION"));

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A balancer's 2xx answer.
pub(crate) struct Answer {
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// Asks one URL; see the module's head.
pub(crate) struct Fetcher {
    url: String,
    uri: Uri,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    timeout: Duration,
    client: Mutex<Option<Cached>>,
}

/// The client built for the CA file's content it was built with.
struct Cached {
    ca: Option<Vec<u8>>,
    client: HttpClient,
}

impl Fetcher {
    /// Checks the URL (`http` or `https`, a host, no credentials) and the timeout.
    pub(crate) fn new(
        url: String,
        token_file: Option<PathBuf>,
        ca_file: Option<PathBuf>,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let config = |reason: String| Error::Config {
            url: url.clone(),
            reason,
        };
        let uri: Uri = url.parse().map_err(|e| config(format!("not a URL: {e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(config("the URL is not http:// or https://".into())),
        };
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        if uri.host().is_none_or(str::is_empty) {
            return Err(config("the URL has no host".into()));
        }
        if authority.contains('@') {
            return Err(config(
                "credentials in the URL are not sent; use tokenFile".into(),
            ));
        }
        if ca_file.is_some() && !https {
            return Err(config("caFile is set but the URL is not https://".into()));
        }
        if timeout.is_zero() {
            return Err(config("the timeout is zero".into()));
        }
        Ok(Self {
            url,
            uri,
            token_file,
            ca_file,
            timeout,
            client: Mutex::new(None),
        })
    }

    /// The URL asked.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// GETs the URL; see the module's head.
    pub(crate) async fn get(&self) -> Result<Answer, Error> {
        let ask = async {
            let request = self.request().await?;
            let client = self.client().await?;
            exchange(&client, request, &self.url).await
        };
        tokio::time::timeout(self.timeout, ask)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    url: self.url.clone(),
                    timeout: self.timeout,
                })
            })
    }

    async fn request(&self) -> Result<Request<Empty<Bytes>>, Error> {
        let mut request = Request::get(self.uri.clone())
            .header(header::USER_AGENT, USER_AGENT)
            .body(Empty::new())
            .map_err(|e| Error::Config {
                url: self.url.clone(),
                reason: format!("not a request: {e}"),
            })?;
        if let Some(path) = &self.token_file {
            let value = bearer(path).await.map_err(|source| Error::Token {
                url: self.url.clone(),
                path: path.clone(),
                source,
            })?;
            request.headers_mut().insert(header::AUTHORIZATION, value);
        }
        Ok(request)
    }

    /// The client for the CA file's current content, built again when it changed.
    async fn client(&self) -> Result<HttpClient, Error> {
        let tls = |reason: String| Error::Tls {
            url: self.url.clone(),
            reason,
        };
        let ca = match &self.ca_file {
            Some(path) => Some(
                tokio::fs::read(path)
                    .await
                    .map_err(|e| tls(format!("read {}: {e}", path.display())))?,
            ),
            None => None,
        };
        let mut cached = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hit) = cached.as_ref().filter(|hit| hit.ca == ca) {
            return Ok(hit.client.clone());
        }
        let https = self.uri.scheme_str() == Some("https");
        let client = build_client(ca.as_deref(), self.ca_file.as_deref(), https).map_err(tls)?;
        *cached = Some(Cached {
            ca,
            client: client.clone(),
        });
        Ok(client)
    }
}

/// `Bearer <token>` from a token file, marked sensitive so it is never logged.
async fn bearer(path: &Path) -> std::io::Result<HeaderValue> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let token = tokio::fs::read_to_string(path).await?;
    let token = token.trim();
    if token.is_empty() {
        return Err(invalid("the file is empty"));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| invalid("the token is not a header value"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// A pooling client that speaks HTTP/1.1 over TCP or TLS (rustls, ring): trusting the
/// CA file's certificates when given, else the system's roots, else (plain `http`)
/// none.
fn build_client(
    ca: Option<&[u8]>,
    ca_file: Option<&Path>,
    https: bool,
) -> Result<HttpClient, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = HttpsConnectorBuilder::new();
    let builder = match (ca, https) {
        (Some(pem), _) => builder.with_tls_config(tls_config(provider, roots(pem, ca_file)?)?),
        (None, true) => builder
            .with_provider_and_native_roots(provider)
            .map_err(|e| format!("no caFile, and the system's CA certificates: {e}"))?,
        (None, false) => {
            builder.with_tls_config(tls_config(provider, rustls::RootCertStore::empty())?)
        }
    };
    let connector = builder.https_or_http().enable_http1().build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

fn roots(pem: &[u8], ca_file: Option<&Path>) -> Result<rustls::RootCertStore, String> {
    let name = ca_file
        .map(|path| path.display().to_string())
        .unwrap_or_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("{name}: {e}"))?;
        roots.add(cert).map_err(|e| format!("{name}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{name} holds no PEM certificate"));
    }
    Ok(roots)
}

fn tls_config(
    provider: Arc<rustls::crypto::CryptoProvider>,
    roots: rustls::RootCertStore,
) -> Result<rustls::ClientConfig, String> {
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Sends the request and reads a 2xx answer of at most [`MAX_ANSWER_BYTES`].
async fn exchange(
    client: &HttpClient,
    request: Request<Empty<Bytes>>,
    url: &str,
) -> Result<Answer, Error> {
    let response = client
        .request(request)
        .await
        .map_err(|source| Error::Request {
            url: url.to_string(),
            source,
        })?;
    let status = response.status();
    if !status.is_success() {
        return Err(Error::Status {
            url: url.to_string(),
            status,
        });
    }
    let too_large = || Error::TooLarge {
        url: url.to_string(),
        limit: MAX_ANSWER_BYTES,
    };
    let declared = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_ANSWER_BYTES as u64) {
        return Err(too_large());
    }
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|source| match source.downcast_ref::<LengthLimitError>() {
            Some(_) => too_large(),
            None => Error::Body {
                url: url.to_string(),
                source,
            },
        })?
        .to_bytes();
    Ok(Answer {
        headers: parts.headers,
        body,
    })
}
