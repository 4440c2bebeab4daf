//! Test support shared by every graceful-drain crate: object builders ([`fixtures`]), the
//! one wait for a state no event announces ([`eventually`]), the
//! scripted mock API ([`fixtures::mock`]), a test kubelet speaking the plugin registration
//! and SLM protocols ([`kubelet`]), and the simulated API server wrapped so tests can see
//! every request their client sent ([`sim_api`]), and `kubectl` against a test cluster
//! ([`kubectl`]).
//!
//! A dev-dependency only: nothing that ships depends on it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

pub mod eventually;
pub mod fixtures;
pub mod kubectl;
pub mod kubelet;
pub mod sim_api;
