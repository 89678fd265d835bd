//! The broker's HTTPS listener: a TCP accept loop that runs each TLS
//! handshake (rustls, [`broker_core::tls::TlsIdentity::https_server`]) in
//! the connection's own task under [`HANDSHAKE_TIMEOUT`], so a slow or
//! broken client never holds up the next accept, then serves the axum
//! `Router` over HTTP/1.1 or h2 (ALPN) with hyper-util. A client that
//! presented a certificate chaining to the cluster CA gets its identity as
//! the [`PeerCertificate`] extension on every request of the connection.
//!
//! Shutdown: when the shutdown future resolves the loop stops accepting,
//! every open connection finishes the request it is serving (h2 gets a
//! GOAWAY, HTTP/1.1 closes after the response), and [`serve_https`] returns
//! once all are done or after [`DRAIN_TIMEOUT`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
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
            let builder = Builder::new(TokioExecutor::new());
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(tls_stream), service)
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
