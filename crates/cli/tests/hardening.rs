//! End to end: the listener of `settle serve` — slow clients are cut off by the header
//! timeout, a request outliving `--request-timeout` gets 503, HTTPS with
//! `--tls-cert`/`--tls-key`, the refusal to send bearer tokens over plain HTTP off
//! loopback, the per-token rate limit (`--rate-limit`: 429 with `Retry-After`), what a web
//! page can make a browser send (`Host`, `Origin`, simple requests; `--allowed-host`,
//! `--allowed-origin`) and tokens too short to be secret.

mod common;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::testkit::DOOR;
use common::write_machines;

/// `settle --db DIR/settle-N.db serve --machines DIR/machines ARGS...` (a database of its
/// own for each server: an engine locks its database), logging errors only.
fn serve_command(dir: &Path, args: &[&str]) -> Command {
    static DBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = DBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let machines = write_machines(dir, &[("door.toml", DOOR)]);
    let mut c = Command::new(env!("CARGO_BIN_EXE_settle"));
    c.arg("--db").arg(dir.join(format!("settle-{n}.db"))).arg("serve").arg("--machines").arg(machines).args(args);
    c.env("SETTLE_LOG", "error").env_remove("SETTLE_TOKENS");
    c
}

/// A started server: killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` and returns it with the URL it printed (`http://...` or `https://...`); a
/// server that did not start fails the test with its standard error.
fn start(cmd: &mut Command) -> (Running, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start settle serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let Some(url) = line.trim().strip_prefix("listening on ") else {
        let _ = child.kill();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        panic!("settle serve did not start: {line:?}\n{err}");
    };
    let url = url.to_string();
    (Running(child), url)
}

/// Reads until the server closes the connection (EOF or reset), at most `limit`: how long
/// it took. Fails the test if the connection is still open after `limit`.
fn wait_closed(s: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return started.elapsed(),
            // hyper may answer the stalled head before closing; keep reading to the end.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return started.elapsed(),
            Err(e) => panic!("connection still open after {:?}: {e}", started.elapsed()),
        }
        assert!(started.elapsed() < limit, "connection still open after {limit:?}");
    }
}

#[test]
fn slow_clients_are_cut_off_by_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = start(&mut serve_command(dir.path(), &["--listen", "127.0.0.1:0", "--header-timeout", "1s"]));
    let addr = url.strip_prefix("http://").unwrap();

    // Half a request head, then nothing.
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").as_bytes()).unwrap();
    // A connection that sends nothing at all.
    let mut silent = TcpStream::connect(addr).unwrap();

    // Meanwhile, an ordinary request on another connection is served.
    let (status, _) = common::http(addr, "GET", "/healthz", None);
    assert_eq!(status, 200);

    // Both stalled connections are closed by the server: after about the 1 s header
    // timeout; 15 s is a generous bound for a loaded machine.
    let took = wait_closed(&mut slow, Duration::from_secs(15));
    assert!(took < Duration::from_secs(15), "{took:?}");
    wait_closed(&mut silent, Duration::from_secs(15));

    // And the server still serves.
    let (status, _) = common::http(addr, "GET", "/healthz", None);
    assert_eq!(status, 200);
}

/// A self-signed certificate for `localhost` and `127.0.0.1`, written as `DIR/cert.pem`
/// and `DIR/key.pem`; its DER, to trust it.
fn self_signed(dir: &Path) -> rustls::pki_types::CertificateDer<'static> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    std::fs::write(dir.join("cert.pem"), ck.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), ck.signing_key.serialize_pem()).unwrap();
    ck.cert.der().clone()
}

/// `GET PATH` over TLS to `addr`, trusting only `root`: the raw response.
fn https_get(addr: &str, root: &rustls::pki_types::CertificateDer<'static>, path: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // A peer that closes without close_notify; what arrived is still the response.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => panic!("HTTPS GET {path}: {e}"),
    }
    String::from_utf8_lossy(&raw).into_owned()
}

