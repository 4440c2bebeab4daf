//! The reconciler's decision, as a pure function: one event, its transition, the node's
//! `LifecycleTransition` condition, the time and whether the driver's plugin is
//! registered go in; one [`Action`] comes out. No I/O here, so every branch of docs/design.md §3
//! is a row in the table tests below.
//!
//! The one deliberate difference from the kubelet: the Node condition counts for an event
//! only once that event's Start was called (recorded on the event by the reconciler) and
//! the condition changed at or after that call. A condition left over from an earlier
//! event, even one showing this transition's end reason, never completes a new event.

use jiff::Timestamp;

use graceful_drain_core::lifecycle::ClaimStatus;

/// The parts of a LifecycleEvent the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventView {
    /// `status.claimStatus`, `Pending` when unset.
    pub claim: ClaimStatus,
    /// `status.sla` parsed; `None` for a claimed event means no deadline.
    pub sla_deadline: Option<Timestamp>,
    /// When the reconciler called Start for this event (the started annotation).
    pub started_at: Option<Timestamp>,
    /// The event is being deleted (a user cancelled it).
    pub deleting: bool,
}

/// The parts of the LifecycleTransition the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitionView {
    /// `spec.start`: the condition reason while the transition runs.
    pub start: String,
    /// `spec.end`: the condition reason once the transition is done.
    pub end: String,
    /// `spec.sla` parsed; `None` when unset.
    pub sla: Option<std::time::Duration>,
    /// The transition applies to the event's node.
    pub targets_node: bool,
}

/// The Node condition of type `LifecycleTransition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionView {
    /// The condition's reason: a transition's start or end reason, or anything else.
    pub reason: String,
    /// `lastTransitionTime` (whole seconds); `None` when unset.
    pub last_transition: Option<Timestamp>,
}

/// Everything one decision needs.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// The event decided on.
    pub event: &'a EventView,
    /// `None` when the transition does not exist (or its SLA does not parse).
    pub transition: Option<&'a TransitionView>,
    /// The Node's `LifecycleTransition` condition; `None` when the Node has none.
    pub condition: Option<&'a ConditionView>,
    /// The time the decision is made at (SLA deadlines are compared with it).
    pub now: Timestamp,
    /// The transition's driver answered GetInfo on its registration socket.
    pub plugin_registered: bool,
    /// Another event bound to the same node is Claimed.
    pub other_claimed: bool,
}

/// Why an event is left as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// Another event on this node is being driven (at most one Claimed per node).
    OtherClaimed,
    /// The LifecycleTransition named by the event does not exist (yet).
    TransitionMissing,
    /// The transition does not target the event's node.
    NotTargeted,
    /// No plugin registered for the transition's driver.
    PluginNotRegistered,
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OtherClaimed => "another event on this node is claimed",
            Self::TransitionMissing => "the transition does not exist",
            Self::NotTargeted => "the transition does not apply to this node",
            Self::PluginNotRegistered => "the transition's driver is not registered",
        })
    }
}

/// What to do with one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leave it.
    Wait(WaitReason),
    /// Add the finalizer, then compare-and-swap the status to Claimed with this deadline.
    Claim {
        /// Now plus the transition's SLA; `None` when the transition sets no SLA (no
        /// deadline).
        sla: Option<Timestamp>,
    },
    /// Call StartLifecycleTransition.
    Start,
    /// Call EndLifecycleTransition (poll).
    End,
    /// The deadline passed: call End with `sla_expired`, then conclude SlaExpired.
    Expire,
    /// The event is being deleted while claimed: tell the driver to stop (End with
    /// `sla_expired`), then release it.
    Cancel,
    /// Write this terminal status, then finalize.
    Conclude(ClaimStatus),
    /// Terminal: remove the finalizer and delete the event.
    Finalize,
}

/// Decides the next step for one event.
pub fn decide(input: &Input<'_>) -> Action {
    let event = input.event;
    match event.claim {
        status if status.is_terminal() => Action::Finalize,
        ClaimStatus::Pending => decide_pending(input),
        _ => decide_claimed(input),
    }
}

