//! A metadata node: starts openraft on the redb storage with the QUIC mTLS
//! network, initializes the cluster, and offers writes (forwarded to the
//! leader from followers) and linearizable reads (read-index through the
//! leader).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use broker_core::tls::TlsIdentity;
use openraft::{BasicNode, ServerState};
use tracing::{info, warn};

use super::log_store::LogStore;
use super::network::{self, Network, PeerClient, PeerRequest, PeerResponse};
use super::state_machine::StateMachine;
use openraft::raft::ClientWriteResponse;

use super::{MetaCommand, MetaResponse, NodeId, Raft, TypeConfig};

/// Bytes of a snapshot sent per `InstallSnapshot` request.
const SNAPSHOT_CHUNK_BYTES: u64 = 1 << 20;

/// How long one `InstallSnapshot` request may take, ms.
const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 10_000;

/// How to run one metadata node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's id (unique in the cluster, > 0).
    pub node_id: NodeId,
    /// Directory for `raft.redb` and snapshots.
    pub data_dir: PathBuf,
    /// QUIC address to listen on for Raft peers.
    pub listen: SocketAddr,
    /// Every member's Raft address by node id, this node included. A single
    /// entry (or none) means a one-node cluster.
    pub members: BTreeMap<NodeId, String>,
    /// Heartbeat interval, ms. Default 250.
    pub heartbeat_ms: u64,
    /// Election timeout range, ms. Default 1000..2000.
    pub election_timeout_ms: (u64, u64),
    /// Build a snapshot after this many applied entries. Default 5000.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot (for slow followers). Default 1000.
    pub logs_kept_after_snapshot: u64,
}

impl NodeConfig {
    /// A single-node configuration with default timings.
    pub fn single(node_id: NodeId, data_dir: PathBuf, listen: SocketAddr) -> NodeConfig {
        let mut members = BTreeMap::new();
        members.insert(node_id, listen.to_string());
        NodeConfig {
            node_id,
            data_dir,
            listen,
            members,
            heartbeat_ms: 250,
            election_timeout_ms: (1000, 2000),
            snapshot_every: 5000,
            logs_kept_after_snapshot: 1000,
        }
    }
}

/// Errors of the metadata node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// Storage could not be opened.
    #[error("raft storage: {0}")]
    Storage(String),
    /// TLS or socket setup failed.
    #[error("raft endpoint: {0}")]
    Endpoint(String),
    /// openraft refused the configuration or failed fatally.
    #[error("raft: {0}")]
    Raft(String),
    /// No leader could be reached in time (election in progress, no quorum).
    #[error("no raft leader available: {0}")]
    NoLeader(String),
}

impl NodeError {
    fn is_retryable(&self) -> bool {
        matches!(self, NodeError::NoLeader(_))
    }
}

/// Status of the cluster as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterStatus {
    /// This node.
    pub node_id: NodeId,
    /// Current leader, if known.
    pub leader: Option<NodeId>,
    /// Current term.
    pub term: u64,
    /// Voters and their addresses.
    pub members: BTreeMap<NodeId, String>,
    /// Index of the last applied log entry.
    pub last_applied_index: Option<u64>,
    /// Index covered by this node's latest snapshot.
    pub snapshot_index: Option<u64>,
    /// Index up to which this node's log has been purged.
    pub purged_index: Option<u64>,
    /// `Leader`, `Follower`, `Candidate` or `Learner`.
    pub state: String,
}

/// A running metadata node.
#[derive(Clone)]
pub struct MetaNode {
    node_id: NodeId,
    raft: Raft,
    state_machine: StateMachine,
    endpoint: quinn::Endpoint,
    peers: Arc<tokio::sync::Mutex<BTreeMap<String, PeerClient>>>,
    /// Upgradable while any task of openraft still holds the log store or
    /// the state machine (and so the redb database).
    raft_storage: std::sync::Weak<()>,
}

/// How long [`MetaNode::shutdown`] waits for openraft's tasks to let go of
/// the database after the core task ended.
const STORAGE_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

fn retry_policy() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_millis(1000))
        .with_max_times(30)
        .with_jitter()
}

