//! The `guard` target.

use serde_json::{Map, Value, json};
use settle_core::guard::{Guard, Names};

/// Properties and parameters a guard is evaluated against when the input gives none.
pub(crate) fn default_data() -> (Map<String, Value>, Value) {
    let props = json!({
        "size": 3, "max_size": 10, "region": "eu", "name": "tmp-x", "ratio": 0.5,
        "big": u64::MAX, "neg": i64::MIN, "on": true, "none": null,
        "tags": ["a", "b"], "nested": {"a": 1, "b": [1, 2.5, "c"]}
    });
    let params = json!({"size": 4, "name": "web-1", "region": "us", "n": -1, "list": [1, 2, 3], "obj": {"k": "v"}});
    match props {
        Value::Object(props) => (props, params),
        _ => unreachable!("a literal object"),
    }
}

/// Parses the guard, checks it and evaluates it. The input is `GUARD`, optionally followed
/// by a NUL byte and the properties (a JSON object) and by another NUL and the parameters
/// (any JSON); data missing or not JSON is replaced by a fixed set of values.
pub fn guard(data: &[u8]) {
    let mut parts = data.splitn(3, |&b| b == 0);
    let Ok(source) = std::str::from_utf8(parts.next().unwrap_or_default()) else {
        return;
    };
    let (mut props, mut params) = default_data();
    if let Some(Ok(Value::Object(p))) = parts.next().map(serde_json::from_slice::<Value>) {
        props = p;
    }
    if let Some(Ok(p)) = parts.next().map(serde_json::from_slice::<Value>) {
        params = p;
    }
    let guard = match Guard::parse(source) {
        Ok(guard) => guard,
        Err(message) => {
            assert!(!message.is_empty(), "an empty parse error for {source:?}");
            return;
        }
    };
    assert_eq!(guard.source(), source);
    drop(format!("{guard} {guard:?}"));
    let property_names: Vec<String> = props.keys().cloned().collect();
    let param_names: Vec<String> =
        params.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_else(|| vec!["size".into()]);
    drop(guard.check(Names { params: &param_names, properties: &property_names, states: &[] }));
    drop(guard.check(Names { params: &[], properties: &[], states: &[] }));
    drop(guard.eval(&props, &params, ["a", "b"]));
    drop(guard.eval(&Map::new(), &Value::Null, []));
}
