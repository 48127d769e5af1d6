//! Rendering a machine as a Mermaid or Graphviz DOT diagram.
//!
//! Both formats draw the same graph, in declaration order so the text is deterministic:
//! every state; an arrow from the start to the initial state; for each state, the edges
//! of its auto action (labelled `auto: action` in DOT, `auto / action` in Mermaid, whose
//! transition labels cannot hold a colon) and of the events valid in it (labelled with
//! the event's name, followed in parentheses by what raises it on its own in that state:
//! `subscription`, `timer every 5m` or `timer after 10m` for a timer running there, and
//! `timeout after 10m` for the timeout of a subscription valid there); an arrow to the end from terminal and deleted states (Mermaid) or
//! a double circle (DOT). Unstable states are dashed and error-health states red.
//!
//! ```
//! use settle_core::graph::{self, Format};
//! use settle_core::MachineBuilder;
//! let m = MachineBuilder::new("door")
//!     .state("closed").initial()
//!     .state("open")
//!     .event("open", ["closed"], "do_open")
//!     .event("close", ["open"], "do_close")
//!     .action("do_open", ["open"])
//!     .action("do_close", ["closed"])
//!     .build()
//!     .unwrap();
//! let text = graph::render(&m, "mermaid".parse::<Format>().unwrap());
//! assert!(text.contains("    closed --> open : open\n"));
//! ```

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use crate::duration;
use crate::machine::{Event, Health, Machine, State, StateKind};

/// A diagram format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Mermaid `stateDiagram-v2` (renders in GitHub Markdown).
    Mermaid,
    /// Graphviz DOT (`dot -Tsvg`).
    Dot,
}

impl Format {
    /// The name used on the command line: `mermaid` or `dot`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Mermaid => "mermaid",
            Format::Dot => "dot",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A diagram format name that is neither `mermaid` nor `dot`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown diagram format `{0}` (expected `mermaid` or `dot`)")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "mermaid" => Ok(Format::Mermaid),
            "dot" => Ok(Format::Dot),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

/// Renders `machine` as a diagram in `format`. The text ends with a newline.
pub fn render(machine: &Machine, format: Format) -> String {
    match format {
        Format::Mermaid => mermaid(machine),
        Format::Dot => dot(machine),
    }
}

/// An edge of the diagram: `from -> to`, from an auto action or an event.
struct Edge<'m> {
    from: &'m str,
    to: &'m str,
    label: Label<'m>,
}

enum Label<'m> {
    Auto(&'m str),
    /// The event, and what raises it on its own in the source state.
    Event(&'m str, Vec<String>),
}

impl Label<'_> {
    /// The label text; `sep` follows `auto` (Mermaid labels cannot hold a colon).
    fn text(&self, sep: &str) -> String {
        match self {
            Label::Auto(a) => format!("auto{sep} {a}"),
            Label::Event(e, notes) if notes.is_empty() => e.to_string(),
            Label::Event(e, notes) => format!("{e} ({})", notes.join(", ")),
        }
    }
}

/// What raises `event` on its own while the entity is in `state`: its subscription, the
/// timers running there, the timeouts of subscriptions valid there.
fn raised_by(machine: &Machine, state: &str, event: &Event) -> Vec<String> {
    let mut notes = Vec::new();
    if event.subscribe.is_some() {
        notes.push("subscription".to_string());
    }
    for t in machine.timers_in(state).filter(|t| t.event == event.name) {
        notes.push(format!("timer {}", t.schedule));
    }
    for sub in machine.subscriptions_in(state).filter_map(|e| e.subscribe.as_ref()) {
        if let Some(t) = sub.timeout.as_ref().filter(|t| t.event == event.name) {
            notes.push(format!("timeout after {}", duration::format(t.after)));
        }
    }
    notes
}

/// Every edge, grouped by source state in declaration order: the auto action's targets
/// first, then those of each event valid in the state.
fn edges(machine: &Machine) -> Vec<Edge<'_>> {
    let mut out = Vec::new();
    for s in machine.states() {
        if let Some(action) = s.auto.as_ref().and_then(|a| machine.action(a)) {
            for t in &action.targets {
                out.push(Edge { from: &s.name, to: &t.state, label: Label::Auto(&action.name) });
            }
        }
        for e in machine.events().iter().filter(|e| e.valid_in(&s.name)) {
            let notes = raised_by(machine, &s.name, e);
            let actions = e.alternatives.iter().filter(|a| a.applies_at(&s.name)).filter_map(|a| a.action());
            for action in actions.filter_map(|a| machine.action(a)) {
                for t in &action.targets {
                    out.push(Edge { from: &s.name, to: &t.state, label: Label::Event(&e.name, notes.clone()) });
                }
            }
        }
    }
    out
}

fn is_final(s: &State) -> bool {
    matches!(s.kind, StateKind::Terminal | StateKind::Deleted)
}

