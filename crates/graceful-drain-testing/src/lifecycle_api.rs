//! The lifecycle tests' cluster: the simulated API server (`kube_sim::apiserver`,
//! with resourceVersion-guarded writes, the status subresource, JSON patch `test` ops,
//! finalizers, preconditions, field selectors and watch replay), plus two things tests
//! assert on: every write the client sent with the status it got ([`SimApi::writes`]), and
//! every version an object went through ([`SimApi::history`], the server's watch replay).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use graceful_drain_core::runtime::Shutdown;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::core::WatchEvent;
use kube_sim::apiserver::{ApiServer, Config};
use serde_json::Value;

/// One write the server answered, for assertions on request shapes.
#[derive(Clone, Debug)]
pub struct Write {
    pub method: Method,
    pub path: String,
    pub code: u16,
    pub body: Value,
}

pub struct SimApi {
    server: ApiServer,
    shutdown: Shutdown,
    writes: Arc<Mutex<Vec<Write>>>,
    crds_hidden: Arc<std::sync::atomic::AtomicBool>,
    /// GETs whose path contains this are answered 429 (API Priority and Fairness).
    throttled: Arc<std::sync::Mutex<Option<String>>>,
    /// How many GETs were answered 429.
    throttled_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for SimApi {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// The collection path of a resource the tests use.
fn collection(resource: &str) -> String {
    match resource {
        "nodes" => "/api/v1/nodes".into(),
        "lifecycleevents" | "lifecycletransitions" => {
            format!("/apis/lifecycle.graceful-drain.io/v1alpha1/{resource}")
        }
        "customresourcedefinitions" => CRD_PATH.into(),
        other => panic!("no path for {other}"),
    }
}

async fn send(
    client: &kube::Client,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request = Request::builder().method(method).uri(path);
    let bytes = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            serde_json::to_vec(body).unwrap()
        }
        None => Vec::new(),
    };
    let response = client
        .send(request.body(Body::from(bytes)).unwrap())
        .await
        .unwrap();
    let code = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

impl SimApi {
    /// A fresh simulated API server serving the lifecycle CRDs.
    pub async fn new() -> Self {
        let shutdown = Shutdown::new();
        let config = Config {
            // `history` waits for a bookmark to know it has seen every change.
            bookmark_interval: Duration::from_millis(20),
            ..Config::default()
        };
        let server = ApiServer::start(config, shutdown.clone()).await.unwrap();
        let api = Self {
            server,
            shutdown,
            writes: Arc::default(),
            crds_hidden: Arc::default(),
            throttled: Arc::default(),
            throttled_count: Arc::default(),
        };
        let admin = api.server.client("admin");
        for crd in graceful_drain_core::lifecycle::crds::crds().unwrap() {
            let body = serde_json::to_value(&crd).unwrap();
            let (code, out) = send(
                &admin,
                Method::POST,
                &collection("customresourcedefinitions"),
                Some(&body),
            )
            .await;
            assert_eq!(code, 201, "create CRD: {out}");
        }
        api
    }

