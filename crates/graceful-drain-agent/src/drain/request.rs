//! The eviction and delete requests: building and sending them, classifying the API
//! server's answers, and how long to wait before retrying a refusal.

use std::time::Duration;

use http::{Method, Request, StatusCode};
use serde_json::json;

use crate::filters::PodKey;
use crate::node::API_TIMEOUT;
use crate::progress::Blocker;
use crate::report::EvictionOutcome;
use graceful_drain_core::backoff::Backoff;
use graceful_drain_core::labels::DEREGISTERING_CAUSE;

/// First retry delay of a refused eviction.
pub(super) const RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest delay between retries of a refused eviction: a PDB usually frees a disruption
/// seconds after a replacement pod turns ready, so waiting longer only slows the drain,
/// while 15 s keeps a blocked pod at four requests a minute.
pub(super) const RETRY_CAP: Duration = Duration::from_secs(15);
/// Longest `Retry-After` we honour; a larger value would stall the drain past what a PDB
/// status refresh takes (the API server sends 0 or 10).
pub(super) const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// What an eviction (or delete) request got back, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The pod is (being) removed or already gone: stop sending requests for it.
    Done(EvictionOutcome),
    /// Refused; retry after the delay, telling people what blocks it.
    Blocked {
        /// The outcome recorded in the eviction metrics.
        outcome: EvictionOutcome,
        /// What refused the request; a PDB's name is not known yet here (it is looked
        /// up by the caller), so `Pdb` and `MultiplePdbs` come back empty.
        blocker: Blocker,
        /// The answer's `Retry-After` header, in whole seconds, if it had one.
        retry_after: Option<Duration>,
        /// The API server's message (the Status `message`, else the raw body).
        message: String,
    },
}

/// The `policy/v1` Eviction request for one pod: POST
/// `/api/v1/namespaces/{ns}/pods/{name}/eviction` with a complete Eviction body (apiVersion,
/// kind, metadata, `deleteOptions` with the UID precondition, grace period and dry run).
pub fn eviction_request(
    key: &PodKey,
    uid: &str,
    grace_period: Option<i64>,
    dry_run: bool,
) -> Result<Request<Vec<u8>>, http::Error> {
    let mut delete_options = json!({ "preconditions": { "uid": uid } });
    if let Some(grace) = grace_period {
        delete_options["gracePeriodSeconds"] = json!(grace);
    }
    if dry_run {
        delete_options["dryRun"] = json!(["All"]);
    }
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": { "name": key.name, "namespace": key.namespace },
        "deleteOptions": delete_options,
    });
    Request::builder()
        .method(Method::POST)
        .uri(format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            key.namespace, key.name
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
}

/// The DELETE request of `--disable-eviction`, with the same UID precondition.
pub fn delete_request(
    key: &PodKey,
    uid: &str,
    grace_period: Option<i64>,
) -> Result<Request<Vec<u8>>, http::Error> {
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": { "uid": uid },
    });
    if let Some(grace) = grace_period {
        body["gracePeriodSeconds"] = json!(grace);
    }
    Request::builder()
        .method(Method::DELETE)
        .uri(format!(
            "/api/v1/namespaces/{}/pods/{}",
            key.namespace, key.name
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
}

/// The name of the webhook in an API server denial message
/// (`admission webhook "name" denied the request: ...`).
fn webhook_name(message: &str) -> Option<&str> {
    let rest = message.split("admission webhook \"").nth(1)?;
    rest.split('"').next()
}

/// Classifies an answer to an eviction or delete request (docs/design.md §4: 201 evicted,
/// 404 gone, 409 precondition failed, 429 PDB, 500 several PDBs).
pub fn classify_answer(status: StatusCode, retry_after: Option<Duration>, body: &[u8]) -> Answer {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let blocked = |outcome, blocker| Answer::Blocked {
        outcome,
        blocker,
        retry_after,
        message: message.clone(),
    };
    match status {
        StatusCode::CREATED => Answer::Done(EvictionOutcome::Evicted),
        StatusCode::OK | StatusCode::ACCEPTED => Answer::Done(EvictionOutcome::Deleted),
        StatusCode::NOT_FOUND => Answer::Done(EvictionOutcome::Gone),
        StatusCode::CONFLICT => Answer::Done(EvictionOutcome::Conflict),
        StatusCode::TOO_MANY_REQUESTS if has_cause(body, DEREGISTERING_CAUSE) => {
            blocked(EvictionOutcome::Deregistering, Blocker::Deregistering)
        }
        _ if webhook_name(&message).is_some() => {
            let name = webhook_name(&message).unwrap_or_default().to_string();
            blocked(EvictionOutcome::DeniedWebhook, Blocker::Webhook(name))
        }
        StatusCode::TOO_MANY_REQUESTS if is_disruption_budget(body, &message) => {
            blocked(EvictionOutcome::BlockedPdb, Blocker::Pdb(String::new()))
        }
        StatusCode::TOO_MANY_REQUESTS => blocked(EvictionOutcome::Throttled, Blocker::Throttled),
        StatusCode::INTERNAL_SERVER_ERROR if message.contains("more than one") => blocked(
            EvictionOutcome::MultiplePdbs,
            Blocker::MultiplePdbs(Vec::new()),
        ),
        _ => blocked(
            EvictionOutcome::Error,
            Blocker::Other(format!("HTTP {}: {message}", status.as_u16())),
        ),
    }
}

/// Whether a 429 comes from a PodDisruptionBudget: the eviction REST code answers with a
/// `DisruptionBudget` cause (upstream `pkg/registry/core/pod/storage/eviction.go`,
/// `createTooManyRequestsError`), while API Priority and Fairness answers a bare
/// TooManyRequests ("Too many requests, please try again later.").
fn is_disruption_budget(body: &[u8], message: &str) -> bool {
    has_cause(body, "DisruptionBudget")
        || message.to_ascii_lowercase().contains("disruption budget")
}

/// Whether a Status body lists a cause with `reason`.
fn has_cause(body: &[u8], reason: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.pointer("/details/causes").cloned())
        .as_ref()
        .and_then(|c| c.as_array())
        .is_some_and(|c| c.iter().any(|c| c["reason"] == reason))
}

