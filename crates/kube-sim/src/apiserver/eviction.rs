//! `POST pods/{name}/eviction`, step by step as pkg/registry/core/pod/storage/eviction.go
//! does it (docs/design.md §4).
//!
//! 1. Decode the policy/v1 Eviction (unknown fields dropped, so options sent under a
//!    misspelled key are lost).
//! 2. Mutating admission (CREATE pods/eviction, kind policy/v1 Eviction), before the pod
//!    is even looked up, as the create handler admits before calling the storage; the
//!    review's `dryRun` and `options` are the request's CreateOptions.
//! 3. The name in the body must be the URL's (400); the query's dryRun joins the
//!    (possibly webhook-patched) deleteOptions; validating admission.
//! 4. A conflict-retrying loop: 404 when the pod is gone; pods that are finished,
//!    pending or terminating skip the budget and are deleted at once (a pending pod with
//!    its resourceVersion as precondition).
//! 5. Budgets selecting the pod (an empty selector selects nothing): none → delete; more
//!    than one → 500; an unready pod is deleted without spending a disruption when the
//!    budget's `unhealthyPodEvictionPolicy` is AlwaysAllow, or (IfHealthyBudget, the
//!    default) while the budget is met.
//! 6. Otherwise check-and-decrement in a conflict-retrying loop: not yet observed →
//!    429 (Retry-After 10); negative allowance → 403; no disruption left → 429; else
//!    record the pod in `status.disruptedPods` and decrement `disruptionsAllowed` in one
//!    resourceVersion-guarded status update (skipped in a dry run). Exhausted retries
//!    answer the last conflict.
//! 7. Mark the pod with a DisruptionTarget condition and delete it with the eviction's
//!    options, without calling DELETE webhooks. An unready pod deleted in step 5 carries
//!    its resourceVersion as precondition; losing that race answers 429.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use k8s_openapi::api::policy::v1::Eviction;
use serde_json::{Value, json};

use super::Ctx;
use super::admission::{self, Attributes, Operation};
use super::delete::Deleter;
use super::meta::now;
use super::request::{Req, Target, check_deadline, get};
use super::selector::selector_object_matches;
use super::status::{ApiError, ApiResult, Cause};
use super::store::{StoreError, rv_of};
use super::write::{DeleteOpts, delete_options, success_status};

/// Attempts of each conflict-retrying loop (upstream `EvictionsRetry.Steps`).
const RETRY_STEPS: usize = 20;

/// Pause between two attempts (upstream `EvictionsRetry.Duration`, factor 1).
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// Retry-After for a PDB its controller has not observed yet (upstream value).
const UNOBSERVED_RETRY_SECONDS: u64 = 10;

/// Largest `disruptedPods` map upstream still accepts (`MaxDisruptedPodSize`).
const MAX_DISRUPTED_PODS: usize = 2000;

const PDB_TABLE: &str = "policy/poddisruptionbudgets";

fn decode(body: Option<Value>) -> ApiResult<Value> {
    let mut body = match body {
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(ApiError::bad_request(
                "the Eviction body must be a JSON object",
            ));
        }
        None => serde_json::Map::new(),
    };
    body.insert("apiVersion".into(), json!("policy/v1"));
    body.insert("kind".into(), json!("Eviction"));
    let typed: Eviction = serde_json::from_value(Value::Object(body))
        .map_err(|e| ApiError::bad_request(format!("decode Eviction: {e}")))?;
    serde_json::to_value(&typed).map_err(|e| ApiError::internal(format!("encode Eviction: {e}")))
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn int_at(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// Answers an eviction request.
pub(crate) async fn evict(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let name = target.name.clone().unwrap_or_default();
    let eviction = decode(req.json()?)?;
    let create_options = json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
        "dryRun": if req.dry_run() { json!(["All"]) } else { Value::Null }});
    let mut attrs = Attributes {
        target,
        user: &req.user,
        operation: Operation::Create,
        name: name.clone(),
        object: Some(eviction.clone()),
        old_object: None,
        options: create_options,
        dry_run: req.dry_run(),
        kind: Some(("policy".into(), "v1".into(), "Eviction".into())),
    };
    let eviction = match admission::mutate(ctx, &mut attrs).await?.object {
        Some(mutated) => decode(Some(mutated))?,
        None => eviction,
    };
    if str_at(&eviction, "/metadata/name") != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let opts = delete_options(eviction.get("deleteOptions").cloned(), req)?;
    attrs.object = Some(eviction);
    admission::validate(ctx, &attrs).await?;
    let pod_target = Target {
        sub: None,
        ..target.clone()
    };
    let eviction = Evicting {
        ctx,
        target: &pod_target,
        opts,
    };
    eviction.run().await
}

