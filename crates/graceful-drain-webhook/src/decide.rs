//! The admission decision: a pure function of one parsed request, the pod it is about and
//! a snapshot of what the caches know (EndpointSlices, Services, the namespace, PDBs).
//!
//! Nothing here does I/O or reads the clock: `now` is passed in, so every rule is covered
//! by table tests. The order of the checks is the order of [`decide`] and is documented in
//! `docs/webhook.md`; the first rule that applies wins.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

use graceful_drain_core::labels::{
    DELAY_ANNOTATION, DELETE_AT_ANNOTATION, DRAINING_LABEL, OPT_OUT_LABEL, RELEASED_AT_ANNOTATION,
};

/// Which admission path a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// CREATE pods/eviction (mutating webhook).
    Evict,
    /// DELETE pods (validating webhook).
    Delete,
}

impl Operation {
    /// Bounded metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Evict => "evict",
            Operation::Delete => "delete",
        }
    }
}

/// Username of the garbage collector (kube-controller-manager with
/// `--use-service-account-credentials`, the default of every distribution we know).
pub const GARBAGE_COLLECTOR: &str = "system:serviceaccount:kube-system:generic-garbage-collector";

/// Username of the ReplicaSet controller (kube-controller-manager with
/// `--use-service-account-credentials`, the default of every distribution we know).
pub const REPLICASET_CONTROLLER: &str = "system:serviceaccount:kube-system:replicaset-controller";
/// kube-controller-manager's own username, which its controllers use without
/// `--use-service-account-credentials`.
pub const CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
/// Whether `user` is the ReplicaSet controller, with or without
/// `--use-service-account-credentials`.
pub fn is_replicaset_controller(user: &str) -> bool {
    user == REPLICASET_CONTROLLER || user == CONTROLLER_MANAGER
}

/// Username of the StatefulSet controller (with `--use-service-account-credentials`).
pub const STATEFULSET_CONTROLLER: &str = "system:serviceaccount:kube-system:statefulset-controller";
/// Username of the DaemonSet controller (with `--use-service-account-credentials`).
pub const DAEMONSET_CONTROLLER: &str = "system:serviceaccount:kube-system:daemon-set-controller";

/// Whether the pod belongs to a ReplicaSet: its controller, or — once we isolated it and
/// handed the controller role to the Deployment — an owner without the controller flag.
/// The API server may call us again for the same DELETE with the pod as our isolation
/// left it: its storage layer retries a failed update on a fresh read when the first read
/// came from the watch cache (`GuaranteedUpdate` in
/// staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go), so the second call must
/// decide as the first did.
pub fn of_replicaset(pod: &PodFacts) -> bool {
    matches!(pod.owner, Some((OwnerKind::ReplicaSet, _)))
        || (pod.labels.contains_key(DRAINING_LABEL)
            && pod
                .owner_refs
                .iter()
                .any(|r| r.get("kind").and_then(serde_json::Value::as_str) == Some("ReplicaSet")))
}

/// The preconditions a caller put on its request (`deleteOptions.preconditions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The UID the pod must have (`preconditions.uid`).
    pub uid: Option<String>,
    /// The resourceVersion the pod must have (`preconditions.resourceVersion`).
    pub resource_version: Option<String>,
}

/// What the request asks for, independent of the wire format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// Whether this is an eviction or a DELETE.
    pub operation: Operation,
    /// The request's pod name (`request.name`), never a name taken from the body.
    pub name: String,
    /// The caller's preconditions: a request about another incarnation of the pod (a
    /// same-name replacement) must be left to the API server, which refuses it.
    pub preconditions: Preconditions,
    /// `request.dryRun` or a `dryRun` in the options.
    pub dry_run: bool,
    /// The grace period the caller asked for, in seconds (`gracePeriodSeconds`), if any.
    pub grace_period: Option<i64>,
    /// `request.userInfo.username`.
    pub user: String,
    /// A StatefulSet's or DaemonSet's controller DELETE that its live owner backs (a pod
    /// past the StatefulSet's replicas or of an older revision; a DaemonSet pod of an
    /// older template generation), checked by `admission::delete`. Such a DELETE is
    /// confirmed: never counted against the unconfirmed share, and isolated even where
    /// the pod's budget is spent (PDBs never block a controller's DELETE).
    pub owner_backed: bool,
}

