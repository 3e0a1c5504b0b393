//! Command-line interfaces of `custody-agent` and `custody-wait`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use custody_kube::process::LogFormat;

fn seconds(value: &str) -> Result<Duration, String> {
    let seconds: f64 = value
        .parse()
        .map_err(|error| format!("{value:?} is not a number of seconds: {error}"))?;
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(format!("{value:?} must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// custody's node agent: verifies restored volumes on its node and gates their pods.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "custody-agent", version)]
pub struct AgentOptions {
    /// The node this agent serves (from the downward API: `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// Kubeconfig to use; without it, $KUBECONFIG, ~/.kube/config or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubelet's root directory, as mounted into the agent.
    #[arg(long, env = "CUSTODY_KUBELET_ROOT", default_value = crate::volumes::DEFAULT_KUBELET_ROOT)]
    pub kubelet_root: PathBuf,

    /// Where the gate listens: the node's address (`status.hostIP`) and the gate port.
    #[arg(long, env = "CUSTODY_GATE_ADDRESS")]
    pub gate_address: SocketAddr,

    /// PEM certificate of the gate (for the name `custody-agent`), re-read as it changes
    /// (cert-manager). Without it the agent asks the controller's CA for one naming its node
    /// (`<node>.gate.custody.io`), over the report service, with a key that never leaves the
    /// node (kept in the state directory), and renews it itself.
    #[arg(long, env = "CUSTODY_GATE_TLS_CERT", requires = "gate_tls_key")]
    pub gate_tls_cert: Option<PathBuf>,

    /// PEM private key of the gate's certificate.
    #[arg(long, env = "CUSTODY_GATE_TLS_KEY", requires = "gate_tls_cert")]
    pub gate_tls_key: Option<PathBuf>,

    /// The controller's agent-report service, such as `https://custody-controller.custody-system.svc:9444`.
    #[arg(long, env = "CUSTODY_REPORT_URL")]
    pub report_url: Option<String>,

    /// PEM CA bundle that signed the report service's certificate (https URLs); re-read when
    /// it changes (a mounted ConfigMap follows custody's CA as it rotates).
    #[arg(long, env = "CUSTODY_REPORT_CA")]
    pub report_ca: Option<PathBuf>,

    /// ConfigMap, `namespace/name`, whose `ca.crt` is the CA bundle of the report service
    /// (custody's own CA, published by the controller): watched through the API server, so a
    /// rotated CA is trusted at once, before the controller signs with it. Wins over
    /// `--report-ca`.
    #[arg(long, env = "CUSTODY_REPORT_CA_CONFIG_MAP")]
    pub report_ca_config_map: Option<String>,

    /// Name the report service's certificate must carry (default: the URL's host).
    #[arg(long, env = "CUSTODY_REPORT_SERVER_NAME")]
    pub report_server_name: Option<String>,

    /// Projected ServiceAccount token (audience `custody-report`) the agent presents to the
    /// controller; read again for every report, so the kubelet may rotate it.
    #[arg(
        long,
        env = "CUSTODY_REPORT_TOKEN_FILE",
        default_value = "/var/run/secrets/custody/report/token"
    )]
    pub report_token_file: PathBuf,

    /// Seconds between heartbeats when nothing changes.
    #[arg(long = "heartbeat-seconds", env = "CUSTODY_HEARTBEAT_SECONDS", default_value = "10", value_parser = seconds)]
    pub heartbeat: Duration,

    /// Seconds between clock exchanges.
    #[arg(long = "clock-interval-seconds", env = "CUSTODY_CLOCK_INTERVAL_SECONDS", default_value = "30", value_parser = seconds)]
    pub clock_interval: Duration,

    /// How long the clock samples the offset is chosen from are kept, in seconds.
    #[arg(long = "clock-window-seconds", env = "CUSTODY_CLOCK_WINDOW_SECONDS", default_value = "300", value_parser = seconds)]
    pub clock_window: Duration,

    /// How long verification waits for a restored volume to be found mounted under the
    /// kubelet root before it fails, in seconds.
    #[arg(long = "mount-wait-seconds", env = "CUSTODY_MOUNT_WAIT_SECONDS", default_value = "120", value_parser = seconds)]
    pub mount_wait: Duration,

    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "CUSTODY_HTTP_ADDRESS", default_value = "0.0.0.0:8081")]
    pub http_address: SocketAddr,

    /// The longest this agent keeps a filesystem frozen for a backup, whatever the Backup
    /// asks, in seconds.
    #[arg(long, env = "CUSTODY_MAX_FREEZE_SECONDS", default_value = "600")]
    pub max_freeze_seconds: u32,

    /// A directory on the node's own disk where the agent notes the filesystems it froze, so
    /// that a restarted agent thaws what a killed one left frozen.
    #[arg(
        long,
        env = "CUSTODY_STATE_DIR",
        default_value = "/var/lib/custody-agent"
    )]
    pub state_dir: PathBuf,

    /// Log line format.
    #[arg(long, env = "CUSTODY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// custody-wait: blocks a pod's start until the agent on its node has verified every restored
