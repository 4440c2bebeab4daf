//! Field validation the registry runs on every create and update of a kind, after
//! defaulting and mutating admission, before the object is stored. Only the rules of
//! kinds its clients have been seen to trip over are modelled; an object they refuse is a 422 that
//! names it, as upstream answers, and nothing is stored.

use serde_json::Value;

use super::meta::meta_str;
use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};

/// Validates `obj` of kind `def`; `Ok` for kinds without modelled rules.
pub(crate) fn validate(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    let problems = match def.kind.as_str() {
        "PodDisruptionBudget" => pdb_spec(&obj["spec"]),
        "Event" if def.group.is_empty() => event(obj),
        _ => Vec::new(),
    };
    if problems.is_empty() {
        return Ok(());
    }
    let name = meta_str(obj, "name");
    let kind = if def.group.is_empty() {
        def.kind.clone()
    } else {
        format!("{}.{}", def.kind, def.group)
    };
    Err(ApiError::invalid(
        &def.group,
        &kind,
        name,
        problems.join(", "),
    ))
}

/// pkg/apis/core/validation/events.go `legacyValidateEvent`, which every core/v1 Event
/// passes on create and update: an Event with an `eventTime` (what our components post)
/// may carry a reason of at most 128 bytes and a message of at most 1024
/// (`ReasonLengthLimit`, `NoteLengthLimit`); upstream prints the value as empty.
fn event(obj: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if obj["eventTime"].is_null() {
        return problems;
    }
    for (field, limit) in [("reason", 128), ("message", 1024)] {
        if obj[field].as_str().is_some_and(|v| v.len() > limit) {
            problems.push(format!(
                "{field}: Invalid value: \"\": can have at most {limit} characters"
            ));
        }
    }
    problems
}

/// pkg/apis/policy/validation/validation.go `ValidatePodDisruptionBudgetSpec`: at most
/// one of minAvailable and maxUnavailable, each a non-negative integer or a percentage
/// of at most 100%.
fn pdb_spec(spec: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let min = &spec["minAvailable"];
    let max = &spec["maxUnavailable"];
    if !min.is_null() && !max.is_null() {
        problems
            .push("spec: Invalid value: minAvailable and maxUnavailable cannot be both set".into());
    }
    for (field, value) in [("minAvailable", min), ("maxUnavailable", max)] {
        if let Some(problem) = int_or_percent(value) {
            problems.push(format!("spec.{field}: Invalid value: {value}: {problem}"));
        }
    }
    problems
}

/// `ValidatePositiveIntOrPercent` plus `IsNotMoreThan100Percent`.
fn int_or_percent(value: &Value) -> Option<&'static str> {
    match value {
        Value::Null => None,
        Value::Number(n) => match n.as_i64() {
            Some(i) if i >= 0 => None,
            _ => Some("must be greater than or equal to 0"),
        },
        Value::String(s) => match s.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) if (0..=100).contains(&p) => None,
            Some(Ok(p)) if p < 0 => Some("must be greater than or equal to 0"),
            Some(Ok(_)) => Some("must not be greater than 100%"),
            _ => Some("a valid percent string must be a numeric string followed by an ending '%'"),
        },
        _ => Some("must be an integer or percentage"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pdb_specs_are_refused_like_validate_pod_disruption_budget_spec() {
        let cases = [
            (json!({"minAvailable": 2}), 0),
            (json!({"maxUnavailable": "25%"}), 0),
            (json!({}), 0),
            (json!({"minAvailable": 2, "maxUnavailable": 1}), 1),
            (json!({"minAvailable": -1}), 1),
            (json!({"maxUnavailable": "120%"}), 1),
            (json!({"maxUnavailable": "ten"}), 1),
            (json!({"minAvailable": "-5%", "maxUnavailable": 1}), 2),
        ];
        for (spec, expected) in cases {
            assert_eq!(pdb_spec(&spec).len(), expected, "{spec}");
        }
    }

    #[test]
    fn new_style_events_are_refused_over_the_note_and_reason_limits() {
        let long = "x".repeat(1025);
        let cases = [
            (
                json!({"eventTime": "2026-11-27T00:00:00.000000Z", "reason": "Drained", "message": "ok"}),
                0,
            ),
            (
                json!({"eventTime": "2026-11-27T00:00:00.000000Z", "reason": "Drained", "message": long}),
                1,
            ),
            (
                json!({"eventTime": "2026-11-27T00:00:00.000000Z", "reason": "r".repeat(129), "message": long}),
                2,
            ),
            // Old-style Events (no eventTime) skip these limits.
            (json!({"reason": "Drained", "message": long}), 0),
        ];
        for (event_json, expected) in cases {
            assert_eq!(event(&event_json).len(), expected, "{event_json}");
        }
    }
}
