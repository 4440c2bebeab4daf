//! `graceful-drain webhook`: HTTPS admission server, deferred deleter and admin port.
//!
//! Data flow: four metadata-sized watches fill [`cache::Cache`]; each AdmissionReview is
//! parsed ([`review`]), decided as a pure function of the request and a cache snapshot
//! ([`decide`]), acted on ([`isolate`]: PDB accounting, relabelling patch, Event) and
//! answered ([`server`]). Isolated pods carry their own delete time; the deferred deleter
//! ([`deleter`]) deletes them (a refused ReplicaSet scale-down) or puts back those no
//! authenticated eviction or DELETE removed ([`restore`]) while this replica holds the
//! Lease ([`lease`]).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod admission;
pub mod cache;
pub mod configurations;
pub mod decide;
pub mod deleter;
pub mod disruption;
pub mod events;
pub mod isolate;
pub mod lease;
pub mod metrics;
pub mod nodepods;
pub mod probe;
pub mod recent;
pub mod release;
pub mod restore;
pub mod review;
pub mod server;
pub mod share;
pub mod state;
pub mod throttle;
pub mod tls;
pub mod transport;
pub mod uninstall;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Api;
use kube::api::PostParams;
use prometheus_client::registry::Registry;

pub use decide::Exposure;

use graceful_drain_core::admin::Readiness;
use graceful_drain_core::runtime::{Shutdown, spawn_owned};

/// Default deregistration delay: ALBs were seen routing to draining targets for 15–19 s
/// and kube-proxy needs about 1 s; 60 s covers that three times over. Operators with
/// longer target-group deregistration delays raise it per namespace or pod.
pub const DEFAULT_DEREGISTRATION_DELAY: &str = "60s";
/// Default request body limit: kube-apiserver refuses a request body over 3 MiB
/// (`MaxRequestBodyBytes`, staging/src/k8s.io/apiserver/pkg/server/config.go) and a pod is
/// at most ~1.5 MiB in etcd, so a DELETE review (the pod once) or an eviction review (a
/// tiny Eviction) never needs more than 3 MiB plus the review's envelope; a larger body did
/// not come from an API server.
pub const DEFAULT_MAX_BODY: usize = 3 * 1024 * 1024 + 256 * 1024;

/// The admission path's client: no hidden retries (kube retries 429/503/504 up to 15
/// times by default, far past any admission deadline). Its calls are bounded by the
/// review's deadline and the deleter's own timeout, not by a short read timeout: that
/// timer also runs on an idle pooled connection, kills it after that long, and the next
/// request sent on it fails ("connection error: timed out") — it delayed removals of
/// isolated pods by a whole retry pause and cut the deleter's watch whenever it was quiet.
fn admission_client(mut config: kube::Config) -> anyhow::Result<kube::Client> {
    config.default_retry = false;
    kube::Client::try_from(config).context("build admission client")
}

