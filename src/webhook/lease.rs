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

use crate::runtime::Shutdown;

/// Lease duration; the client-go defaults (15 s lease, 10 s renew deadline, 2 s retry)
/// are what operators know from kube-controller-manager.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// A leader that could not renew for this long steps down (shorter than the lease).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Period of acquire/renew attempts.
pub const RETRY: Duration = Duration::from_secs(2);

/// Lease errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action} lease {namespace}/{name}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
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
}

impl Elector {
    /// An elector for Lease `namespace/name` as `identity`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
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
            Step::Wait => return Ok(false),
            Step::Create(lease) => self.api.create(&PostParams::default(), &lease).await,
            Step::Replace(lease) => {
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
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
            match self.try_acquire().await {
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
                    tracing::warn!(error = %crate::error::chain(&error), "renew deleter lease");
                    if last_renew.is_none_or(|t| t.elapsed() >= RENEW_DEADLINE) {
                        leader.send_replace(false);
                    }
                }
            }
        }
        leader.send_replace(false);
        if let Err(error) = self.release().await {
            tracing::warn!(error = %crate::error::chain(&error), "release deleter lease");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::mock::{self, expect};
    use http::Method;
    use serde_json::json;

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

    #[tokio::test]
    async fn losing_the_race_for_an_expired_lease_is_not_an_error() {
        let (client, mut api) = mock::client();
        let elector = Elector::new(client, "ns", "gd", "a");
        let task = tokio::spawn(async move { elector.try_acquire().await });
        let path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/gd";
        let current = serde_json::to_value(lease(Some("b"), "2020-01-01T00:00:00")).unwrap();
        expect(&mut api, Method::GET, path, 200, current).await;
        let put = expect(
            &mut api,
            Method::PUT,
            path,
            409,
            mock::status(409, "Conflict"),
        )
        .await;
        assert_eq!(put.body["metadata"]["resourceVersion"], "7");
        assert_eq!(put.body["spec"]["holderIdentity"], "a");
        assert!(!task.await.unwrap().unwrap());
    }
}
