//! The status report: a pure function from the objects [`super::fetch`] read to one
//! serializable [`Report`], which `-o json|yaml` prints as is and the `text` module lays
//! out as tables. Nothing here does I/O, so every field is unit-tested from plain objects.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use serde::Serialize;

use graceful_drain_core::labels::node_condition::{DRAIN_IN_PROGRESS, DRAINED};
use graceful_drain_core::labels::{
    DELETE_AT_ANNOTATION, PROTECTION_ANNOTATION, PROTECTION_CHECKED_AT_ANNOTATION,
    PROTECTION_MESSAGE_ANNOTATION, PROTECTION_VERIFIED_AT_ANNOTATION, RESTORE_AT_ANNOTATION,
    protection,
};
use graceful_drain_core::lifecycle::{LifecycleEvent, TRANSITION_CONDITION};

use super::release::Release;
use super::{Fetched, FetchedRelease, OURS};
use crate::ctl::events::Skipped;

/// Everything `graceful-drain status` shows, top first.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The release reported on (the first of several), with its protection, deleter Lease
    /// and node agents; flattened, so a single install reads as before releases were found
    /// by their labels.
    #[serde(flatten)]
    pub release: ReleaseReport,
    /// The other releases found, each reported the same way.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_releases: Vec<ReleaseReport>,
    /// Pods the webhook has isolated, waiting for their delete time.
    pub isolated_pods: Section<Vec<IsolatedPod>>,
    /// Which lifecycle APIs the API server serves.
    pub lifecycle_apis: Vec<LifecycleApi>,
    /// The LifecycleEvents, oldest first.
    pub lifecycle_events: Section<Vec<EventRow>>,
    /// The LifecycleEvents left out because they do not parse, each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped_lifecycle_events: Vec<Skipped>,
    /// The nodes' lifecycle conditions.
    pub nodes: Section<Vec<NodeRow>>,
    /// The last run of each maintenance hook on the nodes.
    pub hooks: Vec<HookRow>,
}

/// One release: where it is, whether evictions reach its webhook, its deleter Lease and
/// its node agents.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseReport {
    /// The release and its workloads.
    pub release: Release,
    /// Whether evictions reach the webhook (its probe's verdict on its Lease).
    pub protection: Section<Protection>,
    /// The webhook replica running the deferred deleter.
    pub deleter_lease: Section<DeleterLease>,
    /// The node agents, one row per node (and per agent pod).
    pub agents: Section<Vec<NodeAgent>>,
}

/// A part of the report, or why it could not be read (a missing permission, the CRDs not
/// installed): one unreadable part does not hide the others.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Section<T> {
    /// The part as read.
    Available(T),
    /// Why it is not shown.
    Unavailable {
        /// The reason, naming the object that could not be read.
        unavailable: String,
    },
}

impl<T> Section<T> {
    fn from_fetch<U>(fetched: &Result<U, String>, build: impl FnOnce(&U) -> Self) -> Self {
        match fetched {
            Ok(value) => build(value),
            Err(reason) => Self::Unavailable {
                unavailable: reason.clone(),
            },
        }
    }
}

/// The webhook's protection probe, as recorded on its Lease.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Protection {
    /// `active`, `lost` or `unknown`.
    pub state: String,
    /// Why the state is `unknown` when the Lease says nothing (no Lease, an older webhook).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The last probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<Timestamp>,
    /// Age of the last probe (`12s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked_age: Option<String>,
    /// The last probe that succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<Timestamp>,
    /// Age of the last successful probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_age: Option<String>,
    /// The text of the last failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Who holds the deleter Lease.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleterLease {
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// The holding replica; absent when released.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Last renewal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<Timestamp>,
    /// Age of the last renewal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed_age: Option<String>,
    /// `renewTime + leaseDurationSeconds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// The holder stopped renewing (or nobody holds it): until a replica takes it over,
    /// no deferred deleter runs.
    pub expired: bool,
}

/// Who removes an isolated pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RemovedBy {
    /// The evicting or deleting caller, retrying its request (`restore-at` is set; the pod
    /// is restored at that time otherwise).
    Caller,
    /// The webhook's deferred deleter, at the delete time.
    Deleter,
}

/// A pod carrying the draining label.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IsolatedPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When it may be deleted (`graceful-drain.io/delete-at`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delete_at: Option<Timestamp>,
    /// `in 12s` or `3s ago`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delete_in: Option<String>,
    /// Who removes it.
    pub removed_by: RemovedBy,
    /// When it is put back if the caller does not come back (`graceful-drain.io/restore-at`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_at: Option<Timestamp>,
    /// `in 30s` or `3s ago`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_in: Option<String>,
    /// Deleted already and shutting down.
    pub terminating: bool,
}

