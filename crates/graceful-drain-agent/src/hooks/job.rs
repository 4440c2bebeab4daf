//! Job hooks: the Job a hook run creates on the node, and reading its conditions as the
//! hook's answer.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{EnvVar, Toleration};
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};

use super::config::{Hook, HookSpec, JobSpec};
use super::context::HookContext;
use super::https::{Answer, CallError, HookResponse, HookStatus};
use crate::node::API_TIMEOUT;

/// A finished hook Job is kept this long (unless its template says) for `kubectl logs`.
const JOB_TTL_SECONDS: i32 = 86_400;

impl Hook {
    fn job_name(&self, id: &str) -> String {
        format!("gd-{}-{}", self.spec.name, &id[..id.len().min(8)])
    }

    pub(super) async fn start_job(
        &self,
        ctx: &HookContext<'_>,
        spec: &JobSpec,
        id: &str,
    ) -> Result<Answer, CallError> {
        let name = self.job_name(id);
        let job = job_for(spec, &name, &self.spec, ctx.node, ctx.event);
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &spec.namespace);
        let what = format!("create job {}/{name}", spec.namespace);
        match bounded(what, api.create(&PostParams::default(), &job)).await {
            Ok(_) => {}
            // Created by the start before a restart: it is this run's Job.
            Err(CallError::Kube {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 409 => {}
            Err(error) => return Err(error),
        }
        Ok(Answer::Said(HookResponse {
            status: HookStatus::InProgress,
            message: format!("job {}/{name} created", spec.namespace),
        }))
    }

    pub(super) async fn poll_job(
        &self,
        ctx: &HookContext<'_>,
        spec: &JobSpec,
        id: &str,
    ) -> Result<Answer, CallError> {
        let name = self.job_name(id);
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &spec.namespace);
        let what = format!("read job {}/{name}", spec.namespace);
        let Some(job) = bounded(what, api.get_opt(&name)).await? else {
            return Ok(Answer::Unknown);
        };
        Ok(Answer::Said(job_progress(&job, &spec.namespace, &name)))
    }

    pub(super) async fn delete_job(&self, ctx: &HookContext<'_>, spec: &JobSpec, id: &str) {
        let name = self.job_name(id);
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), &spec.namespace);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match tokio::time::timeout(API_TIMEOUT, api.delete(&name, &params)).await {
            // Gone already: nothing to clean up.
            Ok(Ok(_)) => {}
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => {}
            Ok(Err(error)) => {
                tracing::warn!(job = %name, error = %graceful_drain_core::error::chain(&error), "delete timed-out hook job")
            }
            Err(_) => tracing::warn!(job = %name, "delete timed-out hook job: timed out"),
        }
    }
}

/// `call` within [`API_TIMEOUT`]; `what` names it in errors.
async fn bounded<T>(
    what: String,
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(CallError::Kube { what, source }),
        Err(_) => Err(CallError::Transport(format!("{what}: timed out"))),
    }
}

/// The Job a hook run creates: the template's, named `name`, pinned to the node,
/// tolerating its cordon, labelled with the hook, and told where it runs.
fn job_for(spec: &JobSpec, name: &str, hook: &HookSpec, node: &str, event: Option<&str>) -> Job {
    let mut metadata = spec.template.metadata.clone().unwrap_or_default();
    metadata.name = Some(name.to_string());
    metadata.namespace = Some(spec.namespace.clone());
    let labels = metadata.labels.get_or_insert_with(Default::default);
    labels.insert(
        graceful_drain_core::labels::HOOK_LABEL.into(),
        hook.name.clone(),
    );
    let mut job_spec = spec.template.spec.clone().unwrap_or_default();
    if job_spec.ttl_seconds_after_finished.is_none() {
        job_spec.ttl_seconds_after_finished = Some(JOB_TTL_SECONDS);
    }
    let pod = &mut job_spec.template;
    pod.metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            graceful_drain_core::labels::HOOK_LABEL.into(),
            hook.name.clone(),
        );
    let pod_spec = pod.spec.get_or_insert_with(Default::default);
    pod_spec.node_name = Some(node.to_string());
    if pod_spec.restart_policy.is_none() {
        pod_spec.restart_policy = Some("Never".into());
    }
    pod_spec
        .tolerations
        .get_or_insert_with(Vec::new)
        .push(Toleration {
            key: Some("node.kubernetes.io/unschedulable".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        });
    let env = [
        ("GRACEFUL_DRAIN_NODE", node.to_string()),
        ("GRACEFUL_DRAIN_HOOK_AT", hook.at.name().to_string()),
        (
            "GRACEFUL_DRAIN_LIFECYCLE_EVENT",
            event.unwrap_or_default().to_string(),
        ),
    ];
    for container in &mut pod_spec.containers {
        let vars = container.env.get_or_insert_with(Vec::new);
        for (key, value) in &env {
            vars.retain(|v| v.name != *key);
            vars.push(EnvVar {
                name: (*key).to_string(),
                value: Some(value.clone()),
                ..EnvVar::default()
            });
        }
    }
    Job {
        metadata,
        spec: Some(job_spec),
        status: None,
    }
}

