//! Replication over a thin, lossy, long link: 64 kbit/s, 20 % loss and
//! 600 ms round-trip time, made by the test relay (`tributary_test_support::relay`).
//!
//! ```text
//! cargo bench -p tributary-tests --bench thin_link
//! ```
//! The bench first runs `cargo build --release -p broker -p edge-agent` (a
//! no-op when fresh); then about 90 s.
//!
//! # The link
//! Each direction: 20 % random loss (upstream of the bottleneck, so lost
//! datagrams do not use its capacity), a bottleneck of 8000 UDP payload
//! bytes/s (64 kbit/s) with a queue of [`QUEUE_BYTES`] (one second), and
//! 300 ms of one-way delay: 600 ms round trip before queueing and
//! serialisation (a 1200-byte datagram takes 150 ms to serialise).
//!
//! # Flows
//! Six flows run at the same time, each through its own relay with the
//! same link model (CPU is not a factor at these rates):
//! - **tributary, bbr / cubic / declared_rate**: the real `broker` and
//!   `edge-agent` binaries (release), one `event_stream` topic, the edge's
//!   `congestion_controller` set to `bbr`, left at its default `cubic`, and
//!   set to `declared_rate` with `bandwidth_cap_bytes_per_s` = the link's
//!   8000 B/s (the settings for a lossy link of known rate). The edge holds a backlog of incompressible
//!   records ([`VALUE_BYTES`] random bytes, [`RECORDS_PER_BATCH`] per
//!   batch), larger than the link can carry in the window, so replication is
//!   never short of data. Delivered = acknowledged records × value bytes.
//! - **raw quinn, cubic**: a raw quinn bulk stream with Tributary's TLS and
//!   transport settings (quinn's default controller, Cubic). Delivered =
//!   stream bytes read by the server, in order as the broker reads (so a
//!   lost packet holds up what follows it, as it does for replication).
//! - **raw quinn, bbr**: the same with quinn's BBR controller.
//! - **raw quinn, fixed window**: the same with a constant congestion window
//!   of [`FIXED_WINDOW_BYTES`] that ignores loss, as a controller could do if
//!   it trusted the link rate the operator configured.
//!
//! Each flow's window of [`WINDOW`] starts at its first delivery (after
//! the handshake, and for Tributary the topic's creation); goodput = bytes
//! delivered in the window / its length, compared with the link's 8000 B/s.
//! "Longest stall" is the longest time without any (in-order) delivery
//! inside the window, sampled every [`SAMPLE`]. For Tributary the bench also
//! samples the broker's high-water mark (its `/metrics`) and prints the
//! longest stall of central arrival next to that of acknowledgements, so a
//! stall can be placed on the data path or the return path, and the edge's
//! count of acknowledgements that arrived first by QUIC datagram. Figures
//! and their reading: `docs/benchmarks.md`.

#[path = "common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    FixedWindowFactory, RawBulk, build_release_binaries, quic_configs, random_bodies, scratch_dir,
    tributary_transport,
};
use tributary_test_support::ports::free_udp;
use tributary_test_support::relay::{LinkConfig, Relay, RelayConfig};
use tributary_tests::cluster::{Pair, TOPIC, metric_value, try_scrape};

/// The link's rate, bytes per second (64 kbit/s).
const LINK_BYTES_PER_S: u64 = 8000;
/// Random loss, each way.
const LOSS: f64 = 0.2;
/// One-way delay, each way (600 ms round trip).
const ONE_WAY: Duration = Duration::from_millis(300);
/// The bottleneck's queue: one second of the link.
const QUEUE_BYTES: usize = 8000;
/// Measurement window per flow.
const WINDOW: Duration = Duration::from_secs(60);
/// Bound on the wait for a flow's first delivery.
const FIRST_DELIVERY_MAX: Duration = Duration::from_secs(30);
/// Sampling interval.
const SAMPLE: Duration = Duration::from_millis(250);
/// Bytes of each record value (random, incompressible).
const VALUE_BYTES: usize = 512;
/// Records per published batch: ~4 KiB batches.
const RECORDS_PER_BATCH: usize = 8;
/// Batches of backlog: 1 MiB of values, more than the window can carry.
const BACKLOG_BATCHES: usize = 256;
/// Constant window of the fixed-window flow: about twice the path's
/// bandwidth-delay product (8000 B/s × ~0.75 s), so that the 20 % of
/// packets lost and awaiting detection do not idle the link.
const FIXED_WINDOW_BYTES: u64 = 12_000;
/// Seed of the relays.
const SEED: u64 = 64_000;