/// A node and its agent pod.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgent {
    /// The node (absent for an agent pod not scheduled yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The agent pod on it; absent when the node has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Whether that pod is Ready (absent without a pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Reason of the node's `LifecycleTransition` condition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle_transition: Option<String>,
}

/// One lifecycle API group version.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleApi {
    /// `group/version`.
    pub group_version: String,
    /// Listed by discovery.
    pub served: bool,
    /// Its resources.
    pub resources: Vec<String>,
    /// What it means for graceful-drain.
    pub note: String,
}

/// One LifecycleEvent.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRow {
    /// Its name.
    pub name: String,
    /// Its transition.
    pub transition: String,
    /// Its node.
    pub node: String,
    /// Claim status (`Pending` when none is set).
    pub status: String,
    /// Creation time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
    /// Its age.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age: Option<String>,
}

/// A node condition's status and reason.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Condition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason.
    pub reason: String,
}

/// One node's lifecycle conditions.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// The node.
    pub name: String,
    /// `LifecycleTransition`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle_transition: Option<Condition>,
    /// `DrainInProgress`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_in_progress: Option<Condition>,
    /// `Drained`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drained: Option<Condition>,
    /// Not cordoned.
    pub schedulable: bool,
}

/// A maintenance hook's last run on a node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRow {
    /// The node.
    pub node: String,
    /// The hook.
    pub hook: String,
    /// The point it ran at.
    pub at: String,
    /// The LifecycleEvent (or operation) of the run.
    pub event: String,
    /// Its state.
    pub state: String,
    /// When it started.
    pub started_at: Timestamp,
    /// Time since it started.
    pub age: String,
    /// Its last message.
    pub message: String,
}

/// Builds the report from what [`super::fetch`] read.
pub fn report(fetched: &Fetched, now: Timestamp) -> Report {
    let node = fetched.node.as_deref();
    let nodes = fetched.nodes.as_deref().ok();
    let release = |r: &FetchedRelease| release_report(r, nodes, node, now);
    let listed = fetched.events.as_ref().ok().and_then(Option::as_ref);
    Report {
        release: release(&fetched.release),
        other_releases: fetched.other_releases.iter().map(release).collect(),
        isolated_pods: Section::from_fetch(&fetched.isolated, |pods| {
            Section::Available(isolated(pods, node, now))
        }),
        lifecycle_apis: fetched
            .served
            .iter()
            .map(|(gv, resources)| api(gv, resources.as_deref()))
            .collect(),
        lifecycle_events: Section::from_fetch(&fetched.events, |listed| {
            match listed {
            Some(listed) => Section::Available(events_rows(&listed.events, node, now)),
            None => Section::Unavailable {
                unavailable: "lifecycle.graceful-drain.io CRDs not installed; run: graceful-drain crds | kubectl apply -f -".into(),
            },
        }
        }),
        skipped_lifecycle_events: listed.map(|l| l.skipped.clone()).unwrap_or_default(),
        nodes: Section::from_fetch(&fetched.nodes, |nodes| {
            Section::Available(nodes.iter().map(node_row).collect())
        }),
        hooks: nodes.map(|nodes| hooks(nodes, now)).unwrap_or_default(),
    }
}

/// One release's protection, deleter Lease and node agents (on `node`, if given).
pub fn release_report(
    fetched: &FetchedRelease,
    nodes: Option<&[Node]>,
    node: Option<&str>,
    now: Timestamp,
) -> ReleaseReport {
    let release = &fetched.release;
    ReleaseReport {
        release: release.clone(),
        protection: Section::from_fetch(&fetched.lease, |lease| {
            Section::Available(protection(release, lease.as_ref(), now))
        }),
        deleter_lease: Section::from_fetch(&fetched.lease, |lease| match lease {
            Some(lease) => Section::Available(deleter(lease, now)),
            None => Section::Unavailable {
                unavailable: no_lease(release),
            },
        }),
        agents: Section::from_fetch(&fetched.agents, |pods| {
            Section::Available(agents(nodes, pods, node))
        }),
    }
}

/// Why a release's Lease is missing: the webhook never started its deleter, or (where no
/// release was found by its labels) graceful-drain is not installed in that namespace.
fn no_lease(release: &Release) -> String {
    let (ns, name) = release.lease.clone().unwrap_or_default();
    match &release.webhook {
        Some(webhook) => format!(
            "no webhook Lease {ns}/{name}: has a replica of deployment {}/{webhook} started?",
            release.namespace
        ),
        None => {
            format!("no webhook Lease {ns}/{name}: is graceful-drain installed in namespace {ns}?")
        }
    }
}

