//! `graceful-drain node-agent`: the kubelet SLM plugin of one node — plugin registration,
//! the SLMPlugin gRPC service, and the server-side drain engine — plus, optionally, the
//! lifecycle reconciler that plays the kubelet's part on clusters without SLM.
//!
//! Layers: pure decisions ([`filters`], [`progress`], patch and request builders in
//! [`node`] and [`drain`]) → kube glue ([`drain::Engine`], [`node`], [`report`],
//! [`transitions`]) → runtime ([`ops`] background operations, [`slm`] and
//! [`registration`] gRPC over unix sockets, wired up here).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod drain;
pub mod filters;
pub mod hooks;
pub mod node;
pub mod ops;
pub mod progress;
pub mod reconciler;
pub mod registration;
pub mod report;
pub mod slm;
pub mod tiers;
pub mod transitions;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::ArgAction;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

use crate::reconciler::{Mode, ReconcilerArgs};
use graceful_drain_core::admin::{self, Readiness};
use graceful_drain_core::backoff::Backoff;
use graceful_drain_core::lifecycle::{DEFAULT_DRIVER, DRAIN_TRANSITION, MAINTENANCE_TRANSITION};
use graceful_drain_core::proto::registration::registration_server::RegistrationServer;
use graceful_drain_core::proto::slm::slm_plugin_server::SlmPluginServer;
use graceful_drain_core::runtime::{Shutdown, spawn_owned};

pub use drain::DrainConfig;
pub use ops::{Agent, OpKind, Phase, Snapshot};
pub use slm::TransitionNames;

/// How long shutdown waits for the gRPC servers to close their connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Readiness check: LifecycleTransitions published.
const TRANSITIONS_CHECK: &str = "lifecycle-transitions";

/// Arguments of `graceful-drain node-agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The node this agent serves (from the downward API: spec.nodeName).
    #[arg(long, env = "GRACEFUL_DRAIN_NODE_NAME")]
    pub node_name: String,
    /// Driver name registered with the kubelet and named by our LifecycleTransitions.
    #[arg(long, default_value = DEFAULT_DRIVER, env = "GRACEFUL_DRAIN_DRIVER_NAME")]
    pub driver_name: String,
    /// Folder of plugin service sockets; ours is `<plugins-dir>/<driver>/slm.sock`.
    #[arg(long, default_value = "/var/lib/kubelet/plugins", value_name = "DIR")]
    pub plugins_dir: PathBuf,
    /// Folder the kubelet's plugin watcher scans; ours is `<registry-dir>/<driver>-reg.sock`.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/plugins_registry",
        value_name = "DIR"
    )]
    pub registry_dir: PathBuf,
    /// Admin address serving /livez, /readyz and /metrics (port 0 picks one).
    #[arg(
        long,
        default_value = "0.0.0.0:9091",
        env = "GRACEFUL_DRAIN_ADMIN_LISTEN"
    )]
    pub admin_listen: SocketAddr,
    /// SLA of the published transitions (how long a claimed event may run).
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration, env = "GRACEFUL_DRAIN_SLA")]
    pub sla: Duration,
    /// Name of the drain LifecycleTransition.
    #[arg(long, default_value = DRAIN_TRANSITION, env = "GRACEFUL_DRAIN_DRAIN_TRANSITION")]
    pub drain_transition: String,
    /// Name of the maintenance-complete LifecycleTransition.
    #[arg(long, default_value = MAINTENANCE_TRANSITION, env = "GRACEFUL_DRAIN_MAINTENANCE_TRANSITION")]
    pub maintenance_transition: String,
    /// The drain options (kubectl's flags and ours).
    #[command(flatten)]
    pub drain: DrainArgs,
    /// Maintenance hooks: a JSON list of {name, at (drain-start | before-eviction |
    /// after-last-pod | after-uncordon), https {url, caBundle} or job {namespace, template},
    /// timeout, pollInterval, optional}; see docs/hooks.md.
    #[arg(long, default_value = "", hide_default_value = true, value_name = "JSON", value_parser = hooks::parse_arg, env = "GRACEFUL_DRAIN_HOOKS")]
    pub hooks: hooks::Hooks,
    /// Whether and how the lifecycle reconciler runs.
    #[command(flatten)]
    pub reconciler: ReconcilerArgs,
    /// How to reach the API server.
    #[command(flatten)]
    pub kube: graceful_drain_core::kubeclient::KubeArgs,
}

