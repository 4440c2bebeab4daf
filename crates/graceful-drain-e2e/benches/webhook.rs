//! Admission latency and throughput over HTTPS keep-alive, and cache memory.
//!
//! Runs the real router and TLS server in-process on 127.0.0.1 with the Kubernetes API
//! answered by an in-process fake (so "isolate" excludes API latency), drives it with a
//! fixed number of keep-alive HTTP/1.1 connections for a bounded time, and prints one
//! table row per scenario. The load generator shares the machine's cores with the
//! server, so throughput figures are lower bounds. Then it fills the caches with 10,000
//! pods in 2,000 EndpointSlices and reports the process RSS.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark may panic on setup errors

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use graceful_drain_core::certs;
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_testing::fixtures::{self, PodFixture, to_json};
use graceful_drain_webhook::{cache, decide, isolate, metrics, server, tls};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

/// Concurrent keep-alive connections for the throughput run (the API server opens
/// several per webhook); the latency run uses one connection, one review at a time.
const CONNECTIONS: usize = 8;
/// Each run lasts this long at most…
const RUN_FOR: Duration = Duration::from_secs(3);
/// …and sends at most this many reviews per connection.
const MAX_PER_CONNECTION: usize = 50_000;

/// A serving pod `web/<name>` of the size a real one has (ports, requests, two conditions).
fn pod_json(name: &str) -> Value {
    let mut pod = to_json(
        &fixtures::pod(name)
            .ns("web")
            .with_uid(&format!("uid-{name}"))
            .at_version("12")
            .with_labels(&[
                ("app", "web"),
                ("pod-template-hash", "h"),
                ("team", "payments"),
            ])
            .annotate("prometheus.io/scrape", "true")
            .on_node("node-1")
            .container("registry.example/app:1.2.3")
            .running()
            .ip("10.0.0.1")
            .ready(),
    );
    let container = &mut pod["spec"]["containers"][0];
    container["ports"] = json!([{"containerPort": 8080}]);
    container["resources"] = json!({"requests": {"cpu": "100m", "memory": "128Mi"}});
    let conditions = &mut pod["status"]["conditions"];
    if let Some(list) = conditions.as_array_mut() {
        list.push(json!({"type": "ContainersReady", "status": "True"}));
    }
    pod
}

/// The fake API: GET pod, PATCH pod, POST event answer at once.
fn fake_api() -> kube::Client {
    let service = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
        let name = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let body = match *req.method() {
            http::Method::POST => json!({}),
            _ => pod_json(&name),
        };
        Ok::<_, std::convert::Infallible>(
            http::Response::builder()
                .status(200)
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        )
    });
    kube::Client::new(service, "default")
}

fn slice(i: usize, pods: std::ops::Range<usize>) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let endpoints: Vec<Value> = pods
        .map(|p| json!({"addresses": [format!("10.{}.{}.{}", p / 65536, (p / 256) % 256, p % 256)],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": format!("node-{}", p % 100), "zone": "zone-a",
            "targetRef": {"kind": "Pod", "name": format!("pod-{p}"), "namespace": "web", "uid": format!("uid-pod-{p}")}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("svc-{i}-x"), "namespace": "web",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}"), "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    }))
    .unwrap()
}

fn fill(cache: &cache::Cache, pods: usize, slices: usize) {
    let per = pods / slices;
    for i in 0..slices {
        cache.apply_slice(&slice(i, i * per..(i + 1) * per));
        cache.apply_service(
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("svc-{i}"), "namespace": "web"},
                "spec": {"type": "LoadBalancer", "selector": {"app": format!("app-{i}")}, "ports": [{"port": 80}]}}))
            .unwrap(),
        );
    }
}

fn eviction(pod: &str, n: usize) -> Vec<u8> {
    eviction_in("web", pod, n)
}

fn eviction_in(namespace: &str, pod: &str, n: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": format!("uid-{n}"),
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction", "name": pod, "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:node:node-1"},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace},
                       "deleteOptions": {"gracePeriodSeconds": 30}}}}))
    .unwrap()
}

fn deletion_in(namespace: &str, pod: &str, n: usize) -> Vec<u8> {
    let mut old = pod_json(pod);
    old["metadata"]["namespace"] = json!(namespace);
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": format!("uid-{n}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod, "namespace": namespace, "operation": "DELETE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "oldObject": old,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}}}),
    )
    .unwrap()
}

struct Row {
    name: &'static str,
    /// One connection, one review at a time.
    p50: Duration,
    p99: Duration,
    /// Eight connections flat out.
    count: usize,
    elapsed: Duration,
    loaded_p99: Duration,
}