/// The backoff of one pod's refused evictions: from `RETRY_BASE` doubling up to
/// `RETRY_CAP`, jittered so pods blocked by the same PDB do not retry in lockstep.
pub fn eviction_backoff() -> Backoff {
    Backoff::jittered(RETRY_BASE, RETRY_CAP)
}

/// Delay before the next retry: the backoff's `pause`, but never shorter than the
/// `Retry-After` the API server sent (itself capped at `RETRY_AFTER_CAP`).
pub fn retry_delay(pause: Duration, retry_after: Option<Duration>) -> Duration {
    pause.max(retry_after.unwrap_or_default().min(RETRY_AFTER_CAP))
}

fn parse_retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Sends one eviction (or delete) request and classifies the answer. Transport failures
/// and timeouts come back as [`Answer::Blocked`] so they are retried like refusals.
pub async fn send(client: &kube::Client, request: Request<Vec<u8>>) -> Answer {
    let transport = |message: String| Answer::Blocked {
        outcome: EvictionOutcome::Error,
        blocker: Blocker::Other(message.clone()),
        retry_after: None,
        message,
    };
    let exchange = async {
        let response = client.send(request.map(kube::client::Body::from)).await?;
        let status = response.status();
        let retry_after = parse_retry_after(response.headers());
        let body = response.into_body().collect_bytes().await?;
        Ok::<_, kube::Error>(classify_answer(status, retry_after, &body))
    };
    match tokio::time::timeout(API_TIMEOUT, exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => transport(error.to_string()),
        Err(_) => transport(format!("no answer within {API_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{key, mock};
    use super::*;
    use http::Response;
    use kube::client::Body;
    use serde_json::Value;

    async fn body_json(request: Request<Body>) -> (http::request::Parts, Value) {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        (parts, serde_json::from_slice(&bytes).unwrap())
    }

    fn status_body(code: u16, message: &str) -> Body {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": message, "code": code});
        Body::from(status.to_string().into_bytes())
    }

    #[tokio::test]
    async fn eviction_is_a_complete_policy_v1_body_with_uid_precondition() {
        let (client, mut handle) = mock();
        let request = eviction_request(&key(), "uid-123", Some(30), true).unwrap();
        let call = tokio::spawn(async move { send(&client, request).await });
        let (request, respond) = handle.next_request().await.unwrap();
        let (parts, body) = body_json(request).await;
        assert_eq!(parts.method, Method::POST);
        assert_eq!(
            parts.uri.path(),
            "/api/v1/namespaces/shop/pods/web-1/eviction"
        );
        assert_eq!(
            body,
            json!({
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "web-1", "namespace": "shop"},
                "deleteOptions": {
                    "gracePeriodSeconds": 30,
                    "preconditions": {"uid": "uid-123"},
                    "dryRun": ["All"],
                },
            })
        );
        let response = Response::builder()
            .status(429)
            .header("Retry-After", "10")
            .body(status_body(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ))
            .unwrap();
        respond.send_response(response);
        let answer = call.await.unwrap();
        assert_eq!(
            answer,
            Answer::Blocked {
                outcome: EvictionOutcome::BlockedPdb,
                blocker: Blocker::Pdb(String::new()),
                retry_after: Some(Duration::from_secs(10)),
                message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            }
        );
    }

    #[test]
    fn eviction_without_grace_period_or_dry_run_omits_them() {
        let request = eviction_request(&key(), "u", None, false).unwrap();
        let body: Value = serde_json::from_slice(request.body()).unwrap();
        assert_eq!(
            body["deleteOptions"],
            json!({"preconditions": {"uid": "u"}})
        );
    }

    #[tokio::test]
    async fn disable_eviction_deletes_with_the_uid_precondition() {
        let (client, mut handle) = mock();
        let request = delete_request(&key(), "uid-9", Some(0)).unwrap();
        let call = tokio::spawn(async move { send(&client, request).await });
        let (request, respond) = handle.next_request().await.unwrap();
        let (parts, body) = body_json(request).await;
        assert_eq!(parts.method, Method::DELETE);
        assert_eq!(parts.uri.path(), "/api/v1/namespaces/shop/pods/web-1");
        assert_eq!(body["preconditions"], json!({"uid": "uid-9"}));
        assert_eq!(body["gracePeriodSeconds"], 0);
        assert_eq!(body["kind"], "DeleteOptions");
        respond.send_response(
            Response::builder()
                .status(200)
                .body(Body::from(b"{}".to_vec()))
                .unwrap(),
        );
        assert_eq!(call.await.unwrap(), Answer::Done(EvictionOutcome::Deleted));
    }

    #[test]
    fn answers_are_classified_like_the_eviction_rest_code() {
        let answer = |code: u16, message: &str| {
            let body = json!({"kind": "Status", "message": message}).to_string();
            classify_answer(StatusCode::from_u16(code).unwrap(), None, body.as_bytes())
        };
        assert_eq!(answer(201, ""), Answer::Done(EvictionOutcome::Evicted));
        assert_eq!(
            answer(404, "not found"),
            Answer::Done(EvictionOutcome::Gone)
        );
        assert_eq!(
            answer(409, "Precondition failed: UID"),
            Answer::Done(EvictionOutcome::Conflict)
        );
        let blocker = |a: Answer| match a {
            Answer::Blocked {
                outcome, blocker, ..
            } => (outcome, blocker),
            Answer::Done(o) => panic!("expected a block, got {o:?}"),
        };
        assert_eq!(
            blocker(answer(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            )),
            (EvictionOutcome::MultiplePdbs, Blocker::MultiplePdbs(vec![]))
        );
        assert_eq!(
            blocker(answer(
                400,
                "admission webhook \"deny.example.com\" denied the request: no"
            )),
            (
                EvictionOutcome::DeniedWebhook,
                Blocker::Webhook("deny.example.com".into())
            )
        );
        assert_eq!(
            blocker(answer(503, "etcd down")),
            (
                EvictionOutcome::Error,
                Blocker::Other("HTTP 503: etcd down".into())
            )
        );
        let plain = classify_answer(StatusCode::BAD_GATEWAY, None, b"upstream reset");
        assert_eq!(
            blocker(plain).1,
            Blocker::Other("HTTP 502: upstream reset".into())
        );
    }

    #[test]
    fn a_429_is_a_pdb_only_with_a_disruption_budget_cause() {
        let class = |body: Value| {
            let body = body.to_string();
            match classify_answer(StatusCode::TOO_MANY_REQUESTS, None, body.as_bytes()) {
                Answer::Blocked {
                    outcome, blocker, ..
                } => (outcome, blocker),
                Answer::Done(o) => panic!("expected a block, got {o:?}"),
            }
        };
        // What eviction.go answers for an exhausted budget.
        let pdb = json!({"kind": "Status", "code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget web needs 4 healthy pods and has 4 currently"}]}});
        assert_eq!(
            class(pdb),
            (EvictionOutcome::BlockedPdb, Blocker::Pdb(String::new()))
        );
        // What API Priority and Fairness answers when it sheds load.
        let apf = json!({"kind": "Status", "code": 429, "reason": "TooManyRequests",
            "message": "Too many requests, please try again later.",
            "details": {"retryAfterSeconds": 1}});
        assert_eq!(class(apf), (EvictionOutcome::Throttled, Blocker::Throttled));
        // What the API server relays of our webhook's answer while the pod deregisters.
        let ours = json!({"kind": "Status", "code": 429, "reason": "TooManyRequests",
            "message": "admission webhook \"evict.graceful-drain.io\" denied the request: graceful-drain: pod web/a is leaving its load balancers",
            "details": {"retryAfterSeconds": 7, "causes": [{"reason": DEREGISTERING_CAUSE}]}});
        assert_eq!(
            class(ours),
            (EvictionOutcome::Deregistering, Blocker::Deregistering)
        );
    }

    #[test]
    fn refused_evictions_back_off_capped_jittered_and_honour_retry_after() {
        let mut backoff = eviction_backoff();
        let pauses: Vec<_> = (0..10).map(|_| backoff.next_pause()).collect();
        assert!(
            (RETRY_BASE / 2..=RETRY_BASE).contains(&pauses[0]),
            "{pauses:?}"
        );
        assert!(pauses[3] >= Duration::from_secs(4), "{pauses:?}");
        assert!(
            pauses[9] >= RETRY_CAP / 2 && pauses.iter().all(|p| *p <= RETRY_CAP),
            "{pauses:?}"
        );
        let second = Duration::from_secs(1);
        assert_eq!(
            retry_delay(second, Some(Duration::from_secs(10))),
            Duration::from_secs(10)
        );
        assert_eq!(
            retry_delay(second, Some(Duration::from_secs(3600))),
            RETRY_AFTER_CAP
        );
        assert_eq!(retry_delay(RETRY_CAP, Some(Duration::ZERO)), RETRY_CAP);
    }
}
