//! "Why did this fail?" read down to the first cause ([`why`]): an entity's failure (the
//! error of kind `failure` its entry into an error-health state recorded, else the error
//! that parked it), then, for each entity that failure names as its cause (the successors
//! a subscription matched), that entity's failure at or before it, and so on. Each step
//! reads one entity and its newest errors by index; the health of a state is its machine's
//! as stored for the version the entity runs under.

use std::collections::{HashMap, HashSet};

use settle_core::{Health, Machine};

use crate::{EntityRow, ErrorRow, HistoryRow, Millis, Result, RunStatus, Store};

/// How deep a chain is followed, and how many entities it shows in all.
const DEPTH: usize = 8;
const NODES: usize = 32;
/// How many of an entity's newest errors are looked through.
const ERRORS: u64 = 200;

/// One entity of a failure's chain of causes.
#[derive(Debug, Clone, PartialEq)]
pub struct Why {
    /// Its machine.
    pub machine: String,
    /// Its key.
    pub key: String,
    /// Its state now (`None`: not stored any more, removed after its retention).
    pub state: Option<String>,
    /// Its run status now.
    pub run_status: Option<RunStatus>,
    /// It is failing now: in an error-health state, or parked (`failed`, `fault`).
    pub failing: bool,
    /// Its failure (at the top: the latest; below: the latest at or before the failure it
    /// caused), if one is recorded.
    pub failure: Option<Failure>,
    /// The entities that failure names as its cause, each with its own.
    pub causes: Vec<Why>,
}

/// What an entity's failure recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// When.
    pub at: Millis,
    /// `failure` (it entered an error-health state), or the kind of error that parked it.
    pub kind: String,
    /// Why.
    pub details: String,
    /// The request whose work failed.
    pub request_id: Option<String>,
    /// The state it entered, when read from its history (older data without a `failure`).
    pub state: Option<String>,
    /// The entities it names as its cause.
    pub cause: Vec<crate::CauseRef>,
}

