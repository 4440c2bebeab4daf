//! `graceful-drain simulate`: graceful-drain's components run against the simulated
//! cluster of `kube-sim` (docs/design.md §7).
//!
//! [`scenario`] runs the drain and rollout scenarios with and without graceful-drain and the
//! scenario matrix; [`vmhost`] is the simulated VM host behind the maintenance hooks;
//! [`command`] holds our components' command lines, shared with the tests and benches;
//! [`setup`] gives every cluster what graceful-drain needs of it; [`console`] decides
//! where the components' logs go and prints the progress lines.
//! `simulate` runs the scenarios and prints a table, or with `--serve` keeps a cluster up
//! for `kubectl` and separately started components.

pub mod command;
pub mod console;
pub mod scenario;
pub mod setup;
pub mod vmhost;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use self::scenario::ScenarioConfig;
use self::scenario::components::ComponentsConfig;
use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{ClusterConfig, WebSpec};
use kube_sim::controllers::kubelet::KubeletConfig;
use kube_sim::lb::{LbConfig, LbKind, LbModel};
use kube_sim::traffic::TrafficConfig;
use kube_sim::traffic::apps::Behaviour;
use kube_sim::traffic::clients::{Clients, KeepAliveConfig};
use kube_sim::{apiserver, controllers};

