//! Entities: create, list, read, history.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use settle_core::Machine;
use settle_engine::Narrow;
use settle_store::{EntityFilter, EntityOrder, EntityRow, Store};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::contract::{CURSOR, HEALTH, RUN_STATUS, SORT};
use crate::extract::{IdempotencyKey, JsonBody, Path, Query};
use crate::model::{
    CommandOffer, CreateEntity, Entity, EntityPage, EntityQuery, ErrorEntry, ErrorGroup, ErrorGroupQuery, ErrorGroups,
    HistoryEntry, NextFire, QueuedEvent, Related, Timer, Total, Why,
};
use crate::paths::{EntityPath, MachinePath};
use crate::problem::{Kind, Problem};
use crate::routes::{check_key, entity_location, find_entity, live_entity, narrow, parse_limit, unknown_word};
use crate::state::AppState;

/// Read routes of entities.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(error_groups))
        .routes(routes!(get))
        .routes(routes!(history))
        .routes(routes!(related))
        .routes(routes!(timers))
        .routes(routes!(errors))
        .routes(routes!(why))
}

/// Write routes of entities.
pub fn write() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create))
}

/// Creates an entity in its machine's initial state. With an `Idempotency-Key` already
/// used, nothing is created and the entity is returned as it is (200).
#[utoipa::path(
    post,
    operation_id = "createEntity",
    path = "/v1/machines/{machine}/entities",
    tag = "entities",
    params(MachinePath, ("Idempotency-Key" = Option<String>, Header, description = "the operation's request id")),
    request_body = CreateEntity,
    responses(
        (status = 201, description = "created; Location is the entity's URL", body = Entity),
        (status = 200, description = "replay of an Idempotency-Key: the entity as it is", body = Entity),
    )
)]
async fn create(
    State(s): State<AppState>,
    Path(MachinePath { machine }): Path<MachinePath>,
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
    Ok((status, [(header::LOCATION, location)], Json(s.entity(&created.entity))).into_response())
}

/// Lists entities by id (by machine and key with `prefix`), a page at a time. Machine,
/// state, run status, health and prefix are read through an index; `where`, `error` and
/// the time ranges are tried on at most 1,000 of those rows a page (the page may then hold
/// fewer than `limit`; `next` goes on after them): a page costs the same in a fleet of
/// any size.
#[utoipa::path(
    get,
    operation_id = "listEntities",
    path = "/v1/entities",
    tag = "entities",
    params(EntityQuery),
    responses(
        (status = 200, description = "a page of entities", body = EntityPage),
    )
)]
async fn list(State(s): State<AppState>, Query(q): Query<EntityQuery>) -> Result<Json<EntityPage>, Problem> {
    let mut filter = index_filter(&s, &q)?;
    let order = match (&q.prefix, filter.order) {
        (Some(_), _) => PageOrder::Key,
        (None, EntityOrder::Id) => PageOrder::Id,
        (None, _) => PageOrder::Entered,
    };
    if let Some(a) = q.after.as_deref() {
        cursor(&s, a, order, &mut filter).await?;
    }
    let limit = parse_limit(q.limit.as_deref())?;
    if let Some(e) = q.errors.as_deref().filter(|e| *e != "latest") {
        return Err(unknown_word("errors", "errors", e, &["latest"]));
    }
    let text = settle_engine::NarrowText {
        expr: q.expr.as_deref(),
        error: q.error.as_deref(),
        created_after: q.created_after.as_deref(),
        created_before: q.created_before.as_deref(),
        entered_after: q.entered_after.as_deref(),
        entered_before: q.entered_before.as_deref(),
    };
    let narrow = narrow(text, s.engine().clock().now_ms(), Kind::BadRequest, "")?;
    let total = match q.total {
        Some(true) if narrow.is_empty() => {
            let n = s.engine().store().entity_count(filter.clone(), TOTAL_BOUND).await?;
            Some(Total { count: n.min(TOTAL_BOUND), exact: n <= TOTAL_BOUND })
        }
        Some(true) => Some(narrowed_total(&s, &narrow, filter.clone()).await?),
        _ => None,
    };
    // Criteria no index holds: a page examines a bounded number of rows.
    let read = if narrow.is_empty() { limit + 1 } else { EXAMINE.max(limit + 1) };
    let rows = s.engine().store().entity_list(EntityFilter { limit: Some(read), ..filter }).await?;
    let settle_engine::Narrowed { rows, keeps, mut errors } = s.engine().narrowed(&narrow, rows).await?;
    let mut kept: Vec<&EntityRow> = Vec::new();
    let mut next_after = None;
    for (row, keep) in rows.iter().zip(keeps) {
        if !keep {
            continue;
        }
        if kept.len() as u64 == limit {
            // One more passes: the page ends at the last one kept.
            next_after = kept.last().copied();
            break;
        }
        kept.push(row);
    }
    if next_after.is_none() && !narrow.is_empty() && rows.len() as u64 == read {
        // Every row read was examined and more may follow: go on after the last.
        next_after = rows.last();
    }
    let next = next_after.map(|e| next_cursor(e, order));
    let mut items: Vec<Entity> = kept.iter().map(|e| s.entity(e)).collect();
    if q.errors.is_some() {
        if !narrow.reads_errors() {
            // Only the page's: not every row looked at.
            let ids = kept.iter().map(|e| e.id).collect();
            errors = s.engine().store().error_newest(ids).await?.into_iter().collect();
        }
        for (item, row) in items.iter_mut().zip(&kept) {
            item.last_error = errors.remove(&row.id).as_ref().map(ErrorEntry::from);
        }
    }
    Ok(Json(EntityPage { items, next, total }))
}