/// volume of the pod. Exits 0 only then; on a failed verification it keeps the pod blocked
/// and prints why.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "custody-wait", version)]
pub struct WaitOptions {
    /// The agent's gate: `host:port`, host normally the node's address (`status.hostIP`).
    #[arg(long, env = "CUSTODY_AGENT_ADDRESS")]
    pub agent: String,

    /// The pod's projected ServiceAccount token with audience `custody`; read again on
    /// every attempt.
    #[arg(
        long,
        env = "CUSTODY_TOKEN_FILE",
        default_value = "/var/run/secrets/custody/gate/token"
    )]
    pub token_file: PathBuf,

    /// PEM CA bundle that signed the agents' gate certificate.
    #[arg(
        long,
        env = "CUSTODY_CA_FILE",
        default_value = "/var/run/secrets/custody/gate/ca.crt"
    )]
    pub ca_file: PathBuf,

    /// Name the agent's certificate must carry.
    #[arg(long, env = "CUSTODY_AGENT_SERVER_NAME", default_value = custody_proto::names::AGENT_SERVER_NAME)]
    pub server_name: String,

    /// Seconds between attempts while the agent cannot be reached.
    #[arg(long = "retry-seconds", env = "CUSTODY_RETRY_SECONDS", default_value = "1", value_parser = seconds)]
    pub retry: Duration,
}

use custody_proto::mover::{env, flags};

/// custody-mover: a volume to S3 and back, streaming, with bounded memory.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "custody-mover", version)]
pub struct MoverOptions {
    #[command(subcommand)]
    pub command: MoverCommand,

    /// S3 endpoint URL of the repository.
    #[arg(long, env = env::ENDPOINT, global = true, default_value = "")]
    pub endpoint: String,

    /// Region of the repository.
    #[arg(
        long,
        env = env::REGION,
        global = true,
        default_value = "us-east-1"
    )]
    pub region: String,

    /// Bucket of the repository.
    #[arg(long, env = env::BUCKET, global = true, default_value = "")]
    pub bucket: String,

    /// Path-style addressing.
    #[arg(long, env = env::PATH_STYLE, global = true)]
    pub path_style: bool,

    /// PEM CA bundle to trust in addition to the system roots.
    #[arg(long, env = env::CA_FILE, global = true)]
    pub ca_file: Option<PathBuf>,

    /// The same as PEM text (how a Job passes a repository's `spec.caBundle`).
    #[arg(
        long,
        env = env::CA_BUNDLE,
        global = true,
        hide_env_values = true
    )]
    pub ca_bundle: Option<String>,

    /// The longest wait for an S3 answer, or for the next bytes of one, in seconds (the
    /// repository's `spec.timeouts.stallSeconds`).
    #[arg(long, env = env::STALL_SECONDS, global = true, default_value_t = custody_proto::s3_limits::DEFAULT_STALL_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub s3_stall_seconds: u64,

    /// The slowest S3 transfer accepted, in KiB/s (the repository's
    /// `spec.timeouts.minimumKiBPerSecond`).
    #[arg(long, env = env::MIN_KIB_PER_SECOND, global = true, default_value_t = custody_proto::s3_limits::DEFAULT_MIN_KIB_PER_SECOND, value_parser = clap::value_parser!(u64).range(1..))]
    pub s3_min_kib_per_second: u64,

    /// The most the mover sends per second, in KiB (the repository's
    /// `spec.bandwidth.uploadKiBPerSecond`); without it, as fast as the link allows.
    #[arg(long, env = env::UPLOAD_KIB_PER_SECOND, global = true, value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub upload_kib_per_second: Option<u64>,

    /// The most the mover receives per second, in KiB (the repository's
    /// `spec.bandwidth.downloadKiBPerSecond`).
    #[arg(long, env = env::DOWNLOAD_KIB_PER_SECOND, global = true, value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub download_kib_per_second: Option<u64>,

    /// Also write the JSON result (or the error) here: the container's termination message.
    #[arg(long = flags::RESULT_FILE, env = env::RESULT_FILE, global = true)]
    pub result_file: Option<PathBuf>,

    /// Format 2: the prefix of the repository (restic's layout) in the bucket. Its password
    /// comes from `CUSTODY_REPOSITORY_PASSWORD`.
    #[arg(long = flags::REPOSITORY_PREFIX, global = true)]
    pub repository_prefix: Option<String>,

    /// Format 2: the repository's ID as recorded; another repository at the prefix is refused.
    #[arg(long = flags::REPOSITORY_ID, global = true)]
    pub repository_id: Option<String>,
}

