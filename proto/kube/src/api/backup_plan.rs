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
    printcolumn = r#"{"name":"Last Drill","type":"string","jsonPath":".status.drill.last.result"}"#,
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

    /// Restore drills: on their own schedule, the plan's newest completed Backup is restored
    /// into a throwaway Cluster, verified on its volumes by the agent like any restore, and the
    /// application started on it is asked by your engine check whether its data is sound. The
    /// result goes on the plan (`status.drill`, condition `Drilled`), on the Backup (condition
    /// `Drilled`), in Events and in metrics; everything the drill made is deleted after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<Drill>,
}

/// A scheduled restore drill of a BackupPlan's newest completed Backup.
///
/// The drill restores into Cluster `<plan>-drill` and StatefulSet `<plan>-drill` (one pod,
/// `<plan>-drill-0`, with claims `<template>-<plan>-drill-0`), copied from the plan's Cluster's
/// StatefulSet with its pod labels replaced (no Service of the application selects the drill's
/// pod) and its claims deleted with it. custody creates StatefulSets only in namespaces whose
/// admin allows drills there: `kubectl create rolebinding custody-drills --namespace NS
/// --clusterrole custody-drills --serviceaccount custody-system:custody-controller`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.__namespace__) || has(self.repositoryRef)").message("a drill in another namespace restores an imported copy of the Backup: name the BackupRepository there (repositoryRef) that opens the plan's encrypted repository"))]
pub struct Drill {
    /// Cron schedule in UTC of the drills, as the plan's `schedule` (five or six fields).
    #[schemars(length(min = 9, max = 128))]
    pub schedule: String,

    /// The namespace the throwaway Cluster is made in. Default: the plan's own. Another
    /// namespace keeps the drill away from the application's (its restore gate, its quotas)
    /// and needs `repositoryRef`; the plan's writer must be allowed there what the drill does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,

    /// With `namespace`: the BackupRepository in that namespace that opens the plan's
    /// (encrypted) repository. The drill restores the Backup's snapshot imported there, and
    /// deletes the imported view afterwards (never the snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_ref: Option<LocalObjectReference>,

    /// Asks the restored application whether its data is sound.
    pub check: DrillCheck,

    /// The longest a drill may take, in seconds, from its start to its check's end (default
    /// 3600). Past it the drill fails `DrillTimedOut`, naming what it was waiting for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 604800))]
    pub timeout_seconds: Option<i64>,
}

/// The engine check of a drill: a Job in the drill's namespace, run once the restored
/// application is ready.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillCheck {
    /// Image of the check. Default: the image of the application's first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,

    /// The command and its arguments. It reaches the restored application at
    /// `$CUSTODY_DRILL_HOST` (its pod `$CUSTODY_DRILL_POD`); exit 0 passes the drill, any other
    /// exit fails it (`CheckFailed`, with the end of its output). For example `pg_amcheck -h
    /// $(CUSTODY_DRILL_HOST) --heapallindexed --all`, or `mariadb-check -h
    /// $(CUSTODY_DRILL_HOST) --all-databases --extended`.
    #[schemars(length(min = 1))]
    pub command: Vec<String>,

    /// A Secret in the drill's namespace whose keys are given to the check as environment
    /// variables (for example `PGPASSWORD`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<LocalObjectReference>,

    /// The longest the check may run, in seconds (default 600): past it, it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<i64>,
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

    /// `Ready`, `Drilled` and others, per the Kubernetes API conventions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,

    /// Restore drills: the one running and the last one finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drill: Option<DrillStatus>,
}

/// Restore drills of a plan.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillStatus {
    /// The slot of the most recent drill started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// The drill running now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<DrillRun>,
    /// The last drill that finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<DrillResult>,
    /// When a drill last passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_time: Option<Time>,
}

/// A running drill and what it made (each object by UID: custody deletes only those).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillRun {
    /// A random identity of the run, written on what it makes (so that what a run made but
    /// could not record yet is told from look-alikes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The plan's Backup it restores.
    pub backup: String,
    /// The namespace it restores into.
    pub namespace: String,
    /// When it started (also its identity, on what it makes).
    pub started_at: Time,
    /// What it waits for now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The imported Backup it made (a drill in another namespace), by UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_backup_uid: Option<String>,
    /// The Cluster it made, by UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_uid: Option<String>,
    /// The StatefulSet it made, by UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stateful_set_uid: Option<String>,
    /// The check's Job, by UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
}

/// How a drill ended.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillResult {
    /// The Backup it restored.
    pub backup: String,
    /// `Passed`, `Failed`, or `Cancelled` (the drill was taken off the plan, or the plan
    /// deleted, while it ran: the Backup was not judged).
    pub result: String,
    /// Why, in CamelCase: `Passed`, `RestoreFailed`, `ApplicationNotReady`, `CheckFailed`,
    /// `DrillTimedOut`, `DrillRefused`, `DrillCancelled`.
    pub reason: String,
    /// What happened, with the end of the check's output.
    pub message: String,
    pub started_at: Time,
    pub finished_at: Time,
}
