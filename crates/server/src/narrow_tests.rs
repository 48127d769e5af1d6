//! Lists, error groups, bulk operations and operations narrowed by what no index holds (a
//! property expression, error text, time ranges), through the router on a real SQLite
//! store with a controllable clock.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};
use settle_engine::ManualClock;

use crate::Config;
use crate::auth::Tokens;
use crate::testkit::{VM, query_value as q};
use crate::tests::{App, Req};

const T0: i64 = 1_795_000_000_000;

/// An app serving `vm` on a manual clock at [`T0`], with `n` vms created (`v-0000` …,
/// region `eu` for even numbers, `us` for odd, `n` their number), the first half an hour
/// before the second.
async fn fleet(n: usize) -> (App, ManualClock) {
    let clock = ManualClock::new(T0);
    let engine = settle_engine::Config { clock: std::sync::Arc::new(clock.clone()), ..Default::default() };
    let app = App::with_engine(Tokens::open(), Config::default(), &[("vm", VM)], engine).await;
    for half in [0..n / 2, n / 2..n] {
        let mut creates = tokio::task::JoinSet::new();
        for i in half {
            let engine = app.state.engine().clone();
            creates.spawn(async move {
                let region = if i % 2 == 0 { "eu" } else { "us" };
                let props = json!({"region": region, "n": i}).as_object().unwrap().clone();
                engine.create_with("vm", &format!("v-{i:04}"), props, None).await.unwrap();
            });
        }
        creates.join_all().await;
        clock.advance(Duration::from_secs(1800));
    }
    (app, clock)
}

