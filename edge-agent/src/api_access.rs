//! Access to the local API from the network ([`crate::config::local_api`]):
//! the bearer-token guard every route but `/health` passes, and the HTTPS
//! listener (rustls, the handshake of each connection in its own task under
//! [`HANDSHAKE_TIMEOUT`], so a slow client never holds up the next).
//!
//! `/health` stays open without a token: load balancers and monitoring
//! probe it, and it tells the agent's state and topic names and offsets,
//! never record contents or anything that changes data.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use broker_core::tls::{TlsError, load_certs, load_key};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use crate::config::local_api::{ApiToken, LocalApiTls};

/// Longest a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Completed handshakes waiting for the server to take them.
const READY_CONNECTIONS: usize = 64;

/// Refuses a request to any route but `/health` without
/// `Authorization: Bearer <token>`: `401` with `WWW-Authenticate: Bearer`
/// and `{"error", "kind": "unauthorized"}`; nothing is read or stored.
pub async fn require_token(
    State(token): State<Arc<ApiToken>>,
    request: Request,
    next: Next,
) -> Response {
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(broker_core::secrets::bearer_token);
    let message = match presented {
        Some(presented) if token.matches(presented) => return next.run(request).await,
        Some(_) => "the bearer token is not this agent's local API token",
        None => "this local API needs Authorization: Bearer <token> (local_api_token_file)",
    };
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(json!({"error": message, "kind": "unauthorized"})),
    )
        .into_response()
}

/// The rustls server configuration of the local API: `tls`'s certificate
/// and key, TLS 1.3 or 1.2, HTTP/1.1, no client certificate.
///
/// # Errors
/// [`TlsError::Setting`] naming `local_api_tls.cert` or
/// `local_api_tls.key` (unreadable, not PEM, world-readable key, or a key
/// that is not the certificate's).
pub fn server_config(tls: &LocalApiTls) -> Result<rustls::ServerConfig, TlsError> {
    let certs = load_certs(&tls.cert).map_err(|e| e.for_setting("local_api_tls.cert"))?;
    let key = load_key(&tls.key).map_err(|e| e.for_setting("local_api_tls.key"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .map_err(|e| TlsError::Config(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| TlsError::Config(e.to_string()).for_setting("local_api_tls.key"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A TCP listener whose connections come out TLS-established, for
/// `axum::serve`. A task accepts and runs each handshake; the listener
/// hands out the ones that completed. Dropping the listener stops the task
/// and closes the socket.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl TlsListener {
    /// Serves TLS with `config` on `listener`.
    ///
    /// # Errors
    /// The listener's address cannot be read.
    pub fn new(
        listener: TcpListener,
        config: rustls::ServerConfig,
    ) -> std::io::Result<TlsListener> {
        let local_addr = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (tx, ready) = mpsc::channel(READY_CONNECTIONS);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of file descriptors and the like.
                            tracing::warn!(error = %e, "local API accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    () = tx.closed() => return,
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(peer = %peer, error = %e, "local API TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(peer = %peer, "local API TLS handshake timed out")
                        }
                    }
                });
            }
        });
        Ok(TlsListener { ready, local_addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accept task holds a sender while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
