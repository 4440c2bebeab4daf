//! Small, indexed caches of the cluster state the decision needs.
//!
//! Four watches feed compact projections, never whole objects: EndpointSlices (only
//! `service-name`, and per endpoint hashes of the pod's key and UID and its readiness,
//! indexed by pod),
//! Services (type and selector), Namespaces (metadata only: opt-out label and delay
//! annotation) and PodDisruptionBudgets (kept whole: they are few and the status update
//! needs them). No pod is cached here; the deferred deleter watches isolated pods only.
//! Lookups are hash-map hits per pod, never a scan of all Services.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use smallvec::SmallVec;

use super::decide::{
    EndpointFacts, NamespaceFacts, PdbFacts, PodFacts, ServiceFacts, ServiceType, Snapshot,
};
use graceful_drain_core::labels::{DELAY_ANNOTATION, OPT_OUT_LABEL};

/// Label EndpointSlice controllers put on a slice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Errors of the cache watches.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A watch stream ended, which only happens when the client is gone.
    #[error("watch of {0} ended")]
    Ended(&'static str),
}

type Key = (String, String);

/// One endpoint naming a pod, as the slice index keeps it: 16 bytes, no strings.
#[derive(Clone, Copy, Debug)]
struct PodEndpoint {
    /// Slot of the slice in [`Slices::slots`].
    slice: u32,
    /// The endpoint's `nodeName` as an index into [`Slices::nodes`] ([`NO_NODE`]: none).
    node: u16,
    ready: bool,
    /// Hash of the targetRef UID, when the slice carries one.
    uid: Option<NonZeroU64>,
}

#[derive(Debug)]
struct SliceEntry {
    service: Option<Box<str>>,
    /// Index keys of the pods the slice names, each once.
    pods: Box<[u64]>,
}

/// EndpointSlices projected and indexed by the pods they name.
///
/// At 150,000 endpoints the index is the webhook's largest table, so it keeps no pod
/// name or UID: a pod is found by a keyed 64-bit hash of its namespace and name, and an
/// endpoint's UID is kept as a hash too. Two pods whose keys collide share one entry and
/// each sees the other's endpoints, which the UID comparison then tells apart; the only
/// way to be wrong is to see a pod as exposed that is not, which delays its deletion and
/// never lets an exposed pod die unprotected. The hash keys are random per process.
#[derive(Debug, Default)]
pub struct Slices {
    hasher: RandomState,
    ids: HashMap<Key, u32>,
    slots: Vec<Option<SliceEntry>>,
    free: Vec<u32>,
    by_pod: HashMap<u64, SmallVec<[PodEndpoint; 1]>>,
    /// Node names seen in endpoints, each once (a cluster has at most a few thousand).
    nodes: Vec<Box<str>>,
    node_ids: HashMap<Box<str>, u16>,
    /// When each pod that some slice listed was seen in none any more (by pod key);
    /// cleared when a slice lists it again, pruned after [`LEFT_KEPT`].
    left: HashMap<u64, jiff::Timestamp>,
}

/// How long a pod's departure from the slices is remembered: past the longest wait for
/// an isolated pod (`decide::MAX_ENDPOINT_WAIT` after its delete time) plus any delay.
const LEFT_KEPT: std::time::Duration = std::time::Duration::from_secs(3600);
/// Departures remembered before old ones are pruned.
const LEFT_PRUNE_AT: usize = 4096;

/// [`PodEndpoint::node`] of an endpoint without `nodeName`, or beyond 65,535 nodes.
const NO_NODE: u16 = u16::MAX;

impl Slices {
    fn pod_key(&self, namespace: &str, name: &str) -> u64 {
        self.hasher.hash_one((namespace, name))
    }

    fn uid_key(&self, uid: &str) -> NonZeroU64 {
        NonZeroU64::new(self.hasher.hash_one(uid) | 1).unwrap_or(NonZeroU64::MIN)
    }

    fn node_id(&mut self, node: Option<&str>) -> u16 {
        let Some(node) = node else {
            return NO_NODE;
        };
        if let Some(id) = self.node_ids.get(node) {
            return *id;
        }
        match u16::try_from(self.nodes.len()) {
            Ok(id) if id != NO_NODE => {
                self.nodes.push(node.into());
                self.node_ids.insert(node.into(), id);
                id
            }
            _ => NO_NODE,
        }
    }

