//! `POST pods/{name}/eviction` with the upstream PodDisruptionBudget rules (docs/design.md §4).
//!
//! Order: decode the policy/v1 Eviction (unknown fields dropped, so options sent under
//! a misspelled key are lost) → 404 if the pod is gone → admission (CREATE
//! pods/eviction, kind policy/v1 Eviction; a webhook may turn it into a dry run) →
//! preconditions (409) → pods that are terminating, pending or finished skip the PDB
//! check → more than one PDB: 500 → PDB not observed yet: 429 (Retry-After 10) → no
//! disruption left: 429 (Retry-After 0) → record the pod in `status.disruptedPods` and
//! decrement `disruptionsAllowed` in one resourceVersion-guarded status update → mark
//! the pod with a DisruptionTarget condition → delete it with the eviction's options.

use std::sync::Arc;

use http::StatusCode;
use k8s_openapi::api::policy::v1::Eviction;
use serde_json::{Value, json};

use super::Ctx;
use super::admission::{self, Attributes, Operation};
use super::handler::{Req, Target, get};
use super::selector::selector_object_matches;
use super::status::{ApiError, ApiResult};
use super::store::{StoreError, rv_of};
use super::write::{
    DeleteOpts, check_preconditions, delete_object, delete_options, now, success_status,
};

/// Evaluation rounds when the PDB or pod changes under us (upstream retries similarly).
const MAX_ROUNDS: usize = 16;

/// Retry-After for a PDB its controller has not observed yet (upstream value).
const UNOBSERVED_RETRY_SECONDS: u64 = 10;

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

/// Answers an eviction request.
pub(crate) async fn evict(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let name = target.name.clone().unwrap_or_default();
    let mut eviction = decode(req.json()?)?;
    let body_name = eviction
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let pod = get(ctx, target)?;
    let options = eviction.get("deleteOptions").cloned();
    let dry_run = delete_options(options.clone(), req)?.dry_run;
    let attrs = Attributes {
        target,
        user: &req.user,
        operation: Operation::Create,
        name: name.clone(),
        object: Some(eviction.clone()),
        old_object: None,
        options: json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                        "dryRun": if dry_run { json!(["All"]) } else { Value::Null }}),
        dry_run,
        kind: Some(("policy".into(), "v1".into(), "Eviction".into())),
    };
    if let Some(mutated) = admission::admit(ctx, attrs).await?.object {
        eviction = decode(Some(mutated))?;
    }
    let opts = delete_options(eviction.get("deleteOptions").cloned(), req)?;
    check_preconditions(&target.def, &pod, &opts)?;
    for _ in 0..MAX_ROUNDS {
        match evict_round(ctx, target, &name, &opts)? {
            Round::Done => return Ok((StatusCode::CREATED, success_status())),
            Round::Retry => continue,
        }
    }
    Err(ApiError::new(
        429,
        "TooManyRequests",
        format!(
            "evict pod {}/{name}: too many concurrent changes, try again",
            target.namespace
        ),
    )
    .with_retry(1))
}