/// The protection state the webhook's probe recorded on its Lease.
pub fn protection(release: &Release, lease: Option<&Lease>, now: Timestamp) -> Protection {
    let unknown = |reason: String| Protection {
        state: protection::UNKNOWN.into(),
        reason: Some(reason),
        checked_at: None,
        checked_age: None,
        verified_at: None,
        verified_age: None,
        message: None,
    };
    let Some(lease) = lease else {
        return unknown(no_lease(release));
    };
    let annotations = lease.annotations();
    let Some(state) = annotations.get(PROTECTION_ANNOTATION) else {
        return unknown("this webhook version does not probe".into());
    };
    let time = |key: &str| {
        annotations
            .get(key)
            .and_then(|v| v.parse::<Timestamp>().ok())
    };
    let (checked_at, verified_at) = (
        time(PROTECTION_CHECKED_AT_ANNOTATION),
        time(PROTECTION_VERIFIED_AT_ANNOTATION),
    );
    let known = [protection::ACTIVE, protection::LOST, protection::UNKNOWN];
    let (state, reason) = if known.contains(&state.as_str()) {
        (state.clone(), None)
    } else {
        (
            protection::UNKNOWN.to_string(),
            Some(format!(
                "unrecognised {PROTECTION_ANNOTATION} value {state:?}"
            )),
        )
    };
    Protection {
        state,
        reason,
        checked_at,
        checked_age: checked_at.map(|t| age(now, t)),
        verified_at,
        verified_age: verified_at.map(|t| age(now, t)),
        message: annotations
            .get(PROTECTION_MESSAGE_ANNOTATION)
            .filter(|m| !m.is_empty())
            .cloned(),
    }
}

/// The deleter Lease's holder and whether it expired.
pub fn deleter(lease: &Lease, now: Timestamp) -> DeleterLease {
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let renew_time = spec.renew_time.map(|t| t.0);
    let expires_at = renew_time.and_then(|t| {
        let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(15));
        t.checked_add(SignedDuration::from_secs(seconds)).ok()
    });
    DeleterLease {
        lease: format!(
            "{}/{}",
            lease.namespace().unwrap_or_default(),
            lease.name_any()
        ),
        expired: holder.is_none() || expires_at.is_none_or(|t| t < now),
        holder,
        renew_time,
        renewed_age: renew_time.map(|t| age(now, t)),
        expires_at,
    }
}

