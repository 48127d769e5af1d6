//! Machine definitions as stored: one [`MachineRecord`] per name and content hash.

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
}

/// Entities moving to a definition version (`Store::machine_move`): those no engine holds,
/// in state `from` under version `version` (its hash; `""`: none recorded), land in `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMove {
    /// The version they leave.
    pub version: String,
    /// The state they are in.
    pub from: String,
    /// The state they land in (`from` when it stays).
    pub to: String,
}
