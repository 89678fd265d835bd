//! Child processes of tests: locating the workspace's binaries, starting a
//! named process (stdout discarded, or both streams appended to a log
//! file), waiting for it to be ready, SIGKILL, and SIGTERM with a bounded
//! wait for its exit code.

use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long [`Proc::terminate`] waits for an exit after SIGTERM.
pub const TERMINATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Path of a workspace binary next to the running test executable
/// (`target/{profile}/{name}`). `cargo test --workspace` / `cargo nextest run
/// --workspace` build them, since their packages have integration tests.
///
/// # Panics
/// If the binary is missing, naming the command that builds it.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/{profile}/deps");
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo nextest run --workspace` (or `cargo build --workspace` first)",
        path.display()
    );
    path
}

/// A child process that is SIGKILLed when dropped, and can be started
/// again with the same command.
pub struct Proc {
    name: &'static str,
    command: Command,
    child: Option<Child>,
}

impl Proc {
    /// A process that runs `command` once started (stdout discarded, stderr
    /// inherited).
    pub fn new(name: &'static str, mut command: Command) -> Proc {
        command.stdout(Stdio::null()).stderr(Stdio::inherit());
        Proc::with_stdio(name, command)
    }

    /// A process started with `command` as it is (its stdio included).
    pub fn with_stdio(name: &'static str, command: Command) -> Proc {
        Proc {
            name,
            command,
            child: None,
        }
    }

    /// A process whose stdout and stderr are appended to `log` (created if
    /// missing), for long runs whose output is read afterwards.
    ///
    /// # Errors
    /// If `log` cannot be opened for appending.
    pub fn logged(name: &'static str, mut command: Command, log: &Path) -> std::io::Result<Proc> {
        let log = OpenOptions::new().create(true).append(true).open(log)?;
        command.stdout(log.try_clone()?).stderr(log);
        Ok(Proc::with_stdio(name, command))
    }

    /// Sets an environment variable for the next starts.
    pub fn env(&mut self, key: &str, value: &str) {
        self.command.env(key, value);
    }

    /// Starts the process (again).
    ///
    /// # Panics
    /// If it is already running or cannot be spawned.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        self.child = Some(self.command.spawn().expect("spawn"));
    }

    /// SIGKILL and reap (nothing if it is not running).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill(&mut child);
        }
    }

    /// SIGTERM, then wait (at most [`TERMINATE_TIMEOUT`]) for a clean exit;
    /// returns the exit code (`None` if a signal ended it or it was not
    /// running).
    ///
    /// # Panics
    /// If it is still running after the timeout (it is SIGKILLed first).
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        match wait_exit(&mut child, TERMINATE_TIMEOUT) {
            Some(code) => code,
            None => panic!(
                "{} did not exit within {} s of SIGTERM",
                self.name,
                TERMINATE_TIMEOUT.as_secs()
            ),
        }
    }

    /// Waits (bounded by `limit`) for the process to exit on its own and
    /// returns its exit code (`None` if a signal ended it).
    ///
    /// # Panics
    /// If it is still running after `limit` (it is SIGKILLed first).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        match wait_exit(&mut child, limit) {
            Some(code) => code,
            None => panic!("{} did not exit within {limit:?}", self.name),
        }
    }

    /// The running process's id (`None` when it is not running).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it is running (as far as this handle knows).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// How it exited, if it was started and has exited since on its own
    /// (reaped here; [`Proc::is_running`] still says it was started until
    /// [`Proc::kill`] or [`Proc::terminate`]).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGKILL `child` and reap it; errors (it already exited) are ignored.
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Polls `child` every 50 ms until it exits or `limit` passes: its exit
/// code (`Some(None)` if a signal ended it), or `None` when it was still
/// running, in which case it is SIGKILLed and reaped.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<Option<i32>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status.code());
        }
        if Instant::now() > deadline {
            kill(child);
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `cmd` to its end with stdout and stderr captured (read while it
/// runs, so a chatty child cannot fill a pipe and stall).
///
/// # Panics
/// If it cannot be spawned, or has not exited within `limit` (it is then
/// SIGKILLed), naming the program.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    let pid = child.id().to_string();
    let (done, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match output.recv_timeout(limit) {
        Ok(output) => output.unwrap_or_else(|e| panic!("{program}'s output: {e}")),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("{program} did not exit within {limit:?}");
        }
    }
}

/// Polls `ready` every 50 ms until it holds.
///
/// # Panics
/// If it does not within `limit`, with `what` in the message.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until something accepts TCP connections on `addr` (a server's
/// readiness).
///
/// # Panics
/// If nothing does within `limit`, with `what` in the message.
pub fn wait_for_tcp(what: &str, addr: SocketAddr, limit: Duration) {
    wait_until(what, limit, || TcpStream::connect(addr).is_ok());
}
