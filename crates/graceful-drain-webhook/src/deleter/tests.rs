use super::*;
use crate::metrics::Metrics;
use http::{Method, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn meta(name: &str, uid: &str, delete_at: &str, ours: bool) -> Value {
    let mut annotations = json!({ DELETE_AT_ANNOTATION: delete_at, GRACE_PERIOD_ANNOTATION: "17" });
    if ours {
        annotations[ORIGINAL_LABELS_ANNOTATION] = json!("{\"app\":\"web\"}");
    }
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": {"name": name, "namespace": "web", "uid": uid, "resourceVersion": "3",
                        "labels": {DRAINING_LABEL: "true"}, "annotations": annotations}})
}

#[test]
fn pending_is_read_only_from_pods_we_isolated() {
    let ours: ObjectMeta =
        serde_json::from_value(meta("a", "u-a", "2026-01-01T00:00:00Z", true)["metadata"].clone())
            .unwrap();
    let pending = pending_from(&ours).unwrap();
    assert_eq!(pending.grace_period, Some(17));
    assert_eq!(pending.delete_at, at("2026-01-01T00:00:00Z"));
    let foreign: ObjectMeta =
        serde_json::from_value(meta("b", "u-b", "2026-01-01T00:00:00Z", false)["metadata"].clone())
            .unwrap();
    assert_eq!(
        pending_from(&foreign),
        None,
        "a draining label alone is not ours"
    );
    let garbled: ObjectMeta =
        serde_json::from_value(meta("c", "u-c", "tomorrow", true)["metadata"].clone()).unwrap();
    assert_eq!(pending_from(&garbled), None);
}

/// Pod `web/a`, isolated by us, due for deletion at `delete_at`.
fn pending(delete_at: &str) -> Pending {
    Pending {
        namespace: "web".into(),
        name: "a".into(),
        uid: "u".into(),
        delete_at: at(delete_at),
        grace_period: None,
        terminating: false,
        controller: None,
        restore_at: None,
        labels: Default::default(),
        delay: None,
        released_at: None,
    }
}

#[test]
fn a_pod_is_due_at_its_time_once_no_endpointslice_lists_it() {
    let pod = pending("2026-01-01T00:01:00Z");
    let before = at("2026-01-01T00:00:59Z");
    let after = at("2026-01-01T00:01:01Z");
    let left = Some(at("2026-01-01T00:00:01Z"));
    let zero = Duration::ZERO;
    assert!(!is_due(&pod, before, zero, false, left));
    assert!(is_due(&pod, after, zero, false, left));
    assert!(is_due(&pod, after, zero, false, None), "never seen listed");
    let callers = Pending {
        restore_at: Some(at("2026-01-01T00:02:00Z")),
        ..pod.clone()
    };
    assert!(
        !is_due(&callers, after, zero, false, left),
        "a pod its caller removes is never deleted by the deleter"
    );
    assert!(!is_due(&pod, after, zero, true, None), "still in a slice");
    let margin = Duration::from_secs(5);
    assert!(
        !is_due(&pod, after, margin, false, Some(at("2026-01-01T00:00:58Z"))),
        "margin not over"
    );
    assert!(is_due(
        &pod,
        after,
        margin,
        false,
        Some(at("2026-01-01T00:00:50Z"))
    ));
    assert!(
        is_due(&pod, at("2026-01-01T00:11:00Z"), zero, true, None),
        "gives up ten minutes past its delete time"
    );
    let terminating = Pending {
        terminating: true,
        ..pod
    };
    assert!(!is_due(&terminating, after, zero, false, left));
}

/// A refused removal (a throttled request, a dropped connection) is tried again after
/// a second, then less and less often up to every 10 s; an accepted one is not
/// repeated for 10 s, while the watch brings the pod's deletion.
#[tokio::test(start_paused = true)]
async fn a_refused_removal_is_retried_within_a_second_then_less_often() {
    let mut pauses = Vec::new();
    for failures in [1, 2, 3, 4, 5, 30, 0] {
        let attempt = Attempt {
            at: tokio::time::Instant::now(),
            failures,
        };
        let mut waited = 0;
        while !attempt.elapsed() {
            tokio::time::advance(Duration::from_millis(100)).await;
            waited += 100;
        }
        pauses.push(waited);
    }
    assert_eq!(pauses, [1000, 2000, 4000, 8000, 10000, 10000, 10000]);
}

