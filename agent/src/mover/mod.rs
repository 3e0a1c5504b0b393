//! `custody-mover`: a volume to S3 (backup) and back (restore), in one streaming pass each
//! way with bounded memory.
//!
//! Backup: the volume is walked once in manifest order; every entry goes into a tar stream,
//! compressed with zstd and uploaded as a multipart upload, while the manifest is built from
//! the same reads. The manifest is uploaded after the data. Any failure aborts the upload.
//!
//! Restore: the manifest is downloaded first and must hash to what the Backup recorded; the
//! archive is streamed, decompressed and extracted against it (see [`extract`]); the manifest
//! and the restore identity are left in `.custody/` for the agent.

pub mod archive;
pub mod cli;
pub mod extract;
pub mod freeze;
pub mod progress;
pub mod snapshot;
pub mod snapshot_reader;
pub mod snapshot_source;
pub mod stream;
pub mod upload;
pub mod usage;

use std::io::{BufReader, Seek, Write};
use std::path::{Path, PathBuf};

use custody_kube::s3::{self, Credentials, Endpoint};
use custody_proto::manifest::{self, Header, ManifestReader};
use tokio::sync::mpsc;

use crate::manifest_builder;
use custody_proto::mover::{BackupResult, RestoreResult};
use custody_proto::reasons::MoverFailure;
use custody_proto::volume::{CUSTODY_DIR, IDENTITY_PATH, MANIFEST_PATH, RestoreIdentity};

/// zstd level of the archive.
pub const COMPRESSION_LEVEL: i32 = 3;
/// Bytes per zstd worker job.
pub const ZSTD_JOB_SIZE: u32 = 2 << 20;
/// Largest zstd window a restore accepts (2^27 = 128 MiB); the backup uses far less.
pub const WINDOW_LOG_MAX: u32 = 27;

/// Why the mover failed. The reason goes into the termination message.
#[derive(Debug, thiserror::Error)]
pub enum MoverError {
    #[error("credentials: {0}")]
    Credentials(String),
    #[error(transparent)]
    Client(#[from] s3::ClientError),
    #[error("reading the volume: {0}")]
    ReadVolume(#[from] manifest_builder::BuildError),
    #[error(transparent)]
    Upload(#[from] upload::UploadError),
    #[error("{0}")]
    Local(String),
    #[error("downloading {key}: {message}")]
    Download { key: String, message: String },
    #[error(
        "{key} is not in the repository ({message}): it was deleted behind custody's back, and trying again cannot bring it back"
    )]
    Missing { key: String, message: String },
    #[error(
        "the manifest in the repository is not the one Backup recorded (BLAKE3 {found}, expected {expected})"
    )]
    ManifestTampered { expected: String, found: String },
    #[error("the manifest belongs to Backup {found}, not {expected}")]
    ManifestOfAnotherBackup { expected: String, found: String },
    #[error(transparent)]
    Extract(#[from] extract::ExtractError),
    #[error(transparent)]
    Repository(#[from] custody_repository::open::OpenError),
    #[error("writing the snapshot: {0}")]
    RepositoryWrite(String),
    #[error("{0}")]
    Snapshot(String),
    #[error("the snapshot was not saved: {0}")]
    NotSecured(#[from] custody_repository::prune::Refused),
    #[error("the node agent did not freeze the volume: {0}")]
    FreezeRefused(String),
    #[error(
        "the volume was thawed after {seconds:.1} s, before it was all read ({reason}); the copy would not be a point in time"
    )]
    FreezeLost { seconds: f64, reason: String },
    #[error(
        "the tree to back up takes {used} bytes on disk, more than the {limit} its scratch space allows (the tool's scratchSize): nothing was read. Raise scratchSize, or have the tool write less"
    )]
    SourceTooLarge { used: u64, limit: u64 },
    #[error("{0}")]
    TargetTooSmall(String),
}

