//! Label selectors: one matcher, kube-core's [`Selector`], for every form a selector takes
//! here — a typed `metav1.LabelSelector` (ReplicaSets, PodDisruptionBudgets), the same
//! object as JSON, and the `labelSelector` query syntax ([`parse_label_selector`]: the
//! node agent's eviction tiers). The one implementation is the `kube-selector` crate,
//! which the simulated cluster uses too.

pub use kube_selector::{
    Expression, Selector, SelectorExt, json_labels, parse_label_selector, selector_matches,
    selector_object_matches,
};
