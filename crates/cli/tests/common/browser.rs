//! A small Chrome DevTools Protocol (CDP) driver for browser tests, with no crate beyond
//! `serde_json`, `tempfile` and `libc`: Chromium is spoken to over a pair of pipes, not a
//! WebSocket.
//!
//! # The pipe
//!
//! Started with `--remote-debugging-pipe`, Chromium reads CDP commands from its file
//! descriptor 3 and writes responses and events to its file descriptor 4. Every message is
//! one JSON object followed by a NUL byte (`\0`). [`Browser::launch`] makes two pipes with
//! [`std::io::pipe`] (both ends close-on-exec) and, in the child between `fork` and `exec`
//! (`pre_exec`), duplicates the child's ends onto 3 and 4 with `dup2`, which clears the
//! close-on-exec flag on the copies: the originals vanish at `exec`, 3 and 4 survive. The
//! ends are first moved above 10 so that one never overwrites the other when the parent
//! happened to have them on 3 or 4. The parent closes its copies of the child's ends right
//! after the spawn, so when Chromium exits the reader sees end-of-file at once.
//!
//! A reader thread splits the stream at NUL bytes: responses (with an `id`) go to the caller
//! waiting for that id, everything else is an event, kept in a bounded buffer (for
//! [`Browser::goto`]'s wait for `Page.loadEventFired`) and, for console errors, uncaught
//! exceptions and error log entries, in a list kept from launch ([`Browser::console_errors`]).
//! With `Target.attachToTarget {flatten: true}` the one page is a *session* on the same pipe:
//! its messages carry a `sessionId`.
//!
//! # The flags
//!
//! - `--headless=new`: the full browser without a window (the old headless mode is gone).
//! - `--remote-debugging-pipe`: CDP on fds 3/4 as above; no port, nothing to collide with.
//! - `--no-sandbox`: tests often run as root in containers, where the sandbox cannot start.
//! - `--disable-gpu`, `--disable-dev-shm-usage`: no GPU here, and a small `/dev/shm` in
//!   containers makes renderers crash.
//! - `--disable-quic`, `--disable-background-networking`, `--disable-component-update`,
//!   `--disable-sync`, `--disable-extensions`, `--no-first-run`, `--no-default-browser-check`:
//!   no traffic or UI of the browser's own, which would be slow, flaky or noisy offline.
//! - `--mute-audio`, `--hide-scrollbars=false` (scrollbars take room as for a user),
//!   `--window-size=1280,800` (plus the same size by `Emulation.setDeviceMetricsOverride`).
//! - `--user-data-dir=<temporary directory>`: a fresh profile, removed on drop.
//!
//! Chromium is found through `SETTLE_CHROMIUM`, else `/usr/bin/chromium`, else `chromium`,
//! `chromium-browser` or `google-chrome` on `PATH`; without one, [`Browser::launch`] returns
//! `None` and [`skip_reason`] says why, for the test to print `skipped: ...`.
//!
//! Its standard error (which is noisy) is read by a thread that keeps the last lines (less
//! the D-Bus complaints) for the error messages of a failed launch or a dead browser.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader, PipeWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long a CDP command (and a page load) may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// How long each command that opens the first page may take: a cold Chromium on a loaded
/// host can take far longer to answer its first command than any later one.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How many times a browser is started before [`Browser::try_launch`] gives up: a start
/// that stalls is killed and tried once more with a fresh profile.
pub const START_ATTEMPTS: u32 = 2;

/// Held while a browser starts: tests of one binary run in parallel, and Chromiums
/// starting side by side on two cores each take longer than both in turn.
static STARTING: Mutex<()> = Mutex::new(());

/// The viewport of the page, in CSS pixels.
pub const VIEWPORT: (u32, u32) = (1280, 800);

/// Events kept for [`Browser::goto`] and friends; older ones are dropped.
const EVENT_BUFFER: usize = 10_000;

/// Lines of Chromium's standard error kept for error messages.
const STDERR_LINES: usize = 40;

