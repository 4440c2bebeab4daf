//! DELETE of one object or of a collection, as the generic registry store does it
//! (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go `Delete` and
//! `updateForGracefulDeletionAndFinalizers`, staging/src/k8s.io/apiserver/pkg/registry/
//! rest/delete.go `BeforeDelete`, pkg/registry/core/pod/strategy.go
//! `CheckGracefulDelete`).
//!
//! Flow: mutating admission (which sees no object, as in the DELETE handler) → read
//! (404) → BeforeDelete checks the preconditions and rewrites the options (pods: no grace
//! period → the pod's `terminationGracePeriodSeconds`; unscheduled or finished → 0;
//! negative → 1) → a terminating pod whose grace period is not shortened is answered
//! as it is, without calling any webhook → graceful deletion (every pod, whatever its
//! grace, and objects held by finalizers) is a compare-and-swap loop like
//! `GuaranteedUpdate` that calls the validating webhooks with the current object on
//! every attempt: a write to the object during a call (a relabel, the ReplicaSet
//! controller releasing the pod) loses the race and the webhooks are called again with
//! the new object → with a zero grace and no finalizers the object is then removed by a
//! second compare-and-swap loop that validates again (etcd3 `conditionalDelete`).
//! Watchers therefore see a pod deleted with grace 0 as MODIFIED (deletionTimestamp
//! set) then DELETED, and other objects without finalizers as DELETED only.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{Value, json};

use super::Ctx;
use super::admission::{self, Attributes, Operation};
use super::meta::{in_seconds, meta_mut, meta_str, no_metadata, now};
use super::request::{Req, Target, check_deadline, filter_of, get, prefix_of};
use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};
use super::store::{StoreError, rv_of};
use super::write::{
    DeleteOpts, MAX_RACE_RETRIES, after_remove, check_preconditions, delete_options,
    finalizers_empty,
};

/// What BeforeDelete decided for an object.
enum Plan {
    /// No graceful deletion: remove it now (or mark it deleting while finalizers hold it).
    Now,
    /// Store it first with this deletionTimestamp and deletionGracePeriodSeconds.
    Graceful(Value),
    /// A graceful deletion is pending and the request does not shorten it.
    Pending,
}

fn is_pod(def: &ResourceDef) -> bool {
    def.group.is_empty() && def.plural == "pods"
}

fn int_at(obj: &Value, pointer: &str) -> Option<i64> {
    obj.pointer(pointer).and_then(Value::as_i64)
}

/// `BeforeDelete`'s early precondition check, with its wording (the storage layer's
/// later check says "Precondition failed").
fn check_preconditions_early(def: &ResourceDef, obj: &Value, opts: &DeleteOpts) -> ApiResult<()> {
    let name = meta_str(obj, "name");
    let conflict = |why: String| ApiError::conflict(&def.group, &def.kind, name, &why);
    if let Some(uid) = &opts.uid
        && uid != meta_str(obj, "uid")
    {
        return Err(conflict(format!(
            "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
            meta_str(obj, "uid")
        )));
    }
    if let Some(rv) = &opts.resource_version
        && rv != meta_str(obj, "resourceVersion")
    {
        return Err(conflict(format!(
            "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
            meta_str(obj, "resourceVersion")
        )));
    }
    Ok(())
}

/// The pod's grace period per `CheckGracefulDelete`: the requested one, else the pod's
/// `terminationGracePeriodSeconds` (0 when unset); 0 for a pod not bound to a node or
/// already finished; a negative value becomes 1.
fn pod_grace(pod: &Value, requested: Option<i64>) -> i64 {
    let mut period = requested
        .or_else(|| int_at(pod, "/spec/terminationGracePeriodSeconds"))
        .unwrap_or(0);
    let node = pod.pointer("/spec/nodeName").and_then(Value::as_str);
    if node.is_none_or(str::is_empty) {
        period = 0;
    }
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Succeeded" | "Failed")) {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    period
}

/// `timestamp` moved by `secs` seconds (RFC 3339 in and out).
fn shifted(timestamp: &str, secs: i64) -> String {
    timestamp
        .parse::<jiff::Timestamp>()
        .ok()
        .and_then(|t| t.checked_add(jiff::SignedDuration::from_secs(secs)).ok())
        .map_or_else(|| in_seconds(secs), |t| t.to_string())
}

/// The object with a deletion timestamp and grace period set.
fn with_deletion(obj: &Value, timestamp: String, grace: i64, bump: bool) -> ApiResult<Value> {
    let mut new = obj.clone();
    let generation = int_at(obj, "/metadata/generation").unwrap_or(0);
    let meta = meta_mut(&mut new).ok_or_else(no_metadata)?;
    meta.insert("deletionTimestamp".into(), json!(timestamp));
    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if bump && generation > 0 {
        meta.insert("generation".into(), json!(generation + 1));
    }
    Ok(new)
}

