//! The lifecycle reconciler: plays the kubelet's SLM role (docs/design.md §3) on clusters whose
//! kubelet lacks it. Runs inside the node agent, one per node, and talks to the driver
//! over the same unix-socket gRPC the kubelet would use.
//!
//! Data flow: two watches feed two stores (reflectors) — the LifecycleEvents bound to this
//! node and the Node itself — and each change in either (plus a periodic tick, for SLA
//! deadlines and End polls) triggers one [`Reconciler::step_cached`] over the stores; a
//! step reads the Node's `LifecycleTransition` condition, asks [`decide::decide`] (a pure
//! function) what to do with each event and applies the answer ([`step`]): claim, call
//! Start/End, patch the Node condition, conclude, finalize. Our own writes come back
//! through the watches and trigger the next step, and a drain that completes writes the
//! Node at once, so an event succeeds within a watch round trip of its last pod leaving,
//! not a tick later. A node without events makes no request but its two watches. Every write is guarded by the object's
//! resourceVersion, so two reconcilers on one node (a restart overlapping its
//! predecessor, or the kubelet's own SLM) never both claim an event.
//!
//! `--lifecycle-reconciler=auto` runs the reconciler when `lifecycleevents.lifecycle.graceful-drain.io`
//! is served by a CustomResourceDefinition (the API is not built into this cluster, so no
//! kubelet implements SLM), and stays off when the API is built in (the kubelet's SLM
//! reconciler owns the events). See docs/lifecycle.md.

pub mod decide;
pub mod metrics;
pub mod plugin;
pub mod seed;
pub mod step;
pub mod target;

use std::path::PathBuf;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};

pub use step::{Reconciler, StepReport};

use graceful_drain_core::backoff::Backoff;
use graceful_drain_core::lifecycle::LifecycleEvent;

/// Name of the CRD whose presence makes `auto` turn the reconciler on.
const EVENT_CRD: &str = "lifecycleevents.lifecycle.graceful-drain.io";
/// The kubelet's SLM reconciler tick (docs/design.md §3).
const DEFAULT_TICK: &str = "10s";
/// The kubelet's per-call timeout (docs/design.md §3): drivers must answer well within it.
const DEFAULT_CALL_TIMEOUT: &str = "45s";

/// When the reconciler runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// On when LifecycleEvents are served by a CustomResourceDefinition, off when the
    /// API is built into the cluster (the kubelet then implements SLM).
    #[default]
    Auto,
    /// Always run.
    On,
    /// Never run (the kubelet drives LifecycleEvents).
    Off,
}

/// Flags of the lifecycle reconciler, flattened into `node-agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReconcilerArgs {
    /// Run the lifecycle reconciler: auto, on or off.
    #[arg(
        long = "lifecycle-reconciler",
        value_enum,
        default_value_t,
        env = "GRACEFUL_DRAIN_LIFECYCLE_RECONCILER"
    )]
    pub mode: Mode,
    /// How often the reconciler re-examines the node's events without a watch event.
    #[arg(
        long = "lifecycle-tick",
        value_parser = humantime::parse_duration,
        default_value = DEFAULT_TICK,
        env = "GRACEFUL_DRAIN_LIFECYCLE_TICK"
    )]
    pub tick: Duration,
    /// Timeout of each gRPC call to a driver (GetInfo, Start, End).
    #[arg(
        long = "lifecycle-call-timeout",
        value_parser = humantime::parse_duration,
        default_value = DEFAULT_CALL_TIMEOUT,
        env = "GRACEFUL_DRAIN_LIFECYCLE_CALL_TIMEOUT"
    )]
    pub call_timeout: Duration,
}

impl Default for ReconcilerArgs {
    fn default() -> Self {
        Self {
            mode: Mode::Auto,
            tick: Duration::from_secs(10),
            call_timeout: Duration::from_secs(45),
        }
    }
}

