//! The simulated applications, one per pod UID: the state the kubelet simulation drives
//! (start, serve, SIGTERM, stop accepting, close idle connections, exit) and the traffic
//! generator reads (does this pod accept a new connection now, did the request on a
//! keep-alive connection reach a live app, did the request in flight survive). Shared
//! in-process: the simulated traffic never goes to a pod IP; with a
//! `PodNet` (the podnet module) the real TCP connections to a pod's IP are
//! connections of this registry too.
//!
//! Connections are kept here too, by id, so that their fate outlives the app: an app
//! that closes an idle connection leaves it [`SendError::Closed`] (the client reconnects
//! without an error), an app that dies or disappears leaves its connections
//! [`SendError::Reset`] (the next request on them is a 5xx).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Pod annotation choosing the SIGTERM behaviour of a pod's app (`graceful` or `naive`);
/// without it the cluster's default applies.
pub const APP_BEHAVIOUR_ANNOTATION: &str = "sim.graceful-drain.io/app";

/// What an app does with SIGTERM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Behaviour {
    /// Keeps accepting for `accept_after_sigterm`, then closes its listener and its idle
    /// keep-alive connections, answers the requests in flight (closing their connections
    /// after the response) and exits once they are done, not before
    /// `exit_after_sigterm` (the grace period's SIGKILL still ends it).
    #[default]
    Graceful,
    /// Ignores SIGTERM: accepts and serves until it exits at `exit_after_sigterm` (or
    /// the grace period's end), closing nothing: requests in flight are cut and the next
    /// request on each of its open connections is reset.
    Naive,
}

impl fmt::Display for Behaviour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Behaviour::Graceful => "graceful",
            Behaviour::Naive => "naive",
        })
    }
}

impl FromStr for Behaviour {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "graceful" => Ok(Behaviour::Graceful),
            "naive" => Ok(Behaviour::Naive),
            other => Err(format!(
                "{other:?} is not an app behaviour (graceful, naive)"
            )),
        }
    }
}

/// Where an app is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Container started, not serving yet.
    Starting,
    /// Serving; accepts new requests.
    Serving,
    /// SIGTERM delivered; may still accept until it stops accepting.
    Terminating,
    /// The process is gone.
    Exited,
}

/// Why a request or connection was not accepted (each is a 5xx for the client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// No app for that pod (never started on a node or already removed).
    Gone,
    /// The app has not started serving.
    NotStarted,
    /// The app is shutting down and no longer accepts new requests.
    NotAccepting,
}

/// Why a request could not be sent on an open keep-alive connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The server closed the connection while it was idle: the client opens a new one
    /// and sends there (not an error).
    Closed,
    /// The server is gone (the process died or the pod was deleted): the request is
    /// reset (a 5xx).
    Reset,
}

/// A request accepted by an app; hand it back to [`Apps::finish`].
#[derive(Debug)]
pub struct Ticket {
    uid: String,
    epoch: u64,
    conn: Option<ConnId>,
}

/// A keep-alive connection from a client to an app.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    Idle,
    Busy,
    Closed,
    Reset,
}

#[derive(Debug)]
struct Conn {
    uid: String,
    state: ConnState,
}

#[derive(Debug)]
struct App {
    pod: String,
    phase: Phase,
    accepting: bool,
    /// The app closes each connection once its response is sent (it is shutting down).
    closing: bool,
    in_flight: u32,
    /// Bumped when the process dies, so requests in flight at that moment fail.
    epoch: u64,
    /// Requests answered, for tests and timelines.
    served: u64,
    /// Connections accepted over the app's life.
    connections: u64,
}

#[derive(Debug, Default)]
struct Inner {
    apps: HashMap<String, App>,
    conns: HashMap<ConnId, Conn>,
    next_conn: u64,
}

