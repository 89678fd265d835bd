//! Tributary side by side with NATS JetStream on the same machine, in the
//! same run (issue 7, "Side-by-side benchmark against a peer"). Run by hand,
//! not in CI, through `scripts/bench-vs-nats` (which installs a NATS server
//! that knows `sync_interval` and builds the release binaries first):
//!
//! ```text
//! scripts/bench-vs-nats
//! TRIBUTARY_BENCH_NATS_SERVER=/path/to/nats-server TRIBUTARY_BENCH_NO_BUILD=1 \
//!   cargo bench -p tributary-tests --bench vs_nats
//! ```
//!
//! # What is compared
//! Two durability levels ([`Durability`]), each the same on both sides:
//! - `fsync`: a publish is acknowledged after the data reached the disk
//!   (survives power loss). Tributary: a `task_queue` topic (`fsync_batch`:
//!   the WAL's group commit ends in `fdatasync` before the acknowledgement;
//!   the central topic of the same intent also `fsync_batch`). JetStream:
//!   `jetstream { sync_interval: always }` (the file store syncs after every
//!   write) on every server, file storage.
//! - `page_cache`: acknowledged once in the operating system's page cache
//!   (survives a crash of the process, not of the machine). Tributary:
//!   `event_stream` (`os_cache_flush`); JetStream: file storage with the
//!   default `sync_interval` (2 min).
//!
//! Cases (each round runs both systems back to back, alternating which goes
//! first; the ratio is Tributary / JetStream within the round):
//! - **publish, 1 record per ack**: [`Settings::producers`] concurrent
//!   producers, each publishing one record of [`Settings::record_bytes`]
//!   random bytes and waiting for its acknowledgement before the next, for
//!   [`Settings::publish_seconds`]. Tributary: the release `edge-agent`
//!   alone (no broker running), one keep-alive HTTP/1.1 connection per
//!   producer, `POST /v1/topics/plant1/readings/records` with the record as
//!   the body. JetStream: one `nats-server`, one stream on one subject, one
//!   client connection per producer (`async-nats`), `publish` then await
//!   the `PublishAck`.
//! - **publish, B records per ack**: the same, but each producer has
//!   [`Settings::batch_records`] records outstanding and waits for all of
//!   them. Tributary: one NDJSON request of B records (`value_b64`) to
//!   `/batch`, acknowledged once, stored as one record batch. JetStream:
//!   B `publish` calls without waiting, then await their B acks (JetStream
//!   stores B separate messages).
//! - **replication of a backlog** of [`Settings::backlog_bytes`] of record
//!   values. Tributary: edge + broker release binaries over QUIC on
//!   127.0.0.1 (mutual TLS, zstd attempted per batch), the backlog published
//!   in NDJSON batches of [`Settings::backlog_batch_records`] while the
//!   broker is stopped; then the broker starts and the bench polls the
//!   edge's API until its acknowledged offset (the broker's durable
//!   high-water mark) covers the backlog. JetStream: a leaf node server
//!   (JetStream domain `leaf`, stream `LEAF`) connected to a hub server
//!   (domain `hub`) whose stream `HUB` sources `LEAF` through
//!   `external.api = "$JS.leaf.API"`; the backlog is published to the leaf
//!   while the hub is stopped; then the hub starts and the bench polls
//!   `HUB`'s state until it holds every message. The leaf takes the
//!   backlog with the default sync interval and is restarted with the
//!   measured setting before the hub starts (publishing hundreds of
//!   thousands of messages with a sync after each would take far longer than
//!   the drain; it does not change what the drain does). Both are timed from
//!   the last poll (every [`POLL`]) that saw nothing of the backlog arrived
//!   to the first that saw all of it: reconnect back-offs are excluded, at
//!   most one poll interval of idle time is included. The time from the
//!   central process's start is printed too.
//!
//! - **MQTT, 1 record per ack** (issue 20; [`mqtt`]): [`Settings::producers`]
//!   MQTT 3.1.1 clients (rumqttc), each publishing one record with QoS 1 and
//!   waiting for its PUBACK before the next, into the agent's `[mqtt]`
//!   listener. Case `mqtt` compares it with JetStream's publish-with-ack
//!   (the `publish` case's NATS side); case `mqtt_nats_mqtt` with the same
//!   MQTT client and load against nats-server's own MQTT listener
//!   (JetStream-backed, a file stream capturing the subject), so the
//!   protocol is the same on both sides.
//!
//! Every loop is bounded in time and count. Settings come from the
//! environment (see [`Settings::from_env`]).

