//! A small HTTP/1.1 fault proxy for S3 tests: it sits between the tier
//! service and a real S3 server (moto) and, on a seeded schedule, answers a
//! request with 500 or 503, resets the connection (before the request
//! reaches the server, in the middle of its body, or after the server
//! handled it), cuts a response short, or stalls until the client's request
//! timeout fires. Every other request is relayed unchanged.
//!
//! One request per connection: the proxy adds `Connection: close` both
//! ways, so a fault never leaks into a later request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Relayed unchanged.
    Pass,
    /// `500 Internal Server Error` (request not relayed).
    Status500,
    /// `503 Slow Down` (request not relayed).
    Status503,
    /// Connection reset after the request head, before relaying.
    ResetBeforeRelay,
    /// Connection reset after half of the request body (not relayed).
    ResetMidBody,
    /// Relayed and handled by the server; the client gets a reset instead
    /// of the response.
    ResetAfterServer,
    /// Relayed; the client gets the response head and half of its body,
    /// then a reset.
    TruncateResponse,
    /// Nothing happens until the stall time passes; then a reset.
    Stall,
}

/// Every fault kind, in the order the schedule cycles through them.
pub const FAULT_KINDS: [Fault; 7] = [
    Fault::Status503,
    Fault::ResetMidBody,
    Fault::Status500,
    Fault::ResetAfterServer,
    Fault::TruncateResponse,
    Fault::ResetBeforeRelay,
    Fault::Stall,
];

/// The seeded schedule: request `n` (in arrival order) gets a fault with
/// probability `percent`, never more than `max_in_a_row` in a row; fault
/// kinds cycle through [`FAULT_KINDS`] from a seeded start, so every kind
/// shows up once enough requests have passed.
#[derive(Debug)]
struct Schedule {
    state: u64,
    percent: u64,
    max_in_a_row: u32,
    in_a_row: u32,
    next_kind: usize,
    /// While false every request passes (set up the bucket first).
    armed: bool,
    /// Faults for the first request whose line contains the pattern, used
    /// once each, before the random schedule.
    forced: Vec<(String, Fault)>,
}

