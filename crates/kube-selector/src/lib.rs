//! Label selectors in the three forms they arrive: a typed `metav1.LabelSelector`
//! (ReplicaSets, Jobs, PodDisruptionBudgets), the same object held as JSON (a simulated
//! API server's store: PDB, webhook namespace and object selectors), and the
//! `labelSelector` query syntax (a LIST or WATCH parameter, the node agent's eviction
//! tiers).
//!
//! All three become kube-core's [`Selector`], the one matcher; kube-core has no parser
//! for the query syntax, so it is here, once, for the product and the simulated cluster
//! alike (which depends on nothing of the product). As in Kubernetes, a
//! selector that cannot be valid (an unknown operator, `In` without values) selects
//! nothing, while an absent or empty selector object selects everything.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
pub use kube::core::{Expression, Selector, SelectorExt};
use serde_json::Value;

/// Whether `labels` satisfy a typed label selector.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    match Selector::try_from(selector.clone()) {
        Ok(selector) => selector.matches(labels),
        Err(_) => false,
    }
}

/// [`selector_matches`] for a selector and a label map held as JSON: an absent or `null`
/// selector selects everything, one that is not a `LabelSelector` nothing.
pub fn selector_object_matches(selector: Option<&Value>, labels: Option<&Value>) -> bool {
    match selector {
        None | Some(Value::Null) => true,
        Some(selector) => serde_json::from_value::<LabelSelector>(selector.clone())
            .is_ok_and(|selector| selector_matches(&selector, &json_labels(labels))),
    }
}

/// The entries of a JSON label map whose values are strings.
pub fn json_labels(labels: Option<&Value>) -> BTreeMap<String, String> {
    let Some(Value::Object(map)) = labels else {
        return BTreeMap::new();
    };
    map.iter()
        .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
        .collect()
}

/// Parses the `labelSelector` query syntax: comma-separated requirements `k=v`, `k==v`,
/// `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` and `!k`. Blank selects everything.
pub fn parse_label_selector(query: &str) -> Result<Selector, String> {
    if query.trim().is_empty() {
        return Ok(Selector::default());
    }
    requirements(query).into_iter().map(requirement).collect()
}

/// The top-level terms of a selector: commas inside `( )` belong to a set.
fn requirements(query: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut from) = (0usize, 0);
    for (at, c) in query.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&query[from..at]);
                from = at + 1;
            }
            _ => {}
        }
    }
    terms.push(&query[from..]);
    terms
}

fn requirement(term: &str) -> Result<Expression, String> {
    let term = term.trim();
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(label_key(key)?));
    }
    for (op, negated) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = term.split_once(op) {
            let (key, value) = (label_key(key)?, value.trim().to_string());
            return Ok(if negated {
                Expression::NotEqual(key, value)
            } else {
                Expression::Equal(key, value)
            });
        }
    }
    set_requirement(term)
}

/// `key`, `key in (..)` or `key notin (..)`.
fn set_requirement(term: &str) -> Result<Expression, String> {
    let (key, rest) = term
        .split_once(char::is_whitespace)
        .map_or((term, ""), |(key, rest)| (key, rest.trim_start()));
    let key = label_key(key)?;
    if rest.is_empty() {
        Ok(Expression::Exists(key))
    } else if let Some(set) = rest.strip_prefix("notin") {
        Ok(Expression::NotIn(key, value_set(set)?))
    } else if let Some(set) = rest.strip_prefix("in") {
        Ok(Expression::In(key, value_set(set)?))
    } else {
        Err(format!("unable to parse requirement {term:?}"))
    }
}

fn label_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        Err(format!("invalid label key {key:?}"))
    } else {
        Ok(key.to_string())
    }
}

/// `(a, b)` as a set of values.
fn value_set(set: &str) -> Result<BTreeSet<String>, String> {
    let set = set.trim();
    let inner = set
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, got {set:?}"))?;
    Ok(inner
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(String::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_selectors_match_like_typed_ones() {
        let labels = json!({"a": "1", "n": 2});
        let sel = json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]},
                                               {"key": "b", "operator": "DoesNotExist"}]});
        assert!(selector_object_matches(Some(&sel), Some(&labels)));
        assert!(!selector_object_matches(
            Some(&json!({"matchLabels": {"a": "2"}})),
            Some(&labels)
        ));
        assert!(!selector_object_matches(
            Some(&json!({"matchLabels": {"n": "2"}})),
            Some(&labels)
        ));
        let bad = json!({"matchExpressions": [{"key": "a", "operator": "Near"}]});
        assert!(!selector_object_matches(Some(&bad), Some(&labels)));
        assert!(selector_object_matches(None, None));
        assert!(selector_object_matches(Some(&Value::Null), None));
    }

    #[test]
    fn query_syntax_errors_name_the_term() {
        assert!(parse_label_selector("").is_ok());
        assert!(parse_label_selector("a in (x, y),!b").is_ok());
        let err = parse_label_selector("a in x").unwrap_err();
        assert!(err.contains("parenthesised"), "{err}");
        let err = parse_label_selector("a b").unwrap_err();
        assert!(err.contains("a b"), "{err}");
        let err = parse_label_selector("=x").unwrap_err();
        assert!(err.contains("label key"), "{err}");
        assert!(parse_label_selector("a=1,").is_err());
    }
}
