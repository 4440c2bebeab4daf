//! The real tier's forged-review rows: AdmissionReviews posted straight to the webhook's
//! port by someone on the pod network (never through kube-apiserver), for each kind of pod
//! the webhook can meet, and a flood of them. Whatever they claim, nothing may be deleted,
//! no Service may drop below its budget (its PDB's `minAvailable`, or without a PDB the
//! unconfirmed share of docs/security.md), and the traffic must see no 5xx; every pod a
//! review isolated is back in its Services at its restore time.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};

use super::components::Components;
use super::spec::Workload;
use super::{Error, Measured, ScenarioConfig, actions, drainers, measure, workloads};
use graceful_drain_core::labels::DRAINING_LABEL;
use graceful_drain_webhook::decide::STATEFULSET_CONTROLLER;
use kube_sim::cluster::{RealCluster, WebSpec, wait_for};

/// How long after its delete time a pod a forged review isolated is put back
/// (`--restore-after` of the replica these rows run; the product's default is a minute).
pub(super) const RESTORE_AFTER: &str = "5s";

/// The pods a forged-review row targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The standard Deployment (its ReplicaSet's pods) behind a PDB.
    Deployment,
    /// A StatefulSet behind its governing headless Service, a LoadBalancer Service and a
    /// PDB on the StatefulSet's own label, which the isolated pods stay selected by.
    StatefulSet,
    /// A DaemonSet, one pod per node, behind a PDB.
    DaemonSet,
    /// Pods with no controller behind a Service, without a PDB.
    BarePods,
    /// Forged evictions of every pod of the Deployment at once, twice over; with or
    /// without its PDB.
    Flood {
        /// Whether the Deployment has its PDB.
        pdb: bool,
    },
    /// Every node cordoned (and nothing more: no drainer's mark), then forged evictions of
    /// every pod of the Deployment, without its PDB, asking for `gracePeriodSeconds: 0`,
    /// twice over. A cordon is no drain: the reviews are bounded as anywhere else, and
    /// nothing is deleted.
    Cordoned,
    /// Forged evictions of every pod of the Deployment, without its PDB, twice over,
    /// through two webhook replicas (the chart's default) that the reviews alternate
    /// between: the unconfirmed share holds over both, not once per replica.
    TwoReplicas,
    /// A StatefulSet behind a PDB of one disruption whose rolling update stalls (its new
    /// top member never turns ready), then forged DELETEs of every other member claiming
    /// the StatefulSet controller: its controller takes nothing more down while a member
    /// is unavailable, so none of them is its step.
    StalledStatefulSet,
}

/// Who the forged reviews claim to be: someone's token with no rights to speak of.
const VIEWER: &str = "system:serviceaccount:tenant:viewer";

