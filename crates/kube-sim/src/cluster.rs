//! A simulated cluster: the in-process API server plus the controllers, one kubelet per
//! node, the load-balancer model and the app registry, all wired together and owned by
//! one shutdown token. [`DataPlane::deploy_web`] installs the standard workload (a
//! Deployment behind a LoadBalancer Service with a PodDisruptionBudget) and waits until
//! it serves; [`DataPlane::traffic`] sends requests through its load balancer.
//!
//! What a control plane lacks — kubelets, load balancers, apps and traffic — is the
//! [`DataPlane`]. [`Cluster`] runs it against the simulated API server with kube-sim's own
//! controllers and scheduler; [`RealCluster`] runs it against any API server named by a
//! kubeconfig (the real control plane of the real test tier), whose own controllers,
//! scheduler and admission do the rest.

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Deref;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, Pod, PodSpec, PodTemplateSpec, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use super::apiserver::{self, ApiServer, NOT_READY_TAINT};
use super::controllers::{self, kubelet, users};
use super::lb::{self, LbConfig, LbModel, LoadBalancers};
use super::podnet::PodNet;
use super::task::spawn_owned;
use super::traffic::apps::{Apps, Behaviour};
use super::traffic::clients::Clients;
use super::traffic::timeline::{EventKind, Timeline};
use super::traffic::{Target, Traffic, TrafficConfig};
use tokio_util::sync::CancellationToken;

/// Errors of the simulated cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server did not start.
    #[error("start simulated API server")]
    ApiServer(#[source] apiserver::Error),
    /// An API call made while setting up failed.
    #[error("{action} {object}")]
    Api {
        /// What was being done, as a verb phrase (`create`, `register`, `read`, ...).
        action: &'static str,
        /// The object it was done to (`node worker-1`; just `ns/name` when the action
        /// names the kind, as in `create service`).
        object: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A condition was not reached in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// The condition that was awaited.
        what: String,
        /// How long it was awaited.
        after: Duration,
    },
    /// The kubeconfig of a real API server could not be read or used.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The kubeconfig's path.
        path: String,
        /// Why it could not be read or turned into a client.
        reason: String,
    },
    /// KWOK could not run the nodes.
    #[error("kwok: {0}")]
    Kwok(String),
    /// The pods' real listeners could not be set up.
    #[error("pod network")]
    PodNet(#[source] crate::podnet::Error),
    /// A component's credentials could not be made.
    #[error("credentials for {user}: {reason}")]
    Credentials {
        /// The user the credentials were for.
        user: String,
        /// What went wrong making or writing them.
        reason: String,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn api_err(action: &'static str, object: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let object = object.into();
    move |source| Error::Api {
        action,
        object,
        source,
    }
}

/// Shape and timings of a simulated cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Number of worker nodes (`worker-1` ... `worker-N`).
    pub nodes: usize,
    /// Container timings.
    pub kubelet: kubelet::KubeletConfig,
    /// Load-balancer lags.
    pub lb: LbConfig,
    /// Load-balancer kinds: the default kind, the ALB's nodes, jitter and latency.
    pub lb_model: LbModel,
    /// What apps do with SIGTERM, unless their pod's annotation says otherwise.
    pub app: Behaviour,
    /// API server settings.
    pub api: apiserver::Config,
    /// How long the disruption controller counts a pod listed in a PDB's
    /// `disruptedPods` as disrupted without it being deleted (upstream: 2 minutes).
    pub disruption_timeout: Duration,
    /// ReplicaSets synced at once (upstream `--concurrent-replicaset-syncs`, 5).
    pub replicaset_workers: usize,
    /// Pods each kubelet reports it holds (`status.allocatable.pods`; the kubelet's
    /// `--max-pods`, 110 by default), which the scheduler never exceeds.
    pub max_pods: usize,
    /// CustomResourceDefinitions created once the cluster runs (an existing one is left
    /// as it is); none by default.
    pub crds: Vec<CustomResourceDefinition>,
    /// A label that isolates a pod: when a kubelet first sees it on one of its pods, the
    /// timeline records the pod as [`EventKind::Isolated`]. `None` (the default) records
    /// no isolation.
    pub isolation_label: Option<String>,
    /// A KWOK binary: [`RealCluster::attach`] then hands its nodes and pods to KWOK
    /// ([`crate::kwok`]) instead of writing their status itself. The simulated cluster
    /// ignores it. `None` (the default) keeps the simulated kubelets' own API calls.
    pub kwok: Option<std::path::PathBuf>,
    /// Pods as real HTTP servers ([`crate::podnet`]): with a port, every pod listens on
    /// the loopback twin of its IP at that port while its app accepts (pod `10.64.1.2`
    /// on `127.64.1.2:port`; see [`crate::podnet::loopback_twin`]), so a real load
    /// balancer can route to it. `Some(0)` picks a port free at start
    /// ([`DataPlane::pod_net`] tells it), which clusters running side by side need: every
    /// KWOK hands out the same addresses. `None` (the default): apps are reached
    /// in-process only.
    pub pod_port: Option<u16>,
}

/// The kubelet's default `--max-pods`.
pub const DEFAULT_MAX_PODS: usize = 110;

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            nodes: 3,
            kubelet: kubelet::KubeletConfig {
                start_delay: Duration::from_millis(500),
                accept_after_sigterm: Duration::ZERO,
                exit_after_sigterm: Duration::from_secs(1),
            },
            lb: LbConfig {
                registration_lag: Duration::from_millis(500),
                deregistration_lag: Duration::from_secs(3),
            },
            lb_model: LbModel::default(),
            app: Behaviour::default(),
            api: apiserver::Config::default(),
            disruption_timeout: controllers::disruption::DELETION_TIMEOUT,
            replicaset_workers: controllers::replicaset::DEFAULT_WORKERS,
            max_pods: DEFAULT_MAX_PODS,
            crds: Vec::new(),
            isolation_label: None,
            kwok: None,
            pod_port: None,
        }
    }
}

