//! The skeleton the StatefulSet, DaemonSet and Job controllers share: one generic
//! controller, [`Workload`], over a [`Kind`] that holds a kind's rules and nothing else.
//!
//! Data flows one way. [`run`] opens the controller's [`Watches`] (the owners, the
//! kind's own stores such as the DaemonSet's nodes, and every pod), waits for each
//! store's first list, and hands the controller to [`run_passes`]. A pass reads the
//! caches once (the pods, the kind's [`Kind::snapshot`], the owners), lets the kind do
//! the work that belongs to no owner ([`Kind::sweep`]: the Job's orphaned finalizers),
//! then, per owner the kind [handles](Kind::handles): skips it while its worker is busy
//! or while its [`Expectations`] are unmet (the earliest time one runs out is the pass's
//! next wake-up), asks the kind for a plan ([`Kind::plan`], a pure function of the owner,
//! the snapshot and the pods of the owner's namespace) and for the status to write
//! ([`Kind::status`], only when it differs from the owner's), and, unless both are
//! no-ops, starts the kind's sync ([`Kind::sync`]) as the owner's work in [`Workers`].
//! The sync acts through a [`Work`]: it claims pods, creates and deletes them, leaves
//! the expectations of what it did, and writes the status.
//!
//! The ReplicaSet controller keeps its own pass and expectations (upstream's
//! `DeletionObserved` rules) and shares only [`set_owner`], [`owner_ref`] and
//! [`status_differs`] with this skeleton.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::{
    Reconciler, Result, Watches, Workers, api_err, by_namespace, controller_of, key, ns_name,
    ready, run_passes, status_code,
};

/// How long an unobserved creation or deletion holds an owner back: watches deliver in
/// milliseconds, so a few seconds suffice.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(10);

/// What the skeleton needs of an owner: a namespaced API object it can watch, cache,
/// name in owner references and write the status of.
pub(super) trait Owner:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<T> Owner for T where
    T: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// One workload kind's rules: what its controller watches besides owners and pods, what
/// it decides per owner, and how it acts on a decision.
pub(super) trait Kind: Send + Sync + 'static {
    /// The owning workload.
    type Owner: Owner;
    /// What one sync of an owner decided; the `Default` plan does nothing.
    type Plan: Default + PartialEq + Send + 'static;
    /// What a pass reads from the kind's own stores, once for every owner.
    type Snapshot: Send;

    /// Waits until the kind's own stores have their first list; `false` on `shutdown`.
    fn ready(&self, _shutdown: &CancellationToken) -> impl Future<Output = bool> + Send {
        async { true }
    }

    /// Reads the kind's own stores for one pass.
    fn snapshot(&self) -> Self::Snapshot;

    /// The pass's work that is no owner's, done before the owners' syncs (none by default).
    fn sweep(
        &self,
        _client: &kube::Client,
        _owners: &[Arc<Self::Owner>],
        _pods: &[Arc<Pod>],
        _workers: &mut Workers,
    ) {
    }

    /// Whether the controller syncs `owner` at all (every owner by default).
    fn handles(&self, _owner: &Self::Owner) -> bool {
        true
    }

    /// What to do for `owner` given the snapshot and the pods of its namespace; `None`
    /// leaves the owner alone in this pass.
    fn plan(
        &self,
        owner: &Self::Owner,
        snapshot: &Self::Snapshot,
        pods: &[Arc<Pod>],
    ) -> Option<Self::Plan>;

    /// The status to write for `owner`, when it differs from the one it has (none by
    /// default: the kind writes no status through the skeleton).
    fn status(
        &self,
        _owner: &Self::Owner,
        _snapshot: &Self::Snapshot,
        _pods: &[Arc<Pod>],
    ) -> Option<serde_json::Value> {
        None
    }

    /// One owner's sync: carries out `plan` and writes `status`, run as owned work.
    fn sync(
        work: Work<Self::Owner>,
        plan: Self::Plan,
        status: Option<serde_json::Value>,
    ) -> impl Future<Output = Result<()>> + Send + 'static;
}

/// Runs the controller of the kind `make` builds (from the controller's watches, for
/// the stores of its own) until `shutdown`.
pub(super) async fn run<K: Kind>(
    client: kube::Client,
    shutdown: CancellationToken,
    make: impl FnOnce(&Watches) -> K,
) -> Result<()> {
    let watches = Watches::new(client.clone(), shutdown.clone());
    let wake = watches.wake();
    let owners = watches.all::<K::Owner>();
    let kind = make(&watches);
    let pods = watches.all::<Pod>();
    if !(ready(&owners, &shutdown).await
        && kind.ready(&shutdown).await
        && ready(&pods, &shutdown).await)
    {
        return Ok(());
    }
    let controller = Workload {
        kind,
        client,
        owners,
        pods,
        workers: Workers::new(wake.clone()),
        expectations: Expectations::default(),
    };
    run_passes(controller, &wake, &shutdown).await
}

