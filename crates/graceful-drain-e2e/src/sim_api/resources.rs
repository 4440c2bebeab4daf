//! Objects addressed by resource name as plain JSON, the way the lifecycle tests write
//! them: put (create or replace, status included), get, list, delete, wait for a deletion,
//! and an object's whole history from the server's watch replay.

use std::time::Duration;

use futures::StreamExt;
use http::{Method, Request};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::core::WatchEvent;
use serde_json::Value;

use super::{CRD_PATH, SimApi};

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

/// Sends one admin request and returns the status with the JSON body.
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
    /// Creates an object, or replaces it (status included) when it exists.
    pub async fn put(&self, resource: &str, obj: Value) -> Value {
        let admin = self.admin();
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

    /// The object `name` of `resource`, as JSON; `None` when it does not exist.
    pub async fn get(&self, resource: &str, name: &str) -> Option<Value> {
        let admin = self.admin();
        let path = format!("{}/{name}", collection(resource));
        match send(&admin, Method::GET, &path, None).await {
            (200, obj) => Some(obj),
            (404, _) => None,
            (code, out) => panic!("get {path}: {code} {out}"),
        }
    }

    /// The objects of a resource; none when the resource is not served.
    pub async fn list(&self, resource: &str) -> Vec<Value> {
        let admin = self.admin();
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

    /// Every version an object went through, oldest first: the server's watch replay from
    /// the first resourceVersion, read up to a bookmark newer than every change so far.
    pub async fn history(&self, resource: &str, name: &str) -> Vec<(&'static str, Value)> {
        let admin = self.admin();
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
        let admin = self.admin();
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
        let admin = self.admin();
        let path = format!("{}/{name}", collection(resource));
        let (code, out) = send(&admin, Method::DELETE, &path, None).await;
        assert!(code == 200 || code == 202, "delete {path}: {out}");
    }
}
