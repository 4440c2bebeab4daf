//! Router-level tests of the admission answers over the scripted mock API: evictions,
//! DELETEs, holds, live PDB reads, preconditions, permanent failures and deadlines.

mod basics {
    use super::super::evict::retry_after_until;
    use super::super::*;
    use crate::decide;
    use crate::decide::Settings;
    use crate::isolate;
    use crate::metrics::Metrics;
    use graceful_drain_core::labels::webhook_reason;
    use graceful_drain_core::labels::{
        DELETE_AT_ANNOTATION, DEREGISTERING_CAUSE, DRAINING_LABEL, GRACE_PERIOD_ANNOTATION,
        ORIGINAL_LABELS_ANNOTATION, RESTORE_AT_ANNOTATION,
    };
    use graceful_drain_core::runtime::Shutdown;
    use jiff::Timestamp;

    #[test]
    fn holds_end_before_the_api_server_gives_up() {
        let start = Instant::now();
        assert_eq!(
            hold_deadline(start, Duration::from_secs(10)),
            start + Duration::from_secs(8)
        );
        assert_eq!(
            hold_deadline(start, Duration::from_secs(1)),
            start + Duration::from_millis(500)
        );
    }

    use crate::cache::Cache;
    use crate::isolate::scenarios::Scenario::*;
    use graceful_drain_testing::fixtures::mock;
    use http::Method;
    use http_body_util::BodyExt;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    pub(super) fn state(client: kube::Client) -> Arc<AppState> {
        let cache = Arc::new(Cache::new([]));
        cache.apply_slice(&serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "web-x1", "namespace": "web", "labels": {"kubernetes.io/service-name": "web"}},
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "web", "uid": "uid-1"}},
                          // Three more ready pods: web-1 is never the Service's last endpoint,
                          // and one unconfirmed isolation of the four is within the share.
                          {"addresses": ["10.0.0.11"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-a", "namespace": "web", "uid": "uid-a"}},
                          {"addresses": ["10.0.0.12"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-b", "namespace": "web", "uid": "uid-b"}},
                          {"addresses": ["10.0.0.13"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-c", "namespace": "web", "uid": "uid-c"}}]
        })).unwrap());
        cache.apply_service(&serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "web"},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"}}
        })).unwrap());
        let mut registry = prometheus_client::registry::Registry::default();
        Arc::new(AppState {
            ctx: isolate::Context {
                client,
                cache,
                identity: "w".into(),
                events: isolate::EventSink::Inline,
                keep_labels: Default::default(),
                restore_after: isolate::RESTORE_AFTER,
                gates: Default::default(),
                owners: Default::default(),
                nodes: Default::default(),
            },
            settings: Settings {
                default_delay: Duration::from_secs(30),
                max_delay: Duration::from_secs(600),
                exposure: decide::Exposure::EndpointSlice,
                own_users: Default::default(),
            },
            metrics: Arc::new(Metrics::new(&mut registry)),
            default_timeout: Duration::from_secs(10),
            shutdown: Shutdown::new(),
            holds: Holds::default(),
            watch_drained_nodes: false,
            unconfirmed: Default::default(),
            scale_downs: Default::default(),
            controllers: Default::default(),
            throttles: Default::default(),
            reviews_authenticated: false,
        })
    }

    fn eviction_body(pod: &str) -> Vec<u8> {
        eviction_body_in("web", pod)
    }

    fn eviction_body_in(namespace: &str, pod: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "ev-1",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction", "name": pod, "namespace": namespace, "operation": "CREATE",
                "userInfo": {"username": "system:node:n1"},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": pod, "namespace": namespace},
                           "deleteOptions": {"gracePeriodSeconds": 15}}}
        }))
        .unwrap()
    }

    pub(super) async fn call(state: Arc<AppState>, uri: &str, body: Vec<u8>) -> (u16, Value) {
        let req = http::Request::post(uri)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let resp = router(state, 1 << 20).oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// The first eviction of an exposed pod isolates it and is refused with a 429 whose
    /// Retry-After is the pod's delete time: the pod stays alive, and the caller's retry
    /// once the pod is due evicts it for real. Nothing is deleted on the review's word.
    #[tokio::test]
    async fn eviction_of_an_exposed_pod_isolates_it_and_asks_the_caller_to_come_back_when_due() {
        let (client, mut api) = mock::client();
        let st = state(client);
        let metrics_state = st.clone();
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction_body("web-1"),
        ));
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "web", "uid": "uid-1", "resourceVersion": "12",
                         "labels": {"app": "web", "pod-template-hash": "h"}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        let [_read, patch, _event] =
            mock::play(&mut api, [PodIs(pod), Relabeled("web-1"), EventPosted])
                .await
                .try_into()
                .unwrap();
        assert_eq!(patch.body[1]["path"], "/metadata/labels");
        assert_eq!(
            patch.body[2],
            json!({"op": "remove", "path": "/metadata/labels/app"})
        );
        let annotations = &patch.body[4]["value"];
        // The review's gracePeriodSeconds (15) is a forger's to choose: without
        // authenticated reviews the pod is removed with its own.
        assert!(
            annotations.get(GRACE_PERIOD_ANNOTATION).is_none(),
            "{}",
            patch.body
        );
        let delete_at: Timestamp = annotations[DELETE_AT_ANNOTATION]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let delay = Timestamp::now().duration_until(delete_at).as_secs_f64();
        assert!(
            (28.0..=31.0).contains(&delay),
            "deletion scheduled {delay}s ahead"
        );
        let restore_at: Timestamp = annotations[RESTORE_AT_ANNOTATION]
            .as_str()
            .expect("the pod goes back if no retried eviction removes it")
            .parse()
            .unwrap();
        assert_eq!(
            delete_at.duration_until(restore_at).as_secs(),
            60,
            "restored a minute after its delete time"
        );
        let (status, review) = call.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        let response = &review["response"];
        assert_eq!(response["uid"], "ev-1");
        assert_eq!(response["allowed"], false);
        assert!(response.get("patch").is_none(), "no dry run any more");
        let refusal = &response["status"];
        assert_eq!(refusal["code"], 429);
        assert_eq!(refusal["reason"], "TooManyRequests");
        let retry = refusal["details"]["retryAfterSeconds"].as_u64().unwrap();
        // Whole seconds rounded down: the caller comes back under a second early, and
        // that eviction is held until due.
        assert!((29..=30).contains(&retry), "Retry-After {retry} s");
        assert_eq!(
            refusal["details"]["causes"][0]["reason"],
            DEREGISTERING_CAUSE
        );
        let message = refusal["message"].as_str().unwrap();
        assert!(
            message.contains("web/web-1") && message.contains("evict it again"),
            "{message}"
        );
        assert_eq!(metrics_state.metrics.pods_isolated.get(), 1);
    }

    /// With authenticated reviews (`--client-ca`) an eviction confirms its isolation: the
    /// deleter removes the pod at its delete time (no restore time). The descheduler's
    /// eviction of a pod annotated for evictions in the background is then answered at once
    /// with a 429 saying "Eviction triggered evacuation" and no Retry-After, so it goes on
    /// to its next pod; an unannotated pod's eviction gets the usual Retry-After.
    #[tokio::test]
    async fn the_deschedulers_eviction_in_the_background_is_answered_at_once_when_the_deleter_removes_the_pod()
     {
        use graceful_drain_core::labels::DESCHEDULER_EVICT_IN_BACKGROUND_ANNOTATION as EVICT_IN_BACKGROUND_ANNOTATION;
        for annotated in [true, false] {
            let (client, mut api) = mock::client();
            let mut st = state(client);
            Arc::get_mut(&mut st).unwrap().reviews_authenticated = true;
            let mut body: Value = serde_json::from_slice(&eviction_body("web-1")).unwrap();
            body["request"]["object"]["metadata"]["annotations"] =
                json!({"requested-by": "sigs.k8s.io/descheduler"});
            let call = tokio::spawn(call(
                st,
                "/mutate/eviction?timeout=10s",
                serde_json::to_vec(&body).unwrap(),
            ));
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web-1", "namespace": "web", "uid": "uid-1", "resourceVersion": "12",
                             "labels": {"app": "web", "pod-template-hash": "h"}},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
            if annotated {
                pod["metadata"]["annotations"] = json!({EVICT_IN_BACKGROUND_ANNOTATION: ""});
            }
            let [_read, patch, _event] = mock::play(
                &mut api,
                [PodIs(pod.clone()), Relabeled("web-1"), EventPosted],
            )
            .await
            .try_into()
            .unwrap();
            assert!(
                !patch.body.to_string().contains(RESTORE_AT_ANNOTATION),
                "the deleter removes it, nothing restores it: {}",
                patch.body
            );
            // The API server vouches for the review: the caller's grace period stands.
            let grace = patch.body.as_array().unwrap().iter().find_map(|op| {
                let path = op["path"].as_str()?;
                if path.ends_with("grace-period-seconds") {
                    Some(op["value"].clone())
                } else if path == "/metadata/annotations" {
                    Some(op["value"][GRACE_PERIOD_ANNOTATION].clone())
                } else {
                    None
                }
            });
            assert_eq!(grace, Some(json!("15")), "{}", patch.body);
            // The descheduler's eviction reads the pod as isolated.
            let mut isolated = pod.clone();
            isolated["metadata"]["labels"] = json!({DRAINING_LABEL: "web"});
            let annotations = &mut isolated["metadata"]["annotations"];
            annotations[DELETE_AT_ANNOTATION] = json!("2999-01-01T00:00:00Z");
            annotations[ORIGINAL_LABELS_ANNOTATION] = json!("{\"app\":\"web\"}");
            mock::play(&mut api, [PodIs(isolated)]).await;
            let (_, review) = call.await.unwrap();
            let refusal = &review["response"]["status"];
            assert_eq!(refusal["code"], 429, "{review}");
            let message = refusal["message"].as_str().unwrap();
            let retry = refusal["details"]["retryAfterSeconds"]
                .as_u64()
                .unwrap_or(0);
            if annotated {
                assert!(
                    message.contains("Eviction triggered evacuation"),
                    "{message}"
                );
                assert_eq!(retry, 0, "no Retry-After: client-go must not retry it");
            } else {
                assert!(message.contains("evict it again"), "{message}");
                assert!((29..=30).contains(&retry), "Retry-After {retry} s");
            }
        }
    }

    /// A deregistering pod's Retry-After is the time left until its delete time in whole
    /// seconds rounded down (the caller comes back less than a second early, and the
    /// eviction is held the rest), between 1 s and a minute.
    #[test]
    fn retry_after_until_rounds_down_and_stays_within_a_minute() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |millis: i64| now + jiff::SignedDuration::from_millis(millis);
        assert_eq!(retry_after_until(at(200), now), 1);
        assert_eq!(retry_after_until(at(1_999), now), 1);
        assert_eq!(retry_after_until(at(2_000), now), 2);
        assert_eq!(retry_after_until(at(5_950), now), 5);
        assert_eq!(retry_after_until(at(60_999), now), 60);
        assert_eq!(retry_after_until(at(600_000), now), 60, "at most a minute");
        assert_eq!(retry_after_until(now, now), 1, "never 0: no busy retry");
        assert_eq!(retry_after_until(at(-5_000), now), 1, "already due");
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_that_cannot_be_isolated_is_refused_with_429_not_let_through() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction_body("web-1"),
        ));
        let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
            "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
        // Every read of the pod fails until the webhook gives up and says why on the pod.
        let mut reads = 0;
        let event = loop {
            let seen = mock::answer(&mut api, |seen| match seen.method {
                Method::GET => (500, status.clone()),
                _ => (201, json!({})),
            })
            .await;
            match (seen.method.clone(), seen.path.as_str()) {
                (Method::GET, "/api/v1/namespaces/web/pods/web-1") => reads += 1,
                (Method::POST, "/api/v1/namespaces/web/events") => break seen,
                _ => panic!("unexpected request {seen:?}"),
            }
        };
        assert!(reads >= 1);
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], webhook_reason::ISOLATION_DEFERRED);
        assert_eq!(event.body["involvedObject"]["name"], "web-1");
        let (http_status, review) = call.await.unwrap();
        assert_eq!(http_status, 200);
        assert_eq!(review["response"]["uid"], "ev-1");
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("web/web-1"), "{message}");
        assert!(review["response"].get("patch").is_none());
    }

    #[tokio::test]
    async fn eviction_of_a_pod_in_no_slice_and_no_service_needs_no_api_call() {
        let (client, _api) = mock::client();
        let (status, review) = call(
            state(client),
            "/mutate/eviction",
            eviction_body_in("batch", "batch-7"),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
    }

    /// The EndpointSlice controller lists a pod some time after it turns ready (seconds
    /// after a kube-apiserver restart). A ready pod its load-balanced Service selects is
    /// isolated in that time too, or the slice would list it ready while it terminates.
    #[tokio::test]
    async fn eviction_of_a_ready_pod_its_service_selects_isolates_it_before_any_slice_lists_it() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction_body("web-2"),
        ));
        let pod = |labels: Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-2", "namespace": "web", "uid": "uid-2", "resourceVersion": "7",
                         "labels": labels},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
        };
        let scenarios = [
            PodIs(pod(json!({"app": "web"}))),
            Relabeled("web-2"),
            EventPosted,
        ];
        let [_read, patch, _event] = mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert!(
            patch
                .body
                .as_array()
                .unwrap()
                .contains(&json!({"op": "remove", "path": "/metadata/labels/app"})),
            "it leaves the Service: {}",
            patch.body
        );
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);

        // A pod of that namespace the Service does not select goes at once.
        let (client, mut api) = mock::client();
        let call = tokio::spawn(super::basics::call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction_body("web-2"),
        ));
        mock::play(&mut api, [PodIs(pod(json!({"app": "batch"})))]).await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true, "{review}");
    }

    /// The probe's answer is all a review that looks like one gets: a dry-run eviction of a
    /// `graceful-drain-probe-` pod is allowed with the warning and reads or writes
    /// nothing; without the dry run the same name is an eviction like any other.
    #[tokio::test]
    async fn a_review_that_claims_to_be_a_probe_gets_the_warning_and_changes_nothing() {
        const NAME: &str = "graceful-drain-probe-forged";
        assert!(NAME.starts_with(crate::probe::PROBE_POD_PREFIX));
        let name = NAME.to_string();
        let body = |dry_run: bool| {
            let mut body: Value = serde_json::from_slice(&eviction_body(&name)).unwrap();
            body["request"]["dryRun"] = json!(dry_run);
            serde_json::to_vec(&body).unwrap()
        };
        let (client, mut api) = mock::client();
        let (status, review) = call(state(client), "/mutate/eviction", body(true)).await;
        assert_eq!(status, 200);
        assert_eq!(review["response"]["allowed"], true, "{review}");
        assert!(review["response"].get("patch").is_none(), "{review}");
        let warnings = review["response"]["warnings"].to_string();
        assert!(warnings.contains(crate::probe::SEEN_WARNING), "{warnings}");
        let next = api.next_request().await.map(|(r, _)| r.uri().to_string());
        assert_eq!(next, None, "a probe's review reached the API");

        let (client, mut api) = mock::client();
        let answer = tokio::spawn(call(state(client), "/mutate/eviction", body(false)));
        // Read like any evicted pod (mock::play checks the request).
        mock::play(&mut api, [PodMissing(NAME)]).await;
        let (_, review) = answer.await.unwrap();
        assert!(
            !review["response"]["warnings"]
                .to_string()
                .contains(crate::probe::SEEN_WARNING),
            "{review}"
        );
    }
}

