//! Reads volumes into a snapshot: custody's walk (canonical order, never following a
//! symlink, never leaving the volume), each file read once for both its blocks and its
//! manifest entry, the snapshot's trees built as the walk closes each directory.
//!
//! A file the parent snapshot holds unchanged (same size, mtime, ctime and inode, every block
//! still in the repository) is not read: its blocks and its manifest hash are the parent's.
//! Whatever the walk cannot back up (a symlink leading out of the volume, a device, a mount
//! inside the volume, a file that changed while it was read) fails the backup, as a format 1
//! backup does.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use custody_proto::manifest::{
    self, Entry, Header, Kind, ManifestReader, ManifestSummary, ManifestWriter,
};
use custody_proto::volume::IGNORED_AT_ROOT;
use custody_repository::blocks::{BlockReader, READ_AHEAD_BLOCKS, ReadAhead};
use custody_repository::chunker::{Chunker, Scan};
use custody_repository::prune::Referenced;
use custody_repository::writer::{self, BlockId, Writer, WriterStats};
use rustic_core::repofile::{BlobType, Metadata as NodeMetadata, Node, NodeType, Tree};
use rustic_core::{DataId, IndexedFullStatus, Repository, TreeId};
use rustix::fs::{FileType, OFlags, Stat};

use crate::manifest_builder::BuildError;
use crate::tree::{self, Found, Metadata, OnDisk, Walk, WalkError};

mod budget;
mod tar;

use budget::{Budget, Claim};

/// One volume to read into the snapshot.
pub struct VolumeToRead {
    /// The Cluster's volume claim template: `data/<name>` in the snapshot.
    pub name: String,
    /// Where the volume (or the tool's output) is mounted.
    pub root: PathBuf,
    /// The same volume in the parent snapshot: its tree and its manifest.
    pub parent: Option<(TreeId, File)>,
    /// Read from a tool's tar stream instead of `root`.
    pub tar: Option<super::stream::TarInput>,
}

/// A volume read into the snapshot.
pub struct ReadVolume {
    /// Its directory node (`data/<name>`), with its tree.
    pub node: Node,
    pub manifest: File,
    pub summary: ManifestSummary,
}

/// What reading the volumes counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadCounts {
    pub files_read: u64,
    pub files_unchanged: u64,
}

/// Reads volumes and custody's files into the repository through a [`Writer`].
///
/// A volume is read in two stages on two threads: the walk (reading, chunk boundaries,
/// BLAKE3, the manifest, which files are unchanged) and the trees (each chunk's SHA-256, the
/// blocks handed to the writer, the directories' trees), joined by a short queue of
/// [`Event`]s in walk order. Ahead of the walk, one thread lists and `stat`s the entries and
/// another reads the parent's trees (a backup of an unchanged volume is mostly these two);
/// large files are read and chunked on their own thread.
pub struct Archiver<'a> {
    /// The repository, and reads of the parent's trees (as `get_tree` would, with custody's
    /// own reads).
    blocks: BlockReader<'a>,
    writer: Option<Writer>,
    chunker: Chunker,
    stop: &'a AtomicBool,
    pub counts: ReadCounts,
}

/// What the walk hands the tree stage, in walk order.
enum Event {
    /// A directory starts (its node).
    Enter(Node),
    /// The innermost directory ends; with the same directory's tree in the parent snapshot
    /// (its id and nodes), when it was read.
    Leave(Option<ParentTree>),
    /// A symlink, or a file whose content is known (unchanged since the parent).
    Leaf(Node),
    /// A file whose content follows in chunks.
    File(Node),
    Chunk(Bytes),
    /// The file's last chunk was sent.
    FileEnd,
    /// A file read by a chunking thread: its chunks come on their own queue, which ends with
    /// the file (or its failure, which the walk reports).
    ChunkedFile(Node, crossbeam_channel::Receiver<(Bytes, Claim)>),
}

/// Files at least this large are read and chunked on a chunking thread (the rolling
/// fingerprint is the slowest step) while the walk goes on reading the smaller ones.
const CHUNK_THREAD_FILES: u64 = 4 << 20;

/// Whether the walk reads a file of `size` bytes itself (a larger one goes to a chunking
/// thread).
fn read_by_the_walk(size: u64) -> bool {
    size < CHUNK_THREAD_FILES
}
/// Chunking threads. A second thread measured no faster on the benchmark set (two cores) and
/// 4–8 MiB more at the peak.
const CHUNKERS: usize = 1;
/// Bytes of the chunking threads' chunks, from their reading until the writer lets them go
/// ([`budget`]): two chunks of the largest size (8 MiB), one read while one is sealed.
const CHUNKED_BYTES: usize = 16 << 20;
/// Files whose manifest entry waits for their hash, at most.
const PENDING_HASHES: usize = 16;

/// A file for a chunking thread.
struct ChunkJob {
    file: File,
    size: u64,
    path: String,
    chunks: crossbeam_channel::Sender<(Bytes, Claim)>,
    hash: crossbeam_channel::Sender<Result<blake3::Hash, BuildError>>,
}

/// A manifest entry waiting for its file's hash (from a chunking thread).
struct Pending {
    entry: Entry,
    hash: Option<crossbeam_channel::Receiver<Result<blake3::Hash, BuildError>>>,
}

/// The manifest, written in walk order as the entries' hashes arrive.
struct Manifest {
    writer: ManifestWriter<BufWriter<File>>,
    pending: std::collections::VecDeque<Pending>,
}

impl Manifest {
    fn push(&mut self, pending: Pending) -> Result<(), BuildError> {
        self.pending.push_back(pending);
        self.write_ready(self.pending.len() > PENDING_HASHES)
    }

