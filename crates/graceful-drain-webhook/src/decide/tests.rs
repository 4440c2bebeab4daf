use super::*;
use crate::review::IntoFacts as _;
use graceful_drain_testing::fixtures::{self, PodFixture};

fn now() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn settings() -> Settings {
    Settings {
        default_delay: Duration::from_secs(60),
        max_delay: Duration::from_secs(600),
        exposure: Exposure::EndpointSlice,
        own_users: ["system:serviceaccount:gd:webhook".to_string()].into(),
    }
}

fn req(operation: Operation) -> Removal {
    Removal {
        operation,
        name: "web-1".into(),
        preconditions: Preconditions::default(),
        dry_run: false,
        grace_period: None,
        user: "alice".into(),
        owner_backed: false,
    }
}

/// `web/web-1` of ReplicaSet `web-abc`, running and ready.
fn pod() -> PodFacts {
    fixtures::pod("web-1")
        .ns("web")
        .with_uid("uid-1")
        .at_version("7")
        .label("app", "web")
        .running()
        .ready()
        .owned_by_rs("web-abc")
        .facts()
}

fn exposed() -> Snapshot {
    Snapshot {
        endpoints: vec![EndpointFacts {
            service: Some("web".into()),
            ready: true,
            earlier_pod: false,
        }],
        services: vec![ServiceFacts {
            name: "web".into(),
            service_type: ServiceType::ClusterIp,
            selector: [("app".to_string(), "web".to_string())].into(),
            selects_pod: false,
        }],
        ..Snapshot::default()
    }
}

fn pdb(allowed: i32) -> PdbFacts {
    PdbFacts {
        name: "web".into(),
        disruptions_allowed: allowed,
        observed: true,
        lists_pod: false,
        selector_keys: ["app".to_string()].into(),
    }
}

fn isolate_at(secs: i64) -> Decision {
    Decision::Isolate {
        delete_at: now() + jiff::SignedDuration::from_secs(secs),
        grace_period: None,
        charge: Charge::Required,
        capped: false,
    }
}

fn isolate_delete_at(secs: i64) -> Decision {
    Decision::Isolate {
        delete_at: now() + jiff::SignedDuration::from_secs(secs),
        grace_period: None,
        charge: Charge::IfPossible,
        capped: false,
    }
}

