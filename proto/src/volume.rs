//! The layout custody leaves on a restored volume: what the mover writes beside the data and
//! the agent reads back, and what a manifest never lists.

use serde::{Deserialize, Serialize};

/// custody's directory at the root of a restored volume.
pub const CUSTODY_DIR: &str = ".custody";
/// The manifest the mover leaves on a restored volume.
pub const MANIFEST_PATH: &str = ".custody/manifest.jsonl";
/// Which Restore wrote the volume, from which Backup.
pub const IDENTITY_PATH: &str = ".custody/restore.json";
/// Entries at the root of a volume that a manifest never lists and verification skips:
/// the filesystem's own `lost+found`, and custody's directory.
pub const IGNORED_AT_ROOT: &[&str] = &["lost+found", CUSTODY_DIR];

/// The identity a mover writes next to the manifest ([`IDENTITY_PATH`], JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreIdentity {
    pub restore_uid: String,
    pub backup_uid: String,
}
