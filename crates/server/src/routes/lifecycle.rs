//! Operator commands on an entity's run status: pause, resume, sleep, kill, release, retry.

use axum::Json;
use axum::extract::State;
use settle_engine::Command;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::{IdempotencyKey, JsonBody, Path};
use crate::model::{Entity, SleepRequest};
use crate::problem::{Kind, Problem, ProblemBody};
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
) -> Result<Json<Entity>, Problem> {
    live_entity(s, machine, key).await?;
    let done = s.engine().command(machine, key, command, request_id).await?;
    Ok(Json(Entity::from(&done.entity)))
}

/// A lifecycle route: `$doc`, the OpenAPI operation at `$path` every command shares (the
/// entity's path, `Idempotency-Key`, the entity afterwards, 404, 409 killed, 410 deleted)
/// with what the command adds (a request body, its problems), on the handler that follows.
macro_rules! lifecycle {
    ($doc:literal, $path:literal, [$($body:tt)*], [$($problems:tt)*], $($handler:tt)*) => {
        #[doc = $doc]
        #[utoipa::path(
            post,
            path = $path,
            tag = "lifecycle",
            params(
                ("machine" = String, Path, description = "machine name"),
                ("key" = String, Path, description = "entity key"),
                ("Idempotency-Key" = Option<String>, Header, description = "the operation's request id"),
            ),
            $($body)*
            responses(
                (status = 200, description = "the entity afterwards", body = Entity),
                (status = 404, description = "unknown machine or entity", body = ProblemBody, content_type = "application/problem+json"),
                (status = 409, description = "the entity was killed", body = ProblemBody, content_type = "application/problem+json"),
                (status = 410, description = "the entity was deleted", body = ProblemBody, content_type = "application/problem+json"),
                $($problems)*
            )
        )]
        $($handler)*
    };
}

/// A command without a body: the handler `$name` applies `$command`.
macro_rules! command {
    ($name:ident, $path:literal, $command:expr, $doc:literal) => {
        lifecycle!(
            $doc,
            $path,
            [],
            [],
            async fn $name(
                State(s): State<AppState>,
                Path((machine, key)): Path<(String, String)>,
                IdempotencyKey(request_id): IdempotencyKey,
            ) -> Result<Json<Entity>, Problem> {
                apply(&s, &machine, &key, $command, request_id).await
            }
        );
    };
}

command!(
    pause,
    "/v1/machines/{machine}/entities/{key}/pause",
    Command::Pause,
    "Pauses an entity: nothing runs, events queue."
);
command!(
    resume,
    "/v1/machines/{machine}/entities/{key}/resume",
    Command::Resume,
    "Resumes a paused, sleeping, backing-off or parked entity."
);
command!(
    kill,
    "/v1/machines/{machine}/entities/{key}/kill",
    Command::Kill,
    "Kills an entity: terminal; its queued events and timers are canceled."
);
command!(
    release,
    "/v1/machines/{machine}/entities/{key}/release",
    Command::Release,
    "Drops an entity's lease so any engine may continue it."
);
command!(
    retry,
    "/v1/machines/{machine}/entities/{key}/retry",
    Command::Retry,
    "Runs an entity's pending auto action now."
);

lifecycle!(
    "Puts an entity to sleep until a time.",
    "/v1/machines/{machine}/entities/{key}/sleep",
    [request_body = SleepRequest,],
    [
        (status = 400, description = "malformed JSON", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "body too large", body = ProblemBody, content_type = "application/problem+json"),
        (
            status = 415,
            description = "body not application/json",
            body = ProblemBody,
            content_type = "application/problem+json"
        ),
        (status = 422, description = "invalid `until`", body = ProblemBody, content_type = "application/problem+json"),
    ],
    async fn sleep(
        State(s): State<AppState>,
        Path((machine, key)): Path<(String, String)>,
        IdempotencyKey(request_id): IdempotencyKey,
        JsonBody(body): JsonBody<SleepRequest>,
    ) -> Result<Json<Entity>, Problem> {
        let until = crate::time::parse_time(&body.until, s.engine().clock().now_ms())
            .map_err(|e| Problem::new(Kind::InvalidBody, e).field("until"))?;
        apply(&s, &machine, &key, Command::Sleep { until }, request_id).await
    }
);
