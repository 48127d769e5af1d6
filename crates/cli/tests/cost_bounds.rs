//! What a caller with the lowest role may ask stays cheap (issue 66), on a real `settle
//! serve`: a `where` deep enough to overflow a stack, or nesting comprehensions, is refused
//! at once while the server goes on answering; a filter that is allowed but costly stops at
//! its budget; feed streams are bounded per token and in all and end after their lifetime;
//! an agent's huge error is refused naming the field, and a long `error=` too; an answer
//! over 8 MiB goes out whole; and the low findings of the probe of 2026-12-07, each.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::testkit::query_value as encode;
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-0000001";
const READER: &str = "reader-token-000001";
const READER2: &str = "reader-token-000002";
const AGENT: &str = "agent-token-0000001";
const OTHER_AGENT: &str = "agent-token-0000002";

/// A `settle serve` with the test machines (`vm`, `door`) and tokens, on a fresh file.
struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let machines = common::write_machines(
            dir.path(),
            &[("vm.toml", common::testkit::VM), ("door.toml", common::testkit::DOOR), ("dns.toml", DNS)],
        );
        let mut c = Command::new(env!("CARGO_BIN_EXE_settle"));
        c.arg("--db").arg(dir.path().join("settle.db")).arg("--machines").arg(&machines);
        c.args(["serve", "--listen", "127.0.0.1:0"]).args(extra);
        let tokens =
            format!("admin={ADMIN};reader={READER};reader={READER2};agent:cloud={AGENT};agent:dns={OTHER_AGENT}");
        c.env("SETTLE_LOG", "error").env("SETTLE_TOKENS", tokens).env_remove("SETTLE_SERVER");
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let (child, addr) = common::spawn_serve_command(&mut c);
        Server { child, addr, _dir: dir }
    }

    /// One request with `token`: status and JSON body.
    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let auth = format!("Bearer {token}");
        let body = body.map(|b| b.to_string());
        common::http_with(&self.addr, method, path, &[("Authorization", &auth)], body.as_deref())
    }

    /// A raw request (`head` without the request line's end): status, headers, body.
    fn raw(&self, head: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, head, raw[split + 4..].to_vec())
    }

    fn healthy(&self) -> bool {
        common::http_text(&self.addr, "GET", "/healthz").0 == 200
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A machine whose agents serve queue `dns` (another queue than `vm`'s `cloud`).
const DNS: &str = "initial = \"new\"\n[states.new]\n[states.working]\nauto = \"work\"\n[states.done]\n\
                   [events.go]\nin = [\"new\"]\naction = \"begin\"\n[actions.begin]\nto = [\"working\"]\n\
                   [actions.work]\nto = [\"done\"]\nagent = \"dns\"\n";

fn list(n: usize) -> String {
    format!("[{}]", (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(","))
}

#[test]
fn deep_or_comprehension_nesting_filters_are_refused_at_once_and_the_server_keeps_answering() {
    let mut s = Server::start(&["--filter-budget", "300ms"]);
    for i in 0..30 {
        let body = json!({"key": format!("vm-{i:02}"), "properties": {"l": (0..3000).collect::<Vec<u32>>()}});
        let (st, v) = s.call("POST", "/v1/machines/vm/entities", ADMIN, Some(body));
        assert_eq!(st, 201, "{v}");
    }
    let (l40, l100) = (list(40), list(100));
    // (the `where`, what the refusal names)
    let refusals: Vec<(String, &str)> = vec![
        (format!("props{} == 1", ".a".repeat(5000)), "bytes long"),
        (format!("props{} == 1", ".a".repeat(300)), "nests deeper"),
        (format!("{} > 0", vec!["1"; 1500].join(" + ")), "bytes long"),
        (format!("{} > 0", vec!["1"; 300].join("+")), "nests deeper"),
        (format!("{l40}.all(a, {l40}.all(b, {l40}.all(c, {l40}.all(d, a >= 0))))"), "may not contain another"),
        (format!("size({l100}.map(a, {l100}.map(b, {l100}.map(c, {l100})))) > 0"), "bytes long"),
        (format!("size({l40}.map(a, a)) > 0"), "may not build a list"),
    ];
    let addr = s.addr.clone();
    let senders: Vec<_> = refusals
        .into_iter()
        .map(|(w, names)| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let path = format!("/v1/entities?machine=vm&total=true&where={}", encode(&w));
                let auth = format!("Bearer {READER}");
                let (st, v) = common::http_with(&addr, "GET", &path, &[("Authorization", &auth)], None);
                (st, v, names)
            })
        })
        .collect();
    // Meanwhile the server answers.
    for _ in 0..20 {
        assert!(s.healthy());
    }
    for t in senders {
        let (st, v, names) = t.join().unwrap();
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["field"], "where", "{v}");
        assert!(v["detail"].as_str().unwrap().contains(names), "{names}: {v}");
    }
    // Allowed, but costly over these entities: it stops at its budget.
    let costly = encode("props.l.all(x, x in props.l)");
    let (st, v) = s.call("GET", &format!("/v1/entities?machine=vm&where={costly}"), READER, None);
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["type"], "https://settle.dev/problems/filter-too-costly", "{v}");
    // And an ordinary one is answered.
    let (st, v) =
        s.call("GET", &format!("/v1/entities?machine=vm&where={}", encode("size(props.l) == 3000")), READER, None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(30), "{v}");
    assert!(s.healthy() && s.alive(), "the server is up");
}

