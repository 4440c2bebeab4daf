use std::io::ErrorKind;

use http_body_util::{BodyExt, Empty};
use hyper::StatusCode;
use hyper::client::conn::http1::{SendRequest, handshake};
use tokio::task::JoinHandle;

use super::*;

/// How long a test waits for something that should happen at once: only a guard
/// against hanging, never a pause.
const GUARD: Duration = Duration::from_secs(10);

/// An app `ns/web-1` with UID `u` that serves, and a [`PodNet`] for it.
fn serving() -> (Apps, PodNet, CancellationToken) {
    let apps = Apps::default();
    apps.start("u", "ns/web-1");
    apps.serve("u");
    let shutdown = CancellationToken::new();
    let net = PodNet::new(apps.clone(), 0, shutdown.clone()).unwrap();
    (apps, net, shutdown)
}

fn pod_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 64, 0, 7))
}

/// A keep-alive connection to `addr` and the task driving it, which ends when the
/// connection does.
async fn keep_alive(addr: SocketAddr) -> (SendRequest<Empty<Bytes>>, JoinHandle<()>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = handshake(TokioIo::new(stream)).await.unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

/// `GET /` on `sender`: the status and body.
async fn get(sender: &mut SendRequest<Empty<Bytes>>) -> hyper::Result<(StatusCode, String)> {
    sender.ready().await?;
    let request = Request::get("/").body(Empty::new()).unwrap();
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn a_pod_answers_on_its_loopback_address_over_one_keep_alive_connection() {
    let (apps, net, _shutdown) = serving();
    assert_ne!(net.port(), 0, "a port was picked");
    let addr = net.open("u", pod_ip(), 0).unwrap();
    assert_eq!(addr.ip(), pod_ip());
    assert_eq!(net.listening("u"), Some(addr));
    assert_eq!(
        net.open("u", pod_ip(), addr.port()).unwrap(),
        addr,
        "idempotent"
    );
    let (mut sender, _conn) = keep_alive(addr).await;
    for served in 1..=3 {
        let (status, body) = get(&mut sender).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "ns/web-1\n");
        assert_eq!(apps.served("u"), served);
    }
    assert_eq!(apps.connections("u"), 1, "every request on one connection");
    assert_eq!(apps.in_flight("u"), 0);
}

#[tokio::test]
async fn a_closed_listener_refuses_new_connections_and_answers_on_open_ones() {
    let (apps, net, _shutdown) = serving();
    let addr = net.open("u", pod_ip(), 0).unwrap();
    let (mut sender, _conn) = keep_alive(addr).await;
    get(&mut sender).await.unwrap();
    // As the kubelet does when the app stops accepting.
    apps.stop_accepting("u");
    assert!(net.close_listener("u"));
    assert_eq!(net.listening("u"), None);
    let refused = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    let (status, _) = get(&mut sender).await.unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "the connection accepted before still answers"
    );
    assert_eq!(apps.served("u"), 2);
    assert!(!net.close_listener("u"), "closed once");
}

#[tokio::test]
async fn closing_idle_connections_ends_them_from_the_server_side() {
    let (apps, net, _shutdown) = serving();
    let addr = net.open("u", pod_ip(), 0).unwrap();
    let (mut sender, conn) = keep_alive(addr).await;
    get(&mut sender).await.unwrap();
    apps.stop_accepting("u");
    net.close_listener("u");
    apps.close_idle("u");
    assert!(net.close_idle("u"));
    // The client's connection ends because the server closed it; nothing else ends it.
    tokio::time::timeout(GUARD, conn).await.unwrap().unwrap();
    assert!(get(&mut sender).await.is_err());
    assert_eq!(apps.served("u"), 1);
}

#[tokio::test]
async fn a_killed_pod_drops_its_connections_unanswered() {
    let (apps, net, _shutdown) = serving();
    let addr = net.open("u", pod_ip(), 0).unwrap();
    let (mut sender, conn) = keep_alive(addr).await;
    get(&mut sender).await.unwrap();
    // As the kubelet does when the process exits.
    apps.exit("u");
    assert!(net.kill("u"));
    assert!(get(&mut sender).await.is_err(), "no answer after the kill");
    tokio::time::timeout(GUARD, conn).await.unwrap().unwrap();
    let refused = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    assert_eq!(apps.served("u"), 1);
    assert!(!net.kill("u"), "killed once");
    assert!(!net.close_idle("u"));
}

#[tokio::test]
async fn the_cluster_shutdown_ends_every_connection() {
    let (_apps, net, shutdown) = serving();
    let addr = net.open("u", pod_ip(), 0).unwrap();
    let (mut sender, conn) = keep_alive(addr).await;
    get(&mut sender).await.unwrap();
    shutdown.cancel();
    tokio::time::timeout(GUARD, conn).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_connection_the_app_does_not_take_is_closed_unanswered() {
    let apps = Apps::default();
    apps.start("u", "ns/web-1");
    let net = PodNet::new(apps.clone(), 0, CancellationToken::new()).unwrap();
    // Listening before the app serves (a race the kubelet avoids): not taken.
    let addr = net.open("u", pod_ip(), 0).unwrap();
    let (mut sender, conn) = keep_alive(addr).await;
    assert!(get(&mut sender).await.is_err());
    tokio::time::timeout(GUARD, conn).await.unwrap().unwrap();
    assert_eq!(apps.connections("u"), 0);
}

#[tokio::test]
async fn only_loopback_addresses_are_bound_and_errors_name_the_pod() {
    let (_apps, net, _shutdown) = serving();
    let routable = IpAddr::V4(Ipv4Addr::new(10, 64, 0, 7));
    let error = net.open("u", routable, 0).unwrap_err();
    assert!(matches!(error, Error::NotLoopback { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("ns/web-1") && message.contains("10.64.0.7"),
        "{message}"
    );
    assert_eq!(net.listening("u"), None);
    let addr = net.open("u", pod_ip(), 0).unwrap();
    let elsewhere = IpAddr::V4(Ipv4Addr::new(127, 64, 0, 8));
    let error = net.open("u", elsewhere, 0).unwrap_err().to_string();
    assert!(
        error.contains("ns/web-1") && error.contains(&addr.to_string()),
        "{error}"
    );
    // A second pod cannot take an address another pod listens on.
    let error = net.open("v", pod_ip(), addr.port()).unwrap_err();
    assert!(matches!(error, Error::Bind { .. }), "{error:?}");
}

#[test]
fn a_pod_ip_has_the_loopback_twin_with_the_first_octet_127() {
    let twin = |ip: &str| loopback_twin(ip.parse().unwrap()).map(|t| t.to_string());
    assert_eq!(twin("10.64.1.2").as_deref(), Some("127.64.1.2"));
    assert_eq!(twin("10.101.0.7").as_deref(), Some("127.101.0.7"));
    assert_eq!(twin("127.64.0.7").as_deref(), Some("127.64.0.7"));
    assert_eq!(twin("::1").as_deref(), Some("::1"));
    assert_eq!(twin("fd00::7"), None);
}
