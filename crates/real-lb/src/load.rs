//! A load generator for a real load balancer: HTTP/1.1 GETs at a steady rate over a few
//! keep-alive connections, each answer counted by its status, each failure by its kind.
//!
//! [`Load::start`] sends one request every `1 / rate` seconds with at most
//! [`CONNECTIONS`] in flight (and so at most that many connections, kept alive between
//! requests); a tick that finds every connection busy waits for one, and ticks missed
//! meanwhile are skipped, not sent in a burst. Every run is bounded: it stops after
//! `max_requests`, after `max_duration`, at [`Load::stop`] or when `shutdown` is
//! cancelled, whichever comes first, and each request gives up after
//! [`REQUEST_TIMEOUT`]. [`Load::report`] reads the counts while it runs; [`Load::stop`]
//! and [`Load::finish`] wait for the requests in flight and give the final ones.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Requests in flight at once, and so keep-alive connections: enough that the rate holds
/// while some requests wait on HAProxy's retries (a second or more each), so that the
/// moments a pod leaves are sampled as densely as the rest; at 100 requests/s, 32 slots
/// cover requests of up to 320 ms before a tick is skipped.
pub const CONNECTIONS: usize = 32;
/// How long one request may take, answer body included: above HAProxy's slowest retry
/// path here (three retries with a one-second pause before each).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a kept-alive connection may sit idle before the client closes it: shorter than
/// HAProxy's `timeout client` (50 s here), as a client's idle timeout must be, or a request
/// can go out on a connection HAProxy is closing at that moment and fail with no answer.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Failure messages kept in a report, the first ones.
const KEPT_ERRORS: usize = 8;

/// A load that cannot be started.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The URL is not an `http://` URL with a host.
    #[error("{0:?} is not an http:// URL")]
    BadUrl(String),
    /// A rate, count or duration of zero: the load would never end or never start.
    #[error("a load needs a rate, a request count and a duration above zero")]
    Unbounded,
}

/// What a load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: u64,
    /// Answers by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests whose connection could not be made or broke before an answer.
    pub connection_errors: u64,
    /// Requests with no answer within [`REQUEST_TIMEOUT`].
    pub timeouts: u64,
    /// The first failures' messages.
    pub errors: Vec<String>,
}

impl LoadReport {
    /// Answers with a 2xx status.
    pub fn ok(&self) -> u64 {
        self.count(200..300)
    }

    /// Answers with a 5xx status.
    pub fn five_xx(&self) -> u64 {
        self.count(500..600)
    }

    /// Requests that got no answer.
    pub fn failed(&self) -> u64 {
        self.connection_errors + self.timeouts
    }

    fn count(&self, codes: std::ops::Range<u16>) -> u64 {
        self.statuses.range(codes).map(|(_, n)| n).sum()
    }

    fn fail(&mut self, message: String) {
        if self.errors.len() < KEPT_ERRORS {
            self.errors.push(message);
        }
    }
}