/// What the node agent hands the reconciler.
#[derive(Clone)]
pub struct Context {
    /// Client for the event and Node watches and every write the reconciler makes.
    pub client: kube::Client,
    /// The node this reconciler serves.
    pub node_name: String,
    /// The driver name of the hosting agent (used in logs; events of any registered
    /// driver are driven, as the kubelet would).
    pub driver_name: String,
    /// Folder holding `<driver>-reg.sock` registration sockets.
    pub registry_dir: PathBuf,
    /// Folder holding `<driver>/slm.sock` service sockets.
    pub plugins_dir: PathBuf,
    /// Where events and driver calls are counted (`Metrics::default()` when unexported).
    pub metrics: metrics::Metrics,
}

/// Errors of the reconciler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call (a read or a write) failed other than by a conflict.
    #[error("{what}")]
    Kube {
        /// The call and its object, e.g. `claim lifecycleevent drain-n1`.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Another writer changed the object first (resourceVersion conflict).
    #[error("{what}: changed concurrently, retrying")]
    Conflict {
        /// The call and its object, e.g. `claim lifecycleevent drain-n1`.
        what: String,
    },
    /// The event or Node watch stream ended, which a watcher never does on its own.
    #[error("watch on {resource} for node {node} ended")]
    WatchEnded {
        /// What was watched: `lifecycleevents` or `nodes`.
        resource: &'static str,
        /// The node the reconciler serves.
        node: String,
    },
    /// Whether events can be selected by node is not known yet (the CRDs are not served,
    /// or the API server did not answer).
    #[error("probe spec.bindingNode selector support for node {node}: no answer yet")]
    SelectorUndecided {
        /// The node the reconciler serves.
        node: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        let what = what.into();
        match &source {
            kube::Error::Api(status) if status.code == 409 => Self::Conflict { what },
            _ => Self::Kube { what, source },
        }
    }
}

/// Decides whether `auto` means on: on when the event API is served by a CRD, off when
/// it is served without one (built in), on (waiting for the CRDs) when not served at all.
pub async fn auto_enabled(client: &kube::Client) -> Result<bool> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.get_opt(EVENT_CRD).await {
        Ok(Some(_)) => return Ok(true),
        Ok(None) => {}
        Err(kube::Error::Api(status)) if status.code == 403 => {
            tracing::warn!(
                "may not read CustomResourceDefinitions; assuming no built-in SLM API \
                 (grant get on customresourcedefinitions or set --lifecycle-reconciler)"
            );
            return Ok(true);
        }
        Err(source) => return Err(Error::kube(format!("get crd {EVENT_CRD}"), source)),
    }
    match client
        .list_api_group_resources("lifecycle.graceful-drain.io/v1alpha1")
        .await
    {
        Ok(list) if list.resources.iter().any(|r| r.name == "lifecycleevents") => Ok(false),
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            tracing::warn!(
                "lifecycle.graceful-drain.io CRDs not installed; the reconciler waits for them \
                 (graceful-drain crds | kubectl apply -f -)"
            );
            Ok(true)
        }
        Err(source) => Err(Error::kube(
            "discover lifecycle.graceful-drain.io/v1alpha1",
            source,
        )),
    }
}

/// First pause before asking the API server again when the auto decision failed.
const AUTO_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest pause between attempts: an API server restart or a brief network partition
/// must not stop the node agent, and half a minute keeps the log quiet meanwhile.
const AUTO_RETRY_MAX: Duration = Duration::from_secs(30);

