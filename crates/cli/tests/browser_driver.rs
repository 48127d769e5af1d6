//! Self-test of the CDP driver in `common/browser.rs` on a static page: evaluation, waiting,
//! clicks, typing, keyboard focus, screenshots, console errors and width. Skipped (with a
//! line saying so) where there is no Chromium.

mod common;

use std::time::{Duration, Instant};

use common::browser::{self, Browser};
use serde_json::json;

const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>driver test</title>
<style>body { font: 16px sans-serif; margin: 2em; } button { padding: .5em 1em; }</style></head>
<body>
  <h1>Driver test</h1>
  <button id="go" type="button">Go</button>
  <input id="name" name="name" aria-label="Name">
  <p id="echo"></p>
  <script>
    window.clicks = 0;
    window.inputs = 0;
    document.getElementById('go').addEventListener('click', () => {
      window.clicks += 1;
      console.error('boom', window.clicks);
      if (!document.getElementById('done')) {
        const p = document.createElement('p');
        p.id = 'done';
        p.textContent = 'done';
        document.body.appendChild(p);
      }
    });
    document.getElementById('name').addEventListener('input', (e) => {
      window.inputs += 1;
      document.getElementById('echo').textContent = 'hello ' + e.target.value;
    });
  </script>
</body>
</html>
"#;

/// The browser, or None after printing why the test is skipped.
fn browser() -> Option<Browser> {
    if let Some(why) = browser::skip_reason() {
        println!("skipped: {why}");
        return None;
    }
    Browser::launch()
}

#[test]
fn drives_a_static_page() {
    let started = Instant::now();
    let Some(b) = browser() else { return };
    let launched = started.elapsed();
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("page.html");
    std::fs::write(&page, PAGE).unwrap();
    b.goto(&format!("file://{}", page.display())).unwrap();

    // eval: values, promises, undefined, exceptions.
    assert_eq!(b.eval("1 + 2").unwrap(), json!(3));
    assert_eq!(b.eval("document.title").unwrap(), json!("driver test"));
    assert_eq!(b.eval("Promise.resolve({a: [1, 'x']})").unwrap(), json!({"a": [1, "x"]}));
    assert_eq!(b.eval("undefined").unwrap(), json!(null));
    let err = b.eval("(() => { throw new Error('kaput') })()").unwrap_err();
    assert!(err.contains("kaput"), "{err}");
    let err = b.eval("Promise.reject(new Error('nope'))").unwrap_err();
    assert!(err.contains("nope"), "{err}");

    // click: the handler runs, a console error is logged, an element appears.
    assert_eq!(b.eval("document.getElementById('done')").unwrap(), json!(null));
    b.click("#go").unwrap();
    let done = b.wait_for("document.getElementById('done')?.textContent", Duration::from_secs(5)).unwrap();
    assert_eq!(done, json!("done"));
    assert_eq!(b.eval("window.clicks").unwrap(), json!(1));
    let err = b.click("#missing").unwrap_err();
    assert!(err.contains("#missing"), "{err}");

    // Keyboard: the click focused the button; Tab moves on to the input.
    assert_eq!(b.eval("document.activeElement.id").unwrap(), json!("go"));
    assert_eq!(b.active_element().unwrap(), r#"button#go "Go""#);
    b.press_key("Tab").unwrap();
    assert_eq!(b.eval("document.activeElement.id").unwrap(), json!("name"));
    assert_eq!(b.active_element().unwrap(), r#"input#name[name=name] "Name""#);
    b.press_key("Shift+Tab").unwrap();
    assert_eq!(b.eval("document.activeElement.id").unwrap(), json!("go"));
    // Enter on a focused button activates it, as for a user.
    b.press_key("Enter").unwrap();
    b.wait_for("window.clicks === 2", Duration::from_secs(5)).unwrap();
    b.press_key("Escape").unwrap();
    assert!(b.press_key("NoSuchKey").unwrap_err().contains("NoSuchKey"));

    // type_into: value set, input event seen by the page's handler.
    b.type_into("#name", "Ada").unwrap();
    assert_eq!(b.eval("document.getElementById('name').value").unwrap(), json!("Ada"));
    assert_eq!(b.eval("window.inputs").unwrap(), json!(1));
    assert_eq!(b.eval("document.getElementById('echo').textContent").unwrap(), json!("hello Ada"));
    assert_eq!(b.eval("document.activeElement.id").unwrap(), json!("name"));
    assert!(b.type_into("#missing", "x").is_err());
    // Real key presses type into the focused input too.
    b.press_key("b").unwrap();
    assert_eq!(b.eval("document.getElementById('name').value").unwrap(), json!("Adab"));

    // Width: fits at 1280; a too-wide element is noticed.
    assert_eq!(b.eval("[window.innerWidth, window.innerHeight]").unwrap(), json!([1280, 800]));
    assert!(b.scroll_width_fits().unwrap());

    // Screenshot: a real PNG of the viewport.
    let shot = dir.path().join("shot.png");
    let png = b.screenshot_png(&shot).unwrap();
    assert_eq!(std::fs::read(&shot).unwrap(), png);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG: {:?}", &png[..png.len().min(16)]);
    assert!(png.len() > 1024, "PNG of only {} bytes", png.len());
    assert_eq!(&png[12..16], b"IHDR");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (1280, 800));
    assert!(png.ends_with(b"IEND\xaeB`\x82"), "PNG is cut short");

    b.eval("document.body.insertAdjacentHTML('beforeend', '<div style=\"width: 3000px\">wide</div>')").unwrap();
    assert!(!b.scroll_width_fits().unwrap());

    // Console errors: the page's console.error, with its place; an uncaught exception.
    b.eval("setTimeout(() => { throw new Error('later') }, 0)").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !b.console_errors().iter().any(|e| e.contains("later")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let errors = b.console_errors();
    let boom: Vec<_> = errors.iter().filter(|e| e.contains("boom")).collect();
    assert_eq!(boom.len(), 2, "{errors:#?}");
    assert!(boom[0].starts_with("console.error: boom 1 (file://"), "{errors:#?}");
    assert!(boom[0].contains("page.html:"), "{errors:#?}");
    assert!(errors.iter().any(|e| e.starts_with("uncaught: ") && e.contains("later")), "{errors:#?}");

    // A page that is not there.
    let err = b.goto(&format!("file://{}/nowhere.html", dir.path().display())).unwrap_err();
    assert!(err.contains("ERR_FILE_NOT_FOUND"), "{err}");

    println!("launch {launched:?}, whole test {:?}", started.elapsed());
}

#[test]
fn wait_for_names_the_expression_when_it_times_out() {
    let Some(b) = browser() else { return };
    let started = Instant::now();
    let err = b.wait_for("window.neverTrue === 42", Duration::from_millis(300)).unwrap_err();
    let took = started.elapsed();
    assert!(err.contains("window.neverTrue === 42"), "{err}");
    assert!(err.contains("last value: false"), "{err}");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(5), "{took:?}");
    // An expression that throws while waiting reports the exception.
    let err = b.wait_for("nosuchvariable.x", Duration::from_millis(200)).unwrap_err();
    assert!(err.contains("nosuchvariable") && err.contains("ReferenceError"), "{err}");
    // A CDP error names the method and carries Chromium's message.
    let err = b.call("No.suchMethod", json!({}), Some(b.session_id())).unwrap_err();
    assert!(err.contains("No.suchMethod") && err.contains("wasn't found"), "{err}");

    // Dropping the browser ends (and reaps) its process and removes its profile.
    let pid = b.pid();
    let profile = b.profile_dir().to_path_buf();
    assert!(profile.join("Default").is_dir() || profile.join("Local State").exists() || profile.is_dir());
    drop(b);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "browser {pid} left behind");
    assert!(!profile.exists(), "profile {} left behind", profile.display());
}

