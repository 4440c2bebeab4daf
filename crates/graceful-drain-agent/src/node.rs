//! Everything the agent writes on its Node: the cordon, the
//! `exclude-from-external-load-balancers` label, and the `DrainInProgress` / `Drained`
//! conditions (KEP-5683 names) whose message is the machine- and human-readable drain
//! progress the CLI shows.
//!
//! Patch bodies are built by pure functions (tested for their exact shape); the async
//! wrappers send them with a bounded timeout. Spec and labels use a JSON merge patch;
//! conditions use a strategic-merge patch on `nodes/status`, keyed by condition `type`, so
//! the kubelet's and the lifecycle reconciler's conditions are left alone.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use graceful_drain_core::labels::{
    DRAIN_EVENT_ANNOTATION, EXCLUDE_FROM_LB_LABEL, EXCLUDE_FROM_LB_OWNED_ANNOTATION, FIELD_MANAGER,
};

pub use graceful_drain_core::labels::node_condition::{DRAIN_IN_PROGRESS, DRAINED, reason};

/// Every API call we await is bounded by this, so a hung API server never hangs a drain
/// step forever; 30 s is the API server's own default request timeout for most verbs.
pub const API_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors while reading or patching the Node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed the call.
    #[error("{action} node {node}")]
    Api {
        /// The call, as a verb for the message (`get`, `cordon`, `set conditions on`).
        action: &'static str,
        /// The Node's name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The call did not finish within [`API_TIMEOUT`].
    #[error("{action} node {node}: timed out after {API_TIMEOUT:?}")]
    Timeout {
        /// The call, as a verb for the message (`get`, `cordon`, `set conditions on`).
        action: &'static str,
        /// The Node's name.
        node: String,
    },
    /// The node read back after an uncordon is still unschedulable.
    #[error("node {node} is still unschedulable after uncordon")]
    StillCordoned {
        /// The Node's name.
        node: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A condition we want on the Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// The condition type, [`DRAIN_IN_PROGRESS`] or [`DRAINED`].
    pub type_: &'static str,
    /// Written as `"True"` or `"False"`.
    pub status: bool,
    /// One of the [`reason`] constants.
    pub reason: &'static str,
    /// For people and the CLI: the drain's progress or why it stopped.
    pub message: String,
}

/// The condition of `type_` on `node`, if present.
pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
}

/// Whether the condition `type_` is `True` on `node`.
pub fn condition_is_true(node: &Node, type_: &str) -> bool {
    condition(node, type_).is_some_and(|c| c.status == "True")
}

/// Whether the node is cordoned.
pub fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Whether a restarted agent must resume a drain: the node is cordoned and says a drain
/// is in progress.
pub fn drain_was_running(node: &Node) -> bool {
    is_cordoned(node) && condition_is_true(node, DRAIN_IN_PROGRESS)
}

fn has_label(node: &Node, key: &str) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(key))
}

fn has_annotation(node: &Node, key: &str) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// The LifecycleEvent whose drain the node's annotation names, if any.
pub fn drain_event(node: &Node) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()?
        .get(DRAIN_EVENT_ANNOTATION)
        .filter(|name| !name.is_empty())
        .cloned()
}

/// Merge patch cordoning `node` and, with `exclude_from_lb`, adding the
/// exclude-from-external-load-balancers label. When the label was not there before, an
/// annotation records that we added it, so uncordoning removes only what we added. The
/// drain's LifecycleEvent (if known) is recorded too, for a restarted agent.
pub fn cordon_patch(node: &Node, exclude_from_lb: bool, event: Option<&str>) -> Value {
    let mut patch = json!({ "spec": { "unschedulable": true } });
    if exclude_from_lb && !has_label(node, EXCLUDE_FROM_LB_LABEL) {
        patch["metadata"] = json!({
            "labels": { EXCLUDE_FROM_LB_LABEL: "true" },
            "annotations": { EXCLUDE_FROM_LB_OWNED_ANNOTATION: "true" },
        });
    }
    // A stale name from an earlier drain never outlives the drain that replaced it.
    if event.is_some() || has_annotation(node, DRAIN_EVENT_ANNOTATION) {
        patch["metadata"]["annotations"][DRAIN_EVENT_ANNOTATION] = json!(event);
    }
    patch
}