/// The context of replica `w`, its Events sent inline.
fn context(client: kube::Client, cache: Arc<Cache>) -> isolate::Context {
    isolate::Context {
        client,
        cache,
        identity: "w".into(),
        events: isolate::EventSink::Inline,
        keep_labels: Default::default(),
        restore_after: isolate::RESTORE_AFTER,
        gates: Default::default(),
        owners: Default::default(),
        nodes: Default::default(),
    }
}

/// The deleter counts a pod's deregistration delay from its leaving the last slice, as
/// admission does: the real tier's `apiserver-restart-drain` saw a pod isolated at :50.97
/// with a 5 s delay leave its slice only at :52.9 (the EndpointSlice controller was
/// relisting after the restart) and die at :55, before its load balancer let go.
#[tokio::test]
async fn the_deleter_counts_the_delay_from_the_pods_leaving_its_slices() {
    let (client, _api) = graceful_drain_testing::fixtures::mock::client();
    let mut registry = prometheus_client::registry::Registry::default();
    let cache = Arc::new(Cache::default());
    cache.apply_namespace(
        &serde_json::from_value(serde_json::json!({"name": "slow",
            "annotations": {DELAY_ANNOTATION: "20s"}}))
        .unwrap(),
    );
    let ctx = context(client, cache);
    let metrics = Arc::new(Metrics::new(&mut registry));
    let deleter = Deleter::new(ctx, metrics, None)
        .counting_delays(Duration::from_secs(5), Duration::from_secs(60));
    let pod = pending("2026-01-01T00:00:55Z");
    let secs = Duration::from_secs;
    assert_eq!(deleter.delay_of(&pod), secs(5), "the default");
    let asks = Pending {
        delay: Some("8s".into()),
        ..pod.clone()
    };
    assert_eq!(deleter.delay_of(&asks), secs(8), "the pod's annotation");
    let greedy = Pending {
        delay: Some("1h".into()),
        ..pod.clone()
    };
    assert_eq!(deleter.delay_of(&greedy), secs(60), "at most the longest");
    let slow = Pending {
        namespace: "slow".into(),
        ..pod.clone()
    };
    assert_eq!(
        deleter.delay_of(&slow),
        secs(20),
        "the namespace's annotation"
    );
    let left = Some(at("2026-01-01T00:00:52.9Z"));
    let wait = deleter.delay_of(&pod) + deleter.margin;
    assert!(
        !is_due(&pod, at("2026-01-01T00:00:55Z"), wait, false, left),
        "its delete time, but it left its slice 2.1 s before"
    );
    assert!(is_due(&pod, at("2026-01-01T00:00:58Z"), wait, false, left));
}

