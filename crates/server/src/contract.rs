//! The API's contract beyond its routes' annotations, each promise stated once and used by
//! both sides: the server checks its input with the constraints here ([`Text`], [`Range`],
//! [`Words`]), and [`document`] writes the same constraints into `/openapi.json`, with
//! every problem each operation can answer ([`PROBLEMS`] and what its shape implies: a
//! body can be malformed, a query parameter bad, a guarded route refuse a token).
//!
//! A schema-driven property tester (schemathesis, run by `.ci/run`) holds the server to
//! the document; the unit tests here hold the document to these tables.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value, json};

use crate::problem::{CONTENT_TYPE, Kind, TYPE_BASE};

/// A text constraint: a regular expression in the common subset of the Rust, ECMA-262
/// and Python dialects (so the server, the document and its testers read it alike), with
/// an example.
pub struct Text {
    /// The pattern, as the document states it (search semantics: anchored where needed).
    pub pattern: &'static str,
    /// An example that matches.
    pub example: &'static str,
    re: LazyLock<Regex>,
}

impl Text {
    /// Whether `s` meets the constraint.
    pub fn matches(&self, s: &str) -> bool {
        self.re.is_match(s)
    }
}

macro_rules! text {
    ($(#[$doc:meta])* $name:ident = $pattern:literal, example $example:literal) => {
        $(#[$doc])*
        pub static $name: Text = Text {
            pattern: $pattern,
            example: $example,
            re: LazyLock::new(|| Regex::new($pattern).expect("a valid pattern")),
        };
    };
}

text!(
    /// `Idempotency-Key`: 1 to 200 characters from `A-Z a-z 0-9 . _ ~ : -` (it fits a URL
    /// path as is).
    IDEMPOTENCY_KEY = r"^[A-Za-z0-9._~:-]{1,200}$", example "deploy-2026-11-24.web-1"
);
text!(
    /// An entity key: 1 to 256 characters, no control characters.
    KEY = r"^[^\x00-\x1f\x7f-\x9f]{1,256}$", example "web-1"
);
text!(
    /// An agent's name: 1 to 200 characters, no control characters.
    AGENT = r"^[^\x00-\x1f\x7f-\x9f]{1,200}$", example "dns-agent-3"
);
text!(
    /// A duration: numbers with units `ms s m h d`, summed (`90s`, `1h30m`).
    DURATION = r"^([0-9]{1,9}(ms|s|m|h|d)){1,8}$", example "30s"
);
text!(
    /// A wake-up time relative to now: `+` and a duration.
    RELATIVE_TIME = r"^\+([0-9]{1,9}(ms|s|m|h|d)){1,8}$", example "+10m"
);
text!(
    /// A time a filter compares with: a duration before now (`-2h`: two hours ago) or after it.
    SIGNED_TIME = r"^[+-]([0-9]{1,9}(ms|s|m|h|d)){1,8}$", example "-1h"
);
text!(
    /// A page cursor: the last entity of the previous page, by id (`next` of a page by id),
    /// as `machine/key` (of a page by key prefix) or as `entered.id` (by entered time).
    CURSOR = r"^[0-9]{1,18}(\.[0-9]{1,18})?$|/", example "1042"
);
text!(
    /// A position in the change feed: an event's `id` (`commit-kind-row`), or `0` for the
    /// oldest change kept.
    FEED_POSITION = r"^(0|[0-9]{1,19}-[0-2]-[0-9]{1,19})$", example "8812-0-1534"
);
text!(
    /// The cursor of a page of operations: `next` of the previous page (an operation's id).
    OPERATION_CURSOR = r"^[1-9][0-9]{0,17}$", example "1042"
);

/// An integer constraint (inclusive).
#[derive(Debug, Clone, Copy)]
pub struct Range {
    /// Smallest allowed.
    pub min: u64,
    /// Largest allowed.
    pub max: u64,
    /// The value when absent.
    pub default: u64,
}

impl Range {
    /// Whether `n` is in the range.
    pub fn contains(&self, n: u64) -> bool {
        (self.min..=self.max).contains(&n)
    }
    /// Parses a query parameter: decimal digits only, in the range.
    pub fn parse(&self, text: &str) -> Option<u64> {
        if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse().ok().filter(|n| self.contains(*n))
    }
}

/// A page's size: `limit`.
pub const LIMIT: Range = Range { min: 1, max: 1000, default: 100 };
/// How many tasks one lease may take: `max`.
pub const TASKS: Range = Range { min: 1, max: 100, default: 1 };
/// An agent's long poll, in ms: `wait_ms` (the server caps it at `--max-wait`).
pub const WAIT_MS: Range = Range { min: 0, max: 86_400_000, default: 20_000 };
/// How long a report may put off the entered state's auto action, in ms (a year at most).
pub const DELAY_MS: Range = Range { min: 0, max: 31_536_000_000, default: 0 };

/// A bulk operation's rate, in entities a second.
pub const BULK_RATE: Range =
    Range { min: 1, max: settle_engine::MAX_RATE as u64, default: settle_engine::DEFAULT_RATE as u64 };

/// A word from a fixed set.
pub type Words = &'static [&'static str];

/// Run statuses (`status` of `GET /v1/entities`).
pub const RUN_STATUS: Words = &["active", "paused", "sleeping", "fault", "failed", "killed"];
/// What a bulk operation does to each entity.
pub const BULK_ACTION: Words = &["pause", "resume", "retry", "release", "kill", "raise"];
/// The orders of `GET /v1/entities` (`sort`): by id, longest in its state first, newest.
pub const SORT: Words = &["id", "entered", "-entered"];
/// A state's health (`health` of `GET /v1/entities`).
pub const HEALTH: Words = &["ok", "error"];
/// The kinds of change in the feed (`GET /v1/feed?type=`).
pub const FEED_TYPE: Words = &["transition", "operation"];
/// Operation outcomes, and `open` for operations still running.
pub const OUTCOME: Words = &["success", "failed", "canceled", "hung", "open"];
/// What a raise waits for.
pub const WAIT: Words = &["stable", "operation"];
/// Diagram formats.
pub const FORMAT: Words = &["mermaid", "dot", "svg"];

/// How a parameter or body field is constrained.
#[derive(Clone, Copy)]
enum Rule {
    Text(&'static Text),
    Range(Range),
    Words(Words),
    /// A wake-up time: RFC 3339 (any offset) or [`RELATIVE_TIME`].
    Time,
    /// A filter's time: RFC 3339 (any offset) or [`SIGNED_TIME`].
    When,
    /// Any string; the example is shown.
    Free(&'static str),
    /// An array of this many items (its items' schema kept).
    Count(Range),
}

/// Parameters by where they are (`path`, `query`, `header`) and name.
const PARAMS: &[(&str, &str, Rule)] = &[
    ("header", "Idempotency-Key", Rule::Text(&IDEMPOTENCY_KEY)),
    ("query", "limit", Rule::Range(LIMIT)),
    ("query", "after", Rule::Text(&CURSOR)),
    ("query", "before", Rule::Text(&OPERATION_CURSOR)),
    ("query", "status", Rule::Words(RUN_STATUS)),
    ("query", "health", Rule::Words(HEALTH)),
    ("query", "errors", Rule::Words(&["latest"])),
    ("query", "total", Rule::Words(&["true", "false"])),
    ("query", "outcome", Rule::Words(OUTCOME)),
    ("query", "wait", Rule::Words(WAIT)),
    ("query", "timeout", Rule::Text(&DURATION)),
    ("query", "window", Rule::Text(&DURATION)),
    ("query", "format", Rule::Words(FORMAT)),
    ("query", "version", Rule::Free("2105711d831d")),
    ("query", "reason", Rule::Free("maintenance window")),
    ("query", "machine", Rule::Free("server")),
    ("query", "state", Rule::Free("running")),
    ("query", "prefix", Rule::Free("web-")),
    ("query", "key", Rule::Free("web-1")),
    ("query", "request_id", Rule::Free("deploy-2026-11-24.web-1")),
    ("query", "type", Rule::Words(FEED_TYPE)),
    ("query", "since", Rule::Text(&FEED_POSITION)),
    ("query", "coalesce", Rule::Words(&["true", "false"])),
    ("query", "sort", Rule::Words(SORT)),
    ("query", "where", Rule::Free("props.region == \"eu\"")),
    ("query", "error", Rule::Free("quota")),
    ("query", "name", Rule::Free("server.create")),
    ("query", "created_after", Rule::When),
    ("query", "created_before", Rule::When),
    ("query", "entered_after", Rule::When),
    ("query", "entered_before", Rule::When),
    ("query", "started_after", Rule::When),
    ("query", "started_before", Rule::When),
    ("header", "Last-Event-ID", Rule::Text(&FEED_POSITION)),
    ("path", "machine", Rule::Free("server")),
    ("path", "key", Rule::Free("web-1")),
    ("path", "event", Rule::Free("create")),
    ("path", "queue", Rule::Free("provider")),
    ("path", "id", Rule::Free("")),
];

/// Request body fields by schema and field name (fields not listed are typed only).
const FIELDS: &[(&str, &str, Rule)] = &[
    ("CreateEntity", "key", Rule::Text(&KEY)),
    ("ReportCreate", "key", Rule::Text(&KEY)),
    ("LeaseRequest", "agent", Rule::Text(&AGENT)),
    ("LeaseRequest", "max", Rule::Range(TASKS)),
    ("LeaseRequest", "wait_ms", Rule::Range(WAIT_MS)),
    ("CompleteRequest", "delay_ms", Rule::Range(DELAY_MS)),
    ("NextTasks", "agent", Rule::Text(&AGENT)),
    ("NextTasks", "max", Rule::Range(TASKS)),
    ("ReportMany", "reports", Rule::Count(TASKS)),
    ("SleepRequest", "until", Rule::Time),
    ("BulkRequest", "action", Rule::Words(BULK_ACTION)),
    ("BulkRequest", "rate", Rule::Range(BULK_RATE)),
    ("BulkFilter", "status", Rule::Words(RUN_STATUS)),
    ("BulkFilter", "health", Rule::Words(HEALTH)),
    ("BulkFilter", "created_after", Rule::When),
    ("BulkFilter", "created_before", Rule::When),
    ("BulkFilter", "entered_after", Rule::When),
    ("BulkFilter", "entered_before", Rule::When),
];

use Kind::*;

/// The problems of each operation beyond what its shape implies (see [`shape_problems`]).
pub const PROBLEMS: &[(&str, &[Kind])] = &[
    ("healthz", &[]),
    ("openapi", &[]),
    ("session", &[]),
    ("metrics", &[Internal]),
    ("listMachines", &[]),
    ("getMachine", &[UnknownMachine]),
    ("getMachineGraph", &[UnknownMachine]),
    ("getMachineToml", &[UnknownMachine]),
    ("listMachineVersions", &[UnknownMachine, Internal, Unavailable]),
    ("deployMachines", &[InvalidDefinition, VersionStrandsEntities, Internal, Unavailable]),
    ("createEntity", &[UnknownMachine, EntityExists, KeyReused, InvalidKey, InvalidProperties, Internal, Unavailable]),
    ("listEntities", &[UnknownEntity, Internal, Unavailable]),
    ("groupErrors", &[Internal, Unavailable]),
    ("getEntity", &[UnknownMachine, UnknownEntity, EntityDeleted, Internal, Unavailable]),
    ("getEntityHistory", &[UnknownMachine, UnknownEntity, Internal, Unavailable]),
    ("getEntityRelated", &[UnknownMachine, UnknownEntity, Internal, Unavailable]),
    ("listEntityTimers", &[UnknownMachine, UnknownEntity, Internal, Unavailable]),
    ("listEntityErrors", &[UnknownMachine, UnknownEntity, Internal, Unavailable]),
    ("explainEntityFailure", &[UnknownMachine, UnknownEntity, Internal, Unavailable]),
    (
        "checkEvent",
        &[UnknownMachine, UnknownEntity, UnknownEvent, EntityDeleted, InvalidParameters, Internal, Unavailable],
    ),
    (
        "raiseEvent",
        &[
            UnknownMachine,
            UnknownEntity,
            UnknownEvent,
            EntityDeleted,
            EntityKilled,
            EventRejected,
            KeyReused,
            InvalidParameters,
            EventFailed,
            WaitTimeout,
            Internal,
            Unavailable,
        ],
    ),
    ("pauseEntity", LIFECYCLE),
    ("resumeEntity", LIFECYCLE),
    ("sleepEntity", LIFECYCLE),
    ("killEntity", LIFECYCLE),
    ("releaseEntity", LIFECYCLE),
    ("retryEntity", LIFECYCLE),
    ("listOperations", &[Internal, Unavailable]),
    ("followFeed", &[UnknownMachine, Internal, Unavailable]),
    ("getOperation", &[UnknownOperation, Internal, Unavailable]),
    ("getOperationTrace", &[UnknownOperation, Internal, Unavailable]),
    ("cancelOperation", &[UnknownOperation, OperationEnded, InvalidBulk, Internal, Unavailable]),
    ("getOverview", &[Internal, Unavailable]),
    ("listLimits", &[Internal, Unavailable]),
    ("startBulk", &[InvalidBulk, UnknownMachine, Internal, Unavailable]),
    ("listBulk", &[Internal, Unavailable]),
    ("listSchedules", &[Internal, Unavailable]),
    ("pauseSchedule", &[UnknownMachine, UnknownSchedule, Internal, Unavailable]),
    ("resumeSchedule", &[UnknownMachine, UnknownSchedule, Internal, Unavailable]),
    ("getBulk", &[UnknownBulk, Internal, Unavailable]),
    ("cancelBulk", &[UnknownBulk, Internal, Unavailable]),
    ("leaseTasks", &[UnknownQueue, TooManyPolls, Internal, Unavailable]),
    ("heartbeatTask", &[UnknownTask, TaskRefused, Internal, Unavailable]),
    ("completeTask", &[UnknownTask, TaskRefused, InvalidReport, InvalidKey, UnknownQueue, Internal, Unavailable]),
    ("failTask", &[UnknownTask, TaskRefused, UnknownQueue, Internal, Unavailable]),
    ("reportTasks", &[UnknownQueue, InvalidKey, Internal, Unavailable]),
];

/// The problems of every lifecycle command.
const LIFECYCLE: &[Kind] =
    &[UnknownMachine, UnknownEntity, EntityKilled, EntityDeleted, KeyReused, Internal, Unavailable];

/// What an operation's shape implies it can answer: 503 `request-timeout`, 403
/// `host-not-allowed` and `origin-not-allowed`, 429 `auth-throttled` (any request); a
/// bad path, query or header (400); 415 for a request that can change something without
/// JSON or a token (any `POST`);
/// a body that is malformed, too large, of another media type or of the wrong shape; a
/// token refused (401, 403) or over its rate limit (429 `rate-limited`) on a guarded route.
fn shape_problems(method: &str, op: &Value) -> Vec<Kind> {
    // Any request may outlast the server's request timeout, and is checked against what a
    // web page can make a browser send (`crate::browser`) and against token guessing.
    let mut kinds = vec![RequestTimeout, HostNotAllowed, OriginNotAllowed, AuthThrottled];
    if method != "get" && method != "head" {
        kinds.push(UnsupportedMediaType);
    }
    if op["parameters"].as_array().is_some_and(|p| !p.is_empty()) {
        kinds.push(BadRequest);
    }
    if op.get("requestBody").is_some() {
        kinds.extend([MalformedJson, BodyTooLarge, UnsupportedMediaType, InvalidBody]);
    }
    if op["security"].as_array().is_some_and(|s| !s.is_empty()) {
        kinds.extend([Unauthorized, Forbidden, RateLimited]);
    }
    kinds
}

/// An optional request body (an event's parameters) is typed as the object it is, not as
/// `object | null`: a body is sent or it is not, and a client generated from the document
/// (openapi-python-client) cannot serialise its "unset" default into a nullable body.
fn optional_body_is_not_null(op: &mut Value) {
    let Some(body) = op.get_mut("requestBody") else { return };
    if body.get("required").and_then(Value::as_bool) == Some(true) {
        return;
    }
    let Some(schema) = body.pointer_mut("/content/application~1json/schema") else { return };
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            schema["type"] = only.clone();
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(alternatives)) = schema.get_mut(key) {
            alternatives.retain(|a| a.get("type").and_then(Value::as_str) != Some("null"));
            if let [only] = alternatives.as_slice() {
                let only = only.clone();
                schema.as_object_mut().expect("a schema object").remove(key);
                if let (Some(target), Some(source)) = (schema.as_object_mut(), only.as_object()) {
                    target.extend(source.clone());
                }
            }
        }
    }
}

/// Rewrites `doc` (the document as the routes' annotations build it) into the contract:
/// constraints and examples on every parameter and body field listed here, and for each
/// operation one response per error status whose schema names exactly the problem types
/// it can answer. Panics on an operation missing from [`PROBLEMS`] (caught by the tests).
pub fn document(doc: &mut Value) {
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        for (schema, field, rule) in FIELDS {
            if let Some(prop) = schemas.get_mut(*schema).and_then(|s| s.pointer_mut(&format!("/properties/{field}"))) {
                constrain(prop, *rule);
            }
        }
    }
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for (method, op) in item.iter_mut() {
            let id = op["operationId"].as_str().unwrap_or_default().to_string();
            let declared = PROBLEMS
                .iter()
                .find(|(name, _)| *name == id)
                .unwrap_or_else(|| panic!("operation `{id}` is missing from contract::PROBLEMS"))
                .1;
            if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
                for p in params {
                    let (at, name) = (p["in"].as_str().unwrap_or("").to_string(), p["name"].as_str().unwrap_or(""));
                    if let Some((_, _, rule)) = PARAMS.iter().find(|(i, n, _)| *i == at && *n == name) {
                        constrain(&mut p["schema"], *rule);
                        if let Some(example) = example_of(*rule) {
                            p["example"] = example;
                        }
                    }
                }
            }
            optional_body_is_not_null(op);
            let mut kinds = shape_problems(method, op);
            for k in declared {
                if !kinds.contains(k) {
                    kinds.push(*k);
                }
            }
            let responses = op["responses"].as_object_mut().expect("every operation has responses");
            responses.retain(|status, _| !status.starts_with('4') && !status.starts_with('5'));
            let mut statuses: Vec<u16> = kinds.iter().map(|k| k.status().as_u16()).collect();
            statuses.sort_unstable();
            statuses.dedup();
            for status in statuses {
                let of_status: Vec<Kind> = kinds.iter().copied().filter(|k| k.status().as_u16() == status).collect();
                responses.insert(status.to_string(), problem_response(&of_status));
            }
        }
    }
}