/// Runs `decide` until it answers, doubling the pause after each failure up to `max`;
/// `None` when `shutdown` comes first. A failed answer is logged, never fatal: the auto
/// decision only reads the API, so retrying is always safe.
async fn retry_until_decided<F, Fut>(
    mut decide: F,
    first: Duration,
    max: Duration,
    shutdown: &graceful_drain_core::runtime::Shutdown,
) -> Option<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let mut backoff = Backoff::new(first, max);
    loop {
        let pause = backoff.next_pause();
        match decide().await {
            Ok(enabled) => return Some(enabled),
            Err(error) => {
                tracing::warn!(error = %graceful_drain_core::error::chain(&error), retry_in = ?pause, "lifecycle reconciler auto mode: cannot decide yet");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// A store of what `api` lists under `config`, kept by a watch whose events come out of
/// the returned stream (retried with the default backoff).
fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    reflector::Store<K>,
    futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let changes = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .boxed();
    (store, changes)
}

/// Whether the reconciler runs: `args.mode`, with `auto` asked of the cluster until it
/// answers (false when shutdown comes first).
async fn enabled(
    args: &ReconcilerArgs,
    ctx: &Context,
    shutdown: &graceful_drain_core::runtime::Shutdown,
) -> bool {
    let enabled = match args.mode {
        Mode::On => true,
        Mode::Off => false,
        Mode::Auto => {
            let decide = || auto_enabled(&ctx.client);
            let decided =
                retry_until_decided(decide, AUTO_RETRY_FIRST, AUTO_RETRY_MAX, shutdown).await;
            match decided {
                Some(enabled) => enabled,
                None => return false,
            }
        }
    };
    tracing::info!(
        node = %ctx.node_name,
        driver = %ctx.driver_name,
        mode = ?args.mode,
        enabled,
        "lifecycle reconciler"
    );
    enabled
}

/// Runs the reconciler for `ctx.node_name` until `shutdown`, if `args.mode` (after the
/// auto decision) says so; returns at once otherwise.
pub async fn run(
    args: &ReconcilerArgs,
    ctx: Context,
    shutdown: graceful_drain_core::runtime::Shutdown,
) -> Result<(), Error> {
    if !enabled(args, &ctx, &shutdown).await {
        return Ok(());
    }
    // Events written in the seed group (lifecycle.k8s.io) where that group is free.
    let bridge = seed::run(
        ctx.client.clone(),
        ctx.node_name.clone(),
        args.tick,
        shutdown.clone(),
    );
    let bridge = tokio::spawn(bridge);
    let _bridge = AbortOnDrop(bridge);
    // Asked again until it answers: a 404 before the CRDs are installed says nothing
    // about whether the field will be selectable once they are.
    let events_api: Api<LifecycleEvent> = Api::all(ctx.client.clone());
    let node = ctx.node_name.clone();
    let probe = || async {
        step::probe_selector(&events_api, &node)
            .await
            .ok_or_else(|| Error::SelectorUndecided { node: node.clone() })
    };
    let Some(supported) =
        retry_until_decided(probe, AUTO_RETRY_FIRST, AUTO_RETRY_MAX, &shutdown).await
    else {
        return Ok(());
    };
    let reconciler = Reconciler::build(ctx, args.call_timeout, supported);
    let mut config = watcher::Config::default();
    if let Some(selector) = reconciler.field_selector() {
        config = config.fields(&selector);
    }
    let (events, mut event_changes) = reflected(events_api, config);
    let nodes: Api<Node> = Api::all(reconciler.client().clone());
    let node_config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let (node_store, mut node_changes) = reflected(nodes, node_config);
    let mut tick = tokio::time::interval(args.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = Retry::new(args.tick);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
            () = retry.due() => {}
            item = event_changes.next() => match item {
                None => return Err(Error::WatchEnded { resource: "lifecycleevents", node }),
                Some(Err(error)) => {
                    tracing::warn!(error = %graceful_drain_core::error::chain(&error), "lifecycleevent watch failed; retrying");
                    continue;
                }
                Some(Ok(_)) => {}
            },
            item = node_changes.next() => match item {
                None => return Err(Error::WatchEnded { resource: "nodes", node }),
                Some(Err(error)) => {
                    tracing::warn!(error = %graceful_drain_core::error::chain(&error), "node watch failed; retrying");
                    continue;
                }
                Some(Ok(_)) => {}
            },
        }
        // Until the first list is in, the store would show no events: wait for it.
        if events.wait_until_ready().now_or_never().is_none() {
            continue;
        }
        let node_object = node_store.get(&ObjectRef::new(&node));
        let step = reconciler.step_cached(events.state(), node_object, jiff::Timestamp::now());
        // A step is abandoned at shutdown: every write in it is atomic and guarded, and
        // the successor resumes from what the objects record.
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            outcome = step => match outcome {
                Ok(report) if !report.unfinished => retry.succeeded(),
                Ok(_) => {
                    retry.failed();
                }
                Err(error) => {
                    let pause = retry.failed();
                    tracing::warn!(error = %graceful_drain_core::error::chain(&error), retry_in = ?pause, "lifecycle reconcile failed; retrying");
                }
            },
        }
    }
}