/// One eviction after admission.
struct Evicting<'a> {
    ctx: &'a Arc<Ctx>,
    target: &'a Target,
    /// The eviction's deleteOptions, with the request's dryRun.
    opts: DeleteOpts,
}

/// What the budget check allows.
enum Budget {
    /// Delete; with `guard`, only the pod version the decision was made on.
    Delete { guard: bool, pdb: String },
    /// Answer this (several budgets select the pod).
    Answer(StatusCode, Value),
}

impl Evicting<'_> {
    fn name(&self) -> &str {
        self.target.name.as_deref().unwrap_or_default()
    }

    /// Conflicts are retried unless the caller pinned a resourceVersion.
    fn retries(&self) -> usize {
        if self.opts.resource_version.is_some() {
            1
        } else {
            RETRY_STEPS
        }
    }

    async fn run(&self) -> ApiResult<(StatusCode, Value)> {
        let Some(pod) = self.delete_if_budget_ignored().await? else {
            return Ok((StatusCode::CREATED, success_status()));
        };
        let (guard, pdb) = match self.check_budget(&pod).await? {
            Budget::Answer(code, status) => return Ok((code, status)),
            Budget::Delete { guard, pdb } => (guard, pdb),
        };
        let mut opts = self.opts.clone();
        if guard {
            opts.resource_version = Some(str_at(&pod, "/metadata/resourceVersion").into());
        }
        match self.delete_with_condition(opts).await {
            Err(e) if e.code == 409 && guard && self.opts.resource_version.is_none() => {
                Err(still_processing(&pdb))
            }
            Err(e) => Err(e),
            Ok(()) => Ok((StatusCode::CREATED, success_status())),
        }
    }

    /// Step 4: deletes a pod whose eviction needs no budget; the pod otherwise.
    async fn delete_if_budget_ignored(&self) -> ApiResult<Option<Value>> {
        let mut last = None;
        for attempt in 0..self.retries() {
            if attempt > 0 {
                tokio::time::sleep(RETRY_DELAY).await;
            }
            let pod = get(self.ctx, self.target)?;
            if !ignores_budget(&pod) {
                return Ok(Some(pod));
            }
            let mut opts = self.opts.clone();
            // A pending pod could become ready meanwhile: delete only this version.
            if enforces_resource_version(&pod) && opts.resource_version.is_none() {
                opts.resource_version = Some(str_at(&pod, "/metadata/resourceVersion").into());
            }
            match self.delete_with_condition(opts).await {
                Ok(()) => return Ok(None),
                Err(e) if e.code == 409 => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ApiError::internal("eviction retries exhausted")))
    }

    /// Step 5 and 6.
    async fn check_budget(&self, pod: &Value) -> ApiResult<Budget> {
        let mut pdbs = selecting_budgets(self.ctx, &self.target.namespace, pod);
        if pdbs.len() > 1 {
            // Upstream returns this Status as the result, so it has no reason.
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "code": 500,
                "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."});
            return Ok(Budget::Answer(StatusCode::INTERNAL_SERVER_ERROR, status));
        }
        let Some(mut pdb) = pdbs.pop() else {
            return Ok(Budget::Delete {
                guard: false,
                pdb: String::new(),
            });
        };
        let pdb_name = str_at(&pdb, "/metadata/name").to_string();
        if unhealthy_may_go(&pdb, pod) {
            return Ok(Budget::Delete {
                guard: true,
                pdb: pdb_name,
            });
        }
        let mut last = None;
        for attempt in 0..RETRY_STEPS {
            if attempt > 0 {
                tokio::time::sleep(RETRY_DELAY).await;
                pdb = get_pdb(self.ctx, &self.target.namespace, &pdb_name)?;
            }
            match check_and_decrement(self.ctx, &pdb, self.name(), self.opts.dry_run) {
                Ok(()) => {
                    return Ok(Budget::Delete {
                        guard: false,
                        pdb: pdb_name,
                    });
                }
                Err(e) if e.code == 409 => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ApiError::stale("policy", "poddisruptionbudgets", &pdb_name)))
    }

    /// Step 7 (`addConditionAndDeletePod`): a DisruptionTarget condition on the latest
    /// pod (checking the preconditions), then the deletion, without DELETE webhooks.
    async fn delete_with_condition(&self, mut opts: DeleteOpts) -> ApiResult<()> {
        if !opts.dry_run {
            let marked = self.mark_disruption_target(&opts)?;
            if opts.resource_version.is_some() {
                opts.resource_version = Some(str_at(&marked, "/metadata/resourceVersion").into());
            }
        }
        let deleter = Deleter {
            ctx: self.ctx,
            target: self.target,
            validate_as: None,
        };
        deleter.run(opts).await.map(|_| ())
    }

    fn mark_disruption_target(&self, opts: &DeleteOpts) -> ApiResult<Value> {
        let def = &self.target.def;
        let key = def.key(&self.target.namespace, self.name());
        for _ in 0..RETRY_STEPS {
            let latest = get(self.ctx, self.target)?;
            check_update_preconditions(&latest, opts)?;
            check_deadline()?;
            match self.ctx.store.update(
                &def.table(),
                &key,
                rv_of(&latest),
                def.view.to_storage(with_disruption_condition(&latest)),
            ) {
                Ok(stored) => return Ok(def.view.served(stored)),
                Err(StoreError::Conflict | StoreError::AlreadyExists) => continue,
                Err(StoreError::NotFound) => {
                    return Err(ApiError::not_found("", "pods", self.name()));
                }
            }
        }
        Err(ApiError::stale("", "pods", self.name()))
    }
}

