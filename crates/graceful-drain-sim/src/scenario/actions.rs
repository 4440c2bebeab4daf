//! The disruptions a scenario applies: a plain drain (cordon, then evict every pod on
//! the node like `kubectl drain`, retrying refusals), a drain through a LifecycleEvent
//! (what graceful-drain users do), and a rollout (`kubectl rollout restart`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

use super::Error;
use graceful_drain_core::lifecycle::{
    ClaimStatus, DRAIN_COMPLETE, DRAIN_TRANSITION, LifecycleEvent, LifecycleEventSpec,
    TRANSITION_CONDITION,
};
use kube_sim::cluster::{WebSpec, wait_for};
use kube_sim::controllers::deployment::POD_TEMPLATE_HASH;

/// Pause between eviction attempts refused with 429. kubectl waits 5 s; the simulated
/// runs last seconds, so a second keeps the same shape at a tenth of the time.
const EVICTION_RETRY: Duration = Duration::from_secs(1);
/// Polling period while waiting for pods to go (kubectl polls every second).
const POLL: Duration = Duration::from_millis(100);

fn api(action: &'static str, object: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let object = object.into();
    move |source| Error::Api {
        action,
        object,
        source,
    }
}

/// Marks `node` unschedulable, as `kubectl cordon` does.
pub async fn cordon(client: &kube::Client, node: &str, on: bool) -> Result<(), Error> {
    let patch = serde_json::json!({"spec": {"unschedulable": on}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map_err(api("cordon", format!("node {node}")))?;
    Ok(())
}

/// The pods on `node` a drain evicts (not finished, not mirror or DaemonSet pods).
pub async fn pods_on(client: &kube::Client, node: &str) -> Result<Vec<Pod>, Error> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(api("list pods on", format!("node {node}")))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| !kube_sim::controllers::pod_finished(p))
        .filter(|p| {
            !p.annotations()
                .contains_key(graceful_drain_core::labels::MIRROR_POD_ANNOTATION)
        })
        .filter(|p| kube_sim::controllers::controller_of(p).is_none_or(|o| o.kind != "DaemonSet"))
        .collect())
}

/// Evicts one pod (UID precondition), retrying 429 until `deadline`.
async fn evict(client: &kube::Client, pod: &Pod, deadline: Instant) -> Result<(), Error> {
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let uid = pod.uid().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let body = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns},
        "deleteOptions": {"preconditions": {"uid": uid}},
    });
    loop {
        match pods
            .create_subresource::<_, serde_json::Value>(
                "eviction",
                &name,
                &PostParams::default(),
                &body,
            )
            .await
        {
            Ok(_) => return Ok(()),
            // Gone, or replaced by a same-name pod: nothing of ours left to evict.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 429 && Instant::now() < deadline => {
                tracing::debug!(pod = %format!("{ns}/{name}"), reason = %s.message, "eviction refused; retrying");
                tokio::time::sleep(EVICTION_RETRY).await;
            }
            Err(e) => return Err(api("evict", format!("pod {ns}/{name}"))(e)),
        }
    }
}

/// Waits until none of `uids` is on `node` any more (one list per poll, however many
/// pods are waited for).
async fn wait_gone(
    client: &kube::Client,
    node: &str,
    uids: BTreeSet<String>,
    deadline: Instant,
) -> Result<(), Error> {
    let what = format!("evicted pods to leave node {node}");
    wait_for(
        &what,
        deadline.saturating_duration_since(Instant::now()),
        || async {
            match pods_on(client, node).await {
                Ok(pods) => pods
                    .iter()
                    .all(|p| p.uid().is_none_or(|u| !uids.contains(&u))),
                Err(_) => false,
            }
        },
    )
    .await
    .map_err(Error::Cluster)
}

/// Drains `node` without graceful-drain: cordon, then evict every pod concurrently
/// (retrying refusals) and wait until each is gone.
pub async fn plain_drain(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    cordon(client, node, true).await?;
    let pods = pods_on(client, node).await?;
    let results = futures::future::join_all(pods.iter().map(|p| evict(client, p, deadline))).await;
    results.into_iter().collect::<Result<(), Error>>()?;
    wait_gone(
        client,
        node,
        pods.iter().filter_map(|p| p.uid()).collect(),
        deadline,
    )
    .await
}

/// Drains `node` through a LifecycleEvent of the drain transition and waits until the
/// node reports `drain-complete` (the agent's end reason).
pub async fn lifecycle_drain(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let transition = (DRAIN_TRANSITION, DRAIN_COMPLETE, "drain");
    lifecycle_transition(client, node, transition, timeout).await
}

/// The LifecycleEvent users apply to drain a node (`deploy/examples/drain-event.yaml`).
pub const DRAIN_EXAMPLE: &str = include_str!("../../../../deploy/examples/drain-event.yaml");

