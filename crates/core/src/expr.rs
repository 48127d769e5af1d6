//! Expressions: the values of declarative actions (DESIGN §5, "Declarative TOML actions"),
//! written in CEL like guards ([`crate::guard`]) and evaluated with the same crate.
//!
//! An expression reads three variables: `props` (the entity's properties), `params` (the
//! parameters of the event the action runs for; an empty map when there is none) and `key`
//! (the entity's key, a string). It gives any JSON value:
//!
//! ```text
//! params.replicas                  # a parameter, as given
//! key + '.servers.example'         # a string built from the key
//! 'ready'                          # a literal string (quoted inside the TOML string)
//! has(props.n) ? props.n + 1 : 1   # a counter
//! ```
//!
//! [`Expression::check`] finds at load time what the guard checker finds (unknown names,
//! undeclared parameters, properties the machine never mentions, unknown functions, types
//! that cannot fit); [`Expression::eval`] answers an error when a value read is missing or
//! of the wrong kind, or when the result has no JSON form (a timestamp, bytes).
//!
//! The load-time checker (`Checker`) and the conversions between JSON and CEL values are
//! here, shared with [`Guard`](crate::guard::Guard), a boolean expression without `key`.

use std::fmt;
use std::sync::Arc;

use std::collections::HashMap;

use cel::common::ast::{Expr, IdedExpr, LiteralValue};
use cel::{Context, Program, Value};

use crate::step::Properties;

/// A parsed expression. Compares equal by its source text.
#[derive(Clone)]
pub struct Expression {
    source: String,
    program: Arc<Program>,
}

impl PartialEq for Expression {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl fmt::Debug for Expression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expression({:?})", self.source)
    }
}

impl fmt::Display for Expression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl Expression {
    /// Parses an expression of a machine's definition, within
    /// [`Limits::DEFINITION`](crate::cost::Limits::DEFINITION). The error says where:
    /// "syntax error at column 7: …", or which limit it passes.
    pub fn parse(source: &str) -> Result<Expression, String> {
        Expression::parse_within(source, &crate::cost::Limits::DEFINITION)
    }

    /// Parses an expression within `limits` ([`crate::cost`]): the text is checked before
    /// it is parsed, the tree before it is kept.
    pub fn parse_within(source: &str, limits: &crate::cost::Limits) -> Result<Expression, String> {
        crate::cost::check_source(source, limits)?;
        let program = Program::compile(source).map_err(|e| tidy_parse_error(&e.to_string()))?;
        crate::cost::check_tree(program.expression(), limits)?;
        Ok(Expression { source: source.to_string(), program: Arc::new(program) })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every problem found without evaluating it, as messages.
    pub fn check(&self, names: Names<'_>) -> Vec<String> {
        let mut c = Checker::new(names, true);
        c.expr(self.program.expression());
        c.problems
    }

    /// Evaluates it against an entity's properties, an event's parameters (an object or
    /// null) and the entity's key. `Err` says why it could not be evaluated.
    pub fn eval(&self, props: &Properties, params: &serde_json::Value, key: &str) -> Result<serde_json::Value, String> {
        to_json(&self.execute(props, params, Some(key), None)?)
    }

    pub(crate) fn program(&self) -> &Program {
        &self.program
    }

    /// Runs it with `props`, `params` and (when given) `key` bound; `in_state` (a guard's)
    /// answers from `states`, the entity's state and its ancestors.
    pub(crate) fn execute(
        &self,
        props: &Properties,
        params: &serde_json::Value,
        key: Option<&str>,
        states: Option<Vec<String>>,
    ) -> Result<Value, String> {
        // CEL's standard library is built once: building it for each evaluation cost more
        // than the evaluation itself (a guard, a limit's key).
        static STDLIB: std::sync::LazyLock<Arc<cel::Env>> = std::sync::LazyLock::new(|| Arc::new(cel::Env::stdlib()));
        let mut ctx = Context::with_env(STDLIB.clone());
        if let Some(states) = states {
            ctx.add_function("in_state", move |name: Arc<String>| states.contains(&*name))
                .map_err(|e| e.to_string())?;
        }
        ctx.add_variable_from_value("props", object(props.iter()));
        let empty = serde_json::Map::new();
        ctx.add_variable_from_value("params", object(params.as_object().unwrap_or(&empty).iter()));
        if let Some(key) = key {
            ctx.add_variable_from_value("key", Value::String(Arc::new(key.to_string())));
        }
        self.program.execute(&ctx).map_err(|e| tidy_execution_error(&e.to_string()))
    }
}

/// A CEL value as JSON: numbers, strings, booleans, null, lists and maps with string keys.
fn to_json(v: &Value) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    Ok(match v {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::UInt(u) => J::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(*f).map(J::Number).ok_or("gave a number JSON cannot hold")?,
        Value::String(s) => J::String(s.to_string()),
        Value::List(items) => J::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Value::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m.map.iter() {
                let cel::objects::Key::String(k) = k else {
                    return Err("gave a map whose keys are not strings".into());
                };
                out.insert(k.to_string(), to_json(v)?);
            }
            J::Object(out)
        }
        other => return Err(format!("gave {}, which has no JSON form", value_kind(other))),
    })
}

