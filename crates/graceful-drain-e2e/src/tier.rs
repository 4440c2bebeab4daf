//! One end-to-end test, two clusters: the simulated one (fast, with its fault injection and
//! request counts) and a real control plane — a fresh kube-apiserver,
//! kube-controller-manager and kube-scheduler of ours per test, or the user's own cluster
//! named by [`KUBECONFIG_VAR`] — with the simulator playing only what a control plane
//! lacks (kubelets, load balancers).
//!
//! A suite writes its test once as `async fn case(tier: Tier)` and runs it once per tier.
//! The real tier needs the control-plane binaries (`cargo xtask control-plane build`,
//! which `.ci/run` runs before the tests) or [`KUBECONFIG_VAR`]; without either,
//! [`TestCluster::start`] says so and returns `None` so the test ends there — except in CI
//! (`CI` set), where that is a failure.
//!
//! On the real tier the chart's ServiceAccounts, Roles and bindings are applied at start
//! (`deploy/graceful-drain.yaml`), so [`TestCluster::client_as`] a chart ServiceAccount is
//! judged by the real RBAC exactly as the chart's pods are.

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{Access, Cluster, ClusterConfig, DataPlane, RealCluster};

use graceful_drain_sim::scenario::components::TempDir;
use graceful_drain_sim::scenario::real::apply_chart_rbac;

/// The variable that names the kubeconfig of the user's own cluster for the real tier
/// (instead of a control plane of ours). The cluster must be a disposable one: the tests
/// register simulated Nodes (`worker-N`), run their workloads in `default` and install
/// graceful-drain, and before each test the tier removes what an earlier one left
/// ([`reset_shared`]).
pub const KUBECONFIG_VAR: &str = "GRACEFUL_DRAIN_TEST_KUBECONFIG";

/// Which cluster a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// kube-sim's API server, controllers and scheduler, in this process.
    Simulated,
    /// A real control plane: ours (fresh per test) or the one [`KUBECONFIG_VAR`] names.
    Real,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Simulated => "simulated",
            Tier::Real => "real",
        })
    }
}

enum Inner {
    Simulated(Box<Cluster>),
    Real(Box<RealCluster>),
}

/// A cluster of either tier with the data plane attached; derefs to the [`DataPlane`]
/// (admin client, Deployments of web apps, load balancers) and gives components
/// credentials through [`Access`]. Dropping it stops everything it started, our control
/// plane included.
pub struct TestCluster {
    // Field order is drop order: the data plane stops before the control plane.
    inner: Inner,
    admin_kubeconfig: PathBuf,
    plane: Option<kube_control_plane::ControlPlane>,
    dir: TempDir,
}

impl Deref for TestCluster {
    type Target = DataPlane;
    fn deref(&self) -> &DataPlane {
        match &self.inner {
            Inner::Simulated(c) => c,
            Inner::Real(c) => c,
        }
    }
}

impl Drop for TestCluster {
    /// When the test failed (it is panicking), prints the last lines of each control-plane
    /// component's log and keeps the logs folder, whose path it prints.
    fn drop(&mut self) {
        let Some(plane) = self.plane.as_ref().filter(|_| std::thread::panicking()) else {
            return;
        };
        eprintln!("{}", plane.log_tails(30));
        let kept =
            std::env::temp_dir().join(format!("gd-tier-failed-{}", uuid::Uuid::new_v4().simple()));
        match std::fs::rename(plane.dir().join("logs"), &kept) {
            Ok(()) => eprintln!("control-plane logs kept in {}", kept.display()),
            Err(e) => eprintln!("control-plane logs not kept: {e}"),
        }
    }
}

impl Access for TestCluster {
    async fn write_kubeconfig(&self, path: &Path, user: &str) -> kube_sim::cluster::Result<()> {
        match &self.inner {
            Inner::Simulated(c) => c.write_kubeconfig(path, user).await,
            Inner::Real(c) => c.write_kubeconfig(path, user).await,
        }
    }

    async fn write_node_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        node: &str,
    ) -> kube_sim::cluster::Result<()> {
        match &self.inner {
            Inner::Simulated(c) => c.write_node_kubeconfig(path, user, node).await,
            Inner::Real(c) => c.write_node_kubeconfig(path, user, node).await,
        }
    }
}

