//! What every graceful-drain component shares: the process runtime (owned tasks, one
//! shutdown signal, tracing), error helpers, durations and label selectors, one backoff
//! for every retry loop, the kube client setup, the admin port, certificates, the
//! generated SLM and plugin-registration protos, the `graceful-drain.io/…` vocabulary and
//! the lifecycle API types and CRDs.
//!
//! Nothing here knows about the webhook, the node agent or the simulated cluster; they all
//! build on it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod admin;
pub mod backoff;
pub mod certs;
pub mod duration;
pub mod error;
pub mod event;
pub mod kubeclient;
pub mod labels;
pub mod lifecycle;
pub mod proto;
pub mod runtime;
pub mod selector;
