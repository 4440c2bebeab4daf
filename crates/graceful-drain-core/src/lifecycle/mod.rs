//! The `lifecycle.graceful-drain.io/v1alpha1` API (KEP-5683 Specialized Lifecycle Management):
//! the CRD types, the `crds` subcommand that prints their definitions, and the lifecycle
//! reconciler that plays the kubelet's SLM role on clusters whose kubelet lacks it.

pub mod crds;
pub mod types;

pub use types::{
    ClaimStatus, LifecycleEvent, LifecycleEventSpec, LifecycleEventStatus, LifecycleTransition,
    LifecycleTransitionSpec,
};

/// Node condition type that carries the current transition's reason.
pub const TRANSITION_CONDITION: &str = "LifecycleTransition";
/// Default driver name, the name the node agent registers with the kubelet.
pub const DEFAULT_DRIVER: &str = "graceful-drain.io";
/// Name of the drain transition the node agent publishes.
pub const DRAIN_TRANSITION: &str = "graceful-drain";
/// Start reason of the drain transition: the node agent answers it when it starts the
/// drain and while pods remain.
pub const DRAIN_STARTED: &str = "drain-started";
/// End reason of the drain transition: every evicted pod is gone.
pub const DRAIN_COMPLETE: &str = "drain-complete";
/// Name of the maintenance-complete transition the node agent publishes.
pub const MAINTENANCE_TRANSITION: &str = "graceful-maintenance-complete";
/// Start reason of the maintenance-complete transition: the node agent answers it while it
/// uncordons the node and runs the after-uncordon hooks.
pub const UNCORDONING: &str = "uncordoning";
/// End reason of the maintenance-complete transition: the node is uncordoned and its
/// after-uncordon hooks are done.
pub const MAINTENANCE_COMPLETE: &str = "maintenance-complete";
