//! Confirmed release (optional, `--balancer-config`): an isolated pod's delay ends as soon
//! as the configured load balancer no longer routes to its address, instead of always
//! running to its end.
//!
//! The deferred deleter's watch of isolated pods fills a [`Board`]. On the replica holding
//! the Lease, [`Release::run`] asks the balancer once per interval which addresses it routes
//! to ([`balancer_routes::Lister`]: one bounded GET, whatever the number of pods), reads
//! each newly isolated pod's address once, and judges every pod ([`verdict`]). A pod is
//! released only when all three hold: the balancer was seen routing to it since its
//! isolation, or in its recent answer of the round before ([`credit_earlier`]) (so the
//! question is about a balancer that knew it), no EndpointSlice lists it
//! any more (`Cache::routed`), and the balancer's latest answer no longer has its address.
//! Its release is the annotation `graceful-drain.io/released-at` (written with a UID test),
//! which every replica's decisions and the deleter read (`decide::due_at`): the pod is due
//! from then, the configured delay staying the upper bound.
//!
//! Anything else keeps the whole delay: a balancer that cannot be asked (timeout, error,
//! an answer it cannot read), a pod whose address is unknown, one the balancer never
//! routed to, or one it still routes to. How long each pod waited and why the wait ended
//! is `graceful_drain_webhook_balancer_wait_seconds{ended}`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use balancer_routes::{Lister, Routes};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::isolate;
use crate::metrics::Metrics;
use graceful_drain_core::labels::RELEASED_AT_ANNOTATION;
use graceful_drain_core::runtime::Shutdown;

/// How often the balancer is asked by default: about as often as the deleter scans, so a
/// release is acted on within a second or two, and a balancer's admin API sees one GET a
/// second from the whole webhook.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Pod reads in flight at once when many pods are isolated together (a drained node's).
const ADDRESS_READS: usize = 8;

/// The isolated pods the deferred deleter tracks, by UID, shared with [`Release`].
#[derive(Clone, Debug, Default)]
pub struct Board(Arc<Mutex<HashMap<String, Entry>>>);

/// One isolated pod on the [`Board`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// It carries a release already (`graceful-drain.io/released-at`).
    pub released: bool,
    /// It is terminating: nothing left to wait for.
    pub terminating: bool,
}

impl Board {
    /// Records (or updates) the isolated pod `uid`.
    pub fn put(&self, uid: &str, entry: Entry) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.to_string(), entry);
    }

    /// Forgets pod `uid` (gone, or no longer isolated).
    pub fn remove(&self, uid: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    fn snapshot(&self) -> HashMap<String, Entry> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What [`verdict`] says of one pod after one answer of the balancer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep waiting (the delay's end stays the bound).
    Wait,
    /// The balancer let go of it: record the release.
    Release,
}

/// What is known of one pod while it waits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Watched {
    /// Its address: `None` until read, `Some(None)` when it has none (or it could not
    /// be read).
    pub address: Option<Option<IpAddr>>,
    /// The balancer was seen routing to it since it was isolated.
    pub seen_routed: bool,
    /// The balancer's latest answer could not be had.
    pub unreachable: bool,
}

/// Counts the balancer as having routed to the pod when its previous, recent answer
/// (`before`) did: the first round after a pod's isolation may come after the balancer
/// already let go of it (a DNS cache that expired just then), and a pod the balancer
/// routed to a round earlier was known to it as surely as one it routes to now. An
/// address some earlier pod had is no risk: a balancer that never learned the new pod
/// sends it nothing.
pub fn credit_earlier(watched: &mut Watched, before: Option<&Routes>) {
    if let (Some(Some(ip)), Some(before)) = (watched.address, before)
        && before.routes_to(ip, None)
    {
        watched.seen_routed = true;
    }
}

