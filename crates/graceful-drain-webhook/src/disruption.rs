//! Keeps a held pod's disruption recorded in every PDB that still selects it.
//!
//! Isolation records the pod in each selecting PDB's `status.disruptedPods` ([`super::isolate`]).
//! Most PDBs stop selecting the pod right then (isolation removes their keys), but one
//! whose selector keys are all pinned (a StatefulSet's or DaemonSet's own) or kept
//! (`--keep-label`) still selects it, and counts it as disrupted only while its entry is
//! younger than the disruption controller's `DeletionTimeout`: two minutes, in
//! pkg/controller/disruption/disruption.go, where `countHealthyPods` skips a listed pod
//! until `disruptionTime + DeletionTimeout` and `buildDisruptedPodMap` then drops the
//! entry (Warning Event `NotDeleted`). Past that, the isolated pod — still ready, no
//! longer serving — counts as healthy again, `disruptionsAllowed` goes back up, and a
//! second member could be isolated while the first is still held.
//!
//! So while a pod is held, the deleter rewrites its entry with the current time once the
//! entry is older than `renew_after` (one minute by default), in one resourceVersion-guarded
//! status update per PDB, taking the PDB's turn like a charge. An entry already gone (the
//! webhook was away past the timeout, or a DELETE isolated the pod while the budget was
//! spent) is recorded again as a new disruption once the budget allows it.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::isolate::{Change, Context, Retries, StatusError, update_status};
use graceful_drain_core::backoff::Backoff;

/// Default age after which a held pod's `disruptedPods` entry is rewritten: half the
/// disruption controller's two-minute `DeletionTimeout`.
pub const RENEW_AFTER: Duration = Duration::from_secs(60);

/// Attempts of one renewal against concurrent writers (the disruption controller, a
/// charge on another replica) before it waits for the next scan.
const ATTEMPTS: usize = 5;

/// What one renewal wrote to a PDB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Renewed {
    /// Entries rewritten with the current time.
    pub renewed: usize,
    /// Pods recorded again after their entry was gone (`disruptionsAllowed` - 1 each).
    pub recharged: usize,
    /// Pods whose entry was gone and that the budget could not take back.
    pub unrecorded: usize,
}

/// `pdb` with every pod of `held` listed as disrupted at `now`: an entry older than
/// `stale_before` is rewritten; a missing one is charged as a new disruption while the
/// budget allows it (observed, `disruptionsAllowed` > 0). `None` when nothing changes.
/// Pure, so the rules are table-tested.
pub fn renewed(
    pdb: &PodDisruptionBudget,
    held: &[&str],
    now: Timestamp,
    stale_before: Timestamp,
) -> (Option<PodDisruptionBudget>, Renewed) {
    let mut status = pdb.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(-1) >= pdb.metadata.generation.unwrap_or(0);
    let mut counts = Renewed::default();
    let entries = status.disrupted_pods.get_or_insert_with(BTreeMap::new);
    for pod in held {
        match entries.get_mut(*pod) {
            Some(at) if at.0 < stale_before => {
                *at = Time(now);
                counts.renewed += 1;
            }
            Some(_) => {}
            None if observed && status.disruptions_allowed > 0 => {
                entries.insert((*pod).to_string(), Time(now));
                status.disruptions_allowed -= 1;
                counts.recharged += 1;
            }
            None => counts.unrecorded += 1,
        }
    }
    if counts.renewed + counts.recharged == 0 {
        return (None, counts);
    }
    let mut next = pdb.clone();
    next.status = Some(status);
    (Some(next), counts)
}

/// Whether `pdb`'s entry for `pod` needs writing at `now`: missing, or older than
/// `renew_after`.
pub fn needs_renewal(
    pdb: &PodDisruptionBudget,
    pod: &str,
    now: Timestamp,
    renew_after: Duration,
) -> bool {
    let stale_before = now - jiff::SignedDuration::try_from(renew_after).unwrap_or_default();
    pdb.status
        .as_ref()
        .and_then(|s| s.disrupted_pods.as_ref())
        .and_then(|d| d.get(pod))
        .is_none_or(|at| at.0 < stale_before)
}

