//! Narrowing a selection of entities by what no index holds: a property expression in the
//! guards' language, the text of the newest error, and created/entered time ranges.
//!
//! The store reads a page through an index (machine, state, run status, key prefix);
//! [`Narrow`] keeps the rows of it that pass the rest. A list page examines a bounded
//! number of rows and says where to go on (so a page costs the same in a fleet of any
//! size, and may hold fewer than asked); a bulk operation's dry run and its pages examine
//! every row its index filter reaches.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use settle_core::Machine;
use settle_core::guard::Guard;
use settle_store::{EntityRow, ErrorRow, Millis, Store};

use crate::engine::Engine;
use crate::error::{Error, Result};

/// What a selection keeps of the rows its index filter reads: every criterion given must
/// hold. Times are epoch ms; `after` is inclusive, `before` exclusive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Narrow {
    /// A property expression (`props.region == "eu"`, `in_state('up')`): the guards'
    /// language, reading `props` and `in_state`. A row it cannot be evaluated on (a missing
    /// property) does not pass.
    pub expr: Option<Guard>,
    /// Text the entity's newest error contains, ignoring case (`#`: any number, see
    /// [`error_group`]).
    pub error: Option<String>,
    /// Created at or after.
    pub created_after: Option<Millis>,
    /// Created before.
    pub created_before: Option<Millis>,
    /// Entered its state at or after.
    pub entered_after: Option<Millis>,
    /// Entered its state before.
    pub entered_before: Option<Millis>,
}

/// The names of [`Narrow`]'s criteria, as requests and stored selections spell them.
pub const NARROW_FIELDS: [&str; 6] =
    ["where", "error", "created_after", "created_before", "entered_after", "entered_before"];

/// [`Narrow`]'s criteria as a request writes them: the expression's source, the error
/// text, times as RFC 3339 or relative to now (`-2h`: two hours ago).
#[derive(Debug, Default, Clone, Copy)]
pub struct NarrowText<'a> {
    /// `where`.
    pub expr: Option<&'a str>,
    /// `error`.
    pub error: Option<&'a str>,
    /// `created_after`.
    pub created_after: Option<&'a str>,
    /// `created_before`.
    pub created_before: Option<&'a str>,
    /// `entered_after`.
    pub entered_after: Option<&'a str>,
    /// `entered_before`.
    pub entered_before: Option<&'a str>,
}

impl Narrow {
    /// Reads `t` at `now` (epoch ms) and checks it; `Err` starts with the field at fault
    /// (`where: syntax error at column 9: …`).
    pub fn parse(t: NarrowText<'_>, now: Millis) -> std::result::Result<Narrow, String> {
        let time = |field: &str, text: Option<&str>| {
            text.map(|x| settle_core::time::parse_time(x, now).map_err(|e| format!("{field}: {e}"))).transpose()
        };
        let n = Narrow {
            expr: t.expr.map(Narrow::parse_expr).transpose()?,
            error: t.error.map(str::to_string),
            created_after: time("created_after", t.created_after)?,
            created_before: time("created_before", t.created_before)?,
            entered_after: time("entered_after", t.entered_after)?,
            entered_before: time("entered_before", t.entered_before)?,
        };
        n.check()?;
        Ok(n)
    }

    /// Whether no criterion is given.
    pub fn is_empty(&self) -> bool {
        *self == Narrow::default()
    }

    /// Parses a property expression: the error names the field and where (`where: syntax
    /// error at column 7: …`).
    pub fn parse_expr(source: &str) -> std::result::Result<Guard, String> {
        if source.trim().is_empty() {
            return Err("where: the expression is empty".into());
        }
        if source.contains("params.") {
            return Err("where: an expression over entities reads `props` (and `in_state`), not `params`".into());
        }
        Guard::parse_within(source, &settle_core::cost::Limits::REQUEST).map_err(|e| format!("where: {e}"))
    }

