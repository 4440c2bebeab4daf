//! The real tier's forged-transport row: `kubectl drain` of the busiest node while clients
//! that anyone on the pod network could run hold the webhook's port — requests that
//! declare the largest body and send one byte of it, requests that send all but the last
//! byte of the largest body from addresses enough to take the replica's whole body budget,
//! connections that finish TLS and say nothing, and bare TCP connections in every slot the
//! replica serves, each kind from addresses of its own in 127.0.0.0/8 as attackers' pods
//! would have. The API server's
//! reviews must still be answered: had they failed, kube-apiserver would have let the
//! evictions through unprotected (the chart's `failurePolicy: Ignore`) and the drain would
//! have shown 5xx.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use super::components::Components;
use super::{Error, Measured, ScenarioConfig, actions, drainers, measure};
use graceful_drain_webhook::transport::{
    BODY_BUDGET, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, PEER_SHARE,
};
use kube_sim::cluster::RealCluster;

/// Requests that declare the largest body allowed and send one byte of it: twice the
/// replica's body budget declared, ten from each address.
const STALLED: usize = 2 * BODY_BUDGET / graceful_drain_webhook::DEFAULT_MAX_BODY;
/// Connections that finish TLS and send nothing, from one address.
const SILENT: usize = 64;
/// Addresses sending all but the last byte of the largest bodies, each as many as its
/// share of the budget holds: together more than the whole budget.
const FULL_ADDRESSES: usize = BODY_BUDGET / PEER_SHARE + 1;
/// Full-size bodies from each of [`FULL_ADDRESSES`].
const FULL_PER_ADDRESS: usize = PEER_SHARE / graceful_drain_webhook::DEFAULT_MAX_BODY;

/// The hostile clients, connected; dropping it closes them.
struct Mix {
    stalled: Vec<tokio_rustls::client::TlsStream<TcpStream>>,
    /// Each sends its body on a task of its own (the server stops reading a body it has
    /// no budget for, and the write waits).
    full: Vec<tokio::task::JoinHandle<()>>,
    silent: Vec<tokio_rustls::client::TlsStream<TcpStream>>,
    idle: Vec<TcpStream>,
}

impl Drop for Mix {
    fn drop(&mut self) {
        for sender in &self.full {
            sender.abort();
        }
    }
}

impl std::fmt::Display for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests declaring {} bytes with one byte sent, {} sending all but the last byte from {FULL_ADDRESSES} addresses, {} silent TLS connections, {} bare TCP connections",
            self.stalled.len(),
            graceful_drain_webhook::DEFAULT_MAX_BODY,
            self.full.len(),
            self.silent.len(),
            self.idle.len()
        )
    }
}

/// A socket bound to `from`, connected to `to`.
async fn tcp_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    socket.connect(to).await
}

