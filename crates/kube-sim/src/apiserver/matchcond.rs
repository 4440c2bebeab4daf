//! Webhook `matchConditions`: CEL expressions over `request`, `object` and `oldObject`
//! that decide whether a webhook is called at all, evaluated with the `cel` crate.
//!
//! Semantics follow upstream's matcher
//! (`staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions/matcher.go`):
//! any condition that evaluates to `false` skips the webhook; otherwise, if any condition
//! failed to evaluate (or did not yield a bool), failurePolicy decides — `Fail` fails the
//! request without calling the webhook, `Ignore` skips it; all `true` calls it.

use serde_json::Value;

/// The outcome of a webhook's match conditions.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Match {
    /// Every condition held (or there are none): call the webhook.
    Call,
    /// A condition was false (its name), or an error under failurePolicy Ignore.
    Skip,
    /// Evaluation failed under failurePolicy Fail: the request fails with this message.
    Error(String),
}

/// Evaluates `conditions` (the webhook's `matchConditions` list) against the review's
/// `request` (with `object` and `oldObject` also bound at top level, like upstream).
pub(crate) fn evaluate(conditions: Option<&Value>, request: &Value, fails_closed: bool) -> Match {
    let Some(list) = conditions
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
    else {
        return Match::Call;
    };
    let mut errors = Vec::new();
    for condition in list {
        let name = condition.get("name").and_then(Value::as_str).unwrap_or("");
        let expression = condition
            .get("expression")
            .and_then(Value::as_str)
            .unwrap_or("");
        match eval_bool(expression, request) {
            Ok(false) => return Match::Skip,
            Ok(true) => {}
            Err(e) => errors.push(format!("expression '{name}' resulted in error: {e}")),
        }
    }
    match (errors.is_empty(), fails_closed) {
        (true, _) => Match::Call,
        (false, true) => Match::Error(errors.join(", ")),
        (false, false) => Match::Skip,
    }
}

/// Evaluates one expression to a bool.
fn eval_bool(expression: &str, request: &Value) -> Result<bool, String> {
    let program = cel::Program::compile(expression).map_err(|e| format!("compilation: {e}"))?;
    let mut context = cel::Context::default();
    let null = Value::Null;
    for (name, value) in [
        ("request", request),
        ("object", request.get("object").unwrap_or(&null)),
        ("oldObject", request.get("oldObject").unwrap_or(&null)),
    ] {
        let value = cel::to_value(value).map_err(|e| format!("bind {name}: {e}"))?;
        context.add_variable_from_value(name, value);
    }
    match program.execute(&context).map_err(|e| e.to_string())? {
        cel::Value::Bool(b) => Ok(b),
        other => Err(format!(
            "expected a bool, got {:?}",
            other.type_of().to_string()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(user: &str, namespace: &str, labels: Value) -> Value {
        json!({
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "namespace": namespace,
            "object": {"metadata": {"name": "web-1", "labels": labels}},
            "oldObject": null,
        })
    }

    fn one(expression: &str) -> Value {
        json!([{"name": "c", "expression": expression}])
    }

    #[test]
    fn common_chart_expressions_evaluate_like_cel_go() {
        let req = request(
            "system:serviceaccount:gd:graceful-drain",
            "default",
            json!({"app": "web"}),
        );
        let cases = [
            (
                r#"request.userInfo.username != "system:serviceaccount:gd:graceful-drain""#,
                false,
            ),
            (
                r#"!(request.userInfo.username in ["system:kube-scheduler", "admin"])"#,
                true,
            ),
            (
                r#"has(object.metadata.labels) && object.metadata.labels.app == "web""#,
                true,
            ),
            (r#"has(object.metadata.annotations)"#, false),
            (r#"request.namespace != 'kube-system'"#, true),
            (r#"object.metadata.name.startsWith("web-") || false"#, true),
            (r#"'system:authenticated' in request.userInfo.groups"#, true),
        ];
        for (expression, want) in cases {
            let got = evaluate(Some(&one(expression)), &req, true);
            let want = if want { Match::Call } else { Match::Skip };
            assert_eq!(got, want, "{expression}");
        }
    }

    #[test]
    fn evaluation_errors_obey_the_failure_policy() {
        // DELETE: object is null, so object.metadata cannot be selected.
        let req = json!({"userInfo": {"username": "admin"}, "object": null});
        let broken = one("object.metadata.name == 'x'");
        assert!(matches!(
            evaluate(Some(&broken), &req, true),
            Match::Error(_)
        ));
        assert_eq!(evaluate(Some(&broken), &req, false), Match::Skip);
        let not_bool = one("request.userInfo.username");
        assert!(matches!(
            evaluate(Some(&not_bool), &req, true),
            Match::Error(_)
        ));
        // A false condition wins over an error in another one.
        let mixed = json!([{"name": "a", "expression": "object.metadata.name == 'x'"},
                           {"name": "b", "expression": "false"}]);
        assert_eq!(evaluate(Some(&mixed), &req, true), Match::Skip);
        assert_eq!(evaluate(None, &req, true), Match::Call);
    }
}
