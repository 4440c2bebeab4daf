//! graceful-drain's end-to-end crate: everything a suite needs to run the product against a
//! cluster, standing beside the product and the simulator and depended on by nothing.
//!
//! * [`tier`] — one test's cluster on either tier: the simulated cluster, a fresh real
//!   control plane from the cache, or the user's cluster (`GRACEFUL_DRAIN_TEST_KUBECONFIG`);
//! * [`sim_api`] — the simulated API server wrapped so a test sees every request its
//!   component sent;
//! * [`kubelet`] — a test kubelet speaking the plugin registration and SLM protocols;
//! * [`kubectl`] — `kubectl` against a test cluster.
//!
//! Suites that run the product as a process use this crate's binary, `graceful-drain-e2e`
//! (`env!("CARGO_BIN_EXE_graceful-drain-e2e")`): the product's command line built with the
//! simulated cluster, under a name of its own so it never overwrites the shipped build.
//!
//! The suites live in `tests/` (webhook, agent, lifecycle, install, simulate) and the
//! benchmarks in `benches/`. Object builders and the scripted mock API, which the product
//! crates' unit tests use too, are `graceful-drain-testing`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

pub mod kubectl;
pub mod kubelet;
pub mod sim_api;
pub mod tier;