#[test]
fn tls_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let root = self_signed(dir.path());
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let mut cmd = serve_command(dir.path(), &["--listen", "127.0.0.1:0"]);
    cmd.arg("--tls-cert").arg(&cert).arg("--tls-key").arg(&key);
    let (_server, url) = start(&mut cmd);
    let addr = url.strip_prefix("https://").unwrap_or_else(|| panic!("not an https URL: {url}"));

    let response = https_get(addr, &root, "/healthz");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    // Plain HTTP to the TLS port gets no HTTP response.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    plain.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = plain.read_to_end(&mut raw);
    assert!(!raw.starts_with(b"HTTP/"), "{}", String::from_utf8_lossy(&raw));

    // The server still speaks TLS afterwards.
    assert!(https_get(addr, &root, "/healthz").starts_with("HTTP/1.1 200"));
}

#[test]
fn tokens_off_loopback_need_tls_or_insecure_http() {
    let dir = tempfile::tempdir().unwrap();
    let root = self_signed(dir.path());
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let tokens = [("SETTLE_TOKENS", "admin=hardening-secret")];

    // Tokens, a non-loopback address, plain HTTP: refused.
    let out = serve_command(dir.path(), &["--listen", "0.0.0.0:0"]).envs(tokens).output().unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bearer tokens would cross the network in clear text"), "{err}");
    assert!(err.contains("--insecure-http") && err.contains("--tls-cert"), "{err}");

    // With --insecure-http it starts, over plain HTTP.
    let mut cmd = serve_command(dir.path(), &["--listen", "0.0.0.0:0", "--insecure-http"]);
    let (server, url) = start(cmd.envs(tokens));
    assert!(url.starts_with("http://"), "{url}");
    drop(server);

    // With TLS it starts, over HTTPS, and serves.
    let mut cmd = serve_command(dir.path(), &["--listen", "0.0.0.0:0"]);
    cmd.arg("--tls-cert").arg(&cert).arg("--tls-key").arg(&key).envs(tokens);
    let (_server, url) = start(&mut cmd);
    let port = url.strip_prefix("https://0.0.0.0:").unwrap_or_else(|| panic!("{url}"));
    let response = https_get(&format!("127.0.0.1:{port}"), &root, "/healthz");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    // Loopback stays allowed over plain HTTP with tokens.
    let (_local, url) = start(serve_command(dir.path(), &["--listen", "127.0.0.1:0"]).envs(tokens));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
}

#[test]
fn bad_tls_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    self_signed(dir.path());
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let cases: [(&Path, &Path, &str); 4] = [
        (&missing, &key, "--tls-cert"),
        (&junk, &key, "--tls-cert"),
        (&cert, &junk, "--tls-key"),
        (&cert, &cert, "--tls-key"),
    ];
    for (c, k, flag) in cases {
        let mut cmd = serve_command(dir.path(), &["--listen", "127.0.0.1:0"]);
        let out = cmd.arg("--tls-cert").arg(c).arg("--tls-key").arg(k).output().unwrap();
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        let named = if flag == "--tls-cert" { c } else { k };
        assert!(err.contains(&format!("{flag} {}", named.display())), "{flag} {}: {err}", named.display());
    }

    // A certificate needs its key.
    let mut cmd = serve_command(dir.path(), &["--listen", "127.0.0.1:0"]);
    let out = cmd.arg("--tls-cert").arg(&cert).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("--tls-key"), "{}", common::stderr(&out));
}

/// Sends one plain HTTP/1.1 request (`Connection: close`) to `url` (`http://HOST:PORT`);
/// the response's status line with its headers, and its body.
fn http(url: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (String, String) {
    let addr = url.strip_prefix("http://").unwrap_or(url);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.to_string(), body.to_string())
}

