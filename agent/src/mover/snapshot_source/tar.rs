//! A volume read from a tar stream as a tool writes it (`pg_basebackup -F tar -D -`): each
//! file is chunked, hashed and handed to the writer as it arrives, so no copy of the database
//! waits on the node's disk. A stream comes in the tool's order, not the manifest's: the
//! entries' facts (and their files' blocks) are kept until the stream ends, then the
//! manifest and the trees are written in canonical order.
//!
//! What the stream does not list is made: the directories above its entries (`dataPath`, and
//! any it skipped) as `0700`, owned as its first entry in path order (PostgreSQL starts only on a `PGDATA`
//! of `0700` or `0750`). Hard links, devices and FIFOs in the stream, paths that climb out of
//! it and a path listed twice fail the backup, as they would on a volume.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use custody_proto::manifest::{Entry, Header, Kind, ManifestWriter};
use custody_proto::volume::IGNORED_AT_ROOT;
use rustic_core::DataId;
use rustic_core::repofile::{Metadata as NodeMetadata, Node, NodeType};

use super::budget::{Budget, Claim};
use super::{
    Archiver, BuildError, CHUNKED_BYTES, Manifest, Pending, ReadVolume, go_mode, read_chunks,
    stopped, store_data, store_tree, timestamp,
};
use crate::manifest_builder::BuildError as Error;

/// One entry of the stream, as the manifest and the snapshot's tree record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    /// Which of the stream's files (its blocks), for a file.
    pub file: Option<usize>,
}

/// Where an entry named `name` in the stream lies in the volume: beneath `data_path`, without
/// `./` or a trailing `/`. `Ok(None)`: the stream's own root (`./`). A path climbing out of
/// the stream, or absolute, is refused.
pub(crate) fn volume_path(name: &str, data_path: &str) -> Result<Option<String>, Error> {
    let refused = || Error::Unsupported {
        path: name.to_string(),
        kind: "stream entry whose path is absolute or climbs out of it (..)",
    };
    if name.starts_with('/') {
        return Err(refused());
    }
    let mut components = Vec::new();
    for component in name.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err(refused()),
            other => components.push(other),
        }
    }
    if components.is_empty() {
        return Ok(None);
    }
    let prefix = data_path.trim_matches('/');
    let path = components.join("/");
    Ok(Some(if prefix.is_empty() {
        path
    } else {
        format!("{prefix}/{path}")
    }))
}

/// The entries in canonical order (pre-order, each directory's children by name bytes), with
/// every directory above an entry that the stream did not list made as `0700`, owned like
/// `owner`. The stream's own root, when it listed one, is `root` (it then stands for
/// `data_path`'s directory).
pub(crate) fn canonical(
    mut records: BTreeMap<String, Record>,
    data_path: &str,
    root: Option<Record>,
    owner: (u32, u32),
) -> Result<Vec<(String, Record)>, Error> {
    let made = |mtime| Record {
        kind: Kind::Dir,
        mode: 0o700,
        uid: owner.0,
        gid: owner.1,
        mtime,
        file: None,
    };
    let prefix = data_path.trim_matches('/');
    if let (false, Some(root)) = (prefix.is_empty(), root) {
        records.insert(
            prefix.to_string(),
            Record {
                kind: Kind::Dir,
                ..root
            },
        );
    }
    let mut missing = Vec::new();
    for (path, _) in records.iter() {
        let mut parent = path.as_str();
        while let Some((above, _)) = parent.rsplit_once('/') {
            match records.get(above) {
                Some(record) if record.kind != Kind::Dir => {
                    return Err(Error::Unsupported {
                        path: path.clone(),
                        kind: "stream entry beneath something that is not a directory",
                    });
                }
                Some(_) => break,
                None => missing.push(above.to_string()),
            }
            parent = above;
        }
    }
    for path in missing {
        records.entry(path).or_insert_with(|| made(0));
    }
    let mut sorted: Vec<(String, Record)> = records.into_iter().collect();
    sorted.sort_by(|(a, _), (b, _)| a.split('/').cmp(b.split('/')));
    Ok(sorted)
}

