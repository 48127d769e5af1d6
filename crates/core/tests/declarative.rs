//! Declarative actions' values are expressions (DESIGN §5): a string in `set` is CEL over
//! `props`, `params` and `key`, checked when the definition loads (file and line of the
//! action) and evaluated for each entity; any other value is set as written.

use serde_json::json;
use settle_core::step::{PropChange, declared_changes};

const MACHINE: &str = r#"
initial = "idle"
properties = ["count"]

[states.idle]
[states.sized]
kind = "terminal"

[events.resize]
in = ["idle"]
action = "resize"
params = ["replicas"]

[actions.resize]
to = ["sized"]
set = { replicas = "params.replicas", child = "key + '-db'", note = "'as written'", count = "has(props.count) ? props.count + 1 : 1", ready = true, old = {} }
"#;

#[test]
fn a_declarative_action_computes_its_values() {
    let (m, warnings) = settle_core::toml::load("sized.toml", "sized", MACHINE).unwrap_or_else(|r| panic!("{r}"));
    assert!(warnings.diagnostics.is_empty(), "{warnings}");
    let action = m.action("resize").expect("declared");
    let props = json!({"count": 4}).as_object().cloned().unwrap();
    let mut changes = declared_changes(action, &props, &json!({"replicas": 3}), "srv-1").expect("evaluates");
    changes.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    let set = |k: &str, v: serde_json::Value| PropChange::Set(k.into(), v);
    assert_eq!(
        changes,
        [
            set("child", json!("srv-1-db")),
            set("count", json!(5)),
            set("note", json!("as written")),
            set("old", json!({})),
            set("ready", json!(true)),
            set("replicas", json!(3)),
        ]
    );
    // Evaluated for the entity at hand: a missing parameter is an error naming the entry.
    let (field, why) = declared_changes(action, &props, &json!(null), "srv-1").unwrap_err();
    assert_eq!(field, "set.replicas");
    assert!(why.starts_with("`params.replicas`: ") && why.contains("replicas"), "{why}");
}

#[test]
fn a_bad_expression_is_a_load_error_with_file_and_line() {
    let bad = MACHINE
        .replace("\"params.replicas\"", "\"params.replica\"")
        .replace("\"'as written'\"", "\"as written\"")
        .replace("\"key + '-db'\"", "\"key + 1\"")
        .replace("ready = true", "ready = \"10.0.0.9\"");
    let report = settle_core::toml::load("sized.toml", "sized", &bad).expect_err("refused");
    let lines: Vec<String> = report.diagnostics.iter().map(ToString::to_string).collect();
    let at = "sized.toml:14: error: machine `sized`, action `resize`:";
    assert_eq!(lines.len(), 4, "{report}");
    assert!(lines.iter().all(|l| l.starts_with(at)), "{report}");
    let text = report.to_string();
    for expected in [
        "`set.replicas` = `params.replica`: `params.replica`: the event declares no parameter `replica` (declared: `replicas`)",
        "`set.child` = `key + 1`: `+` cannot add a string and a number",
        "`set.note` = `as written`: syntax error at column 1: reserved identifier: as",
        "`set.ready` = `10.0.0.9`: syntax error at column",
    ] {
        assert!(text.contains(expected), "no `{expected}` in:\n{text}");
    }
    assert!(text.contains("a literal string is quoted, `'as written'`"), "{text}");
}
