//! Custom resources checked against their CRD's `openAPIV3Schema` like kube-apiserver
//! does: 422 Invalid with a cause per field on create, update, patch, status writes and
//! server-side apply; unknown fields refused (`fieldValidation=Strict`), pruned with a
//! `Warning` header (`Warn`, the default) or pruned silently (`Ignore`); updates
//! ratcheted over parts that did not change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube_sim::apiserver::{ApiServer, Config};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const GROUP: &str = "lifecycle.example.io";

/// A CRD shaped like a node lifecycle event: a required spec of non-empty strings, a
/// status subresource with an enum and a date-time.
fn event_crd(name_max: Option<u64>) -> CustomResourceDefinition {
    let mut binding = json!({"type": "string", "minLength": 1});
    if let Some(max) = name_max {
        binding["maxLength"] = json!(max);
    }
    let schema = json!({"type": "object", "required": ["spec"], "properties": {
        "spec": {"type": "object", "required": ["bindingNode", "transitionName"], "properties": {
            "bindingNode": binding,
            "transitionName": {"type": "string", "minLength": 1},
            "priority": {"type": "integer", "minimum": 0, "maximum": 10}}},
        "status": {"type": "object", "nullable": true, "default": {}, "properties": {
            "claimStatus": {"type": "string", "nullable": true, "default": "Pending",
                "enum": ["Pending", "Claimed", "Failed", "Succeeded"]},
            "sla": {"type": "string", "nullable": true, "format": "date-time"}}}}});
    serde_json::from_value(json!({
        "metadata": {"name": format!("lifecycleevents.{GROUP}")},
        "spec": {"group": GROUP, "scope": "Cluster",
            "names": {"plural": "lifecycleevents", "singular": "lifecycleevent",
                      "kind": "LifecycleEvent", "listKind": "LifecycleEventList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": schema}}]}}))
    .unwrap()
}

fn resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1alpha1".into(),
        api_version: format!("{GROUP}/v1alpha1"),
        kind: "LifecycleEvent".into(),
        plural: "lifecycleevents".into(),
    }
}

fn event(name: &str, spec: Value) -> DynamicObject {
    DynamicObject::new(name, &resource()).data(json!({"spec": spec}))
}

/// A running API server serving the lifecycle event CRD, and the events API.
async fn serving() -> (ApiServer, CancellationToken, Api<DynamicObject>) {
    let shutdown = CancellationToken::new();
    let api = ApiServer::start(Config::default(), shutdown.clone())
        .await
        .unwrap();
    let client = api.client("admin");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &event_crd(None))
        .await
        .unwrap();
    let events = Api::all_with(client, &resource());
    (api, shutdown, events)
}

