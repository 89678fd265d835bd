//! WAL append throughput against a raw-file baseline on the same disk.
//!
//! Run with `cargo bench -p broker-core --bench wal_throughput`; the whole run
//! takes about two minutes.
//!
//! # What is measured
//! Every case opens a fresh WAL (default [`WalConfig`] except `sync_mode`) in
//! a temporary directory under the target directory and appends to it from
//! tokio tasks on a multi-thread runtime with 2 worker threads, all sharing
//! one `Arc<Wal>`. The cases are every sync mode × value size (1 KiB and
//! 100 B values, no key, no headers) × producer shape:
//! - `1`, `16` and `64` producers, each appending one-record batches in a
//!   loop with `wal.append(vec![record], Codec::None)`, as a publishing client
//!   does;
//! - `64` producers appending 64-record batches (batch column `64`), as a
//!   batching client does.
//!
//! A case is [`ROUNDS_PER_CASE`] rounds, each a WAL run followed by its raw
//! baseline, so that drift in the disk's speed (it is shared on a VM) hits
//! both sides alike; the table sums the rounds. Each run's files are deleted
//! and the disk is left alone for [`SETTLE_TIME`] before the next run. A WAL
//! run stops after [`ROUND_RECORDS_MAX`] records or [`ROUND_TIME_MAX`],
//! whichever comes first (so a case stops after 2 million records or 1.5 s).
//! A run's clock stops once every producer has its last acknowledgement and
//! the high-water mark covers every appended record, so `async`, which
//! acknowledges on enqueue, is charged for writing out its queue too.
//!
//! The WAL runs on a storage wrapper that counts the `write`/`writev` calls (one per
//! group commit, plus one more when a group straddles a segment roll) and the
//! bytes that reach segment `.log` files. Right after each WAL run, the raw
//! baseline writes the same number of bytes to a plain file in the same
//! directory with [`File::write_all`], in as many equal chunks as the WAL
//! made writes, with `sync_data` (fdatasync) after each chunk for
//! `fsync_batch` and nothing more for `async` and `os_cache_flush`. That is
//! what the I/O of those group sizes costs with no record encoding, no CRC,
//! no hand-off between producers and the writer thread and no segment rolls.
//! For `async` and `os_cache_flush` the baseline therefore only measures
//! copying into the page cache, while the WAL also flushes each full 64 MiB
//! segment to disk when it seals it.
//!
//! # Reading the table
//! - `groups`, `B/group`: the WAL's writes to segment files (group commits)
//!   and their average size in bytes; the raw baseline uses the same.
//! - `syncs`: the WAL's `fdatasync` calls on segment files: one per group for
//!   `fsync_batch`, plus one per segment roll in every mode.
//! - `wr%`, `sync%`: share of the WAL runs' time that the writer thread spent
//!   inside `write` and inside `fdatasync` on segment files. When they add up
//!   to near 100 the WAL is I/O-bound, and a low `WAL/raw` points at its I/O
//!   pattern (in `async` and `os_cache_flush`, `sync%` is the `fdatasync` of
//!   each full 64 MiB segment when it rolls, which the baseline does not do);
//!   well below 100 the writer waits for work, so the cost is on the
//!   producers' side (encoding, the append lock, wakeups between producers and
//!   the writer).
//! - `WAL rec/s`, `raw rec/s`: records per second; the raw figure is the
//!   case's record count divided by the raw loop's time.
//! - `WAL MB/s`, `raw MB/s`: 10^6 bytes of log per second, counting whole
//!   encoded batches (48-byte batch header and record framing included), so
//!   both sides count the same bytes.
//! - `WAL/raw`: WAL speed as a share of the baseline's: the median over the
//!   rounds of raw time / WAL time. The median keeps one burst of disk latency
//!   from a neighbour on the host (back-to-back identical `fdatasync` loops on
//!   this VM vary by 3x) from deciding the figure, so it can differ from
//!   `WAL rec/s` / `raw rec/s`, which are totals. 1.00 means the WAL costs
//!   nothing beyond the I/O it issues; the gap below 1.00 is the WAL's own
//!   CPU and coordination cost at that group size.
//!
//! Group size is an outcome, not an input: fewer, larger groups make each
//! `fdatasync` serve more records, so compare rows by `WAL rec/s` and use
//! `WAL/raw` to judge overhead at a given group size.
//!
//! Two headline checks follow the table with PASS or MISS. A MISS is reported,
//! not turned into a failing exit status.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use broker_core::wal::segment::LOG_SUFFIX;
use broker_core::wal::storage::{AppendFile, FsStorage, OverwriteFile, ReadFile, Storage};
use broker_core::wal::{SyncMode, Wal, WalConfig};
use bytes::Bytes;
use tokio::runtime::Runtime;
use tributary_proto::{Codec, Record};