/// The Chromium executable to use: `SETTLE_CHROMIUM`, else `/usr/bin/chromium`, else the
/// first of `chromium`, `chromium-browser`, `google-chrome` on `PATH`. Err says why none.
pub fn find_chromium() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SETTLE_CHROMIUM").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(format!("SETTLE_CHROMIUM={} is not an executable file", path.display()))
        };
    }
    let fixed = Path::new("/usr/bin/chromium");
    if is_executable(fixed) {
        return Ok(fixed.to_path_buf());
    }
    let dirs: Vec<PathBuf> = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in &dirs {
            let path = dir.join(name);
            if is_executable(&path) {
                return Ok(path);
            }
        }
    }
    Err("no chromium (set SETTLE_CHROMIUM, or install chromium, chromium-browser or google-chrome)".into())
}

/// Why browser tests cannot run here (no Chromium found), or None when they can. A test
/// prints `skipped: {reason}` and returns.
pub fn skip_reason() -> Option<String> {
    find_chromium().err()
}

fn is_executable(path: &Path) -> bool {
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// What the reader thread shares with the callers.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Ids of the commands whose callers are waiting.
    waiting: HashSet<u64>,
    /// Responses for waiting callers, by id.
    responses: HashMap<u64, Value>,
    /// Recent events; `events[0]` is event number `first_event` since launch.
    events: VecDeque<Value>,
    first_event: usize,
    /// Console errors, uncaught exceptions and error log entries since launch.
    console: Vec<String>,
    /// Why the pipe is closed, once it is.
    closed: Option<String>,
}

/// A headless Chromium with one page (tab), driven over CDP on a pipe. Closed (and its
/// profile directory removed) on drop.
pub struct Browser {
    child: Child,
    writer: Mutex<PipeWriter>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    session: String,
    target: String,
    timeout: Duration,
    reader: Option<JoinHandle<()>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    profile: Option<tempfile::TempDir>,
}

impl Browser {
    /// Starts Chromium with a fresh profile and opens a blank page: None when there is no
    /// Chromium ([`skip_reason`] says why). Panics when Chromium is there but does not start
    /// (with the end of its standard error).
    pub fn launch() -> Option<Browser> {
        match Browser::try_launch() {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        }
    }

