//! Handler tests: the router on a real SQLite store in a temporary directory, called with
//! `tower::ServiceExt::oneshot`.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use settle_engine::Engine;
use settle_store::{AnyStore, SqliteStore};
use tower::ServiceExt;

use crate::auth::Tokens;
use crate::testkit::{DOOR, PART, SITE, VM};
use crate::{AppState, Config};

pub(crate) struct App {
    _dir: tempfile::TempDir,
    pub state: AppState,
    pub router: Router,
}

impl App {
    pub async fn new(tokens: Tokens) -> App {
        App::with_config(tokens, Config::default()).await
    }

    pub async fn with_config(tokens: Tokens, config: Config) -> App {
        App::with_machines(tokens, config, &[("door", DOOR)]).await
    }

    /// An app serving the TOML machines `machines` (name, definition).
    pub async fn with_machines(tokens: Tokens, config: Config, machines: &[(&str, &str)]) -> App {
        App::with_engine(tokens, config, machines, settle_engine::Config::default()).await
    }

    /// An app serving the TOML machines `machines` on an engine configured with `engine`
    /// (its clock, say).
    pub async fn with_engine(
        tokens: Tokens,
        config: Config,
        machines: &[(&str, &str)],
        engine: settle_engine::Config,
    ) -> App {
        let dir = tempfile::tempdir().unwrap();
        let store = AnyStore::Sqlite(SqliteStore::open(dir.path().join("settle.db")).unwrap());
        let mut b = Engine::builder(store).config(engine);
        for (name, text) in machines {
            let (m, _) = settle_core::toml::load(&format!("{name}.toml"), name, text).unwrap();
            b = b.machine(m);
        }
        let engine = b.start().await.unwrap();
        let names: Vec<&str> = machines.iter().map(|(n, _)| *n).collect();
        let state = AppState::new(engine, &names, tokens, config).unwrap();
        let router = crate::router(state.clone());
        App { _dir: dir, state, router }
    }

    pub async fn call(&self, req: Req) -> Resp {
        let mut b = Request::builder().method(req.method).uri(req.uri);
        if let Some(t) = req.token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(ct) = req.content_type {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        for (k, v) in req.headers {
            b = b.header(k, v);
        }
        if let Some(peer) = req.peer {
            // What `crate::listen` puts in every request.
            b = b.extension(axum::extract::ConnectInfo(peer));
        }
        let response = self.router.clone().oneshot(b.body(Body::from(req.body)).unwrap()).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Resp { status, headers, text: String::from_utf8_lossy(&bytes).into_owned() }
    }

    pub async fn get(&self, uri: &str) -> Resp {
        self.call(Req::new("GET", uri)).await
    }

    pub async fn post(&self, uri: &str, body: Value) -> Resp {
        self.call(Req::new("POST", uri).json(body)).await
    }

    /// Everything a request could change ([`crate::testkit::dump`]).
    pub async fn dump(&self) -> String {
        crate::testkit::dump(self.state.engine().store()).await
    }

    /// Each request of `table` is answered with its problem (status, type, and `field` if
    /// given) and changes nothing in the store.
    pub async fn assert_problems(&self, table: Vec<(Req, u16, &str, Option<&str>)>) {
        let before = self.dump().await;
        for (req, status, slug, field) in table {
            let what = format!("{} {}", req.method, req.uri);
            let r = self.call(req).await;
            assert_eq!(r.status.as_u16(), status, "{what}: {}", r.text);
            let p = r.problem(status, slug);
            if let Some(f) = field {
                assert_eq!(p["field"], f, "{what}: {p}");
            }
            assert_eq!(self.dump().await, before, "{what} changed the store");
        }
    }

    pub async fn stop(self) {
        self.state.engine().shutdown().await;
    }
}

pub(crate) struct Req {
    method: &'static str,
    uri: String,
    token: Option<String>,
    content_type: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    peer: Option<std::net::SocketAddr>,
}

impl Req {
    /// A request as a well-behaved client sends it: anything but a `GET` says JSON, even
    /// without a body (`raw` sends something else; see `crate::browser`).
    pub fn new(method: &'static str, uri: &str) -> Req {
        let content_type = (method != "GET").then(|| "application/json".to_string());
        Req {
            method,
            uri: uri.to_string(),
            token: None,
            content_type,
            headers: Vec::new(),
            body: Vec::new(),
            peer: None,
        }
    }
    pub fn json(mut self, v: Value) -> Req {
        self.content_type = Some("application/json".into());
        self.body = v.to_string().into_bytes();
        self
    }
    pub fn raw(mut self, content_type: Option<&str>, body: impl Into<Vec<u8>>) -> Req {
        self.content_type = content_type.map(str::to_string);
        self.body = body.into();
        self
    }
    pub fn token(mut self, t: Option<&str>) -> Req {
        self.token = t.map(str::to_string);
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Req {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }
    /// Sent from the client address `peer` (`ip:port`).
    pub fn peer(mut self, peer: &str) -> Req {
        self.peer = Some(peer.parse().unwrap());
        self
    }
}

#[derive(Debug)]
pub(crate) struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or("")
    }
    /// Asserts a problem document of `status` and `slug` ([`crate::testkit::problem`]), and
    /// returns it.
    #[track_caller]
    pub fn problem(&self, status: u16, slug: &str) -> Value {
        let content_type = self.headers.get("content-type").map(|v| v.to_str().unwrap());
        crate::testkit::problem(self.status.as_u16(), content_type, &self.text, status, slug)
    }
}