/// Arguments of `graceful-drain webhook`. Option groups are boxed so the CLI's
/// subcommand enum stays small.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// HTTPS address of the admission endpoints (port 0 picks one; the bound address is logged).
    #[arg(long, env = "GRACEFUL_DRAIN_LISTEN", default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Plain-HTTP admin address (/livez, /readyz, /metrics).
    #[arg(
        long,
        env = "GRACEFUL_DRAIN_ADMIN_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_listen: SocketAddr,
    /// Serving certificate, key and optional client CA.
    #[command(flatten)]
    pub tls: Box<TlsArgs>,
    /// The webhooks' timeoutSeconds; the budget of a held DELETE when the API server does
    /// not send one.
    #[arg(long, env = "GRACEFUL_DRAIN_WEBHOOK_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=30))]
    pub timeout_seconds: u32,
    /// Most DELETEs one replica holds at once; past it a DELETE goes through at once,
    /// unprotected (outcome `hold_limit`), rather than tie up one more API server seat.
    #[arg(long, env = "GRACEFUL_DRAIN_MAX_HELD_DELETES", default_value_t = server::MAX_HELD_DELETES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub max_held_deletes: usize,
    /// Default time between isolation and deletion.
    #[arg(long, env = "GRACEFUL_DRAIN_DEREGISTRATION_DELAY", default_value = DEFAULT_DEREGISTRATION_DELAY,
          value_parser = humantime::parse_duration)]
    pub deregistration_delay: Duration,
    /// Longest delay a pod or namespace annotation may ask for; longer ones are cut to it
    /// with a Warning Event (an isolated pod serves no new connections from its Services,
    /// and a typo like `5h` must not keep it for hours).
    #[arg(long, env = "GRACEFUL_DRAIN_MAX_DEREGISTRATION_DELAY", default_value = "10m",
          value_parser = humantime::parse_duration)]
    pub max_deregistration_delay: Duration,
    /// Namespace of the deleter's Lease.
    #[arg(
        long,
        env = "GRACEFUL_DRAIN_NAMESPACE",
        default_value = "graceful-drain"
    )]
    pub lease_namespace: String,
    /// Name of the deleter's Lease.
    #[arg(long, default_value = lease::DEFAULT_NAME)]
    pub lease_name: String,
    /// The webhook's own Deployment in the Lease namespace. When it is gone or being
    /// deleted at shutdown (`helm uninstall`), the deleter removes every isolated pod
    /// before exiting instead of leaving them to nobody.
    #[arg(long, env = "GRACEFUL_DRAIN_DEPLOYMENT", value_name = "NAME")]
    pub deployment: Option<String>,
    /// Holder identity in the Lease and Events (defaults to the hostname).
    #[arg(long, env = "GRACEFUL_DRAIN_POD_NAME")]
    pub identity: Option<String>,
    /// What the webhook handles and how (exposure, exclusions, kept labels, limits).
    #[command(flatten)]
    pub policy: Box<PolicyArgs>,
    /// The protection probe: proof that the API server calls the webhook.
    #[command(flatten)]
    pub probe: Box<probe::ProbeArgs>,
    /// How to reach the API server (`--kubeconfig`, `--context`).
    #[command(flatten)]
    pub kube: graceful_drain_core::kubeclient::KubeArgs,
}

/// Serving certificate options.
#[derive(Clone, Debug, clap::Args)]
pub struct TlsArgs {
    /// Serving certificate (PEM); re-read when it changes.
    #[arg(long, value_name = "FILE", default_value = "/tls/tls.crt")]
    pub tls_cert: PathBuf,
    /// Serving key (PEM); re-read when it changes.
    #[arg(long, value_name = "FILE", default_value = "/tls/tls.key")]
    pub tls_key: PathBuf,
    /// Serve only callers presenting a client certificate signed by this CA (PEM).
    #[arg(long, value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
}

/// What the webhook handles and how.
#[derive(Clone, Debug, clap::Args)]
pub struct PolicyArgs {
    /// Which pods count as exposed to load balancers.
    #[arg(long, value_enum, default_value_t, env = "GRACEFUL_DRAIN_EXPOSURE")]
    pub exposure: Exposure,
    /// An isolated pod never goes while an EndpointSlice still lists it (up to 10 minutes
    /// past its delete time), nor before its delay has passed since it left the last one;
    /// the deferred deleter also waits this margin more (default none).
    #[arg(long, value_name = "MARGIN", value_parser = humantime::parse_duration)]
    pub wait_for_endpoints: Option<Duration>,
    /// Namespaces never handled (repeatable), in addition to namespaces labelled
    /// `graceful-drain.io/exclude=true`.
    #[arg(long = "exclude-namespace", value_name = "NS", default_values_t = ["kube-system".to_string()])]
    pub exclude_namespaces: Vec<String>,
    /// Label keys an isolated pod keeps (repeatable or comma-separated), unless a selector
    /// it must leave consists only of kept keys. Use it for the keys NetworkPolicies,
    /// ServiceMonitors or dashboards select on (docs/webhook.md, "Relabelling").
    #[arg(
        long = "keep-label",
        value_name = "KEY",
        env = "GRACEFUL_DRAIN_KEEP_LABELS",
        value_delimiter = ','
    )]
    pub keep_labels: Vec<String>,
    /// Our own username(s), whose requests pass through (repeatable). Discovered with a
    /// SelfSubjectReview when not given.
    #[arg(
        long = "own-user",
        value_name = "USER",
        env = "GRACEFUL_DRAIN_OWN_USER",
        value_delimiter = ','
    )]
    pub own_users: Vec<String>,
    /// Largest accepted AdmissionReview body, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY)]
    pub max_body_bytes: usize,
    /// After SIGTERM keep serving this long (not ready) so the Service stops routing to
    /// us before we stop accepting.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_delay: Duration,
    /// How long after its delete time a pod isolated for an eviction or DELETE that nobody
    /// followed up goes back into its Services. Hidden: the default is the product's
    /// behaviour; tests shorten it.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, hide = true)]
    pub restore_after: Duration,
    /// How old a held pod's entry in the `disruptedPods` of a PDB still selecting it may
    /// get before it is rewritten (the disruption controller drops entries after two
    /// minutes). Hidden: the default is the product's behaviour; tests shorten it.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, hide = true)]
    pub disruption_renew_after: Duration,
    /// Confirmed release: a YAML file naming one load balancer (HAProxy's statistics, or a
    /// JSON admin API such as Envoy's or Traefik's) that is asked whether it still routes
    /// to an isolated pod; the pod's delay ends once it no longer does and no
    /// EndpointSlice lists it. The delay stays the upper bound, and runs whole whenever
    /// the balancer cannot be asked (docs/install.md, "Confirmed release").
    #[arg(long, value_name = "FILE", env = "GRACEFUL_DRAIN_BALANCER_CONFIG")]
    pub balancer_config: Option<PathBuf>,
    /// How often the load balancer of `--balancer-config` is asked (one GET each time,
    /// whatever the number of pods waiting).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub balancer_poll_interval: Duration,
}

