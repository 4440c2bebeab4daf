//! The project's vocabulary: every label, annotation, finalizer, Event reason and status
//! cause our components write, and the few well-known strings of others that they use.
//! Everything we own carries the `graceful-drain.io/` prefix (or, for the lifecycle API,
//! `lifecycle.graceful-drain.io/`).
//!
//! These strings are an external contract: users' alerts, field selectors and scripts
//! match on them, so a value never changes once released. Each one is defined here and
//! only here; components, tests and tools import it from this module.
//!
//! In order: labels, annotations (on pods, Nodes, LifecycleEvents and the webhook's Lease),
//! finalizers, the Event reasons of the webhook ([`webhook_reason`]) and of the node agent
//! ([`agent_reason`]), status causes ([`DEREGISTERING_CAUSE`]), the hook protocol's
//! [`HOOK_API_VERSION`], and the names we present ([`FIELD_MANAGER`],
//! [`WEBHOOK_REPORTING_COMPONENT`]).

use crate::lifecycle::ClaimStatus;

// # Labels

/// Label added to a pod once the webhook has isolated it from its ReplicaSet and
/// Services. Its presence is how every component recognises a draining pod; the deferred
/// deleter watches only pods carrying it.
pub const DRAINING_LABEL: &str = "graceful-drain.io/draining";
/// Pod or namespace label opting out of graceful-drain (`"true"`).
pub const OPT_OUT_LABEL: &str = "graceful-drain.io/exclude";
/// Label on the Jobs (and their pods) that maintenance hooks create: the hook's name.
pub const HOOK_LABEL: &str = "graceful-drain.io/hook";
/// Label on every LifecycleEvent the seed-group bridge mirrors into our group (value
/// `true`), so the bridge watches only its own objects.
pub const SEED_MIRROR_LABEL: &str = "graceful-drain.io/seed-mirror";
/// Node label that makes cloud controllers take the node out of external load balancers.
pub const EXCLUDE_FROM_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

// # Annotations
//
// On pods (written by the webhook at isolation, or set by users).

/// Annotation holding the JSON map of the labels removed at isolation.
pub const ORIGINAL_LABELS_ANNOTATION: &str = "graceful-drain.io/original-labels";
/// Annotation holding the RFC3339 time after which the deferred deleter may delete the pod.
pub const DELETE_AT_ANNOTATION: &str = "graceful-drain.io/delete-at";
/// Annotation holding the RFC3339 time at which the configured load balancer was seen no
/// longer routing to an isolated pod that had left its EndpointSlices (the webhook's
/// `--balancer-config`): from then on the pod is due, however much of its delay is left.
/// Removed by every isolation and restore, so only a release seen during this isolation
/// counts.
pub const RELEASED_AT_ANNOTATION: &str = "graceful-drain.io/released-at";
/// Annotation holding the RFC3339 time at which the webhook puts an isolated pod back into
/// its Services and controller if no authenticated eviction or DELETE has removed it by
/// then. Its presence also says who deletes the pod: the caller, retrying its eviction or
/// DELETE. Without it the deferred deleter deletes the pod at its delete time (a
/// ReplicaSet scale-down whose DELETE the webhook refused, verified on the live ReplicaSet).
pub const RESTORE_AT_ANNOTATION: &str = "graceful-drain.io/restore-at";
/// Annotation holding the grace period (seconds) the original caller asked for.
pub const GRACE_PERIOD_ANNOTATION: &str = "graceful-drain.io/grace-period-seconds";
/// Pod or namespace annotation overriding the deregistration delay (a duration like `45s`).
pub const DELAY_ANNOTATION: &str = "graceful-drain.io/deregistration-delay";
/// Mirror-pod annotation set by the kubelet on static pods.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

// On Nodes (written by the node agent).

/// Node annotation naming the LifecycleEvent whose drain runs on the node, so a restarted
/// node agent resumes a drain only while that event is still live.
pub const DRAIN_EVENT_ANNOTATION: &str = "graceful-drain.io/drain-event";
/// Node annotation: the state of each maintenance hook's last run (JSON, see
/// `agent::hooks::HookRecord`), so a restarted agent polls a hook in progress instead of
/// starting it again.
pub const HOOKS_ANNOTATION: &str = "graceful-drain.io/hooks";
/// Node annotation recording that the node agent added [`EXCLUDE_FROM_LB_LABEL`] (so
/// uncordoning removes only a label we added, never one an operator set).
pub const EXCLUDE_FROM_LB_OWNED_ANNOTATION: &str = "graceful-drain.io/excluded-from-lb";
/// Karpenter's pod annotation: Karpenter starts no disruption of the pod, plans no capacity
/// for it when its node is being deleted, and still waits for it before deleting the node
/// (`IsCurrentlyReschedulable` in pkg/utils/pdb/pdb.go, `IsDrainable` in
/// pkg/utils/pod/scheduling.go, sigs.k8s.io/karpenter v1.15.0). The webhook sets it on a pod
/// it isolates: the pod's replacement already exists, and Karpenter counting the isolated
/// pod as still needing a node launched a node per drained one that it then had to
/// consolidate away.
pub const KARPENTER_DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";

