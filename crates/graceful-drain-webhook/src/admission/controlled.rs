//! The pods a controller controls, read live, as the controllers count them: listed by
//! the selector's `matchLabels`, which only narrow the list (a selector of expressions
//! alone lists the namespace), and kept by the UID of their controller reference.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::ListParams;

/// The pods in `namespace` whose controller reference is `uid`, narrowed by `selector`.
pub(super) async fn controlled_pods(
    client: &kube::Client,
    namespace: &str,
    selector: Option<&LabelSelector>,
    uid: &str,
) -> Result<Vec<Pod>, kube::Error> {
    let labels = selector
        .and_then(|s| s.match_labels.as_ref())
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let mut pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&labels))
        .await?
        .items;
    pods.retain(|p| {
        p.metadata.owner_references.as_ref().is_some_and(|refs| {
            refs.iter()
                .any(|r| r.controller == Some(true) && r.uid == uid)
        })
    });
    Ok(pods)
}
