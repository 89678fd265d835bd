//! One behavioural suite for every [`MetadataStore`] implementation (the
//! embedded redb store in `broker-core/tests/metadata_suite.rs`, the
//! broker's Raft store in `broker/tests/raft_store_suite.rs`).
//!
//! Each case is a `pub async fn(&Fixture)` that starts from an empty store
//! and asserts exact results. [`crate::metadata_store_suite!`] turns every
//! case into a `#[test]` for an implementation, in an integration test (a
//! unit test inside broker-core would see another copy of its types):
//!
//! ```ignore
//! async fn fixture() -> tributary_test_support::metadata_suite::Fixture { /* fresh store */ }
//! tributary_test_support::metadata_store_suite!(fixture);
//! ```
//!
//! The suite needs the store to read time from the fixture's
//! [`ManualClock`].
//!
//! The cases live by concern in `kv`, `watch`, `ttl`, `input` and
//! `concurrency` (with the model test); this file holds the fixture, the
//! macro and the event helpers they share.

mod concurrency;
mod input;
mod kv;
mod ttl;
mod watch;

pub use concurrency::{concurrent_cas_increments_are_linearizable, random_ops_match_a_model};
pub use input::{invalid_input_is_refused_before_writing, typed_access_round_trips};
pub use kv::{
    cas_on_absent_key_creates_once, cas_on_value_swaps_only_on_match,
    delete_reports_whether_a_live_value_was_removed, get_of_missing_key_is_none,
    list_returns_prefix_matches_sorted, put_overwrites, put_then_get_returns_the_value,
    txn_applies_all_ops_in_order, txn_preconditions_see_the_state_before_the_ops,
    txn_with_a_failed_precondition_applies_nothing,
};
pub use ttl::{
    plain_put_clears_a_ttl_and_ttl_put_refreshes, ttl_keys_expire_and_purge_removes_them,
};
pub use watch::{
    watch_delivers_changes_under_the_prefix_in_commit_order, watch_reports_lag,
    watch_starts_after_the_call,
};

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use broker_core::clock::ManualClock;
use broker_core::metadata::{MetadataStore, WATCH_CHANNEL_CAPACITY, Watch, WatchError, WatchEvent};
use serde_json::Value;

/// The clock reading every fixture starts at, ms since the Unix epoch.
pub const START_MS: u64 = 1_700_000_000_000;

/// Longest wait for an event that must arrive.
const EVENT_WAIT: Duration = Duration::from_secs(10);

/// A fresh, empty store and the clock it reads.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn MetadataStore>,
    /// The clock the store was built with, reading [`START_MS`].
    pub clock: Arc<ManualClock>,
    /// Whatever must outlive the store (a temporary directory, a cluster).
    pub guard: Box<dyn Any + Send + Sync>,
}

/// Generates one `#[test]` per suite case, each on a fresh fixture from
/// `$fixture`, an `async fn() -> Fixture`, on a 2-worker tokio runtime.
#[macro_export]
macro_rules! metadata_store_suite {
    ($fixture:path) => {
        $crate::metadata_store_suite!(@cases $fixture;
            get_of_missing_key_is_none,
            put_then_get_returns_the_value,
            put_overwrites,
            delete_reports_whether_a_live_value_was_removed,
            cas_on_absent_key_creates_once,
            cas_on_value_swaps_only_on_match,
            txn_applies_all_ops_in_order,
            txn_with_a_failed_precondition_applies_nothing,
            txn_preconditions_see_the_state_before_the_ops,
            list_returns_prefix_matches_sorted,
            watch_delivers_changes_under_the_prefix_in_commit_order,
            watch_starts_after_the_call,
            watch_reports_lag,
            ttl_keys_expire_and_purge_removes_them,
            plain_put_clears_a_ttl_and_ttl_put_refreshes,
            invalid_input_is_refused_before_writing,
            typed_access_round_trips,
            concurrent_cas_increments_are_linearizable,
            random_ops_match_a_model,
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::metadata_suite::runtime().block_on(async {
                    let fixture = $fixture().await;
                    $crate::metadata_suite::$case(&fixture).await;
                });
            }
        )*
    };
}

/// The 2-worker tokio runtime each generated test runs its case on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn store(fx: &Fixture) -> &dyn MetadataStore {
    fx.store.as_ref()
}

/// The next event, failing the test after [`EVENT_WAIT`].
async fn next_event(watch: &mut Watch) -> Result<WatchEvent, WatchError> {
    tokio::time::timeout(EVENT_WAIT, watch.recv())
        .await
        .expect("a watch event within the wait")
}

/// Every event already queued, asserting no error.
fn drain(watch: &mut Watch) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    // Bounded: a watch never holds more than the channel capacity.
    for _ in 0..=WATCH_CHANNEL_CAPACITY {
        match watch.try_recv().expect("no lag or close") {
            Some(event) => events.push(event),
            None => return events,
        }
    }
    panic!("watch queue longer than its capacity");
}

fn put_event(key: &str, value: Value) -> WatchEvent {
    WatchEvent::Put {
        key: key.to_owned(),
        value,
    }
}

fn delete_event(key: &str) -> WatchEvent {
    WatchEvent::Delete {
        key: key.to_owned(),
    }
}
