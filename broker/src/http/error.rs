//! [`ApiError`]: the JSON error response of every broker HTTP API, `{"error":
//! "<message>", "kind": "<kind>", "field"?: ..., ...}` with its status.
//! Each domain maps its own errors onto it (the catalog's in
//! [`crate::admin`], storage in [`crate::storage`], the consumer's in
//! [`crate::consumer`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use broker_core::catalog::CatalogError;
use serde_json::{Value, json};
use tributary_proto::keys::NameError;

/// An error response: status and JSON body `{"error", "kind", ...}`
/// (shared by the admin and consumer APIs).
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    body: serde_json::Map<String, Value>,
}

impl ApiError {
    /// An error with `status`, a machine-readable `kind` and a message.
    pub(crate) fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> ApiError {
        let mut body = serde_json::Map::new();
        body.insert("error".into(), Value::String(message.into()));
        body.insert("kind".into(), Value::String(kind.into()));
        ApiError { status, body }
    }

    /// Adds a field to the JSON body.
    pub(crate) fn with(mut self, key: &str, value: Value) -> ApiError {
        self.body.insert(key.to_owned(), value);
        self
    }

    /// A 400 `invalid_input` naming `field`.
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message).with("field", json!(field))
    }

    /// A 400 `invalid_input` for a name that breaks the naming rules,
    /// naming `field` (as the catalog reports it).
    pub(crate) fn name(field: &'static str, source: NameError) -> ApiError {
        ApiError::from(CatalogError::InvalidName { field, source })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(Value::Object(self.body))).into_response()
    }
}

/// What a handler returns: a response, or an error response.
pub(crate) type ApiResult = Result<Response, ApiError>;

/// A response with `status` and `body` as JSON.
pub(crate) fn ok(status: StatusCode, body: impl serde::Serialize) -> ApiResult {
    Ok((status, axum::Json(body)).into_response())
}

/// The request body limit axum applies to every handler that buffers its
/// body (`DefaultBodyLimit`'s default), bytes.
const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// Turns axum's own plain-text rejection of a body over
/// [`DEFAULT_BODY_LIMIT`] into an [`ApiError`] (`413 too_large` with
/// `limit_bytes`), so every error of the API is JSON. Other responses pass
/// unchanged.
pub(crate) async fn json_rejections(response: Response) -> Response {
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/plain"));
    if plain && response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("request body over {DEFAULT_BODY_LIMIT} bytes, the API's limit"),
        )
        .with("limit_bytes", json!(DEFAULT_BODY_LIMIT))
        .into_response();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn axums_plain_text_413_becomes_a_json_api_error_and_others_pass() {
        let plain = (
            StatusCode::PAYLOAD_TOO_LARGE,
            "Failed to buffer the request body: length limit exceeded",
        )
            .into_response();
        let mapped = json_rejections(plain).await;
        assert_eq!(mapped.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let body = axum::body::to_bytes(mapped.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            json!({
                "error": "request body over 2097152 bytes, the API's limit",
                "kind": "too_large",
                "limit_bytes": 2097152
            })
        );
        // Our own JSON 413 (a record over its limit) is left as it is.
        let ours =
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "record").into_response();
        let kept = json_rejections(ours).await;
        let body = axum::body::to_bytes(kept.into_body(), 1 << 16)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"error": "record", "kind": "too_large"})
        );
    }
}