/// The drain options, named and defaulted like `kubectl drain` except where production
/// wants otherwise (`--ignore-daemonsets` is on). Booleans take `--flag` or `--flag=false`.
#[derive(Clone, Debug, clap::Args)]
pub struct DrainArgs {
    /// Skip DaemonSet-managed pods; with false, such pods refuse the drain.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "GRACEFUL_DRAIN_IGNORE_DAEMONSETS")]
    pub ignore_daemonsets: bool,
    /// Evict pods with emptyDir volumes (their data is lost).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "GRACEFUL_DRAIN_DELETE_EMPTYDIR_DATA")]
    pub delete_emptydir_data: bool,
    /// Evict pods that no controller recreates (bare pods, orphaned DaemonSet pods).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "GRACEFUL_DRAIN_FORCE")]
    pub force: bool,
    /// DELETE pods instead of evicting them: bypasses PodDisruptionBudgets.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "GRACEFUL_DRAIN_DISABLE_EVICTION")]
    pub disable_eviction: bool,
    /// Grace period in seconds for evicted pods; negative keeps each pod's own.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_name = "SECONDS", env = "GRACEFUL_DRAIN_GRACE_PERIOD")]
    pub grace_period: i64,
    /// Only drain pods matching this label selector.
    #[arg(long, value_name = "SELECTOR", env = "GRACEFUL_DRAIN_POD_SELECTOR")]
    pub pod_selector: Option<String>,
    /// Evict the pods this label selector picks last, once every other pod is gone (a tier
    /// `last` after the others, or the `match` of the `--tiers` tier named `last`), e.g. an
    /// ingress controller or a log shipper.
    #[arg(
        long,
        value_name = "SELECTOR",
        env = "GRACEFUL_DRAIN_LAST_POD_SELECTOR"
    )]
    pub last_pod_selector: Option<String>,
    /// Eviction tiers, in order, as JSON: `[{"name":"databases","match":[{"namespaces":["db"]},
    /// {"priorityClassNames":["critical-db"]}]}, …]`. A matcher ANDs what it sets
    /// (podSelector, namespaces, priorityClassNames, minPriority); a tier's matchers are
    /// OR'ed; a pod goes to the first tier matching it, else to the tier without `match`
    /// (or an implicit first tier `workloads`). Unset: workloads, then system-critical.
    #[arg(long, value_name = "JSON", env = "GRACEFUL_DRAIN_TIERS")]
    pub tiers: Option<String>,
    /// Pods deleted longer than this many seconds ago are skipped and not waited for (0: off).
    #[arg(
        long,
        default_value_t = 0,
        value_name = "SECONDS",
        env = "GRACEFUL_DRAIN_SKIP_WAIT_FOR_DELETE_TIMEOUT"
    )]
    pub skip_wait_for_delete_timeout: u64,
    /// Fail the drain after this long (0: no limit; the transition's SLA still applies).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration, env = "GRACEFUL_DRAIN_DRAIN_TIMEOUT")]
    pub drain_timeout: Duration,
    /// Label the node node.kubernetes.io/exclude-from-external-load-balancers while draining.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "GRACEFUL_DRAIN_EXCLUDE_FROM_LB_LABEL")]
    pub exclude_from_lb_label: bool,
    /// Eviction requests in flight at once (each is an admission call to the webhook).
    #[arg(
        long,
        default_value_t = 16,
        value_name = "N",
        env = "GRACEFUL_DRAIN_MAX_CONCURRENT_EVICTIONS"
    )]
    pub max_concurrent_evictions: usize,
    /// How often a running drain re-reads its LifecycleEvent, stopping once it ended.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "GRACEFUL_DRAIN_EVENT_CHECK_INTERVAL")]
    pub event_check_interval: Duration,
}

