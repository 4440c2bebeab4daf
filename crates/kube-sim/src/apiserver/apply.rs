//! Server-side apply (`PATCH` with `application/apply-patch+yaml`), on the field
//! ownership `managed` keeps in `metadata.managedFields`.
//!
//! Modelled on upstream's field manager
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager`, the
//! `k8s.io/apimachinery/pkg/util/managedfields/internal` package it wraps, and
//! structured-merge-diff): an apply creates the object when absent; otherwise the applied
//! configuration is merged into the live object (maps merge, lists with a merge key merge
//! by it, set lists union, other lists are atomic), fields the manager applied before and
//! no longer applies are removed unless someone else owns them, and a field another
//! manager owns with a different value is a conflict (409, `internal/conflict.go`
//! wording) unless `force=true`, which takes the field over.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{Value, json};

use super::Ctx;
use super::managed::{
    Entry, FieldPath, display, entries_of, fields_of, get_at, remove_at, set_entries,
};
use super::meta::meta_str;
use super::patch::{self, PatchKind};
use super::request::{Req, Target, get};
use super::resources::ResourceDef;
use super::schema;
use super::status::{ApiError, ApiResult, Cause};
use super::write::{self, CommitError, Fields};

/// The parsed apply request.
struct Applied {
    manager: String,
    force: bool,
    config: Value,
}

fn parse(def: &ResourceDef, req: &Req) -> ApiResult<Applied> {
    let manager = req
        .param("fieldManager")
        .ok_or_else(|| {
            ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests",
            )
        })?
        .to_string();
    let text = std::str::from_utf8(&req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let config: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "apply configuration must be an object",
        ));
    }
    let sent = |k: &str| {
        config
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    if sent("apiVersion") != def.api_version() || sent("kind") != def.kind {
        return Err(ApiError::bad_request(format!(
            "apply configuration must name apiVersion {} and kind {}, got {:?} {:?}",
            def.api_version(),
            def.kind,
            sent("apiVersion"),
            sent("kind")
        )));
    }
    declared_only(def, &config)?;
    Ok(Applied {
        manager,
        force: req.flag("force"),
        config,
    })
}

/// An apply configuration of a custom resource may only hold fields its schema declares,
/// whatever `fieldValidation` says: structured-merge-diff cannot type the others, and
/// kube-apiserver answers 500 (`failed to create typed patch object` in
/// apimachinery pkg/util/managedfields/internal/structuredmerge.go, with
/// structured-merge-diff's `field not declared in schema` for each; upstream names at
/// most one per object, this lists all).
fn declared_only(def: &ResourceDef, config: &Value) -> ApiResult<()> {
    let Some(schema_def) = def.schema.as_deref().filter(|_| def.custom) else {
        return Ok(());
    };
    let unknown = schema::prune(schema_def, &mut config.clone());
    let errors: Vec<String> = unknown
        .iter()
        .map(|path| format!(".{path}: field not declared in schema"))
        .collect();
    let listed = match errors.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        many => format!("errors:\n  {}", many.join("\n  ")),
    };
    Err(ApiError::new(
        500,
        "",
        format!(
            "failed to create typed patch object ({}/{}; {}, Kind={}): {listed}",
            meta_str(config, "namespace"),
            meta_str(config, "name"),
            def.api_version(),
            def.kind
        ),
    ))
}

/// PATCH with an apply configuration.
pub(crate) async fn apply(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let def = &target.def;
    let name = target.name.clone().unwrap_or_default();
    let applied = parse(def, req)?;
    let config_name = meta_str(&applied.config, "name");
    if !config_name.is_empty() && config_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({config_name}) does not match the name on the URL ({name})"
        )));
    }
    for _ in 0..16 {
        let old = match get(ctx, target) {
            Ok(old) => old,
            Err(e) if e.code == 404 && target.sub.is_none() => {
                return create(ctx, target, req, &applied, &name).await;
            }
            Err(e) => return Err(e),
        };
        let new = merged(def, target, &old, &applied)?;
        let new = write::prepare_body(def, new, Fields::of(req))?;
        let mut new = write::merge_for_update(def, target.sub.as_deref(), &old, new);
        let entries = ownership(def, &old, &new, &applied)?;
        set_entries(&mut new, &entries);
        match write::commit_update(ctx, target, req, &old, new).await {
            Ok(v) => return Ok((StatusCode::OK, v)),
            Err(CommitError::Race) => continue,
            Err(CommitError::Api(e)) => return Err(e),
        }
    }
    Err(ApiError::stale(&def.group, &def.plural, &name))
}

async fn create(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
    applied: &Applied,
    name: &str,
) -> ApiResult<(StatusCode, Value)> {
    let mut obj = applied.config.clone();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("name".into(), json!(name));
    }
    let entry = Entry {
        manager: applied.manager.clone(),
        apply: true,
        api_version: target.def.api_version(),
        subresource: String::new(),
        fields: fields_of(&target.def, &applied.config),
    };
    write::create_object(ctx, target, req, obj, vec![entry.to_json()]).await
}

/// The live object with the configuration merged in and the manager's dropped fields
/// removed (when nobody else owns them).
fn merged(def: &ResourceDef, target: &Target, old: &Value, applied: &Applied) -> ApiResult<Value> {
    let mut config = applied.config.clone();
    if target.sub.is_none()
        && def.has_status()
        && let Some(map) = config.as_object_mut()
    {
        map.remove("status");
    }
    let mut new = patch::apply(PatchKind::Strategic, old, &config)?;
    let entries = entries_of(old);
    let now = fields_of(def, &applied.config);
    let mine = entries
        .iter()
        .find(|e| e.apply && e.manager == applied.manager)
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    for path in mine.difference(&now) {
        let owned_elsewhere = entries
            .iter()
            .any(|e| !(e.apply && e.manager == applied.manager) && e.fields.contains(path));
        if !owned_elsewhere {
            remove_at(&mut new, path);
        }
    }
    Ok(new)
}

/// The managedFields after the apply, or the 409 listing conflicts.
fn ownership(
    def: &ResourceDef,
    old: &Value,
    new: &Value,
    applied: &Applied,
) -> ApiResult<Vec<Entry>> {
    let mut entries = entries_of(old);
    let fields = fields_of(def, &applied.config);
    let mut conflicts: Vec<(String, FieldPath)> = Vec::new();
    for entry in &mut entries {
        if entry.apply && entry.manager == applied.manager {
            continue;
        }
        let contested: Vec<FieldPath> = entry
            .fields
            .iter()
            .filter(|p| fields.contains(*p) && get_at(old, p) != get_at(new, p))
            .cloned()
            .collect();
        if applied.force {
            entry.fields.retain(|p| !contested.contains(p));
        } else {
            conflicts.extend(contested.into_iter().map(|p| (entry.printed(), p)));
        }
    }
    if !conflicts.is_empty() {
        return Err(conflict_error(def, meta_str(old, "name"), conflicts));
    }
    entries.retain(|e| !(e.apply && e.manager == applied.manager));
    entries.push(Entry {
        manager: applied.manager.clone(),
        apply: true,
        api_version: def.api_version(),
        subresource: String::new(),
        fields,
    });
    Ok(entries)
}

/// 409 in upstream's words (`managedfields/internal/conflict.go`, NewConflictError), one
/// `FieldManagerConflict` cause per contested field.
fn conflict_error(
    def: &ResourceDef,
    name: &str,
    mut conflicts: Vec<(String, FieldPath)>,
) -> ApiError {
    conflicts.sort();
    let message = if let [(manager, path)] = conflicts.as_slice() {
        format!(
            "Apply failed with 1 conflict: conflict with {manager}: {}",
            display(path)
        )
    } else {
        let mut lines = Vec::new();
        let mut last = "";
        for (manager, path) in &conflicts {
            if manager != last {
                lines.push(format!("conflicts with {manager}:"));
                last = manager;
            }
            lines.push(format!("- {}", display(path)));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut error =
        ApiError::new(409, "Conflict", message).with_details(&def.group, &def.plural, name);
    error.causes = conflicts
        .iter()
        .map(|(manager, path)| Cause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {manager}"),
            field: display(path),
        })
        .collect();
    error
}

#[cfg(test)]
mod tests {
    use super::super::managed::Seg;
    use super::super::managed::tests::deployment_def;
    use super::*;

    #[test]
    fn conflicts_are_worded_like_upstream() {
        let def = deployment_def();
        let replicas = vec![Seg::Field("spec".into()), Seg::Field("replicas".into())];
        let one = conflict_error(
            &def,
            "web",
            vec![("\"kubectl\" using apps/v1".into(), replicas.clone())],
        );
        assert_eq!(
            one.message,
            "Apply failed with 1 conflict: conflict with \"kubectl\" using apps/v1: .spec.replicas"
        );
        let paused = vec![Seg::Field("spec".into()), Seg::Field("paused".into())];
        let two = conflict_error(
            &def,
            "web",
            vec![("\"a\"".into(), replicas), ("\"a\"".into(), paused)],
        );
        assert_eq!(
            two.message,
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.paused\n- .spec.replicas"
        );
        assert_eq!(two.code, 409);
    }
}
