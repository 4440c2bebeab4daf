//! Pods' controllers read live, and the pods a controller controls as the controllers
//! count them: listed by the selector's `matchLabels`, which only narrow the list (a
//! selector of expressions alone lists the namespace), and kept by the UID of their
//! controller reference. Reviews share these reads through `super::ControllerReads`.

use std::sync::Arc;

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

/// Reads the namespaced object `namespace/name` of kind `K`, `None` when it does not
/// exist.
pub(super) async fn read<K>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Arc<K>>, kube::Error>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), namespace);
    Ok(api.get_opt(name).await?.map(Arc::new))
}
