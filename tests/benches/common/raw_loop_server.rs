//! A QUIC server on quinn-proto driven by one loop on one thread: every
//! connection's protocol work (decryption, stream reads, ACKs, timers) runs
//! in the loop that reads the socket, with receives batched (recvmmsg and
//! GRO through quinn-udp) and each connection's transmits made once per
//! batch. The alternative to quinn's model (a task per connection, woken
//! per datagram) for the raw fan-in comparison ([`super::raw_fan_in`]);
//! benchmark code only.

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn_proto::{
    ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig, ReadError, StreamId,
};

/// Receive buffers per `recvmmsg`.
const BATCH: usize = 32;
/// Bytes of one receive buffer (a GRO train).
const BUFFER: usize = 64 * 1024;

struct Conn {
    conn: quinn_proto::Connection,
    streams: Vec<StreamId>,
    finished: bool,
}

/// Counters the loop updates.
pub struct Counters {
    pub received: Arc<AtomicU64>,
    pub finished: Arc<AtomicUsize>,
    pub last: Arc<Mutex<Option<Instant>>>,
}

/// Serves on `socket` until `stop` is set, on a current-thread tokio
/// runtime of its own (only for the socket's readiness and the timer
/// sleep).
pub fn serve(
    socket: UdpSocket,
    server: quinn::ServerConfig,
    counters: Counters,
    stop: Arc<AtomicBool>,
) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("loop runtime")
        .block_on(serve_on(socket, server, counters, stop));
}

async fn serve_on(
    socket: UdpSocket,
    server: quinn::ServerConfig,
    counters: Counters,
    stop: Arc<AtomicBool>,
) {
    socket.set_nonblocking(true).expect("non-blocking socket");
    let state = UdpSocketState::new((&socket).into()).expect("socket state");
    let socket = tokio::net::UdpSocket::from_std(socket).expect("tokio socket");
    let mut endpoint = Endpoint::new(
        Arc::new(EndpointConfig::default()),
        Some(Arc::new(server)),
        true,
        None,
    );
    let mut conns: HashMap<ConnectionHandle, Conn> = HashMap::new();
    let mut storage = vec![0u8; BATCH * BUFFER];
    let mut metas = [RecvMeta::default(); BATCH];
    let mut out = Vec::with_capacity(BUFFER);
    let mut dirty: Vec<ConnectionHandle> = Vec::new();
    let gso = state.max_gso_segments().max(1);
    let send = |out: &[u8], t: &quinn_proto::Transmit| {
        let transmit = Transmit {
            destination: t.destination,
            ecn: t
                .ecn
                .and_then(|e| quinn::udp::EcnCodepoint::from_bits(e as u8)),
            contents: &out[..t.size],
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        };
        // A full socket buffer drops the datagram, as a network would.
        let _ = state.send((&socket).into(), &transmit);
    };
    let mut last_timer_scan = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let received = {
            let mut bufs: Vec<IoSliceMut<'_>> =
                storage.chunks_mut(BUFFER).map(IoSliceMut::new).collect();
            socket.try_io(tokio::io::Interest::READABLE, || {
                state.recv((&socket).into(), &mut bufs, &mut metas)
            })
        };
        if matches!(&received, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
            let now = Instant::now();
            let wait = conns
                .values_mut()
                .filter_map(|c| c.conn.poll_timeout())
                .min()
                .map_or(Duration::from_millis(5), |t| {
                    t.saturating_duration_since(now)
                        .min(Duration::from_millis(5))
                });
            // Nothing queued: wait for a datagram or the next timer.
            tokio::select! {
                _ = socket.readable() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        let now = Instant::now();
        if let Ok(n) = received {
            for (i, meta) in metas.iter().enumerate().take(n) {
                let start = i * BUFFER;
                let mut data = BytesMut::from(&storage[start..start + meta.len]);
                let stride = meta.stride.max(1);
                while !data.is_empty() {
                    let datagram = data.split_to(stride.min(data.len()));
                    let ecn = meta
                        .ecn
                        .and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8));
                    out.clear();
                    match endpoint.handle(now, meta.addr, meta.dst_ip, ecn, datagram, &mut out) {
                        Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                            if let Some(c) = conns.get_mut(&ch) {
                                c.conn.handle_event(event);
                                dirty.push(ch);
                            }
                        }
                        Some(DatagramEvent::NewConnection(incoming)) => {
                            out.clear();
                            match endpoint.accept(incoming, now, &mut out, None) {
                                Ok((ch, conn)) => {
                                    conns.insert(
                                        ch,
                                        Conn {
                                            conn,
                                            streams: Vec::new(),
                                            finished: false,
                                        },
                                    );
                                    dirty.push(ch);
                                }
                                Err(e) => {
                                    if let Some(t) = e.response {
                                        send(&out, &t);
                                    }
                                }
                            }
                        }
                        Some(DatagramEvent::Response(t)) => send(&out, &t),
                        None => {}
                    }
                }
            }
        }
        if now.duration_since(last_timer_scan) >= Duration::from_millis(1) {
            last_timer_scan = now;
            for (ch, c) in &mut conns {
                if c.conn.poll_timeout().is_some_and(|t| t <= now) {
                    c.conn.handle_timeout(now);
                    dirty.push(*ch);
                }
            }
        }
        dirty.sort_unstable_by_key(|ch| ch.0);
        dirty.dedup();
        for ch in dirty.drain(..) {
            let Some(c) = conns.get_mut(&ch) else {
                continue;
            };
            while let Some(event) = c.conn.poll_endpoint_events() {
                if let Some(back) = endpoint.handle_event(ch, event) {
                    c.conn.handle_event(back);
                }
            }
            while c.conn.poll().is_some() {}
            while let Some(id) = c.conn.streams().accept(Dir::Uni) {
                c.streams.push(id);
            }
            let mut ended = false;
            for &id in &c.streams {
                let mut stream = c.conn.recv_stream(id);
                let Ok(mut chunks) = stream.read(true) else {
                    continue;
                };
                loop {
                    match chunks.next(usize::MAX) {
                        Ok(Some(chunk)) => {
                            counters
                                .received
                                .fetch_add(chunk.bytes.len() as u64, Ordering::Relaxed);
                        }
                        Ok(None) => {
                            ended = true;
                            break;
                        }
                        Err(ReadError::Blocked) => break,
                        Err(_) => break,
                    }
                }
                let _ = chunks.finalize();
            }
            if ended && !c.finished {
                c.finished = true;
                *counters.last.lock().expect("last") = Some(Instant::now());
                counters.finished.fetch_add(1, Ordering::SeqCst);
            }
            loop {
                out.clear();
                match c.conn.poll_transmit(now, gso, &mut out) {
                    Some(t) => send(&out, &t),
                    None => break,
                }
            }
            if c.conn.is_drained() {
                conns.remove(&ch);
            }
        }
    }
}
