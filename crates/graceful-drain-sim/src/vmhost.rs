//! A simulated hypervisor inventory with an HTTPS maintenance-hook endpoint: the worked
//! example of docs/hooks.md, playing the part nova-kubernetes-drain plays for OpenStack
//! compute nodes. Each node runs a few VMs; before a node's pods are evicted its hook
//! disables scheduling there and live-migrates its VMs, one at a time, to the other
//! enabled nodes (answering `inProgress` with the count so far, then `done`); after the
//! uncordon its second hook enables the node again.
//!
//! Endpoints (both speak [`graceful_drain_agent::hooks`]' protocol):
//! * `POST /evacuate` — disable the node, migrate its VMs; `done` once none is left;
//! * `POST /enable` — enable the node; `done` at once.
//!
//! Migrations advance with time, computed when asked (no background task): a run started
//! at `t` has migrated `(now - t) / migrate_each` VMs. [`VmHost::set_behaviour`] makes the
//! service fail or hang, for the hook tests. It records every start and poll so a test can
//! tell a hook polled after an agent restart from one started twice.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use graceful_drain_agent::hooks::{HookAction, HookRequest, HookResponse, HookStatus};
use graceful_drain_core::runtime::Shutdown;
use kube_sim::traffic::timeline::{EventKind, Timeline};

/// How the service answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Migrate, then answer done.
    Normal,
    /// Answer every start and poll `failed` with this message.
    Fail(String),
    /// Accept the run and stay in progress forever (a stuck migration).
    Hang,
}

/// One evacuation run, keyed by the hook's id.
#[derive(Clone, Debug)]
struct Run {
    node: String,
    started: Instant,
    /// The VMs to move, in order.
    vms: Vec<String>,
    /// Already moved (applied to the inventory).
    moved: usize,
}

#[derive(Debug)]
struct Inventory {
    /// Node → its VMs.
    vms: BTreeMap<String, Vec<String>>,
    /// Nodes new VMs may not be placed on.
    disabled: std::collections::BTreeSet<String>,
    runs: HashMap<String, Run>,
    behaviour: Behaviour,
    migrate_each: Duration,
    starts: Vec<HookRequest>,
    polls: usize,
    /// When each node was left without VMs, and when it was enabled again.
    emptied: HashMap<String, Instant>,
    enabled_at: HashMap<String, Instant>,
    /// Where the service's steps are told, if anywhere.
    timeline: Option<Timeline>,
}

/// What the service did, for checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Start requests, per hook name.
    pub starts: BTreeMap<String, usize>,
    /// Poll requests.
    pub polls: usize,
}

/// The running service. Cheap to clone.
#[derive(Clone)]
pub struct VmHost {
    inner: Arc<Mutex<Inventory>>,
    addr: SocketAddr,
    ca_bundle: String,
}

impl VmHost {
    /// Starts the service on loopback with `vms_per_node` VMs on each of `nodes`, each
    /// migration taking `migrate_each`. Serves until `shutdown`.
    pub async fn start(
        nodes: &[String],
        vms_per_node: usize,
        migrate_each: Duration,
        shutdown: &Shutdown,
    ) -> anyhow::Result<Self> {
        let vms = nodes
            .iter()
            .map(|n| {
                let list = (1..=vms_per_node).map(|i| format!("vm-{n}-{i}")).collect();
                (n.clone(), list)
            })
            .collect();
        let inner = Arc::new(Mutex::new(Inventory {
            vms,
            disabled: Default::default(),
            runs: HashMap::new(),
            behaviour: Behaviour::Normal,
            migrate_each,
            starts: Vec::new(),
            polls: 0,
            emptied: HashMap::new(),
            enabled_at: HashMap::new(),
            timeline: None,
        }));
        let bundle = graceful_drain_core::certs::generate(
            "vmhost",
            &["localhost".into()],
            &[[127, 0, 0, 1].into()],
        )?;
        let chain = CertificateDer::pem_slice_iter(bundle.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(bundle.key.as_bytes())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/evacuate", post(evacuate))
            .route("/enable", post(enable))
            .with_state(inner.clone());
        let serving =
            graceful_drain_webhook::server::serve(listener, Arc::new(tls), app, shutdown.clone());
        graceful_drain_core::runtime::spawn_owned("vmhost", shutdown.clone(), serving);
        Ok(Self {
            inner,
            addr,
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(&bundle.ca_cert),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inventory> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.addr.port())
    }

    /// Base64 PEM of the CA that signed the service's certificate.
    pub fn ca_bundle(&self) -> &str {
        &self.ca_bundle
    }

    /// The two hooks of the example, as `--hooks` JSON: evacuate before eviction (with
    /// `timeout`), enable after uncordon.
    pub fn hooks_json(&self, timeout: &str) -> String {
        serde_json::json!([
            {"name": "evacuate-vms", "at": "before-eviction", "timeout": timeout,
             "pollInterval": "200ms",
             "https": {"url": self.url("/evacuate"), "caBundle": self.ca_bundle}},
            {"name": "enable-vms", "at": "after-uncordon", "timeout": timeout,
             "pollInterval": "200ms",
             "https": {"url": self.url("/enable"), "caBundle": self.ca_bundle}},
        ])
        .to_string()
    }

    /// Records the service's steps (node disabled, each VM moved, node enabled) as steps
    /// of `timeline`.
    pub fn record_to(&self, timeline: Timeline) {
        self.lock().timeline = Some(timeline);
    }

    /// Changes how the service answers from the next request on, runs already started
    /// included.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        self.lock().behaviour = behaviour;
    }

    /// VMs on `node` now.
    pub fn vms_on(&self, node: &str) -> Vec<String> {
        let mut inventory = self.lock();
        inventory.advance(Instant::now());
        inventory.vms.get(node).cloned().unwrap_or_default()
    }

    /// Whether new VMs may be placed on `node`.
    pub fn enabled(&self, node: &str) -> bool {
        !self.lock().disabled.contains(node)
    }

    /// When `node` was left without VMs by an evacuation.
    pub fn emptied_at(&self, node: &str) -> Option<Instant> {
        let mut inventory = self.lock();
        inventory.advance(Instant::now());
        inventory.emptied.get(node).copied()
    }

    /// When `node` was last enabled by its hook.
    pub fn enabled_at(&self, node: &str) -> Option<Instant> {
        self.lock().enabled_at.get(node).copied()
    }

    /// Starts and polls received so far.
    pub fn record(&self) -> Record {
        let inventory = self.lock();
        let mut starts = BTreeMap::new();
        for request in &inventory.starts {
            *starts.entry(request.hook.clone()).or_insert(0) += 1;
        }
        Record {
            starts,
            polls: inventory.polls,
        }
    }
}

impl Inventory {
    /// Applies the migrations that are due by `now`.
    fn advance(&mut self, now: Instant) {
        let each = self.migrate_each.max(Duration::from_millis(1));
        let mut moves = Vec::new();
        for run in self.runs.values_mut() {
            let due = (now.duration_since(run.started).as_nanos() / each.as_nanos()) as usize;
            let due = due.min(run.vms.len());
            while run.moved < due {
                run.moved += 1;
                // When the migration finished, which may be before this request.
                let at = run.started + each * u32::try_from(run.moved).unwrap_or(u32::MAX);
                moves.push((run.node.clone(), run.vms[run.moved - 1].clone(), at));
            }
        }
        for (from, vm, at) in moves {
            // To the enabled node with the fewest VMs (never back to a disabled one).
            let target = self
                .vms
                .iter()
                .filter(|(n, _)| **n != from && !self.disabled.contains(*n))
                .min_by_key(|(_, vms)| vms.len())
                .map(|(n, _)| n.clone());
            let Some(target) = target else { continue };
            self.tell(at, format!("vm host: {vm} moved {from} -> {target}"));
            if let Some(list) = self.vms.get_mut(&from) {
                list.retain(|v| *v != vm);
                if list.is_empty() {
                    self.emptied.insert(from.clone(), at);
                    self.tell(at, format!("vm host: no VM left on {from}"));
                }
            }
            self.vms.entry(target).or_default().push(vm);
        }
    }

