//! The change feed (DESIGN §9): transitions and operation ends as server-sent events, each
//! with its position as `id`, resumable with `Last-Event-ID` (or `since=`) without a gap,
//! whichever instance committed what (`settle_store::feed`). One read of the store per
//! wake-up (a commit here, one another instance told of, or a second at most), pages of
//! [`PAGE`]; a filter that leaves changes out still moves the client's position (an event
//! with only an `id`); `coalesce=true` sends one `changes` event per read instead of one
//! per change. The stream ends when the server stops, or after `Config::stream_lifetime`
//! (the client reconnects from its last id); a token holds a bounded number of streams
//! open, and the server too ([`crate::streams`]).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use settle_engine::{Engine, FeedWatch};
use settle_store::{AnyStore, FeedFilter, FeedItem, FeedPage, FeedPos};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Caller;
use crate::contract::FEED_TYPE;
use crate::extract::Query;
use crate::metrics::Refusal;
use crate::model::{Change, FeedQuery};
use crate::problem::{Kind, Problem};
use crate::routes::unknown_word;
use crate::state::AppState;

/// Changes read at most per read of the store.
const PAGE: usize = 500;
/// Longest wait between reads while nothing is heard of (PostgreSQL: a change becomes
/// readable once every older transaction in the cluster ended, which nothing announces).
const QUIET: Duration = Duration::from_secs(1);

/// Read routes of the feed.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(feed))
}

/// The change feed: server-sent events, one per change (`event: transition` or
/// `operation`, `id`: its position, `data`: a `Change`), from `Last-Event-ID` or `since`,
/// else from now on.
#[utoipa::path(
    get,
    operation_id = "followFeed",
    path = "/v1/feed",
    tag = "feed",
    params(FeedQuery, ("Last-Event-ID" = Option<String>, Header, description = "the last event's `id` a reconnecting client saw: the feed goes on after it")),
    responses(
        (status = 200, description = "a stream of server-sent events, each one `Change` as `data`", content_type = "text/event-stream", body = Change),
    )
)]
async fn feed(
    State(s): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(q): Query<FeedQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let filter = filter(&s, &q)?;
    let permit = s.streams().open(&caller).inspect_err(|_| s.refusals().count(Refusal::TooManyStreams))?;
    let ends_at = tokio::time::Instant::now() + s.config().stream_lifetime;
    let coalesce = match q.coalesce.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(unknown_word("coalesce", "value", other, &["true", "false"])),
    };
    let resume = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("").to_string());
    let engine = s.engine().clone();
    // Taken before the first read: a commit from now on wakes the stream.
    let watch = engine.feed_watch();
    let at = match resume.as_deref().or(q.since.as_deref()) {
        Some(text) => text.parse::<FeedPos>().map_err(|e| {
            let field = if resume.is_some() { "Last-Event-ID" } else { "since" };
            Problem::new(Kind::BadRequest, e).field(field)
        })?,
        None => engine.feed_head().await?,
    };
    let follow = Follow {
        engine,
        watch,
        filter,
        coalesce,
        at,
        queue: VecDeque::new(),
        more: true,
        done: false,
        ends_at,
        _permit: permit,
    };
    let stream = futures_util::stream::unfold(follow, |mut f| async move { f.next().await.map(|e| (Ok(e), f)) });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The filter of a query, checked against the served machines.
fn filter(s: &AppState, q: &FeedQuery) -> Result<FeedFilter, Problem> {
    if let Some(m) = q.machine.as_deref() {
        let machine = s.machine(m)?;
        if let Some(state) = q.state.as_deref()
            && machine.state(&settle_core::StateName::new(state)).is_none()
        {
            return Err(Problem::new(Kind::BadRequest, format!("machine `{m}` has no state `{state}`")).field("state"));
        }
    }
    if q.key.is_some() && q.machine.is_none() {
        return Err(Problem::new(Kind::BadRequest, "key needs machine: an entity is a machine and a key").field("key"));
    }
    let (transitions, operations) = match q.kind.as_deref() {
        None => (true, true),
        Some("transition") => (true, false),
        Some("operation") => (false, true),
        Some(other) => return Err(unknown_word("type", "change type", other, FEED_TYPE)),
    };
    Ok(FeedFilter {
        machine: q.machine.clone(),
        key: q.key.clone(),
        state: q.state.clone(),
        request_id: q.request_id.clone(),
        transitions,
        operations,
    })
}

/// One client's place in the feed.
struct Follow {
    engine: Engine<AnyStore>,
    watch: FeedWatch,
    filter: FeedFilter,
    /// One `changes` event per read instead of one per change.
    coalesce: bool,
    /// Where the next read starts: the last position the client was told.
    at: FeedPos,
    queue: VecDeque<Event>,
    /// The last read was a full page: read again at once.
    more: bool,
    done: bool,
    /// When the server ends the stream (the client reconnects after its last id).
    ends_at: tokio::time::Instant,
    /// Its place among the streams open, given back when it ends.
    _permit: crate::streams::Stream,
}

impl Follow {
    /// Queues the events of a page read after `self.at`.
    fn events(&mut self, page: &FeedPage) {
        if self.coalesce && !page.items.is_empty() {
            let data = serde_json::json!({ "count": page.items.len() });
            self.queue.push_back(Event::default().id(page.until.to_string()).event("changes").data(data.to_string()));
            return;
        }
        for item in &page.items {
            let change = Change::from(item);
            let event = Event::default().id(&change.id).event(&change.kind);
            self.queue.push_back(event.json_data(&change).expect("a change serializes"));
        }
        // Past changes the filter left out: the client's position moves on too.
        if page.until > page.items.last().map_or(self.at, FeedItem::pos) {
            self.queue.push_back(Event::default().id(page.until.to_string()).comment("position"));
        }
    }

    /// The next event to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some(e);
            }
            if self.done || self.engine.is_closing() || tokio::time::Instant::now() >= self.ends_at {
                return None;
            }
            if !self.more {
                self.watch.wait(QUIET).await;
                if self.engine.is_closing() {
                    return None;
                }
            }
            self.watch.seen();
            match self.engine.feed_read(self.at, self.filter.clone(), PAGE).await {
                Ok(page) => {
                    self.events(&page);
                    self.at = page.until;
                    self.more = page.more;
                }
                Err(e) => {
                    // Told in the stream (its status was sent long ago); the client reconnects.
                    self.queue.push_back(Event::default().event("error").data(e.to_string()));
                    self.done = true;
                }
            }
        }
    }
}
