//! The `http_request` target: the server's real router, in process.

use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, header};
use serde_json::{Map, Value};
use settle_engine::{Engine, RaiseOptions, Wait};
use settle_server::auth::{Role, Token, Tokens};
use settle_server::{AppState, Config};
use settle_store::{AnyStore, SqliteStore};
use tower::ServiceExt;

/// The machines served: a door, and a machine whose action agents execute (queue `cloud`).
const MACHINES: &[(&str, &str)] = &[
    ("door", include_str!("../../server/src/testdata/door.toml")),
    ("vm", include_str!("../../server/src/testdata/vm.toml")),
];

/// The tokens of the guarded router: `Authorization: Bearer <secret>`.
const TOKENS: &[(&str, Role)] = &[
    ("admin-token-0000", Role::Admin),
    ("operator-token-0000", Role::Operator),
    ("reader-token-0000", Role::Reader),
    ("agent-token-0000", Role::Agent),
];

/// The routes a request is sent to, chosen by the input's first byte: method, and path
/// with `{}` for each segment the input fills in. The last entry takes method and path
/// from the input itself.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/session"),
    ("GET", "/v1/machines"),
    ("GET", "/v1/machines/{}"),
    ("GET", "/v1/machines/{}/graph"),
    ("GET", "/v1/machines/{}/versions"),
    ("GET", "/v1/machines/{}/toml"),
    ("POST", "/v1/machines/{}/entities"),
    ("GET", "/v1/entities"),
    ("GET", "/v1/machines/{}/entities/{}"),
    ("GET", "/v1/machines/{}/entities/{}/history"),
    ("GET", "/v1/machines/{}/entities/{}/related"),
    ("GET", "/v1/machines/{}/entities/{}/timers"),
    ("GET", "/v1/machines/{}/entities/{}/errors"),
    ("POST", "/v1/machines/{}/entities/{}/events/{}/check"),
    ("POST", "/v1/machines/{}/entities/{}/events/{}"),
    ("POST", "/v1/machines/{}/entities/{}/pause"),
    ("POST", "/v1/machines/{}/entities/{}/resume"),
    ("POST", "/v1/machines/{}/entities/{}/kill"),
    ("POST", "/v1/machines/{}/entities/{}/release"),
    ("POST", "/v1/machines/{}/entities/{}/retry"),
    ("POST", "/v1/machines/{}/entities/{}/sleep"),
    ("GET", "/v1/operations"),
    ("GET", "/v1/operations/{}"),
    ("GET", "/v1/operations/{}/trace"),
    ("GET", "/v1/overview"),
    ("POST", "/v1/queues/{}/lease"),
    ("POST", "/v1/tasks/{}/heartbeat"),
    ("POST", "/v1/tasks/{}/complete"),
    ("POST", "/v1/tasks/{}/fail"),
    ("GET", "/ui/"),
    ("", ""),
];

/// Path segments used when the input gives fewer than the route has.
const DEFAULT_SEGMENTS: &[&str] = &["door", "d1", "open"];

/// How many requests a server answers before it is replaced by a fresh one: requests
/// change the store (an entity removed stays removed), so the fixture entities are brought
/// back now and then, and the database does not grow without bound.
const REQUESTS_PER_SERVER: u32 = 20_000;

/// A server: a runtime, an engine over a SQLite file (in `/dev/shm` when there is one, so
/// that commits cost no disk flush), and two routers on it: an open one (everyone is an
/// admin) and one with [`TOKENS`].
struct Server {
    runtime: tokio::runtime::Runtime,
    engine: Engine<AnyStore>,
    open: Router,
    guarded: Router,
    answered: u32,
    _dir: tempfile::TempDir,
}

/// The process's server (a static: never dropped, so no runtime is torn down at exit).
static SERVER: Mutex<Option<Server>> = Mutex::new(None);

/// Stops and drops the process's server, and its directory with it (the next input builds
/// another).
pub(crate) fn release() {
    let old = SERVER.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
    if let Some(old) = old {
        old.runtime.block_on(old.engine.shutdown());
    }
}

