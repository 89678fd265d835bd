//! Request parsing and responses shared by every HTTP API of the broker
//! (the admin API, its storage endpoints, the consumer API): the one JSON
//! body parser [`parse_json`], query strings ([`query`]), the JSON error
//! response [`ApiError`] (in `error.rs`), the client certificate identity
//! [`PeerCertificate`] and the HTTPS listener ([`tls`]). Authentication and
//! authorization live in [`crate::auth`].

mod error;
pub(crate) mod owner_route;
mod peer;
pub mod tls;

use axum::body::Bytes;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

pub(crate) use self::error::json_rejections;
pub(crate) use self::error::{ApiError, ApiResult, ok};
pub use self::peer::PeerCertificate;

/// Decodes a JSON request body, naming the offending field on failure.
///
/// # Errors
/// A 400 `invalid_input`: for a body that is not JSON (syntax error or
/// truncated) or has the wrong shape as a whole, `request body: …` without a
/// field; for a field of the wrong type, unknown or missing, `{path}: …`
/// with `field` set to the path (`max_messages`, `descriptor.size`).
pub(crate) fn parse_json<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    // Every body is an object: serde would also read a struct from an array
    // of its fields in order (`[]` was an attach with every default).
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            "request body: a JSON object expected, not an array",
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                format!("request body: {inner}"),
            )
        } else {
            ApiError::invalid(&path, format!("{path}: {inner}"))
        }
    })
}

/// The parsed query string, or a 400 `invalid_input` (field `query`).
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|rejection| ApiError::invalid("query", rejection.body_text()))
}
