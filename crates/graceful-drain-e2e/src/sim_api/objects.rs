//! Typed setup and reads for the tests: create objects with their status, patch a status as
//! its controller would, read back the node, pods, Events and LifecycleTransitions, and
//! play the kubelet's last step of a pod deletion.

use graceful_drain_core::lifecycle::{
    ClaimStatus, LifecycleEvent, LifecycleEventSpec, LifecycleEventStatus, LifecycleTransition,
};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions,
};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{NODE, SHOP, SimApi};
use graceful_drain_testing::fixtures::PodFixture;

impl SimApi {
    /// Creates LifecycleEvent `name` for `transition` on [`NODE`], claimed, its SLA an hour
    /// away.
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

    /// Node [`NODE`] as stored.
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

    /// The LifecycleTransitions published.
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

/// A pod of the [`SHOP`] namespace on [`NODE`], with a container, running and ready.
pub fn shop_pod(name: &str) -> Pod {
    graceful_drain_testing::fixtures::pod(name)
        .ns(SHOP)
        .on_node(NODE)
        .container("registry.example/app:1")
        .running()
        .ready()
}
