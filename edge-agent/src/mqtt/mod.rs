//! MQTT at the edge: a listener (MQTT 3.1.1 and 5.0, QoS 0/1/2) that maps
//! MQTT topics to Tributary topics and acknowledges a PUBLISH only once its
//! record is durable, and a bridge that subscribes to a local broker
//! (Mosquitto on the gateway) and acknowledges each message to it only
//! once durable. The codec and the bridge client are rumqttc's
//! (`mqttbytes` v4/v5 and its event loop with manual acks).
//!
//! Modules: [`config`] (`[mqtt]`), [`mapping`] (topic filters, pure),
//! [`wire`] (version-neutral packets over the codec), [`session`] (QoS 2
//! state, persisted for persistent sessions), [`conn`] (one connection's
//! state machine), [`bridge`], [`stats`]. User guide:
//! `docs/edge-agent.md`, "MQTT".

pub mod bridge;
pub mod config;
pub mod conn;
pub mod mapping;
pub mod session;
pub mod stats;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

pub use config::{MqttConfig, MqttFileConfig};
pub use stats::MqttStats;

use crate::manager::TopicManager;

/// Error starting the listener.
#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    /// The listen address could not be bound.
    #[error("mqtt: cannot listen on {addr}: {source}")]
    Bind {
        /// `mqtt.listen`.
        addr: SocketAddr,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// `[mqtt.tls]` could not be loaded.
    #[error("mqtt.tls: {0}")]
    Tls(String),
    /// The stored sessions' pending QoS 2 messages could not be settled.
    #[error(transparent)]
    Session(#[from] session::SessionError),
}

/// A running MQTT listener (and bridge).
#[derive(Debug)]
pub struct MqttServer {
    /// Address bound (port 0 in the config picks a free one).
    pub local_addr: SocketAddr,
    /// Counters.
    pub stats: Arc<MqttStats>,
    accept: JoinHandle<()>,
    bridge: Option<JoinHandle<()>>,
    sweeper: JoinHandle<()>,
}

impl MqttServer {
    /// Binds `config.listen` and serves until `stop` turns true; starts the
    /// bridge when configured.
    ///
    /// # Errors
    /// [`MqttError::Bind`], [`MqttError::Tls`].
    pub async fn start(
        config: MqttConfig,
        manager: Arc<TopicManager>,
        stop: watch::Receiver<bool>,
    ) -> Result<MqttServer, MqttError> {
        let tls = match &config.tls {
            Some(paths) => Some(load_tls(paths)?),
            None => None,
        };
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| MqttError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let local_addr = listener.local_addr().map_err(|source| MqttError::Bind {
            addr: config.listen,
            source,
        })?;
        let now = u64::try_from(manager.now_ms()).unwrap_or(0);
        let settled = session::settle_pending(&manager, now).await?;
        if settled != session::Settled::default() {
            info!(
                stored = settled.stored,
                not_stored = settled.not_stored,
                unreadable = settled.unreadable,
                "mqtt: settled the QoS 2 messages a crash left pending (stored ones are not stored again on resend)"
            );
        }
        let stats = Arc::new(MqttStats::default());
        let bridge = config.bridge.clone().map(|b| {
            tokio::spawn(bridge::run(
                b,
                config.rules.clone(),
                manager.clone(),
                stats.clone(),
                stop.clone(),
            ))
        });
        let shared = Arc::new(conn::Shared {
            manager,
            config,
            sessions: session::SessionStore::with_gauge(stats.sessions_in_memory.clone()),
            stats: stats.clone(),
        });
        info!(listen = %local_addr, tls = tls.is_some(), "mqtt listener started");
        let sweeper = tokio::spawn(sweep_expired(shared.clone(), stop.clone()));
        let accept = tokio::spawn(accept_loop(listener, tls, shared, stop));
        Ok(MqttServer {
            local_addr,
            stats,
            accept,
            bridge,
            sweeper,
        })
    }

    /// Waits for the accept loop, the bridge and the session sweeper to
    /// end (after `stop`).
    pub async fn join(self) {
        let _ = self.accept.await;
        let _ = self.sweeper.await;
        if let Some(bridge) = self.bridge {
            let _ = bridge.await;
        }
    }
}

fn load_tls(paths: &config::MqttTlsFileConfig) -> Result<tokio_rustls::TlsAcceptor, MqttError> {
    let certs =
        broker_core::tls::load_certs(&paths.cert).map_err(|e| MqttError::Tls(e.to_string()))?;
    let key = broker_core::tls::load_key(&paths.key).map_err(|e| MqttError::Tls(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| MqttError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| MqttError::Tls(e.to_string()))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
}

/// Removes sessions past their expiry interval
/// ([`session::SessionStore::sweep`]) at start (those that expired while
/// the agent was down) and every `session_sweep_interval`, until `stop`.
async fn sweep_expired(shared: Arc<conn::Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let now = u64::try_from(shared.manager.now_ms()).unwrap_or(0);
        match shared.sessions.sweep(&shared.manager, now).await {
            Ok(0) => {}
            Ok(n) => {
                shared.stats.add(&shared.stats.sessions_expired, n as u64);
                info!(
                    sessions = n,
                    "mqtt: removed sessions whose expiry interval passed"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "mqtt: sweeping expired sessions failed; retried at the next sweep")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(shared.config.session_sweep_interval) => {}
            _ = stop.wait_for(|&s| s) => return,
        }
    }
}

/// Decrements the open-connection gauge when a connection task ends.
struct OpenGuard(Arc<MqttStats>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<conn::Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let max = u64::from(shared.config.max_connections);
    // Every connection task holds the topic manager (and so the metadata
    // store): the loop ends only when they have, so that the agent's
    // shutdown returns with the store closed (a restart in the same process
    // would otherwise find it still open).
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = stop.wait_for(|&s| s) => break,
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, usually: back off a little.
                warn!(error = %e, "mqtt accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let stats = shared.stats.clone();
        let open = stats.connections_open.fetch_add(1, Ordering::Relaxed) + 1;
        let guard = OpenGuard(stats.clone());
        let (shared, mut stop, tls) = (shared.clone(), stop.clone(), tls.clone());
        connections.spawn(async move {
            let _guard = guard;
            let peer = peer.to_string();
            if open > max {
                stats.count(&stats.connections_refused_limit);
                debug!(%peer, "mqtt connection refused: max_connections reached");
                conn::refuse_busy(socket).await;
                return;
            }
            match tls {
                Some(acceptor) => {
                    let handshake = tokio::select! {
                        h = tokio::time::timeout(conn::CONNECT_TIMEOUT, acceptor.accept(socket)) => h,
                        _ = stop.wait_for(|&s| s) => return,
                    };
                    match handshake {
                        Ok(Ok(stream)) => conn::serve(stream, peer, shared, stop).await,
                        Ok(Err(e)) => debug!(%peer, error = %e, "mqtt TLS handshake failed"),
                        Err(_) => debug!(%peer, "mqtt TLS handshake timed out"),
                    }
                }
                None => conn::serve(socket, peer, shared, stop).await,
            }
        });
    }
    drop(listener);
    // Connections watch the same stop signal: a session closes with "server
    // shutting down", a handshake or CONNECT in progress is dropped.
    while connections.join_next().await.is_some() {}
}
