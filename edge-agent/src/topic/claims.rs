//! Content claims of one topic: while a marked publish (an HTTP request
//! with a retry check, [`crate::pending`]) commits its marker and enqueues
//! its batch, no other publish with the same content is enqueued.
//!
//! Why: after a crash the marker is settled by taking the first batch at
//! or above its `from` with its record count and digest. A batch of
//! another request with identical records (timestamps included) enqueued
//! after the marker while the marked request's own append never happened
//! would be taken for it: the marked request's retry would be answered with
//! that other batch's offsets and its own records never stored. With a
//! claim held from before `from` is read until the marked batch is
//! enqueued, an identical batch lands either before `from` or after the
//! marked batch, never in between, and never at all if the marked batch
//! was not enqueued (its publishers wait for the claim, and a crash ends
//! them too).
//!
//! Content is keyed by the encoded batch's CRC-32C and length, computed
//! anyway when a publish is encoded, before its offsets are assigned:
//! identical records give identical keys. Two different contents with one
//! key only make one of them wait.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::Notify;

/// CRC-32C and length of an encoded batch (base offset 0).
pub(crate) type ContentKey = (u32, usize);

/// The claims and passages in progress on one topic.
#[derive(Debug, Default)]
pub(crate) struct ContentClaims {
    state: Mutex<HashMap<ContentKey, Entry>>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Entry {
    /// A marked publish holds the content.
    claimed: bool,
    /// Unmarked publishes between their check and their enqueue.
    passing: usize,
}

/// An unmarked publish's passage: while it lives (until its batch is
/// enqueued), a claim on its content waits.
pub(crate) struct Passage<'a> {
    claims: &'a ContentClaims,
    key: ContentKey,
}

/// A marked publish's claim: while it lives (until its batch is
/// enqueued), publishes of its content wait.
pub(crate) struct Claim<'a> {
    claims: &'a ContentClaims,
    key: ContentKey,
}

impl ContentClaims {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContentKey, Entry>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `ready` holds for `key`'s entry, then applies `take`
    /// to it (both under the lock).
    async fn wait_then(&self, key: ContentKey, ready: fn(&Entry) -> bool, take: fn(&mut Entry)) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check: a change after it wakes us.
            changed.as_mut().enable();
            {
                let mut state = self.lock();
                let entry = state.entry(key).or_default();
                if ready(entry) {
                    take(entry);
                    return;
                }
            }
            changed.await;
        }
    }

    /// Lets an unmarked publish of `key` through once no claim holds it.
    pub(crate) async fn pass(&self, key: ContentKey) -> Passage<'_> {
        self.wait_then(key, |e| !e.claimed, |e| e.passing += 1)
            .await;
        Passage { claims: self, key }
    }

    /// Claims `key` for a marked publish: waits for another claim on it to
    /// end, then for the passages already let through to enqueue.
    pub(crate) async fn claim(&self, key: ContentKey) -> Claim<'_> {
        self.wait_then(key, |e| !e.claimed, |e| e.claimed = true)
            .await;
        // Released by its drop, also if this future is dropped below.
        let claim = Claim { claims: self, key };
        self.wait_then(key, |e| e.passing == 0, |_| {}).await;
        claim
    }

    /// Applies `change` to `key`'s entry; wakes the waiters only if one
    /// may wait on it (a claim is held or ended): the passage of an
    /// unclaimed content, every publish's case, wakes nobody.
    fn release(&self, key: ContentKey, change: fn(&mut Entry)) {
        let mut state = self.lock();
        let Some(entry) = state.get_mut(&key) else {
            return;
        };
        let was_claimed = entry.claimed;
        change(entry);
        if !entry.claimed && entry.passing == 0 {
            state.remove(&key);
        }
        drop(state);
        if was_claimed {
            self.changed.notify_waiters();
        }
    }
}

impl Drop for Passage<'_> {
    fn drop(&mut self) {
        self.claims
            .release(self.key, |e| e.passing = e.passing.saturating_sub(1));
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.claims.release(self.key, |e| e.claimed = false);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pending<F: std::future::Future>(f: F) -> bool {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        f.as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    }

    #[tokio::test]
    async fn a_claim_holds_back_its_content_only() {
        let claims = ContentClaims::default();
        let claim = claims.claim((1, 10)).await;
        assert!(pending(claims.pass((1, 10))), "same content waits");
        assert!(pending(claims.claim((1, 10))), "a second claim waits");
        drop(claims.pass((2, 10)).await);
        drop(claims.pass((1, 11)).await);
        drop(claim);
        drop(claims.pass((1, 10)).await);
        assert!(claims.lock().is_empty(), "nothing left behind");
    }

    #[tokio::test]
    async fn a_claim_waits_for_passages_already_let_through() {
        let claims = std::sync::Arc::new(ContentClaims::default());
        let passage = claims.pass((7, 1)).await;
        let waiting = {
            let claims = claims.clone();
            tokio::spawn(async move {
                let _claim = claims.claim((7, 1)).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "the passage is still in flight");
        drop(passage);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("claimed once the passage ended")
            .unwrap();
        assert!(claims.lock().is_empty());
    }
}