#[tokio::test]
async fn health_machines_definition_and_graph() {
    let app = App::new(Tokens::open()).await;
    let r = app.get("/healthz").await;
    assert_eq!((r.status, r.json()), (StatusCode::OK, json!({"status": "ok"})));
    let r = app.get("/v1/machines").await;
    let v = r.json();
    assert_eq!(v["items"][0]["name"], "door");
    assert_eq!(v["items"][0]["states"], json!(["closed", "open", "gone"]));
    assert_eq!(v["items"][0]["events"], json!(["open", "close", "paint", "remove"]));
    // Its retention: the deployment's defaults, as no definition says otherwise.
    assert_eq!(v["items"][0]["retention"], json!([{"state": "gone", "keep": "30d"}]));
    assert_eq!(
        (v["items"][0]["history"].as_str(), v["items"][0]["archived"].as_bool()),
        (Some("forever"), Some(false))
    );
    let hash = v["items"][0]["hash"].as_str().unwrap().to_string();
    let r = app.get("/v1/machines/door").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["initial"], "closed");
    assert_eq!(r.header("etag"), format!("\"{hash}\""));
    let r = app.get("/v1/machines/door/graph").await;
    assert!(r.text.starts_with("stateDiagram-v2"), "{}", r.text);
    assert!(r.header("content-type").starts_with("text/plain"));
    let r = app.get("/v1/machines/door/graph?format=dot").await;
    assert!(r.text.starts_with("digraph"), "{}", r.text);
    let r = app.get("/v1/machines/door/graph?format=svg").await;
    assert_eq!(r.header("content-type"), "image/svg+xml; charset=utf-8");
    assert!(r.text.contains(r#"data-state="closed""#), "{}", r.text);
    app.get("/v1/machines/door/graph?format=png").await.problem(400, "bad-request");
    app.get("/v1/machines/nope").await.problem(404, "unknown-machine");
    app.get("/v1/nothing/here").await.problem(404, "unknown-route");
    app.call(Req::new("DELETE", "/v1/machines")).await.problem(405, "method-not-allowed");
    let r = app.get("/metrics").await;
    assert!(r.text.contains("# TYPE settle_entities gauge"), "{}", r.text);
    app.stop().await;
}

#[tokio::test]
async fn create_get_list_and_history() {
    let app = App::new(Tokens::open()).await;
    let r = app.post("/v1/machines/door/entities", json!({"key": "front door", "properties": {"floor": 1}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.header("location"), "/v1/machines/door/entities/front%20door");
    assert_eq!(r.json()["state"], "closed");
    assert_eq!(r.json()["properties"], json!({"floor": 1}));
    let r = app.get("/v1/machines/door/entities/front%20door").await;
    assert_eq!(r.json()["permitted_events"], json!(["open", "paint", "remove"]));
    // Idempotency-Key: the replay creates nothing and answers 200.
    let create = |key: &str| {
        Req::new("POST", "/v1/machines/door/entities").json(json!({"key": key})).header("Idempotency-Key", "req-1")
    };
    assert_eq!(app.call(create("back")).await.status, StatusCode::CREATED);
    let before = app.dump().await;
    let r = app.call(create("back")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(app.dump().await, before);
    app.post("/v1/machines/door/entities", json!({"key": "back"})).await.problem(409, "entity-exists");
    app.post("/v1/machines/door/entities", json!({"key": "side"})).await;
    // Pages of two: a cursor, then the last page.
    let r = app.get("/v1/entities?machine=door&limit=2").await.json();
    assert_eq!(r["items"].as_array().unwrap().len(), 2);
    let next = r["next"].as_str().unwrap().to_string();
    let r = app.get(&format!("/v1/entities?machine=door&limit=2&after={next}")).await.json();
    assert_eq!(r["items"][0]["key"], "side");
    assert_eq!(r["next"], Value::Null);
    assert_eq!(app.get("/v1/entities?status=paused").await.json()["items"], json!([]));
    app.get("/v1/entities?status=asleep").await.problem(400, "bad-request");
    assert_eq!(app.get("/v1/entities?limit=5000").await.problem(400, "bad-request")["field"], "limit");
    assert_eq!(app.get("/v1/entities?after=x").await.problem(400, "bad-request")["field"], "after");
    assert_eq!(app.get("/v1/entities?colour=red").await.problem(400, "bad-request")["field"], "colour");
    // By key prefix: pages in key order, the cursor `machine/key`.
    app.post("/v1/machines/door/entities", json!({"key": "basement"})).await;
    let r = app.get("/v1/entities?prefix=ba&limit=1").await.json();
    assert_eq!((r["items"][0]["key"].as_str(), r["next"].as_str()), (Some("back"), Some("door/back")));
    let r = app.get("/v1/entities?prefix=ba&limit=1&after=door/back").await.json();
    assert_eq!((r["items"][0]["key"].as_str(), &r["next"]), (Some("basement"), &Value::Null));
    assert_eq!(app.get("/v1/entities?prefix=zz").await.json()["items"], json!([]));
    let p = app.get("/v1/entities?prefix=ba&after=twelve").await.problem(400, "bad-request");
    assert_eq!(p["field"], "after");
    // A cursor of the other form names an entity: it is looked up.
    let mut page = app.get("/v1/entities?limit=1").await.json();
    while page["items"][0]["key"] != "back" {
        page = app.get(&format!("/v1/entities?limit=1&after={}", page["next"].as_str().unwrap())).await.json();
    }
    let back: i64 = page["next"].as_str().unwrap().parse().unwrap();
    let r = app.get(&format!("/v1/entities?prefix=ba&after={back}")).await.json();
    assert_eq!(r["items"][0]["key"], "basement");
    let by_name = app.get("/v1/entities?after=door/back").await.json();
    assert_eq!(by_name, app.get(&format!("/v1/entities?after={back}")).await.json());
    assert_eq!(by_name["items"].as_array().unwrap().last().unwrap()["key"], "basement");
    let p = app.get("/v1/entities?prefix=ba&after=999999").await.problem(404, "unknown-entity");
    assert_eq!(p["field"], "after");
    app.get("/v1/entities?after=door/nobody").await.problem(404, "unknown-entity");
    let h = app.get("/v1/machines/door/entities/back/history").await.json();
    assert_eq!(h[0]["kind"], "create");
    assert_eq!(h[0]["to"], "closed");
    assert_eq!(h[0]["request_id"], "req-1");
    app.stop().await;
}

#[tokio::test]
async fn the_overview_counts_what_the_list_shows() {
    let app = App::new(Tokens::open()).await;
    for key in ["a", "b", "c"] {
        app.post("/v1/machines/door/entities", json!({"key": key})).await;
    }
    let o = app.get("/v1/overview").await.json();
    assert_eq!((o["entities"].as_u64(), o["parked"].as_u64()), (Some(3), Some(0)), "{o}");
    assert_eq!(
        o["counts"],
        json!([{"machine": "door", "state": "closed", "path": "closed", "run_status": "active", "health": "ok", "count": 3}])
    );
    let listed = app.get("/v1/entities?machine=door&state=closed").await.json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 3);
    // One entry per minute of the last hour; the three creations are in it.
    let minutes = o["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    assert_eq!(minutes.iter().map(|m| m["transitions"].as_u64().unwrap()).sum::<u64>(), 3);
    assert!(minutes.windows(2).all(|w| w[1]["at"].as_i64().unwrap() - w[0]["at"].as_i64().unwrap() == 60_000));
    assert_eq!(o["operations"], json!([{"outcome": "success", "count": 3}]));
    assert_eq!(app.get("/v1/overview?window=10m").await.json()["minutes"].as_array().unwrap().len(), 10);
    // Windows are brought within a minute and a day.
    assert_eq!(app.get("/v1/overview?window=0s").await.json()["minutes"].as_array().unwrap().len(), 1);
    assert_eq!(app.get("/v1/overview?window=2d").await.json()["minutes"].as_array().unwrap().len(), 1440);
    for bad in ["", "soon", "10"] {
        let p = app.get(&format!("/v1/overview?window={bad}")).await.problem(400, "bad-request");
        assert_eq!(p["field"], "window", "{bad}");
    }
    app.stop().await;
}

#[tokio::test]
async fn the_entity_page_reads_and_an_operation_trace() {
    let app = App::new(Tokens::open()).await;
    let r = app
        .call(
            Req::new("POST", "/v1/machines/door/entities").header("Idempotency-Key", "mk-d").json(json!({"key": "d"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = app
        .call(
            Req::new("POST", "/v1/machines/door/entities/d/events/open?wait=stable").header("Idempotency-Key", "op-1"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let e = "/v1/machines/door/entities/d";
    let related = app.get(&format!("{e}/related")).await.json();
    assert_eq!(related, json!({"predecessors": [], "successors": [], "subscriptions": []}));
    assert_eq!(app.get(&format!("{e}/timers")).await.json(), json!([]));
    assert_eq!(app.get(&format!("{e}/errors")).await.json(), json!([]));
    for route in ["related", "timers", "errors"] {
        app.get(&format!("/v1/machines/door/entities/nope/{route}")).await.problem(404, "unknown-entity");
    }
    // The create's trace: the entity and its creation; the raise's: the transition to open.
    let t = app.get("/v1/operations/mk-d/trace").await.json();
    assert_eq!(t["operation"]["request_id"], "mk-d");
    assert_eq!(t["entities"].as_array().unwrap().len(), 1, "{t}");
    assert_eq!(
        (t["transitions"][0]["kind"].as_str(), t["transitions"][0]["key"].as_str()),
        (Some("create"), Some("d"))
    );
    let t = app.get("/v1/operations/op-1/trace").await.json();
    let rows = t["transitions"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{t}");
    assert_eq!(
        (rows[0]["to"].as_str(), rows[0]["machine"].as_str(), t["truncated"].as_bool()),
        (Some("open"), Some("door"), Some(false))
    );
    app.get("/v1/operations/none-such/trace").await.problem(404, "unknown-operation");
    let versions = app.get("/v1/machines/door/versions").await.json();
    assert_eq!(versions.as_array().unwrap().len(), 1, "{versions}");
    assert_eq!((versions[0]["current"].as_bool(), versions[0]["entities"].as_u64()), (Some(true), Some(1)));
    let toml = app.get("/v1/machines/door/toml").await;
    let (back, _) = settle_core::toml::load("door.toml", "door", &toml.text).unwrap();
    assert_eq!(back.content_hash(), app.state.machine("door").unwrap().content_hash());
    app.stop().await;
}

#[tokio::test]
async fn the_dashboard_is_served_from_the_binary() {
    // Its pages need no token (they hold no data: the page asks the API with the token).
    let app = App::new(Tokens::from_spec("reader=reader-token-0001").unwrap()).await;
    for from in ["/", "/ui", "/dashboard"] {
        let r = app.get(from).await;
        assert_eq!((r.status, r.header("location")), (StatusCode::PERMANENT_REDIRECT, "/ui/"), "{from}");
    }
    for (path, ty, needle) in [
        ("/ui/", "text/html; charset=utf-8", "<script src=\"/ui/app.js\""),
        ("/ui/app.js", "text/javascript; charset=utf-8", "/v1/session"),
        ("/ui/app.css", "text/css; charset=utf-8", ".diagram"),
    ] {
        let r = app.get(path).await;
        assert_eq!((r.status, r.header("content-type")), (StatusCode::OK, ty), "{path}");
        assert!(r.text.contains(needle), "{path}");
        assert!(r.header("content-security-policy").contains("script-src 'self'"), "{path}");
    }
    // Not API routes: the document does not list them.
    let doc = crate::openapi(&app.state);
    // An event's parameters are an optional body typed as an object, never null.
    let body = &doc["paths"]["/v1/machines/{machine}/entities/{key}/events/{event}"]["post"]["requestBody"];
    assert_ne!(body["required"], json!(true), "{body}");
    assert_eq!(body["content"]["application/json"]["schema"]["type"], json!("object"), "{body}");
    assert!(
        doc["paths"]
            .as_object()
            .unwrap()
            .keys()
            .all(|p| p.starts_with("/v1/") || ["/healthz", "/metrics", "/openapi.json"].contains(&p.as_str()))
    );
    app.get("/ui/nothing.js").await.problem(404, "unknown-route");
    app.stop().await;
}

#[tokio::test]
async fn the_session_says_who_signed_in() {
    let app = App::new(Tokens::open()).await;
    assert_eq!(
        app.get("/v1/session").await.json(),
        json!({"signed_in": true, "reason": null, "role": "admin", "name": null, "can_write": true, "open": true})
    );
    app.stop().await;
    let app = App::new(
        Tokens::from_spec("reader=reader-token-0001;operator=operator-token-01;agent:q=agent-token-00001").unwrap(),
    )
    .await;
    let who = |token: &str| Req::new("GET", "/v1/session").header("Authorization", &format!("Bearer {token}"));
    let r = app.call(who("reader-token-0001")).await.json();
    assert_eq!((r["role"].as_str(), r["can_write"].as_bool()), (Some("reader"), Some(false)));
    let r = app.call(who("operator-token-01")).await.json();
    assert_eq!((r["role"].as_str(), r["can_write"].as_bool()), (Some("operator"), Some(true)));
    // Not accepted: said with 200 and the reason, never a 401.
    for (req, reason) in [
        (who("wrong"), "unknown bearer token"),
        (Req::new("GET", "/v1/session"), "this route needs `Authorization: Bearer <token>`"),
        (who("agent-token-00001"), "role agent may not use this route"),
    ] {
        let r = app.call(req).await;
        assert_eq!(r.status, StatusCode::OK);
        let v = r.json();
        assert_eq!(
            (v["signed_in"].as_bool(), v["reason"].as_str(), v["role"].as_str()),
            (Some(false), Some(reason), None)
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn raise_queued_then_operation_completes() {
    let app = App::new(Tokens::open()).await;
    app.post("/v1/machines/door/entities", json!({"key": "d"})).await;
    let r = app.call(Req::new("POST", "/v1/machines/door/entities/d/events/open")).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let location = r.header("location").to_string();
    assert_eq!(location, r.json()["operation"]);
    assert_eq!(location, format!("/v1/operations/{}", r.json()["request_id"].as_str().unwrap()));
    app.state.engine().wait_idle().await.unwrap();
    let op = app.get(&location).await.json();
    assert_eq!(op["outcome"], "success", "{op}");
    assert_eq!(op["name"], "door.open");
    assert_eq!(app.get("/v1/machines/door/entities/d").await.json()["state"], "open");
    let ops = app.get("/v1/operations?outcome=success").await.json();
    assert!(ops["items"].as_array().unwrap().iter().any(|o| o["request_id"] == op["request_id"]));
    app.get("/v1/operations?outcome=meh").await.problem(400, "bad-request");
    app.get("/v1/operations/none-such").await.problem(404, "unknown-operation");
    app.stop().await;
}

#[tokio::test]
async fn raise_and_wait_until_stable() {
    let app = App::new(Tokens::open()).await;
    app.post("/v1/machines/door/entities", json!({"key": "d"})).await;
    let r =
        app.post("/v1/machines/door/entities/d/events/paint?wait=stable&timeout=10s", json!({"color": "red"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!(v["outcome"], json!({"result": "accepted", "state": "closed"}));
    assert_eq!(v["entity"]["state"], "closed");
    let r = app
        .call(Req::new("POST", "/v1/machines/door/entities/d/events/open?wait=stable").header("Idempotency-Key", "k-1"))
        .await;
    assert_eq!(r.json()["entity"]["state"], "open", "{}", r.text);
    // The replay raises nothing again: no new rejection although `open` is not valid now.
    let before = app.dump().await;
    let r = app
        .call(Req::new("POST", "/v1/machines/door/entities/d/events/open?wait=stable").header("Idempotency-Key", "k-1"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["replayed"], true);
    assert_eq!(app.dump().await, before);
    let p = app
        .post("/v1/machines/door/entities/d/events/open?wait=stable", json!({}))
        .await
        .problem(409, "event-rejected");
    assert_eq!((p["reason"].as_str(), p["state"].as_str()), (Some("already open"), Some("open")));
    app.stop().await;
}

#[tokio::test]
async fn raise_and_wait_for_the_operation() {
    let app = App::new(Tokens::open()).await;
    app.post("/v1/machines/door/entities", json!({"key": "d"})).await;
    let open = || {
        Req::new("POST", "/v1/machines/door/entities/d/events/open?wait=operation&timeout=10s")
            .header("Idempotency-Key", "op-open")
    };
    let r = app.call(open()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!(
        (v["operation"]["request_id"].as_str(), v["operation"]["outcome"].as_str()),
        (Some("op-open"), Some("success"))
    );
    assert!(v["operation"]["ended_at"].is_i64(), "{v}");
    assert_eq!(v["entity"]["state"], "open");
    assert_eq!(r.header("location"), "/v1/operations/op-open");
    // A replay waits for the same operation and answers with it.
    let r = app.call(open()).await;
    assert_eq!(
        (r.json()["replayed"].as_bool(), r.json()["operation"]["outcome"].as_str()),
        (Some(true), Some("success"))
    );
    // An event not valid at rest is still refused at once with a 409, and not recorded.
    let p = app
        .call(
            Req::new("POST", "/v1/machines/door/entities/d/events/open?wait=operation")
                .header("Idempotency-Key", "op-again"),
        )
        .await
        .problem(409, "event-rejected");
    assert_eq!(p["state"], "open");
    app.get("/v1/operations/op-again").await.problem(404, "unknown-operation");
    app.post("/v1/machines/door/entities/d/events/close?wait=soon", json!({})).await.problem(400, "bad-request");
    app.stop().await;
}

#[tokio::test]
async fn bad_requests_are_problems_and_change_nothing() {
    let app = App::with_config(Tokens::open(), Config { max_body: 64, ..Config::default() }).await;
    app.post("/v1/machines/door/entities", json!({"key": "d"})).await;
    app.post("/v1/machines/door/entities", json!({"key": "gone"})).await;
    app.post("/v1/machines/door/entities/gone/events/remove?wait=stable", json!({})).await;
    app.post("/v1/machines/door/entities", json!({"key": "dead"})).await;
    app.call(Req::new("POST", "/v1/machines/door/entities/dead/kill")).await;
    let ev = "/v1/machines/door/entities/d/events";
    let create = "/v1/machines/door/entities";
    let big = format!("{{\"key\": \"{}\"}}", "x".repeat(100));
    // (request, status, type, field)
    let table: Vec<(Req, u16, &str, Option<&str>)> = vec![
        (Req::new("POST", create).raw(Some("application/json"), "{\"key\": "), 400, "malformed-json", None),
        (Req::new("POST", create).raw(Some("application/json"), ""), 400, "malformed-json", None),
        (
            Req::new("POST", &format!("{ev}/paint")).raw(Some("application/json"), "{color: 1}"),
            400,
            "malformed-json",
            None,
        ),
        (Req::new("POST", create).json(json!({"properties": {}})), 422, "invalid-body", Some("key")),
        (Req::new("POST", create).json(json!({"key": 7})), 422, "invalid-body", Some("key")),
        (Req::new("POST", create).json(json!({"key": ""})), 422, "invalid-key", Some("key")),
        (
            Req::new("POST", create).json(json!({"key": "k", "properties": [1]})),
            422,
            "invalid-properties",
            Some("properties"),
        ),
        (Req::new("POST", "/v1/machines/nope/entities").json(json!({"key": "k"})), 404, "unknown-machine", None),
        (Req::new("POST", "/v1/machines/nope/entities/d/events/open"), 404, "unknown-machine", None),
        (Req::new("GET", "/v1/machines/door/entities/nope"), 404, "unknown-entity", None),
        (Req::new("POST", "/v1/machines/door/entities/nope/events/open"), 404, "unknown-entity", None),
        (Req::new("POST", "/v1/machines/door/entities/nope/pause"), 404, "unknown-entity", None),
        (Req::new("POST", &format!("{ev}/fly")), 404, "unknown-event", None),
        (Req::new("POST", &format!("{ev}/paint")), 422, "invalid-parameters", Some("color")),
        (
            Req::new("POST", &format!("{ev}/paint")).json(json!({"color": "red", "size": 2})),
            422,
            "invalid-parameters",
            Some("size"),
        ),
        (Req::new("POST", &format!("{ev}/paint")).json(json!(["red"])), 422, "invalid-parameters", None),
        (Req::new("POST", create).raw(Some("application/json"), big.clone()), 413, "body-too-large", None),
        (Req::new("POST", &format!("{ev}/paint")).raw(Some("application/json"), big), 413, "body-too-large", None),
        (
            Req::new("POST", create).raw(Some("text/plain"), "{\"key\": \"k\"}"),
            415,
            "unsupported-media-type",
            Some("Content-Type"),
        ),
        (Req::new("POST", create).raw(None, "{\"key\": \"k\"}"), 415, "unsupported-media-type", Some("Content-Type")),
        (Req::new("POST", &format!("{ev}/close")), 409, "event-rejected", None),
        (Req::new("POST", &format!("{ev}/close?wait=stable")), 409, "event-rejected", None),
        (Req::new("POST", &format!("{ev}/open?wait=soon")), 400, "bad-request", Some("wait")),
        (Req::new("POST", &format!("{ev}/open?wait=stable&timeout=often")), 400, "bad-request", Some("timeout")),
        (
            Req::new("POST", &format!("{ev}/open")).header("Idempotency-Key", "a/b"),
            400,
            "bad-request",
            Some("Idempotency-Key"),
        ),
        (
            Req::new("POST", "/v1/machines/door/entities/d/sleep").json(json!({"until": "soon"})),
            422,
            "invalid-body",
            Some("until"),
        ),
        (Req::new("GET", "/v1/machines/door/entities/gone"), 410, "entity-deleted", None),
        (Req::new("POST", "/v1/machines/door/entities/gone/events/open"), 410, "entity-deleted", None),
        (Req::new("POST", "/v1/machines/door/entities/gone/pause"), 410, "entity-deleted", None),
        (Req::new("POST", "/v1/machines/door/entities/dead/events/open"), 409, "entity-killed", None),
        (Req::new("POST", "/v1/machines/door/entities/dead/pause"), 409, "entity-killed", None),
    ];
    app.assert_problems(table).await;
    // The deleted entity's history stays readable.
    assert_eq!(app.get("/v1/machines/door/entities/gone/history").await.status, StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn agent_bad_requests_are_problems_and_change_nothing() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("vm", VM)]).await;
    app.post("/v1/machines/vm/entities", json!({"key": "v"})).await;
    app.post("/v1/machines/vm/entities/v/events/create", json!({})).await;
    let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "wait_ms": 5000})).await;
    let task = &leased.json()["tasks"][0];
    let (id, token) = (task["id"].as_i64().unwrap(), task["token"].as_str().unwrap().to_string());
    assert_eq!(task["targets"], json!(["ready", "provisioning"]), "{task}");
    assert_eq!(task["requires"], json!({"ready": [], "provisioning": []}), "{task}");
    assert_eq!((&task["may_create"], &task["may_raise"]), (&json!(["vm"]), &json!(["create"])), "{task}");
    let t = |what: &str| format!("/v1/tasks/{id}/{what}");
    let table: Vec<(Req, u16, &str, Option<&str>)> = vec![
        (Req::new("POST", "/v1/queues/dns/lease").json(json!({"agent": "a"})), 404, "unknown-queue", None),
        (
            Req::new("POST", "/v1/queues/cloud/lease").raw(Some("application/json"), "{agent"),
            400,
            "malformed-json",
            None,
        ),
        (
            Req::new("POST", "/v1/queues/cloud/lease").json(json!({"agent": "a", "max": 0})),
            422,
            "invalid-body",
            Some("max"),
        ),
        (Req::new("POST", "/v1/queues/cloud/lease").json(json!({"agent": "a\tb"})), 422, "invalid-body", Some("agent")),
        (Req::new("POST", "/v1/queues/cloud/lease").json(json!({"agent": "a", "n": 1})), 422, "invalid-body", None),
        (Req::new("POST", "/v1/tasks/999/heartbeat").json(json!({"token": token})), 404, "unknown-task", None),
        (Req::new("POST", "/v1/tasks/x/heartbeat").json(json!({"token": token})), 400, "bad-request", None),
        (Req::new("POST", &t("heartbeat")).json(json!({"token": "forged"})), 409, "task-refused", None),
        (
            Req::new("POST", &t("complete")).json(json!({"token": "forged", "target": "ready"})),
            409,
            "task-refused",
            None,
        ),
        (
            Req::new("POST", &t("complete")).json(json!({"token": token, "target": "new"})),
            422,
            "invalid-report",
            Some("target"),
        ),
        (
            Req::new("POST", &t("complete")).json(json!({"token": token, "target": "ready", "properties": [1]})),
            422,
            "invalid-body",
            Some("properties"),
        ),
        (Req::new("POST", &t("fail")).json(json!({"token": token})), 422, "invalid-body", None),
        (Req::new("POST", &t("complete")).raw(Some("text/plain"), "{}"), 415, "unsupported-media-type", None),
        (
            Req::new("POST", &t("complete"))
                .json(json!({"token": token, "target": "ready", "create": [{"machine": "disk", "key": "d"}]})),
            422,
            "invalid-report",
            Some("create[0]"),
        ),
        (
            Req::new("POST", &t("complete"))
                .json(json!({"token": token, "target": "ready", "create": [{"machine": "vm", "key": ""}]})),
            422,
            "invalid-key",
            Some("create[0].key"),
        ),
        (
            Req::new("POST", &t("complete"))
                .json(json!({"token": token, "target": "ready", "raise": [{"machine": "vm", "event": "create"}]})),
            422,
            "invalid-body",
            Some("raise[0]"),
        ),
        (
            Req::new("POST", &t("complete")).json(
                json!({"token": token, "target": "ready", "raise": [{"machine": "vm", "key": "v", "event": "boom"}]}),
            ),
            422,
            "invalid-report",
            Some("raise[0]"),
        ),
        (
            Req::new("POST", &t("complete"))
                .json(json!({"token": token, "target": "ready", "raise": [{"on": "successors", "event": "boom"}]})),
            422,
            "invalid-report",
            Some("raise[0]"),
        ),
        (
            // A created entity's first event is named as the request has it.
            Req::new("POST", &t("complete")).json(json!({"token": token, "target": "ready",
                "create": [{"machine": "vm", "key": "v9", "event": "boom"}]})),
            422,
            "invalid-report",
            Some("create[0].event"),
        ),
        (
            // A reply must be an event of the reporter's own machine.
            Req::new("POST", &t("complete")).json(json!({"token": token, "target": "ready",
                "create": [{"machine": "vm", "key": "v9", "event": "create", "reply": "nonsense"}]})),
            422,
            "invalid-report",
            Some("create[0].reply"),
        ),
        (
            Req::new("POST", &t("complete")).json(json!({"token": token, "target": "ready",
                "raise": [{"on": "successors", "event": "create", "reply": "create"}]})),
            422,
            "invalid-body",
            Some("raise[0].reply"),
        ),
        (
            // An event raised on the reporter itself must be one of its machine's.
            Req::new("POST", &t("complete")).json(json!({"token": token, "target": "ready",
                "raise": [{"machine": "vm", "key": "v", "event": "create"}, {"on": "self", "event": "nonsense"}]})),
            422,
            "invalid-report",
            Some("raise[1]"),
        ),
    ];
    app.assert_problems(table).await;
    // The live token still holds the task: it reports.
    let done = app.post(&t("complete"), json!({"token": token, "target": "ready"})).await;
    assert_eq!(done.status, StatusCode::ACCEPTED, "{}", done.text);
    app.stop().await;
}

#[tokio::test]
async fn an_agents_report_creates_successors_and_raises_over_http() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("vm", VM)]).await;
    app.post("/v1/machines/vm/entities", json!({"key": "v"})).await;
    app.post("/v1/machines/vm/entities/v/events/create", json!({})).await;
    let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "wait_ms": 5000})).await;
    let task = &leased.json()["tasks"][0];
    let (id, token) = (task["id"].as_i64().unwrap(), task["token"].as_str().unwrap().to_string());
    let report = json!({
        "token": token, "target": "ready", "properties": {"ip": "10.0.0.7"},
        "create": [{"machine": "vm", "key": "v-disk", "properties": {"size": 10}, "event": "create"},
                   {"machine": "vm", "key": "v-net"}],
    });
    let done = app.post(&format!("/v1/tasks/{id}/complete"), report).await;
    assert_eq!(done.status, StatusCode::ACCEPTED, "{}", done.text);
    app.state.engine().wait_caught_up().await.unwrap();
    let v = app.get("/v1/machines/vm/entities/v").await.json();
    assert_eq!((v["state"].as_str(), &v["properties"]["ip"]), (Some("ready"), &json!("10.0.0.7")), "{v}");
    // The created entities are its successors; the first event moved one of them on.
    let related = app.get("/v1/machines/vm/entities/v/related").await.json();
    let mut succ: Vec<_> = related["successors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap().to_string(), e["state"].as_str().unwrap().to_string()))
        .collect();
    succ.sort();
    assert_eq!(succ, [("v-disk".into(), "provisioning".into()), ("v-net".into(), "new".into())], "{related}");
    // An event raised by key joins the reporter's workflow when asked.
    let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "wait_ms": 5000})).await;
    let task = &leased.json()["tasks"][0];
    assert_eq!(task["key"], "v-disk", "{task}");
    let (id, token) = (task["id"].as_i64().unwrap(), task["token"].as_str().unwrap().to_string());
    app.post("/v1/machines/vm/entities", json!({"key": "w"})).await;
    let report = json!({"token": token, "target": "ready",
                        "raise": [{"machine": "vm", "key": "w", "event": "create", "join": true}]});
    let done = app.post(&format!("/v1/tasks/{id}/complete"), report).await;
    assert_eq!(done.status, StatusCode::ACCEPTED, "{}", done.text);
    app.state.engine().wait_caught_up().await.unwrap();
    assert_eq!(app.get("/v1/machines/vm/entities/w").await.json()["state"], "provisioning");
    let related = app.get("/v1/machines/vm/entities/v-disk/related").await.json();
    assert_eq!(related["successors"][0]["key"], "w", "{related}");
    app.stop().await;
}

#[tokio::test]
async fn a_report_leases_the_next_tasks_in_the_same_request() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("vm", VM)]).await;
    for key in ["v1", "v2"] {
        app.post("/v1/machines/vm/entities", json!({"key": key})).await;
        app.post(&format!("/v1/machines/vm/entities/{key}/events/create"), json!({})).await;
    }
    app.state.engine().wait_caught_up().await.unwrap();
    let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "max": 1, "wait_ms": 5000})).await;
    let task = leased.json()["tasks"][0].clone();
    let (id, token) = (task["id"].as_i64().unwrap(), task["token"].as_str().unwrap().to_string());
    let complete = format!("/v1/tasks/{id}/complete");
    // A bad `next` is refused before the report is applied: nothing changes.
    let before = app.dump().await;
    let report =
        |next: Value| json!({"token": token, "target": "ready", "properties": {"ip": "10.0.0.1"}, "next": next});
    app.call(Req::new("POST", &complete).json(report(json!({"queue": "nope", "agent": "a"}))))
        .await
        .problem(404, "unknown-queue");
    let table = vec![
        (
            Req::new("POST", &complete).json(report(json!({"queue": "cloud", "agent": ""}))),
            422,
            "invalid-body",
            Some("next.agent"),
        ),
        (
            Req::new("POST", &complete).json(report(json!({"queue": "cloud", "agent": "a", "max": 0}))),
            422,
            "invalid-body",
            Some("next.max"),
        ),
    ];
    app.assert_problems(table).await;
    assert_eq!(app.dump().await, before, "a refused report changed something");
    // Accepted: the answer carries the next task, leased to the same agent.
    let done = app.post(&complete, report(json!({"queue": "cloud", "agent": "a", "max": 5}))).await;
    assert_eq!(done.status, StatusCode::ACCEPTED, "{}", done.text);
    let next = done.json()["tasks"].as_array().cloned().unwrap_or_default();
    assert_eq!(next.len(), 1, "{}", done.text);
    assert_ne!(next[0]["key"], task["key"], "{}", done.text);
    let (id2, token2) = (next[0]["id"].as_i64().unwrap(), next[0]["token"].as_str().unwrap().to_string());
    // The last one: nothing more is ready, and a report without `next` answers no tasks.
    let body = json!({"token": token2, "target": "ready", "properties": {"ip": "10.0.0.2"},
                      "next": {"queue": "cloud", "agent": "a"}});
    let done = app.post(&format!("/v1/tasks/{id2}/complete"), body).await;
    assert_eq!(done.json()["tasks"], json!([]), "{}", done.text);
    let again = app
        .post(
            &format!("/v1/tasks/{id2}/complete"),
            json!({"token": token2, "target": "ready", "properties": {"ip": "10.0.0.2"}}),
        )
        .await;
    assert_eq!((again.json()["replayed"].as_bool(), again.json().get("tasks")), (Some(true), None), "{}", again.text);
    app.state.engine().wait_caught_up().await.unwrap();
    for key in ["v1", "v2"] {
        assert_eq!(app.get(&format!("/v1/machines/vm/entities/{key}")).await.json()["state"], "ready");
    }
    app.stop().await;
}

#[tokio::test]
async fn many_reports_in_one_request_are_each_applied_or_refused_on_their_own() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("vm", VM)]).await;
    let keys = ["m1", "m2", "m3", "m4", "m5"];
    for key in keys {
        app.post("/v1/machines/vm/entities", json!({"key": key})).await;
        app.post(&format!("/v1/machines/vm/entities/{key}/events/create"), json!({})).await;
    }
    app.state.engine().wait_caught_up().await.unwrap();
    let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "max": 4, "wait_ms": 5000})).await;
    let tasks = leased.json()["tasks"].as_array().cloned().unwrap();
    assert_eq!(tasks.len(), 4, "{}", leased.text);
    let id = |t: &Value| (t["id"].as_i64().unwrap(), t["token"].as_str().unwrap().to_string());
    let ((a, ta), (b, tb), (c, _), (d, td)) = (id(&tasks[0]), id(&tasks[1]), id(&tasks[2]), id(&tasks[3]));
    let body = json!({
        "reports": [
            {"task": a, "complete": {"token": ta, "target": "ready"}},
            {"task": b, "fail": {"token": tb, "error": "quota", "retryable": false}},
            {"task": c, "complete": {"token": "not-its-token", "target": "ready"}},
            {"task": d, "complete": {"token": td, "target": "nowhere"}},
        ],
        "next": {"queue": "cloud", "agent": "a", "max": 5},
    });
    let r = app.post("/v1/tasks/reports", body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    let fate: Vec<_> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["task"].as_i64().unwrap(),
                r["accepted"].as_bool().unwrap(),
                r["problem"]["field"].as_str().map(str::to_string),
            )
        })
        .collect();
    assert_eq!(
        fate,
        [
            (a, true, None),
            (b, true, None),
            (c, false, Some("reports[2].complete".into())),
            (d, false, Some("reports[3].complete.target".into()))
        ],
        "{v}"
    );
    assert_eq!(v["results"][2]["problem"]["status"], 409, "{v}");
    // The fifth entity's task was not leased before: `next` brings it.
    let next: Vec<_> = v["tasks"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap().to_string()).collect();
    assert_eq!(next, ["m5"], "{v}");
    app.state.engine().wait_caught_up().await.unwrap();
    let state = |key: String| {
        let app = &app;
        async move {
            let e = app.get(&format!("/v1/machines/vm/entities/{key}")).await.json();
            (e["state"].as_str().unwrap().to_string(), e["run_status"].as_str().unwrap().to_string())
        }
    };
    let key = |t: &Value| t["key"].as_str().unwrap().to_string();
    assert_eq!(state(key(&tasks[0])).await, ("ready".into(), "active".into()));
    assert_eq!(state(key(&tasks[1])).await, ("provisioning".into(), "failed".into()), "a non-retryable fail parks it");
    assert_eq!(state(key(&tasks[2])).await, ("provisioning".into(), "active".into()), "refused: nothing changed");
    assert_eq!(state(key(&tasks[3])).await, ("provisioning".into(), "active".into()), "refused: nothing changed");
    // The request as a whole: at least one report, at most 100; exactly one of complete and fail.
    let table = vec![
        (Req::new("POST", "/v1/tasks/reports").json(json!({"reports": []})), 422, "invalid-body", Some("reports")),
        (
            Req::new("POST", "/v1/tasks/reports")
                .json(json!({"reports": [{"task": a}], "next": {"queue": "nope", "agent": "a"}})),
            404,
            "unknown-queue",
            Some("next.queue"),
        ),
    ];
    app.assert_problems(table).await;
    let r = app.post("/v1/tasks/reports", json!({"reports": [{"task": a}]})).await;
    assert_eq!(r.json()["results"][0]["problem"]["field"], "reports[0]", "{}", r.text);
    app.stop().await;
}

