//! A UDP relay between an edge and a broker that makes the path between them
//! bad on purpose: random loss, one-way delay with jitter, a bandwidth
//! bottleneck with a bounded queue, and link cuts. QUIC runs over UDP, so
//! everything the replicator and the broker say to each other passes through
//! it datagram by datagram.
//!
//! # Model
//! Each direction is an independent [`Link`]. A datagram arriving at the
//! relay goes through these steps, in order:
//! 1. **cut**: while the link is cut (by [`Relay::cut`] or a scheduled
//!    [`Cut`]), it is dropped;
//! 2. **loss**: dropped with probability [`LinkConfig::loss`] (independent
//!    per datagram). Loss is modelled upstream of the bottleneck, so a lost
//!    datagram does not use the bottleneck's capacity;
//! 3. **bottleneck** (only with [`LinkConfig::bandwidth_bytes_per_s`]):
//!    datagrams are serialised one after another at that rate, counting UDP
//!    payload bytes; a datagram that would take the queue (the bytes accepted
//!    but not yet serialised, including the one on the wire) beyond
//!    [`LinkConfig::queue_bytes_max`] is dropped at the tail, like a router's
//!    buffer;
//! 4. **propagation**: delivered [`LinkConfig::delay`] plus a uniform
//!    `0..=jitter` after it left the bottleneck. With jitter, datagrams may
//!    be reordered;
//! 5. **cut again**: a datagram due while the link is cut is dropped, so a
//!    cut also loses what was on the wire.
//!
//! Randomness comes from one `StdRng` per direction seeded from
//! [`RelayConfig::seed`]; every datagram draws the same number of values,
//! so the same seed and the same arrivals give the same drops and delays.
//! [`Link`] itself takes time as an argument and does no I/O; the relay's
//! tasks feed it.
//!
//! # Peers
//! The relay listens on [`RelayConfig::listen`] (`127.0.0.1:0` by default)
//! and forwards to one target. The *client* is whoever last sent a datagram
//! to the listening socket: one client at a time (an edge's QUIC endpoint
//! keeps its socket across reconnects). Datagrams from the target before any
//! client spoke are dropped and counted.
//!
//! # Runtime and bounds
//! [`Relay::start`] runs the relay on its own thread with a current-thread
//! tokio runtime, so it works the same from synchronous tests and from
//! async code, and its timers do not compete with the test's runtime.
//! Dropping the [`Relay`] stops it and joins the thread. Memory is bounded by
//! `queue_bytes_max` and [`IN_FLIGHT_DATAGRAMS_MAX`] per direction.

mod link;

pub use link::{IN_FLIGHT_DATAGRAMS_MAX, Link, LinkConfig, QUEUE_BYTES_DEFAULT, Verdict};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Largest datagram the relay handles, bytes (the UDP maximum).
pub const DATAGRAM_BYTES_MAX: usize = 65_535;

/// A scheduled cut: from `after` (counted from [`Relay::start`]) for
/// `duration`, both directions drop everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Start, after the relay started.
    pub after: Duration,
    /// How long it lasts.
    pub duration: Duration,
}

/// Settings of a [`Relay`].
#[derive(Debug, Clone, PartialEq)]
pub struct RelayConfig {
    /// Address to listen on; `127.0.0.1:0` picks a free port.
    pub listen: SocketAddr,
    /// Seed of the random loss and jitter.
    pub seed: u64,
    /// Client → target (edge → broker).
    pub upstream: LinkConfig,
    /// Target → client (broker → edge).
    pub downstream: LinkConfig,
    /// Scheduled cuts, in addition to [`Relay::cut`].
    pub cuts: Vec<Cut>,
}

impl RelayConfig {
    /// The same `link` both ways, listening on a free loopback port.
    pub fn symmetric(seed: u64, link: LinkConfig) -> RelayConfig {
        RelayConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            seed,
            upstream: link.clone(),
            downstream: link,
            cuts: Vec::new(),
        }
    }
}

/// Counters of one direction (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectionStats {
    /// Datagrams that arrived at the relay.
    pub received: u64,
    /// Their UDP payload bytes.
    pub received_bytes: u64,
    /// Of those, datagrams whose first byte has the QUIC long-header bit
    /// (0x80) set: Initial, Handshake and 0-RTT packets, so a count that
    /// grows means a new handshake (a reconnect).
    pub long_header: u64,
    /// Dropped at random.
    pub dropped_loss: u64,
    /// Dropped because the bottleneck's queue was full.
    pub dropped_queue: u64,
    /// Dropped by a cut (on arrival or when due).
    pub dropped_cut: u64,
    /// Target → client datagrams dropped because no client had spoken yet.
    pub dropped_no_client: u64,
    /// Datagrams delivered.
    pub delivered: u64,
    /// Their UDP payload bytes.
    pub delivered_bytes: u64,
}

