//! Space comes back without losing what a snapshot needs.
//!
//! Forgetting a snapshot deletes only its snapshot file; its blocks stay until a prune. A prune
//! is restic's two-phase, lock-free prune as rustic_core runs it: a pack no remaining snapshot
//! needs is first *marked* (moved to the index's `packs_to_delete`, with the time), and only a
//! later prune deletes it, once it has been marked for [`DELETE_GRACE`] and still no snapshot
//! needs it; a marked pack a snapshot needs again is recovered. Nothing takes a lock, so
//! writers in other namespaces and clusters sharing the repository go on while a prune runs.
//!
//! What makes that safe is a rule for writers, which custody adds here. A backup reuses a
//! block only if the index it loaded at its start lists it in a pack that is not marked (a
//! marked pack's blocks are stored again). If a prune marks that pack while the backup runs
//! (or marks the packs the backup itself stored, whose snapshot does not exist yet), the pack
//! is deleted no sooner than [`DELETE_GRACE`] after the mark, so after the backup's start. The
//! backup therefore must save its snapshot within [`COMMIT_DEADLINE`] of loading the index
//! ([`may_commit`]), and before saving it lists again every marked pack holding a block its
//! snapshot names, so that no snapshot ever names a block only a marked pack holds (the
//! index readers load, restic's included, leaves marked packs out) ([`secure`]). The
//! deadline is shorter than the grace by [`CLOCK_ALLOWANCE`] (the mark and the deletion may be
//! timed by two hosts' clocks) and by [`PLANNING_LIMIT`] (a prune reads the snapshots before
//! it takes its time; one whose planning took longer does not act on it, [`may_execute`]).
//!
//! Timeline of the worst case, for a block in pack P reused by a backup B:
//! B loads the index (P listed) at `l`; a prune marks P at `m > l`; a later prune plans at
//! `p >= m + DELETE_GRACE` and read the snapshots at `r > p - PLANNING_LIMIT`; B saved its
//! snapshot at `c < l + COMMIT_DEADLINE < m + DELETE_GRACE - CLOCK_ALLOWANCE - PLANNING_LIMIT
//! <= r` (less the clocks' difference), so that prune saw B's snapshot and kept P.
//!
//! The grace is a constant, not a setting: every cluster writing the repository must use the
//! same one, and it is rustic's default, so a rustic prune of the same repository agrees.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use rustic_core::repofile::{
    BlobType, IndexFile, IndexId, IndexPack, SnapshotFile, SnapshotId, Tree,
};
use rustic_core::{FileType, Id, Open, PruneOptions, PrunePlan, Repository, WriteBackend};

use crate::crypto::Cipher;
use crate::index_file::save_index;

/// How long a marked pack stays before a prune may delete it (rustic's default).
pub const DELETE_GRACE: Duration = Duration::from_secs(23 * 3600);
/// How far apart the clocks of two hosts pruning the same repository may be.
pub const CLOCK_ALLOWANCE: Duration = Duration::from_secs(3600);
/// How long a prune may take between reading the snapshots and deciding.
pub const PLANNING_LIMIT: Duration = Duration::from_secs(3600);
/// How long a backup may take from loading the index to saving its snapshot.
pub const COMMIT_DEADLINE: Duration = Duration::from_secs(
    DELETE_GRACE.as_secs() - CLOCK_ALLOWANCE.as_secs() - PLANNING_LIMIT.as_secs(),
);

/// Blocks a backup's snapshot names: those it stored and those it found in the repository.
/// A set in no order (an unchanged backup inserts one entry per block of the volume, so the
/// cost of an insert counts); [`recovery`] orders what it reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Referenced(HashSet<(BlobType, Id), BuildHasherDefault<BlockHasher>>);

/// Hashes a block's kind and ID. IDs are SHA-256 digests, evenly spread already: folding their
/// words with a multiply (as rustc's FxHash does) spreads them as well as SipHash, at a
/// fraction of its cost, and nobody picks the IDs to collide.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockHasher(u64);

