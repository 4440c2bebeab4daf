//! Request routing: discovery documents, URL → (resource, namespace, name,
//! subresource), authentication by bearer token, request counting, and list (the request
//! model and `get`, which every verb shares, live in [`super::request`]; watch in
//! [`super::watch`], writes in [`super::write`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};

use super::Ctx;
use super::request::{
    DEADLINE, Req, Target, UserInfo, deadline_exceeded, deadline_of, filter_of, get, prefix_of,
    with_warnings,
};
use super::status::{ApiError, ApiResult};
use super::store::Scope;
use super::{delete, eviction, table, watch, write};

/// Largest request body accepted (objects are small; a generous bound against runaways).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// The axum router: everything goes through one fallback dispatcher.
pub(crate) fn router(ctx: Arc<Ctx>) -> Router {
    Router::new().fallback(handle).with_state(ctx)
}

async fn handle(State(ctx): State<Arc<Ctx>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return ApiError::bad_request(format!("read body: {e}")).into_response(),
    };
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let query: HashMap<String, String> = parts
        .uri
        .query()
        .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let req = Req {
        user: UserInfo::from_token(token),
        query,
        content_type: parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        accept: parts
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        user_agent: parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        body,
    };
    let path = parts.uri.path().trim_end_matches('/').to_string();
    let span = tracing::debug_span!("api", method = %parts.method, path = %path, user = %req.user.username);
    let _enter = span.enter();
    tracing::debug!(query = ?parts.uri.query(), "request");
    if parts.method == Method::POST && path == super::selfsubject::PATH {
        let (code, review) = super::selfsubject::review(&req.user);
        return json_response(code, &review);
    }
    if let Some(doc) = discovery(&ctx, &parts.method, &path) {
        return doc;
    }
    let target = match parse_target(&ctx, &path) {
        Ok(target) => target,
        Err(e) => return e.into_response(),
    };
    let verb = verb_of(&parts.method, &target, &req);
    if let Some(refused) = ctx.faults.before_request(&req.user, verb, &target).await {
        if refused.code == 429 {
            ctx.stats().throttled += 1;
        }
        return refused.into_response();
    }
    let deadline = deadline_of(&req.query);
    let watch = parts.method == Method::GET && target.name.is_none() && req.flag("watch");
    if watch {
        // Watches are long-running requests: no deadline (their own timeoutSeconds ends them).
        return dispatch(&ctx, parts.method, target, req).await;
    }
    // Store writes follow `check_deadline()` with no await in between, so a request
    // answered 504 here writes nothing after its deadline.
    let run = DEADLINE.scope(
        deadline,
        with_warnings(dispatch(&ctx, parts.method, target, req)),
    );
    match tokio::time::timeout_at(deadline, run).await {
        Ok(response) => response,
        Err(_) => deadline_exceeded().into_response(),
    }
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (code, axum::Json(value)).into_response()
}

fn discovery(ctx: &Ctx, method: &Method, path: &str) -> Option<Response> {
    if method != Method::GET {
        return None;
    }
    let reg = &ctx.registry;
    let doc = match path {
        "/version" => Some(json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0-graceful-drain-sim",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
            "platform": "linux/amd64",
        })),
        "/healthz" | "/livez" | "/readyz" => {
            return Some((StatusCode::OK, "ok").into_response());
        }
        // kubectl fetches the OpenAPI v2 document (protobuf only) to validate kinds the
        // v3 documents do not cover; an empty protobuf message is an empty document,
        // under which it skips client-side validation and reports unknown kinds itself.
        "/openapi/v2" => {
            let content_type = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
            return Some(
                (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], "").into_response(),
            );
        }
        "/api" => Some(reg.api_versions(ctx.url.trim_start_matches("http://"))),
        "/apis" => Some(reg.api_group_list()),
        "/api/v1" => reg.api_resource_list("", "v1"),
        "/openapi/v3" => Some(reg.openapi_root()),
        "/openapi/v3/api/v1" => reg.openapi_group_version("", "v1"),
        _ if path.starts_with("/openapi/v3/apis/") => {
            let rest = path.trim_start_matches("/openapi/v3/apis/");
            match rest.split_once('/') {
                Some((group, version)) => reg.openapi_group_version(group, version),
                None => None,
            }
        }
        _ => {
            let rest = path.strip_prefix("/apis/")?;
            let segs: Vec<&str> = rest.split('/').collect();
            match segs.as_slice() {
                [group] => reg.api_group(group),
                [group, version] => reg.api_resource_list(group, version),
                _ => return None,
            }
        }
    };
    Some(match doc {
        Some(doc) => json_response(StatusCode::OK, &doc),
        None => not_found_path(path).into_response(),
    })
}

fn not_found_path(path: &str) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    .with_details("", "", path)
}

/// Splits `/api/v1/...` or `/apis/g/v/...` into a [`Target`].
fn parse_target(ctx: &Ctx, path: &str) -> ApiResult<Target> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_found_path(path)),
    };
    let namespaced_form = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(group.is_empty() && rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (namespace, plural, name, sub) = if namespaced_form {
        (rest[1], rest[2], rest.get(3), rest.get(4))
    } else {
        let Some(plural) = rest.first() else {
            return Err(not_found_path(path));
        };
        ("", *plural, rest.get(1), rest.get(2))
    };
    let def = ctx
        .registry
        .find(group, version, plural)
        .ok_or_else(|| not_found_path(path))?;
    if let Some(sub) = sub
        && !def.subresources.iter().any(|s| s == sub)
    {
        return Err(not_found_path(path));
    }
    Ok(Target {
        def,
        namespace: namespace.to_string(),
        name: name.map(|s| s.to_string()),
        sub: sub.map(|s| s.to_string()),
    })
}

