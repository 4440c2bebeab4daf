//! `authentication.k8s.io/v1` SelfSubjectReview: a create-only resource answering who
//! the caller is (what `kubectl auth whoami` asks), nothing stored. Upstream:
//! `pkg/registry/authentication/selfsubjectreview/rest.go` fills `status.userInfo` from
//! the request's user and returns 201.

use http::StatusCode;
use serde_json::{Value, json};

use super::request::UserInfo;

/// The collection path of SelfSubjectReviews.
pub(crate) const PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// The answer to a POST of a SelfSubjectReview (its body carries nothing to read).
pub(crate) fn review(user: &UserInfo) -> (StatusCode, Value) {
    (
        StatusCode::CREATED,
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "metadata": {"creationTimestamp": super::meta::now()},
            "status": {"userInfo": {"username": user.username, "groups": user.groups}},
        }),
    )
}