#[tokio::test]
async fn lifecycle_commands() {
    let app = App::new(Tokens::open()).await;
    app.post("/v1/machines/door/entities", json!({"key": "d"})).await;
    let path = "/v1/machines/door/entities/d";
    let r = app.call(Req::new("POST", &format!("{path}/pause")).header("Idempotency-Key", "pause-d")).await;
    assert_eq!(r.json()["run_status"], "paused", "{}", r.text);
    // The pause's key names the pause: a resume with it is refused, and changes nothing.
    let before = app.dump().await;
    app.call(Req::new("POST", &format!("{path}/resume")).header("Idempotency-Key", "pause-d"))
        .await
        .problem(409, "idempotency-key-reused");
    assert_eq!(app.dump().await, before);
    // A paused entity queues events: accepted now, processed on resume.
    assert_eq!(app.call(Req::new("POST", &format!("{path}/events/open"))).await.status, StatusCode::ACCEPTED);
    assert_eq!(app.call(Req::new("POST", &format!("{path}/resume"))).await.json()["run_status"], "active");
    app.state.engine().wait_idle().await.unwrap();
    assert_eq!(app.get(path).await.json()["state"], "open");
    let r = app.post(&format!("{path}/sleep"), json!({"until": "+10m"})).await;
    assert_eq!(r.json()["run_status"], "sleeping", "{}", r.text);
    assert!(r.json()["sleep_until"].as_i64().unwrap() > settle_store::clock::now_ms());
    for c in ["release", "retry", "resume", "kill"] {
        assert_eq!(app.call(Req::new("POST", &format!("{path}/{c}"))).await.status, StatusCode::OK, "{c}");
    }
    assert_eq!(app.get(path).await.json()["run_status"], "killed");
    app.stop().await;
}

