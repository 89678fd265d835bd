//! The bearer-token check of the broker's HTTP APIs: `Authorization: Bearer
//! <token>`, compared in constant time (for a given presented length); a
//! missing or wrong token is `401` with a JSON body and a
//! `WWW-Authenticate: Bearer` header, and an empty configured token admits
//! nobody.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// Compares two byte strings in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u64::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// A 401 `unauthorized` with `WWW-Authenticate: Bearer`.
fn unauthorized(message: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tributary-admin\""),
    );
    response
}

/// Checks the request's `Authorization: Bearer` token against `token` (an
/// empty configured token admits nobody): `None` when it matches, else the
/// 401 response to send, with `WWW-Authenticate`.
pub(crate) fn reject_unauthorized(request: &Request, token: &str) -> Option<Response> {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        None => Some(unauthorized(
            "missing bearer token: send Authorization: Bearer <token>",
        )),
        Some(presented)
            if !token.is_empty() && constant_time_eq(presented.as_bytes(), token.as_bytes()) =>
        {
            None
        }
        Some(_) => Some(unauthorized("invalid bearer token")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
