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

/// A broker that becomes Raft leader takes no dead owner's topics over for
/// the takeover grace (the lease's fresh window): without a leader no
/// lease could be renewed, so a live owner's may have lapsed during the
/// election. Broker 1's lease lapsed before this leader started; it renews
/// within the grace and keeps its topic at the same epoch. Broker 3's
/// lapsed too and it never renews: its topic moves once the grace has
/// passed. Broker 4, a Raft member that never answered the new leader,
/// loses its topic a heartbeat after the election (the cluster trial: after a
/// leader's SIGKILL the survivors' topics went to other brokers, and a
/// central topic's new owner started at the archive's end without its
/// acknowledged records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_waits_the_takeover_grace_before_taking_topics_over() {
    use std::time::Duration;

    use broker_core::clock::Clock as _;
    use broker_core::metadata::{MetadataStore, Txn};
    use tributary_proto::cluster::{Assignment, BrokerLifecycle, BrokerState};
    use tributary_proto::keys::{TopicName, cluster as keys};

    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(SystemClock);
    let store = Arc::new(RedbStore::open(dir.path().join("meta.redb"), clock.clone()).unwrap());
    let mut config = ClusterConfig::new("127.0.0.1:1".into(), "http://127.0.0.1:1".into());
    config.heartbeat_ms = 50;
    config.lease_ttl_ms = 2_000;
    config.lease_margin_ms = 500;
    let ttl = config.lease_ttl_ms;
    let grace = super::manager::takeover_grace_ms(&config);
    assert_eq!(grace, 1_500);
    let cluster = Cluster::new(2, store.clone(), clock.clone(), config);
    let lease = |id: u64, renewed_at_ms: u64, ttl_ms: u64| {
        let state = BrokerState {
            broker_id: id,
            ingest_addr: "127.0.0.1:1".into(),
            admin_url: "http://127.0.0.1:1".into(),
            lifecycle: BrokerLifecycle::Active,
            topics_owned: 1,
            bytes_in_per_s: 0,
            lease_ttl_ms: ttl_ms,
            renewed_at_ms,
            started_at_ms: 1,
        };
        Txn::new().put_with_ttl(
            keys::broker_state(id),
            serde_json::to_value(state).unwrap(),
            ttl_ms,
        )
    };
    let held = Assignment {
        epoch: 3,
        assigned_at_ms: 1,
        previous_owner: None,
        reason: "new_topic".into(),
    };
    let (kept, moved, gone) = (
        TopicName::new("/plant/kept").unwrap(),
        TopicName::new("/plant/moved").unwrap(),
        TopicName::new("/plant/gone").unwrap(),
    );
    let now = clock.now_ms();
    let setup = lease(1, now - 2 * ttl, 1)
        .put(
            keys::broker_assignment(1, &kept),
            serde_json::to_value(&held).unwrap(),
        )
        .put(
            keys::broker_assignment(3, &moved),
            serde_json::to_value(&held).unwrap(),
        )
        .put(
            keys::broker_assignment(4, &gone),
            serde_json::to_value(&held).unwrap(),
        );
    assert!(store.txn(setup).await.unwrap().applied());
    assert!(
        store
            .txn(lease(4, now - 2 * ttl, 1))
            .await
            .unwrap()
            .applied()
    );
    assert!(
        store
            .txn(lease(3, now - 2 * ttl, 1))
            .await
            .unwrap()
            .applied()
    );
    let follow = tokio::spawn(cluster.clone().follow());
    let renewing = tokio::spawn(super::lease::run(cluster.clone()));
    let started = tokio::time::Instant::now();
    // Broker 4 is a Raft member that never answered this leader: gone for
    // sure, its topic need not wait.
    let manager = tokio::spawn(super::manager::run(
        cluster.clone(),
        Arc::new(|| true),
        Arc::new(|| std::collections::BTreeSet::from([4])),
    ));

    // Broker 1 renews with the new leader within the grace.
    tokio::time::sleep(Duration::from_millis(grace / 2)).await;
    assert_eq!(cluster.owner(&kept), Some((1, 3)));
    assert_eq!(
        cluster.owner(&moved),
        Some((3, 3)),
        "moved within the grace"
    );
    assert_eq!(
        cluster.owner(&gone),
        Some((2, 4)),
        "an unreachable owner's topic waited for the grace"
    );
    let renewed = clock.now_ms();
    assert!(
        store
            .txn(lease(1, renewed, 60_000))
            .await
            .unwrap()
            .applied()
    );

    // Past the grace: broker 3's topic goes to a live broker, broker 1's
    // stays where it was.
    let deadline = started + Duration::from_millis(ttl * 3);
    while !cluster
        .owner(&moved)
        .is_some_and(|(owner, epoch)| owner != 3 && epoch == 4)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            cluster.owner(&moved)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(grace));
    assert_eq!(cluster.owner(&kept), Some((1, 3)));
    manager.abort();
    renewing.abort();
    follow.abort();
}
