use super::*;
use graceful_drain_testing::fixtures::{self, PodFixture};
use serde_json::{Value, json};

fn now() -> jiff::Timestamp {
    "2026-01-01T12:00:00Z".parse().unwrap()
}

/// A running pod `default/<name>`.
fn pod(name: &str) -> Pod {
    fixtures::pod(name).running()
}

fn ago(secs: i64) -> jiff::Timestamp {
    now() - jiff::SignedDuration::from_secs(secs)
}

fn opts(ignore_ds: bool, emptydir: bool, force: bool) -> FilterOptions {
    FilterOptions {
        ignore_daemonsets: ignore_ds,
        delete_emptydir_data: emptydir,
        force,
        skip_wait_for_delete_timeout: None,
    }
}

#[test]
fn verdicts_follow_kubectl_filter_order() {
    use Verdict::*;
    let strict = opts(false, false, false);
    let lax = opts(true, true, true);
    let cases: Vec<(&str, Pod, FilterOptions, DaemonSetLookup, Verdict)> = vec![
        (
            "replicated pod",
            pod("a").owned_by("ReplicaSet", "owner"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Evict(None),
        ),
        (
            "DaemonSet pod refused",
            pod("a").owned_by("DaemonSet", "owner"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Refuse(Refusal::DaemonSet),
        ),
        (
            "DaemonSet pod skipped",
            pod("a").owned_by("DaemonSet", "owner"),
            lax.clone(),
            DaemonSetLookup::Exists,
            Skip(super::Skip::DaemonSet),
        ),
        (
            "orphaned DaemonSet pod with force",
            pod("a").owned_by("DaemonSet", "owner"),
            lax.clone(),
            DaemonSetLookup::NotFound,
            Evict(Some(Warning::OrphanedDaemonSetPod)),
        ),
        (
            "orphaned DaemonSet pod without force",
            pod("a").owned_by("DaemonSet", "owner"),
            strict.clone(),
            DaemonSetLookup::NotFound,
            Refuse(Refusal::DaemonSetLookup(
                "daemonsets.apps \"owner\" not found".into(),
            )),
        ),
        (
            "DaemonSet lookup failure",
            pod("a").owned_by("DaemonSet", "owner"),
            lax.clone(),
            DaemonSetLookup::Failed("boom".into()),
            Refuse(Refusal::DaemonSetLookup("boom".into())),
        ),
        (
            "finished DaemonSet pod passes",
            pod("a").owned_by("DaemonSet", "owner").phase("Succeeded"),
            strict.clone(),
            DaemonSetLookup::Failed("not asked".into()),
            Evict(None),
        ),
        (
            "DaemonSet filter before mirror",
            pod("a")
                .owned_by("DaemonSet", "owner")
                .annotate(MIRROR_POD_ANNOTATION, "hash"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Refuse(Refusal::DaemonSet),
        ),
        (
            "mirror pod skipped",
            pod("a").annotate(MIRROR_POD_ANNOTATION, "hash"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Skip(super::Skip::Mirror),
        ),
        (
            "mirror before emptyDir",
            pod("a").annotate(MIRROR_POD_ANNOTATION, "hash").empty_dir(),
            strict.clone(),
            DaemonSetLookup::Exists,
            Skip(super::Skip::Mirror),
        ),
        (
            "finished mirror pod still skipped",
            pod("a")
                .annotate(MIRROR_POD_ANNOTATION, "hash")
                .phase("Failed"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Skip(super::Skip::Mirror),
        ),
        (
            "emptyDir refused",
            pod("a").owned_by("ReplicaSet", "owner").empty_dir(),
            strict.clone(),
            DaemonSetLookup::Exists,
            Refuse(Refusal::LocalStorage),
        ),
        (
            "emptyDir allowed",
            pod("a").owned_by("ReplicaSet", "owner").empty_dir(),
            lax.clone(),
            DaemonSetLookup::Exists,
            Evict(Some(Warning::LocalStorage)),
        ),
        (
            "emptyDir before unreplicated",
            pod("a").empty_dir(),
            strict.clone(),
            DaemonSetLookup::Exists,
            Refuse(Refusal::LocalStorage),
        ),
        (
            "finished emptyDir pod passes",
            pod("a")
                .owned_by("Job", "owner")
                .empty_dir()
                .phase("Failed"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Evict(None),
        ),
        (
            "bare pod refused",
            pod("a"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Refuse(Refusal::Unreplicated),
        ),
        (
            "bare pod forced",
            pod("a"),
            lax.clone(),
            DaemonSetLookup::Exists,
            Evict(Some(Warning::Unreplicated)),
        ),
        (
            "finished bare pod passes",
            pod("a").phase("Succeeded"),
            strict.clone(),
            DaemonSetLookup::Exists,
            Evict(None),
        ),
        (
            "terminating pod still evicted without skip timeout",
            pod("a")
                .owned_by("ReplicaSet", "owner")
                .deleting(ago(3600), None),
            strict.clone(),
            DaemonSetLookup::Exists,
            Evict(None),
        ),
    ];
    for (name, pod, opts, lookup, want) in cases {
        let got = classify(&pod, &opts, now(), |_| lookup.clone());
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn skip_wait_for_delete_timeout_skips_only_long_terminating_pods() {
    let mut o = opts(false, false, false);
    o.skip_wait_for_delete_timeout = Some(Duration::from_secs(60));
    let old = pod("old").deleting(ago(61), None);
    let recent = pod("recent")
        .owned_by("ReplicaSet", "owner")
        .deleting(ago(30), None);
    let bare_recent = pod("bare").deleting(ago(30), None);
    let lookup = |_: &OwnerReference| DaemonSetLookup::Exists;
    // The skip filter runs first: an old terminating bare pod does not refuse the drain.
    assert_eq!(
        classify(&old, &o, now(), lookup),
        Verdict::Skip(Skip::LongTerminating)
    );
    assert_eq!(classify(&recent, &o, now(), lookup), Verdict::Evict(None));
    assert_eq!(
        classify(&bare_recent, &o, now(), lookup),
        Verdict::Refuse(Refusal::Unreplicated)
    );
    o.skip_wait_for_delete_timeout = Some(Duration::ZERO);
    assert_eq!(
        classify(&old, &o, now(), lookup),
        Verdict::Refuse(Refusal::Unreplicated),
        "a zero timeout disables the filter, like kubectl"
    );
}

#[test]
fn plan_lists_every_refusal_before_evicting_anything() {
    let pods = vec![
        pod("web").owned_by("ReplicaSet", "owner"),
        pod("bare-1"),
        pod("cache").owned_by("ReplicaSet", "owner").empty_dir(),
        pod("bare-2"),
        pod("agent").owned_by("DaemonSet", "owner"),
    ];
    let refused = plan(&pods, &FilterOptions::default(), now(), |_, _| {
        DaemonSetLookup::Exists
    })
    .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "cannot delete Pods with local storage (use --delete-emptydir-data to override): \
         default/cache; cannot delete Pods that declare no controller (use --force to \
         override): default/bare-1, default/bare-2"
    );
}

#[test]
fn a_pod_our_webhook_isolated_is_awaited_not_refused_as_bare() {
    // The ReplicaSet controller released it (no controller any more) and its labels
    // left the selector; only the draining label says it is being evicted.
    let mut isolated = pod("web-1");
    isolated.metadata.labels = Some([(DRAINING_LABEL.to_string(), "web".to_string())].into());
    let strict = opts(true, false, false);
    assert_eq!(
        classify(&isolated, &strict, now(), |_| DaemonSetLookup::Exists),
        Verdict::Await
    );
    let got = plan(
        [&isolated, &pod("bare")],
        &opts(true, false, true),
        now(),
        |_, _| DaemonSetLookup::Exists,
    )
    .unwrap();
    assert_eq!(got.awaited.len(), 1);
    assert_eq!(PodKey::of(&got.evict[0]).name, "bare");
    // Without --force only the bare pod refuses the drain.
    let refused = plan([&isolated, &pod("bare")], &strict, now(), |_, _| {
        DaemonSetLookup::Exists
    })
    .unwrap_err();
    assert_eq!(
        refused.0.get(&Refusal::Unreplicated).map(Vec::len),
        Some(1),
        "{refused}"
    );
    // A finished isolated pod is just a finished pod.
    let done = isolated.clone().phase("Succeeded");
    assert_eq!(
        classify(&done, &strict, now(), |_| DaemonSetLookup::Exists),
        Verdict::Evict(None)
    );
}

#[test]
fn plan_evicts_skips_and_warns() {
    let pods = vec![
        pod("web").owned_by("ReplicaSet", "owner"),
        pod("agent").owned_by("DaemonSet", "owner"),
        pod("static").annotate(MIRROR_POD_ANNOTATION, "hash"),
        pod("cache").owned_by("ReplicaSet", "owner").empty_dir(),
        pod("bare"),
    ];
    let mut asked = Vec::new();
    let got = plan(&pods, &opts(true, true, true), now(), |ns, owner| {
        asked.push(format!("{ns}/{}", owner.name));
        DaemonSetLookup::Exists
    })
    .unwrap();
    let evicted: Vec<_> = got
        .evict
        .iter()
        .map(|p| PodKey::of(p).to_string())
        .collect();
    assert_eq!(evicted, ["default/web", "default/cache", "default/bare"]);
    let skipped: Vec<_> = got
        .skipped
        .iter()
        .map(|(k, s)| (k.name.as_str(), *s))
        .collect();
    assert_eq!(
        skipped,
        [("agent", Skip::DaemonSet), ("static", Skip::Mirror)]
    );
    assert_eq!(got.warnings.len(), 2);
    assert_eq!(
        asked,
        ["default/owner"],
        "only DaemonSet pods are looked up"
    );
}

#[test]
fn only_pods_tolerating_the_cordon_come_back_after_eviction() {
    let with = |toleration: Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [], "tolerations": [toleration]}}))
        .unwrap()
    };
    assert!(tolerates_cordon(&with(
        json!({"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"})
    )));
    assert!(
        tolerates_cordon(&with(json!({"operator": "Exists"}))),
        "tolerates everything"
    );
    assert!(
        tolerates_cordon(&with(json!({"key": UNSCHEDULABLE_TAINT}))),
        "Equal with an empty value"
    );
    assert!(!tolerates_cordon(&with(
        json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoExecute"})
    )));
    assert!(!tolerates_cordon(&with(
        json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists"})
    )));
    assert!(!tolerates_cordon(&with(
        json!({"key": UNSCHEDULABLE_TAINT, "value": "x"})
    )));
    assert!(!tolerates_cordon(&Pod::default()));
}