impl Schedule {
    fn next(&mut self, request: &str) -> Fault {
        if self.armed
            && let Some(i) = self
                .forced
                .iter()
                .position(|(p, _)| request.contains(p.as_str()))
        {
            return self.forced.remove(i).1;
        }
        self.state = self
            .state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let roll = (self.state >> 33) % 100;
        if !self.armed || roll >= self.percent || self.in_a_row >= self.max_in_a_row {
            self.in_a_row = 0;
            return Fault::Pass;
        }
        self.in_a_row += 1;
        let kind = FAULT_KINDS[self.next_kind % FAULT_KINDS.len()];
        self.next_kind += 1;
        kind
    }
}

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Arrival number.
    pub n: u64,
    /// `METHOD /path?query`.
    pub request: String,
    /// What was done.
    pub fault: Fault,
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    schedule: Arc<Mutex<Schedule>>,
    log: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 in front of `upstream`, disarmed. Must be
    /// called inside a tokio runtime.
    pub async fn start(upstream: SocketAddr, seed: u64, percent: u64, stall: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let schedule = Arc::new(Mutex::new(Schedule {
            state: seed,
            percent,
            max_in_a_row: 3,
            in_a_row: 0,
            next_kind: (seed % FAULT_KINDS.len() as u64) as usize,
            armed: false,
            forced: Vec::new(),
        }));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let counter = Arc::new(AtomicU64::new(0));
        let task = {
            let (schedule, log, stop) = (schedule.clone(), log.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let (schedule, log) = (schedule.clone(), log.clone());
                    tokio::spawn(async move {
                        let _ = handle(client, upstream, n, &schedule, &log, stall).await;
                    });
                }
            })
        };
        FaultProxy {
            addr,
            schedule,
            log,
            stop,
            task,
        }
    }

    /// Starts injecting faults.
    pub fn arm(&self) {
        self.schedule.lock().unwrap().armed = true;
    }

    /// Gives the first request whose line (`METHOD /path?query`) contains
    /// `pattern` the fault `fault` (once), whatever the schedule says.
    pub fn force(&self, pattern: &str, fault: Fault) {
        self.schedule
            .lock()
            .unwrap()
            .forced
            .push((pattern.to_owned(), fault));
    }

    /// Stops injecting faults.
    pub fn disarm(&self) {
        self.schedule.lock().unwrap().armed = false;
    }

    /// Every request seen so far.
    pub fn log(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

/// Reads until the end of an HTTP head (`\r\n\r\n`); returns the head and
/// whatever followed it. `None` on EOF before a complete head.
async fn read_head(
    stream: &mut (impl AsyncRead + Unpin),
) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            let rest = buf[end + 4..].to_vec();
            return Ok(Some((head, rest)));
        }
        if buf.len() > 256 * 1024 {
            return Err(std::io::Error::other("HTTP head too long"));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn content_length(head: &str) -> Option<u64> {
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

/// The head with any `Connection` header replaced by `Connection: close`.
fn with_close(head: &str) -> String {
    let mut out = String::with_capacity(head.len() + 20);
    for line in head.trim_end_matches("\r\n").split("\r\n") {
        let is_connection = line
            .split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("connection"));
        if !is_connection {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

fn reset(stream: TcpStream) {
    // SO_LINGER 0: close() sends RST.
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Reads the rest of a body of `len` bytes of which `have` arrived.
async fn drain(stream: &mut TcpStream, mut left: u64) -> std::io::Result<()> {
    let mut chunk = [0u8; 65536];
    while left > 0 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        left = left.saturating_sub(n as u64);
    }
    Ok(())
}

async fn handle(
    mut client: TcpStream,
    upstream: SocketAddr,
    n: u64,
    schedule: &Mutex<Schedule>,
    log: &Mutex<Vec<Seen>>,
    stall: Duration,
) -> std::io::Result<()> {
    let Some((head, early_body)) = read_head(&mut client).await? else {
        return Ok(());
    };
    let request = head
        .lines()
        .next()
        .unwrap_or("")
        .trim_end_matches(" HTTP/1.1")
        .to_owned();
    let fault = schedule.lock().unwrap().next(&request);
    log.lock().unwrap().push(Seen { n, request, fault });
    let body_len = content_length(&head).unwrap_or(0);
    let body_left = body_len.saturating_sub(early_body.len() as u64);
    match fault {
        Fault::Status500 | Fault::Status503 => {
            drain(&mut client, body_left).await?;
            let (status, code) = if fault == Fault::Status500 {
                ("500 Internal Server Error", "InternalError")
            } else {
                ("503 Slow Down", "SlowDown")
            };
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected by the fault proxy</Message></Error>"
            );
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            client.write_all(response.as_bytes()).await?;
            client.shutdown().await?;
            return Ok(());
        }
        Fault::ResetBeforeRelay => {
            reset(client);
            return Ok(());
        }
        Fault::ResetMidBody => {
            let half = body_len / 2;
            let have = early_body.len() as u64;
            if half > have {
                drain(&mut client, half - have).await?;
            }
            reset(client);
            return Ok(());
        }
        Fault::Stall => {
            tokio::time::sleep(stall).await;
            reset(client);
            return Ok(());
        }
        Fault::Pass | Fault::ResetAfterServer | Fault::TruncateResponse => {}
    }
    // Relay the request.
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(with_close(&head).as_bytes()).await?;
    server.write_all(&early_body).await?;
    let mut left = body_left;
    let mut chunk = vec![0u8; 65536];
    while left > 0 {
        let want = chunk.len().min(left as usize);
        let n = client.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Ok(());
        }
        server.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    // The response: the server closes after it (Connection: close).
    let Some((response_head, mut response_body)) = read_head(&mut server).await? else {
        reset(client);
        return Ok(());
    };
    server.read_to_end(&mut response_body).await?;
    match fault {
        Fault::ResetAfterServer => reset(client),
        Fault::TruncateResponse => {
            client
                .write_all(with_close(&response_head).as_bytes())
                .await?;
            client
                .write_all(&response_body[..response_body.len() / 2])
                .await?;
            client.flush().await?;
            reset(client);
        }
        _ => {
            client
                .write_all(with_close(&response_head).as_bytes())
                .await?;
            client.write_all(&response_body).await?;
            client.shutdown().await?;
        }
    }
    Ok(())
}