#[test]
fn a_dead_browser_is_an_error_not_a_hang() {
    let Some(b) = browser() else { return };
    let pid = b.pid();
    common::kill_9(pid);
    let started = Instant::now();
    let err = b.eval("1").unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(err.contains("closed the pipe"), "{err}");
    println!("dead browser: {err}");
    let err = b.goto("about:blank").unwrap_err();
    assert!(err.contains("Page.navigate"), "{err}");
    drop(b);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "browser {pid} left behind");
}

#[test]
fn base64_decodes() {
    assert_eq!(browser::base64_decode("").unwrap(), b"");
    assert_eq!(browser::base64_decode("Zg==").unwrap(), b"f");
    assert_eq!(browser::base64_decode("Zm8=").unwrap(), b"fo");
    assert_eq!(browser::base64_decode("Zm9v").unwrap(), b"foo");
    assert_eq!(browser::base64_decode("Zm9vYmFy").unwrap(), b"foobar");
    assert_eq!(browser::base64_decode("+/+/").unwrap(), [0xfb, 0xff, 0xbf]);
    assert!(browser::base64_decode("Zm9v!").is_err());
}

/// A browser executable that dies on its first `failures` starts (each start appends a line
/// to `starts`), then runs the real Chromium.
fn flaky_browser(dir: &std::path::Path, real: &std::path::Path, failures: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("flaky-chromium");
    let starts = dir.join("starts");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho start >> '{starts}'\nif [ \"$(wc -l < '{starts}')\" -le {failures} ]; then\n  echo 'flaky: dying on purpose' >&2\n  exit 3\nfi\nexec '{real}' \"$@\"\n",
            starts = starts.display(),
            real = real.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn a_start_that_fails_is_tried_again_once() {
    if let Some(why) = browser::skip_reason() {
        println!("skipped: {why}");
        return;
    }
    let real = browser::find_chromium().unwrap();
    let starts = |dir: &std::path::Path| std::fs::read_to_string(dir.join("starts")).unwrap().lines().count();

    // Dies once: the second start is the browser, and it works.
    let dir = tempfile::tempdir().unwrap();
    let exe = flaky_browser(dir.path(), &real, 1);
    let b = Browser::start(&exe, &[]).unwrap();
    assert_eq!(b.eval("6 * 7").unwrap(), json!(42));
    assert_eq!(starts(dir.path()), 2);
    drop(b);

    // Dies every time: an error naming both attempts and why, and no third start.
    let dir = tempfile::tempdir().unwrap();
    let exe = flaky_browser(dir.path(), &real, u32::MAX);
    let err = Browser::start(&exe, &[]).map(|_| ()).unwrap_err();
    assert!(err.contains("attempt 1 of 2") && err.contains("attempt 2 of 2"), "{err}");
    assert!(err.contains("Target.createTarget"), "{err}");
    assert!(err.contains("flaky: dying on purpose"), "{err}");
    assert_eq!(starts(dir.path()), 2);
}