/// The standard workload: a Deployment behind a LoadBalancer Service, with a PDB.
#[derive(Clone, Debug)]
pub struct WebSpec {
    /// Namespace of all three objects; it must exist.
    pub namespace: String,
    /// Name of the Deployment, Service and PDB; also the `app` label.
    pub name: String,
    /// The Deployment's replicas.
    pub replicas: i32,
    /// The PDB's minAvailable.
    pub min_available: i32,
    /// terminationGracePeriodSeconds of the pods.
    pub grace_period_seconds: i64,
    /// The Deployment's rolling-update `maxSurge` (a count or a percentage).
    pub max_surge: IntOrString,
    /// The Deployment's rolling-update `maxUnavailable` (a count or a percentage).
    pub max_unavailable: IntOrString,
    /// The pods' nodeSelector (none by default).
    pub node_selector: BTreeMap<String, String>,
    /// The CPU each pod requests (`1`, `500m`), which a node autoscaler packs nodes by;
    /// none by default.
    pub cpu_request: Option<String>,
    /// Annotations of the pod template (none by default).
    pub pod_annotations: BTreeMap<String, String>,
}

impl Default for WebSpec {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            name: "web".into(),
            replicas: 4,
            min_available: 3,
            grace_period_seconds: 30,
            max_surge: IntOrString::Int(1),
            max_unavailable: IntOrString::Int(0),
            node_selector: BTreeMap::new(),
            cpu_request: None,
            pod_annotations: BTreeMap::new(),
        }
    }
}

impl WebSpec {
    /// `ns/name` of the Service, the key of its load balancer.
    pub fn service_key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The Deployment.
    pub fn deployment(&self) -> Deployment {
        let labels: BTreeMap<String, String> = [("app".to_string(), self.name.clone())].into();
        let container = Container {
            name: "web".into(),
            image: Some("sim/web:1".into()),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            resources: self.cpu_request.as_ref().map(|cpu| {
                k8s_openapi::api::core::v1::ResourceRequirements {
                    requests: Some([("cpu".to_string(), Quantity(cpu.clone()))].into()),
                    ..Default::default()
                }
            }),
            ..Default::default()
        };
        Deployment {
            metadata: self.meta(),
            spec: Some(DeploymentSpec {
                replicas: Some(self.replicas),
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..Default::default()
                },
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(self.max_surge.clone()),
                        max_unavailable: Some(self.max_unavailable.clone()),
                    }),
                }),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        annotations: (!self.pod_annotations.is_empty())
                            .then(|| self.pod_annotations.clone()),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![container],
                        termination_grace_period_seconds: Some(self.grace_period_seconds),
                        node_selector: (!self.node_selector.is_empty())
                            .then(|| self.node_selector.clone()),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        }
    }

    /// The LoadBalancer Service.
    pub fn service(&self) -> Service {
        Service {
            metadata: self.meta(),
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                selector: Some([("app".to_string(), self.name.clone())].into()),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    target_port: Some(IntOrString::String("http".into())),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// The PodDisruptionBudget.
    pub fn pdb(&self) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: self.meta(),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(self.min_available)),
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), self.name.clone())].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            labels: Some([("app".to_string(), self.name.clone())].into()),
            ..Default::default()
        }
    }
}

