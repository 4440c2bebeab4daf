//! An in-memory Kubernetes API for the lifecycle tests: just enough of the REST semantics
//! the reconciler and the CLI rely on — resourceVersion-guarded PUTs (409), the status
//! subresource, JSON patch with `test` (422), finalizers and deletionTimestamp, UID delete
//! preconditions, field selectors on dotted paths, generateName, and watches that replay
//! from a resourceVersion. It is a `tower::Service`, so `kube::Client::new` talks to it
//! without a socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::broadcast;

type Body = BoxBody<Bytes, Infallible>;

/// One write the fake answered, for assertions on request shapes.
#[derive(Clone, Debug)]
pub struct Write {
    pub method: Method,
    pub path: String,
    pub code: u16,
    pub body: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    uid: u64,
    objects: BTreeMap<(String, String), Value>,
    history: Vec<(u64, String, &'static str, Value)>,
    writes: Vec<Write>,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    no_lifecycle_api: Arc<std::sync::atomic::AtomicBool>,
    tx: broadcast::Sender<(u64, String, &'static str, Value)>,
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn lookup<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| v.get(k))
}

fn selected(obj: &Value, selector: Option<&String>) -> bool {
    selector.is_none_or(|s| {
        s.split(',').filter(|p| !p.is_empty()).all(|pair| {
            let (k, want) = pair.split_once('=').unwrap_or((pair, ""));
            lookup(obj, k).and_then(Value::as_str) == Some(want)
        })
    })
}

/// (resource, name, subresource) of a path we serve.
fn route(path: &str) -> Option<(String, Option<String>, Option<String>)> {
    let rest = path
        .strip_prefix("/api/v1/")
        .or_else(|| path.strip_prefix("/apis/lifecycle.k8s.io/v1alpha1/"))
        .or_else(|| path.strip_prefix("/apis/apiextensions.k8s.io/v1/"))
        .or_else(|| path.strip_prefix("/apis/events.k8s.io/v1/"))?;
    // Namespaced paths (Events only here) share one store per resource.
    let rest = match rest.strip_prefix("namespaces/") {
        Some(ns_rest) => ns_rest.split_once('/').map_or(ns_rest, |(_, r)| r),
        None => rest,
    };
    let mut parts = rest.split('/').map(str::to_string);
    Some((parts.next()?, parts.next(), parts.next()))
}

impl Default for FakeApi {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeApi {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self {
            state: Arc::default(),
            no_lifecycle_api: Arc::default(),
            tx,
        }
    }

    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.handle(req).await) }
        });
        kube::Client::new(svc, "default")
    }

    /// Stores an object as-is (assigning rv/uid/creationTimestamp).
    pub fn put(&self, resource: &str, mut obj: Value) -> Value {
        let mut st = self.state.lock().unwrap();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        st.rv += 1;
        st.uid += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        obj["metadata"]["uid"] = json!(format!("uid-{}", st.uid));
        if obj["metadata"]["creationTimestamp"].is_null() {
            obj["metadata"]["creationTimestamp"] = json!(now_rfc3339(st.rv));
        }
        self.record(&mut st, resource, "ADDED", obj.clone());
        st.objects.insert((resource.to_string(), name), obj.clone());
        obj
    }

    pub fn get(&self, resource: &str, name: &str) -> Option<Value> {
        let st = self.state.lock().unwrap();
        st.objects
            .get(&(resource.to_string(), name.to_string()))
            .cloned()
    }

    pub fn list(&self, resource: &str) -> Vec<Value> {
        let st = self.state.lock().unwrap();
        st.objects
            .iter()
            .filter(|((r, _), _)| r == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Stops serving lifecycle.k8s.io, as a cluster without the CRDs.
    pub fn remove_lifecycle_api(&self) {
        self.no_lifecycle_api
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn writes(&self) -> Vec<Write> {
        self.state.lock().unwrap().writes.clone()
    }

    /// Every version an object went through (watch history), oldest first.
    pub fn history(&self, resource: &str, name: &str) -> Vec<(&'static str, Value)> {
        let st = self.state.lock().unwrap();
        st.history
            .iter()
            .filter(|(_, r, _, o)| r == resource && o["metadata"]["name"] == name)
            .map(|(_, _, t, o)| (*t, o.clone()))
            .collect()
    }

    /// Deletes as a user would (finalizers keep the object with a deletionTimestamp).
    pub fn delete(&self, resource: &str, name: &str) {
        let mut st = self.state.lock().unwrap();
        self.delete_locked(&mut st, resource, name);
    }

    fn record(&self, st: &mut State, resource: &str, kind: &'static str, obj: Value) {
        let item = (st.rv, resource.to_string(), kind, obj);
        st.history.push(item.clone());
        let _ = self.tx.send(item);
    }

    fn delete_locked(&self, st: &mut State, resource: &str, name: &str) -> Option<Value> {
        let key = (resource.to_string(), name.to_string());
        let mut obj = st.objects.get(&key)?.clone();
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let finalizers = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if finalizers {
            if obj["metadata"]["deletionTimestamp"].is_null() {
                obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339(0));
            }
            st.objects.insert(key, obj.clone());
            self.record(st, resource, "MODIFIED", obj.clone());
        } else {
            st.objects.remove(&key);
            self.record(st, resource, "DELETED", obj.clone());
        }
        Some(obj)
    }

    async fn handle(&self, req: Request<kube::client::Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let query: HashMap<String, String> =
            serde_urlencoded::from_str(parts.uri.query().unwrap_or("")).unwrap_or_default();
        let path = parts.uri.path().to_string();
        if path.contains("/lifecycle.k8s.io/")
            && self
                .no_lifecycle_api
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return reply(
                404,
                status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ),
            );
        }
        if path == "/apis/lifecycle.k8s.io/v1alpha1" {
            return self.discovery();
        }
        let Some((resource, name, sub)) = route(&path) else {
            return reply(404, status(404, "NotFound", &format!("no route {path}")));
        };
        if parts.method == Method::GET
            && name.is_none()
            && query.get("watch").is_some_and(|w| w == "true")
        {
            return self.watch(&resource, &query);
        }
        let (code, out) = {
            let mut st = self.state.lock().unwrap();
            let (code, out) = self.serve(
                &mut st,
                &parts.method,
                &resource,
                name,
                sub,
                &query,
                body.clone(),
            );
            if parts.method != Method::GET {
                st.writes.push(Write {
                    method: parts.method.clone(),
                    path: path.clone(),
                    code,
                    body,
                });
            }
            (code, out)
        };
        reply(code, out)
    }

    fn discovery(&self) -> Response<Body> {
        let served = !self.list("customresourcedefinitions").is_empty();
        if !served {
            return reply(404, status(404, "NotFound", "not served"));
        }
        reply(
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "lifecycle.k8s.io/v1alpha1",
            "resources": [{"name": "lifecycleevents", "namespaced": false, "kind": "LifecycleEvent", "verbs": ["get"]}]}),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn serve(
        &self,
        st: &mut State,
        method: &Method,
        resource: &str,
        name: Option<String>,
        sub: Option<String>,
        query: &HashMap<String, String>,
        body: Value,
    ) -> (u16, Value) {
        let key = (resource.to_string(), name.clone().unwrap_or_default());
        let current = st.objects.get(&key).cloned();
        let not_found = || {
            (
                404,
                status(
                    404,
                    "NotFound",
                    &format!("{resource} \"{}\" not found", key.1),
                ),
            )
        };
        match (method.clone(), name.is_some(), sub.as_deref()) {
            (Method::GET, false, _) => {
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|((r, _), o)| r == resource && selected(o, query.get("fieldSelector")))
                    .map(|(_, v)| v.clone())
                    .collect();
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
                )
            }
            (Method::GET, true, _) => current.map_or_else(not_found, |o| (200, o)),
            (Method::POST, false, _) => self.create(st, resource, body),
            (Method::PUT, true, sub) => {
                let Some(cur) = current else {
                    return not_found();
                };
                if body["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] {
                    return (
                        409,
                        status(
                            409,
                            "Conflict",
                            "the object has been modified; please apply your changes to the latest version and try again",
                        ),
                    );
                }
                let mut next = cur.clone();
                if sub == Some("status") {
                    next["status"] = body["status"].clone();
                } else {
                    next["metadata"] = body["metadata"].clone();
                    next["spec"] = body["spec"].clone();
                }
                self.store(st, resource, next)
            }
            (Method::PATCH, true, _) => {
                let Some(mut cur) = current else {
                    return not_found();
                };
                let Ok(patch) = serde_json::from_value::<json_patch::Patch>(body) else {
                    return (400, status(400, "BadRequest", "not a json patch"));
                };
                if let Err(e) = json_patch::patch(&mut cur, &patch) {
                    return (422, status(422, "Invalid", &e.to_string()));
                }
                self.store(st, resource, cur)
            }
            (Method::DELETE, true, _) => {
                let Some(cur) = current else {
                    return not_found();
                };
                let uid = &body["preconditions"]["uid"];
                if !uid.is_null() && *uid != cur["metadata"]["uid"] {
                    return (409, status(409, "Conflict", "precondition failed: uid"));
                }
                let gone = self.delete_locked(st, resource, &key.1).unwrap_or(cur);
                (200, gone)
            }
            _ => (405, status(405, "MethodNotAllowed", "unsupported")),
        }
    }

    fn create(&self, st: &mut State, resource: &str, mut obj: Value) -> (u16, Value) {
        if obj["metadata"]["name"].is_null() {
            let prefix = obj["metadata"]["generateName"]
                .as_str()
                .unwrap_or("x-")
                .to_string();
            obj["metadata"]["name"] = json!(format!("{prefix}{:05}", st.rv + 1));
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let key = (resource.to_string(), name.clone());
        if st.objects.contains_key(&key) {
            return (
                409,
                status(
                    409,
                    "AlreadyExists",
                    &format!("{resource} \"{name}\" already exists"),
                ),
            );
        }
        if resource == "lifecycleevents" {
            obj.as_object_mut().map(|o| o.remove("status"));
        }
        st.rv += 1;
        st.uid += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        obj["metadata"]["uid"] = json!(format!("uid-{}", st.uid));
        obj["metadata"]["creationTimestamp"] = json!(now_rfc3339(0));
        st.objects.insert(key, obj.clone());
        self.record(st, resource, "ADDED", obj.clone());
        (201, obj)
    }

    fn store(&self, st: &mut State, resource: &str, mut next: Value) -> (u16, Value) {
        let name = next["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        st.rv += 1;
        next["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let deleting = !next["metadata"]["deletionTimestamp"].is_null();
        let finalizers = next["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let key = (resource.to_string(), name);
        if deleting && !finalizers {
            st.objects.remove(&key);
            self.record(st, resource, "DELETED", next.clone());
        } else {
            st.objects.insert(key, next.clone());
            self.record(st, resource, "MODIFIED", next.clone());
        }
        (200, next)
    }

    fn watch(&self, resource: &str, query: &HashMap<String, String>) -> Response<Body> {
        let from: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let selector = query.get("fieldSelector").cloned();
        let (replay, mut rx) = {
            let st = self.state.lock().unwrap();
            let rx = self.tx.subscribe();
            let replay: Vec<_> = st
                .history
                .iter()
                .filter(|(rv, r, _, _)| *rv > from && r == resource)
                .cloned()
                .collect();
            (replay, rx)
        };
        let resource = resource.to_string();
        let stream = async_stream::stream! {
            let mut last = from;
            for (rv, _, kind, obj) in replay {
                last = rv;
                if selected(&obj, selector.as_ref()) {
                    yield line(kind, &obj);
                }
            }
            while let Ok((rv, r, kind, obj)) = rx.recv().await {
                if rv > last && r == resource && selected(&obj, selector.as_ref()) {
                    last = rv;
                    yield line(kind, &obj);
                }
            }
        };
        let body = StreamBody::new(stream.map(|b| Ok::<_, Infallible>(Frame::data(b))));
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(BodyExt::boxed(body))
            .unwrap()
    }
}

fn line(kind: &str, obj: &Value) -> Bytes {
    let mut s = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap();
    s.push(b'\n');
    Bytes::from(s)
}

fn reply(code: u16, body: Value) -> Response<Body> {
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(BodyExt::boxed(http_body_util::Full::new(bytes)))
        .unwrap()
}

fn now_rfc3339(_seq: u64) -> String {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap()
        .to_string()
}
