//! Where an edge's batch spends its time in this broker, stage by stage,
//! for `tributary_broker_ingest_stage_seconds` on `/metrics` (process-wide,
//! no per-topic label: a broker may serve thousands of topics).
//!
//! | stage | from | to |
//! |---|---|---|
//! | `receive` | the read that brought the frame's first bytes | the read that completed it (0 when one read brought it all) |
//! | `decode` | the frame is decoded from the stream buffer | the ingest state machine checked it (CRC, offsets, namespace) |
//! | `append` | the batch is checked | the WAL took it (`enqueue_at`: the un-archived budget check, room in the topic writer's queue) |
//! | `durable` | the WAL took it | the stream's writer task saw it durable per the sync mode (it waits for batches in order, so this includes waiting behind earlier ones) |
//! | `ack` | the writer saw it durable | its `Ack` frame was written to the stream |
//!
//! One observation per batch frame in every stage (a batch the broker
//! already holds, acknowledged as a duplicate, included; repairs and holes
//! not). Per batch the stages follow one another; across batches they
//! overlap, so a stage's sum over an interval divided by the interval is
//! the mean number of batches in it at once.
//!
//! Cost: one `Instant::now()` per stage boundary and one histogram update
//! (a short mutex in `prometheus-client`) per stage, through handles
//! created once; nothing allocated per batch.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use broker_core::service::STAGE_BUCKETS_SECONDS;

/// A stage of an edge's batch in the broker (the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Reading the frame off the stream.
    Receive,
    /// Decoding and checking it.
    Decode,
    /// Handing the batch to the WAL.
    Append,
    /// Until the writer task saw it durable.
    Durable,
    /// Writing its acknowledgement.
    Ack,
}

impl Stage {
    /// Every stage, in a batch's order; `stage as usize` indexes it.
    pub const ALL: [Stage; 5] = [
        Stage::Receive,
        Stage::Decode,
        Stage::Append,
        Stage::Durable,
        Stage::Ack,
    ];

    /// The `stage` label value.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Receive => "receive",
            Stage::Decode => "decode",
            Stage::Append => "append",
            Stage::Durable => "durable",
            Stage::Ack => "ack",
        }
    }
}

/// The `stage` label of the family.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// [`Stage::label`].
    pub stage: &'static str,
}

/// The histogram family, and a handle on each stage's histogram so an
/// observation takes no family lookup.
pub type StageFamily = Family<StageLabel, Histogram, fn() -> Histogram>;

/// One histogram of durations (seconds) per [`Stage`], process-wide.
#[derive(Debug)]
pub struct StageTimes {
    family: StageFamily,
    handles: [Histogram; Stage::ALL.len()],
}

fn stage_histogram() -> Histogram {
    Histogram::new(STAGE_BUCKETS_SECONDS)
}

impl Default for StageTimes {
    fn default() -> Self {
        let family = StageFamily::new_with_constructor(stage_histogram);
        let handles = Stage::ALL.map(|stage| {
            family
                .get_or_create(&StageLabel {
                    stage: stage.label(),
                })
                .clone()
        });
        StageTimes { family, handles }
    }
}

impl StageTimes {
    /// Records that a batch spent `took` in `stage`.
    pub fn observe(&self, stage: Stage, took: Duration) {
        self.handles[stage as usize].observe(took.as_secs_f64());
    }

    /// The family, to register with a scrape's registry (a handle sharing
    /// the counts).
    pub fn family(&self) -> StageFamily {
        self.family.clone()
    }
}

/// The stage times of this process (the replication endpoint adds to
/// them, `/metrics` shows them).
pub static INGEST_STAGES: LazyLock<StageTimes> = LazyLock::new(StageTimes::default);

/// The `receive` clock of one stream: when the frame being read began to
/// arrive. Frames are decoded after every read until only a partial frame
/// is left, so a decoded frame was completed by the latest read, and the
/// bytes after it arrived in that read too.
#[derive(Debug, Default)]
pub struct FrameClock {
    /// When the first bytes of the frame being read arrived (`None`:
    /// nothing buffered).
    started: Option<Instant>,
    /// When the latest read returned.
    last_read: Option<Instant>,
}

impl FrameClock {
    /// A read returned bytes at `now`.
    pub fn on_read(&mut self, now: Instant) {
        self.last_read = Some(now);
        self.started.get_or_insert(now);
    }

    /// A whole frame was decoded from the buffer, which `rest_empty` says
    /// holds nothing more: how long the frame took to arrive.
    pub fn on_frame(&mut self, rest_empty: bool) -> Duration {
        let Some(completed) = self.last_read else {
            return Duration::ZERO;
        };
        let took = completed.saturating_duration_since(self.started.unwrap_or(completed));
        self.started = (!rest_empty).then_some(completed);
        took
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_timed_from_its_first_read_to_the_read_completing_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut clock = FrameClock::default();
        // Frame A over three reads; frame B starts in the third.
        clock.on_read(t0);
        clock.on_read(t0 + ms(2));
        clock.on_read(t0 + ms(5));
        assert_eq!(clock.on_frame(false), ms(5), "A");
        // B completes in the next read, with C whole in it and nothing after.
        clock.on_read(t0 + ms(9));
        assert_eq!(clock.on_frame(false), ms(4), "B");
        assert_eq!(clock.on_frame(true), Duration::ZERO, "C: one read");
        // The next frame starts with the next read.
        clock.on_read(t0 + ms(20));
        clock.on_read(t0 + ms(21));
        assert_eq!(clock.on_frame(true), ms(1), "D");
    }

    #[test]
    fn a_frame_before_any_read_takes_no_time() {
        assert_eq!(FrameClock::default().on_frame(true), Duration::ZERO);
    }

    #[test]
    fn every_stage_has_its_own_series() {
        let times = StageTimes::default();
        times.observe(Stage::Durable, Duration::from_millis(3));
        times.observe(Stage::Durable, Duration::from_millis(1));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "tributary_broker_ingest_stage_seconds",
            "Seconds batches spent in each ingest stage",
            times.family(),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "# TYPE tributary_broker_ingest_stage_seconds histogram",
            "tributary_broker_ingest_stage_seconds_count{stage=\"durable\"} 2",
            "tributary_broker_ingest_stage_seconds_sum{stage=\"durable\"} 0.004",
            "tributary_broker_ingest_stage_seconds_count{stage=\"receive\"} 0",
            "tributary_broker_ingest_stage_seconds_bucket{le=\"0.002\",stage=\"durable\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let labels: Vec<&str> = Stage::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(labels, ["receive", "decode", "append", "durable", "ack"]);
    }
}
