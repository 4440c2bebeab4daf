//! Whether a LifecycleTransition applies to a node: `nodeName`, `allNodes: true`, or a
//! one-term `nodeSelector` evaluated like the scheduler evaluates node affinity terms.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm};

use graceful_drain_core::lifecycle::LifecycleTransitionSpec;

/// True when the transition targets `node`.
pub fn targets(spec: &LifecycleTransitionSpec, node: &Node) -> bool {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if spec.all_nodes == Some(true) {
        return true;
    }
    if let Some(wanted) = &spec.node_name {
        return wanted == name;
    }
    let Some(selector) = &spec.node_selector else {
        return false;
    };
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, labels, name))
}

fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches no objects (core/v1 NodeSelectorTerm).
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(name);
            requirement_matches(r, value)
        })
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match (req.operator.as_str(), value) {
        ("In", Some(v)) => values.iter().any(|w| w == v),
        ("NotIn", Some(v)) => !values.iter().any(|w| w == v),
        ("NotIn", None) | ("DoesNotExist", None) | ("Exists", Some(_)) => true,
        ("Gt", Some(v)) | ("Lt", Some(v)) => {
            let (Some(have), Some(bound)) = (number(v), values.first().and_then(|w| number(w)))
            else {
                return false;
            };
            if req.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use graceful_drain_testing::fixtures::NodeFixture;
    use k8s_openapi::api::core::v1::NodeSelector;

    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        graceful_drain_testing::fixtures::node(name).with_labels(labels)
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn selector(
        exprs: Vec<NodeSelectorRequirement>,
        fields: Vec<NodeSelectorRequirement>,
    ) -> LifecycleTransitionSpec {
        LifecycleTransitionSpec {
            node_selector: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(exprs),
                    match_fields: Some(fields),
                }],
            }),
            ..LifecycleTransitionSpec::default()
        }
    }

    #[test]
    fn targets_by_name_all_nodes_and_selector() {
        let n = node("worker-1", &[("pool", "web"), ("gen", "5")]);
        let by_name = |name: &str| LifecycleTransitionSpec {
            node_name: Some(name.into()),
            ..LifecycleTransitionSpec::default()
        };
        assert!(targets(&by_name("worker-1"), &n));
        assert!(!targets(&by_name("worker-2"), &n));
        let all = LifecycleTransitionSpec {
            all_nodes: Some(true),
            ..LifecycleTransitionSpec::default()
        };
        assert!(targets(&all, &n));
        assert!(
            !targets(&LifecycleTransitionSpec::default(), &n),
            "no target at all"
        );
        let cases = [
            (vec![req("pool", "In", &["web", "db"])], vec![], true),
            (vec![req("pool", "NotIn", &["web"])], vec![], false),
            (vec![req("zone", "NotIn", &["a"])], vec![], true),
            (vec![req("pool", "Exists", &[])], vec![], true),
            (vec![req("zone", "DoesNotExist", &[])], vec![], true),
            (vec![req("gen", "Gt", &["4"])], vec![], true),
            (vec![req("gen", "Lt", &["4"])], vec![], false),
            (vec![req("pool", "Gt", &["4"])], vec![], false),
            (
                vec![],
                vec![req("metadata.name", "In", &["worker-1"])],
                true,
            ),
            (
                vec![req("pool", "In", &["web"])],
                vec![req("metadata.name", "In", &["other"])],
                false,
            ),
            (vec![], vec![], false),
        ];
        for (exprs, fields, want) in cases {
            let spec = selector(exprs.clone(), fields.clone());
            assert_eq!(targets(&spec, &n), want, "{exprs:?} {fields:?}");
        }
    }
}