impl Inner {
    /// Every open connection of `uid` is reset (the process or the pod is gone).
    fn reset_connections(&mut self, uid: &str) {
        for conn in self.conns.values_mut().filter(|c| c.uid == uid) {
            if matches!(conn.state, ConnState::Idle | ConnState::Busy) {
                conn.state = ConnState::Reset;
            }
        }
    }
}

/// The registry of apps, keyed by pod UID, and of their connections. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Apps {
    inner: Arc<Mutex<Inner>>,
}

impl Apps {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-update of plain data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The container of pod `pod` (`ns/name`) with `uid` starts. Idempotent.
    pub fn start(&self, uid: &str, pod: &str) {
        self.lock()
            .apps
            .entry(uid.to_string())
            .or_insert_with(|| App {
                pod: pod.to_string(),
                phase: Phase::Starting,
                accepting: false,
                closing: false,
                in_flight: 0,
                epoch: 0,
                served: 0,
                connections: 0,
            });
    }

    /// The app starts serving.
    pub fn serve(&self, uid: &str) {
        if let Some(app) = self.lock().apps.get_mut(uid)
            && app.phase == Phase::Starting
        {
            app.phase = Phase::Serving;
            app.accepting = true;
        }
    }

    /// SIGTERM reaches the app; it keeps accepting until [`Apps::stop_accepting`].
    pub fn sigterm(&self, uid: &str) {
        if let Some(app) = self.lock().apps.get_mut(uid)
            && matches!(app.phase, Phase::Starting | Phase::Serving)
        {
            app.phase = Phase::Terminating;
        }
    }

    /// The app closes its listener. Returns whether it was accepting until now.
    pub fn stop_accepting(&self, uid: &str) -> bool {
        match self.lock().apps.get_mut(uid) {
            Some(app) => std::mem::replace(&mut app.accepting, false),
            None => false,
        }
    }

    /// The app closes its idle keep-alive connections now and every other one once its
    /// response is sent, as a graceful server's shutdown does. Returns how many idle
    /// connections it closed.
    pub fn close_idle(&self, uid: &str) -> usize {
        let mut inner = self.lock();
        let Some(app) = inner.apps.get_mut(uid) else {
            return 0;
        };
        app.closing = true;
        let mut closed = 0;
        for conn in inner.conns.values_mut().filter(|c| c.uid == uid) {
            if conn.state == ConnState::Idle {
                conn.state = ConnState::Closed;
                closed += 1;
            }
        }
        closed
    }

    /// The process ends (exit or kill); requests in flight fail and its open connections
    /// are reset. Returns how many requests were in flight.
    pub fn exit(&self, uid: &str) -> u32 {
        let mut inner = self.lock();
        let cut = match inner.apps.get_mut(uid) {
            Some(app) if app.phase != Phase::Exited => {
                app.phase = Phase::Exited;
                app.accepting = false;
                app.epoch += 1;
                std::mem::take(&mut app.in_flight)
            }
            _ => return 0,
        };
        inner.reset_connections(uid);
        cut
    }

    /// Forgets the app of a deleted pod; requests in flight fail, connections are reset.
    pub fn remove(&self, uid: &str) {
        let mut inner = self.lock();
        inner.apps.remove(uid);
        inner.reset_connections(uid);
    }

    /// The phase of the app of `uid`, if any.
    pub fn phase(&self, uid: &str) -> Option<Phase> {
        self.lock().apps.get(uid).map(|a| a.phase)
    }

    /// The pod name (`ns/name`) of the app of `uid`, if any.
    pub fn pod(&self, uid: &str) -> Option<String> {
        self.lock().apps.get(uid).map(|a| a.pod.clone())
    }

    /// Whether the app of `uid` accepts new requests now.
    pub fn accepting(&self, uid: &str) -> bool {
        self.lock().apps.get(uid).is_some_and(|a| a.accepting)
    }

    /// Number of apps currently accepting requests.
    pub fn accepting_count(&self) -> usize {
        self.lock().apps.values().filter(|a| a.accepting).count()
    }