/// The controller of one workload kind.
struct Workload<K: Kind> {
    kind: K,
    client: kube::Client,
    owners: Store<K::Owner>,
    pods: Store<Pod>,
    workers: Workers,
    expectations: Expectations,
}

impl<K: Kind> Reconciler for Workload<K> {
    async fn pass(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let all = self.pods.state();
        let snapshot = self.kind.snapshot();
        let owners = self.owners.state();
        self.kind
            .sweep(&self.client, &owners, &all, &mut self.workers);
        let by_ns = by_namespace(&all);
        let mut next: Option<Instant> = None;
        for owner in owners {
            let uid = owner.uid().unwrap_or_default();
            if !self.kind.handles(&owner) || self.workers.busy(&uid) {
                continue;
            }
            if let Err(until) = self.expectations.check(&uid, &all, now) {
                next = Some(next.map_or(until, |n| n.min(until)));
                continue;
            }
            let pods = by_ns
                .get(&owner.namespace().unwrap_or_default())
                .map_or(&[][..], Vec::as_slice);
            let Some(plan) = self.kind.plan(&owner, &snapshot, pods) else {
                continue;
            };
            let status = self.kind.status(&owner, &snapshot, pods);
            if plan == K::Plan::default() && status.is_none() {
                continue;
            }
            let work = Work {
                client: self.client.clone(),
                owner,
                expectations: self.expectations.clone(),
            };
            self.workers.spawn(uid, K::sync(work, plan, status));
        }
        next
    }
}

/// One owner's sync, handed to [`Kind::sync`]: the owner as the pass saw it, and the
/// calls every kind's sync makes.
pub(super) struct Work<O> {
    client: kube::Client,
    /// The owner as the pass saw it.
    pub(super) owner: Arc<O>,
    expectations: Expectations,
}

impl<O: Owner> Work<O> {
    /// The owner as `ns/name`, for messages.
    pub(super) fn key(&self) -> String {
        key(&*self.owner)
    }

    fn uid(&self) -> String {
        self.owner.uid().unwrap_or_default()
    }

    /// The pods of the owner's namespace.
    pub(super) fn pods(&self) -> Api<Pod> {
        Api::namespaced(
            self.client.clone(),
            &self.owner.namespace().unwrap_or_default(),
        )
    }

    /// Adopts the orphans `adopt`, then releases `release` (pod names); stops at the
    /// first failed call.
    pub(super) async fn claim(
        &self,
        api: &Api<Pod>,
        adopt: &[String],
        release: &[String],
    ) -> Result<()> {
        let uid = self.uid();
        for pod in adopt {
            set_owner(api, pod, &uid, Some(owner_ref(&*self.owner))).await?;
        }
        for pod in release {
            set_owner(api, pod, &uid, None).await?;
        }
        Ok(())
    }

    /// Deletes `pods` (name, uid) one by one; the UIDs of those gone or going.
    pub(super) async fn delete(&self, api: &Api<Pod>, pods: &[(String, String)]) -> Vec<String> {
        let owner = self.key();
        let mut deleted = Vec::new();
        for (pod, pod_uid) in pods {
            deleted.extend(delete_pod(api, &owner, pod, pod_uid).await);
        }
        deleted
    }

    /// Holds the owner back until the cache shows `created` (pod keys) and no longer
    /// shows `deleted` (pod UIDs) as live.
    pub(super) fn expect(&self, created: Vec<String>, deleted: Vec<String>) {
        self.expectations.expect(self.uid(), created, deleted);
    }

    /// Applies the merge `patch` to the owner's status subresource.
    pub(super) async fn patch_status(&self, patch: serde_json::Value) -> Result<()> {
        let (ns, name) = ns_name(&*self.owner);
        let api: Api<O> = Api::namespaced(self.client.clone(), &ns);
        let object = format!("{} {}", O::kind(&()).to_lowercase(), self.key());
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(api_err("update status of", object))?;
        Ok(())
    }
}

/// Whether an object whose status is `have` should write `want`: it has no status, or
/// one of `want`'s fields differs from the same field of `have` as serialized. A field
/// `have` lacks reads as zero (`0` or `""`), as an unset optional counter or revision did.
pub(super) fn status_differs<S: Serialize>(have: Option<&S>, want: &serde_json::Value) -> bool {
    let Some(have) = have.and_then(|s| serde_json::to_value(s).ok()) else {
        return true;
    };
    let Some(want) = want.as_object() else {
        return true;
    };
    want.iter().any(|(field, value)| match have.get(field) {
        Some(have) if !have.is_null() => have != value,
        _ => !(value.as_i64() == Some(0) || value.as_str() == Some("")),
    })
}