/// How often `--serve` prints the traffic counters.
const SERVE_REPORT_EVERY: Duration = Duration::from_secs(10);
/// Upper bound of a `--serve` session's traffic (the generator is always bounded).
const SERVE_MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Arguments of `graceful-drain simulate`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Keep the default cluster (nodes, the Deployment, its Service and PDB, traffic) up
    /// without any graceful-drain component, until interrupted; print the kubeconfig path.
    #[arg(long)]
    pub serve: bool,
    /// With --serve: where to write the admin kubeconfig (default: a file in the
    /// temporary directory).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig_out: Option<PathBuf>,
    /// With --serve: address of the simulated API server (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Where the API server connects for a webhook Service's endpoint, so a webhook
    /// started as a separate process plays the pod: `NAMESPACE/NAME=ADDR` for every
    /// endpoint of that Service, or `ENDPOINT_IP:PORT=ADDR` for one (repeatable). The
    /// call still goes to a ready endpoint of the Service's EndpointSlices first.
    #[arg(long = "route-service", value_name = "NS/NAME|IP:PORT=ADDR")]
    pub routes: Vec<apiserver::Route>,
    /// PEM certificate the API server presents to admission webhooks (with
    /// --webhook-client-key), for webhooks that require client certificates.
    #[arg(long, value_name = "FILE", requires = "webhook_client_key")]
    pub webhook_client_cert: Option<PathBuf>,
    /// PEM private key of --webhook-client-cert.
    #[arg(long, value_name = "FILE", requires = "webhook_client_cert")]
    pub webhook_client_key: Option<PathBuf>,
    /// Worker nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Replicas of the Deployment.
    #[arg(long, default_value_t = 4)]
    pub replicas: i32,
    /// minAvailable of the PodDisruptionBudget (default: replicas - 1).
    #[arg(long)]
    pub min_available: Option<i32>,
    /// terminationGracePeriodSeconds of the pods.
    #[arg(long, default_value_t = 30)]
    pub grace_period_seconds: i64,
    /// Time from a pod's binding to its app serving and the pod being Ready.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub start_delay: Duration,
    /// How long an app keeps accepting new requests after SIGTERM.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub accept_after_sigterm: Duration,
    /// How long after SIGTERM an app exits.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub exit_after_sigterm: Duration,
    /// From "ready in the EndpointSlice" to "receives requests from the load balancer".
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub registration_lag: Duration,
    /// How long the load balancer keeps sending new requests to a removed target.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub deregistration_lag: Duration,
    /// Kind of the load balancer of a Service without the
    /// `sim.graceful-drain.io/load-balancer` annotation: `alb` (per request) or `nlb`
    /// (per connection, as kube-proxy). With --real or --kubeconfig, `haproxy` also puts
    /// a real load balancer in front of every row's workload — HAProxy finding the pods
    /// through CoreDNS (`bash .ci/balancers.sh` provides both) — with traffic of its own:
    /// the table gains the 5xx HAProxy answered (`5xx-haproxy`), and the row
    /// `drain-haproxy-retries` runs.
    #[arg(long, value_enum, default_value = "alb", value_name = "KIND")]
    pub load_balancer: LoadBalancer,
    /// LB nodes of an ALB, each with its own deregistration lag.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub alb_nodes: usize,
    /// Each ALB node's deregistration lag is drawn within ± this share of
    /// --deregistration-lag.
    #[arg(long, default_value_t = 0.0, value_name = "SHARE", value_parser = parse_share)]
    pub alb_lag_jitter: f64,
    /// From an EndpointSlice change to the ALB's target change.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub alb_controller_latency: Duration,
    /// What apps do with SIGTERM unless their pod's `sim.graceful-drain.io/app`
    /// annotation says: `graceful` (stop accepting, close idle connections, finish
    /// requests in flight, exit) or `naive` (serve until killed at --exit-after-sigterm).
    #[arg(long, default_value = "graceful", value_name = "BEHAVIOUR")]
    pub app: Behaviour,
    /// Keep-alive clients sending requests one after the other on their connection
    /// (together at --rate); 0 sends every request on a connection of its own.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub keep_alive_clients: usize,
    /// With --keep-alive-clients: share of requests lasting about --long-request-duration.
    #[arg(long, default_value_t = 0.0, value_name = "SHARE", value_parser = parse_share)]
    pub long_request_share: f64,
    /// With --keep-alive-clients: how long a long request takes (about).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub long_request_duration: Duration,
    /// Seed of the load balancers' and clients' random choices.
    #[arg(long, default_value_t = 0)]
    pub traffic_seed: u64,
    /// graceful-drain webhook's --deregistration-delay.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub deregistration_delay: Duration,
    /// graceful-drain webhook's --timeout-seconds (and the configurations' timeoutSeconds).
    #[arg(long, default_value_t = 10)]
    pub webhook_timeout_seconds: u32,
    /// Requests per second through the load balancer.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long each request takes.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub request_duration: Duration,
    /// Bound of each phase (deploy, drain, rollout).
    #[arg(long, default_value = "40s", value_parser = humantime::parse_duration)]
    pub phase_timeout: Duration,
    /// Print the timeline of every run after the table.
    #[arg(long)]
    pub timeline: bool,
    /// Run the scenario matrix (every named scenario, without and with graceful-drain)
    /// instead of the quick default; exits non-zero when a row differs from what its
    /// scenario expects.
    #[arg(long, conflicts_with = "serve")]
    pub matrix: bool,
    /// Run only this scenario of the matrix (repeatable); `--list-scenarios` names them.
    #[arg(long = "scenario", value_name = "NAME", value_parser = parse_scenario, conflicts_with = "serve")]
    pub scenarios: Vec<String>,
    /// List the matrix scenarios with one line each, and exit.
    #[arg(long)]
    pub list_scenarios: bool,
    /// Run the real tier's rows (drain, rollout restart, scale down and up; without, then
    /// with graceful-drain) on a real control plane started from the cache (`cargo xtask
    /// control-plane build`): its controllers, scheduler and admission are the real ones,
    /// the simulator plays only kubelets, load balancers and traffic. With --matrix or
    /// --scenario: the matrix's scenarios instead, each row on a fresh control plane.
    #[arg(long, conflicts_with = "serve")]
    pub real: bool,
    /// Like --real, against the API server of this kubeconfig (a cluster administrator
    /// that may impersonate; the simulator registers its own Nodes there).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["serve", "matrix", "scenarios"])]
    pub kubeconfig: Option<PathBuf>,
    /// With --real: leave the EvictionRequest API (lifecycle.k8s.io/v1alpha1) off.
    #[arg(long, requires = "real")]
    pub no_eviction_request_api: bool,
    /// With --real or --kubeconfig: run only this row of the real tier (repeatable), by
    /// its scenario name (drain, rollout-restart, statefulset-long-delay, …).
    #[arg(long = "row", value_name = "NAME")]
    pub rows: Vec<String>,
    /// With --real or --kubeconfig: run the rows in an order shuffled by this seed (the
    /// unprotected ones still first, uninstall-mid-drain still last); every row sets up
    /// what it needs itself, so any order must pass.
    #[arg(long, value_name = "SEED")]
    pub shuffle_rows: Option<u64>,
    /// With --real: print the names of the real tier's rows (what --row takes), one per
    /// line, and exit.
    #[arg(long)]
    pub list_rows: bool,
    /// With --real or --kubeconfig: instead of the rows, time how fast the ReplicaSet,
    /// StatefulSet and DaemonSet controllers create pods while the webhook holds DELETEs,
    /// and print a table (a benchmark: it asserts nothing).
    #[arg(long)]
    pub holds_bench: bool,
    /// How long the disruption controller counts a pod an eviction recorded in a PDB's
    /// `disruptedPods` as disrupted while it is not deleted (upstream DeletionTimeout).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub pdb_deletion_timeout: Duration,
    /// ReplicaSets the ReplicaSet controller syncs at once, each waiting for its DELETE
    /// calls (upstream `--concurrent-replicaset-syncs`).
    #[arg(long, default_value_t = controllers::replicaset::DEFAULT_WORKERS)]
    pub replicaset_workers: usize,
    /// Pods each simulated kubelet holds (its `--max-pods`, reported as
    /// `status.allocatable.pods`); the scheduler leaves the rest Pending.
    #[arg(long, default_value_t = kube_sim::cluster::DEFAULT_MAX_PODS)]
    pub max_pods: usize,
    /// Fault: share (0.0–1.0) of API requests answered 429 TooManyRequests, as API
    /// Priority and Fairness does under load (cluster admins are exempt).
    #[arg(long, default_value_t = 0.0, value_name = "SHARE", value_parser = parse_share)]
    pub fault_throttle_share: f64,
    /// Fault: Retry-After seconds of a throttled request.
    #[arg(long, default_value_t = 1, value_name = "SECONDS")]
    pub fault_throttle_retry_after: u64,
    /// Fault: latency added to every API request.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub fault_latency: Duration,
    /// Fault: cut every watch with a 410 Gone ERROR event after about this long (half to
    /// one and a half times it), forcing watchers to relist.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub fault_watch_gone_after: Option<Duration>,
    /// Seed of the faults' random choices (same seed, same faults for the same requests).
    #[arg(long, default_value_t = 0)]
    pub fault_seed: u64,
    /// Write the components' logs (webhook, node agents, simulated cluster) to stderr
    /// instead of a file.
    #[arg(short, long, conflicts_with = "log_file")]
    pub verbose: bool,
    /// Where the components' logs go (default: `simulate.log` in a new directory under
    /// the temporary directory; `--serve` logs to stderr unless given).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