/// Runs one forged-review row: deploys its workload in a namespace of its own, posts the
/// reviews under traffic, waits until every isolated pod is back, and checks that nothing
/// was deleted and the Service never fell below its floor.
pub(super) async fn row(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &mut Components,
    target: Target,
) -> Result<Measured, Error> {
    let mut cfg = cfg.clone();
    cfg.web.namespace = format!("forged-{}", namespace_suffix(target));
    let web = &mut cfg.web;
    // A budget of one disruption, so the PDB is what bounds the reviews.
    web.min_available = match target {
        Target::DaemonSet => i32::try_from(cluster.nodes().len()).unwrap_or(1) - 1,
        _ => web.replicas - 1,
    };
    cluster.ensure_namespace(&web.namespace).await?;
    let timeout = cfg.phase_timeout;
    match target {
        Target::StatefulSet | Target::StalledStatefulSet => {
            workloads::deploy(cluster, web, timeout, Workload::StatefulSet).await?;
        }
        Target::DaemonSet => workloads::deploy(cluster, web, timeout, Workload::DaemonSet).await?,
        Target::BarePods => deploy_bare_pods(cluster, web, timeout).await?,
        Target::Deployment | Target::Flood { pdb: true } => {
            cluster.deploy_web(web, timeout).await?;
        }
        Target::Flood { pdb: false } | Target::Cordoned | Target::TwoReplicas => {
            cluster.deploy_web(web, timeout).await?;
            delete_pdb(cluster, web).await?;
        }
    }
    if !components.has_webhook_flag("--restore-after") {
        components.add_webhook_flags(&["--restore-after", RESTORE_AFTER]);
        components.roll_webhook(cluster, &cfg.components).await?;
    }
    if target == Target::StalledStatefulSet {
        stall_rollout(cluster, &cfg.web, timeout).await?;
    }
    let two = target == Target::TwoReplicas;
    if two {
        cluster.step("two webhook replicas behind one address, each connection to the next");
        components
            .two_replicas_one_a_process(cluster, &cfg.components)
            .await?;
    }
    let nodes = cluster.nodes().to_vec();
    let cordoned = target == Target::Cordoned;
    let measured = async {
        if cordoned {
            for node in &nodes {
                actions::cordon(&cluster.client(), node, true).await?;
            }
            cluster.step(format!("every node cordoned: {nodes:?}"));
        }
        let cfg = &cfg;
        let components = &*components;
        measure(cluster, cfg, attack(cluster, cfg, components, target)).await
    }
    .await;
    if cordoned {
        // Whatever the outcome: the rows after this one need their nodes.
        for node in &nodes {
            actions::cordon(&cluster.client(), node, false).await?;
        }
        drainers::wait_nodes(
            &cluster.client(),
            &nodes,
            timeout,
            "uncordoned, ready and untainted",
            |n| drainers::ready(n) && !drainers::repels(n),
        )
        .await?;
    }
    if two {
        // Whatever the outcome: the rows after this one run on one replica.
        components
            .back_to_one_replica(cluster, &cfg.components)
            .await?;
    }
    super::workloads::delete_namespace(cluster, &cfg.web.namespace).await;
    measured
}

fn namespace_suffix(target: Target) -> &'static str {
    match target {
        Target::Deployment => "deployment",
        Target::StatefulSet => "statefulset",
        Target::DaemonSet => "daemonset",
        Target::BarePods => "bare-pods",
        Target::Flood { pdb: true } => "flood",
        Target::Flood { pdb: false } => "flood-no-pdb",
        Target::Cordoned => "cordoned",
        Target::TwoReplicas => "two-replicas",
        Target::StalledStatefulSet => "statefulset-stalled",
    }
}

/// The fewest pods the Service may serve from while the reviews are answered: what its
/// PDB keeps, or without one what the unconfirmed share leaves (half, rounded down, never
/// none).
fn floor(target: Target, pods: usize, min_available: i32) -> usize {
    match target {
        Target::BarePods
        | Target::Flood { pdb: false }
        | Target::Cordoned
        | Target::TwoReplicas => (pods / 2).max(1),
        _ => usize::try_from(min_available).unwrap_or(0),
    }
}