/// First pause before a pass that failed is run again; it doubles with each failure in
/// a row, up to the tick.
const RETRY_FIRST: Duration = Duration::from_millis(500);

/// When a failed pass is run again: a throttled or failed API call must not hold a drain
/// for a whole tick (10 s) — it did, once per failed call, under 10 % 429s — while a
/// persistent failure backs off to the tick's pace.
struct Retry {
    at: Option<tokio::time::Instant>,
    backoff: Backoff,
}

impl Retry {
    fn new(max: Duration) -> Self {
        Self {
            at: None,
            backoff: Backoff::new(RETRY_FIRST, max),
        }
    }

    /// Resolves when a retry is due; never while none is planned.
    async fn due(&mut self) {
        match self.at {
            Some(at) => {
                tokio::time::sleep_until(at).await;
                self.at = None;
            }
            None => std::future::pending().await,
        }
    }

    /// Plans the next retry; returns its pause.
    fn failed(&mut self) -> Duration {
        let pause = self.backoff.next_pause();
        self.at = Some(tokio::time::Instant::now() + pause);
        pause
    }

    fn succeeded(&mut self) {
        self.at = None;
        self.backoff.reset();
    }
}

/// Stops a spawned task when the reconciler returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn auto_decision_is_retried_with_growing_pauses_until_it_answers() {
        let attempts = std::sync::Mutex::new(Vec::new());
        let started = tokio::time::Instant::now();
        let decide = || {
            let mut seen = attempts.lock().unwrap();
            seen.push(started.elapsed());
            let n = seen.len();
            async move {
                if n < 4 {
                    Err(Error::WatchEnded {
                        resource: "lifecycleevents",
                        node: "api server restarting".into(),
                    })
                } else {
                    Ok(true)
                }
            }
        };
        let shutdown = graceful_drain_core::runtime::Shutdown::new();
        let decided = retry_until_decided(
            decide,
            Duration::from_secs(1),
            Duration::from_secs(3),
            &shutdown,
        )
        .await;
        assert_eq!(decided, Some(true));
        let at: Vec<u64> = attempts
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.as_secs())
            .collect();
        // Pauses of 1 s, 2 s, then capped at 3 s.
        assert_eq!(at, [0, 1, 3, 6]);
    }

    #[tokio::test(start_paused = true)]
    async fn auto_decision_gives_up_quietly_at_shutdown() {
        let shutdown = graceful_drain_core::runtime::Shutdown::new();
        let stop = shutdown.clone();
        let decide = || {
            stop.cancel();
            async {
                Err(Error::WatchEnded {
                    resource: "nodes",
                    node: "unreachable".into(),
                })
            }
        };
        let decided = retry_until_decided(
            decide,
            Duration::from_secs(1),
            Duration::from_secs(30),
            &shutdown,
        )
        .await;
        assert_eq!(decided, None);
    }

    #[test]
    fn flags_default_to_the_kubelet_timings() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            r: ReconcilerArgs,
        }
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.r.mode, Mode::Auto);
        assert_eq!(cli.r.tick, Duration::from_secs(10));
        assert_eq!(cli.r.call_timeout, Duration::from_secs(45));
        let cli = Cli::try_parse_from([
            "x",
            "--lifecycle-reconciler",
            "off",
            "--lifecycle-tick",
            "2s",
        ])
        .unwrap();
        assert_eq!(cli.r.mode, Mode::Off);
        assert_eq!(cli.r.tick, Duration::from_secs(2));
    }
}
