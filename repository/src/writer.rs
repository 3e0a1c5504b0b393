//! Stores blocks in the repository as restic's format lays them out: each new block
//! compressed (zstd), sealed ([`Cipher`]) and appended to a pack of its type; a full pack
//! gets its sealed header and is uploaded; once a pack is stored its blocks go into an index
//! file, so that no index ever names a pack that is not there. A block the repository (or
//! this run) already holds is not stored again.
//!
//! The caller hashes (SHA-256, the block's ID) and hands blocks over in order; compressing and
//! sealing run on [`WriterOptions::sealers`] threads and uploads on
//! [`WriterOptions::uploads`], and blocks keep their order in the packs (a restore then reads
//! a volume's content front to back). Memory is bounded in bytes and packs: the blocks being
//! sealed ([`WriterOptions::sealing_bytes`]), one open pack of each type, and the full packs
//! not yet stored ([`WriterOptions::packs_unstored`]).
//!
//! This is the part of a backup rustic_core's archiver also does; custody does it itself
//! because that archiver could not reach the speed asked of a backup here (see the README),
//! writing the same files with rustic_core's own types, which `restic check` reads.

use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroU32;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use rustic_core::repofile::BlobType;
use rustic_core::{FileType, Id, WriteBackend};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::crypto::{Cipher, OVERHEAD, Seal};
use crate::index_file::save_index;
use crate::prune::Referenced;

/// How a [`Writer`] packs and uploads.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// zstd level of compressed blocks.
    pub compression_level: i32,
    /// A data pack is uploaded once it holds this many bytes.
    pub data_pack_bytes: usize,
    /// A tree pack is uploaded once it holds this many bytes.
    pub tree_pack_bytes: usize,
    /// Threads compressing and sealing blocks.
    pub sealers: usize,
    /// Bytes of blocks handed over and not yet in a pack (queued, being sealed, or sealed and
    /// waiting for the blocks before them): [`Writer::store`] waits while more would be, and
    /// takes a block larger than this alone.
    pub sealing_bytes: usize,
    /// Packs uploaded at a time.
    pub uploads: usize,
    /// Full packs not yet stored (being uploaded or waiting for an uploader): a block that
    /// would start another pack waits while this many are. With the open pack of each type,
    /// this bounds the pack buffers in memory.
    pub packs_unstored: usize,
    /// An index file is written once this many stored packs wait for one.
    pub packs_per_index: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            // zstd's fastest standard level. Against level 3 (restic's "auto"), same session,
            // alternating pairs: pg_basebackup's 1.1 GB tar stream read by the mover 2.36 and
            // 2.51 s against 2.59 and 2.67 s, stored 47.7 against 48.1 MB; the benchmark set's
            // first backup 7.02 and 7.90 s against 7.89 and 8.26 s, stored 815.9 against
            // 816.1 MB. Any level reads back alike (restic and rustic included).
            compression_level: 1,
            // Smaller than restic's 16 MiB: what is held in memory is a few packs (the open
            // one and those not yet stored). Under mimalloc (the mover's allocator), first
            // backups of the benchmark set in one session: 8 MiB packs peaked at 65–72 MiB
            // resident in 6.2–6.7 s, 6 MiB packs at 61–65 MiB in 6.4–7.0 s, 4 MiB packs at
            // 58–59 MiB but in 7.5–7.7 s (each pack is an object the S3 server writes).
            data_pack_bytes: 6 << 20,
            tree_pack_bytes: 4 << 20,
            sealers: 2,
            // One chunk of the largest size (8 MiB), or eight of restic's average: on the
            // benchmark set, 16 MiB measured no faster and up to 8 MiB more at the peak.
            sealing_bytes: 8 << 20,
            uploads: 2,
            // The packs being uploaded: a sealer does not start a third pack meanwhile.
            packs_unstored: 2,
            packs_per_index: 64,
        }
    }
}

