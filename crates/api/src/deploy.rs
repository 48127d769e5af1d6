//! Definitions deployed to a running deployment: `POST /v1/machines` (admin).

use serde::{Deserialize, Serialize};

/// `POST /v1/machines`: new versions of machines, as TOML files.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeployRequest {
    /// The definitions, one machine a file.
    pub files: Vec<DeployFile>,
    /// Check and answer what would happen; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// One machine's definition, as a `--machines` file holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeployFile {
    /// The file's name, e.g. `server.toml`: its stem names the machine unless it says
    /// `name`, and errors point at it.
    pub name: String,
    /// The file's text (TOML).
    pub toml: String,
}

/// What a deploy did (or, on a dry run, would do).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeployResult {
    /// Nothing was changed: a dry run.
    pub dry_run: bool,
    /// One entry a machine, by name.
    pub machines: Vec<Deployed>,
}

/// One machine's new version and what it did to the live entities.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deployed {
    /// The machine.
    pub machine: String,
    /// The version deployed (its content hash).
    pub version: String,
    /// The version it replaced as current (null: a new machine).
    pub previous: Option<String>,
    /// How live entities move to it: `pin` (once at rest) or `migrate` (at once).
    pub upgrade: String,
    /// Entities moved to it now.
    pub moved: u64,
    /// Entities still working under an older version, moving once at rest (`pin`).
    pub pinned: u64,
    /// It was the current version already: nothing changed.
    pub unchanged: bool,
}

/// Live entities a refused version would strand (a `version-strands-entities` problem's
/// `stranded`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Stranded {
    /// The machine.
    pub machine: String,
    /// The state they are in, which the new version has no home for.
    pub state: String,
    /// For pinned entities still working: the state they may come to rest in, which the
    /// new version has no home for.
    pub rest: Option<String>,
    /// How many.
    pub count: u64,
    /// The keys of the first of them (up to ten).
    pub keys: Vec<String>,
}
