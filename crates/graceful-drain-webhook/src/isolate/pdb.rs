//! Charging a pod's disruption to its PodDisruptionBudget, and giving it back.
//!
//! The API server's eviction code records a disruption as `status.disruptedPods` plus
//! `disruptionsAllowed - 1` in one resourceVersion-guarded status update; isolation does
//! the same before it relabels, in turns per PDB ([`PdbGate`]) so this replica's
//! concurrent isolations write one update together instead of racing into conflicts.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::PostParams;

use graceful_drain_core::backoff::Backoff;

use super::context::{Context, Error, is_status, is_transient};
use crate::decide::{Charge, PodFacts, Snapshot};

/// How often a PDB status update is retried after a 409 before giving up. Charges from
/// this replica are serialised (and grouped) by [`PdbGate`], so conflicts come only from other
/// replicas (or the disruption controller); each retry re-reads the PDB after a short
/// jittered pause. 20 attempts of at most [`PDB_RETRY_MAX_PAUSE`] stay well inside one
/// admission call even with several replicas evicting from the same budget.
pub(super) const PDB_ATTEMPTS: usize = 20;
/// Upper bound of the random pause before re-reading a conflicting PDB (drawn from its upper
/// half): long enough for a competing replica's update to land, short against the 10 s
/// admission budget.
const PDB_RETRY_MAX_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Result of the PDB accounting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budget {
    /// The disruption was recorded now.
    Consumed,
    /// The pod was already listed in `status.disruptedPods`.
    Listed,
    /// No disruption left.
    Exhausted {
        /// The PDB, as `namespace/name`.
        pdb: String,
    },
    /// The disruption controller has not observed the PDB's latest generation.
    NotObserved {
        /// The PDB, as `namespace/name`.
        pdb: String,
    },
}

impl Budget {
    /// Whether the budget let the disruption happen (recorded now or before).
    pub fn allows(&self) -> bool {
        matches!(self, Budget::Consumed | Budget::Listed)
    }
}

/// First pause of a refund after a transient failure; doubles up to [`REFUND_PAUSE_MAX`].
const REFUND_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest pause between two attempts of a refund.
const REFUND_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// How the isolation was accounted in the pod's PDB.
pub(super) enum Accounting {
    /// This call recorded the disruption in the named PDB (refunded if the patch fails).
    Charged(String),
    /// No PDB selects the pod, or it was already listed as disrupted.
    Free,
    /// A DELETE goes ahead without charging the named PDB (`namespace/name`).
    Uncharged(String),
    /// The budget refuses an eviction.
    Refused(Budget),
}

/// Records the disruption in the single PDB selecting the pod.
pub(super) async fn account(
    ctx: &Context,
    pod: &PodFacts,
    snap: &Snapshot,
    charge: Charge,
    now: Timestamp,
) -> Result<Accounting, Error> {
    let pdb = match snap.pdbs.as_slice() {
        [] => return Ok(Accounting::Free),
        [pdb] => pdb.name.clone(),
        // Several PDBs: an eviction never gets here; a DELETE cannot charge them all.
        [first, ..] => {
            let name = format!("{}/{}", pod.namespace, first.name);
            return Ok(Accounting::Uncharged(name));
        }
    };
    let result = consume_disruption(ctx, &pod.namespace, &pdb, &pod.name, now).await;
    let name = format!("{}/{pdb}", pod.namespace);
    match (charge, result) {
        (_, Ok(Budget::Consumed)) => Ok(Accounting::Charged(pdb)),
        (_, Ok(Budget::Listed)) => Ok(Accounting::Free),
        (Charge::Required, Ok(refused)) => Ok(Accounting::Refused(refused)),
        (Charge::Required, Err(error)) => Err(error),
        (Charge::IfPossible, Ok(_)) => Ok(Accounting::Uncharged(name)),
        (Charge::IfPossible, Err(error)) => {
            tracing::warn!(%error, "PDB not charged; a DELETE is isolated anyway");
            Ok(Accounting::Uncharged(name))
        }
    }
}

