//! [`Lister`]: a configured balancer, asked on demand. A question is one GET
//! ([`crate::fetch`]) and one read of the answer ([`crate::haproxy`] for CSV,
//! [`crate::json`] for JSON) into [`Routes`]; nothing is cached between questions.

use tracing::Instrument;

use crate::config::{BalancerConfig, Source};
use crate::error::Error;
use crate::fetch::{Answer, Fetcher};
use crate::haproxy;
use crate::json::{Field, JsonSpec, Path};
use crate::routes::Routes;

/// Asks one balancer which servers it routes to.
pub struct Lister {
    fetcher: Fetcher,
    reader: Reader,
}

/// How an answer is read.
enum Reader {
    HaProxy { backend: Option<String> },
    Json(JsonSpec),
}

impl Lister {
    /// Checks `config` (URL, path, fields, timeout); nothing is asked yet.
    pub fn new(config: &BalancerConfig) -> Result<Self, Error> {
        let (url, reader) = match &config.source {
            Source::HaProxy { url, backend } => {
                let url = if url.contains(";csv") {
                    url.clone()
                } else {
                    format!("{url};csv")
                };
                let backend = backend.clone();
                (url, Reader::HaProxy { backend })
            }
            Source::Generic {
                url,
                pointer,
                address_field,
                port_field,
            } => (
                url.clone(),
                Reader::Json(json_spec(url, pointer, address_field, port_field)?),
            ),
        };
        let fetcher = Fetcher::new(
            url,
            config.token_file.clone(),
            config.ca_file.clone(),
            config.timeout,
        )?;
        Ok(Self { fetcher, reader })
    }

    /// The URL asked (for HAProxy, with `;csv`).
    pub fn url(&self) -> &str {
        self.fetcher.url()
    }

    /// The addresses the balancer routes to now.
    pub async fn routes(&self) -> Result<Routes, Error> {
        let span = tracing::debug_span!("balancer_routes", url = %self.url());
        async {
            let answer = self.fetcher.get().await?;
            let routes = self.read(&answer)?;
            tracing::debug!(addresses = routes.len(), "balancer answered");
            Ok(routes)
        }
        .instrument(span)
        .await
    }

    fn read(&self, answer: &Answer) -> Result<Routes, Error> {
        let url = || self.url().to_string();
        match &self.reader {
            Reader::HaProxy { backend } => {
                let csv = String::from_utf8_lossy(&answer.body);
                haproxy::parse_stats(&csv, backend.as_deref())
                    .map_err(|source| Error::Csv { url: url(), source })
            }
            Reader::Json(spec) => {
                if let Some(next) = next_page(answer) {
                    return Err(Error::Paginated { url: url(), next });
                }
                let value: serde_json::Value = serde_json::from_slice(&answer.body)
                    .map_err(|source| Error::NotJson { url: url(), source })?;
                spec.routes(&value)
                    .map_err(|source| Error::Json { url: url(), source })
            }
        }
    }
}

/// Traefik's API pages its lists (100 to a page unless `per_page` says otherwise) and
/// names the next page in `X-Next-Page`, `1` on the last one.
fn next_page(answer: &Answer) -> Option<String> {
    let next = answer.headers.get("x-next-page")?;
    let next = String::from_utf8_lossy(next.as_bytes()).trim().to_string();
    (!next.is_empty() && next != "1").then_some(next)
}

fn json_spec(
    url: &str,
    pointer: &str,
    address_field: &Option<String>,
    port_field: &Option<String>,
) -> Result<JsonSpec, Error> {
    let config = |source: crate::json::JsonError| Error::Config {
        url: url.to_string(),
        reason: source.to_string(),
    };
    let field = |text: &Option<String>| text.as_deref().map(Field::parse).transpose();
    Ok(JsonSpec {
        path: Path::parse(pointer).map_err(config)?,
        address_field: field(address_field).map_err(config)?,
        port_field: field(port_field).map_err(config)?,
    })
}
