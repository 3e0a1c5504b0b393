//! Reads a volume out of a snapshot in manifest order, for the extraction to check and write.
//!
//! The snapshot's tree gives the entries (restic sorts a tree's nodes by name, as custody's
//! manifest does); the repository's index says in which pack, at which offset, each block of
//! a file's content lies. Blocks that follow each other in one pack are fetched with one
//! ranged read of at most [`RANGE_BYTES`], [`FETCHERS`] reads at a time, each block decrypted
//! (restic's AES-256-CTR + Poly1305-AES: a block altered in the bucket fails its MAC) and
//! decompressed, then handed over in order. What is fetched ahead is bounded
//! ([`WINDOW`] ranges), so memory does not grow with the volume.
//!
//! Nothing here decides what may be written: every entry and every byte goes through
//! [`Extraction`], against the manifest sealed in the snapshot.

use std::collections::BTreeMap;
use std::io::{self, BufRead};
use std::num::NonZeroU32;
use std::sync::{Arc, Condvar, Mutex};

use bytes::{Bytes, BytesMut};
use custody_repository::backend::S3Backend;
use custody_repository::crypto::Cipher;
use rustic_core::repofile::{Node, NodeType, PackId};
use rustic_core::{DataId, FileType, IndexedFullStatus, LsOptions, Repository};

use super::extract::{ExtractError, Extraction, Found, Pieces};

/// Most bytes one ranged read fetches.
pub const RANGE_BYTES: u32 = 4 << 20;
/// Most plaintext one ranged read holds once its blocks are opened (compressed blocks grow
/// back: a 4 MiB read of text can hold ten times that).
pub const RANGE_PLAIN_BYTES: u64 = 8 << 20;
/// Ranged reads at a time.
pub const FETCHERS: usize = 4;
/// Most ranges fetched ahead of the one the extraction reads.
pub const WINDOW: u64 = 6;
/// Most plaintext fetched ahead of (and including) the range the extraction reads; the range
/// it reads is always fetched, whatever its size. Restores of the benchmark set in one session
/// under mimalloc: 16 MiB took 4.67–4.74 s and peaked at 62.1–64.8 MiB resident, over the
/// mover's 64; 12 MiB took 4.94–4.99 s at 58.0–58.9 MiB (musl with 16 MiB: 4.63–5.08 s,
/// 59.2–62.3 MiB).
pub const AHEAD_PLAIN_BYTES: u64 = 12 << 20;
/// Entries planned ahead of the extraction.
const ENTRIES_AHEAD: usize = 4096;

/// A block of a file, where the index says it is.
#[derive(Clone, Copy, Debug)]
struct Block {
    offset: u32,
    length: u32,
    uncompressed: Option<NonZeroU32>,
}

impl Block {
    /// Its size once opened.
    fn plain(&self) -> u64 {
        match self.uncompressed {
            Some(length) => u64::from(length.get()),
            None => u64::from(self.length.saturating_sub(32)),
        }
    }
}

/// One ranged read of a pack, and the blocks in it, in the order they are needed.
struct Range {
    sequence: u64,
    pack: PackId,
    offset: u32,
    length: u32,
    /// The blocks' plaintext bytes.
    plain: u64,
    blocks: Vec<Block>,
}

impl Range {
    /// Plaintext bytes of its compressed blocks.
    fn decompressed(&self) -> usize {
        self.blocks
            .iter()
            .filter_map(|block| block.uncompressed)
            .map(|length| length.get() as usize)
            .sum()
    }
}

/// The buffers of the ranged reads and of their decompressed blocks.
struct ReadBuffers {
    sealed: Buffers,
    plain: Buffers,
}

/// Why the snapshot could not be read: its content is damaged (never worth trying again), or
/// the repository could not be reached.
#[derive(Clone, Debug)]
enum Failure {
    Damaged(String),
    Unreachable(String),
}

impl Failure {
    fn into_io(self) -> io::Error {
        match self {
            Failure::Damaged(message) => io::Error::new(io::ErrorKind::InvalidData, message),
            Failure::Unreachable(message) => io::Error::other(message),
        }
    }

    fn into_extract(self) -> ExtractError {
        match self {
            Failure::Damaged(message) => ExtractError::Archive(message),
            Failure::Unreachable(message) => ExtractError::Download(message),
        }
    }
}

