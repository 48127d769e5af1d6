//! Subscription patterns: conditions over an entity's successors (DESIGN §1, "Successors
//! and subscriptions").
//!
//! A subscription event declares a pattern; the runtime evaluates it over a snapshot of
//! the subscriber's successors ([`SuccessorView`]) and raises the event when it holds.
//!
//! Grammar (whitespace between tokens is ignored; keywords are lowercase):
//!
//! ```text
//! pattern := quant "(" filter ")" cond
//!          | "count" "(" filter cond ")" cmp INTEGER
//! quant   := "all" | "any" | "none"
//! filter  := "*" | NAME | "type=" NAME        (NAME: the successor's machine)
//! cond    := "in" "[" NAME ("," NAME)* "]"     (NAME: a state)
//!          | "health" ("error" | "ok")
//! cmp     := ">=" | ">" | "==" | "<=" | "<"
//! NAME    := [A-Za-z0-9_-]+
//! INTEGER := [0-9]+
//! ```
//!
//! `NAME` and `type=NAME` are the same filter; [`Pattern`]'s `Display` writes the bare
//! name. Examples: `all(*) in [ready]`, `all(app) in [ready]`, `any(*) health error`,
//! `none(db) in [failed, gone]`, `count(type=db in [ready]) >= 2`.
//!
//! ```
//! use settle_core::Health;
//! use settle_core::pattern::{Pattern, SuccessorView};
//! let p = Pattern::parse("count(type=db in [ready]) >= 2").unwrap();
//! assert_eq!(p.to_string(), "count(db in [ready]) >= 2");
//! let db = |key, state| SuccessorView { machine: "db", key, state, ancestors: &[], health: Health::Ok };
//! assert_eq!(p.eval(&[db("a", "ready"), db("b", "creating"), db("c", "ready")]), Some(vec![0, 2]));
//! assert_eq!(p.eval(&[db("a", "ready")]), None);
//! ```

use std::fmt;

use crate::machine::def::Health;
use crate::names::{MachineName, StateName};

/// A parsed subscription pattern. Build one with [`Pattern::parse`]; its `Display` is the
/// canonical text, which parses back to an equal pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pattern {
    quantifier: Quantifier,
    filter: Filter,
    condition: Condition,
}

/// How many of the filtered successors must satisfy the condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantifier {
    /// `all(...)`: at least one successor passes the filter, and every one that does
    /// satisfies the condition.
    All,
    /// `any(...)`: at least one filtered successor satisfies the condition.
    Any,
    /// `none(...)`: no filtered successor satisfies the condition (true when there are none).
    None,
    /// `count(...) cmp n`: the number of filtered successors satisfying the condition,
    /// compared with `n`.
    Count(Comparison, u64),
}

/// Which successors a pattern looks at, by machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Filter {
    /// `*`: every successor.
    AnyMachine,
    /// `NAME` or `type=NAME`: successors of that machine.
    Machine(MachineName),
}

impl Filter {
    /// Whether a successor of `machine` passes the filter.
    pub fn matches(&self, machine: &str) -> bool {
        match self {
            Filter::AnyMachine => true,
            Filter::Machine(m) => m == machine,
        }
    }
}

/// What a filtered successor is tested for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Condition {
    /// `in [a, b]`: its state is one of these (declaration order kept).
    InStates(Vec<StateName>),
    /// `health error` / `health ok`: its state has this health.
    Health(Health),
}

impl Condition {
    /// Whether a successor in `state` (a substate of `ancestors`) with `health` satisfies
    /// the condition: `in [p]` holds in `p` and in every substate of `p`.
    pub fn holds(&self, state: &str, ancestors: &[&str], health: Health) -> bool {
        match self {
            Condition::InStates(states) => states.iter().any(|s| s == state || ancestors.contains(&s.as_str())),
            Condition::Health(h) => *h == health,
        }
    }
}

/// The comparison of a `count(...)` pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Comparison {
    /// `>=`
    Ge,
    /// `>`
    Gt,
    /// `==`
    Eq,
    /// `<=`
    Le,
    /// `<`
    Lt,
}