impl BlockHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for BlockHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.add(u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.add(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Referenced {
    pub fn insert(&mut self, kind: BlobType, id: Id) {
        self.0.insert((kind, id));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn extend(&mut self, other: Referenced) {
        self.0.extend(other.0);
    }

    pub fn iter(&self) -> impl Iterator<Item = &(BlobType, Id)> {
        self.0.iter()
    }
}

impl FromIterator<(BlobType, Id)> for Referenced {
    fn from_iter<I: IntoIterator<Item = (BlobType, Id)>>(iter: I) -> Self {
        Referenced(iter.into_iter().collect())
    }
}

/// Why a backup does not save its snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "the backup took {elapsed_minutes} min since it read the repository's index, longer than \
         the {deadline_minutes} min a backup may take: a prune may have deleted blocks it reused \
         (run it again: it reads the index anew)"
    )]
    TooLate {
        elapsed_minutes: u64,
        deadline_minutes: u64,
    },
    #[error(
        "{count} block(s) the backup's snapshot names are no longer in the repository (first: \
         {first}): run it again"
    )]
    Missing { count: usize, first: String },
    #[error("reading the repository's index before saving the snapshot: {0}")]
    Unreadable(String),
}

/// Whether a backup `elapsed` after loading the index may still save its snapshot.
pub fn may_commit(elapsed: Duration) -> Result<(), Refused> {
    if elapsed < COMMIT_DEADLINE {
        Ok(())
    } else {
        Err(Refused::TooLate {
            elapsed_minutes: elapsed.as_secs() / 60,
            deadline_minutes: COMMIT_DEADLINE.as_secs() / 60,
        })
    }
}

/// Where the referenced blocks are now.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Marked packs holding a referenced block no listed pack holds: list them again.
    pub relist: Vec<IndexPack>,
    /// Referenced blocks no pack in the index holds.
    pub missing: Vec<(BlobType, Id)>,
}

/// Which marked packs to list again so that every referenced block is in a listed pack, and
/// which referenced blocks are gone.
pub fn recovery(referenced: &Referenced, indexes: &[IndexFile]) -> Recovery {
    let listed: HashSet<(BlobType, Id), BuildHasherDefault<BlockHasher>> = indexes
        .iter()
        .flat_map(|index| &index.packs)
        .flat_map(|pack| &pack.blobs)
        .map(|blob| (blob.tpe, *blob.id))
        .collect();
    let mut marked: BTreeMap<(BlobType, Id), &IndexPack> = BTreeMap::new();
    for pack in indexes.iter().flat_map(|index| &index.packs_to_delete) {
        for blob in &pack.blobs {
            marked.entry((blob.tpe, *blob.id)).or_insert(pack);
        }
    }
    let mut unlisted: Vec<&(BlobType, Id)> = referenced
        .iter()
        .filter(|block| !listed.contains(*block))
        .collect();
    unlisted.sort_unstable();
    let mut recovery = Recovery::default();
    let mut relisted = BTreeSet::new();
    for block in unlisted {
        match marked.get(block) {
            Some(pack) => {
                if relisted.insert(pack.id) {
                    recovery.relist.push((*pack).clone());
                }
            }
            None => recovery.missing.push(*block),
        }
    }
    recovery
}

/// What [`secure`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Secured {
    /// Marked packs listed again (a prune had found them unused while the backup ran).
    pub relisted: usize,
}

/// Makes sure every block the backup's snapshot names is in a listed pack before the snapshot
/// is saved (a prune may have marked packs the backup reused, or the packs it stored itself
/// before their snapshot existed),
/// and that the backup is within its deadline; `elapsed` is the time since it loaded the
/// index. The snapshot must be saved right after.
pub fn secure<S: Open>(
    repository: &Repository<S>,
    backend: &dyn WriteBackend,
    cipher: &Cipher,
    referenced: &Referenced,
    elapsed: &dyn Fn() -> Duration,
) -> Result<Secured, Refused> {
    may_commit(elapsed())?;
    let indexes: Vec<IndexFile> = index_files(repository)
        .map_err(Refused::Unreadable)?
        .into_iter()
        .map(|(_, index)| index)
        .collect();
    relist_or_refuse(backend, cipher, referenced, &indexes, elapsed)
}

