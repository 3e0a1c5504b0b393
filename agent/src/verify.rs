//! Verifies a restored volume against the manifest its Backup recorded.
//!
//! The decision is made only from the content on the volume, read without following a single
//! symlink and without leaving the volume: every manifest entry must be there with the same
//! type, permissions, owner, size and BLAKE3 hash, and nothing else may be (but `lost+found`
//! and custody's own `.custody/`). The manifest itself is trusted only when its hash equals the
//! one recorded in the Backup's status, it names the expected Backup, and the restore identity
//! next to it names the expected Restore.

use std::cmp::Ordering;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::path::Path;

pub use custody_proto::manifest::symlink_escapes;
use custody_proto::manifest::{Entry, Kind, ManifestReader, compare_paths, symlink_allowed};
use rayon::prelude::*;
use rustix::fs::{FileType, OFlags};

use crate::hashing::hash_file;
use crate::tree::{self, Found, Metadata, OnDisk, Walk, WalkError};
use crate::volumes::VolumeError;
use custody_proto::reasons::VolumeFailure;
use custody_proto::volume::{IDENTITY_PATH, IGNORED_AT_ROOT, MANIFEST_PATH, RestoreIdentity};

/// What the volume must match: the trust anchor from the Backup's status and the identities
/// of this restore.
#[derive(Clone, Debug)]
pub struct Expected {
    /// BLAKE3 of the manifest, as recorded in the Backup's status when it completed.
    pub manifest_hash: blake3::Hash,
    pub backup_uid: String,
    pub restore_uid: String,
}

/// How much a report keeps and how work is batched.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Differences listed in the report (all are counted).
    pub max_differences: usize,
    /// Files hashed in parallel at a time.
    pub batch: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_differences: 20,
            batch: 512,
        }
    }
}

/// What a successful verification covered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    pub entries: u64,
    pub files: u64,
    pub bytes: u64,
}

/// One way the volume differs from its manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Difference {
    Missing {
        path: String,
        expected: &'static str,
    },
    Extra {
        path: String,
        found: &'static str,
    },
    TypeChanged {
        path: String,
        expected: &'static str,
        found: &'static str,
    },
    SizeChanged {
        path: String,
        expected: u64,
        found: u64,
    },
    ContentChanged {
        path: String,
        expected: String,
        found: String,
    },
    ModeChanged {
        path: String,
        expected: u32,
        found: u32,
    },
    OwnerChanged {
        path: String,
        expected: (u32, u32),
        found: (u32, u32),
    },
    SymlinkTargetChanged {
        path: String,
        expected: String,
        found: String,
    },
    SymlinkEscapes {
        path: String,
        target: String,
    },
    OtherFilesystem {
        path: String,
    },
    Unreadable {
        path: String,
        error: String,
    },
}

impl Difference {
    /// The path the difference is about.
    pub fn path(&self) -> &str {
        match self {
            Difference::Missing { path, .. }
            | Difference::Extra { path, .. }
            | Difference::TypeChanged { path, .. }
            | Difference::SizeChanged { path, .. }
            | Difference::ContentChanged { path, .. }
            | Difference::ModeChanged { path, .. }
            | Difference::OwnerChanged { path, .. }
            | Difference::SymlinkTargetChanged { path, .. }
            | Difference::SymlinkEscapes { path, .. }
            | Difference::OtherFilesystem { path }
            | Difference::Unreadable { path, .. } => path,
        }
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Missing { path, expected } => {
                write!(f, "{path}: missing ({expected} expected)")
            }
            Difference::Extra { path, found } => write!(f, "{path}: unexpected {found}"),
            Difference::TypeChanged {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: expected a {expected}, found a {found}")
            }
            Difference::SizeChanged {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: size {found} bytes, expected {expected}")
            }
            Difference::ContentChanged {
                path,
                expected,
                found,
            } => write!(
                f,
                "{path}: content differs (BLAKE3 {}…, expected {}…)",
                &found[..found.len().min(12)],
                &expected[..expected.len().min(12)]
            ),
            Difference::ModeChanged {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: mode {found:o}, expected {expected:o}")
            }
            Difference::OwnerChanged {
                path,
                expected,
                found,
            } => write!(
                f,
                "{path}: owner {}:{}, expected {}:{}",
                found.0, found.1, expected.0, expected.1
            ),
            Difference::SymlinkTargetChanged {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: symlink to {found:?}, expected {expected:?}")
            }
            Difference::SymlinkEscapes { path, target } => {
                write!(
                    f,
                    "{path}: symlink to {target:?} points outside the volume (and outside the other volumes backed up with it)"
                )
            }
            Difference::OtherFilesystem { path } => {
                write!(f, "{path}: another filesystem is mounted here")
            }
            Difference::Unreadable { path, error } => write!(f, "{path}: unreadable: {error}"),
        }
    }
}