/// A constraint as a JSON schema, replacing `schema` (nullable stays nullable).
fn constrain(schema: &mut Value, rule: Rule) {
    if let Rule::Count(r) = rule {
        schema["minItems"] = json!(r.min);
        schema["maxItems"] = json!(r.max);
        return;
    }
    let nullable = schema["type"].as_array().is_some_and(|t| t.iter().any(|t| t == "null"));
    let description = schema.get("description").cloned();
    let mut s = match rule {
        Rule::Text(t) => json!({"type": "string", "pattern": t.pattern}),
        Rule::Range(r) => json!({"type": "integer", "minimum": r.min, "maximum": r.max, "default": r.default}),
        Rule::Words(w) => json!({"type": "string", "enum": w}),
        Rule::Time => json!({"anyOf": [
            {"type": "string", "format": "date-time"},
            {"type": "string", "pattern": RELATIVE_TIME.pattern},
        ]}),
        Rule::When => json!({"anyOf": [
            {"type": "string", "format": "date-time"},
            {"type": "string", "pattern": SIGNED_TIME.pattern},
        ]}),
        Rule::Free(_) => {
            if schema.get("type").is_some() {
                return;
            }
            json!({"type": "string"})
        }
        Rule::Count(_) => unreachable!("handled above"),
    };
    if nullable && let Some(t) = s.get_mut("type") {
        *t = json!([t.clone(), "null"]);
    }
    if let Some(d) = description {
        s["description"] = d;
    }
    *schema = s;
}

