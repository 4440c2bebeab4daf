//! `graceful-drain webhook`: HTTPS admission server, deferred deleter and admin port.

/// Arguments of `graceful-drain webhook`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kube: crate::kubeclient::KubeArgs,
}

/// Runs the webhook until `shutdown`.
pub async fn run(_args: Args, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("webhook: not implemented yet")
}