/// What a control plane lacks: the nodes' kubelets, the apps they run, the load balancers
/// in front of the Services and the timeline of a run. Dropping it stops them.
pub struct DataPlane {
    client: kube::Client,
    apps: Apps,
    pod_net: Option<PodNet>,
    lbs: LoadBalancers,
    timeline: Timeline,
    nodes: Vec<String>,
    shutdown: CancellationToken,
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A running simulated cluster: the simulated API server with kube-sim's controllers and
/// scheduler, plus the [`DataPlane`]. Dropping it stops everything it started.
pub struct Cluster {
    plane: DataPlane,
    api: ApiServer,
}

impl Deref for Cluster {
    type Target = DataPlane;
    fn deref(&self) -> &DataPlane {
        &self.plane
    }
}

impl Cluster {
    /// Starts the API server, registers the nodes and starts every controller, kubelet
    /// and the load balancers. Stops when `shutdown` is cancelled or the cluster dropped.
    pub async fn start(cfg: ClusterConfig, shutdown: CancellationToken) -> Result<Cluster> {
        let shutdown = shutdown.child_token();
        let api = ApiServer::start(cfg.api.clone(), shutdown.clone())
            .await
            .map_err(Error::ApiServer)?;
        let nodes: Vec<String> = (1..=cfg.nodes).map(|i| format!("worker-{i}")).collect();
        // Each kubelet registers its Node and reports it Ready; the node lifecycle
        // controller (here: its identity) then lifts the not-ready taint admission put on it.
        let lifecycle = api.retrying_client(users::NODE_LIFECYCLE_CONTROLLER);
        for node in &nodes {
            let kubelet = api.retrying_client(&users::kubelet(node));
            register_and_report(&kubelet, &lifecycle, node, cfg.max_pods).await?;
        }
        let kubelets = nodes
            .iter()
            .map(|n| (n.clone(), api.retrying_client(&users::kubelet(n))))
            .collect();
        let lb_client = api.retrying_client(users::SERVICE_CONTROLLER);
        let plane = DataPlane::start(
            &cfg,
            api.client("admin"),
            kubelets,
            None,
            lb_client,
            shutdown,
        )?;
        spawn_controllers(&api, &cfg, &plane.shutdown);
        let cluster = Cluster { plane, api };
        cluster.install_crds(&cfg.crds).await?;
        Ok(cluster)
    }

    /// The API server.
    pub fn api(&self) -> &ApiServer {
        &self.api
    }
}

impl DataPlane {
    /// Starts a kubelet for each registered node with its client (`kubelets`: node, client)
    /// and the load balancers with `lb_client`; with `kwok_hosts` (a client that may watch
    /// every pod), an app-playing kubelet for each node KWOK manages, now and later. With
    /// [`ClusterConfig::pod_port`], the kubelets open the pods' real listeners.
    fn start(
        cfg: &ClusterConfig,
        client: kube::Client,
        kubelets: Vec<(String, kube::Client)>,
        kwok_hosts: Option<kube::Client>,
        lb_client: kube::Client,
        shutdown: CancellationToken,
    ) -> Result<DataPlane> {
        let timeline = Timeline::new();
        let apps = Apps::default();
        let pod_net = cfg
            .pod_port
            .map(|port| PodNet::new(apps.clone(), port, shutdown.clone()))
            .transpose()
            .map_err(Error::PodNet)?;
        let lbs = LoadBalancers::with_model(cfg.lb, cfg.lb_model, timeline.clone());
        let mut nodes = Vec::with_capacity(kubelets.len());
        for (index, (node, kubelet_client)) in kubelets.into_iter().enumerate() {
            nodes.push(node.clone());
            let ctx = kubelet::Context {
                client: kubelet_client,
                node,
                node_index: index,
                config: cfg.kubelet,
                app: cfg.app,
                apps: apps.clone(),
                timeline: timeline.clone(),
                isolation_label: cfg.isolation_label.clone(),
                kwok: false,
                pod_net: pod_net.clone(),
            };
            spawn_owned(
                "kubelet",
                shutdown.clone(),
                kubelet::run(ctx, shutdown.clone()),
            );
        }
        spawn_owned(
            "load-balancers",
            shutdown.clone(),
            lb::run(lb_client, lbs.clone(), shutdown.clone()),
        );
        if let Some(host_client) = kwok_hosts {
            let host = crate::kwok::AppHost {
                client: host_client,
                config: cfg.kubelet,
                app: cfg.app,
                apps: apps.clone(),
                timeline: timeline.clone(),
                isolation_label: cfg.isolation_label.clone(),
                pod_net: pod_net.clone(),
            };
            spawn_owned(
                "kwok-app-hosts",
                shutdown.clone(),
                crate::kwok::run_app_hosts(host, shutdown.clone()),
            );
        }
        Ok(DataPlane {
            client,
            apps,
            pod_net,
            lbs,
            timeline,
            nodes,
            shutdown,
        })
    }