    /// Writes the entries at the head whose hashes are in; with `wait`, waits for the first.
    fn write_ready(&mut self, mut wait: bool) -> Result<(), BuildError> {
        while let Some(head) = self.pending.front_mut() {
            if let Some(receiver) = &head.hash {
                let outcome = if wait {
                    receiver.recv().map_err(|_| ())
                } else {
                    match receiver.try_recv() {
                        Ok(outcome) => Ok(outcome),
                        Err(crossbeam_channel::TryRecvError::Empty) => return Ok(()),
                        Err(crossbeam_channel::TryRecvError::Disconnected) => Err(()),
                    }
                };
                let hash = outcome.map_err(|()| BuildError::Archive {
                    path: head.entry.path.clone(),
                    source: io::Error::other("its chunking thread stopped"),
                })??;
                if let Kind::File { blake3, .. } = &mut head.entry.kind {
                    *blake3 = hash.to_hex().to_string();
                }
            }
            let head = self.pending.pop_front().expect("a head");
            self.writer.push(&head.entry).map_err(BuildError::Write)?;
            wait = false;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(File, ManifestSummary), BuildError> {
        while !self.pending.is_empty() {
            self.write_ready(true)?;
        }
        let (out, summary) = self.writer.finish().map_err(BuildError::Write)?;
        let mut file = out
            .into_inner()
            .map_err(|error| BuildError::Write(error.into_error()))?;
        file.rewind().map_err(BuildError::Write)?;
        Ok((file, summary))
    }
}

/// Batches of events in flight between the two stages. A batch ends with a chunk (at most
/// 8 MiB) or after [`BATCH`] events.
const EVENTS_AHEAD: usize = 4;
const BATCH: usize = 256;

/// The stat thread's entries, in batches of [`BATCH`]; it keeps at most [`FOUND_AHEAD`] ready.
type FoundBatch = Vec<Result<Found, WalkError>>;
const FOUND_AHEAD: usize = 4;

/// The parent snapshot's trees read ahead of the walk, in the order it enters directories
/// (`None`: the tree could not be read).
type ParentTrees = crossbeam_channel::Receiver<(TreeId, Option<Vec<Node>>)>;
/// Parent trees read and not yet taken by the walk, at most.
const PARENT_TREES_AHEAD: usize = 2;

/// What the stages ahead of the walk send it.
struct Ahead {
    entries: crossbeam_channel::Receiver<FoundBatch>,
    parent_trees: ParentTrees,
}

/// The parent-tree stage: reads the trees under `root` in the walk's order (a directory, then
/// its subdirectories by name, each before what is in it). A tree it cannot read is sent as
/// `None`, in its place (what is under it is unknown): the walk then tries it itself (and,
/// failing, reads the directory's files).
///
/// `read` reads a tree; it is also given the trees to be read after it (the soonest first, as
/// many as one read ahead considers: a directory may have very many subdirectories), to read
/// them along with it where it can.
fn read_parent_trees(
    mut read: impl FnMut(&TreeId, &[TreeId]) -> Result<Vec<Node>, String>,
    root: TreeId,
    trees: &crossbeam_channel::Sender<(TreeId, Option<Vec<Node>>)>,
) {
    let mut next = vec![root];
    let mut upcoming = Vec::new();
    while let Some(id) = next.pop() {
        upcoming.clear();
        upcoming.extend(next.iter().rev().take(READ_AHEAD_BLOCKS));
        let Ok(nodes) = read(&id, &upcoming) else {
            if trees.send((id, None)).is_err() {
                return;
            }
            continue;
        };
        let first = next.len();
        next.extend(
            nodes
                .iter()
                .filter(|node| node.is_dir())
                .filter_map(|node| node.subtree),
        );
        next[first..].reverse();
        if trees.send((id, Some(nodes))).is_err() {
            return;
        }
    }
}

/// The stat stage: the volume's entries in canonical order with their `stat`, sent in batches
/// (an error ends them); once all are sent, the volume's regular files and their bytes go to
/// the progress totals ([`super::progress::listed`]). It stops when the walk stops taking
/// them. With `read_ahead` (every file will be read: there is no parent), it asks the kernel
/// to start reading each file the walk itself will read, so that those reads wait on the disk
/// side by side instead of one after another.
fn stat_entries(
    walk: Walk,
    root: &std::os::fd::OwnedFd,
    read_ahead: bool,
    found: &crossbeam_channel::Sender<FoundBatch>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let (mut files, mut bytes) = (0u64, 0u64);
    for entry in walk {
        if let Ok(entry) = &entry {
            if read_ahead {
                start_reading(root, entry);
            }
            if let (OnDisk::File, Some(stat)) = (&entry.kind, &entry.stat)
                && FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
            {
                files += 1;
                bytes += stat.st_size as u64;
            }
        }
        let failed = entry.is_err();
        batch.push(entry);
        if batch.len() == BATCH || failed {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
            if found.send(full).is_err() || failed {
                return;
            }
        }
    }
    if found.send(batch).is_ok() {
        super::progress::listed(files, bytes);
    }
}

/// Reads the volumes' directories and inodes into the kernel's cache on a thread of its own,
/// from before the repository is opened: the walk, which starts once the repository's index
/// and the parent snapshot are read, then finds most of them there. A backup of an unchanged
/// volume is mostly this reading (the benchmark set's 40,024 files: 0.18 s with the cache
/// dropped). It reads nothing else and changes nothing; stopped and joined when dropped.
pub struct InodesAhead {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl InodesAhead {
    /// Starts reading the trees under `roots` (a volume that cannot be opened is passed over:
    /// the walk reports it).
    pub fn start(roots: Vec<PathBuf>) -> InodesAhead {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("inodes-ahead".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    for root in roots {
                        let Ok(walk) =
                            tree::open_root(&root).and_then(|fd| Walk::new(&fd, IGNORED_AT_ROOT))
                        else {
                            continue;
                        };
                        for _ in walk.stat_files() {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                        }
                    }
                }
            })
            .ok();
        InodesAhead { stop, thread }
    }
}

impl Drop for InodesAhead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts the kernel reading a small regular file into its cache (a hint: failing, it does
/// nothing; the walk reads the file as ever).
fn start_reading(root: &std::os::fd::OwnedFd, entry: &Found) {
    let small_file = matches!(entry.kind, OnDisk::File)
        && entry.stat.as_ref().is_some_and(|stat| {
            FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
                && stat.st_size > 0
                && read_by_the_walk(stat.st_size as u64)
        });
    if !small_file {
        return;
    }
    if let Ok(fd) = tree::open_beneath(root, &entry.path, OFlags::RDONLY | OFlags::NONBLOCK) {
        let _ = rustix::fs::fadvise(&fd, 0, None, rustix::fs::Advice::WillNeed);
    }
}

/// The walk's side of the queue to the tree stage: events go in batches.
struct Events<'s> {
    sender: &'s crossbeam_channel::Sender<Vec<Event>>,
    batch: Vec<Event>,
}

impl Events<'_> {
    fn send(&mut self, event: Event) -> Result<(), BuildError> {
        // A chunk (data waits behind it) and a chunked file (its thread waits for the tree
        // stage to take its chunks) go at once.
        let flush = matches!(event, Event::Chunk(_) | Event::ChunkedFile(..));
        self.batch.push(event);
        if flush || self.batch.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), BuildError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.sender.send(batch).map_err(|_| BuildError::Archive {
            path: String::new(),
            source: io::Error::other("the tree stage stopped"),
        })
    }
}

/// A directory the walk is in.
struct Open {
    path: String,
    /// The same directory's tree in the parent snapshot.
    parent: Option<ParentTree>,
}

impl Open {
    /// The parent snapshot's nodes of this directory (none without its tree).
    fn parent_nodes(&self) -> &[Node] {
        self.parent.as_ref().map_or(&[], |(_, nodes)| nodes)
    }
}

/// A directory's tree in the parent snapshot: its id and its nodes.
type ParentTree = (TreeId, Vec<Node>);

fn stopped() -> BuildError {
    BuildError::Read {
        path: String::new(),
        source: io::Error::new(io::ErrorKind::Interrupted, "the backup was stopped"),
    }
}

fn write_error(error: writer::WriteError) -> BuildError {
    BuildError::Archive {
        path: String::new(),
        source: io::Error::other(error.0),
    }
}

/// The walk's `stat` of an entry.
fn walked_stat(found: &tree::Found) -> Result<Stat, BuildError> {
    found.stat.ok_or_else(|| BuildError::Unsupported {
        path: found.path.clone(),
        kind: "entry without metadata",
    })
}

fn read_error(path: &str, source: io::Error) -> BuildError {
    BuildError::Read {
        path: path.to_string(),
        source,
    }
}

