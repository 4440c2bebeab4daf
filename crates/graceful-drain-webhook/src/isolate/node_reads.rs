//! What this replica remembers of nodes' drains: each node is read at most once per
//! [`NODE_READ_TTL`], however many reviews of its pods arrive (a `kubectl drain` sends
//! every eviction of a node at once; a forger can send thousands), and concurrent reviews
//! of one node's pods wait for one read instead of each making its own
//! ([`crate::recent::Recent`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::NodeDrain;
use crate::recent::Recent;

/// How long one read of a node answers for the reviews after it. A drain that starts is
/// seen at most this late (its evictions meanwhile count as unconfirmed and are bounded,
/// or retried); one that ends is believed at most this long after.
pub const NODE_READ_TTL: Duration = Duration::from_secs(1);

/// Nodes remembered at once; past it the entries nobody is reading are forgotten. The
/// names come from live pods' `spec.nodeName`, never from a review, so only a cluster's
/// own nodes fill it.
const MAX_NODES: usize = 16_384;

/// Recent reads of nodes, by name (see the module's documentation).
#[derive(Debug)]
pub struct NodeReads(Recent<NodeDrain>);

impl Default for NodeReads {
    fn default() -> NodeReads {
        NodeReads(Recent::new(NODE_READ_TTL, MAX_NODES))
    }
}

impl NodeReads {
    /// What node `name` says about a drain, read live at most once per
    /// [`NODE_READ_TTL`]. A missing node is not draining; a failed read counts it as not
    /// drained (logged) and is not remembered.
    pub async fn drain(&self, client: &kube::Client, name: &str) -> NodeDrain {
        let read = || async {
            let node = Api::<Node>::all(client.clone()).get_opt(name).await?;
            Ok::<_, kube::Error>(node.as_ref().map_or(NodeDrain::No, super::drain_of))
        };
        self.0.get(name, read).await.unwrap_or_else(|error| {
            tracing::warn!(node = %name, error = %graceful_drain_core::error::chain(&error), "read node; counting it as not drained");
            NodeDrain::No
        })
    }
}
