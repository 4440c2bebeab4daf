//! A small leader elector on a `coordination.k8s.io/v1` Lease, so only one webhook
//! replica runs the deferred deleter.
//!
//! Every [`RETRY`] the holder renews `renewTime`; another replica takes over only once
//! `renewTime + leaseDurationSeconds` has passed. Every write is a replace carrying the
//! resourceVersion that was read, so two replicas can never both win: the loser gets a
//! 409 and tries again next round. A replica that cannot renew within [`RENEW_DEADLINE`]
//! stops acting as leader before its lease can expire for the others. On shutdown the
//! holder clears `holderIdentity` so failover is immediate.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use graceful_drain_core::runtime::Shutdown;

/// The Lease's name unless `--lease-name` says otherwise (the chart keeps it).
pub const DEFAULT_NAME: &str = "graceful-drain-webhook";
/// Lease duration; the client-go defaults (15 s lease, 10 s renew deadline, 2 s retry)
/// are what operators know from kube-controller-manager.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// A leader that could not renew for this long steps down (shorter than the lease).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Period of acquire/renew attempts.
pub const RETRY: Duration = Duration::from_secs(2);
/// How long past another holder's expiry a waiting replica still counts the deleter as
/// alive: it takes the Lease over at its next round, at most [`RETRY`] later. Without it,
/// admission would count nobody as the deleter in between and let an exposed pod's
/// eviction through unprotected — after a replica is killed holding the Lease, say.
pub const TAKEOVER: Duration = Duration::from_secs(4);
/// Bound of one acquire/renew round (read + write): half the renew deadline, so a hung
/// call still leaves time for another round before the leader steps down.
pub const ROUND_TIMEOUT: Duration = Duration::from_secs(5);

/// Until when the lease is held by someone (`renewTime + leaseDurationSeconds`), `None`
/// when nobody holds it.
pub fn held_until(lease: &Lease) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    let renewed = spec.renew_time.as_ref()?.0;
    let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    renewed
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .ok()
}

/// Lease errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action} lease {namespace}/{name}")]
    Api {
        /// The call that failed (`get`, `write` or `release`).
        action: &'static str,
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An acquire/renew round did not finish within [`ROUND_TIMEOUT`].
    #[error("renew lease {namespace}/{name}: no answer within {ROUND_TIMEOUT:?}")]
    Timeout {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
    },
}

/// What to write after reading the lease.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// No lease yet: create this one.
    Create(Lease),
    /// Replace with this one (renewal or takeover), guarded by the read resourceVersion.
    Replace(Lease),
    /// Someone else holds a live lease.
    Wait,
}

fn micro(now: Timestamp) -> MicroTime {
    MicroTime(now)
}

