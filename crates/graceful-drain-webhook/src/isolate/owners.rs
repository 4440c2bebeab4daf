//! Reading an isolated pod's controller: its selector's keys, a ReplicaSet's own
//! controller, a `Recreate` Deployment — once per controller among concurrent isolations.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use super::context::{Context, Error, api_err};
use crate::cache::selector_keys;
use crate::decide::{OwnerKind, OwnerPolicy, PodFacts};

/// What isolations read from pods' controllers, shared by this replica's admission calls
/// and its deleter.
#[derive(Debug, Default)]
pub struct OwnerReads {
    /// Controllers read by recent isolations, by UID (see [`Owners`]).
    owners: std::sync::Mutex<Owners>,
    /// Controller reads in flight, by controller UID: `kubectl drain` sends every eviction
    /// of a node at once, and without a turn each of a ReplicaSet's pods would miss
    /// [`Owners`] and read the ReplicaSet itself (257 reads for 500 pods in the drain
    /// bench).
    in_flight: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl OwnerReads {
    /// The controller with `uid` as an isolation read it less than `OWNER_TTL` (a minute) ago.
    pub fn get(&self, uid: &str) -> Option<OwnerFacts> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.get(uid, std::time::Instant::now())
    }

    /// Remembers what an isolation read from the controller with `uid`.
    pub fn remember(&self, uid: &str, facts: OwnerFacts) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.put(uid.to_string(), facts, std::time::Instant::now());
    }

    /// Waits for the turn to read the controller with `uid`; the isolations that waited
    /// behind the reader find its answer in [`OwnerReads::get`]. The turn ends when the
    /// returned guard is dropped.
    pub async fn turn(&self, uid: &str) -> OwnerReadTurn<'_> {
        let lock = {
            let mut reads = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            reads.entry(uid.to_string()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        OwnerReadTurn {
            reads: self,
            uid: uid.to_string(),
            _guard: guard,
        }
    }
}

/// One isolation's turn to read a controller (see [`OwnerReads::turn`]). Dropping it
/// lets the next waiter in, and forgets the turn's lock once nobody else holds it.
pub struct OwnerReadTurn<'a> {
    reads: &'a OwnerReads,
    uid: String,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for OwnerReadTurn<'_> {
    fn drop(&mut self) {
        let mut reads = self
            .reads
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Held by the map and by this turn's guard only: no isolation waits behind it.
        if reads
            .get(&self.uid)
            .is_some_and(|lock| Arc::strong_count(lock) <= 2)
        {
            reads.remove(&self.uid);
        }
    }
}

/// What the relabelling needs from a pod's controller: its selector's keys and, for a
/// ReplicaSet, its own controller reference (the Deployment the pod is handed to).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnerFacts {
    /// Label keys of the controller's `spec.selector` (empty when it has none we can read).
    pub selector_keys: BTreeSet<String>,
    /// A ReplicaSet's own controller reference (its Deployment's), as the JSON
    /// ownerReference the isolation hands the pod to; `None` for other kinds.
    pub controller: Option<serde_json::Value>,
    /// `namespace/name` of the ReplicaSet's Deployment when it rolls out with the
    /// `Recreate` strategy.
    pub recreate: Option<String>,
}

/// How long a controller read stays in [`Owners`]. A drain evicts the pods of one
/// ReplicaSet within seconds, so most of them reuse the first pod's read.
pub const OWNER_TTL: std::time::Duration = std::time::Duration::from_secs(60);
/// Most controllers remembered at once.
const OWNERS_MAX: usize = 4096;

/// Controllers read by recent isolations, keyed by UID. Keyed by UID, an entry never
/// describes a newer object of the same name; the selector of a ReplicaSet, StatefulSet,
/// DaemonSet or Job is immutable, so only a ReplicaSet's own controller reference could
/// change (an orphaned and re-adopted ReplicaSet), which the TTL bounds.
#[derive(Debug, Default)]
pub struct Owners {
    by_uid: HashMap<String, (std::time::Instant, OwnerFacts)>,
}

impl Owners {
    fn get(&self, uid: &str, now: std::time::Instant) -> Option<OwnerFacts> {
        let (read_at, facts) = self.by_uid.get(uid)?;
        (now.duration_since(*read_at) < OWNER_TTL).then(|| facts.clone())
    }

    fn put(&mut self, uid: String, facts: OwnerFacts, now: std::time::Instant) {
        if self.by_uid.len() >= OWNERS_MAX {
            self.by_uid
                .retain(|_, (read_at, _)| now.duration_since(*read_at) < OWNER_TTL);
        }
        if self.by_uid.len() >= OWNERS_MAX {
            self.by_uid.clear();
        }
        self.by_uid.insert(uid, (now, facts));
    }
}

/// Reads the controlling owner's selector and derives the relabelling policy, plus (for
/// a ReplicaSet pod) the ReplicaSet's own controller reference to hand the pod to. A
/// missing owner (already deleted) is treated as a bare pod. A controller read for an
/// earlier pod of the drain is reused (see [`Owners`]), so a
/// ReplicaSet of 30 pods costs one read, not 30.
pub(super) async fn owner_policy(
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
    if let Some(facts) = uid.and_then(|uid| ctx.owners.get(uid)) {
        return Ok(policy_of(kind, facts));
    }
    // One read per controller among concurrent isolations: wait for the turn, then look
    // again, since the isolation before may have read it meanwhile.
    let _turn = match uid {
        Some(uid) => Some(ctx.owners.turn(uid).await),
        None => None,
    };
    if let Some(facts) = uid.and_then(|uid| ctx.owners.get(uid)) {
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
        ctx.owners.remember(uid, facts.clone());
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
pub(super) fn controller_ref(pod: &PodFacts) -> Option<&Value> {
    pod.owner_refs
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// The UID in the pod's controller reference.
fn controller_uid(pod: &PodFacts) -> Option<&str> {
    controller_ref(pod)?.get("uid")?.as_str()
}
