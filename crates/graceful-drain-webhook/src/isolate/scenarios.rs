//! What the API server does while the webhook isolates a pod of namespace `web`, named in
//! API terms for the scripted mock ([`mock::play`]): the isolation's tests and the admission
//! server's tests play these instead of listing requests one by one.

use graceful_drain_testing::fixtures::mock::{self, Step};
use http::Method;
use serde_json::{Value, json};

const PODS: &str = "/api/v1/namespaces/web/pods";
const EVENTS: &str = "/api/v1/namespaces/web/events";
const PDB: &str = "/apis/policy/v1/namespaces/web/poddisruptionbudgets/web";
const REPLICASETS: &str = "/apis/apps/v1/namespaces/web/replicasets";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/web/deployments";
const STATEFULSETS: &str = "/apis/apps/v1/namespaces/web/statefulsets";

/// One thing the API server does, in the order the webhook asks for it.
#[derive(Debug)]
pub(crate) enum Scenario {
    /// The `GET` of the pod answers this pod (it names itself, in namespace `web`).
    PodIs(Value),
    /// The `GET` of a Node answers this Node (it names itself).
    NodeIs(Value),
    /// The `GET` of pod `web/<name>` answers 404: no such pod.
    PodMissing(&'static str),
    /// The `GET` of the ReplicaSet answers this ReplicaSet (it names itself).
    ReplicaSetIs(Value),
    /// The `LIST` of pods in namespace `web` answers these pods.
    PodsListed(Vec<Value>),
    /// The `GET` of the Deployment answers this Deployment (it names itself).
    DeploymentIs(Value),
    /// The `GET` of the StatefulSet answers this StatefulSet (it names itself).
    StatefulSetIs(Value),
    /// The `GET` of PDB `web/web` answers this budget.
    PdbIs(Value),
    /// The `PUT` of PDB `web/web`'s status charging a disruption is accepted; the answer is
    /// the budget written.
    PdbCharged(Value),
    /// The `PUT` of PDB `web/web`'s status giving a disruption back is accepted; the answer
    /// is the budget written.
    PdbRefunded(Value),
    /// The `PUT` of PDB `web/web`'s status conflicts (409): the budget changed since it was read.
    PdbChargeConflicts,
    /// The relabel `PATCH` of pod `web/<name>` is accepted.
    Relabeled(&'static str),
    /// The relabel `PATCH` of `web/web-1` is refused for good by RBAC (403).
    RelabelForbidden,
    /// The relabel `PATCH` of `web/web-1` is invalid (422): a `test` op failed, or a policy
    /// refused it.
    RelabelInvalid,
    /// The relabel `PATCH` of `web/web-1` conflicts (409): the pod changed since it was read.
    RelabelConflicts,
    /// An Event is posted in namespace `web`.
    EventPosted,
}

impl mock::Scenario for Scenario {
    fn steps(self) -> Vec<Step> {
        use Method as M;
        let step = match self {
            Scenario::PodIs(pod) => Step::new(M::GET, named(PODS, &pod), 200, pod),
            Scenario::NodeIs(node) => Step::new(M::GET, named("/api/v1/nodes", &node), 200, node),
            Scenario::PodMissing(name) => {
                Step::refused(M::GET, format!("{PODS}/{name}"), 404, "NotFound")
            }
            Scenario::ReplicaSetIs(rs) => Step::new(M::GET, named(REPLICASETS, &rs), 200, rs),
            Scenario::PodsListed(pods) => Step::new(
                M::GET,
                PODS,
                200,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}),
            ),
            Scenario::DeploymentIs(d) => Step::new(M::GET, named(DEPLOYMENTS, &d), 200, d),
            Scenario::StatefulSetIs(s) => Step::new(M::GET, named(STATEFULSETS, &s), 200, s),
            Scenario::PdbIs(pdb) => Step::new(M::GET, PDB, 200, pdb),
            Scenario::PdbCharged(pdb) | Scenario::PdbRefunded(pdb) => {
                Step::new(M::PUT, format!("{PDB}/status"), 200, pdb)
            }
            Scenario::PdbChargeConflicts => {
                Step::refused(M::PUT, format!("{PDB}/status"), 409, "Conflict")
            }
            Scenario::Relabeled(pod) => {
                Step::new(M::PATCH, format!("{PODS}/{pod}"), 200, json!({}))
            }
            Scenario::RelabelForbidden => relabel_refused(403, "Forbidden"),
            Scenario::RelabelInvalid => relabel_refused(422, "Invalid"),
            Scenario::RelabelConflicts => relabel_refused(409, "Conflict"),
            Scenario::EventPosted => Step::new(M::POST, EVENTS, 201, json!({})),
        };
        vec![step]
    }
}

/// The path of `object` in the collection at `collection`.
fn named(collection: &str, object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().expect("a named object");
    format!("{collection}/{name}")
}

fn relabel_refused(code: u16, reason: &str) -> Step {
    Step::refused(Method::PATCH, format!("{PODS}/web-1"), code, reason)
}
