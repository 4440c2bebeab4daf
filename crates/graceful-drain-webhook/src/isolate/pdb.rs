//! Charging a pod's disruption to its PodDisruptionBudget, and giving it back.
//!
//! The API server's eviction code records a disruption as `status.disruptedPods` plus
//! `disruptionsAllowed - 1` in one resourceVersion-guarded status update; isolation does
//! the same before it relabels, in turns per PDB ([`PdbGate`]) so this replica's
//! concurrent isolations write one update together instead of racing into conflicts.
//! This module makes the API calls; the budget arithmetic and the gates are `budget`'s.

use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::PostParams;

use graceful_drain_core::backoff::Backoff;

use super::budget::{Budget, PdbGate, Waiter, charge_all};
use super::context::Context;
use super::error::{Error, is_status, is_transient};
use crate::decide::{Charge, PodFacts, Snapshot};

/// How often a PDB status update is retried after a 409 before giving up. Charges from
/// this replica are serialised (and grouped) by [`PdbGate`], so conflicts come only from other
/// replicas (or the disruption controller); each retry re-reads the PDB after a short
/// jittered pause. 20 attempts of at most [`PDB_RETRY_MAX_PAUSE`] stay well inside one
/// admission call even with several replicas evicting from the same budget.
const PDB_ATTEMPTS: usize = 20;
/// Upper bound of the random pause before re-reading a conflicting PDB (drawn from its upper
/// half): long enough for a competing replica's update to land, short against the 10 s
/// admission budget.
const PDB_RETRY_MAX_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

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

/// What a status change makes of the PDB it is shown (see [`update_status`]).
pub(crate) enum Change<R> {
    /// Write this PDB (its resourceVersion guards the write), then answer `R`.
    Write(Box<PodDisruptionBudget>, R),
    /// Nothing to write: answer `R`.
    Keep(R),
    /// The PDB shown is the cache's and does not settle the change: read it live and ask
    /// again.
    ReadLive,
}

/// How [`update_status`] retries.
pub(crate) struct Retries {
    /// Attempts at most (a conflicting or, with `transient`, failed call spends one).
    pub attempts: usize,
    /// The pause before reading the PDB again.
    pub backoff: Backoff,
    /// A throttled or failed call is retried too, not only a conflict.
    pub transient: bool,
}

/// Why [`update_status`] gave up.
#[derive(Debug)]
pub(crate) enum StatusError {
    /// The PDB could not be read.
    Read(kube::Error),
    /// The update was refused otherwise than by a conflict.
    Write(kube::Error),
    /// Every attempt met a conflict (or, with `transient`, a failure); the last error.
    Contended(kube::Error),
}

/// Changes the status of PDB `namespace/name` with `change`, shown `start` (the cache's
/// copy) or the live object and told which: one resourceVersion-guarded update, and after
/// a conflict a pause, a live read and `change` asked again, up to `retries.attempts`. The
/// written PDB, or the live one when nothing is written, goes into the cache. Every
/// status update of a PDB here goes through it: the charge, the refund and the renewal.
pub(crate) async fn update_status<R>(
    ctx: &Context,
    namespace: &str,
    name: &str,
    start: Option<PodDisruptionBudget>,
    mut retries: Retries,
    mut change: impl FnMut(&PodDisruptionBudget, bool) -> Change<R>,
) -> Result<R, StatusError> {
    let api = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace);
    let retried = |error: &kube::Error, transient: bool| {
        is_status(error, &[409]) || (transient && is_transient(error))
    };
    let mut current = start;
    let mut last = None;
    for _ in 0..retries.attempts {
        let (pdb, live) = match current.take() {
            Some(pdb) => (pdb, false),
            None => match api.get(name).await {
                Ok(pdb) => (pdb, true),
                Err(error) if retries.transient && is_transient(&error) => {
                    last = Some(error);
                    retries.backoff.wait().await;
                    continue;
                }
                Err(error) => return Err(StatusError::Read(error)),
            },
        };
        let (next, answer) = match change(&pdb, live) {
            Change::Write(next, answer) => (next, answer),
            Change::Keep(answer) => {
                if live {
                    ctx.cache.apply_pdb(&pdb);
                }
                return Ok(answer);
            }
            // The next attempt reads it live.
            Change::ReadLive => continue,
        };
        match api
            .replace_status(name, &PostParams::default(), &next)
            .await
        {
            Ok(written) => {
                ctx.cache.apply_pdb(&written);
                return Ok(answer);
            }
            Err(error) if retried(&error, retries.transient) => {
                last = Some(error);
                retries.backoff.wait().await;
            }
            Err(error) => return Err(StatusError::Write(error)),
        }
    }
    Err(StatusError::Contended(last.unwrap_or_else(|| {
        kube::Error::Service(format!("PDB {namespace}/{name} kept changing").into())
    })))
}

