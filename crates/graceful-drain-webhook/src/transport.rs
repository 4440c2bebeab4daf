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
/// connection (3,000 half-sent requests must not stay open). The same bound holds between
/// the TLS handshake and the first request on either protocol: a connection that
/// completed TLS and sends nothing (or no whole h2 preface) is closed after it.
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

/// Connections served at once. Each costs a task, a TLS session and buffers (a few tens
/// of KiB): 1,024 keep a replica well inside its memory limit while a few API servers,
/// probes and Prometheus need a handful. When every slot is taken, the connection idle
/// longest (no request in flight: never served, or quiet since its last answer) is closed
/// to make room, so connections that merely stay open cannot
/// keep an API server out; one that finds no idle connection to replace is closed.
pub const MAX_CONNECTIONS: usize = 1024;

/// How long an accepted connection waits for the slot a closed idle one frees.
const SLOT_WAIT: Duration = Duration::from_millis(100);

/// What a connection is doing, for [`Table::close_idlest`].
#[derive(Debug, Default)]
struct Activity {
    /// Requests started and not yet answered.
    in_flight: std::sync::atomic::AtomicUsize,
    /// When a request last started or was answered (or the connection was accepted), in
    /// milliseconds since the table was made.
    last: std::sync::atomic::AtomicU64,
    /// Set once the connection was told to close.
    closing: std::sync::atomic::AtomicBool,
    /// Told when the connection must close.
    close: tokio::sync::Notify,
}

/// The connections being served.
struct Table {
    epoch: std::time::Instant,
    open: std::sync::Mutex<(u64, std::collections::HashMap<u64, Arc<Activity>>)>,
}

impl Table {
    fn new() -> Arc<Table> {
        Arc::new(Table {
            epoch: std::time::Instant::now(),
            open: std::sync::Mutex::new((0, std::collections::HashMap::new())),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Adds a connection, removed when the returned entry is dropped.
    fn enter(self: &Arc<Table>) -> Entry {
        let activity = Arc::new(Activity::default());
        activity
            .last
            .store(self.now(), std::sync::atomic::Ordering::Relaxed);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 += 1;
        let id = open.0;
        open.1.insert(id, activity.clone());
        Entry {
            table: self.clone(),
            id,
            activity,
        }
    }

    /// Tells the connection with no request in flight that has been idle longest to
    /// close; `false` when every connection has a request in flight.
    fn close_idlest(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let idlest = open
            .1
            .values()
            .filter(|a| a.in_flight.load(Relaxed) == 0 && !a.closing.load(Relaxed))
            .min_by_key(|a| a.last.load(Relaxed));
        match idlest {
            Some(activity) => {
                activity.closing.store(true, Relaxed);
                activity.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// A connection's place in the [`Table`].
struct Entry {
    table: Arc<Table>,
    id: u64,
    activity: Arc<Activity>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|e| e.into_inner());
        open.1.remove(&self.id);
    }
}

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
    let builder = http_builder();
    let slots = Slots {
        connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        peers: Arc::default(),
        table: Table::new(),
        refusals: crate::throttle::Throttle::new(crate::throttle::REFUSED_CONNECTION_LOGS),
    };
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
        let Some(held) = slots.take(peer).await else {
            continue;
        };
        let connection = Connection {
            stream,
            peer,
            acceptor: acceptor.clone(),
            builder: builder.clone(),
            app: app.clone(),
            watcher: graceful.watcher(),
        };
        tokio::spawn(connection.serve(held));
    }
    graceful.shutdown().await;
    Ok(())
}

/// HTTP/1.1 and h2 with their timers and bounds.
fn http_builder() -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
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
    builder
}

/// The connection slots of the replica and of each address.
struct Slots {
    connections: Arc<tokio::sync::Semaphore>,
    peers: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    table: Arc<Table>,
    /// Anyone can open connections as fast as they like: a few lines, then a count.
    refusals: crate::throttle::Throttle,
}

/// What a served connection holds until it ends.
struct Held {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _peer: PeerSlot,
    entry: Entry,
}

impl Slots {
    /// A slot for a connection from `peer`: its address's, and one of the replica's (the
    /// idlest connection closed to make room when all are taken); `None`, logged, when
    /// there is none.
    async fn take(&self, peer: SocketAddr) -> Option<Held> {
        let Some(peer_slot) = PeerSlot::take(&self.peers, peer.ip()) else {
            self.refused(
                peer,
                MAX_CONNECTIONS_PER_PEER,
                "too many connections from this address",
            );
            return None;
        };
        let permit = match self.connections.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) if self.table.close_idlest() => {
                let freed = self.connections.clone().acquire_owned();
                match tokio::time::timeout(SLOT_WAIT, freed).await {
                    Ok(Ok(permit)) => permit,
                    _ => {
                        self.refused(peer, MAX_CONNECTIONS, "too many connections");
                        return None;
                    }
                }
            }
            Err(_) => {
                self.refused(
                    peer,
                    MAX_CONNECTIONS,
                    "too many connections, each with a request in flight",
                );
                return None;
            }
        };
        Some(Held {
            _permit: permit,
            _peer: peer_slot,
            entry: self.table.enter(),
        })
    }