/// What a guard or an expression may name besides `props`, `params` (and `key`): checked
/// by [`Guard::check`](crate::guard::Guard::check) and [`Expression::check`].
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    /// The parameters the event declares.
    pub params: &'a [String],
    /// The properties the machine mentions (declared `properties`, states' `requires`,
    /// declarative actions' `set`).
    pub properties: &'a [String],
    /// The machine's states, which a guard's `in_state('S')` may name.
    pub states: &'a [String],
}

/// A JSON object as a CEL map: integers become `int` (`uint` only beyond `i64`), so that
/// arithmetic with literals works (`params.n + 1`).
pub(crate) fn object<'a>(entries: impl Iterator<Item = (&'a String, &'a serde_json::Value)>) -> Value {
    let map: HashMap<String, Value> = entries.map(|(k, v)| (k.clone(), to_cel(v))).collect();
    Value::from(map)
}

pub(crate) fn to_cel(v: &serde_json::Value) -> Value {
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

pub(crate) fn value_kind(v: &Value) -> &'static str {
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
pub(crate) fn tidy_parse_error(message: &str) -> String {
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

pub(crate) fn tidy_execution_error(message: &str) -> String {
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
pub(crate) enum Ty {
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
    pub(crate) fn name(self) -> &'static str {
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

pub(crate) struct Checker<'a> {
    names: Names<'a>,
    pub(crate) problems: Vec<String>,
    /// Variables of the comprehensions being checked (`x` in `list.all(x, …)`).
    scope: Vec<String>,
    /// Whether `key` (the entity's key) may be read: in an expression, not in a guard.
    key: bool,
}

impl<'a> Checker<'a> {
    pub(crate) fn new(names: Names<'a>, key: bool) -> Self {
        Checker { names, problems: Vec::new(), scope: Vec::new(), key }
    }

    fn reads(&self) -> &'static str {
        if self.key { "an expression reads `props`, `params` and `key`" } else { "a guard reads `props` and `params`" }
    }

    pub(crate) fn problem(&mut self, message: String) {
        if !self.problems.contains(&message) {
            self.problems.push(message);
        }
    }

    pub(crate) fn expr(&mut self, e: &IdedExpr) -> Ty {
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
                "key" if self.key => Ty::Str,
                n if self.scope.iter().any(|s| s == n) => Ty::Dyn,
                n => {
                    self.problem(format!("unknown name `{n}` ({})", self.reads()));
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
            n => self.problem(format!("unknown name `{n}` ({})", self.reads())),
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
            "in_state" if !self.key => {
                match args {
                    [IdedExpr { expr: Expr::Literal(LiteralValue::String(state)), .. }] if target.is_none() => {
                        let state = state.to_string();
                        if !self.names.states.contains(&state) {
                            self.problem(format!("`in_state('{state}')`: the machine has no state `{state}`"));
                        }
                    }
                    _ => self.problem("`in_state` takes one state name, a quoted string: `in_state('S')`".into()),
                }
                Ty::Bool
            }
            "in_state" => {
                self.problem("`in_state` is for guards (an expression reads `props`, `params` and `key`)".into());
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

    fn props(v: serde_json::Value) -> Properties {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn expressions_read_parameters_properties_and_the_key() {
        let eval = |src: &str, p: serde_json::Value, params: serde_json::Value| {
            Expression::parse(src).unwrap().eval(&props(p), &params, "srv-1")
        };
        assert_eq!(eval("params.replicas", json!({}), json!({"replicas": 3})), Ok(json!(3)));
        assert_eq!(eval("key + '-db'", json!({}), json!(null)), Ok(json!("srv-1-db")));
        assert_eq!(eval("'ready'", json!({}), json!(null)), Ok(json!("ready")));
        assert_eq!(eval("has(props.n) ? props.n + 1 : 1", json!({"n": 4}), json!(null)), Ok(json!(5)));
        assert_eq!(eval("has(props.n) ? props.n + 1 : 1", json!({}), json!(null)), Ok(json!(1)));
        assert_eq!(eval("[key, params.size * 2.0]", json!({}), json!({"size": 2.5})), Ok(json!(["srv-1", 5.0])));
        assert_eq!(eval("{'a': props.x}", json!({"x": null}), json!(null)), Ok(json!({"a": null})));
        let missing = eval("params.replicas", json!({}), json!(null)).unwrap_err();
        assert!(missing.contains("replicas"), "{missing}");
        assert_eq!(eval("{1: 2}", json!({}), json!(null)), Err("gave a map whose keys are not strings".into()));
        assert_eq!(eval("b'x'", json!({}), json!(null)), Err("gave a value, which has no JSON form".into()));
    }

    #[test]
    fn load_time_checks_know_the_key() {
        let params = ["replicas".to_string()];
        let properties = ["n".to_string()];
        let names = Names { params: &params, properties: &properties, states: &[] };
        let check = |src: &str| Expression::parse(src).unwrap().check(names);
        assert_eq!(check("key + '-' + string(params.replicas)"), Vec::<String>::new());
        assert_eq!(check("keys"), ["unknown name `keys` (an expression reads `props`, `params` and `key`)"]);
        assert_eq!(
            check("params.size"),
            ["`params.size`: the event declares no parameter `size` (declared: `replicas`)"]
        );
        assert_eq!(check("key + 1"), ["`+` cannot add a string and a number"]);
        assert!(Expression::parse("db.internal:5432").unwrap_err().starts_with("syntax error at column 12: "));
    }
}
