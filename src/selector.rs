//! Label selectors: one matcher, kube-core's [`Selector`], for every form a selector takes
//! here — a typed `metav1.LabelSelector` (ReplicaSets, PodDisruptionBudgets), the same
//! object as JSON (the simulated API server's PDB and webhook selectors) and the
//! `labelSelector` query syntax (which the simulated API server parses into a [`Selector`]).
//!
//! A selector that Kubernetes would reject (an unknown operator, `In`/`NotIn` without
//! values) selects nothing.

use std::collections::BTreeMap;

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
