//! Version-neutral MQTT packets over rumqttc's `mqttbytes` codec (3.1.1 =
//! `v4`, 5.0 = `v5`): the listener's state machine sees [`Inbound`] and
//! answers [`Outbound`]; this module is the only place that names the
//! codec's types. Framing, limits and validation are the codec's; the one
//! byte read by hand is a CONNECT's flags, which the codec drops before
//! the rules it does not check ([`check_connect`]) can see them.

use bytes::{Bytes, BytesMut};
use rumqttc::mqttbytes::{self as v4b, v4};
use rumqttc::v5::mqttbytes::{self as v5b, v5};

/// The protocol of a connection, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// MQTT 3.1.1 (protocol level 4).
    V311,
    /// MQTT 5.0 (protocol level 5).
    V5,
}

/// A CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectIn {
    /// Its protocol.
    pub version: Version,
    /// Client identifier (may be empty).
    pub client_id: String,
    /// Clean session (3.1.1) / clean start (5).
    pub clean_start: bool,
    /// Session expiry, s: 3.1.1 `clean_session = false` is "never"
    /// (`u32::MAX`), `true` is 0; 5.0 the property (default 0).
    pub session_expiry_s: u32,
    /// Keep alive, s (0: none).
    pub keep_alive_s: u16,
    /// Username and password, if sent.
    pub login: Option<(String, String)>,
}

/// A PUBLISH from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishIn {
    /// 0, 1 or 2.
    pub qos: u8,
    /// DUP flag: a resend.
    pub dup: bool,
    /// Retain flag (stored as a header; the agent keeps no retained state).
    pub retain: bool,
    /// Topic name bytes as sent (UTF-8 is checked by the state machine).
    pub topic: Bytes,
    /// Packet identifier (0 for QoS 0).
    pub pkid: u16,
    /// Payload: the record value, unchanged.
    pub payload: Bytes,
    /// MQTT 5 user properties.
    pub user_properties: Vec<(String, String)>,
    /// MQTT 5 content type.
    pub content_type: Option<String>,
    /// MQTT 5 topic alias (not supported: refused).
    pub topic_alias: Option<u16>,
}

/// A packet from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// CONNECT.
    Connect(ConnectIn),
    /// PUBLISH.
    Publish(PublishIn),
    /// PUBREL with its packet id.
    PubRel(u16),
    /// PINGREQ.
    PingReq,
    /// DISCONNECT; a 5.0 one may carry a new session expiry interval, s
    /// (MQTT 5.0 §3.14.2.2.2; 0 ends the session with this connection).
    Disconnect {
        /// The new session expiry interval, if the DISCONNECT sets one.
        session_expiry_s: Option<u32>,
    },
    /// SUBSCRIBE: packet id and number of filters.
    Subscribe(u16, usize),
    /// UNSUBSCRIBE: packet id and number of filters.
    Unsubscribe(u16, usize),
    /// Anything a client must not send to this server (CONNACK, SUBACK, a
    /// second CONNECT, PUBACK for a publish never sent, AUTH...).
    Unexpected(&'static str),
}

/// Why a byte stream is not a packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// More bytes needed.
    #[error("incomplete packet")]
    Incomplete,
    /// Remaining length over the limit, bytes.
    #[error("packet of {size} bytes over the limit of {max}")]
    TooLarge {
        /// Announced remaining length.
        size: usize,
        /// The limit.
        max: u32,
    },
    /// A CONNECT of a protocol this agent does not speak.
    #[error("unsupported protocol (name or level {0:?})")]
    BadProtocol(Option<u8>),
    /// Anything else the codec refused.
    #[error("malformed packet: {0}")]
    Malformed(String),
}

