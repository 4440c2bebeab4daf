//! A simulated Kubernetes cluster in one process (docs/design.md §7).
//!
//! [`apiserver`] speaks the Kubernetes REST API; [`controllers`] are the scheduler,
//! kubelets and controllers talking to it over HTTP; [`lb`] models cloud load balancers
//! and [`traffic`] sends requests through them, counting 5xx; [`cluster`] wires these
//! together. It knows nothing of graceful-drain's components beyond the shared core: the
//! scenarios that run them live in `graceful-drain-sim`.

pub mod apiserver;
pub mod cluster;
pub mod controllers;
pub mod fixtures;
pub mod lb;
pub mod traffic;