/// `BeforeDelete`: checks the preconditions, rewrites the options' grace period, and
/// says how the deletion proceeds.
fn before_delete(def: &ResourceDef, obj: &Value, opts: &mut DeleteOpts) -> ApiResult<Plan> {
    check_preconditions_early(def, obj, opts)?;
    if opts.grace.is_some_and(|g| g < 0) {
        opts.set_grace(1);
    }
    // Only pods delete gracefully here (their strategy implements CheckGracefulDelete).
    if !is_pod(def) {
        return Ok(Plan::Now);
    }
    if let Some(since) = obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
    {
        // A pending zero grace (an update that stored it, then a failed removal) is
        // finished at once; a negative one counts as 1.
        let current = match int_at(obj, "/metadata/deletionGracePeriodSeconds") {
            None | Some(0) => return Ok(Plan::Now),
            Some(g) => g.max(1),
        };
        return match opts.grace {
            // Only a shorter grace period may be asked for: the deadline moves closer.
            Some(period) if period < current => {
                let at = shifted(since, period - current);
                Ok(Plan::Graceful(with_deletion(obj, at, period, false)?))
            }
            Some(_) => Ok(Plan::Pending),
            None => {
                opts.set_grace(current);
                Ok(Plan::Pending)
            }
        };
    }
    let period = pod_grace(obj, opts.grace);
    opts.set_grace(period);
    Ok(Plan::Graceful(with_deletion(
        obj,
        in_seconds(period),
        period,
        true,
    )?))
}

/// `markAsDeleting`: an object without graceful deletion that finalizers hold.
fn mark_as_deleting(obj: &Value) -> ApiResult<Value> {
    let deleting = obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str);
    let now = now();
    let at = match deleting {
        Some(at) if at <= now.as_str() => at.to_string(),
        _ => now,
    };
    with_deletion(obj, at, 0, deleting.is_none())
}

/// What the update step of a deletion did.
enum Updated {
    /// Someone else started a deletion this request does not shorten.
    AlreadyDeleting,
    /// Nothing to store first: remove the object now.
    RemoveNow,
    /// Stored (or, in a dry run, would have stored) this object; `remove` when its
    /// grace is zero and no finalizer holds it.
    Stored { object: Value, remove: bool },
}

/// One object's deletion; `validate_as` is the request whose user the validating
/// webhooks see (`None` for the eviction subresource, which deletes without them).
pub(crate) struct Deleter<'a> {
    pub ctx: &'a Arc<Ctx>,
    pub target: &'a Target,
    pub validate_as: Option<&'a Req>,
}

impl Deleter<'_> {
    fn name(&self) -> &str {
        self.target.name.as_deref().unwrap_or_default()
    }

    fn key(&self) -> String {
        self.target.def.key(&self.target.namespace, self.name())
    }

    fn not_found(&self) -> ApiError {
        let def = &self.target.def;
        ApiError::not_found(&def.group, &def.plural, self.name())
    }

    fn read(&self) -> ApiResult<Value> {
        get(self.ctx, self.target)
    }

    /// The validating webhooks, with the object as it is now and the rewritten options.
    async fn validate(&self, existing: &Value, opts: &DeleteOpts) -> ApiResult<()> {
        let Some(req) = self.validate_as else {
            return Ok(());
        };
        let attrs = Attributes {
            target: self.target,
            user: &req.user,
            operation: Operation::Delete,
            name: self.name().to_string(),
            object: None,
            old_object: Some(existing.clone()),
            options: opts.raw.clone(),
            dry_run: opts.dry_run,
            kind: None,
        };
        admission::validate(self.ctx, &attrs).await
    }

    /// Deletes the object: the whole of store.go's `Delete` after admission's mutation.
    pub(crate) async fn run(&self, mut opts: DeleteOpts) -> ApiResult<Value> {
        let current = self.read()?;
        let graceful = match before_delete(&self.target.def, &current, &mut opts)? {
            Plan::Pending => return Ok(current),
            Plan::Graceful(_) => true,
            Plan::Now => false,
        };
        let mut last = current.clone();
        let mut tolerate_gone = false;
        if graceful || !finalizers_empty(&current) {
            match self.update_for_deletion(&mut opts).await? {
                Updated::AlreadyDeleting => return Ok(current),
                Updated::RemoveNow => {}
                Updated::Stored { object, remove } => {
                    if !remove || opts.dry_run {
                        return Ok(object);
                    }
                    // The update moved the resourceVersion the precondition named.
                    if opts.resource_version.is_some() {
                        opts.resource_version = Some(meta_str(&object, "resourceVersion").into());
                    }
                    // Deleting with no grace races the kubelet's own final delete.
                    tolerate_gone = true;
                    last = object;
                }
            }
        }
        match self.remove(&opts).await {
            Err(e) if e.code == 404 && tolerate_gone => Ok(last),
            other => other,
        }
    }

    /// `updateForGracefulDeletionAndFinalizers`: validate and store the deletion
    /// timestamp, again from the start whenever the object changed meanwhile.
    async fn update_for_deletion(&self, opts: &mut DeleteOpts) -> ApiResult<Updated> {
        let def = &self.target.def;
        for _ in 0..MAX_RACE_RETRIES {
            let existing = self.read()?;
            check_preconditions(def, &existing, opts)?;
            self.validate(&existing, opts).await?;
            let new = match before_delete(def, &existing, opts)? {
                Plan::Pending => return Ok(Updated::AlreadyDeleting),
                Plan::Now if finalizers_empty(&existing) => return Ok(Updated::RemoveNow),
                Plan::Now => mark_as_deleting(&existing)?,
                Plan::Graceful(new) => new,
            };
            let grace = int_at(&new, "/metadata/deletionGracePeriodSeconds").unwrap_or(0);
            let remove = grace == 0 && finalizers_empty(&new);
            if opts.dry_run {
                return Ok(Updated::Stored {
                    object: new,
                    remove,
                });
            }
            check_deadline()?;
            let stored = self.ctx.store.update(
                &def.table(),
                &self.key(),
                rv_of(&existing),
                def.view.to_storage(new),
            );
            match stored {
                Ok(object) => {
                    let object = def.view.served(object);
                    return Ok(Updated::Stored { object, remove });
                }
                Err(StoreError::NotFound) => return Err(self.not_found()),
                Err(StoreError::Conflict | StoreError::AlreadyExists) => continue,
            }
        }
        Err(ApiError::stale(&def.group, &def.plural, self.name()))
    }

    /// The storage delete (`conditionalDelete`): validate, then remove if unchanged.
    async fn remove(&self, opts: &DeleteOpts) -> ApiResult<Value> {
        let def = &self.target.def;
        for _ in 0..MAX_RACE_RETRIES {
            let existing = self.read()?;
            check_preconditions(def, &existing, opts)?;
            self.validate(&existing, opts).await?;
            if opts.dry_run {
                return Ok(existing);
            }
            check_deadline()?;
            let removed = self.ctx.store.remove(
                &def.table(),
                &self.key(),
                rv_of(&existing),
                def.view.to_storage(existing.clone()),
            );
            match removed {
                Ok(object) => {
                    let object = def.view.served(object);
                    after_remove(self.ctx, def, &object);
                    return Ok(object);
                }
                Err(StoreError::NotFound) => return Err(self.not_found()),
                Err(StoreError::Conflict | StoreError::AlreadyExists) => continue,
            }
        }
        Err(ApiError::stale(&def.group, &def.plural, self.name()))
    }
}