    fn refused(&self, peer: SocketAddr, max: usize, why: &str) {
        if let crate::throttle::Admit::Yes { dropped } =
            self.refusals.admit("", tokio::time::Instant::now())
        {
            tracing::warn!(%peer, max, dropped, "{why}; closing this one (dropped: not logged since the last)");
        }
    }
}

/// One accepted connection, to be served.
struct Connection {
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    builder: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    app: axum::Router,
    watcher: hyper_util::server::graceful::Watcher,
}

impl Connection {
    /// Serves the connection: TLS within [`HANDSHAKE_TIMEOUT`], a first request within
    /// [`HEADER_TIMEOUT`], then requests until it ends, shutdown drains it, or it is closed
    /// as the idlest for a new one.
    async fn serve(self, held: Held) {
        let Connection {
            stream,
            peer,
            acceptor,
            builder,
            app,
            watcher,
        } = self;
        let activity = held.entry.activity.clone();
        // Set when the connection's first request reaches the app: until then the
        // connection lives at most HEADER_TIMEOUT past its handshake.
        let served = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let service = counted(app, peer, &held.entry, served.clone());
        let serving = async move {
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
            let silent = async {
                tokio::time::sleep(HEADER_TIMEOUT).await;
                if served.load(std::sync::atomic::Ordering::Acquire) {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                ended = watcher.watch(conn) => if let Err(error) = ended {
                    tracing::debug!(%peer, error = %graceful_drain_core::error::chain(&*error), "connection ended with an error");
                },
                () = silent => tracing::debug!(%peer, "no request within {}s of the handshake; closing", HEADER_TIMEOUT.as_secs()),
            }
        };
        tokio::select! {
            () = serving => {}
            () = activity.close.notified() => tracing::debug!(%peer, "idle longest while every slot was taken; closed for a new connection"),
        }
        drop(held);
    }
}

/// `app` for one connection from `peer`: each request carries the [`Peer`], marks the
/// connection `served`, and counts as in flight in its `entry` until answered.
fn counted(
    app: axum::Router,
    peer: SocketAddr,
    entry: &Entry,
    served: Arc<std::sync::atomic::AtomicBool>,
) -> TowerToHyperService<
    impl tower::Service<
        http::Request<hyper::body::Incoming>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
> {
    use std::sync::atomic::Ordering::{Relaxed, Release};
    let (started, answered) = (entry.activity.clone(), entry.activity.clone());
    let (table, table2) = (entry.table.clone(), entry.table.clone());
    let app = tower::ServiceExt::<http::Request<hyper::body::Incoming>>::map_response(
        app,
        move |response: axum::response::Response| {
            answered.in_flight.fetch_sub(1, Relaxed);
            answered.last.store(table2.now(), Relaxed);
            response
        },
    );
    TowerToHyperService::new(tower::ServiceExt::map_request(
        app,
        move |mut request: http::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(Peer(peer.ip()));
            served.store(true, Release);
            started.in_flight.fetch_add(1, Relaxed);
            started.last.store(table.now(), Relaxed);
            request
        },
    ))
}

fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut
    ) || error.raw_os_error() == Some(24) // EMFILE: too many open files, retry later
}

/// The request bodies, and what is parsed from them, one replica holds at once, in bytes:
/// the memory a flood of large or intricate reviews can take. 64 MiB is a few of the
/// largest reviews kube-apiserver can send (see `DEFAULT_MAX_BODY` in the crate root) or
/// hundreds of ordinary ones, inside the chart's 256 MiB limit beside the caches.
pub const BODY_BUDGET: usize = 64 * 1024 * 1024;
/// What the requests from one address may hold of [`BODY_BUDGET`] at once: one of the
/// largest reviews with the most intricate pod (`review::MAX_VALUES`), or every held
/// DELETE of an API server several times over. A client past it gets 503 at once, so
/// taking the whole budget needs four addresses, and an API server's reviews, which
/// hold a small part of its share, are not kept waiting by one address's flood.
pub const PEER_SHARE: usize = BODY_BUDGET / 4;
/// How long a request waits for its share of [`BODY_BUDGET`] before it is answered 503.
pub const BUDGET_WAIT: Duration = Duration::from_secs(5);
/// How long a request's body may take to arrive once its headers have: kube-apiserver
/// sends a review's body at once, so a body still arriving after this is a slow sender's.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a request may take, its body's arrival included: a held DELETE lasts at most
/// the API server's 30 s budget, so anything slower is a slow sender.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(35);

/// The address a request came from, among its extensions.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::IpAddr);

/// Bytes held per address.
type Shares = Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// A replica's [`BODY_BUDGET`], shared by every request, with each address's part of it
/// bounded by [`PEER_SHARE`]: what a request has read and what it built from that is taken
/// from it, and given back when the request is done. It is charged by what arrives, never
/// by what a request declares: a client that declares 3 MiB and sends one byte holds one
/// byte.
///
/// When the budget is taken, a request that needs more stops the bodies still arriving
/// from the address that holds the most, if that address holds more than the request's
/// own would: those requests get 503 and their bytes go back. Addresses enough to take the
/// whole budget (four sending full-size bodies) therefore cannot keep out one that holds
/// less than each of them, as an API server's reviews do.
#[derive(Clone, Debug)]
pub struct Budget {
    all: Arc<tokio::sync::Semaphore>,
    shares: Shares,
    readers: Arc<std::sync::Mutex<Readers>>,
}

/// How often a request waiting for the budget looks again for bodies to stop.
const STOP_EVERY: Duration = Duration::from_millis(100);

/// Bodies being read, each with its address and the signal that stops it.
#[derive(Debug, Default)]
struct Readers {
    next: u64,
    live: std::collections::HashMap<u64, (Option<std::net::IpAddr>, Arc<tokio::sync::Notify>)>,
}

/// One body being read, known to its [`Budget`] until dropped.
struct Reading {
    readers: Arc<std::sync::Mutex<Readers>>,
    id: u64,
    stop: Arc<tokio::sync::Notify>,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        readers.live.remove(&self.id);
    }
}

/// Bytes taken from a [`Budget`] for one address; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    share: Option<Share>,
}

/// The part of a [`Charge`] counted against its address.
#[derive(Debug)]
struct Share {
    shares: Shares,
    peer: std::net::IpAddr,
    bytes: usize,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut table = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = table.get_mut(&self.peer) {
            *held = held.saturating_sub(self.bytes);
            if *held == 0 {
                table.remove(&self.peer);
            }
        }
    }
}