    /// A client with the cluster administrator's rights. It retries nothing (no 429, no
    /// 5xx after its Retry-After): callers see every refusal, on either tier.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Creates namespace `name` unless it exists.
    pub async fn ensure_namespace(&self, name: &str) -> Result<()> {
        let namespace = k8s_openapi::api::core::v1::Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client());
        created(namespaces.create(&PostParams::default(), &namespace).await)
            .map_err(api_err("create", format!("namespace {name}")))
    }

    /// The worker node names.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The app registry.
    pub fn apps(&self) -> &Apps {
        &self.apps
    }

    /// The pods' real listeners, with [`ClusterConfig::pod_port`]; [`PodNet::port`] is the
    /// port every pod listens on.
    pub fn pod_net(&self) -> Option<&PodNet> {
        self.pod_net.as_ref()
    }

    /// The load balancers.
    pub fn lbs(&self) -> &LoadBalancers {
        &self.lbs
    }

    /// The timeline of the run.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// The token that stops this cluster (a child of the one it was started with).
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Creates the CustomResourceDefinitions of [`ClusterConfig::crds`].
    async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            created(api.create(&PostParams::default(), crd).await).map_err(api_err(
                "create",
                format!("customresourcedefinition {name}"),
            ))?;
        }
        Ok(())
    }

    /// Creates the standard workload and waits (up to `timeout`) until every replica
    /// is ready and registered in the load balancer.
    pub async fn deploy_web(&self, spec: &WebSpec, timeout: Duration) -> Result<()> {
        let client = self.client();
        let ns = &spec.namespace;
        let object = spec.service_key();
        Api::<Service>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &spec.service())
            .await
            .map_err(api_err("create service", object.clone()))?;
        Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &spec.pdb())
            .await
            .map_err(api_err("create pdb", object.clone()))?;
        Api::<Deployment>::namespaced(client, ns)
            .create(&PostParams::default(), &spec.deployment())
            .await
            .map_err(api_err("create deployment", object))?;
        self.wait_web_ready(spec, timeout).await
    }

    /// Waits until the Deployment is fully rolled out and every replica is routable.
    pub async fn wait_web_ready(&self, spec: &WebSpec, timeout: Duration) -> Result<()> {
        let deployments: Api<Deployment> = Api::namespaced(self.client(), &spec.namespace);
        let pods: Api<Pod> = Api::namespaced(self.client(), &spec.namespace);
        let replicas = usize::try_from(spec.replicas).unwrap_or(0);
        let count = Some(spec.replicas);
        let what = format!(
            "deployment {} ready behind its load balancer",
            spec.service_key()
        );
        let selector = ListParams::default().labels(&format!("app={}", spec.name));
        wait_for(&what, timeout, || async {
            // The status and the pods themselves: either alone may lag the other.
            let d = deployments.get(&spec.name).await.ok();
            let rolled_out = d.as_ref().is_some_and(|d| {
                d.status.as_ref().is_some_and(|s| {
                    s.replicas == count
                        && s.updated_replicas == count
                        && s.available_replicas == count
                }) && d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
            });
            let Ok(list) = pods.list(&selector).await else {
                return false;
            };
            let live = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none());
            let ready = live.clone().filter(|p| controllers::pod_ready(p)).count();
            let registered = self
                .lbs
                .registered(&spec.service_key(), Instant::now())
                .len();
            rolled_out && live.count() == replicas && ready == replicas && registered == replicas
        })
        .await
    }

    /// Starts traffic through the load balancer of `spec`'s Service, a request per
    /// connection.
    pub fn traffic(&self, spec: &WebSpec, cfg: TrafficConfig) -> Traffic {
        self.traffic_with(spec, cfg, Clients::PerRequest)
    }

    /// Starts traffic through the load balancer of `spec`'s Service from `clients`.
    pub fn traffic_with(&self, spec: &WebSpec, cfg: TrafficConfig, clients: Clients) -> Traffic {
        let target = Target {
            service: spec.service_key(),
            lbs: self.lbs.clone(),
            apps: self.apps.clone(),
            timeline: self.timeline.clone(),
        };
        Traffic::start_with(target, cfg, clients, &self.shutdown)
    }

    /// Records a scenario step on the timeline.
    pub fn step(&self, what: impl Into<String>) {
        self.timeline.record(EventKind::Step, what);
    }
}