#[path = "common/mod.rs"]
mod common;
#[path = "vs_nats/mqtt.rs"]
mod mqtt;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use common::{build_release_binaries, megabytes, scratch_dir};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tributary_test_support::ports::free_tcp;
use tributary_tests::cluster::Pair;

/// Interval between polls of the replicated position (both systems).
const POLL: Duration = Duration::from_millis(20);
/// Upper bound on any process start or warm-up step.
const STEP_MAX: Duration = Duration::from_secs(60);
/// Upper bound on records one producer publishes in one measurement.
const MAX_RECORDS_PER_PRODUCER: u64 = 50_000_000;
/// How long a JetStream producer waits for an acknowledgement (with
/// `sync_interval: always`, 1600 outstanding publishes take seconds).
const ACK_TIMEOUT: Duration = Duration::from_secs(120);
/// JetStream publishes in flight while filling the leaf's backlog.
const FILL_WINDOW: usize = 4096;

/// What an acknowledgement promises; the same on both sides of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// On disk before the ack: Tributary `fsync_batch`, JetStream
    /// `sync_interval: always`.
    Fsync,
    /// In the page cache before the ack: Tributary `os_cache_flush`,
    /// JetStream's default `sync_interval` (2 min).
    PageCache,
}

impl Durability {
    fn label(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::PageCache => "page_cache",
        }
    }

    fn intent(self) -> &'static str {
        match self {
            Durability::Fsync => "task_queue",
            Durability::PageCache => "event_stream",
        }
    }

    fn nats_sync_line(self) -> &'static str {
        match self {
            Durability::Fsync => "sync_interval: always",
            Durability::PageCache => "",
        }
    }
}

/// Bench settings, from environment variables (defaults in brackets).
#[derive(Debug, Clone)]
struct Settings {
    /// `TRIBUTARY_BENCH_NATS_SERVER` [`nats-server`]: the server binary.
    nats_server: PathBuf,
    /// `BENCH_RECORD_BYTES` [256]: bytes of each record value / message
    /// payload.
    record_bytes: usize,
    /// `BENCH_PRODUCERS` [16]: concurrent producers in the publish cases.
    producers: usize,
    /// `BENCH_BATCH_RECORDS` [100]: records outstanding per producer in the
    /// batched publish case.
    batch_records: usize,
    /// `BENCH_PUBLISH_SECONDS` [10]: length of each publish measurement, s.
    publish_seconds: u64,
    /// `BENCH_BACKLOG_BYTES` [16 MiB]: bytes of record values in the
    /// replication backlog (1 GiB = 1073741824 for the issue's case).
    backlog_bytes: u64,
    /// `BENCH_BACKLOG_BATCH_RECORDS` [1024]: records per edge publish while
    /// building Tributary's backlog.
    backlog_batch_records: usize,
    /// `BENCH_DRAIN_MAX_SECONDS` [900]: bound on one backlog's replication;
    /// a drain that does not finish is reported with the rate so far.
    drain_max: Duration,
    /// `BENCH_ROUNDS` [3]: rounds of every case.
    rounds: usize,
    /// `BENCH_DURABILITY` [`fsync,page_cache`].
    durabilities: Vec<Durability>,
    /// `BENCH_CASES` [`publish,publish_batch,replication,mqtt,mqtt_nats_mqtt`].
    cases: Vec<Case>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Publish,
    PublishBatch,
    Replication,
    /// MQTT QoS 1 into the agent against JetStream's publish-with-ack.
    Mqtt,
    /// MQTT QoS 1 into the agent against nats-server's MQTT listener.
    MqttNatsMqtt,
}

