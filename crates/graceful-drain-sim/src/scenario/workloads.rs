//! The workloads of the scenario matrix besides the standard Deployment: a StatefulSet
//! and a DaemonSet behind a LoadBalancer Service, created through the API like a user
//! would, plus their rollouts (a template change, as `kubectl rollout restart` does).
//!
//! Every workload is named after `cfg.web` (its Service, PDB and `app` label), so the
//! traffic, the load balancer and the node choice of a scenario work alike for all.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

use super::spec::Workload;
use super::{Error, ScenarioConfig};
use kube_sim::cluster::{DataPlane, WebSpec, wait_for};
use kube_sim::fixtures::{DaemonSetFixture, StatefulSetFixture, daemon_set, stateful_set};

/// The label the Services of these workloads select besides `app`: a key the controller
/// does not select on, so the webhook can leave the Service and keep the controller.
const ROLE: (&str, &str) = ("role", "serving");

/// The label the Deployment controller sets on the pods of each ReplicaSet.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Maps a failed API call on `object` to the scenario error saying what was tried.
pub(super) fn api(action: &'static str, object: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api {
        action,
        object,
        source,
    }
}

/// Creates the workload named after `web`, its Service and PDB, and waits (up to
/// `timeout`) until every pod serves behind the load balancer.
pub async fn deploy(
    cluster: &DataPlane,
    web: &WebSpec,
    timeout: Duration,
    workload: Workload,
) -> Result<(), Error> {
    if matches!(
        workload,
        Workload::Deployment | Workload::DeploymentWithTiers
    ) {
        return Ok(cluster.deploy_web(web, timeout).await?);
    }
    if workload == Workload::DeploymentRecreate {
        cluster.deploy_web(web, timeout).await?;
        return set_recreate(&cluster.client(), web).await;
    }
    if workload == Workload::DeploymentWithJob {
        cluster.deploy_web(web, timeout).await?;
        return start_job(cluster, web).await;
    }
    let client = cluster.client();
    let ns = &web.namespace;
    let app = [("app", web.name.as_str())];
    if matches!(
        workload,
        Workload::StatefulSet | Workload::StatefulSetSharedSelector
    ) {
        create_governing_service(cluster, web).await?;
    }
    let mut service = web.service();
    if workload != Workload::StatefulSetSharedSelector
        && let Some(selector) = service.spec.as_mut().and_then(|s| s.selector.as_mut())
    {
        selector.insert(ROLE.0.into(), ROLE.1.into());
    }
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &service)
        .await
        .map_err(api("create service", web.service_key()))?;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &web.pdb())
        .await
        .map_err(api("create pdb", web.service_key()))?;
    let expected = match workload {
        Workload::DaemonSet => {
            let mut ds = daemon_set(&web.name)
                .ns(ns)
                .selecting(&app)
                .rolling(IntOrString::Int(1), IntOrString::Int(0))
                .container("sim/web:1");
            let template = &mut ds.spec.get_or_insert_with(Default::default).template;
            template_extras(template, web.grace_period_seconds);
            ds.metadata.uid = None;
            Api::<DaemonSet>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &ds)
                .await
                .map_err(api("create daemonset", web.service_key()))?;
            cluster.nodes().len()
        }
        _ => {
            let mut sts = stateful_set(&web.name)
                .ns(ns)
                .replicas(web.replicas)
                .selecting(&app)
                .parallel()
                .container("sim/web:1");
            let template = &mut sts.spec.get_or_insert_with(Default::default).template;
            template_extras(template, web.grace_period_seconds);
            sts.metadata.uid = None;
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &sts)
                .await
                .map_err(api("create statefulset", web.service_key()))?;
            usize::try_from(web.replicas).unwrap_or(0)
        }
    };
    let what = format!(
        "{workload:?} {} serving behind its load balancer",
        web.service_key()
    );
    wait_for(&what, timeout, || async {
        let now = std::time::Instant::now();
        cluster.lbs().registered(&web.service_key(), now).len() == expected
    })
    .await?;
    Ok(())
}

