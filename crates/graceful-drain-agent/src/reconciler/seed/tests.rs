use super::*;
use ClaimStatus::*;

fn seed(claim: ClaimStatus) -> SeedView {
    SeedView {
        uid: "s-1".into(),
        claim,
        deleting: false,
        held: true,
        mirror_uid: Some("m-1".into()),
    }
}

fn mirror(claim: ClaimStatus) -> MirrorView {
    MirrorView {
        uid: "m-1".into(),
        of_seed: Some("s-1".into()),
        claim,
        deleting: false,
        claimed: claim == Claimed,
        held: true,
        status_differs: false,
    }
}

#[test]
fn a_new_seed_event_is_held_then_mirrored_then_recorded() {
    let new = SeedView {
        held: false,
        mirror_uid: None,
        ..seed(Pending)
    };
    assert_eq!(plan(&new, None), [Step::Hold, Step::CreateMirror]);
    let held = SeedView {
        mirror_uid: None,
        ..seed(Pending)
    };
    assert_eq!(plan(&held, None), [Step::CreateMirror]);
    assert_eq!(plan(&held, Some(&mirror(Pending))), [Step::Record]);
    assert_eq!(plan(&seed(Pending), Some(&mirror(Pending))), []);
}

#[test]
fn progress_is_copied_back_and_a_finished_mirror_finishes_its_seed_event() {
    let claimed = MirrorView {
        status_differs: true,
        ..mirror(Claimed)
    };
    assert_eq!(plan(&seed(Pending), Some(&claimed)), [Step::CopyStatus]);
    let done = MirrorView {
        status_differs: true,
        ..mirror(Succeeded)
    };
    assert_eq!(
        plan(&seed(Claimed), Some(&done)),
        [Step::CopyStatus, Step::ReleaseMirror, Step::Finish]
    );
    // Copied already (a failed Finish): released and finished again.
    assert_eq!(
        plan(&seed(Succeeded), Some(&mirror(Succeeded))),
        [Step::ReleaseMirror, Step::Finish]
    );
    let released = MirrorView {
        held: false,
        ..mirror(Failed)
    };
    assert_eq!(plan(&seed(Failed), Some(&released)), [Step::Finish]);
    assert_eq!(plan(&seed(SlaExpired), None), [Step::Finish]);
}

#[test]
fn deleting_a_seed_event_cancels_its_mirror_and_waits_for_the_reconciler() {
    let deleting = SeedView {
        deleting: true,
        ..seed(Claimed)
    };
    assert_eq!(
        plan(&deleting, Some(&mirror(Claimed))),
        [Step::CancelMirror]
    );
    let stopping = MirrorView {
        deleting: true,
        ..mirror(Claimed)
    };
    assert_eq!(plan(&deleting, Some(&stopping)), []);
    let released = MirrorView {
        claimed: false,
        ..stopping
    };
    assert_eq!(
        plan(&deleting, Some(&released)),
        [Step::ReleaseMirror, Step::Finish]
    );
    assert_eq!(plan(&deleting, None), [Step::Finish]);
}

#[test]
fn an_event_of_our_group_that_is_no_mirror_is_never_touched() {
    let foreign = MirrorView {
        of_seed: None,
        ..mirror(Claimed)
    };
    let new = SeedView {
        held: false,
        mirror_uid: None,
        ..seed(Pending)
    };
    assert_eq!(plan(&new, Some(&foreign)), [Step::Clash]);
    let another = MirrorView {
        of_seed: Some("s-0".into()),
        ..mirror(Pending)
    };
    assert_eq!(plan(&new, Some(&another)), [Step::Clash]);
    let deleting = SeedView {
        deleting: true,
        ..new
    };
    assert_eq!(plan(&deleting, Some(&foreign)), [Step::Finish]);
}

#[test]
fn a_mirror_gone_without_an_outcome_fails_its_seed_event() {
    assert_eq!(plan(&seed(Claimed), None), [Step::Lost]);
    let cancelled = MirrorView {
        deleting: true,
        claimed: false,
        ..mirror(Claimed)
    };
    assert_eq!(
        plan(&seed(Claimed), Some(&cancelled)),
        [Step::Lost, Step::ReleaseMirror]
    );
}

#[test]
fn a_mirror_carries_the_seed_events_name_spec_and_uid() {
    let mut seed: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "lifecycle.k8s.io/v1alpha1", "kind": "LifecycleEvent",
        "metadata": {"name": "worker-1-drain", "uid": "s-1"},
        "spec": {"transitionName": "graceful-drain", "bindingNode": "worker-1"}
    }))
    .unwrap();
    assert_eq!(binding_node(&seed), Some("worker-1"));
    let view = seed_view(&seed);
    assert_eq!(view.claim, Pending);
    assert!(!view.held);
    let spec = serde_json::from_value(seed.data["spec"].clone()).unwrap();
    let m = mirror_of(&seed, spec);
    assert_eq!(m.name_any(), "worker-1-drain");
    assert_eq!(m.spec.binding_node, "worker-1");
    assert_eq!(m.annotations()[SEED_UID_ANNOTATION], "s-1");
    assert_eq!(m.labels()[SEED_MIRROR_LABEL], "true");
    assert_eq!(m.finalizers(), [SEED_BRIDGE_FINALIZER]);
    // The seed event's progress is compared with what the mirror would copy.
    seed.data["status"] = json!({"claimStatus": "Claimed"});
    let mut claimed = m.clone();
    claimed.status = Some(LifecycleEventStatus {
        claim_status: Some(Claimed),
        ..LifecycleEventStatus::default()
    });
    assert!(!mirror_view(&claimed, &seed).status_differs);
    assert!(mirror_view(&m, &seed).status_differs);
    assert_eq!(seed_view(&seed).claim, Claimed);
}
