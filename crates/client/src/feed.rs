//! Following the change feed (`GET /v1/feed`): its server-sent events read as they arrive,
//! each a [`Change`] with its position, and the client's place kept so that a reconnect
//! with [`FeedStream::last_id`] goes on without a gap.

use reqwest::Method;
pub use settle_api::Change;

use crate::{Client, Error, refusal, seg};

/// Which changes to follow; every field narrows (see `GET /v1/feed`).
#[derive(Debug, Clone, Default)]
pub struct FeedQuery {
    /// Only this machine's entities (and operations on them).
    pub machine: Option<String>,
    /// Only this entity (with `machine`).
    pub key: Option<String>,
    /// Only transitions into this state.
    pub state: Option<String>,
    /// Only what this request caused.
    pub request_id: Option<String>,
    /// `transition` or `operation` (default both).
    pub kind: Option<String>,
    /// Start after this position (`0`: the oldest kept); `None`: from now on.
    pub since: Option<String>,
}

/// An open stream of changes.
#[derive(Debug)]
pub struct FeedStream {
    response: reqwest::Response,
    url: String,
    /// Bytes received and not yet read: an event's end is ASCII, so a whole event is whole
    /// UTF-8 even when a chunk split a character.
    buf: Vec<u8>,
    last: Option<String>,
}

impl Client {
    /// Opens the change feed: from `last_event_id` when given (a reconnect: it wins over
    /// `q.since`), else as `q` says.
    pub async fn feed(&self, q: &FeedQuery, last_event_id: Option<&str>) -> Result<FeedStream, Error> {
        let mut params = Vec::new();
        for (k, v) in [
            ("machine", &q.machine),
            ("key", &q.key),
            ("state", &q.state),
            ("request_id", &q.request_id),
            ("type", &q.kind),
            ("since", &q.since),
        ] {
            if let Some(v) = v {
                params.push(format!("{k}={}", seg(v)));
            }
        }
        let query = if params.is_empty() { String::new() } else { format!("?{}", params.join("&")) };
        let url = format!("{}/v1/feed{query}", self.base);
        // No overall timeout: the stream lasts as long as the server.
        let mut req = self.http.request(Method::GET, &url).header("accept", "text/event-stream");
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let response = req.send().await.map_err(|e| Error::Transport { url: url.clone(), source: e })?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response.bytes().await.map_err(|e| Error::Transport { url: url.clone(), source: e })?;
            return Err(refusal(url, status, &bytes));
        }
        Ok(FeedStream { response, url, buf: Vec::new(), last: last_event_id.map(str::to_string) })
    }
}

impl FeedStream {
    /// The next change; `None` when the server ended the stream (it stops). Events that
    /// only move the position (past changes a filter left out) move [`last_id`](Self::last_id).
    pub async fn next(&mut self) -> Result<Option<Change>, Error> {
        loop {
            while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let bytes: Vec<u8> = self.buf.drain(..end + 2).collect();
                let block = String::from_utf8_lossy(&bytes);
                let (mut event, mut data) = (None, String::new());
                for line in block.lines() {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "id" => self.last = Some(value.to_string()),
                        "event" => event = Some(value.to_string()),
                        "data" => data.push_str(value),
                        _ => {}
                    }
                }
                if event.as_deref() == Some("error") {
                    return Err(Error::Unexpected {
                        url: self.url.clone(),
                        message: format!("the feed failed: {data}"),
                    });
                }
                if !data.is_empty() {
                    let change = serde_json::from_str(&data).map_err(|e| Error::Unexpected {
                        url: self.url.clone(),
                        message: format!("cannot decode a change: {e}"),
                    })?;
                    return Ok(Some(change));
                }
            }
            let chunk =
                self.response.chunk().await.map_err(|e| Error::Transport { url: self.url.clone(), source: e })?;
            match chunk {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => return Ok(None),
            }
        }
    }

    /// The last position the server sent: reconnect with it to miss nothing.
    pub fn last_id(&self) -> Option<&str> {
        self.last.as_deref()
    }
}
