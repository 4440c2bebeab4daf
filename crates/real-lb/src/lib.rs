//! # real-lb
//!
//! A real load balancer for the real test tier (docs/design.md §9): HAProxy 2.6 balancing
//! over a headless Service's endpoints as it learns them from CoreDNS, which reads them
//! from the cluster's API server — the path an HAProxy ingress with `server-template` and
//! DNS service discovery takes in a cluster — and a load generator to send it traffic.
//!
//! The pieces, each a process or task of its own that stops when its value is dropped:
//!
//! * [`binaries`]: where `coredns` and `haproxy` are (`.ci/balancers.sh` provides both).
//! * [`CoreDns`]: CoreDNS v1.15 serving `cluster.local` on loopback from a kubeconfig.
//! * [`PodNetwork`]: a DNS relay between HAProxy and CoreDNS that makes pod addresses
//!   reachable on loopback (the API server refuses loopback endpoints; see its module).
//! * [`HaProxy`]: HAProxy from a [`HaProxyConfig`] whose defaults are HAProxy's own,
//!   written out; its statistics ([`BackendStats`]) come from the stats socket.
//! * [`StatsRelay`]: HAProxy's statistics with pod addresses, for the webhook's confirmed
//!   release.
//! * [`Load`]: HTTP/1.1 GETs at a steady rate over a few keep-alive connections, bounded
//!   in count and time, counted into a [`LoadReport`].
//!
//! Everything listens on 127.0.0.1 and dials loopback addresses only.
//!
//! ```no_run
//! # async fn run(kubeconfig: &std::path::Path, dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
//! use real_lb::{CoreDns, HaProxy, HaProxyConfig, Load, PodNetwork};
//!
//! let coredns = CoreDns::start(&real_lb::binaries::coredns()?, kubeconfig, dir).await?;
//! let pods = PodNetwork::start(coredns.addr()).await?;
//! let cfg = HaProxyConfig::new(pods.addr(), "web.default.svc.cluster.local", 8080);
//! let haproxy = HaProxy::start(&real_lb::binaries::haproxy()?, &cfg, dir).await?;
//! let url = format!("http://{}/", haproxy.frontend());
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let load = Load::start(&url, 50, 500, std::time::Duration::from_secs(20), shutdown)?;
//! let report = load.finish().await;
//! assert_eq!(report.five_xx(), 0);
//! # Ok(())
//! # }
//! ```

pub mod binaries;
pub mod coredns;
pub mod dns;
pub mod haproxy;
pub mod load;
pub mod pod_network;
mod process;
pub mod stats_relay;

pub use coredns::CoreDns;
pub use haproxy::HaProxy;
pub use haproxy::config::{HaProxyConfig, HealthCheck, Resolvers, Timeouts};
pub use haproxy::stats::{BackendStats, ServerStats};
pub use load::{Load, LoadReport};
pub use pod_network::PodNetwork;
pub use stats_relay::StatsRelay;