/// A reason code (MQTT 5 numbering; 3.1.1 connections get the closest
/// CONNACK return code or a closed connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reason {
    /// 0x00.
    Success = 0x00,
    /// 0x80.
    UnspecifiedError = 0x80,
    /// 0x81.
    MalformedPacket = 0x81,
    /// 0x82.
    ProtocolError = 0x82,
    /// 0x83: e.g. SUBSCRIBE (this agent only ingests).
    ImplementationSpecific = 0x83,
    /// 0x84 (CONNACK only).
    UnsupportedProtocolVersion = 0x84,
    /// 0x85 (CONNACK only).
    ClientIdNotValid = 0x85,
    /// 0x86 (CONNACK only).
    BadUserNameOrPassword = 0x86,
    /// 0x87.
    NotAuthorized = 0x87,
    /// 0x89: too many connections.
    ServerBusy = 0x89,
    /// 0x8B.
    ServerShuttingDown = 0x8B,
    /// 0x8E (DISCONNECT only): a new connection with this client id took
    /// the session over.
    SessionTakenOver = 0x8E,
    /// 0x90: the topic maps to no Tributary topic.
    TopicNameInvalid = 0x90,
    /// 0x92 (PUBCOMP only).
    PacketIdNotFound = 0x92,
    /// 0x93.
    ReceiveMaximumExceeded = 0x93,
    /// 0x94.
    TopicAliasInvalid = 0x94,
    /// 0x95.
    PacketTooLarge = 0x95,
    /// 0x97: a full disk budget.
    QuotaExceeded = 0x97,
}

/// A packet to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    /// CONNACK; 5.0 also announces the limits.
    ConnAck {
        /// A stored session was resumed.
        session_present: bool,
        /// The outcome.
        reason: Reason,
        /// Receive maximum announced (5.0).
        receive_maximum: u16,
        /// Maximum packet size announced (5.0), bytes.
        max_packet_bytes: u32,
        /// The client id given to a 5.0 client that sent an empty one
        /// (Assigned Client Identifier: MQTT 5.0, section 3.2.2.3.7, "the
        /// Server MUST return" it).
        assigned_client_id: Option<String>,
    },
    /// PUBACK.
    PubAck(u16, Reason),
    /// PUBREC.
    PubRec(u16, Reason),
    /// PUBCOMP.
    PubComp(u16, Reason),
    /// PINGRESP.
    PingResp,
    /// SUBACK refusing every filter.
    SubAckRefused(u16, usize),
    /// UNSUBACK.
    UnsubAck(u16, usize),
    /// DISCONNECT (5.0 only; 3.1.1 just closes).
    Disconnect(Reason),
}

fn v4_error(e: v4b::Error) -> DecodeError {
    match e {
        v4b::Error::InsufficientBytes(_) => DecodeError::Incomplete,
        v4b::Error::PayloadSizeLimitExceeded(size) => DecodeError::TooLarge { size, max: 0 },
        v4b::Error::InvalidProtocol => DecodeError::BadProtocol(None),
        v4b::Error::InvalidProtocolLevel(n) => DecodeError::BadProtocol(Some(n)),
        other => DecodeError::Malformed(other.to_string()),
    }
}

fn v5_error(e: v5b::Error) -> DecodeError {
    match e {
        v5b::Error::InsufficientBytes(_) => DecodeError::Incomplete,
        v5b::Error::PayloadSizeLimitExceeded { pkt_size, max } => DecodeError::TooLarge {
            size: pkt_size,
            max,
        },
        v5b::Error::InvalidProtocol => DecodeError::BadProtocol(None),
        v5b::Error::InvalidProtocolLevel(n) => DecodeError::BadProtocol(Some(n)),
        other => DecodeError::Malformed(other.to_string()),
    }
}

/// Decodes the first packet of a connection, which must be a CONNECT of
/// level 4 or 5, consuming it from `buf`.
///
/// # Errors
/// [`DecodeError`]; [`DecodeError::Incomplete`] leaves `buf` untouched.
pub fn decode_first(buf: &mut BytesMut, max: u32) -> Result<(Version, Inbound), DecodeError> {
    whole_frame(buf, max)?;
    let flags = connect_flags(buf);
    let mut probe = buf.clone();
    match v5::Packet::read(&mut probe, Some(max)) {
        Ok(packet) => {
            if let v5::Packet::Connect(c, will, login) = &packet {
                check_connect(
                    Version::V5,
                    flags,
                    &c.client_id,
                    will.as_ref().map(|w| &w.topic[..]),
                    login.as_ref().map(|l| l.username.as_str()),
                )?;
            }
            *buf = probe;
            Ok((Version::V5, from_v5(packet)))
        }
        Err(v5b::Error::InvalidProtocolLevel(4)) => {
            let packet =
                v4::Packet::read(buf, max as usize).map_err(|e| within_frame(v4_error(e)))?;
            if let v4::Packet::Connect(c) = &packet {
                check_connect(
                    Version::V311,
                    flags,
                    &c.client_id,
                    c.last_will.as_ref().map(|w| w.topic.as_bytes()),
                    c.login.as_ref().map(|l| l.username.as_str()),
                )?;
            }
            Ok((Version::V311, from_v4(packet)))
        }
        Err(e) => Err(within_frame(fix_max(v5_error(e), max))),
    }
}

