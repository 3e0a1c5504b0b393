//! `Backup`: one backup run of a Cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, LocalObjectReference, conditions_schema};

/// Desired state of a Backup.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, PartialEq, KubeSchema)]
#[kube(
    group = "custody.io",
    version = "v1alpha1",
    kind = "Backup",
    doc = "One backup run of a Cluster's volumes into a BackupRepository. Its status records exactly which object-storage keys hold the artifact, so that deleting the Backup can delete those keys and nothing else.",
    namespaced,
    status = "BackupStatus",
    shortname = "cbk",
    category = "custody",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.transfer.summary"}"#,
    printcolumn = r#"{"name":"Size","type":"string","jsonPath":".status.size"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Consistency","type":"string","jsonPath":".status.consistency"}"#,
    printcolumn = r#"{"name":"Completed","type":"date","jsonPath":".status.completionTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("a Backup's spec is immutable: create a new Backup instead"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.importedSnapshot) || self.deletionPolicy == 'Retain'").message("an imported Backup never deletes its snapshot (it belongs to the Backup that wrote it): set deletionPolicy: Retain"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.importedSnapshot) || has(self.repositoryRef)").message("an imported Backup names the BackupRepository that holds its snapshot (repositoryRef)"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.importedSnapshot) || (!has(self.command) && !has(self.consistency))").message("an imported Backup runs nothing: command and consistency do not apply"))]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// The Cluster, in this namespace, whose volumes are backed up.
    pub cluster_ref: LocalObjectReference,

    /// Repository to write to. Defaults to the Cluster's `spec.repositoryRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_ref: Option<LocalObjectReference>,

    /// What happens to the artifact in object storage when this Backup is deleted: `Delete`
    /// removes exactly the keys recorded in its status, `Retain` keeps them.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// Back up with a command of your own instead of custody's mover: it runs in a Job on the
    /// node where the volume is mounted (the volume read-only at `/data`) and writes one dump
    /// under `prefix` in the repository, named with a UTC timestamp. custody then attributes
    /// the dump to this Backup by the name's time (corrected by the node's measured clock
    /// offset) and the object's `LastModified`; such a Backup cannot be restored by custody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandBackup>,

    /// How the copy of a volume that a running pod mounts is made consistent. Defaults to the
    /// Cluster's `spec.consistency`. Without one, a volume backup runs only while the
    /// application is stopped (no running pod mounts the claim) and is refused otherwise:
    /// files copied one after another while a database writes are no point in time, and the
    /// database may not start from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<Consistency>,

    /// Makes this Backup a read-only view of a snapshot that already is in the (encrypted)
    /// repository `repositoryRef`, written by a Backup this cluster or namespace may never
    /// have seen: the snapshot's ID (64 hex digits). Nothing runs: custody opens the snapshot
    /// under the repository's key, and what it records (the Backup that wrote it, its
    /// volumes and their manifest hashes, consistency, times) becomes this Backup's status;
    /// a Restore then restores it like any Backup. It never deletes the snapshot (the
    /// Backup that wrote it owns it): `deletionPolicy` must be `Retain`. A BackupRepository
    /// with `importSnapshots` creates such Backups for every snapshot it finds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[0-9a-f]{64}$')").message("importedSnapshot is a snapshot ID: 64 lowercase hex digits"))]
    pub imported_snapshot: Option<String>,
}