/// The load balancer in front of the workload (`--load-balancer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadBalancer {
    /// The simulated ALB: per request, through several LB nodes.
    Alb,
    /// The simulated NLB: per connection, as kube-proxy.
    Nlb,
    /// HAProxy 2.6 with DNS service discovery through CoreDNS, beside the simulated ALB
    /// (the real tier only).
    Haproxy,
}

impl LoadBalancer {
    /// The simulated load balancers' kind.
    fn simulated(self) -> LbKind {
        match self {
            LoadBalancer::Nlb => LbKind::Nlb,
            LoadBalancer::Alb | LoadBalancer::Haproxy => LbKind::Alb,
        }
    }
}

/// Accepts the name of a matrix scenario.
fn parse_scenario(text: &str) -> Result<String, String> {
    match scenario::matrix::find(text) {
        Some(s) => Ok(s.name.to_string()),
        None => {
            let names: Vec<&str> = scenario::matrix::scenarios()
                .iter()
                .map(|s| s.name)
                .collect();
            Err(format!("no scenario {text:?}; known: {}", names.join(", ")))
        }
    }
}

/// Parses a share between 0 and 1.
fn parse_share(text: &str) -> Result<f64, String> {
    let share: f64 = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if (0.0..=1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("{share} is not between 0 and 1"))
    }
}

