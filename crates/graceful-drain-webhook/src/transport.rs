//! The HTTPS transport of the admission server, which knows nothing of admission: the
//! accept loop, the TLS handshake with [`crate::tls`]'s configuration, HTTP/1.1 or h2 on
//! each connection, and the bounds every connection lives under whatever arrives on the
//! port (handshake, header and idle timeouts, h2 keep-alive, at most so many connections
//! and requests at once). Graceful shutdown lets open connections finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use graceful_drain_core::runtime::Shutdown;

/// A TLS handshake that takes longer than this is dropped (slowloris protection).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A request whose headers have not all arrived this long after the connection was
/// accepted or its previous request answered is dropped, and with it the idle keep-alive
/// connection (3,000 half-sent requests must not stay open).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// h2 pings an idle connection this often and drops it when no answer comes within
/// [`H2_KEEPALIVE_TIMEOUT`]: a peer that vanished does not keep its streams.
const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`H2_KEEPALIVE_INTERVAL`].
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Streams one h2 connection may have open at once. kube-apiserver opens a connection per
/// webhook and spreads its calls over it; 250 covers a busy API server's held DELETEs
/// (bounded far lower by the hold slots) and its quick calls.
const H2_MAX_STREAMS: u32 = 250;

/// Connections served at once; one more is closed as soon as it is accepted. Each costs
/// a task, a TLS session and buffers (a few tens of KiB): 1,024 keep a replica well inside
/// its memory limit while a few API servers, probes and Prometheus need a handful.
pub const MAX_CONNECTIONS: usize = 1024;

/// Connections served at once from one address: kube-apiserver multiplexes its calls over
/// a few h2 connections per webhook, so 128 leave room for several API servers behind one
/// address, while one attacker's slow connections cannot take every slot of
/// [`MAX_CONNECTIONS`] from the API server.
pub const MAX_CONNECTIONS_PER_PEER: usize = 128;

/// One connection counted against its address until dropped.
struct PeerSlot {
    peers: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    ip: std::net::IpAddr,
}

impl PeerSlot {
    /// A slot for one more connection from `ip`, or `None` when it has
    /// [`MAX_CONNECTIONS_PER_PEER`].
    fn take(
        peers: &Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
        ip: std::net::IpAddr,
    ) -> Option<PeerSlot> {
        let mut table = peers.lock().unwrap_or_else(|e| e.into_inner());
        let open = table.entry(ip).or_insert(0);
        if *open >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *open += 1;
        Some(PeerSlot {
            peers: peers.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut table = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = table.get_mut(&self.ip) {
            *open -= 1;
            if *open == 0 {
                table.remove(&self.ip);
            }
        }
    }
}

/// Pause after a failed accept (e.g. out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Server errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listener failed.
    #[error("accept on {addr}")]
    Accept {
        /// The listener's local address.
        addr: SocketAddr,
        /// The operating system's error (one that a retry would not cure).
        #[source]
        source: std::io::Error,
    },
}

/// Serves `app` over TLS on `listener` until `shutdown`, then lets open connections finish
/// (their held reviews are answered at once by the shutdown signal).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT)
        .max_concurrent_streams(H2_MAX_STREAMS);
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let peers = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(source) if is_transient(&source) => {
                    tracing::warn!(error = %graceful_drain_core::error::chain(&source), "accept; retrying");
                    // Back off briefly so running out of descriptors is not a busy loop.
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
                Err(source) => return Err(Error::Accept { addr, source }),
            },
        };
        let Some(peer_slot) = PeerSlot::take(&peers, peer.ip()) else {
            tracing::warn!(%peer, max = MAX_CONNECTIONS_PER_PEER, "too many connections from this address; closing this one");
            drop(stream);
            continue;
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = MAX_CONNECTIONS, "too many connections; closing this one");
            drop(stream);
            continue;
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permits = (permit, peer_slot);
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, error = %graceful_drain_core::error::chain(&error), "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let conn = builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            if let Err(error) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %graceful_drain_core::error::chain(&*error), "connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut
    ) || error.raw_os_error() == Some(24) // EMFILE: too many open files, retry later
}

/// The request bodies (and what is parsed from them) one replica holds at once, in KiB:
/// the memory that a flood of large reviews can take. 32 MiB is nine of the largest reviews
/// kube-apiserver can send (see `DEFAULT_MAX_BODY` in the crate root) or two thousand
/// ordinary ones (a pod's review is about 10 KiB), well inside the chart's 256 MiB limit.
pub const BODY_BUDGET_KIB: usize = 32 * 1024;
/// What a request without a `Content-Length` (or a tiny one) is charged: a chunked body
/// may grow to the body limit, which [`axum::extract::DefaultBodyLimit`] enforces.
const MIN_CHARGE_KIB: usize = 16;
/// How long a request waits for its share of [`BODY_BUDGET_KIB`] before it is answered 503.
const BUDGET_WAIT: Duration = Duration::from_secs(5);
/// The longest a request may take, its body's arrival included: a held DELETE lasts at most
/// the API server's 30 s budget, so anything slower is a slow sender.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(35);

/// `app` behind the per-request bounds: a body declared larger than `max_body` is
/// answered 413 at once; any other takes its share of a [`BODY_BUDGET_KIB`] budget by
/// declared length (a body may not exceed what it declared, hyper checks) for as long as
/// it runs; and [`REQUEST_TIMEOUT`].
pub fn bounded(app: axum::Router, max_body: usize) -> axum::Router {
    let budget = Arc::new(tokio::sync::Semaphore::new(BODY_BUDGET_KIB));
    app.layer(axum::middleware::from_fn_with_state(
        (budget, max_body),
        limit,
    ))
}

async fn limit(
    axum::extract::State((budget, max_body)): axum::extract::State<(
        Arc<tokio::sync::Semaphore>,
        usize,
    )>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|bytes| bytes > max_body) {
        return (
            http::StatusCode::PAYLOAD_TOO_LARGE,
            format!("graceful-drain: request body over {max_body} bytes\n"),
        )
            .into_response();
    }
    let kib = declared.map_or(MIN_CHARGE_KIB, |bytes| {
        bytes.div_ceil(1024).max(MIN_CHARGE_KIB)
    });
    let kib = u32::try_from(kib.min(BODY_BUDGET_KIB)).unwrap_or(u32::MAX);
    let permit = match tokio::time::timeout(BUDGET_WAIT, budget.acquire_many_owned(kib)).await {
        Ok(Ok(permit)) => permit,
        _ => {
            tracing::warn!(kib, "request body budget exhausted; answering 503");
            return (
                http::StatusCode::SERVICE_UNAVAILABLE,
                "graceful-drain: too many large requests in flight; retry\n",
            )
                .into_response();
        }
    };
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await;
    drop(permit);
    answer.unwrap_or_else(|_| {
        (
            http::StatusCode::REQUEST_TIMEOUT,
            "graceful-drain: the request took too long\n",
        )
            .into_response()
    })
}
