//! `NodeAgent`: the per-node restore health view, written from agent reports.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{Condition, conditions_schema};

/// Desired state of a NodeAgent.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, PartialEq, KubeSchema)]
#[kube(
    group = "custody.io",
    version = "v1alpha1",
    kind = "NodeAgent",
    doc = "One node's custody agent as the controller last heard from it. Written by the controller; `kubectl get nodeagents` is the per-node restore health view.",
    status = "NodeAgentStatus",
    shortname = "na",
    category = "custody",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Clock Offset","type":"string","jsonPath":".status.clockOffset"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.volumes.pending"}"#,
    printcolumn = r#"{"name":"Verifying","type":"integer","jsonPath":".status.volumes.verifying"}"#,
    printcolumn = r#"{"name":"Verified","type":"integer","jsonPath":".status.volumes.verified"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.volumes.failed"}"#,
    printcolumn = r#"{"name":"Version","type":"string","priority":1,"jsonPath":".status.agentVersion"}"#,
    printcolumn = r#"{"name":"Heartbeat","type":"date","jsonPath":".status.lastHeartbeatTime"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentSpec {
    /// The node this agent runs on.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("nodeName is immutable"))]
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
}

/// Observed state of a node's agent.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentStatus {
    /// Version of the agent binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,

    /// When the controller last heard from the agent, by the controller's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,

    /// The node's clock offset in human form, such as `+12.3ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset: Option<String>,

    /// How far the node's clock is ahead of the controller's (negative: behind), in nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_nanoseconds: Option<i64>,

    /// Round trip of the exchange the offset comes from, in nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip_nanoseconds: Option<i64>,

    /// Volumes on this node under restore, counted by state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<VolumeCounts>,

    /// Every volume under restore on this node, as the agent last reported it. The restore
    /// reconciler reads its volumes' states here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512))]
    pub restored_volumes: Vec<ReportedVolume>,

    /// Volumes left out of `restoredVolumes` to bound the object's size (the counts include
    /// them); Verified volumes are left out first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted_volumes: Option<u32>,

    /// Every custody mover running on this node (a Backup's Job, a Restore's prepareData
    /// Job) and how far it has come, as the agent last read it. The backup and restore
    /// reconcilers read their Jobs' progress here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub movers: Vec<ReportedMover>,

    /// `Ready` turns False when the agent stops reporting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// One running mover on a node, as its agent reported it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportedMover {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// The mover's Job.
    pub job_name: String,
    /// The UID of the Backup or Restore the pod's labels name; trusted only for a Job that
    /// Backup or Restore created.
    pub owner_uid: String,
    /// `backup` or `restore`.
    pub operation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub volume: String,
    pub bytes_done: u64,
    pub files_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_total: Option<u64>,
    /// Bytes uploaded to the repository so far (a backup).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_sent: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Volumes under restore on one node, counted by state.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeCounts {
    /// Waiting for data.
    #[serde(default)]
    pub pending: i32,
    /// Being written.
    #[serde(default)]
    pub restoring: i32,
    /// Being checked against the manifest.
    #[serde(default)]
    pub verifying: i32,
    /// Content verified.
    #[serde(default)]
    pub verified: i32,
    /// Failed to restore or verify.
    #[serde(default)]
    pub failed: i32,
}

/// One volume under restore on a node, as its agent reported it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportedVolume {
    pub namespace: String,
    /// The workload pod that mounts the volume.
    pub pod_name: String,
    pub pod_uid: String,
    pub claim_name: String,
    /// UID of the Restore writing the volume.
    pub restore_uid: String,
    /// `Pending`, `Restoring`, `Verifying`, `Verified` or `Failed`.
    pub state: crate::api::VolumeState,
    /// CamelCase reason when Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
