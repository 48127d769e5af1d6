//! How a page of entities is read at fleet scale, for both SQL stores: the one statement
//! that reads an [`EntityFilter`]'s page through an index, never by scanning the fleet.
//!
//! - **Key prefix**: per machine, a range of the (machine, key) index; pages in
//!   (machine, key) order.
//! - **Machine and/or state**: per (machine, state) pair that holds entities (from the
//!   counts the commits keep, `entity_counts`), a range of the (machine, state, id) index in
//!   id order, each cut at the page size; the union is cut again. A parent state is the
//!   pairs of its substates.
//! - **Run status** other than `active`: the partial index of entities not active.
//! - Otherwise the primary key, in id order.
//! - **By entered time** (without a key prefix): per (machine, state) pair the filters
//!   reach, a range of the (machine, state, entered_at, id) index in that order after the
//!   cursor, each cut at the page size, merged and cut again.
//!
//! Every value is a parameter; the statement's shape depends only on which filters are
//! set and how many pairs or machines they cover.

use crate::sql::ENTITY_COLS;
use crate::{EntityFilter, EntityOrder};

/// A bound value of a page statement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Param {
    Text(String),
    Int(i64),
}

/// More (machine, state) pairs than this are read by one filtered scan instead of a
/// union of index ranges (SQLite allows 500 terms in a compound select).
const MAX_RANGES: usize = 200;

/// The statement for `f`'s page and its parameters; `None` when no entity can match
/// (no pair holds entities). `present`: the (machine, state) pairs that hold entities.
/// `dollar`: PostgreSQL placeholders (`$1`), otherwise SQLite's (`?1`).
pub(crate) fn page_sql(f: &EntityFilter, present: &[(String, String)], dollar: bool) -> Option<(String, Vec<Param>)> {
    let mut b = Builder { params: Vec::new(), dollar };
    let limit = f.limit.map(|l| l.min(i64::MAX as u64) as i64);
    let sql = if let Some(prefix) = &f.key_prefix {
        b.by_key(f, prefix, present, limit)?
    } else if f.order != EntityOrder::Id {
        let pairs: Vec<&(String, String)> = present.iter().filter(|p| pair_matches(f, p)).collect();
        if pairs.is_empty() {
            return None;
        }
        if pairs.len() > MAX_RANGES { b.scan(f, limit) } else { b.by_entered(f, &pairs, limit) }
    } else if f.machine.is_some() || f.state.is_some() || f.pairs.is_some() {
        let pairs: Vec<&(String, String)> = present.iter().filter(|p| pair_matches(f, p)).collect();
        if pairs.is_empty() {
            return None;
        }
        if pairs.len() > MAX_RANGES { b.scan(f, limit) } else { b.by_pairs(f, &pairs, limit) }
    } else {
        b.scan(f, limit)
    };
    Some((sql, b.params))
}

/// The statement counting `f`'s matches up to `bound + 1` (its page's statement, every
/// range cut at `bound + 1`, counted), and its parameters; `None` as for [`page_sql`].
pub(crate) fn count_sql(
    f: &EntityFilter,
    present: &[(String, String)],
    bound: u64,
    dollar: bool,
) -> Option<(String, Vec<Param>)> {
    let f = EntityFilter {
        limit: Some(bound.saturating_add(1)),
        after_id: None,
        after_key: None,
        after_entered: None,
        ..f.clone()
    };
    let (sql, params) = page_sql(&f, present, dollar)?;
    Some((format!("SELECT count(*) FROM ({sql}) counted"), params))
}

/// How many entities `f` matches, from the counts the commits keep (`counts`: every
/// machine, state and run status with its count): exact and of a cost independent of the
/// fleet. `None` when `f` has a key prefix, which they cannot answer (count its index).
pub(crate) fn count_from_counts(f: &EntityFilter, counts: &[crate::EntityCount]) -> Option<u64> {
    if f.key_prefix.is_some() {
        return None;
    }
    let n = counts
        .iter()
        .filter(|c| pair_matches(f, &(c.machine.clone(), c.state.clone())))
        .filter(|c| f.run_status.as_deref().is_none_or(|s| s == c.run_status.as_str()))
        .map(|c| c.count)
        .sum();
    Some(n)
}