/// Why a volume is not verified. Each variant is its own reason a user sees.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("no manifest at {MANIFEST_PATH}: {0}")]
    ManifestMissing(String),
    #[error("the manifest on the volume belongs to Backup {found}, not {expected}")]
    WrongBackup { expected: String, found: String },
    #[error(
        "the manifest on the volume is not the one Backup recorded (BLAKE3 {found}, expected {expected})"
    )]
    ManifestTampered { expected: String, found: String },
    #[error("the manifest is invalid: {0}")]
    ManifestInvalid(String),
    #[error("no restore identity at {IDENTITY_PATH}: {0}")]
    IdentityMissing(String),
    #[error("the volume was written by Restore {found}, not {expected}")]
    WrongRestore { expected: String, found: String },
    #[error("the restore identity names Backup {found}, not {expected}")]
    IdentityWrongBackup { expected: String, found: String },
    #[error("{count} difference(s) from the manifest, first: {}", list(.differences))]
    ContentMismatch {
        count: u64,
        differences: Vec<Difference>,
    },
    #[error("the volume cannot be read: {0}")]
    VolumeUnreadable(String),
    #[error(transparent)]
    Volume(#[from] VolumeError),
}

fn list(differences: &[Difference]) -> String {
    differences
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl Failure {
    /// CamelCase reason for conditions and Events.
    pub fn reason(&self) -> VolumeFailure {
        match self {
            Failure::ManifestMissing(_) => VolumeFailure::ManifestMissing,
            Failure::WrongBackup { .. } => VolumeFailure::ManifestOfAnotherBackup,
            Failure::ManifestTampered { .. } => VolumeFailure::ManifestTampered,
            Failure::ManifestInvalid(_) => VolumeFailure::ManifestInvalid,
            Failure::IdentityMissing(_) => VolumeFailure::RestoreIdentityMissing,
            Failure::WrongRestore { .. } => VolumeFailure::WrittenByAnotherRestore,
            Failure::IdentityWrongBackup { .. } => VolumeFailure::RestoreIdentityOfAnotherBackup,
            Failure::ContentMismatch { .. } => VolumeFailure::ContentMismatch,
            Failure::VolumeUnreadable(_) => VolumeFailure::VolumeUnreadable,
            Failure::Volume(error) => error.reason(),
        }
    }
}

/// Verifies a volume: `path` must be the mount point of a persistent filesystem, and its
/// content must match the manifest.
pub fn verify_volume(
    path: &Path,
    expected: &Expected,
    options: Options,
) -> Result<Verified, Failure> {
    let mounted = crate::volumes::ensure_mounted(path)?;
    verify_tree(&mounted, expected, options)
}

/// Verifies the tree at `root` (already known to be the mounted volume).
pub fn verify_tree(
    root: &Path,
    expected: &Expected,
    options: Options,
) -> Result<Verified, Failure> {
    let root_fd =
        tree::open_root(root).map_err(|error| Failure::VolumeUnreadable(error.to_string()))?;

    // Who the manifest says it belongs to, before trusting anything else in it.
    let manifest = open_file(&root_fd, MANIFEST_PATH).map_err(Failure::ManifestMissing)?;
    let mut first_line = String::new();
    BufReader::new(
        manifest
            .try_clone()
            .map_err(|error| Failure::ManifestMissing(error.to_string()))?,
    )
    .take(custody_proto::manifest::MAX_LINE_BYTES as u64)
    .read_line(&mut first_line)
    .map_err(|error| Failure::ManifestInvalid(error.to_string()))?;
    let header: custody_proto::manifest::Header = serde_json::from_str(first_line.trim_end())
        .map_err(|error| Failure::ManifestInvalid(format!("header: {error}")))?;
    if header.backup_uid != expected.backup_uid {
        return Err(Failure::WrongBackup {
            expected: expected.backup_uid.clone(),
            found: header.backup_uid,
        });
    }

    // The trust anchor.
    let anchored = hash_whole(&root_fd)?;
    if anchored != expected.manifest_hash {
        return Err(Failure::ManifestTampered {
            expected: expected.manifest_hash.to_hex().to_string(),
            found: anchored.to_hex().to_string(),
        });
    }

    let identity_file = open_file(&root_fd, IDENTITY_PATH).map_err(Failure::IdentityMissing)?;
    let identity: RestoreIdentity =
        serde_json::from_reader(BufReader::new(identity_file.take(64 << 10)))
            .map_err(|error| Failure::IdentityMissing(format!("unreadable: {error}")))?;
    if identity.restore_uid != expected.restore_uid {
        return Err(Failure::WrongRestore {
            expected: expected.restore_uid.clone(),
            found: identity.restore_uid,
        });
    }
    if identity.backup_uid != expected.backup_uid {
        return Err(Failure::IdentityWrongBackup {
            expected: expected.backup_uid.clone(),
            found: identity.backup_uid,
        });
    }

    // Parse the manifest again, hashing what is parsed: a manifest swapped after the anchor
    // check cannot pass.
    let manifest = open_file(&root_fd, MANIFEST_PATH).map_err(Failure::ManifestMissing)?;
    let mut hashing = HashingReader {
        inner: manifest,
        hasher: blake3::Hasher::new(),
    };
    let (reader, header) = ManifestReader::new(BufReader::with_capacity(1 << 20, &mut hashing))
        .map_err(|error| Failure::ManifestInvalid(error.to_string()))?;
    let walk = Walk::new(&root_fd, IGNORED_AT_ROOT)
        .map_err(|error| Failure::VolumeUnreadable(error.to_string()))?;
    let verified = compare_content(&root_fd, reader, header, walk, options)?;
    let parsed = hashing.hasher.finalize();
    if parsed != expected.manifest_hash {
        return Err(Failure::ManifestTampered {
            expected: expected.manifest_hash.to_hex().to_string(),
            found: parsed.to_hex().to_string(),
        });
    }
    Ok(verified)
}

fn open_file(root: &OwnedFd, path: &str) -> Result<File, String> {
    let fd = tree::open_beneath(root, path, OFlags::RDONLY | OFlags::NONBLOCK)
        .map_err(|errno| errno.to_string())?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| errno.to_string())?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err("not a regular file".into());
    }
    Ok(File::from(fd))
}

