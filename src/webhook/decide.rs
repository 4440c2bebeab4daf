//! The admission decision: a pure function of one parsed request, the pod it is about and
//! a snapshot of what the caches know (EndpointSlices, Services, the namespace, PDBs).
//!
//! Nothing here does I/O or reads the clock: `now` is passed in, so every rule is covered
//! by table tests. The order of the checks is the order of [`decide`] and is documented in
//! `docs/webhook.md`; the first rule that applies wins.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

use crate::labels::{DELAY_ANNOTATION, DELETE_AT_ANNOTATION, DRAINING_LABEL, OPT_OUT_LABEL};

/// Which admission path a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// CREATE pods/eviction (mutating webhook).
    Evict,
    /// DELETE pods (validating webhook).
    Delete,
}

impl Path {
    /// Bounded metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Evict => "evict",
            Path::Delete => "delete",
        }
    }
}

/// What the request asks for, independent of the wire format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub path: Path,
    /// `request.dryRun` or a `dryRun` in the options.
    pub dry_run: bool,
    /// The grace period the caller asked for, if any.
    pub grace_period: Option<i64>,
    /// `request.userInfo.username`.
    pub user: String,
}

/// The kind of the pod's controlling owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerKind {
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    /// Any other controller (a custom resource); treated like a bare pod.
    Other(String),
}

impl OwnerKind {
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
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `status.phase == Running`.
    pub running: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// The controlling owner: kind and name.
    pub owner: Option<(OwnerKind, String)>,
}

/// Service types, for the narrower exposure modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

impl ServiceType {
    /// Parses `spec.type` (absent means ClusterIP).
    pub fn parse(value: Option<&str>) -> ServiceType {
        match value {
            Some("NodePort") => ServiceType::NodePort,
            Some("LoadBalancer") => ServiceType::LoadBalancer,
            Some("ExternalName") => ServiceType::ExternalName,
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
    /// The targetRef UID, when the slice carries one.
    pub uid: Option<String>,
}

/// A Service selecting the pod (found through its EndpointSlices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFacts {
    pub name: String,
    pub service_type: ServiceType,
    /// `spec.selector`; empty for Services without a selector.
    pub selector: BTreeMap<String, String>,
}

/// A PodDisruptionBudget whose selector matches the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdbFacts {
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
}

/// What the caches know about the pod's surroundings, taken under the cache locks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub endpoints: Vec<EndpointFacts>,
    pub services: Vec<ServiceFacts>,
    pub namespace: NamespaceFacts,
    pub pdbs: Vec<PdbFacts>,
}

/// Static decision settings from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub default_delay: Duration,
    pub exposure: Exposure,
    /// Usernames whose requests are ours (the webhook's own service account).
    pub own_users: BTreeSet<String>,
}

/// Why a request passes through unchanged. Also the `outcome` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    DryRun,
    OwnRequest,
    OptedOut,
    Terminating,
    ForceDelete,
    AlreadyDue,
    NotRunning,
    NotReady,
    NotExposed,
    PdbExhausted,
    PdbNotObserved,
    MultiplePdbs,
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
            Pass::PdbExhausted => "pdb_exhausted",
            Pass::PdbNotObserved => "pdb_not_observed",
            Pass::MultiplePdbs => "multiple_pdbs",
        }
    }
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allow the request unchanged.
    Pass(Pass),
    /// Isolate the pod now; it may be deleted at `delete_at`.
    Isolate {
        delete_at: Timestamp,
        grace_period: Option<i64>,
    },
    /// The pod is already isolated and waits for `delete_at`: no second isolation, but the
    /// request must not delete it early either.
    Pending { delete_at: Timestamp },
}

/// Decides what to do with `req` about `pod`. Pure; see the module docs for the order.
pub fn decide(
    req: &Request,
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
    if pod.terminating {
        return Decision::Pass(Pass::Terminating);
    }
    if pod.labels.contains_key(DRAINING_LABEL) {
        return match delete_at_of(pod) {
            Some(delete_at) if delete_at > now => Decision::Pending { delete_at },
            _ => Decision::Pass(Pass::AlreadyDue),
        };
    }
    if let Some(pass) = pass_for_pod(pod, snap, settings) {
        return Decision::Pass(pass);
    }
    if let Some(pass) = pass_for_budget(&snap.pdbs) {
        return Decision::Pass(pass);
    }
    let delay = delay_for(pod, &snap.namespace, settings.default_delay);
    Decision::Isolate {
        delete_at: add(now, delay),
        grace_period: req.grace_period,
    }
}