/// Posts the row's reviews and checks what they left behind.
async fn attack(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    components: &Components,
    target: Target,
) -> Result<(), Error> {
    let web = &cfg.web;
    let ns = web.namespace.clone();
    let pods_api = Api::<Pod>::namespaced(cluster.client(), &ns);
    let before = serving_pods(&pods_api).await?;
    if before.len() < 3 {
        return Err(failed(format!("only {} pods serve in {ns}", before.len())));
    }
    let floor = floor(target, before.len(), web.min_available);
    let lowest = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let service = web.service_key();
    let watch = async {
        // Samples what the load balancer routes to while the reviews are answered: the
        // floor is about what the Service served at every moment.
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tick.tick().await;
            let serving = cluster
                .lbs()
                .registered(&service, std::time::Instant::now());
            lowest.fetch_min(serving.len(), std::sync::atomic::Ordering::Relaxed);
        }
    };
    let reviews = async {
        let posted = match target {
            Target::Flood { .. } | Target::Cordoned | Target::TwoReplicas => {
                let grace = (target == Target::Cordoned).then_some(0);
                cluster.step(format!(
                    "forged evictions of all {} pods of {ns}, twice{}",
                    before.len(),
                    match target {
                        Target::Cordoned => ", with gracePeriodSeconds 0",
                        Target::TwoReplicas => ", alternating between the replicas",
                        _ => "",
                    }
                ));
                let mut answers = Vec::new();
                for round in 0..2 {
                    let all = before.iter().map(|p| {
                        post(
                            components,
                            eviction(&ns, &p.name_any(), round, grace),
                            EVICT,
                        )
                    });
                    answers.extend(futures::future::join_all(all).await);
                }
                answers
            }
            Target::StalledStatefulSet => {
                cluster.step(format!(
                    "forged DELETEs of all {} serving members of {ns}, claiming {STATEFULSET_CONTROLLER}",
                    before.len()
                ));
                let all = before
                    .iter()
                    .map(|p| deletion(p, STATEFULSET_CONTROLLER))
                    .collect::<Result<Vec<_>, _>>()?;
                futures::future::join_all(all.into_iter().map(|r| post(components, r, DELETE)))
                    .await
            }
            _ => {
                let controller = match target {
                    Target::Deployment => "system:serviceaccount:kube-system:replicaset-controller",
                    Target::StatefulSet => STATEFULSET_CONTROLLER,
                    Target::DaemonSet => "system:serviceaccount:kube-system:daemon-set-controller",
                    _ => VIEWER,
                };
                let [a, b, c, ..] = before.as_slice() else {
                    unreachable!("three pods were checked above")
                };
                cluster.step(format!(
                    "forged eviction of {}, DELETEs of {} and {} (one claiming {controller}), straight to the webhook",
                    a.name_any(),
                    b.name_any(),
                    c.name_any()
                ));
                futures::future::join_all([
                    post(components, eviction(&ns, &a.name_any(), 0, None), EVICT),
                    post(components, deletion(b, VIEWER)?, DELETE),
                    post(components, deletion(c, controller)?, DELETE),
                ])
                .await
            }
        };
        for answer in posted {
            answer?;
        }
        // What the reviews isolated (before any restore time: a held DELETE is answered
        // at its pod's delete time, the restore comes later).
        let isolated: std::collections::BTreeSet<String> = pods_api
            .list(&ListParams::default().labels(DRAINING_LABEL))
            .await
            .map_err(workloads::api("list", format!("isolated pods in {ns}")))?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        cluster.step("every isolated pod back in its Services");
        wait_for("no pod isolated", cfg.phase_timeout, || async {
            pods_api
                .list(&ListParams::default().labels(DRAINING_LABEL))
                .await
                .is_ok_and(|l| l.items.is_empty())
        })
        .await?;
        wait_for(
            "every pod serving behind the load balancer",
            cfg.phase_timeout,
            || async {
                cluster
                    .lbs()
                    .registered(&service, std::time::Instant::now())
                    .len()
                    >= before.len()
            },
        )
        .await?;
        Ok::<_, Error>(isolated)
    };
    let done = tokio::select! {
        done = reviews => done,
        () = watch => unreachable!("the sampler never ends"),
    };
    let lowest = lowest.load(std::sync::atomic::Ordering::Relaxed);
    if lowest < floor {
        // The floor first: what the reviews did matters more than what was left waiting.
        let then = done
            .as_ref()
            .err()
            .map(|e| format!("; then {e}"))
            .unwrap_or_default();
        return Err(failed(format!(
            "Service {service} fell to {lowest} serving pods, below its floor of {floor}{then}"
        )));
    }
    let isolated = done?;
    // Every pod a review isolated is back in its Services (no pod carries the isolation
    // any more, checked above) and none was deleted by the webhook on a review's word.
    // A ReplicaSet replaces a pod isolated out of it and later scales the restored pod's
    // surplus down itself (its own choice of pod, confirmed on the live ReplicaSet); every
    // other controller keeps its isolated pods, so each must be the pod it was. With every
    // node cordoned the replacements cannot be scheduled, and a ReplicaSet scales down
    // unassigned pods first (`ActivePodsWithRanks.Less`, pkg/controller/controller_utils.go):
    // there too every pod must be the one it was.
    if !matches!(
        target,
        Target::Deployment | Target::Flood { .. } | Target::TwoReplicas
    ) {
        let after = serving_pods(&pods_api).await?;
        for pod in &before {
            let alive = after
                .iter()
                .any(|p| p.uid() == pod.uid() && p.metadata.deletion_timestamp.is_none());
            if !alive {
                return Err(failed(format!(
                    "pod {ns}/{} was deleted or replaced on a forged review's word",
                    pod.name_any()
                )));
            }
        }
    } else {
        cluster.wait_web_ready(web, cfg.phase_timeout).await?;
    }
    cluster.step(format!(
        "{} isolated and put back, nothing deleted; at least {lowest} of {} pods served throughout (floor {floor})",
        isolated.len(),
        before.len()
    ));
    Ok(())
}