    fn upsert(&mut self, slice: &EndpointSlice) {
        self.upsert_at(slice, jiff::Timestamp::now());
    }

    fn upsert_at(&mut self, slice: &EndpointSlice, now: jiff::Timestamp) {
        let key = key_of(&slice.metadata);
        let before = self.remove_quietly(&key);
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .map(|s| s.as_str().into());
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(None);
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let mut pods = Vec::new();
        for ep in &slice.endpoints {
            let Some(target) = ep.target_ref.as_ref() else {
                continue;
            };
            let Some(name) = target.name.as_deref() else {
                continue;
            };
            if target.kind.as_deref() != Some("Pod") {
                continue;
            }
            let pod = self.pod_key(&key.0, name);
            let entry = PodEndpoint {
                slice: id,
                node: self.node_id(ep.node_name.as_deref()),
                ready: ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                uid: target.uid.as_deref().map(|u| self.uid_key(u)),
            };
            self.by_pod.entry(pod).or_default().push(entry);
            pods.push(pod);
        }
        pods.sort_unstable();
        pods.dedup();
        for pod in &pods {
            self.left.remove(pod);
        }
        if let Some(slot) = self.slots.get_mut(id as usize) {
            *slot = Some(SliceEntry {
                service,
                pods: pods.into_boxed_slice(),
            });
        }
        self.ids.insert(key, id);
        self.note_departures(before, now);
    }

    fn remove(&mut self, key: &Key) {
        let before = self.remove_quietly(key);
        self.note_departures(before, jiff::Timestamp::now());
    }

    /// Drops slice `key`; returns the pods it listed.
    fn remove_quietly(&mut self, key: &Key) -> Box<[u64]> {
        let Some(id) = self.ids.remove(key) else {
            return Box::default();
        };
        let Some(old) = self.slots.get_mut(id as usize).and_then(Option::take) else {
            return Box::default();
        };
        for pod in &old.pods {
            if let Some(endpoints) = self.by_pod.get_mut(pod) {
                endpoints.retain(|ep| ep.slice != id);
                if endpoints.is_empty() {
                    self.by_pod.remove(pod);
                }
            }
        }
        self.free.push(id);
        old.pods
    }

    /// Records `now` for every pod of `listed` that no slice lists any more.
    fn note_departures(&mut self, listed: Box<[u64]>, now: jiff::Timestamp) {
        for pod in listed {
            if !self.by_pod.contains_key(&pod) {
                self.left.entry(pod).or_insert(now);
            }
        }
        if self.left.len() > LEFT_PRUNE_AT {
            let oldest = now
                .checked_sub(jiff::SignedDuration::try_from(LEFT_KEPT).unwrap_or_default())
                .unwrap_or(jiff::Timestamp::MIN);
            self.left.retain(|_, at| *at > oldest);
        }
    }

    /// When pod `namespace/name` left the last slice that listed it; `None` while a slice
    /// lists it or when no slice was seen listing it.
    pub fn left_at(&self, namespace: &str, name: &str) -> Option<jiff::Timestamp> {
        let pod = self.pod_key(namespace, name);
        if self.by_pod.contains_key(&pod) {
            return None;
        }
        self.left.get(&pod).copied()
    }