/// The API version of our LifecycleEvents.
pub const OUR_EVENTS: &str = "lifecycle.graceful-drain.io/v1alpha1";
/// The API version of LifecycleEvents in the seed group (chart value
/// `lifecycleCrds.seedGroup`), which the node agents carry over to ours.
pub const SEED_EVENTS: &str = "lifecycle.k8s.io/v1alpha1";

/// Drains `node` as the README tells users to: `kubectl apply -f` of the example
/// LifecycleEvent with its node and name set (and written in `api_version`: [`OUR_EVENTS`]
/// or [`SEED_EVENTS`]), through the `kubectl` on `PATH`, then waits until the node reports
/// `drain-complete`.
pub async fn kubectl_apply_drain(
    kubeconfig: &std::path::Path,
    client: &kube::Client,
    node: &str,
    api_version: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let name = format!("{node}-drain");
    let yaml =
        example_for(DRAIN_EXAMPLE, api_version, node, &name).map_err(|reason| Error::Drain {
            node: node.into(),
            reason,
        })?;
    kubectl_apply(kubeconfig, &yaml)
        .await
        .map_err(|reason| Error::Drain {
            node: node.into(),
            reason,
        })?;
    // A seed-group event is driven through its mirror of the same name in our group.
    await_transition(client, node, &name, DRAIN_COMPLETE, timeout).await
}

