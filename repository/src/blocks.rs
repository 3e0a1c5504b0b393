//! Reading blocks straight from their packs: the index's location, one ranged read (for a
//! block and those near it that are asked for next), opened with the master key. rustic_core's
//! way to read a data block (`get_blob_cached`) keeps every block it reads in a cache of up to
//! 32 MiB for the rest of the run; a backup reads its parent's manifest once and needs none of
//! it kept. Trees are read the same way (rustic_core's `get_tree` keeps nothing either; one way
//! to read blocks here).

use bytes::Bytes;
use rustic_core::jiff::Timestamp;
use rustic_core::repofile::{Metadata, Node, NodeType, Tree};
use rustic_core::{
    DataId, FileType, Id, IndexedFullStatus, PackedId, ReadBackend, Repository, TreeId,
};

use crate::crypto::Cipher;

/// Reads blocks of `repository` through `backend`, opening them with `cipher`.
#[derive(Clone, Copy)]
pub struct BlockReader<'a> {
    pub repository: &'a Repository<IndexedFullStatus>,
    pub backend: &'a dyn ReadBackend,
    pub cipher: &'a Cipher,
}

impl BlockReader<'_> {
    /// A tree, read alone.
    pub fn tree(&self, id: &TreeId) -> Result<Tree, String> {
        self.tree_reading_ahead(id, &[], &mut ReadAhead::default())
    }

    /// A tree, read with the trees that `next` names (those to be asked for next, the soonest
    /// first) where they lie near it in the same pack ([`BlockReader::block_reading_ahead`]).
    pub fn tree_reading_ahead(
        &self,
        id: &TreeId,
        next: &[TreeId],
        ahead: &mut ReadAhead,
    ) -> Result<Tree, String> {
        let json = self.block_reading_ahead(id, next, ahead)?;
        parse_tree(&json).map_err(|error| format!("tree {id}: {error}"))
    }

    /// A block's plaintext, read with the blocks that `next` names (those to be asked for next,
    /// the soonest first) where they lie near it in the same pack: one ranged read of at most
    /// [`SPAN_BYTES`] instead of one each (a backup reads its parent's trees in the order they
    /// were stored, one directory's subdirectories side by side, and its manifest's blocks one
    /// after another). Those read ahead wait, sealed, in `ahead` until asked for.
    pub fn block_reading_ahead<T>(
        &self,
        id: &T,
        next: &[T],
        ahead: &mut ReadAhead,
    ) -> Result<Bytes, String>
    where
        T: PackedId + std::ops::Deref<Target = Id>,
    {
        if let Some(sealed) = ahead.0.remove(&**id) {
            return self.open(id, sealed);
        }
        let entry = self
            .repository
            .get_index_entry(id)
            .map_err(|error| error.display_log())?;
        let location = &entry.location;
        let first = Sealed::at(
            location.offset,
            location.length,
            location.uncompressed_length,
        );
        let (mut start, mut end) = (first.offset, first.offset + first.length);
        let mut with: Vec<(Id, Sealed)> = Vec::new();
        for other in next.iter().take(READ_AHEAD_BLOCKS) {
            if ahead.0.contains_key(&**other) || **other == **id {
                continue;
            }
            let Ok(near) = self.repository.get_index_entry(other) else {
                continue;
            };
            let location = near.location;
            let (from, to) = (
                start.min(location.offset),
                end.max(location.offset + location.length),
            );
            if near.pack != entry.pack || to - from > SPAN_BYTES {
                continue;
            }
            (start, end) = (from, to);
            with.push((
                **other,
                Sealed::at(
                    location.offset,
                    location.length,
                    location.uncompressed_length,
                ),
            ));
        }
        let span = self
            .backend
            .read_partial(FileType::Pack, &entry.pack, false, start, end - start)
            .map_err(|error| error.display_log())?;
        let cut = |sealed: Sealed| {
            let from = (sealed.offset - start) as usize;
            Sealed {
                bytes: span.slice(from..from + sealed.length as usize),
                ..sealed
            }
        };
        for (other, sealed) in with {
            ahead.0.insert(other, cut(sealed));
        }
        self.open(id, cut(first))
    }

    fn open(&self, id: &Id, sealed: Sealed) -> Result<Bytes, String> {
        // A context per block, as zstd's one-shot decompression makes: a backup reads only its
        // parent's trees and manifest blocks this way (tens to hundreds of blocks).
        let mut decompressor =
            zstd::bulk::Decompressor::new().map_err(|error| format!("starting zstd: {error}"))?;
        self.cipher
            .open_block(
                // Opened in place: a block read alone is not copied, a slice of a read shared
                // with other blocks is.
                sealed.bytes.into(),
                sealed.uncompressed_length,
                &mut decompressor,
                &mut bytes::BytesMut::new(),
            )
            .map_err(|error| format!("block {id}: {error}"))
    }
}