    /// Every endpoint naming pod `namespace/name`; with the pod's `uid`, an endpoint
    /// whose targetRef names another UID is marked as an earlier pod of that name.
    pub fn endpoints_of(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Vec<EndpointFacts> {
        let Some(endpoints) = self.by_pod.get(&self.pod_key(namespace, name)) else {
            return Vec::new();
        };
        let uid = uid.map(|u| self.uid_key(u));
        endpoints
            .iter()
            .map(|ep| EndpointFacts {
                service: self
                    .slots
                    .get(ep.slice as usize)
                    .and_then(Option::as_ref)
                    .and_then(|s| s.service.as_deref())
                    .map(str::to_string),
                ready: ep.ready,
                earlier_pod: matches!((ep.uid, uid), (Some(listed), Some(ours)) if listed != ours),
            })
            .collect()
    }

    /// Whether any slice names pod `namespace/name` as a ready endpoint (whatever its UID),
    /// without building the endpoints' facts: every admission call asks this first.
    pub fn has_ready(&self, namespace: &str, name: &str) -> bool {
        self.by_pod
            .get(&self.pod_key(namespace, name))
            .is_some_and(|endpoints| endpoints.iter().any(|ep| ep.ready))
    }

    /// How many pods other than `except` the slices of Service `namespace/service` list
    /// as ready, each pod once. It walks every slice of the cluster: only an isolation that
    /// nothing authenticated confirmed asks (see `crate::state::Unconfirmed`).
    pub fn ready_pods_of(&self, namespace: &str, service: &str, except: &str) -> usize {
        let except = self.pod_key(namespace, except);
        let mut ready = std::collections::HashSet::new();
        for ((ns, _), &slot) in &self.ids {
            let Some(Some(entry)) = self.slots.get(slot as usize) else {
                continue;
            };
            if ns != namespace || entry.service.as_deref() != Some(service) {
                continue;
            }
            for &pod in entry.pods.iter().filter(|&&p| p != except) {
                let listed_ready = self
                    .by_pod
                    .get(&pod)
                    .is_some_and(|eps| eps.iter().any(|ep| ep.slice == slot && ep.ready));
                if listed_ready {
                    ready.insert(pod);
                }
            }
        }
        ready.len()
    }

    /// The node a slice places pod `namespace/name` on (its endpoints' `nodeName`).
    pub fn node_of(&self, namespace: &str, name: &str) -> Option<&str> {
        self.by_pod
            .get(&self.pod_key(namespace, name))?
            .iter()
            .find_map(|ep| self.nodes.get(usize::from(ep.node)))
            .map(|n| &**n)
    }

    /// Number of slices and indexed pods (for tests and the benchmark).
    pub fn len(&self) -> (usize, usize) {
        (self.ids.len(), self.by_pod.len())
    }
}

#[derive(Clone, Debug)]
struct ServiceEntry {
    service_type: ServiceType,
    selector: Vec<(Box<str>, Box<str>)>,
}

impl ServiceEntry {
    /// A selector that is neither headless nor ExternalName: the Service balances the pods
    /// it selects.
    fn may_expose(&self) -> bool {
        !self.selector.is_empty()
            && !matches!(
                self.service_type,
                ServiceType::Headless | ServiceType::ExternalName
            )
    }

    /// Whether the selector is not empty and matches `labels` (a Service's selector is a
    /// plain map: every pair must be present).
    fn selects(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        !self.selector.is_empty()
            && self
                .selector
                .iter()
                .all(|(k, v)| labels.get(k.as_ref()).is_some_and(|l| l == v.as_ref()))
    }
}

/// The caches, shared by the admission handlers and the deleter.
#[derive(Debug, Default)]
pub struct Cache {
    slices: RwLock<Slices>,
    /// Services by namespace, then name: the namespace's are what a pod's lookups scan.
    services: RwLock<HashMap<String, std::collections::BTreeMap<String, ServiceEntry>>>,
    namespaces: RwLock<HashMap<String, NamespaceFacts>>,
    pdbs: RwLock<HashMap<String, HashMap<String, Arc<PodDisruptionBudget>>>>,
    /// Isolated pods and their delete time, fed by the deleter's watch.
    isolated: RwLock<HashMap<Key, jiff::Timestamp>>,
    /// Isolated pods the load balancer let go of (`graceful-drain.io/released-at`, set by
    /// confirmed release), fed by the deleter's watch.
    released: RwLock<BTreeSet<Key>>,
    /// Told each time an isolated pod is released, for the DELETEs held on it.
    releases: tokio::sync::watch::Sender<()>,
    excluded_namespaces: BTreeSet<String>,
    synced: [AtomicBool; 4],
    /// Until when some replica holds the deleter Lease (reported by the elector).
    deleter_lease: RwLock<Option<jiff::Timestamp>>,
    /// Whether admission refuses to isolate while no replica holds the Lease (on in the
    /// server, off in unit tests that have no elector).
    deleter_gate: AtomicBool,
    /// The deferred deleter's watch of isolated pods has listed once.
    isolated_synced: AtomicBool,
    /// The pods of nodes being drained (see [`super::nodepods`]).
    pub node_pods: Arc<super::nodepods::NodePods>,
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// Label keys whose removal makes `selector` stop matching: `matchLabels` keys and the
/// keys of `In`/`Exists` expressions.
pub fn selector_keys(selector: &LabelSelector) -> BTreeSet<String> {
    let mut keys: BTreeSet<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .collect();
    for expr in selector.match_expressions.iter().flatten() {
        if expr.operator == "In" || expr.operator == "Exists" {
            keys.insert(expr.key.clone());
        }
    }
    keys
}

/// Whether a PDB selects pods with `labels` (policy/v1: a null selector selects nothing,
/// an empty one everything).
fn pdb_selects(
    pdb: &PodDisruptionBudget,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    graceful_drain_core::selector::selector_matches(selector, labels)
}

fn pdb_facts(pdb: &PodDisruptionBudget, pod: &str) -> PdbFacts {
    let status = pdb.status.as_ref();
    let generation = pdb.metadata.generation.unwrap_or(0);
    PdbFacts {
        name: pdb.metadata.name.clone().unwrap_or_default(),
        disruptions_allowed: status.map_or(0, |s| s.disruptions_allowed),
        observed: status
            .and_then(|s| s.observed_generation)
            .is_some_and(|g| g >= generation),
        lists_pod: status
            .and_then(|s| s.disrupted_pods.as_ref())
            .is_some_and(|d| d.contains_key(pod)),
        selector_keys: pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .map(selector_keys)
            .unwrap_or_default(),
    }
}

impl Cache {
    /// An empty cache; namespaces in `excluded` are always opted out.
    pub fn new(excluded: impl IntoIterator<Item = String>) -> Cache {
        Cache {
            excluded_namespaces: excluded.into_iter().collect(),
            ..Cache::default()
        }
    }