/// The descheduler's pod annotation by which a pod's owner asks for its evictions to run in
/// the background (sigs.k8s.io/descheduler v0.36.0, `EvictionRequestAnnotationKey` in
/// pkg/descheduler/evictions/evictions.go, read with its `EvictionsInBackground` gate on).
/// The webhook answers the descheduler's eviction of such a pod, when the deferred deleter
/// removes it, so that the descheduler goes on to its next pod at once.
pub const DESCHEDULER_EVICT_IN_BACKGROUND_ANNOTATION: &str =
    "descheduler.alpha.kubernetes.io/request-evict-only";
/// Pod annotation recording that isolation added [`KARPENTER_DO_NOT_DISRUPT_ANNOTATION`]
/// (so restoring the pod removes only an annotation we added, never the user's own).
pub const DO_NOT_DISRUPT_OWNED_ANNOTATION: &str = "graceful-drain.io/do-not-disrupt-set";

// On LifecycleEvents (set by users, or written by the lifecycle reconciler and the
// seed-group bridge).

/// LifecycleEvent annotation overriding the node agent's `--last-pod-selector` for that
/// drain (an empty value: no last tier).
pub const LAST_POD_SELECTOR_ANNOTATION: &str = "graceful-drain.io/last-pod-selector";
/// LifecycleEvent annotation replacing the node agent's `--tiers` for that drain (the same
/// JSON list of eviction tiers); a value that cannot be used fails the drain.
pub const TIERS_ANNOTATION: &str = "graceful-drain.io/tiers";
/// Annotation the lifecycle reconciler puts on a claimed LifecycleEvent once it called the
/// driver's Start for it (RFC3339 time of the call). It makes progress durable across
/// reconciler restarts and tells a Node condition written for this event from a stale one.
pub const LIFECYCLE_STARTED_ANNOTATION: &str = "graceful-drain.io/lifecycle-started-at";
/// Annotation carrying why a LifecycleEvent ended Failed or SlaExpired (written just
/// before the terminal status, so watchers such as `graceful-drain drain` can show it).
pub const LIFECYCLE_MESSAGE_ANNOTATION: &str = "graceful-drain.io/lifecycle-message";
/// Annotation on a mirror LifecycleEvent: the UID of the seed-group event it carries.
pub const SEED_UID_ANNOTATION: &str = "graceful-drain.io/seed-uid";
/// Annotation on a seed-group LifecycleEvent: the UID of its mirror, written once the
/// mirror exists.
pub const MIRROR_UID_ANNOTATION: &str = "graceful-drain.io/mirror-uid";

// On the webhook's deleter Lease (written by the webhook's protection probe: a periodic
// dry-run eviction it must see arrive; read by `graceful-drain status`).

/// Lease annotation: whether evictions reach the webhook, `active`, `lost` or `unknown`
/// (see [`protection`]).
pub const PROTECTION_ANNOTATION: &str = "graceful-drain.io/protection";
/// Lease annotation: RFC3339 time of the last protection probe.
pub const PROTECTION_CHECKED_AT_ANNOTATION: &str = "graceful-drain.io/protection-checked-at";
/// Lease annotation: RFC3339 time of the last protection probe that succeeded.
pub const PROTECTION_VERIFIED_AT_ANNOTATION: &str = "graceful-drain.io/protection-verified-at";
/// Lease annotation: the text of the last failed protection probe.
pub const PROTECTION_MESSAGE_ANNOTATION: &str = "graceful-drain.io/protection-message";

/// The values of [`PROTECTION_ANNOTATION`].
pub mod protection {
    /// The last probe's dry-run eviction reached the webhook.
    pub const ACTIVE: &str = "active";
    /// The last probe's dry-run eviction did not reach the webhook: evictions go through
    /// unprotected.
    pub const LOST: &str = "lost";
    /// No probe has answered yet.
    pub const UNKNOWN: &str = "unknown";
}

// # Finalizers

/// Finalizer the chart sets on the webhook's bindings (removed by the webhook at
/// uninstall, once the isolated pods are dealt with).
pub const UNINSTALL_FINALIZER: &str = "graceful-drain.io/uninstall";
/// Finalizer the claimer puts on a LifecycleEvent while it drives it.
pub const CLAIM_FINALIZER: &str = "lifecycle.graceful-drain.io/claim-protection";
/// Finalizer of the seed-group bridge on a seed event and on its mirror.
pub const SEED_BRIDGE_FINALIZER: &str = "graceful-drain.io/seed-bridge";