/// Judges one pod on the balancer's latest answer (`routes`: `None` when it could not be
/// asked) and on the slices (`listed`), updating what is known of it. Released only once
/// the balancer, seen routing to it before, no longer does and no slice lists it; every
/// doubt waits.
pub fn verdict(watched: &mut Watched, listed: bool, routes: Option<&Routes>) -> Verdict {
    watched.unreachable = routes.is_none();
    let (Some(Some(ip)), Some(routes)) = (watched.address, routes) else {
        return Verdict::Wait;
    };
    if routes.routes_to(ip, None) {
        watched.seen_routed = true;
        return Verdict::Wait;
    }
    if watched.seen_routed && !listed {
        Verdict::Release
    } else {
        Verdict::Wait
    }
}

/// Why a pod that was not released stopped waiting (the label `ended`).
pub fn ended_without_release(watched: &Watched) -> &'static str {
    match watched.address {
        None | Some(None) => "address_unknown",
        Some(Some(_)) if watched.unreachable => "unreachable",
        Some(Some(_)) if !watched.seen_routed => "never_routed",
        Some(Some(_)) => "still_routes",
    }
}

/// One pod being watched: where it is, since when, and what is known.
#[derive(Debug)]
struct Tracked {
    namespace: String,
    name: String,
    since: Instant,
    watched: Watched,
}

/// The confirmed-release task: asks the balancer, judges the pods, records releases.
pub struct Release {
    ctx: isolate::Context,
    lister: Lister,
    every: Duration,
    board: Board,
    metrics: Arc<Metrics>,
    tracked: HashMap<String, Tracked>,
    /// Pods released here whose annotation the board has not shown yet.
    released: HashSet<String>,
    /// Whether the balancer answered the last question (none asked yet: `None`), so that
    /// a failing balancer is reported once when it starts failing and once when it
    /// answers again, not every round.
    answered: Option<bool>,
    /// The balancer's previous answer and when it came (see [`credit_earlier`]).
    previous: Option<(Instant, Routes)>,
}

impl Release {
    /// A release task asking `lister` every `every`, for the pods on `board`.
    pub fn new(
        ctx: isolate::Context,
        lister: Lister,
        every: Duration,
        board: Board,
        metrics: Arc<Metrics>,
    ) -> Release {
        Release {
            ctx,
            lister,
            every,
            board,
            metrics,
            tracked: HashMap::new(),
            released: HashSet::new(),
            answered: None,
            previous: None,
        }
    }