fn mermaid(machine: &Machine) -> String {
    // A state's id is its name when Mermaid reads that as a plain id; otherwise `_<index>`,
    // declared with the name as its label. Plain ids start with a letter: no collision.
    let ids: Vec<String> = machine
        .states()
        .iter()
        .enumerate()
        .map(|(i, s)| if mermaid_plain_id(&s.name) { s.name.to_string() } else { format!("_{i}") })
        .collect();
    let by_name: HashMap<&str, &str> =
        machine.states().iter().zip(&ids).map(|(s, id)| (s.name.as_str(), id.as_str())).collect();
    let id = |name: &str| -> &str { by_name[name] };
    let mut out = String::from("stateDiagram-v2\n");
    for (s, sid) in machine.states().iter().zip(&ids) {
        if *sid == *s.name {
            let _ = writeln!(out, "    {sid}");
        } else {
            let _ = writeln!(out, "    state \"{}\" as {sid}", mermaid_text(&s.name).replace('"', "#quot;"));
        }
    }
    let _ = writeln!(out, "    [*] --> {}", id(&machine.initial().name));
    for e in edges(machine) {
        let _ = writeln!(out, "    {} --> {} : {}", id(e.from), id(e.to), mermaid_text(&e.label.text(" /")));
    }
    for (s, sid) in machine.states().iter().zip(&ids) {
        if is_final(s) {
            let _ = writeln!(out, "    {sid} --> [*]");
        }
    }
    let class = |pred: &dyn Fn(&State) -> bool| -> Vec<&str> {
        machine.states().iter().zip(&ids).filter(|(s, _)| pred(s)).map(|(_, id)| id.as_str()).collect()
    };
    let unstable = class(&|s| s.kind == StateKind::Unstable);
    let error = class(&|s| s.health == Health::Error);
    if !unstable.is_empty() {
        out.push_str("    classDef unstable stroke-dasharray:5 5\n");
        let _ = writeln!(out, "    class {} unstable", unstable.join(","));
    }
    if !error.is_empty() {
        out.push_str("    classDef error fill:#fdd,stroke:#c00,color:#900\n");
        let _ = writeln!(out, "    class {} error", error.join(","));
    }
    out
}

/// Whether Mermaid reads `name` as a plain state id: an ASCII letter, then letters,
/// digits and `_`, and not one of the diagram's keywords (matched case-insensitively).
fn mermaid_plain_id(name: &str) -> bool {
    const KEYWORDS: [&str; 12] = [
        "state",
        "note",
        "scale",
        "hide",
        "direction",
        "classdef",
        "class",
        "style",
        "click",
        "end",
        "acctitle",
        "accdescr",
    ];
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !KEYWORDS.contains(&name.to_ascii_lowercase().as_str())
}

/// Text safe in a Mermaid label: no line breaks, and `:`, `;` and `#` as entity codes.
fn mermaid_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '#' => out.push_str("#35;"),
            ':' => out.push_str("#58;"),
            ';' => out.push_str("#59;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn dot(machine: &Machine) -> String {
    let mut out = format!("digraph {} {{\n", dot_string(machine.name()));
    out.push_str("    rankdir=LR;\n");
    out.push_str("    node [shape=box, style=rounded];\n");
    // `[*]` cannot be a state's name, so the start node never collides with one.
    out.push_str("    \"[*]\" [shape=point, label=\"\"];\n");
    for s in machine.states() {
        let mut attrs: Vec<&str> = Vec::new();
        match s.kind {
            StateKind::Stable => {}
            StateKind::Unstable => attrs.push("style=\"rounded,dashed\""),
            StateKind::Terminal => attrs.push("shape=doublecircle"),
            StateKind::Deleted => attrs.extend(["shape=doublecircle", "style=dashed"]),
        }
        if s.health == Health::Error {
            attrs.extend(["color=red", "fontcolor=red"]);
        }
        if attrs.is_empty() {
            let _ = writeln!(out, "    {};", dot_string(&s.name));
        } else {
            let _ = writeln!(out, "    {} [{}];", dot_string(&s.name), attrs.join(", "));
        }
    }
    let _ = writeln!(out, "    \"[*]\" -> {};", dot_string(&machine.initial().name));
    for e in edges(machine) {
        let label = dot_string(&e.label.text(":"));
        let _ = writeln!(out, "    {} -> {} [label={label}];", dot_string(e.from), dot_string(e.to));
    }
    out.push_str("}\n");
    out
}

/// A DOT quoted string: `"` and `\` escaped, line breaks as `\n`.
fn dot_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    /// Every kind of state and edge a diagram draws. The expected diagrams are beside its
    /// definition, in `testdata/diagrams/`.
    fn server() -> Machine {
        crate::toml::load("server.toml", "server", include_str!("testdata/diagrams/server.toml")).unwrap().0
    }

    #[test]
    fn mermaid_diagram() {
        assert_eq!(render(&server(), Format::Mermaid), include_str!("testdata/diagrams/server.mmd"));
    }

    #[test]
    fn dot_diagram() {
        assert_eq!(render(&server(), Format::Dot), include_str!("testdata/diagrams/server.dot"));
    }

    /// The reference subscriber without its failure subscription, its retry timer running
    /// in `ready` too: subscriptions with a timeout, and timers.
    fn subscriber() -> Machine {
        let mut def = fixtures::subscriber().def().clone();
        def.events.retain(|e| e.name != "resources_failed");
        def.timers[1].valid_in.push("ready".into());
        Machine::from_def(&def).unwrap().0
    }

    #[test]
    fn subscriptions_and_timers_are_labelled() {
        assert_eq!(render(&subscriber(), Format::Mermaid), include_str!("testdata/diagrams/subscriber.mmd"));
        assert_eq!(render(&subscriber(), Format::Dot), include_str!("testdata/diagrams/subscriber.dot"));
    }

    #[test]
    fn formats_parse_and_display() {
        assert_eq!("mermaid".parse::<Format>(), Ok(Format::Mermaid));
        assert_eq!("DOT".parse::<Format>(), Ok(Format::Dot));
        assert_eq!(
            "svg".parse::<Format>().unwrap_err().to_string(),
            "unknown diagram format `svg` (expected `mermaid` or `dot`)"
        );
        assert_eq!(Format::Dot.to_string(), "dot");
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(dot_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(mermaid_text("a:b;c#d"), "a#58;b#59;c#35;d");
        assert!(mermaid_plain_id("ready_2"));
        for not_plain in ["old-ready", "2fast", "_x", "state", "Note", "end", ""] {
            assert!(!mermaid_plain_id(not_plain), "{not_plain}");
        }
    }
}