fn example_of(rule: Rule) -> Option<Value> {
    match rule {
        Rule::Text(t) => Some(json!(t.example)),
        Rule::Range(r) => Some(json!(r.default)),
        Rule::Words(w) => Some(json!(w[0])),
        Rule::Time => Some(json!(RELATIVE_TIME.example)),
        Rule::When => Some(json!(SIGNED_TIME.example)),
        Rule::Free("") | Rule::Count(_) => None,
        Rule::Free(e) => Some(json!(e)),
    }
}

/// The response of one error status: the problem schema with `type` restricted to the
/// kinds' types, an example of each, and the headers those problems carry.
fn problem_response(kinds: &[Kind]) -> Value {
    let status = kinds[0].status().as_u16();
    let types: Vec<String> = kinds.iter().map(|k| format!("{TYPE_BASE}{}", k.slug())).collect();
    let description = kinds.iter().map(|k| format!("`{}`: {}", k.slug(), k.title())).collect::<Vec<_>>().join("; ");
    let mut examples = Map::new();
    for k in kinds {
        examples.insert(
            k.slug().to_string(),
            json!({"value": {"type": format!("{TYPE_BASE}{}", k.slug()), "title": k.title(), "status": status, "detail": k.title()}}),
        );
    }
    let mut response = json!({
        "description": description,
        "content": {CONTENT_TYPE: {
            "schema": problem_schema(&types, status),
            "examples": examples,
        }},
    });
    let mut headers = Map::new();
    if kinds.contains(&Unauthorized) {
        headers.insert("WWW-Authenticate".into(), json!({"description": "`Bearer`", "schema": {"type": "string"}}));
    }
    if status == 429 {
        headers.insert(
            "Retry-After".into(),
            json!({"description": "seconds to wait before retrying", "schema": {"type": "string"}}),
        );
    }
    if !headers.is_empty() {
        response["headers"] = Value::Object(headers);
    }
    response
}

