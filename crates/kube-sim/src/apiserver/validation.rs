//! Field validation the registry runs on every create and update of a kind, after
//! defaulting and mutating admission, before the object is stored. Only the rules of
//! kinds graceful-drain depends on are modelled; an object they refuse is a 422 that
//! names it, as upstream answers, and nothing is stored.

use serde_json::Value;

use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};
use super::write::meta_str;

/// Validates `obj` of kind `def`; `Ok` for kinds without modelled rules.
pub(crate) fn validate(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    let problems = match def.kind.as_str() {
        "PodDisruptionBudget" => pdb_spec(&obj["spec"]),
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
}