/// The kind of the pod's controlling owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerKind {
    /// An `apps/v1` ReplicaSet (usually a Deployment's): the isolated pod leaves it.
    ReplicaSet,
    /// An `apps/v1` StatefulSet: its selector is never left.
    StatefulSet,
    /// An `apps/v1` DaemonSet: its selector is never left.
    DaemonSet,
    /// A `batch/v1` Job: its selector keys are kept where possible.
    Job,
    /// Any other controller (a custom resource), named `apiVersion/kind`; treated like a
    /// bare pod.
    Other(String),
}

impl OwnerKind {
    /// The kind as users write it.
    pub fn name(&self) -> &str {
        match self {
            OwnerKind::ReplicaSet => "ReplicaSet",
            OwnerKind::StatefulSet => "StatefulSet",
            OwnerKind::DaemonSet => "DaemonSet",
            OwnerKind::Job => "Job",
            OwnerKind::Other(kind) => kind,
        }
    }

    /// Maps an ownerReference kind (with its API group) to the kinds we know.
    pub fn from_reference(api_version: &str, kind: &str) -> OwnerKind {
        match (api_version, kind) {
            ("apps/v1", "ReplicaSet") => OwnerKind::ReplicaSet,
            ("apps/v1", "StatefulSet") => OwnerKind::StatefulSet,
            ("apps/v1", "DaemonSet") => OwnerKind::DaemonSet,
            ("batch/v1", "Job") => OwnerKind::Job,
            _ => OwnerKind::Other(format!("{api_version}/{kind}")),
        }
    }
}

