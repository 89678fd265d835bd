//! A moto server (an in-memory S3) for the S3 tests, on a free loopback
//! port. The tests need it: without it they fail, naming the tool and how
//! to get it (`./scripts/test` and `.ci/run` install it).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::ports::free_tcp;
use crate::process::{kill, wait_for_tcp};

/// The variable naming the `moto_server` binary.
pub const MOTO_SERVER_ENV: &str = "TRIB_TEST_MOTO_SERVER";

/// How long the server may take to accept connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running `moto_server`; SIGKILLed when dropped.
pub struct Moto {
    child: Child,
    addr: SocketAddr,
}

impl Moto {
    /// Starts the `moto_server` that [`MOTO_SERVER_ENV`] names and waits
    /// until it accepts connections.
    ///
    /// # Panics
    /// If the variable is unset (the message says how to install moto), the
    /// binary cannot be started, or it does not listen within
    /// [`START_TIMEOUT`].
    pub fn start() -> Moto {
        let Some(binary) = std::env::var_os(MOTO_SERVER_ENV) else {
            panic!(
                "this test needs moto's S3 server (moto_server) and {MOTO_SERVER_ENV} is not set. \
                 Run the tests with ./scripts/test (it installs moto), or install it yourself: \
                 python3 -m venv /tmp/tributary-moto && \
                 /tmp/tributary-moto/bin/pip install 'moto[server]==5.2.5' && \
                 export {MOTO_SERVER_ENV}=/tmp/tributary-moto/bin/moto_server"
            );
        };
        let binary = binary.to_string_lossy().into_owned();
        Moto::start_binary(&binary)
    }

    /// Starts `binary` (a `moto_server`) on a free port of 127.0.0.1 and
    /// waits until it accepts connections.
    ///
    /// # Panics
    /// If it cannot be started or does not listen within [`START_TIMEOUT`].
    pub fn start_binary(binary: &str) -> Moto {
        let addr = free_tcp();
        let child = Command::new(binary)
            .args(["-H", "127.0.0.1", "-p", &addr.port().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {binary} (moto_server, named by {MOTO_SERVER_ENV}): {e}")
            });
        let moto = Moto { child, addr };
        wait_for_tcp("moto_server listening", addr, START_TIMEOUT);
        moto
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's process id (a test stops and resumes it with SIGSTOP /
    /// SIGCONT to make the object store unreachable).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The S3 endpoint URL, `http://127.0.0.1:{port}`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}
