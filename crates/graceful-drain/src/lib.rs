//! graceful-drain: zero-5xx node drains and rollouts for Kubernetes — the binary's command
//! line and the `drain`, `uncordon` and `status` commands.
//!
//! The workspace's crates, from the bottom up:
//!
//! * `graceful-drain-core` — runtime, errors, selectors, kube client, admin port,
//!   certificates, protos, the `graceful-drain.io/…` vocabulary, the lifecycle API;
//! * `graceful-drain-webhook` — the HTTPS admission server and the deferred deleter;
//! * `graceful-drain-agent` — the node agent and the lifecycle reconciler;
//! * this crate — [`cli`] (one subcommand per role) and [`ctl`];
//! * `kube-sim` and `graceful-drain-sim` — the simulated cluster and the scenarios that run
//!   our components against it, pulled in only by the `sim` feature, so the shipped build
//!   carries no API server.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod cli;
pub mod ctl;
