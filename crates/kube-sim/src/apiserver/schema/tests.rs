use serde_json::{Value, json};

use super::*;
use crate::apiserver::resources::Registry;

/// A schema shaped like a lifecycle-event CRD's: a required spec of non-empty strings,
/// a nullable defaulted status with an enum and a date-time.
fn event_schema() -> Value {
    json!({"type": "object", "required": ["spec"], "properties": {
        "spec": {"type": "object", "required": ["bindingNode", "transitionName"], "properties": {
            "bindingNode": {"type": "string", "minLength": 1},
            "transitionName": {"type": "string", "minLength": 1}}},
        "status": {"type": "object", "nullable": true, "default": {}, "properties": {
            "claimStatus": {"type": "string", "nullable": true, "default": "Pending",
                "enum": ["Pending", "Claimed", "Failed"]},
            "sla": {"type": "string", "nullable": true, "format": "date-time"}}}}})
}

/// (field, reason, message) of each error.
fn errors_of(schema: &Value, obj: &Value) -> Vec<(String, &'static str, String)> {
    validate(schema, obj, None)
        .into_iter()
        .map(|e| (e.field.clone(), e.kind.reason(), e.body()))
        .collect()
}

fn one(field: &str, reason: &'static str, message: &str) -> Vec<(String, &'static str, String)> {
    vec![(field.to_string(), reason, message.to_string())]
}

#[test]
fn lifecycle_event_objects_get_the_field_errors_kube_apiserver_gives() {
    let schema = event_schema();
    let spec = |s: Value| json!({"spec": s});
    let cases = [
        (spec(json!({"bindingNode": "n1", "transitionName": "drain"})), vec![]),
        (
            spec(json!({"transitionName": "drain"})),
            one("spec.bindingNode", "FieldValueRequired", "Required value"),
        ),
        (json!({}), one("spec", "FieldValueRequired", "Required value")),
        (
            spec(json!({"bindingNode": 3, "transitionName": "drain"})),
            one(
                "spec.bindingNode",
                "FieldValueTypeInvalid",
                r#"Invalid value: "integer": spec.bindingNode in body must be of type string: "integer""#,
            ),
        ),
        (
            spec(json!({"bindingNode": "", "transitionName": "drain"})),
            one(
                "spec.bindingNode",
                "FieldValueInvalid",
                r#"Invalid value: "": spec.bindingNode in body should be at least 1 chars long"#,
            ),
        ),
        (
            json!({"spec": {"bindingNode": "n", "transitionName": "d"},
                   "status": {"claimStatus": "Done", "sla": "tomorrow"}}),
            vec![
                (
                    "status.claimStatus".to_string(),
                    "FieldValueNotSupported",
                    r#"Unsupported value: "Done": supported values: "Pending", "Claimed", "Failed""#
                        .to_string(),
                ),
                (
                    "status.sla".to_string(),
                    "FieldValueTypeInvalid",
                    r#"Invalid value: "tomorrow": status.sla in body must be of type date-time: "tomorrow""#
                        .to_string(),
                ),
            ],
        ),
        // Nullable fields take null; a valid RFC 3339 time passes.
        (
            json!({"spec": {"bindingNode": "n", "transitionName": "d"},
                   "status": {"claimStatus": "Claimed", "sla": "2026-11-27T10:00:00.5+01:00",
                              "driver": null}}),
            vec![],
        ),
        // A nullable enum still refuses null unless the enum lists it (kube-openapi's
        // `basicCommonValidator` runs on null values too).
        (
            json!({"spec": {"bindingNode": "n", "transitionName": "d"},
                   "status": {"claimStatus": null}}),
            one(
                "status.claimStatus",
                "FieldValueNotSupported",
                r#"Unsupported value: null: supported values: "Pending", "Claimed", "Failed""#,
            ),
        ),
        (
            json!({"spec": "n1"}),
            one(
                "spec",
                "FieldValueTypeInvalid",
                r#"Invalid value: "string": spec in body must be of type object: "string""#,
            ),
        ),
    ];
    for (obj, expected) in cases {
        assert_eq!(errors_of(&schema, &obj), expected, "{obj}");
    }
}

