//! Dynamic admission: every write matching a registered Mutating/Validating
//! WebhookConfiguration is sent to its webhook over HTTPS as an AdmissionReview v1.
//!
//! Flow per write: collect matching webhooks (rules, scope, namespaceSelector,
//! objectSelector) → call mutating webhooks one by one, applying their JSONPatch
//! responses → call validating webhooks concurrently → first denial wins. Responses are
//! checked like the real API server checks them (apiVersion/kind, uid, patchType); a
//! failed call obeys the webhook's failurePolicy. Configuration objects themselves are
//! never subject to admission.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tracing::Instrument;

use super::matchcond::{self, Match};
use super::request::{Target, UserInfo};
use super::selector::selector_object_matches;
use super::status::{ApiError, ApiResult, Cause};
use super::{ClientCert, Ctx, routing};

/// Webhook timeout when a configuration sets none (admissionregistration/v1 default).
const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// The admission operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
        }
    }
}

/// What a write looks like to admission.
pub(crate) struct Attributes<'a> {
    pub target: &'a Target,
    pub user: &'a UserInfo,
    pub operation: Operation,
    pub name: String,
    pub object: Option<Value>,
    pub old_object: Option<Value>,
    pub options: Value,
    pub dry_run: bool,
    /// (group, version, kind) of the request body when it differs from the resource's
    /// (`policy/v1 Eviction` for `pods/eviction`).
    pub kind: Option<(String, String, String)>,
}

/// The outcome of admission.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    /// The object after mutation, when a webhook changed it.
    pub object: Option<Value>,
}

/// One webhook of a configuration, with what is needed to match and call it.
#[derive(Clone, Debug)]
struct Hook {
    name: String,
    mutating: bool,
    spec: Value,
}

impl Hook {
    fn timeout(&self) -> Duration {
        let secs = self
            .spec
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        Duration::from_secs(secs)
    }

    fn fails_closed(&self) -> bool {
        self.spec.get("failurePolicy").and_then(Value::as_str) != Some("Ignore")
    }

    fn supports_dry_run(&self) -> bool {
        matches!(
            self.spec.get("sideEffects").and_then(Value::as_str),
            Some("None" | "NoneOnDryRun")
        )
    }
}

fn is_webhook_config(target: &Target) -> bool {
    target.def.group == "admissionregistration.k8s.io"
}

/// Webhooks of every configuration of one flavour, configurations in name order.
fn hooks(ctx: &Ctx, plural: &str, mutating: bool) -> Vec<Hook> {
    let (configs, _) = ctx
        .store
        .list(&format!("admissionregistration.k8s.io/{plural}"), "");
    configs
        .into_iter()
        .flat_map(|(_, config)| {
            config
                .get("webhooks")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .map(|spec| Hook {
            name: spec
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            mutating,
            spec,
        })
        .collect()
}

fn list_contains(list: Option<&Value>, want: &str) -> bool {
    list.and_then(Value::as_array).is_some_and(|items| {
        items
            .iter()
            .filter_map(Value::as_str)
            .any(|i| i == "*" || i == want)
    })
}

fn resource_matches(rule_resource: &str, resource: &str, sub: Option<&str>) -> bool {
    let (r_res, r_sub) = match rule_resource.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (rule_resource, None),
    };
    let res_ok = r_res == "*" || r_res == resource;
    let sub_ok = match (r_sub, sub) {
        (None, None) => true,
        (Some("*"), _) => true,
        (Some(rs), Some(s)) => rs == s,
        _ => false,
    };
    res_ok && sub_ok
}

fn rule_matches(rule: &Value, attrs: &Attributes<'_>) -> bool {
    let def = &attrs.target.def;
    let scope_ok = match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Cluster" => !def.namespaced,
        "Namespaced" => def.namespaced,
        _ => true,
    };
    let resources_ok = rule
        .get("resources")
        .and_then(Value::as_array)
        .is_some_and(|rs| {
            rs.iter()
                .filter_map(Value::as_str)
                .any(|r| resource_matches(r, &def.plural, attrs.target.sub.as_deref()))
        });
    scope_ok
        && resources_ok
        && list_contains(rule.get("operations"), attrs.operation.as_str())
        && list_contains(rule.get("apiGroups"), &def.group)
        && list_contains(rule.get("apiVersions"), &def.version)
}