/// The budget or an address's share of it could not give what a request asked for.
#[derive(Debug, thiserror::Error)]
pub enum Exhausted {
    /// The replica's budget stayed taken for [`BUDGET_WAIT`], or the request asked for
    /// more than it all.
    #[error(
        "the replica's request budget ({BODY_BUDGET} bytes) is taken: {wanted} bytes more not available"
    )]
    Budget {
        /// What the request asked for.
        wanted: usize,
    },
    /// The requests from the same address hold their whole share.
    #[error(
        "the requests from {peer} hold their share of the request budget ({PEER_SHARE} bytes): {wanted} bytes more refused"
    )]
    Share {
        /// The address.
        peer: std::net::IpAddr,
        /// What the request asked for.
        wanted: usize,
    },
    /// The budget was taken, this request's address held the most of it, and a request
    /// from an address holding less needed room: the body was not read on.
    #[error(
        "the requests from {peer} held the most of the request budget ({BODY_BUDGET} bytes) when another needed it: body not read"
    )]
    Stopped {
        /// The address.
        peer: std::net::IpAddr,
    },
}

impl Exhausted {
    /// The outcome it is counted as (the `outcome` label of the webhook's review counter).
    pub fn outcome(&self) -> &'static str {
        match self {
            Exhausted::Budget { .. } => "over_budget",
            Exhausted::Share { .. } => "over_share",
            Exhausted::Stopped { .. } => "stopped_for_others",
        }
    }
}

impl Budget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Budget {
        Budget {
            all: Arc::new(tokio::sync::Semaphore::new(bytes)),
            shares: Shares::default(),
            readers: Arc::default(),
        }
    }

    /// Registers a body from `peer` being read, so a request from an address holding less
    /// can stop it ([`Budget::stop_the_largest`]).
    fn reading(&self, peer: Option<std::net::IpAddr>) -> Reading {
        let stop = Arc::new(tokio::sync::Notify::new());
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        let id = readers.next;
        readers.next += 1;
        readers.live.insert(id, (peer, stop.clone()));
        Reading {
            readers: self.readers.clone(),
            id,
            stop,
        }
    }

    /// Stops every body still arriving from the address that holds the most of the
    /// budget, if it holds more than `me` would with `bytes` more.
    fn stop_the_largest(&self, me: Option<std::net::IpAddr>, bytes: usize) {
        let shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let held = |peer: std::net::IpAddr| shares.get(&peer).copied().unwrap_or(0);
        let mine = me.map_or(0, held).saturating_add(bytes);
        let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        let largest = readers
            .live
            .values()
            .filter_map(|(peer, _)| *peer)
            .filter(|peer| Some(*peer) != me)
            .max_by_key(|peer| held(*peer));
        let Some(largest) = largest.filter(|peer| held(*peer) > mine) else {
            return;
        };
        tracing::debug!(peer = %largest, held = held(largest), "the request budget is taken: stopping the bodies of the address that holds the most");
        readers.live.retain(|_, (peer, stop)| {
            let stopped = *peer == Some(largest);
            if stopped {
                stop.notify_one();
            }
            !stopped
        });
    }

    /// An empty charge for a request from `peer` (`None`: unknown, bounded by the whole
    /// budget only).
    pub fn charge(&self, peer: Option<std::net::IpAddr>) -> Charge {
        Charge {
            permit: None,
            share: peer.map(|peer| Share {
                shares: self.shares.clone(),
                peer,
                bytes: 0,
            }),
        }
    }

    /// Adds `bytes` to `charge`: refused at once past its address's [`PEER_SHARE`],
    /// waiting at most [`BUDGET_WAIT`] for the replica's budget.
    pub async fn take(&self, charge: &mut Charge, bytes: usize) -> Result<(), Exhausted> {
        if bytes == 0 {
            return Ok(());
        }
        let over = |held: usize| held.saturating_add(bytes) > PEER_SHARE;
        if let Some(share) = &charge.share {
            let table = self.shares.lock().unwrap_or_else(|e| e.into_inner());
            if over(table.get(&share.peer).copied().unwrap_or(0)) {
                return Err(Exhausted::Share {
                    peer: share.peer,
                    wanted: bytes,
                });
            }
        }
        let exhausted = Exhausted::Budget { wanted: bytes };
        let Ok(n) = u32::try_from(bytes) else {
            return Err(exhausted);
        };
        let me = charge.share.as_ref().map(|s| s.peer);
        let permit = match self.all.clone().try_acquire_many_owned(n) {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(exhausted),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                // Waits in line, making room from the largest holder now and then.
                let acquire = self.all.clone().acquire_many_owned(n);
                tokio::pin!(acquire);
                let give_up = tokio::time::sleep(BUDGET_WAIT);
                tokio::pin!(give_up);
                loop {
                    self.stop_the_largest(me, bytes);
                    tokio::select! {
                        permit = &mut acquire => break permit.map_err(|_| exhausted)?,
                        () = &mut give_up => return Err(exhausted),
                        () = tokio::time::sleep(STOP_EVERY) => {}
                    }
                }
            }
        };
        // Counted against the address only once the bytes are there: a request waiting
        // for the budget holds none of its share. Checked again, as others from the same
        // address may have taken theirs meanwhile.
        if let Some(share) = &mut charge.share {
            let mut table = self.shares.lock().unwrap_or_else(|e| e.into_inner());
            let held = table.entry(share.peer).or_insert(0);
            if over(*held) {
                return Err(Exhausted::Share {
                    peer: share.peer,
                    wanted: bytes,
                });
            }
            *held += bytes;
            share.bytes += bytes;
        }
        match &mut charge.permit {
            Some(held) => held.merge(permit),
            none => *none = Some(permit),
        }
        Ok(())
    }
}

