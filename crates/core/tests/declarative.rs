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

const PARENT: &str = r#"
initial = "idle"
properties = ["peer"]

[states.idle]
[states.busy]
kind = "terminal"

[events.grow]
in = ["idle"]
action = "grow"
params = ["size"]

[actions.grow]
to = ["busy"]
create = [
  { machine = "db", key = "key + '-db'", properties = { size = "params.size", owner = "key", tier = 2 }, event = "start", params = { fast = true } },
  { machine = "db", key = "key + '-replica'" },
]
raise = [{ event = "start", machine = "db", key = "props.peer", params = { fast = false } }]
may_create = ["db"]
may_raise = ["start"]
"#;

const DB: &str = r#"
initial = "waiting"

[states.waiting]
[states.running]
kind = "terminal"

[events.start]
in = ["waiting"]
action = "run"
params = ["fast"]

[actions.run]
to = ["running"]
"#;

#[test]
fn a_declarative_action_creates_entities_with_computed_keys_and_properties() {
    let (parent, warnings) = settle_core::toml::load("parent.toml", "parent", PARENT).unwrap_or_else(|r| panic!("{r}"));
    assert!(warnings.diagnostics.is_empty(), "{warnings}");
    let (db, _) = settle_core::toml::load("db.toml", "db", DB).unwrap_or_else(|r| panic!("{r}"));
    assert_eq!(settle_core::validate::check_set(&[&parent, &db]), settle_core::Report::default());
    let grow = parent.action("grow").expect("declared");
    let props = json!({"peer": "p0-db"}).as_object().cloned().unwrap();
    let (creates, raises) =
        settle_core::step::declared_creates(grow, &props, &json!({"size": 3}), "p1").expect("evaluates");
    let made: Vec<(String, String, serde_json::Value)> = creates
        .iter()
        .map(|c| (c.machine.to_string(), c.key.to_string(), serde_json::Value::Object(c.properties.clone())))
        .collect();
    assert_eq!(
        made,
        [
            ("db".into(), "p1-db".into(), json!({"size": 3, "owner": "p1", "tier": 2})),
            ("db".into(), "p1-replica".into(), json!({})),
        ]
    );
    let raised: Vec<(&str, &str, &serde_json::Value)> =
        raises.iter().map(|r| (r.key.as_str(), r.event.as_str(), &r.params)).collect();
    // The first event of what it creates, then its raise on an entity named by key.
    assert_eq!(raised, [("p1-db", "start", &json!({"fast": true})), ("p0-db", "start", &json!({"fast": false}))]);
    // What it creates is a subscription's successors: no warning for a pattern over them.
    // The definition round-trips through TOML and the stored (canonical) form.
    let (again, _) =
        settle_core::toml::load("again.toml", "parent", &parent.to_toml()).unwrap_or_else(|r| panic!("{r}"));
    assert_eq!(again.content_hash(), parent.content_hash());
    let stored = settle_core::Machine::from_canonical_json(&parent.canonical_json()).expect("reads back");
    assert_eq!(stored.content_hash(), parent.content_hash());
    assert_eq!(stored.action("grow").map(|a| a.create.len()), Some(2));
    // A key that cannot be computed names the entry.
    let (field, why) =
        settle_core::step::declared_creates(grow, &props, &json!(null), "p1").expect_err("params.size is missing");
    assert_eq!(field, "create[0].properties.size");
    assert!(why.contains("size"), "{why}");
}

#[test]
fn a_declarative_create_beyond_what_is_declared_is_refused_with_its_line() {
    let bad = PARENT
        .replace("key = \"key + '-replica'\"", "key = \"key + 1\"")
        .replace("machine = \"db\", key = \"props.peer\"", "machine = \"db\"")
        .replace("may_create = [\"db\"]", "may_create = []")
        .replace("may_raise = [\"start\"]", "may_raise = []");
    let report = settle_core::toml::load("parent.toml", "parent", &bad).expect_err("refused");
    let text = report.to_string();
    for expected in [
        "parent.toml:14: error: machine `parent`, action `grow`: `create[1].key` = `key + 1`: `+` cannot add a string and a number",
        "`create[0]` of a `db`: not among the machines it `may_create` (none)",
        "`create[0]`: its first event `start` is not among the events it `may_raise` (none)",
        "`raise` of `start`: `machine` and `key` go together, and without `on`",
    ] {
        assert!(text.contains(expected), "no `{expected}` in:\n{text}");
    }
    // Across machines: the created machine must be in the set, and take the first event.
    let (parent, _) = settle_core::toml::load("parent.toml", "parent", PARENT).unwrap_or_else(|r| panic!("{r}"));
    let lines = |set: &[&settle_core::Machine]| settle_core::validate::check_set(set).to_string();
    assert!(
        lines(&[&parent]).contains("action `grow`: `create[0]`: no machine `db` in the set"),
        "{}",
        lines(&[&parent])
    );
    let (strict, _) =
        settle_core::toml::load("db.toml", "db", &DB.replace("params = [\"fast\"]", "params = [\"slow\"]"))
            .unwrap_or_else(|r| panic!("{r}"));
    let text = lines(&[&parent, &strict]);
    assert!(text.contains("`create[0]`: its first event: "), "{text}");
}
