//! The simulated Job controller, as `system:serviceaccount:kube-system:job-controller`,
//! modelled on upstream's `pkg/controller/job/job_controller.go` (`syncJob`, `manageJob`,
//! `trackJobStatusAndRemoveFinalizers`, `isPodFailed`) and `pod_failure_policy.go`
//! (`matchPodFailurePolicy`), with the API types of `pkg/apis/batch/types.go`.
//!
//! Per Job, a pass claims the pods it controls (releasing those that no longer match its
//! selector, as `ClaimPods` does), counts them and decides, as `syncJob` does:
//!
//! * **Counting.** Every pod is created with the `batch.kubernetes.io/job-tracking`
//!   finalizer. A finished pod (phase Succeeded, or failed per upstream's `isPodFailed`)
//!   is first written into `status.uncountedTerminatedPods`, then its finalizer is
//!   removed, and once the cache shows it without the finalizer (or gone) its UID moves
//!   from the uncounted list to `succeeded` or `failed`. So a pod is counted exactly once,
//!   even when it is deleted right after it finished. A failed pod that matches a
//!   `podFailurePolicy` rule with action `Ignore` is never counted: it does not count
//!   toward `backoffLimit`, and it is replaced.
//! * **Failure.** More counted failures than `backoffLimit`, or a failed pod matching a
//!   `FailJob` rule, makes the Job fail: its active pods are deleted, the interim
//!   `FailureTarget` condition is written, and `Failed` follows once no pod is uncounted or
//!   terminating.
//! * **Parallelism.** Otherwise `manageJob`: at most `parallelism` active pods, fewer when
//!   fewer completions remain (`completions - succeeded`); with `completions` unset
//!   (work-queue Jobs) `parallelism` until one pod succeeded, then no new pods. Surplus pods
//!   are deleted (unscheduled, pending, not-ready and newest first); missing ones created
//!   with `generateName: <job>-`. With a `podFailurePolicy` a terminating pod still holds its
//!   slot until it is Failed (upstream's `onlyReplaceFailedPods`).
//! * **Completion.** `succeeded >= completions` (or, for work-queue Jobs, one success) with
//!   no active pod writes `SuccessCriteriaMet`, then `Complete` with `completionTime`.
//!
//! The interim conditions are upstream's behaviour with the `JobManagedBy` and
//! `JobPodReplacementPolicy` gates on (`delayTerminalCondition`), which is also why
//! `status.terminating` is reported. Pods carrying the finalizer whose Job is gone or
//! finished, or that were released, lose the finalizer (upstream's orphan queue).
//!
//! The simulated API server neither defaults Jobs nor generates their selector (upstream
//! `pkg/registry/batch/job/strategy.go`), so this controller reads the defaults itself
//! (`parallelism` 1; `completions` 1 when both are unset; `backoffLimit` 6) and labels the
//! pods with the `controller-uid` and `job-name` labels the API server would have put on
//! the template. Not modelled: `Indexed` completion mode (such Jobs are skipped),
//! `suspend`, `activeDeadlineSeconds`, `successPolicy`, `backoffLimitPerIndex`, the
//! exponential delay before a failed pod is replaced, and adoption of orphans.
//!
//! This file holds the Job's rules (counting, failure, parallelism, completion, the sync
//! of a plan, the orphans' finalizers); the pass around them, the expectations and the
//! shared API calls are the workload skeleton's (`workload.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::batch::v1::{
    Job, JobCondition, JobStatus, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    UncountedTerminatedPods,
};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

use super::workload::{self, Kind, Work, owner_ref};
use super::{
    Result, Workers, api_err, controller_of, key, labels_of, ns_name, pod_active, pod_ready,
    selector_matches, status_code,
};
use tokio_util::sync::CancellationToken;

/// Finalizer that keeps a Job's pod until the controller has counted it (upstream
/// `batch.JobTrackingFinalizer`).
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Label carrying the Job's UID (upstream `batch.ControllerUidLabel`).
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
/// Label carrying the Job's name (upstream `batch.JobNameLabel`).
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// The pre-1.27 spelling of [`CONTROLLER_UID_LABEL`] the API server still adds (upstream
/// `batch.LegacyControllerUidLabel`).
pub const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
/// The pre-1.27 spelling of [`JOB_NAME_LABEL`] the API server still adds (upstream
/// `batch.LegacyJobNameLabel`).
pub const LEGACY_JOB_NAME_LABEL: &str = "job-name";

/// Upstream API defaults (`pkg/apis/batch/v1/defaults.go`).
const DEFAULT_BACKOFF_LIMIT: i32 = 6;
/// Upstream `MaxPodCreateDeletePerSync`.
const MAX_POD_CREATE_DELETE_PER_SYNC: usize = 500;

// Condition types and reasons (upstream `pkg/apis/batch/types.go`).

