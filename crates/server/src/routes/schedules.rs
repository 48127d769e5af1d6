//! Calendar schedules: every schedule of the served machines with its progress (next fire,
//! fires fired, missed and skipped); pause and resume.

use axum::Json;
use axum::extract::State;
use settle_engine::ScheduleView;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::Path;
use crate::model::{Schedule, ScheduleList};
use crate::paths::SchedulePath;
use crate::problem::Problem;
use crate::state::AppState;

/// Read routes.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list))
}

/// Write routes (operators).
pub fn write() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(pause)).routes(routes!(resume))
}

/// The API's body of a schedule.
pub fn body(v: &ScheduleView) -> Schedule {
    Schedule::new(&v.machine, &v.name, v.cron.clone(), v.does.clone(), v.row.as_ref())
}

/// Every schedule of the served machines, by machine and name, with its next fire and
/// counts of fires fired, missed (no engine ran, beyond the catch-up policy) and skipped
/// (the previous fire still ran).
#[utoipa::path(
    get,
    operation_id = "listSchedules",
    path = "/v1/schedules",
    tag = "schedules",
    responses((status = 200, description = "the schedules", body = ScheduleList))
)]
async fn list(State(s): State<AppState>) -> Result<Json<ScheduleList>, Problem> {
    let views = s.engine().schedules().await?;
    Ok(Json(ScheduleList { items: views.iter().map(body).collect() }))
}

/// Pauses a schedule: nothing fires until it is resumed (every instance follows).
#[utoipa::path(
    post,
    operation_id = "pauseSchedule",
    path = "/v1/schedules/{machine}/{name}/pause",
    tag = "schedules",
    params(SchedulePath),
    responses((status = 200, description = "the schedule afterwards", body = Schedule))
)]
async fn pause(State(s): State<AppState>, Path(p): Path<SchedulePath>) -> Result<Json<Schedule>, Problem> {
    set(&s, p, true).await
}

/// Resumes a paused schedule from its next fire after now (what it would have fired while
/// paused is not fired).
#[utoipa::path(
    post,
    operation_id = "resumeSchedule",
    path = "/v1/schedules/{machine}/{name}/resume",
    tag = "schedules",
    params(SchedulePath),
    responses((status = 200, description = "the schedule afterwards", body = Schedule))
)]
async fn resume(State(s): State<AppState>, Path(p): Path<SchedulePath>) -> Result<Json<Schedule>, Problem> {
    set(&s, p, false).await
}

async fn set(s: &AppState, p: SchedulePath, paused: bool) -> Result<Json<Schedule>, Problem> {
    s.engine().schedule_pause(&p.machine, &p.name, paused).await?;
    let views = s.engine().schedules().await?;
    let v = views.iter().find(|v| v.machine == p.machine && v.name == p.name).ok_or_else(|| {
        Problem::from(settle_engine::Error::UnknownSchedule { machine: p.machine.clone(), name: p.name.clone() })
    })?;
    Ok(Json(body(v)))
}
