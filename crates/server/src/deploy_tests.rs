//! Deploying versions through the router on a real SQLite store: `POST /v1/machines`
//! (admin only) stores a pinned version while an entity works under the old one, the
//! entity's page shows its own version's permitted events and the machine its new one, a
//! dry run changes nothing, a stranding version is refused with the entities' keys, a bad
//! file names itself, and a machine a deploy adds is served at once.

use serde_json::json;

use crate::Config;
use crate::auth::Tokens;
use crate::tests::{App, Req};

/// `job` v1: new -start→ working (its auto action waits an hour) → done; `poke` in working.
const V1: &str = r#"
initial = "new"
upgrade = "pin"
[states.new]
[states.working]
auto = "finish"
wait = "1h"
[states.done]
[events.start]
in = ["new"]
action = "begin"
[events.poke]
in = ["working"]
action = "touch"
[actions.begin]
to = ["working"]
[actions.touch]
to = ["working"]
[actions.finish]
to = ["done"]
"#;

/// v2: `done` is `finished`, `poke` is gone, `nudge` is new.
const V2: &str = r#"
initial = "new"
upgrade = "pin"
[states.new]
[states.working]
auto = "finish"
wait = "1h"
[states.finished]
renamed_from = ["done"]
[events.start]
in = ["new"]
action = "begin"
[events.nudge]
in = ["working"]
action = "touch"
[actions.begin]
to = ["working"]
[actions.touch]
to = ["working"]
[actions.finish]
to = ["finished"]
"#;

fn body(files: &[(&str, &str)], dry_run: bool) -> serde_json::Value {
    let files: Vec<_> = files.iter().map(|(name, toml)| json!({"name": name, "toml": toml})).collect();
    json!({"files": files, "dry_run": dry_run})
}

#[tokio::test]
async fn an_admin_deploys_a_pinned_version_and_each_entity_shows_its_own() {
    let tokens = Tokens::from_spec("admin=admin-token-00001;operator=operator-token-01").unwrap();
    let app = App::with_machines(tokens, Config::default(), &[("job", V1)]).await;
    let admin = |b: serde_json::Value| Req::new("POST", "/v1/machines").token(Some("admin-token-00001")).json(b);
    let get = |uri: &str| app.call(Req::new("GET", uri).token(Some("admin-token-00001")));
    let engine = app.state.engine();
    engine.create("job", "w1", Default::default()).await.unwrap();
    let outcome = settle_engine::RaiseOptions::wait(settle_engine::Wait::Outcome);
    engine.raise("job", "w1", "start", outcome).await.unwrap();
    let v1 = engine.machine("job").unwrap().content_hash();

    // An operator may not deploy.
    let op = Req::new("POST", "/v1/machines").token(Some("operator-token-01")).json(body(&[("job.toml", V2)], false));
    app.call(op).await.problem(403, "forbidden");

    let dry = app.call(admin(body(&[("job.toml", V2)], true))).await;
    assert_eq!(dry.status.as_u16(), 200, "{}", dry.text);
    assert_eq!(dry.json()["dry_run"], true);
    assert_eq!(engine.machine("job").unwrap().content_hash(), v1, "a dry run changes nothing");

    let done = app.call(admin(body(&[("job.toml", V2)], false))).await;
    assert_eq!(done.status.as_u16(), 200, "{}", done.text);
    let d = &done.json()["machines"][0];
    assert_eq!(
        (d["machine"].clone(), d["upgrade"].clone(), d["pinned"].clone()),
        (json!("job"), json!("pin"), json!(1))
    );
    assert_eq!(d["previous"], json!(v1));
    let v2 = d["version"].as_str().unwrap().to_string();

    // The machine is v2; w1 still works under v1, and its page says so.
    let m = get("/v1/machines").await.json();
    assert_eq!(m["items"][0]["hash"], json!(v2), "{m}");
    let w1 = get("/v1/machines/job/entities/w1").await.json();
    assert_eq!(w1["machine_version"], json!(v1));
    assert_eq!(w1["permitted_events"], json!(["poke"]), "its own version's events: {w1}");
    let versions = get("/v1/machines/job/versions").await.json();
    let counts: Vec<(String, u64, bool)> = versions
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (v["hash"].as_str().unwrap().to_string(), v["entities"].as_u64().unwrap(), v["current"].as_bool().unwrap())
        })
        .collect();
    assert_eq!(counts, [(v1.clone(), 1, false), (v2.clone(), 0, true)]);

    // A version without the working state's rest is refused, naming w1; nothing changes.
    let v3 = V2
        .replace("[states.finished]\nrenamed_from = [\"done\"]\n", "")
        .replace("to = [\"finished\"]", "to = [\"new\"]");
    let refused = app.call(admin(body(&[("job.toml", &v3)], false))).await;
    let p = refused.problem(409, "version-strands-entities");
    assert_eq!(p["stranded"][0]["keys"], json!(["w1"]), "{p}");
    assert_eq!(p["stranded"][0]["rest"], json!("done"), "{p}");
    assert_eq!(engine.machine("job").unwrap().content_hash(), v2);

    // A file that does not load names itself; two of one machine are refused.
    let bad = app.call(admin(body(&[("job.toml", "initial = 3")], false))).await;
    let p = bad.problem(422, "invalid-definition");
    assert_eq!(p["field"], json!("files[0]"), "{p}");
    let twice =
        app.call(admin(body(&[("job.toml", V2), ("again.toml", &format!("name = \"job\"\n{V2}"))], false))).await;
    twice.problem(422, "invalid-definition");

    // A new machine is served at once.
    let door = "initial = \"shut\"\n[states.shut]\n[states.open]\n[events.open]\nin = [\"shut\"]\naction = \"o\"\n[actions.o]\nto = [\"open\"]\n";
    let added = app.call(admin(body(&[("door.toml", door)], false))).await;
    assert_eq!(added.status.as_u16(), 200, "{}", added.text);
    assert_eq!(added.json()["machines"][0]["previous"], json!(null));
    let create =
        Req::new("POST", "/v1/machines/door/entities").token(Some("operator-token-01")).json(json!({"key": "d1"}));
    let created = app.call(create).await;
    assert_eq!(created.status.as_u16(), 201, "{}", created.text);
}
