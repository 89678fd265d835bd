//! The in-memory ring of a `realtime` topic: no WAL, bounded by a record
//! count, oldest records dropped (and counted) when full.
//!
//! Offsets are assigned contiguously like a WAL's: record `i` of the ring is
//! at `first_offset + i`, and `next_offset` never goes back. Records leave
//! the ring in three ways, all from the front: dropped when a push would pass
//! the capacity (counted in [`RingStats::dropped_records`]), released once
//! the broker acknowledged them ([`RealtimeRing::release_below`]), or
//! skipped by [`RealtimeRing::advance_to`].

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;
use tributary_proto::Record;

/// Offsets assigned by one [`RealtimeRing::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingPush {
    /// Offset of the first pushed record.
    pub base_offset: u64,
    /// Offset just past the last pushed record.
    pub next_offset: u64,
    /// Offsets dropped from the front to make room, `start..end`; `None`
    /// when nothing was dropped.
    pub dropped: Option<(u64, u64)>,
}

/// What [`RealtimeRing::read`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingRead {
    /// Offset of `records[0]` (the requested offset, or the ring's first
    /// offset if the requested one is gone).
    pub base_offset: u64,
    /// Records at `base_offset..`, contiguous.
    pub records: Vec<Record>,
}

/// Counters of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingStats {
    /// Capacity, records.
    pub capacity_records: u32,
    /// Offset of the oldest record held (= `next_offset` when empty).
    pub first_offset: u64,
    /// Offset the next pushed record gets.
    pub next_offset: u64,
    /// Records held.
    pub len_records: u64,
    /// Approximate bytes held: key, header names and values, values.
    pub len_bytes: u64,
    /// Records dropped because the ring was full, since the agent started.
    pub dropped_records: u64,
}

#[derive(Debug)]
struct RingState {
    /// `records[i]` has offset `first_offset + i`.
    records: VecDeque<Record>,
    first_offset: u64,
    bytes: u64,
    dropped_records: u64,
}

impl RingState {
    fn next_offset(&self) -> u64 {
        self.first_offset + self.records.len() as u64
    }

    fn pop_front(&mut self) {
        if let Some(record) = self.records.pop_front() {
            self.bytes = self.bytes.saturating_sub(record_bytes(&record));
            self.first_offset += 1;
        }
    }
}

/// Approximate in-memory size of a record's payload, bytes.
pub fn record_bytes(record: &Record) -> u64 {
    let key = record.key.as_ref().map_or(0, |k| k.len());
    let headers: usize = record
        .headers
        .iter()
        .map(|(name, value)| name.len() + value.len())
        .sum();
    (key + headers + record.value.len()) as u64
}

/// A bounded ring of records. All methods take `&self`.
#[derive(Debug)]
pub struct RealtimeRing {
    capacity: u32,
    state: Mutex<RingState>,
    /// The next offset, for waiting readers.
    next: watch::Sender<u64>,
}

impl RealtimeRing {
    /// An empty ring of `capacity_records` (at least 1) whose first record
    /// gets `next_offset`.
    pub fn new(capacity_records: u32, next_offset: u64) -> RealtimeRing {
        let capacity = capacity_records.max(1);
        let (next, _) = watch::channel(next_offset);
        RealtimeRing {
            capacity,
            state: Mutex::new(RingState {
                records: VecDeque::with_capacity(capacity.min(4096) as usize),
                first_offset: next_offset,
                bytes: 0,
                dropped_records: 0,
            }),
            next,
        }
    }

    fn state(&self) -> MutexGuard<'_, RingState> {
        // Poisoning means a panic while holding the lock; the state is only
        // mutated by code that cannot panic half-way.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `records` at the next offsets, dropping the oldest records
    /// (possibly some of `records` themselves) beyond the capacity.
    pub fn push(&self, records: Vec<Record>) -> RingPush {
        let mut state = self.state();
        let base_offset = state.next_offset();
        let dropped_from = state.first_offset;
        for record in records {
            state.bytes += record_bytes(&record);
            state.records.push_back(record);
        }
        let mut dropped = 0u64;
        while state.records.len() > self.capacity as usize {
            state.pop_front();
            dropped += 1;
        }
        state.dropped_records += dropped;
        let next_offset = state.next_offset();
        drop(state);
        self.next.send_replace(next_offset);
        RingPush {
            base_offset,
            next_offset,
            dropped: (dropped > 0).then_some((dropped_from, dropped_from + dropped)),
        }
    }

    /// Up to `max_records` records from `from_offset` on (from the first
    /// record held if `from_offset` was dropped or released). Empty when
    /// `from_offset` is at or past the end.
    pub fn read(&self, from_offset: u64, max_records: usize) -> RingRead {
        let state = self.state();
        let base_offset = from_offset.max(state.first_offset);
        let skip = (base_offset - state.first_offset) as usize;
        let records = state
            .records
            .iter()
            .skip(skip)
            .take(max_records)
            .cloned()
            .collect();
        RingRead {
            base_offset,
            records,
        }
    }

    /// Removes records below `offset` (acknowledged by the broker). Returns
    /// how many were removed.
    pub fn release_below(&self, offset: u64) -> u64 {
        let mut state = self.state();
        let mut released = 0;
        while state.first_offset < offset && !state.records.is_empty() {
            state.pop_front();
            released += 1;
        }
        released
    }

