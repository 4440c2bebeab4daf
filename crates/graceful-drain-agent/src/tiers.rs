//! Eviction tiers: the order in which one drain evicts its pods.
//!
//! A drain evicts tier by tier, and a tier starts only once every pod of the tiers before
//! it is gone (evicted, or isolated by the webhook and then deleted). The tiers are a
//! configured, ordered list ([`TierSpec`], JSON from `--tiers`, the chart value
//! `agent.drain.tiers` or a LifecycleEvent's `graceful-drain.io/tiers` annotation): each
//! tier's `match` is a list of [`MatcherSpec`]s OR'ed together, and a matcher ANDs the
//! fields it sets (a label selector, namespaces, PriorityClass names, a minimum priority).
//! A pod belongs to the first tier, in list order, that matches it; pods no tier matches go
//! to the catch-all tier (the one without `match`) or, when there is none, to an implicit
//! `workloads` tier evicted first. Matching is local, on the pods the drain's watch already
//! holds: no LIST per drain.
//!
//! Without `--tiers` the plan is ordinary workloads first, then pods of the system-critical
//! priority classes (cluster DNS, metrics, the CNI's controllers: what the workloads still
//! lean on while they shut down). `--last-pod-selector` (an ingress controller, the node's
//! log shipper) appends a `last` tier, or replaces the `match` of a configured tier named
//! `last`; its pods are picked before any other tier is matched, so a critical pod it
//! selects still goes last. DaemonSet pods are never evicted (see `filters`). A node with
//! pods of one tier only has one tier and nothing changes.
//!
//! [`Tiers`] is the validated, compiled form: every error names its tier.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use graceful_drain_core::selector::{Selector, SelectorExt, parse_label_selector};

/// Priority classes Kubernetes creates for system-critical pods.
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] =
    ["system-cluster-critical", "system-node-critical"];

/// Priorities from this value up are reserved for system-critical pods (upstream
/// `scheduling.SystemCriticalPriority`, pkg/apis/scheduling/types.go).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Name of the catch-all tier the agent adds when the configuration has none.
pub const WORKLOADS: &str = "workloads";
/// Name of the default plan's tier of system-critical pods.
pub const SYSTEM_CRITICAL: &str = "system-critical";
/// Name of the tier `--last-pod-selector` sets.
pub const LAST: &str = "last";

/// One tier as configured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TierSpec {
    /// How the tier is named in messages, Events and `/status`.
    pub name: String,
    /// Matchers, OR'ed; `None` makes the tier the catch-all.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub matchers: Option<Vec<MatcherSpec>>,
}

/// One matcher of a tier: it matches a pod when every field it sets does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MatcherSpec {
    /// A label selector in `kubectl -l` syntax (`app=ingress,tier in (edge)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// The pod's namespace is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The pod's `spec.priorityClassName` is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub priority_class_names: Vec<String>,
    /// The pod's `spec.priority` is at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_priority: Option<i32>,
}

/// A tier configuration that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The text is not a JSON list of tiers.
    #[error("eviction tiers: not a JSON list of tiers: {0}")]
    Json(String),
    /// A tier has an empty name.
    #[error("eviction tiers: tier {position} has no name")]
    Unnamed {
        /// 1-based position of the tier in the list.
        position: usize,
    },
    /// Two tiers share a name.
    #[error("eviction tiers: two tiers are named {name:?}")]
    Duplicate {
        /// The name used twice.
        name: String,
    },
    /// More than one tier lacks `match`.
    #[error(
        "eviction tiers: tiers {first:?} and {second:?} both have no `match`; only one tier \
         may take the pods no other tier matches"
    )]
    TwoCatchAlls {
        /// The first tier without `match`.
        first: String,
        /// The next tier without `match`.
        second: String,
    },
    /// A tier named `workloads` matches pods, while no tier is the catch-all.
    #[error(
        "eviction tiers: tier {WORKLOADS:?} has a `match`, but with no tier lacking `match` \
         the pods no tier matches go to an implicit first tier named {WORKLOADS:?}; rename \
         the tier or drop its `match`"
    )]
    WorkloadsNotCatchAll,
    /// `match: []`.
    #[error(
        "eviction tiers: tier {tier:?}: `match` is empty; omit it to make the tier take the \
         pods no other tier matches"
    )]
    EmptyMatch {
        /// The tier's name.
        tier: String,
    },
    /// A matcher that sets no field would match every pod.
    #[error(
        "eviction tiers: tier {tier:?}: matcher {position} sets nothing; set podSelector, \
         namespaces, priorityClassNames or minPriority"
    )]
    EmptyMatcher {
        /// The tier's name.
        tier: String,
        /// 1-based position of the matcher in the tier's `match`.
        position: usize,
    },
    /// A label selector that does not parse.
    #[error("eviction tiers: tier {tier:?}: podSelector {selector:?}: {reason}")]
    Selector {
        /// The tier's name (`last` for `--last-pod-selector`).
        tier: String,
        /// The selector as written.
        selector: String,
        /// Why it does not parse.
        reason: String,
    },
}

