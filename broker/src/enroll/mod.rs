//! Certificate enrollment and edge revocation.
//!
//! - An operator mints a one-time, expiring enrollment token bound to an
//!   edge id (`tribctl edges token EDGE_ID`, [`admin_router`]); the broker
//!   stores its SHA-256 at `/auth/enrollments/{edge_id}`.
//! - The device (`edge-agent enroll`) generates its key, and sends only a
//!   CSR with the token to `POST /v1/enroll` ([`enroll_router`]): the
//!   broker signs a client certificate for the token's edge id with the
//!   CA of its `[enroll]` section ([`signer`]) and consumes the token in
//!   the same Raft transaction that makes the certificate count.
//! - `tribctl edges revoke EDGE_ID` writes `/auth/revoked_edges/{edge_id}`;
//!   every broker's auth cache picks it up through its watch of `/auth/`,
//!   and the ingest endpoint refuses, and closes, that edge's connections
//!   made with a certificate issued up to then
//!   ([`crate::replication::revocation`]).
//!
//! Files: `model.rs` (tokens, the token decision, what a revocation
//! covers; pure), `signer.rs` (the `[enroll]` CA), `http.rs` (the admin
//! routes), `endpoint.rs` (`/v1/enroll`).

mod endpoint;
mod http;
pub mod model;
pub mod signer;

pub use self::endpoint::{EnrollService, enroll_router};
pub use self::http::admin_router;
pub use self::signer::{EnrollConfig, Signer, SignerError};
