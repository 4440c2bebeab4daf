//! The simulated cluster's API server: an in-process HTTP server speaking the Kubernetes
//! REST API (DESIGN §7). (Owned by the simulated-cluster API work; placeholder until then.)