/// Merge patch of a drain that stopped without completing: the cordon stays (as
/// `kubectl drain` leaves it), but the load balancers get the node back — the
/// exclude-from-external-load-balancers label goes if we added it — and the event name is
/// cleared. `None` when there is nothing to undo.
pub fn release_patch(node: &Node) -> Option<Value> {
    let ours = has_annotation(node, EXCLUDE_FROM_LB_OWNED_ANNOTATION);
    let named = has_annotation(node, DRAIN_EVENT_ANNOTATION);
    if !ours && !named {
        return None;
    }
    let mut patch = json!({ "metadata": { "annotations": { DRAIN_EVENT_ANNOTATION: null } } });
    if ours {
        patch["metadata"]["labels"] = json!({ EXCLUDE_FROM_LB_LABEL: null });
        patch["metadata"]["annotations"][EXCLUDE_FROM_LB_OWNED_ANNOTATION] = Value::Null;
    }
    Some(patch)
}

/// Merge patch uncordoning `node` and removing the load-balancer label if we added it.
pub fn uncordon_patch(node: &Node) -> Value {
    let mut patch = json!({ "spec": { "unschedulable": false } });
    if has_annotation(node, EXCLUDE_FROM_LB_OWNED_ANNOTATION) {
        patch["metadata"] = json!({
            "labels": { EXCLUDE_FROM_LB_LABEL: null },
            "annotations": { EXCLUDE_FROM_LB_OWNED_ANNOTATION: null },
        });
    }
    if has_annotation(node, DRAIN_EVENT_ANNOTATION) {
        patch["metadata"]["annotations"][DRAIN_EVENT_ANNOTATION] = Value::Null;
    }
    patch
}

/// Strategic-merge patch of `nodes/status` setting `conditions`. `lastTransitionTime` moves
/// only when a condition's status changes; `lastHeartbeatTime` is always `now`.
pub fn conditions_patch(node: &Node, conditions: &[Condition], now: jiff::Timestamp) -> Value {
    let items: Vec<Value> = conditions
        .iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            let transition = condition(node, c.type_)
                .filter(|old| old.status == status)
                .and_then(|old| old.last_transition_time.as_ref())
                .map_or(now, |t| t.0);
            json!({
                "type": c.type_,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "lastHeartbeatTime": now.to_string(),
                "lastTransitionTime": transition.to_string(),
            })
        })
        .collect();
    json!({ "status": { "conditions": items } })
}

async fn bounded<T>(
    action: &'static str,
    node: &str,
    fut: impl Future<Output = kube::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(API_TIMEOUT, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(Error::Api {
            action,
            node: node.to_string(),
            source,
        }),
        Err(_) => Err(Error::Timeout {
            action,
            node: node.to_string(),
        }),
    }
}

/// Reads the Node.
pub async fn get(client: &kube::Client, name: &str) -> Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    bounded("get", name, api.get(name)).await
}

/// Cordons the node (and labels it, see [`cordon_patch`]); returns the patched Node.
pub async fn cordon(
    client: &kube::Client,
    node: &Node,
    exclude_from_lb: bool,
    event: Option<&str>,
) -> Result<Node> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Node> = Api::all(client.clone());
    let patch = Patch::Merge(cordon_patch(node, exclude_from_lb, event));
    bounded(
        "cordon",
        name,
        api.patch(name, &PatchParams::default(), &patch),
    )
    .await
}

/// Uncordons the node (see [`uncordon_patch`]); returns the patched Node.
pub async fn uncordon(client: &kube::Client, node: &Node) -> Result<Node> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Node> = Api::all(client.clone());
    let patch = Patch::Merge(uncordon_patch(node));
    bounded(
        "uncordon",
        name,
        api.patch(name, &PatchParams::default(), &patch),
    )
    .await
}

