//! The node agent over real unix sockets, with a test playing the kubelet (registration
//! handshake, then the SLM Start/End loop) against an in-process fake API server that
//! records every request: drains to `drain-complete`, PDB-blocked evictions are retried and
//! reported, filter refusals fail the transition, a restarted agent resumes a drain, and
//! the RPCs answer even when the API server hangs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use graceful_drain::agent::{self, Args};
use graceful_drain::proto::registration::RegistrationStatus;
use graceful_drain::proto::registration::registration_client::RegistrationClient;
use graceful_drain::runtime::Shutdown;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::broadcast;

const NODE: &str = "n1";

mod agent_support {
    pub mod kubelet;
}
use agent_support::kubelet::{DEADLINE, Kubelet, connect};

/// An in-process API server faking just what the agent uses.
mod fake {
    use super::*;

    type Reply = Response<BoxBody<Bytes, Infallible>>;

    #[derive(Default)]
    pub struct State {
        pub rv: u64,
        pub node: Value,
        pub pods: BTreeMap<(String, String), Value>,
        pub pdbs: Vec<Value>,
        pub daemonsets: HashSet<(String, String)>,
        pub transitions: BTreeMap<String, Value>,
        /// LifecycleEvents by name (a drain runs only while its event is live).
        pub lifecycle_events: BTreeMap<String, Value>,
        pub events: Vec<Value>,
        /// Every (method, path, body) received.
        pub requests: Vec<(Method, String, Value)>,
        /// Pods whose next N evictions get a 429.
        pub pdb_blocks: BTreeMap<String, u32>,
        /// Evicted pods only get a deletionTimestamp (the test finishes them).
        pub hold_deletion: bool,
        /// Never answer anything (a hung API server).
        pub hang: bool,
        /// Refuse Node patches (missing RBAC).
        pub forbid_node_patch: bool,
        history: Vec<(u64, Value)>,
    }

    #[derive(Clone)]
    pub struct Fake {
        pub state: Arc<Mutex<State>>,
        events: broadcast::Sender<(u64, Value)>,
    }

    /// A LifecycleEvent of the drain transition on our node, claimed, due in an hour.
    pub fn claimed_event(name: &str) -> Value {
        let sla = (jiff::Timestamp::now() + Duration::from_secs(3600)).to_string();
        json!({"apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "LifecycleEvent",
               "metadata": {"name": name},
               "spec": {"transitionName": "graceful-drain", "bindingNode": NODE},
               "status": {"claimStatus": "Claimed", "sla": sla}})
    }