fn labels_of(obj: Option<&Value>) -> Option<&Value> {
    obj.and_then(|o| o.pointer("/metadata/labels"))
}

fn hook_matches(ctx: &Ctx, hook: &Hook, attrs: &Attributes<'_>) -> bool {
    let rules_ok = hook
        .spec
        .get("rules")
        .and_then(Value::as_array)
        .is_some_and(|rules| rules.iter().any(|r| rule_matches(r, attrs)));
    if !rules_ok {
        return false;
    }
    let def = &attrs.target.def;
    let ns_selector = hook.spec.get("namespaceSelector");
    let ns_ok = if def.namespaced {
        let ns = ctx.store.get("/namespaces", &attrs.target.namespace);
        selector_object_matches(ns_selector, labels_of(ns.as_ref()))
    } else if def.group.is_empty() && def.plural == "namespaces" {
        let obj = attrs.object.as_ref().or(attrs.old_object.as_ref());
        selector_object_matches(ns_selector, labels_of(obj))
    } else {
        true
    };
    let obj_selector = hook.spec.get("objectSelector");
    let obj_ok = selector_object_matches(obj_selector, labels_of(attrs.object.as_ref()))
        || selector_object_matches(obj_selector, labels_of(attrs.old_object.as_ref()));
    ns_ok && obj_ok
}

/// Runs mutating then validating webhooks for a write.
pub(crate) async fn admit(ctx: &Ctx, attrs: Attributes<'_>) -> ApiResult<Admitted> {
    let mut attrs = attrs;
    let admitted = mutate(ctx, &mut attrs).await?;
    validate(ctx, &attrs).await?;
    Ok(admitted)
}

/// Runs the mutating webhooks of a write, leaving the mutated object in `attrs`.
pub(crate) async fn mutate(ctx: &Ctx, attrs: &mut Attributes<'_>) -> ApiResult<Admitted> {
    if is_webhook_config(attrs.target) {
        return Ok(Admitted::default());
    }
    let mut mutated = false;
    for hook in hooks(ctx, "mutatingwebhookconfigurations", true) {
        if !hook_matches(ctx, &hook, attrs) || !conditions_match(&hook, attrs)? {
            continue;
        }
        if let Some(object) = call_checked(ctx, &hook, attrs).await? {
            attrs.object = Some(object);
            mutated = true;
        }
    }
    Ok(Admitted {
        object: if mutated { attrs.object.clone() } else { None },
    })
}

/// Runs the validating webhooks of a write (concurrently; the first denial wins).
pub(crate) async fn validate(ctx: &Ctx, attrs: &Attributes<'_>) -> ApiResult<()> {
    if is_webhook_config(attrs.target) {
        return Ok(());
    }
    let mut validating = Vec::new();
    for hook in hooks(ctx, "validatingwebhookconfigurations", false) {
        if hook_matches(ctx, &hook, attrs) && conditions_match(&hook, attrs)? {
            validating.push(hook);
        }
    }
    let calls = validating.iter().map(|h| call_checked(ctx, h, attrs));
    for result in futures::future::join_all(calls).await {
        result?;
    }
    Ok(())
}

/// Evaluates the hook's `matchConditions` after its rules and selectors matched, like
/// upstream's `ShouldCallHook` (`admission/plugin/webhook/generic/webhook.go`): an
/// evaluation error under failurePolicy Fail is a 403 Forbidden for the request.
fn conditions_match(hook: &Hook, attrs: &Attributes<'_>) -> ApiResult<bool> {
    let conditions = hook.spec.get("matchConditions");
    if conditions.is_none() {
        return Ok(true);
    }
    let request = review(attrs, "")["request"].take();
    match matchcond::evaluate(conditions, &request, hook.fails_closed()) {
        Match::Call => Ok(true),
        Match::Skip => Ok(false),
        Match::Error(e) => {
            let def = &attrs.target.def;
            let resource = if def.group.is_empty() {
                def.plural.clone()
            } else {
                format!("{}.{}", def.plural, def.group)
            };
            Err(ApiError::new(
                403,
                "Forbidden",
                format!("{resource} \"{}\" is forbidden: {e}", attrs.name),
            )
            .with_details(&def.group, &def.plural, &attrs.name))
        }
    }
}

