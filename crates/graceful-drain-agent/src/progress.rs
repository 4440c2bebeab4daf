//! Where a drain stands: every pod still remaining and why, and the one-line summary
//! written to the `DrainInProgress` condition message, e.g.
//! `3 pods remaining: 1 blocked by PDB default/web-pdb, 2 terminating`.
//!
//! That message is the contract with the CLI (`graceful-drain status`): it always starts
//! with `<N> pod(s) remaining`, followed by `: ` and comma-separated `<count> <state>`
//! groups in a fixed order (blocked groups, isolated, terminating, evicting).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::filters::PodKey;
use super::hooks::HookStep;

/// Most blocker groups named in the condition message; more are summed into one group so
/// the message stays short enough to read in `kubectl describe node`.
const MAX_BLOCKER_GROUPS: usize = 4;

/// What refuses a pod's eviction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "camelCase")]
pub enum Blocker {
    /// A PodDisruptionBudget (`namespace/name`) has no disruption left (HTTP 429).
    Pdb(String),
    /// More than one PDB selects the pod, which the API server refuses (HTTP 500).
    MultiplePdbs(Vec<String>),
    /// An admission webhook denied the eviction.
    Webhook(String),
    /// The API server is shedding load (HTTP 429 without a disruption-budget cause, as API
    /// Priority and Fairness answers); retried after its Retry-After.
    Throttled,
    /// Our webhook isolated the pod and asks for the eviction again once its load
    /// balancers have let go of it (not a fault: the pod shows as isolated).
    Deregistering,
    /// Anything else the API server answered; retried.
    Other(String),
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pdb(name) => write!(f, "PDB {name}"),
            Self::MultiplePdbs(names) if names.is_empty() => f.write_str("several PDBs"),
            Self::MultiplePdbs(names) => write!(f, "several PDBs {}", names.join(" ")),
            Self::Webhook(name) => write!(f, "webhook {name}"),
            Self::Throttled => f.write_str("API server throttling"),
            Self::Deregistering => f.write_str("deregistration"),
            Self::Other(error) => write!(f, "error ({error})"),
        }
    }
}

/// Where one remaining pod is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PodState {
    /// Not yet evicted (queued, or the eviction is in flight).
    Evicting,
    /// The eviction was refused; it is retried.
    Blocked(Blocker),
    /// The eviction was accepted and our webhook isolated the pod
    /// (`graceful-drain.io/draining`); it is deleted once load balancers let go of it.
    Isolated,
    /// The pod is being deleted (grace period running).
    Terminating,
}

/// A drain's progress.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Pods the drain set out to evict.
    pub planned: usize,
    /// Pods left alone (DaemonSet, mirror, long-terminating).
    pub skipped: usize,
    /// Planned pods that are gone.
    pub done: usize,
    /// Planned pods of the tier being evicted still on the node.
    pub remaining: BTreeMap<PodKey, PodState>,
    /// The tier being evicted, when the drain has more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierStep>,
    /// Pods of later tiers, not evicted yet.
    #[serde(skip_serializing_if = "is_zero")]
    pub waiting: usize,
    /// The maintenance hook running now, if one is (see [`crate::hooks`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hook: Option<HookStep>,
    /// The drain's tiers as planned from its first list of the node's pods, in eviction
    /// order, empty tiers left out (so tier `i` of the plan is `tier i/N` of the message).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<PlannedTier>,
}

/// One tier of a drain's plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedTier {
    /// The tier's configured name (`workloads`, `system-critical`, `last`, or a `--tiers`
    /// name).
    pub name: String,
    /// Its pods when the drain listed them.
    pub pods: Vec<PodKey>,
}

/// Pods named per tier in the plan's message; the rest are counted, so a node of 100
/// pods still fits the message in a line of `kubectl describe node`.
const PLAN_PODS_NAMED: usize = 3;