    /// Turns on the rule that nothing is isolated while no replica holds the Lease.
    pub fn enable_deleter_gate(&self) {
        self.deleter_gate.store(true, Ordering::Release);
    }

    /// Records until when the deleter Lease is held (`None`: nobody holds it).
    pub fn set_deleter_lease(&self, until: Option<jiff::Timestamp>) {
        *write(&self.deleter_lease) = until;
    }

    /// Whether some replica holds the deleter Lease at `now` (always true without the gate).
    pub fn deleter_alive(&self, now: jiff::Timestamp) -> bool {
        !self.deleter_gate.load(Ordering::Acquire)
            || read(&self.deleter_lease).is_some_and(|until| until > now)
    }

    /// Marks the deleter's watch of isolated pods as listed.
    pub fn set_isolated_synced(&self) {
        self.isolated_synced.store(true, Ordering::Release);
    }

    /// Whether the deleter's watch of isolated pods has listed once.
    pub fn isolated_synced(&self) -> bool {
        self.isolated_synced.load(Ordering::Acquire)
    }

    /// Whether every watch has listed its objects once.
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| s.load(Ordering::Acquire))
    }

    /// Fast path: does any slice name `namespace/pod` as a ready endpoint?
    pub fn has_ready_endpoint(&self, namespace: &str, pod: &str) -> bool {
        read(&self.slices).has_ready(namespace, pod)
    }

    /// How many pods other than `except` the EndpointSlices of Service
    /// `namespace/service` list as ready.
    pub fn ready_pods_of(&self, namespace: &str, service: &str, except: &str) -> usize {
        read(&self.slices).ready_pods_of(namespace, service, except)
    }

    /// The node the EndpointSlices place pod `namespace/pod` on, if any names it.
    pub fn node_of(&self, namespace: &str, pod: &str) -> Option<String> {
        read(&self.slices)
            .node_of(namespace, pod)
            .map(str::to_string)
    }

    /// Every endpoint naming pod `namespace/pod`; with its `uid`, those of an earlier pod
    /// of that name are marked.
    pub fn endpoints_of(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
    ) -> Vec<EndpointFacts> {
        read(&self.slices).endpoints_of(namespace, pod, uid)
    }

    /// Whether an EndpointSlice of a Service that is not headless (or of no known
    /// Service) lists pod `namespace/pod` with `uid`, ready or not: what
    /// [`super::decide::listed`] says from a snapshot, for the deferred deleter.
    pub fn routed(&self, namespace: &str, pod: &str, uid: &str) -> bool {
        let endpoints = self.endpoints_of(namespace, pod, Some(uid));
        let services = read(&self.services);
        endpoints.iter().any(|e| {
            !e.earlier_pod
                && e.service.as_deref().is_none_or(|name| {
                    services
                        .get(namespace)
                        .and_then(|m| m.get(name))
                        .is_none_or(|s| s.service_type != ServiceType::Headless)
                })
        })
    }

