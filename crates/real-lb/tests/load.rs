//! The load generator against servers of the test's own on loopback: bounded in count and
//! in time, on a few keep-alive connections, every request counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use real_lb::Load;
use real_lb::load::CONNECTIONS;
use support::Pod;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_load_stops_at_its_request_count_with_every_answer_counted_on_a_few_connections() {
    let pod = Pod::start("127.0.0.1:0".parse().unwrap(), "a").await;
    let url = format!("http://{}/", pod.addr);
    let load = Load::start(
        &url,
        200,
        40,
        Duration::from_secs(20),
        CancellationToken::new(),
    )
    .unwrap();
    let report = load.finish().await;
    assert_eq!(
        (report.sent, report.ok(), report.failed()),
        (40, 40, 0),
        "{report:?}"
    );
    assert_eq!(pod.served(), 40);
    let connections = pod.connections();
    assert!(
        (1..=CONNECTIONS as u64).contains(&connections),
        "{connections} connections"
    );
}

#[tokio::test]
async fn a_load_stops_at_its_duration_at_its_rate() {
    let pod = Pod::start("127.0.0.1:0".parse().unwrap(), "a").await;
    let url = format!("http://{}/", pod.addr);
    let started = Instant::now();
    let load = Load::start(
        &url,
        20,
        1_000,
        Duration::from_millis(500),
        CancellationToken::new(),
    )
    .unwrap();
    let report = load.finish().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    // One at once, then one every 50 ms for half a second.
    assert!((8..=12).contains(&report.sent), "{report:?}");
    assert_eq!(report.ok(), report.sent);
}

#[tokio::test]
async fn stopping_or_shutting_down_ends_a_load_at_once() {
    let pod = Pod::start("127.0.0.1:0".parse().unwrap(), "a").await;
    let url = format!("http://{}/", pod.addr);
    let long = Duration::from_secs(600);
    let load = Load::start(&url, 100, 1_000_000, long, CancellationToken::new()).unwrap();
    let answered = async {
        while load.report().ok() < 5 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), answered)
        .await
        .expect("no answer");
    let report = load.stop().await;
    assert_eq!(report.ok(), report.sent, "{report:?}");
    let shutdown = CancellationToken::new();
    let load = Load::start(&url, 100, 1_000_000, long, shutdown.clone()).unwrap();
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), load.finish()).await;
    assert!(stopped.is_ok(), "the shutdown did not end the load");
}

#[tokio::test]
async fn refused_connections_are_counted_as_connection_errors() {
    let nobody = kube_control_plane::free_loopback_port().unwrap();
    let url = format!("http://{nobody}/");
    let load = Load::start(
        &url,
        100,
        5,
        Duration::from_secs(10),
        CancellationToken::new(),
    )
    .unwrap();
    let report = load.finish().await;
    assert_eq!(
        (report.sent, report.connection_errors),
        (5, 5),
        "{report:?}"
    );
    assert!(report.errors[0].contains("onnect"), "{:?}", report.errors);
}