/// Every page of `uri` (which has no `after`), following `next`: the keys and the number
/// of pages.
async fn all_pages(app: &App, uri: &str) -> (Vec<String>, usize) {
    let (mut keys, mut pages, mut after) = (Vec::new(), 0, None::<String>);
    loop {
        let page = match &after {
            Some(a) => app.get(&format!("{uri}&after={a}")).await.json(),
            None => app.get(uri).await.json(),
        };
        pages += 1;
        keys.extend(page["items"].as_array().unwrap().iter().map(|e| e["key"].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return (keys, pages),
        }
    }
}

#[tokio::test]
async fn a_list_narrowed_by_what_no_index_holds_examines_a_bounded_page_and_goes_on() {
    let (app, _clock) = fleet(1_100).await;
    // A rare match past the first thousand: the first page holds none, yet says where to
    // go on; the second finds it.
    let rare = format!("/v1/entities?machine=vm&limit=10&where={}", q("props.n == 1050"));
    let first = app.get(&rare).await.json();
    assert_eq!(first["items"], json!([]), "{first}");
    assert!(first["next"].is_string(), "a thousand looked at, more to look at: {first}");
    let (keys, pages) = all_pages(&app, &rare).await;
    assert_eq!((keys, pages), (vec!["v-1050".to_string()], 2));
    // Many matches: full pages in order, each entity once.
    let eu = format!("/v1/entities?machine=vm&limit=100&where={}", q(r#"props.region == "eu""#));
    let (keys, _) = all_pages(&app, &eu).await;
    assert_eq!(keys.len(), 550);
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "in order, none twice");
    assert!(keys.iter().all(|k| k[2..].parse::<u32>().unwrap() % 2 == 0));
    // A total counts what passes (exact below its bound); a missing property does not pass.
    let total = app.get(&format!("{eu}&total=true")).await.json();
    assert_eq!(total["total"], json!({"count": 550, "exact": true}));
    let typo = app.get(&format!("/v1/entities?machine=vm&total=true&where={}", q("props.regoin == 1"))).await.json();
    assert_eq!(typo["total"]["count"], 0);
    // Created times: the first half half an hour before the second; `-45m` is read at now.
    let early = app.get(&format!("/v1/entities?machine=vm&total=true&created_before={}", q("-45m"))).await.json();
    assert_eq!(early["total"], json!({"count": 550, "exact": true}));
    let late = app.get("/v1/entities?machine=vm&total=true&created_after=2026-11-18T11:36:40Z").await.json();
    assert_eq!(late["total"]["count"], 550, "RFC 3339, inclusive");
    let both = format!("created_after={}&created_before={}&where={}", q("-45m"), q("-15m"), q("props.n < 560"));
    let (keys, _) = all_pages(&app, &format!("/v1/entities?machine=vm&{both}")).await;
    assert_eq!(keys, (550..560).map(|i| format!("v-{i:04}")).collect::<Vec<_>>());
    // Together with a key prefix: pages by key.
    let prefixed = format!("/v1/entities?prefix=v-10&limit=5&where={}", q("props.n % 10 == 0"));
    let (keys, _) = all_pages(&app, &prefixed).await;
    assert_eq!(keys, (0..10).map(|i| format!("v-10{i}0")).collect::<Vec<_>>());
    app.stop().await;
}

#[tokio::test]
async fn bad_narrowing_criteria_name_their_field() {
    let (app, _clock) = fleet(2).await;
    let cases = [
        (format!("where={}", q("props.n ==")), "where"),
        (format!("where={}", q("params.x")), "where"),
        ("created_after=yesterday".to_string(), "created_after"),
        ("entered_before=2026-13-01T00:00:00Z".to_string(), "entered_before"),
        (format!("entered_after={}&entered_before={}", q("-1h"), q("-2h")), "entered_before"),
        ("error=".to_string(), "error"),
    ];
    for (query, field) in cases {
        let p = app.get(&format!("/v1/entities?{query}")).await.problem(400, "bad-request");
        assert_eq!(p["field"], field, "{query}: {p}");
    }
    let p = app.get("/v1/operations?started_after=soon").await.problem(400, "bad-request");
    assert_eq!(p["field"], "started_after");
    // In a bulk operation's filter: 422, the member named; nothing started.
    let body = json!({"action": "pause", "filter": {"machine": "vm", "where": "props.n =="}, "reason": "r"});
    let p = app.call(Req::new("POST", "/v1/bulk").json(body)).await.problem(422, "invalid-bulk");
    assert_eq!(p["field"], "filter.where", "{p}");
    let body = json!({"action": "pause", "filter": {"entered_before": "tomorrow"}, "reason": "r"});
    let p = app.call(Req::new("POST", "/v1/bulk").json(body)).await.problem(422, "invalid-bulk");
    assert_eq!(p["field"], "filter.entered_before", "{p}");
    assert_eq!(app.get("/v1/bulk").await.json()["items"], json!([]));
    app.stop().await;
}

/// Parks `keys` (vms in `new`): each one's task fails for good with `error(key)`.
async fn park(app: &App, keys: &[&str], error: impl Fn(&str) -> String) {
    for k in keys {
        let r = app.post(&format!("/v1/machines/vm/entities/{k}/events/create"), json!({})).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    }
    let mut failed = 0;
    while failed < keys.len() {
        let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "max": 100, "wait_ms": 5000})).await;
        for t in leased.json()["tasks"].as_array().unwrap() {
            let (id, token, key) =
                (t["id"].as_i64().unwrap(), t["token"].as_str().unwrap(), t["key"].as_str().unwrap());
            let body = json!({"token": token, "error": error(key), "retryable": false});
            let r = app.post(&format!("/v1/tasks/{id}/fail"), body).await;
            assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
            failed += 1;
        }
    }
    for _ in 0..500 {
        let parked = app.get("/v1/entities?machine=vm&status=failed&limit=1000").await.json();
        if parked["items"].as_array().unwrap().len() == keys.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the vms did not park");
}