fn verb_of(method: &Method, target: &Target, req: &Req) -> &'static str {
    match (method.as_str(), target.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if req.flag("watch") => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

async fn dispatch(ctx: &Arc<Ctx>, method: Method, target: Target, req: Req) -> Response {
    let verb = verb_of(&method, &target, &req);
    {
        let mut stats = ctx.stats();
        *stats
            .requests
            .entry((verb.to_string(), target.resource_label()))
            .or_default() += 1;
        *stats
            .by_user_request
            .entry((
                req.user.username.clone(),
                verb.to_string(),
                target.resource_label(),
            ))
            .or_default() += 1;
    }
    let result = match (verb, target.sub.as_deref()) {
        ("watch", _) => return watch::watch(ctx.clone(), &target, &req),
        ("list", _) => list(ctx, &target, &req).map(|v| (StatusCode::OK, v)),
        ("get", None | Some("status")) => get(ctx, &target).map(|v| match req.table() {
            Some(full) if target.sub.is_none() => {
                let metadata =
                    json!({"resourceVersion": super::meta::meta_str(&v, "resourceVersion")});
                (
                    StatusCode::OK,
                    table::table(&target.def, &[v], metadata, full),
                )
            }
            _ => (StatusCode::OK, v),
        }),
        ("get", Some("scale")) => {
            get(ctx, &target).map(|v| (StatusCode::OK, super::scale::scale_of(&v)))
        }
        ("update", Some("scale")) => super::scale::write(ctx, &target, &req, false).await,
        ("patch", Some("scale")) => super::scale::write(ctx, &target, &req, true).await,
        ("create", Some("eviction")) => eviction::evict(ctx, &target, &req).await,
        ("create", Some("binding")) => write::bind(ctx, &target, &req).await,
        ("create", None) => write::create(ctx, &target, &req).await,
        ("update", None | Some("status")) => write::update(ctx, &target, &req).await,
        ("patch", None | Some("status"))
            if req.content_type.starts_with(super::managed::APPLY_YAML) =>
        {
            super::apply::apply(ctx, &target, &req).await
        }
        ("patch", None | Some("status")) => write::patch(ctx, &target, &req).await,
        ("delete", None) => delete::delete(ctx, &target, &req).await,
        ("deletecollection", None) => delete::delete_collection(ctx, &target, &req).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            target.resource_label()
        ))),
    };
    match result {
        Ok((code, value)) => json_response(code, &value),
        Err(e) => {
            tracing::debug!(error = %e, "request failed");
            e.into_response()
        }
    }
}

fn list(ctx: &Ctx, target: &Target, req: &Req) -> ApiResult<Value> {
    let filter = filter_of(target, req)?;
    let def = &target.def;
    let after = match req.param("continue") {
        Some(token) => Some(decode_continue(token)?),
        None => None,
    };
    // A list at resourceVersion "0" is served whole from the watch cache: the cacher
    // only delegates a list with a limit to etcd when resourceVersion is unset or the
    // match is Exact, and the cache itself ignores the limit (staging/src/k8s.io/apiserver/
    // pkg/storage/cacher/delegator.go, shouldDelegateList; ListOptions.ResourceVersion in
    // apimachinery/pkg/apis/meta/internalversion/types.go: "if it's 0, then we simply
    // return what we currently have in cache"). A client asking for pages this way gets
    // everything in one response, as it would from kube-apiserver.
    let from_cache = req.param("resourceVersion") == Some("0") && after.is_none();
    let limit: usize = req
        .param("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0 && !from_cache)
        .unwrap_or(usize::MAX);
    // remainingItemCount is only given for a list without selectors (ListMeta in
    // apimachinery/pkg/apis/meta/v1/types.go); with selectors one more stored object is
    // enough to hand out a continue token.
    let selective = !filter.labels.0.selects_all() || !filter.fields.0.is_empty();
    let mut page: Vec<(String, Value)> = Vec::new();
    let mut remaining = 0usize;
    let prefix = prefix_of(target);
    let scope = Scope {
        prefix: &prefix,
        node: filter.node(),
    };
    let rv = ctx
        .store
        .scan(&def.table(), scope, after.as_deref(), |key, obj| {
            if page.len() < limit {
                // Selected on the served view before anything is copied: a list of one
                // node's pods among 150,000 copies only that node's.
                let served = def.view.served_ref(obj);
                if filter.matches(&served) {
                    page.push((key.to_string(), served.into_owned()));
                }
                return true;
            }
            remaining += 1;
            !selective
        });
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if remaining > 0
        && let Some((last, _)) = page.last()
    {
        metadata["continue"] = json!(encode_continue(last));
        if !selective {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    let items: Vec<Value> = page.into_iter().map(|(_, v)| v).collect();
    if let Some(full) = req.table() {
        return Ok(table::table(def, &items, metadata, full));
    }
    Ok(json!({
        "kind": format!("{}List", def.kind),
        "apiVersion": def.api_version(),
        "metadata": metadata,
        "items": items,
    }))
}

fn encode_continue(key: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(json!({"start": key}).to_string())
}

fn decode_continue(token: &str) -> ApiResult<String> {
    let bad = || ApiError::bad_request(format!("invalid continue token {token:?}"));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let value: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    value
        .get("start")
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(bad)
}
