//! Parsing AdmissionReviews into what [`super::decide`] needs, and building the replies.
//!
//! Malformed JSON and a review without a `request` are errors (HTTP 400). Everything
//! else that parses — a wrong apiVersion or kind, an operation or resource that is not
//! ours, a missing object — becomes [`Parsed::NotOurs`], answered with an allowed review
//! that changes nothing. Every reply is an `admission.k8s.io/v1` `AdmissionReview` built
//! with kube's `AdmissionResponse::from(&request)`, so the uid is always echoed.

use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
    Operation as AdmissionOperation,
};
use kube::core::{DynamicObject, TypeMeta};
use serde_json::Value;

use super::decide::{Operation, OwnerKind, PodFacts, Preconditions, Removal};
use graceful_drain_core::labels::DEREGISTERING_CAUSE;

/// Why a body could not be read as an AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is not a JSON AdmissionReview.
    #[error("parse AdmissionReview")]
    Json(#[source] serde_json::Error),
    /// The review carries no `request`.
    #[error("AdmissionReview has no request")]
    NoRequest,
    /// A review holding more JSON values than [`MAX_VALUES`].
    #[error(
        "AdmissionReview holds {values} JSON values, more than the {MAX_VALUES} any pod's review needs"
    )]
    TooIntricate {
        /// How many it holds.
        values: usize,
    },
    /// A pod's name or namespace no API server sends (the value itself is not repeated:
    /// it may be a megabyte long).
    #[error("AdmissionReview's request.{field} is not a Kubernetes {kind} ({len} bytes)")]
    Name {
        /// `name` or `namespace`.
        field: &'static str,
        /// What it must be: a DNS subdomain (pods) or a DNS label (namespaces).
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
    },
}

/// Whether `value` is a DNS-1123 subdomain (a pod's name: lowercase letters, digits, `-`
/// and `.`, at most 253 bytes, alphanumeric at both ends; apimachinery's
/// `IsDNS1123Subdomain`, which `ValidatePodName` applies) or, with `label`, a DNS-1123
/// label (a namespace: no `.`, at most 63 bytes; `IsDNS1123Label`).
fn dns1123(value: &str, label: bool) -> bool {
    let max = if label { 63 } else { 253 };
    let bytes = value.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= max
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| alnum(b) || *b == b'-' || (!label && *b == b'.'))
}

/// Refuses a pods review whose name or namespace Kubernetes would not allow: the API
/// server never sends one, and every log line of the review carries both.
fn check_names(req: &AdmissionRequest<DynamicObject>) -> Result<(), Error> {
    if !req.name.is_empty() && !dns1123(&req.name, false) {
        return Err(Error::Name {
            field: "name",
            kind: "pod name",
            len: req.name.len(),
        });
    }
    match req.namespace.as_deref() {
        Some(ns) if !ns.is_empty() && !dns1123(ns, true) => Err(Error::Name {
            field: "namespace",
            kind: "namespace",
            len: ns.len(),
        }),
        _ => Ok(()),
    }
}

/// A review on the eviction path.
#[derive(Clone, Debug)]
pub struct Eviction {
    /// The request as the decision sees it.
    pub request: Removal,
    /// The pod's namespace (`request.namespace`, never empty).
    pub namespace: String,
    /// The pod's name (`request.name`, never empty); the body is not trusted for it.
    pub pod: String,
    /// The Eviction's `deleteOptions` (an object) or `Value::Null` when absent.
    pub delete_options: Value,
    /// The Eviction's `requested-by` annotation (the descheduler writes
    /// `sigs.k8s.io/descheduler` there): a claim that only chooses the form of a refusal.
    pub requested_by: Option<String>,
}

/// A review on the delete path. The pod stays a `DynamicObject` until it is needed:
/// most DELETEs are answered from its metadata and the caches alone.
#[derive(Clone, Debug)]
pub struct Deletion {
    /// The request as the decision sees it.
    pub request: Removal,
    /// The pod's namespace (`request.namespace`).
    pub namespace: String,
    /// The pod being deleted (`request.oldObject`), checked to be a `v1` Pod of the
    /// request's name.
    pub object: Box<DynamicObject>,
}

impl Deletion {
    /// The typed pod, `None` when `oldObject` does not parse as one.
    pub fn pod(self) -> Option<Pod> {
        self.object.try_parse::<Pod>().ok()
    }
}

/// What a review asks of us.
#[derive(Clone, Debug)]
pub enum Parsed {
    /// A CREATE of `pods/eviction` on the mutating path.
    Evict(Eviction),
    /// A DELETE of a pod on the validating path.
    Delete(Deletion),
    /// Valid JSON but nothing for us; the reason is logged.
    NotOurs(&'static str),
}

/// A parsed review: the raw request (for the reply) and its meaning.
#[derive(Clone, Debug)]
pub struct Review {
    /// The admission request, kept to build the reply (its uid is echoed). For a DELETE
    /// its `oldObject` has been moved into [`Deletion::object`].
    pub request: AdmissionRequest<DynamicObject>,
    /// What the request means for us.
    pub parsed: Parsed,
}

/// Parses `body` received on `path`.
pub fn parse(body: &[u8], operation: Operation) -> Result<Review, Error> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(Error::Json)?;
    let types_ok =
        review.types.api_version == META_API_VERSION_V1 && review.types.kind == META_KIND;
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| Error::NoRequest)?;
    let mut request = request;
    if is_pods(&request) {
        check_names(&request)?;
    }
    let parsed = if types_ok {
        classify(&mut request, operation)
    } else {
        Parsed::NotOurs("not an admission.k8s.io/v1 AdmissionReview")
    };
    Ok(Review { request, parsed })
}