/// Gives back the disruption this call recorded for `pod` in PDB `namespace/name`: the pod
/// leaves `status.disruptedPods` and `disruptionsAllowed` goes up by one, in one
/// resourceVersion-guarded update (retried on 409, and after a short pause on a throttled
/// or failed call: the refund usually follows a relabel that was itself throttled, and a
/// charge left behind would hold the budget's disruption for two minutes — the caller
/// retrying at once would find the budget spent). Failures are logged; the disruption
/// controller drops the entry after about two minutes anyway.
pub async fn refund_disruption(ctx: &Context, namespace: &str, name: &str, pod: &str) {
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace);
    let gate = ctx.gates.gate(namespace, name);
    let _serialised = gate.turn.lock().await;
    let mut backoff = Backoff::new(REFUND_PAUSE, REFUND_PAUSE_MAX);
    for _ in 0..PDB_ATTEMPTS {
        let mut pdb = match api.get(name).await {
            Ok(pdb) => pdb,
            Err(error) if is_transient(&error) => {
                backoff.wait().await;
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, pdb = %format!("{namespace}/{name}"), "refund PDB: read");
                return;
            }
        };
        let Some(status) = pdb.status.as_mut() else {
            return;
        };
        if status
            .disrupted_pods
            .as_mut()
            .and_then(|d| d.remove(pod))
            .is_none()
        {
            return;
        }
        status.disruptions_allowed += 1;
        match api.replace_status(name, &PostParams::default(), &pdb).await {
            Ok(updated) => {
                ctx.cache.apply_pdb(&updated);
                return;
            }
            Err(e) if is_status(&e, &[409]) => continue,
            Err(error) if is_transient(&error) => {
                backoff.wait().await;
            }
            Err(error) => {
                tracing::warn!(%error, pdb = %format!("{namespace}/{name}"), "refund PDB: update");
                return;
            }
        }
    }
}

/// One gate per PDB, so this replica's concurrent isolations charge a budget in turns
/// (grouped, see [`PdbGate`]) instead of racing each other into resourceVersion
/// conflicts; shared by the admission calls and the deleter.
#[derive(Debug, Default)]
pub struct PdbGates {
    by_pdb: std::sync::Mutex<std::collections::HashMap<(String, String), Arc<PdbGate>>>,
}

impl PdbGates {
    /// The gate serialising this replica's charges to PDB `namespace/name`.
    pub fn gate(&self, namespace: &str, name: &str) -> Arc<PdbGate> {
        let mut gates = self.by_pdb.lock().unwrap_or_else(|e| e.into_inner());
        gates
            .entry((namespace.to_string(), name.to_string()))
            .or_default()
            .clone()
    }
}

