//! Starting graceful-drain's real components inside the simulator, the way a user
//! would: each is given its documented command-line flags (parsed by clap, exactly as
//! the binary parses them), a kubeconfig written by the simulated API server, a
//! certificate from [`graceful_drain_core::certs::generate`] and temporary socket folders. The
//! webhook configurations are created through the API with a `url` clientConfig.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use super::Error;
use crate::command::{AgentCommand, WebhookCommand};
use graceful_drain_core::runtime::Shutdown;
use kube_sim::cluster::{Access, DataPlane, wait_for};

/// Namespace of our components (the chart's default).
pub const NAMESPACE: &str = "graceful-drain";
/// User of the in-process webhook.
pub const WEBHOOK_USER: &str = "system:serviceaccount:graceful-drain:graceful-drain-webhook";
/// User of the in-process node agents (the chart's ServiceAccount of the node agent).
pub const AGENT_USER: &str = "system:serviceaccount:graceful-drain:graceful-drain-agent";
/// How long a component may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long [`Components::shut_down`] waits for the components to exit: the webhook's
/// shutdown delay (5 s by default) and its held DELETEs, with room to spare.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How graceful-drain is configured in a scenario.
#[derive(Clone, Debug)]
pub struct ComponentsConfig {
    /// The webhook's `--deregistration-delay`.
    pub deregistration_delay: Duration,
    /// The webhook's `--timeout-seconds` (also the configurations' timeoutSeconds).
    pub timeout_seconds: u32,
    /// The binary whose `node-agent` subcommand runs each node agent as an OS process of its
    /// own, as on a node (the real tier: `simulate`'s own binary); `None` runs them inside
    /// this process (tests, whose binary is not ours).
    pub agent_program: Option<std::path::PathBuf>,
    /// Confirmed release: the webhook asks the data plane's load balancers, through
    /// their admin API on loopback (`kube_sim::lb::serve_admin`), whether they still route
    /// to an isolated pod (`--balancer-config`); off, every pod keeps its whole delay.
    pub confirmed_release: bool,
    /// With [`ComponentsConfig::confirmed_release`]: the HAProxy statistics page the
    /// webhook asks instead of the simulated load balancers (the real tier behind HAProxy:
    /// the `real_lb::StatsRelay`'s URL).
    pub balancer_stats: Option<String>,
}

#[derive(Parser)]
#[command(name = "webhook")]
struct WebhookCli {
    #[command(flatten)]
    args: graceful_drain_webhook::Args,
}

#[derive(Parser)]
#[command(name = "node-agent")]
struct AgentCli {
    #[command(flatten)]
    args: graceful_drain_agent::Args,
}