/// The chain of causes of `machine`/`key`'s failure, `None` if no such entity is stored.
pub async fn why<S: Store>(store: &S, machine: &str, key: &str) -> Result<Option<Why>> {
    let mut defs = Definitions::read(store).await?;
    let Some(top) = store.entity_get(machine, key).await? else { return Ok(None) };
    let mut seen = HashSet::from([(machine.to_string(), key.to_string())]);
    let mut root = node(store, &mut defs, Some(top), machine, key, None).await?;
    // Breadth first, a level at a time: (path of indices to the node, its failure time).
    let mut frontier: Vec<Vec<usize>> = vec![vec![]];
    let mut count = 1;
    for _ in 0..DEPTH {
        let mut next = Vec::new();
        for path in frontier {
            let parent = at(&mut root, &path);
            let Some(f) = &parent.failure else { continue };
            let (before, refs) = (f.at, f.cause.clone());
            for r in refs {
                if count >= NODES || !seen.insert((r.machine.clone(), r.key.clone())) {
                    continue;
                }
                count += 1;
                let row = store.entity_get(&r.machine, &r.key).await?;
                let child = node(store, &mut defs, row, &r.machine, &r.key, Some(before)).await?;
                let parent = at(&mut root, &path);
                parent.causes.push(child);
                let mut p = path.clone();
                p.push(parent.causes.len() - 1);
                next.push(p);
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    Ok(Some(root))
}

fn at<'a>(root: &'a mut Why, path: &[usize]) -> &'a mut Why {
    path.iter().fold(root, |n, &i| &mut n.causes[i])
}

/// One entity's node (no causes yet): `before` is the time of the failure it caused
/// (`None`: the entity asked about, whose latest failure counts).
async fn node<S: Store>(
    store: &S,
    defs: &mut Definitions,
    row: Option<EntityRow>,
    machine: &str,
    key: &str,
    before: Option<Millis>,
) -> Result<Why> {
    let Some(e) = row else {
        return Ok(Why {
            machine: machine.into(),
            key: key.into(),
            state: None,
            run_status: None,
            failing: false,
            failure: None,
            causes: Vec::new(),
        });
    };
    let def = defs.of(&e);
    let error_health =
        |state: &str| def.is_some_and(|m| m.state(state).is_some() && m.health_of(state) == Health::Error);
    let parked = matches!(e.run_status, RunStatus::Failed | RunStatus::Fault);
    let failing = error_health(&e.state) || parked;
    let errors = store.error_list(e.id, ERRORS).await?;
    let mut failure = pick(&errors, before, parked && before.is_none());
    if failure.is_none() && (failing || before.is_some()) {
        let history = store.history_list(e.id).await?;
        failure = from_history(&history, before, &error_health);
    }
    Ok(Why {
        machine: e.machine.to_string(),
        key: e.key.to_string(),
        state: Some(e.state.to_string()),
        run_status: Some(e.run_status),
        failing,
        failure,
        causes: Vec::new(),
    })
}

/// The failure among an entity's errors (newest first): the newest `failure` at or before
/// `before`; else, when it is parked now or a cause further down (`any`), its newest error
/// of any kind then.
fn pick(errors: &[ErrorRow], before: Option<Millis>, parked: bool) -> Option<Failure> {
    let in_time = |r: &&ErrorRow| before.is_none_or(|b| r.at <= b);
    let any = parked || before.is_some();
    let row = errors
        .iter()
        .filter(in_time)
        .find(|r| r.kind == "failure")
        .or_else(|| if any { errors.iter().find(|r| in_time(r)) } else { None })?;
    Some(Failure {
        at: row.at,
        kind: row.kind.clone(),
        details: row.details.clone(),
        request_id: row.request_id.clone(),
        state: None,
        cause: row.cause.clone(),
    })
}

/// A failure read from history (data recorded before failures were): the newest entry
/// into an error-health state, at or before `before`.
fn from_history(rows: &[HistoryRow], before: Option<Millis>, error: &dyn Fn(&str) -> bool) -> Option<Failure> {
    let row = rows
        .iter()
        .rev()
        .filter(|r| before.is_none_or(|b| r.at <= b))
        .find(|r| r.to.as_ref().is_some_and(|s| error(s)) && r.from.as_ref().is_none_or(|s| !error(s)))?;
    let to = row.to.as_ref().map(|s| s.to_string()).unwrap_or_default();
    let by = match (&row.event, &row.action) {
        (Some(ev), _) => format!(" on event `{ev}`"),
        (None, Some(a)) => format!(" by action `{a}`"),
        _ => String::new(),
    };
    Some(Failure {
        at: row.at,
        kind: "failure".into(),
        details: format!("entered `{to}`{by}"),
        request_id: row.request_id.clone(),
        state: Some(to),
        cause: Vec::new(),
    })
}

/// The stored definitions, parsed once each, by hash; the newest of a machine for an
/// entity whose version is not recorded.
struct Definitions {
    by_hash: HashMap<String, Option<Machine>>,
    newest: HashMap<String, String>,
    text: HashMap<String, String>,
}

impl Definitions {
    async fn read<S: Store>(store: &S) -> Result<Definitions> {
        let mut d = Definitions { by_hash: HashMap::new(), newest: HashMap::new(), text: HashMap::new() };
        let mut records = store.machine_list().await?;
        records.sort_by_key(|r| r.created_at);
        for r in records {
            d.newest.insert(r.name.to_string(), r.hash.clone());
            d.text.insert(r.hash, r.definition);
        }
        Ok(d)
    }

    fn of(&mut self, e: &EntityRow) -> Option<&Machine> {
        let hash = e.machine_hash.clone().or_else(|| self.newest.get(e.machine.as_str()).cloned())?;
        let text = &self.text;
        self.by_hash
            .entry(hash.clone())
            .or_insert_with(|| text.get(&hash).and_then(|t| Machine::from_canonical_json(t).ok()))
            .as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::{from_history, pick};
    use crate::{ErrorRow, HistoryKind, HistoryRow};

    fn err(id: i64, at: i64, kind: &str, details: &str) -> ErrorRow {
        ErrorRow { id, request_id: None, at, kind: kind.into(), details: details.into(), cause: vec![] }
    }

    #[test]
    fn the_failure_is_the_newest_in_time_and_a_parked_entity_falls_back_to_its_error() {
        let errors =
            vec![err(3, 30, "action_error", "timeout"), err(2, 20, "failure", "refused"), err(1, 10, "failure", "old")];
        assert_eq!(pick(&errors, None, false).unwrap().details, "refused");
        assert_eq!(pick(&errors, Some(15), false).unwrap().details, "old");
        let faults = vec![err(3, 30, "action_error", "timeout")];
        assert_eq!(pick(&faults, None, false), None, "not parked, no failure: nothing to explain");
        assert_eq!(pick(&faults, None, true).unwrap().details, "timeout");
        assert_eq!(pick(&faults, Some(40), false).unwrap().details, "timeout", "a cause below: any error");
        assert_eq!(pick(&faults, Some(20), false), None, "nothing before the failure it caused");
    }

    #[test]
    fn without_a_recorded_failure_history_says_when_it_entered_error() {
        let row = |at, from: Option<&str>, to: &str, event: Option<&str>| HistoryRow {
            id: at,
            entity_id: 1,
            from: from.map(Into::into),
            to: Some(to.into()),
            kind: HistoryKind::Event,
            action: Some("a".into()),
            event: event.map(Into::into),
            retry: 0,
            request_id: Some("r".into()),
            at,
            detail: None,
        };
        let rows = vec![
            row(1, None, "new", None),
            row(2, Some("new"), "undoing", Some("gave_up")),
            row(3, Some("undoing"), "failed", None),
        ];
        let error = |s: &str| s == "undoing" || s == "failed";
        let f = from_history(&rows, None, &error).unwrap();
        assert_eq!(
            (f.at, f.details.as_str(), f.state.as_deref()),
            (2, "entered `undoing` on event `gave_up`", Some("undoing"))
        );
        assert_eq!(from_history(&rows, Some(1), &error), None);
    }
}