/// Pods whose eviction never needs a budget's permission (upstream `canIgnorePDB`).
fn ignores_budget(pod: &Value) -> bool {
    matches!(
        str_at(pod, "/status/phase"),
        "Succeeded" | "Failed" | "Pending"
    ) || pod.pointer("/metadata/deletionTimestamp").is_some()
}

/// Upstream `shouldEnforceResourceVersion`: every pod but finished or terminating ones.
fn enforces_resource_version(pod: &Value) -> bool {
    !matches!(str_at(pod, "/status/phase"), "Succeeded" | "Failed")
        && pod.pointer("/metadata/deletionTimestamp").is_none()
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// An unready pod leaves without spending a disruption: always under AlwaysAllow, and
/// under IfHealthyBudget (the default) while the budget is met.
fn unhealthy_may_go(pdb: &Value, pod: &Value) -> bool {
    if pod_ready(pod) {
        return false;
    }
    if str_at(pdb, "/spec/unhealthyPodEvictionPolicy") == "AlwaysAllow" {
        return true;
    }
    let (current, desired) = (
        int_at(pdb, "/status/currentHealthy"),
        int_at(pdb, "/status/desiredHealthy"),
    );
    current >= desired && desired > 0
}

/// Whether a selector selects nothing for the eviction subresource: absent, or empty
/// ("a PDB with a nil or empty selector ... should match nothing").
fn selects_nothing(selector: Option<&Value>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_null()) else {
        return true;
    };
    let empty = |key: &str| {
        selector.get(key).is_none_or(|v| {
            v.is_null()
                || v.as_object().is_some_and(|m| m.is_empty())
                || v.as_array().is_some_and(|a| a.is_empty())
        })
    };
    empty("matchLabels") && empty("matchExpressions")
}