/// The Connect Flags byte of the CONNECT frame at the start of `frame`
/// (MQTT 3.1.1 and 5.0 §3.1.2.3), `None` if the frame is too short.
///
/// The codec reads the flags and drops them, so the rules it does not
/// apply ([`check_connect`]) need this one byte from the frame itself:
/// after the packet type byte comes the remaining length, 1 to 4 bytes
/// of which all but the last have the 0x80 continuation bit (§2.2.3 /
/// §1.5.5), then the protocol name `00 04 "MQTT"` (6 bytes), the level
/// (1 byte) and the flags.
fn connect_flags(frame: &[u8]) -> Option<u8> {
    let length_bytes = frame.iter().skip(1).take(4).position(|b| b & 0x80 == 0)? + 1;
    frame.get(1 + length_bytes + 6 + 1).copied()
}

/// The CONNECT rules the codec (rumqttc 0.25) does not check, each a
/// malformed packet: the connection is closed without a CONNACK, as for
/// any other malformed CONNECT.
///
/// - the reserved flag (bit 0 of the Connect Flags) must be 0
///   ([MQTT-3.1.2-3], both versions);
/// - in 3.1.1, a password needs a user name ([MQTT-3.1.2-22]; 5.0 allows
///   a password alone);
/// - UTF-8 strings must not contain U+0000 ([MQTT-1.5.3-2], 5.0
///   [MQTT-1.5.4-2]): the client identifier and the user name. The agent
///   names a client that sent an empty identifier `"\0anonymous-N"`, so a
///   NUL in a client's own identifier could also take such a session over;
/// - the will topic is a topic name: UTF-8, not empty, no `+`, `#` or NUL
///   ([MQTT-3.1.3-10], [MQTT-3.3.2-2], [MQTT-4.7.3-1]; the will is not
///   published, but a CONNECT that carries an invalid one is malformed).
fn check_connect(
    version: Version,
    flags: Option<u8>,
    client_id: &str,
    will_topic: Option<&[u8]>,
    username: Option<&str>,
) -> Result<(), DecodeError> {
    let malformed = |why: &str| Err(DecodeError::Malformed(why.to_string()));
    let Some(flags) = flags else {
        return malformed("a CONNECT without its Connect Flags");
    };
    if flags & 0x01 != 0 {
        return malformed("the CONNECT's reserved flag is set [MQTT-3.1.2-3]");
    }
    if version == Version::V311 && flags & 0x40 != 0 && flags & 0x80 == 0 {
        return malformed("a CONNECT with a password but no user name [MQTT-3.1.2-22]");
    }
    if client_id.contains('\0') {
        return malformed("the client identifier contains U+0000 [MQTT-1.5.3-2]");
    }
    if username.is_some_and(|u| u.contains('\0')) {
        return malformed("the user name contains U+0000 [MQTT-1.5.3-2]");
    }
    if let Some(topic) = will_topic {
        let Ok(topic) = std::str::from_utf8(topic) else {
            return malformed("the will topic is not UTF-8");
        };
        if let Err(why) = crate::mqtt::mapping::check_topic_name(topic) {
            return Err(DecodeError::Malformed(format!("will topic: {why}")));
        }
    }
    Ok(())
}

/// Checks that `buf` starts with a whole packet as its fixed header frames
/// it (the same in 3.1.1 and 5.0), at most `max` bytes of remaining length:
/// [`DecodeError::Incomplete`] until then. Called before the codec reads a
/// packet, so that a codec's "insufficient bytes" is known to come from
/// inside a whole frame ([`within_frame`]), and what a client may make the
/// agent buffer is one frame of at most `max` bytes.
fn whole_frame(buf: &BytesMut, max: u32) -> Result<(), DecodeError> {
    match v5::check(buf.iter(), Some(max)) {
        Ok(_) => Ok(()),
        Err(e) => Err(fix_max(v5_error(e), max)),
    }
}

/// The codec's error for a packet [`whole_frame`] found complete: a field
/// that runs past the packet's end (e.g. a CONNECT without its property
/// length) is malformed, not a reason to wait for more bytes. Waiting made
/// the agent buffer without bound before any authentication, and drop a
/// malformed PUBLISH without a word.
fn within_frame(e: DecodeError) -> DecodeError {
    match e {
        DecodeError::Incomplete => {
            DecodeError::Malformed("a field runs past the end of its packet".into())
        }
        other => other,
    }
}

