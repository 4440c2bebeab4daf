use super::*;

fn routes(addresses: &[&str]) -> Routes {
    addresses
        .iter()
        .map(|a| balancer_routes::parse_address(a).unwrap())
        .collect()
}

fn known(ip: &str) -> Watched {
    Watched {
        address: Some(Some(ip.parse().unwrap())),
        ..Watched::default()
    }
}

/// A pod the balancer dropped between its previous answer and the first round that
/// judges the pod is released on that round: the previous answer shows it knew the pod.
/// Without that answer (or from an answer without the pod) it keeps the whole delay.
#[test]
fn a_pod_dropped_before_its_first_round_counts_as_known_from_the_previous_answer() {
    let with = routes(&["127.0.0.11:8080", "127.0.0.12:8080"]);
    let without = routes(&["127.0.0.12:8080"]);

    let mut pod = known("127.0.0.11");
    credit_earlier(&mut pod, Some(&with));
    assert_eq!(verdict(&mut pod, false, Some(&without)), Verdict::Release);

    let mut unseen = known("127.0.0.11");
    credit_earlier(&mut unseen, Some(&without));
    credit_earlier(&mut unseen, None);
    assert_eq!(verdict(&mut unseen, false, Some(&without)), Verdict::Wait);
    assert_eq!(ended_without_release(&unseen), "never_routed");

    // An address not read yet is credited nothing.
    let mut unread = Watched::default();
    credit_earlier(&mut unread, Some(&with));
    assert!(!unread.seen_routed);
}

/// A pod is released only once a balancer that routed to it no longer does and no slice
/// lists it; every other case keeps the whole delay.
#[test]
fn release_needs_a_balancer_that_knew_the_pod_and_let_go() {
    let with = routes(&["127.0.0.11:8080", "127.0.0.12:8080"]);
    let without = routes(&["127.0.0.12:8080"]);

    let mut pod = known("127.0.0.11");
    assert_eq!(verdict(&mut pod, true, Some(&with)), Verdict::Wait);
    assert!(pod.seen_routed);
    // Gone from the balancer while a slice still lists it: not yet.
    assert_eq!(verdict(&mut pod, true, Some(&without)), Verdict::Wait);
    // The balancer cannot be asked: wait.
    assert_eq!(verdict(&mut pod, false, None), Verdict::Wait);
    assert_eq!(ended_without_release(&pod), "unreachable");
    // Still routed to: wait.
    assert_eq!(verdict(&mut pod, false, Some(&with)), Verdict::Wait);
    assert_eq!(ended_without_release(&pod), "still_routes");
    assert_eq!(verdict(&mut pod, false, Some(&without)), Verdict::Release);

    // A balancer that never routed to the pod says nothing about it.
    let mut stranger = known("127.0.0.11");
    assert_eq!(verdict(&mut stranger, false, Some(&without)), Verdict::Wait);
    assert_eq!(ended_without_release(&stranger), "never_routed");

    // Without an address there is nothing to ask about.
    let mut unknown = Watched {
        address: Some(None),
        ..Watched::default()
    };
    assert_eq!(verdict(&mut unknown, false, Some(&without)), Verdict::Wait);
    assert_eq!(ended_without_release(&unknown), "address_unknown");
    let mut unread = Watched::default();
    assert_eq!(verdict(&mut unread, false, Some(&with)), Verdict::Wait);
    assert_eq!(ended_without_release(&unread), "address_unknown");
}

/// An address the balancer reports without a port still matches the pod.
#[test]
fn an_address_without_a_port_matches() {
    let mut pod = known("127.0.0.11");
    assert_eq!(
        verdict(&mut pod, false, Some(&routes(&["127.0.0.11"]))),
        Verdict::Wait
    );
    assert!(pod.seen_routed);
    assert_eq!(
        verdict(&mut pod, false, Some(&routes(&[]))),
        Verdict::Release
    );
}

/// The release is written on that incarnation only, under our annotation.
#[test]
fn the_release_patch_tests_the_uid() {
    let patch = serde_json::to_value(release_patch("uid-1", "2026-01-01T00:00:00Z")).unwrap();
    assert_eq!(
        patch,
        serde_json::json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
            {"op": "add", "path": "/metadata/annotations/graceful-drain.io~1released-at", "value": "2026-01-01T00:00:00Z"},
        ])
    );
}

/// Only the pod's own incarnation gives an address.
#[test]
fn a_replacement_gives_no_address() {
    let mut pod = Pod::default();
    pod.metadata.uid = Some("uid-1".into());
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        pod_ip: Some("127.0.0.11".into()),
        ..Default::default()
    });
    assert_eq!(
        pod_address(&pod, "uid-1"),
        Some("127.0.0.11".parse().unwrap())
    );
    assert_eq!(pod_address(&pod, "uid-2"), None);
}