/// Whether `f`'s page needs the (machine, state) pairs that hold entities (`present` of
/// [`page_sql`]).
pub(crate) fn reads_pairs(f: &EntityFilter) -> bool {
    f.key_prefix.is_some()
        || f.machine.is_some()
        || f.state.is_some()
        || f.pairs.is_some()
        || f.order != EntityOrder::Id
}

/// Whether entities of `pair` (machine, state) pass `f`'s machine and state filters.
fn pair_matches(f: &EntityFilter, (machine, state): &(String, String)) -> bool {
    f.pairs.as_ref().is_none_or(|only| only.iter().any(|(m, s)| m == machine && s == state))
        && f.machine.as_ref().is_none_or(|m| m == machine)
        && f.state.as_ref().is_none_or(|s| s == state || f.substates.iter().any(|(m, ss)| m == machine && ss == state))
}

/// ` ORDER BY` of an entered order.
fn entered_order(order: EntityOrder) -> &'static str {
    if order == EntityOrder::EnteredLast { " ORDER BY entered_at DESC, id DESC" } else { " ORDER BY entered_at, id" }
}

/// The smallest string greater than every string that starts with `prefix`, byte-wise
/// (UTF-8 byte order is code point order): `prefix` with its last character that can
/// grow grown by one, cut after it. `None`: no such string (every character is U+10FFFF).
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        if (0xD800..=0xDFFF).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

struct Builder {
    params: Vec<Param>,
    dollar: bool,
}

impl Builder {
    /// A placeholder for `p`.
    fn bind(&mut self, p: Param) -> String {
        self.params.push(p);
        let n = self.params.len();
        if self.dollar { format!("${n}") } else { format!("?{n}") }
    }

    fn text(&mut self, s: &str) -> String {
        self.bind(Param::Text(s.to_string()))
    }

    /// ` AND run_status = …` for `f`'s run status; a status other than `active` also
    /// names the partial index's condition, so that the index serves it.
    fn status(&mut self, f: &EntityFilter) -> String {
        match f.run_status.as_deref() {
            None => String::new(),
            Some(s) => {
                let p = self.text(s);
                let partial = if s == "active" { "" } else { " AND run_status <> 'active'" };
                format!(" AND run_status = {p}{partial}")
            }
        }
    }

    /// ` AND …` keeping `f.pairs` (those of `machine`, when given); none: nothing matches.
    fn only(&mut self, f: &EntityFilter, machine: Option<&str>) -> String {
        let Some(pairs) = &f.pairs else { return String::new() };
        let mut alternatives = Vec::new();
        for (m, s) in pairs.iter().filter(|(m, _)| machine.is_none_or(|x| x == m)) {
            let (m, s) = (self.text(m), self.text(s));
            alternatives.push(format!("(machine = {m} AND state = {s})"));
        }
        if alternatives.is_empty() {
            return " AND 1 = 0".to_string();
        }
        format!(" AND ({})", alternatives.join(" OR "))
    }

    fn limit(&mut self, limit: Option<i64>) -> String {
        match limit {
            Some(l) => format!(" LIMIT {}", self.bind(Param::Int(l))),
            None => String::new(),
        }
    }

    /// The whole table (or the entities not active) in id order, every filter a condition.
    fn scan(&mut self, f: &EntityFilter, limit: Option<i64>) -> String {
        let mut sql =
            format!("SELECT {ENTITY_COLS} FROM entities WHERE id > {}", self.bind(Param::Int(f.after_id.unwrap_or(0))));
        if let Some(m) = &f.machine {
            sql += &format!(" AND machine = {}", self.text(m));
        }
        if let Some(s) = &f.state {
            let mut alternatives = vec![format!("state = {}", self.text(s))];
            for (m, ss) in &f.substates {
                let (m, ss) = (self.text(m), self.text(ss));
                alternatives.push(format!("(machine = {m} AND state = {ss})"));
            }
            sql += &format!(" AND ({})", alternatives.join(" OR "));
        }
        sql += &self.only(f, None);
        sql += &self.status(f);
        if f.order == EntityOrder::Id {
            sql += " ORDER BY id";
        } else {
            // More pairs than a union holds: one sort of what the filters reach.
            sql += &self.entered_after(f);
            sql += entered_order(f.order);
        }
        sql += &self.limit(limit);
        sql
    }

