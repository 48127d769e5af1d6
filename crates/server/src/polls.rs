//! Agents' long polls waiting at once, bounded and shared fairly ([`Polls`]).
//!
//! A long poll holds a permit while it waits. The server's bound (`Config::max_polls`,
//! default [`MAX_POLLS`]) is split evenly among the agent queues it serves, and each
//! queue's share evenly among the tokens that may serve it (its agent tokens and every
//! admin token; on a server without tokens, the one anonymous caller has it all). A poll
//! beyond its queue's or its token's share is answered 429 `too-many-polls` with
//! `Retry-After`: no token can take another's permits, and no queue another queue's.
//! A queue's and a token's share are at least one poll each.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::{Caller, Tokens};
use crate::problem::{Kind, Problem};

/// Most long polls waiting at once on one server, by default.
pub const MAX_POLLS: usize = 256;

/// The permits of every queue and of each token within it.
#[derive(Debug)]
pub struct Polls {
    queues: HashMap<String, Queue>,
}

#[derive(Debug)]
struct Queue {
    all: Arc<Semaphore>,
    share: usize,
    /// Each serving token's permits, by its position in [`Tokens`]; the anonymous
    /// caller of an open server under `None`.
    tokens: HashMap<Option<usize>, Arc<Semaphore>>,
    per_token: usize,
}

/// A long poll's permits, held while it waits.
#[derive(Debug)]
pub struct Permit {
    _queue: OwnedSemaphorePermit,
    _token: OwnedSemaphorePermit,
}

impl Polls {
    /// The permits of `max` polls over `queues`, served by `tokens`.
    pub fn new(max: usize, queues: &[String], tokens: &Tokens) -> Polls {
        let share = (max / queues.len().max(1)).max(1);
        let queues = queues
            .iter()
            .map(|q| {
                let servers: Vec<Option<usize>> =
                    if tokens.is_open() { vec![None] } else { tokens.servers_of(q).into_iter().map(Some).collect() };
                let per_token = (share / servers.len().max(1)).max(1);
                let tokens = servers.into_iter().map(|t| (t, Arc::new(Semaphore::new(per_token)))).collect();
                (q.clone(), Queue { all: Arc::new(Semaphore::new(share)), share, tokens, per_token })
            })
            .collect();
        Polls { queues }
    }

    /// Takes a permit for a poll of `caller` on `queue` (which the caller may serve), or
    /// 429 `too-many-polls` naming the share that is used up.
    pub fn acquire(&self, queue: &str, caller: &Caller) -> Result<Permit, Problem> {
        let busy = |what: String| {
            Problem::new(Kind::TooManyPolls, format!("{what}; retry in a second"))
                .with("queue", queue)
                .with("retry_after", 1)
        };
        let Some(q) = self.queues.get(queue) else {
            return Err(busy(format!("queue `{queue}` takes no long polls")));
        };
        let Some(mine) = q.tokens.get(&caller.token()) else {
            return Err(busy(format!("this token has no long polls on queue `{queue}`")));
        };
        let token = mine
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy(format!("this token holds its {} long polls on queue `{queue}` already", q.per_token)))?;
        let all = q
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy(format!("queue `{queue}` has its {} long polls waiting already", q.share)))?;
        Ok(Permit { _queue: all, _token: token })
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, header};

    use super::*;
    use crate::auth::Access;

    fn caller(tokens: &Tokens, secret: &str) -> Caller {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Bearer {secret}").parse().unwrap());
        tokens.authenticate(&h, Access::Agent).unwrap()
    }

    #[test]
    fn the_bound_is_split_among_queues_then_among_their_tokens() {
        let tokens = Tokens::from_spec(
            "agent:dns=dns-agent-token-1;agent:dns=dns-agent-token-2;agent:app=app-agent-token-1;admin=admin-token-0001",
        )
        .unwrap();
        let polls = Polls::new(12, &["dns".to_string(), "app".to_string()], &tokens);
        // dns: 6 polls, 3 servers (two agents, the admin): 2 each.
        let (dns1, dns2, app1, admin) = (
            caller(&tokens, "dns-agent-token-1"),
            caller(&tokens, "dns-agent-token-2"),
            caller(&tokens, "app-agent-token-1"),
            caller(&tokens, "admin-token-0001"),
        );
        let mut held = Vec::new();
        for c in [&dns1, &dns1, &dns2, &dns2] {
            held.push(polls.acquire("dns", c).unwrap());
        }
        let refused = polls.acquire("dns", &dns1).unwrap_err();
        assert_eq!(refused.kind(), Kind::TooManyPolls);
        assert!(refused.detail().contains("this token holds its 2 long polls"), "{refused}");
        // The other queue's agent is not affected: app has 6 polls, 2 servers, 3 each.
        for _ in 0..3 {
            held.push(polls.acquire("app", &app1).unwrap());
        }
        assert!(polls.acquire("app", &app1).is_err());
        // The admin still has its share of dns.
        held.push(polls.acquire("dns", &admin).unwrap());
        held.push(polls.acquire("dns", &admin).unwrap());
        assert!(polls.acquire("dns", &admin).is_err());
        // A poll ended gives its permits back.
        held.remove(0);
        assert!(polls.acquire("dns", &dns1).is_ok());
    }

    #[test]
    fn a_queues_share_bounds_its_tokens_together() {
        // 5 polls for one queue, 2 servers: 2 each (the rounding keeps one spare).
        let tokens = Tokens::from_spec("agent:q=q-agent-token-0001;agent:q=q-agent-token-0002").unwrap();
        let polls = Polls::new(5, &["q".to_string()], &tokens);
        let (a, b) = (caller(&tokens, "q-agent-token-0001"), caller(&tokens, "q-agent-token-0002"));
        let _held: Vec<_> = [&a, &a, &b, &b].into_iter().map(|c| polls.acquire("q", c).unwrap()).collect();
        assert!(polls.acquire("q", &a).is_err() && polls.acquire("q", &b).is_err());
        // Open server: the anonymous caller has the queue's whole share.
        let open = Tokens::open();
        let polls = Polls::new(4, &["q".to_string(), "r".to_string()], &open);
        let anyone = open.authenticate(&HeaderMap::new(), Access::Agent).unwrap();
        let _held: Vec<_> = (0..2).map(|_| polls.acquire("q", &anyone).unwrap()).collect();
        let refused = polls.acquire("q", &anyone).unwrap_err();
        assert!(refused.detail().contains("2 long polls"), "{refused}");
        assert!(polls.acquire("r", &anyone).is_ok());
        // A tiny bound still gives every queue and token one poll.
        let polls = Polls::new(1, &["q".to_string(), "r".to_string()], &tokens);
        assert!(polls.acquire("q", &a).is_ok() && polls.acquire("q", &b).is_ok());
    }
}