fn fix_max(e: DecodeError, max: u32) -> DecodeError {
    match e {
        DecodeError::TooLarge { size, .. } => DecodeError::TooLarge { size, max },
        other => other,
    }
}

/// Decodes the next packet of a `version` connection from `buf`.
///
/// # Errors
/// [`DecodeError`]; [`DecodeError::Incomplete`] leaves `buf` untouched.
pub fn decode(version: Version, buf: &mut BytesMut, max: u32) -> Result<Inbound, DecodeError> {
    whole_frame(buf, max)?;
    match version {
        Version::V311 => v4::Packet::read(buf, max as usize)
            .map(from_v4)
            .map_err(|e| within_frame(fix_max(v4_error(e), max))),
        Version::V5 => {
            // MQTT 5 §3.14.2.1: a DISCONNECT with reason 0x00 and no
            // properties may have remaining length 0 (paho sends that);
            // rumqttc 0.25's v5 reader refuses it (`PayloadRequired`).
            if buf.starts_with(&[0xE0, 0x00]) {
                let _ = buf.split_to(2);
                return Ok(Inbound::Disconnect {
                    session_expiry_s: None,
                });
            }
            v5::Packet::read(buf, Some(max))
                .map(from_v5)
                .map_err(|e| within_frame(fix_max(v5_error(e), max)))
        }
    }
}

fn from_v4(packet: v4::Packet) -> Inbound {
    match packet {
        v4::Packet::Connect(c) => Inbound::Connect(ConnectIn {
            version: Version::V311,
            client_id: c.client_id,
            clean_start: c.clean_session,
            session_expiry_s: if c.clean_session { 0 } else { u32::MAX },
            keep_alive_s: c.keep_alive,
            login: c.login.map(|l| (l.username, l.password)),
        }),
        v4::Packet::Publish(p) => Inbound::Publish(PublishIn {
            qos: p.qos as u8,
            dup: p.dup,
            retain: p.retain,
            topic: Bytes::from(p.topic.into_bytes()),
            pkid: p.pkid,
            payload: p.payload,
            user_properties: Vec::new(),
            content_type: None,
            topic_alias: None,
        }),
        v4::Packet::PubRel(r) => Inbound::PubRel(r.pkid),
        v4::Packet::PingReq => Inbound::PingReq,
        v4::Packet::Disconnect => Inbound::Disconnect {
            session_expiry_s: None,
        },
        v4::Packet::Subscribe(s) => Inbound::Subscribe(s.pkid, s.filters.len()),
        v4::Packet::Unsubscribe(u) => Inbound::Unsubscribe(u.pkid, u.topics.len()),
        other => Inbound::Unexpected(v4_name(&other)),
    }
}

fn v4_name(p: &v4::Packet) -> &'static str {
    match p {
        v4::Packet::ConnAck(_) => "CONNACK",
        v4::Packet::PubAck(_) => "PUBACK",
        v4::Packet::PubRec(_) => "PUBREC",
        v4::Packet::PubComp(_) => "PUBCOMP",
        v4::Packet::SubAck(_) => "SUBACK",
        v4::Packet::UnsubAck(_) => "UNSUBACK",
        v4::Packet::PingResp => "PINGRESP",
        _ => "unexpected packet",
    }
}

fn from_v5(packet: v5::Packet) -> Inbound {
    match packet {
        v5::Packet::Connect(c, _will, login) => {
            let expiry = c
                .properties
                .as_ref()
                .and_then(|p| p.session_expiry_interval)
                .unwrap_or(0);
            Inbound::Connect(ConnectIn {
                version: Version::V5,
                client_id: c.client_id,
                clean_start: c.clean_start,
                session_expiry_s: expiry,
                keep_alive_s: c.keep_alive,
                login: login.map(|l| (l.username, l.password)),
            })
        }
        v5::Packet::Publish(p) => {
            let (user_properties, content_type, topic_alias) = match p.properties {
                Some(props) => (props.user_properties, props.content_type, props.topic_alias),
                None => (Vec::new(), None, None),
            };
            Inbound::Publish(PublishIn {
                qos: p.qos as u8,
                dup: p.dup,
                retain: p.retain,
                topic: p.topic,
                pkid: p.pkid,
                payload: p.payload,
                user_properties,
                content_type,
                topic_alias,
            })
        }
        v5::Packet::PubRel(r) => Inbound::PubRel(r.pkid),
        v5::Packet::PingReq(_) => Inbound::PingReq,
        v5::Packet::Disconnect(d) => Inbound::Disconnect {
            session_expiry_s: d.properties.and_then(|p| p.session_expiry_interval),
        },
        v5::Packet::Subscribe(s) => Inbound::Subscribe(s.pkid, s.filters.len()),
        v5::Packet::Unsubscribe(u) => Inbound::Unsubscribe(u.pkid, u.filters.len()),
        v5::Packet::Auth(_) => Inbound::Unexpected("AUTH"),
        _ => Inbound::Unexpected("a packet only a server sends"),
    }
}