/// The end of [`secure`] and [`secure_after_load`]: the marked packs among `indexes` holding
/// a `referenced` block no listed pack holds are listed again, or the snapshot is refused if
/// a referenced block is in no pack at all (or the deadline passed meanwhile).
fn relist_or_refuse(
    backend: &dyn WriteBackend,
    cipher: &Cipher,
    referenced: &Referenced,
    indexes: &[IndexFile],
    elapsed: &dyn Fn() -> Duration,
) -> Result<Secured, Refused> {
    let Recovery { relist, missing } = recovery(referenced, indexes);
    if let Some(first) = missing.first() {
        return Err(Refused::Missing {
            count: missing.len(),
            first: format!("{} {}", first.0, first.1),
        });
    }
    let relisted = relist.len();
    save_relisted(backend, cipher, relist).map_err(Refused::Unreadable)?;
    may_commit(elapsed())?;
    Ok(Secured { relisted })
}

/// [`secure`] for a backup that knows which index files the index it loaded at its start
/// came from (`loaded`, as rustic_core's `to_indexed` listed them), and which referenced
/// blocks it `found` there and which it `stored` itself ([`crate::writer::Writer::take_referenced_apart`]).
///
/// Index files never change (each is named by the hash of what it holds), and the index a
/// reader loads is the packs the listed files list as not marked. So while every loaded file
/// is still listed ([`loaded_still_listed`]), every found block is still in a listed pack,
/// and only the stored blocks are looked for, in the index files written since: this run's,
/// and any a prune wrote marking them. Only those are read, not the whole index again. Once
/// a loaded file is gone (a prune rewrote it meanwhile), every listed file is read, as
/// [`secure`] does.
pub fn secure_after_load<S: Open>(
    repository: &Repository<S>,
    backend: &dyn WriteBackend,
    cipher: &Cipher,
    loaded: &[Id],
    (found, stored): (&Referenced, &Referenced),
    elapsed: &dyn Fn() -> Duration,
) -> Result<Secured, Refused> {
    may_commit(elapsed())?;
    let listed: Vec<IndexId> = repository
        .list::<IndexId>()
        .map_err(|error| Refused::Unreadable(error.display_log()))?
        .collect();
    let now: HashSet<Id> = listed.iter().map(|id| **id).collect();
    if !loaded_still_listed(loaded, &now) {
        let mut referenced = found.clone();
        referenced.extend(stored.clone());
        return secure(repository, backend, cipher, &referenced, elapsed);
    }
    let loaded: HashSet<&Id> = loaded.iter().collect();
    let written: Vec<IndexId> = listed
        .into_iter()
        .filter(|id| !loaded.contains(&**id))
        .collect();
    let mut indexes = Vec::with_capacity(written.len());
    for file in repository
        .stream_files_list::<IndexFile>(written)
        .map_err(|error| Refused::Unreadable(error.display_log()))?
    {
        let (_, index) = file.map_err(|error| Refused::Unreadable(error.display_log()))?;
        indexes.push(index);
    }
    relist_or_refuse(backend, cipher, stored, &indexes, elapsed)
}

/// Whether every index file a backup loaded at its start is still listed `now`: then every
/// pack its index held is still listed, by the same files.
pub fn loaded_still_listed(loaded: &[Id], now: &HashSet<Id>) -> bool {
    loaded.iter().all(|id| now.contains(id))
}

/// Whether a prune whose planning took `planning` may act on its plan.
pub fn may_execute(planning: Duration) -> Result<(), PruneError> {
    if planning < PLANNING_LIMIT {
        Ok(())
    } else {
        Err(PruneError::PlanningTooLong {
            minutes: planning.as_secs() / 60,
            limit_minutes: PLANNING_LIMIT.as_secs() / 60,
        })
    }
}