/// Roles against every group of routes: read, write (create, raise, lifecycle), system,
/// health, agent queues.
#[tokio::test]
async fn access_matrix() {
    let tokens =
        Tokens::from_spec("admin=admin-token-00001;operator=operator-token-01;reader=reader-token-0001;agent:cloud=agent-token-00001;agent:dns=dns-agent-token-1").unwrap();
    // The matrix tries a wrong token on every route: more than an address may fail (that
    // limit is `an_address_guessing_tokens_is_slowed`'s).
    let config = Config { auth_failures: 0, ..Config::default() };
    let app = App::with_machines(tokens, config, &[("door", DOOR), ("vm", VM)]).await;
    let admin = Some("admin-token-00001");
    let r = app.call(Req::new("POST", "/v1/machines/door/entities").json(json!({"key": "d"})).token(admin)).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let e = "/v1/machines/door/entities/d";
    let groups = ["read", "write", "system", "health", "agents"];
    // Expected status class per (token, group): 2 = 2xx. `dns-agent-token-1` is an agent of another
    // queue than the one the agent group uses.
    let matrix: [(Option<&str>, [u16; 5]); 7] = [
        (Some("admin-token-00001"), [2, 2, 2, 2, 2]),
        (Some("operator-token-01"), [2, 2, 2, 2, 403]),
        (Some("reader-token-0001"), [2, 403, 2, 2, 403]),
        (Some("agent-token-00001"), [403, 403, 403, 2, 2]),
        (Some("dns-agent-token-1"), [403, 403, 403, 2, 403]),
        (None, [401, 401, 401, 2, 401]),
        (Some("t-wrong"), [401, 401, 401, 2, 401]),
    ];
    for (token, expected) in matrix {
        for (group, want) in groups.into_iter().zip(expected) {
            for (i, req) in group_requests(group).into_iter().enumerate() {
                let what = format!("{token:?} {group} {} {}", req.method, req.uri);
                // A new key per token (creates succeed for two of them).
                let req = if group == "write" && i == 0 {
                    let key = format!("k-{}", token.unwrap_or("none"));
                    Req::new("POST", "/v1/machines/door/entities").json(json!({"key": key}))
                } else {
                    req
                };
                let r = app.call(req.token(token)).await;
                match want {
                    2 => assert!(r.status.is_success(), "{what}: {} {}", r.status, r.text),
                    401 => {
                        r.problem(401, "unauthorized");
                        assert_eq!(r.header("www-authenticate"), "Bearer", "{what}");
                    }
                    s => {
                        r.problem(s, "forbidden");
                    }
                }
            }
        }
    }
    assert_eq!(app.get(e).await.status, StatusCode::UNAUTHORIZED);
    app.stop().await;
}