    /// ` AND` the row comes after `f.after_entered` in `f`'s entered order.
    fn entered_after(&mut self, f: &EntityFilter) -> String {
        let Some((at, id)) = f.after_entered else { return String::new() };
        let (at, id) = (self.bind(Param::Int(at)), self.bind(Param::Int(id)));
        let op = if f.order == EntityOrder::EnteredLast { "<" } else { ">" };
        format!(" AND (entered_at, id) {op} ({at}, {id})")
    }

    /// One (machine, state, entered_at, id)-ordered index range per pair, each cut at the
    /// page size, merged in that order.
    fn by_entered(&mut self, f: &EntityFilter, pairs: &[&(String, String)], limit: Option<i64>) -> String {
        let mut parts = Vec::with_capacity(pairs.len());
        for (machine, state) in pairs {
            let (m, s) = (self.text(machine), self.text(state));
            let mut part = format!("SELECT {ENTITY_COLS} FROM entities WHERE machine = {m} AND state = {s}");
            part += &self.entered_after(f);
            part += &self.status(f);
            part += entered_order(f.order);
            part += &self.limit(limit);
            parts.push(format!("SELECT * FROM ({part}) r{}", parts.len()));
        }
        if parts.len() == 1 {
            return parts.pop().expect("one part");
        }
        let mut sql = format!("SELECT * FROM ({}) u{}", parts.join(" UNION ALL "), entered_order(f.order));
        sql += &self.limit(limit);
        sql
    }

    /// One id-ordered index range per (machine, state) pair, each cut at the page size.
    fn by_pairs(&mut self, f: &EntityFilter, pairs: &[&(String, String)], limit: Option<i64>) -> String {
        let after = f.after_id.unwrap_or(0);
        let mut parts = Vec::with_capacity(pairs.len());
        for (machine, state) in pairs {
            let (m, s, a) = (self.text(machine), self.text(state), self.bind(Param::Int(after)));
            let mut part =
                format!("SELECT {ENTITY_COLS} FROM entities WHERE machine = {m} AND state = {s} AND id > {a}");
            part += &self.status(f);
            part += " ORDER BY id";
            part += &self.limit(limit);
            parts.push(format!("SELECT * FROM ({part}) r{}", parts.len()));
        }
        if parts.len() == 1 {
            return parts.pop().expect("one part");
        }
        let mut sql = format!("SELECT * FROM ({}) u ORDER BY id", parts.join(" UNION ALL "));
        sql += &self.limit(limit);
        sql
    }

