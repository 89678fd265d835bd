//! The broker's local topic WALs as the storage endpoints see them:
//! [`LocalSegments`] (`trim` with the committed tiered offset as the safe
//! offset, `seal` for an unload), implemented by the broker's
//! [`crate::replication::topics::TopicStore`] and by test doubles, all through
//! [`trim_wal`] and [`seal_wal`].

use std::sync::Arc;

use axum::{Extension, Router};
use broker_core::catalog::CatalogError;
use broker_core::metadata::BoxFuture;
use broker_core::wal::Wal;
use serde::{Deserialize, Serialize};
use tributary_proto::keys::TopicName;

/// Access to the broker's local topic WALs for the `trim` endpoint.
pub trait LocalSegments: Send + Sync {
    /// Applies `topic`'s local retention with `safe_offset` as the safe
    /// offset: only sealed segments entirely below it may be deleted, and
    /// only while a retention limit asks for it
    /// ([`broker_core::wal::Wal::apply_retention`]).
    fn trim<'a>(
        &'a self,
        topic: &'a TopicName,
        safe_offset: u64,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<TrimReport, String>>;

    /// Seals `topic`'s active segment (if it holds records) so everything
    /// written so far can be tiered, for an unload. `None` when the topic
    /// has no local WAL. The default refuses (not supported).
    fn seal<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<SealReport, String>> {
        let _ = topic;
        Box::pin(async { Err("sealing is not supported by this broker".to_owned()) })
    }

    /// What the descriptor rules need to know of `topic`'s local WAL (log
    /// start, high-water mark, sealed segments); `None` when this broker
    /// does not hold the topic's WAL. The default holds none, so every
    /// descriptor is refused (`wal_not_local`).
    fn view<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<Option<WalView>, String>> {
        let _ = topic;
        Box::pin(async { Ok(None) })
    }
}

/// A topic's local WAL as the descriptor rules see it
/// ([`super::commit_verified`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalView {
    /// First offset still stored locally.
    pub log_start: u64,
    /// Offset just past the last durable record.
    pub high_water_mark: u64,
    /// `(base_offset, next_offset)` of each sealed segment, oldest first.
    pub sealed: Vec<(u64, u64)>,
}

impl WalView {
    /// The view of an open WAL.
    pub fn of(wal: &Wal) -> WalView {
        WalView {
            log_start: wal.log_start_offset(),
            high_water_mark: wal.high_water_mark(),
            sealed: wal
                .sealed_segments()
                .iter()
                .map(|s| (s.base_offset, s.next_offset))
                .collect(),
        }
    }

    /// True if every offset of `start..next` at or above the log start lies
    /// in a sealed segment (offsets below the log start are no longer held
    /// locally and are not judged here).
    pub fn sealed_covers(&self, start: u64, next: u64) -> bool {
        let mut from = start.max(self.log_start);
        for &(base, end) in &self.sealed {
            if from >= next {
                break;
            }
            if base <= from && from < end {
                from = end;
            }
        }
        from >= next
    }
}

/// What a `seal` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealReport {
    /// Offset just past the last record stored locally (every offset below
    /// it is now in a sealed segment); `None` without a local WAL.
    pub next_offset: Option<u64>,
}

/// What a `trim` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrimReport {
    /// Whether the topic's WAL is open on this broker (nothing is trimmed
    /// otherwise).
    pub wal_open: bool,
    /// `(base_offset, next_offset, bytes)` of each deleted segment.
    pub deleted: Vec<(u64, u64, u64)>,
    /// First offset still stored locally, when the WAL is open.
    pub log_start: Option<u64>,
}

/// The topic's WAL, opened if no edge or publisher opened it since the
/// broker started (a trim or an unload must not wait for one); `None` for a
/// topic the catalog does not know.
async fn open_local(
    topics: &crate::replication::topics::TopicStore,
    topic: &TopicName,
) -> Result<Option<Arc<broker_core::wal::Wal>>, String> {
    match topics.open_existing(topic, false).await {
        Ok(wal) => Ok(Some(wal)),
        Err(crate::replication::topics::TopicError::Catalog(CatalogError::TopicNotFound {
            ..
        })) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl LocalSegments for crate::replication::topics::TopicStore {
    fn trim<'a>(
        &'a self,
        topic: &'a TopicName,
        safe_offset: u64,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<TrimReport, String>> {
        Box::pin(async move {
            // A WAL not opened since the broker started (no edge wrote to
            // the topic yet) is opened now: trims must not wait for an edge.
            let Some(wal) = open_local(self, topic).await? else {
                return Ok(TrimReport::default());
            };
            trim_wal(wal, safe_offset, now_ms).await
        })
    }

    fn seal<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<SealReport, String>> {
        Box::pin(async move {
            let Some(wal) = open_local(self, topic).await? else {
                return Ok(SealReport::default());
            };
            seal_wal(&wal).await
        })
    }

    fn view<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<Option<WalView>, String>> {
        Box::pin(async move {
            let Some(wal) = open_local(self, topic).await? else {
                return Ok(None);
            };
            Ok(Some(WalView::of(&wal)))
        })
    }
}

/// The `trim` of one open WAL: applies its local retention with
/// `safe_offset` as the safe offset at `now_ms` (ms since the Unix epoch)
/// on a blocking thread ([`Wal::apply_retention`]: only sealed segments
/// entirely below the safe offset, and only while a retention limit asks
/// for it), and reports what was deleted. Every [`LocalSegments`]
/// implementation trims through this.
///
/// # Errors
/// The WAL's error, or a failed blocking task, as text.
pub async fn trim_wal(wal: Arc<Wal>, safe_offset: u64, now_ms: i64) -> Result<TrimReport, String> {
    let report = tokio::task::spawn_blocking(move || wal.apply_retention(safe_offset, now_ms))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(TrimReport {
        wal_open: true,
        deleted: report.deleted,
        log_start: Some(report.log_start),
    })
}

/// The `seal` of one open WAL: rolls its active segment (if it holds
/// records) and reports the offset just past its last record.
///
/// # Errors
/// The WAL's error, as text.
pub async fn seal_wal(wal: &Wal) -> Result<SealReport, String> {
    wal.roll().await.map_err(|e| e.to_string())?;
    Ok(SealReport {
        next_offset: Some(wal.next_offset()),
    })
}

/// Adds the broker's local WALs to `router` so `POST
/// /v1/storage/topics/{ns}/{topic}/trim` can apply retention.
pub fn with_local_segments(router: Router, segments: Arc<dyn LocalSegments>) -> Router {
    router.layer(Extension(segments))
}