/// Terminal condition of a Job that succeeded, written after [`SUCCESS_CRITERIA_MET`]
/// once no pod is uncounted or terminating (upstream `JobComplete`).
pub const COMPLETE: &str = "Complete";
/// Terminal condition of a Job that failed, written after [`FAILURE_TARGET`] once no pod
/// is uncounted or terminating (upstream `JobFailed`).
pub const FAILED: &str = "Failed";
/// Interim condition: the Job has succeeded, its terminal [`COMPLETE`] is still to come
/// (upstream `JobSuccessCriteriaMet`).
pub const SUCCESS_CRITERIA_MET: &str = "SuccessCriteriaMet";
/// Interim condition: the Job is failing and its active pods are being deleted; the
/// terminal [`FAILED`] is still to come (upstream `JobFailureTarget`).
pub const FAILURE_TARGET: &str = "FailureTarget";
/// Failure reason: more pods failed than `backoffLimit` allows (upstream
/// `JobReasonBackoffLimitExceeded`).
pub const REASON_BACKOFF_LIMIT_EXCEEDED: &str = "BackoffLimitExceeded";
/// Failure reason: a failed pod matched a `podFailurePolicy` rule with action `FailJob`
/// (upstream `JobReasonPodFailurePolicy`).
pub const REASON_POD_FAILURE_POLICY: &str = "PodFailurePolicy";
/// Success reason: `succeeded` reached `completions` (or, for a work-queue Job, a pod
/// succeeded) with no pod active (upstream `JobReasonCompletionsReached`).
pub const REASON_COMPLETIONS_REACHED: &str = "CompletionsReached";

/// The Job's spec with the API server's defaults applied.
#[derive(Debug, Clone)]
struct Params {
    parallelism: i32,
    /// `None`: a work-queue Job.
    completions: Option<i32>,
    backoff_limit: i32,
    policy: Option<PodFailurePolicy>,
    /// Upstream `onlyReplaceFailedPods`: a `podFailurePolicy`, or `podReplacementPolicy:
    /// Failed`.
    only_replace_failed: bool,
    selector: LabelSelector,
}

impl Params {
    fn of(job: &Job) -> Params {
        let spec = job.spec.clone().unwrap_or_default();
        // Upstream `SetDefaults_Job`: both unset means one pod to one completion.
        let completions = match (spec.completions, spec.parallelism) {
            (None, None) => Some(1),
            (c, _) => c,
        };
        let only_replace_failed = spec.pod_failure_policy.is_some()
            || spec.pod_replacement_policy.as_deref() == Some("Failed");
        let selector = spec.selector.clone().unwrap_or_else(|| LabelSelector {
            match_labels: Some(BTreeMap::from([(
                CONTROLLER_UID_LABEL.to_string(),
                job.uid().unwrap_or_default(),
            )])),
            ..LabelSelector::default()
        });
        Params {
            parallelism: spec.parallelism.unwrap_or(1).max(0),
            completions,
            backoff_limit: spec.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT),
            policy: spec.pod_failure_policy,
            only_replace_failed,
            selector,
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn has_finalizer(pod: &Pod) -> bool {
    pod.finalizers().iter().any(|f| f == TRACKING_FINALIZER)
}

/// Upstream `IsPodTerminating`: being deleted and not yet Succeeded or Failed.
fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some() && !matches!(phase(pod), "Succeeded" | "Failed")
}

/// Upstream `isPodFailed`: phase Failed; or, unless only failed pods are replaced (a
/// `podFailurePolicy` or `podReplacementPolicy: Failed`), being deleted before
/// succeeding — so an evicted pod of a Job without a policy counts as failed at once,
/// and one of a Job with a policy once the kubelet has made it Failed (and the policy
/// can see its exit codes and its `DisruptionTarget` condition).
fn is_pod_failed(pod: &Pod, params: &Params) -> bool {
    if phase(pod) == "Failed" {
        return true;
    }
    if params.only_replace_failed {
        return false;
    }
    pod.metadata.deletion_timestamp.is_some() && phase(pod) != "Succeeded"
}

/// What a `podFailurePolicy` says about one failed pod (upstream `matchPodFailurePolicy`).
#[derive(Debug, PartialEq, Eq)]
pub struct PolicyMatch {
    /// The Job's failure message when a `FailJob` rule matched.
    pub fail_job: Option<String>,
    /// Whether the failure counts toward `backoffLimit` (not for `Ignore`).
    pub counts: bool,
    /// The action of the matching rule, if any.
    pub action: Option<String>,
}

/// Matches `pod` against `policy`'s rules in order; the first match decides.
pub fn match_pod_failure_policy(policy: Option<&PodFailurePolicy>, pod: &Pod) -> PolicyMatch {
    let no_match = PolicyMatch {
        fail_job: None,
        counts: true,
        action: None,
    };
    let Some(policy) = policy else {
        return no_match;
    };
    let (ns, name) = ns_name(pod);
    for (index, rule) in policy.rules.iter().enumerate() {
        let what = if let Some(req) = &rule.on_exit_codes {
            match matching_exit_code(pod, req) {
                Some((container, code)) => format!(
                    "Container {container} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                    rule.action
                ),
                None => continue,
            }
        } else if let Some(patterns) = &rule.on_pod_conditions {
            match matching_condition(pod, patterns) {
                Some(cond) => format!(
                    "Pod {ns}/{name} has condition {cond} matching {} rule at index {index}",
                    rule.action
                ),
                None => continue,
            }
        } else {
            continue;
        };
        return match rule.action.as_str() {
            "Ignore" => PolicyMatch {
                fail_job: None,
                counts: false,
                action: Some(rule.action.clone()),
            },
            "FailJob" => PolicyMatch {
                fail_job: Some(what),
                counts: true,
                action: Some(rule.action.clone()),
            },
            "Count" => PolicyMatch {
                fail_job: None,
                counts: true,
                action: Some(rule.action.clone()),
            },
            // Upstream skips a rule whose action it does not know (`FailIndex` needs
            // backoffLimitPerIndex, which is not modelled).
            _ => continue,
        };
    }
    no_match
}

/// Upstream `matchOnExitCodes`: the first terminated container (then init container) with
/// a non-zero exit code that satisfies the requirement.
fn matching_exit_code(
    pod: &Pod,
    req: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<(String, i32)> {
    let status = pod.status.as_ref()?;
    let lists = [&status.container_statuses, &status.init_container_statuses];
    lists
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|cs: &ContainerStatus| {
            let code = cs.state.as_ref()?.terminated.as_ref()?.exit_code;
            if code == 0 || req.container_name.as_ref().is_some_and(|n| n != &cs.name) {
                return None;
            }
            let listed = req.values.contains(&code);
            let hit = match req.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => false,
            };
            hit.then(|| (cs.name.clone(), code))
        })
}

