//! The unconfirmed share: how many of a Service's pods isolations that nothing
//! authenticated confirmed may hold at once, counted over every replica.
//!
//! The count is one table, kept in the annotation [`ANNOTATION`] of a Lease in the
//! release namespace ([`lease_name`]) that every replica reads and replaces with the
//! resourceVersion it read: two replicas reserving for the same Service at once cannot
//! both win, the loser reads again and counts the winner's entry. A table in each
//! process would let a flood split over the chart's two replicas take twice the share
//! (all six pods of a six-pod Service, measured). Tests and the simulated cluster's
//! in-process checks keep the table in memory ([`Unconfirmed::default`]).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Percentage of a Service's pods (rounded up, at least one) that isolations nothing
/// authenticated confirmed may hold at once; never its last ready endpoint.
///
/// An isolation is confirmed when something only an authenticated user can do stands
/// behind it: the pod's node is being drained (a drainer's mark, not a mere cordon), or
/// the live ReplicaSet has a pod too many for its controller's DELETE. Anything else — an
/// eviction on a schedulable node (the descheduler, or a review forged by anyone who
/// reaches the port), a DELETE by a person or another controller — could be a forged
/// review, so a flood of them must not empty a Service (docs/security.md). An eviction of
/// a pod a PodDisruptionBudget selects is bounded by that budget instead (it is charged);
/// a DELETE, which no budget blocks, by this share. Half keeps most of a Service serving
/// while replacements start and still lets people delete a few pods of a small
/// Deployment at once (two of four); drains and rollouts are confirmed and never counted.
pub const UNCONFIRMED_SHARE_PERCENT: usize = 50;

/// The annotation of the share's Lease that holds the table (JSON).
pub const ANNOTATION: &str = "graceful-drain.io/unconfirmed-isolations";

/// The share's Lease, beside the deleter's Lease `deleter_lease` in the same namespace.
pub fn lease_name(deleter_lease: &str) -> String {
    format!("{deleter_lease}-unconfirmed")
}

/// How long an entry counts while its isolation is under way (its pod not yet seen
/// isolated): a whole request's time, after which an isolation that never landed (a
/// review whose caller hung up, a replica that died mid-way) no longer counts.
const LANDING: SignedDuration = SignedDuration::from_secs(35);

/// How long a landed isolation's entry still counts whatever a replica's cache shows: the
/// other replicas' watches see our relabel within moments, and until they do their caches
/// show the pod not isolated. Ending the count at once would let such a replica drop the
/// entry from the table (and isolate one more); keeping it the whole landing time would
/// hold the place of a pod its caller deleted at its delete time.
const LANDED: SignedDuration = SignedDuration::from_secs(5);

/// Entries the table holds at most, over every Service: with names at Kubernetes' limits
/// they stay well under the 256 KiB the API server allows for an object's annotations.
/// Past it every further unconfirmed isolation is refused until entries lapse (a drain or
/// rollout is confirmed and never counted).
pub const MAX_ENTRIES: usize = 512;

/// Read-and-replace rounds one change tries before it gives up.
const ATTEMPTS: usize = 8;

/// Unconfirmed isolations by Service (`namespace/name`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    #[serde(flatten)]
    by_service: BTreeMap<String, Service>,
}

/// One Service's unconfirmed isolations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Service {
    /// How many pods the Service had ready when the first of `held` was counted. The
    /// share is of these pods, not of more: a replacement its ReplicaSet starts for an
    /// isolated pod turns ready in the slices before a load balancer sends it traffic
    /// (its health checks take seconds to minutes), so counting it would let the next
    /// isolation take a pod that still serves while the replacement does not yet. Seen
    /// on the real tier: a flood whose isolations were counted one after another
    /// isolated 4 of 6 pods once one replacement was listed ready, and the load balancer
    /// served from 2.
    base: usize,
    held: Vec<Held>,
}

