//! Where archive objects live: a local directory (the embedded default) or
//! an S3-compatible bucket, behind `object_store`, plus the few calls the
//! tier service and the archive reader make, each counted so tests can
//! check how many requests a read took.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMode, PutOptions, PutPayload, RetryConfig,
};
use serde::Deserialize;

use crate::error::BucketError;

/// Installs ring as rustls's process-wide crypto provider (the workspace
/// builds rustls and reqwest without a default provider, see the root
/// `Cargo.toml`). Idempotent; every constructor of an HTTP client here
/// calls it first.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Where the archive is: `url` is a local directory path (or `file://`
/// URL) or `s3://bucket`. S3 settings not given here come from the
/// standard `AWS_*` environment variables (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
/// `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, ...).
///
/// `Debug` shows `<redacted>` for the secret access key and the session
/// token, so a logged configuration carries no credential.
#[derive(Clone, Default, PartialEq, Eq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// The bucket: a local directory path, `file:///path` or `s3://bucket`.
    #[arg(long = "bucket", env = "TRIB_ARCHIVE_BUCKET")]
    pub url: Option<String>,
    /// S3 endpoint, e.g. `http://127.0.0.1:9000` for MinIO or a test server.
    #[arg(long = "s3-endpoint")]
    pub endpoint: Option<String>,
    /// S3 region. Default from `AWS_REGION`, else `us-east-1`.
    #[arg(long = "s3-region")]
    pub region: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`), as MinIO and most test
    /// servers need. Default: path style unless the environment says
    /// otherwise.
    #[arg(long = "s3-path-style")]
    pub path_style: Option<bool>,
    /// Plain-HTTP S3 requests. Default: allowed when the endpoint is
    /// `http://…` (so a local test server works without it), refused
    /// otherwise; `false` refuses them even then.
    #[arg(long = "s3-allow-http")]
    pub allow_http: Option<bool>,
    /// Access key id (else `AWS_ACCESS_KEY_ID`).
    #[arg(long = "s3-access-key-id", hide_env_values = true)]
    pub access_key_id: Option<String>,
    /// Secret access key (else `AWS_SECRET_ACCESS_KEY`).
    #[arg(long = "s3-secret-access-key", hide_env_values = true)]
    pub secret_access_key: Option<String>,
    /// Session token (else `AWS_SESSION_TOKEN`).
    #[arg(skip)]
    #[serde(default)]
    pub session_token: Option<String>,
    /// Time limit of one S3 request (headers and body), ms. Default 30000
    /// (object_store's default). A stalled server makes the request fail
    /// after this long, and the request is retried.
    #[arg(long = "s3-request-timeout-ms")]
    #[serde(default)]
    pub request_timeout_ms: Option<u64>,
    /// How often object_store retries one failed S3 request (5xx, 429,
    /// connection errors, timeouts of idempotent requests) with exponential
    /// backoff from 100 ms before the error reaches the tier service's own
    /// retry (`[retry]`). Default 10.
    #[arg(long = "s3-max-retries")]
    #[serde(default)]
    pub max_retries: Option<usize>,
    /// Longest time object_store keeps retrying one request, ms. Default
    /// 180000.
    #[arg(long = "s3-retry-timeout-ms")]
    #[serde(default)]
    pub retry_timeout_ms: Option<u64>,
    /// Take credentials from the cloud instance's metadata endpoint (EC2
    /// IMDS at `169.254.169.254`, or the container credentials endpoint)
    /// when none are configured. Default false: an S3 bucket without an
    /// access key id and secret (here or in `AWS_ACCESS_KEY_ID` /
    /// `AWS_SECRET_ACCESS_KEY`) and without `AWS_SKIP_SIGNATURE` then
    /// refuses to open, naming these settings, and nothing contacts that
    /// endpoint.
    #[arg(long = "s3-instance-credentials")]
    #[serde(default)]
    pub instance_credentials: Option<bool>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |secret: &Option<String>| secret.as_ref().map(|_| "<redacted>");
        f.debug_struct("StoreConfig")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &redact(&self.secret_access_key))
            .field("session_token", &redact(&self.session_token))
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("max_retries", &self.max_retries)
            .field("retry_timeout_ms", &self.retry_timeout_ms)
            .field("instance_credentials", &self.instance_credentials)
            .finish()
    }
}

