//! The conformance suite every [`Store`] implementation must pass (built with the crate's
//! `testing` feature, for the stores' tests).
//!
//! Each check is a public async function over a fresh, empty store. A backend's test file
//! instantiates them all with [`store_conformance_suite!`](crate::store_conformance_suite),
//! the way Quickwit's metastore suite does, so a second backend runs exactly the same
//! assertions. The checks are grouped by concept, one file each; this module holds what
//! they share: the backend's [`Dialect`], the fixtures, and the macro.

mod bulk;
mod cancel;
mod columns;
mod commands;
mod commits;
mod entities;
mod feed;
mod fleet;
mod leases;
mod limits;
mod operations;
mod prune;
mod rates;
mod schedules;
mod successors;
mod tasks;
mod telemetry;
mod timers;

pub use bulk::bulk_operations_start_once_lease_and_advance;
pub use cancel::canceling_an_operation_stops_its_work_and_queues_the_undo;
pub use columns::{
    a_command_is_recorded_when_it_applies, a_commit_creates_only_free_keys, a_commit_may_change_one_column_alone,
    a_successor_joined_in_a_batch_notifies_its_predecessor, an_internal_event_heads_the_inbox,
    commits_follow_the_workflow_of_their_event, consuming_an_event_keeps_the_notices,
    consuming_notices_keeps_the_events,
};
pub use commands::{
    commands_of_one_batch_apply_each_in_order, commands_set_run_status_and_end_their_operation,
    kill_drops_queued_work_and_cancels_its_operations,
};
pub use commits::{
    commit_applies_and_reports_head, commit_is_fenced, effects_are_atomic, preconditions_and_fired,
    rejection_keeps_version,
};
pub use entities::{create_get_and_duplicate, listing_counts_and_metadata};
pub use feed::{read_all as feed_read_all, the_feed_resumes_from_any_position_without_gaps};
pub use fleet::{
    a_deploy_is_written_whole, filtered_pages_match_a_scan, overview_counts_follow_every_write,
    versions_move_the_entities_no_engine_holds,
};
pub use leases::{
    a_claim_takes_the_entities_its_batch_creates, a_claim_takes_the_entities_its_batch_raises_on,
    auto_time_survives_events_and_release, expired_leases_move_and_renewal_extends, push_claim_fifo,
    release_never_strands_events,
};
pub use limits::{
    limits_come_before_the_commit_of_an_event_that_starts_a_workflow,
    limits_come_with_the_commit_that_enters_the_state, limits_hand_slots_on_in_line,
    limits_hold_a_workflow_until_it_comes_to_rest, limits_stay_with_a_call_in_flight,
    limits_stay_with_an_agent_task_through_a_pause, limits_survive_leases_and_commands,
};
pub use operations::{hung_operations_are_marked, operations_end_when_nothing_waits_on_them};
pub use prune::{
    pruning_never_hands_an_id_out_again, pruning_removes_every_row_an_ended_entity_left,
    trimming_keeps_a_live_entitys_latest_past,
};
pub use rates::{
    limits_admit_round_robin_across_fair_values, limits_order_waiting_work_by_its_requests_priority,
    limits_space_starts_by_their_rate,
};
pub use schedules::schedules_sync_lease_advance_and_pause;
pub use successors::{events_reach_related_entities, successors_and_change_notices};
pub use tasks::{agent_reports_join_the_batch_around_them, agent_tasks_lease_and_report};
pub use telemetry::{
    entity_errors_and_operation_traces, events_are_listed_per_entity, metrics_snapshot_and_run_status_filter,
    stats_summarise_telemetry,
};
pub use timers::timers_fire_through_the_inbox;

use serde_json::json;
use settle_core::{ActionName, EntityKey, EventName, MachineName, Properties, StateName};

use crate::{
    AfterCommit, Applied, Batch, BatchResult, Claim, Command, Commit, EntityRow, Fence, HistoryKind, InboxItem,
    InboxKind, Millis, NewEntity, Op, Push, Store,
};