/// What custody records about a snapshot backup (format 2), sealed in the snapshot.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SnapshotFlags {
    /// The volume claim template whose claim is backed up (`data/<volume>` in the snapshot),
    /// once per `--source`, in the same order.
    #[arg(long = flags::VOLUME, requires = "repository_prefix")]
    pub volume: Vec<String>,
    /// The claim, once per `--volume`.
    #[arg(long = flags::CLAIM, requires = "volume")]
    pub claim: Vec<String>,
    /// Where the application mounts each volume (empty: not known), once per `--volume` or
    /// not at all: a symlink of one volume may lead into another by these paths.
    #[arg(long = flags::MOUNT_PATH, requires = "volume")]
    pub mount_path: Vec<String>,
    #[arg(long = flags::BACKUP_NAME, requires = "volume")]
    pub backup_name: Option<String>,
    #[arg(long = flags::NAMESPACE, requires = "volume")]
    pub namespace: Option<String>,
    #[arg(long = flags::CLUSTER, requires = "volume")]
    pub cluster: Option<String>,
    /// The UID of the Kubernetes cluster's `kube-system` namespace.
    #[arg(long = flags::ORIGIN_CLUSTER, requires = "volume")]
    pub origin_cluster: Option<String>,
    /// How the data is captured (`Stopped`, `Frozen`, `Tool`, `Hooks`, `CrashUnsafe`).
    #[arg(long = flags::CONSISTENCY, requires = "volume")]
    pub consistency: Option<String>,
    /// The snapshot of the Cluster's last completed backup: unchanged files are not read.
    #[arg(long = flags::PARENT, requires = "volume")]
    pub parent: Option<String>,
}

