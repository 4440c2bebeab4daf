//! Keeping the webhook's rights until its uninstall work is done.
//!
//! `helm uninstall` deletes the webhook's Deployment and, within the same second, its RBAC
//! objects and ServiceAccount: a replica stopping after that could no longer delete or
//! restore the pods it isolated, and they would stay out of their Services with nobody to
//! act on them. So the chart keeps the rights alive, and the last replica lets them go:
//!
//! * the ClusterRoleBinding (named like the Deployment) and the ServiceAccount carry the
//!   finalizer [`UNINSTALL_FINALIZER`]: the API server keeps an object with a pending
//!   finalizer, the RBAC authorizer honours such a binding, and the tokens of a
//!   ServiceAccount being deleted stay valid for a minute (`jwt.DefaultLeeway` in
//!   pkg/serviceaccount/claims.go);
//! * the ClusterRole and the leader-election Role and RoleBinding are kept by Helm
//!   (`helm.sh/resource-policy: keep`) and owned — [`adopt`], at start — by the
//!   ClusterRoleBinding and the ServiceAccount, so the garbage collector removes them once
//!   those go.
//!
//! At shutdown during an uninstall, once the isolated pods are dealt with,
//! [`release_bindings`] removes the finalizer from the ClusterRoleBinding (the last call
//! needing cluster-wide rights), then from the ServiceAccount (the last call of all).

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;

use graceful_drain_core::labels::UNINSTALL_FINALIZER;

/// The ServiceAccounts among `own_users` (`system:serviceaccount:<ns>:<name>`).
fn own_accounts(own_users: &std::collections::BTreeSet<String>) -> Vec<(String, String)> {
    own_users
        .iter()
        .filter_map(|u| u.strip_prefix("system:serviceaccount:"))
        .filter_map(|rest| rest.split_once(':'))
        .map(|(ns, name)| (ns.to_string(), name.to_string()))
        .collect()
}

/// At start: makes the ClusterRole `deployment` a dependent of the ClusterRoleBinding of
/// the same name, and the Role and RoleBinding `<deployment>-leader-election` in
/// `namespace` dependents of our ServiceAccount, so the garbage collector removes them
/// once [`release_bindings`] lets their owners go. Objects the chart did not mark to be
/// kept (`helm.sh/resource-policy: keep`) are left to Helm.
pub async fn adopt(
    client: &kube::Client,
    namespace: &str,
    deployment: &str,
    own_users: &std::collections::BTreeSet<String>,
) {
    let leader = format!("{deployment}-leader-election");
    let cluster_binding = Api::<ClusterRoleBinding>::all(client.clone());
    if let Some(owner) = owner_ref(&cluster_binding, deployment).await {
        let roles = Api::<ClusterRole>::all(client.clone());
        own(&roles, "clusterrole", deployment, &owner).await;
    }
    let Some((_, account)) = own_accounts(own_users)
        .into_iter()
        .find(|(ns, _)| ns == namespace)
    else {
        return;
    };
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    if let Some(owner) = owner_ref(&accounts, &account).await {
        let roles = Api::<Role>::namespaced(client.clone(), namespace);
        own(&roles, "role", &leader, &owner).await;
        let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace);
        own(&bindings, "rolebinding", &leader, &owner).await;
    }
}

/// A reference to `name` as an owner, when it carries our finalizer.
async fn owner_ref<K>(api: &Api<K>, name: &str) -> Option<OwnerReference>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let object = api.get_opt(name).await.ok().flatten()?;
    let meta = object.meta();
    meta.finalizers
        .as_ref()?
        .iter()
        .any(|f| f == UNINSTALL_FINALIZER)
        .then(|| OwnerReference {
            api_version: K::api_version(&()).to_string(),
            kind: K::kind(&()).to_string(),
            name: name.to_string(),
            uid: meta.uid.clone().unwrap_or_default(),
            ..OwnerReference::default()
        })
}

/// Adds `owner` to the owner references of `name`, if the chart keeps it and it lacks it.
async fn own<K>(api: &Api<K>, kind: &str, name: &str, owner: &OwnerReference)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Ok(Some(object)) = api.get_opt(name).await else {
        return;
    };
    let meta = object.meta();
    let kept = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get("helm.sh/resource-policy"))
        .is_some_and(|p| p == "keep");
    let mut refs = meta.owner_references.clone().unwrap_or_default();
    if !kept || refs.iter().any(|r| r.uid == owner.uid) {
        return;
    }
    refs.push(owner.clone());
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": meta.resource_version, "ownerReferences": refs}});
    let params = PatchParams {
        field_manager: Some(graceful_drain_core::labels::FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(%kind, %name, owner = %owner.name, "own RBAC object goes with its owner at uninstall")
        }
        Err(error) => {
            tracing::warn!(%kind, %name, error = %graceful_drain_core::error::chain(&error), "could not set the owner of an own RBAC object; helm uninstall will keep it")
        }
    }
}

/// Removes [`UNINSTALL_FINALIZER`] from the webhook's ClusterRoleBinding `deployment`,
/// then from the ServiceAccounts among `own_users`, each only when it is being deleted.
/// Failures are logged with the command that releases the object by hand.
pub async fn release_bindings(
    client: &kube::Client,
    _namespace: &str,
    deployment: &str,
    own_users: &std::collections::BTreeSet<String>,
) {
    let cluster_binding = Api::<ClusterRoleBinding>::all(client.clone());
    release(&cluster_binding, "clusterrolebinding", deployment).await;
    // Our own ServiceAccount last: its tokens are what every call above used.
    for (ns, name) in own_accounts(own_users) {
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &ns);
        release(&accounts, "serviceaccount", &name).await;
    }
}

async fn release<K>(api: &Api<K>, kind: &str, name: &str)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let binding = match api.get_opt(name).await {
        Ok(Some(binding)) => binding,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%kind, %name, error = %graceful_drain_core::error::chain(&error), "read own binding at shutdown");
            return;
        }
    };
    let meta = binding.meta();
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    if meta.deletion_timestamp.is_none() || !finalizers.iter().any(|f| f == UNINSTALL_FINALIZER) {
        return;
    }
    let namespace = meta
        .namespace
        .as_deref()
        .map(|ns| format!(" -n {ns}"))
        .unwrap_or_default();
    let kept: Vec<&String> = finalizers
        .iter()
        .filter(|f| *f != UNINSTALL_FINALIZER)
        .collect();
    // Guarded by the list read, so a finalizer someone else added meanwhile is kept.
    let patch = serde_json::json!([
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "replace", "path": "/metadata/finalizers", "value": kept},
    ]);
    let patch: json_patch::Patch = match serde_json::from_value(patch) {
        Ok(patch) => patch,
        Err(error) => {
            tracing::error!(%error, "build finalizer patch");
            return;
        }
    };
    let params = PatchParams {
        field_manager: Some(graceful_drain_core::labels::FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match api.patch(name, &params, &Patch::Json::<()>(patch)).await {
        Ok(_) => tracing::info!(%kind, %name, "uninstall work done; released own binding"),
        Err(error) => tracing::warn!(
            %kind, %name, error = %graceful_drain_core::error::chain(&error),
            "could not release own binding; release it with: kubectl patch {kind} {name}{namespace} --type=json -p '[{{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}}]'"
        ),
    }
}