/// Appends `packet` to `out` for a `version` connection. A 3.1.1
/// DISCONNECT writes nothing (the server closes); a 3.1.1 PUBACK or
/// PUBREC with a failure reason must not be sent (the caller disconnects).
pub fn encode(version: Version, packet: &Outbound, out: &mut BytesMut) {
    // The packets written here are small and bounded (no payloads), so
    // the codec's outgoing size limit is set to the protocol maximum.
    const ANY: usize = 268_435_455;
    match version {
        Version::V311 => {
            if let Some(p) = v4_packet(packet) {
                let _ = p.write(out, ANY);
            }
        }
        Version::V5 => {
            let _ = v5_packet(packet).write(out, None);
        }
    }
}

fn v4_packet(packet: &Outbound) -> Option<v4::Packet> {
    Some(match *packet {
        Outbound::ConnAck {
            session_present,
            reason,
            ..
        } => {
            let code = match reason {
                Reason::Success => v4::ConnectReturnCode::Success,
                Reason::UnsupportedProtocolVersion => v4::ConnectReturnCode::RefusedProtocolVersion,
                Reason::ClientIdNotValid => v4::ConnectReturnCode::BadClientId,
                Reason::BadUserNameOrPassword => v4::ConnectReturnCode::BadUserNamePassword,
                Reason::NotAuthorized => v4::ConnectReturnCode::NotAuthorized,
                _ => v4::ConnectReturnCode::ServiceUnavailable,
            };
            v4::Packet::ConnAck(v4::ConnAck::new(
                code,
                session_present && reason == Reason::Success,
            ))
        }
        Outbound::PubAck(pkid, _) => v4::Packet::PubAck(v4::PubAck::new(pkid)),
        Outbound::PubRec(pkid, _) => v4::Packet::PubRec(v4::PubRec::new(pkid)),
        Outbound::PubComp(pkid, _) => v4::Packet::PubComp(v4::PubComp::new(pkid)),
        Outbound::PingResp => v4::Packet::PingResp,
        Outbound::SubAckRefused(pkid, n) => v4::Packet::SubAck(v4::SubAck::new(
            pkid,
            vec![v4::SubscribeReasonCode::Failure; n.max(1)],
        )),
        Outbound::UnsubAck(pkid, _) => v4::Packet::UnsubAck(v4::UnsubAck::new(pkid)),
        Outbound::Disconnect(_) => return None,
    })
}

fn v5_connect_code(reason: Reason) -> v5::ConnectReturnCode {
    use v5::ConnectReturnCode as C;
    match reason {
        Reason::Success => C::Success,
        Reason::MalformedPacket => C::MalformedPacket,
        Reason::ProtocolError => C::ProtocolError,
        Reason::UnsupportedProtocolVersion => C::UnsupportedProtocolVersion,
        Reason::ClientIdNotValid => C::ClientIdentifierNotValid,
        Reason::BadUserNameOrPassword => C::BadUserNamePassword,
        Reason::NotAuthorized => C::NotAuthorized,
        Reason::ServerBusy => C::ServerBusy,
        Reason::PacketTooLarge => C::PacketTooLarge,
        Reason::QuotaExceeded => C::QuotaExceeded,
        Reason::ServerShuttingDown => C::ServerUnavailable,
        _ => C::UnspecifiedError,
    }
}

fn v5_pub_reason(reason: Reason) -> v5::PubAckReason {
    use v5::PubAckReason as R;
    match reason {
        Reason::Success => R::Success,
        Reason::TopicNameInvalid => R::TopicNameInvalid,
        Reason::QuotaExceeded => R::QuotaExceeded,
        Reason::NotAuthorized => R::NotAuthorized,
        Reason::ImplementationSpecific => R::ImplementationSpecificError,
        _ => R::UnspecifiedError,
    }
}

