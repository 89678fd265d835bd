//! Tributary's edge agent as a library: the on-device side of the system.
//! Local producers publish over HTTP ([`api`]); each durable topic keeps a
//! segmented WAL under a disk budget ([`topic`], [`budget`]), realtime
//! topics an in-memory ring ([`ring`]); topic settings and the broker's
//! acknowledged checkpoints live in an embedded metadata store
//! ([`manager`]). The replicator (separate) reads the WALs and reports
//! acknowledgements back through [`TopicManager::on_acknowledged`].
//!
//! Layers, bottom up: [`budget`], [`ring`], [`ndjson`], [`health`] and [`metrics`] are
//! pure; [`topic`] owns one WAL or ring; [`manager`] owns the topics and
//! the metadata; [`api`] and [`agent`] are the shell. The user guide is
//! `docs/edge-agent.md`.
//!
//! ```no_run
//! # async fn demo(config: tributary_edge::AgentConfig) -> Result<(), Box<dyn std::error::Error>> {
//! use tributary_edge::Agent;
//!
//! let agent = Agent::start(config).await?;
//! for topic in agent.topics().topics() {
//!     if let Some(wal) = topic.wal() {
//!         let batches = wal.read(topic.acknowledged_offset(), 1 << 20)?;
//!         // ... send them, then, once the broker acknowledged up to `next`:
//!         if let Some(last) = batches.last() {
//!             agent.topics().on_acknowledged(topic.name(), last.next_offset()).await?;
//!         }
//!     }
//! }
//! agent.shutdown().await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod api;
pub mod api_access;
pub mod budget;
pub mod cert_reload;
pub mod check;
pub mod client;
pub mod config;
pub mod declared_rate;
pub mod enroll;
pub mod health;
pub mod idempotency;
pub mod manager;
pub mod metrics;
pub mod mqtt;
pub mod ndjson;
pub mod pending;
pub mod recovery;
pub mod refusals;
pub mod replicator;
pub mod ring;
pub mod sequence;
pub mod topic;

pub use agent::{Agent, AgentError};
pub use budget::FullPolicy;
pub use config::{AgentConfig, ConfigError, Overrides, TopicConfig};
pub use manager::{AgentStats, TopicError, TopicManager};
pub use ring::RealtimeRing;
pub use topic::{AckRelease, PublishAck, PublishError, Topic, TopicStats};
