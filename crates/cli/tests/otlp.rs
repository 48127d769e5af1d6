//! OpenTelemetry export, end to end (feature `otlp`: `cargo test -p settle-cli --features
//! otlp --test otlp`): a real `settle serve` exports its spans with OTLP/HTTP (protobuf) to
//! a receiver in this test, which decodes them as a collector would.
#![cfg(feature = "otlp")]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

/// A span as received: its resource's service name, ids, name, kind and attributes.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    name: String,
    kind: i32,
    attrs: BTreeMap<String, String>,
}

impl Span {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(String::as_str)
    }
}

/// An OTLP/HTTP receiver: accepts `POST /v1/traces` (protobuf) on a free port and keeps
/// every span it decodes; anything else is answered 404 and recorded as an error.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    /// Starts it; its endpoint (`http://127.0.0.1:PORT`).
    fn start(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let this = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let this = this.clone();
                std::thread::spawn(move || this.connection(stream));
            }
        });
        endpoint
    }

    /// Serves the requests of one (keep-alive) connection.
    fn connection(&self, stream: TcpStream) {
        let mut out = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        while let Some((request_line, headers, body)) = read_request(&mut reader) {
            let ok = request_line.starts_with("POST /v1/traces ")
                && headers.get("content-type").map(String::as_str) == Some("application/x-protobuf");
            if ok {
                match ExportTraceServiceRequest::decode(body.as_slice()) {
                    Ok(request) => self.spans.lock().unwrap().extend(spans(request)),
                    Err(e) => self.errors.lock().unwrap().push(format!("undecodable body: {e}")),
                }
            } else {
                self.errors.lock().unwrap().push(format!("unexpected request: {request_line} {headers:?}"));
            }
            // An empty ExportTraceServiceResponse: full success.
            let status = if ok { "200 OK" } else { "404 Not Found" };
            let response =
                format!("HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n");
            if out.write_all(response.as_bytes()).is_err() {
                return;
            }
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 request: its request line, headers (lower-case names) and body
/// (`Content-Length` or chunked); `None` at the end of the connection.
fn read_request(r: &mut impl BufRead) -> Option<(String, BTreeMap<String, String>, Vec<u8>)> {
    let mut request_line = String::new();
    if r.read_line(&mut request_line).ok()? == 0 {
        return None;
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let mut body = Vec::new();
    if headers.get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2]; // with its CRLF
            r.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = headers.get("content-length") {
        body.resize(len.parse().ok()?, 0);
        r.read_exact(&mut body).ok()?;
    }
    Some((request_line.trim_end().to_string(), headers, body))
}

/// The spans of an export request, flattened.
fn spans(request: ExportTraceServiceRequest) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let resource = rs.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Span {
                    service: service.clone(),
                    trace_id: s.trace_id,
                    span_id: s.span_id,
                    parent_span_id: s.parent_span_id,
                    name: s.name,
                    kind: s.kind,
                    attrs: attributes(&s.attributes),
                });
            }
        }
    }
    out
}

/// Attributes as text (numbers and booleans formatted).
fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    let text = |v: &Option<AnyValue>| match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    };
    kvs.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

/// One request to `addr` (`Connection: close`): the status, the `Location` header, the body.
fn call(addr: &str, method: &str, path: &str, idempotency_key: Option<&str>, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(key) = idempotency_key {
        req.push_str(&format!("Idempotency-Key: {key}\r\n"));
    }
    // Every state-changing request says it is JSON, even without a body: a server without
    // tokens refuses the requests a web page could send unasked (README, "Security").
    if method != "GET" {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let location = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("location")).map(|(_, v)| v.trim()))
        .unwrap_or_default()
        .to_string();
    (status, location, body.to_string())
}

