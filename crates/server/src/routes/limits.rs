//! `GET /v1/limits`: every concurrency limit's key values with slots in use or work
//! waiting, from the store's slot rows (what `settle limits` prints).

use axum::Json;
use axum::extract::State;
use settle_api::{LimitList, LimitUsage};
use settle_store::Store;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::problem::Problem;
use crate::state::AppState;

/// The limits route (readers).
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(limits))
}

/// Each concurrency limit, per key value: slots in use, of how many, and entities waiting
/// in line; key values with nothing in use or waiting are left out.
#[utoipa::path(
    get,
    operation_id = "listLimits",
    path = "/v1/limits",
    tag = "limits",
    responses(
        (status = 200, description = "the limits in use", body = LimitList),
    )
)]
async fn limits(State(s): State<AppState>) -> Result<Json<LimitList>, Problem> {
    let usage = s.engine().store().limit_list().await?;
    Ok(Json(LimitList { items: usage.iter().map(LimitUsage::from).collect() }))
}
