//! Starting and stopping etcd, kube-apiserver, kube-controller-manager and kube-scheduler
//! on loopback, each a process of its own with its log in `DIR/logs`.
//!
//! `DIR` holds everything of one control plane: the certificates and the service-account
//! key, one kubeconfig per identity, etcd's data, the logs and `pids` (one `name pid` line
//! per process), which is what `down` reads. Nothing listens beyond 127.0.0.1, and nothing
//! is told to dial another address: the Service CIDR is allocated but never routed, the
//! `kubernetes` Service gets no endpoints (`--endpoint-reconciler-type=none`).
//! kube-controller-manager runs every controller, the node lifecycle controller included:
//! the nodes' heartbeats (their Leases) come from KWOK, which the data plane starts.

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::{self, Identity, Pki};
use crate::{Error, Result};

/// How long kube-apiserver may take to answer `/readyz` (about 5 s on the 2-core dev
/// machine; a cold page cache or a loaded CI machine takes several times that).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a component may take to exit after SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Poll interval of the readiness and exit waits (processes of our own, no events to await).
const POLL: Duration = Duration::from_millis(100);
/// The Service CIDR: allocated to Services, never routed and never dialled.
const SERVICE_CIDR: &str = "10.96.0.0/16";
/// Components in start order; `down` stops them in reverse, so kube-apiserver still has
/// etcd while it shuts down (it hangs on SIGTERM once etcd is gone).
const ORDER: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// Folder of the four binaries (see [`crate::build`]).
    pub bin: PathBuf,
    /// Serve `lifecycle.k8s.io/v1alpha1` (EvictionRequest and Eviction, KEP-4563) with the
    /// `EvictionRequestAPI` feature gate.
    pub eviction_request_api: bool,
    /// Extra kube-apiserver flags (`--flag=value`), after ours.
    pub apiserver_flags: Vec<String>,
    /// kube-apiserver presents a client certificate to admission webhooks, signed by the
    /// CA at [`ControlPlane::webhook_client_ca`] (see `certs::write_webhook_client`).
    pub webhook_client_certificate: bool,
}

/// A running control plane, described by its folder.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    /// The processes, when this value started them (tests); empty after [`up`] returns for
    /// `cargo xtask`, whose processes outlive it and are found again through `pids`.
    children: Vec<Child>,
    /// Each started component's name and command line, in start order, for [`ControlPlane::restart`].
    commands: Vec<(String, Vec<String>)>,
    /// How the control plane was started.
    options: Option<Options>,
    /// Whether dropping this value stops the processes.
    stop_on_drop: bool,
}

impl ControlPlane {
    /// The folder of this control plane.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed kube-apiserver's client certificate for admission webhooks
    /// (with [`Options::webhook_client_certificate`]).
    pub fn webhook_client_ca(&self) -> PathBuf {
        self.dir.join("pki").join(certs::WEBHOOK_CLIENT_CA)
    }

    /// [`ControlPlane::webhook_client_ca`] of the control plane whose administrator's
    /// kubeconfig is `kubeconfig`, if it was started with
    /// [`Options::webhook_client_certificate`].
    pub fn webhook_client_ca_of(kubeconfig: &Path) -> Option<PathBuf> {
        let ca = kubeconfig
            .parent()?
            .join("pki")
            .join(certs::WEBHOOK_CLIENT_CA);
        ca.is_file().then_some(ca)
    }

    /// The kubeconfig of a cluster administrator (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The log file of one component (`etcd`, `kube-apiserver`, …).
    pub fn log(&self, component: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{component}.log"))
    }