/// Opens `GET /v1/feed` with `token`: the status, and the open connection (a 200 stays open).
fn open_stream(addr: &str, token: &str) -> (u16, Option<u64>, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req =
        format!("GET /v1/feed HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let (mut status, mut retry) = (0, None);
    let mut line = String::new();
    while r.read_line(&mut line).unwrap() > 0 {
        if line == "\r\n" {
            break;
        }
        if status == 0 {
            status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("retry-after:") {
            retry = v.trim().parse().ok();
        }
        line.clear();
    }
    (status, retry, r)
}

#[test]
fn feed_streams_are_bounded_per_token_and_in_all_and_end_after_their_lifetime() {
    let s = Server::start(&[
        "--rate-limit",
        "0",
        "--streams-per-token",
        "16",
        "--max-streams",
        "40",
        "--stream-lifetime",
        "3s",
    ]);
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..2000 {
        let (status, retry, stream) = open_stream(&s.addr, READER);
        match status {
            200 => open.push(stream),
            429 => {
                assert!(retry.is_some_and(|r| r >= 1), "Retry-After");
                refused += 1;
            }
            other => panic!("status {other}"),
        }
    }
    assert_eq!((open.len(), refused), (16, 1984), "one token holds 16 streams");
    // Another token still connects, and the server answers everyone else.
    let (status, _, other) = open_stream(&s.addr, READER2);
    assert_eq!(status, 200);
    assert!(s.healthy());
    let (st, _) = s.call("GET", "/v1/machines", ADMIN, None);
    assert_eq!(st, 200);
    let metrics = format!(
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ADMIN}\r\nConnection: close\r\n\r\n",
        s.addr
    );
    let (st, _, body) = s.raw(&metrics, b"");
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("settle_feed_streams 17\n"), "{text}");
    assert!(text.contains("settle_http_refused_total{reason=\"too_many_streams\"} 1984\n"), "{text}");
    // After its lifetime the server ends a stream: the client reads its end.
    let mut first = open.remove(0);
    let mut rest = Vec::new();
    let ended = first.read_to_end(&mut rest).is_ok();
    assert!(ended, "the stream ended");
    drop(other);
}

#[test]
fn an_agents_huge_error_is_refused_naming_the_field_and_a_long_error_search_too() {
    let s = Server::start(&[]);
    for key in ["vm-1", "vm-2"] {
        let (st, v) = s.call("POST", "/v1/machines/vm/entities", ADMIN, Some(json!({"key": key})));
        assert_eq!(st, 201, "{v}");
        let (st, v) = s.call("POST", &format!("/v1/machines/vm/entities/{key}/events/create"), ADMIN, None);
        assert_eq!(st, 202, "{v}");
    }
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (st, v) =
            s.call("POST", "/v1/queues/cloud/lease", AGENT, Some(json!({"agent": "a", "max": 2, "wait_ms": 500})));
        assert_eq!(st, 200, "{v}");
        tasks.extend(v["tasks"].as_array().unwrap().iter().cloned());
        if tasks.len() == 2 {
            break;
        }
    }
    assert_eq!(tasks.len(), 2);
    let fail = |task: &Value, error: &str| {
        let path = format!("/v1/tasks/{}/fail", task["id"]);
        s.call("POST", &path, AGENT, Some(json!({"token": task["token"], "error": error, "retryable": false})))
    };
    let (st, v) = fail(&tasks[0], &"a".repeat(200_000));
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["field"], "error", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("at most 8192"), "{v}");
    // Beyond the body limit: refused before it is read.
    let (st, v) = fail(&tasks[0], &"a".repeat(1 << 20));
    assert_eq!(st, 413, "{v}");
    // Within it: accepted, and found by a search.
    let error = format!("provider failed: {}", "a".repeat(8000));
    let (st, v) = fail(&tasks[1], &error);
    assert_eq!(st, 202, "{v}");
    let failed = tasks[1]["key"].as_str().unwrap().to_string();
    for _ in 0..100 {
        let (_, e) = s.call("GET", &format!("/v1/machines/vm/entities/{failed}"), READER, None);
        if e["run_status"] == "failed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let long = "a".repeat(257);
    let (st, v) = s.call("GET", &format!("/v1/entities?machine=vm&error={long}"), READER, None);
    assert_eq!(st, 400, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("at most 256"), "{v}");
    let needle = format!("{}b", "a".repeat(255));
    let (st, v) = s.call("GET", &format!("/v1/entities?machine=vm&error={needle}"), READER, None);
    assert_eq!((st, v["items"].as_array().map(Vec::len)), (200, Some(0)), "{v}");
    let (st, v) = s.call("GET", &format!("/v1/entities?machine=vm&error={}", "a".repeat(256)), READER, None);
    assert_eq!((st, v["items"].as_array().map(Vec::len)), (200, Some(1)), "{v}");
}