impl<'a> Archiver<'a> {
    pub fn new(blocks: BlockReader<'a>, writer: Writer, stop: &'a AtomicBool) -> Archiver<'a> {
        let repository = blocks.repository;
        let config = repository.config();
        let polynomial = config.poly().unwrap_or(0);
        Archiver {
            blocks,
            writer: Some(writer),
            chunker: Chunker::new(
                polynomial,
                config.chunk_min_size(),
                config.chunk_size(),
                config.chunk_max_size(),
            ),
            stop,
            counts: ReadCounts::default(),
        }
    }

    fn writer(&mut self) -> &mut Writer {
        self.writer
            .as_mut()
            .expect("the writer is here between volumes")
    }

    /// Stores a tree of `nodes` (already in name order).
    pub fn tree(&mut self, nodes: Vec<Node>) -> Result<TreeId, BuildError> {
        let repository = self.blocks.repository;
        store_tree(repository, self.writer(), nodes)
    }

    /// A directory node of custody's own (`data`, `manifests`) holding `tree`.
    pub fn directory(name: &str, tree: TreeId) -> Node {
        let mut node = Node::new_node(
            std::ffi::OsStr::new(name),
            NodeType::Dir,
            NodeMetadata {
                mode: Some(go_mode(0o040_755)),
                mtime: Some(rustic_core::jiff::Timestamp::now()),
                ..NodeMetadata::default()
            },
        );
        node.subtree = Some(tree);
        node
    }

    /// A file of custody's own (a manifest) stored as `name`. With `body`, the blocks of what
    /// follows the file's first line, held by the repository's loaded index (the parent's
    /// manifest's, when [`same_after_first_line`]), only the first line is stored.
    pub fn file(
        &mut self,
        name: &str,
        file: &File,
        body: Option<&[DataId]>,
    ) -> Result<Node, BuildError> {
        let mut reader = file.try_clone().map_err(BuildError::Write)?;
        reader.rewind().map_err(BuildError::Write)?;
        let size = reader.metadata().map_err(BuildError::Write)?.len();
        let repository = self.blocks.repository;
        let mut content = Vec::new();
        let chunker = &self.chunker;
        let writer = self
            .writer
            .as_mut()
            .expect("the writer is here between volumes");
        // The first line alone is the first blob, the rest chunked as usual: a manifest's
        // header names its Backup, so it differs every time, and would otherwise change (and
        // upload again) the whole first chunk, up to megabytes of unchanged entries.
        let first_line = first_line(&mut std::io::BufReader::new(&mut reader).take(size))
            .map_err(BuildError::Write)?;
        let rest = size - first_line.len() as u64;
        reader
            .seek(std::io::SeekFrom::Start(first_line.len() as u64))
            .map_err(BuildError::Write)?;
        if !first_line.is_empty() {
            content.push(store_data(
                repository,
                writer,
                Bytes::from(first_line),
                None,
            )?);
        }
        match body {
            Some(body) => {
                writer.reuse(BlobType::Data, body.iter().map(|id| **id));
                content.extend_from_slice(body);
            }
            // Stored as it is read: one chunk at a time.
            None => {
                _ = read_chunks(
                    chunker,
                    self.stop,
                    name,
                    &mut reader,
                    rest,
                    None,
                    &mut |chunk, _| {
                        content.push(store_data(repository, writer, chunk, None)?);
                        Ok(())
                    },
                )?
            }
        }
        let mut node = Node::new_node(
            std::ffi::OsStr::new(name),
            NodeType::File,
            NodeMetadata {
                mode: Some(go_mode(0o100_444)),
                mtime: Some(rustic_core::jiff::Timestamp::now()),
                size,
                ..NodeMetadata::default()
            },
        );
        node.content = Some(content);
        Ok(node)
    }

    /// Reads a volume: its tree (as the node `data/<name>`) and its manifest.
    pub fn volume(
        &mut self,
        volume: VolumeToRead,
        header: &Header,
    ) -> Result<ReadVolume, BuildError> {
        if let Some(input) = &volume.tar {
            let read = input.open(self.stop).and_then(|mut stream| {
                self.tar_volume(&volume.name, &mut stream, &input.data_path, header)
            });
            return input.outcome(read, self.stop);
        }
        let root = tree::open_root(&volume.root)?;
        let root_stat = rustix::fs::fstat(&root)
            .map_err(|errno| read_error(&volume.root.display().to_string(), errno.into()))?;
        let root_node = Node::new_node(
            std::ffi::OsStr::new(&volume.name),
            NodeType::Dir,
            node_metadata(&root_stat),
        );
        let mut writer = self
            .writer
            .take()
            .expect("the writer is here between volumes");
        let repository = self.blocks.repository;
        let (events, received) = crossbeam_channel::bounded::<Vec<Event>>(EVENTS_AHEAD);
        let (jobs, to_chunk) = crossbeam_channel::bounded::<ChunkJob>(0);
        let (found, to_walk) = crossbeam_channel::bounded::<FoundBatch>(FOUND_AHEAD);
        let entries = Walk::new(&root, IGNORED_AT_ROOT)?.stat_files();
        let (read_ahead, stat_root) = (volume.parent.is_none(), &root);
        let (parent_trees, to_compare) = crossbeam_channel::bounded(PARENT_TREES_AHEAD);
        let (walked, built) = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("stat".into())
                .spawn_scoped(scope, move || {
                    stat_entries(entries, stat_root, read_ahead, &found)
                })
                .expect("a thread starts");
            if let Some((tree, _)) = &volume.parent {
                let (blocks, tree) = (self.blocks, *tree);
                std::thread::Builder::new()
                    .name("parent-trees".into())
                    .spawn_scoped(scope, move || {
                        let mut ahead = ReadAhead::default();
                        let read = |id: &TreeId, next: &[TreeId]| {
                            blocks
                                .tree_reading_ahead(id, next, &mut ahead)
                                .map(|tree| reusable(tree.nodes, |id| stored(repository, id)))
                        };
                        read_parent_trees(read, tree, &parent_trees)
                    })
                    .expect("a thread starts");
            } else {
                drop(parent_trees);
            }
            let budget = Budget::new(CHUNKED_BYTES);
            for _ in 0..CHUNKERS {
                let to_chunk = to_chunk.clone();
                let (chunker, stop, budget) = (self.chunker.clone(), self.stop, budget.clone());
                std::thread::Builder::new()
                    .name("chunk".into())
                    .spawn_scoped(scope, move || {
                        for job in to_chunk {
                            let hash = read_chunks(
                                &chunker,
                                stop,
                                &job.path,
                                &mut { job.file },
                                job.size,
                                Some(&budget),
                                &mut |chunk, claim| {
                                    job.chunks.send((chunk, claim)).map_err(|_| {
                                        BuildError::Archive {
                                            path: job.path.clone(),
                                            source: io::Error::other("the tree stage stopped"),
                                        }
                                    })
                                },
                            );
                            drop(job.chunks);
                            let _ = job.hash.send(hash);
                        }
                    })
                    .expect("a thread starts");
            }
            drop(to_chunk);
            let trees = std::thread::Builder::new()
                .name("trees".into())
                .spawn_scoped(scope, || {
                    let built = build_trees(repository, &mut writer, root_node, received);
                    (built, writer)
                })
                .expect("a thread starts");
            let mut batches = Events {
                sender: &events,
                batch: Vec::with_capacity(BATCH),
            };
            let walked = self
                .walk(
                    &root,
                    Ahead {
                        entries: to_walk,
                        parent_trees: to_compare,
                    },
                    volume.parent,
                    header,
                    &mut batches,
                    &jobs,
                )
                .and_then(|walked| batches.flush().map(|()| walked));
            drop(jobs);
            drop(batches);
            drop(events);
            let (built, writer) = trees.join().expect("the tree stage does not panic");
            self.writer = Some(writer);
            (walked, built)
        });
        // A failed tree stage stops the walk (its queue closes): its error is the cause.
        let node = match (walked, built) {
            (Ok(_), Err(error)) | (Err(_), Err(error)) => return Err(error),
            (Err(error), Ok(_)) => return Err(error),
            (Ok(manifest), Ok(node)) => (manifest, node),
        };
        let ((file, summary), node) = node;
        Ok(ReadVolume {
            node,
            manifest: file,
            summary,
        })
    }

    /// The walk stage: reads the volume in canonical order (its entries come from the stat
    /// stage), writes its manifest, sends the tree stage what it needs.
    fn walk(
        &mut self,
        root: &std::os::fd::OwnedFd,
        ahead: Ahead,
        parent: Option<(TreeId, File)>,
        header: &Header,
        events: &mut Events<'_>,
        jobs: &crossbeam_channel::Sender<ChunkJob>,
    ) -> Result<(File, ManifestSummary), BuildError> {
        let (parent_tree, mut parent_manifest) = match parent {
            Some((tree, manifest)) => (Some(tree), Some(ParentManifest::open(manifest)?)),
            None => (None, None),
        };
        let out =
            BufWriter::with_capacity(256 << 10, tempfile::tempfile().map_err(BuildError::Write)?);
        let mut manifest = Manifest {
            writer: ManifestWriter::new(out, header).map_err(BuildError::Write)?,
            pending: std::collections::VecDeque::new(),
        };
        let mut stack = vec![Open {
            path: String::new(),
            parent: self.parent_tree(&ahead.parent_trees, parent_tree),
        }];
        for found in ahead.entries.iter().flatten() {
            if self.stop.load(Ordering::Relaxed) {
                return Err(stopped());
            }
            let found = found?;
            if found.other_filesystem {
                return Err(BuildError::OtherFilesystem { path: found.path });
            }
            // Leave the directories this entry is not in.
            while stack.len() > 1 {
                let top = &stack.last().expect("a directory is open").path;
                if found.path.len() > top.len()
                    && found.path.starts_with(top.as_str())
                    && found.path.as_bytes()[top.len()] == b'/'
                {
                    break;
                }
                let left = stack.pop().expect("a directory is open");
                events.send(Event::Leave(left.parent))?;
            }
            let name = found
                .path
                .rsplit('/')
                .next()
                .unwrap_or(&found.path)
                .to_string();
            match found.kind {
                OnDisk::Dir => {
                    let stat = walked_stat(&found)?;
                    let metadata = Metadata::of(&stat);
                    manifest.push(Pending {
                        entry: Entry {
                            path: found.path.clone(),
                            kind: Kind::Dir,
                            mode: metadata.mode,
                            uid: metadata.uid,
                            gid: metadata.gid,
                        },
                        hash: None,
                    })?;
                    let node = Node::new_node(
                        std::ffi::OsStr::new(&name),
                        NodeType::Dir,
                        node_metadata(&stat),
                    );
                    let parent_tree = find(stack.last().expect("open").parent_nodes(), &node.name)
                        .filter(|parent| parent.is_dir())
                        .and_then(|parent| parent.subtree);
                    stack.push(Open {
                        path: found.path,
                        parent: self.parent_tree(&ahead.parent_trees, parent_tree),
                    });
                    events.send(Event::Enter(node))?;
                }
                OnDisk::Symlink => {
                    let stat = walked_stat(&found)?;
                    let target = crate::manifest_builder::symlink_target(&found, header)?;
                    let metadata = Metadata::of(&stat);
                    manifest.push(Pending {
                        entry: Entry {
                            path: found.path.clone(),
                            kind: Kind::Symlink {
                                target: target.clone(),
                            },
                            mode: metadata.mode,
                            uid: metadata.uid,
                            gid: metadata.gid,
                        },
                        hash: None,
                    })?;
                    events.send(Event::Leaf(Node::new_node(
                        std::ffi::OsStr::new(&name),
                        NodeType::from_link(std::path::Path::new(&target)),
                        node_metadata(&stat),
                    )))?;
                }
                OnDisk::File => {
                    let walked = walked_stat(&found)?;
                    let mut node = Node::new_node(
                        std::ffi::OsStr::new(&name),
                        NodeType::File,
                        node_metadata(&walked),
                    );
                    let unchanged = self.unchanged(
                        find(stack.last().expect("open").parent_nodes(), &node.name),
                        &node,
                        parent_manifest.as_mut(),
                        &found.path,
                    )?;
                    let (metadata, hash, pending) = match unchanged {
                        Some((content, hash)) => {
                            self.counts.files_unchanged += 1;
                            node.content = Some(content);
                            events.send(Event::Leaf(node))?;
                            (Metadata::of(&walked), hash, None)
                        }
                        None => {
                            // Read through a descriptor opened beneath the root; its metadata
                            // is what the entry records.
                            let fd = tree::open_beneath(root, &found.path, OFlags::RDONLY)
                                .map_err(|errno| read_error(&found.path, errno.into()))?;
                            let stat = rustix::fs::fstat(&fd)
                                .map_err(|errno| read_error(&found.path, errno.into()))?;
                            if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
                                return Err(BuildError::Unsupported {
                                    path: found.path,
                                    kind: "special file",
                                });
                            }
                            self.counts.files_read += 1;
                            node.meta = node_metadata(&stat);
                            let metadata = Metadata::of(&stat);
                            if !read_by_the_walk(metadata.size) {
                                let (chunks, chunks_received) = crossbeam_channel::bounded(0);
                                let (hash, hash_received) = crossbeam_channel::bounded(1);
                                events.send(Event::ChunkedFile(node, chunks_received))?;
                                jobs.send(ChunkJob {
                                    file: File::from(fd),
                                    size: metadata.size,
                                    path: found.path.clone(),
                                    chunks,
                                    hash,
                                })
                                .map_err(|_| {
                                    BuildError::Archive {
                                        path: found.path.clone(),
                                        source: io::Error::other("the chunking threads stopped"),
                                    }
                                })?;
                                (metadata, String::new(), Some(hash_received))
                            } else {
                                events.send(Event::File(node))?;
                                let hash = read_chunks(
                                    &self.chunker,
                                    self.stop,
                                    &found.path,
                                    &mut File::from(fd),
                                    metadata.size,
                                    // Its chunks are bounded by the events in flight.
                                    None,
                                    &mut |chunk, _| events.send(Event::Chunk(chunk)),
                                )?;
                                events.send(Event::FileEnd)?;
                                (metadata, hash.to_hex().to_string(), None)
                            }
                        }
                    };
                    manifest.push(Pending {
                        entry: Entry {
                            path: found.path.clone(),
                            kind: Kind::File {
                                size: metadata.size,
                                blake3: hash,
                            },
                            mode: metadata.mode,
                            uid: metadata.uid,
                            gid: metadata.gid,
                        },
                        hash: pending,
                    })?;
                }
                OnDisk::Special => {
                    return Err(BuildError::Unsupported {
                        path: found.path,
                        kind: found.kind.name(),
                    });
                }
            }
        }
        while stack.len() > 1 {
            let left = stack.pop().expect("a directory is open");
            events.send(Event::Leave(left.parent))?;
        }
        // The last chunked files go to the tree stage before their hashes are awaited.
        events.flush()?;
        manifest.finish()
    }

    /// A parent tree with its nodes (none without one, or when it cannot be read: then every
    /// file is read, slower and never wrong).
    fn parent_tree(&self, ahead: &ParentTrees, tree: Option<TreeId>) -> Option<ParentTree> {
        let tree = tree?;
        // Trees read ahead and not asked for (directories no longer there) are passed over.
        if let Some((_, Some(nodes))) = ahead.iter().find(|(id, _)| *id == tree) {
            return Some((tree, nodes));
        }
        let nodes = self.blocks.tree(&tree).ok()?.nodes;
        let repository = self.blocks.repository;
        Some((tree, reusable(nodes, |id| stored(repository, id))))
    }

    /// The parent's content and manifest hash for a file unchanged since the parent: same
    /// size, mtime, ctime and inode, content to reuse (every block still in the repository:
    /// [`reusable`] took the others' away), and the parent's manifest hash for it known.
    fn unchanged(
        &self,
        parent: Option<&Node>,
        node: &Node,
        parent_manifest: Option<&mut ParentManifest>,
        path: &str,
    ) -> Result<Option<(Vec<DataId>, String)>, BuildError> {
        let (Some(parent), Some(parent_manifest)) = (parent, parent_manifest) else {
            return Ok(None);
        };
        let same = parent.node_type == NodeType::File
            && parent.meta.size == node.meta.size
            && parent.meta.mtime == node.meta.mtime
            && parent.meta.ctime == node.meta.ctime
            && parent.meta.inode == node.meta.inode
            && node.meta.mtime.is_some()
            && node.meta.ctime.is_some();
        let Some(content) = parent.content.as_ref().filter(|_| same) else {
            return Ok(None);
        };
        Ok(parent_manifest
            .hash_of(path, node.meta.size)?
            .map(|hash| (content.clone(), hash)))
    }

    /// Uploads the last packs and index; what was stored, and every block the snapshot names:
    /// those found in the index loaded at the start, and those this run stored.
    pub fn finish(mut self) -> Result<(WriterStats, (Referenced, Referenced)), BuildError> {
        let mut writer = self
            .writer
            .take()
            .expect("the writer is here between volumes");
        let referenced = writer.take_referenced_apart();
        let stats = writer.finish().map_err(write_error)?;
        Ok((stats, referenced))
    }
}