/// Calls one webhook and turns its answer into the patched object (mutating), a
/// denial, or — for failed calls — an error or a pass, per failurePolicy.
async fn call_checked(ctx: &Ctx, hook: &Hook, attrs: &Attributes<'_>) -> ApiResult<Option<Value>> {
    if attrs.dry_run && !hook.supports_dry_run() {
        return Err(ApiError::bad_request(format!(
            "admission webhook \"{}\" does not support dry run",
            hook.name
        )));
    }
    let span = tracing::info_span!(
        "admission",
        webhook = %hook.name,
        operation = attrs.operation.as_str(),
        resource = %attrs.target.resource_label(),
        namespace = %attrs.target.namespace,
        name = %attrs.name,
    );
    let started = Instant::now();
    let outcome = call(ctx, hook, attrs).instrument(span.clone()).await;
    let _enter = span.enter();
    *ctx.stats()
        .admission_calls
        .entry(hook.name.clone())
        .or_default() += 1;
    match outcome {
        Ok(Outcome::Allowed(patched)) => {
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                mutated = patched.is_some(),
                "webhook allowed"
            );
            Ok(patched)
        }
        Ok(Outcome::PatchFailed(message)) => {
            tracing::warn!(elapsed_ms = started.elapsed().as_millis() as u64, error = %message, "webhook patch failed to apply");
            Err(ApiError::internal(format!(
                "Internal error occurred: {message}"
            )))
        }
        Ok(Outcome::Denied(error)) => {
            tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, message = %error.message, "webhook denied");
            Err(error)
        }
        Err(failure) => {
            *ctx.stats()
                .admission_failures
                .entry(hook.name.clone())
                .or_default() += 1;
            let closed = hook.fails_closed();
            tracing::warn!(elapsed_ms = started.elapsed().as_millis() as u64, error = %failure, fail_closed = closed, "webhook call failed");
            if closed {
                Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook \"{}\": {failure}",
                    hook.name
                )))
            } else {
                Ok(None)
            }
        }
    }
}

enum Outcome {
    Allowed(Option<Value>),
    Denied(ApiError),
    /// The patch could not be decoded or applied: upstream's mutating dispatcher returns
    /// `apierrors.NewInternalError` for it, which failurePolicy does not cover
    /// (`admission/plugin/webhook/mutating/dispatcher.go`, callAttrMutatingHook).
    PatchFailed(String),
}

fn review(attrs: &Attributes<'_>, uid: &str) -> Value {
    let def = &attrs.target.def;
    let (group, version, kind) = attrs
        .kind
        .clone()
        .unwrap_or_else(|| (def.group.clone(), def.version.clone(), def.kind.clone()));
    let gvk = json!({"group": group, "version": version, "kind": kind});
    let gvr = json!({"group": def.group, "version": def.version, "resource": def.plural});
    let mut request = json!({
        "uid": uid,
        "kind": gvk, "resource": gvr,
        "requestKind": gvk, "requestResource": gvr,
        "name": attrs.name,
        "operation": attrs.operation.as_str(),
        "userInfo": {"username": attrs.user.username, "groups": attrs.user.groups},
        "object": attrs.object,
        "oldObject": attrs.old_object,
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    });
    if def.namespaced {
        request["namespace"] = json!(attrs.target.namespace);
    }
    if let Some(sub) = &attrs.target.sub {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// How long a webhook call may take: the webhook's timeoutSeconds, cut to what remains
/// of the request's deadline (the dispatchers of
/// staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/{mutating,validating}
/// derive the call's context from the request's).
fn call_timeout(hook: Duration, deadline: Option<tokio::time::Instant>) -> Duration {
    let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
    left.map_or(hook, |left| left.min(hook))
}

/// The `timeout` query parameter of a webhook call: the time left rounded up to whole
/// seconds, written as Go prints a duration (`10s`, `1m0s`), like the dispatchers'
/// `r.Timeout(...)`.
fn go_duration(timeout: Duration) -> String {
    let whole = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
    match (whole / 3600, whole / 60 % 60, whole % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

/// `group/version, Kind=kind` the way the API server prints a GroupVersionKind.
fn gvk_string(api_version: &str, kind: &str) -> String {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    format!("{group}/{version}, Kind={kind}")
}

async fn call(ctx: &Ctx, hook: &Hook, attrs: &Attributes<'_>) -> Result<Outcome, String> {
    let uid = uuid::Uuid::new_v4().to_string();
    let body = review(attrs, &uid).to_string();
    let timeout = call_timeout(hook.timeout(), super::request::request_deadline());
    let endpoint = Endpoint::from_client_config(ctx, hook, timeout)?;
    let (status, bytes) = tokio::time::timeout(timeout, endpoint.post(body.into_bytes(), timeout))
        .await
        .map_err(|_| {
            format!(
                "failed to call webhook: Post \"{}\": context deadline exceeded",
                endpoint.url
            )
        })??;
    if status != 200 {
        return Err(format!(
            "received invalid webhook response: HTTP status code {status}"
        ));
    }
    let answer: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("received invalid webhook response: {e}"))?;
    let api_version = answer
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = answer.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}",
            gvk_string(api_version, kind)
        ));
    }
    let response = answer
        .get("response")
        .ok_or("webhook response was absent")?;
    let got_uid = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if got_uid != uid {
        return Err(format!(
            "expected response.uid=\"{uid}\", got \"{got_uid}\""
        ));
    }
    for warning in response
        .get("warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        super::request::add_warning(warning);
    }
    interpret(hook, attrs, response)
}

