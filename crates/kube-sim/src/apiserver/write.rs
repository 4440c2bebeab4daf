//! The write verbs: create, update (PUT), patch, delete, deletecollection and
//! `pods/binding`, with the upstream object lifecycle: server-set metadata (uid,
//! creationTimestamp, generation, resourceVersion), status owned by the status
//! subresource, optimistic concurrency, finalizers, namespace cascade and background
//! garbage collection of owned objects. DELETE itself lives in the `delete` module, which
//! builds on this one.

use std::sync::Arc;

use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;
use rand::Rng;
use serde_json::{Map, Value, json};

use super::admission::{self, Attributes, Operation};
use super::defaults;
use super::managed::{self, APPLY_YAML};
use super::meta::{meta_mut, meta_str, no_metadata, now};
use super::patch::{self, PatchKind};
use super::request::{Req, Target, UserInfo, add_warning, check_deadline, get};
use super::resources::ResourceDef;
use super::schema;
use super::status::{ApiError, ApiResult, Cause};
use super::store::{StoreError, rv_of};
use super::{Ctx, NOT_READY_TAINT};

/// How often a write retries after losing a resourceVersion race with another writer
/// (patch and delete retry internally like upstream's GuaranteedUpdate).
pub(crate) const MAX_RACE_RETRIES: usize = 16;

/// A store write that lost a race, or a real failure.
pub(crate) enum CommitError {
    Race,
    Api(ApiError),
}

impl From<ApiError> for CommitError {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

/// How the request wants unknown fields treated: its `fieldValidation` directive
/// (`fieldValidation` in staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fields {
    /// Drop them silently (`Ignore`, and objects mutated by webhooks).
    Ignore,
    /// Drop them with a `Warning` header each (`Warn`, the default; kube-rs sends no
    /// directive). Built-in kinds drop them silently here.
    Warn,
    /// Reject the write naming them (`Strict`, kubectl's default).
    Strict,
}

impl Fields {
    pub(crate) fn of(req: &Req) -> Self {
        match req.param("fieldValidation") {
            Some("Strict") => Self::Strict,
            Some("Ignore") => Self::Ignore,
            _ => Self::Warn,
        }
    }
}

/// What a write decoded, which decides how a strict decoding failure is worded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// The body of a create or update: 400 `<Kind> in version "<v>" cannot be handled
    /// as a <Kind>: strict decoding error: …` (`transformDecodeError` in handlers/rest.go).
    Object,
    /// The object a JSON or merge patch produced: 422 on the field `patch`
    /// (`jsonPatcher.applyPatchToCurrentObject` in handlers/patch.go).
    Patch,
}

