//! The simulated scheduler: binds pending pods without a node to a schedulable node
//! (not cordoned, Ready, matching the pod's nodeSelector, NoSchedule/NoExecute taints
//! tolerated), picking the least-loaded node (ties by name), through the `binding`
//! subresource as `system:kube-scheduler`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::PostParams;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::{
    Reconciler, Result, Watches, labels_of, ns_name, pod_finished, ready, run_passes, status_code,
};
use tokio_util::sync::CancellationToken;

/// Concurrent binding calls; the API server handles them independently, and 16 keeps
/// a 500-pod burst quick without flooding it.
const BIND_CONCURRENCY: usize = 16;

/// Whether `pod` tolerates `taint`.
fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == taint.key,
        };
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => {
                t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
            }
        };
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        key_ok && value_ok && effect_ok
    })
}

/// Whether `pod` may be placed on `node`.
pub fn fits(pod: &Pod, node: &Node) -> bool {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        return false;
    }
    let not_ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status != "True");
    if not_ready {
        return false;
    }
    let pod_spec = pod.spec.as_ref();
    let node_labels = labels_of(node);
    let selector_ok = pod_spec
        .and_then(|s| s.node_selector.as_ref())
        .into_iter()
        .flatten()
        .all(|(k, v)| node_labels.get(k) == Some(v));
    let tolerations = pod_spec
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let taints_ok = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerates(&tolerations, t));
    selector_ok && taints_ok
}

/// The least-loaded node `pod` fits on (ties broken by name), given pods per node.
pub fn pick_node<'a>(
    pod: &Pod,
    nodes: &'a [Arc<Node>],
    load: &HashMap<String, usize>,
) -> Option<&'a str> {
    nodes
        .iter()
        .filter(|n| fits(pod, n))
        .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), pod_room(n)))
        .filter(|(name, room)| room.is_none_or(|r| load.get(*name).copied().unwrap_or(0) < r))
        .map(|(name, _)| name)
        .min_by_key(|name| (load.get(*name).copied().unwrap_or(0), *name))
}

/// How many pods `node` holds (`status.allocatable.pods`, 110 from a default kubelet);
/// `None` when it reports none. The real scheduler's NodeResourcesFit filter refuses a
/// node whose pods would exceed it (`fitsRequest` in
/// pkg/scheduler/framework/plugins/noderesources/fit.go, v1.37.2: "Too many pods").
fn pod_room(node: &Node) -> Option<usize> {
    let pods = node.status.as_ref()?.allocatable.as_ref()?.get("pods")?;
    pods.0.parse().ok()
}

fn wants_scheduling(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && !pod_finished(pod)
        && spec
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default()
            .is_empty()
        && spec
            .and_then(|s| s.scheduler_name.as_deref())
            .is_none_or(|s| s == "default-scheduler")
}

struct Scheduler {
    client: kube::Client,
    pods: Store<Pod>,
    nodes: Store<Node>,
    /// Pods bound by us that the cache does not show bound yet: uid → node.
    assumed: HashMap<String, String>,
}

impl Reconciler for Scheduler {
    async fn pass(&mut self) -> Option<Instant> {
        let pods = self.pods.state();
        let nodes = self.nodes.state();
        let mut load: HashMap<String, usize> = HashMap::new();
        let mut present: BTreeMap<String, bool> = BTreeMap::new();
        for pod in &pods {
            let uid = pod.uid().unwrap_or_default();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            present.insert(uid, node.is_some());
            if let Some(node) = node.filter(|_| !pod_finished(pod)) {
                *load.entry(node).or_default() += 1;
            }
        }
        self.assumed
            .retain(|uid, _| present.get(uid).is_some_and(|bound| !bound));
        for node in self.assumed.values() {
            *load.entry(node.clone()).or_default() += 1;
        }
        let mut bindings = Vec::new();
        for pod in pods.iter().filter(|p| wants_scheduling(p)) {
            let uid = pod.uid().unwrap_or_default();
            if self.assumed.contains_key(&uid) {
                continue;
            }
            let Some(node) = pick_node(pod, &nodes, &load) else {
                continue;
            };
            *load.entry(node.to_string()).or_default() += 1;
            self.assumed.insert(uid.clone(), node.to_string());
            bindings.push((ns_name(&**pod), uid, node.to_string()));
        }
        let client = &self.client;
        let failed: Vec<String> = futures::stream::iter(bindings)
            .map(|((ns, name), uid, node)| async move {
                match bind(client, &ns, &name, &node).await {
                    Ok(()) => None,
                    Err(error) if status_code(&error) == Some(404) => None,
                    Err(error) => {
                        tracing::info!(pod = %format!("{ns}/{name}"), %node, %error, "bind failed");
                        Some(uid)
                    }
                }
            })
            .buffer_unordered(BIND_CONCURRENCY)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        for uid in failed {
            self.assumed.remove(&uid);
        }
        None
    }
}

