//! `Restore`: one restore of a Backup into a Cluster's volumes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, LocalObjectReference, VolumeRestorePolicy, conditions_schema};

/// Desired state of a Restore.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, PartialEq, KubeSchema)]
#[kube(
    group = "custody.io",
    version = "v1alpha1",
    kind = "Restore",
    doc = "Restores a Backup into a Cluster's volumes and verifies the content on each volume before the Cluster's pods are released.",
    namespaced,
    status = "RestoreStatus",
    shortname = "crs",
    category = "custody",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Backup","type":"string","jsonPath":".spec.backupRef.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Transferred","type":"string","jsonPath":".status.transfer.summary"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSpec {
    /// The Cluster, in this namespace, whose volumes are written.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("clusterRef is immutable"))]
    pub cluster_ref: LocalObjectReference,

    /// The completed Backup, in this namespace, to restore from.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("backupRef is immutable"))]
    pub backup_ref: LocalObjectReference,

    /// Whether the volumes are restored all at once (`Parallel`) or one at a time (`Serial`).
    #[serde(default)]
    pub volume_restore_policy: VolumeRestorePolicy,

    /// The longest a volume may wait in one state without moving on: for its pod to be
    /// scheduled and reported by its node's agent (`Pending`, also while that agent is missing
    /// or not ready), or for the agent to verify it (`Verifying`). Past it the Restore fails
    /// `ProgressDeadlineExceeded`, naming the volume and what it waited for, and stops holding
    /// the Cluster's Backups back. Default 3600. Verification reads every byte of the volume:
    /// raise it for volumes the agent cannot read in an hour. Writing is bounded by the
    /// prepareData Job's own deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 2592000))]
    pub progress_deadline_seconds: Option<i32>,
}

/// [`RestoreSpec::progress_deadline_seconds`] when a Restore sets none.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i32 = 3600;

/// Lifecycle of a Restore.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum RestorePhase {
    /// Waiting to start (for example while a backup of the same Cluster runs).
    #[default]
    Pending,
    /// Volumes are being written and verified.
    Running,
    /// Every volume is verified.
    Completed,
    /// A volume failed to restore or verify; the reason is in the conditions and the volume.
    Failed,
}

/// Where one volume is in its restore.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum VolumeState {
    /// Waiting for its pod to be scheduled and the volume mounted.
    #[default]
    Pending,
    /// The data mover is writing the volume.
    Restoring,
    /// The node agent is checking the content against the backup's manifest.
    Verifying,
    /// Every file matches the manifest.
    Verified,
    /// Restore or verification failed; see the reason.
    Failed,
}

/// Restore progress of one volume.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRestoreStatus {
    /// The PersistentVolumeClaim being restored.
    pub claim_name: String,
    /// Where it is in its restore.
    pub state: VolumeState,
    /// The node the volume is mounted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The workload pod that mounts the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// The prepareData Job writing the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// prepareData Jobs created for this volume so far (a Job deleted by someone else is
    /// recreated a bounded number of times).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// CamelCase reason when Failed, or why the volume waits (`AgentMissing`: its pod is on a
    /// node where no custody agent reports; `AgentNotReady`: that node's agent stopped
    /// reporting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why the volume failed, naming the first differences found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the volume entered its state (what the progress deadline counts from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// How far its prepareData Job has written it: updated every few seconds while the
    /// mover runs (from the node agent's reports), everything once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<super::Transfer>,
}

/// Observed state of a Restore.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// Where the Restore is in its lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RestorePhase>,

    /// Human-readable progress, such as `2/3 verified`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// Per-volume progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeRestoreStatus>,

    /// The volumes' transfers added up, once any mover reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<super::Transfer>,

    /// When the restore started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the restore completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// `Ready` and `Verified`, per the Kubernetes API conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}