/// What a run stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Blocks stored, and their bytes before compression.
    pub blocks_new: u64,
    pub bytes_new: u64,
    /// Data blocks among them, and their bytes.
    pub data_blocks_new: u64,
    pub data_bytes_new: u64,
    /// Blocks the repository already held (not stored again).
    pub blocks_known: u64,
    /// Bytes of the packs uploaded (compressed, sealed, with their headers).
    pub bytes_uploaded: u64,
    pub packs: u64,
    pub index_files: u64,
    /// The most bytes of blocks that were handed over and not yet in a pack at once.
    pub peak_sealing_bytes: u64,
    /// The most full packs not yet stored at once.
    pub peak_packs_unstored: u64,
}

/// Why storing failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct WriteError(pub String);

/// A block's ID: the SHA-256 of its plaintext.
pub type BlockId = [u8; 32];

/// A pack's blocks in an index file (restic's JSON).
#[derive(Serialize)]
struct IndexedPack {
    id: String,
    blobs: Vec<IndexedBlock>,
}

#[derive(Serialize)]
struct IndexedBlock {
    id: String,
    #[serde(rename = "type")]
    kind: BlobType,
    offset: u32,
    length: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    uncompressed_length: Option<NonZeroU32>,
}

#[derive(Serialize)]
struct IndexJson {
    packs: Vec<IndexedPack>,
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(64), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

/// A block being sealed.
struct Job {
    sequence: u64,
    kind: BlobType,
    id: BlockId,
    plain: Bytes,
    hold: Option<Hold>,
}

/// What a caller hands over with a block's bytes, to be dropped when the writer lets them go
/// ([`Writer::store_holding`]).
pub type Hold = Box<dyn Send>;

/// A sealed block, ready for its pack: `seal.nonce`, `body` (encrypted), `seal.tag`.
struct Sealed {
    kind: BlobType,
    id: BlockId,
    seal: Seal,
    body: Vec<u8>,
    plain_length: u32,
    compressed: bool,
    /// Kept while `body` is the block's own buffer (not compressed): dropped with the block,
    /// once it is in a pack.
    _hold: Option<Hold>,
}

impl Sealed {
    /// Its bytes in the pack.
    fn len(&self) -> usize {
        self.body.len() + OVERHEAD
    }
}

/// Room kept in a pack's buffer for its header (41 bytes a block, sealed).
const PACK_HEADER_ROOM: usize = 64 << 10;

/// A pack being filled: its sealed blocks one after another, in one buffer that is uploaded
/// as it is.
#[derive(Default)]
struct PackBuilder {
    bytes: bytes::BytesMut,
    blobs: Vec<(BlockId, u32, u32, Option<NonZeroU32>)>,
}

/// A full pack on its way to the bucket.
struct FullPack {
    kind: BlobType,
    builder: PackBuilder,
}

struct State {
    /// Sealed blocks waiting for the ones sealed before them.
    ready: BTreeMap<u64, Sealed>,
    next: u64,
    data: PackBuilder,
    tree: PackBuilder,
    index: Vec<IndexedPack>,
    stats: WriterStats,
    failure: Option<String>,
    /// Bytes of the blocks handed over and not yet in a pack.
    sealing: usize,
    /// Full packs not yet stored.
    unstored: usize,
}

impl State {
    /// Records the writer's first failure. Blocks waiting for their turn are never stored
    /// now: their bytes, and the holds that bound a caller's reading, go at once (a caller
    /// waiting for its hold's room would otherwise wait for ever).
    fn fail(&mut self, message: String) {
        self.failure.get_or_insert(message);
        self.ready.clear();
    }
}

struct Shared {
    backend: Arc<dyn WriteBackend>,
    cipher: Cipher,
    options: WriterOptions,
    state: Mutex<State>,
    /// Signalled when blocks reach their pack, when a pack is stored, or when the writer
    /// fails.
    sealed: Condvar,
}

impl Shared {
    fn fail(&self, message: String) {
        self.state.lock().expect("writer state").fail(message);
        self.sealed.notify_all();
    }

    /// Waits until `bytes` more may be handed to the sealers, and counts them; the writer's
    /// failure if it failed meanwhile.
    fn admit(&self, bytes: usize) -> Result<(), String> {
        let limit = self.options.sealing_bytes;
        let mut state = self.state.lock().expect("writer state");
        while state.failure.is_none() && state.sealing > 0 && state.sealing + bytes > limit {
            state = self.sealed.wait(state).expect("writer state");
        }
        if let Some(failure) = &state.failure {
            return Err(failure.clone());
        }
        state.sealing += bytes;
        state.stats.peak_sealing_bytes = state.stats.peak_sealing_bytes.max(state.sealing as u64);
        Ok(())
    }

