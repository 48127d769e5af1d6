//! Change-feed streams open at once, bounded per token and in all ([`Streams`]), and how
//! long one may stay open.
//!
//! A stream holds a [`Stream`] permit while it is open: one of its token's
//! (`Config::streams_per_token`, default [`PER_TOKEN`]; on a server without tokens the one
//! anonymous caller's) and one of the server's (`Config::max_streams`, default
//! [`MAX_STREAMS`]). A stream beyond either is answered 429 `too-many-streams` with
//! `Retry-After`: one token cannot hold every connection, and every other caller (agents,
//! operators, `/healthz`) still connects. A stream ends after `Config::stream_lifetime`
//! (default [`LIFETIME`]); the client reconnects from the last `id` it saw and misses
//! nothing, and the connection's resources are freed even if the client never leaves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Caller;
use crate::problem::{Kind, Problem};

/// Most feed streams open at once on one server, by default.
pub const MAX_STREAMS: usize = 256;
/// Most feed streams one token may hold open, by default.
pub const PER_TOKEN: usize = 16;
/// How long a stream stays open before the server ends it (the client reconnects), by
/// default.
pub const LIFETIME: Duration = Duration::from_secs(600);

/// The permits of the feed's streams (see the [module](self)).
#[derive(Debug)]
pub struct Streams {
    all: Arc<Semaphore>,
    max: usize,
    per_token: usize,
    /// Each token's permits, by its position in the tokens (`None`: the anonymous caller).
    tokens: Mutex<HashMap<Option<usize>, Arc<Semaphore>>>,
    open: Arc<AtomicUsize>,
}

/// An open stream's permits, given back when the stream ends.
#[derive(Debug)]
pub struct Stream {
    _all: OwnedSemaphorePermit,
    _token: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Streams {
    /// `max` streams in all, `per_token` for each token.
    pub fn new(max: usize, per_token: usize) -> Streams {
        let (max, per_token) = (max.max(1), per_token.max(1));
        Streams {
            all: Arc::new(Semaphore::new(max)),
            max,
            per_token,
            tokens: Mutex::new(HashMap::new()),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A permit for a stream of `caller`, or 429 `too-many-streams` naming the bound that is
    /// reached.
    pub fn open(&self, caller: &Caller) -> Result<Stream, Problem> {
        let busy = |what: String| {
            Problem::new(Kind::TooManyStreams, format!("{what}; close one, or retry in a few seconds"))
                .with("retry_after", 5)
        };
        let mine = {
            let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
            tokens.entry(caller.token()).or_insert_with(|| Arc::new(Semaphore::new(self.per_token))).clone()
        };
        let token = mine
            .try_acquire_owned()
            .map_err(|_| busy(format!("this token holds its {} feed streams open already", self.per_token)))?;
        let all = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy(format!("the server holds its {} feed streams open already", self.max)))?;
        self.open.fetch_add(1, Ordering::Relaxed);
        Ok(Stream { _all: all, _token: token, open: self.open.clone() })
    }

    /// How many streams are open now.
    pub fn open_now(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The gauge for `/metrics`.
    pub fn text(&self) -> String {
        format!(
            "# HELP settle_feed_streams Change-feed streams open now (at most {} in all, {} per token).\n\
             # TYPE settle_feed_streams gauge\nsettle_feed_streams {}\n",
            self.max,
            self.per_token,
            self.open_now()
        )
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, header};

    use super::*;
    use crate::auth::{Access, Tokens};

    fn caller(tokens: &Tokens, secret: &str) -> Caller {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Bearer {secret}").parse().unwrap());
        tokens.authenticate(&h, Access::Read).unwrap()
    }

    #[test]
    fn streams_are_bounded_per_token_and_in_all_and_given_back() {
        let tokens =
            Tokens::from_spec("reader=reader-token-0001;reader=reader-token-0002;admin=admin-token-0001").unwrap();
        let (a, b, admin) = (
            caller(&tokens, "reader-token-0001"),
            caller(&tokens, "reader-token-0002"),
            caller(&tokens, "admin-token-0001"),
        );
        let streams = Streams::new(5, 2);
        let mut held = vec![streams.open(&a).unwrap(), streams.open(&a).unwrap()];
        let refused = streams.open(&a).unwrap_err();
        assert_eq!(refused.kind(), Kind::TooManyStreams);
        assert!(refused.detail().contains("this token holds its 2 feed streams"), "{refused}");
        held.push(streams.open(&b).unwrap());
        held.push(streams.open(&b).unwrap());
        held.push(streams.open(&admin).unwrap());
        assert_eq!(streams.open_now(), 5);
        let full = streams.open(&admin).unwrap_err();
        assert!(full.detail().contains("the server holds its 5 feed streams"), "{full}");
        drop(held.pop());
        assert!(streams.open(&admin).is_ok(), "a stream that ended gives its permits back");
        assert!(streams.text().contains("settle_feed_streams 4\n"), "{}", streams.text());
    }
}
