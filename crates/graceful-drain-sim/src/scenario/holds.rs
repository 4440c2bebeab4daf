//! The holds benchmark, on a real control plane: how fast kube-controller-manager's
//! ReplicaSet, StatefulSet and DaemonSet controllers create pods while the webhook holds
//! DELETEs. It prints a table; it asserts nothing.
//!
//! Two phases, each in a namespace of its own, with graceful-drain running:
//! * **idle**: nothing is held;
//! * **busy**: rolling restarts of [`STATEFULSETS`] StatefulSets and [`DAEMONSETS`]
//!   DaemonSets whose pods serve behind a Service — more than kube-controller-manager has
//!   workers for them (`--concurrent-statefulset-syncs` 5, `--concurrent-daemonset-syncs`
//!   2): the webhook isolates each pod their controllers delete and holds the DELETE for
//!   up to its timeout, and the worker that sent it waits — plus [`PEOPLE`] DELETEs of
//!   serving bare pods sent by a person, held beside them.
//!
//! In each phase three probes start together once the holds are in flight: a Deployment
//! of [`PROBE_REPLICAS`] (the ReplicaSet controller, whose own DELETEs are refused, never
//! held), a StatefulSet of [`PROBE_REPLICAS`] with `Parallel` pod management, and a
//! DaemonSet on every node. Each is timed from its creation until its controller has
//! created all of its pods.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ContainerPort, Pod, Service, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::components::Components;
use super::spec::Workload;
use super::workloads::api;
use super::{Error, ScenarioConfig};
use graceful_drain_core::labels::DRAINING_LABEL;
use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{DataPlane, RealCluster, WebSpec, wait_for};

/// StatefulSets restarted in the busy phase: one more than the controller's workers.
pub const STATEFULSETS: usize = 6;
/// DaemonSets restarted in the busy phase: one more than the controller's workers.
pub const DAEMONSETS: usize = 3;
/// Bare serving pods a person deletes in the busy phase.
pub const PEOPLE: usize = 10;
/// Pods of the Deployment and StatefulSet probes.
pub const PROBE_REPLICAS: i32 = 10;

/// One probe's figures.
#[derive(Debug, Clone)]
pub struct Row {
    /// The controller that creates the probe's pods.
    pub controller: &'static str,
    /// What was created.
    pub probe: String,
    /// From creation to every pod created, with nothing held.
    pub idle: Duration,
    /// The same, with the busy phase's DELETEs held.
    pub busy: Duration,
}

/// What the benchmark measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// One row per probe: Deployment, StatefulSet, DaemonSet.
    pub rows: Vec<Row>,
    /// Pods isolated (their DELETE held) when the busy phase's probes started.
    pub held_at_start: usize,
}

/// Attaches to the API server of `kubeconfig`, starts graceful-drain under the chart's
/// RBAC and runs both phases.
pub async fn run(
    kubeconfig: &std::path::Path,
    cfg: &ScenarioConfig,
    shutdown: &Shutdown,
) -> Result<Report, Error> {
    let cluster = crate::setup::attach(cfg.cluster.clone(), kubeconfig, shutdown.clone()).await?;
    super::real::apply_chart_rbac(&cluster).await?;
    let mut components = Components::start(&cluster, &cfg.components).await?;
    let idle = phase(&cluster, cfg, "holds-idle", false).await;
    let busy = match &idle {
        Ok(_) => phase(&cluster, cfg, "holds-busy", true).await,
        Err(_) => Ok((Vec::new(), 0)),
    };
    components.remove_configurations(&cluster).await?;
    components.check().await?;
    let (idle, _) = idle?;
    let (busy, held_at_start) = busy?;
    let rows = idle
        .into_iter()
        .zip(busy)
        .map(|((controller, probe, idle), (_, _, busy))| Row {
            controller,
            probe,
            idle,
            busy,
        })
        .collect();
    Ok(Report {
        rows,
        held_at_start,
    })
}

