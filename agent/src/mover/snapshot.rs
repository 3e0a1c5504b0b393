//! Backups into the repository (format 2) and restores out of it.
//!
//! A backup is one snapshot: every volume read once into content-defined, deduplicated,
//! compressed and encrypted blocks (restic's format), each volume's manifest built from the
//! same reads and stored in the snapshot, and custody's record of the run sealed in the
//! snapshot itself ([`SnapshotMeta`]). A file unchanged since the parent snapshot (same size,
//! mtime, ctime and inode) is not read again: its blocks and its manifest hash are the
//! parent's. Nothing is saved as a snapshot unless every volume was read whole.
//!
//! A restore opens the snapshot under the repository's key, checks that its sealed record is
//! the Backup's and names the manifest hash the Backup recorded, reads that manifest from the
//! snapshot (it must hash to the record), then writes the volume checked against it entry by
//! entry ([`Extraction`]), exactly as a format 1 restore does.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use custody_kube::s3::{self, Credentials, Endpoint};
use custody_proto::manifest::Header;
use custody_proto::mover::{BackupResult, RestoreResult, SnapshotWritten};
use custody_repository::backend::{Location, S3Backend};
use custody_repository::blocks::{BlockReader, ReadAhead};
use custody_repository::crypto::Cipher;
use custody_repository::open::{self, OpenError, Opened, Password};
use custody_repository::prune;
use custody_repository::snapshot::{self, ManifestMeta, MetaError, SnapshotMeta};
use custody_repository::writer::{Writer, WriterOptions};
use rustic_core::repofile::SnapshotFile;
use rustic_core::{
    DataId, IndexedFullStatus, OpenStatus, Repository, RepositoryBackends, SnapshotOptions, TreeId,
};

use super::extract::Extraction;
use super::snapshot_source::{Archiver, InodesAhead, VolumeToRead, same_after_first_line};
use super::{MoverError, local};

/// The environment variables holding the repository's master key or a password.
pub use custody_proto::mover::env::{REPOSITORY_KEY, REPOSITORY_PASSWORD};

/// What opens the repository.
pub enum Key {
    /// The master key itself (restic's JSON): no key derivation.
    Master(String),
    /// A password, through the key file it opens.
    Password(String),
}

/// A repository as the mover reaches it.
pub struct Repo {
    backend: S3Backend,
    backends: RepositoryBackends,
    key: Key,
    /// The repository ID the controller recorded: another repository at the same place is
    /// refused.
    expected_id: Option<String>,
}

impl Repo {
    /// The repository under `prefix` in the endpoint's bucket, opened with `key`.
    pub fn new(
        endpoint: &Endpoint,
        secret: &Credentials,
        prefix: &str,
        key: Key,
        expected_id: Option<String>,
    ) -> Result<Repo, MoverError> {
        let client = s3::client(endpoint, secret)?;
        let backend = S3Backend::new(
            client,
            Location {
                bucket: endpoint.bucket.clone(),
                prefix: prefix.trim_matches('/').to_string(),
            },
            tokio::runtime::Handle::current(),
        )
        .with_limits(endpoint.limits)
        .with_throttles(endpoint.upload.clone(), endpoint.download.clone())
        .counting_writes(super::progress::sent_counter());
        let backends = RepositoryBackends::new(backend.clone().shared(), None);
        Ok(Repo {
            backend,
            backends,
            key,
            expected_id,
        })
    }

    /// Opens the repository, or says why it cannot (before anything is read or written).
    fn open(&self) -> Result<(Repository<OpenStatus>, String), MoverError> {
        let (repository, repository_id) = match &self.key {
            Key::Master(key) => open::open_with_master_key(&self.backends, key)?,
            Key::Password(password) => {
                let password = Password {
                    name: REPOSITORY_PASSWORD.to_string(),
                    value: password.clone(),
                };
                let opened: Opened = open::open(&self.backends, std::slice::from_ref(&password))?;
                (opened.repository, opened.repository_id)
            }
        };
        if let Some(expected) = &self.expected_id
            && &repository_id != expected
        {
            return Err(MoverError::Repository(OpenError::NotARepository {
                location: format!(
                    "{} (it holds repository {repository_id}, not {expected})",
                    self.backend.location(),
                ),
            }));
        }
        Ok((repository, repository_id))
    }
}

