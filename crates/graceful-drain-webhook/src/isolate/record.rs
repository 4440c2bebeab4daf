//! The Events isolation records on pods (their reasons are
//! [`graceful_drain_core::labels::webhook_reason`]).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::Value;

use super::context::{Context, EventSink};
use super::error::pod_ref;
use super::owners::controller_ref;
use crate::decide::PodFacts;
use graceful_drain_core::labels::WEBHOOK_REPORTING_COMPONENT;

/// The `type` of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// `Normal`: the webhook did what it was meant to (isolated, deleted, restored).
    Normal,
    /// `Warning`: something the user should look at (a capped delay, a pod let through
    /// unprotected).
    Warning,
}

/// Records a core/v1 Event on `pod`; failures are logged, never fatal. With a queued sink
/// the Event is sent in the background and this returns at once.
pub async fn record_event(
    ctx: &Context,
    pod: &PodFacts,
    severity: Severity,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", pod.name)),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_string()),
        message: Some(graceful_drain_core::event::message(message.to_string())),
        type_: Some(
            match severity {
                Severity::Normal => "Normal",
                Severity::Warning => "Warning",
            }
            .into(),
        ),
        source: Some(EventSource {
            component: Some("graceful-drain-webhook".into()),
            host: None,
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some(WEBHOOK_REPORTING_COMPONENT.into()),
        reporting_instance: Some(ctx.identity.clone()),
        ..Event::default()
    };
    match &ctx.events {
        EventSink::Inline => crate::events::create(&ctx.client, event).await,
        EventSink::Queue(queue) => {
            let queued = crate::events::Queued {
                event,
                controller: controller_reference(pod),
            };
            match queue.try_send(queued) {
                Ok(()) => {}
                // The sender has stopped (shutdown: the uninstall work's Events come after
                // it): sent from here instead.
                Err(tokio::sync::mpsc::error::TrySendError::Closed(queued)) => {
                    crate::events::create(&ctx.client, queued.event).await;
                }
                Err(error) => {
                    tracing::warn!(pod = %pod_ref(pod), reason, %error, "event queue full; event dropped");
                }
            }
        }
    }
}

/// The controller reference of `pod` as an Event's involvedObject would name it.
fn controller_reference(pod: &PodFacts) -> Option<ObjectReference> {
    let controller = controller_ref(pod)?;
    let field = |name: &str| {
        controller
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some(ObjectReference {
        api_version: field("apiVersion"),
        kind: field("kind"),
        name: field("name"),
        namespace: Some(pod.namespace.clone()),
        uid: field("uid"),
        ..ObjectReference::default()
    })
}
