//! HAProxy as a process of ours: the configuration rendered ([`config`]), checked by
//! HAProxy itself, run in the foreground, and its statistics read ([`stats`]).
//!
//! [`HaProxy::start`] picks free loopback ports for the frontend and the statistics page,
//! puts the stats socket in `dir`, writes `dir/haproxy.cfg`, and has `haproxy -c -dW`
//! check it (warnings are errors: a configuration HAProxy would warn about is not the one
//! meant); its output is the error when it fails. It then runs `haproxy -db -f
//! haproxy.cfg` (`-db`: no background mode) with its log in `dir/haproxy.log`, and
//! returns once the frontend accepts a connection and the stats socket answers. The
//! process is killed when the value is dropped.

pub mod config;
pub mod stats;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixStream};

use self::config::{ConfigError, HaProxyConfig, Listen};
use self::stats::{BackendStats, StatsError, backend_stats};
use crate::process::Child;

/// How long HAProxy may take to accept on its frontend: it starts in well under a second;
/// a loaded CI machine takes several times that.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one read of the stats socket may take.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of a stats answer read: one backend's slots take a few kilobytes.
const MAX_STATS_BYTES: u64 = 1 << 20;
/// Pause between start-up probes (a process of our own: there is no event to await).
const POLL: Duration = Duration::from_millis(50);

/// Why HAProxy could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration could not be rendered.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No free loopback port.
    #[error("pick a free loopback port for haproxy: {0}")]
    Port(#[source] std::io::Error),
    /// A file could not be written or a process started.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or binary.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// `haproxy -c` refused the configuration.
    #[error("haproxy -c refused {}:\n{output}", path.display())]
    Invalid {
        /// The configuration file.
        path: PathBuf,
        /// What HAProxy said.
        output: String,
    },
    /// The process ended while starting.
    #[error("haproxy exited during start-up ({status}); its log ends:\n{log}")]
    Exited {
        /// How it ended.
        status: String,
        /// The log's last lines.
        log: String,
    },
    /// The frontend or the stats socket did not answer in time.
    #[error("haproxy did not accept on {frontend} within {after:?}; its log ends:\n{log}")]
    NotReady {
        /// The frontend.
        frontend: SocketAddr,
        /// How long it was given.
        after: Duration,
        /// The log's last lines.
        log: String,
    },
    /// The stats socket could not be read.
    #[error("read `show stat` from {}: {source}", path.display())]
    StatsSocket {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The statistics could not be read.
    #[error("haproxy's statistics: {0}")]
    Stats(#[from] StatsError),
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A running HAProxy, killed when dropped.
#[derive(Debug)]
pub struct HaProxy {
    child: Child,
    listen: Listen,
    config_file: PathBuf,
}

impl HaProxy {
    /// Starts `binary` with `cfg` in `dir` (which must exist); see the module's
    /// documentation.
    pub async fn start(binary: &Path, cfg: &HaProxyConfig, dir: &Path) -> Result<HaProxy> {
        let port = || kube_control_plane::free_loopback_port().map_err(Error::Port);
        let listen = Listen {
            frontend: port()?,
            stats: port()?,
            socket: dir.join("haproxy.sock"),
        };
        let config_file = dir.join("haproxy.cfg");
        std::fs::write(&config_file, cfg.render(&listen)?).map_err(|source| Error::Io {
            path: config_file.clone(),
            source,
        })?;
        check(binary, &config_file).await?;
        let args = [
            "-db".to_string(),
            "-f".into(),
            config_file.display().to_string(),
        ];
        let child =
            Child::spawn(binary, &args, &dir.join("haproxy.log")).map_err(|source| Error::Io {
                path: binary.to_path_buf(),
                source,
            })?;
        let mut haproxy = HaProxy {
            child,
            listen,
            config_file,
        };
        haproxy.wait_ready().await?;
        tracing::info!(frontend = %haproxy.frontend(), "haproxy ready");
        Ok(haproxy)
    }

    /// The HTTP frontend.
    pub fn frontend(&self) -> SocketAddr {
        self.listen.frontend
    }

    /// The statistics page (`stats uri /stats`, `stats show-legends`), for
    /// balancer-routes' `Source::HaProxy`.
    pub fn stats_url(&self) -> String {
        format!("http://{}/stats", self.listen.stats)
    }

    /// The stats socket (level operator).
    pub fn stats_socket(&self) -> &Path {
        &self.listen.socket
    }

    /// The configuration file.
    pub fn config_file(&self) -> &Path {
        &self.config_file
    }

    /// HAProxy's log file.
    pub fn log(&self) -> &Path {
        self.child.log()
    }

    /// The backend's statistics now, read from the stats socket.
    pub async fn stats(&self) -> Result<BackendStats> {
        Ok(backend_stats(&self.show_stat().await?, config::BACKEND)?)
    }

    /// The stats socket's answer to `show stat`: every proxy's statistics in CSV.
    pub async fn show_stat(&self) -> Result<String> {
        show_stat(&self.listen.socket).await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < START_TIMEOUT {
            if let Some(status) = self.child.exited() {
                return Err(Error::Exited {
                    status: status.to_string(),
                    log: self.child.log_tail(),
                });
            }
            if TcpStream::connect(self.listen.frontend).await.is_ok()
                && self.show_stat().await.is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
        Err(Error::NotReady {
            frontend: self.listen.frontend,
            after: START_TIMEOUT,
            log: self.child.log_tail(),
        })
    }
}

/// The answer of the stats socket at `path` to `show stat`: every proxy's statistics in
/// CSV, read within a bounded time and size.
pub async fn show_stat(path: &Path) -> Result<String> {
    let read = async {
        let mut socket = UnixStream::connect(path).await?;
        socket.write_all(b"show stat\n").await?;
        let mut csv = String::new();
        socket
            .take(MAX_STATS_BYTES)
            .read_to_string(&mut csv)
            .await?;
        Ok(csv)
    };
    tokio::time::timeout(STATS_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
        .map_err(|source| Error::StatsSocket {
            path: path.to_path_buf(),
            source,
        })
}

/// Has `binary` check `config_file` (`haproxy -c -dW -f`, warnings counting as errors).
pub async fn check(binary: &Path, config_file: &Path) -> Result<()> {
    let out = tokio::process::Command::new(binary)
        .args(["-c", "-dW", "-f"])
        .arg(config_file)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| Error::Io {
            path: binary.to_path_buf(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Invalid {
        path: config_file.to_path_buf(),
        output: String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr),
    })
}
