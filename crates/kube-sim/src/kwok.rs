//! KWOK as the kubelets of a real API server's nodes.
//!
//! On the real tier, KWOK (`sigs.k8s.io/kwok`, one process per attached real cluster)
//! writes what a kubelet writes: the Node's status and its Lease heartbeats, and each pod's
//! life as [stages] rendered from the cluster's [`KubeletConfig`] — an IP and
//! `Initialized` at once, Running and Ready after `start_delay`, then, once the pod has a
//! deletionTimestamp, its deletion `exit_after_sigterm` later or when the grace period ends
//! if that is sooner (a batch pod that a Job's finalizer holds first turns Failed with
//! exit code 143, as the kubelet makes a pod terminal before it is deleted). A batch pod with
//! the kubelet's run-for annotation turns Succeeded, or Failed with its exit-code
//! annotation, that long after it became Ready.
//!
//! What no control plane has stays ours: the apps inside the pods (their traffic, SIGTERM
//! and exit) are played by kubelets that make no API call ([`kubelet::Context::kwok`]), one
//! for each node KWOK manages — the ones registered at attach and any a node autoscaler
//! (Karpenter's KWOK provider) creates later, which carry the same annotation. When the
//! cluster has a pod port, those kubelets open each pod's real listener on the loopback
//! twin of the IP KWOK gave it ([`POD_CIDR`], [`crate::podnet`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::controllers::kubelet::{self, KubeletConfig};
use crate::controllers::kubelet::{
    EXIT_CODE_ANNOTATION, NEVER_READY_ANNOTATION, RUN_FOR_ANNOTATION,
};
use crate::podnet::PodNet;
use crate::task::spawn_owned;
use crate::traffic::apps::{Apps, Behaviour};
use crate::traffic::timeline::Timeline;

/// The annotation of a node KWOK manages (the one Karpenter's KWOK provider puts on the
/// nodes it creates).
pub const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Its value.
pub const NODE_ANNOTATION_VALUE: &str = "fake";
/// Pod IPs KWOK hands out. Never routed and never dialled: a pod's real listener binds
/// the address's loopback twin (`10.64.1.2` → `127.64.1.2`, [`podnet::loopback_twin`]).
/// They cannot be loopback addresses themselves, for kube-apiserver refuses loopback
/// EndpointSlice addresses (k8s.io/kubernetes `pkg/apis/discovery/validation/validation.go:122`
/// calls `ValidateEndpointIP`, `pkg/apis/core/validation/validation.go:8756-8758`), so the
/// EndpointSlice controller could not publish such pods. KWOK's pod controller takes a
/// pod's IP from its node's `spec.podCIDRs`/`spec.podCIDR` and only without one from
/// `--cidr` (sigs.k8s.io/kwok `pkg/kwok/controllers/pod_controller.go:745-776`,
/// `funcPodIPWith`); nothing sets a podCIDR on our nodes — we register them without,
/// kube-controller-manager allocates none without `--allocate-node-cidrs` (off by
/// default: k8s.io/cloud-provider `options/kubecloudshared.go:60`; k8s.io/kubernetes
/// `cmd/kube-controller-manager/app/core.go:89` then skips the node IPAM controller) and
/// Karpenter's KWOK provider sets none — so every pod IP is from here and every twin is in
/// `127.64.0.0/12`. The pool's first address is the CIDR's address plus one
/// (`pkg/kwok/controllers/utils.go:56-68`; `pkg/utils/net/ip.go:77-84` keeps the address
/// as written): `10.64.0.1`.
///
/// [`podnet::loopback_twin`]: crate::podnet::loopback_twin
pub const POD_CIDR: &str = "10.64.0.0/12";
/// How long a node's Lease lasts; KWOK renews it at a quarter of that, well inside the node
/// lifecycle controller's grace period (50 s).
const LEASE_SECONDS: u32 = 40;

