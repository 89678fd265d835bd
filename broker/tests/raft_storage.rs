//! openraft's own storage test suite, run on the redb log store and state
//! machine (real files in a temporary directory).

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use tributary_broker::raft::log_store::LogStore;
use tributary_broker::raft::state_machine::StateMachine;
use tributary_broker::raft::{NodeId, TypeConfig, open_database};

struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Arc::new(open_database(&dir.path().join("raft.redb")).expect("open redb"));
        let sm = StateMachine::new(db.clone(), &dir.path().join("snapshots")).expect("sm");
        Ok((dir, LogStore::new(db), sm))
    }
}

#[test]
fn openraft_storage_suite_passes_on_redb() {
    if let Err(e) = Suite::test_all(RedbBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
