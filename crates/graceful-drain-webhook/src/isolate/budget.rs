//! A PodDisruptionBudget's arithmetic and this replica's turns at it, without API calls:
//! what charging a pod does to a budget (upstream's eviction rules, pure and
//! table-tested), what the charge answers ([`Budget`]), and the gates that make this
//! replica's concurrent charges of one PDB take turns and go in groups ([`PdbGate`]).
//! `pdb` reads and writes the budgets with them.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
    pub(super) waiting: std::sync::Mutex<Vec<Waiter>>,
    pub(super) next_id: std::sync::atomic::AtomicU64,
}

/// A pod waiting for its charge. `None` as the answer: the group's write failed, and the
/// waiter charges again itself (so every error is met by the call it belongs to).
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) pod: String,
    pub(super) answer: tokio::sync::oneshot::Sender<Option<Budget>>,
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
