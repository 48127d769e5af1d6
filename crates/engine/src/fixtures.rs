//! Rows the engine's unit tests build: one place that names every field of a stored
//! entity, so a test states only what it cares about.

use settle_store::EntityRow;

/// Entity `key` of `machine` in `state`, as a fresh row has it (id 1, version 1, at rest,
/// unleased, no properties): set what a test needs with struct update syntax.
pub(crate) fn entity(machine: &str, key: &str, state: &str) -> EntityRow {
    EntityRow {
        id: 1,
        machine: machine.into(),
        key: key.into(),
        state: state.into(),
        properties: Default::default(),
        version: 1,
        retry: 0,
        created_at: 0,
        entered_at: 0,
        auto_at: None,
        due_at: None,
        lease_owner: None,
        lease_until: None,
        request_id: None,
        fired: Vec::new(),
        timer_at: None,
        run_status: Default::default(),
        sleep_until: None,
        recent_errors: Vec::new(),
        event_id: None,
        machine_hash: None,
    }
}