/// rustic_core's prune as custody runs it: never deletes at once, the grace above.
pub fn options() -> PruneOptions {
    let mut options = PruneOptions::default();
    options.keep_delete = rustic_core::jiff::Span::new()
        .seconds(i64::try_from(DELETE_GRACE.as_secs()).expect("the grace is hours"));
    options.instant_delete = false;
    options.early_delete_index = false;
    options
}

/// Why a prune did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PruneError {
    #[error(
        "planning the prune took {minutes} min, more than {limit_minutes} min: a backup may have \
         saved a snapshot meanwhile; nothing was changed (run it again)"
    )]
    PlanningTooLong { minutes: u64, limit_minutes: u64 },
    #[error("{0}")]
    Repository(String),
}

/// What a prune found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    /// Packs deleted (marked for at least the grace, still unneeded).
    pub packs_deleted: u64,
    /// Packs marked for deletion by this prune (deleted by a prune after the grace).
    pub packs_marked: u64,
    /// Marked packs a snapshot needed again, listed again.
    pub packs_recovered: u64,
    /// Packs repacked (their needed blocks copied, the pack then marked).
    pub packs_repacked: u64,
    /// Packs no index names (an interrupted backup's), marked.
    pub packs_unreferenced: u64,
    /// Packs this prune marked that a snapshot saved while it ran names, listed again.
    pub packs_relisted: u64,
    /// Bytes deleted now.
    pub bytes_deleted: u64,
    /// Bytes that will be deleted once their grace has passed.
    pub bytes_marked: u64,
    /// Bytes of blocks some snapshot needs, after the prune.
    pub bytes_used: u64,
}

/// A prune decided, not yet carried out.
pub struct Planned {
    plan: PrunePlan,
    /// rustic_core 0.13 saves its marks of unreferenced packs only when it rewrites some index
    /// file: with none to rewrite they are lost and the packs stay forever. custody marks them
    /// itself then.
    mark_unreferenced: bool,
    /// The snapshots that existed before the plan read them.
    known: BTreeSet<Id>,
    report: PruneReport,
}

impl Planned {
    /// What the plan will do.
    pub fn report(&self) -> &PruneReport {
        &self.report
    }
}

/// Decides what to mark, delete, recover and repack.
pub fn plan<S: Open>(repository: &Repository<S>) -> Result<Planned, PruneError> {
    let known = snapshots(repository)?;
    let plan = repository
        .prune_plan(&options())
        .map_err(|error| PruneError::Repository(error.display_log()))?;
    let stats = &plan.stats;
    let size = stats.size_sum();
    let report = PruneReport {
        packs_deleted: stats.packs_to_delete.remove,
        packs_marked: stats.packs.unused,
        packs_recovered: stats.packs_to_delete.recover,
        packs_repacked: stats.packs.repack,
        packs_unreferenced: stats.packs_unref,
        packs_relisted: 0,
        bytes_deleted: stats.size_to_delete.remove,
        bytes_marked: size.remove + size.repackrm + stats.size_unref,
        bytes_used: size.used,
    };
    Ok(Planned {
        mark_unreferenced: stats.packs_unref > 0 && stats.index_files_rebuild == 0,
        plan,
        known,
        report,
    })
}

/// Carries out a plan made `planning` ago; then, for every snapshot saved while the prune ran
/// (its plan did not see them), lists again the packs it marked that those snapshots name, so
/// that they read at once rather than after the next prune.
pub fn execute<S: Open>(
    repository: &Repository<S>,
    backend: &dyn WriteBackend,
    planned: Planned,
    planning: Duration,
) -> Result<PruneReport, PruneError> {
    may_execute(planning)?;
    let Planned {
        plan,
        mark_unreferenced,
        known,
        mut report,
    } = planned;
    repository
        .prune(&options(), plan)
        .map_err(|error| PruneError::Repository(error.display_log()))?;
    if mark_unreferenced {
        report.packs_unreferenced = mark_unreferenced_packs(repository, backend)?;
    }
    let saved_meanwhile: Vec<Id> = snapshots(repository)?.difference(&known).copied().collect();
    if !saved_meanwhile.is_empty() {
        report.packs_relisted = relist_for(repository, backend, &saved_meanwhile)?;
    }
    Ok(report)
}

