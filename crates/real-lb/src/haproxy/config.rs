//! The haproxy.cfg of one HTTP frontend balancing over a headless Service's endpoints, with
//! every setting that shapes how fast HAProxy lets go of an endpoint written out, at HAProxy
//! 2.6's defaults unless the caller changes them.
//!
//! Sources of the defaults, all HAProxy 2.6: its Configuration Manual (`configuration.txt`,
//! in Debian's package at /usr/share/doc/haproxy/configuration.txt.gz), sections 5.2
//! (server options), 5.3.2 (the resolvers section) and 4.2 (proxy keywords); where the
//! manual gives none, its source, `src/resolvers.c` (the defaults a new resolvers section
//! gets) and `include/haproxy/defaults.h`.
//!
//! The backend is a `server-template` of [`HaProxyConfig::slots`] servers over the
//! Service's name: HAProxy asks the `resolvers` section's nameserver for its A records
//! every `timeout resolve`, gives each address a slot, and takes a slot out of rotation
//! (`MAINT (resolution)`) once its address is gone from an answer and `hold obsolete` has
//! passed. Apart from DNS, a TCP health check every `inter` marks a server DOWN after
//! `fall` failures in a row.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The backend's name in the configuration and the statistics.
pub const BACKEND: &str = "app";
/// The prefix of the server-template's server names (`pod1`, `pod2`, ...).
pub const SERVER_PREFIX: &str = "pod";
/// The resolvers section's name.
const RESOLVERS: &str = "cluster";

/// What to balance and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaProxyConfig {
    /// The nameserver HAProxy asks (CoreDNS, or the pod network's relay in front of it).
    pub dns: SocketAddr,
    /// The headless Service's name, `NAME.NAMESPACE.svc.cluster.local`.
    pub service_fqdn: String,
    /// The port of the endpoints.
    pub port: u16,
    /// Servers of the template: the most endpoints balanced at once.
    pub slots: usize,
    /// Retry failed requests, the last retry on another server: `retry-on
    /// all-retryable-errors` and `option redispatch`. Off: HAProxy's defaults, written out
    /// — `retry-on conn-failure`, every retry on the same server, `no option redispatch`.
    pub retries: bool,
    /// The resolvers section.
    pub resolvers: Resolvers,
    /// The servers' health check.
    pub check: HealthCheck,
    /// The proxies' timeouts.
    pub timeouts: Timeouts,
}

impl HaProxyConfig {
    /// Balances over `service_fqdn`'s endpoints on `port`, asking `dns`, with 8 slots,
    /// retries on, and HAProxy's defaults otherwise.
    pub fn new(dns: SocketAddr, service_fqdn: impl Into<String>, port: u16) -> Self {
        HaProxyConfig {
            dns,
            service_fqdn: service_fqdn.into(),
            port,
            slots: 8,
            retries: true,
            resolvers: Resolvers::default(),
            check: HealthCheck::default(),
            timeouts: Timeouts::default(),
        }
    }
}

/// The resolvers section. [`Default`] is HAProxy 2.6's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolvers {
    /// `accepted_payload_size`: the largest answer announced (EDNS). 512 bytes (manual
    /// 5.3.2: "If not set, HAProxy announces 512"): about 28 A records of one name.
    pub accepted_payload_size: u16,
    /// `resolve_retries`: queries sent before giving up. 3 (manual 5.3.2).
    pub resolve_retries: u32,
    /// `timeout resolve`: how often a name is resolved again. 1 s (manual 5.3.2).
    pub timeout_resolve: Duration,
    /// `timeout retry`: the wait before asking again after no valid answer. 1 s (manual
    /// 5.3.2).
    pub timeout_retry: Duration,
    /// `hold valid`: how long a valid answer stands for `do-resolve` actions; no effect on
    /// servers (manual 5.3.2). 10 s (`src/resolvers.c`).
    pub hold_valid: Duration,
    /// `hold obsolete`: how long an address missing from the answers is kept before its
    /// server goes to maintenance. 0 s (`src/resolvers.c`): at the first answer without it.
    pub hold_obsolete: Duration,
    /// `hold nx`: how long a valid answer outweighs an NXDOMAIN. 30 s (`src/resolvers.c`).
    pub hold_nx: Duration,
    /// `hold other`: the same for other errors. 30 s (`src/resolvers.c`).
    pub hold_other: Duration,
    /// `hold refused`: the same for REFUSED. 30 s (`src/resolvers.c`).
    pub hold_refused: Duration,
    /// `hold timeout`: the same for timeouts. 30 s (`src/resolvers.c`).
    pub hold_timeout: Duration,
}

