//! `settle --server URL ...`: the commands with an HTTP face (`get`, `list`, `history`,
//! `ops`, `op`, `related`, `create`, `raise`, `check` and the operator commands) through
//! settle-client instead of the database. They print through [`crate::print`], as the
//! local commands do; the server's problems become errors (exit 1) with their detail.

use std::process::ExitCode;

use serde_json::Value;
use settle_client::{Client, Error, ListFilter, Raised};

use crate::operate::{CreateArgs, Kind, RaiseArgs, Target};
use crate::print;

/// A client of `server`, with `token` as its bearer token.
pub fn client(server: &str, token: Option<&str>) -> anyhow::Result<Client> {
    let client = Client::new(server)?;
    Ok(match token {
        Some(t) => client.with_token(t),
        None => client,
    })
}

/// A client error as one line: a problem with its status, detail and type; an unreachable
/// server with the root cause only (the transport's chain repeats itself).
pub fn describe(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<Error>() {
        Some(Error::Transport { url, source }) => {
            let mut root: &dyn std::error::Error = source;
            while let Some(next) = root.source() {
                root = next;
            }
            anyhow::anyhow!("cannot reach {url}: {root}")
        }
        Some(other) => anyhow::anyhow!("{other}"),
        None => e,
    }
}

/// `settle list`: every page.
pub async fn list(c: &Client, a: crate::inspect::ListArgs) -> anyhow::Result<ExitCode> {
    let as_json = a.json;
    let narrow = a.narrow;
    let mut filter = ListFilter {
        machine: a.machine,
        state: a.state,
        status: a.status,
        prefix: a.prefix,
        after: None,
        limit: Some(1000),
        expr: narrow.expr,
        error: narrow.error,
        created_after: narrow.created_after,
        created_before: narrow.created_before,
        entered_after: narrow.entered_after,
        entered_before: narrow.entered_before,
        sort: a.sort,
    };
    let mut header = true;
    loop {
        let page = c.list(&filter).await?;
        print::entity_rows(&page.items, as_json, &mut header);
        match page.next {
            Some(next) => filter.after = Some(next),
            None => break,
        }
    }
    print::no_entities(header, as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle get`: the entity as the API shows it (no error count, lease end or inbox: the
/// API does not carry them).
pub async fn get(c: &Client, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let e = c.entity(machine, key).await?;
    let detail = e.recent_errors.map(|errors| print::Detail {
        lease_until: e.lease_until,
        recent_errors: errors as usize,
        inbox: e.inbox.iter().flatten().map(|q| (q.event.clone(), q.params.clone())).collect(),
    });
    print::entity(&e, detail.as_ref(), as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle limits`.
pub async fn limits(c: &Client, as_json: bool) -> anyhow::Result<ExitCode> {
    print::limits(&c.limits().await?, as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle why`.
pub async fn why(c: &Client, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    print::why(&c.why(machine, key).await?, as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle history` (transitions; the API has no route for processed events).
pub async fn history(c: &Client, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    print::history(&c.history(machine, key).await?, as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle ops`.
pub async fn operations(c: &Client, outcome: Option<&str>, limit: u64, as_json: bool) -> anyhow::Result<ExitCode> {
    print::operations(&c.operations(outcome, limit).await?, as_json);
    Ok(ExitCode::SUCCESS)
}

/// Whether an operation with `request_id` exists: a request sent again with it is a replay.
async fn seen(c: &Client, request_id: &str) -> anyhow::Result<bool> {
    match c.operation(request_id).await {
        Ok(_) => Ok(true),
        Err(e) if e.status() == Some(404) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The request id to send: the one given (and whether it was used before), or a new one,
/// so that the output can name it as the local command does.
async fn request_id(c: &Client, given: Option<&str>) -> anyhow::Result<(String, bool)> {
    match given {
        Some(id) => Ok((id.to_string(), seen(c, id).await?)),
        None => Ok((uuid::Uuid::now_v7().to_string(), false)),
    }
}

/// An operator command.
pub async fn command(c: &Client, t: Target, kind: Kind) -> anyhow::Result<ExitCode> {
    let (id, replayed) = request_id(c, t.request_id.as_deref()).await?;
    let until = match &kind {
        Kind::Sleep(until) => Some(until.as_str()),
        _ => None,
    };
    let entity = c.command_for(&t.machine, &t.key, kind.name(), until, Some(&id), t.reason.as_deref()).await?;
    print::done(&print::Done { entity: &entity, command: kind.name(), request_id: &id, replayed }, t.json);
    Ok(ExitCode::SUCCESS)
}

/// `settle op`: the operation's trace (`GET /v1/operations/{id}/trace`).
pub async fn operation(c: &Client, request_id: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let trace = c.operation_trace(request_id).await?;
    print::operation_trace(&trace, as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle related`: the entity, then its relations (`GET …/entities/{key}/related`).
pub async fn related(c: &Client, machine: &str, key: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let entity = c.entity(machine, key).await?;
    let related = c.related(machine, key).await?;
    print::related(&entity, &related, as_json);
    Ok(ExitCode::SUCCESS)
}

/// `settle create`.
pub async fn create(c: &Client, a: CreateArgs) -> anyhow::Result<ExitCode> {
    let properties = a.properties()?;
    let (id, replayed) = request_id(c, a.idempotency_key.as_deref()).await?;
    let entity = c.create(&a.machine, &a.key, Value::Object(properties), Some(&id)).await?;
    print::done(&print::Done { entity: &entity, command: "create", request_id: &id, replayed }, a.json);
    Ok(ExitCode::SUCCESS)
}

/// `settle raise`: queued (202), or with `--wait` done (200); a rejection or a failed
/// action (409 `event-rejected`, 422 `event-failed`) is an outcome, printed, exit 1.
pub async fn raise(c: &Client, a: RaiseArgs) -> anyhow::Result<ExitCode> {
    let params = a.params()?;
    let wait = match a.wait {
        Some(w) => Some((w.client(), a.timeout()?)),
        None => None,
    };
    let replayed = match &a.idempotency_key {
        Some(id) => seen(c, id).await?,
        None => false,
    };
    let answer = c.raise_at(&a.machine, &a.key, &a.event, params, wait, a.idempotency_key.as_deref(), a.priority).await;
    let (request_id, raised) = match answer {
        Ok(Raised::Queued { request_id, .. }) => (Some(request_id), print::Raised::Queued { replayed }),
        Ok(Raised::Done { request_id, outcome, entity, operation }) => {
            (Some(request_id), print::Raised::Done { outcome, entity, operation })
        }
        Err(Error::Problem { problem, .. }) if matches!(problem.kind(), "event-rejected" | "event-failed") => {
            let text = |k: &str| problem.extra.get(k).and_then(Value::as_str).map(str::to_string);
            let raised = if problem.kind() == "event-rejected" {
                print::Raised::Rejected {
                    state: text("state").unwrap_or_default(),
                    reason: text("reason").or(problem.detail.clone()).unwrap_or_default(),
                }
            } else {
                print::Raised::Failed { error: text("error").or(problem.detail.clone()).unwrap_or_default() }
            };
            // An at-rest refusal was not recorded: it has no request id.
            (text("request_id"), raised)
        }
        Err(e) => return Err(e.into()),
    };
    let r =
        print::Raise { machine: &a.machine, key: &a.key, event: &a.event, request_id: request_id.as_deref(), raised };
    print::raise(&r, a.json);
    Ok(if r.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `settle --server URL check`: the server's verdict, printed as the local command prints it.
pub async fn check(c: &Client, a: crate::operate::CheckArgs) -> anyhow::Result<ExitCode> {
    let params = a.params()?;
    let check = c.check_event(&a.machine, &a.key, &a.event, params).await?;
    Ok(crate::print::check(&a.machine, &a.key, &check, a.json))
}
