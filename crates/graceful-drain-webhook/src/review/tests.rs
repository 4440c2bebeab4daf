use super::*;
use proptest::prelude::*;
use serde_json::json;

pub fn eviction_review(uid: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "name": "web-1", "namespace": "web", "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": "web-1", "namespace": "web"},
                       "deleteOptions": {"gracePeriodSeconds": 20}},
            "oldObject": null, "dryRun": false
        }
    })
}

fn delete_review(uid: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web-1", "namespace": "web", "operation": "DELETE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "oldObject": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web-1", "namespace": "web", "uid": "u1", "resourceVersion": "5",
                             "labels": {"app": "web"},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs", "controller": true}]},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "gracePeriodSeconds": 30},
            "dryRun": false
        }
    })
}

fn parse_value(v: &Value, path: Operation) -> Result<Review, Error> {
    parse(&serde_json::to_vec(v).unwrap(), path)
}

#[test]
fn eviction_is_read_with_its_options() {
    let review = parse_value(&eviction_review("u-1"), Operation::Evict).unwrap();
    let Parsed::Evict(ev) = review.parsed else {
        panic!("not an eviction")
    };
    assert_eq!((ev.namespace.as_str(), ev.pod.as_str()), ("web", "web-1"));
    assert_eq!(ev.request.grace_period, Some(20));
    assert!(!ev.request.dry_run);
    assert_eq!(ev.request.user, "alice");
}

/// Only the request's pod: a body naming another pod never redirects the webhook, and
/// the caller's preconditions are read.
#[test]
fn eviction_is_about_the_requests_pod_with_its_preconditions() {
    let mut v = eviction_review("u-3");
    v["request"]["object"]["metadata"]["name"] = json!("other-pod");
    v["request"]["object"]["deleteOptions"]["preconditions"] =
        json!({"uid": "uid-9", "resourceVersion": "12"});
    let Parsed::Evict(ev) = parse_value(&v, Operation::Evict).unwrap().parsed else {
        panic!("not an eviction")
    };
    assert_eq!(ev.pod, "web-1");
    assert_eq!(ev.request.name, "web-1");
    assert_eq!(ev.request.preconditions.uid.as_deref(), Some("uid-9"));
    assert_eq!(
        ev.request.preconditions.resource_version.as_deref(),
        Some("12")
    );
}

#[test]
fn deletion_is_read_with_pod_and_options() {
    let review = parse_value(&delete_review("u-2"), Operation::Delete).unwrap();
    let Parsed::Delete(del) = review.parsed else {
        panic!("not a delete")
    };
    let request = del.request.clone();
    let facts = pod_facts(&del.pod().unwrap());
    assert!(facts.running && facts.ready && !facts.terminating);
    assert_eq!(facts.owner, Some((OwnerKind::ReplicaSet, "web-abc".into())));
    assert_eq!(request.grace_period, Some(30));
}

#[test]
fn dry_run_is_seen_in_request_and_options() {
    let mut v = eviction_review("u");
    v["request"]["object"]["deleteOptions"]["dryRun"] = json!(["All"]);
    let Parsed::Evict(ev) = parse_value(&v, Operation::Evict).unwrap().parsed else {
        panic!()
    };
    assert!(ev.request.dry_run);
    let mut v = delete_review("u");
    v["request"]["dryRun"] = json!(true);
    let Parsed::Delete(del) = parse_value(&v, Operation::Delete).unwrap().parsed else {
        panic!()
    };
    assert!(del.request.dry_run);
}

