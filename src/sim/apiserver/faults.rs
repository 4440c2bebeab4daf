//! Fault injection: the ways a real API server under load misbehaves, so tests show
//! that our clients cope. Every fault is off by default.
//!
//! * Throttling as API Priority and Fairness does it (staging/src/k8s.io/apiserver/pkg/
//!   server/filters/priority-and-fairness.go): a share of resource requests is answered
//!   429 `TooManyRequests` with `Retry-After`. Requests of `system:masters` are exempt,
//!   like upstream's mandatory `exempt` FlowSchema.
//! * Added latency before every resource request is served.
//! * Watch streams cut with an ERROR event carrying a 410 Gone Status (what a client sees
//!   when etcd compacted past its resourceVersion), which forces a relist.
//!
//! Random choices come from one generator seeded by [`Faults::seed`], so a run with the
//! same requests in the same order takes the same faults.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::handler::UserInfo;
use super::status::ApiError;

/// Faults the simulated API server injects.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Share (0.0–1.0) of resource requests answered 429 TooManyRequests.
    pub throttle_share: f64,
    /// `Retry-After` seconds of a throttled request.
    pub throttle_retry_after: u64,
    /// Added before every resource request is served.
    pub latency: Duration,
    /// Cut every watch stream with a 410 Gone ERROR event after about this long
    /// (between half and one and a half times it).
    pub watch_gone_after: Option<Duration>,
    /// Seed of the random choices.
    pub seed: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            throttle_share: 0.0,
            // Priority and Fairness answers rejected requests with `Retry-After: 1`.
            throttle_retry_after: 1,
            latency: Duration::ZERO,
            watch_gone_after: None,
            seed: 0,
        }
    }
}

/// The faults of one running API server, with their random generator.
pub(crate) struct Injector {
    faults: Faults,
    rng: Mutex<StdRng>,
}

impl Injector {
    pub(crate) fn new(faults: Faults) -> Self {
        let rng = Mutex::new(StdRng::seed_from_u64(faults.seed));
        Self { faults, rng }
    }

    fn draw<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        let mut rng = match self.rng.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut rng)
    }

    /// Applies the latency, then decides whether this request is throttled.
    pub(crate) async fn before_request(&self, user: &UserInfo) -> Option<ApiError> {
        if !self.faults.latency.is_zero() {
            tokio::time::sleep(self.faults.latency).await;
        }
        let share = self.faults.throttle_share.clamp(0.0, 1.0);
        if share <= 0.0 || user.groups.iter().any(|g| g == "system:masters") {
            return None;
        }
        if !self.draw(|rng| rng.random_bool(share)) {
            return None;
        }
        let retry = self.faults.throttle_retry_after;
        Some(
            ApiError::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
            .with_retry(retry),
        )
    }

    /// When a new watch stream is to be cut with 410 Gone, if ever.
    pub(crate) fn watch_cut(&self) -> Option<Duration> {
        let after = self.faults.watch_gone_after?;
        let factor = self.draw(|rng| rng.random_range(0.5..1.5));
        Some(after.mul_f64(factor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserInfo {
        UserInfo::from_token(Some(name))
    }

    #[tokio::test]
    async fn throttling_is_reproducible_with_a_seed_and_spares_cluster_admins() {
        let faults = Faults {
            throttle_share: 0.5,
            seed: 7,
            ..Faults::default()
        };
        let sa = user("system:serviceaccount:default:app");
        let mut runs = Vec::new();
        for _ in 0..2 {
            let injector = Injector::new(faults.clone());
            let mut pattern = Vec::new();
            for _ in 0..64 {
                pattern.push(injector.before_request(&sa).await.is_some());
            }
            runs.push(pattern);
        }
        assert_eq!(runs[0], runs[1]);
        let throttled = runs[0].iter().filter(|t| **t).count();
        assert!((16..=48).contains(&throttled), "{throttled} of 64");
        let injector = Injector::new(faults);
        for _ in 0..16 {
            assert!(injector.before_request(&user("admin")).await.is_none());
        }
        let error = Injector::new(Faults {
            throttle_share: 1.0,
            ..Faults::default()
        })
        .before_request(&sa)
        .await
        .unwrap();
        assert_eq!((error.code, error.retry_after), (429, Some(1)));
    }
}
