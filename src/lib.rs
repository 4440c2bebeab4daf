//! graceful-drain: zero-5xx node drains and rollouts for Kubernetes.
//!
//! Layout: pure domain logic lives beside the module that owns it; `kube` glue and
//! runtime wiring sit above it. Each subcommand has its own module with
//! `run(args, shutdown)`:
//!
//! * [`webhook`] — HTTPS admission server, deferred deleter, admin port.
//! * [`agent`] — the node agent: kubelet plugin registration, SLM gRPC, drain engine,
//!   and (optionally) the lifecycle reconciler from [`lifecycle`].
//! * [`ctl`] — the `drain`, `uncordon` and `status` CLI.
//! * `sim` — the simulated cluster used by `simulate`, the end-to-end tests and benches;
//!   behind the default `sim` feature, so the shipped build (`--no-default-features`)
//!   carries no API server. It uses the product, never the reverse.
//! * [`certs`] — local CA and serving certificates for development.

pub mod admin;
pub mod agent;
pub mod certs;
pub mod cli;
pub mod ctl;
pub mod duration;
pub mod error;
#[cfg(any(test, feature = "sim"))]
pub mod fixtures;
pub mod kubeclient;
pub mod labels;
pub mod lifecycle;
pub mod proto;
pub mod runtime;
pub mod selector;
#[cfg(feature = "sim")]
pub mod sim;
pub mod webhook;