fn api_error(err: kube::Error) -> Status {
    match err {
        kube::Error::Api(resp) => *resp,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// (reason, field) of each cause.
fn causes(status: &Status) -> Vec<(String, String)> {
    status
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.reason.clone(), c.field.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A raw request's status, `Warning` headers and JSON body.
async fn raw(api: &ApiServer, method: &str, path: &str, body: &Value) -> (u16, Vec<String>, Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let request = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", api.url()))
        .header("authorization", "Bearer admin")
        .header("content-type", content_type)
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        warnings,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn collection() -> String {
    format!("/apis/{GROUP}/v1alpha1/lifecycleevents")
}

#[tokio::test]
async fn invalid_events_are_refused_with_a_cause_per_field() {
    let (_api, _shutdown, events) = serving().await;
    let pp = PostParams::default();

    let missing = events
        .create(&pp, &event("e1", json!({"transitionName": "drain"})))
        .await
        .unwrap_err();
    let missing = api_error(missing);
    assert_eq!((missing.code, missing.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        missing.message,
        format!("LifecycleEvent.{GROUP} \"e1\" is invalid: spec.bindingNode: Required value")
    );
    assert_eq!(
        causes(&missing),
        [("FieldValueRequired".into(), "spec.bindingNode".into())]
    );

    let wrong_type = events
        .create(
            &pp,
            &event(
                "e1",
                json!({"bindingNode": 3, "transitionName": "drain", "priority": 11}),
            ),
        )
        .await
        .unwrap_err();
    let wrong_type = api_error(wrong_type);
    assert_eq!(wrong_type.code, 422);
    assert_eq!(
        causes(&wrong_type),
        [
            ("FieldValueTypeInvalid".into(), "spec.bindingNode".into()),
            ("FieldValueInvalid".into(), "spec.priority".into()),
        ]
    );
    assert!(
        wrong_type
            .message
            .contains(r#"spec.bindingNode: Invalid value: "integer": spec.bindingNode in body must be of type string: "integer""#),
        "{}",
        wrong_type.message
    );
    assert!(events.get_opt("e1").await.unwrap().is_none());

    // Valid events are stored with their defaults; a later write must stay valid.
    let good = event(
        "e1",
        json!({"bindingNode": "n1", "transitionName": "drain"}),
    );
    let created = events.create(&pp, &good).await.unwrap();
    assert_eq!(created.data["status"]["claimStatus"], "Pending");
    let emptied = events
        .patch(
            "e1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"transitionName": ""}})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        causes(&api_error(emptied)),
        [("FieldValueInvalid".into(), "spec.transitionName".into())]
    );
    let mut replaced = events.get("e1").await.unwrap();
    replaced.data["spec"] = json!({"bindingNode": "n1"});
    let put = events.replace("e1", &pp, &replaced).await.unwrap_err();
    assert_eq!(
        causes(&api_error(put)),
        [("FieldValueRequired".into(), "spec.transitionName".into())]
    );

    // The status subresource is checked too.
    let status = events
        .patch_status(
            "e1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"claimStatus": "Done", "sla": "2026-11-27T10:00:00Z"}}),
            ),
        )
        .await
        .unwrap_err();
    let status = api_error(status);
    assert_eq!(
        causes(&status),
        [("FieldValueNotSupported".into(), "status.claimStatus".into())]
    );
    assert!(
        status
            .message
            .contains(r#"supported values: "Pending", "Claimed", "Failed", "Succeeded""#),
        "{}",
        status.message
    );
    let claimed = events
        .patch_status(
            "e1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"claimStatus": "Claimed", "sla": "2026-11-27T10:00:00Z"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(claimed.data["status"]["claimStatus"], "Claimed");
}

#[tokio::test]
async fn unknown_fields_are_refused_warned_about_or_dropped_as_field_validation_says() {
    let (api, _shutdown, events) = serving().await;
    let body = |name: &str| {
        json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "LifecycleEvent",
            "metadata": {"name": name},
            "spec": {"bindingNode": "n1", "transitionName": "drain", "foo": 1}})
    };

    let (code, _, refused) = raw(
        &api,
        "POST",
        &format!("{}?fieldValidation=Strict", collection()),
        &body("strict"),
    )
    .await;
    assert_eq!(code, 400, "{refused}");
    assert_eq!(refused["reason"], "BadRequest");
    assert_eq!(
        refused["message"],
        r#"LifecycleEvent in version "v1alpha1" cannot be handled as a LifecycleEvent: strict decoding error: unknown field "spec.foo""#
    );
    assert!(events.get_opt("strict").await.unwrap().is_none());

    // Warn is the default: the field is dropped and the answer says so.
    let (code, warnings, warned) = raw(&api, "POST", &collection(), &body("warned")).await;
    assert_eq!(code, 201, "{warned}");
    assert_eq!(warnings, [r#"299 - "unknown field \"spec.foo\"""#]);
    assert!(warned["spec"].get("foo").is_none());

    let (code, warnings, ignored) = raw(
        &api,
        "POST",
        &format!("{}?fieldValidation=Ignore", collection()),
        &body("ignored"),
    )
    .await;
    assert_eq!((code, warnings.len()), (201, 0), "{ignored}");
    assert!(
        events.get("ignored").await.unwrap().data["spec"]
            .get("foo")
            .is_none()
    );

    // A patch adding an unknown field: Strict refuses it as kube-apiserver's patcher does.
    let strict = PatchParams::default().validation_strict();
    let patched = events
        .patch(
            "warned",
            &strict,
            &Patch::Merge(json!({"spec": {"bar": true}})),
        )
        .await
        .unwrap_err();
    let patched = api_error(patched);
    assert_eq!((patched.code, patched.reason.as_str()), (422, "Invalid"));
    assert!(
        patched
            .message
            .ends_with(r#"strict decoding error: unknown field "spec.bar""#),
        "{}",
        patched.message
    );
    assert_eq!(
        causes(&patched),
        [("FieldValueInvalid".into(), "patch".into())]
    );
    let (code, warnings, _) = raw(
        &api,
        "PATCH",
        &format!("{}/warned", collection()),
        &json!({"spec": {"bar": true}}),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(warnings, [r#"299 - "unknown field \"spec.bar\"""#]);
}

#[tokio::test]
async fn server_side_apply_validates_the_result_and_refuses_undeclared_fields() {
    let (_api, _shutdown, events) = serving().await;
    let apply = PatchParams::apply("lifecycle-test");
    let config = |spec: Value| {
        json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "LifecycleEvent",
            "metadata": {"name": "e1"}, "spec": spec})
    };
    let missing = events
        .patch(
            "e1",
            &apply,
            &Patch::Apply(config(json!({"bindingNode": "n1"}))),
        )
        .await
        .unwrap_err();
    assert_eq!(
        causes(&api_error(missing)),
        [("FieldValueRequired".into(), "spec.transitionName".into())]
    );
    events
        .patch(
            "e1",
            &apply,
            &Patch::Apply(config(
                json!({"bindingNode": "n1", "transitionName": "drain"}),
            )),
        )
        .await
        .unwrap();
    let too_high = events
        .patch(
            "e1",
            &apply,
            &Patch::Apply(config(
                json!({"bindingNode": "n1", "transitionName": "drain", "priority": 99}),
            )),
        )
        .await
        .unwrap_err();
    assert_eq!(
        causes(&api_error(too_high)),
        [("FieldValueInvalid".into(), "spec.priority".into())]
    );
    let undeclared = events
        .patch(
            "e1",
            &apply,
            &Patch::Apply(config(
                json!({"bindingNode": "n1", "transitionName": "drain", "foo": 1}),
            )),
        )
        .await
        .unwrap_err();
    let undeclared = api_error(undeclared);
    assert_eq!(undeclared.code, 500);
    assert_eq!(
        undeclared.message,
        format!(
            "failed to create typed patch object (/e1; {GROUP}/v1alpha1, Kind=LifecycleEvent): .spec.foo: field not declared in schema"
        )
    );
}

#[tokio::test]
async fn updates_are_ratcheted_after_the_schema_tightens() {
    let (api, _shutdown, events) = serving().await;
    let pp = PostParams::default();
    events
        .create(
            &pp,
            &event(
                "e1",
                json!({"bindingNode": "node-long", "transitionName": "drain"}),
            ),
        )
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client("admin"));
    let mut crd = crds.get(&format!("lifecycleevents.{GROUP}")).await.unwrap();
    crd.spec = event_crd(Some(4)).spec;
    crds.replace(&format!("lifecycleevents.{GROUP}"), &pp, &crd)
        .await
        .unwrap();

    // The stored name breaks the new maxLength, but a write leaving it alone passes.
    let other = events
        .patch(
            "e1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"priority": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(other.data["spec"]["priority"], 3);
    let renamed = events
        .patch(
            "e1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"bindingNode": "node-longer"}})),
        )
        .await
        .unwrap_err();
    let renamed = api_error(renamed);
    assert_eq!(
        causes(&renamed),
        [("FieldValueTooLong".into(), "spec.bindingNode".into())]
    );
    assert!(
        renamed
            .message
            .ends_with("spec.bindingNode: Too long: may not be more than 4 bytes"),
        "{}",
        renamed.message
    );
}