/// The facts about a pod the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`, compared with a UID precondition.
    pub uid: String,
    /// `metadata.resourceVersion`, which the isolation patch tests against.
    pub resource_version: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations` (delay, delete time and restore annotations among them).
    pub annotations: BTreeMap<String, String>,
    /// `status.phase == Running`.
    pub running: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// The controlling owner: kind and name.
    pub owner: Option<(OwnerKind, String)>,
    /// `metadata.ownerReferences` as sent (the isolation may hand the controller role on).
    pub owner_refs: Vec<serde_json::Value>,
    /// `spec.nodeName`: where a drain would have to be under way for an eviction's word to
    /// be backed by something the API server authenticated (see `isolate::NodeDrain`).
    pub node_name: Option<String>,
}

/// Service types, for the narrower exposure modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServiceType {
    /// `ClusterIP` with a virtual IP (also when `spec.type` is absent).
    #[default]
    ClusterIp,
    /// A ClusterIP Service with `clusterIP: None`: DNS names for the pods (a StatefulSet's
    /// governing Service), no virtual IP and no load balancer that could lag behind.
    Headless,
    /// `NodePort`: reachable from outside the cluster on every node's port.
    NodePort,
    /// `LoadBalancer`: fronted by a cloud load balancer, the slowest to deregister.
    LoadBalancer,
    /// `ExternalName`: a DNS alias that selects no pods; never counts as exposure.
    ExternalName,
}

impl ServiceType {
    /// Parses `spec.type` (absent means ClusterIP) and `spec.clusterIP`.
    pub fn parse(value: Option<&str>, cluster_ip: Option<&str>) -> ServiceType {
        match value {
            Some("NodePort") => ServiceType::NodePort,
            Some("LoadBalancer") => ServiceType::LoadBalancer,
            Some("ExternalName") => ServiceType::ExternalName,
            _ if cluster_ip == Some("None") => ServiceType::Headless,
            _ => ServiceType::ClusterIp,
        }
    }
}

/// Which pods count as exposed to load balancers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Exposure {
    /// A ready endpoint of any EndpointSlice (any Service type, Ingress or Gateway backend).
    #[default]
    EndpointSlice,
    /// A ready endpoint of a LoadBalancer or NodePort Service (traffic from outside the
    /// cluster, where load balancers lag).
    External,
    /// A ready endpoint of a LoadBalancer Service only.
    LoadBalancer,
}

/// One endpoint entry naming the pod, as the EndpointSlice cache sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointFacts {
    /// The `kubernetes.io/service-name` of the slice, if any.
    pub service: Option<String>,
    /// The endpoint's `conditions.ready` (absent counts as ready, as the API documents).
    pub ready: bool,
    /// The targetRef names another UID: an earlier pod of the same name.
    pub earlier_pod: bool,
}

/// A Service of the pod: one whose EndpointSlices name it, or one whose selector matches
/// its labels before any slice of it lists the pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceFacts {
    /// The Service's name, in the pod's namespace.
    pub name: String,
    /// `spec.type`, with headless ClusterIP Services told apart.
    pub service_type: ServiceType,
    /// `spec.selector`; empty for Services without a selector.
    pub selector: BTreeMap<String, String>,
    /// The selector is not empty and matches the pod's labels.
    pub selects_pod: bool,
}

/// A PodDisruptionBudget whose selector matches the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdbFacts {
    /// The PDB's name, in the pod's namespace.
    pub name: String,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
    /// `status.observedGeneration >= metadata.generation`.
    pub observed: bool,
    /// Whether the pod is already listed in `status.disruptedPods`.
    pub lists_pod: bool,
    /// Label keys whose removal makes the selector stop matching.
    pub selector_keys: BTreeSet<String>,
}

/// Namespace-level settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceFacts {
    /// Excluded by flag or by the opt-out label.
    pub opted_out: bool,
    /// The namespace's delay annotation, unparsed.
    pub delay: Option<String>,
    /// The namespace is being deleted (`deletionTimestamp` set).
    pub terminating: bool,
}

/// What the caches know about the pod's surroundings, taken under the cache locks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every EndpointSlice entry naming the pod.
    pub endpoints: Vec<EndpointFacts>,
    /// The pod's Services: those whose slices name it or whose selector matches it.
    pub services: Vec<ServiceFacts>,
    /// Settings of the pod's namespace.
    pub namespace: NamespaceFacts,
    /// The PDBs whose selector matches the pod; an eviction with more than one passes.
    pub pdbs: Vec<PdbFacts>,
    /// No replica holds the deleter Lease: an isolated pod would never be deleted.
    pub no_deleter: bool,
    /// When this replica saw the pod leave the last EndpointSlice that listed it; `None`
    /// while one lists it, or when it was never seen listed.
    pub left_slices_at: Option<Timestamp>,
}

/// Static decision settings from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Delay between isolation and deletion when no annotation asks for another
    /// (`--deregistration-delay`).
    pub default_delay: Duration,
    /// Upper bound of a delay asked for by annotation (`--max-deregistration-delay`).
    pub max_delay: Duration,
    /// Which pods count as exposed (`--exposure`); others pass as not exposed.
    pub exposure: Exposure,
    /// Usernames whose requests are ours (the webhook's own service account).
    pub own_users: BTreeSet<String>,
}

/// Why a request passes through unchanged. Also the `outcome` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The request is a dry run; nothing would be deleted.
    DryRun,
    /// The caller is one of our own users (`--own-user`), such as the deferred deleter.
    OwnRequest,
    /// The pod or its namespace carries the opt-out label, or the namespace is excluded.
    OptedOut,
    /// The pod is already terminating (`deletionTimestamp` set).
    Terminating,
    /// A DELETE with `gracePeriodSeconds: 0`: the caller wants the pod gone now.
    ForceDelete,
    /// The pod is isolated and its delete time has come (or it records none).
    AlreadyDue,
    /// The pod is not in phase `Running`.
    NotRunning,
    /// The pod's `Ready` condition is not `True`.
    NotReady,
    /// No Service or EndpointSlice that counts under the exposure mode routes to the pod.
    NotExposed,
    /// An eviction of a pod selected by more than one PDB, which the API server refuses
    /// itself.
    MultiplePdbs,
    /// The request's UID or resourceVersion precondition does not match the pod.
    PreconditionMismatch,
    /// The garbage collector deletes dependents of a deleted owner.
    GarbageCollector,
    /// The pod's namespace is being deleted.
    NamespaceTerminating,
    /// No replica holds the deleter Lease, so nobody would delete an isolated pod.
    NoDeleter,
}

impl Pass {
    /// Bounded metric label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Pass::DryRun => "dry_run",
            Pass::OwnRequest => "own_request",
            Pass::OptedOut => "opted_out",
            Pass::Terminating => "terminating",
            Pass::ForceDelete => "force_delete",
            Pass::AlreadyDue => "already_due",
            Pass::NotRunning => "not_running",
            Pass::NotReady => "not_ready",
            Pass::NotExposed => "not_exposed",
            Pass::MultiplePdbs => "multiple_pdbs",
            Pass::PreconditionMismatch => "precondition_mismatch",
            Pass::GarbageCollector => "garbage_collector",
            Pass::NamespaceTerminating => "namespace_terminating",
            Pass::NoDeleter => "no_deleter",
        }
    }
}

/// How the isolation must be accounted in the pod's PodDisruptionBudget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// Eviction: the disruption must be recorded in the PDB, read live; a budget that
    /// refuses refuses the eviction (429), exactly as the API server would.
    Required,
    /// DELETE: PDBs never block a DELETE, so the pod is isolated whatever the budget says;
    /// the disruption is recorded when the budget allows it.
    IfPossible,
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allow the request unchanged.
    Pass(Pass),
    /// Isolate the pod now; it may be deleted at `delete_at`.
    Isolate {
        /// When the pod may be deleted: now plus its delay, rounded up to a second.
        delete_at: Timestamp,
        /// The caller's grace period in seconds, recorded for the eventual deletion.
        grace_period: Option<i64>,
        /// How the pod's PDB is charged for the isolation.
        charge: Charge,
        /// The annotated delay was longer than the maximum and was cut to it.
        capped: bool,
    },
    /// The pod is already isolated and waits for `delete_at`: no second isolation, but the
    /// request must not delete it early either.
    Pending {
        /// When the pod may go; while a slice still lists it, its recorded delete time or
        /// now, whichever is later (the caller asks again from then on).
        delete_at: Timestamp,
    },
}

/// Decides what to do with `req` about `pod`. Pure; see the module docs for the order.
pub fn decide(
    req: &Removal,
    pod: &PodFacts,
    snap: &Snapshot,
    settings: &Settings,
    now: Timestamp,
) -> Decision {
    if let Some(pass) = pass_for_request(req, settings) {
        return Decision::Pass(pass);
    }
    if snap.namespace.opted_out || pod.labels.get(OPT_OUT_LABEL).is_some_and(|v| v == "true") {
        return Decision::Pass(Pass::OptedOut);
    }
    if snap.namespace.terminating {
        return Decision::Pass(Pass::NamespaceTerminating);
    }
    if !preconditions_hold(&req.preconditions, pod) {
        return Decision::Pass(Pass::PreconditionMismatch);
    }
    if pod.terminating {
        return Decision::Pass(Pass::Terminating);
    }
    if pod.labels.contains_key(DRAINING_LABEL) {
        let Some(delete_at) = delete_at_of(pod) else {
            return Decision::Pass(Pass::AlreadyDue);
        };
        let delay = delay_for(pod, &snap.namespace, settings.default_delay).min(settings.max_delay);
        let released = released_at_of(pod);
        return match due_at(
            delete_at,
            listed(snap),
            snap.left_slices_at,
            released,
            delay,
            now,
        ) {
            Some(due) if due > now => Decision::Pending { delete_at: due },
            Some(_) => Decision::Pass(Pass::AlreadyDue),
            // Still routed to: not before its recorded time, and asked again from then on.
            None => Decision::Pending {
                delete_at: delete_at.max(now),
            },
        };
    }
    if let Some(pass) = pass_for_pod(pod, snap, settings) {
        return Decision::Pass(pass);
    }
    if snap.no_deleter {
        return Decision::Pass(Pass::NoDeleter);
    }
    // PDBs never block a DELETE. An eviction of a pod selected by several PDBs is an
    // error the API server answers itself (500); whether a single budget allows the
    // eviction is decided on the live PDB when charging it, never on the cache.
    let charge = match req.operation {
        Operation::Evict if snap.pdbs.len() > 1 => return Decision::Pass(Pass::MultiplePdbs),
        Operation::Evict => Charge::Required,
        Operation::Delete => Charge::IfPossible,
    };
    let asked = delay_for(pod, &snap.namespace, settings.default_delay);
    let delay = asked.min(settings.max_delay);
    Decision::Isolate {
        delete_at: add(now, delay),
        grace_period: req.grace_period,
        charge,
        capped: asked > delay,
    }
}

/// What stands behind an isolation besides the review's word, which anyone reaching the
/// port could forge (docs/security.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Every connection presents a client certificate of the API server: the review is
    /// the caller's own word, authenticated and authorised.
    pub reviews_authenticated: bool,
    /// A drainer's mark is on the pod's node (`isolate::NodeDrain::Draining`); read only
    /// when [`needs_node`] says it could matter.
    pub node_draining: bool,
}

/// How an isolation [`decide`] asked for goes ahead, once [`confirm`]ed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confirmation {
    /// Something only an authenticated user can do stands behind it (a drain, the API
    /// server's word, a controller's DELETE its live owner backs): it is not counted
    /// against the unconfirmed share.
    pub confirmed: bool,
    /// The deferred deleter removes the pod when due ([`deleter_removes`]).
    pub deleter_removes: bool,
    /// The caller's grace period, kept only when the API server vouches for the review;
    /// otherwise the pod's own is used.
    pub grace_period: Option<i64>,
    /// How the pod's PDB is charged.
    pub charge: Charge,
}

/// Whether the deferred deleter removes the pod once it is due: only for a ReplicaSet
/// controller's DELETE of its own pod (refused after isolation, and checked on the live
/// ReplicaSet by the admission's surplus check first); every other caller comes back
/// itself.
pub fn deleter_removes(req: &Removal, pod: &PodFacts) -> bool {
    req.operation == Operation::Delete && is_replicaset_controller(&req.user) && of_replicaset(pod)
}

/// Why ReplicaSet `name`, which wants `wanted` replicas and controls `active` active pods
/// (as its controller counts them), has none to spare; `None` when it has: its controller
/// deletes pods only then (`manageReplicas` in pkg/controller/replicaset/replica_set.go),
/// so only then does a DELETE claiming it have its backing.
pub fn replicaset_spares(name: &str, wanted: i32, active: usize) -> Option<String> {
    let active = i32::try_from(active).unwrap_or(i32::MAX);
    (active <= wanted).then(|| {
        format!("ReplicaSet {name} controls {active} active pods and wants {wanted}: none to spare")
    })
}

/// Whether [`confirm`] needs to know if the pod's node is being drained: only for an
/// eviction nothing else confirms.
pub fn needs_node(req: &Removal, reviews_authenticated: bool) -> bool {
    req.operation == Operation::Evict && !reviews_authenticated
}

/// How an isolation of `pod` for `req` goes ahead on `evidence`, with the grace period and
/// charge [`decide`] gave it; `Err` with why when it must not. A merely cordoned node
/// confirms nothing, and an unconfirmed DELETE is an unconfirmed disruption: bound by the
/// pod's budget as an eviction is (PDBs never block a DELETE, but anyone may send one),
/// and refused when several budgets select the pod.
pub fn confirm(
    req: &Removal,
    pod: &PodFacts,
    snap: &Snapshot,
    evidence: Evidence,
    grace_period: Option<i64>,
    charge: Charge,
) -> Result<Confirmation, String> {
    let deleter_removes = deleter_removes(req, pod);
    let confirmed = deleter_removes
        || req.owner_backed
        || (req.operation == Operation::Evict
            && (evidence.reviews_authenticated || evidence.node_draining));
    let charge = if !confirmed && req.operation == Operation::Delete {
        if snap.pdbs.len() > 1 {
            return Err(format!(
                "pod {}/{} is selected by several PodDisruptionBudgets and nothing confirms its deletion",
                pod.namespace, pod.name
            ));
        }
        Charge::Required
    } else {
        charge
    };
    Ok(Confirmation {
        confirmed,
        deleter_removes,
        grace_period: grace_period.filter(|_| evidence.reviews_authenticated),
        charge,
    })
}

/// Longest an isolated pod waits past its delete time for the last EndpointSlice to drop
/// it: a Service selecting the draining label would otherwise keep it forever.
pub const MAX_ENDPOINT_WAIT: Duration = Duration::from_secs(600);

/// Whether an EndpointSlice that load balancers follow still lists the pod, ready or not
/// (an earlier pod of its name aside). A headless Service's slices do not count: nothing
/// balances their traffic, and a StatefulSet's governing Service keeps listing an isolated
/// pod by design (its selector is the StatefulSet's own).
pub fn listed(snap: &Snapshot) -> bool {
    snap.endpoints.iter().any(|e| {
        !e.earlier_pod
            && service_counts(
                e.service.as_deref(),
                &snap.services,
                Exposure::EndpointSlice,
            )
    })
}

/// When an isolated pod recorded as due at `delete_at` (its isolation time plus `delay`)
/// may go: never while an EndpointSlice still lists it (load balancers follow the slices),
/// and not before `delay` has passed since it left the last one (`left_at`, when this
/// replica saw it) — the delay counts from the removal, not from the isolation — unless
/// the configured load balancer was seen letting it go first (`released_at`, recorded
/// only after it left its slices): then from that moment, the delay being an upper
/// bound. Bounded: [`MAX_ENDPOINT_WAIT`] past `delete_at` it goes whatever the slices say.
/// `None` while it is still listed (ask again soon).
pub fn due_at(
    delete_at: Timestamp,
    listed: bool,
    left_at: Option<Timestamp>,
    released_at: Option<Timestamp>,
    delay: Duration,
    now: Timestamp,
) -> Option<Timestamp> {
    let limit = add(delete_at, MAX_ENDPOINT_WAIT);
    if now >= limit {
        return Some(limit);
    }
    if listed {
        return None;
    }
    let after_removal = left_at.map_or(delete_at, |left| add(left, delay));
    let full = delete_at.max(after_removal).min(limit);
    Some(released_at.map_or(full, |released| released.min(full)))
}

/// When the configured load balancer was seen letting go of an isolated pod
/// ([`RELEASED_AT_ANNOTATION`]).
pub fn released_at_of(pod: &PodFacts) -> Option<Timestamp> {
    pod.annotations
        .get(RELEASED_AT_ANNOTATION)
        .and_then(|v| v.parse::<Timestamp>().ok())
}

/// Whether the caller's UID and resourceVersion preconditions match `pod`.
pub fn preconditions_hold(pre: &Preconditions, pod: &PodFacts) -> bool {
    pre.uid.as_deref().is_none_or(|uid| uid == pod.uid)
        && pre
            .resource_version
            .as_deref()
            .is_none_or(|rv| rv == pod.resource_version)
}

/// The passes a request earns whatever its pod: a dry run, our own request, the garbage
/// collector, a force delete. The review's fast paths ask this before reading the pod;
/// [`decide`] asks it first too.
pub fn pass_for_request(req: &Removal, settings: &Settings) -> Option<Pass> {
    if req.dry_run {
        return Some(Pass::DryRun);
    }
    if settings.own_users.contains(&req.user) {
        return Some(Pass::OwnRequest);
    }
    if req.user == GARBAGE_COLLECTOR {
        return Some(Pass::GarbageCollector);
    }
    // An explicit zero grace period is a force delete: the caller wants the pod gone now.
    if req.operation == Operation::Delete && req.grace_period == Some(0) {
        return Some(Pass::ForceDelete);
    }
    None
}

/// What the watch caches say of a review's pod before anything is read live: all its fast
/// path looks at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Glance {
    /// Its namespace opted out (a label, or excluded by configuration).
    pub opted_out: bool,
    /// It is isolated already (our label on the object, or the cache's record of it).
    pub isolated: bool,
    /// A slice lists it as a ready endpoint.
    pub listed_ready: bool,
    /// A Service may select it before its slice lists it (for a DELETE: a Service whose
    /// selector matches the object's labels; for an eviction, which carries no labels: any
    /// Service of the namespace that may expose pods).
    pub may_be_selected: bool,
}

/// The fast path of a review: passed unchanged without reading anything live — the
/// request's own pass ([`pass_for_request`]), an opted-out namespace, or a pod neither
/// isolated nor listed nor selectable, which no load balancer can route to, whatever else
/// is true. `None`: the review needs its live reads.
pub fn fast_pass(req: &Removal, glance: &Glance, settings: &Settings) -> Option<Pass> {
    if let Some(pass) = pass_for_request(req, settings) {
        return Some(pass);
    }
    if glance.opted_out {
        return Some(Pass::OptedOut);
    }
    let exposed = glance.isolated || glance.listed_ready || glance.may_be_selected;
    (!exposed).then_some(Pass::NotExposed)
}

fn pass_for_pod(pod: &PodFacts, snap: &Snapshot, settings: &Settings) -> Option<Pass> {
    if !pod.running {
        return Some(Pass::NotRunning);
    }
    if !pod.ready {
        return Some(Pass::NotReady);
    }
    if !is_exposed(snap, settings.exposure) {
        return Some(Pass::NotExposed);
    }
    None
}

/// Whether a ready pod is exposed under `mode`: a ready endpoint of a slice that counts,
/// or selected by a Service that counts whether or not a slice lists it yet. The
/// EndpointSlice controller adds a pod some time after it turns ready — much later when it
/// relists after a kube-apiserver restart — and would then list a pod evicted in between as
/// ready while it terminates, so load balancers would route to it.
pub fn is_exposed(snap: &Snapshot, mode: Exposure) -> bool {
    let listed = snap.endpoints.iter().any(|ep| {
        ep.ready && !ep.earlier_pod && service_counts(ep.service.as_deref(), &snap.services, mode)
    });
    listed
        || snap.services.iter().any(|s| {
            s.selects_pod
                && s.service_type != ServiceType::ExternalName
                && type_counts(s.service_type, mode)
        })
}

/// Whether a slice of `service` counts as exposure under `mode`. A headless Service never
/// does: nothing balances its traffic, clients resolve the pods' own DNS names. A slice
/// of no known Service (a Gateway's own slice) counts only in the default mode.
fn service_counts(service: Option<&str>, services: &[ServiceFacts], mode: Exposure) -> bool {
    match service.and_then(|name| services.iter().find(|s| s.name == name)) {
        Some(known) => type_counts(known.service_type, mode),
        None => mode == Exposure::EndpointSlice,
    }
}

/// Whether a Service of type `service_type` counts as exposure under `mode`.
fn type_counts(service_type: ServiceType, mode: Exposure) -> bool {
    match mode {
        Exposure::EndpointSlice => service_type != ServiceType::Headless,
        Exposure::External => matches!(
            service_type,
            ServiceType::LoadBalancer | ServiceType::NodePort
        ),
        Exposure::LoadBalancer => service_type == ServiceType::LoadBalancer,
    }
}

/// The deregistration delay for `pod`: pod annotation, else namespace annotation, else the
/// default. An unparsable annotation is ignored (the default is the safe choice).
pub fn delay_for(pod: &PodFacts, ns: &NamespaceFacts, default: Duration) -> Duration {
    delay_from(
        pod.annotations.get(DELAY_ANNOTATION).map(String::as_str),
        ns,
        default,
    )
}

/// [`delay_for`] from the value of the pod's delay annotation, for callers that keep only
/// that (the deferred deleter).
pub fn delay_from(annotation: Option<&str>, ns: &NamespaceFacts, default: Duration) -> Duration {
    annotation
        .and_then(|v| humantime::parse_duration(v.trim()).ok())
        .or_else(|| {
            ns.delay
                .as_deref()
                .and_then(|v| humantime::parse_duration(v.trim()).ok())
        })
        .unwrap_or(default)
}

/// The recorded delete time of an isolated pod.
pub fn delete_at_of(pod: &PodFacts) -> Option<Timestamp> {
    pod.annotations
        .get(DELETE_AT_ANNOTATION)
        .and_then(|v| v.parse::<Timestamp>().ok())
}

/// `now + delay` rounded up to a whole millisecond (annotations stay short and a pod is
/// never deleted early), saturating at the largest representable time. Not to a whole
/// second: that would keep every drained pod up to a second past its delay.
pub fn add(now: Timestamp, delay: Duration) -> Timestamp {
    let exact = jiff::SignedDuration::try_from(delay)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX);
    let millis = exact.as_millisecond() + i64::from(exact.subsec_nanosecond() % 1_000_000 > 0);
    Timestamp::from_millisecond(millis).unwrap_or(exact)
}

/// Which controller labels the relabelling prefers to keep, by owner kind, and whether the
/// owner's selector must be left (see docs/webhook.md, "Relabelling").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerPolicy {
    /// Label keys of selectors the pod must stop matching.
    pub leave: Vec<BTreeSet<String>>,
    /// Keys to keep unless a selector can only be left by removing them.
    pub keep: BTreeSet<String>,
    /// Keys never removed: the selector of a controller that must keep owning the pod.
    pub pinned: BTreeSet<String>,
}

impl OwnerPolicy {
    /// The policy for an owner of `kind` whose selector uses `selector_keys`.
    pub fn for_owner(kind: &OwnerKind, selector_keys: BTreeSet<String>) -> OwnerPolicy {
        match kind {
            // Leave the ReplicaSet so it starts the replacement while this pod still serves.
            OwnerKind::ReplicaSet => OwnerPolicy {
                leave: vec![selector_keys],
                keep: BTreeSet::new(),
                pinned: BTreeSet::new(),
            },
            // A released StatefulSet pod blocks its own replacement (same name) and, under
            // OrderedReady, every other ordinal; a released DaemonSet pod makes the
            // DaemonSet start a second pod on the node (colliding on host ports). Their
            // selectors are never left.
            OwnerKind::StatefulSet | OwnerKind::DaemonSet => OwnerPolicy {
                leave: Vec::new(),
                keep: BTreeSet::new(),
                pinned: selector_keys,
            },
            // A released Job pod is replaced early, which is what an eviction asks for;
            // the Job's keys are still kept where another key can be removed instead.
            OwnerKind::Job => OwnerPolicy {
                leave: Vec::new(),
                keep: selector_keys,
                pinned: BTreeSet::new(),
            },
            OwnerKind::Other(_) => OwnerPolicy::default(),
        }
    }
}

/// The labels to remove so the pod stops matching every selector in `leave`: each
/// selector's keys minus `keep`, or all its keys when every one of them is kept. Keys in
/// `pinned` are never removed, so a selector made only of pinned keys is not left (see
/// [`service_left_only_by_pinned`]). Only labels the pod carries are returned, with their
/// values.
pub fn labels_to_remove(
    labels: &BTreeMap<String, String>,
    leave: &[BTreeSet<String>],
    keep: &BTreeSet<String>,
    pinned: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut remove = BTreeMap::new();
    for keys in leave {
        let present: Vec<&String> = keys
            .iter()
            .filter(|k| labels.contains_key(*k) && !pinned.contains(*k))
            .collect();
        let preferred: Vec<&String> = present
            .iter()
            .copied()
            .filter(|k| !keep.contains(*k))
            .collect();
        let chosen = if preferred.is_empty() {
            present
        } else {
            preferred
        };
        for key in chosen {
            if let Some(value) = labels.get(key) {
                remove.insert(key.clone(), value.clone());
            }
        }
    }
    remove
}

/// The first selecting Service the pod can leave only by dropping a `pinned` key (its
/// controller's): every selector key the pod carries is pinned. Such a pod cannot be
/// isolated without releasing it from its controller.
pub fn service_left_only_by_pinned<'a>(
    labels: &BTreeMap<String, String>,
    services: &'a [ServiceFacts],
    pinned: &BTreeSet<String>,
) -> Option<&'a ServiceFacts> {
    if pinned.is_empty() {
        return None;
    }
    services.iter().find(|s| {
        !s.selector.is_empty()
            && s.service_type != ServiceType::Headless
            && s.selector
                .keys()
                .filter(|k| labels.contains_key(*k))
                .all(|k| pinned.contains(k))
    })
}

#[cfg(test)]
mod tests;