impl Case {
    fn label(self, s: &Settings) -> String {
        match self {
            Case::Publish => format!("publish, {} producers, 1 record per ack", s.producers),
            Case::PublishBatch => format!(
                "publish, {} producers, {} records per ack",
                s.producers, s.batch_records
            ),
            Case::Replication => format!("replication of {}", megabytes(s.backlog_bytes as f64)),
            Case::Mqtt => format!(
                "MQTT QoS 1 into the agent vs JetStream publish-with-ack, {} producers, 1 record per ack",
                s.producers
            ),
            Case::MqttNatsMqtt => format!(
                "MQTT QoS 1 into the agent vs nats-server's MQTT listener, {} producers, 1 record per ack",
                s.producers
            ),
        }
    }
}

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env() -> Settings {
        let durabilities = env_or("BENCH_DURABILITY", "fsync,page_cache".to_string())
            .split(',')
            .map(|d| match d.trim() {
                "fsync" => Durability::Fsync,
                "page_cache" => Durability::PageCache,
                other => panic!("BENCH_DURABILITY: unknown {other:?} (fsync, page_cache)"),
            })
            .collect();
        let cases = env_or(
            "BENCH_CASES",
            "publish,publish_batch,replication,mqtt,mqtt_nats_mqtt".to_string(),
        )
        .split(',')
        .map(|c| match c.trim() {
            "publish" => Case::Publish,
            "publish_batch" => Case::PublishBatch,
            "replication" => Case::Replication,
            "mqtt" => Case::Mqtt,
            "mqtt_nats_mqtt" => Case::MqttNatsMqtt,
            other => panic!(
                "BENCH_CASES: unknown {other:?} (publish, publish_batch, replication, mqtt, mqtt_nats_mqtt)"
            ),
        })
        .collect();
        let s = Settings {
            nats_server: env_or("TRIBUTARY_BENCH_NATS_SERVER", "nats-server".to_string()).into(),
            record_bytes: env_or("BENCH_RECORD_BYTES", 256),
            producers: env_or("BENCH_PRODUCERS", 16),
            batch_records: env_or("BENCH_BATCH_RECORDS", 100),
            publish_seconds: env_or("BENCH_PUBLISH_SECONDS", 10),
            backlog_bytes: env_or("BENCH_BACKLOG_BYTES", 16 << 20),
            backlog_batch_records: env_or("BENCH_BACKLOG_BATCH_RECORDS", 1024),
            drain_max: Duration::from_secs(env_or("BENCH_DRAIN_MAX_SECONDS", 900)),
            rounds: env_or("BENCH_ROUNDS", 3),
            durabilities,
            cases,
        };
        assert!(
            s.record_bytes > 0 && s.producers > 0 && s.batch_records > 0 && s.rounds > 0,
            "record bytes, producers, batch records and rounds must be above 0"
        );
        assert!(
            s.backlog_bytes >= (s.record_bytes * s.backlog_batch_records) as u64,
            "BENCH_BACKLOG_BYTES must hold at least one batch"
        );
        s
    }

    fn backlog_records(&self) -> u64 {
        let batch = (self.record_bytes * self.backlog_batch_records) as u64;
        self.backlog_bytes / batch * self.backlog_batch_records as u64
    }
}

/// One measurement of one system.
#[derive(Debug, Clone)]
struct Measured {
    /// Records acknowledged (publish) or replicated.
    records: u64,
    /// Measured interval, s.
    seconds: f64,
    /// Free-form detail printed with the figure.
    note: String,
    /// False when a bounded drain stopped before the end.
    complete: bool,
}

impl Measured {
    /// A measurement that ran to its end, without a note.
    fn whole(records: u64, seconds: f64) -> Measured {
        Measured {
            records,
            seconds,
            note: String::new(),
            complete: true,
        }
    }

    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn random_value(bytes: usize, seed: u64) -> Vec<u8> {
    let mut value = vec![0u8; bytes];
    StdRng::seed_from_u64(seed).fill(&mut value[..]);
    value
}

fn ndjson(values: &[Vec<u8>]) -> String {
    let mut body = String::new();
    for value in values {
        body.push_str("{\"value_b64\":\"");
        body.push_str(&STANDARD.encode(value));
        body.push_str("\"}\n");
    }
    body
}

// ---------------------------------------------------------------- NATS ---

/// A `nats-server` child process with its configuration file; SIGKILLed
/// when dropped.
struct NatsServer {
    bin: PathBuf,
    conf: PathBuf,
    log: PathBuf,
    client: SocketAddr,
    child: Option<Child>,
}

/// What a server's configuration says besides its name and ports.
struct NatsRole<'a> {
    name: &'a str,
    domain: &'a str,
    store: &'a Path,
    leaf_listen: Option<SocketAddr>,
    leaf_remote: Option<SocketAddr>,
}