/// Runs `f` with the process's server, building one first when there is none or the
/// current one has answered [`REQUESTS_PER_SERVER`] requests.
fn with_server<T>(f: impl FnOnce(&Server) -> T) -> T {
    // A panic found by an earlier input leaves the server usable.
    let mut slot = SERVER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if slot.as_ref().is_none_or(|s| s.answered >= REQUESTS_PER_SERVER) {
        // The old server's engine stops before the new one starts.
        if let Some(old) = slot.take() {
            old.runtime.block_on(old.engine.shutdown());
        }
        *slot = Some(new_server());
    }
    let server = slot.as_mut().expect("a server");
    server.answered += 1;
    f(server)
}

/// A `tracing` subscriber that enables the server's spans and events and formats every
/// field recorded, so that the request span's code (`settle_server::trace`) runs as it
/// does under `settle serve`, which logs them.
struct Spans;

impl tracing::Subscriber for Spans {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("settle_server")
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        span.record(&mut Fields);
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut Fields);
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        event.record(&mut Fields);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

struct Fields;

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        drop(format!("{value:?}"));
    }
}

fn new_server() -> Server {
    {
        // Only the first call installs it (another subscriber may be installed already).
        let _ = tracing::subscriber::set_global_default(Spans);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let dir = temp_dir();
        let (engine, open, guarded) = runtime.block_on(async {
            let store = AnyStore::Sqlite(SqliteStore::open(dir.path().join("settle.db")).expect("a store"));
            let mut builder = Engine::builder(store);
            for (name, text) in MACHINES {
                let (machine, _) = settle_core::toml::load(&format!("{name}.toml"), name, text).expect("a machine");
                builder = builder.machine(machine);
            }
            let engine = builder.start().await.expect("an engine");
            // Entities the default segments name, and an agent task to report on.
            engine.create("door", "d1", Map::new()).await.expect("door d1");
            engine.create("vm", "v1", Map::new()).await.expect("vm v1");
            engine.raise("vm", "v1", "create", RaiseOptions::wait(Wait::Outcome)).await.expect("vm v1 created");
            let names: Vec<&str> = MACHINES.iter().map(|(n, _)| *n).collect();
            let config = Config {
                max_body: 16 << 10,
                max_wait: Duration::from_millis(20),
                default_wait: Duration::from_millis(10),
                rate_limit: 0,
                // Wrong tokens are half of what the fuzzer sends: let every one reach the
                // guard's answer (the failure limit is `settle-server`'s own test).
                auth_failures: 0,
                ..Config::default()
            };
            let mut tokens = Tokens::default();
            for (secret, role) in TOKENS {
                let queues = if *role == Role::Agent { vec!["cloud".to_string()] } else { Vec::new() };
                tokens.add(Token::new(*secret, *role, queues).expect("a token")).expect("tokens");
            }
            let open = AppState::new(engine.clone(), &names, Tokens::open(), config.clone()).expect("open state");
            let guarded = AppState::new(engine.clone(), &names, tokens, config).expect("guarded state");
            (engine, settle_server::router(open), settle_server::router(guarded))
        });
        Server { runtime, engine, open, guarded, answered: 0, _dir: dir }
    }
}

/// A temporary directory, in memory when possible.
pub(crate) fn temp_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new().prefix("settle-fuzz").tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().expect("a temporary directory")
}