/// Why a request's body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body is longer than the limit.
    #[error("request body over {0} bytes")]
    TooLarge(usize),
    /// The body did not arrive within [`BODY_TIMEOUT`].
    #[error("request body not received within {}s", BODY_TIMEOUT.as_secs())]
    TooSlow,
    /// The connection failed while the body arrived.
    #[error("read request body")]
    Read(#[source] axum::Error),
    /// The replica's budget or the address's share is taken.
    #[error(transparent)]
    Budget(#[from] Exhausted),
}

impl BodyError {
    /// The outcome it is counted as (the `outcome` label of the webhook's review counter).
    pub fn outcome(&self) -> &'static str {
        match self {
            BodyError::TooLarge(_) => "body_too_large",
            BodyError::TooSlow => "body_too_slow",
            BodyError::Read(_) => "body_unreadable",
            BodyError::Budget(exhausted) => exhausted.outcome(),
        }
    }

    /// The HTTP status a client gets for it.
    pub fn status(&self) -> http::StatusCode {
        match self {
            BodyError::TooLarge(_) => http::StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TooSlow => http::StatusCode::REQUEST_TIMEOUT,
            BodyError::Read(_) => http::StatusCode::BAD_REQUEST,
            BodyError::Budget(_) => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Reads `body` whole, at most `max` bytes within [`BODY_TIMEOUT`], into `charge` as it
/// arrives. A body of declared length lands in one buffer of that size, whose pages are
/// charged as they are written; one without (chunked) is charged twice what arrives, for
/// its buffer's growth. The charge lives as long as the returned bytes are needed.
pub async fn read_body(
    body: axum::body::Body,
    budget: &Budget,
    mut charge: Charge,
    max: usize,
) -> Result<(axum::body::Bytes, Charge), BodyError> {
    use http_body_util::BodyExt;
    let exact = axum::body::HttpBody::size_hint(&body)
        .exact()
        .and_then(|n| usize::try_from(n).ok());
    if exact.is_some_and(|n| n > max) {
        return Err(BodyError::TooLarge(max));
    }
    let factor = if exact.is_some() { 1 } else { 2 };
    let peer = charge.share.as_ref().map(|s| s.peer);
    let reading = budget.reading(peer);
    let mut buf = bytes::BytesMut::with_capacity(exact.unwrap_or(0));
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
                continue; // trailers
            };
            if buf.len() + data.len() > max {
                return Err(BodyError::TooLarge(max));
            }
            budget.take(&mut charge, factor * data.len()).await?;
            buf.extend_from_slice(&data);
        }
        Ok(())
    };
    let read = tokio::time::timeout(BODY_TIMEOUT, read);
    let stopped = reading.stop.notified();
    let read = tokio::select! {
        read = read => read,
        () = stopped => {
            let peer = peer.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
            return Err(BodyError::Budget(Exhausted::Stopped { peer }));
        }
    };
    match read {
        Ok(Ok(())) => Ok((buf.freeze(), charge)),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(BodyError::TooSlow),
    }
}