/// The requests of one access group of [`access_matrix`], on the entity `d` of `door`.
fn group_requests(group: &str) -> Vec<Req> {
    let e = "/v1/machines/door/entities/d";
    match group {
        "read" => vec![
            Req::new("GET", "/v1/machines"),
            Req::new("GET", "/v1/machines/door"),
            Req::new("GET", "/v1/machines/door/graph"),
            Req::new("GET", "/v1/entities"),
            Req::new("GET", e),
            Req::new("GET", &format!("{e}/history")),
            Req::new("GET", "/v1/operations"),
            Req::new("GET", "/v1/overview"),
            Req::new("GET", &format!("{e}/related")),
            Req::new("GET", &format!("{e}/timers")),
            Req::new("GET", &format!("{e}/errors")),
            Req::new("GET", "/v1/machines/door/versions"),
            Req::new("GET", "/v1/machines/door/toml"),
        ],
        "write" => vec![
            Req::new("POST", "/v1/machines/door/entities").json(json!({"key": "new"})),
            Req::new("POST", &format!("{e}/events/paint")).json(json!({"color": "red"})),
            Req::new("POST", &format!("{e}/pause")),
            Req::new("POST", &format!("{e}/resume")),
            Req::new("POST", &format!("{e}/sleep")).json(json!({"until": "+1m"})),
            Req::new("POST", &format!("{e}/release")),
            Req::new("POST", &format!("{e}/retry")),
        ],
        "system" => vec![Req::new("GET", "/metrics"), Req::new("GET", "/openapi.json")],
        // No vm exists, so nothing is offered: the lease answers at once with no task.
        "agents" => vec![Req::new("POST", "/v1/queues/cloud/lease").json(json!({"agent": "a", "wait_ms": 0}))],
        _ => vec![Req::new("GET", "/healthz")],
    }
}