    /// When pod `namespace/pod` left the last EndpointSlice that listed it, as this
    /// replica's watch saw it; `None` while one lists it.
    pub fn left_slices_at(&self, namespace: &str, pod: &str) -> Option<jiff::Timestamp> {
        read(&self.slices).left_at(namespace, pod)
    }

    /// The delete time of pod `namespace/pod` if the deleter knows it as isolated. An
    /// isolated pod may have left every slice already and still must not die early.
    pub fn isolated(&self, namespace: &str, pod: &str) -> Option<jiff::Timestamp> {
        read(&self.isolated)
            .get(&(namespace.to_string(), pod.to_string()))
            .copied()
    }

    /// Records whether isolated pod `namespace/pod` was released; a new release wakes the
    /// DELETEs held on it ([`Cache::releases`]).
    pub fn set_released(&self, namespace: &str, pod: &str, released: bool) {
        let key = (namespace.to_string(), pod.to_string());
        if !released {
            write(&self.released).remove(&key);
        } else if write(&self.released).insert(key) {
            self.releases.send_replace(());
        }
    }

    /// Whether isolated pod `namespace/pod` was released by confirmed release.
    pub fn released(&self, namespace: &str, pod: &str) -> bool {
        read(&self.released).contains(&(namespace.to_string(), pod.to_string()))
    }

    /// Changes each time an isolated pod is released (see [`Cache::set_released`]).
    pub fn releases(&self) -> tokio::sync::watch::Receiver<()> {
        self.releases.subscribe()
    }

    /// Records (or with `None` forgets) an isolated pod.
    pub fn set_isolated(&self, namespace: &str, pod: &str, delete_at: Option<jiff::Timestamp>) {
        let key = (namespace.to_string(), pod.to_string());
        let mut table = write(&self.isolated);
        match delete_at {
            Some(t) => table.insert(key, t),
            None => table.remove(&key),
        };
    }

    /// Whether `namespace` is one the webhook never handles (`--exclude-namespace`: the
    /// release's own, kube-system, the chart's list), which the webhook configurations
    /// never send either.
    pub fn excluded(&self, namespace: &str) -> bool {
        self.excluded_namespaces.contains(namespace)
    }

    /// Whether `namespace` opted out ([`NamespaceFacts::opted_out`]), without copying its
    /// facts: every review's fast path asks.
    pub fn opted_out(&self, namespace: &str) -> bool {
        self.excluded_namespaces.contains(namespace)
            || read(&self.namespaces)
                .get(namespace)
                .is_some_and(|facts| facts.opted_out)
    }

    /// Namespace settings (flag exclusion, opt-out label, delay annotation).
    pub fn namespace(&self, namespace: &str) -> NamespaceFacts {
        let mut facts = read(&self.namespaces)
            .get(namespace)
            .cloned()
            .unwrap_or_default();
        facts.opted_out = self.opted_out(namespace);
        facts
    }

    /// The current cached PDB `namespace/name`.
    pub fn pdb(&self, namespace: &str, name: &str) -> Option<Arc<PodDisruptionBudget>> {
        read(&self.pdbs).get(namespace)?.get(name).cloned()
    }