    fn failure(&self) -> Option<String> {
        self.state.lock().expect("writer state").failure.clone()
    }
}

/// Stores blocks into the repository for one backup.
pub struct Writer {
    shared: Arc<Shared>,
    /// Blocks this run stored or handed over already.
    added: HashSet<(BlobType, BlockId)>,
    /// Blocks this run referenced because the repository held them.
    reused: Referenced,
    sequence: u64,
    jobs: Option<crossbeam_channel::Sender<Job>>,
    sealers: Vec<JoinHandle<()>>,
    packs: Option<crossbeam_channel::Sender<FullPack>>,
    uploaders: Vec<JoinHandle<()>>,
}

impl Writer {
    /// A writer into the repository behind `backend`, sealing with `cipher`.
    pub fn new(backend: Arc<dyn WriteBackend>, cipher: Cipher, options: WriterOptions) -> Writer {
        let shared = Arc::new(Shared {
            backend,
            cipher,
            options: options.clone(),
            state: Mutex::new(State {
                ready: BTreeMap::new(),
                next: 0,
                data: PackBuilder::default(),
                tree: PackBuilder::default(),
                index: Vec::new(),
                stats: WriterStats::default(),
                failure: None,
                sealing: 0,
                unstored: 0,
            }),
            sealed: Condvar::new(),
        });
        // Bounded by bytes ([`Shared::admit`]), not by count.
        let (jobs, to_seal) = crossbeam_channel::unbounded::<Job>();
        // Bounded by [`WriterOptions::packs_unstored`]: sent under the state's lock, so never
        // waiting there.
        let (packs, to_upload) = crossbeam_channel::unbounded::<FullPack>();
        let sealers = (0..options.sealers.max(1))
            .map(|_| {
                let (shared, to_seal, packs) = (shared.clone(), to_seal.clone(), packs.clone());
                std::thread::Builder::new()
                    .name("seal".into())
                    .spawn(move || seal(&shared, &to_seal, &packs))
                    .expect("a thread starts")
            })
            .collect();
        let uploaders = (0..options.uploads.max(1))
            .map(|_| {
                let (shared, to_upload) = (shared.clone(), to_upload.clone());
                std::thread::Builder::new()
                    .name("upload".into())
                    .spawn(move || upload(&shared, &to_upload))
                    .expect("a thread starts")
            })
            .collect();
        Writer {
            shared,
            added: HashSet::new(),
            reused: Referenced::default(),
            sequence: 0,
            jobs: Some(jobs),
            sealers,
            packs: Some(packs),
            uploaders,
        }
    }

    /// Stores a block unless `known` (the repository holds it) or this run stored it already.
    /// `id` is the SHA-256 of `plain`.
    pub fn store(
        &mut self,
        kind: BlobType,
        id: BlockId,
        plain: Bytes,
        known: bool,
    ) -> Result<(), WriteError> {
        self.store_holding(kind, id, plain, known, None)
    }

    /// As [`Writer::store`], keeping `hold` as long as the writer holds the block's bytes, and
    /// dropping it then: once the block is compressed, or once its sealed bytes (its own
    /// buffer, when they do not compress) are copied into a pack; at once when the block is
    /// not stored. A caller bounds the memory of what it reads this way.
    pub fn store_holding(
        &mut self,
        kind: BlobType,
        id: BlockId,
        plain: Bytes,
        known: bool,
        hold: Option<Hold>,
    ) -> Result<(), WriteError> {
        if let Some(failure) = self.shared.failure() {
            return Err(WriteError(failure));
        }
        if known {
            self.reused.insert(kind, rustic_id(&id));
        }
        if known || !self.added.insert((kind, id)) {
            self.shared
                .state
                .lock()
                .expect("writer state")
                .stats
                .blocks_known += 1;
            return Ok(());
        }
        self.shared.admit(plain.len()).map_err(WriteError)?;
        let job = Job {
            sequence: self.sequence,
            kind,
            id,
            plain,
            hold,
        };
        self.sequence += 1;
        self.jobs
            .as_ref()
            .expect("the writer is open")
            .send(job)
            .map_err(|_| {
                WriteError(
                    self.shared
                        .failure()
                        .unwrap_or_else(|| "the writer stopped".into()),
                )
            })
    }

