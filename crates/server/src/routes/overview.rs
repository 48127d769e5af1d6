//! `GET /v1/overview`: the fleet at a glance (the dashboard's first page), from the counts
//! the store keeps in every commit: its cost does not grow with the number of entities.

use axum::Json;
use axum::extract::State;
use settle_api::{MinuteRate, OutcomeCount, Overview, StateCount, TaskCount};
use settle_store::{RunStatus, Store};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::Query;
use crate::model::OverviewQuery;
use crate::problem::Problem;
use crate::routes::parse_duration;
use crate::state::AppState;

/// The overview route (readers).
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(overview))
}

/// The longest window of per-minute rates: a day.
const MAX_WINDOW_MS: i64 = 24 * 3_600_000;
/// The shortest window: a minute.
const MIN_WINDOW_MS: i64 = 60_000;

/// The fleet at a glance: entities by machine, state and run status; parked entities;
/// due backlog; operations by outcome; open agent tasks; transitions and errors per minute
/// over the window (one hour by default).
#[utoipa::path(
    get,
    operation_id = "getOverview",
    path = "/v1/overview",
    tag = "overview",
    params(OverviewQuery),
    responses(
        (status = 200, description = "the overview", body = Overview),
    )
)]
async fn overview(State(s): State<AppState>, Query(q): Query<OverviewQuery>) -> Result<Json<Overview>, Problem> {
    let window = match q.window.as_deref() {
        None => 3_600_000,
        // A window outside 1m to 24h is brought inside.
        Some(w) => (parse_duration("window", w)?.as_millis().min(MAX_WINDOW_MS as u128) as i64).max(MIN_WINDOW_MS),
    };
    let now = s.engine().clock().now_ms();
    // Whole minutes: the current one and the window's full minutes before it.
    let first = (now - window) / 60_000 * 60_000 + 60_000;
    let o = s.engine().store().overview(now, first).await?;
    let served = s.machines();
    let machines: Vec<&settle_core::Machine> = served.iter().map(|m| m.as_ref()).collect();
    let mut minutes = Vec::new();
    let mut counted = o.minutes.iter().peekable();
    let mut at = first;
    while at <= now {
        let (transitions, errors) = match counted.next_if(|m| m.minute == at) {
            Some(m) => (m.transitions, m.errors),
            None => (0, 0),
        };
        minutes.push(MinuteRate { at, transitions, errors });
        at += 60_000;
    }
    let parked = o
        .entities
        .iter()
        .filter(|c| matches!(c.run_status, RunStatus::Failed | RunStatus::Fault))
        .map(|c| c.count)
        .sum();
    let health = |c: &settle_store::EntityCount| crate::metrics::state_health(&machines, &c.machine, &c.state);
    let failing =
        o.entities.iter().filter(|c| c.run_status != RunStatus::Killed && health(c) == "error").map(|c| c.count).sum();
    Ok(Json(Overview {
        now,
        entities: o.entities.iter().map(|c| c.count).sum(),
        parked,
        failing,
        due_backlog: o.due_backlog,
        counts: o
            .entities
            .iter()
            .map(|c| StateCount {
                machine: c.machine.clone(),
                state: c.state.clone(),
                path: crate::metrics::state_path(&machines, &c.machine, &c.state),
                run_status: c.run_status.as_str().to_string(),
                health: health(c).to_string(),
                count: c.count,
            })
            .collect(),
        operations: o.operations.into_iter().map(|(outcome, count)| OutcomeCount { outcome, count }).collect(),
        tasks: o.tasks.into_iter().map(|(queue, status, count)| TaskCount { queue, status, count }).collect(),
        minutes,
    }))
}
