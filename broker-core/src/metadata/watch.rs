//! Prefix watches: [`WatchEvent`], [`Watch`] (one prefix, lag reported as
//! [`WatchError::Lagged`]) and the [`WatchHub`] implementations publish to.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::WATCH_CHANNEL_CAPACITY;

/// A change under a watched prefix.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// `key` now holds `value`.
    Put {
        /// The key.
        key: String,
        /// Its new value.
        value: Value,
    },
    /// `key` was removed (deleted or purged after expiry).
    Delete {
        /// The key.
        key: String,
    },
}

impl WatchEvent {
    /// The key changed.
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put { key, .. } | WatchEvent::Delete { key } => key,
        }
    }
}

/// Why a watch returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The watcher fell behind and `missed` events (under any prefix) were
    /// dropped for it; re-list the prefix, then continue receiving.
    #[error("watch lagged: {missed} events missed; re-list")]
    Lagged {
        /// Events dropped.
        missed: u64,
    },
    /// The store was dropped.
    #[error("metadata store closed")]
    Closed,
}

/// A stream of changes under one prefix. See the module contract.
#[derive(Debug)]
pub struct Watch {
    prefix: String,
    receiver: broadcast::Receiver<Arc<WatchEvent>>,
}

impl Watch {
    /// A watch filtering `receiver` by `prefix` (for implementations; see
    /// [`WatchHub`]).
    pub fn new(prefix: String, receiver: broadcast::Receiver<Arc<WatchEvent>>) -> Watch {
        Watch { prefix, receiver }
    }

    /// The watched prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The next change under the prefix, waiting for one.
    ///
    /// # Errors
    /// [`WatchError::Lagged`] (then call again to continue) or
    /// [`WatchError::Closed`].
    pub async fn recv(&mut self) -> Result<WatchEvent, WatchError> {
        loop {
            match self.receiver.recv().await {
                Ok(event) if event.key().starts_with(&self.prefix) => return Ok((*event).clone()),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    return Err(WatchError::Lagged { missed });
                }
                Err(broadcast::error::RecvError::Closed) => return Err(WatchError::Closed),
            }
        }
    }

    /// The next change under the prefix if one is queued, without waiting.
    ///
    /// # Errors
    /// As [`Watch::recv`].
    pub fn try_recv(&mut self) -> Result<Option<WatchEvent>, WatchError> {
        loop {
            match self.receiver.try_recv() {
                Ok(event) if event.key().starts_with(&self.prefix) => {
                    return Ok(Some((*event).clone()));
                }
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Empty) => return Ok(None),
                Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                    return Err(WatchError::Lagged { missed });
                }
                Err(broadcast::error::TryRecvError::Closed) => return Err(WatchError::Closed),
            }
        }
    }
}

/// The fan-out of committed changes to watches, for implementations:
/// publish a write's events in commit order, before its future resolves.
#[derive(Debug)]
pub struct WatchHub {
    sender: broadcast::Sender<Arc<WatchEvent>>,
}

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub::new()
    }
}

impl WatchHub {
    /// A hub with [`WATCH_CHANNEL_CAPACITY`].
    pub fn new() -> WatchHub {
        let (sender, _) = broadcast::channel(WATCH_CHANNEL_CAPACITY);
        WatchHub { sender }
    }

    /// A watch receiving every event published from now on.
    pub fn subscribe(&self, prefix: &str) -> Watch {
        Watch::new(prefix.to_owned(), self.sender.subscribe())
    }

    /// Queues `events` to every watch.
    pub fn publish(&self, events: impl IntoIterator<Item = WatchEvent>) {
        for event in events {
            // An error only means there is no watch at the moment.
            let _ = self.sender.send(Arc::new(event));
        }
    }
}