    /// Records blocks referenced as they are (a parent's content for an unchanged file): the
    /// caller found each in the index loaded at the start.
    pub fn reuse(&mut self, kind: BlobType, ids: impl IntoIterator<Item = Id>) {
        for id in ids {
            self.reused.insert(kind, id);
        }
    }

    /// Every block this run referenced so far, stored by it or found in the repository: each
    /// must be in a listed pack when the snapshot is saved ([`crate::prune::secure`]).
    pub fn take_referenced(&mut self) -> Referenced {
        let (mut referenced, stored) = self.take_referenced_apart();
        referenced.extend(stored);
        referenced
    }

    /// [`Writer::take_referenced`] in two: the blocks found in the index loaded at the start
    /// (`known` when stored, and those [`Writer::reuse`] recorded: its callers found them there
    /// too), and those this run stored itself ([`crate::prune::secure_after_load`]).
    pub fn take_referenced_apart(&mut self) -> (Referenced, Referenced) {
        let found = std::mem::take(&mut self.reused);
        let stored = self
            .added
            .drain()
            .map(|(kind, id)| (kind, rustic_id(&id)))
            .collect();
        (found, stored)
    }

    /// Stores the last blocks, uploads the last packs and writes the last index file.
    pub fn finish(mut self) -> Result<WriterStats, WriteError> {
        drop(self.jobs.take());
        for sealer in self.sealers.drain(..) {
            let _ = sealer.join();
        }
        {
            let mut state = self.shared.state.lock().expect("writer state");
            let packs = self.packs.as_ref().expect("the writer is open");
            for kind in [BlobType::Data, BlobType::Tree] {
                let builder = std::mem::take(match kind {
                    BlobType::Data => &mut state.data,
                    BlobType::Tree => &mut state.tree,
                });
                if !builder.blobs.is_empty() {
                    while state.failure.is_none()
                        && state.unstored >= self.shared.options.packs_unstored.max(1)
                    {
                        state = self.shared.sealed.wait(state).expect("writer state");
                    }
                    ship(&mut state, packs, FullPack { kind, builder });
                }
            }
        }
        drop(self.packs.take());
        for uploader in self.uploaders.drain(..) {
            let _ = uploader.join();
        }
        if let Some(failure) = self.shared.failure() {
            return Err(WriteError(failure));
        }
        let packs = std::mem::take(&mut self.shared.state.lock().expect("writer state").index);
        if !packs.is_empty() {
            write_index(&self.shared, packs).map_err(WriteError)?;
        }
        Ok(self.shared.state.lock().expect("writer state").stats)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Abandoned (the backup failed): stop the threads; what was uploaded stays for a
        // prune to find unused.
        self.shared.fail("the backup stopped".into());
        drop(self.jobs.take());
        drop(self.packs.take());
        for thread in self.sealers.drain(..).chain(self.uploaders.drain(..)) {
            let _ = thread.join();
        }
    }
}

/// A sealer's compressors (a zstd context is costly to make: one per thread, reused).
struct Compressors {
    block: zstd::bulk::Compressor<'static>,
    sample: zstd::bulk::Compressor<'static>,
}

impl Compressors {
    fn new(level: i32) -> std::io::Result<Compressors> {
        Ok(Compressors {
            block: zstd::bulk::Compressor::new(level)?,
            sample: zstd::bulk::Compressor::new(1)?,
        })
    }

