//! What a hostile web page or a token guesser can do to the server (issue 27): DNS
//! rebinding, cross-site requests on a server without tokens, one queue's agents holding
//! every long poll, guessing tokens. Each refusal changes nothing in the store.

use axum::http::StatusCode;
use serde_json::json;

use crate::Config;
use crate::auth::Tokens;
use crate::browser::Policy;
use crate::metrics::Refusal;
use crate::testkit::{DOOR, VM};
use crate::tests::{App, Req};

/// A machine whose action agents of queue `dns` execute (beside `vm`'s `cloud`).
const RECORD: &str = "initial = \"new\"\n[states.new]\n[states.publishing]\nauto = \"publish\"\n[states.live]\n\
                      [events.create]\nin = [\"new\"]\naction = \"begin\"\n[actions.begin]\nto = [\"publishing\"]\n\
                      [actions.publish]\nto = [\"live\"]\nagent = \"dns\"\n";

/// Every `POST` operation of the document, its path filled in for entity `d` of `door`.
fn post_routes(app: &App) -> Vec<String> {
    let doc = crate::openapi(&app.state);
    let mut routes: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, item)| item.get("post").is_some())
        .map(|(path, _)| {
            path.replace("{machine}", "door")
                .replace("{key}", "d")
                .replace("{event}", "open")
                .replace("{queue}", "cloud")
                .replace("{id}", "1")
        })
        .collect();
    routes.sort();
    assert!(routes.len() >= 12, "{routes:?}");
    routes
}

#[tokio::test]
async fn a_rebinding_host_is_refused_on_every_route_and_changes_nothing() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("door", DOOR), ("vm", VM)]).await;
    assert_eq!(app.post("/v1/machines/door/entities", json!({"key": "d"})).await.status, StatusCode::CREATED);
    let mut table = Vec::new();
    for host in ["rebind.evil.example", "rebind.evil.example:7400", "localhost.evil.example", "10.9.9.9:7400"] {
        for path in ["/v1/entities", "/v1/machines/door/entities/d", "/ui/", "/healthz", "/openapi.json", "/nowhere"] {
            table.push((Req::new("GET", path).header("Host", host), 403, "host-not-allowed", Some("Host")));
        }
        for path in post_routes(&app) {
            let req = Req::new("POST", &path).header("Host", host).json(json!({}));
            table.push((req, 403, "host-not-allowed", Some("Host")));
        }
    }
    let refused = table.len() as u64;
    app.assert_problems(table).await;
    assert_eq!(app.state.refusals().get(Refusal::Host), refused);
    // The server's own names: loopback, `localhost`.
    for host in ["127.0.0.1:7400", "localhost:7400", "[::1]:7400"] {
        let r = app.call(Req::new("GET", "/v1/entities").header("Host", host)).await;
        assert_eq!(r.status, StatusCode::OK, "{host}: {}", r.text);
    }
    app.stop().await;

    // A host the operator allows; any host (with tokens, in the binary).
    let config = Config { browser: Policy::new().allow_host("settle.internal").unwrap(), ..Config::default() };
    let app = App::with_config(Tokens::open(), config).await;
    assert_eq!(app.call(Req::new("GET", "/healthz").header("Host", "settle.internal:7400")).await.status, 200);
    app.call(Req::new("GET", "/healthz").header("Host", "evil.internal")).await.problem(403, "host-not-allowed");
    app.stop().await;
}

#[tokio::test]
async fn a_page_of_another_origin_cannot_change_a_tokenless_server() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("door", DOOR), ("vm", VM)]).await;
    assert_eq!(app.post("/v1/machines/door/entities", json!({"key": "d"})).await.status, StatusCode::CREATED);
    let host = ("Host", "127.0.0.1:7400");
    let mut table = Vec::new();
    for path in post_routes(&app) {
        // A simple request a page may send unasked, and a browser that sends no `Origin`.
        for (content_type, body) in [
            (None, ""),
            (Some("text/plain"), "{}"),
            (Some("application/x-www-form-urlencoded"), "a=b"),
            (Some("multipart/form-data; boundary=x"), "--x--"),
        ] {
            let req = Req::new("POST", &path).header(host.0, host.1).raw(content_type, body);
            table.push((req, 415, "unsupported-media-type", Some("Content-Type")));
        }
        // With `Origin`, whatever it sends.
        for origin in ["http://127.0.0.1:7401", "http://evil.example", "null"] {
            let req = Req::new("POST", &path).header(host.0, host.1).header("Origin", origin).json(json!({}));
            table.push((req, 403, "origin-not-allowed", Some("Origin")));
            let req = Req::new("POST", &path).header(host.0, host.1).header("Origin", origin).raw(None, "");
            table.push((req, 403, "origin-not-allowed", Some("Origin")));
        }
    }
    // Reads too, when the browser says where they come from.
    let read = Req::new("GET", "/v1/entities").header(host.0, host.1).header("Origin", "http://evil.example");
    table.push((read, 403, "origin-not-allowed", Some("Origin")));
    app.assert_problems(table).await;
    assert!(app.state.refusals().get(Refusal::SimpleRequest) >= 48);
    assert!(app.state.refusals().get(Refusal::Origin) >= 72);
    // The dashboard, from the server's own origin, with JSON: works.
    let own = Req::new("POST", "/v1/machines/door/entities/d/kill").header(host.0, host.1);
    let r = app.call(own.header("Origin", "http://127.0.0.1:7400")).await;
    assert_eq!(r.json()["run_status"], "killed", "{}", r.text);
    // `/metrics` counts the refusals.
    let metrics = app.get("/metrics").await.text;
    assert!(metrics.contains("settle_http_refused_total{reason=\"origin\"} "), "{metrics}");
    app.stop().await;

    // An origin the operator allows (the public URL of a proxy in front).
    let browser = Policy::new().allow_origin("https://settle.example.com").unwrap();
    let app = App::with_config(Tokens::open(), Config { browser, ..Config::default() }).await;
    let proxied = Req::new("POST", "/v1/machines/door/entities").header("Origin", "https://settle.example.com");
    assert_eq!(app.call(proxied.json(json!({"key": "p"}))).await.status, StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test]