/// Counters of both directions (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Client → target.
    pub upstream: DirectionStats,
    /// Target → client.
    pub downstream: DirectionStats,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    received_bytes: AtomicU64,
    long_header: AtomicU64,
    dropped_loss: AtomicU64,
    dropped_queue: AtomicU64,
    dropped_cut: AtomicU64,
    dropped_no_client: AtomicU64,
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> DirectionStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DirectionStats {
            received: get(&self.received),
            received_bytes: get(&self.received_bytes),
            long_header: get(&self.long_header),
            dropped_loss: get(&self.dropped_loss),
            dropped_queue: get(&self.dropped_queue),
            dropped_cut: get(&self.dropped_cut),
            dropped_no_client: get(&self.dropped_no_client),
            delivered: get(&self.delivered),
            delivered_bytes: get(&self.delivered_bytes),
        }
    }
}

#[derive(Debug)]
struct Shared {
    started: Instant,
    cut: AtomicBool,
    cuts: Vec<Cut>,
    client: Mutex<Option<SocketAddr>>,
    upstream: Counters,
    downstream: Counters,
}

impl Shared {
    fn is_cut(&self, now: Instant) -> bool {
        if self.cut.load(Ordering::Relaxed) {
            return true;
        }
        let elapsed = now.saturating_duration_since(self.started);
        self.cuts
            .iter()
            .any(|c| elapsed >= c.after && elapsed < c.after + c.duration)
    }

    fn client(&self) -> Option<SocketAddr> {
        *self.client.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running relay. Dropping it stops it.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Upstream,
    Downstream,
}

impl Relay {
    /// Starts a relay forwarding to `target`.
    ///
    /// # Errors
    /// If a socket cannot be bound or the thread not started.
    ///
    /// # Panics
    /// If a [`LinkConfig`] is invalid (loss outside `0..=1`, rate 0).
    pub fn start(config: RelayConfig, target: SocketAddr) -> std::io::Result<Relay> {
        config.upstream.validate();
        config.downstream.validate();
        let listen = std::net::UdpSocket::bind(config.listen)?;
        let upstream = std::net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        listen.set_nonblocking(true)?;
        upstream.set_nonblocking(true)?;
        let addr = listen.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            started: Instant::now(),
            cut: AtomicBool::new(false),
            cuts: config.cuts.clone(),
            client: Mutex::new(None),
            upstream: Counters::default(),
            downstream: Counters::default(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("relay-{addr}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let (listen, upstream) =
                        match (UdpSocket::from_std(listen), UdpSocket::from_std(upstream)) {
                            (Ok(l), Ok(u)) => (Arc::new(l), Arc::new(u)),
                            _ => return,
                        };
                    let up = tokio::spawn(run_direction(
                        Direction::Upstream,
                        Link::new(config.upstream, config.seed),
                        listen.clone(),
                        upstream.clone(),
                        target,
                        task_shared.clone(),
                    ));
                    let down = tokio::spawn(run_direction(
                        Direction::Downstream,
                        Link::new(config.downstream, config.seed ^ 0x9e37_79b9_7f4a_7c15),
                        upstream,
                        listen,
                        target,
                        task_shared,
                    ));
                    let _ = stopped.await;
                    up.abort();
                    down.abort();
                });
            })?;
        Ok(Relay {
            addr,
            target,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address clients send to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address datagrams are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Counters so far.
    pub fn stats(&self) -> RelayStats {
        RelayStats {
            upstream: self.shared.upstream.snapshot(),
            downstream: self.shared.downstream.snapshot(),
        }
    }

    /// Cuts the link both ways until [`Relay::heal`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::Relaxed);
    }

    /// Ends a [`Relay::cut`] (scheduled cuts still apply).
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::Relaxed);
    }

    /// Whether the link is cut now (manually or by the schedule).
    pub fn is_cut(&self) -> bool {
        self.shared.is_cut(Instant::now())
    }

    /// Stops the relay and waits for its thread; the same as dropping it.
    pub fn shutdown(self) {}
}

