//! A real Kubernetes control plane on loopback for graceful-drain's real-tier tests and
//! for developers: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built
//! from the Go module proxy ([`build`]) and started as processes of their own ([`run`]).
//!
//! No kubelet, no kube-proxy, no network: KWOK (built here too, started by `kube-sim`'s
//! data plane with stages of its own) plays the kubelets, and the load balancers and
//! traffic of `kube-sim` play the rest of what a control plane lacks (docs/design.md §7).

pub mod build;
pub mod certs;
pub mod ports;
pub mod run;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use build::{KWOK_VERSION, bin_dir, is_built, kwok_binary};
pub use ports::free_loopback_port;
pub use run::{ControlPlane, Options, down, up};

/// The one way the real tier starts the cached control plane: the default [`Versions`] as
/// `cargo xtask control-plane build` left them in [`cache_dir`], started in `dir` with the
/// EvictionRequest API on or off and kube-apiserver's extra `apiserver_flags`. kube-apiserver
/// presents a client certificate to every admission webhook that asks for one
/// ([`ControlPlane::webhook_client_ca`] signed it); a webhook that asks for none sees no
/// difference. [`Error::NotCached`] names the command that builds it.
pub fn up_cached(
    dir: &Path,
    eviction_request_api: bool,
    apiserver_flags: Vec<String>,
) -> Result<ControlPlane> {
    let options = cached_options(eviction_request_api, apiserver_flags)?;
    up(dir, &options)
}

/// The [`Options`] of [`up_cached`], for a caller that starts several control planes.
pub fn cached_options(eviction_request_api: bool, apiserver_flags: Vec<String>) -> Result<Options> {
    let versions = Versions::default();
    if !is_built(&versions) {
        return Err(Error::NotCached(versions));
    }
    Ok(Options {
        bin: bin_dir(&versions),
        eviction_request_api,
        apiserver_flags,
        webhook_client_certificate: true,
    })
}

/// The Kubernetes release the real tier runs.
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// The etcd release the real tier runs.
pub const ETCD_VERSION: &str = "v3.6.16";

/// Which releases to build and run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// Kubernetes release tag, `v1.Y.Z` (anything else fails the build with
    /// [`Error::BadVersion`]); also names the cache folder.
    pub kubernetes: String,
    /// etcd release tag, a version of the Go module `go.etcd.io/etcd/server/v3` (`v3.Y.Z`).
    pub etcd: String,
}

impl Default for Versions {
    fn default() -> Self {
        Versions {
            kubernetes: KUBERNETES_VERSION.to_string(),
            etcd: ETCD_VERSION.to_string(),
        }
    }
}

impl fmt::Display for Versions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kubernetes {} with etcd {}", self.kubernetes, self.etcd)
    }
}

/// Errors of building, starting and stopping a control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `go` is not on PATH.
    #[error(
        "the control plane is built from the Go module proxy, but `go` is not on PATH: install Go 1.26 or newer"
    )]
    GoMissing,
    /// No kubectl was found ([`kubectl`]).
    #[error(
        "no kubectl (it is used to wait for kube-apiserver): {}",
        KUBECTL_WHERE
    )]
    KubectlMissing,
    /// A `go` command failed.
    #[error("{0}")]
    Go(String),
    /// A version that is not `v1.Y.Z`.
    #[error("Kubernetes version {0:?} is not of the form v1.Y.Z")]
    BadVersion(String),
    /// A binary is missing from the cache.
    #[error("{} is not built: run `cargo xtask control-plane build`", .0.display())]
    NotBuilt(PathBuf),
    /// The default versions are not in the cache.
    #[error("{0} is not built: run `cargo xtask control-plane build` first (about 8 minutes once)")]
    NotCached(Versions),
    /// A file or process operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file, folder or binary concerned (`127.0.0.1:0` when picking free ports
        /// failed).
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A certificate could not be made.
    #[error("control-plane certificate: {0}")]
    Certificate(String),
    /// A component exited while the control plane started.
    #[error("{component} exited during start-up; logs:\n{log}")]
    Exited {
        /// The component's name (`etcd`, `kube-apiserver`, ...).
        component: String,
        /// The last 30 lines of every component's log.
        log: String,
    },
    /// A component this value did not start (or that is unknown) was asked to restart.
    #[error("{0} is not a component this control plane started")]
    NotRunning(String),
    /// kube-apiserver did not become ready in time.
    #[error("kube-apiserver was not ready after {after:?}; logs:\n{log}")]
    NotReady {
        /// How long readiness was awaited.
        after: Duration,
        /// The last 30 lines of every component's log.
        log: String,
    },
}

impl Error {
    fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<rcgen::Error> for Error {
    fn from(e: rcgen::Error) -> Self {
        Error::Certificate(e.to_string())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where [`kubectl`] looks, for messages that say why none was found.
pub const KUBECTL_WHERE: &str = "looked at $GRACEFUL_DRAIN_KUBECTL, on PATH and in the control plane's build (`cargo xtask control-plane build` builds one)";

/// The kubectl to run: `$GRACEFUL_DRAIN_KUBECTL`, else the first `kubectl` on `PATH`,
/// else the one built with the control plane ([`build::bin_dir`]); `None` when there is
/// none ([`KUBECTL_WHERE`]).
pub fn kubectl() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("GRACEFUL_DRAIN_KUBECTL") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("kubectl"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let built = build::bin_dir(&Versions::default()).join("kubectl");
        built.is_file().then_some(built)
    })
}

/// graceful-drain's cache folder: `$GRACEFUL_DRAIN_CACHE`, else `$XDG_CACHE_HOME/graceful-drain`,
/// else `~/.cache/graceful-drain`. It lives outside any clone, so a fresh clone on the same
/// machine reuses what an earlier one built.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("GRACEFUL_DRAIN_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("graceful-drain");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache").join("graceful-drain")
}
