//! The path parameters of the routes, typed and documented once: each route names the
//! struct of its path (`params(EntityPath)`, `Path(p): Path<EntityPath>`) instead of
//! repeating the parameters' names, types and descriptions.

use serde::Deserialize;
use utoipa::IntoParams;

/// `/v1/machines/{machine}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct MachinePath {
    /// machine name
    pub machine: String,
}

/// `/v1/machines/{machine}/entities/{key}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EntityPath {
    /// machine name
    pub machine: String,
    /// entity key
    pub key: String,
}

/// `/v1/machines/{machine}/entities/{key}/events/{event}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    /// machine name
    pub machine: String,
    /// entity key
    pub key: String,
    /// event name
    pub event: String,
}

/// `/v1/operations/{id}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct OperationPath {
    /// the operation's request id
    pub id: String,
}

/// `/v1/queues/{queue}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct QueuePath {
    /// agent queue
    pub queue: String,
}

/// `/v1/tasks/{id}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TaskPath {
    /// task id
    pub id: i64,
}

/// `/v1/bulk/{id}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BulkPath {
    /// the bulk operation's request id
    pub id: String,
}

/// `/v1/schedules/{machine}/{name}…`
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SchedulePath {
    /// the machine
    pub machine: String,
    /// the schedule's name
    pub name: String,
}