/// The most JSON values a review may hold. A pod's DELETE review carries the pod once,
/// its managed fields included: a pod of forty containers, each with ports, probes,
/// twenty environment variables and their managed fields, is about 8,300 values (the
/// `a_pod_of_forty_containers_fits` test counts one). At [`VALUE_COST`] the largest review
/// allowed, with its body, stays inside one address's share of the transport's budget
/// (`transport::PEER_SHARE`).
pub const MAX_VALUES: usize = 24_576;
/// What parsing takes per JSON value at most, in bytes: measured over 3.3 MB reviews of
/// the costliest shapes, an array of one-key objects took 504 bytes per value (an array
/// of numbers 67, one object of many keys 181).
pub const VALUE_COST: usize = 512;

/// What parsing `body` into a [`Review`] may take in memory, in bytes: a bound set from
/// its count of JSON values before anything is built. A review over [`MAX_VALUES`] is an
/// error: no API server sends one.
pub fn parse_cost(body: &[u8]) -> Result<usize, Error> {
    let values = json_values(body)?;
    if values > MAX_VALUES {
        return Err(Error::TooIntricate { values });
    }
    Ok(values * VALUE_COST)
}

/// How many JSON values `body` holds (every object, array, string, number, boolean and
/// null; an object's keys are not counted), found by walking it with serde_json's own
/// parser without building any of them. What parsing a review costs in memory grows with
/// this count far more than with the body's length: a 3 MiB array of empty objects is a
/// million values. serde_json's nesting limit (128) applies to the walk as to the parse.
pub fn json_values(body: &[u8]) -> Result<usize, Error> {
    let mut count = 0;
    let mut de = serde_json::Deserializer::from_slice(body);
    serde::de::DeserializeSeed::deserialize(Counter(&mut count), &mut de).map_err(Error::Json)?;
    de.end().map_err(Error::Json)?;
    Ok(count)
}

/// Counts one value and, inside arrays and objects, every value they hold.
struct Counter<'a>(&'a mut usize);

impl<'de> serde::de::DeserializeSeed<'de> for Counter<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Counter<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        *self.0 += 1;
        while seq.next_element_seed(Counter(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        *self.0 += 1;
        while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            map.next_value_seed(Counter(&mut *self.0))?;
        }
        Ok(())
    }
}

fn is_pods(req: &AdmissionRequest<DynamicObject>) -> bool {
    req.resource.group.is_empty() && req.resource.version == "v1" && req.resource.resource == "pods"
}

