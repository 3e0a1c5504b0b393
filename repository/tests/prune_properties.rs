//! Property tests of forget and prune with writers running at the same time: generated
//! histories of backups (each loading the index, storing, then securing and saving its
//! snapshot, or crashing half-way), forgets, prunes (planned, then carried out, with other
//! steps in between) and time passing, run against real repositories (custody's writer,
//! rustic_core's prune, custody's rules in `prune`), in memory so that each history takes
//! milliseconds.
//!
//! After every step, every snapshot saved and not forgotten must read back whole through the
//! index; at the end, once every snapshot is forgotten and the grace has passed twice, no pack
//! is left (space comes back). `CUSTODY_PRUNE_CASES` sets how many histories run (CI runs
//! the default; `hack/prune-properties.sh` runs 100,000), `CUSTODY_PRUNE_SEED` the first seed.
//! A failure prints the seed and the history that broke.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use custody_repository::crypto::Cipher;
use custody_repository::memory::MemoryBackend;
use custody_repository::open::{self, Password};
use custody_repository::prune::{self, Referenced, Refused};
use custody_repository::writer::{self, Writer, WriterOptions};
use rustic_core::repofile::{BlobType, Metadata, Node, NodeType, SnapshotFile, Tree};
use rustic_core::{
    BlobId, DataId, FileType, Id, OpenStatus, Repository, RepositoryBackends, SnapshotOptions,
    TreeId, WriteBackend,
};

const HOUR: Duration = Duration::from_secs(3600);

/// A small deterministic generator (SplitMix64): a history is its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The block contents backups choose from: small, so that packs hold several.
fn pool() -> Vec<Bytes> {
    (0..24u64)
        .map(|i| {
            let mut rng = Rng(i * 7919 + 1);
            let len = 40 + rng.below(200);
            Bytes::from((0..len).map(|_| rng.next() as u8).collect::<Vec<_>>())
        })
        .collect()
}

struct Base {
    backend: MemoryBackend,
    master_key: String,
}

/// One repository, created once (its key derivation is slow); each history copies it.
fn base() -> Base {
    let backend = MemoryBackend::new();
    let backends = RepositoryBackends::new(Arc::new(backend.clone()), None);
    let opened = open::init(
        &backends,
        &Password {
            name: "properties".into(),
            value: "properties".into(),
        },
    )
    .expect("a repository in memory");
    let master_key = serde_json::to_string(&opened.repository.key()).expect("a key as JSON");
    Base {
        backend,
        master_key,
    }
}

/// A backup in progress.
struct Backup {
    /// Simulated time at which it loaded the index.
    started: Duration,
    blocks: Vec<usize>,
    /// What the index it loaded listed.
    listed: BTreeSet<(BlobType, Id)>,
    stored: Option<Stored>,
    /// How it secures its blocks before saving its snapshot, chosen at its start.
    check: Check,
}

/// The two ways a backup makes sure of its blocks before saving its snapshot.
enum Check {
    /// `secure`: every index file read then.
    Whole,
    /// `secure_after_load` with the index files its index was loaded from (as a mover does).
    Loaded(Vec<Id>),
}

struct Stored {
    /// Blocks found in the index loaded at the start, and blocks this backup stored.
    found: Referenced,
    stored: Referenced,
    tree: TreeId,
}

/// A saved snapshot and what it needs.
struct Saved {
    id: Id,
    tree: TreeId,
    blocks: Vec<usize>,
}

struct History {
    rng: Rng,
    backend: MemoryBackend,
    master_key: String,
    pool: Arc<Vec<Bytes>>,
    now: Duration,
    backups: Vec<Backup>,
    saved: Vec<Saved>,
    plan: Option<(Duration, prune::Planned)>,
    log: Vec<String>,
    refused_late: u64,
    relisted: u64,
    relisted_by_prunes: u64,
}

impl History {
    /// A history of `seed` on a copy of the base repository.
    fn new(base: &Base, pool: &Arc<Vec<Bytes>>, seed: u64) -> History {
        History {
            rng: Rng(seed),
            backend: base.backend.copy(),
            master_key: base.master_key.clone(),
            pool: pool.clone(),
            now: Duration::ZERO,
            backups: Vec::new(),
            saved: Vec::new(),
            plan: None,
            log: Vec::new(),
            refused_late: 0,
            relisted: 0,
            relisted_by_prunes: 0,
        }
    }

    fn repository(&self) -> Repository<OpenStatus> {
        let backends = RepositoryBackends::new(Arc::new(self.backend.clone()), None);
        open::open_with_master_key(&backends, &self.master_key)
            .expect("the repository opens")
            .0
    }