impl Default for Resolvers {
    fn default() -> Self {
        Resolvers {
            accepted_payload_size: 512,
            resolve_retries: 3,
            timeout_resolve: Duration::from_secs(1),
            timeout_retry: Duration::from_secs(1),
            hold_valid: Duration::from_secs(10),
            hold_obsolete: Duration::ZERO,
            hold_nx: Duration::from_secs(30),
            hold_other: Duration::from_secs(30),
            hold_refused: Duration::from_secs(30),
            hold_timeout: Duration::from_secs(30),
        }
    }
}

/// The servers' TCP health check (`check`). [`Default`] is HAProxy 2.6's (manual 5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// `inter`: between two checks. 2 s ("defaults to 2000 ms").
    pub inter: Duration,
    /// `fall`: failed checks in a row that mark a server DOWN. 3.
    pub fall: u32,
    /// `rise`: passed checks in a row that mark it UP again. 2.
    pub rise: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            inter: Duration::from_secs(2),
            fall: 3,
            rise: 2,
        }
    }
}

/// The proxies' timeouts. HAProxy has no default for them (an unset one is infinite, and
/// HAProxy warns); [`Default`] is what Debian's /etc/haproxy/haproxy.cfg sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// `timeout connect`: 5 s. It also bounds the pause before a retry on the same server,
    /// `min(timeout connect, 1 s)` (manual 4.2, `retries`).
    pub connect: Duration,
    /// `timeout client`: 50 s.
    pub client: Duration,
    /// `timeout server`: 50 s.
    pub server: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            client: Duration::from_secs(50),
            server: Duration::from_secs(50),
        }
    }
}

/// Where a rendered HAProxy listens: each on loopback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// The HTTP frontend.
    pub frontend: SocketAddr,
    /// The statistics page (`/stats`, `/stats;csv`).
    pub stats: SocketAddr,
    /// The stats socket (UNIX), at level operator.
    pub socket: PathBuf,
}

/// A configuration that cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// No slot: nothing could be balanced.
    #[error("a server-template needs at least one slot")]
    NoSlots,
    /// The name holds a character the configuration language would split or quote.
    #[error("{0:?} is not a DNS name")]
    BadName(String),
    /// An address to listen on is not a loopback address.
    #[error("{0} is not a loopback address; servers here listen on 127.0.0.0/8 only")]
    NotLoopback(SocketAddr),
}

impl HaProxyConfig {
    /// The haproxy.cfg, listening where `listen` says.
    pub fn render(&self, listen: &Listen) -> Result<String, ConfigError> {
        self.validate(listen)?;
        let mut cfg = String::new();
        self.global(&mut cfg, listen);
        self.defaults(&mut cfg);
        self.resolvers_section(&mut cfg);
        self.proxies(&mut cfg, listen);
        Ok(cfg)
    }

    fn validate(&self, listen: &Listen) -> Result<(), ConfigError> {
        if self.slots == 0 {
            return Err(ConfigError::NoSlots);
        }
        let name_ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
        if self.service_fqdn.is_empty() || !self.service_fqdn.chars().all(name_ok) {
            return Err(ConfigError::BadName(self.service_fqdn.clone()));
        }
        for addr in [listen.frontend, listen.stats] {
            if !addr.ip().is_loopback() {
                return Err(ConfigError::NotLoopback(addr));
            }
        }
        Ok(())
    }

    fn global(&self, cfg: &mut String, listen: &Listen) {
        let socket = listen.socket.display();
        let _ = write!(
            cfg,
            "# Written by real-lb for HAProxy 2.6; defaults written out, see crates/real-lb/src/haproxy/config.rs.\n\
             global\n\
             \x20   # Alerts, warnings and one line per request on stderr: HAProxy's log file.\n\
             \x20   log stderr format raw daemon info\n\
             \x20   # `show stat` with server addresses needs level operator (the default level).\n\
             \x20   stats socket {socket} mode 600 level operator\n\n"
        );
    }

