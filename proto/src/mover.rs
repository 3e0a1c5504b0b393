//! The contract between the controller and `custody-mover`: how a Job invokes it (flags and
//! environment), where its artifact's objects are, and the result it leaves in its
//! container's termination message.

use serde::{Deserialize, Serialize};

use crate::reasons::MoverFailure;

/// Name of the data object under an artifact prefix.
pub const DATA_OBJECT: &str = "data.tar.zst";
/// Name of the manifest object under an artifact prefix.
pub const MANIFEST_OBJECT: &str = "manifest.jsonl";

/// The data and manifest keys of an artifact under `prefix`.
pub fn object_keys(prefix: &str) -> (String, String) {
    let prefix = prefix.trim_end_matches('/');
    (
        format!("{prefix}/{DATA_OBJECT}"),
        format!("{prefix}/{MANIFEST_OBJECT}"),
    )
}

/// Where a container's result goes: Kubernetes reads it as the termination message.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// The mover's exit code for a failure that trying again cannot mend
/// ([`MoverFailure::permanent`]): a restore's Job fails at once on it (its `podFailurePolicy`),
/// and the node agent reports the volume failed. Any other non-zero exit is tried again.
pub const EXIT_PERMANENT: u8 = 3;

/// Environment variables of the mover (and of a user's backup command, which gets the same
/// repository settings).
pub mod env {
    /// S3 endpoint URL of the repository.
    pub const ENDPOINT: &str = "CUSTODY_S3_ENDPOINT";
    /// Region of the repository.
    pub const REGION: &str = "CUSTODY_S3_REGION";
    /// Bucket of the repository.
    pub const BUCKET: &str = "CUSTODY_S3_BUCKET";
    /// `true` for path-style addressing.
    pub const PATH_STYLE: &str = "CUSTODY_S3_PATH_STYLE";
    /// A file with the PEM CA bundle.
    pub const CA_FILE: &str = "CUSTODY_S3_CA_FILE";
    /// The PEM CA bundle itself.
    pub const CA_BUNDLE: &str = "CUSTODY_S3_CA_BUNDLE";
    /// Where a user's backup command writes (the command method only).
    pub const PREFIX: &str = "CUSTODY_S3_PREFIX";
    /// The longest wait for an S3 answer, in seconds (the repository's `spec.timeouts`).
    pub const STALL_SECONDS: &str = "CUSTODY_S3_STALL_SECONDS";
    /// The slowest S3 transfer accepted, in KiB/s (the repository's `spec.timeouts`).
    pub const MIN_KIB_PER_SECOND: &str = "CUSTODY_S3_MIN_KIB_PER_SECOND";
    /// The most the mover sends per second, in KiB (the repository's `spec.bandwidth`).
    pub const UPLOAD_KIB_PER_SECOND: &str = "CUSTODY_S3_UPLOAD_KIB_PER_SECOND";
    /// The most the mover receives per second, in KiB (the repository's `spec.bandwidth`).
    pub const DOWNLOAD_KIB_PER_SECOND: &str = "CUSTODY_S3_DOWNLOAD_KIB_PER_SECOND";
    /// Where the mover also writes its result.
    pub const RESULT_FILE: &str = "CUSTODY_RESULT_FILE";
    /// The access key, from the repository's credentials Secret.
    pub const ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
    /// The secret key, from the repository's credentials Secret.
    pub const SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
    /// The role a web identity assumes (the repository's `spec.webIdentity.roleArn`).
    pub const ROLE_ARN: &str = "AWS_ROLE_ARN";
    /// The file holding the ServiceAccount token a web identity presents (projected into
    /// the mover's pod by the kubelet, which keeps it fresh).
    pub const WEB_IDENTITY_TOKEN_FILE: &str = "AWS_WEB_IDENTITY_TOKEN_FILE";
    /// The name of the session a web identity opens.
    pub const ROLE_SESSION_NAME: &str = "AWS_ROLE_SESSION_NAME";
    /// The STS endpoint a web identity asks (the repository's `spec.webIdentity.stsEndpoint`).
    pub const STS_ENDPOINT: &str = "AWS_ENDPOINT_URL_STS";
    /// A repository password, from the repository's key Secret (format 2).
    pub const REPOSITORY_PASSWORD: &str = "CUSTODY_REPOSITORY_PASSWORD";
    /// The repository's master key (restic's JSON of it), from the Secret custody keeps for
    /// its movers (format 2): opens without a password's key derivation.
    pub const REPOSITORY_KEY: &str = "CUSTODY_REPOSITORY_KEY";
}