#[test]
fn an_answer_over_8_mib_goes_out_whole_and_untagged() {
    let s = Server::start(&[]);
    let big = "x".repeat(250_000);
    for i in 0..40 {
        let body = json!({"key": format!("big-{i:02}"), "properties": {"blob": big}});
        let (st, v) = s.call("POST", "/v1/machines/door/entities", ADMIN, Some(body));
        assert_eq!(st, 201, "{v}");
    }
    let head = format!(
        "GET /v1/entities?prefix=big-&limit=50 HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {READER}\r\nConnection: close\r\n\r\n",
        s.addr
    );
    let (st, head, body) = s.raw(&head, b"");
    assert_eq!(st, 200, "{head}");
    assert!(!head.to_ascii_lowercase().contains("etag:"), "{head}");
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(&body) } else { body };
    assert!(body.len() > 8 << 20, "{} bytes", body.len());
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["items"].as_array().map(Vec::len), Some(40));
    // Properties beyond what one request may set are refused, naming them.
    let (st, v) = s.call(
        "POST",
        "/v1/machines/door/entities",
        ADMIN,
        Some(json!({"key": "huge", "properties": {"blob": "x".repeat(300_000)}})),
    );
    assert_eq!((st, v["field"].as_str()), (422, Some("properties")), "{v}");
}

/// The body of a chunked answer.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[end + 4 + size..];
    }
}

#[test]
fn the_low_findings_each_hold() {
    let s = Server::start(&["--rate-limit", "5"]);
    // Two Host headers, or a target naming another host: 400.
    let two =
        format!("GET /v1/machines HTTP/1.1\r\nHost: {}\r\nHost: evil.example\r\nConnection: close\r\n\r\n", s.addr);
    assert_eq!(s.raw(&two, b"").0, 400);
    let absolute =
        format!("GET http://evil.example/v1/machines HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", s.addr);
    assert_eq!(s.raw(&absolute, b"").0, 400);
    // The scheme of a bearer token in any case; every answer says nosniff and how to cache.
    let upper = format!(
        "GET /v1/machines HTTP/1.1\r\nHost: {}\r\nAuthorization: BEARER {READER}\r\nConnection: close\r\n\r\n",
        s.addr
    );
    let (st, head, _) = s.raw(&upper, b"");
    assert_eq!(st, 200, "{head}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(head.contains("cache-control: private, no-cache"), "{head}");
    let unknown = format!("GET /v1/nope HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", s.addr);
    let (_, head, _) = s.raw(&unknown, b"");
    assert!(head.to_ascii_lowercase().contains("cache-control: no-store"), "{head}");
    // An empty criterion is no criterion.
    let (st, v) = s.call(
        "POST",
        "/v1/bulk",
        ADMIN,
        Some(json!({"action": "pause", "filter": {"prefix": ""}, "reason": "r", "dry_run": true})),
    );
    assert_eq!((st, v["field"].as_str()), (422, Some("filter.prefix")), "{v}");
    // A task of another queue is, to an agent, no task.
    let (st, v) = s.call("POST", "/v1/machines/dns/entities", ADMIN, Some(json!({"key": "d1"})));
    assert_eq!(st, 201, "{v}");
    let (st, v) = s.call("POST", "/v1/machines/dns/entities/d1/events/go", ADMIN, None);
    assert_eq!(st, 202, "{v}");
    let mut leased = Value::Null;
    for _ in 0..50 {
        let (st, v) = s.call("POST", "/v1/queues/dns/lease", OTHER_AGENT, Some(json!({"agent": "o", "wait_ms": 500})));
        assert_eq!(st, 200, "{v}");
        if let Some(t) = v["tasks"].get(0) {
            leased = t.clone();
            break;
        }
    }
    let task = &leased;
    assert!(task.is_object(), "a dns task");
    let report = json!({"task": task["id"], "fail": {"token": task["token"], "error": "x"}});
    let (st, v) = s.call("POST", "/v1/tasks/reports", AGENT, Some(json!({"reports": [report]})));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["results"][0]["problem"]["type"], "https://settle.dev/problems/unknown-task", "{v}");
    // A batch counts as its reports against the rate limit (5 a second): 5 reports spend
    // the second, the next request waits.
    let reports: Vec<Value> =
        (0..5).map(|i| json!({"task": 900_000 + i, "fail": {"token": "t", "error": "x"}})).collect();
    let (st, v) = s.call("POST", "/v1/tasks/reports", AGENT, Some(json!({"reports": reports})));
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.call("POST", "/v1/queues/cloud/lease", AGENT, Some(json!({"agent": "a", "wait_ms": 0})));
    assert_eq!(st, 429, "{v}");
}