/// An unconfirmed isolation of one pod, landed or under way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Held {
    /// The pod's name (in the Service's namespace).
    pod: String,
    /// When the pod is put back at the latest: the entry lapses then.
    until: Timestamp,
    /// Until then the entry counts although no cache shows the pod isolated yet, so
    /// concurrent reviews cannot all pass the check before any of them isolates.
    landing_by: Timestamp,
}

/// What a replica's cache shows of a pod the table holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    /// The pod carries our isolation (it is neither deleted, restored nor replaced).
    pub isolated: bool,
    /// An EndpointSlice still lists it as a ready endpoint.
    pub listed_ready: bool,
}

/// One unconfirmed isolation asked for: the facts the share is decided on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask<'a> {
    pub namespace: &'a str,
    pub service: &'a str,
    pub pod: &'a str,
    /// How many other pods the Service's slices list as ready.
    pub ready_others: usize,
    /// A PodDisruptionBudget charged for this isolation bounds it: only the last
    /// endpoint is kept.
    pub budgeted: bool,
    /// When the pod would be put back at the latest.
    pub until: Timestamp,
}

fn key(namespace: &str, service: &str) -> String {
    format!("{namespace}/{service}")
}

impl Table {
    /// Why isolating `ask.pod` unconfirmed now would take its Service too far, if it
    /// would; if not, its entry is added. `seen` tells what the cache shows of a held pod.
    fn reserve(
        &mut self,
        ask: Ask<'_>,
        now: Timestamp,
        seen: impl Fn(&str) -> Seen,
    ) -> Option<String> {
        let Ask {
            namespace,
            service,
            pod,
            ..
        } = ask;
        self.lapse(now);
        let full = self
            .by_service
            .values()
            .map(|s| s.held.len())
            .sum::<usize>()
            >= MAX_ENTRIES;
        let Service { base, held } = self.by_service.entry(key(namespace, service)).or_default();
        held.retain(|h| h.pod != pod && (h.landing_by > now || seen(&h.pod).isolated));
        // A held pod the slices still list is among `ready_others`: count it once.
        let still_listed = held.iter().filter(|h| seen(&h.pod).listed_ready).count();
        let ready_others = ask.ready_others.saturating_sub(still_listed);
        if held.is_empty() || *base == 0 {
            *base = ready_others + 1 + held.len();
        }
        let why = if ready_others == 0 {
            Some(format!(
                "pod {namespace}/{pod} is the last ready endpoint of Service {service}"
            ))
        } else if ask.budgeted {
            // The budget it is charged to bounds it; nothing to reserve (its entry, added
            // once it landed, keeps the last endpoint for the others).
            self.by_service.retain(|_, s| !s.held.is_empty());
            return None;
        } else {
            // Half of the pods there were when the first isolation was counted, and of
            // those there are now, whichever is fewer.
            let total = (ready_others + 1 + held.len()).min(*base);
            let allowed = (total * UNCONFIRMED_SHARE_PERCENT).div_ceil(100).max(1);
            (held.len() >= allowed).then(|| {
                format!(
                    "Service {service} already has {} of its {total} pods isolated by evictions or deletions no drain or rollout confirms (at most {allowed} at once)",
                    held.len()
                )
            })
        };
        let why = why.or_else(|| {
            full.then(|| {
                format!(
                    "{MAX_ENTRIES} isolations no drain or rollout confirms are already under way in the cluster"
                )
            })
        });
        if why.is_none() {
            held.push(Held {
                pod: pod.to_string(),
                until: ask.until,
                landing_by: now.checked_add(LANDING).unwrap_or(Timestamp::MAX),
            });
        }
        self.by_service.retain(|_, s| !s.held.is_empty());
        why
    }