/// Event reasons the webhook records on pods. Like every Event reason of ours they carry
/// the `graceful-drain.io/` prefix, so `--field-selector reason=graceful-drain.io/…`
/// finds them.
pub mod webhook_reason {
    /// Event reason recorded on a pod when it is isolated.
    pub const ISOLATED: &str = "graceful-drain.io/Isolated";
    /// Event reason recorded on a pod put back into its Services because no authenticated
    /// eviction or DELETE followed its isolation.
    pub const RESTORED: &str = "graceful-drain.io/Restored";
    /// Event reason recorded on a pod when the deferred deleter deletes it.
    pub const DELETED: &str = "graceful-drain.io/Deleted";
    /// Warning Event reason when an annotated delay was cut to `--max-deregistration-delay`.
    pub const DELAY_CAPPED: &str = "graceful-drain.io/DelayCapped";
    /// Warning Event reason when an eviction was refused for now (429) because the pod
    /// could not be isolated in time; the caller retries.
    pub const ISOLATION_DEFERRED: &str = "graceful-drain.io/IsolationDeferred";
    /// Warning Event reason when a pod could not be isolated and its request went through.
    pub const ISOLATION_FAILED: &str = "graceful-drain.io/IsolationFailed";
    /// The API server stopped calling the webhook (its probe's dry-run eviction came back
    /// without the webhook's warning): evictions and deletes pass unprotected.
    pub const PROTECTION_LOST: &str = "graceful-drain.io/ProtectionLost";
}

/// Event reasons the node agent posts on the Node, where `kubectl describe node` shows
/// them: the drain's and the hooks' first, then the lifecycle reconciler's. Like every
/// Event reason of ours they carry the `graceful-drain.io/` prefix, so
/// `--field-selector reason=graceful-drain.io/…` finds them.
pub mod agent_reason {
    use super::ClaimStatus;

    /// The node is cordoned and the drain starts evicting its pods.
    pub const DRAIN_STARTED: &str = "graceful-drain.io/DrainStarted";
    /// Warning: an eviction was refused (the message names what refused it, such as a
    /// PodDisruptionBudget or a webhook) and is retried, or a pod that arrived during the drain was refused by the
    /// drain filters and is left on the node. Repeats for one pod are rate-limited.
    pub const EVICTION_BLOCKED: &str = "graceful-drain.io/EvictionBlocked";
    /// A pod that arrived during the drain is left alone (it would come straight back).
    pub const EVICTION_SKIPPED: &str = "graceful-drain.io/EvictionSkipped";
    /// The drain's plan, posted once it listed the node's pods and before any eviction:
    /// the tiers in order with their pods.
    pub const DRAIN_PLAN: &str = "graceful-drain.io/DrainPlan";
    /// A drain with several eviction tiers starts the next one.
    pub const EVICTION_TIER: &str = "graceful-drain.io/EvictionTier";
    /// Every pod the drain had to remove is gone; the message counts evicted and skipped
    /// pods.
    pub const DRAIN_COMPLETE: &str = "graceful-drain.io/DrainComplete";
    /// Warning: the drain failed (an error or a failed maintenance hook); the node stays
    /// cordoned and goes back into the load balancers.
    pub const DRAIN_FAILED: &str = "graceful-drain.io/DrainFailed";
    /// Warning: the drain was stopped before it finished (its SLA expired, or its
    /// LifecycleEvent was deleted or ended); the message says what remained, and the node
    /// stays cordoned and goes back into the load balancers.
    pub const DRAIN_STOPPED: &str = "graceful-drain.io/DrainStopped";
    /// The maintenance-complete transition uncordoned the node: it is back in service.
    pub const UNCORDONED: &str = "graceful-drain.io/Uncordoned";
    /// A maintenance hook was started.
    pub const HOOK_STARTED: &str = "graceful-drain.io/HookStarted";
    /// A maintenance hook answered done.
    pub const HOOK_SUCCEEDED: &str = "graceful-drain.io/HookSucceeded";
    /// A maintenance hook failed or timed out.
    pub const HOOK_FAILED: &str = "graceful-drain.io/HookFailed";
    /// A maintenance hook could not be called or gave no usable answer (retried).
    pub const HOOK_UNREACHABLE: &str = "graceful-drain.io/HookUnreachable";
    /// A Node read or write keeps failing (retried).
    pub const NODE_UPDATE_FAILED: &str = "graceful-drain.io/NodeUpdateFailed";
    /// The watch on the node's pods keeps failing (retried).
    pub const POD_WATCH_FAILED: &str = "graceful-drain.io/PodWatchFailed";
    /// The API server does not serve our lifecycle API (CRDs missing, or Established but
    /// not served) or RBAC forbids it: LifecycleEvent drains cannot work (retried).
    pub const LIFECYCLE_API_UNAVAILABLE: &str = "graceful-drain.io/LifecycleAPIUnavailable";

