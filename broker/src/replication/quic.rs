//! QUIC server endpoints whose stateless reset key survives a restart.
//!
//! When a broker dies without closing its connections (SIGKILL, power cut)
//! and comes back on the same address, its peers still hold connections the
//! new process knows nothing about. RFC 9000 §10.3: an endpoint that gets a
//! packet for an unknown connection answers with a *stateless reset*, which
//! the peer accepts only if it carries the reset token the old process
//! handed out for that connection ID. Quinn derives the tokens from the
//! endpoint's reset key, and the new process only answers packets whose
//! connection ID its connection-ID generator recognises as one it issued
//! (quinn signs IDs with a per-generator key). With quinn's defaults both
//! keys are random per process, so a restarted broker silently drops the
//! edges' packets and every edge waits for its idle timeout (30 s) before
//! reconnecting. Keeping one secret in the data directory, and deriving
//! both keys from it, lets a restarted broker reset those connections at
//! once, so edges reconnect as soon as it is back.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use broker_core::wal::storage::{FsStorage, read_file, write_file_atomic};

/// Name of the key file inside an endpoint's state directory.
pub const RESET_KEY_FILE: &str = "quic-reset-key";
/// Bytes of the key (an HMAC-SHA256 key).
pub const RESET_KEY_BYTES: usize = 32;

/// Why an endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum QuicEndpointError {
    /// The key file could not be read, created or made durable.
    #[error("stateless reset key {path}: {source}")]
    KeyIo {
        /// The key file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The key file exists but does not hold exactly [`RESET_KEY_BYTES`]
    /// bytes (damaged or written by something else). Delete it to have a new
    /// one generated: peers then wait for their idle timeout once.
    #[error(
        "stateless reset key {path} holds {len} bytes, expected {RESET_KEY_BYTES}; delete it to generate a new one"
    )]
    KeyLength {
        /// The key file.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The system random number generator failed.
    #[error("no randomness for a new stateless reset key")]
    Random,
    /// The endpoint's receive thread could not be started.
    #[error("QUIC receive thread: {0}")]
    Thread(std::io::Error),
    /// The UDP socket could not be bound.
    #[error("QUIC endpoint on {addr}: {source}")]
    Bind {
        /// Listen address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The stateless reset key: an HMAC-SHA256 key made of the secret kept at
/// `dir/`[`RESET_KEY_FILE`], read if present, else generated (32 random
/// bytes) and written atomically (temporary file, `fdatasync`, rename,
/// directory fsync) before it is used, so a key that tokens were derived
/// from is always the one found after a crash.
///
/// # Errors
/// [`QuicEndpointError::KeyIo`], [`QuicEndpointError::KeyLength`],
/// [`QuicEndpointError::Random`].
fn reset_key(dir: &Path) -> Result<ring::hmac::Key, QuicEndpointError> {
    load_or_create_secret(dir).map(|secret| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret))
}

/// The key of the connection-ID generator, derived from the same secret as
/// [`reset_key`]: HMAC-SHA256(secret, "tributary cid key"), first 8 bytes,
/// little-endian.
fn cid_key(reset_key: &ring::hmac::Key) -> u64 {
    let tag = ring::hmac::sign(reset_key, b"tributary cid key");
    let mut first = [0u8; 8];
    first.copy_from_slice(&tag.as_ref()[..8]);
    u64::from_le_bytes(first)
}

fn load_or_create_secret(dir: &Path) -> Result<Vec<u8>, QuicEndpointError> {
    let path = dir.join(RESET_KEY_FILE);
    let io = |source| QuicEndpointError::KeyIo {
        path: path.clone(),
        source,
    };
    let bytes = match read_file(&FsStorage, &path, RESET_KEY_BYTES as u64 * 4) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut fresh = [0u8; RESET_KEY_BYTES];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut fresh)
                .map_err(|_| QuicEndpointError::Random)?;
            std::fs::create_dir_all(dir).map_err(io)?;
            write_file_atomic(&FsStorage, &path, &fresh).map_err(io)?;
            fresh.to_vec()
        }
        Err(e) => return Err(io(e)),
    };
    if bytes.len() != RESET_KEY_BYTES {
        return Err(QuicEndpointError::KeyLength {
            len: bytes.len(),
            path,
        });
    }
    Ok(bytes)
}