/// Polls `check` every 50 ms until it holds or `timeout` passes.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    // Polling period: quick enough for timings of a few hundred milliseconds, cheap
    // enough for the API server.
    const POLL: Duration = Duration::from_millis(50);
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Starts the scheduler and the controllers, each with its user.
fn spawn_controllers(api: &ApiServer, cfg: &ClusterConfig, s: &CancellationToken) {
    let disruption_timeout = cfg.disruption_timeout;
    use controllers::{
        daemonset, deployment, disruption, endpointslice, gc, job, replicaset, scheduler,
        statefulset,
    };
    let c = |user: &str| api.retrying_client(user);
    spawn_owned(
        "scheduler",
        s.clone(),
        scheduler::run(c(users::SCHEDULER), s.clone()),
    );
    spawn_owned(
        "replicaset-controller",
        s.clone(),
        replicaset::run(c(users::REPLICASET), s.clone(), cfg.replicaset_workers),
    );
    spawn_owned(
        "deployment-controller",
        s.clone(),
        deployment::run(c(users::DEPLOYMENT), s.clone()),
    );
    spawn_owned(
        "statefulset-controller",
        s.clone(),
        statefulset::run(c(users::STATEFULSET), s.clone()),
    );
    spawn_owned(
        "daemon-set-controller",
        s.clone(),
        daemonset::run(c(users::DAEMONSET), s.clone()),
    );
    spawn_owned(
        "job-controller",
        s.clone(),
        job::run(c(users::JOB), s.clone()),
    );
    spawn_owned(
        "endpointslice-controller",
        s.clone(),
        endpointslice::run(c(users::ENDPOINTSLICE), s.clone()),
    );
    spawn_owned(
        "disruption-controller",
        s.clone(),
        disruption::run(c(users::DISRUPTION), s.clone(), disruption_timeout),
    );
    spawn_owned(
        "garbage-collector",
        s.clone(),
        gc::run(c(users::GARBAGE_COLLECTOR), s.clone()),
    );
}

/// A worker Node named `name`, labelled as a kubelet labels its Node.
fn worker_node(name: &str) -> Node {
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("node-role.kubernetes.io/worker".to_string(), String::new()),
    ]
    .into();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// What a kubelet reports as its Node's capacity and allocatable: `max_pods` pods.
fn node_resources(max_pods: usize) -> BTreeMap<String, Quantity> {
    [
        ("cpu", "8"),
        ("memory", "32Gi"),
        ("pods", &max_pods.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect()
}

/// Creates `node`; one that already exists counts as created.
async fn create_node(client: &kube::Client, node: &Node) -> Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), node)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        r => r
            .map(|_| ())
            .map_err(api_err("register", format!("node {name}"))),
    }
}

/// The [`DataPlane`] against an API server that is not ours: kube-apiserver with its own
/// kube-controller-manager and kube-scheduler (the real test tier), or a user's cluster.
/// Dropping it stops the kubelets and load balancers; the Nodes it registered stay.
pub struct RealCluster {
    plane: DataPlane,
    config: kube::Config,
    kubeconfig: std::path::PathBuf,
    /// KWOK, when it runs the nodes; dropping it stops the process.
    _kwok: Option<crate::kwok::Kwok>,
}

