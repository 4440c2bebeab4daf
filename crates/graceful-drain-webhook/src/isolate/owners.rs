//! Reading an isolated pod's controller: its selector's keys, a ReplicaSet's own
//! controller, a `Recreate` Deployment — once per controller among concurrent isolations.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use super::context::Context;
use super::error::{Error, api_err};
use super::owner_reads::OwnerFacts;
use crate::cache::selector_keys;
use crate::decide::{OwnerKind, OwnerPolicy, PodFacts};

/// Reads the controlling owner's selector and derives the relabelling policy, plus (for
/// a ReplicaSet pod) the ReplicaSet's own controller reference to hand the pod to. A
/// missing owner (already deleted) is treated as a bare pod. A controller read for an
/// earlier pod of the drain is reused (see [`super::owner_reads::Owners`]), so a
/// ReplicaSet of 30 pods costs one read, not 30.
pub(super) async fn owner_policy(
    ctx: &Context,
    pod: &PodFacts,
) -> Result<(OwnerPolicy, Option<Value>, Option<String>), Error> {
    let Some((kind, name)) = &pod.owner else {
        return Ok((OwnerPolicy::default(), None, None));
    };
    let gvk = match kind {
        OwnerKind::ReplicaSet => GroupVersionKind::gvk("apps", "v1", "ReplicaSet"),
        OwnerKind::StatefulSet => GroupVersionKind::gvk("apps", "v1", "StatefulSet"),
        OwnerKind::DaemonSet => GroupVersionKind::gvk("apps", "v1", "DaemonSet"),
        OwnerKind::Job => GroupVersionKind::gvk("batch", "v1", "Job"),
        OwnerKind::Other(_) => return Ok((OwnerPolicy::default(), None, None)),
    };
    let uid = controller_uid(pod);
    if let Some(facts) = uid.and_then(|uid| ctx.owners.get(uid)) {
        return Ok(policy_of(kind, facts));
    }
    // One read per controller among concurrent isolations: wait for the turn, then look
    // again, since the isolation before may have read it meanwhile.
    let _turn = match uid {
        Some(uid) => Some(ctx.owners.turn(uid).await),
        None => None,
    };
    if let Some(facts) = uid.and_then(|uid| ctx.owners.get(uid)) {
        return Ok(policy_of(kind, facts));
    }
    let resource = ApiResource::from_gvk(&gvk);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &pod.namespace, &resource);
    let owner = match api.get_opt(name).await {
        Ok(Some(owner)) => owner,
        Ok(None) => return Ok((OwnerPolicy::default(), None, None)),
        Err(source) => return Err(api_err(pod, &format!("get {} {name}", gvk.kind), source)),
    };
    let mut facts = OwnerFacts {
        selector_keys: owner
            .data
            .pointer("/spec/selector")
            .cloned()
            .and_then(|v| serde_json::from_value::<LabelSelector>(v).ok())
            .map(|s| selector_keys(&s))
            .unwrap_or_default(),
        controller: match kind {
            OwnerKind::ReplicaSet => owner
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))
                .map(|r| {
                    serde_json::json!({"apiVersion": r.api_version, "kind": r.kind,
                        "name": r.name, "uid": r.uid, "controller": true})
                }),
            _ => None,
        },
        recreate: None,
    };
    if let Some(deployment) = facts.controller.as_ref().and_then(deployment_name) {
        facts.recreate = recreate_deployment(ctx, pod, &deployment).await?;
    }
    // Only the object the pod's reference names is remembered under its UID.
    if let Some(uid) = uid.filter(|uid| owner.metadata.uid.as_deref() == Some(*uid)) {
        ctx.owners.remember(uid, facts.clone());
    }
    Ok(policy_of(kind, facts))
}

fn policy_of(kind: &OwnerKind, facts: OwnerFacts) -> (OwnerPolicy, Option<Value>, Option<String>) {
    (
        OwnerPolicy::for_owner(kind, facts.selector_keys),
        facts.controller,
        facts.recreate,
    )
}

/// The name of the Deployment a ReplicaSet's controller reference names, if it does.
fn deployment_name(controller: &Value) -> Option<String> {
    (controller.get("kind")?.as_str()? == "Deployment"
        && controller.get("apiVersion")?.as_str()? == "apps/v1")
        .then(|| controller.get("name")?.as_str().map(str::to_string))
        .flatten()
}

/// `namespace/name` of Deployment `name` when its strategy is Recreate (one read per
/// ReplicaSet, remembered with it); a Deployment already gone protects nothing.
async fn recreate_deployment(
    ctx: &Context,
    pod: &PodFacts,
    name: &str,
) -> Result<Option<String>, Error> {
    let api = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        ctx.client.clone(),
        &pod.namespace,
    );
    let deployment = api
        .get_opt(name)
        .await
        .map_err(|source| api_err(pod, &format!("get Deployment {name}"), source))?;
    let recreate = deployment
        .and_then(|d| d.spec?.strategy?.type_)
        .is_some_and(|t| t == "Recreate");
    Ok(recreate.then(|| format!("{}/{name}", pod.namespace)))
}

/// The pod's controller reference, as sent.
pub(super) fn controller_ref(pod: &PodFacts) -> Option<&Value> {
    pod.owner_refs
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// The UID in the pod's controller reference.
fn controller_uid(pod: &PodFacts) -> Option<&str> {
    controller_ref(pod)?.get("uid")?.as_str()
}
