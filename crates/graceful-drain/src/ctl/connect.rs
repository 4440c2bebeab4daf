//! Which cluster `drain`, `uncordon` and `status` talk to, found the way kubectl finds it:
//! `--kubeconfig FILE`, else the files `KUBECONFIG` lists (those that exist, merged by
//! kubectl's rules), else `~/.kube/config`, else the pod's service account; `--context`,
//! `--cluster` and `--user` pick from the kubeconfig as kubectl's flags of those names do.
//!
//! [`Lookup::detect`] reads the environment once; [`Lookup::source`] decides where the
//! configuration comes from without I/O, so a machine without credentials gets one
//! message saying what was missing and every place that was looked at (kube's own
//! `Config::infer` error repeats the kubeconfig's cause inside its message and again as
//! its source); [`ConnectArgs::client`] then loads that source.

#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

/// The variable that names the kubeconfig files, as for kubectl.
const KUBECONFIG: &str = "KUBECONFIG";
/// Set in every pod; without it there are no in-cluster credentials to try.
const SERVICE_HOST: &str = "KUBERNETES_SERVICE_HOST";

/// Errors while finding or loading cluster credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No kubeconfig where kubectl looks, and not in a pod.
    #[error("no cluster credentials found: {looked}; pass --kubeconfig FILE or set KUBECONFIG")]
    NotFound {
        /// Each place looked at and what was missing there.
        looked: String,
    },
    /// `--kubeconfig` names a file that does not exist.
    #[error("kubeconfig {} (from --kubeconfig) does not exist", path.display())]
    Missing {
        /// The `--kubeconfig` path.
        path: PathBuf,
    },
    /// A kubeconfig file could not be read.
    #[error("read kubeconfig {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A kubeconfig file is not a valid kubeconfig.
    #[error("parse kubeconfig {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// kube's parse error.
        #[source]
        source: KubeconfigError,
    },
    /// The files `KUBECONFIG` lists could not be merged.
    #[error("merge the kubeconfig files {files}")]
    Merge {
        /// The files, joined.
        files: String,
        /// Why they do not merge.
        #[source]
        source: KubeconfigError,
    },
    /// `--context`, `--cluster` or `--user` names an entry the kubeconfig lacks.
    #[error("no {kind} {name:?} in kubeconfig {files} (it has: {known})")]
    NoSuchEntry {
        /// `context`, `cluster` or `user`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// The kubeconfig files, joined.
        files: String,
        /// The names it does have, joined.
        known: String,
    },
    /// The kubeconfig does not yield a usable configuration (no current context, no
    /// server URL, an unreadable certificate).
    #[error("use kubeconfig {files}")]
    Load {
        /// The kubeconfig files, joined.
        files: String,
        /// kube's error.
        #[source]
        source: KubeconfigError,
    },
    /// In a pod, the service account's credentials could not be read.
    #[error("read the pod's service account credentials")]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be built from the configuration.
    #[error("build the Kubernetes client")]
    Client(#[source] kube::Error),
}

/// The kubectl-like connection flags of `drain`, `uncordon` and `status`.
#[derive(Clone, Debug, Default, clap::Args)]
#[command(next_help_heading = "Connection options")]
pub struct ConnectArgs {
    /// Path to the kubeconfig file (default: the files $KUBECONFIG lists, else
    /// ~/.kube/config, else the pod's service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The kubeconfig cluster to use (default: the context's).
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The kubeconfig user to use (default: the context's).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
}

impl ConnectArgs {
    /// A client for the cluster these flags and the environment name.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        let lookup = Lookup::detect(self.kubeconfig.as_deref());
        let config = self.config(lookup.source(self.selects())?).await?;
        kube::Client::try_from(config).map_err(Error::Client)
    }

    /// `--context`, `--cluster` or `--user` was given: only a kubeconfig can answer them.
    fn selects(&self) -> bool {
        self.context.is_some() || self.cluster.is_some() || self.user.is_some()
    }

    fn options(&self) -> KubeConfigOptions {
        KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        }
    }

    async fn config(&self, source: Source) -> Result<kube::Config, Error> {
        let paths = match source {
            Source::InCluster => return kube::Config::incluster().map_err(Error::InCluster),
            Source::Files(paths) => paths,
        };
        let kubeconfig = read(&paths)?;
        let options = self.options();
        let files = join(&paths);
        check_selection(&kubeconfig, &options, &files)?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|source| Error::Load { files, source })?;
        // As `Config::infer` does: KUBE_RS_DEBUG_IMPERSONATE_* for debugging RBAC.
        config.apply_debug_overrides();
        Ok(config)
    }
}

/// Where the configuration comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Kubeconfig files, merged in this order.
    Files(Vec<PathBuf>),
    /// The pod's service account.
    InCluster,
}