impl DrainArgs {
    /// The engine configuration these flags describe; fails on tiers that cannot be used.
    pub fn config(&self) -> Result<DrainConfig, tiers::Error> {
        let specs = tiers::parse_specs(self.tiers.as_deref().unwrap_or_default())?;
        let tiers = tiers::Tiers::new(specs, self.last_pod_selector.clone())?;
        Ok(DrainConfig {
            filters: filters::FilterOptions {
                ignore_daemonsets: self.ignore_daemonsets,
                delete_emptydir_data: self.delete_emptydir_data,
                force: self.force,
                skip_wait_for_delete_timeout: (self.skip_wait_for_delete_timeout > 0)
                    .then(|| Duration::from_secs(self.skip_wait_for_delete_timeout)),
            },
            grace_period: (self.grace_period >= 0).then_some(self.grace_period),
            pod_selector: self.pod_selector.clone().filter(|s| !s.is_empty()),
            tiers,
            disable_eviction: self.disable_eviction,
            timeout: (!self.drain_timeout.is_zero()).then_some(self.drain_timeout),
            concurrency: self.max_concurrent_evictions.max(1),
            event_check: self.event_check_interval.max(Duration::from_millis(100)),
        })
    }
}

/// Errors starting the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable cluster credentials.
    #[error(transparent)]
    Kube(#[from] graceful_drain_core::kubeclient::Error),
    /// The admin port could not be bound.
    #[error(transparent)]
    Admin(#[from] admin::Error),
    /// A socket could not be prepared.
    #[error(transparent)]
    Socket(#[from] registration::Error),
    /// `--tiers` or `--last-pod-selector` cannot be used.
    #[error(transparent)]
    Tiers(#[from] tiers::Error),
}

/// A started agent.
pub struct Started {
    /// Where the admin port listens.
    pub admin_addr: SocketAddr,
    /// The agent's state (for status snapshots).
    pub agent: Agent,
    /// The registration socket (removed at shutdown, which deregisters the plugin).
    pub registration_socket: PathBuf,
    /// The SLM service socket.
    pub service_socket: PathBuf,
    /// The socket files this agent created: registration first, then service.
    sockets: [registration::Socket; 2],
    servers: Vec<JoinHandle<()>>,
    shutdown: Shutdown,
}

impl Started {
    /// Waits for shutdown, then removes the registration socket first (so the kubelet stops
    /// calling), lets the servers close, and removes the service socket.
    pub async fn wait(self) {
        self.shutdown.cancelled().await;
        let [registration, service] = self.sockets;
        registration.remove();
        let servers = futures::future::join_all(self.servers);
        if tokio::time::timeout(SHUTDOWN_GRACE, servers).await.is_err() {
            tracing::warn!("gRPC servers did not stop within {SHUTDOWN_GRACE:?}");
        }
        service.remove();
    }
}

/// Runs the node agent until `shutdown`.
pub async fn run(args: Args, shutdown: Shutdown) -> anyhow::Result<()> {
    // Its own retries only: an eviction refused by a PDB must come back as a 429 at once.
    let client = args
        .kube
        .client_without_retries()
        .await
        .map_err(Error::from)?;
    let started = start(args, client, shutdown).await?;
    started.wait().await;
    Ok(())
}

/// Logs a warning for each hook whose timeout exceeds the transitions' SLA: the SLA bounds
/// the whole transition, hooks included, so such a hook can be cut short by it.
fn warn_hooks_beyond_sla(hooks: &hooks::Hooks, sla: Duration) {
    let points = [
        hooks::HookPoint::DrainStart,
        hooks::HookPoint::BeforeEviction,
        hooks::HookPoint::AfterLastPod,
        hooks::HookPoint::AfterUncordon,
    ];
    for hook in points.into_iter().flat_map(|p| hooks.at(p)) {
        if hook.timeout >= sla {
            tracing::warn!(
                hook = %hook.spec.name,
                timeout = ?hook.timeout,
                ?sla,
                "the hook's timeout is not shorter than the transition's SLA (--sla), which ends the transition first; raise --sla"
            );
        }
    }
}

/// Starts every part of the agent with `client` (tests pass a mock or simulator client).
pub async fn start(args: Args, client: kube::Client, shutdown: Shutdown) -> Result<Started, Error> {
    let Args {
        node_name,
        driver_name,
        plugins_dir,
        registry_dir,
        admin_listen,
        sla,
        drain_transition,
        maintenance_transition,
        drain,
        hooks,
        reconciler: reconciler_args,
        kube: _,
    } = args;
    let config = Arc::new(drain.config()?);
    let (registry, metrics, reconciler_metrics) = registered_metrics();
    let readiness = Readiness::default();
    readiness.register(TRANSITIONS_CHECK, "publishing LifecycleTransitions");
    let service_socket = registration::service_socket(&plugins_dir, &driver_name);
    let registration_socket = registration::registration_socket(&registry_dir, &driver_name);
    let (slm_listener, service_file) = registration::bind(&service_socket)?;
    let (reg_listener, registration_file) = registration::bind(&registration_socket)?;

    warn_hooks_beyond_sla(&hooks, sla);
    let agent = Agent::new(ops::Inner {
        client: client.clone(),
        node: node_name.clone(),
        exclude_from_lb: drain.exclude_from_lb_label,
        config,
        hooks,
        metrics: metrics.clone(),
        events: report::NodeEvents::new(client.clone(), node_name.clone()),
        shutdown: shutdown.clone(),
    });
    let admin_addr = serve_admin(admin_listen, &readiness, registry, &agent, &shutdown).await?;
    tracing::info!(%admin_addr, node = %node_name, "node agent admin port listening");
    let names = TransitionNames {
        drain: drain_transition,
        maintenance: maintenance_transition,
    };
    let slm = SlmPluginServer::new(slm::SlmService::new(agent.clone(), names.clone()));
    let policy = kubelet_policy(reconciler_args.mode, &client);
    let registration = RegistrationServer::new(registration::RegistrationService {
        driver: driver_name.clone(),
        endpoint: service_socket.clone(),
        readiness: readiness.clone(),
        metrics,
        policy,
    });
    let servers = serve_sockets((slm_listener, slm), (reg_listener, registration), &shutdown);
    tracing::info!(
        registration = %registration_socket.display(),
        service = %service_socket.display(),
        "kubelet plugin sockets listening"
    );

    let wanted = transitions::transitions(&names.drain, &names.maintenance, &driver_name, sla);
    let reconciler = (reconciler_args.mode != Mode::Off).then(|| {
        let ctx = reconciler::Context {
            client: client.clone(),
            node_name,
            driver_name,
            registry_dir,
            plugins_dir,
            metrics: reconciler_metrics,
        };
        (reconciler_args, ctx)
    });
    spawn_background(&agent, client, readiness, wanted, reconciler, &shutdown);
    Ok(Started {
        admin_addr,
        agent,
        registration_socket,
        service_socket,
        sockets: [registration_file, service_file],
        servers,
        shutdown,
    })
}

/// The agent's metrics and the reconciler's, registered for the admin port.
fn registered_metrics() -> (Arc<Registry>, report::Metrics, reconciler::metrics::Metrics) {
    let mut registry = Registry::default();
    let metrics = report::Metrics::register(&mut registry);
    let reconciler_metrics = reconciler::metrics::Metrics::register(&mut registry);
    (Arc::new(registry), metrics, reconciler_metrics)
}

/// What a kubelet refusal means under `--lifecycle-reconciler=mode`.
fn kubelet_policy(mode: Mode, client: &kube::Client) -> registration::KubeletPolicy {
    match mode {
        Mode::Off => registration::KubeletPolicy::Required,
        Mode::On => registration::KubeletPolicy::Optional,
        Mode::Auto => registration::KubeletPolicy::Auto(client.clone()),
    }
}

/// Serves the SLM and registration gRPC services on their unix sockets until shutdown.
fn serve_sockets(
    (slm_listener, slm): (tokio::net::UnixListener, SlmPluginServer<slm::SlmService>),
    (reg_listener, registration): (
        tokio::net::UnixListener,
        RegistrationServer<registration::RegistrationService>,
    ),
    shutdown: &Shutdown,
) -> Vec<JoinHandle<()>> {
    let slm_serve = tonic::transport::Server::builder()
        .add_service(slm)
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(slm_listener),
            shutdown.clone().cancelled_owned(),
        );
    let reg_serve = tonic::transport::Server::builder()
        .add_service(registration)
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(reg_listener),
            shutdown.clone().cancelled_owned(),
        );
    vec![
        spawn_owned("slm-server", shutdown.clone(), slm_serve),
        spawn_owned("registration-server", shutdown.clone(), reg_serve),
    ]
}

/// Starts the owned background tasks: publishing the transitions (then marking the
/// readiness check), resuming a drain a previous agent left, and the lifecycle reconciler.
fn spawn_background(
    agent: &Agent,
    client: kube::Client,
    readiness: Readiness,
    wanted: Vec<graceful_drain_core::lifecycle::LifecycleTransition>,
    reconciler: Option<(ReconcilerArgs, reconciler::Context)>,
    shutdown: &Shutdown,
) {
    let token = shutdown.clone();
    let events = agent.events();
    spawn_owned("publish-transitions", shutdown.clone(), async move {
        publish_until_done(&client, &wanted, &events, &token).await;
        readiness.ready(TRANSITIONS_CHECK);
        Ok::<(), std::convert::Infallible>(())
    });
    let agent = agent.clone();
    spawn_owned("resume-drain", shutdown.clone(), async move {
        agent.resume().await;
        Ok::<(), std::convert::Infallible>(())
    });
    if let Some((args, ctx)) = reconciler {
        let token = shutdown.clone();
        spawn_owned("lifecycle-reconciler", shutdown.clone(), async move {
            reconciler::run(&args, ctx, token).await
        });
    }
}

/// Serves the shared admin router (`/livez`, `/readyz`, `/metrics`) plus `/status`, the
/// agent's [`Snapshot`] as JSON (what `graceful-drain status` or a person with curl reads).
async fn serve_admin(
    addr: SocketAddr,
    readiness: &Readiness,
    registry: Arc<Registry>,
    agent: &Agent,
    shutdown: &Shutdown,
) -> Result<SocketAddr, Error> {
    let bind_error = |source| Error::Admin(admin::Error::Bind { addr, source });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    let agent = agent.clone();
    let app = admin::router(readiness.clone(), registry).route(
        "/status",
        axum::routing::get(move || {
            let snapshot = agent.snapshot();
            async move { axum::Json(snapshot) }
        }),
    );
    let token = shutdown.clone();
    spawn_owned("admin", shutdown.clone(), async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(token.cancelled_owned())
            .await
            .map_err(admin::Error::Serve)
    });
    Ok(local)
}

