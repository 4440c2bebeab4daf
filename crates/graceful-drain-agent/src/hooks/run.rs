//! Running the hooks of a point: one hook's run from start (or resumed record) to done,
//! failed or timed out, with its Events, its steps and its error.

use std::time::Duration;

use super::config::{Hook, HookPoint, Hooks, Target};
use super::context::{HookContext, HookStep};
use super::https::{Answer, CallError, HookAction, HookRequest, HookStatus, post};
use super::record::{HookRecord, RecordState};
use crate::report::EventType;
use graceful_drain_core::labels::{HOOK_API_VERSION, agent_reason};

/// Longest one HTTPS call may take (connect, TLS, answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl Hooks {
    /// Runs the hooks of `point` one after the other; the first that fails (and is not
    /// optional) stops the others and is the error. `on_step` hears where each stands.
    pub async fn run(
        &self,
        point: HookPoint,
        ctx: &HookContext<'_>,
        on_step: &(dyn Fn(Option<HookStep>) + Sync),
    ) -> Result<(), HookError> {
        for hook in self.at(point) {
            let result = hook.run(ctx, on_step).await;
            on_step(None);
            result?;
        }
        Ok(())
    }
}

/// A hook that failed the transition.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The hook answered `failed` (or its Job failed).
    #[error("hook {name} ({at}) failed: {message}")]
    Failed {
        /// The hook's configured name.
        name: String,
        /// The point it ran at.
        at: HookPoint,
        /// The hook's own message.
        message: String,
    },
    /// The hook did not finish within its timeout, counted from its recorded start.
    #[error("hook {name} ({at}) timed out after {after}: {message}")]
    TimedOut {
        /// The hook's configured name.
        name: String,
        /// The point it ran at.
        at: HookPoint,
        /// The configured timeout, human-readable (`10m`).
        after: String,
        /// The last call's error, else the hook's last message.
        message: String,
    },
}

impl Hook {
    fn label(&self) -> String {
        format!("hook {} ({})", self.spec.name, self.spec.at)
    }

    /// The run's record: the one an earlier agent left in progress (`true`: it is polled,
    /// never started again), or a new one, announced by an Event; `None` when this
    /// transition already ran the hook to its end.
    async fn record_for_run(&self, ctx: &HookContext<'_>) -> Option<(HookRecord, bool)> {
        let (name, at) = (&self.spec.name, self.spec.at);
        match self.prior_record(ctx).await {
            Some(record) if record.state == RecordState::Done => {
                tracing::info!(hook = %name, %at, "hook already done for this transition; not run again");
                None
            }
            Some(record)
                if matches!(
                    record.state,
                    RecordState::Starting | RecordState::InProgress
                ) =>
            {
                tracing::info!(hook = %name, %at, id = %record.id, "hook in progress before a restart; polling it");
                Some((record, true))
            }
            _ => {
                let record = HookRecord {
                    at,
                    operation: ctx.operation.to_string(),
                    id: uuid::Uuid::new_v4().simple().to_string(),
                    state: RecordState::Starting,
                    message: String::new(),
                    started_at: jiff::Timestamp::now(),
                    finished_at: None,
                };
                self.write_record(ctx, &record).await;
                let message = format!("{} started", self.label());
                ctx.events
                    .post(EventType::Normal, agent_reason::HOOK_STARTED, "", message)
                    .await;
                Some((record, false))
            }
        }
    }