/// `response.patch` as bytes. The API server decodes it into a Go `[]byte`, which takes
/// the canonical base64 string and also a JSON array of byte values; anything else fails
/// the call instead of being ignored.
fn patch_bytes(response: &Value) -> Result<Vec<u8>, String> {
    match response.get("patch") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| format!("decode response.patch: {e}")),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_u64()
                    .and_then(|n| u8::try_from(n).ok())
                    .ok_or_else(|| format!("decode response.patch: {item} is not a byte"))
            })
            .collect(),
        Some(other) => Err(format!(
            "decode response.patch: expected base64 bytes, got {other}"
        )),
    }
}

fn interpret(hook: &Hook, attrs: &Attributes<'_>, response: &Value) -> Result<Outcome, String> {
    let raw = patch_bytes(response)?;
    let patch = raw.as_slice();
    let patch_type = response.get("patchType").and_then(Value::as_str);
    if !hook.mutating && (!patch.is_empty() || patch_type.is_some()) {
        return Err(
            "validating webhook may not return response.patch or response.patchType".into(),
        );
    }
    if let Some(pt) = patch_type
        && pt != "JSONPatch"
    {
        return Err(format!(
            "webhook returned invalid response.patchType of {pt:?}"
        ));
    }
    if !patch.is_empty() && patch_type.is_none() {
        return Err("webhook returned response.patch but not response.patchType".into());
    }
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        // The AdmissionResponse carries its metav1.Status under `status`.
        return Ok(Outcome::Denied(denial(&hook.name, response.get("status"))));
    }
    if patch.is_empty() {
        return Ok(Outcome::Allowed(None));
    }
    let Some(object) = attrs.object.clone() else {
        return Ok(Outcome::Allowed(None));
    };
    let ops: json_patch::Patch = match serde_json::from_slice(patch) {
        Ok(ops) => ops,
        Err(e) => return Ok(Outcome::PatchFailed(format!("decode response.patch: {e}"))),
    };
    let mut patched = object;
    if let Err(e) = json_patch::patch(&mut patched, &ops.0) {
        return Ok(Outcome::PatchFailed(e.to_string()));
    }
    Ok(Outcome::Allowed(Some(patched)))
}