    fn cipher(&self) -> Cipher {
        Cipher::new(&self.repository().key()).expect("a cipher")
    }

    fn fail(&self, seed: u64, what: String) -> ! {
        panic!("seed {seed}: {what}\nhistory:\n  {}", self.log.join("\n  "))
    }

    fn step(&mut self, seed: u64) {
        let choice = self.rng.below(100);
        match choice {
            0..=19 => self.start(),
            20..=34 => self.store(),
            35..=49 => self.commit(seed),
            50..=59 => self.forget(),
            60..=71 => self.plan(seed),
            72..=83 => self.execute(seed),
            84..=94 => self.pass_time(),
            _ => self.crash(),
        }
    }

    fn start(&mut self) {
        if self.backups.len() >= 3 {
            return;
        }
        // The files the index is loaded from (nothing else runs meanwhile).
        let loaded = self.backend.ids(FileType::Index);
        let repository = self.repository().to_indexed().expect("the index loads");
        let mut listed = BTreeSet::new();
        for block in self.pool.iter() {
            let id = writer::rustic_id(&writer::block_id(block));
            if repository.get_index_entry(&DataId::from(id)).is_ok() {
                listed.insert((BlobType::Data, id));
            }
        }
        let count = 1 + self.rng.below(8);
        let blocks: Vec<usize> = (0..count)
            .map(|_| self.rng.below(self.pool.len()))
            .collect();
        // The tree it will write, if the index holds it already.
        let tree = tree_of(&self.pool, &blocks);
        let tree_id = writer::rustic_id(&writer::block_id(&tree));
        if repository.get_index_entry(&TreeId::from(tree_id)).is_ok() {
            listed.insert((BlobType::Tree, tree_id));
        }
        self.log.push(format!(
            "t={}h backup {} starts: blocks {blocks:?}, {} known",
            self.now.as_secs() / 3600,
            self.backups.len(),
            listed.len()
        ));
        let check = match self.rng.below(2) {
            0 => Check::Whole,
            _ => Check::Loaded(loaded),
        };
        self.backups.push(Backup {
            started: self.now,
            blocks,
            listed,
            stored: None,
            check,
        });
    }

    fn writer(&self) -> Writer {
        Writer::new(
            Arc::new(self.backend.clone()) as Arc<dyn WriteBackend>,
            self.cipher(),
            WriterOptions {
                data_pack_bytes: 500,
                tree_pack_bytes: 300,
                sealers: 1,
                uploads: 1,
                ..WriterOptions::default()
            },
        )
    }

    fn store(&mut self) {
        let Some(at) = self
            .backups
            .iter()
            .position(|backup| backup.stored.is_none())
        else {
            return;
        };
        let mut writer = self.writer();
        let backup = &self.backups[at];
        for &block in &backup.blocks {
            let id = writer::block_id(&self.pool[block]);
            let known = backup
                .listed
                .contains(&(BlobType::Data, writer::rustic_id(&id)));
            writer
                .store(BlobType::Data, id, self.pool[block].clone(), known)
                .expect("a block is stored");
        }
        let tree = tree_of(&self.pool, &backup.blocks);
        let tree_id = writer::block_id(&tree);
        let known = backup
            .listed
            .contains(&(BlobType::Tree, writer::rustic_id(&tree_id)));
        writer
            .store(BlobType::Tree, tree_id, tree, known)
            .expect("a tree is stored");
        let (found, stored) = writer.take_referenced_apart();
        writer.finish().expect("the packs and index are stored");
        self.log.push(format!(
            "t={}h backup {at} stored ({} reused, {} stored)",
            self.now.as_secs() / 3600,
            found.len(),
            stored.len()
        ));
        self.backups[at].stored = Some(Stored {
            found,
            stored,
            tree: TreeId::from(writer::rustic_id(&tree_id)),
        });
    }

