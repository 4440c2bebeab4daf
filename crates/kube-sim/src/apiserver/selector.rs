//! Label and field selectors as the API server parses them from `labelSelector` and
//! `fieldSelector` query parameters, and their evaluation against stored objects.
//!
//! Label selectors support `=`, `==`, `!=`, `in (..)`, `notin (..)`, `key` and `!key`;
//! field selectors support `=`, `==` and `!=` on the fields a resource declares.

use serde_json::Value;

use kube::core::{Selector, SelectorExt};

use crate::selector::{json_labels, parse_label_selector};

/// A parsed label selector (all requirements must hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(pub Selector);

/// One parsed field requirement: path, expected value, and whether it is negated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldReq {
    pub path: String,
    pub value: String,
    pub negated: bool,
}

/// A parsed field selector (all requirements must hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(pub Vec<FieldReq>);

impl LabelSelector {
    /// Parses the `labelSelector` query syntax.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        parse_label_selector(s).map(Self)
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0
            .matches(&json_labels(obj.pointer("/metadata/labels")))
    }
}

pub(crate) use crate::selector::selector_object_matches;

impl FieldSelector {
    /// Parses the `fieldSelector` query syntax, accepting only the paths in `allowed`
    /// (plus `metadata.name` and `metadata.namespace`).
    pub(crate) fn parse(s: &str, allowed: &[String]) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for term in s.split(',') {
            let (path, value, negated) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, true)
            } else if let Some((p, v)) = term.split_once("==") {
                (p, v, false)
            } else if let Some((p, v)) = term.split_once('=') {
                (p, v, false)
            } else {
                return Err(format!("invalid selector: {term:?}; can't understand"));
            };
            let path = path.trim();
            let known = matches!(path, "metadata.name" | "metadata.namespace")
                || allowed.iter().any(|a| a == path);
            if !known {
                return Err(format!("field label not supported: {path}"));
            }
            reqs.push(FieldReq {
                path: path.to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(Self(reqs))
    }

    /// Whether the object satisfies every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|r| (field_value(obj, &r.path) == r.value) != r.negated)
    }
}

/// The string value of a field path the way the API server's field sets render it:
/// missing strings are empty, missing booleans are `false`.
pub(crate) fn field_value(obj: &Value, path: &str) -> String {
    let pointer = format!("/{}", path.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => String::new(),
        None if matches!(path, "spec.unschedulable" | "spec.hostNetwork") => "false".into(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, PodFixture, to_json};

    /// Pod `ns/p` on node `n1` with these labels, as the store holds it.
    fn pod(labels: &[(&str, &str)]) -> Value {
        to_json(
            &fixtures::pod("p")
                .ns("ns")
                .with_labels(labels)
                .on_node("n1"),
        )
    }

    #[test]
    fn label_selector_operators() {
        let obj = pod(&[("app", "web"), ("tier", "front")]);
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, api)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing!=x", true),
            ("app=web,tier in (front,back)", true),
            ("app=web,tier=back", false),
            ("", true),
        ];
        for (sel, want) in cases {
            let parsed = LabelSelector::parse(sel).unwrap();
            assert_eq!(parsed.matches(&obj), want, "selector {sel:?}");
        }
    }

    #[test]
    fn field_selector_rejects_unknown_fields() {
        let allowed = vec!["spec.nodeName".to_string()];
        let sel = FieldSelector::parse("spec.nodeName=n1,metadata.namespace!=x", &allowed).unwrap();
        assert!(sel.matches(&pod(&[])));
        let err = FieldSelector::parse("spec.bogus=1", &allowed).unwrap_err();
        assert!(err.contains("spec.bogus"), "{err}");
    }
}