#[tokio::test]
async fn agents_are_limited_to_their_queues() {
    // The helper queue routes call: an extractor-level check on the caller's queues.
    let tokens =
        Tokens::from_spec("agent:dns=agent-token-00001;operator=operator-token-01;admin=admin-token-00001").unwrap();
    let caller = |t: &str| {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
        tokens.authenticate(&h, crate::auth::Access::Agent)
    };
    assert!(caller("agent-token-00001").unwrap().authorize_queue("dns").is_ok());
    assert_eq!(caller("agent-token-00001").unwrap().authorize_queue("app").unwrap_err().kind(), crate::Kind::Forbidden);
    assert!(caller("admin-token-00001").unwrap().authorize_queue("app").is_ok());
    assert_eq!(caller("operator-token-01").unwrap_err().kind(), crate::Kind::Forbidden);
}

/// `/openapi.json` is a valid OpenAPI 3.1 document, and every operation it lists is served
/// by the router (probed with placeholder path parameters: the answer may be any problem
/// but `unknown-route` or `method-not-allowed`).
#[tokio::test]
async fn openapi_lists_every_served_route() {
    let app = App::new(Tokens::open()).await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status, StatusCode::OK);
    let spec = oas3::from_json(&r.text).expect("a valid OpenAPI 3.1 document");
    assert!(spec.openapi.starts_with("3.1"), "{}", spec.openapi);
    let ops: Vec<(String, String)> = spec.operations().map(|(path, method, _)| (path, method.to_string())).collect();
    // The served document is the one the router is built from.
    let built = crate::openapi(&app.state);
    assert_eq!(built, r.json());
    assert!(ops.len() >= 19, "{ops:?}");
    for (path, method) in &ops {
        let mut uri =
            path.split('/').map(|seg| if seg.starts_with('{') { "x" } else { seg }).collect::<Vec<_>>().join("/");
        if uri == "/v1/feed" {
            // A stream that ends only with the server: asked for what it refuses.
            uri.push_str("?machine=x");
        }
        let method: &'static str = match method.as_str() {
            "GET" => "GET",
            "POST" => "POST",
            other => panic!("unexpected method {other}"),
        };
        let r = app.call(Req::new(method, &uri)).await;
        if !r.status.is_success() {
            let v = r.json();
            let t = v["type"].as_str().unwrap();
            assert!(!t.ends_with("/unknown-route") && !t.ends_with("/method-not-allowed"), "{method} {path}: {v}");
        }
        // Every operation documents its problem answers with the problem schema.
        let op = &spec.paths.as_ref().unwrap()[path];
        assert!(op.get.is_some() || op.post.is_some());
    }
    let p = &r.json()["components"]["securitySchemes"]["bearer"];
    assert_eq!(p["scheme"], "bearer");
    app.stop().await;
}