impl MoverError {
    /// CamelCase reason.
    pub fn reason(&self) -> MoverFailure {
        match self {
            MoverError::Credentials(_) => MoverFailure::CredentialsMissing,
            MoverError::Client(_) => MoverFailure::InvalidRepository,
            MoverError::ReadVolume(manifest_builder::BuildError::SymlinkLeavesVolume {
                ..
            }) => MoverFailure::SymlinkLeavesVolume,
            MoverError::ReadVolume(manifest_builder::BuildError::ToolFailed(_)) => {
                MoverFailure::ToolFailed
            }
            MoverError::ReadVolume(_) => MoverFailure::ReadVolumeFailed,
            MoverError::Upload(upload::UploadError::Interrupted { .. }) => {
                MoverFailure::Interrupted
            }
            MoverError::Upload(_) => MoverFailure::UploadFailed,

            MoverError::Local(_) => MoverFailure::LocalError,
            MoverError::Download { .. } => MoverFailure::DownloadFailed,
            MoverError::Missing { .. } => MoverFailure::ArtifactMissing,
            MoverError::ManifestTampered { .. } => MoverFailure::ManifestTampered,
            MoverError::ManifestOfAnotherBackup { .. } => MoverFailure::ManifestOfAnotherBackup,
            MoverError::Extract(error) => error.reason(),
            MoverError::Repository(error) => match error {
                custody_repository::open::OpenError::KeyRejected { .. }
                | custody_repository::open::OpenError::NoPassword => {
                    MoverFailure::RepositoryKeyRejected
                }
                custody_repository::open::OpenError::NotARepository { .. } => {
                    MoverFailure::RepositoryMissing
                }
                custody_repository::open::OpenError::Unreadable { .. } => {
                    MoverFailure::RepositoryUnreadable
                }
            },
            MoverError::RepositoryWrite(_) => MoverFailure::UploadFailed,
            MoverError::Snapshot(_) => MoverFailure::SnapshotInvalid,
            MoverError::NotSecured(custody_repository::prune::Refused::Unreadable(_)) => {
                MoverFailure::RepositoryUnreadable
            }
            MoverError::NotSecured(_) => MoverFailure::SnapshotNotSecured,
            MoverError::FreezeRefused(_) => MoverFailure::FreezeRefused,
            MoverError::FreezeLost { .. } => MoverFailure::FreezeLost,
            MoverError::SourceTooLarge { .. } => MoverFailure::ToolOutputTooLarge,
            MoverError::TargetTooSmall(_) => MoverFailure::TargetTooSmall,
        }
    }
}

pub(crate) fn local(what: &str) -> impl Fn(std::io::Error) -> MoverError + '_ {
    move |error| MoverError::Local(format!("{what}: {error}"))
}

/// Credentials from the environment: the repository's Secret the Job maps there, or its web
/// identity (a role and the token the kubelet projects into the pod).
pub fn credentials_from_env(region: &str) -> Result<Credentials, MoverError> {
    custody_kube::sts::from_env(|name| std::env::var(name).ok(), region)
        .map_err(MoverError::Credentials)
}