#[test]
fn value_keywords_are_checked_with_kube_openapi_wording() {
    let cases = [
        (
            json!({"type": "integer", "minimum": 1, "maximum": 10}),
            json!(11),
            (
                "FieldValueInvalid",
                "Invalid value: 11: x in body should be less than or equal to 10",
            ),
        ),
        (
            json!({"type": "integer", "minimum": 1, "exclusiveMinimum": true}),
            json!(1),
            (
                "FieldValueInvalid",
                "Invalid value: 1: x in body should be greater than 1",
            ),
        ),
        (
            json!({"type": "number", "maximum": 1.5}),
            json!(2.25),
            (
                "FieldValueInvalid",
                "Invalid value: 2.25: x in body should be less than or equal to 1.5",
            ),
        ),
        (
            json!({"type": "integer", "multipleOf": 5}),
            json!(12),
            (
                "FieldValueInvalid",
                "Invalid value: 12: x in body should be a multiple of 5",
            ),
        ),
        (
            json!({"type": "string", "maxLength": 3}),
            json!("four"),
            (
                "FieldValueTooLong",
                "Too long: may not be more than 3 bytes",
            ),
        ),
        (
            json!({"type": "string", "pattern": "^[0-9]+(s|m)$"}),
            json!("5h"),
            (
                "FieldValueInvalid",
                r#"Invalid value: "5h": x in body should match '^[0-9]+(s|m)$'"#,
            ),
        ),
        (
            json!({"type": "array", "items": {"type": "string"}, "maxItems": 1}),
            json!(["a", "b"]),
            ("FieldValueTooMany", "Too many: 2: must have at most 1 item"),
        ),
        (
            json!({"type": "array", "items": {"type": "string"}, "minItems": 1}),
            json!([]),
            (
                "FieldValueInvalid",
                "Invalid value: 0: x in body should have at least 1 items",
            ),
        ),
        (
            json!({"type": "object", "maxProperties": 1}),
            json!({"a": 1, "b": 2}),
            ("FieldValueTooMany", "Too many: 2: must have at most 1 item"),
        ),
        (
            json!({"type": "string"}),
            json!(null),
            (
                "FieldValueTypeInvalid",
                r#"Invalid value: "null": x in body must be of type string: "null""#,
            ),
        ),
        (
            json!({"x-kubernetes-int-or-string": true}),
            json!(true),
            (
                "FieldValueTypeInvalid",
                r#"Invalid value: "boolean": x in body must be of type integer,string: "boolean""#,
            ),
        ),
        (
            json!({"type": "integer", "format": "int32"}),
            json!(3_000_000_000_i64),
            (
                "FieldValueInvalid",
                r#"Invalid value: "": Checked value must be of type integer with format int32 in x"#,
            ),
        ),
        (
            json!({"type": "string", "format": "date-time"}),
            json!(5),
            (
                "FieldValueTypeInvalid",
                r#"Invalid value: "int64": x in body must be of type date-time: "int64""#,
            ),
        ),
        (
            json!({"type": "integer", "enum": [1, 2]}),
            json!(3),
            (
                "FieldValueNotSupported",
                r#"Unsupported value: 3: supported values: "1", "2""#,
            ),
        ),
    ];
    for (property, value, (reason, message)) in cases {
        let schema = json!({"type": "object", "properties": {"x": property}});
        let errors = errors_of(&schema, &json!({"x": value}));
        let field = if reason == "FieldValueInvalid" && message.contains("Checked") {
            "<nil>"
        } else {
            "x"
        };
        assert_eq!(errors, one(field, reason, message), "{property} {value}");
    }
}