    /// A block compressed when that makes it smaller: trees always, data unless a sample of
    /// it does not compress (already compressed or encrypted data is stored as it is).
    fn compress(&mut self, kind: BlobType, plain: &[u8]) -> Option<Vec<u8>> {
        const SAMPLE: usize = 64 << 10;
        if kind == BlobType::Data && plain.len() > SAMPLE {
            let sample = self.sample.compress(&plain[..SAMPLE]).ok()?;
            if sample.len() * 100 > SAMPLE * 95 {
                return None;
            }
        }
        let compressed = self.block.compress(plain).ok()?;
        (compressed.len() < plain.len()).then_some(compressed)
    }
}

fn seal(
    shared: &Shared,
    to_seal: &crossbeam_channel::Receiver<Job>,
    packs: &crossbeam_channel::Sender<FullPack>,
) {
    let mut compressors = match Compressors::new(shared.options.compression_level) {
        Ok(compressors) => compressors,
        Err(error) => {
            shared.fail(format!("starting zstd: {error}"));
            return;
        }
    };
    for job in to_seal {
        if shared.failure().is_some() {
            continue;
        }
        let Job {
            sequence,
            kind,
            id,
            plain,
            mut hold,
        } = job;
        let plain_length = plain.len() as u32;
        let compressed = compressors.compress(kind, &plain);
        let is_compressed = compressed.is_some();
        // Encrypted where it lies: in the compressor's output, or in the block's own buffer
        // (handed over whole by the reader, so taken without a copy).
        let mut body = match compressed {
            Some(compressed) => {
                // Not held while the sealed block waits for its turn or for room in a pack.
                drop(plain);
                drop(hold.take());
                compressed
            }
            None => Vec::from(bytes::BytesMut::from(plain)),
        };
        let seal = match shared.cipher.seal_in_place(&mut body) {
            Ok(seal) => seal,
            Err(error) => {
                shared.fail(format!("sealing a block: {error}"));
                continue;
            }
        };
        let mut guard = shared.state.lock().expect("writer state");
        guard.ready.insert(
            sequence,
            Sealed {
                kind,
                id,
                seal,
                body,
                plain_length,
                compressed: is_compressed,
                _hold: hold,
            },
        );
        // In order: a volume's blocks lie in its packs as its files do.
        loop {
            let state = &mut *guard;
            if state.failure.is_some() {
                // Sealed after the failure: never stored either.
                state.ready.clear();
                break;
            }
            let next = state.next;
            let Some(waiting) = state.ready.get(&next) else {
                break;
            };
            let (builder, limit) = match waiting.kind {
                BlobType::Data => (&state.data, shared.options.data_pack_bytes),
                BlobType::Tree => (&state.tree, shared.options.tree_pack_bytes),
            };
            if starts_pack(builder, limit, waiting.len())
                && state.unstored >= shared.options.packs_unstored.max(1)
            {
                // Room for another pack comes when one is stored (an uploader signals).
                guard = shared.sealed.wait(guard).expect("writer state");
                continue;
            }
            let sealed = state.ready.remove(&next).expect("it was there");
            state.next += 1;
            state.sealing -= sealed.plain_length as usize;
            shared.sealed.notify_all();
            state.stats.blocks_new += 1;
            state.stats.bytes_new += u64::from(sealed.plain_length);
            if sealed.kind == BlobType::Data {
                state.stats.data_blocks_new += 1;
                state.stats.data_bytes_new += u64::from(sealed.plain_length);
            }
            let (builder, limit) = match sealed.kind {
                BlobType::Data => (&mut state.data, shared.options.data_pack_bytes),
                BlobType::Tree => (&mut state.tree, shared.options.tree_pack_bytes),
            };
            let length = sealed.len() as u32;
            // A pack never grows past its size by more than one block: a block that does
            // not fit starts the next pack.
            let mut full = Vec::new();
            if !builder.blobs.is_empty() && builder.bytes.len() + sealed.len() > limit {
                full.push(std::mem::take(builder));
            }
            // A data pack's buffer is taken whole at once (it fills); a tree pack's grows
            // as trees come (a backup's trees are often far fewer bytes than a pack).
            if builder.bytes.capacity() == 0 && sealed.kind == BlobType::Data {
                builder
                    .bytes
                    .reserve(limit.max(sealed.len()) + PACK_HEADER_ROOM);
            }
            builder.blobs.push((
                sealed.id,
                builder.bytes.len() as u32,
                length,
                sealed
                    .compressed
                    .then(|| NonZeroU32::new(sealed.plain_length))
                    .flatten(),
            ));
            builder.bytes.extend_from_slice(&sealed.seal.nonce);
            builder.bytes.extend_from_slice(&sealed.body);
            builder.bytes.extend_from_slice(&sealed.seal.tag);
            if builder.bytes.len() >= limit {
                full.push(std::mem::take(builder));
            }
            for builder in full {
                ship(
                    state,
                    packs,
                    FullPack {
                        kind: sealed.kind,
                        builder,
                    },
                );
            }
        }
    }
}

/// Whether a sealed block of `length` bytes starts a new pack after `builder`'s.
fn starts_pack(builder: &PackBuilder, limit: usize, length: usize) -> bool {
    builder.blobs.is_empty() || builder.bytes.len() + length > limit
}

/// Hands a full pack to the uploaders, counting it until it is stored.
fn ship(state: &mut State, packs: &crossbeam_channel::Sender<FullPack>, pack: FullPack) {
    state.unstored += 1;
    state.stats.peak_packs_unstored = state.stats.peak_packs_unstored.max(state.unstored as u64);
    if packs.send(pack).is_err() {
        state.fail("the uploads stopped".into());
    }
}

/// restic's pack header entry type: data or tree, compressed or not.
fn entry_type(kind: BlobType, compressed: bool) -> u8 {
    match (kind, compressed) {
        (BlobType::Data, false) => 0,
        (BlobType::Tree, false) => 1,
        (BlobType::Data, true) => 2,
        (BlobType::Tree, true) => 3,
    }
}

fn upload(shared: &Shared, to_upload: &crossbeam_channel::Receiver<FullPack>) {
    for pack in to_upload {
        let stored = match shared.failure() {
            Some(_) => Ok(()),
            None => upload_pack(shared, pack),
        };
        let mut state = shared.state.lock().expect("writer state");
        state.unstored -= 1;
        if let Err(message) = stored {
            state.fail(message);
        }
        shared.sealed.notify_all();
    }
}

fn upload_pack(shared: &Shared, pack: FullPack) -> Result<(), String> {
    let FullPack { kind, builder } = pack;
    let mut header = Vec::with_capacity(builder.blobs.len() * 41);
    for (id, _, length, uncompressed) in &builder.blobs {
        header.push(entry_type(kind, uncompressed.is_some()));
        header.extend_from_slice(&length.to_le_bytes());
        if let Some(uncompressed) = uncompressed {
            header.extend_from_slice(&uncompressed.get().to_le_bytes());
        }
        header.extend_from_slice(id);
    }
    let header = shared
        .cipher
        .seal(&header)
        .map_err(|error| format!("sealing a pack header: {error}"))?;
    let mut bytes = builder.bytes;
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
    let bytes = bytes.freeze();
    let size = bytes.len();
    let pack_id: [u8; 32] = Sha256::digest(&bytes).into();
    let id = Id::new(pack_id);
    shared
        .backend
        .write_bytes(FileType::Pack, &id, false, bytes.into())
        .map_err(|error| error.display_log())?;
    let blobs = builder
        .blobs
        .into_iter()
        .map(|(blob, offset, length, uncompressed_length)| IndexedBlock {
            id: hex(&blob),
            kind,
            offset,
            length,
            uncompressed_length,
        })
        .collect();
    let ready = {
        let mut state = shared.state.lock().expect("writer state");
        state.stats.packs += 1;
        state.stats.bytes_uploaded += size as u64;
        state.index.push(IndexedPack {
            id: hex(&pack_id),
            blobs,
        });
        if state.index.len() >= shared.options.packs_per_index {
            std::mem::take(&mut state.index)
        } else {
            Vec::new()
        }
    };
    if !ready.is_empty() {
        write_index(shared, ready)?;
    }
    Ok(())
}

/// Writes an index file naming `packs` (all stored).
fn write_index(shared: &Shared, packs: Vec<IndexedPack>) -> Result<(), String> {
    save_index(
        shared.backend.as_ref(),
        &shared.cipher,
        &IndexJson { packs },
        shared.options.compression_level,
    )?;
    shared.state.lock().expect("writer state").stats.index_files += 1;
    Ok(())
}

/// The SHA-256 of `plain`: its block ID.
pub fn block_id(plain: &[u8]) -> BlockId {
    Sha256::digest(plain).into()
}

/// A block ID as rustic_core names it.
pub fn rustic_id(id: &BlockId) -> Id {
    Id::new(*id)
}

#[cfg(test)]
mod tests;