fn link() -> LinkConfig {
    LinkConfig::lossy(LOSS, ONE_WAY).with_bandwidth(LINK_BYTES_PER_S, QUEUE_BYTES)
}

fn relay_to(target: SocketAddr, listen: SocketAddr) -> Relay {
    let mut config = RelayConfig::symmetric(SEED, link());
    config.listen = listen;
    Relay::start(config, target).expect("relay")
}

/// One flow under measurement.
struct Flow {
    name: String,
    source: Source,
    relay: Relay,
    /// When the window started (first delivery).
    first: Option<Instant>,
    /// (when, bytes delivered, UDP payload bytes the relay delivered
    /// upstream), from the first delivery on.
    samples: Vec<(Instant, u64, u64)>,
    /// Tributary only: (when, value bytes the broker holds), from the first
    /// delivery on.
    central: Vec<(Instant, u64)>,
}

/// Longest time in `samples` (when, bytes) between `first` and `end`
/// without the byte count changing.
fn longest_stall(
    samples: impl Iterator<Item = (Instant, u64)>,
    first: Instant,
    end: Instant,
) -> Duration {
    let mut stall = Duration::ZERO;
    let mut last_change = first;
    let mut last_bytes = None;
    for (at, bytes) in samples {
        if last_bytes.is_some_and(|b| b != bytes) {
            stall = stall.max(at - last_change);
            last_change = at;
        }
        last_bytes = Some(bytes);
    }
    stall.max(end - last_change)
}

enum Source {
    Tributary(Box<Pair>, tempfile::TempDir),
    Raw(RawBulk, tempfile::TempDir),
}

impl Flow {
    fn delivered(&self) -> u64 {
        match &self.source {
            Source::Tributary(pair, _) => pair
                .edge_offsets()
                .map_or(0, |(_, acked)| acked * VALUE_BYTES as u64),
            Source::Raw(bulk, _) => bulk.received(),
        }
    }

    /// Value bytes the broker holds (its high-water mark), Tributary only.
    fn central(&self) -> Option<u64> {
        let Source::Tributary(pair, _) = &self.source else {
            return None;
        };
        let text = try_scrape(&format!("http://{}/metrics", pair.broker_admin)).ok()?;
        let series = format!("tributary_broker_topic_high_water_mark{{topic=\"{TOPIC}\"}}");
        metric_value(&text, &series).map(|records| records * VALUE_BYTES as u64)
    }

    /// Acknowledgements that arrived first (stream, datagram), Tributary
    /// only.
    fn ack_paths(&self) -> Option<(u64, u64)> {
        let Source::Tributary(pair, _) = &self.source else {
            return None;
        };
        let text = try_scrape(&format!("http://{}/metrics", pair.edge_api)).ok()?;
        let count = |path: &str| {
            metric_value(
                &text,
                &format!("tributary_edge_replication_acks_total{{path=\"{path}\"}}"),
            )
        };
        count("stream").zip(count("datagram"))
    }

    fn done(&self, now: Instant) -> bool {
        self.first.is_some_and(|first| now >= first + WINDOW)
    }
}

