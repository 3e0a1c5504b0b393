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
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
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

    /// Secret in this namespace holding the access key under `accessKeyId` and the secret
    /// key under `secretAccessKey`.
    pub credentials_secret_ref: SecretReference,

    /// PEM-encoded CA certificates to trust for the endpoint, in addition to the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,

    /// Address buckets as `<endpoint>/<bucket>` instead of `<bucket>.<endpoint>`. Most
    /// self-hosted S3 servers need this.
    #[serde(default)]
    pub force_path_style: bool,
}

/// Observed state of a BackupRepository.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRepositoryStatus {
    /// `Ready` says whether the endpoint, bucket and credentials work, with a reason a user
    /// can act on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}