/// The load balancer of `--balancer-config`, read and checked: an error names the file.
pub fn balancer_lister(path: &std::path::Path) -> anyhow::Result<balancer_routes::Lister> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read the balancer configuration {}", path.display()))?;
    let config: balancer_routes::BalancerConfig = serde_saphyr::from_str(&text)
        .with_context(|| format!("parse the balancer configuration {}", path.display()))?;
    balancer_routes::Lister::new(&config)
        .with_context(|| format!("the balancer configuration {}", path.display()))
}

fn default_identity() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("graceful-drain-{}", uuid::Uuid::new_v4()))
}

/// Asks the API server who we are, so our own DELETEs pass through.
async fn discover_own_user(client: &kube::Client) -> Option<String> {
    let api = Api::<SelfSubjectReview>::all(client.clone());
    match api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(review) => review.status?.user_info?.username,
        Err(error) => {
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "SelfSubjectReview failed; pass --own-user so our own deletes pass through");
            None
        }
    }
}

/// Marks readiness from the certificate and caches, and re-checks the certificate files
/// even when no handshake happens (so a broken rotation shows on /readyz).
async fn watch_readiness(
    resolver: Arc<tls::ReloadingResolver>,
    cache: Arc<cache::Cache>,
    readiness: Readiness,
    shutdown: Shutdown,
) -> Result<(), std::convert::Infallible> {
    let mut tick = tokio::time::interval(tls::RECHECK);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                readiness.not_ready("webhook", "shutting down");
                return Ok(());
            }
            _ = tick.tick() => {}
        }
        resolver.maybe_reload();
        if resolver.loaded() {
            readiness.ready("certificate");
        }
        if cache.synced() {
            readiness.ready("caches");
        }
        if cache.isolated_synced() {
            readiness.ready("isolated pods");
        }
        // Never take requests we would refuse to act on: isolating a pod nobody deletes
        // would leave it out of its Services for good.
        if cache.deleter_alive(jiff::Timestamp::now()) {
            readiness.ready("deleter");
        } else {
            readiness.not_ready("deleter", "no replica holds the deleter Lease");
        }
    }
}

/// The long-running pieces behind the admission endpoints.
struct Workers {
    ctx: isolate::Context,
    /// The probe's outcome, which the Lease holder publishes.
    protection: Arc<probe::Shared>,
    /// The deleter's client: without kube's hidden retries, so a PDB's 429 to its
    /// eviction comes back at once and the pod is deleted instead (kube would retry the
    /// 429 up to 15 times with backoff, holding the pod far past its delete time).
    deleter_client: kube::Client,
    resolver: Arc<tls::ReloadingResolver>,
    readiness: Readiness,
    metrics: Arc<metrics::Metrics>,
    lease_namespace: String,
    lease_name: String,
    wait_for_endpoints: Option<Duration>,
    /// The default and longest deregistration delay, which the deleter counts from a pod's
    /// leaving its last EndpointSlice as admission does.
    delays: (Duration, Duration),
    disruption_renew_after: Duration,
    deployment: Option<String>,
    /// Confirmed release: the balancer to ask and how often (`release`).
    release: Option<(balancer_routes::Lister, Duration)>,
}

