//! Label selectors: one matcher, kube-core's [`Selector`], for every form a selector takes
//! here — a typed `metav1.LabelSelector` (ReplicaSets, PodDisruptionBudgets), the same
//! object as JSON (the simulated API server's PDB and webhook selectors) and the
//! `labelSelector` query syntax ([`parse_label_selector`]: the simulated API server's LIST
//! parameters, the node agent's eviction tiers).
//!
//! A selector that Kubernetes would reject (an unknown operator, `In`/`NotIn` without
//! values) selects nothing.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
pub use kube::core::{Expression, Selector, SelectorExt};
use serde_json::Value;

/// Whether `labels` satisfy `selector` (matchLabels and matchExpressions; an empty
/// selector matches everything, as in a ReplicaSet or PodDisruptionBudget).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

/// [`selector_matches`] for a selector and labels held as JSON. `None` or `null` selects
/// everything; a selector that is not a `LabelSelector` selects nothing. Label values that
/// are not strings are ignored.
pub fn selector_object_matches(selector: Option<&Value>, labels: Option<&Value>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_null()) else {
        return true;
    };
    let Ok(selector) = serde_json::from_value::<LabelSelector>(selector.clone()) else {
        return false;
    };
    selector_matches(&selector, &json_labels(labels))
}

/// Parses the `labelSelector` query syntax (`=`, `==`, `!=`, `in (..)`, `notin (..)`,
/// `key`, `!key`, comma-separated); the empty string selects everything.
pub fn parse_label_selector(s: &str) -> Result<Selector, String> {
    if s.trim().is_empty() {
        return Ok(Selector::default());
    }
    split_top_level(s)
        .into_iter()
        .map(parse_label_req)
        .collect()
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_set(rest: &str) -> Result<BTreeSet<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, got {rest:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn valid_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(key.to_string())
}

fn parse_label_req(term: &str) -> Result<Expression, String> {
    let term = term.trim();
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(valid_key(key)?));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Expression::NotEqual(
            valid_key(key)?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = term.split_once("==") {
        return Ok(Expression::Equal(valid_key(key)?, value.trim().to_string()));
    }
    if let Some((key, value)) = term.split_once('=') {
        return Ok(Expression::Equal(valid_key(key)?, value.trim().to_string()));
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    if rest.is_empty() {
        return Ok(Expression::Exists(valid_key(key)?));
    }
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok(Expression::NotIn(valid_key(key)?, parse_set(set)?));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok(Expression::In(valid_key(key)?, parse_set(set)?));
    }
    Err(format!("unable to parse requirement {term:?}"))
}

/// The string-valued entries of a JSON label map.
pub fn json_labels(labels: Option<&Value>) -> BTreeMap<String, String> {
    labels
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn object_selector_expressions() {
        let labels = json!({"a": "1"});
        let sel = json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]},
                                               {"key": "b", "operator": "DoesNotExist"}]});
        assert!(selector_object_matches(Some(&sel), Some(&labels)));
        let sel = json!({"matchLabels": {"a": "2"}});
        assert!(!selector_object_matches(Some(&sel), Some(&labels)));
        assert!(selector_object_matches(None, None));
    }
}