const EVICT: &str = "/mutate/eviction?timeout=10s";
const DELETE: &str = "/validate/delete?timeout=10s";

async fn post(
    components: &Components,
    review: serde_json::Value,
    path: &str,
) -> Result<serde_json::Value, Error> {
    let answer = components.post_review(path, &review).await?;
    if answer["response"]["uid"] != review["request"]["uid"] {
        return Err(failed(format!("answered {answer}")));
    }
    Ok(answer)
}

/// An eviction review of `namespace/name`, claimed by [`VIEWER`], asking for
/// `grace` seconds if given.
fn eviction(namespace: &str, name: &str, round: usize, grace: Option<i64>) -> serde_json::Value {
    let mut review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": format!("forged-eviction-{name}-{round}"),
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction", "name": name, "namespace": namespace,
            "operation": "CREATE", "userInfo": {"username": VIEWER},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": name, "namespace": namespace}}}});
    if let Some(grace) = grace {
        review["request"]["object"]["deleteOptions"] = serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace});
    }
    review
}

/// A DELETE review of `pod` claimed by `user`, its old object the pod as `kubectl get -o
/// json` prints it.
fn deletion(pod: &Pod, user: &str) -> Result<serde_json::Value, Error> {
    let mut old = serde_json::to_value(pod).map_err(|e| failed(e.to_string()))?;
    old["apiVersion"] = "v1".into();
    old["kind"] = "Pod".into();
    let name = pod.name_any();
    Ok(
        serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": format!("forged-delete-{name}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name, "namespace": pod.namespace(), "operation": "DELETE",
            "userInfo": {"username": user}, "oldObject": old,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}}}),
    )
}

/// Starts a rolling update of the row's StatefulSet to a template whose pods never turn
/// ready, and waits until it has stalled: its controller replaced the top member, and the
/// new one is not ready (it takes nothing more down while a member is unavailable).
async fn stall_rollout(
    cluster: &RealCluster,
    web: &WebSpec,
    timeout: Duration,
) -> Result<(), Error> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use kube::api::{Patch, PatchParams};
    use kube_sim::controllers::kubelet::NEVER_READY_ANNOTATION;
    let ns = &web.namespace;
    let sets = Api::<StatefulSet>::namespaced(cluster.client(), ns);
    let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {NEVER_READY_ANNOTATION: "true"}}}}});
    sets.patch(&web.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(workloads::api("patch statefulset", web.service_key()))?;
    let top = format!("{}-{}", web.name, web.replicas - 1);
    cluster.step(format!(
        "rolling update of StatefulSet {ns}/{} to pods that never turn ready",
        web.name
    ));
    let pods = Api::<Pod>::namespaced(cluster.client(), ns);
    wait_for(
        &format!("{ns}/{top} replaced by a member that never turns ready"),
        timeout,
        || async {
            pods.get_opt(&top).await.ok().flatten().is_some_and(|p| {
                p.annotations().contains_key(NEVER_READY_ANNOTATION)
                    && p.metadata.deletion_timestamp.is_none()
                    && !kube_sim::controllers::pod_ready(&p)
            })
        },
    )
    .await?;
    cluster.step(format!("the rollout stalled on {ns}/{top}"));
    Ok(())
}

