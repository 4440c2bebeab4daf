//! In-process HTTPS tests of the admission server over loopback: TLS versions, h2 via
//! ALPN, certificate rotation through a kubelet-style symlink swap, client-CA
//! enforcement, bad input, and held DELETEs (including the ReplicaSet refusal mode).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use graceful_drain_core::certs;
use graceful_drain_core::labels::{
    DELETE_AT_ANNOTATION, DRAINING_LABEL, ORIGINAL_LABELS_ANNOTATION,
};
use graceful_drain_core::runtime::Shutdown;
use graceful_drain_testing::eventually::eventually;
use graceful_drain_webhook::{cache, decide, isolate, metrics, server, tls};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

struct Server {
    addr: SocketAddr,
    shutdown: Shutdown,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn bundle() -> certs::Bundle {
    certs::generate(
        "test",
        &["localhost".to_string()],
        &["127.0.0.1".parse().unwrap()],
    )
    .unwrap()
}

/// Starts the admission server with a mock API client nobody answers (every test here
/// stays on paths that need no API call) and the given TLS files.
async fn start(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Server {
    start_with_body_limit(cert, key, client_ca, 64 * 1024).await
}

/// [`start`] with a request body limit of `max_body` bytes.
async fn start_with_body_limit(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    max_body: usize,
) -> Server {
    graceful_drain_core::runtime::install_crypto_provider();
    let (client, api) = graceful_drain_testing::fixtures::mock::client();
    tokio::spawn(serve_live_pod(api));
    let mut registry = prometheus_client::registry::Registry::default();
    let shutdown = Shutdown::new();
    let state = Arc::new(server::AppState {
        ctx: isolate::Context {
            client,
            cache: Arc::new(cache::Cache::new([])),
            identity: "test".into(),
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
            own_users: ["system:serviceaccount:gd:webhook".to_string()].into(),
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
        reviews_authenticated: client_ca.is_some(),
    });
    let resolver = Arc::new(tls::ReloadingResolver::new(
        cert.to_path_buf(),
        key.to_path_buf(),
    ));
    resolver.reload().unwrap();
    let config = Arc::new(tls::server_config(resolver, client_ca).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = server::router(state, max_body);
    tokio::spawn(server::serve(listener, config, app, shutdown.clone()));
    Server { addr, shutdown }
}

struct ClientOpts<'a> {
    ca_pem: &'a str,
    versions: &'a [&'static rustls::SupportedProtocolVersion],
    alpn: Vec<Vec<u8>>,
    identity: Option<(&'a str, &'a str)>,
}

fn client_opts(ca_pem: &str) -> ClientOpts<'_> {
    ClientOpts {
        ca_pem,
        versions: rustls::ALL_VERSIONS,
        alpn: vec![b"http/1.1".to_vec()],
        identity: None,
    }
}

fn connector(opts: &ClientOpts<'_>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(opts.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_protocol_versions(opts.versions)
        .with_root_certificates(roots);
    let mut config = match opts.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain: Vec<_> = CertificateDer::pem_slice_iter(cert.as_bytes())
                .map(Result::unwrap)
                .collect();
            builder
                .with_client_auth_cert(
                    chain,
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap()
        }
    };
    config.alpn_protocols = opts.alpn.clone();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn connect(addr: SocketAddr, opts: &ClientOpts<'_>) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    connector(opts)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// The DER of the certificate the server presented on `stream`.
fn served_cert(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

async fn post_h1(stream: TlsStream<TcpStream>, path: &str, body: Vec<u8>) -> (u16, Bytes) {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send(&mut sender, path, body).await
}

async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    body: Vec<u8>,
) -> (u16, Bytes) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .header("host", "localhost")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

fn eviction(uid: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction", "name": "web-1", "namespace": "web", "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1", "namespace": "web"}}
        }
    }))
    .unwrap()
}