    fn tell(&self, at: Instant, what: String) {
        if let Some(timeline) = &self.timeline {
            timeline.record_at(at, EventKind::Step, what);
        }
    }

    fn status(&self, id: &str) -> HookResponse {
        let in_progress = |message: String| HookResponse {
            status: HookStatus::InProgress,
            message,
        };
        let Some(run) = self.runs.get(id) else {
            return in_progress(String::new());
        };
        if self.behaviour == Behaviour::Hang {
            return in_progress(format!(
                "migrating: {}/{} VMs moved",
                run.moved,
                run.vms.len()
            ));
        }
        if run.moved < run.vms.len() {
            return in_progress(format!(
                "migrating: {}/{} VMs moved",
                run.moved,
                run.vms.len()
            ));
        }
        HookResponse {
            status: HookStatus::Done,
            message: format!("{} VMs moved off {}", run.vms.len(), run.node),
        }
    }
}

type Shared = Arc<Mutex<Inventory>>;

fn failed(message: &str) -> Response {
    Json(HookResponse {
        status: HookStatus::Failed,
        message: message.to_string(),
    })
    .into_response()
}

/// `POST /evacuate`.
async fn evacuate(State(shared): State<Shared>, Json(request): Json<HookRequest>) -> Response {
    let mut inventory = shared.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    inventory.advance(now);
    match request.action {
        HookAction::Start => {
            inventory.starts.push(request.clone());
            if let Behaviour::Fail(message) = &inventory.behaviour {
                return failed(message);
            }
            inventory.disabled.insert(request.node.clone());
            let vms = inventory
                .vms
                .get(&request.node)
                .cloned()
                .unwrap_or_default();
            let what = format!(
                "vm host: {} disabled, {} VMs to move",
                request.node,
                vms.len()
            );
            inventory.tell(now, what);
            if vms.is_empty() {
                inventory.emptied.entry(request.node.clone()).or_insert(now);
            }
            let run = Run {
                node: request.node.clone(),
                started: now,
                vms,
                moved: 0,
            };
            inventory.runs.insert(request.id.clone(), run);
        }
        HookAction::Poll => {
            inventory.polls += 1;
            if !inventory.runs.contains_key(&request.id) {
                return (StatusCode::NOT_FOUND, "no such evacuation").into_response();
            }
            if let Behaviour::Fail(message) = &inventory.behaviour {
                return failed(message);
            }
        }
    }
    Json(inventory.status(&request.id)).into_response()
}

/// `POST /enable`.
async fn enable(State(shared): State<Shared>, Json(request): Json<HookRequest>) -> Response {
    let mut inventory = shared.lock().unwrap_or_else(|e| e.into_inner());
    match request.action {
        HookAction::Start => inventory.starts.push(request.clone()),
        HookAction::Poll => inventory.polls += 1,
    }
    if let Behaviour::Fail(message) = &inventory.behaviour {
        return failed(message);
    }
    if inventory.disabled.remove(&request.node) {
        inventory.tell(Instant::now(), format!("vm host: {} enabled", request.node));
    }
    inventory
        .enabled_at
        .insert(request.node.clone(), Instant::now());
    Json(HookResponse {
        status: HookStatus::Done,
        message: format!("node {} accepts VMs again", request.node),
    })
    .into_response()
}