impl StoreConfig {
    /// The directory of a local bucket (`url` a path or `file://` URL),
    /// without creating it; `None` for `s3://` and other URLs, or no `url`.
    pub fn local_dir(&self) -> Option<PathBuf> {
        let url = self.url.as_deref()?;
        match url.strip_prefix("file://") {
            Some(path) => Some(PathBuf::from(path)),
            None if url.contains("://") => None,
            None => Some(PathBuf::from(url)),
        }
    }

    /// Fills unset fields from `other`.
    pub fn or(self, other: StoreConfig) -> StoreConfig {
        StoreConfig {
            url: self.url.or(other.url),
            endpoint: self.endpoint.or(other.endpoint),
            region: self.region.or(other.region),
            path_style: self.path_style.or(other.path_style),
            allow_http: self.allow_http.or(other.allow_http),
            access_key_id: self.access_key_id.or(other.access_key_id),
            secret_access_key: self.secret_access_key.or(other.secret_access_key),
            session_token: self.session_token.or(other.session_token),
            request_timeout_ms: self.request_timeout_ms.or(other.request_timeout_ms),
            max_retries: self.max_retries.or(other.max_retries),
            retry_timeout_ms: self.retry_timeout_ms.or(other.retry_timeout_ms),
            instance_credentials: self.instance_credentials.or(other.instance_credentials),
        }
    }
}

/// Request counters of a [`Bucket`].
#[derive(Debug, Default)]
pub struct Requests {
    gets: AtomicU64,
    puts: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    deletes: AtomicU64,
}

/// A snapshot of [`Requests`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// GET requests (whole or ranged).
    pub gets: u64,
    /// PUT requests and multipart uploads.
    pub puts: u64,
    /// HEAD requests.
    pub heads: u64,
    /// LIST requests.
    pub lists: u64,
    /// DELETE requests.
    pub deletes: u64,
}

/// An opened archive bucket.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Root directory for a local store (for the staging-file sweep).
    local_root: Option<PathBuf>,
    description: String,
    requests: Arc<Requests>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("at", &self.description)
            .finish_non_exhaustive()
    }
}

impl Bucket {
    /// [`open`](Self::open) for reading only: a local directory must exist
    /// already (reading a mistyped path reports it instead of creating an
    /// empty bucket there).
    ///
    /// # Errors
    /// [`BucketError::Config`] naming a missing local directory; those of
    /// [`open`](Self::open).
    pub fn open_existing(config: &StoreConfig) -> Result<Bucket, BucketError> {
        if let Some(path) = config.local_dir()
            && !path.is_dir()
        {
            let why = if path.exists() {
                "not a directory: a local bucket is a directory"
            } else {
                "no such bucket directory"
            };
            return Err(BucketError::Config(format!("{}: {why}", path.display())));
        }
        Bucket::open(config)
    }