/// WAL runs per case, each followed by its raw baseline.
const ROUNDS_PER_CASE: u32 = 5;
/// Records after which a WAL run stops.
const ROUND_RECORDS_MAX: u64 = 400_000;
/// Time after which a WAL run's producers stop appending.
const ROUND_TIME_MAX: Duration = Duration::from_millis(300);
/// Pause between deleting one run's files and starting the next run: a VM's
/// disk stays slower for a while after heavy writes and discards, which would
/// otherwise count against whichever side runs next.
const SETTLE_TIME: Duration = Duration::from_millis(150);
/// Tokio worker threads (the WAL's writer thread comes on top).
const WORKER_THREADS: usize = 2;
/// Timestamp of every record, ms since the Unix epoch.
const RECORD_TIMESTAMP_MS: i64 = 1_700_000_000_000;

const MODES: [SyncMode; 3] = [
    SyncMode::Async,
    SyncMode::OsCacheFlush,
    SyncMode::FsyncBatch,
];
const VALUE_SIZES_BYTES: [usize; 2] = [1024, 100];
const SHAPES: [Shape; 4] = [
    Shape {
        producers: 1,
        records_per_batch: 1,
    },
    Shape {
        producers: 16,
        records_per_batch: 1,
    },
    Shape {
        producers: 64,
        records_per_batch: 1,
    },
    Shape {
        producers: 64,
        records_per_batch: 64,
    },
];

/// Headline 1: `fsync_batch` with this many one-record producers...
const HEADLINE_FSYNC_PRODUCERS: usize = 64;
/// ...reaches at least this share of the raw group-commit baseline.
const HEADLINE_FSYNC_RATIO_MIN: f64 = 0.8;
/// Headline 2: `os_cache_flush` with values of this size...
const HEADLINE_CACHE_VALUE_BYTES: usize = 100;
/// ...reaches at least this many records per second.
const HEADLINE_CACHE_RECORDS_PER_SEC_MIN: f64 = 1_000_000.0;

/// How the producers append.
#[derive(Debug, Clone, Copy)]
struct Shape {
    producers: usize,
    records_per_batch: u32,
}

/// Counters of I/O on segment `.log` files.
#[derive(Debug, Default)]
struct IoCounts {
    writes: AtomicU64,
    bytes: AtomicU64,
    syncs: AtomicU64,
    /// Time spent inside `write` calls, ns.
    write_nanos: AtomicU64,
    /// Time spent inside `fdatasync` calls, ns.
    sync_nanos: AtomicU64,
}

impl IoCounts {
    fn snapshot(&self) -> IoSnapshot {
        IoSnapshot {
            writes: self.writes.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            write_time: Duration::from_nanos(self.write_nanos.load(Ordering::Relaxed)),
            sync_time: Duration::from_nanos(self.sync_nanos.load(Ordering::Relaxed)),
        }
    }
}