/// One compiled matcher (see [`MatcherSpec`]).
#[derive(Clone, Debug)]
struct Matcher {
    selector: Option<Selector>,
    namespaces: Vec<String>,
    classes: Vec<String>,
    min_priority: Option<i32>,
}

impl Matcher {
    fn compile(tier: &str, position: usize, spec: &MatcherSpec) -> Result<Self, Error> {
        let selector = match spec.pod_selector.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(text) => Some(
                parse_label_selector(text).map_err(|reason| Error::Selector {
                    tier: tier.to_string(),
                    selector: text.to_string(),
                    reason,
                })?,
            ),
        };
        let non_empty =
            |v: &[String]| -> Vec<String> { v.iter().filter(|s| !s.is_empty()).cloned().collect() };
        let matcher = Self {
            selector,
            namespaces: non_empty(&spec.namespaces),
            classes: non_empty(&spec.priority_class_names),
            min_priority: spec.min_priority,
        };
        let sets_nothing = matcher.selector.is_none()
            && matcher.namespaces.is_empty()
            && matcher.classes.is_empty()
            && matcher.min_priority.is_none();
        if sets_nothing {
            return Err(Error::EmptyMatcher {
                tier: tier.to_string(),
                position,
            });
        }
        Ok(matcher)
    }

    fn matches(&self, pod: &Pod) -> bool {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let labels = meta.labels.clone().unwrap_or_default();
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        let class = spec.and_then(|s| s.priority_class_name.as_deref());
        let priority = spec.and_then(|s| s.priority).unwrap_or(0);
        self.selector.as_ref().is_none_or(|s| s.matches(&labels))
            && (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && (self.classes.is_empty()
                || class.is_some_and(|c| self.classes.iter().any(|x| x == c)))
            && self.min_priority.is_none_or(|min| priority >= min)
    }
}

/// One compiled tier.
#[derive(Clone, Debug)]
struct Tier {
    name: String,
    /// `None`: the catch-all.
    matchers: Option<Vec<Matcher>>,
}

/// The validated eviction plan: tiers in eviction order, exactly one of them the catch-all.
#[derive(Clone, Debug)]
pub struct Tiers {
    /// The configured tiers (`--tiers`); empty: the default plan.
    specs: Vec<TierSpec>,
    /// `--last-pod-selector`.
    last: Option<String>,
    tiers: Vec<Tier>,
    /// Position of the tier `--last-pod-selector` set, matched before the others.
    pinned: Option<usize>,
}

impl Default for Tiers {
    fn default() -> Self {
        Self::new(Vec::new(), None).unwrap_or_else(|_| unreachable!("the default plan is valid"))
    }
}

/// The plan without `--tiers`: workloads, then system-critical pods.
pub fn default_specs() -> Vec<TierSpec> {
    let critical = vec![
        MatcherSpec {
            priority_class_names: CRITICAL_PRIORITY_CLASSES.map(String::from).to_vec(),
            ..MatcherSpec::default()
        },
        MatcherSpec {
            min_priority: Some(SYSTEM_CRITICAL_PRIORITY),
            ..MatcherSpec::default()
        },
    ];
    vec![
        TierSpec {
            name: WORKLOADS.into(),
            matchers: None,
        },
        TierSpec {
            name: SYSTEM_CRITICAL.into(),
            matchers: Some(critical),
        },
    ]
}

/// Parses `--tiers` (or the annotation): a JSON list of [`TierSpec`]s. Blank text or `[]`
/// is the default plan.
pub fn parse_specs(text: &str) -> Result<Vec<TierSpec>, Error> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(text).map_err(|e| Error::Json(e.to_string()))
}

