//! The broker's HTTPS listener: a TCP accept loop that runs each TLS
//! handshake (rustls, [`broker_core::tls::TlsIdentity::https_server`]) in
//! the connection's own task under [`HANDSHAKE_TIMEOUT`], so a slow or
//! broken client never holds up the next accept, then serves the axum
//! `Router` over HTTP/1.1 or h2 (ALPN) with hyper-util. A client that
//! presented a certificate chaining to the cluster CA gets its identity as
//! the [`PeerCertificate`] extension on every request of the connection.
//!
//! A client has [`HEADER_READ_TIMEOUT`] to send each request's headers
//! over HTTP/1.1 (an idle keep-alive connection is closed after as long);
//! h2 connections are pinged every [`H2_KEEP_ALIVE`].
//!
//! Shutdown: when the shutdown future resolves the loop stops accepting,
//! every open connection finishes the request it is serving (h2 gets a
//! GOAWAY, HTTP/1.1 closes after the response), and [`serve_https`] returns
//! once all are done or after [`DRAIN_TIMEOUT`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower_service::Service;

use super::PeerCertificate;

/// Longest a client may take to complete its TLS handshake, after which
/// the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest shutdown waits for open connections to finish their requests.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest an HTTP/1.1 client may take to send a request's headers, from
/// the moment the connection waits for them (so also how long an idle
/// keep-alive connection is kept); past it the connection is closed.
/// Without it a client holding connections open with partial headers
/// (slowloris) kept them for ever. h2 connections are pinged every
/// [`H2_KEEP_ALIVE`] and closed when a ping goes unanswered as long.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Ping interval and answer timeout of h2 connections.
pub const H2_KEEP_ALIVE: Duration = Duration::from_secs(20);

/// Serves `app` over HTTPS on `listener` with the server config `tls`
/// until `shutdown` resolves, then drains open connections (at most
/// [`DRAIN_TIMEOUT`]).
///
/// # Errors
/// None today (accept errors such as EMFILE are logged and retried after
/// a short pause); the `Result` matches `axum::serve`.
pub async fn serve_https(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_https_with(listener, tls, app, shutdown, HEADER_READ_TIMEOUT).await
}

/// [`serve_https`] with another header read timeout (tests).
pub(crate) async fn serve_https_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    header_read_timeout: Duration,
) -> std::io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: retry shortly
                    // rather than spin or stop serving.
                    tracing::warn!(error = %e, "HTTPS accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls_stream =
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls_stream)) => tls_stream,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let leaf = tls_stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first());
            let peer_certificate = leaf.and_then(|cert| {
                Some(PeerCertificate {
                    identity: broker_core::tls::certificate_identity(cert)?,
                    not_before_s: broker_core::tls::certificate_not_before_s(cert),
                })
            });
            let service = hyper::service::service_fn(
                move |mut request: axum::extract::Request<hyper::body::Incoming>| {
                    if let Some(peer_certificate) = &peer_certificate {
                        request.extensions_mut().insert(peer_certificate.clone());
                    }
                    // A Router is always ready: no poll_ready needed.
                    app.clone().call(request)
                },
            );
            // The protocol is the one ALPN chose (RFC 9113, section 3.2:
            // h2 over TLS is negotiated by ALPN), so hyper does not wait
            // for a first byte to tell them apart: a client silent after
            // its handshake meets the header read timeout.
            let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let mut builder = Builder::new(TokioExecutor::new());
            builder = if h2 {
                builder.http2_only()
            } else {
                builder.http1_only()
            };
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(H2_KEEP_ALIVE)
                .keep_alive_timeout(H2_KEEP_ALIVE);
            let connection = builder
                .serve_connection(TokioIo::new(tls_stream), service)
                .into_owned();
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %e, "HTTPS connection ended with an error");
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
            "HTTPS connections still open after the drain timeout; closing them"
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