    // The lifecycle reconciler's: `LifecycleEvent` followed by the claim status it wrote.

    /// The lifecycle reconciler claimed a LifecycleEvent.
    pub const LIFECYCLE_EVENT_CLAIMED: &str = "graceful-drain.io/LifecycleEventClaimed";
    /// A LifecycleEvent ended Succeeded.
    pub const LIFECYCLE_EVENT_SUCCEEDED: &str = "graceful-drain.io/LifecycleEventSucceeded";
    /// A LifecycleEvent ended Failed.
    pub const LIFECYCLE_EVENT_FAILED: &str = "graceful-drain.io/LifecycleEventFailed";
    /// A LifecycleEvent ended SlaExpired.
    pub const LIFECYCLE_EVENT_SLA_EXPIRED: &str = "graceful-drain.io/LifecycleEventSlaExpired";
    /// Not posted today (the reconciler reports a claim or an end); here so that every
    /// claim status has its reason.
    pub const LIFECYCLE_EVENT_PENDING: &str = "graceful-drain.io/LifecycleEventPending";

    /// The reason of the Event the lifecycle reconciler posts when it writes `status` on a
    /// LifecycleEvent.
    pub fn lifecycle_event(status: ClaimStatus) -> &'static str {
        match status {
            ClaimStatus::Pending => LIFECYCLE_EVENT_PENDING,
            ClaimStatus::Claimed => LIFECYCLE_EVENT_CLAIMED,
            ClaimStatus::Failed => LIFECYCLE_EVENT_FAILED,
            ClaimStatus::SlaExpired => LIFECYCLE_EVENT_SLA_EXPIRED,
            ClaimStatus::Succeeded => LIFECYCLE_EVENT_SUCCEEDED,
        }
    }
}

// # Status causes

/// Cause reason of the webhook's 429 that asks an eviction's caller to come back once the
/// pod has left its load balancers; callers that know it (our node agent) show the pod as
/// deregistering instead of blocked. The API server passes a webhook's status details
/// through to the caller.
pub const DEREGISTERING_CAUSE: &str = "graceful-drain.io/Deregistering";

// # Hook protocol

/// `apiVersion` of the HTTPS hook messages the node agent and a maintenance hook exchange.
pub const HOOK_API_VERSION: &str = "graceful-drain.io/v1";

// # Names we present

/// The taint a cordoned node carries, which the node lifecycle controller mirrors
/// `spec.unschedulable` to (upstream `node.kubernetes.io/unschedulable`).
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Field manager and user-agent we present to the API server.
pub const FIELD_MANAGER: &str = "graceful-drain";
/// `reportingComponent` of the Events the webhook records.
pub const WEBHOOK_REPORTING_COMPONENT: &str = "graceful-drain.io/webhook";

/// The Node conditions the node agent writes (KEP-5683 condition types) and their reasons;
/// `graceful-drain drain` follows them.
pub mod node_condition {
    /// Node condition: a drain runs (True) or stopped (False, the reason says how).
    pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
    /// Node condition: the node holds no evictable pod any more (True).
    pub const DRAINED: &str = "Drained";

    /// Condition reasons we write.
    pub mod reason {
        /// DrainInProgress=True while the drain runs.
        pub const DRAINING: &str = "Draining";
        /// Drained=True, DrainInProgress=False once the drain completed.
        pub const DRAINED: &str = "Drained";
        /// DrainInProgress=False: the drain cannot proceed (filters refused, timeout).
        pub const DRAIN_FAILED: &str = "DrainFailed";
        /// DrainInProgress=False: the drain was stopped (SLA expired, maintenance requested).
        pub const DRAIN_STOPPED: &str = "DrainStopped";
        /// Both conditions False once the node is back in service.
        pub const UNCORDONED: &str = "Uncordoned";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_event_reasons_name_the_status() {
        for status in [
            ClaimStatus::Pending,
            ClaimStatus::Claimed,
            ClaimStatus::Failed,
            ClaimStatus::SlaExpired,
            ClaimStatus::Succeeded,
        ] {
            assert_eq!(
                agent_reason::lifecycle_event(status),
                format!("graceful-drain.io/LifecycleEvent{status}")
            );
        }
    }
}
