//! Test support for the product crates' unit tests: object builders ([`fixtures`]), the
//! one wait for a state no event announces ([`eventually`]) and the scripted mock API
//! ([`fixtures::mock`]) for tests that need exact request shapes.
//!
//! A dev-dependency only: nothing that ships depends on it. The end-to-end harness (both
//! tiers, recording API wrappers, a test kubelet, kubectl) is `graceful-drain-e2e`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

pub mod eventually;
pub mod fixtures;
