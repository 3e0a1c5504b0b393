//! `BackupRepository`: where artifacts are stored.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{Condition, SecretReference, conditions_schema};

/// Desired state of a BackupRepository.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, PartialEq, KubeSchema)]
#[kube(
    group = "custody.io",
    version = "v1alpha1",
    kind = "BackupRepository",
    doc = "An S3-compatible object store that holds backup artifacts.",
    namespaced,
    status = "BackupRepositoryStatus",
    shortname = "brepo",
    category = "custody",
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Bucket","type":"string","jsonPath":".spec.bucket"}"#,
    printcolumn = r#"{"name":"Repository","type":"string","jsonPath":".status.repository.id","priority":1}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Checked","type":"string","jsonPath":".status.conditions[?(@.type==\"Checked\")].status"}"#,
    printcolumn = r#"{"name":"Last Check","type":"date","jsonPath":".status.maintenance.check.completionTime","priority":1}"#,
    printcolumn = r#"{"name":"Last Prune","type":"date","jsonPath":".status.maintenance.prune.completionTime","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = kube::core::Rule::new("has(self.credentialsSecretRef) != has(self.webIdentity)").message("set exactly one of credentialsSecretRef (keys in a Secret) and webIdentity (a ServiceAccount's token exchanged at the STS)"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.importSnapshots) || !self.importSnapshots || has(self.encryption)").message("importSnapshots lists the snapshots of an encrypted repository: set encryption.keySecretRef"))]
#[serde(rename_all = "camelCase")]
pub struct BackupRepositorySpec {
    /// URL of the S3 endpoint, `http://` or `https://`, e.g. `https://s3.eu-west-1.amazonaws.com`.
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("endpoint must be an http:// or https:// URL"))]
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: String,

    /// Region to sign requests for. Defaults to `us-east-1`, which most S3-compatible servers accept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub region: Option<String>,

    /// Bucket that holds the artifacts. It must exist; custody does not create buckets.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,

    /// Key prefix under which all artifacts of this repository are written, without a leading
    /// or trailing slash. Empty means the bucket root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub prefix: Option<String>,

    /// Secret in this namespace holding the access key under `AWS_ACCESS_KEY_ID` and the
    /// secret key under `AWS_SECRET_ACCESS_KEY`. Set this or `webIdentity`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretReference>,

    /// Temporary credentials instead of keys in a Secret: a token of a ServiceAccount of this
    /// namespace, exchanged at the STS (`AssumeRoleWithWebIdentity`, as IRSA and other OpenID
    /// Connect federations do) for credentials of `roleArn`. Every mover Job of this
    /// repository runs as that ServiceAccount with only a token for `audience` mounted (no
    /// Kubernetes API token); the controller's own calls (opening the repository, imports,
    /// deleting artifacts) ask the API server for such a token, which only this namespace's
    /// admin lets it do: `kubectl create rolebinding custody-web-identity --namespace NS
    /// --clusterrole custody-web-identity --serviceaccount custody-system:custody-controller`.
    /// Set this or `credentialsSecretRef`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_identity: Option<RepositoryWebIdentity>,

    /// PEM-encoded CA certificates to trust for the endpoint, in addition to the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,

    /// Address buckets as `<endpoint>/<bucket>` instead of `<bucket>.<endpoint>`. Most
    /// self-hosted S3 servers need this.
    #[serde(default)]
    pub force_path_style: bool,

    /// The passwords of the encrypted repository new Backups are written to: restic's
    /// repository format (content-defined chunks, deduplicated, compressed, sealed with
    /// AES-256 and Poly1305) under `<prefix>/custody_repository`, which restic and rustic
    /// open with the same password. Without it, Backups are written in format 1 (one tar +
    /// zstd object per Backup, unencrypted, not deduplicated). **Losing every password loses every backup in the repository:
    /// nothing else decrypts it.** Keep a copy of one outside the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<RepositoryEncryption>,

    /// Disaster recovery: list the encrypted repository's snapshots (every minute) and make
    /// each restorable here by creating a read-only Backup (`spec.importedSnapshot`,
    /// `deletionPolicy: Retain`, label `custody.io/imported-from: <this repository>`) for
    /// every finished custody snapshot that no Backup in this namespace already records or
    /// wrote. Holding the repository's key is what entitles one to its snapshots: give a
    /// tenant the key of a repository only if it may read every snapshot in it. Imported
    /// Backups never delete a snapshot; the Backup that wrote it does, in the Kubernetes
    /// cluster that wrote it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub import_snapshots: bool,

    /// Prune and check of the encrypted repository, each a Job of custody's mover, one at a
    /// time. Without this field they run with the defaults below; a run is also started at
    /// once by setting the annotation `custody.io/prune-requested` or
    /// `custody.io/check-requested` to a new value (any text, such as the time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<RepositoryMaintenance>,

    /// How long custody waits for the S3 server, in the controller and in every mover Job. A
    /// call that gets no answer (or no further bytes) for `stallSeconds`, or moves its bytes
    /// slower than `minimumKiBPerSecond`, fails, and with it the Backup or Restore, naming
    /// the bound. Defaults: 60 s and 64 KiB/s; raise them for a slow link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<RepositoryTimeouts>,

    /// The most each mover Job of this repository moves per second, uploading (backups)
    /// and downloading (restores, checks): a bound for a shared link, honoured by every
    /// Backup, Restore and maintenance Job (each on its own: two Jobs at once may move
    /// twice as much). Without it a mover goes as fast as the link allows. A bound below
    /// `timeouts.minimumKiBPerSecond` is fine: the mover waits between calls, never inside
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<RepositoryBandwidth>,
}