/// The product through the relay; `congestion_controller` is the edge's
/// setting of that name (`cubic`, the default, `bbr`, or `declared_rate`,
/// which the bench pairs with `bandwidth_cap_bytes_per_s` = the link's
/// rate).
fn tributary_flow(congestion_controller: &str) -> Flow {
    let dir = scratch_dir("thin");
    let listen = free_udp();
    let mut agent_extra = format!("congestion_controller = \"{congestion_controller}\"\n");
    if congestion_controller == "declared_rate" {
        agent_extra.push_str(&format!("bandwidth_cap_bytes_per_s = {LINK_BYTES_PER_S}\n"));
    }
    let mut pair = Pair::new_with(
        dir.path(),
        "event_stream",
        Some(listen.to_string()),
        &agent_extra,
        "",
    );
    let broker_config = std::fs::read_to_string(dir.path().join("broker.toml")).expect("config");
    let ingest: SocketAddr = broker_config
        .lines()
        .find_map(|l| l.strip_prefix("ingest_listen = "))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .expect("ingest_listen");
    let relay = relay_to(ingest, listen);
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    for body in random_bodies(BACKLOG_BATCHES, RECORDS_PER_BATCH, VALUE_BYTES, 3) {
        pair.publish_ndjson(body).expect("publish");
    }
    Flow {
        name: format!("tributary (edge-agent → broker), {congestion_controller}"),
        source: Source::Tributary(Box::new(pair), dir),
        relay,
        first: None,
        samples: Vec::new(),
        central: Vec::new(),
    }
}

fn raw_flow(name: &str, transport: quinn::TransportConfig) -> Flow {
    let dir = scratch_dir("thin-raw");
    let (server, client) = quic_configs(&dir.path().join("certs"), Some(transport));
    let mut relay = None;
    let bulk = RawBulk::start(
        server,
        client,
        |addr| {
            let r = relay_to(addr, SocketAddr::from(([127, 0, 0, 1], 0)));
            let via = r.addr();
            relay = Some(r);
            via
        },
        u64::MAX,
    );
    Flow {
        name: name.into(),
        source: Source::Raw(bulk, dir),
        relay: relay.expect("relay"),
        first: None,
        samples: Vec::new(),
        central: Vec::new(),
    }
}

