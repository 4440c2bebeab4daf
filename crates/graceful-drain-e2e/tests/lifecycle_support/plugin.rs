//! A scripted SLM driver: the Registration and SLMPlugin gRPC services on unix sockets in
//! a temporary directory laid out like the kubelet's (`<registry>/<driver>-reg.sock`,
//! `<plugins>/<driver>/slm.sock`). Each call is recorded and answered by a script.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use graceful_drain_core::proto::registration::registration_server::{
    Registration, RegistrationServer,
};
use graceful_drain_core::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use graceful_drain_core::proto::slm::slm_plugin_server::{SlmPlugin, SlmPluginServer};
use graceful_drain_core::proto::slm::{
    EndLifecycleTransitionRequest, LifecycleTransitionResponse, StartLifecycleTransitionRequest,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

/// One call the driver received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Start {
        event: String,
        node: String,
        transition: String,
        start: String,
        end: String,
    },
    End {
        event: String,
        sla_expired: bool,
    },
}

/// What a call answers.
#[derive(Clone, Debug)]
pub enum Reply {
    Condition(&'static str),
    Error(&'static str),
    Grpc(tonic::Code),
}

type Script = Arc<dyn Fn(&Call, &[Call]) -> Reply + Send + Sync>;

#[derive(Clone)]
pub struct Driver {
    pub calls: Arc<Mutex<Vec<Call>>>,
    script: Arc<Mutex<Script>>,
    info: PluginInfo,
}

impl Driver {
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn starts(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c, Call::Start { .. }))
            .count()
    }

    pub fn set_script(&self, script: impl Fn(&Call, &[Call]) -> Reply + Send + Sync + 'static) {
        *self.script.lock().unwrap() = Arc::new(script);
    }

    fn answer(
        &self,
        call: Call,
    ) -> Result<tonic::Response<LifecycleTransitionResponse>, tonic::Status> {
        let script = self.script.lock().unwrap().clone();
        let previous = self.calls();
        let reply = script(&call, &previous);
        self.calls.lock().unwrap().push(call);
        match reply {
            Reply::Condition(c) => Ok(tonic::Response::new(LifecycleTransitionResponse {
                lifecycle_condition: c.into(),
                node_name: String::new(),
                error: String::new(),
            })),
            Reply::Error(e) => Ok(tonic::Response::new(LifecycleTransitionResponse {
                lifecycle_condition: String::new(),
                node_name: String::new(),
                error: e.into(),
            })),
            Reply::Grpc(code) => Err(tonic::Status::new(code, "scripted failure")),
        }
    }
}

/// The drain driver of the node agent, reduced to its protocol: Start answers the start
/// reason, End answers the start reason `polls` times per event and then the end reason.
pub fn draining(polls: usize) -> impl Fn(&Call, &[Call]) -> Reply + Send + Sync + 'static {
    move |call, previous| match call {
        Call::Start { .. } => Reply::Condition("drain-started"),
        Call::End {
            sla_expired: true, ..
        } => Reply::Condition("drain-started"),
        Call::End { event, .. } => {
            let ends = previous
                .iter()
                .filter(|c| matches!(c, Call::End { event: e, .. } if e == event))
                .count();
            if ends >= polls {
                Reply::Condition("drain-complete")
            } else {
                Reply::Condition("drain-started")
            }
        }
    }
}

#[tonic::async_trait]
impl SlmPlugin for Driver {
    async fn start_lifecycle_transition(
        &self,
        request: tonic::Request<StartLifecycleTransitionRequest>,
    ) -> Result<tonic::Response<LifecycleTransitionResponse>, tonic::Status> {
        let r = request.into_inner();
        self.answer(Call::Start {
            event: r.event_name,
            node: r.node_name,
            transition: r.transition_name,
            start: r.start,
            end: r.end,
        })
    }

    async fn end_lifecycle_transition(
        &self,
        request: tonic::Request<EndLifecycleTransitionRequest>,
    ) -> Result<tonic::Response<LifecycleTransitionResponse>, tonic::Status> {
        let r = request.into_inner();
        self.answer(Call::End {
            event: r.event_name,
            sla_expired: r.sla_expired,
        })
    }
}

#[tonic::async_trait]
impl Registration for Driver {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        _: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(RegistrationStatusResponse {}))
    }
}

/// Kubelet-like directories in a temporary folder.
pub struct Dirs {
    pub _tmp: tempfile::TempDir,
    pub registry: PathBuf,
    pub plugins: PathBuf,
}

impl Dirs {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let registry = tmp.path().join("plugins_registry");
        let plugins = tmp.path().join("plugins");
        std::fs::create_dir_all(&registry).unwrap();
        std::fs::create_dir_all(&plugins).unwrap();
        Self {
            _tmp: tmp,
            registry,
            plugins,
        }
    }
}

/// Serves a driver named `name` with `info_type` until `stop`; returns once both sockets
/// accept connections.
pub fn serve(dirs: &Dirs, name: &str, info_type: &str, stop: CancellationToken) -> Driver {
    let slm_dir = dirs.plugins.join(name);
    std::fs::create_dir_all(&slm_dir).unwrap();
    let slm = slm_dir.join("slm.sock");
    let reg = dirs.registry.join(format!("{name}-reg.sock"));
    let driver = Driver {
        calls: Arc::default(),
        script: Arc::new(Mutex::new(Arc::new(draining(1)))),
        info: PluginInfo {
            r#type: info_type.into(),
            name: name.into(),
            endpoint: slm.display().to_string(),
            supported_versions: vec!["v1alpha1.SLMPlugin".into()],
        },
    };
    spawn(&slm, SlmPluginServer::new(driver.clone()), stop.clone());
    spawn(&reg, RegistrationServer::new(driver.clone()), stop);
    driver
}

fn spawn<S>(path: &Path, service: S, stop: CancellationToken)
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap();
    let path = path.to_path_buf();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled())
            .await
            .unwrap();
        let _ = std::fs::remove_file(path);
    });
}
