//! The router: every module's routes behind their access group, the OpenAPI document built
//! from the same routes, and problem+json for unknown routes and methods.
//!
//! To add a module of routes: give it a function returning an `OpenApiRouter<AppState>`
//! whose handlers carry `#[utoipa::path]`, registered with `routes!` (never a bare
//! `route`, so every served route is in the spec), and merge it in [`api`] with its
//! [`Access`] group — one line.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::{Extension, Router};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;

use crate::auth::{self, Access};
use crate::problem::{Kind, Problem};
use crate::routes::{
    bulk, entities, events, feed, lifecycle, limits, machines, operations, overview, queues, schedules, system,
};
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Settle",
        description = "Settle's management API: machines, entities, events, operations, lifecycle \
                       commands, agent queues. Errors are application/problem+json with a stable `type`."
    ),
    modifiers(&BearerAuth),
    // Every error response refers to it (see crate::contract).
    components(schemas(crate::problem::ProblemBody)),
    tags(
        (name = "system", description = "health, metrics, this document"),
        (name = "machines", description = "the machines the server serves"),
        (name = "entities", description = "create, list and read entities"),
        (name = "events", description = "raise events on entities"),
        (name = "lifecycle", description = "operator commands on an entity's run status"),
        (name = "bulk", description = "one command or event for every entity matching a filter, as one durable operation"),
        (name = "schedules", description = "calendar schedules: next fires, counts, pause and resume"),
        (name = "operations", description = "what requests set in motion"),
        (name = "overview", description = "the fleet at a glance"),
        (name = "limits", description = "flow control: each concurrency limit's slots in use and work waiting"),
        (name = "feed", description = "changes as they commit: server-sent events, resumable by id"),
        (name = "agents", description = "agent queues: lease tasks, heartbeat, report (DESIGN §5)"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The OpenAPI document as served by `/openapi.json`.
#[derive(Clone)]
pub struct OpenApiJson(pub Arc<String>);

/// Every route with its access group, and the OpenAPI document describing them.
pub fn api(state: &AppState) -> OpenApiRouter<AppState> {
    let gate = state.gate();
    let guard = |routes, access| auth::guard(routes, gate.clone(), access);
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(guard(system::public(), Access::Public))
        .merge(guard(system::read(), Access::Read))
        .merge(guard(machines::read(), Access::Read))
        .merge(guard(machines::admin(), Access::Admin))
        .merge(guard(entities::read(), Access::Read))
        .merge(guard(entities::write(), Access::Write))
        .merge(guard(events::read(), Access::Read))
        .merge(guard(events::write(), Access::Write))
        .merge(guard(lifecycle::write(), Access::Write))
        .merge(guard(bulk::read(), Access::Read))
        .merge(guard(bulk::write(), Access::Write))
        .merge(guard(schedules::read(), Access::Read))
        .merge(guard(schedules::write(), Access::Write))
        .merge(guard(operations::read(), Access::Read))
        .merge(guard(operations::write(), Access::Write))
        .merge(guard(overview::read(), Access::Read))
        .merge(guard(limits::read(), Access::Read))
        .merge(guard(feed::read(), Access::Read))
        .merge(guard(queues::agent(), Access::Agent))
}

/// The OpenAPI document of [`api`], as served: the routes' annotations with the contract
/// ([`crate::contract::document`]: constraints, examples, every problem of each operation).
pub fn openapi(state: &AppState) -> serde_json::Value {
    finish(api(state).into_openapi())
}

fn finish(doc: utoipa::openapi::OpenApi) -> serde_json::Value {
    let mut doc = serde_json::to_value(doc).expect("the document serializes");
    crate::contract::document(&mut doc);
    doc
}

/// The service: [`api`] with the body limit, `/openapi.json`'s document, the dashboard's
/// pages ([`crate::ui`], not API routes: outside the document), and problem+json for
/// unknown routes (404) and methods (405); every request, whatever its route, first
/// passes the checks against what a web page can make a browser send ([`crate::browser`]).
pub fn router(state: AppState) -> Router {
    let (router, spec) = api(&state).split_for_parts();
    let spec = OpenApiJson(Arc::new(finish(spec).to_string()));
    let policy = state.config().browser.clone().with_tokens(!state.tokens().is_open());
    let browser = (Arc::new(policy), state.refusals());
    router
        .merge(crate::ui::routes())
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(Extension(spec))
        .layer(DefaultBodyLimit::max(state.config().max_body))
        .layer(axum::middleware::from_fn(crate::conditional::etag))
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(axum::middleware::from_fn_with_state(browser, crate::browser::check))
        .layer(axum::middleware::from_fn(crate::trace::request))
        .layer(axum::middleware::from_fn(crate::conditional::protect))
        .with_state(state)
}

async fn unknown_route(uri: axum::http::Uri) -> Problem {
    Problem::new(Kind::UnknownRoute, format!("no route `{}`", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Problem {
    Problem::new(Kind::MethodNotAllowed, format!("route `{}` does not take {method}", uri.path()))
}
