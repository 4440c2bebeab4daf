//! The simulated applications, one per pod UID: the state the kubelet simulation drives
//! (start, serve, SIGTERM, stop accepting, exit) and the traffic generator reads (does
//! this pod accept a new request now, did the request in flight survive). Shared
//! in-process: no traffic ever goes to a pod IP.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

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

/// Why a request was not accepted (each is a 5xx for the client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// No app for that pod (never started on a node or already removed).
    Gone,
    /// The app has not started serving.
    NotStarted,
    /// The app is shutting down and no longer accepts new requests.
    NotAccepting,
}

/// A request accepted by an app; hand it back to [`Apps::finish`].
#[derive(Debug)]
pub struct Ticket {
    uid: String,
    epoch: u64,
}

#[derive(Debug)]
struct App {
    pod: String,
    phase: Phase,
    accepting: bool,
    in_flight: u32,
    /// Bumped when the process dies, so requests in flight at that moment fail.
    epoch: u64,
}

/// The registry of apps, keyed by pod UID. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Apps {
    inner: Arc<Mutex<HashMap<String, App>>>,
}

impl Apps {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, App>> {
        // A poisoned lock only means another thread panicked mid-update of plain data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The container of pod `pod` (`ns/name`) with `uid` starts. Idempotent.
    pub fn start(&self, uid: &str, pod: &str) {
        self.lock().entry(uid.to_string()).or_insert_with(|| App {
            pod: pod.to_string(),
            phase: Phase::Starting,
            accepting: false,
            in_flight: 0,
            epoch: 0,
        });
    }

    /// The app starts serving.
    pub fn serve(&self, uid: &str) {
        if let Some(app) = self.lock().get_mut(uid)
            && app.phase == Phase::Starting
        {
            app.phase = Phase::Serving;
            app.accepting = true;
        }
    }

    /// SIGTERM reaches the app; it keeps accepting until [`Apps::stop_accepting`].
    pub fn sigterm(&self, uid: &str) {
        if let Some(app) = self.lock().get_mut(uid)
            && matches!(app.phase, Phase::Starting | Phase::Serving)
        {
            app.phase = Phase::Terminating;
        }
    }

    /// The app closes its listener. Returns whether it was accepting until now.
    pub fn stop_accepting(&self, uid: &str) -> bool {
        match self.lock().get_mut(uid) {
            Some(app) => std::mem::replace(&mut app.accepting, false),
            None => false,
        }
    }

    /// The process ends (exit or kill); requests in flight fail. Returns how many.
    pub fn exit(&self, uid: &str) -> u32 {
        match self.lock().get_mut(uid) {
            Some(app) if app.phase != Phase::Exited => {
                app.phase = Phase::Exited;
                app.accepting = false;
                app.epoch += 1;
                std::mem::take(&mut app.in_flight)
            }
            _ => 0,
        }
    }

    /// Forgets the app of a deleted pod; requests in flight fail.
    pub fn remove(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// The phase of the app of `uid`, if any.
    pub fn phase(&self, uid: &str) -> Option<Phase> {
        self.lock().get(uid).map(|a| a.phase)
    }

    /// The pod name (`ns/name`) of the app of `uid`, if any.
    pub fn pod(&self, uid: &str) -> Option<String> {
        self.lock().get(uid).map(|a| a.pod.clone())
    }

    /// Whether the app of `uid` accepts new requests now.
    pub fn accepting(&self, uid: &str) -> bool {
        self.lock().get(uid).is_some_and(|a| a.accepting)
    }

    /// Number of apps currently accepting requests.
    pub fn accepting_count(&self) -> usize {
        self.lock().values().filter(|a| a.accepting).count()
    }

    /// A new request reaches the app of `uid`.
    pub fn begin(&self, uid: &str) -> Result<Ticket, Refusal> {
        let mut apps = self.lock();
        let app = apps.get_mut(uid).ok_or(Refusal::Gone)?;
        if app.accepting {
            app.in_flight += 1;
            return Ok(Ticket {
                uid: uid.to_string(),
                epoch: app.epoch,
            });
        }
        Err(match app.phase {
            Phase::Starting => Refusal::NotStarted,
            Phase::Serving | Phase::Terminating => Refusal::NotAccepting,
            Phase::Exited => Refusal::Gone,
        })
    }

    /// The request of `ticket` completes; `true` if the app was still alive to answer it.
    pub fn finish(&self, ticket: Ticket) -> bool {
        let mut apps = self.lock();
        match apps.get_mut(&ticket.uid) {
            Some(app) if app.epoch == ticket.epoch => {
                app.in_flight = app.in_flight.saturating_sub(1);
                true
            }
            _ => false,
        }
    }
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
}