    /// Says that a call to the hook failed (logged, and a Warning Event); the error's words.
    async fn unreachable(
        &self,
        ctx: &HookContext<'_>,
        error: &(dyn std::error::Error + Send + Sync + 'static),
    ) -> String {
        let (name, at) = (&self.spec.name, self.spec.at);
        let error = graceful_drain_core::error::chain(error).to_string();
        tracing::warn!(hook = %name, %at, %error, "call hook (retrying)");
        let message = format!("{} (retrying): {error}", self.label());
        ctx.events
            .post(
                EventType::Warning,
                agent_reason::HOOK_UNREACHABLE,
                name,
                message,
            )
            .await;
        error
    }

    /// Runs this hook to its end (see the documentation of [`crate::hooks`]).
    async fn run(
        &self,
        ctx: &HookContext<'_>,
        on_step: &(dyn Fn(Option<HookStep>) + Sync),
    ) -> Result<(), HookError> {
        let name = &self.spec.name;
        let at = self.spec.at;
        let step = |message: &str| {
            on_step(Some(HookStep {
                name: name.clone(),
                at,
                message: message.to_string(),
            }))
        };
        let Some((mut record, resumed)) = self.record_for_run(ctx).await else {
            return Ok(());
        };
        step(if record.message.is_empty() {
            "starting"
        } else {
            &record.message
        });
        // A run an earlier agent began is polled, never started again.
        let mut action = if resumed {
            HookAction::Poll
        } else {
            HookAction::Start
        };
        let deadline = deadline_of(&record, self.timeout);
        let mut last_error = String::new();
        loop {
            let left = until(deadline);
            if left.is_zero() {
                let message = if last_error.is_empty() {
                    record.message.clone()
                } else {
                    last_error
                };
                return self.timed_out(ctx, record, message).await;
            }
            let answer =
                tokio::time::timeout(left.min(CALL_TIMEOUT), self.call(action, ctx, &record.id))
                    .await;
            // Whatever came of a start, the next call polls: a start that may have
            // reached the hook is never sent twice (a poll the hook does not know is
            // answered 404 and starts it then).
            let sent = action;
            action = HookAction::Poll;
            match answer {
                Ok(Ok(Answer::Said(response))) => match response.status {
                    HookStatus::Done => {
                        return self.finished(ctx, record, true, response.message).await;
                    }
                    HookStatus::Failed => {
                        return self.finished(ctx, record, false, response.message).await;
                    }
                    HookStatus::InProgress => {
                        last_error.clear();
                        if record.state != RecordState::InProgress
                            || record.message != response.message
                        {
                            record.state = RecordState::InProgress;
                            record.message = response.message;
                            self.write_record(ctx, &record).await;
                            step(&record.message);
                        }
                    }
                },
                Ok(Ok(Answer::Unknown)) => {
                    tracing::info!(hook = %name, %at, id = %record.id, "the hook does not know this run; starting it");
                    action = HookAction::Start;
                    if sent == HookAction::Poll {
                        continue;
                    }
                }
                Ok(Err(error)) => last_error = self.unreachable(ctx, &error).await,
                Err(_) => {
                    last_error = format!("no answer within {:?}", left.min(CALL_TIMEOUT));
                    tracing::warn!(hook = %name, %at, error = %last_error, "call hook (retrying)");
                }
            }
            tokio::time::sleep(self.poll_interval.min(until(deadline))).await;
        }
    }

    async fn finished(
        &self,
        ctx: &HookContext<'_>,
        mut record: HookRecord,
        ok: bool,
        message: String,
    ) -> Result<(), HookError> {
        record.state = if ok {
            RecordState::Done
        } else {
            RecordState::Failed
        };
        record.message = message.clone();
        let now = jiff::Timestamp::now();
        record.finished_at = Some(now);
        self.write_record(ctx, &record).await;
        let took = now.duration_since(record.started_at).as_secs();
        if ok {
            let text = format!("{} done after {took}s: {message}", self.label());
            ctx.events
                .post(EventType::Normal, agent_reason::HOOK_SUCCEEDED, "", text)
                .await;
            return Ok(());
        }
        let error = HookError::Failed {
            name: self.spec.name.clone(),
            at: self.spec.at,
            message,
        };
        self.fail(ctx, error).await
    }

    async fn timed_out(
        &self,
        ctx: &HookContext<'_>,
        mut record: HookRecord,
        message: String,
    ) -> Result<(), HookError> {
        if let Target::Job(job) = &self.target {
            self.delete_job(ctx, job, &record.id).await;
        }
        let after = humantime::format_duration(self.timeout).to_string();
        record.state = RecordState::Failed;
        record.message = format!("timed out after {after}: {message}");
        record.finished_at = Some(jiff::Timestamp::now());
        self.write_record(ctx, &record).await;
        let error = HookError::TimedOut {
            name: self.spec.name.clone(),
            at: self.spec.at,
            after,
            message,
        };
        self.fail(ctx, error).await
    }

    async fn fail(&self, ctx: &HookContext<'_>, error: HookError) -> Result<(), HookError> {
        if self.spec.optional {
            let text = format!("{error}; optional, continuing");
            tracing::warn!(hook = %self.spec.name, "{text}");
            ctx.events
                .post(EventType::Warning, agent_reason::HOOK_FAILED, "", text)
                .await;
            return Ok(());
        }
        tracing::warn!(hook = %self.spec.name, error = %error, "hook failed the transition");
        ctx.events
            .post(
                EventType::Warning,
                agent_reason::HOOK_FAILED,
                "",
                error.to_string(),
            )
            .await;
        Err(error)
    }

    async fn call(
        &self,
        action: HookAction,
        ctx: &HookContext<'_>,
        id: &str,
    ) -> Result<Answer, CallError> {
        match &self.target {
            Target::Https { uri, client } => {
                let request = HookRequest {
                    api_version: HOOK_API_VERSION.into(),
                    kind: "HookRequest".into(),
                    action,
                    id: id.to_string(),
                    hook: self.spec.name.clone(),
                    at: self.spec.at,
                    node: ctx.node.to_string(),
                    lifecycle_event: ctx.event.map(str::to_string),
                };
                post(client, uri, &request).await
            }
            Target::Job(job) => match action {
                HookAction::Start => self.start_job(ctx, job, id).await,
                HookAction::Poll => self.poll_job(ctx, job, id).await,
            },
        }
    }
}

fn deadline_of(record: &HookRecord, timeout: Duration) -> jiff::Timestamp {
    let timeout = jiff::SignedDuration::try_from(timeout).unwrap_or(jiff::SignedDuration::MAX);
    record
        .started_at
        .checked_add(timeout)
        .unwrap_or(jiff::Timestamp::MAX)
}

/// Time left until `deadline` (zero once it passed).
fn until(deadline: jiff::Timestamp) -> Duration {
    let left = deadline.duration_since(jiff::Timestamp::now());
    Duration::try_from(left).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_counts_from_the_recorded_start() {
        let started: jiff::Timestamp = "2025-01-15T08:00:00Z".parse().unwrap();
        let record = HookRecord {
            at: HookPoint::BeforeEviction,
            operation: "drain-w1".into(),
            id: "a".into(),
            state: RecordState::InProgress,
            message: String::new(),
            started_at: started,
            finished_at: None,
        };
        let deadline = deadline_of(&record, Duration::from_secs(600));
        assert_eq!(deadline.to_string(), "2025-01-15T08:10:00Z");
        assert_eq!(
            until(started),
            Duration::ZERO,
            "a past deadline leaves nothing"
        );
    }
}
