//! Test harness: a stand-in broker in the test process (the real admin
//! router with its storage endpoints, a redb metadata store, and real topic
//! WALs with local retention that deletes whatever is tiered), and helpers
//! to inspect descriptors and the bucket.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::response::IntoResponse;
use broker_core::metadata::redb::RedbStore;
use broker_core::metadata::{BoxFuture, MetadataStore};

use broker_core::clock::ManualClock;
use broker_core::wal::{Wal, WalConfig};
use bytes::Bytes;
use tributary_broker::admin::{AdminState, StaticClusterView, router};
use tributary_broker::storage::{
    LocalSegments, SealReport, TrimReport, WalView, list_descriptors, seal_wal, trim_wal,
    with_local_segments,
};
use tributary_proto::archive::SegmentDescriptor;
use tributary_proto::batch::{Codec, Record};
use tributary_proto::keys::{StorageKeys, TopicName};
use tributary_proto::limits::Limits;

pub const TOKEN: &str = "tier-test-token";

/// Checks every descriptor commit that reaches the stand-in broker
/// against the bucket as it is at that moment (read directly, not through
/// any fault proxy): the object must exist, be complete and intact, and
/// match the descriptor. Off until a bucket is set.
#[derive(Default)]
pub struct CommitChecker {
    pub bucket: Mutex<Option<tributary_archive::Bucket>>,
    pub checked: AtomicU64,
    pub violations: Mutex<Vec<String>>,
}

impl CommitChecker {
    async fn check(&self, body: &[u8]) {
        let Some(bucket) = self.bucket.lock().unwrap().clone() else {
            return;
        };
        let request: serde_json::Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                self.violations
                    .lock()
                    .unwrap()
                    .push(format!("bad commit body: {e}"));
                return;
            }
        };
        let Ok(descriptor) =
            serde_json::from_value::<SegmentDescriptor>(request["descriptor"].clone())
        else {
            self.violations
                .lock()
                .unwrap()
                .push(format!("bad descriptor: {request}"));
            return;
        };
        self.checked.fetch_add(1, Ordering::Relaxed);
        let archive = tributary_archive::reader::Archive::new(bucket, StorageKeys::default());
        let object = tributary_archive::reader::SegmentObjectInfo {
            key: descriptor.object_id.clone(),
            start_offset: descriptor.start_offset,
            end_offset: descriptor.end_offset,
            size: descriptor.size,
        };
        let verdict = archive.verify(&object, &mut |_| {}).await;
        let problem = match &verdict.footer {
            _ if !verdict.damage.is_empty() => Some(format!("damaged: {:?}", verdict.damage)),
            None => Some("no readable footer".to_owned()),
            Some(footer) if !descriptor.matches_footer(footer) => {
                Some(format!("footer {footer:?} differs"))
            }
            Some(_) => None,
        };
        if let Some(problem) = problem {
            self.violations.lock().unwrap().push(format!(
                "commit of {} while its object is not fully stored: {problem}",
                descriptor.object_id
            ));
        }
    }
}

type SharedArchive = Arc<Mutex<Option<tributary_archive::Archive>>>;

/// Puts the harness's current archive into each request, as the broker's
/// `with_storage_archive` layer does.
async fn with_archive(
    axum::extract::State(archive): axum::extract::State<SharedArchive>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let current = archive.lock().unwrap().clone();
    if let Some(current) = current {
        request
            .extensions_mut()
            .insert(tributary_broker::storage::StorageArchive(Arc::new(current)));
    }
    next.run(request).await
}