#[test]
fn serve_exports_http_and_store_commit_spans_with_the_request_id() {
    let receiver = Receiver::default();
    let endpoint = receiver.start();
    let dir = tempfile::tempdir().unwrap();
    let machines = common::write_machines(dir.path(), &[("door.toml", common::testkit::DOOR)]);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_settle"));
    cmd.arg("--db")
        .arg(dir.path().join("settle.db"))
        .args(["serve", "--listen", "127.0.0.1:0", "--machines"])
        .arg(&machines)
        .env("SETTLE_LOG", "warn")
        .env_remove("SETTLE_TOKENS")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("SETTLE_OTLP_FILTER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, addr) = common::spawn_serve_command(&mut cmd);

    let (status, _, body) = call(&addr, "POST", "/v1/machines/door/entities", Some("otlp-create-1"), r#"{"key":"d1"}"#);
    assert_eq!(status, 201, "{body}");
    let (status, _, body) =
        call(&addr, "POST", "/v1/machines/door/entities/d1/events/open?wait=stable", Some("otlp-open-1"), "");
    assert_eq!(status, 200, "{body}");
    // No Idempotency-Key: the server generates the request id and names the operation.
    let (status, location, body) = call(&addr, "POST", "/v1/machines/door/entities/d1/events/close", None, "");
    assert_eq!(status, 202, "{body}");
    let generated = location.strip_prefix("/v1/operations/").expect("an operation's location").to_string();

    // SIGTERM at once: the batch processor exports every 100 ms while the server runs, and
    // what the last requests left is flushed when it stops, before it exits.
    let ok = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success();
    assert!(ok, "kill -TERM failed");
    let exit = child.wait().unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(exit.success(), "settle serve exited with {exit}: {stderr}");
    assert!(!stderr.contains("OpenTelemetry"), "{stderr}");
    assert_eq!(*receiver.errors.lock().unwrap(), Vec::<String>::new());

    let spans = receiver.spans();
    assert!(spans.iter().all(|s| s.service == "settle"), "service.name: {spans:#?}");

    // The HTTP layer: method, route template, status, request id (sent or generated).
    let http = |request_id: &str| {
        spans
            .iter()
            .find(|s| s.attr("http.route").is_some() && s.attr("request_id") == Some(request_id))
            .unwrap_or_else(|| panic!("no HTTP span of {request_id}: {spans:#?}"))
    };
    let create = http("otlp-create-1");
    assert_eq!(create.name, "POST /v1/machines/{machine}/entities");
    assert_eq!(create.attr("http.route"), Some("/v1/machines/{machine}/entities"));
    assert_eq!(create.attr("http.request.method"), Some("POST"));
    assert_eq!(create.attr("http.response.status_code"), Some("201"));
    assert_eq!(create.kind, SpanKind::Server as i32);
    assert!(create.attr("latency_ms").is_some(), "{create:?}");
    let open = http("otlp-open-1");
    assert_eq!(open.name, "POST /v1/machines/{machine}/entities/{key}/events/{event}");
    assert_eq!(open.attr("http.route"), Some("/v1/machines/{machine}/entities/{key}/events/{event}"));
    assert_eq!(open.attr("url.path"), Some("/v1/machines/door/entities/d1/events/open"));
    assert_eq!(open.attr("http.response.status_code"), Some("200"));
    assert_eq!(http(&generated).attr("http.response.status_code"), Some("202"));

    // The engine's operation span runs inside the request's span: one trace.
    let operation = spans
        .iter()
        .find(|s| s.name == "operation" && s.attr("request_id") == Some("otlp-open-1"))
        .unwrap_or_else(|| panic!("no operation span: {spans:#?}"));
    assert_eq!(operation.trace_id, open.trace_id);
    assert_eq!(operation.parent_span_id, open.span_id);

    // The store: a commit span per batch, listing the request ids it wrote.
    let commits_of = |request_id: &str| {
        spans
            .iter()
            .filter(|s| {
                s.name == "store.commit"
                    && s.attr("request_ids").is_some_and(|ids| ids.split(',').any(|id| id == request_id))
            })
            .collect::<Vec<_>>()
    };
    for request_id in ["otlp-create-1", "otlp-open-1", generated.as_str()] {
        let commits = commits_of(request_id);
        assert!(!commits.is_empty(), "no store.commit span of {request_id}: {spans:#?}");
        for c in commits {
            assert_eq!(c.attr("backend"), Some("sqlite"), "{c:?}");
            assert!(c.attr("ops").is_some_and(|n| n.parse::<u64>().unwrap() >= 1), "{c:?}");
            assert!(c.attr("error").is_none(), "{c:?}");
        }
    }
    // The raise's entity commit (the transition to `open`) is among them.
    assert!(commits_of("otlp-open-1").iter().any(|c| c.attr("commits").is_some_and(|n| n != "0")), "{spans:#?}");
}