async fn bind(client: &kube::Client, ns: &str, name: &str, node: &str) -> Result<(), kube::Error> {
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.create_subresource::<_, serde_json::Value>("binding", name, &PostParams::default(), &body)
        .await?;
    Ok(())
}

/// Runs the scheduler as `system:kube-scheduler` until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let pods = watches.all::<Pod>();
    let nodes = watches.all::<Node>();
    if !(ready(&pods, &shutdown).await && ready(&nodes, &shutdown).await) {
        return Ok(());
    }
    let sched = Scheduler {
        client,
        pods,
        nodes,
        assumed: HashMap::new(),
    };
    run_passes(sched, &wake, &shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, NodeFixture, PodFixture};

    fn node(
        name: &str,
        cordoned: bool,
        ready: bool,
        labels: &[(&str, &str)],
        taints: Vec<Taint>,
    ) -> Arc<Node> {
        Arc::new(
            fixtures::node(name)
                .with_labels(labels)
                .unschedulable_is(cordoned)
                .taints(taints)
                .ready_is(ready),
        )
    }

    fn pod(selector: &[(&str, &str)], tolerations: Vec<Toleration>) -> Pod {
        fixtures::pod("p")
            .node_selector(selector)
            .tolerate(tolerations)
    }

    #[test]
    fn picks_the_least_loaded_node_that_fits() {
        let nodes = vec![
            node("a", false, true, &[], vec![]),
            node("b", false, true, &[], vec![]),
            node("c", true, true, &[], vec![]),
            node("d", false, false, &[], vec![]),
        ];
        let load: HashMap<String, usize> = [("a".to_string(), 2), ("b".to_string(), 1)].into();
        assert_eq!(
            pick_node(&pod(&[], vec![]), &nodes, &load),
            Some("b"),
            "c is cordoned, d not ready"
        );
        let even: HashMap<String, usize> = HashMap::new();
        assert_eq!(
            pick_node(&pod(&[], vec![]), &nodes, &even),
            Some("a"),
            "ties by name"
        );
    }

    #[test]
    fn a_node_at_its_allocatable_pods_takes_no_more() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let full = |name: &str, pods: &str| {
            let mut n = (*node(name, false, true, &[], vec![])).clone();
            let status = n.status.get_or_insert_with(Default::default);
            status.allocatable = Some([("pods".to_string(), Quantity(pods.into()))].into());
            Arc::new(n)
        };
        let nodes = vec![full("a", "2"), full("b", "3")];
        let load: HashMap<String, usize> = [("a".to_string(), 1), ("b".to_string(), 3)].into();
        assert_eq!(pick_node(&pod(&[], vec![]), &nodes, &load), Some("a"));
        let load: HashMap<String, usize> = [("a".to_string(), 2), ("b".to_string(), 3)].into();
        assert_eq!(
            pick_node(&pod(&[], vec![]), &nodes, &load),
            None,
            "both nodes hold their allocatable pods: the pod stays Pending"
        );
    }

    #[test]
    fn node_selector_and_taints_are_respected() {
        let taint = Taint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let nodes = vec![
            node("a", false, true, &[("disk", "ssd")], vec![taint]),
            node("b", false, true, &[], vec![]),
        ];
        let load = HashMap::new();
        assert_eq!(
            pick_node(&pod(&[("disk", "ssd")], vec![]), &nodes, &load),
            None,
            "the only ssd node is tainted"
        );
        let tolerate = Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("db".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        };
        assert_eq!(
            pick_node(&pod(&[("disk", "ssd")], vec![tolerate]), &nodes, &load),
            Some("a")
        );
        let exists = Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        };
        assert!(fits(&pod(&[], vec![exists]), &nodes[0]));
    }
}
