//! The simulated control plane's controllers and kubelets. Each talks to the API server
//! only over HTTP with kube-rs, authenticated as its own user (as in a real cluster), so
//! admission webhooks see their requests exactly as they would see the real ones.
//!
//! Every controller is level-triggered: reflectors keep local caches and wake the
//! controller; a pass compares the caches with the desired state and acts; the pass
//! says when it wants to run again (timers), and a periodic resync catches anything
//! missed; `run_passes` is that loop, shared by all of them. Writes that depend on a
//! cached object carry its resourceVersion, so a stale cache causes a conflict and a
//! retry, never a wrong write.
//!
//! The StatefulSet, DaemonSet and Job controllers share more: one generic controller in
//! `workload` (the pass over the owners, the expectations, the claim, delete and status
//! calls), so their files hold only each kind's rules.

pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpointslice;
pub mod gc;
pub mod job;
pub mod kubelet;
pub mod replicaset;
pub mod scheduler;
pub mod statefulset;
mod workload;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use tokio_util::sync::CancellationToken;

use crate::task::spawn_owned;

/// The users the controllers authenticate as: the names kube-controller-manager's controllers
/// get with `--use-service-account-credentials` (one ServiceAccount per controller in
/// kube-system) and kube-scheduler's user, so RBAC and audit read the same as on a real cluster.
pub mod users {
    /// The scheduler, which binds pending pods to nodes.
    pub const SCHEDULER: &str = "system:kube-scheduler";
    /// The ReplicaSet controller, which creates, adopts, releases and deletes pods.
    pub const REPLICASET: &str = "system:serviceaccount:kube-system:replicaset-controller";
    /// The Deployment controller, which scales the ReplicaSets of a rollout.
    pub const DEPLOYMENT: &str = "system:serviceaccount:kube-system:deployment-controller";
    /// The StatefulSet controller.
    pub const STATEFULSET: &str = "system:serviceaccount:kube-system:statefulset-controller";
    /// The DaemonSet controller (its ServiceAccount is `daemon-set-controller` upstream,
    /// with the hyphen).
    pub const DAEMONSET: &str = "system:serviceaccount:kube-system:daemon-set-controller";
    /// The EndpointSlice controller, whose slices the load balancers follow.
    pub const ENDPOINTSLICE: &str = "system:serviceaccount:kube-system:endpointslice-controller";
    /// The disruption controller, which writes PodDisruptionBudget status.
    pub const DISRUPTION: &str = "system:serviceaccount:kube-system:disruption-controller";
    /// The Job controller.
    pub const JOB: &str = "system:serviceaccount:kube-system:job-controller";
    /// The garbage collector, which deletes pods and ReplicaSets whose controller is gone.
    pub const GARBAGE_COLLECTOR: &str =
        "system:serviceaccount:kube-system:generic-garbage-collector";
    /// The service controller's identity, used by the simulated load balancers to follow
    /// Services and EndpointSlices and to publish each load balancer's hostname.
    pub const SERVICE_CONTROLLER: &str = "system:serviceaccount:kube-system:service-controller";
    /// The node lifecycle controller's identity, used only at node registration to lift
    /// the not-ready taint (the simulator runs no node lifecycle controller).
    pub const NODE_LIFECYCLE_CONTROLLER: &str = "system:serviceaccount:kube-system:node-controller";

    /// The kubelet of `node`.
    pub fn kubelet(node: &str) -> String {
        format!("system:node:{node}")
    }
}

/// Errors of the simulated controllers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action} {object}")]
    Api {
        /// What was being done, as a verb phrase (`create`, `update status of`, ...).
        action: &'static str,
        /// The object it was done to, with its kind (`statefulset ns/name`).
        object: String,
        /// The client's error; a 409 makes [`Error::is_conflict`] true.
        #[source]
        source: kube::Error,
    },
    /// An object could not be used as found.
    #[error("{object}: {reason}")]
    Invalid {
        /// The object, with its kind (`deployment ns/name`), or the offending value itself
        /// when a field such as `maxSurge` could not be parsed.
        object: String,
        /// What about it could not be used (a missing spec, a malformed value).
        reason: String,
    },
}

impl Error {
    /// Whether the API server refused a write made from a stale cache (409).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source, .. } if status_code(source) == Some(409))
    }
}

/// Result of the controllers.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds a mapper from `kube::Error` to [`Error::Api`].
pub(crate) fn api_err(
    action: &'static str,
    object: impl Into<String>,
) -> impl FnOnce(kube::Error) -> Error {
    let object = object.into();
    move |source| Error::Api {
        action,
        object,
        source,
    }
}

/// The HTTP status of an API error, if the server answered.
pub(crate) fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// How often every controller re-runs a pass even without events: a safety net for a
/// missed wake-up, short enough to heal a simulated run within its few seconds.
pub const RESYNC: Duration = Duration::from_secs(2);

/// How long a woken controller waits for more events before its pass: bursts (a
/// ReplicaSet creating 500 pods) then cost one pass instead of hundreds, while 20 ms
/// stays far below every simulated lag.
pub const BATCH: Duration = Duration::from_millis(20);