#[test]
fn bad_input_table() {
    let not_ours: Vec<(&str, Value, Operation)> = vec![
        (
            "wrong apiVersion",
            {
                let mut v = eviction_review("u");
                v["apiVersion"] = json!("admission.k8s.io/v1beta1");
                v
            },
            Operation::Evict,
        ),
        (
            "wrong kind",
            {
                let mut v = eviction_review("u");
                v["kind"] = json!("Pod");
                v
            },
            Operation::Evict,
        ),
        (
            "missing object",
            {
                let mut v = eviction_review("u");
                v["request"]["object"] = Value::Null;
                v
            },
            Operation::Evict,
        ),
        (
            "missing oldObject",
            {
                let mut v = delete_review("u");
                v["request"]["oldObject"] = Value::Null;
                v
            },
            Operation::Delete,
        ),
        (
            "oldObject not a pod",
            {
                let mut v = delete_review("u");
                v["request"]["oldObject"]["kind"] = json!("Service");
                v
            },
            Operation::Delete,
        ),
        (
            "delete sent to the eviction path",
            delete_review("u"),
            Operation::Evict,
        ),
        (
            "eviction sent to the delete path",
            eviction_review("u"),
            Operation::Delete,
        ),
        (
            "not pods",
            {
                let mut v = delete_review("u");
                v["request"]["resource"]["resource"] = json!("services");
                v
            },
            Operation::Delete,
        ),
        (
            "update",
            {
                let mut v = delete_review("u");
                v["request"]["operation"] = json!("UPDATE");
                v
            },
            Operation::Delete,
        ),
    ];
    for (name, v, path) in not_ours {
        let review = parse_value(&v, path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(matches!(review.parsed, Parsed::NotOurs(_)), "{name}");
        let body: Value =
            serde_json::from_slice(&to_body(allow(&review.request)).unwrap()).unwrap();
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1", "{name}");
        assert_eq!(body["kind"], "AdmissionReview", "{name}");
        assert_eq!(body["response"]["uid"], "u", "{name}");
        assert_eq!(body["response"]["allowed"], true, "{name}");
        assert!(body["response"].get("patch").is_none(), "{name}");
    }
    for (name, body) in [
        ("not json", b"{".to_vec()),
        (
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        ),
        (
            "request without uid",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}"#
                .to_vec(),
        ),
    ] {
        assert!(parse(&body, Operation::Evict).is_err(), "{name}");
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-zA-Z/.:-]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,10}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Replaces one field of a valid review (by a JSON pointer) with arbitrary JSON.
fn mutated() -> impl Strategy<Value = (Value, Operation)> {
    let pointers = prop::sample::select(vec![
        "/apiVersion",
        "/kind",
        "/request/uid",
        "/request/kind",
        "/request/resource",
        "/request/subResource",
        "/request/operation",
        "/request/userInfo",
        "/request/object",
        "/request/object/metadata",
        "/request/object/deleteOptions",
        "/request/oldObject",
        "/request/oldObject/metadata",
        "/request/oldObject/status",
        "/request/options",
        "/request/dryRun",
        "/request/namespace",
        "/request/name",
    ]);
    (any::<bool>(), pointers, arb_json()).prop_map(|(evict, ptr, value)| {
        let (mut review, path) = if evict {
            (eviction_review("fixed-uid"), Operation::Evict)
        } else {
            (delete_review("fixed-uid"), Operation::Delete)
        };
        if let Some(slot) = review.pointer_mut(ptr) {
            *slot = value;
        }
        (review, path)
    })
}

proptest! {
    #[test]
    fn parser_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&bytes, Operation::Evict);
        let _ = parse(&bytes, Operation::Delete);
    }

    #[test]
    fn parsed_reviews_always_answer_v1_with_the_uid((review, path) in mutated()) {
        if let Ok(parsed) = parse_value(&review, path) {
            let body: Value = serde_json::from_slice(&to_body(allow(&parsed.request)).unwrap()).unwrap();
            prop_assert_eq!(&body["apiVersion"], "admission.k8s.io/v1");
            prop_assert_eq!(&body["kind"], "AdmissionReview");
            prop_assert_eq!(&body["response"]["uid"], &review["request"]["uid"]);
        }
    }
}

/// Names no API server sends are refused without being repeated: a megabyte-long name
/// would otherwise be written on every log line of its review.
#[test]
fn names_kubernetes_would_not_allow_are_refused() {
    let long = "a".repeat(1_000_000);
    for (field, value) in [
        ("name", long.as_str()),
        ("name", "Web-1"),
        ("name", "web_1"),
        ("name", "-web"),
        ("namespace", &long[..64]),
        ("namespace", "web.prod"),
    ] {
        let mut review = eviction_review("u-1");
        review["request"][field] = json!(value);
        let error = parse_value(&review, Operation::Evict).unwrap_err();
        assert!(
            matches!(error, Error::Name { field: f, .. } if f == field),
            "{field}={:.20}: {error}",
            value
        );
        assert!(error.to_string().len() < 200, "{error}");
    }
    // The longest a pod's name and a namespace may be.
    let mut review = eviction_review("u-1");
    review["request"]["name"] = json!(format!("{}.{}", "a".repeat(126), "b".repeat(126)));
    review["request"]["namespace"] = json!("n".repeat(63));
    assert!(parse_value(&review, Operation::Evict).is_ok());
}