impl Tiers {
    /// Validates and compiles `specs` (empty: the default plan) with `--last-pod-selector`
    /// `last` applied.
    pub fn new(specs: Vec<TierSpec>, last: Option<String>) -> Result<Self, Error> {
        let last = last.filter(|s| !s.trim().is_empty());
        let mut plan = if specs.is_empty() {
            default_specs()
        } else {
            specs.clone()
        };
        if let Some(selector) = &last {
            let matcher = MatcherSpec {
                pod_selector: Some(selector.clone()),
                ..MatcherSpec::default()
            };
            match plan.iter_mut().find(|t| t.name == LAST) {
                Some(tier) => tier.matchers = Some(vec![matcher]),
                None => plan.push(TierSpec {
                    name: LAST.into(),
                    matchers: Some(vec![matcher]),
                }),
            }
        }
        let mut tiers = compile(&plan)?;
        if !tiers.iter().any(|t| t.matchers.is_none()) {
            if tiers.iter().any(|t| t.name == WORKLOADS) {
                return Err(Error::WorkloadsNotCatchAll);
            }
            let workloads = Tier {
                name: WORKLOADS.into(),
                matchers: None,
            };
            tiers.insert(0, workloads);
        }
        let pinned = last
            .as_ref()
            .and_then(|_| tiers.iter().position(|t| t.name == LAST));
        Ok(Self {
            specs,
            last,
            tiers,
            pinned,
        })
    }

    /// This plan with the tiers `specs` instead of the configured ones (`None`: kept) and
    /// `last` as `--last-pod-selector` (`None`: kept; empty: no last tier).
    pub fn overridden(
        &self,
        specs: Option<Vec<TierSpec>>,
        last: Option<String>,
    ) -> Result<Self, Error> {
        let specs = specs.unwrap_or_else(|| self.specs.clone());
        Self::new(specs, last.or_else(|| self.last.clone()))
    }

    /// The tier names, in eviction order.
    pub fn names(&self) -> Vec<String> {
        self.tiers.iter().map(|t| t.name.clone()).collect()
    }

    /// The position (in eviction order) of the tier `pod` belongs to.
    pub fn tier_of(&self, pod: &Pod) -> usize {
        let matches = |tier: &Tier| {
            tier.matchers
                .as_ref()
                .is_some_and(|ms| ms.iter().any(|m| m.matches(pod)))
        };
        if let Some(pinned) = self.pinned.filter(|&i| matches(&self.tiers[i])) {
            return pinned;
        }
        self.tiers
            .iter()
            .position(matches)
            .or_else(|| self.tiers.iter().position(|t| t.matchers.is_none()))
            .unwrap_or_default()
    }

    /// `pods` grouped by tier position, in eviction order, empty tiers left out.
    pub fn split(&self, pods: Vec<Pod>) -> Vec<(usize, Vec<Pod>)> {
        let mut groups: Vec<(usize, Vec<Pod>)> = Vec::new();
        for pod in pods {
            let tier = self.tier_of(&pod);
            match groups.iter_mut().find(|(t, _)| *t == tier) {
                Some((_, group)) => group.push(pod),
                None => groups.push((tier, vec![pod])),
            }
        }
        groups.sort_by_key(|(tier, _)| *tier);
        groups
    }
}

