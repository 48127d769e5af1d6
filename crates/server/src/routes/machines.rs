//! The served machines: list, definition, diagram, versions; deploying new versions.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use settle_core::graph::{self, Format};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::{JsonBody, Path, Query};
use crate::model::{GraphQuery, MachineList, MachineSummary, MachineVersion, StateRetention};
use crate::paths::MachinePath;
use crate::problem::{Kind, Problem};
use crate::state::AppState;
use settle_api::{DeployRequest, DeployResult, Deployed};

/// Read routes of machines.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(definition))
        .routes(routes!(diagram))
        .routes(routes!(versions))
        .routes(routes!(toml))
}

/// Admin routes of machines: deploying new versions.
pub fn admin() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(deploy))
}

/// Deploys new versions of machines to the running deployment (admin): each file's
/// version is checked against the live entities of its machine, then stored as the
/// current one; its `upgrade` policy moves the entities (`migrate`: at once; `pin`: those
/// at rest now, the working ones once they rest). Every instance takes it up within a
/// second, without a restart. All or nothing: a version that would strand live entities
/// refuses the deploy (409 `version-strands-entities`, listing them), an invalid one
/// (422 `invalid-definition`, naming the file); nothing is stored then. `dry_run`
/// answers what would happen.
#[utoipa::path(
    post,
    operation_id = "deployMachines",
    path = "/v1/machines",
    tag = "machines",
    request_body = DeployRequest,
    responses(
        (status = 200, description = "what the deploy did, or would do", body = DeployResult),
    )
)]
async fn deploy(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<DeployRequest>,
) -> Result<Json<DeployResult>, Problem> {
    let mut machines = Vec::new();
    for (i, f) in req.files.iter().enumerate() {
        let stem = std::path::Path::new(&f.name).file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        match settle_core::toml::load(&f.name, stem, &f.toml) {
            Ok((m, _)) => machines.push(m),
            Err(report) => {
                let detail = format!("{}: {}", f.name, report.to_string().trim_end());
                return Err(Problem::new(Kind::InvalidDefinition, detail).field(format!("files[{i}]")));
            }
        }
    }
    let done = s.engine().deploy(machines, req.dry_run).await?;
    Ok(Json(DeployResult { dry_run: req.dry_run, machines: done.into_iter().map(deployed).collect() }))
}

/// A machine's deploy as the API shows it.
pub fn deployed(d: settle_engine::Deployed) -> Deployed {
    Deployed {
        machine: d.machine,
        version: d.version,
        previous: d.previous,
        upgrade: d.upgrade.to_string(),
        moved: d.moved,
        pinned: d.pinned,
        unchanged: d.unchanged,
    }
}

/// The machines this server serves.
#[utoipa::path(
    get,
    operation_id = "listMachines",
    path = "/v1/machines",
    tag = "machines",
    responses(
        (status = 200, description = "the machines, by name", body = MachineList),
    )
)]
async fn list(State(s): State<AppState>) -> Json<MachineList> {
    let defaults = s.engine().retention();
    let items = s
        .machines()
        .iter()
        .map(|m| MachineSummary {
            name: m.name().to_string(),
            hash: m.content_hash(),
            states: m.states().iter().map(|st| st.name.to_string()).collect(),
            events: m.events().iter().map(|e| e.name.to_string()).collect(),
            retention: m
                .end_states_kept(&defaults)
                .into_iter()
                .map(|(state, keep)| StateRetention { state: state.to_string(), keep: keep.as_text() })
                .collect(),
            history: history_text(m.history_kept(&defaults)),
            archived: m.archives(s.engine().archives()),
        })
        .collect();
    Json(MachineList { items })
}

/// What a live entity keeps of its past, as the dashboard shows it.
fn history_text(h: settle_core::retention::History) -> String {
    match (h.age, h.rows) {
        (age, None) => age.as_text(),
        (settle_core::retention::Keep::Forever, Some(n)) => format!("latest {n}"),
        (age, Some(n)) => format!("{}, latest {n}", age.as_text()),
    }
}

