//! RBAC audit for the install tests: a tracing layer records every request the simulated
//! API server handles (its `api` span: method, path, user; the `request` event: query),
//! and [`denied`] evaluates each request of a ServiceAccount against the Roles and
//! ClusterRoles the manifests bind to it, the way the RBAC authorizer would.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One request as the API server saw it.
#[derive(Clone, Debug)]
pub struct Request {
    pub user: String,
    pub method: String,
    pub path: String,
    pub query: String,
}

type Log = Arc<Mutex<Vec<Request>>>;

/// The requests recorded so far in this process (the layer is installed on first call).
pub fn recorded() -> Vec<Request> {
    log().lock().unwrap().clone()
}

/// Installs the recording layer as the process's subscriber, once.
pub fn install() {
    log();
}

fn log() -> &'static Log {
    static LOG: OnceLock<Log> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Log::default();
        let layer = Recorder(log.clone())
            .with_filter(Targets::new().with_target("kube_sim::apiserver::handler", Level::DEBUG));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("no other subscriber in the install tests");
        log
    })
}

struct Recorder(Log);

/// What the `api` span carries, kept in its extensions until the `request` event.
struct ApiSpan(BTreeMap<String, String>);

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "api" {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(ApiSpan(fields.0));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.0.get("message").map(String::as_str) != Some("request") {
            return;
        }
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let ext = span.extensions();
        let Some(ApiSpan(api)) = ext.get::<ApiSpan>() else {
            return;
        };
        let get = |k: &str| api.get(k).cloned().unwrap_or_default();
        self.0.lock().unwrap().push(Request {
            user: get("user"),
            method: get("method"),
            path: get("path"),
            query: fields.0.get("query").cloned().unwrap_or_default(),
        });
    }
}

/// A resource request in RBAC terms.
#[derive(Debug, PartialEq, Eq)]
pub struct Attrs {
    pub verb: String,
    pub group: String,
    /// `pods`, or `pods/eviction` for a subresource.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// Maps a request to RBAC attributes; `None` for non-resource URLs (discovery, version).
pub fn attributes(req: &Request) -> Option<Attrs> {
    let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => (String::new(), rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (group.to_string(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (resource, name) = match rest {
        [resource] => (resource.to_string(), None),
        [resource, name] => (resource.to_string(), Some(name.to_string())),
        [resource, name, sub] => (format!("{resource}/{sub}"), Some(name.to_string())),
        _ => return None,
    };
    let watch = req.query.contains("watch=true") || req.query.contains("watch=1");
    let verb = match (req.method.as_str(), name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(Attrs {
        verb: verb.into(),
        group,
        resource,
        namespace,
        name,
    })
}

/// Requests every authenticated user may make (the default `system:basic-user` role).
fn always_allowed(a: &Attrs) -> bool {
    a.verb == "create"
        && matches!(
            (a.group.as_str(), a.resource.as_str()),
            ("authentication.k8s.io", "selfsubjectreviews")
                | ("authorization.k8s.io", "selfsubjectaccessreviews")
                | ("authorization.k8s.io", "selfsubjectrulesreviews")
        )
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn rule_allows(rule: &Value, a: &Attrs) -> bool {
    let any = |list: Vec<&str>, want: &str| list.iter().any(|x| *x == "*" || *x == want);
    let names = strings(&rule["resourceNames"]);
    any(strings(&rule["apiGroups"]), &a.group)
        && any(strings(&rule["resources"]), &a.resource)
        && any(strings(&rule["verbs"]), &a.verb)
        && (names.is_empty() || a.name.as_deref().is_some_and(|n| names.contains(&n)))
}

/// The rules bound to `user` by the manifests, each with the namespace it is limited to.
fn rules_of<'a>(docs: &'a [Value], user: &str) -> Vec<(&'a Value, Option<String>)> {
    let mut rules = Vec::new();
    for binding in docs.iter().filter(|d| {
        matches!(
            d["kind"].as_str(),
            Some("ClusterRoleBinding" | "RoleBinding")
        )
    }) {
        let bound = binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount"
                    && format!(
                        "system:serviceaccount:{}:{}",
                        s["namespace"].as_str().unwrap_or_default(),
                        s["name"].as_str().unwrap_or_default()
                    ) == user
            });
        if !bound {
            continue;
        }
        let namespace = binding["metadata"]["namespace"].as_str().map(String::from);
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = &binding["roleRef"]["name"];
        for role in docs
            .iter()
            .filter(|d| d["kind"] == role_kind && &d["metadata"]["name"] == role_name)
        {
            for rule in role["rules"].as_array().into_iter().flatten() {
                rules.push((rule, namespace.clone()));
            }
        }
    }
    rules
}

/// The requests of `user` that the manifests' RBAC would refuse, as readable lines.
pub fn denied(docs: &[Value], user: &str, requests: &[Request]) -> Vec<String> {
    let rules = rules_of(docs, user);
    requests
        .iter()
        .filter(|r| r.user == user)
        .filter_map(|r| attributes(r).map(|a| (r, a)))
        .filter(|(_, a)| !always_allowed(a))
        .filter(|(_, a)| {
            !rules.iter().any(|(rule, ns)| {
                (ns.is_none() || ns.as_deref() == a.namespace.as_deref()) && rule_allows(rule, a)
            })
        })
        .map(|(r, a)| format!("{} {} {:?}", r.method, r.path, a))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, query: &str) -> Request {
        Request {
            user: "u".into(),
            method: method.into(),
            path: path.into(),
            query: query.into(),
        }
    }

    #[test]
    fn paths_map_to_rbac_attributes() {
        let a = attributes(&req("POST", "/api/v1/namespaces/ns/pods/p/eviction", "")).unwrap();
        assert_eq!(
            (a.verb.as_str(), a.resource.as_str()),
            ("create", "pods/eviction")
        );
        let a = attributes(&req(
            "GET",
            "/apis/apps/v1/namespaces/ns/replicasets",
            "Some(\"watch=true\")",
        ))
        .unwrap();
        assert_eq!((a.verb.as_str(), a.group.as_str()), ("watch", "apps"));
        let a = attributes(&req("GET", "/api/v1/namespaces/ns", "")).unwrap();
        assert_eq!(
            (a.resource.as_str(), a.name.as_deref()),
            ("namespaces", Some("ns"))
        );
        assert!(attributes(&req("GET", "/apis", "")).is_none());
    }
}