/// One probe's result: controller, probe, time.
type Timed = (&'static str, String, Duration);

/// One phase in namespace `ns`: with `busy`, the held DELETEs first; then the probes.
async fn phase(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    ns: &str,
    busy: bool,
) -> Result<(Vec<Timed>, usize), Error> {
    cluster.ensure_namespace(ns).await?;
    let outcome = async {
        // No pod can be created before kube-controller-manager gives the namespace its
        // `default` ServiceAccount: timing that would time the wrong controller.
        let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client(), ns);
        wait_for(
            "the namespace's default ServiceAccount",
            cfg.phase_timeout,
            || async { accounts.get_opt("default").await.is_ok_and(|a| a.is_some()) },
        )
        .await?;
        let held = if busy {
            hold_deletes(cluster, cfg, ns).await?
        } else {
            0
        };
        eprintln!("holds: {ns}: {held} pods isolated, their DELETEs held; probes start");
        let timeout = cfg.phase_timeout;
        let nodes = cluster.nodes().len();
        let (rs, sts, ds) = tokio::join!(
            probe(
                cluster,
                ns,
                "probe-deploy",
                PROBE_REPLICAS as usize,
                timeout,
                || { create_deployment(cluster, ns) }
            ),
            probe(
                cluster,
                ns,
                "probe-sts",
                PROBE_REPLICAS as usize,
                timeout,
                || { create_statefulset(cluster, ns) }
            ),
            probe(
                cluster,
                ns,
                "probe-ds",
                nodes,
                timeout,
                || create_daemonset(cluster, ns)
            ),
        );
        let rows = vec![
            ("ReplicaSet", format!("Deployment of {PROBE_REPLICAS}"), rs?),
            (
                "StatefulSet",
                format!("StatefulSet of {PROBE_REPLICAS} (Parallel)"),
                sts?,
            ),
            ("DaemonSet", format!("DaemonSet on {nodes} nodes"), ds?),
        ];
        Ok((rows, held))
    }
    .await;
    super::workloads::delete_namespace(cluster, ns).await;
    outcome
}

/// Deploys the busy phase's StatefulSets, DaemonSets and bare pods (all serving), then
/// restarts the workloads and deletes the bare pods as a person would, without waiting;
/// returns once the webhook has isolated pods of each kind, with how many it isolated.
async fn hold_deletes(
    cluster: &RealCluster,
    cfg: &ScenarioConfig,
    ns: &str,
) -> Result<usize, Error> {
    let client = cluster.client();
    let timeout = cfg.phase_timeout;
    let spec = |name: String, replicas: i32| WebSpec {
        name,
        namespace: ns.to_string(),
        replicas,
        min_available: 1,
        ..cfg.web.clone()
    };
    for i in 0..STATEFULSETS {
        let web = spec(format!("sts-{i}"), 2);
        super::workloads::deploy(cluster, &web, timeout, Workload::StatefulSet).await?;
    }
    for i in 0..DAEMONSETS {
        let web = spec(format!("ds-{i}"), 1);
        super::workloads::deploy(cluster, &web, timeout, Workload::DaemonSet).await?;
    }
    let people = spec("bare".to_string(), 1);
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &people.service())
        .await
        .map_err(api("create", format!("service {}", people.service_key())))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut bare: Pod = from_json(template("bare"))?;
    if let Some(container) = bare.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        container.ports = Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..ContainerPort::default()
        }]);
    }
    for i in 0..PEOPLE {
        bare.metadata.name = Some(format!("bare-{i}"));
        pods.create(&PostParams::default(), &bare)
            .await
            .map_err(api("create", format!("pod {ns}/bare-{i}")))?;
    }
    wait_for("the bare pods serving", timeout, || async {
        let now = std::time::Instant::now();
        cluster.lbs().registered(&people.service_key(), now).len() == PEOPLE
    })
    .await?;
    let now = jiff::Timestamp::now().to_string();
    let restart = json!({"spec": {"template": {"metadata": {"annotations": {
        "kubectl.kubernetes.io/restartedAt": now}}}}});
    let params = PatchParams::default();
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    for i in 0..STATEFULSETS {
        statefulsets
            .patch(&format!("sts-{i}"), &params, &Patch::Merge(&restart))
            .await
            .map_err(api("restart", format!("statefulset {ns}/sts-{i}")))?;
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    for i in 0..DAEMONSETS {
        daemonsets
            .patch(&format!("ds-{i}"), &params, &Patch::Merge(&restart))
            .await
            .map_err(api("restart", format!("daemonset {ns}/ds-{i}")))?;
    }
    let bare: Vec<String> = pods
        .list(&ListParams::default().labels(&format!("app={}", people.name)))
        .await
        .map_err(api("list", format!("pods in {ns}")))?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    for name in bare {
        let pods = pods.clone();
        // A person's `kubectl delete pod --wait=false`: held by the webhook, answered later.
        tokio::spawn(async move { pods.delete(&name, &DeleteParams::default()).await });
    }
    let isolated = ListParams::default().labels(DRAINING_LABEL);
    let held = std::sync::atomic::AtomicUsize::new(0);
    wait_for("held DELETEs of every kind", timeout, || async {
        let Ok(list) = pods.list(&isolated).await else {
            return false;
        };
        let kinds = |prefix: &str| {
            list.items
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(prefix))
                })
                .count()
        };
        held.store(list.items.len(), std::sync::atomic::Ordering::Relaxed);
        kinds("sts-") >= STATEFULSETS.min(5)
            && kinds("ds-") >= DAEMONSETS.min(2)
            && kinds("bare-") >= 1
    })
    .await?;
    Ok(held.into_inner())
}