/// A machine's definition, as canonical JSON; its `ETag` is the definition's hash.
#[utoipa::path(
    get,
    operation_id = "getMachine",
    path = "/v1/machines/{machine}",
    tag = "machines",
    params(MachinePath),
    responses(
        (status = 200, description = "the canonical definition", body = Object),
    )
)]
async fn definition(
    State(s): State<AppState>,
    Path(MachinePath { machine }): Path<MachinePath>,
) -> Result<Response, Problem> {
    let m = s.machine(&machine)?;
    let etag = format!("\"{}\"", m.content_hash());
    Ok(([(header::CONTENT_TYPE, "application/json".to_string()), (header::ETAG, etag)], m.canonical_json())
        .into_response())
}

/// A machine's diagram: Mermaid `stateDiagram-v2`, Graphviz DOT, or SVG laid out by the
/// server (each state a `g.state[data-state]`, each edge a `g.edge[data-from][data-to]`,
/// so a page can light the current state and the path taken).
#[utoipa::path(
    get,
    operation_id = "getMachineGraph",
    path = "/v1/machines/{machine}/graph",
    tag = "machines",
    params(MachinePath, GraphQuery),
    responses(
        (status = 200, description = "the diagram: Mermaid or DOT as text, SVG as an image", content(
            (String = "text/plain"),
            (String = "image/svg+xml"),
        )),
    )
)]
async fn diagram(
    State(s): State<AppState>,
    Path(MachinePath { machine }): Path<MachinePath>,
    Query(q): Query<GraphQuery>,
) -> Result<Response, Problem> {
    let m = s.machine(&machine)?;
    let format = match q.format.as_deref() {
        None => Format::Mermaid,
        Some(f) => f.parse::<Format>().map_err(|e| Problem::new(Kind::BadRequest, e.to_string()).field("format"))?,
    };
    let content_type = match format {
        Format::Svg => "image/svg+xml; charset=utf-8",
        _ => "text/plain; charset=utf-8",
    };
    let text = match q.version.as_deref().filter(|v| *v != m.content_hash()) {
        None => graph::render(&m, format),
        Some(v) => {
            let stored = settle_store::Store::machine_list(s.engine().store()).await?;
            let record = stored.iter().find(|r| r.name.as_str() == machine && r.hash == v).ok_or_else(|| {
                Problem::new(Kind::UnknownMachine, format!("no stored version `{v}` of machine `{machine}`"))
                    .field("version")
            })?;
            let old = settle_core::Machine::from_canonical_json(&record.definition)
                .map_err(|e| Problem::new(Kind::Internal, format!("stored version `{v}` of `{machine}`: {e}")))?;
            graph::render(&old, format)
        }
    };
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}

/// The stored versions of a machine's definition, oldest first, each with the entities
/// whose latest transition ran under it (counted by reading the machine's entities: open
/// it, do not poll it).
#[utoipa::path(
    get,
    operation_id = "listMachineVersions",
    path = "/v1/machines/{machine}/versions",
    tag = "machines",
    params(MachinePath),
    responses(
        (status = 200, description = "stored versions, oldest first", body = Vec<MachineVersion>),
    )
)]
async fn versions(
    State(s): State<AppState>,
    Path(MachinePath { machine }): Path<MachinePath>,
) -> Result<Json<Vec<MachineVersion>>, Problem> {
    let m = s.machine(&machine)?;
    let current = m.content_hash();
    let all = settle_store::Store::machine_versions(s.engine().store()).await?;
    Ok(Json(
        all.iter()
            .filter(|(r, _)| r.name.as_str() == machine)
            .map(|(r, n)| MachineVersion {
                hash: r.hash.clone(),
                stored_at: r.created_at,
                entities: *n,
                current: r.hash == current,
                origin: r.origin.clone(),
            })
            .collect(),
    ))
}

/// A machine's definition as TOML, in the format `--machines` files are read in (it
/// reads back to the same definition: the same hash).
#[utoipa::path(
    get,
    operation_id = "getMachineToml",
    path = "/v1/machines/{machine}/toml",
    tag = "machines",
    params(MachinePath),
    responses(
        (status = 200, description = "the definition as TOML", body = String, content_type = "application/toml"),
    )
)]
async fn toml(
    State(s): State<AppState>,
    Path(MachinePath { machine }): Path<MachinePath>,
) -> Result<Response, Problem> {
    let m = s.machine(&machine)?;
    Ok(([(header::CONTENT_TYPE, "application/toml; charset=utf-8")], m.to_toml()).into_response())
}
