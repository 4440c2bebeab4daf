//! The agent tests' API server: the simulated one (`kube_sim::apiserver`, with
//! its resourceVersions, UID preconditions, eviction and PDB rules, graceful pod deletion
//! and watch replay) serving the lifecycle CRDs, holding node `n1` and the claimed
//! LifecycleEvent `ev-1` the scripted kubelet drives. No controller and no kubelet run: a
//! pod deleted with a grace period stays terminating until [`SimApi::finish_terminating`],
//! and a PodDisruptionBudget's status is what the test writes.
//!
//! The agent's client records every request it sends with the status it got
//! ([`SimApi::requests`]), for assertions on request shapes, and wakes
//! [`SimApi::until`] after each answer, so waits for the agent's writes are event-driven.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::fixtures::{NodeFixture, PodFixture, node};
use graceful_drain_core::lifecycle::{
    ClaimStatus, LifecycleEvent, LifecycleEventSpec, LifecycleEventStatus, LifecycleTransition,
};
use graceful_drain_core::runtime::Shutdown;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions,
};
use kube::client::Body;
use kube::{Resource, ResourceExt};
use kube_sim::apiserver::{ApiServer, Config, Faults};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::kubelet::DEADLINE;

/// The node the agent serves.
pub const NODE: &str = "n1";
/// The LifecycleEvent the scripted kubelet's calls are for.
pub const EVENT: &str = "ev-1";
/// The agent's identity (faults name it; its requests are counted per user).
pub const AGENT_USER: &str = "system:serviceaccount:graceful-drain:node-agent";
/// Namespace of the test workloads (besides the built-in ones).
pub const SHOP: &str = "shop";

const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// One request of the agent and the status it got.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub body: Value,
    pub code: u16,
}

impl Recorded {
    /// The pod name of an eviction (`/api/v1/namespaces/NS/pods/NAME/eviction`).
    pub fn pod(&self) -> &str {
        self.path.split('/').nth(6).unwrap_or_default()
    }
}

pub struct SimApi {
    server: ApiServer,
    shutdown: Shutdown,
    requests: Arc<Mutex<Vec<Recorded>>>,
    answered: watch::Sender<usize>,
    crds_hidden: Arc<AtomicBool>,
}

impl Drop for SimApi {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl SimApi {
    /// A simulated API server with `faults`, the lifecycle CRDs, node `n1` (Ready) and
    /// LifecycleEvent `ev-1` of the drain transition, claimed with an SLA an hour ahead
    /// (a drain lives only as long as its event).
    pub async fn start(faults: Faults) -> Self {
        let shutdown = Shutdown::new();
        let mut config = Config {
            faults,
            ..Config::default()
        };
        config.namespaces.push(SHOP.into());
        let server = ApiServer::start(config, shutdown.clone()).await.unwrap();
        let api = Self {
            server,
            shutdown,
            requests: Arc::default(),
            answered: watch::Sender::new(0),
            crds_hidden: Arc::default(),
        };
        for crd in graceful_drain_core::lifecycle::crds::crds().unwrap() {
            api.create(crd).await;
        }
        api.create(node(NODE).ready_is(true)).await;
        api.create_event(EVENT, graceful_drain_core::lifecycle::DRAIN_TRANSITION)
            .await;
        api
    }

    /// Creates LifecycleEvent `name` for `transition` on `n1`, claimed, its SLA an hour away.
    pub async fn create_event(&self, name: &str, transition: &str) {
        let sla = jiff::Timestamp::now() + std::time::Duration::from_secs(3600);
        let mut event = LifecycleEvent::new(
            name,
            LifecycleEventSpec {
                transition_name: transition.into(),
                binding_node: NODE.into(),
            },
        );
        event.status = Some(LifecycleEventStatus {
            claim_status: Some(ClaimStatus::Claimed),
            sla: Some(sla.to_string()),
            ..LifecycleEventStatus::default()
        });
        self.create(event).await;
    }

    /// A cluster admin's client (setup and reads; not recorded).
    pub fn admin(&self) -> kube::Client {
        self.server.client("admin")
    }

