//! Keep-alive clients: a fixed number of clients, each holding one connection and
//! sending requests on it one after the other, paced so that together they aim at the
//! configured rate. Request durations are drawn per request; a share of them is long.
//!
//! Behind an NLB (connection-level balancing) a client's connection is pinned to the pod
//! the load balancer picked when it was opened: it stays there whatever happens to the
//! target set, until the server closes it while idle (the client opens a new one and
//! sends there, not an error) or it is reset (the request on it is a 5xx, and the next
//! request opens a new connection). Behind an ALB the client's connection ends at the
//! load balancer, which routes each request on its own, so every request reaches its pod
//! as a request of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use super::apps::{ConnId, SendError, Ticket};
use super::{Failure, Shared, Target, TrafficConfig, send};
use crate::lb::LbKind;

/// How the generator's requests arrive.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Clients {
    /// Open loop: a request at a fixed rate, each on a connection of its own, lasting
    /// the configured request duration.
    #[default]
    PerRequest,
    /// A fixed set of keep-alive clients.
    KeepAlive(KeepAliveConfig),
}

/// Keep-alive clients and their request durations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeepAliveConfig {
    /// Clients, each with one keep-alive connection.
    pub connections: usize,
    /// Share (0.0–1.0) of requests lasting about `long_duration` instead of about the
    /// configured request duration (each drawn uniformly between half and one and a half
    /// times it).
    pub long_share: f64,
    /// The typical duration of a long request (drawn like the others, between half and
    /// one and a half times it).
    pub long_duration: Duration,
    /// Seed of the duration draws.
    pub seed: u64,
}

impl KeepAliveConfig {
    /// The longest request this configuration can draw.
    pub fn longest(&self, cfg: &TrafficConfig) -> Duration {
        let longest = if self.long_share > 0.0 {
            self.long_duration.max(cfg.request_duration)
        } else {
            cfg.request_duration
        };
        longest.mul_f64(1.5)
    }
}

/// What every client shares: where to send, the bounds and the counters.
struct Run {
    target: Target,
    cfg: TrafficConfig,
    ka: KeepAliveConfig,
    shared: Arc<Shared>,
    stop: CancellationToken,
    sent: AtomicU64,
    deadline: Instant,
}

impl Run {
    /// Takes one request out of the budget; `false` once a bound is reached.
    fn take(&self) -> bool {
        if self.stop.is_cancelled() || Instant::now() >= self.deadline {
            return false;
        }
        self.sent.fetch_add(1, Ordering::Relaxed) < self.cfg.max_requests
    }
}

/// Runs `ka.connections` clients until stopped or a bound is reached; requests in flight
/// finish.
pub(super) async fn generate(
    target: Target,
    cfg: TrafficConfig,
    ka: KeepAliveConfig,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let run = Run {
        target,
        cfg,
        ka,
        shared,
        stop,
        sent: AtomicU64::new(0),
        deadline: Instant::now() + cfg.max_duration,
    };
    let clients = (0..ka.connections.max(1)).map(|i| client(&run, i));
    futures::future::join_all(clients).await;
}