/// A manifest's first line (its header, naming its Backup) with its newline, the reader left
/// after it.
fn first_line(reader: &mut impl io::BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    Ok(line)
}

/// Whether two files hold the same bytes after their first line (two manifests of the same
/// volume, whose first line, the header, names each one's Backup): then the new one's body is
/// stored as the same blocks. Both are read from their start.
pub fn same_after_first_line(a: &File, b: &File) -> io::Result<bool> {
    const BUFFER: usize = 256 << 10;
    let mut a = BufReader::with_capacity(BUFFER, a);
    let mut b = BufReader::with_capacity(BUFFER, b);
    a.rewind()?;
    b.rewind()?;
    let (header_a, header_b) = (first_line(&mut a)?, first_line(&mut b)?);
    let body = |file: &BufReader<&File>, header: &[u8]| -> io::Result<u64> {
        Ok(file.get_ref().metadata()?.len() - header.len() as u64)
    };
    if body(&a, &header_a)? != body(&b, &header_b)? {
        return Ok(false);
    }
    loop {
        let (left, right) = (
            io::BufRead::fill_buf(&mut a)?,
            io::BufRead::fill_buf(&mut b)?,
        );
        let length = left.len().min(right.len());
        if length == 0 {
            return Ok(left.is_empty() && right.is_empty());
        }
        if left[..length] != right[..length] {
            return Ok(false);
        }
        io::BufRead::consume(&mut a, length);
        io::BufRead::consume(&mut b, length);
    }
}

