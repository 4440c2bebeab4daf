//! The last stage of a review: what it is answered and the outcome it is counted as. An
//! [`Answer`] yields both the AdmissionResponse and the `outcome` label of
//! `graceful_drain_webhook_reviews_total`, and every label is written once, in
//! [`Outcome::as_str`].

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};

use crate::decide::Pass;
use crate::review;

/// How a review ended, as counted (docs/webhook.md lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The pod was isolated by this review.
    Isolated,
    /// The pod was already isolated; its delete time is not here yet.
    Pending,
    /// A ReplicaSet controller's DELETE, refused once the pod was isolated (the deferred
    /// deleter removes it).
    Refused,
    /// The live PDB refuses the eviction.
    PdbExhausted,
    /// The live PDB's latest generation is not observed yet.
    PdbNotObserved,
    /// Isolation could not be done for now (the API server unavailable, a failed read).
    Error,
    /// The API server's deadline for the call came first.
    Deadline,
    /// Isolation can never succeed for this request; let through with a Warning Event.
    FailedPermanently,
    /// An isolation nothing confirms, past its Service's unconfirmed share.
    UnconfirmedLimit,
    /// An eviction held until its pod was due, then allowed.
    HeldUntilDue,
    /// An eviction held until the webhook removed its due pod, then answered 404.
    HeldUntilGone,
    /// The descheduler's eviction of a pod annotated for evictions in the background.
    EvictingInBackground,
    /// A DELETE claiming the ReplicaSet controller that the live ReplicaSet does not back.
    Unverified,
    /// A DELETE whose pod does not exist, or is another incarnation.
    NotLive,
    /// A DELETE let through at once: every hold slot was taken.
    HoldLimit,
    /// Not a pod's eviction or DELETE (another resource or subresource).
    NotOurs,
    /// The protection probe.
    Probe,
    /// The body is not an AdmissionReview (answered 400).
    Malformed,
    /// Let through unchanged for this reason.
    Pass(Pass),
}

impl Outcome {
    /// The `outcome` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Isolated => "isolated",
            Outcome::Pending => "pending",
            Outcome::Refused => "refused",
            Outcome::PdbExhausted => "pdb_exhausted",
            Outcome::PdbNotObserved => "pdb_not_observed",
            Outcome::Error => "error",
            Outcome::Deadline => "deadline",
            Outcome::FailedPermanently => "failed_permanently",
            Outcome::UnconfirmedLimit => "unconfirmed_limit",
            Outcome::HeldUntilDue => "held_until_due",
            Outcome::HeldUntilGone => "held_until_gone",
            Outcome::EvictingInBackground => "evicting_in_background",
            Outcome::Unverified => "unverified",
            Outcome::NotLive => "not_live",
            Outcome::HoldLimit => "hold_limit",
            Outcome::NotOurs => "not_ours",
            Outcome::Probe => "probe",
            Outcome::Malformed => "malformed",
            Outcome::Pass(pass) => pass.as_str(),
        }
    }
}

/// What a review is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Allowed unchanged.
    Allow(Outcome),
    /// Allowed, with warnings the API server hands back to the caller.
    AllowWarning(Outcome, Vec<String>),
    /// Refused with the API server's default code (403) and `message`.
    Deny(Outcome, String),
    /// Refused with 429 TooManyRequests and a `Retry-After` of `retry` seconds (0: none):
    /// every eviction caller retries it.
    TooManyRequests(Outcome, String, u32),
    /// Refused with 429 saying the pod is leaving its load balancers, retry after `retry`
    /// seconds ([`review::deregistering`]).
    Deregistering(Outcome, String, u32),
    /// Refused with 404: the eviction's pod is gone ([`review::gone`]).
    Gone(Outcome, String),
}

impl Answer {
    /// The outcome it is counted as.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Answer::Allow(outcome)
            | Answer::AllowWarning(outcome, _)
            | Answer::Deny(outcome, _)
            | Answer::TooManyRequests(outcome, _, _)
            | Answer::Deregistering(outcome, _, _)
            | Answer::Gone(outcome, _) => *outcome,
        }
    }

    /// The AdmissionResponse to `request`.
    pub(crate) fn response(self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        match self {
            Answer::Allow(_) => review::allow(request),
            Answer::AllowWarning(_, warnings) => {
                let mut allow = review::allow(request);
                allow.warnings = Some(warnings);
                allow
            }
            Answer::Deny(_, message) => review::allow(request).deny(message),
            Answer::TooManyRequests(_, message, retry) => {
                review::too_many_requests(request, message, retry)
            }
            Answer::Deregistering(_, message, retry) => {
                review::deregistering(request, message, retry)
            }
            Answer::Gone(_, message) => review::gone(request, message),
        }
    }
}
