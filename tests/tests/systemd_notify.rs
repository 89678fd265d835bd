//! `Type=notify` services: the broker and the edge agent tell systemd they
//! are ready, send watchdog keep-alives at half of `WatchdogSec`, announce
//! stopping on SIGTERM and exit 0. systemd is played by a Unix datagram
//! socket named in `NOTIFY_SOCKET`.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use tributary_test_support::process::Proc;
use tributary_tests::cluster::Pair;

fn messages_until(socket: &UnixDatagram, want: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = text.lines().any(|l| l == want);
            seen.push(text);
            if done {
                return seen;
            }
        }
    }
    panic!("no {want} within {limit:?}; got {seen:?}");
}

fn check(proc: &mut Proc, socket: &UnixDatagram) {
    proc.start();
    let start = messages_until(socket, "READY=1", Duration::from_secs(30));
    assert!(start.iter().any(|m| m.contains("READY=1")));
    messages_until(socket, "WATCHDOG=1", Duration::from_secs(5));
    messages_until(socket, "WATCHDOG=1", Duration::from_secs(5));
    assert_eq!(proc.terminate(), Some(0));
    // STOPPING=1 was sent before the exit.
    let mut buf = [0u8; 4096];
    let mut stopping = false;
    while let Ok(n) = socket.recv(&mut buf) {
        stopping |= String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1");
    }
    assert!(stopping, "no STOPPING=1 before exit");
}

#[test]
fn broker_and_edge_notify_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::new(dir.path(), "event_stream", None);
    for (name, proc) in [("broker", &mut pair.broker), ("edge", &mut pair.edge)] {
        let path = dir.path().join(format!("{name}.notify"));
        let socket = UnixDatagram::bind(&path).expect("bind notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        proc.env("NOTIFY_SOCKET", &path.display().to_string());
        proc.env("WATCHDOG_USEC", "400000");
        check(proc, &socket);
    }
}