/// [`IoCounts`] read at one moment (or summed over runs).
#[derive(Debug, Clone, Copy, Default)]
struct IoSnapshot {
    writes: u64,
    bytes: u64,
    syncs: u64,
    write_time: Duration,
    sync_time: Duration,
}

impl IoSnapshot {
    fn add(&mut self, other: &IoSnapshot) {
        self.writes += other.writes;
        self.bytes += other.bytes;
        self.syncs += other.syncs;
        self.write_time += other.write_time;
        self.sync_time += other.sync_time;
    }
}

/// Adds the time since `start` to `nanos`.
fn add_elapsed(nanos: &AtomicU64, start: Instant) {
    let elapsed = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    nanos.fetch_add(elapsed, Ordering::Relaxed);
}

/// [`FsStorage`] that counts and times appends and syncs on segment `.log`
/// files (seal index files and directory syncs are not counted).
struct CountingStorage {
    inner: FsStorage,
    counts: Arc<IoCounts>,
}

struct CountingFile {
    inner: Box<dyn AppendFile>,
    counts: Arc<IoCounts>,
}

impl AppendFile for CountingFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let start = Instant::now();
        self.inner.append(buf)?;
        add_elapsed(&self.counts.write_nanos, start);
        self.counts.writes.fetch_add(1, Ordering::Relaxed);
        self.counts
            .bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn append_vectored(&mut self, bufs: &[&[u8]]) -> io::Result<()> {
        let start = Instant::now();
        self.inner.append_vectored(bufs)?;
        add_elapsed(&self.counts.write_nanos, start);
        self.counts.writes.fetch_add(1, Ordering::Relaxed);
        let bytes: usize = bufs.iter().map(|b| b.len()).sum();
        self.counts.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    fn start_writeback(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.start_writeback(offset, len)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let start = Instant::now();
        self.inner.sync_data()?;
        add_elapsed(&self.counts.sync_nanos, start);
        self.counts.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
}

impl Storage for CountingStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let file = self.inner.open_append(path)?;
        let is_segment = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.ends_with(LOG_SUFFIX));
        if !is_segment {
            return Ok(file);
        }
        Ok(Box::new(CountingFile {
            inner: file,
            counts: self.counts.clone(),
        }))
    }

    fn open_overwrite(&self, path: &Path) -> io::Result<Box<dyn OverwriteFile>> {
        self.inner.open_overwrite(path)
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        self.inner.open_read(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

/// The record and time budget of one WAL run, shared by its producers.
struct Budget {
    records_claimed: AtomicU64,
    /// Set by a timer thread when the run's time is up, so producers need
    /// not read the clock on every append.
    time_up: AtomicBool,
}

impl Budget {
    /// Claims `count` records; false once the run is over.
    fn claim(&self, count: u64) -> bool {
        if self.time_up.load(Ordering::Relaxed) {
            return false;
        }
        let before = self.records_claimed.fetch_add(count, Ordering::Relaxed);
        before + count <= ROUND_RECORDS_MAX
    }
}

/// One producer: appends `records_per_batch` copies of `record` per batch
/// until the budget runs out. Returns the records it appended.
async fn produce(
    wal: Arc<Wal>,
    budget: Arc<Budget>,
    record: Record,
    records_per_batch: u32,
) -> u64 {
    let count = u64::from(records_per_batch);
    let mut appended = 0;
    while budget.claim(count) {
        let records = vec![record.clone(); records_per_batch as usize];
        wal.append(records, Codec::None)
            .await
            .expect("WAL append failed");
        appended += count;
    }
    appended
}

/// What the WAL side of a run (or, summed, of a case) did.
#[derive(Default)]
struct WalRun {
    records: u64,
    elapsed: Duration,
    io: IoSnapshot,
}

impl WalRun {
    fn add(&mut self, other: &WalRun) {
        self.records += other.records;
        self.elapsed += other.elapsed;
        self.io.add(&other.io);
    }
}

fn run_wal(rt: &Runtime, dir: &Path, mode: SyncMode, shape: Shape, value_bytes: usize) -> WalRun {
    let counts = Arc::new(IoCounts::default());
    let storage = Arc::new(CountingStorage {
        inner: FsStorage,
        counts: counts.clone(),
    });
    let config = WalConfig {
        sync_mode: mode,
        ..WalConfig::default()
    };
    let wal = Arc::new(Wal::open_with(storage, dir, config).expect("open WAL"));
    rt.block_on(async move {
        let budget = Arc::new(Budget {
            records_claimed: AtomicU64::new(0),
            time_up: AtomicBool::new(false),
        });
        let start = Instant::now();
        let (cancel_timer, timer_cancelled) = mpsc::channel::<()>();
        let timer = thread::spawn({
            let budget = budget.clone();
            move || {
                // Returns at the deadline, or early once `cancel_timer` is
                // dropped.
                let _ = timer_cancelled.recv_timeout(ROUND_TIME_MAX);
                budget.time_up.store(true, Ordering::Relaxed);
            }
        });
        let producers: Vec<_> = (0..shape.producers)
            .map(|_| {
                // Each producer has its own value buffer, so cloning a record
                // does not bounce one reference count between threads.
                let record = Record {
                    timestamp_ms: RECORD_TIMESTAMP_MS,
                    key: None,
                    headers: Vec::new(),
                    value: Bytes::from(vec![0xA5; value_bytes]),
                };
                tokio::spawn(produce(
                    wal.clone(),
                    budget.clone(),
                    record,
                    shape.records_per_batch,
                ))
            })
            .collect();
        let mut records = 0;
        for producer in producers {
            records += producer.await.expect("producer task panicked");
        }
        drop(cancel_timer);
        timer.join().expect("timer thread panicked");
        // `async` acknowledges on enqueue: wait until everything is written.
        let next_offset = wal.next_offset();
        if next_offset > 0 {
            wal.wait_for_offset(next_offset - 1)
                .await
                .expect("WAL stopped before writing every append");
        }
        let elapsed = start.elapsed();
        let io = counts.snapshot();
        Arc::try_unwrap(wal)
            .expect("producers have dropped their WAL handles")
            .close()
            .await
            .expect("close WAL");
        WalRun {
            records,
            elapsed,
            io,
        }
    })
}

/// Writes `total_bytes` to a new file at `path` in `writes` equal chunks
/// (the first `total_bytes % writes` one byte longer), with `fdatasync`
/// after each chunk for `fsync_batch`. Returns the time taken.
fn run_raw(path: &Path, mode: SyncMode, total_bytes: u64, writes: u64) -> Duration {
    assert!(writes > 0, "raw baseline needs at least one write");
    let chunk_bytes = usize::try_from(total_bytes / writes).expect("chunk fits in memory");
    let longer_chunks = total_bytes % writes;
    let buf = vec![0xA5_u8; chunk_bytes + 1];
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("create raw baseline file");
    let start = Instant::now();
    for i in 0..writes {
        let len = if i < longer_chunks {
            chunk_bytes + 1
        } else {
            chunk_bytes
        };
        file.write_all(&buf[..len]).expect("raw write");
        if mode == SyncMode::FsyncBatch {
            file.sync_data().expect("raw fdatasync");
        }
    }
    start.elapsed()
}

/// One row of the table: the sums over a case's rounds.
struct CaseResult {
    mode: SyncMode,
    shape: Shape,
    value_bytes: usize,
    wal: WalRun,
    raw_elapsed: Duration,
    /// Median over the rounds of raw time / WAL time.
    ratio: f64,
}

impl CaseResult {
    fn wal_records_per_sec(&self) -> f64 {
        self.wal.records as f64 / self.wal.elapsed.as_secs_f64()
    }

    fn raw_records_per_sec(&self) -> f64 {
        self.wal.records as f64 / self.raw_elapsed.as_secs_f64()
    }

    fn wal_mb_per_sec(&self) -> f64 {
        self.wal.io.bytes as f64 / 1e6 / self.wal.elapsed.as_secs_f64()
    }

    fn raw_mb_per_sec(&self) -> f64 {
        self.wal.io.bytes as f64 / 1e6 / self.raw_elapsed.as_secs_f64()
    }

    /// `time` as a percentage of the WAL runs' time.
    fn wal_time_share(&self, time: Duration) -> f64 {
        100.0 * time.as_secs_f64() / self.wal.elapsed.as_secs_f64()
    }

    fn describe_shape(&self) -> String {
        format!(
            "{} producers x {}-record batches",
            self.shape.producers, self.shape.records_per_batch
        )
    }
}

fn run_case(
    rt: &Runtime,
    root: &Path,
    mode: SyncMode,
    shape: Shape,
    value_bytes: usize,
) -> CaseResult {
    let mut wal = WalRun::default();
    let mut raw_elapsed = Duration::ZERO;
    let mut ratios = Vec::new();
    for _ in 0..ROUNDS_PER_CASE {
        let round_dir = tempfile::tempdir_in(root).expect("create round directory");
        let wal_dir = round_dir.path().join("wal");
        let round = run_wal(rt, &wal_dir, mode, shape, value_bytes);
        // Deleting the WAL's files drops their dirty pages, so the baseline
        // does not compete with their writeback.
        fs::remove_dir_all(&wal_dir).expect("remove WAL directory");
        settle(round_dir.path());
        let raw_path = round_dir.path().join("raw.bin");
        let round_raw_elapsed = run_raw(&raw_path, mode, round.io.bytes, round.io.writes);
        fs::remove_file(&raw_path).expect("remove raw baseline file");
        settle(round_dir.path());
        ratios.push(round_raw_elapsed.as_secs_f64() / round.elapsed.as_secs_f64());
        raw_elapsed += round_raw_elapsed;
        wal.add(&round);
    }
    CaseResult {
        mode,
        shape,
        value_bytes,
        wal,
        raw_elapsed,
        ratio: median(&mut ratios),
    }
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "median of nothing");
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// Makes the deletions in `dir` durable, then leaves the disk idle for
/// [`SETTLE_TIME`].
fn settle(dir: &Path) {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .expect("fsync round directory");
    thread::sleep(SETTLE_TIME);
}

/// `1234567.8` → `"1,234,568"`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn value_label(value_bytes: usize) -> String {
    if value_bytes.is_multiple_of(1024) {
        format!("{} KiB", value_bytes / 1024)
    } else {
        format!("{value_bytes} B")
    }
}

fn print_header() {
    println!(
        "{:<15} {:>4} {:>5} {:>6} {:>10} {:>9} {:>9} {:>9} {:>3} {:>5} {:>11} {:>11} {:>9} {:>9} {:>7}",
        "mode",
        "prod",
        "batch",
        "value",
        "records",
        "groups",
        "B/group",
        "syncs",
        "wr%",
        "sync%",
        "WAL rec/s",
        "raw rec/s",
        "WAL MB/s",
        "raw MB/s",
        "WAL/raw"
    );
}

fn print_row(case: &CaseResult) {
    let io = &case.wal.io;
    println!(
        "{:<15} {:>4} {:>5} {:>6} {:>10} {:>9} {:>9} {:>9} {:>3.0} {:>5.0} {:>11} {:>11} {:>9.1} {:>9.1} {:>7.2}",
        case.mode.as_str(),
        case.shape.producers,
        case.shape.records_per_batch,
        value_label(case.value_bytes),
        thousands(case.wal.records as f64),
        thousands(io.writes as f64),
        thousands(io.bytes as f64 / io.writes.max(1) as f64),
        thousands(io.syncs as f64),
        case.wal_time_share(io.write_time),
        case.wal_time_share(io.sync_time),
        thousands(case.wal_records_per_sec()),
        thousands(case.raw_records_per_sec()),
        case.wal_mb_per_sec(),
        case.raw_mb_per_sec(),
        case.ratio,
    );
}

fn pass_or_miss(pass: bool) -> &'static str {
    if pass { "PASS" } else { "MISS" }
}

