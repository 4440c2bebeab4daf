//! The object builders (re-exported from `kube_sim::fixtures`, where the simulated
//! cluster's scenarios use them at run time) and the scripted mock API server for unit
//! tests that need exact request shapes ([`mock`]).

pub use kube_sim::fixtures::*;

pub mod mock;

/// A rendered object of the chart's default release (`graceful-drain` in namespace
/// `graceful-drain`) as `helm install ops -n ops-system` renders it: the namespace, the
/// instance label and the chart's fullname (`ops-graceful-drain`, a release name without
/// the chart's) changed, nothing else.
pub fn as_release_ops(object: &serde_json::Value) -> serde_json::Value {
    let text = object
        .to_string()
        .replace(
            r#""namespace":"graceful-drain""#,
            r#""namespace":"ops-system""#,
        )
        .replace(
            r#""app.kubernetes.io/instance":"graceful-drain""#,
            r#""app.kubernetes.io/instance":"ops""#,
        )
        .replace("graceful-drain-webhook", "ops-graceful-drain-webhook")
        .replace("graceful-drain-agent", "ops-graceful-drain-agent");
    serde_json::from_str(&text).unwrap_or_else(|_| object.clone())
}