/// `app` behind the per-request bounds: a body declared larger than `max_body` is
/// answered 413 at once; every request finds the replica's [`Budget`] among its
/// extensions (for [`read_body`] and what the handler builds from the body) and ends
/// after [`REQUEST_TIMEOUT`].
pub fn bounded(app: axum::Router, max_body: usize) -> axum::Router {
    app.layer(axum::middleware::from_fn_with_state(
        (Budget::new(BODY_BUDGET), max_body),
        limit,
    ))
}

/// What [`limit`] hands each request: the replica's budget and the body limit.
#[derive(Clone, Debug)]
struct Bounds {
    budget: Budget,
    max_body: usize,
    peer: Option<std::net::IpAddr>,
}

/// A request's body, read by [`read_body`] under the bounds [`bounded`] set, with its
/// charge and the budget (for what the handler builds from it). A handler that takes it
/// answers a body too large, too slow or over budget before it runs.
#[derive(Debug)]
pub struct Received {
    /// The body.
    pub bytes: axum::body::Bytes,
    /// What holding it costs; drop it with the bytes.
    pub charge: Charge,
    /// The replica's budget.
    pub budget: Budget,
    /// Where the request came from.
    pub peer: Option<std::net::IpAddr>,
}

impl Received {
    /// An empty charge for more of the same request (what it builds from the body),
    /// counted against the same address.
    pub fn more(&self) -> Charge {
        self.budget.charge(self.peer)
    }
}

/// Why a request's body was refused before its handler ran (a handler that takes
/// `Result<Received, Refused>` counts it, then answers with it).
#[derive(Debug)]
pub enum Refused {
    /// The route is not behind [`bounded`]: a wiring mistake, 500.
    Unbounded,
    /// The body was too large, too slow, unreadable or over budget.
    Body(BodyError),
}

impl Refused {
    /// The outcome it is counted as.
    pub fn outcome(&self) -> &'static str {
        match self {
            Refused::Unbounded => "unbounded_route",
            Refused::Body(error) => error.outcome(),
        }
    }
}

impl axum::response::IntoResponse for Refused {
    fn into_response(self) -> axum::response::Response {
        match self {
            Refused::Unbounded => (
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "graceful-drain: the route is not behind transport::bounded\n",
            )
                .into_response(),
            Refused::Body(error) => {
                (error.status(), format!("graceful-drain: {error}\n")).into_response()
            }
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequest<S> for Received {
    type Rejection = Refused;

    async fn from_request(request: axum::extract::Request, _: &S) -> Result<Self, Self::Rejection> {
        let Some(bounds) = request.extensions().get::<Bounds>().cloned() else {
            return Err(Refused::Unbounded);
        };
        let charge = bounds.budget.charge(bounds.peer);
        match read_body(request.into_body(), &bounds.budget, charge, bounds.max_body).await {
            Ok((bytes, charge)) => Ok(Received {
                bytes,
                charge,
                budget: bounds.budget,
                peer: bounds.peer,
            }),
            Err(error) => {
                tracing::debug!(error = %graceful_drain_core::error::chain(&error), "request body refused");
                Err(Refused::Body(error))
            }
        }
    }
}

async fn limit(
    axum::extract::State((budget, max_body)): axum::extract::State<(Budget, usize)>,
    mut request: axum::extract::Request,
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
    let peer = request.extensions().get::<Peer>().map(|p| p.0);
    request.extensions_mut().insert(Bounds {
        budget,
        max_body,
        peer,
    });
    tokio::time::timeout(REQUEST_TIMEOUT, next.run(request))
        .await
        .unwrap_or_else(|_| {
            (
                http::StatusCode::REQUEST_TIMEOUT,
                "graceful-drain: the request took too long\n",
            )
                .into_response()
        })
}

#[cfg(test)]
mod tests;
