//! Reading single blocks straight from their packs: the index's location, one ranged read,
//! opened with the master key. rustic_core's way to read a data block (`get_blob_cached`)
//! keeps every block it reads in a cache of up to 32 MiB for the rest of the run; a backup
//! reads its parent's manifest once and needs none of it kept. Trees are read the same way
//! (rustic_core's `get_tree` keeps nothing either; one way to read blocks here).

use bytes::Bytes;
use rustic_core::repofile::Tree;
use rustic_core::{FileType, IndexedFullStatus, PackedId, ReadBackend, Repository, TreeId};

use crate::crypto::Cipher;

/// Reads blocks of `repository` through `backend`, opening them with `cipher`.
#[derive(Clone, Copy)]
pub struct BlockReader<'a> {
    pub repository: &'a Repository<IndexedFullStatus>,
    pub backend: &'a dyn ReadBackend,
    pub cipher: &'a Cipher,
}

impl BlockReader<'_> {
    /// A block's plaintext (data or tree, by the ID's type).
    pub fn block<T: PackedId>(&self, id: &T) -> Result<Bytes, String> {
        let entry = self
            .repository
            .get_index_entry(id)
            .map_err(|error| error.display_log())?;
        let sealed = self
            .backend
            .read_partial(
                FileType::Pack,
                &entry.pack,
                false,
                entry.location.offset,
                entry.location.length,
            )
            .map_err(|error| error.display_log())?;
        // A context per block, as zstd's one-shot decompression makes: few blocks are read.
        let mut decompressor =
            zstd::bulk::Decompressor::new().map_err(|error| format!("starting zstd: {error}"))?;
        self.cipher
            .open_block(
                sealed.into(),
                entry.location.uncompressed_length,
                &mut decompressor,
                &mut bytes::BytesMut::new(),
            )
            .map_err(|error| format!("a block of pack {}: {error}", entry.pack))
    }

    /// A tree.
    pub fn tree(&self, id: &TreeId) -> Result<Tree, String> {
        let json = self.block(id)?;
        serde_json::from_slice(&json).map_err(|error| format!("tree {id}: {error}"))
    }
}