/// Upstream `matchOnPodConditions`: a pod condition with a pattern's type and status (the
/// API server defaults a pattern's status to True).
fn matching_condition(
    pod: &Pod,
    patterns: &[k8s_openapi::api::batch::v1::PodFailurePolicyOnPodConditionsPattern],
) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find_map(|c| {
        patterns
            .iter()
            .any(|p| {
                let want = if p.status.is_empty() {
                    "True"
                } else {
                    &p.status
                };
                p.type_ == c.type_ && want == c.status
            })
            .then(|| c.type_.clone())
    })
}

/// Whether the Job has its terminal condition (upstream `IsJobFinished`).
pub fn job_finished(job: &Job) -> bool {
    conditions(job)
        .iter()
        .any(|c| (c.type_ == COMPLETE || c.type_ == FAILED) && c.status == "True")
}

fn conditions(job: &Job) -> &[JobCondition] {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[])
}

fn find_condition<'a>(job: &'a Job, type_: &str) -> Option<&'a JobCondition> {
    conditions(job)
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// Upstream `ensureJobConditionStatus` for a True condition: added, or updated when its
/// reason or message changed; an unchanged one keeps its transition time.
fn ensure_condition(status: &mut JobStatus, type_: &str, reason: &str, message: &str, now: Time) {
    let list = status.conditions.get_or_insert_with(Vec::new);
    let new = JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(now.clone()),
        last_transition_time: Some(now),
    };
    match list.iter_mut().find(|c| c.type_ == type_) {
        Some(c)
            if c.status == "True"
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message) => {}
        Some(c) => *c = new,
        None => list.push(new),
    }
}

/// The condition a Job is finishing with, before its terminal one is written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Finishing {
    success: bool,
    reason: String,
    message: String,
    /// The interim condition (`SuccessCriteriaMet` or `FailureTarget`) is still to be written.
    interim: bool,
}

impl Finishing {
    fn failure(reason: &str, message: &str) -> Self {
        Self {
            success: false,
            reason: reason.into(),
            message: message.into(),
            interim: true,
        }
    }

    fn terminal_type(&self) -> &'static str {
        if self.success { COMPLETE } else { FAILED }
    }

    fn interim_type(&self) -> &'static str {
        if self.success {
            SUCCESS_CRITERIA_MET
        } else {
            FAILURE_TARGET
        }
    }
}

/// What one sync of a Job decided.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Owned pods that no longer match the selector, to release (names).
    pub release: Vec<String>,
    /// Pods to create.
    pub create: usize,
    /// Pods to delete: (name, uid).
    pub delete: Vec<(String, String)>,
    /// Whether the status may only be written once every deletion succeeded (the Job is
    /// finishing and its active pods must go first).
    pub delete_before_status: bool,
    /// The status to write (resourceVersion-guarded), when it changed.
    pub status: Option<JobStatus>,
    /// Pods whose tracking finalizer to remove once the status is written (names).
    pub remove_finalizer: Vec<String>,
}

/// The uncounted UIDs of a status, as upstream's `uncountedTerminatedPods`.
#[derive(Debug, Default, Clone)]
struct Uncounted {
    succeeded: Vec<String>,
    failed: Vec<String>,
}

impl Uncounted {
    fn of(status: &JobStatus) -> Self {
        let u = status.uncounted_terminated_pods.clone().unwrap_or_default();
        Self {
            succeeded: u.succeeded.unwrap_or_default(),
            failed: u.failed.unwrap_or_default(),
        }
    }
}

/// The pods of a Job and the counts the decisions are made on (upstream `syncJobCtx`).
struct Ctx<'a> {
    params: Params,
    members: Vec<&'a Pod>,
    active: Vec<&'a Pod>,
    uncounted: Uncounted,
    succeeded: i32,
    failed: i32,
    terminating: i32,
    ready: i32,
}

fn uid_of(pod: &Pod) -> String {
    pod.uid().unwrap_or_default()
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Claims the Job's pods and counts them (upstream `getPodsForJob`, `getNewFinishedPods`).
fn context<'a>(job: &Job, pods: &'a [Arc<Pod>], release: &mut Vec<String>) -> Ctx<'a> {
    let params = Params::of(job);
    let uid = job.uid().unwrap_or_default();
    let mut members = Vec::new();
    for pod in pods {
        if controller_of(&**pod).is_none_or(|o| o.uid != uid) {
            continue;
        }
        if selector_matches(&params.selector, &labels_of(&**pod)) {
            members.push(&**pod);
        } else if job.metadata.deletion_timestamp.is_none() {
            release.push(pod.name_any());
        }
    }
    let status = job.status.clone().unwrap_or_default();
    let uncounted = Uncounted::of(&status);
    let fresh = |p: &&Pod, list: &[String]| has_finalizer(p) && !list.contains(&uid_of(p));
    let new_succeeded = members
        .iter()
        .filter(|p| fresh(p, &uncounted.succeeded) && phase(p) == "Succeeded")
        .count();
    let new_failed = members
        .iter()
        .filter(|p| fresh(p, &uncounted.failed) && is_pod_failed(p, &params))
        .filter(|p| match_pod_failure_policy(params.policy.as_ref(), p).counts)
        .count();
    let active: Vec<&Pod> = members.iter().copied().filter(|p| pod_active(p)).collect();
    Ctx {
        succeeded: status.succeeded.unwrap_or(0) + count(new_succeeded + uncounted.succeeded.len()),
        failed: status.failed.unwrap_or(0) + count(new_failed + uncounted.failed.len()),
        terminating: count(members.iter().filter(|p| terminating(p)).count()),
        ready: count(active.iter().filter(|p| pod_ready(p)).count()),
        params,
        members,
        active,
        uncounted,
    }
}

