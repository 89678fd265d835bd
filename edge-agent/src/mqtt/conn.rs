//! One MQTT connection: CONNECT, then PUBLISH/PUBREL/PINGREQ until
//! DISCONNECT, a protocol error, the keep-alive timeout, a take-over or
//! the agent's shutdown. Packets are handled in order, one at a time: a
//! PUBACK (QoS 1) or PUBREC (QoS 2) is written only after
//! [`TopicManager::publish`] returned, i.e. once the record is durable per
//! its topic's sync mode. The agent's group commit batches records of
//! different connections into one write.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use tributary_proto::Record;

use super::MqttConfig;
use super::mapping::{self, HEADER_CONTENT_TYPE, HEADER_MQTT_TOPIC};
use super::session::{
    Claim, HEADER_CLIENT_ID, HEADER_PACKET_ID, HeldSession, Qos2State, Session, SessionSlot,
    SessionStore, stored_since,
};
use super::stats::MqttStats;
use super::wire::{self, ConnectIn, DecodeError, Inbound, Outbound, PublishIn, Reason, Version};
use crate::manager::{TopicError, TopicManager};
use crate::topic::PublishError;

/// Time a client has to send its CONNECT.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A write (an acknowledgement) that does not finish in this time ends
/// the connection: a client that never reads cannot hold the agent.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a CONNECT waits for the connection that holds its client id's
/// session to finish the packet it is handling (a write in it may take
/// [`WRITE_TIMEOUT`]) and let the session go; then CONNACK 0x89 (server
/// busy), and the client retries.
pub const TAKEOVER_WAIT: Duration = WRITE_TIMEOUT.saturating_add(Duration::from_secs(5));
/// User property names beginning with this are refused: the agent's own
/// record headers ([`HEADER_MQTT_TOPIC`], [`HEADER_CLIENT_ID`],
/// [`HEADER_PACKET_ID`]) begin with it.
pub const RESERVED_HEADER_PREFIX: &str = "mqtt.";

/// Whether a record header `name` is one only the agent may set (begins
/// with [`RESERVED_HEADER_PREFIX`], in any case); refused on every publish path (MQTT
/// user properties, HTTP record headers), since a forged
/// `mqtt.client_id` + `mqtt.packet_id` would make a resend look stored.
pub fn is_reserved_header(name: &str) -> bool {
    name.get(..RESERVED_HEADER_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_HEADER_PREFIX))
}
/// Largest CONNECT accepted (remaining length), bytes: the client id,
/// credentials, properties and will fit easily; a connection that has not
/// authenticated holds one such frame at most (16 MiB for the default 256
/// connections, plus the read buffers' spare capacity).
pub const MAX_CONNECT_BYTES: u32 = 64 * 1024;
/// Longest client id accepted, bytes.
pub const MAX_CLIENT_ID_BYTES: usize = 256;

/// What the listener shares with every connection.
#[derive(Debug)]
pub struct Shared {
    /// The topics.
    pub manager: Arc<TopicManager>,
    /// `[mqtt]`.
    pub config: MqttConfig,
    /// Counters.
    pub stats: Arc<MqttStats>,
    /// Live sessions.
    pub sessions: SessionStore,
}

/// Why a connection ends early: the reason sent in a DISCONNECT (5.0;
/// `Success` sends none), a log line, and for a refused CONNECT the
/// CONNACK reason.
struct Close {
    reason: Reason,
    why: String,
    connack: Option<Reason>,
}

fn close(reason: Reason, why: impl Into<String>) -> Close {
    Close {
        reason,
        why: why.into(),
        connack: None,
    }
}

struct Conn<'a, S> {
    stream: S,
    buf: BytesMut,
    out: BytesMut,
    version: Version,
    shared: &'a Shared,
    /// QoS 2 ids first received on this connection and not yet released:
    /// the receive-maximum quota.
    new_qos2: std::collections::HashSet<u16>,
}

