//! Maintenance hooks: the side effects a node's maintenance needs beyond its pods (move a
//! hypervisor's VMs away, detach storage, tell an inventory system), run by the node agent
//! at four points of its two transitions:
//!
//! * `drain-start` — a drain begins, before the cordon (a check that may refuse the drain
//!   while the node is still untouched);
//! * `before-eviction` — the node is cordoned and out of the load balancers, no pod has been
//!   evicted yet (evacuate what pods cannot carry);
//! * `after-last-pod` — every pod is gone, before the drain reports `drain-complete`;
//! * `after-uncordon` — the node is schedulable again, before `maintenance-complete`.
//!
//! A hook is either an HTTPS call or a Kubernetes Job run on the node. Hooks of one point
//! run one after the other, in the order configured. A hook that fails or outlives its
//! `timeout` fails the transition with its message, unless it is `optional` (then a
//! Warning Event says so and the transition goes on).
//!
//! **The HTTPS protocol.** The agent POSTs a [`HookRequest`] (JSON) to the hook's URL and
//! expects `200` with a [`HookResponse`]: `done`, `inProgress` or `failed`, and a message.
//! `inProgress` is polled, like the SLM `End` call: the same POST with `action: poll` and
//! the same `id`, every `pollInterval`. A poll answered `404` means the hook never saw that
//! id (it lost its state, or the start never reached it): the agent starts it again. Any
//! other status, a body that does not parse, or no answer is retried until the timeout.
//!
//! **The Job protocol.** The Job is created from the template, pinned to the node
//! (`spec.template.spec.nodeName`), named after the hook and its id, and told where it runs
//! (`GRACEFUL_DRAIN_NODE`, `GRACEFUL_DRAIN_HOOK_AT`, `GRACEFUL_DRAIN_LIFECYCLE_EVENT` in
//! every container). Its `Complete` condition is success; `Failed` is failure.
//!
//! **Restarts.** Each hook's state lives in the Node's `graceful-drain.io/hooks`
//! annotation ([`HookRecord`]): written before the first call, updated as answers change.
//! An agent restarted while a hook is in progress finds the record of the same
//! LifecycleEvent and polls the hook with the recorded id — it never starts it twice — and
//! the timeout keeps counting from the recorded start; a hook recorded done is skipped.
//!
//! The configuration, what a run is for (`context`), the run of a hook, the two kinds of
//! target (HTTPS, Job) and the records on the Node each have a file of their own; this one
//! only re-exports them.

mod config;
mod context;
mod https;
mod job;
mod record;
mod run;

pub use config::{
    ConfigError, DEFAULT_POLL_INTERVAL, DEFAULT_TIMEOUT, Hook, HookPoint, HookSpec, Hooks,
    HttpsSpec, JobSpec, parse_arg,
};
pub use context::{HookContext, HookStep};
pub use https::{HookAction, HookRequest, HookResponse, HookStatus};
pub use record::{HookRecord, RecordState, records};
pub use run::HookError;