fn main() {
    build_release_binaries();
    println!(
        "thin link: {} kbit/s, {:.0} % loss each way, {} ms RTT, queue {QUEUE_BYTES} B; window {WINDOW:?} per flow",
        LINK_BYTES_PER_S * 8 / 1000,
        LOSS * 100.0,
        ONE_WAY.as_millis() * 2
    );
    let started = Instant::now();
    let mut flows = vec![
        tributary_flow("bbr"),
        tributary_flow("cubic"),
        tributary_flow("declared_rate"),
        raw_flow(
            "raw quinn, cubic (Tributary transport)",
            tributary_transport(),
        ),
        raw_flow("raw quinn, bbr", {
            let mut t = tributary_transport();
            t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()));
            t
        }),
        raw_flow(
            &format!("raw quinn, fixed window {FIXED_WINDOW_BYTES} B"),
            {
                let mut t = tributary_transport();
                t.congestion_controller_factory(Arc::new(FixedWindowFactory(FIXED_WINDOW_BYTES)));
                t
            },
        ),
    ];
    // Sample every flow until each has had its window; bounded.
    let bound = FIRST_DELIVERY_MAX + WINDOW + Duration::from_secs(5);
    loop {
        let now = Instant::now();
        if flows.iter().all(|f| f.done(now)) {
            break;
        }
        assert!(
            started.elapsed() < bound,
            "flows did not finish within {bound:?}"
        );
        for flow in &mut flows {
            if flow.done(now) {
                continue;
            }
            let delivered = flow.delivered();
            if flow.first.is_none() && delivered > 0 {
                flow.first = Some(now);
            }
            if flow.first.is_none() {
                assert!(
                    started.elapsed() < FIRST_DELIVERY_MAX,
                    "{}: nothing delivered within {FIRST_DELIVERY_MAX:?}",
                    flow.name
                );
                continue;
            }
            let relayed = flow.relay.stats().upstream.delivered_bytes;
            flow.samples.push((now, delivered, relayed));
            if let Some(central) = flow.central() {
                flow.central.push((now, central));
            }
        }
        std::thread::sleep(SAMPLE);
    }

    println!();
    println!(
        "| flow | first delivery s | delivered in window | goodput B/s | goodput / link | longest stall s | upstream datagrams lost % | upstream link use % |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for flow in &flows {
        let first = flow.first.expect("first delivery");
        let (_, _, start_relayed) = flow.samples[0];
        let (end_at, end_bytes, end_relayed) = *flow.samples.last().expect("samples");
        let seconds = (end_at - first).as_secs_f64();
        // Everything delivered up to the window's end (including the first
        // sample's bytes, which arrived within one sample interval).
        let goodput = end_bytes as f64 / seconds.max(1e-9);
        let stall = longest_stall(
            flow.samples.iter().map(|&(at, b, _)| (at, b)),
            first,
            end_at,
        );
        let up = flow.relay.stats().upstream;
        let offered = up.received - up.dropped_cut;
        println!(
            "| {} | {:.1} | {} B | {:.0} | {:.2} | {:.1} | {:.1} | {:.0} |",
            flow.name,
            (first - started).as_secs_f64(),
            end_bytes,
            goodput,
            goodput / LINK_BYTES_PER_S as f64,
            stall.as_secs_f64(),
            up.dropped_loss as f64 * 100.0 / offered.max(1) as f64,
            (end_relayed - start_relayed) as f64 * 100.0 / (LINK_BYTES_PER_S as f64 * seconds),
        );
    }
    println!();
    println!(
        "| tributary flow | longest stall of acknowledgements s | longest stall of central arrival s | acknowledgements first by stream / by datagram |"
    );
    println!("|---|---|---|---|");
    for flow in flows.iter().filter(|f| !f.central.is_empty()) {
        let first = flow.first.expect("first delivery");
        let end_at = flow.samples.last().expect("samples").0;
        let acked = longest_stall(
            flow.samples.iter().map(|&(at, b, _)| (at, b)),
            first,
            end_at,
        );
        let central = longest_stall(flow.central.iter().copied(), first, end_at);
        let (stream, datagram) = flow.ack_paths().unwrap_or_default();
        println!(
            "| {} | {:.1} | {:.1} | {stream} / {datagram} |",
            flow.name,
            acked.as_secs_f64(),
            central.as_secs_f64()
        );
    }
    for tributary in flows.iter().filter(|f| !f.central.is_empty()) {
        let first = tributary.first.expect("first");
        println!();
        println!(
            "{}: every second of the window, s: acknowledged offset / central high-water mark / kB the relay delivered upstream since the window began",
            tributary.name
        );
        let mut next_print = Duration::ZERO;
        let mut line = Vec::new();
        let relayed_at_start = tributary.samples[0].2;
        for &(at, bytes, relayed) in &tributary.samples {
            if at - first >= next_print {
                let central = tributary
                    .central
                    .iter()
                    .find(|(t, _)| *t == at)
                    .map_or("?".to_string(), |(_, c)| {
                        (c / VALUE_BYTES as u64).to_string()
                    });
                line.push(format!(
                    "{:.0}:{}/{central}/{}",
                    (at - first).as_secs_f64(),
                    bytes / VALUE_BYTES as u64,
                    (relayed - relayed_at_start) / 1000
                ));
                next_print += Duration::from_secs(1);
            }
        }
        for chunk in line.chunks(12) {
            println!("{}", chunk.join(" "));
        }
    }
    for flow in flows {
        let relay_stats = flow.relay.stats();
        println!("{}: relay {relay_stats:?}", flow.name);
        match flow.source {
            Source::Tributary(mut pair, _dir) => {
                pair.edge.kill();
                pair.broker.kill();
            }
            Source::Raw(bulk, _dir) => bulk.stop(),
        }
    }
}
