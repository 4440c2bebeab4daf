//! Pods as real HTTP servers, so that a real load balancer (the real tier's HAProxy) can
//! route to the apps of [`crate::traffic::apps`].
//!
//! With a [`PodNet`] the kubelet opens a listener for a pod once its app accepts and the
//! pod has an IP, on the cluster's pod port and on the IP's [loopback twin] — the pod IP
//! with its first octet made 127 (`10.64.1.2` → `127.64.1.2`). Pod IPs themselves stay
//! out of loopback (KWOK's `10.64.0.0/12`, the `POD_CIDR` of the kwok module; the simulated
//! kubelets' `10.(100 + n).x.y`) because kube-apiserver refuses loopback addresses in
//! EndpointSlices; whatever routes to a pod (the real tier's load balancer) dials the
//! twin, and nothing but a loopback address is ever bound ([`Error::NotLoopback`]). The
//! kubelet drives the listener where it drives the app registry:
//! [`PodNet::close_listener`] when the app stops accepting, [`PodNet::close_idle`] when a
//! graceful app closes its idle connections, [`PodNet::kill`] when the process exits or
//! the pod disappears.
//!
//! Each TCP connection is a connection of the registry — [`Apps::connect`] when it is
//! accepted, [`Apps::send`] and [`Apps::finish`] for each request, [`Apps::disconnect`]
//! when it ends — rather than a stream of [`Apps::begin`]s: `begin` stands for a request
//! on a fresh connection and is refused once the app stops accepting, whereas a server
//! that closed its listener still answers on the connections it accepted before, as this
//! one does. A request the registry lets through is answered `200` with the pod's
//! `ns/name`. One it refuses ([`SendError`]: the app closed this connection or died
//! meanwhile) is not answered at all: the connection is closed, as a real server's socket
//! would be; a connection the app does not take ([`Refusal`], a race with the listener's
//! closing) is closed at once. Nothing is answered `503`: an app that is gone answers
//! nothing. The ticket is finished before the response is written, so an exit that
//! follows the last `finish` within microseconds can still cut that response.
//!
//! Tasks: one accept loop per pod and one task per connection, each an owned task of the
//! crate (`spawn_owned`) stopped by the pod's token, a child of the cluster's shutdown
//! token that [`PodNet::kill`] cancels. A pod holds at most [`MAX_CONNECTIONS`]
//! connections (the rest wait in the kernel's backlog) and a connection waits at most
//! [`HEADER_READ_TIMEOUT`] for a request's head.
//!
//! [`Refusal`]: crate::traffic::apps::Refusal
//! [loopback twin]: loopback_twin

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::poll_fn;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::task::spawn_owned;
use crate::traffic::apps::{Apps, ConnId, SendError};

/// Connections one pod holds at once: far above what a test's traffic or a load
/// balancer's connection pool opens to one pod (tens), low enough that a runaway client
/// cannot exhaust the process's file descriptors across a cluster's pods.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send a request's head. hyper runs this timer while
/// a keep-alive connection waits for its next request too, so it is also the idle
/// timeout: a minute, longer than any scenario keeps a connection idle and than the
/// idle timeouts of load balancers' server-side pools (HAProxy closes idle server
/// connections it does not reuse within seconds).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause after a failed accept (out of file descriptors, say) before the next one, so a
/// persistent failure does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why a pod's listener could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address is not a loopback one; pods listen on loopback addresses only.
    #[error("open pod {pod}: {ip} is not a loopback address (pods listen on loopback only)")]
    NotLoopback {
        /// The pod (`ns/name`, or its UID when the app registry does not know it).
        pod: String,
        /// The refused address.
        ip: IpAddr,
    },
    /// The pod already listens, on another address.
    #[error("open pod {pod}: already listening on {addr}")]
    AlreadyOpen {
        /// The pod.
        pod: String,
        /// Where it listens.
        addr: SocketAddr,
    },
    /// Binding the address failed (in use by a pod not yet killed, say).
    #[error("open pod {pod}: bind {addr}")]
    Bind {
        /// The pod.
        pod: String,
        /// The address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// No free port could be found for the pods.
    #[error("pick a port for the pods on 127.0.0.1")]
    PickPort(#[source] io::Error),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the pod of `ip` listens: `ip` with its first octet made 127, so that distinct
/// pod IPs of one `/8` (every pod CIDR we use) have distinct twins. An IPv6 address has
/// none unless it is the loopback address itself.
pub fn loopback_twin(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v4) => {
            let [_, b, c, d] = v4.octets();
            Some(IpAddr::V4(Ipv4Addr::new(127, b, c, d)))
        }
        IpAddr::V6(v6) => v6.is_loopback().then_some(ip),
    }
}

/// The pods' listeners, keyed by pod UID. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PodNet {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    apps: Apps,
    port: u16,
    shutdown: CancellationToken,
    pods: Mutex<HashMap<String, Server>>,
}

