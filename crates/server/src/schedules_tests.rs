//! Calendar schedules through the router on a real SQLite store with a controllable clock:
//! listed with their next fires and counts, paused and resumed by an operator (a reader
//! may not), shown on the entities they reach, exported in `/metrics`.

use std::time::Duration;

use serde_json::json;
use settle_engine::ManualClock;

use crate::Config;
use crate::auth::Tokens;
use crate::tests::{App, Req};

/// 2026-11-27T10:30:00Z.
const T0: i64 = 1_796_207_400_000;

const PROBE: &str = r#"
initial = "new"
[states.new]
[states.ready]
[events.start]
in = ["new"]
action = "up"
[events.check]
in = ["ready"]
action = "probe"
[actions.up]
to = ["ready"]
[actions.probe]
to = ["ready"]

[schedules.nightly]
cron = "0 3 * * *"
zone = "Europe/Paris"
raise = "check"
in = ["ready"]

[schedules.report]
cron = "30 * * * *"
create = { key = "'report-' + params.fire" }
"#;

#[tokio::test]
async fn schedules_are_listed_paused_resumed_shown_on_entities_and_exported() {
    let clock = ManualClock::new(T0);
    let engine = settle_engine::Config { clock: std::sync::Arc::new(clock.clone()), ..Default::default() };
    let app = App::with_engine(Tokens::open(), Config::default(), &[("probe", PROBE)], engine).await;
    let list = app.get("/v1/schedules").await.json();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{list}");
    // 03:00 in Paris (CET) is 02:00 UTC, tomorrow.
    assert_eq!(items[0]["name"], "nightly");
    assert_eq!(items[0]["cron"], "0 3 * * * (Europe/Paris)");
    assert_eq!(items[0]["does"], "raise check in [ready]");
    assert_eq!(items[0]["next_fire"], json!(T0 + (15 * 60 + 30) * 60_000));
    assert_eq!((items[0]["fired"].clone(), items[0]["paused"].clone()), (json!(0), json!(false)));
    assert_eq!(items[1]["does"], "create");

    // An entity in `ready` shows the schedule that reaches it; one in `new` none.
    app.state.engine().create("probe", "p1", Default::default()).await.unwrap();
    let fresh = app.get("/v1/machines/probe/entities/p1").await.json();
    assert_eq!(fresh["next_fires"], json!([]));
    app.state.engine().raise("probe", "p1", "start", Default::default()).await.unwrap();
    app.state.engine().wait_idle().await.unwrap();
    let ready = app.get("/v1/machines/probe/entities/p1").await.json();
    assert_eq!(
        ready["next_fires"],
        json!([{"schedule": "nightly", "does": "raise check in [ready]", "at": T0 + (15 * 60 + 30) * 60_000, "paused": false}])
    );

    // Paused: shown so, no next fire on the entity; resumed from the next fire after now.
    let paused = app.post("/v1/schedules/probe/nightly/pause", json!({})).await;
    assert_eq!(paused.status.as_u16(), 200, "{}", paused.text);
    assert_eq!(paused.json()["paused"], true);
    let ready = app.get("/v1/machines/probe/entities/p1").await.json();
    assert_eq!(
        (ready["next_fires"][0]["paused"].clone(), ready["next_fires"][0]["at"].clone()),
        (json!(true), json!(null))
    );
    clock.advance(Duration::from_secs(24 * 3600));
    let resumed = app.post("/v1/schedules/probe/nightly/resume", json!({})).await.json();
    assert_eq!(
        (resumed["paused"].clone(), resumed["next_fire"].clone()),
        (json!(false), json!(T0 + (39 * 60 + 30) * 60_000))
    );
    app.post("/v1/schedules/probe/nobody/pause", json!({})).await.problem(404, "unknown-schedule");
    app.post("/v1/schedules/nobody/nightly/pause", json!({})).await.problem(404, "unknown-machine");

    let metrics = app.get("/metrics").await.text;
    assert!(
        metrics.contains(&format!(
            "settle_schedule_next_fire_timestamp_seconds{{machine=\"probe\",schedule=\"nightly\"}} {}",
            (T0 + (39 * 60 + 30) * 60_000) / 1000
        )),
        "{metrics}"
    );
    // Paused through the day it was behind, nightly missed nothing (report may have caught
    // up by now, whatever it missed: the runner wakes on the clock's jump).
    assert!(metrics.contains("settle_schedule_missed_total{machine=\"probe\",schedule=\"nightly\"} 0"), "{metrics}");
    assert!(metrics.contains("settle_schedule_missed_total{machine=\"probe\",schedule=\"report\"} "), "{metrics}");
    assert!(metrics.contains("settle_schedule_paused{machine=\"probe\",schedule=\"nightly\"} 0"), "{metrics}");
}

#[tokio::test]
async fn a_reader_may_list_schedules_but_not_pause_them() {
    let tokens = Tokens::from_spec("reader=reader-token-0001;operator=operator-token-01").unwrap();
    let app = App::with_engine(tokens, Config::default(), &[("probe", PROBE)], settle_engine::Config::default()).await;
    let read = app.call(Req::new("GET", "/v1/schedules").token(Some("reader-token-0001"))).await;
    assert_eq!(read.status.as_u16(), 200);
    let pause = |token: &str| Req::new("POST", "/v1/schedules/probe/nightly/pause").token(Some(token)).json(json!({}));
    app.call(pause("reader-token-0001")).await.problem(403, "forbidden");
    let done = app.call(pause("operator-token-01")).await;
    assert_eq!(done.status.as_u16(), 200, "{}", done.text);
}