/// Charges waiting for their turn on one PDB, and the turn itself.
///
/// Concurrent isolations of pods behind one budget (a drain evicting 16 pods of one
/// Deployment at once) would otherwise write the PDB's status once each, one after the
/// other. Whoever gets the turn charges every pod waiting at that moment in one
/// resourceVersion-guarded update and hands each its answer, so the writes come in
/// groups: the budget arithmetic is the same, applied pod by pod in arrival order.
#[derive(Debug, Default)]
pub struct PdbGate {
    /// Held while one caller reads and writes the PDB (charges and refunds).
    pub turn: tokio::sync::Mutex<()>,
    waiting: std::sync::Mutex<Vec<Waiter>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// A pod waiting for its charge. `None` as the answer: the group's write failed, and the
/// waiter charges again itself (so every error is met by the call it belongs to).
#[derive(Debug)]
struct Waiter {
    id: u64,
    pod: String,
    answer: tokio::sync::oneshot::Sender<Option<Budget>>,
}

/// Records the disruption of `pod` in PDB `namespace/name`, serialised by resourceVersion
/// and grouped with the charges waiting beside it (see [`PdbGate`]). The cached PDB is
/// only a first guess: a refusal is confirmed on the live PDB, so a stale cache never
/// refuses (nor, on the eviction path, lets through) what the API server would decide
/// otherwise.
pub async fn consume_disruption(
    ctx: &Context,
    namespace: &str,
    name: &str,
    pod: &str,
    now: Timestamp,
) -> Result<Budget, Error> {
    let gate = ctx.gates.gate(namespace, name);
    loop {
        let id = gate
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (answer, mut answered) = tokio::sync::oneshot::channel();
        lock_waiting(&gate).push(Waiter {
            id,
            pod: pod.to_string(),
            answer,
        });
        let _turn = gate.turn.lock().await;
        match answered.try_recv() {
            // A group before ours charged this pod.
            Ok(Some(budget)) => return Ok(budget),
            // That group's write failed: queue again and take a turn.
            Ok(None) | Err(tokio::sync::oneshot::error::TryRecvError::Closed) => continue,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
        }
        // A waiter whose admission call gave up (its deadline) is not charged.
        let group: Vec<Waiter> = std::mem::take(&mut *lock_waiting(&gate))
            .into_iter()
            .filter(|w| w.id == id || !w.answer.is_closed())
            .collect();
        let pods: Vec<&str> = group.iter().map(|w| w.pod.as_str()).collect();
        let result = charge_group(ctx, namespace, name, &pods, pod, now).await;
        let mut ours = None;
        match result {
            Ok(budgets) => {
                for (waiter, budget) in group.into_iter().zip(budgets) {
                    if waiter.id == id {
                        ours = Some(budget);
                    } else if let Err(Some(Budget::Consumed)) = waiter.answer.send(Some(budget)) {
                        // Its call gave up while the group was written: give the
                        // disruption back, as a failed relabel does.
                        let (ctx, namespace, name) =
                            (ctx.clone(), namespace.to_string(), name.to_string());
                        tokio::spawn(async move {
                            refund_disruption(&ctx, &namespace, &name, &waiter.pod).await;
                        });
                    }
                }
            }
            Err(error) => {
                for waiter in group {
                    let _ = waiter.answer.send(None);
                }
                return Err(error);
            }
        }
        if let Some(budget) = ours {
            return Ok(budget);
        }
    }
}

fn lock_waiting(gate: &PdbGate) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
    gate.waiting.lock().unwrap_or_else(|e| e.into_inner())
}

/// Charges `pods` (in order) to PDB `namespace/name` in one status update, retried on
/// 409; errors name `pod`, the caller's own pod.
async fn charge_group(
    ctx: &Context,
    namespace: &str,
    name: &str,
    pods: &[&str],
    pod: &str,
    now: Timestamp,
) -> Result<Vec<Budget>, Error> {
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace);
    let pod_name = format!("{namespace}/{pod}");
    let err = |action: &str, source| Error::Api {
        pod: pod_name.clone(),
        action: format!("{action} PDB {namespace}/{name}"),
        source,
    };
    let (mut current, mut live) = match ctx.cache.pdb(namespace, name) {
        Some(pdb) => ((*pdb).clone(), false),
        None => (api.get(name).await.map_err(|e| err("get", e))?, true),
    };
    let mut conflicts = 0;
    let mut backoff = Backoff::jittered(PDB_RETRY_MAX_PAUSE, PDB_RETRY_MAX_PAUSE);
    loop {
        let (next, budgets) = charge_all(&current, pods, now);
        if !live && budgets.iter().any(|b| !b.allows()) {
            current = api.get(name).await.map_err(|e| err("get", e))?;
            live = true;
            continue;
        }
        let Some(next) = next else {
            return Ok(budgets);
        };
        match api
            .replace_status(name, &PostParams::default(), &next)
            .await
        {
            Ok(updated) => {
                ctx.cache.apply_pdb(&updated);
                return Ok(budgets);
            }
            Err(e) if is_status(&e, &[409]) => {
                conflicts += 1;
                if conflicts >= PDB_ATTEMPTS {
                    return Err(Error::PdbContention {
                        pod: pod_name,
                        pdb: format!("{namespace}/{name}"),
                    });
                }
                backoff.wait().await;
                current = api.get(name).await.map_err(|e| err("get", e))?;
                live = true;
            }
            Err(e) => return Err(err("update status of", e)),
        }
    }
}

