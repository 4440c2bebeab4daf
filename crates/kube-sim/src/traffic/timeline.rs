//! The timeline of a simulated run: significant events (pod isolated, removed from a
//! slice, deregistered, stopped accepting, deleted, 5xx bursts) with their time since the
//! cluster started, shared by the kubelets, the load balancer and the traffic generator.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The app of a pod started serving and the pod became Ready.
    Ready,
    /// The pod gained the cluster's isolation label
    /// (the cluster configuration's `isolation_label`).
    Isolated,
    /// The pod got a deletionTimestamp (its app receives SIGTERM).
    Terminating,
    /// The pod's endpoint is no longer ready (or gone) in its Service's EndpointSlice.
    RemovedFromSlice,
    /// The load balancer registered the pod as a target.
    Registered,
    /// The load balancer stopped sending it new requests.
    Deregistered,
    /// The app stopped accepting new requests.
    StoppedAccepting,
    /// A graceful app closed its idle keep-alive connections (the subject says how many).
    ClosedConnections,
    /// The pod object was deleted.
    Deleted,
    /// A run of 5xx answers (the subject says how many).
    Burst5xx,
    /// A scenario step (drain started, rollout finished, ...).
    Step,
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            EventKind::Ready => "ready",
            EventKind::Isolated => "isolated",
            EventKind::Terminating => "terminating (SIGTERM)",
            EventKind::RemovedFromSlice => "removed from slice",
            EventKind::Registered => "registered in LB",
            EventKind::Deregistered => "deregistered from LB",
            EventKind::StoppedAccepting => "stopped accepting",
            EventKind::ClosedConnections => "closed idle conns",
            EventKind::Deleted => "deleted",
            EventKind::Burst5xx => "5xx burst",
            EventKind::Step => "step",
        };
        f.write_str(text)
    }
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Time since the timeline started.
    pub at: Duration,
    /// What happened.
    pub kind: EventKind,
    /// The pod (`ns/name`) or a free-form description.
    pub subject: String,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>8.3}s  {:<22} {}",
            self.at.as_secs_f64(),
            self.kind.to_string(),
            self.subject
        )
    }
}

/// A shared, append-only event log. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Timeline {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Timeline {
    /// A timeline starting now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Arc::default(),
        }
    }

    /// The instant the timeline counts from.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Records `kind` for `subject` at `at` (which may lie in the future, e.g. the end
    /// of a deregistration lag).
    pub fn record_at(&self, at: Instant, kind: EventKind, subject: impl Into<String>) {
        let event = Event {
            at: at.saturating_duration_since(self.start),
            kind,
            subject: subject.into(),
        };
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }

    /// Records `kind` for `subject` now.
    pub fn record(&self, kind: EventKind, subject: impl Into<String>) {
        self.record_at(Instant::now(), kind, subject);
    }

    /// Events that happened in `[from, to)` (instants), sorted by time. Events recorded
    /// for the future are left out until their time has come.
    pub fn between(&self, from: Instant, to: Instant) -> Vec<Event> {
        let from = from.saturating_duration_since(self.start);
        let to = to.saturating_duration_since(self.start);
        let mut out: Vec<Event> = match self.events.lock() {
            Ok(events) => events
                .iter()
                .filter(|e| e.at >= from && e.at < to)
                .cloned()
                .collect(),
            Err(_) => Vec::new(),
        };
        out.sort_by_key(|e| e.at);
        out
    }
}

/// Groups error instants into bursts: consecutive errors closer than `gap` belong to the
/// same burst. Returns `(first, last, count)` per burst, in time order.
pub fn bursts(mut errors: Vec<Instant>, gap: Duration) -> Vec<(Instant, Instant, usize)> {
    errors.sort();
    let mut out: Vec<(Instant, Instant, usize)> = Vec::new();
    for at in errors {
        match out.last_mut() {
            Some((_, last, count)) if at.saturating_duration_since(*last) < gap => {
                *last = at;
                *count += 1;
            }
            _ => out.push((at, at, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_split_on_gaps() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let got = bursts(
            vec![ms(0), ms(100), ms(50), ms(2000), ms(2100)],
            Duration::from_millis(500),
        );
        assert_eq!(got, vec![(ms(0), ms(100), 3), (ms(2000), ms(2100), 2)]);
        assert!(bursts(Vec::new(), Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn future_events_wait_for_their_time() {
        let tl = Timeline::new();
        let now = Instant::now();
        tl.record_at(
            now + Duration::from_secs(60),
            EventKind::Deregistered,
            "a/b",
        );
        tl.record_at(now, EventKind::RemovedFromSlice, "a/b");
        let seen = tl.between(tl.start(), now + Duration::from_secs(1));
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].kind, EventKind::RemovedFromSlice);
        let all = tl.between(tl.start(), now + Duration::from_secs(61));
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].kind, EventKind::Deregistered);
    }
}
