//! The change feed over HTTP (`GET /v1/feed`): server-sent events read as a client reads
//! them, a reconnect with `Last-Event-ID` that misses nothing, filters, bad input, and the
//! stream ending when the server stops.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::auth::Tokens;
use crate::tests::{App, Req};

/// One server-sent event.
#[derive(Debug, Clone, Default)]
struct Sse {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

impl Sse {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
    /// `door/d1 create closed`, `end door.open success`, or `position`.
    fn describe(&self) -> String {
        match self.event.as_deref() {
            Some("transition") => {
                let c = self.json();
                let t = &c["transition"];
                format!(
                    "{}/{} {} {}",
                    c["machine"].as_str().unwrap(),
                    c["key"].as_str().unwrap(),
                    t["kind"].as_str().unwrap(),
                    t["to"].as_str().unwrap_or("-")
                )
            }
            Some("operation") => {
                let o = &self.json()["operation"];
                format!("end {} {}", o["name"].as_str().unwrap(), o["outcome"].as_str().unwrap())
            }
            other => format!("{other:?}"),
        }
    }
}

/// A client's stream: reads events as they arrive.
struct Stream {
    body: Body,
    buf: String,
}

impl Stream {
    async fn open(app: &App, uri: &str, last_event_id: Option<&str>) -> Stream {
        let mut b = Request::builder().uri(uri);
        if let Some(id) = last_event_id {
            b = b.header("Last-Event-ID", id);
        }
        let r = app.router.clone().oneshot(b.body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        Stream { body: r.into_body(), buf: String::new() }
    }

    /// The next event (comments skipped), or `None` once the stream ended.
    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut e = Sse::default();
                let mut any = false;
                for line in block.lines() {
                    let (field, value) =
                        line.split_once(':').map(|(f, v)| (f, v.strip_prefix(' ').unwrap_or(v))).unwrap_or((line, ""));
                    match field {
                        "id" => (e.id, any) = (Some(value.to_string()), true),
                        "event" => e.event = Some(value.to_string()),
                        "data" => (e.data, any) = (e.data.clone() + value, true),
                        _ => {}
                    }
                }
                if any {
                    return Some(e);
                }
                continue;
            }
            let frame =
                tokio::time::timeout(Duration::from_secs(10), self.body.frame()).await.expect("an event within 10 s");
            match frame {
                None => return None,
                Some(f) => {
                    if let Ok(data) = f.unwrap().into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&data));
                    }
                }
            }
        }
    }

    /// The next `n` changes (events with data), and the last id seen.
    async fn changes(&mut self, n: usize) -> (Vec<Sse>, String) {
        let (mut out, mut last) = (Vec::new(), String::new());
        while out.len() < n {
            let e = self.next().await.expect("the stream goes on");
            last = e.id.clone().expect("every event has an id");
            if !e.data.is_empty() {
                out.push(e);
            }
        }
        (out, last)
    }
}

fn described(events: &[Sse]) -> Vec<String> {
    events.iter().map(Sse::describe).collect()
}

#[tokio::test]
async fn the_feed_streams_changes_and_a_reconnect_misses_nothing() {
    let app = App::new(Tokens::open()).await;
    app.post("/v1/machines/door/entities", json!({"key": "d1"})).await;
    let r = app.call(Req::new("POST", "/v1/machines/door/entities/d1/events/open?wait=operation")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // From the start: the create, the event's transition, the operations' ends.
    let mut s = Stream::open(&app, "/v1/feed?since=0", None).await;
    let (first, _) = s.changes(4).await;
    assert_eq!(
        described(&first),
        ["door/d1 create closed", "end door:new success", "door/d1 event open", "end door.open success"]
    );
    let c = first[2].json();
    assert_eq!(c["id"], first[2].id.clone().unwrap(), "the data carries its id");
    assert_eq!(c["transition"]["event"], "open");
    assert_eq!(c["transition"]["from"], "closed");
    drop(s);

    // The client went away after the second; meanwhile more happened. Reconnecting with
    // the last id it saw, it gets exactly the rest, then what happens next, live.
    app.post("/v1/machines/door/entities", json!({"key": "d2"})).await;
    app.state.engine().wait_idle().await.unwrap();
    let mut s = Stream::open(&app, "/v1/feed", first[1].id.as_deref()).await;
    let (rest, _) = s.changes(4).await;
    assert_eq!(
        described(&rest),
        ["door/d1 event open", "end door.open success", "door/d2 create closed", "end door:new success"]
    );
    app.call(Req::new("POST", "/v1/machines/door/entities/d2/events/open")).await;
    let (live, _) = s.changes(2).await;
    assert_eq!(described(&live), ["door/d2 event open", "end door.open success"]);
    drop(s);

    // Without a position: from now on. Filters narrow, and still move the position.
    let mut now = Stream::open(&app, "/v1/feed?machine=door&key=d1&type=transition", None).await;
    app.call(Req::new("POST", "/v1/machines/door/entities/d2/events/close")).await;
    app.call(Req::new("POST", "/v1/machines/door/entities/d1/events/close")).await;
    let (only, last) = now.changes(1).await;
    assert_eq!(described(&only), ["door/d1 event closed"]);
    assert_eq!(last, only[0].id.clone().unwrap());
    let mut entered = Stream::open(&app, "/v1/feed?since=0&state=closed", None).await;
    let (closed, _) = entered.changes(4).await;
    assert_eq!(
        described(&closed),
        ["door/d1 create closed", "door/d2 create closed", "door/d2 event closed", "door/d1 event closed"]
    );

    // Coalesced: one event per read, with the count; the position is that of the last.
    let mut counts = Stream::open(&app, "/v1/feed?since=0&coalesce=true", None).await;
    let mut total = 0;
    while total < 12 {
        let e = counts.next().await.unwrap();
        if e.event.as_deref() == Some("changes") {
            total += e.json()["count"].as_u64().unwrap();
        }
    }
    assert_eq!(total, 12, "every change counted once");

    // The server stops: the streams end.
    app.state.engine().close_long_polls();
    while now.next().await.is_some() {}
    while counts.next().await.is_some() {}
    while entered.next().await.is_some() {}
    app.stop().await;
}

#[tokio::test]
async fn bad_feed_requests_are_problems() {
    let app = App::new(Tokens::open()).await;
    let get = |uri: &str| Req::new("GET", uri);
    app.assert_problems(vec![
        (get("/v1/feed?machine=nope"), 404, "unknown-machine", None),
        (get("/v1/feed?machine=door&state=ajar"), 400, "bad-request", Some("state")),
        (get("/v1/feed?key=d1"), 400, "bad-request", Some("key")),
        (get("/v1/feed?type=everything"), 400, "bad-request", Some("type")),
        (get("/v1/feed?since=yesterday"), 400, "bad-request", Some("since")),
        (get("/v1/feed?since=1-7-0"), 400, "bad-request", Some("since")),
        (get("/v1/feed?coalesce=yes"), 400, "bad-request", Some("coalesce")),
        (get("/v1/feed").header("Last-Event-ID", "x"), 400, "bad-request", Some("Last-Event-ID")),
    ])
    .await;
    app.stop().await;
}
