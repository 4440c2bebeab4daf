//! Kubelet plugin registration (the plugin watcher's `Registration` service, docs/design.md §3)
//! and the unix sockets both gRPC services listen on.
//!
//! The kubelet finds `<registry-dir>/<driver>-reg.sock`, calls `GetInfo` to learn our type
//! (`SLMPlugin`), name and service socket, and reports its verdict with
//! `NotifyRegistrationStatus`. A refusal is logged and, when the kubelet is the only thing
//! that can drive our transitions (lifecycle reconciler off, or `auto` deciding off), fails
//! `/readyz`. A kubelet without the SLM gate refuses every `SLMPlugin`; on such clusters the
//! lifecycle reconciler drives the transitions, so the refusal is expected there.

use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

use super::node::API_TIMEOUT;
use super::report::Metrics;
use graceful_drain_core::admin::Readiness;
use graceful_drain_core::proto::registration::registration_server::Registration;
use graceful_drain_core::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use graceful_drain_core::proto::{SLM_PLUGIN_TYPE, SLM_SUPPORTED_VERSION};

/// Readiness check name for the kubelet's registration verdict.
pub const READINESS_CHECK: &str = "kubelet-registration";

/// Errors while preparing a socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket's folder could not be created.
    #[error("create socket folder {path}")]
    CreateDir {
        /// The folder that could not be created.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A stale socket could not be removed.
    #[error("remove stale socket {path}")]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The socket could not be bound, or its mode could not be set to [`SOCKET_MODE`].
    #[error("listen on {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Mode of our socket files: only the agent's own user (root on a node) and root — the
/// kubelet — may connect; nothing else on the node may drive a drain.
pub const SOCKET_MODE: u32 = 0o600;

/// A socket file this process created, known by its inode so that removing it never
/// removes a successor's: during a DaemonSet update with maxSurge the new agent binds the
/// same path before the old one shuts down.
#[derive(Clone, Debug)]
pub struct Socket {
    /// Where the socket file is.
    pub path: PathBuf,
    inode: Option<(u64, u64)>,
}

fn inode(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl Socket {
    /// Removes the socket file if it is still the one this process created; logs (never
    /// fails) otherwise.
    pub fn remove(&self) {
        let path = &self.path;
        if self.inode.is_none() || inode(path) != self.inode {
            tracing::info!(path = %path.display(), "socket replaced by another agent; left in place");
            return;
        }
        remove(path);
    }
}

/// Binds a unix socket at `path` with mode [`SOCKET_MODE`], creating its folder and
/// removing a stale socket left by a previous run.
pub fn bind(path: &Path) -> Result<(UnixListener, Socket), Error> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed stale socket"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::RemoveStale {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    let bind_error = |source| Error::Bind {
        path: path.to_path_buf(),
        source,
    };
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    let mode = std::fs::Permissions::from_mode(SOCKET_MODE);
    std::fs::set_permissions(path, mode).map_err(bind_error)?;
    let socket = Socket {
        path: path.to_path_buf(),
        inode: inode(path),
    };
    Ok((listener, socket))
}

/// Removes a socket file, logging (not failing) on error.
pub fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed socket"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %path.display(), error = %graceful_drain_core::error::chain(&error), "remove socket")
        }
    }
}

/// The registration socket path of `driver`.
pub fn registration_socket(registry_dir: &Path, driver: &str) -> PathBuf {
    registry_dir.join(format!("{driver}-reg.sock"))
}

/// The SLM service socket path of `driver`.
pub fn service_socket(plugins_dir: &Path, driver: &str) -> PathBuf {
    plugins_dir.join(driver).join("slm.sock")
}

/// What a kubelet refusal means for readiness, from `--lifecycle-reconciler`.
#[derive(Clone)]
pub enum KubeletPolicy {
    /// `off`: only the kubelet drives our transitions, so a refusal makes us unready.
    Required,
    /// `on`: the lifecycle reconciler drives them; a refusal is only logged.
    Optional,
    /// `auto`: ask the reconciler's own rule whether it runs on this cluster.
    Auto(kube::Client),
}

/// The Registration service.
#[derive(Clone)]
pub struct RegistrationService {
    /// The driver name GetInfo reports.
    pub driver: String,
    /// The SLM service socket GetInfo reports as the endpoint.
    pub endpoint: PathBuf,
    /// Where a refusal marks [`READINESS_CHECK`] not ready, and a registration ready.
    pub readiness: Readiness,
    /// Records whether the kubelet registered the plugin.
    pub metrics: Metrics,
    /// Whether a kubelet refusal makes the agent unready.
    pub policy: KubeletPolicy,
}

impl RegistrationService {
    /// Handles a refusal: logged always, unready when nothing else drives transitions.
    fn refused(&self, error: String) {
        let reason = format!("kubelet refused plugin {}: {error}", self.driver);
        match &self.policy {
            KubeletPolicy::Required => {
                tracing::error!(driver = %self.driver, %error, "kubelet refused the plugin");
                self.readiness.not_ready(READINESS_CHECK, reason);
            }
            KubeletPolicy::Optional => warn_covered(&self.driver, &error),
            KubeletPolicy::Auto(client) => {
                let (client, readiness, driver) =
                    (client.clone(), self.readiness.clone(), self.driver.clone());
                // Answer the kubelet at once; the API lookup runs on its own, bounded.
                tokio::spawn(async move {
                    let covered =
                        tokio::time::timeout(API_TIMEOUT, crate::reconciler::auto_enabled(&client))
                            .await;
                    match covered {
                        Ok(Ok(true)) => warn_covered(&driver, &error),
                        Ok(Ok(false)) => {
                            tracing::error!(%driver, %error, "kubelet refused the plugin");
                            readiness.not_ready(READINESS_CHECK, reason);
                        }
                        Ok(Err(lookup)) => {
                            let reason = format!(
                                "{reason} (and could not tell whether the lifecycle reconciler covers: {lookup})"
                            );
                            tracing::error!(%driver, %reason, "kubelet refused the plugin");
                            readiness.not_ready(READINESS_CHECK, reason);
                        }
                        Err(_) => {
                            let reason = format!(
                                "{reason} (and could not tell whether the lifecycle reconciler covers: timed out)"
                            );
                            tracing::error!(%driver, %reason, "kubelet refused the plugin");
                            readiness.not_ready(READINESS_CHECK, reason);
                        }
                    }
                });
            }
        }
    }
}

fn warn_covered(driver: &str, error: &str) {
    tracing::warn!(
        driver,
        error,
        "kubelet refused the plugin (its SLM gate is off); the lifecycle reconciler drives transitions"
    );
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::info!(driver = %self.driver, "kubelet asked for plugin info");
        Ok(Response::new(PluginInfo {
            r#type: SLM_PLUGIN_TYPE.to_string(),
            name: self.driver.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: vec![SLM_SUPPORTED_VERSION.to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.metrics.set_registered(status.plugin_registered);
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, "kubelet registered the plugin");
            self.readiness.ready(READINESS_CHECK);
        } else {
            self.refused(status.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[tokio::test]
    async fn sockets_are_private_and_an_old_agent_never_removes_its_successors() {
        let dir = tempfile::tempdir().unwrap();
        let path = service_socket(dir.path(), "graceful-drain.io");
        let (_old_listener, old) = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
        // A DaemonSet update with maxSurge: the new agent binds the same path first.
        let (_new_listener, new) = bind(&path).unwrap();
        old.remove();
        assert!(
            path.exists(),
            "the old agent left the new agent's socket alone"
        );
        new.remove();
        assert!(!path.exists(), "an agent removes its own socket");
    }
}
