//! A QUIC congestion controller for a link whose rate the operator declared
//! (`congestion_controller = "declared_rate"` with
//! `bandwidth_cap_bytes_per_s`): the window is twice the bandwidth-delay
//! product of that rate and the path's minimum round-trip time, and loss
//! does not shrink it.
//!
//! On a dedicated lossy link (radio, satellite) random loss says nothing
//! about congestion: Cubic halves its window on every loss and leaves the
//! link idle, BBR probes above the rate and overfills the bottleneck's
//! queue. A window of 2 × rate × min RTT keeps the link busy while lost
//! packets wait to be detected, and bounds the queue to one
//! bandwidth-delay product as long as the declared rate is not above the
//! real one (`docs/benchmarks.md`, "Thin link"). The replicator's token
//! bucket still caps new batch-frame bytes at the declared rate; QUIC's
//! headers, acknowledgements and resends of lost packets come on top, and
//! only the window bounds them. On a shared link, or with a declared rate
//! above the real one, this controller does not back off: that is the
//! operator's declaration.
//!
//! The minimum RTT is the controller's own (the shortest time from sending
//! a packet to receiving its acknowledgement), not quinn's estimate; see
//! [`DeclaredRate::on_rtt_sample`].

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;

/// The smallest window, in datagrams of the current MTU.
const MIN_WINDOW_DATAGRAMS: u64 = 4;

/// The window for `rate` bytes/s over a path of `min_rtt`: 2 × rate ×
/// min RTT, at least [`MIN_WINDOW_DATAGRAMS`] datagrams of `mtu` bytes.
pub fn window_for(rate: u64, min_rtt: Duration, mtu: u16) -> u64 {
    let bdp = u128::from(rate).saturating_mul(min_rtt.as_micros()) / 1_000_000;
    let window = u64::try_from(bdp.saturating_mul(2)).unwrap_or(u64::MAX);
    window.max(MIN_WINDOW_DATAGRAMS * u64::from(mtu))
}

/// RFC 9002 §7.2's initial window for `mtu`, used until the first RTT
/// sample: min(10 × mtu, max(14720, 2 × mtu)) bytes.
fn initial_window(mtu: u16) -> u64 {
    let mtu = u64::from(mtu);
    (10 * mtu).min(14_720.max(2 * mtu))
}

/// The controller of one connection.
#[derive(Debug, Clone)]
pub struct DeclaredRate {
    rate: u64,
    mtu: u16,
    /// Shortest round trip of an acknowledged packet so far.
    min_rtt: Option<Duration>,
    window: u64,
}

impl DeclaredRate {
    /// A controller for `rate` bytes/s on a path of `mtu` bytes, starting
    /// at RFC 9002's initial window.
    pub fn new(rate: u64, mtu: u16) -> DeclaredRate {
        DeclaredRate {
            rate,
            mtu,
            min_rtt: None,
            window: initial_window(mtu),
        }
    }

    /// Takes the round trip of one acknowledged packet (sent → its ack
    /// received, so including the peer's ack delay) and sizes the window
    /// from the shortest seen.
    ///
    /// The controller measures this itself rather than reading
    /// `RttEstimator::min`: quinn starts that minimum at its configured
    /// initial RTT (333 ms) and only lowers it, so on a longer path it
    /// never reports the real one, and it is updated only after the
    /// controller has seen the acknowledgement.
    pub fn on_rtt_sample(&mut self, sample: Duration) {
        let min_rtt = self.min_rtt.map_or(sample, |m| m.min(sample));
        self.min_rtt = Some(min_rtt);
        self.window = window_for(self.rate, min_rtt, self.mtu);
    }
}

impl Controller for DeclaredRate {
    fn on_ack(
        &mut self,
        now: std::time::Instant,
        sent: std::time::Instant,
        _bytes: u64,
        _app_limited: bool,
        _rtt: &RttEstimator,
    ) {
        self.on_rtt_sample(now.saturating_duration_since(sent));
    }

    fn on_congestion_event(
        &mut self,
        _now: std::time::Instant,
        _sent: std::time::Instant,
        _is_persistent_congestion: bool,
        _lost_bytes: u64,
    ) {
        // Loss is not a congestion signal on a declared link.
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = new_mtu;
        self.window = match self.min_rtt {
            Some(min_rtt) => window_for(self.rate, min_rtt, new_mtu),
            None => initial_window(new_mtu),
        };
    }

    fn window(&self) -> u64 {
        self.window
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        initial_window(self.mtu)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Builds a [`DeclaredRate`] controller for each connection.
#[derive(Debug, Clone, Copy)]
pub struct DeclaredRateFactory {
    /// The link's declared rate, bytes per second.
    pub rate: u64,
}

impl ControllerFactory for DeclaredRateFactory {
    fn build(self: Arc<Self>, _now: std::time::Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(DeclaredRate::new(self.rate, current_mtu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_twice_the_bandwidth_delay_product_with_a_floor() {
        // 64 kbit/s over 750 ms: 6000 bytes in flight on the path.
        assert_eq!(window_for(8000, Duration::from_millis(750), 1200), 12_000);
        // 100 MB/s over 20 ms.
        assert_eq!(
            window_for(100_000_000, Duration::from_millis(20), 1200),
            4_000_000
        );
        // Loopback: four datagrams.
        assert_eq!(window_for(8000, Duration::from_micros(50), 1200), 4800);
        assert_eq!(window_for(u64::MAX, Duration::MAX, 1200), u64::MAX);
    }

    #[test]
    fn the_window_follows_the_shortest_measured_round_trip() {
        let mut controller = DeclaredRate::new(8000, 1200);
        assert_eq!(controller.window(), 12_000);
        // A 600 ms path plus queueing: only the shortest sample counts,
        // whatever quinn's initial RTT guess was.
        controller.on_rtt_sample(Duration::from_millis(1500));
        assert_eq!(controller.window(), 24_000);
        controller.on_rtt_sample(Duration::from_millis(750));
        assert_eq!(controller.window(), 12_000);
        controller.on_rtt_sample(Duration::from_millis(2000));
        assert_eq!(controller.window(), 12_000);
        controller.on_mtu_update(1452);
        assert_eq!(controller.window(), 12_000);
    }

    #[test]
    fn loss_leaves_the_window_alone_and_the_start_is_rfc_9002s() {
        let now = std::time::Instant::now();
        let mut controller = Arc::new(DeclaredRateFactory { rate: 8000 }).build(now, 1200);
        assert_eq!(controller.initial_window(), 12_000);
        assert_eq!(controller.window(), 12_000);
        controller.on_congestion_event(now, now, true, 50_000);
        assert_eq!(controller.window(), 12_000);
        controller.on_mtu_update(1452);
        assert_eq!(controller.initial_window(), 14_520);
    }
}
