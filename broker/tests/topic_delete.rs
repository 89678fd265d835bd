//! Deleting a central topic while a consumer works on one of its durable
//! subscriptions (`DELETE /v1/topics/…`, docs/admin-api.md "Delete"), over
//! real HTTP on 127.0.0.1 against the admin and consumer routers on a redb
//! store and real topic WALs: the subscription is unloaded by the next
//! tick, no cursor is written for it after the delete (an acknowledgement
//! racing the delete must not put the deleted topic's cursor key back), and
//! a topic created again under the name has no trace of it.

mod served;

use std::time::Duration;

use broker_core::catalog::{Catalog, TopicSpec};
use served::Served;
use tributary_api::consumer::{AttachRequest, PublishRecord, StartPosition, SubscriptionType};
use tributary_api::consumer_client::ConsumerClient;
use tributary_broker::consumer::ConsumerConfig;

const TOKEN: &str = "delete-test-token";
const JOBS: &str = "/shop/jobs";
const CURSOR_KEY: &str = "/topics/shop/jobs/subscriptions/workers/cursor";

fn served() -> Served {
    Served::consumers(
        TOKEN,
        ConsumerConfig {
            // Every acknowledgement writes the cursor at once.
            cursor_persist_every_acks: 1,
            tick_ms: 50,
            ..ConsumerConfig::default()
        },
    )
}

fn create(served: &Served) {
    let spec = TopicSpec::parse(JOBS, "task_queue", 0).unwrap();
    served
        .runtime
        .block_on(Catalog::new(served.store.as_ref()).create_topic(&spec))
        .unwrap();
}

fn attach(client: &ConsumerClient) -> u64 {
    let request = AttachRequest {
        subscription_type: SubscriptionType::Exclusive,
        start: StartPosition::Earliest,
        ..AttachRequest::default()
    };
    client
        .attach(JOBS, "workers", &request)
        .unwrap()
        .consumer_id
}

/// `GET` of the `workers` subscription answers 404.
fn assert_no_subscription(served: &Served) {
    let state = served.request(
        "GET",
        "/v1/topics/shop/jobs/subscriptions/workers",
        Some(TOKEN),
        None,
    );
    assert_eq!(state.status, 404, "{}", state.body);
}

/// [`JOBS`] with 10 records, a consumer of `workers` that read them all
/// and acknowledged 0..=4 (the cursor, 5, is stored): the served routers,
/// a client and the consumer's id.
fn consuming() -> (Served, ConsumerClient, u64) {
    let served = served();
    create(&served);
    let client = ConsumerClient::new(&served.base, TOKEN);
    let records = (0..10)
        .map(|i| PublishRecord {
            value: Some(format!("job-{i}")),
            ..PublishRecord::default()
        })
        .collect();
    client.publish(JOBS, records).unwrap();
    let consumer = attach(&client);
    let got = client.read(JOBS, "workers", consumer, 10, 1000).unwrap();
    assert_eq!(got.messages.len(), 10);
    client.ack_up_to(JOBS, "workers", consumer, 4).unwrap();
    assert_eq!(served.get(CURSOR_KEY), Some(serde_json::json!(5)));
    (served, client, consumer)
}

#[test]
fn a_deleted_topic_leaves_no_subscription_behind() {
    let (served, client, consumer) = consuming();

    let deleted = served.request("DELETE", "/v1/topics/shop/jobs", Some(TOKEN), None);
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert_eq!(deleted.body["edge_fed"], false, "{}", deleted.body);
    assert!(deleted.body.get("note").is_none(), "{}", deleted.body);
    assert_eq!(served.get(CURSOR_KEY), None);
    // An acknowledgement right after the delete, before the next tick: the
    // session may still answer, but the cursor is not written back.
    let _ = client.ack_up_to(JOBS, "workers", consumer, 9);
    assert_eq!(served.get(CURSOR_KEY), None);

    // The next tick unloads the subscription: its state is gone.
    std::thread::sleep(Duration::from_millis(500));
    assert_no_subscription(&served);
    assert_eq!(served.get(CURSOR_KEY), None);

    // Created again: a new subscription of the same name starts afresh
    // from the earliest record (the log continues: offsets are not reused).
    create(&served);
    assert_no_subscription(&served);
    let consumer = attach(&client);
    let got = client.read(JOBS, "workers", consumer, 20, 1000).unwrap();
    let offsets: Vec<u64> = got.messages.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
}

/// The same with the topic created again at once, before the consumer's
/// next tick (the fresh-user trial: the old session kept serving, its
/// cursor was written into the new topic and the old policy stayed), and
/// the topic created again takes central writes, continuing its log (it
/// refused them: the delete had removed the record of who wrote the log).
#[test]
fn a_topic_created_again_at_once_has_no_old_subscription_and_takes_writes() {
    let (served, client, consumer) = consuming();

    let deleted = served.request("DELETE", "/v1/topics/shop/jobs", Some(TOKEN), None);
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    create(&served);
    let _ = client.ack_up_to(JOBS, "workers", consumer, 9);
    assert_eq!(served.get(CURSOR_KEY), None);
    std::thread::sleep(Duration::from_millis(500));
    assert_no_subscription(&served);
    assert_eq!(served.get(CURSOR_KEY), None);

    let more = PublishRecord {
        value: Some("after".into()),
        ..PublishRecord::default()
    };
    let published = client.publish(JOBS, vec![more]).unwrap();
    assert_eq!((published.base_offset, published.next_offset), (10, 11));
}