fn hash_whole(root: &OwnedFd) -> Result<blake3::Hash, Failure> {
    let mut manifest = open_file(root, MANIFEST_PATH).map_err(Failure::ManifestMissing)?;
    custody_proto::manifest::hash_reader(&mut manifest)
        .map_err(|error| Failure::ManifestMissing(error.to_string()))
}

struct HashingReader<R> {
    inner: R,
    hasher: blake3::Hasher,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.hasher.update(&buffer[..read]);
        Ok(read)
    }
}

struct HashJob {
    path: String,
    size: u64,
    expected: String,
    mode: u32,
    owner: (u32, u32),
}

/// Permission and owner differences between a manifest entry and what is on disk (symlink
/// permissions are meaningless on Linux and not restorable, so they are not compared).
fn metadata_differences(path: &str, entry: &Entry, found: Metadata) -> Vec<Difference> {
    let mut differences = Vec::new();
    if !matches!(entry.kind, Kind::Symlink { .. }) && entry.mode != found.mode {
        differences.push(Difference::ModeChanged {
            path: path.to_string(),
            expected: entry.mode,
            found: found.mode,
        });
    }
    if (entry.uid, entry.gid) != (found.uid, found.gid) {
        differences.push(Difference::OwnerChanged {
            path: path.to_string(),
            expected: (entry.uid, entry.gid),
            found: (found.uid, found.gid),
        });
    }
    differences
}

/// Differences and totals, from the comparison of the two streams or from hashing.
#[derive(Default)]
struct Tally {
    differences: Vec<Difference>,
    count: u64,
    verified: Verified,
}

impl Tally {
    fn differ(&mut self, difference: Difference, max_differences: usize) {
        self.count += 1;
        if self.differences.len() < max_differences {
            self.differences.push(difference);
        }
    }
}