/// The controller reference to `owner` its pods carry.
pub(super) fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Creations (pod names) and deletions (UIDs) a controller made but its cache does not
/// show yet, per owner UID: until they show (or [`EXPECTATION_TIMEOUT`] passes) the owner
/// waits, so a stale cache never causes a second creation or a second DELETE.
#[derive(Clone, Default)]
struct Expectations(Arc<Mutex<HashMap<String, Expected>>>);

#[derive(Debug)]
struct Expected {
    created: HashSet<String>,
    deleted: HashSet<String>,
    until: Instant,
}

impl Expectations {
    /// Records what work for `owner` did.
    fn expect(&self, owner: String, created: Vec<String>, deleted: Vec<String>) {
        if created.is_empty() && deleted.is_empty() {
            return;
        }
        let exp = Expected {
            created: created.into_iter().collect(),
            deleted: deleted.into_iter().collect(),
            until: Instant::now() + EXPECTATION_TIMEOUT,
        };
        self.lock().insert(owner, exp);
    }

    /// `Ok` when `owner` may sync against a cache holding `pods`; otherwise the time its
    /// expectation runs out.
    fn check(&self, owner: &str, pods: &[Arc<Pod>], now: Instant) -> Result<(), Instant> {
        let mut exps = self.lock();
        let Some(exp) = exps.get(owner) else {
            return Ok(());
        };
        let created = exp
            .created
            .iter()
            .all(|name| pods.iter().any(|p| &key(&**p) == name));
        let deleted = exp.deleted.iter().all(|uid| {
            !pods
                .iter()
                .any(|p| p.uid().as_ref() == Some(uid) && p.metadata.deletion_timestamp.is_none())
        });
        if now < exp.until && !(created && deleted) {
            return Err(exp.until);
        }
        exps.remove(owner);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Expected>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Adopts (`owner` is `Some`) or releases (`None`, dropping `owner_uid`) pod `ns/name`.
/// The patch names the pod's UID and resourceVersion, so a pod replaced or changed
/// meanwhile fails the call instead of being claimed by mistake.
pub(super) async fn set_owner(
    api: &Api<Pod>,
    name: &str,
    owner_uid: &str,
    owner: Option<OwnerReference>,
) -> Result<()> {
    let object = format!("pod {}/{name}", api.namespace().unwrap_or_default());
    let Some(pod) = api
        .get_opt(name)
        .await
        .map_err(api_err("get", object.clone()))?
    else {
        return Ok(());
    };
    let mut refs: Vec<OwnerReference> = pod
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.uid != owner_uid)
        .collect();
    let action = if owner.is_some() { "adopt" } else { "release" };
    if let Some(owner) = owner {
        if controller_of(&pod).is_some() {
            return Ok(());
        }
        refs.push(owner);
    }
    let refs = match refs.is_empty() {
        true => serde_json::Value::Null,
        false => serde_json::to_value(&refs).unwrap_or_default(),
    };
    let patch = serde_json::json!({"metadata": {
        "uid": pod.uid(),
        "resourceVersion": pod.resource_version(),
        "ownerReferences": refs,
    }});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Err(e) if status_code(&e) != Some(404) => Err(api_err(action, object)(e)),
        _ => Ok(()),
    }
}

/// Deletes pod `name` if it still has `uid`; `Some(uid)` when it is gone or going.
async fn delete_pod(api: &Api<Pod>, owner: &str, name: &str, uid: &str) -> Option<String> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Some(uid.to_string()),
        Err(e) if status_code(&e) == Some(404) => Some(uid.to_string()),
        Err(error) => {
            tracing::info!(%owner, pod = %name, %error, "delete pod failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    #[test]
    fn a_status_differs_only_in_the_fields_wanted_and_unset_reads_as_zero() {
        let want = serde_json::json!({
            "replicas": 2,
            "readyReplicas": 0,
            "currentRevision": "",
            "observedGeneration": 1,
        });
        assert!(status_differs(None::<&StatefulSetStatus>, &want));
        let mut have = StatefulSetStatus {
            replicas: 2,
            observed_generation: Some(1),
            update_revision: Some("web-1".into()),
            ..StatefulSetStatus::default()
        };
        assert!(!status_differs(Some(&have), &want), "unset reads as zero");
        have.ready_replicas = Some(1);
        assert!(status_differs(Some(&have), &want));
        have.ready_replicas = Some(0);
        have.current_revision = Some("web-0".into());
        assert!(status_differs(Some(&have), &want));
    }
}
