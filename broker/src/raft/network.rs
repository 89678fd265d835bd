//! Raft traffic between brokers over QUIC with mutual TLS.
//!
//! One QUIC connection per peer (reconnected on failure), one bidirectional
//! stream per RPC: the request is a JSON [`PeerRequest`] written whole, then
//! the stream is finished; the response is a JSON [`PeerResponse`] read to the
//! end. Both directions are bounded by [`MAX_FRAME_BYTES`]. Only peers whose
//! certificate chains to the cluster CA *and* names a broker identity
//! (`broker-{id}`) *and* carries the brokers' server name
//! (`tributary-broker`, which every broker certificate has and a signed
//! edge certificate never has) are served: an edge certificate from the
//! same CA cannot speak Raft (no edge id may start with `broker-`:
//! [`tributary_proto::keys::reserved_edge_id`] refuses one when a token is
//! minted, when a certificate is signed and at ingest).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use broker_core::tls::{
    ALPN_RAFT, BROKER_SERVER_NAME, TlsIdentity, certificate_has_dns_name, peer_certificate,
    peer_identity,
};
use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, ClientWriteResponse, InstallSnapshotRequest,
    InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, LogId};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::{debug, warn};

use super::{MetaCommand, NodeId, Raft, TypeConfig};

/// Largest request or response on a Raft stream, bytes.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// A request from one broker to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    /// Raft log replication / heartbeat.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// Raft election.
    Vote(VoteRequest<NodeId>),
    /// Raft snapshot transfer (one chunk).
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A client write forwarded by a follower to the leader.
    ClientWrite(MetaCommand),
    /// A follower asks the leader for a linearizable read point.
    ReadIndex,
}

/// The answer to a [`PeerRequest`], variant by variant.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    /// For `AppendEntries`.
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// For `Vote`.
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// For `InstallSnapshot`.
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// For `ClientWrite`.
    ClientWrite(
        Result<
            ClientWriteResponse<TypeConfig>,
            RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
        >,
    ),
    /// For `ReadIndex`: the log id the reader must have applied, or why not.
    ReadIndex(Result<Option<LogId<NodeId>>, String>),
    /// The request could not be decoded or the peer is not a broker.
    Refused(String),
}