    /// As [`Browser::launch`], with `args` added to Chromium's command line
    /// (`--host-resolver-rules=...`, say).
    pub fn launch_with(args: &[&str]) -> Option<Browser> {
        match Browser::try_launch_with(args) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        }
    }

    /// As [`Browser::launch`], with a failure to start as Err rather than a panic.
    pub fn try_launch() -> Result<Option<Browser>, String> {
        Browser::try_launch_with(&[])
    }

    /// As [`Browser::try_launch`], with `args` added to Chromium's command line.
    pub fn try_launch_with(args: &[&str]) -> Result<Option<Browser>, String> {
        let Ok(exe) = find_chromium() else { return Ok(None) };
        Browser::start(&exe, args).map(Some)
    }

    /// Starts the browser `exe` with `args`, up to [`START_ATTEMPTS`] times (one start at a
    /// time in this process); Err names each attempt, how long it took and why it failed.
    pub fn start(exe: &Path, args: &[&str]) -> Result<Browser, String> {
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let began = Instant::now();
            match Browser::try_launch_exe(exe, args) {
                Ok(browser) => return Ok(browser),
                Err(e) => {
                    let failure = format!("attempt {attempt} of {START_ATTEMPTS}, after {:.1?}: {e}", began.elapsed());
                    eprintln!("browser: {failure}");
                    failures.push(failure);
                }
            }
        }
        Err(failures.join("\n"))
    }

    /// One start of the browser `exe` with `args`: Err when it does not open its page (the
    /// process is killed, and its profile removed, on the way out).
    pub fn try_launch_exe(exe: &Path, args: &[&str]) -> Result<Browser, String> {
        let profile = tempfile::Builder::new().prefix("settle-chromium-").tempdir().map_err(|e| e.to_string())?;
        // Commands: parent writes `to_child`, child reads fd 3. Responses: child writes fd 4.
        let (child_in, to_child) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
        let (from_child, child_out) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
        let (child_in_fd, child_out_fd) = (child_in.as_raw_fd(), child_out.as_raw_fd());

        let mut cmd = Command::new(exe);
        cmd.args([
            "--headless=new",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--mute-audio",
            "--hide-scrollbars=false",
        ])
        .args(args)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={},{}", VIEWPORT.0, VIEWPORT.1))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        install_pipe_fds(&mut cmd, child_in_fd, child_out_fd);
        let spawned = cmd.spawn();
        // The child has its copies (or failed); ours must go, or EOF would never come.
        drop(cmd);
        drop(child_in);
        drop(child_out);
        let mut child = spawned.map_err(|e| format!("cannot start {}: {e}", exe.display()))?;

        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    // Complaints about the missing D-Bus (as in containers) hide the real news.
                    if line.contains(":ERROR:dbus/") {
                        continue;
                    }
                    let mut tail = tail.lock().unwrap();
                    if tail.len() == STDERR_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }

        let shared = Arc::new(Shared { state: Mutex::new(State::default()), changed: Condvar::new() });
        let reader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("cdp-reader".into())
                .spawn(move || read_messages(from_child, &shared))
                .map_err(|e| e.to_string())?
        };

        let mut browser = Browser {
            child,
            writer: Mutex::new(to_child),
            shared,
            next_id: AtomicU64::new(1),
            session: String::new(),
            target: String::new(),
            timeout: DEFAULT_TIMEOUT,
            reader: Some(reader),
            stderr,
            profile: Some(profile),
        };
        browser.open_page().map_err(|e| {
            // Give Chromium a moment to finish dying, so its last words are in the message.
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut status = None;
            while status.is_none() && Instant::now() < deadline {
                status = browser.child.try_wait().ok().flatten();
                std::thread::sleep(Duration::from_millis(50));
            }
            let status = status.map_or("it is still running".to_string(), |s| format!("it ended with {s}"));
            format!(
                "chromium {} did not start: {e}\n{status}; last lines of its stderr:\n{}",
                exe.display(),
                browser.stderr_tail()
            )
        })?;
        Ok(browser)
    }

    /// Creates the page target, attaches to it and sets it up; each command may take
    /// [`START_TIMEOUT`].
    fn open_page(&mut self) -> Result<(), String> {
        let target = self.call_within("Target.createTarget", json!({"url": "about:blank"}), None, START_TIMEOUT)?;
        self.target = str_field(&target, "targetId")?;
        let attach = json!({"targetId": self.target, "flatten": true});
        let attached = self.call_within("Target.attachToTarget", attach, None, START_TIMEOUT)?;
        self.session = str_field(&attached, "sessionId")?;
        let session = self.session.clone();
        let page = |method: &str, params: Value| self.call_within(method, params, Some(&session), START_TIMEOUT);
        for domain in ["Page", "Runtime", "Log"] {
            page(&format!("{domain}.enable"), json!({}))?;
        }
        page(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": VIEWPORT.0, "height": VIEWPORT.1, "deviceScaleFactor": 1, "mobile": false}),
        )?;
        // The page is never the focused window of a desktop: have it behave as if it were,
        // so that focus, `:focus` and `document.hasFocus()` work as for a user.
        page("Emulation.setFocusEmulationEnabled", json!({"enabled": true}))?;
        Ok(())
    }

    /// The timeout of every command and wait that takes none (default 20 s).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The CDP session id of the page, for [`Browser::call`].
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// The process id of the browser.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The browser's temporary profile directory (`--user-data-dir`), removed on drop.
    pub fn profile_dir(&self) -> &Path {
        self.profile.as_ref().map_or(Path::new(""), |p| p.path())
    }

    /// The last lines Chromium wrote on its standard error.
    pub fn stderr_tail(&self) -> String {
        self.stderr.lock().unwrap().iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Sends the CDP command `method` with `params` (to the browser, or to the session
    /// `session_id`) and waits for its result. Err names the method and carries the CDP
    /// error, or says that it timed out or that the browser is gone.
    pub fn call(&self, method: &str, params: Value, session_id: Option<&str>) -> Result<Value, String> {
        self.call_within(method, params, session_id, self.timeout)
    }

    /// As [`Browser::call`] on the page's session.
    pub fn page_call(&self, method: &str, params: Value) -> Result<Value, String> {
        self.call_within(method, params, Some(&self.session), self.timeout)
    }

    fn call_within(
        &self,
        method: &str,
        params: Value,
        session_id: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session_id {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).map_err(|e| e.to_string())?;
        bytes.push(0);
        {
            let mut state = self.shared.state.lock().unwrap();
            if let Some(why) = &state.closed {
                return Err(self.gone(&format!("CDP {method}: {why}")));
            }
            state.waiting.insert(id);
        }
        let written = self.writer.lock().unwrap().write_all(&bytes);
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state.lock().unwrap();
        if let Err(e) = written {
            state.waiting.remove(&id);
            return Err(format!("CDP {method}: cannot write to the browser: {e}"));
        }
        let response = loop {
            if let Some(r) = state.responses.remove(&id) {
                break r;
            }
            let now = Instant::now();
            if let Some(why) = state.closed.clone() {
                state.waiting.remove(&id);
                return Err(self.gone(&format!("CDP {method}: {why}")));
            }
            if now >= deadline {
                state.waiting.remove(&id);
                return Err(format!("CDP {method}: no response within {timeout:?}"));
            }
            state = self.shared.changed.wait_timeout(state, deadline - now).unwrap().0;
        };
        state.waiting.remove(&id);
        drop(state);
        match response.get("error") {
            Some(err) => {
                let code = &err["code"];
                let message = err["message"].as_str().unwrap_or_default();
                let data = err.get("data").and_then(Value::as_str).map(|d| format!(" ({d})")).unwrap_or_default();
                Err(format!("CDP {method} failed: {message}{data} [code {code}]"))
            }
            None => Ok(response.get("result").cloned().unwrap_or(Value::Null)),
        }
    }

    /// `what` (about a closed pipe) with the end of Chromium's standard error.
    fn gone(&self, what: &str) -> String {
        let tail = self.stderr_tail();
        let last: Vec<&str> = tail.lines().rev().take(10).collect::<Vec<_>>().into_iter().rev().collect();
        format!("{what}; last lines of its stderr:\n{}", last.join("\n"))
    }

    /// The number of events received so far: a starting point for [`Browser::wait_event`].
    pub fn event_cursor(&self) -> usize {
        let state = self.shared.state.lock().unwrap();
        state.first_event + state.events.len()
    }

    /// Waits for the first event from number `since` on (see [`Browser::event_cursor`]) of
    /// the page's session whose method is `method`; its `params`.
    pub fn wait_event(&self, method: &str, since: usize, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state.lock().unwrap();
        let mut next = since;
        loop {
            next = next.max(state.first_event);
            let end = state.first_event + state.events.len();
            for i in next..end {
                let ev = &state.events[i - state.first_event];
                if ev["method"] == method && ev["sessionId"] == self.session.as_str() {
                    return Ok(ev["params"].clone());
                }
            }
            next = end;
            if let Some(why) = &state.closed {
                return Err(self.gone(&format!("waiting for {method}: {why}")));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("no {method} within {timeout:?}"));
            }
            state = self.shared.changed.wait_timeout(state, deadline - now).unwrap().0;
        }
    }

    /// Navigates the page to `url` and waits for its load event (`Page.loadEventFired`).
    /// Err when the navigation fails (e.g. `net::ERR_FILE_NOT_FOUND`) or the page does not
    /// load in time. A navigation within the document (a `#fragment`) does not wait.
    pub fn goto(&self, url: &str) -> Result<(), String> {
        let since = self.event_cursor();
        let nav = self.page_call("Page.navigate", json!({"url": url})).map_err(|e| format!("goto {url}: {e}"))?;
        if let Some(err) = nav.get("errorText").and_then(Value::as_str).filter(|e| !e.is_empty()) {
            return Err(format!("goto {url}: {err}"));
        }
        if nav.get("loaderId").is_none() {
            return Ok(());
        }
        self.wait_event("Page.loadEventFired", since, self.timeout).map(drop).map_err(|e| format!("goto {url}: {e}"))
    }

    /// Evaluates the JavaScript expression `js` in the page (awaiting it when it is a
    /// promise) and returns its value as JSON (`null` for `undefined`; DOM nodes come back as
    /// `{}`; `NaN`, `Infinity`, `-0` and big integers as strings). Err with the exception's
    /// text when it throws or its promise rejects.
    pub fn eval(&self, js: &str) -> Result<Value, String> {
        let obj = self.evaluate(js)?;
        Ok(match obj.get("unserializableValue") {
            Some(v) => v.clone(),
            None => obj.get("value").cloned().unwrap_or(Value::Null),
        })
    }

    /// `Runtime.evaluate` by value; the result's RemoteObject.
    fn evaluate(&self, js: &str) -> Result<Value, String> {
        let r = self
            .page_call(
                "Runtime.evaluate",
                json!({"expression": js, "returnByValue": true, "awaitPromise": true, "userGesture": true}),
            )
            .map_err(|e| format!("eval `{}`: {e}", short(js)))?;
        if let Some(ex) = r.get("exceptionDetails") {
            let text = ex["exception"]["description"]
                .as_str()
                .or_else(|| ex["exception"]["value"].as_str())
                .or_else(|| ex["text"].as_str())
                .unwrap_or("exception");
            return Err(format!("eval `{}` threw: {text}", short(js)));
        }
        Ok(r["result"].clone())
    }

    /// Evaluates `js` every 50 ms until its value is truthy (by JavaScript's rules), and
    /// returns that value. Err after `timeout`, naming the expression and the last value (or
    /// the last exception). Exceptions while waiting (say, during a navigation) count as
    /// "not yet".
    pub fn wait_for(&self, js: &str, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.evaluate(js) {
                Ok(obj) if truthy(&obj) => {
                    return Ok(obj
                        .get("unserializableValue")
                        .or_else(|| obj.get("value"))
                        .cloned()
                        .unwrap_or(Value::Null));
                }
                Ok(obj) => describe(&obj),
                Err(e) => e,
            };
            if self.shared.state.lock().unwrap().closed.is_some() || Instant::now() >= deadline {
                return Err(format!("wait_for `{js}` still not true after {timeout:?}; last value: {last}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clicks the first element matching the CSS selector `css`: scrolls it into view,
    /// focuses it (as a real click on a control would) and calls its `click()`. Err when
    /// nothing matches.
    pub fn click(&self, css: &str) -> Result<(), String> {
        let sel = json!(css);
        let js = format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return false; \
             e.scrollIntoView({{block: 'center'}}); if (e.focus) e.focus(); e.click(); return true; }})()"
        );
        match self.eval(&js)? {
            Value::Bool(true) => Ok(()),
            _ => Err(format!("click: no element matches `{css}`")),
        }
    }

    /// Types `text` into the form control matching `css`: focuses it, sets its value
    /// (through the native setter, so frameworks tracking the property notice) and dispatches
    /// `input` and `change` events (both bubbling). Err when nothing matches.
    pub fn type_into(&self, css: &str, text: &str) -> Result<(), String> {
        let (sel, val) = (json!(css), json!(text));
        let js = format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return false; \
             if (e.focus) e.focus(); \
             const d = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(e), 'value'); \
             if (d && d.set) d.set.call(e, {val}); else e.value = {val}; \
             e.dispatchEvent(new Event('input', {{bubbles: true}})); \
             e.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()"
        );
        match self.eval(&js)? {
            Value::Bool(true) => Ok(()),
            _ => Err(format!("type_into: no element matches `{css}`")),
        }
    }

    /// Presses and releases a key on the focused element, through `Input.dispatchKeyEvent`
    /// (so the browser does what it does for a user: Tab moves the focus, Enter activates a
    /// button or submits a form). `key` is a DOM key name (`Tab`, `Enter`, `Escape`,
    /// `Backspace`, `Delete`, `Space`, `ArrowUp`/`Down`/`Left`/`Right`, `Home`, `End`,
    /// `PageUp`, `PageDown`) or one letter or digit, optionally after modifiers joined by `+`
    /// (`Shift+Tab`, `Control+a`).
    pub fn press_key(&self, key: &str) -> Result<(), String> {
        let mut parts: Vec<&str> = key.split('+').collect();
        let name = parts.pop().filter(|n| !n.is_empty()).unwrap_or("+");
        let mut modifiers = 0;
        for m in parts {
            modifiers |= match m {
                "Alt" => 1,
                "Control" | "Ctrl" => 2,
                "Meta" => 4,
                "Shift" => 8,
                _ => return Err(format!("press_key `{key}`: unknown modifier `{m}`")),
            };
        }
        let (key_name, code, vk, text) = key_definition(name, modifiers & 8 != 0)
            .ok_or_else(|| format!("press_key `{key}`: unknown key `{name}`"))?;
        // Text only without Control/Alt/Meta, as on a keyboard.
        let text = text.filter(|_| modifiers & 7 == 0);
        let mut down = json!({
            "type": if text.is_some() { "keyDown" } else { "rawKeyDown" },
            "modifiers": modifiers,
            "key": key_name,
            "code": code,
            "windowsVirtualKeyCode": vk,
            "nativeVirtualKeyCode": vk,
        });
        if let Some(t) = &text {
            down["text"] = json!(t);
            down["unmodifiedText"] = json!(t);
        }
        self.page_call("Input.dispatchKeyEvent", down).map_err(|e| format!("press_key `{key}`: {e}"))?;
        let up = json!({
            "type": "keyUp",
            "modifiers": modifiers,
            "key": key_name,
            "code": code,
            "windowsVirtualKeyCode": vk,
            "nativeVirtualKeyCode": vk,
        });
        self.page_call("Input.dispatchKeyEvent", up).map_err(|e| format!("press_key `{key}`: {e}"))?;
        Ok(())
    }

    /// The focused element, described: tag, `#id`, `[name=...]`, and its first 40
    /// characters of text (or value, or aria-label) in quotes, e.g. `button#go "Go"`;
    /// `body` when nothing is focused.
    pub fn active_element(&self) -> Result<String, String> {
        let js = r#"(() => {
            const e = document.activeElement;
            if (!e) return 'none';
            let s = e.tagName.toLowerCase();
            if (e.id) s += '#' + e.id;
            const name = e.getAttribute('name');
            if (name) s += '[name=' + name + ']';
            if (e !== document.body && e !== document.documentElement) {
                const t = String(e.innerText || e.value || e.getAttribute('aria-label') || '')
                    .trim().replace(/\s+/g, ' ').slice(0, 40);
                if (t) s += ' "' + t + '"';
            }
            return s;
        })()"#;
        match self.eval(js)? {
            Value::String(s) => Ok(s),
            other => Err(format!("active_element: unexpected {other}")),
        }
    }

    /// Takes a PNG screenshot of the viewport, writes it to `path` and returns its bytes.
    pub fn screenshot_png(&self, path: &Path) -> Result<Vec<u8>, String> {
        let shot = self.page_call("Page.captureScreenshot", json!({"format": "png"}))?;
        let data = shot["data"].as_str().ok_or("Page.captureScreenshot: no data")?;
        let png = base64_decode(data)?;
        std::fs::write(path, &png).map_err(|e| format!("write {}: {e}", path.display()))?;
        Ok(png)
    }

    /// Everything reported as an error since launch: `console.error` and failed
    /// `console.assert` calls, uncaught exceptions (`Runtime.exceptionThrown`) and error log
    /// entries (`Log.entryAdded`, e.g. a failed resource load), each with its source URL and
    /// line when known.
    pub fn console_errors(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().console.clone()
    }

    /// Takes the errors reported so far ([`Browser::console_errors`]), leaving none: for a
    /// step whose errors are expected (a page of something not there).
    pub fn take_console_errors(&self) -> Vec<String> {
        std::mem::take(&mut self.shared.state.lock().unwrap().console)
    }

    /// Whether the page fits the viewport's width: no horizontal scrolling
    /// (`document.documentElement.scrollWidth <= window.innerWidth`).
    pub fn scroll_width_fits(&self) -> Result<bool, String> {
        match self.eval("document.documentElement.scrollWidth <= window.innerWidth")? {
            Value::Bool(b) => Ok(b),
            other => Err(format!("scroll_width_fits: unexpected {other}")),
        }
    }
}