fn extract_error(error: io::Error) -> ExtractError {
    if error.kind() == io::ErrorKind::InvalidData {
        ExtractError::Archive(error.to_string())
    } else {
        ExtractError::Download(error.to_string())
    }
}

/// An entry to extract and how many blocks its content has.
struct Planned {
    found: Found,
    blocks: usize,
}

/// What the fetchers hand over, by range.
struct Fetched {
    ranges: BTreeMap<u64, (u64, Result<Vec<Bytes>, Failure>)>,
    /// The range the extraction reads now (fetchers stay within WINDOW of it).
    reading: u64,
    /// The next range a fetcher may start: ranges start in order.
    admitted: u64,
    /// Plaintext of the ranges started and not yet taken by the extraction.
    ahead: u64,
    stopped: bool,
}

impl Fetched {
    /// Whether range `sequence` of `plain` bytes may be fetched now: in order, within the
    /// window, and within the plaintext bound unless the extraction waits for it.
    fn may_start(&self, sequence: u64, plain: u64) -> bool {
        sequence == self.admitted
            && (sequence == self.reading
                || (sequence < self.reading + WINDOW && self.ahead + plain <= AHEAD_PLAIN_BYTES))
    }
}

struct Handover {
    fetched: Mutex<Fetched>,
    changed: Condvar,
}

impl Handover {
    fn stop(&self) {
        self.fetched.lock().expect("handover").stopped = true;
        self.changed.notify_all();
    }
}

/// Extracts the snapshot tree under `node` (a volume's `data/<volume>`) through `extraction`,
/// opening blocks with `cipher` (the repository's key).
pub fn extract_volume<M: BufRead>(
    repository: &Repository<IndexedFullStatus>,
    (backend, cipher): (&S3Backend, &Cipher),
    node: &Node,
    mut extraction: Extraction<M>,
) -> Result<custody_proto::manifest::Totals, ExtractError> {
    let handover = Arc::new(Handover {
        fetched: Mutex::new(Fetched {
            ranges: BTreeMap::new(),
            reading: 0,
            admitted: 0,
            ahead: 0,
            stopped: false,
        }),
        changed: Condvar::new(),
    });
    let (entries, planned) =
        std::sync::mpsc::sync_channel::<Result<Planned, Failure>>(ENTRIES_AHEAD);
    let (jobs, to_fetch) = crossbeam_channel::bounded::<Range>(FETCHERS * 2);
    // Listed buffers stay resident: 3 x 4 MiB read + 2 x 8 MiB decompressed at most.
    let buffers = ReadBuffers {
        sealed: Buffers::new(RANGE_BYTES as usize, 3),
        plain: Buffers::new(RANGE_PLAIN_BYTES as usize, 2),
    };
    std::thread::scope(|scope| {
        let planner = {
            let handover = handover.clone();
            scope.spawn(move || {
                let outcome = plan(repository, backend, node, &entries, &jobs);
                if let Err(error) = outcome {
                    let _ = entries.send(Err(error));
                    handover.stop();
                }
            })
        };
        for _ in 0..FETCHERS {
            let to_fetch = to_fetch.clone();
            let handover = handover.clone();
            let buffers = &buffers;
            scope.spawn(move || fetch((backend, cipher), buffers, &to_fetch, &handover));
        }
        drop(to_fetch);
        let extracted = (|| {
            let mut blocks = Blocks {
                handover: &handover,
                range: 0,
                queue: std::collections::VecDeque::new(),
            };
            for planned in &planned {
                let planned = planned.map_err(Failure::into_extract)?;
                let mut content = Content {
                    blocks: &mut blocks,
                    left: planned.blocks,
                };
                extraction.entry(&planned.found, &mut content, &extract_error)?;
            }
            extraction.finish()
        })();
        // Whatever happened, the fetchers and the planner stop.
        handover.stop();
        drop(planned);
        let _ = planner.join();
        extracted
    })
}

