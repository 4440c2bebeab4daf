//! The live reads of pods' controllers that reviews share (see [`crate::recent`]): a
//! forger's DELETEs claiming a controller, or evictions of a due pod, cannot multiply them.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};

use super::Member;
use crate::recent::Recent;

/// How long one live read of a controller (and of its pods) answers for the DELETE
/// reviews after it. A forger's reviews claiming a controller cost at most one read of it
/// per this time and replica; a controller's own burst of DELETEs is unaffected, since
/// every isolation made here forgets the reads of its pod's controller.
pub const CONTROLLER_READ_TTL: Duration = Duration::from_secs(1);

/// Controllers remembered at once (keys are `namespace/name` of controllers named by live
/// pods' controller references, never by a review alone).
const MAX_CONTROLLERS: usize = 1024;

/// The live reads of pods' controllers that reviews share (see [`crate::recent`]), keyed
/// `namespace/name`.
#[derive(Debug)]
pub struct ControllerReads {
    /// Why a ReplicaSet has no pod to spare (`None`: it has one), from the ReplicaSet
    /// and its pods.
    pub(super) surplus: Recent<Option<String>>,
    pub(super) statefulsets: Recent<Option<Arc<StatefulSet>>>,
    /// A StatefulSet's live members.
    pub(super) members: Recent<Arc<Vec<Member>>>,
    pub(super) daemonsets: Recent<Option<Arc<DaemonSet>>>,
    /// The ReplicaSet of a due pod on a cordoned node.
    pub(super) replicasets: Recent<Option<Arc<ReplicaSet>>>,
}

impl Default for ControllerReads {
    fn default() -> ControllerReads {
        ControllerReads {
            surplus: Recent::new(CONTROLLER_READ_TTL, MAX_CONTROLLERS),
            statefulsets: Recent::new(CONTROLLER_READ_TTL, MAX_CONTROLLERS),
            members: Recent::new(CONTROLLER_READ_TTL, MAX_CONTROLLERS),
            daemonsets: Recent::new(CONTROLLER_READ_TTL, MAX_CONTROLLERS),
            replicasets: Recent::new(CONTROLLER_READ_TTL, MAX_CONTROLLERS),
        }
    }
}

impl ControllerReads {
    /// Forgets what was read of controller `namespace/name` and its pods: one of them was
    /// just isolated here, and the next review must count it.
    pub(in crate::admission) fn isolated_one_of(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        self.surplus.forget(&key);
        self.members.forget(&key);
    }
}