/// Paths present (non-null) in `input` but gone from `output`.
fn dropped_fields(input: &Value, output: &Value, path: &str, out: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match b.get(key) {
                    None if !value.is_null() => out.push(child),
                    Some(other) => dropped_fields(value, other, &child, out),
                    None => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                dropped_fields(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Sets apiVersion/kind, drops unknown fields (reporting them as `fields` asks) and
/// applies server-side defaults: the decoding of a create or update body.
pub(crate) fn prepare_body(def: &ResourceDef, body: Value, fields: Fields) -> ApiResult<Value> {
    prepare(def, body, fields, Decoded::Object)
}

/// [`prepare_body`] for the object a JSON or merge patch produced.
pub(crate) fn prepare_patched(
    def: &ResourceDef,
    patched: Value,
    fields: Fields,
) -> ApiResult<Value> {
    prepare(def, patched, fields, Decoded::Patch)
}

fn prepare(def: &ResourceDef, body: Value, fields: Fields, decoded: Decoded) -> ApiResult<Value> {
    let Value::Object(mut map) = body else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    map.insert("apiVersion".into(), json!(def.api_version()));
    map.insert("kind".into(), json!(def.kind));
    let mut obj = Value::Object(map);
    let input = (fields == Fields::Strict).then(|| obj.clone());
    let unknown = decode(def, &mut obj, input.as_ref())?;
    report_unknown(def, fields, decoded, input.as_ref(), &unknown)?;
    if def.normalize.is_some() {
        defaults::apply(def, &mut obj);
    } else if let Some(schema) = &def.schema {
        defaults::from_schema(schema, &mut obj);
    }
    super::validation::validate(def, &obj)?;
    meta_mut(&mut obj)
        .ok_or_else(no_metadata)?
        .remove("managedFields");
    Ok(obj)
}

/// Drops the fields the kind does not know and returns their paths: built-in kinds
/// round-trip through their types (paths found only when `input`, the strict request's
/// body, is given), custom resources are pruned by their schema.
fn decode(def: &ResourceDef, obj: &mut Value, input: Option<&Value>) -> ApiResult<Vec<String>> {
    let mut unknown = Vec::new();
    if let Some(normalize) = def.normalize {
        *obj = normalize(std::mem::take(obj))
            .map_err(|e| ApiError::bad_request(format!("decode {} body: {e}", def.kind)))?;
        if let Some(input) = input {
            dropped_fields(input, obj, "", &mut unknown);
        }
    } else if let Some(schema) = &def.schema {
        unknown = schema::prune(schema, obj);
        schema::drop_nulls(Some(schema), obj);
    }
    Ok(unknown)
}

/// Refuses (`Strict`), warns about (`Warn`, custom resources) or ignores the unknown
/// fields of a write (`addStrictDecodingWarnings` in handlers/rest.go).
fn report_unknown(
    def: &ResourceDef,
    fields: Fields,
    decoded: Decoded,
    input: Option<&Value>,
    unknown: &[String],
) -> ApiResult<()> {
    if unknown.is_empty() {
        return Ok(());
    }
    let each = unknown.iter().map(|f| format!("unknown field \"{f}\""));
    match fields {
        Fields::Ignore => Ok(()),
        Fields::Warn => {
            each.for_each(|w| add_warning(&w));
            Ok(())
        }
        Fields::Strict => {
            let text = format!(
                "strict decoding error: {}",
                each.collect::<Vec<_>>().join(", ")
            );
            Err(strict_error(def, decoded, input, text))
        }
    }
}

/// The refusal of a strict write with unknown fields.
fn strict_error(
    def: &ResourceDef,
    decoded: Decoded,
    input: Option<&Value>,
    text: String,
) -> ApiError {
    let kind = &def.kind;
    match decoded {
        Decoded::Object => ApiError::bad_request(format!(
            "{kind} in version \"{}\" cannot be handled as a {kind}: {text}",
            def.version
        )),
        Decoded::Patch => {
            let patched = input.map(Value::to_string).unwrap_or_default();
            let body = format!("Invalid value: {}: {text}", schema::quote(&patched));
            let mut error =
                ApiError::new(422, "Invalid", format!(" \"\" is invalid: patch: {body}"));
            error.causes.push(Cause {
                reason: "FieldValueInvalid".into(),
                message: body,
                field: "patch".into(),
            });
            error
        }
    }
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Object name rules: RBAC objects only need a valid path segment (they carry names
/// like `system:controller:x`); everything else here is a DNS subdomain.
fn valid_name(def: &ResourceDef, name: &str) -> bool {
    if def.group == "rbac.authorization.k8s.io" {
        return !matches!(name, "" | "." | "..") && !name.contains(['/', '%']);
    }
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The name of a new object: given, or generated from `generateName`.
fn resolve_name(def: &ResourceDef, meta: &Map<String, Value>) -> ApiResult<String> {
    let field = |k: &str| {
        meta.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (name, generate) = (field("name"), field("generateName"));
    match (name.is_empty(), generate.is_empty()) {
        (false, _) => Ok(name),
        (true, false) => Ok(format!("{generate}{}", random_suffix())),
        (true, true) => Err(ApiError::invalid(
            &def.group,
            &def.kind,
            "",
            "metadata.name: Required value: name or generateName is required",
        )),
    }
}

/// Server-set metadata of a new object.
pub(crate) fn init_metadata(ctx: &Ctx, target: &Target, obj: &mut Value) -> ApiResult<()> {
    let def = &target.def;
    let body_ns = meta_str(obj, "namespace").to_string();
    let meta = meta_mut(obj).ok_or_else(no_metadata)?;
    if def.namespaced {
        if !body_ns.is_empty() && body_ns != target.namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta.insert("namespace".into(), json!(target.namespace));
    } else {
        meta.remove("namespace");
    }
    let name = resolve_name(def, meta)?;
    if !valid_name(def, &name) {
        return Err(ApiError::invalid(
            &def.group,
            &def.kind,
            &name,
            format!(
                "metadata.name: Invalid value: {name:?}: must be a lowercase RFC 1123 subdomain"
            ),
        ));
    }
    let stale_rv = meta.get("resourceVersion").and_then(Value::as_str);
    if stale_rv.is_some_and(|rv| !rv.is_empty()) {
        // Upstream's storage refuses this with a 500; it catches objects re-created
        // from a fetched copy.
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    meta.insert("name".into(), json!(name));
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    meta.insert("generation".into(), json!(1));
    for field in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(field);
    }
    if def.namespaced {
        let exists = ctx.store.get("/namespaces", &target.namespace).is_some();
        if !exists {
            return Err(ApiError::not_found("", "namespaces", &target.namespace));
        }
    }
    Ok(())
}

/// The label every Namespace carries with its own name, set on create and on update
/// whatever the client or a webhook sent (upstream `pkg/registry/core/namespace/strategy.go`,
/// PrepareForCreate and PrepareForUpdate), so selectors can pick namespaces by name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn label_namespace(def: &ResourceDef, obj: &mut Value) {
    if !(def.group.is_empty() && def.plural == "namespaces") {
        return;
    }
    let name = meta_str(obj, "name").to_string();
    let Some(meta) = meta_mut(obj) else {
        return;
    };
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    labels[NAMESPACE_NAME_LABEL] = json!(name);
}

/// Status a new object starts with (upstream strategies' PrepareForCreate).
pub(crate) fn prepare_for_create(def: &ResourceDef, obj: &mut Value) {
    label_namespace(def, obj);
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => {
            map.insert("status".into(), json!({"phase": "Pending"}));
        }
        ("", "namespaces") => {
            map.insert("status".into(), json!({"phase": "Active"}));
        }
        // Admission plugin TaintNodesByCondition taints every new Node not-ready until
        // the node lifecycle controller sees it Ready (`addNotReadyTaint` in
        // plugin/pkg/admission/nodetaint/admission.go, v1.37.2).
        ("", "nodes") => add_not_ready_taint(map),
        ("apps", "daemonsets") => {
            map.remove("status");
            let asked = template_generation(obj).filter(|g| *g >= 1);
            set_template_generation(obj, asked.unwrap_or(1));
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            let names = map.get("spec").and_then(|s| s.get("names")).cloned();
            map.insert(
                "status".into(),
                json!({
                    "acceptedNames": names,
                    "storedVersions": stored_versions(map.get("spec")),
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                         "message": "no conflicts found", "lastTransitionTime": now()},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                         "message": "the initial names have been accepted", "lastTransitionTime": now()},
                    ],
                }),
            );
        }
        _ if def.has_status() => {
            map.remove("status");
        }
        _ => {}
    }
    default_custom_status(def, obj);
}

/// A DaemonSet's template generation, which apps/v1 carries in this annotation
/// (`DeprecatedTemplateGeneration`; pkg/apis/apps/v1/conversion.go writes
/// `Spec.TemplateGeneration` there, v1.37.2).
pub(crate) const DAEMONSET_TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

fn template_generation(ds: &Value) -> Option<i64> {
    ds.pointer("/metadata/annotations")?
        .get(DAEMONSET_TEMPLATE_GENERATION)?
        .as_str()?
        .parse()
        .ok()
}

fn set_template_generation(ds: &mut Value, generation: i64) {
    if let Some(meta) = meta_mut(ds) {
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if !annotations.is_object() {
            *annotations = json!({});
        }
        annotations[DAEMONSET_TEMPLATE_GENERATION] = json!(generation.to_string());
    }
}

/// A custom resource with a status subresource starts without status: kube-apiserver
/// drops what the create body sent (`PrepareForCreate` in k8s.io/apiextensions-apiserver
/// pkg/registry/customresource/strategy.go). Every read of it from etcd is defaulted by
/// the CRD's schema again, so clients see the status the schema's defaults make of
/// nothing (a `status` defaulting to `{}` with a `phase` defaulting to `Pending` reads as
/// `{"phase": "Pending"}`); the simulated store keeps what it serves, so the defaults are
/// applied here, once the status is gone.
fn default_custom_status(def: &ResourceDef, obj: &mut Value) {
    if let Some(schema) = def.schema.as_ref().filter(|_| def.has_status()) {
        defaults::from_schema(schema, obj);
    }
}

fn add_not_ready_taint(node: &mut serde_json::Map<String, Value>) {
    let spec = node.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    let taints = spec.entry("taints").or_insert_with(|| json!([]));
    let Some(taints) = taints.as_array_mut() else {
        return;
    };
    let present = taints
        .iter()
        .any(|t| t["key"] == NOT_READY_TAINT && t["effect"] == "NoSchedule");
    if !present {
        taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
}

fn stored_versions(spec: Option<&Value>) -> Vec<String> {
    spec.and_then(|s| s.get("versions"))
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Side effects of a stored object (CRDs start serving their resources).
fn after_store(ctx: &Ctx, def: &ResourceDef, obj: &Value) {
    if def.group == "apiextensions.k8s.io" && def.plural == "customresourcedefinitions" {
        ctx.registry.install_crd(obj);
    }
}

/// Creates a namespace at start-up (no admission).
pub(crate) fn bootstrap_namespace(ctx: &Ctx, name: &str) -> ApiResult<()> {
    let def = ctx
        .registry
        .find("", "v1", "namespaces")
        .ok_or_else(|| ApiError::internal("namespaces are not served"))?;
    let target = Target {
        def: def.clone(),
        namespace: String::new(),
        name: None,
        sub: None,
    };
    let mut obj = prepare_body(&def, json!({"metadata": {"name": name}}), Fields::Ignore)?;
    init_metadata(ctx, &target, &mut obj)?;
    prepare_for_create(&def, &mut obj);
    match ctx.store.create(&def.table(), name, obj) {
        Ok(_) | Err(StoreError::AlreadyExists) => Ok(()),
        Err(e) => Err(ApiError::internal(format!("{e:?}"))),
    }
}

fn admission_attrs<'a>(
    target: &'a Target,
    req: &'a Req,
    operation: Operation,
    name: &str,
    object: Option<Value>,
    old_object: Option<Value>,
    options: Value,
) -> Attributes<'a> {
    Attributes {
        target,
        user: &req.user,
        operation,
        name: name.to_string(),
        object,
        old_object,
        options,
        dry_run: req.dry_run(),
        kind: None,
    }
}

/// POST to a collection.
pub(crate) async fn create(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let body = req.required_json()?;
    create_object(ctx, target, req, body, Vec::new()).await
}

/// Creates `body`; `managed_fields` are the entries of a server-side apply, else the
/// write is recorded as the creator's Update.
pub(crate) async fn create_object(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
    body: Value,
    managed_fields: Vec<Value>,
) -> ApiResult<(StatusCode, Value)> {
    let def = &target.def;
    let mut obj = prepare_body(def, body, Fields::of(req))?;
    init_metadata(ctx, target, &mut obj)?;
    prepare_for_create(def, &mut obj);
    let name = meta_str(&obj, "name").to_string();
    let mut obj = admit_create(ctx, target, req, obj).await?;
    if managed_fields.is_empty() {
        managed::record_update(target, req, None, &mut obj);
    } else if let Some(meta) = meta_mut(&mut obj) {
        meta.insert("managedFields".into(), Value::Array(managed_fields));
    }
    if req.dry_run() {
        return Ok((StatusCode::CREATED, obj));
    }
    check_deadline()?;
    let key = def.key(&target.namespace, &name);
    let stored = ctx
        .store
        .create(&def.table(), &key, def.view.to_storage(obj))
        .map(|v| def.view.served(v))
        .map_err(|_| ApiError::already_exists(&def.group, &def.plural, &name))?;
    after_store(ctx, def, &stored);
    Ok((StatusCode::CREATED, stored))
}

/// Admission of a new object in kube-apiserver's order: mutating webhooks, the registry
/// strategy's validation (a custom resource's schema), validating webhooks. Returns the
/// object to store.
async fn admit_create(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
    mut obj: Value,
) -> ApiResult<Value> {
    let def = &target.def;
    let name = meta_str(&obj, "name").to_string();
    let options = json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"});
    let mut attrs = admission_attrs(
        target,
        req,
        Operation::Create,
        &name,
        Some(obj.clone()),
        None,
        options,
    );
    let admitted = admission::mutate(ctx, &mut attrs).await?;
    if let Some(mutated) = admitted.object {
        obj = fix_immutable(&obj, prepare_body(def, mutated, Fields::Ignore)?);
        label_namespace(def, &mut obj);
    }
    schema::check(def, &obj, None)?;
    admission::validate(ctx, &attrs).await?;
    Ok(obj)
}

/// Metadata fields clients and webhooks cannot change.
const IMMUTABLE_META: &[&str] = &[
    "uid",
    "name",
    "namespace",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
];

fn fix_immutable(old: &Value, mut new: Value) -> Value {
    let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let Some(meta) = meta_mut(&mut new) else {
        return new;
    };
    for field in IMMUTABLE_META {
        match old_meta.get(*field) {
            Some(v) => {
                meta.insert((*field).to_string(), v.clone());
            }
            None => {
                meta.remove(*field);
            }
        }
    }
    new
}

fn without_meta_and_status(obj: &Value) -> Value {
    let mut copy = obj.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    copy
}

/// The object an update stores: status from the right place, immutable metadata kept,
/// generation bumped when anything but metadata and status changed.
pub(crate) fn merge_for_update(
    def: &ResourceDef,
    sub: Option<&str>,
    old: &Value,
    new: Value,
) -> Value {
    if sub == Some("status") {
        let mut out = old.clone();
        if let Some(map) = out.as_object_mut() {
            match new.get("status") {
                Some(status) => map.insert("status".into(), status.clone()),
                None => map.remove("status"),
            };
        }
        return out;
    }
    let mut new = fix_immutable(old, new);
    label_namespace(def, &mut new);
    if def.has_status()
        && let Some(map) = new.as_object_mut()
    {
        match old.get("status") {
            Some(status) => map.insert("status".into(), status.clone()),
            None => map.remove("status"),
        };
    }
    if def.group == "apps" && def.plural == "daemonsets" {
        // The template generation is the API server's: an update keeps the old one, and
        // a changed template bumps it (`PrepareForUpdate` in
        // pkg/registry/apps/daemonset/strategy.go, v1.37.2).
        let kept = template_generation(old).unwrap_or(1);
        let changed = old.pointer("/spec/template") != new.pointer("/spec/template");
        set_template_generation(&mut new, kept + i64::from(changed));
    }
    if without_meta_and_status(old) != without_meta_and_status(&new) {
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if let Some(meta) = meta_mut(&mut new) {
            meta.insert("generation".into(), json!(generation + 1));
        }
    }
    new
}

pub(crate) fn finalizers_empty(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
}

/// Whether an object being deleted can now go (no finalizers, no pending grace period).
fn ready_to_remove(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
        && finalizers_empty(obj)
        && obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .is_none_or(|g| g == 0)
}

/// Upstream refuses finalizers added to an object that is being deleted.
fn check_new_finalizers(def: &ResourceDef, old: &Value, new: &Value) -> ApiResult<()> {
    if old.pointer("/metadata/deletionTimestamp").is_none() {
        return Ok(());
    }
    let list = |o: &Value| -> Vec<String> {
        o.pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map(|f| {
                f.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = list(old);
    let added: Vec<String> = list(new)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if added.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &def.group,
        &def.kind,
        meta_str(old, "name"),
        format!(
            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
        ),
    ))
}

/// Admission of an update in kube-apiserver's order: mutating webhooks, the registry
/// strategy's validation (a custom resource's schema, ratcheted against `old`),
/// validating webhooks. Returns the object to store.
async fn admit_update(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
    old: &Value,
    mut new: Value,
) -> ApiResult<Value> {
    let def = &target.def;
    let name = meta_str(old, "name").to_string();
    let options = json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"});
    let mut attrs = admission_attrs(
        target,
        req,
        Operation::Update,
        &name,
        Some(new.clone()),
        Some(old.clone()),
        options,
    );
    let admitted = admission::mutate(ctx, &mut attrs).await?;
    if let Some(mutated) = admitted.object {
        let mutated = prepare_body(def, mutated, Fields::Ignore)?;
        new = merge_for_update(def, target.sub.as_deref(), old, mutated);
    }
    schema::check(def, &new, Some(old))?;
    admission::validate(ctx, &attrs).await?;
    Ok(new)
}

/// Admits and stores an updated object (compare-and-swap on the old resourceVersion).
pub(crate) async fn commit_update(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
    old: &Value,
    new: Value,
) -> Result<Value, CommitError> {
    let def = &target.def;
    let name = meta_str(old, "name").to_string();
    let applied_fields = new.pointer("/metadata/managedFields").cloned();
    let mut new = admit_update(ctx, target, req, old, new).await?;
    if req.content_type.starts_with(APPLY_YAML) {
        if let (Some(fields), Some(meta)) = (applied_fields, meta_mut(&mut new)) {
            meta.insert("managedFields".into(), fields);
        }
    } else {
        managed::record_update(target, req, Some(old), &mut new);
    }
    check_new_finalizers(def, old, &new)?;
    if def.group.is_empty() && def.plural == "pods" && target.sub.is_none() {
        defaults::check_pod_update(old, &new)
            .map_err(|m| ApiError::invalid(&def.group, &def.kind, &name, m))?;
    }
    if req.dry_run() {
        return Ok(new);
    }
    check_deadline()?;
    let key = def.key(&target.namespace, &name);
    let expected = rv_of(old);
    let result = if ready_to_remove(&new) {
        ctx.store
            .remove(&def.table(), &key, expected, def.view.to_storage(new))
    } else {
        ctx.store
            .update(&def.table(), &key, expected, def.view.to_storage(new))
    }
    .map(|v| def.view.served(v));
    match result {
        Ok(stored) => {
            after_store(ctx, def, &stored);
            if stored.pointer("/metadata/deletionTimestamp").is_some()
                && ctx.store.get(&def.table(), &key).is_none()
            {
                after_remove(ctx, def, &stored);
            }
            Ok(stored)
        }
        Err(StoreError::Conflict) => Err(CommitError::Race),
        Err(StoreError::NotFound) => {
            Err(ApiError::not_found(&def.group, &def.plural, &name).into())
        }
        Err(StoreError::AlreadyExists) => Err(CommitError::Race),
    }
}

/// PUT to an object or its status.
pub(crate) async fn update(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let def = &target.def;
    let name = target.name.clone().unwrap_or_default();
    let body = req.required_json()?;
    let body = prepare_body(def, body, Fields::of(req))?;
    let body_name = meta_str(&body, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let old = get(ctx, target)?;
    let body_rv = meta_str(&body, "resourceVersion");
    if !body_rv.is_empty() && body_rv != meta_str(&old, "resourceVersion") {
        return Err(ApiError::stale(&def.group, &def.plural, &name));
    }
    let new = merge_for_update(def, target.sub.as_deref(), &old, body);
    match commit_update(ctx, target, req, &old, new).await {
        Ok(v) => Ok((StatusCode::OK, v)),
        Err(CommitError::Race) => Err(ApiError::stale(&def.group, &def.plural, &name)),
        Err(CommitError::Api(e)) => Err(e),
    }
}

/// PATCH of an object or its status.
pub(crate) async fn patch(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let def = &target.def;
    let name = target.name.clone().unwrap_or_default();
    let kind = PatchKind::from_content_type(&req.content_type)
        .filter(|k| !(def.custom && *k == PatchKind::Strategic))
        .ok_or_else(|| {
            ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json{}",
                    if def.custom { "" } else { ", application/strategic-merge-patch+json" }),
            )
        })?;
    let body = req.required_json()?;
    for _ in 0..MAX_RACE_RETRIES {
        let old = get(ctx, target)?;
        let patched = patch::apply(kind, &old, &body)?;
        let patched_rv = meta_str(&patched, "resourceVersion");
        if !patched_rv.is_empty() && patched_rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::stale(&def.group, &def.plural, &name));
        }
        let patched = prepare_patched(def, patched, Fields::of(req))?;
        let new = merge_for_update(def, target.sub.as_deref(), &old, patched);
        match commit_update(ctx, target, req, &old, new).await {
            Ok(v) => return Ok((StatusCode::OK, v)),
            Err(CommitError::Race) => continue,
            Err(CommitError::Api(e)) => return Err(e),
        }
    }
    Err(ApiError::stale(&def.group, &def.plural, &name))
}