/// `kubectl drain` of `node` as users run it (the kubectl on PATH: client-go's REST client
/// waits out a 429's `Retry-After` and retries by itself, then kubectl retries every 5 s
/// and polls each evicted pod once a second until it is gone), within `timeout`.
pub async fn kubectl_drain(
    kubeconfig: &std::path::Path,
    node: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let failed = |reason: String| Error::Drain {
        node: node.into(),
        reason,
    };
    let kubectl = kube_control_plane::kubectl().ok_or_else(|| {
        failed(format!(
            "no kubectl ({})",
            kube_control_plane::KUBECTL_WHERE
        ))
    })?;
    let out = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
        ])
        .arg(format!("--timeout={}s", timeout.as_secs().max(1)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| failed(format!("run kubectl (needed on PATH for this row): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(format!(
            "kubectl drain failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The example LifecycleEvent `yaml` (which names `worker-1`) for `node`, named `name`, in
/// `api_version`.
fn example_for(yaml: &str, api_version: &str, node: &str, name: &str) -> Result<String, String> {
    let mut event: serde_json::Value = serde_saphyr::from_str(yaml)
        .map_err(|e| format!("deploy/examples/drain-event.yaml is not YAML: {e}"))?;
    if !event.is_object() || !event["metadata"].is_object() || !event["spec"].is_object() {
        return Err("deploy/examples/drain-event.yaml is not one LifecycleEvent".into());
    }
    event["apiVersion"] = api_version.into();
    event["metadata"]["name"] = name.into();
    event["spec"]["bindingNode"] = node.into();
    serde_json::to_string(&event).map_err(|e| format!("encode the LifecycleEvent: {e}"))
}

/// `kubectl --kubeconfig <kubeconfig> apply -f -` of `manifest`.
pub(super) async fn kubectl_apply(
    kubeconfig: &std::path::Path,
    manifest: &str,
) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let kubectl = kube_control_plane::kubectl()
        .ok_or_else(|| format!("no kubectl ({})", kube_control_plane::KUBECTL_WHERE))?;
    let mut child = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("run kubectl: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("kubectl: no stdin")?;
    stdin
        .write_all(manifest.as_bytes())
        .await
        .map_err(|e| format!("kubectl apply: write the manifest: {e}"))?;
    drop(stdin);
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("kubectl apply: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "kubectl apply failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Returns `node` to service through a LifecycleEvent of the maintenance-complete
/// transition and waits until the node reports `maintenance-complete`.
pub async fn lifecycle_uncordon(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let transition = (
        graceful_drain_core::lifecycle::MAINTENANCE_TRANSITION,
        graceful_drain_core::lifecycle::MAINTENANCE_COMPLETE,
        "uncordon",
    );
    lifecycle_transition(client, node, transition, timeout).await
}

/// Creates a LifecycleEvent (named `<prefix>-<node>-…`) of `transition` for `node` and
/// waits until the node's transition condition says `end`.
async fn lifecycle_transition(
    client: &kube::Client,
    node: &str,
    (transition, end, prefix): (&str, &str, &str),
    timeout: Duration,
) -> Result<(), Error> {
    let events: Api<LifecycleEvent> = Api::all(client.clone());
    let mut event = LifecycleEvent::new(
        "",
        LifecycleEventSpec {
            transition_name: transition.into(),
            binding_node: node.into(),
        },
    );
    event.metadata.name = None;
    event.metadata.generate_name = Some(format!("{prefix}-{node}-"));
    let created = events
        .create(&PostParams::default(), &event)
        .await
        .map_err(api("create lifecycleevent for", format!("node {node}")))?;
    await_transition(client, node, &created.name_any(), end, timeout).await
}

/// Waits until LifecycleEvent `name` has brought `node`'s transition condition to `end`;
/// an event that ends Failed or SlaExpired is the error.
async fn await_transition(
    client: &kube::Client,
    node: &str,
    name: &str,
    end: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let events: Api<LifecycleEvent> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(e)) = events.get_opt(name).await {
            let status = e.status.as_ref().and_then(|s| s.claim_status);
            if matches!(status, Some(ClaimStatus::Failed | ClaimStatus::SlaExpired)) {
                return Err(Error::Drain {
                    node: node.into(),
                    reason: format!("lifecycleevent {name} ended {status:?}"),
                });
            }
        }
        let reason = nodes.get(node).await.ok().and_then(|n| {
            n.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == TRANSITION_CONDITION)
                .and_then(|c| c.reason)
        });
        // Only the reason this event's transition ends with (a drain's
        // `drain-complete` stays on the node until the uncordon replaces it).
        if reason.as_deref() == Some(end) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Drain {
                node: node.into(),
                reason: format!(
                    "lifecycleevent {name} not complete after {timeout:?} (node condition reason {reason:?})"
                ),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How many of `pods` are ready and not terminating.
pub fn ready_live(pods: &[Pod]) -> usize {
    pods.iter()
        .filter(|p| kube_sim::controllers::pod_ready(p) && p.metadata.deletion_timestamp.is_none())
        .count()
}

/// `kubectl rollout restart`, then waits as `kubectl rollout status` does and until every
/// pod of the namespace belongs to a ReplicaSet the rollout made, all ready (isolated pods
/// lose the Deployment's labels, so the namespace's pods are what tells the rollout is
/// over). The new template's hash is not computed here: the simulator's and the real
/// controller's hashes differ, so a pod is new when its hash was not there before.
pub async fn rollout(
    client: &kube::Client,
    spec: &WebSpec,
    timeout: Duration,
) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &spec.namespace);
    let before: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await
        .map_err(api("list pods in", format!("namespace {}", spec.namespace)))?
        .items
        .iter()
        .filter_map(|p| p.labels().get(POD_TEMPLATE_HASH).cloned())
        .collect();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &spec.namespace);
    let now = jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": now}}}}});
    let object = format!("deployment {}", spec.service_key());
    deployments
        .patch(
            &spec.name,
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
        .map_err(api("restart", object.clone()))?;
    let replicas = usize::try_from(spec.replicas).unwrap_or(0);
    let what = format!("rollout restart of {object}");
    wait_for(&what, timeout, || async {
        let complete = deployments
            .get(&spec.name)
            .await
            .ok()
            .is_some_and(|d| rolled_out(&d, spec.replicas));
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return false;
        };
        let hashes: BTreeSet<Option<&String>> = list
            .items
            .iter()
            .map(|p| p.labels().get(POD_TEMPLATE_HASH))
            .collect();
        let ready = ready_live(&list.items);
        complete
            && hashes.len() == 1
            && hashes
                .iter()
                .all(|h| h.is_some_and(|h| !before.contains(h)))
            && list.items.len() == replicas
            && ready == replicas
    })
    .await
    .map_err(Error::Cluster)
}

/// Whether a Deployment's status says its rollout to `replicas` is over, as `kubectl
/// rollout status` reads it (observedGeneration caught up; every replica updated and
/// available; no old replica left).
pub fn rolled_out(d: &Deployment, replicas: i32) -> bool {
    let Some(status) = d.status.as_ref() else {
        return false;
    };
    status.observed_generation >= d.metadata.generation
        && status.updated_replicas == Some(replicas)
        && status.replicas == Some(replicas)
        && status.available_replicas == Some(replicas)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example users apply is a LifecycleEvent of our group and drain transition;
    /// the row's copy names the drained node instead of `worker-1`.
    #[test]
    fn the_drain_example_is_set_to_the_drained_node() {
        let json = example_for(DRAIN_EXAMPLE, OUR_EVENTS, "worker-3", "worker-3-drain").unwrap();
        let event: LifecycleEvent = serde_json::from_str(&json).unwrap();
        assert_eq!(event.metadata.name.as_deref(), Some("worker-3-drain"));
        assert_eq!(event.spec.binding_node, "worker-3");
        assert_eq!(event.spec.transition_name, DRAIN_TRANSITION);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["apiVersion"], "lifecycle.graceful-drain.io/v1alpha1");
        let seed = example_for(DRAIN_EXAMPLE, SEED_EVENTS, "worker-3", "worker-3-drain").unwrap();
        let value: serde_json::Value = serde_json::from_str(&seed).unwrap();
        assert_eq!(value["apiVersion"], "lifecycle.k8s.io/v1alpha1");
        assert!(example_for("- not: [an object", OUR_EVENTS, "n", "n").is_err());
        assert!(example_for("- a list\n- of two", OUR_EVENTS, "n", "n").is_err());
    }
}