fn pass_for_request(req: &Request, settings: &Settings) -> Option<Pass> {
    if req.dry_run {
        return Some(Pass::DryRun);
    }
    if settings.own_users.contains(&req.user) {
        return Some(Pass::OwnRequest);
    }
    // An explicit zero grace period is a force delete: the caller wants the pod gone now.
    if req.path == Path::Delete && req.grace_period == Some(0) {
        return Some(Pass::ForceDelete);
    }
    None
}

fn pass_for_pod(pod: &PodFacts, snap: &Snapshot, settings: &Settings) -> Option<Pass> {
    if !pod.running {
        return Some(Pass::NotRunning);
    }
    if !pod.ready {
        return Some(Pass::NotReady);
    }
    if !is_exposed(pod, snap, settings.exposure) {
        return Some(Pass::NotExposed);
    }
    None
}

/// Same rules as the API server's eviction: several PDBs are an error there, an
/// unobserved PDB or one without disruptions left refuses.
fn pass_for_budget(pdbs: &[PdbFacts]) -> Option<Pass> {
    match pdbs {
        [] => None,
        [pdb] if pdb.lists_pod => None,
        [pdb] if !pdb.observed => Some(Pass::PdbNotObserved),
        [pdb] if pdb.disruptions_allowed <= 0 => Some(Pass::PdbExhausted),
        [_] => None,
        _ => Some(Pass::MultiplePdbs),
    }
}

/// Whether the pod is a ready endpoint of a slice that counts under `mode`.
pub fn is_exposed(pod: &PodFacts, snap: &Snapshot, mode: Exposure) -> bool {
    snap.endpoints.iter().any(|ep| {
        ep.ready
            && ep.uid.as_deref().is_none_or(|uid| uid == pod.uid)
            && service_counts(ep.service.as_deref(), &snap.services, mode)
    })
}

fn service_counts(service: Option<&str>, services: &[ServiceFacts], mode: Exposure) -> bool {
    if mode == Exposure::EndpointSlice {
        return true;
    }
    let Some(name) = service else { return false };
    services
        .iter()
        .find(|s| s.name == name)
        .is_some_and(|s| match mode {
            Exposure::EndpointSlice => true,
            Exposure::External => matches!(
                s.service_type,
                ServiceType::LoadBalancer | ServiceType::NodePort
            ),
            Exposure::LoadBalancer => s.service_type == ServiceType::LoadBalancer,
        })
}

/// The deregistration delay for `pod`: pod annotation, else namespace annotation, else the
/// default. An unparsable annotation is ignored (the default is the safe choice).
pub fn delay_for(pod: &PodFacts, ns: &NamespaceFacts, default: Duration) -> Duration {
    pod.annotations
        .get(DELAY_ANNOTATION)
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

/// `now + delay`, saturating at the largest representable time.
pub fn add(now: Timestamp, delay: Duration) -> Timestamp {
    jiff::SignedDuration::try_from(delay)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Which controller labels the relabelling prefers to keep, by owner kind, and whether the
/// owner's selector must be left (see docs/webhook.md, "Relabelling").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerPolicy {
    /// Label keys of selectors the pod must stop matching.
    pub leave: Vec<BTreeSet<String>>,
    /// Keys to keep unless a selector can only be left by removing them.
    pub keep: BTreeSet<String>,
}

impl OwnerPolicy {
    /// The policy for an owner of `kind` whose selector uses `selector_keys`.
    pub fn for_owner(kind: &OwnerKind, selector_keys: BTreeSet<String>) -> OwnerPolicy {
        match kind {
            // Leave the ReplicaSet so it starts the replacement while this pod still serves.
            OwnerKind::ReplicaSet => OwnerPolicy {
                leave: vec![selector_keys],
                keep: BTreeSet::new(),
            },
            // These controllers replace by name or per node: keep them owning the pod.
            OwnerKind::StatefulSet | OwnerKind::DaemonSet | OwnerKind::Job => OwnerPolicy {
                leave: Vec::new(),
                keep: selector_keys,
            },
            OwnerKind::Other(_) => OwnerPolicy::default(),
        }
    }
}

/// The labels to remove so the pod stops matching every selector in `leave`: each
/// selector's keys minus `keep`, or all its keys when every one of them is kept. Only
/// labels the pod carries are returned, with their values.
pub fn labels_to_remove(
    labels: &BTreeMap<String, String>,
    leave: &[BTreeSet<String>],
    keep: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut remove = BTreeMap::new();
    for keys in leave {
        let present: Vec<&String> = keys.iter().filter(|k| labels.contains_key(*k)).collect();
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