impl Comparison {
    /// The operator as written: `>=`, `>`, `==`, `<=` or `<`.
    pub fn as_str(self) -> &'static str {
        match self {
            Comparison::Ge => ">=",
            Comparison::Gt => ">",
            Comparison::Eq => "==",
            Comparison::Le => "<=",
            Comparison::Lt => "<",
        }
    }

    /// Whether `count <op> n` holds.
    pub fn holds(self, count: u64, n: u64) -> bool {
        match self {
            Comparison::Ge => count >= n,
            Comparison::Gt => count > n,
            Comparison::Eq => count == n,
            Comparison::Le => count <= n,
            Comparison::Lt => count < n,
        }
    }
}

/// One successor as the pattern sees it: what the runtime reads from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuccessorView<'a> {
    /// The successor's machine.
    pub machine: &'a str,
    /// The successor's entity key.
    pub key: &'a str,
    /// The successor's current state.
    pub state: &'a str,
    /// The states that state is a substate of, innermost first (empty on a flat machine):
    /// `in [active]` holds for a successor in any substate of `active`.
    pub ancestors: &'a [&'a str],
    /// The health of that state (see [`Machine::health_of`](crate::Machine::health_of)).
    pub health: Health,
}

/// How far a [`Pattern`] is from holding (see [`Pattern::progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Successors the filter selects.
    pub selected: u64,
    /// Of those, the ones satisfying the condition.
    pub satisfying: u64,
    /// Whether the pattern holds.
    pub holds: bool,
}

impl Pattern {
    /// Parses a pattern (see the module documentation for the grammar). The error says
    /// what was expected where, e.g. "expected `(` after `all` at column 4" (columns count
    /// characters from 1).
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let mut p = Parser { chars: text.chars().collect(), pos: 0 };
        let pattern = p.pattern()?;
        p.skip_ws();
        if let Some(c) = p.peek() {
            return Err(format!("unexpected `{c}` at column {} (expected the end of the pattern)", p.column()));
        }
        Ok(pattern)
    }

    /// The quantifier (`all`, `any`, `none` or `count ... cmp n`).
    pub fn quantifier(&self) -> Quantifier {
        self.quantifier
    }
    /// The filter selecting successors by machine.
    pub fn filter(&self) -> &Filter {
        &self.filter
    }
    /// The condition tested on each filtered successor.
    pub fn condition(&self) -> &Condition {
        &self.condition
    }

    /// Evaluates the pattern over a snapshot of the subscriber's successors.
    ///
    /// Returns `None` when the pattern does not hold, otherwise the indices (into
    /// `successors`, ascending) of the successors that made it hold: for `all`, every
    /// filtered successor; for `any` and `count`, those satisfying the condition; for
    /// `none`, no index.
    ///
    /// `all` does not hold over an empty set (no successor passes the filter): the
    /// subscriber may enter its waiting state before its successors exist (or before
    /// the first of a given machine is created), and it must not fire then.
    /// `none` does hold over an empty set, and `count` counts zero.
    pub fn eval(&self, successors: &[SuccessorView<'_>]) -> Option<Vec<usize>> {
        let filtered: Vec<usize> =
            successors.iter().enumerate().filter(|(_, s)| self.filter.matches(s.machine)).map(|(i, _)| i).collect();
        let satisfying: Vec<usize> = filtered
            .iter()
            .copied()
            .filter(|&i| self.condition.holds(successors[i].state, successors[i].ancestors, successors[i].health))
            .collect();
        let holds = match self.quantifier {
            Quantifier::All => !filtered.is_empty() && satisfying.len() == filtered.len(),
            Quantifier::Any => !satisfying.is_empty(),
            Quantifier::None => satisfying.is_empty(),
            Quantifier::Count(cmp, n) => cmp.holds(satisfying.len() as u64, n),
        };
        holds.then(|| match self.quantifier {
            Quantifier::All => filtered,
            Quantifier::None => Vec::new(),
            Quantifier::Any | Quantifier::Count(..) => satisfying,
        })
    }

    /// How far the pattern is from holding over `successors`: how many its filter
    /// selects, how many of those satisfy its condition, and whether it holds (as
    /// [`Pattern::eval`] decides).
    pub fn progress(&self, successors: &[SuccessorView<'_>]) -> Progress {
        let selected: Vec<&SuccessorView<'_>> = successors.iter().filter(|s| self.filter.matches(s.machine)).collect();
        let satisfying = selected.iter().filter(|s| self.condition.holds(s.state, s.ancestors, s.health)).count();
        Progress {
            selected: selected.len() as u64,
            satisfying: satisfying as u64,
            holds: self.eval(successors).is_some(),
        }
    }

    /// Problems that need no other machine to see: duplicate states in `in [...]`, and
    /// counts that can never hold (`< 0`) or always hold (`>= 0`). Those that need the
    /// machines named are found by [`Pattern::check`] and [`Pattern::check_against`], which
    /// live with validation ([`crate::validate`]), where machines are known.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Condition::InStates(states) = &self.condition {
            let mut reported: Vec<&str> = Vec::new();
            for (i, s) in states.iter().enumerate() {
                if states[..i].contains(s) && !reported.contains(&s.as_str()) {
                    reported.push(s);
                    out.push(format!("duplicate state `{s}` in `in [...]`"));
                }
            }
        }
        match self.quantifier {
            Quantifier::Count(Comparison::Lt, 0) => out.push("`count(...) < 0` can never hold".to_string()),
            Quantifier::Count(Comparison::Ge, 0) => out.push("`count(...) >= 0` always holds".to_string()),
            _ => {}
        }
        out
    }
}