fn selecting_budgets(ctx: &Ctx, namespace: &str, pod: &Value) -> Vec<Value> {
    let (pdbs, _) = ctx.store.list(PDB_TABLE, &format!("{namespace}/"));
    let labels = pod.pointer("/metadata/labels");
    pdbs.into_iter()
        .map(|(_, p)| p)
        .filter(|p| {
            let selector = p.pointer("/spec/selector");
            !selects_nothing(selector) && selector_object_matches(selector, labels)
        })
        .collect()
}

fn get_pdb(ctx: &Ctx, namespace: &str, name: &str) -> ApiResult<Value> {
    ctx.store
        .get(PDB_TABLE, &format!("{namespace}/{name}"))
        .ok_or_else(|| ApiError::not_found("policy", "poddisruptionbudgets", name))
}

/// A refusal by the budget: 429 with the upstream message and a DisruptionBudget cause.
fn budget_error(retry: u64, cause: String) -> ApiError {
    let mut error = ApiError::new(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    )
    .with_retry(retry);
    error.causes.push(Cause::new("DisruptionBudget", cause));
    error
}

/// Upstream `createTooManyRequestsError`.
fn still_processing(pdb_name: &str) -> ApiError {
    let cause = format!("The disruption budget {pdb_name} is still being processed by the server.");
    budget_error(UNOBSERVED_RETRY_SECONDS, cause)
}

fn forbidden(pdb_name: &str, why: &str) -> ApiError {
    ApiError::new(
        403,
        "Forbidden",
        format!("poddisruptionbudget.policy \"{pdb_name}\" is forbidden: {why}"),
    )
    .with_details("policy", "poddisruptionbudget", pdb_name)
}

