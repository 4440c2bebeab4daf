//! A test playing the kubelet: the plugin watcher's registration handshake, then the
//! SLM Start/End calls, over the agent's real unix sockets.

use std::path::{Path, PathBuf};

use graceful_drain_core::proto::registration::InfoRequest;
use graceful_drain_core::proto::registration::RegistrationStatus;
use graceful_drain_core::proto::registration::registration_client::RegistrationClient;
use graceful_drain_core::proto::slm::slm_plugin_client::SlmPluginClient;
use graceful_drain_core::proto::slm::{
    EndLifecycleTransitionRequest, LifecycleTransitionResponse, StartLifecycleTransitionRequest,
};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use graceful_drain_testing::eventually::eventually_some;

pub use graceful_drain_testing::eventually::DEADLINE;

/// A gRPC channel over the unix socket at `path`, as the kubelet dials plugins.
pub async fn connect(path: PathBuf) -> Channel {
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}

/// The kubelet's side: registration, then Start/End.
pub struct Kubelet {
    /// The node the kubelet runs on; End calls name it.
    pub node: String,
    /// The LifecycleEvent the calls are for (`ev-1` unless changed).
    pub event: String,
    slm: SlmPluginClient<Channel>,
}

impl Kubelet {
    /// Registers like the plugin watcher and returns the plugin's SLM client.
    pub async fn register(registration_socket: &Path, node: &str) -> Self {
        let mut reg = RegistrationClient::new(connect(registration_socket.to_path_buf()).await);
        let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.r#type, "SLMPlugin");
        assert_eq!(info.name, "graceful-drain.io");
        assert_eq!(info.supported_versions, ["v1alpha1.SLMPlugin"]);
        assert!(
            info.endpoint
                .ends_with("plugins/graceful-drain.io/slm.sock"),
            "{}",
            info.endpoint
        );
        let status = RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        };
        reg.notify_registration_status(status).await.unwrap();
        Self {
            node: node.to_string(),
            event: "ev-1".to_string(),
            slm: SlmPluginClient::new(connect(PathBuf::from(info.endpoint)).await),
        }
    }

    /// Calls Start of `transition` for `node` and the kubelet's event, as the kubelet
    /// does when the event's transition begins.
    pub async fn start(&mut self, transition: &str, node: &str) -> LifecycleTransitionResponse {
        let (start, end) = reasons(transition);
        let req = StartLifecycleTransitionRequest {
            transition_name: transition.into(),
            event_name: self.event.clone(),
            node_name: node.into(),
            start: start.into(),
            end: end.into(),
        };
        // Bounded: the kubelet would give up after 45 s; a hang fails the test.
        tokio::time::timeout(DEADLINE, self.slm.start_lifecycle_transition(req))
            .await
            .expect("Start answered")
            .unwrap()
            .into_inner()
    }

    /// Calls End of `transition` for the kubelet's node and event, as the kubelet does
    /// while it waits for the drain (`sla_expired` when the event's SLA ran out).
    pub async fn end(
        &mut self,
        transition: &str,
        sla_expired: bool,
    ) -> LifecycleTransitionResponse {
        call_end(self.slm.clone(), self.end_request(transition, sla_expired)).await
    }

    fn end_request(&self, transition: &str, sla_expired: bool) -> EndLifecycleTransitionRequest {
        let (start, end) = reasons(transition);
        EndLifecycleTransitionRequest {
            transition_name: transition.into(),
            event_name: self.event.clone(),
            node_name: self.node.clone(),
            start: start.into(),
            end: end.into(),
            sla_expired,
        }
    }

    /// Calls End until it answers `want` (or an error), within [`DEADLINE`].
    pub async fn end_until(&mut self, transition: &str, want: &str) -> LifecycleTransitionResponse {
        let what = format!("End of {transition} answering {want}");
        eventually_some(&what, DEADLINE, || {
            let end = call_end(self.slm.clone(), self.end_request(transition, false));
            async move {
                let answer = end.await;
                let done = answer.lifecycle_condition == want || !answer.error.is_empty();
                if done { Ok(answer) } else { Err(answer) }
            }
        })
        .await
    }
}

/// One End call, bounded by [`DEADLINE`] (the kubelet would give up after 45 s; a hang
/// fails the test).
async fn call_end(
    mut slm: SlmPluginClient<Channel>,
    request: EndLifecycleTransitionRequest,
) -> LifecycleTransitionResponse {
    tokio::time::timeout(DEADLINE, slm.end_lifecycle_transition(request))
        .await
        .expect("End answered")
        .unwrap()
        .into_inner()
}

fn reasons(transition: &str) -> (&'static str, &'static str) {
    match transition {
        "graceful-drain" => ("drain-started", "drain-complete"),
        "graceful-maintenance-complete" => ("uncordoning", "maintenance-complete"),
        _ => ("x-started", "x-done"),
    }
}
