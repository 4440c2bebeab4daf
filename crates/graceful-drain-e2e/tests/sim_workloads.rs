//! End-to-end scenarios for the simulated StatefulSet and DaemonSet controllers: the
//! controllers, scheduler and kubelets against the in-process API server, observed through
//! watches so every ordering claim is checked on the API server's own event order.

// Helpers outside #[test] functions unwrap too: a failed step fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::{Stream, StreamExt};
use graceful_drain_core::runtime::Shutdown;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use kube_sim::cluster::{Cluster, ClusterConfig, wait_for};
use kube_sim::controllers::pod_ready;
use kube_sim::fixtures::{self, DaemonSetFixture, PdbFixture, StatefulSetFixture};

/// Bound for any convergence in these tests; runs take a few seconds.
const TIMEOUT: Duration = Duration::from_secs(30);
const REVISION_LABEL: &str = "controller-revision-hash";

async fn cluster() -> Cluster {
    graceful_drain_core::runtime::install_crypto_provider();
    graceful_drain_core::runtime::init_tracing(graceful_drain_core::runtime::LogFormat::Text);
    graceful_drain_sim::setup::start(ClusterConfig::default(), Shutdown::new())
        .await
        .unwrap()
}

/// A fixture as a user would write it: the API server assigns uid and generation.
fn submitted<K: kube::Resource>(mut obj: K) -> K {
    obj.meta_mut().uid = None;
    obj.meta_mut().generation = None;
    obj
}

/// The live pods carrying `app=<app>`, kept up to date from one watch so that each check
/// sees the API server's order of events.
struct PodWatch<S> {
    events: S,
    /// Live pods by uid.
    pods: BTreeMap<String, Pod>,
    listed: bool,
}

/// What one watch event changed.
enum Change {
    Applied(Pod),
    Deleted(Pod),
    /// The initial list is complete.
    Listed,
}

fn watch_pods(
    cluster: &Cluster,
    app: &str,
) -> PodWatch<impl Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin> {
    let api: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    PodWatch {
        events: Box::pin(watcher::watcher(api, cfg)),
        pods: BTreeMap::new(),
        listed: false,
    }
}

impl<S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin> PodWatch<S> {
    /// The next change, waiting at most [`TIMEOUT`].
    async fn next(&mut self, what: &str) -> Change {
        loop {
            let event = tokio::time::timeout(TIMEOUT, self.events.next())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
                .expect("watch ended")
                .expect("watch failed");
            match event {
                Event::Init => self.pods.clear(),
                Event::InitApply(pod) | Event::Apply(pod) => {
                    self.pods.insert(pod.uid().unwrap(), pod.clone());
                    if self.listed {
                        return Change::Applied(pod);
                    }
                }
                Event::InitDone => {
                    self.listed = true;
                    return Change::Listed;
                }
                Event::Delete(pod) => {
                    self.pods.remove(&pod.uid().unwrap());
                    return Change::Deleted(pod);
                }
            }
        }
    }

    fn by_name(&self, name: &str) -> Option<&Pod> {
        self.pods.values().find(|p| p.name_any() == name)
    }

    /// Whether pod `name` exists, is Ready and is not terminating.
    fn serving(&self, name: &str) -> bool {
        self.by_name(name).is_some_and(serving)
    }
}

