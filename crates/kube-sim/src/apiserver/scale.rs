//! The `scale` subresource of Deployments, ReplicaSets and StatefulSets (an
//! `autoscaling/v1` Scale), which `kubectl scale` reads and patches.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{Value, json};

use super::Ctx;
use super::meta::meta_str;
use super::patch::{self, PatchKind};
use super::request::{Req, Target, get};
use super::status::{ApiError, ApiResult};
use super::write::{CommitError, commit_update, merge_for_update};

/// Attempts before giving up on a workload that keeps changing under the scale write.
const MAX_RACE_RETRIES: usize = 16;

/// `matchLabels` of a workload's selector in label-selector syntax.
fn selector_string(obj: &Value) -> String {
    let labels = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object);
    let mut terms: Vec<String> = labels
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    terms.sort();
    terms.join(",")
}

/// The Scale view of a workload.
pub(crate) fn scale_of(obj: &Value) -> Value {
    let meta = |k: &str| {
        obj.pointer(&format!("/metadata/{k}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta("name"), "namespace": meta("namespace"), "uid": meta("uid"),
                     "resourceVersion": meta("resourceVersion"), "creationTimestamp": meta("creationTimestamp")},
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {"replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
                   "selector": selector_string(obj)},
    })
}

/// The Scale a PUT or PATCH asks for, computed against the current one.
fn desired(req: &Req, current: &Value, patch_kind: Option<PatchKind>) -> ApiResult<Value> {
    let body = req.required_json()?;
    match patch_kind {
        Some(kind) => patch::apply(kind, current, &body),
        None => Ok(body),
    }
}

/// PUT or PATCH of `.../scale`: sets `spec.replicas` of the workload.
pub(crate) async fn write(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
    is_patch: bool,
) -> ApiResult<(StatusCode, Value)> {
    let def = &target.def;
    let name = target.name.clone().unwrap_or_default();
    let patch_kind = match is_patch {
        true => Some(
            PatchKind::from_content_type(&req.content_type).ok_or_else(|| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format",
                )
            })?,
        ),
        false => None,
    };
    let workload = Target {
        sub: None,
        ..target.clone()
    };
    for _ in 0..MAX_RACE_RETRIES {
        let old = get(ctx, &workload)?;
        let scale = desired(req, &scale_of(&old), patch_kind)?;
        let rv = meta_str(&scale, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::stale(&def.group, &def.plural, &name));
        }
        let replicas = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .filter(|r| *r >= 0)
            .ok_or_else(|| {
                ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    &name,
                    "spec.replicas: Invalid value: must be a non-negative integer",
                )
            })?;
        let mut new = old.clone();
        new["spec"]["replicas"] = json!(replicas);
        let new = merge_for_update(def, None, &old, new);
        match commit_update(ctx, &workload, req, &old, new).await {
            Ok(stored) => return Ok((StatusCode::OK, scale_of(&stored))),
            Err(CommitError::Race) => continue,
            Err(CommitError::Api(e)) => return Err(e),
        }
    }
    Err(ApiError::stale(&def.group, &def.plural, &name))
}
