//! The listener: a dedicated connection of each handle that `LISTEN`s for the other handles'
//! notifications, wake-ups and entity changes (`changes.rs` is the payloads' codec).

use std::sync::atomic::Ordering;
use std::time::Duration;

use fallible_iterator::FallibleIterator;

use super::PgStore;
use super::conn::{Backoff, pg_message};
use crate::changes::Changes;
use crate::{Error, Result};

impl PgStore {
    /// A dedicated connection that `LISTEN`s for other handles' notifications: wake-ups
    /// (work to claim) wake this handle's engine; entity changes, listened to once
    /// something waits on them ([`Store::changes`](crate::Store::changes)), go to the change subscribers. It
    /// reconnects with backoff and then wakes the engine and tells the subscribers that
    /// changes may have been missed (notifications sent meanwhile are lost).
    pub(super) fn start_listener(&self) -> Result<()> {
        let target = self.inner.target.clone();
        let wake = self.inner.wake.clone();
        let changes = self.inner.changes.clone();
        let want_changes = self.inner.want_changes.clone();
        let stop = self.inner.stop.clone();
        let me = self.inner.me.clone();
        let (channel, changes_channel) = (self.inner.channel.clone(), self.inner.changes_channel.clone());
        std::thread::Builder::new()
            .name("settle-pg-listen".into())
            .spawn(move || {
                let mut backoff = Backoff::new();
                while !stop.load(Ordering::Relaxed) {
                    let mut conn = match target.connect() {
                        Ok(c) => c,
                        Err(e) => {
                            backoff.wait("notification listener", &pg_message(&e));
                            continue;
                        }
                    };
                    // A channel name is an identifier; it is built from the validated schema.
                    if let Err(e) = conn.batch(&format!("LISTEN \"{channel}\"")) {
                        backoff.wait("notification listener", &pg_message(&e));
                        continue;
                    }
                    backoff = Backoff::new();
                    // Whatever was told while nobody listened is lost: look again.
                    wake.notify_one();
                    let mut listening_changes = false;
                    while !stop.load(Ordering::Relaxed) {
                        if !listening_changes && want_changes.load(Ordering::Acquire) {
                            if conn.batch(&format!("LISTEN \"{changes_channel}\"")).is_err() {
                                break;
                            }
                            listening_changes = true;
                            // Changes before this LISTEN were not heard: waiters look again.
                            let _ = changes.send(Changes::Lost);
                        }
                        // Short waits while nothing is heard, so that a first waiter's LISTEN
                        // follows within a tenth of a second.
                        let next = conn.client.notifications().timeout_iter(Duration::from_millis(100)).next();
                        match next {
                            Ok(Some(n)) if n.channel() == changes_channel => {
                                match crate::changes::decode(n.payload()) {
                                    Some((sender, _)) if sender == me => {}
                                    // No receiver is fine: nobody waits any more.
                                    Some((_, changed)) => {
                                        let _ = changes.send(Changes::Entities(changed.into()));
                                    }
                                    None => {
                                        tracing::warn!(payload = n.payload(), "unreadable change notification");
                                        let _ = changes.send(Changes::Lost);
                                    }
                                }
                            }
                            Ok(Some(n)) => {
                                if crate::changes::sender(n.payload()) != me {
                                    wake.notify_one();
                                }
                            }
                            // A timeout: notice a dead connection, which yields no error here.
                            Ok(None) if conn.client.is_closed() => break,
                            Ok(None) => {}
                            Err(_) => break,
                        }
                    }
                    if listening_changes {
                        let _ = changes.send(Changes::Lost);
                    }
                }
            })
            .map_err(|e| Error::Open { path: self.inner.target.display.clone(), message: e.to_string() })?;
        Ok(())
    }
}