/// Upstream `getFailJobMessage`: the message of the first failed pod matching a `FailJob` rule.
fn fail_job_message(ctx: &Ctx<'_>) -> Option<String> {
    let policy = ctx.params.policy.as_ref()?;
    ctx.members
        .iter()
        .filter(|p| is_pod_failed(p, &ctx.params))
        .find_map(|p| match_pod_failure_policy(Some(policy), p).fail_job)
}

/// How a Job that has not met its success criteria yet is finishing, if it is.
fn failure(job: &Job, ctx: &Ctx<'_>) -> Option<Finishing> {
    if let Some(c) = find_condition(job, FAILURE_TARGET) {
        return Some(Finishing {
            interim: false,
            ..Finishing::failure(
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or(""),
            )
        });
    }
    if let Some(message) = fail_job_message(ctx) {
        return Some(Finishing::failure(REASON_POD_FAILURE_POLICY, &message));
    }
    (ctx.failed > ctx.params.backoff_limit).then(|| {
        Finishing::failure(
            REASON_BACKOFF_LIMIT_EXCEEDED,
            "Job has reached the specified backoff limit",
        )
    })
}

/// Upstream `controller.ActivePods` order, simplified: unscheduled before scheduled,
/// Pending before Running, not ready before ready, newer before older.
fn removal_order(pods: &mut [&Pod]) {
    pods.sort_by_key(|p| {
        let scheduled = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
        let phase_rank = match phase(p) {
            "Pending" | "" => 0,
            "Unknown" => 1,
            _ => 2,
        };
        let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (
            scheduled,
            phase_rank,
            pod_ready(p),
            std::cmp::Reverse(created),
        )
    });
}

/// Upstream `manageJob` for a running Job: returns the number of active pods afterwards.
fn manage(ctx: &mut Ctx<'_>, out: &mut Plan) -> i32 {
    let active = count(ctx.active.len());
    let params = &ctx.params;
    let want = match params.completions {
        // Work queue: parallelism until one pod succeeded, then let the rest finish.
        None if ctx.succeeded > 0 => active,
        None => params.parallelism,
        Some(completions) => (completions - ctx.succeeded).min(params.parallelism).max(0),
    };
    if active > want {
        let mut victims = ctx.active.clone();
        removal_order(&mut victims);
        let n = usize::try_from(active - want)
            .unwrap_or(0)
            .min(MAX_POD_CREATE_DELETE_PER_SYNC);
        for pod in &victims[..n] {
            out.delete.push((pod.name_any(), uid_of(pod)));
            ctx.terminating += 1;
            ctx.ready -= i32::from(pod_ready(pod));
        }
        // Upstream deletes or creates in one sync, never both.
        return active - count(n);
    }
    let terminating = if params.only_replace_failed {
        ctx.terminating
    } else {
        0
    };
    let diff = usize::try_from(want - terminating - active).unwrap_or(0);
    out.create = diff.min(MAX_POD_CREATE_DELETE_PER_SYNC);
    active + count(out.create)
}

/// Decides what to do for `job` given the pods of its namespace, at `now`.
pub fn plan(job: &Job, pods: &[Arc<Pod>], now: jiff::Timestamp) -> Plan {
    let mut out = Plan::default();
    // Upstream: a finished Job is never synced again; its pods' finalizers are removed
    // as orphans'.
    if job_finished(job) {
        return out;
    }
    let mut ctx = context(job, pods, &mut out.release);
    let now = Time(now);
    let mut status = job.status.clone().unwrap_or_default();
    status.start_time.get_or_insert_with(|| now.clone());
    let mut finishing = match find_condition(job, SUCCESS_CRITERIA_MET) {
        Some(c) => Some(Finishing {
            success: true,
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            interim: false,
        }),
        None => failure(job, &ctx),
    };
    let active = if finishing.is_some() {
        // Upstream `deleteActivePods`: the Job is over, its active pods go.
        for pod in &ctx.active {
            out.delete.push((pod.name_any(), uid_of(pod)));
        }
        out.delete_before_status = !out.delete.is_empty();
        ctx.terminating += count(ctx.active.len());
        ctx.ready = 0;
        0
    } else {
        let active = if job.metadata.deletion_timestamp.is_none() {
            manage(&mut ctx, &mut out)
        } else {
            count(ctx.active.len())
        };
        let complete = match ctx.params.completions {
            None => ctx.succeeded > 0 && active == 0,
            Some(c) => ctx.succeeded >= c && active == 0,
        };
        if complete {
            finishing = Some(Finishing {
                success: true,
                reason: REASON_COMPLETIONS_REACHED.into(),
                message: "Reached expected number of succeeded pods".into(),
                interim: true,
            });
        }
        active
    };
    status.active = Some(active);
    status.ready = Some(ctx.ready);
    status.terminating = Some(ctx.terminating);
    track(job, &ctx, finishing.as_ref(), &mut status, &mut out, now);
    let current = normalised(job.status.clone().unwrap_or_default());
    let status = normalised(status);
    if status != current {
        out.status = Some(status);
    }
    out
}