/// The store's filter of `q`'s index criteria (no cursor, no limit), checked.
fn index_filter(s: &AppState, q: &EntityQuery) -> Result<EntityFilter, Problem> {
    if let Some(st) = q.status.as_deref()
        && !RUN_STATUS.contains(&st)
    {
        return Err(unknown_word("status", "run status", st, RUN_STATUS));
    }
    if let Some(h) = q.health.as_deref()
        && !HEALTH.contains(&h)
    {
        return Err(unknown_word("health", "health", h, HEALTH));
    }
    // A parent state lists the entities in its substates.
    let served = s.machines();
    let machines = served.iter().map(|m| m.as_ref()).filter(|m| q.machine.as_deref().is_none_or(|n| m.name() == n));
    let substates = q.state.as_deref().map(|st| Machine::substates_across(machines, st)).unwrap_or_default();
    // A health is the (machine, state) pairs of the served machines' leaf states that have it.
    let pairs = q.health.as_deref().map(|h| settle_engine::health_pairs(served.iter().map(|m| m.as_ref()), h));
    let order = match q.sort.as_deref() {
        None | Some("id") => EntityOrder::Id,
        Some("entered") => EntityOrder::EnteredFirst,
        Some("-entered") => EntityOrder::EnteredLast,
        Some(other) => return Err(unknown_word("sort", "order", other, SORT)),
    };
    if order != EntityOrder::Id {
        // Each (machine, state) range of the entered index is read in order; a prefix
        // orders by key, and a run status would be looked for through whole ranges.
        let clash = if q.prefix.is_some() { Some("prefix") } else { q.status.as_ref().map(|_| "status") };
        if let Some(other) = clash {
            return Err(Problem::new(
                Kind::BadRequest,
                format!(
                    "sort: a page by entered time cannot also filter by {other} (filter by machine, state or health)"
                ),
            )
            .field("sort"));
        }
    }
    Ok(EntityFilter {
        machine: q.machine.clone(),
        state: q.state.clone(),
        substates,
        after_id: None,
        limit: None,
        run_status: q.status.clone(),
        key_prefix: q.prefix.clone(),
        after_key: None,
        pairs,
        order,
        after_entered: None,
    })
}

