//! End to end: the real `settle serve` binary on a temporary SQLite file and a directory of
//! TOML machines, listening on a free port, spoken to over real HTTP/1.1.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::testkit::{self, DOOR};
use common::write_machines;

use serde_json::{Value, json};

/// A running `settle serve`; stopped with SIGTERM when dropped.
struct Server {
    child: Child,
    addr: String,
    db: PathBuf,
    _dir: tempfile::TempDir,
}

fn serve_command(db: &Path, machines: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_settle"));
    c.arg("--db").arg(db).arg("serve").arg("--machines").arg(machines).args(extra);
    c.env("SETTLE_LOG", "error").env_remove("SETTLE_TOKENS");
    c
}

impl Server {
    fn start(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let machines = write_machines(dir.path(), &[("door.toml", DOOR)]);
        let db = dir.path().join("settle.db");
        let mut cmd = serve_command(&db, &machines, &["--listen", "127.0.0.1:0"]);
        cmd.args(extra).envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let (child, addr) = common::spawn_serve_command(&mut cmd);
        Server { addr, child, db, _dir: dir }
    }

    fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Resp {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", self.addr);
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        let body = body.unwrap_or_default();
        req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        // One write: the server reads a small body whole even when it refuses it (413).
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        s.write_all(&bytes).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        Resp::parse(&raw)
    }

    fn get(&self, path: &str, token: Option<&str>) -> Resp {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        self.call("GET", path, &headers, None)
    }

    fn post(&self, path: &str, token: Option<&str>, body: Option<Value>) -> Resp {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let body = body.map(|b| b.to_string());
        // As a well-behaved client does, even without a body (the server refuses a `POST`
        // that a page of another site could have sent: `server/src/browser.rs`).
        headers.push(("Content-Type", "application/json"));
        self.call("POST", path, &headers, body.as_deref().map(str::as_bytes))
    }

    /// Everything a request could change, read from the database ([`testkit::dump`]).
    fn dump(&self) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { testkit::dump(&settle_store::SqliteStore::open_read_only(&self.db).unwrap()).await })
    }

    /// Stops the server with SIGTERM; its exit status and stderr.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let ok = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill -TERM failed");
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        (status, err)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn parse(raw: &[u8]) -> Resp {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut body = raw[split + 4..].to_vec();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
            let mut out = Vec::new();
            let mut rest = &body[..];
            loop {
                let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
                let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16).unwrap();
                if size == 0 {
                    break;
                }
                out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
                rest = &rest[eol + 4 + size..];
            }
            body = out;
        }
        Resp { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// Asserts a problem document of `status` and `slug` ([`testkit::problem`]), and
    /// returns it.
    #[track_caller]
    fn problem(&self, status: u16, slug: &str) -> Value {
        testkit::problem(self.status, self.header("content-type"), &self.body, status, slug)
    }
}

#[test]
fn raise_202_then_poll_the_operation_and_raise_with_wait_stable() {
    let server = Server::start(&[], &[]);
    assert_eq!(server.get("/healthz", None).json(), json!({"status": "ok"}));
    let r = server.post("/v1/machines/door/entities", None, Some(json!({"key": "front", "properties": {"floor": 2}})));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.header("location"), Some("/v1/machines/door/entities/front"));

    // 202: queued; the Location is the operation, which completes.
    let r = server.post("/v1/machines/door/entities/front/events/open", None, None);
    assert_eq!(r.status, 202, "{}", r.body);
    let location = r.header("location").unwrap().to_string();
    assert_eq!(r.json()["operation"], location.as_str());
    let deadline = Instant::now() + Duration::from_secs(30);
    let op = loop {
        let op = server.get(&location, None).json();
        if !op["outcome"].is_null() {
            break op;
        }
        assert!(Instant::now() < deadline, "operation never completed: {op}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(op["outcome"], "success", "{op}");
    assert_eq!(server.get("/v1/machines/door/entities/front", None).json()["state"], "open");

    // wait=stable: 200 with the outcome and the entity at rest.
    let r = server.post("/v1/machines/door/entities/front/events/close?wait=stable", None, Some(json!({})));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["outcome"], json!({"result": "accepted", "state": "closed"}));
    assert_eq!(v["entity"]["state"], "closed");
    assert_eq!(v["entity"]["properties"], json!({"floor": 2}));
    let history = server.get("/v1/machines/door/entities/front/history", None).json();
    let states: Vec<&str> = history.as_array().unwrap().iter().map(|h| h["to"].as_str().unwrap()).collect();
    assert_eq!(states, ["closed", "open", "closed"]);

    // The OpenAPI document is served and is OpenAPI 3.1.
    let spec = server.get("/openapi.json", None).json();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1"), "{}", spec["openapi"]);
    assert!(spec["paths"]["/v1/machines/{machine}/entities/{key}/events/{event}"]["post"].is_object());

    let (status, err) = server.stop();
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("no tokens configured"), "{err}");
}

