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