    /// Checks the criteria together: an empty error text, a range that ends before it
    /// starts. `Err` names the field.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.error.as_deref().is_some_and(|e| e.trim().is_empty()) {
            return Err("error: the text to look for is empty".into());
        }
        if let Some(n) = self.error.as_deref().map(|e| e.chars().count()).filter(|n| *n > ERROR_TEXT_MAX) {
            return Err(format!("error: the text to look for is {n} characters long; at most {ERROR_TEXT_MAX}"));
        }
        for (name, after, before) in
            [("created", self.created_after, self.created_before), ("entered", self.entered_after, self.entered_before)]
        {
            if let (Some(a), Some(b)) = (after, before)
                && a >= b
            {
                return Err(format!("{name}_before: the range is empty (it ends at or before {name}_after)"));
            }
        }
        Ok(())
    }

    /// Whether passing needs each row's newest error.
    pub fn reads_errors(&self) -> bool {
        self.error.is_some()
    }

    /// Whether `e` passes (`machine`: its machine, for `in_state`; `newest`: its newest
    /// error, read when [`Narrow::reads_errors`]).
    pub fn keeps(&self, e: &EntityRow, machine: Option<&Machine>, newest: Option<&ErrorRow>) -> bool {
        self.keeps_with(e, machine, newest, self.error.as_deref().map(ErrorText::new).as_ref())
    }

    /// [`keeps`](Self::keeps) with the error text already compiled (`error`: this
    /// narrow's, compiled once for every row of a page).
    fn keeps_with(
        &self,
        e: &EntityRow,
        machine: Option<&Machine>,
        newest: Option<&ErrorRow>,
        error: Option<&ErrorText>,
    ) -> bool {
        let within = |at: Millis, after: Option<Millis>, before: Option<Millis>| {
            after.is_none_or(|a| at >= a) && before.is_none_or(|b| at < b)
        };
        if !within(e.created_at, self.created_after, self.created_before)
            || !within(e.entered_at, self.entered_after, self.entered_before)
        {
            return false;
        }
        if let Some(text) = error {
            let Some(err) = newest else { return false };
            if !text.find(&err.details).0 {
                return false;
            }
        }
        match &self.expr {
            None => true,
            Some(g) => {
                let path: Vec<&str> = match machine {
                    Some(m) => m.path(&e.state).map(|s| s.name.as_str()).collect(),
                    None => vec![e.state.as_str()],
                };
                g.eval(&e.properties, &Value::Null, path).unwrap_or(false)
            }
        }
    }

    /// Which of `rows` pass, in order (`machine`: a machine by name, for `in_state`;
    /// `errors`: the newest error of each row, by entity id), the error text compiled once.
    /// `go_on` is asked before each row (with how many were looked at) and may stop the
    /// whole with its error.
    fn keeps_all<'m, E>(
        &self,
        rows: &[EntityRow],
        machine: impl Fn(&str) -> Option<&'m Machine>,
        errors: &HashMap<i64, ErrorRow>,
        mut go_on: impl FnMut(usize) -> std::result::Result<(), E>,
    ) -> std::result::Result<Vec<bool>, E> {
        let error = self.error.as_deref().map(ErrorText::new);
        let mut keeps = Vec::with_capacity(rows.len());
        for e in rows {
            go_on(keeps.len())?;
            keeps.push(self.keeps_with(e, machine(e.machine.as_str()), errors.get(&e.id), error.as_ref()));
        }
        Ok(keeps)
    }

    /// The criteria given, as a JSON object's members (`where` as written, times in ms).
    pub fn to_json(&self, o: &mut serde_json::Map<String, Value>) {
        if let Some(g) = &self.expr {
            o.insert("where".into(), json!(g.source()));
        }
        if let Some(e) = &self.error {
            o.insert("error".into(), json!(e));
        }
        for (k, v) in self.times() {
            if let Some(v) = v {
                o.insert(k.into(), json!(v));
            }
        }
    }

    /// Reads [`Narrow::to_json`] back; an expression that no longer parses is `Err`.
    pub fn from_json(v: &Value) -> std::result::Result<Narrow, String> {
        let time = |k: &str| v.get(k).and_then(Value::as_i64);
        Ok(Narrow {
            expr: v.get("where").and_then(Value::as_str).map(Narrow::parse_expr).transpose()?,
            error: v.get("error").and_then(Value::as_str).map(str::to_string),
            created_after: time("created_after"),
            created_before: time("created_before"),
            entered_after: time("entered_after"),
            entered_before: time("entered_before"),
        })
    }

    fn times(&self) -> [(&'static str, Option<Millis>); 4] {
        [
            ("created_after", self.created_after),
            ("created_before", self.created_before),
            ("entered_after", self.entered_after),
            ("entered_before", self.entered_before),
        ]
    }
}

/// The longest text `error=` may look for, in characters.
pub const ERROR_TEXT_MAX: usize = 256;

/// Whether `hay` contains `needle`, ignoring case; a `#` in `needle` stands for a run of
/// digits (or of `#`s), as in [`error_group`]'s text. Linear in `hay`: see [`ErrorText`].
pub fn error_matches(hay: &str, needle: &str) -> bool {
    ErrorText::new(needle).find(hay).0
}

