//! The simulated API server driven through kube-rs: CRUD, selectors, pagination,
//! watches (resume, bookmarks, 410 Gone), patch kinds, optimistic concurrency, the
//! delete lifecycle, CRDs, eviction rules and admission webhooks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::core::Status;
use kube_sim::apiserver::{ApiServer, Config};
use kube_sim::fixtures::{self, PodFixture, to_json};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

async fn server(config: Config) -> (ApiServer, CancellationToken) {
    let shutdown = CancellationToken::new();
    let api = ApiServer::start(config, shutdown.clone()).await.unwrap();
    (api, shutdown)
}

fn api_error(err: kube::Error) -> Status {
    match err {
        kube::Error::Api(resp) => *resp,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Pod `default/<name>` running `web:1` with these labels, bound to `node` if given.
fn pod(name: &str, node: Option<&str>, labels: &[(&str, &str)]) -> Pod {
    let pod = fixtures::pod(name).with_labels(labels).container("web:1");
    match node {
        Some(node) => pod.on_node(node),
        None => pod,
    }
}

#[tokio::test]
async fn create_get_list_with_selectors_and_pagination() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // Unknown fields vanish like on a real API server; server-set metadata appears.
    let mut body = to_json(&pod(
        "web-1",
        Some("node-a"),
        &[("app", "web"), ("tier", "front")],
    ));
    body["spec"]["nodeNmae"] = json!("typo");
    let raw: Pod = serde_json::from_value(body.clone()).unwrap();
    let created = pods.create(&PostParams::default(), &raw).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.as_deref().is_some_and(|u| !u.is_empty()));
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    let stored = client
        .request::<Value>(
            http::Request::get("/api/v1/namespaces/default/pods/web-1")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(stored.pointer("/spec/nodeNmae").is_none(), "{stored}");

    let mut generated = pod("", Some("node-b"), &[("app", "web"), ("tier", "back")]);
    generated.metadata.generate_name = Some("web-".into());
    let generated = pods
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let generated_name = generated.metadata.name.unwrap();
    assert!(generated_name.starts_with("web-") && generated_name.len() == 9);
    pods.create(
        &PostParams::default(),
        &pod("db-1", Some("node-a"), &[("app", "db")]),
    )
    .await
    .unwrap();

    let dup = pods
        .create(&PostParams::default(), &pod("db-1", None, &[]))
        .await
        .unwrap_err();
    let dup = api_error(dup);
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));

    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    };
    let web = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(names(web).len(), 2);
    let front = pods
        .list(&ListParams::default().labels("app in (web,db),tier notin (back)"))
        .await
        .unwrap();
    assert_eq!(names(front), vec!["db-1", "web-1"]);
    let on_a = pods
        .list(&ListParams::default().fields("spec.nodeName=node-a,metadata.name!=db-1"))
        .await
        .unwrap();
    assert_eq!(names(on_a), vec!["web-1"]);
    let bad = api_error(
        pods.list(&ListParams::default().fields("spec.bogus=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(bad.code, 400);

    // limit/continue pagination walks every pod once.
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().unwrap();
    let rest = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert!(rest.metadata.continue_.as_deref().unwrap_or("").is_empty());
    assert_eq!(first.metadata.remaining_item_count, Some(1));
    // With a selector the count is not given, only the token.
    let selected = pods
        .list(&ListParams::default().labels("app=web").limit(1))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
    assert!(selected.metadata.continue_.is_some());
    assert_eq!(selected.metadata.remaining_item_count, None);
    // At resourceVersion "0" the watch cache answers whole, whatever the limit (kube-rs
    // never sends both, so the request is written out).
    let cached = client
        .request::<Value>(
            http::Request::get("/api/v1/namespaces/default/pods?resourceVersion=0&limit=2")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let items = cached["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "the limit is ignored at resourceVersion 0");
    assert!(cached.pointer("/metadata/continue").is_none(), "{cached}");

    // Re-creating an object from a fetched copy (resourceVersion set) is refused.
    let mut copy = pods.get("db-1").await.unwrap();
    copy.metadata.name = Some("db-2".into());
    let refused = api_error(
        pods.create(&PostParams::default(), &copy)
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 500);
    assert!(
        refused
            .message
            .contains("resourceVersion should not be set"),
        "{}",
        refused.message
    );

    // RBAC objects accept the colon-separated names system roles use.
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let role = json!({"metadata": {"name": "system:controller:graceful-drain"}, "rules": []});
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(role).unwrap(),
        )
        .await
        .unwrap();

    // Namespaced objects need their namespace.
    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "missing");
    let err = api_error(
        elsewhere
            .create(&PostParams::default(), &pod("x", None, &[]).ns("missing"))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    let missing = api_error(pods.get("nope").await.unwrap_err());
    assert_eq!(missing.code, 404);
    assert_eq!(missing.message, "pods \"nope\" not found");

    let stats = api.stats();
    assert!(stats.count("create", "pods") >= 4);
    assert!(stats.count("list", "pods") >= 4);
}

/// As TaintNodesByCondition admission does on kube-apiserver
/// (plugin/pkg/admission/nodetaint/admission.go): a new Node is tainted not-ready, once,
/// whatever taints it came with, so nothing is scheduled there before it is Ready.
#[tokio::test]
async fn a_new_node_is_tainted_not_ready_until_lifted() {
    let (api, _shutdown) = server(Config::default()).await;
    let nodes: Api<Node> = Api::all(api.client("admin"));
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    let taints: Vec<(String, String)> = created
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect();
    assert_eq!(
        taints,
        [
            ("dedicated".to_string(), "NoSchedule".to_string()),
            (
                "node.kubernetes.io/not-ready".to_string(),
                "NoSchedule".to_string()
            ),
        ]
    );
    let tainted: Node = serde_json::from_value(json!({"metadata": {"name": "n2"},
        "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}}))
    .unwrap();
    let created = nodes
        .create(&PostParams::default(), &tainted)
        .await
        .unwrap();
    assert_eq!(created.spec.unwrap().taints.unwrap().len(), 1, "added once");
}

/// A DaemonSet's template generation is the API server's, as kube-apiserver keeps it:
/// 1 on create, kept by an update, bumped by a changed template only (the DaemonSet
/// controller labels its pods with it and our webhook compares the two).
#[tokio::test]
async fn a_daemonsets_template_generation_moves_with_its_template_only() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let (api, _shutdown) = server(Config::default()).await;
    let sets: Api<DaemonSet> = Api::namespaced(api.client("admin"), "default");
    let generation = |ds: &DaemonSet| {
        ds.metadata.annotations.as_ref().unwrap()["deprecated.daemonset.template.generation"]
            .clone()
    };
    let ds: DaemonSet = serde_json::from_value(json!({"metadata": {"name": "agent",
            "annotations": {"deprecated.daemonset.template.generation": "0"}},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "agent", "image": "agent:1"}]}}}}))
    .unwrap();
    let ds = sets.create(&PostParams::default(), &ds).await.unwrap();
    assert_eq!(generation(&ds), "1");
    let mut other = ds.clone();
    other.spec.as_mut().unwrap().min_ready_seconds = Some(5);
    other.metadata.annotations.as_mut().unwrap().insert(
        "deprecated.daemonset.template.generation".into(),
        "7".into(),
    );
    let other = sets
        .replace("agent", &PostParams::default(), &other)
        .await
        .unwrap();
    assert_eq!(generation(&other), "1", "not the client's to set");
    let mut new_image = other.clone();
    new_image
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some("agent:2".into());
    let new_image = sets
        .replace("agent", &PostParams::default(), &new_image)
        .await
        .unwrap();
    assert_eq!(generation(&new_image), "2");
}