/// Backs `source` up under `prefix` in `endpoint`'s bucket. With `held`, the volume's
/// filesystem is frozen until every file is read, then released; if the freeze ends first,
/// the upload is aborted and the backup fails.
pub async fn backup(
    endpoint: &Endpoint,
    secret: &Credentials,
    source: &Path,
    prefix: &str,
    header: Header,
    stop: tokio::sync::watch::Receiver<bool>,
    mut held: Option<freeze::Held>,
) -> Result<BackupResult, MoverError> {
    let client = s3::client(endpoint, secret)?;
    // A lost freeze stops the upload as SIGTERM does.
    let stop = match &held {
        None => stop,
        Some(held) => {
            let (sender, receiver) = tokio::sync::watch::channel(*stop.borrow());
            let (mut signal, mut lost) = (stop, held.lost.clone());
            tokio::spawn(async move {
                let lost_first = tokio::select! {
                    signalled = signal.wait_for(|stopped| *stopped) => {
                        if signalled.is_ok() {
                            let _ = sender.send(true);
                        }
                        return;
                    }
                    // Closed without a loss: the freeze was released after the last read.
                    lost = lost.wait_for(Option::is_some) => lost.is_ok(),
                };
                if lost_first || signal.wait_for(|stopped| *stopped).await.is_ok() {
                    let _ = sender.send(true);
                }
            });
            receiver
        }
    };
    let release = held.as_mut().map(freeze::Held::releaser);
    let frozen_at = held.as_ref().map(freeze::Held::since);
    let (key, manifest_key) = custody_proto::mover::object_keys(prefix);
    let (sender, receiver) = mpsc::channel(1);
    let uploader = {
        let client = client.clone();
        let bucket = endpoint.bucket.clone();
        let key = key.clone();
        let speed = upload::Speed::up(endpoint);
        tokio::spawn(async move {
            upload::multipart(&client, &bucket, &key, receiver, stop, speed).await
        })
    };

    let source = source.to_path_buf();
    progress::reading_starts();
    let written = tokio::task::spawn_blocking(move || -> Result<_, MoverError> {
        let manifest_file = tempfile::tempfile().map_err(local("a temporary manifest file"))?;
        let parts = upload::PartWriter::new(sender);
        let mut compressor = zstd::stream::write::Encoder::new(parts, COMPRESSION_LEVEL)
            .map_err(local("starting zstd"))?;
        compressor
            .multithread(2)
            .map_err(local("starting zstd workers"))?;
        // Small jobs keep the workers' buffers (input and output per job) to a few MiB.
        compressor
            .set_parameter(zstd::stream::raw::CParameter::JobSize(ZSTD_JOB_SIZE))
            .map_err(local("sizing zstd jobs"))?;
        let mut archive = archive::TarArchive::new(compressor);
        // Buffered: the manifest writer emits a line in many small pieces.
        let built = manifest_builder::build_into(
            &source,
            &header,
            std::io::BufWriter::with_capacity(256 << 10, manifest_file),
            Some(&mut archive),
        );
        // Every file is read: the filesystem may thaw (the compressor and the upload go on).
        let read_at = std::time::Instant::now();
        if let Some(release) = release {
            release();
        }
        let (manifest_file, summary) = built?;
        let manifest_file = manifest_file
            .into_inner()
            .map_err(|error| MoverError::Local(format!("writing the manifest: {error}")))?;
        let compressor = archive.finish().map_err(local("ending the archive"))?;
        let parts = compressor.finish().map_err(local("ending zstd"))?;
        let (checksum, size) = parts.finish().map_err(local("ending the upload"))?;
        Ok((manifest_file, summary, checksum, size, read_at))
    })
    .await
    .map_err(|error| MoverError::Local(format!("the archiving thread: {error}")))?;
    let uploaded = uploader
        .await
        .map_err(|error| MoverError::Local(format!("the upload task: {error}")))?;
    // A failed upload stops the writer ("the upload stopped"): report the upload's cause. An
    // archiving error (the volume, the scratch space) closes the channel without an end
    // marker, so the upload ends Incomplete (and was aborted): report the archiving error.
    // A freeze lost while the volume was read is the cause of whatever failed after it.
    if let (Some(held), Some(frozen_at)) = (&held, frozen_at)
        && let Some(reason) = held.lost_reason()
    {
        return Err(MoverError::FreezeLost {
            seconds: frozen_at.elapsed().as_secs_f64(),
            reason,
        });
    }
    let (mut manifest_file, summary, checksum, size, read_at) = match (uploaded, written) {
        (Ok(()), written) => written?,
        (Err(upload::UploadError::Incomplete), Err(cause)) => return Err(cause),
        (Err(error), _) => return Err(error.into()),
    };
    let frozen_millis =
        frozen_at.map(|frozen_at| read_at.saturating_duration_since(frozen_at).as_millis() as u64);

    manifest_file
        .rewind()
        .map_err(local("rewinding the manifest"))?;
    let manifest_path = tempfile::NamedTempFile::new().map_err(local("a manifest file"))?;
    std::io::copy(&mut manifest_file, &mut manifest_path.as_file())
        .map_err(local("copying the manifest"))?;
    let body = aws_sdk_s3::primitives::ByteStream::from_path(manifest_path.path())
        .await
        .map_err(|error| MoverError::Local(format!("reading the manifest: {error}")))?;
    let manifest_bytes = manifest_path
        .as_file()
        .metadata()
        .map_err(local("the manifest's size"))?
        .len();
    endpoint.upload.take(manifest_bytes).await;
    let request = client
        .put_object()
        .bucket(&endpoint.bucket)
        .key(&manifest_key)
        .body(body)
        .send();
    endpoint
        .limits
        .bounded(manifest_bytes, request)
        .await
        .map_err(|overdue| {
            MoverError::Upload(upload::UploadError::Complete {
                key: manifest_key.clone(),
                message: overdue.to_string(),
            })
        })?
        .map_err(|error| {
            MoverError::Upload(upload::UploadError::Complete {
                key: manifest_key.clone(),
                message: error.to_string(),
            })
        })?;
    Ok(BackupResult {
        key,
        manifest_key,
        size_bytes: size,
        checksum: checksum.to_hex().to_string(),
        manifest_hash: summary.hash.to_hex().to_string(),
        files: summary.totals.files,
        entries: summary.totals.entries,
        total_bytes: summary.totals.total_bytes,
        frozen_millis,
        snapshot: None,
        volumes: Vec::new(),
    })
}