impl Deref for RealCluster {
    type Target = DataPlane;
    fn deref(&self) -> &DataPlane {
        &self.plane
    }
}

impl RealCluster {
    /// Registers `cfg.nodes` Nodes on the API server `kubeconfig` names (whose user must
    /// be a cluster administrator and may impersonate) and runs their kubelets, plus the
    /// load balancers. With `cfg.kwok`, KWOK runs the nodes ([`crate::kwok`]; its stages
    /// file and log go to `logs/` beside the kubeconfig) and attach returns once the node
    /// lifecycle controller has lifted each node's not-ready taint; without, a simulated
    /// kubelet per node writes as `system:node:<node>`, so the Node authorizer and
    /// NodeRestriction judge it as they judge a real kubelet. `cfg.api`,
    /// `cfg.disruption_timeout` and `cfg.replicaset_workers` do not apply: the API server
    /// and its controllers are the real ones.
    pub async fn attach(
        cfg: ClusterConfig,
        kubeconfig: &Path,
        shutdown: CancellationToken,
    ) -> Result<RealCluster> {
        let shutdown = shutdown.child_token();
        let config = load_config(kubeconfig).await?;
        let admin = client_for(&config, None, kubeconfig)?;
        let nodes: Vec<String> = (1..=cfg.nodes).map(|i| format!("worker-{i}")).collect();
        // The data plane's own administrator client retries nothing, like the simulated
        // cluster's: callers (a drain, a test's eviction) see every 429 and decide.
        let mut plain = config.clone();
        plain.default_retry = false;
        let plain = kube::Client::try_from(plain).map_err(|e| Error::Kubeconfig {
            path: kubeconfig.display().to_string(),
            reason: e.to_string(),
        })?;
        let (plane, kwok) = match &cfg.kwok {
            Some(binary) => {
                let dir = kubeconfig
                    .parent()
                    .map_or_else(|| Path::new(".").to_path_buf(), |d| d.join("logs"));
                let mut kwok = crate::kwok::Kwok::start(binary, kubeconfig, &dir, &cfg.kubelet)
                    .map_err(|e| Error::Kwok(e.to_string()))?;
                for node in &nodes {
                    register_kwok_node(&admin, node, cfg.max_pods).await?;
                }
                for node in &nodes {
                    await_schedulable(&admin, node, &mut kwok).await?;
                }
                let mut plane = DataPlane::start(
                    &cfg,
                    plain,
                    Vec::new(),
                    Some(admin.clone()),
                    admin,
                    shutdown,
                )?;
                plane.nodes = nodes;
                (plane, Some(kwok))
            }
            None => {
                for node in &nodes {
                    register_and_report(&admin, &admin, node, cfg.max_pods).await?;
                }
                let mut kubelets = Vec::with_capacity(nodes.len());
                for node in nodes {
                    let user = (users::kubelet(&node), vec!["system:nodes".to_string()]);
                    let client = client_for(&config, Some(user), kubeconfig)?;
                    kubelets.push((node, client));
                }
                let plane = DataPlane::start(&cfg, plain, kubelets, None, admin, shutdown)?;
                (plane, None)
            }
        };
        let cluster = RealCluster {
            plane,
            config,
            kubeconfig: kubeconfig.to_path_buf(),
            _kwok: kwok,
        };
        cluster.install_crds(&cfg.crds).await?;
        Ok(cluster)
    }

    /// A client of the same API server that impersonates `user` in `groups` (plus
    /// `system:authenticated`), so RBAC judges it as that user.
    pub fn client_as(&self, user: &str, groups: &[&str]) -> Result<kube::Client> {
        let groups = groups.iter().map(|g| g.to_string()).collect();
        client_for(
            &self.config,
            Some((user.to_string(), groups)),
            &self.kubeconfig,
        )
    }

    /// An admin client that retries nothing by itself (kube's default client silently
    /// retries 429, 503 and 504 after their Retry-After): for callers that must see each
    /// refusal, like a drain counting its refused evictions.
    pub fn client_without_retries(&self) -> Result<kube::Client> {
        let mut config = self.config.clone();
        config.default_retry = false;
        kube::Client::try_from(config).map_err(|e| Error::Kubeconfig {
            path: self.kubeconfig.display().to_string(),
            reason: e.to_string(),
        })
    }