/// Compiles the tiers, checking names, catch-alls and matchers.
fn compile(specs: &[TierSpec]) -> Result<Vec<Tier>, Error> {
    let mut names = HashSet::new();
    let mut catch_all: Option<&str> = None;
    let mut tiers = Vec::with_capacity(specs.len());
    for (position, spec) in specs.iter().enumerate() {
        let name = spec.name.trim();
        if name.is_empty() {
            return Err(Error::Unnamed {
                position: position + 1,
            });
        }
        if !names.insert(name) {
            return Err(Error::Duplicate { name: name.into() });
        }
        let matchers = match &spec.matchers {
            None => {
                if let Some(first) = catch_all {
                    return Err(Error::TwoCatchAlls {
                        first: first.into(),
                        second: name.into(),
                    });
                }
                catch_all = Some(name);
                None
            }
            Some(list) if list.is_empty() => return Err(Error::EmptyMatch { tier: name.into() }),
            Some(list) => Some(
                list.iter()
                    .enumerate()
                    .map(|(i, m)| Matcher::compile(name, i + 1, m))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        tiers.push(Tier {
            name: name.into(),
            matchers,
        });
    }
    Ok(tiers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use graceful_drain_testing::fixtures::{self, PodFixture};

    fn with_class(mut pod: Pod, class: &str) -> Pod {
        pod.spec
            .get_or_insert_with(Default::default)
            .priority_class_name = Some(class.into());
        pod
    }

    fn with_priority(mut pod: Pod, priority: i32) -> Pod {
        pod.spec.get_or_insert_with(Default::default).priority = Some(priority);
        pod
    }

    fn critical(name: &str) -> Pod {
        with_class(
            fixtures::pod(name).with_uid(name),
            "system-cluster-critical",
        )
    }

    fn name(pod: &Pod) -> String {
        pod.metadata.name.clone().unwrap_or_default()
    }

    fn tiers(json: &str) -> Result<Tiers, Error> {
        Tiers::new(parse_specs(json)?, None)
    }

    fn tier_name(tiers: &Tiers, pod: &Pod) -> String {
        tiers.names()[tiers.tier_of(pod)].clone()
    }

    #[test]
    fn the_default_plan_sorts_by_priority_and_the_last_selector() {
        let plan = Tiers::new(Vec::new(), Some("app=ingress".into())).unwrap();
        assert_eq!(plan.names(), ["workloads", "system-critical", "last"]);
        let plain = fixtures::pod("web");
        let high = with_priority(fixtures::pod("agent"), SYSTEM_CRITICAL_PRIORITY);
        let just_below = with_priority(fixtures::pod("batch"), SYSTEM_CRITICAL_PRIORITY - 1);
        let ingress = fixtures::pod("ingress").label("app", "ingress");
        assert_eq!(tier_name(&plan, &plain), "workloads");
        assert_eq!(tier_name(&plan, &just_below), "workloads");
        assert_eq!(tier_name(&plan, &high), "system-critical");
        assert_eq!(tier_name(&plan, &critical("coredns")), "system-critical");
        assert_eq!(tier_name(&plan, &ingress), "last");
        // The last selector outranks the priority: a critical pod it picks goes last.
        let dns = critical("dns").label("app", "ingress");
        assert_eq!(tier_name(&plan, &dns), "last");
        let without_last = Tiers::default();
        assert_eq!(without_last.names(), ["workloads", "system-critical"]);
        assert_eq!(tier_name(&without_last, &ingress), "workloads");
    }

    #[test]
    fn configured_tiers_match_by_namespace_class_priority_and_labels() {
        let plan = tiers(
            r#"[{"name":"databases","match":[{"namespaces":["db"]},{"priorityClassNames":["critical-db"]}]},
                {"name":"edge","match":[{"podSelector":"app in (ingress, gateway)","namespaces":["edge"]}]},
                {"name":"high","match":[{"minPriority":1000}]}]"#,
        )
        .unwrap();
        assert_eq!(plan.names(), ["workloads", "databases", "edge", "high"]);
        let cases = [
            (fixtures::pod("web"), "workloads"),
            (fixtures::pod("pg-0").ns("db"), "databases"),
            (
                with_class(fixtures::pod("cache"), "critical-db"),
                "databases",
            ),
            (
                fixtures::pod("ingress").ns("edge").label("app", "ingress"),
                "edge",
            ),
            // A matcher ANDs its fields: the right label in another namespace is not enough.
            (
                fixtures::pod("ingress").label("app", "ingress"),
                "workloads",
            ),
            (fixtures::pod("other").ns("edge"), "workloads"),
            (with_priority(fixtures::pod("batch"), 1000), "high"),
            (with_priority(fixtures::pod("low"), 999), "workloads"),
            // The first tier in list order wins.
            (
                with_priority(fixtures::pod("pg-1").ns("db"), 5000),
                "databases",
            ),
        ];
        for (pod, want) in cases {
            assert_eq!(tier_name(&plan, &pod), want, "{}", name(&pod));
        }
    }

    #[test]
    fn a_catch_all_tier_may_come_anywhere() {
        let plan = tiers(
            r#"[{"name":"first","match":[{"namespaces":["batch"]}]},{"name":"rest"},
                {"name":"late","match":[{"namespaces":["edge"]}]}]"#,
        )
        .unwrap();
        assert_eq!(plan.names(), ["first", "rest", "late"]);
        assert_eq!(tier_name(&plan, &fixtures::pod("x").ns("batch")), "first");
        assert_eq!(tier_name(&plan, &fixtures::pod("x")), "rest");
        assert_eq!(tier_name(&plan, &fixtures::pod("x").ns("edge")), "late");
        // --last-pod-selector replaces a configured `last` tier's match, or appends one.
        let with_last = Tiers::new(plan.specs.clone(), Some("app=log".into())).unwrap();
        assert_eq!(with_last.names(), ["first", "rest", "late", "last"]);
        let specs = parse_specs(r#"[{"name":"last","match":[{"namespaces":["edge"]}]}]"#).unwrap();
        let replaced = Tiers::new(specs, Some("app=log".into())).unwrap();
        assert_eq!(replaced.names(), ["workloads", "last"]);
        assert_eq!(
            tier_name(&replaced, &fixtures::pod("x").ns("edge")),
            "workloads"
        );
        let shipper = fixtures::pod("x").label("app", "log");
        assert_eq!(tier_name(&replaced, &shipper), "last");
    }

    #[test]
    fn overrides_replace_the_tiers_and_keep_or_drop_the_last_selector() {
        let base = Tiers::new(Vec::new(), Some("app=ingress".into())).unwrap();
        let specs = parse_specs(r#"[{"name":"db","match":[{"namespaces":["db"]}]}]"#).unwrap();
        let both = base.overridden(Some(specs), None).unwrap();
        assert_eq!(both.names(), ["workloads", "db", "last"]);
        let no_last = base.overridden(None, Some(String::new())).unwrap();
        assert_eq!(no_last.names(), ["workloads", "system-critical"]);
        assert_eq!(
            Tiers::new(parse_specs(" [] ").unwrap(), None)
                .unwrap()
                .names(),
            Tiers::default().names()
        );
    }

    #[test]
    fn invalid_configurations_are_refused_naming_the_tier() {
        let cases = [
            ("{", "not a JSON list of tiers"),
            (
                r#"[{"name":"a","match":[{"namespace":["x"]}]}]"#,
                "unknown field `namespace`",
            ),
            (r#"[{"name":""}]"#, "tier 1 has no name"),
            (
                r#"[{"name":"a"},{"name":"a","match":[{"minPriority":1}]}]"#,
                r#"two tiers are named "a""#,
            ),
            (
                r#"[{"name":"a"},{"name":"b"}]"#,
                r#"tiers "a" and "b" both have no `match`"#,
            ),
            (
                r#"[{"name":"db","match":[]}]"#,
                r#"tier "db": `match` is empty"#,
            ),
            (
                r#"[{"name":"db","match":[{"namespaces":["db"]},{"namespaces":[]}]}]"#,
                r#"tier "db": matcher 2 sets nothing"#,
            ),
            (
                r#"[{"name":"edge","match":[{"podSelector":"app in ingress"}]}]"#,
                r#"tier "edge": podSelector "app in ingress""#,
            ),
            (
                r#"[{"name":"workloads","match":[{"minPriority":1}]}]"#,
                r#"tier "workloads" has a `match`"#,
            ),
        ];
        for (json, want) in cases {
            let error = tiers(json).unwrap_err().to_string();
            assert!(error.contains(want), "{json}: {error}");
            assert!(error.starts_with("eviction tiers: "), "{error}");
        }
        let bad_last = Tiers::new(Vec::new(), Some("a in b".into())).unwrap_err();
        assert!(
            bad_last.to_string().contains(r#"tier "last": podSelector"#),
            "{bad_last}"
        );
    }

    #[test]
    fn split_keeps_eviction_order_and_drops_empty_tiers() {
        let plan = Tiers::new(Vec::new(), Some("app=ingress".into())).unwrap();
        let pods = vec![
            fixtures::pod("ingress").label("app", "ingress"),
            critical("coredns"),
            fixtures::pod("web-1"),
            fixtures::pod("web-2"),
        ];
        let groups: Vec<(usize, Vec<String>)> = plan
            .split(pods)
            .iter()
            .map(|(t, pods)| (*t, pods.iter().map(name).collect()))
            .collect();
        assert_eq!(
            groups,
            [
                (0, vec!["web-1".to_string(), "web-2".to_string()]),
                (1, vec!["coredns".to_string()]),
                (2, vec!["ingress".to_string()]),
            ]
        );
        let only_workloads = plan.split(vec![fixtures::pod("a")]);
        assert_eq!(only_workloads.len(), 1);
        assert!(plan.split(Vec::new()).is_empty());
    }
}