async fn load(
    addr: std::net::SocketAddr,
    ca: &str,
    path: &'static str,
    body: fn(usize, usize) -> Vec<u8>,
    connections: usize,
) -> (Vec<Duration>, Duration) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let connector = connector.clone();
        tasks.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let tls = connector
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            let mut latencies = Vec::new();
            for n in 0..MAX_PER_CONNECTION {
                if started.elapsed() >= RUN_FOR {
                    break;
                }
                let req = http::Request::post(path)
                    .header("host", "localhost")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body(c, n))))
                    .unwrap();
                let t = Instant::now();
                let resp = sender.send_request(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                latencies.push(t.elapsed());
                assert!(bytes.starts_with(b"{\"apiVersion\":\"admission.k8s.io/v1\""));
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all, started.elapsed())
}

fn quantile(latencies: &mut [Duration], q: f64) -> Duration {
    latencies.sort();
    latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)]
}

async fn scenario(
    name: &'static str,
    addr: std::net::SocketAddr,
    ca: &str,
    path: &'static str,
    body: fn(usize, usize) -> Vec<u8>,
) -> Row {
    let (mut single, _) = load(addr, ca, path, body, 1).await;
    let (mut loaded, elapsed) = load(addr, ca, path, body, CONNECTIONS).await;
    Row {
        name,
        p50: quantile(&mut single, 0.50),
        p99: quantile(&mut single, 0.99),
        count: loaded.len(),
        elapsed,
        loaded_p99: quantile(&mut loaded, 0.99),
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_string)
        })
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    graceful_drain_core::runtime::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async_main());
}