impl Mix {
    /// Connects every client to the webhook at `addr`, whose certificate `ca` signed.
    async fn open(addr: SocketAddr, ca: &str) -> Result<Mix, Error> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
            let cert = cert.map_err(|e| failed(format!("the webhook's CA: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| failed(format!("the webhook's CA: {e}")))?;
        }
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tls = |from: Ipv4Addr| {
            let connector = connector.clone();
            async move {
                let tcp = tcp_from(from, addr).await?;
                let name = rustls_pki_types::ServerName::try_from("localhost")
                    .map_err(std::io::Error::other)?;
                connector.connect(name, tcp).await
            }
        };
        let connect = |what: &'static str| move |e: std::io::Error| failed(format!("{what}: {e}"));
        let mut mix = Mix {
            stalled: Vec::new(),
            full: Vec::new(),
            silent: Vec::new(),
            idle: Vec::new(),
        };
        let head = format!(
            "POST /validate/delete?timeout=10s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{{",
            graceful_drain_webhook::DEFAULT_MAX_BODY
        );
        for i in 0..STALLED {
            let from = Ipv4Addr::new(127, 0, 7, u8::try_from(1 + i / 10).unwrap_or(u8::MAX));
            let mut stream = tls(from).await.map_err(connect("a stalled request"))?;
            stream
                .write_all(head.as_bytes())
                .await
                .map_err(connect("a stalled request"))?;
            stream.flush().await.map_err(connect("a stalled request"))?;
            mix.stalled.push(stream);
        }
        let body = vec![b' '; graceful_drain_webhook::DEFAULT_MAX_BODY - 2];
        for i in 0..FULL_ADDRESSES * FULL_PER_ADDRESS {
            let from = Ipv4Addr::new(
                127,
                0,
                5,
                u8::try_from(1 + i / FULL_PER_ADDRESS).unwrap_or(u8::MAX),
            );
            let mut stream = tls(from).await.map_err(connect("a full-size request"))?;
            let (head, body) = (head.clone(), body.clone());
            mix.full.push(tokio::spawn(async move {
                // Held until the row drops the mix; the server answers it 503 or 408.
                if stream.write_all(head.as_bytes()).await.is_ok()
                    && stream.write_all(&body).await.is_ok()
                {
                    let _ = stream.flush().await;
                    std::future::pending::<()>().await;
                }
            }));
        }
        for _ in 0..SILENT {
            let stream = tls(Ipv4Addr::new(127, 0, 8, 1))
                .await
                .map_err(connect("a silent connection"))?;
            mix.silent.push(stream);
        }
        // Bare connections last, in every slot: the server closes the idlest to make room
        // (the silent ones first), and the rest once its handshake timeout passes.
        for i in 0..MAX_CONNECTIONS {
            let last = u8::try_from(1 + i / MAX_CONNECTIONS_PER_PEER).unwrap_or(u8::MAX);
            match tcp_from(Ipv4Addr::new(127, 0, 6, last), addr).await {
                Ok(stream) => mix.idle.push(stream),
                // The kernel's accept queue may refuse some while the server closes others.
                Err(error) => tracing::debug!(%error, "a bare connection to the webhook"),
            }
        }
        Ok(mix)
    }
}

/// Runs the row: the standard Deployment in a namespace of its own, the hostile clients
/// connected, then `kubectl drain` of its busiest node under traffic, with the same
/// bound as the kubectl-drain row.
pub(super) async fn row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &Components,
) -> Result<Measured, Error> {
    let mut cfg = cfg.clone();
    cfg.web.namespace = "forged-transport".into();
    // The drained node's pods fit the budget at once, as in the kubectl-drain row.
    cfg.web.min_available = cfg.web.replicas / 2;
    let timeout = cfg.phase_timeout;
    cluster.ensure_namespace(&cfg.web.namespace).await?;
    cluster.deploy_web(&cfg.web, timeout).await?;
    let (addr, ca) = components
        .webhook_endpoint()
        .ok_or_else(|| failed("no webhook running".into()))?;
    let node = super::busiest_node(cluster, &cfg.web).await?;
    let mix = Mix::open(addr, &ca).await?;
    let connected = format!("hostile clients on the webhook's port: {mix}");
    eprintln!("forged-transport: {connected}");
    cluster.step(connected);
    let drain = async {
        cluster.step(format!("kubectl drain {node}"));
        actions::kubectl_drain(cluster.kubeconfig(), &node, timeout).await
    };
    let measured = measure(cluster, &cfg, drain).await;
    drop(mix);
    // The agents cordoned it for the drain: a LifecycleEvent of the maintenance
    // transition returns it, as the kubectl-drain row does.
    actions::lifecycle_uncordon(&cluster.client(), &node, timeout).await?;
    super::workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    let measured = measured?;
    let bound = cfg.components.deregistration_delay + cfg.cluster.kubelet.exit_after_sigterm;
    let summary = drainers::against_bound(
        "kubectl drain beside hostile clients",
        measured.duration,
        bound,
    );
    eprintln!("forged-transport: {summary}");
    cluster.step(summary);
    drainers::within_bound(
        "kubectl drain beside hostile clients",
        measured.duration,
        bound,
    )?;
    Ok(measured)
}

fn failed(reason: String) -> Error {
    Error::Component {
        name: "forged-transport".into(),
        reason,
    }
}