/// Why KWOK could not be started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing its stages or opening its log failed.
    #[error("kwok: {path}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The binary did not start.
    #[error("kwok: start {binary}")]
    Spawn {
        /// The binary.
        binary: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A running KWOK process; dropping it kills the process.
#[derive(Debug)]
pub struct Kwok {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Kwok {
    /// Starts `binary` against the API server of `kubeconfig` (an administrator's), managing
    /// the nodes that carry [`NODE_ANNOTATION`], with the stages of `cfg`. Its stages file and
    /// log go to `dir`.
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        dir: &Path,
        cfg: &KubeletConfig,
    ) -> Result<Kwok, Error> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| Error::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let stages_path = dir.join("kwok-stages.yaml");
        std::fs::write(&stages_path, stages(cfg)).map_err(io(&stages_path))?;
        let log = dir.join("kwok.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io(&log))?;
        let err = out.try_clone().map_err(io(&log))?;
        let child = tokio::process::Command::new(binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--config={}", stages_path.display()))
            .arg(format!(
                "--manage-nodes-with-annotation-selector={NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}"
            ))
            .arg(format!("--cidr={POD_CIDR}"))
            .arg(format!("--node-lease-duration-seconds={LEASE_SECONDS}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| Error::Spawn {
                binary: binary.display().to_string(),
                source,
            })?;
        Ok(Kwok { child, log })
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Waits until the process exits (it should not before it is dropped) and says how.
    pub async fn wait(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        }
    }
}

/// The KWOK stages that play `cfg`'s kubelet: one per transition, each selecting a state no
/// other stage selects (KWOK picks at random among stages that match). Delays are fixed: a
/// jitter in KWOK is a random delay between the two.
pub fn stages(cfg: &KubeletConfig) -> String {
    let start = cfg.start_delay.as_millis();
    let exit = cfg.exit_after_sigterm.as_millis();
    // `exit_after_sigterm` after the deletion, or the grace period's end if sooner: the
    // deletionTimestamp is that end (a jq expression; the fixed delay is its fallback).
    let until_exit = format!(
        "[((.metadata.deletionTimestamp | fromdate) - now) * 1000, {exit}] | min | if . < 0 then 0 else . end | \"\\(floor)ms\""
    );
    format!(
        r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-ready
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      {{{{ range NodeConditions }}}}
      - lastHeartbeatTime: {{{{ $now | Quote }}}}
        lastTransitionTime: {{{{ $now | Quote }}}}
        message: {{{{ .message | Quote }}}}
        reason: {{{{ .reason | Quote }}}}
        status: {{{{ .status | Quote }}}}
        type: {{{{ .type | Quote }}}}
      {{{{ end }}}}
      addresses:
      - address: {{{{ .metadata.name | Quote }}}}
        type: Hostname
      {{{{ with .status.allocatable }}}}
      allocatable:
      {{{{ YAML . 1 }}}}
      {{{{ end }}}}
      {{{{ with .status.capacity }}}}
      capacity:
      {{{{ YAML . 1 }}}}
      {{{{ end }}}}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-created
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.podIP'
      operator: DoesNotExist
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{type: PodScheduled, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Initialized, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: ContainersReady, status: "False", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "False", lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state: {{waiting: {{reason: ContainerCreating}}}}
      {{{{ end }}}}
      hostIP: {{{{ NodeIPWith .spec.nodeName | Quote }}}}
      podIP: {{{{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}}}
      phase: Pending
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: [Pending]
    - key: '.status.podIP'
      operator: Exists
    - key: '.metadata.annotations["{NEVER_READY_ANNOTATION}"]'
      operator: DoesNotExist
  delay:
    durationMilliseconds: {start}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{type: ContainersReady, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        ready: true
        restartCount: 0
        started: true
        state: {{running: {{startedAt: {{{{ $now | Quote }}}}}}}}
      {{{{ end }}}}
      phase: Running
      startTime: {{{{ $now | Quote }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-finished
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: [Running]
    - key: '.spec.restartPolicy'
      operator: In
      values: [Never, OnFailure]
    - key: '.metadata.annotations["{RUN_FOR_ANNOTATION}"]'
      operator: Exists
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.annotations["{RUN_FOR_ANNOTATION}"]'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $code := or (index .metadata.annotations "{EXIT_CODE_ANNOTATION}") "0" }}}}
      conditions:
      - {{type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{{{ $code }}}}
            reason: {{{{ if eq $code "0" }}}}Completed{{{{ else }}}}Error{{{{ end }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {{{{ if eq $code "0" }}}}Succeeded{{{{ else }}}}Failed{{{{ end }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-terminated
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
    - key: '.metadata.finalizers'
      operator: Exists
    - key: '.spec.restartPolicy'
      operator: In
      values: [Never, OnFailure]
    - key: '.status.phase'
      operator: NotIn
      values: [Succeeded, Failed]
  delay:
    durationMilliseconds: {exit}
    durationFrom:
      jq:
        expression: '{until_exit}'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state: {{terminated: {{exitCode: 143, reason: Error, finishedAt: {{{{ $now | Quote }}}}}}}}
      {{{{ end }}}}
      phase: Failed
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-deleted
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
    - key: '.metadata.finalizers'
      operator: DoesNotExist
  delay:
    durationMilliseconds: {exit}
    durationFrom:
      jq:
        expression: '{until_exit}'
  next:
    delete: true
"#
    )
}

/// What the app-playing kubelets of KWOK's nodes share.
#[derive(Clone)]
pub(crate) struct AppHost {
    pub client: kube::Client,
    pub config: KubeletConfig,
    pub app: Behaviour,
    pub apps: Apps,
    pub timeline: Timeline,
    pub isolation_label: Option<String>,
    pub pod_net: Option<PodNet>,
}

/// Whether KWOK manages `node`.
pub fn managed(node: &Node) -> bool {
    node.annotations().get(NODE_ANNOTATION).map(String::as_str) == Some(NODE_ANNOTATION_VALUE)
}

/// Runs an app-playing kubelet for every node KWOK manages, as nodes come and go, until
/// `shutdown`.
pub(crate) async fn run_app_hosts(
    host: AppHost,
    shutdown: CancellationToken,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(host.client.clone());
    let mut events = std::pin::pin!(watcher(nodes, watcher::Config::default()));
    let mut running: HashMap<String, CancellationToken> = HashMap::new();
    let mut index = 0usize;
    let mut start = |name: &str, running: &mut HashMap<String, CancellationToken>| {
        if running.contains_key(name) {
            return;
        }
        let stop = shutdown.child_token();
        let ctx = kubelet::Context {
            client: host.client.clone(),
            node: name.to_string(),
            node_index: index,
            config: host.config,
            app: host.app,
            apps: host.apps.clone(),
            timeline: host.timeline.clone(),
            isolation_label: host.isolation_label.clone(),
            kwok: true,
            pod_net: host.pod_net.clone(),
        };
        index += 1;
        spawn_owned("kubelet", stop.clone(), kubelet::run(ctx, stop.clone()));
        running.insert(name.to_string(), stop);
    };
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            e = events.next() => e,
        };
        let Some(event) = event else {
            return Ok(());
        };
        match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                if managed(&node) && node.metadata.deletion_timestamp.is_none() {
                    start(&node.name_any(), &mut running);
                }
            }
            Ok(watcher::Event::Delete(node)) => {
                if let Some(stop) = running.remove(&node.name_any()) {
                    stop.cancel();
                }
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(error) => {
                tracing::info!(%error, "watching nodes for KWOK's kubelets; the watch retries");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ips_are_valid_endpoints_with_loopback_twins() {
        let (ip, prefix) = POD_CIDR.split_once('/').unwrap();
        let first: std::net::Ipv4Addr = ip.parse().unwrap();
        let prefix: u32 = prefix.parse().unwrap();
        let last = std::net::Ipv4Addr::from(u32::from(first) | (u32::MAX >> prefix));
        for ip in [first, last] {
            assert!(
                !ip.is_loopback(),
                "{ip}: kube-apiserver refuses it in an EndpointSlice"
            );
            let twin = crate::podnet::loopback_twin(ip.into()).unwrap();
            assert!(twin.is_loopback(), "{twin}");
        }
        assert!(prefix >= 8, "the twins keep the addresses apart");
    }

    #[test]
    fn stages_carry_the_kubelet_timings() {
        let cfg = KubeletConfig {
            start_delay: Duration::from_millis(700),
            accept_after_sigterm: Duration::ZERO,
            exit_after_sigterm: Duration::from_millis(1500),
        };
        let text = stages(&cfg);
        let docs: Vec<&str> = text.split("\n---\n").collect();
        let name = |d: &str| {
            let line = d.lines().find(|l| l.starts_with("  name: ")).unwrap();
            line.trim_start_matches("  name: ").to_string()
        };
        let names: Vec<String> = docs.iter().map(|d| name(d)).collect();
        assert_eq!(
            names,
            [
                "node-ready",
                "pod-created",
                "pod-ready",
                "pod-finished",
                "pod-terminated",
                "pod-deleted"
            ]
        );
        let delay = |stage: &str| {
            let d = docs.iter().find(|d| name(d) == stage).unwrap();
            d.lines()
                .find_map(|l| l.trim().strip_prefix("durationMilliseconds: "))
                .map(str::to_string)
        };
        assert_eq!(delay("pod-ready").as_deref(), Some("700"));
        assert_eq!(delay("pod-deleted").as_deref(), Some("1500"));
        assert_eq!(delay("pod-terminated").as_deref(), Some("1500"));
        assert_eq!(delay("pod-created"), None);
        // Every template action survived the format string whole: each opens with `{{ `
        // and closes with ` }}` (YAML flow maps around them use single braces).
        assert_eq!(text.matches("{{ ").count(), text.matches(" }}").count());
        assert!(!text.contains("{{{{"), "{text}");
    }
}