/// Serves one accepted connection to its end.
pub async fn serve<S>(stream: S, peer: String, shared: Arc<Shared>, stop: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut conn = Conn {
        stream,
        buf: BytesMut::with_capacity(4096),
        out: BytesMut::with_capacity(256),
        version: Version::V5,
        shared: &shared,
        new_qos2: Default::default(),
    };
    match conn.run(stop).await {
        Ok(()) => debug!(%peer, "mqtt connection closed"),
        Err(close) => {
            if matches!(
                close.reason,
                Reason::Success | Reason::ServerShuttingDown | Reason::SessionTakenOver
            ) {
                debug!(%peer, reason_code = close.reason as u8, why = %close.why, "mqtt connection ended");
            } else {
                // The client broke a rule (too large, malformed, a bad topic
                // name): say so, since an MQTT 3.1.1 client only sees its
                // connection drop.
                warn!(%peer, reason_code = close.reason as u8, why = %close.why, "mqtt connection closed by the agent; nothing after the last acknowledged packet was accepted");
            }
            if close.reason != Reason::Success {
                conn.send(&Outbound::Disconnect(close.reason)).await.ok();
            }
        }
    }
    // Bounded: a client that does not read must not hold up the agent's
    // shutdown (which waits for every connection).
    let _ = tokio::time::timeout(WRITE_TIMEOUT, conn.stream.shutdown()).await;
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<'_, S> {
    async fn send(&mut self, packet: &Outbound) -> Result<(), Close> {
        self.out.clear();
        wire::encode(self.version, packet, &mut self.out);
        if self.out.is_empty() {
            return Ok(());
        }
        let write = async {
            self.stream.write_all(&self.out).await?;
            self.stream.flush().await
        };
        match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(close(Reason::Success, format!("write: {e}"))),
            Err(_) => {
                self.shared.stats.count(&self.shared.stats.slow_clients);
                Err(close(
                    Reason::Success,
                    "the client does not read: write timed out",
                ))
            }
        }
    }

    /// Reads until a packet decodes, or EOF, or `wait` passes: for the
    /// first packet (the CONNECT) in all, so that a client trickling bytes
    /// cannot hold a `max_connections` place before it authenticated; for
    /// later packets between reads (the keep-alive: a large PUBLISH on a
    /// slow link may take longer than it, as with other brokers).
    async fn next(&mut self, wait: Option<Duration>, first: bool) -> Result<Inbound, Close> {
        // Before a CONNECT was accepted nobody is authenticated: what a
        // connection may make the agent buffer is a CONNECT's worth, not
        // a PUBLISH's (the will message, the only large part, is unused).
        let max = if first {
            self.shared.config.max_packet_bytes.min(MAX_CONNECT_BYTES)
        } else {
            self.shared.config.max_packet_bytes
        };
        let connect_deadline = wait
            .filter(|_| first)
            .map(|wait| tokio::time::Instant::now() + wait);
        loop {
            let decoded = if first {
                wire::decode_first(&mut self.buf, max).map(|(v, p)| {
                    self.version = v;
                    p
                })
            } else {
                wire::decode(self.version, &mut self.buf, max)
            };
            match decoded {
                Ok(packet) => return Ok(packet),
                Err(DecodeError::Incomplete) => {}
                Err(e) => return Err(self.decode_failure(e, first)),
            }
            let read = self.stream.read_buf(&mut self.buf);
            let deadline =
                connect_deadline.or_else(|| wait.map(|wait| tokio::time::Instant::now() + wait));
            let n = match deadline {
                Some(at) => match tokio::time::timeout_at(at, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(close(
                            Reason::Success,
                            if first {
                                "no whole CONNECT in time"
                            } else {
                                "keep-alive timeout: nothing received"
                            },
                        ));
                    }
                },
                None => read.await,
            }
            .map_err(|e| close(Reason::Success, format!("read: {e}")))?;
            if n == 0 {
                return Err(close(Reason::Success, "the client closed the connection"));
            }
        }
    }

    fn decode_failure(&mut self, e: DecodeError, first: bool) -> Close {
        let stats = &self.shared.stats;
        let reason = match e {
            DecodeError::TooLarge { .. } => {
                stats.count(&stats.packets_too_large);
                Reason::PacketTooLarge
            }
            DecodeError::BadProtocol(_) => {
                stats.count(&stats.bad_protocol);
                Reason::UnsupportedProtocolVersion
            }
            _ => {
                stats.count(&stats.malformed_packets);
                Reason::MalformedPacket
            }
        };
        if first {
            // Before a CONNECT was accepted only an unsupported protocol
            // level is answered (a 3.1.1 CONNACK, return code 1, which
            // every version understands); anything else is just closed.
            if matches!(e, DecodeError::BadProtocol(_)) {
                self.version = Version::V311;
                return close(Reason::Success, format!("refused CONNECT: {e}"))
                    .with_connack(reason);
            }
            return close(Reason::Success, format!("refused CONNECT: {e}"));
        }
        close(reason, e.to_string())
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) -> Result<(), Close> {
        let first = tokio::select! {
            first = self.next(Some(CONNECT_TIMEOUT), true) => first,
            // Nothing accepted yet: nothing to save or say.
            _ = stop.wait_for(|&s| s) => return Ok(()),
        };
        let connect = match first {
            Ok(Inbound::Connect(c)) => c,
            Ok(_) => return Err(close(Reason::Success, "first packet is not CONNECT")),
            Err(close) => return self.refuse_connect(close).await,
        };
        let (slot, mut claim, mut held, mut session) = match self.accept(&connect).await {
            Ok(s) => s,
            Err(close) => return self.refuse_connect(close).await,
        };
        let client_id = session.data.client_id.clone();
        let wait = (connect.keep_alive_s > 0)
            .then(|| Duration::from_millis(u64::from(connect.keep_alive_s) * 1500));
        let result = loop {
            let packet = tokio::select! {
                p = self.next(wait, false) => p,
                () = claim.taken_over() => break Err(close(Reason::SessionTakenOver, "session taken over by a new connection")),
                _ = stop.wait_for(|&s| s) => break Err(close(Reason::ServerShuttingDown, "agent shutting down")),
            };
            let packet = match packet {
                Ok(p) => p,
                Err(close) => break Err(close),
            };
            match self.handle(packet, &connect.client_id, &mut session).await {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(close) => break Err(close),
            }
        };
        // A persistent session stays for the next connection with this
        // client id (saved, and in memory for the QoS 1 redelivery count);
        // any other ends with its connection (MQTT 3.1.1 §3.1.2.4, 5.0
        // §3.1.2.11.2: session expiry 0), and so does its slot.
        if session.persistent {
            let now = u64::try_from(self.shared.manager.now_ms()).unwrap_or(0);
            session.data.start_expiry(now);
            if let Err(e) = session.save(&self.shared.manager).await {
                warn!(error = %e, "mqtt session could not be saved at the end of its connection");
            }
        } else if session.stored {
            // A stored session resumed by a connection with session expiry
            // 0 (or ended by its DISCONNECT) ends now: a copy left in the
            // store would come back, stale, at the next persistent CONNECT.
            if let Err(e) = session.delete_stored(&self.shared.manager).await {
                warn!(error = %e, "mqtt session could not be deleted at the end of its connection");
            }
        }
        // Only now may a connection that took the session over have it.
        let persistent = session.persistent;
        *held = persistent.then_some(session);
        drop(held);
        if !persistent {
            self.shared.sessions.release(&client_id, &slot, &claim);
        }
        result
    }

    async fn refuse_connect(&mut self, refused: Close) -> Result<(), Close> {
        match refused.connack {
            Some(reason) => {
                self.send(&Outbound::ConnAck {
                    session_present: false,
                    reason,
                    receive_maximum: 0,
                    max_packet_bytes: 0,
                    assigned_client_id: None,
                })
                .await?;
                Err(close(Reason::Success, refused.why))
            }
            None => Err(refused),
        }
    }

    async fn accept(
        &mut self,
        c: &ConnectIn,
    ) -> Result<(Arc<SessionSlot>, Claim, HeldSession, Session), Close> {
        let shared = self.shared;
        if let Some(credentials) = &shared.config.credentials {
            let ok = c
                .login
                .as_ref()
                .is_some_and(|(u, p)| credentials.get(u).is_some_and(|want| want == p));
            if !ok {
                shared.stats.count(&shared.stats.auth_failures);
                let who = c.login.as_ref().map(|(u, _)| u.as_str()).unwrap_or("");
                warn!(client_id = %c.client_id, username = %who, "mqtt CONNECT refused: bad username or password");
                return Err(close(Reason::Success, "bad username or password")
                    .with_connack(Reason::BadUserNameOrPassword));
            }
        }
        let persistent = c.session_expiry_s > 0;
        if c.client_id.len() > MAX_CLIENT_ID_BYTES || (c.client_id.is_empty() && persistent) {
            return Err(
                close(Reason::Success, "client id refused").with_connack(Reason::ClientIdNotValid)
            );
        }
        let client_id = if c.client_id.is_empty() {
            format!("\0anonymous-{}", shared.stats.next_anonymous())
        } else {
            c.client_id.clone()
        };
        let slot = shared.sessions.slot(&client_id);
        let claim = slot.claim();
        match self.resume(c, &client_id, persistent, &slot).await {
            Ok((held, session)) => Ok((slot, claim, held, session)),
            Err(close) => {
                shared.sessions.release(&client_id, &slot, &claim);
                Err(close)
            }
        }
    }

    /// Takes the session of `slot` over (waiting for its connection to
    /// let go), opens or starts it per `c` and sends the CONNACK.
    async fn resume(
        &mut self,
        c: &ConnectIn,
        client_id: &str,
        persistent: bool,
        slot: &SessionSlot,
    ) -> Result<(HeldSession, Session), Close> {
        let shared = self.shared;
        let mut held = slot.acquire(TAKEOVER_WAIT).await.ok_or_else(|| {
            close(Reason::Success, "session still held").with_connack(Reason::ServerBusy)
        })?;
        let current = held.take();
        let now = u64::try_from(shared.manager.now_ms()).unwrap_or(0);
        let (session, present) = SessionStore::open(
            &shared.manager,
            current,
            client_id,
            c.clean_start,
            c.session_expiry_s,
            now,
        )
        .await
        .map_err(|e| {
            warn!(error = %e, "mqtt session could not be opened");
            close(Reason::Success, e.to_string()).with_connack(Reason::UnspecifiedError)
        })?;
        if persistent && !present {
            // Stored at once, so a reconnect after a crash finds it.
            session.save(&shared.manager).await.map_err(|e| {
                warn!(error = %e, "mqtt session could not be saved");
                close(Reason::Success, e.to_string()).with_connack(Reason::UnspecifiedError)
            })?;
        }
        self.send(&Outbound::ConnAck {
            session_present: present,
            reason: Reason::Success,
            receive_maximum: shared.config.receive_maximum,
            max_packet_bytes: shared.config.max_packet_bytes,
            // The id given to a client that sent none (internal ids start
            // with NUL, which no client id can hold).
            assigned_client_id: client_id
                .strip_prefix('\0')
                .filter(|_| self.version == crate::mqtt::wire::Version::V5)
                .map(str::to_owned),
        })
        .await?;
        shared.stats.count(&shared.stats.connections_accepted);
        debug!(client_id = %client_id, version = match self.version { crate::mqtt::wire::Version::V311 => "3.1.1", crate::mqtt::wire::Version::V5 => "5.0" }, persistent, session_present = present, "mqtt client connected");
        Ok((held, session))
    }

    /// Handles one packet; `Ok(false)` at DISCONNECT.
    async fn handle(
        &mut self,
        packet: Inbound,
        client_id: &str,
        session: &mut Session,
    ) -> Result<bool, Close> {
        match packet {
            Inbound::Publish(p) => self.publish(p, session).await?,
            Inbound::PubRel(pkid) => {
                self.new_qos2.remove(&pkid);
                // Forgotten on disk before the PUBCOMP: once the client has
                // its PUBCOMP it may reuse the id for a new message, and an
                // entry left behind would make that message a "duplicate"
                // (see `publish`, which treats every PUBLISH with a known
                // id as a resend, DUP or not).
                let found = session.data.qos2.remove(&pkid).is_some();
                if found {
                    self.save(session).await?;
                }
                let reason = if found {
                    Reason::Success
                } else {
                    Reason::PacketIdNotFound
                };
                self.send(&Outbound::PubComp(pkid, reason)).await?;
            }
            Inbound::PingReq => self.send(&Outbound::PingResp).await?,
            Inbound::Disconnect { session_expiry_s } => {
                // MQTT 5.0 §3.14.2.2.2: 0 ends the session now; another
                // value replaces the interval of a persistent session (a
                // session that began with 0 stays non-persistent).
                match session_expiry_s {
                    Some(0) => session.persistent = false,
                    Some(s) if session.persistent => {
                        session.data.session_expiry_s = super::session::finite_expiry(s);
                    }
                    _ => {}
                }
                return Ok(false);
            }
            Inbound::Subscribe(pkid, n) => {
                self.shared
                    .stats
                    .count(&self.shared.stats.subscribe_refused);
                debug!(
                    client_id,
                    "SUBSCRIBE refused: the agent's listener only ingests"
                );
                self.send(&Outbound::SubAckRefused(pkid, n)).await?;
            }
            Inbound::Unsubscribe(pkid, n) => self.send(&Outbound::UnsubAck(pkid, n)).await?,
            Inbound::Connect(_) | Inbound::Unexpected(_) => {
                let what = match packet {
                    Inbound::Unexpected(w) => w,
                    _ => "a second CONNECT",
                };
                return Err(close(Reason::ProtocolError, format!("unexpected {what}")));
            }
        }
        Ok(true)
    }

    async fn save(&self, session: &Session) -> Result<(), Close> {
        session.save(&self.shared.manager).await.map_err(|e| {
            warn!(error = %e, "mqtt session could not be saved; closing the connection (the client resends)");
            close(Reason::UnspecifiedError, e.to_string())
        })
    }

    /// An acknowledgement of a refused publish: a reason code (5.0), or
    /// for 3.1.1, which has none, the connection is closed unacknowledged.
    async fn refuse(&mut self, p: &PublishIn, reason: Reason, why: String) -> Result<(), Close> {
        match (self.version, p.qos) {
            (Version::V5, 1) => self.send(&Outbound::PubAck(p.pkid, reason)).await,
            (Version::V5, 2) => self.send(&Outbound::PubRec(p.pkid, reason)).await,
            _ => Err(close(reason, why)),
        }
    }

    async fn publish(&mut self, p: PublishIn, session: &mut Session) -> Result<(), Close> {
        let shared = self.shared;
        let stats = &shared.stats;
        stats.count(&stats.publishes[usize::from(p.qos.min(2))]);
        if p.topic_alias.is_some() {
            return Err(close(
                Reason::TopicAliasInvalid,
                "topic aliases are not supported (topic alias maximum 0)",
            ));
        }
        let Ok(mqtt_topic) = std::str::from_utf8(&p.topic) else {
            stats.count(&stats.malformed_packets);
            return Err(close(Reason::MalformedPacket, "topic name is not UTF-8"));
        };
        if let Err(why) = mapping::check_topic_name(mqtt_topic) {
            stats.count(&stats.malformed_packets);
            return Err(close(Reason::TopicNameInvalid, why));
        }
        if let Some((name, _)) = p
            .user_properties
            .iter()
            .find(|(name, _)| is_reserved_header(name))
        {
            // The agent's own headers (`mqtt.topic`, and the QoS 2 dedupe
            // pair that a crash recovery looks for) must not be written by
            // a client: another client's `mqtt.client_id` and
            // `mqtt.packet_id` would make its resend look stored.
            stats.count(&stats.reserved_property_refused);
            let why = format!(
                "user property {name:?}: names beginning with {RESERVED_HEADER_PREFIX:?} are the agent's own headers"
            );
            info!(%why, "mqtt publish refused, not acknowledged");
            return self.refuse(&p, Reason::ImplementationSpecific, why).await;
        }
        let Some(topic) = mapping::map_topic(&shared.config.rules, mqtt_topic).cloned() else {
            stats.count(&stats.unmapped_refused);
            super::stats::log_unmapped_once(&stats.unmapped_logged, mqtt_topic);
            return self
                .refuse(
                    &p,
                    Reason::TopicNameInvalid,
                    format!("MQTT topic {mqtt_topic:?} matches no [[mqtt.topics]] rule"),
                )
                .await;
        };
        let client_id = session.data.client_id.clone();
        let mut from = None;
        if p.qos == 2 {
            // MQTT 3.1.1 §4.3.3, 5.0 §4.3.3: until the PUBREL, every PUBLISH
            // with this id is the same message, whatever its DUP flag (some
            // clients, paho-mqtt among them, resend with DUP 0 after a
            // reconnect). An entry exists exactly until its PUBREL, which
            // is saved before the PUBCOMP, so a known id is a resend.
            match session.data.qos2.get(&p.pkid) {
                Some(Qos2State::Received) => {
                    stats.count(&stats.qos2_duplicates);
                    return self.send(&Outbound::PubRec(p.pkid, Reason::Success)).await;
                }
                Some(Qos2State::Pending { topic: t, from: f }) => {
                    let stored = topic.as_str() == t
                        && stored_since(&shared.manager, &topic, *f, &client_id, p.pkid);
                    if stored {
                        stats.count(&stats.qos2_duplicates);
                        session.data.qos2.insert(p.pkid, Qos2State::Received);
                        return self.send(&Outbound::PubRec(p.pkid, Reason::Success)).await;
                    }
                }
                None => {
                    // MQTT 5 §4.9: the quota is per network connection;
                    // ids left from an earlier connection do not count.
                    if self.version == Version::V5
                        && self.new_qos2.len() >= usize::from(shared.config.receive_maximum)
                    {
                        return Err(close(
                            Reason::ReceiveMaximumExceeded,
                            "more QoS 2 publishes in flight than the receive maximum",
                        ));
                    }
                    self.new_qos2.insert(p.pkid);
                }
            }
            if session.persistent {
                let hwm = match shared.manager.get_or_create(&topic).await {
                    Ok(t) => t.high_water_mark(),
                    Err(e) => {
                        self.new_qos2.remove(&p.pkid);
                        return self.publish_failed(&p, e).await;
                    }
                };
                from = Some(hwm);
                session.data.qos2.insert(
                    p.pkid,
                    Qos2State::Pending {
                        topic: topic.as_str().to_owned(),
                        from: hwm,
                    },
                );
                self.save(session).await?;
            }
        }
        if p.qos == 1 && p.dup && session.qos1_acked.contains(&p.pkid) {
            stats.count(&stats.qos1_redeliveries);
        }
        let record = self.record(
            &p,
            mqtt_topic,
            (from.is_some()).then_some((client_id.as_str(), p.pkid)),
        );
        let bytes = p.payload.len() as u64;
        match shared.manager.publish(&topic, vec![record]).await {
            Ok(_) => {
                stats.count(&stats.records_stored);
                stats.add(&stats.bytes_stored, bytes);
            }
            Err(e) => {
                self.new_qos2.remove(&p.pkid);
                if from.is_some() {
                    session.data.qos2.remove(&p.pkid);
                    self.save(session).await?;
                }
                return self.publish_failed(&p, e).await;
            }
        }
        match p.qos {
            1 => {
                session.qos1_acked.insert(p.pkid);
                self.send(&Outbound::PubAck(p.pkid, Reason::Success)).await
            }
            2 => {
                // In memory only: the `pending` entry already on disk finds
                // the record in the WAL after a crash (one store commit per
                // message, not three).
                session.data.qos2.insert(p.pkid, Qos2State::Received);
                self.send(&Outbound::PubRec(p.pkid, Reason::Success)).await
            }
            _ => Ok(()),
        }
    }

    fn record(&self, p: &PublishIn, mqtt_topic: &str, dedupe: Option<(&str, u16)>) -> Record {
        let mut headers = Vec::with_capacity(2 + p.user_properties.len());
        headers.push((
            HEADER_MQTT_TOPIC.to_owned(),
            Bytes::copy_from_slice(mqtt_topic.as_bytes()),
        ));
        if let Some(ct) = &p.content_type {
            headers.push((
                HEADER_CONTENT_TYPE.to_owned(),
                Bytes::copy_from_slice(ct.as_bytes()),
            ));
        }
        for (name, value) in &p.user_properties {
            headers.push((name.clone(), Bytes::copy_from_slice(value.as_bytes())));
        }
        if let Some((client_id, pkid)) = dedupe {
            headers.push((
                HEADER_CLIENT_ID.to_owned(),
                Bytes::copy_from_slice(client_id.as_bytes()),
            ));
            headers.push((HEADER_PACKET_ID.to_owned(), Bytes::from(pkid.to_string())));
        }
        Record {
            timestamp_ms: self.shared.manager.now_ms(),
            key: None,
            headers,
            value: p.payload.clone(),
        }
    }

    async fn publish_failed(&mut self, p: &PublishIn, e: TopicError) -> Result<(), Close> {
        let stats = &self.shared.stats;
        let (reason, fatal) = match &e {
            TopicError::Publish(PublishError::Full(_) | PublishError::DiskFull { .. })
            | TopicError::TooManyTopics { .. } => {
                stats.count(&stats.refused_full);
                (Reason::QuotaExceeded, false)
            }
            // The packet passed max_packet_bytes but its record (payload,
            // topic header, properties) is over max_record_bytes: refuse
            // this message and keep the connection (5.0: PUBACK/PUBREC
            // 0x83 with the limit in the log; 3.1.1 has no reason code).
            TopicError::Publish(PublishError::TooLarge { .. }) => {
                stats.count(&stats.records_too_large);
                (Reason::ImplementationSpecific, false)
            }
            TopicError::ShuttingDown | TopicError::Publish(PublishError::Closed { .. }) => {
                (Reason::ServerShuttingDown, true)
            }
            _ => (Reason::UnspecifiedError, true),
        };
        match &e {
            // Storage refusals: one line per topic every 10 s, with a count.
            TopicError::Publish(
                refusal @ (PublishError::Full(_) | PublishError::DiskFull { .. }),
            ) => {
                crate::refusals::log_storage_refusal(refusal, "mqtt");
            }
            _ => info!(error = %e, "mqtt publish refused, not acknowledged"),
        }
        if fatal {
            return Err(close(reason, e.to_string()));
        }
        self.refuse(p, reason, e.to_string()).await
    }
}

impl Close {
    fn with_connack(mut self, reason: Reason) -> Close {
        self.connack = Some(reason);
        self
    }
}

/// Answers a connection over `max_connections`: reads its CONNECT (for
/// the protocol version) and refuses it with server busy (5.0 0x89,
/// 3.1.1 return code 3 server unavailable).
pub async fn refuse_busy<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let mut buf = BytesMut::with_capacity(512);
    let read = async {
        loop {
            match wire::decode_first(&mut buf, 65_536) {
                Ok((version, _)) => return Some(version),
                Err(DecodeError::Incomplete) => {}
                Err(_) => return None,
            }
            match stream.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => return None,
            }
        }
    };
    if let Ok(Some(version)) = tokio::time::timeout(CONNECT_TIMEOUT, read).await {
        let mut out = BytesMut::new();
        wire::encode(
            version,
            &Outbound::ConnAck {
                session_present: false,
                reason: Reason::ServerBusy,
                receive_maximum: 0,
                max_packet_bytes: 0,
                assigned_client_id: None,
            },
            &mut out,
        );
        let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&out)).await;
    }
    let _ = stream.shutdown().await;
}