    fn commit(&mut self, seed: u64) {
        let Some(at) = self
            .backups
            .iter()
            .position(|backup| backup.stored.is_some())
        else {
            return;
        };
        let backup = self.backups.remove(at);
        let stored = backup.stored.expect("stored");
        let elapsed = self.now - backup.started;
        let repository = self.repository();
        let cipher = self.cipher();
        let mut referenced = stored.found.clone();
        referenced.extend(stored.stored.clone());
        let secured = match backup.check {
            Check::Whole => {
                prune::secure(&repository, &self.backend, &cipher, &referenced, &|| {
                    elapsed
                })
            }
            Check::Loaded(loaded) => prune::secure_after_load(
                &repository,
                &self.backend,
                &cipher,
                &loaded,
                (&stored.found, &stored.stored),
                &|| elapsed,
            ),
        };
        match secured {
            Ok(secured) => {
                self.relisted += secured.relisted as u64;
                let mut snapshot: SnapshotFile = SnapshotOptions::default()
                    .to_snapshot()
                    .expect("a snapshot");
                snapshot.tree = stored.tree;
                repository
                    .save_snapshots(vec![snapshot])
                    .expect("the snapshot is saved");
                let ids: BTreeSet<Id> = self.backend.ids(FileType::Snapshot).into_iter().collect();
                let known: BTreeSet<Id> = self.saved.iter().map(|saved| saved.id).collect();
                let id = *ids.difference(&known).next().expect("a new snapshot file");
                self.log.push(format!(
                    "t={}h backup {at} saved snapshot {} ({} packs listed again)",
                    self.now.as_secs() / 3600,
                    &id.to_hex()[..8],
                    secured.relisted
                ));
                self.saved.push(Saved {
                    id,
                    tree: stored.tree,
                    blocks: backup.blocks,
                });
            }
            Err(Refused::TooLate { .. }) => {
                if elapsed < prune::COMMIT_DEADLINE {
                    self.fail(seed, format!("refused as late after {elapsed:?}"));
                }
                self.refused_late += 1;
                self.log.push(format!(
                    "t={}h backup {at} refused: too late",
                    self.now.as_secs() / 3600
                ));
            }
            Err(other) => self.fail(
                seed,
                format!("backup {at} within its deadline ({elapsed:?}) was refused: {other}"),
            ),
        }
    }

    fn crash(&mut self) {
        if self.backups.is_empty() {
            return;
        }
        let at = self.rng.below(self.backups.len());
        let backup = self.backups.remove(at);
        if backup.stored.is_none() {
            // Crashes half-way: some packs stored, no index.
            let mut writer = self.writer();
            for &block in &backup.blocks {
                let id = writer::block_id(&self.pool[block]);
                let _ = writer.store(BlobType::Data, id, self.pool[block].clone(), false);
            }
            drop(writer);
        }
        self.log.push(format!(
            "t={}h backup {at} crashed",
            self.now.as_secs() / 3600
        ));
    }

    fn forget(&mut self) {
        if self.saved.is_empty() {
            return;
        }
        let at = self.rng.below(self.saved.len());
        let saved = self.saved.remove(at);
        self.repository()
            .delete_snapshots(&[saved.id.into()])
            .expect("the snapshot is forgotten");
        self.log.push(format!(
            "t={}h forget {}",
            self.now.as_secs() / 3600,
            &saved.id.to_hex()[..8]
        ));
    }

    fn plan(&mut self, seed: u64) {
        if self.plan.is_some() {
            return;
        }
        let plan = match prune::plan(&self.repository()) {
            Ok(plan) => plan,
            Err(error) => self.fail(seed, format!("planning a prune: {error}")),
        };
        let report = plan.report();
        self.log.push(format!(
            "t={}h prune planned: delete {}, mark {}, recover {}, repack {}, unreferenced {}",
            self.now.as_secs() / 3600,
            report.packs_deleted,
            report.packs_marked,
            report.packs_recovered,
            report.packs_repacked,
            report.packs_unreferenced,
        ));
        self.plan = Some((self.now, plan));
    }

    fn execute(&mut self, seed: u64) {
        let Some((planned, plan)) = self.plan.take() else {
            return;
        };
        match prune::execute(&self.repository(), &self.backend, plan, self.now - planned) {
            Ok(report) => {
                self.relisted_by_prunes += report.packs_relisted;
                self.log.push(format!(
                    "t={}h prune carried out ({} packs listed again)",
                    self.now.as_secs() / 3600,
                    report.packs_relisted
                ))
            }
            Err(prune::PruneError::PlanningTooLong { .. }) => self.log.push(format!(
                "t={}h prune refused: planned too long ago",
                self.now.as_secs() / 3600
            )),
            Err(error) => self.fail(seed, format!("pruning: {error}")),
        }
    }

    /// Time passes: every time the index records moves back (what a clock moving on does to
    /// a prune's view of them). Only between prunes: a plan is acted on within minutes.
    fn pass_time(&mut self) {
        if self.plan.is_some() {
            return;
        }
        let by = [HOUR, HOUR, 3 * HOUR, 10 * HOUR, 22 * HOUR, 24 * HOUR][self.rng.below(6)];
        self.age(by);
    }

