//! The errors of isolating a pod, and the helpers that build and classify them from the
//! API server's answers.

use crate::decide::PodFacts;

/// Errors while isolating a pod.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pod changed under us (a `test` op failed or the resourceVersion moved). `code`
    /// is the answer (409 or 422); a 422 may also be a real validation error, which the
    /// caller tells apart by re-reading the pod.
    #[error("isolate pod {pod}: changed concurrently (HTTP {code})")]
    Conflict {
        /// The pod, as `namespace/name`.
        pod: String,
        /// The API server's status code: 409 or 422, or 404 when the pod is gone.
        code: u16,
    },
    /// An API call failed.
    #[error("isolate pod {pod}: {action}")]
    Api {
        /// The pod, as `namespace/name`.
        pod: String,
        /// What was being done, such as `patch pod`.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The PDB kept changing under us.
    #[error("isolate pod {pod}: PDB {pdb} kept conflicting after {attempts} attempts")]
    PdbContention {
        /// The pod, as `namespace/name`.
        pod: String,
        /// The PDB, as `namespace/name`.
        pdb: String,
        /// How many status updates met a conflict before giving up.
        attempts: usize,
    },
    /// A selecting Service selects only labels of the pod's StatefulSet or DaemonSet: the
    /// pod cannot leave the Service without being released from its controller.
    #[error(
        "isolate pod {pod}: Service {service} selects only labels of its {owner}, so the pod \
         cannot leave the Service without being released from the {owner}; give the \
         Service a selector label of its own (in the pod template too)"
    )]
    ControllerSelector {
        /// The pod, as `namespace/name`.
        pod: String,
        /// The controller, as `Kind name` (e.g. `StatefulSet db`).
        owner: String,
        /// The Service's name, in the pod's namespace.
        service: String,
    },
    /// The pod's Deployment rolls out with the Recreate strategy, which promises that old
    /// and new pods never run together: an isolated pod is invisible to the Deployment
    /// controller (`getPodMapForDeployment` finds pods by their ReplicaSet), which would
    /// start the new pods while it still serves.
    #[error(
        "isolate pod {pod}: Deployment {deployment} uses the Recreate strategy, whose old \
         pods must be gone before new ones start; graceful-drain does not hold them"
    )]
    Recreate {
        /// The pod, as `namespace/name`.
        pod: String,
        /// The Deployment, as `namespace/name`.
        deployment: String,
    },
}

impl Error {
    /// The HTTP status the API server answered, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }

    /// A failure that retrying the same request cannot cure: missing RBAC (403), a
    /// request the API server or another admission webhook or policy engine refuses (400,
    /// 422 other than our own `test` op failing, any other 4xx but 408/409/429). Such an
    /// eviction must not be answered 429 forever; it is let through with a Warning Event.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Error::ControllerSelector { .. } | Error::Recreate { .. }
        ) || self
            .code()
            .is_some_and(|c| (400..500).contains(&c) && !matches!(c, 404 | 408 | 409 | 429))
    }

    /// Bounded metric label for a permanent failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::ControllerSelector { .. } => return "controller_selector",
            Error::Recreate { .. } => return "recreate",
            _ => {}
        }
        match self.code() {
            Some(400) => "bad_request",
            Some(401) => "unauthorized",
            Some(403) => "forbidden",
            Some(422) => "invalid",
            Some(_) => "rejected",
            None => "unavailable",
        }
    }
}

pub(crate) fn is_status(err: &kube::Error, codes: &[u16]) -> bool {
    matches!(err, kube::Error::Api(s) if codes.contains(&s.code))
}

/// A refusal that says nothing about the request: throttled (429), a server error or
/// timeout (5xx), or no answer at all (a transport error).
pub(super) fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

pub(super) fn pod_ref(pod: &PodFacts) -> String {
    format!("{}/{}", pod.namespace, pod.name)
}

pub(super) fn api_err(pod: &PodFacts, action: &str, source: kube::Error) -> Error {
    Error::Api {
        pod: pod_ref(pod),
        action: action.to_string(),
        source,
    }
}
