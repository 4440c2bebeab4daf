use super::*;
use crate::review::IntoFacts as _;
use graceful_drain_testing::fixtures::{self, PodFixture};
use serde_json::json;

fn slice(name: &str, pods: &[(&str, &str, bool)]) -> EndpointSlice {
    let endpoints: Vec<_> = pods
        .iter()
        .map(|(pod, uid, ready)| {
            json!({"addresses": ["10.0.0.1"], "conditions": {"ready": ready},
            "targetRef": {"kind": "Pod", "name": pod, "namespace": "web", "uid": uid}})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": "web", "labels": {SERVICE_NAME_LABEL: "web"}},
        "endpoints": endpoints
    }))
    .unwrap()
}

/// A pod's departure is the moment the last slice listing it dropped it: not while
/// another slice still lists it, forgotten when a slice lists it again.
#[test]
fn a_pod_leaving_its_last_slice_is_timed() {
    let cache = Cache::new([]);
    cache.apply_slice(&slice("web-a", &[("p1", "u1", true), ("p2", "u2", true)]));
    cache.apply_slice(&slice("web-b", &[("p1", "u1", false)]));
    assert_eq!(cache.left_slices_at("web", "p1"), None);
    let before = jiff::Timestamp::now();
    cache.apply_slice(&slice("web-a", &[("p2", "u2", true)]));
    assert_eq!(cache.left_slices_at("web", "p1"), None, "web-b lists it");
    cache.apply_slice(&slice("web-b", &[]));
    let left = cache.left_slices_at("web", "p1").expect("left every slice");
    assert!(left >= before);
    assert_eq!(cache.left_slices_at("web", "p2"), None, "still listed");
    assert_eq!(cache.left_slices_at("web", "p9"), None, "never listed");
    cache.apply_slice(&slice("web-b", &[("p1", "u1", true)]));
    assert_eq!(cache.left_slices_at("web", "p1"), None, "listed again");
}

#[test]
fn slice_index_follows_updates_and_deletes() {
    let cache = Cache::new(["kube-system".to_string()]);
    cache.apply_slice(&slice("web-a", &[("p1", "u1", true), ("p2", "u2", false)]));
    cache.apply_slice(&slice("web-b", &[("p1", "u1", true)]));
    assert!(cache.has_ready_endpoint("web", "p1"));
    assert!(
        !cache.has_ready_endpoint("web", "p2"),
        "listed but not ready"
    );
    assert_eq!(cache.endpoints_of("web", "p1", None).len(), 2);
    // The slice drops p1 (the pod left the Service): only web-b still lists it.
    cache.apply_slice(&slice("web-a", &[("p2", "u2", true)]));
    assert_eq!(cache.endpoints_of("web", "p1", None).len(), 1);
    assert!(cache.has_ready_endpoint("web", "p2"));
    cache.remove(Kind::Slices, &("web".into(), "web-b".into()));
    assert!(cache.endpoints_of("web", "p1", None).is_empty());
    assert_eq!(read(&cache.slices).len(), (1, 1), "no stale index entries");
    assert!(
        !cache.has_ready_endpoint("other", "p2"),
        "namespaced lookups"
    );
}

#[test]
fn an_endpoint_of_an_earlier_pod_of_the_same_name_is_marked() {
    let cache = Cache::new([]);
    cache.apply_slice(&slice(
        "web-a",
        &[("p1", "u-old", true), ("p2", "u2", true)],
    ));
    let seen = |uid| cache.endpoints_of("web", "p1", uid);
    assert!(
        seen(Some("u-new"))[0].earlier_pod,
        "listed under the old UID"
    );
    assert!(!seen(Some("u-old"))[0].earlier_pod);
    assert!(
        !seen(None)[0].earlier_pod,
        "without a UID nothing is told apart"
    );
    assert_eq!(seen(Some("u-new"))[0].service.as_deref(), Some("web"));
    let mut slots = (0..40).map(|i| format!("s{i}")).collect::<Vec<_>>();
    // Slots of removed slices are reused, and an update keeps one entry per slice.
    for name in &slots {
        cache.apply_slice(&slice(name, &[("p3", "u3", true)]));
    }
    for name in slots.drain(..39) {
        cache.remove(Kind::Slices, &("web".into(), name));
    }
    for i in 0..30 {
        cache.apply_slice(&slice(&format!("t{i}"), &[]));
    }
    cache.apply_slice(&slice("web-a", &[("p1", "u-old", false)]));
    assert_eq!(cache.endpoints_of("web", "p3", Some("u3")).len(), 1);
    assert!(!cache.has_ready_endpoint("web", "p1"));
    assert!(!cache.has_ready_endpoint("web", "p2"), "p2 left web-a");
    let table = read(&cache.slices);
    assert_eq!(table.len(), (32, 2));
    assert_eq!(table.slots.len(), 41, "slots of removed slices are reused");
}