    fn json_reply(status: u16, body: &Value) -> Reply {
        let bytes = Bytes::from(body.to_string());
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes).boxed())
            .unwrap()
    }

    fn status(code: u16, message: &str) -> Reply {
        let reason = match code {
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            429 => "TooManyRequests",
            _ => "BadRequest",
        };
        json_reply(
            code,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": message, "reason": reason, "code": code}),
        )
    }

    pub fn pod(ns: &str, name: &str, owner: Option<&str>) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                "labels": {"app": name.split('-').next().unwrap()}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"}});
        if let Some(kind) = owner {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                "kind": kind, "name": "owner", "uid": "owner-uid", "controller": true}]);
        }
        pod
    }

    impl Fake {
        pub fn new() -> Self {
            let (events, _) = broadcast::channel(1024);
            let state = State {
                rv: 1,
                node: json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": NODE, "uid": "node-uid", "resourceVersion": "1"},
                    "spec": {}, "status": {"conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
                // The event the scripted kubelet drives, claimed with an SLA far ahead: a
                // drain lives only as long as its event.
                lifecycle_events: [("ev-1".to_string(), claimed_event("ev-1"))].into(),
                ..State::default()
            };
            Self {
                state: Arc::new(Mutex::new(state)),
                events,
            }
        }

        pub fn client(&self) -> kube::Client {
            let fake = self.clone();
            let service = tower::service_fn(move |req: Request<kube::client::Body>| {
                let fake = fake.clone();
                async move { Ok::<_, Infallible>(fake.handle(req).await) }
            });
            kube::Client::new(service, "default")
        }

        pub fn add_pod(&self, pod: Value) {
            let mut st = self.state.lock().unwrap();
            let key = (
                pod["metadata"]["namespace"].as_str().unwrap().to_string(),
                pod["metadata"]["name"].as_str().unwrap().to_string(),
            );
            st.pods.insert(key, pod.clone());
            self.emit(&mut st, "ADDED", pod);
        }

        fn emit(&self, st: &mut State, kind: &str, mut pod: Value) {
            st.rv += 1;
            pod["metadata"]["resourceVersion"] = json!(st.rv.to_string());
            let event = json!({"type": kind, "object": pod});
            st.history.push((st.rv, event.clone()));
            let _ = self.events.send((st.rv, event));
        }

        /// Finishes the termination of every terminating pod.
        pub fn finish_terminating(&self) {
            let mut st = self.state.lock().unwrap();
            let gone: Vec<_> = st
                .pods
                .iter()
                .filter(|(_, p)| p["metadata"].get("deletionTimestamp").is_some())
                .map(|(k, _)| k.clone())
                .collect();
            for key in gone {
                let pod = st.pods.remove(&key).unwrap();
                self.emit(&mut st, "DELETED", pod);
            }
        }

        async fn handle(&self, req: Request<kube::client::Body>) -> Reply {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let path = parts.uri.path().to_string();
            let query = parts.uri.query().unwrap_or_default().to_string();
            if self.state.lock().unwrap().hang {
                return futures::future::pending().await;
            }
            let mut st = self.state.lock().unwrap();
            st.requests
                .push((parts.method.clone(), path.clone(), body.clone()));
            let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            match (&parts.method, segments.as_slice()) {
                (&Method::GET, ["api", "v1", "nodes", _]) => json_reply(200, &st.node),
                (&Method::PATCH, ["api", "v1", "nodes", ..]) if st.forbid_node_patch => status(
                    403,
                    "nodes \"n1\" is forbidden: User cannot patch resource \"nodes\"",
                ),
                (&Method::PATCH, ["api", "v1", "nodes", _]) => {
                    json_patch::merge(&mut st.node, &body);
                    json_reply(200, &st.node)
                }
                (&Method::PATCH, ["api", "v1", "nodes", _, "status"]) => {
                    strategic_conditions(&mut st.node, body);
                    json_reply(200, &st.node)
                }
                (&Method::GET, ["api", "v1", "pods"]) if query.contains("watch=true") => {
                    drop(st);
                    self.watch(&query)
                }
                (&Method::GET, ["api", "v1", "pods"]) => {
                    let items: Vec<Value> = st.pods.values().cloned().collect();
                    json_reply(
                        200,
                        &json!({"apiVersion": "v1", "kind": "PodList",
                        "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
                    )
                }
                (&Method::POST, ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
                    let key = (ns.to_string(), name.to_string());
                    self.evict(&mut st, key, &body)
                }
                (&Method::GET, ["apis", "apps", "v1", "namespaces", ns, "daemonsets", name]) => {
                    if st.daemonsets.contains(&(ns.to_string(), name.to_string())) {
                        json_reply(200, &json!({"metadata": {"name": name, "namespace": ns}}))
                    } else {
                        status(404, "daemonsets.apps not found")
                    }
                }
                (
                    &Method::GET,
                    [
                        "apis",
                        "policy",
                        "v1",
                        "namespaces",
                        _,
                        "poddisruptionbudgets",
                    ],
                ) => json_reply(
                    200,
                    &json!({"apiVersion": "policy/v1",
                        "kind": "PodDisruptionBudgetList", "metadata": {}, "items": st.pdbs}),
                ),
                (&Method::POST, ["api", "v1", "namespaces", _, "events"]) => {
                    st.events.push(body.clone());
                    json_reply(201, &body)
                }
                (
                    &Method::GET,
                    [
                        "apis",
                        "lifecycle.k8s.io",
                        "v1alpha1",
                        "lifecycletransitions",
                        name,
                    ],
                ) => match st.transitions.get(*name) {
                    Some(t) => json_reply(200, t),
                    None => status(404, "not found"),
                },
                (
                    &Method::GET,
                    [
                        "apis",
                        "lifecycle.k8s.io",
                        "v1alpha1",
                        "lifecycleevents",
                        name,
                    ],
                ) => match st.lifecycle_events.get(*name) {
                    Some(e) => json_reply(200, e),
                    None => status(404, "not found"),
                },
                (
                    &Method::POST,
                    [
                        "apis",
                        "lifecycle.k8s.io",
                        "v1alpha1",
                        "lifecycletransitions",
                    ],
                ) => {
                    let name = body["metadata"]["name"].as_str().unwrap().to_string();
                    st.transitions.insert(name, body.clone());
                    json_reply(201, &body)
                }
                (&Method::GET, ["apis", "lifecycle.k8s.io", "v1alpha1"]) => {
                    // As on a cluster whose API server has the SLM API built in.
                    json_reply(
                        200,
                        &json!({"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": "lifecycle.k8s.io/v1alpha1", "resources": [
                        {"name": "lifecycleevents", "singularName": "lifecycleevent",
                         "namespaced": false, "kind": "LifecycleEvent", "verbs": ["get"]}]}),
                    )
                }
                _ => status(
                    404,
                    &format!("fake API: no route for {} {path}", parts.method),
                ),
            }
        }

        fn evict(&self, st: &mut State, key: (String, String), body: &Value) -> Reply {
            let well_formed = body["apiVersion"] == "policy/v1" && body["kind"] == "Eviction";
            if !well_formed {
                return status(400, "not a policy/v1 Eviction");
            }
            let Some(pod) = st.pods.get(&key).cloned() else {
                return status(404, "pod not found");
            };
            if body["deleteOptions"]["preconditions"]["uid"] != pod["metadata"]["uid"] {
                return status(409, "Precondition failed: UID in precondition");
            }
            if let Some(left) = st.pdb_blocks.get_mut(&key.1).filter(|n| **n > 0) {
                *left -= 1;
                return status(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                );
            }
            if st.hold_deletion {
                let mut pod = pod;
                pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                st.pods.insert(key, pod.clone());
                self.emit(st, "MODIFIED", pod);
            } else {
                st.pods.remove(&key);
                self.emit(st, "DELETED", pod);
            }
            json_reply(201, &json!({"kind": "Status", "status": "Success"}))
        }

        fn watch(&self, query: &str) -> Reply {
            let since: u64 = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let (backlog, live) = {
                let st = self.state.lock().unwrap();
                let backlog: Vec<(u64, Value)> = st
                    .history
                    .iter()
                    .filter(|(rv, _)| *rv > since)
                    .cloned()
                    .collect();
                (backlog, self.events.subscribe())
            };
            let last = backlog.last().map_or(since, |(rv, _)| *rv);
            let live = tokio_stream::wrappers::BroadcastStream::new(live)
                .filter_map(move |e| async move { e.ok().filter(|(rv, _)| *rv > last) });
            let stream = futures::stream::iter(backlog)
                .chain(live)
                .map(|(_, event)| {
                    Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{event}\n"))))
                });
            Response::builder()
                .status(200)
                .body(BodyExt::boxed(http_body_util::StreamBody::new(stream)))
                .unwrap()
        }
    }

    /// Strategic merge of `status.conditions` keyed by type.
    fn strategic_conditions(node: &mut Value, mut patch: Value) {
        let updates = patch["status"]["conditions"].take();
        let conditions = node["status"]["conditions"].as_array_mut().unwrap();
        for update in updates.as_array().into_iter().flatten() {
            match conditions.iter_mut().find(|c| c["type"] == update["type"]) {
                Some(existing) => json_patch::merge(existing, update),
                None => conditions.push(update.clone()),
            }
        }
    }
}

use fake::{Fake, pod};

fn args(dir: &Path, flags: &[&str]) -> Args {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let plugins = dir.join("plugins");
    let registry = dir.join("plugins_registry");
    let mut argv: Vec<String> = [
        "node-agent",
        "--node-name",
        NODE,
        "--admin-listen",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(["--plugins-dir".into(), plugins.display().to_string()]);
    argv.extend(["--registry-dir".into(), registry.display().to_string()]);
    if !flags.contains(&"--lifecycle-reconciler") {
        argv.extend(["--lifecycle-reconciler".into(), "off".into()]);
    }
    argv.extend(flags.iter().map(|s| s.to_string()));
    Cli::try_parse_from(argv).unwrap().args
}

/// Waits until `check` holds, within [`DEADLINE`].
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn condition(node: &Value, type_: &str) -> Value {
    node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or(Value::Null)
}

fn evictions(fake: &Fake) -> Vec<(String, Value)> {
    let st = fake.state.lock().unwrap();
    st.requests
        .iter()
        .filter(|(m, p, _)| *m == Method::POST && p.ends_with("/eviction"))
        .map(|(_, p, b)| (p.clone(), b.clone()))
        .collect()
}

async fn readyz(addr: std::net::SocketAddr) -> (u16, String) {
    get(addr, "/readyz").await
}

/// A plain HTTP/1.1 GET on the admin port: (status, whole response).
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let code = text[9..12].parse().unwrap();
    (code, text)
}

fn mixed_node(fake: &Fake) {
    let mut st = fake.state.lock().unwrap();
    st.daemonsets.insert(("kube-system".into(), "owner".into()));
    st.pdbs
        .push(json!({"metadata": {"name": "web-pdb", "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}}}));
    st.pdb_blocks.insert("web-2".into(), 2);
    drop(st);
    fake.add_pod(pod("shop", "web-1", Some("ReplicaSet")));
    fake.add_pod(pod("shop", "web-2", Some("ReplicaSet")));
    fake.add_pod(pod("kube-system", "proxy-1", Some("DaemonSet")));
    let mut mirror = pod("kube-system", "etcd-n1", None);
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
    fake.add_pod(mirror);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_drives_a_drain_to_completion_and_back_to_service() {
    graceful_drain::runtime::init_tracing(Default::default());
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    mixed_node(&fake);
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let admin = started.admin_addr;
    let reg_socket = started.registration_socket.clone();
    let agent_state = started.agent.clone();
    let running = tokio::spawn(started.wait());
    let mut kubelet = Kubelet::register(&reg_socket, NODE).await;

    // Both transitions are published for all nodes with our driver; /readyz follows.
    eventually("transitions published", || {
        fake.state.lock().unwrap().transitions.len() == 2
    })
    .await;
    let t = fake.state.lock().unwrap().transitions["graceful-drain"].clone();
    assert_eq!(t["spec"]["allNodes"], true);
    assert_eq!(t["spec"]["driver"], "graceful-drain.io");
    assert_eq!(t["spec"]["sla"], "15m0s");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while readyz(admin).await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = kubelet.start("graceful-drain", NODE).await;
    assert_eq!(
        (started.lifecycle_condition.as_str(), started.error.as_str()),
        ("drain-started", "")
    );
    assert_eq!(started.node_name, NODE);
    // Start is idempotent.
    assert_eq!(
        kubelet
            .start("graceful-drain", NODE)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    let done = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert_eq!(done.error, "");
    assert_eq!(done.lifecycle_condition, "drain-complete");

    let node = fake.state.lock().unwrap().node.clone();
    assert_eq!(node["spec"]["unschedulable"], true);
    assert_eq!(
        node["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"],
        "true"
    );
    assert_eq!(condition(&node, "Drained")["status"], "True");
    assert_eq!(condition(&node, "DrainInProgress")["status"], "False");
    assert_eq!(
        condition(&node, "Ready")["status"],
        "True",
        "other conditions untouched"
    );

    // Evicted: the two web pods (web-2 after two PDB refusals), each with its UID as
    // precondition; the DaemonSet and mirror pods stay.
    let evicted = evictions(&fake);
    let paths: Vec<&str> = evicted.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths.iter().filter(|p| p.contains("/web-2/")).count(),
        3,
        "{paths:?}"
    );
    assert_eq!(
        paths.iter().filter(|p| p.contains("/web-1/")).count(),
        1,
        "{paths:?}"
    );
    assert!(
        paths.iter().all(|p| p.contains("/shop/pods/web-")),
        "{paths:?}"
    );
    for (path, body) in &evicted {
        let name = path.split('/').nth(6).unwrap();
        assert_eq!(
            body["deleteOptions"]["preconditions"]["uid"],
            format!("uid-{name}")
        );
    }
    {
        let st = fake.state.lock().unwrap();
        let left: Vec<&str> = st.pods.keys().map(|(_, n)| n.as_str()).collect();
        assert_eq!(left, ["etcd-n1", "proxy-1"]);
        // The block was reported on the Node, naming the pod and its PDB.
        let blocked: Vec<&Value> = st
            .events
            .iter()
            .filter(|e| e["reason"] == "graceful-drain.io/EvictionBlocked")
            .collect();
        assert_eq!(blocked.len(), 1, "repeats are rate-limited: {blocked:?}");
        let message = blocked[0]["message"].as_str().unwrap();
        assert!(
            message.contains("shop/web-2") && message.contains("PDB shop/web-pdb"),
            "{message}"
        );
        assert_eq!(blocked[0]["involvedObject"]["kind"], "Node");
        assert_eq!(blocked[0]["involvedObject"]["name"], NODE);
    }
    let snapshot = agent_state.snapshot();
    assert_eq!(snapshot.message, "0 pods remaining: 2 evicted, 2 skipped");
    let (code, status) = get(admin, "/status").await;
    assert_eq!(code, 200);
    let status: Value = serde_json::from_str(status.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(status["operation"], "drain");
    assert_eq!(status["phase"]["phase"], "complete");
    assert_eq!(status["progress"]["done"], 2);
    let (_, metrics) = get(admin, "/metrics").await;
    assert!(
        metrics.contains("graceful_drain_evictions_total{outcome=\"blocked_pdb\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("graceful_drain_evictions_total{outcome=\"evicted\"} 2"),
        "{metrics}"
    );

    // Back to service.
    let answer = kubelet.start("graceful-maintenance-complete", NODE).await;
    assert_eq!(answer.lifecycle_condition, "uncordoning");
    let done = kubelet
        .end_until("graceful-maintenance-complete", "maintenance-complete")
        .await;
    assert_eq!(done.error, "");
    let node = fake.state.lock().unwrap().node.clone();
    assert_eq!(node["spec"]["unschedulable"], false);
    assert!(
        node["metadata"]["labels"]
            .get("node.kubernetes.io/exclude-from-external-load-balancers")
            .is_none()
    );
    assert_eq!(condition(&node, "Drained")["status"], "False");
    assert_eq!(condition(&node, "DrainInProgress")["status"], "False");

    // Shutdown removes the registration socket (deregistration).
    shutdown.cancel();
    running.await.unwrap();
    assert!(!reg_socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_clear_error_and_no_work() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    fake.add_pod(pod("shop", "web-1", Some("ReplicaSet")));
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;

    let answer = kubelet.start("firmware-upgrade", NODE).await;
    assert_eq!(answer.lifecycle_condition, "");
    assert!(
        answer
            .error
            .contains("unknown transition \"firmware-upgrade\""),
        "{}",
        answer.error
    );
    let answer = kubelet.start("graceful-drain", "n2").await;
    assert!(
        answer.error.contains("\"n2\"") && answer.error.contains("\"n1\""),
        "{}",
        answer.error
    );
    let answer = kubelet.end("firmware-upgrade", false).await;
    assert!(
        answer.error.contains("firmware-upgrade"),
        "{}",
        answer.error
    );
    assert!(evictions(&fake).is_empty());
    let patched = fake
        .state
        .lock()
        .unwrap()
        .requests
        .iter()
        .any(|(m, _, _)| *m == Method::PATCH);
    assert!(!patched, "no node change for refused requests");

    // An expired SLA stops the drain and fails the transition with a message.
    fake.state.lock().unwrap().hold_deletion = true;
    kubelet.start("graceful-drain", NODE).await;
    eventually("eviction sent", || !evictions(&fake).is_empty()).await;
    let answer = kubelet.end("graceful-drain", true).await;
    assert!(answer.error.contains("SLA"), "{}", answer.error);
    assert!(answer.error.contains(NODE), "{}", answer.error);
    eventually("DrainInProgress stopped", || {
        let node = fake.state.lock().unwrap().node.clone();
        condition(&node, "DrainInProgress")["reason"] == "DrainStopped"
    })
    .await;
    let again = kubelet.end("graceful-drain", false).await;
    assert!(
        again.error.contains("SLA"),
        "a stopped drain stays stopped: {again:?}"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_refusal_fails_the_transition_before_any_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    fake.add_pod(pod("shop", "web-1", Some("ReplicaSet")));
    fake.add_pod(pod("shop", "bare", None));
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    let answer = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert!(
        answer
            .error
            .contains("cannot delete Pods that declare no controller")
            && answer.error.contains("shop/bare"),
        "{}",
        answer.error
    );
    assert!(evictions(&fake).is_empty(), "nothing evicted");
    let node = fake.state.lock().unwrap().node.clone();
    let cond = condition(&node, "DrainInProgress");
    assert_eq!(cond["reason"], "DrainFailed");
    assert!(cond["message"].as_str().unwrap().contains("shop/bare"));
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_resumes_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    fake.state.lock().unwrap().hold_deletion = true;
    fake.add_pod(pod("shop", "web-1", Some("ReplicaSet")));
    fake.add_pod(pod("shop", "web-2", Some("ReplicaSet")));

    let first = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), first.clone())
        .await
        .unwrap();
    let reg_socket = started.registration_socket.clone();
    let running = tokio::spawn(started.wait());
    let mut kubelet = Kubelet::register(&reg_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    eventually("both evicted", || evictions(&fake).len() == 2).await;
    // The pods are terminating: the drain is not done.
    assert_eq!(
        kubelet
            .end("graceful-drain", false)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    eventually("progress on the Node", || {
        let node = fake.state.lock().unwrap().node.clone();
        condition(&node, "DrainInProgress")["message"] == "2 pods remaining: 2 terminating"
    })
    .await;
    first.cancel();
    running.await.unwrap();
    assert!(!reg_socket.exists(), "deregistered");
    let node = fake.state.lock().unwrap().node.clone();
    assert_eq!(
        node["metadata"]["annotations"]["graceful-drain.io/drain-event"], "ev-1",
        "the drain names its event on the Node"
    );
    // Its event (the fake's ev-1) is still claimed and within its SLA.

    // A new agent finds cordoned + DrainInProgress and resumes without a Start.
    let second = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), second.clone())
        .await
        .unwrap();
    let resumed = started.agent.clone();
    eventually("drain resumed", || {
        resumed.phase(agent::OpKind::Drain).is_some()
    })
    .await;
    fake.finish_terminating();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    let done = kubelet.end_until("graceful-drain", "drain-complete").await;
    assert_eq!(done.error, "");
    assert_eq!(done.lifecycle_condition, "drain-complete");
    let node = fake.state.lock().unwrap().node.clone();
    assert_eq!(condition(&node, "Drained")["status"], "True");
    second.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpcs_answer_while_the_api_server_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    fake.state.lock().unwrap().hang = true;
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    // Kubelet::start/end fail the test if no answer comes (bounded wait).
    assert_eq!(
        kubelet
            .start("graceful-drain", NODE)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    assert_eq!(
        kubelet
            .end("graceful-drain", false)
            .await
            .lifecycle_condition,
        "drain-started"
    );
    assert_eq!(
        kubelet
            .start("graceful-maintenance-complete", NODE)
            .await
            .lifecycle_condition,
        "uncordoning"
    );
    assert_eq!(
        kubelet
            .end("graceful-maintenance-complete", false)
            .await
            .lifecycle_condition,
        "uncordoning"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_shows_on_readyz() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let admin = started.admin_addr;
    let mut reg = RegistrationClient::new(connect(started.registration_socket.clone()).await);
    let status = RegistrationStatus {
        plugin_registered: false,
        error: "no handler registered for plugin type: SLMPlugin".into(),
    };
    reg.notify_registration_status(status).await.unwrap();
    let (code, body) = readyz(admin).await;
    assert_eq!(code, 503);
    assert!(
        body.contains("kubelet refused plugin graceful-drain.io: no handler registered"),
        "{body}"
    );
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_reconciler_a_refusal_counts_when_the_kubelet_owns_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    let shutdown = Shutdown::new();
    // `auto` finds the SLM API built in (no CRD): the kubelet must drive us, so its
    // refusal is a real problem.
    let flags = ["--lifecycle-reconciler", "auto"];

    let started = agent::start(args(dir.path(), &flags), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let admin = started.admin_addr;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while readyz(admin).await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut reg = RegistrationClient::new(connect(started.registration_socket.clone()).await);
    let status = RegistrationStatus {
        plugin_registered: false,
        error: "plugin version not supported".into(),
    };
    reg.notify_registration_status(status).await.unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (code, body) = readyz(admin).await;
        if code == 503 {
            assert!(body.contains("plugin version not supported"), "{body}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "refusal never showed on /readyz: {:?}",
            fake.state
                .lock()
                .unwrap()
                .requests
                .iter()
                .map(|(m, p, _)| format!("{m} {p}"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_agent_may_not_patch_is_reported_not_silently_retried() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    fake.state.lock().unwrap().forbid_node_patch = true;
    fake.add_pod(pod("shop", "web-1", Some("ReplicaSet")));
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    kubelet.start("graceful-drain", NODE).await;
    eventually("a NodeUpdateFailed event", || {
        fake.state.lock().unwrap().events.iter().any(|e| {
            e["reason"] == "graceful-drain.io/NodeUpdateFailed"
                && e["message"]
                    .as_str()
                    .unwrap()
                    .contains("prepare node for drain")
                && e["message"].as_str().unwrap().contains("forbidden")
        })
    })
    .await;
    // Still retrying: End says "call me again", and nothing was evicted before the cordon.
    let answer = kubelet.end("graceful-drain", false).await;
    assert_eq!(
        (answer.lifecycle_condition.as_str(), answer.error.as_str()),
        ("drain-started", "")
    );
    assert!(evictions(&fake).is_empty());
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_sla_is_recorded_even_for_a_drain_this_agent_does_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::new();
    // Left by an earlier agent: a drain marked in progress on an uncordoned node (so this
    // agent does not resume it).
    fake.state.lock().unwrap().node["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "DrainInProgress", "status": "True", "reason": "Draining"}));
    let shutdown = Shutdown::new();
    let started = agent::start(args(dir.path(), &[]), fake.client(), shutdown.clone())
        .await
        .unwrap();
    let mut kubelet = Kubelet::register(&started.registration_socket, NODE).await;
    let answer = kubelet.end("graceful-drain", true).await;
    assert!(answer.error.contains("SLA"), "{}", answer.error);
    eventually("DrainInProgress=False recorded", || {
        let node = fake.state.lock().unwrap().node.clone();
        condition(&node, "DrainInProgress")["status"] == "False"
    })
    .await;
    let node = fake.state.lock().unwrap().node.clone();
    assert_eq!(
        condition(&node, "DrainInProgress")["reason"],
        "DrainStopped"
    );
    assert!(evictions(&fake).is_empty());
    shutdown.cancel();
}