/// Whether `path` lies inside the directory `dir` (`""`: the root).
fn inside(path: &str, dir: &str) -> bool {
    dir.is_empty()
        || (path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/')
}

/// The stream as the tar reader takes it, counting what it read and keeping its last block:
/// whether it ended as a tar archive ends (a block of zeros), not merely at the end of an
/// entry where a tool that broke off may have left it.
pub(crate) struct Tracked<'r> {
    inner: &'r mut dyn Read,
    pub read: u64,
    last_block: Vec<u8>,
}

impl<'r> Tracked<'r> {
    pub fn new(inner: &'r mut dyn Read) -> Tracked<'r> {
        Tracked {
            inner,
            read: 0,
            last_block: Vec::with_capacity(BLOCK),
        }
    }

    /// Whether the stream ended as a tar archive ends: the block right after the last entry
    /// (which ended at `entries_end`) was the end-of-archive block of zeros, and the reader
    /// stopped there. A stream cut at an entry's end, even after data that ends in zeros,
    /// did not.
    pub fn ended_as_an_archive(&self, entries_end: u64) -> bool {
        self.read == entries_end + BLOCK as u64
            && self.last_block.len() == BLOCK
            && self.last_block.iter().all(|byte| *byte == 0)
    }
}

const BLOCK: usize = 512;

impl Read for Tracked<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.read += read as u64;
        let fresh = &buffer[..read];
        if fresh.len() >= BLOCK {
            self.last_block.clear();
            self.last_block
                .extend_from_slice(&fresh[fresh.len() - BLOCK..]);
        } else {
            self.last_block.extend_from_slice(fresh);
            let extra = self.last_block.len().saturating_sub(BLOCK);
            self.last_block.drain(..extra);
        }
        Ok(read)
    }
}

/// After the archive's end: the rest of the stream (a tool pads to its record size), read to
/// its end so the tool is not cut off while it finishes; anything but zeros is refused.
fn drain(stream: &mut dyn Read) -> Result<(), Error> {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let read = match stream.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(stream_error("the stream", error)),
        };
        if buffer[..read].iter().any(|byte| *byte != 0) {
            return Err(stream_error(
                "the stream",
                io::Error::other("data after the end of the tar archive"),
            ));
        }
    }
}

/// Whether a path of the volume is one its root keeps for itself (`lost+found`, custody's
/// `.custody`), or lies beneath one: never taken from a stream.
pub(crate) fn ignored_at_root(path: &str) -> bool {
    IGNORED_AT_ROOT.contains(&path.split('/').next().unwrap_or_default())
}

/// An entry's owner, group and time from its pax records, which take precedence over its
/// header's (a tool writes them where the header's fields are too small).
#[derive(Default)]
struct PaxNumbers {
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<u64>,
}

fn pax_numbers<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<PaxNumbers> {
    let mut numbers = PaxNumbers::default();
    let Some(extensions) = entry.pax_extensions()? else {
        return Ok(numbers);
    };
    for extension in extensions {
        let extension = extension?;
        let (Ok(key), Ok(value)) = (extension.key(), extension.value()) else {
            continue;
        };
        // A time may have a fraction: its seconds.
        let whole = |value: &str| -> io::Result<u64> {
            value
                .split('.')
                .next()
                .unwrap_or_default()
                .parse()
                .map_err(|_| io::Error::other(format!("pax record {key}={value} is not a number")))
        };
        match key {
            "uid" => numbers.uid = Some(whole(value)?),
            "gid" => numbers.gid = Some(whole(value)?),
            "mtime" => numbers.mtime = Some(whole(value)?),
            _ => {}
        }
    }
    Ok(numbers)
}

fn stream_error(path: &str, source: io::Error) -> Error {
    Error::Archive {
        path: path.to_string(),
        source,
    }
}

