//! `graceful-drain simulate`: the simulated cluster (DESIGN §7).

pub mod apiserver;
pub mod cluster;
pub mod controllers;
pub mod lb;
pub mod traffic;

/// Arguments of `graceful-drain simulate`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {}

/// Runs the default scenario, or serves the cluster with `--serve`.
pub async fn run(_args: Args, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("simulate: not implemented yet")
}