/// DELETE of one object.
pub(crate) async fn delete(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let opts = delete_options(req.json()?, req)?;
    let mut attrs = Attributes {
        target,
        user: &req.user,
        operation: Operation::Delete,
        name: target.name.clone().unwrap_or_default(),
        object: None,
        old_object: None,
        options: opts.raw.clone(),
        dry_run: opts.dry_run,
        kind: None,
    };
    admission::mutate(ctx, &mut attrs).await?;
    let deleter = Deleter {
        ctx,
        target,
        validate_as: Some(req),
    };
    deleter.run(opts).await.map(|v| (StatusCode::OK, v))
}

/// DELETE of a collection (with selectors): each matching object is deleted in turn.
pub(crate) async fn delete_collection(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let filter = filter_of(target, req)?;
    let opts = delete_options(req.json()?, req)?;
    let def = &target.def;
    let (items, rv) = ctx.store.list(&def.table(), &prefix_of(target));
    let mut deleted = Vec::new();
    let items = items.into_iter().map(|(_, o)| def.view.served(o));
    for obj in items.filter(|o| filter.matches(o)) {
        let one = Target {
            namespace: meta_str(&obj, "namespace").to_string(),
            name: Some(meta_str(&obj, "name").to_string()),
            ..target.clone()
        };
        let deleter = Deleter {
            ctx,
            target: &one,
            validate_as: Some(req),
        };
        match deleter.run(opts.clone()).await {
            Ok(v) => deleted.push(v),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok((
        StatusCode::OK,
        json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(),
               "metadata": {"resourceVersion": rv.to_string()}, "items": deleted}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_graceful_delete_rewrites_the_grace_period_like_upstream() {
        let pod = |node: &str, phase: &str, tgps: Option<i64>| {
            let mut pod = json!({"spec": {"nodeName": node}, "status": {"phase": phase}});
            if let Some(t) = tgps {
                pod["spec"]["terminationGracePeriodSeconds"] = json!(t);
            }
            pod
        };
        assert_eq!(pod_grace(&pod("n1", "Running", Some(45)), None), 45);
        assert_eq!(pod_grace(&pod("n1", "Running", None), None), 0);
        assert_eq!(pod_grace(&pod("n1", "Running", Some(45)), Some(5)), 5);
        assert_eq!(pod_grace(&pod("", "Pending", Some(45)), Some(5)), 0);
        assert_eq!(pod_grace(&pod("n1", "Succeeded", Some(45)), None), 0);
        assert_eq!(pod_grace(&pod("n1", "Failed", Some(45)), Some(9)), 0);
        assert_eq!(pod_grace(&pod("n1", "Running", Some(45)), Some(-3)), 1);
        assert_eq!(
            shifted("2026-01-01T00:00:30Z", -20),
            "2026-01-01T00:00:10Z".to_string()
        );
    }
}