/// The mover's subcommands and flags.
pub mod flags {
    pub const BACKUP: &str = "backup";
    pub const RESTORE: &str = "restore";
    pub const VERIFY: &str = "verify";
    pub const SOURCE: &str = "source";
    pub const TARGET: &str = "target";
    pub const PREFIX: &str = "prefix";
    pub const KEY: &str = "key";
    pub const MANIFEST_KEY: &str = "manifest-key";
    pub const MANIFEST_HASH: &str = "manifest-hash";
    pub const BACKUP_UID: &str = "backup-uid";
    pub const CLUSTER_UID: &str = "cluster-uid";
    pub const RESTORE_UID: &str = "restore-uid";
    pub const OVERWRITE: &str = "overwrite";
    pub const RESULT_FILE: &str = "result-file";
    pub const FREEZE_CLAIM: &str = "freeze-claim";
    pub const MAX_FREEZE_SECONDS: &str = "max-freeze-seconds";
    pub const SOURCE_LIMIT_BYTES: &str = "source-limit-bytes";
    pub const REPOSITORY_PREFIX: &str = "repository-prefix";
    pub const REPOSITORY_ID: &str = "repository-id";
    pub const SNAPSHOT: &str = "snapshot";
    pub const VOLUME: &str = "volume";
    pub const CLAIM: &str = "claim";
    pub const MOUNT_PATH: &str = "mount-path";
    pub const BACKUP_NAME: &str = "backup-name";
    pub const NAMESPACE: &str = "namespace";
    pub const CLUSTER: &str = "cluster";
    pub const ORIGIN_CLUSTER: &str = "origin-cluster";
    pub const CONSISTENCY: &str = "consistency";
    pub const PARENT: &str = "parent";
    pub const PRUNE: &str = "prune";
    pub const CHECK: &str = "check";
    pub const READ_DATA_PERCENT: &str = "read-data-percent";
    pub const TAR_STREAM: &str = "tar-stream";
    pub const TAR_DATA_PATH: &str = "tar-data-path";
    pub const STREAM_SETUP: &str = "stream-setup";
    pub const STREAM_TOOL: &str = "stream-tool";
    pub const SCRATCH_CHECK: &str = "scratch-check";
    pub const SCRATCH: &str = "scratch";
    pub const LIMIT_BYTES: &str = "limit-bytes";
    pub const DIR: &str = "dir";
}

/// `custody-mover scratch-check`'s exit code when it refused the copy (any other failure is
/// its own).
pub const SCRATCH_REFUSED_EXIT: i32 = 3;

/// A tool that writes a tar stream instead of a tree: where the stream and its writer's
/// outcome are, the files [`stream`] names in a directory the tool's and the mover's
/// containers share.
pub mod stream {
    /// The FIFO the tool's standard output is connected to.
    pub const FIFO: &str = "tar";
    /// The tool's exit code, written once it exited (by `custody-mover stream-tool`).
    pub const STATUS: &str = "status";
    /// The copy of `custody-mover` the tool's container runs its command under.
    pub const PROGRAM: &str = "custody-mover";
    /// Written by the mover once it is done with the stream (read or failed): a tool that has
    /// not opened the FIFO by then never will, and ends instead of waiting for a reader.
    pub const MOVER_ENDED: &str = "mover-ended";
}

/// The first volume of a snapshot backup is read from a tar stream a tool writes, not from a
/// directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarStreamArgs {
    /// The directory shared with the tool's container ([`stream`]'s files).
    pub dir: String,
    /// Where the stream's entries lie in the volume (`pgdata`); empty: its root.
    pub data_path: String,
}

/// A frozen copy: the node agent freezes the filesystem of every claim in `claims` (all of
/// them before the first read, thawed together once the last file is read), each for at most
/// `max_seconds`. The mover finds the agent, its token and the agent's CA in the same
/// environment as `custody-wait` (`CUSTODY_AGENT_ADDRESS`, `CUSTODY_TOKEN_FILE`,
/// `CUSTODY_CA_FILE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreezeArgs {
    pub claims: Vec<String>,
    pub max_seconds: u32,
}

impl FreezeArgs {
    fn args(&self) -> Vec<String> {
        self.claims
            .iter()
            .flat_map(|claim| [format!("--{}", flags::FREEZE_CLAIM), claim.clone()])
            .chain([
                format!("--{}", flags::MAX_FREEZE_SECONDS),
                self.max_seconds.to_string(),
            ])
            .collect()
    }
}