fn isolated_pod_delete(uid: &str, user: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web-1", "namespace": "web", "operation": "DELETE",
            "userInfo": {"username": user},
            "oldObject": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web-1", "namespace": "web", "uid": "p1", "resourceVersion": "9",
                    "labels": {DRAINING_LABEL: "true"},
                    "annotations": {DELETE_AT_ANNOTATION: "2999-01-01T00:00:00Z",
                                    ORIGINAL_LABELS_ANNOTATION: "{\"app\":\"web\"}"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "r", "controller": true}]},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        }
    }))
    .unwrap()
}

/// The API behind the server: pod `web/web-1` as [`isolated_pod_delete`]'s review shows
/// it (the webhook reads a DELETE's pod live and acts only on what it reads); anything
/// else is not found.
async fn serve_live_pod(mut api: graceful_drain_testing::fixtures::mock::Handle) {
    let review: Value = serde_json::from_slice(&isolated_pod_delete("live", "alice")).unwrap();
    let pod = review["request"]["oldObject"].clone();
    while let Some((request, send)) = api.next_request().await {
        let (status, body) = if request.method() == http::Method::GET
            && request.uri().path() == "/api/v1/namespaces/web/pods/web-1"
        {
            (200, pod.clone())
        } else {
            (
                404,
                graceful_drain_testing::fixtures::mock::status(404, "NotFound"),
            )
        };
        let response = http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        send.send_response(response);
    }
}

fn review(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap()
}

fn write_bundle(dir: &Path) -> (certs::Bundle, PathBuf, PathBuf) {
    let b = bundle();
    let paths = certs::write(&b, dir).unwrap();
    (b, paths.cert, paths.key)
}

#[tokio::test]
async fn serves_tls12_and_tls13_with_http1_and_h2() {
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let srv = start(&cert, &key, None).await;

    for (version, want) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let opts = ClientOpts {
            versions: &[version],
            ..client_opts(&b.ca_cert)
        };
        let stream = connect(srv.addr, &opts).await.unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(want));
        let (status, body) = post_h1(stream, "/mutate/eviction", eviction("tls-uid")).await;
        assert_eq!(status, 200);
        let r = review(&body);
        assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(r["kind"], "AdmissionReview");
        assert_eq!(r["response"]["uid"], "tls-uid");
        assert_eq!(r["response"]["allowed"], true);
    }

    let opts = ClientOpts {
        alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        ..client_opts(&b.ca_cert)
    };
    let stream = connect(srv.addr, &opts).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::post("https://localhost/mutate/eviction")
        .body(Full::new(Bytes::from(eviction("h2-uid"))))
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(review(&body)["response"]["uid"], "h2-uid");
}

#[tokio::test]
async fn rejects_bad_input_with_400_and_oversized_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let srv = start(&cert, &key, None).await;
    let stream = connect(srv.addr, &client_opts(&b.ca_cert)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (status, body) = send(&mut sender, "/validate/delete", b"{not json".to_vec()).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("parse AdmissionReview"));
    // Keep-alive: the same connection serves the next review.
    let (status, body) = send(&mut sender, "/validate/delete", eviction("wrong-path")).await;
    assert_eq!(status, 200);
    assert_eq!(review(&body)["response"]["uid"], "wrong-path");
    assert!(review(&body)["response"].get("patch").is_none());
    let (status, _) = send(&mut sender, "/validate/delete", vec![b' '; 128 * 1024]).await;
    assert_eq!(status, 413);
}

/// A client that declares a large body and sends one byte of it holds that byte, not what
/// it declared: with twice the replica's body budget declared and stalled, a review is
/// still answered (it was 503 after 5 s when requests were charged by declared length).
#[tokio::test]
async fn bodies_declared_large_and_never_sent_leave_the_budget_to_reviews() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let max_body = 4 * 1024 * 1024;
    let srv = start_with_body_limit(&cert, &key, None, max_body).await;
    let stalled_count = 2 * graceful_drain_webhook::transport::BODY_BUDGET / max_body;
    let mut stalled = Vec::new();
    for _ in 0..stalled_count {
        let mut stream = connect(srv.addr, &client_opts(&b.ca_cert)).await.unwrap();
        let head = format!(
            "POST /validate/delete HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {max_body}\r\n\r\n{{"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.flush().await.unwrap();
        stalled.push(stream);
    }
    let stream = connect(srv.addr, &client_opts(&b.ca_cert)).await.unwrap();
    let (status, body) = post_h1(stream, "/validate/delete", eviction("beside-stalled")).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(review(&body)["response"]["uid"], "beside-stalled");
    drop(stalled);
}

