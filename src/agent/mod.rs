//! `graceful-drain node-agent`: kubelet plugin (registration + SLM gRPC) and drain engine.

/// Arguments of `graceful-drain node-agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kube: crate::kubeclient::KubeArgs,
}

/// Runs the node agent until `shutdown`.
pub async fn run(_args: Args, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("node-agent: not implemented yet")
}