mod support {
    pub(super) use super::basics::{call, state};
    use serde_json::{Value, json};

    pub(super) use crate::isolate::tests::pdb_json;
    use graceful_drain_testing::fixtures::{self, PodFixture, to_json};

    /// `web/web-1`, running and ready, at resourceVersion 12.
    pub(super) fn pod_json(uid: &str) -> Value {
        to_json(
            &fixtures::pod("web-1")
                .ns("web")
                .with_uid(uid)
                .at_version("12")
                .label("app", "web")
                .container("web:1")
                .running()
                .ready(),
        )
    }

    /// An eviction review of `web/web-1` with these deleteOptions.
    pub(super) fn eviction(options: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "ev-1",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction", "name": "web-1", "namespace": "web", "operation": "CREATE",
                "userInfo": {"username": "system:node:n1"},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": "web-1", "namespace": "web"},
                           "deleteOptions": options}}
        }))
        .unwrap()
    }

    /// A DELETE review of the bare pod `web/web-1`.
    pub(super) fn deletion() -> Vec<u8> {
        deletion_of(pod_json("uid-1"))
    }

    /// A DELETE review of `pod`.
    pub(super) fn deletion_of(pod: Value) -> Vec<u8> {
        deletion_by(pod, "alice")
    }

    /// A DELETE review of `pod` by `user`.
    pub(super) fn deletion_by(pod: Value, user: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "del-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "web-1", "namespace": "web", "operation": "DELETE",
                "userInfo": {"username": user},
                "oldObject": pod,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}}
        }))
        .unwrap()
    }
}