/// Bodies that really arrive, from one address, hold at most that address's share of
/// the budget: the next are refused 503 at once, and a review from elsewhere is answered
/// (with one budget for all, one address's stalled bodies held all of it, eight of 4 MiB).
#[tokio::test]
async fn one_address_s_bodies_hold_no_more_than_its_share() {
    use graceful_drain_webhook::transport::{BODY_BUDGET, PEER_SHARE};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let max_body = 4 * 1024 * 1024;
    let srv = start_with_body_limit(&cert, &key, None, max_body).await;
    let count = BODY_BUDGET / max_body + 2;
    let (hold, held) = tokio::sync::watch::channel(());
    let (done, mut settled) = tokio::sync::mpsc::unbounded_channel();
    let mut senders = Vec::new();
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind((std::net::Ipv4Addr::new(127, 0, 3, 1), 0).into())
            .unwrap();
        let tcp = socket.connect(srv.addr).await.unwrap();
        let stream = connector(&client_opts(&b.ca_cert))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let (mut held, done) = (held.clone(), done.clone());
        senders.push(tokio::spawn(async move {
            let (mut rd, mut wr) = tokio::io::split(stream);
            let head = format!(
                "POST /validate/delete HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {max_body}\r\n\r\n"
            );
            // All but the last byte, then hold the connection. The server answers a body
            // it refuses at once; one it reads on gets no answer until its body timeout.
            let writing = async {
                let _ = wr.write_all(head.as_bytes()).await;
                let _ = wr.write_all(&vec![b' '; max_body - 1]).await;
                let _ = held.changed().await;
            };
            let answered = async {
                let mut status = [0u8; 12];
                if rd.read_exact(&mut status).await.is_ok() {
                    let _ = done.send(status.to_vec());
                }
                std::future::pending::<()>().await;
            };
            tokio::select! {
                () = writing => {}
                () = answered => {}
            }
        }));
    }
    // The answers to refused bodies come at once; 3 s bounds the wait for them.
    let mut refused = 0;
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(status) = settled.recv().await {
            assert_eq!(
                &status[..],
                b"HTTP/1.1 503",
                "{}",
                String::from_utf8_lossy(&status)
            );
            refused += 1;
        }
    })
    .await;
    let held_bodies = count - refused;
    assert!(
        held_bodies * (max_body - 1) <= PEER_SHARE,
        "{held_bodies} bodies of {} bytes from one address held at once, {refused} refused",
        max_body - 1
    );
    let stream = connect(srv.addr, &client_opts(&b.ca_cert)).await.unwrap();
    let (status, body) = post_h1(stream, "/validate/delete", eviction("beside-one-address")).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(review(&body)["response"]["uid"], "beside-one-address");
    drop(hold);
    for sender in senders {
        sender.abort();
    }
}

/// A connection that completes TLS and never sends a request is closed by the header
/// timeout (10 s) like one that sends half a request; before, it stayed open for good.
#[tokio::test]
async fn a_connection_silent_after_its_handshake_is_closed() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let srv = start(&cert, &key, None).await;
    let mut silent = connect(srv.addr, &client_opts(&b.ca_cert)).await.unwrap();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "a silent connection still open 30 s after its handshake: {read:?}"
    );
}

