//! The command lines of our components as the simulated cluster, the tests and the benches
//! start them: one builder per component, so a flag renamed in the product is renamed for every
//! caller at once, and each caller states only what differs (its ports, certificate,
//! identity, extra flags).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// `graceful-drain webhook` with the flags every test replica needs.
#[derive(Clone, Debug)]
pub struct WebhookCommand {
    /// Address of the HTTPS admission port (`--listen`).
    pub listen: String,
    /// Address of the admin port (`--admin-listen`).
    pub admin_listen: String,
    /// Serving certificate and key (`--tls-cert`, `--tls-key`).
    pub tls: (PathBuf, PathBuf),
    /// How long an isolated pod is kept for the load balancers (`--deregistration-delay`).
    pub deregistration_delay: Duration,
    /// The webhook configurations' timeout, in seconds (`--timeout-seconds`).
    pub timeout_seconds: u32,
    /// Namespace of the deleter's Lease (`--lease-namespace`).
    pub lease_namespace: String,
    /// This replica's name in the Lease (`--identity`).
    pub identity: String,
    /// The webhook's own user, whose requests it lets through (`--own-user`).
    pub own_user: String,
    /// Kubeconfig of the webhook's ServiceAccount (`--kubeconfig`).
    pub kubeconfig: PathBuf,
    /// Pause between turning unready and closing the port (`--shutdown-delay`); the
    /// product's default when `None`.
    pub shutdown_delay: Option<Duration>,
    /// Flags added after the others.
    pub extra: Vec<String>,
}

impl WebhookCommand {
    /// Replica `identity` of the webhook as `own_user`, serving `tls` on `listen`, its
    /// admin port on `admin_listen`, reaching the API server through `kubeconfig`; the
    /// deregistration delay 5 s, the timeout 10 s, the Lease in `graceful-drain`.
    pub fn new(
        (listen, admin_listen): (impl ToString, impl ToString),
        tls: (&Path, &Path),
        kubeconfig: &Path,
        identity: &str,
        own_user: &str,
    ) -> Self {
        Self {
            listen: listen.to_string(),
            admin_listen: admin_listen.to_string(),
            tls: (tls.0.to_path_buf(), tls.1.to_path_buf()),
            deregistration_delay: Duration::from_secs(5),
            timeout_seconds: 10,
            lease_namespace: "graceful-drain".into(),
            identity: identity.into(),
            own_user: own_user.into(),
            kubeconfig: kubeconfig.to_path_buf(),
            shutdown_delay: None,
            extra: Vec::new(),
        }
    }

    /// The arguments, from the subcommand's name on.
    pub fn argv(&self) -> Vec<String> {
        let mut argv: Vec<String> = vec![
            "webhook".into(),
            "--listen".into(),
            self.listen.clone(),
            "--admin-listen".into(),
            self.admin_listen.clone(),
            "--tls-cert".into(),
            self.tls.0.display().to_string(),
            "--tls-key".into(),
            self.tls.1.display().to_string(),
            "--deregistration-delay".into(),
            humantime::format_duration(self.deregistration_delay).to_string(),
            "--timeout-seconds".into(),
            self.timeout_seconds.to_string(),
            "--lease-namespace".into(),
            self.lease_namespace.clone(),
            "--identity".into(),
            self.identity.clone(),
            "--own-user".into(),
            self.own_user.clone(),
            "--kubeconfig".into(),
            self.kubeconfig.display().to_string(),
        ];
        if let Some(delay) = self.shutdown_delay {
            argv.push("--shutdown-delay".into());
            argv.push(humantime::format_duration(delay).to_string());
        }
        argv.extend(self.extra.iter().cloned());
        argv
    }
}

/// `graceful-drain node-agent` of one node, its sockets under one directory.
#[derive(Clone, Debug)]
pub struct AgentCommand {
    /// The node the agent serves (`--node-name`).
    pub node: String,
    /// Where the agent's SLM socket goes (`--plugins-dir`).
    pub plugins_dir: PathBuf,
    /// Where the kubelet's plugin watcher looks for registration sockets (`--registry-dir`).
    pub registry_dir: PathBuf,
    /// Address of the admin port (`--admin-listen`).
    pub admin_listen: String,
    /// The lifecycle reconciler's mode: `on`, `off` or `auto` (`--lifecycle-reconciler`);
    /// the product's default when `None`.
    pub lifecycle_reconciler: Option<String>,
    /// Kubeconfig of the agent's ServiceAccount (`--kubeconfig`), when it runs as a process.
    pub kubeconfig: Option<PathBuf>,
    /// Flags added after the others.
    pub extra: Vec<String>,
}

impl AgentCommand {
    /// The agent of `node` with its sockets in `root/plugins` and `root/plugins_registry`
    /// (the kubelet's layout), its admin port on any free loopback port.
    pub fn new(node: &str, root: &Path) -> Self {
        Self {
            node: node.into(),
            plugins_dir: root.join("plugins"),
            registry_dir: root.join("plugins_registry"),
            admin_listen: "127.0.0.1:0".into(),
            lifecycle_reconciler: None,
            kubeconfig: None,
            extra: Vec::new(),
        }
    }

    /// The same agent with the lifecycle reconciler in `mode`.
    pub fn reconciler(mut self, mode: &str) -> Self {
        self.lifecycle_reconciler = Some(mode.into());
        self
    }

    /// The same agent with `flags` added after the others.
    pub fn with<S: ToString>(mut self, flags: &[S]) -> Self {
        self.extra.extend(flags.iter().map(ToString::to_string));
        self
    }

    /// The arguments, from the subcommand's name on.
    pub fn argv(&self) -> Vec<String> {
        let mut argv: Vec<String> = vec![
            "node-agent".into(),
            "--node-name".into(),
            self.node.clone(),
            "--plugins-dir".into(),
            self.plugins_dir.display().to_string(),
            "--registry-dir".into(),
            self.registry_dir.display().to_string(),
            "--admin-listen".into(),
            self.admin_listen.clone(),
        ];
        if let Some(mode) = &self.lifecycle_reconciler {
            argv.push("--lifecycle-reconciler".into());
            argv.push(mode.clone());
        }
        if let Some(kubeconfig) = &self.kubeconfig {
            argv.push("--kubeconfig".into());
            argv.push(kubeconfig.display().to_string());
        }
        argv.extend(self.extra.iter().cloned());
        argv
    }
}