/// Every value counts, an object's keys do not; the count needs valid JSON.
#[test]
fn json_values_are_counted_without_building_them() {
    assert_eq!(
        json_values(br#"{"a": [1, "x", null, {"b": true}], "c": {}}"#).unwrap(),
        8
    );
    assert!(json_values(b"[1, 2").is_err());
    assert!(json_values(b"[1] 2").is_err());
}

/// What parsing is charged follows the count of values: a pod's review is charged
/// little, a review as intricate as no pod is refused before anything is built (the
/// 3.3 MB array of one-key objects took 416 MB to parse).
#[test]
fn a_review_holding_more_values_than_any_pod_is_refused_before_it_is_parsed() {
    let ordinary = serde_json::to_vec(&delete_review("u")).unwrap();
    let cost = parse_cost(&ordinary).unwrap();
    assert_eq!(cost, json_values(&ordinary).unwrap() * VALUE_COST);
    assert!(cost < 64 * 1024, "{cost}");
    let mut wide = delete_review("u");
    wide["request"]["oldObject"]["spec"]["x"] = Value::Array(vec![json!({"a": 0}); MAX_VALUES]);
    let wide = serde_json::to_vec(&wide).unwrap();
    let error = parse_cost(&wide).unwrap_err();
    assert!(matches!(error, Error::TooIntricate { values } if values > MAX_VALUES));
    assert!(error.to_string().contains("JSON values"), "{error}");
}

/// A large but ordinary pod's review stays under [`MAX_VALUES`]: forty containers, each
/// with two ports, two probes, twenty environment variables and requests, and a managed
/// fields entry naming every one of those fields.
#[test]
fn a_pod_of_forty_containers_fits() {
    let container = |i: usize| {
        let env: Vec<Value> = (0..20)
            .map(|e| json!({"name": format!("VAR_{e}"), "value": format!("value-{e}")}))
            .collect();
        let probe = json!({"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
            "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3});
        json!({"name": format!("c{i}"), "image": "registry.example/app:1.0",
            "ports": [{"containerPort": 8080, "protocol": "TCP"}, {"containerPort": 9090, "name": "metrics", "protocol": "TCP"}],
            "env": env, "readinessProbe": probe, "livenessProbe": probe,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"})
    };
    let managed = |i: usize| {
        let mut fields = serde_json::Map::new();
        for e in 0..20 {
            fields.insert(
                format!("k:{{\"name\":\"VAR_{e}\"}}"),
                json!({".": {}, "f:name": {}, "f:value": {}}),
            );
        }
        json!({format!("k:{{\"name\":\"c{i}\"}}"): {".": {}, "f:env": fields, "f:image": {},
            "f:ports": {".": {}, "k:{\"containerPort\":8080}": {".": {}, "f:containerPort": {}},
                        "k:{\"containerPort\":9090}": {".": {}, "f:containerPort": {}, "f:name": {}}},
            "f:readinessProbe": {".": {}, "f:httpGet": {".": {}, "f:path": {}, "f:port": {}}},
            "f:livenessProbe": {".": {}, "f:httpGet": {".": {}, "f:path": {}, "f:port": {}}},
            "f:resources": {".": {}, "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}}}})
    };
    let mut review = delete_review("u");
    let pod = &mut review["request"]["oldObject"];
    pod["spec"]["containers"] = Value::Array((0..40).map(container).collect());
    let mut spec_fields = serde_json::Map::new();
    for i in 0..40 {
        spec_fields.extend(managed(i).as_object().unwrap().clone());
    }
    pod["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Update",
        "apiVersion": "v1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:containers": spec_fields}}}]);
    let body = serde_json::to_vec(&review).unwrap();
    let values = json_values(&body).unwrap();
    assert!(
        values < MAX_VALUES,
        "{values} values in {} bytes",
        body.len()
    );
    assert!(parse_cost(&body).is_ok());
    assert!(matches!(
        parse(&body, Operation::Delete).unwrap().parsed,
        Parsed::Delete(_)
    ));
}