/// Times `create` until the namespace holds `pods` pods labelled `app=name`.
async fn probe<F, Fut>(
    cluster: &DataPlane,
    ns: &str,
    name: &str,
    pods: usize,
    timeout: Duration,
    create: F,
) -> Result<Duration, Error>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let api: Api<Pod> = Api::namespaced(cluster.client(), ns);
    let selector = ListParams::default().labels(&format!("app={name}"));
    let started = Instant::now();
    create().await?;
    wait_for(
        &format!("{pods} pods of {ns}/{name} created"),
        timeout,
        || async {
            api.list(&selector)
                .await
                .is_ok_and(|l| l.items.len() >= pods)
        },
    )
    .await?;
    Ok(started.elapsed())
}

/// The probes' pod template: one container, labelled `app=name`.
fn template(name: &str) -> serde_json::Value {
    json!({"metadata": {"labels": {"app": name}},
           "spec": {"terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "web", "image": "sim/web:1"}]}})
}

/// Creates the probe named `name` in `ns`: its kind's `spec` around [`template`].
async fn create_probe<K>(
    cluster: &DataPlane,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> Result<(), Error>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned,
{
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": name}});
    spec["template"] = template(name);
    let object: K = from_json(json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}))?;
    let kind = K::kind(&()).to_lowercase();
    Api::<K>::namespaced(cluster.client(), ns)
        .create(&PostParams::default(), &object)
        .await
        .map_err(api("create", format!("{kind} {ns}/{name}")))?;
    Ok(())
}

async fn create_deployment(cluster: &DataPlane, ns: &str) -> Result<(), Error> {
    let spec = json!({"replicas": PROBE_REPLICAS});
    create_probe::<Deployment>(cluster, ns, "probe-deploy", spec).await
}

async fn create_statefulset(cluster: &DataPlane, ns: &str) -> Result<(), Error> {
    let spec = json!({"replicas": PROBE_REPLICAS, "podManagementPolicy": "Parallel",
                      "serviceName": "probe-sts"});
    create_probe::<StatefulSet>(cluster, ns, "probe-sts", spec).await
}

async fn create_daemonset(cluster: &DataPlane, ns: &str) -> Result<(), Error> {
    create_probe::<DaemonSet>(cluster, ns, "probe-ds", json!({})).await
}

fn from_json<T: k8s_openapi::serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, Error> {
    serde_json::from_value(value).map_err(|e| Error::Component {
        name: "holds benchmark".into(),
        reason: e.to_string(),
    })
}

/// The report as a table.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "{:<12} {:<30} {:>10} {:>16}\n",
        "controller", "probe", "idle", "busy"
    );
    for row in &report.rows {
        out.push_str(&format!(
            "{:<12} {:<30} {:>9.2}s {:>15.2}s\n",
            row.controller,
            row.probe,
            row.idle.as_secs_f64(),
            row.busy.as_secs_f64()
        ));
    }
    out.push_str(&format!(
        "busy: {} pods isolated with their DELETEs held when the probes started \
         ({STATEFULSETS} StatefulSets and {DAEMONSETS} DaemonSets restarting, {PEOPLE} bare pods deleted by a person)\n",
        report.held_at_start
    ));
    out
}