impl MetaNode {
    /// Opens storage, binds the Raft endpoint, starts openraft and, if this
    /// node has the lowest id among `members` and the cluster has never been
    /// initialized, initializes it with all members.
    ///
    /// # Errors
    /// [`NodeError`] for storage, endpoint or openraft failures.
    pub async fn start(config: NodeConfig, tls: &TlsIdentity) -> Result<MetaNode, NodeError> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| NodeError::Storage(format!("{}: {e}", config.data_dir.display())))?;
        let db = super::open_database(&config.data_dir.join("raft.redb"))
            .map_err(|e| NodeError::Storage(e.to_string()))?;
        let db = Arc::new(db);
        let log_store = LogStore::new(db.clone());
        let state_machine = StateMachine::new(db, &config.data_dir.join("snapshots"))
            .map_err(|e| NodeError::Storage(e.to_string()))?;
        let endpoint = network::endpoint(config.listen, tls, &config.data_dir)?;
        let raft_config = openraft::Config {
            cluster_name: "tributary".into(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_timeout_ms.0,
            election_timeout_max: config.election_timeout_ms.1,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.logs_kept_after_snapshot,
            // A follower that fell behind the purged log gets the snapshot
            // in chunks of 1 MiB, each allowed 10 s to arrive and (the
            // last) be installed. openraft's defaults, 3 MiB within 200 ms,
            // failed every time for a 1.4 MB snapshot on a loaded machine:
            // the follower never caught up, kept renewing its lease and was
            // given topics it could not serve.
            install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT_MS,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            ..Default::default()
        }
        .validate()
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        let raft_storage = Arc::new(());
        let raft_storage_weak = Arc::downgrade(&raft_storage);
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            Network::new(endpoint.clone()),
            log_store.held_by_raft(raft_storage.clone()),
            state_machine.held_by_raft(raft_storage),
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        tokio::spawn(network::serve(endpoint.clone(), raft.clone()));

        let lowest = config
            .members
            .keys()
            .next()
            .copied()
            .unwrap_or(config.node_id);
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        if initialized && !config.members.is_empty() {
            warn_if_members_differ(&raft, &config.members);
        }
        if !initialized && lowest == config.node_id {
            let members: BTreeMap<NodeId, BasicNode> = if config.members.is_empty() {
                BTreeMap::from([(config.node_id, BasicNode::new(config.listen.to_string()))])
            } else {
                config
                    .members
                    .iter()
                    .map(|(id, addr)| (*id, BasicNode::new(addr.clone())))
                    .collect()
            };
            info!(
                node = config.node_id,
                members = members
                    .iter()
                    .map(|(id, node)| format!("{id}={}", node.addr))
                    .collect::<Vec<_>>()
                    .join(","),
                "initializing the metadata cluster"
            );
            if let Err(e) = raft.initialize(members).await {
                // Another start raced us, or the log already has a membership.
                warn!(error = %e, "raft initialize refused");
            }
        }
        Ok(MetaNode {
            node_id: config.node_id,
            raft,
            state_machine,
            endpoint,
            peers: Arc::default(),
            raft_storage: raft_storage_weak,
        })
    }

    /// The openraft handle (metrics, membership changes).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    async fn peer(&self, addr: &str) -> PeerClient {
        let mut peers = self.peers.lock().await;
        peers
            .entry(addr.to_string())
            .or_insert_with(|| PeerClient::new(self.endpoint.clone(), addr.to_string()))
            .clone()
    }

    async fn leader_addr(&self) -> Result<Option<String>, NodeError> {
        let metrics = self.raft.metrics().borrow().clone();
        let Some(leader) = metrics.current_leader else {
            return Err(NodeError::NoLeader("election in progress".into()));
        };
        if leader == self.node_id {
            return Ok(None);
        }
        let addr = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())
            .ok_or_else(|| NodeError::NoLeader(format!("leader {leader} has no address")))?;
        Ok(Some(addr))
    }

    async fn write_once(
        &self,
        command: &MetaCommand,
    ) -> Result<ClientWriteResponse<TypeConfig>, NodeError> {
        match self.leader_addr().await? {
            None => match self.raft.client_write(command.clone()).await {
                Ok(response) => Ok(response),
                Err(e) if e.forward_to_leader::<BasicNode>().is_some() => {
                    Err(NodeError::NoLeader(e.to_string()))
                }
                Err(e) => Err(NodeError::Raft(e.to_string())),
            },
            Some(addr) => {
                let peer = self.peer(&addr).await;
                let request = PeerRequest::ClientWrite(command.clone());
                match peer.call(&request, Duration::from_secs(10)).await {
                    Ok(PeerResponse::ClientWrite(Ok(response))) => Ok(response),
                    Ok(PeerResponse::ClientWrite(Err(e))) => {
                        if e.forward_to_leader::<BasicNode>().is_some() {
                            Err(NodeError::NoLeader(e.to_string()))
                        } else {
                            Err(NodeError::Raft(e.to_string()))
                        }
                    }
                    Ok(other) => Err(NodeError::Raft(format!("unexpected answer {other:?}"))),
                    Err(e) => Err(NodeError::NoLeader(e.to_string())),
                }
            }
        }
    }

    /// Proposes `command` through the leader and returns its result once it
    /// is committed, applied by the leader and applied on this node too (so
    /// this node's reads and watches already reflect it). Retries with
    /// backoff while there is no leader (up to about 20 s).
    ///
    /// A retried proposal may apply twice if the first attempt committed but
    /// its answer was lost; commands are transactions with preconditions, so
    /// callers that need exactly-once make them conditional.
    ///
    /// # Errors
    /// [`NodeError::NoLeader`] if no leader answered in time,
    /// [`NodeError::Raft`] for fatal errors.
    pub async fn write(&self, command: MetaCommand) -> Result<MetaResponse, NodeError> {
        let response = (|| async { self.write_once(&command).await })
            .retry(retry_policy())
            .when(NodeError::is_retryable)
            .await?;
        self.raft
            .wait(Some(Duration::from_secs(30)))
            .applied_index_at_least(Some(response.log_id.index), "local apply of own write")
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        Ok(response.data)
    }

    async fn read_barrier_once(&self) -> Result<(), NodeError> {
        let index = match self.leader_addr().await? {
            None => self
                .raft
                .ensure_linearizable()
                .await
                .map_err(|e| NodeError::NoLeader(e.to_string()))?,
            Some(addr) => {
                let peer = self.peer(&addr).await;
                match peer
                    .call(&PeerRequest::ReadIndex, Duration::from_secs(5))
                    .await
                {
                    Ok(PeerResponse::ReadIndex(Ok(index))) => index,
                    Ok(PeerResponse::ReadIndex(Err(e))) => return Err(NodeError::NoLeader(e)),
                    Ok(other) => {
                        return Err(NodeError::Raft(format!("unexpected answer {other:?}")));
                    }
                    Err(e) => return Err(NodeError::NoLeader(e.to_string())),
                }
            }
        };
        if let Some(index) = index {
            self.raft
                .wait(Some(Duration::from_secs(10)))
                .applied_index_at_least(Some(index.index), "read barrier")
                .await
                .map_err(|e| NodeError::NoLeader(e.to_string()))?;
        }
        Ok(())
    }

    /// Waits until this node's state machine reflects every write committed
    /// before the call (read-index through the leader), so a following local
    /// read is linearizable.
    ///
    /// # Errors
    /// [`NodeError::NoLeader`] if no leader confirmed in time.
    pub async fn read_barrier(&self) -> Result<(), NodeError> {
        (|| async { self.read_barrier_once().await })
            .retry(retry_policy())
            .when(NodeError::is_retryable)
            .await
    }

    /// The local state machine (read after [`MetaNode::read_barrier`] for
    /// linearizable reads).
    pub fn state_machine(&self) -> &StateMachine {
        &self.state_machine
    }

    /// On the leader: the other members (voters and learners) whose log
    /// has matched nothing of the leader's term, i.e. that have not
    /// answered it since it was elected. Empty on any other node.
    pub fn unanswered_members(&self) -> std::collections::BTreeSet<NodeId> {
        let metrics = self.raft.metrics().borrow().clone();
        let Some(replication) = &metrics.replication else {
            return std::collections::BTreeSet::new();
        };
        replication
            .iter()
            .filter(|(id, matched)| {
                **id != self.node_id
                    && matched.is_none_or(|log| log.leader_id.term < metrics.current_term)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// The cluster as this node sees it now.
    pub fn status(&self) -> ClusterStatus {
        let metrics = self.raft.metrics().borrow().clone();
        let members = members_of(&metrics);
        let state = match metrics.state {
            ServerState::Leader => "Leader",
            ServerState::Follower => "Follower",
            ServerState::Candidate => "Candidate",
            ServerState::Learner => "Learner",
            ServerState::Shutdown => "Shutdown",
        };
        ClusterStatus {
            node_id: self.node_id,
            leader: metrics.current_leader,
            term: metrics.current_term,
            members,
            last_applied_index: metrics.last_applied.map(|l| l.index),
            snapshot_index: metrics.snapshot.map(|l| l.index),
            purged_index: metrics.purged.map(|l| l.index),
            state: state.into(),
        }
    }

    /// Stops openraft and closes the endpoint.
    ///
    /// Returns once openraft's tasks have all dropped their handles on the
    /// storage: `Raft::shutdown` joins only the core task, and its state
    /// machine worker ends a moment later, so without this wait an
    /// in-process restart could find the redb file still locked
    /// (`DatabaseAlreadyOpen`). Handles held by clones of this node remain
    /// theirs to drop.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            warn!(error = %e, "raft shutdown");
        }
        self.endpoint.close(0u32.into(), b"shutdown");
        let deadline = tokio::time::Instant::now() + STORAGE_RELEASE_TIMEOUT;
        while self.raft_storage.strong_count() > 0 {
            if tokio::time::Instant::now() >= deadline {
                warn!(
                    holders = self.raft_storage.strong_count(),
                    "openraft tasks still hold the metadata storage after shutdown"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Logs a warning when `[members]` names other nodes or addresses than the
/// membership the cluster committed: the list is read only when a cluster
/// forms (there is no membership change), so an edit to it on an existing
/// node changes nothing (a config trial found it silently ignored).
fn warn_if_members_differ(raft: &Raft, configured: &BTreeMap<NodeId, String>) {
    let committed = members_of(&raft.metrics().borrow());
    if !committed.is_empty() && &committed != configured {
        let list = |members: &BTreeMap<NodeId, String>| {
            members
                .iter()
                .map(|(id, addr)| format!("{id}={addr}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        warn!(
            configured = %list(configured),
            committed = %list(&committed),
            "[members] differs from the cluster's committed membership and is ignored: it is read only when a cluster forms, and members cannot be added, removed or moved on an existing cluster"
        );
    }
}

/// The voters and their addresses in `metrics`' membership.
fn members_of(metrics: &openraft::RaftMetrics<NodeId, BasicNode>) -> BTreeMap<NodeId, String> {
    metrics
        .membership_config
        .membership()
        .nodes()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect()
}