    /// The agent's client: every request recorded with its status, then announced.
    pub fn agent_client(&self) -> kube::Client {
        let inner = self.server.client(AGENT_USER);
        let requests = self.requests.clone();
        let answered = self.answered.clone();
        let hidden = self.crds_hidden.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let (inner, requests, answered) = (inner.clone(), requests.clone(), answered.clone());
            let hide = hidden.load(Ordering::SeqCst)
                && request.uri().path().starts_with(CRD_PATH)
                && request
                    .uri()
                    .path()
                    .ends_with(".lifecycle.graceful-drain.io");
            async move {
                if hide {
                    return Ok::<_, Infallible>(crd_not_found());
                }
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await.unwrap().to_bytes();
                let (method, path) = (parts.method.clone(), parts.uri.path().to_string());
                let request = Request::from_parts(parts, Body::from(bytes.to_vec()));
                let response: Response<Body> = inner.send(request).await.unwrap();
                requests.lock().unwrap().push(Recorded {
                    method,
                    path,
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    code: response.status().as_u16(),
                });
                answered.send_modify(|n| *n += 1);
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    /// The agent client's lookups of the lifecycle CRD objects answer 404 while the API
    /// stays served: a cluster whose API server has lifecycle.k8s.io built in, which the
    /// simulator (serving it through CRDs only) cannot be.
    pub fn hide_lifecycle_crds(&self) {
        self.crds_hidden.store(true, Ordering::SeqCst);
    }

    /// Every request the agent sent, in the order answered.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// The agent's eviction requests.
    pub fn evictions(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == Method::POST && r.path.ends_with("/eviction"))
            .collect()
    }

    /// Returns once `check` holds, trying again after each answer to the agent, within
    /// [`DEADLINE`].
    pub async fn until<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let mut answered = self.answered.subscribe();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            answered.borrow_and_update();
            if check().await {
                return;
            }
            let next = tokio::time::timeout_at(deadline, answered.changed()).await;
            assert!(
                matches!(next, Ok(Ok(()))),
                "timed out waiting for {what}; the agent sent {:?}",
                self.requests()
                    .iter()
                    .map(|r| format!("{} {} {}", r.method, r.path, r.code))
                    .collect::<Vec<_>>()
            );
        }
    }

    /// Creates `obj` as the admin, then writes its status through the status subresource
    /// (as its controller or kubelet would; a create drops it). Returns the stored object.
    pub async fn create<K>(&self, obj: K) -> K
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let mut value = serde_json::to_value(&obj).unwrap();
        let status = value["status"].take();
        let api = self.api_for::<K>(obj.namespace().as_deref());
        let object: DynamicObject = serde_json::from_value(value).unwrap();
        let stored = api.create(&PostParams::default(), &object).await.unwrap();
        let stored = match status {
            Value::Null => stored,
            Value::Object(ref map) if map.is_empty() => stored,
            status => {
                let patch = Patch::Merge(json!({ "status": status }));
                let name = stored.name_any();
                api.patch_status(&name, &PatchParams::default(), &patch)
                    .await
                    .unwrap()
            }
        };
        serde_json::from_value(serde_json::to_value(stored).unwrap()).unwrap()
    }

    /// Merge-patches the status of `name` (in `ns`, if namespaced), as its controller does.
    pub async fn patch_status<K>(&self, ns: Option<&str>, name: &str, status: Value)
    where
        K: Resource<DynamicType = ()>,
    {
        let patch = Patch::Merge(json!({ "status": status }));
        self.api_for::<K>(ns)
            .patch_status(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
    }

    /// The admin's API for objects of kind `K`, in `ns` if namespaced.
    fn api_for<K>(&self, ns: Option<&str>) -> Api<DynamicObject>
    where
        K: Resource<DynamicType = ()>,
    {
        let resource = ApiResource::erase::<K>(&());
        match ns {
            Some(ns) => Api::namespaced_with(self.admin(), ns, &resource),
            None => Api::all_with(self.admin(), &resource),
        }
    }

    /// Node `n1` as stored.
    pub async fn node(&self) -> Node {
        Api::<Node>::all(self.admin()).get(NODE).await.unwrap()
    }

    /// The names of the pods left, ordered by namespace then name.
    pub async fn pod_names(&self) -> Vec<String> {
        let pods = Api::<Pod>::all(self.admin());
        let mut pods = pods.list(&ListParams::default()).await.unwrap().items;
        pods.sort_by_key(|p| (p.namespace(), p.name_any()));
        pods.iter().map(|p| p.name_any()).collect()
    }

    /// Events with `reason` (the agent posts those about the Node in `default`).
    pub async fn events(&self, reason: &str) -> Vec<Event> {
        let events = Api::<Event>::namespaced(self.admin(), "default");
        let mut all = events.list(&ListParams::default()).await.unwrap().items;
        all.retain(|e| e.reason.as_deref() == Some(reason));
        all
    }

    /// The LifecycleTransitions published, by name.
    pub async fn transitions(&self) -> Vec<LifecycleTransition> {
        let api = Api::<LifecycleTransition>::all(self.admin());
        api.list(&ListParams::default()).await.unwrap().items
    }

    /// What the kubelet does once a terminating pod's containers stopped: deletes it with
    /// grace 0 and its UID as precondition, which removes it.
    pub async fn finish_terminating(&self) {
        let kubelet = self.server.client(&format!("system:node:{NODE}"));
        let all = Api::<Pod>::all(kubelet.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={NODE}"));
        for pod in all.list(&lp).await.unwrap().items {
            if pod.metadata.deletion_timestamp.is_none() {
                continue;
            }
            let ns = pod.namespace().unwrap();
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: pod.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let pods = Api::<Pod>::namespaced(kubelet.clone(), &ns);
            pods.delete(&pod.name_any(), &dp).await.unwrap();
        }
    }
}

/// The 404 Status of a CRD object that does not exist.
fn crd_not_found() -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "NotFound", "code": 404});
    Response::builder()
        .status(404)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap()
}

/// A pod of the `shop` namespace on `n1`, with a container, running and ready.
pub fn shop_pod(name: &str) -> Pod {
    crate::fixtures::pod(name)
        .ns(SHOP)
        .on_node(NODE)
        .container("registry.example/app:1")
        .running()
        .ready()
}