/// The SQL dialect details the suite needs from a backend.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    /// Creates the application table `widgets (name TEXT PRIMARY KEY)`.
    pub create_widgets: &'static str,
    /// Inserts one widget; its one parameter is the name.
    pub insert_widget: &'static str,
}

const OWNER: &str = "engine-a";

const T0: Millis = 1_000_000;

/// A new entity `key` of machine `m` in state `state`, with nothing else: no auto action,
/// request, timers, operation or task. Also for a backend's own tests.
pub fn entity(key: &str, state: &str) -> NewEntity {
    NewEntity {
        machine: MachineName::new("m"),
        key: EntityKey::new(key),
        state: StateName::new(state),
        properties: Properties::new(),
        auto_at: None,
        request_id: None,
        timers: Vec::new(),
        notify_self: false,
        operation: None,
        machine_hash: None,
        health: "ok",
        offer: None,
    }
}

/// The checks' new entity: created by request `req-1`, due at `auto_at` if given.
fn new_entity(key: &str, state: &str, auto_at: Option<Millis>) -> NewEntity {
    NewEntity { auto_at, request_id: Some("req-1".into()), ..entity(key, state) }
}

fn push(key: &str, event: &str) -> Push {
    Push {
        machine: MachineName::new("m"),
        key: EntityKey::new(key),
        event: EventName::new(event),
        params: json!({"n": 1}),
        request_id: Some(format!("req-{event}")),
        kind: InboxKind::Raised,
        join_from: None,
        operation: None,
        reply: None,
    }
}

/// Operator command `command` on entity `key` of machine `m`, outside any operation.
pub(super) fn command(key: &str, command: Command) -> Op {
    Op::Command { machine: MachineName::new("m"), key: EntityKey::new(key), command, operation: None }
}

fn commit(entity: &EntityRow, to: Option<&str>, consume: Option<i64>, after: AfterCommit) -> Commit {
    let fence = Fence { entity_id: entity.id, version: entity.version, owner: OWNER.into() };
    let kind = if to.is_some() { HistoryKind::Event } else { HistoryKind::Rejected };
    Commit {
        to: to.map(StateName::new),
        action: to.map(|_| ActionName::new("go")),
        event: Some(EventName::new("go")),
        consume,
        request_id: Some("req-go".into()),
        ..Commit::new(fence, entity.state.clone(), kind, after)
    }
}

async fn write<S: Store>(store: &S, now: Millis, ops: Vec<Op>, claim: bool) -> BatchResult {
    let claim = claim.then(|| Claim::new(OWNER, 30_000, 100));
    store.write(Batch { now, ops, claim }).await.expect("batch commits")
}

async fn get<S: Store>(store: &S, key: &str) -> EntityRow {
    store.entity_get("m", key).await.expect("read").expect("entity exists")
}

async fn create_one<S: Store>(store: &S, key: &str) -> EntityRow {
    let r = write(store, T0, vec![Op::Create(new_entity(key, "idle", None))], false).await;
    match &r.results[0] {
        Ok(Applied::Created(e)) => e.clone(),
        other => panic!("create failed: {other:?}"),
    }
}

/// Moves entities of `machine` to `hash` by a deploy that stores nothing else.
async fn move_to<S: Store>(store: &S, machine: &str, moves: Vec<crate::StateMove>, hash: &str, now: Millis) -> u64 {
    let moves = vec![crate::Moves { machine: machine.into(), hash: hash.into(), moves }];
    store.machine_deploy(crate::Deploy { moves, now, ..Default::default() }).await.expect("deploy")[0]
}

/// Stores one version of `name` (of no origin) by a deploy that moves nothing.
async fn put_version<S: Store>(store: &S, name: &str, hash: &str, definition: &str, now: Millis) {
    let versions = vec![crate::NewVersion {
        name: name.into(),
        hash: hash.into(),
        definition: definition.into(),
        origin: String::new(),
    }];
    store.machine_deploy(crate::Deploy { versions, now, ..Default::default() }).await.expect("deploy");
}

