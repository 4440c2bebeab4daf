//! The background Event sender: Events about pods of one controller, queued within the
//! same short window, become one Event on that controller.
//!
//! A drain isolates and later deletes every pod of a node within seconds; one Event per
//! pod and step doubled the webhook's API requests per drained pod (the patch, the PDB
//! status and the delete are the rest). While Events keep coming (less than [`WINDOW`]
//! after the last were sent), those queued within a window are grouped by namespace,
//! reason, type and the pods' controller; a group of one
//! is sent as it is (on the pod, as `kubectl describe pod` shows it), a larger group as
//! one Event on the controller naming its pods (`kubectl describe rs`, or
//! `kubectl get events --field-selector reason=Isolated`). An Event of a pod without a
//! controller is always its own.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::Api;
use kube::api::PostParams;

use graceful_drain_core::runtime::Shutdown;

/// How long the sender waits for more Events after the first of a batch.
pub const WINDOW: Duration = Duration::from_secs(2);
/// Most Events gathered into one batch.
const BATCH_MAX: usize = 2048;
/// Pod names listed in a grouped Event's message; the rest are counted.
const NAMES_LISTED: usize = 20;

/// An Event waiting for the sender, with the controller of its pod (if any).
#[derive(Clone, Debug)]
pub struct Queued {
    /// The Event as it would be sent alone, on its pod.
    pub event: Event,
    /// The pod's controller; Events of one controller queued together become one Event
    /// on it. `None` for a pod without a controller, whose Event is always sent alone.
    pub controller: Option<ObjectReference>,
}

/// Creates `event`; a failure is logged, never fatal.
pub async fn create(client: &kube::Client, event: Event) {
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let api = Api::<Event>::namespaced(client.clone(), &namespace);
    if let Err(error) = api.create(&PostParams::default(), &event).await {
        let object = event.involved_object.name.unwrap_or_default();
        tracing::warn!(object = %format!("{namespace}/{object}"), reason = ?event.reason, error = %graceful_drain_core::error::chain(&error), "record event");
    }
}

/// Sends queued Events in batches (see the module) until shutdown; a batch being
/// gathered at shutdown is still sent. An Event after a quiet [`WINDOW`] goes out at
/// once with whatever is queued behind it (a lone rollout's Event is not delayed); one
/// that follows others within the window waits out the window for more.
pub async fn send(
    client: kube::Client,
    mut queue: tokio::sync::mpsc::Receiver<Queued>,
    shutdown: Shutdown,
) -> Result<(), std::convert::Infallible> {
    let mut last_sent: Option<tokio::time::Instant> = None;
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            queued = queue.recv() => match queued {
                Some(queued) => queued,
                None => return Ok(()),
            },
        };
        let mut batch = vec![first];
        let mut open = true;
        if last_sent.is_some_and(|at| at.elapsed() < WINDOW) {
            let window = tokio::time::sleep(WINDOW);
            let mut window = std::pin::pin!(window);
            while open && batch.len() < BATCH_MAX {
                tokio::select! {
                    () = &mut window => break,
                    () = shutdown.cancelled() => open = false,
                    queued = queue.recv() => match queued {
                        Some(queued) => batch.push(queued),
                        None => open = false,
                    },
                }
            }
        }
        while batch.len() < BATCH_MAX {
            match queue.try_recv() {
                Ok(queued) => batch.push(queued),
                Err(_) => break,
            }
        }
        for event in coalesce(batch) {
            create(&client, event).await;
        }
        last_sent = Some(tokio::time::Instant::now());
        if !open {
            return Ok(());
        }
    }
}

/// What Events are grouped by: namespace, reason, type and the controller's UID (or
/// kind and name when it has none).
type GroupKey = (String, String, String, String);

fn group_key(queued: &Queued) -> Option<GroupKey> {
    let controller = queued.controller.as_ref()?;
    let event = &queued.event;
    let id = controller.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            controller.kind.as_deref().unwrap_or_default(),
            controller.name.as_deref().unwrap_or_default()
        )
    });
    Some((
        event.metadata.namespace.clone().unwrap_or_default(),
        event.reason.clone().unwrap_or_default(),
        event.type_.clone().unwrap_or_default(),
        id,
    ))
}

/// The Events to create for `batch`, in the order of each group's first Event.
pub fn coalesce(batch: Vec<Queued>) -> Vec<Event> {
    let mut groups: Vec<(Option<GroupKey>, Vec<Queued>)> = Vec::new();
    for queued in batch {
        let key = group_key(&queued);
        match groups.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
            Some((_, members)) => members.push(queued),
            None => groups.push((key, vec![queued])),
        }
    }
    groups
        .into_iter()
        .map(|(_, members)| merge(members))
        .collect()
}