/// How a volume backup of a running application is made consistent.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.maxFreezeSeconds) || self.method == 'Freeze'").message("maxFreezeSeconds applies to method Freeze only"))]
#[x_kube(validation = kube::core::Rule::new("has(self.tool) == (self.method == 'Tool')").message("method Tool needs tool (its image and command), and tool applies to method Tool only"))]
#[x_kube(validation = kube::core::Rule::new("has(self.hooks) == (self.method == 'Hooks')").message("method Hooks needs hooks (at least pre), and hooks apply to method Hooks only"))]
pub struct Consistency {
    /// `Freeze`: the node agent freezes the volume's filesystem (FIFREEZE) while the mover
    /// reads it, so the copy is the volume at one instant, as after a power cut, from which
    /// journaling databases recover. Writers block for as long as the copy reads (the Backup
    /// records it in `status.frozenMillis`), never longer than `maxFreezeSeconds`: past that
    /// the agent thaws and the Backup fails. The volume must be a whole filesystem of its own.
    ///
    /// `Tool`: the application's own backup tool (`pg_basebackup`, `mariadb-backup`) writes
    /// a consistent copy of its data into scratch space in the Backup's Job, and custody
    /// backs up that tree, with its manifest, as if it were the volume: restored, verified
    /// and gated like any volume backup. No write stall. See `tool`.
    ///
    /// `Hooks`: a command of the application's (`hooks.pre`, for example one that flushes and
    /// pauses its writes) runs in a container of the running pod (pods/exec through the API
    /// server) before the volume is copied, and `hooks.post` after it, even when the copy
    /// failed. The copy is as consistent as the pre hook makes the files.
    ///
    /// `CrashUnsafe`: copy the files while the application writes them. The copy is not a
    /// point in time; an application may fail to start from it or start with lost or torn
    /// data. The Backup says so (`status.consistency: CrashUnsafe` and condition
    /// `Consistent=False`). Only for data that tolerates that.
    pub method: ConsistencyMethod,

    /// `Freeze` only: the longest the filesystem may stay frozen, in seconds (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub max_freeze_seconds: Option<i32>,

    /// `Tool` only: the tool, and where its output goes in the restored volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<BackupTool>,

    /// `Hooks` only: the commands run in the application's pod around the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Hooks>,
}

/// Commands run in the running pod that mounts the claim, around the copy of its volume.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hooks {
    /// Before the copy starts. With `onError: Fail` (the default) a failure skips the copy
    /// and fails the Backup (`PreHookFailed`); the post hook still runs.
    pub pre: Hook,
    /// After the copy ended, whether it succeeded or not (and after a failed pre hook). With
    /// `onError: Fail` its failure fails the Backup (`PostHookFailed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post: Option<Hook>,
}

/// One command run in a container of the application's pod.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// The container it runs in. Default: the pod's first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The command and its arguments (no shell unless you name one).
    #[schemars(length(min = 1))]
    pub command: Vec<String>,
    /// How long it may run before it counts as failed, in seconds (default 30). The API
    /// server cannot stop a command it started: one that outlives this keeps running in the
    /// container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<i32>,
    /// What its failure (an exit code other than 0, no such pod or container, the timeout)
    /// does: `Fail` (default) fails the Backup, `Continue` only records it.
    #[serde(default)]
    pub on_error: HookOnError,
}

/// What a hook's failure does to its Backup.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum HookOnError {
    /// The Backup fails.
    #[default]
    Fail,
    /// The failure is recorded, the Backup goes on.
    Continue,
}

/// How the hooks of a Backup ran.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HooksStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre: Option<HookResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post: Option<HookResult>,
}

/// How one hook ran.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookResult {
    /// The pod it ran in (empty: no running pod mounted the claim).
    pub pod: String,
    pub succeeded: bool,
    /// Its exit and the end of its output, or why it did not run.
    pub message: String,
    pub started_at: Time,
    pub finished_at: Time,
}