/// A QUIC server endpoint on `addr` serving `server`, with its stateless
/// reset key and connection-ID key derived from the secret kept in
/// `state_dir` (created on first use: [`RESET_KEY_FILE`], 32 random bytes).
///
/// # Errors
/// The key's errors, or [`QuicEndpointError::Bind`].
pub fn server_endpoint(
    server: quinn::ServerConfig,
    addr: SocketAddr,
    state_dir: &Path,
) -> Result<quinn::Endpoint, QuicEndpointError> {
    server_endpoint_with(server, addr, state_dir, broker_core::tls::UDP_BUFFER_BYTES)
}

/// [`server_endpoint`] whose socket asks the kernel for `buffer_bytes` of
/// send and receive buffer.
fn server_endpoint_with(
    server: quinn::ServerConfig,
    addr: SocketAddr,
    state_dir: &Path,
    buffer_bytes: usize,
) -> Result<quinn::Endpoint, QuicEndpointError> {
    let key = reset_key(state_dir)?;
    let cid_key = cid_key(&key);
    let mut config = quinn::EndpointConfig::new(Arc::new(key));
    config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    let bind = |source| QuicEndpointError::Bind { addr, source };
    let socket = broker_core::tls::bind_udp_with(addr, buffer_bytes).map_err(bind)?;
    quinn::Endpoint::new(config, Some(server), socket, Arc::new(quinn::TokioRuntime)).map_err(bind)
}

/// Name of the thread that reads a [`ReceiveThread`] endpoint's socket.
pub const RECEIVE_THREAD_NAME: &str = "quic-recv";

/// A thread of its own for a busy server endpoint's socket.
///
/// Quinn reads an endpoint's UDP socket in one task (its endpoint driver),
/// which reads for about 50 µs and then yields to the runtime's other
/// tasks. With a thousand edges the ingest runtime has thousands of
/// runnable tasks (a connection driver and a stream task per edge), the
/// driver gets a turn every few milliseconds, and the kernel's socket
/// buffer overflows in between: at 1,000 edges 4 % of the datagrams were
/// dropped by the kernel (`RcvbufErrors`), every edge's congestion window
/// halved and the broker sat partly idle. On this thread the driver only
/// reads datagrams and hands each to its connection (decryption, streams
/// and acknowledgements stay on the main runtime, in the connection's own
/// task), so it is woken as soon as datagrams arrive. The broker then
/// holds what the kernel used to drop (1,000 edges sending a 1 MB backlog
/// each peaked at 585 MiB RSS), bounded by QUIC flow control: for the
/// ingest endpoint, the receive budget shared by all edge connections
/// ([`super::receive_budget`]).
#[derive(Debug)]
pub struct ReceiveThread(Option<tokio::runtime::Runtime>);

impl ReceiveThread {
    /// Starts the thread ([`RECEIVE_THREAD_NAME`]).
    ///
    /// # Errors
    /// [`QuicEndpointError::Thread`] with the OS error.
    pub fn start() -> Result<ReceiveThread, QuicEndpointError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(RECEIVE_THREAD_NAME)
            .enable_all()
            .build()
            .map(|rt| ReceiveThread(Some(rt)))
            .map_err(QuicEndpointError::Thread)
    }

    /// [`server_endpoint`] whose socket is registered with, and read on,
    /// this thread, with the ingest socket's larger kernel buffers
    /// ([`broker_core::tls::INGEST_UDP_BUFFER_BYTES`]); the endpoint's
    /// connections run on the caller's runtime.
    ///
    /// # Errors
    /// As [`server_endpoint`].
    pub fn server_endpoint(
        &self,
        server: quinn::ServerConfig,
        addr: SocketAddr,
        state_dir: &Path,
    ) -> Result<quinn::Endpoint, QuicEndpointError> {
        let _inside = self.0.as_ref().map(tokio::runtime::Runtime::enter);
        server_endpoint_with(
            server,
            addr,
            state_dir,
            broker_core::tls::INGEST_UDP_BUFFER_BYTES,
        )
    }
}