    /// The last `lines` lines of every component's log, for a failed test's output.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for c in ORDER {
            let text = fs::read_to_string(self.log(c)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(lines).collect();
            out.push_str(&format!("--- {c} (last {} lines)\n", tail.len()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Stops one component (`kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`; SIGTERM, SIGKILL after 15 s) and starts it again with the same
    /// command line, its log continued; after kube-apiserver, waits until it is ready again.
    /// What a node reboot or an upgrade does to a control-plane component.
    pub fn restart(&mut self, component: &str) -> Result<()> {
        let options = self
            .options
            .clone()
            .ok_or_else(|| Error::NotRunning(component.to_string()))?;
        let index = self
            .commands
            .iter()
            .position(|(name, _)| name == component)
            .filter(|i| *i < self.children.len())
            .ok_or_else(|| Error::NotRunning(component.to_string()))?;
        let args = self.commands[index].1.clone();
        stop_child(&mut self.children[index]);
        let child = spawn(&self.dir, &options, component, &args, true)?;
        self.children[index] = child;
        write_pids(self)?;
        if component == "kube-apiserver" {
            wait_ready(self)?;
        }
        Ok(())
    }

    /// Keeps the processes running after this value is dropped (for `cargo xtask
    /// control-plane up`); `down` stops them later.
    pub fn detach(mut self) -> PathBuf {
        self.stop_on_drop = false;
        self.children.clear();
        self.dir.clone()
    }

    /// Stops this control plane's processes (scheduler and controller manager first, etcd
    /// last) and waits for each.
    pub fn stop(&mut self) -> Result<()> {
        self.stop_on_drop = false;
        for mut child in self.children.drain(..).rev() {
            stop_child(&mut child);
        }
        let _ = fs::remove_file(self.dir.join("pids"));
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if self.stop_on_drop {
            let _ = self.stop();
        }
    }
}

/// Starts a control plane in `dir` (created; an old one there is stopped first) and waits
/// until kube-apiserver is ready.
pub fn up(dir: &Path, options: &Options) -> Result<ControlPlane> {
    if dir.join("pids").exists() {
        down(dir)?;
    }
    for sub in ["logs", "etcd"] {
        let _ = fs::remove_dir_all(dir.join(sub));
        fs::create_dir_all(dir.join(sub)).map_err(|e| Error::io(&dir.join(sub), e))?;
    }
    for b in ORDER {
        if !options.bin.join(b).is_file() {
            return Err(Error::NotBuilt(options.bin.join(b)));
        }
    }
    let pki = certs::generate(dir)?;
    let [etcd_client, etcd_peer, apiserver] = free_ports()?;
    let server = format!("https://127.0.0.1:{apiserver}");
    for id in Identity::ALL {
        certs::write_kubeconfig(dir, &pki, id, &server)?;
    }
    let mut cp = ControlPlane {
        dir: dir.to_path_buf(),
        children: Vec::new(),
        commands: Vec::new(),
        options: Some(options.clone()),
        stop_on_drop: true,
    };
    let etcd_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    let etcd_args = vec![
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--listen-metrics-urls=".into(),
        "--log-level=warn".into(),
    ];
    start(&mut cp, options, "etcd", &etcd_args)?;
    let mut apiserver_args = apiserver_args(dir, &pki, &etcd_url, apiserver, options);
    if options.webhook_client_certificate {
        let config = certs::write_webhook_client(dir)?;
        apiserver_args.push(format!(
            "--admission-control-config-file={}",
            config.display()
        ));
    }
    start(&mut cp, options, "kube-apiserver", &apiserver_args)?;
    wait_ready(&cp)?;
    let kcm = dir.join(Identity::ControllerManager.kubeconfig());
    let kcm_args = vec![
        format!("--kubeconfig={}", kcm.display()),
        format!("--authentication-kubeconfig={}", kcm.display()),
        format!("--authorization-kubeconfig={}", kcm.display()),
        "--bind-address=127.0.0.1".into(),
        "--secure-port=0".into(),
        "--leader-elect=false".into(),
        // Every controller, the node lifecycle controller too: KWOK renews the nodes'
        // Leases, and the controller lifts the not-ready taint once a node is Ready.
        "--controllers=*".into(),
        "--use-service-account-credentials=true".into(),
        format!(
            "--service-account-private-key-file={}",
            pki.sa_key.display()
        ),
        format!("--root-ca-file={}", pki.ca_cert.display()),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--v=2".into(),
    ];
    start(&mut cp, options, "kube-controller-manager", &kcm_args)?;
    let sched = dir.join(Identity::Scheduler.kubeconfig());
    let sched_args = vec![
        format!("--kubeconfig={}", sched.display()),
        format!("--authentication-kubeconfig={}", sched.display()),
        format!("--authorization-kubeconfig={}", sched.display()),
        "--bind-address=127.0.0.1".into(),
        "--secure-port=0".into(),
        "--leader-elect=false".into(),
    ];
    start(&mut cp, options, "kube-scheduler", &sched_args)?;
    Ok(cp)
}

fn apiserver_args(dir: &Path, pki: &Pki, etcd: &str, port: u16, options: &Options) -> Vec<String> {
    let mut args = vec![
        format!("--etcd-servers={etcd}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", pki.apiserver_cert.display()),
        format!("--tls-private-key-file={}", pki.apiserver_key.display()),
        format!("--client-ca-file={}", pki.ca_cert.display()),
        "--anonymous-auth=false".into(),
        "--authorization-mode=Node,RBAC".into(),
        // The `kubernetes` Service would otherwise list 127.0.0.1 as its endpoint.
        "--endpoint-reconciler-type=none".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        format!("--service-account-key-file={}", pki.sa_pub.display()),
        format!(
            "--service-account-signing-key-file={}",
            pki.sa_key.display()
        ),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        "--allow-privileged=true".into(),
        format!("--cert-dir={}", dir.join("apiserver-certs").display()),
        "--v=1".into(),
    ];
    if options.eviction_request_api {
        args.push("--feature-gates=EvictionRequestAPI=true".into());
        args.push("--runtime-config=lifecycle.k8s.io/v1alpha1=true".into());
    }
    args.extend(options.apiserver_flags.iter().cloned());
    args
}

fn start(cp: &mut ControlPlane, options: &Options, name: &str, args: &[String]) -> Result<()> {
    let child = spawn(&cp.dir, options, name, args, false)?;
    cp.children.push(child);
    cp.commands.push((name.to_string(), args.to_vec()));
    write_pids(cp)
}

/// Starts component `name` with its log in `dir/logs` (continued when `append`).
fn spawn(
    dir: &Path,
    options: &Options,
    name: &str,
    args: &[String],
    append: bool,
) -> Result<Child> {
    let log_path = dir.join("logs").join(format!("{name}.log"));
    let log = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&log_path)
        .map_err(|e| Error::io(&log_path, e))?;
    let err = log.try_clone().map_err(|e| Error::io(&log_path, e))?;
    Command::new(options.bin.join(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        // Its own process group: a ^C meant for `cargo xtask` or a test does not reach it.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io(&options.bin.join(name), e))
}

/// Rewrites `dir/pids` from the running children, which `down` reads.
fn write_pids(cp: &ControlPlane) -> Result<()> {
    let pids = cp.dir.join("pids");
    let all: String = cp
        .commands
        .iter()
        .zip(&cp.children)
        .map(|((name, _), child)| format!("{name} {}\n", child.id()))
        .collect();
    fs::write(&pids, all).map_err(|e| Error::io(&pids, e))
}

/// SIGTERM to `child`, SIGKILL after [`STOP_TIMEOUT`], and waits for it.
fn stop_child(child: &mut Child) {
    terminate(child.id());
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            Ok(None) => std::thread::sleep(POLL),
        }
    }
}

/// Waits for kube-apiserver's `/readyz` (every post-start hook, RBAC's bootstrap roles
/// among them) through the admin kubeconfig, failing early when a process exited.
fn wait_ready(cp: &ControlPlane) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let kubeconfig = cp.admin_kubeconfig();
    loop {
        let kubectl = crate::kubectl().ok_or(Error::KubectlMissing)?;
        let ok = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "--raw", "/readyz"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|_| Error::KubectlMissing)?
            .success();
        if ok {
            return Ok(());
        }
        for (name, pid) in read_pids(&cp.dir) {
            if !alive(pid) {
                return Err(Error::Exited {
                    component: name,
                    log: cp.log_tails(30),
                });
            }
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady {
                after: READY_TIMEOUT,
                log: cp.log_tails(30),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Stops the control plane described by `dir/pids`, newest component first, and waits for
/// each process to exit (SIGKILL after 15 s).
pub fn down(dir: &Path) -> Result<()> {
    let mut pids = read_pids(dir);
    pids.sort_by_key(|(name, _)| std::cmp::Reverse(ORDER.iter().position(|c| c == name)));
    for (name, pid) in pids {
        terminate(pid);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while alive(pid) {
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                eprintln!("{name} (pid {pid}) ignored SIGTERM for {STOP_TIMEOUT:?}: killed");
                break;
            }
            std::thread::sleep(POLL);
        }
    }
    let pids = dir.join("pids");
    match fs::remove_file(&pids) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&pids, e)),
    }
}

fn read_pids(dir: &Path) -> Vec<(String, u32)> {
    fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, pid) = l.split_once(' ')?;
            Some((name.to_string(), pid.trim().parse().ok()?))
        })
        .collect()
}

fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Whether `pid` is a live process (a zombie waiting for its parent counts as gone).
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Three free loopback ports for the components to bind (see [`crate::ports`]).
fn free_ports() -> Result<[u16; 3]> {
    let port = || {
        crate::ports::free_loopback_port()
            .map(|a| a.port())
            .map_err(|e| Error::io(Path::new("127.0.0.1"), e))
    };
    Ok([port()?, port()?, port()?])
}