/// An application's own backup tool, run as the first container of the Backup's Job on the
/// node of the running pod that mounts the claim.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupTool {
    /// Image that runs the tool, as the image's user (or `runAsUser`), which must not be root
    /// unless `runAsUser` is 0: the pod asks `runAsNonRoot`, which the kubelet can only check
    /// for a numeric user. It runs without capabilities and without a ServiceAccount token.
    #[schemars(length(min = 1))]
    pub image: String,
    /// The user ID the tool runs as, instead of the image's (for an image whose user is root
    /// or named, such as `USER mysql`). `0` runs it as root, which you ask for knowingly: still
    /// without capabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub run_as_user: Option<i64>,
    /// The command and its arguments. With `output: TarStream` it writes the data as a tar
    /// stream to its standard output (see `output`). Otherwise it writes the application's
    /// data, ready to start from, into the directory `$CUSTODY_OUTPUT` (absent, or empty when `dataPath` is; its
    /// parent exists unless `dataPath` has several segments), and exits 0; any
    /// other exit fails the Backup (`ToolFailed`, with the end of its output). It reaches the
    /// application at `$CUSTODY_POD_IP` (the running pod `$CUSTODY_POD_NAME`) and sees the
    /// claim read-only at `mountPath`. For example `pg_basebackup -h $(CUSTODY_POD_IP) -D
    /// $(CUSTODY_OUTPUT) -X stream -c fast`, or a shell running `mariadb-backup --backup`
    /// then `--prepare`.
    #[schemars(length(min = 1))]
    pub command: Vec<String>,
    /// Where the tool sees the claim, read-only (default `/data`). Set it to the path the
    /// application mounts it at when the tool asks the application where its files are
    /// (`mariadb-backup` reads the server's `datadir`: `/var/lib/mysql`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('/') && !self.matches('(^|/)[.]{1,2}(/|$)') && !self.startsWith('/output')").message("mountPath is an absolute path without . or .. segments, outside /output"))]
    #[schemars(length(max = 255))]
    pub mount_path: Option<String>,
    /// A Secret in the Backup's namespace whose keys are given to the tool as environment
    /// variables (for example `PGUSER` and `PGPASSWORD`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<LocalObjectReference>,
    /// Where the tool's output lies in the volume it is restored into, relative to the
    /// volume's root: `pgdata` for `PGDATA=/var/lib/postgresql/data/pgdata` with the volume
    /// at `/var/lib/postgresql/data`. Empty: the volume's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("!self.startsWith('/') && !self.matches('(^|/)[.]{0,2}(/|$)')").message("dataPath is a relative path without empty, . or .. segments"))]
    #[schemars(length(max = 255))]
    pub data_path: Option<String>,
    /// The most scratch space the tool's output may take (an `emptyDir` size limit, removed
    /// with the Job's pod, and the tool's ephemeral-storage request). Default `10Gi`. Output
    /// that takes more on disk fails the Backup (`ToolOutputTooLarge`) before it is read,
    /// even when the tool exited before the kubelet noticed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))").message("scratchSize is a positive quantity such as 10Gi"))]
    pub scratch_size: Option<String>,
    /// What the tool writes. `Directory` (the default): the data's tree at `$CUSTODY_OUTPUT`,
    /// in scratch space on the node (`scratchSize`) until the mover has read it; the space
    /// needed is the whole copy (`mariadb-backup --backup` then `--prepare` needs this), and a
    /// claim whose data takes more than `scratchSize` (or than the node's free disk) fails the
    /// Backup `ScratchTooSmall`, naming both sizes, before the tool runs.
    /// `TarStream`: a tar stream (ustar, GNU or pax) on its standard output, which the mover
    /// reads, deduplicates, encrypts and uploads as it is produced: no copy of the data on the
    /// node and no `scratchSize`; its standard error is its log. For example `pg_basebackup
    /// -h $(CUSTODY_POD_IP) -D - -F tar -X fetch -c fast` (PostgreSQL cannot stream its WAL
    /// into a tar on standard output: `-X fetch` needs the server to keep the WAL written
    /// during the copy, `wal_keep_size` at least that much). The stream's entries are the
    /// volume's files beneath `dataPath`; directories it does not list are made `0700`. Only
    /// for a Cluster of one volume claim template; the snapshot is sealed only if the tool
    /// exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ToolOutput>,
    /// The longest the tool may run, in seconds, from its start: past it the Job's pod is
    /// stopped and the Backup fails (`ToolFailed`, naming the bound), which gives the Cluster
    /// back to other Backups and Restores. Without it only the controller's Job deadline
    /// (`--job-deadline-seconds`, one day by default) bounds a tool that hangs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604800))]
    pub timeout_seconds: Option<i64>,
}

/// What a backup tool writes.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum ToolOutput {
    /// A directory tree in scratch space.
    #[default]
    Directory,
    /// A tar stream on its standard output, read as it is produced.
    TarStream,
}

/// The ways custody makes a copy of a running application's volume.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum ConsistencyMethod {
    /// Freeze the volume's filesystem for the copy: one instant, writers stalled meanwhile.
    Freeze,
    /// The application's own backup tool writes a consistent copy, which custody backs up.
    Tool,
    /// Commands in the application's pod before and after the copy.
    Hooks,
    /// Copy while the application writes, knowingly: no point in time.
    CrashUnsafe,
}

