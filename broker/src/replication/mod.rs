//! Edge-to-broker replication, broker side: the QUIC endpoint
//! ([`quic`], stateless reset key kept across restarts), the ingest driver
//! that runs one `IngestStream` per edge topic stream ([`ingest`]), and the
//! central topic WALs those streams (and central publishes) append to
//! ([`topics`]), the holes edges declare (`holes`), and damaged central
//! ranges found, re-fetched, repaired or skipped ([`damage`]), and the
//! refusal of revoked edges ([`revocation`]); where each batch spends its
//! time in the broker ([`stages`], for `/metrics`).

pub mod damage;
mod holes;
pub mod ingest;
pub mod quic;
pub mod receive_budget;
pub mod revocation;
pub mod stages;
mod stream_checks;
pub mod takeover;
pub mod topics;