    /// Keeps pod `namespace/pod`'s entries in `services` until `until`, its isolation
    /// having landed with that restore time: [`LANDED`] from now on they count only while
    /// the pod is seen isolated, so a pod deleted or put back early frees its place.
    fn record<'a>(
        &mut self,
        namespace: &str,
        services: impl IntoIterator<Item = &'a str>,
        pod: &str,
        until: Timestamp,
        now: Timestamp,
    ) {
        let landing_by = now.checked_add(LANDED).unwrap_or(Timestamp::MAX);
        for service in services {
            let entry = self.by_service.entry(key(namespace, service)).or_default();
            match entry.held.iter_mut().find(|h| h.pod == pod) {
                Some(h) => {
                    h.until = until;
                    h.landing_by = h.landing_by.min(landing_by);
                }
                None => entry.held.push(Held {
                    pod: pod.to_string(),
                    until,
                    landing_by,
                }),
            }
        }
    }

    /// Drops the entries of pod `namespace/pod`: its isolation did not happen.
    fn release(&mut self, namespace: &str, pod: &str) {
        let prefix = format!("{namespace}/");
        for (service, entry) in &mut self.by_service {
            if service.starts_with(&prefix) {
                entry.held.retain(|h| h.pod != pod);
            }
        }
        self.by_service.retain(|_, s| !s.held.is_empty());
    }

    /// Drops every entry past its restore time.
    fn lapse(&mut self, now: Timestamp) {
        for entry in self.by_service.values_mut() {
            entry.held.retain(|h| h.until > now);
        }
        self.by_service.retain(|_, s| !s.held.is_empty());
    }
}

/// The share's errors: the table could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call on the share's Lease failed.
    #[error("{action} Lease {namespace}/{name} (the unconfirmed share)")]
    Api {
        /// `read` or `write`.
        action: &'static str,
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Every round lost to another replica's write.
    #[error(
        "Lease {namespace}/{name} (the unconfirmed share) kept changing; {ATTEMPTS} rounds lost"
    )]
    Contended {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
    },
}

/// The unconfirmed isolations every replica counts, each until its pod is put back.
#[derive(Debug)]
pub struct Unconfirmed {
    store: Store,
}

#[derive(Debug)]
enum Store {
    /// This process alone (tests, the simulated cluster's in-process checks).
    Local(std::sync::Mutex<Table>),
    /// The share's Lease, seen by every replica.
    Shared(Box<SharedLease>),
}

/// Where every replica reads and writes the table.
#[derive(Debug)]
struct SharedLease {
    api: Api<Lease>,
    namespace: String,
    name: String,
    /// One change at a time from this replica: its own concurrent reviews queue here
    /// instead of losing rounds to each other. It keeps the Lease as last read or written
    /// here (`None` inside: it did not exist) and when.
    turn: tokio::sync::Mutex<Option<(Instant, Option<Lease>)>>,
}

/// How long the Lease as last read or written answers for the changes after it. A change
/// that leaves the table as it was (a refusal: the Service's share is taken) needs no
/// fresher table, since a stale one only counts isolations since released; a change that
/// writes is checked by the write's resourceVersion and read afresh on a conflict. So a
/// flood of reviews the share refuses reads the Lease at most once per this time and
/// replica.
const TABLE_READ_TTL: std::time::Duration = std::time::Duration::from_secs(1);

impl Default for Unconfirmed {
    /// A table in this process only.
    fn default() -> Unconfirmed {
        Unconfirmed {
            store: Store::Local(std::sync::Mutex::default()),
        }
    }
}

impl Unconfirmed {
    /// The table in Lease `namespace/name`, shared with every replica that uses it.
    pub fn shared(client: kube::Client, namespace: &str, name: &str) -> Unconfirmed {
        Unconfirmed {
            store: Store::Shared(Box::new(SharedLease {
                api: Api::namespaced(client, namespace),
                namespace: namespace.to_string(),
                name: name.to_string(),
                turn: tokio::sync::Mutex::default(),
            })),
        }
    }

    /// Why isolating `ask.pod` unconfirmed now would take its Service too far, if it
    /// would; if not, the isolation counts from now on until [`Unconfirmed::release`] or
    /// its restore time. A table that cannot be read or written refuses (the caller
    /// retries), never lets the isolation through uncounted.
    pub(crate) async fn reserve(
        &self,
        ask: Ask<'_>,
        now: Timestamp,
        seen: impl Fn(&str) -> Seen,
    ) -> Option<String> {
        self.change(|table| table.reserve(ask, now, &seen))
            .await
            .unwrap_or_else(|error| {
                Some(format!(
                    "could not count pod {}/{} against the share of Service {}: {}",
                    ask.namespace,
                    ask.pod,
                    ask.service,
                    graceful_drain_core::error::chain(&error)
                ))
            })
    }