/// A restarted replica lists isolated pods and deletes the due one, with its UID
/// precondition and the recorded grace period, leaving future and foreign pods alone.
#[tokio::test]
async fn resumes_pending_deletions_after_restart() {
    let (client, mut api) = graceful_drain_testing::fixtures::mock::client();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let cache = Arc::new(Cache::default());
    let ctx = context(client, cache.clone());
    let deleter = Deleter::new(ctx, metrics.clone(), None);
    let (_leader_tx, leader_rx) = watch::channel(true);
    let shutdown = Shutdown::new();
    let task = tokio::spawn(deleter.run(leader_rx, shutdown.clone()));

    let mut held_watch = None;
    let mut deleted = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while deleted.is_empty() {
        let next = tokio::time::timeout_at(deadline, api.next_request())
            .await
            .expect("no delete within 20 s");
        let (req, send) = next.expect("client gone");
        let (parts, body) = req.into_parts();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let body: Value = serde_json::from_slice(&body.collect().await.unwrap().to_bytes())
            .unwrap_or(Value::Null);
        let reply = |v: Value, code: u16| {
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&v).unwrap()))
                .unwrap()
        };
        match (parts.method.clone(), parts.uri.path()) {
            (Method::GET, "/api/v1/pods") if query.contains("watch=true") => {
                assert!(
                    query.contains("labelSelector=graceful-drain.io%2Fdraining"),
                    "{query}"
                );
                held_watch = Some(send);
            }
            (Method::GET, "/api/v1/pods") => {
                assert!(
                    query.contains("labelSelector=graceful-drain.io%2Fdraining"),
                    "{query}"
                );
                send.send_response(reply(
                    json!({
                    "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                    "metadata": {"resourceVersion": "10"},
                    "items": [
                        meta("due", "u-due", "2020-01-01T00:00:00Z", true),
                        meta("later", "u-later", "2999-01-01T00:00:00Z", true),
                        meta("foreign", "u-foreign", "2020-01-01T00:00:00Z", false),
                    ]}),
                    200,
                ));
            }
            (Method::POST, path) if path.ends_with("/eviction") => {
                deleted.push((path.to_string(), body.clone()));
                send.send_response(reply(
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}),
                    201,
                ));
            }
            (method, path) => panic!("unexpected {method} {path}"),
        }
    }
    let events = tokio::time::timeout(Duration::from_secs(5), api.next_request())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(events.0.uri().path(), "/api/v1/namespaces/web/events");
    events.1.send_response(
        Response::builder()
            .status(201)
            .body(Body::from(b"{}".to_vec()))
            .unwrap(),
    );
    // The first tick may delete the due pod before the rest of the list is applied.
    let listed = async {
        while !cache.isolated_synced() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), listed)
        .await
        .expect("the list of isolated pods is applied");
    shutdown.cancel();
    task.await.unwrap().unwrap();
    drop(held_watch);

    assert_eq!(deleted.len(), 1, "{deleted:?}");
    let (path, options) = &deleted[0];
    assert_eq!(path, "/api/v1/namespaces/web/pods/due/eviction");
    assert_eq!(options["apiVersion"], "policy/v1");
    assert_eq!(options["kind"], "Eviction");
    assert_eq!(options["deleteOptions"]["preconditions"]["uid"], "u-due");
    assert_eq!(options["deleteOptions"]["gracePeriodSeconds"], 17);
    assert_eq!(metrics.pods_deleted.get(), 1);
    assert_eq!(
        cache.isolated("web", "later"),
        Some(at("2999-01-01T00:00:00Z"))
    );
    assert_eq!(cache.isolated("web", "foreign"), None);
}

/// The deleter is nobody's deputy where the webhook never isolates: a pod carrying an
/// isolation record in an excluded namespace (kube-system here) is never pending, so it is
/// neither deleted nor restored; the same record elsewhere is.
#[tokio::test]
async fn an_isolation_record_in_an_excluded_namespace_is_left_alone() {
    let (client, _api) = graceful_drain_testing::fixtures::mock::client();
    let mut registry = prometheus_client::registry::Registry::default();
    let cache = Arc::new(Cache::new(["kube-system".to_string()]));
    let mut deleter = Deleter::new(
        context(client, cache),
        Arc::new(Metrics::new(&mut registry)),
        None,
    );
    let record = |namespace: &str, uid: &str| -> ObjectMeta {
        let mut value = meta("a", uid, "2026-01-01T00:00:00Z", true)["metadata"].clone();
        value["namespace"] = json!(namespace);
        serde_json::from_value(value).unwrap()
    };
    deleter.apply(&record("kube-system", "u-system"));
    deleter.apply(&record("kube-system", "u-system"));
    deleter.apply(&record("web", "u-web"));
    let due: Vec<String> = deleter
        .due(at("2026-01-01T00:01:00Z"))
        .into_iter()
        .map(|p| p.uid)
        .collect();
    assert_eq!(due, ["u-web"]);
    assert_eq!(deleter.foreign.len(), 1, "reported once");
}