/// Why a [`TestCluster`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The test's scratch folder.
    #[error("create a scratch folder: {0}")]
    Scratch(#[source] std::io::Error),
    /// Our control plane did not come up (its logs' last lines are in the message).
    #[error("start the control plane {versions}: {reason}")]
    ControlPlane {
        /// Which versions.
        versions: String,
        /// What went wrong, with the components' log tails.
        reason: String,
    },
    /// The cluster could not be started or attached to.
    #[error(transparent)]
    Cluster(#[from] kube_sim::cluster::Error),
    /// graceful-drain's CRDs could not be built for the cluster.
    #[error(transparent)]
    Crds(#[from] graceful_drain_core::lifecycle::crds::Error),
    /// The chart's RBAC could not be applied on the real tier.
    #[error("apply the chart's RBAC: {0}")]
    Rbac(String),
    /// A client for a user could not be built from its kubeconfig.
    #[error("client for {user}: {reason}")]
    Client {
        /// The user.
        user: String,
        /// Why.
        reason: String,
    },
    /// What an earlier test left on the user's cluster could not be removed.
    #[error("reset the shared cluster {0}")]
    Reset(String),
}

/// What the real tier runs on here, if anything: the user's cluster or our control plane.
fn real_target() -> Option<Result<PathBuf, kube_control_plane::Options>> {
    if let Some(path) = std::env::var_os(KUBECONFIG_VAR) {
        return Some(Ok(PathBuf::from(path)));
    }
    let versions = kube_control_plane::Versions::default();
    let Ok(options) = kube_control_plane::cached_options(true, Vec::new()) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must build the control plane before the tests: cargo xtask control-plane build"
        );
        eprintln!(
            "real tier skipped: {versions} is not built (cargo xtask control-plane build, \
             about 8 minutes once) and {KUBECONFIG_VAR} names no cluster"
        );
        return None;
    };
    Some(Err(options))
}

impl TestCluster {
    /// Starts a cluster of `tier` with `cfg`'s nodes and timings (on the real tier only
    /// the data plane's part of `cfg` applies). `Ok(None)`: the real tier is not available
    /// on this machine (see the module's documentation).
    pub async fn start(tier: Tier, cfg: ClusterConfig) -> Result<Option<TestCluster>, Error> {
        let Some(cluster) = Self::start_bare(tier, cfg).await? else {
            return Ok(None);
        };
        if let Inner::Real(real) = &cluster.inner {
            apply_chart_rbac(real)
                .await
                .map_err(|e| Error::Rbac(graceful_drain_core::error::chain(&e).to_string()))?;
        }
        Ok(Some(cluster))
    }

    /// [`TestCluster::start`] without the chart's RBAC on the real tier: for a test that
    /// installs the chart itself (Helm refuses to take over objects it did not create).
    pub async fn start_bare(tier: Tier, cfg: ClusterConfig) -> Result<Option<TestCluster>, Error> {
        Self::start_bare_with(tier, cfg, false).await
    }

    /// [`TestCluster::start`] on a control plane of ours whose kube-apiserver presents a
    /// client certificate to admission webhooks, signed by the CA at
    /// [`TestCluster::webhook_client_ca`]. `Ok(None)` where the real tier is not available
    /// or is the user's cluster (whose API server this cannot configure).
    pub async fn start_with_webhook_client_certificates(
        cfg: ClusterConfig,
    ) -> Result<Option<TestCluster>, Error> {
        if std::env::var_os(KUBECONFIG_VAR).is_some() {
            eprintln!(
                "skipped: {KUBECONFIG_VAR}'s API server cannot be given client certificates here"
            );
            return Ok(None);
        }
        let Some(cluster) = Self::start_bare_with(Tier::Real, cfg, true).await? else {
            return Ok(None);
        };
        if let Inner::Real(real) = &cluster.inner {
            apply_chart_rbac(real)
                .await
                .map_err(|e| Error::Rbac(graceful_drain_core::error::chain(&e).to_string()))?;
        }
        Ok(Some(cluster))
    }

    /// The CA that signed kube-apiserver's client certificate for webhooks, on a control
    /// plane started by [`TestCluster::start_with_webhook_client_certificates`].
    pub fn webhook_client_ca(&self) -> Option<PathBuf> {
        self.plane.as_ref().map(|p| p.webhook_client_ca())
    }

