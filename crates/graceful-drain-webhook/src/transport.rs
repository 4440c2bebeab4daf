//! The HTTPS transport of the admission server, which knows nothing of admission: the
//! accept loop, the TLS handshake with [`crate::tls`]'s configuration, HTTP/1.1 or h2 on
//! each connection, and the bounds every connection lives under whatever arrives on the
//! port (handshake, header and idle timeouts, h2 keep-alive, at most so many connections
//! and requests at once). Graceful shutdown lets open connections finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use graceful_drain_core::runtime::Shutdown;

/// A TLS handshake that takes longer than this is dropped (slowloris protection).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
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
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
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
