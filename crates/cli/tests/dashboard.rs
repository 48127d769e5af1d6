//! The dashboard in a real headless Chromium (Debian's `chromium`, driven over the
//! DevTools pipe by [`common::browser`]), against the real `settle serve` binary with
//! tokens: an operator signs in, sees the API's counts, finds the parked entity, opens it
//! (diagram with the lit state, timeline), resumes it and the API reports it active; a
//! reader finds no buttons; a bad token gets a clear message. Every page is checked for
//! console errors, horizontal scrolling at 1280×800 and keyboard reachability. And on a
//! server without tokens, a page of another origin tries every route that changes
//! something, as simple requests, a preflighted one and a form, and a name rebound to the
//! server's address: nothing changes, and the dashboard still works from its own origin.
//!
//! Screenshots land in `target/screenshots/`; with `SETTLE_UPDATE_SCREENSHOTS=1` also in
//! `docs/screenshots/` (the README's). Without Chromium the test says it skipped (and fails
//! when `SETTLE_REQUIRE_CHROMIUM` is set, as `.ci/run` does).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::browser::{Browser, skip_reason};
use common::testkit::{DOOR, PART, SITE, VM};
use serde_json::{Value, json};

const TOKENS: &str =
    "admin=admin-token-00001;operator=operator-token-01;reader=reader-token-0001;agent:cloud=agent-token-00001";