async fn check_commits(
    axum::extract::State(checker): axum::extract::State<Arc<CommitChecker>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if request.method() != axum::http::Method::POST
        || !request.uri().path().starts_with("/v1/storage/descriptors")
    {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return axum::http::StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    // `Archive::verify` takes a `&mut dyn FnMut` (not `Send`): run the
    // check on a blocking thread.
    let handle = tokio::runtime::Handle::current();
    let body = bytes.clone();
    let checked = tokio::task::spawn_blocking(move || handle.block_on(checker.check(&body)));
    if let Err(e) = checked.await {
        return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

/// The broker's topic WALs as the admin API's `trim` sees them. Checks, at
/// every trim, that each segment about to be deleted has its descriptor
/// committed.
pub struct TestWals {
    pub wals: Mutex<BTreeMap<TopicName, Arc<Wal>>>,
    pub store: Arc<RedbStore>,
    pub violations: Mutex<Vec<String>>,
    pub trims: AtomicU64,
    /// While set, trims delete nothing (local segments stay after tiering).
    pub hold_trims: std::sync::atomic::AtomicBool,
}

impl LocalSegments for TestWals {
    fn trim<'a>(
        &'a self,
        topic: &'a TopicName,
        safe_offset: u64,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<TrimReport, String>> {
        Box::pin(async move {
            let Some(wal) = self.wals.lock().unwrap().get(topic).cloned() else {
                return Ok(TrimReport::default());
            };
            let keys = StorageKeys::default();
            for segment in wal.sealed_segments() {
                if segment.next_offset <= safe_offset
                    && self
                        .store
                        .get(&keys.segment_descriptor(topic, segment.base_offset))
                        .await
                        .map_err(|e| e.to_string())?
                        .is_none()
                {
                    self.violations.lock().unwrap().push(format!(
                        "{topic}: segment {}..{} would be deleted without a descriptor",
                        segment.base_offset, segment.next_offset
                    ));
                }
            }
            self.trims.fetch_add(1, Ordering::Relaxed);
            if self.hold_trims.load(Ordering::Relaxed) {
                return Ok(TrimReport {
                    wal_open: true,
                    deleted: Vec::new(),
                    log_start: Some(wal.log_start_offset()),
                });
            }
            // The broker's own trim of an open WAL.
            trim_wal(wal, safe_offset, now_ms).await
        })
    }

    fn seal<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<SealReport, String>> {
        Box::pin(async move {
            let Some(wal) = self.wals.lock().unwrap().get(topic).cloned() else {
                return Ok(SealReport::default());
            };
            seal_wal(&wal).await
        })
    }

    fn view<'a>(&'a self, topic: &'a TopicName) -> BoxFuture<'a, Result<Option<WalView>, String>> {
        Box::pin(async move {
            Ok(self
                .wals
                .lock()
                .unwrap()
                .get(topic)
                .map(|wal| WalView::of(wal)))
        })
    }
}

/// WAL settings that roll often: 64 KiB batches at most, 128 KiB segments,
/// local retention that deletes every tiered sealed segment.
pub fn wal_config(retention: bool) -> WalConfig {
    WalConfig {
        limits: Limits {
            max_record_bytes: 16 * 1024,
            max_batch_bytes: 64 * 1024,
        },
        segment_max_bytes: 128 * 1024,
        max_pending_bytes: 1024 * 1024,
        retention_max_bytes: retention.then_some(0),
        ..WalConfig::default()
    }
}

/// The record at `offset` of a test topic: deterministic content.
pub fn record_for(topic: &str, offset: u64) -> Record {
    let len = 50 + (offset * 37 % 900) as usize;
    let mut value = format!("{topic}#{offset}:").into_bytes();
    value.resize(len, b'a' + (offset % 26) as u8);
    Record {
        timestamp_ms: 1_700_000_000_000 + offset as i64 * 10,
        key: Some(Bytes::from(format!("k{}", offset % 7))),
        headers: vec![("n".into(), Bytes::from(offset.to_string()))],
        value: Bytes::from(value),
    }
}

pub struct Harness {
    pub runtime: tokio::runtime::Runtime,
    pub store: Arc<RedbStore>,
    pub wals: Arc<TestWals>,
    pub base_url: String,
    pub data_dir: PathBuf,
    pub bucket_dir: PathBuf,
    pub topics: Vec<TopicName>,
    pub commits: Arc<CommitChecker>,
    /// The bucket the stand-in broker checks objects in.
    pub archive: SharedArchive,
    /// With [`Harness::with_cluster`]: brokers 1 (serving this API) and 2
    /// (a lease only), sharing the metadata store.
    pub clusters: Vec<Arc<tributary_broker::cluster::Cluster>>,
    _dir: tempfile::TempDir,
}

impl Harness {
    pub fn new(topics: &[&str]) -> Harness {
        Harness::with_retention(topics, true)
    }

    /// With `retention` false the broker keeps tiered segments locally.
    pub fn with_retention(topics: &[&str], retention: bool) -> Harness {
        Harness::build(topics, retention, false)
    }

    /// As [`Harness::new`], the stand-in broker being broker 1 of a
    /// cluster with topic ownership (its `Extension<Arc<Cluster>>`), and a
    /// broker 2 holding a lease; both leases are live on return. No topic
    /// has an owner yet.
    pub fn with_cluster(topics: &[&str]) -> Harness {
        let h = Harness::build(topics, true, true);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while h.clusters[0].brokers().iter().filter(|b| b.live).count() < 2 {
            assert!(std::time::Instant::now() < deadline, "leases not live");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        h
    }

    fn build(topics: &[&str], retention: bool, cluster: bool) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let store = Arc::new(
            RedbStore::open(dir.path().join("meta.redb"), Arc::new(ManualClock::new(1))).unwrap(),
        );
        let data_dir = dir.path().join("broker");
        let bucket_dir = dir.path().join("bucket");
        let topics: Vec<TopicName> = topics.iter().map(|t| TopicName::new(t).unwrap()).collect();
        let mut wals = BTreeMap::new();
        for topic in &topics {
            let wal_dir = data_dir
                .join("topics")
                .join(topic.namespace())
                .join(topic.topic());
            let wal = runtime
                .block_on(async { Wal::open(&wal_dir, wal_config(retention)) })
                .unwrap();
            wals.insert(topic.clone(), Arc::new(wal));
        }
        let wals = Arc::new(TestWals {
            wals: Mutex::new(wals),
            store: store.clone(),
            violations: Mutex::new(Vec::new()),
            trims: AtomicU64::new(0),
            hold_trims: std::sync::atomic::AtomicBool::new(false),
        });
        let state = AdminState {
            store: store.clone(),
            cluster: Arc::new(StaticClusterView::single_leader("127.0.0.1:1", 1)),
            auth: tributary_broker::auth::AuthState::new(store.clone(), Some(TOKEN.to_owned())),
        };
        let commits = Arc::new(CommitChecker::default());
        // The broker checks objects in the bucket the tier service writes
        // (its `[archive]`): the local bucket directory unless a test sets
        // another ([`Harness::set_archive`]).
        let archive = Arc::new(Mutex::new(Some(tributary_archive::Archive::new(
            tributary_archive::Bucket::local(bucket_dir.clone()).unwrap(),
            StorageKeys::default(),
        ))));
        let clusters: Vec<Arc<tributary_broker::cluster::Cluster>> = if cluster {
            (1..=2u64)
                .map(|id| {
                    use tributary_broker::cluster::{Cluster, ClusterConfig};
                    let cluster = Cluster::new(
                        id,
                        store.clone(),
                        Arc::new(broker_core::clock::SystemClock),
                        ClusterConfig {
                            heartbeat_ms: 100,
                            ..ClusterConfig::new(
                                format!("127.0.0.1:{}", 7700 + id),
                                format!("http://127.0.0.1:{}", 7800 + id),
                            )
                        },
                    );
                    runtime.spawn(tributary_broker::cluster::lease::run(cluster.clone()));
                    runtime.spawn(cluster.clone().follow());
                    cluster
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut app = with_local_segments(router(state), wals.clone());
        if let Some(cluster) = clusters.first() {
            app = app.layer(axum::Extension(cluster.clone()));
        }
        let app = app
            .layer(axum::middleware::from_fn_with_state(
                archive.clone(),
                with_archive,
            ))
            .layer(axum::middleware::from_fn_with_state(
                commits.clone(),
                check_commits,
            ));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(async move { axum::serve(listener, app).await });
        Harness {
            runtime,
            store,
            wals,
            base_url,
            data_dir,
            bucket_dir,
            topics,
            commits,
            archive,
            clusters,
            _dir: dir,
        }
    }

    /// Adds a topic whose WAL uses `config` (for segments larger than
    /// [`wal_config`] makes).
    pub fn add_topic(&mut self, name: &str, config: WalConfig) -> TopicName {
        let topic = TopicName::new(name).unwrap();
        let wal_dir = self
            .data_dir
            .join("topics")
            .join(topic.namespace())
            .join(topic.topic());
        let wal = self
            .runtime
            .block_on(async { Wal::open(&wal_dir, config) })
            .unwrap();
        self.wals
            .wals
            .lock()
            .unwrap()
            .insert(topic.clone(), Arc::new(wal));
        self.topics.push(topic.clone());
        topic
    }

    /// The stand-in broker checks objects in `bucket` from now on (its
    /// `[archive]`).
    pub fn set_archive(&self, bucket: tributary_archive::Bucket) {
        *self.archive.lock().unwrap() = Some(tributary_archive::Archive::new(
            bucket,
            StorageKeys::default(),
        ));
    }

    /// The stand-in broker runs without `[archive]` from now on.
    pub fn clear_archive(&self) {
        *self.archive.lock().unwrap() = None;
    }

    pub fn wal(&self, topic: &TopicName) -> Arc<Wal> {
        self.wals.wals.lock().unwrap()[topic].clone()
    }

    /// Appends `count` records to every topic in batches of `per_batch`,
    /// then rolls so everything is sealed.
    pub fn write(&self, count: u64, per_batch: u64) {
        for topic in &self.topics {
            let wal = self.wal(topic);
            self.runtime.block_on(async {
                let mut left = count;
                while left > 0 {
                    let n = left.min(per_batch);
                    let base = wal.next_offset();
                    let records = (base..base + n)
                        .map(|o| record_for(topic.as_str(), o))
                        .collect();
                    let codec = if base.is_multiple_of(3) {
                        Codec::Zstd
                    } else {
                        Codec::None
                    };
                    wal.append(records, codec).await.unwrap();
                    left -= n;
                }
                wal.roll().await.unwrap();
            });
        }
    }

    pub fn descriptors(&self, topic: &TopicName) -> Vec<SegmentDescriptor> {
        self.runtime
            .block_on(list_descriptors(
                &*self.store,
                &StorageKeys::default(),
                topic,
            ))
            .unwrap()
    }

    /// Object keys (relative to the bucket root) under the topic's
    /// segments prefix, with sizes. Staging files are not objects.
    pub fn objects(&self, topic: &TopicName) -> BTreeMap<String, u64> {
        let prefix = StorageKeys::default().segment_objects_prefix(topic);
        let dir = self.bucket_dir.join(&prefix);
        let mut out = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.contains('#') {
                    continue;
                }
                out.insert(format!("{prefix}{name}"), entry.metadata().unwrap().len());
            }
        }
        out
    }

    pub fn violations(&self) -> Vec<String> {
        self.wals.violations.lock().unwrap().clone()
    }

    /// The tier-service command for this harness, `--once`.
    pub fn tier_command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tier-service"));
        cmd.arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--bucket")
            .arg(&self.bucket_dir)
            .arg("--broker-url")
            .arg(&self.base_url)
            .arg("--token")
            .arg(TOKEN)
            .arg("--multipart-threshold-bytes")
            .arg("65536")
            .arg("--part-size-bytes")
            .arg("16384")
            .arg("--once")
            .env("RUST_LOG", "warn")
            .env_remove("TRIB_TIER_FAULT")
            .env_remove("TRIB_ADMIN_TOKEN")
            .env_remove("TRIB_TIER_TOKEN");
        cmd
    }

    pub fn tier_config(&self) -> tributary_tier::TierConfig {
        let mut config = tributary_tier::TierConfig::new(self.data_dir.clone());
        config.store.url = Some(self.bucket_dir.display().to_string());
        config.broker.url = self.base_url.clone();
        config.broker.token = Some(TOKEN.to_owned());
        config.upload.multipart_threshold_bytes = 64 * 1024;
        config.upload.part_size_bytes = 16 * 1024;
        config.retry.min_delay_ms = 10;
        config.retry.max_delay_ms = 50;
        config
    }
}

/// Every offset below `end` covered exactly once by `descriptors`, which
/// are contiguous from `start`.
pub fn assert_contiguous(
    topic: &TopicName,
    descriptors: &[SegmentDescriptor],
    start: u64,
    end: u64,
) {
    let mut next = start;
    for d in descriptors {
        assert_eq!(
            d.start_offset, next,
            "{topic}: descriptors not contiguous: {descriptors:#?}"
        );
        next = d.next_offset();
    }
    assert_eq!(
        next, end,
        "{topic}: descriptors end at {next}, expected {end}"
    );
}

/// The store configuration of `bucket` on the S3 server (moto) at
/// `endpoint`: path style, plain HTTP, test credentials.
pub fn s3_store(endpoint: &str, bucket: &str) -> tributary_archive::StoreConfig {
    tributary_archive::StoreConfig {
        url: Some(format!("s3://{bucket}")),
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        path_style: Some(true),
        allow_http: Some(true),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        session_token: None,
        ..tributary_archive::StoreConfig::default()
    }
}

/// Creates `bucket` on the S3 server at `endpoint`.
pub async fn create_bucket(endpoint: &str, bucket: &str) {
    tributary_archive::install_crypto_provider();
    let status = reqwest::Client::new()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "create bucket {bucket}: {status}");
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
