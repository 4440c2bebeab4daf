//! Eviction tiers: the order in which one drain evicts its pods.
//!
//! A drain evicts tier by tier, and a tier starts only once every pod of the tiers before
//! it is gone (evicted, or isolated by the webhook and then deleted): ordinary workloads
//! first, then pods of the system-critical priority classes (cluster DNS, metrics, the
//! CNI's controllers: what the workloads still lean on while they shut down), then the
//! pods `--last-pod-selector` picks (an ingress controller, the node's log shipper).
//! DaemonSet pods are never evicted, as before (see `filters`). With neither kind of pod
//! on the node there is one tier and nothing changes.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;

/// Priority classes Kubernetes creates for system-critical pods.
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] =
    ["system-cluster-critical", "system-node-critical"];

/// Priorities from this value up are reserved for system-critical pods (upstream
/// `scheduling.SystemCriticalPriority`, pkg/apis/scheduling/types.go).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The tiers, in eviction order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Everything not below.
    Workloads,
    /// Pods of a system-critical priority class.
    SystemCritical,
    /// Pods `--last-pod-selector` selects.
    Last,
}

impl Tier {
    /// How the tier is named in messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Workloads => "workloads",
            Tier::SystemCritical => "system-critical",
            Tier::Last => "last",
        }
    }
}

/// The tier of `pod`; `last` holds the UIDs of the node's pods `--last-pod-selector`
/// selects (`None` without one).
pub fn tier_of(pod: &Pod, last: Option<&HashSet<String>>) -> Tier {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if last.is_some_and(|uids| uids.contains(uid)) {
        return Tier::Last;
    }
    let spec = pod.spec.as_ref();
    let class = spec.and_then(|s| s.priority_class_name.as_deref());
    let priority = spec.and_then(|s| s.priority).unwrap_or(0);
    if class.is_some_and(|c| CRITICAL_PRIORITY_CLASSES.contains(&c))
        || priority >= SYSTEM_CRITICAL_PRIORITY
    {
        return Tier::SystemCritical;
    }
    Tier::Workloads
}

/// `pods` grouped by tier, in eviction order, empty tiers left out.
pub fn split(pods: Vec<Pod>, last: Option<&HashSet<String>>) -> Vec<(Tier, Vec<Pod>)> {
    let mut tiers: Vec<(Tier, Vec<Pod>)> = Vec::new();
    for pod in pods {
        let tier = tier_of(&pod, last);
        match tiers.iter_mut().find(|(t, _)| *t == tier) {
            Some((_, group)) => group.push(pod),
            None => tiers.push((tier, vec![pod])),
        }
    }
    tiers.sort_by_key(|(tier, _)| *tier);
    tiers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, PodFixture};

    fn critical(name: &str) -> Pod {
        let mut pod = fixtures::pod(name).with_uid(name);
        pod.spec
            .get_or_insert_with(Default::default)
            .priority_class_name = Some("system-cluster-critical".into());
        pod
    }

    #[test]
    fn pods_fall_into_tiers_by_priority_and_the_last_selector() {
        let plain = fixtures::pod("web").with_uid("web");
        let mut high = fixtures::pod("agent").with_uid("agent");
        high.spec.get_or_insert_with(Default::default).priority = Some(SYSTEM_CRITICAL_PRIORITY);
        let mut just_below = fixtures::pod("batch").with_uid("batch");
        just_below
            .spec
            .get_or_insert_with(Default::default)
            .priority = Some(SYSTEM_CRITICAL_PRIORITY - 1);
        let ingress = fixtures::pod("ingress").with_uid("ingress");
        let last: HashSet<String> = ["ingress".to_string(), "dns".to_string()].into();
        assert_eq!(tier_of(&plain, Some(&last)), Tier::Workloads);
        assert_eq!(tier_of(&just_below, Some(&last)), Tier::Workloads);
        assert_eq!(tier_of(&high, Some(&last)), Tier::SystemCritical);
        assert_eq!(tier_of(&critical("coredns"), None), Tier::SystemCritical);
        assert_eq!(tier_of(&ingress, Some(&last)), Tier::Last);
        assert_eq!(tier_of(&ingress, None), Tier::Workloads);
        // The selector outranks the priority: a critical pod picked as last goes last.
        assert_eq!(tier_of(&critical("dns"), Some(&last)), Tier::Last);
    }

    #[test]
    fn split_keeps_eviction_order_and_drops_empty_tiers() {
        let last: HashSet<String> = ["ingress".to_string()].into();
        let pods = vec![
            fixtures::pod("ingress").with_uid("ingress"),
            critical("coredns"),
            fixtures::pod("web-1").with_uid("web-1"),
            fixtures::pod("web-2").with_uid("web-2"),
        ];
        let tiers = split(pods, Some(&last));
        let names: Vec<(Tier, Vec<String>)> = tiers
            .iter()
            .map(|(t, pods)| {
                let names = pods
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                (*t, names)
            })
            .collect();
        assert_eq!(
            names,
            [
                (
                    Tier::Workloads,
                    vec!["web-1".to_string(), "web-2".to_string()]
                ),
                (Tier::SystemCritical, vec!["coredns".to_string()]),
                (Tier::Last, vec!["ingress".to_string()]),
            ]
        );
        let only_workloads = split(vec![fixtures::pod("a").with_uid("a")], None);
        assert_eq!(only_workloads.len(), 1);
        assert!(split(Vec::new(), None).is_empty());
    }
}