#[test]
fn valid_values_pass_every_keyword() {
    let schema = json!({"type": "object", "properties": {
        "count": {"type": "integer", "minimum": 0, "maximum": 10, "multipleOf": 2},
        "ratio": {"type": "number", "minimum": 0.5},
        "port": {"x-kubernetes-int-or-string": true},
        "name": {"type": "string", "format": "k8s-short-name", "maxLength": 63},
        "id": {"type": "string", "format": "uuid"},
        "day": {"type": "string", "format": "date"},
        "net": {"type": "string", "format": "cidr"},
        "sla": {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "any": {"x-kubernetes-preserve-unknown-fields": true}}});
    let obj = json!({"count": 4, "ratio": 2, "port": "http", "name": "web-1",
        "id": "0d7a4c1e-4f4b-4c39-9d7e-8a0f3b1e2c44", "day": "2024-02-29",
        "net": "10.0.0.0/8", "sla": "1m30s", "labels": {"app": "web"},
        "any": {"whatever": [1, "two"]}});
    assert_eq!(errors_of(&schema, &obj), vec![]);
    let bad = json!({"count": 4.0, "day": "2023-02-29", "labels": {"app": 1}, "port": 8080});
    let fields: Vec<String> = errors_of(&schema, &bad).into_iter().map(|e| e.0).collect();
    assert_eq!(fields, ["day", "labels.app"]);
}

#[test]
fn constraints_outside_the_numeric_type_are_reported_and_compared_as_floats() {
    let schema = json!({"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0.5},
        "f": {"type": "number", "format": "float", "maximum": 1e40}}});
    assert_eq!(
        errors_of(&schema, &json!({"n": 0, "f": 1e39})),
        vec![
            (
                "<nil>".to_string(),
                "FieldValueInvalid",
                r#"Invalid value: "": Checked value must be of type number with format float in f"#
                    .to_string()
            ),
            (
                "<nil>".to_string(),
                "FieldValueInvalid",
                r#"Invalid value: "": Maximum boundary value must be of type number with format float in f"#
                    .to_string()
            ),
            (
                "<nil>".to_string(),
                "FieldValueInvalid",
                r#"Invalid value: "": Minimum boundary value must be of type integer (default format) in n"#
                    .to_string()
            ),
            (
                "n".to_string(),
                "FieldValueInvalid",
                "Invalid value: 0: n in body should be greater than or equal to 0.5".to_string()
            ),
        ]
    );
}

#[test]
fn list_items_are_validated_at_indexed_paths() {
    let schema = json!({"type": "object", "properties": {"terms": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "properties": {
            "key": {"type": "string"}, "operator": {"type": "string"}}}}}});
    let obj = json!({"terms": [{"key": "a", "operator": "In"}, {"key": "b"}]});
    assert_eq!(
        errors_of(&schema, &obj),
        one("terms[1].operator", "FieldValueRequired", "Required value")
    );
}

#[test]
fn updates_are_ratcheted_on_unchanged_parts_only() {
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "size": {"type": "integer", "maximum": 3},
            "name": {"type": "string", "maxLength": 3},
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "port": {"type": "integer", "maximum": 100}}}},
            "atomic": {"type": "array", "items": {"type": "integer", "maximum": 1}}}}}});
    let old = json!({"spec": {"size": 9, "name": "long", "ports": [{"name": "a", "port": 500}],
        "atomic": [5]}});
    // The stored object broke today's schema; changing other fields is fine.
    let mut new = old.clone();
    new["spec"]["name"] = json!("abc");
    new["spec"]["ports"] = json!([{"name": "b", "port": 1}, {"name": "a", "port": 500}]);
    assert_eq!(validate(&schema, &new, Some(&old)), vec![]);
    // Changing a bad field itself is checked, and atomic list items never correlate.
    new["spec"]["size"] = json!(8);
    let fields: Vec<String> = validate(&schema, &new, Some(&old))
        .into_iter()
        .map(|e| e.field)
        .collect();
    assert_eq!(fields, ["spec.size"]);
    new["spec"]["atomic"] = json!([5, 0]);
    let fields: Vec<String> = validate(&schema, &new, Some(&old))
        .into_iter()
        .map(|e| e.field)
        .collect();
    assert_eq!(fields, ["spec.atomic[0]", "spec.size"]);
}