    /// The API server's URL.
    pub fn url(&self) -> String {
        self.config.cluster_url.to_string()
    }

    /// The kubeconfig this cluster was attached with (an administrator's), for tools
    /// such as `kubectl` that a row runs as a user would.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

async fn load_config(path: &Path) -> Result<kube::Config> {
    let err = |reason: String| Error::Kubeconfig {
        path: path.display().to_string(),
        reason,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))
}

fn client_for(
    config: &kube::Config,
    user: Option<(String, Vec<String>)>,
    path: &Path,
) -> Result<kube::Client> {
    let mut config = config.clone();
    if let Some((user, mut groups)) = user {
        groups.push("system:authenticated".to_string());
        config.auth_info.impersonate = Some(user);
        config.auth_info.impersonate_groups = Some(groups);
    }
    kube::Client::try_from(config).map_err(|e| Error::Kubeconfig {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// Creates a Node that KWOK manages (if missing), with what a kubelet reports at
/// registration: capacity and allocatable (`max_pods` pods). KWOK reports it Ready.
async fn register_kwok_node(admin: &kube::Client, name: &str, max_pods: usize) -> Result<()> {
    let mut node = worker_node(name);
    node.metadata.annotations = Some(
        [(
            crate::kwok::NODE_ANNOTATION.to_string(),
            crate::kwok::NODE_ANNOTATION_VALUE.to_string(),
        )]
        .into(),
    );
    node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        capacity: Some(node_resources(max_pods)),
        allocatable: Some(node_resources(max_pods)),
        ..Default::default()
    });
    create_node(admin, &node).await
}

/// How long a new KWOK node may take to be Ready and untainted: KWOK's first status, then
/// the node lifecycle controller's next pass (every 5 s).
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until node `name` is Ready without the not-ready taint, so the scheduler places
/// pods on it; fails early, with its log's path, if KWOK exits.
async fn await_schedulable(
    admin: &kube::Client,
    name: &str,
    kwok: &mut crate::kwok::Kwok,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let schedulable = |node: Option<&Node>| {
        let Some(node) = node else { return false };
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == NOT_READY_TAINT));
        ready && !tainted
    };
    let log = kwok.log().display().to_string();
    tokio::select! {
        r = kube::runtime::wait::await_condition(nodes, name, schedulable) => r
            .map(|_| ())
            .map_err(|e| Error::Kwok(format!("watching node {name}: {e}"))),
        status = kwok.wait() => Err(Error::Kwok(format!(
            "exited ({status}) before node {name} was Ready; see {log}"
        ))),
        _ = tokio::time::sleep(NODE_READY_TIMEOUT) => Err(Error::Timeout {
            what: format!(
                "node {name} Ready (KWOK) and untainted (node lifecycle controller); KWOK's log: {log}"
            ),
            after: NODE_READY_TIMEOUT,
        }),
    }
}

