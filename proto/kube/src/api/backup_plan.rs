//! `BackupPlan`: scheduled Backups with retention.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, LocalObjectReference, conditions_schema};

/// Desired state of a BackupPlan.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, PartialEq, KubeSchema)]
#[kube(
    group = "custody.io",
    version = "v1alpha1",
    kind = "BackupPlan",
    doc = "Creates Backups of a Cluster on a cron schedule and prunes old ones.",
    namespaced,
    status = "BackupPlanStatus",
    shortname = "cbp",
    category = "custody",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Last Schedule","type":"date","jsonPath":".status.lastScheduleTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = kube::core::Rule::new("!has(self.command) || !has(self.consistency)").message("a command makes its own copy: consistency does not apply to it"))]
#[serde(rename_all = "camelCase")]
pub struct BackupPlanSpec {
    /// The Cluster, in this namespace, to back up.
    pub cluster_ref: LocalObjectReference,

    /// Repository for the created Backups. Defaults to the Cluster's `spec.repositoryRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_ref: Option<LocalObjectReference>,

    /// Cron schedule in UTC: five fields (`minute hour day-of-month month day-of-week`), or
    /// six with seconds first (`second minute hour day-of-month month day-of-week`).
    #[schemars(length(min = 9, max = 128))]
    pub schedule: String,

    /// A run that could not start within this many seconds of its slot is skipped and reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub starting_deadline_seconds: Option<i64>,

    /// Whether a run may start while an earlier run of this plan is still going.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,

    /// Stop creating new runs. Existing Backups are kept.
    #[serde(default)]
    pub suspend: bool,

    /// Which completed Backups of this plan to keep. Older ones are deleted through the
    /// normal Backup deletion path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,

    /// How the created Backups copy a running application (their `spec.consistency`).
    /// Defaults to the Cluster's `spec.consistency`. A plan runs unattended: with neither, its
    /// runs could copy only a stopped application, so the plan is refused
    /// (`ConsistencyMethodRequired`) and creates none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<super::Consistency>,

    /// The created Backups dump with this command of yours instead of custody's mover (their
    /// `spec.command`): each writes one dump under `prefix`, attributed to its run; retention
    /// deletes a run's dump through the normal Backup deletion, only when it was proven the
    /// run's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<super::CommandBackup>,
}

/// Whether runs of one plan may overlap.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// A slot whose previous run is still going is skipped.
    #[default]
    Forbid,
    /// Runs may overlap.
    Allow,
}

/// How many completed Backups of a plan to keep, and for how long.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.keepLast) || has(self.maxAge)").message("retention needs keepLast, maxAge or both"))]
pub struct Retention {
    /// Keep at most this many completed Backups, the newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub keep_last: Option<i32>,

    /// Delete completed Backups older than this, as a duration such as `720h` or `30d`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h|d))+$"))]
    pub max_age: Option<String>,
}

/// Observed state of a BackupPlan.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupPlanStatus {
    /// The slot of the most recent run that was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,

    /// Name of the most recent run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_name: Option<String>,

    /// `Ready` and others, per the Kubernetes API conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}
