//! The simulated kubelet of one node, authenticated as `system:node:<node>`.
//!
//! For each pod bound to its node it plays the container's life on the shared
//! [`Apps`] registry: the app starts, serves `start_delay` later (the pod gets an IP,
//! phase Running and Ready=True); once the pod has a deletionTimestamp, SIGTERM is
//! delivered, Ready goes False, the app keeps accepting for `accept_after_sigterm`,
//! exits `exit_after_sigterm` after SIGTERM (or when the grace period ends, if sooner),
//! and the kubelet deletes the pod object (grace 0, UID precondition). A pod object that
//! disappears takes its app with it. Everything significant goes to the timeline.
//!
//! What the app does with SIGTERM is its [`Behaviour`] (the pod's
//! [`APP_BEHAVIOUR_ANNOTATION`], else the cluster's default): a graceful app closes its
//! listener after `accept_after_sigterm`, closes its idle keep-alive connections and
//! exits once its requests in flight are answered (not before `exit_after_sigterm`); a
//! naive app keeps accepting and serving until it exits at `exit_after_sigterm`, cutting
//! what is in flight and leaving its connections to be reset. The grace period's end
//! kills either.
//!
//! Batch pods — `restartPolicy` Never or OnFailure, as a Job's — can also finish: with the
//! [`RUN_FOR_ANNOTATION`] (`sim.graceful-drain.io/run-for: 2s`, usually set on a Job's pod
//! template) the container exits on its own that long after it started serving, with the
//! [`EXIT_CODE_ANNOTATION`] (default 0), and the pod gets its terminal phase: Succeeded for
//! 0, Failed otherwise, with the code in its container's `terminated` state. A batch pod
//! that is deleted first reports phase Failed (exit code 143 after SIGTERM, 137 when the
//! grace period ran out) before its object is deleted, as upstream's kubelet makes a pod
//! terminal before deleting it (KEP-3329), so a Job controller can see how it ended.
//! Container restarts are not modelled, so OnFailure behaves like Never. Pods with
//! `restartPolicy: Always` (every Deployment, StatefulSet and DaemonSet pod) ignore the
//! annotations and behave as before.
//!
//! With a [`PodNet`] the apps are real HTTP servers too: a pod's listener opens on the
//! loopback twin of its IP once its app accepts and the pod has an IP (KWOK's, or the one
//! this kubelet reports), and closes, closes its idle connections and is killed at the
//! moments the registry's app does ([`crate::podnet`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use super::{Reconciler, Result, Watches, api_err, key, ns_name, ready, run_passes, status_code};
use crate::podnet::{self, PodNet};
use crate::traffic::apps::{APP_BEHAVIOUR_ANNOTATION, Apps, Behaviour};
use crate::traffic::timeline::{EventKind, Timeline};
use tokio_util::sync::CancellationToken;

/// Concurrent status patches and deletes of one kubelet.
const CALL_CONCURRENCY: usize = 16;
/// Grace period when the pod does not say (the Kubernetes default).
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// How often a graceful app that is past `exit_after_sigterm` is looked at again, to
/// see whether its last request in flight was answered (the app does not tell the
/// kubelet): well under the load-balancer lags, cheap for a handful of pods.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// How long after it started serving a batch pod's container exits on its own (a
/// humantime duration such as `2s`); without it, it runs until the pod is deleted.
pub const RUN_FOR_ANNOTATION: &str = "sim.graceful-drain.io/run-for";
/// The exit code of a container that ends per [`RUN_FOR_ANNOTATION`] (default 0).
pub const EXIT_CODE_ANNOTATION: &str = "sim.graceful-drain.io/exit-code";
/// A pod with this annotation never starts serving and never turns Ready (an image that
/// never pulls, a readiness probe that never passes): a rollout to it stalls.
pub const NEVER_READY_ANNOTATION: &str = "sim.graceful-drain.io/never-ready";
/// Exit code of a process that ended on SIGTERM (128 + 15).
const SIGTERM_EXIT_CODE: i32 = 143;
/// Exit code of a process killed when the grace period ran out (128 + 9).
const SIGKILL_EXIT_CODE: i32 = 137;
/// How soon a pod's listener is tried again after its address could not be bound (held
/// by a pod of the same IP that is not killed yet, which takes one of this kubelet's
/// passes): quick next to a start delay, slow enough not to spin.
const OPEN_RETRY: Duration = Duration::from_millis(200);

/// Timings of the simulated containers.
#[derive(Clone, Copy, Debug)]
pub struct KubeletConfig {
    /// From "bound to the node" to "serving and Ready".
    pub start_delay: Duration,
    /// How long the app keeps accepting new requests after SIGTERM.
    pub accept_after_sigterm: Duration,
    /// How long after SIGTERM the app exits (capped by the grace period).
    pub exit_after_sigterm: Duration,
}