    /// The cached PDBs of `namespace` that select a pod labelled `labels`.
    pub fn pdbs_selecting(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Vec<Arc<PodDisruptionBudget>> {
        read(&self.pdbs)
            .get(namespace)
            .map(|m| {
                m.values()
                    .filter(|p| pdb_selects(p, labels))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The Services of `pod`: those its `endpoints` name and those in its namespace whose
    /// selector matches its labels, each once, by name.
    fn services_of(&self, pod: &PodFacts, endpoints: &[EndpointFacts]) -> Vec<ServiceFacts> {
        let named: BTreeSet<&str> = endpoints
            .iter()
            .filter_map(|e| e.service.as_deref())
            .collect();
        let table = read(&self.services);
        let Some(in_namespace) = table.get(&pod.namespace) else {
            return Vec::new();
        };
        in_namespace
            .iter()
            .filter(|(name, entry)| named.contains(name.as_str()) || entry.selects(&pod.labels))
            .map(|(name, entry)| ServiceFacts {
                name: name.clone(),
                service_type: entry.service_type,
                selector: entry
                    .selector
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                selects_pod: entry.selects(&pod.labels),
            })
            .collect()
    }

    /// Whether `namespace` has a Service that could expose a pod no EndpointSlice lists
    /// yet: one with a selector that is neither headless nor ExternalName.
    pub fn has_selecting_service(&self, namespace: &str) -> bool {
        read(&self.services)
            .get(namespace)
            .is_some_and(|m| m.values().any(ServiceEntry::may_expose))
    }

    /// Whether such a Service of `namespace` selects a pod labelled `labels`.
    pub fn service_selects(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        read(&self.services).get(namespace).is_some_and(|m| {
            m.values()
                .any(|entry| entry.may_expose() && entry.selects(labels))
        })
    }

    /// Everything [`super::decide::decide`] needs about `pod`'s surroundings.
    pub fn snapshot(&self, pod: &PodFacts) -> Snapshot {
        let endpoints = self.endpoints_of(&pod.namespace, &pod.name, Some(&pod.uid));
        let services = self.services_of(pod, &endpoints);
        let pdbs = read(&self.pdbs)
            .get(&pod.namespace)
            .map(|m| {
                m.values()
                    .filter(|p| pdb_selects(p, &pod.labels))
                    .map(|p| pdb_facts(p, &pod.name))
                    .collect()
            })
            .unwrap_or_default();
        Snapshot {
            endpoints,
            services,
            namespace: self.namespace(&pod.namespace),
            pdbs,
            no_deleter: !self.deleter_alive(jiff::Timestamp::now()),
            left_slices_at: self.left_slices_at(&pod.namespace, &pod.name),
        }
    }

    /// Applies one EndpointSlice (tests and the benchmark fill the cache this way).
    pub fn apply_slice(&self, slice: &EndpointSlice) {
        write(&self.slices).upsert(slice);
    }

    /// Applies one Service.
    pub fn apply_service(&self, svc: &Service) {
        let spec = svc.spec.as_ref();
        let entry = ServiceEntry {
            service_type: ServiceType::parse(
                spec.and_then(|s| s.type_.as_deref()),
                spec.and_then(|s| s.cluster_ip.as_deref()),
            ),
            selector: spec
                .and_then(|s| s.selector.as_ref())
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                        .collect()
                })
                .unwrap_or_default(),
        };
        let (namespace, name) = key_of(&svc.metadata);
        write(&self.services)
            .entry(namespace)
            .or_default()
            .insert(name, entry);
    }

    /// Applies one namespace's metadata.
    pub fn apply_namespace(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) {
        let facts = NamespaceFacts {
            opted_out: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(OPT_OUT_LABEL))
                .is_some_and(|v| v == "true"),
            delay: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(DELAY_ANNOTATION))
                .cloned(),
            terminating: meta.deletion_timestamp.is_some(),
        };
        write(&self.namespaces).insert(meta.name.clone().unwrap_or_default(), facts);
    }

    /// Applies one PodDisruptionBudget (managed fields dropped).
    pub fn apply_pdb(&self, pdb: &PodDisruptionBudget) {
        let mut pdb = pdb.clone();
        pdb.metadata.managed_fields = None;
        let (ns, name) = key_of(&pdb.metadata);
        write(&self.pdbs)
            .entry(ns)
            .or_default()
            .insert(name, Arc::new(pdb));
    }

    fn remove(&self, kind: Kind, key: &Key) {
        match kind {
            Kind::Slices => write(&self.slices).remove(key),
            Kind::Services => {
                let mut services = write(&self.services);
                if let Some(m) = services.get_mut(&key.0) {
                    m.remove(&key.1);
                    if m.is_empty() {
                        services.remove(&key.0);
                    }
                }
            }
            Kind::Namespaces => {
                write(&self.namespaces).remove(&key.1);
            }
            Kind::Pdbs => {
                if let Some(m) = write(&self.pdbs).get_mut(&key.0) {
                    m.remove(&key.1);
                }
            }
        }
    }

