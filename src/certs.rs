//! `graceful-drain certs --out DIR`: a local CA and a webhook serving certificate.

/// Arguments of `graceful-drain certs`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {}

/// Writes the certificates.
pub async fn run(_args: Args, _shutdown: crate::runtime::Shutdown) -> anyhow::Result<()> {
    anyhow::bail!("certs: not implemented yet")
}
