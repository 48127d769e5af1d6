//! Flow control over HTTP: `GET /v1/limits`, where an entity stands in `GET` of it, the
//! `/metrics` gauges, and a limited agent action whose task is offered only once its slot
//! is taken, handed on when the agent reports.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::Config;
use crate::auth::Tokens;
use crate::tests::App;

/// `part`'s agent-run `provision`, one at a time per region.
const LIMITED: &str = r#"initial = "idle"
properties = ["region"]
[states.idle]
[states.provisioning]
auto = "provision"
[states.up]
[events.start]
in = ["idle"]
action = "begin"
[actions.begin]
to = ["provisioning"]
[actions.provision]
agent = "cloud"
to = ["up"]
[limits.provider_calls]
states = ["provisioning"]
max = 1
key = "props.region"
"#;

async fn until(app: &App, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..2_000 {
        let v = app.get("/v1/limits").await.json();
        if check(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}: {}", app.get("/v1/limits").await.text);
}

/// Leases what `cloud` offers now: (task id, token, entity key).
async fn lease(app: &App) -> Vec<(i64, String, String)> {
    let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "max": 10, "wait_ms": 2000})).await;
    let tasks = leased.json()["tasks"].as_array().cloned().unwrap_or_default();
    tasks
        .iter()
        .map(|t| (t["id"].as_i64().unwrap(), t["token"].as_str().unwrap().into(), t["key"].as_str().unwrap().into()))
        .collect()
}

#[tokio::test]
async fn a_limited_agent_action_waits_in_line_and_says_so() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("part", LIMITED)]).await;
    assert_eq!(app.get("/v1/limits").await.json(), json!({"items": []}));
    for k in ["p1", "p2", "p3"] {
        let r = app.post("/v1/machines/part/entities", json!({"key": k, "properties": {"region": "eu"}})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        let r = app.post(&format!("/v1/machines/part/entities/{k}/events/start"), json!({})).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    }
    let want = json!({"items": [{"limit": "provider_calls", "key": "eu", "in_use": 1, "max": 1, "waiting": 2}]});
    until(&app, "one holds the slot and two wait", |v| *v == want).await;
    // One task is offered: the one whose entity holds the slot.
    let tasks = lease(&app).await;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let (id, token, first) = tasks[0].clone();
    let holder = app.get(&format!("/v1/machines/part/entities/{first}")).await.json();
    assert_eq!(holder["limits"][0]["says"], "holds a slot of `provider_calls` (key eu: 1 of 1 in use)");
    let mut places = Vec::new();
    for k in ["p1", "p2", "p3"].into_iter().filter(|k| *k != first) {
        let e = app.get(&format!("/v1/machines/part/entities/{k}")).await.json();
        let l = &e["limits"][0];
        places.push(l["place"].as_u64().unwrap());
        let says = l["says"].as_str().unwrap();
        assert!(says.starts_with("waiting for `provider_calls` (key eu: 1 of 1 in use, "), "{says}");
        assert_eq!((e["lease_owner"].clone(), e["due_at"].clone()), (Value::Null, Value::Null), "{e}");
        // `why` says what holds it back, though nothing failed.
        let why = app.get(&format!("/v1/machines/part/entities/{k}/why")).await.json();
        assert_eq!((why["failing"].as_bool(), &why["limits"][0]["says"]), (Some(false), &l["says"]), "{why}");
    }
    places.sort();
    assert_eq!(places, [1, 2]);
    let metrics = app.get("/metrics").await.text;
    assert!(metrics.contains("settle_limit_in_use{limit=\"provider_calls\"} 1\n"), "{metrics}");
    assert!(metrics.contains("settle_limit_waiting{limit=\"provider_calls\"} 2\n"), "{metrics}");
    // The agent's report ends the action: the slot goes to the first in line, whose task is
    // offered; and so on until all are up.
    let r = app.post(&format!("/v1/tasks/{id}/complete"), json!({"token": token, "target": "up"})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let mut done = 1;
    while done < 3 {
        let tasks = lease(&app).await;
        assert!(tasks.len() <= 1, "never more than the limit's one task: {tasks:?}");
        for (id, token, _) in tasks {
            let r = app.post(&format!("/v1/tasks/{id}/complete"), json!({"token": token, "target": "up"})).await;
            assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
            done += 1;
        }
    }
    until(&app, "every slot is back", |v| *v == json!({"items": []})).await;
    for k in ["p1", "p2", "p3"] {
        let e = app.get(&format!("/v1/machines/part/entities/{k}")).await.json();
        assert_eq!(e["limits"], json!([]), "{e}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_raise_and_a_bulk_operation_carry_their_priority_into_the_line() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("part", LIMITED)]).await;
    for k in ["p1", "p2", "p3", "p4"] {
        let r = app.post("/v1/machines/part/entities", json!({"key": k, "properties": {"region": "eu"}})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let start = |k: &str, query: &str| format!("/v1/machines/part/entities/{k}/events/start{query}");
    assert_eq!(app.post(&start("p1", ""), json!({})).await.status, StatusCode::ACCEPTED);
    until(&app, "p1 holds the slot", |v| v["items"][0]["in_use"] == 1).await;
    assert_eq!(app.post(&start("p2", ""), json!({})).await.status, StatusCode::ACCEPTED);
    until(&app, "p2 waits", |v| v["items"][0]["waiting"] == 1).await;
    assert_eq!(app.post(&start("p3", "?priority=3"), json!({})).await.status, StatusCode::ACCEPTED);
    until(&app, "p3 waits", |v| v["items"][0]["waiting"] == 2).await;
    let place = |e: Value| e["limits"][0]["place"].as_u64();
    assert_eq!(place(app.get("/v1/machines/part/entities/p3").await.json()), Some(1), "ahead by its priority");
    assert_eq!(place(app.get("/v1/machines/part/entities/p2").await.json()), Some(2));
    // Out of range: refused, naming the field; nothing raised.
    let r = app.post(&start("p4", "?priority=5000"), json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.json()["field"], "priority", "{}", r.text);
    assert_eq!(app.get("/v1/machines/part/entities/p4").await.json()["state"], "idle");
    // A bulk operation gives its events a priority; only `raise` takes one.
    let bulk = |action: &str, priority: i64| {
        json!({"action": action, "event": if action == "raise" { json!("start") } else { Value::Null },
               "filter": {"machine": "part", "prefix": "p4"}, "reason": "test", "priority": priority})
    };
    let r = app.post("/v1/bulk", bulk("raise", 7)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.json()["priority"], 7, "{}", r.text);
    until(&app, "p4 waits", |v| v["items"][0]["waiting"] == 3).await;
    assert_eq!(place(app.get("/v1/machines/part/entities/p4").await.json()), Some(1), "7 goes before 3");
    let r = app.post("/v1/bulk", bulk("pause", 7)).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("priority: only `raise` starts work"), "{}", r.text);
    app.stop().await;
}