/// What the kubelet knows about one of its pods.
#[derive(Debug)]
struct Local {
    pod: String,
    /// What its app does with SIGTERM.
    behaviour: Behaviour,
    ip: String,
    seen: Instant,
    ready_reported: bool,
    isolated: bool,
    sigterm: Option<Instant>,
    not_ready_reported: bool,
    stopped_accepting: bool,
    exited: bool,
    /// A batch pod's terminal phase has been reported.
    terminal_reported: bool,
    deleted: bool,
    /// Its real listener, with a [`PodNet`].
    listener: Listener,
}

/// Where a pod's real listener is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Listener {
    /// Not opened yet.
    #[default]
    Unopened,
    /// Binding failed `failures` times; tried again at `at`.
    Retrying { at: Instant, failures: u32 },
    /// Opened (and possibly closed since: the [`PodNet`] knows).
    Opened,
    /// Never to be opened: its IP has no loopback twin to bind.
    Refused,
}

/// What a pod's step may touch besides its own state.
struct Env<'a> {
    cfg: KubeletConfig,
    apps: &'a Apps,
    timeline: &'a Timeline,
    /// The pods' real listeners, if they have any.
    net: Option<&'a PodNet>,
    /// KWOK assigns the pods' IPs (see [`Context::kwok`]).
    kwok: bool,
}

impl Env<'_> {
    /// The app closes its listener.
    fn stop_accepting(&self, uid: &str) {
        self.apps.stop_accepting(uid);
        if let Some(net) = self.net {
            net.close_listener(uid);
        }
    }

    /// The app closes its idle connections; returns how many the registry closed.
    fn close_idle(&self, uid: &str) -> usize {
        let closed = self.apps.close_idle(uid);
        if let Some(net) = self.net {
            net.close_idle(uid);
        }
        closed
    }

    /// The app's process ends; returns how many requests were cut.
    fn exit(&self, uid: &str) -> u32 {
        let cut = self.apps.exit(uid);
        if let Some(net) = self.net {
            net.kill(uid);
        }
        cut
    }
}

impl Local {
    fn new(pod: String, ip: String, now: Instant) -> Local {
        Local {
            pod,
            behaviour: Behaviour::default(),
            ip,
            seen: now,
            ready_reported: false,
            isolated: false,
            sigterm: None,
            not_ready_reported: false,
            stopped_accepting: false,
            exited: false,
            terminal_reported: false,
            deleted: false,
            listener: Listener::default(),
        }
    }

    /// A pod not being deleted: start serving after the start delay, report Ready.
    fn running(
        &mut self,
        env: &Env<'_>,
        uid: &str,
        pod: &Pod,
        now: Instant,
    ) -> (Option<Call>, Option<Instant>) {
        if self.terminal_reported || pod.annotations().contains_key(NEVER_READY_ANNOTATION) {
            return (None, None);
        }
        let serve_at = self.seen + env.cfg.start_delay;
        // KWOK times the pod's readiness itself, from when it saw the pod: once it reported
        // it Ready, the app serves, whatever this kubelet's own clock says, so that a load
        // balancer never finds a Ready pod that does not listen yet.
        let reported_ready = env.kwok && super::pod_ready(pod);
        if now < serve_at && !reported_ready {
            return (None, Some(serve_at));
        }
        env.apps.serve(uid);
        let (ns, name) = ns_name(pod);
        if !self.ready_reported {
            let call = Call::Ready {
                ns,
                name,
                ip: self.ip.clone(),
                containers: container_names(pod),
            };
            return (Some(call), None);
        }
        let Some(run_for) = run_for(pod) else {
            return (None, None);
        };
        let end = serve_at + run_for;
        if now < end {
            return (None, Some(end));
        }
        if !self.exited {
            self.exited = true;
            env.exit(uid);
        }
        let call = Call::Terminal {
            ns,
            name,
            containers: container_names(pod),
            exit_code: exit_code(pod),
        };
        (Some(call), None)
    }

    /// A pod being deleted: SIGTERM, Ready=False, stop accepting, exit, delete.
    fn terminating(
        &mut self,
        env: &Env<'_>,
        uid: &str,
        pod: &Pod,
        now: Instant,
    ) -> (Option<Call>, Option<Instant>) {
        let (ns, name) = ns_name(pod);
        if self.terminal_reported {
            // Finished (on its own, or reported Failed below): nothing left but the object.
            let call = (!self.deleted).then(|| Call::Delete {
                ns,
                name,
                uid: uid.to_string(),
            });
            return (call, None);
        }
        let sigterm = *self.sigterm.get_or_insert_with(|| {
            env.apps.sigterm(uid);
            env.timeline.record(EventKind::Terminating, &self.pod);
            now
        });
        let next = self.shut_down(env, uid, grace_of(pod), sigterm, now);
        if self.exited && !self.deleted && is_batch(pod) {
            let killed = env.cfg.exit_after_sigterm > grace_of(pod);
            let call = Call::Terminal {
                ns,
                name,
                containers: container_names(pod),
                exit_code: if killed {
                    SIGKILL_EXIT_CODE
                } else {
                    SIGTERM_EXIT_CODE
                },
            };
            return (Some(call), None);
        }
        if self.exited && !self.deleted {
            return (
                Some(Call::Delete {
                    ns,
                    name,
                    uid: uid.to_string(),
                }),
                None,
            );
        }
        if !self.not_ready_reported {
            return (Some(Call::NotReady { ns, name }), next);
        }
        (None, next)
    }
}

