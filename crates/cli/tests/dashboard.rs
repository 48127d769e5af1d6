//! The dashboard in a real headless Chromium (Debian's `chromium`, driven over the
//! DevTools pipe by [`common::browser`]), against the real `settle serve` binary with
//! tokens: an operator signs in, sees the API's counts, finds the parked entity, opens it
//! (diagram with the lit state, timeline), resumes it and the API reports it active; a
//! reader finds no buttons; a bad token gets a clear message. Every page is checked for
//! console errors, horizontal scrolling at 1280×800 and keyboard reachability.
//!
//! Screenshots land in `target/screenshots/`; with `SETTLE_UPDATE_SCREENSHOTS=1` also in
//! `docs/screenshots/` (the README's). Without Chromium the test says it skipped (and fails
//! when `SETTLE_REQUIRE_CHROMIUM` is set, as `.ci/run` does).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::browser::{Browser, skip_reason};
use common::testkit::{DOOR, VM};
use serde_json::{Value, json};

const TOKENS: &str = "admin=t-admin;operator=t-op;reader=t-read;agent:cloud=t-agent";

/// `settle serve` with tokens on a free port; killed when dropped.
struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let machines = common::write_machines(dir.path(), &[("door.toml", DOOR), ("vm.toml", VM)]);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_settle"));
        cmd.arg("--db")
            .arg(dir.path().join("settle.db"))
            .args(["serve", "--listen", "127.0.0.1:0", "--machines"])
            .arg(&machines)
            .env("SETTLE_LOG", "error")
            .env("SETTLE_TOKENS", TOKENS)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (child, addr) = common::spawn_serve_command(&mut cmd);
        Server { addr, child, _dir: dir }
    }

    /// One HTTP/1.1 request with `token`: the status and the JSON body (null if not JSON).
    fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let auth = format!("Bearer {token}");
        let body = body.map(|b| b.to_string());
        common::http_with(&self.addr, method, path, &[("Authorization", &auth)], body.as_deref())
    }

    fn get(&self, path: &str) -> Value {
        let (status, v) = self.call("GET", path, "t-admin", None);
        assert_eq!(status, 200, "GET {path}: {v}");
        v
    }

    fn url(&self, hash: &str) -> String {
        format!("http://{}/ui/{hash}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until `done` holds: the server's engine works in its own process.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The scenario: doors, and vms provisioned by an agent (this test, over HTTP): three
/// come up `ready`, one fails for good and is parked (`failed`).
fn scenario(s: &Server) {
    for i in 1..=3 {
        let (st, v) = s.call("POST", "/v1/machines/door/entities", "t-op", Some(json!({"key": format!("door-{i}")})));
        assert_eq!(st, 201, "{v}");
    }
    for i in 1..=4 {
        let (st, v) = s.call("POST", "/v1/machines/vm/entities", "t-op", Some(json!({"key": format!("vm-{i}")})));
        assert_eq!(st, 201, "{v}");
        let (st, v) = s.call("POST", &format!("/v1/machines/vm/entities/vm-{i}/events/create"), "t-op", None);
        assert_eq!(st, 202, "{v}");
    }
    let mut tasks = Vec::new();
    eventually("four provisioning tasks", || {
        let (st, v) = s.call(
            "POST",
            "/v1/queues/cloud/lease",
            "t-agent",
            Some(json!({"agent": "browser-test", "max": 4, "wait_ms": 1000})),
        );
        assert_eq!(st, 200, "{v}");
        tasks.extend(v["tasks"].as_array().unwrap().iter().cloned());
        tasks.len() == 4
    });
    for t in &tasks {
        let (id, token) = (t["id"].as_i64().unwrap(), t["token"].as_str().unwrap());
        let (path, body) = if t["key"] == "vm-4" {
            (
                format!("/v1/tasks/{id}/fail"),
                json!({"token": token, "error": "quota exceeded in zone b", "retryable": false}),
            )
        } else {
            (format!("/v1/tasks/{id}/complete"), json!({"token": token, "target": "ready"}))
        };
        let (st, v) = s.call("POST", &path, "t-agent", Some(body));
        assert_eq!(st, 202, "{v}");
    }
    eventually("vm-4 parked and the others ready", || {
        let failed = s.get("/v1/entities?status=failed");
        let ready = s.get("/v1/entities?machine=vm&state=ready");
        failed["items"].as_array().unwrap().len() == 1 && ready["items"].as_array().unwrap().len() == 3
    });
}

fn screenshot(b: &Browser, name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = root.join("target/screenshots");
    std::fs::create_dir_all(&out).unwrap();
    b.screenshot_png(&out.join(name)).unwrap();
    if std::env::var_os("SETTLE_UPDATE_SCREENSHOTS").is_some() {
        let docs: PathBuf = root.join("docs/screenshots");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::copy(out.join(name), docs.join(name)).unwrap();
    }
}

const WAIT: Duration = Duration::from_secs(15);

fn sign_in(b: &Browser, s: &Server, token: &str) {
    b.goto(&s.url("")).unwrap();
    b.wait_for("!document.querySelector('#signin').hidden", WAIT).unwrap();
    b.type_into("#token", token).unwrap();
    b.click("#signin-form button[type=submit]").unwrap();
}

fn sign_out(b: &Browser) {
    b.click("#signout").unwrap();
    b.wait_for("!document.querySelector('#signin').hidden", WAIT).unwrap();
}

/// Every visible control of the page is reached by pressing Tab from the top.
fn every_control_reachable_by_keyboard(b: &Browser, page: &str) {
    let controls = b
        .eval(
            "(() => { let n = 0; for (const el of document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')) {
                 const r = el.getBoundingClientRect(); const visible = r.width > 0 && r.height > 0 && !el.closest('[hidden], dialog:not([open])');
                 if (visible && !el.disabled && el.tabIndex >= 0) { el.dataset.control = ++n; } } return n; })()",
        )
        .unwrap()
        .as_u64()
        .unwrap();
    assert!(controls > 3, "{page}: only {controls} controls");
    b.eval("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); window.__seen = new Set(); true")
        .unwrap();
    for _ in 0..controls + 5 {
        b.press_key("Tab").unwrap();
        b.eval("document.activeElement?.dataset?.control && window.__seen.add(document.activeElement.dataset.control); true")
            .unwrap();
    }
    let missed = b
        .eval("[...document.querySelectorAll('[data-control]')].filter(e => !window.__seen.has(e.dataset.control)).map(e => e.outerHTML.slice(0, 80))")
        .unwrap();
    assert_eq!(missed, json!([]), "{page}: controls Tab never reaches");
}