use rustic_core::ReadBackend;

/// One volume to back up.
pub struct Volume {
    pub name: String,
    pub claim: String,
    pub root: PathBuf,
    /// Where the application mounts it, if known.
    pub mount_path: Option<String>,
    /// Read from a tool's tar stream instead of `root`.
    pub tar: Option<super::stream::TarInput>,
}

/// The manifest header of each volume: the run's, and, where the application's mount paths
/// are known, this volume's and the others' (a symlink may lead into those).
fn volume_headers(header: &Header, volumes: &[Volume]) -> Vec<Header> {
    volumes
        .iter()
        .enumerate()
        .map(|(index, volume)| match &volume.mount_path {
            Some(mount) if volumes.len() > 1 => Header {
                mount_path: Some(mount.clone()),
                sibling_mounts: volumes
                    .iter()
                    .enumerate()
                    .filter(|(other, _)| *other != index)
                    .filter_map(|(_, other)| other.mount_path.clone())
                    .collect(),
                ..header.clone()
            },
            _ => header.clone(),
        })
        .collect()
}

/// What a snapshot backup needs besides the repository.
pub struct SnapshotBackup {
    pub volumes: Vec<Volume>,
    /// custody's record, as known when the run starts (no manifests, not completed).
    pub meta: SnapshotMeta,
    pub header: Header,
    /// The snapshot of the Cluster's last completed backup: unchanged files are not read.
    pub parent: Option<String>,
}

/// Backs the volumes up into one snapshot. `stop` ends the reading; `on_read` runs once every
/// file is read. Blocks: run it on a blocking thread.
///
/// A volume that cannot be archived while an S3 call failed is the server's fault: it is said
/// as a failed upload, not as an unreadable volume.
pub fn backup(
    repo: &Repo,
    request: SnapshotBackup,
    stop: Arc<AtomicBool>,
    on_read: Option<Box<dyn FnOnce() + Send>>,
) -> Result<BackupResult, MoverError> {
    let failures = repo.backend.failures();
    backup_into(repo, request, stop, on_read).map_err(|error| match error {
        // A tool's failure is the tool's, whatever the server did meanwhile.
        MoverError::ReadVolume(error @ crate::manifest_builder::BuildError::ToolFailed(_)) => {
            MoverError::ReadVolume(error)
        }
        MoverError::ReadVolume(error) if repo.backend.failures() > failures => {
            MoverError::RepositoryWrite(error.to_string())
        }
        other => other,
    })
}