fn node(name: &str, record: &Record, target: Option<&str>) -> Node {
    let (node_type, type_bits) = match (&record.kind, target) {
        (Kind::Dir, _) => (NodeType::Dir, 0o040_000),
        (Kind::Symlink { .. }, Some(target)) => {
            (NodeType::from_link(std::path::Path::new(target)), 0o120_000)
        }
        _ => (NodeType::File, 0o100_000),
    };
    let size = match record.kind {
        Kind::File { size, .. } => size,
        _ => 0,
    };
    Node::new_node(
        std::ffi::OsStr::new(name),
        node_type,
        NodeMetadata {
            mode: Some(go_mode(type_bits | record.mode)),
            mtime: timestamp(record.mtime, 0),
            uid: Some(record.uid),
            gid: Some(record.gid),
            size,
            links: 1,
            ..NodeMetadata::default()
        },
    )
}

impl Archiver<'_> {
    /// Reads the volume `name` from `stream` (a tar stream), its entries beneath `data_path`:
    /// its tree (the node `data/<name>`) and its manifest. The stream is parsed, chunked and
    /// hashed on this thread while another stores the blocks.
    pub fn tar_volume(
        &mut self,
        name: &str,
        stream: &mut dyn Read,
        data_path: &str,
        header: &Header,
    ) -> Result<ReadVolume, BuildError> {
        let mut writer = self
            .writer
            .take()
            .expect("the writer is here between volumes");
        let repository = self.blocks.repository;
        // Chunks read and not yet let go by the writer are bounded in bytes by `budget`. Handed
        // over, never queued: a store stage that stopped (its error ends the parse) must leave no
        // chunk's claim behind for the parse to wait on.
        let (chunks, to_store) = crossbeam_channel::bounded::<(usize, Bytes, Claim)>(0);
        let budget = Budget::new(CHUNKED_BYTES);
        let (parsed, stored) = std::thread::scope(|scope| {
            let store = std::thread::Builder::new()
                .name("trees".into())
                .spawn_scoped(scope, move || {
                    let mut contents: Vec<Vec<DataId>> = Vec::new();
                    let stored = (|| {
                        for (file, chunk, claim) in to_store {
                            if contents.len() <= file {
                                contents.resize_with(file + 1, Vec::new);
                            }
                            let length = chunk.len() as u64;
                            let id = store_data(repository, &mut writer, chunk, Some(claim))?;
                            contents[file].push(id);
                            super::super::progress::bytes(length);
                        }
                        Ok::<_, BuildError>(())
                    })();
                    (stored.map(|()| contents), writer)
                })
                .expect("a thread starts");
            let parsed = self.parse(stream, data_path, header, (&chunks, &budget));
            drop(chunks);
            let (stored, writer) = store.join().expect("the store stage does not panic");
            self.writer = Some(writer);
            (parsed, stored)
        });
        // A failed store stage stops the parse (its queue closes): its error is the cause.
        let mut contents = stored?;
        let (records, root) = parsed?;
        let owner = records
            .values()
            .next()
            .map_or((0, 0), |record| (record.uid, record.gid));
        let sorted = canonical(records, data_path, root, owner)?;

        let out = io::BufWriter::with_capacity(
            256 << 10,
            tempfile::tempfile().map_err(BuildError::Write)?,
        );
        let mut manifest = Manifest {
            writer: ManifestWriter::new(out, header).map_err(BuildError::Write)?,
            pending: std::collections::VecDeque::new(),
        };
        let writer = self.writer.as_mut().expect("the writer is back");
        let root_node = Node::new_node(
            std::ffi::OsStr::new(name),
            NodeType::Dir,
            NodeMetadata {
                mode: Some(go_mode(0o040_755)),
                mtime: Some(rustic_core::jiff::Timestamp::now()),
                ..NodeMetadata::default()
            },
        );
        let mut stack: Vec<(String, Node, Vec<Node>)> =
            vec![(String::new(), root_node, Vec::new())];
        let close = |stack: &mut Vec<(String, Node, Vec<Node>)>,
                     writer: &mut custody_repository::writer::Writer|
         -> Result<(), BuildError> {
            let (_, mut node, nodes) = stack.pop().expect("a directory to close");
            node.subtree = Some(store_tree(repository, writer, nodes)?);
            stack.last_mut().expect("its parent is open").2.push(node);
            Ok(())
        };
        for (path, record) in sorted {
            while stack.len() > 1 && !inside(&path, &stack.last().expect("open").0) {
                close(&mut stack, writer)?;
            }
            let leaf = path.rsplit('/').next().unwrap_or(&path).to_string();
            let target = match &record.kind {
                Kind::Symlink { target } => Some(target.clone()),
                _ => None,
            };
            let mut entry_node = node(&leaf, &record, target.as_deref());
            manifest.push(Pending {
                entry: Entry {
                    path: path.clone(),
                    kind: record.kind.clone(),
                    mode: record.mode,
                    uid: record.uid,
                    gid: record.gid,
                },
                hash: None,
            })?;
            match (&record.kind, record.file) {
                (Kind::Dir, _) => stack.push((path, entry_node, Vec::new())),
                (_, Some(file)) => {
                    entry_node.content = Some(
                        contents
                            .get_mut(file)
                            .map(std::mem::take)
                            .unwrap_or_default(),
                    );
                    super::super::progress::file();
                    stack.last_mut().expect("open").2.push(entry_node);
                }
                _ => stack.last_mut().expect("open").2.push(entry_node),
            }
        }
        while stack.len() > 1 {
            close(&mut stack, writer)?;
        }
        let (_, mut node, nodes) = stack.pop().expect("the root is open");
        node.subtree = Some(store_tree(repository, writer, nodes)?);
        let (manifest, summary) = manifest.finish()?;
        Ok(ReadVolume {
            node,
            manifest,
            summary,
        })
    }

    /// The parse stage: every entry's facts by its path in the volume, and the stream's own
    /// root's; each file's chunks sent to the store stage as they are read.
    #[allow(clippy::type_complexity)]
    fn parse(
        &mut self,
        stream: &mut dyn Read,
        data_path: &str,
        header: &Header,
        (chunks, budget): (
            &crossbeam_channel::Sender<(usize, Bytes, Claim)>,
            &Arc<Budget>,
        ),
    ) -> Result<(BTreeMap<String, Record>, Option<Record>), BuildError> {
        let mut records = BTreeMap::new();
        let mut root = None;
        let mut files = 0usize;
        let mut entries_end = 0u64;
        let mut tracked = Tracked::new(stream);
        let mut archive = tar::Archive::new(&mut tracked);
        let entries = archive
            .entries()
            .map_err(|error| stream_error("the stream", error))?;
        for entry in entries {
            if self.stop.load(Ordering::Relaxed) {
                return Err(stopped());
            }
            let mut entry = entry.map_err(|error| stream_error("the stream", error))?;
            entries_end =
                entry.raw_file_position() + entry.size().div_ceil(BLOCK as u64) * BLOCK as u64;
            let entry_type = entry.header().entry_type();
            if matches!(
                entry_type,
                tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
            ) {
                continue;
            }
            let raw = entry.path_bytes();
            let name = std::str::from_utf8(&raw)
                .map_err(|_| Error::Unsupported {
                    path: String::from_utf8_lossy(&raw).into_owned(),
                    kind: "stream entry whose path is not UTF-8",
                })?
                .to_string();
            let path = volume_path(&name, data_path)?;
            let pax = pax_numbers(&mut entry).map_err(|error| stream_error(&name, error))?;
            let head = entry.header();
            let facts = |kind: Kind, file: Option<usize>| -> Result<Record, BuildError> {
                let number = |pax: Option<u64>, value: io::Result<u64>, what: &str| {
                    let value = match pax {
                        Some(value) => value,
                        None => value.map_err(|error| stream_error(&name, error))?,
                    };
                    u32::try_from(value).map_err(|_| {
                        stream_error(
                            &name,
                            io::Error::other(format!("its {what} {value} is past 32 bits")),
                        )
                    })
                };
                let mtime = match pax.mtime {
                    Some(mtime) => mtime,
                    None => head.mtime().map_err(|error| stream_error(&name, error))?,
                };
                Ok(Record {
                    kind,
                    mode: head.mode().map_err(|error| stream_error(&name, error))? & 0o7777,
                    uid: number(pax.uid, head.uid(), "owner")?,
                    gid: number(pax.gid, head.gid(), "group")?,
                    mtime: i64::try_from(mtime).unwrap_or(i64::MAX),
                    file,
                })
            };
            let Some(path) = path else {
                if entry_type == tar::EntryType::Directory && root.is_none() {
                    root = Some(facts(Kind::Dir, None)?);
                    continue;
                }
                return Err(Error::Unsupported {
                    path: name,
                    kind: "stream entry at the stream's root that is not its one directory",
                });
            };
            if ignored_at_root(&path) {
                eprintln!(
                    "custody-mover: {path} in the stream is not backed up (a volume's root keeps its own {})",
                    path.split('/').next().unwrap_or_default()
                );
                continue;
            }
            let record = match entry_type {
                tar::EntryType::Directory => facts(Kind::Dir, None)?,
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .map(|target| String::from_utf8(target.into_owned()))
                        .transpose()
                        .map_err(|_| Error::NonUtf8Target { path: path.clone() })?
                        .unwrap_or_default();
                    if !custody_proto::manifest::symlink_allowed(&path, &target, header) {
                        return Err(Error::SymlinkLeavesVolume { path, target });
                    }
                    facts(Kind::Symlink { target }, None)?
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let size = entry.size();
                    let record = facts(
                        Kind::File {
                            size,
                            blake3: String::new(),
                        },
                        Some(files),
                    )?;
                    let file = files;
                    files += 1;
                    self.counts.files_read += 1;
                    let hash = read_chunks(
                        &self.chunker,
                        self.stop,
                        &path,
                        &mut entry,
                        size,
                        Some(budget),
                        &mut |chunk, claim| {
                            chunks
                                .send((file, chunk, claim))
                                .map_err(|_| Error::Archive {
                                    path: path.clone(),
                                    source: io::Error::other("the store stage stopped"),
                                })
                        },
                    )?;
                    Record {
                        kind: Kind::File {
                            size,
                            blake3: hash.to_hex().to_string(),
                        },
                        ..record
                    }
                }
                tar::EntryType::Link => {
                    return Err(Error::Unsupported {
                        path,
                        kind: "hard link in a stream",
                    });
                }
                _ => {
                    return Err(Error::Unsupported {
                        path,
                        kind: "special file",
                    });
                }
            };
            if records.insert(path.clone(), record).is_some() {
                return Err(Error::Unsupported {
                    path,
                    kind: "path listed twice in the stream",
                });
            }
        }
        if tracked.read == 0 {
            return Err(Error::ToolFailed(
                "the tool wrote nothing to its standard output: a stream tool writes its backup there as a tar archive (pg_basebackup -F tar -D -)".into(),
            ));
        }
        if !tracked.ended_as_an_archive(entries_end) {
            return Err(stream_error(
                "the stream",
                io::Error::other(format!(
                    "it ended after {} bytes without the end of a tar archive: the tool broke off",
                    tracked.read
                )),
            ));
        }
        drain(&mut tracked)?;
        if records.is_empty() && root.is_none() {
            return Err(Error::ToolFailed(
                "the tool's tar archive held no entry: nothing to back up".into(),
            ));
        }
        Ok((records, root))
    }
}

#[cfg(test)]
mod tests;
