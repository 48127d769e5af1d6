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
    /// When this version was first stored.
    pub created_at: Millis,
}