/// The `graceful-drain.io/DrainPlan` Event message: `plan: 1/2 workloads: 12 pods (shop/web-1,
/// shop/web-2, shop/web-3, …); 2/2 system-critical: 1 pod (kube-system/coredns-x)`.
pub fn plan_message(plan: &[PlannedTier]) -> String {
    let count = plan.len();
    let tiers: Vec<String> = plan
        .iter()
        .enumerate()
        .map(|(i, tier)| {
            let n = tier.pods.len();
            let mut named: Vec<String> = tier
                .pods
                .iter()
                .take(PLAN_PODS_NAMED)
                .map(ToString::to_string)
                .collect();
            if n > PLAN_PODS_NAMED {
                named.push("…".into());
            }
            let (index, name, named) = (i + 1, &tier.name, named.join(", "));
            format!("{index}/{count} {name}: {n} {} ({named})", pods(n))
        })
        .collect();
    format!("plan: {}", tiers.join("; "))
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Where a drain with several eviction tiers is (see [`crate::tiers`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TierStep {
    /// 1-based position of the tier being evicted.
    pub index: usize,
    /// Tiers in the drain.
    pub count: usize,
    /// The tier's configured name.
    pub name: String,
}

impl Serialize for PodKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// "pod" or "pods", for `n` of them.
pub(crate) fn pods(n: usize) -> &'static str {
    if n == 1 { "pod" } else { "pods" }
}

impl Progress {
    /// The condition message (see the module documentation).
    pub fn message(&self) -> String {
        if let Some(hook) = &self.hook {
            return hook.to_string();
        }
        let message = self.pods_message();
        let Some(tier) = self.tier.as_ref().filter(|t| t.count > 1) else {
            return message;
        };
        let later = if self.waiting > 0 {
            format!("; {} in later tiers", self.waiting)
        } else {
            String::new()
        };
        format!(
            "tier {}/{} ({}): {message}{later}",
            tier.index, tier.count, tier.name
        )
    }

    fn pods_message(&self) -> String {
        let n = self.remaining.len();
        if n == 0 {
            return format!(
                "0 pods remaining: {} evicted, {} skipped",
                self.done, self.skipped
            );
        }
        let mut blocked: BTreeMap<&Blocker, usize> = BTreeMap::new();
        let (mut isolated, mut terminating, mut evicting) = (0, 0, 0);
        for state in self.remaining.values() {
            match state {
                PodState::Blocked(b) => *blocked.entry(b).or_default() += 1,
                PodState::Isolated => isolated += 1,
                PodState::Terminating => terminating += 1,
                PodState::Evicting => evicting += 1,
            }
        }
        let mut groups: Vec<(usize, &Blocker)> = blocked.into_iter().map(|(b, c)| (c, b)).collect();
        groups.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut parts: Vec<String> = groups
            .iter()
            .take(MAX_BLOCKER_GROUPS)
            .map(|(count, blocker)| format!("{count} blocked by {blocker}"))
            .collect();
        let rest: usize = groups.iter().skip(MAX_BLOCKER_GROUPS).map(|g| g.0).sum();
        if rest > 0 {
            parts.push(format!("{rest} blocked otherwise"));
        }
        for (count, what) in [
            (isolated, "isolated"),
            (terminating, "terminating"),
            (evicting, "evicting"),
        ] {
            if count > 0 {
                parts.push(format!("{count} {what}"));
            }
        }
        format!("{n} {} remaining: {}", pods(n), parts.join(", "))
    }

    /// Pods the drain still has to see gone: those of the tier being evicted and those of
    /// later tiers.
    pub fn left(&self) -> usize {
        self.remaining.len() + self.waiting
    }

    /// Remaining pods that are blocked, with their blocker.
    pub fn blocked(&self) -> impl Iterator<Item = (&PodKey, &Blocker)> {
        self.remaining.iter().filter_map(|(k, s)| match s {
            PodState::Blocked(b) => Some((k, b)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        PodKey {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn progress(states: &[(&str, PodState)]) -> Progress {
        Progress {
            planned: 10,
            skipped: 2,
            done: 10 - states.len(),
            remaining: states.iter().map(|(n, s)| (key(n), s.clone())).collect(),
            ..Progress::default()
        }
    }

    #[test]
    fn a_drain_with_tiers_says_which_tier_it_is_in() {
        let step = |index, count, name: &str| {
            Some(TierStep {
                index,
                count,
                name: name.into(),
            })
        };
        let mut p = progress(&[("a", PodState::Evicting), ("b", PodState::Isolated)]);
        p.tier = step(1, 3, "workloads");
        p.waiting = 4;
        assert_eq!(
            p.message(),
            "tier 1/3 (workloads): 2 pods remaining: 1 isolated, 1 evicting; 4 in later tiers"
        );
        assert_eq!(p.left(), 6, "later tiers count as left");
        p.tier = step(3, 3, "last");
        p.waiting = 0;
        assert_eq!(
            p.message(),
            "tier 3/3 (last): 2 pods remaining: 1 isolated, 1 evicting"
        );
        // One tier: the message is as it always was.
        p.tier = step(1, 1, "workloads");
        assert_eq!(p.message(), "2 pods remaining: 1 isolated, 1 evicting");
    }

    #[test]
    fn the_plan_names_each_tier_with_its_first_pods() {
        let tier = |name: &str, pods: &[&str]| PlannedTier {
            name: name.into(),
            pods: pods.iter().map(|p| key(p)).collect(),
        };
        let plan = [
            tier("workloads", &["web-1", "web-2", "web-3", "web-4"]),
            tier("system-critical", &["coredns"]),
            tier("last", &["ingress-1", "ingress-2"]),
        ];
        assert_eq!(
            plan_message(&plan),
            "plan: 1/3 workloads: 4 pods (default/web-1, default/web-2, default/web-3, …); \
             2/3 system-critical: 1 pod (default/coredns); \
             3/3 last: 2 pods (default/ingress-1, default/ingress-2)"
        );
        assert_eq!(
            plan_message(&plan[1..2]),
            "plan: 1/1 system-critical: 1 pod (default/coredns)"
        );
    }

    #[test]
    fn message_counts_each_reason_a_pod_remains() {
        let pdb = PodState::Blocked(Blocker::Pdb("default/web-pdb".into()));
        let cases = [
            (progress(&[]), "0 pods remaining: 10 evicted, 2 skipped"),
            (
                progress(&[("a", PodState::Evicting)]),
                "1 pod remaining: 1 evicting",
            ),
            (
                progress(&[
                    ("a", pdb.clone()),
                    ("b", PodState::Terminating),
                    ("c", PodState::Terminating),
                ]),
                "3 pods remaining: 1 blocked by PDB default/web-pdb, 2 terminating",
            ),
            (
                progress(&[
                    (
                        "a",
                        PodState::Blocked(Blocker::Webhook("deny.example.com".into())),
                    ),
                    ("b", pdb.clone()),
                    ("c", pdb),
                    ("d", PodState::Isolated),
                    ("e", PodState::Evicting),
                    (
                        "f",
                        PodState::Blocked(Blocker::MultiplePdbs(vec![
                            "default/a".into(),
                            "default/b".into(),
                        ])),
                    ),
                ]),
                "6 pods remaining: 2 blocked by PDB default/web-pdb, 1 blocked by several \
                 PDBs default/a default/b, 1 blocked by webhook deny.example.com, 1 isolated, \
                 1 evicting",
            ),
        ];
        for (progress, want) in cases {
            assert_eq!(progress.message(), want);
        }
    }

    #[test]
    fn many_blockers_are_summarised() {
        let states: Vec<(String, PodState)> = (0..6)
            .map(|i| {
                (
                    format!("p{i}"),
                    PodState::Blocked(Blocker::Pdb(format!("ns/pdb-{i}"))),
                )
            })
            .collect();
        let states: Vec<(&str, PodState)> = states
            .iter()
            .map(|(n, s)| (n.as_str(), s.clone()))
            .collect();
        let message = progress(&states).message();
        assert!(
            message.starts_with("6 pods remaining: 1 blocked by PDB ns/pdb-0"),
            "{message}"
        );
        assert!(message.ends_with(", 2 blocked otherwise"), "{message}");
    }
}