/// A folder under the system temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh folder.
    pub fn new(prefix: &str) -> std::io::Result<TempDir> {
        // Short: unix socket paths inside it must stay under 108 bytes.
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = std::env::temp_dir().join(format!("{prefix}-{}", &id[..12]));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Keeps the folder (its logs, for a failure) instead of removing it; its path.
    pub fn keep(self) -> PathBuf {
        let path = self.0.clone();
        std::mem::forget(self);
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The running components; dropping them stops them.
pub struct Components {
    tasks: Vec<(String, JoinHandle<anyhow::Result<()>>)>,
    stop: Shutdown,
    /// Stops the running webhook replica alone (a child of `stop`).
    webhook_stop: Shutdown,
    /// Task name of the running webhook replica.
    webhook_task: String,
    /// Replicas started so far (each gets its own identity for the deleter Lease).
    webhook_replicas: usize,
    /// The serving certificate's files and CA, shared by every replica.
    webhook_tls: Option<(graceful_drain_core::certs::Paths, String)>,
    /// Extra flags of every node agent.
    agent_flags: Vec<String>,
    /// `--deployment` of webhook replicas started from now on: the Deployment whose
    /// absence at shutdown means an uninstall.
    webhook_deployment: Option<String>,
    /// Extra flags of webhook replicas started from now on.
    webhook_flags: Vec<String>,
    /// Where the running webhook replica serves admission.
    webhook_listen: Option<SocketAddr>,
    /// The admin port of the webhook replica started last.
    webhook_admin: Option<SocketAddr>,
    /// The admin port of each node agent, by node.
    agent_admins: std::collections::BTreeMap<String, SocketAddr>,
    /// Stops one node agent alone (children of `stop`), by node.
    agent_stops: std::collections::BTreeMap<String, Shutdown>,
    /// The webhook replica running as its own process, if one does (killed on drop).
    webhook_process: Option<(String, tokio::process::Child)>,
    /// See [`ComponentsConfig::agent_program`].
    agent_program: Option<std::path::PathBuf>,
    /// The node agents running as processes, by node, with their logs (killed on drop).
    agent_processes: std::collections::BTreeMap<String, (tokio::process::Child, PathBuf)>,
    _dir: TempDir,
}

/// One webhook replica's command line and addresses.
struct Replica {
    argv: Vec<String>,
    identity: String,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Components {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn component_err(name: &str) -> impl FnOnce(String) -> Error + '_ {
    move |reason| Error::Component {
        name: name.to_string(),
        reason,
    }
}

fn free_port() -> Result<SocketAddr, Error> {
    kube_control_plane::free_loopback_port().map_err(|e| Error::Component {
        name: "port".into(),
        reason: e.to_string(),
    })
}

/// `GET path` on the plain-HTTP admin port `addr`: what arrived within `within`, and
/// whether the whole answer did (the server closed the connection); `None` when the
/// request could not be sent.
async fn admin_get(addr: SocketAddr, path: &str, within: Duration) -> Option<(Vec<u8>, bool)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut answer)).await;
    let whole = matches!(read, Ok(Ok(_)));
    Some((answer, whole))
}

async fn ready_http(addr: SocketAddr) -> bool {
    admin_get(addr, "/readyz", Duration::from_secs(1))
        .await
        .is_some_and(|(answer, _)| answer.starts_with(b"HTTP/1.1 200"))
}

impl Components {
    /// Starts the webhook and one node agent per node against `cluster`.
    pub async fn start(cluster: &impl Access, cfg: &ComponentsConfig) -> Result<Components, Error> {
        Self::start_with(cluster, cfg, &[]).await
    }

    /// [`Components::start`], with `agent_flags` added to every node agent's command line
    /// (e.g. `--lifecycle-tick 1s`, `--pod-selector app=web`).
    pub async fn start_with(
        cluster: &impl Access,
        cfg: &ComponentsConfig,
        agent_flags: &[&str],
    ) -> Result<Components, Error> {
        let dir = TempDir::new("gd-sim").map_err(|e| component_err("temp dir")(e.to_string()))?;
        cluster.ensure_namespace(NAMESPACE).await?;
        let stop = cluster.shutdown().child_token();
        let mut this = Components {
            tasks: Vec::new(),
            webhook_stop: stop.child_token(),
            webhook_task: String::new(),
            webhook_replicas: 0,
            webhook_tls: None,
            stop,
            agent_flags: agent_flags.iter().map(|f| f.to_string()).collect(),
            webhook_deployment: None,
            webhook_flags: Vec::new(),
            webhook_listen: None,
            webhook_admin: None,
            agent_admins: Default::default(),
            agent_stops: Default::default(),
            webhook_process: None,
            agent_program: cfg.agent_program.clone(),
            agent_processes: Default::default(),
            _dir: dir,
        };
        this.start_webhook(cluster, cfg).await?;
        this.start_agents(cluster).await?;
        Ok(this)
    }

    /// Stops the webhook and waits until it has exited (an outage: the API server's
    /// calls then fail and failurePolicy decides). Returns the webhook's outcome.
    pub async fn stop_webhook(&mut self) -> Result<(), Error> {
        self.webhook_stop.cancel();
        let name = self.webhook_task.clone();
        self.join_task(&name).await
    }

