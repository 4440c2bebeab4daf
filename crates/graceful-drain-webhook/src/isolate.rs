//! Acting on a decision to isolate: PDB accounting, the relabelling patch and the Event.
//!
//! Order matters and follows the API server's eviction code: first the disruption is
//! recorded in the PDB (`status.disruptedPods` + `disruptionsAllowed - 1` in one
//! resourceVersion-guarded status update, re-read and retried on 409), then the pod is
//! patched with a JSON patch whose `test` ops on `resourceVersion` and `labels` make a
//! concurrent change fail instead of being overwritten. A failed test surfaces as
//! [`Error::Conflict`] so the caller re-reads the pod and decides again.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use json_patch::jsonptr::PointerBuf;
use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation,
};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PatchParams, PostParams};
use serde_json::Value;

use super::cache::{Cache, OwnerFacts, selector_keys};
use super::decide::{
    Charge, OwnerKind, OwnerPolicy, PodFacts, ServiceType, Snapshot, labels_to_remove,
    service_left_only_by_pinned,
};
use graceful_drain_core::labels::{
    DELETE_AT_ANNOTATION, DRAINING_LABEL, FIELD_MANAGER, GRACE_PERIOD_ANNOTATION,
    ORIGINAL_LABELS_ANNOTATION, RESTORE_AT_ANNOTATION,
};

/// How often a PDB status update is retried after a 409 before giving up. Charges from
/// this replica are serialised (and grouped) by [`PdbGate`], so conflicts come only from other
/// replicas (or the disruption controller); each retry re-reads the PDB after a short
/// jittered pause. 20 attempts of at most [`PDB_RETRY_MAX_PAUSE`] stay well inside one
/// admission call even with several replicas evicting from the same budget.
const PDB_ATTEMPTS: usize = 20;
/// Upper bound of the random pause before re-reading a conflicting PDB: long enough for a
/// competing replica's update to land, short against the 10 s admission budget.
const PDB_RETRY_MAX_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Event reason recorded on a pod when it is isolated.
pub const REASON_ISOLATED: &str = "graceful-drain.io/Isolated";
/// Event reason recorded on a pod put back into its Services because no authenticated
/// eviction or DELETE followed its isolation.
pub const REASON_RESTORED: &str = "graceful-drain.io/Restored";
/// Event reason recorded on a pod when the deferred deleter deletes it.
pub const REASON_DELETED: &str = "graceful-drain.io/Deleted";
/// Warning Event reason when an annotated delay was cut to `--max-deregistration-delay`.
pub const REASON_DELAY_CAPPED: &str = "graceful-drain.io/DelayCapped";
/// Warning Event reason when an eviction was refused for now (429) because the pod could
/// not be isolated in time; the caller retries.
pub const REASON_ISOLATION_DEFERRED: &str = "graceful-drain.io/IsolationDeferred";
/// Warning Event reason when a pod could not be isolated and its request went through.
pub const REASON_ISOLATION_FAILED: &str = "graceful-drain.io/IsolationFailed";

/// Errors while isolating a pod.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pod changed under us (a `test` op failed or the resourceVersion moved). `code`
    /// is the answer (409 or 422); a 422 may also be a real validation error, which the
    /// caller tells apart by re-reading the pod.
    #[error("isolate pod {pod}: changed concurrently (HTTP {code})")]
    Conflict { pod: String, code: u16 },
    /// An API call failed.
    #[error("isolate pod {pod}: {action}")]
    Api {
        pod: String,
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The PDB kept changing under us.
    #[error("isolate pod {pod}: PDB {pdb} kept conflicting after {PDB_ATTEMPTS} attempts")]
    PdbContention { pod: String, pdb: String },
    /// A selecting Service selects only labels of the pod's StatefulSet or DaemonSet: the
    /// pod cannot leave the Service without being released from its controller.
    #[error(
        "isolate pod {pod}: Service {service} selects only labels of its {owner}, so the pod \
         cannot leave the Service without being released from the {owner}; give the \
         Service a selector label of its own (in the pod template too)"
    )]
    ControllerSelector {
        pod: String,
        owner: String,
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
    Recreate { pod: String, deployment: String },
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

/// Result of the PDB accounting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budget {
    /// The disruption was recorded now.
    Consumed,
    /// The pod was already listed in `status.disruptedPods`.
    Listed,
    /// No disruption left.
    Exhausted { pdb: String },
    /// The disruption controller has not observed the PDB's latest generation.
    NotObserved { pdb: String },
}

impl Budget {
    /// Whether the budget let the disruption happen (recorded now or before).
    pub fn allows(&self) -> bool {
        matches!(self, Budget::Consumed | Budget::Listed)
    }
}

/// Result of [`isolate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The pod is isolated; the labels removed are returned. `uncharged` names the PDB
    /// that could not record the disruption (a DELETE isolates anyway).
    Isolated {
        removed: BTreeMap<String, String>,
        uncharged: Option<String>,
        /// When the deferred deleter may delete it (see [`Plan::counted_from_now`]).
        delete_at: Timestamp,
    },
    /// A PDB refused (evictions only).
    Refused(Budget),
}

/// What to isolate for: the decision's delete time, grace period and PDB accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub delete_at: Timestamp,
    pub grace_period: Option<i64>,
    pub charge: Charge,
    /// Who removes the pod once it is due (see [`OnDue`]).
    pub on_due: OnDue,
}

/// Who removes an isolated pod once its delay is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDue {
    /// The caller, retrying its eviction (refused with 429 until then) or its held DELETE;
    /// if nobody has [`Context::restore_after`] past the delete time, the webhook puts the
    /// pod back. A review's word alone (which anyone reaching the webhook's port could forge)
    /// never deletes anything.
    Caller,
    /// The deferred deleter: a ReplicaSet scale-down the webhook refused after checking on
    /// the live ReplicaSet that it has a replica too many.
    Deleter,
}

/// How long after its delete time an isolated pod that nobody evicted or deleted goes back
/// into its Services (the default of [`Context::restore_after`]): every eviction caller
/// retries within seconds (kubectl every 5 s, Cluster Autoscaler every 10 s, our node
/// agent at the Retry-After we send), so a minute without one means none is coming (a
/// forged or replayed review, a caller that gave up).
pub const RESTORE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// When a pod due at `delete_at` that no caller removed by `restore_after` later goes
/// back into its Services.
pub fn restore_at(delete_at: Timestamp, restore_after: std::time::Duration) -> Timestamp {
    super::decide::add(delete_at, restore_after)
}

/// Work before the relabel shorter than this leaves the delete time as decided: the
/// delay is counted in seconds, and tests compare exact times.
const LATE_RELABEL: std::time::Duration = std::time::Duration::from_millis(250);

impl Plan {
    /// The deregistration delay counts from the relabel, which takes the pod out of its
    /// Services, not from the decision: when the owner lookup and PDB accounting before it
    /// took `spent` (a throttled API server, PDB conflicts), the delete time moves by as
    /// much, so the load balancers still get the whole delay.
    pub fn counted_from_now(self, spent: std::time::Duration) -> Self {
        if spent < LATE_RELABEL {
            return self;
        }
        let shift = jiff::SignedDuration::try_from(spent).unwrap_or(jiff::SignedDuration::ZERO);
        Self {
            delete_at: self.delete_at.checked_add(shift).unwrap_or(self.delete_at),
            ..self
        }
    }
}

/// Where Events go: sent inline (tests, the deleter's own task) or handed to a background
/// sender so no admission call waits for an Event.
#[derive(Clone, Debug, Default)]
pub enum EventSink {
    /// Create the Event in the calling task.
    #[default]
    Inline,
    /// Queue it for the sender task ([`super::events::send`], which groups the Events of
    /// one controller's pods); dropped (and logged) when full.
    Queue(tokio::sync::mpsc::Sender<super::events::Queued>),
}