/// A text to look for in errors, compiled once: a shift-and automaton over its characters
/// (lowercased), where each `#` is a class of digits and `#` repeated one or more times.
/// [`ErrorText::find`] reads each character of the error once and does a fixed amount of
/// work per character for a needle of [`ERROR_TEXT_MAX`] characters: O(error + needle),
/// whatever the texts (a text of one character repeated no longer costs its product).
#[derive(Debug, Clone)]
pub struct ErrorText {
    /// Per character: the positions of the needle it matches.
    masks: HashMap<char, Vec<u64>>,
    /// The positions of `#`.
    class: Vec<u64>,
    /// How many positions.
    len: usize,
}

impl ErrorText {
    /// Compiles `needle`.
    pub fn new(needle: &str) -> ErrorText {
        let chars: Vec<char> = needle.chars().flat_map(char::to_lowercase).collect();
        let words = chars.len().div_ceil(64).max(1);
        let (mut masks, mut class) = (HashMap::<char, Vec<u64>>::new(), vec![0u64; words]);
        for (i, c) in chars.iter().enumerate() {
            let bit = |v: &mut Vec<u64>| v[i / 64] |= 1 << (i % 64);
            if *c == '#' {
                bit(&mut class);
            } else {
                bit(masks.entry(*c).or_insert_with(|| vec![0; words]));
            }
        }
        ErrorText { masks, class, len: chars.len() }
    }

    /// Whether `hay` contains the text, and how many steps (characters of `hay` read) it
    /// took to know.
    pub fn find(&self, hay: &str) -> (bool, usize) {
        if self.len == 0 {
            return (true, 0);
        }
        let words = self.class.len();
        let (last_word, last_bit) = ((self.len - 1) / 64, 1u64 << ((self.len - 1) % 64));
        let mut state = vec![0u64; words];
        let mut mask = vec![0u64; words];
        let mut steps = 0;
        for c in hay.chars().flat_map(char::to_lowercase) {
            steps += 1;
            let in_class = c.is_ascii_digit() || c == '#';
            match self.masks.get(&c) {
                Some(m) => mask.copy_from_slice(m),
                None => mask.fill(0),
            }
            if in_class {
                for (m, k) in mask.iter_mut().zip(&self.class) {
                    *m |= k;
                }
            }
            // Every position one further (a new start at the first), where `c` fits; and a
            // `#` reached stays while digits follow.
            let mut carry = 1u64;
            for w in 0..words {
                let old = state[w];
                let stay = if in_class { old & self.class[w] } else { 0 };
                state[w] = (((old << 1) | carry) & mask[w]) | stay;
                carry = old >> 63;
            }
            if state[last_word] & last_bit != 0 {
                return (true, steps);
            }
        }
        (false, steps)
    }
}

/// An error's group: its text with each run of digits (ids, counts, codes) as `#`, so
/// that errors differing only in numbers fall together. [`error_matches`] finds its members.
pub fn error_group(details: &str) -> String {
    let mut out = String::with_capacity(details.len());
    let mut in_digits = false;
    for c in details.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

/// The newest recorded error of each of `rows` that has one, by entity id: one store call.
pub async fn newest_errors<S: Store>(store: &S, rows: &[EntityRow]) -> settle_store::Result<HashMap<i64, ErrorRow>> {
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    let ids = rows.iter().map(|e| e.id).collect();
    Ok(store.error_newest(ids).await?.into_iter().collect())
}

/// Which of `rows` pass `narrow`, in order (`machine`: a machine by name, for `in_state`),
/// and the newest errors read to decide (none unless it reads errors): evaluated here, on
/// the caller's thread, with no budget (a command's own process; a server uses
/// [`Engine::narrowed`]).
pub async fn keeps<'m, S: Store>(
    store: &S,
    narrow: &Narrow,
    rows: &[EntityRow],
    machine: impl Fn(&str) -> Option<&'m Machine>,
) -> settle_store::Result<(Vec<bool>, HashMap<i64, ErrorRow>)> {
    let errors = if narrow.reads_errors() { newest_errors(store, rows).await? } else { HashMap::new() };
    let keeps = narrow.keeps_all(rows, machine, &errors, |_| Ok(()))?;
    Ok((keeps, errors))
}