fn print_headlines(cases: &[CaseResult]) {
    println!();
    println!("Headline checks");

    let fsync_rows: Vec<&CaseResult> = cases
        .iter()
        .filter(|c| {
            c.mode == SyncMode::FsyncBatch
                && c.shape.producers == HEADLINE_FSYNC_PRODUCERS
                && c.shape.records_per_batch == 1
        })
        .collect();
    let worst = fsync_rows.iter().map(|c| c.ratio).min_by(f64::total_cmp);
    let detail: Vec<String> = fsync_rows
        .iter()
        .map(|c| format!("{} values {:.2}", value_label(c.value_bytes), c.ratio))
        .collect();
    println!(
        "  {}  fsync_batch, {HEADLINE_FSYNC_PRODUCERS} producers (one-record batches), \
         ratio vs raw group-commit baseline >= {HEADLINE_FSYNC_RATIO_MIN:.1}: {}",
        pass_or_miss(worst.is_some_and(|w| w >= HEADLINE_FSYNC_RATIO_MIN)),
        detail.join(", "),
    );

    let best_cache = cases
        .iter()
        .filter(|c| c.mode == SyncMode::OsCacheFlush && c.value_bytes == HEADLINE_CACHE_VALUE_BYTES)
        .max_by(|a, b| a.wal_records_per_sec().total_cmp(&b.wal_records_per_sec()));
    let best_cache_single = cases
        .iter()
        .filter(|c| {
            c.mode == SyncMode::OsCacheFlush
                && c.value_bytes == HEADLINE_CACHE_VALUE_BYTES
                && c.shape.records_per_batch == 1
        })
        .max_by(|a, b| a.wal_records_per_sec().total_cmp(&b.wal_records_per_sec()));
    match best_cache {
        Some(best) => println!(
            "  {}  os_cache_flush >= {} records/s of {}: best {} records/s with {}",
            pass_or_miss(best.wal_records_per_sec() >= HEADLINE_CACHE_RECORDS_PER_SEC_MIN),
            thousands(HEADLINE_CACHE_RECORDS_PER_SEC_MIN),
            value_label(HEADLINE_CACHE_VALUE_BYTES),
            thousands(best.wal_records_per_sec()),
            best.describe_shape(),
        ),
        None => println!("  MISS  os_cache_flush: no {HEADLINE_CACHE_VALUE_BYTES}-byte case ran"),
    }
    if let Some(single) = best_cache_single {
        println!(
            "        (best with one-record batches: {} records/s with {})",
            thousands(single.wal_records_per_sec()),
            single.describe_shape(),
        );
    }
}

fn main() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    fs::create_dir_all(root).expect("create CARGO_TARGET_TMPDIR");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .build()
        .expect("build tokio runtime");

    println!(
        "WAL throughput vs raw File::write_all baseline: {WORKER_THREADS} tokio workers, \
         {ROUNDS_PER_CASE} rounds per case, each up to {} records or {:.1} s, files under {}",
        thousands(ROUND_RECORDS_MAX as f64),
        ROUND_TIME_MAX.as_secs_f64(),
        root.display(),
    );
    println!();
    print_header();
    let mut cases = Vec::new();
    for mode in MODES {
        for value_bytes in VALUE_SIZES_BYTES {
            for shape in SHAPES {
                let case = run_case(&rt, root, mode, shape, value_bytes);
                print_row(&case);
                io::stdout().flush().expect("flush stdout");
                cases.push(case);
            }
        }
    }
    print_headlines(&cases);
}
