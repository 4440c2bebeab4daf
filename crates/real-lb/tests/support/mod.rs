//! What the suites share: the binaries or a skip, and a tiny HTTP server standing in for
//! a pod.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// What `find` gives (a binary, the control plane's options), or `None` after saying why
/// the test is skipped; in CI (`CI` set) a missing one fails the test, as the real tier's
/// control plane does.
pub fn available<T, E: std::fmt::Display>(find: impl FnOnce() -> Result<T, E>) -> Option<T> {
    match find() {
        Ok(path) => Some(path),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "CI must provide it: {e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// An HTTP/1.1 server answering every request `200 <name>` on keep-alive connections,
/// counting them; [`Pod::stop`] (or dropping it) closes the listener and every connection.
pub struct Pod {
    pub addr: SocketAddr,
    served: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Pod {
    pub async fn start(addr: SocketAddr, name: &'static str) -> Pod {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let (count, accepted) = (served.clone(), connections.clone());
        let task = tokio::spawn(async move {
            let mut open = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, Ordering::Relaxed);
                let count = count.clone();
                let service = service_fn(move |_: Request<hyper::body::Incoming>| {
                    count.fetch_add(1, Ordering::Relaxed);
                    async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(name)))) }
                });
                open.spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
                while open.try_join_next().is_some() {}
            }
        });
        Pod {
            addr,
            served,
            connections,
            task,
        }
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Closes the listener and every connection: the pod's process is gone.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.task.abort();
    }
}
