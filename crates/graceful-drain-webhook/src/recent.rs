//! Reads that reviews share. Anyone who reaches the port can send reviews as fast as they
//! like, so an object a review's decision reads (a node, a pod's controller, its pods) is
//! read at most once per time-to-live per replica, however many reviews ask: the reviews
//! arriving while a read is in flight wait for it instead of making their own, and those
//! after it take its answer until it is older than the time-to-live. A failed read is not
//! kept. What a decision changes itself (a pod it isolated) it [`Recent::forget`]s, so the
//! next review reads the object afresh.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// The last read of one key and when it was made; the lock is the read's turn.
type Slot<V> = Arc<tokio::sync::Mutex<Option<(Instant, V)>>>;

/// Recent reads by key (see the module).
#[derive(Debug)]
pub struct Recent<V> {
    ttl: Duration,
    /// Keys kept at most; past it the keys nobody is reading are forgotten.
    max: usize,
    slots: std::sync::Mutex<HashMap<String, Slot<V>>>,
}

impl<V: Clone> Recent<V> {
    /// Reads answering for `ttl`, at most `max` keys remembered.
    pub fn new(ttl: Duration, max: usize) -> Recent<V> {
        Recent {
            ttl,
            max,
            slots: std::sync::Mutex::default(),
        }
    }

    /// What `key` was read as less than the time-to-live ago, else what `read` reads now
    /// (remembered when it succeeds). Concurrent callers with one key make one read.
    pub async fn get<E, F, Fut>(&self, key: &str, read: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            if slots.len() >= self.max && !slots.contains_key(key) {
                slots.retain(|_, slot| Arc::strong_count(slot) > 1);
            }
            slots.entry(key.to_string()).or_default().clone()
        };
        let mut last = slot.lock().await;
        if let Some((at, value)) = last.as_ref()
            && at.elapsed() < self.ttl
        {
            return Ok(value.clone());
        }
        let value = read().await?;
        *last = Some((Instant::now(), value.clone()));
        Ok(value)
    }

    /// Drops what `key` was read as: the next [`Recent::get`] reads it. A read in flight
    /// finishes for those already waiting on it.
    pub fn forget(&self, key: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    async fn counted(reads: &AtomicUsize, value: u32) -> Result<u32, ()> {
        reads.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(value)
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_and_later_callers_share_one_read_until_it_is_stale_or_forgotten() {
        let recent = Recent::new(Duration::from_secs(1), 8);
        let reads = AtomicUsize::new(0);
        let answers = futures::future::join_all(
            (0..20).map(|_| recent.get("web/web", || counted(&reads, 1))),
        )
        .await;
        assert!(answers.iter().all(|a| *a == Ok(1)));
        assert_eq!(reads.load(Ordering::SeqCst), 1, "twenty callers, one read");
        assert_eq!(recent.get("web/web", || counted(&reads, 2)).await, Ok(1));
        assert_eq!(reads.load(Ordering::SeqCst), 1, "still fresh");

        recent.forget("web/web");
        assert_eq!(recent.get("web/web", || counted(&reads, 3)).await, Ok(3));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(recent.get("web/web", || counted(&reads, 4)).await, Ok(4));
        assert_eq!(reads.load(Ordering::SeqCst), 3, "forgotten, then stale");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_not_kept_and_the_keys_stay_bounded() {
        let recent = Recent::<u32>::new(Duration::from_secs(1), 4);
        assert_eq!(
            recent.get("a", || async { Err("refused") }).await,
            Err("refused")
        );
        assert_eq!(recent.get("a", || async { Ok::<_, ()>(7) }).await, Ok(7));
        for key in 0..100 {
            recent
                .get(&key.to_string(), || async { Ok::<_, ()>(key) })
                .await
                .unwrap();
        }
        assert!(recent.slots.lock().unwrap().len() <= 4);
    }
}