/// A Job's progress as a hook answer: `Complete` (or `SuccessCriteriaMet`) is done,
/// `Failed` is failed, anything else in progress.
fn job_progress(job: &Job, namespace: &str, name: &str) -> HookResponse {
    let status = job.status.as_ref();
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let is = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if let Some(failed) = is("Failed") {
        let why = failed
            .message
            .clone()
            .or_else(|| failed.reason.clone())
            .unwrap_or_default();
        return HookResponse {
            status: HookStatus::Failed,
            message: format!("job {namespace}/{name} failed: {why}"),
        };
    }
    if is("Complete").is_some() || is("SuccessCriteriaMet").is_some() {
        return HookResponse {
            status: HookStatus::Done,
            message: format!("job {namespace}/{name} complete"),
        };
    }
    let active = status.and_then(|s| s.active).unwrap_or(0);
    HookResponse {
        status: HookStatus::InProgress,
        message: format!("job {namespace}/{name}: {active} active"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use graceful_drain_core::labels::HOOK_LABEL;
    use serde_json::json;

    fn job_spec() -> JobSpec {
        serde_json::from_value(json!({"namespace": "ops", "template": {
            "metadata": {"labels": {"team": "infra"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "a", "image": "busybox", "env": [{"name": "GRACEFUL_DRAIN_NODE", "value": "stale"}]},
                {"name": "b", "image": "busybox"}]}}}}}))
        .unwrap()
    }

    #[test]
    fn a_hook_job_is_pinned_to_the_node_and_told_where_it_runs() {
        let spec = job_spec();
        let hook: HookSpec =
            serde_json::from_value(json!({"name": "report", "at": "after-last-pod",
            "job": serde_json::to_value(&spec).unwrap()}))
            .unwrap();
        let job = job_for(&spec, "gd-report-0123abcd", &hook, "w1", Some("drain-w1"));
        let value = serde_json::to_value(&job).unwrap();
        assert_eq!(value["metadata"]["name"], "gd-report-0123abcd");
        assert_eq!(value["metadata"]["namespace"], "ops");
        assert_eq!(
            value["metadata"]["labels"],
            json!({"team": "infra", HOOK_LABEL: "report"})
        );
        assert_eq!(value["spec"]["ttlSecondsAfterFinished"], JOB_TTL_SECONDS);
        let pod = &value["spec"]["template"]["spec"];
        assert_eq!(pod["nodeName"], "w1");
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(
            pod["tolerations"][0]["key"],
            "node.kubernetes.io/unschedulable"
        );
        for container in pod["containers"].as_array().unwrap() {
            let env: BTreeMap<String, String> = container["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap().into(),
                        e["value"].as_str().unwrap().into(),
                    )
                })
                .collect();
            assert_eq!(
                env["GRACEFUL_DRAIN_NODE"], "w1",
                "ours replaces the template's"
            );
            assert_eq!(env["GRACEFUL_DRAIN_HOOK_AT"], "after-last-pod");
            assert_eq!(env["GRACEFUL_DRAIN_LIFECYCLE_EVENT"], "drain-w1");
            assert_eq!(env.len(), 3);
        }
    }

    #[test]
    fn a_jobs_conditions_are_its_answer() {
        let job = |conditions: serde_json::Value, active: i32| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j"}, "status": {"conditions": conditions, "active": active}}))
                .unwrap()
        };
        let answer = |j: &Job| job_progress(j, "ops", "j");
        assert_eq!(answer(&job(json!([]), 1)).status, HookStatus::InProgress);
        assert_eq!(answer(&job(json!([]), 1)).message, "job ops/j: 1 active");
        let done = job(json!([{"type": "Complete", "status": "True"}]), 0);
        assert_eq!(answer(&done).status, HookStatus::Done);
        let criteria = job(json!([{"type": "SuccessCriteriaMet", "status": "True"}]), 0);
        assert_eq!(answer(&criteria).status, HookStatus::Done);
        let failed = job(
            json!([{"type": "FailureTarget", "status": "True"},
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]),
            0,
        );
        assert_eq!(
            answer(&failed),
            HookResponse {
                status: HookStatus::Failed,
                message: "job ops/j failed: DeadlineExceeded".into()
            }
        );
        let not_yet = job(json!([{"type": "Complete", "status": "False"}]), 0);
        assert_eq!(answer(&not_yet).status, HookStatus::InProgress);
    }
}
