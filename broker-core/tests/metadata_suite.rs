//! The metadata store suite of `tributary_test_support::metadata_suite`, run
//! against the embedded redb store (a fresh file per case).

use std::sync::Arc;

use broker_core::clock::ManualClock;
use broker_core::metadata::redb::RedbStore;
use tributary_test_support::metadata_suite::{Fixture, START_MS};

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(START_MS));
    let store = RedbStore::open(dir.path().join("meta.redb"), clock.clone()).expect("open");
    Fixture {
        store: Arc::new(store),
        clock,
        guard: Box::new(dir),
    }
}

tributary_test_support::metadata_store_suite!(fixture);