/// One volume a snapshot backup reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceVolume {
    /// The volume claim template (`data/<name>` in the snapshot).
    pub name: String,
    /// The claim read.
    pub claim: String,
    /// Where the mover reads it.
    pub source: String,
    /// Where the application mounts it (empty: not known). A symlink of one volume may lead
    /// into another volume of the same backup by these paths (`pg_wal` on a volume of its
    /// own); the manifest records them.
    pub mount_path: String,
}

/// Where a format 2 repository is in the bucket, and which one it must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepositoryArgs {
    pub prefix: String,
    /// The repository's ID as recorded: another repository at the prefix is refused.
    pub id: Option<String>,
}

/// A snapshot backup: the volumes, and what custody seals in the snapshot about them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotBackupArgs {
    pub repository: RepositoryArgs,
    /// Every volume, in the Cluster's order of its claim templates: one snapshot holds them.
    pub volumes: Vec<SourceVolume>,
    pub backup_name: String,
    pub backup_uid: String,
    pub namespace: String,
    pub cluster: String,
    pub cluster_uid: String,
    /// The UID of the `kube-system` namespace of the Kubernetes cluster that backs up.
    pub origin_cluster: String,
    /// How the data is captured (`Stopped`, `Frozen`, `Tool`, `Hooks`, `CrashUnsafe`).
    pub consistency: String,
    /// The Cluster's last snapshot: files unchanged since it are not read.
    pub parent: Option<String>,
    /// Freeze the volumes' filesystems while they are read.
    pub freeze: Option<FreezeArgs>,
    /// The most space the source may take on disk (a tool's scratch size): more is refused.
    pub source_limit_bytes: Option<u64>,
    /// The (only) volume comes from a tool's tar stream.
    pub tar_stream: Option<TarStreamArgs>,
}

/// What a Job asks the mover to do; [`Invocation::args`] is its command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Stream the volume at `source` into the artifact under `prefix`.
    Backup {
        source: String,
        prefix: String,
        backup_uid: String,
        cluster_uid: String,
        /// Freeze the volume's filesystem while it is read.
        freeze: Option<FreezeArgs>,
        /// The most space the source may take on disk (a tool's scratch size).
        source_limit_bytes: Option<u64>,
    },
    /// Back the volume at `source` up into one snapshot of the repository (format 2).
    SnapshotBackup(SnapshotBackupArgs),
    /// Prune the repository (format 2): what no snapshot needs is marked, and deleted once
    /// marked for the grace.
    Prune { repository: RepositoryArgs },
    /// Check the repository (format 2), reading `read_data_percent` % of its packs whole.
    Check {
        repository: RepositoryArgs,
        read_data_percent: u8,
    },
    /// Restore one volume of a snapshot (format 2) into the volume at `target`.
    SnapshotRestore {
        target: String,
        repository: RepositoryArgs,
        snapshot: String,
        volume: String,
        manifest_hash: String,
        /// The UID of the Backup the snapshot names (its record's, even for an imported one).
        backup_uid: String,
        restore_uid: String,
    },
    /// Stream an artifact into the volume at `target`.
    Restore {
        target: String,
        key: String,
        manifest_key: String,
        manifest_hash: String,
        backup_uid: String,
        restore_uid: String,
    },
}