/// The problem document (the fields of [`crate::problem::ProblemBody`]) with `type` and
/// `status` narrowed to one status's kinds: self-contained, so client generators need not
/// merge schemas.
fn problem_schema(types: &[String], status: u16) -> Value {
    json!({
        "type": "object",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string", "enum": types, "description": "`https://settle.dev/problems/<slug>`."},
            "title": {"type": "string", "description": "Short summary of the kind of problem."},
            "status": {"type": "integer", "enum": [status], "description": "The HTTP status."},
            "detail": {"type": "string", "description": "What went wrong in this case."},
            "field": {"type": "string", "description": "The request field at fault, if any."},
        },
        "additionalProperties": true,
        "description": "A problem (RFC 9457); context members (machine, key, event, state, reason, ...) are extra properties.",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_optional_body_is_typed_without_null() {
        let body = |schema: Value, required: Option<bool>| {
            let mut op = json!({"requestBody": {"content": {"application/json": {"schema": schema}}}});
            if let Some(r) = required {
                op["requestBody"]["required"] = json!(r);
            }
            optional_body_is_not_null(&mut op);
            op["requestBody"]["content"]["application/json"]["schema"].clone()
        };
        assert_eq!(body(json!({"type": ["object", "null"]}), None), json!({"type": "object"}));
        assert_eq!(
            body(json!({"oneOf": [{"type": "null"}, {"type": "object", "description": "d"}]}), Some(false)),
            json!({"type": "object", "description": "d"})
        );
        // A required body is left as declared.
        assert_eq!(body(json!({"type": ["object", "null"]}), Some(true)), json!({"type": ["object", "null"]}));
    }

    #[test]
    fn patterns_say_what_the_server_accepts() {
        assert!(IDEMPOTENCY_KEY.matches("a.b_c~d:e-F9"));
        assert!(!IDEMPOTENCY_KEY.matches(""));
        assert!(!IDEMPOTENCY_KEY.matches("a b"));
        assert!(!IDEMPOTENCY_KEY.matches(&"k".repeat(201)));
        assert!(IDEMPOTENCY_KEY.matches(&"k".repeat(200)));
        assert!(KEY.matches("web 1/ü"));
        assert!(!KEY.matches(""));
        assert!(!KEY.matches("a\nb"));
        assert!(!KEY.matches("a\u{85}b"));
        assert!(KEY.matches(&"ü".repeat(256)), "characters, not bytes");
        assert!(!KEY.matches(&"k".repeat(257)));
        for d in ["30s", "1h30m", "250ms", "2d"] {
            assert!(DURATION.matches(d), "{d}");
            assert!(settle_core::duration::parse(d).is_ok(), "{d}");
        }
        for d in ["", "30", "s", " 30s", "30s ", "1x"] {
            assert!(!DURATION.matches(d), "{d:?}");
        }
        assert!(CURSOR.matches("42") && CURSOR.matches("server/web-1") && !CURSOR.matches("x") && !CURSOR.matches(""));
        assert_eq!(LIMIT.parse("100"), Some(100));
        assert_eq!(LIMIT.parse("+5"), None);
        assert_eq!(LIMIT.parse("0"), None);
        assert_eq!(LIMIT.parse("1001"), None);
        assert_eq!(LIMIT.parse("99999999999999999999999"), None);
    }

    #[test]
    fn bulk_actions_are_the_engines() {
        for a in BULK_ACTION {
            let event = (*a == "raise").then_some("e");
            assert!(settle_engine::BulkAction::parse(a, event, serde_json::Value::Null).is_ok(), "{a}");
        }
    }

    #[test]
    fn words_match_the_store() {
        for w in RUN_STATUS {
            assert!(settle_store::RunStatus::parse(w).is_some(), "{w}");
        }
    }

    #[test]
    fn every_problem_type_is_listed_once_per_operation() {
        for (op, kinds) in PROBLEMS {
            let mut seen = std::collections::HashSet::new();
            assert!(kinds.iter().all(|k| seen.insert(k.slug())), "{op}");
        }
        let r = problem_response(&[UnknownMachine, UnknownEntity]);
        let schema = &r["content"][CONTENT_TYPE]["schema"]["properties"];
        assert_eq!(schema["status"]["enum"], json!([404]));
        assert_eq!(schema["type"]["enum"][1], "https://settle.dev/problems/unknown-entity");
        let r = problem_response(&[RateLimited]);
        assert!(r["headers"]["Retry-After"].is_object(), "{r}");
    }

    #[test]
    fn guarded_operations_document_the_rate_limit_and_public_ones_do_not() {
        let guarded = json!({"security": [{"bearer": []}]});
        assert!(shape_problems("get", &guarded).contains(&RateLimited));
        assert!(!shape_problems("get", &json!({})).contains(&RateLimited));
        // Every operation: the browser checks and token guessing; a POST: simple requests.
        for op in [json!({}), guarded] {
            for k in [HostNotAllowed, OriginNotAllowed, AuthThrottled] {
                assert!(shape_problems("get", &op).contains(&k), "{k:?}");
            }
            assert!(!shape_problems("get", &op).contains(&UnsupportedMediaType));
            assert!(shape_problems("post", &op).contains(&UnsupportedMediaType));
        }
        let both = problem_response(&[TooManyPolls, RateLimited]);
        let types = &both["content"][CONTENT_TYPE]["schema"]["properties"]["type"]["enum"];
        assert_eq!(types, &json!([format!("{TYPE_BASE}too-many-polls"), format!("{TYPE_BASE}rate-limited")]));
        assert!(both["headers"]["Retry-After"].is_object(), "{both}");
    }
}
