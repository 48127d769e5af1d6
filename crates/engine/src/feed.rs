//! The change feed as a follower sees it (DESIGN §9): reads of the store's feed, and a
//! [`FeedWatch`] that says when reading again may find more — a batch this engine
//! committed, one another instance told of (PostgreSQL's notifications), or a bounded
//! wait (on PostgreSQL a change becomes readable only once every older transaction in the
//! cluster ended, which nothing announces). Nothing polls faster than that bound while
//! nothing commits.

use std::time::Duration;

use settle_store::{Changes, FeedFilter, FeedPage, FeedPos, Store};
use tokio::sync::{broadcast, watch};

use crate::{Engine, Result};

/// Says when the feed may have grown. Take it before the first read: a commit between a
/// read and [`wait`](Self::wait) ends the wait at once.
pub struct FeedWatch {
    committed: watch::Receiver<u64>,
    others: Option<broadcast::Receiver<Changes>>,
}

impl FeedWatch {
    /// Marks everything committed so far as seen (call before each read).
    pub fn seen(&mut self) {
        self.committed.borrow_and_update();
    }

    /// Waits until something committed since [`seen`](Self::seen), here or (PostgreSQL) in
    /// another instance, or `max` passed.
    pub async fn wait(&mut self, max: Duration) {
        let others = async {
            match self.others.as_mut() {
                Some(rx) => {
                    // Lagged or closed: something may have changed all the same.
                    let _ = rx.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.committed.changed() => {}
            _ = others => {}
            _ = tokio::time::sleep(max) => {}
        }
    }
}

impl<S: Store> Engine<S> {
    /// Changes after `after` matching `filter`, at most `limit`, in commit order, and the
    /// position to read on from ([`Store::feed_read`]).
    pub async fn feed_read(&self, after: FeedPos, filter: FeedFilter, limit: usize) -> Result<FeedPage> {
        Ok(self.store().feed_read(after, filter, limit).await?)
    }

    /// Where the feed is now: a follower starting here gets what commits from now on.
    pub async fn feed_head(&self) -> Result<FeedPos> {
        Ok(self.store().feed_head().await?)
    }

    /// A watch telling a follower of the feed when to read again.
    pub fn feed_watch(&self) -> FeedWatch {
        FeedWatch { committed: self.inner.committed.subscribe(), others: self.store().changes() }
    }
}
