//! The owner connections: the shared [`Routing`] (the I/O-free
//! [`RouteTable`] behind a lock, with a change signal the connections
//! wait on) and [`supervise`], which keeps one connection to each owner
//! address some topic is routed to. An owner connection runs exactly the
//! topics routed to it; when it cannot be made or is lost, its topics go
//! back to the bootstrap connection (which may redirect them again), and
//! it ends once no topic is routed to it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};

use super::routes::RouteTable;
use super::{Ended, Shared, connect_and_replicate, stopped};

/// The route table shared by every connection, and a signal that it
/// changed.
pub(super) struct Routing {
    table: Mutex<RouteTable>,
    changed: watch::Sender<u64>,
}

impl Default for Routing {
    fn default() -> Routing {
        Routing {
            table: Mutex::new(RouteTable::default()),
            changed: watch::channel(0).0,
        }
    }
}

impl Routing {
    fn table(&self) -> std::sync::MutexGuard<'_, RouteTable> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the table with `change` and wakes every connection.
    pub(super) fn with<R>(&self, change: impl FnOnce(&mut RouteTable) -> R) -> R {
        let result = change(&mut self.table());
        self.changed.send_modify(|version| *version += 1);
        result
    }

    /// A receiver that sees every change.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Whether `topic`'s stream starts, at `now`, on the connection dialled
    /// as `target` (`None`: bootstrap).
    pub(super) fn runs_on(&self, topic: &str, target: Option<&str>, now: Instant) -> bool {
        let table = self.table();
        table.target(topic) == target && table.may_start(topic, now)
    }

    /// The stream of `topic` got a `Welcome`.
    pub(super) fn resumed(&self, topic: &str) {
        // No wake-up needed: nothing changes where a topic runs.
        self.table().on_resumed(topic);
    }

    /// Whether some topic is routed to `addr`.
    pub(super) fn is_wanted(&self, addr: &str) -> bool {
        self.table().is_wanted(addr)
    }
}

/// How often [`supervise`] looks again without a change (an owner
/// connection that ended while a topic was routed to its address).
const SUPERVISE_TICK: Duration = Duration::from_secs(1);

/// Keeps one connection to each owner address some topic is routed to,
/// until shutdown; then waits for every one of them to end.
pub(super) async fn supervise(shared: Shared, mut shutdown: watch::Receiver<bool>) {
    let mut changes = shared.routing.subscribe();
    let mut running: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        running.retain(|_, task| !task.is_finished());
        let wanted = shared.routing.table().targets();
        for addr in wanted {
            if running.contains_key(&addr) {
                continue;
            }
            let task = tokio::spawn(run_owner_connection(
                shared.clone(),
                addr.clone(),
                shutdown.clone(),
            ));
            running.insert(addr, task);
        }
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep(SUPERVISE_TICK) => {}
            () = stopped(&mut shutdown) => break,
        }
    }
    for (_, task) in running.drain() {
        let _ = task.await;
    }
}

/// One connection to the owner at `addr`, for the topics routed there.
async fn run_owner_connection(shared: Shared, addr: String, mut shutdown: watch::Receiver<bool>) {
    let mut connected_at = None;
    let outcome = connect_and_replicate(
        &shared,
        &addr,
        Some(&addr),
        &mut connected_at,
        &mut shutdown,
    )
    .await;
    match outcome {
        Ok(Ended::Shutdown | Ended::TopicsGone | Ended::Unneeded) => {}
        Err(e) => {
            let moved = shared.routing.with(|t| t.fall_back_all(&addr));
            if connected_at.is_some() {
                info!(owner = %addr, error = %e, topics = moved.join(","), "connection to the owner lost; its topics go back to the bootstrap brokers");
            } else {
                warn!(owner = %addr, error = %e, topics = moved.join(","), "cannot connect to the owner a broker redirected to; its topics go back to the bootstrap brokers");
            }
        }
    }
}