/// Events waiting for the background sender; beyond this they are dropped (logged), so a
/// slow API server never makes admission calls queue behind Events. The sender empties
/// the queue into its batch as Events come, so a 500-pod drain fits.
pub const EVENT_QUEUE: usize = 1024;

/// What [`isolate`] needs to reach the cluster.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    pub cache: std::sync::Arc<Cache>,
    /// Our identity, for Events (`reportingInstance`).
    pub identity: String,
    pub events: EventSink,
    /// Label keys the relabelling keeps unless a selector can only be left by removing
    /// them (`--keep-label`), so selectors of NetworkPolicies, monitors and dashboards on
    /// those keys keep matching the isolated pod.
    pub keep_labels: BTreeSet<String>,
    /// How long after its delete time a pod isolated for a caller goes back into its
    /// Services if that caller never removed it ([`RESTORE_AFTER`] unless tests shorten it).
    pub restore_after: std::time::Duration,
}

pub(crate) fn is_status(err: &kube::Error, codes: &[u16]) -> bool {
    matches!(err, kube::Error::Api(s) if codes.contains(&s.code))
}

/// A refusal that says nothing about the request: throttled (429), a server error or
/// timeout (5xx), or no answer at all (a transport error).
fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// First pause of a refund after a transient failure; doubles up to [`REFUND_PAUSE_MAX`].
const REFUND_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest pause between two attempts of a refund.
const REFUND_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Isolates `pod`: PDB accounting, then the relabelling patch, then an Event.
pub async fn isolate(
    ctx: &Context,
    pod: &PodFacts,
    snap: &Snapshot,
    plan: Plan,
    now: Timestamp,
) -> Result<Outcome, Error> {
    let started = std::time::Instant::now();
    let (mut policy, controller, recreate) = owner_policy(ctx, pod).await?;
    if let Some(deployment) = recreate {
        return Err(Error::Recreate {
            pod: pod_ref(pod),
            deployment,
        });
    }
    if let Some(service) = service_left_only_by_pinned(&pod.labels, &snap.services, &policy.pinned)
    {
        let owner = pod
            .owner
            .as_ref()
            .map(|(kind, name)| format!("{} {name}", kind.name()))
            .unwrap_or_default();
        return Err(Error::ControllerSelector {
            pod: pod_ref(pod),
            owner,
            service: service.name.clone(),
        });
    }
    policy.keep.extend(ctx.keep_labels.iter().cloned());
    let leave = leave_selectors(snap, policy.leave);
    let removed = labels_to_remove(&pod.labels, &leave, &policy.keep, &policy.pinned);
    let (charged, uncharged) = match account(ctx, pod, snap, plan.charge, now).await? {
        Accounting::Refused(budget) => return Ok(Outcome::Refused(budget)),
        Accounting::Charged(pdb) => (Some(pdb), None),
        Accounting::Free => (None, None),
        Accounting::Uncharged(pdb) => (None, Some(pdb)),
    };
    let plan = plan.counted_from_now(started.elapsed());
    // A pod its PDB still selects after isolation (a StatefulSet's pod behind a budget on
    // the StatefulSet's own labels, a budget on a kept label) cannot be evicted by its
    // caller once due: its own disruption spent the budget, and the API server charges
    // every eviction again (`checkAndDecrement` in pkg/registry/core/pod/storage/
    // eviction.go exempts no pod already in `disruptedPods`). The deleter removes it.
    let in_pdb = snap
        .pdbs
        .iter()
        .any(|pdb| !removed.keys().any(|k| pdb.selector_keys.contains(k)));
    let on_due = if in_pdb { OnDue::Deleter } else { plan.on_due };
    let restore = (on_due == OnDue::Caller).then(|| restore_at(plan.delete_at, ctx.restore_after));
    let mut patch = isolation_patch(pod, &removed, plan.delete_at, plan.grace_period, restore);
    if let Some(controller) = controller {
        patch.0.extend(controller_handover(pod, controller));
    }
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &pod.namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let patched = api
        .patch(&pod.name, &params, &kube::api::Patch::Json::<()>(patch))
        .await;
    if let Err(source) = patched {
        // The pod was not isolated: give the disruption back, or the budget stays spent
        // (and real evictions refused) until the disruption controller drops the entry.
        if let Some(pdb) = &charged {
            refund_disruption(ctx, &pod.namespace, pdb, &pod.name).await;
        }
        return Err(match source {
            // 409: resourceVersion moved; 422: a `test` op failed (how the API server
            // reports it) — or a real validation error, told apart by re-reading the pod;
            // 404: the pod (read from a node's watch) is gone, which the re-read tells.
            kube::Error::Api(status) if matches!(status.code, 404 | 409 | 422) => Error::Conflict {
                pod: pod_ref(pod),
                code: status.code,
            },
            source => api_err(pod, "patch pod", source),
        });
    }
    ctx.cache
        .set_isolated(&pod.namespace, &pod.name, Some(plan.delete_at));
    let mut message = format!(
        "Isolated from its Services and controller (removed labels: {}); deletion at {}",
        removed.keys().cloned().collect::<Vec<_>>().join(", "),
        plan.delete_at
    );
    if let Some(pdb) = &uncharged {
        message.push_str(&format!(
            "; PDB {pdb} had no disruption left, not charged (a DELETE is never blocked by a PDB)"
        ));
    }
    record_event(ctx, pod, Severity::Normal, REASON_ISOLATED, &message, now).await;
    Ok(Outcome::Isolated {
        removed,
        uncharged,
        delete_at: plan.delete_at,
    })
}

/// How the isolation was accounted in the pod's PDB.
enum Accounting {
    /// This call recorded the disruption in the named PDB (refunded if the patch fails).
    Charged(String),
    /// No PDB selects the pod, or it was already listed as disrupted.
    Free,
    /// A DELETE goes ahead without charging the named PDB (`namespace/name`).
    Uncharged(String),
    /// The budget refuses an eviction.
    Refused(Budget),
}

/// Records the disruption in the single PDB selecting the pod.
async fn account(
    ctx: &Context,
    pod: &PodFacts,
    snap: &Snapshot,
    charge: Charge,
    now: Timestamp,
) -> Result<Accounting, Error> {
    let pdb = match snap.pdbs.as_slice() {
        [] => return Ok(Accounting::Free),
        [pdb] => pdb.name.clone(),
        // Several PDBs: an eviction never gets here; a DELETE cannot charge them all.
        [first, ..] => {
            let name = format!("{}/{}", pod.namespace, first.name);
            return Ok(Accounting::Uncharged(name));
        }
    };
    let result = consume_disruption(ctx, &pod.namespace, &pdb, &pod.name, now).await;
    let name = format!("{}/{pdb}", pod.namespace);
    match (charge, result) {
        (_, Ok(Budget::Consumed)) => Ok(Accounting::Charged(pdb)),
        (_, Ok(Budget::Listed)) => Ok(Accounting::Free),
        (Charge::Required, Ok(refused)) => Ok(Accounting::Refused(refused)),
        (Charge::Required, Err(error)) => Err(error),
        (Charge::IfPossible, Ok(_)) => Ok(Accounting::Uncharged(name)),
        (Charge::IfPossible, Err(error)) => {
            tracing::warn!(%error, "PDB not charged; a DELETE is isolated anyway");
            Ok(Accounting::Uncharged(name))
        }
    }
}