/// A bad request and its answer: method, path, headers, body, status, problem type.
type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str, u16, &'a str);

#[test]
fn bad_requests_are_problems_and_change_nothing() {
    let server = Server::start(&["--max-body", "256"], &[]);
    for key in ["d", "gone"] {
        assert_eq!(server.post("/v1/machines/door/entities", None, Some(json!({"key": key}))).status, 201);
    }
    let r = server.post("/v1/machines/door/entities/gone/events/remove?wait=stable", None, None);
    assert_eq!(r.json()["entity"]["state"], "gone", "{}", r.body);
    let ev = "/v1/machines/door/entities/d/events";
    let json_ct = [("Content-Type", "application/json")];
    let big = format!("{{\"key\": \"{}\"}}", "x".repeat(1000));
    let ev_paint = format!("{ev}/paint");
    let ev_fly = format!("{ev}/fly");
    let ev_close = format!("{ev}/close?wait=stable");
    let table: Vec<Case> = vec![
        ("POST", "/v1/machines/door/entities", &json_ct, "{\"key\": ", 400, "malformed-json"),
        ("POST", "/v1/machines/nope/entities", &json_ct, "{\"key\": \"k\"}", 404, "unknown-machine"),
        ("GET", "/v1/machines/door/entities/nope", &[], "", 404, "unknown-entity"),
        ("POST", "/v1/machines/door/entities/nope/events/open", &json_ct, "", 404, "unknown-entity"),
        ("POST", &ev_fly, &json_ct, "", 404, "unknown-event"),
        ("POST", &ev_paint, &json_ct, "{}", 422, "invalid-parameters"),
        ("POST", &ev_paint, &json_ct, "{\"color\": 1, \"size\": 2}", 422, "invalid-parameters"),
        (
            "POST",
            "/v1/machines/door/entities",
            &json_ct,
            "{\"key\": \"k\", \"properties\": 3}",
            422,
            "invalid-properties",
        ),
        ("POST", "/v1/machines/door/entities", &json_ct, &big, 413, "body-too-large"),
        (
            "POST",
            "/v1/machines/door/entities",
            &[("Content-Type", "text/plain")],
            "{\"key\": \"k\"}",
            415,
            "unsupported-media-type",
        ),
        ("POST", &ev_close, &json_ct, "", 409, "event-rejected"),
        ("GET", "/v1/machines/door/entities/gone", &[], "", 410, "entity-deleted"),
        ("POST", "/v1/machines/door/entities/gone/events/open", &json_ct, "", 410, "entity-deleted"),
        // A `POST` that does not say JSON (a page of another site could send it unasked).
        ("POST", "/v1/machines/door/entities/d/kill", &[], "", 415, "unsupported-media-type"),
        ("GET", "/v1/entities?limit=0", &[], "", 400, "bad-request"),
        ("GET", "/nowhere", &[], "", 404, "unknown-route"),
    ];
    let before = server.dump();
    for (method, path, headers, body, status, slug) in table {
        let r = server.call(method, path, headers, Some(body.as_bytes()));
        let p = r.problem(status, slug);
        assert!(!p["detail"].as_str().unwrap().is_empty(), "{method} {path}: {p}");
        assert_eq!(server.dump(), before, "{method} {path} changed the store");
    }
    let p = server.post(&ev_close, None, None).problem(409, "event-rejected");
    assert_eq!((p["state"].as_str(), p["event"].as_str()), (Some("closed"), Some("close")), "{p}");
    let p = server.post(&format!("{ev}/paint"), None, Some(json!({}))).problem(422, "invalid-parameters");
    assert_eq!((p["field"].as_str(), p["machine"].as_str()), (Some("color"), Some("door")), "{p}");
    let (status, err) = server.stop();
    assert!(status.success(), "{status}: {err}");
}