    /// Requests in flight on the app of `uid`.
    pub fn in_flight(&self, uid: &str) -> u32 {
        self.lock().apps.get(uid).map_or(0, |a| a.in_flight)
    }

    /// Requests the app of `uid` answered.
    pub fn served(&self, uid: &str) -> u64 {
        self.lock().apps.get(uid).map_or(0, |a| a.served)
    }

    /// Connections the app of `uid` accepted over its life.
    pub fn connections(&self, uid: &str) -> u64 {
        self.lock().apps.get(uid).map_or(0, |a| a.connections)
    }

    /// Client connections still open (idle, busy, or reset and not yet noticed) to an app
    /// that no longer accepts new ones: each will end in a reconnection or a 5xx. Zero
    /// once connection-level load balancing has settled.
    pub fn stranded_connections(&self) -> usize {
        let inner = self.lock();
        inner
            .conns
            .values()
            .filter(|c| c.state != ConnState::Closed)
            .filter(|c| !inner.apps.get(&c.uid).is_some_and(|a| a.accepting))
            .count()
    }

    /// A new request reaches the app of `uid` on a new connection (closed after the
    /// response, or held by the load balancer: the app does not see it again).
    pub fn begin(&self, uid: &str) -> Result<Ticket, Refusal> {
        let mut inner = self.lock();
        let app = inner.apps.get_mut(uid).ok_or(Refusal::Gone)?;
        admit(app)?;
        app.in_flight += 1;
        Ok(Ticket {
            uid: uid.to_string(),
            epoch: app.epoch,
            conn: None,
        })
    }

    /// A client opens a keep-alive connection to the app of `uid`.
    pub fn connect(&self, uid: &str) -> Result<ConnId, Refusal> {
        let mut inner = self.lock();
        let app = inner.apps.get_mut(uid).ok_or(Refusal::Gone)?;
        admit(app)?;
        app.connections += 1;
        inner.next_conn += 1;
        let id = ConnId(inner.next_conn);
        let conn = Conn {
            uid: uid.to_string(),
            state: ConnState::Idle,
        };
        inner.conns.insert(id, conn);
        Ok(id)
    }

    /// Sends a request on an open connection. On an error the connection is gone.
    pub fn send(&self, conn: ConnId) -> Result<Ticket, SendError> {
        let mut inner = self.lock();
        let Some(c) = inner.conns.get(&conn) else {
            return Err(SendError::Reset);
        };
        let uid = c.uid.clone();
        let state = c.state;
        let alive = inner.apps.get(&uid).filter(|a| a.phase != Phase::Exited);
        let outcome = match (state, alive) {
            (ConnState::Idle, Some(app)) => Ok(app.epoch),
            (ConnState::Closed, _) => Err(SendError::Closed),
            _ => Err(SendError::Reset),
        };
        match outcome {
            Ok(epoch) => {
                if let Some(app) = inner.apps.get_mut(&uid) {
                    app.in_flight += 1;
                }
                if let Some(c) = inner.conns.get_mut(&conn) {
                    c.state = ConnState::Busy;
                }
                Ok(Ticket {
                    uid,
                    epoch,
                    conn: Some(conn),
                })
            }
            Err(e) => {
                inner.conns.remove(&conn);
                Err(e)
            }
        }
    }

    /// The client closes its connection (idle, or given up).
    pub fn disconnect(&self, conn: ConnId) {
        self.lock().conns.remove(&conn);
    }

    /// The request of `ticket` completes; `true` if the app was still alive to answer it.
    /// Its connection goes back to idle, or is closed if the app is shutting down.
    pub fn finish(&self, ticket: Ticket) -> bool {
        let mut inner = self.lock();
        let closing = match inner.apps.get_mut(&ticket.uid) {
            Some(app) if app.epoch == ticket.epoch => {
                app.in_flight = app.in_flight.saturating_sub(1);
                app.served += 1;
                app.closing
            }
            _ => return false,
        };
        if let Some(conn) = ticket.conn.and_then(|id| inner.conns.get_mut(&id))
            && conn.state == ConnState::Busy
        {
            conn.state = if closing {
                ConnState::Closed
            } else {
                ConnState::Idle
            };
        }
        true
    }
}