fn page_is_clean(b: &Browser, page: &str) {
    assert!(b.scroll_width_fits().unwrap(), "{page} scrolls horizontally at 1280×800");
    assert_eq!(b.console_errors(), Vec::<String>::new(), "{page}: console errors");
}

#[test]
fn the_dashboard_in_a_browser() {
    if let Some(reason) = skip_reason() {
        // CI installs Chromium and sets this: there, a missing browser is a failure.
        assert!(std::env::var_os("SETTLE_REQUIRE_CHROMIUM").is_none(), "no Chromium: {reason}");
        eprintln!("skipped: the dashboard's browser test needs Chromium ({reason})");
        return;
    }
    let s = Server::start();
    scenario(&s);
    let Some(b) = Browser::launch() else { return };

    // An operator signs in; the overview shows the API's counts.
    sign_in(&b, &s, "t-op");
    b.wait_for("document.querySelectorAll('#counts-table tbody tr[data-machine]').length > 0", WAIT).unwrap();
    let api = s.get("/v1/overview");
    let mut want: Vec<(String, String, String, u64)> = api["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap().to_string();
            (text("machine"), text("state"), text("run_status"), c["count"].as_u64().unwrap())
        })
        .collect();
    want.sort();
    let shown = b
        .eval(
            "[...document.querySelectorAll('#counts-table tbody tr[data-machine]')].map(tr =>
               [tr.dataset.machine, tr.dataset.state, tr.dataset.status, Number(tr.cells[3].textContent)])",
        )
        .unwrap();
    let mut shown: Vec<(String, String, String, u64)> = serde_json::from_value(shown).unwrap();
    shown.sort();
    assert_eq!(shown, want, "the overview's table is the API's counts");
    let card = |name: &str| b.eval(&format!("document.querySelector('[data-card={name}] .n').textContent")).unwrap();
    assert_eq!(card("entities"), json!(api["entities"].to_string()));
    assert_eq!(card("parked"), json!("1"));
    assert_eq!(b.eval("document.querySelector('#role').textContent").unwrap(), json!("operator"));
    screenshot(&b, "overview.png");
    page_is_clean(&b, "overview");
    every_control_reachable_by_keyboard(&b, "overview");

    // Parked: vm-4 with its last error and its buttons; open it.
    b.click("nav a[data-page=parked]").unwrap();
    b.wait_for("document.querySelector('#parked-table tr[data-key=\"vm-4\"]')", WAIT).unwrap();
    let row = b.eval("document.querySelector('#parked-table tr[data-key=\"vm-4\"]').textContent").unwrap();
    assert!(row.as_str().unwrap().contains("quota exceeded in zone b"), "{row}");
    assert_eq!(b.eval("document.querySelectorAll('#parked-table button[data-cmd]').length").unwrap(), json!(2));
    page_is_clean(&b, "parked");
    every_control_reachable_by_keyboard(&b, "parked");
    b.click("#parked-table tr[data-key=\"vm-4\"] a").unwrap();

    // The entity: its state lit in the diagram, the path it took marked, the timeline.
    b.wait_for("document.querySelector('#diagram svg .state.lit[data-state=\"provisioning\"]')", WAIT).unwrap();
    b.wait_for("document.querySelectorAll('#timeline-table tbody tr').length >= 4", WAIT).unwrap();
    let visited =
        b.eval("[...document.querySelectorAll('#diagram svg .state.visited')].map(g => g.dataset.state)").unwrap();
    assert_eq!(visited, json!(["new", "provisioning"]), "the states of its history");
    let kinds =
        b.eval("[...document.querySelectorAll('#timeline-table tbody tr')].map(tr => tr.dataset.kind)").unwrap();
    for kind in ["create", "event", "fault", "error: agent_error"] {
        assert!(kinds.as_array().unwrap().contains(&json!(kind)), "timeline lacks {kind}: {kinds}");
    }
    assert!(
        b.eval("document.querySelector('#timeline-table a[href^=\"#/operation/\"]') !== null")
            .unwrap()
            .as_bool()
            .unwrap(),
        "request ids link to their operations"
    );
    b.wait_for("document.querySelector('[data-field=run_status]').textContent.includes('failed')", WAIT).unwrap();
    screenshot(&b, "entity.png");
    page_is_clean(&b, "entity");
    every_control_reachable_by_keyboard(&b, "entity");

    // Resume, confirmed in the dialog: the flash names the operation, the API says active.
    b.click("button[data-cmd=resume]").unwrap();
    b.wait_for("document.querySelector('#confirm').open", WAIT).unwrap();
    b.click("#confirm-ok").unwrap();
    b.wait_for("document.querySelector('#flash').textContent.includes('operation ui-')", WAIT).unwrap();
    let op = b.eval("document.querySelector('#flash a').getAttribute('href')").unwrap();
    let rid = op.as_str().unwrap().trim_start_matches("#/operation/").to_string();
    assert_eq!(s.get("/v1/machines/vm/entities/vm-4")["run_status"], "active");
    assert_eq!(s.get(&format!("/v1/operations/{rid}"))["name"], "vm.resume");
    b.wait_for("document.querySelector('[data-field=run_status]').textContent.includes('active')", WAIT).unwrap();

    // The operation's page lists the entity it touched.
    b.click("#flash a").unwrap();
    b.wait_for("document.querySelector('#touched tr[data-key=\"vm-4\"]')", WAIT).unwrap();
    page_is_clean(&b, "operation");

    // Machines: the diagram and the TOML.
    b.goto(&s.url("#/machine/vm")).unwrap();
    b.wait_for("document.querySelector('#toml').textContent.includes('[actions.provision]')", WAIT).unwrap();
    b.wait_for("document.querySelector('#diagram svg .state[data-state=\"ready\"]')", WAIT).unwrap();
    page_is_clean(&b, "machine");

    // Raise a permitted event with its declared parameters filled in, confirmed.
    b.goto(&s.url("#/entity/door/door-1")).unwrap();
    b.wait_for("[...document.querySelectorAll('#raise-event option')].some(o => o.value === 'paint')", WAIT).unwrap();
    b.eval("const e = document.querySelector('#raise-event'); e.value = 'paint'; e.dispatchEvent(new Event('change')); true")
        .unwrap();
    b.wait_for("document.querySelector('#raise-params').value.includes('\"color\"')", WAIT).unwrap();
    b.type_into("#raise-params", r#"{"color": "teal"}"#).unwrap();
    b.click("#raise button[type=submit]").unwrap();
    b.wait_for("document.querySelector('#confirm').open", WAIT).unwrap();
    b.click("#confirm-ok").unwrap();
    b.wait_for("document.querySelector('#flash').textContent.startsWith('Raised paint')", WAIT).unwrap();
    let op = b.eval("document.querySelector('#flash a').getAttribute('href')").unwrap();
    let rid = op.as_str().unwrap().trim_start_matches("#/operation/").to_string();
    eventually("the paint operation to end", || s.get(&format!("/v1/operations/{rid}"))["outcome"] == "success");
    page_is_clean(&b, "raise");

    // A reader sees everything and no button.
    sign_out(&b);
    sign_in(&b, &s, "t-read");
    b.wait_for("document.querySelector('#role').textContent === 'reader'", WAIT).unwrap();
    b.goto(&s.url("#/entity/vm/vm-1")).unwrap();
    b.wait_for("document.querySelector('#diagram svg .state.lit[data-state=\"ready\"]')", WAIT).unwrap();
    assert_eq!(b.eval("document.querySelectorAll('main button[data-cmd], #raise').length").unwrap(), json!(0));
    b.goto(&s.url("#/parked")).unwrap();
    b.wait_for("document.querySelector('#parked-table tbody tr')", WAIT).unwrap();
    assert_eq!(b.eval("document.querySelectorAll('main button[data-cmd]').length").unwrap(), json!(0));
    page_is_clean(&b, "reader pages");

    // A bad token: a clear message on the sign-in page, not a blank page.
    sign_out(&b);
    b.type_into("#token", "not-a-token").unwrap();
    b.click("#signin-form button[type=submit]").unwrap();
    b.wait_for("document.querySelector('#signin-error').textContent.includes('does not accept this token')", WAIT)
        .unwrap();
    let message = b.eval("document.querySelector('#signin-error').textContent").unwrap();
    assert!(message.as_str().unwrap().contains("unknown bearer token"), "{message}");
    page_is_clean(&b, "sign-in");
}