/// Upstream `checkAndDecrement`: refuses, or takes one disruption and records the pod
/// in one resourceVersion-guarded status update (a 409 when another writer was first).
fn check_and_decrement(ctx: &Ctx, pdb: &Value, pod_name: &str, dry_run: bool) -> ApiResult<()> {
    let pdb_name = str_at(pdb, "/metadata/name");
    if int_at(pdb, "/status/observedGeneration") < int_at(pdb, "/metadata/generation") {
        return Err(still_processing(pdb_name));
    }
    let allowed = int_at(pdb, "/status/disruptionsAllowed");
    if allowed < 0 {
        return Err(forbidden(pdb_name, "pdb disruptions allowed is negative"));
    }
    let disrupted = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .map_or(0, |m| m.len());
    if disrupted > MAX_DISRUPTED_PODS {
        return Err(forbidden(
            pdb_name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        let cause = format!(
            "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
            int_at(pdb, "/status/desiredHealthy"),
            int_at(pdb, "/status/currentHealthy"),
        );
        return Err(budget_error(0, cause));
    }
    if dry_run {
        return Ok(());
    }
    let mut updated = pdb.clone();
    updated["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if allowed == 1 {
        set_insufficient_condition(&mut updated);
    }
    if !updated["status"]["disruptedPods"].is_object() {
        updated["status"]["disruptedPods"] = json!({});
    }
    updated["status"]["disruptedPods"][pod_name] = json!(now());
    tracing::debug!(
        pdb = pdb_name,
        pod = pod_name,
        allowed,
        "eviction records a disruption"
    );
    check_deadline()?;
    let key = format!("{}/{pdb_name}", str_at(pdb, "/metadata/namespace"));
    match ctx.store.update(PDB_TABLE, &key, rv_of(pdb), updated) {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound) => Err(ApiError::not_found(
            "policy",
            "poddisruptionbudgets",
            pdb_name,
        )),
        Err(_) => Err(ApiError::stale("policy", "poddisruptionbudgets", pdb_name)),
    }
}

/// Upstream `UpdateDisruptionAllowedCondition` once the allowance reaches zero.
fn set_insufficient_condition(pdb: &mut Value) {
    let generation = pdb.pointer("/status/observedGeneration").cloned();
    let Some(status) = pdb.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
    let Some(list) = conditions.as_array_mut() else {
        return;
    };
    let existing = list
        .iter()
        .position(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"));
    let unchanged = existing
        .and_then(|i| list[i].get("status"))
        .and_then(Value::as_str)
        == Some("False");
    if unchanged {
        return;
    }
    let condition = json!({"type": "DisruptionAllowed", "status": "False",
        "reason": "InsufficientPods", "message": "", "observedGeneration": generation,
        "lastTransitionTime": now()});
    match existing {
        Some(i) => list[i] = condition,
        None => list.push(condition),
    }
}

/// The UID and resourceVersion preconditions, worded as `getLatestPod` words them.
fn check_update_preconditions(pod: &Value, opts: &DeleteOpts) -> ApiResult<()> {
    let name = str_at(pod, "/metadata/name");
    let conflict = |why: String| ApiError::conflict("", "Pod", name, &why);
    if let Some(uid) = opts.uid.as_deref().filter(|u| !u.is_empty())
        && uid != str_at(pod, "/metadata/uid")
    {
        return Err(conflict(format!(
            "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
            str_at(pod, "/metadata/uid")
        )));
    }
    if let Some(rv) = opts.resource_version.as_deref().filter(|r| !r.is_empty())
        && rv != str_at(pod, "/metadata/resourceVersion")
    {
        return Err(conflict(format!(
            "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
            str_at(pod, "/metadata/resourceVersion")
        )));
    }
    Ok(())
}

/// The pod with a `DisruptionTarget` condition (upstream marks evicted pods so).
fn with_disruption_condition(pod: &Value) -> Value {
    let mut marked = pod.clone();
    let condition = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                           "message": "Eviction API: evicting", "lastTransitionTime": now()});
    if !marked["status"]["conditions"].is_array() {
        marked["status"]["conditions"] = json!([]);
    }
    if let Some(conditions) = marked["status"]["conditions"].as_array_mut() {
        conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("DisruptionTarget"));
        conditions.push(condition);
    }
    marked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_missing_selectors_select_nothing_for_eviction() {
        assert!(selects_nothing(None));
        assert!(selects_nothing(Some(&json!(null))));
        assert!(selects_nothing(Some(&json!({}))));
        assert!(selects_nothing(Some(&json!({"matchLabels": {}}))));
        assert!(!selects_nothing(Some(
            &json!({"matchLabels": {"app": "web"}})
        )));
        let expr = json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]});
        assert!(!selects_nothing(Some(&expr)));
    }

    #[test]
    fn unready_pods_leave_per_the_unhealthy_pod_eviction_policy() {
        let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let pdb = |policy: &str, current: i64, desired: i64| {
            json!({"spec": {"unhealthyPodEvictionPolicy": policy},
                   "status": {"currentHealthy": current, "desiredHealthy": desired}})
        };
        assert!(unhealthy_may_go(&pdb("AlwaysAllow", 0, 3), &unready));
        assert!(!unhealthy_may_go(&pdb("IfHealthyBudget", 2, 3), &unready));
        assert!(unhealthy_may_go(&pdb("IfHealthyBudget", 3, 3), &unready));
        assert!(!unhealthy_may_go(&pdb("IfHealthyBudget", 0, 0), &unready));
        assert!(!unhealthy_may_go(&pdb("AlwaysAllow", 3, 3), &ready));
    }
}