/// Prunes the repository (see the module's documentation).
pub fn prune<S: Open>(
    repository: &Repository<S>,
    backend: &dyn WriteBackend,
) -> Result<PruneReport, PruneError> {
    let started = Instant::now();
    let planned = plan(repository)?;
    execute(repository, backend, planned, started.elapsed())
}

fn snapshots<S: Open>(repository: &Repository<S>) -> Result<BTreeSet<Id>, PruneError> {
    Ok(repository
        .list::<SnapshotId>()
        .map_err(|error| PruneError::Repository(error.display_log()))?
        .map(|id| *id)
        .collect())
}

/// Where each block is, in listed and marked packs alike.
struct Locations(HashMap<(BlobType, Id), (Id, u32, u32, bool)>);

impl Locations {
    fn of(indexes: &[IndexFile]) -> Locations {
        let mut found = HashMap::new();
        for pack in indexes
            .iter()
            .flat_map(|index| index.packs.iter().chain(&index.packs_to_delete))
        {
            for blob in &pack.blobs {
                found.entry((blob.tpe, *blob.id)).or_insert((
                    *pack.id,
                    blob.location.offset,
                    blob.location.length,
                    blob.location.uncompressed_length.is_some(),
                ));
            }
        }
        Locations(found)
    }

    /// A tree, read from its pack whether the pack is marked or not.
    fn tree(
        &self,
        backend: &dyn WriteBackend,
        cipher: &Cipher,
        id: Id,
    ) -> Result<Tree, PruneError> {
        let unreadable = |why: String| PruneError::Repository(format!("tree {id}: {why}"));
        let &(pack, offset, length, compressed) = self
            .0
            .get(&(BlobType::Tree, id))
            .ok_or_else(|| unreadable("in no pack".into()))?;
        let sealed = backend
            .read_partial(FileType::Pack, &pack, true, offset, length)
            .map_err(|error| unreadable(error.display_log()))?;
        let plain = cipher
            .open(&sealed)
            .map_err(|error| unreadable(error.to_string()))?;
        let plain = if compressed {
            zstd::decode_all(plain.as_slice()).map_err(|error| unreadable(error.to_string()))?
        } else {
            plain
        };
        serde_json::from_slice(&plain).map_err(|error| unreadable(error.to_string()))
    }
}

/// Marks the packs no index file names (as a prune marks them); how many.
fn mark_unreferenced_packs<S: Open>(
    repository: &Repository<S>,
    backend: &dyn WriteBackend,
) -> Result<u64, PruneError> {
    let cipher = Cipher::new(&repository.key())
        .map_err(|error| PruneError::Repository(error.to_string()))?;
    // The index first: a pack stored after it was read is marked, and listed again by the
    // index its writer saves (a listed pack is not marked).
    let indexed: HashSet<Id> = index_files(repository)
        .map_err(PruneError::Repository)?
        .iter()
        .flat_map(|(_, index)| index.packs.iter().chain(&index.packs_to_delete))
        .map(|pack| *pack.id)
        .collect();
    let now = rustic_core::jiff::Timestamp::now();
    let unreferenced: Vec<IndexPack> = backend
        .list_with_size(FileType::Pack)
        .map_err(|error| PruneError::Repository(error.display_log()))?
        .into_iter()
        .filter(|(id, _)| !indexed.contains(id))
        .map(|(id, size)| IndexPack {
            id: id.into(),
            size: Some(size),
            time: Some(now),
            blobs: Vec::new(),
        })
        .collect();
    let count = unreferenced.len() as u64;
    if count > 0 {
        let index = IndexFile {
            packs_to_delete: unreferenced,
            ..IndexFile::default()
        };
        save_index(backend, &cipher, &index, 3).map_err(PruneError::Repository)?;
    }
    Ok(count)
}