/// Upstream `trackJobStatusAndRemoveFinalizers`: records finished pods as uncounted,
/// plans the removal of their finalizers, moves the uncounted pods whose finalizer is
/// gone to the counters, writes the interim condition and, once nothing is uncounted or
/// terminating, the terminal one.
fn track(
    job: &Job,
    ctx: &Ctx<'_>,
    finishing: Option<&Finishing>,
    status: &mut JobStatus,
    out: &mut Plan,
    now: Time,
) {
    let mut uncounted = ctx.uncounted.clone();
    let with_finalizer: HashSet<String> = ctx
        .members
        .iter()
        .filter(|p| has_finalizer(p))
        .map(|p| uid_of(p))
        .collect();
    // `cleanUncountedPodsWithoutFinalizers`.
    let before = (uncounted.succeeded.len(), uncounted.failed.len());
    uncounted.succeeded.retain(|u| with_finalizer.contains(u));
    uncounted.failed.retain(|u| with_finalizer.contains(u));
    status.succeeded =
        Some(status.succeeded.unwrap_or(0) + count(before.0) - count(uncounted.succeeded.len()));
    status.failed =
        Some(status.failed.unwrap_or(0) + count(before.1) - count(uncounted.failed.len()));
    let job_failing = finishing.is_some_and(|f| !f.success);
    for pod in ctx.members.iter().filter(|p| has_finalizer(p)) {
        let failed = is_pod_failed(pod, &ctx.params);
        // `canRemoveFinalizer`.
        let removable = job.metadata.deletion_timestamp.is_some()
            || finishing.is_some()
            || phase(pod) == "Succeeded"
            || failed;
        if !removable {
            continue;
        }
        out.remove_finalizer.push(pod.name_any());
        let uid = uid_of(pod);
        if phase(pod) == "Succeeded" && !uncounted.failed.contains(&uid) {
            if !uncounted.succeeded.contains(&uid) {
                uncounted.succeeded.push(uid);
            }
        } else if (failed || job_failing)
            && !uncounted.failed.contains(&uid)
            && match_pod_failure_policy(ctx.params.policy.as_ref(), pod).counts
        {
            // When the Job fails, every pod not yet terminated counts as failed.
            uncounted.failed.push(uid);
        }
    }
    if let Some(f) = finishing.filter(|f| f.interim) {
        ensure_condition(status, f.interim_type(), &f.reason, &f.message, now.clone());
    }
    // `enactJobFinished`.
    let settled =
        uncounted.succeeded.is_empty() && uncounted.failed.is_empty() && ctx.terminating == 0;
    if let Some(f) = finishing.filter(|_| settled) {
        ensure_condition(
            status,
            f.terminal_type(),
            &f.reason,
            &f.message,
            now.clone(),
        );
        if f.success {
            status.completion_time.get_or_insert(now);
        }
    }
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: Some(uncounted.succeeded),
        failed: Some(uncounted.failed),
    });
}

/// The status with every counter and list present, so a freshly read status compares
/// equal to the one this controller wrote.
fn normalised(mut status: JobStatus) -> JobStatus {
    for n in [
        &mut status.active,
        &mut status.ready,
        &mut status.terminating,
        &mut status.succeeded,
        &mut status.failed,
    ] {
        n.get_or_insert(0);
    }
    let u = status
        .uncounted_terminated_pods
        .get_or_insert_with(UncountedTerminatedPods::default);
    u.succeeded.get_or_insert_with(Vec::new);
    u.failed.get_or_insert_with(Vec::new);
    status
}

/// A pod of `job` (upstream `CreatePodsWithGenerateName` from the template the API
/// server labelled): `generateName: <job>-`, the identity labels, the tracking finalizer
/// and a controller reference.
pub fn pod_for(job: &Job) -> Pod {
    let name = job.name_any();
    let uid = job.uid().unwrap_or_default();
    let template = job.spec.clone().unwrap_or_default().template;
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    for (k, v) in [
        (CONTROLLER_UID_LABEL, &uid),
        (JOB_NAME_LABEL, &name),
        (LEGACY_CONTROLLER_UID_LABEL, &uid),
        (LEGACY_JOB_NAME_LABEL, &name),
    ] {
        labels.insert(k.into(), v.clone());
    }
    let mut finalizers = meta.finalizers.unwrap_or_default();
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.into());
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: job.namespace(),
            labels: Some(labels),
            annotations: meta.annotations,
            finalizers: Some(finalizers),
            owner_references: Some(vec![owner_ref(job)]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// Removes the tracking finalizer from pod `name` (upstream `removeTrackingFinalizerPatch`).
async fn remove_finalizer(api: &Api<Pod>, name: &str) -> Result<()> {
    let patch = serde_json::json!({"metadata": {
        "$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER],
    }});
    match api
        .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Err(e) if status_code(&e) != Some(404) => {
            let object = format!("pod {}/{name}", api.namespace().unwrap_or_default());
            Err(api_err("remove the job-tracking finalizer of", object)(e))
        }
        _ => Ok(()),
    }
}

/// The Job's rules, handed to the workload skeleton. Its status is part of its plan
/// (written resourceVersion-guarded, between the deletions and the finalizer removals),
/// so it writes none through the skeleton.
struct Jobs;

impl Kind for Jobs {
    type Owner = Job;
    type Plan = Plan;
    type Snapshot = ();

    fn snapshot(&self) {}

    fn sweep(
        &self,
        client: &kube::Client,
        jobs: &[Arc<Job>],
        pods: &[Arc<Pod>],
        workers: &mut Workers,
    ) {
        release_orphans(client, workers, jobs, pods);
    }