    /// Stops every component and waits until each has exited (processes are killed), so
    /// none is left calling an API server that stops next: a call that finds it gone logs
    /// an error. Returns the first component's error.
    pub async fn shut_down(mut self) -> Result<(), Error> {
        self.stop.cancel();
        let mut outcome = Ok(());
        let processes = std::mem::take(&mut self.agent_processes)
            .into_iter()
            .map(|(node, (child, _))| (format!("node-agent {node} (process)"), child))
            .chain(self.webhook_process.take());
        for (name, child) in processes {
            outcome = outcome.and(kill(&name, child).await);
        }
        for (name, task) in std::mem::take(&mut self.tasks) {
            let exited = match tokio::time::timeout(STOP_TIMEOUT, task).await {
                Ok(Ok(Ok(()))) => Ok(()),
                Ok(Ok(Err(e))) => Err(format!("{e:#}")),
                Ok(Err(e)) => Err(format!("panicked: {e}")),
                Err(_) => Err(format!("still running after {STOP_TIMEOUT:?}")),
            };
            outcome = outcome.and(exited.map_err(component_err(&name)));
        }
        outcome
    }

    /// Waits until the task called `name` has exited; its outcome.
    async fn join_task(&mut self, name: &str) -> Result<(), Error> {
        let Some(index) = self.tasks.iter().position(|(n, _)| n == name) else {
            return Ok(());
        };
        let (name, task) = self.tasks.remove(index);
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(component_err(&name)(format!("{e:#}"))),
            Err(e) => Err(component_err(&name)(format!("panicked: {e}"))),
        }
    }

    /// A rolling update of the webhook's Deployment with one replica: a new replica (a new
    /// identity, the same certificate) starts and becomes ready, the Service's endpoint
    /// moves to it (the configurations' URL here), then the old replica shuts down — its
    /// in-flight calls finish and it hands the deleter Lease over, so the new replica
    /// deletes the pods the old one isolated.
    pub async fn roll_webhook(
        &mut self,
        cluster: &impl Access,
        cfg: &ComponentsConfig,
    ) -> Result<(), Error> {
        let old_stop = self.webhook_stop.clone();
        let old_task = self.webhook_task.clone();
        self.webhook_stop = self.stop.child_token();
        let listen = self.spawn_webhook(cluster, cfg).await?;
        self.webhook_listen = Some(listen);
        let ca = self.ca();
        point_configurations(cluster, listen, &ca, cfg.timeout_seconds).await?;
        old_stop.cancel();
        self.join_task(&old_task).await
    }

    /// Webhook replicas started from now on get `--deployment name` (the chart sets it to
    /// the webhook's own Deployment), so a replica stopping once it is gone finishes the
    /// uninstall.
    pub fn set_webhook_deployment(&mut self, name: &str) {
        self.webhook_deployment = Some(name.to_string());
    }

    /// Webhook replicas started from now on get `flags` too.
    pub fn add_webhook_flags(&mut self, flags: &[&str]) {
        self.webhook_flags
            .extend(flags.iter().map(|f| f.to_string()));
    }

    /// Webhook replicas started from now on no longer get `flags` (a flag and its value,
    /// as [`Components::add_webhook_flags`] gave them).
    pub fn remove_webhook_flags(&mut self, flags: &[&str]) {
        if flags.is_empty() {
            return;
        }
        if let Some(at) = self
            .webhook_flags
            .windows(flags.len())
            .position(|w| w.iter().zip(flags).all(|(a, b)| a == b))
        {
            self.webhook_flags.drain(at..at + flags.len());
        }
    }

    /// Whether [`Components::add_webhook_flags`] gave the webhook `flag` already.
    pub fn has_webhook_flag(&self, flag: &str) -> bool {
        self.webhook_flags.iter().any(|f| f == flag)
    }

    /// Posts `review` straight to the running webhook's `path` over HTTPS (trusting its
    /// CA), as anyone who can reach its port could, and returns its answer.
    pub async fn post_review(
        &self,
        path: &str,
        review: &serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        use rustls_pki_types::pem::PemObject as _;
        let fail = |reason: String| component_err("forged review")(reason);
        let (Some(listen), Some((_, ca))) = (self.webhook_listen, self.webhook_tls.as_ref()) else {
            return Err(fail("no webhook running".into()));
        };
        let url = format!("https://localhost:{}", listen.port())
            .parse()
            .map_err(|e: http::uri::InvalidUri| fail(e.to_string()))?;
        let mut config = kube::Config::new(url);
        config.root_cert = Some(
            rustls_pki_types::CertificateDer::pem_slice_iter(ca.as_bytes())
                .map(|c| c.map(|c| c.to_vec()))
                .collect::<Result<_, _>>()
                .map_err(|e| fail(e.to_string()))?,
        );
        let client = kube::Client::try_from(config).map_err(|e| fail(e.to_string()))?;
        let body = serde_json::to_vec(review).map_err(|e| fail(e.to_string()))?;
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| fail(e.to_string()))?;
        client
            .request::<serde_json::Value>(request)
            .await
            .map_err(|e| fail(e.to_string()))
    }

    /// The address the API server reaches the webhook at, and the CA (PEM) that signed its
    /// certificate; `None` before it started.
    pub fn webhook_endpoint(&self) -> Option<(SocketAddr, String)> {
        let (_, ca) = self.webhook_tls.as_ref()?;
        Some((self.webhook_listen?, ca.clone()))
    }

    /// The value of `sample` (a metric name with its labels, as the exposition writes it)
    /// on the webhook replica started last; `None` when it is not exposed or cannot be read.
    pub async fn webhook_metric(&self, sample: &str) -> Option<f64> {
        let admin = self.webhook_admin?;
        let (answer, whole) = admin_get(admin, "/metrics", Duration::from_secs(5)).await?;
        // A cut answer could hold a cut number.
        whole.then_some(())?;
        let text = String::from_utf8_lossy(&answer);
        text.lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    /// The admin port (`/livez`, `/readyz`, `/metrics`) of the in-process webhook replica
    /// started last.
    pub fn webhook_admin(&self) -> Option<SocketAddr> {
        self.webhook_admin
    }

    /// The admin port of `node`'s agent, once it was started.
    pub fn agent_admin(&self, node: &str) -> Option<SocketAddr> {
        self.agent_admins.get(node).copied()
    }

    fn dir(&self) -> &Path {
        self._dir.path()
    }

    fn spawn(
        &mut self,
        name: String,
        fut: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        self.tasks.push((name, tokio::spawn(fut)));
    }

    /// The error of a component that stopped on its own, if any.
    pub async fn check(&mut self) -> Result<(), Error> {
        for (node, (child, log)) in &mut self.agent_processes {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(component_err(&format!("node-agent {node} (process)"))(
                    format!("exited ({status}); its log ends: {}", log_tail(log)),
                ));
            }
        }
        for (name, task) in &mut self.tasks {
            if task.is_finished() {
                let outcome = task.await;
                let reason = match outcome {
                    Ok(Ok(())) => "exited".to_string(),
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(e) => format!("panicked: {e}"),
                };
                return Err(Error::Component {
                    name: name.clone(),
                    reason,
                });
            }
        }
        Ok(())
    }

    /// Polls `ready` until it holds, a component fails, or [`READY_TIMEOUT`] passes.
    async fn await_ready<F, Fut>(&mut self, name: &str, mut ready: F) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check().await?;
            if ready().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(component_err(name)(format!(
                    "not ready after {READY_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn start_webhook(
        &mut self,
        cluster: &impl Access,
        cfg: &ComponentsConfig,
    ) -> Result<(), Error> {
        let bundle = graceful_drain_core::certs::generate(
            "graceful-drain webhook",
            &["localhost".to_string()],
            &[std::net::IpAddr::from([127, 0, 0, 1])],
        )
        .map_err(|e| component_err("webhook")(e.to_string()))?;
        let tls = graceful_drain_core::certs::write(&bundle, &self.dir().join("tls"))
            .map_err(|e| component_err("webhook")(e.to_string()))?;
        self.webhook_tls = Some((tls, bundle.ca_cert.clone()));
        let listen = self.spawn_webhook(cluster, cfg).await?;
        self.webhook_listen = Some(listen);
        create_configurations(cluster, listen, &bundle.ca_cert, cfg.timeout_seconds).await
    }

    /// Starts one more webhook replica under `webhook_stop` and waits until it is ready;
    /// returns the address it serves admission on.
    async fn spawn_webhook(
        &mut self,
        cluster: &impl Access,
        cfg: &ComponentsConfig,
    ) -> Result<SocketAddr, Error> {
        let replica = self.next_webhook(cluster, cfg).await?;
        let cli = WebhookCli::try_parse_from(&replica.argv).map_err(|e| {
            component_err("webhook")(format!(
                "rejects its documented flags: {}",
                e.to_string().lines().next().unwrap_or_default()
            ))
        })?;
        let stop = self.webhook_stop.clone();
        let name = format!("webhook {}", replica.identity);
        self.webhook_task = name.clone();
        self.spawn(name.clone(), graceful_drain_webhook::run(cli.args, stop));
        let admin = replica.admin;
        self.await_ready(&name, || ready_http(admin)).await?;
        self.webhook_admin = Some(admin);
        Ok(replica.listen)
    }

    /// The webhook's `--balancer-config`: the HAProxy statistics page `haproxy_stats`, or
    /// else the data plane's load balancers (every one's servers), whose admin API is
    /// served on loopback under the components' stop from the first call on.
    async fn balancer_config(
        &mut self,
        cluster: &impl Access,
        haproxy_stats: Option<&str>,
    ) -> Result<PathBuf, Error> {
        let path = self.dir().join("balancer.yaml");
        if path.exists() {
            return Ok(path);
        }
        let failed = |e: std::io::Error| component_err("load balancers' admin API")(e.to_string());
        if let Some(url) = haproxy_stats {
            let yaml = format!(
                "source:\n  haproxy:\n    url: {url}\n    backend: {}\n",
                real_lb::haproxy::config::BACKEND
            );
            std::fs::write(&path, yaml).map_err(failed)?;
            return Ok(path);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(failed)?;
        let addr = listener.local_addr().map_err(failed)?;
        let serving = kube_sim::lb::serve_admin(cluster.lbs().clone(), listener, self.stop.clone());
        self.spawn("load balancers' admin API".into(), async move {
            serving.await.map_err(anyhow::Error::from)
        });
        let yaml = format!(
            "source:\n  generic:\n    url: http://{addr}/load-balancers\n    pointer: /*/servers\n    addressField: address\n"
        );
        std::fs::write(&path, yaml).map_err(failed)?;
        Ok(path)
    }

    /// The command line of the next webhook replica, with its own identity, ports and
    /// kubeconfig.
    async fn next_webhook(
        &mut self,
        cluster: &impl Access,
        cfg: &ComponentsConfig,
    ) -> Result<Replica, Error> {
        let Some((tls, _)) = self.webhook_tls.clone() else {
            return Err(component_err("webhook")("no serving certificate".into()));
        };
        let identity = format!("sim-webhook-{}", self.webhook_replicas);
        self.webhook_replicas += 1;
        let kubeconfig = self.dir().join("webhook.kubeconfig");
        cluster.write_kubeconfig(&kubeconfig, WEBHOOK_USER).await?;
        let (listen, admin) = (free_port()?, free_port()?);
        let mut command = WebhookCommand::new(
            (listen, admin),
            (&tls.cert, &tls.key),
            &kubeconfig,
            &identity,
            WEBHOOK_USER,
        );
        command.deregistration_delay = cfg.deregistration_delay;
        command.timeout_seconds = cfg.timeout_seconds;
        command.lease_namespace = NAMESPACE.into();
        if let Some(deployment) = &self.webhook_deployment {
            command
                .extra
                .extend(["--deployment".to_string(), deployment.clone()]);
        }
        if cfg.confirmed_release {
            let path = self
                .balancer_config(cluster, cfg.balancer_stats.as_deref())
                .await?;
            command
                .extra
                .push(format!("--balancer-config={}", path.display()));
        }
        command.extra.extend(self.webhook_flags.iter().cloned());
        let argv = command.argv();
        Ok(Replica {
            argv,
            identity,
            listen,
            admin,
        })
    }

    /// Runs the webhook as the chart does, two replicas behind one Service, one of them
    /// in an OS process of its own (this binary's `webhook` subcommand with the same
    /// flags) so that it can be killed as a node kills a container — a task aborted in
    /// this process would leave the tasks it spawned running. The process replica starts,
    /// the in-process one shuts down and hands it the deleter Lease, a new in-process
    /// replica starts beside it, and the configurations point to a loopback front
    /// (`front`) that spreads connections over both. Returns the process replica's
    /// identity once it holds the Lease.
    pub async fn two_replicas_one_a_process(
        &mut self,
        cluster: &impl Access,
        cfg: &ComponentsConfig,
    ) -> Result<String, Error> {
        let replica = self.next_webhook(cluster, cfg).await?;
        let name = format!("webhook {} (process)", replica.identity);
        let program = std::env::current_exe().map_err(|e| component_err(&name)(e.to_string()))?;
        let log_path = self.dir().join(format!("{}.log", replica.identity));
        let mut child =
            spawn_logged(&program, &replica.argv, &log_path).map_err(component_err(&name))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        while !ready_http(replica.admin).await {
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= deadline {
                let _ = child.start_kill();
                return Err(component_err(&name)(format!(
                    "{} before it was ready; its log ends: {}",
                    exited.map_or("not ready in time".to_string(), |s| format!("exited ({s})")),
                    log_tail(&log_path)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.webhook_process = Some((name.clone(), child));
        // The in-process replica hands the Lease over as it shuts down.
        let old_stop = std::mem::replace(&mut self.webhook_stop, self.stop.child_token());
        let old_task = std::mem::take(&mut self.webhook_task);
        let ca = self.ca();
        point_configurations(cluster, replica.listen, &ca, cfg.timeout_seconds).await?;
        old_stop.cancel();
        self.join_task(&old_task).await?;
        let client = cluster.client();
        wait_for(
            &format!("{name} holding the deleter Lease"),
            READY_TIMEOUT,
            || async { deleter_lease_holder(&client).await.as_ref() == Some(&replica.identity) },
        )
        .await?;
        let beside = self.spawn_webhook(cluster, cfg).await?;
        let service = front(vec![replica.listen, beside], self.stop.clone()).await?;
        point_configurations(cluster, service, &ca, cfg.timeout_seconds).await?;
        self.webhook_listen = Some(service);
        Ok(replica.identity)
    }

    /// Kills the webhook's process with SIGKILL: nothing of its shutdown runs, its calls
    /// in flight are cut, and the deleter Lease it holds stays held until it expires; the
    /// replica beside it serves on and takes the Lease over.
    pub async fn kill_webhook_process(&mut self) -> Result<(), Error> {
        let Some((name, child)) = self.webhook_process.take() else {
            return Err(component_err("webhook")(
                "no webhook process to kill".into(),
            ));
        };
        kill(&name, child).await
    }

    /// Back to one in-process replica after [`Components::two_replicas_one_a_process`]: a
    /// new replica takes the configurations, the one beside the process stops, and the
    /// process gets SIGTERM as a node's kubelet stops a container, so that it hands the
    /// deleter Lease over (SIGKILL if it has not exited within the time a component has to get ready).
    pub async fn back_to_one_replica(
        &mut self,
        cluster: &impl Access,
        cfg: &ComponentsConfig,
    ) -> Result<(), Error> {
        self.roll_webhook(cluster, cfg).await?;
        let Some((name, mut child)) = self.webhook_process.take() else {
            return Ok(());
        };
        if let Some(pid) = child.id() {
            let sent = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
            if let Err(error) = sent {
                tracing::warn!(%error, "{name}: could not send SIGTERM");
            }
        }
        if tokio::time::timeout(READY_TIMEOUT, child.wait())
            .await
            .is_err()
        {
            tracing::warn!("{name} still running {READY_TIMEOUT:?} after SIGTERM; killing it");
            kill(&name, child).await?;
        }
        Ok(())
    }

    /// The CA that signed the webhook's serving certificate.
    fn ca(&self) -> String {
        self.webhook_tls
            .as_ref()
            .map(|(_, ca)| ca.clone())
            .unwrap_or_default()
    }

    async fn start_agents(&mut self, cluster: &impl Access) -> Result<(), Error> {
        for node in cluster.nodes() {
            self.start_agent(cluster, node).await?;
        }
        let transitions: Api<graceful_drain_core::lifecycle::LifecycleTransition> =
            Api::all(cluster.client());
        self.await_ready("node-agent", || async {
            transitions
                .get_opt(graceful_drain_core::lifecycle::DRAIN_TRANSITION)
                .await
                .ok()
                .flatten()
                .is_some()
        })
        .await
    }

    /// Starts the node agent of `node` (with its lifecycle reconciler), as the DaemonSet
    /// pod on that node would run it; its sockets live in this run's folder.
    pub async fn start_agent(&mut self, cluster: &impl Access, node: &str) -> Result<(), Error> {
        let base = self.dir().join(node);
        // One kubeconfig per agent, written before it starts: a restart never rewrites a
        // file another agent is reading.
        let kubeconfig = base.join("agent.kubeconfig");
        std::fs::create_dir_all(&base).map_err(|e| component_err("node-agent")(e.to_string()))?;
        cluster
            .write_node_kubeconfig(&kubeconfig, AGENT_USER, node)
            .await?;
        let mut command = AgentCommand::new(node, &base)
            .reconciler("on")
            .with(&self.agent_flags);
        let admin = free_port()?;
        command.admin_listen = admin.to_string();
        self.agent_admins.insert(node.to_string(), admin);
        command.kubeconfig = Some(kubeconfig);
        for dir in [&command.plugins_dir, &command.registry_dir] {
            std::fs::create_dir_all(dir).map_err(|e| component_err("node-agent")(e.to_string()))?;
        }
        let argv = command.argv();
        if let Some(program) = self.agent_program.clone() {
            let log = base.join("agent.log");
            let name = format!("node-agent {node} (process)");
            let child = spawn_logged(&program, &argv, &log).map_err(component_err(&name))?;
            self.agent_processes.insert(node.to_string(), (child, log));
            return Ok(());
        }
        let cli = AgentCli::try_parse_from(&argv).map_err(|e| {
            component_err("node-agent")(format!(
                "rejects its documented flags: {}",
                e.to_string().lines().next().unwrap_or_default()
            ))
        })?;
        let stop = self.stop.child_token();
        self.agent_stops.insert(node.to_string(), stop.clone());
        self.spawn(
            format!("node-agent {node}"),
            graceful_drain_agent::run(cli.args, stop),
        );
        Ok(())
    }

    /// Deletes both webhook configurations, so the API server stops calling the webhook
    /// (what `helm uninstall` does first).
    pub async fn remove_configurations(&self, cluster: &DataPlane) -> Result<(), Error> {
        let name = super::shipped::configurations_name()?;
        let dp = kube::api::DeleteParams::default();
        let err = |what: &str| {
            let object = format!("{what} {name}");
            move |source| Error::Api {
                action: "delete",
                object,
                source,
            }
        };
        gone(
            Api::<MutatingWebhookConfiguration>::all(cluster.client())
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        )
        .map_err(err("mutatingwebhookconfiguration"))?;
        gone(
            Api::<ValidatingWebhookConfiguration>::all(cluster.client())
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        )
        .map_err(err("validatingwebhookconfiguration"))?;
        Ok(())
    }

    /// Stops the node agent of `node` (a crash or a DaemonSet rollout: its in-memory state
    /// is lost) and waits until it exited. Returns its outcome.
    pub async fn stop_agent(&mut self, node: &str) -> Result<(), Error> {
        if let Some((child, _)) = self.agent_processes.remove(node) {
            // A process is killed outright: what a node's crash or an OOM kill does.
            return kill(&format!("node-agent {node} (process)"), child).await;
        }
        if let Some(stop) = self.agent_stops.remove(node) {
            stop.cancel();
        }
        let name = format!("node-agent {node}");
        let Some(index) = self.tasks.iter().position(|(n, _)| *n == name) else {
            return Ok(());
        };
        let (name, task) = self.tasks.remove(index);
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(component_err(&name)(format!("{e:#}"))),
            Err(e) => Err(component_err(&name)(format!("panicked: {e}"))),
        }
    }
}

/// Starts `program ARGV` with its output in `log`, killed when dropped.
fn spawn_logged(
    program: &Path,
    argv: &[String],
    log: &Path,
) -> Result<tokio::process::Child, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    tokio::process::Command::new(program)
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))
}

/// Kills component `name`'s process with SIGKILL and waits until it is gone.
async fn kill(name: &str, mut child: tokio::process::Child) -> Result<(), Error> {
    child
        .start_kill()
        .map_err(|e| component_err(name)(e.to_string()))?;
    child
        .wait()
        .await
        .map(|_| ())
        .map_err(|e| component_err(name)(e.to_string()))
}

/// The last lines of a component's log, on one line.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// An object that was already gone counts as deleted.
fn gone(r: kube::Result<()>) -> kube::Result<()> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        r => r,
    }
}

/// Who holds the webhook's deleter Lease now, if anyone (an unreadable Lease counts as
/// nobody).
pub async fn deleter_lease_holder(client: &kube::Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get_opt(graceful_drain_webhook::lease::DEFAULT_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

/// A Service in front of webhook replicas, on loopback: each connection goes to the next
/// replica in turn, or to the one after it when that one refuses the connection (a dead
/// pod that the Service's endpoints have dropped). TLS passes through untouched, so
/// kube-apiserver still checks the replicas' certificate. Stops with `stop`.
async fn front(replicas: Vec<SocketAddr>, stop: Shutdown) -> Result<SocketAddr, Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| component_err("webhook service")(e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| component_err("webhook service")(e.to_string()))?;
    tokio::spawn(async move {
        let mut turn = 0usize;
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((mut inbound, _)) = accepted else {
                continue;
            };
            let first = turn;
            turn = turn.wrapping_add(1);
            let replicas = replicas.clone();
            tokio::spawn(async move {
                for i in 0..replicas.len() {
                    let replica = replicas[(first + i) % replicas.len()];
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(replica).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// Points both webhook configurations at `addr` (an update of the Service's endpoint).
async fn point_configurations(
    cluster: &DataPlane,
    addr: SocketAddr,
    ca_pem: &str,
    timeout_seconds: u32,
) -> Result<(), Error> {
    let (mutating, validating) = configurations(addr, ca_pem, timeout_seconds)?;
    let params = PatchParams::apply("graceful-drain-sim").force();
    let err = |what: &str, name: &str| {
        let object = format!("{what} {name}");
        move |source| Error::Api {
            action: "update",
            object,
            source,
        }
    };
    let name = mutating.metadata.name.clone().unwrap_or_default();
    Api::<MutatingWebhookConfiguration>::all(cluster.client())
        .patch(&name, &params, &Patch::Apply(&mutating))
        .await
        .map_err(err("mutatingwebhookconfiguration", &name))?;
    let name = validating.metadata.name.clone().unwrap_or_default();
    Api::<ValidatingWebhookConfiguration>::all(cluster.client())
        .patch(&name, &params, &Patch::Apply(&validating))
        .await
        .map_err(err("validatingwebhookconfiguration", &name))?;
    Ok(())
}

/// The chart's two webhook configurations ([`super::shipped`]), calling the webhook on
/// `addr`'s loopback port and trusting `ca_pem`, with `timeout_seconds` as
/// `webhook.timeoutSeconds`.
fn configurations(
    addr: SocketAddr,
    ca_pem: &str,
    timeout_seconds: u32,
) -> Result<(MutatingWebhookConfiguration, ValidatingWebhookConfiguration), Error> {
    super::shipped::webhook_configurations(
        &format!("https://127.0.0.1:{}", addr.port()),
        ca_pem,
        &super::shipped::Values { timeout_seconds },
    )
}

/// Creates both webhook configurations with a `url` clientConfig to the webhook on
/// `addr`'s port, trusting `ca_pem`; fails if either already exists.
pub(crate) async fn create_configurations(
    cluster: &DataPlane,
    addr: SocketAddr,
    ca_pem: &str,
    timeout_seconds: u32,
) -> Result<(), Error> {
    let (mutating, validating) = configurations(addr, ca_pem, timeout_seconds)?;
    let pp = PostParams::default();
    let name = mutating.metadata.name.clone().unwrap_or_default();
    let err = |what: &str| {
        let object = format!("{what} {name}");
        move |source| Error::Api {
            action: "create",
            object,
            source,
        }
    };
    Api::<MutatingWebhookConfiguration>::all(cluster.client())
        .create(&pp, &mutating)
        .await
        .map_err(err("mutatingwebhookconfiguration"))?;
    Api::<ValidatingWebhookConfiguration>::all(cluster.client())
        .create(&pp, &validating)
        .await
        .map_err(err("validatingwebhookconfiguration"))?;
    Ok(())
}