/// `s` with every byte outside the URI's unreserved and sub-delimiter characters
/// percent-encoded; `%` itself is kept, so that inputs can carry escapes (good or bad).
fn encode(s: &[u8], keep: &[u8]) -> String {
    let mut out = String::new();
    for &b in s {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@%".contains(&b) || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The request the input describes, or `None` when no HTTP client could send it.
///
/// The input: a byte choosing the router (high bit: the one with tokens) and the route
/// ([`ROUTES`], modulo their count); then lines: the path segments separated by `/` with
/// an optional `?query` (for the last route: `METHOD /path?query`), the `Authorization`
/// header, the `Idempotency-Key` header, the `Content-Type` header (each omitted when its
/// line is empty; a missing `Content-Type` line is `application/json`); then the body
/// (everything after the fourth newline).
fn request(data: &[u8]) -> Option<(bool, Request<Body>)> {
    let (&first, rest) = data.split_first()?;
    let guarded = first & 0x80 != 0;
    let (method, template) = ROUTES[usize::from(first & 0x7f) % ROUTES.len()];
    let mut lines = rest.splitn(5, |&b| b == b'\n');
    let target = lines.next().unwrap_or_default();
    let (method, uri) = if template.is_empty() {
        let text = std::str::from_utf8(target).ok()?;
        let (method, path) = text.split_once(' ').unwrap_or(("GET", text));
        let (path, query) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
        let mut uri = encode(path.as_bytes(), b"/");
        if let Some(q) = query {
            uri.push('?');
            uri.push_str(&encode(q.as_bytes(), b"/?"));
        }
        (Method::from_bytes(method.as_bytes()).ok()?, uri)
    } else {
        let (segments, query) = match target.iter().position(|&b| b == b'?') {
            Some(i) => (&target[..i], Some(&target[i + 1..])),
            None => (target, None),
        };
        let mut given = segments.split(|&b| b == b'/');
        let mut uri = String::new();
        for (i, piece) in template.split("{}").enumerate() {
            if i > 0 {
                let segment =
                    given.next().unwrap_or_else(|| DEFAULT_SEGMENTS.get(i - 1).map_or(b"1", |s| s.as_bytes()));
                uri.push_str(&encode(segment, b""));
            }
            uri.push_str(piece);
        }
        if let Some(q) = query {
            uri.push('?');
            uri.push_str(&encode(q, b"/?"));
        }
        (Method::from_bytes(method.as_bytes()).ok()?, uri)
    };
    let mut builder = Request::builder().method(method).uri(uri);
    let headers = [header::AUTHORIZATION, header::HeaderName::from_static("idempotency-key"), header::CONTENT_TYPE];
    let mut content_type = false;
    for name in headers {
        let Some(value) = lines.next() else {
            break;
        };
        if value.is_empty() {
            content_type |= name == header::CONTENT_TYPE;
            continue;
        }
        // A value no HTTP/1 parser would deliver (control characters) is left out.
        if let Ok(value) = HeaderValue::from_bytes(value) {
            content_type |= name == header::CONTENT_TYPE;
            builder = builder.header(name, value);
        }
    }
    if !content_type {
        builder = builder.header(header::CONTENT_TYPE, "application/json");
    }
    let body = lines.next().unwrap_or_default().to_vec();
    builder.body(Body::from(body)).ok().map(|r| (guarded, r))
}

/// Sends the request the input describes (see `request`) to the server and checks the
/// answer: a success, a redirect, or an error answered with a problem document
/// (`application/problem+json` with its `type`, `title` and `status`); a 5xx only when
/// documented as not a fault (503 `request-timeout` and `unavailable`, 504 `wait-timeout`).
pub fn http_request(data: &[u8]) {
    let Some((guarded, req)) = request(data) else {
        return;
    };
    let what = format!("{} {}", req.method(), req.uri());
    let (status, content_type, body) = with_server(|server| {
        let router = if guarded { &server.guarded } else { &server.open };
        server.runtime.block_on(async {
            let response = router.clone().oneshot(req).await.expect("the router is infallible");
            let status = response.status();
            let content_type =
                response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body is readable");
            (status, content_type, body)
        })
    });
    if status.as_u16() < 400 {
        return;
    }
    let text = String::from_utf8_lossy(&body);
    assert_eq!(content_type.as_deref(), Some("application/problem+json"), "{what}: {status} without a problem: {text}");
    let problem: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{what}: {status}: a problem that is not JSON ({e}): {text}"));
    assert_eq!(problem["status"], status.as_u16(), "{what}: {text}");
    assert!(problem["title"].is_string() && problem["detail"].is_string(), "{what}: {text}");
    let slug = problem["type"].as_str().and_then(|t| t.strip_prefix("https://settle.dev/problems/"));
    let Some(slug) = slug else {
        panic!("{what}: a problem without its type: {text}");
    };
    if status.is_server_error() {
        let documented =
            matches!((status.as_u16(), slug), (503, "request-timeout" | "unavailable") | (504, "wait-timeout"));
        assert!(documented, "{what}: {status}: {text}");
    }
}