/// Merge-joins the manifest with the walk on the calling thread while a second thread hashes
/// the matched files in parallel batches, so walking and hashing overlap.
fn compare_content<R: BufRead>(
    root: &OwnedFd,
    manifest: ManifestReader<R>,
    header: custody_proto::manifest::Header,
    walk: Walk,
    options: Options,
) -> Result<Verified, Failure> {
    let (batches, received) = std::sync::mpsc::sync_channel::<Vec<HashJob>>(4);
    let (merged, mut tally, hashed) = std::thread::scope(|scope| {
        let hasher = scope.spawn(move || {
            let mut tally = Tally::default();
            for batch in received {
                let results: Vec<Result<u64, Vec<Difference>>> =
                    batch.par_iter().map(|job| hash_one(root, job)).collect();
                for result in results {
                    match result {
                        Ok(bytes) => {
                            tally.verified.files += 1;
                            tally.verified.bytes += bytes;
                        }
                        Err(differences) => {
                            for difference in differences {
                                tally.differ(difference, options.max_differences);
                            }
                        }
                    }
                }
            }
            tally
        });
        let mut comparison = Comparison {
            options,
            header,
            jobs: Vec::new(),
            batches,
            tally: Tally::default(),
        };
        let merged = comparison.merge(manifest, walk);
        comparison.send_batch();
        // Dropping the sender lets the hasher drain what is queued and end.
        let Comparison { tally, batches, .. } = comparison;
        drop(batches);
        (
            merged,
            tally,
            hasher.join().expect("hashing thread panicked"),
        )
    });
    merged?;
    tally.verified.files += hashed.verified.files;
    tally.verified.bytes += hashed.verified.bytes;
    tally.count += hashed.count;
    tally.differences.extend(hashed.differences);
    if tally.count == 0 {
        return Ok(tally.verified);
    }
    tally
        .differences
        .sort_by(|a, b| compare_paths(a.path(), b.path()));
    tally.differences.truncate(options.max_differences);
    Err(Failure::ContentMismatch {
        count: tally.count,
        differences: tally.differences,
    })
}

struct Comparison {
    options: Options,
    /// The manifest's header: which other volumes a symlink may lead into.
    header: custody_proto::manifest::Header,
    jobs: Vec<HashJob>,
    batches: std::sync::mpsc::SyncSender<Vec<HashJob>>,
    tally: Tally,
}

impl Comparison {
    fn send_batch(&mut self) {
        if !self.jobs.is_empty() {
            // The hasher only stops after the sender is dropped, so this cannot fail.
            let _ = self.batches.send(std::mem::take(&mut self.jobs));
        }
    }

    fn differ(&mut self, difference: Difference) {
        self.tally.differ(difference, self.options.max_differences);
    }

    fn merge<R: BufRead>(
        &mut self,
        mut manifest: ManifestReader<R>,
        mut walk: Walk,
    ) -> Result<(), Failure> {
        let mut next_expected = || -> Result<Option<Entry>, Failure> {
            manifest
                .next()
                .transpose()
                .map_err(|error| Failure::ManifestInvalid(error.to_string()))
        };
        let mut expected = next_expected()?;
        let mut found = self.next_found(&mut walk);
        loop {
            match (expected.take(), found.take()) {
                (None, None) => return Ok(()),
                (Some(entry), None) => {
                    self.missing(&entry);
                    expected = next_expected()?;
                }
                (None, Some(on_disk)) => {
                    self.extra(&on_disk);
                    found = self.next_found(&mut walk);
                }
                (Some(entry), Some(on_disk)) => match compare_paths(&entry.path, &on_disk.path) {
                    Ordering::Less => {
                        self.missing(&entry);
                        expected = next_expected()?;
                        found = Some(on_disk);
                    }
                    Ordering::Greater => {
                        self.extra(&on_disk);
                        expected = Some(entry);
                        found = self.next_found(&mut walk);
                    }
                    Ordering::Equal => {
                        self.compare(entry, on_disk);
                        expected = next_expected()?;
                        found = self.next_found(&mut walk);
                    }
                },
            }
            if self.jobs.len() >= self.options.batch {
                self.send_batch();
            }
        }
    }

