//! `/healthz`, `/metrics` and `/openapi.json`.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::OpenApiJson;
use axum::http::HeaderMap;

use crate::auth::Access;
use crate::model::{Health, Session};
use crate::problem::Problem;
use crate::state::AppState;

/// Routes needing no token.
pub fn public() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz)).routes(routes!(session))
}

/// Read-only system routes.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics)).routes(routes!(openapi))
}

/// Whether the server is up.
#[utoipa::path(get, operation_id = "healthz", path = "/healthz", tag = "system", responses((status = 200, description = "the server runs", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// Prometheus text: the engine's live `settle_engine_*` metrics and the store-wide
/// `settle_*` figures (as `settle stats --prometheus`).
#[utoipa::path(
    get,
    operation_id = "metrics",
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
    let served = s.machines();
    let machines: Vec<&settle_core::Machine> = served.iter().map(|m| m.as_ref()).collect();
    text.push_str(&crate::metrics::store_text(&snapshot, &machines));
    text.push_str(&s.refusals().text());
    text.push_str(&s.streams().text());
    text.push_str(&crate::metrics::schedules_text(&s.engine().schedules().await?));
    text.push_str(&crate::metrics::limits_text(&settle_store::Store::limit_list(s.engine().store()).await?));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// This API's OpenAPI 3.1 document, generated from the routes the server serves.
#[utoipa::path(
    get,
    operation_id = "openapi",
    path = "/openapi.json",
    tag = "system",
    responses(
        (status = 200, description = "the OpenAPI document", body = Object),
    )
)]
async fn openapi(Extension(spec): Extension<OpenApiJson>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], spec.0.as_ref().clone()).into_response()
}

/// Whether the presented token is accepted for reads, and who it is: its role, its name,
/// and whether it may change anything. It never answers 401 (that is its answer:
/// `signed_in` false with the reason), so a sign-in page can ask it without an error.
#[utoipa::path(
    get,
    operation_id = "session",
    path = "/v1/session",
    tag = "system",
    responses(
        (status = 200, description = "the caller, or why the token is not accepted", body = Session),
    )
)]
async fn session(State(s): State<AppState>, headers: HeaderMap) -> Json<Session> {
    let tokens = s.tokens();
    Json(match tokens.authenticate(&headers, Access::Read) {
        Ok(caller) => Session {
            signed_in: true,
            reason: None,
            role: Some(caller.role().as_str().to_string()),
            name: caller.name().map(str::to_string),
            can_write: caller.role().allows(Access::Write),
            open: tokens.is_open(),
        },
        Err(p) => Session {
            signed_in: false,
            reason: Some(p.detail().to_string()),
            role: None,
            name: None,
            can_write: false,
            open: false,
        },
    })
}