/// Renews the entries of `held` (pod names) in PDB `namespace/name` on the live object,
/// retrying a conflicting update; the written PDB goes into the cache.
pub async fn renew(
    ctx: &Context,
    namespace: &str,
    name: &str,
    held: &[String],
    renew_after: Duration,
) -> Result<Renewed, kube::Error> {
    let gate = ctx.gates.gate(namespace, name);
    let _serialised = gate.turn.lock().await;
    let held: Vec<&str> = held.iter().map(String::as_str).collect();
    let retries = Retries {
        attempts: ATTEMPTS,
        backoff: Backoff::new(std::time::Duration::ZERO, std::time::Duration::ZERO),
        transient: false,
    };
    let renew = |live: &PodDisruptionBudget, _: bool| {
        let now = Timestamp::now();
        let stale_before = now - jiff::SignedDuration::try_from(renew_after).unwrap_or_default();
        match renewed(live, &held, now, stale_before) {
            (Some(next), counts) => Change::Write(Box::new(next), counts),
            (None, counts) => Change::Keep(counts),
        }
    };
    match update_status(ctx, namespace, name, None, retries, renew).await {
        Ok(counts) => Ok(counts),
        Err(
            StatusError::Read(error) | StatusError::Write(error) | StatusError::Contended(error),
        ) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pdb(allowed: i32, observed: i64, entries: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default", "generation": 1},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}},
            "status": {"disruptionsAllowed": allowed, "observedGeneration": observed,
                       "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 3,
                       "disruptedPods": entries}
        }))
        .unwrap()
    }

    fn entry(p: &PodDisruptionBudget, pod: &str) -> Option<Timestamp> {
        p.status
            .as_ref()?
            .disrupted_pods
            .as_ref()?
            .get(pod)
            .map(|t| t.0)
    }

    #[test]
    fn an_old_entry_is_rewritten_and_the_budget_is_untouched() {
        let now = at("2026-01-01T00:01:30Z");
        let old = pdb(0, 1, json!({"db-0": "2026-01-01T00:00:00Z"}));
        let (next, counts) = renewed(&old, &["db-0"], now, at("2026-01-01T00:00:30Z"));
        let next = next.expect("written");
        assert_eq!(entry(&next, "db-0"), Some(now));
        assert_eq!(next.status.unwrap().disruptions_allowed, 0);
        assert_eq!(
            counts,
            Renewed {
                renewed: 1,
                ..Renewed::default()
            }
        );
    }

    #[test]
    fn a_fresh_entry_is_left_alone() {
        let old = pdb(0, 1, json!({"db-0": "2026-01-01T00:00:50Z"}));
        let (next, counts) = renewed(
            &old,
            &["db-0"],
            at("2026-01-01T00:01:30Z"),
            at("2026-01-01T00:00:30Z"),
        );
        assert!(next.is_none());
        assert_eq!(counts, Renewed::default());
    }

    #[test]
    fn a_dropped_entry_is_charged_again_only_while_the_budget_allows() {
        let now = at("2026-01-01T00:03:00Z");
        let stale = at("2026-01-01T00:02:00Z");
        // The controller dropped db-0 and let the budget go back to 1: recorded again.
        let (next, counts) = renewed(&pdb(1, 1, json!({})), &["db-0", "db-1"], now, stale);
        let next = next.expect("written");
        assert_eq!(entry(&next, "db-0"), Some(now));
        assert_eq!(entry(&next, "db-1"), None);
        assert_eq!(next.status.unwrap().disruptions_allowed, 0);
        assert_eq!(
            counts,
            Renewed {
                recharged: 1,
                unrecorded: 1,
                ..Renewed::default()
            }
        );
        // A budget not yet observed at its generation takes nobody back.
        let (next, counts) = renewed(&pdb(1, 0, json!({})), &["db-0"], now, stale);
        assert!(next.is_none());
        assert_eq!(counts.unrecorded, 1);
    }

    #[test]
    fn an_entry_needs_renewal_once_older_than_the_interval_or_when_missing() {
        let p = pdb(0, 1, json!({"db-0": "2026-01-01T00:00:00Z"}));
        let renew = Duration::from_secs(60);
        assert!(!needs_renewal(
            &p,
            "db-0",
            at("2026-01-01T00:00:59Z"),
            renew
        ));
        assert!(needs_renewal(&p, "db-0", at("2026-01-01T00:01:01Z"), renew));
        assert!(needs_renewal(&p, "db-1", at("2026-01-01T00:00:01Z"), renew));
    }
}
