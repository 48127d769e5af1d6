//! Guards: pure expressions that choose between an event's alternatives (DESIGN §1,
//! "Guards"), written in CEL (the Common Expression Language) and evaluated with the `cel`
//! crate.
//!
//! A guard reads two variables: `props`, the entity's properties, and `params`, the
//! event's parameters (both JSON objects; integers arrive as CEL `int`). It must give a
//! boolean:
//!
//! ```text
//! params.size <= props.max_size
//! has(props.region) && props.region in ["eu", "us"]
//! size(params.name) > 0 && !params.name.startsWith("tmp-")
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

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cel::common::ast::{Expr, IdedExpr, LiteralValue};
use cel::{Context, Program, Value};

use crate::step::Properties;

/// A parsed guard. Compares equal by its source text.
#[derive(Clone)]
pub struct Guard {
    source: String,
    program: Arc<Program>,
}

impl PartialEq for Guard {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guard({:?})", self.source)
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// What a guard may name besides `props` and `params` (checked by [`Guard::check`]).
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    /// The parameters the event declares.
    pub params: &'a [String],
    /// The properties the machine mentions (declared `properties`, states' `requires`,
    /// declarative actions' `set`).
    pub properties: &'a [String],
}

impl Guard {
    /// Parses a guard. The error says where: "syntax error at column 16: …".
    pub fn parse(source: &str) -> Result<Guard, String> {
        let program = Program::compile(source).map_err(|e| tidy_parse_error(&e.to_string()))?;
        Ok(Guard { source: source.to_string(), program: Arc::new(program) })
    }

    /// The guard as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every problem found without running the guard (see the module docs), as messages.
    pub fn check(&self, names: Names<'_>) -> Vec<String> {
        let mut c = Checker { names, problems: Vec::new(), scope: Vec::new() };
        let ty = c.expr(self.program.expression());
        if !matches!(ty, Ty::Bool | Ty::Dyn) {
            c.problem(format!("gives {}, not a boolean", ty.name()));
        }
        c.problems
    }

    /// Evaluates the guard against an entity's properties and an event's parameters (an
    /// object or null). `Err` says why it could not be evaluated.
    pub fn eval(&self, props: &Properties, params: &serde_json::Value) -> Result<bool, String> {
        let mut ctx = Context::default();
        ctx.add_variable_from_value("props", object(props.iter()));
        let empty = serde_json::Map::new();
        let params = params.as_object().unwrap_or(&empty);
        ctx.add_variable_from_value("params", object(params.iter()));
        match self.program.execute(&ctx) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("gave {}, not a boolean", value_kind(&other))),
            Err(e) => Err(tidy_execution_error(&e.to_string())),
        }
    }
}

/// A JSON object as a CEL map: integers become `int` (`uint` only beyond `i64`), so that
/// arithmetic with literals works (`params.n + 1`).
fn object<'a>(entries: impl Iterator<Item = (&'a String, &'a serde_json::Value)>) -> Value {
    let map: HashMap<String, Value> = entries.map(|(k, v)| (k.clone(), to_cel(v))).collect();
    Value::from(map)
}

fn to_cel(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(u)) => Value::UInt(u),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::String(Arc::new(s.clone())),
        J::Array(items) => Value::List(Arc::new(items.iter().map(to_cel).collect())),
        J::Object(o) => object(o.iter()),
    }
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Int(_) | Value::UInt(_) | Value::Float(_) => "a number",
        Value::String(_) => "a string",
        Value::List(_) => "a list",
        Value::Map(_) => "a map",
        Value::Null => "null",
        _ => "a value",
    }
}

/// `ERROR: <input>:1:16: Syntax error: mismatched input …` → `syntax error at column 16:
/// mismatched input …` (first line only).
fn tidy_parse_error(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let rest = first.strip_prefix("ERROR: ").unwrap_or(first);
    let rest = rest.strip_prefix("<input>:").unwrap_or(rest);
    let mut parts = rest.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(_line), Some(col), Some(text)) if col.chars().all(|c| c.is_ascii_digit()) => {
            let text = text.trim();
            let text = text.strip_prefix("Syntax error: ").unwrap_or(text);
            format!("syntax error at column {col}: {text}")
        }
        _ => first.to_string(),
    }
}

fn tidy_execution_error(message: &str) -> String {
    // "found no matching overload for '_<_' applied to '(string, int)'"
    if let Some(rest) = message.strip_prefix("found no matching overload for '")
        && let Some((function, args)) = rest.split_once("' applied to '")
    {
        let op = function.trim_matches('_').trim_start_matches('@');
        return format!("`{op}` cannot take {}", args.trim_end_matches('\''));
    }
    let mut chars = message.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => message.to_string(),
    }
}

