//! `graceful-drain crds`: prints the CustomResourceDefinitions for
//! `lifecycle.k8s.io/v1alpha1`. (Owned by the lifecycle work; placeholder until then.)

/// Arguments of `graceful-drain crds`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {}

/// Prints the CRDs as YAML.
pub async fn run(_args: Args, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("crds: not implemented yet")
}
