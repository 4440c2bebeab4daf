//! What the drain engine knows of its node: the pods the watch shows, the planned pods it
//! still waits for (and what blocks each), the tiers left to start and the newcomers
//! waiting for theirs. The [`super::Engine`] loop feeds it watch events and eviction
//! updates and reads progress from it; nothing here does I/O.

use std::collections::{BTreeMap, VecDeque};

use k8s_openapi::api::core::v1::Pod;

use kube::runtime::watcher;

use crate::filters::{self, DaemonSetLookup, FilterOptions, PodKey};
use crate::progress::{Blocker, PlannedTier, PodState, Progress, TierStep};
use graceful_drain_core::labels::DRAINING_LABEL;

/// A pod the drain waits for.
#[derive(Clone, Debug)]
pub(super) struct Tracked {
    pub(super) uid: String,
    pub(super) blocked: Option<Blocker>,
    /// When the API server accepted the eviction (cleared when it is sent again).
    pub(super) accepted_at: Option<tokio::time::Instant>,
}

/// The engine's view of the node.
#[derive(Default)]
pub(super) struct State {
    /// Pods on the node now, from the watch.
    pub(super) pods: BTreeMap<PodKey, Pod>,
    /// Planned pods not yet gone.
    pub(super) tracked: BTreeMap<PodKey, Tracked>,
    /// Pods classified so far (planned or skipped), by UID, so new pods are noticed.
    pub(super) seen: std::collections::HashSet<String>,
    /// The pods of a re-list in progress (the watch restarted): swapped in at its end, so
    /// a half-done re-list never makes tracked pods look gone.
    pub(super) relist: Option<BTreeMap<PodKey, Pod>>,
    pub(super) planned: usize,
    pub(super) skipped: usize,
    pub(super) done: usize,
    /// Names of the configured tiers, by position (see
    /// [`Tiers::names`](crate::tiers::Tiers::names)).
    pub(super) tier_names: Vec<String>,
    /// Later eviction tiers (by position among the configured ones), not started yet, in
    /// order.
    pub(super) waiting: VecDeque<(usize, Vec<Pod>)>,
    /// The tier being evicted, its 1-based position among the drain's tiers and their
    /// number.
    pub(super) tier: Option<(usize, usize, usize)>,
    /// The tiers as planned from the first list, before any eviction.
    pub(super) plan: Vec<PlannedTier>,
}

impl State {
    /// Starts the next tier: returns its pods, `None` when no tier is left.
    pub(super) fn next_tier(&mut self) -> Option<(usize, Vec<Pod>)> {
        let (tier, pods) = self.waiting.pop_front()?;
        let index = self.tier.map_or(1, |(_, i, _)| i + 1);
        let count = self.tier.map_or(self.waiting.len() + 1, |(_, _, c)| c);
        self.tier = Some((tier, index, count.max(index)));
        Some((tier, pods))
    }

    /// Keeps a newcomer of a later tier than the one being evicted for its tier; returns
    /// it when its tier has started (or passed) and it is to be evicted now.
    pub(super) fn defer(&mut self, tier: usize, pod: Pod) -> Option<Pod> {
        if self.tier.is_none_or(|(current, _, _)| tier <= current) {
            return Some(pod);
        }
        match self.waiting.iter_mut().find(|(t, _)| *t == tier) {
            Some((_, pods)) => pods.push(pod),
            None => {
                let at = self.waiting.partition_point(|(t, _)| *t < tier);
                self.waiting.insert(at, (tier, vec![pod]));
                if let Some((_, _, count)) = self.tier.as_mut() {
                    *count += 1;
                }
            }
        }
        None
    }

    /// Applies one watch event; returns a pod never seen before (a newcomer to classify).
    pub(super) fn apply(&mut self, event: watcher::Event<Pod>) -> Option<Pod> {
        match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                let new = pod
                    .metadata
                    .uid
                    .as_ref()
                    .is_some_and(|u| !self.seen.contains(u));
                let target = self.relist.as_mut().unwrap_or(&mut self.pods);
                target.insert(PodKey::of(&pod), pod.clone());
                new.then_some(pod)
            }
            watcher::Event::Delete(pod) => {
                let key = PodKey::of(&pod);
                for map in [Some(&mut self.pods), self.relist.as_mut()]
                    .into_iter()
                    .flatten()
                {
                    if map.get(&key).map(|p| &p.metadata.uid) == Some(&pod.metadata.uid) {
                        map.remove(&key);
                    }
                }
                None
            }
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                None
            }
            watcher::Event::InitDone => {
                if let Some(pods) = self.relist.take() {
                    self.pods = pods;
                }
                None
            }
        }
    }

    pub(super) fn is_gone(
        &self,
        key: &PodKey,
        t: &Tracked,
        opts: &FilterOptions,
        now: jiff::Timestamp,
    ) -> bool {
        match self.pods.get(key) {
            None => true,
            Some(pod) if pod.metadata.uid.as_deref() != Some(t.uid.as_str()) => true,
            Some(pod) => {
                matches!(
                    filters::classify(pod, opts, now, |_| DaemonSetLookup::Exists),
                    filters::Verdict::Skip(filters::Skip::LongTerminating)
                )
            }
        }
    }

    /// Drops tracked pods that are gone and returns the progress.
    pub(super) fn progress(&mut self, opts: &FilterOptions) -> Progress {
        let now = jiff::Timestamp::now();
        let gone: Vec<PodKey> = self
            .tracked
            .iter()
            .filter(|(k, t)| self.is_gone(k, t, opts, now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.tracked.remove(&key);
            self.done += 1;
        }
        let remaining = self
            .tracked
            .iter()
            .map(|(key, t)| (key.clone(), pod_state(self.pods.get(key), t)))
            .collect();
        Progress {
            planned: self.planned,
            skipped: self.skipped,
            done: self.done,
            remaining,
            tier: self.tier.map(|(tier, index, count)| TierStep {
                index,
                count,
                name: self.tier_name(tier),
            }),
            plan: self.plan.clone(),
            waiting: self.waiting.iter().map(|(_, pods)| pods.len()).sum(),
            hook: None,
        }
    }
}