/// How the data of a Backup was captured.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum Capture {
    /// No running pod mounted the volume while it was copied: the state the application
    /// left at shutdown.
    Stopped,
    /// Copied while the volume's filesystem was frozen: one instant of a running application.
    Frozen,
    /// The application's own backup tool wrote the copy while it ran.
    Tool,
    /// Copied between the application's pre and post hooks.
    Hooks,
    /// Copied while a running pod mounted the volume, without a consistency method: the user
    /// opted into a copy that may not be a point in time.
    CrashUnsafe,
}

/// A user's backup command.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandBackup {
    /// Image that runs the command, as the image's user, which must not be root (the pod
    /// asks `runAsNonRoot`). It runs without capabilities and without a Kubernetes API token
    /// (with a repository's `webIdentity`, with the token for its STS only).
    #[schemars(length(min = 1))]
    pub image: String,
    /// The command and its arguments. It finds the repository in `CUSTODY_S3_ENDPOINT`,
    /// `CUSTODY_S3_BUCKET`, `CUSTODY_S3_PREFIX`, and its credentials in `AWS_ACCESS_KEY_ID`
    /// and `AWS_SECRET_ACCESS_KEY` (a repository's `webIdentity`: `AWS_ROLE_ARN`,
    /// `AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ENDPOINT_URL_STS`, `AWS_REGION`, which the AWS
    /// SDKs' and CLI's default chain reads), and names its dump with a timestamp such as
    /// `20261130T101500Z` or `2026-11-30T10:15:00Z`.
    #[schemars(length(min = 1))]
    pub command: Vec<String>,
    /// Key prefix under the repository's prefix, shared by the runs of this command.
    #[schemars(length(min = 1, max = 512))]
    pub prefix: String,
}

/// What deleting a Backup does to its artifact.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Delete the recorded artifact keys, once they are proven to belong to this Backup.
    #[default]
    Delete,
    /// Keep the artifact in object storage.
    Retain,
}

/// Lifecycle of a Backup.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum BackupPhase {
    /// Waiting to start (for example while a restore of the same Cluster runs).
    #[default]
    Pending,
    /// Data is being uploaded.
    Running,
    /// The artifact and its manifest are complete in object storage.
    Completed,
    /// The run failed; the reason is in the conditions. No artifact is recorded as complete.
    Failed,
}

/// Observed state of a Backup.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// Where the Backup is in its lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,

    /// The node that ran the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,

    /// The artifact's size as people read it (`33.5 MiB`; bytes in `artifact.sizeBytes`), once
    /// Completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,

    /// How far the copy has come: updated every few seconds while the mover runs (from the
    /// node agent's reports), everything once Completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<super::Transfer>,

    /// How the data was captured, decided when the backup starts: `Stopped`, `Frozen`,
    /// `Tool`, `Hooks` or `CrashUnsafe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<Capture>,

    /// `Hooks` only: how the pre and post hooks ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<HooksStatus>,

    /// `Frozen` only: how long the filesystem stayed frozen (the application's writes
    /// stalled), in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_millis: Option<i64>,

    /// `Frozen` only: the longest the filesystem may stay frozen, in seconds, decided when the
    /// backup starts (the Backup's `maxFreezeSeconds`, else its Cluster's, else 60). The node
    /// agent holds a freeze no longer than this, whatever the mover asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_freeze_seconds: Option<i32>,

    /// The Job custody created for this run, as the API server answered its creation. Only
    /// this Job's pod may ask the node agent to freeze the volume: a Job someone else made,
    /// even with this name, this Backup as its owner and its labels, is not it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobRef>,

    /// When the upload started, by the API server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the upload completed, by the API server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// The clock offset of the node that ran the backup, as its agent measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_clock: Option<ClockMeasurement>,

    /// Where the run writes, recorded when it starts: the bucket and the prefix its keys (or
    /// a command's dump) go under. Other runs, in every namespace, are contested by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<Destination>,

    /// The exact artifact this Backup wrote. The key is recorded before the upload starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Artifact>,

    /// Deleting the artifact, once the Backup is being deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<CleanupStatus>,

    /// `Ready`, `ArtifactDeleted` and others, per the Kubernetes API conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// A Job by name and UID.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobRef {
    /// The Job's name.
    pub name: String,
    /// Its UID: a Job deleted and made again under the name is another Job.
    pub uid: String,
}

