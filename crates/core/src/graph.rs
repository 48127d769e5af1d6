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
//! All three draw the edges of [`crate::edges`]; [`Format::Svg`] as an SVG image laid out
//! by [`crate::svg`].
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

use crate::edges::{edges, notes};
use crate::machine::{Health, Machine, State, StateKind};

/// A diagram format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Mermaid `stateDiagram-v2` (renders in GitHub Markdown).
    Mermaid,
    /// Graphviz DOT (`dot -Tsvg`).
    Dot,
    /// An SVG image, laid out by [`crate::svg`] (no Graphviz needed).
    Svg,
}

impl Format {
    /// The name used on the command line: `mermaid`, `dot` or `svg`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Mermaid => "mermaid",
            Format::Dot => "dot",
            Format::Svg => "svg",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A diagram format name that is none of `mermaid`, `dot` and `svg`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown diagram format `{0}` (expected `mermaid`, `dot` or `svg`)")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "mermaid" => Ok(Format::Mermaid),
            "dot" => Ok(Format::Dot),
            "svg" => Ok(Format::Svg),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

/// Renders `machine` as a diagram in `format`. The text ends with a newline.
pub fn render(machine: &Machine, format: Format) -> String {
    match format {
        Format::Mermaid => mermaid(machine),
        Format::Dot => dot(machine),
        Format::Svg => crate::svg::render(machine),
    }
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
    let declare = |out: &mut String, s: &State, sid: &str, indent: &str| {
        if *sid == *s.name {
            let _ = writeln!(out, "{indent}{sid}");
        } else {
            let _ = writeln!(out, "{indent}state \"{}\" as {sid}", mermaid_text(&s.name).replace('"', "#quot;"));
        }
    };
    // Composite states hold their substates, recursively.
    fn nest(
        machine: &Machine,
        parent: Option<&str>,
        depth: usize,
        out: &mut String,
        id: &dyn Fn(&str) -> String,
        declare: &dyn Fn(&mut String, &State, &str, &str),
    ) {
        let indent = "    ".repeat(depth + 1);
        for s in machine.states().iter().filter(|s| s.parent.as_deref() == parent) {
            let sid = id(&s.name);
            match &s.initial_child {
                Some(child) => {
                    if *sid != *s.name {
                        declare(out, s, &sid, &indent);
                    }
                    let _ = writeln!(out, "{indent}state {sid} {{");
                    let _ = writeln!(out, "{indent}    [*] --> {}", id(child));
                    nest(machine, Some(&s.name), depth + 1, out, id, declare);
                    let _ = writeln!(out, "{indent}}}");
                }
                None => declare(out, s, &sid, &indent),
            }
        }
    }
    if machine.is_nested() {
        nest(machine, None, 0, &mut out, &|n| id(n).to_string(), &declare);
    } else {
        for (s, sid) in machine.states().iter().zip(&ids) {
            declare(&mut out, s, sid, "    ");
        }
    }
    let _ = writeln!(out, "    [*] --> {}", id(&machine.initial_declared().name));
    for e in edges(machine) {
        let _ = writeln!(out, "    {} --> {} : {}", id(e.from), id(e.to), mermaid_text(&e.label.text(" /")));
    }
    for (s, sid) in machine.states().iter().zip(&ids) {
        if is_final(s) {
            let _ = writeln!(out, "    {sid} --> [*]");
        }
    }
    for (s, sid) in machine.states().iter().zip(&ids) {
        let notes = notes(machine, s, " /");
        if !notes.is_empty() {
            let _ = writeln!(out, "    note right of {sid} : {}", mermaid_text(&notes.join(", ")));
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
    if machine.is_nested() {
        out.push_str("    compound=true;\n");
    }
    out.push_str("    node [shape=box, style=rounded];\n");
    // `[*]` cannot be a state's name, so the start node never collides with one.
    out.push_str("    \"[*]\" [shape=point, label=\"\"];\n");
    dot_states(machine, None, 1, &mut out);
    // A parent is a cluster, not a node: edges to it end at its initial leaf, edges from it
    // start at that leaf, each clipped at the cluster's border.
    let node = |name: &str| -> (String, Option<String>) {
        match machine.state(name) {
            Some(s) if s.is_parent() => {
                (dot_string(&machine.descend(name).name), Some(dot_string(&format!("cluster_{name}"))))
            }
            _ => (dot_string(name), None),
        }
    };
    let (start, lhead) = node(&machine.initial_declared().name);
    match lhead {
        Some(cluster) => {
            let _ = writeln!(out, "    \"[*]\" -> {start} [lhead={cluster}];");
        }
        None => {
            let _ = writeln!(out, "    \"[*]\" -> {start};");
        }
    }
    for e in edges(machine) {
        let label = dot_string(&e.label.text(":"));
        let ((from, mut ltail), (to, mut lhead)) = (node(e.from), node(e.to));
        // An edge between a parent and its own substate stays inside the cluster.
        if machine.is_in(e.to, e.from) {
            ltail = None;
        }
        if machine.is_in(e.from, e.to) {
            lhead = None;
        }
        let mut attrs = format!("label={label}");
        if let Some(c) = ltail {
            attrs.push_str(&format!(", ltail={c}"));
        }
        if let Some(c) = lhead {
            attrs.push_str(&format!(", lhead={c}"));
        }
        let _ = writeln!(out, "    {from} -> {to} [{attrs}];");
    }
    out.push_str("}\n");
    out
}

/// The states under `parent` (`None`: the top level), parents as clusters, recursively.
fn dot_states(machine: &Machine, parent: Option<&str>, depth: usize, out: &mut String) {
    let indent = "    ".repeat(depth);
    for s in machine.states().iter().filter(|s| s.parent.as_deref() == parent) {
        if s.is_parent() {
            let _ = writeln!(out, "{indent}subgraph {} {{", dot_string(&format!("cluster_{}", s.name)));
            let label = std::iter::once(s.name.to_string()).chain(notes(machine, s, ":")).collect::<Vec<_>>();
            let _ = writeln!(out, "{indent}    label={};", dot_string(&label.join("\n")));
            out.push_str(&format!("{indent}    style=rounded;\n"));
            if s.health == Health::Error {
                out.push_str(&format!("{indent}    color=red;\n"));
            }
            dot_states(machine, Some(&s.name), depth + 1, out);
            let _ = writeln!(out, "{indent}}}");
            continue;
        }
        let mut attrs: Vec<String> = Vec::new();
        match s.kind {
            StateKind::Stable => {}
            StateKind::Unstable => attrs.push("style=\"rounded,dashed\"".into()),
            StateKind::Terminal => attrs.push("shape=doublecircle".into()),
            StateKind::Deleted => attrs.extend(["shape=doublecircle".into(), "style=dashed".into()]),
        }
        if s.health == Health::Error {
            attrs.extend(["color=red".into(), "fontcolor=red".into()]);
        }
        let notes = notes(machine, s, ":");
        if !notes.is_empty() {
            let label = std::iter::once(s.name.to_string()).chain(notes).collect::<Vec<_>>().join("\n");
            attrs.push(format!("label={}", dot_string(&label)));
        }
        if attrs.is_empty() {
            let _ = writeln!(out, "{indent}{};", dot_string(&s.name));
        } else {
            let _ = writeln!(out, "{indent}{} [{}];", dot_string(&s.name), attrs.join(", "));
        }
    }
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

    /// A statechart: substates in a composite state (Mermaid) or a cluster (DOT), entry
    /// and exit actions and internal transitions as notes.
    #[test]
    fn nested_diagrams() {
        let m = fixtures::instance();
        assert_eq!(render(&m, Format::Mermaid), include_str!("testdata/diagrams/instance.mmd"));
        assert_eq!(render(&m, Format::Dot), include_str!("testdata/diagrams/instance.dot"));
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

    /// Statecharts to the letter: a parent's history as a note, a re-entry as a loop on the
    /// state re-entered, an event raised on the entity itself on the edge that raises it.
    #[test]
    fn history_re_entry_and_internal_events_are_drawn() {
        let text = r#"
initial = "off"
[states.off]
[states.on]
initial = "radio"
history = "deep"
[states.radio]
parent = "on"
[states.cd]
parent = "on"
[events.power]
in = ["off"]
action = "switch_on"
[events.tune]
in = ["on"]
action = "to_radio"
[events.check]
in = ["radio"]
ignore = ["off"]
action = "probe"
[events.stop]
in = ["on"]
action = "switch_off"
[events.eject]
in = ["radio"]
action = "to_cd"
[actions.switch_on]
to = ["on"]
raise = [{ event = "check", on = "self" }]
[actions.to_radio]
to = ["radio"]
[actions.probe]
to = ["radio"]
[actions.switch_off]
to = ["off"]
[actions.to_cd]
to = ["cd"]
"#;
        let m = crate::toml::load("player.toml", "player", text).unwrap().0;
        let mermaid = render(&m, Format::Mermaid);
        for line in [
            "off --> on : power (then check)",
            "note right of off : check ignored",
            "on --> radio : tune",
            "radio --> radio : tune (re-entry)",
            "radio --> radio : check (re-entry)",
            "note right of on : history / deep",
        ] {
            assert!(mermaid.contains(line), "{line}\n{mermaid}");
        }
        let dot = render(&m, Format::Dot);
        assert!(dot.contains("history: deep"), "{dot}");
        assert!(dot.contains("power (then check)"), "{dot}");
    }

    #[test]
    fn formats_parse_and_display() {
        assert_eq!("mermaid".parse::<Format>(), Ok(Format::Mermaid));
        assert_eq!("DOT".parse::<Format>(), Ok(Format::Dot));
        assert_eq!("Svg".parse::<Format>(), Ok(Format::Svg));
        assert_eq!(
            "png".parse::<Format>().unwrap_err().to_string(),
            "unknown diagram format `png` (expected `mermaid`, `dot` or `svg`)"
        );
        assert_eq!(Format::Dot.to_string(), "dot");
        assert_eq!(Format::Svg.to_string(), "svg");
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