fn serving(pod: &Pod) -> bool {
    pod_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_starts_in_order_and_replaces_a_pod_only_once_it_is_gone() {
    let cluster = cluster().await;
    let client = cluster.client();
    let mut watch = watch_pods(&cluster, "web");
    while !matches!(watch.next("the initial pod list").await, Change::Listed) {}
    let pdb = submitted(
        fixtures::pdb("web")
            .selecting(&[("app", "web")])
            .min_available(2),
    );
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    let set = submitted(
        fixtures::stateful_set("web")
            .replicas(3)
            .selecting(&[("app", "web")])
            .container("sim/web:1"),
    );
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    sets.create(&PostParams::default(), &set).await.unwrap();

    // OrderedReady: each pod appears only once every lower ordinal serves.
    let names = ["web-0", "web-1", "web-2"];
    let mut ready_order = Vec::new();
    while ready_order.len() < names.len() {
        if let Change::Applied(pod) = watch.next("web-0..2 Ready").await {
            let ord = names.iter().position(|n| *n == pod.name_any()).unwrap();
            for lower in &names[..ord] {
                assert!(
                    watch.serving(lower),
                    "{} exists before {lower} is Ready",
                    pod.name_any()
                );
            }
            if serving(&pod) && !ready_order.contains(&ord) {
                ready_order.push(ord);
            }
        }
    }
    assert_eq!(ready_order, vec![0, 1, 2]);
    wait_for("statefulset status and its PDB", TIMEOUT, || async {
        let s = sets.get("web").await.unwrap().status.unwrap_or_default();
        let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), "default")
            .get("web")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        s.ready_replicas == Some(3)
            && s.current_replicas == Some(3)
            && s.observed_generation == Some(1)
            && pdb.expected_pods == 3
            && pdb.disruptions_allowed == 1
    })
    .await
    .unwrap();

    // Deleting web-1: its replacement, same name and a new UID, only once the old one is gone.
    let old_uid = watch.by_name("web-1").unwrap().uid().unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    let mut old_gone = false;
    loop {
        match watch.next("web-1 replaced").await {
            Change::Deleted(pod) if pod.uid().as_ref() == Some(&old_uid) => old_gone = true,
            Change::Applied(pod)
                if pod.name_any() == "web-1" && pod.uid() != Some(old_uid.clone()) =>
            {
                assert!(old_gone, "a new web-1 exists while the old one does");
                if serving(&pod) {
                    break;
                }
            }
            _ => {}
        }
    }
    assert!(watch.serving("web-0") && watch.serving("web-2"));
}