/// A node's clock compared with the controller's.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClockMeasurement {
    /// How far the node's clock is ahead of the controller's (negative: behind), in nanoseconds.
    pub offset_nanoseconds: i64,
    /// Network round trip of the exchange the offset comes from, in nanoseconds; the offset is
    /// exact to within half of it.
    pub round_trip_nanoseconds: i64,
    /// When the measurement was taken, by the controller's clock.
    pub measured_at: Time,
}

/// Where a run writes in object storage.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// Endpoint URL at the start of the run (not compared: one server has many names).
    pub endpoint: String,
    /// Bucket.
    pub bucket: String,
    /// The prefix the run writes under, without a trailing slash.
    pub prefix: String,
    /// The credentials Secret, in this namespace, the run holds (it carries the
    /// `custody.io/artifact-credentials` finalizer while this Backup may need it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// The ServiceAccount whose web identity signs the run instead (it holds no Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}

/// The object-storage location of a Backup's data and manifest. Everything needed to delete
/// it is here, so cleanup does not depend on the repository object surviving.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Name of the BackupRepository the artifact was written to.
    pub repository: String,
    /// Endpoint URL at the time of the backup.
    pub endpoint: String,
    /// Region at the time of the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Path-style addressing at the time of the backup.
    #[serde(default)]
    pub force_path_style: bool,
    /// The credentials Secret, in this namespace, at the time of the backup (it carries the
    /// `custody.io/artifact-credentials` finalizer while this Backup needs it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// The repository's web identity at the time of the backup (instead of a credentials
    /// Secret), so the artifact can still be deleted after the repository is gone while the
    /// ServiceAccount and custody's leave to ask for its tokens remain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_identity: Option<super::RepositoryWebIdentity>,
    /// The repository's PEM CA bundle at the time of the backup, so the artifact can still be
    /// deleted over TLS after the repository is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// Bucket holding the artifact.
    pub bucket: String,
    /// Repository prefix the keys are under.
    #[serde(default)]
    pub prefix: String,
    /// Key of the data object (tar + zstd); empty for a snapshot.
    pub key: String,
    /// Key of the manifest object; empty for a snapshot.
    pub manifest_key: String,
    /// Size of the data object in bytes, once complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// BLAKE3 hash of the data object, hex, once complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// BLAKE3 hash of the manifest, hex: the trust anchor a restore verifies against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,

    /// For a command backup: why this dump is this Backup's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<AttributionEvidence>,

    /// Format 2: the snapshot in the encrypted repository (then `key` and `manifestKey` are
    /// empty and `prefix` is the repository's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotRef>,
}

/// A Backup's snapshot in an encrypted repository. The snapshot itself seals who made it
/// (the Backup's UID, its namespace and Cluster, the Kubernetes cluster) and each volume's
/// manifest hash; this is what the Backup knows of it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRef {
    /// The repository's ID, recorded when the backup started.
    pub repository_id: String,
    /// The snapshot's ID (64 hex digits), once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The UID of the `kube-system` namespace of the Kubernetes cluster that wrote it: only
    /// that cluster forgets it.
    pub origin_cluster: String,
    /// The volumes in the snapshot (the Cluster's volume claim templates), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    /// Each volume's manifest, once written (the artifact's `manifestHash` is the first's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_manifests: Vec<VolumeManifest>,
    /// An imported Backup: the Backup that wrote the snapshot, as the snapshot records it.
    /// Its UID is the one the restored volume's manifest and identity carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<WrittenBy>,
}

/// One volume of a snapshot and its manifest: what its restored claims are verified against.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeManifest {
    /// The volume claim template.
    pub name: String,
    /// BLAKE3 of the volume's manifest, hex.
    pub manifest_hash: String,
    /// Regular files in the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<i64>,
    /// Bytes of file content in the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<i64>,
}

