//! `Cluster`: a protected application and, optionally, the backup it is restored from.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, LocalObjectReference, VolumeRestorePolicy, conditions_schema};

/// Desired state of a Cluster.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, PartialEq, KubeSchema)]
#[kube(
    group = "custody.io",
    version = "v1alpha1",
    kind = "Cluster",
    doc = "A stateful application custody protects: a StatefulSet and the volume claim templates that hold its data. With `spec.restore` it is created from a Backup, and its pods are held until every restored volume is verified.",
    namespaced,
    status = "ClusterStatus",
    shortname = "ccl",
    category = "custody",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"StatefulSet","type":"string","jsonPath":".spec.statefulSetRef.name"}"#,
    printcolumn = r#"{"name":"Restored From","type":"string","jsonPath":".spec.restore.backupRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = kube::core::Rule::new("has(self.restore) == has(oldSelf.restore) && (!has(self.restore) || self.restore == oldSelf.restore)").message("spec.restore can only be set when the Cluster is created and is immutable afterwards").field_path(".restore"))]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// The StatefulSet that runs the application, in this namespace.
    pub stateful_set_ref: LocalObjectReference,

    /// Names of the StatefulSet's volume claim templates whose volumes hold the data to back
    /// up and restore.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Set)]
    pub volume_claim_templates: Vec<String>,

    /// Repository used by Backups of this Cluster that do not name one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_ref: Option<LocalObjectReference>,

    /// Restore this Cluster's volumes from a Backup before its pods may start. Only settable
    /// when the Cluster is created; immutable afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<ClusterRestoreSpec>,

    /// How Backups of this Cluster that do not say so themselves copy a volume a running pod
    /// mounts (see Backup `spec.consistency`). Without one, volume backups run only while the
    /// application is stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<super::Consistency>,
}

/// Where a Cluster's data comes from when it is created by restore.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRestoreSpec {
    /// The completed Backup, in this namespace, to restore from.
    pub backup_ref: LocalObjectReference,

    /// Whether the volumes are restored all at once (`Parallel`) or one at a time (`Serial`).
    #[serde(default)]
    pub volume_restore_policy: VolumeRestorePolicy,

    /// The Restore's `progressDeadlineSeconds`: how long a volume may wait for its pod, its
    /// node's agent or its verification with no progress before the restore fails (default
    /// 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 2592000))]
    pub progress_deadline_seconds: Option<i32>,
}

/// Lifecycle of a Cluster.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum ClusterPhase {
    /// Not yet observed by the controller.
    #[default]
    Pending,
    /// Its volumes are being restored; its pods are held.
    Restoring,
    /// Its data is in place (restored and verified, or never restored) and its workload is ready.
    Running,
    /// Its restore failed; the reason is in the conditions. Pods stay held.
    Failed,
}

/// Observed state of a Cluster.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Where the Cluster is in its lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,

    /// The Restore custody created for `spec.restore`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_name: Option<String>,

    /// `Restored` and `Ready`, per the Kubernetes API conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}