    /// `Indexed` Jobs are not modelled.
    fn handles(&self, job: &Job) -> bool {
        let mode = job.spec.as_ref().and_then(|s| s.completion_mode.as_deref());
        matches!(mode, None | Some("NonIndexed"))
    }

    fn plan(&self, job: &Job, _: &(), pods: &[Arc<Pod>]) -> Option<Plan> {
        Some(plan(job, pods, jiff::Timestamp::now()))
    }

    async fn sync(work: Work<Job>, plan: Plan, _: Option<serde_json::Value>) -> Result<()> {
        let api = work.pods();
        work.claim(&api, &[], &plan.release).await?;
        let deleted = work.delete(&api, &plan.delete).await;
        let mut created = Vec::new();
        for _ in 0..plan.create {
            match api
                .create(&PostParams::default(), &pod_for(&work.owner))
                .await
            {
                Ok(pod) => created.push(key(&pod)),
                Err(error) => tracing::info!(job = %work.key(), %error, "create pod failed"),
            }
        }
        let all_deleted = deleted.len() == plan.delete.len();
        work.expect(created, deleted);
        if plan.delete_before_status && !all_deleted {
            // Upstream: the Job cannot be declared finished while pods may remain.
            return Ok(());
        }
        if let Some(status) = &plan.status {
            work.patch_status(serde_json::json!({
                "metadata": {"resourceVersion": work.owner.resource_version()},
                "status": status,
            }))
            .await?;
        }
        // Only now that the uncounted pods are recorded may their finalizers go.
        for pod in &plan.remove_finalizer {
            remove_finalizer(&api, pod).await?;
        }
        Ok(())
    }
}