impl Local {
    /// Plays SIGTERM's effect on the app as its behaviour says: stop accepting (and, for a
    /// graceful app, close idle connections), then exit. Returns when to look again.
    fn shut_down(
        &mut self,
        env: &Env<'_>,
        uid: &str,
        grace: Duration,
        sigterm: Instant,
        now: Instant,
    ) -> Option<Instant> {
        let graceful = self.behaviour == Behaviour::Graceful;
        let kill_at = sigterm + grace;
        let exit_at = sigterm + env.cfg.exit_after_sigterm.min(grace);
        let stop_at = if graceful {
            (sigterm + env.cfg.accept_after_sigterm).min(exit_at)
        } else {
            exit_at
        };
        // A pod that never served has nothing to drain.
        let never_served = !self.ready_reported;
        if !self.stopped_accepting && (now >= stop_at || never_served) {
            self.stopped_accepting = true;
            env.stop_accepting(uid);
            env.timeline.record(EventKind::StoppedAccepting, &self.pod);
            let closed = if graceful { env.close_idle(uid) } else { 0 };
            if closed > 0 {
                let what = format!("{} ({closed} idle)", self.pod);
                env.timeline.record(EventKind::ClosedConnections, what);
            }
        }
        let drained = !graceful || env.apps.in_flight(uid) == 0;
        if !self.exited && (never_served || now >= kill_at || (now >= exit_at && drained)) {
            self.exited = true;
            env.exit(uid);
        }
        if self.exited {
            None
        } else if !self.stopped_accepting {
            Some(stop_at)
        } else if now < exit_at {
            Some(exit_at)
        } else {
            Some((now + DRAIN_POLL).min(kill_at))
        }
    }
}

impl Local {
    /// Opens the pod's real listener, on the loopback twin of its IP, once its app accepts
    /// and the pod has an IP (with a [`PodNet`]). Returns when to try again after a failed
    /// bind; a pod still waiting for KWOK's IP needs no timer, the status update that
    /// brings it wakes the kubelet.
    fn listen(&mut self, env: &Env<'_>, uid: &str, pod: &Pod, now: Instant) -> Option<Instant> {
        let net = env.net?;
        let failures = match self.listener {
            Listener::Opened | Listener::Refused => return None,
            Listener::Retrying { at, .. } if now < at => return Some(at),
            Listener::Retrying { failures, .. } => failures,
            Listener::Unopened => 0,
        };
        if !env.apps.accepting(uid) {
            return None;
        }
        let status_ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        let own_ip = (!env.kwok).then_some(self.ip.as_str());
        let ip = status_ip.filter(|ip| !ip.is_empty()).or(own_ip)?;
        let Some(twin) = ip.parse().ok().and_then(podnet::loopback_twin) else {
            tracing::warn!(pod = %self.pod, %ip, "pod IP has no loopback twin; no listener");
            self.listener = Listener::Refused;
            return None;
        };
        match net.open(uid, twin, net.port()) {
            Ok(addr) => {
                tracing::debug!(pod = %self.pod, %addr, "listening");
                self.listener = Listener::Opened;
                None
            }
            Err(error @ podnet::Error::NotLoopback { .. }) => {
                tracing::warn!(%error, "no listener");
                self.listener = Listener::Refused;
                None
            }
            Err(error) => {
                let source = std::error::Error::source(&error).map(ToString::to_string);
                if failures == 0 {
                    tracing::warn!(%error, ?source, "listener not opened; retrying");
                } else {
                    tracing::debug!(%error, ?source, failures, "listener not opened; retrying");
                }
                let at = now + OPEN_RETRY;
                self.listener = Listener::Retrying {
                    at,
                    failures: failures + 1,
                };
                Some(at)
            }
        }
    }
}

/// The earlier of two optional times.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The SIGTERM behaviour of `pod`'s app: its annotation's, else `default`.
fn behaviour_of(pod: &Pod, default: Behaviour) -> Behaviour {
    pod.annotations()
        .get(APP_BEHAVIOUR_ANNOTATION)
        .and_then(|b| b.trim().parse().ok())
        .unwrap_or(default)
}

/// An API call the kubelet decided on.
#[derive(Debug, PartialEq, Eq)]
enum Call {
    Ready {
        ns: String,
        name: String,
        ip: String,
        containers: Vec<String>,
    },
    NotReady {
        ns: String,
        name: String,
    },
    /// A batch pod's containers exited with `exit_code`: phase Succeeded or Failed.
    Terminal {
        ns: String,
        name: String,
        containers: Vec<String>,
        exit_code: i32,
    },
    Delete {
        ns: String,
        name: String,
        uid: String,
    },
}

