//! HAProxy routing through CoreDNS to a headless Service on a real control plane of ours
//! (kube-control-plane's cached build): what an HAProxy ingress with DNS service discovery
//! does in a cluster, down to the endpoint that goes away.
//!
//! Needs the control plane (`cargo xtask control-plane build`), HAProxy and CoreDNS (`bash
//! .ci/balancers.sh`); without them the test says so and passes, except in CI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use balancer_routes::{BalancerConfig, Lister, Source};
use real_lb::haproxy::config::BACKEND;
use real_lb::pod_network::to_loopback;
use real_lb::{BackendStats, CoreDns, HaProxy, HaProxyConfig, Load, PodNetwork};
use support::Pod;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// The Service's name in `default`.
const SERVICE: &str = "web";
/// How long HAProxy may take to see an endpoint come or go: a DNS answer every second, or
/// three failed health checks two seconds apart, on a loaded machine.
const ROUTING_DEADLINE: Duration = Duration::from_secs(30);

/// The Service and its EndpointSlice with `pods` (address, ready) on `port`, applied as an
/// administrator. The slice is managed by the test, so the EndpointSlice controller leaves
/// it alone (the Service has no selector either).
async fn apply(kubeconfig: &Path, port: u16, pods: &[(Ipv4Addr, bool)]) {
    let endpoints: String = pods
        .iter()
        .map(|(ip, ready)| format!("- addresses: [\"{ip}\"]\n  conditions: {{ready: {ready}}}\n"))
        .collect();
    let manifest = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {SERVICE}, namespace: default}}\n\
         spec:\n  clusterIP: None\n  ports: [{{name: http, port: {port}}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata:\n  name: {SERVICE}-1\n  namespace: default\n  labels:\n\
         \x20   kubernetes.io/service-name: {SERVICE}\n\
         \x20   endpointslice.kubernetes.io/managed-by: real-lb.graceful-drain.io\n\
         addressType: IPv4\nports: [{{name: http, port: {port}, protocol: TCP}}]\n\
         endpoints:\n{endpoints}"
    );
    let kubectl = kube_control_plane::kubectl().expect(kube_control_plane::KUBECTL_WHERE);
    let mut child = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(manifest.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "kubectl apply:\n{manifest}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls HAProxy's statistics (nothing announces a change) until HAProxy routes to
/// exactly `want`, each of them `UP` with its health checks passed (a server given an
/// address is `UP 1/3` until its first checks), within [`ROUTING_DEADLINE`]; the
/// statistics then, and how long it took.
async fn await_routes(haproxy: &HaProxy, want: &BTreeSet<SocketAddr>) -> (BackendStats, Duration) {
    let started = Instant::now();
    loop {
        let stats = haproxy.stats().await.unwrap();
        let checked = stats
            .servers
            .iter()
            .filter(|s| s.routes())
            .all(|s| s.status == "UP");
        if stats.routed() == *want && checked {
            return (stats, started.elapsed());
        }
        assert!(
            started.elapsed() < ROUTING_DEADLINE,
            "haproxy still routes to {:?}, not {want:?}, after {ROUTING_DEADLINE:?}: {stats:#?}\nlog:\n{}",
            stats.routed(),
            std::fs::read_to_string(haproxy.log()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tier_haproxy_routes_through_coredns_to_a_headless_service() {
    let (Some(haproxy_bin), Some(coredns_bin)) = (
        support::available(real_lb::binaries::haproxy),
        support::available(real_lb::binaries::coredns),
    ) else {
        return;
    };
    let Some(options) =
        support::available(|| kube_control_plane::cached_options(false, Vec::new()))
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let plane_dir = dir.path().join("plane");
    let plane = tokio::task::spawn_blocking(move || kube_control_plane::up(&plane_dir, &options))
        .await
        .unwrap()
        .unwrap();
    eprintln!("control plane up in {:?}", started.elapsed());
    let kubeconfig = plane.admin_kubeconfig();

    // Two pods: their addresses in the EndpointSlice, their servers at the loopback twins.
    let port = kube_control_plane::free_loopback_port().unwrap().port();
    let pod_ips = [Ipv4Addr::new(10, 64, 0, 2), Ipv4Addr::new(10, 64, 0, 3)];
    let twin = |ip: Ipv4Addr| SocketAddr::new(IpAddr::V4(to_loopback(ip).unwrap()), port);
    let a = Pod::start(twin(pod_ips[0]), "a").await;
    let b = Pod::start(twin(pod_ips[1]), "b").await;
    apply(&kubeconfig, port, &[(pod_ips[0], true), (pod_ips[1], true)]).await;

    let coredns = CoreDns::start(&coredns_bin, &kubeconfig, dir.path())
        .await
        .unwrap();
    let fqdn = format!("{SERVICE}.default.svc.cluster.local");
    let pods = PodNetwork::start(coredns.addr()).await.unwrap();
    let cfg = HaProxyConfig {
        slots: 4,
        ..HaProxyConfig::new(pods.addr(), fqdn.clone(), port)
    };
    let haproxy = HaProxy::start(&haproxy_bin, &cfg, dir.path())
        .await
        .unwrap();
    let both: BTreeSet<_> = [a.addr, b.addr].into();
    let (stats, took) = await_routes(&haproxy, &both).await;
    eprintln!("haproxy routes to both pods {took:?} after it started: {stats:#?}");

    // 50 requests through the frontend: every one answered 200, by both pods.
    let url = format!("http://{}/", haproxy.frontend());
    let shutdown = CancellationToken::new();
    let load = Load::start(&url, 50, 50, Duration::from_secs(30), shutdown.clone()).unwrap();
    let report = load.finish().await;
    assert_eq!((report.sent, report.ok()), (50, 50), "{report:?}");
    assert!(
        a.served() > 0 && b.served() > 0,
        "a {} b {}",
        a.served(),
        b.served()
    );
    assert_eq!(haproxy.stats().await.unwrap().hrsp_5xx, 0);
    // The stats page tells balancer-routes the same addresses.
    let lister = Lister::new(&BalancerConfig::new(Source::HaProxy {
        url: haproxy.stats_url(),
        backend: Some(BACKEND.into()),
    }))
    .unwrap();
    let routes = lister.routes().await.unwrap();
    for pod in [&a, &b] {
        assert!(routes.routes_to(pod.addr.ip(), Some(port)), "{routes:?}");
    }

    // Under load, pod b's process goes away, then its endpoint turns not ready: HAProxy
    // stops routing to it, and with retries on no client sees a 5xx.
    let load = Load::start(&url, 50, 3_000, Duration::from_secs(60), shutdown.clone()).unwrap();
    let (b_addr, a_addr) = (b.addr, a.addr);
    b.stop().await;
    apply(
        &kubeconfig,
        port,
        &[(pod_ips[0], true), (pod_ips[1], false)],
    )
    .await;
    let changed = Instant::now();
    while coredns.resolve(&fqdn).await.unwrap() != [pod_ips[0]] {
        assert!(
            changed.elapsed() < ROUTING_DEADLINE,
            "coredns still answers {}",
            pod_ips[1]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dns_took = changed.elapsed();
    let (stats, _) = await_routes(&haproxy, &[a_addr].into()).await;
    eprintln!(
        "{b_addr} left coredns's answers {dns_took:?} and haproxy's routes {:?} after its \
         endpoint turned not ready: {stats:#?}",
        changed.elapsed()
    );
    let sent_then = load.report().sent;
    let more = async {
        while load.report().sent < sent_then + 25 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), more)
        .await
        .unwrap();
    let report = load.stop().await;
    let stats = haproxy.stats().await.unwrap();
    eprintln!("{report:?}\n{stats:#?}");
    assert_eq!(report.five_xx(), 0, "{report:?}");
    assert_eq!(report.failed(), 0, "{report:?}");
    assert_eq!(report.ok(), report.sent, "{report:?}");
    assert_eq!(stats.hrsp_5xx, 0, "{stats:#?}");
    // CoreDNS first: kube-apiserver stopped with its watches open waits them out (15 s
    // here, until kube-control-plane's SIGKILL; 1.4 s without them).
    drop((haproxy, pods, coredns));
    drop(plane);
}