impl NatsServer {
    fn new(bin: &Path, dir: &Path, name: &str) -> NatsServer {
        NatsServer {
            bin: bin.to_path_buf(),
            conf: dir.join(format!("{name}.conf")),
            log: dir.join(format!("{name}.log")),
            client: free_tcp(),
            child: None,
        }
    }

    /// (Re)writes the configuration; takes effect at the next start.
    fn configure(&self, role: &NatsRole<'_>, durability: Durability) {
        let mut conf = format!(
            "server_name: {name}\nlisten: \"{client}\"\nhttp: 0\n\
             jetstream {{\n  store_dir: \"{store}\"\n  domain: {domain}\n  {sync}\n}}\n",
            name = role.name,
            client = self.client,
            store = role.store.display(),
            domain = role.domain,
            sync = durability.nats_sync_line(),
        );
        if let Some(listen) = role.leaf_listen {
            conf.push_str(&format!("leafnodes {{\n  listen: \"{listen}\"\n}}\n"));
        }
        if let Some(remote) = role.leaf_remote {
            conf.push_str(&format!(
                "leafnodes {{\n  reconnect: 1\n  remotes: [ {{ url: \"nats-leaf://{remote}\" }} ]\n}}\n"
            ));
        }
        std::fs::write(&self.conf, conf).expect("write nats config");
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "nats-server already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("nats log");
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.bin.display()));
        self.child = Some(child);
        let deadline = Instant::now() + STEP_MAX;
        while TcpStream::connect_timeout(&self.client, Duration::from_millis(200)).is_err() {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "nats-server exited with {status}; log {}:\n{}",
                    self.log.display(),
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "nats-server not listening");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and a bounded wait for the exit (nats-server flushes its
    /// stores on the way out).
    fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("nats-server did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("nats://{}", self.client)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn connect(url: &str) -> async_nats::Client {
    let deadline = Instant::now() + STEP_MAX;
    loop {
        match async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(url)
            .await
        {
            Ok(client) => return client,
            Err(e) => assert!(Instant::now() < deadline, "connect {url}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates a stream, retrying (bounded) while JetStream is still starting.
async fn create_stream(js: &jetstream::Context, config: stream::Config) -> stream::Stream {
    let deadline = Instant::now() + STEP_MAX;
    loop {
        match js.get_or_create_stream(config.clone()).await {
            Ok(stream) => return stream,
            Err(e) => assert!(
                Instant::now() < deadline,
                "create stream {}: {e}",
                config.name
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stream_messages(js: &jetstream::Context, name: &str) -> Option<u64> {
    let stream = js.get_stream(name).await.ok()?;
    Some(stream.cached_info().state.messages)
}

/// One JetStream server `name` (no leaf or hub) in `dir` at `durability`,
/// configured, not started.
fn standalone_server(s: &Settings, dir: &Path, name: &str, durability: Durability) -> NatsServer {
    let server = NatsServer::new(&s.nats_server, dir, name);
    server.configure(
        &NatsRole {
            name,
            domain: name,
            store: &dir.join("js"),
            leaf_listen: None,
            leaf_remote: None,
        },
        durability,
    );
    server
}

/// A file stream `name` on the one subject `subject`.
async fn file_stream(js: &jetstream::Context, name: &str, subject: &str) -> stream::Stream {
    create_stream(
        js,
        stream::Config {
            name: name.into(),
            subjects: vec![subject.into()],
            storage: stream::StorageType::File,
            ..Default::default()
        },
    )
    .await
}

fn nats_publish(s: &Settings, durability: Durability, batch: usize) -> Measured {
    let dir = scratch_dir("vsnats-js");
    let mut server = standalone_server(s, dir.path(), "pub", durability);
    server.start();
    let url = server.url();
    let producers = s.producers;
    let payload = Bytes::from(random_value(s.record_bytes, 11));
    let window = Duration::from_secs(s.publish_seconds);
    let result = runtime().block_on(async move {
        let admin = jetstream::new(connect(&url).await);
        file_stream(&admin, "PUB", "bench.pub").await;
        // Warm-up: one acknowledged publish.
        admin
            .publish("bench.pub", payload.clone())
            .await
            .expect("publish")
            .await
            .expect("ack");
        let mut contexts = Vec::with_capacity(producers);
        for _ in 0..producers {
            contexts.push(
                jetstream::ContextBuilder::new()
                    .timeout(ACK_TIMEOUT)
                    .build(connect(&url).await),
            );
        }
        let acked = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let deadline = start + window;
        let mut tasks = Vec::new();
        for js in contexts {
            let acked = acked.clone();
            let payload = payload.clone();
            tasks.push(tokio::spawn(async move {
                let mut mine = 0u64;
                let mut pending = Vec::with_capacity(batch);
                while Instant::now() < deadline && mine < MAX_RECORDS_PER_PRODUCER {
                    for _ in 0..batch {
                        pending.push(
                            js.publish("bench.pub", payload.clone())
                                .await
                                .expect("publish"),
                        );
                    }
                    for ack in pending.drain(..) {
                        ack.await.expect("publish ack");
                    }
                    mine += batch as u64;
                    acked.fetch_add(batch as u64, Ordering::Relaxed);
                }
            }));
        }
        for task in tasks {
            task.await.expect("producer task");
        }
        let seconds = start.elapsed().as_secs_f64();
        let records = acked.load(Ordering::Relaxed);
        let stored = stream_messages(&admin, "PUB").await.expect("stream info");
        assert_eq!(stored, records + 1, "JetStream stored what it acknowledged");
        Measured::whole(records, seconds)
    });
    server.terminate();
    result
}

fn nats_replication(s: &Settings, durability: Durability) -> Measured {
    let dir = scratch_dir("vsnats-leaf");
    let hub_store = dir.path().join("hub-js");
    let leaf_store = dir.path().join("leaf-js");
    let hub_leafnodes = free_tcp();
    let mut hub = NatsServer::new(&s.nats_server, dir.path(), "hub");
    let hub_role = NatsRole {
        name: "hub",
        domain: "hub",
        store: &hub_store,
        leaf_listen: Some(hub_leafnodes),
        leaf_remote: None,
    };
    hub.configure(&hub_role, durability);
    let mut leaf = NatsServer::new(&s.nats_server, dir.path(), "leaf");
    let leaf_role = NatsRole {
        name: "leaf",
        domain: "leaf",
        store: &leaf_store,
        leaf_listen: None,
        leaf_remote: Some(hub_leafnodes),
    };
    // The leaf takes the backlog with the default sync interval (see the
    // module docs) and runs the drain with `durability`.
    leaf.configure(&leaf_role, Durability::PageCache);
    hub.start();
    leaf.start();
    let rt = runtime();
    let total = s.backlog_records();
    let payload = Bytes::from(random_value(s.record_bytes, 13));
    let (hub_url, leaf_url) = (hub.url(), leaf.url());

    // Streams, and one message through the hub (the source works).
    rt.block_on(async {
        let leaf_js = jetstream::new(connect(&leaf_url).await);
        create_stream(
            &leaf_js,
            stream::Config {
                name: "LEAF".into(),
                subjects: vec!["bench.backlog".into()],
                storage: stream::StorageType::File,
                ..Default::default()
            },
        )
        .await;
        let hub_js = jetstream::new(connect(&hub_url).await);
        create_stream(
            &hub_js,
            stream::Config {
                name: "HUB".into(),
                storage: stream::StorageType::File,
                sources: Some(vec![stream::Source {
                    name: "LEAF".into(),
                    external: Some(stream::External {
                        api_prefix: "$JS.leaf.API".into(),
                        delivery_prefix: None,
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            },
        )
        .await;
        leaf_js
            .publish("bench.backlog", payload.clone())
            .await
            .expect("publish")
            .await
            .expect("ack");
        let deadline = Instant::now() + STEP_MAX;
        while stream_messages(&hub_js, "HUB").await != Some(1) {
            assert!(
                Instant::now() < deadline,
                "the hub stream did not source the warm-up message; logs in {}",
                dir.path().display()
            );
            tokio::time::sleep(POLL).await;
        }
    });
    hub.terminate();

    // The backlog, into the leaf while the hub is down.
    let filled = Instant::now();
    rt.block_on(async {
        let leaf_js = jetstream::ContextBuilder::new()
            .timeout(ACK_TIMEOUT)
            .max_ack_inflight(FILL_WINDOW * 2)
            .build(connect(&leaf_url).await);
        let mut pending = VecDeque::with_capacity(FILL_WINDOW);
        for _ in 0..total {
            if pending.len() == FILL_WINDOW {
                let ack: jetstream::context::PublishAckFuture =
                    pending.pop_front().expect("pending");
                ack.await.expect("ack");
            }
            pending.push_back(
                leaf_js
                    .publish("bench.backlog", payload.clone())
                    .await
                    .expect("publish"),
            );
        }
        for ack in pending {
            ack.await.expect("ack");
        }
        assert_eq!(stream_messages(&leaf_js, "LEAF").await, Some(total + 1));
    });
    let fill_seconds = filled.elapsed().as_secs_f64();
    leaf.terminate();
    leaf.configure(&leaf_role, durability);
    leaf.start();

    // The drain.
    hub.start();
    let started = Instant::now();
    let measured = rt.block_on(async {
        let hub_js = jetstream::new(connect(&hub_url).await);
        // The last observation with nothing of the backlog at the hub.
        let mut idle = Instant::now();
        loop {
            let now = Instant::now();
            let messages = stream_messages(&hub_js, "HUB").await.unwrap_or(1);
            if messages <= 1 {
                idle = now;
            }
            if messages > total || started.elapsed() >= s.drain_max {
                let complete = messages > total;
                assert!(
                    messages <= total + 1,
                    "the hub holds more than was published"
                );
                return Measured {
                    records: messages - 1,
                    seconds: (now - idle).as_secs_f64().max(1e-3),
                    note: format!(
                        "{:.2} s from the hub's start; backlog publish {fill_seconds:.1} s{}",
                        (now - started).as_secs_f64(),
                        if complete {
                            String::new()
                        } else {
                            format!(
                                "; NOT FINISHED: {} of {total} after {:?}",
                                messages - 1,
                                s.drain_max
                            )
                        }
                    ),
                    complete,
                };
            }
            tokio::time::sleep(POLL).await;
        }
    });
    hub.terminate();
    leaf.terminate();
    measured
}

// ----------------------------------------------------------- Tributary ---

fn ureq_agent() -> ureq::Agent {
    // Per-phase limits: a global one makes ureq resolve the address on a
    // new thread per request, which cost this client more CPU than the
    // agent spent on the request.
    tributary_api::phase_timeouts!(
        ureq::Agent::config_builder().http_status_as_error(false),
        Duration::from_secs(120)
    )
    .build()
    .into()
}

/// Posts `body` to `url`; returns the acknowledged record count.
fn edge_post(agent: &ureq::Agent, url: &str, content_type: &str, body: &[u8]) -> u64 {
    let mut response = agent
        .post(url)
        .header("content-type", content_type)
        .send(body)
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status().as_u16();
    let value: serde_json::Value = response
        .body_mut()
        .read_json()
        .unwrap_or_else(|e| panic!("POST {url}: response: {e}"));
    assert!(
        status == 200 || status == 201,
        "POST {url}: {status} {value}"
    );
    value["count"].as_u64().expect("count in the response")
}

fn tributary_publish(s: &Settings, durability: Durability, batch: usize) -> Measured {
    let dir = scratch_dir("vsnats-edge");
    // The broker is never started: the edge acknowledges local durability.
    let mut pair = Pair::new(dir.path(), durability.intent(), None);
    pair.edge.start();
    pair.wait_for_edge();
    let (hwm0, _) = pair.edge_offsets().expect("edge offsets");
    let (url, content_type, body) = if batch == 1 {
        (
            format!("http://{}/v1/topics/plant1/readings/records", pair.edge_api),
            "application/octet-stream",
            random_value(s.record_bytes, 11),
        )
    } else {
        let values: Vec<Vec<u8>> = (0..batch)
            .map(|i| random_value(s.record_bytes, 100 + i as u64))
            .collect();
        (
            format!("http://{}/v1/topics/plant1/readings/batch", pair.edge_api),
            "application/x-ndjson",
            ndjson(&values).into_bytes(),
        )
    };
    let body = Arc::new(body);
    // Warm-up: one acknowledged publish.
    let warm = edge_post(&ureq_agent(), &url, content_type, &body);
    let acked = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(s.producers + 1));
    let window = Duration::from_secs(s.publish_seconds);
    let threads: Vec<_> = (0..s.producers)
        .map(|_| {
            let (url, body, acked, barrier) =
                (url.clone(), body.clone(), acked.clone(), barrier.clone());
            std::thread::spawn(move || {
                let agent = ureq_agent();
                barrier.wait();
                let deadline = Instant::now() + window;
                let mut mine = 0u64;
                while Instant::now() < deadline && mine < MAX_RECORDS_PER_PRODUCER {
                    let count = edge_post(&agent, &url, content_type, &body);
                    assert_eq!(count, batch as u64);
                    mine += count;
                    acked.fetch_add(count, Ordering::Relaxed);
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for thread in threads {
        thread.join().expect("producer thread");
    }
    let seconds = start.elapsed().as_secs_f64();
    let records = acked.load(Ordering::Relaxed);
    let (hwm, _) = pair.edge_offsets().expect("edge offsets");
    assert_eq!(
        hwm - hwm0,
        records + warm,
        "the edge stored what it acknowledged"
    );
    assert_eq!(pair.edge.terminate(), Some(0));
    Measured::whole(records, seconds)
}

fn tributary_replication(s: &Settings, durability: Durability) -> Measured {
    let dir = scratch_dir("vsnats-pair");
    let mut pair = Pair::new(dir.path(), durability.intent(), None);
    pair.broker.start();
    pair.edge.start();
    pair.wait_for_edge();
    // Warm-up: the central topic exists and the connection was up once.
    let (_, warm) = pair
        .publish_ndjson(ndjson(&[random_value(s.record_bytes, 5)]))
        .expect("publish");
    pair.wait_acknowledged(warm, STEP_MAX);
    assert_eq!(pair.broker.terminate(), Some(0));

    let total = s.backlog_records();
    let batches = total / s.backlog_batch_records as u64;
    let bodies: Vec<String> = (0..8u64)
        .map(|v| {
            let values: Vec<Vec<u8>> = (0..s.backlog_batch_records)
                .map(|i| random_value(s.record_bytes, 1000 * v + i as u64))
                .collect();
            ndjson(&values)
        })
        .collect();
    let filled = Instant::now();
    let mut hwm = warm;
    for i in 0..batches {
        let (_, next) = pair
            .publish_ndjson(bodies[i as usize % bodies.len()].clone())
            .expect("publish");
        hwm = next;
    }
    let fill_seconds = filled.elapsed().as_secs_f64();
    assert_eq!(hwm - warm, total);

    pair.broker.start();
    let started = Instant::now();
    // The last observation with nothing of the backlog acknowledged.
    let mut idle = Instant::now();
    let measured = loop {
        let now = Instant::now();
        let acked = pair.edge_offsets().map_or(warm, |(_, acked)| acked);
        if acked <= warm {
            idle = now;
        }
        if acked == hwm || started.elapsed() >= s.drain_max {
            let complete = acked == hwm;
            break Measured {
                records: acked - warm,
                seconds: (now - idle).as_secs_f64().max(1e-3),
                note: format!(
                    "{:.2} s from the broker's start; backlog publish {fill_seconds:.1} s{}",
                    (now - started).as_secs_f64(),
                    if complete {
                        String::new()
                    } else {
                        format!(
                            "; NOT FINISHED: {} of {total} after {:?}",
                            acked - warm,
                            s.drain_max
                        )
                    }
                ),
                complete,
            };
        }
        std::thread::sleep(POLL);
    };
    assert_eq!(pair.broker.terminate(), Some(0));
    assert_eq!(pair.edge.terminate(), Some(0));
    measured
}

// -------------------------------------------------------------- driver ---

struct Row {
    case: Case,
    durability: Durability,
    tributary: Measured,
    nats: Measured,
}

fn run_case(s: &Settings, case: Case, durability: Durability, round: usize) -> Row {
    let tributary = || match case {
        Case::Publish => tributary_publish(s, durability, 1),
        Case::PublishBatch => tributary_publish(s, durability, s.batch_records),
        Case::Replication => tributary_replication(s, durability),
        Case::Mqtt | Case::MqttNatsMqtt => mqtt::tributary_mqtt(s, durability),
    };
    let nats = || match case {
        Case::Publish => nats_publish(s, durability, 1),
        Case::PublishBatch => nats_publish(s, durability, s.batch_records),
        Case::Replication => nats_replication(s, durability),
        Case::Mqtt => nats_publish(s, durability, 1),
        Case::MqttNatsMqtt => mqtt::nats_mqtt(s, durability),
    };
    // Alternate the order between rounds, against drift.
    let (tributary, nats) = if round.is_multiple_of(2) {
        let t = tributary();
        (t, nats())
    } else {
        let n = nats();
        (tributary(), n)
    };
    Row {
        case,
        durability,
        tributary,
        nats,
    }
}

fn fmt_rate(case: Case, s: &Settings, m: &Measured) -> String {
    let rate = m.rate();
    match case {
        Case::Replication => format!(
            "{:.0} rec/s = {:.1} MB/s",
            rate,
            rate * s.record_bytes as f64 / 1e6
        ),
        _ => format!("{rate:.0} rec/s"),
    }
}

fn range(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (v[0], median, v[v.len() - 1])
}

fn main() {
    let s = Settings::from_env();
    build_release_binaries();
    let version = Command::new(&s.nats_server)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| {
            panic!(
                "{} --version: {e} (set TRIBUTARY_BENCH_NATS_SERVER or run scripts/bench-vs-nats)",
                s.nats_server.display()
            )
        });
    println!("load average before: {}", load_average());
    println!(
        "Tributary (release edge-agent, broker) vs {version} ({}); records of {} B, {} producers, batches of {}, publish windows of {} s, backlog {} ({} records), {} rounds",
        s.nats_server.display(),
        s.record_bytes,
        s.producers,
        s.batch_records,
        s.publish_seconds,
        megabytes(s.backlog_bytes as f64),
        s.backlog_records(),
        s.rounds
    );
    let mut rows = Vec::new();
    for round in 0..s.rounds {
        for &durability in &s.durabilities {
            for &case in &s.cases {
                let row = run_case(&s, case, durability, round);
                println!(
                    "round {} | {} | {} | tributary {} ({} records in {:.2} s{}{}) | jetstream {} ({} records in {:.2} s{}{}) | ratio {:.2}",
                    round + 1,
                    durability.label(),
                    case.label(&s),
                    fmt_rate(case, &s, &row.tributary),
                    row.tributary.records,
                    row.tributary.seconds,
                    if row.tributary.note.is_empty() {
                        ""
                    } else {
                        "; "
                    },
                    row.tributary.note,
                    fmt_rate(case, &s, &row.nats),
                    row.nats.records,
                    row.nats.seconds,
                    if row.nats.note.is_empty() { "" } else { "; " },
                    row.nats.note,
                    row.tributary.rate() / row.nats.rate()
                );
                rows.push(row);
            }
        }
    }
    println!("load average after: {}", load_average());
    println!();
    println!(
        "| durability | case | Tributary rec/s (min–median–max) | JetStream rec/s (min–median–max) | ratio Tributary / JetStream (min–median–max) |"
    );
    println!("|---|---|---|---|---|");
    for &durability in &s.durabilities {
        for &case in &s.cases {
            let mine: Vec<&Row> = rows
                .iter()
                .filter(|r| r.case == case && r.durability == durability)
                .collect();
            let t: Vec<f64> = mine.iter().map(|r| r.tributary.rate()).collect();
            let n: Vec<f64> = mine.iter().map(|r| r.nats.rate()).collect();
            let q: Vec<f64> = mine
                .iter()
                .map(|r| r.tributary.rate() / r.nats.rate())
                .collect();
            let unfinished = mine
                .iter()
                .filter(|r| !r.tributary.complete || !r.nats.complete)
                .count();
            let (t, n, q) = (range(&t), range(&n), range(&q));
            println!(
                "| {} | {}{} | {:.0}–{:.0}–{:.0} | {:.0}–{:.0}–{:.0} | {:.2}–{:.2}–{:.2} |",
                durability.label(),
                case.label(&s),
                if unfinished > 0 {
                    format!(" ({unfinished} drains not finished)")
                } else {
                    String::new()
                },
                t.0,
                t.1,
                t.2,
                n.0,
                n.1,
                n.2,
                q.0,
                q.1,
                q.2
            );
        }
    }
}