fn classify(req: &mut AdmissionRequest<DynamicObject>, operation: Operation) -> Parsed {
    if !is_pods(req) {
        return Parsed::NotOurs("resource is not v1 pods");
    }
    let sub = req.sub_resource.as_deref().unwrap_or("");
    match operation {
        Operation::Evict => {
            if req.operation != AdmissionOperation::Create || sub != "eviction" {
                return Parsed::NotOurs("not a CREATE of pods/eviction");
            }
            if req.kind.kind != "Eviction" {
                return Parsed::NotOurs("object is not an Eviction");
            }
            classify_eviction(req)
        }
        Operation::Delete => {
            if req.operation != AdmissionOperation::Delete || !sub.is_empty() {
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
    // The pod is the one the request is about (the URL's name, `request.name`); the API
    // server checks that the body names the same pod, so the body is never trusted for it.
    let pod = req.name.clone();
    if pod.is_empty() {
        return Parsed::NotOurs("eviction without pod name");
    }
    let delete_options = match object.data.get("deleteOptions") {
        Some(v @ Value::Object(_)) => v.clone(),
        _ => Value::Null,
    };
    let request = Removal {
        operation: Operation::Evict,
        name: pod.clone(),
        preconditions: preconditions(&delete_options),
        dry_run: req.dry_run || options_dry_run(&delete_options),
        grace_period: delete_options
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64),
        user: req.user_info.username.clone().unwrap_or_default(),
        owner_backed: false,
    };
    let requested_by = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("requested-by"))
        .cloned();
    Parsed::Evict(Eviction {
        request,
        namespace,
        pod,
        delete_options,
        requested_by,
    })
}

fn classify_deletion(req: &mut AdmissionRequest<DynamicObject>) -> Parsed {
    let Some(old) = &req.old_object else {
        return Parsed::NotOurs("delete without oldObject");
    };
    let is_pod = old
        .types
        .as_ref()
        .is_some_and(|t| t.kind == "Pod" && t.api_version == "v1");
    if !is_pod {
        return Parsed::NotOurs("oldObject is not a Pod");
    }
    let options = req
        .options
        .as_ref()
        .map(|o| o.0.clone())
        .unwrap_or(Value::Null);
    if old.metadata.name.as_deref() != Some(req.name.as_str()) {
        return Parsed::NotOurs("oldObject is not the request's pod");
    }
    let request = Removal {
        operation: Operation::Delete,
        name: req.name.clone(),
        preconditions: preconditions(&options),
        dry_run: req.dry_run || options_dry_run(&options),
        grace_period: options.get("gracePeriodSeconds").and_then(Value::as_i64),
        user: req.user_info.username.clone().unwrap_or_default(),
        owner_backed: false,
    };
    match req.old_object.take() {
        Some(object) => Parsed::Delete(Deletion {
            request,
            namespace: req.namespace.clone().unwrap_or_default(),
            object: Box::new(object),
        }),
        None => Parsed::NotOurs("delete without oldObject"),
    }
}

fn preconditions(options: &Value) -> Preconditions {
    let field = |key: &str| {
        options
            .pointer(&format!("/preconditions/{key}"))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    Preconditions {
        uid: field("uid"),
        resource_version: field("resourceVersion"),
    }
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
        owner_refs: meta
            .owner_references
            .iter()
            .flatten()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect(),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
    }
}

/// A test pod's facts at the end of a fixture chain: `pod("p").ready().facts()`.
#[cfg(test)]
pub(crate) trait IntoFacts {
    fn facts(self) -> PodFacts;
}

#[cfg(test)]
impl IntoFacts for Pod {
    fn facts(self) -> PodFacts {
        pod_facts(&self)
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

/// A refusal with HTTP 429 TooManyRequests: the API server hands the code and details
/// to the caller (`details.retryAfterSeconds` becomes its `Retry-After` header), and
/// eviction callers retry it like a PodDisruptionBudget refusal.
pub fn too_many_requests(
    request: &AdmissionRequest<DynamicObject>,
    message: impl Into<String>,
    retry_after_seconds: u32,
) -> AdmissionResponse {
    refusal(
        request,
        message,
        (429, "TooManyRequests"),
        retry_after_seconds,
    )
}

/// A 404 NotFound refusing an eviction whose pod is gone. The API server hands a webhook's
/// refusal to the caller with its code and reason (`ToStatusErr` in staging/src/k8s.io/
/// apiserver/pkg/admission/plugin/webhook/errors/statuserror.go), so the caller sees what
/// it would for an eviction of a missing pod, which every eviction caller counts as done;
/// allowing it instead would let the API server evict a replacement that took the name (a
/// StatefulSet's) for a caller that sent no UID precondition.
pub fn gone(
    request: &AdmissionRequest<DynamicObject>,
    message: impl Into<String>,
) -> AdmissionResponse {
    refusal(request, message, (404, "NotFound"), 0)
}

/// A refusal of the request's pod with `status` (code, reason) and details.
fn refusal(
    request: &AdmissionRequest<DynamicObject>,
    message: impl Into<String>,
    (code, reason): (u16, &str),
    retry_after_seconds: u32,
) -> AdmissionResponse {
    let mut response = allow(request).deny(message.into());
    response.result.code = code;
    response.result.reason = reason.to_string();
    response.result.details = Some(kube::core::response::StatusDetails {
        name: request.name.clone(),
        group: String::new(),
        kind: "pods".to_string(),
        uid: String::new(),
        causes: Vec::new(),
        retry_after_seconds,
    });
    response
}

/// A 429 refusing an eviction while the isolated pod deregisters, with `Retry-After` at
/// its delete time and a [`DEREGISTERING_CAUSE`] cause.
pub fn deregistering(
    request: &AdmissionRequest<DynamicObject>,
    message: impl Into<String>,
    retry_after_seconds: u32,
) -> AdmissionResponse {
    let message = message.into();
    let mut response = too_many_requests(request, message.clone(), retry_after_seconds);
    if let Some(details) = response.result.details.as_mut() {
        details.causes.push(kube::core::response::StatusCause {
            reason: DEREGISTERING_CAUSE.to_string(),
            message,
            field: String::new(),
        });
    }
    response
}

/// Serialises `response` as a full AdmissionReview.
///
/// kube-core writes `response.patch` (Go `[]byte`) as a JSON array of numbers. The API
/// server's decoder accepts that, but Go's canonical encoding — and what every other
/// webhook sends — is a base64 string, so the patch is re-encoded that way.
pub fn to_body(response: AdmissionResponse) -> Result<Vec<u8>, serde_json::Error> {
    let review = response.into_review();
    let patch = review.response.as_ref().and_then(|r| r.patch.as_ref());
    let Some(patch) = patch else {
        return serde_json::to_vec(&review);
    };
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(patch);
    let mut value = serde_json::to_value(&review)?;
    if let Some(slot) = value.pointer_mut("/response/patch") {
        *slot = Value::String(encoded);
    }
    serde_json::to_vec(&value)
}

#[cfg(test)]
mod tests;
