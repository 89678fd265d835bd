//! Edge → broker replication: the wire frames ([`frame`]) and the two sides
//! of a topic's stream as I/O-free state machines ([`edge`], [`ingest`]).
//! The QUIC drivers live in the edge agent and the broker; the seeded
//! simulation in this module's tests checks the state machines together
//! over lossy, disconnecting links.

pub mod ack_repeat;
pub mod compress;
pub mod datagram;
pub mod edge;
mod error_code;
pub mod frame;
pub mod hole;
pub mod ingest;

#[cfg(test)]
mod cluster_id_tests;
#[cfg(test)]
mod hole_tests;
#[cfg(test)]
mod ownership_tests;
#[cfg(test)]
mod progress_tests;
#[cfg(test)]
mod refetch_tests;
#[cfg(test)]
mod tests;