fn v5_rec_reason(reason: Reason) -> v5::PubRecReason {
    use v5::PubRecReason as R;
    match reason {
        Reason::Success => R::Success,
        Reason::TopicNameInvalid => R::TopicNameInvalid,
        Reason::QuotaExceeded => R::QuotaExceeded,
        Reason::NotAuthorized => R::NotAuthorized,
        Reason::ImplementationSpecific => R::ImplementationSpecificError,
        _ => R::UnspecifiedError,
    }
}

fn v5_disconnect(reason: Reason) -> v5::DisconnectReasonCode {
    use v5::DisconnectReasonCode as D;
    match reason {
        Reason::Success => D::NormalDisconnection,
        Reason::MalformedPacket => D::MalformedPacket,
        Reason::ProtocolError => D::ProtocolError,
        Reason::ImplementationSpecific => D::ImplementationSpecificError,
        Reason::NotAuthorized => D::NotAuthorized,
        Reason::ServerBusy => D::ServerBusy,
        Reason::ServerShuttingDown => D::ServerShuttingDown,
        Reason::SessionTakenOver => D::SessionTakenOver,
        Reason::TopicNameInvalid => D::TopicNameInvalid,
        Reason::ReceiveMaximumExceeded => D::ReceiveMaximumExceeded,
        Reason::TopicAliasInvalid => D::TopicAliasInvalid,
        Reason::PacketTooLarge => D::PacketTooLarge,
        Reason::QuotaExceeded => D::QuotaExceeded,
        _ => D::UnspecifiedError,
    }
}