impl Drop for ReceiveThread {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is not allowed inside another
        // runtime; the thread has nothing left to finish.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(key: &ring::hmac::Key) -> Vec<u8> {
        ring::hmac::sign(key, b"connection id").as_ref().to_vec()
    }

    #[test]
    fn key_is_created_once_and_read_back_after_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = reset_key(dir.path()).expect("create");
        let stored = std::fs::read(dir.path().join(RESET_KEY_FILE)).expect("file");
        assert_eq!(stored.len(), RESET_KEY_BYTES);
        let again = reset_key(dir.path()).expect("read");
        assert_eq!(sign(&first), sign(&again), "same key after a restart");
        assert_eq!(
            cid_key(&first),
            cid_key(&again),
            "same CID key after a restart"
        );
        let other = tempfile::tempdir().expect("tempdir");
        let fresh = reset_key(other.path()).expect("create");
        assert_ne!(sign(&first), sign(&fresh), "keys are random per broker");
    }

    #[test]
    fn damaged_key_file_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(RESET_KEY_FILE);
        for damaged in [&b""[..], &[7u8; 31][..], &[7u8; 33][..]] {
            std::fs::write(&path, damaged).expect("write");
            match reset_key(dir.path()) {
                Err(QuicEndpointError::KeyLength { len, .. }) => assert_eq!(len, damaged.len()),
                other => panic!("expected KeyLength, got {other:?}"),
            }
            assert_eq!(
                std::fs::read(&path).expect("file"),
                damaged,
                "not overwritten"
            );
        }
    }

    /// An endpoint whose socket is read on the receive thread (which
    /// exists while it runs) carries a stream byte for byte, and dropping
    /// the thread inside a runtime does not panic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_endpoint_read_on_its_own_thread_carries_a_stream_and_stops_cleanly() {
        use broker_core::dev_certs::{broker_paths, edge_paths, issue};
        use broker_core::tls::{ALPN_REPLICATION, BROKER_SERVER_NAME, TlsIdentity};
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        issue(&certs, &[1], &["e1".to_string()]).expect("certs");
        let server = TlsIdentity::load(&broker_paths(&certs, 1))
            .and_then(|id| id.quic_server(ALPN_REPLICATION))
            .expect("server config");
        let client = TlsIdentity::load(&edge_paths(&certs, "e1"))
            .and_then(|id| id.quic_client(ALPN_REPLICATION))
            .expect("client config");
        let thread = ReceiveThread::start().expect("thread");
        let endpoint = thread
            .server_endpoint(server, "127.0.0.1:0".parse().expect("addr"), dir.path())
            .expect("endpoint");
        // Work given to it runs on a thread of that name (checked on the
        // thread itself: counting the process's threads raced with other
        // tests of the same process starting theirs).
        let name = thread
            .0
            .as_ref()
            .expect("runtime")
            .spawn(async { std::thread::current().name().map(str::to_owned) })
            .await
            .expect("task on the receive thread");
        assert_eq!(name.as_deref(), Some(RECEIVE_THREAD_NAME));
        let addr = endpoint.local_addr().expect("addr");
        let payload: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let serve = tokio::spawn(async move {
            let conn = endpoint
                .accept()
                .await
                .expect("incoming")
                .await
                .expect("conn");
            let (mut send, mut recv) = conn.accept_bi().await.expect("stream");
            let got = recv.read_to_end(8 * 1024 * 1024).await.expect("read");
            send.write_all(&(got.len() as u64).to_le_bytes())
                .await
                .expect("answer");
            send.finish().expect("finish");
            let _ = send.stopped().await;
            (got, endpoint)
        });
        let client_endpoint =
            broker_core::tls::client_endpoint("127.0.0.1:0".parse().expect("addr"))
                .expect("client");
        let conn = client_endpoint
            .connect_with(client, addr, BROKER_SERVER_NAME)
            .expect("connect")
            .await
            .expect("handshake");
        let (mut send, mut recv) = conn.open_bi().await.expect("open");
        send.write_all(&payload).await.expect("send");
        send.finish().expect("finish");
        let answer = recv.read_to_end(8).await.expect("answer");
        assert_eq!(answer, (payload.len() as u64).to_le_bytes());
        let (got, endpoint) = serve.await.expect("server task");
        assert!(got == payload, "the server read the stream byte for byte");
        endpoint.close(0u32.into(), b"done");
        drop(endpoint);
        drop(thread);
    }
}
