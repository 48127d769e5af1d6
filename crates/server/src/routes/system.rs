//! `/healthz`, `/metrics` and `/openapi.json`.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::OpenApiJson;
use crate::auth::{Access, Caller};
use crate::model::{Health, Session};
use crate::problem::Problem;
use crate::state::AppState;

/// Routes needing no token.
pub fn public() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz))
}

/// Read-only system routes.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics)).routes(routes!(openapi)).routes(routes!(session))
}

/// Whether the server is up.
#[utoipa::path(get, path = "/healthz", tag = "system", responses((status = 200, description = "the server runs", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// Prometheus text: the engine's live `settle_engine_*` metrics and the store-wide
/// `settle_*` figures (as `settle stats --prometheus`).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "system",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", body = String, content_type = "text/plain"),
    )
)]
async fn metrics(State(s): State<AppState>) -> Result<Response, Problem> {
    let snapshot = settle_store::Store::metrics_snapshot(s.engine().store(), s.engine().clock().now_ms()).await?;
    let mut text = s.engine_metrics().unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let machines: Vec<&settle_core::Machine> = s.machines().iter().map(|m| m.as_ref()).collect();
    text.push_str(&crate::metrics::store_text(&snapshot, &machines));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// This API's OpenAPI 3.1 document, generated from the routes the server serves.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "system",
    responses(
        (status = 200, description = "the OpenAPI document", body = Object),
    )
)]
async fn openapi(Extension(spec): Extension<OpenApiJson>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], spec.0.as_ref().clone()).into_response()
}

/// Who the presented token is: its role, its name, and whether it may change anything.
/// The dashboard signs in with it; a bad token gets 401 here as everywhere.
#[utoipa::path(
    get,
    path = "/v1/session",
    tag = "system",
    responses(
        (status = 200, description = "the caller", body = Session),
    )
)]
async fn session(State(s): State<AppState>, caller: Caller) -> Json<Session> {
    Json(Session {
        role: caller.role().as_str().to_string(),
        name: caller.name().map(str::to_string),
        can_write: caller.role().allows(Access::Write),
        open: s.tokens().is_open(),
    })
}