/// Connections that only stay open, as many as the server serves at once and from as
/// many addresses as the per-address bound asks, do not keep a review out: the one idle
/// longest makes room (before, every new connection was closed at once).
#[tokio::test]
async fn idle_connections_in_every_slot_make_room_for_a_review() {
    use graceful_drain_webhook::transport::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER};
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let srv = start(&cert, &key, None).await;
    let mut idle = Vec::new();
    for i in 0..MAX_CONNECTIONS {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        let last = u8::try_from(1 + i / MAX_CONNECTIONS_PER_PEER).unwrap();
        socket
            .bind((std::net::Ipv4Addr::new(127, 0, 2, last), 0).into())
            .unwrap();
        idle.push(socket.connect(srv.addr).await.unwrap());
    }
    let stream = connect(srv.addr, &client_opts(&b.ca_cert)).await.unwrap();
    let (status, body) = post_h1(stream, "/validate/delete", eviction("beside-idle")).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(review(&body)["response"]["uid"], "beside-idle");
    drop(idle);
}

/// The kubelet's Secret-volume layout: files are symlinks through `..data`, which is
/// swapped atomically to a new timestamped directory on rotation.
fn kubelet_volume(root: &Path, first: &Path) -> (PathBuf, PathBuf) {
    std::os::unix::fs::symlink(first, root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/tls.crt", root.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", root.join("tls.key")).unwrap();
    (root.join("tls.crt"), root.join("tls.key"))
}

fn swap_data(root: &Path, next: &Path) {
    let tmp = root.join("..data_tmp");
    std::os::unix::fs::symlink(next, &tmp).unwrap();
    std::fs::rename(&tmp, root.join("..data")).unwrap();
}

#[tokio::test]
async fn rotated_certificate_is_served_to_new_handshakes_without_dropping_connections() {
    let root = tempfile::tempdir().unwrap();
    let v1 = root.path().join("..2026_01_01_v1");
    let v2 = root.path().join("..2026_01_01_v2");
    let first = bundle();
    certs::write(&first, &v1).unwrap();
    let second = bundle();
    certs::write(&second, &v2).unwrap();
    let (cert, key) = kubelet_volume(root.path(), &v1);
    let srv = start(&cert, &key, None).await;

    let opts1 = client_opts(&first.ca_cert);
    let open = connect(srv.addr, &opts1).await.unwrap();
    assert_eq!(served_cert(&open), der_of(&first.cert));
    let (mut kept, conn) = hyper::client::conn::http1::handshake(TokioIo::new(open))
        .await
        .unwrap();
    tokio::spawn(conn);
    assert_eq!(
        send(&mut kept, "/mutate/eviction", eviction("before"))
            .await
            .0,
        200
    );

    swap_data(root.path(), &v2);
    let opts2 = client_opts(&second.ca_cert);
    eventually("the rotated certificate served", || async {
        connect(srv.addr, &opts2)
            .await
            .is_ok_and(|stream| served_cert(&stream) == der_of(&second.cert))
    })
    .await;
    // The connection opened before the rotation still works.
    let (status, body) = send(&mut kept, "/mutate/eviction", eviction("after")).await;
    assert_eq!(status, 200);
    assert_eq!(review(&body)["response"]["uid"], "after");
}

#[tokio::test]
async fn client_ca_admits_only_callers_with_a_certificate_it_signed() {
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let clients = bundle();
    let ca_path = dir.path().join("client-ca.crt");
    std::fs::write(&ca_path, &clients.ca_cert).unwrap();
    let srv = start(&cert, &key, Some(&ca_path)).await;

    let anonymous = connect(srv.addr, &client_opts(&b.ca_cert)).await;
    let rejected = match anonymous {
        Err(_) => true,
        Ok(stream) => {
            // TLS 1.3 reports the missing certificate after the client's handshake ends.
            let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = Request::post("/mutate/eviction")
                .body(Full::new(Bytes::from(eviction("x"))))
                .unwrap();
            s.send_request(req).await.is_err()
        }
    };
    assert!(rejected, "a client without a certificate was served");

    let stranger = bundle();
    let wrong = ClientOpts {
        identity: Some((&stranger.cert, &stranger.key)),
        ..client_opts(&b.ca_cert)
    };
    let served = match connect(srv.addr, &wrong).await {
        Err(_) => false,
        Ok(stream) => {
            let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = Request::post("/mutate/eviction")
                .body(Full::new(Bytes::from(eviction("x"))))
                .unwrap();
            s.send_request(req).await.is_ok()
        }
    };
    assert!(!served, "a client certificate from another CA was accepted");

    let good = ClientOpts {
        identity: Some((&clients.cert, &clients.key)),
        ..client_opts(&b.ca_cert)
    };
    let stream = connect(srv.addr, &good).await.unwrap();
    let (status, body) = post_h1(stream, "/mutate/eviction", eviction("mtls")).await;
    assert_eq!(status, 200);
    assert_eq!(review(&body)["response"]["uid"], "mtls");
}