/// A statechart served as is: substates, guards, ignored events and internal transitions
/// through the API; `…/check` tells what an event would do, without doing it.
#[tokio::test]
async fn a_statechart_through_the_api_and_what_its_events_would_do() {
    let instance = include_str!("../../core/src/testdata/instance.toml");
    let app = App::with_machines(Tokens::open(), Config::default(), &[("instance", instance)]).await;
    let created = app.post("/v1/machines/instance/entities", json!({"key": "i", "properties": {"max_size": 4}})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    app.state.engine().wait_idle().await.unwrap();
    let e = "/v1/machines/instance/entities/i";
    // (event, parameters) → the verdict, before anything is raised
    let cases = [
        ("resize", json!({"size": 2}), json!({"result": "fires", "action": "begin_resize", "internal": false})),
        ("resize", json!({"size": 8}), json!({"result": "refused", "reason": "size above this instance's maximum"})),
        ("touch", json!(null), json!({"result": "fires", "action": "record_touch", "internal": true})),
        ("start", json!(null), json!({"result": "ignored", "state": "active"})),
        (
            "delete",
            json!(null),
            json!({"result": "refused", "reason": "event `delete` is not valid in state `running`"}),
        ),
    ];
    let before = app.dump().await;
    for (event, params, verdict) in cases {
        let r = app.post(&format!("{e}/events/{event}/check"), params.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{event}: {}", r.text);
        assert_eq!(
            (r.json()["state"].clone(), r.json()["verdict"].clone()),
            (json!("running"), verdict),
            "{event} {params}"
        );
    }
    assert_eq!(app.dump().await, before, "checking writes nothing");
    let listed = app.get("/v1/entities?state=active").await.json();
    assert_eq!(listed["items"][0]["key"], json!("i"), "a parent lists its substates' entities: {listed}");
    assert_eq!(app.get("/v1/entities?machine=instance&state=stopped").await.json()["items"], json!([]));
    let metrics = app.get("/metrics").await.text;
    assert!(
        metrics.contains(
            "settle_entities{machine=\"instance\",state=\"running\",path=\"active/running\",run_status=\"active\",health=\"ok\"} 1\n"
        ),
        "{metrics}"
    );
    app.post(&format!("{e}/events/resize/check"), json!({"colour": "red"})).await.problem(422, "invalid-parameters");
    app.post(&format!("{e}/events/nope/check"), json!(null)).await.problem(404, "unknown-event");
    // Raised for real: ignored answers 200 with the outcome; a guard's rejection 409.
    let start = app.post(&format!("{e}/events/start?wait=stable"), json!(null)).await;
    assert_eq!(
        (start.status, start.json()["outcome"].clone()),
        (StatusCode::OK, json!({"result": "ignored", "state": "running"}))
    );
    app.post(&format!("{e}/events/resize?wait=stable"), json!({"size": 8})).await.problem(409, "event-rejected");
    let touch = app.post(&format!("{e}/events/touch?wait=stable"), json!(null)).await;
    assert_eq!(touch.json()["entity"]["properties"]["touched"], json!(true), "{}", touch.text);
    let history = app.get(&format!("{e}/history")).await.json();
    let kinds: Vec<&str> = history.as_array().unwrap().iter().map(|h| h["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds[kinds.len() - 3..], ["ignored", "rejected", "internal"]);
    app.stop().await;
}

/// `--rate-limit N`: the N+1-th request of a token within a second is 429 `rate-limited`
/// with `Retry-After`; another token keeps its own budget; once the clock moves the token
/// passes again. The public routes are not limited.
#[tokio::test]
async fn a_token_over_its_rate_limit_gets_429_with_retry_after() {
    let clock = settle_engine::ManualClock::new(1_795_000_000_000);
    let engine = settle_engine::Config { clock: std::sync::Arc::new(clock.clone()), ..Default::default() };
    let tokens = Tokens::from_spec("admin=admin-token-00001;reader=reader-token-0001").unwrap();
    let config = Config { rate_limit: 3, ..Config::default() };
    let app = App::with_engine(tokens, config, &[("door", DOOR)], engine).await;
    let get = |t: &str| Req::new("GET", "/v1/machines").token(Some(t));
    for _ in 0..3 {
        assert_eq!(app.call(get("reader-token-0001")).await.status, StatusCode::OK);
    }
    let r = app.call(get("reader-token-0001")).await;
    let p = r.problem(429, "rate-limited");
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(p["retry_after"], 1);
    // Every guarded route draws from the token's bucket; a route its role may not use is
    // refused before it.
    app.call(Req::new("GET", "/openapi.json").token(Some("reader-token-0001"))).await.problem(429, "rate-limited");
    let create =
        Req::new("POST", "/v1/machines/door/entities").token(Some("reader-token-0001")).json(json!({"key": "k"}));
    app.call(create).await.problem(403, "forbidden");
    // A refused token is not counted, and is refused before the limit.
    app.call(Req::new("GET", "/v1/machines").token(Some("nope"))).await.problem(401, "unauthorized");
    // Another token is unaffected; the public routes are not limited.
    for _ in 0..3 {
        assert_eq!(app.call(get("admin-token-00001")).await.status, StatusCode::OK);
    }
    for _ in 0..10 {
        assert_eq!(app.call(Req::new("GET", "/healthz").token(Some("reader-token-0001"))).await.status, StatusCode::OK);
    }
    // A third of a second refills one request; a second, the whole burst.
    clock.advance(std::time::Duration::from_millis(334));
    assert_eq!(app.call(get("reader-token-0001")).await.status, StatusCode::OK);
    app.call(get("reader-token-0001")).await.problem(429, "rate-limited");
    clock.advance(std::time::Duration::from_secs(1));
    for _ in 0..3 {
        assert_eq!(app.call(get("reader-token-0001")).await.status, StatusCode::OK);
    }
    app.call(get("reader-token-0001")).await.problem(429, "rate-limited");
    app.stop().await;
}

/// An open server is not limited (loopback only, every caller an admin); nor is any server
/// with `rate_limit: 0`.
#[tokio::test]
async fn an_open_server_and_a_zero_limit_limit_nothing() {
    let clock = settle_engine::ManualClock::new(1_795_000_000_000);
    let engine = || settle_engine::Config { clock: std::sync::Arc::new(clock.clone()), ..Default::default() };
    let one = Config { rate_limit: 1, ..Config::default() };
    let app = App::with_engine(Tokens::open(), one, &[("door", DOOR)], engine()).await;
    for _ in 0..50 {
        assert_eq!(app.get("/v1/machines").await.status, StatusCode::OK);
    }
    app.stop().await;
    let off = Config { rate_limit: 0, ..Config::default() };
    let app =
        App::with_engine(Tokens::from_spec("reader=reader-token-0001").unwrap(), off, &[("door", DOOR)], engine())
            .await;
    for _ in 0..50 {
        let r = app.call(Req::new("GET", "/v1/machines").token(Some("reader-token-0001"))).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    app.stop().await;
}

/// Tokens are looked up by digest: a prefix, an extension or another token of the same
/// length is unknown; the same token configured twice is refused.
#[tokio::test]
async fn tokens_match_exactly() {
    let app = App::new(Tokens::from_spec("admin=s3cret-admin-00001;reader=s3cret-reader-0001").unwrap()).await;
    let get = |t: &str| Req::new("GET", "/v1/machines").token(Some(t));
    assert_eq!(app.call(get("s3cret-admin-00001")).await.status, StatusCode::OK);
    for wrong in ["s3cret-admin-0000", "s3cret-admin-000012", "S3cret-admin-00001", "s3cret-admin-00002"] {
        app.call(get(wrong)).await.problem(401, "unauthorized");
    }
    let p = app.call(
        Req::new("POST", "/v1/machines/door/entities").token(Some("s3cret-reader-0001")).json(json!({"key": "k"})),
    );
    p.await.problem(403, "forbidden");
    app.stop().await;
}

/// Builds site `key`: its parts' tasks are completed, `-net` as `broken` with `why`.
async fn site_with_a_broken_part(app: &App, key: &str, why: Option<&str>) {
    app.post("/v1/machines/site/entities", json!({"key": key})).await;
    app.post(&format!("/v1/machines/site/entities/{key}/events/build"), json!({})).await;
    let mut tasks = Vec::new();
    while tasks.len() < 2 {
        let leased = app.post("/v1/queues/cloud/lease", json!({"agent": "a", "max": 2, "wait_ms": 5000})).await;
        tasks.extend(leased.json()["tasks"].as_array().unwrap().iter().cloned());
    }
    for t in tasks {
        let (id, token) = (t["id"].as_i64().unwrap(), t["token"].as_str().unwrap());
        let mut body = json!({"token": token, "target": "up"});
        if t["key"].as_str().unwrap().ends_with("-net") {
            body = json!({"token": token, "target": "broken"});
            if let Some(why) = why {
                body["error"] = json!(why);
            }
        }
        let r = app.post(&format!("/v1/tasks/{id}/complete"), body).await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    }
    app.state.engine().wait_caught_up().await.unwrap();
}

#[tokio::test]
async fn failures_show_their_health_and_why_down_to_the_first_cause() {
    let app = App::with_machines(Tokens::open(), Config::default(), &[("site", SITE), ("part", PART)]).await;
    site_with_a_broken_part(&app, "s1", Some("no capacity in zone c")).await;
    site_with_a_broken_part(&app, "s2", None).await;
    let site = app.get("/v1/machines/site/entities/s1").await.json();
    assert_eq!((&site["state"], &site["health"]), (&json!("failed"), &json!("error")), "{site}");

    // The overview counts the failing (two sites, two parts), per state with its health.
    let o = app.get("/v1/overview").await.json();
    assert_eq!(o["failing"], json!(4), "{o}");
    let broken = o["counts"].as_array().unwrap().iter().find(|c| c["state"] == "broken").unwrap();
    assert_eq!(broken["health"], "error");
    let up = o["counts"].as_array().unwrap().iter().find(|c| c["state"] == "up").unwrap();
    assert_eq!(up["health"], "ok");
    // The list of failing entities, and of healthy ones; a bad health is refused.
    let failing = app.get("/v1/entities?health=error").await.json();
    let keys: Vec<&str> = failing["items"].as_array().unwrap().iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["s1", "s1-net", "s2", "s2-net"]);
    assert!(failing["items"].as_array().unwrap().iter().all(|e| e["health"] == "error"));
    let ok = app.get("/v1/entities?health=ok&machine=part").await.json();
    assert_eq!(ok["items"].as_array().unwrap().len(), 2);
    let p = app.get("/v1/entities?health=sick").await.problem(400, "bad-request");
    assert_eq!(p["field"], "health");
    // A page with its total and each entity's newest error (one request for a list).
    let page = app.get("/v1/entities?health=error&total=true&errors=latest&limit=1").await.json();
    assert_eq!(page["total"], json!({"count": 4, "exact": true}), "{page}");
    assert_eq!(page["items"][0]["last_error"]["details"], "`parts_failed` fired: part/s1-net in `broken`");
    assert!(page["next"].is_string());
    assert!(app.get("/v1/entities?health=error").await.json().get("total").is_none(), "only when asked");
    let p = app.get("/v1/entities?errors=all").await.problem(400, "bad-request");
    assert_eq!(p["field"], "errors");
    let metrics = app.get("/metrics").await.text;
    assert!(metrics.contains("settle_failing_entities 4\n"), "{metrics}");
    assert!(
        metrics.contains("state=\"broken\",path=\"broken\",run_status=\"active\",health=\"error\"} 2"),
        "{metrics}"
    );

    // Why: the site, then its part with the agent's message; the part's errors hold it.
    let why = app.get("/v1/machines/site/entities/s1/why").await.json();
    assert_eq!(why["failing"], true);
    let chain = why["chain"].as_array().unwrap();
    assert_eq!(chain.len(), 2, "{why}");
    assert_eq!((chain[0]["depth"].as_u64(), chain[0]["key"].as_str()), (Some(0), Some("s1")));
    assert_eq!(chain[0]["details"], "`parts_failed` fired: part/s1-net in `broken`");
    assert_eq!((chain[1]["depth"].as_u64(), chain[1]["key"].as_str()), (Some(1), Some("s1-net")));
    assert_eq!((&chain[1]["kind"], &chain[1]["details"]), (&json!("failure"), &json!("no capacity in zone c")));
    let errors = app.get("/v1/machines/part/entities/s1-net/errors").await.json();
    assert_eq!(errors[0]["details"], "no capacity in zone c");
    let errors = app.get("/v1/machines/site/entities/s1/errors").await.json();
    assert_eq!(errors[0]["cause"], json!([{"machine": "part", "key": "s1-net", "state": "broken"}]));
    // Without a message from the agent, what moved it.
    let why = app.get("/v1/machines/site/entities/s2/why").await.json();
    assert_eq!(why["chain"][1]["details"], "action `provision` in `provisioning`", "{why}");
    // A healthy entity has nothing to explain; a missing one is 404.
    let why = app.get("/v1/machines/part/entities/s1-disk/why").await.json();
    assert_eq!((&why["failing"], why["chain"].as_array().unwrap().len()), (&json!(false), 1));
    assert_eq!(why["chain"][0]["details"], Value::Null);
    app.get("/v1/machines/part/entities/nobody/why").await.problem(404, "unknown-entity");
    app.stop().await;
}

#[tokio::test]
async fn a_bulk_operation_dry_runs_then_commands_every_match_once() {
    let tokens = Tokens::from_spec("operator=operator-token-01;reader=reader-token-0001").unwrap();
    let app = App::with_machines(tokens, Config::default(), &[("door", DOOR)]).await;
    let op = |r: Req| r.token(Some("operator-token-01"));
    for i in 0..30 {
        let key = if i < 12 { format!("east-{i:02}") } else { format!("west-{i:02}") };
        let r = app.call(op(Req::new("POST", "/v1/machines/door/entities").json(json!({"key": key})))).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let filter = json!({"machine": "door", "prefix": "east-"});
    // A dry run: the count, the filter echoed, a sample; nothing paused.
    let dry = app
        .call(op(Req::new("POST", "/v1/bulk").json(json!({"action": "pause", "filter": filter, "dry_run": true}))))
        .await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.text);
    let dry = dry.json();
    assert_eq!((dry["count"].as_u64(), &dry["more"], &dry["filter"]), (Some(12), &json!(false), &filter), "{dry}");
    assert_eq!(dry["sample"].as_array().unwrap().len(), 10);
    let paused = app.call(op(Req::new("GET", "/v1/entities?status=paused"))).await.json();
    assert_eq!(paused["items"], json!([]));
    // The run: 202 with where to follow it; it ends with each east door paused once.
    let body = json!({"action": "pause", "filter": filter, "reason": "repainting the east wing", "rate": 1000});
    let started =
        app.call(op(Req::new("POST", "/v1/bulk").header("Idempotency-Key", "paint-east").json(body.clone()))).await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.text);
    assert_eq!(started.headers[header::LOCATION], "/v1/bulk/paint-east");
    assert_eq!((started.json()["total"].as_u64(), started.json()["status"].as_str()), (Some(12), Some("running")));
    let done = app.state.engine().bulk_wait("paint-east", std::time::Duration::from_secs(30)).await.unwrap();
    assert_eq!((done.done, done.failed), (12, 0));
    let got = app.call(op(Req::new("GET", "/v1/bulk/paint-east"))).await.json();
    assert_eq!(
        (got["status"].as_str(), got["done"].as_u64(), got["remaining"].as_u64()),
        (Some("done"), Some(12), Some(0))
    );
    assert_eq!(got["reason"], "repainting the east wing");
    let paused = app.call(op(Req::new("GET", "/v1/entities?status=paused"))).await.json();
    assert_eq!(paused["items"].as_array().unwrap().len(), 12);
    assert!(paused["items"].as_array().unwrap().iter().all(|e| e["key"].as_str().unwrap().starts_with("east-")));
    // The same key again: that operation, 200.
    let again = app.call(op(Req::new("POST", "/v1/bulk").header("Idempotency-Key", "paint-east").json(body))).await;
    assert_eq!((again.status, again.json()["done"].as_u64()), (StatusCode::OK, Some(12)));
    let list = app.call(op(Req::new("GET", "/v1/bulk"))).await.json();
    assert_eq!(list["items"][0]["request_id"], "paint-east");
    // Cancel: an ended one stays as it was; an unknown one is 404.
    let canceled = app.call(op(Req::new("POST", "/v1/bulk/paint-east/cancel"))).await.json();
    assert_eq!(canceled["status"], "done");
    app.call(op(Req::new("POST", "/v1/bulk/nobody/cancel"))).await.problem(404, "unknown-bulk");
    app.call(op(Req::new("GET", "/v1/bulk/nobody"))).await.problem(404, "unknown-bulk");
    // Mistakes, each naming its field; nothing stored.
    for (body, field) in [
        (json!({"action": "pause", "filter": {}, "reason": "r"}), "filter"),
        (json!({"action": "pause", "filter": {"machine": "vm"}, "reason": "r"}), "filter.machine"),
        (json!({"action": "pause", "filter": {"status": "sad"}, "reason": "r"}), "filter.status"),
        (json!({"action": "pause", "filter": {"machine": "door"}}), "reason"),
        (json!({"action": "pause", "filter": {"machine": "door"}, "reason": "r", "rate": 0}), "rate"),
        (json!({"action": "sleep", "filter": {"machine": "door"}, "reason": "r"}), "action"),
        (json!({"action": "raise", "event": "fly", "filter": {"machine": "door"}, "reason": "r"}), "event"),
    ] {
        let p = app.call(op(Req::new("POST", "/v1/bulk").json(body.clone()))).await.problem(422, "invalid-bulk");
        assert_eq!(p["field"], field, "{body}: {p}");
    }
    app.call(op(Req::new("POST", "/v1/bulk").json(json!({"action": "pause", "filter": {"colour": "red"}}))))
        .await
        .problem(422, "invalid-body");
    assert_eq!(app.call(op(Req::new("GET", "/v1/bulk"))).await.json()["items"].as_array().unwrap().len(), 1);
    // A reader reads, and may not start or cancel.
    let reader = |r: Req| r.token(Some("reader-token-0001"));
    assert_eq!(app.call(reader(Req::new("GET", "/v1/bulk/paint-east"))).await.status, StatusCode::OK);
    let body = json!({"action": "resume", "filter": filter, "reason": "r"});
    app.call(reader(Req::new("POST", "/v1/bulk").json(body))).await.problem(403, "forbidden");
    app.call(reader(Req::new("POST", "/v1/bulk/paint-east/cancel"))).await.problem(403, "forbidden");
    app.stop().await;
}

#[tokio::test]
async fn gets_are_tagged_answered_304_when_unchanged_and_gzipped_when_asked() {
    let app = App::new(Tokens::open()).await;
    let first = app.call(Req::new("GET", "/v1/overview?window=1m")).await;
    let tag = first.headers[header::ETAG].to_str().unwrap().to_string();
    assert!(tag.starts_with("W/\""), "{tag}");
    // Unchanged: 304, no body. The clock moved no whole minute in between, so the body is
    // the same (`now` aside: the overview says when it was read).
    let entities = app.call(Req::new("GET", "/v1/entities?limit=5")).await;
    let etag = entities.headers[header::ETAG].to_str().unwrap().to_string();
    let again = app.call(Req::new("GET", "/v1/entities?limit=5").header("If-None-Match", &etag)).await;
    assert_eq!((again.status, again.text.as_str()), (StatusCode::NOT_MODIFIED, ""));
    assert_eq!(again.headers[header::ETAG], etag.as_str());
    // Changed: 200 and a new tag.
    app.post("/v1/machines/door/entities", json!({"key": "new"})).await;
    let changed = app.call(Req::new("GET", "/v1/entities?limit=5").header("If-None-Match", &etag)).await;
    assert_eq!(changed.status, StatusCode::OK);
    assert_ne!(changed.headers[header::ETAG], etag.as_str());
    // A route's own tag (a definition's hash) is kept and honoured.
    let def = app.call(Req::new("GET", "/v1/machines/door")).await;
    let own = def.headers[header::ETAG].to_str().unwrap().to_string();
    let again = app.call(Req::new("GET", "/v1/machines/door").header("If-None-Match", &own)).await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    // The dashboard's files: gzip for a client that asks, and 304 when unchanged.
    let js = app.call(Req::new("GET", "/ui/app.js").header("Accept-Encoding", "gzip")).await;
    assert_eq!(js.headers[header::CONTENT_ENCODING], "gzip");
    let plain = app.call(Req::new("GET", "/ui/app.js")).await;
    assert!(plain.headers.get(header::CONTENT_ENCODING).is_none());
    assert!(plain.text.contains("function"), "plain without Accept-Encoding");
    let tag = plain.headers[header::ETAG].to_str().unwrap().to_string();
    let again =
        app.call(Req::new("GET", "/ui/app.js").header("If-None-Match", &tag).header("Accept-Encoding", "gzip")).await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    // Writes and problems are not tagged.
    let created = app.call(Req::new("POST", "/v1/machines/door/entities").json(json!({"key": "other"}))).await;
    assert!(created.headers.get(header::ETAG).is_none());
    let missing = app.call(Req::new("GET", "/v1/machines/door/entities/nobody")).await;
    assert!(missing.headers.get(header::ETAG).is_none());
    app.stop().await;
}

#[tokio::test]
async fn a_stored_older_version_is_drawn_when_asked() {
    let app = App::new(Tokens::open()).await;
    app.post("/v1/machines/door/entities", json!({"key": "d"})).await;
    let current = app.get("/v1/machines").await.json()["items"][0]["hash"].as_str().unwrap().to_string();
    let e = app.get("/v1/machines/door/entities/d").await.json();
    assert_eq!(e["machine_version"], current.as_str(), "{e}");
    // An older version, stored as a deployment before this one would have.
    let old = settle_core::MachineBuilder::new("door")
        .state("closed")
        .initial()
        .state("ajar")
        .event("nudge", ["closed"], "to_ajar")
        .action("to_ajar", ["ajar"])
        .build()
        .unwrap();
    let store = app.state.engine().store();
    let versions = vec![settle_store::NewVersion {
        name: "door".into(),
        hash: old.content_hash(),
        definition: old.canonical_json(),
        origin: String::new(),
    }];
    let deploy = settle_store::Deploy { versions, now: 1, ..Default::default() };
    settle_store::Store::machine_deploy(store, deploy).await.unwrap();
    let svg = app.get(&format!("/v1/machines/door/graph?format=svg&version={}", old.content_hash())).await.text;
    assert!(svg.contains("data-state=\"ajar\""), "the old version's states");
    let now = app.get(&format!("/v1/machines/door/graph?format=svg&version={current}")).await.text;
    assert_eq!(now, app.get("/v1/machines/door/graph?format=svg").await.text);
    let p = app.get("/v1/machines/door/graph?format=svg&version=nope").await.problem(404, "unknown-machine");
    assert_eq!(p["field"], "version");
    app.stop().await;
}

#[tokio::test]
async fn a_reason_travels_with_an_operator_command() {
    let app = App::new(Tokens::open()).await;
    app.post("/v1/machines/door/entities", json!({"key": "d"})).await;
    let r = app
        .call(
            Req::new("POST", "/v1/machines/door/entities/d/pause?reason=painting%20the%20hall")
                .header("Idempotency-Key", "p-1"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let op = app.get("/v1/operations/p-1").await.json();
    assert_eq!(op["dimensions"]["reason"], "painting the hall", "{op}");
    let h = app.get("/v1/machines/door/entities/d/history").await.json();
    assert_eq!(h.as_array().unwrap().last().unwrap()["detail"], "pause: painting the hall");
    // Without one, the command alone; an unknown query parameter is refused.
    app.post("/v1/machines/door/entities/d/resume", json!({})).await;
    let h = app.get("/v1/machines/door/entities/d/history").await.json();
    assert_eq!(h.as_array().unwrap().last().unwrap()["detail"], "resume");
    let p = app.call(Req::new("POST", "/v1/machines/door/entities/d/pause?why=x")).await.problem(400, "bad-request");
    assert_eq!(p["field"], "why");
    app.stop().await;
}

#[tokio::test]
async fn operations_page_older_with_a_cursor() {
    let app = App::new(Tokens::open()).await;
    for key in ["a", "b", "c", "d", "e"] {
        app.post("/v1/machines/door/entities", json!({"key": key})).await;
    }
    let mut seen = Vec::new();
    let mut page = app.get("/v1/operations?limit=2").await.json();
    loop {
        seen.extend(page["items"].as_array().unwrap().iter().map(|o| o["key"].as_str().unwrap().to_string()));
        let Some(next) = page["next"].as_str() else { break };
        page = app.get(&format!("/v1/operations?limit=2&before={next}")).await.json();
    }
    assert_eq!(seen, ["e", "d", "c", "b", "a"], "newest first, each once");
    let p = app.get("/v1/operations?before=abc").await.problem(400, "bad-request");
    assert_eq!(p["field"], "before");
    app.stop().await;
}