fn backup_into(
    repo: &Repo,
    request: SnapshotBackup,
    stop: Arc<AtomicBool>,
    on_read: Option<Box<dyn FnOnce() + Send>>,
) -> Result<BackupResult, MoverError> {
    // With a parent, the walk mostly compares each file's metadata with the parent's: its
    // inodes are read meanwhile (without one, each file's reading dominates).
    let _inodes_ahead = request.parent.is_some().then(|| {
        InodesAhead::start(
            request
                .volumes
                .iter()
                .filter(|volume| volume.tar.is_none())
                .map(|volume| volume.root.clone())
                .collect(),
        )
    });
    let (repository, repository_id) = repo.open()?;
    // From here to the snapshot's saving, a prune's grace bounds the time (`prune::secure`).
    let index_loaded = Instant::now();
    let _ = repo.backend.take_index_listing();
    let repository = repository
        .to_indexed()
        .map_err(|error| unreadable(&repo.backend, &error))?;
    // The index files the index was loaded from: before the snapshot is saved, only those
    // written since are read (`prune::secure_after_load`).
    let loaded = repo.backend.take_index_listing();
    let cipher = Cipher::new(&repository.key())
        .map_err(|error| MoverError::Local(format!("the repository key: {error}")))?;

    // The parent's trees and manifests: a file unchanged since it is not read again.
    let mut parents: Vec<Option<ParentVolume>> = request.volumes.iter().map(|_| None).collect();
    if let Some(id) = &request.parent {
        match parents_of(&repository, (&repo.backend, &cipher), id, &request.volumes) {
            Ok((found, estimate)) => {
                parents = found;
                // The walk lists every volume anyway: no count of its own beside it.
                super::progress::totals_from_listing(request.volumes.len(), estimate);
            }
            // Without the parent, every file is read: slower, never wrong.
            Err(reason) => eprintln!("custody-mover: not using parent snapshot {id}: {reason}"),
        }
    }

    let writer = Writer::new(
        repo.backend.clone().shared(),
        cipher.clone(),
        WriterOptions::default(),
    );
    let mut archiver = Archiver::new(
        BlockReader {
            repository: &repository,
            backend: &repo.backend,
            cipher: &cipher,
        },
        writer,
        &stop,
    );
    let mut read = Vec::new();
    let mut claims = Vec::new();
    let mut parent_bodies = Vec::new();
    let headers = volume_headers(&request.header, &request.volumes);
    super::progress::reading_starts();
    for ((volume, parent), header) in request.volumes.into_iter().zip(parents).zip(&headers) {
        super::progress::volume(&volume.name);
        claims.push(volume.claim);
        let (parent, body) = match parent {
            Some(parent) => (Some((parent.tree, parent.manifest)), parent.manifest_body),
            None => (None, None),
        };
        parent_bodies.push(body);
        read.push(archiver.volume(
            VolumeToRead {
                name: volume.name,
                root: volume.root,
                parent,
                tar: volume.tar,
            },
            header,
        )?);
    }
    // Every file is read: a frozen filesystem may thaw (the upload goes on).
    if let Some(on_read) = on_read {
        on_read();
    }
    let mut meta = request.meta;
    let mut manifest_nodes = Vec::new();
    let mut volume_nodes = Vec::new();
    for ((volume_meta, volume), parent_body) in
        meta.volumes.iter_mut().zip(&read).zip(parent_bodies)
    {
        volume_meta.manifest = Some(ManifestMeta {
            blake3: volume.summary.hash.to_hex().to_string(),
            entries: volume.summary.totals.entries,
            files: volume.summary.totals.files,
            total_bytes: volume.summary.totals.total_bytes,
        });
        // A manifest the same as the parent's but for its header (an unchanged volume) is
        // stored as the parent's blocks after a block of its own header: it is not chunked
        // and hashed again. The comparison failing, it is stored as any (and fails there).
        let body = parent_body
            .filter(|(parent, _)| same_after_first_line(&volume.manifest, parent).unwrap_or(false));
        manifest_nodes.push(archiver.file(
            &format!("{}.jsonl", volume_meta.name),
            &volume.manifest,
            body.as_ref().map(|(_, blocks)| blocks.as_slice()),
        )?);
        volume_nodes.push(volume.node.clone());
    }
    volume_nodes.sort_by(|a, b| a.name.cmp(&b.name));
    manifest_nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let data = archiver.tree(volume_nodes)?;
    let manifests = archiver.tree(manifest_nodes)?;
    let root = archiver.tree(vec![
        Archiver::directory("data", data),
        Archiver::directory("manifests", manifests),
    ])?;
    let counts = archiver.counts;
    let (stats, (found, stored)) = archiver.finish()?;
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(MoverError::Upload(
            super::upload::UploadError::Interrupted {
                key: "the snapshot".into(),
            },
        ));
    }

    // Every block and index is stored: the snapshot, with custody's record sealed in it.
    meta.completed_at = Some(rustic_core::jiff::Timestamp::now().to_string());
    let mut file = SnapshotOptions::default()
        .to_snapshot()
        .map_err(|error| MoverError::Local(error.display_log()))?;
    file.tree = root;
    file.hostname = format!("{}/{}", meta.cluster.namespace, meta.cluster.name);
    file.username = String::new();
    file.label = meta.backup.name.clone();
    file.parent = request
        .parent
        .as_deref()
        .and_then(|id| id.parse::<rustic_core::Id>().ok())
        .map(Into::into);
    for volume in &meta.volumes {
        file.paths.add(snapshot::data_path(&volume.name));
    }
    for tag in meta.tags() {
        file.tags.add(tag);
    }
    file.description = Some(meta.to_description());
    // Every block the snapshot names is in a listed pack (a prune may have marked some while
    // this ran) and the run is within its deadline: then it is saved at once.
    let backend = repo.backend.clone().shared();
    let elapsed = || index_loaded.elapsed();
    let secured = match &loaded {
        Some(loaded) => prune::secure_after_load(
            &repository,
            backend.as_ref(),
            &cipher,
            loaded,
            (&found, &stored),
            &elapsed,
        ),
        // The listing was not seen (it always is with this backend): every index file is read.
        None => {
            let mut referenced = found;
            referenced.extend(stored);
            prune::secure(
                &repository,
                backend.as_ref(),
                &cipher,
                &referenced,
                &elapsed,
            )
        }
    }?;
    if secured.relisted > 0 {
        eprintln!(
            "custody-mover: {} pack(s) a prune marked while this backup ran are listed again",
            secured.relisted
        );
    }
    repository
        .save_snapshots(vec![file])
        .map_err(|error| MoverError::RepositoryWrite(error.display_log()))?;
    let snapshot_id = repo
        .backend
        .last_snapshot_written()
        .ok_or_else(|| MoverError::RepositoryWrite("the snapshot was not written".into()))?;
    let first = read.first().expect("a snapshot has a volume");
    let sum = |count: fn(&ManifestMeta) -> u64| {
        meta.volumes
            .iter()
            .filter_map(|volume| volume.manifest.as_ref())
            .map(count)
            .sum::<u64>()
    };
    Ok(BackupResult {
        key: String::new(),
        manifest_key: String::new(),
        size_bytes: stats.bytes_uploaded,
        checksum: String::new(),
        manifest_hash: first.summary.hash.to_hex().to_string(),
        files: sum(|manifest| manifest.files),
        entries: sum(|manifest| manifest.entries),
        total_bytes: sum(|manifest| manifest.total_bytes),
        frozen_millis: None,
        volumes: meta
            .volumes
            .iter()
            .filter_map(|volume| {
                let manifest = volume.manifest.as_ref()?;
                Some(custody_proto::mover::VolumeWritten {
                    name: volume.name.clone(),
                    manifest_hash: manifest.blake3.clone(),
                    files: manifest.files,
                    total_bytes: manifest.total_bytes,
                })
            })
            .collect(),
        snapshot: Some(SnapshotWritten {
            id: snapshot_id.to_hex().to_string(),
            repository_id,
            bytes_new: stats.data_bytes_new,
            files_read: counts.files_read,
        }),
    })
}

