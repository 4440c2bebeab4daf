//! Failure answers as the API server renders them: `metav1.Status` objects with a
//! reason, a code, details naming the object, and `Retry-After` where upstream sets it.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

/// An API failure, rendered as a `Status` object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// (group, kind/resource, name) for `details`.
    pub details: Option<Box<(String, String, String)>>,
    /// Seconds for the `Retry-After` header and `details.retryAfterSeconds`.
    pub retry_after: Option<u64>,
    /// The entries of `details.causes`.
    pub causes: Vec<Cause>,
}

/// One entry of a Status's `details.causes` (`metav1.StatusCause`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cause {
    /// Machine-readable reason, such as `FieldValueRequired` (omitted when empty).
    pub reason: String,
    /// Human-readable description (omitted when empty).
    pub message: String,
    /// The field the cause is about, such as `spec.bindingNode` (omitted when empty).
    pub field: String,
}

impl Cause {
    /// A cause with a reason and message but no field.
    pub(crate) fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
            field: String::new(),
        }
    }

    /// The cause as `details.causes` carries it, empty members omitted like upstream's
    /// `omitempty` fields.
    fn to_json(&self) -> Value {
        let mut cause = serde_json::Map::new();
        for (key, value) in [
            ("reason", &self.reason),
            ("message", &self.message),
            ("field", &self.field),
        ] {
            if !value.is_empty() {
                cause.insert(key.into(), json!(value));
            }
        }
        Value::Object(cause)
    }
}

/// Result type of request handling.
pub(crate) type ApiResult<T> = std::result::Result<T, ApiError>;

impl ApiError {
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            retry_after: None,
            causes: Vec::new(),
        }
    }

    pub(crate) fn with_retry(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub(crate) fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details = Some(Box::new((group.into(), kind.into(), name.into())));
        self
    }

    pub(crate) fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(group, resource, name)
    }

    pub(crate) fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(group, resource, name)
    }

    pub(crate) fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        )
        .with_details(group, resource, name)
    }

    pub(crate) fn stale(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn invalid(group: &str, kind: &str, name: &str, message: impl Into<String>) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", message.into()),
        )
        .with_details(group, kind, name)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// The `Status` object.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.details.is_some() || self.retry_after.is_some() || !self.causes.is_empty() {
            let mut details = serde_json::Map::new();
            if let Some((group, kind, name)) = self.details.as_deref() {
                details.insert("name".into(), json!(name));
                if !group.is_empty() {
                    details.insert("group".into(), json!(group));
                }
                details.insert("kind".into(), json!(kind));
            }
            // `retryAfterSeconds` is omitted when zero, like any omitempty field.
            if let Some(secs) = self.retry_after.filter(|s| *s > 0) {
                details.insert("retryAfterSeconds".into(), json!(secs));
            }
            if !self.causes.is_empty() {
                let causes: Vec<Value> = self.causes.iter().map(Cause::to_json).collect();
                details.insert("causes".into(), Value::Array(causes));
            }
            status["details"] = Value::Object(details);
        }
        status
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (code, axum::Json(self.to_status())).into_response();
        // Like upstream's `ErrorNegotiated`, only a positive delay becomes a header.
        if let Some(secs) = self.retry_after.filter(|s| *s > 0)
            && let Ok(value) = HeaderValue::from_str(&secs.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_look_like_the_api_server_s() {
        let status = ApiError::not_found("apps", "deployments", "web").to_status();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
        assert_eq!(status["message"], "deployments.apps \"web\" not found");
        assert_eq!(
            status["details"],
            json!({"name": "web", "group": "apps", "kind": "deployments"})
        );
    }

    #[test]
    fn too_many_requests_carry_retry_after_only_when_positive() {
        let error = ApiError::new(429, "TooManyRequests", "slow down").with_retry(10);
        assert_eq!(error.to_status()["details"]["retryAfterSeconds"], 10);
        let response = error.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "10");
        let error = ApiError::new(429, "TooManyRequests", "slow down").with_retry(0);
        assert!(error.to_status().get("details").is_some());
        assert!(
            error.to_status()["details"]
                .get("retryAfterSeconds")
                .is_none()
        );
        let response = error.into_response();
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }
}
