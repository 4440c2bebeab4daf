//! Parsing AdmissionReviews into what [`super::decide`] needs, and building the replies.
//!
//! Malformed JSON and a review without a `request` are errors (HTTP 400). Everything
//! else that parses — a wrong apiVersion or kind, an operation or resource that is not
//! ours, a missing object — becomes [`Parsed::NotOurs`], answered with an allowed review
//! that changes nothing. Every reply is an `admission.k8s.io/v1` `AdmissionReview` built
//! with kube's `AdmissionResponse::from(&request)`, so the uid is always echoed.

use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND, Operation,
};
use kube::core::{DynamicObject, TypeMeta};
use serde_json::Value;

use super::decide::{OwnerKind, Path, PodFacts, Request};

/// Why a body could not be read as an AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is not a JSON AdmissionReview.
    #[error("parse AdmissionReview: {0}")]
    Json(#[source] serde_json::Error),
    /// The review carries no `request`.
    #[error("AdmissionReview has no request")]
    NoRequest,
}

/// A review on the eviction path.
#[derive(Clone, Debug)]
pub struct Eviction {
    pub request: Request,
    pub namespace: String,
    pub pod: String,
    /// The Eviction's `deleteOptions` (an object) or `Value::Null` when absent.
    pub delete_options: Value,
}

/// A review on the delete path.
#[derive(Clone, Debug)]
pub struct Deletion {
    pub request: Request,
    pub pod: Box<Pod>,
}

/// What a review asks of us.
#[derive(Clone, Debug)]
pub enum Parsed {
    Evict(Eviction),
    Delete(Deletion),
    /// Valid JSON but nothing for us; the reason is logged.
    NotOurs(&'static str),
}

/// A parsed review: the raw request (for the reply) and its meaning.
#[derive(Clone, Debug)]
pub struct Review {
    pub request: AdmissionRequest<DynamicObject>,
    pub parsed: Parsed,
}

/// Parses `body` received on `path`.
pub fn parse(body: &[u8], path: Path) -> Result<Review, Error> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(Error::Json)?;
    let types_ok =
        review.types.api_version == META_API_VERSION_V1 && review.types.kind == META_KIND;
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| Error::NoRequest)?;
    let parsed = if types_ok {
        classify(&request, path)
    } else {
        Parsed::NotOurs("not an admission.k8s.io/v1 AdmissionReview")
    };
    Ok(Review { request, parsed })
}

fn is_pods(req: &AdmissionRequest<DynamicObject>) -> bool {
    req.resource.group.is_empty() && req.resource.version == "v1" && req.resource.resource == "pods"
}

fn classify(req: &AdmissionRequest<DynamicObject>, path: Path) -> Parsed {
    if !is_pods(req) {
        return Parsed::NotOurs("resource is not v1 pods");
    }
    let sub = req.sub_resource.as_deref().unwrap_or("");
    match path {
        Path::Evict => {
            if req.operation != Operation::Create || sub != "eviction" {
                return Parsed::NotOurs("not a CREATE of pods/eviction");
            }
            if req.kind.kind != "Eviction" {
                return Parsed::NotOurs("object is not an Eviction");
            }
            classify_eviction(req)
        }
        Path::Delete => {
            if req.operation != Operation::Delete || !sub.is_empty() {
                return Parsed::NotOurs("not a DELETE of pods");
            }
            classify_deletion(req)
        }
    }
}

fn classify_eviction(req: &AdmissionRequest<DynamicObject>) -> Parsed {
    let Some(object) = &req.object else {
        return Parsed::NotOurs("eviction without object");
    };
    let Some(namespace) = req.namespace.clone().filter(|ns| !ns.is_empty()) else {
        return Parsed::NotOurs("eviction without namespace");
    };
    let pod = object
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| req.name.clone());
    if pod.is_empty() {
        return Parsed::NotOurs("eviction without pod name");
    }
    let delete_options = match object.data.get("deleteOptions") {
        Some(v @ Value::Object(_)) => v.clone(),
        _ => Value::Null,
    };
    let request = Request {
        path: Path::Evict,
        dry_run: req.dry_run || options_dry_run(&delete_options),
        grace_period: delete_options
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64),
        user: req.user_info.username.clone().unwrap_or_default(),
    };
    Parsed::Evict(Eviction {
        request,
        namespace,
        pod,
        delete_options,
    })
}

fn classify_deletion(req: &AdmissionRequest<DynamicObject>) -> Parsed {
    let Some(old) = &req.old_object else {
        return Parsed::NotOurs("delete without oldObject");
    };
    let Ok(pod) = old.clone().try_parse::<Pod>() else {
        return Parsed::NotOurs("oldObject is not a Pod");
    };
    let options = req
        .options
        .as_ref()
        .map(|o| o.0.clone())
        .unwrap_or(Value::Null);
    let request = Request {
        path: Path::Delete,
        dry_run: req.dry_run || options_dry_run(&options),
        grace_period: options.get("gracePeriodSeconds").and_then(Value::as_i64),
        user: req.user_info.username.clone().unwrap_or_default(),
    };
    Parsed::Delete(Deletion {
        request,
        pod: Box::new(pod),
    })
}

fn options_dry_run(options: &Value) -> bool {
    options
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

/// The facts [`super::decide::decide`] needs from a full pod.
pub fn pod_facts(pod: &Pod) -> PodFacts {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let owner = meta
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
        .map(|r| {
            (
                OwnerKind::from_reference(&r.api_version, &r.kind),
                r.name.clone(),
            )
        });
    PodFacts {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
        ready,
        terminating: meta.deletion_timestamp.is_some(),
        owner,
    }
}

/// An allowed reply that changes nothing, for `request`.
pub fn allow(request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(request);
    // Always answer in v1, whatever the request claimed; the API server rejects anything else.
    response.types = TypeMeta {
        api_version: META_API_VERSION_V1.to_string(),
        kind: META_KIND.to_string(),
    };
    response
}

/// The JSON patch turning an Eviction into a dry run, keeping its other options.
pub fn dry_run_patch(delete_options: &Value) -> json_patch::Patch {
    let mut options = match delete_options {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    options.insert("dryRun".into(), Value::Array(vec![Value::from("All")]));
    json_patch::Patch(vec![json_patch::PatchOperation::Add(
        json_patch::AddOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["deleteOptions"]),
            value: Value::Object(options),
        },
    )])
}

/// Serialises `response` as a full AdmissionReview.
pub fn to_body(response: AdmissionResponse) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&response.into_review())
}