/// The newest errors of the entities the filters match (the first 10,000 in the list's
/// order), grouped by their text with each number as `#`, the largest group first. A
/// group's `error` given to the list as `error` pages through its entities.
#[utoipa::path(
    get,
    operation_id = "groupErrors",
    path = "/v1/entities/error-groups",
    tag = "entities",
    params(ErrorGroupQuery),
    responses(
        (status = 200, description = "the groups", body = ErrorGroups),
    )
)]
async fn error_groups(
    State(s): State<AppState>,
    Query(g): Query<ErrorGroupQuery>,
) -> Result<Json<ErrorGroups>, Problem> {
    let q = EntityQuery {
        machine: g.machine,
        state: g.state,
        status: g.status,
        health: g.health,
        prefix: g.prefix,
        ..EntityQuery::default()
    };
    let (examined, exact) = first_bound(&s, index_filter(&s, &q)?).await?;
    let errors = s.engine().newest_errors(&examined).await?;
    // group text → (count, first member, its error)
    let mut groups: std::collections::HashMap<Option<String>, (u64, usize)> = std::collections::HashMap::new();
    for (i, e) in examined.iter().enumerate() {
        let key = errors.get(&e.id).map(|err| settle_engine::error_group(&err.details));
        groups.entry(key).or_insert((0, i)).0 += 1;
    }
    let mut groups: Vec<ErrorGroup> = groups
        .into_iter()
        .map(|(error, (count, first))| {
            let e = &examined[first];
            ErrorGroup {
                error,
                count,
                example: format!("{}/{}", e.machine, e.key),
                details: errors.get(&e.id).map(|err| err.details.clone()),
            }
        })
        .collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.error.cmp(&b.error)));
    Ok(Json(ErrorGroups { groups, examined: examined.len() as u64, exact }))
}

/// How far `total=true` counts exactly.
const TOTAL_BOUND: u64 = 10_000;
/// How many entities a page with criteria no index holds examines at most.
const EXAMINE: u64 = 1_000;

/// `total=true` with criteria no index holds: of the first [`TOTAL_BOUND`] entities the
/// index filters reach, how many pass (exact when there are no more).
async fn narrowed_total(s: &AppState, narrow: &Narrow, filter: EntityFilter) -> Result<Total, Problem> {
    let (examined, exact) = first_bound(s, filter).await?;
    let keeps = s.engine().narrowed(narrow, examined).await?.keeps;
    Ok(Total { count: keeps.iter().filter(|k| **k).count() as u64, exact })
}

/// The first [`TOTAL_BOUND`] entities `filter` reaches from its start (whatever its
/// cursor), and whether they are all there are.
async fn first_bound(s: &AppState, filter: EntityFilter) -> Result<(Vec<EntityRow>, bool), Problem> {
    let whole =
        EntityFilter { limit: Some(TOTAL_BOUND + 1), after_id: None, after_key: None, after_entered: None, ..filter };
    let mut rows = s.engine().store().entity_list(whole).await?;
    let exact = rows.len() as u64 <= TOTAL_BOUND;
    rows.truncate(TOTAL_BOUND as usize);
    Ok((rows, exact))
}

/// The order of a page: by id, by machine and key (a key prefix), or by entered time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageOrder {
    Id,
    Key,
    Entered,
}

/// The cursor of the page after `e` in `order` (`next`).
fn next_cursor(e: &EntityRow, order: PageOrder) -> String {
    match order {
        PageOrder::Id => e.id.to_string(),
        PageOrder::Key => format!("{}/{}", e.machine, e.key),
        PageOrder::Entered => format!("{}.{}", e.entered_at, e.id),
    }
}