impl Drop for Browser {
    /// Asks the browser to close, then kills it if it is still there after 5 s, reaps it,
    /// and removes its profile directory.
    fn drop(&mut self) {
        let open = self.shared.state.lock().unwrap().closed.is_none();
        if open {
            let _ = self.call_within("Browser.close", json!({}), None, Duration::from_secs(3));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // The child is gone, so its end of the pipe is closed and the reader ends.
        if let Some(reader) = self.reader.take() {
            let deadline = Instant::now() + Duration::from_secs(2);
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        if let Some(profile) = self.profile.take() {
            // Helper processes may still be writing there for a moment.
            for _ in 0..10 {
                if std::fs::remove_dir_all(profile.path()).is_ok() || !profile.path().exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            drop(profile);
        }
    }
}

/// In the child, makes `read_fd` its fd 3 and `write_fd` its fd 4, not close-on-exec.
#[allow(unsafe_code)]
fn install_pipe_fds(cmd: &mut Command, read_fd: i32, write_fd: i32) {
    let hook = move || {
        // Only async-signal-safe calls here (we are between fork and exec). First move both
        // ends out of the way (to fds >= 10, close-on-exec), so that dup2 onto 3 cannot
        // overwrite the other end when it happens to be 3 or 4.
        // SAFETY: plain fd syscalls on fds owned by this (forked) process.
        let high_read = unsafe { libc::fcntl(read_fd, libc::F_DUPFD_CLOEXEC, 10) };
        let high_write = unsafe { libc::fcntl(write_fd, libc::F_DUPFD_CLOEXEC, 10) };
        if high_read < 0 || high_write < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // dup2 clears close-on-exec on the new descriptors.
        // SAFETY: as above.
        if unsafe { libc::dup2(high_read, 3) } < 0 || unsafe { libc::dup2(high_write, 4) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook only calls fcntl and dup2, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// The reader thread: splits Chromium's output at NUL bytes and files each message.
fn read_messages(from_child: std::io::PipeReader, shared: &Shared) {
    let mut input = BufReader::with_capacity(1 << 16, from_child);
    let mut buf = Vec::new();
    let why = loop {
        buf.clear();
        match input.read_until(0, &mut buf) {
            Ok(0) => break "the browser closed the pipe (it exited or crashed)".to_string(),
            Ok(_) => {}
            Err(e) => break format!("reading from the browser: {e}"),
        }
        if buf.last() == Some(&0) {
            buf.pop();
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&buf) else { continue };
        let mut state = shared.state.lock().unwrap();
        if let Some(id) = msg.get("id").and_then(Value::as_u64) {
            if state.waiting.contains(&id) {
                state.responses.insert(id, msg);
            }
        } else {
            if let Some(line) = console_error(&msg) {
                state.console.push(line);
            }
            if msg["method"] == "Inspector.targetCrashed" {
                state.console.push("the page crashed (Inspector.targetCrashed)".into());
            }
            if state.events.len() == EVENT_BUFFER {
                state.events.pop_front();
                state.first_event += 1;
            }
            state.events.push_back(msg);
        }
        drop(state);
        shared.changed.notify_all();
    };
    shared.state.lock().unwrap().closed = Some(why);
    shared.changed.notify_all();
}

/// The line for [`Browser::console_errors`] when `msg` is an error event.
fn console_error(msg: &Value) -> Option<String> {
    let p = &msg["params"];
    let (kind, text, url, line) = match msg["method"].as_str()? {
        "Runtime.consoleAPICalled" => {
            let kind = p["type"].as_str()?;
            if kind != "error" && kind != "assert" {
                return None;
            }
            let args = p["args"].as_array().map(Vec::as_slice).unwrap_or_default();
            let text = args.iter().map(describe).collect::<Vec<_>>().join(" ");
            let frame = &p["stackTrace"]["callFrames"][0];
            (format!("console.{kind}"), text, frame["url"].clone(), frame["lineNumber"].as_i64())
        }
        "Runtime.exceptionThrown" => {
            let d = &p["exceptionDetails"];
            let text = d["exception"]["description"].as_str().or_else(|| d["text"].as_str()).unwrap_or("exception");
            ("uncaught".into(), text.to_string(), d["url"].clone(), d["lineNumber"].as_i64())
        }
        "Log.entryAdded" => {
            let e = &p["entry"];
            if e["level"] != "error" {
                return None;
            }
            let kind = format!("log.{}", e["source"].as_str().unwrap_or("other"));
            (kind, e["text"].as_str().unwrap_or_default().to_string(), e["url"].clone(), e["lineNumber"].as_i64())
        }
        _ => return None,
    };
    let place = match (url.as_str().filter(|u| !u.is_empty()), line) {
        // CDP lines are 0-based.
        (Some(u), Some(l)) => format!(" ({u}:{})", l + 1),
        (Some(u), None) => format!(" ({u})"),
        _ => String::new(),
    };
    Some(format!("{kind}: {text}{place}"))
}

/// A RemoteObject as text: strings as they are, other values as JSON, else the description.
fn describe(obj: &Value) -> String {
    if let Some(s) = obj["value"].as_str() {
        return s.to_string();
    }
    if let Some(v) = obj.get("value") {
        return v.to_string();
    }
    if let Some(u) = obj["unserializableValue"].as_str() {
        return u.to_string();
    }
    obj["description"].as_str().map(str::to_string).unwrap_or_else(|| obj["type"].as_str().unwrap_or("?").to_string())
}

/// JavaScript truthiness of a RemoteObject (by value).
fn truthy(obj: &Value) -> bool {
    if let Some(u) = obj["unserializableValue"].as_str() {
        return !matches!(u, "NaN" | "-0" | "0n" | "-0n");
    }
    match obj.get("value") {
        None => (obj["type"] == "object" && obj["subtype"] != "null") || obj["type"] == "function",
        Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(_) | Value::Object(_)) => true,
    }
}

/// `v[name]` as a string, or Err.
fn str_field(v: &Value, name: &str) -> Result<String, String> {
    v[name].as_str().map(str::to_string).ok_or_else(|| format!("no {name} in {v}"))
}

/// `js` cut to 200 characters for messages.
fn short(js: &str) -> String {
    match js.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &js[..i]),
        None => js.to_string(),
    }
}

/// The DOM `key`, `code`, virtual key code and text of a key name.
fn key_definition(name: &str, shift: bool) -> Option<(String, String, u32, Option<String>)> {
    let named = |key: &str, code: &str, vk: u32, text: Option<&str>| {
        Some((key.to_string(), code.to_string(), vk, text.map(str::to_string)))
    };
    match name {
        "Tab" => named("Tab", "Tab", 9, None),
        "Enter" => named("Enter", "Enter", 13, Some("\r")),
        "Escape" | "Esc" => named("Escape", "Escape", 27, None),
        "Backspace" => named("Backspace", "Backspace", 8, None),
        "Delete" => named("Delete", "Delete", 46, None),
        "Space" | " " => named(" ", "Space", 32, Some(" ")),
        "ArrowLeft" => named("ArrowLeft", "ArrowLeft", 37, None),
        "ArrowUp" => named("ArrowUp", "ArrowUp", 38, None),
        "ArrowRight" => named("ArrowRight", "ArrowRight", 39, None),
        "ArrowDown" => named("ArrowDown", "ArrowDown", 40, None),
        "Home" => named("Home", "Home", 36, None),
        "End" => named("End", "End", 35, None),
        "PageUp" => named("PageUp", "PageUp", 33, None),
        "PageDown" => named("PageDown", "PageDown", 34, None),
        _ => {
            let mut chars = name.chars();
            let (c, None) = (chars.next()?, chars.next()) else { return None };
            if c.is_ascii_alphabetic() {
                let key = if shift { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() };
                let upper = c.to_ascii_uppercase();
                Some((key.to_string(), format!("Key{upper}"), upper as u32, Some(key.to_string())))
            } else if c.is_ascii_digit() {
                Some((c.to_string(), format!("Digit{c}"), c as u32, Some(c.to_string())))
            } else {
                None
            }
        }
    }
}

/// Decodes standard base64 (with or without padding; whitespace ignored).
pub fn base64_decode(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for (i, c) in s.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(format!("base64: bad byte {c:#04x} at {i}")),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}
