//! Pods as real HTTP servers on the simulated cluster ([`kube_sim::podnet`]): with a pod
//! port, each pod of a Deployment answers on the loopback twin of its IP once it is Ready,
//! and a deleted pod's listener is gone by the time its object is.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::wait::{await_condition, conditions};
use kube_sim::cluster::{Cluster, ClusterConfig, WebSpec};
use kube_sim::podnet::loopback_twin;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Bounds the waits for what the cluster does on its own timings.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `GET /` on a fresh connection to `addr`: the status and body.
async fn get(addr: SocketAddr) -> (u16, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let request = http::Request::get("/").body(Empty::<Bytes>::new()).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    drop(sender);
    driver.await.unwrap().unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn pod_ip(pod: &Pod) -> IpAddr {
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
    ip.unwrap().parse().unwrap()
}

#[tokio::test]
async fn pods_with_a_pod_port_answer_on_the_loopback_twin_of_their_ip_until_deleted() {
    let shutdown = CancellationToken::new();
    let cfg = ClusterConfig {
        nodes: 2,
        pod_port: Some(0),
        ..ClusterConfig::default()
    };
    let cluster = Cluster::start(cfg, shutdown.clone()).await.unwrap();
    let spec = WebSpec {
        replicas: 2,
        min_available: 1,
        ..WebSpec::default()
    };
    cluster.deploy_web(&spec, TIMEOUT).await.unwrap();
    let net = cluster.pod_net().expect("a pod port was configured");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &spec.namespace);
    let listed = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    assert_eq!(listed.len(), 2);
    for pod in &listed {
        let uid = pod.uid().unwrap();
        let ip = pod_ip(pod);
        assert!(
            !ip.is_loopback(),
            "{ip}: an address EndpointSlices may carry"
        );
        let addr = SocketAddr::new(loopback_twin(ip).unwrap(), net.port());
        assert_eq!(net.listening(&uid), Some(addr), "listening before Ready");
        let (status, body) = get(addr).await;
        assert_eq!(status, 200);
        assert_eq!(body, format!("default/{}\n", pod.name_any()));
        assert_eq!(cluster.apps().served(&uid), 1);
    }

    let victim = &listed[0];
    let (name, uid) = (victim.name_any(), victim.uid().unwrap());
    let twin = loopback_twin(pod_ip(victim)).unwrap();
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    let gone = await_condition(pods.clone(), &name, conditions::is_deleted(&uid));
    tokio::time::timeout(TIMEOUT, gone).await.unwrap().unwrap();
    assert_eq!(net.listening(&uid), None);
    let refused = TcpStream::connect(SocketAddr::new(twin, net.port()))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    shutdown.cancel();
}
