//! The object builders (re-exported from `kube_sim::fixtures`, where the simulated
//! cluster's scenarios use them at run time) and the scripted mock API server for unit
//! tests that need exact request shapes ([`mock`]).

pub use kube_sim::fixtures::*;

pub mod mock;