/// Restores into `target` from the artifact at `key`/`manifest_key`.
pub struct RestoreRequest<'a> {
    pub target: &'a Path,
    pub key: &'a str,
    pub manifest_key: &'a str,
    /// The manifest hash the Backup recorded.
    pub manifest_hash: &'a str,
    pub backup_uid: &'a str,
    pub restore_uid: &'a str,
    /// Clear a non-empty target first instead of refusing it.
    pub overwrite: bool,
}

/// Before a restore writes anything: an empty target goes ahead (`None`), as does one to
/// overwrite (cleared) or this restore's own unfinished attempt (cleared); this restore's
/// finished output is left as it is (`Some`, what it holds); anything else is refused.
pub(crate) fn prepare_target(
    target: &Path,
    identity: &RestoreIdentity,
    manifest_hash: &str,
    overwrite: bool,
) -> Result<Option<RestoreResult>, MoverError> {
    match extract::first_entry(target).map_err(local("reading the target"))? {
        Some(_) if overwrite => extract::clear(target).map_err(local("clearing the target"))?,
        Some(_) if unfinished_output_of(target, identity) => {
            eprintln!(
                "custody-mover: the target holds an unfinished attempt of this restore ({}); starting again",
                identity.restore_uid
            );
            extract::clear(target).map_err(local("clearing the target"))?
        }
        Some(_) if finished_output_of(target, identity, manifest_hash) => {
            // Written by an earlier attempt of this restore, whose pod then moved to another
            // node: nothing to write. The node agent verifies every file before any release.
            eprintln!(
                "custody-mover: the target holds the finished output of this restore ({}); nothing to write",
                identity.restore_uid
            );
            let manifest = std::fs::File::open(target.join(MANIFEST_PATH))
                .map_err(local("the written manifest"))?;
            let (reader, _) = ManifestReader::new(BufReader::new(manifest))
                .map_err(|error| extract::ExtractError::Manifest(error.to_string()))?;
            let totals = extract::manifest_totals(reader)?;
            return Ok(Some(RestoreResult {
                files: totals.files,
                entries: totals.entries,
                total_bytes: totals.total_bytes,
            }));
        }
        Some(found) => return Err(extract::ExtractError::TargetNotEmpty(found).into()),
        None => {}
    }
    Ok(None)
}