    fn defaults(&self, cfg: &mut String) {
        let Timeouts {
            connect,
            client,
            server,
        } = self.timeouts;
        let retry = if self.retries {
            "    # Every retryable failure retried (manual 4.2, `retry-on`), the last retry on\n\
             \x20   # another server (`option redispatch`'s default interval, -1).\n\
             \x20   retry-on all-retryable-errors\n\
             \x20   option redispatch\n"
        } else {
            "    # HAProxy's defaults: connection failures retried on the same server.\n\
             \x20   retry-on conn-failure\n\
             \x20   no option redispatch\n"
        };
        let _ = write!(
            cfg,
            "defaults\n\
             \x20   mode http\n\
             \x20   log global\n\
             \x20   option httplog\n\
             \x20   # No default in HAProxy (infinite, with a warning): Debian's haproxy.cfg values.\n\
             \x20   timeout connect {}\n\
             \x20   timeout client {}\n\
             \x20   timeout server {}\n\
             \x20   # Default 3 (CONN_RETRIES, include/haproxy/defaults.h).\n\
             \x20   retries 3\n\
             {retry}\n",
            ms(connect),
            ms(client),
            ms(server),
        );
    }

    fn resolvers_section(&self, cfg: &mut String) {
        let r = self.resolvers;
        let _ = write!(
            cfg,
            "resolvers {RESOLVERS}\n\
             \x20   nameserver dns {dns}\n\
             \x20   # Defaults of HAProxy 2.6 (manual 5.3.2; the holds: src/resolvers.c).\n\
             \x20   accepted_payload_size {}\n\
             \x20   resolve_retries {}\n\
             \x20   timeout resolve {}\n\
             \x20   timeout retry {}\n\
             \x20   hold valid {}\n\
             \x20   # An address gone from the answer leaves at once (0 s).\n\
             \x20   hold obsolete {}\n\
             \x20   hold nx {}\n\
             \x20   hold other {}\n\
             \x20   hold refused {}\n\
             \x20   hold timeout {}\n\n",
            r.accepted_payload_size,
            r.resolve_retries,
            ms(r.timeout_resolve),
            ms(r.timeout_retry),
            ms(r.hold_valid),
            ms(r.hold_obsolete),
            ms(r.hold_nx),
            ms(r.hold_other),
            ms(r.hold_refused),
            ms(r.hold_timeout),
            dns = self.dns,
        );
    }

    fn proxies(&self, cfg: &mut String, listen: &Listen) {
        let HealthCheck { inter, fall, rise } = self.check;
        let _ = write!(
            cfg,
            "frontend fe_{BACKEND}\n\
             \x20   bind {frontend}\n\
             \x20   default_backend {BACKEND}\n\n\
             backend {BACKEND}\n\
             \x20   # The default algorithm, written out.\n\
             \x20   balance roundrobin\n\
             \x20   # init-addr none: slots start without an address, in maintenance, until DNS\n\
             \x20   # gives them one. resolve-prefer ipv4: the cluster is IPv4 (default ipv6).\n\
             \x20   # check: a TCP connect every inter, DOWN after fall failures, UP after rise\n\
             \x20   # successes (defaults 2 s, 3, 2; manual 5.2).\n\
             \x20   server-template {SERVER_PREFIX} 1-{slots} {fqdn}:{port} resolvers {RESOLVERS} \
             resolve-prefer ipv4 init-addr none check inter {inter} fall {fall} rise {rise}\n\n\
             listen stats\n\
             \x20   bind {stats}\n\
             \x20   stats enable\n\
             \x20   stats uri /stats\n\
             \x20   # Server addresses on the page, which balancer-routes reads.\n\
             \x20   stats show-legends\n",
            frontend = listen.frontend,
            slots = self.slots,
            fqdn = self.service_fqdn,
            port = self.port,
            inter = ms(inter),
            stats = listen.stats,
        );
    }
}

/// A duration in HAProxy's time format, in milliseconds (`1500ms`).
fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

#[cfg(test)]
mod tests;