/// Parsed DeleteOptions (body and query).
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOpts {
    pub grace: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
    /// The options as admission webhooks see them.
    pub raw: Value,
}

impl DeleteOpts {
    /// Sets the grace period, in the options webhooks see too.
    pub(crate) fn set_grace(&mut self, grace: i64) {
        self.grace = Some(grace);
        if let Some(raw) = self.raw.as_object_mut() {
            raw.insert("gracePeriodSeconds".into(), json!(grace));
        }
    }
}

/// DeleteOptions from a body (unknown fields dropped) plus query parameters.
pub(crate) fn delete_options(body: Option<Value>, req: &Req) -> ApiResult<DeleteOpts> {
    let mut options: DeleteOptions = match body {
        Some(v) => serde_json::from_value(v)
            .map_err(|e| ApiError::bad_request(format!("decode DeleteOptions: {e}")))?,
        None => DeleteOptions::default(),
    };
    if let Some(grace) = req.param("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
        options.grace_period_seconds = Some(grace);
    }
    if req.dry_run() {
        options.dry_run = Some(vec!["All".into()]);
    }
    if let Some(policy) = req.param("propagationPolicy") {
        options.propagation_policy = Some(policy.to_string());
    }
    let preconditions = options.preconditions.clone().unwrap_or_default();
    let mut raw = serde_json::to_value(&options).unwrap_or_else(|_| json!({}));
    raw["kind"] = json!("DeleteOptions");
    raw["apiVersion"] = json!("meta.k8s.io/v1");
    Ok(DeleteOpts {
        grace: options.grace_period_seconds,
        uid: preconditions.uid,
        resource_version: preconditions.resource_version,
        dry_run: options
            .dry_run
            .is_some_and(|d| d.iter().any(|v| v == "All")),
        raw,
    })
}

