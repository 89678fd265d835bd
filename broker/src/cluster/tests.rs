//! Unit tests of the cluster module.
use std::sync::Arc;

use broker_core::clock::SystemClock;
use broker_core::metadata::redb::RedbStore;

use super::{Cluster, ClusterConfig};

#[test]
fn history_timestamps_are_unique_and_ordered_within_a_millisecond() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap();
    let cluster = Cluster::new(
        1,
        Arc::new(store),
        Arc::new(SystemClock),
        ClusterConfig::new("127.0.0.1:1".into(), "http://127.0.0.1:1".into()),
    );
    let burst: Vec<u64> = (0..5).map(|_| cluster.history_timestamp(1_000)).collect();
    assert_eq!(burst, vec![1_000, 1_001, 1_002, 1_003, 1_004]);
    // Time that moved past the burst is taken as it is.
    assert_eq!(cluster.history_timestamp(2_000), 2_000);
    assert_eq!(cluster.history_timestamp(1_500), 2_001);
}

/// The load manager planned a takeover from a view in which broker 1's
/// lease had lapsed, but broker 1 renewed before the change applied
/// (a restart shorter than its lease): it keeps the topic. Once its
/// lease lapses in the store the same change applies.
#[tokio::test]
async fn a_takeover_needs_the_owners_lease_lapsed_when_it_applies() {
    use broker_core::metadata::{MetadataStore, Txn};
    use tributary_proto::cluster::Assignment;
    use tributary_proto::cluster::placement::{Change, OWNER_DEAD, Previous};
    use tributary_proto::keys::{TopicName, cluster as keys};

    let dir = tempfile::tempdir().unwrap();
    let store =
        Arc::new(RedbStore::open(dir.path().join("meta.redb"), Arc::new(SystemClock)).unwrap());
    let cluster = Cluster::new(
        2,
        store.clone(),
        Arc::new(SystemClock),
        ClusterConfig::new("127.0.0.1:1".into(), "http://127.0.0.1:1".into()),
    );
    let topic = TopicName::new("/plant/line-1").unwrap();
    let held = Assignment {
        epoch: 3,
        assigned_at_ms: 1,
        previous_owner: None,
        reason: "new_topic".into(),
    };
    let held_value = serde_json::to_value(&held).unwrap();
    let lease = Txn::new()
        .put(keys::broker_assignment(1, &topic), held_value.clone())
        .put_with_ttl(keys::broker_state(1), serde_json::json!({}), 300);
    assert!(store.txn(lease).await.unwrap().applied());
    let change = Change {
        topic: topic.clone(),
        previous: Previous::Owner(1, held.clone()),
        to: 2,
        assignment: Assignment {
            epoch: 4,
            assigned_at_ms: 2,
            previous_owner: Some(1),
            reason: OWNER_DEAD.into(),
        },
    };
    assert!(matches!(
        cluster.apply_change(&change).await,
        Err(super::ClusterError::Contended(_))
    ));
    assert_eq!(
        store
            .get(&keys::broker_assignment(1, &topic))
            .await
            .unwrap(),
        Some(held_value)
    );
    assert_eq!(
        store
            .get(&keys::broker_assignment(2, &topic))
            .await
            .unwrap(),
        None
    );

    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    cluster.apply_change(&change).await.unwrap();
    assert_eq!(
        store
            .get(&keys::broker_assignment(1, &topic))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .get(&keys::broker_assignment(2, &topic))
            .await
            .unwrap(),
        Some(serde_json::to_value(&change.assignment).unwrap())
    );
}