/// Decides the next write for `identity` given the lease read (pure).
pub fn next_step(current: Option<&Lease>, name: &str, identity: &str, now: Timestamp) -> Step {
    let seconds = i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(15);
    let Some(lease) = current else {
        return Step::Create(Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_string()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(micro(now)),
                renew_time: Some(micro(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        });
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
    let mut next = lease.clone();
    let mut new_spec = spec.clone();
    new_spec.renew_time = Some(micro(now));
    new_spec.lease_duration_seconds = Some(seconds);
    if holder == Some(identity) {
        next.spec = Some(new_spec);
        return Step::Replace(next);
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(seconds));
    let expired = spec
        .renew_time
        .as_ref()
        .is_none_or(|t| t.0.as_second() + duration < now.as_second());
    if holder.is_some() && !expired {
        return Step::Wait;
    }
    new_spec.holder_identity = Some(identity.to_string());
    new_spec.acquire_time = Some(micro(now));
    new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    next.spec = Some(new_spec);
    Step::Replace(next)
}

/// The elector.
pub struct Elector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    /// Where to report until when some replica holds the lease (admission refuses to
    /// isolate pods nobody would delete).
    presence: Option<std::sync::Arc<super::cache::Cache>>,
    /// The probe's outcome, written into the Lease's annotations with every write of ours.
    protection: Option<std::sync::Arc<super::probe::Shared>>,
}

impl Elector {
    /// An elector for Lease `namespace/name` as `identity`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            presence: None,
            protection: None,
        }
    }

    /// Reports the lease's holder expiry to `cache` after every round.
    pub fn reporting_to(mut self, cache: std::sync::Arc<super::cache::Cache>) -> Elector {
        self.presence = Some(cache);
        self
    }

    /// Publishes the probe's outcome in the Lease while this replica holds it, where
    /// `graceful-drain status` reads it.
    pub fn publishing(mut self, protection: std::sync::Arc<super::probe::Shared>) -> Elector {
        self.protection = Some(protection);
        self
    }

    fn annotate(&self, lease: &mut Lease) {
        let Some(protection) = &self.protection else {
            return;
        };
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.remove(super::probe::MESSAGE_ANNOTATION);
        for (key, value) in protection.annotations() {
            annotations.insert(key.to_string(), value);
        }
    }

    fn report(&self, until: Option<Timestamp>) {
        if let Some(cache) = &self.presence {
            cache.set_deleter_lease(until);
        }
    }

    fn err(&self, action: &'static str, source: kube::Error) -> Error {
        Error::Api {
            action,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// One acquire/renew round: `Ok(true)` when we hold the lease afterwards.
    pub async fn try_acquire(&self) -> Result<bool, Error> {
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err("get", e))?;
        let step = next_step(
            current.as_ref(),
            &self.name,
            &self.identity,
            Timestamp::now(),
        );
        let written = match step {
            Step::Wait => {
                let takeover = jiff::SignedDuration::try_from(TAKEOVER).unwrap_or_default();
                let until = current.as_ref().and_then(held_until);
                self.report(until.and_then(|t| t.checked_add(takeover).ok()));
                return Ok(false);
            }
            Step::Create(mut lease) => {
                self.annotate(&mut lease);
                self.api.create(&PostParams::default(), &lease).await
            }
            Step::Replace(mut lease) => {
                self.annotate(&mut lease);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(lease) => {
                self.report(held_until(&lease));
                Ok(true)
            }
            // Someone else wrote the lease just now: it is held.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let now = Timestamp::now();
                self.report(now.checked_add(jiff::SignedDuration::from_secs(15)).ok());
                Ok(false)
            }
            Err(e) => Err(self.err("write", e)),
        }
    }

    /// Gives the lease up if we hold it.
    pub async fn release(&self) -> Result<(), Error> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.err("get", e))?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(e) => Err(self.err("release", e)),
        }
    }

    /// Runs until `shutdown`, publishing leadership on `leader`.
    pub async fn run(self, leader: watch::Sender<bool>, shutdown: Shutdown) -> Result<(), Error> {
        let mut last_renew: Option<tokio::time::Instant> = None;
        let mut tick = tokio::time::interval(RETRY);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let round = match tokio::time::timeout(ROUND_TIMEOUT, self.try_acquire()).await {
                Ok(round) => round,
                Err(_) => Err(Error::Timeout {
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                }),
            };
            match round {
                Ok(true) => {
                    last_renew = Some(tokio::time::Instant::now());
                    if !*leader.borrow() {
                        tracing::info!(identity = %self.identity, "acquired deleter lease");
                    }
                    leader.send_replace(true);
                }
                Ok(false) => {
                    leader.send_replace(false);
                }
                Err(error) => {
                    tracing::warn!(error = %graceful_drain_core::error::chain(&error), "renew deleter lease");
                    if last_renew.is_none_or(|t| t.elapsed() >= RENEW_DEADLINE) {
                        leader.send_replace(false);
                    }
                }
            }
        }
        leader.send_replace(false);
        if let Err(error) = self.release().await {
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "release deleter lease");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Scenario::*;
    use graceful_drain_testing::fixtures::mock;
    use http::Method;
    use serde_json::json;

    /// What the API server does with Lease `ns/gd`, in the order the elector asks.
    enum Scenario {
        /// The `GET` answers the Lease held by `by`, renewed at `renewed` (seconds, UTC).
        LeaseHeldBy { by: &'static str, renewed: String },
        /// The `GET` answers the Lease released by its last holder, renewed at `renewed`.
        LeaseReleased { renewed: String },
        /// The `PUT` taking the Lease fails with a 500.
        TakeoverFails,
        /// The `PUT` taking the Lease conflicts (409): another replica took it first.
        TakeoverConflicts,
    }

    impl mock::Scenario for Scenario {
        fn steps(self) -> Vec<mock::Step> {
            const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/gd";
            let read = |l: Lease| {
                mock::Step::new(Method::GET, PATH, 200, serde_json::to_value(l).unwrap())
            };
            vec![match self {
                LeaseHeldBy { by, renewed } => read(lease(Some(by), &renewed)),
                LeaseReleased { renewed } => read(lease(None, &renewed)),
                TakeoverFails => mock::Step::refused(Method::PUT, PATH, 500, "boom"),
                TakeoverConflicts => mock::Step::refused(Method::PUT, PATH, 409, "Conflict"),
            }]
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn lease(holder: Option<&str>, renewed: &str) -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": "gd", "namespace": "ns", "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": format!("{renewed}.000000Z"), "leaseTransitions": 3}
        }))
        .unwrap()
    }

    fn holder(step: &Step) -> Option<String> {
        match step {
            Step::Create(l) | Step::Replace(l) => l.spec.as_ref()?.holder_identity.clone(),
            Step::Wait => None,
        }
    }

    #[test]
    fn acquire_renew_and_takeover_rules() {
        let now = at("2026-01-01T00:00:20Z");
        let create = next_step(None, "gd", "a", now);
        assert!(matches!(create, Step::Create(_)));
        assert_eq!(holder(&create).as_deref(), Some("a"));

        let live = lease(Some("b"), "2026-01-01T00:00:10");
        assert_eq!(next_step(Some(&live), "gd", "a", now), Step::Wait);

        let renew = next_step(Some(&live), "gd", "b", now);
        let Step::Replace(renewed) = &renew else {
            panic!("{renew:?}")
        };
        let spec = renewed.spec.as_ref().unwrap();
        assert_eq!(spec.renew_time.as_ref().unwrap().0, now);
        assert_eq!(
            spec.lease_transitions,
            Some(3),
            "renewal is not a transition"
        );
        assert_eq!(
            renewed.metadata.resource_version.as_deref(),
            Some("7"),
            "guarded by the read version"
        );

        let expired = lease(Some("b"), "2026-01-01T00:00:04");
        let takeover = next_step(Some(&expired), "gd", "a", now);
        let Step::Replace(taken) = &takeover else {
            panic!("{takeover:?}")
        };
        let spec = taken.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(4));

        let released = lease(None, "2026-01-01T00:00:19");
        assert_eq!(
            holder(&next_step(Some(&released), "gd", "a", now)).as_deref(),
            Some("a")
        );
    }

    /// Admission knows whether anyone would delete an isolated pod: a live holder (ours
    /// or another replica's) counts, an expired or released lease does not.
    #[tokio::test]
    async fn rounds_report_whether_anyone_holds_the_lease() {
        let cache = std::sync::Arc::new(crate::cache::Cache::default());
        cache.enable_deleter_gate();
        let now = Timestamp::now();
        assert!(!cache.deleter_alive(now), "nobody reported yet");
        let (client, mut api) = mock::client();
        let elector = Elector::new(client, "ns", "gd", "a").reporting_to(cache.clone());
        let renewed = now.strftime("%Y-%m-%dT%H:%M:%S").to_string();
        let task = tokio::spawn(async move {
            let first = elector.try_acquire().await.unwrap();
            let second = elector.try_acquire().await;
            (first, second)
        });
        let scenarios = [
            LeaseHeldBy {
                by: "b",
                renewed: renewed.clone(),
            },
            LeaseReleased {
                renewed: renewed.clone(),
            },
            TakeoverFails,
        ];
        let [_held, _released, put] = mock::play(&mut api, scenarios).await.try_into().unwrap();
        assert_eq!(put.body["spec"]["holderIdentity"], "a");
        let (first, second) = task.await.unwrap();
        assert!(!first);
        assert!(second.is_err());
        // The other replica's live hold was reported and is still valid, and counts for
        // [`TAKEOVER`] past its expiry: this replica takes it over at its next round.
        assert!(cache.deleter_alive(now));
        let expiry = held_until(&lease(Some("b"), &renewed)).unwrap();
        let after = |secs: i64| expiry + jiff::SignedDuration::from_secs(secs);
        assert!(cache.deleter_alive(after(3)), "a takeover is seconds away");
        assert!(!cache.deleter_alive(after(5)), "nobody took it over");
        cache.set_deleter_lease(held_until(&lease(Some("b"), "2020-01-01T00:00:00")));
        assert!(!cache.deleter_alive(now), "an expired lease holds nothing");
        assert_eq!(held_until(&lease(None, &renewed)), None);
    }

    /// A renew call the API server never answers is abandoned after [`ROUND_TIMEOUT`]: the
    /// elector tries again instead of hanging (virtual time).
    #[tokio::test(start_paused = true)]
    async fn a_hung_lease_call_does_not_stall_the_elector() {
        let (client, mut api) = mock::client();
        let elector = Elector::new(client, "ns", "gd", "a");
        let (leader, _watch) = watch::channel(false);
        let shutdown = Shutdown::new();
        let task = tokio::spawn(elector.run(leader, shutdown.clone()));
        let (first, _never_answered) = api.next_request().await.unwrap();
        assert_eq!(first.method(), Method::GET);
        let next = tokio::time::timeout(Duration::from_secs(60), api.next_request()).await;
        let (second, _) = next.expect("a new round after the hung one").unwrap();
        assert_eq!(second.method(), Method::GET);
        shutdown.cancel();
        drop(api);
        let _ = task.await;
    }

    #[tokio::test]
    async fn losing_the_race_for_an_expired_lease_is_not_an_error() {
        let (client, mut api) = mock::client();
        let elector = Elector::new(client, "ns", "gd", "a");
        let task = tokio::spawn(async move { elector.try_acquire().await });
        let expired = LeaseHeldBy {
            by: "b",
            renewed: "2020-01-01T00:00:00".into(),
        };
        let [_expired, put] = mock::play(&mut api, [expired, TakeoverConflicts])
            .await
            .try_into()
            .unwrap();
        assert_eq!(put.body["metadata"]["resourceVersion"], "7");
        assert_eq!(put.body["spec"]["holderIdentity"], "a");
        assert!(!task.await.unwrap().unwrap());
    }
}
