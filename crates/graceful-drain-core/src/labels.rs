//! Names of the labels, annotations and other well-known strings shared across
//! components. Everything we own carries the `graceful-drain.io/` prefix.

/// Label added to a pod once the webhook has isolated it from its ReplicaSet and
/// Services. Its presence is how every component recognises a draining pod; the deferred
/// deleter watches only pods carrying it.
pub const DRAINING_LABEL: &str = "graceful-drain.io/draining";
/// Annotation holding the JSON map of the labels removed at isolation.
pub const ORIGINAL_LABELS_ANNOTATION: &str = "graceful-drain.io/original-labels";
/// Annotation holding the RFC3339 time after which the deferred deleter may delete the pod.
pub const DELETE_AT_ANNOTATION: &str = "graceful-drain.io/delete-at";
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
/// Pod or namespace label opting out of graceful-drain (`"true"`).
pub const OPT_OUT_LABEL: &str = "graceful-drain.io/exclude";
/// Node label that makes cloud controllers take the node out of external load balancers.
pub const EXCLUDE_FROM_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// Node annotation naming the LifecycleEvent whose drain runs on the node, so a restarted
/// node agent resumes a drain only while that event is still live.
pub const DRAIN_EVENT_ANNOTATION: &str = "graceful-drain.io/drain-event";
/// Node annotation: the state of each maintenance hook's last run (JSON, see
/// `agent::hooks::HookRecord`), so a restarted agent polls a hook in progress instead of
/// starting it again.
pub const HOOKS_ANNOTATION: &str = "graceful-drain.io/hooks";
/// Label on the Jobs (and their pods) that maintenance hooks create: the hook's name.
pub const HOOK_LABEL: &str = "graceful-drain.io/hook";
/// LifecycleEvent annotation overriding the node agent's `--last-pod-selector` for that
/// drain (an empty value: no last tier).
pub const LAST_POD_SELECTOR_ANNOTATION: &str = "graceful-drain.io/last-pod-selector";
/// LifecycleEvent annotation replacing the node agent's `--tiers` for that drain (the same
/// JSON list of eviction tiers); a value that cannot be used fails the drain.
pub const TIERS_ANNOTATION: &str = "graceful-drain.io/tiers";
/// Field manager and user-agent we present to the API server.
pub const FIELD_MANAGER: &str = "graceful-drain";
/// Mirror-pod annotation set by the kubelet on static pods.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Node annotation recording that the node agent added [`EXCLUDE_FROM_LB_LABEL`] (so
/// uncordoning removes only a label we added, never one an operator set).
pub const EXCLUDE_FROM_LB_OWNED_ANNOTATION: &str = "graceful-drain.io/excluded-from-lb";
