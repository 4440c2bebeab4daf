//! What graceful-drain needs of a cluster that kube-sim does not know about: every
//! cluster the scenarios, tests and benches start or attach to goes through here.
//!
//! [`configure`] adds it to a [`ClusterConfig`]: the lifecycle CRDs the chart installs
//! (`graceful-drain crds`), and the draining label, whose arrival on a pod the kubelets
//! record as the pod's isolation on the timeline. [`start`] and [`attach`] are
//! `Cluster::start` and `RealCluster::attach` with it.

use std::path::Path;

use graceful_drain_core::labels::DRAINING_LABEL;
use graceful_drain_core::lifecycle::crds;
use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{Cluster, ClusterConfig, RealCluster};

/// Why a cluster could not be started or attached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// graceful-drain's CRDs could not be built for the cluster.
    #[error(transparent)]
    Crds(#[from] crds::Error),
    /// The cluster did not start, or the API server could not be attached to.
    #[error(transparent)]
    Cluster(#[from] kube_sim::cluster::Error),
}

/// `cfg` with graceful-drain's CRDs and its draining label as the isolation label.
pub fn configure(cfg: ClusterConfig) -> Result<ClusterConfig, crds::Error> {
    Ok(ClusterConfig {
        crds: crds::crds()?,
        isolation_label: Some(DRAINING_LABEL.to_string()),
        ..cfg
    })
}

/// Starts a simulated cluster of `cfg` [configured](configure) for graceful-drain.
pub async fn start(cfg: ClusterConfig, shutdown: Shutdown) -> Result<Cluster, Error> {
    Ok(Cluster::start(configure(cfg)?, shutdown).await?)
}

/// Attaches the data plane of `cfg`, [configured](configure) for graceful-drain, to the
/// API server `kubeconfig` names; KWOK runs its nodes when `cargo xtask control-plane
/// build` has built it.
pub async fn attach(
    cfg: ClusterConfig,
    kubeconfig: &Path,
    shutdown: Shutdown,
) -> Result<RealCluster, Error> {
    let mut cfg = configure(cfg)?;
    cfg.kwok = cfg.kwok.or_else(kube_control_plane::kwok_binary);
    Ok(RealCluster::attach(cfg, kubeconfig, shutdown).await?)
}