/// Gives back the disruption this call recorded for `pod` in PDB `namespace/name`: the pod
/// leaves `status.disruptedPods` and `disruptionsAllowed` goes up by one, in one
/// resourceVersion-guarded update (retried on 409, and after a short pause on a throttled
/// or failed call: the refund usually follows a relabel that was itself throttled, and a
/// charge left behind would hold the budget's disruption for two minutes — the caller
/// retrying at once would find the budget spent). Failures are logged; the disruption
/// controller drops the entry after about two minutes anyway.
pub async fn refund_disruption(ctx: &Context, namespace: &str, name: &str, pod: &str) {
    let gate = ctx.gates.gate(namespace, name);
    let _serialised = gate.turn.lock().await;
    let retries = Retries {
        attempts: PDB_ATTEMPTS,
        backoff: Backoff::new(REFUND_PAUSE, REFUND_PAUSE_MAX),
        transient: true,
    };
    // Started without the cache's copy, so always shown the live PDB: the refund must not
    // undo a disruption another call recorded.
    let refund = |current: &PodDisruptionBudget, _live: bool| {
        let mut next = current.clone();
        let Some(status) = next.status.as_mut() else {
            return Change::Keep(());
        };
        if status
            .disrupted_pods
            .as_mut()
            .and_then(|d| d.remove(pod))
            .is_none()
        {
            return Change::Keep(());
        }
        status.disruptions_allowed += 1;
        Change::Write(Box::new(next), ())
    };
    if let Err(error) = update_status(ctx, namespace, name, None, retries, refund).await {
        tracing::warn!(?error, pdb = %format!("{namespace}/{name}"), "refund PDB");
    }
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
    let retries = Retries {
        attempts: PDB_ATTEMPTS,
        backoff: Backoff::jittered(PDB_RETRY_MAX_PAUSE, PDB_RETRY_MAX_PAUSE),
        transient: false,
    };
    let cached = ctx.cache.pdb(namespace, name).map(|pdb| (*pdb).clone());
    let charge = |current: &PodDisruptionBudget, live: bool| {
        let (next, budgets) = charge_all(current, pods, now);
        match next {
            _ if !live && budgets.iter().any(|b| !b.allows()) => Change::ReadLive,
            Some(next) => Change::Write(Box::new(next), budgets),
            None => Change::Keep(budgets),
        }
    };
    let pod_name = format!("{namespace}/{pod}");
    let err = |action: &str, source| Error::Api {
        pod: pod_name.clone(),
        action: format!("{action} PDB {namespace}/{name}"),
        source,
    };
    match update_status(ctx, namespace, name, cached, retries, charge).await {
        Ok(budgets) => Ok(budgets),
        Err(StatusError::Read(source)) => Err(err("get", source)),
        Err(StatusError::Write(source)) => Err(err("update status of", source)),
        Err(StatusError::Contended(_)) => Err(Error::PdbContention {
            pod: pod_name.clone(),
            pdb: format!("{namespace}/{name}"),
            attempts: PDB_ATTEMPTS,
        }),
    }
}