/// What the machine offers for finding credentials, read once by [`Lookup::detect`]; each
/// path comes with whether it exists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The `--kubeconfig` path.
    pub flag: Option<(PathBuf, bool)>,
    /// The files `KUBECONFIG` lists (`None`: unset or empty).
    pub kubeconfig_var: Option<Vec<(PathBuf, bool)>>,
    /// `~/.kube/config` (`None`: no home directory).
    pub home_config: Option<(PathBuf, bool)>,
    /// `KUBERNETES_SERVICE_HOST` is set: this runs in a pod.
    pub in_cluster: bool,
}

impl Lookup {
    /// Reads the environment and checks which files exist.
    pub fn detect(flag: Option<&Path>) -> Self {
        let exists = |path: PathBuf| {
            let exists = path.exists();
            (path, exists)
        };
        let kubeconfig_var = std::env::var_os(KUBECONFIG).and_then(|value| {
            let files: Vec<_> = std::env::split_paths(&value)
                .filter(|p| !p.as_os_str().is_empty())
                .map(exists)
                .collect();
            (!files.is_empty()).then_some(files)
        });
        let home: Option<OsString> =
            std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE"));
        Lookup {
            flag: flag.map(|p| exists(p.to_path_buf())),
            kubeconfig_var,
            home_config: home.map(|h| exists(PathBuf::from(h).join(".kube").join("config"))),
            in_cluster: std::env::var_os(SERVICE_HOST).is_some(),
        }
    }

    /// Where the configuration comes from; `selects` when `--context`, `--cluster` or
    /// `--user` was given, which the pod's service account cannot answer. Without any,
    /// the error names every place looked at, each once.
    pub fn source(&self, selects: bool) -> Result<Source, Error> {
        if let Some((path, exists)) = &self.flag {
            return if *exists {
                Ok(Source::Files(vec![path.clone()]))
            } else {
                Err(Error::Missing { path: path.clone() })
            };
        }
        let mut looked = Vec::new();
        match (&self.kubeconfig_var, &self.home_config) {
            (Some(files), _) => {
                let present: Vec<PathBuf> = files
                    .iter()
                    .filter(|(_, exists)| *exists)
                    .map(|(path, _)| path.clone())
                    .collect();
                if !present.is_empty() {
                    return Ok(Source::Files(present));
                }
                let listed: Vec<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
                looked.push(format!(
                    "no file KUBECONFIG lists exists ({})",
                    join(&listed)
                ));
            }
            (None, Some((path, true))) => return Ok(Source::Files(vec![path.clone()])),
            (None, Some((path, false))) => {
                looked.push(format!(
                    "KUBECONFIG is not set, {} does not exist",
                    path.display()
                ));
            }
            (None, None) => {
                looked.push("KUBECONFIG is not set, no home directory for ~/.kube/config".into())
            }
        }
        match (self.in_cluster, selects) {
            (true, false) => return Ok(Source::InCluster),
            (true, true) => looked.push(
                "and the pod's service account has no contexts, clusters or users to select".into(),
            ),
            (false, _) => looked.push(format!("and this is not a pod ({SERVICE_HOST} is not set)")),
        }
        Err(Error::NotFound {
            looked: looked.join(" "),
        })
    }
}

/// Reads and merges the kubeconfig files (the first to set a value wins).
fn read(paths: &[PathBuf]) -> Result<Kubeconfig, Error> {
    let mut merged = Kubeconfig::default();
    for path in paths {
        let file = Kubeconfig::read_from(path).map_err(|error| match error {
            KubeconfigError::ReadConfig(source, _) => Error::Read {
                path: path.clone(),
                source,
            },
            source => Error::Parse {
                path: path.clone(),
                source,
            },
        })?;
        merged = merged.merge(file).map_err(|source| Error::Merge {
            files: join(paths),
            source,
        })?;
    }
    Ok(merged)
}

/// The context, cluster and user asked for exist in `kubeconfig` (kube's own error for a
/// missing context says neither which file nor which contexts there are).
pub fn check_selection(
    kubeconfig: &Kubeconfig,
    options: &KubeConfigOptions,
    files: &str,
) -> Result<(), Error> {
    let entries = [
        (
            "context",
            &options.context,
            kubeconfig
                .contexts
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
        ),
        (
            "cluster",
            &options.cluster,
            kubeconfig
                .clusters
                .iter()
                .map(|c| c.name.as_str())
                .collect(),
        ),
        (
            "user",
            &options.user,
            kubeconfig
                .auth_infos
                .iter()
                .map(|u| u.name.as_str())
                .collect(),
        ),
    ];
    for (kind, wanted, known) in entries {
        if let Some(name) = wanted
            && !known.contains(&name.as_str())
        {
            return Err(Error::NoSuchEntry {
                kind,
                name: name.clone(),
                files: files.to_string(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            });
        }
    }
    Ok(())
}

fn join(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}