struct Kubelet {
    client: kube::Client,
    node: String,
    node_index: usize,
    cfg: KubeletConfig,
    /// SIGTERM behaviour of apps whose pod does not say.
    app: Behaviour,
    apps: Apps,
    timeline: Timeline,
    /// See [`Context::isolation_label`].
    isolation_label: Option<String>,
    /// See [`Context::kwok`]: every call counts as made, none is.
    kwok: bool,
    /// See [`Context::pod_net`].
    pod_net: Option<PodNet>,
    pods: Store<Pod>,
    local: HashMap<String, Local>,
    next_ip: u32,
}

impl Kubelet {
    fn new_ip(&mut self) -> String {
        let n = self.next_ip;
        self.next_ip += 1;
        format!(
            "10.{}.{}.{}",
            100 + self.node_index % 150,
            n / 250,
            n % 250 + 2
        )
    }

    /// Advances one pod; returns the call to make and when to look again.
    fn step(&mut self, pod: &Pod, now: Instant) -> (Option<Call>, Option<Instant>) {
        let uid = pod.uid().unwrap_or_default();
        if !self.local.contains_key(&uid) {
            let mut local = Local::new(key(pod), self.new_ip(), now);
            local.behaviour = behaviour_of(pod, self.app);
            self.apps.start(&uid, &local.pod);
            self.local.insert(uid.clone(), local);
        }
        let env = Env {
            cfg: self.cfg,
            apps: &self.apps,
            timeline: &self.timeline,
            net: self.pod_net.as_ref(),
            kwok: self.kwok,
        };
        let Some(st) = self.local.get_mut(&uid) else {
            return (None, None);
        };
        let isolating = self.isolation_label.as_ref();
        if !st.isolated && isolating.is_some_and(|l| pod.labels().contains_key(l)) {
            st.isolated = true;
            env.timeline.record(EventKind::Isolated, &st.pod);
        }
        let (call, next) = match pod.metadata.deletion_timestamp {
            None => st.running(&env, &uid, pod, now),
            Some(_) => st.terminating(&env, &uid, pod, now),
        };
        let retry = st.listen(&env, &uid, pod, now);
        (call, earliest(next, retry))
    }
}

impl Reconciler for Kubelet {
    async fn pass(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let pods = self.pods.state();
        let mut calls = Vec::new();
        let mut next: Option<Instant> = None;
        for pod in &pods {
            let (call, at) = self.step(pod, now);
            calls.extend(call.map(|c| (pod.uid().unwrap_or_default(), c)));
            next = earliest(next, at);
        }
        self.forget_gone(&pods);
        let (client, node, kwok) = (&self.client, &self.node, self.kwok);
        let done: Vec<(String, Call)> = futures::stream::iter(calls)
            .map(|(uid, call)| async move {
                if kwok {
                    return Some((uid, call));
                }
                match make_call(client, &call).await {
                    Ok(()) => Some((uid, call)),
                    Err(error) => {
                        tracing::info!(%node, %error, "kubelet call failed; will retry");
                        None
                    }
                }
            })
            .buffer_unordered(CALL_CONCURRENCY)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        for (uid, call) in done {
            let Some(st) = self.local.get_mut(&uid) else {
                continue;
            };
            match call {
                Call::Ready { .. } => {
                    st.ready_reported = true;
                    self.timeline.record(EventKind::Ready, &st.pod);
                }
                Call::NotReady { .. } => st.not_ready_reported = true,
                Call::Terminal { .. } => st.terminal_reported = true,
                Call::Delete { .. } => st.deleted = true,
            }
        }
        next
    }
}

impl Kubelet {
    /// Pods gone from the cache: their apps go too.
    fn forget_gone(&mut self, pods: &[Arc<Pod>]) {
        let live: std::collections::HashSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
        let (apps, timeline, net) = (&self.apps, &self.timeline, &self.pod_net);
        self.local.retain(|uid, st| {
            if live.contains(uid) {
                return true;
            }
            if apps.exit(uid) > 0 {
                tracing::debug!(pod = %st.pod, "requests in flight cut by deletion");
            }
            if let Some(net) = net {
                net.kill(uid);
            }
            apps.remove(uid);
            timeline.record(EventKind::Deleted, &st.pod);
            false
        });
    }
}

fn grace_of(pod: &Pod) -> Duration {
    pod.metadata
        .deletion_grace_period_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_GRACE, Duration::from_secs)
}

/// Whether the pod's containers are not restarted when they exit (`restartPolicy` Never or
/// OnFailure): only such pods reach a terminal phase here.
fn is_batch(pod: &Pod) -> bool {
    matches!(
        pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()),
        Some("Never" | "OnFailure")
    )
}

/// The [`RUN_FOR_ANNOTATION`] of a batch pod, if it has a valid one.
fn run_for(pod: &Pod) -> Option<Duration> {
    if !is_batch(pod) {
        return None;
    }
    let text = pod.annotations().get(RUN_FOR_ANNOTATION)?;
    humantime::parse_duration(text.trim()).ok()
}