    /// Moves the ring's offsets up so its first record is at `offset`, if it
    /// is below: the broker already holds offsets below `offset` (after the
    /// agent crashed before persisting a checkpoint, say), so none of them
    /// may be sent again. Records held keep their order and are renumbered
    /// from `offset`. Returns whether anything changed.
    pub fn advance_to(&self, offset: u64) -> bool {
        let mut state = self.state();
        if state.first_offset >= offset || state.records.len() as u64 > u64::MAX - offset {
            return false;
        }
        state.first_offset = offset;
        let next = state.next_offset();
        drop(state);
        self.next.send_replace(next);
        true
    }

    /// Offset the next pushed record gets.
    pub fn next_offset(&self) -> u64 {
        self.state().next_offset()
    }

    /// Waits until a record at `offset` exists (the next offset is above
    /// it) and returns the next offset. Woken by [`RealtimeRing::push`].
    pub async fn wait_for_offset(&self, offset: u64) -> u64 {
        let mut rx = self.next.subscribe();
        match rx.wait_for(|&next| next > offset).await {
            Ok(next) => *next,
            // The sender lives in `self`, which the caller borrows.
            Err(_) => self.next_offset(),
        }
    }

    /// Counters and bounds now.
    pub fn stats(&self) -> RingStats {
        let state = self.state();
        RingStats {
            capacity_records: self.capacity,
            first_offset: state.first_offset,
            next_offset: state.next_offset(),
            len_records: state.records.len() as u64,
            len_bytes: state.bytes,
            dropped_records: state.dropped_records,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn rec(v: &str) -> Record {
        Record {
            timestamp_ms: 1,
            key: None,
            headers: Vec::new(),
            value: Bytes::copy_from_slice(v.as_bytes()),
        }
    }

    fn values(read: &RingRead) -> Vec<&[u8]> {
        read.records.iter().map(|r| r.value.as_ref()).collect()
    }

    #[test]
    fn push_assigns_contiguous_offsets_and_drops_oldest() {
        let ring = RealtimeRing::new(3, 10);
        assert_eq!(
            ring.push(vec![rec("a"), rec("b")]),
            RingPush {
                base_offset: 10,
                next_offset: 12,
                dropped: None
            }
        );
        assert_eq!(
            ring.push(vec![rec("c"), rec("d")]),
            RingPush {
                base_offset: 12,
                next_offset: 14,
                dropped: Some((10, 11))
            }
        );
        let read = ring.read(0, 10);
        assert_eq!(read.base_offset, 11);
        assert_eq!(values(&read), [b"b", b"c", b"d"]);
        let stats = ring.stats();
        assert_eq!(
            stats,
            RingStats {
                capacity_records: 3,
                first_offset: 11,
                next_offset: 14,
                len_records: 3,
                len_bytes: 3,
                dropped_records: 1,
            }
        );
    }

    #[test]
    fn a_push_larger_than_the_ring_keeps_its_newest_records() {
        let ring = RealtimeRing::new(2, 0);
        let push = ring.push(vec![rec("a"), rec("b"), rec("c"), rec("d"), rec("e")]);
        assert_eq!(push.base_offset, 0);
        assert_eq!(push.next_offset, 5);
        assert_eq!(push.dropped, Some((0, 3)));
        assert_eq!(values(&ring.read(0, 10)), [b"d", b"e"]);
        assert_eq!(ring.stats().dropped_records, 3);
    }

    #[test]
    fn read_windows_and_release() {
        let ring = RealtimeRing::new(10, 0);
        ring.push(vec![rec("a"), rec("b"), rec("c"), rec("d")]);
        let read = ring.read(1, 2);
        assert_eq!(read.base_offset, 1);
        assert_eq!(values(&read), [b"b", b"c"]);
        assert_eq!(ring.read(4, 10).records.len(), 0);
        assert_eq!(ring.read(4, 10).base_offset, 4);
        assert_eq!(ring.release_below(3), 3);
        assert_eq!(ring.release_below(3), 0);
        assert_eq!(ring.stats().first_offset, 3);
        assert_eq!(ring.stats().dropped_records, 0);
        // Releasing past the end empties the ring but keeps the offsets.
        assert_eq!(ring.release_below(100), 1);
        assert_eq!(ring.next_offset(), 4);
        assert_eq!(ring.push(vec![rec("e")]).base_offset, 4);
    }

    #[test]
    fn advance_renumbers_held_records() {
        let ring = RealtimeRing::new(10, 5);
        ring.push(vec![rec("a"), rec("b")]);
        assert!(ring.advance_to(20));
        assert!(!ring.advance_to(20));
        assert!(!ring.advance_to(3));
        let read = ring.read(0, 10);
        assert_eq!(read.base_offset, 20);
        assert_eq!(values(&read), [b"a", b"b"]);
        assert_eq!(ring.next_offset(), 22);
    }

    #[tokio::test]
    async fn wait_for_offset_wakes_on_push() {
        let ring = std::sync::Arc::new(RealtimeRing::new(4, 0));
        let waiter = {
            let ring = ring.clone();
            tokio::spawn(async move { ring.wait_for_offset(1).await })
        };
        ring.push(vec![rec("a")]);
        tokio::task::yield_now().await;
        ring.push(vec![rec("b")]);
        assert_eq!(waiter.await.unwrap(), 2);
    }
}
