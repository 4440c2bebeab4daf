//! Building a `kube::Client` the way kubectl finds its cluster: `--kubeconfig`, else the
//! `KUBECONFIG` variable (a list of files, merged), else `~/.kube/config`, else the
//! in-cluster service account; `--context` picks a context.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Errors while locating or loading cluster credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file named by `--kubeconfig` could not be read or parsed.
    #[error("read kubeconfig {path}")]
    ReadKubeconfig {
        /// The `--kubeconfig` path.
        path: PathBuf,
        /// Why kube could not read or parse it.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig was read but does not yield a usable configuration.
    #[error("load kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// Neither a kubeconfig nor in-cluster credentials were found.
    #[error("find cluster credentials")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("build client")]
    Client(#[source] kube::Error),
}

/// `--kubeconfig` and `--context`, shared by every subcommand that talks to a cluster.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KubeArgs {
    /// Path to the kubeconfig file (defaults like kubectl: $KUBECONFIG, ~/.kube/config,
    /// then in-cluster credentials).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// Resolves the configuration as kubectl would.
    pub async fn config(&self) -> Result<kube::Config, Error> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        if let Some(path) = &self.kubeconfig {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| Error::ReadKubeconfig {
                    path: path.clone(),
                    source,
                })?;
            return kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(Error::Kubeconfig);
        }
        if self.context.is_some() {
            return kube::Config::from_kubeconfig(&options)
                .await
                .map_err(Error::Kubeconfig);
        }
        kube::Config::infer().await.map_err(Error::Infer)
    }

    /// Builds a client from [`KubeArgs::config`].
    pub async fn client(&self) -> Result<kube::Client, Error> {
        let config = self.config().await?;
        kube::Client::try_from(config).map_err(Error::Client)
    }

    /// A client that retries nothing by itself (kube's default client silently retries
    /// 429, 503 and 504 with backoff): every refusal reaches the caller, which has its own
    /// backoff and reports why it waits — a PDB's 429 must show as "blocked by PDB", not
    /// as an eviction request that never answers.
    pub async fn client_without_retries(&self) -> Result<kube::Client, Error> {
        let mut config = self.config().await?;
        config.default_retry = false;
        kube::Client::try_from(config).map_err(Error::Client)
    }
}