enum Round {
    Done,
    Retry,
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

/// Pods whose eviction never needs a PDB's permission (upstream `canIgnorePDB`).
fn ignores_pdb(pod: &Value) -> bool {
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    matches!(phase, "Succeeded" | "Failed" | "Pending")
        || pod.pointer("/metadata/deletionTimestamp").is_some()
}

fn evict_round(ctx: &Arc<Ctx>, target: &Target, name: &str, opts: &DeleteOpts) -> ApiResult<Round> {
    let pod = get(ctx, target)?;
    check_preconditions(&target.def, &pod, opts)?;
    if ignores_pdb(&pod) {
        return finish(ctx, target, name, &pod, opts);
    }
    let (pdbs, _) = ctx.store.list(
        "policy/poddisruptionbudgets",
        &format!("{}/", target.namespace),
    );
    let labels = pod.pointer("/metadata/labels");
    let matching: Vec<Value> = pdbs
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| {
            let selector = p.pointer("/spec/selector");
            // A PDB with no selector selects nothing; an empty one selects everything.
            selector.is_some_and(|s| !s.is_null()) && selector_object_matches(selector, labels)
        })
        .collect();
    let pdb = match matching.as_slice() {
        [] => return finish(ctx, target, name, &pod, opts),
        [one] => one.clone(),
        _ => {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    match check_and_decrement(ctx, &pdb, name, &pod, opts.dry_run)? {
        true => finish(ctx, target, name, &pod, opts),
        false => Ok(Round::Retry),
    }
}

fn budget_error(pdb_name: &str, retry: u64, cause: String) -> ApiError {
    let mut error = ApiError::new(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    )
    .with_retry(retry);
    error.causes.push(("DisruptionBudget".into(), cause));
    error.with_details("policy", "poddisruptionbudgets", pdb_name)
}

/// Checks the PDB and, unless dry-run, records the disruption; `Ok(false)` when the
/// PDB changed meanwhile and the round must be re-evaluated.
fn check_and_decrement(
    ctx: &Ctx,
    pdb: &Value,
    pod_name: &str,
    pod: &Value,
    dry_run: bool,
) -> ApiResult<bool> {
    let int = |p: &str| pdb.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let pdb_name = pdb
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if int("/status/observedGeneration") < int("/metadata/generation") {
        let cause =
            format!("The disruption budget {pdb_name} is still being processed by the server.");
        return Err(budget_error(pdb_name, UNOBSERVED_RETRY_SECONDS, cause));
    }
    let allowed = int("/status/disruptionsAllowed");
    let (current, desired) = (int("/status/currentHealthy"), int("/status/desiredHealthy"));
    let always_allow_unhealthy = pdb
        .pointer("/spec/unhealthyPodEvictionPolicy")
        .and_then(Value::as_str)
        == Some("AlwaysAllow");
    // An unready pod does not count as healthy; evicting it costs no disruption when
    // the budget is otherwise met (or the policy always allows it).
    if !pod_ready(pod) && (always_allow_unhealthy || (current >= desired && desired > 0)) {
        return Ok(true);
    }
    if allowed < 0 {
        return Err(ApiError::new(
            403,
            "Forbidden",
            format!(
                "poddisruptionbudgets.policy \"{pdb_name}\" is forbidden: pdb disruptions allowed is negative"
            ),
        ));
    }
    if allowed == 0 {
        let cause = format!(
            "The disruption budget {pdb_name} needs {desired} healthy pods and has {current} currently"
        );
        return Err(budget_error(pdb_name, 0, cause));
    }
    if dry_run {
        return Ok(true);
    }
    record_disruption(ctx, pdb, pod_name, allowed)
}

/// Records the pod in `status.disruptedPods` and takes one disruption, guarded by the
/// PDB's resourceVersion; `Ok(false)` when another writer got there first.
fn record_disruption(ctx: &Ctx, pdb: &Value, pod_name: &str, allowed: i64) -> ApiResult<bool> {
    let pdb_name = pdb
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let namespace = pdb
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut updated = pdb.clone();
    updated["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if !updated["status"]["disruptedPods"].is_object() {
        updated["status"]["disruptedPods"] = json!({});
    }
    updated["status"]["disruptedPods"][pod_name] = json!(now());
    let key = format!("{namespace}/{pdb_name}");
    match ctx
        .store
        .update("policy/poddisruptionbudgets", &key, rv_of(pdb), updated)
    {
        Ok(_) => Ok(true),
        Err(StoreError::Conflict) => Ok(false),
        Err(_) => Err(ApiError::not_found(
            "policy",
            "poddisruptionbudgets",
            pdb_name,
        )),
    }
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

/// Marks the pod as a disruption target and deletes it with the eviction's options.
fn finish(
    ctx: &Arc<Ctx>,
    target: &Target,
    name: &str,
    pod: &Value,
    opts: &DeleteOpts,
) -> ApiResult<Round> {
    if opts.dry_run {
        return Ok(Round::Done);
    }
    let key = target.def.key(&target.namespace, name);
    // The budget is already charged: mark the current pod, retrying only this step.
    let mut current = pod.clone();
    for _ in 0..MAX_ROUNDS {
        if current.pointer("/metadata/deletionTimestamp").is_some() {
            break;
        }
        match ctx.store.update(
            &target.def.table(),
            &key,
            rv_of(&current),
            with_disruption_condition(&current),
        ) {
            Ok(_) => break,
            Err(StoreError::Conflict) => match ctx.store.get(&target.def.table(), &key) {
                Some(fresh) => current = fresh,
                None => break,
            },
            Err(_) => break,
        }
    }
    delete_object(ctx, &target.def, &target.namespace, name, opts)?;
    Ok(Round::Done)
}