/// One client: a request, then the next one `connections / rate` after the previous one
/// began (or right after it ended, if it lasted longer).
async fn client(run: &Run, index: usize) {
    let connections = run.ka.connections.max(1);
    let interval = Duration::from_secs_f64(connections as f64 / run.cfg.rate.max(0.001));
    let mut rng = StdRng::seed_from_u64(run.ka.seed.wrapping_add(index as u64));
    // Spread the clients' first requests over one interval.
    let mut next = Instant::now() + interval.mul_f64(index as f64 / connections as f64);
    let mut conn: Option<(ConnId, String)> = None;
    loop {
        tokio::select! {
            _ = run.stop.cancelled() => break,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        if !run.take() {
            break;
        }
        let began = Instant::now();
        next = began + interval;
        let duration = draw(&mut rng, run);
        if let Some((ticket, pod)) = request(run, &mut conn, began) {
            // A request in flight is answered even when the run is stopped.
            tokio::time::sleep(duration).await;
            if !run.target.apps.finish(ticket) {
                run.shared.fail(Instant::now(), Failure::Cut, Some(pod));
                if let Some((id, _)) = conn.take() {
                    run.target.apps.disconnect(id);
                }
            }
        }
    }
    if let Some((id, _)) = conn {
        run.target.apps.disconnect(id);
    }
}

/// A request duration: about the configured one, or for a share of them about the long one.
fn draw(rng: &mut StdRng, run: &Run) -> Duration {
    let long = run.ka.long_share > 0.0 && rng.random_bool(run.ka.long_share.clamp(0.0, 1.0));
    let base = if long {
        run.ka.long_duration
    } else {
        run.cfg.request_duration
    };
    base.mul_f64(rng.random_range(0.5..=1.5))
}

/// Sends one request of a client, counting it and its failure. Returns the ticket of an
/// accepted request and its pod.
fn request(
    run: &Run,
    conn: &mut Option<(ConnId, String)>,
    now: Instant,
) -> Option<(Ticket, String)> {
    let (target, shared) = (&run.target, &*run.shared);
    if target.lbs.kind(&target.service) != Some(LbKind::Nlb) {
        // The connection ends at the load balancer, which routes each request.
        return send(target, shared, now);
    }
    shared.requests.fetch_add(1, Ordering::Relaxed);
    // A connection closed while idle costs a reconnection; a fresh connection can only be
    // closed if the app closes it between accept and request, so two tries suffice
    // unless the app keeps doing so.
    for _ in 0..3 {
        let (id, pod) = match conn.take() {
            Some(open) => open,
            None => {
                let Some((uid, pod)) = target.lbs.route(&target.service, now) else {
                    shared.fail(now, Failure::NoTarget, None);
                    return None;
                };
                match target.apps.connect(&uid) {
                    Ok(id) => (id, pod),
                    Err(_) => {
                        shared.fail(now, Failure::Refused, Some(pod));
                        return None;
                    }
                }
            }
        };
        match target.apps.send(id) {
            Ok(ticket) => {
                *conn = Some((id, pod.clone()));
                return Some((ticket, pod));
            }
            Err(SendError::Closed) => continue,
            Err(SendError::Reset) => {
                shared.fail(now, Failure::Reset, Some(pod));
                return None;
            }
        }
    }
    shared.fail(now, Failure::Refused, None);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::{LbConfig, LbModel, LoadBalancers, ReadyEndpoint};
    use crate::traffic::Traffic;
    use crate::traffic::apps::Apps;
    use crate::traffic::timeline::Timeline;

    /// Two serving apps `a` and `b` behind an NLB without lags, targets as given.
    fn nlb(targets: &[&str]) -> Target {
        let timeline = Timeline::new();
        let lags = LbConfig {
            registration_lag: Duration::ZERO,
            deregistration_lag: Duration::ZERO,
        };
        let model = LbModel {
            default_kind: LbKind::Nlb,
            ..LbModel::default()
        };
        let lbs = LoadBalancers::with_model(lags, model, timeline.clone());
        let apps = Apps::default();
        for uid in ["a", "b"] {
            apps.start(uid, &format!("ns/{uid}"));
            apps.serve(uid);
        }
        let target = Target {
            service: "ns/web".into(),
            lbs,
            apps,
            timeline,
        };
        retarget(&target, targets);
        target
    }

    fn retarget(target: &Target, uids: &[&str]) {
        let ready: Vec<ReadyEndpoint> = uids
            .iter()
            .map(|uid| ReadyEndpoint {
                uid: (*uid).into(),
                pod: format!("ns/{uid}"),
                address: None,
            })
            .collect();
        target.lbs.sync(&target.service, &ready, Instant::now());
    }

    fn start(target: &Target, rate: f64, request: Duration) -> Traffic {
        let cfg = TrafficConfig {
            rate,
            request_duration: request,
            max_requests: 10_000,
            max_duration: Duration::from_secs(20),
        };
        let ka = KeepAliveConfig {
            connections: 1,
            long_share: 0.0,
            long_duration: Duration::ZERO,
            seed: 1,
        };
        Traffic::start_with(
            target.clone(),
            cfg,
            Clients::KeepAlive(ka),
            &CancellationToken::new(),
        )
    }

    /// Polls `done` every millisecond, for at most ten seconds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn a_connection_stays_pinned_until_the_app_closes_it_while_idle() {
        let target = nlb(&["a"]);
        let apps = target.apps.clone();
        let traffic = start(&target, 500.0, Duration::from_millis(1));
        until("requests on a", || apps.served("a") >= 5).await;
        // `a` leaves the target set: new connections go to `b`, the open one stays on `a`.
        retarget(&target, &["b"]);
        let before = apps.served("a");
        until("more requests on a", || apps.served("a") >= before + 10).await;
        assert_eq!(apps.served("b"), 0, "the connection is not moved");
        // A graceful shutdown closes the idle connection: the client reconnects to `b`.
        apps.stop_accepting("a");
        apps.close_idle("a");
        until("requests on b", || apps.served("b") >= 5).await;
        let report = traffic.stop().await;
        assert_eq!(report.errors_5xx, 0, "{report:?}");
        assert_eq!((apps.connections("a"), apps.connections("b")), (1, 1));
        assert_eq!(apps.stranded_connections(), 0);
    }

    #[tokio::test]
    async fn a_reset_connection_is_a_5xx_and_the_client_reconnects() {
        let target = nlb(&["a"]);
        let apps = target.apps.clone();
        // One request every 100 ms lasting 1 ms: the connection is idle almost always.
        let traffic = start(&target, 10.0, Duration::from_millis(1));
        until("an answered request on a", || {
            apps.served("a") >= 1 && apps.in_flight("a") == 0
        })
        .await;
        retarget(&target, &["b"]);
        // A naive app dies with its connection open: the next request on it is reset.
        apps.exit("a");
        until("requests on b", || apps.served("b") >= 2).await;
        let counts = traffic.counts();
        assert_eq!((counts.errors_5xx, counts.reset), (1, 1), "{counts:?}");
        traffic.stop().await;
    }

    #[tokio::test]
    async fn a_request_in_flight_when_the_app_dies_is_cut() {
        let target = nlb(&["a", "b"]);
        let apps = target.apps.clone();
        let traffic = start(&target, 10.0, Duration::from_millis(300));
        until("a request in flight", || {
            apps.in_flight("a") + apps.in_flight("b") == 1
        })
        .await;
        let victim = if apps.in_flight("a") == 1 { "a" } else { "b" };
        let other = if victim == "a" { "b" } else { "a" };
        retarget(&target, &[other]);
        apps.exit(victim);
        until("a request answered elsewhere", || apps.served(other) >= 1).await;
        let report = traffic.stop().await;
        assert_eq!((report.errors_5xx, report.cut), (1, 1), "{report:?}");
        assert_eq!(apps.stranded_connections(), 0);
    }
}