impl State {
    pub(super) fn tier_name(&self, tier: usize) -> String {
        self.tier_names.get(tier).cloned().unwrap_or_default()
    }

    /// Records the plan: the waiting tiers, numbered as the drain will evict them.
    pub(super) fn record_plan(&mut self) {
        self.plan = self
            .waiting
            .iter()
            .map(|(tier, pods)| PlannedTier {
                name: self.tier_name(*tier),
                pods: pods.iter().map(PodKey::of).collect(),
            })
            .collect();
    }
}

pub(super) fn pod_state(pod: Option<&Pod>, tracked: &Tracked) -> PodState {
    let Some(pod) = pod else {
        return PodState::Evicting;
    };
    if pod.metadata.deletion_timestamp.is_some() {
        PodState::Terminating
    } else if pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(DRAINING_LABEL))
    {
        PodState::Isolated
    } else if let Some(blocker) = &tracked.blocked {
        PodState::Blocked(blocker.clone())
    } else {
        PodState::Evicting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_start_in_order_and_newcomers_wait_for_theirs() {
        use graceful_drain_testing::fixtures::{self, PodFixture};
        let pod = |name: &str| fixtures::pod(name).with_uid(name);
        let names = |pods: &[Pod]| -> Vec<String> {
            pods.iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect()
        };
        // Tier positions of the plan workloads, system-critical, last.
        let (workloads, critical, last) = (0, 1, 2);
        let mut state = State {
            tier_names: vec!["workloads".into(), "system-critical".into(), "last".into()],
            waiting: VecDeque::from([(workloads, vec![pod("web")]), (last, vec![pod("ingress")])]),
            ..State::default()
        };
        state.record_plan();
        let (tier, pods) = state.next_tier().unwrap();
        assert_eq!((tier, names(&pods)), (workloads, vec!["web".into()]));
        assert_eq!(state.tier, Some((workloads, 1, 2)));
        // A critical pod arriving now waits, in a tier of its own between the two.
        assert!(state.defer(critical, pod("dns")).is_none());
        assert_eq!(state.tier, Some((workloads, 1, 3)));
        // A newcomer of the tier being evicted goes now.
        assert!(state.defer(workloads, pod("web-2")).is_some());
        let progress = state.progress(&FilterOptions::default());
        assert_eq!(progress.waiting, 2);
        let planned: Vec<(&str, usize)> = progress
            .plan
            .iter()
            .map(|t| (t.name.as_str(), t.pods.len()))
            .collect();
        assert_eq!(
            planned,
            [("workloads", 1), ("last", 1)],
            "the plan as first listed"
        );
        let (tier, pods) = state.next_tier().unwrap();
        assert_eq!((tier, names(&pods)), (critical, vec!["dns".into()]));
        assert_eq!(state.tier, Some((critical, 2, 3)));
        assert_eq!(
            state
                .progress(&FilterOptions::default())
                .tier
                .map(|t| t.name),
            Some("system-critical".to_string())
        );
        // A workload pod arriving after its tier is evicted at once.
        assert!(state.defer(workloads, pod("web-3")).is_some());
        let (tier, _) = state.next_tier().unwrap();
        assert_eq!(state.tier, Some((last, 3, 3)));
        assert_eq!(tier, last);
        assert!(state.next_tier().is_none());
    }

    #[test]
    fn a_restarted_watch_never_makes_tracked_pods_look_gone_halfway() {
        let pod = |name: &str, uid: &str| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            p.metadata.namespace = Some("shop".into());
            p.metadata.uid = Some(uid.into());
            p
        };
        let mut state = State::default();
        for (name, uid) in [("web-1", "u1"), ("web-2", "u2")] {
            state
                .pods
                .insert(PodKey::of(&pod(name, uid)), pod(name, uid));
            state.seen.insert(uid.into());
            let tracked = Tracked {
                uid: uid.into(),
                blocked: None,
                accepted_at: None,
            };
            state.tracked.insert(PodKey::of(&pod(name, uid)), tracked);
        }
        let opts = FilterOptions::default();
        assert!(state.apply(watcher::Event::Init).is_none());
        assert!(
            state
                .apply(watcher::Event::InitApply(pod("web-2", "u2")))
                .is_none()
        );
        assert_eq!(
            state.progress(&opts).remaining.len(),
            2,
            "mid re-list: nothing is gone"
        );
        let newcomer = state.apply(watcher::Event::InitApply(pod("late", "u9")));
        assert_eq!(
            newcomer.and_then(|p| p.metadata.name),
            Some("late".to_string())
        );
        state.apply(watcher::Event::InitDone);
        let progress = state.progress(&opts);
        assert_eq!(progress.done, 1, "web-1 is gone once the re-list completed");
        assert_eq!(
            progress
                .remaining
                .keys()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>(),
            ["web-2"]
        );
        // A same-name pod with a new UID counts as the old one being gone.
        state.apply(watcher::Event::Apply(pod("web-2", "u3")));
        assert!(state.progress(&opts).remaining.is_empty());
    }
}
