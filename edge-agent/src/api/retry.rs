//! The publish routes' retry checks: an `Idempotency-Key` header
//! ([`crate::idempotency`]) or NDJSON `producer_id` + `sequence`
//! ([`crate::sequence`]), each made crash-proof by a marker committed
//! before the append ([`crate::pending`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::{HeaderMap, StatusCode};
use serde_json::json;
use tracing::{debug, error};
use tributary_proto::Record;
use tributary_proto::keys::TopicName;

use super::ApiError;
use crate::idempotency as idem;
use crate::manager::{TopicError, TopicManager};
use crate::pending::{self, Pending, PendingRequest};
use crate::sequence::{self as seq, Decision, Refusal};
use crate::topic::{Mark, PublishAck, PublishError};

/// The request's `Idempotency-Key`, checked (once, 1 to 200 bytes of
/// visible ASCII), if it has one.
///
/// # Errors
/// 400 naming the rule.
pub(super) fn request_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let values: Vec<&[u8]> = headers
        .get_all(idem::HEADER)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    broker_core::idempotency::request_key(&values)
        .map(|key| key.map(str::to_owned))
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))
}

/// A request's retry check, taken before its records go to the append.
pub(super) struct Check {
    request: PendingRequest,
    /// The request's fingerprint.
    fp: String,
    /// Its records.
    count: u64,
    /// [`pending::records_digest`] of them.
    digest: String,
}

impl Check {
    /// The check `request` asks for, of a request with fingerprint `fp`
    /// whose records are `records`.
    pub(super) fn new(request: PendingRequest, fp: String, records: &[Record]) -> Check {
        Check {
            request,
            fp,
            count: records.len() as u64,
            digest: pending::records_digest(records),
        }
    }

    fn marker(&self, name: &TopicName, from: u64) -> Pending {
        Pending {
            topic: name.to_string(),
            from,
            count: self.count,
            records_digest: self.digest.clone(),
            fingerprint: self.fp.clone(),
            request: self.request.clone(),
        }
    }
}

/// Publishes `records` to `name` under `check` (none: a plain publish);
/// `refused` turns a publish error into the answer.
///
/// A checked publish runs on a task of its own, to its end even if the
/// client goes away: dropped between its marker and its answer (hyper drops
/// a request's future when its connection closes), it would leave a marker
/// that only the next start settles, and a retry meanwhile would be stored
/// again.
///
/// # Errors
/// The publish's, 409 for a refused retry, 500 when the metadata store
/// fails before anything was stored.
pub(super) async fn checked(
    manager: &Arc<TopicManager>,
    name: &TopicName,
    check: Option<Check>,
    records: Vec<Record>,
    refused: impl FnOnce(TopicError) -> ApiError,
) -> Result<PublishAck, ApiError> {
    let Some(check) = check else {
        return manager.publish(name, records).await.map_err(refused);
    };
    let task = tokio::spawn({
        let manager = manager.clone();
        let name = name.clone();
        async move {
            let publish = Publish {
                manager: &manager,
                name: &name,
                records,
            };
            match &check.request {
                PendingRequest::Key { key } => idempotent(publish, key, &check).await,
                PendingRequest::Producer {
                    producer_id,
                    first_sequence,
                    last_sequence,
                } => {
                    let range = (*first_sequence, *last_sequence);
                    sequenced(publish, producer_id, range, &check).await
                }
            }
        }
    });
    match task.await {
        Ok(Ok(ack)) => Ok(ack),
        Ok(Err(Failed::Answer(e))) => Err(e),
        Ok(Err(Failed::Publish(e))) => Err(refused(e)),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("publish task: {e}"),
        )),
    }
}

/// Why a checked publish did not store: an answer already made (409, 500),
/// or the publish's own refusal (mapped by the route).
enum Failed {
    Answer(ApiError),
    Publish(TopicError),
}

impl From<ApiError> for Failed {
    fn from(e: ApiError) -> Failed {
        Failed::Answer(e)
    }
}

/// A publish waiting for its retry check.
struct Publish<'a> {
    manager: &'a TopicManager,
    name: &'a TopicName,
    records: Vec<Record>,
}

/// 500 for a failed read or write of the retry state before the append.
fn store_error(e: broker_core::metadata::MetadataError) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("idempotency key store: {e}"),
    )
}

/// Whether a marker may have been left since the agent started (a
/// metadata write after an append failed): until then no request looks
/// for one (the start settled every earlier marker).
static LEFTOVERS: AtomicBool = AtomicBool::new(false);

/// Waits for the requests ahead with `store_key` (the lock of its key),
/// then settles a marker a failed earlier one left (see
/// [`pending::settle`]). The request runs while the guard lives.
async fn serialize(
    manager: &TopicManager,
    store_key: &str,
) -> Result<tokio::sync::OwnedMutexGuard<()>, ApiError> {
    let serial = idem::LOCKS.get(store_key).lock_owned().await;
    if !LEFTOVERS.load(Ordering::Relaxed) {
        return Ok(serial);
    }
    if let Some(left) = pending::load(manager, store_key)
        .await
        .map_err(store_error)?
    {
        pending::settle(manager, store_key, &left)
            .await
            .map_err(store_error)?;
    }
    Ok(serial)
}

