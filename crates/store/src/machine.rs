//! Machine definitions as stored: one [`MachineRecord`] per name and content hash, and a
//! deploy written whole ([`Deploy`], `Store::machine_deploy`): every version stored, every
//! entity moved and the deploy's marker written in one transaction, or nothing.
//!
//! The statements are written once for both stores (`$N`, in order of first appearance;
//! SQLite reads them as `?N`).

use settle_core::MachineName;

use crate::Millis;

/// A stored machine definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRecord {
    /// The machine's name.
    pub name: MachineName,
    /// Content hash of the definition.
    pub hash: String,
    /// Canonical JSON of the definition.
    pub definition: String,
    /// When this version was last deployed (stored, or deployed again): the latest is its
    /// machine's current version.
    pub created_at: Millis,
    /// Who deployed it, as its deployer said (`""`: a deploy of definitions given by a
    /// user; the `settle` binary marks its built-in machines `built-in`).
    pub origin: String,
}

/// The current version of each machine among `records` (the one deployed last), by name.
pub fn current_versions(records: &[MachineRecord]) -> std::collections::BTreeMap<&str, &MachineRecord> {
    let mut current: std::collections::BTreeMap<&str, &MachineRecord> = Default::default();
    for r in records {
        let at = current.entry(r.name.as_str()).or_insert(r);
        if r.created_at > at.created_at {
            *at = r;
        }
    }
    current
}

/// Entities moving to a definition version (`Store::machine_deploy`): those no engine
/// holds, in state `from` under version `version` (its hash; `""`: none recorded), land in
/// `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMove {
    /// The version they leave.
    pub version: String,
    /// The state they are in.
    pub from: String,
    /// The state they land in (`from` when it stays).
    pub to: String,
}

/// A version to store as its machine's current one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVersion {
    /// The machine.
    pub name: String,
    /// The definition's content hash.
    pub hash: String,
    /// Its canonical JSON.
    pub definition: String,
    /// Who deploys it ([`MachineRecord::origin`]).
    pub origin: String,
}

/// The entities of one machine moving to its version `hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moves {
    /// The machine.
    pub machine: String,
    /// The version they move to.
    pub hash: String,
    /// Which move where.
    pub moves: Vec<StateMove>,
}

/// A deploy, written in one transaction by `Store::machine_deploy`: each version stored as
/// its machine's current one (deployed after every version stored before it), then each
/// machine's entities moved, then `meta` written. A failure or a crash anywhere leaves
/// none of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deploy {
    /// The versions stored.
    pub versions: Vec<NewVersion>,
    /// The entities moved, by machine.
    pub moves: Vec<Moves>,
    /// A small named value written with them (the engine's marker of the newest deploy).
    pub meta: Option<(String, String)>,
    /// When.
    pub now: Millis,
}

/// Stores a version as its machine's current one: deployed at `now`, or just after the
/// newest version of the machine stored so far if that is later (a clock set back never
/// makes an older version current again). A version stored before is deployed again.
pub(crate) const INSERT_VERSION: &str = "INSERT INTO machines (name, hash, definition, origin, created_at)
     VALUES ($1, $2, $3, $4,
             (SELECT CASE WHEN MAX(created_at) >= $5 THEN MAX(created_at) + 1 ELSE $5 END
              FROM machines WHERE name = $1))
     ON CONFLICT (name, hash) DO UPDATE SET created_at = excluded.created_at, origin = excluded.origin";

/// Every stored version, by machine, oldest first.
pub(crate) const LIST: &str =
    "SELECT name, hash, definition, created_at, origin FROM machines ORDER BY name, created_at";

/// Every stored version with how many entities run under it.
pub(crate) const VERSIONS: &str = "SELECT m.name, m.hash, m.definition, m.created_at, m.origin,
        (SELECT COUNT(*) FROM entities e WHERE e.machine = m.name AND e.machine_hash = m.hash)
     FROM machines m ORDER BY m.name, m.created_at";

/// Writes a small named value.
pub(crate) const META_PUT: &str =
    "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value";

/// A stored version, from [`LIST`] or [`VERSIONS`].
pub(crate) fn decode<C: crate::decode::Columns>(r: &C) -> Result<MachineRecord, C::Error> {
    Ok(MachineRecord {
        name: r.with_text(0, |t| MachineName::new(t))?,
        hash: r.text(1)?,
        definition: r.text(2)?,
        created_at: r.int(3)?,
        origin: r.text(4)?,
    })
}

/// A statement of this module as SQLite reads it.
pub(crate) fn sqlite(sql: &str) -> String {
    crate::bulk::sqlite(sql)
}