impl Invocation {
    /// The arguments after the program name, the result going to the termination message.
    pub fn args(&self) -> Vec<String> {
        let flag = |name: &str, value: &str| [format!("--{name}"), value.to_string()];
        let mut args: Vec<String> = match self {
            Invocation::Backup {
                source,
                prefix,
                backup_uid,
                cluster_uid,
                freeze,
                source_limit_bytes,
            } => std::iter::once(flags::BACKUP.to_string())
                .chain(flag(flags::SOURCE, source))
                .chain(flag(flags::PREFIX, prefix))
                .chain(flag(flags::BACKUP_UID, backup_uid))
                .chain(flag(flags::CLUSTER_UID, cluster_uid))
                .chain(freeze.iter().flat_map(FreezeArgs::args))
                .chain(
                    source_limit_bytes
                        .iter()
                        .flat_map(|limit| flag(flags::SOURCE_LIMIT_BYTES, &limit.to_string())),
                )
                .collect(),
            Invocation::SnapshotBackup(backup) => {
                let mounts = backup
                    .volumes
                    .iter()
                    .any(|volume| !volume.mount_path.is_empty());
                let mut args: Vec<String> = std::iter::once(flags::BACKUP.to_string())
                    .chain(backup.volumes.iter().flat_map(|volume| {
                        let mut args = Vec::from(flag(flags::SOURCE, &volume.source));
                        args.extend(flag(flags::VOLUME, &volume.name));
                        args.extend(flag(flags::CLAIM, &volume.claim));
                        if mounts {
                            args.extend(flag(flags::MOUNT_PATH, &volume.mount_path));
                        }
                        args
                    }))
                    .chain(repository_flags(&backup.repository))
                    .chain(flag(flags::BACKUP_NAME, &backup.backup_name))
                    .chain(flag(flags::BACKUP_UID, &backup.backup_uid))
                    .chain(flag(flags::NAMESPACE, &backup.namespace))
                    .chain(flag(flags::CLUSTER, &backup.cluster))
                    .chain(flag(flags::CLUSTER_UID, &backup.cluster_uid))
                    .chain(flag(flags::ORIGIN_CLUSTER, &backup.origin_cluster))
                    .chain(flag(flags::CONSISTENCY, &backup.consistency))
                    .collect();
                if let Some(parent) = &backup.parent {
                    args.extend(flag(flags::PARENT, parent));
                }
                if let Some(freeze) = &backup.freeze {
                    args.extend(freeze.args());
                }
                if let Some(limit) = backup.source_limit_bytes {
                    args.extend(flag(flags::SOURCE_LIMIT_BYTES, &limit.to_string()));
                }
                if let Some(stream) = &backup.tar_stream {
                    args.extend(flag(flags::TAR_STREAM, &stream.dir));
                    if !stream.data_path.is_empty() {
                        args.extend(flag(flags::TAR_DATA_PATH, &stream.data_path));
                    }
                }
                args
            }
            Invocation::Prune { repository } => std::iter::once(flags::PRUNE.to_string())
                .chain(repository_flags(repository))
                .collect(),
            Invocation::Check {
                repository,
                read_data_percent,
            } => std::iter::once(flags::CHECK.to_string())
                .chain(repository_flags(repository))
                .chain(flag(
                    flags::READ_DATA_PERCENT,
                    &read_data_percent.to_string(),
                ))
                .collect(),
            Invocation::SnapshotRestore {
                target,
                repository,
                snapshot,
                volume,
                manifest_hash,
                backup_uid,
                restore_uid,
            } => std::iter::once(flags::RESTORE.to_string())
                .chain(flag(flags::TARGET, target))
                .chain(repository_flags(repository))
                .chain(flag(flags::SNAPSHOT, snapshot))
                .chain(flag(flags::VOLUME, volume))
                .chain(flag(flags::MANIFEST_HASH, manifest_hash))
                .chain(flag(flags::BACKUP_UID, backup_uid))
                .chain(flag(flags::RESTORE_UID, restore_uid))
                .collect(),
            Invocation::Restore {
                target,
                key,
                manifest_key,
                manifest_hash,
                backup_uid,
                restore_uid,
            } => std::iter::once(flags::RESTORE.to_string())
                .chain(flag(flags::TARGET, target))
                .chain(flag(flags::KEY, key))
                .chain(flag(flags::MANIFEST_KEY, manifest_key))
                .chain(flag(flags::MANIFEST_HASH, manifest_hash))
                .chain(flag(flags::BACKUP_UID, backup_uid))
                .chain(flag(flags::RESTORE_UID, restore_uid))
                .collect(),
        };
        args.extend(flag(flags::RESULT_FILE, TERMINATION_LOG));
        args
    }
}

fn repository_flags(repository: &RepositoryArgs) -> Vec<String> {
    let mut args = vec![
        format!("--{}", flags::REPOSITORY_PREFIX),
        repository.prefix.clone(),
    ];
    if let Some(id) = &repository.id {
        args.extend([format!("--{}", flags::REPOSITORY_ID), id.clone()]);
    }
    args
}

/// What a backup produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupResult {
    /// Format 1 (an archive object) only: its key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Format 1 only: the manifest object's key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub manifest_key: String,
    /// Format 1: bytes of the compressed archive. Format 2: bytes this backup added to the
    /// repository (compressed and encrypted; what a backup of unchanged data does not add).
    pub size_bytes: u64,
    /// Format 1 only: BLAKE3 of the compressed archive, hex.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub checksum: String,
    /// Format 2: the snapshot written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotWritten>,
    /// BLAKE3 of the manifest, hex: the trust anchor for restores.
    pub manifest_hash: String,
    pub files: u64,
    pub entries: u64,
    /// Bytes of file content read from the volume.
    pub total_bytes: u64,
    /// How long the volume's filesystem was frozen, in milliseconds (a frozen copy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_millis: Option<u64>,
    /// Format 2: every volume of the snapshot with its manifest, in order (the fields above
    /// count them all; `manifest_hash` is the first's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeWritten>,
}