#[test]
fn the_rate_limit_answers_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = serve_command(dir.path(), &["--listen", "127.0.0.1:0", "--rate-limit", "3"]);
    let (_server, url) = start(cmd.env("SETTLE_TOKENS", "admin=limited-secret-token"));
    // A burst of 3, refilled at 3 a second: ten requests at once exceed it.
    let heads: Vec<(String, String)> =
        (0..10).map(|_| http(&url, "GET", "/v1/machines", Some("limited-secret-token"), "")).collect();
    let limited: Vec<&(String, String)> = heads.iter().filter(|(h, _)| h.starts_with("HTTP/1.1 429")).collect();
    assert!(heads[0].0.starts_with("HTTP/1.1 200"), "{:?}", heads[0]);
    assert!(!limited.is_empty(), "no 429 in {heads:?}");
    let (head, body) = limited[0];
    let retry = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after: ").map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no Retry-After: {head}"));
    assert!(retry.parse::<u64>().is_ok_and(|s| s >= 1), "Retry-After: {retry}");
    let problem: serde_json::Value = serde_json::from_str(body).unwrap();
    assert!(problem["type"].as_str().is_some_and(|t| t.ends_with("rate-limited")), "{problem}");
    // Health checks are never limited.
    for _ in 0..10 {
        let (head, _) = http(&url, "GET", "/healthz", None, "");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    // (The bucket's refill is tested on a manual clock in `server/src/ratelimit.rs`.)
}