async fn async_main() {
    let rss_start = rss_kib();
    let dir = tempfile::tempdir().unwrap();
    let bundle = certs::generate("bench", &["localhost".into()], &[]).unwrap();
    let paths = certs::write(&bundle, dir.path()).unwrap();
    let cache = Arc::new(cache::Cache::new([]));
    fill(&cache, 10_000, 2_000);
    let rss_filled = rss_kib();

    let mut registry = prometheus_client::registry::Registry::default();
    let shutdown = Shutdown::new();
    let state = Arc::new(server::AppState {
        ctx: isolate::Context {
            client: fake_api(),
            cache,
            identity: "bench".into(),
            events: isolate::EventSink::Inline,
            keep_labels: Default::default(),
            restore_after: isolate::RESTORE_AFTER,
            gates: Default::default(),
            owners: Default::default(),
            nodes: Default::default(),
        },
        settings: decide::Settings {
            default_delay: Duration::from_secs(60),
            max_delay: Duration::from_secs(600),
            exposure: decide::Exposure::EndpointSlice,
            own_users: Default::default(),
        },
        metrics: Arc::new(metrics::Metrics::new(&mut registry)),
        default_timeout: Duration::from_secs(10),
        shutdown: shutdown.clone(),
        holds: server::Holds::default(),
        watch_drained_nodes: false,
        unconfirmed: Default::default(),
        scale_downs: Default::default(),
        controllers: Default::default(),
        throttles: Default::default(),
        reviews_authenticated: false,
    });
    let resolver = Arc::new(tls::ReloadingResolver::new(paths.cert, paths.key));
    resolver.reload().unwrap();
    let config = Arc::new(tls::server_config(resolver, None).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve(
        listener,
        config,
        server::router(state, graceful_drain_webhook::DEFAULT_MAX_BODY),
        shutdown.clone(),
    ));

    let ca = bundle.ca_cert.as_str();
    let rows = vec![
        // Pods outside every slice, in a namespace no Service selects in: answered from
        // the cache alone.
        scenario(
            "pass-through eviction (not exposed)",
            addr,
            ca,
            "/mutate/eviction",
            |c, n| eviction_in("batch", &format!("batch-{c}-{n}"), n),
        )
        .await,
        scenario(
            "pass-through DELETE (not exposed)",
            addr,
            ca,
            "/validate/delete",
            |c, n| deletion_in("batch", &format!("batch-{c}-{n}"), n),
        )
        .await,
        // Exposed pods: GET pod, relabel PATCH, Event (the fake API answers at once).
        scenario(
            "isolate eviction (API mocked)",
            addr,
            ca,
            "/mutate/eviction",
            |c, n| eviction(&format!("pod-{}", (c * 1000 + n) % 10_000), n),
        )
        .await,
    ];
    let rss_before_hostile = rss_kib();
    let hostile = hostile(addr, ca).await;
    shutdown.cancel();
    let rss_end = rss_kib();

    println!(
        "\ngraceful-drain webhook benchmark (HTTPS keep-alive, HTTP/1.1, TLS 1.3, 2 worker threads; load generator in-process)\n"
    );
    println!(
        "| scenario | p50 (1 conn) | p99 (1 conn) | max reviews/s ({CONNECTIONS} conns) | p99 at max |"
    );
    println!("|---|---:|---:|---:|---:|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for r in &rows {
        println!(
            "| {} | {:.3} ms | {:.3} ms | {:.0} | {:.3} ms |",
            r.name,
            ms(r.p50),
            ms(r.p99),
            r.count as f64 / r.elapsed.as_secs_f64(),
            ms(r.loaded_p99)
        );
    }
    println!("\n| memory | RSS |");
    println!("|---|---:|");
    println!(
        "| process at start | {:.1} MiB |",
        rss_start as f64 / 1024.0
    );
    println!(
        "| caches filled: 10,000 pods in 2,000 EndpointSlices + 2,000 Services | {:.1} MiB |",
        rss_filled as f64 / 1024.0
    );
    println!(
        "| after the load scenarios | {:.1} MiB |",
        rss_before_hostile as f64 / 1024.0
    );
    println!(
        "| peak while {HUGE_REVIEWS} reviews of {:.1} MB, {WIDE_REVIEWS} intricate ones of {:.1} MB, {STALLED_BODIES} stalled bodies and {} slow connections arrive | {:.1} MiB |",
        HUGE_BYTES as f64 / 1e6,
        WIDE_BYTES as f64 / 1e6,
        hostile.slow_open,
        hostile.peak_rss_kib as f64 / 1024.0
    );
    println!(
        "| after all scenarios | {:.1} MiB |",
        rss_end as f64 / 1024.0
    );
    println!("\n| under hostile load | value |");
    println!("|---|---:|");
    println!(
        "| {HUGE_REVIEWS} reviews of {:.1} MB: answered 413 | {} |",
        HUGE_BYTES as f64 / 1e6,
        hostile.huge_refused
    );
    println!(
        "| {WIDE_REVIEWS} reviews of {:.1} MB, an array of one-key objects, from one address: refused before they are built (400 past the count of values, 503 past the address's share) | {} |",
        WIDE_BYTES as f64 / 1e6,
        hostile.wide_refused
    );
    println!(
        "| {STALLED_BODIES} requests declaring {:.2} MiB and sending one byte, meanwhile | held |",
        graceful_drain_webhook::DEFAULT_MAX_BODY as f64 / (1024.0 * 1024.0)
    );
    println!(
        "| slow connections tried from 3 addresses / served (TLS done, half a request sent; {} per address) | {SLOW_CONNECTIONS} / {} |",
        graceful_drain_webhook::transport::MAX_CONNECTIONS_PER_PEER,
        hostile.slow_open
    );
    println!(
        "| …still open {} s later (header timeout 10 s) | {} |",
        SLOW_WAIT.as_secs(),
        hostile.slow_left
    );
    println!(
        "| isolate-eviction p99 meanwhile ({CONNECTIONS} conns) | {:.3} ms ({} reviews) |",
        ms(hostile.p99),
        hostile.reviews
    );
}

/// Oversized reviews sent at once during the hostile run, and their size: a review of a
/// pod as big as a 7.9 MB body (past kube-apiserver's 3 MiB request limit, so none is real).
const HUGE_REVIEWS: usize = 10;
const HUGE_BYTES: usize = 7_900_000;
/// Requests that declare a body of the largest size allowed and send one byte of it.
const STALLED_BODIES: usize = 200;
/// Reviews of 3.3 MB (under the body limit) of an array of one-key objects, sent at once.
const WIDE_REVIEWS: usize = 9;
const WIDE_BYTES: usize = 3_300_000;
/// Connections that finish TLS, send half a request's headers and stall.
const SLOW_CONNECTIONS: usize = 3_000;
/// How long after the slow connections opened they are counted again.
const SLOW_WAIT: Duration = Duration::from_secs(12);

struct Hostile {
    huge_refused: usize,
    wide_refused: usize,
    slow_open: usize,
    slow_left: usize,
    p99: Duration,
    reviews: usize,
    peak_rss_kib: u64,
}