/// Spawns the caches, readiness watcher, lease elector and deferred deleter as owned
/// tasks; returns the elector and deleter, whose shutdown work (releasing the Lease,
/// removing isolated pods at uninstall) must finish before the process exits.
fn spawn_workers(w: Workers, shutdown: &Shutdown) -> Vec<tokio::task::JoinHandle<()>> {
    let Workers {
        ctx,
        protection,
        deleter_client,
        resolver,
        readiness,
        metrics,
        lease_namespace,
        lease_name,
        wait_for_endpoints,
        delays,
        disruption_renew_after,
        deployment,
        release,
    } = w;
    let cache = ctx.cache.clone();
    let watches = cache::run(cache.clone(), ctx.client.clone());
    let stop = shutdown.clone();
    let watches = async move {
        tokio::select! {
            result = watches => result,
            () = stop.cancelled() => Ok(()),
        }
    };
    spawn_owned("cache", shutdown.clone(), watches);
    let ready = watch_readiness(resolver, cache.clone(), readiness, shutdown.clone());
    spawn_owned("readiness", shutdown.clone(), ready);
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(false);
    cache.enable_deleter_gate();
    let elector = lease::Elector::new(
        ctx.client.clone(),
        &lease_namespace,
        &lease_name,
        &ctx.identity,
    )
    .reporting_to(cache.clone())
    .publishing(protection);
    let lease = spawn_owned(
        "lease",
        shutdown.clone(),
        elector.run(leader_tx, shutdown.clone()),
    );
    let release_ctx = ctx.clone();
    let deleter_ctx = isolate::Context {
        client: deleter_client,
        ..ctx
    };
    let mut deleter = deleter::Deleter::new(deleter_ctx, metrics.clone(), wait_for_endpoints)
        .counting_delays(delays.0, delays.1)
        .renewing_disruptions_after(disruption_renew_after);
    if let Some((lister, every)) = release {
        let board = release::Board::default();
        deleter = deleter.publishing_to(board.clone());
        let release = release::Release::new(release_ctx, lister, every, board, metrics);
        let running = release.run(leader_rx.clone(), shutdown.clone());
        spawn_owned("release", shutdown.clone(), running);
    }
    if let Some(name) = &deployment {
        deleter = deleter.finishing_on_uninstall(&lease_namespace, name);
    }
    let deleter = spawn_owned(
        "deleter",
        shutdown.clone(),
        deleter.run(leader_rx, shutdown.clone()),
    );
    vec![lease, deleter]
}

/// Serves the admission endpoints until `shutdown`, in two stages: first stay up (not
/// ready) for `delay` so the Service stops routing to us, then stop accepting and answer
/// held reviews at once.
async fn serve_admission(
    listen: SocketAddr,
    app: axum::Router,
    tls_config: Arc<rustls::ServerConfig>,
    holds: Shutdown,
    (readiness, delay): (Readiness, Duration),
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind webhook port {listen}"))?;
    let bound = listener.local_addr().context("webhook local address")?;
    tracing::info!(addr = %bound, "admission webhook listening (HTTPS)");
    let serving = Shutdown::new();
    let stages = {
        let serving = serving.clone();
        async move {
            shutdown.cancelled().await;
            readiness.not_ready("webhook", "shutting down");
            tokio::time::sleep(delay).await;
            holds.cancel();
            serving.cancel();
        }
    };
    tokio::spawn(stages);
    server::serve(listener, tls_config, app, serving).await?;
    Ok(())
}

/// Our own usernames: the flag, else what a SelfSubjectReview says.
async fn own_users(client: &kube::Client, given: Vec<String>) -> BTreeSet<String> {
    let mut own: BTreeSet<String> = given.into_iter().collect();
    if own.is_empty() {
        own.extend(discover_own_user(client).await);
    }
    own
}