fn decide_pending(input: &Input<'_>) -> Action {
    if input.event.deleting {
        return Action::Finalize;
    }
    if input.other_claimed {
        return Action::Wait(WaitReason::OtherClaimed);
    }
    let Some(transition) = input.transition else {
        return Action::Wait(WaitReason::TransitionMissing);
    };
    if !transition.targets_node {
        return Action::Wait(WaitReason::NotTargeted);
    }
    if !input.plugin_registered {
        return Action::Wait(WaitReason::PluginNotRegistered);
    }
    let sla = transition
        .sla
        .and_then(|d| jiff::SignedDuration::try_from(d).ok())
        .and_then(|d| input.now.checked_add(d).ok());
    Action::Claim { sla }
}

fn decide_claimed(input: &Input<'_>) -> Action {
    let event = input.event;
    if event.deleting {
        return Action::Cancel;
    }
    if event
        .sla_deadline
        .is_some_and(|deadline| input.now > deadline)
    {
        return Action::Expire;
    }
    let Some(transition) = input.transition else {
        // Deleted while claimed: nothing can tell us what "done" means any more.
        return Action::Conclude(ClaimStatus::Failed);
    };
    if !input.plugin_registered {
        // A driver restarting mid-transition (a DaemonSet rollout) is not a failure;
        // the SLA bounds the wait.
        return Action::Wait(WaitReason::PluginNotRegistered);
    }
    let Some(started_at) = event.started_at else {
        return Action::Start;
    };
    let fresh = input
        .condition
        .filter(|c| condition_is_fresh(c, started_at));
    match fresh {
        Some(c) if c.reason == transition.end => Action::Conclude(ClaimStatus::Succeeded),
        Some(c) if c.reason == transition.start => Action::End,
        _ => Action::Start,
    }
}