mod answers {
    //! Mock-API tests of the answers that keep exposed pods protected whatever the
    //! cluster does: live PDB reads, preconditions, permanent failures and deadlines.
    use super::super::evict::RETRY_AFTER_SECONDS;
    use super::super::*;
    use super::support::*;
    use crate::decide::REPLICASET_CONTROLLER;
    use crate::decide::{PodFacts, of_replicaset};
    use crate::isolate::scenarios::Scenario::*;
    use graceful_drain_core::labels::webhook_reason;
    use graceful_drain_core::labels::{
        DELETE_AT_ANNOTATION, DEREGISTERING_CAUSE, DRAINING_LABEL, ORIGINAL_LABELS_ANNOTATION,
        RESTORE_AT_ANNOTATION,
    };
    use graceful_drain_testing::fixtures::mock;
    use serde_json::{Value, json};

    /// The API server may call the webhook twice for one DELETE, the second time with the
    /// pod as the first call's isolation left it (controller role handed to the
    /// Deployment, the ReplicaSet kept as a plain owner): both calls must see a ReplicaSet
    /// pod, or the second would be held and allowed and the ReplicaSet's expectations
    /// would wait five minutes. A pod merely owned (not controlled) by a ReplicaSet and not
    /// isolated by us, or a StatefulSet's pod, is no ReplicaSet pod.
    #[test]
    fn a_replicaset_pod_is_recognised_on_the_second_call_for_one_delete() {
        use crate::decide::OwnerKind;
        let rs_ref = |controller: bool| {
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9",
                "uid": "rs-1", "controller": controller})
        };
        let first = PodFacts {
            owner: Some((OwnerKind::ReplicaSet, "web-7d9".into())),
            owner_refs: vec![rs_ref(true)],
            ..PodFacts::default()
        };
        assert!(of_replicaset(&first));
        let mut second = PodFacts {
            owner: Some((OwnerKind::Other("Deployment".into()), "web".into())),
            owner_refs: vec![
                rs_ref(false),
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                    "uid": "d-1", "controller": true}),
            ],
            ..PodFacts::default()
        };
        assert!(
            !of_replicaset(&second),
            "not isolated by us: not ours to judge"
        );
        second.labels.insert(DRAINING_LABEL.into(), "true".into());
        assert!(of_replicaset(&second), "isolated by the first call");
        let stateful = PodFacts {
            owner: Some((OwnerKind::StatefulSet, "db".into())),
            owner_refs: vec![json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": "db", "uid": "s-1", "controller": true})],
            ..PodFacts::default()
        };
        assert!(!of_replicaset(&stateful));
    }

    /// The cache says the PDB has no disruption left, the live PDB has one: the eviction
    /// is charged on the live PDB and isolated (before, it passed unchanged on the stale
    /// view — a real eviction if the API server then allowed it).
    #[tokio::test]
    async fn eviction_behind_a_stale_exhausted_pdb_reads_it_live_and_isolates() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 0)).unwrap());
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        let scenarios = [
            PodIs(pod_json("uid-1")),
            PdbIs(pdb_json("2", 1)),
            PdbCharged(pdb_json("3", 0)),
            Relabeled("web-1"),
            EventPosted,
        ];
        let [_pod, _pdb, put, _relabel, _event] =
            mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert_eq!(put.body["metadata"]["resourceVersion"], "2");
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert!(review["response"].get("patch").is_none());
        let refusal = &review["response"]["status"];
        assert_eq!(refusal["code"], 429);
        assert_eq!(
            refusal["details"]["causes"][0]["reason"], DEREGISTERING_CAUSE,
            "isolated, not refused by the PDB: {refusal}"
        );
    }

    /// Cache and live PDB agree the budget is exhausted: we answer 429 ourselves and
    /// change nothing, instead of passing an eviction the API server might let through.
    #[tokio::test]
    async fn eviction_behind_an_exhausted_pdb_is_answered_429_by_us() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 0)).unwrap());
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        mock::play(
            &mut api,
            [PodIs(pod_json("uid-1")), PdbIs(pdb_json("2", 0))],
        )
        .await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("web/web-1") && message.contains("web/web"),
            "{message}"
        );
        assert!(review["response"].get("patch").is_none());
    }

    /// A person's DELETE (or a forged review of one) behind an exhausted PDB is not
    /// isolated: nothing confirms it, so it is bound by the budget like an eviction, and
    /// the DELETE goes through as it would without graceful-drain. A review's word cannot
    /// take a Service below its budget.
    #[tokio::test]
    async fn an_unconfirmed_delete_behind_an_exhausted_pdb_isolates_nothing() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 0)).unwrap());
        let call = tokio::spawn(call(st, "/validate/delete?timeout=2s", deletion()));
        mock::play(
            &mut api,
            [PodIs(pod_json("uid-1")), PdbIs(pdb_json("2", 0))],
        )
        .await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        let more = tokio::time::timeout(Duration::from_millis(100), api.next_request()).await;
        let more = more
            .ok()
            .flatten()
            .map(|(r, _)| (r.method().clone(), r.uri().clone()));
        assert!(
            more.is_none(),
            "the pod was isolated past its budget: {more:?}"
        );
    }

    /// `web/web-1` as ordinal 1 of StatefulSet `web`, of revision `web-old`.
    fn statefulset_pod() -> Value {
        let mut pod = pod_json("uid-1");
        pod["metadata"]["labels"]["controller-revision-hash"] = json!("web-old");
        pod["metadata"]["labels"]["sts"] = json!("web");
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "StatefulSet", "name": "web", "uid": "sts-1", "controller": true}]);
        pod
    }

    /// StatefulSet `web` with `replicas`, rolling to revision `update`.
    fn statefulset(replicas: i32, update: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": "web", "uid": "sts-1"},
            "spec": {"replicas": replicas, "serviceName": "web",
                "selector": {"matchLabels": {"sts": "web"}},
                "template": {"metadata": {"labels": {"app": "web", "sts": "web"}}}},
            "status": {"replicas": replicas, "updateRevision": update}})
    }

    /// The StatefulSet controller's DELETE of a pod of an older revision, backed by the
    /// live StatefulSet (a rolling update), is confirmed: isolated even though the budget
    /// is spent (PDBs never block a controller's DELETE, and the same-name replacement of
    /// the previous pod is still listed as disrupted for two minutes).
    #[tokio::test]
    async fn a_statefulset_rollouts_delete_is_isolated_past_a_spent_budget() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 0)).unwrap());
        let body = deletion_by(statefulset_pod(), crate::decide::STATEFULSET_CONTROLLER);
        let call = tokio::spawn(call(st, "/validate/delete?timeout=2s", body));
        let played = mock::play(
            &mut api,
            [
                PodIs(statefulset_pod()),
                StatefulSetIs(statefulset(3, "web-new")),
                // Its members: web-2 already updated and ready, web-0 not yet due.
                PodsListed(vec![
                    member(0, "web-old", true),
                    statefulset_pod(),
                    member(2, "web-new", true),
                ]),
                StatefulSetIs(statefulset(3, "web-new")),
                PdbIs(pdb_json("2", 0)),
                Relabeled("web-1"),
                EventPosted,
            ],
        )
        .await;
        assert!(
            played[5]
                .body
                .to_string()
                .contains("graceful-drain.io~1draining")
        );
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
    }

    /// Member `web-<ordinal>` of StatefulSet `web`, of `revision`, Ready or not.
    fn member(ordinal: usize, revision: &str, ready: bool) -> Value {
        let mut pod = statefulset_pod();
        pod["metadata"]["name"] = json!(format!("web-{ordinal}"));
        pod["metadata"]["uid"] = json!(format!("uid-{ordinal}"));
        pod["metadata"]["labels"]["controller-revision-hash"] = json!(revision);
        pod["status"]["conditions"] =
            json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
        pod
    }

    /// The StatefulSet controller takes one member down at a time (its `maxUnavailable`),
    /// from the highest ordinal, and none while a member is unavailable: a DELETE claiming
    /// it is backed only when it is that step. A stalled rollout backs nothing; a second
    /// member while one is isolated, or a lower ordinal before a higher one, is not backed.
    #[test]
    fn a_statefulset_delete_is_backed_only_as_its_controllers_next_step() {
        use super::super::gather::Member;
        use super::super::stateful::is_the_step;
        use k8s_openapi::api::apps::v1::StatefulSet;
        let sts = |v: Value| -> StatefulSet { serde_json::from_value(v).unwrap() };
        let m = |ordinal: i64, revision: &str, available: bool, isolated: bool| Member {
            name: format!("web-{ordinal}"),
            ordinal,
            revision: Some(revision.to_string()),
            available,
            terminating: false,
            isolated,
        };
        let set = sts(statefulset(3, "web-new"));
        // web-2 updated and ready: web-1 is next.
        let rolling = [
            m(0, "web-old", true, false),
            m(1, "web-old", true, false),
            m(2, "web-new", true, false),
        ];
        assert_eq!(is_the_step(&set, "web-1", &rolling), Ok(()));
        // web-0 before web-1: not the controller's order.
        let why = is_the_step(&set, "web-0", &rolling).unwrap_err();
        assert!(
            why.contains("updates web-1 (a higher ordinal) before web-0"),
            "{why}"
        );
        // Stalled: the new web-2 never turns ready; nothing more is taken down.
        let stalled = [
            m(0, "web-old", true, false),
            m(1, "web-old", true, false),
            m(2, "web-new", false, false),
        ];
        let why = is_the_step(&set, "web-1", &stalled).unwrap_err();
        assert!(why.contains("1 of its members unavailable"), "{why}");
        assert!(is_the_step(&set, "web-0", &stalled).is_err());
        // web-1 isolated already (the controller's DELETE of it is held): web-0 waits.
        let held = [
            m(0, "web-old", true, false),
            m(1, "web-old", true, true),
            m(2, "web-new", true, false),
        ];
        assert!(is_the_step(&set, "web-0", &held).is_err());
        // The repeated call for web-1 itself is still its step.
        assert_eq!(is_the_step(&set, "web-1", &held), Ok(()));
        // maxUnavailable 2: with web-2 terminating, web-1 may go too.
        let mut two = statefulset(3, "web-new");
        two["spec"]["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}});
        let terminating = [
            m(0, "web-old", true, false),
            m(1, "web-old", true, false),
            Member {
                terminating: true,
                available: false,
                ..m(2, "web-old", true, false)
            },
        ];
        assert_eq!(
            is_the_step(&sts(two.clone()), "web-1", &terminating),
            Ok(())
        );
        assert!(is_the_step(&set, "web-1", &terminating).is_err());
        // 34% of 3 rounds up to 2 as well.
        two["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = json!("34%");
        assert_eq!(is_the_step(&sts(two), "web-1", &terminating), Ok(()));
    }

    /// What the live StatefulSet and DaemonSet say of their controller's DELETE: a pod past
    /// the replicas or of an older revision (at or past the partition) is backed; a
    /// current pod, an `OnDelete` StatefulSet's, or a DaemonSet pod of the current
    /// template generation is not.
    #[test]
    fn the_live_owner_backs_only_the_deletes_its_controller_makes() {
        use super::super::delete::daemonset_deletes;
        use super::super::stateful::statefulset_deletes;
        use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
        let facts = |pod: Value| crate::review::pod_facts(&serde_json::from_value(pod).unwrap());
        let sts = |v: Value| -> StatefulSet { serde_json::from_value(v).unwrap() };
        let old = facts(statefulset_pod());
        assert!(statefulset_deletes(&sts(statefulset(3, "web-new")), &old).is_ok());
        assert!(statefulset_deletes(&sts(statefulset(3, "web-old")), &old).is_err());
        assert!(
            statefulset_deletes(&sts(statefulset(1, "web-old")), &old).is_ok(),
            "ordinal 1 of 1 replica"
        );
        let mut partitioned = statefulset(3, "web-new");
        partitioned["spec"]["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 2}});
        assert!(statefulset_deletes(&sts(partitioned), &old).is_err());
        let mut on_delete = statefulset(3, "web-new");
        on_delete["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
        assert!(statefulset_deletes(&sts(on_delete), &old).is_err());
        let ds = |generation: &str| -> DaemonSet {
            serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "web", "namespace": "web",
                    "annotations": {"deprecated.daemonset.template.generation": generation}},
                "spec": {"selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}}}}))
            .unwrap()
        };
        let mut ds_pod = pod_json("uid-1");
        ds_pod["metadata"]["labels"]["pod-template-generation"] = json!("1");
        let ds_pod = facts(ds_pod);
        assert!(daemonset_deletes(&ds("2"), &ds_pod).is_ok());
        assert!(daemonset_deletes(&ds("1"), &ds_pod).is_err());
        assert!(
            daemonset_deletes(&ds("2"), &facts(pod_json("uid-1"))).is_err(),
            "no generation label"
        );
    }

    /// `web/web-1` as a pod of ReplicaSet `web-abc`.
    fn replicaset_pod() -> Value {
        let mut pod = pod_json("uid-1");
        pod["metadata"]["labels"]["pod-template-hash"] = json!("abc");
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "web-abc", "uid": "rs-1",
            "controller": true, "blockOwnerDeletion": true}]);
        pod
    }

    /// A DELETE of `web/web-1`, a pod of ReplicaSet `web-abc`, by the ReplicaSet controller.
    fn scale_down_deletion() -> Vec<u8> {
        let mut review: Value = serde_json::from_slice(&deletion_of(replicaset_pod())).unwrap();
        review["request"]["userInfo"]["username"] = json!(REPLICASET_CONTROLLER);
        serde_json::to_vec(&review).unwrap()
    }

    /// ReplicaSet `web-abc` wanting `wanted` pods and reporting `has`.
    fn replicaset(wanted: i32, has: i32) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "web", "uid": "rs-1"},
            "spec": {"replicas": wanted,
                     "selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}},
            "status": {"replicas": has}})
    }

    /// A DELETE claiming to come from the ReplicaSet controller while the live ReplicaSet
    /// controls no pod to spare is refused without isolating: the deferred deleter would
    /// otherwise delete the pod on the review's word alone. Its status still says three
    /// pods (it lags the isolations): the pods it controls are what count, so forged
    /// DELETEs after a scale-down take no more pods than the surplus.
    #[tokio::test]
    async fn a_replicaset_delete_without_a_surplus_is_refused_and_isolates_nothing() {
        let (client, mut api) = mock::client();
        let st = state(client);
        // The metrics only: the state's client must go with the call, ending the mock API.
        let metrics = st.metrics.clone();
        let call = tokio::spawn(call(
            st,
            "/validate/delete?timeout=10s",
            scale_down_deletion(),
        ));
        // Two pods it controls, and one of its pods already isolated by an earlier
        // DELETE (no longer matched by its labels): none to spare for a third.
        let mut sibling = replicaset_pod();
        sibling["metadata"]["name"] = json!("web-2");
        mock::play(
            &mut api,
            [
                PodIs(replicaset_pod()),
                ReplicaSetIs(replicaset(2, 3)),
                PodsListed(vec![replicaset_pod(), sibling]),
            ],
        )
        .await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("web/web-1") && message.contains("none to spare"),
            "{message}"
        );
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the pod was touched");
        assert_eq!(metrics.pods_isolated.get(), 0);
    }

    /// A body refused before it is read is counted by why, as every answer is: a flood of
    /// oversized bodies shows in the review counter.
    #[tokio::test]
    async fn a_refused_body_is_counted() {
        let (client, _api) = mock::client();
        let st = state(client);
        let metrics = st.metrics.clone();
        let (status, _) = call(st, "/validate/delete?timeout=10s", vec![b' '; 2 << 20]).await;
        assert_eq!(status, 413);
        let refused = metrics
            .reviews
            .get_or_create(&crate::metrics::ReviewLabels {
                operation: "delete",
                outcome: "body_too_large",
            })
            .get();
        assert_eq!(refused, 1);
    }

    /// DELETEs claiming the ReplicaSet controller, one after another, read the ReplicaSet
    /// and its pods once per second between them, whoever sends them: each review still
    /// reads its own pod, and the second is refused on the first's reading.
    #[tokio::test]
    async fn repeated_replicaset_deletes_read_the_replicaset_once() {
        let (client, mut api) = mock::client();
        let st = state(client);
        let mut sibling = replicaset_pod();
        sibling["metadata"]["name"] = json!("web-2");
        let first = tokio::spawn(call(
            st.clone(),
            "/validate/delete?timeout=10s",
            scale_down_deletion(),
        ));
        mock::play(
            &mut api,
            [
                PodIs(replicaset_pod()),
                ReplicaSetIs(replicaset(2, 2)),
                PodsListed(vec![replicaset_pod(), sibling]),
            ],
        )
        .await;
        assert_eq!(first.await.unwrap().1["response"]["allowed"], false);
        let second = tokio::spawn(call(
            st.clone(),
            "/validate/delete?timeout=10s",
            scale_down_deletion(),
        ));
        mock::play(&mut api, [PodIs(replicaset_pod())]).await;
        // A review that read the ReplicaSet again would wait for an answer nobody plays.
        let (_, review) = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the second DELETE read the ReplicaSet again")
            .unwrap();
        assert_eq!(review["response"]["allowed"], false);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("none to spare"), "{message}");
        drop(st);
        let next = api.next_request().await.map(|(r, _)| r.uri().clone());
        assert_eq!(next, None, "the ReplicaSet was read again");
    }

    /// A ReplicaSet scale-down the live ReplicaSet backs (one pod more than it wants) is
    /// isolated for the deferred deleter, without a restore time, and refused so the
    /// controller counts the deletion at once.
    #[tokio::test]
    async fn a_replicaset_delete_with_a_surplus_isolates_the_pod_for_the_deferred_deleter() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/validate/delete?timeout=10s",
            scale_down_deletion(),
        ));
        let (mut second, mut third) = (replicaset_pod(), replicaset_pod());
        second["metadata"]["name"] = json!("web-2");
        third["metadata"]["name"] = json!("web-3");
        let scenarios = [
            PodIs(replicaset_pod()),
            ReplicaSetIs(replicaset(2, 3)),
            PodsListed(vec![replicaset_pod(), second, third]),
            ReplicaSetIs(replicaset(2, 3)),
            Relabeled("web-1"),
            EventPosted,
        ];
        let [_pod, _rs, _pods, _reread, patch, _event] =
            mock::play(&mut api, scenarios).await.try_into().unwrap();
        let patch = patch.body.to_string();
        assert!(patch.contains(DELETE_AT_ANNOTATION), "{patch}");
        assert!(
            !patch.contains("restore-at"),
            "the deferred deleter removes it: {patch}"
        );
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], false);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("will be deleted at"), "{message}");
    }

    /// An eviction carrying the UID precondition of an earlier pod with the same name is
    /// let through unchanged (the API server answers 409): the live pod is not touched.
    #[tokio::test]
    async fn eviction_with_another_pods_uid_precondition_changes_nothing() {
        let (client, mut api) = mock::client();
        let options = json!({"preconditions": {"uid": "uid-0"}});
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction(options),
        ));
        mock::play(&mut api, [PodIs(pod_json("uid-1"))]).await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
        drop(api);
    }

    /// Our relabel refused for good (RBAC 403): the eviction goes through unchanged with a
    /// Warning Event and a metric, never an endless 429.
    #[tokio::test]
    async fn permanently_refused_relabel_lets_the_eviction_through_with_a_warning() {
        let (client, mut api) = mock::client();
        let st = state(client);
        let metrics = st.clone();
        let call = tokio::spawn(call(
            st,
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        let scenarios = [PodIs(pod_json("uid-1")), RelabelForbidden, EventPosted];
        let [_pod, _relabel, event] = mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], webhook_reason::ISOLATION_FAILED);
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
        let failures = metrics
            .metrics
            .isolation_failures
            .get_or_create(&crate::metrics::FailureLabels {
                operation: "evict",
                reason: "forbidden",
            })
            .get();
        assert_eq!(failures, 1);
    }

    /// A 422 that is not our `test` op failing (another webhook or policy refusing the
    /// relabel: the re-read pod is unchanged) is permanent too.
    #[tokio::test]
    async fn invalid_relabel_on_an_unchanged_pod_is_permanent() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        let scenarios = [
            PodIs(pod_json("uid-1")),
            RelabelInvalid,
            PodIs(pod_json("uid-1")),
            EventPosted,
        ];
        let [_pod, _relabel, _reread, event] =
            mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert_eq!(event.body["type"], "Warning");
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert!(review["response"].get("patch").is_none());
    }

    /// The API server never answers: the eviction is answered 429 with Retry-After before
    /// the API server's deadline (virtual time: the API server's 3 s budget).
    #[tokio::test(start_paused = true)]
    async fn eviction_is_answered_429_at_the_deadline() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/mutate/eviction?timeout=3s",
            eviction(json!({})),
        ));
        let (_request, _never_answered) = api.next_request().await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(3), call).await;
        let (_, review) = answered
            .expect("answered within the API server's deadline")
            .unwrap();
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 429);
        assert_eq!(
            review["response"]["status"]["details"]["retryAfterSeconds"],
            RETRY_AFTER_SECONDS
        );
    }

    /// An eviction of an isolated pod due within [`DUE_HOLD`] is held until the pod is due
    /// and then allowed, so the caller evicts it then rather than a Retry-After second (or
    /// kubectl's five) later; one due later is answered 429 at once. A pod the deleter
    /// removes (no restore time: its node is being drained) is awaited until gone, and the
    /// call then refused 404 NotFound without deciding again: the caller is done, with no
    /// poll for the deletion, and no replacement that took the name is evicted.
    // On the wall clock: the delete time is one, and a paused tokio clock would not move it.
    #[tokio::test]
    async fn an_eviction_arriving_just_before_its_pod_is_due_is_held_until_due() {
        use super::super::evict::DUE_HOLD;
        let isolated = |due_in: Duration, by_caller: bool| {
            let mut pod = pod_json("uid-1");
            pod["metadata"]["labels"] = json!({DRAINING_LABEL: "true"});
            let now = jiff::Timestamp::now();
            let due = now + jiff::SignedDuration::try_from(due_in).unwrap();
            // Its delay is over by its delete time, counted from when it left the slices.
            pod["metadata"]["annotations"] = json!({
                DELETE_AT_ANNOTATION: due.to_string(),
                graceful_drain_core::labels::DELAY_ANNOTATION: "500ms",
                ORIGINAL_LABELS_ANNOTATION: "{\"app\":\"web\"}"});
            if by_caller {
                let restore = due + jiff::SignedDuration::from_secs(60);
                pod["metadata"]["annotations"][RESTORE_AT_ANNOTATION] = json!(restore.to_string());
            }
            pod
        };
        for (due_in, held, by_caller) in [
            (Duration::from_millis(900), true, true),
            (DUE_HOLD * 3, false, true),
            (Duration::from_millis(900), true, false),
        ] {
            let (client, mut api) = mock::client();
            let st = state(client);
            // Isolated: the slices no longer list it.
            st.ctx.cache.apply_slice(&serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": "web-x1", "namespace": "web", "labels": {"kubernetes.io/service-name": "web"}},
                "endpoints": [{"addresses": ["10.0.0.11"], "conditions": {"ready": true},
                    "targetRef": {"kind": "Pod", "name": "web-a", "namespace": "web", "uid": "uid-a"}}]
            })).unwrap());
            let pod = isolated(due_in, by_caller);
            let started = tokio::time::Instant::now();
            let call = tokio::spawn(call(
                st,
                "/mutate/eviction?timeout=10s",
                eviction(json!({})),
            ));
            // Read when the eviction arrives; once due, read to see who removes it: its
            // caller (the eviction is decided afresh on a third read) or the deleter, which
            // has removed it.
            let reads = match (held, by_caller) {
                (false, _) => vec![PodIs(pod.clone())],
                (true, true) => vec![PodIs(pod.clone()), PodIs(pod.clone()), PodIs(pod.clone())],
                (true, false) => vec![PodIs(pod.clone()), PodMissing("web-1")],
            };
            mock::play(&mut api, reads).await;
            let (_, review) = call.await.unwrap();
            let response = &review["response"];
            if held && !by_caller {
                // Gone: the caller hears what it would for a missing pod.
                assert_eq!(response["allowed"], false, "{review}");
                assert_eq!(response["status"]["code"], 404, "{review}");
                assert_eq!(response["status"]["reason"], "NotFound", "{review}");
            } else {
                assert_eq!(response["allowed"], held, "due in {due_in:?}: {review}");
            }
            if held {
                let waited = started.elapsed();
                assert!(
                    waited >= Duration::from_millis(850),
                    "answered after {waited:?}"
                );
            } else {
                assert_eq!(review["response"]["status"]["code"], 429);
            }
        }
    }

    /// `web/web-1` isolated already, due long after any test ends: a DELETE of it is held.
    fn held_pod_json() -> Value {
        let mut pod = pod_json("uid-1");
        pod["metadata"]["labels"] = json!({DRAINING_LABEL: "true"});
        pod["metadata"]["annotations"] = json!({
            DELETE_AT_ANNOTATION: "2999-01-01T00:00:00Z",
            ORIGINAL_LABELS_ANNOTATION: "{\"app\":\"web\"}"});
        pod
    }

    /// The API server calls again within the same DELETE (the pod changed during the
    /// call): the second call continues the first hold and is answered at once, so the
    /// caller waits one webhook timeout, not two.
    #[tokio::test(start_paused = true)]
    async fn a_repeated_call_for_one_delete_continues_the_first_hold() {
        let (client, mut api) = mock::client();
        let st = state(client);
        let pod = held_pod_json();
        let body = deletion_of(pod.clone());
        // Each call reads the pod live: it is isolated there too.
        let live = tokio::spawn(async move {
            mock::play(&mut api, [PodIs(pod.clone()), PodIs(pod)]).await;
            api
        });
        let started = tokio::time::Instant::now();
        let (_, first) = call(st.clone(), "/validate/delete?timeout=4s", body.clone()).await;
        assert_eq!(first["response"]["allowed"], true);
        let first_held = started.elapsed();
        assert_eq!(
            first_held,
            Duration::from_secs(2),
            "held until the deadline minus the margin"
        );
        let (_, second) = call(st, "/validate/delete?timeout=4s", body).await;
        assert_eq!(second["response"]["allowed"], true);
        assert_eq!(
            started.elapsed(),
            first_held,
            "the second call is not held again"
        );
        drop(live.await.unwrap());
    }

    /// Confirmed release: a DELETE held on an isolated pod goes through as soon as the
    /// deleter's watch sees the pod released (the load balancer let go of it), not at its
    /// delete time or the call's deadline.
    #[tokio::test(start_paused = true)]
    async fn a_held_delete_goes_through_once_the_load_balancer_lets_go() {
        let (client, mut api) = mock::client();
        let st = state(client);
        let pod = held_pod_json();
        let body = deletion_of(pod.clone());
        let live = tokio::spawn(async move {
            mock::play(&mut api, [PodIs(pod)]).await;
            api
        });
        let started = tokio::time::Instant::now();
        let answer = tokio::spawn(call(st.clone(), "/validate/delete?timeout=30s", body));
        // Busy, so the paused clock stands still until the DELETE is held.
        while st.metrics.holds_in_flight.get() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(
            !answer.is_finished(),
            "held while the balancer routes to it"
        );
        st.ctx.cache.set_released("web", "web-1", true);
        let (_, review) = answer.await.unwrap();
        assert_eq!(review["response"]["allowed"], true, "{review}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "answered at the release, not at the deadline: {:?}",
            started.elapsed()
        );
        assert_eq!(st.metrics.holds_in_flight.get(), 0);
        drop(live.await.unwrap());
    }

    /// With every hold slot taken, a DELETE of an exposed pod is answered at once and
    /// isolates nothing (outcome `hold_limit`); once a slot is free, the next is held.
    #[tokio::test]
    async fn a_delete_past_the_hold_slots_goes_through_at_once_and_isolates_nothing() {
        let (client, mut api) = mock::client();
        let mut st = state(client);
        Arc::get_mut(&mut st).unwrap().holds = Holds::bounded(1);
        let taken = st.holds.slot().expect("the only slot");
        assert!(st.holds.slot().is_none(), "bounded at one");
        let answer = tokio::spawn(call(st.clone(), "/validate/delete?timeout=4s", deletion()));
        mock::play(&mut api, [PodIs(pod_json("uid-1"))]).await;
        let (_, review) = answer.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        let counted = st
            .metrics
            .reviews
            .get_or_create(&crate::metrics::ReviewLabels {
                operation: "delete",
                outcome: "hold_limit",
            })
            .get();
        assert_eq!(counted, 1);
        drop(taken);
        assert!(st.holds.slot().is_some(), "the slot is back");
        drop(st);
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the pod was touched");
    }

    /// The pod was replaced under a DELETE (same name, new UID): the re-read after the
    /// failed patch finds the replacement, which is left alone.
    #[tokio::test]
    async fn delete_never_isolates_a_same_name_replacement() {
        let (client, mut api) = mock::client();
        let st = state(client);
        // The replacement is a ready endpoint too.
        st.ctx.cache.apply_slice(&serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "web-x2", "namespace": "web", "labels": {"kubernetes.io/service-name": "web"}},
            "endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": true},
                           "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "web", "uid": "uid-2"}}]
        })).unwrap());
        let call = tokio::spawn(call(st, "/validate/delete?timeout=4s", deletion()));
        let mut replacement = pod_json("uid-2");
        replacement["metadata"]["resourceVersion"] = json!("20");
        mock::play(
            &mut api,
            [
                PodIs(pod_json("uid-1")),
                RelabelConflicts,
                PodIs(replacement),
            ],
        )
        .await;
        let (_, review) = call.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the replacement was touched");
    }

    /// The API server never answers: the DELETE is allowed before the API server's deadline.
    #[tokio::test(start_paused = true)]
    async fn delete_is_allowed_at_the_deadline() {
        let (client, mut api) = mock::client();
        let call = tokio::spawn(call(
            state(client),
            "/validate/delete?timeout=3s",
            deletion(),
        ));
        let (_request, _never_answered) = api.next_request().await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(3), call).await;
        let (_, review) = answered
            .expect("answered within the API server's deadline")
            .unwrap();
        assert_eq!(review["response"]["allowed"], true);
    }

    /// A DELETE review of a pod that does not exist (a forged one: the API server reviews
    /// only what it is about to delete) is allowed and writes nothing: no PDB, no Event.
    #[tokio::test]
    async fn a_delete_review_of_a_missing_pod_writes_nothing() {
        let (client, mut api) = mock::client();
        let st = state(client);
        st.ctx
            .cache
            .apply_pdb(&serde_json::from_value(pdb_json("1", 1)).unwrap());
        let answer = tokio::spawn(call(st, "/validate/delete?timeout=4s", deletion()));
        mock::play(&mut api, [PodMissing("web-1")]).await;
        let (_, review) = answer.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(
            next, None,
            "something was written for a pod that does not exist"
        );
    }

    /// A DELETE review whose copy of the pod is another incarnation than the live one
    /// (another UID), or claims an isolation the live pod does not have, changes nothing.
    #[tokio::test]
    async fn a_delete_review_of_another_incarnation_changes_nothing() {
        let (client, mut api) = mock::client();
        let mut claimed = pod_json("uid-0");
        claimed["metadata"]["labels"] = json!({DRAINING_LABEL: "true", "app": "web"});
        let answer = tokio::spawn(call(
            state(client),
            "/validate/delete?timeout=4s",
            deletion_of(claimed),
        ));
        mock::play(&mut api, [PodIs(pod_json("uid-1"))]).await;
        let (_, review) = answer.await.unwrap();
        assert_eq!(review["response"]["allowed"], true);
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the live pod was touched");
    }

    /// A `timeout` beyond what kube-apiserver can send is clamped to its 30 s maximum, and
    /// one too large for a duration does not fail the call.
    #[test]
    fn the_call_budget_never_exceeds_what_an_api_server_allows() {
        use crate::admission::{MAX_CALL_BUDGET, call_budget};
        let default = Duration::from_secs(10);
        assert_eq!(call_budget(Some("5s"), default), Duration::from_secs(5));
        assert_eq!(call_budget(None, default), default);
        assert_eq!(call_budget(Some("1h"), default), MAX_CALL_BUDGET);
        assert_eq!(
            call_budget(Some("3000000000000000h"), default),
            MAX_CALL_BUDGET
        );
        assert_eq!(call_budget(Some("bogus"), default), default);
    }

    /// The Service's only ready endpoint, evicted on a schedulable node (what a forged
    /// review looks like): refused with 429, nothing written. The same eviction on a
    /// cordoned node (a drain, which only an authenticated user starts) isolates it.
    #[tokio::test]
    async fn an_unconfirmed_eviction_never_takes_a_services_last_endpoint() {
        let mut pod = pod_json("uid-1");
        pod["spec"]["nodeName"] = json!("n1");
        let node = |cordoned: bool| {
            json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1"}, "spec": {"unschedulable": cordoned}})
        };
        let lone = |client| {
            let st = state(client);
            st.ctx.cache.apply_slice(&serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": "web-x1", "namespace": "web", "labels": {"kubernetes.io/service-name": "web"}},
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
                               "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "web", "uid": "uid-1"}}]
            })).unwrap());
            st
        };

        let (client, mut api) = mock::client();
        let answer = tokio::spawn(call(
            lone(client),
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        mock::play(&mut api, [PodIs(pod.clone()), NodeIs(node(false))]).await;
        let (_, review) = answer.await.unwrap();
        assert_eq!(review["response"]["status"]["code"], 429);
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("last ready endpoint of Service web"),
            "{message}"
        );
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the pod was touched");

        // A cordon alone confirms nothing: anyone may send an eviction of a cordoned
        // node's pod.
        let (client, mut api) = mock::client();
        let answer = tokio::spawn(call(
            lone(client),
            "/mutate/eviction?timeout=10s",
            eviction(json!({})),
        ));
        mock::play(&mut api, [PodIs(pod.clone()), NodeIs(node(true))]).await;
        let (_, review) = answer.await.unwrap();
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("last ready endpoint of Service web"),
            "{message}"
        );
        let next = api.next_request().await.map(|(r, _)| r.method().clone());
        assert_eq!(next, None, "the pod on a cordoned node was touched");

        // A drainer's own mark on the node does: Karpenter's taint, or our node agent's
        // DrainInProgress condition.
        let mut karpenter = node(true);
        karpenter["spec"]["taints"] =
            json!([{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]);
        let mut agent = node(true);
        agent["status"] = json!({"conditions": [
            {"type": "DrainInProgress", "status": "True", "reason": "Draining"}]});
        for drained in [karpenter, agent] {
            let (client, mut api) = mock::client();
            let answer = tokio::spawn(call(
                lone(client),
                "/mutate/eviction?timeout=10s",
                eviction(json!({})),
            ));
            let played = mock::play(
                &mut api,
                [
                    PodIs(pod.clone()),
                    NodeIs(drained),
                    Relabeled("web-1"),
                    EventPosted,
                ],
            )
            .await;
            assert!(
                played[2]
                    .body
                    .to_string()
                    .contains("graceful-drain.io~1draining")
            );
            let (_, review) = answer.await.unwrap();
            assert_eq!(review["response"]["status"]["code"], 429, "deregistering");
            assert!(
                review["response"]["status"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("leaving its load balancers")
            );
        }
    }
}