/// Where one controller's reflectors report: they list through the same client, wake the
/// same `Notify`, and stop with the same shutdown.
pub struct Watches {
    client: kube::Client,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
}

impl Watches {
    /// Reflectors for a controller acting as `client`'s user, until `shutdown`.
    pub fn new(client: kube::Client, shutdown: CancellationToken) -> Self {
        Self {
            client,
            wake: Arc::new(Notify::new()),
            shutdown,
        }
    }

    /// Notified on every watch event of every reflector started here.
    pub fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// A reflector on every `K` in the cluster.
    pub fn all<K>(&self) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        self.matching(watcher::Config::default())
    }

    /// A reflector on the `K` that `config` selects.
    pub fn matching<K>(&self, config: watcher::Config) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        reflect(
            Api::all(self.client.clone()),
            config,
            self.wake.clone(),
            self.shutdown.clone(),
        )
    }
}

/// Starts a reflector on `api` in an owned task: returns its store; every watch event
/// wakes `wake`. Watch errors are retried with kube-runtime's default backoff.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config).default_backoff().reflect(writer);
    let stop = shutdown.clone();
    spawn_owned("reflector", shutdown, async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ok::<(), Error>(()),
                item = stream.next() => match item {
                    Some(Ok(_)) => wake.notify_one(),
                    Some(Err(error)) => tracing::debug!(%error, "watch error; retrying"),
                    None => return Ok(()),
                },
            }
        }
    });
    store
}

/// A level-triggered controller: each pass compares its caches with the desired state
/// and acts.
pub(crate) trait Reconciler {
    /// Runs one pass; returns when the controller wants the next one, if that is sooner
    /// than a change or the resync.
    fn pass(&mut self) -> impl Future<Output = Option<Instant>> + Send;
}

/// The loop of every controller once its caches are ready: a pass, then a wait for a
/// change (`wake`), the time the pass asked for, or [`RESYNC`] ([`next_pass`]); until
/// `shutdown`.
pub(crate) async fn run_passes(
    mut reconciler: impl Reconciler,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> Result<()> {
    loop {
        let next = reconciler.pass().await;
        if !next_pass(wake, shutdown, next).await {
            return Ok(());
        }
    }
}

/// Waits for the next pass: returns `false` on `shutdown`, `true` when `wake` fires,
/// when `next` (the time the last pass asked for) comes, or after [`RESYNC`].
pub async fn next_pass(wake: &Notify, shutdown: &CancellationToken, next: Option<Instant>) -> bool {
    let resync = Instant::now() + RESYNC;
    let deadline = next.map_or(resync, |n| n.min(resync));
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = wake.notified() => {
            // Let the rest of a burst of events arrive, so one pass handles them all.
            tokio::time::sleep(BATCH).await;
            true
        }
        _ = tokio::time::sleep_until(deadline.into()) => true,
    }
}

/// Waits until `store` has its first list; `false` if `shutdown` came first.
pub async fn ready<K>(store: &Store<K>, shutdown: &CancellationToken) -> bool
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    tokio::select! {
        _ = shutdown.cancelled() => false,
        r = store.wait_until_ready() => r.is_ok(),
    }
}

/// `pods` grouped by namespace: a controller's pass looks up each owner's pods there.
pub fn by_namespace(pods: &[Arc<Pod>]) -> BTreeMap<String, Vec<Arc<Pod>>> {
    let mut grouped: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
    for pod in pods {
        grouped
            .entry(pod.namespace().unwrap_or_default())
            .or_default()
            .push(pod.clone());
    }
    grouped
}

/// Work in flight per object: a controller does not start new work on an object
/// while earlier work on it (possibly an API call held by a webhook) is running, and is
/// woken when that work ends. Dropping it aborts the work.
pub struct Workers {
    running: HashMap<String, JoinHandle<()>>,
    wake: Arc<Notify>,
    /// At most this many objects worked on at once (the controller's worker count).
    limit: Option<usize>,
}

impl Workers {
    /// No work in flight; finished work wakes `wake`.
    pub fn new(wake: Arc<Notify>) -> Self {
        Self {
            running: HashMap::new(),
            wake,
            limit: None,
        }
    }

    /// Work on at most `limit` objects at once, like a controller with `limit` workers
    /// (kube-controller-manager's `--concurrent-*-syncs`): while every worker waits on its
    /// API calls (a DELETE held by an admission webhook), no other object is synced.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit.max(1));
        self
    }

    /// Whether every worker is busy: start no new work until one finishes (it wakes the
    /// controller).
    pub fn full(&mut self) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        self.running.retain(|_, handle| !handle.is_finished());
        self.running.len() >= limit
    }

    /// Whether work on `key` is still running.
    pub fn busy(&mut self, key: &str) -> bool {
        match self.running.get(key) {
            Some(handle) if !handle.is_finished() => true,
            Some(_) => {
                self.running.remove(key);
                false
            }
            None => false,
        }
    }

    /// Starts `work` for `key`; its error is logged, and the controller woken.
    pub fn spawn<F>(&mut self, key: String, work: F)
    where
        F: Future<Output = Result<()>> + Send + 'static,
    {
        let wake = self.wake.clone();
        let handle = tokio::spawn(async move {
            match work.await {
                Err(error) if error.is_conflict() => {
                    tracing::debug!(%error, "stale cache; will retry");
                }
                Err(error) => tracing::info!(%error, "controller work failed; will retry"),
                Ok(()) => {}
            }
            wake.notify_one();
        });
        self.running.insert(key, handle);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for handle in self.running.values() {
            handle.abort();
        }
    }
}

