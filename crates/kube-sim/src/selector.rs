//! Label selectors, in the three forms the simulated cluster meets them: a typed
//! `metav1.LabelSelector` (the controllers' ReplicaSets, Jobs, PodDisruptionBudgets), the
//! same object held as JSON in the API server's store (PDB, webhook namespace and object
//! selectors), and the `labelSelector` query parameter of a LIST or WATCH. The one
//! implementation is the `kube-selector` crate, which the product uses too.

pub use kube_selector::{
    json_labels, parse_label_selector, selector_matches, selector_object_matches,
};