/// Gives back the disruption this call recorded for `pod` in PDB `namespace/name`: the pod
/// leaves `status.disruptedPods` and `disruptionsAllowed` goes up by one, in one
/// resourceVersion-guarded update (retried on 409, and after a short pause on a throttled
/// or failed call: the refund usually follows a relabel that was itself throttled, and a
/// charge left behind would hold the budget's disruption for two minutes — the caller
/// retrying at once would find the budget spent). Failures are logged; the disruption
/// controller drops the entry after about two minutes anyway.
pub async fn refund_disruption(ctx: &Context, namespace: &str, name: &str, pod: &str) {
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace);
    let gate = ctx.cache.pdb_gate(namespace, name);
    let _serialised = gate.turn.lock().await;
    let mut pause = REFUND_PAUSE;
    for _ in 0..PDB_ATTEMPTS {
        let mut pdb = match api.get(name).await {
            Ok(pdb) => pdb,
            Err(error) if is_transient(&error) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(REFUND_PAUSE_MAX);
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, pdb = %format!("{namespace}/{name}"), "refund PDB: read");
                return;
            }
        };
        let Some(status) = pdb.status.as_mut() else {
            return;
        };
        if status
            .disrupted_pods
            .as_mut()
            .and_then(|d| d.remove(pod))
            .is_none()
        {
            return;
        }
        status.disruptions_allowed += 1;
        match api.replace_status(name, &PostParams::default(), &pdb).await {
            Ok(updated) => {
                ctx.cache.apply_pdb(&updated);
                return;
            }
            Err(e) if is_status(&e, &[409]) => continue,
            Err(error) if is_transient(&error) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(REFUND_PAUSE_MAX);
            }
            Err(error) => {
                tracing::warn!(%error, pdb = %format!("{namespace}/{name}"), "refund PDB: update");
                return;
            }
        }
    }
}

/// JSON-patch ops handing the controller role of an isolated ReplicaSet pod to the
/// ReplicaSet's own controller (the Deployment): the ReplicaSet then ignores the pod
/// instead of releasing it, `kubectl drain` still sees a pod with a controller, and the
/// garbage collector still deletes it with the Deployment. The ReplicaSet stays an owner,
/// without the controller flag.
pub fn controller_handover(pod: &PodFacts, controller: Value) -> Vec<PatchOperation> {
    let mut refs: Vec<Value> = pod
        .owner_refs
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                r["controller"] = Value::Bool(false);
                if let Some(map) = r.as_object_mut() {
                    map.remove("blockOwnerDeletion");
                }
            }
            r
        })
        .collect();
    refs.push(controller);
    vec![
        PatchOperation::Test(TestOperation {
            path: ptr(&["metadata", "ownerReferences"]),
            value: Value::Array(pod.owner_refs.clone()),
        }),
        PatchOperation::Replace(ReplaceOperation {
            path: ptr(&["metadata", "ownerReferences"]),
            value: Value::Array(refs),
        }),
    ]
}

fn pod_ref(pod: &PodFacts) -> String {
    format!("{}/{}", pod.namespace, pod.name)
}

fn api_err(pod: &PodFacts, action: &str, source: kube::Error) -> Error {
    Error::Api {
        pod: pod_ref(pod),
        action: action.to_string(),
        source,
    }
}

/// The selectors to leave: selecting Services (with a selector; not headless ones, which
/// balance nothing — a StatefulSet's governing Service keeps its pods' DNS names while they
/// serve, and its selector is usually the StatefulSet's own, which the pod must keep),
/// selecting PDBs (so the isolated pod stops counting as healthy) and whatever the owner
/// policy adds.
pub fn leave_selectors(snap: &Snapshot, owner: Vec<BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let mut leave = owner;
    leave.extend(
        snap.services
            .iter()
            .filter(|s| !s.selector.is_empty() && s.service_type != ServiceType::Headless)
            .map(|s| s.selector.keys().cloned().collect()),
    );
    leave.extend(
        snap.pdbs
            .iter()
            .filter(|p| !p.selector_keys.is_empty())
            .map(|p| p.selector_keys.clone()),
    );
    leave
}

/// Reads the controlling owner's selector and derives the relabelling policy, plus (for
/// a ReplicaSet pod) the ReplicaSet's own controller reference to hand the pod to. A
/// missing owner (already deleted) is treated as a bare pod. A controller read for an
/// earlier pod of the drain is reused (see [`crate::cache::Owners`]), so a
/// ReplicaSet of 30 pods costs one read, not 30.
async fn owner_policy(
    ctx: &Context,
    pod: &PodFacts,
) -> Result<(OwnerPolicy, Option<Value>, Option<String>), Error> {
    let Some((kind, name)) = &pod.owner else {
        return Ok((OwnerPolicy::default(), None, None));
    };
    let gvk = match kind {
        OwnerKind::ReplicaSet => GroupVersionKind::gvk("apps", "v1", "ReplicaSet"),
        OwnerKind::StatefulSet => GroupVersionKind::gvk("apps", "v1", "StatefulSet"),
        OwnerKind::DaemonSet => GroupVersionKind::gvk("apps", "v1", "DaemonSet"),
        OwnerKind::Job => GroupVersionKind::gvk("batch", "v1", "Job"),
        OwnerKind::Other(_) => return Ok((OwnerPolicy::default(), None, None)),
    };
    let uid = controller_uid(pod);
    if let Some(facts) = uid.and_then(|uid| ctx.cache.owner(uid)) {
        return Ok(policy_of(kind, facts));
    }
    // One read per controller among concurrent isolations: wait for the turn, then look
    // again, since the isolation before may have read it meanwhile.
    let _turn = match uid {
        Some(uid) => Some(ctx.cache.owner_read_turn(uid).await),
        None => None,
    };
    if let Some(facts) = uid.and_then(|uid| ctx.cache.owner(uid)) {
        return Ok(policy_of(kind, facts));
    }
    let resource = ApiResource::from_gvk(&gvk);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &pod.namespace, &resource);
    let owner = match api.get_opt(name).await {
        Ok(Some(owner)) => owner,
        Ok(None) => return Ok((OwnerPolicy::default(), None, None)),
        Err(source) => return Err(api_err(pod, &format!("get {} {name}", gvk.kind), source)),
    };
    let mut facts = OwnerFacts {
        selector_keys: owner
            .data
            .pointer("/spec/selector")
            .cloned()
            .and_then(|v| serde_json::from_value::<LabelSelector>(v).ok())
            .map(|s| selector_keys(&s))
            .unwrap_or_default(),
        controller: match kind {
            OwnerKind::ReplicaSet => owner
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))
                .map(|r| {
                    serde_json::json!({"apiVersion": r.api_version, "kind": r.kind,
                        "name": r.name, "uid": r.uid, "controller": true})
                }),
            _ => None,
        },
        recreate: None,
    };
    if let Some(deployment) = facts.controller.as_ref().and_then(deployment_name) {
        facts.recreate = recreate_deployment(ctx, pod, &deployment).await?;
    }
    // Only the object the pod's reference names is remembered under its UID.
    if let Some(uid) = uid.filter(|uid| owner.metadata.uid.as_deref() == Some(*uid)) {
        ctx.cache.remember_owner(uid, facts.clone());
    }
    Ok(policy_of(kind, facts))
}

fn policy_of(kind: &OwnerKind, facts: OwnerFacts) -> (OwnerPolicy, Option<Value>, Option<String>) {
    (
        OwnerPolicy::for_owner(kind, facts.selector_keys),
        facts.controller,
        facts.recreate,
    )
}

/// The name of the Deployment a ReplicaSet's controller reference names, if it does.
fn deployment_name(controller: &Value) -> Option<String> {
    (controller.get("kind")?.as_str()? == "Deployment"
        && controller.get("apiVersion")?.as_str()? == "apps/v1")
        .then(|| controller.get("name")?.as_str().map(str::to_string))
        .flatten()
}