    /// Opens the bucket described by `config`; a local directory is created
    /// if missing.
    ///
    /// # Errors
    /// [`BucketError::Config`] for a missing or unsupported URL, store errors.
    pub fn open(config: &StoreConfig) -> Result<Bucket, BucketError> {
        install_crypto_provider();
        let url = config
            .url
            .as_deref()
            .ok_or_else(|| BucketError::Config("no bucket given (store.url / --bucket)".into()))?;
        if let Some(rest) = url.strip_prefix("s3://") {
            let bucket = rest.trim_end_matches('/');
            if bucket.is_empty() || bucket.contains('/') {
                return Err(BucketError::Config(format!(
                    "{url:?}: expected s3://bucket (the storage prefix is configured separately)"
                )));
            }
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            if let Some(endpoint) = &config.endpoint {
                builder = builder.with_endpoint(endpoint);
                if endpoint.starts_with("http://") && config.allow_http.is_none() {
                    builder = builder.with_allow_http(true);
                }
            }
            if let Some(region) = &config.region {
                builder = builder.with_region(region);
            }
            if let Some(path_style) = config.path_style {
                builder = builder.with_virtual_hosted_style_request(!path_style);
            }
            if let Some(allow) = config.allow_http {
                builder = builder.with_allow_http(allow);
            }
            if let Some(key) = &config.access_key_id {
                builder = builder.with_access_key_id(key);
            }
            if let Some(secret) = &config.secret_access_key {
                builder = builder.with_secret_access_key(secret);
            }
            if let Some(token) = &config.session_token {
                builder = builder.with_token(token);
            }
            if let Some(ms) = config.request_timeout_ms {
                builder = builder.with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                    format!("{ms}ms"),
                );
            }
            if config.max_retries.is_some() || config.retry_timeout_ms.is_some() {
                let defaults = RetryConfig::default();
                builder = builder.with_retry(RetryConfig {
                    backoff: BackoffConfig::default(),
                    max_retries: config.max_retries.unwrap_or(defaults.max_retries),
                    retry_timeout: config
                        .retry_timeout_ms
                        .map_or(defaults.retry_timeout, Duration::from_millis),
                });
            }
            let configured = |key: AmazonS3ConfigKey| {
                builder
                    .get_config_value(&key)
                    .is_some_and(|v| !v.is_empty())
            };
            let has_keys = configured(AmazonS3ConfigKey::AccessKeyId)
                && configured(AmazonS3ConfigKey::SecretAccessKey);
            let unsigned = builder
                .get_config_value(&AmazonS3ConfigKey::SkipSignature)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            if !has_keys && !unsigned && config.instance_credentials != Some(true) {
                return Err(BucketError::Config(format!(
                    "S3 bucket {bucket}: no credentials: set access_key_id and \
                     secret_access_key (--s3-access-key-id, --s3-secret-access-key, or \
                     AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or instance_credentials = \
                     true (--s3-instance-credentials true) to ask the cloud instance's \
                     metadata endpoint"
                )));
            }
            let store = builder
                .build()
                .map_err(|e| BucketError::Config(format!("S3 bucket {bucket}: {e}")))?;
            return Ok(Bucket::from_store(Arc::new(store), None, url.to_owned()));
        }
        let path = PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
        if url.contains("://") && !url.starts_with("file://") {
            return Err(BucketError::Config(format!(
                "{url:?}: unsupported bucket URL (use a directory path, file:// or s3://)"
            )));
        }
        Bucket::local(path)
    }

    /// A bucket in the local directory `root` (created if missing), with
    /// fsync on every write.
    ///
    /// # Errors
    /// I/O errors creating the directory.
    pub fn local(root: PathBuf) -> Result<Bucket, BucketError> {
        std::fs::create_dir_all(&root).map_err(BucketError::io("create", &root))?;
        let root = root
            .canonicalize()
            .map_err(BucketError::io("canonicalize", &root))?;
        let store = LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| BucketError::Config(format!("{}: {e}", root.display())))?
            .with_fsync(true)
            .with_automatic_cleanup(true);
        let description = root.display().to_string();
        Ok(Bucket::from_store(Arc::new(store), Some(root), description))
    }

    /// Any object store (tests wrap stores to inject faults).
    pub fn from_store(
        store: Arc<dyn ObjectStore>,
        local_root: Option<PathBuf>,
        description: String,
    ) -> Bucket {
        Bucket {
            store,
            local_root,
            description,
            requests: Arc::default(),
        }
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Root directory of a local bucket.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    /// Where the bucket is, for messages.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Requests made so far through this handle (and its clones).
    pub fn requests(&self) -> RequestCounts {
        let r = &self.requests;
        RequestCounts {
            gets: r.gets.load(Ordering::Relaxed),
            puts: r.puts.load(Ordering::Relaxed),
            heads: r.heads.load(Ordering::Relaxed),
            lists: r.lists.load(Ordering::Relaxed),
            deletes: r.deletes.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn path(key: &str) -> Result<ObjectPath, BucketError> {
        ObjectPath::parse(key).map_err(|e| BucketError::Config(format!("object key {key:?}: {e}")))
    }

    /// Size of the object at `key`, `None` if absent.
    ///
    /// # Errors
    /// Store errors other than not-found.
    pub async fn head(&self, key: &str) -> Result<Option<u64>, BucketError> {
        self.requests.heads.fetch_add(1, Ordering::Relaxed);
        match self.store.head(&Bucket::path(key)?).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(BucketError::store("head", key)(e)),
        }
    }

    /// The last `len` bytes of the object (all of it if shorter) and the
    /// object's size: one ranged GET.
    ///
    /// # Errors
    /// Store errors (not-found included).
    pub async fn get_suffix(&self, key: &str, len: u64) -> Result<(Bytes, u64), BucketError> {
        self.requests.gets.fetch_add(1, Ordering::Relaxed);
        let options = GetOptions::new().with_range(Some(GetRange::Suffix(len)));
        let result = self
            .store
            .get_opts(&Bucket::path(key)?, options)
            .await
            .map_err(BucketError::store("get", key))?;
        let size = result.meta.size;
        let bytes = result
            .bytes()
            .await
            .map_err(BucketError::store("get", key))?;
        Ok((bytes, size))
    }

    /// A byte range of the object, streamed: one ranged GET.
    ///
    /// # Errors
    /// Store errors; the stream yields later ones.
    pub async fn get_range_stream(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> Result<BoxStream<'static, Result<Bytes, BucketError>>, BucketError> {
        self.requests.gets.fetch_add(1, Ordering::Relaxed);
        let options = GetOptions::new().with_range(Some(GetRange::Bounded(range)));
        let result = self
            .store
            .get_opts(&Bucket::path(key)?, options)
            .await
            .map_err(BucketError::store("get", key))?;
        let key = key.to_owned();
        Ok(result
            .into_stream()
            .map_err(move |e| BucketError::store("get", key.clone())(e))
            .boxed())
    }

    /// Stores `payload` at `key` in one PUT, replacing or (with `create`)
    /// only creating it.
    ///
    /// # Errors
    /// Store errors; `AlreadyExists` with `create` when the key exists.
    pub async fn put(
        &self,
        key: &str,
        payload: PutPayload,
        create: bool,
    ) -> Result<(), BucketError> {
        self.requests.puts.fetch_add(1, Ordering::Relaxed);
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        self.store
            .put_opts(&Bucket::path(key)?, payload, options)
            .await
            .map_err(BucketError::store("put", key))?;
        Ok(())
    }

    /// Starts a multipart upload at `key`.
    ///
    /// # Errors
    /// Store errors.
    pub async fn put_multipart(
        &self,
        key: &str,
    ) -> Result<Box<dyn object_store::MultipartUpload>, BucketError> {
        self.requests.puts.fetch_add(1, Ordering::Relaxed);
        self.store
            .put_multipart(&Bucket::path(key)?)
            .await
            .map_err(BucketError::store("put multipart", key))
    }

    /// Deletes the object at `key` (absent is fine).
    ///
    /// # Errors
    /// Store errors.
    pub async fn delete(&self, key: &str) -> Result<(), BucketError> {
        self.requests.deletes.fetch_add(1, Ordering::Relaxed);
        match self.store.delete(&Bucket::path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(BucketError::store("delete", key)(e)),
        }
    }

    /// Every object under `prefix` (recursive).
    ///
    /// # Errors
    /// Store errors.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BucketError> {
        self.requests.lists.fetch_add(1, Ordering::Relaxed);
        let path = Bucket::path(prefix.trim_end_matches('/'))?;
        let mut out: Vec<ObjectMeta> = self
            .store
            .list(Some(&path))
            .try_collect()
            .await
            .map_err(BucketError::store("list", prefix))?;
        out.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
        Ok(out)
    }

    /// The "directories" directly under `prefix`, as their last part.
    ///
    /// # Errors
    /// Store errors.
    pub async fn list_dirs(&self, prefix: &str) -> Result<Vec<String>, BucketError> {
        self.requests.lists.fetch_add(1, Ordering::Relaxed);
        let path = Bucket::path(prefix.trim_end_matches('/'))?;
        let result = match self.store.list_with_delimiter(Some(&path)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(BucketError::store("list", prefix)(e)),
        };
        let mut out: Vec<String> = result
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect();
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_secret_key_or_session_token() {
        let config = StoreConfig {
            url: Some("s3://archive".into()),
            access_key_id: Some("AKIDEXAMPLE".into()),
            secret_access_key: Some("wJalrXUtnFEMI-secret".into()),
            session_token: Some("session-secret".into()),
            ..StoreConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(shown.contains("AKIDEXAMPLE"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        assert!(!shown.contains("wJalrXUtnFEMI-secret"), "{shown}");
        assert!(!shown.contains("session-secret"), "{shown}");
    }
}