async fn a_queues_agent_gets_its_poll_while_another_queues_agents_hold_theirs() {
    let tokens = Tokens::from_spec(
        "agent:cloud=cloud-agent-token-1;agent:cloud=cloud-agent-token-2;agent:dns=dns-agent-token-01",
    )
    .unwrap();
    // 8 polls: 4 per queue; cloud's split between its two agents, 2 each.
    let config = Config { max_polls: 8, ..Config::default() };
    let app = App::with_machines(tokens, config, &[("vm", VM), ("record", RECORD)]).await;
    let poll = |token: &str, queue: &str, wait_ms: u64| {
        Req::new("POST", &format!("/v1/queues/{queue}/lease"))
            .token(Some(token))
            .json(json!({"agent": token, "wait_ms": wait_ms}))
    };
    // Both agents of `cloud` take every permit they have, and hold them.
    let router = std::sync::Arc::new(app);
    let mut held = Vec::new();
    for token in ["cloud-agent-token-1", "cloud-agent-token-2"] {
        for _ in 0..2 {
            let (app, token) = (router.clone(), token.to_string());
            held.push(tokio::spawn(async move {
                // Until it holds a permit (our check below may hold one for a moment).
                while app.call(poll(&token, "cloud", 30_000)).await.status == StatusCode::TOO_MANY_REQUESTS {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }));
        }
    }
    // Once they all wait, a third poll of each is refused (a short one that got a permit
    // means one of ours had not started yet: it ends at once, and we ask again).
    let app = router.clone();
    for token in ["cloud-agent-token-1", "cloud-agent-token-2"] {
        let mut tries = 0;
        loop {
            let r = app.call(poll(token, "cloud", 1)).await;
            if r.status == StatusCode::TOO_MANY_REQUESTS {
                let p = r.problem(429, "too-many-polls");
                assert!(p["detail"].as_str().unwrap().contains("this token holds its 2 long polls"), "{p}");
                assert_eq!(r.header("retry-after"), "1");
                break;
            }
            tries += 1;
            assert!(tries < 500, "the held polls never started: {} {}", r.status, r.text);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    // The agent of `dns` gets its poll (an answer within its wait, not 429).
    let r = app.call(poll("dns-agent-token-01", "dns", 50)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["tasks"], json!([]));
    assert!(app.state.refusals().get(Refusal::TooManyPolls) >= 2);
    for h in held {
        h.abort();
    }
    app.state.engine().shutdown().await;
}

#[tokio::test]
async fn an_address_guessing_tokens_is_slowed() {
    let clock = settle_engine::ManualClock::new(1_795_000_000_000);
    let engine = settle_engine::Config { clock: std::sync::Arc::new(clock.clone()), ..Default::default() };
    let tokens = Tokens::from_spec("admin=admin-token-00001").unwrap();
    let app = App::with_engine(tokens, Config::default(), &[("door", DOOR)], engine).await;
    let get = |token: &str, from: &str| Req::new("GET", "/v1/machines").token(Some(token)).peer(from);
    let guesser = "192.0.2.10:50000";
    // Ten unknown tokens a minute, in a burst: each a 401.
    for i in 0..10 {
        app.call(get(&format!("guess-{i:011}"), guesser)).await.problem(401, "unauthorized");
    }
    // Then every request of the address with a token is refused before its token is
    // looked at, the right one too, on any route; `Retry-After` says when one is back.
    for req in [
        get("guess-99999999999", guesser),
        get("admin-token-00001", guesser),
        Req::new("GET", "/v1/session").token(Some("admin-token-00001")).peer(guesser),
        Req::new("GET", "/healthz").token(Some("guess-99999999999")).peer("192.0.2.10:50001"),
    ] {
        let r = app.call(req).await;
        let p = r.problem(429, "auth-throttled");
        assert_eq!((r.header("retry-after"), &p["retry_after"]), ("6", &json!(6)), "{p}");
    }
    // Without a token it is no guess; another address is not affected.
    assert_eq!(app.call(Req::new("GET", "/healthz").peer(guesser)).await.status, StatusCode::OK);
    assert_eq!(app.call(get("admin-token-00001", "192.0.2.11:50000")).await.status, StatusCode::OK);
    // `/v1/session` counts a wrong token like any route (it says whether one is valid).
    for i in 0..10 {
        let req = Req::new("GET", "/v1/session").token(Some(&format!("guess-{i:011}"))).peer("192.0.2.12:1");
        assert_eq!(app.call(req).await.json()["signed_in"], false);
    }
    let r = app.call(Req::new("GET", "/v1/session").token(Some("guess-0")).peer("192.0.2.12:1")).await;
    r.problem(429, "auth-throttled");
    // Six seconds later one failure is back.
    clock.advance(std::time::Duration::from_secs(6));
    assert_eq!(app.call(get("admin-token-00001", guesser)).await.status, StatusCode::OK);
    let refusals = app.state.refusals();
    assert_eq!((refusals.get(Refusal::UnknownToken), refusals.get(Refusal::AuthThrottled)), (20, 5));
    app.stop().await;
}