/// A downloaded manifest, read from its start, once its header is checked to name
/// `backup_uid`.
pub(crate) fn checked_manifest(
    manifest: &tempfile::NamedTempFile,
    backup_uid: &str,
) -> Result<ManifestReader<BufReader<std::fs::File>>, MoverError> {
    // A file of its own (not a duplicate descriptor): readers never share an offset.
    let file = manifest.reopen().map_err(local("the manifest"))?;
    let (reader, header) = ManifestReader::new(BufReader::new(file))
        .map_err(|error| extract::ExtractError::Manifest(error.to_string()))?;
    if header.backup_uid != backup_uid {
        return Err(MoverError::ManifestOfAnotherBackup {
            expected: backup_uid.to_string(),
            found: header.backup_uid,
        });
    }
    Ok(reader)
}

/// Marks the target as this restore's before anything is written into it: a retried attempt
/// recognises its own unfinished output (identity, no manifest) and starts again.
pub(crate) fn write_identity(target: &Path, identity: &RestoreIdentity) -> Result<(), MoverError> {
    std::fs::create_dir(target.join(CUSTODY_DIR)).map_err(local("creating .custody"))?;
    let mut out =
        std::fs::File::create(target.join(IDENTITY_PATH)).map_err(local("writing the identity"))?;
    out.write_all(
        &serde_json::to_vec(identity).map_err(|error| MoverError::Local(error.to_string()))?,
    )
    .map_err(local("writing the identity"))?;
    out.sync_all().map_err(local("syncing the identity"))
}

/// Ends a restore: the manifest the agent verifies against, written last, and everything on
/// the volume's disk (its filesystem only) before the pod reports success.
pub(crate) fn seal_target(
    target: &Path,
    manifest: &tempfile::NamedTempFile,
) -> Result<(), MoverError> {
    let mut source = manifest.reopen().map_err(local("the manifest"))?;
    let mut out =
        std::fs::File::create(target.join(MANIFEST_PATH)).map_err(local("writing the manifest"))?;
    std::io::copy(&mut source, &mut out).map_err(local("writing the manifest"))?;
    out.sync_all().map_err(local("syncing the manifest"))?;
    let root = std::fs::File::open(target).map_err(local("opening the target"))?;
    rustix::fs::syncfs(&root)
        .map_err(|errno| MoverError::Local(format!("syncing the target: {errno}")))
}

/// Restores an artifact (format 1) into a volume.
pub async fn restore(
    endpoint: &Endpoint,
    secret: &Credentials,
    request: RestoreRequest<'_>,
) -> Result<RestoreResult, MoverError> {
    let target = request.target.to_path_buf();
    let identity = RestoreIdentity {
        restore_uid: request.restore_uid.to_string(),
        backup_uid: request.backup_uid.to_string(),
    };
    if let Some(done) =
        prepare_target(&target, &identity, request.manifest_hash, request.overwrite)?
    {
        return Ok(done);
    }
    let client = s3::client(endpoint, secret)?;

    // The manifest first: it decides everything that may be written.
    let manifest_file = download_to_file(
        &client,
        &endpoint.bucket,
        request.manifest_key,
        upload::Speed::down(endpoint),
    )
    .await?;
    let found = manifest::hash_reader(BufReader::new(
        manifest_file.reopen().map_err(local("the manifest"))?,
    ))
    .map_err(local("hashing the manifest"))?
    .to_hex()
    .to_string();
    if found != request.manifest_hash {
        return Err(MoverError::ManifestTampered {
            expected: request.manifest_hash.to_string(),
            found,
        });
    }
    let reader = checked_manifest(&manifest_file, request.backup_uid)?;
    // The size limit needs the totals in the trailer: one streaming pass over the manifest.
    let totals = extract::manifest_totals(checked_manifest(&manifest_file, request.backup_uid)?)?;
    let limit = extract::size_limit(totals);
    progress::totals(totals.files, totals.total_bytes);
    usage::has_room(&target, totals.total_bytes, totals.files, totals.entries)?;

    write_identity(&target, &identity)?;
    let (sender, receiver) = mpsc::channel(4);
    let mut downloader = {
        let client = client.clone();
        let bucket = endpoint.bucket.clone();
        let key = request.key.to_string();
        let speed = upload::Speed::down(endpoint);
        tokio::spawn(async move { upload::download(&client, &bucket, &key, sender, speed).await })
    };
    let extract_target = target.clone();
    let extracted = tokio::task::spawn_blocking(move || -> Result<_, MoverError> {
        let mut decoder = zstd::stream::read::Decoder::new(upload::ChunkReader::new(receiver))
            .map_err(local("starting zstd"))?;
        decoder
            .window_log_max(WINDOW_LOG_MAX)
            .map_err(local("limiting the zstd window"))?;
        Ok(extract::extract(&extract_target, decoder, reader, limit)?)
    })
    .await
    .map_err(|error| MoverError::Local(format!("the extracting thread: {error}")))?;
    // A download that gave up is named as such (the extractor only saw its stream end).
    if extracted.is_err()
        && let Ok(Ok(Err(stopped))) =
            tokio::time::timeout(std::time::Duration::from_secs(2), &mut downloader).await
    {
        return Err(downloaded(request.key, stopped));
    }
    downloader.abort();
    let totals = extracted?;
    seal_target(&target, &manifest_file)?;
    Ok(RestoreResult {
        files: totals.files,
        entries: totals.entries,
        total_bytes: totals.total_bytes,
    })
}