/// `namespace/name` of Deployment `name` when its strategy is Recreate (one read per
/// ReplicaSet, remembered with it); a Deployment already gone protects nothing.
async fn recreate_deployment(
    ctx: &Context,
    pod: &PodFacts,
    name: &str,
) -> Result<Option<String>, Error> {
    let api = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        ctx.client.clone(),
        &pod.namespace,
    );
    let deployment = api
        .get_opt(name)
        .await
        .map_err(|source| api_err(pod, &format!("get Deployment {name}"), source))?;
    let recreate = deployment
        .and_then(|d| d.spec?.strategy?.type_)
        .is_some_and(|t| t == "Recreate");
    Ok(recreate.then(|| format!("{}/{name}", pod.namespace)))
}

/// The pod's controller reference, as sent.
fn controller_ref(pod: &PodFacts) -> Option<&Value> {
    pod.owner_refs
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// The UID in the pod's controller reference.
fn controller_uid(pod: &PodFacts) -> Option<&str> {
    controller_ref(pod)?.get("uid")?.as_str()
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// Label keys naming the application, in order of preference; the first one the pod
/// carries gives the draining label its value.
pub const IDENTITY_LABELS: [&str; 3] = ["app.kubernetes.io/name", "app", "k8s-app"];

/// The value of the draining label: the application's name from the first identity label
/// the pod carries (so `kubectl get pods -L graceful-drain.io/draining` and selectors like
/// `graceful-drain.io/draining=web` still tell whose pod it is after its `app` label was
/// removed), else `true`.
pub fn draining_value(labels: &BTreeMap<String, String>) -> String {
    IDENTITY_LABELS
        .iter()
        .find_map(|key| labels.get(*key))
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| "true".to_string())
}

/// The JSON patch isolating `pod`: tests on resourceVersion and labels, removal of
/// `removed`, the draining label and the annotations the deleter resumes from.
pub fn isolation_patch(
    pod: &PodFacts,
    removed: &BTreeMap<String, String>,
    delete_at: Timestamp,
    grace_period: Option<i64>,
    restore_at: Option<Timestamp>,
) -> Patch {
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: ptr(&["metadata", "resourceVersion"]),
        value: Value::from(pod.resource_version.clone()),
    })];
    let add = |path: PointerBuf, value: Value| PatchOperation::Add(AddOperation { path, value });
    let draining = draining_value(&pod.labels);
    if pod.labels.is_empty() {
        let labels = serde_json::json!({ DRAINING_LABEL: draining });
        ops.push(add(ptr(&["metadata", "labels"]), labels));
    } else {
        ops.push(PatchOperation::Test(TestOperation {
            path: ptr(&["metadata", "labels"]),
            value: serde_json::to_value(&pod.labels).unwrap_or(Value::Null),
        }));
        for key in removed.keys() {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: ptr(&["metadata", "labels", key]),
            }));
        }
        ops.push(add(
            ptr(&["metadata", "labels", DRAINING_LABEL]),
            draining.into(),
        ));
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ORIGINAL_LABELS_ANNOTATION,
        serde_json::to_string(removed).unwrap_or_else(|_| "{}".into()),
    );
    annotations.insert(DELETE_AT_ANNOTATION, delete_at.to_string());
    if let Some(grace) = grace_period {
        annotations.insert(GRACE_PERIOD_ANNOTATION, grace.to_string());
    }
    if let Some(at) = restore_at {
        annotations.insert(RESTORE_AT_ANNOTATION, at.to_string());
    }
    if pod.annotations.is_empty() {
        let value = serde_json::to_value(&annotations).unwrap_or(Value::Null);
        ops.push(add(ptr(&["metadata", "annotations"]), value));
    } else {
        for (key, value) in annotations {
            ops.push(add(ptr(&["metadata", "annotations", key]), value.into()));
        }
    }
    Patch(ops)
}

/// Charges waiting for their turn on one PDB, and the turn itself.
///
/// Concurrent isolations of pods behind one budget (a drain evicting 16 pods of one
/// Deployment at once) would otherwise write the PDB's status once each, one after the
/// other. Whoever gets the turn charges every pod waiting at that moment in one
/// resourceVersion-guarded update and hands each its answer, so the writes come in
/// groups: the budget arithmetic is the same, applied pod by pod in arrival order.
#[derive(Debug, Default)]
pub struct PdbGate {
    /// Held while one caller reads and writes the PDB (charges and refunds).
    pub turn: tokio::sync::Mutex<()>,
    waiting: std::sync::Mutex<Vec<Waiter>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// A pod waiting for its charge. `None` as the answer: the group's write failed, and the
/// waiter charges again itself (so every error is met by the call it belongs to).
#[derive(Debug)]
struct Waiter {
    id: u64,
    pod: String,
    answer: tokio::sync::oneshot::Sender<Option<Budget>>,
}

/// Records the disruption of `pod` in PDB `namespace/name`, serialised by resourceVersion
/// and grouped with the charges waiting beside it (see [`PdbGate`]). The cached PDB is
/// only a first guess: a refusal is confirmed on the live PDB, so a stale cache never
/// refuses (nor, on the eviction path, lets through) what the API server would decide
/// otherwise.
pub async fn consume_disruption(
    ctx: &Context,
    namespace: &str,
    name: &str,
    pod: &str,
    now: Timestamp,
) -> Result<Budget, Error> {
    let gate = ctx.cache.pdb_gate(namespace, name);
    loop {
        let id = gate
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (answer, mut answered) = tokio::sync::oneshot::channel();
        lock_waiting(&gate).push(Waiter {
            id,
            pod: pod.to_string(),
            answer,
        });
        let _turn = gate.turn.lock().await;
        match answered.try_recv() {
            // A group before ours charged this pod.
            Ok(Some(budget)) => return Ok(budget),
            // That group's write failed: queue again and take a turn.
            Ok(None) | Err(tokio::sync::oneshot::error::TryRecvError::Closed) => continue,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
        }
        // A waiter whose admission call gave up (its deadline) is not charged.
        let group: Vec<Waiter> = std::mem::take(&mut *lock_waiting(&gate))
            .into_iter()
            .filter(|w| w.id == id || !w.answer.is_closed())
            .collect();
        let pods: Vec<&str> = group.iter().map(|w| w.pod.as_str()).collect();
        let result = charge_group(ctx, namespace, name, &pods, pod, now).await;
        let mut ours = None;
        match result {
            Ok(budgets) => {
                for (waiter, budget) in group.into_iter().zip(budgets) {
                    if waiter.id == id {
                        ours = Some(budget);
                    } else if let Err(Some(Budget::Consumed)) = waiter.answer.send(Some(budget)) {
                        // Its call gave up while the group was written: give the
                        // disruption back, as a failed relabel does.
                        let (ctx, namespace, name) =
                            (ctx.clone(), namespace.to_string(), name.to_string());
                        tokio::spawn(async move {
                            refund_disruption(&ctx, &namespace, &name, &waiter.pod).await;
                        });
                    }
                }
            }
            Err(error) => {
                for waiter in group {
                    let _ = waiter.answer.send(None);
                }
                return Err(error);
            }
        }
        if let Some(budget) = ours {
            return Ok(budget);
        }
    }
}

fn lock_waiting(gate: &PdbGate) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
    gate.waiting.lock().unwrap_or_else(|e| e.into_inner())
}