/// Publishes every transition, retrying failures (the API server may be unreachable for a
/// while at node start-up) until done or shutdown.
async fn publish_until_done(
    client: &kube::Client,
    wanted: &[graceful_drain_core::lifecycle::LifecycleTransition],
    events: &report::NodeEvents,
    shutdown: &Shutdown,
) {
    // Capped at 30 s: often enough to publish soon after the API server recovers.
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    for transition in wanted {
        loop {
            let delay = backoff.next_pause();
            match transitions::publish(client, transition).await {
                Ok(()) => break,
                // Nothing but an operator fixes this: said once as an error and as a
                // Warning Event on the node (rate-limited), then retried quietly.
                Err(error) if error.needs_operator() => {
                    let text = graceful_drain_core::error::chain(&error).to_string();
                    tracing::error!(error = %text, retry_in = ?delay, "LifecycleEvent drains cannot work on this node");
                    events
                        .post(
                            report::EventType::Warning,
                            graceful_drain_core::labels::agent_reason::LIFECYCLE_API_UNAVAILABLE,
                            "lifecycletransitions",
                            text,
                        )
                        .await;
                }
                Err(error) => {
                    tracing::warn!(error = %graceful_drain_core::error::chain(&error), retry_in = ?delay, "publish transition")
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(flags: &[&str]) -> Args {
        let argv = ["node-agent", "--node-name", "n1"].iter().chain(flags);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn defaults_are_production_defaults() {
        let args = parse(&[]);
        let config = args.drain.config().unwrap();
        assert!(
            config.filters.ignore_daemonsets,
            "DaemonSet pods are skipped by default"
        );
        assert!(!config.filters.delete_emptydir_data && !config.filters.force);
        assert_eq!(config.grace_period, None, "each pod's own grace period");
        assert_eq!(config.timeout, None);
        assert!(!config.disable_eviction);
        assert!(args.drain.exclude_from_lb_label);
        assert_eq!(args.sla, Duration::from_secs(900));
        assert_eq!(args.driver_name, "graceful-drain.io");
        assert_eq!(args.reconciler.mode, Mode::Auto);
        assert_eq!(
            registration::service_socket(&args.plugins_dir, &args.driver_name),
            PathBuf::from("/var/lib/kubelet/plugins/graceful-drain.io/slm.sock")
        );
        assert_eq!(
            registration::registration_socket(&args.registry_dir, &args.driver_name),
            PathBuf::from("/var/lib/kubelet/plugins_registry/graceful-drain.io-reg.sock")
        );
    }

    #[test]
    fn kubectl_style_flags_map_onto_the_drain_config() {
        let args = parse(&[
            "--ignore-daemonsets=false",
            "--delete-emptydir-data",
            "--force",
            "--disable-eviction",
            "--grace-period",
            "0",
            "--pod-selector",
            "app=web",
            "--skip-wait-for-delete-timeout",
            "60",
            "--drain-timeout",
            "5m",
            "--exclude-from-lb-label=false",
            "--lifecycle-reconciler",
            "off",
        ]);
        let config = args.drain.config().unwrap();
        assert!(!config.filters.ignore_daemonsets);
        assert!(config.filters.delete_emptydir_data && config.filters.force);
        assert!(config.disable_eviction);
        assert_eq!(config.grace_period, Some(0));
        assert_eq!(config.pod_selector.as_deref(), Some("app=web"));
        assert_eq!(
            config.filters.skip_wait_for_delete_timeout,
            Some(Duration::from_secs(60))
        );
        assert_eq!(config.timeout, Some(Duration::from_secs(300)));
        assert!(!args.drain.exclude_from_lb_label);
        assert_eq!(args.reconciler.mode, Mode::Off);
        assert_eq!(
            parse(&["--grace-period", "-1"])
                .drain
                .config()
                .unwrap()
                .grace_period,
            None
        );
    }

    #[test]
    fn tiers_are_validated_at_startup() {
        let tiers = r#"[{"name":"db","match":[{"namespaces":["db"]}]}]"#;
        let config = parse(&["--tiers", tiers, "--last-pod-selector", "app=ingress"])
            .drain
            .config()
            .unwrap();
        assert_eq!(config.tiers.names(), ["workloads", "db", "last"]);
        let defaults = parse(&[]).drain.config().unwrap();
        assert_eq!(defaults.tiers.names(), ["workloads", "system-critical"]);
        let twice = r#"[{"name":"db"},{"name":"db","match":[{"minPriority":1}]}]"#;
        let error = parse(&["--tiers", twice]).drain.config().unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"eviction tiers: two tiers are named "db""#
        );
        let error = parse(&["--last-pod-selector", "app in"]).drain.config();
        assert!(error.unwrap_err().to_string().contains(r#"tier "last""#));
    }

    #[test]
    fn node_name_is_required() {
        let error = Cli::try_parse_from(["node-agent"]).err().unwrap();
        assert!(error.to_string().contains("--node-name"), "{error}");
    }
}