/// Runs the webhook until `shutdown`: clients, caches and the acting context, the probe,
/// the workers (caches, deleter, restorer), the admin port, then the admission port;
/// after it the workers finish and an uninstall releases our rights.
pub async fn run(args: Args, shutdown: Shutdown) -> anyhow::Result<()> {
    let (tls, policy) = (*args.tls, *args.policy);
    // A configuration that cannot be used stops the start, naming its file.
    let release = match &policy.balancer_config {
        Some(path) => Some((balancer_lister(path)?, policy.balancer_poll_interval)),
        None => None,
    };
    let (client, admission) = clients(&args.kube).await?;
    // With the pod's own name (the chart's downward API), a lost protection is a Warning
    // Event on this pod.
    let own_pod = args
        .identity
        .clone()
        .map(|name| (args.lease_namespace.clone(), name));
    let identity = args.identity.unwrap_or_else(default_identity);
    let own = own_users(&client, policy.own_users.clone()).await;
    tracing::info!(%identity, own_users = ?own, "starting webhook");

    let mut registry = Registry::default();
    let metrics = Arc::new(metrics::Metrics::new(&mut registry));
    let readiness = readiness_gates();
    let (resolver, tls_config) = serving_tls(&tls)?;
    let ctx = acting_context(client, identity, &policy, &shutdown);
    let admission_ctx = isolate::Context {
        client: admission,
        ..ctx.clone()
    };
    let uninstall = args.deployment.clone().map(|name| {
        (
            ctx.client.clone(),
            args.lease_namespace.clone(),
            name,
            own.clone(),
        )
    });
    if let Some((client, namespace, name, own)) = &uninstall {
        uninstall::adopt(client, namespace, name, own).await;
    }
    let protection = start_probe(&ctx, *args.probe, own_pod, &metrics, &shutdown);
    // Every replica counts the unconfirmed share in one Lease beside the deleter's.
    let unconfirmed = share::Unconfirmed::shared(
        admission_ctx.client.clone(),
        &args.lease_namespace,
        &share::lease_name(&args.lease_name),
    );
    let finishing = spawn_workers(
        Workers {
            ctx,
            protection,
            deleter_client: admission_ctx.client.clone(),
            resolver,
            readiness: readiness.clone(),
            metrics: metrics.clone(),
            lease_namespace: args.lease_namespace,
            lease_name: args.lease_name,
            wait_for_endpoints: policy.wait_for_endpoints,
            delays: (args.deregistration_delay, args.max_deregistration_delay),
            disruption_renew_after: policy.disruption_renew_after,
            deployment: args.deployment,
            release,
        },
        &shutdown,
    );
    start_admin(args.admin_listen, readiness.clone(), registry, &shutdown).await?;

    let settings = decide::Settings {
        default_delay: args.deregistration_delay,
        max_delay: args.max_deregistration_delay,
        exposure: policy.exposure,
        own_users: own,
    };
    let limits = (
        args.timeout_seconds,
        args.max_held_deletes,
        tls.client_ca.is_some(),
    );
    let state = admission_state(admission_ctx, settings, metrics, limits, unconfirmed);
    let holds = state.shutdown.clone();
    let app = server::router(Arc::new(state), policy.max_body_bytes);
    let stage = (readiness, policy.shutdown_delay);
    let stop = shutdown.clone();
    let served = serve_admission(args.listen, app, tls_config, holds, stage, shutdown).await;
    // Normally already cancelled; after a failed bind it stops the workers too.
    stop.cancel();
    finish(finishing, uninstall).await;
    served
}

/// What the admission handlers share: `limits` are `--timeout-seconds`,
/// `--max-held-deletes` and whether every connection presents a client certificate of
/// `--client-ca`.
fn admission_state(
    ctx: isolate::Context,
    settings: decide::Settings,
    metrics: Arc<metrics::Metrics>,
    (timeout_seconds, max_held_deletes, reviews_authenticated): (u32, usize, bool),
    unconfirmed: share::Unconfirmed,
) -> server::AppState {
    server::AppState {
        ctx,
        settings,
        metrics,
        default_timeout: Duration::from_secs(u64::from(timeout_seconds)),
        shutdown: Shutdown::new(),
        holds: server::Holds::bounded(max_held_deletes),
        watch_drained_nodes: true,
        unconfirmed,
        scale_downs: Default::default(),
        controllers: Default::default(),
        throttles: Default::default(),
        reviews_authenticated,
    }
}

/// The webhook's client, and the admission handlers' (which makes no hidden retries).
async fn clients(
    kube: &graceful_drain_core::kubeclient::KubeArgs,
) -> anyhow::Result<(kube::Client, kube::Client)> {
    let config = kube.config().await?;
    let client = kube::Client::try_from(config.clone()).context("build client")?;
    Ok((client, admission_client(config)?))
}