/// Whether `target` holds an unfinished attempt of this very restore: its identity names the
/// same Restore and Backup, and the manifest, written last, is not there. A finished restore
/// (manifest present) or anyone else's data is never cleared.
fn unfinished_output_of(target: &Path, identity: &RestoreIdentity) -> bool {
    let recorded = std::fs::read(target.join(IDENTITY_PATH))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<RestoreIdentity>(&bytes).ok());
    recorded.as_ref() == Some(identity) && !target.join(MANIFEST_PATH).exists()
}

/// Whether `target` holds the finished output of this very restore: its identity names the
/// same Restore and Backup, and the manifest it wrote last is the one the Backup recorded.
fn finished_output_of(target: &Path, identity: &RestoreIdentity, manifest_hash: &str) -> bool {
    let recorded = std::fs::read(target.join(IDENTITY_PATH))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<RestoreIdentity>(&bytes).ok());
    recorded.as_ref() == Some(identity)
        && std::fs::File::open(target.join(MANIFEST_PATH))
            .ok()
            .and_then(|file| manifest::hash_reader(BufReader::new(file)).ok())
            .is_some_and(|hash| hash.to_hex().as_str() == manifest_hash)
}

/// The error of a download that gave up.
fn downloaded(key: &str, stopped: upload::DownloadStopped) -> MoverError {
    if stopped.missing {
        MoverError::Missing {
            key: key.to_string(),
            message: stopped.message,
        }
    } else {
        MoverError::Download {
            key: key.to_string(),
            message: stopped.message,
        }
    }
}

/// `key` into a temporary file, resumed after a reset or a stall as the archive is.
async fn download_to_file(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    speed: upload::Speed,
) -> Result<tempfile::NamedTempFile, MoverError> {
    let mut file = tempfile::NamedTempFile::new().map_err(local("a temporary file"))?;
    let (sender, mut receiver) = mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let written = async {
        while let Some(Ok(chunk)) = receiver.recv().await {
            if let Err(error) = file.write_all(&chunk) {
                // The download must not wait for a reader that is gone.
                receiver.close();
                return Err(local("a temporary file")(error));
            }
        }
        Ok::<_, MoverError>(())
    };
    let (downloaded_whole, written) = tokio::join!(
        upload::download(client, bucket, key, sender, speed),
        written
    );
    downloaded_whole.map_err(|stopped| downloaded(key, stopped))?;
    written?;
    file.flush().map_err(local("a temporary file"))?;
    Ok(file)
}

/// The manifest header of a backup.
pub fn header(backup_uid: &str, cluster_uid: &str, created_at: &str) -> Header {
    Header::new(backup_uid, cluster_uid, created_at)
}

/// Where the result goes besides stdout: the container's termination message.
pub fn write_result(path: Option<&PathBuf>, text: &str) {
    if let Some(path) = path
        && let Err(error) = std::fs::write(path, text)
    {
        eprintln!("custody-mover: writing {}: {error}", path.display());
    }
}