/// 409 when the DeleteOptions preconditions do not match the stored object.
pub(crate) fn check_preconditions(
    def: &ResourceDef,
    obj: &Value,
    opts: &DeleteOpts,
) -> ApiResult<()> {
    let name = meta_str(obj, "name");
    if let Some(uid) = &opts.uid
        && uid != meta_str(obj, "uid")
    {
        return Err(ApiError::conflict(
            &def.group,
            &def.plural,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(obj, "uid")
            ),
        ));
    }
    if let Some(rv) = &opts.resource_version
        && rv != meta_str(obj, "resourceVersion")
    {
        return Err(ApiError::conflict(
            &def.group,
            &def.plural,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta_str(obj, "resourceVersion")
            ),
        ));
    }
    Ok(())
}

/// Consequences of an object leaving storage: namespace contents go and CRDs stop being
/// served. (Owner references are left to the simulated garbage collector controller,
/// which deletes through the API like upstream's, so its deletions are admitted.)
pub(crate) fn after_remove(ctx: &Arc<Ctx>, def: &ResourceDef, obj: &Value) {
    let name = meta_str(obj, "name").to_string();
    if def.group.is_empty() && def.plural == "namespaces" {
        ctx.store.remove_namespace(&name);
    }
    if def.group == "apiextensions.k8s.io" && def.plural == "customresourcedefinitions" {
        ctx.registry.remove_crd(obj);
        let group = obj
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = obj
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        ctx.store.remove_table(&format!("{group}/{plural}"));
    }
}