/// Claims `key` by pushing an event to it; returns the claimed entity and that event.
async fn claim_with_event<S: Store>(store: &S, now: Millis, key: &str) -> (EntityRow, InboxItem) {
    let r = write(store, now, vec![Op::Push(push(key, "go"))], true).await;
    let c = r.claimed.into_iter().find(|c| c.entity.key == key).expect("claimed");
    (c.entity, c.inbox_head.expect("head"))
}

/// Instantiates every conformance check as a `#[tokio::test]` for one backend.
///
/// `$make` is an async expression yielding a fresh, empty store; `$dialect` a [`Dialect`].
/// With `optional` first, `$make` yields an `Option` of a store, and each check returns at
/// once on `None` (a backend that is not available on this machine; `$make` says so).
#[macro_export]
macro_rules! store_conformance_suite {
    ($make:expr, $dialect:expr) => {
        $crate::store_conformance_suite!(optional async { Some($make.await) }, $dialect);
    };
    (optional $make:expr, $dialect:expr) => {
        $crate::store_conformance_suite!(@checks $make, $dialect;
            store: create_get_and_duplicate, push_claim_fifo, commit_applies_and_reports_head, commit_is_fenced,
                release_never_strands_events, rejection_keeps_version, expired_leases_move_and_renewal_extends,
                auto_time_survives_events_and_release, successors_and_change_notices, events_reach_related_entities,
                timers_fire_through_the_inbox,
                preconditions_and_fired, listing_counts_and_metadata, events_are_listed_per_entity,
                entity_errors_and_operation_traces,
                stats_summarise_telemetry, agent_tasks_lease_and_report, metrics_snapshot_and_run_status_filter,
                overview_counts_follow_every_write, filtered_pages_match_a_scan,
                operations_end_when_nothing_waits_on_them, commands_set_run_status_and_end_their_operation,
                kill_drops_queued_work_and_cancels_its_operations, agent_reports_join_the_batch_around_them,
                hung_operations_are_marked, commits_follow_the_workflow_of_their_event,
                consuming_notices_keeps_the_events, consuming_an_event_keeps_the_notices,
                a_commit_may_change_one_column_alone, a_commit_creates_only_free_keys,
                a_successor_joined_in_a_batch_notifies_its_predecessor, a_command_is_recorded_when_it_applies,
                an_internal_event_heads_the_inbox, pruning_removes_every_row_an_ended_entity_left,
                pruning_never_hands_an_id_out_again, trimming_keeps_a_live_entitys_latest_past,
                bulk_operations_start_once_lease_and_advance, commands_of_one_batch_apply_each_in_order,
                the_feed_resumes_from_any_position_without_gaps, schedules_sync_lease_advance_and_pause,
                versions_move_the_entities_no_engine_holds, a_deploy_is_written_whole, canceling_an_operation_stops_its_work_and_queues_the_undo,
                a_claim_takes_the_entities_its_batch_creates, a_claim_takes_the_entities_its_batch_raises_on,
                limits_hand_slots_on_in_line, limits_survive_leases_and_commands,
                limits_come_with_the_commit_that_enters_the_state,
                limits_stay_with_an_agent_task_through_a_pause, limits_stay_with_a_call_in_flight,
                limits_admit_round_robin_across_fair_values, limits_space_starts_by_their_rate,
                limits_order_waiting_work_by_its_requests_priority, limits_hold_a_workflow_until_it_comes_to_rest,
                limits_come_before_the_commit_of_an_event_that_starts_a_workflow;
            store_and_dialect: effects_are_atomic
        );
    };
    (@checks $make:expr, $dialect:expr; store: $($check:ident),*; store_and_dialect: $($sql_check:ident),*) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            use $crate::conformance as suite;

            $(
                #[tokio::test]
                async fn $check() {
                    let Some(store) = $make.await else { return };
                    suite::$check(store).await
                }
            )*
            $(
                #[tokio::test]
                async fn $sql_check() {
                    let Some(store) = $make.await else { return };
                    suite::$sql_check(store, $dialect).await
                }
            )*
        }
    };
}
