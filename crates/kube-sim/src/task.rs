//! Owned tasks: every long-lived task of the simulated cluster is started here, so none
//! dies unnoticed.
//!
//! [`spawn_owned`] names the task, runs it inside a tracing span of that name, and
//! cancels the cluster's token when the task fails or panics: the rest of the cluster
//! then stops instead of running on without it. A task that returns `Ok` has simply
//! finished (usually because the token was cancelled).

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Spawns `task` as `name`, cancelling `stop` if it returns an error or panics.
pub(crate) fn spawn_owned<F, E>(
    name: &'static str,
    stop: CancellationToken,
    task: F,
) -> JoinHandle<()>
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    let span = tracing::info_span!("task", task = name);
    let supervised = async move {
        let failure = match AssertUnwindSafe(task).catch_unwind().await {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(format!("{error:#}")),
            Err(_) => Some("panicked".to_string()),
        };
        match failure {
            None if stop.is_cancelled() => {}
            None => tracing::debug!("task finished"),
            Some(error) => {
                tracing::error!(%error, "task failed; stopping the cluster");
                stop.cancel();
            }
        }
    };
    tokio::spawn(supervised.instrument(span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_or_panicking_task_cancels_the_token() {
        let stop = CancellationToken::new();
        let ok = spawn_owned("ok", stop.clone(), async { Ok::<(), String>(()) });
        ok.await.unwrap();
        assert!(!stop.is_cancelled());
        let failed = spawn_owned("failed", stop.clone(), async { Err("boom".to_string()) });
        failed.await.unwrap();
        assert!(stop.is_cancelled());

        let stop = CancellationToken::new();
        let panicked = spawn_owned("panicked", stop.clone(), async {
            panic!("boom");
            #[allow(unreachable_code)]
            Ok::<(), String>(())
        });
        panicked.await.unwrap();
        assert!(stop.is_cancelled());
    }
}