/// Upstream `syncOrphanPod`: a pod holding the tracking finalizer whose controller is
/// not a live, unfinished Job (deleted, finished, or the pod was released) loses it.
fn release_orphans(
    client: &kube::Client,
    workers: &mut Workers,
    jobs: &[Arc<Job>],
    pods: &[Arc<Pod>],
) {
    let live: HashMap<String, bool> = jobs
        .iter()
        .map(|j| (j.uid().unwrap_or_default(), job_finished(j)))
        .collect();
    for pod in pods.iter().filter(|p| has_finalizer(p)) {
        let owned = controller_of(&**pod)
            .filter(|o| o.kind == "Job")
            .and_then(|o| live.get(&o.uid))
            .is_some_and(|finished| !finished);
        let work_key = format!("finalizer/{}", uid_of(pod));
        if owned || workers.busy(&work_key) {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        let name = pod.name_any();
        workers.spawn(work_key, async move { remove_finalizer(&api, &name).await });
    }
}

/// Runs the Job controller until `shutdown`.
pub async fn run(client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    workload::run(client, shutdown, |_| Jobs).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, JobFixture, PodFixture, on_exit_codes, on_pod_condition};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, PodCondition, PodStatus,
    };

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::UNIX_EPOCH
    }

    fn job(completions: Option<i32>, parallelism: i32) -> Job {
        fixtures::job("batch")
            .ns("ns")
            .completions(completions)
            .parallelism(parallelism)
            .container("sim/batch:1")
    }

    /// Pod `name` of `job` as the controller creates it, in `phase` (Running pods Ready).
    fn member(job: &Job, name: &str, phase: &str) -> Pod {
        let mut pod = pod_for(job);
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(format!("{name}-uid"));
        pod.phase(phase).ready_is(phase == "Running")
    }

    fn with_condition(mut pod: Pod, type_: &str) -> Pod {
        let status = pod.status.get_or_insert_with(PodStatus::default);
        status
            .conditions
            .get_or_insert_with(Vec::new)
            .push(PodCondition {
                type_: type_.into(),
                status: "True".into(),
                ..PodCondition::default()
            });
        pod
    }

    fn exited(mut pod: Pod, code: i32) -> Pod {
        let status = pod.status.get_or_insert_with(PodStatus::default);
        status.container_statuses = Some(vec![ContainerStatus {
            name: "app".into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]);
        pod
    }

    fn deleting(pod: Pod) -> Pod {
        pod.deleting(now(), Some(30))
    }

    fn without_finalizer(mut pod: Pod) -> Pod {
        pod.metadata.finalizers = None;
        pod
    }

    fn pods(list: Vec<Pod>) -> Vec<Arc<Pod>> {
        list.into_iter().map(Arc::new).collect()
    }

    /// The Job after `plan`'s status was written.
    fn written(mut job: Job, plan: &Plan) -> Job {
        job.status = plan.status.clone();
        job
    }

    fn status(plan: &Plan) -> &JobStatus {
        plan.status.as_ref().expect("a status write")
    }

    fn condition<'a>(status: &'a JobStatus, type_: &str) -> Option<&'a JobCondition> {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_ && c.status == "True")
    }

    fn uncounted_failed(status: &JobStatus) -> Vec<String> {
        let u = status.uncounted_terminated_pods.clone().unwrap_or_default();
        u.failed.unwrap_or_default()
    }

    #[test]
    fn pods_carry_the_job_labels_finalizer_and_controller_reference() {
        let j = job(Some(1), 1).template_labels(&[("app", "batch")]);
        let pod = pod_for(&j);
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("batch-"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["app"], "batch");
        assert_eq!(labels[CONTROLLER_UID_LABEL], "batch-uid");
        assert_eq!(labels[LEGACY_CONTROLLER_UID_LABEL], "batch-uid");
        assert_eq!(labels[JOB_NAME_LABEL], "batch");
        assert_eq!(labels[LEGACY_JOB_NAME_LABEL], "batch");
        assert_eq!(
            pod.metadata.finalizers,
            Some(vec![TRACKING_FINALIZER.into()])
        );
        let owner = controller_of(&pod).unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Job", "batch-uid")
        );
        assert_eq!(pod.spec.unwrap().restart_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn parallelism_is_capped_by_the_remaining_completions() {
        let j = job(Some(5), 2);
        let p = plan(&j, &[], now());
        assert_eq!(p.create, 2);
        assert_eq!(status(&p).active, Some(2));
        assert!(status(&p).start_time.is_some());
        // Four completions counted, one running: nothing more is needed.
        let mut done = j.clone();
        done.status = Some(JobStatus {
            succeeded: Some(4),
            ..JobStatus::default()
        });
        let running = pods(vec![member(&j, "batch-a", "Running")]);
        assert_eq!(plan(&done, &running, now()).create, 0);
        assert_eq!(plan(&done, &[], now()).create, 1);
        // A succeeded pod not yet counted counts already.
        let p = plan(&j, &pods(vec![member(&j, "batch-a", "Succeeded")]), now());
        assert_eq!(p.create, 2);
        let p = plan(
            &done,
            &pods(vec![member(&j, "batch-a", "Succeeded")]),
            now(),
        );
        assert_eq!(p.create, 0);
    }

    #[test]
    fn surplus_pods_are_deleted_not_ready_first_and_nothing_is_created() {
        let j = job(Some(5), 1);
        let ready = member(&j, "batch-a", "Running");
        let pending = member(&j, "batch-b", "Pending");
        let p = plan(&j, &pods(vec![ready, pending]), now());
        assert_eq!(p.delete, vec![("batch-b".into(), "batch-b-uid".into())]);
        assert_eq!(p.create, 0);
        assert_eq!(status(&p).active, Some(1));
        assert_eq!(status(&p).terminating, Some(1));
    }

    #[test]
    fn a_work_queue_job_stops_creating_after_a_success_and_completes_when_all_finished() {
        let j = job(None, 3);
        assert_eq!(plan(&j, &[], now()).create, 3);
        let list = pods(vec![
            member(&j, "batch-a", "Succeeded"),
            member(&j, "batch-b", "Running"),
        ]);
        let p = plan(&j, &list, now());
        assert_eq!((p.create, p.delete.len()), (0, 0));
        assert!(condition(status(&p), SUCCESS_CRITERIA_MET).is_none());
        let list = pods(vec![
            member(&j, "batch-a", "Succeeded"),
            member(&j, "batch-b", "Succeeded"),
        ]);
        let p = plan(&j, &list, now());
        assert!(condition(status(&p), SUCCESS_CRITERIA_MET).is_some());
    }

    #[test]
    fn completion_counts_each_pod_once_then_completes() {
        let j = job(Some(2), 2);
        let finished = vec![
            member(&j, "batch-a", "Succeeded"),
            member(&j, "batch-b", "Succeeded"),
        ];
        let p = plan(&j, &pods(finished.clone()), now());
        let st = status(&p);
        // First the pods are recorded as uncounted and the interim condition written...
        let u = st.uncounted_terminated_pods.clone().unwrap();
        assert_eq!(u.succeeded.unwrap(), vec!["batch-a-uid", "batch-b-uid"]);
        assert_eq!(st.succeeded, Some(0));
        let met = condition(st, SUCCESS_CRITERIA_MET).unwrap();
        assert_eq!(met.reason.as_deref(), Some(REASON_COMPLETIONS_REACHED));
        assert!(condition(st, COMPLETE).is_none());
        assert_eq!(p.remove_finalizer, vec!["batch-a", "batch-b"]);
        // ...a stale cache still showing the finalizers changes nothing...
        let j = written(j, &p);
        assert_eq!(plan(&j, &pods(finished.clone()), now()).status, None);
        // ...and once the finalizers are gone the pods are counted and the Job completes.
        let gone: Vec<Pod> = finished.into_iter().map(without_finalizer).collect();
        let p = plan(&j, &pods(gone.clone()), now());
        let st = status(&p);
        assert_eq!(st.succeeded, Some(2));
        assert!(condition(st, COMPLETE).is_some());
        assert!(st.completion_time.is_some());
        let j = written(j, &p);
        assert!(job_finished(&j));
        assert_eq!(plan(&j, &pods(gone), now()), Plan::default());
    }

    #[test]
    fn exceeding_the_backoff_limit_fails_the_job() {
        let j = job(Some(5), 2).backoff_limit(1);
        let list = pods(vec![
            member(&j, "batch-a", "Failed"),
            member(&j, "batch-b", "Failed"),
            member(&j, "batch-c", "Running"),
        ]);
        let p = plan(&j, &list, now());
        // Two failures > 1: the running pod goes and counts as failed too.
        assert_eq!(p.delete, vec![("batch-c".into(), "batch-c-uid".into())]);
        assert!(p.delete_before_status);
        assert_eq!(p.create, 0);
        let st = status(&p);
        let target = condition(st, FAILURE_TARGET).unwrap();
        assert_eq!(
            target.reason.as_deref(),
            Some(REASON_BACKOFF_LIMIT_EXCEEDED)
        );
        assert!(condition(st, FAILED).is_none(), "pods are still uncounted");
        assert_eq!(uncounted_failed(st).len(), 3);
        // Once every finalizer is gone and no pod terminates, Failed follows.
        let j = written(j, &p);
        let gone = pods(vec![
            without_finalizer(member(&j, "batch-a", "Failed")),
            without_finalizer(member(&j, "batch-b", "Failed")),
        ]);
        let st = plan(&j, &gone, now()).status.unwrap();
        assert_eq!(st.failed, Some(3));
        let failed = condition(&st, FAILED).unwrap();
        assert_eq!(
            failed.reason.as_deref(),
            Some(REASON_BACKOFF_LIMIT_EXCEEDED)
        );
        assert!(st.completion_time.is_none());
    }

    #[test]
    fn failures_within_the_backoff_limit_are_replaced() {
        let j = job(Some(1), 1).backoff_limit(1);
        let p = plan(&j, &pods(vec![member(&j, "batch-a", "Failed")]), now());
        assert_eq!(p.create, 1);
        assert_eq!(uncounted_failed(status(&p)), vec!["batch-a-uid"]);
        assert!(condition(status(&p), FAILURE_TARGET).is_none());
    }

    #[test]
    fn ignore_on_disruption_target_neither_counts_nor_blocks_a_replacement() {
        let j = job(Some(3), 2)
            .backoff_limit(0)
            .failure_rule(on_pod_condition("Ignore", "DisruptionTarget"));
        let running = member(&j, "batch-b", "Running");
        // Evicted, still terminating: with a policy it holds its slot and is not failed yet.
        let evicted = deleting(with_condition(
            member(&j, "batch-a", "Running"),
            "DisruptionTarget",
        ));
        let p = plan(&j, &pods(vec![evicted.clone(), running.clone()]), now());
        assert_eq!(p.create, 0);
        assert!(p.remove_finalizer.is_empty());
        assert_eq!(status(&p).terminating, Some(1));
        // The kubelet made it Failed: ignored, replaced, its finalizer removed.
        let mut failed = evicted;
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let p = plan(&j, &pods(vec![failed, running]), now());
        assert_eq!(p.create, 1);
        assert_eq!(p.remove_finalizer, vec!["batch-a"]);
        let st = status(&p);
        assert!(uncounted_failed(st).is_empty());
        assert_eq!(st.failed, Some(0));
        assert!(
            condition(st, FAILURE_TARGET).is_none(),
            "backoffLimit 0 not hit"
        );
    }

    #[test]
    fn without_a_policy_a_deleted_pod_counts_as_failed_at_once() {
        let j = job(Some(1), 1).backoff_limit(3);
        let evicted = deleting(with_condition(
            member(&j, "batch-a", "Running"),
            "DisruptionTarget",
        ));
        let p = plan(&j, &pods(vec![evicted]), now());
        assert_eq!(p.create, 1, "replaced without waiting");
        assert_eq!(uncounted_failed(status(&p)), vec!["batch-a-uid"]);
        assert_eq!(p.remove_finalizer, vec!["batch-a"]);
    }

    #[test]
    fn fail_job_on_an_exit_code_fails_the_job_with_the_rules_message() {
        let j = job(Some(2), 2).failure_rule(on_exit_codes("FailJob", "In", &[42]));
        let failed = exited(member(&j, "batch-a", "Failed"), 42);
        let running = member(&j, "batch-b", "Running");
        let p = plan(&j, &pods(vec![failed, running]), now());
        assert_eq!(p.delete, vec![("batch-b".into(), "batch-b-uid".into())]);
        let target = condition(status(&p), FAILURE_TARGET).unwrap();
        assert_eq!(target.reason.as_deref(), Some(REASON_POD_FAILURE_POLICY));
        assert_eq!(
            target.message.as_deref(),
            Some(
                "Container app for pod ns/batch-a failed with exit code 42 matching FailJob rule at index 0"
            )
        );
        // Another exit code does not match: counted, replaced.
        let other = exited(member(&j, "batch-a", "Failed"), 1);
        let p = plan(&j, &pods(vec![other]), now());
        assert!(condition(status(&p), FAILURE_TARGET).is_none());
        assert_eq!(uncounted_failed(status(&p)), vec!["batch-a-uid"]);
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let policy = PodFailurePolicy {
            rules: vec![
                on_exit_codes("Count", "NotIn", &[0, 1]),
                on_pod_condition("Ignore", "DisruptionTarget"),
                on_exit_codes("FailJob", "In", &[1]),
            ],
        };
        let j = job(Some(1), 1);
        let m = |pod: &Pod| match_pod_failure_policy(Some(&policy), pod);
        let code2 = exited(member(&j, "a", "Failed"), 2);
        let counted = m(&with_condition(code2, "DisruptionTarget"));
        assert_eq!(
            (counted.counts, counted.action.as_deref()),
            (true, Some("Count"))
        );
        let code1 = exited(member(&j, "a", "Failed"), 1);
        let ignored = m(&with_condition(code1.clone(), "DisruptionTarget"));
        assert_eq!(
            (ignored.counts, ignored.action.as_deref()),
            (false, Some("Ignore"))
        );
        assert!(m(&code1).fail_job.is_some());
        let plain = m(&member(&j, "a", "Failed"));
        assert_eq!((plain.counts, plain.action), (true, None));
        // Exit code 0 never matches an onExitCodes rule.
        assert_eq!(m(&exited(member(&j, "a", "Failed"), 0)).action, None);
    }

    #[test]
    fn pods_no_longer_matching_the_selector_are_released() {
        let j = job(Some(1), 1);
        let mut relabelled = member(&j, "batch-a", "Running");
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(CONTROLLER_UID_LABEL);
        let p = plan(&j, &pods(vec![relabelled]), now());
        assert_eq!(p.release, vec!["batch-a"]);
        assert_eq!(p.create, 1);
    }
}