/// Charges `pods` (in order) to PDB `namespace/name` in one status update, retried on
/// 409; errors name `pod`, the caller's own pod.
async fn charge_group(
    ctx: &Context,
    namespace: &str,
    name: &str,
    pods: &[&str],
    pod: &str,
    now: Timestamp,
) -> Result<Vec<Budget>, Error> {
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace);
    let pod_name = format!("{namespace}/{pod}");
    let err = |action: &str, source| Error::Api {
        pod: pod_name.clone(),
        action: format!("{action} PDB {namespace}/{name}"),
        source,
    };
    let (mut current, mut live) = match ctx.cache.pdb(namespace, name) {
        Some(pdb) => ((*pdb).clone(), false),
        None => (api.get(name).await.map_err(|e| err("get", e))?, true),
    };
    let mut conflicts = 0;
    loop {
        let (next, budgets) = charge_all(&current, pods, now);
        if !live && budgets.iter().any(|b| !b.allows()) {
            current = api.get(name).await.map_err(|e| err("get", e))?;
            live = true;
            continue;
        }
        let Some(next) = next else {
            return Ok(budgets);
        };
        match api
            .replace_status(name, &PostParams::default(), &next)
            .await
        {
            Ok(updated) => {
                ctx.cache.apply_pdb(&updated);
                return Ok(budgets);
            }
            Err(e) if is_status(&e, &[409]) => {
                conflicts += 1;
                if conflicts >= PDB_ATTEMPTS {
                    return Err(Error::PdbContention {
                        pod: pod_name,
                        pdb: format!("{namespace}/{name}"),
                    });
                }
                let max = PDB_RETRY_MAX_PAUSE.as_millis() as u64;
                let pause = rand::random_range(0..=max);
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                current = api.get(name).await.map_err(|e| err("get", e))?;
                live = true;
            }
            Err(e) => return Err(err("update status of", e)),
        }
    }
}

/// [`charge`] applied to `pods` one after another: the PDB with every disruption it
/// allowed recorded (`None` when nothing changed) and each pod's answer.
pub fn charge_all(
    pdb: &PodDisruptionBudget,
    pods: &[&str],
    now: Timestamp,
) -> (Option<PodDisruptionBudget>, Vec<Budget>) {
    let mut next: Option<PodDisruptionBudget> = None;
    let budgets = pods
        .iter()
        .map(|pod| match charge(next.as_ref().unwrap_or(pdb), pod, now) {
            Ok(Some(charged)) => {
                next = Some(charged);
                Budget::Consumed
            }
            Ok(None) => Budget::Listed,
            Err(refused) => refused,
        })
        .collect();
    (next, budgets)
}

/// The PDB with `pod` charged as disrupted: `Ok(None)` when already listed, `Err` when
/// the budget refuses. Pure, so the accounting rules are table-tested.
pub fn charge(
    pdb: &PodDisruptionBudget,
    pod: &str,
    now: Timestamp,
) -> Result<Option<PodDisruptionBudget>, Budget> {
    let name = format!(
        "{}/{}",
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
        pdb.metadata.name.as_deref().unwrap_or_default()
    );
    let status = pdb.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(-1) < pdb.metadata.generation.unwrap_or(0) {
        return Err(Budget::NotObserved { pdb: name });
    }
    if status
        .disrupted_pods
        .as_ref()
        .is_some_and(|d| d.contains_key(pod))
    {
        return Ok(None);
    }
    if status.disruptions_allowed <= 0 {
        return Err(Budget::Exhausted { pdb: name });
    }
    let mut next = pdb.clone();
    let mut status = status;
    status.disruptions_allowed -= 1;
    status
        .disrupted_pods
        .get_or_insert_with(BTreeMap::new)
        .insert(pod.to_string(), Time(now));
    next.status = Some(status);
    Ok(Some(next))
}

/// The `type` of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// Records a core/v1 Event on `pod`; failures are logged, never fatal. With a queued sink
/// the Event is sent in the background and this returns at once.
pub async fn record_event(
    ctx: &Context,
    pod: &PodFacts,
    severity: Severity,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", pod.name)),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some(
            match severity {
                Severity::Normal => "Normal",
                Severity::Warning => "Warning",
            }
            .into(),
        ),
        source: Some(EventSource {
            component: Some("graceful-drain-webhook".into()),
            host: None,
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some("graceful-drain.io/webhook".into()),
        reporting_instance: Some(ctx.identity.clone()),
        ..Event::default()
    };
    match &ctx.events {
        EventSink::Inline => super::events::create(&ctx.client, event).await,
        EventSink::Queue(queue) => {
            let queued = super::events::Queued {
                event,
                controller: controller_reference(pod),
            };
            match queue.try_send(queued) {
                Ok(()) => {}
                // The sender has stopped (shutdown: the uninstall work's Events come after
                // it): sent from here instead.
                Err(tokio::sync::mpsc::error::TrySendError::Closed(queued)) => {
                    super::events::create(&ctx.client, queued.event).await;
                }
                Err(error) => {
                    tracing::warn!(pod = %pod_ref(pod), reason, %error, "event queue full; event dropped");
                }
            }
        }
    }
}