    async fn start_bare_with(
        tier: Tier,
        cfg: ClusterConfig,
        webhook_client_certificate: bool,
    ) -> Result<Option<TestCluster>, Error> {
        graceful_drain_core::runtime::install_crypto_provider();
        let cfg = graceful_drain_sim::setup::configure(cfg)?;
        let dir = TempDir::new("gd-tier").map_err(Error::Scratch)?;
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        let shutdown = Shutdown::new();
        match tier {
            Tier::Simulated => {
                let cluster = Cluster::start(cfg, shutdown).await?;
                cluster
                    .api()
                    .write_kubeconfig(&admin_kubeconfig, "admin")
                    .map_err(Error::Scratch)?;
                Ok(Some(TestCluster {
                    inner: Inner::Simulated(Box::new(cluster)),
                    admin_kubeconfig,
                    plane: None,
                    dir,
                }))
            }
            Tier::Real => {
                let Some(target) = real_target() else {
                    return Ok(None);
                };
                let (kubeconfig, plane) = match target {
                    Ok(path) => {
                        reset_shared(&path).await?;
                        (path, None)
                    }
                    Err(mut options) => {
                        options.webhook_client_certificate = webhook_client_certificate;
                        let path = dir.path().join("control-plane");
                        let versions = kube_control_plane::Versions::default().to_string();
                        let plane = tokio::task::spawn_blocking(move || {
                            kube_control_plane::up(&path, &options)
                        })
                        .await
                        .map_err(|e| Error::ControlPlane {
                            versions: versions.clone(),
                            reason: e.to_string(),
                        })?
                        .map_err(|e| Error::ControlPlane {
                            versions,
                            reason: graceful_drain_core::error::chain(&e).to_string(),
                        })?;
                        (plane.admin_kubeconfig(), Some(plane))
                    }
                };
                // KWOK runs the nodes, as built next to the control plane.
                let cfg = ClusterConfig {
                    kwok: cfg.kwok.or_else(kube_control_plane::kwok_binary),
                    ..cfg
                };
                let cluster = RealCluster::attach(cfg, &kubeconfig, shutdown).await?;
                Ok(Some(TestCluster {
                    inner: Inner::Real(Box::new(cluster)),
                    admin_kubeconfig: kubeconfig,
                    plane,
                    dir,
                }))
            }
        }
    }

    /// The tier this cluster belongs to.
    pub fn tier(&self) -> Tier {
        match self.inner {
            Inner::Simulated(_) => Tier::Simulated,
            Inner::Real(_) => Tier::Real,
        }
    }

    /// The simulated cluster, for what only it offers (request counts, injected faults).
    pub fn simulated(&self) -> Option<&Cluster> {
        match &self.inner {
            Inner::Simulated(c) => Some(c),
            Inner::Real(_) => None,
        }
    }

    /// A client acting as `user`, judged by the cluster's authorization as that user: on
    /// the real tier a ServiceAccount (`system:serviceaccount:NS:NAME`, a chart's) gets a
    /// token from the TokenRequest API, as `kubectl create token` gives one, and any other
    /// user (`system:node:NODE`) is impersonated with the groups it carries.
    pub async fn client_as(&self, user: &str) -> Result<kube::Client, Error> {
        let real = match &self.inner {
            Inner::Simulated(c) => return Ok(c.api().client(user)),
            Inner::Real(c) => c,
        };
        if user.starts_with("system:serviceaccount:") {
            let path = self
                .dir
                .path()
                .join(format!("{}.kubeconfig", user.replace(':', "_")));
            real.write_kubeconfig(&path, user).await?;
            return kube_client(&path).await.map_err(|reason| Error::Client {
                user: user.to_string(),
                reason,
            });
        }
        let groups: &[&str] = if user.starts_with("system:node:") {
            &["system:nodes"]
        } else {
            &[]
        };
        Ok(real.client_as(user, groups)?)
    }

    /// A client acting as ServiceAccount `user` in a pod on `node`: on the real tier it
    /// carries the node claim of the token the kubelet projects into such a pod (what the
    /// node agent's own-node admission policy requires, see
    /// [`Access::write_node_kubeconfig`]).
    pub async fn client_on_node(&self, user: &str, node: &str) -> Result<kube::Client, Error> {
        let real = match &self.inner {
            Inner::Simulated(c) => return Ok(c.api().client(user)),
            Inner::Real(c) => c,
        };
        let path = self
            .dir
            .path()
            .join(format!("{}-{node}.kubeconfig", user.replace(':', "_")));
        real.write_node_kubeconfig(&path, user, node).await?;
        kube_client(&path).await.map_err(|reason| Error::Client {
            user: user.to_string(),
            reason,
        })
    }

    /// A kubeconfig of a cluster administrator, for `kubectl` and our CLI.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }
}

