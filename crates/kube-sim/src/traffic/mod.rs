//! Traffic through the simulated load balancers: the app registry ([`apps`]), the
//! timeline ([`timeline`]) and a generator, bounded in count and time, that counts every
//! request a pod cannot answer as a 5xx. By default ([`Clients::PerRequest`]) it sends
//! requests at a fixed rate, each on a connection of its own; with
//! [`Clients::KeepAlive`] ([`clients`]) a fixed set of clients send requests one after
//! the other on keep-alive connections, some of them long.

pub mod apps;
pub mod clients;
pub mod timeline;

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::apps::{Apps, Refusal, Ticket};
use self::clients::Clients;
use self::timeline::{Event, EventKind, Timeline, bursts};
use super::lb::LoadBalancers;

/// Errors closer together than this belong to one 5xx burst on the timeline.
const BURST_GAP: Duration = Duration::from_millis(500);

/// Shape and bounds of the generated traffic.
#[derive(Clone, Copy, Debug)]
pub struct TrafficConfig {
    /// Requests per second.
    pub rate: f64,
    /// How long the app takes to answer each request.
    pub request_duration: Duration,
    /// Stop after this many requests.
    pub max_requests: u64,
    /// Stop after this long.
    pub max_duration: Duration,
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failure {
    /// The load balancer had no target (503).
    NoTarget,
    /// The target pod did not accept the connection (502).
    Refused,
    /// The target pod died with the request in flight (502).
    Cut,
    /// The keep-alive connection the request was sent on was reset: its pod's app died
    /// or the pod is gone (502).
    Reset,
}

/// Counts of a traffic run, readable while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests sent, failed ones included.
    pub requests: u64,
    /// Requests that failed, whatever the reason: the sum of the four counts below.
    pub errors_5xx: u64,
    /// Failures of kind [`Failure::NoTarget`].
    pub no_target: u64,
    /// Failures of kind [`Failure::Refused`].
    pub refused: u64,
    /// Failures of kind [`Failure::Cut`].
    pub cut: u64,
    /// Failures of kind [`Failure::Reset`].
    pub reset: u64,
}

/// What a finished traffic run saw.
#[derive(Clone, Debug, Default)]
pub struct TrafficReport {
    /// Requests sent, failed ones included.
    pub requests: u64,
    /// Requests that failed, whatever the reason: the sum of the four counts below.
    pub errors_5xx: u64,
    /// Failures of kind [`Failure::NoTarget`].
    pub no_target: u64,
    /// Failures of kind [`Failure::Refused`].
    pub refused: u64,
    /// Failures of kind [`Failure::Cut`].
    pub cut: u64,
    /// Failures of kind [`Failure::Reset`].
    pub reset: u64,
    /// Significant events of the cluster during the run, with the 5xx bursts.
    pub timeline: Vec<Event>,
}

#[derive(Debug, Default)]
struct Shared {
    requests: AtomicU64,
    no_target: AtomicU64,
    refused: AtomicU64,
    cut: AtomicU64,
    reset: AtomicU64,
    errors: Mutex<Vec<(Instant, Failure, Option<String>)>>,
}

impl Shared {
    fn fail(&self, at: Instant, why: Failure, pod: Option<String>) {
        let counter = match why {
            Failure::NoTarget => &self.no_target,
            Failure::Refused => &self.refused,
            Failure::Cut => &self.cut,
            Failure::Reset => &self.reset,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut errors) = self.errors.lock() {
            errors.push((at, why, pod));
        }
    }

    fn counts(&self) -> Counts {
        let no_target = self.no_target.load(Ordering::Relaxed);
        let refused = self.refused.load(Ordering::Relaxed);
        let cut = self.cut.load(Ordering::Relaxed);
        let reset = self.reset.load(Ordering::Relaxed);
        Counts {
            requests: self.requests.load(Ordering::Relaxed),
            errors_5xx: no_target + refused + cut + reset,
            no_target,
            refused,
            cut,
            reset,
        }
    }
}

/// A running traffic generator against one load-balanced Service.
pub struct Traffic {
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    timeline: Timeline,
    started: Instant,
}

/// Where the generator sends its requests.
#[derive(Clone, Debug)]
pub struct Target {
    /// The Service (`ns/name`) whose load balancer routes the requests.
    pub service: String,
    /// The load balancers; the one of `service` picks each request's pod.
    pub lbs: LoadBalancers,
    /// The app registry that accepts, serves or refuses each routed request.
    pub apps: Apps,
    /// Where the 5xx bursts are recorded when the run stops, and what its report is read
    /// from.
    pub timeline: Timeline,
}

impl Traffic {
    /// Starts sending requests to `target`, each on a connection of its own, until
    /// stopped, `shutdown`, or a bound is reached.
    pub fn start(target: Target, cfg: TrafficConfig, shutdown: &CancellationToken) -> Traffic {
        Self::start_with(target, cfg, Clients::PerRequest, shutdown)
    }

    /// Starts sending requests to `target` as `clients` says, until stopped, `shutdown`,
    /// or a bound is reached.
    pub fn start_with(
        target: Target,
        cfg: TrafficConfig,
        clients: Clients,
        shutdown: &CancellationToken,
    ) -> Traffic {
        let shared = Arc::new(Shared::default());
        let stop = shutdown.child_token();
        let timeline = target.timeline.clone();
        let task = match clients {
            Clients::PerRequest => {
                tokio::spawn(generate(target, cfg, shared.clone(), stop.clone()))
            }
            Clients::KeepAlive(ka) => tokio::spawn(clients::generate(
                target,
                cfg,
                ka,
                shared.clone(),
                stop.clone(),
            )),
        };
        Traffic {
            shared,
            stop,
            task,
            timeline,
            started: Instant::now(),
        }
    }