    /// Runs until `shutdown`, judging pods only while this replica holds the Lease
    /// (`leader`); a replica taking over starts its pods' watch afresh.
    pub async fn run(
        mut self,
        leader: watch::Receiver<bool>,
        shutdown: Shutdown,
    ) -> Result<(), std::convert::Infallible> {
        tracing::info!(balancer = %self.lister.url(), every = ?self.every, "confirmed release on");
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.every) => {}
            }
            if *leader.borrow() {
                self.round().await;
            } else {
                self.tracked.clear();
            }
        }
    }

    /// One round: follow the board, read new addresses, ask the balancer, judge.
    async fn round(&mut self) {
        self.follow_board();
        if self.tracked.is_empty() {
            return;
        }
        self.read_addresses().await;
        let routes = match self.lister.routes().await {
            Ok(routes) => Some(routes),
            Err(error) => {
                let error = graceful_drain_core::error::chain(&error).to_string();
                if self.answered == Some(false) {
                    tracing::debug!(%error, "the load balancer still does not answer");
                } else {
                    tracing::warn!(%error, "could not ask the load balancer; isolated pods keep their whole delay until it answers");
                }
                None
            }
        };
        let answered = routes.is_some();
        if answered && self.answered == Some(false) {
            tracing::info!(balancer = %self.lister.url(), "the load balancer answers again");
        }
        self.answered = Some(answered);
        let result = if answered { "answered" } else { "failed" };
        self.metrics
            .balancer_asks
            .get_or_create(&crate::metrics::AskLabels { result })
            .inc();
        // The previous answer counts while recent: a pod the balancer dropped within a
        // round of its isolation was known to it all the same.
        let previous = self
            .previous
            .as_ref()
            .filter(|(at, _)| at.elapsed() <= self.every * 3)
            .map(|(_, routes)| routes);
        let mut releases = Vec::new();
        for (uid, pod) in &mut self.tracked {
            credit_earlier(&mut pod.watched, previous);
            let listed = self.ctx.cache.routed(&pod.namespace, &pod.name, uid);
            if verdict(&mut pod.watched, listed, routes.as_ref()) == Verdict::Release {
                releases.push(uid.clone());
            }
        }
        if let Some(routes) = routes {
            self.previous = Some((Instant::now(), routes));
        }
        for uid in releases {
            self.release(&uid).await;
        }
    }

    /// Starts watching the board's new pods; a pod that left it unreleased has its wait
    /// recorded.
    fn follow_board(&mut self) {
        let board = self.board.snapshot();
        self.released.retain(|uid| board.contains_key(uid));
        let metrics = &self.metrics;
        self.tracked.retain(|uid, pod| {
            let stays = board
                .get(uid)
                .is_some_and(|e| !e.released && !e.terminating);
            if !stays {
                let ended = ended_without_release(&pod.watched);
                metrics.balancer_wait(ended, pod.since.elapsed().as_secs_f64());
            }
            stays
        });
        for (uid, entry) in board {
            if entry.released || entry.terminating || self.released.contains(&uid) {
                continue;
            }
            self.tracked.entry(uid).or_insert_with(|| Tracked {
                namespace: entry.namespace,
                name: entry.name,
                since: Instant::now(),
                watched: Watched::default(),
            });
        }
    }

    /// Reads the address of every pod not read yet, a few at a time.
    async fn read_addresses(&mut self) {
        let client = &self.ctx.client;
        let unread: Vec<(String, String, String)> = self
            .tracked
            .iter()
            .filter(|(_, p)| p.watched.address.is_none())
            .map(|(uid, p)| (uid.clone(), p.namespace.clone(), p.name.clone()))
            .collect();
        let reads = futures::stream::iter(unread)
            .map(|(uid, namespace, name)| async move {
                let api = Api::<Pod>::namespaced(client.clone(), &namespace);
                let address = match api.get_opt(&name).await {
                    Ok(pod) => pod.as_ref().and_then(|p| pod_address(p, &uid)),
                    Err(error) => {
                        tracing::info!(error = %graceful_drain_core::error::chain(&error), "read the address of isolated pod {namespace}/{name}; it keeps its whole delay");
                        None
                    }
                };
                (uid, address)
            })
            .buffer_unordered(ADDRESS_READS)
            .collect::<Vec<_>>()
            .await;
        for (uid, address) in reads {
            if let Some(pod) = self.tracked.get_mut(&uid) {
                pod.watched.address = Some(address);
            }
        }
    }

    /// Records the release of pod `uid` on the pod; on success it stops being watched.
    async fn release(&mut self, uid: &str) {
        let Some(pod) = self.tracked.get(uid) else {
            return;
        };
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &pod.namespace);
        let now = jiff::Timestamp::now().to_string();
        let patch = release_patch(uid, &now);
        let params = PatchParams::default();
        match api
            .patch(&pod.name, &params, &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => {
                let waited = pod.since.elapsed();
                tracing::info!(namespace = %pod.namespace, pod = %pod.name, ?waited, "the load balancer let go of the isolated pod; its delay ends now");
                self.metrics.balancer_wait("let_go", waited.as_secs_f64());
                self.released.insert(uid.to_string());
                self.tracked.remove(uid);
            }
            Err(error) => {
                tracing::warn!(namespace = %pod.namespace, pod = %pod.name, error = %graceful_drain_core::error::chain(&error), "record the release of an isolated pod; trying again next round");
            }
        }
    }
}

/// The pod's IP when it is still the incarnation `uid`.
fn pod_address(pod: &Pod, uid: &str) -> Option<IpAddr> {
    if pod.metadata.uid.as_deref() != Some(uid) {
        return None;
    }
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// The JSON patch recording a release at `now` on pod `uid` (and only that incarnation).
pub fn release_patch(uid: &str, now: &str) -> json_patch::Patch {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation, TestOperation};
    let annotation = PointerBuf::from_tokens(["metadata", "annotations", RELEASED_AT_ANNOTATION]);
    json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "uid"]),
            value: uid.into(),
        }),
        PatchOperation::Add(AddOperation {
            path: annotation,
            value: now.into(),
        }),
    ])
}

#[cfg(test)]
mod tests;