/// Steps 1–3 of [`crate::pending`]: publishes with the marker of `check`
/// committed at the step the topic gives it (its content claimed,
/// [`crate::topic::Topic::publish_marked`]), then writes the answer that
/// `answer` makes of the acknowledgement, or deletes the marker when the
/// append failed after it.
async fn marked(
    publish: Publish<'_>,
    store_key: &str,
    check: &Check,
    answer: impl FnOnce(&PublishAck) -> serde_json::Value,
) -> Result<PublishAck, Failed> {
    let Publish {
        manager,
        name,
        records,
    } = publish;
    let marker_stored = AtomicBool::new(false);
    let mark: Mark<'_> = Box::new(|from| {
        let marker = check.marker(name, from);
        let stored = &marker_stored;
        Box::pin(async move {
            pending::mark(manager, store_key, &marker).await?;
            stored.store(true, Ordering::Relaxed);
            Ok(())
        })
    });
    match manager.publish_marked(name, records, Some(mark)).await {
        Ok(ack) => {
            if let Err(e) = pending::complete(manager, store_key, answer(&ack)).await {
                LEFTOVERS.store(true, Ordering::Relaxed);
                error!(error = %e, topic = %name, "the retry answer could not be recorded; the marker stays and is settled by the next retry or restart");
            }
            Ok(ack)
        }
        Err(TopicError::Publish(PublishError::Marker { source, .. })) => {
            Err(store_error(source).into())
        }
        Err(e) => {
            if marker_stored.load(Ordering::Relaxed)
                && let Err(e) = pending::abandon(manager, store_key).await
            {
                LEFTOVERS.store(true, Ordering::Relaxed);
                error!(error = %e, topic = %name, "the marker of a refused publish could not be deleted; the next retry or restart settles it");
            }
            Err(Failed::Publish(e))
        }
    }
}

/// Publishes unless the `Idempotency-Key` `key` was already used on the
/// topic: then the remembered answer (same request, fingerprint
/// `check.fp`) or 409 (another request). See [`crate::idempotency`].
async fn idempotent(publish: Publish<'_>, key: &str, check: &Check) -> Result<PublishAck, Failed> {
    let (manager, name) = (publish.manager, publish.name);
    let store_key = idem::store_key(name, key);
    let _serial = serialize(manager, &store_key).await?;
    if let Some(used) = idem::lookup(manager, &store_key)
        .await
        .map_err(store_error)?
    {
        if used.fingerprint != check.fp {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("{} {key:?} was used on {name} for another request within the last 24 h; nothing stored", idem::HEADER),
            )
            .with_kind("idempotency_key_reused")
            .with("base_offset", json!(used.base_offset))
            .into());
        }
        debug!(topic = %name, key, "idempotent retry: answering the original offsets");
        return Ok(PublishAck {
            base_offset: used.base_offset,
            next_offset: used.next_offset,
            count: used.count,
        });
    }
    let fp = check.fp.clone();
    marked(publish, &store_key, check, |ack| idem::answer(fp, ack)).await
}

/// Publishes unless [`crate::sequence::decide`] says the batch
/// `first..=last` of `producer_id` is a retry (the remembered answer) or
/// refused (409). Requests of one producer on a topic run one after the
/// other.
async fn sequenced(
    publish: Publish<'_>,
    producer_id: &str,
    (first, last): (u64, u64),
    check: &Check,
) -> Result<PublishAck, Failed> {
    let (manager, name) = (publish.manager, publish.name);
    let store_key = seq::store_key(name, producer_id);
    let _serial = serialize(manager, &store_key).await?;
    let state = seq::load(manager, &store_key).await.map_err(store_error)?;
    match seq::decide(&state, first, last, &check.fp) {
        Decision::Store => {}
        Decision::Replay(batch) => {
            debug!(topic = %name, producer = producer_id, first, "sequenced retry: answering the original offsets");
            // A use: the window runs for another 24 h.
            if let Err(e) = seq::save(manager, &store_key, &state).await {
                error!(error = %e, topic = %name, "the producer's sequence window could not be refreshed");
            }
            return Ok(batch.ack());
        }
        Decision::Refuse(refusal) => {
            let mut err = ApiError::new(
                StatusCode::CONFLICT,
                format!("producer_id {producer_id:?} on {name}: {refusal}; nothing stored"),
            )
            .with_kind(refusal.kind())
            .with("producer_id", json!(producer_id));
            err = match refusal {
                Refusal::Reused { base_offset, .. } => err.with("base_offset", json!(base_offset)),
                Refusal::Duplicate { last_sequence, .. } => {
                    err.with("last_sequence", json!(last_sequence))
                }
                Refusal::Gap { expected, .. } => err.with("expected_sequence", json!(expected)),
            };
            return Err(err.into());
        }
    }
    let fp = check.fp.clone();
    marked(publish, &store_key, check, |ack| {
        seq::answer(state, first, last, fp, ack)
    })
    .await
}
