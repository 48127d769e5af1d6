//! The `stored_json` target: values written into a real SQLite store's columns, read back
//! through the store's API.

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, json};
use settle_core::Machine;
use settle_engine::{Engine, RaiseOptions, Wait};
use settle_store::{AnyStore, EntityFilter, SqliteStore, Store, TaskFilter};

/// The columns a value is written to, chosen by the input's first byte: every column the
/// store decodes (JSON objects and arrays, names of kinds and statuses, names read as
/// UTF-8), and a few integer columns (a text where a number belongs).
const COLUMNS: &[(&str, &str)] = &[
    ("entities", "properties"),
    ("entities", "fired"),
    ("entities", "recent_errors"),
    ("entities", "run_status"),
    ("entities", "machine"),
    ("entities", "key"),
    ("entities", "state"),
    ("entities", "version"),
    ("entities", "machine_hash"),
    ("entities", "request_id"),
    ("inbox", "params"),
    ("inbox", "event"),
    ("inbox", "kind"),
    ("history", "kind"),
    ("history", "from_state"),
    ("history", "detail"),
    ("agent_tasks", "queue"),
    ("agent_tasks", "action"),
    ("agent_tasks", "status"),
    ("agent_tasks", "outcome"),
    ("agent_tasks", "lock_ms"),
    ("operations", "dimensions"),
    ("operations", "outcome"),
    ("operations", "name"),
    ("machines", "definition"),
    ("timers", "event"),
    ("timers", "every_ms"),
    ("events", "event"),
    ("events", "end_state"),
    ("errors", "details"),
    ("entity_counts", "run_status"),
    ("entity_counts", "n"),
];

/// The store, built once per process: a SQLite file populated by an engine (a door, and a
/// machine whose action agents execute: entities, history, operations, events, an agent
/// task), then a pending inbox item, a timer and an error added; the engine is then shut
/// down. Each table's rows are copied to `fuzz_<table>` (with their rowid), from which each
/// input's change is undone.
struct Stored {
    runtime: tokio::runtime::Runtime,
    store: AnyStore,
    entity_ids: Vec<i64>,
    request_id: String,
    _dir: tempfile::TempDir,
}

/// The process's store, built by the first input ([`release`] drops it).
static STORED: Mutex<Option<Arc<Stored>>> = Mutex::new(None);

/// Drops the process's store, and its directory with it (the next input builds another).
pub(crate) fn release() {
    STORED.lock().unwrap_or_else(PoisonError::into_inner).take();
}

fn stored() -> Arc<Stored> {
    let mut slot = STORED.lock().unwrap_or_else(PoisonError::into_inner);
    slot.get_or_insert_with(|| Arc::new(build())).clone()
}

fn build() -> Stored {
    {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let dir = crate::http_target::temp_dir();
        let (store, entity_ids, request_id) = runtime.block_on(async {
            let store = AnyStore::Sqlite(SqliteStore::open(dir.path().join("settle.db")).expect("a store"));
            let mut builder = Engine::builder(store.clone());
            for (name, text) in [
                ("door", include_str!("../../server/src/testdata/door.toml")),
                ("vm", include_str!("../../server/src/testdata/vm.toml")),
            ] {
                let (machine, _) = settle_core::toml::load(&format!("{name}.toml"), name, text).expect("a machine");
                builder = builder.machine(machine);
            }
            let engine = builder.start().await.expect("an engine");
            let door = engine.create("door", "d1", Map::new()).await.expect("door d1");
            let raised = engine
                .raise("door", "d1", "paint", RaiseOptions::wait(Wait::Stable).params(json!({"color": "red"})))
                .await
                .expect("d1 painted");
            let vm = engine.create("vm", "v1", Map::new()).await.expect("vm v1");
            engine.raise("vm", "v1", "create", RaiseOptions::wait(Wait::Outcome)).await.expect("v1 created");
            engine.shutdown().await;
            let (d, v) = (door.id, vm.id);
            let setup = format!(
                "INSERT INTO inbox (entity_id, event, params, request_id, created_at, kind)
                     VALUES ({d}, 'paint', '{{\"color\":\"blue\"}}', 'fuzz-inbox', 1, 'raised');
                 INSERT INTO timers (entity_id, name, event, due_at, every_ms) VALUES ({d}, 'tick', 'open', 1, 60000);
                 INSERT INTO errors (entity_id, request_id, at, kind, details)
                     VALUES ({v}, 'fuzz-error', 1, 'action_error', 'no route to host');
                 INSERT INTO successors (predecessor_id, successor_id, request_id, created_at) VALUES ({v}, {d}, 'fuzz', 1);"
            );
            store.sql_execute(&setup).await.expect("the fixture rows");
            let mut backup = String::new();
            let mut tables: Vec<&str> = COLUMNS.iter().map(|(t, _)| *t).collect();
            tables.dedup();
            for table in tables {
                let rowid = if table == "entity_counts" { "" } else { "rowid AS fuzz_rowid, " };
                backup.push_str(&format!("CREATE TABLE fuzz_{table} AS SELECT {rowid}* FROM {table};"));
            }
            store.sql_execute(&backup).await.expect("the backup tables");
            (store, vec![d, v], raised.request_id)
        });
        Stored { runtime, store, entity_ids, request_id, _dir: dir }
    }
}