/// The Backup that wrote an imported snapshot, and where it ran.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WrittenBy {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The Cluster it backed up.
    pub cluster: String,
}

/// The evidence that a dump in a shared prefix was written by one Backup.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttributionEvidence {
    /// The time in the dump's name, corrected by the node's clock offset, in Unix nanoseconds
    /// by the controller's clock.
    pub corrected_name_time_nanos: i64,
    /// The object's `LastModified`, Unix nanoseconds.
    pub last_modified_nanos: i64,
    /// The window the dump had to fall in: the Backup's run, widened by the measured
    /// uncertainty, Unix nanoseconds.
    pub window_start_nanos: i64,
    pub window_end_nanos: i64,
}

/// How deleting a Backup's artifact went so far.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleanupStatus {
    /// Failed delete attempts so far; the next waits 5 s doubling per attempt, at most 5 minutes.
    #[serde(default)]
    pub attempts: u32,
    /// What the last failed attempt ran into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The artifact is dealt with (deleted, kept, or not provably this Backup's): the Backup
    /// no longer needs its credentials Secret. Written before the Secret is released, so that
    /// of two Backups released at once, at least one sees the other done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
    /// When the last attempt was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_time: Option<Time>,
}

impl Destination {
    /// Where a run writes under `prefix` of `repository` as it is now, and what signs it.
    pub fn in_repository(repository: &super::BackupRepository, prefix: String) -> Destination {
        Destination {
            endpoint: repository.spec.endpoint.clone(),
            bucket: repository.spec.bucket.clone(),
            prefix,
            credentials_secret: repository.spec.credentials_secret().map(str::to_string),
            service_account: repository
                .spec
                .web_identity
                .as_ref()
                .map(|identity| identity.service_account_name.clone()),
        }
    }
}

impl Artifact {
    /// An artifact in `repository` as it is now: where it is and how to reach it, recorded so
    /// that deleting it later does not depend on the repository surviving. Keys are the
    /// caller's.
    pub fn located_in(repository: &super::BackupRepository) -> Artifact {
        Artifact {
            repository: repository.metadata.name.clone().unwrap_or_default(),
            endpoint: repository.spec.endpoint.clone(),
            region: repository.spec.region.clone(),
            force_path_style: repository.spec.force_path_style,
            ca_bundle: repository.spec.ca_bundle.clone(),
            credentials_secret: repository.spec.credentials_secret().map(str::to_string),
            web_identity: repository.spec.web_identity.clone(),
            bucket: repository.spec.bucket.clone(),
            ..Artifact::default()
        }
    }

    /// The volumes a restore of this artifact writes, by volume claim template, each with
    /// the manifest hash its claims are verified against: every volume of a snapshot, or the
    /// one volume of an archive (named `first_template`, the Cluster's first template). A
    /// volume without a recorded manifest has none (`None`): nothing restores it.
    pub fn volume_hashes(&self, first_template: &str) -> Vec<(String, Option<String>)> {
        match &self.snapshot {
            Some(snapshot) if snapshot.volumes.len() > 1 => snapshot
                .volumes
                .iter()
                .map(|name| {
                    let hash = snapshot
                        .volume_manifests
                        .iter()
                        .find(|manifest| &manifest.name == name)
                        .map(|manifest| manifest.manifest_hash.clone());
                    (name.clone(), hash)
                })
                .collect(),
            Some(snapshot) => vec![(
                snapshot
                    .volumes
                    .first()
                    .cloned()
                    .unwrap_or_else(|| first_template.to_string()),
                self.manifest_hash.clone(),
            )],
            None => vec![(first_template.to_string(), self.manifest_hash.clone())],
        }
    }
}

impl Backup {
    /// The UID of the Backup that wrote this Backup's data: its own, or for an imported
    /// Backup the original's, which the restored volume's manifest and identity carry.
    pub fn writer_uid(&self) -> String {
        self.status
            .as_ref()
            .and_then(|status| status.artifact.as_ref())
            .and_then(|artifact| artifact.snapshot.as_ref())
            .and_then(|snapshot| snapshot.written_by.as_ref())
            .map(|written_by| written_by.uid.clone())
            .unwrap_or_else(|| self.metadata.uid.clone().unwrap_or_default())
    }
}
