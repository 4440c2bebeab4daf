//! Matrix scenarios about load-balancer and client behaviour (connection-level load
//! balancing, keep-alive clients, long requests, apps with and without a graceful
//! SIGTERM), appended to the matrix's list of scenarios (`scenarios` in the `matrix`
//! module).
//!
//! Each changes the base configuration with a tweak: the Service's default load-balancer
//! kind, the clients, the apps' SIGTERM behaviour. The base traffic rate stays; keep-alive
//! clients share it.

use std::time::Duration;

use super::ScenarioConfig;
use super::spec::{Budget, Disruption, Scenario};
use kube_sim::lb::LbKind;
use kube_sim::traffic::apps::Behaviour;
use kube_sim::traffic::clients::{Clients, KeepAliveConfig};

/// Keep-alive clients of the scenarios: enough that every pod holds a few connections.
const CLIENTS: usize = 16;
/// Keep-alive clients when a fifth of the requests are long: more, so that the clients
/// waiting on long answers leave enough requests to see the short gaps.
const CLIENTS_WITH_LONG_REQUESTS: usize = 48;

/// The load-balancer scenarios, in table order.
pub fn scenarios() -> Vec<Scenario> {
    let s = Scenario::new;
    vec![
        s(
            "nlb-keepalive-drain",
            "drain behind an NLB with keep-alive clients pinned to their pods; graceful app (closes idle connections on SIGTERM)",
            Disruption::Drain,
            Budget::Default,
            nlb_keep_alive,
        ),
        s(
            "nlb-keepalive-rollout",
            "rollout restart behind an NLB with keep-alive clients; graceful app",
            Disruption::Rollout,
            Budget::Default,
            nlb_keep_alive,
        ),
        Scenario {
            protected_5xx: true,
            ..s(
                "nlb-naive-app-drain",
                "drain behind an NLB with keep-alive clients; naive app that exits without closing its connections: the requests on them are reset, and no load balancer drain can move a pinned connection, so 5xx are expected even protected",
                Disruption::Drain,
                Budget::Default,
                nlb_naive_app,
            )
        },
        s(
            "alb-jittered-drain",
            "drain behind an ALB of 3 nodes whose deregistration lags are 3 s ± 25 %, 500 ms after each slice change; the delay (5 s) covers the slowest node",
            Disruption::Drain,
            Budget::Default,
            alb_jittered,
        ),
        s(
            "alb-confirmed-drain",
            "drain behind the jittered ALB (lags up to 4.25 s) with a 30 s delay and confirmed release: each pod goes once every LB node has let go of it (the webhook asks the load balancers' admin API), not after the whole delay",
            Disruption::Drain,
            Budget::Default,
            alb_confirmed,
        ),
        s(
            "long-requests-drain",
            "drain behind an NLB with keep-alive clients, a fifth of requests lasting 2–6 s; graceful app finishes them before exiting",
            Disruption::Drain,
            Budget::Default,
            long_requests,
        ),
    ]
}

/// Keep-alive clients, `long_share` of whose requests take 2–6 s.
fn keep_alive(cfg: &mut ScenarioConfig, long_share: f64) {
    let connections = if long_share > 0.0 {
        CLIENTS_WITH_LONG_REQUESTS
    } else {
        CLIENTS
    };
    cfg.clients = Clients::KeepAlive(KeepAliveConfig {
        connections,
        long_share,
        long_duration: Duration::from_secs(4),
        seed: cfg.cluster.lb_model.seed,
    });
}

/// An NLB, keep-alive clients, graceful apps.
fn nlb_keep_alive(cfg: &mut ScenarioConfig) {
    cfg.cluster.lb_model.default_kind = LbKind::Nlb;
    cfg.cluster.app = Behaviour::Graceful;
    keep_alive(cfg, 0.0);
}

/// An NLB, keep-alive clients, naive apps.
fn nlb_naive_app(cfg: &mut ScenarioConfig) {
    nlb_keep_alive(cfg);
    cfg.cluster.app = Behaviour::Naive;
}

/// Three ALB nodes with jittered lags and a controller latency; a delay covering them.
fn alb_jittered(cfg: &mut ScenarioConfig) {
    let model = &mut cfg.cluster.lb_model;
    model.default_kind = LbKind::Alb;
    model.alb_nodes = 3;
    model.alb_lag_jitter = 0.25;
    model.alb_controller_latency = Duration::from_millis(500);
    // The slowest node lets go at most 3 s × 1.25 + 0.5 s = 4.25 s after the slice change.
    cfg.cluster.lb.deregistration_lag = Duration::from_secs(3);
    cfg.components.deregistration_delay = Duration::from_secs(5);
}

/// The jittered ALB, a delay padded far beyond it, and confirmed release.
fn alb_confirmed(cfg: &mut ScenarioConfig) {
    alb_jittered(cfg);
    cfg.components.deregistration_delay = Duration::from_secs(30);
    cfg.components.confirmed_release = true;
}

/// An NLB, keep-alive clients with long requests, graceful apps.
fn long_requests(cfg: &mut ScenarioConfig) {
    nlb_keep_alive(cfg);
    keep_alive(cfg, 0.2);
}
