//! Index files as repository format 2 stores them, written by a backup and by a prune.

use bytes::Bytes;
use rustic_core::{FileType, Id, WriteBackend};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::crypto::Cipher;

/// Writes an index file (restic's JSON): compressed as repository format 2 stores its files (a
/// version byte 2, then zstd), sealed; its ID is the SHA-256 of what is stored.
pub fn save_index(
    backend: &dyn WriteBackend,
    cipher: &Cipher,
    index: &impl Serialize,
    compression_level: i32,
) -> Result<Id, String> {
    let json = serde_json::to_vec(index).map_err(|error| format!("an index file: {error}"))?;
    let mut plain = vec![2u8];
    plain.extend(
        zstd::bulk::compress(&json, compression_level)
            .map_err(|error| format!("compressing an index file: {error}"))?,
    );
    let sealed = cipher
        .seal(&plain)
        .map_err(|error| format!("sealing an index file: {error}"))?;
    let id = Id::new(Sha256::digest(&sealed).into());
    backend
        .write_bytes(FileType::Index, &id, true, Bytes::from(sealed).into())
        .map_err(|error| error.display_log())?;
    Ok(id)
}