/// Removes from the user's cluster what an earlier test left there, so each test starts
/// as on a fresh control plane: the workloads, PDBs, Services (but `kubernetes`) and pods
/// of `default`, every LifecycleEvent, graceful-drain's webhook configurations, the
/// `worker-N` Nodes the data plane registered, and the release namespace `graceful-drain`.
/// Waits (bounded) until the pods and the namespace are gone.
pub async fn reset_shared(kubeconfig: &Path) -> Result<(), Error> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use kube::Api;
    use kube::api::{DeleteParams, ListParams};

    let client = kube_client(kubeconfig)
        .await
        .map_err(|e| Error::Reset(format!("{} ({KUBECONFIG_VAR}): {e}", kubeconfig.display())))?;
    let failed = |what: &str, e: kube::Error| {
        Error::Reset(format!(
            "{} ({}): {what}: {e}",
            kubeconfig.display(),
            KUBECONFIG_VAR
        ))
    };
    let gone = |r: kube::Result<()>| match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        r => r,
    };
    let all = ListParams::default();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    macro_rules! delete_all {
        ($kind:ty, $what:literal) => {
            gone(
                Api::<$kind>::namespaced(client.clone(), "default")
                    .delete_collection(&now, &all)
                    .await
                    .map(|_| ()),
            )
            .map_err(|e| failed($what, e))?;
        };
    }
    delete_all!(Deployment, "delete the deployments of default");
    delete_all!(StatefulSet, "delete the statefulsets of default");
    delete_all!(DaemonSet, "delete the daemonsets of default");
    delete_all!(Job, "delete the jobs of default");
    delete_all!(PodDisruptionBudget, "delete the PDBs of default");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    delete_named(&services, |name| name != "kubernetes", &now, &failed).await?;
    delete_all!(Pod, "delete the pods of default");
    let events: Api<graceful_drain_core::lifecycle::LifecycleEvent> = Api::all(client.clone());
    gone(events.delete_collection(&now, &all).await.map(|_| ()))
        .map_err(|e| failed("delete the lifecycleevents", e))?;
    let ours = |name: &str| name.starts_with("graceful-drain");
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    delete_named(&mutating, ours, &now, &failed).await?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    delete_named(&validating, ours, &now, &failed).await?;
    let registered = |name: &str| {
        name.strip_prefix("worker-")
            .is_some_and(|n| n.parse::<u32>().is_ok())
    };
    delete_named(&Api::<Node>::all(client.clone()), registered, &now, &failed).await?;
    let release = graceful_drain_sim::scenario::components::NAMESPACE;
    gone(
        Api::<Namespace>::all(client.clone())
            .delete(release, &now)
            .await
            .map(|_| ()),
    )
    .map_err(|e| failed(&format!("delete namespace {release}"), e))?;
    // Pods a deleted Node held are the garbage collector's to remove: wait for them, and
    // for the namespace (the webhook's uninstall finalizers, when an earlier test's
    // webhook died holding them, are released here as its uninstall would).
    release_uninstall_finalizers(&client, release).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    kube_sim::cluster::wait_for("the shared cluster reset", RESET_WAIT, || async {
        let pods_left = pods.list(&all).await.map_or(true, |l| !l.items.is_empty());
        let namespace_left = !matches!(namespaces.get_opt(release).await, Ok(None));
        !pods_left && !namespace_left
    })
    .await?;
    Ok(())
}

/// Deletes with `now` every object of `api` whose name `doomed` picks (404 counts as
/// deleted); `failed` turns an API error about what was being done into the reset's error.
async fn delete_named<K>(
    api: &kube::Api<K>,
    doomed: impl Fn(&str) -> bool,
    now: &kube::api::DeleteParams,
    failed: &impl Fn(&str, kube::Error) -> Error,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&()).to_lowercase();
    let objects = api
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| failed(&format!("list the {kind}s"), e))?;
    for object in objects {
        let name = object.meta().name.clone().unwrap_or_default();
        if !doomed(&name) {
            continue;
        }
        match api.delete(&name, now).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(failed(&format!("delete {kind} {name}"), e)),
        }
    }
    Ok(())
}

/// How long [`reset_shared`] waits for the namespace and the pods to go.
const RESET_WAIT: std::time::Duration = std::time::Duration::from_secs(90);

/// Removes the finalizer `graceful-drain.io/uninstall` from the webhook's
/// ClusterRoleBinding and ServiceAccount of a release in `namespace`, and deletes the
/// objects Helm keeps for that uninstall work (labelled with the release).
async fn release_uninstall_finalizers(client: &kube::Client, namespace: &str) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::Api;
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
    let release = ListParams::default().labels(&format!("app.kubernetes.io/instance={namespace}"));
    let clear = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    let params = PatchParams::default();
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for b in bindings
        .list(&release)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = b.metadata.name.unwrap_or_default();
        let _ = bindings.patch(&name, &params, &clear).await;
        let _ = bindings.delete(&name, &DeleteParams::default()).await;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    for a in accounts
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = a.metadata.name.unwrap_or_default();
        let _ = accounts.patch(&name, &params, &clear).await;
    }
    let roles: Api<ClusterRole> = Api::all(client.clone());
    for r in roles
        .list(&release)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let _ = roles
            .delete(
                &r.metadata.name.unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await;
    }
}

/// A client from `kubeconfig` that retries nothing (our components build theirs so: a
/// refused eviction must come back as a 429 at once).
async fn kube_client(kubeconfig: &Path) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}