/// The readiness gates, each closed until its part is ready.
fn readiness_gates() -> Readiness {
    let readiness = Readiness::default();
    readiness.register("certificate", "serving certificate not loaded");
    readiness.register("caches", "caches not synced");
    readiness.register("isolated pods", "watch of isolated pods not synced");
    readiness.register("deleter", "no replica holds the deleter Lease");
    readiness.ready("webhook");
    readiness
}

/// The serving certificate's resolver (re-read on rotation) and the TLS configuration
/// that uses it, with `--client-ca` when given.
fn serving_tls(
    tls: &TlsArgs,
) -> anyhow::Result<(Arc<tls::ReloadingResolver>, Arc<rustls::ServerConfig>)> {
    let resolver = Arc::new(tls::ReloadingResolver::new(
        tls.tls_cert.clone(),
        tls.tls_key.clone(),
    ));
    if let Err(error) = resolver.reload() {
        tracing::warn!(error = %graceful_drain_core::error::chain(&error), "serving certificate not available yet; retrying");
    }
    let config = tls::server_config(resolver.clone(), tls.client_ca.as_deref())?;
    Ok((resolver, Arc::new(config)))
}

/// What isolating pods needs, with its Event sender started: admission calls and the
/// deleter queue their Events for one sender, which groups those of one controller's
/// pods (see `events`).
fn acting_context(
    client: kube::Client,
    identity: String,
    policy: &PolicyArgs,
    shutdown: &Shutdown,
) -> isolate::Context {
    let (events, queue) = tokio::sync::mpsc::channel(isolate::EVENT_QUEUE);
    let sender = events::send(client.clone(), queue, shutdown.clone());
    spawn_owned("events", shutdown.clone(), sender);
    isolate::Context {
        client,
        cache: Arc::new(cache::Cache::new(policy.exclude_namespaces.clone())),
        identity,
        events: isolate::EventSink::Queue(events),
        keep_labels: policy.keep_labels.iter().cloned().collect(),
        restore_after: policy.restore_after,
        gates: Default::default(),
        owners: Default::default(),
        nodes: Default::default(),
    }
}

/// Starts the protection probe; what it last found is in the returned share.
fn start_probe(
    ctx: &isolate::Context,
    args: probe::ProbeArgs,
    own_pod: Option<(String, String)>,
    metrics: &Arc<metrics::Metrics>,
    shutdown: &Shutdown,
) -> Arc<probe::Shared> {
    let protection = Arc::new(probe::Shared::default());
    let reporter = probe::Reporter {
        ctx: ctx.clone(),
        pod: own_pod,
    };
    let probing = probe::run(
        ctx.client.clone(),
        args,
        protection.clone(),
        metrics.clone(),
        reporter,
        shutdown.clone(),
    );
    spawn_owned("probe", shutdown.clone(), probing);
    protection
}

/// Binds the admin port (`/livez`, `/readyz`, `/metrics`) and serves it until shutdown.
async fn start_admin(
    listen: SocketAddr,
    readiness: Readiness,
    registry: Registry,
    shutdown: &Shutdown,
) -> anyhow::Result<()> {
    let registry = Arc::new(registry);
    let (addr, admin) =
        graceful_drain_core::admin::bind(listen, readiness, registry, shutdown.clone()).await?;
    tracing::info!(admin_addr = %addr, "admin port listening");
    spawn_owned("admin", shutdown.clone(), admin);
    Ok(())
}

/// Waits for the workers to finish, then, at an uninstall, releases our rights: only
/// now, with the isolated pods deleted or restored, may they go.
async fn finish(
    finishing: Vec<tokio::task::JoinHandle<()>>,
    uninstall: Option<(kube::Client, String, String, BTreeSet<String>)>,
) {
    for task in finishing {
        if let Err(error) = task.await {
            tracing::warn!(%error, "worker did not finish cleanly");
        }
    }
    if let Some((client, namespace, name, own)) = uninstall {
        uninstall::release_bindings(&client, &namespace, &name, &own).await;
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

    #[test]
    fn isolated_pods_nobody_removes_go_back_a_minute_after_their_delete_time_by_default() {
        let cli = Cli::try_parse_from(["webhook"]).unwrap();
        assert_eq!(cli.args.policy.restore_after, isolate::RESTORE_AFTER);
        let cli = Cli::try_parse_from(["webhook", "--restore-after", "2s"]).unwrap();
        assert_eq!(cli.args.policy.restore_after, Duration::from_secs(2));
    }
}