/// A listener shared by the pod's entry (which closes it) and its accept loop.
type Slot = Arc<Mutex<Option<TcpListener>>>;

/// One pod's server.
#[derive(Debug)]
struct Server {
    addr: SocketAddr,
    listener: Slot,
    /// Ends the accept loop (the listener itself is closed by taking it from its slot).
    stop_accepting: CancellationToken,
    /// Asks every connection to shut down gracefully.
    closing: CancellationToken,
    /// Ends every task of the pod; a child of the cluster's shutdown token.
    killed: CancellationToken,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked mid-update of plain data.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl PodNet {
    /// Pods whose apps live in `apps` listen on `port`; `0` picks a port that is free on
    /// 127.0.0.1 now, so that clusters side by side on one host — every KWOK hands out
    /// the same addresses — do not collide. Every task stops on `shutdown`.
    pub fn new(apps: Apps, port: u16, shutdown: CancellationToken) -> Result<PodNet> {
        let port = match port {
            0 => std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .map_err(Error::PickPort)?
                .port(),
            port => port,
        };
        let shared = Shared {
            apps,
            port,
            shutdown,
            pods: Mutex::new(HashMap::new()),
        };
        Ok(PodNet {
            shared: Arc::new(shared),
        })
    }

    /// The port the pods listen on.
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// Where the pod of `uid` accepts connections now: `None` before it is opened and
    /// once its listener is closed.
    pub fn listening(&self, uid: &str) -> Option<SocketAddr> {
        let pods = lock(&self.shared.pods);
        let server = pods.get(uid)?;
        lock(&server.listener).as_ref().map(|_| server.addr)
    }

    /// Opens the listener of the pod of `uid` on `ip:port` (`port` 0: one the kernel
    /// picks) and serves it; returns the address bound. Idempotent for the same address.
    /// Refuses any address that is not a loopback one. Call it inside a Tokio runtime.
    pub fn open(&self, uid: &str, ip: IpAddr, port: u16) -> Result<SocketAddr> {
        let shared = &self.shared;
        let pod = shared.apps.pod(uid).unwrap_or_else(|| uid.to_string());
        if !ip.is_loopback() {
            return Err(Error::NotLoopback { pod, ip });
        }
        let mut pods = lock(&shared.pods);
        if let Some(server) = pods.get(uid) {
            let same = server.addr.ip() == ip && (port == 0 || server.addr.port() == port);
            if same {
                return Ok(server.addr);
            }
            return Err(Error::AlreadyOpen {
                pod,
                addr: server.addr,
            });
        }
        let requested = SocketAddr::new(ip, port);
        let bind_err = |source| Error::Bind {
            pod: pod.clone(),
            addr: requested,
            source,
        };
        // std sets SO_REUSEADDR, so connections of a pod that had this address before
        // (TIME_WAIT, or still draining) do not stand in the way; a listener does.
        let listener = std::net::TcpListener::bind(requested).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let listener = TcpListener::from_std(listener).map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let killed = shared.shutdown.child_token();
        let server = Server {
            addr,
            listener: Arc::new(Mutex::new(Some(listener))),
            stop_accepting: killed.child_token(),
            closing: killed.child_token(),
            killed,
        };
        let acceptor = Acceptor {
            uid: uid.to_string(),
            pod: Arc::from(pod.as_str()),
            apps: shared.apps.clone(),
            listener: server.listener.clone(),
            stop: server.stop_accepting.clone(),
            closing: server.closing.clone(),
            killed: server.killed.clone(),
            limit: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            shutdown: shared.shutdown.clone(),
        };
        let span = tracing::info_span!("pod-server", %pod, %addr);
        spawn_owned(
            "pod-listener",
            shared.shutdown.clone(),
            acceptor.run().instrument(span),
        );
        pods.insert(uid.to_string(), server);
        Ok(addr)
    }

    /// The pod's app closes its listener: the socket is closed now, so new connections
    /// are refused by the kernel (and those waiting in its backlog reset); connections
    /// already accepted go on. Returns whether it was listening.
    pub fn close_listener(&self, uid: &str) -> bool {
        let pods = lock(&self.shared.pods);
        let Some(server) = pods.get(uid) else {
            return false;
        };
        server.stop_accepting.cancel();
        // Dropped here: the socket is closed before this returns.
        lock(&server.listener).take().is_some()
    }

    /// The pod's app shuts its connections down gracefully, as hyper's graceful shutdown
    /// does: idle keep-alive connections are closed now, a busy one once its response is
    /// written. Returns whether the pod has a server.
    pub fn close_idle(&self, uid: &str) -> bool {
        let pods = lock(&self.shared.pods);
        let Some(server) = pods.get(uid) else {
            return false;
        };
        server.closing.cancel();
        true
    }

    /// The pod's process is gone: its listener and every connection are closed at once,
    /// answered or not. Returns whether the pod had a server.
    pub fn kill(&self, uid: &str) -> bool {
        let Some(server) = lock(&self.shared.pods).remove(uid) else {
            return false;
        };
        lock(&server.listener).take();
        server.killed.cancel();
        true
    }
}

/// The accept loop of one pod and what its connections need.
struct Acceptor {
    uid: String,
    pod: Arc<str>,
    apps: Apps,
    listener: Slot,
    stop: CancellationToken,
    closing: CancellationToken,
    killed: CancellationToken,
    limit: Arc<Semaphore>,
    shutdown: CancellationToken,
}

impl Acceptor {
    /// Accepts until the listener is closed or the pod killed, then closes the listener.
    async fn run(self) -> Result<(), Infallible> {
        loop {
            let permit = tokio::select! {
                biased;
                _ = self.stop.cancelled() => break,
                permit = self.limit.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                biased;
                _ = self.stop.cancelled() => break,
                accepted = poll_fn(|cx| poll_accept(&self.listener, cx)) => accepted,
            };
            match accepted {
                None => break,
                Some(Ok((stream, peer))) => self.admit(stream, peer, permit),
                Some(Err(error)) => {
                    tracing::debug!(%error, "accept failed");
                    tokio::select! {
                        _ = self.stop.cancelled() => break,
                        _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
            }
        }
        // Stopped by the cluster's shutdown, the listener is still in its slot.
        lock(&self.listener).take();
        Ok(())
    }

    /// Serves `stream` as a connection of the registry, or closes it if the app takes none.
    fn admit(&self, stream: TcpStream, peer: SocketAddr, permit: OwnedSemaphorePermit) {
        let id = match self.apps.connect(&self.uid) {
            Ok(id) => id,
            Err(refusal) => {
                tracing::debug!(?refusal, %peer, "the app takes no connection; closed");
                return;
            }
        };
        let connection = Connection {
            pod: self.pod.clone(),
            closing: self.closing.clone(),
            killed: self.killed.clone(),
            registered: Registered {
                apps: self.apps.clone(),
                id,
            },
            _permit: permit,
        };
        let span = tracing::debug_span!("connection", %peer);
        spawn_owned(
            "pod-connection",
            self.shutdown.clone(),
            connection.serve(stream).instrument(span),
        );
    }
}

/// Polls the listener in `slot`; `None` once it has been taken out (closed).
fn poll_accept(
    slot: &Slot,
    cx: &mut Context<'_>,
) -> Poll<Option<io::Result<(TcpStream, SocketAddr)>>> {
    match lock(slot).as_ref() {
        Some(listener) => listener.poll_accept(cx).map(Some),
        None => Poll::Ready(None),
    }
}

/// A connection's entry in the registry, removed when the connection ends.
struct Registered {
    apps: Apps,
    id: ConnId,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.apps.disconnect(self.id);
    }
}

/// One accepted connection.
struct Connection {
    pod: Arc<str>,
    closing: CancellationToken,
    killed: CancellationToken,
    registered: Registered,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    /// Serves HTTP/1.1 with keep-alive until the client leaves, a graceful shutdown ends
    /// the connection or the pod is killed (which drops the socket unanswered).
    async fn serve(self, stream: TcpStream) -> Result<(), Infallible> {
        let (apps, id, pod) = (
            self.registered.apps.clone(),
            self.registered.id,
            self.pod.clone(),
        );
        let service = service_fn(move |_: Request<Incoming>| {
            let answer = answer(&apps, id, &pod);
            async move { answer }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let mut conn = std::pin::pin!(conn);
        let mut closing = false;
        loop {
            tokio::select! {
                biased;
                _ = self.killed.cancelled() => break,
                _ = self.closing.cancelled(), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                done = conn.as_mut() => {
                    if let Err(error) = done {
                        tracing::debug!(%error, "connection ended");
                    }
                    break;
                }
            }
        }
        Ok(())
    }
}

/// Why a request was not answered; hyper then closes the connection without a response.
#[derive(Debug, thiserror::Error)]
enum Unanswered {
    /// The registry refused the request on this connection.
    #[error("the app closed the connection or is gone ({0:?})")]
    Refused(SendError),
    /// The app died while the request was in flight.
    #[error("the app died before answering")]
    Died,
}

/// The answer to a request on registry connection `id`: `200` naming `pod` when the app
/// takes and finishes it.
fn answer(apps: &Apps, id: ConnId, pod: &str) -> Result<Response<Full<Bytes>>, Unanswered> {
    let ticket = apps.send(id).map_err(Unanswered::Refused)?;
    if !apps.finish(ticket) {
        return Err(Unanswered::Died);
    }
    Ok(Response::new(Full::new(Bytes::from(format!("{pod}\n")))))
}

#[cfg(test)]
mod tests;