/// A ServiceAccount's token exchanged for temporary S3 credentials.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryWebIdentity {
    /// The ServiceAccount of this namespace whose tokens the STS trusts (its issuer is the
    /// cluster's ServiceAccount issuer, registered with the STS as an OpenID Connect
    /// provider).
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: String,

    /// The role to assume: `arn:aws:iam::<account>:role/<name>` on AWS; on MinIO, the role
    /// ARN it prints for its OpenID provider's role policy.
    #[schemars(length(min = 1, max = 2048))]
    pub role_arn: String,

    /// The audience of the token, which the STS checks. Default `sts.amazonaws.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub audience: Option<String>,

    /// URL of the STS. Default: `https://sts.<region>.amazonaws.com`
    /// (`https://sts.amazonaws.com` without a region). MinIO answers STS calls at its S3
    /// endpoint. Trusted with `caBundle` like the S3 endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("stsEndpoint must be an http:// or https:// URL"))]
    #[schemars(length(min = 1, max = 2048))]
    pub sts_endpoint: Option<String>,
}

impl BackupRepositorySpec {
    /// The credentials Secret's name, when the repository signs with keys.
    pub fn credentials_secret(&self) -> Option<&str> {
        self.credentials_secret_ref
            .as_ref()
            .map(|reference| reference.name.as_str())
    }
}

/// Bounds on a mover's transfer rate, in KiB per second.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryBandwidth {
    /// The most a mover sends per second, in KiB (backups).
    #[serde(
        default,
        rename = "uploadKiBPerSecond",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 16777216))]
    pub upload_kib_per_second: Option<i32>,

    /// The most a mover receives per second, in KiB (restores, checks).
    #[serde(
        default,
        rename = "downloadKiBPerSecond",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 16777216))]
    pub download_kib_per_second: Option<i32>,
}

/// Bounds on the S3 server's answers.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryTimeouts {
    /// The longest wait for an answer, or for the next bytes of one (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub stall_seconds: Option<i32>,

    /// The slowest transfer accepted, in KiB per second (default 64): a call moving N KiB
    /// may take `stallSeconds + N / minimumKiBPerSecond` seconds.
    #[serde(
        default,
        rename = "minimumKiBPerSecond",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 1048576))]
    pub minimum_kib_per_second: Option<i32>,
}