/// The node each serving pod of `watch` runs on, and whether it has `revision`.
fn serving_nodes<S>(watch: &PodWatch<S>) -> BTreeMap<String, String> {
    watch
        .pods
        .values()
        .filter(|p| serving(p))
        .map(|p| {
            let node = p.spec.as_ref().unwrap().node_name.clone().unwrap();
            (node, p.labels()[REVISION_LABEL].clone())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonset_keeps_its_pod_on_a_cordoned_node_and_rolls_one_node_at_a_time() {
    let cluster = cluster().await;
    let client = cluster.client();
    let nodes: BTreeSet<String> = cluster.nodes().iter().cloned().collect();
    let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let agent = submitted(
        fixtures::daemon_set("agent")
            .selecting(&[("app", "agent")])
            .container("sim/agent:1"),
    );
    daemons
        .create(&PostParams::default(), &agent)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut watch = watch_pods(&cluster, "agent");
    while !matches!(watch.next("the initial pod list").await, Change::Listed) {}
    while serving_nodes(&watch).len() < nodes.len() {
        watch.next("a serving agent pod on every node").await;
    }
    assert_eq!(watch.pods.len(), nodes.len(), "one pod per node");

    // Cordon a node; a second DaemonSet still lands there, and the first keeps its pod.
    let cordoned = cluster.nodes()[0].clone();
    let on_cordoned = |pods: &BTreeMap<String, Pod>| -> Vec<String> {
        pods.values()
            .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(&cordoned))
            .map(|p| p.uid().unwrap())
            .collect()
    };
    let before = on_cordoned(&watch.pods);
    graceful_drain_sim::scenario::actions::cordon(&client, &cordoned, true)
        .await
        .unwrap();
    let probe = submitted(
        fixtures::daemon_set("probe")
            .selecting(&[("app", "probe")])
            .container("sim/probe:1"),
    );
    daemons
        .create(&PostParams::default(), &probe)
        .await
        .unwrap();
    wait_for(
        "probe pod serving on the cordoned node",
        TIMEOUT,
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=probe"))
                .await
                .unwrap();
            list.items.iter().any(|p| {
                serving(p) && p.spec.as_ref().unwrap().node_name.as_deref() == Some(&cordoned)
            })
        },
    )
    .await
    .unwrap();
    let agents = pods
        .list(&ListParams::default().labels("app=agent"))
        .await
        .unwrap();
    let agents: BTreeMap<String, Pod> = agents
        .items
        .into_iter()
        .map(|p| (p.uid().unwrap(), p))
        .collect();
    assert_eq!(
        on_cordoned(&agents),
        before,
        "the cordoned node kept its daemon pod"
    );
    assert!(agents.values().all(serving));

    // A template change rolls the pods with maxUnavailable 1, cordoned node included.
    let old_revision = serving_nodes(&watch)[&cordoned].clone();
    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [
        {"name": "app", "image": "sim/agent:2"}]}}}});
    daemons
        .patch("agent", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let mut most_unavailable = 0;
    loop {
        watch.next("the rollout").await;
        let serving = serving_nodes(&watch);
        most_unavailable = most_unavailable.max(nodes.len() - serving.len());
        let rolled = serving.len() == nodes.len()
            && serving.values().all(|r| *r != old_revision)
            && watch.pods.len() == nodes.len();
        if rolled {
            break;
        }
    }
    assert_eq!(most_unavailable, 1, "one node at a time");
    wait_for("daemonset status after the rollout", TIMEOUT, || async {
        let ds = daemons.get("agent").await.unwrap();
        let s = ds.status.unwrap_or_default();
        s.observed_generation == ds.metadata.generation
            && s.desired_number_scheduled == 3
            && s.updated_number_scheduled == Some(3)
            && s.number_available == Some(3)
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_completes_when_an_evicted_pod_is_ignored_by_its_pod_failure_policy() {
    use k8s_openapi::api::batch::v1::Job;
    use kube::api::EvictParams;
    use kube_sim::controllers::kubelet::RUN_FOR_ANNOTATION;
    use kube_sim::fixtures::{JobFixture, on_pod_condition};

    let cluster = cluster().await;
    let client = cluster.client();
    let mut watch = watch_pods(&cluster, "batch");
    while !matches!(watch.next("the initial pod list").await, Change::Listed) {}
    // backoffLimit 0: a single counted failure would fail the Job.
    let job = fixtures::job("batch")
        .completions(Some(3))
        .parallelism(2)
        .backoff_limit(0)
        .failure_rule(on_pod_condition("Ignore", "DisruptionTarget"))
        .template_labels(&[("app", "batch")])
        .template_annotation(RUN_FOR_ANNOTATION, "3s")
        .container("sim/batch:1");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &submitted(job))
        .await
        .unwrap();

    // Evict the first pod that serves, through the eviction API (no PDB: it goes at once).
    let victim = loop {
        if let Change::Applied(pod) = watch.next("a running job pod").await
            && serving(&pod)
        {
            break pod;
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.evict(&victim.name_any(), &EvictParams::default())
        .await
        .unwrap();

    let victim_uid = victim.uid().unwrap();
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone());
    let mut seen = BTreeSet::new();
    let (mut most_active, mut victim_failed, mut victim_gone) = (0, false, false);
    loop {
        match watch.next("the job's pods to finish").await {
            Change::Deleted(p) if p.uid().unwrap() == victim_uid => victim_gone = true,
            Change::Applied(p) if p.uid().unwrap() == victim_uid => {
                let disrupted = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "DisruptionTarget" && c.status == "True");
                victim_failed |= phase(&p).as_deref() == Some("Failed") && disrupted;
            }
            _ => {}
        }
        seen.extend(watch.pods.keys().cloned());
        let active = watch.pods.values().filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && !matches!(phase(p).as_deref(), Some("Succeeded" | "Failed"))
        });
        most_active = most_active.max(active.count());
        let succeeded = watch
            .pods
            .values()
            .filter(|p| phase(p).as_deref() == Some("Succeeded"))
            .count();
        if victim_gone && succeeded == 3 {
            break;
        }
    }
    assert!(
        victim_failed,
        "the kubelet made the evicted pod Failed, keeping its DisruptionTarget condition"
    );
    assert_eq!(most_active, 2, "never more than parallelism pods at once");
    assert_eq!(
        seen.len(),
        4,
        "three completions and the evicted pod: {seen:?}"
    );

    wait_for("the job to complete", TIMEOUT, || async {
        let job = jobs.get("batch").await.unwrap();
        let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
    })
    .await
    .unwrap();
    let status = jobs.get("batch").await.unwrap().status.unwrap();
    assert_eq!(status.succeeded, Some(3));
    assert_eq!(status.failed.unwrap_or(0), 0, "the eviction is ignored");
    assert_eq!((status.active, status.ready), (Some(0), Some(0)));
    let types: BTreeSet<&str> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.status == "True")
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, BTreeSet::from(["Complete", "SuccessCriteriaMet"]));
    assert!(status.start_time.is_some() && status.completion_time.is_some());
    let uncounted = status.uncounted_terminated_pods.unwrap_or_default();
    assert!(uncounted.succeeded.unwrap_or_default().is_empty());
    // The completed pods stay, without the tracking finalizer.
    let left = pods
        .list(&ListParams::default().labels("app=batch"))
        .await
        .unwrap();
    assert_eq!(left.items.len(), 3);
    assert!(left.items.iter().all(|p| p.finalizers().is_empty()));
}
