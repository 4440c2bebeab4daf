use super::*;
use serde_json::json;

fn event(status: serde_json::Value, deleting: bool) -> LifecycleEvent {
    let mut event: LifecycleEvent = serde_json::from_value(json!({
        "apiVersion": "lifecycle.graceful-drain.io/v1alpha1", "kind": "LifecycleEvent",
        "metadata": {"name": "drain-n1"},
        "spec": {"transitionName": "graceful-drain", "bindingNode": "n1"},
        "status": status,
    }))
    .unwrap();
    if deleting {
        event.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
    }
    event
}

#[test]
fn a_drain_lives_only_as_long_as_its_event() {
    let now: jiff::Timestamp = "2026-06-01T12:00:00Z".parse().unwrap();
    let claimed = json!({"claimStatus": "Claimed", "sla": "2026-06-01T12:05:00Z"});
    assert_eq!(
        event_view_liveness(&event(claimed.clone(), false), now),
        Liveness::Live
    );
    assert_eq!(
        event_view_liveness(&event(json!({"claimStatus": "Pending"}), false), now),
        Liveness::Live
    );
    let ended = |status, deleting| {
        matches!(
            event_view_liveness(&event(status, deleting), now),
            Liveness::Ended(_)
        )
    };
    assert!(ended(claimed.clone(), true), "being deleted");
    for terminal in ["Failed", "SlaExpired", "Succeeded"] {
        assert!(ended(json!({"claimStatus": terminal}), false), "{terminal}");
    }
    let late = "2026-06-01T12:06:00Z".parse().unwrap();
    assert!(
        matches!(event_view_liveness(&event(claimed, false), late), Liveness::Ended(why) if why.contains("SLA")),
        "a claimed event past its SLA deadline (a kubelet that stopped asking)"
    );
}
