//! One end-to-end test, two clusters: the simulated one (fast, with its fault injection and
//! request counts) and a real control plane — a fresh kube-apiserver,
//! kube-controller-manager and kube-scheduler of ours per test, or the user's own cluster
//! named by [`KUBECONFIG_VAR`] — with the simulator playing only what a control plane
//! lacks (kubelets, load balancers).
//!
//! A suite writes its test once as `async fn case(tier: Tier)` and runs it once per tier.
//! The real tier needs the control-plane binaries (`cargo xtask control-plane build`,
//! which `.ci/run` runs before the tests) or [`KUBECONFIG_VAR`]; without either,
//! [`TestCluster::start`] says so and returns `None` so the test ends there — except in CI
//! (`CI` set), where that is a failure.
//!
//! On the real tier the chart's ServiceAccounts, Roles and bindings are applied at start
//! (`deploy/graceful-drain.yaml`), so [`TestCluster::client_as`] a chart ServiceAccount is
//! judged by the real RBAC exactly as the chart's pods are.

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{Access, Cluster, ClusterConfig, DataPlane, RealCluster};

use crate::scenario::components::TempDir;
use crate::scenario::real::apply_chart_rbac;

/// The variable that names the kubeconfig of the user's own cluster for the real tier
/// (instead of a control plane of ours). The cluster should be a dedicated one: the tests
/// register simulated Nodes (`worker-N`) and run their workloads in `default`.
pub const KUBECONFIG_VAR: &str = "GRACEFUL_DRAIN_TEST_KUBECONFIG";

/// Which cluster a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// kube-sim's API server, controllers and scheduler, in this process.
    Simulated,
    /// A real control plane: ours (fresh per test) or the one [`KUBECONFIG_VAR`] names.
    Real,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Simulated => "simulated",
            Tier::Real => "real",
        })
    }
}

enum Inner {
    Simulated(Cluster),
    Real(RealCluster),
}

/// A cluster of either tier with the data plane attached; derefs to the [`DataPlane`]
/// (admin client, Deployments of web apps, load balancers) and gives components
/// credentials through [`Access`]. Dropping it stops everything it started, our control
/// plane included.
pub struct TestCluster {
    // Field order is drop order: the data plane stops before the control plane.
    inner: Inner,
    admin_kubeconfig: PathBuf,
    plane: Option<kube_control_plane::ControlPlane>,
    dir: TempDir,
}

impl Deref for TestCluster {
    type Target = DataPlane;
    fn deref(&self) -> &DataPlane {
        match &self.inner {
            Inner::Simulated(c) => c,
            Inner::Real(c) => c,
        }
    }
}

impl Access for TestCluster {
    async fn write_kubeconfig(&self, path: &Path, user: &str) -> kube_sim::cluster::Result<()> {
        match &self.inner {
            Inner::Simulated(c) => c.write_kubeconfig(path, user).await,
            Inner::Real(c) => c.write_kubeconfig(path, user).await,
        }
    }
}

/// Why a [`TestCluster`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The test's scratch folder.
    #[error("create a scratch folder: {0}")]
    Scratch(#[source] std::io::Error),
    /// Our control plane did not come up (its logs' last lines are in the message).
    #[error("start the control plane {versions}: {reason}")]
    ControlPlane {
        /// Which versions.
        versions: String,
        /// What went wrong, with the components' log tails.
        reason: String,
    },
    /// The cluster could not be started or attached to.
    #[error(transparent)]
    Cluster(#[from] kube_sim::cluster::Error),
    /// The chart's RBAC could not be applied on the real tier.
    #[error("apply the chart's RBAC: {0}")]
    Rbac(String),
}

/// What the real tier runs on here, if anything: the user's cluster or our control plane.
fn real_target() -> Option<Result<PathBuf, kube_control_plane::Options>> {
    if let Some(path) = std::env::var_os(KUBECONFIG_VAR) {
        return Some(Ok(PathBuf::from(path)));
    }
    let versions = kube_control_plane::Versions::default();
    if !kube_control_plane::is_built(&versions) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must build the control plane before the tests: cargo xtask control-plane build"
        );
        eprintln!(
            "real tier skipped: {versions} is not built (cargo xtask control-plane build, \
             about 8 minutes once) and {KUBECONFIG_VAR} names no cluster"
        );
        return None;
    }
    Some(Err(kube_control_plane::Options {
        bin: kube_control_plane::bin_dir(&versions),
        eviction_request_api: true,
        apiserver_flags: Vec::new(),
    }))
}

