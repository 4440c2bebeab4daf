//! Finding the PodDisruptionBudgets that select a pod, to name what blocks its eviction.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::core::{Selector, SelectorExt};

use crate::filters::PodKey;
use crate::node::API_TIMEOUT;

/// Why the PDBs selecting a pod could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum PdbLookupError {
    /// The API server did not answer in time.
    #[error("list PDBs in namespace {namespace}: no answer within {API_TIMEOUT:?}")]
    TimedOut {
        /// The pod's namespace, whose PDBs were listed.
        namespace: String,
    },
    /// The list failed.
    #[error("list PDBs in namespace {namespace}")]
    Api {
        /// The pod's namespace, whose PDBs were listed.
        namespace: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// `namespace/name` of every PDB in the pod's namespace whose selector matches it. An
/// empty selector selects nothing, as the eviction API reads it
/// (pkg/registry/core/pod/storage/eviction.go `getPodDisruptionBudgets`).
pub async fn selecting_pdbs(
    client: &kube::Client,
    pod: &Pod,
) -> Result<Vec<String>, PdbLookupError> {
    let key = PodKey::of(pod);
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &key.namespace);
    let namespace = key.namespace.clone();
    let list = tokio::time::timeout(API_TIMEOUT, api.list(&ListParams::default()))
        .await
        .map_err(|_| PdbLookupError::TimedOut {
            namespace: namespace.clone(),
        })?
        .map_err(|source| PdbLookupError::Api { namespace, source })?;
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    Ok(list
        .items
        .iter()
        .filter(|pdb| {
            let selector = pdb.spec.as_ref().and_then(|s| s.selector.clone());
            selector
                .filter(|s| {
                    s.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                        || s.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
                })
                .and_then(|s| Selector::try_from(s).ok())
                .is_some_and(|s| s.matches(&labels))
        })
        .map(|pdb| {
            let name = pdb.metadata.name.as_deref().unwrap_or_default();
            format!("{}/{name}", key.namespace)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::mock;
    use super::*;
    use http::Response;
    use kube::client::Body;
    use serde_json::json;

    #[tokio::test]
    async fn the_pdb_blocking_a_pod_is_found_by_its_selector() {
        let (client, mut handle) = mock();
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-1".into());
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        let call = tokio::spawn(async move { selecting_pdbs(&client, &pod).await });
        let (request, respond) = handle.next_request().await.unwrap();
        assert_eq!(
            request.uri().path(),
            "/apis/policy/v1/namespaces/shop/poddisruptionbudgets"
        );
        let list = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList",
            "metadata": {"resourceVersion": "1"}, "items": [
            {"metadata": {"name": "web-pdb", "namespace": "shop"},
             "spec": {"selector": {"matchLabels": {"app": "web"}}}},
            {"metadata": {"name": "db-pdb", "namespace": "shop"},
             "spec": {"selector": {"matchLabels": {"app": "db"}}}},
            {"metadata": {"name": "nil-selector", "namespace": "shop"}, "spec": {}},
            {"metadata": {"name": "empty-selector", "namespace": "shop"},
             "spec": {"selector": {}}},
        ]});
        respond.send_response(Response::new(Body::from(list.to_string().into_bytes())));
        assert_eq!(
            call.await.unwrap().unwrap(),
            vec!["shop/web-pdb".to_string()]
        );
    }
}
