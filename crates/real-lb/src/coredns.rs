//! CoreDNS serving the cluster's zone from its API server, as in a cluster: its
//! `kubernetes` plugin watches Services and EndpointSlices through a kubeconfig and answers
//! a headless Service's name with the addresses of its ready endpoints.
//!
//! [`CoreDns::start`] writes a Corefile ([`corefile`]) with one server block, `cluster.local`
//! on `127.0.0.1:<free port>` over UDP and TCP (`bind 127.0.0.1`), and no health, ready or
//! metrics listener at all. It starts `coredns -conf Corefile` with its output in
//! `coredns.log` beside it, and returns once CoreDNS answers
//! `kubernetes.default.svc.cluster.local` with an address, which it does once its watches
//! have synced (the plugin's README, "Startup": until then it answers SERVFAIL, for at
//! most 5 s it holds answers back). A process that exits, or one that does not answer
//! within [`READY_TIMEOUT`], is an [`Error`] carrying the log's last lines.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::dns;
use crate::process::Child;

/// The zone served, the cluster domain kubelets default to.
pub const ZONE: &str = "cluster.local";
/// The TTL of CoreDNS's answers, written out in the Corefile: the `kubernetes` plugin's
/// default (its README: "The default is 5 seconds"). HAProxy does not cache by TTL (it asks
/// again every `timeout resolve`), but CoreDNS's own `cache` does: an endpoint that left
/// is answered for up to a TTL more, so HAProxy lets go of a pod up to
/// `TTL + timeout resolve` after it left its EndpointSlices.
pub const TTL: Duration = Duration::from_secs(5);
/// The name asked until CoreDNS answers it: every API server serves the `kubernetes`
/// Service in `default`.
pub const PROBE_NAME: &str = "kubernetes.default.svc.cluster.local";
/// How long CoreDNS may take to answer [`PROBE_NAME`]: about a second here once the API
/// server is up (its watches sync at once); a loaded CI machine takes several times that.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one probe or [`CoreDns::resolve`] waits for its answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between probes (a process of our own: there is no event to await).
const POLL: Duration = Duration::from_millis(100);

/// Why CoreDNS could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No free loopback port.
    #[error("pick a free loopback port for coredns: {0}")]
    Port(#[source] std::io::Error),
    /// A file could not be written or the process could not be started.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or binary.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The process ended while starting.
    #[error("coredns exited during start-up ({status}); its log ends:\n{log}")]
    Exited {
        /// How it ended.
        status: String,
        /// The log's last lines.
        log: String,
    },
    /// The process did not answer the probe in time.
    #[error(
        "coredns did not answer {PROBE_NAME} with an address within {after:?} \
         (last: {last}); its log ends:\n{log}"
    )]
    NotReady {
        /// How long it was given.
        after: Duration,
        /// What the last probe got.
        last: String,
        /// The log's last lines.
        log: String,
    },
    /// A query failed.
    #[error("ask coredns at {server} for {name}: {source}")]
    Query {
        /// The server asked.
        server: SocketAddr,
        /// The name asked for.
        name: String,
        /// Why.
        #[source]
        source: dns::Error,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A running CoreDNS, killed when dropped.
#[derive(Debug)]
pub struct CoreDns {
    child: Child,
    addr: SocketAddr,
}

impl CoreDns {
    /// Starts `binary` in `dir` (which must exist) serving [`ZONE`] from the cluster that
    /// `kubeconfig` names, and waits until it answers (see the module's documentation).
    pub async fn start(binary: &Path, kubeconfig: &Path, dir: &Path) -> Result<CoreDns> {
        let addr = kube_control_plane::free_loopback_port().map_err(Error::Port)?;
        let conf = dir.join("Corefile");
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        std::fs::write(&conf, corefile(addr, kubeconfig)).map_err(io(&conf))?;
        let args = ["-conf".to_string(), conf.display().to_string()];
        let child = Child::spawn(binary, &args, &dir.join("coredns.log")).map_err(io(binary))?;
        let mut coredns = CoreDns { child, addr };
        coredns.wait_ready().await?;
        tracing::info!(%addr, "coredns ready");
        Ok(coredns)
    }

    /// Where CoreDNS answers, over UDP and TCP.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// CoreDNS's log file.
    pub fn log(&self) -> &Path {
        self.child.log()
    }

    /// The addresses CoreDNS answers now for `name`; none for a name that does not exist.
    pub async fn resolve(&self, name: &str) -> Result<Vec<Ipv4Addr>> {
        let answer = dns::query_a(self.addr, name, QUERY_TIMEOUT)
            .await
            .map_err(|source| Error::Query {
                server: self.addr,
                name: name.to_string(),
                source,
            })?;
        Ok(answer.addrs)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let mut last = "no answer yet".to_string();
        while started.elapsed() < READY_TIMEOUT {
            if let Some(status) = self.child.exited() {
                return Err(Error::Exited {
                    status: status.to_string(),
                    log: self.child.log_tail(),
                });
            }
            match dns::query_a(self.addr, PROBE_NAME, QUERY_TIMEOUT).await {
                Ok(answer) if answer.rcode == dns::NOERROR && !answer.addrs.is_empty() => {
                    return Ok(());
                }
                Ok(answer) => last = format!("rcode {} with no address", answer.rcode),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(POLL).await;
        }
        Err(Error::NotReady {
            after: READY_TIMEOUT,
            last,
            log: self.child.log_tail(),
        })
    }
}

/// The Corefile of a CoreDNS answering [`ZONE`] at `addr` from the cluster `kubeconfig`
/// names.
pub fn corefile(addr: SocketAddr, kubeconfig: &Path) -> String {
    let ip = addr.ip();
    let port = addr.port();
    let ttl = TTL.as_secs();
    let kubeconfig = kubeconfig.display();
    format!(
        "# Written by real-lb: the cluster's DNS on loopback only, with no health, ready or\n\
         # metrics listener.\n\
         {ZONE}:{port} {{\n\
         \x20   bind {ip}\n\
         \x20   errors\n\
         \x20   # One line per query: when HAProxy asked and what it was told.\n\
         \x20   log\n\
         \x20   kubernetes {ZONE} {{\n\
         \x20       kubeconfig \"{kubeconfig}\"\n\
         \x20       # The plugin's default TTL (5 s, its README), written out.\n\
         \x20       ttl {ttl}\n\
         \x20   }}\n\
         \x20   # Answers cached as every cluster's Corefile caches them (kubeadm's: cache 30),\n\
         \x20   # each for its TTL: a pod that left is still answered for up to {ttl} s.\n\
         \x20   cache {ttl}\n\
         }}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corefile_serves_the_zone_on_loopback_from_the_kubeconfig_with_the_ttl_written_out() {
        let conf = corefile(
            "127.0.0.1:10053".parse().unwrap(),
            Path::new("/tmp/x/admin.kubeconfig"),
        );
        assert!(
            conf.contains("cluster.local:10053 {\n    bind 127.0.0.1\n"),
            "{conf}"
        );
        assert!(
            conf.contains("kubeconfig \"/tmp/x/admin.kubeconfig\"\n"),
            "{conf}"
        );
        assert!(conf.contains("        ttl 5\n"), "{conf}");
        for listener in ["health", "ready", "prometheus"] {
            assert!(!conf.contains(&format!("    {listener}")), "{conf}");
        }
    }
}