/// The most one read of blocks ahead spans ([`BlockReader::block_reading_ahead`]).
pub const SPAN_BYTES: u32 = 2 << 20;
/// Blocks to come considered for one read ahead, at most.
pub const READ_AHEAD_BLOCKS: usize = 256;

/// Blocks read ahead, still sealed, until asked for.
#[derive(Default)]
pub struct ReadAhead(std::collections::HashMap<Id, Sealed>);

/// A block as its pack holds it, and where.
struct Sealed {
    offset: u32,
    length: u32,
    uncompressed_length: Option<std::num::NonZeroU32>,
    bytes: Bytes,
}

impl Sealed {
    /// The block at `offset`, not read yet.
    fn at(offset: u32, length: u32, uncompressed_length: Option<std::num::NonZeroU32>) -> Sealed {
        Sealed {
            offset,
            length,
            uncompressed_length,
            bytes: Bytes::new(),
        }
    }
}

/// A tree's JSON as rustic_core reads it. A tree of files and directories with only the fields
/// custody writes (every tree custody stores) is read without rustic_core's `Node`, whose
/// flattened fields make serde buffer each node before reading it again (reading the parent's
/// trees was about a fifth of an unchanged backup's CPU); any other tree (a symlink, a device,
/// user names, extended attributes, a field unknown here) is read by rustic_core's own.
pub fn parse_tree(json: &[u8]) -> Result<Tree, serde_json::Error> {
    match serde_json::from_slice::<LeanTree>(json) {
        Ok(tree) => Ok(Tree {
            nodes: tree.nodes.into_iter().map(LeanNode::into_node).collect(),
        }),
        Err(_) => serde_json::from_slice(json),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LeanTree {
    nodes: Vec<LeanNode>,
}

/// A node of a file or a directory, field for field as rustic_core's `Node` reads it (an
/// absent number is 0, an absent or null option `None`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LeanNode {
    name: String,
    #[serde(rename = "type")]
    node_type: LeanType,
    mode: Option<u32>,
    mtime: Option<Timestamp>,
    atime: Option<Timestamp>,
    ctime: Option<Timestamp>,
    uid: Option<u32>,
    gid: Option<u32>,
    #[serde(default)]
    inode: u64,
    #[serde(default)]
    device_id: u64,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    links: u64,
    #[serde(default)]
    content: Option<Vec<DataId>>,
    #[serde(default)]
    subtree: Option<TreeId>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum LeanType {
    File,
    Dir,
}

impl LeanNode {
    fn into_node(self) -> Node {
        Node {
            name: self.name,
            node_type: match self.node_type {
                LeanType::File => NodeType::File,
                LeanType::Dir => NodeType::Dir,
            },
            meta: Metadata {
                mode: self.mode,
                mtime: self.mtime,
                atime: self.atime,
                ctime: self.ctime,
                uid: self.uid,
                gid: self.gid,
                user: None,
                group: None,
                inode: self.inode,
                device_id: self.device_id,
                size: self.size,
                links: self.links,
                extended_attributes: Vec::new(),
            },
            content: self.content,
            subtree: self.subtree,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, node_type: NodeType) -> Node {
        let mut node = Node::new_node(
            std::ffi::OsStr::new(name),
            node_type,
            Metadata {
                mode: Some(0o644),
                mtime: Some(Timestamp::new(1_700_000_000, 123_456_789).unwrap()),
                ctime: Some(Timestamp::new(1_700_000_001, 5).unwrap()),
                uid: Some(999),
                gid: Some(998),
                inode: 42,
                device_id: 7,
                size: 1234,
                links: 1,
                ..Metadata::default()
            },
        );
        node.content = Some(vec![DataId::from(rustic_core::Id::new([3; 32]))]);
        node
    }

    /// Whether the lean reader reads `json` itself (not through rustic_core's).
    fn read_lean(json: &[u8]) -> bool {
        serde_json::from_slice::<LeanTree>(json).is_ok()
    }

    #[test]
    fn trees_read_as_rustic_core_reads_them() {
        let mut directory = node("dir", NodeType::Dir);
        directory.content = None;
        directory.subtree = Some(TreeId::from(rustic_core::Id::new([9; 32])));
        let mut empty = node("empty", NodeType::File);
        empty.content = Some(Vec::new());
        empty.meta.size = 0;
        let mut bare = node("bare", NodeType::File);
        bare.meta = Metadata::default();
        bare.content = None;
        let mut named = node("named", NodeType::File);
        named.meta.user = Some("postgres".into());
        let mut escaped = node("tab\there \"quoted\" é", NodeType::File);
        escaped.meta.atime = escaped.meta.mtime;
        let cases: Vec<(&str, Vec<Node>, bool)> = vec![
            (
                "files and a directory",
                vec![node("a", NodeType::File), directory],
                true,
            ),
            ("an empty file", vec![empty], true),
            ("no metadata at all", vec![bare], true),
            ("a name to escape, an atime", vec![escaped], true),
            ("an empty tree", vec![], true),
            (
                "a symlink",
                vec![node("link", NodeType::from_link(std::path::Path::new("a")))],
                false,
            ),
            ("a user name", vec![named], false),
            (
                "a device",
                vec![node("sda", NodeType::Dev { device: 2049 })],
                false,
            ),
        ];
        for (what, nodes, lean) in cases {
            let json = serde_json::to_vec(&Tree { nodes }).unwrap();
            let rustic: Tree = serde_json::from_slice(&json).unwrap();
            assert_eq!(parse_tree(&json).unwrap().nodes, rustic.nodes, "{what}");
            assert_eq!(read_lean(&json), lean, "{what}");
        }
        // restic's own spelling: an explicit null content, absent numbers, a field unknown here.
        for (json, lean) in [
            (
                r#"{"nodes":[{"name":"d","type":"dir","mode":2147484141,"mtime":"2024-01-02T03:04:05.5+01:00","content":null,"subtree":"0909090909090909090909090909090909090909090909090909090909090909"}]}"#,
                true,
            ),
            (
                r#"{"nodes":[{"name":"f","type":"file","size":3,"content":["0303030303030303030303030303030303030303030303030303030303030303"],"generic_attributes":{}}]}"#,
                false,
            ),
        ] {
            let rustic: Tree = serde_json::from_str(json).unwrap();
            assert_eq!(
                parse_tree(json.as_bytes()).unwrap().nodes,
                rustic.nodes,
                "{json}"
            );
            assert_eq!(read_lean(json.as_bytes()), lean, "{json}");
        }
        // What neither reads is refused.
        assert!(parse_tree(br#"{"nodes":[{"type":"file"}]}"#).is_err());
        assert!(parse_tree(b"{").is_err());
    }
}
