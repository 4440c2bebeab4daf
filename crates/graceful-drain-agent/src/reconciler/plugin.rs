//! The kubelet side of the plugin sockets: finding a driver through its registration
//! socket (`<registry-dir>/<driver>-reg.sock`, `GetInfo`) and calling its SLMPlugin
//! service over plaintext HTTP/2 on a unix socket, each call bounded by a timeout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use graceful_drain_core::proto::registration::InfoRequest;
use graceful_drain_core::proto::registration::registration_client::RegistrationClient;
use graceful_drain_core::proto::slm::slm_plugin_client::SlmPluginClient;
use graceful_drain_core::proto::slm::{
    EndLifecycleTransitionRequest, LifecycleTransitionResponse, StartLifecycleTransitionRequest,
};
use graceful_drain_core::proto::{SLM_PLUGIN_TYPE, SLM_SUPPORTED_VERSION};

/// Errors talking to a plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be connected.
    #[error("connect to {path}")]
    Connect {
        /// The unix socket (registration or service).
        path: PathBuf,
        /// Why the connection failed.
        #[source]
        source: tonic::transport::Error,
    },
    /// The call returned a gRPC error.
    #[error("{method} on {path}: {status}")]
    Call {
        /// The gRPC method (`GetInfo`, `StartLifecycleTransition`, `EndLifecycleTransition`).
        method: &'static str,
        /// The unix socket called.
        path: PathBuf,
        /// The driver's gRPC status.
        status: Box<tonic::Status>,
    },
    /// The call did not answer in time.
    #[error("{method} on {path}: no answer within {timeout:?}")]
    Timeout {
        /// The gRPC method (`GetInfo`, `StartLifecycleTransition`, `EndLifecycleTransition`).
        method: &'static str,
        /// The unix socket called.
        path: PathBuf,
        /// The bound on connect plus call (`--lifecycle-call-timeout`).
        timeout: Duration,
    },
    /// The registration socket answered with something that is not this SLM driver.
    #[error("plugin at {path} is not SLM driver {driver}: {why}")]
    NotSlmDriver {
        /// The registration socket.
        path: PathBuf,
        /// The driver name looked up.
        driver: String,
        /// Which part of GetInfo's answer did not match (type, name or versions).
        why: String,
    },
}

impl Error {
    /// The driver could not be reached (its socket refuses connections, or the server
    /// is going away): it is restarting, not failing. Retried until the SLA passes.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Call { status, .. } => matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Cancelled
            ),
            Self::Timeout { .. } | Self::NotSlmDriver { .. } => false,
        }
    }
}

/// Where a registered driver serves its SLMPlugin service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The driver's name, as looked up and confirmed by GetInfo.
    pub driver: String,
    /// The SLMPlugin service socket: GetInfo's endpoint, else
    /// `<plugins-dir>/<driver>/slm.sock`.
    pub endpoint: PathBuf,
}

/// Connects a channel to a unix socket (the URI is a placeholder tonic requires).
async fn channel(path: &Path, timeout: Duration) -> Result<Channel, Error> {
    let socket = path.to_path_buf();
    Endpoint::from_static("http://[::1]:50051")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|source| Error::Connect {
            path: path.to_path_buf(),
            source,
        })
}

async fn bounded<T>(
    method: &'static str,
    path: &Path,
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, Error> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(Error::Call {
            method,
            path: path.to_path_buf(),
            status: Box::new(status),
        }),
        Err(_) => Err(Error::Timeout {
            method,
            path: path.to_path_buf(),
            timeout,
        }),
    }
}

/// Looks `driver` up the way the kubelet's plugin watcher would: its registration socket
/// must exist and answer GetInfo with type SLMPlugin, this name and our API version.
/// `Ok(None)` when no socket exists (not registered).
pub async fn lookup(
    registry_dir: &Path,
    driver: &str,
    plugins_dir: &Path,
    timeout: Duration,
) -> Result<Option<Registered>, Error> {
    let path = registry_dir.join(format!("{driver}-reg.sock"));
    if !tokio::fs::try_exists(&path).await.unwrap_or(false) {
        return Ok(None);
    }
    let mut client = RegistrationClient::new(channel(&path, timeout).await?);
    let info = bounded("GetInfo", &path, timeout, client.get_info(InfoRequest {})).await?;
    let reject = |why: String| Error::NotSlmDriver {
        path: path.clone(),
        driver: driver.to_string(),
        why,
    };
    if info.r#type != SLM_PLUGIN_TYPE {
        return Err(reject(format!("type {:?}", info.r#type)));
    }
    if info.name != driver {
        return Err(reject(format!("name {:?}", info.name)));
    }
    if !info
        .supported_versions
        .iter()
        .any(|v| v == SLM_SUPPORTED_VERSION)
    {
        return Err(reject(format!("versions {:?}", info.supported_versions)));
    }
    let endpoint = if info.endpoint.is_empty() {
        plugins_dir.join(driver).join("slm.sock")
    } else {
        PathBuf::from(info.endpoint)
    };
    Ok(Some(Registered {
        driver: driver.to_string(),
        endpoint,
    }))
}

/// Calls StartLifecycleTransition.
pub async fn start(
    plugin: &Registered,
    request: StartLifecycleTransitionRequest,
    timeout: Duration,
) -> Result<LifecycleTransitionResponse, Error> {
    let path = &plugin.endpoint;
    let call = async {
        let mut client = SlmPluginClient::new(channel(path, timeout).await?);
        bounded(
            "StartLifecycleTransition",
            path,
            timeout,
            client.start_lifecycle_transition(request),
        )
        .await
    };
    flatten_timeout("StartLifecycleTransition", path, timeout, call).await
}

/// Calls EndLifecycleTransition.
pub async fn end(
    plugin: &Registered,
    request: EndLifecycleTransitionRequest,
    timeout: Duration,
) -> Result<LifecycleTransitionResponse, Error> {
    let path = &plugin.endpoint;
    let call = async {
        let mut client = SlmPluginClient::new(channel(path, timeout).await?);
        bounded(
            "EndLifecycleTransition",
            path,
            timeout,
            client.end_lifecycle_transition(request),
        )
        .await
    };
    flatten_timeout("EndLifecycleTransition", path, timeout, call).await
}

/// Bounds connect plus call together by one timeout.
async fn flatten_timeout<T>(
    method: &'static str,
    path: &Path,
    timeout: Duration,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout {
                method,
                path: path.to_path_buf(),
                timeout,
            })
        })
}