/// [`charge`] applied to `pods` one after another: the PDB with every disruption it
/// allowed recorded (`None` when nothing changed) and each pod's answer.
pub fn charge_all(
    pdb: &PodDisruptionBudget,
    pods: &[&str],
    now: Timestamp,
) -> (Option<PodDisruptionBudget>, Vec<Budget>) {
    let mut next: Option<PodDisruptionBudget> = None;
    let budgets = pods
        .iter()
        .map(|pod| match charge(next.as_ref().unwrap_or(pdb), pod, now) {
            Ok(Some(charged)) => {
                next = Some(charged);
                Budget::Consumed
            }
            Ok(None) => Budget::Listed,
            Err(refused) => refused,
        })
        .collect();
    (next, budgets)
}

/// The PDB with `pod` charged as disrupted: `Ok(None)` when already listed, `Err` when
/// the budget refuses. Pure, so the accounting rules are table-tested.
pub fn charge(
    pdb: &PodDisruptionBudget,
    pod: &str,
    now: Timestamp,
) -> Result<Option<PodDisruptionBudget>, Budget> {
    let name = format!(
        "{}/{}",
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
        pdb.metadata.name.as_deref().unwrap_or_default()
    );
    let status = pdb.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(-1) < pdb.metadata.generation.unwrap_or(0) {
        return Err(Budget::NotObserved { pdb: name });
    }
    if status
        .disrupted_pods
        .as_ref()
        .is_some_and(|d| d.contains_key(pod))
    {
        return Ok(None);
    }
    if status.disruptions_allowed <= 0 {
        return Err(Budget::Exhausted { pdb: name });
    }
    let mut next = pdb.clone();
    let mut status = status;
    status.disruptions_allowed -= 1;
    status
        .disrupted_pods
        .get_or_insert_with(BTreeMap::new)
        .insert(pod.to_string(), Time(now));
    next.status = Some(status);
    Ok(Some(next))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use serde_json::{Value, json};

    use super::*;
    use crate::isolate::tests::{now, pdb_json};

    #[test]
    fn charging_a_pdb_follows_the_eviction_rules() {
        let pdb = |v: Value| serde_json::from_value::<PodDisruptionBudget>(v).unwrap();
        let next = charge(&pdb(pdb_json("5", 2)), "web-1", now())
            .unwrap()
            .unwrap();
        let status = next.status.unwrap();
        assert_eq!(status.disruptions_allowed, 1);
        assert!(status.disrupted_pods.unwrap().contains_key("web-1"));
        assert_eq!(next.metadata.resource_version.as_deref(), Some("5"));

        assert_eq!(
            charge(&pdb(pdb_json("5", 0)), "web-1", now()).unwrap_err(),
            Budget::Exhausted {
                pdb: "web/web".into()
            }
        );
        let mut listed = pdb_json("5", 0);
        listed["status"]["disruptedPods"] = json!({"web-1": "2026-01-01T00:00:00Z"});
        assert_eq!(charge(&pdb(listed), "web-1", now()), Ok(None));
        let mut unobserved = pdb_json("5", 3);
        unobserved["metadata"]["generation"] = json!(2);
        assert_eq!(
            charge(&pdb(unobserved), "web-1", now()).unwrap_err(),
            Budget::NotObserved {
                pdb: "web/web".into()
            }
        );
    }

    /// [`charge_all`] applies the single-pod rules in arrival order: a repeated pod is
    /// listed, and the budget runs out part-way through the group.
    #[test]
    fn a_group_charge_follows_the_rules_pod_by_pod() {
        let pdb = |v: Value| serde_json::from_value::<PodDisruptionBudget>(v).unwrap();
        let (next, budgets) = charge_all(&pdb(pdb_json("5", 2)), &["a", "b", "a", "c"], now());
        assert_eq!(
            budgets,
            [
                Budget::Consumed,
                Budget::Consumed,
                Budget::Listed,
                Budget::Exhausted {
                    pdb: "web/web".into()
                }
            ]
        );
        let status = next.unwrap().status.unwrap();
        assert_eq!(status.disruptions_allowed, 0);
        assert_eq!(status.disrupted_pods.unwrap().len(), 2);
        let (next, budgets) = charge_all(&pdb(pdb_json("5", 0)), &["a"], now());
        assert!(next.is_none() && !budgets[0].allows());
    }
}