/// A parent tree's nodes as a backup may reuse them: a file naming a block the index loaded at
/// the start lacks (a damaged or pruned repository) has no content to reuse, so it is read
/// again (and its directory's tree never equals the parent's). Done on the parent-tree stage:
/// one index search per block, each mostly a cache miss, was a fifth of the walk's CPU.
fn reusable(mut nodes: Vec<Node>, stored: impl Fn(&DataId) -> bool) -> Vec<Node> {
    for node in &mut nodes {
        if node
            .content
            .as_ref()
            .is_some_and(|content| !content.iter().all(&stored))
        {
            node.content = None;
        }
    }
    nodes
}

/// Whether the index loaded at the start holds a data block.
fn stored(repository: &Repository<IndexedFullStatus>, id: &DataId) -> bool {
    repository.get_index_entry(id).is_ok()
}

/// Whether the repository holds a block already.
fn known(repository: &Repository<IndexedFullStatus>, kind: BlobType, id: &BlockId) -> bool {
    let id = writer::rustic_id(id);
    match kind {
        BlobType::Data => repository.get_index_entry(&DataId::from(id)).is_ok(),
        BlobType::Tree => repository.get_index_entry(&TreeId::from(id)).is_ok(),
    }
}

fn store_data(
    repository: &Repository<IndexedFullStatus>,
    writer: &mut Writer,
    chunk: Bytes,
    claim: Option<Claim>,
) -> Result<DataId, BuildError> {
    let id = writer::block_id(&chunk);
    let known = known(repository, BlobType::Data, &id);
    let hold = claim.map(|claim| Box::new(claim) as writer::Hold);
    writer
        .store_holding(BlobType::Data, id, chunk, known, hold)
        .map_err(write_error)?;
    Ok(DataId::from(writer::rustic_id(&id)))
}

/// Stores a tree of `nodes` (already in name order).
fn store_tree(
    repository: &Repository<IndexedFullStatus>,
    writer: &mut Writer,
    nodes: Vec<Node>,
) -> Result<TreeId, BuildError> {
    let mut json = serde_json::to_vec(&Tree { nodes })
        .map_err(|error| BuildError::Write(io::Error::other(error)))?;
    // restic ends a tree with a newline.
    json.push(b'\n');
    let id = writer::block_id(&json);
    let known = known(repository, BlobType::Tree, &id);
    writer
        .store(BlobType::Tree, id, Bytes::from(json), known)
        .map_err(write_error)?;
    Ok(TreeId::from(writer::rustic_id(&id)))
}

/// The tree stage: hashes and stores each chunk, builds each directory's tree as it ends;
/// the volume root's node with its tree.
fn build_trees(
    repository: &Repository<IndexedFullStatus>,
    writer: &mut Writer,
    root: Node,
    batches: crossbeam_channel::Receiver<Vec<Event>>,
) -> Result<Node, BuildError> {
    let mut stack: Vec<(Node, Vec<Node>)> = vec![(root, Vec::new())];
    let mut file: Option<(Node, Vec<DataId>)> = None;
    for event in batches.into_iter().flatten() {
        match event {
            Event::Enter(node) => stack.push((node, Vec::new())),
            Event::Leave(parent) => close(repository, writer, &mut stack, parent)?,
            Event::Leaf(node) => {
                // An unchanged file names its parent's blocks: they must stay in the repository.
                if let Some(content) = &node.content {
                    writer.reuse(BlobType::Data, content.iter().map(|id| **id));
                    super::progress::whole_file(node.meta.size);
                }
                stack.last_mut().expect("open").1.push(node)
            }
            Event::File(node) => file = Some((node, Vec::new())),
            Event::Chunk(chunk) => {
                let length = chunk.len() as u64;
                let id = store_data(repository, writer, chunk, None)?;
                super::progress::bytes(length);
                file.as_mut().expect("a file is being read").1.push(id);
            }
            Event::FileEnd => {
                let (mut node, content) = file.take().expect("a file was being read");
                node.content = Some(content);
                super::progress::file();
                stack.last_mut().expect("open").1.push(node);
            }
            Event::ChunkedFile(mut node, chunks) => {
                let mut content = Vec::new();
                // A chunking thread that failed ends the queue early; the walk reports why.
                for (chunk, claim) in chunks {
                    let length = chunk.len() as u64;
                    content.push(store_data(repository, writer, chunk, Some(claim))?);
                    super::progress::bytes(length);
                }
                node.content = Some(content);
                super::progress::file();
                stack.last_mut().expect("open").1.push(node);
            }
        }
    }
    while stack.len() > 1 {
        close(repository, writer, &mut stack, None)?;
    }
    let (mut node, nodes) = stack.pop().expect("the root is open");
    node.subtree = Some(store_tree(repository, writer, nodes)?);
    Ok(node)
}

