//! Stands in for the pod network: makes pod addresses reachable on loopback.
//!
//! kube-apiserver refuses an EndpointSlice address in the loopback range
//! (`ValidateEndpointIP` in pkg/apis/core/validation/validation.go, which the discovery
//! validation calls for every IPv4 and IPv6 address), so the endpoints HAProxy learns of
//! are pod addresses — KWOK hands them out from `10.64.0.0/12` — that nothing here routes,
//! and that nothing may dial. The servers standing in for the pods listen at the loopback
//! twin of each pod address instead ([`to_loopback`]: the first octet made 127,
//! `10.64.1.2` is `127.64.1.2`), and [`PodNetwork`] is a DNS relay between HAProxy and
//! CoreDNS that rewrites every A record in [`TWINNED`] to its twin. HAProxy then resolves,
//! checks and connects to loopback addresses only, with CoreDNS's answers otherwise
//! untouched (their timing, their codes, their TTLs); its statistics show the twins,
//! which [`to_pod`] turns back into pod addresses. [`TWINNED`] is all of `10.0.0.0/8`, so
//! that whatever pod CIDR a cluster uses there (and the Service CIDR `10.96.0.0/16`)
//! never reaches HAProxy as an address to dial; other addresses pass as they are.
//!
//! One owned task relays: each query goes to CoreDNS from a socket of its own, at most
//! [`MAX_IN_FLIGHT`] at once, each waiting at most [`UPSTREAM_TIMEOUT`]; an answer that
//! cannot be read is dropped rather than passed on unrewritten (the resolver asks again).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use crate::dns;

/// The addresses given a loopback twin: `10.0.0.0/8`, which holds KWOK's pod CIDR
/// (`10.64.0.0/12`) and the Service CIDR.
pub const TWINNED: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 0, 0, 0), 8);
/// Queries relayed at once; more are dropped, as a busy resolver drops them.
pub const MAX_IN_FLIGHT: usize = 64;
/// How long a relayed query waits for CoreDNS: HAProxy's own `timeout retry` (1 s) asks
/// again sooner, so a longer wait only holds a socket.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// The loopback twin of an address in [`TWINNED`]: its first octet made 127.
pub fn to_loopback(pod: Ipv4Addr) -> Option<Ipv4Addr> {
    let [a, b, c, d] = pod.octets();
    (a == TWINNED.0.octets()[0]).then_some(Ipv4Addr::new(127, b, c, d))
}

/// The pod address whose loopback twin `loopback` is ([`to_loopback`] undone).
pub fn to_pod(loopback: Ipv4Addr) -> Option<Ipv4Addr> {
    let [a, b, c, d] = loopback.octets();
    (a == 127).then_some(Ipv4Addr::new(TWINNED.0.octets()[0], b, c, d))
}

/// The relay, stopped when dropped.
#[derive(Debug)]
pub struct PodNetwork {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl PodNetwork {
    /// Relays DNS queries from `127.0.0.1:<free port>` to `upstream` (CoreDNS).
    pub async fn start(upstream: SocketAddr) -> std::io::Result<PodNetwork> {
        let socket = Arc::new(UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?);
        let addr = socket.local_addr()?;
        let span = tracing::info_span!("pod_network", %addr, %upstream);
        let task = tokio::spawn(relay(socket, upstream).instrument(span));
        Ok(PodNetwork { addr, task })
    }

    /// Where HAProxy's `nameserver` points.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(socket: Arc<UdpSocket>, upstream: SocketAddr) {
    let mut in_flight = JoinSet::new();
    let mut buf = vec![0; dns::MAX_MESSAGE];
    loop {
        tokio::select! {
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            got = socket.recv_from(&mut buf) => {
                let (n, client) = match got {
                    Ok(got) => got,
                    Err(e) => {
                        tracing::warn!(error = %e, "receive a query");
                        continue;
                    }
                };
                if in_flight.len() >= MAX_IN_FLIGHT {
                    tracing::warn!(%client, "too many queries in flight; dropped");
                    continue;
                }
                let query = buf[..n].to_vec();
                in_flight.spawn(forward(socket.clone(), upstream, client, query));
            }
        }
    }
}

/// Asks `upstream` the `query` and answers `client` with its A records rewritten.
async fn forward(socket: Arc<UdpSocket>, upstream: SocketAddr, client: SocketAddr, query: Vec<u8>) {
    let answer = async {
        let up = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        up.connect(upstream).await?;
        up.send(&query).await?;
        let mut buf = vec![0; dns::MAX_MESSAGE];
        let n = tokio::time::timeout(UPSTREAM_TIMEOUT, up.recv(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        buf.truncate(n);
        Ok::<_, std::io::Error>(buf)
    };
    let mut answer = match answer.await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::debug!(error = %e, %client, "no answer from upstream");
            return;
        }
    };
    if let Err(e) = dns::rewrite_a(&mut answer, to_loopback) {
        tracing::warn!(error = %e, %client, "unreadable answer dropped");
        return;
    }
    if let Err(e) = socket.send_to(&answer, client).await {
        tracing::debug!(error = %e, %client, "answer not delivered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses_and_their_loopback_twins_map_both_ways() {
        let pod = Ipv4Addr::new(10, 64, 1, 2);
        assert_eq!(to_loopback(pod), Some(Ipv4Addr::new(127, 64, 1, 2)));
        assert_eq!(to_pod(Ipv4Addr::new(127, 64, 1, 2)), Some(pod));
        // A ClusterIP is twinned too: HAProxy never gets a 10.x address to dial.
        let cluster_ip = Ipv4Addr::new(10, 96, 0, 1);
        assert_eq!(to_loopback(cluster_ip), Some(Ipv4Addr::new(127, 96, 0, 1)));
        assert_eq!(to_loopback(Ipv4Addr::new(192, 168, 1, 2)), None);
        assert_eq!(to_pod(Ipv4Addr::new(10, 64, 1, 2)), None);
    }
}