    fn age(&mut self, by: Duration) {
        self.now += by;
        prune::backdate_index(&self.repository(), &self.backend, by).expect("backdated");
        self.log.push(format!(
            "t={}h ({}h passed)",
            self.now.as_secs() / 3600,
            by.as_secs() / 3600
        ));
    }

    /// Every saved snapshot reads back whole through the index.
    fn check(&self, seed: u64) {
        if self.saved.is_empty() {
            return;
        }
        let repository = match self.repository().to_indexed() {
            Ok(repository) => repository,
            Err(error) => self.fail(seed, format!("the index: {}", error.display_log())),
        };
        for saved in &self.saved {
            let tree = repository
                .get_blob_cached(&BlobId::from(*saved.tree), BlobType::Tree)
                .unwrap_or_else(|error| {
                    self.fail(
                        seed,
                        format!(
                            "snapshot {}: its tree: {}",
                            &saved.id.to_hex()[..8],
                            error.display_log()
                        ),
                    )
                });
            if tree != tree_of(&self.pool, &saved.blocks) {
                self.fail(
                    seed,
                    format!("snapshot {}: its tree changed", &saved.id.to_hex()[..8]),
                );
            }
            for &block in &saved.blocks {
                let id = writer::rustic_id(&writer::block_id(&self.pool[block]));
                match repository.get_blob_cached(&BlobId::from(id), BlobType::Data) {
                    Ok(bytes) if bytes == self.pool[block] => {}
                    Ok(_) => self.fail(seed, format!("block {block} reads back changed")),
                    Err(error) => self.fail(
                        seed,
                        format!(
                            "snapshot {}: block {block} is lost: {}",
                            &saved.id.to_hex()[..8],
                            error.display_log()
                        ),
                    ),
                }
            }
        }
    }

    /// Every snapshot forgotten, the grace passed twice: no pack is left.
    fn reclaim(&mut self, seed: u64) {
        self.plan = None;
        self.backups.clear();
        while !self.saved.is_empty() {
            self.forget();
        }
        for _ in 0..2 {
            if let Err(error) = prune::prune(&self.repository(), &self.backend) {
                self.fail(seed, format!("the last prunes: {error}"));
            }
            self.age(prune::DELETE_GRACE + HOUR);
        }
        if let Err(error) = prune::prune(&self.repository(), &self.backend) {
            self.fail(seed, format!("the last prune: {error}"));
        }
        let left = self.backend.ids(FileType::Pack).len();
        if left != 0 {
            self.fail(seed, format!("{left} pack(s) left with no snapshot"));
        }
    }
}

/// A snapshot's tree: one file whose content is `blocks`.
fn tree_of(pool: &[Bytes], blocks: &[usize]) -> Bytes {
    let mut node = Node::new_node(OsStr::new("file"), NodeType::File, Metadata::default());
    node.content = Some(
        blocks
            .iter()
            .map(|&block| DataId::from(writer::rustic_id(&writer::block_id(&pool[block]))))
            .collect(),
    );
    let mut json = serde_json::to_vec(&Tree { nodes: vec![node] }).expect("a tree");
    json.push(b'\n');
    Bytes::from(json)
}

#[derive(Default)]
struct Totals {
    histories: u64,
    steps: u64,
    saved: u64,
    refused_late: u64,
    relisted: u64,
    relisted_by_prunes: u64,
}

fn run(base: &Base, pool: &Arc<Vec<Bytes>>, seed: u64, steps: usize, totals: &mut Totals) {
    let mut history = History::new(base, pool, seed);
    for _ in 0..steps {
        history.step(seed);
        history.check(seed);
        totals.steps += 1;
    }
    totals.saved += history
        .log
        .iter()
        .filter(|line| line.contains("saved snapshot"))
        .count() as u64;
    totals.refused_late += history.refused_late;
    totals.relisted += history.relisted;
    totals.relisted_by_prunes += history.relisted_by_prunes;
    history.reclaim(seed);
    totals.histories += 1;
}

