//! Rust types for `lifecycle.graceful-drain.io/v1alpha1`, field for field with docs/design.md §3.
//! Both kinds are cluster-scoped.

use k8s_openapi::api::core::v1::NodeSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A kind of node lifecycle change a driver offers (for example a drain), the Node
/// condition reasons that mark its start and end, and the nodes it applies to.
/// Exactly one of `nodeName`, `nodeSelector` or `allNodes` is set.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lifecycle.graceful-drain.io",
    version = "v1alpha1",
    kind = "LifecycleTransition",
    plural = "lifecycletransitions",
    singular = "lifecycletransition"
)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleTransitionSpec {
    /// Node condition reason while the transition runs.
    pub start: String,
    /// Node condition reason once the transition completed.
    pub end: String,
    /// The one node this transition applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Nodes this transition applies to (a single term).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    /// The transition applies to every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    /// How long a claimed event may run before it expires (a duration such as `5m0s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla: Option<String>,
    /// Name of the driver (registered kubelet plugin) that implements the transition.
    pub driver: String,
}

/// A request to run one transition on one node.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "lifecycle.graceful-drain.io",
    version = "v1alpha1",
    kind = "LifecycleEvent",
    plural = "lifecycleevents",
    singular = "lifecycleevent",
    status = "LifecycleEventStatus",
    printcolumn = r#"{"name":"Transition","type":"string","jsonPath":".spec.transitionName"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.bindingNode"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.claimStatus"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleEventSpec {
    /// The LifecycleTransition to run (immutable).
    pub transition_name: String,
    /// The node to run it on (immutable).
    pub binding_node: String,
}

/// Progress of a LifecycleEvent, written by the claimer through the status subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleEventStatus {
    /// Where the event is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_status: Option<ClaimStatus>,
    /// The driver that claimed the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// RFC3339 deadline after which the claimed event expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla: Option<String>,
}

/// The claim status values of docs/design.md §3.
// The variants are described with `//`, not `///`: schemars turns variant docs into a
// `oneOf` of described constants, which would change the committed CRDs' plain `enum`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ClaimStatus {
    // Not claimed yet (set on create; an event without status reads as it).
    Pending,
    // A reconciler claimed it (finalizer, driver and SLA deadline written) and drives it.
    Claimed,
    // The driver answered with an error, or the transition was deleted. Terminal.
    Failed,
    // The SLA deadline passed before the Node showed the end reason. Terminal.
    SlaExpired,
    // The Node shows the transition's end reason. Terminal.
    Succeeded,
}

impl ClaimStatus {
    /// Whether the event is finished (it will be deleted).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Failed | Self::SlaExpired | Self::Succeeded)
    }
}

impl std::fmt::Display for ClaimStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Self::Pending => "Pending",
            Self::Claimed => "Claimed",
            Self::Failed => "Failed",
            Self::SlaExpired => "SlaExpired",
            Self::Succeeded => "Succeeded",
        };
        f.write_str(s)
    }
}