/// The isolated pods (on `node`, if given), by namespace and name.
pub fn isolated(pods: &[Pod], node: Option<&str>, now: Timestamp) -> Vec<IsolatedPod> {
    let mut rows: Vec<IsolatedPod> = pods
        .iter()
        .filter(|p| node.is_none_or(|n| pod_node(p) == Some(n)))
        .map(|p| {
            let time = |key: &str| p.annotations().get(key).and_then(|v| v.parse().ok());
            let delete_at: Option<Timestamp> = time(DELETE_AT_ANNOTATION);
            let restore_at: Option<Timestamp> = time(RESTORE_AT_ANNOTATION);
            let caller = p.annotations().contains_key(RESTORE_AT_ANNOTATION);
            IsolatedPod {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
                node: pod_node(p).map(str::to_string),
                delete_at,
                delete_in: delete_at.map(|t| relative(now, t)),
                removed_by: if caller {
                    RemovedBy::Caller
                } else {
                    RemovedBy::Deleter
                },
                restore_at,
                restore_in: restore_at.map(|t| relative(now, t)),
                terminating: p.metadata.deletion_timestamp.is_some(),
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// One row per node with its agent pod (a node without one gets a row without a pod), then
/// the agent pods on no listed node.
pub fn agents(nodes: Option<&[Node]>, pods: &[Pod], node: Option<&str>) -> Vec<NodeAgent> {
    let mut by_node: BTreeMap<Option<String>, Vec<&Pod>> = BTreeMap::new();
    for p in pods
        .iter()
        .filter(|p| node.is_none_or(|n| pod_node(p) == Some(n)))
    {
        by_node
            .entry(pod_node(p).map(str::to_string))
            .or_default()
            .push(p);
    }
    let mut rows = Vec::new();
    let row = |node: Option<String>, pod: Option<&Pod>, transition: Option<String>| NodeAgent {
        node,
        pod: pod.map(|p| p.name_any()),
        ready: pod.map(pod_ready),
        lifecycle_transition: transition,
    };
    for n in nodes.unwrap_or_default() {
        let transition = condition(n, TRANSITION_CONDITION).map(|c| c.reason);
        match by_node.remove(&Some(n.name_any())) {
            Some(pods) => {
                rows.extend(
                    pods.into_iter()
                        .map(|p| row(Some(n.name_any()), Some(p), transition.clone())),
                );
            }
            None => rows.push(row(Some(n.name_any()), None, transition)),
        }
    }
    for (n, pods) in by_node {
        rows.extend(pods.into_iter().map(|p| row(n.clone(), Some(p), None)));
    }
    rows
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A lifecycle API and what it means (`resources` is `None` when not served).
pub fn api(group_version: &str, resources: Option<&[String]>) -> LifecycleApi {
    let seed = resources.is_some_and(|r| r.iter().any(|n| n == "lifecycleevents"));
    let note = match (group_version, resources.is_some()) {
        (OURS, true) => "LifecycleEvents and transitions",
        (OURS, false) => "install the CRDs: graceful-drain crds | kubectl apply -f -",
        (_, true) if seed => {
            "the seed group's CRDs (lifecycleCrds.seedGroup): node agents carry its LifecycleEvents over to lifecycle.graceful-drain.io"
        }
        (_, true) => {
            "Kubernetes' EvictionRequest API; no controller acts on it in 1.37, graceful-drain does not use it yet"
        }
        (_, false) => "Kubernetes' EvictionRequest API (feature gate EvictionRequestAPI)",
    };
    LifecycleApi {
        group_version: group_version.to_string(),
        served: resources.is_some(),
        resources: resources.map(<[String]>::to_vec).unwrap_or_default(),
        note: note.to_string(),
    }
}

/// The events (bound to `node`, if given), oldest first.
pub fn events_rows(events: &[LifecycleEvent], node: Option<&str>, now: Timestamp) -> Vec<EventRow> {
    let mut rows: Vec<&LifecycleEvent> = events
        .iter()
        .filter(|e| node.is_none_or(|n| e.spec.binding_node == n))
        .collect();
    rows.sort_by_key(|e| {
        (
            e.metadata.creation_timestamp.as_ref().map(|t| t.0),
            e.name_any(),
        )
    });
    rows.into_iter()
        .map(|e| EventRow {
            name: e.name_any(),
            transition: e.spec.transition_name.clone(),
            node: e.spec.binding_node.clone(),
            status: e
                .status
                .as_ref()
                .and_then(|s| s.claim_status)
                .map_or("Pending".to_string(), |s| s.to_string()),
            created_at: e.metadata.creation_timestamp.as_ref().map(|t| t.0),
            age: e
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| age(now, t.0)),
        })
        .collect()
}

fn condition(node: &Node, type_: &str) -> Option<Condition> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    Some(Condition {
        status: c.status.clone(),
        reason: c.reason.clone().unwrap_or_default(),
    })
}

/// A node's lifecycle conditions.
pub fn node_row(node: &Node) -> NodeRow {
    NodeRow {
        name: node.name_any(),
        lifecycle_transition: condition(node, TRANSITION_CONDITION),
        drain_in_progress: condition(node, DRAIN_IN_PROGRESS),
        drained: condition(node, DRAINED),
        schedulable: !node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
    }
}

/// The last run of each maintenance hook on the nodes (the `graceful-drain.io/hooks`
/// annotation), by node and start time.
pub fn hooks(nodes: &[Node], now: Timestamp) -> Vec<HookRow> {
    let mut rows = Vec::new();
    for n in nodes {
        let mut records: Vec<_> = graceful_drain_agent::hooks::records(n)
            .into_iter()
            .collect();
        records.sort_by_key(|(_, r)| r.started_at);
        rows.extend(records.into_iter().map(|(hook, r)| {
            HookRow {
                node: n.name_any(),
                hook,
                at: r.at.name().to_string(),
                event: r.operation,
                state: serde_json::to_value(r.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                started_at: r.started_at,
                age: age(now, r.started_at),
                message: r.message,
            }
        }));
    }
    rows
}

/// kubectl-style age: `45s`, `12m`, `3h`, `2d`.
pub fn age(now: Timestamp, then: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `in 12s` for a time ahead, `12s ago` for one past.
pub fn relative(now: Timestamp, at: Timestamp) -> String {
    if at > now {
        format!("in {}", age(at, now))
    } else {
        format!("{} ago", age(now, at))
    }
}