impl TestCluster {
    /// Starts a cluster of `tier` with `cfg`'s nodes and timings (on the real tier only
    /// the data plane's part of `cfg` applies). `Ok(None)`: the real tier is not available
    /// on this machine (see the module's documentation).
    pub async fn start(tier: Tier, cfg: ClusterConfig) -> Result<Option<TestCluster>, Error> {
        let Some(cluster) = Self::start_bare(tier, cfg).await? else {
            return Ok(None);
        };
        if let Inner::Real(real) = &cluster.inner {
            apply_chart_rbac(real)
                .await
                .map_err(|e| Error::Rbac(graceful_drain_core::error::chain(&e).to_string()))?;
        }
        Ok(Some(cluster))
    }

    /// [`TestCluster::start`] without the chart's RBAC on the real tier: for a test that
    /// installs the chart itself (Helm refuses to take over objects it did not create).
    pub async fn start_bare(tier: Tier, cfg: ClusterConfig) -> Result<Option<TestCluster>, Error> {
        graceful_drain_core::runtime::install_crypto_provider();
        let dir = TempDir::new("gd-tier").map_err(Error::Scratch)?;
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        let shutdown = Shutdown::new();
        match tier {
            Tier::Simulated => {
                let cluster = Cluster::start(cfg, shutdown).await?;
                cluster
                    .api()
                    .write_kubeconfig(&admin_kubeconfig, "admin")
                    .map_err(Error::Scratch)?;
                Ok(Some(TestCluster {
                    inner: Inner::Simulated(cluster),
                    admin_kubeconfig,
                    plane: None,
                    dir,
                }))
            }
            Tier::Real => {
                let Some(target) = real_target() else {
                    return Ok(None);
                };
                let (kubeconfig, plane) = match target {
                    Ok(path) => (path, None),
                    Err(options) => {
                        let path = dir.path().join("control-plane");
                        let versions = kube_control_plane::Versions::default().to_string();
                        let plane = tokio::task::spawn_blocking(move || {
                            kube_control_plane::up(&path, &options)
                        })
                        .await
                        .map_err(|e| Error::ControlPlane {
                            versions: versions.clone(),
                            reason: e.to_string(),
                        })?
                        .map_err(|e| Error::ControlPlane {
                            versions,
                            reason: graceful_drain_core::error::chain(&e).to_string(),
                        })?;
                        (plane.admin_kubeconfig(), Some(plane))
                    }
                };
                let cluster = RealCluster::attach(cfg, &kubeconfig, shutdown).await?;
                Ok(Some(TestCluster {
                    inner: Inner::Real(cluster),
                    admin_kubeconfig: kubeconfig,
                    plane,
                    dir,
                }))
            }
        }
    }

    /// The tier this cluster belongs to.
    pub fn tier(&self) -> Tier {
        match self.inner {
            Inner::Simulated(_) => Tier::Simulated,
            Inner::Real(_) => Tier::Real,
        }
    }

    /// The simulated cluster, for what only it offers (request counts, injected faults).
    pub fn simulated(&self) -> Option<&Cluster> {
        match &self.inner {
            Inner::Simulated(c) => Some(c),
            Inner::Real(_) => None,
        }
    }

    /// A client acting as `user` — a ServiceAccount of the chart
    /// (`system:serviceaccount:NS:NAME`) or `system:node:NODE` — judged by the cluster's
    /// authorization as that user (impersonated on the real tier, with the groups such a
    /// user carries).
    pub fn client_as(&self, user: &str) -> Result<kube::Client, Error> {
        match &self.inner {
            Inner::Simulated(c) => Ok(c.api().client(user)),
            Inner::Real(c) => {
                let groups: Vec<String> =
                    match user.strip_prefix("system:serviceaccount:") {
                        Some(rest) => {
                            let ns = rest.split(':').next().unwrap_or_default();
                            vec![
                                "system:serviceaccounts".to_string(),
                                format!("system:serviceaccounts:{ns}"),
                            ]
                        }
                        None if user.starts_with("system:node:") => {
                            vec!["system:nodes".to_string()]
                        }
                        None => Vec::new(),
                    };
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                Ok(c.client_as(user, &groups)?)
            }
        }
    }

    /// A kubeconfig of a cluster administrator, for `kubectl` and our CLI.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A scratch folder that lives as long as the cluster.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of each control-plane component's log (real tier, our control
    /// plane), for a failed test's message; empty otherwise.
    pub fn log_tails(&self) -> String {
        self.plane
            .as_ref()
            .map(|p| p.log_tails(20))
            .unwrap_or_default()
    }
}