/// The StatefulSet's governing Service `<name>-headless`: headless, selecting exactly the
/// StatefulSet's own label, as typical StatefulSet manifests do (`serviceName` of the
/// StatefulSet). The load balancer's Service keeps the workload's name.
async fn create_governing_service(cluster: &DataPlane, web: &WebSpec) -> Result<(), Error> {
    use k8s_openapi::api::core::v1::ServiceSpec;
    let headless = Service {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{}-headless", web.name)),
            namespace: Some(web.namespace.clone()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some([("app".to_string(), web.name.clone())].into()),
            ..Default::default()
        }),
        status: None,
    };
    Api::<Service>::namespaced(cluster.client(), &web.namespace)
        .create(&PostParams::default(), &headless)
        .await
        .map(|_| ())
        .map_err(api(
            "create",
            format!("service {}/{}-headless", web.namespace, web.name),
        ))
}

/// Switches the Deployment named after `spec` to the Recreate strategy.
pub async fn set_recreate(client: &kube::Client, spec: &WebSpec) -> Result<(), Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &spec.namespace);
    let patch =
        serde_json::json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": null}}});
    deployments
        .patch(&spec.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(api(
            "set the Recreate strategy of",
            format!("deployment {}", spec.service_key()),
        ))
}

/// Resolves (with an error) as soon as pods of two ReplicaSets serve at once in
/// `namespace` — what a Recreate rollout promises never happens; runs until dropped.
pub async fn never_together(client: &kube::Client, namespace: &str) -> Error {
    // Sampling period: far shorter than a pod's start (500 ms) or its exit (1 s).
    const SAMPLE: Duration = Duration::from_millis(100);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            let serving: BTreeSet<&String> = list
                .items
                .iter()
                .filter(|p| kube_sim::controllers::pod_ready(p))
                .filter_map(|p| p.labels().get(POD_TEMPLATE_HASH))
                .collect();
            if serving.len() > 1 {
                return Error::Drain {
                    node: "-".into(),
                    reason: format!(
                        "Recreate rollout in {namespace}: pods of {serving:?} served together"
                    ),
                };
            }
        }
        tokio::time::sleep(SAMPLE).await;
    }
}

/// The pods' `role` label, an HTTP port and the grace period.
fn template_extras(template: &mut k8s_openapi::api::core::v1::PodTemplateSpec, grace: i64) {
    let meta = template.metadata.get_or_insert_with(Default::default);
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(ROLE.0.into(), ROLE.1.into());
    let spec = template.spec.get_or_insert_with(Default::default);
    spec.termination_grace_period_seconds = Some(grace);
    for container in &mut spec.containers {
        container.ports = Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..Default::default()
        }]);
    }
}

/// Restarts the workload's pods by changing its template, as `kubectl rollout restart`
/// does, and waits until its controller reports every pod updated and ready.
pub async fn rollout(
    cluster: &DataPlane,
    cfg: &ScenarioConfig,
    workload: Workload,
) -> Result<(), Error> {
    let web = &cfg.web;
    let client = cluster.client();
    let now = jiff::Timestamp::now().to_string();
    let patch = Patch::Merge(serde_json::json!({"spec": {"template": {"metadata": {
        "annotations": {"kubectl.kubernetes.io/restartedAt": now}}}}}));
    let params = PatchParams::default();
    let object = web.service_key();
    let what = format!("rollout of {workload:?} {object}");
    match workload {
        Workload::Deployment => {
            return crate::scenario::actions::rollout(&client, web, cfg.phase_timeout).await;
        }
        Workload::DaemonSet => {
            let sets: Api<DaemonSet> = Api::namespaced(client, &web.namespace);
            sets.patch(&web.name, &params, &patch)
                .await
                .map_err(api("restart daemonset", object))?;
            wait_for(&what, cfg.phase_timeout, || async {
                sets.get(&web.name).await.is_ok_and(|ds| {
                    let generation = ds.metadata.generation;
                    ds.status.is_some_and(|s| {
                        s.observed_generation == generation
                            && s.updated_number_scheduled == Some(s.desired_number_scheduled)
                            && s.number_ready == s.desired_number_scheduled
                            && s.number_available == Some(s.desired_number_scheduled)
                    })
                })
            })
            .await?;
        }
        Workload::DeploymentWithJob | Workload::DeploymentWithTiers => {
            return crate::scenario::actions::rollout(&client, web, cfg.phase_timeout).await;
        }
        Workload::DeploymentRecreate => {
            // The promise of Recreate: old and new pods never serve together.
            let overlap = never_together(&client, &web.namespace);
            return tokio::select! {
                done = crate::scenario::actions::rollout(&client, web, cfg.phase_timeout) => done,
                seen = overlap => Err(seen),
            };
        }
        _ => {
            let sets: Api<StatefulSet> = Api::namespaced(client, &web.namespace);
            sets.patch(&web.name, &params, &patch)
                .await
                .map_err(api("restart statefulset", object))?;
            wait_for(&what, cfg.phase_timeout, || async {
                sets.get(&web.name).await.is_ok_and(|sts| {
                    let generation = sts.metadata.generation;
                    sts.status.is_some_and(|s| {
                        s.observed_generation == generation
                            && s.updated_replicas == Some(web.replicas)
                            && s.ready_replicas == Some(web.replicas)
                            && s.current_revision.is_some()
                            && s.current_revision == s.update_revision
                    })
                })
            })
            .await?;
        }
    }
    Ok(())
}

