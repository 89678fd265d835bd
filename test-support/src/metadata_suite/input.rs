//! Cases on refused input (sizes, empty keys, too many ops) and typed access.

use broker_core::metadata::{
    MAX_KEY_BYTES, MAX_TXN_OPS, MAX_VALUE_BYTES, MetadataError, MetadataStoreExt, Txn,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Fixture, store};

/// Bad keys, values, TTLs and oversized transactions are errors and write
/// nothing.
pub async fn invalid_input_is_refused_before_writing(fx: &Fixture) {
    let s = store(fx);
    let long_key = format!("/{}", "k".repeat(MAX_KEY_BYTES));
    for key in ["", "no-slash", "/ctl\n", long_key.as_str()] {
        assert!(
            matches!(
                s.put(key, json!(1)).await,
                Err(MetadataError::InvalidKey { .. })
            ),
            "put {key:?}"
        );
        assert!(
            matches!(s.get(key).await, Err(MetadataError::InvalidKey { .. })),
            "get {key:?}"
        );
        assert!(
            matches!(s.delete(key).await, Err(MetadataError::InvalidKey { .. })),
            "delete {key:?}"
        );
    }
    let max_key = format!("/{}", "k".repeat(MAX_KEY_BYTES - 1));
    s.put(&max_key, json!("longest key")).await.unwrap();
    assert!(matches!(
        s.list(&long_key).await,
        Err(MetadataError::InvalidKey { .. })
    ));
    assert!(matches!(
        s.watch(&long_key).await,
        Err(MetadataError::InvalidKey { .. })
    ));
    let too_big = Value::String("x".repeat(MAX_VALUE_BYTES - 1));
    match s.put("/big", too_big).await {
        Err(MetadataError::ValueTooLarge { bytes, max, .. }) => {
            assert_eq!((bytes, max), (MAX_VALUE_BYTES + 1, MAX_VALUE_BYTES));
        }
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    assert!(matches!(
        s.put_with_ttl("/ttl", json!(1), 0).await,
        Err(MetadataError::ZeroTtl { .. })
    ));
    let mut txn = Txn::new().when_absent("/p");
    for i in 0..MAX_TXN_OPS {
        txn = txn.put(format!("/many/{i}"), json!(i));
    }
    match s.txn(txn).await {
        Err(MetadataError::TooManyOps { count, max }) => {
            assert_eq!((count, max), (MAX_TXN_OPS + 1, MAX_TXN_OPS));
        }
        other => panic!("expected TooManyOps, got {other:?}"),
    }
    // One bad op spoils the whole transaction.
    let txn = Txn::new().put("/fine", json!(1)).put("bad", json!(2));
    assert!(matches!(
        s.txn(txn).await,
        Err(MetadataError::InvalidKey { .. })
    ));
    assert_eq!(
        s.list("").await.unwrap(),
        vec![(max_key, json!("longest key"))]
    );
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Registration {
    broker_addr: String,
    admin_addr: String,
}

/// `get_as` / `put_as` encode and decode through JSON.
pub async fn typed_access_round_trips(fx: &Fixture) {
    let s = store(fx);
    let reg = Registration {
        broker_addr: "10.0.0.1:6650".into(),
        admin_addr: "10.0.0.1:50051".into(),
    };
    s.put_as("/cluster/register/1", &reg).await.unwrap();
    assert_eq!(
        s.get("/cluster/register/1").await.unwrap(),
        Some(json!({"broker_addr": "10.0.0.1:6650", "admin_addr": "10.0.0.1:50051"}))
    );
    assert_eq!(
        s.get_as::<Registration>("/cluster/register/1")
            .await
            .unwrap(),
        Some(reg)
    );
    assert_eq!(s.get_as::<u64>("/missing").await.unwrap(), None);
    s.put_as("/cursor", &42u64).await.unwrap();
    assert_eq!(s.get_as::<u64>("/cursor").await.unwrap(), Some(42));
    assert!(matches!(
        s.get_as::<Registration>("/cursor").await,
        Err(MetadataError::Decode { .. })
    ));
}
