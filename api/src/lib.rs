//! Tributary's HTTP APIs as types (`tributary_api`), plus the one blocking
//! client every caller uses.
//!
//! - [`admin`]: shapes of the broker's admin API read by more than one crate
//!   (`docs/admin-api.md`);
//! - [`cluster`]: the topic-ownership endpoints of the admin API (brokers,
//!   moves, rebalancing);
//! - [`fleet`]: `GET /v1/edges`, the edges the cluster knows;
//! - [`consumer`]: the consumer API's requests and responses
//!   (`docs/consumer-api.md`);
//! - [`enroll`]: certificate enrollment and edge revocation;
//! - [`client`] (feature `client`): a blocking JSON client over ureq with
//!   one error type, [`client::ClientError`];
//! - [`consumer_client`] (feature `client`): typed calls of the consumer API
//!   on top of it.
//!
//! No server code lives here: the broker and the edge agent serve these
//! shapes; `broker-core` depends on this crate without the `client` feature
//! for the catalog's result types.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod auth;
#[cfg(feature = "client")]
pub mod client;
pub mod cluster;
pub mod consumer;
#[cfg(feature = "client")]
pub mod consumer_client;
pub mod enroll;
pub mod fleet;