/// The namespace's pods that are ready and not being deleted, by name.
async fn serving_pods(pods: &Api<Pod>) -> Result<Vec<Pod>, Error> {
    let mut list: Vec<Pod> = pods
        .list(&ListParams::default())
        .await
        .map_err(workloads::api("list", "pods".into()))?
        .items
        .into_iter()
        .filter(|p| kube_sim::controllers::pod_ready(p) && p.metadata.deletion_timestamp.is_none())
        .collect();
    list.sort_by_key(ResourceExt::name_any);
    Ok(list)
}

/// `web.replicas` pods with no controller, labelled as the Service of `web` selects, and
/// the Service; waits until every pod serves behind the load balancer.
async fn deploy_bare_pods(
    cluster: &RealCluster,
    web: &WebSpec,
    timeout: Duration,
) -> Result<(), Error> {
    let ns = &web.namespace;
    Api::<Service>::namespaced(cluster.client(), ns)
        .create(&PostParams::default(), &web.service())
        .await
        .map_err(workloads::api("create service", web.service_key()))?;
    let template = web
        .deployment()
        .spec
        .map(|s| s.template)
        .unwrap_or_default();
    // The ServiceAccount controller creates `default` in a new namespace a moment later,
    // and the API server refuses a pod without its ServiceAccount.
    let accounts =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(cluster.client(), ns);
    wait_for("ServiceAccount default", timeout, || async {
        accounts.get_opt("default").await.is_ok_and(|a| a.is_some())
    })
    .await?;
    let pods = Api::<Pod>::namespaced(cluster.client(), ns);
    for i in 0..web.replicas {
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{}-{i}", web.name)),
                namespace: Some(ns.clone()),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                ..Default::default()
            },
            spec: template.spec.clone(),
            status: None,
        };
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(workloads::api(
                "create pod",
                format!("{ns}/{}-{i}", web.name),
            ))?;
    }
    let expected = usize::try_from(web.replicas).unwrap_or(0);
    wait_for("bare pods serving", timeout, || async {
        cluster
            .lbs()
            .registered(&web.service_key(), std::time::Instant::now())
            .len()
            == expected
    })
    .await?;
    Ok(())
}

async fn delete_pdb(cluster: &RealCluster, web: &WebSpec) -> Result<(), Error> {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    Api::<PodDisruptionBudget>::namespaced(cluster.client(), &web.namespace)
        .delete(&web.name, &Default::default())
        .await
        .map(|_| ())
        .map_err(workloads::api("delete pdb", web.service_key()))
}

fn failed(reason: String) -> Error {
    Error::Component {
        name: "forged review".into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor a row checks: the PDB's minAvailable where a PDB bounds the reviews,
    /// else half the pods (never none).
    #[test]
    fn the_floor_is_the_budget_or_the_unconfirmed_share() {
        assert_eq!(floor(Target::StatefulSet, 6, 5), 5);
        assert_eq!(floor(Target::Flood { pdb: true }, 6, 5), 5);
        assert_eq!(floor(Target::Flood { pdb: false }, 6, 5), 3);
        assert_eq!(floor(Target::BarePods, 3, 2), 1);
        assert_eq!(floor(Target::BarePods, 1, 0), 1);
        assert_eq!(floor(Target::Cordoned, 4, 3), 2);
    }
}