#[test]
fn access_matrix_of_roles_and_route_groups() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[token]]\ntoken = \"admin-token-00001\"\nrole = \"admin\"\n\
         [[token]]\ntoken = \"operator-token-01\"\nrole = \"operator\"\n\
         [[token]]\ntoken = \"agent-token-00001\"\nrole = \"agent\"\nqueues = [\"dns\"]\n",
    )
    .unwrap();
    // The reader comes from the environment, beside the file. The matrix tries a wrong
    // token on every route: more than an address may fail a minute (`--auth-failures`).
    let server = Server::start(
        &["--tokens", tokens.to_str().unwrap(), "--auth-failures", "0"],
        &[("SETTLE_TOKENS", "reader=reader-token-0001")],
    );
    assert_eq!(
        server.post("/v1/machines/door/entities", Some("admin-token-00001"), Some(json!({"key": "d"}))).status,
        201
    );
    let e = "/v1/machines/door/entities/d";
    let reads = [
        "/v1/machines".to_string(),
        "/v1/machines/door".to_string(),
        "/v1/machines/door/graph?format=dot".to_string(),
        "/v1/entities".to_string(),
        e.to_string(),
        format!("{e}/history"),
        "/v1/operations".to_string(),
    ];
    let system = ["/metrics", "/openapi.json"];
    // Expected status per group: read, create/raise, lifecycle, metrics/openapi, healthz.
    let matrix: [(Option<&str>, [u16; 5]); 6] = [
        (Some("admin-token-00001"), [200, 202, 200, 200, 200]),
        (Some("operator-token-01"), [200, 202, 200, 200, 200]),
        (Some("reader-token-0001"), [200, 403, 403, 200, 200]),
        (Some("agent-token-00001"), [403, 403, 403, 403, 200]),
        (None, [401, 401, 401, 401, 200]),
        (Some("t-bogus"), [401, 401, 401, 401, 200]),
    ];
    for (token, [read, write, lifecycle, sys, health]) in matrix {
        let who = token.unwrap_or("no token");
        for path in &reads {
            assert_eq!(server.get(path, token).status, read, "{who} GET {path}");
        }
        let key = format!("k-{who}");
        let created = server.post("/v1/machines/door/entities", token, Some(json!({"key": key})));
        assert_eq!(created.status, if write == 202 { 201 } else { write }, "{who} create: {}", created.body);
        let raised = server.post(&format!("{e}/events/paint"), token, Some(json!({"color": "red"})));
        assert_eq!(raised.status, write, "{who} raise: {}", raised.body);
        for c in ["pause", "resume", "release", "retry"] {
            assert_eq!(server.post(&format!("{e}/{c}"), token, None).status, lifecycle, "{who} {c}");
        }
        let slept = server.post(&format!("{e}/sleep"), token, Some(json!({"until": "+1m"})));
        assert_eq!(slept.status, lifecycle, "{who} sleep: {}", slept.body);
        assert_eq!(server.post(&format!("{e}/resume"), token, None).status, lifecycle, "{who} resume");
        for path in system {
            assert_eq!(server.get(path, token).status, sys, "{who} GET {path}");
        }
        assert_eq!(server.get("/healthz", token).status, health, "{who} /healthz");
        // Refusals are problems, and a 401 names the scheme.
        let r = server.get("/v1/machines", token);
        match r.status {
            401 => {
                r.problem(401, "unauthorized");
                assert_eq!(r.header("www-authenticate"), Some("Bearer"));
            }
            403 => {
                r.problem(403, "forbidden");
            }
            _ => {}
        }
    }
    let (status, err) = server.stop();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("no tokens configured"), "{err}");
}

#[test]
fn start_up_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.db");
    let good = write_machines(dir.path(), &[("door.toml", DOOR)]);

    // No tokens and a non-loopback address: refused with exit status 2.
    let out = serve_command(&db, &good, &["--listen", "0.0.0.0:0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("without tokens"), "{}", common::stderr(&out));

    // A machine file with errors stops start-up and names file and line.
    let bad_dir = tempfile::tempdir().unwrap();
    let bad = write_machines(bad_dir.path(), &[("door.toml", DOOR), ("broken.toml", "initial = \"a\"\n[states.b]\n")]);
    let out = serve_command(&db, &bad, &["--listen", "127.0.0.1:0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let err = common::stderr(&out);
    assert!(err.contains("broken.toml") && err.contains("error"), "{err}");

    // An action with several targets needs a handler `settle serve` does not have.
    let probe = "initial = \"a\"\n[states.a]\n[states.b]\n[events.go]\nin = [\"a\"]\naction = \"decide\"\n\
                 [actions.decide]\nto = [\"a\", \"b\"]\n";
    let handlers_dir = tempfile::tempdir().unwrap();
    let needs = write_machines(handlers_dir.path(), &[("probe.toml", probe)]);
    let out = serve_command(&dir.path().join("other.db"), &needs, &["--listen", "127.0.0.1:0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let err = common::stderr(&out);
    assert!(err.contains("no handler for action `decide` of machine `probe`"), "{err}");

    // A token file that does not parse.
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, "[[token]]\ntoken = \"x\"\nrole = \"boss\"\n").unwrap();
    let out = serve_command(&db, &good, &["--tokens", tokens.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("unknown role `boss`"), "{}", common::stderr(&out));
}