/// What the mover does.
// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, clap::Subcommand)]
pub enum MoverCommand {
    /// Backs a volume up. With `--repository-prefix`: one snapshot in the repository (format
    /// 2). With `--prefix`: tar + zstd, multipart, manifest after the data (format 1).
    #[command(name = flags::BACKUP)]
    Backup {
        /// The volume (read only); with `--repository-prefix`, once per volume of the snapshot.
        #[arg(long = flags::SOURCE, required = true)]
        source: Vec<PathBuf>,
        /// Format 1: key prefix of the artifact; it contains the Backup's UID.
        #[arg(long = flags::PREFIX, required_unless_present = "repository_prefix")]
        prefix: Option<String>,
        #[arg(long = flags::BACKUP_UID)]
        backup_uid: String,
        #[arg(long = flags::CLUSTER_UID)]
        cluster_uid: String,
        #[command(flatten)]
        snapshot: SnapshotFlags,
        /// Freeze the filesystem of this claim (one the pod mounts; repeated: every one,
        /// before any is read) while the volumes are read: the node's agent holds each frozen
        /// as long as the mover asks, up to `--max-freeze-seconds`. The agent, the pod's
        /// token and the agent's CA come from `CUSTODY_AGENT_ADDRESS`, `CUSTODY_TOKEN_FILE`
        /// and `CUSTODY_CA_FILE`.
        #[arg(long = flags::FREEZE_CLAIM, requires = "max_freeze_seconds")]
        freeze_claim: Vec<String>,
        /// The longest the filesystem may stay frozen; past it the backup fails.
        #[arg(long = flags::MAX_FREEZE_SECONDS, requires = "freeze_claim")]
        max_freeze_seconds: Option<u32>,
        /// The most space the source may take on disk, as `du` counts it (a tool's scratch
        /// size): a larger source is refused before anything is read or written.
        #[arg(long = flags::SOURCE_LIMIT_BYTES)]
        source_limit_bytes: Option<u64>,
        /// The (only) volume is read from the tar stream a tool writes into this directory
        /// (see `stream-setup`), not from `--source`: its snapshot is sealed only if the tool
        /// exited 0.
        #[arg(long = flags::TAR_STREAM, requires = "repository_prefix")]
        tar_stream: Option<PathBuf>,
        /// Where the stream's entries lie in the volume (`pgdata`); default its root.
        #[arg(long = flags::TAR_DATA_PATH, requires = "tar_stream")]
        tar_data_path: Option<String>,
    },
    /// A stream tool's Job, in an init container: creates the FIFO the tool writes into, in
    /// `--dir` (shared with the tool's and the mover's containers), and copies this program
    /// there for the tool's container to run `stream-tool` with.
    #[command(name = flags::STREAM_SETUP)]
    StreamSetup {
        #[arg(long = flags::DIR)]
        dir: PathBuf,
    },
    /// Before a tool writes a tree into scratch space: refuses (exit 1, the reason on
    /// standard error) when a claim's data takes more on disk than `--limit-bytes` (the
    /// tool's scratchSize), or all of them more than the free space where `--scratch` is.
    #[command(name = flags::SCRATCH_CHECK)]
    ScratchCheck {
        /// The claim's name, once per `--source`.
        #[arg(long = flags::CLAIM, required = true)]
        claim: Vec<String>,
        /// Where the claim is mounted, once per `--claim`.
        #[arg(long = flags::SOURCE, required = true)]
        source: Vec<PathBuf>,
        #[arg(long = flags::SCRATCH)]
        scratch: PathBuf,
        #[arg(long = flags::LIMIT_BYTES)]
        limit_bytes: u64,
    },
    /// In the tool's container: runs the command after `--` with its standard output on the
    /// FIFO in `--dir`, and writes its exit code there once it exited; exits with it.
    #[command(name = flags::STREAM_TOOL)]
    StreamTool {
        #[arg(long = flags::DIR)]
        dir: PathBuf,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Streams an artifact into an empty volume, checked against its manifest while it
    /// writes, and leaves the manifest and the restore identity in `.custody/`.
    #[command(name = flags::RESTORE)]
    Restore {
        /// The volume to write.
        #[arg(long = flags::TARGET)]
        target: PathBuf,
        /// Format 2: the snapshot to restore from (with `--repository-prefix`).
        #[arg(long = flags::SNAPSHOT, requires = "volume", conflicts_with_all = ["key", "manifest_key"])]
        snapshot: Option<String>,
        /// Format 2: which of the snapshot's volumes.
        #[arg(long = flags::VOLUME, requires = "snapshot")]
        volume: Option<String>,
        /// Format 1: key of the data object.
        #[arg(long = flags::KEY, required_unless_present = "snapshot", requires = "manifest_key")]
        key: Option<String>,
        /// Format 1: key of the manifest object.
        #[arg(long = flags::MANIFEST_KEY, requires = "key")]
        manifest_key: Option<String>,
        /// BLAKE3 of the manifest as the Backup recorded it.
        #[arg(long = flags::MANIFEST_HASH)]
        manifest_hash: String,
        #[arg(long = flags::BACKUP_UID)]
        backup_uid: String,
        #[arg(long = flags::RESTORE_UID)]
        restore_uid: String,
        /// Clear a non-empty target first instead of refusing it.
        #[arg(long = flags::OVERWRITE)]
        overwrite: bool,
    },
    /// Prunes the repository (with `--repository-prefix`): packs no snapshot needs are marked,
    /// and deleted by a later prune once marked for the grace (23 h). Prints what it did.
    #[command(name = flags::PRUNE)]
    Prune,
    /// Checks the repository (with `--repository-prefix`) as `restic check` does, reading
    /// `--read-data-percent` % of its packs whole. Prints what it found.
    #[command(name = flags::CHECK)]
    Check {
        #[arg(long = flags::READ_DATA_PERCENT, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
        read_data_percent: u8,
    },
    /// Verifies a restored directory the way the agent does (without the mount check): the
    /// manifest in `.custody/` must hash to `--manifest-hash` and the content must match it.
    #[command(name = flags::VERIFY)]
    Verify {
        #[arg(long = flags::TARGET)]
        target: PathBuf,
        #[arg(long = flags::MANIFEST_HASH)]
        manifest_hash: String,
        #[arg(long = flags::BACKUP_UID)]
        backup_uid: String,
        #[arg(long = flags::RESTORE_UID)]
        restore_uid: String,
    },
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use custody_proto::mover::Invocation;

    use super::{MoverCommand, MoverOptions};

    /// The controller builds the mover's command line from [`Invocation`]; the mover must
    /// read every flag of it back.
    #[test]
    fn the_mover_reads_what_the_controller_writes() {
        let backup = Invocation::Backup {
            source: "/data".into(),
            prefix: "p/ns/db/uid".into(),
            backup_uid: "b".into(),
            cluster_uid: "c".into(),
            freeze: Some(custody_proto::mover::FreezeArgs {
                claims: vec!["data-db-0".into()],
                max_seconds: 30,
            }),
            source_limit_bytes: Some(1 << 20),
        };
        let parsed = MoverOptions::try_parse_from(
            std::iter::once("custody-mover".to_string()).chain(backup.args()),
        )
        .expect("backup flags");
        assert_eq!(
            parsed.result_file.as_deref(),
            Some(std::path::Path::new(custody_proto::mover::TERMINATION_LOG))
        );
        match parsed.command {
            MoverCommand::Backup {
                source,
                prefix,
                backup_uid,
                cluster_uid,
                freeze_claim,
                max_freeze_seconds,
                source_limit_bytes,
                ..
            } => {
                assert_eq!(source_limit_bytes, Some(1 << 20));
                assert_eq!(source, [std::path::PathBuf::from("/data")]);
                assert_eq!(
                    (prefix.as_deref(), backup_uid.as_str(), cluster_uid.as_str()),
                    (Some("p/ns/db/uid"), "b", "c")
                );
                assert_eq!(freeze_claim, ["data-db-0"]);
                assert_eq!(max_freeze_seconds, Some(30));
            }
            other => panic!("parsed as {other:?}"),
        }

        let restore = Invocation::Restore {
            target: "/data".into(),
            key: "k".into(),
            manifest_key: "m".into(),
            manifest_hash: "h".into(),
            backup_uid: "b".into(),
            restore_uid: "r".into(),
        };
        let parsed = MoverOptions::try_parse_from(
            std::iter::once("custody-mover".to_string()).chain(restore.args()),
        )
        .expect("restore flags");
        match parsed.command {
            MoverCommand::Restore {
                target,
                key,
                manifest_key,
                manifest_hash,
                backup_uid,
                restore_uid,
                overwrite,
                snapshot,
                ..
            } => {
                assert_eq!(target, std::path::PathBuf::from("/data"));
                assert_eq!(
                    [key, manifest_key],
                    [Some("k".to_string()), Some("m".to_string())]
                );
                assert_eq!(
                    [manifest_hash, backup_uid, restore_uid],
                    ["h", "b", "r"].map(String::from)
                );
                assert!(!overwrite);
                assert_eq!(snapshot, None);
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn maintenance_invocations_parse_as_the_mover_reads_them() {
        use custody_proto::mover::RepositoryArgs;
        let repository = RepositoryArgs {
            prefix: "custody/custody_repository".into(),
            id: Some("r1".into()),
        };
        let parse = |invocation: Invocation| {
            MoverOptions::try_parse_from(
                std::iter::once("custody-mover".to_string()).chain(invocation.args()),
            )
            .expect("maintenance flags")
        };
        let prune = parse(Invocation::Prune {
            repository: repository.clone(),
        });
        assert!(matches!(prune.command, MoverCommand::Prune));
        assert_eq!(
            prune.repository_prefix.as_deref(),
            Some("custody/custody_repository")
        );
        assert_eq!(prune.repository_id.as_deref(), Some("r1"));
        let check = parse(Invocation::Check {
            repository,
            read_data_percent: 25,
        });
        assert!(matches!(
            check.command,
            MoverCommand::Check {
                read_data_percent: 25
            }
        ));
        assert!(
            MoverOptions::try_parse_from(["custody-mover", "check", "--read-data-percent", "101"])
                .is_err(),
            "more than all of the data"
        );
    }

    #[test]
    fn snapshot_invocations_parse_as_the_mover_reads_them() {
        use custody_proto::mover::{FreezeArgs, RepositoryArgs, SnapshotBackupArgs, SourceVolume};
        let repository = RepositoryArgs {
            prefix: "custody/custody_repository".into(),
            id: Some("r1".into()),
        };
        let backup = Invocation::SnapshotBackup(SnapshotBackupArgs {
            repository: repository.clone(),
            volumes: vec![
                SourceVolume {
                    name: "data".into(),
                    claim: "data-db-0".into(),
                    source: "/data/data".into(),
                    mount_path: "/var/lib/postgresql/data".into(),
                },
                SourceVolume {
                    name: "wal".into(),
                    claim: "wal-db-0".into(),
                    source: "/data/wal".into(),
                    mount_path: String::new(),
                },
            ],
            backup_name: "nightly".into(),
            backup_uid: "b".into(),
            namespace: "shop".into(),
            cluster: "db".into(),
            cluster_uid: "c".into(),
            origin_cluster: "o".into(),
            consistency: "Frozen".into(),
            parent: Some("p".into()),
            freeze: Some(FreezeArgs {
                claims: vec!["data-db-0".into(), "wal-db-0".into()],
                max_seconds: 30,
            }),
            source_limit_bytes: Some(2 << 20),
            tar_stream: Some(custody_proto::mover::TarStreamArgs {
                dir: "/stream".into(),
                data_path: "pgdata".into(),
            }),
        });
        let parsed = MoverOptions::try_parse_from(
            std::iter::once("custody-mover".to_string()).chain(backup.args()),
        )
        .expect("snapshot backup flags");
        assert_eq!(
            parsed.repository_prefix.as_deref(),
            Some("custody/custody_repository")
        );
        assert_eq!(parsed.repository_id.as_deref(), Some("r1"));
        match parsed.command {
            MoverCommand::Backup {
                source,
                prefix,
                snapshot,
                freeze_claim,
                max_freeze_seconds,
                source_limit_bytes,
                tar_stream,
                tar_data_path,
                ..
            } => {
                assert_eq!(source_limit_bytes, Some(2 << 20));
                assert_eq!(tar_stream, Some("/stream".into()));
                assert_eq!(tar_data_path.as_deref(), Some("pgdata"));
                assert_eq!(prefix, None);
                assert_eq!(
                    source,
                    [std::path::PathBuf::from("/data/data"), "/data/wal".into()]
                );
                assert_eq!(snapshot.volume, ["data", "wal"]);
                assert_eq!(snapshot.claim, ["data-db-0", "wal-db-0"]);
                assert_eq!(snapshot.mount_path, ["/var/lib/postgresql/data", ""]);
                assert_eq!(freeze_claim, ["data-db-0", "wal-db-0"]);
                assert_eq!(max_freeze_seconds, Some(30));
                assert_eq!(
                    [
                        snapshot.backup_name,
                        snapshot.namespace,
                        snapshot.cluster,
                        snapshot.origin_cluster,
                        snapshot.consistency,
                        snapshot.parent,
                    ],
                    ["nightly", "shop", "db", "o", "Frozen", "p"]
                        .map(|value| Some(value.to_string()))
                );
            }
            other => panic!("parsed as {other:?}"),
        }

        let restore = Invocation::SnapshotRestore {
            target: "/data".into(),
            repository,
            snapshot: "s".into(),
            volume: "data".into(),
            manifest_hash: "h".into(),
            backup_uid: "b".into(),
            restore_uid: "r".into(),
        };
        let parsed = MoverOptions::try_parse_from(
            std::iter::once("custody-mover".to_string()).chain(restore.args()),
        )
        .expect("snapshot restore flags");
        match parsed.command {
            MoverCommand::Restore {
                snapshot,
                volume,
                key,
                manifest_hash,
                ..
            } => {
                assert_eq!(
                    [snapshot, volume, key],
                    [Some("s".to_string()), Some("data".to_string()), None]
                );
                assert_eq!(manifest_hash, "h");
            }
            other => panic!("parsed as {other:?}"),
        }
    }
}