/// Every index file of the repository, with its ID.
fn index_files<S: Open>(repository: &Repository<S>) -> Result<Vec<(Id, IndexFile)>, String> {
    repository
        .stream_files::<IndexFile>()
        .map_err(|error| error.display_log())?
        .map(|file| file.map(|(id, index)| (*id, index)))
        .collect::<Result<_, _>>()
        .map_err(|error| error.display_log())
}

/// Lists again the marked packs holding blocks the `snapshots` name; how many.
fn relist_for<S: Open>(
    repository: &Repository<S>,
    backend: &dyn WriteBackend,
    snapshots: &[Id],
) -> Result<u64, PruneError> {
    let cipher = Cipher::new(&repository.key())
        .map_err(|error| PruneError::Repository(error.to_string()))?;
    let indexes: Vec<IndexFile> = index_files(repository)
        .map_err(PruneError::Repository)?
        .into_iter()
        .map(|(_, index)| index)
        .collect();
    let locations = Locations::of(&indexes);
    let mut referenced = Referenced::default();
    let mut trees: Vec<Id> = Vec::new();
    for id in snapshots {
        match repository.get_file::<SnapshotFile>(&SnapshotId::from(*id)) {
            Ok(snapshot) => trees.push(*snapshot.tree),
            // Forgotten meanwhile: nothing to keep for it.
            Err(_) => continue,
        }
    }
    while let Some(id) = trees.pop() {
        if referenced.0.contains(&(BlobType::Tree, id)) {
            continue;
        }
        referenced.insert(BlobType::Tree, id);
        for node in locations.tree(backend, &cipher, id)?.nodes {
            for data in node.content.iter().flatten() {
                referenced.insert(BlobType::Data, **data);
            }
            if let Some(subtree) = node.subtree {
                trees.push(*subtree);
            }
        }
    }
    let Recovery { relist, missing } = recovery(&referenced, &indexes);
    if let Some(first) = missing.first() {
        return Err(PruneError::Repository(format!(
            "{} block(s) a snapshot saved during the prune names are in no pack (first: {} {})",
            missing.len(),
            first.0,
            first.1
        )));
    }
    let relisted = relist.len() as u64;
    save_relisted(backend, &cipher, relist).map_err(PruneError::Repository)?;
    Ok(relisted)
}

/// Writes an index file listing `packs` (marked ones, whole) as packs in use again; a later
/// prune drops their marks (a pack listed anywhere is not marked).
fn save_relisted(
    backend: &dyn WriteBackend,
    cipher: &Cipher,
    packs: Vec<IndexPack>,
) -> Result<(), String> {
    if packs.is_empty() {
        return Ok(());
    }
    let now = rustic_core::jiff::Timestamp::now();
    let index = IndexFile {
        packs: packs
            .into_iter()
            .map(|pack| IndexPack {
                time: Some(now),
                ..pack
            })
            .collect(),
        ..IndexFile::default()
    };
    save_index(backend, cipher, &index, 3).map(|_| ())
}

/// Moves every time the index records back by `by`: what `by` passing does to a prune's view
/// of its marks. For tests of the grace only (a prune 24 h later cannot wait 24 h there).
#[doc(hidden)]
pub fn backdate_index<S: Open>(
    repository: &Repository<S>,
    backend: &dyn WriteBackend,
    by: Duration,
) -> Result<(), String> {
    let cipher = Cipher::new(&repository.key()).map_err(|error| error.to_string())?;
    let by = rustic_core::jiff::SignedDuration::try_from(by).map_err(|error| error.to_string())?;
    let files = index_files(repository)?;
    for (id, mut index) in files {
        let mut changed = false;
        for pack in index
            .packs
            .iter_mut()
            .chain(index.packs_to_delete.iter_mut())
        {
            if let Some(time) = pack.time.as_mut() {
                *time = time.checked_sub(by).map_err(|error| error.to_string())?;
                changed = true;
            }
        }
        if changed {
            save_index(backend, &cipher, &index, 3)?;
            backend
                .remove(FileType::Index, &id, true)
                .map_err(|error| error.display_log())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