#[test]
fn pruning_reports_unknown_fields_sorted_after_metadata_ones() {
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"known": {"type": "object", "properties": {}}}},
            "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                "properties": {"spec": {"type": "object"}}}}}}});
    let mut obj = json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "colour": "red"},
        "spec": {"zeta": 1, "alpha": 2, "items": [{"name": "a", "extra": true}],
            "labels": {"any": "thing"},
            "raw": {"kept": 1, "known": {"dropped": 1}},
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {}, "status": {}}},
        "status": {"phase": "x"}});
    let unknown = prune(&schema, &mut obj);
    assert_eq!(
        unknown,
        [
            "metadata.colour",
            "spec.alpha",
            "spec.items[0].extra",
            "spec.raw.known.dropped",
            "spec.template.status",
            "spec.zeta",
            "status",
        ]
    );
    assert_eq!(
        obj,
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"items": [{"name": "a"}], "labels": {"any": "thing"},
                "raw": {"kept": 1, "known": {}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "spec": {}}}})
    );
}

#[test]
fn nulls_go_unless_nullable_or_defaulted() {
    let schema = event_schema();
    let mut obj = json!({"spec": {"bindingNode": null, "transitionName": "d"},
        "status": {"claimStatus": null, "sla": null}, "other": null, "list": [null]});
    drop_nulls(Some(&schema), &mut obj);
    assert_eq!(
        obj,
        json!({"spec": {"transitionName": "d"}, "status": {"claimStatus": null, "sla": null},
            "other": null, "list": [null]})
    );
}

#[test]
fn refusals_read_like_new_invalid() {
    let registry = Registry::default();
    registry.install_crd(
        &json!({"spec": {"group": "lifecycle.example.io", "scope": "Cluster",
        "names": {"plural": "lifecycleevents", "kind": "LifecycleEvent"},
        "versions": [{"name": "v1alpha1", "served": true,
            "schema": {"openAPIV3Schema": event_schema()}}]}}),
    );
    let def = registry
        .find("lifecycle.example.io", "v1alpha1", "lifecycleevents")
        .unwrap();
    let obj = json!({"metadata": {"name": "e1"}, "spec": {"bindingNode": 7}});
    let error = check(&def, &obj, None).unwrap_err();
    assert_eq!(error.code, 422);
    assert_eq!(
        error.message,
        "LifecycleEvent.lifecycle.example.io \"e1\" is invalid: [spec.bindingNode: Invalid value: \"integer\": spec.bindingNode in body must be of type string: \"integer\", spec.transitionName: Required value]"
    );
    let status = error.to_status();
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(
        status["details"],
        json!({"name": "e1", "group": "lifecycle.example.io", "kind": "LifecycleEvent",
            "causes": [
                {"reason": "FieldValueTypeInvalid", "field": "spec.bindingNode",
                 "message": "Invalid value: \"integer\": spec.bindingNode in body must be of type string: \"integer\""},
                {"reason": "FieldValueRequired", "field": "spec.transitionName",
                 "message": "Required value"}]})
    );
    let valid = json!({"metadata": {"name": "e1"},
        "spec": {"bindingNode": "n1", "transitionName": "drain"}});
    assert!(check(&def, &valid, None).is_ok());
}

#[test]
fn floats_print_like_go() {
    let cases = [
        (1_000_000.0, "1e+06"),
        (100_000.0, "100000"),
        (1_234_567.0, "1.234567e+06"),
        (10.5, "10.5"),
        (0.0001, "0.0001"),
        (0.000_015, "1.5e-05"),
        (-3.25, "-3.25"),
        (2.0, "2"),
    ];
    for (f, printed) in cases {
        assert_eq!(go_float(f), printed, "{f}");
    }
}
