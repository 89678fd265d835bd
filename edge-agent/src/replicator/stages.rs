//! Where a replicated batch spends its time on the edge, stage by stage,
//! for `tributary_edge_replication_stage_seconds` on `/metrics`.
//!
//! | stage | from | to | observations |
//! |---|---|---|---|
//! | `read` | a read-ahead step starts reading the WAL | the read returned | one per read step (up to 2 MiB: one or several batches) |
//! | `compress` | the previous batch of the step was framed (or the read returned) | this batch's frame is ready (zstd attempt and frame header) | one per batch read |
//! | `queue` | the frame is ready | the sending loop starts writing it: read-ahead budget, the send window (acknowledgements), the bandwidth cap | one per batch sent |
//! | `send` | `write_all` starts | quinn took the whole frame (stream and connection flow control, congestion window) | one per batch sent |
//! | `ack` | quinn took the frame | an acknowledgement covering the batch arrived (`Ack` frame or datagram, whichever first) | one per batch acknowledged on the stream that sent it |
//!
//! A batch's stages follow one another, so per batch they add up to its
//! time from the WAL to the acknowledgement; across batches they overlap
//! (the read-ahead and the window keep many batches in flight). Sum over
//! an interval divided by the interval is the mean number of batches in
//! that stage at once (Little's law). Frames read ahead but dropped when
//! a connection ends are counted in `read` and `compress` only; batches in
//! flight when it ends are not counted in `ack`.
//!
//! Cost: one `Instant::now()` per stage boundary and one histogram update
//! (a short mutex in `prometheus-client`) per stage; no allocation per
//! batch (the in-flight send times sit in a ring sized by the window).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;

use broker_core::service::STAGE_BUCKETS_SECONDS;

/// A stage of a replicated batch on the edge (the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Reading WAL batches (per read step).
    Read,
    /// Preparing one batch's frame (zstd attempt, header).
    Compress,
    /// Waiting between the read-ahead and the sending loop.
    Queue,
    /// Handing the frame to quinn (flow-control wait).
    Send,
    /// From quinn taking the frame to its acknowledgement.
    Ack,
}

impl Stage {
    /// Every stage, in a batch's order; `stage as usize` indexes it.
    pub const ALL: [Stage; 5] = [
        Stage::Read,
        Stage::Compress,
        Stage::Queue,
        Stage::Send,
        Stage::Ack,
    ];

    /// The `stage` label value.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Compress => "compress",
            Stage::Queue => "queue",
            Stage::Send => "send",
            Stage::Ack => "ack",
        }
    }
}

/// One histogram of durations (seconds) per [`Stage`], agent-wide (all
/// topics and connections together).
#[derive(Debug)]
pub struct StageTimes {
    histograms: [Histogram; Stage::ALL.len()],
}

impl Default for StageTimes {
    fn default() -> Self {
        StageTimes {
            histograms: std::array::from_fn(|_| Histogram::new(STAGE_BUCKETS_SECONDS)),
        }
    }
}

impl StageTimes {
    /// Records that a batch (or, for [`Stage::Read`], a read step) spent
    /// `took` in `stage`.
    pub fn observe(&self, stage: Stage, took: Duration) {
        self.histograms[stage as usize].observe(took.as_secs_f64());
    }

    /// Each stage with its histogram (handles sharing its counts), in
    /// [`Stage::ALL`] order.
    pub fn histograms(&self) -> impl Iterator<Item = (Stage, &Histogram)> {
        Stage::ALL.into_iter().zip(self.histograms.iter())
    }
}

/// When each batch a stream sent was taken by quinn, oldest first, until
/// an acknowledgement covers it: the start of its [`Stage::Ack`].
#[derive(Debug)]
pub(super) struct SentTimes {
    /// (the batch's next offset, when quinn took it); next offsets ascend.
    sent: VecDeque<(u64, Instant)>,
}

impl SentTimes {
    /// Room for `batches` in flight without reallocating (the send window).
    pub(super) fn with_capacity(batches: usize) -> SentTimes {
        SentTimes {
            sent: VecDeque::with_capacity(batches),
        }
    }

    /// A batch ending before `next_offset` went to quinn at `at`.
    pub(super) fn on_sent(&mut self, next_offset: u64, at: Instant) {
        self.sent.push_back((next_offset, at));
    }

    /// Everything below `next_offset` is acknowledged at `now`: calls
    /// `each` with the acknowledgement time of every batch this covers
    /// (each batch once; a stale or repeated acknowledgement covers none).
    pub(super) fn on_acked(
        &mut self,
        next_offset: u64,
        now: Instant,
        mut each: impl FnMut(Duration),
    ) {
        while let Some(&(end, at)) = self.sent.front() {
            if end > next_offset {
                break;
            }
            self.sent.pop_front();
            each(now.saturating_duration_since(at));
        }
    }

    /// Batches sent and not yet acknowledged.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.sent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledgement_times_each_batch_it_covers_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut sent = SentTimes::with_capacity(4);
        sent.on_sent(10, t0);
        sent.on_sent(20, t0 + ms(1));
        sent.on_sent(30, t0 + ms(2));
        let mut seen = Vec::new();
        // Inside the second batch: only the first is covered.
        sent.on_acked(15, t0 + ms(5), |d| seen.push(d));
        assert_eq!(seen, [ms(5)]);
        // Both remaining at once.
        sent.on_acked(30, t0 + ms(7), |d| seen.push(d));
        assert_eq!(seen, [ms(5), ms(6), ms(5)]);
        assert_eq!(sent.in_flight(), 0);
        // A repeated (datagram after frame) or older acknowledgement.
        sent.on_acked(30, t0 + ms(9), |d| seen.push(d));
        sent.on_acked(12, t0 + ms(9), |d| seen.push(d));
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn an_acknowledgement_before_the_send_time_counts_zero() {
        let t0 = Instant::now();
        let mut sent = SentTimes::with_capacity(1);
        sent.on_sent(1, t0 + Duration::from_secs(1));
        let mut seen = Vec::new();
        sent.on_acked(1, t0, |d| seen.push(d));
        assert_eq!(seen, [Duration::ZERO]);
    }

    #[test]
    fn buckets_ascend_from_10_us_to_10_s() {
        assert_eq!(STAGE_BUCKETS_SECONDS[0], 1e-5);
        assert_eq!(STAGE_BUCKETS_SECONDS[STAGE_BUCKETS_SECONDS.len() - 1], 10.0);
        assert!(STAGE_BUCKETS_SECONDS.windows(2).all(|w| w[0] < w[1]));
        let labels: Vec<&str> = Stage::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(labels, ["read", "compress", "queue", "send", "ack"]);
        for (i, stage) in Stage::ALL.iter().enumerate() {
            assert_eq!(*stage as usize, i);
        }
    }
}
