//! Bounds on what a caller of our port can multiply. A review costs its sender one
//! request; an Event, a log line or an API call per review would let anyone who reaches the
//! port write as fast as they can send (300 forged `?timeout=0s` evictions of pods that do
//! not exist once wrote 266 Warning Events in 1.6 s). So writes that follow from a
//! review's outcome, rather than from a change of a pod, go through a [`Throttle`]: at most
//! one per key (a pod) within [`Limits::per_key`], at most [`Limits::burst`] within
//! [`Limits::window`] in all; the rest are counted, and said once the window is over.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How much a [`Throttle`] lets through.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The same key again only after this long.
    pub per_key: Duration,
    /// Most admitted within one [`Limits::window`], whatever the keys.
    pub burst: u32,
    /// The window of [`Limits::burst`].
    pub window: Duration,
}

/// Warning Events about evictions refused because isolation did not finish: one per pod
/// a minute, 30 a minute in all, per replica.
pub const DEFERRED_EVENTS: Limits = Limits {
    per_key: Duration::from_secs(60),
    burst: 30,
    window: Duration::from_secs(60),
};

/// Log lines about bodies that are not reviews (anyone's to send): 10 every 10 s.
pub const MALFORMED_LOGS: Limits = Limits {
    per_key: Duration::ZERO,
    burst: 10,
    window: Duration::from_secs(10),
};

/// Log lines about connections closed for want of a slot (anyone's to open): 10 every
/// 10 s, then one line with the count.
pub const REFUSED_CONNECTION_LOGS: Limits = Limits {
    per_key: Duration::ZERO,
    burst: 10,
    window: Duration::from_secs(10),
};

/// What [`Throttle::admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Go ahead.
    Yes {
        /// How many were dropped since the last one let through (say so).
        dropped: u64,
    },
    /// Drop this one.
    No,
}

/// A rate bound by key and in all (see the module). Its memory is bounded by what it
/// admits: keys are kept only for those let through, and forgotten after
/// [`Limits::per_key`].
#[derive(Debug)]
pub struct Throttle {
    limits: Limits,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    window_started: Option<Instant>,
    admitted_in_window: u32,
    recent: HashMap<String, Instant>,
    dropped: u64,
}

impl Throttle {
    /// A throttle with `limits`.
    pub fn new(limits: Limits) -> Throttle {
        Throttle {
            limits,
            state: Mutex::default(),
        }
    }

    /// Whether the write keyed `key` may go ahead at `now`.
    pub fn admit(&self, key: &str, now: Instant) -> Admit {
        let limits = self.limits;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state
            .window_started
            .is_none_or(|t| now.saturating_duration_since(t) >= limits.window)
        {
            state.window_started = Some(now);
            state.admitted_in_window = 0;
        }
        state
            .recent
            .retain(|_, at| now.saturating_duration_since(*at) < limits.per_key);
        if state.admitted_in_window >= limits.burst || state.recent.contains_key(key) {
            state.dropped += 1;
            return Admit::No;
        }
        state.admitted_in_window += 1;
        if !limits.per_key.is_zero() {
            state.recent.insert(key.to_string(), now);
        }
        Admit::Yes {
            dropped: std::mem::take(&mut state.dropped),
        }
    }
}

/// The throttles the admission handlers share.
#[derive(Debug)]
pub struct Throttles {
    /// IsolationDeferred Warning Events ([`DEFERRED_EVENTS`]), keyed by pod.
    pub deferred_events: Throttle,
    /// Warnings about bodies that are not reviews ([`MALFORMED_LOGS`]).
    pub malformed_logs: Throttle,
}

impl Default for Throttles {
    fn default() -> Throttles {
        Throttles {
            deferred_events: Throttle::new(DEFERRED_EVENTS),
            malformed_logs: Throttle::new(MALFORMED_LOGS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        per_key: Duration::from_secs(60),
        burst: 3,
        window: Duration::from_secs(60),
    };

    #[test]
    fn a_flood_of_distinct_keys_gets_the_burst_and_no_more() {
        let throttle = Throttle::new(LIMITS);
        let now = Instant::now();
        let admitted = (0..300)
            .filter(|i| throttle.admit(&format!("pod-{i}"), now) != Admit::No)
            .count();
        assert_eq!(admitted, 3);
        // The next window says how many were dropped.
        let later = now + LIMITS.window;
        assert_eq!(
            throttle.admit("pod-new", later),
            Admit::Yes { dropped: 297 }
        );
    }

    #[test]
    fn the_same_key_waits_its_turn() {
        let throttle = Throttle::new(LIMITS);
        let now = Instant::now();
        assert_eq!(throttle.admit("a", now), Admit::Yes { dropped: 0 });
        assert_eq!(
            throttle.admit("a", now + Duration::from_secs(59)),
            Admit::No
        );
        assert_eq!(
            throttle.admit("a", now + Duration::from_secs(60)),
            Admit::Yes { dropped: 1 }
        );
        // Keys are forgotten once their turn has passed: memory follows what is admitted.
        assert_eq!(throttle.state.lock().unwrap().recent.len(), 1);
    }

    #[test]
    fn without_a_per_key_bound_only_the_burst_counts() {
        let throttle = Throttle::new(MALFORMED_LOGS);
        let now = Instant::now();
        let admitted = (0..50)
            .filter(|_| throttle.admit("", now) != Admit::No)
            .count();
        assert_eq!(admitted, MALFORMED_LOGS.burst as usize);
        assert!(throttle.state.lock().unwrap().recent.is_empty());
    }
}