    /// Counts pod `namespace/pod`, isolated unconfirmed, against `services` until `until`.
    pub(crate) async fn record<'a>(
        &self,
        namespace: &str,
        services: impl IntoIterator<Item = &'a str> + Clone,
        pod: &str,
        until: Timestamp,
    ) {
        let now = Timestamp::now();
        let recorded = self
            .change(|table| table.record(namespace, services.clone(), pod, until, now))
            .await;
        if let Err(error) = recorded {
            // Its entry still counts until its landing time; after that only while the
            // cache shows the pod isolated, which is every moment until its restore.
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), pod = %format!("{namespace}/{pod}"), "could not record an unconfirmed isolation's restore time");
        }
    }

    /// Drops the entries of pod `namespace/pod`: its isolation did not happen.
    pub(crate) async fn release(&self, namespace: &str, pod: &str) {
        if let Err(error) = self.change(|table| table.release(namespace, pod)).await {
            // The entry lapses at its landing time.
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), pod = %format!("{namespace}/{pod}"), "could not release an unconfirmed isolation that did not happen");
        }
    }

    /// Applies `change` to the table and stores the result when it differs.
    async fn change<R>(&self, mut change: impl FnMut(&mut Table) -> R) -> Result<R, Error> {
        let SharedLease {
            api,
            namespace,
            name,
            turn,
        } = match &self.store {
            Store::Local(table) => {
                let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
                return Ok(change(&mut table));
            }
            Store::Shared(lease) => &**lease,
        };
        let mut last = turn.lock().await;
        let fail = |action: &'static str| {
            move |source| Error::Api {
                action,
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            }
        };
        for _ in 0..ATTEMPTS {
            let (read_at, current) = match last.take() {
                Some((at, lease)) if at.elapsed() < TABLE_READ_TTL => (at, lease),
                _ => (
                    Instant::now(),
                    api.get_opt(name).await.map_err(fail("read"))?,
                ),
            };
            let mut table = current.as_ref().map(table_of).unwrap_or_default();
            let before = table.clone();
            let result = change(&mut table);
            if table == before {
                *last = Some((read_at, current));
                return Ok(result);
            }
            let json = serde_json::to_string(&table).unwrap_or_default();
            let written = match current {
                Some(mut lease) => {
                    lease
                        .metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(ANNOTATION.to_string(), json);
                    api.replace(name, &PostParams::default(), &lease).await
                }
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            namespace: Some(namespace.clone()),
                            annotations: Some([(ANNOTATION.to_string(), json)].into()),
                            ..ObjectMeta::default()
                        },
                        spec: None,
                    };
                    api.create(&PostParams::default(), &lease).await
                }
            };
            match written {
                Ok(lease) => {
                    *last = Some((Instant::now(), Some(lease)));
                    return Ok(result);
                }
                // Another replica wrote first (or created it): read again.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return Err(fail("write")(error)),
            }
        }
        Err(Error::Contended {
            namespace: namespace.clone(),
            name: name.clone(),
        })
    }
}

