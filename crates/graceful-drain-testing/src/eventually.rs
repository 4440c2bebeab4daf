//! The one wait of the tests for a state that no event announces: a component's memory, an
//! HTTP endpoint, a condition on an object read through a client that does not watch.
//! Where an event can be awaited (a watch, a recorded request — see
//! `graceful_drain_e2e::sim_api::SimApi::until`) a test awaits it instead.
//!
//! The check runs at once, then every [`POLL`] until it holds; past the deadline the test
//! fails with what it waited for and the last value seen.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

/// How long a test waits for something before it fails: far above what any step takes on
/// a loaded 2-core machine, well below a hung test's cost.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// How often the check runs: often enough that a test is not slowed by its waits, rare
/// enough to leave the machine to the code under test.
pub const POLL: Duration = Duration::from_millis(20);

/// Waits until `check` holds, within [`DEADLINE`]; panics naming `what` otherwise.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_some(what, DEADLINE, || {
        let checked = check();
        async move { checked.await.then_some(()).ok_or("not yet") }
    })
    .await
}

/// Waits until `check` answers `Ok`, within `deadline`, and returns that answer; panics
/// naming `what` and showing the last `Err` otherwise.
pub async fn eventually_some<T, E, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) => assert!(
                tokio::time::Instant::now() < until,
                "timed out after {deadline:?} waiting for {what}; last seen: {last:?}"
            ),
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_check_that_comes_true_ends_the_wait_with_its_answer() {
        let mut calls = 0;
        let seen = eventually_some("the third call", DEADLINE, || {
            calls += 1;
            let answer = if calls == 3 { Ok(calls) } else { Err(calls) };
            async move { answer }
        })
        .await;
        assert_eq!(seen, 3);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting for a never-true check; last seen: \"not yet\"")]
    async fn a_check_that_never_holds_fails_the_test_naming_what_it_waited_for() {
        eventually("a never-true check", || async { false }).await;
    }
}
