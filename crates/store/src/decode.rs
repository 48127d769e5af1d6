//! Decoding rows, once for both drivers: a driver's row is read through [`Columns`] (by
//! column index, in the order of the column lists of [`crate::sql`]), so each stored type
//! is decoded in one place whatever the database.

use serde::de::DeserializeOwned;
use settle_core::{ActionName, EntityKey, EventName, MachineName, StateName};

use crate::{AgentTask, EntityRow, InboxItem, InboxKind, OperationRow, RunStatus, TimerRow, Trigger};

/// Text of a row the plan reads: shared, so that its copies (the row as read, kept beside
/// the row as it becomes; the names a commit's telemetry repeats) cost no allocation.
pub(crate) type Text = std::sync::Arc<str>;

/// The writer's maps and sets of a batch (by entity id, slot, request id, machine and key)
/// and its table of names hash with foldhash, not the standard library's SipHash: a batch's
/// thousands of lookups spent about 2 % of the writer's instructions hashing (callgrind,
/// `bench chain`). Seeded per process.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// A set hashed as [`HashMap`] is.
pub(crate) type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// The most names [`name`] keeps per thread; past it, it forgets them all and starts again.
const NAMES_KEPT: usize = 4_096;

thread_local! {
    /// The names rows of this thread repeated, each allocated once.
    static NAMES: std::cell::RefCell<HashSet<Text>> = std::cell::RefCell::default();
}

/// `s` as shared text, for a column whose values rows repeat (a machine, a state, a
/// definition's hash, a lease holder): the same text read again is the same allocation,
/// looked up rather than allocated and copied (the writer reads tens of thousands of rows a
/// second with a handful of distinct values in these columns). Kept per thread, at most
/// [`NAMES_KEPT`] of them.
pub(crate) fn name(s: &str) -> Text {
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if let Some(known) = names.get(s) {
            return known.clone();
        }
        if names.len() >= NAMES_KEPT {
            names.clear();
        }
        let new: Text = s.into();
        names.insert(new.clone());
        new
    })
}

/// A row of a backend's driver, read by column index.
pub(crate) trait Columns {
    /// The driver's failure to read a column.
    type Error;
    /// An integer column.
    fn int(&self, col: usize) -> Result<i64, Self::Error>;
    /// An integer column that may be null.
    fn opt_int(&self, col: usize) -> Result<Option<i64>, Self::Error>;
    /// A text column.
    fn text(&self, col: usize) -> Result<String, Self::Error>;
    /// A text column that may be null.
    fn opt_text(&self, col: usize) -> Result<Option<String>, Self::Error>;
    /// `f` of a text column that may be null, borrowed.
    fn with_opt_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> Result<Option<T>, Self::Error>;
    /// A boolean column.
    fn flag(&self, col: usize) -> Result<bool, Self::Error>;
    /// `f` of a text column, borrowed.
    fn with_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> Result<T, Self::Error>;
    /// A column that holds what no row may hold.
    fn corrupt(col: usize, message: String) -> Self::Error;

    /// A count column, as a `u32` (clamped: a count is never negative).
    fn small(&self, col: usize) -> Result<u32, Self::Error> {
        Ok(self.int(col)?.clamp(0, i64::from(u32::MAX)) as u32)
    }
    /// A JSON text column.
    fn json<T: DeserializeOwned>(&self, col: usize) -> Result<T, Self::Error> {
        self.with_text(col, |t| serde_json::from_str::<T>(t))?
            .map_err(|e| Self::corrupt(col, format!("column {col}: {e}")))
    }
}

/// The columns of `row` from `at` on, as a row of their own.
pub(crate) struct At<'a, C>(pub(crate) &'a C, pub(crate) usize);

impl<C: Columns> Columns for At<'_, C> {
    type Error = C::Error;
    fn int(&self, col: usize) -> Result<i64, C::Error> {
        self.0.int(self.1 + col)
    }
    fn opt_int(&self, col: usize) -> Result<Option<i64>, C::Error> {
        self.0.opt_int(self.1 + col)
    }
    fn text(&self, col: usize) -> Result<String, C::Error> {
        self.0.text(self.1 + col)
    }
    fn opt_text(&self, col: usize) -> Result<Option<String>, C::Error> {
        self.0.opt_text(self.1 + col)
    }
    fn with_opt_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> Result<Option<T>, C::Error> {
        self.0.with_opt_text(self.1 + col, f)
    }
    fn flag(&self, col: usize) -> Result<bool, C::Error> {
        self.0.flag(self.1 + col)
    }
    fn with_text<T>(&self, col: usize, f: impl FnOnce(&str) -> T) -> Result<T, C::Error> {
        self.0.with_text(self.1 + col, f)
    }
    fn corrupt(col: usize, message: String) -> C::Error {
        C::corrupt(col, message)
    }
}