/// One volume a snapshot backup read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeWritten {
    /// The volume claim template.
    pub name: String,
    /// BLAKE3 of its manifest, hex.
    pub manifest_hash: String,
    pub files: u64,
    pub total_bytes: u64,
}

/// A snapshot a backup wrote into the repository (format 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotWritten {
    /// The snapshot's ID (64 hex digits).
    pub id: String,
    /// The repository's ID (its config's), which the snapshot is in.
    pub repository_id: String,
    /// Bytes of file content that were new to the repository (before compression).
    pub bytes_new: u64,
    /// Files read (the others were unchanged since the parent snapshot and not read).
    pub files_read: u64,
}

/// What a restore wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreResult {
    pub files: u64,
    pub entries: u64,
    pub total_bytes: u64,
}

/// What `verify` checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResult {
    pub entries: u64,
    pub files: u64,
    pub bytes: u64,
}

/// Why the mover failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub reason: MoverFailure,
    pub message: String,
}

/// A failure as the mover prints it: `{"error": {"reason": …, "message": …}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureReport {
    pub error: Failure,
}

/// The mover's result as the controller reads it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report<T> {
    /// It finished and says what it did.
    Done(T),
    /// It failed and says why.
    Failed(Failure),
    /// The text is neither (truncated, or not the mover's).
    Unreadable(String),
}

/// Reads a mover's result (its termination message).
pub fn read_report<T: for<'de> Deserialize<'de>>(text: &str) -> Report<T> {
    let text = text.trim();
    if let Ok(failed) = serde_json::from_str::<FailureReport>(text) {
        return Report::Failed(failed.error);
    }
    match serde_json::from_str::<T>(text) {
        Ok(done) => Report::Done(done),
        Err(error) => Report::Unreadable(format!("{error}: {text:?}")),
    }
}

/// The text the mover prints for a failure.
pub fn failure_text(reason: MoverFailure, message: String) -> String {
    serde_json::to_string(&FailureReport {
        error: Failure { reason, message },
    })
    .expect("plain data serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_read_back() {
        let done = BackupResult {
            key: "p/data.tar.zst".into(),
            manifest_key: "p/manifest.jsonl".into(),
            size_bytes: 42,
            checksum: "c".into(),
            manifest_hash: "m".into(),
            files: 1,
            entries: 2,
            total_bytes: 5,
            frozen_millis: Some(7),
            snapshot: None,
            volumes: Vec::new(),
        };
        let text = serde_json::to_string(&done).unwrap();
        assert_eq!(read_report::<BackupResult>(&text), Report::Done(done));
        let failed = failure_text(MoverFailure::UploadFailed, "the bucket is gone".into());
        assert_eq!(
            failed,
            r#"{"error":{"reason":"UploadFailed","message":"the bucket is gone"}}"#
        );
        assert_eq!(
            read_report::<BackupResult>(&failed),
            Report::Failed(Failure {
                reason: MoverFailure::UploadFailed,
                message: "the bucket is gone".into()
            })
        );
        let newer = r#"{"error":{"reason":"FromTheFuture","message":"m"}}"#;
        assert!(matches!(
            read_report::<BackupResult>(newer),
            Report::Failed(Failure {
                reason: MoverFailure::MoverFailed,
                ..
            })
        ));
        assert!(matches!(
            read_report::<BackupResult>(r#"{"key":"k"}"#),
            Report::Unreadable(_)
        ));
        assert!(matches!(
            read_report::<BackupResult>("not json"),
            Report::Unreadable(_)
        ));
    }

    #[test]
    fn invocations_name_every_flag_once() {
        let args = Invocation::Restore {
            target: "/data".into(),
            key: "k".into(),
            manifest_key: "m".into(),
            manifest_hash: "h".into(),
            backup_uid: "b".into(),
            restore_uid: "r".into(),
        }
        .args();
        assert_eq!(
            args,
            [
                "restore",
                "--target",
                "/data",
                "--key",
                "k",
                "--manifest-key",
                "m",
                "--manifest-hash",
                "h",
                "--backup-uid",
                "b",
                "--restore-uid",
                "r",
                "--result-file",
                "/dev/termination-log"
            ]
        );
        assert_eq!(
            object_keys("a/b"),
            ("a/b/data.tar.zst".into(), "a/b/manifest.jsonl".into())
        );
    }
}