/// Undoes what a stopped drain left for the load balancers (see [`release_patch`]);
/// returns the Node, patched or not.
pub async fn release(client: &kube::Client, node: &Node) -> Result<Node> {
    let Some(patch) = release_patch(node) else {
        return Ok(node.clone());
    };
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Node> = Api::all(client.clone());
    let patch = Patch::Merge(patch);
    bounded(
        "release",
        name,
        api.patch(name, &PatchParams::default(), &patch),
    )
    .await
}

/// Patches the Node (`action` names the call in errors); returns the patched Node.
pub async fn patch(
    client: &kube::Client,
    name: &str,
    action: &'static str,
    patch: Patch<serde_json::Value>,
    params: PatchParams,
) -> Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    bounded(action, name, api.patch(name, &params, &patch)).await
}

/// Sets `conditions` on the node's status; returns the patched Node.
pub async fn set_conditions(
    client: &kube::Client,
    node: &Node,
    conditions: &[Condition],
) -> Result<Node> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Node> = Api::all(client.clone());
    let patch = Patch::Strategic(conditions_patch(node, conditions, jiff::Timestamp::now()));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    bounded(
        "set conditions on",
        name,
        api.patch_status(name, &params, &patch),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn node() -> Node {
        graceful_drain_testing::fixtures::node("n1")
    }

    #[test]
    fn cordon_adds_the_lb_label_and_remembers_it_was_ours() {
        let patch = cordon_patch(&node(), true, None);
        assert_eq!(
            patch,
            json!({
                "spec": {"unschedulable": true},
                "metadata": {
                    "labels": {EXCLUDE_FROM_LB_LABEL: "true"},
                    "annotations": {EXCLUDE_FROM_LB_OWNED_ANNOTATION: "true"},
                },
            })
        );
        assert_eq!(
            cordon_patch(&node(), false, None),
            json!({"spec": {"unschedulable": true}})
        );
    }

    #[test]
    fn a_label_set_by_the_operator_survives_cordon_and_uncordon() {
        let mut n = node();
        n.metadata.labels = Some([(EXCLUDE_FROM_LB_LABEL.to_string(), "true".to_string())].into());
        assert_eq!(
            cordon_patch(&n, true, None),
            json!({"spec": {"unschedulable": true}})
        );
        assert_eq!(
            uncordon_patch(&n),
            json!({"spec": {"unschedulable": false}})
        );
        n.metadata.annotations = Some(
            [(
                EXCLUDE_FROM_LB_OWNED_ANNOTATION.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            uncordon_patch(&n)["metadata"]["labels"][EXCLUDE_FROM_LB_LABEL],
            Value::Null
        );
        assert!(
            uncordon_patch(&n)["metadata"]["labels"]
                .as_object()
                .unwrap()
                .contains_key(EXCLUDE_FROM_LB_LABEL)
        );
    }

    #[test]
    fn the_drain_event_is_recorded_at_cordon_and_cleared_when_the_drain_stops() {
        let patch = cordon_patch(&node(), false, Some("drain-n1-abc"));
        assert_eq!(
            patch["metadata"]["annotations"][DRAIN_EVENT_ANNOTATION],
            "drain-n1-abc"
        );
        let mut n = node();
        n.metadata.annotations = Some(
            [
                (DRAIN_EVENT_ANNOTATION.to_string(), "old".to_string()),
                (
                    EXCLUDE_FROM_LB_OWNED_ANNOTATION.to_string(),
                    "true".to_string(),
                ),
            ]
            .into(),
        );
        n.metadata.labels = Some([(EXCLUDE_FROM_LB_LABEL.to_string(), "true".to_string())].into());
        assert_eq!(drain_event(&n).as_deref(), Some("old"));
        // A drain without an event name still clears the stale one.
        let annotations = &cordon_patch(&n, true, None)["metadata"]["annotations"];
        assert_eq!(annotations[DRAIN_EVENT_ANNOTATION], Value::Null);
        assert!(
            annotations
                .as_object()
                .unwrap()
                .contains_key(DRAIN_EVENT_ANNOTATION)
        );
        // A stopped drain gives the node back to the load balancers; the cordon stays.
        let release = release_patch(&n).unwrap();
        assert_eq!(
            release,
            json!({"metadata": {
                "labels": {EXCLUDE_FROM_LB_LABEL: null},
                "annotations": {DRAIN_EVENT_ANNOTATION: null, EXCLUDE_FROM_LB_OWNED_ANNOTATION: null},
            }})
        );
        assert!(release.get("spec").is_none(), "the cordon stays");
        // An operator's own label is never removed.
        n.metadata.annotations = None;
        assert_eq!(release_patch(&n), None);
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let earlier: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let now: jiff::Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let mut n = node();
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: DRAIN_IN_PROGRESS.into(),
                status: "True".into(),
                last_transition_time: Some(Time(earlier)),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        let cond = |status| Condition {
            type_: DRAIN_IN_PROGRESS,
            status,
            reason: reason::DRAINING,
            message: "2 pods remaining: 2 evicting".into(),
        };
        let same = conditions_patch(&n, &[cond(true)], now);
        let item = &same["status"]["conditions"][0];
        assert_eq!(item["lastTransitionTime"], earlier.to_string());
        assert_eq!(item["lastHeartbeatTime"], now.to_string());
        assert_eq!(item["type"], DRAIN_IN_PROGRESS);
        assert_eq!(item["message"], "2 pods remaining: 2 evicting");
        let flipped = conditions_patch(&n, &[cond(false)], now);
        assert_eq!(
            flipped["status"]["conditions"][0]["lastTransitionTime"],
            now.to_string()
        );
        assert_eq!(flipped["status"]["conditions"][0]["status"], "False");
    }

    #[test]
    fn resume_needs_cordon_and_drain_in_progress() {
        let mut n = node();
        assert!(!drain_was_running(&n));
        n.spec = Some(NodeSpec {
            unschedulable: Some(true),
            ..NodeSpec::default()
        });
        assert!(!drain_was_running(&n), "cordoned by hand, no drain");
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: DRAIN_IN_PROGRESS.into(),
                status: "True".into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        assert!(drain_was_running(&n));
    }
}

#[cfg(test)]
mod api_tests {
    use super::*;
    use Scenario::*;
    use graceful_drain_testing::fixtures::mock::{self, Step};
    use http::Method;

    /// What the API server does with Node `n1`.
    enum Scenario {
        /// The `PATCH` of the node is accepted; the answer is the node, cordoned.
        Cordoned,
        /// The `PATCH` of the node's status is accepted.
        ConditionsSet,
    }

    impl mock::Scenario for Scenario {
        fn steps(self) -> Vec<Step> {
            vec![match self {
                Cordoned => {
                    let node = json!({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
                    Step::new(Method::PATCH, "/api/v1/nodes/n1", 200, node)
                }
                ConditionsSet => {
                    let node = json!({"metadata": {"name": "n1"}});
                    Step::new(Method::PATCH, "/api/v1/nodes/n1/status", 200, node)
                }
            }]
        }
    }

    #[tokio::test]
    async fn cordon_is_a_merge_patch_of_spec_unschedulable() {
        let (client, mut api) = mock::client();
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        let call = tokio::spawn(async move { cordon(&client, &n, true, None).await });
        let [patch] = mock::play(&mut api, [Cordoned]).await.try_into().unwrap();
        assert_eq!(patch.content_type, "application/merge-patch+json");
        assert_eq!(patch.body["spec"], json!({"unschedulable": true}));
        assert_eq!(
            patch.body["metadata"]["labels"][EXCLUDE_FROM_LB_LABEL],
            "true"
        );
        assert!(is_cordoned(&call.await.unwrap().unwrap()));
    }

    #[tokio::test]
    async fn conditions_are_a_strategic_merge_patch_of_node_status() {
        let (client, mut api) = mock::client();
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        let cond = Condition {
            type_: DRAINED,
            status: true,
            reason: reason::DRAINED,
            message: "done".into(),
        };
        let call = tokio::spawn(async move { set_conditions(&client, &n, &[cond]).await });
        let [patch] = mock::play(&mut api, [ConditionsSet])
            .await
            .try_into()
            .unwrap();
        assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
        assert_eq!(patch.body["status"]["conditions"][0]["type"], "Drained");
        assert_eq!(patch.body["status"]["conditions"][0]["status"], "True");
        call.await.unwrap().unwrap();
    }
}