/// An entity, from `SELECT {ENTITY_COLS}`.
pub(crate) fn entity<C: Columns>(r: &C) -> Result<EntityRow, C::Error> {
    let run_status = r.with_text(16, |s| RunStatus::parse(s).ok_or_else(|| format!("unknown run status `{s}`")))?;
    Ok(EntityRow {
        id: r.int(0)?,
        machine: MachineName::new(r.text(1)?),
        key: EntityKey::new(r.text(2)?),
        state: StateName::new(r.text(3)?),
        properties: r.json(4)?,
        version: r.int(5)?,
        retry: r.small(6)?,
        created_at: r.int(7)?,
        entered_at: r.int(8)?,
        auto_at: r.opt_int(9)?,
        due_at: r.opt_int(10)?,
        lease_owner: r.opt_text(11)?,
        lease_until: r.opt_int(12)?,
        request_id: r.opt_text(13)?,
        fired: r.json::<Vec<String>>(14)?.into_iter().map(EventName::from).collect(),
        timer_at: r.opt_int(15)?,
        run_status: run_status.map_err(|m| C::corrupt(16, m))?,
        sleep_until: r.opt_int(17)?,
        recent_errors: r.json(18)?,
        event_id: r.opt_int(19)?,
        machine_hash: r.opt_text(20)?,
    })
}

/// An inbox item, from `SELECT id, entity_id, event, params, request_id, created_at, kind,
/// reply`.
pub(crate) fn inbox<C: Columns>(r: &C) -> Result<InboxItem, C::Error> {
    let kind = r.with_text(6, |k| InboxKind::parse(k).ok_or_else(|| format!("unknown inbox kind `{k}`")))?;
    Ok(InboxItem {
        id: r.int(0)?,
        entity_id: r.int(1)?,
        event: EventName::new(r.text(2)?),
        params: r.json(3)?,
        request_id: r.opt_text(4)?,
        created_at: r.int(5)?,
        kind: kind.map_err(|m| C::corrupt(6, m))?,
        reply: reply(r, 7)?,
    })
}

/// An operation, from `SELECT {OPERATION_COLS}`.
pub(crate) fn operation<C: Columns>(r: &C) -> Result<OperationRow, C::Error> {
    Ok(OperationRow {
        id: r.int(0)?,
        request_id: r.text(1)?,
        name: r.text(2)?,
        machine: r.opt_text(3)?,
        entity_key: r.opt_text(4)?,
        started_at: r.int(5)?,
        ended_at: r.opt_int(6)?,
        first_response_at: r.opt_int(7)?,
        outcome: r.opt_text(8)?,
        error: r.opt_text(9)?,
        restart_count: r.small(10)?,
        dimensions: r.json(11)?,
    })
}

/// An agent task with what an agent needs, from `SELECT {TASK_COLS}`.
pub(crate) fn task<C: Columns>(r: &C) -> Result<AgentTask, C::Error> {
    Ok(AgentTask {
        id: r.int(0)?,
        queue: r.text(1)?,
        machine: MachineName::new(r.text(2)?),
        key: EntityKey::new(r.text(3)?),
        entity_id: r.int(4)?,
        state: StateName::new(r.text(5)?),
        action: ActionName::new(r.text(6)?),
        entity_version: r.int(7)?,
        retry: r.small(8)?,
        properties: r.json(9)?,
        errors: r.json::<Vec<serde_json::Value>>(10)?.len() as u32,
        request_id: r.opt_text(11)?,
        status: r.text(12)?,
        attempt: r.small(13)?,
        token: r.opt_text(14)?,
        agent: r.opt_text(15)?,
        locked_until: r.opt_int(16)?,
        lock_ms: r.int(17)?,
        available_at: r.int(18)?,
        created_at: r.int(19)?,
        outcome: r.opt_text(20)?,
        error: r.opt_text(21)?,
        event: r.opt_text(22)?.map(EventName::new),
        params: match r.opt_text(23)? {
            Some(_) => r.json(23)?,
            None => serde_json::Value::Null,
        },
    })
}

/// The event an entity's workflow runs for, from `SELECT event, params, reply FROM events`
/// (`None`: no such row).
pub(crate) fn trigger<C: Columns>(r: &C) -> Result<Option<Trigger>, C::Error> {
    let Some(event) = r.opt_text(0)? else { return Ok(None) };
    let params = match r.opt_text(1)? {
        Some(_) => r.json(1)?,
        None => serde_json::Value::Null,
    };
    Ok(Some(Trigger { event: EventName::new(event), params, reply: reply(r, 2)? }))
}

/// A sync nested event's reply, from a nullable JSON text column.
fn reply<C: Columns>(r: &C, col: usize) -> Result<Option<crate::Reply>, C::Error> {
    Ok(match r.opt_text(col)? {
        Some(_) => crate::Reply::from_json(&r.json::<serde_json::Value>(col)?),
        None => None,
    })
}

/// A timer, from `SELECT entity_id, name, event, due_at, every_ms`.
pub(crate) fn timer<C: Columns>(r: &C) -> Result<TimerRow, C::Error> {
    Ok(TimerRow {
        entity_id: r.int(0)?,
        name: r.text(1)?,
        event: EventName::new(r.text(2)?),
        due_at: r.int(3)?,
        every_ms: r.opt_int(4)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name read again is the allocation read first; another name is its own; past the
    /// limit the names kept start again, and each still reads as its text.
    #[test]
    fn a_repeated_name_is_one_allocation() {
        let (a, b) = (name("provisioning"), name(&String::from("provisioning")));
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        let other = name("ready");
        assert!(!std::sync::Arc::ptr_eq(&a, &other));
        assert_eq!((&*a, &*other), ("provisioning", "ready"));
        for n in 0..NAMES_KEPT {
            name(&format!("n{n}"));
        }
        let again = name("provisioning");
        assert_eq!(&*again, "provisioning");
        assert!(NAMES.with(|names| names.borrow().len()) <= NAMES_KEPT);
    }
}
