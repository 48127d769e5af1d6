//! Statements with owned parameters ([`Stmt`]), built to be sent together: a set of rows as
//! one parameter array per column (`unnest`), several statements merged into one with
//! data-modifying `WITH` items ([`merge`]), the positions of a phase's statements in its
//! pipeline ([`Slots`]), and JSON values as parameters of application SQL ([`JsonParam`]).

use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use serde_json::Value;

/// A statement with owned parameters, to be sent with others.
pub(crate) struct Stmt {
    pub(crate) sql: String,
    pub(crate) params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Stmt {
    pub(crate) fn new(sql: impl Into<String>, params: Vec<Box<dyn ToSql + Sync + Send>>) -> Stmt {
        Stmt { sql: sql.into(), params }
    }
}

/// A column of parameters: one array.
pub(super) fn col<T: ToSql + Sync + Send + 'static>(v: Vec<T>) -> Box<dyn ToSql + Sync + Send> {
    Box::new(v)
}

pub(super) fn one<T: ToSql + Sync + Send + 'static>(v: T) -> Box<dyn ToSql + Sync + Send> {
    Box::new(v)
}

pub(super) fn strings<'a, T: 'a>(rows: &'a [T], f: impl Fn(&'a T) -> &'a str) -> Box<dyn ToSql + Sync + Send> {
    col(rows.iter().map(|r| f(r).to_string()).collect::<Vec<String>>())
}

pub(super) fn opt_strings<'a, T: 'a>(
    rows: &'a [T],
    f: impl Fn(&'a T) -> Option<&'a str>,
) -> Box<dyn ToSql + Sync + Send> {
    col(rows.iter().map(|r| f(r).map(str::to_string)).collect::<Vec<Option<String>>>())
}

pub(super) fn ints<T>(rows: &[T], f: impl Fn(&T) -> i64) -> Box<dyn ToSql + Sync + Send> {
    col(rows.iter().map(f).collect::<Vec<i64>>())
}

pub(super) fn opt_ints<T>(rows: &[T], f: impl Fn(&T) -> Option<i64>) -> Box<dyn ToSql + Sync + Send> {
    col(rows.iter().map(f).collect::<Vec<Option<i64>>>())
}

pub(super) fn bools<T>(rows: &[T], f: impl Fn(&T) -> bool) -> Box<dyn ToSql + Sync + Send> {
    col(rows.iter().map(f).collect::<Vec<bool>>())
}

/// `sql` with each parameter `$n` renamed `$(n + by)`.
fn renumber(sql: &str, by: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut chars = sql.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        out.push(c);
        if c != '$' {
            continue;
        }
        let mut n = 0usize;
        let mut digits = false;
        while let Some(&(_, d)) = chars.peek() {
            let Some(v) = d.to_digit(10) else { break };
            n = n * 10 + v as usize;
            digits = true;
            chars.next();
        }
        if digits {
            out.push_str(&(n + by).to_string());
        }
    }
    out
}

/// One statement doing the work of several: `parts` as data-modifying `WITH` items and
/// `main` (by default a bare `SELECT`) as the statement whose rows are returned. Every
/// part sees the database as it was before the statement: none may depend on another's
/// rows.
pub(super) fn merge(parts: Vec<Stmt>, main: Option<Stmt>) -> Option<Stmt> {
    if parts.is_empty() {
        return main;
    }
    let main = main.unwrap_or_else(|| Stmt::new("SELECT 1", Vec::new()));
    let mut sql = String::from("WITH ");
    let mut params = Vec::new();
    for (i, part) in parts.into_iter().enumerate() {
        if i > 0 {
            sql.push_str(",\n");
        }
        sql.push_str(&format!("w{i} AS ({})", renumber(&part.sql, params.len())));
        params.extend(part.params);
    }
    sql.push('\n');
    sql.push_str(&renumber(&main.sql, params.len()));
    params.extend(main.params);
    Some(Stmt::new(sql, params))
}

/// Positions of a phase's statements in its pipeline.
#[derive(Default)]
pub(super) struct Slots(pub(super) Vec<Stmt>);

impl Slots {
    pub(super) fn add(&mut self, s: Stmt) -> usize {
        self.0.push(s);
        self.0.len() - 1
    }
}

/// A JSON value as a parameter of application SQL, converted to the type the server
/// inferred for the parameter (numbers to integer or float columns, strings to text, any
/// value to `json`/`jsonb`).
#[derive(Debug)]
pub(crate) struct JsonParam<'a>(pub(crate) &'a Value);

impl ToSql for JsonParam<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let v = self.0;
        if v.is_null() {
            return Ok(IsNull::Yes);
        }
        let mismatch = || format!("cannot pass JSON value {v} as a parameter of type {ty}");
        match *ty {
            Type::BOOL => v.as_bool().ok_or_else(mismatch)?.to_sql(ty, out),
            Type::INT2 => i16::try_from(v.as_i64().ok_or_else(mismatch)?)?.to_sql(ty, out),
            Type::INT4 => i32::try_from(v.as_i64().ok_or_else(mismatch)?)?.to_sql(ty, out),
            Type::INT8 => v.as_i64().ok_or_else(mismatch)?.to_sql(ty, out),
            Type::FLOAT4 => (v.as_f64().ok_or_else(mismatch)? as f32).to_sql(ty, out),
            Type::FLOAT8 => v.as_f64().ok_or_else(mismatch)?.to_sql(ty, out),
            Type::JSON => {
                out.extend_from_slice(v.to_string().as_bytes());
                Ok(IsNull::No)
            }
            Type::JSONB => {
                out.extend_from_slice(&[1]);
                out.extend_from_slice(v.to_string().as_bytes());
                Ok(IsNull::No)
            }
            _ => match v {
                Value::String(s) => s.as_str().to_sql(ty, out),
                other => other.to_string().as_str().to_sql(ty, out),
            },
        }
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::BOOL
                | Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::JSON
                | Type::JSONB
                | Type::TEXT
                | Type::VARCHAR
                | Type::BPCHAR
                | Type::NAME
                | Type::UNKNOWN
        )
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renumber_moves_every_parameter() {
        assert_eq!(
            renumber("a = $1 AND b = ANY($12::text[]) OR c = '$'", 3),
            "a = $4 AND b = ANY($15::text[]) OR c = '$'"
        );
        assert_eq!(renumber("no parameters", 5), "no parameters");
    }

    #[test]
    fn merge_chains_parts_before_the_main_statement() {
        let parts = vec![
            Stmt::new("DELETE FROM a WHERE id = $1", vec![one(1i64)]),
            Stmt::new("UPDATE b SET x = $2 WHERE id = $1", vec![one(2i64), one(3i64)]),
        ];
        let main = Stmt::new("INSERT INTO c VALUES ($1) RETURNING id", vec![one(4i64)]);
        let m = merge(parts, Some(main)).expect("a statement");
        assert_eq!(
            m.sql,
            "WITH w0 AS (DELETE FROM a WHERE id = $1),\nw1 AS (UPDATE b SET x = $3 WHERE id = $2)\n\
             INSERT INTO c VALUES ($4) RETURNING id"
        );
        assert_eq!(m.params.len(), 4);
        assert!(merge(Vec::new(), None).is_none());
        let alone = merge(vec![Stmt::new("DELETE FROM a", Vec::new())], None).expect("a statement");
        assert_eq!(alone.sql, "WITH w0 AS (DELETE FROM a)\nSELECT 1");
    }
}