    /// One key-ordered index range per machine, in (machine, key) order after the cursor.
    fn by_key(
        &mut self,
        f: &EntityFilter,
        prefix: &str,
        present: &[(String, String)],
        limit: Option<i64>,
    ) -> Option<String> {
        let mut machines: Vec<&str> = match &f.machine {
            Some(m) => vec![m.as_str()],
            None => present.iter().map(|(m, _)| m.as_str()).collect(),
        };
        machines.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        machines.dedup();
        if let Some((after_machine, _)) = &f.after_key {
            machines.retain(|m| m.as_bytes() >= after_machine.as_bytes());
        }
        if machines.is_empty() {
            return None;
        }
        let end = prefix_end(prefix);
        // Keys compare byte-wise in both stores (PostgreSQL: the column's collation is "C").
        let key = "key";
        let mut parts = Vec::with_capacity(machines.len());
        for (ord, machine) in machines.iter().enumerate() {
            let m = self.text(machine);
            let mut part = format!("SELECT {ENTITY_COLS}, {ord} AS ord FROM entities WHERE machine = {m}");
            part += &format!(" AND {key} >= {}", self.text(prefix));
            if let Some(end) = &end {
                part += &format!(" AND {key} < {}", self.text(end));
            }
            if let Some((after_machine, after_key)) = &f.after_key
                && after_machine == machine
            {
                part += &format!(" AND {key} > {}", self.text(after_key));
            }
            if let Some(s) = &f.state {
                let mut states = vec![self.text(s)];
                for (sm, ss) in &f.substates {
                    if sm == machine {
                        states.push(self.text(ss));
                    }
                }
                part += &format!(" AND state IN ({})", states.join(", "));
            }
            part += &self.only(f, Some(machine));
            part += &self.status(f);
            part += &format!(" ORDER BY {key}");
            part += &self.limit(limit);
            parts.push(format!("SELECT * FROM ({part}) r{ord}"));
        }
        let mut sql = format!("SELECT * FROM ({}) u ORDER BY ord, key", parts.join(" UNION ALL "));
        sql += &self.limit(limit);
        Some(sql)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(m, s)| (m.to_string(), s.to_string())).collect()
    }

    #[test]
    fn a_prefix_ends_before_the_next_string_that_does_not_start_with_it() {
        assert_eq!(prefix_end("srv-"), Some("srv.".into()));
        assert_eq!(prefix_end("a\u{10FFFF}"), Some("b".into()));
        assert_eq!(prefix_end("\u{D7FF}"), Some("\u{E000}".into()));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end(""), None);
    }

    #[test]
    fn a_state_filter_reads_one_index_range_per_pair_that_holds_entities() {
        let present = pairs(&[("m", "idle"), ("m", "busy"), ("n", "idle"), ("n", "sub")]);
        let f = EntityFilter {
            state: Some("idle".into()),
            substates: pairs(&[("n", "sub")]),
            limit: Some(50),
            ..Default::default()
        };
        let (sql, params) = page_sql(&f, &present, false).unwrap();
        assert_eq!(sql.matches("UNION ALL").count(), 2, "{sql}");
        let texts: Vec<&Param> = params.iter().filter(|p| matches!(p, Param::Text(_))).collect();
        assert_eq!(
            texts,
            ["m", "idle", "n", "idle", "n", "sub"].map(|s| Param::Text(s.into())).iter().collect::<Vec<_>>()
        );
        // No pair holds entities: nothing to read.
        let f = EntityFilter { machine: Some("x".into()), ..Default::default() };
        assert!(page_sql(&f, &present, false).is_none());
    }

    #[test]
    fn a_status_other_than_active_names_the_partial_index_condition() {
        let f = EntityFilter { run_status: Some("failed".into()), ..Default::default() };
        let (sql, _) = page_sql(&f, &[], true).unwrap();
        assert!(sql.contains("run_status = $2 AND run_status <> 'active'"), "{sql}");
        let f = EntityFilter { run_status: Some("active".into()), ..Default::default() };
        let (sql, _) = page_sql(&f, &[], true).unwrap();
        assert!(!sql.contains("<> 'active'"), "{sql}");
    }

    #[test]
    fn an_entered_order_reads_one_index_range_per_pair_after_its_cursor() {
        let present = pairs(&[("m", "idle"), ("m", "busy"), ("n", "idle")]);
        let f = EntityFilter {
            machine: Some("m".into()),
            order: EntityOrder::EnteredLast,
            after_entered: Some((500, 7)),
            limit: Some(10),
            ..Default::default()
        };
        let (sql, params) = page_sql(&f, &present, true).unwrap();
        assert_eq!(sql.matches("UNION ALL").count(), 1, "{sql}");
        assert_eq!(sql.matches("(entered_at, id) < ($3, $4)").count(), 1, "{sql}");
        assert!(sql.ends_with("ORDER BY entered_at DESC, id DESC LIMIT $11"), "{sql}");
        assert_eq!(params[2..4], [Param::Int(500), Param::Int(7)]);
        // Every pair when no machine or state is given.
        let f = EntityFilter { order: EntityOrder::EnteredFirst, limit: Some(5), ..Default::default() };
        let (sql, _) = page_sql(&f, &present, false).unwrap();
        assert_eq!(sql.matches("UNION ALL").count(), 2, "{sql}");
        assert!(sql.contains("ORDER BY entered_at, id"), "{sql}");
        assert!(page_sql(&EntityFilter { machine: Some("x".into()), ..f }, &present, false).is_none());
    }

    #[test]
    fn a_key_prefix_pages_by_machine_and_key_after_the_cursor() {
        let present = pairs(&[("b", "idle"), ("a", "idle"), ("c", "idle")]);
        let f = EntityFilter {
            key_prefix: Some("srv-".into()),
            after_key: Some(("b".into(), "srv-7".into())),
            limit: Some(10),
            ..Default::default()
        };
        let (sql, params) = page_sql(&f, &present, true).unwrap();
        // `a` is before the cursor; `b` continues after its key; `c` from the prefix.
        assert_eq!(sql.matches("UNION ALL").count(), 1, "{sql}");
        assert!(sql.contains("key > $4"), "{sql}");
        assert_eq!(params[0], Param::Text("b".into()));
        assert_eq!(params[3], Param::Text("srv-7".into()));
    }
}