/// Sets `f`'s position after the cursor `a` in `order`. `next` gives the form of its
/// order (an id, `machine/key`, or `entered.id`); another form names an entity, looked up
/// (404 if there is none).
async fn cursor(s: &AppState, a: &str, order: PageOrder, f: &mut EntityFilter) -> Result<(), Problem> {
    if !CURSOR.matches(a) {
        return Err(Problem::new(
            Kind::BadRequest,
            format!(
                "after must be the `next` of a previous page (an entity id, `machine/key` or `entered.id`), not `{a}`"
            ),
        )
        .field("after"));
    }
    let unknown =
        || Problem::new(Kind::UnknownEntity, format!("after names no entity: `{a}`")).field("after").with("after", a);
    let store = s.engine().store();
    let named = if let Some((m, k)) = a.split_once('/') {
        if order == PageOrder::Key {
            f.after_key = Some((m.to_string(), k.to_string()));
            return Ok(());
        }
        store.entity_get(m, k).await?
    } else {
        let (at, id) = match a.split_once('.') {
            Some((at, id)) => (Some(at.parse::<i64>().map_err(|_| unknown())?), id),
            None => (None, a),
        };
        let id: i64 = id.parse().map_err(|_| unknown())?;
        match (order, at) {
            (PageOrder::Id, _) => {
                f.after_id = Some(id);
                return Ok(());
            }
            (PageOrder::Entered, Some(at)) => {
                f.after_entered = Some((at, id));
                return Ok(());
            }
            _ => store.entities_by_id(vec![id]).await?.into_iter().next(),
        }
    };
    let e = named.ok_or_else(unknown)?;
    match order {
        PageOrder::Id => f.after_id = Some(e.id),
        PageOrder::Key => f.after_key = Some((e.machine.to_string(), e.key.to_string())),
        PageOrder::Entered => f.after_entered = Some((e.entered_at, e.id)),
    }
    Ok(())
}

/// One entity, with the events valid in its state. An entity in its machine's deleted
/// state is gone (410).
#[utoipa::path(
    get,
    operation_id = "getEntity",
    path = "/v1/machines/{machine}/entities/{key}",
    tag = "entities",
    params(EntityPath),
    responses(
        (status = 200, description = "the entity", body = Entity),
    )
)]
async fn get(
    State(s): State<AppState>,
    Path(EntityPath { machine, key }): Path<EntityPath>,
) -> Result<Json<Entity>, Problem> {
    let e = live_entity(&s, &machine, &key).await?;
    // Its own version's: a pinned entity may run under an older one than its machine's.
    let m = s.version_of(&e)?;
    let mut entity = s.entity(&e);
    entity.permitted_events = Some(m.permitted_events(&e.state).map(|ev| ev.name.to_string()).collect());
    entity.lease_until = e.lease_until;
    entity.recent_errors = Some(e.recent_errors.len() as u32);
    let offer = |name: &str| {
        let verdict = settle_store::command_applies(name, &e);
        CommandOffer { name: name.to_string(), applies: verdict.is_ok(), why: verdict.err().map(str::to_string) }
    };
    entity.commands = Some(settle_store::COMMANDS.iter().map(|c| offer(c)).collect());
    let inbox =
        s.engine().store().inbox_list(e.id).await.map_err(|err| Problem::new(Kind::Internal, err.to_string()))?;
    entity.inbox =
        Some(inbox.into_iter().map(|i| QueuedEvent { event: i.event.to_string(), params: i.params }).collect());
    entity.next_fires = Some(next_fires(&s, &m, &e.state).await?);
    if !m.limits().is_empty() {
        let limits = s.engine().store().limit_of(e.id).await?;
        entity.limits = Some(limits.iter().map(settle_api::EntityLimit::from).collect());
    }
    Ok(Json(entity))
}

/// The raising schedules of `m` whose states hold an entity in `state`, with their next
/// fires (the schedules' rows are read only when there is one).
async fn next_fires(s: &AppState, m: &settle_core::Machine, state: &str) -> Result<Vec<NextFire>, Problem> {
    let reaching: Vec<&settle_core::calendar::Calendar> = m
        .schedules()
        .iter()
        .filter(|c| {
            matches!(&c.fire, settle_core::calendar::Fire::Raise { states, .. } if states.iter().any(|st| m.is_in(state, st)))
        })
        .collect();
    if reaching.is_empty() {
        return Ok(Vec::new());
    }
    let rows = s.engine().store().schedule_list().await.map_err(|err| Problem::new(Kind::Internal, err.to_string()))?;
    Ok(reaching
        .into_iter()
        .map(|c| {
            let row = rows.iter().find(|r| r.machine == m.name().as_str() && r.name == c.name());
            NextFire {
                schedule: c.name().to_string(),
                does: settle_engine::describe_fire(c),
                at: row.filter(|r| !r.paused && r.next_at != i64::MAX).map(|r| r.next_at),
                paused: row.is_some_and(|r| r.paused),
            }
        })
        .collect())
}