    fn next_found(&mut self, walk: &mut Walk) -> Option<Found> {
        loop {
            match walk.next()? {
                Ok(found) => return Some(found),
                Err(WalkError::NonUtf8Name { parent, name }) => self.differ(Difference::Extra {
                    path: format!("{parent}/{}", String::from_utf8_lossy(&name)),
                    found: "entry with a non-UTF-8 name",
                }),
                Err(error) => self.differ(Difference::Unreadable {
                    path: String::new(),
                    error: error.to_string(),
                }),
            }
        }
    }

    fn missing(&mut self, entry: &Entry) {
        self.differ(Difference::Missing {
            path: entry.path.clone(),
            expected: entry.kind.name(),
        });
    }

    fn extra(&mut self, found: &Found) {
        self.differ(Difference::Extra {
            path: found.path.clone(),
            found: found.kind.name(),
        });
    }

    fn compare(&mut self, entry: Entry, found: Found) {
        self.tally.verified.entries += 1;
        let path = entry.path.clone();
        if found.other_filesystem {
            return self.differ(Difference::OtherFilesystem { path });
        }
        let expected_kind = match entry.kind {
            Kind::File { .. } => OnDisk::File,
            Kind::Dir => OnDisk::Dir,
            Kind::Symlink { .. } => OnDisk::Symlink,
        };
        if expected_kind != found.kind {
            return self.differ(Difference::TypeChanged {
                path,
                expected: entry.kind.name(),
                found: found.kind.name(),
            });
        }
        // Regular files are checked by the hasher, on the descriptor it reads.
        if expected_kind != OnDisk::File
            && let Some(metadata) = found.metadata
        {
            for difference in metadata_differences(&path, &entry, metadata) {
                self.differ(difference);
            }
        }
        match entry.kind {
            Kind::File { size, blake3 } => {
                self.jobs.push(HashJob {
                    path,
                    size,
                    expected: blake3,
                    mode: entry.mode,
                    owner: (entry.uid, entry.gid),
                });
            }
            Kind::Symlink { target } => {
                if !symlink_allowed(&path, &target, &self.header) {
                    self.differ(Difference::SymlinkEscapes {
                        path: path.clone(),
                        target: target.clone(),
                    });
                }
                let on_disk = found.symlink_target.unwrap_or_else(|| "(not UTF-8)".into());
                if on_disk != target {
                    self.differ(Difference::SymlinkTargetChanged {
                        path,
                        expected: target,
                        found: on_disk,
                    });
                }
            }
            Kind::Dir => {}
        }
    }
}

/// Opens, checks and hashes one file; its differences, or the bytes it verified.
fn hash_one(root: &OwnedFd, job: &HashJob) -> Result<u64, Vec<Difference>> {
    let unreadable = |error: String| {
        vec![Difference::Unreadable {
            path: job.path.clone(),
            error,
        }]
    };
    let fd = tree::open_beneath(root, &job.path, OFlags::RDONLY | OFlags::NONBLOCK)
        .map_err(|errno| unreadable(errno.to_string()))?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| unreadable(errno.to_string()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(vec![Difference::TypeChanged {
            path: job.path.clone(),
            expected: "file",
            found: "special file",
        }]);
    }
    let found = Metadata::of(&stat);
    let entry = Entry {
        path: job.path.clone(),
        kind: Kind::File {
            size: job.size,
            blake3: String::new(),
        },
        mode: job.mode,
        uid: job.owner.0,
        gid: job.owner.1,
    };
    let mut differences = metadata_differences(&job.path, &entry, found);
    if found.size != job.size {
        differences.push(Difference::SizeChanged {
            path: job.path.clone(),
            expected: job.size,
            found: found.size,
        });
        return Err(differences);
    }
    let (hash, read) =
        hash_file(&mut File::from(fd), job.size).map_err(|error| unreadable(error.to_string()))?;
    let hex = hash.to_hex();
    if read != job.size {
        differences.push(Difference::SizeChanged {
            path: job.path.clone(),
            expected: job.size,
            found: read,
        });
    } else if hex.as_str() != job.expected {
        differences.push(Difference::ContentChanged {
            path: job.path.clone(),
            expected: job.expected.clone(),
            found: hex.to_string(),
        });
    }
    if differences.is_empty() {
        Ok(read)
    } else {
        Err(differences)
    }
}

#[cfg(test)]
mod tests;
