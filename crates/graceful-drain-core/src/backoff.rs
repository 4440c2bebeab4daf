//! The one backoff of every retry loop in graceful-drain: a pause that doubles after each
//! failure from a first value up to a cap, optionally spread at random so that many
//! callers blocked by the same cause (a PodDisruptionBudget, an API server restart) do not
//! come back in lockstep.
//!
//! The schedule is backon's exponential one, the same crate kube-runtime's watchers back
//! off with. A loop owns one [`Backoff`], asks it for the next pause after a failure
//! ([`Backoff::next_pause`] or [`Backoff::wait`]) and resets it after a success when the
//! loop goes on; how many attempts to make and what to do on cancellation stay with the
//! loop, because they differ (a deadline, a shutdown signal, a fixed attempt budget).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Doubling pauses between attempts, capped; see the module docs.
#[derive(Debug)]
pub struct Backoff {
    policy: ExponentialBuilder,
    pauses: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// Pauses of `first`, `2 × first`, `4 × first`… never longer than `max` (a `first`
    /// above `max` is lowered to it).
    pub fn new(first: Duration, max: Duration) -> Self {
        let first = first.min(max);
        let policy = ExponentialBuilder::new()
            .with_min_delay(first)
            .with_max_delay(max)
            .without_max_times();
        Self::from_policy(policy, max)
    }

    /// Like [`Backoff::new`], but each pause is drawn at random from the upper half of the
    /// plain schedule's pause (`[d/2, d)`), so callers that failed together spread out
    /// while none waits longer than the plain schedule would.
    pub fn jittered(first: Duration, max: Duration) -> Self {
        // backon's jitter adds up to one more pause on top: halving both ends of the
        // schedule first makes the drawn pause land in the upper half of ours.
        let first = first.min(max);
        let policy = ExponentialBuilder::new()
            .with_min_delay(first / 2)
            .with_max_delay(max / 2)
            .with_jitter()
            .without_max_times();
        Self::from_policy(policy, max)
    }

    fn from_policy(policy: ExponentialBuilder, max: Duration) -> Self {
        Self {
            pauses: policy.build(),
            policy,
            max,
        }
    }

    /// The pause to take after the failure just seen; each call moves one step along the
    /// schedule.
    pub fn next_pause(&mut self) -> Duration {
        // The schedule has no attempt limit, so it never runs out; the cap is the answer
        // should it ever do.
        self.pauses.next().unwrap_or(self.max).min(self.max)
    }

    /// Sleeps the next pause and returns how long it was.
    pub async fn wait(&mut self) -> Duration {
        let pause = self.next_pause();
        tokio::time::sleep(pause).await;
        pause
    }

    /// Starts the schedule over from its first pause, after a success.
    pub fn reset(&mut self) {
        self.pauses = self.policy.build();
    }

    /// The pause after `failures` failures in a row (the first pause after one), for a
    /// caller that keeps a count rather than a [`Backoff`]; `None` before any failure.
    pub fn after_failures(mut self, failures: u32) -> Option<Duration> {
        // The cap is reached long before 64 doublings of any pause we use.
        let mut pause = None;
        for _ in 0..failures.min(64) {
            pause = Some(self.next_pause());
        }
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn pauses_double_up_to_the_cap_and_start_over_after_a_reset() {
        let mut backoff = Backoff::new(S(1), S(30));
        let seen: Vec<_> = (0..7).map(|_| backoff.next_pause()).collect();
        assert_eq!(seen, [S(1), S(2), S(4), S(8), S(16), S(30), S(30)]);
        backoff.reset();
        assert_eq!(backoff.next_pause(), S(1));
    }

    #[test]
    fn a_count_of_failures_maps_to_the_same_pause_as_the_schedule() {
        let after = |n| Backoff::new(S(1), S(10)).after_failures(n);
        assert_eq!(after(0), None);
        let seen: Vec<_> = [1, 2, 3, 4, 5, 1000]
            .map(|n| after(n).unwrap_or_default())
            .into();
        assert_eq!(seen, [S(1), S(2), S(4), S(8), S(10), S(10)]);
    }

    #[test]
    fn a_first_pause_above_the_cap_is_the_cap() {
        let mut backoff = Backoff::new(S(60), S(15));
        assert_eq!(backoff.next_pause(), S(15));
        assert_eq!(backoff.next_pause(), S(15));
    }

    #[test]
    fn jittered_pauses_stay_in_the_upper_half_of_the_plain_schedule() {
        for _ in 0..200 {
            let mut plain = Backoff::new(S(1), S(15));
            let mut jittered = Backoff::jittered(S(1), S(15));
            for _ in 0..8 {
                let (whole, drawn) = (plain.next_pause(), jittered.next_pause());
                assert!(
                    drawn >= whole / 2 && drawn <= whole,
                    "{drawn:?} outside [{:?}, {whole:?}]",
                    whole / 2
                );
            }
        }
    }

    #[test]
    fn jittered_pauses_of_callers_that_failed_together_differ() {
        let firsts: std::collections::BTreeSet<_> = (0..20)
            .map(|_| Backoff::jittered(S(8), S(8)).next_pause())
            .collect();
        assert!(firsts.len() > 1, "20 callers drew one pause: {firsts:?}");
    }
}
