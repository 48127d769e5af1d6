//! Canceling an operation through the router on a real SQLite store: `POST
//! /v1/operations/{id}/cancel` (operators, not readers) stops the entity's work and runs
//! its machine's cancel event; the answer lists the entity and its part; asking again is
//! the same cancel; an unknown operation is 404, an ended one 409 `operation-ended`.

use serde_json::json;

use crate::Config;
use crate::auth::Tokens;
use crate::tests::{App, Req};

/// `job`: new -start→ working (its auto action waits an hour) → done; its cancel event
/// `abort` (valid in working) ends it in `aborted`.
const JOB: &str = r#"
initial = "new"
cancel = "abort"
[states.new]
[states.working]
auto = "finish"
wait = "1h"
[states.done]
[states.aborted]
kind = "terminal"
[events.start]
in = ["new"]
action = "begin"
[events.abort]
in = ["working"]
action = "stop"
[actions.begin]
to = ["working"]
[actions.finish]
to = ["done"]
[actions.stop]
to = ["aborted"]
"#;

#[tokio::test]
async fn an_operator_cancels_an_operation_and_its_entity_runs_its_undo() {
    let tokens = Tokens::from_spec("reader=reader-token-00001;operator=operator-token-01").unwrap();
    let app = App::with_machines(tokens, Config::default(), &[("job", JOB)]).await;
    let engine = app.state.engine();
    engine.create("job", "w1", Default::default()).await.unwrap();
    let start = settle_engine::RaiseOptions {
        request_id: Some("start-w1".into()),
        ..settle_engine::RaiseOptions::wait(settle_engine::Wait::Outcome)
    };
    engine.raise("job", "w1", "start", start).await.unwrap();
    let cancel = |id: &str, token: &str, body: Option<serde_json::Value>| {
        let r = Req::new("POST", &format!("/v1/operations/{id}/cancel")).token(Some(token));
        match body {
            Some(b) => r.json(b),
            None => r,
        }
    };

    app.call(cancel("start-w1", "reader-token-00001", None)).await.problem(403, "forbidden");
    app.call(cancel("nobody", "operator-token-01", None)).await.problem(404, "unknown-operation");

    let body = json!({"reason": "customer withdrew", "undone": true});
    let done = app.call(cancel("start-w1", "operator-token-01", Some(body))).await;
    assert_eq!(done.status.as_u16(), 200, "{}", done.text);
    let r = done.json();
    assert_eq!(r["operation"]["outcome"], json!("canceled"), "{r}");
    assert_eq!((r["replayed"].clone(), r["bulk"]["reason"].clone()), (json!(false), json!("customer withdrew")));
    let w1 = &r["entities"][0];
    assert_eq!(w1["entity"]["state"], json!("aborted"), "{r}");
    assert_eq!(w1["did"], json!("cancel of operation start-w1: its work stopped, `abort` raised"));
    assert_eq!(w1["part"]["outcome"], json!("success"));
    let part = w1["part"]["request_id"].as_str().unwrap().to_string();

    let again = app.call(cancel("start-w1", "operator-token-01", None)).await;
    assert_eq!(again.status.as_u16(), 200, "{}", again.text);
    assert_eq!(again.json()["replayed"], json!(true));
    let encoded = part.replace('/', "%2F");
    let p = app.call(cancel(&encoded, "operator-token-01", None)).await.problem(409, "operation-ended");
    assert_eq!(p["outcome"], json!("success"), "{p}");
}