/// The [`EXIT_CODE_ANNOTATION`] of a pod (0 when absent or invalid).
fn exit_code(pod: &Pod) -> i32 {
    pod.annotations()
        .get(EXIT_CODE_ANNOTATION)
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0)
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
        .collect()
}

fn ready_status(ip: &str, containers: &[String], ready: bool) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_string();
    let flag = if ready { "True" } else { "False" };
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c, "ready": ready, "started": true, "restartCount": 0,
                "image": "sim", "imageID": "sim", "containerID": format!("sim://{c}"),
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let mut status = serde_json::json!({
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ],
    });
    if ready {
        status["podIP"] = ip.into();
        status["podIPs"] = serde_json::json!([{"ip": ip}]);
        status["startTime"] = now.clone().into();
        status["containerStatuses"] = statuses.into();
    }
    serde_json::json!({ "status": status })
}

/// The status of a pod whose containers all exited with `exit_code`, as a strategic merge
/// patch so that conditions the kubelet does not own (`DisruptionTarget`) stay.
fn terminal_status(containers: &[String], exit_code: i32) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_string();
    let (phase, reason) = match exit_code {
        0 => ("Succeeded", "Completed"),
        _ => ("Failed", "Error"),
    };
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c, "ready": false, "started": false, "restartCount": 0,
                "image": "sim", "imageID": "sim", "containerID": format!("sim://{c}"),
                "state": {"running": null, "terminated": {
                    "exitCode": exit_code, "reason": reason, "finishedAt": now,
                    "containerID": format!("sim://{c}"),
                }},
            })
        })
        .collect();
    serde_json::json!({"status": {
        "phase": phase,
        "conditions": [
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
        ],
        "containerStatuses": statuses,
    }})
}

async fn make_call(client: &kube::Client, call: &Call) -> Result<()> {
    let pp = PatchParams::default();
    match call {
        Call::Ready {
            ns,
            name,
            ip,
            containers,
        } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let patch = Patch::Merge(ready_status(ip, containers, true));
            match api.patch_status(name, &pp, &patch).await {
                Err(e) if status_code(&e) != Some(404) => {
                    Err(api_err("report ready", format!("pod {ns}/{name}"))(e))
                }
                _ => Ok(()),
            }
        }
        Call::NotReady { ns, name } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            // Strategic: conditions merge by type, so an eviction's DisruptionTarget stays
            // (upstream's status manager keeps conditions the kubelet does not own).
            let patch = Patch::Strategic(ready_status("", &[], false));
            match api.patch_status(name, &pp, &patch).await {
                Err(e) if status_code(&e) != Some(404) => {
                    Err(api_err("report not ready", format!("pod {ns}/{name}"))(e))
                }
                _ => Ok(()),
            }
        }
        Call::Terminal {
            ns,
            name,
            containers,
            exit_code,
        } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let patch = Patch::Strategic(terminal_status(containers, *exit_code));
            match api.patch_status(name, &pp, &patch).await {
                Err(e) if status_code(&e) != Some(404) => {
                    Err(api_err("report terminated", format!("pod {ns}/{name}"))(e))
                }
                _ => Ok(()),
            }
        }
        Call::Delete { ns, name, uid } => {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &dp).await {
                // 404: already gone; 409: a same-name replacement, not ours.
                Err(e) if !matches!(status_code(&e), Some(404 | 409)) => {
                    Err(api_err("delete", format!("pod {ns}/{name}"))(e))
                }
                _ => Ok(()),
            }
        }
    }
}

/// Marks the node Ready, as a kubelet's first status report does.
async fn report_node_ready(client: &kube::Client, node: &str) -> Result<()> {
    let now = jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(api_err("report ready", format!("node {node}")))?;
    Ok(())
}

/// Everything one kubelet needs.
pub struct Context {
    /// Authenticated as `system:node:<node>`.
    pub client: kube::Client,
    /// The Node this kubelet runs; it must be registered already (its Ready condition is
    /// reported at start), and only pods bound to it are played.
    pub node: String,
    /// Distinguishes the pod IP ranges of nodes: pods get `10.(100 + index % 150).x.y`, so
    /// indexes should differ modulo 150 among one cluster's nodes. KWOK's pods get KWOK's
    /// IPs instead.
    pub node_index: usize,
    /// The container timings.
    pub config: KubeletConfig,
    /// SIGTERM behaviour of apps whose pod has no [`APP_BEHAVIOUR_ANNOTATION`].
    pub app: Behaviour,
    /// The app registry the pods' apps are started in; share it with the traffic that
    /// should reach them.
    pub apps: Apps,
    /// Where the pods' significant moments are recorded: Ready, isolated, SIGTERM, stopped
    /// accepting, connections closed, deleted.
    pub timeline: Timeline,
    /// The label whose arrival on a pod is recorded as its isolation; `None` records none.
    pub isolation_label: Option<String>,
    /// KWOK runs the node (the `kwok` module): it reports the Node and the pods' status and
    /// deletes them, and this kubelet makes no API call — it only plays the apps inside the
    /// pods on the same timings.
    pub kwok: bool,
    /// Real listeners for the pods' apps ([`crate::podnet`]): each pod listens on the
    /// loopback twin of its IP (KWOK's, or the one this kubelet reports) at the net's port
    /// while its app accepts. `None`: the apps are reached in-process only.
    pub pod_net: Option<PodNet>,
}