#[test]
fn no_saved_snapshot_ever_loses_a_block_to_a_prune_and_forgotten_space_comes_back() {
    let cases: u64 = std::env::var("CUSTODY_PRUNE_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(300);
    let first: u64 = std::env::var("CUSTODY_PRUNE_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1);
    let base = base();
    let pool = Arc::new(pool());
    let started = std::time::Instant::now();
    let workers = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    let totals = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..workers)
            .map(|worker| {
                let (base, pool) = (&base, &pool);
                scope.spawn(move || {
                    let mut totals = Totals::default();
                    for seed in (first..first + cases).filter(|seed| seed % workers == worker) {
                        run(base, pool, seed, 30, &mut totals);
                    }
                    totals
                })
            })
            .collect();
        let mut totals = Totals::default();
        for run in runs {
            let part = run
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            totals.histories += part.histories;
            totals.steps += part.steps;
            totals.saved += part.saved;
            totals.refused_late += part.refused_late;
            totals.relisted += part.relisted;
            totals.relisted_by_prunes += part.relisted_by_prunes;
        }
        totals
    });
    eprintln!(
        "prune properties: {} histories ({} steps) in {:.1} s: {} snapshots saved, {} backups \
         refused as too late, marked packs listed again: {} by a backup, {} by a prune",
        totals.histories,
        totals.steps,
        started.elapsed().as_secs_f64(),
        totals.saved,
        totals.refused_late,
        totals.relisted,
        totals.relisted_by_prunes
    );
    // The histories must reach the cases that matter, or they prove nothing.
    assert!(totals.saved > totals.histories, "too few snapshots saved");
    assert!(totals.refused_late > 0, "no backup ran past its deadline");
    assert!(
        totals.relisted > 0,
        "no backup found a block it names in a marked pack"
    );
    assert!(
        totals.relisted_by_prunes > 0,
        "no prune marked a pack a snapshot saved meanwhile names"
    );
}

/// The rules' reason to exist: without the deadline a history loses a block.
#[test]
fn a_backup_that_outlives_the_grace_would_lose_a_block_without_the_deadline() {
    let base = base();
    let pool = Arc::new(pool());
    let mut history = History::new(&base, &pool, 7);
    // Snapshot A holds blocks 0..4.
    history.backups.push(Backup {
        started: Duration::ZERO,
        blocks: vec![0, 1, 2, 3],
        listed: BTreeSet::new(),
        stored: None,
        check: Check::Whole,
    });
    history.store();
    history.commit(0);
    // Backup B loads the index (A's blocks listed) and reuses them.
    let repository = history.repository().to_indexed().expect("index");
    let listed: BTreeSet<(BlobType, Id)> = [0usize, 1, 2, 3]
        .iter()
        .map(|&block| {
            let id = writer::rustic_id(&writer::block_id(&pool[block]));
            assert!(repository.get_index_entry(&DataId::from(id)).is_ok());
            (BlobType::Data, id)
        })
        .collect();
    history.backups.push(Backup {
        started: history.now,
        blocks: vec![0, 1, 2, 3],
        listed,
        stored: None,
        check: Check::Whole,
    });
    history.store();
    // A is forgotten; a prune marks its packs; more than the grace passes; a prune plans to
    // delete them.
    history.forget();
    prune::prune(&history.repository(), &history.backend).expect("prune");
    history.age(prune::DELETE_GRACE + HOUR);
    history.plan(0);
    // B, past its deadline, is refused (the rule under test)...
    let stored = history.backups[0].stored.as_ref().expect("stored");
    let mut referenced = stored.found.clone();
    referenced.extend(stored.stored.clone());
    let late = history.now - history.backups[0].started;
    let refused = prune::secure(
        &history.repository(),
        &history.backend,
        &history.cipher(),
        &referenced,
        &|| late,
    );
    assert!(
        matches!(refused, Err(Refused::TooLate { .. })),
        "{refused:?}"
    );
    // ...and had it been let through, its snapshot would name blocks the prune deletes.
    prune::secure(
        &history.repository(),
        &history.backend,
        &history.cipher(),
        &referenced,
        &|| Duration::ZERO,
    )
    .expect("secured without the deadline");
    let mut snapshot: SnapshotFile = SnapshotOptions::default().to_snapshot().expect("snapshot");
    snapshot.tree = stored.tree;
    history
        .repository()
        .save_snapshots(vec![snapshot])
        .expect("saved");
    let (_, plan) = history.plan.take().expect("planned");
    let executed = prune::execute(
        &history.repository(),
        &history.backend,
        plan,
        Duration::ZERO,
    );
    let repository = history.repository().to_indexed().expect("index");
    let lost = [0usize, 1, 2, 3].iter().any(|&block| {
        let id = writer::rustic_id(&writer::block_id(&pool[block]));
        repository
            .get_blob_cached(&BlobId::from(id), BlobType::Data)
            .is_err()
    });
    // The prune deleted packs the snapshot names: it finds out only as it looks for what the
    // snapshot saved meanwhile needs ("in no pack"), too late.
    assert!(
        lost && executed.is_err(),
        "the late backup's blocks survived: the scenario tests nothing ({executed:?})"
    );
}