/// Creates the Node (if missing) and reports what a kubelet reports at registration —
/// capacity, allocatable, Ready — as `kubelet`; then, as `lifecycle` (the node lifecycle
/// controller's part), lifts the not-ready taint admission put on the new Node.
async fn register_and_report(
    kubelet: &kube::Client,
    lifecycle: &kube::Client,
    name: &str,
    max_pods: usize,
) -> Result<()> {
    create_node(kubelet, &worker_node(name)).await?;
    let nodes: Api<Node> = Api::all(kubelet.clone());
    let now = jiff::Timestamp::now().to_string();
    let resources = node_resources(max_pods);
    let status = serde_json::json!({"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "simulated kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map_err(api_err("report status of", format!("node {name}")))?;
    let nodes: Api<Node> = Api::all(lifecycle.clone());
    let node = nodes
        .get(name)
        .await
        .map_err(api_err("read", format!("node {name}")))?;
    let taints: Vec<_> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != NOT_READY_TAINT)
        .collect();
    let patch = serde_json::json!({"spec": {"taints": taints}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(api_err(
            "lift the not-ready taint of",
            format!("node {name}"),
        ))?;
    Ok(())
}

/// A cluster that components under test can be given credentials for: the simulated
/// API server (a token that names the user) or a real one (a ServiceAccount token from
/// the TokenRequest API, so RBAC judges the component as it judges an installed one).
pub trait Access: Deref<Target = DataPlane> + Sync {
    /// Writes a kubeconfig at `path` that authenticates as `user`; on a real API server
    /// `user` must be a ServiceAccount (`system:serviceaccount:NS:NAME`), created if
    /// missing.
    fn write_kubeconfig(&self, path: &Path, user: &str) -> impl Future<Output = Result<()>> + Send;

    /// Like [`Access::write_kubeconfig`], for a component that runs in a pod on `node`:
    /// on a real API server the user carries the node claim a token projected into a pod
    /// on that node carries (`authentication.kubernetes.io/node-name` in its extra), which
    /// the node agent's own-node admission policy requires.
    fn write_node_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        node: &str,
    ) -> impl Future<Output = Result<()>> + Send;
}

impl Access for Cluster {
    async fn write_kubeconfig(&self, path: &Path, user: &str) -> Result<()> {
        self.api
            .write_kubeconfig(path, user)
            .map_err(|e| Error::Credentials {
                user: user.to_string(),
                reason: e.to_string(),
            })
    }

    /// The simulated API server evaluates no admission policy: the node claim would change
    /// nothing there.
    async fn write_node_kubeconfig(&self, path: &Path, user: &str, _node: &str) -> Result<()> {
        self.write_kubeconfig(path, user).await
    }
}

/// The extra a token bound to a pod carries: the pod's node (kube-apiserver 1.32+).
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// An object that already existed counts as created.
fn created<T>(r: kube::Result<T>) -> kube::Result<()> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        r => r.map(|_| ()),
    }
}

/// How long a component's ServiceAccount token lasts: longer than any run of the real tier.
const TOKEN_SECONDS: i64 = 6 * 3600;

impl Access for RealCluster {
    async fn write_kubeconfig(&self, path: &Path, user: &str) -> Result<()> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let err = |reason: String| Error::Credentials {
            user: user.to_string(),
            reason,
        };
        let Some((ns, name)) = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
        else {
            return Err(err(
                "a real API server gives components ServiceAccount tokens only".into(),
            ));
        };
        let pp = PostParams::default();
        self.ensure_namespace(ns).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), ns);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(ns.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        created(accounts.create(&pp, &account).await)
            .map_err(api_err("create", format!("serviceaccount {ns}/{name}")))?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(TOKEN_SECONDS),
                bound_object_ref: None,
            },
            ..Default::default()
        };
        let token = accounts
            .create_token_request(name, &pp, &request)
            .await
            .map_err(api_err(
                "request a token for",
                format!("serviceaccount {ns}/{name}"),
            ))?
            .status
            .map(|s| s.token)
            .ok_or_else(|| err("the TokenRequest came back without a token".into()))?;
        let mut kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| err(e.to_string()))?;
        for auth in &mut kubeconfig.auth_infos {
            auth.auth_info = Some(kube::config::AuthInfo {
                token: Some(token.clone().into()),
                ..Default::default()
            });
        }
        let text = serde_json::to_string_pretty(&kubeconfig).map_err(|e| err(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| err(format!("write {}: {e}", path.display())))
    }

    /// The admin's credentials impersonating `user` with the node claim of `node`: what
    /// kube-apiserver makes of the token the kubelet projects into a pod on that node (a
    /// TokenRequest can bind a token only to a pod object, and a pod of our own on the
    /// node would be drained with the rest). RBAC judges the impersonated user, whose
    /// ServiceAccount groups the API server adds itself.
    async fn write_node_kubeconfig(&self, path: &Path, user: &str, node: &str) -> Result<()> {
        let err = |reason: String| Error::Credentials {
            user: user.to_string(),
            reason,
        };
        let mut kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| err(e.to_string()))?;
        for auth in &mut kubeconfig.auth_infos {
            let info = auth.auth_info.get_or_insert_with(Default::default);
            info.impersonate = Some(user.to_string());
            info.impersonate_user_extra =
                Some([(NODE_NAME_EXTRA.to_string(), vec![node.to_string()])].into());
        }
        let text = serde_json::to_string_pretty(&kubeconfig).map_err(|e| err(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| err(format!("write {}: {e}", path.display())))
    }
}