/// Admission of a Binding (CREATE pods/binding, kind v1 Binding).
async fn admit_binding(
    ctx: &Ctx,
    target: &Target,
    req: &Req,
    name: &str,
    body: &Value,
) -> ApiResult<()> {
    let options = json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"});
    let attrs = Attributes {
        kind: Some((String::new(), "v1".into(), "Binding".into())),
        ..admission_attrs(
            target,
            req,
            Operation::Create,
            name,
            Some(body.clone()),
            None,
            options,
        )
    };
    admission::admit(ctx, attrs).await.map(|_| ())
}

/// POST pods/{name}/binding: assigns the pod to a node once.
pub(crate) async fn bind(
    ctx: &Arc<Ctx>,
    target: &Target,
    req: &Req,
) -> ApiResult<(StatusCode, Value)> {
    let def = &target.def;
    let name = target.name.clone().unwrap_or_default();
    let body = req.required_json()?;
    let node = body
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid("", "Binding", &name, "target.name: Required value"))?
        .to_string();
    admit_binding(ctx, target, req, &name, &body).await?;
    for _ in 0..MAX_RACE_RETRIES {
        let old = get(ctx, target)?;
        let current = old
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !current.is_empty() {
            return Err(ApiError::conflict(
                &def.group,
                &def.plural,
                &name,
                &format!("pod {name} is already assigned to node \"{current}\""),
            ));
        }
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(ApiError::conflict(
                &def.group,
                &def.plural,
                &name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!(node);
        if req.dry_run() {
            return Ok((StatusCode::CREATED, success_status()));
        }
        let key = def.key(&target.namespace, &name);
        match ctx.store.update(&def.table(), &key, rv_of(&old), new) {
            Ok(_) => return Ok((StatusCode::CREATED, success_status())),
            Err(StoreError::Conflict) => continue,
            Err(_) => return Err(ApiError::not_found(&def.group, &def.plural, &name)),
        }
    }
    Err(ApiError::stale(&def.group, &def.plural, &name))
}

pub(crate) fn success_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// The user a request came from (for admission of internal writes).
#[allow(dead_code)]
pub(crate) fn internal_user(name: &str) -> UserInfo {
    UserInfo::from_token(Some(name))
}
