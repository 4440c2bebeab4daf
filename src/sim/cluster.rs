//! A simulated cluster: the in-process API server plus the controllers, one kubelet per
//! node, the load-balancer model and the app registry, all wired together and owned by
//! one shutdown token. [`Cluster::deploy_web`] installs the standard workload (a
//! Deployment behind a LoadBalancer Service with a PodDisruptionBudget) and waits until
//! it serves; [`Cluster::traffic`] sends requests through its load balancer.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, Pod, PodSpec, PodTemplateSpec, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{ListParams, PostParams};

use super::apiserver::{self, ApiServer};
use super::controllers::{self, kubelet, users};
use super::lb::{self, LbConfig, LbModel, LoadBalancers};
use super::traffic::apps::{Apps, Behaviour};
use super::traffic::clients::Clients;
use super::traffic::timeline::{EventKind, Timeline};
use super::traffic::{Target, Traffic, TrafficConfig};
use crate::runtime::{Shutdown, spawn_owned};

/// Errors of the simulated cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server did not start.
    #[error("start simulated API server")]
    ApiServer(#[source] apiserver::Error),
    /// An API call made while setting up failed.
    #[error("{action} {object}")]
    Api {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    /// A condition was not reached in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// The lifecycle CRDs could not be built.
    #[error(transparent)]
    Crds(#[from] crate::lifecycle::crds::Error),
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
}

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
        }
    }
}

/// The standard workload: a Deployment behind a LoadBalancer Service, with a PDB.
#[derive(Clone, Debug)]
pub struct WebSpec {
    pub namespace: String,
    /// Name of the Deployment, Service and PDB; also the `app` label.
    pub name: String,
    pub replicas: i32,
    /// The PDB's minAvailable.
    pub min_available: i32,
    /// terminationGracePeriodSeconds of the pods.
    pub grace_period_seconds: i64,
    pub max_surge: IntOrString,
    pub max_unavailable: IntOrString,
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
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![container],
                        termination_grace_period_seconds: Some(self.grace_period_seconds),
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

/// A running simulated cluster. Dropping it stops everything it started.
pub struct Cluster {
    api: ApiServer,
    apps: Apps,
    lbs: LoadBalancers,
    timeline: Timeline,
    nodes: Vec<String>,
    shutdown: Shutdown,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Cluster {
    /// Starts the API server, registers the nodes and starts every controller, kubelet
    /// and the load balancers. Stops when `shutdown` is cancelled or the cluster dropped.
    pub async fn start(cfg: ClusterConfig, shutdown: Shutdown) -> Result<Cluster> {
        let shutdown = shutdown.child_token();
        let api = ApiServer::start(cfg.api.clone(), shutdown.clone())
            .await
            .map_err(Error::ApiServer)?;
        let timeline = Timeline::new();
        let apps = Apps::default();
        let lbs = LoadBalancers::with_model(cfg.lb, cfg.lb_model, timeline.clone());
        let nodes: Vec<String> = (1..=cfg.nodes).map(|i| format!("worker-{i}")).collect();
        for (index, node) in nodes.iter().enumerate() {
            let client = api.retrying_client(&users::kubelet(node));
            register_node(&client, node).await?;
            let ctx = kubelet::Context {
                client,
                node: node.clone(),
                node_index: index,
                config: cfg.kubelet,
                app: cfg.app,
                apps: apps.clone(),
                timeline: timeline.clone(),
            };
            spawn_owned(
                "kubelet",
                shutdown.clone(),
                kubelet::run(ctx, shutdown.clone()),
            );
        }
        spawn_controllers(&api, &lbs, &cfg, &shutdown);
        let cluster = Cluster {
            api,
            apps,
            lbs,
            timeline,
            nodes,
            shutdown,
        };
        cluster.install_lifecycle_crds().await?;
        Ok(cluster)
    }

    /// The API server.
    pub fn api(&self) -> &ApiServer {
        &self.api
    }

    /// A client authenticated as `admin`.
    pub fn client(&self) -> kube::Client {
        self.api.client("admin")
    }

    /// The worker node names.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The app registry.
    pub fn apps(&self) -> &Apps {
        &self.apps
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
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Registers the `lifecycle.k8s.io` CustomResourceDefinitions.
    async fn install_lifecycle_crds(&self) -> Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        // The same definitions `graceful-drain crds` prints and the chart installs.
        for crd in crate::lifecycle::crds::crds()? {
            let name = crd.metadata.name.clone().unwrap_or_default();
            match api.create(&PostParams::default(), &crd).await {
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                r => {
                    r.map_err(api_err(
                        "create",
                        format!("customresourcedefinition {name}"),
                    ))?;
                }
            }
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

/// Starts the scheduler, the controllers and the load balancers, each with its user.
fn spawn_controllers(api: &ApiServer, lbs: &LoadBalancers, cfg: &ClusterConfig, s: &Shutdown) {
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
    spawn_owned(
        "load-balancers",
        s.clone(),
        lb::run(c(users::SERVICE_CONTROLLER), lbs.clone(), s.clone()),
    );
}

async fn register_node(client: &kube::Client, name: &str) -> Result<()> {
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("node-role.kubernetes.io/worker".to_string(), String::new()),
    ]
    .into();
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        r => r
            .map(|_| ())
            .map_err(api_err("register", format!("node {name}"))),
    }
}
