//! Access to the local API from the network ([`crate::config::local_api`]):
//! the bearer-token guard every route but `/health` passes, and the HTTPS
//! listener (rustls, the handshake of each connection in its own task under
//! [`HANDSHAKE_TIMEOUT`], so a slow client never holds up the next).
//!
//! Both listeners are served by [`serve`]: HTTP/1.1 with
//! [`HEADER_READ_TIMEOUT`] for each request's headers (a connection idle
//! that long between requests is closed too) and as longest pause inside
//! a request body, so clients that open connections and send nothing,
//! headers in dribs, or a body shorter than its `Content-Length`, cannot
//! hold them.
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
/// Longest a client may take to send a request's headers, counted from
/// when the connection waits for them (so also how long a connection may
/// sit idle between requests); past it the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest shutdown waits for open connections to finish their requests.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
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

/// Serves `app` over HTTP/1.1 on `listener` (plain TCP or [`TlsListener`])
/// until `shutdown` resolves, then lets open requests finish (at most
/// [`DRAIN_TIMEOUT`]). Unlike `axum::serve`, each connection has
/// [`HEADER_READ_TIMEOUT`] to send a request's headers.
///
/// # Errors
/// None today (the listeners retry failed accepts); the `Result` matches
/// `axum::serve`.
pub async fn serve<L>(
    listener: L,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
{
    serve_with(listener, app, shutdown, HEADER_READ_TIMEOUT).await
}

/// [`serve`] with another header read timeout (tests).
pub(crate) async fn serve_with<L>(
    mut listener: L,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    header_read_timeout: Duration,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (io, _peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        // A body that pauses longer than the header timeout fails the
        // request (it was held for ever: the bad-input trial).
        let service = hyper_util::service::TowerToHyperService::new(
            tower_http::timeout::RequestBodyTimeout::new(app.clone(), header_read_timeout),
        );
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "local API connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout_s = DRAIN_TIMEOUT.as_secs(),
            "local API connections still open after the drain timeout; closing them"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A connection that sends a request's headers in part, or nothing,
    /// is closed after the header read timeout (it was held for ever); a
    /// whole request is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partial_headers_and_idle_connections_are_closed_after_the_header_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let timeout = Duration::from_millis(500);
        let server = tokio::spawn(super::serve_with(
            listener,
            app,
            async {
                let _ = stopped.await;
            },
            timeout,
        ));
        for sent in [&b"GET /health HTTP/1.1\r\nHost: edge\r\n"[..], &b""[..]] {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(sent).await.unwrap();
            let started = tokio::time::Instant::now();
            let mut buf = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{sent:?}: the connection was not closed within 10 s"))
                .unwrap();
            // hyper may answer 408 before closing; nothing else.
            assert!(
                buf.is_empty() || String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 408"),
                "{buf:?}"
            );
            assert!(started.elapsed() >= timeout / 2, "closed too early");
        }
        // A body shorter than its Content-Length: the request fails after
        // the timeout, and the connection with it.
        let app_body = axum::Router::new().route(
            "/echo",
            axum::routing::post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let body_addr = listener.local_addr().unwrap();
        let (stop_body, stopped_body) = tokio::sync::oneshot::channel::<()>();
        let body_server = tokio::spawn(super::serve_with(
            listener,
            app_body,
            async {
                let _ = stopped_body.await;
            },
            timeout,
        ));
        let mut stream = tokio::net::TcpStream::connect(body_addr).await.unwrap();
        stream
            .write_all(
                b"POST /echo HTTP/1.1\r\nHost: edge\r\nContent-Length: 100\r\n\r\nonly ten b",
            )
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
            .await
            .expect("a stalled body was held for 10 s")
            .unwrap();
        assert!(started.elapsed() >= timeout / 2, "closed too early");
        let answer = String::from_utf8_lossy(&buf);
        assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
        stop_body.send(()).unwrap();
        body_server.await.unwrap().unwrap();

        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: edge\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
