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

/// Most request-body bytes [`drain_body`] reads: 8 MiB.
const DRAIN_MAX_BYTES: usize = 8 << 20;
/// Longest [`drain_body`] waits for them.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads and drops `request`'s body (at most [`DRAIN_MAX_BYTES`] within
/// [`DRAIN_TIME`]) before an answer given without it (a refusal, a
/// redirect): hyper resets an HTTP/2 stream whose request body is left
/// unread, and a client such as curl then reports a framing error instead
/// of the answer (a trial got it for 10 of 10 POSTs of 200 kB with a bad
/// token, and for half the redirects to a topic's owner).
pub(crate) async fn drain_body(request: axum::extract::Request) {
    use futures::StreamExt;
    let mut body = request.into_body().into_data_stream();
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut seen = 0usize;
        while let Some(Ok(chunk)) = body.next().await {
            seen = seen.saturating_add(chunk.len());
            if seen > DRAIN_MAX_BYTES {
                return;
            }
        }
    })
    .await;
}

/// Decodes a JSON request body, naming the offending field on failure.
///
/// # Errors
/// A 400 `invalid_input`: for a body that is not JSON (syntax error or
/// truncated), has anything but whitespace after its value, or has the
/// wrong shape as a whole, `request body: …` without a
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
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
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
    })?;
    // One value and nothing after it but whitespace: `{...} {"x":1}` or
    // `{...}garbage` is not a body this API understood.
    deserializer.end().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            format!("request body: data after the JSON object: {e}"),
        )
    })?;
    Ok(value)
}

/// The parsed query string, or a 400 `invalid_input` (field `query`).
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|rejection| ApiError::invalid("query", rejection.body_text()))
}
