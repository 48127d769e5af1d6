//! Operator commands on an entity's run status: pause, resume, sleep, kill, release, retry.

use axum::Json;
use axum::extract::State;
use settle_engine::Command;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::{IdempotencyKey, JsonBody, Path, Query};
use crate::model::{CommandQuery, Entity, SleepRequest};
use crate::paths::EntityPath;
use crate::problem::{Kind, Problem};
use crate::routes::live_entity;
use crate::state::AppState;

/// Write routes of lifecycle commands.
pub fn write() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(sleep))
        .routes(routes!(kill))
        .routes(routes!(release))
        .routes(routes!(retry))
}

async fn apply(
    s: &AppState,
    machine: &str,
    key: &str,
    command: Command,
    request_id: Option<String>,
    reason: Option<String>,
) -> Result<Json<Entity>, Problem> {
    live_entity(s, machine, key).await?;
    let done = s.engine().command_with_reason(machine, key, command, request_id, reason.as_deref()).await?;
    Ok(Json(s.entity(&done.entity)))
}

/// A lifecycle route: `$doc`, the OpenAPI operation `$id` at `$path` every command shares
/// (the entity's path, `Idempotency-Key`, the entity afterwards; its problems are in
/// [`crate::contract::PROBLEMS`]) with the request body the command adds, on the handler
/// that follows.
macro_rules! lifecycle {
    ($doc:literal, $id:literal, $path:literal, [$($body:tt)*], $($handler:tt)*) => {
        #[doc = $doc]
        #[utoipa::path(
            post,
            operation_id = $id,
            path = $path,
            tag = "lifecycle",
            params(EntityPath, CommandQuery, ("Idempotency-Key" = Option<String>, Header, description = "the operation's request id")),
            $($body)*
            responses(
                (status = 200, description = "the entity afterwards", body = Entity),
            )
        )]
        $($handler)*
    };
}

/// A command without a body: the handler `$name` applies `$command`.
macro_rules! command {
    ($name:ident, $id:literal, $path:literal, $command:expr, $doc:literal) => {
        lifecycle!(
            $doc,
            $id,
            $path,
            [],
            async fn $name(
                State(s): State<AppState>,
                Path(EntityPath { machine, key }): Path<EntityPath>,
                IdempotencyKey(request_id): IdempotencyKey,
                Query(q): Query<CommandQuery>,
            ) -> Result<Json<Entity>, Problem> {
                apply(&s, &machine, &key, $command, request_id, q.reason).await
            }
        );
    };
}

command!(
    pause,
    "pauseEntity",
    "/v1/machines/{machine}/entities/{key}/pause",
    Command::Pause,
    "Pauses an entity: nothing runs, events queue."
);
command!(
    resume,
    "resumeEntity",
    "/v1/machines/{machine}/entities/{key}/resume",
    Command::Resume,
    "Resumes a paused, sleeping, backing-off or parked entity."
);
command!(
    kill,
    "killEntity",
    "/v1/machines/{machine}/entities/{key}/kill",
    Command::Kill,
    "Kills an entity: terminal; its queued events and timers are canceled."
);
command!(
    release,
    "releaseEntity",
    "/v1/machines/{machine}/entities/{key}/release",
    Command::Release,
    "Drops an entity's lease so any engine may continue it."
);
command!(
    retry,
    "retryEntity",
    "/v1/machines/{machine}/entities/{key}/retry",
    Command::Retry,
    "Runs an entity's pending auto action now."
);

lifecycle!(
    "Puts an entity to sleep until a time.",
    "sleepEntity",
    "/v1/machines/{machine}/entities/{key}/sleep",
    [request_body = SleepRequest,],
    async fn sleep(
        State(s): State<AppState>,
        Path(EntityPath { machine, key }): Path<EntityPath>,
        IdempotencyKey(request_id): IdempotencyKey,
        Query(q): Query<CommandQuery>,
        JsonBody(body): JsonBody<SleepRequest>,
    ) -> Result<Json<Entity>, Problem> {
        let until = settle_core::time::parse_time(&body.until, s.engine().clock().now_ms())
            .map_err(|e| Problem::new(Kind::InvalidBody, e).field("until"))?;
        apply(&s, &machine, &key, Command::Sleep { until }, request_id, q.reason).await
    }
);