/// The table a Lease holds; one that does not parse (only someone who may write Leases in
/// the release namespace could have written it) is started afresh.
fn table_of(lease: &Lease) -> Table {
    let Some(json) = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
    else {
        return Table::default();
    };
    serde_json::from_str(json).unwrap_or_else(|error| {
        tracing::warn!(%error, lease = ?lease.metadata.name, "the unconfirmed share's table does not parse; starting it afresh");
        Table::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-01-01T00:00:00Z";
    const UNTIL: &str = "2026-01-01T00:02:00Z";

    /// Pod `pod` of Service `web/web`, `ready_others` other pods ready.
    fn ask(pod: &str, ready_others: usize) -> Ask<'_> {
        Ask {
            namespace: "web",
            service: "web",
            pod,
            ready_others,
            budgeted: false,
            until: at(UNTIL),
        }
    }

    /// What the cache shows of a held pod: isolated and out of its slices.
    fn out(_: &str) -> Seen {
        Seen {
            isolated: true,
            listed_ready: false,
        }
    }

    /// Not isolated yet, still listed ready: every isolation still under way.
    fn pending(_: &str) -> Seen {
        Seen {
            isolated: false,
            listed_ready: true,
        }
    }

    #[test]
    fn a_services_last_ready_endpoint_is_never_isolated_unconfirmed() {
        let mut table = Table::default();
        let why = table.reserve(ask("web-1", 0), at(NOW), out).unwrap();
        assert!(why.contains("last ready endpoint of Service web"), "{why}");
        assert_eq!(table, Table::default(), "a refusal holds nothing");
    }

    #[test]
    fn unconfirmed_isolations_hold_at_most_half_a_service_at_once() {
        let mut table = Table::default();
        let now = at(NOW);
        // Five pods: three may be held at once (half, rounded up).
        for (n, pod) in ["web-0", "web-1", "web-2"].into_iter().enumerate() {
            assert_eq!(table.reserve(ask(pod, 4 - n), now, out), None);
        }
        let why = table.reserve(ask("web-3", 1), now, out).unwrap();
        assert!(why.contains("3 of its 5 pods"), "{why}");
        // A budget charged for it bounds it instead; another Service, or the same pod
        // asked again, is not held back by them.
        let budgeted = Ask {
            budgeted: true,
            ..ask("web-3", 1)
        };
        let before = table.clone();
        assert_eq!(table.reserve(budgeted, now, out), None);
        assert_eq!(table, before, "a budgeted isolation reserves nothing");
        let api = Ask {
            service: "api",
            ..ask("web-3", 1)
        };
        assert_eq!(table.reserve(api, now, out), None);
        table.release("web", "web-3");
        assert_eq!(table.reserve(ask("web-2", 2), now, out), None);
        table.release("web", "web-2");
        // Once gone or restored they no longer count (past their landing time), nor past
        // their restore time.
        let landed = now.checked_add(LANDING).unwrap();
        let gone = |p: &str| Seen {
            isolated: p != "web-0",
            listed_ready: false,
        };
        assert_eq!(table.reserve(ask("web-3", 1), landed, gone), None);
        table.release("web", "web-3");
        assert_eq!(table.reserve(ask("web-3", 4), at(UNTIL), out), None);
    }

    #[test]
    fn a_two_pod_service_lets_one_unconfirmed_isolation_through_at_a_time() {
        let mut table = Table::default();
        let now = at(NOW);
        assert_eq!(table.reserve(ask("web-0", 1), now, out), None);
        // Its replacement is listed ready (1 other ready besides web-1): the share stays
        // of the two pods there were, as a load balancer may not send the replacement
        // traffic yet.
        let why = table.reserve(ask("web-1", 1), now, out).unwrap();
        assert!(why.contains("1 of its 2 pods"), "{why}");
        // Once web-0 is gone, the next may go.
        let landed = now.checked_add(LANDING).unwrap();
        let gone = |_: &str| Seen {
            isolated: false,
            listed_ready: false,
        };
        assert_eq!(table.reserve(ask("web-1", 1), landed, gone), None);
    }

    /// A landed isolation whose pod is then deleted (its caller came back at its delete
    /// time) frees its place within seconds, not at the end of its landing time (35 s) nor
    /// its restore time: callers removing pods one after another are not held back.
    #[test]
    fn a_landed_isolation_counts_only_while_its_pod_is_isolated() {
        let mut table = Table::default();
        let now = at(NOW);
        let three = |pod| ask(pod, 2);
        assert_eq!(table.reserve(three("web-0"), now, out), None);
        table.record("web", ["web"], "web-0", at(UNTIL), now);
        assert_eq!(table.reserve(three("web-1"), now, out), None);
        // Both landed and isolated: a third of three is past half.
        table.record("web", ["web"], "web-1", at(UNTIL), now);
        assert!(table.reserve(three("web-2"), now, out).is_some());
        // Both deleted by their callers: a replica whose cache has not seen the relabels
        // yet still counts them for a few seconds; then the third goes.
        let deleted = |_: &str| Seen {
            isolated: false,
            listed_ready: false,
        };
        assert!(table.reserve(three("web-2"), now, deleted).is_some());
        let later = now.checked_add(LANDED).unwrap();
        assert_eq!(table.reserve(three("web-2"), later, deleted), None);
    }

    /// Replacements turning ready while isolations are held do not widen the share: the
    /// case the real tier's two-replica flood met (4 of 6 isolated once a seventh pod was
    /// listed ready).
    #[test]
    fn ready_replacements_do_not_widen_the_share_while_isolations_are_held() {
        let mut table = Table::default();
        let now = at(NOW);
        for pod in ["web-0", "web-1", "web-2"] {
            assert_eq!(table.reserve(ask(pod, 5), now, pending), None);
        }
        // Three replacements ready: nine pods listed, six of them not held.
        let why = table.reserve(ask("web-3", 8), now, pending).unwrap();
        assert!(why.contains("3 of its 6 pods"), "{why}");
    }

    /// Six forged evictions arriving at once, before any isolation shows in the cache
    /// (every pod still listed ready, none isolated yet): the entries bound them to half
    /// the Service, and one whose isolation did not happen frees its place.
    #[test]
    fn concurrent_unconfirmed_isolations_are_bounded_before_any_of_them_lands() {
        let mut table = Table::default();
        let now = at(NOW);
        let pods = ["web-0", "web-1", "web-2", "web-3", "web-4", "web-5"];
        let passed: Vec<&str> = pods
            .into_iter()
            .filter(|pod| table.reserve(ask(pod, 5), now, pending).is_none())
            .collect();
        assert_eq!(passed, ["web-0", "web-1", "web-2"]);
        table.release("web", "web-1");
        assert_eq!(table.reserve(ask("web-5", 5), now, pending), None);
        // An isolation that never lands stops counting at its landing time.
        let later = now.checked_add(LANDING).unwrap();
        assert_eq!(table.reserve(ask("web-4", 5), later, pending), None);
    }

    #[test]
    fn a_full_table_refuses_every_further_unconfirmed_isolation() {
        let mut table = Table::default();
        let now = at(NOW);
        for n in 0..MAX_ENTRIES {
            let service = format!("svc-{n}");
            let ask = Ask {
                service: &service,
                ..ask("web-0", 3)
            };
            assert_eq!(table.reserve(ask, now, pending), None);
        }
        let why = table.reserve(ask("web-1", 3), now, pending).unwrap();
        assert!(why.contains("512 isolations"), "{why}");
        // Each entry, with names at Kubernetes' limits, keeps the table far below the
        // API server's 256 KiB for annotations.
        let long = "p".repeat(253);
        let mut table = Table::default();
        for n in 0..MAX_ENTRIES {
            let service = format!("{}{n:03}", "s".repeat(60));
            let ask = Ask {
                namespace: &"n".repeat(63),
                service: &service,
                pod: &long,
                ready_others: 3,
                budgeted: false,
                until: at(UNTIL),
            };
            assert_eq!(table.reserve(ask, now, pending), None);
        }
        let size = serde_json::to_string(&table).unwrap().len();
        assert!(size < 256 * 1024, "{size} bytes");
    }

    /// A simulated API server with the release namespace, where the shared table lives.
    async fn lease_server() -> (
        kube_sim::apiserver::ApiServer,
        graceful_drain_core::runtime::Shutdown,
    ) {
        let shutdown = graceful_drain_core::runtime::Shutdown::new();
        let mut config = kube_sim::apiserver::Config::default();
        config.namespaces.push("graceful-drain".into());
        let server = kube_sim::apiserver::ApiServer::start(config, shutdown.clone())
            .await
            .unwrap();
        (server, shutdown)
    }

    /// A replica's table in `server`'s Lease `graceful-drain/gd-unconfirmed`.
    fn shared(server: &kube_sim::apiserver::ApiServer) -> Unconfirmed {
        Unconfirmed::shared(server.client("admin"), "graceful-drain", "gd-unconfirmed")
    }

    /// Two replicas, one table: a flood of unconfirmed isolations split between them
    /// takes no more than half the Service, and the table survives its Lease's
    /// round-trip through the API server.
    #[tokio::test]
    async fn two_replicas_count_one_share() {
        let (server, shutdown) = lease_server().await;
        let replicas = [0, 1].map(|_| shared(&server));
        let now = Timestamp::now();
        let until = now.checked_add(SignedDuration::from_mins(2)).unwrap();
        let ask = |pod| Ask {
            until,
            ..ask(pod, 5)
        };
        let pods = ["web-0", "web-1", "web-2", "web-3", "web-4", "web-5"];
        let mut passed = Vec::new();
        for (n, pod) in pods.into_iter().enumerate() {
            if replicas[n % 2]
                .reserve(ask(pod), now, pending)
                .await
                .is_none()
            {
                passed.push(pod);
            }
        }
        assert_eq!(passed, ["web-0", "web-1", "web-2"]);
        // Both sides of a race: two replicas that have not read the table yet each
        // reserve the next pod at once; the Lease's resourceVersion lets exactly one
        // table win each round.
        replicas[0].release("web", "web-2").await;
        let racing = [0, 1].map(|_| shared(&server));
        let both = futures::future::join(
            racing[0].reserve(ask("web-3"), now, pending),
            racing[1].reserve(ask("web-4"), now, pending),
        )
        .await;
        assert_eq!(
            [both.0.is_none(), both.1.is_none()]
                .iter()
                .filter(|p| **p)
                .count(),
            1,
            "{both:?}"
        );
        let leases: Api<Lease> = Api::namespaced(server.client("admin"), "graceful-drain");
        let table = table_of(&leases.get("gd-unconfirmed").await.unwrap());
        assert_eq!(table.by_service["web/web"].held.len(), 3, "{table:?}");
        shutdown.cancel();
    }

    /// A flood of reviews the share refuses (their Service's share is taken) costs one
    /// read of the Lease per second and replica, not one per review; the next isolation
    /// that fits is still counted against the table as it is now.
    #[tokio::test]
    async fn refused_isolations_share_one_read_of_the_table() {
        let (server, shutdown) = lease_server().await;
        let share = shared(&server);
        let now = Timestamp::now();
        let until = now.checked_add(SignedDuration::from_mins(2)).unwrap();
        // Two pods of four: the share (half) is then taken.
        for pod in ["web-0", "web-1"] {
            let ask = Ask {
                until,
                ..ask(pod, 3)
            };
            assert_eq!(share.reserve(ask, now, pending).await, None);
        }
        let before = server.stats();
        for n in 0..200 {
            let pod = format!("forged-{n}");
            let ask = Ask {
                until,
                ..ask(&pod, 3)
            };
            assert!(share.reserve(ask, now, pending).await.is_some());
        }
        let reads = server.stats().since(&before).count("get", "leases");
        assert!(reads <= 1, "200 refusals read the Lease {reads} times");
        // Another Service's first isolation is written against the live table.
        let other = Ask {
            service: "api",
            until,
            ..ask("api-0", 3)
        };
        assert_eq!(share.reserve(other, now, pending).await, None);
        let leases: Api<Lease> = Api::namespaced(server.client("admin"), "graceful-drain");
        let table = table_of(&leases.get("gd-unconfirmed").await.unwrap());
        assert_eq!(table.by_service["web/web"].held.len(), 2, "{table:?}");
        assert_eq!(table.by_service["web/api"].held.len(), 1, "{table:?}");
        shutdown.cancel();
    }
}