    /// Counts so far.
    pub fn counts(&self) -> Counts {
        self.shared.counts()
    }

    /// Whether the generator has stopped by itself (a bound was reached).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the generator, lets requests in flight finish, and reports.
    pub async fn stop(self) -> TrafficReport {
        self.stop.cancel();
        let _ = self.task.await;
        let counts = self.shared.counts();
        let end = Instant::now();
        let errors = self
            .shared
            .errors
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        for (first, last, count) in bursts(errors.iter().map(|e| e.0).collect(), BURST_GAP) {
            let in_burst = errors.iter().filter(|e| e.0 >= first && e.0 <= last);
            let reasons: BTreeSet<String> =
                in_burst.clone().map(|e| format!("{:?}", e.1)).collect();
            let pods: BTreeSet<&str> = in_burst.filter_map(|e| e.2.as_deref()).collect();
            let pods: Vec<&str> = pods.into_iter().take(3).collect();
            let subject = format!(
                "{count} errors over {:.2}s ({}){}",
                (last - first).as_secs_f64(),
                reasons.into_iter().collect::<Vec<_>>().join(", "),
                if pods.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", pods.join(", "))
                },
            );
            // On the shared timeline, so whoever reads the cluster's events sees them too.
            self.timeline.record_at(first, EventKind::Burst5xx, subject);
        }
        let timeline = self.timeline.between(self.started, end);
        TrafficReport {
            requests: counts.requests,
            errors_5xx: counts.errors_5xx,
            no_target: counts.no_target,
            refused: counts.refused,
            cut: counts.cut,
            reset: counts.reset,
            timeline,
        }
    }
}

/// Sends one request; returns the ticket of an accepted one.
fn send(target: &Target, shared: &Shared, now: Instant) -> Option<(Ticket, String)> {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let Some((uid, pod)) = target.lbs.route(&target.service, now) else {
        shared.fail(now, Failure::NoTarget, None);
        return None;
    };
    match target.apps.begin(&uid) {
        Ok(ticket) => Some((ticket, pod)),
        Err(Refusal::Gone | Refusal::NotStarted | Refusal::NotAccepting) => {
            shared.fail(now, Failure::Refused, Some(pod));
            None
        }
    }
}

async fn generate(
    target: Target,
    cfg: TrafficConfig,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let start = Instant::now();
    let period = Duration::from_secs_f64(1.0 / cfg.rate.max(0.001));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut in_flight: VecDeque<(Instant, Ticket, String)> = VecDeque::new();
    let mut sent = 0u64;
    loop {
        let done =
            sent >= cfg.max_requests || start.elapsed() >= cfg.max_duration || stop.is_cancelled();
        if done && in_flight.is_empty() {
            return;
        }
        let front = in_flight.front().map(|f| f.0);
        tokio::select! {
            _ = ticker.tick(), if !done => {
                let now = Instant::now();
                sent += 1;
                if let Some((ticket, pod)) = send(&target, &shared, now) {
                    in_flight.push_back((now + cfg.request_duration, ticket, pod));
                }
            }
            _ = tokio::time::sleep_until(front.unwrap_or(start).into()), if front.is_some() => {
                if let Some((_, ticket, pod)) = in_flight.pop_front()
                    && !target.apps.finish(ticket)
                {
                    shared.fail(Instant::now(), Failure::Cut, Some(pod));
                }
            }
            _ = stop.cancelled(), if !done => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::{LbConfig, ReadyEndpoint};

    #[tokio::test]
    async fn counts_requests_to_a_pod_that_stopped_accepting() {
        let timeline = Timeline::new();
        let lbs = LoadBalancers::new(
            LbConfig {
                registration_lag: Duration::ZERO,
                deregistration_lag: Duration::from_secs(60),
            },
            timeline.clone(),
        );
        let apps = Apps::default();
        apps.start("u1", "ns/a");
        apps.serve("u1");
        lbs.sync(
            "ns/web",
            &[ReadyEndpoint {
                uid: "u1".into(),
                pod: "ns/a".into(),
                address: None,
            }],
            Instant::now(),
        );
        let target = Target {
            service: "ns/web".into(),
            lbs,
            apps: apps.clone(),
            timeline,
        };
        let cfg = TrafficConfig {
            rate: 1000.0,
            request_duration: Duration::from_millis(1),
            max_requests: 20,
            max_duration: Duration::from_secs(10),
        };
        let shutdown = CancellationToken::new();
        let traffic = Traffic::start(target.clone(), cfg, &shutdown);
        while !traffic.is_finished() {
            tokio::task::yield_now().await;
        }
        let report = traffic.stop().await;
        assert_eq!((report.requests, report.errors_5xx), (20, 0));
        // The pod stops accepting but stays a target (deregistration lag): every request fails.
        apps.stop_accepting("u1");
        let traffic = Traffic::start(target, cfg, &shutdown);
        while !traffic.is_finished() {
            tokio::task::yield_now().await;
        }
        let report = traffic.stop().await;
        assert_eq!(
            (report.requests, report.errors_5xx, report.refused),
            (20, 20, 20)
        );
        assert!(
            report
                .timeline
                .iter()
                .any(|e| e.kind == EventKind::Burst5xx && e.subject.starts_with("20 errors"))
        );
    }
}
