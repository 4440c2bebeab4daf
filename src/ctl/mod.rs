//! `graceful-drain drain | uncordon | status`: create LifecycleEvents and follow them.

/// Arguments of `graceful-drain drain`.
#[derive(Clone, Debug, clap::Args)]
pub struct DrainArgs {
    #[command(flatten)]
    pub kube: crate::kubeclient::KubeArgs,
    /// Node to drain.
    pub node: String,
}

/// Arguments of `graceful-drain uncordon`.
#[derive(Clone, Debug, clap::Args)]
pub struct UncordonArgs {
    #[command(flatten)]
    pub kube: crate::kubeclient::KubeArgs,
    /// Node to return to service.
    pub node: String,
}

/// Arguments of `graceful-drain status`.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub kube: crate::kubeclient::KubeArgs,
    /// Only this node.
    pub node: Option<String>,
}

/// Runs `drain`.
pub async fn drain(_args: DrainArgs, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("drain: not implemented yet")
}

/// Runs `uncordon`.
pub async fn uncordon(
    _args: UncordonArgs,
    _shutdown: crate::runtime::Shutdown,
) -> anyhow::Result<()> {
    anyhow::bail!("uncordon: not implemented yet")
}

/// Runs `status`.
pub async fn status(_args: StatusArgs, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("status: not implemented yet")
}