fn v5_packet(packet: &Outbound) -> v5::Packet {
    match *packet {
        Outbound::ConnAck {
            session_present,
            reason,
            receive_maximum,
            max_packet_bytes,
            ref assigned_client_id,
        } => {
            let properties = (reason == Reason::Success).then(|| v5::ConnAckProperties {
                receive_max: Some(receive_maximum),
                max_packet_size: Some(max_packet_bytes),
                // No retained state, no subscriptions, no aliases.
                retain_available: Some(0),
                topic_alias_max: Some(0),
                wildcard_subscription_available: Some(0),
                subscription_identifiers_available: Some(0),
                shared_subscription_available: Some(0),
                session_expiry_interval: None,
                max_qos: None,
                assigned_client_identifier: assigned_client_id.clone(),
                reason_string: None,
                user_properties: Vec::new(),
                server_keep_alive: None,
                response_information: None,
                server_reference: None,
                authentication_method: None,
                authentication_data: None,
            });
            v5::Packet::ConnAck(v5::ConnAck {
                session_present: session_present && reason == Reason::Success,
                code: v5_connect_code(reason),
                properties,
            })
        }
        Outbound::PubAck(pkid, reason) => v5::Packet::PubAck(v5::PubAck {
            pkid,
            reason: v5_pub_reason(reason),
            properties: None,
        }),
        Outbound::PubRec(pkid, reason) => v5::Packet::PubRec(v5::PubRec {
            pkid,
            reason: v5_rec_reason(reason),
            properties: None,
        }),
        Outbound::PubComp(pkid, reason) => v5::Packet::PubComp(v5::PubComp {
            pkid,
            reason: if reason == Reason::PacketIdNotFound {
                v5::PubCompReason::PacketIdentifierNotFound
            } else {
                v5::PubCompReason::Success
            },
            properties: None,
        }),
        Outbound::PingResp => v5::Packet::PingResp(v5::PingResp),
        Outbound::SubAckRefused(pkid, n) => v5::Packet::SubAck(v5::SubAck {
            pkid,
            return_codes: vec![v5::SubscribeReasonCode::ImplementationSpecific; n.max(1)],
            properties: None,
        }),
        Outbound::UnsubAck(pkid, n) => v5::Packet::UnsubAck(v5::UnsubAck {
            pkid,
            reasons: vec![v5::UnsubAckReason::NoSubscriptionExisted; n.max(1)],
            properties: None,
        }),
        Outbound::Disconnect(reason) => {
            v5::Packet::Disconnect(v5::Disconnect::new(v5_disconnect(reason)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(version: Version, packet: &Outbound) -> BytesMut {
        let mut out = BytesMut::new();
        encode(version, packet, &mut out);
        out
    }

    #[test]
    fn acknowledgements_are_what_the_codec_reads_back() {
        let bytes = round_trip(Version::V311, &Outbound::PubAck(7, Reason::Success));
        assert_eq!(&bytes[..], &[0x40, 2, 0, 7]);
        let mut bytes = round_trip(Version::V5, &Outbound::PubAck(7, Reason::QuotaExceeded));
        match v5::Packet::read(&mut bytes, None).expect("decodes") {
            v5::Packet::PubAck(ack) => {
                assert_eq!((ack.pkid, ack.reason), (7, v5::PubAckReason::QuotaExceeded));
            }
            other => panic!("{other:?}"),
        }
        let mut bytes = round_trip(
            Version::V5,
            &Outbound::ConnAck {
                session_present: true,
                reason: Reason::Success,
                receive_maximum: 16,
                max_packet_bytes: 4096,
                assigned_client_id: Some("anonymous-3".into()),
            },
        );
        match v5::Packet::read(&mut bytes, None).expect("decodes") {
            v5::Packet::ConnAck(ack) => {
                assert!(ack.session_present);
                let p = ack.properties.expect("properties");
                assert_eq!((p.receive_max, p.max_packet_size), (Some(16), Some(4096)));
                assert_eq!(p.assigned_client_identifier.as_deref(), Some("anonymous-3"));
            }
            other => panic!("{other:?}"),
        }
        // 3.1.1 has no DISCONNECT from the server: nothing is written.
        assert!(round_trip(Version::V311, &Outbound::Disconnect(Reason::ProtocolError)).is_empty());
    }

    #[test]
    fn first_packet_picks_the_version_and_refuses_other_levels() {
        let v311 = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 0];
        let mut buf = BytesMut::from(&v311[..]);
        let (version, packet) = decode_first(&mut buf, 1024).expect("CONNECT");
        assert_eq!(version, Version::V311);
        assert!(matches!(packet, Inbound::Connect(c) if c.clean_start && c.session_expiry_s == 0));
        assert!(buf.is_empty());
        let mut half = BytesMut::from(&v311[..5]);
        assert_eq!(decode_first(&mut half, 1024), Err(DecodeError::Incomplete));
        assert_eq!(half.len(), 5, "an incomplete packet is left in the buffer");
        let mut level3 = v311;
        level3[8] = 3;
        let mut buf = BytesMut::from(&level3[..]);
        assert_eq!(
            decode_first(&mut buf, 1024),
            Err(DecodeError::BadProtocol(Some(3)))
        );
        let mut buf = BytesMut::from(&v311[..]);
        assert!(matches!(
            decode_first(&mut buf, 8),
            Err(DecodeError::TooLarge { size: 12, max: 8 })
        ));
    }

    /// A packet whose fixed header frames it completely but whose content
    /// runs past its end is malformed. The codec says "insufficient bytes"
    /// for it, which was taken for "wait for more": a 5.0 CONNECT without
    /// its property length made the agent buffer whatever followed,
    /// without bound and before any authentication (a fresh-user trial
    /// grew the agent from 9 to 225 MiB), and a malformed 5.0 PUBLISH
    /// vanished without a DISCONNECT.
    #[test]
    fn a_field_past_the_end_of_its_packet_is_malformed() {
        // CONNECT level 5 whose packet ends after the keep-alive: no
        // property length, no client id.
        let connect = [0x10, 10, 0, 4, b'M', b'Q', b'T', b'T', 5, 2, 0, 60];
        let mut buf = BytesMut::from(&connect[..]);
        buf.extend_from_slice(&[0u8; 4096]);
        assert!(matches!(
            decode_first(&mut buf, 1024),
            Err(DecodeError::Malformed(_))
        ));
        // PUBLISH QoS 0, topic length 9 in a packet of 3 bytes.
        let mut buf = BytesMut::from(&[0x30u8, 3, 0, 9, b's'][..]);
        buf.extend_from_slice(&[0xC0, 0x00]);
        for version in [Version::V5, Version::V311] {
            assert!(
                matches!(
                    decode(version, &mut buf.clone(), 1024),
                    Err(DecodeError::Malformed(_))
                ),
                "{version:?}"
            );
        }
        // A frame not yet whole is still incomplete, however it starts.
        let mut part = BytesMut::from(&connect[..10]);
        assert_eq!(decode_first(&mut part, 1024), Err(DecodeError::Incomplete));
    }

    /// A 3.1.1 or 5.0 CONNECT with `flags`, client id `id` and then
    /// `rest` (will, user name, password as the flags say), keep-alive 60.
    pub(crate) fn connect_frame(level: u8, flags: u8, id: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', level, flags, 0, 60];
        if level == 5 {
            body.push(0); // no properties
        }
        body.extend_from_slice(&u16::try_from(id.len()).expect("short id").to_be_bytes());
        body.extend_from_slice(id);
        if level == 5 && flags & 0x04 != 0 {
            body.push(0); // no will properties
        }
        body.extend_from_slice(rest);
        let mut frame = vec![0x10];
        let mut len = body.len();
        loop {
            let byte = (len % 128) as u8;
            len /= 128;
            frame.push(if len > 0 { byte | 0x80 } else { byte });
            if len == 0 {
                break;
            }
        }
        frame.extend_from_slice(&body);
        frame
    }

    fn mqtt_string(s: &[u8]) -> Vec<u8> {
        let mut out = u16::try_from(s.len())
            .expect("short")
            .to_be_bytes()
            .to_vec();
        out.extend_from_slice(s);
        out
    }

    /// The CONNECT rules rumqttc's codec does not apply (MQTT 3.1.1 and
    /// 5.0 §3.1.2.3, §1.5.3, §3.1.3.3): each CONNECT below was accepted
    /// before; the same packet with the rule kept decodes.
    #[test]
    fn connect_rules_the_codec_skips_are_malformed() {
        let will = |topic: &[u8]| [mqtt_string(topic), mqtt_string(b"bye")].concat();
        let user = mqtt_string(b"u");
        let password = mqtt_string(b"p");
        let long_id = vec![b'x'; 300]; // a two-byte remaining length
        let cases: [(&str, u8, Vec<u8>, Vec<u8>); 7] = [
            // (what, flags, client id, will and login bytes)
            ("reserved flag", 0x03, b"c".to_vec(), vec![]),
            ("reserved flag, long id", 0x03, long_id.clone(), vec![]),
            ("NUL in client id", 0x02, b"\0anonymous-1".to_vec(), vec![]),
            ("will topic #", 0x06, b"c".to_vec(), will(b"a/#")),
            ("will topic +", 0x06, b"c".to_vec(), will(b"+/a")),
            ("empty will topic", 0x06, b"c".to_vec(), will(b"")),
            ("NUL in user name", 0x82, b"c".to_vec(), mqtt_string(b"u\0")),
        ];
        for level in [4u8, 5] {
            for (what, flags, id, rest) in &cases {
                let frame = connect_frame(level, *flags, id, rest);
                let result = decode_first(&mut BytesMut::from(&frame[..]), 1024);
                assert!(
                    matches!(result, Err(DecodeError::Malformed(_))),
                    "level {level}, {what}: {result:?}"
                );
            }
            let good = [
                connect_frame(level, 0x02, &long_id, &[]),
                connect_frame(level, 0x06, b"c", &will(b"a/b")),
                connect_frame(
                    level,
                    0xC2,
                    b"c",
                    &[user.clone(), password.clone()].concat(),
                ),
            ];
            for frame in good {
                let result = decode_first(&mut BytesMut::from(&frame[..]), 1024);
                assert!(
                    matches!(result, Ok((_, Inbound::Connect(_)))),
                    "level {level}: {result:?}"
                );
            }
        }
        // A password without a user name: malformed in 3.1.1
        // [MQTT-3.1.2-22], allowed in 5.0.
        let alone = |level| connect_frame(level, 0x42, b"c", &password);
        assert!(matches!(
            decode_first(&mut BytesMut::from(&alone(4)[..]), 1024),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            decode_first(&mut BytesMut::from(&alone(5)[..]), 1024),
            Ok((Version::V5, Inbound::Connect(_)))
        ));
    }

    #[test]
    fn an_empty_v5_disconnect_is_a_disconnect() {
        let mut buf = BytesMut::from(&[0xE0u8, 0x00, 0xC0, 0x00][..]);
        assert_eq!(
            decode(Version::V5, &mut buf, 1024),
            Ok(Inbound::Disconnect {
                session_expiry_s: None
            })
        );
        assert_eq!(decode(Version::V5, &mut buf, 1024), Ok(Inbound::PingReq));
    }
}