#[tokio::test]
async fn held_delete_answers_before_the_api_server_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let srv = start(&cert, &key, None).await;
    let opts = client_opts(&b.ca_cert);

    // kubectl (a person) deleting an isolated pod is held, then allowed, within `timeout`.
    let stream = connect(srv.addr, &opts).await.unwrap();
    let started = Instant::now();
    let (status, body) = post_h1(
        stream,
        "/validate/delete?timeout=3s",
        isolated_pod_delete("held", "alice"),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 200);
    assert_eq!(review(&body)["response"]["allowed"], true);
    assert!(took >= Duration::from_millis(900), "not held: {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "held past the API server's deadline: {took:?}"
    );

    // The ReplicaSet controller is refused (and only it): its DELETE fails, which it
    // counts as observed, and the deferred deleter removes the pod after its delay.
    let stream = connect(srv.addr, &opts).await.unwrap();
    let rs = "system:serviceaccount:kube-system:replicaset-controller";
    let (status, body) = post_h1(
        stream,
        "/validate/delete?timeout=3s",
        isolated_pod_delete("rs", rs),
    )
    .await;
    assert_eq!(status, 200);
    let r = review(&body);
    assert_eq!(r["response"]["uid"], "rs");
    assert_eq!(r["response"]["allowed"], false);
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("web/web-1")
    );

    // Our own deleter passes through at once.
    let stream = connect(srv.addr, &opts).await.unwrap();
    let (status, body) = post_h1(
        stream,
        "/validate/delete?timeout=3s",
        isolated_pod_delete("own", "system:serviceaccount:gd:webhook"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(review(&body)["response"]["allowed"], true);
}

/// Whether a client presenting `identity` gets an eviction review answered.
async fn served_with(addr: SocketAddr, server_ca: &str, identity: (&str, &str)) -> bool {
    let opts = ClientOpts {
        identity: Some(identity),
        ..client_opts(server_ca)
    };
    let Ok(stream) = connect(addr, &opts).await else {
        return false;
    };
    let Ok((mut s, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        return false;
    };
    tokio::spawn(conn);
    let req = Request::post("/mutate/eviction")
        .body(Full::new(Bytes::from(eviction("x"))))
        .unwrap();
    s.send_request(req)
        .await
        .is_ok_and(|r| r.status() == http::StatusCode::OK)
}

/// A client CA rotated in its file (the kubelet swapping a Secret volume) is picked up by
/// new handshakes without a restart: the new CA's clients are served, the old CA's refused.
#[tokio::test]
async fn a_rotated_client_ca_is_picked_up_by_new_handshakes() {
    let dir = tempfile::tempdir().unwrap();
    let (b, cert, key) = write_bundle(dir.path());
    let before = bundle();
    let ca_path = dir.path().join("client-ca.crt");
    std::fs::write(&ca_path, &before.ca_cert).unwrap();
    let srv = start(&cert, &key, Some(&ca_path)).await;
    assert!(served_with(srv.addr, &b.ca_cert, (&before.cert, &before.key)).await);

    let after = bundle();
    std::fs::write(&ca_path, &after.ca_cert).unwrap();
    eventually("the rotated CA's client served", || async {
        served_with(srv.addr, &b.ca_cert, (&after.cert, &after.key)).await
    })
    .await;
    assert!(
        !served_with(srv.addr, &b.ca_cert, (&before.cert, &before.key)).await,
        "a client of the rotated-out CA is still served"
    );
}
