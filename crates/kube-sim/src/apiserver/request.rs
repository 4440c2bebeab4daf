//! The request model every verb's handler shares: who asks ([`UserInfo`]), what the path
//! names ([`Target`]), the query and body ([`Req`]), the request's deadline, and the reads
//! and selectors the verbs have in common.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::header;
use serde_json::Value;

use super::Ctx;
use super::resources::ResourceDef;
use super::selector::{FieldSelector, LabelSelector};
use super::status::{ApiError, ApiResult};
use super::table;

/// Longest a request may run: kube-apiserver's `--request-timeout` default (1 minute);
/// a `?timeout=` parameter may only shorten it (`WithRequestDeadline` in
/// staging/src/k8s.io/apiserver/pkg/endpoints/filters/request_deadline.go).
pub(crate) const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

tokio::task_local! {
    /// The deadline of the request being served (read by admission to size webhook calls).
    pub(crate) static DEADLINE: tokio::time::Instant;
}

tokio::task_local! {
    /// The warnings admission webhooks returned for the request being served.
    pub(crate) static WARNINGS: std::cell::RefCell<Vec<String>>;
}

/// Records an admission webhook's warning for the request this task serves: upstream
/// adds each to the request's warning recorder (`warning.AddWarning` in
/// staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go and
/// validating/dispatcher.go), which writes it as a `Warning` header of the answer.
pub(crate) fn add_warning(text: &str) {
    let _ = WARNINGS.try_with(|w| w.borrow_mut().push(text.to_string()));
}

/// Runs `call`, then writes the warnings admission recorded meanwhile as `Warning: 299 -
/// "text"` headers of its answer (staging/src/k8s.io/apiserver/pkg/endpoints/filters/
/// warning.go, RFC 7234 §5.5), whatever its status.
pub(crate) async fn with_warnings(
    call: impl std::future::Future<Output = axum::response::Response>,
) -> axum::response::Response {
    WARNINGS
        .scope(std::cell::RefCell::new(Vec::new()), async move {
            let mut response = call.await;
            let warnings = WARNINGS.with(|w| w.take());
            for text in warnings {
                let quoted = text.replace('\\', "\\\\").replace('"', "\\\"");
                if let Ok(value) = http::HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
                    response.headers_mut().append(http::header::WARNING, value);
                }
            }
            response
        })
        .await
}

/// The deadline of the request this task serves, if any.
pub(crate) fn request_deadline() -> Option<tokio::time::Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// 504 once the request being served is past its deadline: checked right before a
/// write is stored, as upstream's storage calls fail on an expired context.
pub(crate) fn check_deadline() -> ApiResult<()> {
    match request_deadline() {
        Some(deadline) if tokio::time::Instant::now() >= deadline => Err(deadline_exceeded()),
        _ => Ok(()),
    }
}

/// The deadline a request gets: 60 s from now, or sooner when `?timeout=` (a Go
/// duration such as `30s` or `1m0s`) asks for less.
pub(crate) fn deadline_of(query: &HashMap<String, String>) -> tokio::time::Instant {
    let asked = query
        .get("timeout")
        .and_then(|t| humantime::parse_duration(t).ok())
        .filter(|t| !t.is_zero());
    let timeout = asked.map_or(REQUEST_TIMEOUT, |t| t.min(REQUEST_TIMEOUT));
    tokio::time::Instant::now() + timeout
}

/// The answer to a request that outlived its deadline: what the request finisher
/// (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/finisher/finisher.go) returns.
pub(crate) fn deadline_exceeded() -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
    )
}

/// Who sent a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// Groups per the simulated cluster's users (the `users` of `controllers`): admin is a cluster admin,
    /// service accounts get their namespace groups, nodes get `system:nodes`.
    pub(crate) fn from_token(token: Option<&str>) -> Self {
        let Some(user) = token.filter(|t| !t.is_empty()) else {
            return Self {
                username: "system:anonymous".into(),
                groups: vec!["system:unauthenticated".into()],
            };
        };
        let mut groups = Vec::new();
        if user == "admin" {
            groups.push("system:masters".to_string());
        } else if let Some(rest) = user.strip_prefix("system:serviceaccount:") {
            groups.push("system:serviceaccounts".to_string());
            if let Some((ns, _)) = rest.split_once(':') {
                groups.push(format!("system:serviceaccounts:{ns}"));
            }
        } else if user.starts_with("system:node:") {
            groups.push("system:nodes".to_string());
        }
        groups.push("system:authenticated".to_string());
        Self {
            username: user.to_string(),
            groups,
        }
    }
}

/// A parsed request to a resource.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub def: Arc<ResourceDef>,
    pub namespace: String,
    pub name: Option<String>,
    pub sub: Option<String>,
}

impl Target {
    /// `resource` or `resource/subresource`, for stats and admission.
    pub(crate) fn resource_label(&self) -> String {
        match &self.sub {
            Some(sub) => format!("{}/{sub}", self.def.plural),
            None => self.def.plural.clone(),
        }
    }
}

/// Everything a verb needs to know about the request besides the target.
#[derive(Clone, Debug)]
pub(crate) struct Req {
    pub user: UserInfo,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub accept: String,
    /// The User-Agent, whose program name is the default field manager.
    pub user_agent: String,
    pub body: bytes::Bytes,
}

impl Req {
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.query
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("true" | "1"))
    }

    /// Whether the client asked for a Table, and with full objects in its rows.
    pub(crate) fn table(&self) -> Option<bool> {
        table::wants_table(&self.accept).then(|| self.param("includeObject") == Some("Object"))
    }

    /// `dryRun=All` in the query.
    pub(crate) fn dry_run(&self) -> bool {
        self.param("dryRun") == Some("All")
    }

    /// The body as JSON (protobuf bodies decoded), or `None` when empty.
    pub(crate) fn json(&self) -> ApiResult<Option<Value>> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if super::protobuf::is_protobuf(&self.content_type) {
            return super::protobuf::decode(&self.body).map(Some);
        }
        serde_json::from_slice(&self.body)
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }

    /// The JSON body of a write that must carry one: 400 when it is empty or malformed.
    pub(crate) fn required_json(&self) -> ApiResult<Value> {
        self.json()?
            .ok_or_else(|| ApiError::bad_request("the request body is empty"))
    }
}

/// The object named by the target (404 Status when absent).
pub(crate) fn get(ctx: &Ctx, target: &Target) -> ApiResult<Value> {
    let name = target.name.as_deref().unwrap_or_default();
    let def = &target.def;
    ctx.store
        .get(&def.table(), &def.key(&target.namespace, name))
        .map(|v| def.view.served(v))
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
}

/// Parses the selectors of a list or watch.
pub(crate) fn filter_of(target: &Target, req: &Req) -> ApiResult<Filter> {
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
    let fields = FieldSelector::parse(
        req.param("fieldSelector").unwrap_or(""),
        &target.def.selectable_fields,
    )
    .map_err(ApiError::bad_request)?;
    Ok(Filter { labels, fields })
}

/// Label plus field selector.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The node an equality requirement on `spec.nodeName` pins the selection to.
    pub(crate) fn node(&self) -> Option<&str> {
        self.fields
            .0
            .iter()
            .find(|r| r.path == "spec.nodeName" && !r.negated)
            .map(|r| r.value.as_str())
    }
}

/// Storage key prefix of a list or watch.
pub(crate) fn prefix_of(target: &Target) -> String {
    if target.def.namespaced && !target.namespace.is_empty() {
        format!("{}/", target.namespace)
    } else {
        String::new()
    }
}

/// A response with a streaming body (watches).
pub(crate) fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
