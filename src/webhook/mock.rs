//! A scripted mock API server for unit tests: each step asserts the method and path of
//! the next request the code under test sends, hands its JSON body to the test, and
//! answers with a status and JSON body.

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::Value;

pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A client whose requests go to the returned handle.
pub fn client() -> (kube::Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), handle)
}

/// One request seen by the mock.
#[derive(Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub content_type: String,
    pub body: Value,
}

/// Awaits the next request, asserts `method` and `path` (without the query), and answers.
pub async fn expect(
    handle: &mut Handle,
    method: Method,
    path: &str,
    status: u16,
    reply: Value,
) -> Seen {
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request arrived; expected {method} {path}"));
    let (request, send) = next.expect("mock service dropped");
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let seen = Seen {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        content_type: parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    };
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (&method, path),
        "unexpected request {seen:?}"
    );
    let response = Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&reply).unwrap()))
        .unwrap();
    send.send_response(response);
    seen
}

/// A Kubernetes `Status` failure body.
pub fn status(code: u16, reason: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": reason, "reason": reason, "code": code
    })
}