/// `settle serve` with tokens on a free port; killed when dropped.
struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        Server::start_with(Some(TOKENS))
    }

    /// `settle serve` with `tokens` (`SETTLE_TOKENS`), or none: every caller an admin.
    fn start_with(tokens: Option<&str>) -> Server {
        Server::start_machines(
            tokens,
            &[("door.toml", DOOR), ("vm.toml", VM), ("site.toml", SITE), ("part.toml", PART)],
        )
    }

    /// `settle serve` with `tokens` and the machines `files` (name, TOML).
    fn start_machines(tokens: Option<&str>, files: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let machines = common::write_machines(dir.path(), files);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_settle"));
        cmd.arg("--db")
            .arg(dir.path().join("settle.db"))
            .args(["serve", "--listen", "127.0.0.1:0", "--machines"])
            .arg(&machines)
            .env("SETTLE_LOG", "error")
            .env_remove("SETTLE_TOKENS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(tokens) = tokens {
            cmd.env("SETTLE_TOKENS", tokens);
        }
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
        let (status, v) = self.call("GET", path, "admin-token-00001", None);
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
        let (st, v) = s.call(
            "POST",
            "/v1/machines/door/entities",
            "operator-token-01",
            Some(json!({"key": format!("door-{i}")})),
        );
        assert_eq!(st, 201, "{v}");
    }
    for i in 1..=4 {
        let (st, v) =
            s.call("POST", "/v1/machines/vm/entities", "operator-token-01", Some(json!({"key": format!("vm-{i}")})));
        assert_eq!(st, 201, "{v}");
        let (st, v) =
            s.call("POST", &format!("/v1/machines/vm/entities/vm-{i}/events/create"), "operator-token-01", None);
        assert_eq!(st, 202, "{v}");
    }
    let mut tasks = Vec::new();
    eventually("four provisioning tasks", || {
        let (st, v) = s.call(
            "POST",
            "/v1/queues/cloud/lease",
            "agent-token-00001",
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
        let (st, v) = s.call("POST", &path, "agent-token-00001", Some(body));
        assert_eq!(st, 202, "{v}");
    }
    eventually("vm-4 parked and the others ready", || {
        let failed = s.get("/v1/entities?status=failed");
        let ready = s.get("/v1/entities?machine=vm&state=ready");
        failed["items"].as_array().unwrap().len() == 1 && ready["items"].as_array().unwrap().len() == 3
    });
    // A site whose network part fails: the agent says why, and the site fails by it.
    let (st, v) = s.call("POST", "/v1/machines/site/entities", "operator-token-01", Some(json!({"key": "s-1"})));
    assert_eq!(st, 201, "{v}");
    let (st, v) = s.call("POST", "/v1/machines/site/entities/s-1/events/build", "operator-token-01", None);
    assert_eq!(st, 202, "{v}");
    let mut tasks = Vec::new();
    eventually("the parts' tasks", || {
        let body = json!({"agent": "browser-test", "max": 2, "wait_ms": 1000});
        let (st, v) = s.call("POST", "/v1/queues/cloud/lease", "agent-token-00001", Some(body));
        assert_eq!(st, 200, "{v}");
        tasks.extend(v["tasks"].as_array().unwrap().iter().cloned());
        tasks.len() == 2
    });
    for t in &tasks {
        let (id, token) = (t["id"].as_i64().unwrap(), t["token"].as_str().unwrap());
        let body = if t["key"] == "s-1-net" {
            json!({"token": token, "target": "broken", "error": "no capacity for a network in zone c"})
        } else {
            json!({"token": token, "target": "up"})
        };
        let (st, v) = s.call("POST", &format!("/v1/tasks/{id}/complete"), "agent-token-00001", Some(body));
        assert_eq!(st, 202, "{v}");
    }
    eventually("the site failed", || s.get("/v1/machines/site/entities/s-1")["state"] == "failed");
}

/// `n` more vms parked: created, their provisioning tasks failed for good by the agent
/// (any other task it leases meanwhile is completed).
fn park(s: &Server, n: usize) {
    for i in 0..n {
        let key = format!("park-{i:02}");
        let (st, v) = s.call("POST", "/v1/machines/vm/entities", "operator-token-01", Some(json!({"key": key})));
        assert_eq!(st, 201, "{v}");
        let (st, v) =
            s.call("POST", &format!("/v1/machines/vm/entities/{key}/events/create"), "operator-token-01", None);
        assert_eq!(st, 202, "{v}");
    }
    let mut failed = 0;
    eventually("the parked vms' tasks", || {
        let body = json!({"agent": "browser-test", "max": 100, "wait_ms": 1000});
        let (st, v) = s.call("POST", "/v1/queues/cloud/lease", "agent-token-00001", Some(body));
        assert_eq!(st, 200, "{v}");
        for t in v["tasks"].as_array().unwrap() {
            let (id, token) = (t["id"].as_i64().unwrap(), t["token"].as_str().unwrap());
            let key = t["key"].as_str().unwrap();
            let (path, body) = if let Some(i) = key.strip_prefix("park-") {
                failed += 1;
                // One in four: another error, which groups apart.
                let i: u32 = i.parse().unwrap();
                let error = if i % 4 == 3 { format!("disk full on host {i}") } else { "no quota in zone d".into() };
                (format!("/v1/tasks/{id}/fail"), json!({"token": token, "error": error, "retryable": false}))
            } else {
                (format!("/v1/tasks/{id}/complete"), json!({"token": token, "target": "ready"}))
            };
            let (st, v) = s.call("POST", &path, "agent-token-00001", Some(body));
            assert_eq!(st, 202, "{v}");
        }
        failed == n
    });
    eventually("the vms parked", || {
        let v = s.get("/v1/entities?status=failed&machine=vm&limit=1000");
        v["items"].as_array().unwrap().len() == n
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
    signed_out_shows_only_the_sign_in(b);
    b.type_into("#token", token).unwrap();
    b.click("#signin-form button[type=submit]").unwrap();
}

fn sign_out(b: &Browser) {
    b.click("#signout").unwrap();
    b.wait_for("!document.querySelector('#signin').hidden", WAIT).unwrap();
    signed_out_shows_only_the_sign_in(b);
}

/// Signed out, the page shows the sign-in form alone: no navigation, no "Sign out".
fn signed_out_shows_only_the_sign_in(b: &Browser) {
    for id in ["nav", "who", "main"] {
        let shown = b.eval(&format!("getComputedStyle(document.querySelector('#{id}')).display !== 'none'")).unwrap();
        assert_eq!(shown, json!(false), "#{id} is hidden on the sign-in page");
    }
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
    // A part of the page drawn again meanwhile (a live update) can send the focus back to
    // the top: keep pressing until every control was reached, three rounds at most.
    let missed = || {
        b.eval("[...document.querySelectorAll('[data-control]')].filter(e => !window.__seen.has(e.dataset.control)).map(e => e.outerHTML.slice(0, 80))")
            .unwrap()
    };
    for _ in 0..3 * controls + 5 {
        b.press_key("Tab").unwrap();
        let seen = b
            .eval("document.activeElement?.dataset?.control && window.__seen.add(document.activeElement.dataset.control); window.__seen.size")
            .unwrap();
        if seen.as_u64() >= Some(controls) && missed() == json!([]) {
            break;
        }
    }
    let missed = missed();
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
    sign_in(&b, &s, "operator-token-01");
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
    // Live by the change feed, and calm: a change of the entity arrives by the feed (no
    // polling while it is up) and only what changed is drawn again — a new timeline row —
    // so text selected in a row that stayed is still selected.
    b.wait_for("feed.connected && app.timer === null", WAIT).unwrap();
    let selected = b
        .eval(
            "(() => { const cell = document.querySelector('#timeline-table tbody tr td:last-child');
               const r = document.createRange(); r.selectNodeContents(cell);
               const s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
               window.changesAt = feed.changes;
               window.rowsAt = document.querySelectorAll('#timeline-table tbody tr').length;
               return s.toString(); })()",
        )
        .unwrap();
    assert!(!selected.as_str().unwrap().is_empty());
    let (status, v) =
        s.call("POST", "/v1/machines/vm/entities/vm-4/pause?reason=look%20first", "operator-token-01", None);
    assert!((200..300).contains(&status), "{v}");
    b.wait_for("document.querySelector('[data-field=run_status]').textContent.includes('paused')", WAIT).unwrap();
    b.wait_for("document.querySelectorAll('#timeline-table tbody tr').length > window.rowsAt", WAIT).unwrap();
    assert_eq!(b.eval("feed.changes > window.changesAt && app.timer === null").unwrap(), json!(true), "by the feed");
    assert_eq!(b.eval("window.getSelection().toString()").unwrap(), selected, "the selection survived the update");
    screenshot(&b, "entity.png");
    page_is_clean(&b, "entity");
    every_control_reachable_by_keyboard(&b, "entity");

    // Resume, confirmed in the dialog: the flash names the operation, the API says active.
    b.click("button[data-cmd=resume]").unwrap();
    b.wait_for("document.querySelector('#confirm').open", WAIT).unwrap();
    b.type_into("#cmd-reason", "quota raised in zone b").unwrap();
    b.click("#confirm-ok").unwrap();
    b.wait_for("document.querySelector('#flash').textContent.includes('operation ui-')", WAIT).unwrap();
    let op = b.eval("document.querySelector('#flash a').getAttribute('href')").unwrap();
    let rid = op.as_str().unwrap().trim_start_matches("#/operation/").to_string();
    assert_eq!(s.get("/v1/machines/vm/entities/vm-4")["run_status"], "active");
    assert_eq!(s.get(&format!("/v1/operations/{rid}"))["name"], "vm.resume");
    // The reason travelled with the command: in the operation and in the history.
    assert_eq!(s.get(&format!("/v1/operations/{rid}"))["dimensions"]["reason"], "quota raised in zone b");
    let history = s.get("/v1/machines/vm/entities/vm-4/history");
    let last = history.as_array().unwrap().iter().rev().find(|h| h["kind"] == "command").unwrap();
    assert_eq!(last["detail"], "resume: quota raised in zone b");
    b.wait_for("document.querySelector('[data-field=run_status]').textContent.includes('active')", WAIT).unwrap();

    // Only the commands that apply are offered: active and at rest, not resume or release.
    b.wait_for("document.querySelector('#not-offered')?.textContent.includes('resume (already active)')", WAIT)
        .unwrap();
    let offered =
        b.eval("[...document.querySelectorAll('#commands button[data-cmd]')].map(b => b.dataset.cmd)").unwrap();
    assert!(!offered.as_array().unwrap().contains(&json!("resume")), "{offered}");
    // Kill cannot be undone: its dialog opens with Cancel focused, and Cancel does nothing.
    b.click("button[data-cmd=kill]").unwrap();
    b.wait_for("document.querySelector('#confirm').open", WAIT).unwrap();
    assert_eq!(b.eval("document.activeElement.id").unwrap(), json!("confirm-cancel"));
    b.click("#confirm-cancel").unwrap();
    b.wait_for("!document.querySelector('#confirm').open", WAIT).unwrap();
    assert_eq!(s.get("/v1/machines/vm/entities/vm-4")["run_status"], "active", "a canceled kill changes nothing");

    // Times say their zone: "1970-01-01 00:00:00.000 +00:00" in the browser's zone.
    let t = b.eval("fmtTime(0)").unwrap();
    let t = t.as_str().unwrap_or_default();
    assert_eq!(t.len(), 30, "{t}");
    assert!(matches!(&t[24..25], "+" | "-") && &t[27..28] == ":", "{t}");

    // Failure first: the Failing card counts the failed site and its broken part and opens
    // their list; the site's page says why, down to the part and the agent's message; one
    // click opens the part, whose own page says the same.
    b.goto(&s.url("#/overview")).unwrap();
    b.wait_for("document.querySelector('[data-card=failing] .n')?.textContent === '2'", WAIT).unwrap();
    b.click("[data-card=failing]").unwrap();
    b.wait_for("document.querySelectorAll('#entities-table tbody tr[data-key]').length === 2", WAIT).unwrap();
    let keys = b.eval("[...document.querySelectorAll('#entities-table tbody tr[data-key]')].map(tr => tr.dataset.key)");
    assert_eq!(keys.unwrap(), json!(["s-1", "s-1-net"]));
    b.goto(&s.url("#/entity/site/s-1")).unwrap();
    b.wait_for("document.querySelector('#why-chain li[data-key=\"s-1-net\"]')", WAIT).unwrap();
    let why = b.eval("document.querySelector('#why-chain').textContent").unwrap();
    let why = why.as_str().unwrap();
    assert!(why.contains("`parts_failed` fired: part/s-1-net in `broken`"), "{why}");
    assert!(why.contains("no capacity for a network in zone c"), "{why}");
    // Of the two edges from `building` to `failed`, only the one that ran is lit.
    b.wait_for("document.querySelector('#diagram svg .state.lit[data-state=\"failed\"]')", WAIT).unwrap();
    let ran = b.eval("[...document.querySelectorAll('#diagram svg .edge.visited')].map(g => g.dataset.label)").unwrap();
    assert_eq!(ran, json!(["build", "parts_failed"]));
    screenshot(&b, "why.png");
    page_is_clean(&b, "why");
    b.click("#why-chain li[data-key=\"s-1-net\"] a").unwrap();
    b.wait_for("document.querySelector('[data-field=state]')?.textContent.includes('broken')", WAIT).unwrap();
    b.wait_for("document.querySelector('#why-chain')?.textContent.includes('no capacity for a network')", WAIT)
        .unwrap();

    // A page of something that is not there stops following; another page starts again.
    b.goto(&s.url("#/entity/vm/no-such-vm")).unwrap();
    b.wait_for(
        "app.timer === null && feed.ctrl === null && document.querySelector('#live').textContent.includes('not found')",
        WAIT,
    )
    .unwrap();
    b.goto(&s.url("#/entity/vm/vm-4")).unwrap();
    b.wait_for("feed.connected && document.querySelector('#live').textContent === 'live'", WAIT).unwrap();
    // (The missing entity's reads, and only those, failed.)
    let expected = b.take_console_errors();
    assert!(expected.iter().all(|e| e.contains("404") && e.contains("no-such-vm")), "{expected:?}");

    // A read that fails for another reason (a dropped connection) while the feed is up and
    // nothing changes: "offline" and the poll on, then `live` again by the poll, which stops.
    b.eval(
        r#"window.__fetch = window.fetch;
           window.fetch = (url, init) => {
             if (String(url).includes('/entities/vm-4') && !String(url).includes('/v1/feed')) {
               window.fetch = window.__fetch;
               return Promise.reject(new TypeError('dropped on purpose'));
             }
             return window.__fetch(url, init);
           };
           tick();
           true"#,
    )
    .unwrap();
    b.wait_for("document.querySelector('#live').textContent === 'offline' && app.timer !== null", WAIT).unwrap();
    let live = "feed.connected && app.timer === null && document.querySelector('#live').textContent === 'live'";
    if let Err(e) = b.wait_for(live, WAIT) {
        let state = b.eval(
            "JSON.stringify({live: document.querySelector('#live').textContent, connected: feed.connected, \
             timer: app.timer !== null, busy: app.busy, changes: feed.changes})",
        );
        panic!("{e}\npage: {state:?}\nconsole: {:?}", b.console_errors());
    }
    b.take_console_errors();

    // The operation's page lists the entity it touched.
    b.click("#flash a").unwrap();
    b.wait_for("document.querySelector('#touched tr[data-key=\"vm-4\"]')", WAIT).unwrap();
    page_is_clean(&b, "operation");

    // Machines: the diagram and the TOML.
    b.goto(&s.url("#/machine/vm")).unwrap();
    b.wait_for("document.querySelector('#toml').textContent.includes('[actions.provision]')", WAIT).unwrap();
    b.wait_for("document.querySelector('#diagram svg .state[data-state=\"ready\"]')", WAIT).unwrap();
    // A heat map: each state with its entities; a state opens its list.
    let ready = s.get("/v1/entities?machine=vm&state=ready&total=true")["total"]["count"].as_u64().unwrap();
    b.wait_for(
        &format!(
            "document.querySelector('#diagram svg .state[data-state=\"ready\"] .heat')?.textContent === '{ready}'"
        ),
        WAIT,
    )
    .unwrap();
    page_is_clean(&b, "machine");
    // (An SVG group has no click(): the event a pointer sends.)
    b.eval("document.querySelector('#diagram svg .state[data-state=\"ready\"]').dispatchEvent(new MouseEvent('click', {bubbles: true}))")
        .unwrap();
    b.wait_for("location.hash === '#/entities?machine=vm&state=ready'", WAIT).unwrap();
    b.wait_for(&format!("document.querySelectorAll('#entities-table tbody tr[data-key]').length === {ready}"), WAIT)
        .unwrap();

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

    // Parked, past 50: a total, pages both ways, each row's last error; then every parked
    // vm resumed by one bulk operation whose dry-run count is what it changed.
    park(&s, 60);
    b.goto(&s.url("#/parked?status=failed&machine=vm")).unwrap();
    b.wait_for("document.querySelectorAll('#parked-table tbody tr[data-key]').length === 50", WAIT).unwrap();
    let total = b.eval("document.querySelector('#parked-total').textContent").unwrap();
    assert_eq!(total, json!("60 failed of machine vm · showing 1–50"));
    let row = b.eval("document.querySelector('#parked-table tbody tr[data-key]').textContent").unwrap();
    assert!(row.as_str().unwrap().contains("no quota in zone d"), "{row}");
    // Every parked vm's error grouped, not only this page's: 45 and 15 of 60.
    let groups = b
        .eval("[...document.querySelectorAll('#error-groups tbody tr')].map(r => [...r.cells].slice(0, 2).map(c => c.textContent))")
        .unwrap();
    let quota = "browser-test failed task # (attempt #): no quota in zone d";
    let disk = "browser-test failed task # (attempt #): disk full on host #";
    assert_eq!(groups, json!([[quota, "45"], [disk, "15"]]), "the groups across pages");
    screenshot(&b, "parked.png");
    b.click("#p-next").unwrap();
    b.wait_for("document.querySelectorAll('#parked-table tbody tr[data-key]').length === 10", WAIT).unwrap();
    b.wait_for("document.querySelector('#parked-total').textContent.endsWith('showing 51–60')", WAIT).unwrap();
    b.click("#p-prev").unwrap();
    b.wait_for("document.querySelectorAll('#parked-table tbody tr[data-key]').length === 50", WAIT).unwrap();
    page_is_clean(&b, "parked pages");
    // A group opens its entities; resuming them resumes those 15 only.
    b.click("#error-groups tbody tr:nth-child(2) a").unwrap();
    b.wait_for("document.querySelectorAll('#parked-table tbody tr[data-key]').length === 15", WAIT).unwrap();
    b.wait_for(
        "document.querySelector('#parked-total').textContent === '15 failed of machine vm · showing 15 here'",
        WAIT,
    )
    .unwrap();
    b.click("#bulk-resume").unwrap();
    b.wait_for("document.querySelector('#confirm').open", WAIT).unwrap();
    let count = b.eval("document.querySelector('#bulk-count').dataset.count").unwrap();
    assert_eq!(count, json!("15"), "the dry run's count");
    let filter = b.eval("document.querySelector('#bulk-count code').textContent").unwrap();
    assert_eq!(filter, json!(format!("status=failed machine=vm error={disk}")), "the filter echoed");
    b.type_into("#bulk-reason", "disks replaced").unwrap();
    b.click("#confirm-ok").unwrap();
    b.wait_for("document.querySelector('#bulk-status')?.textContent === 'done'", WAIT).unwrap();
    let bulk = &s.get("/v1/bulk")["items"][0];
    assert_eq!((bulk["done"].as_u64(), bulk["failed"].as_u64()), (Some(15), Some(0)), "{bulk}");
    let bulk = bulk.clone();
    assert_eq!(s.get("/v1/entities?status=failed&machine=vm&limit=1000")["items"].as_array().unwrap().len(), 45);
    // Then every parked vm left: the dry run's count is what it changed.
    b.click("#parked-error a").unwrap();
    b.wait_for(
        "document.querySelector('#parked-total').textContent === '45 failed of machine vm · showing 1–45'",
        WAIT,
    )
    .unwrap();
    b.click("#bulk-resume").unwrap();
    b.wait_for("document.querySelector('#confirm').open", WAIT).unwrap();
    let count = b.eval("document.querySelector('#bulk-count').dataset.count").unwrap();
    assert_eq!(count, json!("45"), "the dry run's count");
    let filter = b.eval("document.querySelector('#bulk-count code').textContent").unwrap();
    assert_eq!(filter, json!("status=failed machine=vm"), "the filter echoed");
    b.type_into("#bulk-reason", "quota raised in zone d").unwrap();
    b.click("#confirm-ok").unwrap();
    let first_bulk = bulk["request_id"].as_str().unwrap().to_string();
    b.wait_for(
        &format!(
            "document.querySelector('#bulk-id')?.textContent !== {} && document.querySelector('#bulk-status')?.textContent === 'done'",
            json!(first_bulk)
        ),
        WAIT,
    )
    .unwrap();
    let bulk = &s.get("/v1/bulk")["items"][0];
    assert_eq!((bulk["done"].as_u64(), bulk["failed"].as_u64()), (Some(45), Some(0)), "{bulk}");
    assert_eq!(bulk["reason"], "quota raised in zone d");
    assert_eq!(s.get("/v1/entities?status=failed&machine=vm")["items"], json!([]), "every parked vm resumed");
    b.wait_for("document.querySelectorAll('#parked-table tbody tr[data-key]').length === 0", WAIT).unwrap();
    // Operations: older pages and back; a request id opens its operation.
    let ops = s.get("/v1/operations?limit=100");
    assert!(ops["next"].is_string(), "more than 100 operations by now");
    b.goto(&s.url("#/operations")).unwrap();
    b.wait_for("document.querySelectorAll('#ops-table tbody tr[data-request]').length === 100", WAIT).unwrap();
    let first = b.eval("document.querySelector('#ops-table tbody tr[data-request]').dataset.request").unwrap();
    b.click("#o-next").unwrap();
    b.wait_for("location.hash.includes('before=')", WAIT).unwrap();
    b.wait_for(
        &format!("document.querySelector('#ops-table tbody tr[data-request]')?.dataset.request !== {first}"),
        WAIT,
    )
    .unwrap();
    b.click("#o-prev").unwrap();
    b.wait_for(
        &format!("document.querySelector('#ops-table tbody tr[data-request]')?.dataset.request === {first}"),
        WAIT,
    )
    .unwrap();
    page_is_clean(&b, "operations pages");
    b.type_into("#f-request", first.as_str().unwrap()).unwrap();
    b.click("#find button[type=submit]").unwrap();
    b.wait_for(&format!("location.hash === '#/operation/' + encodeURIComponent({first})"), WAIT).unwrap();
    // Entities: the total and pages both ways.
    let vms = s.get("/v1/entities?machine=vm&total=true")["total"]["count"].as_u64().unwrap();
    assert!(vms > 50, "{vms}");
    b.goto(&s.url("#/entities?machine=vm")).unwrap();
    b.wait_for(
        &format!("document.querySelector('#entities-total').textContent === '{vms} matching · showing 1–50'"),
        WAIT,
    )
    .unwrap();
    b.click("#next").unwrap();
    b.wait_for(&format!("document.querySelector('#entities-total').textContent.endsWith('showing 51–{vms}')"), WAIT)
        .unwrap();
    b.click("#prev").unwrap();
    b.wait_for("document.querySelector('#entities-total').textContent.endsWith('showing 1–50')", WAIT).unwrap();
    assert_eq!(b.eval("document.querySelector('#prev').disabled").unwrap(), json!(true));
    // Newest in its state first, as the API orders it.
    let newest = s.get("/v1/entities?machine=vm&sort=-entered&limit=3")["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].clone())
        .collect::<Vec<_>>();
    b.goto(&s.url("#/entities?machine=vm&sort=-entered")).unwrap();
    b.wait_for("document.querySelector('#f-sort').value === '-entered'", WAIT).unwrap();
    b.wait_for("document.querySelectorAll('#entities-table tbody tr[data-key]').length === 50", WAIT).unwrap();
    let shown = b
        .eval(
            "[...document.querySelectorAll('#entities-table tbody tr[data-key]')].slice(0, 3).map(r => r.dataset.key)",
        )
        .unwrap();
    assert_eq!(shown, json!(newest), "the newest in their state first");

    // A reader sees everything and no button.
    sign_out(&b);
    sign_in(&b, &s, "reader-token-0001");
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

/// A page of another origin (this test's own little HTTP server, on another port) that
/// sends every request of `targets` in every way a page can without the server's consent.
fn attack_page(settle: &str, targets: &[String]) -> String {
    let targets =
        serde_json::to_string(&targets.iter().map(|t| format!("http://{settle}{t}")).collect::<Vec<_>>()).unwrap();
    format!(
        r#"<!doctype html><html><body><iframe name="sink"></iframe><script>
const targets = {targets};
const form = () => {{ const f = new FormData(); f.append("a", "b"); return f; }};
const variants = [
  {{ mode: "no-cors" }},
  {{ mode: "no-cors", body: '{{"color": "red"}}', headers: {{ "Content-Type": "text/plain" }} }},
  {{ mode: "no-cors", body: new URLSearchParams({{ color: "red" }}) }},
  {{ mode: "no-cors", body: form() }},
  {{ mode: "no-cors", credentials: "include", body: "{{}}" }},
  {{ mode: "cors", body: "{{}}", headers: {{ "Content-Type": "application/json" }} }},
];
async function attack() {{
  const sent = [];
  for (const url of targets) {{
    for (const v of variants) {{
      try {{ const r = await fetch(url, {{ method: "POST", ...v }}); sent.push(`${{v.mode}}:${{r.type}}`); }}
      catch (e) {{ sent.push(`${{v.mode}}:error`); }}
    }}
  }}
  // Reading what the server holds, across origins.
  let read = "unread";
  try {{ read = await (await fetch("http://{settle}/v1/entities")).text(); }} catch (e) {{ read = "error"; }}
  // A form, the oldest cross-site request: posted into the frame.
  for (const url of targets.slice(0, 3)) {{
    const f = document.createElement("form");
    f.method = "POST"; f.action = url; f.enctype = "text/plain"; f.target = "sink";
    const i = document.createElement("input"); i.name = '{{"color": "'; i.value = 'red"}}'; f.appendChild(i);
    document.body.appendChild(f);
    // (A frame that never loads must not stall the page: at most 5 s each.)
    await new Promise((done) => {{ document.querySelector("iframe").onload = done; setTimeout(done, 5000); f.submit(); }});
  }}
  window.__attack = {{ sent, read }};
}}
attack();
</script></body></html>"#
    )
}

/// Serves `page` at `/` of a free port of 127.0.0.1 (another origin than any other port)
/// until the test ends; its address.
fn serve_page(page: String) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // The rest of the head.
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let (status, body) =
                if line.starts_with("GET / ") { ("200 OK", page.as_str()) } else { ("404 Not Found", "") };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// What a request could change, read from the API: every entity as it is and every operation.
fn state_of(s: &Server) -> (Value, Value) {
    (s.get("/v1/entities?limit=1000"), s.get("/v1/operations?limit=1000"))
}

/// The server's count of requests refused for `reason` (`settle_http_refused_total`).
fn refused(s: &Server, reason: &str) -> u64 {
    let (_, text) = common::http_text(&s.addr, "GET", "/metrics");
    let line = format!("settle_http_refused_total{{reason=\"{reason}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(line.as_str())).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn a_page_of_another_origin_cannot_change_a_tokenless_server() {
    if let Some(reason) = skip_reason() {
        assert!(std::env::var_os("SETTLE_REQUIRE_CHROMIUM").is_none(), "no Chromium: {reason}");
        eprintln!("skipped: the cross-site browser test needs Chromium ({reason})");
        return;
    }
    let s = Server::start_with(None);
    // What there is to attack: doors, a vm waiting for its agent (a task, id 1).
    for key in ["door-1", "door-2"] {
        let (st, v) = s.call("POST", "/v1/machines/door/entities", "", Some(json!({"key": key})));
        assert_eq!(st, 201, "{v}");
    }
    let (st, v) = s.call("POST", "/v1/machines/vm/entities", "", Some(json!({"key": "vm-1"})));
    assert_eq!(st, 201, "{v}");
    let (st, v) = s.call("POST", "/v1/machines/vm/entities/vm-1/events/create", "", None);
    assert_eq!(st, 202, "{v}");
    eventually("vm-1 provisioning", || s.get("/v1/machines/vm/entities/vm-1")["state"] == "provisioning");
    // Every route that can change something, as the API document lists them.
    let doc = s.get("/openapi.json");
    let mut targets = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if item.get("post").is_none() {
            continue;
        }
        for (machine, key, event) in [("door", "door-1", "open"), ("door", "door-2", "paint"), ("vm", "vm-1", "create")]
        {
            let t = path
                .replace("{machine}", machine)
                .replace("{key}", key)
                .replace("{event}", event)
                .replace("{queue}", "cloud")
                .replace("{id}", "1");
            if !targets.contains(&t) {
                targets.push(t);
            }
        }
    }
    targets.push("/v1/machines/door/entities/door-1/events/paint".into());
    assert!(targets.len() > 30, "{targets:?}");
    let before = state_of(&s);
    let attacker = serve_page(attack_page(&s.addr, &targets));

    let Some(b) = Browser::launch_with(&["--host-resolver-rules=MAP rebind.settle.test 127.0.0.1"]) else { return };
    b.goto(&format!("http://{attacker}/")).unwrap();
    let outcome = b.wait_for("window.__attack", Duration::from_secs(60)).unwrap();
    let sent = outcome["sent"].as_array().unwrap();
    assert_eq!(sent.len(), targets.len() * 6, "{outcome}");
    // The simple requests went out (opaque answers); the preflighted one never did.
    assert!(sent.iter().filter(|r| *r == "no-cors:opaque").count() == targets.len() * 5, "{outcome}");
    assert!(sent.iter().filter(|r| *r == "cors:error").count() == targets.len(), "{outcome}");
    assert_eq!(outcome["read"], "error", "the page read the server: {outcome}");
    // Nothing changed: every entity as it was, no operation opened; the server says why.
    assert_eq!(state_of(&s), before, "a page of another origin changed the server");
    let by_origin = refused(&s, "origin");
    assert!(by_origin >= (targets.len() * 6 + 3) as u64, "{by_origin} refused by origin");

    // DNS rebinding: the server's address under another name, as the browser sees it.
    let port = s.addr.rsplit(':').next().unwrap();
    b.goto(&format!("http://rebind.settle.test:{port}/ui/")).unwrap();
    b.wait_for("document.body && document.body.innerText.includes('host-not-allowed')", WAIT).unwrap();
    assert!(refused(&s, "host") >= 1, "the rebound name was answered");
    assert_eq!(state_of(&s), before);

    // The dashboard, from the server's own origin, still works: pause door-1.
    b.goto(&s.url("#/entity/door/door-1")).unwrap();
    b.wait_for("document.querySelector('button[data-cmd=pause]')", WAIT).unwrap();
    b.click("button[data-cmd=pause]").unwrap();
    b.wait_for("document.querySelector('#confirm').open", WAIT).unwrap();
    b.click("#confirm-ok").unwrap();
    b.wait_for("document.querySelector('#flash').textContent.includes('now paused')", WAIT).unwrap();
    assert_eq!(s.get("/v1/machines/door/entities/door-1")["run_status"], "paused");
}

/// A page of another origin that makes the browser send a costly `where` to a token-less
/// server, as an `<img>` and as a `fetch`, neither reads it nor brings it down: the
/// browser says the request comes from another site (`Sec-Fetch-Site`) and the server
/// refuses it before any work; it answers `/healthz` after, and nothing changed.
#[test]
fn a_page_of_another_origin_can_neither_read_nor_crash_a_tokenless_server() {
    if let Some(reason) = skip_reason() {
        assert!(std::env::var_os("SETTLE_REQUIRE_CHROMIUM").is_none(), "no Chromium: {reason}");
        eprintln!("skipped: the cross-site browser test needs Chromium ({reason})");
        return;
    }
    let s = Server::start_with(None);
    let (st, v) = s.call("POST", "/v1/machines/door/entities", "", Some(json!({"key": "door-1"})));
    assert_eq!(st, 201, "{v}");
    let before = state_of(&s);
    let settle = &s.addr;
    let page = format!(
        r#"<!doctype html><html><body><script>
const deep = "props" + ".a".repeat(5000) + " == 1";
const list = "[" + [...Array(40).keys()].join(",") + "]";
const costly = `${{list}}.all(a, ${{list}}.all(b, ${{list}}.all(c, a >= 0)))`;
const url = (w) => "http://{settle}/v1/entities?where=" + encodeURIComponent(w);
const image = (src) => new Promise((done) => {{
  const img = new Image(); img.onload = () => done("loaded"); img.onerror = () => done("error");
  setTimeout(() => done("timeout"), 5000); img.src = src;
}});
async function probe() {{
  const images = [await image(url(deep)), await image(url(costly)), await image("http://{settle}/metrics")];
  const fetched = [];
  for (const w of [deep, costly]) {{
    try {{ fetched.push((await fetch(url(w), {{ mode: "no-cors" }})).type); }} catch (e) {{ fetched.push("error"); }}
  }}
  let read = "unread";
  try {{ read = await (await fetch(url("true"))).text(); }} catch (e) {{ read = "error"; }}
  window.__probe = {{ images, fetched, read }};
}}
probe();
</script></body></html>"#
    );
    let attacker = serve_page(page);
    let Some(b) = Browser::launch() else { return };
    b.goto(&format!("http://{attacker}/")).unwrap();
    let outcome = b.wait_for("window.__probe", Duration::from_secs(60)).unwrap();
    assert_eq!(outcome["read"], "error", "the page read the server: {outcome}");
    assert_eq!(outcome["images"], json!(["error", "error", "error"]), "{outcome}");
    let (status, _) = common::http_text(&s.addr, "GET", "/healthz");
    assert_eq!(status, 200, "the server is up");
    assert!(refused(&s, "cross_site") >= 5, "{} refused as cross-site: {outcome}", refused(&s, "cross_site"));
    assert_eq!(state_of(&s), before, "a page of another origin changed the server");
    // The dashboard, from the server's own origin, still lists the entities.
    b.goto(&s.url("#/entities")).unwrap();
    b.wait_for("document.body.innerText.includes('door-1')", WAIT).unwrap();
}

/// `calls`: an agent's action, one at a time per region.
const LIMITED: &str = r#"initial = "idle"
properties = ["region"]
[states.idle]
[states.calling]
auto = "call"
[states.done]
[events.start]
in = ["idle"]
action = "begin"
[actions.begin]
to = ["calling"]
[actions.call]
agent = "cloud"
to = ["done"]
[limits.provider_calls]
states = ["calling"]
max = 1
key = "props.region"
"#;

/// An entity held by a limit says so on its page: the one holding the slot, the one
/// waiting for it with its place in line, as the API says it.
#[test]
fn an_entity_page_says_where_it_stands_with_its_limit() {
    if let Some(reason) = skip_reason() {
        assert!(std::env::var_os("SETTLE_REQUIRE_CHROMIUM").is_none(), "no Chromium: {reason}");
        eprintln!("skipped: the dashboard's browser test needs Chromium ({reason})");
        return;
    }
    let s = Server::start_machines(None, &[("job.toml", LIMITED)]);
    for k in ["c1", "c2"] {
        let (status, v) = s.call(
            "POST",
            "/v1/machines/job/entities",
            "admin-token-00001",
            Some(json!({"key": k, "properties": {"region": "eu"}})),
        );
        assert_eq!(status, 201, "{v}");
        let (status, v) = s.call(
            "POST",
            &format!("/v1/machines/job/entities/{k}/events/start"),
            "admin-token-00001",
            Some(json!({})),
        );
        assert_eq!(status, 202, "{v}");
    }
    eventually("one holds the slot and one waits", || s.get("/v1/limits")["items"][0]["waiting"] == 1);
    let Some(b) = Browser::launch() else { return };
    for k in ["c1", "c2"] {
        let says = s.get(&format!("/v1/machines/job/entities/{k}"))["limits"][0]["says"].as_str().unwrap().to_string();
        b.goto(&s.url(&format!("#/entity/job/{k}"))).unwrap();
        // The page says what the API says (the page of the entity before may still be up).
        let shows = format!("document.querySelector('[data-field=limit]')?.textContent === {}", json!(says));
        if let Err(e) = b.wait_for(&shows, WAIT) {
            let shown = b.eval("document.querySelector('#summary')?.textContent ?? null");
            panic!("{k}: the page never said {says:?} ({e}); it shows {shown:?}");
        }
        assert!(
            says.starts_with("holds a slot of `provider_calls`")
                || says == "waiting for `provider_calls` (key eu: 1 of 1 in use, 1st in line)",
            "{says}"
        );
        page_is_clean(&b, "entity");
    }
}