impl fmt::Display for Quantifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Quantifier::All => "all",
            Quantifier::Any => "any",
            Quantifier::None => "none",
            Quantifier::Count(..) => "count",
        })
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Filter::AnyMachine => f.write_str("*"),
            Filter::Machine(m) => f.write_str(m),
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::InStates(states) => {
                f.write_str("in [")?;
                for (i, s) in states.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(s)?;
                }
                f.write_str("]")
            }
            Condition::Health(Health::Ok) => f.write_str("health ok"),
            Condition::Health(Health::Error) => f.write_str("health error"),
        }
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The canonical form: `all(*) in [ready]`, `count(db health ok) >= 2`.
impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.quantifier {
            Quantifier::Count(cmp, n) => write!(f, "count({} {}) {cmp} {n}", self.filter, self.condition),
            q => write!(f, "{q}({}) {}", self.filter, self.condition),
        }
    }
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::parse(s)
    }
}

/// A recursive-descent parser over the pattern's characters.
struct Parser {
    chars: Vec<char>,
    pos: usize,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl Parser {
    fn skip_ws(&mut self) {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
    }
    /// The next character after whitespace, not consumed.
    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.chars.get(self.pos).copied()
    }
    /// The 1-based column of the next character (after whitespace).
    fn column(&mut self) -> usize {
        self.skip_ws();
        self.pos + 1
    }
    fn expected(&mut self, what: &str) -> String {
        format!("expected {what} at column {}", self.column())
    }
    /// Consumes `token` if the input continues with it (after whitespace).
    fn eat(&mut self, token: &str) -> bool {
        self.skip_ws();
        let n = token.chars().count();
        if self.chars.len() >= self.pos + n && self.chars[self.pos..self.pos + n].iter().copied().eq(token.chars()) {
            self.pos += n;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, token: &str, what: &str) -> Result<(), String> {
        if self.eat(token) { Ok(()) } else { Err(self.expected(what)) }
    }
    /// A maximal run of name characters, or `None` (nothing consumed).
    fn name(&mut self) -> Option<String> {
        self.skip_ws();
        let start = self.pos;
        while self.chars.get(self.pos).is_some_and(|&c| is_name_char(c)) {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.chars[start..self.pos].iter().collect())
    }

    fn pattern(&mut self) -> Result<Pattern, String> {
        let start = self.pos;
        let keyword = self.name();
        let quantifier = match keyword.as_deref() {
            Some("all") => Quantifier::All,
            Some("any") => Quantifier::Any,
            Some("none") => Quantifier::None,
            Some("count") => Quantifier::Count(Comparison::Ge, 0),
            _ => {
                self.pos = start;
                return Err(self.expected("`all`, `any`, `none` or `count`"));
            }
        };
        let keyword = keyword.unwrap_or_default();
        self.expect("(", &format!("`(` after `{keyword}`"))?;
        let filter = self.filter()?;
        if let Quantifier::Count(..) = quantifier {
            let condition = self.condition()?;
            self.expect(")", "`)` after the condition")?;
            let cmp = self.comparison()?;
            let n = self.integer(cmp)?;
            return Ok(Pattern { quantifier: Quantifier::Count(cmp, n), filter, condition });
        }
        self.expect(")", "`)` after the filter")?;
        let condition = self.condition()?;
        Ok(Pattern { quantifier, filter, condition })
    }

    fn filter(&mut self) -> Result<Filter, String> {
        if self.eat("*") {
            return Ok(Filter::AnyMachine);
        }
        let name = self.name().ok_or_else(|| self.expected("`*`, a machine name or `type=NAME`"))?;
        if name == "type" && self.eat("=") {
            let machine = self.name().ok_or_else(|| self.expected("a machine name after `type=`"))?;
            return Ok(Filter::Machine(MachineName::new(machine)));
        }
        Ok(Filter::Machine(MachineName::new(name)))
    }

    fn condition(&mut self) -> Result<Condition, String> {
        let start = self.pos;
        match self.name().as_deref() {
            Some("in") => {
                self.expect("[", "`[` after `in`")?;
                let mut states = Vec::new();
                loop {
                    let state = self.name().ok_or_else(|| self.expected("a state name"))?;
                    states.push(StateName::new(state));
                    if self.eat("]") {
                        return Ok(Condition::InStates(states));
                    }
                    self.expect(",", "`,` or `]`")?;
                }
            }
            Some("health") => {
                let start = self.pos;
                match self.name().as_deref() {
                    Some("error") => Ok(Condition::Health(Health::Error)),
                    Some("ok") => Ok(Condition::Health(Health::Ok)),
                    _ => {
                        self.pos = start;
                        Err(self.expected("`error` or `ok` after `health`"))
                    }
                }
            }
            _ => {
                self.pos = start;
                Err(self.expected("`in [...]` or `health`"))
            }
        }
    }

    fn comparison(&mut self) -> Result<Comparison, String> {
        // Two-character operators first, so `>=` is not read as `>`.
        for cmp in [Comparison::Ge, Comparison::Le, Comparison::Eq, Comparison::Gt, Comparison::Lt] {
            if self.eat(cmp.as_str()) {
                return Ok(cmp);
            }
        }
        Err(self.expected("`>=`, `>`, `==`, `<=` or `<` after `count(...)`"))
    }

    fn integer(&mut self, cmp: Comparison) -> Result<u64, String> {
        self.skip_ws();
        let start = self.pos;
        while self.chars.get(self.pos).is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.expected(&format!("a non-negative integer after `{cmp}`")));
        }
        let digits: String = self.chars[start..self.pos].iter().collect();
        digits.parse().map_err(|_| format!("integer `{digits}` is too large at column {}", start + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Pattern {
        Pattern::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn parses_every_form() {
        let all = p("all(*) in [ready]");
        assert_eq!(all.quantifier(), Quantifier::All);
        assert_eq!(all.filter(), &Filter::AnyMachine);
        assert_eq!(all.condition(), &Condition::InStates(vec!["ready".into()]));
        let none = p("none(db) in [failed, gone]");
        assert_eq!(none.quantifier(), Quantifier::None);
        assert_eq!(none.filter(), &Filter::Machine("db".into()));
        assert_eq!(none.condition(), &Condition::InStates(vec!["failed".into(), "gone".into()]));
        let any = p("any(*) health error");
        assert_eq!((any.quantifier(), any.condition()), (Quantifier::Any, &Condition::Health(Health::Error)));
        let count = p("count(type=db in [ready]) >= 2");
        assert_eq!(count.quantifier(), Quantifier::Count(Comparison::Ge, 2));
        assert_eq!(count.filter(), &Filter::Machine("db".into()));
        // `type=NAME` and `NAME` are the same filter.
        assert_eq!(count, p("count(db in [ready]) >= 2"));
        // A machine may be called `type`, `in` or `health`.
        assert_eq!(p("all(type) health ok").filter(), &Filter::Machine("type".into()));
        assert_eq!(p("count(in in [x]) > 0").filter(), &Filter::Machine("in".into()));
        assert_eq!(p("any(type=health) health ok").filter(), &Filter::Machine("health".into()));
        for (text, cmp) in
            [("<", Comparison::Lt), ("<=", Comparison::Le), ("==", Comparison::Eq), (">", Comparison::Gt)]
        {
            assert_eq!(p(&format!("count(* health ok) {text} 3")).quantifier(), Quantifier::Count(cmp, 3));
        }
    }

    #[test]
    fn progress_counts_selected_and_satisfying() {
        let s = |machine, state| SuccessorView { machine, key: "k", state, ancestors: &[], health: Health::Ok };
        let kids = [s("db", "ready"), s("db", "creating"), s("app", "ready")];
        let progress = |text: &str| p(text).progress(&kids);
        assert_eq!(progress("all(db) in [ready]"), Progress { selected: 2, satisfying: 1, holds: false });
        assert_eq!(progress("all(*) in [ready, creating]"), Progress { selected: 3, satisfying: 3, holds: true });
        assert_eq!(progress("count(db in [ready]) >= 1"), Progress { selected: 2, satisfying: 1, holds: true });
        assert_eq!(progress("none(app) in [ready]"), Progress { selected: 1, satisfying: 1, holds: false });
        assert_eq!(p("all(x) in [ready]").progress(&[]), Progress { selected: 0, satisfying: 0, holds: false });
    }

    #[test]
    fn whitespace_is_insignificant() {
        assert_eq!(p("  all ( * )in[ ready ,failed ] "), p("all(*) in [ready, failed]"));
        assert_eq!(p("count(type = db in[ready])>=2"), p("count(db in [ready]) >= 2"));
        assert_eq!(p("\tany(app)\nhealth   error"), p("any(app) health error"));
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        for (text, canonical) in [
            ("all(*) in [ready]", "all(*) in [ready]"),
            ("all(app)in[ready]", "all(app) in [ready]"),
            ("any(*) in [failed]", "any(*) in [failed]"),
            ("any(*) health error", "any(*) health error"),
            ("none( db ) in [failed,gone]", "none(db) in [failed, gone]"),
            ("count(type=db in [ready]) >= 2", "count(db in [ready]) >= 2"),
            ("count(* health ok)<1", "count(* health ok) < 1"),
            ("count(x-1 in [a_b]) == 10", "count(x-1 in [a_b]) == 10"),
            ("all(type) health ok", "all(type) health ok"),
        ] {
            let pattern = p(text);
            assert_eq!(pattern.to_string(), canonical);
            assert_eq!(p(canonical), pattern);
            assert_eq!(canonical.parse::<Pattern>(), Ok(pattern));
        }
    }

    #[test]
    fn parse_errors_say_what_was_expected_where() {
        for (text, message) in [
            ("", "expected `all`, `any`, `none` or `count` at column 1"),
            ("  every(*) in [a]", "expected `all`, `any`, `none` or `count` at column 3"),
            ("all[*] in [a]", "expected `(` after `all` at column 4"),
            ("count", "expected `(` after `count` at column 6"),
            ("all() in [a]", "expected `*`, a machine name or `type=NAME` at column 5"),
            ("all(type=) in [a]", "expected a machine name after `type=` at column 10"),
            ("all(* in [a]", "expected `)` after the filter at column 7"),
            ("all(a b) in [a]", "expected `)` after the filter at column 7"),
            ("all(*)", "expected `in [...]` or `health` at column 7"),
            ("all(*) is [a]", "expected `in [...]` or `health` at column 8"),
            ("all(*) in ready", "expected `[` after `in` at column 11"),
            ("all(*) in []", "expected a state name at column 12"),
            ("all(*) in [a,]", "expected a state name at column 14"),
            ("all(*) in [a b]", "expected `,` or `]` at column 14"),
            ("all(*) in [a", "expected `,` or `]` at column 13"),
            ("any(*) health", "expected `error` or `ok` after `health` at column 14"),
            ("any(*) health bad", "expected `error` or `ok` after `health` at column 15"),
            ("all(*) in [a] extra", "unexpected `e` at column 15 (expected the end of the pattern)"),
            ("count(*) >= 1", "expected `in [...]` or `health` at column 8"),
            ("count(* in [a] >= 1", "expected `)` after the condition at column 16"),
            ("count(* in [a]) 1", "expected `>=`, `>`, `==`, `<=` or `<` after `count(...)` at column 17"),
            ("count(* in [a]) = 1", "expected `>=`, `>`, `==`, `<=` or `<` after `count(...)` at column 17"),
            ("count(* in [a]) >= -1", "expected a non-negative integer after `>=` at column 20"),
            ("count(* in [a]) <", "expected a non-negative integer after `<` at column 18"),
            ("count(* in [a]) > 1.5", "unexpected `.` at column 20 (expected the end of the pattern)"),
            ("count(* in [a]) > 99999999999999999999", "integer `99999999999999999999` is too large at column 19"),
            ("all(é) in [a]", "expected `*`, a machine name or `type=NAME` at column 5"),
        ] {
            assert_eq!(Pattern::parse(text), Err(message.to_string()), "{text}");
        }
    }

    fn s<'a>(machine: &'a str, key: &'a str, state: &'a str, health: Health) -> SuccessorView<'a> {
        SuccessorView { machine, key, state, ancestors: &[], health }
    }

    #[test]
    fn eval_truth_table() {
        let ok = Health::Ok;
        let err = Health::Error;
        let none: &[SuccessorView<'_>] = &[];
        let ready = [s("app", "a", "ready", ok), s("db", "d", "ready", ok)];
        let mixed = [s("app", "a", "ready", ok), s("db", "d", "creating", ok), s("db", "e", "failed", err)];
        // (pattern, successors, expected result)
        type Case<'a> = (&'a str, &'a [SuccessorView<'a>], Option<Vec<usize>>);
        let cases: [Case<'_>; 30] = [
            // all: at least one filtered successor, every one satisfying.
            ("all(*) in [ready]", none, None),
            ("all(*) in [ready]", &ready, Some(vec![0, 1])),
            ("all(*) in [ready]", &mixed, None),
            ("all(app) in [ready]", &mixed, Some(vec![0])),
            ("all(db) in [creating, failed]", &mixed, Some(vec![1, 2])),
            ("all(dns) in [ready]", &mixed, None),
            ("all(*) health ok", &ready, Some(vec![0, 1])),
            ("all(*) health ok", &mixed, None),
            // any: at least one satisfying.
            ("any(*) in [failed]", none, None),
            ("any(*) in [failed]", &ready, None),
            ("any(*) in [failed]", &mixed, Some(vec![2])),
            ("any(*) health error", &mixed, Some(vec![2])),
            ("any(app) health error", &mixed, None),
            ("any(db) in [ready, creating]", &mixed, Some(vec![1])),
            // none: no satisfying one (an empty set qualifies).
            ("none(*) in [failed]", none, Some(vec![])),
            ("none(*) in [failed]", &ready, Some(vec![])),
            ("none(*) in [failed]", &mixed, None),
            ("none(app) health error", &mixed, Some(vec![])),
            ("none(db) in [failed, gone]", &mixed, None),
            // count: the satisfying ones, compared.
            ("count(* in [ready]) >= 2", &ready, Some(vec![0, 1])),
            ("count(* in [ready]) >= 2", &mixed, None),
            ("count(type=db in [ready]) >= 1", &ready, Some(vec![1])),
            ("count(db health ok) == 1", &mixed, Some(vec![1])),
            ("count(* health error) > 0", &mixed, Some(vec![2])),
            ("count(* health error) > 1", &mixed, None),
            ("count(* in [ready]) <= 1", &mixed, Some(vec![0])),
            ("count(* in [ready]) < 1", &mixed, None),
            ("count(* in [ready]) < 1", none, Some(vec![])),
            ("count(* in [ready]) == 0", none, Some(vec![])),
            ("count(app in [ready]) >= 0", none, Some(vec![])),
        ];
        for (text, successors, expected) in cases {
            assert_eq!(p(text).eval(successors), expected, "{text} over {successors:?}");
        }
    }
}