impl Args {
    /// The scenario configuration these flags describe.
    pub fn scenario(&self) -> ScenarioConfig {
        let webhook_client_cert = match (&self.webhook_client_cert, &self.webhook_client_key) {
            (Some(cert), Some(key)) => Some(apiserver::ClientCert {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        let api = apiserver::Config {
            addr: self.listen,
            routes: self.routes.clone(),
            webhook_client_cert,
            faults: apiserver::Faults {
                throttle_share: self.fault_throttle_share,
                throttle_retry_after: self.fault_throttle_retry_after,
                latency: self.fault_latency,
                watch_gone_after: self.fault_watch_gone_after,
                seed: self.fault_seed,
                ..apiserver::Faults::default()
            },
            ..apiserver::Config::default()
        };
        let cluster = ClusterConfig {
            nodes: self.nodes,
            kubelet: KubeletConfig {
                start_delay: self.start_delay,
                accept_after_sigterm: self.accept_after_sigterm,
                exit_after_sigterm: self.exit_after_sigterm,
            },
            lb: LbConfig {
                registration_lag: self.registration_lag,
                deregistration_lag: self.deregistration_lag,
            },
            lb_model: LbModel {
                default_kind: self.load_balancer.simulated(),
                alb_nodes: self.alb_nodes,
                alb_lag_jitter: self.alb_lag_jitter,
                alb_controller_latency: self.alb_controller_latency,
                seed: self.traffic_seed,
            },
            app: self.app,
            api,
            disruption_timeout: self.pdb_deletion_timeout,
            replicaset_workers: self.replicaset_workers,
            max_pods: self.max_pods,
            // graceful-drain's CRDs and draining label are added where the cluster starts
            // (`setup`).
            ..ClusterConfig::default()
        };
        let web = WebSpec {
            replicas: self.replicas,
            min_available: self.min_available.unwrap_or(self.replicas - 1),
            grace_period_seconds: self.grace_period_seconds,
            max_surge: IntOrString::String("25%".into()),
            max_unavailable: IntOrString::String("25%".into()),
            ..WebSpec::default()
        };
        let traffic = TrafficConfig {
            rate: self.rate,
            request_duration: self.request_duration,
            // Enough for a phase at full rate plus settling; the duration bound is the real one.
            max_requests: (self.rate * (self.phase_timeout.as_secs_f64() * 2.0 + 60.0)) as u64,
            max_duration: self.phase_timeout * 2 + Duration::from_secs(60),
        };
        let clients = match self.keep_alive_clients {
            0 => Clients::PerRequest,
            connections => Clients::KeepAlive(KeepAliveConfig {
                connections,
                long_share: self.long_request_share,
                long_duration: self.long_request_duration,
                seed: self.traffic_seed,
            }),
        };
        let components = ComponentsConfig {
            deregistration_delay: self.deregistration_delay,
            timeout_seconds: self.webhook_timeout_seconds,
            agent_program: None,
            confirmed_release: false,
            balancer_stats: None,
        };
        ScenarioConfig {
            cluster,
            web,
            traffic,
            clients,
            components,
            phase_timeout: self.phase_timeout,
            balancer: None,
        }
    }
}

/// Runs the default scenario, the matrix (`--matrix`, `--scenario`), or serves the
/// cluster with `--serve`. A failed run ends with the last lines of the components' log
/// file, if they went to one ([`console::init_logging`]).
pub async fn run(args: Args, shutdown: Shutdown) -> anyhow::Result<()> {
    let outcome = dispatch(&args, shutdown).await;
    if outcome.is_err()
        && let Some(path) = &args.log_file
    {
        console::print_log_tail(path);
    }
    outcome
}

async fn dispatch(args: &Args, shutdown: Shutdown) -> anyhow::Result<()> {
    if args.serve {
        return serve(args, shutdown).await;
    }
    if args.list_scenarios {
        for s in scenario::matrix::scenarios() {
            println!("{:<33} {}", s.name, s.about);
        }
        return Ok(());
    }
    if args.real || args.kubeconfig.is_some() {
        return run_real(args, shutdown).await;
    }
    anyhow::ensure!(
        args.load_balancer != LoadBalancer::Haproxy,
        "--load-balancer haproxy runs on the real tier only (with --real or --kubeconfig)"
    );
    if args.matrix || !args.scenarios.is_empty() {
        return run_matrix(args, shutdown).await;
    }
    run_default(args, shutdown).await
}

/// The default scenario: drain and rollout, without and with graceful-drain, on two
/// clusters side by side; the table and a verdict on stdout, progress on stderr.
async fn run_default(args: &Args, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut cfg = args.scenario();
    // Two clusters run side by side: each API server takes a free port.
    cfg.cluster.api.addr = apiserver::Config::default().addr;
    eprintln!("starting two simulated clusters, one without and one with graceful-drain…");
    let rows = scenario::run_all_reporting(&cfg, &shutdown, &console::report).await;
    let verdict = scenario::verdict(&rows);
    print!("{}", scenario::table(&rows));
    println!("{}", verdict.line);
    println!(
        "\nmore: `graceful-drain simulate --matrix` runs {} scenarios (StatefulSets, DaemonSets, NLBs, keep-alive clients, PDB kinds, API 429s, restarts) as a scoreboard; --list-scenarios names them",
        scenario::matrix::scenarios().len()
    );
    if args.timeline {
        for row in &rows {
            println!("\n{} / {}:", row.scenario, row.protection);
            for event in row
                .result
                .as_ref()
                .map(|m| m.timeline.as_slice())
                .unwrap_or_default()
            {
                println!("  {event}");
            }
        }
    }
    anyhow::ensure!(
        verdict.passed,
        "some scenarios did not behave as expected (see the verdict)"
    );
    Ok(())
}

async fn run_matrix(args: &Args, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut cfg = args.scenario();
    cfg.cluster.api.addr = apiserver::Config::default().addr;
    let selected = selected_scenarios(args);
    eprintln!(
        "running {} scenarios, each without and with graceful-drain",
        selected.len()
    );
    let started = std::time::Instant::now();
    let report =
        scenario::matrix::run(&cfg, &selected, &shutdown, |row| report_row(started, row)).await;
    print_matrix(args, &report)
}

/// The scenarios `--scenario` names, or all of them.
fn selected_scenarios(args: &Args) -> Vec<scenario::spec::Scenario> {
    if args.scenarios.is_empty() {
        scenario::matrix::scenarios()
    } else {
        args.scenarios
            .iter()
            .filter_map(|name| scenario::matrix::find(name))
            .collect()
    }
}

/// One line on stderr as a matrix row finishes.
fn report_row(started: std::time::Instant, row: &scenario::matrix::Row) {
    let outcome = match &row.result {
        Ok(m) => format!("{} requests, {} 5xx", m.requests, m.errors_5xx),
        Err(e) => format!("error: {e}"),
    };
    eprintln!(
        "[{:>5.0}s] {} / {}: {outcome}",
        started.elapsed().as_secs_f64(),
        row.scenario,
        row.protection
    );
}

/// The matrix's table, the timelines asked for or of unexpected rows, and the verdict.
fn print_matrix(args: &Args, report: &scenario::matrix::Report) -> anyhow::Result<()> {
    print!("{}", scenario::matrix::table(report));
    // Failed or unexpected rows are explained even without --timeline.
    for row in &report.rows {
        if args.timeline || row.unexpected.is_some() {
            println!("\n{} / {}:", row.scenario, row.protection);
            for event in &row.timeline {
                println!("  {event}");
            }
        }
    }
    anyhow::ensure!(
        report.passed(),
        "some scenarios did not behave as expected (see the check column)"
    );
    Ok(())
}

/// The configuration of a real-tier run: the node agents run as processes of this binary,
/// each with its own ServiceAccount token, as on nodes.
fn real_scenario(args: &Args) -> anyhow::Result<scenario::ScenarioConfig> {
    let mut cfg = args.scenario();
    let program = std::env::current_exe().context("find this binary to run the node agents")?;
    cfg.components.agent_program = Some(program);
    Ok(cfg)
}

/// `--matrix --real`: the matrix's scenarios, each row on a fresh control plane of ours.
async fn run_real_matrix(args: &Args, shutdown: Shutdown) -> anyhow::Result<()> {
    let cfg = real_scenario(args)?;
    let versions = kube_control_plane::Versions::default();
    let options = kube_control_plane::cached_options(!args.no_eviction_request_api, Vec::new())?;
    let selected = selected_scenarios(args);
    eprintln!(
        "running {} scenarios on {versions}, each without and with graceful-drain, each row on a fresh control plane",
        selected.len()
    );
    let fresh = || {
        let options = options.clone();
        async move {
            let dir =
                scenario::components::TempDir::new("gd-real-matrix").map_err(|e| e.to_string())?;
            let path = dir.path().to_path_buf();
            let cp = tokio::task::spawn_blocking(move || kube_control_plane::up(&path, &options))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| graceful_drain_core::error::chain(&e).to_string())?;
            let plane: scenario::matrix::Plane = (cp.admin_kubeconfig(), Box::new((cp, dir)));
            Ok(plane)
        }
    };
    let started = std::time::Instant::now();
    let report = scenario::matrix::run_real(&cfg, &selected, fresh, &shutdown, |row| {
        report_row(started, row)
    })
    .await;
    print_matrix(args, &report)
}

/// The real tier: a control plane of our own (`--real`) or the user's (`--kubeconfig`).
async fn run_real(args: &Args, shutdown: Shutdown) -> anyhow::Result<()> {
    if args.matrix || !args.scenarios.is_empty() {
        anyhow::ensure!(
            args.load_balancer != LoadBalancer::Haproxy,
            "--load-balancer haproxy runs the real tier's rows, not the matrix"
        );
        return run_real_matrix(args, shutdown).await;
    }
    let cfg = real_scenario(args)?;
    let known: std::collections::BTreeSet<String> = scenario::real::scenarios(false, true, true)
        .iter()
        .map(|s| s.disruption.to_string())
        .collect();
    if args.list_rows {
        for name in &known {
            println!("{name}");
        }
        return Ok(());
    }
    if let Some(unknown) = args.rows.iter().find(|r| !known.contains(*r)) {
        let names: Vec<&str> = known.iter().map(String::as_str).collect();
        anyhow::bail!(
            "--row {unknown}: no such row of the real tier (rows: {})",
            names.join(", ")
        );
    }
    let mut control_plane = None;
    let kubeconfig = match &args.kubeconfig {
        Some(path) => path.clone(),
        None => {
            let versions = kube_control_plane::Versions::default();
            let dir = scenario::components::TempDir::new("gd-real")?;
            let path = dir.path().to_path_buf();
            eprintln!("starting {versions} in {}", path.display());
            let api = !args.no_eviction_request_api;
            let cp = tokio::task::spawn_blocking(move || {
                kube_control_plane::up_cached(&path, api, Vec::new())
            })
            .await??;
            let kubeconfig = cp.admin_kubeconfig();
            control_plane = Some((cp, dir));
            kubeconfig
        }
    };
    if args.holds_bench {
        let report = scenario::holds::run(&kubeconfig, &cfg, &shutdown).await;
        if let Some((mut cp, _dir)) = control_plane {
            if report.is_err() {
                eprintln!("{}", cp.log_tails(20));
            }
            tokio::task::spawn_blocking(move || cp.stop()).await??;
        }
        print!("{}", scenario::holds::table(&report?));
        return Ok(());
    }
    let started = std::time::Instant::now();
    // The fault rows restart components of the control plane this run started.
    let shared =
        control_plane.map(|(cp, dir)| (std::sync::Arc::new(std::sync::Mutex::new(cp)), dir));
    let restart = shared.as_ref().map(|(cp, _)| {
        let cp = cp.clone();
        let restart: scenario::real::Restart =
            std::sync::Arc::new(move |component: &'static str| {
                cp.lock()
                    .map_err(|e| e.to_string())?
                    .restart(component)
                    .map_err(|e| e.to_string())
            });
        restart
    });
    let options = scenario::real::RunOptions {
        only: args.rows.clone(),
        shuffle: args.shuffle_rows,
        restart,
        haproxy: args.load_balancer == LoadBalancer::Haproxy,
    };
    let outcome = scenario::real::run(&kubeconfig, &cfg, options, &shutdown, &mut |row| {
        let outcome = match &row.result {
            Ok(m) => format!(
                "{} requests, {} 5xx{}, {:.1}s",
                m.requests,
                m.errors_5xx,
                m.haproxy.as_ref().map_or_else(String::new, |h| format!(
                    " ({} requests through HAProxy: {} 5xx, {} retried, {} redispatched)",
                    h.requests, h.five_xx, h.wretr, h.wredis
                )),
                m.duration.as_secs_f64()
            ),
            Err(e) => format!("error: {e}"),
        };
        eprintln!(
            "[{:>5.0}s] {} / {}: {outcome}",
            started.elapsed().as_secs_f64(),
            row.scenario.disruption,
            row.scenario.protection
        );
    })
    .await;
    if let Some((cp, _dir)) = shared {
        let failed = outcome.is_err();
        tokio::task::spawn_blocking(move || {
            let mut cp = cp.lock().unwrap_or_else(|e| e.into_inner());
            if failed {
                eprintln!("{}", cp.log_tails(20));
            }
            cp.stop()
        })
        .await??;
    }
    let rows = outcome?;
    print!("{}", scenario::real::table(&rows));
    for row in rows.iter().filter(|r| args.timeline || !r.as_expected()) {
        if let Ok(m) = &row.result {
            println!(
                "\n{} / {}:",
                row.scenario.disruption, row.scenario.protection
            );
            for event in &m.timeline {
                println!("  {event}");
            }
        }
    }
    anyhow::ensure!(
        rows.iter().all(|r| r.as_expected()),
        "some rows of the real tier did not behave as expected"
    );
    Ok(())
}

async fn serve(args: &Args, shutdown: Shutdown) -> anyhow::Result<()> {
    let cfg = args.scenario();
    let cluster = setup::start(cfg.cluster.clone(), shutdown.clone()).await?;
    cluster.deploy_web(&cfg.web, cfg.phase_timeout).await?;
    let path = args
        .kubeconfig_out
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("graceful-drain-sim.kubeconfig"));
    // Written under a temporary name and renamed, so whoever waits for the file never
    // reads half of it.
    let partial = path.with_extension("partial");
    cluster
        .api()
        .write_kubeconfig(&partial, "admin")
        .with_context(|| format!("write kubeconfig {}", partial.display()))?;
    std::fs::rename(&partial, &path)
        .with_context(|| format!("write kubeconfig {}", path.display()))?;
    let traffic_cfg = TrafficConfig {
        max_duration: SERVE_MAX_DURATION,
        max_requests: (args.rate * SERVE_MAX_DURATION.as_secs_f64()) as u64,
        ..cfg.traffic
    };
    let traffic = cluster.traffic(&cfg.web, traffic_cfg);
    println!("simulated cluster serving at {}", cluster.api().url());
    println!("kubeconfig: {}", path.display());
    println!(
        "nodes: {}; workload: deployment, service (LoadBalancer) and pdb {}",
        cluster.nodes().join(", "),
        cfg.web.service_key()
    );
    println!(
        "try: KUBECONFIG={} kubectl get pods -o wide",
        path.display()
    );
    let mut ticker = tokio::time::interval(SERVE_REPORT_EVERY);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {
                let c = traffic.counts();
                println!("traffic: {} requests, {} 5xx", c.requests, c.errors_5xx);
            }
        }
    }
    let report = traffic.stop().await;
    println!(
        "stopped: {} requests, {} 5xx",
        report.requests, report.errors_5xx
    );
    Ok(())
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
    fn flags_shape_the_scenario() {
        let cli = Cli::try_parse_from([
            "simulate",
            "--replicas",
            "6",
            "--deregistration-lag",
            "15s",
            "--rate",
            "50",
        ])
        .unwrap();
        let cfg = cli.args.scenario();
        assert_eq!(cfg.web.replicas, 6);
        assert_eq!(cfg.web.min_available, 5, "defaults to replicas - 1");
        assert_eq!(cfg.cluster.lb.deregistration_lag, Duration::from_secs(15));
        assert_eq!(cfg.traffic.rate, 50.0);
        assert_eq!(cfg.components.deregistration_delay, Duration::from_secs(4));
        assert_eq!(cfg.cluster.disruption_timeout, Duration::from_secs(120));
        assert_eq!(cfg.cluster.api.faults, apiserver::Faults::default());
    }

    #[test]
    fn fault_flags_shape_the_api_server() {
        let cli = Cli::try_parse_from([
            "simulate",
            "--fault-throttle-share",
            "0.25",
            "--fault-latency",
            "5ms",
            "--fault-watch-gone-after",
            "3s",
            "--fault-seed",
            "42",
            "--pdb-deletion-timeout",
            "2s",
        ])
        .unwrap();
        let cfg = cli.args.scenario();
        let faults = &cfg.cluster.api.faults;
        assert_eq!(faults.throttle_share, 0.25);
        assert_eq!(faults.throttle_retry_after, 1);
        assert_eq!(faults.latency, Duration::from_millis(5));
        assert_eq!(faults.watch_gone_after, Some(Duration::from_secs(3)));
        assert_eq!(faults.seed, 42);
        assert_eq!(cfg.cluster.disruption_timeout, Duration::from_secs(2));
        assert!(Cli::try_parse_from(["simulate", "--fault-throttle-share", "1.5"]).is_err());
    }

    #[test]
    fn routes_and_client_certificates_reach_the_api_server_config() {
        let args = Cli::parse_from([
            "simulate",
            "--route-service",
            "graceful-drain/graceful-drain-webhook=127.0.0.1:9443",
            "--route-service",
            "10.0.0.7:8443=127.0.0.1:9444",
            "--webhook-client-cert",
            "c.pem",
            "--webhook-client-key",
            "k.pem",
        ])
        .args;
        let api = args.scenario().cluster.api;
        assert_eq!(api.routes.len(), 2);
        assert_eq!(api.routes[1].to, SocketAddr::from(([127, 0, 0, 1], 9444)));
        assert_eq!(api.webhook_client_cert.unwrap().key, PathBuf::from("k.pem"));
        assert!(
            Cli::try_parse_from(["simulate", "--route-service", "no-slash=127.0.0.1:1"]).is_err()
        );
        assert!(Cli::try_parse_from(["simulate", "--webhook-client-cert", "c.pem"]).is_err());
    }

    #[test]
    fn load_balancer_client_and_app_flags_shape_the_scenario() {
        let cfg = Cli::parse_from(["simulate"]).args.scenario();
        assert_eq!(cfg.cluster.lb_model, LbModel::default());
        assert_eq!(cfg.cluster.app, Behaviour::Graceful);
        assert_eq!(cfg.clients, Clients::PerRequest, "open loop by default");
        let cfg = Cli::try_parse_from([
            "simulate",
            "--load-balancer",
            "nlb",
            "--alb-nodes",
            "3",
            "--alb-lag-jitter",
            "0.2",
            "--alb-controller-latency",
            "300ms",
            "--app",
            "naive",
            "--keep-alive-clients",
            "8",
            "--long-request-share",
            "0.1",
            "--long-request-duration",
            "4s",
            "--traffic-seed",
            "9",
        ])
        .unwrap()
        .args
        .scenario();
        let model = cfg.cluster.lb_model;
        assert_eq!(model.default_kind, LbKind::Nlb);
        assert_eq!((model.alb_nodes, model.alb_lag_jitter), (3, 0.2));
        assert_eq!(model.alb_controller_latency, Duration::from_millis(300));
        assert_eq!(cfg.cluster.app, Behaviour::Naive);
        assert_eq!(
            cfg.clients,
            Clients::KeepAlive(KeepAliveConfig {
                connections: 8,
                long_share: 0.1,
                long_duration: Duration::from_secs(4),
                seed: 9,
            })
        );
        assert!(Cli::try_parse_from(["simulate", "--load-balancer", "elb"]).is_err());
        assert!(Cli::try_parse_from(["simulate", "--app", "lazy"]).is_err());
    }
}