/// The controller reference of `pod` as an Event's involvedObject would name it.
fn controller_reference(pod: &PodFacts) -> Option<ObjectReference> {
    let controller = controller_ref(pod)?;
    let field = |name: &str| {
        controller
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some(ObjectReference {
        api_version: field("apiVersion"),
        kind: field("kind"),
        name: field("name"),
        namespace: Some(pod.namespace.clone()),
        uid: field("uid"),
        ..ObjectReference::default()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use http::Method;
    use serde_json::json;

    use super::*;
    use crate::decide::{PdbFacts, ServiceFacts, ServiceType};
    use crate::review::IntoFacts as _;
    use graceful_drain_testing::fixtures::mock::{self, expect};
    use graceful_drain_testing::fixtures::{self, PdbFixture, PodFixture, to_json};

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    /// `web/web-1` of ReplicaSet `web-abc`, serving, at resourceVersion 41.
    fn pod() -> PodFacts {
        fixtures::pod("web-1")
            .ns("web")
            .with_uid("uid-1")
            .at_version("41")
            .with_labels(&[("app", "web"), ("pod-template-hash", "abc"), ("team", "a")])
            .annotate("note", "x")
            .running()
            .ready()
            .owned_by_rs("web-abc")
            .facts()
    }

    /// The budget `web/web` (minAvailable 2 of 3 healthy) at resourceVersion `rv`; the
    /// server's tests use it too.
    pub(crate) fn pdb_json(rv: &str, allowed: i32) -> Value {
        to_json(
            &fixtures::pdb("web")
                .ns("web")
                .at_version(rv)
                .generation(1)
                .selecting(&[("app", "web")])
                .min_available(2)
                .healthy(3, 2, 3)
                .allowing(allowed),
        )
    }

    fn evict_plan() -> Plan {
        Plan {
            delete_at: now(),
            grace_period: None,
            charge: Charge::Required,
            on_due: OnDue::Caller,
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            services: vec![ServiceFacts {
                name: "web".into(),
                service_type: ServiceType::LoadBalancer,
                selector: [("app".to_string(), "web".to_string())].into(),
                selects_pod: false,
            }],
            pdbs: vec![PdbFacts {
                name: "web".into(),
                disruptions_allowed: 1,
                observed: true,
                lists_pod: false,
                selector_keys: ["app".to_string()].into(),
            }],
            ..Snapshot::default()
        }
    }

    fn context(client: kube::Client) -> Context {
        let cache = Arc::new(Cache::default());
        cache.apply_pdb(&serde_json::from_value(pdb_json("1", 1)).unwrap());
        Context {
            client,
            cache,
            identity: "webhook-0".into(),
            events: EventSink::Inline,
            keep_labels: Default::default(),
            restore_after: RESTORE_AFTER,
        }
    }

    #[tokio::test]
    async fn isolation_sends_pdb_update_then_guarded_patch_then_event() {
        let (client, mut api) = mock::client();
        let ctx = context(client);
        let delete_at: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let task = tokio::spawn(async move {
            let plan = Plan {
                delete_at,
                grace_period: Some(20),
                charge: Charge::Required,
                on_due: OnDue::Caller,
            };
            isolate(&ctx, &pod(), &snapshot(), plan, now()).await
        });
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}}});
        expect(
            &mut api,
            Method::GET,
            "/apis/apps/v1/namespaces/web/replicasets/web-abc",
            200,
            rs,
        )
        .await;
        // The cached PDB is stale: the first update conflicts, we re-read and retry.
        let pdb_path = "/apis/policy/v1/namespaces/web/poddisruptionbudgets/web";
        let status_path = format!("{pdb_path}/status");
        let first = expect(
            &mut api,
            Method::PUT,
            &status_path,
            409,
            mock::status(409, "Conflict"),
        )
        .await;
        assert_eq!(first.body["metadata"]["resourceVersion"], "1");
        expect(&mut api, Method::GET, pdb_path, 200, pdb_json("2", 1)).await;
        let update = expect(&mut api, Method::PUT, &status_path, 200, pdb_json("3", 0)).await;
        assert_eq!(update.body["metadata"]["resourceVersion"], "2");
        assert_eq!(update.body["status"]["disruptionsAllowed"], 0);
        assert_eq!(
            update.body["status"]["disruptedPods"]["web-1"],
            "2026-01-01T00:00:00Z"
        );

        let patch = expect(
            &mut api,
            Method::PATCH,
            "/api/v1/namespaces/web/pods/web-1",
            200,
            json!({}),
        )
        .await;
        assert_eq!(patch.content_type, "application/json-patch+json");
        assert_eq!(
            patch.body,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                {"op": "test", "path": "/metadata/labels",
                 "value": {"app": "web", "pod-template-hash": "abc", "team": "a"}},
                {"op": "remove", "path": "/metadata/labels/app"},
                {"op": "remove", "path": "/metadata/labels/pod-template-hash"},
                {"op": "add", "path": "/metadata/labels/graceful-drain.io~1draining", "value": "web"},
                {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1delete-at",
                 "value": "2026-01-01T00:01:00Z"},
                {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1grace-period-seconds",
                 "value": "20"},
                {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1original-labels",
                 "value": "{\"app\":\"web\",\"pod-template-hash\":\"abc\"}"},
                // Isolated for an eviction: its caller removes it, else it goes back a
                // minute after its delete time.
                {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1restore-at",
                 "value": "2026-01-01T00:02:00Z"},
            ])
        );
        let event = expect(
            &mut api,
            Method::POST,
            "/api/v1/namespaces/web/events",
            201,
            json!({}),
        )
        .await;
        assert_eq!(event.body["reason"], REASON_ISOLATED);
        assert_eq!(event.body["involvedObject"]["uid"], "uid-1");
        let outcome = task.await.unwrap().unwrap();
        assert_eq!(
            outcome,
            Outcome::Isolated {
                removed: [("app", "web"), ("pod-template-hash", "abc")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                uncharged: None,
                delete_at,
            }
        );
    }

    /// The second pod of a ReplicaSet is isolated without reading the ReplicaSet again;
    /// a ReplicaSet of the same name but another UID is read afresh.
    #[tokio::test]
    async fn a_replica_set_read_once_serves_its_other_pods() {
        let (client, mut api) = mock::client();
        let ctx = context(client);
        let unbudgeted = Snapshot {
            pdbs: vec![],
            ..snapshot()
        };
        let task = tokio::spawn(async move {
            let plan = || Plan {
                delete_at: "2026-01-01T00:01:00Z".parse().unwrap(),
                grace_period: None,
                charge: Charge::Required,
                on_due: OnDue::Caller,
            };
            let mut second = pod();
            second.name = "web-2".into();
            second.uid = "uid-2".into();
            let mut recreated = pod();
            recreated.name = "web-3".into();
            recreated.owner_refs[0]["uid"] = json!("web-abc-uid-2");
            let mut outcomes = Vec::new();
            for p in [pod(), second, recreated] {
                outcomes.push(isolate(&ctx, &p, &unbudgeted, plan(), now()).await);
            }
            outcomes
        });
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "web", "uid": "web-abc-uid"},
            "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}}});
        let rs_path = "/apis/apps/v1/namespaces/web/replicasets/web-abc";
        expect(&mut api, Method::GET, rs_path, 200, rs.clone()).await;
        for name in ["web-1", "web-2"] {
            let path = format!("/api/v1/namespaces/web/pods/{name}");
            expect(&mut api, Method::PATCH, &path, 200, json!({})).await;
            let events = "/api/v1/namespaces/web/events";
            expect(&mut api, Method::POST, events, 201, json!({})).await;
        }
        expect(&mut api, Method::GET, rs_path, 200, rs).await;
        let path = "/api/v1/namespaces/web/pods/web-3";
        expect(&mut api, Method::PATCH, path, 200, json!({})).await;
        let events = "/api/v1/namespaces/web/events";
        expect(&mut api, Method::POST, events, 201, json!({})).await;
        for outcome in task.await.unwrap() {
            assert!(
                matches!(outcome, Ok(Outcome::Isolated { .. })),
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn the_delay_counts_from_the_relabel_when_the_work_before_it_was_slow() {
        let plan = Plan {
            delete_at: "2026-01-01T00:01:00Z".parse().unwrap(),
            grace_period: None,
            charge: Charge::Required,
            on_due: OnDue::Caller,
        };
        let quick = plan.counted_from_now(std::time::Duration::from_millis(40));
        assert_eq!(quick, plan, "a quick relabel keeps the decided time");
        let throttled = plan.counted_from_now(std::time::Duration::from_millis(2_500));
        assert_eq!(
            throttled.delete_at,
            "2026-01-01T00:01:02.5Z".parse::<Timestamp>().unwrap(),
            "2.5 s of throttled accounting move the delete time by as much"
        );
    }

    /// `--keep-label app`: the pod leaves its Service (app+tier) and ReplicaSet
    /// (app+pod-template-hash) by losing only `tier` and `pod-template-hash`; `app` stays
    /// for NetworkPolicies and dashboards, and the draining label names the app. The
    /// controller role goes to the Deployment, the ReplicaSet stays a plain owner.
    #[tokio::test]
    async fn kept_labels_stay_and_the_deployment_becomes_the_controller() {
        let (client, mut api) = mock::client();
        let mut ctx = context(client);
        ctx.keep_labels = ["app".to_string()].into();
        let mut facts = pod();
        facts.labels = [
            ("app", "web"),
            ("tier", "front"),
            ("pod-template-hash", "abc"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let rs_ref = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
            "uid": "rs-uid", "controller": true, "blockOwnerDeletion": true});
        facts.owner_refs = vec![rs_ref];
        let snap = Snapshot {
            services: vec![ServiceFacts {
                name: "web".into(),
                service_type: ServiceType::LoadBalancer,
                selector: [("app", "web"), ("tier", "front")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                selects_pod: false,
            }],
            ..Snapshot::default()
        };
        let task = tokio::spawn(async move {
            let plan = Plan {
                delete_at: now(),
                grace_period: None,
                charge: Charge::IfPossible,
                on_due: OnDue::Caller,
            };
            isolate(&ctx, &facts, &snap, plan, now()).await
        });
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "web", "uid": "rs-uid",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                     "uid": "deploy-uid", "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}}});
        expect(
            &mut api,
            Method::GET,
            "/apis/apps/v1/namespaces/web/replicasets/web-abc",
            200,
            rs,
        )
        .await;
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "web", "uid": "deploy-uid"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {},
                     "strategy": {"type": "RollingUpdate"}}});
        expect(
            &mut api,
            Method::GET,
            "/apis/apps/v1/namespaces/web/deployments/web",
            200,
            deployment,
        )
        .await;
        let patch = expect(
            &mut api,
            Method::PATCH,
            "/api/v1/namespaces/web/pods/web-1",
            200,
            json!({}),
        )
        .await;
        let ops = patch.body.as_array().unwrap();
        let removed: Vec<&str> = ops
            .iter()
            .filter(|op| op["op"] == "remove")
            .map(|op| op["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            removed,
            [
                "/metadata/labels/pod-template-hash",
                "/metadata/labels/tier"
            ]
        );
        assert!(ops.contains(&json!({"op": "add",
            "path": "/metadata/labels/graceful-drain.io~1draining", "value": "web"})));
        let owners = ops
            .iter()
            .find(|op| op["op"] == "replace" && op["path"] == "/metadata/ownerReferences")
            .expect("controller handed over");
        assert_eq!(
            owners["value"],
            json!([
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs-uid", "controller": false},
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "deploy-uid", "controller": true},
            ])
        );
        expect(
            &mut api,
            Method::POST,
            "/api/v1/namespaces/web/events",
            201,
            json!({}),
        )
        .await;
        assert!(matches!(task.await.unwrap(), Ok(Outcome::Isolated { .. })));
    }

    /// A Recreate Deployment promises old and new pods never run together; an isolated
    /// pod would keep serving while the new ones start, so it is not isolated at all
    /// (the request goes through with a Warning Event saying why).
    #[tokio::test]
    async fn a_recreate_deployments_pod_is_not_isolated() {
        let (client, mut api) = mock::client();
        let ctx = context(client);
        let mut facts = pod();
        facts.owner_refs = vec![json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "web-abc", "uid": "rs-uid", "controller": true})];
        let task = tokio::spawn(async move {
            let plan = Plan {
                delete_at: now(),
                grace_period: None,
                charge: Charge::IfPossible,
                on_due: OnDue::Caller,
            };
            isolate(&ctx, &facts, &Snapshot::default(), plan, now()).await
        });
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "web", "uid": "rs-uid",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                     "uid": "deploy-uid", "controller": true}]},
            "spec": {"selector": {"matchLabels": {"app": "web"}}}});
        expect(
            &mut api,
            Method::GET,
            "/apis/apps/v1/namespaces/web/replicasets/web-abc",
            200,
            rs,
        )
        .await;
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "web", "uid": "deploy-uid"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {},
                     "strategy": {"type": "Recreate"}}});
        expect(
            &mut api,
            Method::GET,
            "/apis/apps/v1/namespaces/web/deployments/web",
            200,
            deployment,
        )
        .await;
        let err = task.await.unwrap().unwrap_err();
        assert!(err.is_permanent(), "{err}");
        assert_eq!(err.reason(), "recreate");
        assert!(
            err.to_string()
                .contains("Deployment web/web uses the Recreate strategy"),
            "{err}"
        );
    }
    /// The relabel is refused after the PDB was charged: the disruption is given back at
    /// once, so a pass-through eviction is not refused by a budget we spent for nothing.
    #[tokio::test]
    async fn a_failed_relabel_refunds_the_disruption_it_charged() {
        let (client, mut api) = mock::client();
        let ctx = context(client);
        let mut bare = pod();
        bare.owner = None;
        let task =
            tokio::spawn(
                async move { isolate(&ctx, &bare, &snapshot(), evict_plan(), now()).await },
            );
        let pdb_path = "/apis/policy/v1/namespaces/web/poddisruptionbudgets/web";
        let status_path = format!("{pdb_path}/status");
        expect(&mut api, Method::PUT, &status_path, 200, pdb_json("2", 0)).await;
        expect(
            &mut api,
            Method::PATCH,
            "/api/v1/namespaces/web/pods/web-1",
            403,
            mock::status(403, "Forbidden"),
        )
        .await;
        let mut charged = pdb_json("2", 0);
        charged["status"]["disruptedPods"] = json!({"web-1": "2026-01-01T00:00:00Z"});
        expect(&mut api, Method::GET, pdb_path, 200, charged).await;
        let refund = expect(&mut api, Method::PUT, &status_path, 200, pdb_json("3", 1)).await;
        assert_eq!(refund.body["metadata"]["resourceVersion"], "2");
        assert_eq!(refund.body["status"]["disruptionsAllowed"], 1);
        assert_eq!(refund.body["status"]["disruptedPods"], json!({}));
        let error = task.await.unwrap().unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(
            error.to_string().contains("isolate pod web/web-1"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn exhausted_pdb_after_reread_leaves_the_pod_alone() {
        let (client, mut api) = mock::client();
        let ctx = context(client);
        let task =
            tokio::spawn(
                async move { isolate(&ctx, &pod(), &snapshot(), evict_plan(), now()).await },
            );
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "web"}, "spec": {"selector": {}}});
        expect(
            &mut api,
            Method::GET,
            "/apis/apps/v1/namespaces/web/replicasets/web-abc",
            200,
            rs,
        )
        .await;
        let status_path = "/apis/policy/v1/namespaces/web/poddisruptionbudgets/web/status";
        expect(
            &mut api,
            Method::PUT,
            status_path,
            409,
            mock::status(409, "Conflict"),
        )
        .await;
        // Another replica took the last disruption in between.
        expect(
            &mut api,
            Method::GET,
            "/apis/policy/v1/namespaces/web/poddisruptionbudgets/web",
            200,
            pdb_json("2", 0),
        )
        .await;
        let outcome = task.await.unwrap().unwrap();
        assert_eq!(
            outcome,
            Outcome::Refused(Budget::Exhausted {
                pdb: "web/web".into()
            })
        );
    }

    #[tokio::test]
    async fn failed_test_op_is_a_conflict() {
        let (client, mut api) = mock::client();
        let ctx = context(client);
        let mut bare = pod();
        bare.owner = None;
        let snap = Snapshot {
            pdbs: Vec::new(),
            ..snapshot()
        };
        let task =
            tokio::spawn(async move { isolate(&ctx, &bare, &snap, evict_plan(), now()).await });
        expect(
            &mut api,
            Method::PATCH,
            "/api/v1/namespaces/web/pods/web-1",
            422,
            mock::status(422, "Invalid"),
        )
        .await;
        assert!(matches!(task.await.unwrap(), Err(Error::Conflict { .. })));
    }

    #[test]
    fn charging_a_pdb_follows_the_eviction_rules() {
        let pdb = |v: Value| serde_json::from_value::<PodDisruptionBudget>(v).unwrap();
        let next = charge(&pdb(pdb_json("5", 2)), "web-1", now())
            .unwrap()
            .unwrap();
        let status = next.status.unwrap();
        assert_eq!(status.disruptions_allowed, 1);
        assert!(status.disrupted_pods.unwrap().contains_key("web-1"));
        assert_eq!(next.metadata.resource_version.as_deref(), Some("5"));

        assert_eq!(
            charge(&pdb(pdb_json("5", 0)), "web-1", now()).unwrap_err(),
            Budget::Exhausted {
                pdb: "web/web".into()
            }
        );
        let mut listed = pdb_json("5", 0);
        listed["status"]["disruptedPods"] = json!({"web-1": "2026-01-01T00:00:00Z"});
        assert_eq!(charge(&pdb(listed), "web-1", now()), Ok(None));
        let mut unobserved = pdb_json("5", 3);
        unobserved["metadata"]["generation"] = json!(2);
        assert_eq!(
            charge(&pdb(unobserved), "web-1", now()).unwrap_err(),
            Budget::NotObserved {
                pdb: "web/web".into()
            }
        );
    }

    #[test]
    fn patch_for_a_pod_without_labels_or_annotations_creates_both_maps() {
        let mut bare = pod();
        bare.labels.clear();
        bare.annotations.clear();
        let patch =
            serde_json::to_value(isolation_patch(&bare, &BTreeMap::new(), now(), None, None))
                .unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                {"op": "add", "path": "/metadata/labels", "value": {"graceful-drain.io/draining": "true"}},
                {"op": "add", "path": "/metadata/annotations", "value": {
                    "graceful-drain.io/delete-at": "2026-01-01T00:00:00Z",
                    "graceful-drain.io/original-labels": "{}"}},
            ])
        );
    }

    /// [`charge_all`] applies the single-pod rules in arrival order: a repeated pod is
    /// listed, and the budget runs out part-way through the group.
    #[test]
    fn a_group_charge_follows_the_rules_pod_by_pod() {
        let pdb = |v: Value| serde_json::from_value::<PodDisruptionBudget>(v).unwrap();
        let (next, budgets) = charge_all(&pdb(pdb_json("5", 2)), &["a", "b", "a", "c"], now());
        assert_eq!(
            budgets,
            [
                Budget::Consumed,
                Budget::Consumed,
                Budget::Listed,
                Budget::Exhausted {
                    pdb: "web/web".into()
                }
            ]
        );
        let status = next.unwrap().status.unwrap();
        assert_eq!(status.disruptions_allowed, 0);
        assert_eq!(status.disrupted_pods.unwrap().len(), 2);
        let (next, budgets) = charge_all(&pdb(pdb_json("5", 0)), &["a"], now());
        assert!(next.is_none() && !budgets[0].allows());
    }

    /// A namespace `web` on the simulated API server: `count` serving pods `app=web` and
    /// PDB `web` (minAvailable `min_available`) whose status allows `allowed` disruptions.
    struct SimBudget {
        server: kube_sim::apiserver::ApiServer,
        shutdown: graceful_drain_core::runtime::Shutdown,
        pods: Api<Pod>,
        pdbs: Api<PodDisruptionBudget>,
        created: Vec<Pod>,
        pdb: PodDisruptionBudget,
    }

    impl SimBudget {
        async fn start(count: usize, min_available: usize, allowed: i32) -> SimBudget {
            use kube_sim::apiserver::{ApiServer, Config};
            let shutdown = graceful_drain_core::runtime::Shutdown::new();
            let mut config = Config::default();
            config.namespaces.push("web".into());
            let server = ApiServer::start(config, shutdown.clone()).await.unwrap();
            let pods: Api<Pod> = Api::namespaced(server.client("admin"), "web");
            // The pods' ReplicaSet, which each isolation must read for its selector.
            let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
                Api::namespaced(server.client("admin"), "web");
            use graceful_drain_testing::fixtures::ReplicaSetFixture;
            let set = fixtures::replica_set("web-rs")
                .ns("web")
                .replicas(count as i32)
                .selecting(&[("app", "web")]);
            let set = sets.create(&PostParams::default(), &set).await.unwrap();
            let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web-rs".into(),
                uid: set.metadata.uid.clone().unwrap(),
                controller: Some(true),
                ..Default::default()
            };
            let mut created = Vec::new();
            for i in 0..count {
                let mut pod = fixtures::pod(&format!("web-{i}"))
                    .ns("web")
                    .label("app", "web")
                    .container("web:1");
                pod.metadata.owner_references = Some(vec![owner.clone()]);
                created.push(pods.create(&PostParams::default(), &pod).await.unwrap());
            }
            let pdbs: Api<PodDisruptionBudget> = Api::namespaced(server.client("admin"), "web");
            let budget = fixtures::pdb("web")
                .ns("web")
                .selecting(&[("app", "web")])
                .min_available(min_available as i32);
            let budget = pdbs.create(&PostParams::default(), &budget).await.unwrap();
            let (n, min) = (count as i32, min_available as i32);
            let budget = budget.healthy(n, min, n).allowing(allowed);
            let pdb = pdbs
                .replace_status("web", &PostParams::default(), &budget)
                .await
                .unwrap();
            SimBudget {
                server,
                shutdown,
                pods,
                pdbs,
                created,
                pdb,
            }
        }

        /// A webhook replica acting as `user`, whose cache holds the PDB as set up.
        fn replica(&self, user: &str) -> Context {
            let cache = Arc::new(Cache::default());
            cache.apply_pdb(&self.pdb);
            Context {
                client: self.server.client(user),
                cache,
                identity: user.into(),
                events: EventSink::Inline,
                keep_labels: Default::default(),
                restore_after: RESTORE_AFTER,
            }
        }

        /// Evicts every pod at once, pod `i` through `replicas[i % replicas.len()]`;
        /// returns how many were isolated (the others must be refused by the budget).
        async fn evict_all(&mut self, replicas: &[Context]) -> usize {
            let tasks: Vec<_> = std::mem::take(&mut self.created)
                .into_iter()
                .enumerate()
                .map(|(i, pod)| {
                    let ctx = replicas[i % replicas.len()].clone();
                    tokio::spawn(async move {
                        isolate(&ctx, &pod.facts(), &snapshot(), evict_plan(), now()).await
                    })
                })
                .collect();
            let mut isolated = 0;
            for task in tasks {
                match task.await.unwrap().unwrap() {
                    Outcome::Isolated { .. } => isolated += 1,
                    Outcome::Refused(Budget::Exhausted { .. }) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            isolated
        }
    }

    /// Twelve evictions at once behind one budget allowing eight: eight pods are
    /// isolated, the budget is written in a few grouped updates, not eight, and their
    /// ReplicaSet is read once, not by every isolation that found it missing.
    #[tokio::test]
    async fn concurrent_charges_to_one_budget_are_written_together() {
        let mut sim = SimBudget::start(12, 4, 8).await;
        let replica = sim.replica("webhook");
        let before = sim.server.stats();
        assert_eq!(sim.evict_all(&[replica]).await, 8);
        let status = sim.pdbs.get("web").await.unwrap().status.unwrap();
        assert_eq!(status.disruptions_allowed, 0);
        assert_eq!(status.disrupted_pods.unwrap().len(), 8);
        let writes = sim
            .server
            .stats()
            .count("update", "poddisruptionbudgets/status")
            - before.count("update", "poddisruptionbudgets/status");
        assert!(writes <= 3, "{writes} status updates for 8 charges");
        let reads =
            sim.server.stats().count("get", "replicasets") - before.count("get", "replicasets");
        assert_eq!(
            reads, 1,
            "the ReplicaSet of 12 concurrent isolations read {reads} times"
        );
        sim.shutdown.cancel();
    }

    /// Three replicas with stale caches race to isolate six pods behind a PDB with
    /// minAvailable 4, on the simulated API server (resourceVersion-guarded status
    /// updates, JSON-patch `test` ops): exactly two are isolated and the budget lists
    /// both. An isolated pod never gets its labels back, so the four still serving at
    /// the end are the fewest that ever served.
    #[tokio::test]
    async fn concurrent_isolations_never_break_min_available() {
        use kube::api::ListParams;

        const MIN_AVAILABLE: usize = 4;
        let mut sim = SimBudget::start(6, MIN_AVAILABLE, 2).await;
        let replicas: Vec<Context> = (0..3).map(|r| sim.replica(&format!("w{r}"))).collect();
        assert_eq!(sim.evict_all(&replicas).await, 2);
        let draining = ListParams::default().labels(DRAINING_LABEL);
        assert_eq!(sim.pods.list(&draining).await.unwrap().items.len(), 2);
        let serving = ListParams::default().labels("app=web");
        let serving = sim.pods.list(&serving).await.unwrap().items.len();
        assert!(serving >= MIN_AVAILABLE, "only {serving} served");
        let status = sim.pdbs.get("web").await.unwrap().status.unwrap();
        assert_eq!(status.disruptions_allowed, 0);
        assert_eq!(status.disrupted_pods.unwrap().len(), 2);
        sim.shutdown.cancel();
    }
}