/// A guard's static type: what can be known without the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    /// Read from `props` or `params`, or the result of something untyped.
    Dyn,
    Bool,
    Num,
    Str,
    Bytes,
    Null,
    List,
    Map,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Dyn => "a value",
            Ty::Bool => "a boolean",
            Ty::Num => "a number",
            Ty::Str => "a string",
            Ty::Bytes => "bytes",
            Ty::Null => "null",
            Ty::List => "a list",
            Ty::Map => "a map",
        }
    }
    /// Whether a value of this type may be where `want` is needed.
    fn fits(self, want: Ty) -> bool {
        self == Ty::Dyn || self == want
    }
}

struct Checker<'a> {
    names: Names<'a>,
    problems: Vec<String>,
    /// Variables of the comprehensions being checked (`x` in `list.all(x, …)`).
    scope: Vec<String>,
}

impl Checker<'_> {
    fn problem(&mut self, message: String) {
        if !self.problems.contains(&message) {
            self.problems.push(message);
        }
    }

    fn expr(&mut self, e: &IdedExpr) -> Ty {
        match &e.expr {
            Expr::Literal(l) => match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Int(_) | LiteralValue::UInt(_) | LiteralValue::Double(_) => Ty::Num,
                LiteralValue::String(_) => Ty::Str,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Null => Ty::Null,
            },
            Expr::Ident(name) => match name.as_str() {
                "props" | "params" => Ty::Map,
                n if self.scope.iter().any(|s| s == n) => Ty::Dyn,
                n => {
                    self.problem(format!("unknown name `{n}` (a guard reads `props` and `params`)"));
                    Ty::Dyn
                }
            },
            Expr::Select(select) => {
                if let Expr::Ident(root) = &select.operand.expr {
                    self.field(root, &select.field);
                } else {
                    let operand = self.expr(&select.operand);
                    if !operand.fits(Ty::Map) {
                        self.problem(format!("`.{}` read on {}", select.field, operand.name()));
                    }
                }
                if select.test { Ty::Bool } else { Ty::Dyn }
            }
            Expr::List(list) => {
                for item in &list.elements {
                    self.expr(item);
                }
                Ty::List
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let cel::common::ast::EntryExpr::MapEntry(m) = &entry.expr {
                        self.expr(&m.key);
                        self.expr(&m.value);
                    }
                }
                Ty::Map
            }
            Expr::Call(call) => self.call(&call.func_name, call.target.as_deref(), &call.args),
            Expr::Comprehension(c) => {
                self.expr(&c.iter_range);
                let depth = self.scope.len();
                self.scope.push(c.iter_var.clone());
                self.scope.extend(c.iter_var2.clone());
                self.scope.push(c.accu_var.clone());
                self.expr(&c.accu_init);
                self.expr(&c.loop_cond);
                self.expr(&c.loop_step);
                let result = self.expr(&c.result);
                self.scope.truncate(depth);
                result
            }
            Expr::Struct(_) | Expr::Unspecified => {
                self.problem("message literals are not supported in guards".into());
                Ty::Dyn
            }
        }
    }

    /// `props.x` or `params.x`: the property must be one the machine mentions, the
    /// parameter one the event declares.
    fn field(&mut self, root: &str, field: &str) {
        match root {
            "params" if !self.names.params.iter().any(|p| p == field) => {
                let declared = if self.names.params.is_empty() {
                    "none".to_string()
                } else {
                    self.names.params.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
                };
                self.problem(format!(
                    "`params.{field}`: the event declares no parameter `{field}` (declared: {declared})"
                ));
            }
            "props" if !self.names.properties.iter().any(|p| p == field) => self.problem(format!(
                "`props.{field}`: the machine never mentions property `{field}` (declare it in `properties`)"
            )),
            "props" | "params" => {}
            n if self.scope.iter().any(|s| s == n) => {}
            n => self.problem(format!("unknown name `{n}` (a guard reads `props` and `params`)")),
        }
    }

    fn call(&mut self, name: &str, target: Option<&IdedExpr>, args: &[IdedExpr]) -> Ty {
        let target_ty = target.map(|t| self.expr(t));
        let tys: Vec<Ty> = args.iter().map(|a| self.expr(a)).collect();
        let arg = |i: usize| tys.get(i).copied().unwrap_or(Ty::Dyn);
        let need = |checker: &mut Self, ty: Ty, want: Ty, what: &str| {
            if !ty.fits(want) {
                checker.problem(format!("{what} needs {}, not {}", want.name(), ty.name()));
            }
        };
        match name {
            "_&&_" | "_||_" => {
                for &t in &tys {
                    need(self, t, Ty::Bool, if name == "_&&_" { "`&&`" } else { "`||`" });
                }
                Ty::Bool
            }
            "!_" => {
                need(self, arg(0), Ty::Bool, "`!`");
                Ty::Bool
            }
            "_==_" | "_!=_" => {
                self.comparable(arg(0), arg(1), if name == "_==_" { "`==`" } else { "`!=`" }, false);
                Ty::Bool
            }
            "_<_" | "_<=_" | "_>_" | "_>=_" => {
                let op = &name[1..name.len() - 1];
                self.comparable(arg(0), arg(1), &format!("`{op}`"), true);
                Ty::Bool
            }
            "_+_" => match (arg(0), arg(1)) {
                (Ty::Dyn, t) | (t, Ty::Dyn) => {
                    if matches!(t, Ty::Bool | Ty::Null | Ty::Map) {
                        self.problem(format!("`+` cannot add {}", t.name()));
                    }
                    if t == Ty::Dyn { Ty::Dyn } else { t }
                }
                (a, b) if a == b && matches!(a, Ty::Num | Ty::Str | Ty::Bytes | Ty::List) => a,
                (a, b) => {
                    self.problem(format!("`+` cannot add {} and {}", a.name(), b.name()));
                    Ty::Dyn
                }
            },
            "_-_" | "_*_" | "_/_" | "_%_" => {
                let op = &name[1..name.len() - 1];
                for &t in &tys {
                    need(self, t, Ty::Num, &format!("`{op}`"));
                }
                Ty::Num
            }
            "-_" => {
                need(self, arg(0), Ty::Num, "`-`");
                Ty::Num
            }
            "_?_:_" => {
                need(self, arg(0), Ty::Bool, "the condition of `?:`");
                if arg(1) == arg(2) { arg(1) } else { Ty::Dyn }
            }
            "@in" => {
                if !matches!(arg(1), Ty::Dyn | Ty::List | Ty::Map) {
                    self.problem(format!("`in` needs a list or a map on its right, not {}", arg(1).name()));
                }
                Ty::Bool
            }
            "_[_]" => {
                if !matches!(arg(0), Ty::Dyn | Ty::List | Ty::Map) {
                    self.problem(format!("`[]` indexes a list or a map, not {}", arg(0).name()));
                }
                Ty::Dyn
            }
            "size" => {
                let of = target_ty.unwrap_or(arg(0));
                if !matches!(of, Ty::Dyn | Ty::Str | Ty::Bytes | Ty::List | Ty::Map) {
                    self.problem(format!("`size` of {}", of.name()));
                }
                Ty::Num
            }
            "startsWith" | "endsWith" | "contains" => {
                need(self, target_ty.unwrap_or(Ty::Dyn), Ty::Str, &format!("`{name}`"));
                need(self, arg(0), Ty::Str, &format!("the argument of `{name}`"));
                Ty::Bool
            }
            "int" | "uint" | "double" => Ty::Num,
            "string" => Ty::Str,
            "bool" => Ty::Bool,
            "max" | "min" | "dyn" | "type" => Ty::Dyn,
            // The parser's own helpers inside macros (`@not_strictly_false`).
            internal if internal.starts_with('@') => Ty::Dyn,
            other => {
                self.problem(format!("unknown function `{other}`"));
                Ty::Dyn
            }
        }
    }

    /// Operands of a comparison must be of one kind (numbers of any kind compare).
    fn comparable(&mut self, a: Ty, b: Ty, op: &str, ordered: bool) {
        let known = a != Ty::Dyn && b != Ty::Dyn;
        if known && a != b && !(a == Ty::Null || b == Ty::Null) {
            self.problem(format!("{op} compares {} with {}", a.name(), b.name()));
        } else if ordered && known && !matches!(a, Ty::Num | Ty::Str | Ty::Bytes | Ty::Bool) {
            self.problem(format!("{op} cannot order {}", a.name()));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names<'a>(params: &'a [String], properties: &'a [String]) -> Names<'a> {
        Names { params, properties }
    }

    #[test]
    fn guards_choose_by_properties_and_parameters() {
        let g = Guard::parse("params.size <= props.max_size && params.size + 1 > 1").unwrap();
        let props: Properties = [("max_size".to_string(), json!(8))].into_iter().collect();
        assert_eq!(g.eval(&props, &json!({"size": 4})), Ok(true));
        assert_eq!(g.eval(&props, &json!({"size": 9})), Ok(false));
        assert_eq!(g.eval(&props, &json!({"size": -3})), Ok(false), "-3 + 1 > 1 is false");
        let region = Guard::parse(r#"has(props.region) && props.region in ["eu", "us"]"#).unwrap();
        assert_eq!(region.eval(&props, &json!(null)), Ok(false));
        let props: Properties = [("region".to_string(), json!("eu"))].into_iter().collect();
        assert_eq!(region.eval(&props, &json!(null)), Ok(true));
    }

    #[test]
    fn evaluation_errors_say_why() {
        let g = Guard::parse("params.size <= props.max_size").unwrap();
        let err = g.eval(&Properties::new(), &json!({"size": 1})).unwrap_err();
        assert_eq!(err, "no such key: max_size");
        let g = Guard::parse("params.name").unwrap();
        assert_eq!(g.eval(&Properties::new(), &json!({"name": "x"})), Err("gave a string, not a boolean".into()));
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