/// Walks the tree, sends each entry, and groups the blocks of its content into ranges.
fn plan(
    repository: &Repository<IndexedFullStatus>,
    backend: &S3Backend,
    node: &Node,
    entries: &std::sync::mpsc::SyncSender<Result<Planned, Failure>>,
    jobs: &crossbeam_channel::Sender<Range>,
) -> Result<(), Failure> {
    let stopped = || Failure::Unreachable("the extraction stopped".into());
    // A tree that does not read is damaged unless an S3 call failed meanwhile.
    let failures = backend.failures();
    let tree_failure = |message: String| {
        if backend.failures() > failures {
            Failure::Unreachable(message)
        } else {
            Failure::Damaged(message)
        }
    };
    let mut sequence = 0u64;
    let mut pending: Option<Range> = None;
    let flush = |pending: &mut Option<Range>, sequence: &mut u64| -> Result<(), Failure> {
        if let Some(mut range) = pending.take() {
            range.sequence = *sequence;
            *sequence += 1;
            jobs.send(range).map_err(|_| stopped())?;
        }
        Ok(())
    };
    let listing = repository
        .ls(node, &LsOptions::default())
        .map_err(|error| tree_failure(format!("listing the snapshot: {}", error.display_log())))?;
    for item in listing {
        let (path, child) = item.map_err(|error| {
            tree_failure(format!(
                "reading the snapshot's tree: {}",
                error.display_log()
            ))
        })?;
        let path = path
            .to_str()
            .ok_or_else(|| {
                Failure::Damaged(format!("a path in the snapshot is not UTF-8: {path:?}"))
            })?
            .to_string();
        let (kind, link) = match &child.node_type {
            NodeType::File => ("file".to_string(), None),
            NodeType::Dir => ("dir".to_string(), None),
            NodeType::Symlink { .. } => (
                "symlink".to_string(),
                Some(child.node_type.to_link().to_string_lossy().into_owned()),
            ),
            other => (other.to_string(), None),
        };
        let content: &[DataId] = child.content.as_deref().unwrap_or_default();
        // The entry goes before its blocks: the extraction never waits for blocks of an
        // entry it has not been given, so the fetchers' window always moves.
        let planned = Planned {
            found: Found {
                path: path.clone(),
                kind,
                size: child.meta.size,
                link,
            },
            blocks: content.len(),
        };
        // Never wait for the extraction while it may wait for a block still held here.
        match entries.try_send(Ok(planned)) {
            Ok(()) => {}
            Err(std::sync::mpsc::TrySendError::Full(planned)) => {
                flush(&mut pending, &mut sequence)?;
                entries.send(planned).map_err(|_| stopped())?;
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return Err(stopped()),
        }
        for id in content {
            let entry = repository.get_index_entry(id).map_err(|error| {
                Failure::Damaged(format!(
                    "{path}: a block of its content is not in the repository's index: {}",
                    error.display_log()
                ))
            })?;
            let block = Block {
                offset: entry.location.offset,
                length: entry.location.length,
                uncompressed: entry.location.uncompressed_length,
            };
            let joins = pending.as_ref().is_some_and(|range| {
                range.pack == entry.pack
                    && range.offset + range.length == block.offset
                    && range.length + block.length <= RANGE_BYTES
                    && range.plain + block.plain() <= RANGE_PLAIN_BYTES
            });
            if joins {
                let range = pending.as_mut().expect("checked above");
                range.length += block.length;
                range.plain += block.plain();
                range.blocks.push(block);
            } else {
                flush(&mut pending, &mut sequence)?;
                pending = Some(Range {
                    sequence: 0,
                    pack: entry.pack,
                    offset: block.offset,
                    length: block.length,
                    plain: block.plain(),
                    blocks: vec![block],
                });
            }
        }
    }
    flush(&mut pending, &mut sequence)
}

/// Takes ranges in order, reads and opens their blocks, hands them over.
fn fetch(
    (backend, cipher): (&S3Backend, &Cipher),
    buffers: &ReadBuffers,
    to_fetch: &crossbeam_channel::Receiver<Range>,
    handover: &Handover,
) {
    // One zstd context per fetcher, reused for every block (making one per block costs more
    // than decompressing a small block).
    let mut decompressor = match zstd::bulk::Decompressor::new() {
        Ok(decompressor) => decompressor,
        Err(error) => {
            tracing::error!(%error, "starting zstd");
            handover.stop();
            return;
        }
    };
    for range in to_fetch {
        {
            // Stay within the window: memory is bounded by what is fetched ahead.
            let mut fetched = handover.fetched.lock().expect("handover");
            while !fetched.stopped && !fetched.may_start(range.sequence, range.plain) {
                fetched = handover.changed.wait(fetched).expect("handover");
            }
            if fetched.stopped {
                return;
            }
            fetched.admitted += 1;
            fetched.ahead += range.plain;
            drop(fetched);
            // The next range may start too.
            handover.changed.notify_all();
        }
        let length = range.length as usize;
        let mut buffer = buffers.sealed.take(length);
        let decompressed = range.decompressed();
        let mut room = buffers.plain.take(decompressed);
        let outcome = backend
            .read_range_into(
                FileType::Pack,
                &range.pack,
                range.offset,
                range.length,
                &mut buffer,
            )
            .map_err(|error| Failure::Unreachable(error.display_log()))
            .and_then(|()| {
                let opening = (cipher, &mut decompressor, &mut room);
                open_range(opening, &range, buffer.split())
            });
        buffers.sealed.give(length, buffer);
        buffers.plain.give(decompressed, room);
        let mut fetched = handover.fetched.lock().expect("handover");
        fetched
            .ranges
            .insert(range.sequence, (range.plain, outcome));
        drop(fetched);
        handover.changed.notify_all();
    }
}

/// The plaintext of a range's blocks, in order, each opened where it lies in the bytes read
/// ([`Cipher::open_block`]).
fn open_range(
    (cipher, decompressor, room): (
        &Cipher,
        &mut zstd::bulk::Decompressor<'static>,
        &mut BytesMut,
    ),
    range: &Range,
    mut rest: BytesMut,
) -> Result<Vec<Bytes>, Failure> {
    let damaged = |error: String| Failure::Damaged(format!("pack {}: {error}", range.pack));
    if rest.len() != range.length as usize {
        return Err(damaged(format!(
            "{} bytes read where {} were asked for",
            rest.len(),
            range.length
        )));
    }
    range
        .blocks
        .iter()
        .map(|block| {
            let sealed = rest.split_to(block.length as usize);
            cipher
                .open_block(sealed, block.uncompressed, decompressor, room)
                .map_err(damaged)
        })
        .collect()
}

/// Ranged reads' buffers, used again once every block cut from one is dropped: a fresh
/// multi-MiB buffer per read costs its page faults and its unmapping (a quarter of a
/// restore's CPU time was spent there). Buffers still in use are never touched; the list
/// holds at most `most`, so memory stays what the reads in flight need.
struct Buffers {
    free: Mutex<Vec<BytesMut>>,
    capacity: usize,
    most: usize,
}

impl Buffers {
    fn new(capacity: usize, most: usize) -> Buffers {
        Buffers {
            free: Mutex::new(Vec::new()),
            capacity,
            most,
        }
    }

    /// An empty buffer with room for `length` bytes: a listed one nothing else uses any
    /// more, or a new one (of the list's capacity, unless `length` is larger).
    fn take(&self, length: usize) -> BytesMut {
        if length == 0 {
            return BytesMut::new();
        }
        if length > self.capacity {
            return BytesMut::with_capacity(length);
        }
        let mut free = self.free.lock().expect("buffers");
        match free
            .iter_mut()
            .position(|buffer| buffer.try_reclaim(length))
        {
            Some(index) => free.swap_remove(index),
            None => BytesMut::with_capacity(self.capacity),
        }
    }

    /// Lists `buffer` (taken for `length` bytes; what it still holds is let go), to be taken
    /// again once what was split off it is dropped.
    fn give(&self, length: usize, mut buffer: BytesMut) {
        buffer.clear();
        let mut free = self.free.lock().expect("buffers");
        if length > 0 && length <= self.capacity && free.len() < self.most {
            free.push(buffer);
        }
    }
}

/// The blocks in order, as the fetchers hand them over.
struct Blocks<'a> {
    handover: &'a Handover,
    range: u64,
    queue: std::collections::VecDeque<Bytes>,
}