#[tokio::test]
async fn updates_conflict_on_stale_resource_version_and_patch_kinds_apply() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"a": "1"}}})).unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();

    let mut first = created.clone();
    first
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("b".into(), "2".into());
    let updated = nodes
        .replace("n1", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    // A writer holding the old resourceVersion loses.
    let stale = api_error(
        nodes
            .replace("n1", &PostParams::default(), &created)
            .await
            .unwrap_err(),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));

    // Strategic merge (cordon), merge and JSON patch with a test op.
    let cordoned = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    assert_eq!(cordoned.spec.unwrap().unschedulable, Some(true));
    assert_eq!(cordoned.metadata.generation, Some(2));
    let cordoned_list = nodes
        .list(&ListParams::default().fields("spec.unschedulable=true"))
        .await
        .unwrap();
    assert_eq!(cordoned_list.items.len(), 1);
    let merged = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": null}}})),
        )
        .await
        .unwrap();
    assert!(!merged.metadata.labels.unwrap().contains_key("a"));
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/b", "value": "2"},
        {"op": "add", "path": "/metadata/labels/c", "value": "3"},
    ]))
    .unwrap();
    let patched = nodes
        .patch("n1", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["c"], "3");
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/b", "value": "not-2"},
        {"op": "remove", "path": "/metadata/labels/b"},
    ]))
    .unwrap();
    let err = api_error(
        nodes
            .patch("n1", &PatchParams::default(), &Patch::<()>::Json(failing))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert_eq!(
        nodes.get("n1").await.unwrap().metadata.labels.unwrap()["b"],
        "2"
    );

    // Status goes through the status subresource only.
    let status_patch = Patch::Merge(json!({"status": {"phase": "Running"}}));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("p", Some("n1"), &[]))
        .await
        .unwrap();
    let ignored = pods
        .patch("p", &PatchParams::default(), &status_patch)
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().phase.as_deref(), Some("Pending"));
    let applied = pods
        .patch_status("p", &PatchParams::default(), &status_patch)
        .await
        .unwrap();
    assert_eq!(applied.status.unwrap().phase.as_deref(), Some("Running"));

    // Dry run validates but stores nothing.
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    pods.create(&dry, &pod("ghost", None, &[])).await.unwrap();
    assert_eq!(api_error(pods.get("ghost").await.unwrap_err()).code, 404);
    // Server-side apply needs a field manager (upstream handlers/patch.go: 400).
    let err = api_error(
        pods.patch("p", &PatchParams::default(), &Patch::Apply(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    assert!(
        err.message.contains("fieldManager is required"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn delete_lifecycle_grace_periods_preconditions_and_finalizers() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let bound = pods
        .create(&PostParams::default(), &pod("bound", Some("n1"), &[]))
        .await
        .unwrap();

    // A UID precondition naming another object is a conflict and deletes nothing.
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let err = api_error(pods.delete("bound", &wrong).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("does not match the UID in record"),
        "{}",
        err.message
    );

    // A pod bound to a node gets a deletionTimestamp and stays until deleted with grace 0.
    let graceful = DeleteParams {
        grace_period_seconds: Some(20),
        preconditions: Some(Preconditions {
            uid: bound.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete("bound", &graceful).await.unwrap();
    let terminating = pods.get("bound").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(20));
    pods.delete("bound", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(api_error(pods.get("bound").await.unwrap_err()).code, 404);

    // An unbound pod goes at once.
    pods.create(&PostParams::default(), &pod("loose", None, &[]))
        .await
        .unwrap();
    pods.delete("loose", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(pods.get("loose").await.unwrap_err()).code, 404);

    // Finalizers hold an object until they are emptied.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut held = pod("held", None, &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    pods.create(&PostParams::default(), &held).await.unwrap();
    pods.delete("held", &DeleteParams::default()).await.unwrap();
    assert!(
        pods.get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    // No new finalizer may join an object being deleted.
    let more = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/late"]}});
    let refused = api_error(
        pods.patch("held", &PatchParams::default(), &Patch::Merge(more))
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 422);
    assert!(
        refused.message.contains("example.com/late"),
        "{}",
        refused.message
    );
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(pods.get("held").await.unwrap_err()).code, 404);

    // Deleting a namespace removes its contents.
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "scratch"}})).unwrap(),
        )
        .await
        .unwrap();
    let scratch: Api<Pod> = Api::namespaced(client.clone(), "scratch");
    scratch
        .create(&PostParams::default(), &pod("tmp", None, &[]).ns("scratch"))
        .await
        .unwrap();
    namespaces
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(scratch.get("tmp").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn watch_resumes_sends_bookmarks_and_expires_old_versions() {
    let config = Config {
        watch_history: 4,
        bookmark_interval: Duration::from_millis(50),
        ..Config::default()
    };
    let (api, _shutdown) = server(config).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let first = pods
        .create(
            &PostParams::default(),
            &pod("w1", Some("n1"), &[("app", "web")]),
        )
        .await
        .unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    pods.create(
        &PostParams::default(),
        &pod("w2", Some("n2"), &[("app", "web")]),
    )
    .await
    .unwrap();
    pods.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
    )
    .await
    .unwrap();

    // Resuming after w1's creation replays the later changes; the relabelled pod
    // leaves the selector and so is seen as DELETED.
    let params = WatchParams::default().labels("app=web");
    let mut stream = pods.watch(&params, &rv).await.unwrap().boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(p) => seen.push(format!("ADDED {}", p.metadata.name.unwrap())),
            WatchEvent::Deleted(p) => seen.push(format!("DELETED {}", p.metadata.name.unwrap())),
            WatchEvent::Modified(p) => seen.push(format!("MODIFIED {}", p.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => seen.push("BOOKMARK".into()),
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(&seen[..2], ["ADDED w2", "DELETED w1"]);
    assert_eq!(seen[2], "BOOKMARK");

    // Push the first version out of the kept history: resuming from it is 410 Gone.
    for i in 0..6 {
        pods.patch(
            "w2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"i": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    let mut stream = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }

    // kube-runtime's watcher copes with all of it and sees new pods.
    let watcher = kube::runtime::watcher(pods.clone(), kube::runtime::watcher::Config::default());
    let mut objects = Box::pin(kube::runtime::WatchStreamExt::applied_objects(watcher));
    let creator = pods.clone();
    tokio::spawn(async move {
        creator
            .create(&PostParams::default(), &pod("w3", None, &[]))
            .await
            .unwrap();
    });
    let mut names = Vec::new();
    while !names.contains(&"w3".to_string()) {
        let p = tokio::time::timeout(Duration::from_secs(5), objects.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        names.push(p.metadata.name.unwrap());
    }
    assert!(api.stats().count("watch", "pods") >= 2);
}

// ---------------------------------------------------------------------------------
// Eviction

use k8s_openapi::api::policy::v1::PodDisruptionBudget;

/// A raw POST returning status, Retry-After and the JSON body.
async fn post_raw(api: &ApiServer, path: &str, body: Value) -> (u16, Option<String>, Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(format!("{}{path}", api.url()))
        .header("authorization", "Bearer admin")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        retry,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn eviction(name: &str, options: Value) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "Eviction",
           "metadata": {"name": name, "namespace": "default"}, "deleteOptions": options})
}

async fn running_pod(pods: &Api<Pod>, name: &str, labels: &[(&str, &str)]) -> Pod {
    let created = pods
        .create(&PostParams::default(), &pod(name, Some("n1"), labels))
        .await
        .unwrap();
    let status = json!({"status": {"phase": "Running",
                                   "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    created
}

async fn pdb(client: &kube::Client, name: &str, app: &str, observed: bool, allowed: i32) {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let body = json!({"metadata": {"name": name},
                      "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}});
    pdbs.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
    .unwrap();
    let status = json!({"status": {"observedGeneration": if observed { 1 } else { 0 },
        "disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}});
    pdbs.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

fn evict_path(name: &str) -> String {
    format!("/api/v1/namespaces/default/pods/{name}/eviction")
}

#[tokio::test]
async fn eviction_follows_the_upstream_disruption_budget_rules() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");

    // Gone → 404.
    let (code, _, body) = post_raw(&api, &evict_path("ghost"), eviction("ghost", json!({}))).await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));

    // No PDB: deleted with the eviction's grace period; a wrong UID precondition is 409.
    let free = running_pod(&pods, "free", &[("app", "free")]).await;
    let wrong = json!({"preconditions": {"uid": "not-the-uid"}});
    let (code, _, _) = post_raw(&api, &evict_path("free"), eviction("free", wrong)).await;
    assert_eq!(code, 409);
    let right = json!({"gracePeriodSeconds": 7, "preconditions": {"uid": free.metadata.uid}});
    let (code, _, _) = post_raw(&api, &evict_path("free"), eviction("free", right)).await;
    assert_eq!(code, 201);
    let evicted = pods.get("free").await.unwrap();
    assert_eq!(evicted.metadata.deletion_grace_period_seconds, Some(7));
    let conditions = evicted.status.unwrap().conditions.unwrap();
    assert!(conditions.iter().any(|c| c.type_ == "DisruptionTarget"));

    // PDB not observed yet → 429 with Retry-After 10.
    running_pod(&pods, "new-1", &[("app", "new")]).await;
    pdb(&client, "new-pdb", "new", false, 1).await;
    let (code, retry, body) =
        post_raw(&api, &evict_path("new-1"), eviction("new-1", json!({}))).await;
    assert_eq!((code, retry.as_deref()), (429, Some("10")));
    assert_eq!(body["reason"], "TooManyRequests");

    // One disruption allowed: the first eviction is recorded in the PDB, the second
    // is refused with Retry-After 0 and a message naming the budget.
    running_pod(&pods, "web-1", &[("app", "web")]).await;
    running_pod(&pods, "web-2", &[("app", "web")]).await;
    pdb(&client, "web-pdb", "web", true, 1).await;
    let dry = json!({"dryRun": ["All"]});
    let (code, _, _) = post_raw(&api, &evict_path("web-1"), eviction("web-1", dry)).await;
    assert_eq!(code, 201);
    assert!(
        pods.get("web-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    assert_eq!(
        pdbs.get("web-pdb")
            .await
            .unwrap()
            .status
            .unwrap()
            .disruptions_allowed,
        1
    );
    let (code, _, _) = post_raw(&api, &evict_path("web-1"), eviction("web-1", json!({}))).await;
    assert_eq!(code, 201);
    let status = pdbs.get("web-pdb").await.unwrap().status.unwrap();
    assert_eq!(status.disruptions_allowed, 0);
    assert!(status.disrupted_pods.unwrap().contains_key("web-1"));
    let (code, retry, body) =
        post_raw(&api, &evict_path("web-2"), eviction("web-2", json!({}))).await;
    // A zero delay is no header at all (upstream writes Retry-After only when positive).
    assert_eq!((code, retry.as_deref()), (429, None));
    assert_eq!(
        body["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert!(
        body["details"]["causes"][0]["message"]
            .as_str()
            .unwrap()
            .contains("web-pdb")
    );
    assert!(
        pods.get("web-2")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );

    // A terminating pod skips the budget check.
    let (code, _, _) = post_raw(&api, &evict_path("web-1"), eviction("web-1", json!({}))).await;
    assert_eq!(code, 201);

    // Two budgets selecting one pod → 500.
    pdb(&client, "web-pdb-2", "web", true, 5).await;
    let (code, _, _) = post_raw(&api, &evict_path("web-2"), eviction("web-2", json!({}))).await;
    assert_eq!(code, 500);
}

#[tokio::test]
async fn eviction_options_under_a_misspelled_key_are_dropped() {
    // kube-core's Api::evict sends `delete_options` and no apiVersion/kind: a real API
    // server drops the unknown key, so the grace period and preconditions are lost.
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    running_pod(&pods, "victim", &[("app", "x")]).await;
    let params = kube::api::EvictParams {
        delete_options: Some(DeleteParams {
            grace_period_seconds: Some(3),
            preconditions: Some(Preconditions {
                uid: Some("some-other-pod".into()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..kube::api::EvictParams::default()
    };
    pods.evict("victim", &params).await.unwrap();
    let victim = pods.get("victim").await.unwrap();
    assert_eq!(victim.metadata.deletion_grace_period_seconds, Some(30));
}

// ---------------------------------------------------------------------------------
// Admission

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;

/// What the test webhook received: (path and query, AdmissionReview).
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// Answers by path: `/mutate` dry-runs evictions, `/deny` denies, `/deny-bare` denies
/// without a status, `/bad-patch` returns a patch that cannot apply, `/bad` answers
/// without apiVersion/kind, `/slow` never answers in time, `/gate` holds its first call
/// until the test opens the gate, anything else allows.
async fn webhook_answer(seen: Seen, uri: http::Uri, body: axum::body::Bytes) -> axum::Json<Value> {
    let review: Value = serde_json::from_slice(&body).unwrap();
    seen.lock().unwrap().push((uri.to_string(), review.clone()));
    let uid = review["request"]["uid"].clone();
    let mut response = json!({"uid": uid, "allowed": true});
    match uri.path() {
        "/mutate" => {
            let patch =
                json!([{"op": "add", "path": "/deleteOptions", "value": {"dryRun": ["All"]}}]);
            response["patchType"] = json!("JSONPatch");
            response["patch"] =
                json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        "/deny" => {
            response["allowed"] = json!(false);
            // 429, not the default 403, so the test shows the webhook's code is kept.
            response["status"] = json!({"code": 429, "message": "not today"});
        }
        "/deny-bare" => response["allowed"] = json!(false),
        "/bad-patch" => {
            let patch = json!([{"op": "remove", "path": "/no/such/field"}]);
            response["patchType"] = json!("JSONPatch");
            response["patch"] =
                json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        "/bad" => return axum::Json(json!({"response": response})),
        "/slow" => tokio::time::sleep(Duration::from_secs(5)).await,
        "/gate" => {
            // The first call waits until the test has changed the object meanwhile.
            let first = seen
                .lock()
                .unwrap()
                .iter()
                .filter(|(p, _)| p.starts_with("/gate"))
                .count()
                == 1;
            if first {
                GATE_REACHED.notify_one();
                GATE_OPEN.notified().await;
            }
        }
        _ => {}
    }
    axum::Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// Signalled when the first `/gate` review arrived.
static GATE_REACHED: tokio::sync::Notify = tokio::sync::Notify::const_new();
/// Releases the first `/gate` review.
static GATE_OPEN: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// A tiny HTTPS webhook on loopback; returns its address, CA (PEM) and request log.
async fn webhook_server(shutdown: CancellationToken) -> (SocketAddr, String, Seen) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let names = ["localhost", "hooks.default.svc", "127.0.0.1"].map(String::from);
    let issued = rcgen::generate_simple_self_signed(names.to_vec()).unwrap();
    let ca = issued.cert.pem();
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = issued.signing_key.serialize_pem();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |uri: http::Uri, body: axum::body::Bytes| {
        webhook_answer(log.clone(), uri, body)
    });
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                accepted = listener.accept() => accepted.unwrap(),
                _ = shutdown.cancelled() => return,
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    });
    (addr, ca, seen)
}

use rustls::pki_types::pem::PemObject;

fn webhook_config(
    kind: &str,
    name: &str,
    client: Value,
    rule: Value,
    policy: &str,
    timeout: u64,
) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": name},
        "webhooks": [{
            "name": name, "clientConfig": client, "rules": [rule],
            "failurePolicy": policy, "sideEffects": "None", "timeoutSeconds": timeout,
            "admissionReviewVersions": ["v1"],
            "namespaceSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        }],
    })
}

async fn post_object(client: &kube::Client, path: &str, body: &Value) {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    client.request::<Value>(request).await.unwrap();
}

async fn delete_object(client: &kube::Client, path: &str) {
    let request = http::Request::delete(path).body(Vec::new()).unwrap();
    client.request::<Value>(request).await.unwrap();
}

const MUTATING: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
const VALIDATING: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";

/// An API server, the test webhook, and two running pods `web-1`, `web-2`.
struct AdmissionFixture {
    api: ApiServer,
    client: kube::Client,
    pods: Api<Pod>,
    hook_addr: SocketAddr,
    ca_bundle: String,
    seen: Seen,
    _shutdown: CancellationToken,
}

impl AdmissionFixture {
    async fn start() -> Self {
        let (api, shutdown) = server(Config::default()).await;
        let (hook_addr, ca, seen) = webhook_server(shutdown.clone()).await;
        let client = api.client("admin");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        running_pod(&pods, "web-1", &[("app", "web")]).await;
        running_pod(&pods, "web-2", &[("app", "web")]).await;
        Self {
            api,
            client,
            pods,
            hook_addr,
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(&ca),
            seen,
            _shutdown: shutdown,
        }
    }

    /// A `url` clientConfig for `https://{host}:PORT{path}`.
    fn url(&self, host: &str, path: &str) -> Value {
        json!({"url": format!("https://{host}:{}{path}", self.hook_addr.port()), "caBundle": self.ca_bundle})
    }

    async fn register(
        &self,
        kind: &str,
        name: &str,
        client: Value,
        rule: Value,
        policy: &str,
        timeout: u64,
    ) {
        let path = if kind.starts_with("Mutating") {
            MUTATING
        } else {
            VALIDATING
        };
        post_object(
            &self.client,
            path,
            &webhook_config(kind, name, client, rule, policy, timeout),
        )
        .await;
    }

    fn reviews(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

fn eviction_rule() -> Value {
    json!({"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
           "resources": ["pods/eviction"], "scope": "Namespaced"})
}

fn delete_rule() -> Value {
    json!({"operations": ["DELETE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]})
}

#[tokio::test]
async fn mutating_eviction_webhook_gets_a_real_review_and_its_dry_run_takes_effect() {
    let fx = AdmissionFixture::start().await;
    let by_url = fx.url("127.0.0.1", "/mutate");
    fx.register(
        "MutatingWebhookConfiguration",
        "evict.example.com",
        by_url,
        eviction_rule(),
        "Fail",
        7,
    )
    .await;
    let (code, _, _) = post_raw(&fx.api, &evict_path("web-1"), eviction("web-1", json!({}))).await;
    assert_eq!(code, 201);
    assert!(
        fx.pods
            .get("web-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );

    let (path, review) = fx.reviews()[0].clone();
    assert_eq!(path, "/mutate?timeout=7s");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    let request = &review["request"];
    assert!(!request["uid"].as_str().unwrap().is_empty());
    assert_eq!(
        request["kind"],
        json!({"group": "policy", "version": "v1", "kind": "Eviction"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(request["requestKind"], request["kind"]);
    assert_eq!(request["requestResource"], request["resource"]);
    assert_eq!(request["subResource"], "eviction");
    assert_eq!(request["name"], "web-1");
    assert_eq!(request["namespace"], "default");
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(request["userInfo"]["username"], "admin");
    assert!(
        request["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters"))
    );
    assert_eq!(request["object"]["kind"], "Eviction");
    assert_eq!(request["object"]["metadata"]["name"], "web-1");
    assert_eq!(request["options"]["kind"], "CreateOptions");
    assert_eq!(request["dryRun"], false);

    // Admission runs before the budget check: a blocked eviction still reaches the
    // webhook, and the dry run still answers 429 like upstream.
    pdb(&fx.client, "web-pdb", "web", true, 0).await;
    let (code, retry, _) =
        post_raw(&fx.api, &evict_path("web-2"), eviction("web-2", json!({}))).await;
    assert_eq!((code, retry.as_deref()), (429, None));
    assert_eq!(fx.reviews().len(), 2);
    assert_eq!(fx.api.stats().admission_calls["evict.example.com"], 2);
}

#[tokio::test]
async fn validating_webhook_behind_a_service_denies_with_the_api_server_wording() {
    let fx = AdmissionFixture::start().await;
    fx.api.route_service("default", "hooks", fx.hook_addr);
    hooks_service(&fx.client, &[("10.0.0.9", true, false)]).await;
    let by_service = json!({"service": {"namespace": "default", "name": "hooks", "path": "/deny", "port": 443},
                            "caBundle": fx.ca_bundle});
    fx.register(
        "ValidatingWebhookConfiguration",
        "deny.example.com",
        by_service,
        delete_rule(),
        "Fail",
        5,
    )
    .await;
    let denied = api_error(
        fx.pods
            .delete("web-2", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(denied.code, 429);
    assert_eq!(
        denied.message,
        "admission webhook \"deny.example.com\" denied the request: not today"
    );
    assert!(
        fx.pods
            .get("web-2")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    let (path, review) = fx.reviews().last().unwrap().clone();
    assert_eq!(path, "/deny?timeout=5s");
    assert_eq!(review["request"]["operation"], "DELETE");
    assert!(review["request"]["object"].is_null());
    assert_eq!(review["request"]["oldObject"]["metadata"]["name"], "web-2");
    assert_eq!(review["request"]["options"]["kind"], "DeleteOptions");

    // Pods in a namespace the namespaceSelector excludes are not sent to the webhook.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(fx.client.clone());
    let skipped = json!({"metadata": {"name": "skipped", "labels": {"skip": "yes"}}});
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(skipped).unwrap(),
        )
        .await
        .unwrap();
    let other: Api<Pod> = Api::namespaced(fx.client.clone(), "skipped");
    other
        .create(
            &PostParams::default(),
            &pod("free", None, &[]).ns("skipped"),
        )
        .await
        .unwrap();
    other
        .delete("free", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(fx.api.stats().admission_calls["deny.example.com"], 1);
}

#[tokio::test]
async fn failed_webhook_calls_follow_the_failure_policy() {
    let fx = AdmissionFixture::start().await;
    // A response without apiVersion/kind is a failed call: Ignore passes silently,
    // Fail rejects with the API server's wording.
    fx.register(
        "ValidatingWebhookConfiguration",
        "bad-ignore.example.com",
        fx.url("localhost", "/bad"),
        delete_rule(),
        "Ignore",
        5,
    )
    .await;
    fx.pods
        .delete("web-2", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(api_error(fx.pods.get("web-2").await.unwrap_err()).code, 404);
    fx.register(
        "ValidatingWebhookConfiguration",
        "bad-fail.example.com",
        fx.url("localhost", "/bad"),
        delete_rule(),
        "Fail",
        5,
    )
    .await;
    let failed = api_error(
        fx.pods
            .delete("web-1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (failed.code, failed.reason.as_str()),
        (500, "InternalError")
    );
    let expected = "failed calling webhook \"bad-fail.example.com\": expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got /, Kind=";
    assert!(failed.message.contains(expected), "{}", failed.message);
    delete_object(&fx.client, &format!("{VALIDATING}/bad-fail.example.com")).await;

    // A webhook slower than its timeout fails the call.
    fx.register(
        "ValidatingWebhookConfiguration",
        "slow.example.com",
        fx.url("localhost", "/slow"),
        delete_rule(),
        "Fail",
        1,
    )
    .await;
    let slow = api_error(
        fx.pods
            .delete("web-1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(slow.code, 500);
    assert!(slow.message.contains("deadline"), "{}", slow.message);
    assert!(
        fx.pods
            .get("web-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );

    let stats = fx.api.stats();
    // Four calls for three DELETEs: the grace-0 one validates in the update that sets
    // its deletionTimestamp and again in the storage delete, like upstream's store.
    assert_eq!(stats.admission_failures["bad-ignore.example.com"], 4);
    assert_eq!(stats.admission_failures["slow.example.com"], 1);
}

// ---------------------------------------------------------------------------------
// CRDs, defaults, events, leases

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject};

/// A cluster-scoped CRD shaped like real ones: a status subresource, a selectable
/// `spec.node`, and schema defaults for `spec.size` and the status's `phase`.
fn widget_crd() -> CustomResourceDefinition {
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "node": {"type": "string"},
            "size": {"type": "integer", "default": 1}}},
        "status": {"type": "object", "default": {}, "properties": {
            "phase": {"type": "string", "default": "Pending"}}}}});
    serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                      "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "selectableFields": [{"jsonPath": ".spec.node"}],
                "schema": {"openAPIV3Schema": schema}}]}}))
    .unwrap()
}

#[tokio::test]
async fn crds_serve_custom_resources_with_their_defaults_and_selectable_fields() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .unwrap();
    let crd = crds.get("widgets.example.com").await.unwrap();
    let conditions = crd.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );

    // Discovery lists the new group for kubectl and kube's dynamic APIs.
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("example.com"));

    let resource = ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let widget = |name: &str, node: &str| {
        DynamicObject::new(name, &resource).data(json!({"spec": {"node": node}}))
    };
    let mut first = widget("w1", "n1");
    first.data["status"] = json!({"phase": "Done"});
    let created = widgets
        .create(&PostParams::default(), &first)
        .await
        .unwrap();
    // The status a create sends is dropped; the schema's defaults fill in the rest.
    assert_eq!(created.data["status"], json!({"phase": "Pending"}));
    assert_eq!(created.data["spec"]["size"], 1);
    widgets
        .create(&PostParams::default(), &widget("w2", "n2"))
        .await
        .unwrap();
    let on_n1 = widgets
        .list(&ListParams::default().fields("spec.node=n1"))
        .await
        .unwrap();
    let names: Vec<_> = on_n1.items.iter().map(|w| w.name_any()).collect();
    assert_eq!(names, ["w1"]);
    // Only metadata.name, metadata.namespace and the declared fields are selectable.
    let by_name = widgets
        .list(&ListParams::default().fields("metadata.name=w2"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let undeclared = widgets
        .list(&ListParams::default().fields("spec.size=1"))
        .await
        .unwrap_err();
    assert_eq!(api_error(undeclared).code, 400);

    let done = widgets
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Done"}})),
        )
        .await
        .unwrap();
    assert_eq!(done.data["status"]["phase"], "Done");
    // Custom resources take merge patches but not strategic ones.
    let strategic = widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(strategic).code, 415);

    // Deleting the CRD stops serving its resources.
    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        api_error(widgets.list(&ListParams::default()).await.unwrap_err()).code,
        404
    );
}

#[tokio::test]
async fn defaults_apply_events_record_and_leases_guard_updates() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");

    // Workloads get the API server's defaults.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let template = json!({"metadata": {"labels": {"app": "web"}},
                          "spec": {"containers": [{"name": "app", "image": "web:1"}]}});
    let deploy: Deployment = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template}}))
    .unwrap();
    let deploy = deployments
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    let spec = deploy.spec.unwrap();
    assert_eq!(spec.replicas, Some(1));
    let rolling = spec.strategy.unwrap().rolling_update.unwrap();
    assert_eq!(
        rolling.max_surge,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("25%".into()))
    );
    assert_eq!(
        spec.template.spec.unwrap().termination_grace_period_seconds,
        Some(30)
    );

    // kube-runtime's event recorder creates events.k8s.io/v1 Events.
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "graceful-drain".into(),
            instance: None,
        },
    );
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some("web-1".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "Isolated".into(),
        note: Some("removed from endpoints".into()),
        action: "Isolate".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let recorded: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let items = recorded.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].reason.as_deref(), Some("Isolated"));
    // The same event through core/v1, the way `kubectl describe pod` looks it up.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let described = core
        .list(&ListParams::default().fields("involvedObject.name=web-1,involvedObject.kind=Pod"))
        .await
        .unwrap()
        .items;
    assert_eq!(described.len(), 1);
    assert_eq!(
        described[0].message.as_deref(),
        Some("removed from endpoints")
    );
    assert_eq!(
        described[0].reporting_component.as_deref(),
        Some("graceful-drain")
    );

    // Two leader candidates racing on one Lease: the stale writer gets 409.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    let lease = leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "leader"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut first = lease.clone();
    first.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("leader", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut second = lease;
    second.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let lost = api_error(
        leases
            .replace("leader", &PostParams::default(), &second)
            .await
            .unwrap_err(),
    );
    assert_eq!(lost.code, 409);
    assert_eq!(
        leases
            .get("leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn binding_assigns_a_pod_once_and_pod_specs_stay_immutable() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("system:kube-scheduler");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("p", None, &[]))
        .await
        .unwrap();
    let binding = |node: &str| {
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    };
    let path = "/api/v1/namespaces/default/pods/p/binding";
    let (code, _, _) = post_raw(&api, path, binding("n1")).await;
    assert_eq!(code, 201);
    assert_eq!(
        pods.get("p")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("n1")
    );
    let (code, _, body) = post_raw(&api, path, binding("n2")).await;
    assert_eq!(code, 409, "{body}");

    // Moving a pod by patching its spec is refused like upstream; images may change.
    let moved = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n2"}})),
        )
        .await
        .unwrap_err();
    let moved = api_error(moved);
    assert_eq!((moved.code, moved.reason.as_str()), (422, "Invalid"));
    let image = json!({"spec": {"containers": [{"name": "app", "image": "web:2"}]}});
    let patched = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(image))
        .await
        .unwrap();
    assert_eq!(
        patched.spec.unwrap().containers[0].image.as_deref(),
        Some("web:2")
    );
    let stats = api.stats();
    assert_eq!(stats.of_user("system:kube-scheduler", &[]), 4);
    assert_eq!(stats.count("create", "pods/binding"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_evictions_serialise_on_the_disruption_budget() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..6 {
        running_pod(&pods, &format!("web-{i}"), &[("app", "web")]).await;
    }
    pdb(&client, "web-pdb", "web", true, 2).await;
    let attempts = (0..6).map(|i| {
        let api = api.clone();
        async move {
            let name = format!("web-{i}");
            post_raw(&api, &evict_path(&name), eviction(&name, json!({})))
                .await
                .0
        }
    });
    let mut codes = futures::future::join_all(attempts).await;
    codes.sort_unstable();
    assert_eq!(codes, vec![201, 201, 429, 429, 429, 429]);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let status = pdbs.get("web-pdb").await.unwrap().status.unwrap();
    assert_eq!(status.disruptions_allowed, 0);
    assert_eq!(status.disrupted_pods.unwrap().len(), 2);
}

// ---------------------------------------------------------------------------------
// Admission plumbing: endpoints of service webhooks, matchConditions, denial codes,
// failed patches, namespace labels, SelfSubjectReview

use kube_sim::apiserver::{Route, RouteFrom};

/// Service `default/hooks` (port 443 named `https` → 8443) and one EndpointSlice with
/// the given (address, ready, terminating) endpoints, as the EndpointSlice controller
/// writes them (a terminating endpoint is not ready but still serving).
async fn hooks_service(client: &kube::Client, endpoints: &[(&str, bool, bool)]) {
    let service = json!({"metadata": {"name": "hooks"},
        "spec": {"selector": {"app": "hooks"},
                 "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}});
    post_object(client, "/api/v1/namespaces/default/services", &service).await;
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready, terminating)| {
            json!({"addresses": [ip], "conditions":
                {"ready": ready, "serving": *ready || *terminating, "terminating": terminating}})
        })
        .collect();
    let slice = json!({"metadata": {"name": "hooks-abcde",
            "labels": {"kubernetes.io/service-name": "hooks"}},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}]});
    post_object(
        client,
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
        &slice,
    )
    .await;
}

fn by_service(fx: &AdmissionFixture, path: &str) -> Value {
    json!({"service": {"namespace": "default", "name": "hooks", "path": path, "port": 443},
           "caBundle": fx.ca_bundle})
}

#[tokio::test]
async fn service_webhook_calls_go_to_endpoints_and_fail_without_any() {
    let fx = AdmissionFixture::start().await;
    post_object(
        &fx.client,
        "/api/v1/namespaces/default/services",
        &json!({"metadata": {"name": "hooks"},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}),
    )
    .await;
    let hook = by_service(&fx, "/deny");
    fx.register(
        "ValidatingWebhookConfiguration",
        "deny.example.com",
        hook,
        delete_rule(),
        "Fail",
        5,
    )
    .await;
    // No endpoint at all: the call fails and failurePolicy Fail refuses the request.
    let failed = api_error(
        fx.pods
            .delete("web-1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(failed.code, 500);
    assert!(
        failed
            .message
            .contains("no endpoints available for service \"hooks\""),
        "{}",
        failed.message
    );
    assert!(fx.reviews().is_empty());
}

#[tokio::test]
async fn a_terminating_webhook_replica_still_receives_calls_when_none_is_ready() {
    let fx = AdmissionFixture::start().await;
    // One replica terminating (routed to the test webhook), none ready.
    hooks_service(&fx.client, &[("10.0.0.7", false, true)]).await;
    fx.api.route(Route {
        from: RouteFrom::Endpoint("10.0.0.7:8443".parse().unwrap()),
        to: fx.hook_addr,
    });
    let hook = by_service(&fx, "/deny");
    fx.register(
        "ValidatingWebhookConfiguration",
        "deny.example.com",
        hook,
        delete_rule(),
        "Fail",
        5,
    )
    .await;
    let denied = api_error(
        fx.pods
            .delete("web-1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(denied.code, 429, "{}", denied.message);
    assert_eq!(fx.reviews().len(), 1);
}

#[tokio::test]
async fn match_conditions_skip_webhooks_and_errors_follow_the_failure_policy() {
    let fx = AdmissionFixture::start().await;
    let mut config = webhook_config(
        "ValidatingWebhookConfiguration",
        "deny.example.com",
        fx.url("localhost", "/deny"),
        delete_rule(),
        "Fail",
        5,
    );
    // The chart's exclusion of its own service account, plus a label test.
    config["webhooks"][0]["matchConditions"] = json!([
        {"name": "not-self", "expression": "request.userInfo.username != \"system:serviceaccount:gd:gd\""},
        {"name": "web-only", "expression": "has(oldObject.metadata.labels) && oldObject.metadata.labels.app == 'web'"},
    ]);
    post_object(&fx.client, VALIDATING, &config).await;
    let own: Api<Pod> = Api::namespaced(fx.api.client("system:serviceaccount:gd:gd"), "default");
    own.delete("web-1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(fx.reviews().is_empty(), "a false condition skips the call");
    let denied = api_error(
        fx.pods
            .delete("web-2", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(denied.code, 429);
    assert_eq!(fx.reviews().len(), 1);

    // `object` is null on DELETE: selecting a field of it is an evaluation error.
    let mut broken = webhook_config(
        "ValidatingWebhookConfiguration",
        "broken.example.com",
        fx.url("localhost", "/allow"),
        delete_rule(),
        "Fail",
        5,
    );
    broken["webhooks"][0]["matchConditions"] =
        json!([{"name": "bad", "expression": "object.metadata.name == 'web-2'"}]);
    post_object(&fx.client, VALIDATING, &broken).await;
    delete_object(&fx.client, &format!("{VALIDATING}/deny.example.com")).await;
    let failed = api_error(
        fx.pods
            .delete("web-2", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((failed.code, failed.reason.as_str()), (403, "Forbidden"));
    assert!(
        failed.message.contains("pods \"web-2\" is forbidden"),
        "{}",
        failed.message
    );
    // Under Ignore the same error skips the webhook.
    let patch = json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]);
    let request = http::Request::patch(format!("{VALIDATING}/broken.example.com"))
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&patch).unwrap())
        .unwrap();
    fx.client.request::<Value>(request).await.unwrap();
    fx.pods
        .delete("web-2", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(fx.reviews().len(), 1, "the broken webhook was never called");
}

#[tokio::test]
async fn webhook_denial_without_a_code_is_400_and_an_unappliable_patch_is_500_even_when_ignored() {
    let fx = AdmissionFixture::start().await;
    fx.register(
        "ValidatingWebhookConfiguration",
        "bare.example.com",
        fx.url("localhost", "/deny-bare"),
        delete_rule(),
        "Ignore",
        5,
    )
    .await;
    let denied = api_error(
        fx.pods
            .delete("web-1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(denied.code, 400);
    assert_eq!(
        denied.message,
        "admission webhook \"bare.example.com\" denied the request without explanation"
    );
    delete_object(&fx.client, &format!("{VALIDATING}/bare.example.com")).await;

    fx.register(
        "MutatingWebhookConfiguration",
        "patch.example.com",
        fx.url("localhost", "/bad-patch"),
        eviction_rule(),
        "Ignore",
        5,
    )
    .await;
    let (code, _, status) =
        post_raw(&fx.api, &evict_path("web-1"), eviction("web-1", json!({}))).await;
    assert_eq!(code, 500, "{status}");
    assert_eq!(status["reason"], "InternalError");
    assert!(
        fx.pods
            .get("web-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
}

#[tokio::test]
async fn namespaces_carry_their_name_label_on_create_and_update() {
    let (api, _shutdown) = server(Config::default()).await;
    let namespaces: Api<Namespace> = Api::all(api.client("admin"));
    let label = |ns: &Namespace| ns.metadata.labels.clone().unwrap_or_default();
    let default = namespaces.get("default").await.unwrap();
    assert_eq!(label(&default)["kubernetes.io/metadata.name"], "default");
    let created = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "team-a",
                "labels": {"kubernetes.io/metadata.name": "spoofed", "x": "1"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(label(&created)["kubernetes.io/metadata.name"], "team-a");
    assert_eq!(label(&created)["x"], "1");
    let patch = json!({"metadata": {"labels": {"kubernetes.io/metadata.name": null}}});
    let patched = namespaces
        .patch("team-a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(label(&patched)["kubernetes.io/metadata.name"], "team-a");
}

#[tokio::test]
async fn self_subject_review_returns_the_callers_user_info() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("system:serviceaccount:gd:gd");
    let request = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#.to_vec())
        .unwrap();
    let review: Value = client.request(request).await.unwrap();
    assert_eq!(review["kind"], "SelfSubjectReview");
    let user = &review["status"]["userInfo"];
    assert_eq!(user["username"], "system:serviceaccount:gd:gd");
    assert!(
        user["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:serviceaccounts:gd"))
    );
}

// ---------------------------------------------------------------------------------
// Upstream strictness: DELETE as the registry store does it

/// A pod bound to `n1` with this termination grace period (and phase).
async fn bound_pod(pods: &Api<Pod>, name: &str, grace: i64, phase: &str) -> Pod {
    let body = pod(name, Some("n1"), &[("app", name)]).grace_period(grace);
    let created = pods.create(&PostParams::default(), &body).await.unwrap();
    let status = json!({"status": {"phase": phase}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    created
}

/// The DELETE reviews the test webhook received for `name`.
fn delete_reviews(fx: &AdmissionFixture, name: &str) -> Vec<Value> {
    fx.reviews()
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| r["request"]["operation"] == "DELETE" && r["request"]["name"] == name)
        .collect()
}

#[tokio::test]
async fn delete_without_grace_uses_pod_termination_grace_like_check_graceful_delete() {
    let fx = AdmissionFixture::start().await;
    let allow = fx.url("127.0.0.1", "/allow");
    fx.register(
        "ValidatingWebhookConfiguration",
        "allow.example.com",
        allow,
        delete_rule(),
        "Fail",
        5,
    )
    .await;

    // No grace period: the pod's own, and the webhook sees the rewritten options.
    bound_pod(&fx.pods, "long", 45, "Running").await;
    fx.pods
        .delete("long", &DeleteParams::default())
        .await
        .unwrap();
    let long = fx.pods.get("long").await.unwrap();
    assert_eq!(long.metadata.deletion_grace_period_seconds, Some(45));
    assert_eq!(
        delete_reviews(&fx, "long")[0]["request"]["options"]["gracePeriodSeconds"],
        45
    );

    // A negative grace period counts as 1 second.
    bound_pod(&fx.pods, "negative", 45, "Running").await;
    let request = http::Request::delete("/api/v1/namespaces/default/pods/negative")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"gracePeriodSeconds": -5})).unwrap())
        .unwrap();
    fx.client.request::<Value>(request).await.unwrap();
    let negative = fx.pods.get("negative").await.unwrap();
    assert_eq!(negative.metadata.deletion_grace_period_seconds, Some(1));
    let reviews = delete_reviews(&fx, "negative");
    assert_eq!(
        reviews.last().unwrap()["request"]["options"]["gracePeriodSeconds"],
        1
    );

    // Unscheduled and finished pods go at once, whatever was asked.
    fx.pods
        .create(&PostParams::default(), &pod("unscheduled", None, &[]))
        .await
        .unwrap();
    fx.pods
        .delete("unscheduled", &DeleteParams::default().grace_period(20))
        .await
        .unwrap();
    assert_eq!(
        api_error(fx.pods.get("unscheduled").await.unwrap_err()).code,
        404
    );
    assert_eq!(
        delete_reviews(&fx, "unscheduled")[0]["request"]["options"]["gracePeriodSeconds"],
        0
    );
    bound_pod(&fx.pods, "done", 45, "Succeeded").await;
    fx.pods
        .delete("done", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(fx.pods.get("done").await.unwrap_err()).code, 404);
    assert_eq!(
        delete_reviews(&fx, "done")[0]["request"]["options"]["gracePeriodSeconds"],
        0
    );
}

#[tokio::test]
async fn delete_not_shortening_a_pending_grace_calls_no_webhook_like_before_delete() {
    let fx = AdmissionFixture::start().await;
    let allow = fx.url("127.0.0.1", "/allow");
    fx.register(
        "ValidatingWebhookConfiguration",
        "allow.example.com",
        allow,
        delete_rule(),
        "Fail",
        5,
    )
    .await;
    bound_pod(&fx.pods, "slow", 30, "Running").await;
    fx.pods
        .delete("slow", &DeleteParams::default().grace_period(20))
        .await
        .unwrap();
    let first = fx.pods.get("slow").await.unwrap();
    let calls = || fx.api.stats().admission_calls["allow.example.com"];
    assert_eq!(calls(), 1);

    // No grace period, or a longer or equal one: answered as is, no webhook.
    fx.pods
        .delete("slow", &DeleteParams::default())
        .await
        .unwrap();
    fx.pods
        .delete("slow", &DeleteParams::default().grace_period(25))
        .await
        .unwrap();
    fx.pods
        .delete("slow", &DeleteParams::default().grace_period(20))
        .await
        .unwrap();
    assert_eq!(calls(), 1);
    let same = fx.pods.get("slow").await.unwrap();
    assert_eq!(
        same.metadata.resource_version,
        first.metadata.resource_version
    );

    // A shorter one is a new graceful deletion: admitted, and the deadline moves closer.
    fx.pods
        .delete("slow", &DeleteParams::default().grace_period(5))
        .await
        .unwrap();
    assert_eq!(calls(), 2);
    let shorter = fx.pods.get("slow").await.unwrap();
    assert_eq!(shorter.metadata.deletion_grace_period_seconds, Some(5));
    let (before, after) = (
        first.metadata.deletion_timestamp.unwrap().0,
        shorter.metadata.deletion_timestamp.unwrap().0,
    );
    assert_eq!(before.duration_since(after).as_secs(), 15);
}

/// The next watch event that is not a bookmark.
async fn next_change<K: std::fmt::Debug>(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> WatchEvent<K> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return event;
        }
    }
}

#[tokio::test]
async fn grace_zero_pod_delete_is_seen_as_modified_then_deleted_like_the_registry_store() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = bound_pod(&pods, "quick", 30, "Running").await;
    let rv = created.metadata.resource_version.clone().unwrap();
    let stream = pods.watch(&WatchParams::default(), "0").await.unwrap();
    let mut stream = Box::pin(stream);
    // Drain the initial ADDED before deleting.
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap();
    pods.delete("quick", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match event {
            WatchEvent::Modified(p) if p.metadata.resource_version.as_deref() != Some(&rv) => {
                assert!(p.metadata.deletion_timestamp.is_some());
                assert_eq!(p.metadata.deletion_grace_period_seconds, Some(0));
                seen.push("MODIFIED");
            }
            WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => {}
            WatchEvent::Deleted(_) => seen.push("DELETED"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["MODIFIED", "DELETED"]);

    // An object without graceful deletion or finalizers is only DELETED.
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cm"}})).unwrap(),
    )
    .await
    .unwrap();
    let stream = maps.watch(&WatchParams::default(), "0").await.unwrap();
    let mut stream = Box::pin(stream);
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap();
    maps.delete("cm", &DeleteParams::default()).await.unwrap();
    let event = next_change(&mut stream).await;
    assert!(matches!(event, WatchEvent::Deleted(_)), "{event:?}");
}

#[tokio::test]
async fn pod_changed_during_the_delete_webhook_is_validated_again_like_guaranteed_update() {
    let fx = AdmissionFixture::start().await;
    let gate = fx.url("127.0.0.1", "/gate");
    fx.register(
        "ValidatingWebhookConfiguration",
        "gate.example.com",
        gate,
        delete_rule(),
        "Fail",
        10,
    )
    .await;
    bound_pod(&fx.pods, "moving", 30, "Running").await;
    let pods = fx.pods.clone();
    let deleting =
        tokio::spawn(async move { pods.delete("moving", &DeleteParams::default()).await });
    // While the webhook holds the first call, someone relabels the pod.
    tokio::time::timeout(Duration::from_secs(5), GATE_REACHED.notified())
        .await
        .unwrap();
    let relabel = json!({"metadata": {"labels": {"app": "moving", "isolated": "yes"}}});
    fx.pods
        .patch("moving", &PatchParams::default(), &Patch::Merge(relabel))
        .await
        .unwrap();
    GATE_OPEN.notify_one();
    tokio::time::timeout(Duration::from_secs(10), deleting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // The write during the call lost the race: the webhook saw the new pod too.
    let reviews = delete_reviews(&fx, "moving");
    assert_eq!(reviews.len(), 2);
    assert!(reviews[0]["request"]["oldObject"]["metadata"]["labels"]["isolated"].is_null());
    assert_eq!(
        reviews[1]["request"]["oldObject"]["metadata"]["labels"]["isolated"],
        "yes"
    );
    let moving = fx.pods.get("moving").await.unwrap();
    assert!(moving.metadata.deletion_timestamp.is_some());
    assert_eq!(moving.metadata.labels.unwrap()["isolated"], "yes");
}

#[tokio::test]
async fn request_deadline_bounds_the_webhook_timeout_and_answers_504_like_the_finisher() {
    let fx = AdmissionFixture::start().await;
    let slow = fx.url("127.0.0.1", "/slow");
    // Ignore: the slow call fails open, yet the request is past its deadline by then.
    fx.register(
        "ValidatingWebhookConfiguration",
        "slow.example.com",
        slow,
        delete_rule(),
        "Ignore",
        10,
    )
    .await;
    let request = http::Request::delete("/api/v1/namespaces/default/pods/web-1?timeout=2s")
        .body(Vec::new())
        .unwrap();
    let started = std::time::Instant::now();
    let err = api_error(fx.client.request::<Value>(request).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (504, "Timeout"));
    assert!(started.elapsed() < Duration::from_secs(5));
    // The webhook was told what remained of the request's 2 s, not its own 10 s.
    let (path, _) = fx.reviews().last().unwrap().clone();
    assert_eq!(path, "/slow?timeout=2s");
    // And nothing changed.
    let web = fx.pods.get("web-1").await.unwrap();
    assert!(web.metadata.deletion_timestamp.is_none());
}

// ---------------------------------------------------------------------------------
// Upstream strictness: eviction step by step

#[tokio::test]
async fn eviction_admission_runs_before_the_existence_check_like_the_create_handler() {
    let fx = AdmissionFixture::start().await;
    let allow = fx.url("127.0.0.1", "/allow");
    fx.register(
        "MutatingWebhookConfiguration",
        "evict.example.com",
        allow,
        eviction_rule(),
        "Fail",
        5,
    )
    .await;
    let (code, _, body) =
        post_raw(&fx.api, &evict_path("ghost"), eviction("ghost", json!({}))).await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(fx.api.stats().admission_calls["evict.example.com"], 1);
    // The Eviction must name the pod of the URL.
    let (code, _, body) =
        post_raw(&fx.api, &evict_path("web-1"), eviction("web-2", json!({}))).await;
    assert_eq!(code, 400);
    assert_eq!(
        body["message"],
        "name in URL does not match name in Eviction object"
    );
}

#[tokio::test]
async fn eviction_refusals_carry_the_upstream_status_bodies() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    running_pod(&pods, "web-1", &[("app", "web")]).await;
    running_pod(&pods, "new-1", &[("app", "new")]).await;
    pdb(&client, "web-pdb", "web", true, 0).await;
    pdb(&client, "new-pdb", "new", false, 1).await;

    // No disruption left: 429, the upstream message and cause, no Retry-After at all.
    let (code, retry, body) =
        post_raw(&api, &evict_path("web-1"), eviction("web-1", json!({}))).await;
    assert_eq!((code, retry), (429, None));
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(
        body["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(
        body["details"],
        json!({"causes": [{"reason": "DisruptionBudget",
            "message": "The disruption budget web-pdb needs 1 healthy pods and has 2 currently"}]})
    );

    // Not observed yet: 429 with Retry-After 10 in the header and the body.
    let (code, retry, body) =
        post_raw(&api, &evict_path("new-1"), eviction("new-1", json!({}))).await;
    assert_eq!((code, retry.as_deref()), (429, Some("10")));
    assert_eq!(
        body["details"],
        json!({"retryAfterSeconds": 10, "causes": [{"reason": "DisruptionBudget",
            "message": "The disruption budget new-pdb is still being processed by the server."}]})
    );

    // Two budgets: the Status upstream returns as a result, code 500 and no reason.
    pdb(&client, "web-pdb-2", "web", true, 5).await;
    let (code, _, body) = post_raw(&api, &evict_path("web-1"), eviction("web-1", json!({}))).await;
    assert_eq!(code, 500);
    assert_eq!(body["status"], "Failure");
    assert!(body.get("reason").is_none(), "{body}");
    assert_eq!(
        body["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
}

#[tokio::test]
async fn unhealthy_pod_eviction_policy_always_allow_evicts_unready_pods_for_free() {
    let (api, _shutdown) = server(Config::default()).await;
    let client = api.client("admin");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    running_pod(&pods, "sick", &[("app", "web")]).await;
    let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    pods.patch_status("sick", &PatchParams::default(), &Patch::Merge(unready))
        .await
        .unwrap();
    pdb(&client, "web-pdb", "web", true, 0).await;
    // The budget is not met (1 healthy of 2 desired): IfHealthyBudget keeps the pod.
    let short = json!({"status": {"currentHealthy": 1, "desiredHealthy": 2}});
    pdbs.patch_status("web-pdb", &PatchParams::default(), &Patch::Merge(short))
        .await
        .unwrap();
    let (code, _, _) = post_raw(&api, &evict_path("sick"), eviction("sick", json!({}))).await;
    assert_eq!(code, 429);
    // AlwaysAllow: evicted without spending a disruption.
    let policy = json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}});
    pdbs.patch("web-pdb", &PatchParams::default(), &Patch::Merge(policy))
        .await
        .unwrap();
    let observed = json!({"status": {"observedGeneration": 2}});
    pdbs.patch_status("web-pdb", &PatchParams::default(), &Patch::Merge(observed))
        .await
        .unwrap();
    let (code, _, _) = post_raw(&api, &evict_path("sick"), eviction("sick", json!({}))).await;
    assert_eq!(code, 201);
    assert!(
        pods.get("sick")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    let status = pdbs.get("web-pdb").await.unwrap().status.unwrap();
    assert_eq!(status.disruptions_allowed, 0);
    assert!(status.disrupted_pods.is_none_or(|d| d.is_empty()));

    // A pending pod skips the budget altogether.
    pods.create(
        &PostParams::default(),
        &pod("waiting", Some("n1"), &[("app", "web")]),
    )
    .await
    .unwrap();
    let (code, _, _) = post_raw(&api, &evict_path("waiting"), eviction("waiting", json!({}))).await;
    assert_eq!(code, 201);
}

// ---------------------------------------------------------------------------------
// Fault injection

#[tokio::test]
async fn throttled_requests_get_429_with_retry_after_like_priority_and_fairness() {
    let config = Config {
        faults: kube_sim::apiserver::Faults {
            throttle_share: 1.0,
            throttle_retry_after: 3,
            ..Default::default()
        },
        ..Config::default()
    };
    let (api, _shutdown) = server(config).await;
    let (code, retry, body) = {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let request = http::Request::get(format!("{}/api/v1/namespaces/default/pods", api.url()))
            .header("authorization", "Bearer system:serviceaccount:default:app")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let code = response.status().as_u16();
        let retry = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        (
            code,
            retry,
            serde_json::from_slice::<Value>(&bytes).unwrap(),
        )
    };
    assert_eq!((code, retry.as_deref()), (429, Some("3")));
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["details"]["retryAfterSeconds"], 3);
    // Cluster admins fall under the exempt priority level.
    let admin: Api<Pod> = Api::namespaced(api.client("admin"), "default");
    admin.list(&ListParams::default()).await.unwrap();
    let app: Api<Pod> = Api::namespaced(api.client("system:serviceaccount:default:app"), "default");
    assert_eq!(
        api_error(app.list(&ListParams::default()).await.unwrap_err()).code,
        429
    );
}

#[tokio::test]
async fn simulated_controllers_clients_retry_throttled_requests_like_client_go() {
    // Every other request of a service account is refused; the simulator's controllers
    // and kubelets retry after Retry-After, as client-go does.
    let config = Config {
        faults: kube_sim::apiserver::Faults {
            throttle_share: 0.5,
            throttle_retry_after: 1,
            seed: 3,
            ..Default::default()
        },
        ..Config::default()
    };
    let (api, _shutdown) = server(config).await;
    let user = "system:serviceaccount:kube-system:replicaset-controller";
    let retrying: Api<Pod> = Api::namespaced(api.retrying_client(user), "default");
    for _ in 0..4 {
        retrying.list(&ListParams::default()).await.unwrap();
    }
    assert_eq!(api.stats().count("list", "pods"), 4);
    assert!(api.stats().throttled > 0, "none was refused");
    // A plain client sees the refusals.
    let plain: Api<Pod> = Api::namespaced(api.client(user), "default");
    let mut refused = 0;
    for _ in 0..8 {
        if let Err(e) = plain.list(&ListParams::default()).await {
            assert_eq!(api_error(e).code, 429);
            refused += 1;
        }
    }
    assert!(refused > 0);
}

#[tokio::test]
async fn added_latency_delays_every_request() {
    let config = Config {
        faults: kube_sim::apiserver::Faults {
            latency: Duration::from_millis(150),
            ..Default::default()
        },
        ..Config::default()
    };
    let (api, _shutdown) = server(config).await;
    let pods: Api<Pod> = Api::namespaced(api.client("admin"), "default");
    let started = std::time::Instant::now();
    pods.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn watches_cut_with_410_gone_force_a_relist() {
    let config = Config {
        faults: kube_sim::apiserver::Faults {
            watch_gone_after: Some(Duration::from_millis(200)),
            seed: 1,
            ..Default::default()
        },
        ..Config::default()
    };
    let (api, _shutdown) = server(config).await;
    let pods: Api<Pod> = Api::namespaced(api.client("admin"), "default");
    pods.create(&PostParams::default(), &pod("w", None, &[]))
        .await
        .unwrap();
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let stream = pods.watch(&WatchParams::default(), &rv).await.unwrap();
    let mut stream = Box::pin(stream);
    match next_change(&mut stream).await {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }

    // kube-runtime's watcher relists after it: a second initial listing arrives.
    use kube::runtime::watcher::{self, Event};
    let events = watcher::watcher(pods.clone(), watcher::Config::default());
    let mut events = Box::pin(events);
    let mut inits = 0;
    while inits < 2 {
        let next = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .unwrap();
        if let Some(Ok(Event::InitDone)) = next {
            inits += 1;
        }
    }
}