#[test]
fn a_request_longer_than_the_request_timeout_gets_503() {
    let dir = tempfile::tempdir().unwrap();
    // The scenario's agent queue `provider`, empty: a lease that waits 10 s for a task
    // outlives a 1 s request timeout.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_settle"));
    cmd.arg("--db").arg(dir.path().join("timeout.db")).args([
        "serve",
        "--scenario",
        "--listen",
        "127.0.0.1:0",
        "--request-timeout",
        "1s",
    ]);
    cmd.env("SETTLE_LOG", "error").env_remove("SETTLE_TOKENS");
    let (_server, url) = start(&mut cmd);
    let (head, body) = http(&url, "POST", "/v1/queues/provider/lease", None, r#"{"agent":"slow","wait_ms":10000}"#);
    assert!(head.starts_with("HTTP/1.1 503"), "{head}\n{body}");
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(problem["type"].as_str().is_some_and(|t| t.ends_with("request-timeout")), "{problem}");
    // A quick request on the same server is answered as usual.
    let (head, _) = http(&url, "GET", "/healthz", None, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// Sends `head` (a request head without its final blank line) and an empty body to
/// `url`; the response's status line with its headers.
fn raw(url: &str, head: &str) -> String {
    let addr = url.strip_prefix("http://").unwrap_or(url);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("{head}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn hosts_origins_and_simple_requests_are_checked_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = start(&mut serve_command(dir.path(), &["--listen", "127.0.0.1:0"]));
    let addr = url.strip_prefix("http://").unwrap();
    let (head, _) = http(&url, "POST", "/v1/machines/door/entities", None, r#"{"key":"d"}"#);
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    // DNS rebinding: a name that is not the server's, whatever it resolved to.
    let rebound = raw(&url, "GET /v1/entities HTTP/1.1\r\nHost: rebind.evil.example");
    assert!(rebound.starts_with("HTTP/1.1 403") && rebound.contains("host-not-allowed"), "{rebound}");
    let own = raw(&url, &format!("GET /v1/entities HTTP/1.1\r\nHost: localhost:{}", addr.split(':').nth(1).unwrap()));
    assert!(own.starts_with("HTTP/1.1 200"), "{own}");
    // A simple cross-site request: no JSON, no token; then with a foreign `Origin`.
    let kill = format!("POST /v1/machines/door/entities/d/kill HTTP/1.1\r\nHost: {addr}");
    let simple = raw(&url, &format!("{kill}\r\nContent-Type: text/plain"));
    assert!(simple.starts_with("HTTP/1.1 415") && simple.contains("unsupported-media-type"), "{simple}");
    let foreign = raw(&url, &format!("{kill}\r\nContent-Type: application/json\r\nOrigin: http://evil.example"));
    assert!(foreign.starts_with("HTTP/1.1 403") && foreign.contains("origin-not-allowed"), "{foreign}");
    let (head, body) = http(&url, "GET", "/v1/machines/door/entities/d", None, "");
    assert!(head.starts_with("HTTP/1.1 200") && body.contains("\"run_status\":\"active\""), "{body}");
    // Its own page's request goes through.
    let mine = raw(&url, &format!("{kill}\r\nContent-Type: application/json\r\nOrigin: http://{addr}"));
    assert!(mine.starts_with("HTTP/1.1 200") && mine.contains("\"killed\""), "{mine}");
    let (_, metrics) = http(&url, "GET", "/metrics", None, "");
    for reason in ["host", "simple_request", "origin"] {
        assert!(metrics.contains(&format!("settle_http_refused_total{{reason=\"{reason}\"}} 1\n")), "{metrics}");
    }

    // A host and an origin the operator allows.
    let args = ["--listen", "127.0.0.1:0", "--allowed-host", "settle.test", "--allowed-origin", "https://settle.test"];
    let (_allowing, url) = start(&mut serve_command(dir.path(), &args));
    let head = "POST /v1/machines/door/entities HTTP/1.1\r\nHost: settle.test\r\nOrigin: https://settle.test\r\n\
                Content-Type: application/json";
    let answer = raw(&url, head);
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("malformed-json"), "the handler answered: {answer}");
    assert!(raw(&url, "GET /healthz HTTP/1.1\r\nHost: other.test").starts_with("HTTP/1.1 403"));

    // `*` needs tokens; a bad value is named.
    for (flag, value, message) in [
        ("--allowed-host", "*", "--allowed-host '*' needs tokens"),
        ("--allowed-origin", "*", "--allowed-origin '*' needs tokens"),
        ("--allowed-origin", "settle.test", "--allowed-origin: `settle.test` is not an origin"),
        ("--allowed-host", "http://settle.test", "--allowed-host: `http://settle.test` is not a host name"),
    ] {
        let out = serve_command(dir.path(), &["--listen", "127.0.0.1:0", flag, value]).output().unwrap();
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(message), "{flag} {value}: {err}");
    }
    let mut cmd = serve_command(dir.path(), &["--listen", "127.0.0.1:0", "--allowed-host", "*"]);
    let (_any, url) = start(cmd.env("SETTLE_TOKENS", "admin=hardening-secret"));
    let any = raw(&url, "GET /v1/entities HTTP/1.1\r\nHost: any.example\r\nAuthorization: Bearer hardening-secret");
    assert!(any.starts_with("HTTP/1.1 200"), "{any}");
}

#[test]
fn tokens_too_short_to_be_secret_are_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = serve_command(dir.path(), &["--listen", "127.0.0.1:0"])
        .env("SETTLE_TOKENS", "reader=long-enough-reader;admin=s3cret")
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("SETTLE_TOKENS entry 2: a token must be at least 16 characters, not 6"), "{err}");
    let file = dir.path().join("tokens.toml");
    std::fs::write(&file, "[[token]]\ntoken = \"0123456789abcde\"\nrole = \"admin\"\n").unwrap();
    let out =
        serve_command(dir.path(), &["--listen", "127.0.0.1:0", "--tokens", file.to_str().unwrap()]).output().unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("token #1: a token must be at least 16 characters, not 15"), "{err}");
    assert!(!err.contains("0123456789abcde"), "the token is not shown: {err}");
}

#[test]
fn repeated_unknown_tokens_from_one_address_are_slowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = serve_command(dir.path(), &["--listen", "127.0.0.1:0", "--auth-failures", "2"]);
    let (_server, url) = start(cmd.env("SETTLE_TOKENS", "admin=hardening-secret"));
    for guess in ["guess-0000000001", "guess-0000000002"] {
        let (head, _) = http(&url, "GET", "/v1/machines", Some(guess), "");
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    }
    // Out of failures (2 a minute): the right token too is refused, for half a minute.
    let (head, body) = http(&url, "GET", "/v1/machines", Some("hardening-secret"), "");
    assert!(head.starts_with("HTTP/1.1 429") && body.contains("auth-throttled"), "{head}\n{body}");
    assert!(head.to_ascii_lowercase().contains("retry-after: 30"), "{head}");
    // A request without a token is no guess.
    let (head, _) = http(&url, "GET", "/healthz", None, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}