#[test]
fn decision_table() {
    type Case = (&'static str, Removal, PodFacts, Snapshot, Decision);
    let mut dry = req(Operation::Evict);
    dry.dry_run = true;
    let mut own = req(Operation::Delete);
    own.user = "system:serviceaccount:gd:webhook".into();
    let mut force = req(Operation::Delete);
    force.grace_period = Some(0);
    let mut opted = pod();
    opted.labels.insert(OPT_OUT_LABEL.into(), "true".into());
    let mut ns_opted = exposed();
    ns_opted.namespace.opted_out = true;
    let mut terminating = pod();
    terminating.terminating = true;
    let mut pending = pod();
    pending.labels.insert(DRAINING_LABEL.into(), "true".into());
    pending
        .annotations
        .insert(DELETE_AT_ANNOTATION.into(), "2026-01-01T00:00:30Z".into());
    let mut due = pending.clone();
    due.annotations
        .insert(DELETE_AT_ANNOTATION.into(), "2025-12-31T23:59:00Z".into());
    let mut pending_phase = pod();
    pending_phase.running = false;
    let mut unready = pod();
    unready.ready = false;
    let mut not_ready_ep = exposed();
    not_ready_ep.endpoints[0].ready = false;
    let mut other_uid = exposed();
    other_uid.endpoints[0].earlier_pod = true;
    let with_pdb = |p: PdbFacts| {
        let mut s = exposed();
        s.pdbs = vec![p];
        s
    };
    let mut unobserved = pdb(1);
    unobserved.observed = false;
    let mut listed = pdb(0);
    listed.lists_pod = true;
    let mut two = exposed();
    two.pdbs = vec![pdb(1), pdb(1)];
    let mut pod_delay = pod();
    pod_delay
        .annotations
        .insert(DELAY_ANNOTATION.into(), "45s".into());
    let mut ns_delay = exposed();
    ns_delay.namespace.delay = Some("2m".into());
    let mut long_delay = pod();
    long_delay
        .annotations
        .insert(DELAY_ANNOTATION.into(), "87600h".into());
    let mut bad_delay = pod();
    bad_delay
        .annotations
        .insert(DELAY_ANNOTATION.into(), "soon".into());
    let mut graceful = req(Operation::Evict);
    graceful.grace_period = Some(20);
    let mut uid_pre = req(Operation::Evict);
    uid_pre.preconditions.uid = Some("uid-of-the-previous-web-1".into());
    let mut rv_pre = req(Operation::Evict);
    rv_pre.preconditions.resource_version = Some("6".into());
    let mut ok_pre = req(Operation::Evict);
    ok_pre.preconditions = Preconditions {
        uid: Some("uid-1".into()),
        resource_version: Some("7".into()),
    };
    let mut gc = req(Operation::Delete);
    gc.user = GARBAGE_COLLECTOR.into();
    let mut no_deleter = exposed();
    no_deleter.no_deleter = true;
    let mut ns_terminating = exposed();
    ns_terminating.namespace.terminating = true;

    let cases: Vec<Case> = vec![
        (
            "isolates an exposed ready pod",
            req(Operation::Evict),
            pod(),
            exposed(),
            isolate_at(60),
        ),
        (
            "delete isolates too",
            req(Operation::Delete),
            pod(),
            exposed(),
            isolate_delete_at(60),
        ),
        (
            "dry run passes",
            dry,
            pod(),
            exposed(),
            Decision::Pass(Pass::DryRun),
        ),
        (
            "own requests pass",
            own,
            pod(),
            exposed(),
            Decision::Pass(Pass::OwnRequest),
        ),
        (
            "force delete passes",
            force,
            pod(),
            exposed(),
            Decision::Pass(Pass::ForceDelete),
        ),
        (
            "pod opt-out",
            req(Operation::Evict),
            opted,
            exposed(),
            Decision::Pass(Pass::OptedOut),
        ),
        (
            "namespace opt-out",
            req(Operation::Evict),
            pod(),
            ns_opted,
            Decision::Pass(Pass::OptedOut),
        ),
        (
            "terminating",
            req(Operation::Delete),
            terminating,
            exposed(),
            Decision::Pass(Pass::Terminating),
        ),
        (
            "already isolated waits",
            req(Operation::Evict),
            pending.clone(),
            exposed(),
            Decision::Pending {
                delete_at: "2026-01-01T00:00:30Z".parse().unwrap(),
            },
        ),
        (
            "already isolated and due",
            req(Operation::Delete),
            due.clone(),
            Snapshot::default(),
            Decision::Pass(Pass::AlreadyDue),
        ),
        (
            "due but still in an EndpointSlice: waits, asked again from now",
            req(Operation::Evict),
            due,
            exposed(),
            Decision::Pending { delete_at: now() },
        ),
        (
            "not running",
            req(Operation::Evict),
            pending_phase,
            exposed(),
            Decision::Pass(Pass::NotRunning),
        ),
        (
            "not ready",
            req(Operation::Evict),
            unready,
            exposed(),
            Decision::Pass(Pass::NotReady),
        ),
        (
            "no slice",
            req(Operation::Evict),
            pod(),
            Snapshot::default(),
            Decision::Pass(Pass::NotExposed),
        ),
        (
            "unready endpoint",
            req(Operation::Evict),
            pod(),
            not_ready_ep,
            Decision::Pass(Pass::NotExposed),
        ),
        (
            "endpoint of a previous pod",
            req(Operation::Evict),
            pod(),
            other_uid,
            Decision::Pass(Pass::NotExposed),
        ),
        (
            "pdb with budget",
            req(Operation::Evict),
            pod(),
            with_pdb(pdb(1)),
            isolate_at(60),
        ),
        (
            "eviction behind an exhausted cached pdb: the live PDB decides",
            req(Operation::Evict),
            pod(),
            with_pdb(pdb(0)),
            isolate_at(60),
        ),
        (
            "eviction behind an unobserved cached pdb: the live PDB decides",
            req(Operation::Evict),
            pod(),
            with_pdb(unobserved.clone()),
            isolate_at(60),
        ),
        (
            "a PDB never blocks a delete: exhausted",
            req(Operation::Delete),
            pod(),
            with_pdb(pdb(0)),
            isolate_delete_at(60),
        ),
        (
            "a PDB never blocks a delete: unobserved",
            req(Operation::Delete),
            pod(),
            with_pdb(unobserved),
            isolate_delete_at(60),
        ),
        (
            "a PDB never blocks a delete: several",
            req(Operation::Delete),
            pod(),
            two.clone(),
            isolate_delete_at(60),
        ),
        (
            "eviction with another pod's uid precondition",
            uid_pre,
            pod(),
            exposed(),
            Decision::Pass(Pass::PreconditionMismatch),
        ),
        (
            "eviction with a stale resourceVersion precondition",
            rv_pre,
            pod(),
            exposed(),
            Decision::Pass(Pass::PreconditionMismatch),
        ),
        (
            "eviction with matching preconditions",
            ok_pre,
            pod(),
            exposed(),
            isolate_at(60),
        ),
        (
            "nobody holds the deleter lease",
            req(Operation::Evict),
            pod(),
            no_deleter,
            Decision::Pass(Pass::NoDeleter),
        ),
        (
            "an isolated pod stays protected without a deleter",
            req(Operation::Evict),
            pending.clone(),
            {
                let mut s = exposed();
                s.no_deleter = true;
                s
            },
            Decision::Pending {
                delete_at: "2026-01-01T00:00:30Z".parse().unwrap(),
            },
        ),
        (
            "garbage collector passes",
            gc,
            pod(),
            exposed(),
            Decision::Pass(Pass::GarbageCollector),
        ),
        (
            "terminating namespace passes",
            req(Operation::Delete),
            pod(),
            ns_terminating,
            Decision::Pass(Pass::NamespaceTerminating),
        ),
        (
            "pdb already lists the pod",
            req(Operation::Evict),
            pod(),
            with_pdb(listed),
            isolate_at(60),
        ),
        (
            "two pdbs",
            req(Operation::Evict),
            pod(),
            two,
            Decision::Pass(Pass::MultiplePdbs),
        ),
        (
            "pod delay annotation",
            req(Operation::Evict),
            pod_delay,
            exposed(),
            isolate_at(45),
        ),
        (
            "namespace delay annotation",
            req(Operation::Evict),
            pod(),
            ns_delay,
            isolate_at(120),
        ),
        (
            "an annotated delay beyond the maximum is capped",
            req(Operation::Evict),
            long_delay,
            exposed(),
            Decision::Isolate {
                delete_at: now() + jiff::SignedDuration::from_secs(600),
                grace_period: None,
                charge: Charge::Required,
                capped: true,
            },
        ),
        (
            "bad delay falls back",
            req(Operation::Evict),
            bad_delay,
            exposed(),
            isolate_at(60),
        ),
        (
            "grace period recorded",
            graceful,
            pod(),
            exposed(),
            Decision::Isolate {
                delete_at: now() + jiff::SignedDuration::from_secs(60),
                grace_period: Some(20),
                charge: Charge::Required,
                capped: false,
            },
        ),
    ];
    for (name, r, p, s, want) in cases {
        assert_eq!(decide(&r, &p, &s, &settings(), now()), want, "{name}");
    }
}

#[test]
fn exposure_modes_filter_by_service_type() {
    let mut snap = exposed();
    let cases = [
        (ServiceType::ClusterIp, Exposure::EndpointSlice, true),
        (ServiceType::ClusterIp, Exposure::External, false),
        (ServiceType::NodePort, Exposure::External, true),
        (ServiceType::NodePort, Exposure::LoadBalancer, false),
        (ServiceType::LoadBalancer, Exposure::LoadBalancer, true),
        (ServiceType::LoadBalancer, Exposure::External, true),
        (ServiceType::Headless, Exposure::EndpointSlice, false),
        (ServiceType::Headless, Exposure::External, false),
    ];
    for (ty, mode, want) in cases {
        snap.services[0].service_type = ty;
        assert_eq!(is_exposed(&snap, mode), want, "{ty:?} under {mode:?}");
    }
    // A slice without a Service (e.g. a Gateway's own slice) counts only in the default mode.
    snap.endpoints[0].service = None;
    assert!(is_exposed(&snap, Exposure::EndpointSlice));
    assert!(!is_exposed(&snap, Exposure::External));
}

#[test]
fn a_ready_pod_its_service_selects_is_exposed_before_any_slice_lists_it() {
    let selected = |service_type| Snapshot {
        services: vec![ServiceFacts {
            name: "web".into(),
            service_type,
            selector: [("app".to_string(), "web".to_string())].into(),
            selects_pod: true,
        }],
        ..Snapshot::default()
    };
    let r = req(Operation::Evict);
    assert!(matches!(
        decide(
            &r,
            &pod(),
            &selected(ServiceType::ClusterIp),
            &settings(),
            now()
        ),
        Decision::Isolate { .. }
    ));
    let cases = [
        (ServiceType::ClusterIp, Exposure::EndpointSlice, true),
        (ServiceType::LoadBalancer, Exposure::LoadBalancer, true),
        (ServiceType::ClusterIp, Exposure::External, false),
        (ServiceType::Headless, Exposure::EndpointSlice, false),
        (ServiceType::ExternalName, Exposure::EndpointSlice, false),
    ];
    for (ty, mode, want) in cases {
        assert_eq!(
            is_exposed(&selected(ty), mode),
            want,
            "{ty:?} under {mode:?}"
        );
    }
    let mut other = selected(ServiceType::ClusterIp);
    other.services[0].selects_pod = false;
    assert_eq!(
        decide(&r, &pod(), &other, &settings(), now()),
        Decision::Pass(Pass::NotExposed),
        "a Service that names the pod nowhere and selects it not"
    );
}

fn keys(ks: &[&str]) -> BTreeSet<String> {
    ks.iter().map(|k| k.to_string()).collect()
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn relabelling_per_owner_kind() {
    let service = keys(&["app"]);
    type Case = (
        &'static str,
        OwnerKind,
        BTreeSet<String>,
        BTreeMap<String, String>,
        Vec<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "deployment: leave the ReplicaSet and the Service, keep the rest",
            OwnerKind::ReplicaSet,
            keys(&["app", "pod-template-hash"]),
            labels(&[("app", "web"), ("pod-template-hash", "abc"), ("team", "a")]),
            vec!["app", "pod-template-hash"],
        ),
        (
            "statefulset: keep controller labels, drop only the Service's extra key",
            OwnerKind::StatefulSet,
            keys(&["app"]),
            labels(&[("app", "db"), ("tier", "web")]),
            vec!["tier"],
        ),
        (
            "statefulset: a Service made only of controller keys is not left (never released)",
            OwnerKind::StatefulSet,
            keys(&["app", "tier"]),
            labels(&[("app", "db"), ("tier", "web")]),
            vec![],
        ),
        (
            "job: keep the job's controller-uid",
            OwnerKind::Job,
            keys(&["batch.kubernetes.io/controller-uid"]),
            labels(&[
                ("batch.kubernetes.io/controller-uid", "u"),
                ("app", "w"),
                ("tier", "web"),
            ]),
            vec!["app", "tier"],
        ),
        (
            "daemonset: keep the DaemonSet selector so no second pod starts on the node",
            OwnerKind::DaemonSet,
            keys(&["name"]),
            labels(&[("name", "agent"), ("app", "w"), ("tier", "web")]),
            vec!["app", "tier"],
        ),
        (
            "bare pod: only the Service's labels, others kept",
            OwnerKind::Other("v1/None".into()),
            BTreeSet::new(),
            labels(&[("app", "w"), ("tier", "web"), ("version", "1")]),
            vec!["app", "tier"],
        ),
    ];
    for (name, kind, owner_keys, pod_labels, want) in cases {
        let policy = OwnerPolicy::for_owner(&kind, owner_keys);
        let mut leave = policy.leave.clone();
        // The Service selects app+tier except in the deployment case (app only).
        let svc = if kind == OwnerKind::ReplicaSet {
            service.clone()
        } else {
            keys(&["app", "tier"])
        };
        leave.push(svc.clone());
        let removed = labels_to_remove(&pod_labels, &leave, &policy.keep, &policy.pinned);
        let got: Vec<&str> = removed.keys().map(String::as_str).collect();
        assert_eq!(got, want, "{name}");
        let service = ServiceFacts {
            name: "svc".into(),
            service_type: ServiceType::ClusterIp,
            selector: svc.iter().map(|k| (k.clone(), String::new())).collect(),
            selects_pod: false,
        };
        let services = [service];
        let stuck = service_left_only_by_pinned(&pod_labels, &services, &policy.pinned);
        assert_eq!(
            stuck.is_some(),
            want.is_empty(),
            "{name}: cannot be isolated"
        );
        for (k, v) in &removed {
            assert_eq!(pod_labels.get(k), Some(v), "{name}: removed value recorded");
        }
    }
}

#[test]
fn a_statefulset_pods_governing_headless_service_neither_blocks_nor_is_left() {
    // The governing Service selects exactly the StatefulSet's labels; the load
    // balancer's Service has a label of its own.
    let pod_labels = labels(&[("app", "db"), ("tier", "db-lb")]);
    let policy = OwnerPolicy::for_owner(&OwnerKind::StatefulSet, keys(&["app"]));
    let service = |name: &str, service_type, selector: &[&str]| ServiceFacts {
        name: name.into(),
        service_type,
        selector: selector
            .iter()
            .map(|k| (k.to_string(), String::new()))
            .collect(),
        selects_pod: false,
    };
    let governing = service("db", ServiceType::Headless, &["app"]);
    let balanced = service("db-lb", ServiceType::LoadBalancer, &["tier"]);
    let services = [governing, balanced];
    assert_eq!(
        service_left_only_by_pinned(&pod_labels, &services, &policy.pinned),
        None,
        "a headless Service balances nothing: the pod may stay in it"
    );
    // A balanced Service on the StatefulSet's labels alone still cannot be left.
    let pinned_only = [service("db-all", ServiceType::ClusterIp, &["app"])];
    assert!(service_left_only_by_pinned(&pod_labels, &pinned_only, &policy.pinned).is_some());
    let snap = Snapshot {
        services: services.to_vec(),
        ..Snapshot::default()
    };
    let leave = crate::isolate::leave_selectors(&snap, policy.leave.clone());
    let removed = labels_to_remove(&pod_labels, &leave, &policy.keep, &policy.pinned);
    assert_eq!(
        removed.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["tier"]
    );
}

#[test]
fn delete_time_saturates_instead_of_overflowing() {
    assert_eq!(add(Timestamp::MAX, Duration::from_secs(1)), Timestamp::MAX);
    assert_eq!(
        add(now(), Duration::from_secs(90)).to_string(),
        "2026-01-01T00:01:30Z"
    );
    assert_eq!(
        add(now(), Duration::from_millis(1500)).to_string(),
        "2026-01-01T00:00:01.5Z"
    );
    assert_eq!(
        add(now(), Duration::from_nanos(1_500_000_001)).to_string(),
        "2026-01-01T00:00:01.501Z",
        "never early"
    );
}

/// A StatefulSet's governing (headless) Service keeps listing an isolated pod: its
/// slices do not hold the deletion, a load-balanced Service's do.
#[test]
fn only_slices_of_balanced_services_keep_an_isolated_pod() {
    let endpoint = |service: &str| EndpointFacts {
        service: Some(service.into()),
        ready: false,
        earlier_pod: false,
    };
    let headless = Snapshot {
        endpoints: vec![endpoint("db")],
        services: vec![ServiceFacts {
            name: "db".into(),
            service_type: ServiceType::Headless,
            selector: BTreeMap::new(),
            selects_pod: false,
        }],
        ..Snapshot::default()
    };
    assert!(!listed(&headless));
    let mut balanced = headless.clone();
    balanced.endpoints.push(endpoint("web"));
    assert!(listed(&balanced), "a not-ready endpoint still counts");
    let earlier = Snapshot {
        endpoints: vec![EndpointFacts {
            earlier_pod: true,
            ..endpoint("web")
        }],
        ..Snapshot::default()
    };
    assert!(!listed(&earlier), "an earlier pod of the same name");
}

/// The delay of an isolated pod counts from its observed removal from the slices,
/// and it never goes while one lists it; ten minutes past its delete time it goes.
#[test]
fn an_isolated_pod_waits_for_the_slices_then_its_delay() {
    let t = |s: &str| -> Timestamp { format!("2026-01-01T00:{s}Z").parse().unwrap() };
    let delay = Duration::from_secs(10);
    let delete_at = t("00:10");
    // Left its slices at once: due at its recorded time.
    assert_eq!(
        due_at(delete_at, false, Some(t("00:00")), None, delay, t("00:05")),
        Some(delete_at)
    );
    // A busy EndpointSlice controller dropped it 8 s late: the delay counts from then.
    assert_eq!(
        due_at(delete_at, false, Some(t("00:08")), None, delay, t("00:12")),
        Some(t("00:18"))
    );
    // Still listed: not due, whatever the time.
    assert_eq!(due_at(delete_at, true, None, None, delay, t("00:30")), None);
    // Never seen listed (a restarted replica): its recorded time.
    assert_eq!(
        due_at(delete_at, false, None, None, delay, t("00:05")),
        Some(delete_at)
    );
    // Bounded: ten minutes past its delete time.
    assert_eq!(
        due_at(delete_at, true, None, None, delay, t("10:10")),
        Some(t("10:10"))
    );
    assert_eq!(
        due_at(delete_at, false, Some(t("10:09")), None, delay, t("10:10")),
        Some(t("10:10"))
    );
}

/// What confirms an isolation, and what an unconfirmed one is bound by: a drained node or
/// the API server's word confirms an eviction (a cordon alone does not); the ReplicaSet
/// controller's DELETE of its own pod goes to the deferred deleter; a DELETE nothing
/// confirms is charged to the pod's budget like an eviction, and refused under several;
/// the caller's grace period counts only when the API server vouches for the review.
#[test]
fn confirmation_table() {
    let evict = || Removal {
        grace_period: Some(0),
        ..req(Operation::Evict)
    };
    let delete = || Removal {
        grace_period: Some(0),
        ..req(Operation::Delete)
    };
    let by_rs_controller = Removal {
        user: REPLICASET_CONTROLLER.into(),
        ..delete()
    };
    let backed = Removal {
        owner_backed: true,
        ..delete()
    };
    let none = Evidence::default();
    let drained = Evidence {
        node_draining: true,
        ..none
    };
    let authenticated = Evidence {
        reviews_authenticated: true,
        ..none
    };
    let one_pdb = Snapshot {
        pdbs: vec![pdb(1)],
        ..exposed()
    };
    let two_pdbs = Snapshot {
        pdbs: vec![pdb(1), pdb(1)],
        ..exposed()
    };
    // (case, request, evidence, snapshot, charge asked, expected: confirmed, deleter
    // removes, grace period, charge) or the refusal's words.
    type Expected = Result<(bool, bool, Option<i64>, Charge), &'static str>;
    let cases: Vec<(&str, Removal, Evidence, &Snapshot, Charge, Expected)> = vec![
        (
            "eviction on a cordon's word",
            evict(),
            none,
            &one_pdb,
            Charge::Required,
            Ok((false, false, None, Charge::Required)),
        ),
        (
            "eviction from a drained node",
            evict(),
            drained,
            &one_pdb,
            Charge::Required,
            Ok((true, false, None, Charge::Required)),
        ),
        (
            "authenticated eviction keeps its grace period",
            evict(),
            authenticated,
            &one_pdb,
            Charge::Required,
            Ok((true, false, Some(0), Charge::Required)),
        ),
        (
            "person's DELETE is charged like an eviction",
            delete(),
            none,
            &one_pdb,
            Charge::IfPossible,
            Ok((false, false, None, Charge::Required)),
        ),
        (
            "unconfirmed DELETE under two budgets",
            delete(),
            none,
            &two_pdbs,
            Charge::IfPossible,
            Err("several PodDisruptionBudgets"),
        ),
        (
            "ReplicaSet controller's DELETE",
            by_rs_controller,
            none,
            &two_pdbs,
            Charge::IfPossible,
            Ok((true, true, None, Charge::IfPossible)),
        ),
        (
            "controller DELETE its owner backs",
            backed,
            none,
            &two_pdbs,
            Charge::IfPossible,
            Ok((true, false, None, Charge::IfPossible)),
        ),
        (
            "a drained node does not confirm a DELETE",
            delete(),
            drained,
            &one_pdb,
            Charge::IfPossible,
            Ok((false, false, None, Charge::Required)),
        ),
    ];
    for (case, req, evidence, snap, charge, expected) in cases {
        let got = confirm(&req, &pod(), snap, evidence, req.grace_period, charge)
            .map(|c| (c.confirmed, c.deleter_removes, c.grace_period, c.charge));
        match (got, expected) {
            (Ok(got), Ok(expected)) => assert_eq!(got, expected, "{case}"),
            (Err(why), Err(words)) => assert!(why.contains(words), "{case}: {why}"),
            (got, expected) => panic!("{case}: got {got:?}, expected {expected:?}"),
        }
    }
    assert!(needs_node(&evict(), false));
    assert!(
        !needs_node(&evict(), true),
        "the API server's word needs no node"
    );
    assert!(
        !needs_node(&delete(), false),
        "a DELETE is never confirmed by a node"
    );
}

/// The fast path passes a review on the caches' word only when nothing can route to the
/// pod; anything isolated, listed or selectable goes on to the live reads.
#[test]
fn fast_pass_table() {
    let hidden = Glance::default();
    let rows: [(&str, Removal, Glance, Option<Pass>); 9] = [
        (
            "hidden pod, eviction",
            req(Operation::Evict),
            hidden,
            Some(Pass::NotExposed),
        ),
        (
            "hidden pod, DELETE",
            req(Operation::Delete),
            hidden,
            Some(Pass::NotExposed),
        ),
        (
            "listed ready",
            req(Operation::Evict),
            Glance {
                listed_ready: true,
                ..hidden
            },
            None,
        ),
        (
            "selectable before its slice lists it",
            req(Operation::Delete),
            Glance {
                may_be_selected: true,
                ..hidden
            },
            None,
        ),
        (
            "isolated already (its delete time is kept)",
            req(Operation::Evict),
            Glance {
                isolated: true,
                ..hidden
            },
            None,
        ),
        (
            "opted-out namespace, even when listed",
            req(Operation::Delete),
            Glance {
                opted_out: true,
                listed_ready: true,
                ..hidden
            },
            Some(Pass::OptedOut),
        ),
        (
            "dry run, even when listed",
            Removal {
                dry_run: true,
                ..req(Operation::Evict)
            },
            Glance {
                listed_ready: true,
                ..hidden
            },
            Some(Pass::DryRun),
        ),
        (
            "forced DELETE",
            Removal {
                grace_period: Some(0),
                ..req(Operation::Delete)
            },
            Glance {
                listed_ready: true,
                ..hidden
            },
            Some(Pass::ForceDelete),
        ),
        (
            "a zero grace period does not force an eviction",
            Removal {
                grace_period: Some(0),
                ..req(Operation::Evict)
            },
            Glance {
                listed_ready: true,
                ..hidden
            },
            None,
        ),
    ];
    for (what, req, glance, want) in rows {
        assert_eq!(fast_pass(&req, &glance, &settings()), want, "{what}");
    }
}

/// A ReplicaSet spares a pod only when it controls more active pods than it wants.
#[test]
fn replicaset_spares_only_a_surplus() {
    assert_eq!(replicaset_spares("web-abc", 3, 4), None);
    let none = replicaset_spares("web-abc", 3, 3).unwrap();
    assert!(
        none.contains("controls 3 active pods and wants 3"),
        "{none}"
    );
    assert!(replicaset_spares("web-abc", 0, 0).is_some());
}

/// A release the load balancer confirmed ends the delay early, never while a slice lists
/// the pod and never later than the delay would have.
#[test]
fn a_confirmed_release_ends_the_delay_early() {
    let t = |s: &str| -> Timestamp { format!("2026-01-01T00:{s}Z").parse().unwrap() };
    let delay = Duration::from_secs(30);
    let delete_at = t("00:30");
    let left = Some(t("00:01"));
    assert_eq!(
        due_at(delete_at, false, left, Some(t("00:03")), delay, t("00:04")),
        Some(t("00:03"))
    );
    assert_eq!(
        due_at(delete_at, true, left, Some(t("00:03")), delay, t("00:04")),
        None
    );
    assert_eq!(
        due_at(delete_at, false, left, Some(t("00:45")), delay, t("00:04")),
        Some(t("00:31"))
    );
    // The decision reads it from the pod's annotation.
    let mut isolated = pod();
    isolated.labels.insert(DRAINING_LABEL.into(), "web".into());
    isolated
        .annotations
        .insert(DELETE_AT_ANNOTATION.into(), "2026-01-01T00:00:30Z".into());
    let snap = Snapshot::default();
    let pending = decide(&req(Operation::Evict), &isolated, &snap, &settings(), now());
    assert!(matches!(pending, Decision::Pending { .. }), "{pending:?}");
    isolated
        .annotations
        .insert(RELEASED_AT_ANNOTATION.into(), "2025-12-31T23:59:59Z".into());
    let due = decide(&req(Operation::Evict), &isolated, &snap, &settings(), now());
    assert_eq!(due, Decision::Pass(Pass::AlreadyDue));
}