#[test]
fn a_service_that_selects_a_pod_no_slice_lists_is_in_its_snapshot() {
    let cache = Cache::new([]);
    let service = |namespace: &str, name: &str, spec: serde_json::Value| {
        serde_json::from_value::<Service>(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}))
        .unwrap()
    };
    assert!(!cache.has_selecting_service("web"));
    cache.apply_service(&service(
        "web",
        "db",
        json!({"clusterIP": "None", "selector": {"app": "web"}}),
    ));
    cache.apply_service(&service("web", "bare", json!({})));
    cache.apply_service(&service(
        "other",
        "web",
        json!({"selector": {"app": "web"}}),
    ));
    assert!(
        !cache.has_selecting_service("web"),
        "a headless Service and one without a selector expose nothing"
    );
    cache.apply_service(&service("web", "web", json!({"selector": {"app": "web"}})));
    cache.apply_service(&service(
        "web",
        "front",
        json!({"selector": {"app": "web", "tier": "front"}}),
    ));
    assert!(cache.has_selecting_service("web"));
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(cache.service_selects("web", &labels(&[("app", "web")])));
    assert!(!cache.service_selects("web", &labels(&[("app", "db")])));
    assert!(!cache.service_selects("batch", &labels(&[("app", "web")])));
    let p1 = fixtures::pod("p1")
        .ns("web")
        .with_labels(&[("app", "web")])
        .facts();
    let snap = cache.snapshot(&p1);
    let names: Vec<(&str, bool)> = snap
        .services
        .iter()
        .map(|s| (s.name.as_str(), s.selects_pod))
        .collect();
    assert_eq!(
        names,
        [("db", true), ("web", true)],
        "same namespace, whole selector"
    );
}

#[test]
fn snapshot_collects_services_namespace_and_selecting_pdbs() {
    let cache = Cache::new(["kube-system".to_string()]);
    cache.apply_slice(&slice("web-a", &[("p1", "u1", true)]));
    cache.apply_service(
        &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "web"},
        "spec": {"type": "NodePort", "selector": {"app": "web"}}}))
        .unwrap(),
    );
    for (name, selector) in [
        ("match", json!({"matchLabels": {"app": "web"}})),
        (
            "expr",
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]}),
        ),
        ("other", json!({"matchLabels": {"app": "db"}})),
    ] {
        cache.apply_pdb(&serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "web", "generation": 1},
            "spec": {"selector": selector},
            "status": {"observedGeneration": 1, "disruptionsAllowed": 1, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}})).unwrap());
    }
    cache.apply_namespace(
        &serde_json::from_value(json!({"name": "web",
        "annotations": {DELAY_ANNOTATION: "90s"}}))
        .unwrap(),
    );
    let p1 = fixtures::pod("p1")
        .ns("web")
        .with_labels(&[("app", "web"), ("tier", "front")])
        .facts();
    let snap = cache.snapshot(&p1);
    assert_eq!(snap.services.len(), 1);
    assert_eq!(snap.services[0].service_type, ServiceType::NodePort);
    assert!(snap.services[0].selects_pod);
    let mut pdbs: Vec<&str> = snap.pdbs.iter().map(|p| p.name.as_str()).collect();
    pdbs.sort();
    assert_eq!(pdbs, ["expr", "match"]);
    assert_eq!(snap.namespace.delay.as_deref(), Some("90s"));
    assert!(!snap.namespace.opted_out);
    assert!(cache.namespace("kube-system").opted_out, "excluded by flag");
    cache.apply_namespace(
        &serde_json::from_value(json!({"name": "web", "labels": {OPT_OUT_LABEL: "true"}})).unwrap(),
    );
    assert!(cache.namespace("web").opted_out, "opted out by label");
}