/// Rows examined by a selection: which of them passed its [`Narrow`], in order, and the
/// newest errors read to decide (none unless it reads errors).
#[derive(Debug, Default)]
pub struct Narrowed {
    /// The rows, as given.
    pub rows: Vec<EntityRow>,
    /// Whether each passed.
    pub keeps: Vec<bool>,
    /// The newest error of each row that has one, when the criteria read errors.
    pub errors: HashMap<i64, ErrorRow>,
}

/// Sets its flag when dropped: a request's evaluation stops once the request is gone (its
/// future dropped: the client left, or the server's request timeout passed).
struct Gone(Arc<AtomicBool>);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl<S: Store> Engine<S> {
    /// The newest recorded error of each of `rows` that has one, by entity id.
    pub async fn newest_errors(&self, rows: &[EntityRow]) -> Result<HashMap<i64, ErrorRow>> {
        Ok(newest_errors(&self.inner.store, rows).await?)
    }

    /// Which of `rows` pass `narrow`, in order, by the machines' current versions (for
    /// `in_state`). An expression or an error text is evaluated off the runtime's workers
    /// (a blocking thread; at most one per core at once, the others wait), row after row
    /// until [`Config::narrow_budget`](crate::Config::narrow_budget) of real time is spent
    /// ([`Error::TooCostly`]) or the caller is gone (its future dropped).
    pub async fn narrowed(&self, narrow: &Narrow, rows: Vec<EntityRow>) -> Result<Narrowed> {
        let deadline = std::time::Instant::now() + self.inner.narrow_budget;
        self.narrowed_until(narrow, rows, Some(deadline)).await
    }