/// Errors of one peer RPC at the transport level.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Could not connect.
    #[error("connect to {addr}: {reason}")]
    Connect {
        /// Peer address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The stream failed mid-RPC.
    #[error("rpc to {addr}: {reason}")]
    Stream {
        /// Peer address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The peer refused the request.
    #[error("peer {addr} refused: {reason}")]
    Refused {
        /// Peer address.
        addr: String,
        /// Its reason.
        reason: String,
    },
}

/// A connection to one peer, created on demand and replaced after failures.
#[derive(Clone)]
pub struct PeerClient {
    endpoint: quinn::Endpoint,
    addr: String,
    connection: Arc<Mutex<Option<quinn::Connection>>>,
}

impl PeerClient {
    /// A client for the peer at `addr` (`host:port`) using `endpoint`.
    pub fn new(endpoint: quinn::Endpoint, addr: String) -> PeerClient {
        PeerClient {
            endpoint,
            addr,
            connection: Arc::new(Mutex::new(None)),
        }
    }

    async fn connection(&self) -> Result<quinn::Connection, PeerError> {
        let mut guard = self.connection.lock().await;
        if let Some(conn) = guard.as_ref()
            && conn.close_reason().is_none()
        {
            return Ok(conn.clone());
        }
        let connect_err = |reason: String| PeerError::Connect {
            addr: self.addr.clone(),
            reason,
        };
        let socket: SocketAddr = tokio::net::lookup_host(&self.addr)
            .await
            .map_err(|e| connect_err(e.to_string()))?
            .next()
            .ok_or_else(|| connect_err("no address".into()))?;
        let conn = self
            .endpoint
            .connect(socket, BROKER_SERVER_NAME)
            .map_err(|e| connect_err(e.to_string()))?
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Sends one request and waits for its response, within `timeout`.
    ///
    /// # Errors
    /// [`PeerError`] on connection, stream, timeout or refusal.
    pub async fn call(
        &self,
        request: &PeerRequest,
        timeout: Duration,
    ) -> Result<PeerResponse, PeerError> {
        let stream_err = |reason: String| PeerError::Stream {
            addr: self.addr.clone(),
            reason,
        };
        let bytes = serde_json::to_vec(request).map_err(|e| stream_err(e.to_string()))?;
        let attempt = async {
            let conn = self.connection().await?;
            let (mut send, mut recv) = conn
                .open_bi()
                .await
                .map_err(|e| stream_err(e.to_string()))?;
            send.write_all(&bytes)
                .await
                .map_err(|e| stream_err(e.to_string()))?;
            send.finish().map_err(|e| stream_err(e.to_string()))?;
            let response = recv
                .read_to_end(MAX_FRAME_BYTES)
                .await
                .map_err(|e| stream_err(e.to_string()))?;
            serde_json::from_slice::<PeerResponse>(&response).map_err(|e| stream_err(e.to_string()))
        };
        let result = match tokio::time::timeout(timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(stream_err(format!("timed out after {timeout:?}"))),
        };
        match result {
            Ok(PeerResponse::Refused(reason)) => Err(PeerError::Refused {
                addr: self.addr.clone(),
                reason,
            }),
            Ok(response) => Ok(response),
            Err(e) => {
                // Drop the connection so the next call reconnects.
                *self.connection.lock().await = None;
                Err(e)
            }
        }
    }
}

/// openraft's network factory: one [`PeerClient`] per target.
#[derive(Clone)]
pub struct Network {
    endpoint: quinn::Endpoint,
}

impl Network {
    /// A factory whose connections use `endpoint` (configured as a client
    /// with this broker's certificate).
    pub fn new(endpoint: quinn::Endpoint) -> Network {
        Network { endpoint }
    }
}

/// The Raft connection to one target node.
pub struct Connection {
    target: NodeId,
    client: PeerClient,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Connection {
        Connection {
            target,
            client: PeerClient::new(self.endpoint.clone(), node.addr.clone()),
        }
    }
}

fn unreachable<E: std::error::Error>(e: &PeerError) -> RPCError<NodeId, BasicNode, E> {
    match e {
        PeerError::Connect { .. } => RPCError::Unreachable(Unreachable::new(e)),
        _ => RPCError::Network(NetworkError::new(e)),
    }
}

fn unexpected<E: std::error::Error>(what: &str) -> RPCError<NodeId, BasicNode, E> {
    let e = PeerError::Stream {
        addr: String::new(),
        reason: format!("unexpected response to {what}"),
    };
    RPCError::Network(NetworkError::new(&e))
}

impl Connection {
    fn remote<E: std::error::Error>(&self, e: E) -> RPCError<NodeId, BasicNode, E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self
            .client
            .call(&PeerRequest::AppendEntries(rpc), option.hard_ttl())
            .await
        {
            Ok(PeerResponse::AppendEntries(Ok(r))) => Ok(r),
            Ok(PeerResponse::AppendEntries(Err(e))) => Err(self.remote(e)),
            Ok(_) => Err(unexpected("append_entries")),
            Err(e) => Err(unreachable(&e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .client
            .call(&PeerRequest::InstallSnapshot(rpc), option.hard_ttl())
            .await
        {
            Ok(PeerResponse::InstallSnapshot(Ok(r))) => Ok(r),
            Ok(PeerResponse::InstallSnapshot(Err(e))) => Err(self.remote(e)),
            Ok(_) => Err(unexpected("install_snapshot")),
            Err(e) => Err(unreachable(&e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self
            .client
            .call(&PeerRequest::Vote(rpc), option.hard_ttl())
            .await
        {
            Ok(PeerResponse::Vote(Ok(r))) => Ok(r),
            Ok(PeerResponse::Vote(Err(e))) => Err(self.remote(e)),
            Ok(_) => Err(unexpected("vote")),
            Err(e) => Err(unreachable(&e)),
        }
    }
}

/// Serves Raft RPCs arriving on `endpoint` until it is closed.
pub async fn serve(endpoint: quinn::Endpoint, raft: Raft) {
    while let Some(incoming) = endpoint.accept().await {
        let raft = raft.clone();
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => {
                    debug!(error = %e, "raft handshake failed");
                    return;
                }
            };
            let identity = peer_identity(&conn);
            // Named `broker-{id}` and carrying the brokers' server name: a
            // client certificate signed for an enrolling edge never carries
            // the latter (one signed for `broker-2` before such edge ids
            // were refused stays locked out).
            let is_broker = identity
                .as_deref()
                .is_some_and(|i| i.starts_with(tributary_proto::keys::BROKER_IDENTITY_PREFIX))
                && peer_certificate(&conn)
                    .is_some_and(|c| certificate_has_dns_name(&c, BROKER_SERVER_NAME));
            if !is_broker {
                warn!(peer = %conn.remote_address(), identity = identity.as_deref(), "refusing raft peer without a broker certificate");
                conn.close(1u32.into(), b"not a broker certificate");
                return;
            }
            while let Ok((send, recv)) = conn.accept_bi().await {
                let raft = raft.clone();
                tokio::spawn(handle_stream(raft, send, recv));
            }
        });
    }
}

async fn handle_stream(raft: Raft, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    let response = match recv.read_to_end(MAX_FRAME_BYTES).await {
        Err(e) => PeerResponse::Refused(format!("read: {e}")),
        Ok(bytes) => match serde_json::from_slice::<PeerRequest>(&bytes) {
            Err(e) => PeerResponse::Refused(format!("malformed request: {e}")),
            Ok(request) => dispatch(&raft, request).await,
        },
    };
    let Ok(bytes) = serde_json::to_vec(&response) else {
        return;
    };
    if send.write_all(&bytes).await.is_ok() {
        let _ = send.finish();
        // Wait until the peer has read the response before dropping.
        let _ = send.stopped().await;
    }
}

async fn dispatch(raft: &Raft, request: PeerRequest) -> PeerResponse {
    match request {
        PeerRequest::AppendEntries(rpc) => {
            PeerResponse::AppendEntries(raft.append_entries(rpc).await)
        }
        PeerRequest::Vote(rpc) => PeerResponse::Vote(raft.vote(rpc).await),
        PeerRequest::InstallSnapshot(rpc) => {
            PeerResponse::InstallSnapshot(raft.install_snapshot(rpc).await)
        }
        PeerRequest::ClientWrite(command) => {
            PeerResponse::ClientWrite(raft.client_write(command).await)
        }
        PeerRequest::ReadIndex => {
            PeerResponse::ReadIndex(raft.ensure_linearizable().await.map_err(|e| e.to_string()))
        }
    }
}

/// Binds a QUIC endpoint for Raft on `addr`: serves peers with this broker's
/// certificate and connects to peers with it. Its stateless reset key is
/// kept in `state_dir` (see [`crate::replication::quic`]), so peers of a restarted node
/// drop their stale connections at once.
///
/// # Errors
/// TLS configuration or socket errors.
pub fn endpoint(
    addr: SocketAddr,
    tls: &TlsIdentity,
    state_dir: &std::path::Path,
) -> Result<quinn::Endpoint, super::node::NodeError> {
    let err = |e: &dyn std::fmt::Display| super::node::NodeError::Endpoint(format!("{addr}: {e}"));
    let server = tls.quic_server(ALPN_RAFT).map_err(|e| err(&e))?;
    let client = tls.quic_client(ALPN_RAFT).map_err(|e| err(&e))?;
    let mut endpoint =
        crate::replication::quic::server_endpoint(server, addr, state_dir).map_err(|e| err(&e))?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}