/// Closes the innermost directory: its tree is stored (or the parent snapshot's, when it
/// holds the same nodes) and its node joins its parent.
fn close(
    repository: &Repository<IndexedFullStatus>,
    writer: &mut Writer,
    stack: &mut Vec<(Node, Vec<Node>)>,
    parent: Option<ParentTree>,
) -> Result<(), BuildError> {
    let (mut node, nodes) = stack.pop().expect("a directory to close");
    let stored = |id: &TreeId| repository.get_index_entry(id).is_ok();
    node.subtree = Some(match same_tree(parent.as_ref(), &nodes, stored) {
        Some(id) => {
            writer.reuse(BlobType::Tree, [*id]);
            id
        }
        None => store_tree(repository, writer, nodes)?,
    });
    stack.last_mut().expect("its parent is open").1.push(node);
    Ok(())
}

/// The parent snapshot's tree, when a directory's `nodes` are exactly its nodes and it is
/// still `stored` in the repository: it is that directory's tree, and neither serializing nor
/// hashing the nodes again would give another (doing so took about a sixth of an unchanged
/// backup's CPU).
fn same_tree(
    parent: Option<&ParentTree>,
    nodes: &[Node],
    stored: impl Fn(&TreeId) -> bool,
) -> Option<TreeId> {
    let (id, parent_nodes) = parent?;
    (parent_nodes.as_slice() == nodes && stored(id)).then_some(*id)
}

/// Bytes read at a time past a chunk's minimum size, where its end may be: what is read
/// beyond the end is copied into the next chunk, so smaller reads copy less.
const READ_PAST_MINIMUM: usize = 256 << 10;

/// Reads exactly `size` bytes of `reader` in chunks (restic's boundaries), handing each to
/// `chunk`; their BLAKE3. Each chunk is read into its own buffer as its end is searched for:
/// what a file being chunked holds in memory is the chunk being read, and only the bytes read
/// past its end are copied (into the next).
fn read_chunks(
    chunker: &Chunker,
    stop: &AtomicBool,
    path: &str,
    reader: &mut dyn Read,
    size: u64,
    budget: Option<&Arc<Budget>>,
    chunk: &mut dyn FnMut(Bytes, Claim) -> Result<(), BuildError>,
) -> Result<blake3::Hash, BuildError> {
    let mut hasher = blake3::Hasher::new();
    let mut limited = reader.take(size);
    let (min, max) = (chunker.min(), chunker.max());
    let mut read_total = 0u64;
    let mut past_end: Vec<u8> = Vec::new();
    // The claim of what is in `past_end`; a chunk's claim goes with it.
    let mut past_claim = Claim::new(budget);
    let mut file_ended = size == 0;
    while !file_ended || !past_end.is_empty() {
        if stop.load(Ordering::Relaxed) {
            return Err(stopped());
        }
        let left = (size - read_total) as usize;
        // Pages of the buffer are taken as they are written: a chunk that ends early holds
        // only its own bytes.
        let mut buffer = Vec::with_capacity((past_end.len() + left).min(max));
        buffer.append(&mut past_end);
        let mut claim = std::mem::replace(&mut past_claim, Claim::new(budget));
        let mut scan = Scan::new(chunker);
        let end = loop {
            if let Some(end) = scan.end(&buffer, file_ended) {
                break end;
            }
            let want = if buffer.len() < min {
                min - buffer.len()
            } else {
                READ_PAST_MINIMUM
            }
            .min(buffer.capacity() - buffer.len());
            if !claim.grow(want, stop) {
                return Err(stopped());
            }
            let read = (&mut limited)
                .take(want as u64)
                .read_to_end(&mut buffer)
                .map_err(|source| read_error(path, source))?;
            claim.release(want - read);
            read_total += read as u64;
            // A read short of what was asked is the end (of the file, or of what it has left
            // of `size`: then the sizes differ, below).
            file_ended = read < want || read_total == size;
        };
        past_end.extend_from_slice(&buffer[end..]);
        past_claim = claim.split_off(past_end.len());
        buffer.truncate(end);
        // What the chunk did not use goes back now, not when the chunk is sealed.
        buffer.shrink_to_fit();
        if buffer.is_empty() {
            break;
        }
        hasher.update(&buffer);
        chunk(Bytes::from(buffer), claim)?;
    }
    if read_total != size {
        return Err(BuildError::Changed {
            path: path.to_string(),
            expected: size,
            found: read_total,
        });
    }
    Ok(hasher.finalize())
}

/// The node named `name` among a parent directory's nodes (sorted by name).
fn find<'n>(nodes: &'n [Node], name: &str) -> Option<&'n Node> {
    nodes
        .binary_search_by(|node| node.name.as_str().cmp(name))
        .ok()
        .map(|index| &nodes[index])
}

/// restic's mode bits (Go's `fs.FileMode`) for a Unix `st_mode`.
pub fn go_mode(mode: u32) -> u32 {
    const DIR: u32 = 1 << 31;
    const SYMLINK: u32 = 1 << 27;
    const SETUID: u32 = 1 << 23;
    const SETGID: u32 = 1 << 22;
    const STICKY: u32 = 1 << 20;
    let mut go = mode & 0o777;
    match mode & 0o170_000 {
        0o040_000 => go |= DIR,
        0o120_000 => go |= SYMLINK,
        _ => {}
    }
    if mode & 0o4000 != 0 {
        go |= SETUID;
    }
    if mode & 0o2000 != 0 {
        go |= SETGID;
    }
    if mode & 0o1000 != 0 {
        go |= STICKY;
    }
    go
}

fn timestamp(seconds: i64, nanoseconds: i64) -> Option<rustic_core::jiff::Timestamp> {
    rustic_core::jiff::Timestamp::new(seconds, nanoseconds as i32).ok()
}

/// A snapshot node's metadata from `stat`: what restic records, and what tells an unchanged
/// file (size, mtime, ctime, inode).
// The `stat` fields' types differ between C libraries (glibc, musl).
#[allow(clippy::unnecessary_cast)]
fn node_metadata(stat: &Stat) -> NodeMetadata {
    let is_file = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
    NodeMetadata {
        mode: Some(go_mode(stat.st_mode)),
        mtime: timestamp(stat.st_mtime, stat.st_mtime_nsec as i64),
        // No access time: reading a file for the first backup changes it, which would change
        // every tree of an unchanged volume in the next snapshot (and upload them again).
        // Restores set no access time either (the manifest does not record one).
        atime: None,
        ctime: timestamp(stat.st_ctime, stat.st_ctime_nsec as i64),
        uid: Some(stat.st_uid),
        gid: Some(stat.st_gid),
        inode: stat.st_ino,
        device_id: stat.st_dev,
        size: if is_file { stat.st_size as u64 } else { 0 },
        links: stat.st_nlink as u64,
        ..NodeMetadata::default()
    }
}

/// The parent snapshot's manifest of a volume, read along with the walk (both in canonical
/// order).
struct ParentManifest {
    reader: ManifestReader<BufReader<File>>,
    next: Option<Entry>,
}