/// Runs the kubelet of `ctx.node` until `shutdown`.
pub async fn run(ctx: Context, shutdown: CancellationToken) -> Result<()> {
    if !ctx.kwok {
        report_node_ready(&ctx.client, &ctx.node).await?;
    }
    let watches = Watches::new(ctx.client.clone(), shutdown.clone());
    let wake = watches.wake();
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node));
    let pods = watches.matching::<Pod>(cfg);
    if !ready(&pods, &shutdown).await {
        return Ok(());
    }
    let kubelet = Kubelet {
        client: ctx.client,
        node: ctx.node,
        node_index: ctx.node_index,
        cfg: ctx.config,
        app: ctx.app,
        apps: ctx.apps,
        timeline: ctx.timeline,
        isolation_label: ctx.isolation_label,
        kwok: ctx.kwok,
        pod_net: ctx.pod_net,
        pods,
        local: HashMap::new(),
        next_ip: 0,
    };
    run_passes(kubelet, &wake, &shutdown).await
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::fixtures::{self, PodFixture};
    use crate::traffic::apps::Ticket;

    fn cfg() -> KubeletConfig {
        KubeletConfig {
            start_delay: Duration::from_secs(1),
            accept_after_sigterm: Duration::from_secs(2),
            exit_after_sigterm: Duration::from_secs(5),
        }
    }

    fn pod(deleting: Option<i64>) -> Pod {
        let pod = fixtures::pod("p").ns("ns").with_uid("u");
        match deleting {
            Some(grace) => pod.deleting(jiff::Timestamp::UNIX_EPOCH, Some(grace)),
            None => pod,
        }
    }

    #[test]
    fn a_pod_serves_after_its_start_delay_then_drains_on_deletion() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: None,
            kwok: false,
        };
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut local = Local::new("ns/p".into(), "10.0.0.1".into(), t0);
        apps.start("u", "ns/p");
        assert!(matches!(local.running(&env, "u", &pod(None), t0), (None, Some(at)) if at == s(1)));
        assert!(matches!(
            local.running(&env, "u", &pod(None), s(1)),
            (Some(Call::Ready { .. }), None)
        ));
        local.ready_reported = true;
        assert!(apps.accepting("u"));
        // Deleted with 30 s of grace: SIGTERM now, still accepting for 2 s, exit at 5 s.
        let (call, next) = local.terminating(&env, "u", &pod(Some(30)), s(10));
        assert!(matches!(call, Some(Call::NotReady { .. })));
        assert_eq!(next, Some(s(12)));
        local.not_ready_reported = true;
        assert!(apps.accepting("u"), "accepts until the listener closes");
        assert_eq!(
            local.terminating(&env, "u", &pod(Some(30)), s(12)).1,
            Some(s(15))
        );
        assert!(!apps.accepting("u"));
        let (call, _) = local.terminating(&env, "u", &pod(Some(30)), s(15));
        assert!(matches!(call, Some(Call::Delete { ref uid, .. }) if uid == "u"));
        assert_eq!(apps.phase("u"), Some(crate::traffic::apps::Phase::Exited));
    }

    #[tokio::test]
    async fn a_kwok_pod_listens_on_the_twin_of_kwoks_ip_once_it_has_one_and_while_it_accepts() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let net = PodNet::new(apps.clone(), 0, CancellationToken::new()).unwrap();
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: Some(&net),
            kwok: true,
        };
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut local = Local::new("ns/p".into(), "10.100.0.2".into(), t0);
        apps.start("u", "ns/p");
        local.running(&env, "u", &pod(None), s(1));
        assert!(apps.accepting("u"));
        // KWOK has not given it an IP yet (and the kubelet's own is not the pod's).
        assert_eq!(local.listen(&env, "u", &pod(None), s(1)), None);
        assert_eq!(net.listening("u"), None);
        let with_ip = pod(None).ip("10.64.0.9");
        assert_eq!(local.listen(&env, "u", &with_ip, s(1)), None);
        let twin = "127.64.0.9".parse::<IpAddr>().unwrap();
        assert_eq!(net.listening("u").map(|a| a.ip()), Some(twin));
        // Terminating: the listener closes with the registry's, the kill ends the server.
        local.ready_reported = true;
        local.not_ready_reported = true;
        local.terminating(&env, "u", &pod(Some(30)), s(2));
        local.terminating(&env, "u", &pod(Some(30)), s(4));
        assert_eq!(
            net.listening("u"),
            None,
            "closed when the app stopped accepting"
        );
        assert!(net.close_idle("u"), "not killed before it exits");
        local.terminating(&env, "u", &pod(Some(30)), s(7));
        assert!(!net.close_idle("u"), "killed at exit");

        // A second pod of the same IP (the first not killed yet) retries its bind.
        apps.start("v", "ns/q");
        apps.serve("v");
        net.open("u2", twin, net.port()).unwrap();
        let mut other = Local::new("ns/q".into(), String::new(), t0);
        let retry = other.listen(&env, "v", &with_ip, s(8));
        assert_eq!(retry, Some(s(8) + OPEN_RETRY));
        assert_eq!(
            other.listen(&env, "v", &with_ip, s(8)),
            retry,
            "not before then"
        );
        net.kill("u2");
        assert_eq!(other.listen(&env, "v", &with_ip, s(9)), None);
        assert_eq!(net.listening("v").map(|a| a.ip()), Some(twin));
    }

    /// `pod(deleting)` with `restartPolicy` and the run-for and exit-code annotations.
    fn batch(deleting: Option<i64>, restart: &str, exit_code: &str) -> Pod {
        let mut pod = pod(deleting)
            .container("sim/batch:1")
            .annotate(RUN_FOR_ANNOTATION, "2s")
            .annotate(EXIT_CODE_ANNOTATION, exit_code);
        pod.spec.as_mut().unwrap().restart_policy = Some(restart.into());
        pod
    }

    #[test]
    fn a_batch_pod_exits_on_its_own_with_its_exit_code() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: None,
            kwok: false,
        };
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut local = Local::new("ns/p".into(), "10.0.0.1".into(), t0);
        apps.start("u", "ns/p");
        let job_pod = batch(None, "Never", "3");
        assert!(matches!(
            local.running(&env, "u", &job_pod, s(1)),
            (Some(Call::Ready { .. }), None)
        ));
        local.ready_reported = true;
        // Serving since 1 s, runs for 2 s.
        assert_eq!(local.running(&env, "u", &job_pod, s(2)), (None, Some(s(3))));
        let (call, _) = local.running(&env, "u", &job_pod, s(3));
        assert!(matches!(call, Some(Call::Terminal { exit_code: 3, .. })));
        assert_eq!(apps.phase("u"), Some(crate::traffic::apps::Phase::Exited));
        local.terminal_reported = true;
        assert_eq!(local.running(&env, "u", &job_pod, s(4)), (None, None));
        // Deleted afterwards: nothing to drain, the object goes at once.
        let (call, _) = local.terminating(&env, "u", &batch(Some(30), "Never", "3"), s(5));
        assert!(matches!(call, Some(Call::Delete { .. })));
        let status = terminal_status(&["app".into()], 3);
        assert_eq!(status["status"]["phase"], "Failed");
        let terminated = &status["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(terminated["exitCode"], 3);
        assert_eq!(
            terminal_status(&["app".into()], 0)["status"]["phase"],
            "Succeeded"
        );
    }

    #[test]
    fn a_deleted_batch_pod_is_failed_before_its_object_goes_and_others_are_unchanged() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: None,
            kwok: false,
        };
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut local = Local::new("ns/p".into(), "10.0.0.1".into(), t0);
        local.ready_reported = true;
        local.not_ready_reported = true;
        apps.start("u", "ns/p");
        apps.serve("u");
        let evicted = batch(Some(30), "Never", "0");
        local.terminating(&env, "u", &evicted, t0);
        // Exits 5 s after SIGTERM, within the grace period: 143.
        let (call, _) = local.terminating(&env, "u", &evicted, s(5));
        assert!(matches!(call, Some(Call::Terminal { exit_code: 143, .. })));
        local.terminal_reported = true;
        let (call, _) = local.terminating(&env, "u", &evicted, s(5));
        assert!(matches!(call, Some(Call::Delete { .. })));
        // Killed when a 1 s grace period ran out: 137.
        let mut local = Local::new("ns/q".into(), "10.0.0.2".into(), t0);
        local.ready_reported = true;
        local.not_ready_reported = true;
        let killed = batch(Some(1), "OnFailure", "0");
        local.terminating(&env, "v", &killed, t0);
        let (call, _) = local.terminating(&env, "v", &killed, s(1));
        assert!(matches!(call, Some(Call::Terminal { exit_code: 137, .. })));
        // A server pod (restartPolicy Always) ignores the annotations: it serves on.
        let mut local = Local::new("ns/r".into(), "10.0.0.3".into(), t0);
        local.ready_reported = true;
        let server = batch(None, "Always", "0");
        assert_eq!(local.running(&env, "w", &server, s(10)), (None, None));
        let deleted = batch(Some(30), "Always", "0");
        local.not_ready_reported = true;
        local.terminating(&env, "w", &deleted, s(10));
        let (call, _) = local.terminating(&env, "w", &deleted, s(15));
        assert!(matches!(call, Some(Call::Delete { .. })));
    }

    #[test]
    fn the_grace_period_caps_the_shutdown() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: None,
            kwok: false,
        };
        let t0 = Instant::now();
        let mut local = Local::new("ns/p".into(), "10.0.0.1".into(), t0);
        local.ready_reported = true;
        local.not_ready_reported = true;
        apps.start("u", "ns/p");
        apps.serve("u");
        // Grace 1 s: killed after one second although the app wanted five.
        let (_, next) = local.terminating(&env, "u", &pod(Some(1)), t0);
        assert_eq!(next, Some(t0 + Duration::from_secs(1)));
        let (call, _) = local.terminating(&env, "u", &pod(Some(1)), t0 + Duration::from_secs(1));
        assert!(matches!(call, Some(Call::Delete { .. })));
    }

    /// A served app of `behaviour` with one idle and one busy keep-alive connection.
    fn serving(behaviour: Behaviour, apps: &Apps, t0: Instant) -> (Local, Ticket) {
        let mut local = Local::new("ns/p".into(), "10.0.0.1".into(), t0);
        local.behaviour = behaviour;
        local.ready_reported = true;
        local.not_ready_reported = true;
        apps.start("u", "ns/p");
        apps.serve("u");
        apps.connect("u").unwrap();
        let busy = apps.connect("u").unwrap();
        (local, apps.send(busy).unwrap())
    }

    #[test]
    fn a_graceful_app_closes_idle_connections_and_exits_once_its_requests_are_answered() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: None,
            kwok: false,
        };
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let (mut local, in_flight) = serving(Behaviour::Graceful, &apps, t0);
        let deleting = pod(Some(30));
        assert_eq!(local.terminating(&env, "u", &deleting, t0).1, Some(s(2)));
        assert_eq!(
            apps.stranded_connections(),
            0,
            "still accepting: nothing stranded"
        );
        // At 2 s the listener and the idle connection close; the busy one stays.
        assert_eq!(local.terminating(&env, "u", &deleting, s(2)).1, Some(s(5)));
        assert!(!apps.accepting("u"));
        assert_eq!(apps.stranded_connections(), 1);
        // At 5 s a request is still in flight: the app waits for it, looking again soon.
        let (call, next) = local.terminating(&env, "u", &deleting, s(5));
        assert!(call.is_none());
        assert_eq!(next, Some(s(5) + DRAIN_POLL));
        assert!(
            apps.finish(in_flight),
            "answered, its connection then closed"
        );
        assert_eq!(apps.stranded_connections(), 0);
        let (call, _) = local.terminating(&env, "u", &deleting, s(6));
        assert!(matches!(call, Some(Call::Delete { .. })));
        let closed = timeline.between(t0, s(7));
        assert!(
            closed
                .iter()
                .any(|e| e.kind == EventKind::ClosedConnections)
        );
    }

    #[test]
    fn a_graceful_app_is_killed_at_the_end_of_the_grace_period() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: None,
            kwok: false,
        };
        let t0 = Instant::now();
        let (mut local, in_flight) = serving(Behaviour::Graceful, &apps, t0);
        let deleting = pod(Some(8));
        local.terminating(&env, "u", &deleting, t0);
        let (_, next) = local.terminating(&env, "u", &deleting, t0 + Duration::from_millis(7_990));
        assert_eq!(
            next,
            Some(t0 + Duration::from_secs(8)),
            "no later than the kill"
        );
        let (call, _) = local.terminating(&env, "u", &deleting, t0 + Duration::from_secs(8));
        assert!(matches!(call, Some(Call::Delete { .. })));
        assert!(
            !apps.finish(in_flight),
            "the request in flight is cut by the kill"
        );
    }

    #[test]
    fn a_naive_app_serves_until_it_exits_and_leaves_its_connections_to_be_reset() {
        let (apps, timeline) = (Apps::default(), Timeline::new());
        let env = Env {
            cfg: cfg(),
            apps: &apps,
            timeline: &timeline,
            net: None,
            kwok: false,
        };
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let (mut local, in_flight) = serving(Behaviour::Naive, &apps, t0);
        let deleting = pod(Some(30));
        // accept_after_sigterm means nothing to it: it accepts until it exits at 5 s.
        assert_eq!(local.terminating(&env, "u", &deleting, t0).1, Some(s(5)));
        assert!(local.terminating(&env, "u", &deleting, s(2)).1 == Some(s(5)));
        assert!(apps.accepting("u"));
        assert_eq!(apps.stranded_connections(), 0);
        let (call, _) = local.terminating(&env, "u", &deleting, s(5));
        assert!(matches!(call, Some(Call::Delete { .. })));
        assert!(!apps.finish(in_flight), "the request in flight is cut");
        assert_eq!(
            apps.stranded_connections(),
            2,
            "both connections reset, not closed"
        );
        let annotated = {
            let mut p = pod(None);
            p.metadata.annotations =
                Some([(APP_BEHAVIOUR_ANNOTATION.to_string(), "naive".to_string())].into());
            p
        };
        assert_eq!(
            behaviour_of(&annotated, Behaviour::Graceful),
            Behaviour::Naive
        );
        assert_eq!(behaviour_of(&pod(None), Behaviour::Naive), Behaviour::Naive);
    }
}