    /// [`narrowed`](Self::narrowed) with a deadline of its own (`None`: none, for a bulk
    /// operation's pages, which run in the background at their own pace).
    pub(crate) async fn narrowed_until(
        &self,
        narrow: &Narrow,
        rows: Vec<EntityRow>,
        deadline: Option<std::time::Instant>,
    ) -> Result<Narrowed> {
        let errors =
            if narrow.reads_errors() { newest_errors(&self.inner.store, &rows).await? } else { HashMap::new() };
        if narrow.expr.is_none() && narrow.error.is_none() {
            let keeps = narrow.keeps_all(&rows, |_| None, &errors, |_| Ok::<(), Error>(()))?;
            return Ok(Narrowed { rows, keeps, errors });
        }
        let _turn = self.inner.narrowing.acquire().await.map_err(|_| Error::Stopped)?;
        let gone = Gone(Arc::new(AtomicBool::new(false)));
        let (left, registry, narrow) = (gone.0.clone(), self.inner.registry(), narrow.clone());
        let budget = self.inner.narrow_budget;
        let evaluated = tokio::task::spawn_blocking(move || {
            let machine = |name: &str| registry.machines.get(name).map(|m| m.as_ref());
            let keeps = narrow.keeps_all(&rows, machine, &errors, |examined| {
                if left.load(Ordering::Relaxed) {
                    return Err(Error::Stopped);
                }
                match deadline {
                    Some(d) if std::time::Instant::now() > d => Err(Error::TooCostly { examined, budget }),
                    _ => Ok(()),
                }
            })?;
            Ok(Narrowed { rows, keeps, errors })
        })
        .await;
        drop(gone);
        evaluated.map_err(|_| Error::Stopped)?
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use settle_store::{EntityRow, ErrorRow};

    use super::{Narrow, error_group, error_matches};

    fn row(props: serde_json::Value, created: i64, entered: i64) -> EntityRow {
        let mut e = crate::fixtures::entity("vm", "a", "up");
        e.properties = props.as_object().unwrap().clone();
        (e.created_at, e.entered_at) = (created, entered);
        e
    }

    fn error(details: &str) -> ErrorRow {
        ErrorRow {
            id: 1,
            request_id: None,
            at: 0,
            kind: "action_error".into(),
            details: details.into(),
            cause: Vec::new(),
        }
    }

    #[test]
    fn a_row_passes_when_every_criterion_given_holds() {
        let e = row(json!({"region": "eu", "cpus": 4}), 100, 500);
        assert!(Narrow::default().keeps(&e, None, None));
        let expr = |s: &str| Narrow { expr: Some(Narrow::parse_expr(s).unwrap()), ..Narrow::default() };
        assert!(expr(r#"props.region == "eu" && props.cpus >= 4"#).keeps(&e, None, None));
        assert!(!expr("props.cpus > 4").keeps(&e, None, None));
        assert!(!expr("props.missing == 1").keeps(&e, None, None), "cannot be evaluated: does not pass");
        assert!(expr("in_state('up')").keeps(&e, None, None));
        let err = Narrow { error: Some("QUOTA".into()), ..Narrow::default() };
        assert!(err.keeps(&e, None, Some(&error("provider: quota exceeded"))));
        assert!(!err.keeps(&e, None, Some(&error("timeout"))));
        assert!(!err.keeps(&e, None, None), "no error: no match");
        let entered = Narrow { entered_after: Some(500), entered_before: Some(501), ..Narrow::default() };
        assert!(entered.keeps(&e, None, None), "after is inclusive");
        let entered = Narrow { entered_before: Some(500), ..Narrow::default() };
        assert!(!entered.keeps(&e, None, None), "before is exclusive");
        let created = Narrow { created_after: Some(101), ..Narrow::default() };
        assert!(!created.keeps(&e, None, None));
    }

    #[test]
    fn an_error_group_stands_for_its_members_and_numbers_match_exactly_otherwise() {
        let text = "Provider: quota exceeded in region 12 (request 88812)";
        let group = error_group(text);
        assert_eq!(group, "Provider: quota exceeded in region # (request #)");
        assert!(error_matches(text, &group));
        assert!(error_matches("provider: quota exceeded in region 3 (request 1)", &group));
        assert!(!error_matches("provider: quota exceeded in region eu (request 1)", &group));
        assert!(error_matches(text, "QUOTA"));
        assert!(error_matches(text, "region 12"));
        assert!(!error_matches(text, "region 13"));
        assert!(error_matches("issue #4", "issue #"), "a # matches a # too");
        assert!(error_matches("", ""));
    }

    #[test]
    fn an_error_text_is_found_in_steps_linear_in_the_error() {
        use super::ErrorText;
        // The probe's worst case: a long run of one letter, a needle of it ending otherwise.
        let hay = "a".repeat(200_000);
        let needle = format!("{}b", "a".repeat(255));
        assert_eq!(ErrorText::new(&needle).find(&hay), (false, 200_000), "each character read once");
        let with_digits = format!("{}#x", "1a".repeat(100));
        let hay = "1a".repeat(50_000);
        assert_eq!(ErrorText::new(&with_digits).find(&hay), (false, 100_000));
        // Found as soon as it ends.
        let hay = format!("{}b{}", "a".repeat(1000), "c".repeat(1000));
        assert_eq!(ErrorText::new("aab").find(&hay), (true, 1001));
        assert_eq!(ErrorText::new("").find("anything"), (true, 0));
        // `#` is a run of digits, whatever its length; a needle longer than 64 spans words.
        let long = format!("{}#{}", "x".repeat(70), "y".repeat(70));
        assert!(ErrorText::new(&long).find(&format!("..{}12345{}..", "x".repeat(70), "y".repeat(70))).0);
        assert!(!ErrorText::new(&long).find(&format!("{}{}", "x".repeat(70), "y".repeat(70))).0);
    }

    #[test]
    fn bad_criteria_name_their_field() {
        assert!(Narrow::parse_expr("props.a ==").unwrap_err().starts_with("where: "));
        assert!(Narrow::parse_expr(" ").unwrap_err().contains("empty"));
        assert!(Narrow::parse_expr("params.x").unwrap_err().contains("not `params`"));
        let n = Narrow { entered_after: Some(5), entered_before: Some(5), ..Narrow::default() };
        assert!(n.check().unwrap_err().starts_with("entered_before:"));
        let n = Narrow { error: Some("".into()), ..Narrow::default() };
        assert!(n.check().unwrap_err().starts_with("error:"));
        let n = Narrow { error: Some("e".repeat(257)), ..Narrow::default() };
        assert_eq!(n.check().unwrap_err(), "error: the text to look for is 257 characters long; at most 256");
        let deep = format!("props{} == 1", ".a".repeat(100));
        assert!(Narrow::parse_expr(&deep).unwrap_err().starts_with("where: the expression nests deeper than 48"));
    }

    #[test]
    fn criteria_survive_their_encoding() {
        let n = Narrow {
            expr: Some(Narrow::parse_expr("props.n > 1").unwrap()),
            error: Some("quota".into()),
            created_after: Some(1),
            entered_before: Some(9),
            ..Narrow::default()
        };
        let mut o = serde_json::Map::new();
        n.to_json(&mut o);
        let v = serde_json::Value::Object(o);
        assert_eq!(v, json!({"where": "props.n > 1", "error": "quota", "created_after": 1, "entered_before": 9}));
        assert_eq!(Narrow::from_json(&v), Ok(n));
    }
}
