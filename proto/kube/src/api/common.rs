//! Types shared by several kinds.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// A reference to another custody object in the same namespace, by name.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Name of the referenced object, in the same namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A reference to a Secret in the same namespace, by name.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Name of the Secret, in the same namespace as the object that refers to it.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// How the volumes of one restore are written: all at once, or one after another.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum VolumeRestorePolicy {
    /// Every volume is restored at the same time.
    #[default]
    Parallel,
    /// Volumes are restored one at a time, in the order of the Cluster's volume claim
    /// templates.
    Serial,
}

/// The schema of a `conditions` list: a list-map keyed by `type`, so that server-side apply
/// lets each writer own its own conditions.
pub(crate) fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema.insert(
        "description".into(),
        "Current state of the object, one entry per condition type, per the Kubernetes API \
         conventions."
            .into(),
    );
    schema
}

/// How far a mover has copied: a running backup, or a volume being restored. Written by the
/// controller from the node agent's reports (the mover writes its counts every few seconds).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transfer {
    /// In words, such as `1.5 GiB of 4.0 GiB (37%), 120 of 300 files`.
    pub summary: String,
    /// Content bytes copied so far (a backup: read and stored, an unchanged file whole; a
    /// restore: written and hashed).
    pub bytes_done: u64,
    /// The content bytes to copy; absent while a backup still counts its volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    pub files_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_total: Option<u64>,
    /// Bytes uploaded to the repository so far, after deduplication, compression and
    /// encryption (a backup: its reading runs ahead of its uploads by what its writer buffers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_uploaded: Option<u64>,
    /// The volume being copied now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// The node the mover runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// When the controller last saw the counts grow (the `Stalled` condition counts from
    /// here), by the controller's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}