/// When custody prunes and checks an encrypted repository.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryMaintenance {
    /// Hours between prunes (default 24; 0: only on request). A prune marks the packs no
    /// snapshot needs and deletes those a prune marked at least 23 hours before: space freed
    /// by deleting Backups comes back a prune or two later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 8760))]
    pub prune_interval_hours: Option<i32>,

    /// Hours between checks (default 168, weekly; 0: only on request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 8760))]
    pub check_interval_hours: Option<i32>,

    /// The share of the packs a check reads whole, decrypting and hashing every blob (default
    /// 10; chosen at random each time, so that checks cover all data in time). 0 checks the
    /// structure only: index, pack headers and every snapshot's trees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub check_read_data_percent: Option<i32>,
}

/// Where the repository's passwords are.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryEncryption {
    /// A Secret in this namespace whose every key holds a password of the repository (at
    /// least one). custody creates the repository with the first password (by key name) when
    /// there is none, adds a key file for every password that opens none, and removes the
    /// key files it added for passwords taken out of the Secret: to rotate, add the new
    /// password, wait for `status.repository.keys` to list it, then remove the old one.
    pub key_secret_ref: SecretReference,
}

/// Observed state of a BackupRepository.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRepositoryStatus {
    /// The encrypted repository, once opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<EncryptedRepository>,

    /// The latest prune and check, and the one running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceStatus>,

    /// `Ready` says whether the endpoint, bucket and credentials work, with a reason a user
    /// can act on; `Checked` what the latest check found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// The encrypted repository a BackupRepository opened.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EncryptedRepository {
    /// The repository's ID (restic's: its config's). A Backup records it, and a mover refuses
    /// another repository found at the same place.
    pub id: String,
    /// Where it is in the bucket.
    pub prefix: String,
    /// Which key file each password of the key Secret opens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<RepositoryKey>,
    /// The Secret, in this namespace and owned by this BackupRepository, in which custody
    /// keeps the repository's master key for its movers (so that a mover derives no key from
    /// a password). As sensitive as the passwords.
    pub master_key_secret: String,
    /// The key Secret's `resourceVersion` the key files were last brought in step with.
    #[serde(default)]
    pub key_secret_version: String,
}

/// A password of the key Secret and the key file it opens.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryKey {
    /// The password's key in the Secret.
    pub name: String,
    /// The key file's ID in the repository (`keys/<id>`).
    pub key_id: String,
}

/// The latest prune and check of a repository.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune: Option<MaintenanceRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<MaintenanceRun>,
}

/// One kind of maintenance: the run going on, or the latest one.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceRun {
    /// The Job running now (none between runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The request annotation's value the latest run answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Whether the latest run finished its work (a check that found errors did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<bool>,
    /// What it did or found, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A prune's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune: Option<PruneResult>,
    /// A check's findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckResult>,
}

/// What a prune did (custody-mover's report).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PruneResult {
    /// Packs deleted (marked for at least 23 hours and still unneeded).
    #[serde(default)]
    pub packs_deleted: u64,
    /// Packs marked for deletion.
    #[serde(default)]
    pub packs_marked: u64,
    /// Marked packs a snapshot needed again.
    #[serde(default)]
    pub packs_recovered: u64,
    /// Partly used packs whose needed blobs were copied into new packs.
    #[serde(default)]
    pub packs_repacked: u64,
    #[serde(default)]
    pub bytes_deleted: u64,
    /// Bytes to be deleted by a prune once their grace has passed.
    #[serde(default)]
    pub bytes_marked: u64,
    /// Bytes of blobs the snapshots need.
    #[serde(default)]
    pub bytes_used: u64,
}

/// What a check found (custody-mover's report).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    /// No error found.
    pub passed: bool,
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub warnings: u64,
    /// The first findings, errors first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<String>,
    /// The share of the packs read whole.
    #[serde(default)]
    pub read_data_percent: u8,
}