impl Drop for Relay {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Forwards one direction: datagrams received on `from` go through `link`
/// and leave on `to` (to the target upstream, to the client downstream).
async fn run_direction(
    direction: Direction,
    mut link: Link,
    from: Arc<UdpSocket>,
    to: Arc<UdpSocket>,
    target: SocketAddr,
    shared: Arc<Shared>,
) {
    let counters = match direction {
        Direction::Upstream => &shared.upstream,
        Direction::Downstream => &shared.downstream,
    };
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let due = link.next_due();
        tokio::select! {
            received = from.recv_from(&mut buf) => {
                let (len, source) = match received {
                    Ok(r) => r,
                    Err(_) => {
                        // ICMP errors and the like: nothing to forward. Pause
                        // so that a persistent error cannot spin the loop.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                };
                match direction {
                    Direction::Upstream => {
                        *shared.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
                    }
                    Direction::Downstream if source != target => continue,
                    Direction::Downstream => {}
                }
                let now = Instant::now();
                Counters::add(&counters.received, 1);
                Counters::add(&counters.received_bytes, len as u64);
                if len > 0 && buf[0] & 0x80 != 0 {
                    Counters::add(&counters.long_header, 1);
                }
                if shared.is_cut(now) {
                    Counters::add(&counters.dropped_cut, 1);
                    continue;
                }
                match link.offer(now, buf[..len].to_vec()) {
                    Verdict::Accepted(_) => {}
                    Verdict::Lost => Counters::add(&counters.dropped_loss, 1),
                    Verdict::QueueFull => Counters::add(&counters.dropped_queue, 1),
                }
            }
            () = sleep_until_opt(due), if due.is_some() => {
                let now = Instant::now();
                // Bounded: only what is due now, at most what is in flight.
                while let Some(bytes) = link.poll_due(now) {
                    if shared.is_cut(now) {
                        Counters::add(&counters.dropped_cut, 1);
                        continue;
                    }
                    let destination = match direction {
                        Direction::Upstream => Some(target),
                        Direction::Downstream => shared.client(),
                    };
                    let Some(destination) = destination else {
                        Counters::add(&counters.dropped_no_client, 1);
                        continue;
                    };
                    // A full socket buffer or an unreachable peer loses the
                    // datagram, as a real network would.
                    if to.send_to(&bytes, destination).await.is_ok() {
                        Counters::add(&counters.delivered, 1);
                        Counters::add(&counters.delivered_bytes, bytes.len() as u64);
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn localhost() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// Sends `count` numbered datagrams through a relay with `config` and
    /// returns the numbers that reached the target, in arrival order.
    async fn numbers_through(config: RelayConfig, count: u32) -> (Vec<u32>, RelayStats) {
        const BURST: u32 = 50;
        let target = UdpSocket::bind(localhost()).await.unwrap();
        let relay = Relay::start(config, target.local_addr().unwrap()).unwrap();
        let client = UdpSocket::bind(localhost()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 16];
        let mut sent = 0;
        while sent < count {
            // A burst, then wait until the relay has dealt with all of it and
            // read what it delivered: no socket buffer can overflow, however
            // the threads are scheduled.
            let burst_end = (sent + BURST).min(count);
            for n in sent..burst_end {
                client
                    .send_to(&n.to_le_bytes(), relay.addr())
                    .await
                    .unwrap();
            }
            sent = burst_end;
            let deadline = Instant::now() + Duration::from_secs(10);
            let delivered = loop {
                let up = relay.stats().upstream;
                if up.delivered + up.dropped_loss == u64::from(sent) {
                    break up.delivered;
                }
                assert!(Instant::now() < deadline, "relay stuck: {up:?}");
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            while (got.len() as u64) < delivered {
                let len = tokio::time::timeout(Duration::from_secs(10), target.recv(&mut buf))
                    .await
                    .expect("a delivered datagram did not arrive")
                    .unwrap();
                assert_eq!(len, 4);
                got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
            }
        }
        (got, relay.stats())
    }

    #[tokio::test]
    async fn loss_ratio_is_within_bounds_and_the_same_for_the_same_seed() {
        let config = RelayConfig::symmetric(42, LinkConfig::lossy(0.2, Duration::ZERO));
        let (first, stats) = numbers_through(config.clone(), 5000).await;
        assert_eq!(stats.upstream.received, 5000);
        assert_eq!(stats.upstream.delivered, first.len() as u64);
        assert_eq!(
            stats.upstream.dropped_loss + stats.upstream.delivered,
            5000,
            "{stats:?}"
        );
        let ratio = stats.upstream.dropped_loss as f64 / 5000.0;
        // 5000 draws at p = 0.2: sigma ~0.0057; +-3.5 sigma.
        assert!((0.18..=0.22).contains(&ratio), "loss ratio {ratio}");
        let (second, _) = numbers_through(config.clone(), 5000).await;
        assert_eq!(first, second, "same seed, same datagrams lost");
        let (other_seed, _) = numbers_through(RelayConfig { seed: 43, ..config }, 5000).await;
        assert_ne!(first, other_seed);
    }

    #[tokio::test]
    async fn delay_is_applied_each_way() {
        let delay = Duration::from_millis(150);
        let config = RelayConfig::symmetric(1, LinkConfig::lossy(0.0, delay));
        let target = UdpSocket::bind(localhost()).await.unwrap();
        let relay = Relay::start(config, target.local_addr().unwrap()).unwrap();
        let client = UdpSocket::bind(localhost()).await.unwrap();
        let mut buf = [0u8; 16];
        let sent = std::time::Instant::now();
        client.send_to(b"ping", relay.addr()).await.unwrap();
        let (_, from) = target.recv_from(&mut buf).await.unwrap();
        let one_way = sent.elapsed();
        target.send_to(b"pong", from).await.unwrap();
        let (len, _) = client.recv_from(&mut buf).await.unwrap();
        let round_trip = sent.elapsed();
        assert_eq!(&buf[..len], b"pong");
        // Upper bounds generous for a loaded machine: they only rule out a
        // gross error such as the delay applied twice.
        assert!(
            one_way >= delay && one_way < delay + Duration::from_millis(140),
            "{one_way:?}"
        );
        assert!(
            round_trip >= 2 * delay && round_trip < 2 * delay + Duration::from_millis(290),
            "{round_trip:?}"
        );
    }

    #[tokio::test]
    async fn a_cut_drops_everything_until_healed() {
        let config = RelayConfig::symmetric(1, LinkConfig::perfect());
        let target = UdpSocket::bind(localhost()).await.unwrap();
        let relay = Relay::start(config, target.local_addr().unwrap()).unwrap();
        let client = UdpSocket::bind(localhost()).await.unwrap();
        let mut buf = [0u8; 16];
        relay.cut();
        assert!(relay.is_cut());
        for _ in 0..50 {
            client.send_to(b"lost", relay.addr()).await.unwrap();
        }
        let nothing =
            tokio::time::timeout(Duration::from_millis(300), target.recv_from(&mut buf)).await;
        assert!(nothing.is_err(), "a datagram crossed a cut link");
        assert_eq!(relay.stats().upstream.dropped_cut, 50);
        relay.heal();
        client.send_to(b"back", relay.addr()).await.unwrap();
        let (len, _) = target.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..len], b"back");
    }

    #[tokio::test]
    async fn a_scheduled_cut_drops_what_is_in_flight_too() {
        // 200 ms of delay; the cut starts 100 ms in, so a datagram sent at
        // once is still on the wire when it starts.
        let mut config =
            RelayConfig::symmetric(1, LinkConfig::lossy(0.0, Duration::from_millis(200)));
        config.cuts.push(Cut {
            after: Duration::from_millis(100),
            duration: Duration::from_millis(400),
        });
        let target = UdpSocket::bind(localhost()).await.unwrap();
        let relay = Relay::start(config, target.local_addr().unwrap()).unwrap();
        let client = UdpSocket::bind(localhost()).await.unwrap();
        client.send_to(b"on the wire", relay.addr()).await.unwrap();
        let mut buf = [0u8; 16];
        let nothing =
            tokio::time::timeout(Duration::from_millis(600), target.recv_from(&mut buf)).await;
        assert!(nothing.is_err());
        assert_eq!(relay.stats().upstream.dropped_cut, 1);
        // The schedule is over: traffic flows again.
        client.send_to(b"after", relay.addr()).await.unwrap();
        let (len, _) = target.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..len], b"after");
    }

    #[tokio::test]
    async fn the_bottleneck_paces_and_drops_beyond_its_queue() {
        // 100 kB/s with a 10 kB queue; 40 datagrams of 1000 bytes offered at
        // once: about 10 fit (a few more if the sending is slow enough for
        // the queue to drain meanwhile), the rest are dropped at the tail;
        // they leave 10 ms apart.
        let link = LinkConfig::perfect().with_bandwidth(100_000, 10_000);
        let config = RelayConfig::symmetric(1, link);
        let target = UdpSocket::bind(localhost()).await.unwrap();
        let relay = Relay::start(config, target.local_addr().unwrap()).unwrap();
        let client = UdpSocket::bind(localhost()).await.unwrap();
        let started = std::time::Instant::now();
        for _ in 0..40 {
            client.send_to(&[7u8; 1000], relay.addr()).await.unwrap();
        }
        let mut buf = vec![0u8; 2000];
        let mut arrived = 0u64;
        let mut last = Duration::ZERO;
        while let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(500), target.recv_from(&mut buf)).await
        {
            arrived += 1;
            last = started.elapsed();
        }
        let stats = relay.stats().upstream;
        assert_eq!(stats.dropped_queue + stats.delivered, 40, "{stats:?}");
        assert_eq!(arrived, stats.delivered);
        assert!((10..=20).contains(&arrived), "{arrived} arrived");
        // Serialised one after another: the last left (arrived - 1) x 10 ms
        // after the first had been serialised, 10 ms after its arrival.
        assert!(
            last >= Duration::from_millis(arrived * 10 - 5),
            "{arrived} datagrams through in {last:?}"
        );
    }
}