/// The SQL value `payload` is written as: its bytes as text (mode 0 and 3; possibly not
/// UTF-8), as a blob (1), or the text converted to a number (2).
fn sql_value(mode: u8, payload: &[u8]) -> String {
    let hex: String = payload.iter().map(|b| format!("{b:02X}")).collect();
    match mode {
        1 => format!("X'{hex}'"),
        2 => format!("CAST(CAST(X'{hex}' AS TEXT) AS NUMERIC)"),
        _ => format!("CAST(X'{hex}' AS TEXT)"),
    }
}

/// Writes the input into a column of the store ([`COLUMNS`], by the first byte modulo
/// their count; bits 6 and 7 choose text, blob or number), reads everything back through
/// the [`Store`] API (whose answers may be errors, never panics), and undoes the change.
/// A stored definition read back is also decoded with [`Machine::from_canonical_json`], as
/// `settle inspect` does, and so is the payload itself.
pub fn stored_json(data: &[u8]) {
    let Some((&first, payload)) = data.split_first() else {
        return;
    };
    if let Ok(text) = std::str::from_utf8(payload) {
        drop(Machine::from_canonical_json(text));
    }
    let s = stored();
    let (table, column) = COLUMNS[usize::from(first & 0x3f) % COLUMNS.len()];
    let value = sql_value(first >> 6, payload);
    s.runtime.block_on(async {
        let store = &s.store;
        // A value the column's constraints refuse changes nothing: there is nothing to read.
        if store.sql_execute(&format!("UPDATE {table} SET {column} = {value}")).await.is_ok() {
            read_everything(&s).await;
        }
        // `entity_counts` has no rowid (and no trigger of its own): it is copied back whole.
        let restore = if table == "entity_counts" {
            "DELETE FROM entity_counts; INSERT INTO entity_counts SELECT * FROM fuzz_entity_counts;".to_string()
        } else {
            format!(
                "UPDATE {table} SET {column} = (SELECT b.{column} FROM fuzz_{table} b WHERE b.fuzz_rowid = {table}.rowid);
                 DELETE FROM entity_counts WHERE n = 0;"
            )
        };
        store.sql_execute(&restore).await.expect("the change is undone");
    });
}

async fn read_everything(s: &Stored) {
    let store = &s.store;
    let _ = store.entity_get("door", "d1").await;
    let _ = store.entity_get("vm", "v1").await;
    let _ = store.entity_list(EntityFilter::default()).await;
    let _ = store.entity_list(EntityFilter { machine: Some("door".into()), ..EntityFilter::default() }).await;
    let _ = store.entity_count_by_state("door").await;
    let _ = store.entity_count_pending().await;
    let _ = store.entities_by_id(s.entity_ids.clone()).await;
    for &id in &s.entity_ids {
        let _ = store.history_list(id).await;
        let _ = store.successor_snapshot(id).await;
        let _ = store.timer_list(id).await;
        let _ = store.inbox_list(id).await;
        let _ = store.predecessor_list(id).await;
        let _ = store.error_list(id, 10).await;
        let _ = store.events_list(id).await;
    }
    let _ = store.task_list(TaskFilter::default()).await;
    let _ = store.operation_get(&s.request_id).await;
    let _ = store.operations_ended(vec![s.request_id.clone()]).await;
    let _ = store.operation_list(None, 10).await;
    let _ = store.operation_trace(&s.request_id, 10).await;
    if let Ok(machines) = store.machine_list().await {
        for m in machines {
            drop(Machine::from_canonical_json(&m.definition));
        }
    }
    let _ = store.machine_versions().await;
    let _ = store.stats(None).await;
    let _ = store.metrics_snapshot(0).await;
    let _ = store.overview(0, 0).await;
}
