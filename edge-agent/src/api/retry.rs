//! The publish routes' retry checks: an `Idempotency-Key` header
//! ([`crate::idempotency`]) or NDJSON `producer_id` + `sequence`
//! ([`crate::sequence`]), each made crash-proof by a marker committed
//! before the append ([`crate::pending`]).

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::{HeaderMap, StatusCode};
use serde_json::json;
use tracing::{debug, error};
use tributary_proto::Record;
use tributary_proto::keys::TopicName;

use super::ApiError;
use crate::idempotency as idem;
use crate::manager::TopicManager;
use crate::pending::{self, Pending, PendingRequest};
use crate::sequence::{self as seq, Decision, Refusal};
use crate::topic::PublishAck;

/// The request's `Idempotency-Key`, checked (1 to 200 bytes of visible
/// ASCII), if it has one.
///
/// # Errors
/// 400 naming the rule.
pub(super) fn request_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(key) = headers.get(idem::HEADER) else {
        return Ok(None);
    };
    let key = key.to_str().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("header {}: not visible ASCII", idem::HEADER),
        )
    })?;
    idem::check_key(key).map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))?;
    Ok(Some(key.to_owned()))
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

    fn marker(&self, manager: &TopicManager, name: &TopicName) -> Pending {
        Pending {
            topic: name.to_string(),
            from: pending::high_water_mark(manager, name),
            count: self.count,
            records_digest: self.digest.clone(),
            fingerprint: self.fp.clone(),
            request: self.request.clone(),
        }
    }
}

/// Runs `publish` (the append of the request's records) under `check`
/// (none: just `publish`).
///
/// # Errors
/// `publish`'s, 409 for a refused retry, 500 when the metadata store fails
/// before anything was stored.
pub(super) async fn checked(
    manager: &TopicManager,
    name: &TopicName,
    check: Option<Check>,
    publish: impl Future<Output = Result<PublishAck, ApiError>>,
) -> Result<PublishAck, ApiError> {
    match check {
        None => publish.await,
        Some(check) => match &check.request {
            PendingRequest::Key { .. } => idempotent(manager, name, check, publish).await,
            PendingRequest::Producer { .. } => sequenced(manager, name, check, publish).await,
        },
    }
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

/// Steps 1–3 of [`crate::pending`]: marks, runs `publish`, then writes
/// the answer that `answer` makes of the acknowledgement (or deletes the
/// marker when `publish` failed).
async fn marked(
    manager: &TopicManager,
    name: &TopicName,
    store_key: &str,
    marker: Pending,
    publish: impl Future<Output = Result<PublishAck, ApiError>>,
    answer: impl FnOnce(&PublishAck) -> serde_json::Value,
) -> Result<PublishAck, ApiError> {
    pending::mark(manager, store_key, &marker)
        .await
        .map_err(store_error)?;
    match publish.await {
        Ok(ack) => {
            if let Err(e) = pending::complete(manager, store_key, answer(&ack)).await {
                LEFTOVERS.store(true, Ordering::Relaxed);
                error!(error = %e, topic = %name, "the retry answer could not be recorded; the marker stays and is settled by the next retry or restart");
            }
            Ok(ack)
        }
        Err(refused) => {
            if let Err(e) = pending::abandon(manager, store_key).await {
                LEFTOVERS.store(true, Ordering::Relaxed);
                error!(error = %e, topic = %name, "the marker of a refused publish could not be deleted; the next retry or restart settles it");
            }
            Err(refused)
        }
    }
}

/// Runs `publish` unless the `Idempotency-Key` of `request` was already
/// used on `name`: then the remembered answer (same request, fingerprint
/// `fp`) or 409 (another request). See [`crate::idempotency`].
async fn idempotent(
    manager: &TopicManager,
    name: &TopicName,
    check: Check,
    publish: impl Future<Output = Result<PublishAck, ApiError>>,
) -> Result<PublishAck, ApiError> {
    let PendingRequest::Key { key } = &check.request else {
        return publish.await;
    };
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
            .with("base_offset", json!(used.base_offset)));
        }
        debug!(topic = %name, key, "idempotent retry: answering the original offsets");
        return Ok(PublishAck {
            base_offset: used.base_offset,
            next_offset: used.next_offset,
            count: used.count,
        });
    }
    let marker = check.marker(manager, name);
    marked(manager, name, &store_key, marker, publish, |ack| {
        idem::answer(check.fp, ack)
    })
    .await
}

/// Runs `publish` unless [`crate::sequence::decide`] says the batch of
/// `request`'s producer is a retry (the remembered answer) or refused
/// (409). Requests of one producer on `name` run one after the other.
async fn sequenced(
    manager: &TopicManager,
    name: &TopicName,
    check: Check,
    publish: impl Future<Output = Result<PublishAck, ApiError>>,
) -> Result<PublishAck, ApiError> {
    let PendingRequest::Producer {
        producer_id,
        first_sequence: first,
        last_sequence: last,
    } = &check.request
    else {
        return publish.await;
    };
    let (first, last) = (*first, *last);
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
            return Err(err);
        }
    }
    let marker = check.marker(manager, name);
    marked(manager, name, &store_key, marker, publish, |ack| {
        seq::answer(state, first, last, check.fp, ack)
    })
    .await
}
