//! Entities: create, list, read, history.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use settle_core::Machine;
use settle_store::{EntityFilter, RunStatus, Store};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::{IdempotencyKey, JsonBody, Path, Query};
use crate::model::{
    CreateEntity, Entity, EntityPage, EntityQuery, ErrorEntry, HistoryEntry, QueuedEvent, Related,
    SubscriptionProgress, Timer,
};
use crate::problem::{Kind, Problem, ProblemBody};
use crate::routes::{check_key, entity_location, find_entity, live_entity, parse_limit, unknown_word};
use crate::state::AppState;

/// Read routes of entities.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(get))
        .routes(routes!(history))
        .routes(routes!(related))
        .routes(routes!(timers))
        .routes(routes!(errors))
}

/// Write routes of entities.
pub fn write() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create))
}

/// Creates an entity in its machine's initial state. With an `Idempotency-Key` already
/// used, nothing is created and the entity is returned as it is (200).
#[utoipa::path(
    post,
    path = "/v1/machines/{machine}/entities",
    tag = "entities",
    params(
        ("machine" = String, Path, description = "machine name"),
        ("Idempotency-Key" = Option<String>, Header, description = "the operation's request id"),
    ),
    request_body = CreateEntity,
    responses(
        (status = 201, description = "created; Location is the entity's URL", body = Entity),
        (status = 200, description = "replay of an Idempotency-Key: the entity as it is", body = Entity),
        (status = 400, description = "malformed JSON or header", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "unknown machine", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "an entity with this key exists", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "body too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "body not application/json", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "invalid key, properties or body", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn create(
    State(s): State<AppState>,
    Path(machine): Path<String>,
    IdempotencyKey(request_id): IdempotencyKey,
    JsonBody(body): JsonBody<CreateEntity>,
) -> Result<Response, Problem> {
    s.machine(&machine)?;
    check_key(&body.key)?;
    let properties = match body.properties {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(Problem::new(Kind::InvalidProperties, "properties must be a JSON object")
                .field("properties")
                .with("machine", machine));
        }
    };
    let created = s.engine().create_with(&machine, &body.key, properties, request_id).await?;
    let status = if created.replayed { StatusCode::OK } else { StatusCode::CREATED };
    let location = entity_location(&machine, &body.key);
    Ok((status, [(header::LOCATION, location)], Json(Entity::from(&created.entity))).into_response())
}