/// Name of the batch Job of [`Workload::DeploymentWithJob`].
const JOB: &str = "batch";
/// Its pods run this long, so a drain meets them running.
const JOB_RUN_FOR: &str = "8s";
/// Pods of the Job per node: enough that the drained node runs some.
const JOB_PODS_PER_NODE: usize = 2;

/// Starts the Job of [`Workload::DeploymentWithJob`]: [`JOB_PODS_PER_NODE`] parallel pods
/// per node, `backoffLimit: 0` (one counted failure fails it) and a podFailurePolicy that
/// ignores disruptions, as batch users configure to survive drains.
async fn start_job(cluster: &DataPlane, web: &WebSpec) -> Result<(), Error> {
    use kube_sim::fixtures::{JobFixture, job, on_pod_condition};
    let pods = i32::try_from(cluster.nodes().len() * JOB_PODS_PER_NODE).unwrap_or(i32::MAX);
    let mut batch = job(JOB)
        .ns(&web.namespace)
        .completions(Some(pods))
        .parallelism(pods)
        .backoff_limit(0)
        .failure_rule(on_pod_condition("Ignore", "DisruptionTarget"))
        .template_annotation(
            kube_sim::controllers::kubelet::RUN_FOR_ANNOTATION,
            JOB_RUN_FOR,
        )
        .container("sim/batch:1");
    batch.metadata.uid = None;
    Api::<Job>::namespaced(cluster.client(), &web.namespace)
        .create(&PostParams::default(), &batch)
        .await
        .map_err(api("create job", format!("{}/{JOB}", web.namespace)))?;
    Ok(())
}

/// The condition (`Complete` or `Failed`) a Job finished with, if it did.
fn finished(job: &Job) -> Option<String> {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.clone());
    conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.status == "True" && (c.type_ == "Complete" || c.type_ == "Failed"))
        .map(|c| c.type_)
}

/// Waits until the Job finished, and fails if it failed or counted a failure: a drain
/// must not cost a batch job its completion.
pub async fn job_completed(
    cluster: &DataPlane,
    web: &WebSpec,
    timeout: Duration,
) -> Result<(), Error> {
    let jobs: Api<Job> = Api::namespaced(cluster.client(), &web.namespace);
    let what = format!("job {}/{JOB} finished", web.namespace);
    wait_for(&what, timeout, || async {
        jobs.get(JOB).await.is_ok_and(|j| finished(&j).is_some())
    })
    .await?;
    let job = jobs
        .get(JOB)
        .await
        .map_err(api("get job", format!("{}/{JOB}", web.namespace)))?;
    let failed = job.status.as_ref().and_then(|s| s.failed).unwrap_or(0);
    match finished(&job).as_deref() {
        Some("Complete") if failed == 0 => Ok(()),
        outcome => Err(Error::Drain {
            node: "-".into(),
            reason: format!(
                "job {}/{JOB} ended {outcome:?} with {failed} counted failures",
                web.namespace
            ),
        }),
    }
}

/// Deletes a row's namespace and waits (bounded) until its pods are gone, so the next
/// row's traffic and drains see only their own pods.
pub async fn delete_namespace(cluster: &DataPlane, name: &str) {
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(cluster.client())
        .delete(name, &kube::api::DeleteParams::default())
        .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), name);
    let _ = wait_for(
        &format!("namespace {name} emptied"),
        Duration::from_secs(60),
        || async {
            pods.list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
        },
    )
    .await;
}