/// A condition belongs to this event when it changed at or after the event's Start call.
/// Condition times have whole-second precision, so compare whole seconds.
fn condition_is_fresh(condition: &ConditionView, started_at: Timestamp) -> bool {
    condition
        .last_transition
        .is_some_and(|t| t.as_second() >= started_at.as_second())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use ClaimStatus::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn transition() -> TransitionView {
        TransitionView {
            start: "drain-started".into(),
            end: "drain-complete".into(),
            sla: Some(Duration::from_secs(300)),
            targets_node: true,
        }
    }

    fn cond(reason: &str, at: i64) -> ConditionView {
        ConditionView {
            reason: reason.into(),
            last_transition: Some(ts(at)),
        }
    }

    struct Row {
        name: &'static str,
        claim: ClaimStatus,
        deadline: Option<i64>,
        started: Option<i64>,
        deleting: bool,
        transition: Option<TransitionView>,
        condition: Option<ConditionView>,
        registered: bool,
        other_claimed: bool,
        want: Action,
    }

    fn row(name: &'static str, claim: ClaimStatus, want: Action) -> Row {
        Row {
            name,
            claim,
            deadline: Some(200),
            started: None,
            deleting: false,
            transition: Some(transition()),
            condition: None,
            registered: true,
            other_claimed: false,
            want,
        }
    }

    #[test]
    fn decision_table() {
        let now = 100;
        let untargeted = TransitionView {
            targets_node: false,
            ..transition()
        };
        let no_sla = TransitionView {
            sla: None,
            ..transition()
        };
        let rows = [
            // Pending
            Row {
                deadline: None,
                ..row(
                    "pending claims with now + sla",
                    Pending,
                    Action::Claim { sla: Some(ts(400)) },
                )
            },
            Row {
                deadline: None,
                transition: Some(no_sla),
                ..row(
                    "transition without sla claims without deadline",
                    Pending,
                    Action::Claim { sla: None },
                )
            },
            Row {
                registered: false,
                ..row(
                    "no plugin leaves pending",
                    Pending,
                    Action::Wait(WaitReason::PluginNotRegistered),
                )
            },
            Row {
                other_claimed: true,
                ..row(
                    "one claimed per node",
                    Pending,
                    Action::Wait(WaitReason::OtherClaimed),
                )
            },
            Row {
                transition: None,
                ..row(
                    "missing transition leaves pending",
                    Pending,
                    Action::Wait(WaitReason::TransitionMissing),
                )
            },
            Row {
                transition: Some(untargeted),
                ..row(
                    "transition for other nodes",
                    Pending,
                    Action::Wait(WaitReason::NotTargeted),
                )
            },
            Row {
                deleting: true,
                ..row(
                    "deleted pending event is released",
                    Pending,
                    Action::Finalize,
                )
            },
            // Claimed, not started
            row(
                "claimed and never started calls start",
                Claimed,
                Action::Start,
            ),
            Row {
                condition: Some(cond("drain-complete", 50)),
                ..row(
                    "stale end reason does not count before start",
                    Claimed,
                    Action::Start,
                )
            },
            Row {
                condition: Some(cond("drain-started", 50)),
                ..row(
                    "stale start reason does not count before start",
                    Claimed,
                    Action::Start,
                )
            },
            // Claimed, started
            Row {
                started: Some(90),
                condition: Some(cond("drain-started", 90)),
                ..row("start reason calls end", Claimed, Action::End)
            },
            Row {
                started: Some(90),
                condition: Some(cond("drain-complete", 95)),
                ..row("end reason succeeds", Claimed, Action::Conclude(Succeeded))
            },
            Row {
                started: Some(90),
                condition: Some(cond("drain-complete", 80)),
                ..row(
                    "end reason older than start is stale",
                    Claimed,
                    Action::Start,
                )
            },
            Row {
                started: Some(90),
                condition: Some(cond("uncordoning", 95)),
                ..row("other reason calls start", Claimed, Action::Start)
            },
            Row {
                started: Some(90),
                condition: None,
                ..row(
                    "no condition after start calls start",
                    Claimed,
                    Action::Start,
                )
            },
            Row {
                started: Some(90),
                condition: Some(ConditionView {
                    reason: "drain-complete".into(),
                    last_transition: None,
                }),
                ..row(
                    "condition without time is not trusted",
                    Claimed,
                    Action::Start,
                )
            },
            // Claimed, deadline and driver
            Row {
                deadline: Some(99),
                started: Some(90),
                condition: Some(cond("drain-started", 90)),
                ..row("sla passed expires", Claimed, Action::Expire)
            },
            Row {
                deadline: Some(99),
                started: Some(90),
                condition: Some(cond("drain-complete", 95)),
                ..row("sla passed wins over success", Claimed, Action::Expire)
            },
            Row {
                deadline: Some(100),
                ..row(
                    "deadline equal to now is not passed",
                    Claimed,
                    Action::Start,
                )
            },
            Row {
                deadline: None,
                ..row(
                    "claimed without deadline never expires",
                    Claimed,
                    Action::Start,
                )
            },
            Row {
                registered: false,
                started: Some(90),
                ..row(
                    "driver away while claimed waits",
                    Claimed,
                    Action::Wait(WaitReason::PluginNotRegistered),
                )
            },
            Row {
                transition: None,
                ..row(
                    "transition deleted while claimed fails",
                    Claimed,
                    Action::Conclude(Failed),
                )
            },
            Row {
                deleting: true,
                ..row("deleting claimed event cancels", Claimed, Action::Cancel)
            },
            Row {
                other_claimed: true,
                ..row(
                    "claimed event is driven regardless of others",
                    Claimed,
                    Action::Start,
                )
            },
            // Terminal
            row("succeeded finalizes", Succeeded, Action::Finalize),
            row("failed finalizes", Failed, Action::Finalize),
            row("sla expired finalizes", SlaExpired, Action::Finalize),
        ];
        for r in rows {
            let event = EventView {
                claim: r.claim,
                sla_deadline: r.deadline.map(ts),
                started_at: r.started.map(ts),
                deleting: r.deleting,
            };
            let input = Input {
                event: &event,
                transition: r.transition.as_ref(),
                condition: r.condition.as_ref(),
                now: ts(now),
                plugin_registered: r.registered,
                other_claimed: r.other_claimed,
            };
            assert_eq!(decide(&input), r.want, "{}", r.name);
        }
    }

    #[test]
    fn freshness_compares_whole_seconds() {
        // Start called at .7 s, condition written in the same second shows .0 s.
        let started = ts(10)
            .checked_add(jiff::SignedDuration::from_millis(700))
            .unwrap();
        assert!(condition_is_fresh(&cond("x", 10), started));
        assert!(!condition_is_fresh(&cond("x", 9), started));
    }
}