/// A denial as the API server surfaces it: upstream's `ToStatusErr`
/// (`admission/plugin/webhook/errors/statuserror.go`, Kubernetes 1.33) raises a code
/// below 400 — a missing one included — to 400 Bad Request and keeps the rest of the
/// webhook's Status, `details` included, so `details.retryAfterSeconds` becomes the
/// answer's `Retry-After` header (`responsewriters.ErrorNegotiated`).
fn denial(name: &str, result: Option<&Value>) -> ApiError {
    let field = |k: &str| {
        result
            .and_then(|r| r.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let code = result
        .and_then(|r| r.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let denied_by = format!("admission webhook \"{name}\" denied the request");
    let (message, reason) = (field("message"), field("reason"));
    let text = match (message.is_empty(), reason.is_empty()) {
        (false, _) => format!("{denied_by}: {message}"),
        (true, false) => format!("{denied_by}: {reason}"),
        (true, true) => format!("{denied_by} without explanation"),
    };
    let mut error = ApiError::new(code, &reason, text);
    let Some(details) = result.and_then(|r| r.get("details")) else {
        return error;
    };
    let text = |k: &str| details.get(k).and_then(Value::as_str).unwrap_or("");
    if !(text("group").is_empty() && text("kind").is_empty() && text("name").is_empty()) {
        error = error.with_details(text("group"), text("kind"), text("name"));
    }
    if let Some(seconds) = details.get("retryAfterSeconds").and_then(Value::as_u64) {
        error = error.with_retry(seconds);
    }
    for cause in details
        .get("causes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let field = |k: &str| {
            cause
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        error.causes.push(Cause {
            reason: field("reason"),
            message: field("message"),
            field: field("field"),
        });
    }
    error
}

/// Where and how to reach a webhook.
struct Endpoint {
    url: String,
    connect: String,
    server_name: String,
    host_header: String,
    path: String,
    roots: Vec<CertificateDer<'static>>,
    client_cert: Option<ClientCert>,
}

impl Endpoint {
    fn from_client_config(ctx: &Ctx, hook: &Hook, timeout: Duration) -> Result<Self, String> {
        let cc = hook
            .spec
            .get("clientConfig")
            .ok_or("webhook has no clientConfig")?;
        let roots = ca_bundle(cc)?;
        let timeout = format!("timeout={}", go_duration(timeout));
        if let Some(url) = cc.get("url").and_then(Value::as_str) {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| format!("invalid webhook url {url:?}: {e}"))?;
            let host = uri.host().ok_or("webhook url has no host")?.to_string();
            let port = uri.port_u16().unwrap_or(443);
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let sep = if path.contains('?') { '&' } else { '?' };
            return Ok(Self {
                url: format!("{url}{sep}{timeout}"),
                connect: format!("{}:{port}", host.trim_matches(['[', ']'])),
                server_name: host.trim_matches(['[', ']']).to_string(),
                host_header: uri.authority().map_or(host.clone(), |a| a.to_string()),
                path: format!("{path}{sep}{timeout}"),
                roots,
                client_cert: ctx.config.webhook_client_cert.clone(),
            });
        }
        let svc = cc
            .get("service")
            .ok_or("webhook clientConfig has neither url nor service")?;
        let s = |k: &str| svc.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let (namespace, name) = (s("namespace"), s("name"));
        let path = match s("path") {
            p if p.is_empty() => "/".to_string(),
            p => p,
        };
        let port = svc
            .get("port")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(443);
        let host = format!("{name}.{namespace}.svc");
        let fail = |e: String| {
            format!("failed to call webhook: Post \"https://{host}:{port}{path}?{timeout}\": {e}")
        };
        let addr = routing::resolve(ctx, &namespace, &name, port).map_err(fail)?;
        Ok(Self {
            url: format!("https://{host}:{port}{path}?{timeout}"),
            connect: addr.to_string(),
            server_name: host.clone(),
            host_header: format!("{host}:{port}"),
            path: format!("{path}?{timeout}"),
            roots,
            client_cert: ctx.config.webhook_client_cert.clone(),
        })
    }

    async fn post(&self, body: Vec<u8>, timeout: Duration) -> Result<(u16, Bytes), String> {
        let fail = |e: &dyn std::fmt::Display| {
            format!("failed to call webhook: Post \"{}\": {e}", self.url)
        };
        let mut store = rustls::RootCertStore::empty();
        for cert in &self.roots {
            store.add(cert.clone()).map_err(|e| fail(&e))?;
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(store);
        let config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some(pair) => {
                let (chain, key) = read_client_cert(pair).map_err(|e| fail(&e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| fail(&e))?
            }
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let server_name = ServerName::try_from(self.server_name.clone()).map_err(|e| fail(&e))?;
        let tcp = tokio::net::TcpStream::connect(&self.connect)
            .await
            .map_err(|e| fail(&e))?;
        let tls = connector
            .connect(server_name, tcp)
            .await
            .map_err(|e| fail(&e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| fail(&e))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = http::Request::post(&self.path)
            .header(http::header::HOST, &self.host_header)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| fail(&e))?;
        let result = async {
            let response = sender.send_request(request).await.map_err(|e| fail(&e))?;
            let status = response.status().as_u16();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| fail(&e))?
                .to_bytes();
            Ok::<_, String>((status, bytes))
        };
        let out = tokio::time::timeout(timeout, result)
            .await
            .unwrap_or_else(|_| Err(fail(&"context deadline exceeded")));
        driver.abort();
        out
    }
}

/// The client certificate chain and key webhooks are called with.
fn read_client_cert(
    pair: &ClientCert,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = CertificateDer::pem_file_iter(&pair.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("read client certificate {}: {e}", pair.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&pair.key)
        .map_err(|e| format!("read client key {}: {e}", pair.key.display()))?;
    Ok((chain, key))
}

fn ca_bundle(cc: &Value) -> Result<Vec<CertificateDer<'static>>, String> {
    let Some(encoded) = cc.get("caBundle").and_then(Value::as_str) else {
        return Ok(Vec::new());
    };
    let pem = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| format!("invalid caBundle: {e}"))?;
    CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("invalid caBundle: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_resources_match_subresources_like_upstream() {
        assert!(resource_matches("pods/eviction", "pods", Some("eviction")));
        assert!(!resource_matches("pods", "pods", Some("eviction")));
        assert!(resource_matches("pods/*", "pods", Some("status")));
        assert!(resource_matches("*/*", "nodes", Some("status")));
        assert!(resource_matches("*", "pods", None));
        assert!(!resource_matches("*", "pods", Some("eviction")));
        assert!(!resource_matches("pods/eviction", "pods", None));
    }

    #[test]
    fn webhook_timeouts_are_what_remains_of_the_request_deadline_in_go_notation() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_millis(2100)), "3s");
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(3661)), "1h1m1s");
        let hook = Duration::from_secs(10);
        assert_eq!(call_timeout(hook, None), hook);
        let soon = tokio::time::Instant::now() + Duration::from_secs(3);
        assert!(call_timeout(hook, Some(soon)) <= Duration::from_secs(3));
        let later = tokio::time::Instant::now() + Duration::from_secs(60);
        assert_eq!(call_timeout(hook, Some(later)), hook);
    }

    #[test]
    fn gvk_strings_match_the_api_server_wording() {
        assert_eq!(gvk_string("", ""), "/, Kind=");
        assert_eq!(
            gvk_string("admission.k8s.io/v1", "AdmissionReview"),
            "admission.k8s.io/v1, Kind=AdmissionReview"
        );
    }

    #[test]
    fn patches_decode_like_a_go_byte_slice() {
        let ops = r#"[{"op":"add","path":"/a","value":1}]"#;
        let b64 = base64::engine::general_purpose::STANDARD.encode(ops);
        assert_eq!(patch_bytes(&json!({"patch": b64})).unwrap(), ops.as_bytes());
        let array: Vec<u8> = ops.bytes().collect();
        assert_eq!(
            patch_bytes(&json!({"patch": array})).unwrap(),
            ops.as_bytes()
        );
        assert!(patch_bytes(&json!({})).unwrap().is_empty());
        assert!(patch_bytes(&json!({"patch": [1, 300]})).is_err());
        assert!(patch_bytes(&json!({"patch": {"op": "add"}})).is_err());
        assert!(patch_bytes(&json!({"patch": "not base64!"})).is_err());
    }

    #[test]
    fn denials_keep_the_webhooks_details_and_retry_after_like_to_status_err() {
        let e = denial(
            "eviction.graceful-drain.io",
            Some(
                &json!({"code": 429, "reason": "TooManyRequests", "message": "budget",
                "details": {"retryAfterSeconds": 5,
                    "causes": [{"reason": "DisruptionBudget", "message": "pdb web"}]}}),
            ),
        );
        assert_eq!((e.code, e.retry_after), (429, Some(5)));
        assert_eq!(e.causes, [Cause::new("DisruptionBudget", "pdb web")]);
        let plain = denial("x", Some(&json!({"code": 403, "message": "no"})));
        assert_eq!((plain.retry_after, plain.causes.len()), (None, 0));
    }

    #[test]
    fn denials_carry_the_webhook_name_and_code() {
        let e = denial(
            "hook.example",
            Some(&json!({"code": 429, "message": "slow down"})),
        );
        assert_eq!(e.code, 429);
        assert_eq!(
            e.message,
            "admission webhook \"hook.example\" denied the request: slow down"
        );
        let e = denial("hook.example", None);
        assert_eq!(e.code, 400);
        assert!(e.message.ends_with("without explanation"));
        let e = denial("hook.example", Some(&json!({"code": 200, "message": "no"})));
        assert_eq!(e.code, 400);
    }
}
