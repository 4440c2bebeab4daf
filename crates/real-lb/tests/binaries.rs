//! HAProxy and CoreDNS themselves, without a control plane: HAProxy accepts the rendered
//! configurations and, with no endpoint resolved, answers 503 and counts it; CoreDNS that
//! cannot start says why. Skipped without the binaries (`bash .ci/balancers.sh`), except
//! in CI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use balancer_routes::{BalancerConfig, Lister, Source};
use real_lb::haproxy::config::{BACKEND, Listen};
use real_lb::{CoreDns, HaProxy, HaProxyConfig, Load};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn haproxy_accepts_the_rendered_configuration_with_and_without_retries() {
    let Some(haproxy) = support::available(real_lb::binaries::haproxy) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let listen = Listen {
        frontend: "127.0.0.1:18080".parse().unwrap(),
        stats: "127.0.0.1:18404".parse().unwrap(),
        socket: dir.path().join("haproxy.sock"),
    };
    for retries in [true, false] {
        let cfg = HaProxyConfig {
            retries,
            ..HaProxyConfig::new(
                "127.0.0.1:10053".parse().unwrap(),
                "web.default.svc.cluster.local",
                8080,
            )
        };
        let file = dir.path().join(format!("retries-{retries}.cfg"));
        std::fs::write(&file, cfg.render(&listen).unwrap()).unwrap();
        real_lb::haproxy::check(&haproxy, &file).await.unwrap();
    }
    let broken = dir.path().join("broken.cfg");
    std::fs::write(&broken, "backend b\n    server-template x 1-2\n").unwrap();
    let refused = real_lb::haproxy::check(&haproxy, &broken)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("server-template"), "{refused}");
}

#[tokio::test]
async fn haproxy_with_no_endpoint_resolved_answers_503_and_counts_it() {
    let Some(binary) = support::available(real_lb::binaries::haproxy) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A nameserver that never answers: every slot keeps `init-addr none`.
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let cfg = HaProxyConfig::new(
        silent.local_addr().unwrap(),
        "web.default.svc.cluster.local",
        8080,
    );
    let haproxy = HaProxy::start(&binary, &cfg, dir.path()).await.unwrap();
    let url = format!("http://{}/", haproxy.frontend());
    let load = Load::start(
        &url,
        100,
        20,
        Duration::from_secs(10),
        CancellationToken::new(),
    )
    .unwrap();
    let report = load.finish().await;
    assert_eq!(report.statuses.get(&503), Some(&20), "{report:?}");

    let stats = haproxy.stats().await.unwrap();
    assert_eq!(stats.hrsp_5xx, 20);
    assert_eq!(stats.servers.len(), cfg.slots);
    assert!(stats.routed().is_empty(), "{stats:?}");
    let page = Lister::new(&BalancerConfig::new(Source::HaProxy {
        url: haproxy.stats_url(),
        backend: Some(BACKEND.into()),
    }))
    .unwrap();
    assert!(page.routes().await.unwrap().is_empty());
}

#[tokio::test]
async fn coredns_that_cannot_start_says_why_with_its_log() {
    let Some(binary) = support::available(real_lb::binaries::coredns) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no.kubeconfig");
    let error = CoreDns::start(&binary, &missing, dir.path())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("exited during start-up"), "{message}");
    assert!(message.contains("no.kubeconfig"), "{message}");
}
