//! The ingest endpoint's receive budget: a bound on the bytes that all edge
//! connections together may have in flight to the broker, sent but not yet
//! read by their streams.
//!
//! QUIC flow control (RFC 9000 §4) lets a receiver grant each connection
//! credit (`MAX_DATA`) and each stream credit (`MAX_STREAM_DATA`); quinn's
//! defaults, sized for one bulk transfer, are 1.25 MB per stream and no
//! connection limit. A broker that is CPU-bound while a whole fleet
//! reconnects with backlogs (after an outage of the central site, say)
//! reads more slowly than the edges send, and without a connection limit
//! holds up to 1.25 MB per stream per edge: at 1,000 edges sending 1 MB
//! each, 585 MiB of RSS was measured, and 5,000 edges with three topics
//! each could hold 18 GB.
//!
//! So every admitted connection gets a connection window of
//! `budget / d` bytes, where `d` is the number of connections rounded up to
//! a power of two, and never less than [`MIN_CONNECTION_WINDOW`]. `d`
//! doubles as soon as the connections outnumber it and halves back only
//! when they fall to a quarter of it, so a fleet connecting one by one
//! changes every window about `log2(N)` times (each change reaches all
//! connections), and a count going back and forth across a power of two
//! changes nothing. A smaller window does not take back credit the edge
//! already holds: it limits what the broker grants as it reads. In steady
//! state the bytes in flight are at most `max(budget, N ×
//! MIN_CONNECTION_WINDOW)`.
//!
//! [`divisor`] is the rule, without I/O; [`ReceiveBudget`] keeps the count
//! and publishes the window to the connections' tasks.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// Default budget, bytes: 1 GiB. Up to 1,024 connections each keeps about
/// what quinn's stream window (1.25 MB) grants anyway, at 2,048 each gets
/// 512 KiB. Measured with 2,000 edges sending 500 kB each (docs/
/// benchmarks.md, "Fan-in"): a 256 MiB budget cut the broker's peak RSS
/// from 623–646 to 412 MiB but the records/s by a quarter (more
/// flow-control round trips); with 1 GiB both stayed within run-to-run
/// noise (less than 1 GiB was in flight), so the default bounds the worst
/// case without slowing fleets of that size.
pub const DEFAULT_RECEIVE_BUDGET_BYTES: u64 = 1024 * 1024 * 1024;

/// Smallest connection window, bytes (64 KiB: about 45 full-size
/// datagrams), whatever the number of connections; also the credit a
/// connection's handshake grants before its share is known.
pub const MIN_CONNECTION_WINDOW: u64 = 64 * 1024;

/// The divisor for `connections` admitted connections when the divisor in
/// use is `current` (0: none yet): the next power of two at or above
/// `connections` once they outnumber `current`, or once they have fallen to
/// a quarter of it or below; otherwise `current`. At least 1.
pub fn divisor(connections: usize, current: usize) -> usize {
    let wanted = connections.max(1).next_power_of_two();
    if current == 0 || connections > current || connections <= current / 4 {
        wanted
    } else {
        current
    }
}

/// The connection window, bytes, for `budget` shared by `divisor`
/// connections: `budget / divisor`, at least [`MIN_CONNECTION_WINDOW`].
pub fn window(budget: u64, divisor: usize) -> u64 {
    (budget / divisor.max(1) as u64).max(MIN_CONNECTION_WINDOW)
}

/// The ingest endpoint's budget: counts admitted connections and publishes
/// the window each must use.
#[derive(Debug)]
pub struct ReceiveBudget {
    budget: u64,
    /// Admitted connections and the divisor in use.
    count: Mutex<(usize, usize)>,
    window: watch::Sender<u64>,
}

/// One admitted connection's place in the budget; dropping it (when the
/// connection ends) gives the place back.
#[derive(Debug)]
pub struct Seat {
    budget: Arc<ReceiveBudget>,
    /// The window this connection must use; changes as others come and go.
    pub window: watch::Receiver<u64>,
}

impl ReceiveBudget {
    /// A budget of `budget` bytes for all connections together.
    pub fn new(budget: u64) -> Arc<ReceiveBudget> {
        let (window, _) = watch::channel(self::window(budget, 1));
        Arc::new(ReceiveBudget {
            budget,
            count: Mutex::new((0, 0)),
            window,
        })
    }

    /// Admits one more connection; its [`Seat`] carries the window.
    pub fn admit(self: &Arc<Self>) -> Seat {
        self.change(|n| n + 1);
        Seat {
            budget: self.clone(),
            window: self.window.subscribe(),
        }
    }

    fn change(&self, count: impl FnOnce(usize) -> usize) {
        let mut guard = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let (connections, current) = *guard;
        let connections = count(connections);
        let next = divisor(connections, current);
        *guard = (connections, next);
        if next != current {
            self.window.send_replace(window(self.budget, next));
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.budget.change(|n| n.saturating_sub(1));
    }
}

/// `bytes` as a QUIC variable-length integer (values above 2^62 − 1, far
/// beyond any budget, become the largest one).
pub fn var_int(bytes: u64) -> quinn::VarInt {
    quinn::VarInt::from_u64(bytes).unwrap_or(quinn::VarInt::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn the_divisor_doubles_when_outnumbered_and_halves_back_at_a_quarter() {
        assert_eq!(divisor(0, 0), 1);
        assert_eq!(divisor(1, 0), 1);
        assert_eq!(divisor(2, 1), 2);
        assert_eq!(divisor(3, 2), 4);
        assert_eq!(divisor(1000, 512), 1024);
        // Back and forth across 1,024: no change.
        assert_eq!(divisor(1025, 1024), 2048);
        assert_eq!(divisor(1024, 2048), 2048);
        assert_eq!(divisor(1025, 2048), 2048);
        // Halves back only at a quarter.
        assert_eq!(divisor(513, 2048), 2048);
        assert_eq!(divisor(512, 2048), 512);
        assert_eq!(divisor(0, 4), 1);
    }

    #[test]
    fn the_window_is_the_budget_share_but_never_below_the_minimum() {
        assert_eq!(window(256 * MIB, 1), 256 * MIB);
        assert_eq!(window(256 * MIB, 1024), 256 * 1024);
        assert_eq!(window(256 * MIB, 8192), MIN_CONNECTION_WINDOW);
        assert_eq!(window(MIB, 0), MIB);
    }

    #[test]
    fn seats_change_the_published_window_and_give_it_back_when_dropped() {
        let budget = ReceiveBudget::new(MIB);
        assert_eq!(*budget.window.borrow(), MIB);
        let first = budget.admit();
        assert_eq!(*first.window.borrow(), MIB);
        let seats: Vec<Seat> = (0..3).map(|_| budget.admit()).collect();
        assert_eq!(*budget.window.borrow(), MIB / 4);
        assert_eq!(*first.window.borrow(), MIB / 4, "earlier seats see it too");
        // Five connections: the divisor goes to 8.
        let fifth = budget.admit();
        assert_eq!(*budget.window.borrow(), MIB / 8);
        drop(fifth);
        assert_eq!(
            *budget.window.borrow(),
            MIB / 8,
            "four: more than a quarter of 8"
        );
        drop(seats);
        // At two (a quarter of 8) the divisor went to 2, and one more
        // leaving is not a quarter of 2.
        assert_eq!(*budget.window.borrow(), MIB / 2);
        assert_eq!(*first.window.borrow(), MIB / 2);
        drop(first);
        assert_eq!(
            *budget.window.borrow(),
            MIB,
            "none left: back to the whole budget"
        );
    }
}
