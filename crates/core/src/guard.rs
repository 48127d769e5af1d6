//! Guards: pure expressions that choose between an event's alternatives (DESIGN §1,
//! "Guards"), written in CEL (the Common Expression Language) and evaluated with the `cel`
//! crate.
//!
//! A guard reads two variables: `props`, the entity's properties, and `params`, the
//! event's parameters (both JSON objects; integers arrive as CEL `int`), and may ask
//! `in_state('S')`: whether the entity is in state `S` (its state or an ancestor of it,
//! SCXML's `In()`). It must give a boolean:
//!
//! ```text
//! params.size <= props.max_size
//! has(props.region) && props.region in ["eu", "us"]
//! size(params.name) > 0 && !params.name.startsWith("tmp-")
//! !in_state('maintenance') || params.force
//! ```
//!
//! [`Guard::check`] finds at load time what a guard would get wrong at run time: a name
//! other than `props` and `params`, a parameter the event does not declare, a property
//! the machine never mentions, an unknown function, operands of types that do not fit
//! (`"a" + 1`, `params.n < "x"` where a literal fixes the type), and a result that is not
//! a boolean. Values read from `props` and `params` have no declared type, so what can be
//! checked about them is checked when the guard runs: [`Guard::eval`] answers an error
//! then (a missing property, a comparison of a string with a number), which the runtime
//! turns into a rejection with that reason.
//!
//! Evaluation is pure: no IO, no clock (CEL's time functions are not built in).

use std::fmt;

use cel::Value;

pub use crate::expr::Names;
use crate::expr::{Checker, Expression, Ty, value_kind};
use crate::step::Properties;

/// A parsed guard: an [`Expression`] that must give a boolean, reading no `key`. Compares
/// equal by its source text.
#[derive(Clone, PartialEq)]
pub struct Guard(Expression, ReadsState);

/// Whether a guard calls `in_state` (then its evaluation is given the entity's states).
#[derive(Clone, Copy, PartialEq)]
struct ReadsState(bool);

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guard({:?})", self.0.source())
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.source())
    }
}

impl Guard {
    /// Parses a guard of a machine's definition. The error says where: "syntax error at
    /// column 16: …", or which limit of [`Limits::DEFINITION`](crate::cost::Limits) it
    /// passes.
    pub fn parse(source: &str) -> Result<Guard, String> {
        Guard::parse_within(source, &crate::cost::Limits::DEFINITION)
    }

    /// Parses a boolean expression within `limits` (a request's filter:
    /// [`Limits::REQUEST`](crate::cost::Limits::REQUEST)).
    pub fn parse_within(source: &str, limits: &crate::cost::Limits) -> Result<Guard, String> {
        Expression::parse_within(source, limits).map(|e| Guard(e, ReadsState(source.contains("in_state"))))
    }

    /// The guard as written.
    pub fn source(&self) -> &str {
        self.0.source()
    }

    /// Every problem found without running the guard (see the module docs), as messages.
    pub fn check(&self, names: Names<'_>) -> Vec<String> {
        let mut c = Checker::new(names, false);
        let ty = c.expr(self.0.program().expression());
        if !matches!(ty, Ty::Bool | Ty::Dyn) {
            c.problem(format!("gives {}, not a boolean", ty.name()));
        }
        c.problems
    }