/// Real reviews under attack: huge bodies and connections that never finish a request.
async fn hostile(addr: std::net::SocketAddr, ca: &str) -> Hostile {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector = tls_connector(ca);
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss_kib()));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // The slow connections first: each holds a TLS session and half a request.
    // From addresses of their own in the loopback range (one per 1,000), as attackers on
    // the pod network would be, apart from the API server's (127.0.0.1 here).
    let mut slow = Vec::new();
    for i in 0..SLOW_CONNECTIONS {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        let from = std::net::Ipv4Addr::new(127, 0, 1, u8::try_from(1 + i / 1000).unwrap());
        if socket.bind((from, 0).into()).is_err() {
            continue;
        }
        let Ok(tcp) = socket.connect(addr).await else {
            continue;
        };
        let name = ServerName::try_from("localhost").unwrap();
        let Ok(mut tls) = connector.connect(name, tcp).await else {
            continue;
        };
        if tls
            .write_all(b"POST /validate/delete HTTP/1.1\r\nhost: localhost\r\n")
            .await
            .is_ok()
        {
            slow.push(tls);
        }
    }
    let slow_open = slow.len();
    // Requests that declare the largest body and send one byte of it, from addresses of
    // their own: twice the replica's body budget declared.
    let mut stalled = Vec::new();
    for i in 0..STALLED_BODIES {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        let from = std::net::Ipv4Addr::new(127, 0, 2, u8::try_from(1 + i / 100).unwrap());
        socket.bind((from, 0).into()).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let head = format!(
            "POST /validate/delete HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n\r\n{{",
            graceful_drain_webhook::DEFAULT_MAX_BODY
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        stalled.push(tls);
    }
    // Reviews under the body limit whose JSON costs the most to build: an array of
    // one-key objects in the pod's spec.
    let wide = (0..WIDE_REVIEWS).map(|_| {
        // Built as text: a Value of it would cost the load generator what it costs the
        // server, and the RSS shown is the process's.
        let review = String::from_utf8(deletion_in("web", "wide", 0)).unwrap();
        let filler = format!("[{}{{\"a\":0}}]", "{\"a\":0},".repeat(WIDE_BYTES / 8));
        let body = review.replacen("\"spec\":{", &format!("\"spec\":{{\"x\":{filler},"), 1);
        // From an address of their own, as an attacker's pod would send them.
        let from = std::net::Ipv4Addr::new(127, 0, 4, 1);
        tokio::spawn(post_once(connector.clone(), addr, from, body.into_bytes()))
    });
    let wide: Vec<_> = wide.collect();
    let opened = Instant::now();
    // The huge reviews and real ones at once.
    let huge = (0..HUGE_REVIEWS).map(|_| {
        let body = vec![b' '; HUGE_BYTES];
        tokio::spawn(post_once(
            connector.clone(),
            addr,
            std::net::Ipv4Addr::LOCALHOST,
            body,
        ))
    });
    let huge: Vec<_> = huge.collect();
    let (mut latencies, _) = load(
        addr,
        ca,
        "/mutate/eviction",
        |c, n| eviction(&format!("pod-{}", (c * 1000 + n) % 10_000), n),
        CONNECTIONS,
    )
    .await;
    let mut huge_refused = 0;
    for h in huge {
        if h.await.ok().flatten() == Some(413) {
            huge_refused += 1;
        }
    }
    let mut wide_refused = 0;
    for w in wide {
        if matches!(w.await.ok().flatten(), Some(400 | 503)) {
            wide_refused += 1;
        }
    }
    drop(stalled);
    tokio::time::sleep(SLOW_WAIT.saturating_sub(opened.elapsed())).await;
    // A connection the server closed reads end-of-file (or an error) at once.
    let mut slow_left = 0;
    for mut conn in slow {
        let mut buf = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(5), conn.read(&mut buf)).await {
            Err(_) => slow_left += 1,
            Ok(Ok(n)) if n > 0 => slow_left += 1,
            Ok(_) => {}
        }
    }
    sampling.abort();
    Hostile {
        huge_refused,
        wide_refused,
        slow_open,
        slow_left,
        reviews: latencies.len(),
        p99: quantile(&mut latencies, 0.99),
        peak_rss_kib: peak.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Posts one review `body` to the server at `addr` from address `from`, on a connection of
/// its own, and returns the answer's status; `None` when the connection failed.
async fn post_once(
    connector: tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
    from: std::net::Ipv4Addr,
    body: Vec<u8>,
) -> Option<u16> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind((from, 0).into()).ok()?;
    let tcp = socket.connect(addr).await.ok()?;
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = http::Request::post("/validate/delete?timeout=30s")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.ok()?;
    Some(resp.status().as_u16())
}

fn tls_connector(ca: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}