/// Whether `app` takes a new connection now.
fn admit(app: &App) -> Result<(), Refusal> {
    if app.accepting {
        return Ok(());
    }
    Err(match app.phase {
        Phase::Starting => Refusal::NotStarted,
        Phase::Serving | Phase::Terminating => Refusal::NotAccepting,
        Phase::Exited => Refusal::Gone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn life_of_an_app() {
        let apps = Apps::default();
        assert_eq!(apps.begin("u").unwrap_err(), Refusal::Gone);
        apps.start("u", "ns/p");
        assert_eq!(apps.begin("u").unwrap_err(), Refusal::NotStarted);
        apps.serve("u");
        let early = apps.begin("u").unwrap();
        apps.sigterm("u");
        // Still accepting after SIGTERM until the listener closes.
        let late = apps.begin("u").unwrap();
        assert!(apps.finish(early));
        assert!(apps.stop_accepting("u"));
        assert_eq!(apps.begin("u").unwrap_err(), Refusal::NotAccepting);
        assert_eq!(apps.exit("u"), 1);
        assert!(!apps.finish(late), "a request in flight at exit fails");
        assert_eq!(apps.begin("u").unwrap_err(), Refusal::Gone);
        apps.remove("u");
        assert_eq!(apps.phase("u"), None);
    }

    #[test]
    fn an_idle_connection_closed_by_the_app_is_not_an_error() {
        let apps = Apps::default();
        apps.start("u", "ns/p");
        apps.serve("u");
        let conn = apps.connect("u").unwrap();
        let busy = apps.send(conn).unwrap();
        let idle = apps.connect("u").unwrap();
        assert_eq!(apps.connections("u"), 2);
        // Graceful shutdown: the listener closes, idle connections close now, the busy
        // one once its response is sent.
        apps.sigterm("u");
        assert!(apps.stop_accepting("u"));
        assert_eq!(apps.close_idle("u"), 1);
        assert_eq!(apps.send(idle).unwrap_err(), SendError::Closed);
        assert_eq!(apps.stranded_connections(), 1, "the busy one");
        assert!(apps.finish(busy), "the request in flight is answered");
        assert_eq!(apps.send(conn).unwrap_err(), SendError::Closed);
        assert_eq!(apps.stranded_connections(), 0);
        assert_eq!(apps.connect("u").unwrap_err(), Refusal::NotAccepting);
        assert_eq!(apps.served("u"), 1);
    }

    #[test]
    fn connections_of_an_app_that_dies_are_reset() {
        let apps = Apps::default();
        apps.start("u", "ns/p");
        apps.serve("u");
        let idle = apps.connect("u").unwrap();
        let conn = apps.connect("u").unwrap();
        let in_flight = apps.send(conn).unwrap();
        // A naive app: SIGTERM changes nothing, it serves until the process dies.
        apps.sigterm("u");
        assert!(apps.accepting("u"));
        assert_eq!(apps.exit("u"), 1);
        assert!(!apps.finish(in_flight), "the request in flight is cut");
        assert_eq!(apps.stranded_connections(), 2);
        assert_eq!(apps.send(idle).unwrap_err(), SendError::Reset);
        assert_eq!(apps.send(conn).unwrap_err(), SendError::Reset);
        assert_eq!(apps.stranded_connections(), 0);
        // A deleted pod resets the connections of an app that never exited.
        apps.start("v", "ns/q");
        apps.serve("v");
        let conn = apps.connect("v").unwrap();
        apps.remove("v");
        assert_eq!(apps.send(conn).unwrap_err(), SendError::Reset);
        assert_eq!("naive".parse::<Behaviour>(), Ok(Behaviour::Naive));
        assert!("lazy".parse::<Behaviour>().is_err());
    }
}
