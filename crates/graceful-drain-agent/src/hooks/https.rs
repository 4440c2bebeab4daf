//! The HTTPS hook protocol: the messages the agent and a hook exchange, the POST that
//! carries them, and what one call to a hook learned (`Answer`, or a `CallError` to retry),
//! which the Job target answers in the same terms.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::{Deserialize, Serialize};

use super::config::{HookPoint, HttpsClient};

/// What `action` the agent asks of an HTTPS hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookAction {
    /// Begin the run with the request's `id`; sent again only after a poll for that id
    /// was answered 404.
    Start,
    /// Report on the run with the request's `id`; a hook that does not know the id
    /// answers 404, and the agent then starts it.
    Poll,
}

/// The body the agent POSTs to an HTTPS hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRequest {
    /// The protocol's version, `graceful-drain.io/v1` from the agent.
    pub api_version: String,
    /// Always `HookRequest`.
    pub kind: String,
    /// Whether to start the run or report on it.
    pub action: HookAction,
    /// Stable for one run of one hook: a poll carries the id of its start.
    pub id: String,
    /// The hook's configured name.
    pub hook: String,
    /// The point of the transition the hook runs at.
    pub at: HookPoint,
    /// The node being maintained.
    pub node: String,
    /// The LifecycleEvent of the transition; absent when the transition names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_event: Option<String>,
}

/// Where a hook says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookStatus {
    /// The hook finished successfully; the transition goes on.
    Done,
    /// Still working: the agent polls again after the hook's poll interval.
    InProgress,
    /// The hook gave up; this fails the transition unless the hook is optional.
    Failed,
}

/// A hook's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookResponse {
    /// Where the run stands.
    pub status: HookStatus,
    /// Free text for people; shown in Events, the Node condition and `/status` (may be
    /// empty).
    #[serde(default)]
    pub message: String,
}

/// What one call to a hook learned.
#[derive(Debug)]
pub(super) enum Answer {
    Said(HookResponse),
    /// A poll for an id the hook does not know: start it.
    Unknown,
}

/// A call that did not give an answer; retried.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    #[error("{0}")]
    Transport(String),
    #[error("answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("answer is not a hook response: {0}")]
    Body(String),
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

pub(super) async fn post(
    client: &HttpsClient,
    uri: &http::Uri,
    request: &HookRequest,
) -> Result<Answer, CallError> {
    let body = serde_json::to_vec(request).map_err(|e| CallError::Body(e.to_string()))?;
    let http_request = http::Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| CallError::Transport(e.to_string()))?;
    let response = client.request(http_request).await.map_err(|e| {
        CallError::Transport(format!(
            "POST {uri}: {}",
            graceful_drain_core::error::chain(&e)
        ))
    })?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| CallError::Transport(format!("POST {uri}: {e}")))?
        .to_bytes();
    // A poll for an id the hook never saw; a start answered 404 is a wrong URL.
    if status == http::StatusCode::NOT_FOUND && request.action == HookAction::Poll {
        return Ok(Answer::Unknown);
    }
    if !status.is_success() {
        let body = String::from_utf8_lossy(&bytes).chars().take(200).collect();
        return Err(CallError::Status {
            status: status.as_u16(),
            body,
        });
    }
    serde_json::from_slice(&bytes)
        .map(Answer::Said)
        .map_err(|e| CallError::Body(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::super::context::HookStep;
    use super::*;
    use graceful_drain_core::labels::HOOK_API_VERSION;
    use serde_json::json;

    #[test]
    fn the_wire_format_is_camel_case() {
        let request = HookRequest {
            api_version: HOOK_API_VERSION.into(),
            kind: "HookRequest".into(),
            action: HookAction::Poll,
            id: "abc".into(),
            hook: "evacuate-vms".into(),
            at: HookPoint::BeforeEviction,
            node: "w1".into(),
            lifecycle_event: Some("drain-w1".into()),
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"apiVersion": HOOK_API_VERSION, "kind": "HookRequest", "action": "poll",
                "id": "abc", "hook": "evacuate-vms", "at": "before-eviction", "node": "w1",
                "lifecycleEvent": "drain-w1"})
        );
        let answer: HookResponse = serde_json::from_value(json!({"status": "inProgress"})).unwrap();
        assert_eq!(answer.status, HookStatus::InProgress);
        assert!(serde_json::from_value::<HookResponse>(json!({"status": "maybe"})).is_err());
        let step = HookStep {
            name: "evacuate-vms".into(),
            at: HookPoint::BeforeEviction,
            message: "2/6 VMs moved".into(),
        };
        assert_eq!(
            step.to_string(),
            "hook evacuate-vms (before-eviction): 2/6 VMs moved"
        );
    }
}