    /// A client whose writes are recorded with the status they got.
    pub fn client(&self) -> kube::Client {
        let inner = self.server.client("admin");
        let writes = self.writes.clone();
        let hidden = self.crds_hidden.clone();
        let throttled = self.throttled.clone();
        let throttled_count = self.throttled_count.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let (inner, writes, hidden) = (inner.clone(), writes.clone(), hidden.clone());
            let throttled = throttled.clone();
            let throttled_count = throttled_count.clone();
            async move {
                let throttled = throttled
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|part| request.uri().path().contains(part.as_str()));
                if throttled && request.method() == Method::GET {
                    throttled_count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","message":"Too many requests, please try again later.","code":429}"#;
                    let response = Response::builder()
                        .status(429)
                        .header("retry-after", "1")
                        .body(Body::from(body.as_bytes().to_vec()));
                    return Ok::<_, Infallible>(response.unwrap());
                }
                if hidden.load(std::sync::atomic::Ordering::SeqCst)
                    && request.uri().path().starts_with(CRD_PATH)
                    && request
                        .uri()
                        .path()
                        .ends_with(".lifecycle.graceful-drain.io")
                {
                    let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
                    let response = Response::builder()
                        .status(404)
                        .body(Body::from(body.as_bytes().to_vec()));
                    return Ok::<_, Infallible>(response.unwrap());
                }
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await.unwrap().to_bytes();
                let method = parts.method.clone();
                let path = parts.uri.path().to_string();
                let request = Request::from_parts(parts, Body::from(bytes.to_vec()));
                let response: Response<Body> = inner.send(request).await.unwrap();
                if method != Method::GET {
                    writes.lock().unwrap().push(Write {
                        method,
                        path,
                        code: response.status().as_u16(),
                        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    });
                }
                Ok::<_, Infallible>(response)
            }
        });
        kube::Client::new(service, "default")
    }

    /// Creates an object, or replaces it (status included) when it exists.
    pub async fn put(&self, resource: &str, obj: Value) -> Value {
        let admin = self.server.client("admin");
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let path = format!("{}/{name}", collection(resource));
        let (code, mut stored) = match self.get(resource, &name).await {
            None => send(&admin, Method::POST, &collection(resource), Some(&obj)).await,
            Some(current) => {
                let mut obj = obj.clone();
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
                send(&admin, Method::PUT, &path, Some(&obj)).await
            }
        };
        assert!(code == 200 || code == 201, "put {path}: {stored}");
        if !obj["status"].is_null() && stored["status"] != obj["status"] {
            let mut with_status = stored.clone();
            with_status["status"] = obj["status"].clone();
            let (code, out) = send(
                &admin,
                Method::PUT,
                &format!("{path}/status"),
                Some(&with_status),
            )
            .await;
            assert_eq!(code, 200, "put {path}/status: {out}");
            stored = out;
        }
        stored
    }

    pub async fn get(&self, resource: &str, name: &str) -> Option<Value> {
        let admin = self.server.client("admin");
        let path = format!("{}/{name}", collection(resource));
        match send(&admin, Method::GET, &path, None).await {
            (200, obj) => Some(obj),
            (404, _) => None,
            (code, out) => panic!("get {path}: {code} {out}"),
        }
    }

    /// The objects of a resource; none when the resource is not served.
    pub async fn list(&self, resource: &str) -> Vec<Value> {
        let admin = self.server.client("admin");
        match send(&admin, Method::GET, &collection(resource), None).await {
            (200, out) => out["items"].as_array().cloned().unwrap_or_default(),
            (404, _) => Vec::new(),
            (code, out) => panic!("list {resource}: {code} {out}"),
        }
    }

    /// Deletes the lifecycle.graceful-drain.io CRDs, as on a cluster without them.
    pub async fn remove_lifecycle_api(&self) {
        for crd in self.list("customresourcedefinitions").await {
            let name = crd["metadata"]["name"].as_str().unwrap().to_string();
            if name.ends_with(".lifecycle.graceful-drain.io") {
                self.delete("customresourcedefinitions", &name).await;
            }
        }
    }

    /// The client's lookups of the lifecycle CRD objects answer 404 while the API stays
    /// served: a cluster whose API server has lifecycle.k8s.io built in.
    pub fn hide_lifecycle_crds(&self) {
        self.crds_hidden
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The client's GETs whose path contains `part` are answered 429 with Retry-After,
    /// as API Priority and Fairness answers under load; `None` ends it.
    pub fn throttle_gets(&self, part: Option<&str>) {
        *self.throttled.lock().unwrap() = part.map(str::to_string);
    }

    /// How many GETs were answered 429 so far.
    pub fn throttled_gets(&self) -> usize {
        self.throttled_count
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn writes(&self) -> Vec<Write> {
        self.writes.lock().unwrap().clone()
    }

    /// Every version an object went through, oldest first: the server's watch replay from
    /// the first resourceVersion, read up to a bookmark newer than every change so far.
    pub async fn history(&self, resource: &str, name: &str) -> Vec<(&'static str, Value)> {
        let admin = self.server.client("admin");
        let (code, list) = send(&admin, Method::GET, &collection(resource), None).await;
        assert_eq!(code, 200, "list {resource}: {list}");
        let upto: u64 = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let mut events = self
            .watch(resource, name, "1&allowWatchBookmarks=true")
            .await;
        let mut out = Vec::new();
        while let Some(event) = events.next().await {
            let (kind, object) = match event.unwrap() {
                WatchEvent::Added(object) => ("ADDED", object),
                WatchEvent::Modified(object) => ("MODIFIED", object),
                WatchEvent::Deleted(object) => ("DELETED", object),
                WatchEvent::Bookmark(bookmark) => {
                    let rv: u64 = bookmark.metadata.resource_version.parse().unwrap_or(0);
                    if rv >= upto {
                        break;
                    }
                    continue;
                }
                WatchEvent::Error(error) => panic!("watch {resource}: {error:?}"),
            };
            out.push((kind, object));
        }
        out
    }

    /// The watch events of one object after resourceVersion `from` (which may carry more
    /// query parameters).
    async fn watch(
        &self,
        resource: &str,
        name: &str,
        from: &str,
    ) -> futures::stream::BoxStream<'static, kube::Result<WatchEvent<Value>>> {
        let admin = self.server.client("admin");
        let path = format!(
            "{}?watch=true&fieldSelector=metadata.name%3D{name}&resourceVersion={from}",
            collection(resource)
        );
        let request = Request::get(path).body(Vec::new()).unwrap();
        admin
            .request_events::<Value>(request)
            .await
            .unwrap()
            .boxed()
    }

    /// Returns once the object is gone (at once when it is), following a watch; panics
    /// after 20 s.
    pub async fn wait_deleted(&self, resource: &str, name: &str) {
        let Some(current) = self.get(resource, name).await else {
            return;
        };
        let rv = current["metadata"]["resourceVersion"].as_str().unwrap();
        let mut events = self.watch(resource, name, rv).await;
        let deleted = async {
            while let Some(event) = events.next().await {
                if let WatchEvent::Deleted(_) = event.unwrap() {
                    return;
                }
            }
            panic!("watch of {resource}/{name} ended");
        };
        tokio::time::timeout(Duration::from_secs(20), deleted)
            .await
            .unwrap_or_else(|_| panic!("{resource}/{name} still exists after 20 s"));
    }

    /// Deletes as a user would (finalizers keep the object with a deletionTimestamp).
    pub async fn delete(&self, resource: &str, name: &str) {
        let admin = self.server.client("admin");
        let path = format!("{}/{name}", collection(resource));
        let (code, out) = send(&admin, Method::DELETE, &path, None).await;
        assert!(code == 200 || code == 202, "delete {path}: {out}");
    }
}