/// A running load; dropping it stops the requests at once.
#[derive(Debug)]
pub struct Load {
    report: Arc<Mutex<LoadReport>>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// The bounds and target of one run.
struct Run {
    uri: Uri,
    every: Duration,
    max_requests: u64,
    max_duration: Duration,
    stop: CancellationToken,
    report: Arc<Mutex<LoadReport>>,
}

impl Load {
    /// Starts sending GETs of `url` (see the module's documentation).
    pub fn start(
        url: &str,
        rate_per_sec: u32,
        max_requests: u64,
        max_duration: Duration,
        shutdown: CancellationToken,
    ) -> Result<Load, Error> {
        let uri: Uri = url.parse().map_err(|_| Error::BadUrl(url.to_string()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(Error::BadUrl(url.to_string()));
        }
        if rate_per_sec == 0 || max_requests == 0 || max_duration.is_zero() {
            return Err(Error::Unbounded);
        }
        let stop = shutdown.child_token();
        let report = Arc::new(Mutex::new(LoadReport::default()));
        let run = Run {
            uri,
            every: Duration::from_secs(1) / rate_per_sec,
            max_requests,
            max_duration,
            stop: stop.clone(),
            report: report.clone(),
        };
        let span = tracing::info_span!("load", url, rate_per_sec);
        let task = tokio::spawn(run.send().instrument(span));
        Ok(Load {
            report,
            stop,
            task: Some(task),
        })
    }

    /// The counts so far.
    pub fn report(&self) -> LoadReport {
        lock(&self.report).clone()
    }

    /// Stops sending, waits for the requests in flight, and gives the counts.
    pub async fn stop(mut self) -> LoadReport {
        self.stop.cancel();
        self.wait().await
    }

    /// Waits until the load reaches one of its bounds, then gives the counts.
    pub async fn finish(mut self) -> LoadReport {
        self.wait().await
    }

    async fn wait(&mut self) -> LoadReport {
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "load task failed");
        }
        self.report()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Run {
    async fn send(self) {
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(CONNECTIONS)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .build(HttpConnector::new());
        let slots = Arc::new(Semaphore::new(CONNECTIONS));
        let mut in_flight = JoinSet::new();
        let mut ticks = tokio::time::interval(self.every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let deadline = tokio::time::Instant::now() + self.max_duration;
        let mut sent = 0;
        while sent < self.max_requests {
            let slot = tokio::select! {
                () = self.stop.cancelled() => break,
                () = tokio::time::sleep_until(deadline) => break,
                slot = async {
                    ticks.tick().await;
                    slots.clone().acquire_owned().await
                } => slot,
            };
            let Ok(slot) = slot else { break };
            sent += 1;
            lock(&self.report).sent = sent;
            let (client, uri, report) = (client.clone(), self.uri.clone(), self.report.clone());
            in_flight.spawn(async move {
                let outcome = get(&client, uri).await;
                drop(slot);
                record(&report, outcome);
            });
            while in_flight.try_join_next().is_some() {}
        }
        while in_flight.join_next().await.is_some() {}
    }
}

/// How one request ended.
enum Outcome {
    Answer(u16),
    ConnectionError(String),
    Timeout,
}

async fn get(client: &Client<HttpConnector, Empty<Bytes>>, uri: Uri) -> Outcome {
    let started = Instant::now();
    let exchange = async {
        // A kept-alive connection the balancer closes as the request goes out brings no
        // answer and no error from the balancer, which never read the request: sent once
        // more on a fresh connection, as RFC 9112 §9.3.1 lets a client do with a GET.
        let response = match client.get(uri.clone()).await {
            Err(e) if closed_before_answer(&e) => client.get(uri).await?,
            answer => answer?,
        };
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(status)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
        Ok(Ok(status)) => Outcome::Answer(status),
        Ok(Err(e)) => Outcome::ConnectionError(format!(
            "after {:?}: {}",
            started.elapsed(),
            error_chain(&*e)
        )),
        Err(_) => Outcome::Timeout,
    }
}

fn record(report: &Mutex<LoadReport>, outcome: Outcome) {
    let mut report = lock(report);
    match outcome {
        Outcome::Answer(status) => *report.statuses.entry(status).or_default() += 1,
        Outcome::ConnectionError(message) => {
            report.connection_errors += 1;
            report.fail(message);
        }
        Outcome::Timeout => {
            report.timeouts += 1;
            report.fail(format!("no answer within {REQUEST_TIMEOUT:?}"));
        }
    }
}

/// Whether `e` is a connection that closed before any of the answer arrived.
fn closed_before_answer(e: &hyper_util::client::legacy::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<hyper::Error>())
        .is_some_and(hyper::Error::is_incomplete_message)
}

/// An error with its sources, `a: b: c`.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The report, even if a request task panicked while holding it: counts stay counts.
fn lock(report: &Mutex<LoadReport>) -> std::sync::MutexGuard<'_, LoadReport> {
    report.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_without_a_bound_or_an_http_url_are_refused() {
        let token = CancellationToken::new;
        let second = Duration::from_secs(1);
        assert_eq!(
            Load::start("http://127.0.0.1:1/", 0, 10, second, token()).err(),
            Some(Error::Unbounded)
        );
        assert_eq!(
            Load::start("http://127.0.0.1:1/", 10, 0, second, token()).err(),
            Some(Error::Unbounded)
        );
        assert_eq!(
            Load::start("http://127.0.0.1:1/", 10, 10, Duration::ZERO, token()).err(),
            Some(Error::Unbounded)
        );
        assert!(matches!(
            Load::start("https://127.0.0.1:1/", 10, 10, second, token()),
            Err(Error::BadUrl(_))
        ));
    }

    #[test]
    fn a_report_counts_answers_by_class() {
        let report = LoadReport {
            statuses: [(200, 5), (204, 1), (503, 2), (502, 1), (404, 3)].into(),
            connection_errors: 1,
            timeouts: 2,
            ..LoadReport::default()
        };
        assert_eq!((report.ok(), report.five_xx(), report.failed()), (6, 3, 3));
    }
}