    fn keys(&self, kind: Kind) -> Vec<Key> {
        match kind {
            Kind::Slices => read(&self.slices).ids.keys().cloned().collect(),
            Kind::Services => read(&self.services)
                .iter()
                .flat_map(|(ns, m)| m.keys().map(|n| (ns.clone(), n.clone())))
                .collect(),
            Kind::Namespaces => read(&self.namespaces)
                .keys()
                .map(|n| (String::new(), n.clone()))
                .collect(),
            Kind::Pdbs => read(&self.pdbs)
                .iter()
                .flat_map(|(ns, m)| m.keys().map(|n| (ns.clone(), n.clone())))
                .collect(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Slices = 0,
    Services = 1,
    Namespaces = 2,
    Pdbs = 3,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Slices => "endpointslices",
            Kind::Services => "services",
            Kind::Namespaces => "namespaces",
            Kind::Pdbs => "poddisruptionbudgets",
        }
    }
}

/// Feeds `events` into the cache table `kind`; objects missing from a relist are removed.
async fn drive<K, S>(
    cache: Arc<Cache>,
    kind: Kind,
    events: S,
    apply: impl Fn(&Cache, &K),
    meta: impl Fn(&K) -> Key,
) -> Result<(), Error>
where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    let mut seen: Option<HashSet<Key>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(obj)) => apply(&cache, &obj),
            Ok(Event::Delete(obj)) => cache.remove(kind, &meta(&obj)),
            Ok(Event::Init) => seen = Some(HashSet::new()),
            Ok(Event::InitApply(obj)) => {
                apply(&cache, &obj);
                if let Some(seen) = seen.as_mut() {
                    seen.insert(meta(&obj));
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = seen.take() {
                    for key in cache.keys(kind).into_iter().filter(|k| !seen.contains(k)) {
                        cache.remove(kind, &key);
                    }
                }
                cache.synced[kind as usize].store(true, Ordering::Release);
                tracing::debug!(kind = kind.name(), "cache synced");
            }
            Err(error) => {
                tracing::warn!(kind = kind.name(), error = %graceful_drain_core::error::chain(&error), "watch error; retrying")
            }
        }
    }
    Err(Error::Ended(kind.name()))
}

/// EndpointSlices per list page: a slice holds up to 100 endpoints by default (1,000 at
/// most), so a page stays within a few megabytes of JSON.
pub const SLICE_PAGE: u32 = 50;

/// Runs the four watches until one ends (owned tasks spawned by the caller).
///
/// The lists are paged (kube-rs then sends no `resourceVersion=0`, which the API server
/// would answer whole from its watch cache), and EndpointSlices come in small pages of
/// [`SLICE_PAGE`]: a page is decoded in full before the watcher hands out its objects,
/// and at 150,000 endpoints pages of 500 slices left about 30 MiB more with the
/// allocator after the initial list than pages of 50 (`cargo bench --bench scale`).
pub async fn run(cache: Arc<Cache>, client: kube::Client) -> Result<(), Error> {
    let cfg = watcher::Config::default().any_semantic();
    let slice_cfg = cfg.clone().page_size(SLICE_PAGE);
    let slices =
        watcher::watcher(Api::<EndpointSlice>::all(client.clone()), slice_cfg).default_backoff();
    let services =
        watcher::watcher(Api::<Service>::all(client.clone()), cfg.clone()).default_backoff();
    let namespaces = watcher::watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        cfg.clone(),
    )
    .default_backoff();
    let pdbs = watcher::watcher(Api::<PodDisruptionBudget>::all(client), cfg).default_backoff();
    let meta_key = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| key_of(m);
    tokio::try_join!(
        drive(
            cache.clone(),
            Kind::Slices,
            slices,
            Cache::apply_slice,
            |o: &EndpointSlice| meta_key(&o.metadata)
        ),
        drive(
            cache.clone(),
            Kind::Services,
            services,
            Cache::apply_service,
            |o: &Service| meta_key(&o.metadata)
        ),
        drive(
            cache.clone(),
            Kind::Namespaces,
            namespaces,
            |c, o| c.apply_namespace(&o.metadata),
            |o| (String::new(), o.metadata.name.clone().unwrap_or_default())
        ),
        drive(
            cache.clone(),
            Kind::Pdbs,
            pdbs,
            Cache::apply_pdb,
            |o: &PodDisruptionBudget| meta_key(&o.metadata)
        ),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;