impl Blocks<'_> {
    fn next(&mut self) -> io::Result<Bytes> {
        loop {
            if let Some(block) = self.queue.pop_front() {
                return Ok(block);
            }
            let mut fetched = self.handover.fetched.lock().expect("handover");
            loop {
                if let Some((plain, outcome)) = fetched.ranges.remove(&self.range) {
                    self.range += 1;
                    fetched.reading = self.range;
                    fetched.ahead -= plain;
                    drop(fetched);
                    self.handover.changed.notify_all();
                    self.queue = outcome.map_err(Failure::into_io)?.into();
                    break;
                }
                if fetched.stopped {
                    return Err(io::Error::other("the snapshot's reading stopped"));
                }
                fetched = self.handover.changed.wait(fetched).expect("handover");
            }
        }
    }
}

/// One file's content: its blocks, handed to the extraction as they are.
struct Content<'a, 'b> {
    blocks: &'a mut Blocks<'b>,
    left: usize,
}

impl Pieces for Content<'_, '_> {
    fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.blocks.next().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn ranges_start_in_order_within_the_window_and_the_plaintext_bound() {
        // (name, reading, admitted, ahead, sequence, plain, may start)
        type Case = (&'static str, u64, u64, u64, u64, u64, bool);
        let cases: &[Case] = &[
            ("the first range", 0, 0, 0, 0, MIB, true),
            (
                "the range being read, however large",
                3,
                3,
                0,
                3,
                64 * MIB,
                true,
            ),
            (
                "the range being read even with the bound reached",
                3,
                3,
                AHEAD_PLAIN_BYTES,
                3,
                MIB,
                true,
            ),
            (
                "a later range before an earlier one",
                0,
                1,
                MIB,
                2,
                MIB,
                false,
            ),
            (
                "the next in order, within the bound",
                0,
                1,
                4 * MIB,
                1,
                8 * MIB,
                true,
            ),
            (
                "the next in order, past the bound",
                0,
                1,
                12 * MIB,
                1,
                8 * MIB,
                false,
            ),
            (
                "exactly at the bound",
                0,
                1,
                8 * MIB,
                1,
                AHEAD_PLAIN_BYTES - 8 * MIB,
                true,
            ),
            ("past the window", 0, WINDOW, 0, WINDOW, 1, false),
            ("the window's last", 0, WINDOW - 1, 0, WINDOW - 1, 1, true),
        ];
        for &(name, reading, admitted, ahead, sequence, plain, wanted) in cases {
            let fetched = Fetched {
                ranges: BTreeMap::new(),
                reading,
                admitted,
                ahead,
                stopped: false,
            };
            assert_eq!(fetched.may_start(sequence, plain), wanted, "{name}");
        }
    }

    #[test]
    fn a_buffer_is_used_again_only_once_every_block_cut_from_it_is_dropped() {
        let buffers = Buffers::new(1024, 2);
        let address = |buffer: &BytesMut| buffer.as_ptr() as usize;
        let mut first = buffers.take(1000);
        let first_at = address(&first);
        first.extend_from_slice(&[1u8; 1000]);
        let mut content = first.split();
        let block = content.split_to(600).freeze();
        let other = content.freeze();
        buffers.give(1000, first);
        // Both blocks are held: another buffer, the blocks unchanged.
        let mut second = buffers.take(1000);
        assert_ne!(address(&second), first_at);
        second.extend_from_slice(&[2u8; 1000]);
        let _held = second.split();
        buffers.give(1000, second);
        drop(other);
        let third = buffers.take(1000);
        assert_ne!(address(&third), first_at, "a block of it is still held");
        assert!(block.iter().all(|byte| *byte == 1));
        buffers.give(1000, third);
        drop(block);
        // Every block of the first is dropped: its allocation again, from the start.
        let again = buffers.take(1000);
        assert_eq!(address(&again), first_at);
        assert!(again.is_empty() && again.capacity() >= 1000);
        buffers.give(1000, again);
        // Larger than the list's buffers: a buffer of its own, never listed.
        let large = buffers.take(4096);
        assert!(large.capacity() >= 4096);
        buffers.give(4096, large);
        assert_eq!(buffers.free.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_blocks_plaintext_is_its_uncompressed_length_or_its_sealed_length_less_nonce_and_mac() {
        let compressed = Block {
            offset: 0,
            length: 100,
            uncompressed: NonZeroU32::new(1000),
        };
        let plain = Block {
            offset: 0,
            length: 100,
            uncompressed: None,
        };
        assert_eq!((compressed.plain(), plain.plain()), (1000, 68));
    }
}