#[tokio::test]
async fn parked_errors_group_across_pages_and_a_group_pages_and_bulks_by_its_text() {
    let (app, _clock) = fleet(40).await;
    let keys: Vec<String> = (0..12).map(|i| format!("v-{i:04}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    park(&app, &keys, |k| {
        let n: u32 = k[2..].parse().unwrap();
        if n.is_multiple_of(3) {
            format!("disk {n} full on host {}", n * 7)
        } else {
            format!("no quota in zone {}", n % 2)
        }
    })
    .await;
    let groups = app.get("/v1/entities/error-groups?machine=vm&status=failed").await.json();
    let view: Vec<(Value, Value)> =
        groups["groups"].as_array().unwrap().iter().map(|g| (g["error"].clone(), g["count"].clone())).collect();
    let quota = "a failed task # (attempt #): no quota in zone #";
    let disk = "a failed task # (attempt #): disk # full on host #";
    assert_eq!(view, [(json!(quota), json!(8)), (json!(disk), json!(4))], "{groups}");
    assert_eq!((&groups["examined"], &groups["exact"]), (&json!(12), &json!(true)));
    assert!(groups["groups"][1]["details"].as_str().unwrap().contains("disk 0 full on host 0"), "{groups}");
    // The whole fleet: those with no error recorded are a group of their own.
    let all = app.get("/v1/entities/error-groups?machine=vm").await.json();
    assert_eq!((&all["groups"][0]["error"], &all["groups"][0]["count"]), (&Value::Null, &json!(28)), "{all}");
    // A group's text as the list's `error` pages through its members, and only them.
    let (members, _) =
        all_pages(&app, &format!("/v1/entities?machine=vm&status=failed&limit=2&error={}", q(disk))).await;
    assert_eq!(members, ["v-0000", "v-0003", "v-0006", "v-0009"]);
    let plain = app.get("/v1/entities?machine=vm&total=true&error=QUOTA%20in%20zone%201").await.json();
    assert_eq!(plain["total"]["count"], 4, "plain text, ignoring case; numbers as written");
    // A bulk resume of the group: its dry run's count is what it changes.
    let filter = json!({"machine": "vm", "status": "failed", "error": disk});
    let dry = app.post("/v1/bulk", json!({"action": "resume", "filter": filter, "dry_run": true})).await.json();
    assert_eq!((&dry["count"], &dry["filter"]), (&json!(4), &filter), "{dry}");
    // (At the most entities a second: the bulk never waits on the manual clock.)
    let body = json!({"action": "kill", "filter": filter, "reason": "hosts replaced", "rate": 100_000});
    let r = app.call(Req::new("POST", "/v1/bulk").header("Idempotency-Key", "disks").json(body)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let done = app.state.engine().bulk_wait("disks", Duration::from_secs(30)).await.unwrap();
    assert_eq!((done.done, done.failed), (4, 0));
    let killed = app.get("/v1/entities?machine=vm&status=killed&limit=100").await.json();
    let killed: Vec<&str> = killed["items"].as_array().unwrap().iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(killed, ["v-0000", "v-0003", "v-0006", "v-0009"]);
    app.stop().await;
}

#[tokio::test]
async fn a_bulk_operation_reaches_what_its_expression_and_times_select_and_echoes_them() {
    let (app, clock) = fleet(200).await;
    let filter = json!({"machine": "vm", "where": "props.region == \"us\" && props.n < 150", "created_before": "-45m"});
    let dry = app.post("/v1/bulk", json!({"action": "pause", "filter": filter, "dry_run": true})).await.json();
    assert_eq!(dry["count"], 50, "{dry}");
    assert!(dry["sample"].as_array().unwrap().iter().all(|e| e["key"].as_str().unwrap() < "v-0100"));
    let body = json!({"action": "pause", "filter": filter, "reason": "us maintenance", "rate": 100_000});
    let r = app.call(Req::new("POST", "/v1/bulk").header("Idempotency-Key", "us").json(body)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.json()["total"], 50);
    // The bulk keeps to its rate on the engine's clock: move it on until it ends.
    let done = loop {
        clock.advance(Duration::from_secs(1));
        match app.state.engine().bulk_wait("us", Duration::from_millis(20)).await {
            Ok(b) => break b,
            Err(settle_engine::Error::Timeout { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!((done.done, done.failed), (50, 0));
    let paused = app.get("/v1/entities?status=paused&total=true&limit=1").await.json();
    assert_eq!(paused["total"]["count"], 50);
    // The stored filter reads back with its time as the instant it stood for.
    let got = app.get("/v1/bulk/us").await.json();
    assert_eq!(got["filter"]["where"], filter["where"]);
    assert_eq!(got["filter"]["created_before"], "2026-11-18T11:21:40.000Z", "{got}");
    app.stop().await;
}

#[tokio::test]
async fn operations_filter_by_machine_name_and_time_a_bounded_window_at_a_time() {
    let (app, clock) = fleet(6).await;
    for k in ["v-0000", "v-0001"] {
        app.post(&format!("/v1/machines/vm/entities/{k}/events/create"), json!({})).await;
    }
    clock.advance(Duration::from_secs(60));
    app.call(Req::new("POST", "/v1/machines/vm/entities/v-0002/pause")).await;
    let names = |v: Value| -> Vec<String> {
        v["items"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap().to_string()).collect()
    };
    let creates = app.get(&format!("/v1/operations?name={}", q("vm:new"))).await.json();
    assert_eq!(names(creates.clone()).len(), 6, "{creates}");
    assert_eq!(names(app.get("/v1/operations?name=vm.create").await.json()).len(), 2);
    let of_vm = app.get("/v1/operations?machine=vm&limit=100").await.json();
    assert_eq!(names(of_vm).len(), 9);
    assert_eq!(app.get("/v1/operations?machine=door").await.json()["items"], json!([]));
    let recent = app.get(&format!("/v1/operations?started_after={}", q("-30s"))).await.json();
    assert_eq!(names(recent), ["vm.pause"]);
    let earlier = app.get(&format!("/v1/operations?started_before={}&limit=2", q("-30s"))).await.json();
    assert_eq!(names(earlier.clone()).len(), 2);
    assert!(earlier["next"].is_string(), "a full page: more follow");
    app.stop().await;
}

#[tokio::test]
async fn a_list_by_entered_time_pages_both_ways_through_its_index() {
    let (app, clock) = fleet(30).await;
    // Three vms move on, one a second: they entered `provisioning` in this order.
    let moved = ["v-0020", "v-0003", "v-0010"];
    for k in moved {
        clock.advance(Duration::from_secs(1));
        let r = app.post(&format!("/v1/machines/vm/entities/{k}/events/create"), json!({})).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    }
    for _ in 0..500 {
        let p = app.get("/v1/entities?machine=vm&state=provisioning&total=true").await.json();
        if p["total"]["count"] == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let keys = |v: &Value| -> Vec<String> {
        v["items"].as_array().unwrap().iter().map(|e| e["key"].as_str().unwrap().to_string()).collect()
    };
    let first = app.get("/v1/entities?machine=vm&state=provisioning&sort=entered").await.json();
    assert_eq!(keys(&first), moved);
    let newest = app.get("/v1/entities?machine=vm&state=provisioning&sort=-entered").await.json();
    assert_eq!(keys(&newest), moved.iter().rev().copied().collect::<Vec<_>>());
    // The whole machine, in pages of 7: each half in id order (they entered together),
    // the earlier half first, then the three that moved.
    let by_id: Vec<(String, u64)> = app.get("/v1/entities?machine=vm&limit=100").await.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap().to_string(), e["created_at"].as_u64().unwrap()))
        .collect();
    let mut want: Vec<String> = Vec::new();
    for half in [T0 as u64, T0 as u64 + 1_800_000] {
        want.extend(by_id.iter().filter(|(k, at)| *at == half && !moved.contains(&k.as_str())).map(|(k, _)| k.clone()));
    }
    want.extend(moved.iter().map(|k| k.to_string()));
    let (paged, pages) = all_pages(&app, "/v1/entities?machine=vm&sort=entered&limit=7").await;
    assert_eq!((paged, pages), (want.clone(), 5));
    let (paged, _) = all_pages(&app, "/v1/entities?machine=vm&sort=-entered&limit=7").await;
    assert_eq!(paged, want.iter().rev().cloned().collect::<Vec<_>>());
    // A page's `next` is `entered.id`; an entity's id or `machine/key` names the same place.
    let page = app.get("/v1/entities?machine=vm&sort=entered&limit=7").await.json();
    let next = page["next"].as_str().unwrap();
    let (at, id) = next.split_once('.').unwrap();
    assert!(at.parse::<i64>().is_ok() && id.parse::<i64>().is_ok(), "{next}");
    let after_next = keys(&app.get(&format!("/v1/entities?machine=vm&sort=entered&limit=7&after={next}")).await.json());
    let after_id = keys(&app.get(&format!("/v1/entities?machine=vm&sort=entered&limit=7&after={id}")).await.json());
    let last = &keys(&page)[6];
    let after_key =
        keys(&app.get(&format!("/v1/entities?machine=vm&sort=entered&limit=7&after=vm/{last}")).await.json());
    assert_eq!((&after_id, &after_key), (&after_next, &after_next));
    let total = app.get("/v1/entities?machine=vm&sort=-entered&total=true&limit=1").await.json();
    assert_eq!(total["total"], json!({"count": 30, "exact": true}));
    // A total counts from the start, whatever the cursor, narrowed or not.
    let narrowed = format!("/v1/entities?machine=vm&sort=entered&total=true&after={next}&where={}", q("props.n >= 0"));
    assert_eq!(app.get(&narrowed).await.json()["total"], json!({"count": 30, "exact": true}));
    // What it cannot be combined with, and an unknown order: 400 naming `sort`.
    for query in ["sort=sideways", "sort=entered&prefix=v-", "sort=-entered&status=active"] {
        let p = app.get(&format!("/v1/entities?{query}")).await.problem(400, "bad-request");
        assert_eq!(p["field"], "sort", "{query}: {p}");
    }
    app.stop().await;
}
