//! The lifecycle reconciler: plays the kubelet's SLM role (DESIGN §3) on clusters whose
//! kubelet lacks it. Runs inside the node agent, one per node, and talks to the driver
//! over the same unix-socket gRPC the kubelet would use. (Owned by the lifecycle work.)

use std::path::PathBuf;

/// When the reconciler runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Decide at start-up (see the module documentation).
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
}

/// What the node agent hands the reconciler.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    /// The node this reconciler serves.
    pub node_name: String,
    /// The driver name to look for.
    pub driver_name: String,
    /// Folder holding `<driver>-reg.sock` registration sockets.
    pub registry_dir: PathBuf,
    /// Folder holding `<driver>/slm.sock` service sockets.
    pub plugins_dir: PathBuf,
}

/// Errors of the reconciler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder until the reconciler lands.
    #[error("lifecycle reconciler not implemented yet")]
    NotImplemented,
}

/// Runs the reconciler for `ctx.node_name` until `shutdown`, if `args.mode` (after the
/// auto decision) says so; returns at once otherwise.
pub async fn run(
    args: &ReconcilerArgs,
    ctx: Context,
    shutdown: crate::runtime::Shutdown,
) -> Result<(), Error> {
    let _ = (args, ctx, shutdown);
    Err(Error::NotImplemented)
}
