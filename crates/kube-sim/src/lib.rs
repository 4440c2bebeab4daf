//! A simulated Kubernetes cluster in one process (docs/design.md §7).
//!
//! [`apiserver`] speaks the Kubernetes REST API; [`controllers`] are the scheduler,
//! kubelets and controllers talking to it over HTTP; [`lb`] models cloud load balancers
//! and [`traffic`] sends requests through them, counting 5xx; [`podnet`] makes the pods
//! real HTTP servers on loopback addresses, for a real load balancer to route to;
//! [`cluster`] wires these together; [`selector`] matches label selectors for all of them.
//!
//! It depends on no crate of graceful-drain's and knows nothing of its components: what a
//! product needs of the cluster — CustomResourceDefinitions installed at start, a label
//! that marks a pod isolated on the timeline — is given in [`cluster::ClusterConfig`]. The
//! scenarios that run graceful-drain on it live in `graceful-drain-sim`.

pub mod apiserver;
pub mod cluster;
pub mod controllers;
pub mod fixtures;
pub mod kwok;
pub mod lb;
pub mod podnet;
pub mod selector;
mod task;
pub mod traffic;