fn unreadable(backend: &S3Backend, error: &rustic_core::RusticError) -> MoverError {
    MoverError::Repository(OpenError::Unreadable {
        location: backend.location(),
        message: error.display_log(),
    })
}

/// The parent snapshot's tree and manifest of each volume (`None` for a volume it lacks).
fn parents_of(
    repository: &Repository<IndexedFullStatus>,
    reader: (&S3Backend, &Cipher),
    id: &str,
    volumes: &[Volume],
) -> Result<ParentsFound, String> {
    let parent = snapshot_file(repository, id).map_err(|error| error.to_string())?;
    let meta =
        SnapshotMeta::finished(parent.description.as_deref()).map_err(|error| error.to_string())?;
    let estimate = volumes.iter().try_fold((0, 0), |(files, bytes), volume| {
        let recorded = meta.manifest(&volume.name).ok()?;
        Some((files + recorded.files, bytes + recorded.total_bytes))
    });
    let trees = volumes
        .iter()
        .map(|volume| {
            let Ok(recorded) = meta.manifest(&volume.name) else {
                return Ok(None);
            };
            let (manifest, body) =
                read_manifest(repository, reader, &parent, &volume.name, &recorded.blake3)
                    .map_err(|error| error.to_string())?;
            let reopen = || {
                manifest
                    .reopen()
                    .map_err(local("the manifest"))
                    .map_err(|error| error.to_string())
            };
            let manifest_body = match body {
                Some(blocks) => Some((reopen()?, blocks)),
                None => None,
            };
            let node = repository
                .node_from_snapshot_and_path(&parent, &snapshot::data_path(&volume.name))
                .map_err(|error| error.display_log())?;
            Ok(match node.subtree {
                Some(tree) => Some(ParentVolume {
                    tree,
                    manifest: reopen()?,
                    manifest_body,
                }),
                None => None,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok((trees, estimate))
}

/// Each volume in the parent snapshot (when it has the volume), and the files and bytes the
/// parent recorded for all of them (when it recorded each).
type ParentsFound = (Vec<Option<ParentVolume>>, Option<(u64, u64)>);

/// A volume in the parent snapshot.
struct ParentVolume {
    tree: TreeId,
    /// Its manifest, for the walk.
    manifest: File,
    /// Its manifest again (read from its start on its own) and the blocks holding what
    /// follows the first line, when the first block is that line alone, as custody stores a
    /// manifest ([`Archiver::file`]).
    manifest_body: Option<(File, Vec<DataId>)>,
}

fn snapshot_file(
    repository: &Repository<IndexedFullStatus>,
    id: &str,
) -> Result<SnapshotFile, MoverError> {
    let mut found = repository.get_snapshots(&[id]).map_err(|error| {
        MoverError::Snapshot(format!(
            "snapshot {id} cannot be read: {}",
            error.display_log()
        ))
    })?;
    found
        .pop()
        .ok_or_else(|| MoverError::Snapshot(format!("there is no snapshot {id}")))
}

/// A volume's manifest out of a snapshot, into a scratch file; it must hash to `blake3`. With
/// it, the blocks after the first when the first holds exactly the manifest's first line.
fn read_manifest(
    repository: &Repository<IndexedFullStatus>,
    (backend, cipher): (&S3Backend, &Cipher),
    snapshot: &SnapshotFile,
    volume: &str,
    blake3: &str,
) -> Result<(tempfile::NamedTempFile, Option<Vec<DataId>>), MoverError> {
    let path = snapshot::manifest_path(volume);
    let node = repository
        .node_from_snapshot_and_path(snapshot, &path)
        .map_err(|error| {
            MoverError::Snapshot(format!(
                "the snapshot has no {path}: {}",
                error.display_log()
            ))
        })?;
    let mut file =
        tempfile::NamedTempFile::new().map_err(local("a scratch file for the manifest"))?;
    // Block by block, those side by side in a pack in one read, none kept once written.
    let blocks = BlockReader {
        repository,
        backend,
        cipher,
    };
    let content = node.content.as_deref().unwrap_or_default();
    let mut ahead = ReadAhead::default();
    // Hashed as it is written: the file is not read back for it.
    let mut hasher = blake3::Hasher::new();
    let mut first_line_alone = false;
    for (index, id) in content.iter().enumerate() {
        let block = blocks
            .block_reading_ahead(id, &content[index + 1..], &mut ahead)
            .map_err(|message| MoverError::Download {
                key: path.clone(),
                message,
            })?;
        if index == 0 {
            first_line_alone =
                block.iter().position(|&byte| byte == b'\n') == Some(block.len() - 1);
        }
        hasher.update(&block);
        file.write_all(&block)
            .map_err(local("a scratch file for the manifest"))?;
    }
    file.flush()
        .map_err(local("a scratch file for the manifest"))?;
    let found = hasher.finalize().to_hex().to_string();
    if found != blake3 {
        return Err(MoverError::ManifestTampered {
            expected: blake3.to_string(),
            found,
        });
    }
    let body = first_line_alone.then(|| content[1..].to_vec());
    Ok((file, body))
}

/// A restore of one volume out of a snapshot.
pub struct SnapshotRestore<'a> {
    pub target: &'a Path,
    pub snapshot: &'a str,
    pub volume: &'a str,
    /// The manifest hash the Backup recorded (its status caches the snapshot's record).
    pub manifest_hash: &'a str,
    /// The UID of the Backup that wrote the snapshot, as its record names it.
    pub backup_uid: &'a str,
    pub restore_uid: &'a str,
    pub overwrite: bool,
}

/// Restores a volume out of a snapshot. Blocks: run it on a blocking thread.
///
/// A snapshot or manifest that cannot be read while an S3 call failed (a stall, a trickle, a
/// dropped connection) is the server's fault, not the snapshot's: worth trying again.
pub fn restore(repo: &Repo, request: SnapshotRestore<'_>) -> Result<RestoreResult, MoverError> {
    let failures = repo.backend.failures();
    restore_from(repo, request).map_err(|error| match error {
        MoverError::Snapshot(message) if repo.backend.failures() > failures => {
            MoverError::Repository(OpenError::Unreadable {
                location: repo.backend.location(),
                message,
            })
        }
        other => other,
    })
}

fn restore_from(repo: &Repo, request: SnapshotRestore<'_>) -> Result<RestoreResult, MoverError> {
    let identity = custody_proto::volume::RestoreIdentity {
        restore_uid: request.restore_uid.to_string(),
        backup_uid: request.backup_uid.to_string(),
    };
    if let Some(done) = super::prepare_target(
        request.target,
        &identity,
        request.manifest_hash,
        request.overwrite,
    )? {
        return Ok(done);
    }
    let (repository, _) = repo.open()?;
    let repository = repository
        .to_indexed()
        .map_err(|error| unreadable(&repo.backend, &error))?;
    let snapshot = snapshot_file(&repository, request.snapshot)?;
    let meta = SnapshotMeta::finished(snapshot.description.as_deref())
        .map_err(|error| MoverError::Snapshot(format!("snapshot {}: {error}", request.snapshot)))?;
    if meta.backup.uid != request.backup_uid {
        return Err(MoverError::ManifestOfAnotherBackup {
            expected: request.backup_uid.to_string(),
            found: meta.backup.uid,
        });
    }
    let recorded: &ManifestMeta = meta.manifest(request.volume).map_err(|error: MetaError| {
        MoverError::Snapshot(format!("snapshot {}: {error}", request.snapshot))
    })?;
    if recorded.blake3 != request.manifest_hash {
        return Err(MoverError::ManifestTampered {
            expected: request.manifest_hash.to_string(),
            found: recorded.blake3.clone(),
        });
    }
    let cipher = Cipher::new(&repository.key())
        .map_err(|error| MoverError::Local(format!("the repository key: {error}")))?;
    let (manifest_file, _) = read_manifest(
        &repository,
        (&repo.backend, &cipher),
        &snapshot,
        request.volume,
        &recorded.blake3,
    )?;
    let reader = super::checked_manifest(&manifest_file, request.backup_uid)?;
    super::progress::volume(request.volume);
    super::progress::totals(recorded.files, recorded.total_bytes);
    super::usage::has_room(
        request.target,
        recorded.total_bytes,
        recorded.files,
        recorded.entries,
    )?;

    super::write_identity(request.target, &identity)?;
    let data = snapshot::data_path(request.volume);
    let node = repository
        .node_from_snapshot_and_path(&snapshot, &data)
        .map_err(|error| {
            MoverError::Snapshot(format!(
                "the snapshot has no {data}: {}",
                error.display_log()
            ))
        })?;
    let extraction = Extraction::start(request.target, reader)?;
    let totals = super::snapshot_reader::extract_volume(
        &repository,
        (&repo.backend, &cipher),
        &node,
        extraction,
    )?;
    super::seal_target(request.target, &manifest_file)?;
    Ok(RestoreResult {
        files: totals.files,
        entries: totals.entries,
        total_bytes: totals.total_bytes,
    })
}

/// Prunes the repository ([`prune::prune`]).
pub fn prune(repo: &Repo) -> Result<prune::PruneReport, MoverError> {
    let (repository, _) = repo.open()?;
    prune::prune(&repository, repo.backend.clone().shared().as_ref()).map_err(|error| match error {
        prune::PruneError::PlanningTooLong { .. } => MoverError::Local(error.to_string()),
        prune::PruneError::Repository(message) => MoverError::RepositoryWrite(message),
    })
}

/// Checks the repository, reading `read_data_percent` % of its packs whole.
pub fn check(
    repo: &Repo,
    read_data_percent: u8,
) -> Result<custody_repository::check::CheckReport, MoverError> {
    let (repository, _) = repo.open()?;
    custody_repository::check::check(&repository, read_data_percent).map_err(|message| {
        MoverError::Repository(OpenError::Unreadable {
            location: repo.backend.location(),
            message,
        })
    })
}