    /// Evaluates the guard against an entity's properties, an event's parameters (an
    /// object or null) and the states the entity is in (its state and each ancestor, for
    /// `in_state`; read only when the guard calls it). `Err` says why it could not be
    /// evaluated.
    pub fn eval<'s>(
        &self,
        props: &Properties,
        params: &serde_json::Value,
        states: impl IntoIterator<Item = &'s str>,
    ) -> Result<bool, String> {
        let states = self.1.0.then(|| states.into_iter().map(str::to_string).collect());
        match self.0.execute(props, params, None, states)? {
            Value::Bool(b) => Ok(b),
            other => Err(format!("gave {}, not a boolean", value_kind(&other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names<'a>(params: &'a [String], properties: &'a [String]) -> Names<'a> {
        Names { params, properties, states: &[] }
    }

    #[test]
    fn guards_choose_by_properties_and_parameters() {
        let g = Guard::parse("params.size <= props.max_size && params.size + 1 > 1").unwrap();
        let props: Properties = [("max_size".to_string(), json!(8))].into_iter().collect();
        assert_eq!(g.eval(&props, &json!({"size": 4}), []), Ok(true));
        assert_eq!(g.eval(&props, &json!({"size": 9}), []), Ok(false));
        assert_eq!(g.eval(&props, &json!({"size": -3}), []), Ok(false), "-3 + 1 > 1 is false");
        let region = Guard::parse(r#"has(props.region) && props.region in ["eu", "us"]"#).unwrap();
        assert_eq!(region.eval(&props, &json!(null), []), Ok(false));
        let props: Properties = [("region".to_string(), json!("eu"))].into_iter().collect();
        assert_eq!(region.eval(&props, &json!(null), []), Ok(true));
    }

    #[test]
    fn evaluation_errors_say_why() {
        let g = Guard::parse("params.size <= props.max_size").unwrap();
        let err = g.eval(&Properties::new(), &json!({"size": 1}), []).unwrap_err();
        assert_eq!(err, "no such key: max_size");
        let g = Guard::parse("params.name").unwrap();
        assert_eq!(g.eval(&Properties::new(), &json!({"name": "x"}), []), Err("gave a string, not a boolean".into()));
    }

    #[test]
    fn in_state_asks_whether_the_entity_is_in_a_state_or_one_of_its_substates() {
        let g = Guard::parse("in_state('maintenance') && !in_state('patching')").unwrap();
        let none = Properties::new();
        // (the entity's state and its ancestors) → the guard
        let cases: [(&[&str], bool); 4] = [
            (&["draining", "maintenance", "online"], true),
            (&["patching", "maintenance", "online"], false),
            (&["serving", "online"], false),
            (&[], false),
        ];
        for (path, holds) in cases {
            assert_eq!(g.eval(&none, &json!(null), path.iter().copied()), Ok(holds), "{path:?}");
        }
        let states = ["online".to_string(), "maintenance".to_string()];
        let names = Names { params: &[], properties: &[], states: &states };
        let cases: [(&str, &[&str]); 4] = [
            ("in_state('online')", &[]),
            ("in_state('offline')", &["`in_state('offline')`: the machine has no state `offline`"]),
            ("in_state(props.s)", &["`in_state` takes one state name, a quoted string: `in_state('S')`"]),
            ("in_state('online', 'x')", &["`in_state` takes one state name, a quoted string: `in_state('S')`"]),
        ];
        for (source, expected) in cases {
            let mut got = Guard::parse(source).unwrap().check(names);
            got.retain(|p| !p.contains("props."));
            assert_eq!(got, expected, "{source}");
        }
    }

    #[test]
    fn syntax_errors_name_the_column() {
        let err = Guard::parse("params.size <= ").unwrap_err();
        assert!(err.starts_with("syntax error at column 16: "), "{err}");
    }

    #[test]
    fn static_checks_find_names_types_and_results() {
        let params = ["size".to_string()];
        let props = ["max_size".to_string()];
        // (guard) → the problems found at load time
        let cases: [(&str, &[&str]); 9] = [
            ("params.size <= props.max_size", &[]),
            (
                "params.colour == 'red'",
                &["`params.colour`: the event declares no parameter `colour` (declared: `size`)"],
            ),
            (
                "props.weight > 3",
                &["`props.weight`: the machine never mentions property `weight` (declare it in `properties`)"],
            ),
            ("size > 3", &["unknown name `size` (a guard reads `props` and `params`)"]),
            ("'a' + 1 == 'a1'", &["`+` cannot add a string and a number"]),
            ("params.size < 'big'", &[]),
            ("1 < 'big'", &["`<` compares a number with a string"]),
            ("params.size + 1", &["gives a number, not a boolean"]),
            ("frobnicate(params.size)", &["unknown function `frobnicate`"]),
        ];
        for (source, expected) in cases {
            let got = Guard::parse(source).unwrap().check(names(&params, &props));
            assert_eq!(got, expected, "{source}");
        }
        let macros = Guard::parse("[1, 2].all(x, x > 0) && [params.size].exists(y, y == 2)").unwrap();
        assert_eq!(macros.check(names(&params, &props)), Vec::<String>::new(), "comprehension variables are in scope");
    }
}
