//! When the broker sends an acknowledgement datagram again, without I/O.
//!
//! An [`AckDatagram`] usually leaves in the same packet as the `Ack` frame it
//! repeats, so one lost packet loses both; the stream then holds every later
//! `Ack` frame until the lost one is resent (one to several round trips on a
//! lossy link), and if no later batch arrives, no later datagram comes to
//! make up for it either. So the newest datagram is sent again, in separate
//! packets, a few times at growing gaps — [`REPEATS`] times, the first after
//! a quarter of the round-trip time (at least [`MIN_GAP`]), each gap twice
//! the one before — unless a newer acknowledgement replaces it. When
//! acknowledgements follow each other closer than the first gap (a busy
//! stream on a fast path) nothing is repeated; otherwise (a slow link, or
//! the last batch of a burst) each acknowledgement costs up to [`REPEATS`]
//! more datagrams of [`ACK_DATAGRAM_BYTES`](super::frame::ACK_DATAGRAM_BYTES)
//! bytes. The driver sends due repeats when it is not busy writing or
//! waiting for a batch to become durable.

use std::time::{Duration, Instant};

use super::frame::AckDatagram;

/// Times the newest acknowledgement datagram is sent again.
pub const REPEATS: u32 = 3;
/// Shortest gap before the first repeat.
pub const MIN_GAP: Duration = Duration::from_millis(25);

/// The repeat schedule of one stream's newest acknowledgement datagram.
#[derive(Debug, Default)]
pub struct AckRepeats {
    /// The datagram, when it is due next, the gap after that, repeats left.
    pending: Option<(AckDatagram, Instant, Duration, u32)>,
}

impl AckRepeats {
    /// Records that `datagram` was just sent (at `now`, on a connection with
    /// round-trip estimate `rtt`): it replaces any older one's schedule.
    pub fn on_sent(&mut self, datagram: AckDatagram, now: Instant, rtt: Duration) {
        let gap = (rtt / 4).max(MIN_GAP);
        self.pending = Some((datagram, now + gap, gap * 2, REPEATS));
    }

    /// When the next repeat is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.map(|(_, due, _, _)| due)
    }

    /// The datagram to send again at `now`, if one is due; schedules the
    /// next repeat.
    pub fn due(&mut self, now: Instant) -> Option<AckDatagram> {
        let (datagram, due, gap, left) = self.pending?;
        if now < due {
            return None;
        }
        self.pending = (left > 1).then(|| (datagram, now + gap, gap * 2, left - 1));
        Some(datagram)
    }
}

// An origin instant for the `now` arguments (proto/clippy.toml).
#[allow(clippy::disallowed_methods)]
#[cfg(test)]
mod tests {
    use super::*;

    fn ack(next_offset: u64) -> AckDatagram {
        AckDatagram {
            stream_id: 0,
            next_offset,
        }
    }

    #[test]
    fn the_newest_datagram_is_repeated_three_times_at_doubling_gaps() {
        #[allow(clippy::disallowed_methods)] // an origin instant: the test reads no clock after it
        let t0 = Instant::now();
        let rtt = Duration::from_millis(600);
        let mut repeats = AckRepeats::default();
        assert_eq!(repeats.next_due(), None);
        repeats.on_sent(ack(10), t0, rtt);
        let ms = Duration::from_millis;
        assert_eq!(repeats.next_due(), Some(t0 + ms(150)));
        assert_eq!(repeats.due(t0 + ms(149)), None);
        assert_eq!(repeats.due(t0 + ms(150)), Some(ack(10)));
        assert_eq!(repeats.next_due(), Some(t0 + ms(450)));
        assert_eq!(repeats.due(t0 + ms(450)), Some(ack(10)));
        assert_eq!(repeats.next_due(), Some(t0 + ms(1050)));
        assert_eq!(repeats.due(t0 + ms(1100)), Some(ack(10)));
        assert_eq!(repeats.next_due(), None);
        assert_eq!(repeats.due(t0 + ms(10_000)), None);
    }

    #[test]
    fn a_newer_acknowledgement_replaces_the_schedule() {
        #[allow(clippy::disallowed_methods)] // an origin instant: the test reads no clock after it
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut repeats = AckRepeats::default();
        repeats.on_sent(ack(10), t0, ms(600));
        assert_eq!(repeats.due(t0 + ms(150)), Some(ack(10)));
        repeats.on_sent(ack(20), t0 + ms(200), ms(600));
        assert_eq!(repeats.next_due(), Some(t0 + ms(350)));
        assert_eq!(repeats.due(t0 + ms(350)), Some(ack(20)));
    }

    #[test]
    fn a_short_round_trip_still_waits_the_minimum_gap() {
        #[allow(clippy::disallowed_methods)] // an origin instant: the test reads no clock after it
        let t0 = Instant::now();
        let mut repeats = AckRepeats::default();
        repeats.on_sent(ack(1), t0, Duration::from_micros(80));
        assert_eq!(repeats.next_due(), Some(t0 + MIN_GAP));
    }
}