impl ParentManifest {
    fn open(file: File) -> Result<ParentManifest, BuildError> {
        let (mut reader, _) = ManifestReader::new(BufReader::new(file)).map_err(|error| {
            BuildError::Write(io::Error::other(format!("the parent manifest: {error}")))
        })?;
        let next = Self::read(&mut reader)?;
        Ok(ParentManifest { reader, next })
    }

    fn read(reader: &mut ManifestReader<BufReader<File>>) -> Result<Option<Entry>, BuildError> {
        reader.next().transpose().map_err(|error| {
            BuildError::Write(io::Error::other(format!("the parent manifest: {error}")))
        })
    }

    /// The hash the parent recorded for the file at `path` of `size` bytes, if it has one.
    fn hash_of(&mut self, path: &str, size: u64) -> Result<Option<String>, BuildError> {
        while let Some(entry) = &self.next {
            match manifest::compare_paths(&entry.path, path) {
                std::cmp::Ordering::Less => self.next = Self::read(&mut self.reader)?,
                std::cmp::Ordering::Equal => {
                    return Ok(match &entry.kind {
                        Kind::File {
                            size: parent_size,
                            blake3,
                        } if *parent_size == size => Some(blake3.clone()),
                        _ => None,
                    });
                }
                std::cmp::Ordering::Greater => return Ok(None),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two manifests whose bodies are the same store the new one's as the parent's blocks:
    /// only the first line may differ, anything after it must be byte for byte the same.
    #[test]
    fn manifests_are_the_same_after_their_first_line_only_byte_for_byte() {
        let file = |bytes: &[u8]| {
            let mut file = tempfile::tempfile().expect("a scratch file");
            io::Write::write_all(&mut file, bytes).expect("written");
            file
        };
        let large = |last: u8| {
            let mut bytes = b"header\n".to_vec();
            bytes.extend(std::iter::repeat_n(b'x', 600 << 10));
            bytes.push(last);
            bytes
        };
        let cases: Vec<(&str, Vec<u8>, Vec<u8>, bool)> = vec![
            (
                "the same",
                b"h\na\nb\n".to_vec(),
                b"h\na\nb\n".to_vec(),
                true,
            ),
            (
                "another header",
                b"h one\na\nb\n".to_vec(),
                b"h two, longer\na\nb\n".to_vec(),
                true,
            ),
            (
                "headers only",
                b"h one\n".to_vec(),
                b"h two\n".to_vec(),
                true,
            ),
            (
                "one byte differs",
                b"h\na\nb\n".to_vec(),
                b"h\na\nc\n".to_vec(),
                false,
            ),
            (
                "one is longer",
                b"h\na\n".to_vec(),
                b"h\na\nb\n".to_vec(),
                false,
            ),
            (
                "a line moved into the header",
                b"h\na\nb\n".to_vec(),
                b"h a\nb\n".to_vec(),
                false,
            ),
            ("the other one empty", b"h\na\n".to_vec(), Vec::new(), false),
            (
                "past the first buffer, the same",
                large(b'y'),
                large(b'y'),
                true,
            ),
            (
                "past the first buffer, one byte differs",
                large(b'y'),
                large(b'z'),
                false,
            ),
        ];
        for (name, a, b, same) in cases {
            let (a, b) = (file(&a), file(&b));
            assert_eq!(same_after_first_line(&a, &b).expect("read"), same, "{name}");
            assert_eq!(
                same_after_first_line(&b, &a).expect("read"),
                same,
                "{name}, turned"
            );
        }
    }

    /// Reading the inodes ahead changes nothing, and ends (its directories closed) when
    /// dropped, read to the end or not.
    #[test]
    fn inodes_read_ahead_change_nothing_and_stop_when_dropped() {
        let volume = tempfile::tempdir().expect("a directory");
        // The descriptors open on the volume (not all of the process's: the tests running
        // beside this one open and close theirs).
        let open_descriptors = || {
            std::fs::read_dir("/proc/self/fd")
                .expect("fds")
                .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.starts_with(volume.path()))
                .count()
        };
        for directory in 0..20 {
            let path = volume.path().join(format!("{directory:02}"));
            std::fs::create_dir(&path).expect("a directory");
            for file in 0..50 {
                std::fs::write(path.join(format!("{file:03}")), [directory as u8]).expect("a file");
            }
        }
        let listing = |root: &std::path::Path| {
            let walk = Walk::new(&tree::open_root(root).expect("root"), &[]).expect("walk");
            walk.stat_files()
                .map(|found| {
                    let found = found.expect("found");
                    (
                        found.path,
                        found.stat.map(|stat| (stat.st_mtime, stat.st_size)),
                    )
                })
                .collect::<Vec<_>>()
        };
        let before = (listing(volume.path()), open_descriptors());
        drop(InodesAhead::start(vec![volume.path().to_path_buf()]));
        let read = InodesAhead::start(vec![volume.path().to_path_buf(), "/nonexistent".into()]);
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(read);
        assert_eq!((listing(volume.path()), open_descriptors()), before);
    }

    /// The chunking thread's reads wait while its chunks not yet let go hold the budget: a
    /// consumer that keeps every chunk sees the reading stop at the bound, and go on to the end
    /// once it lets them go.
    #[test]
    fn a_chunking_thread_reads_no_further_than_its_budget_while_its_chunks_are_held() {
        const MIB: usize = 1 << 20;
        // Repetitive text finds no boundary: every chunk is the largest, 8 MiB.
        let line = b"insert into orders values (1, 'committed', NULL);\n";
        let content: Vec<u8> = line.iter().copied().cycle().take(40 * MIB).collect();
        let chunker = Chunker::new(0x3DA3358B4DC173, 512 << 10, 1 << 20, 8 << 20);
        let budget = Budget::new(CHUNKED_BYTES);
        let stop = AtomicBool::new(false);
        let (sender, received) = crossbeam_channel::unbounded::<(Bytes, Claim)>();
        std::thread::scope(|scope| {
            // Moved in: should an assertion fail, the chunks still queued go with it, their
            // claims given back, and the reader ends instead of waiting on the budget for ever
            // (the scope joins it).
            let received = received;
            let reader = scope.spawn(|| {
                read_chunks(
                    &chunker,
                    &stop,
                    "orders",
                    &mut content.as_slice(),
                    content.len() as u64,
                    Some(&budget),
                    &mut |chunk, claim| {
                        sender
                            .send((chunk, claim))
                            .expect("the test holds the queue");
                        Ok(())
                    },
                )
                .expect("read")
            });
            // Chunks until the budget is held, however slowly a loaded machine chunks them.
            let mut held = Vec::new();
            let mut bytes = 0;
            while bytes < CHUNKED_BYTES {
                let chunk = received
                    .recv_timeout(std::time::Duration::from_secs(60))
                    .expect("a chunk within a minute");
                bytes += chunk.0.len();
                held.push(chunk);
            }
            assert_eq!(
                bytes, CHUNKED_BYTES,
                "chunks handed over while all are held"
            );
            // A reader that ignored the budget claims its next bytes as soon as it handed a
            // chunk over; half a second is ample for that, even on a loaded machine.
            std::thread::sleep(std::time::Duration::from_millis(500));
            assert_eq!(
                budget.held(),
                CHUNKED_BYTES,
                "the reader claimed nothing past the budget"
            );
            assert!(received.is_empty(), "no chunk past the budget");
            assert!(!reader.is_finished(), "the reading waits for the budget");
            drop(held);
            let mut rest = 0;
            while let Ok((chunk, _)) = received.recv_timeout(std::time::Duration::from_secs(60)) {
                rest += chunk.len();
                if bytes + rest == content.len() {
                    break;
                }
            }
            assert_eq!(bytes + rest, content.len());
            assert_eq!(
                reader.join().expect("the reader ends"),
                blake3::hash(&content)
            );
        });
    }

    /// A directory node named `name` whose tree is `tree`.
    fn directory(name: &str, tree: u8) -> Node {
        let mut node = Node::new_node(
            std::ffi::OsStr::new(name),
            NodeType::Dir,
            NodeMetadata::default(),
        );
        node.subtree = Some(tree_id(tree));
        node
    }

    fn tree_id(n: u8) -> TreeId {
        TreeId::from(rustic_core::Id::new([n; 32]))
    }

    /// A file node named `name` with `content`, modified at second `mtime`.
    fn file(name: &str, content: u8, mtime: i64) -> Node {
        let mut node = Node::new_node(
            std::ffi::OsStr::new(name),
            NodeType::File,
            NodeMetadata::default(),
        );
        node.meta.size = 1;
        node.meta.mtime = timestamp(mtime, 0);
        node.content = Some(vec![DataId::from(rustic_core::Id::new([content; 32]))]);
        node
    }

    #[test]
    fn only_files_whose_every_block_is_stored_keep_content_to_reuse() {
        let data = |n: u8| DataId::from(rustic_core::Id::new([n; 32]));
        let mut two_blocks = file("d", 4, 10);
        two_blocks.content = Some(vec![data(4), data(5)]);
        let mut empty = file("e", 0, 10);
        empty.content = Some(Vec::new());
        let nodes = vec![
            directory("a", 1),
            file("b", 2, 10),
            file("c", 3, 10),
            two_blocks,
            empty,
        ];
        // (blocks the index holds, files keeping their content)
        let cases: [(&[u8], &[&str]); 4] = [
            (&[2, 3, 4, 5], &["b", "c", "d", "e"]),
            (&[2, 4, 5], &["b", "d", "e"]),
            // One block of two missing: the file is read again.
            (&[2, 3, 4], &["b", "c", "e"]),
            (&[], &["e"]),
        ];
        for (held, keeping) in cases {
            let stored = |id: &DataId| held.iter().any(|&n| data(n) == *id);
            let reused = reusable(nodes.clone(), stored);
            let kept: Vec<&str> = reused
                .iter()
                .filter(|node| node.content.is_some())
                .map(|node| node.name.as_str())
                .collect();
            assert_eq!(kept, keeping, "index holds {held:?}");
            // Nothing else changes: same nodes, same order, kept content as it was.
            assert_eq!(reused.len(), nodes.len());
            for (after, before) in reused.iter().zip(&nodes) {
                assert_eq!(after.name, before.name);
                assert_eq!(after.meta, before.meta);
                if after.content.is_some() {
                    assert_eq!(after.content, before.content);
                }
            }
            assert_eq!(
                reused[0].subtree, nodes[0].subtree,
                "a directory keeps its tree"
            );
        }
    }

    #[test]
    fn a_directory_takes_its_parents_tree_only_when_every_node_is_the_same_and_stored() {
        let nodes = vec![directory("a", 1), file("b", 2, 10), file("c", 3, 10)];
        let parent = (tree_id(9), nodes.clone());
        let stored = |_: &TreeId| true;
        assert_eq!(same_tree(Some(&parent), &nodes, stored), Some(tree_id(9)));
        // No parent tree (a new directory, or its tree could not be read).
        assert_eq!(same_tree(None, &nodes, stored), None);
        // The parent's tree is no longer in the repository.
        assert_eq!(same_tree(Some(&parent), &nodes, |_| false), None);
        assert_eq!(
            same_tree(Some(&parent), &nodes, |id| *id != tree_id(9)),
            None
        );
        let changed: [(&str, Vec<Node>); 6] = [
            (
                "a file's time",
                vec![directory("a", 1), file("b", 2, 11), file("c", 3, 10)],
            ),
            (
                "a file's content",
                vec![directory("a", 1), file("b", 4, 10), file("c", 3, 10)],
            ),
            (
                "a subdirectory's tree",
                vec![directory("a", 5), file("b", 2, 10), file("c", 3, 10)],
            ),
            (
                "a name",
                vec![directory("a", 1), file("b", 2, 10), file("d", 3, 10)],
            ),
            (
                "an entry removed",
                vec![directory("a", 1), file("b", 2, 10)],
            ),
            (
                "an entry added",
                vec![
                    directory("a", 1),
                    file("b", 2, 10),
                    file("c", 3, 10),
                    file("d", 3, 10),
                ],
            ),
        ];
        for (what, nodes) in changed {
            assert_eq!(same_tree(Some(&parent), &nodes, stored), None, "{what}");
        }
        // An empty directory whose parent tree was read and empty is the same.
        assert_eq!(
            same_tree(Some(&(tree_id(7), Vec::new())), &[], stored),
            Some(tree_id(7))
        );
    }

    #[test]
    fn parent_trees_come_in_the_order_the_walk_enters_directories() {
        // Directories by path, and their trees: the walk enters them in canonical order.
        let paths = [
            "", "a", "a/b", "a/b/c", "a/d", "a.x", "b", "b/a", "b/b", "z",
        ];
        let trees: std::collections::HashMap<TreeId, Vec<Node>> = paths
            .iter()
            .enumerate()
            .map(|(index, path)| {
                let mut children: Vec<(&str, u8)> = paths
                    .iter()
                    .enumerate()
                    .filter(|(_, child)| {
                        manifest::parent(child).unwrap_or("") == *path && !child.is_empty()
                    })
                    .map(|(n, child)| (child.rsplit('/').next().unwrap(), n as u8))
                    .collect();
                children.sort();
                let mut nodes: Vec<Node> = children
                    .iter()
                    .map(|(name, n)| directory(name, *n))
                    .collect();
                // A file among them names no tree.
                nodes.push(Node::new_node(
                    std::ffi::OsStr::new("file"),
                    NodeType::File,
                    NodeMetadata::default(),
                ));
                (tree_id(index as u8), nodes)
            })
            .collect();
        let mut walk_order: Vec<usize> = (0..paths.len()).collect();
        walk_order.sort_by(|a, b| manifest::compare_paths(paths[*a], paths[*b]));
        // One tree cannot be read: it comes in its place, unread, the others still in order.
        let unreadable = tree_id(4);
        let (sender, received) = crossbeam_channel::unbounded();
        read_parent_trees(
            |id, _| {
                (*id != unreadable)
                    .then(|| trees[id].clone())
                    .ok_or_else(|| "unreadable".to_string())
            },
            tree_id(0),
            &sender,
        );
        drop(sender);
        let sent: Vec<(TreeId, bool)> = received
            .iter()
            .map(|(id, nodes)| (id, nodes.is_some()))
            .collect();
        let expected: Vec<(TreeId, bool)> = walk_order
            .into_iter()
            .map(|index| tree_id(index as u8))
            .map(|id| (id, id != unreadable))
            .collect();
        assert_eq!(sent, expected);
    }

    #[test]
    fn modes_are_restics() {
        // Go's fs.FileMode bits, as restic writes them.
        assert_eq!(go_mode(0o100_644), 0o644);
        assert_eq!(go_mode(0o040_700), (1 << 31) | 0o700);
        assert_eq!(go_mode(0o120_777), (1 << 27) | 0o777);
        assert_eq!(go_mode(0o104_755), (1 << 23) | 0o755);
        assert_eq!(go_mode(0o102_755), (1 << 22) | 0o755);
        assert_eq!(go_mode(0o041_777), (1 << 31) | (1 << 20) | 0o777);
    }
}
