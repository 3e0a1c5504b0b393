//! custody's repository format v2: restic's documented repository format, read and written by
//! rustic_core, in a BackupRepository's bucket.

pub mod backend;
pub mod blocks;
pub mod check;
pub mod chunker;
pub mod crypto;
pub mod listing;
pub mod memory;
pub mod open;
pub mod prune;
pub mod snapshot;
pub mod writer;