/// `(namespace, name)` of an object.
pub fn ns_name<K: Resource>(obj: &K) -> (String, String) {
    (obj.namespace().unwrap_or_default(), obj.name_any())
}

/// `ns/name` of an object, for messages and the timeline.
pub fn key<K: Resource>(obj: &K) -> String {
    let (ns, name) = ns_name(obj);
    format!("{ns}/{name}")
}

/// The controlling owner reference of an object, if any.
pub fn controller_of<K: Resource>(obj: &K) -> Option<&OwnerReference> {
    obj.meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

pub use crate::selector::selector_matches;

/// Whether `labels` satisfy a Service's selector map (a missing or empty selector
/// selects nothing: such Services have no managed endpoints).
pub fn map_selector_matches(
    selector: Option<&BTreeMap<String, String>>,
    labels: &BTreeMap<String, String>,
) -> bool {
    match selector {
        Some(sel) if !sel.is_empty() => sel.iter().all(|(k, v)| labels.get(k) == Some(v)),
        _ => false,
    }
}

/// Whether the pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether the pod has finished (Succeeded or Failed).
pub fn pod_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether the pod counts as active for its controller: not finished, not deleting.
pub fn pod_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !pod_finished(pod)
}

/// The pod's labels (empty if none).
pub fn labels_of<K: Resource>(obj: &K) -> BTreeMap<String, String> {
    obj.meta().labels.clone().unwrap_or_default()
}

/// Resolves an IntOrString against `total` (percentages round up or down).
pub fn scaled(
    value: Option<&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    total: i32,
    default: &str,
    round_up: bool,
) -> Result<i32> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let text = match value {
        Some(IntOrString::Int(n)) => return Ok(*n),
        Some(IntOrString::String(s)) => s.as_str(),
        None => default,
    };
    let invalid = || Error::Invalid {
        object: text.to_string(),
        reason: "not an integer or a percentage".to_string(),
    };
    match text.strip_suffix('%') {
        Some(pct) => {
            let pct: i64 = pct.parse().map_err(|_| invalid())?;
            let num = pct * i64::from(total);
            let v = if round_up {
                (num + 99) / 100
            } else {
                num / 100
            };
            i32::try_from(v).map_err(|_| invalid())
        }
        None => text.parse().map_err(|_| invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        assert!(selector_matches(&sel, &labels(&[("app", "web")])));
        assert!(selector_matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "fe")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "db")])
        ));
        assert!(!selector_matches(&sel, &labels(&[("tier", "fe")])));
        assert!(selector_matches(&LabelSelector::default(), &labels(&[])));
        assert!(!map_selector_matches(None, &labels(&[("app", "web")])));
        let svc = labels(&[("app", "web")]);
        assert!(map_selector_matches(
            Some(&svc),
            &labels(&[("app", "web"), ("x", "y")])
        ));
        assert!(!map_selector_matches(Some(&svc), &labels(&[("x", "y")])));
    }

    #[test]
    fn int_or_percent() {
        let pct = IntOrString::String("25%".into());
        assert_eq!(scaled(Some(&pct), 3, "0", true).unwrap(), 1);
        assert_eq!(scaled(Some(&pct), 3, "0", false).unwrap(), 0);
        assert_eq!(
            scaled(Some(&IntOrString::Int(2)), 3, "0", false).unwrap(),
            2
        );
        assert_eq!(scaled(None, 10, "25%", false).unwrap(), 2);
        assert!(scaled(Some(&IntOrString::String("x%".into())), 3, "0", false).is_err());
    }

    #[tokio::test]
    async fn a_controller_with_n_workers_starts_no_work_while_n_objects_are_in_flight() {
        let wake = Arc::new(Notify::new());
        let mut workers = Workers::new(wake.clone()).with_limit(2);
        let (release_a, held_a) = tokio::sync::oneshot::channel::<()>();
        let (_release_b, held_b) = tokio::sync::oneshot::channel::<()>();
        workers.spawn("a".into(), async move {
            let _ = held_a.await;
            Ok(())
        });
        assert!(!workers.full(), "one of two workers busy");
        workers.spawn("b".into(), async move {
            let _ = held_b.await;
            Ok(())
        });
        assert!(workers.full(), "both workers wait on their calls");
        release_a.send(()).unwrap();
        wake.notified().await;
        // The wake comes from inside the finishing task: let it complete.
        let mut spins = 0;
        while workers.full() && spins < 1000 {
            tokio::task::yield_now().await;
            spins += 1;
        }
        assert!(!workers.full(), "a finished worker takes new work");
        assert!(workers.busy("b"));
        assert!(!Workers::new(wake).full(), "no limit, never full");
    }
}