/// Lists entities by id (by machine and key with `prefix`), a page at a time. Every
/// filter is read through an index: a page costs the same in a fleet of any size.
#[utoipa::path(
    get,
    path = "/v1/entities",
    tag = "entities",
    params(EntityQuery),
    responses(
        (status = 200, description = "a page of entities", body = EntityPage),
        (status = 400, description = "bad query", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn list(State(s): State<AppState>, Query(q): Query<EntityQuery>) -> Result<Json<EntityPage>, Problem> {
    if let Some(st) = q.status.as_deref()
        && RunStatus::parse(st).is_none()
    {
        return Err(unknown_word("status", "run status", st, "active, paused, sleeping, fault, failed or killed"));
    }
    let bad_cursor = |a: &str| {
        Problem::new(Kind::BadRequest, format!("after must be the `next` cursor of a previous page, not `{a}`"))
            .field("after")
    };
    // Pages by id have the last id as cursor; pages by key prefix `machine/key`.
    let (after, after_key) = match (q.after.as_deref(), q.prefix.is_some()) {
        (None, _) => (None, None),
        (Some(a), false) => (Some(a.parse::<i64>().map_err(|_| bad_cursor(a))?), None),
        (Some(a), true) => {
            let (m, k) = a.split_once('/').ok_or_else(|| bad_cursor(a))?;
            (None, Some((m.to_string(), k.to_string())))
        }
    };
    let limit = parse_limit(q.limit.as_deref())?;
    // A parent state lists the entities in its substates.
    let machines =
        s.machines().iter().map(|m| m.as_ref()).filter(|m| q.machine.as_deref().is_none_or(|n| m.name() == n));
    let substates = q.state.as_deref().map(|st| Machine::substates_across(machines, st)).unwrap_or_default();
    let filter = EntityFilter {
        machine: q.machine,
        state: q.state,
        substates,
        after_id: after,
        limit: Some(limit + 1),
        run_status: q.status,
        key_prefix: q.prefix.clone(),
        after_key,
    };
    let mut rows = s.engine().store().entity_list(filter).await?;
    let more = rows.len() as u64 > limit;
    rows.truncate(limit as usize);
    let next = match rows.last() {
        Some(e) if more && q.prefix.is_some() => Some(format!("{}/{}", e.machine, e.key)),
        Some(e) if more => Some(e.id.to_string()),
        _ => None,
    };
    Ok(Json(EntityPage { items: rows.iter().map(Entity::from).collect(), next }))
}

/// One entity, with the events valid in its state. An entity in its machine's deleted
/// state is gone (410).
#[utoipa::path(
    get,
    path = "/v1/machines/{machine}/entities/{key}",
    tag = "entities",
    params(("machine" = String, Path, description = "machine name"), ("key" = String, Path, description = "entity key")),
    responses(
        (status = 200, description = "the entity", body = Entity),
        (status = 404, description = "unknown machine or entity", body = ProblemBody, content_type = "application/problem+json"),
        (status = 410, description = "the entity was deleted", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn get(State(s): State<AppState>, Path((machine, key)): Path<(String, String)>) -> Result<Json<Entity>, Problem> {
    let e = live_entity(&s, &machine, &key).await?;
    let m = s.machine(&machine)?;
    let mut entity = Entity::from(&e);
    entity.permitted_events = Some(m.permitted_events(&e.state).map(|ev| ev.name.to_string()).collect());
    entity.lease_until = e.lease_until;
    entity.recent_errors = Some(e.recent_errors.len() as u32);
    let inbox =
        s.engine().store().inbox_list(e.id).await.map_err(|err| Problem::new(Kind::Internal, err.to_string()))?;
    entity.inbox =
        Some(inbox.into_iter().map(|i| QueuedEvent { event: i.event.to_string(), params: i.params }).collect());
    Ok(Json(entity))
}

/// An entity's transition history, oldest first (also of a deleted entity: the audit
/// trail stays readable).
#[utoipa::path(
    get,
    path = "/v1/machines/{machine}/entities/{key}/history",
    tag = "entities",
    params(("machine" = String, Path, description = "machine name"), ("key" = String, Path, description = "entity key")),
    responses(
        (status = 200, description = "history rows, oldest first", body = Vec<HistoryEntry>),
        (status = 404, description = "unknown machine or entity", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn history(
    State(s): State<AppState>,
    Path((machine, key)): Path<(String, String)>,
) -> Result<Json<Vec<HistoryEntry>>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let rows = s.engine().store().history_list(e.id).await?;
    Ok(Json(rows.iter().map(HistoryEntry::from).collect()))
}

/// The entity's predecessors and successors, and how far each subscription valid in its
/// state is from firing (its pattern evaluated over the successors now).
#[utoipa::path(
    get,
    path = "/v1/machines/{machine}/entities/{key}/related",
    tag = "entities",
    params(("machine" = String, Path, description = "machine name"), ("key" = String, Path, description = "entity key")),
    responses(
        (status = 200, description = "predecessors, successors and subscription progress", body = Related),
        (status = 404, description = "unknown machine or entity", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn related(
    State(s): State<AppState>,
    Path((machine, key)): Path<(String, String)>,
) -> Result<Json<Related>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let store = s.engine().store();
    let predecessors = store.predecessor_list(e.id).await?;
    let successors = store.successor_snapshot(e.id).await?.successors;
    let subscriptions = s
        .engine()
        .subscription_progress(&e, &successors)?
        .into_iter()
        .map(|p| SubscriptionProgress {
            event: p.event.to_string(),
            pattern: p.pattern,
            selected: p.progress.selected,
            satisfying: p.progress.satisfying,
            holds: p.progress.holds,
            fired: p.fired,
        })
        .collect();
    Ok(Json(Related {
        predecessors: predecessors.iter().map(Entity::from).collect(),
        successors: successors.iter().map(Entity::from).collect(),
        subscriptions,
    }))
}

/// The entity's pending timers, by name.
#[utoipa::path(
    get,
    path = "/v1/machines/{machine}/entities/{key}/timers",
    tag = "entities",
    params(("machine" = String, Path, description = "machine name"), ("key" = String, Path, description = "entity key")),
    responses(
        (status = 200, description = "pending timers, by name", body = Vec<Timer>),
        (status = 404, description = "unknown machine or entity", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn timers(
    State(s): State<AppState>,
    Path((machine, key)): Path<(String, String)>,
) -> Result<Json<Vec<Timer>>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let rows = s.engine().store().timer_list(e.id).await?;
    Ok(Json(rows.iter().map(Timer::from).collect()))
}

/// The entity's newest recorded errors (at most 100), newest first.
#[utoipa::path(
    get,
    path = "/v1/machines/{machine}/entities/{key}/errors",
    tag = "entities",
    params(("machine" = String, Path, description = "machine name"), ("key" = String, Path, description = "entity key")),
    responses(
        (status = 200, description = "errors, newest first", body = Vec<ErrorEntry>),
        (status = 404, description = "unknown machine or entity", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn errors(
    State(s): State<AppState>,
    Path((machine, key)): Path<(String, String)>,
) -> Result<Json<Vec<ErrorEntry>>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let rows = s.engine().store().error_list(e.id, 100).await?;
    Ok(Json(rows.iter().map(ErrorEntry::from).collect()))
}