/// One Event for a group: the Event itself when alone, else one on the controller.
fn merge(mut members: Vec<Queued>) -> Event {
    let count = members.len();
    if count == 1 {
        return members.remove(0).event;
    }
    let mut names: Vec<String> = members
        .iter()
        .filter_map(|m| m.event.involved_object.name.clone())
        .collect();
    let last_timestamp = members
        .iter()
        .filter_map(|m| m.event.last_timestamp.clone())
        .max_by_key(|t| t.0);
    let first = members.remove(0);
    let more = names.len().saturating_sub(NAMES_LISTED);
    names.truncate(NAMES_LISTED);
    let mut listed = names.join(", ");
    if more > 0 {
        listed.push_str(&format!(" and {more} more"));
    }
    let controller = first.controller.unwrap_or_default();
    let kind = controller
        .kind
        .clone()
        .unwrap_or_else(|| "controller".into());
    let owner = controller.name.clone().unwrap_or_default();
    let message = format!(
        "{count} pods of {kind} {owner} ({listed}); the first: {}",
        first.event.message.as_deref().unwrap_or_default()
    );
    let mut event = first.event;
    event.metadata.generate_name = Some(format!("{owner}."));
    event.involved_object = ObjectReference {
        namespace: event.involved_object.namespace.clone(),
        ..controller
    };
    event.message = Some(graceful_drain_core::event::message(message));
    event.last_timestamp = last_timestamp;
    event.count = Some(i32::try_from(count).unwrap_or(i32::MAX));
    event
}

/// Whether `event` is about `pod`: on the pod itself, or a grouped Event on its
/// controller that lists it (a group's pods beyond the first twenty are only counted).
pub fn names_pod(event: &Event, pod: &str) -> bool {
    let object = &event.involved_object;
    if object.kind.as_deref() == Some("Pod") {
        return object.name.as_deref() == Some(pod);
    }
    let message = event.message.as_deref().unwrap_or_default();
    let listed = message
        .split_once(" (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map_or("", |(names, _)| names);
    listed
        .split(", ")
        .map(|name| name.split_once(" and ").map_or(name, |(n, _)| n))
        .any(|name| name == pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn queued(pod: &str, reason: &str, owner: Option<&str>, at: i64) -> Queued {
        Queued {
            event: Event {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{pod}.")),
                    namespace: Some("web".into()),
                    ..ObjectMeta::default()
                },
                involved_object: ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some(pod.into()),
                    namespace: Some("web".into()),
                    ..ObjectReference::default()
                },
                reason: Some(reason.into()),
                type_: Some("Normal".into()),
                message: Some(format!("{reason} {pod}")),
                last_timestamp: Some(Time(jiff::Timestamp::from_second(at).unwrap())),
                count: Some(1),
                ..Event::default()
            },
            controller: owner.map(|name| ObjectReference {
                api_version: Some("apps/v1".into()),
                kind: Some("ReplicaSet".into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectReference::default()
            }),
        }
    }

    #[test]
    fn events_of_one_controller_become_one_and_the_rest_stay_as_they_are() {
        let batch = vec![
            queued("a-1", "Isolated", Some("a"), 10),
            queued("b-1", "Isolated", Some("b"), 11),
            queued("a-2", "Isolated", Some("a"), 12),
            queued("a-3", "Deleted", Some("a"), 13),
            queued("solo", "Isolated", None, 14),
            queued("solo-2", "Isolated", None, 15),
            queued("a-4", "Isolated", Some("a"), 16),
        ];
        let events = coalesce(batch);
        let summary: Vec<(String, String, i32)> = events
            .iter()
            .map(|e| {
                (
                    e.involved_object.name.clone().unwrap(),
                    e.reason.clone().unwrap(),
                    e.count.unwrap(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("a".to_string(), "Isolated".to_string(), 3),
                ("b-1".into(), "Isolated".into(), 1),
                ("a-3".into(), "Deleted".into(), 1),
                ("solo".into(), "Isolated".into(), 1),
                ("solo-2".into(), "Isolated".into(), 1),
            ]
        );
        let grouped = &events[0];
        assert_eq!(grouped.involved_object.kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(grouped.involved_object.uid.as_deref(), Some("uid-a"));
        assert_eq!(grouped.involved_object.namespace.as_deref(), Some("web"));
        assert_eq!(grouped.metadata.generate_name.as_deref(), Some("a."));
        assert_eq!(
            grouped.message.as_deref(),
            Some("3 pods of ReplicaSet a (a-1, a-2, a-4); the first: Isolated a-1")
        );
        assert_eq!(
            grouped.last_timestamp.as_ref().map(|t| t.0.as_second()),
            Some(16),
            "the latest of the group"
        );
        assert_eq!(
            events[1].message.as_deref(),
            Some("Isolated b-1"),
            "alone: unchanged"
        );
    }

    #[test]
    fn a_large_group_counts_the_pods_it_does_not_name_and_stays_within_1_kib() {
        let long = "p".repeat(60);
        let batch: Vec<Queued> = (0..100)
            .map(|i| queued(&format!("{long}-{i}"), "Deleted", Some("a"), i))
            .collect();
        let events = coalesce(batch);
        assert_eq!(events.len(), 1);
        let message = events[0].message.clone().unwrap();
        assert!(
            message.starts_with("100 pods of ReplicaSet a ("),
            "{message}"
        );
        assert!(
            message.len() <= graceful_drain_core::event::MESSAGE_MAX,
            "{}",
            message.len()
        );
        assert!(message.ends_with('…'), "cut: {message}");
        let short = coalesce(
            (0..25)
                .map(|i| queued(&format!("w-{i}"), "Deleted", Some("a"), i))
                .collect(),
        );
        let message = short[0].message.clone().unwrap();
        assert!(message.contains("w-19 and 5 more)"), "{message}");
        assert!(names_pod(&short[0], "w-19") && !names_pod(&short[0], "w-20"));
    }
}