/// An entity's transition history, oldest first (also of a deleted entity: the audit
/// trail stays readable).
#[utoipa::path(
    get,
    operation_id = "getEntityHistory",
    path = "/v1/machines/{machine}/entities/{key}/history",
    tag = "entities",
    params(EntityPath),
    responses(
        (status = 200, description = "history rows, oldest first", body = Vec<HistoryEntry>),
    )
)]
async fn history(
    State(s): State<AppState>,
    Path(EntityPath { machine, key }): Path<EntityPath>,
) -> Result<Json<Vec<HistoryEntry>>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let rows = s.engine().store().history_list(e.id).await?;
    Ok(Json(rows.iter().map(HistoryEntry::from).collect()))
}

/// The entity's predecessors and successors, and how far each subscription valid in its
/// state is from firing (its pattern evaluated over the successors now).
#[utoipa::path(
    get,
    operation_id = "getEntityRelated",
    path = "/v1/machines/{machine}/entities/{key}/related",
    tag = "entities",
    params(EntityPath),
    responses(
        (status = 200, description = "predecessors, successors and subscription progress", body = Related),
    )
)]
async fn related(
    State(s): State<AppState>,
    Path(EntityPath { machine, key }): Path<EntityPath>,
) -> Result<Json<Related>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let store = s.engine().store();
    let predecessors = store.predecessor_list(e.id).await?;
    let successors = store.successor_snapshot(e.id).await?.successors;
    let subscriptions = s
        .engine()
        .subscription_progress(&e, &successors)?
        .into_iter()
        .map(crate::model::subscription_progress_of)
        .collect();
    Ok(Json(Related {
        predecessors: predecessors.iter().map(|e| s.entity(e)).collect(),
        successors: successors.iter().map(|e| s.entity(e)).collect(),
        subscriptions,
    }))
}

/// The entity's pending timers, by name.
#[utoipa::path(
    get,
    operation_id = "listEntityTimers",
    path = "/v1/machines/{machine}/entities/{key}/timers",
    tag = "entities",
    params(EntityPath),
    responses(
        (status = 200, description = "pending timers, by name", body = Vec<Timer>),
    )
)]
async fn timers(
    State(s): State<AppState>,
    Path(EntityPath { machine, key }): Path<EntityPath>,
) -> Result<Json<Vec<Timer>>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let rows = s.engine().store().timer_list(e.id).await?;
    Ok(Json(rows.iter().map(Timer::from).collect()))
}

/// The entity's newest recorded errors (at most 100), newest first.
#[utoipa::path(
    get,
    operation_id = "listEntityErrors",
    path = "/v1/machines/{machine}/entities/{key}/errors",
    tag = "entities",
    params(EntityPath),
    responses(
        (status = 200, description = "errors, newest first", body = Vec<ErrorEntry>),
    )
)]
async fn errors(
    State(s): State<AppState>,
    Path(EntityPath { machine, key }): Path<EntityPath>,
) -> Result<Json<Vec<ErrorEntry>>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    let rows = s.engine().store().error_list(e.id, 100).await?;
    Ok(Json(rows.iter().map(ErrorEntry::from).collect()))
}

/// Why the entity failed, down to the first cause: its failure (the error its entry into
/// an error-health state recorded, or the one that parked it), then each entity that
/// failure names as its cause (a subscription's matches) with its own failure at that
/// time, and so on. `failing` says whether it is failing now.
#[utoipa::path(
    get,
    operation_id = "explainEntityFailure",
    path = "/v1/machines/{machine}/entities/{key}/why",
    tag = "entities",
    params(EntityPath),
    responses(
        (status = 200, description = "the chain of causes", body = Why),
    )
)]
async fn why(
    State(s): State<AppState>,
    Path(EntityPath { machine, key }): Path<EntityPath>,
) -> Result<Json<Why>, Problem> {
    let e = find_entity(&s, &machine, &key).await?;
    match settle_store::why(s.engine().store(), &machine, &key).await? {
        Some(w) => {
            let mut why = Why::from(&w);
            let limits = s.engine().store().limit_of(e.id).await?;
            why.limits = limits.iter().map(settle_api::EntityLimit::from).collect();
            Ok(Json(why))
        }
        None => Err(Problem::unknown_entity(&machine, &key)),
    }
}
