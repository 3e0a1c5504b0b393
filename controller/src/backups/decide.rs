//! The Backup decisions as plain data: names and keys, whose Job it is, what a finished Job
//! means for the Backup.

use k8s_openapi::api::batch::v1::Job;

use crate::api::Artifact;

/// Label on everything the backup reconciler creates: the Backup's UID.
pub const LABEL_BACKUP_UID: &str = "custody.io/backup-uid";
/// The Cluster's UID.
pub const LABEL_CLUSTER_UID: &str = "custody.io/cluster-uid";
/// The backed-up PersistentVolumeClaim's UID.
pub const LABEL_CLAIM_UID: &str = "custody.io/claim-uid";

/// The artifact's key prefix: `<repository prefix>/<namespace>/<cluster>/<backup UID>`. The
/// Backup's UID in the key is what proves later that the key is this Backup's own.
pub fn artifact_prefix(
    repository_prefix: &str,
    namespace: &str,
    cluster: &str,
    uid: &str,
) -> String {
    let base = repository_prefix.trim_matches('/');
    if base.is_empty() {
        format!("{namespace}/{cluster}/{uid}")
    } else {
        format!("{base}/{namespace}/{cluster}/{uid}")
    }
}

/// Where a backup command writes: `<repository prefix>/<command prefix>`, without stray
/// slashes.
pub fn command_prefix(repository_prefix: &str, command_prefix: &str) -> String {
    let base = repository_prefix.trim_matches('/');
    let own = command_prefix.trim_matches('/');
    if base.is_empty() {
        own.to_string()
    } else {
        format!("{base}/{own}")
    }
}

/// The claim a Backup of a Cluster reads: the first volume claim template of the
/// StatefulSet's first pod (`<template>-<statefulset>-0`).
pub fn claim_name(template: &str, stateful_set: &str) -> String {
    format!("{template}-{stateful_set}-0")
}

/// The backup Job's name: the Backup's name with a suffix, cut to the 63 characters a Job's
/// pods' label allows, kept unique with a piece of the UID.
pub fn job_name(backup: &str, uid: &str) -> String {
    let suffix = format!("-backup-{}", &uid[..uid.len().min(8)]);
    let room = 63 - suffix.len();
    let base: String = backup.chars().take(room).collect();
    format!("{}{suffix}", base.trim_end_matches('-'))
}

/// Whether `job` was created by the Backup with `uid`: its controller owner is that Backup
/// and its label names the same UID. Anything else is not touched.
pub fn owned_by(job: &Job, uid: &str) -> bool {
    crate::ownership::owned_by(&job.metadata, "Backup", uid, LABEL_BACKUP_UID)
}

/// Where a Job stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    Failed { message: String },
}

/// Reads a Job's state from its status.
pub fn job_state(job: &Job) -> JobState {
    let status = job.status.as_ref();
    let condition = |kind: &str| {
        status
            .and_then(|status| status.conditions.as_ref())
            .and_then(|conditions| {
                conditions
                    .iter()
                    .find(|condition| condition.type_ == kind && condition.status == "True")
            })
    };
    if condition("Complete").is_some() || condition("SuccessCriteriaMet").is_some() {
        return JobState::Succeeded;
    }
    if let Some(failed) = condition("Failed").or_else(|| condition("FailureTarget")) {
        return JobState::Failed {
            message: failed
                .message
                .clone()
                .unwrap_or_else(|| "the backup Job failed".to_string()),
        };
    }
    JobState::Running
}

/// What the mover reported, from its termination message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoverReport {
    Done {
        key: String,
        manifest_key: String,
        size_bytes: u64,
        checksum: String,
        manifest_hash: String,
    },
    Error {
        reason: String,
        message: String,
    },
    Unreadable(String),
}

/// Parses a mover's termination message.
pub fn mover_report(message: &str) -> MoverReport {
    let value: serde_json::Value = match serde_json::from_str(message.trim()) {
        Ok(value) => value,
        Err(error) => return MoverReport::Unreadable(format!("{error}: {message:?}")),
    };
    if let Some(error) = value.get("error") {
        let text = |key: &str| {
            error
                .get(key)
                .and_then(|value| value.as_str())
                .unwrap_or_default()
                .to_string()
        };
        return MoverReport::Error {
            reason: text("reason"),
            message: text("message"),
        };
    }
    let text = |key: &str| {
        value
            .get(key)
            .and_then(|value| value.as_str())
            .map(str::to_string)
    };
    match (
        text("key"),
        text("manifestKey"),
        value.get("sizeBytes").and_then(|value| value.as_u64()),
        text("checksum"),
        text("manifestHash"),
    ) {
        (Some(key), Some(manifest_key), Some(size_bytes), Some(checksum), Some(manifest_hash)) => {
            MoverReport::Done {
                key,
                manifest_key,
                size_bytes,
                checksum,
                manifest_hash,
            }
        }
        _ => MoverReport::Unreadable(format!("missing fields: {message:?}")),
    }
}

/// How a finished backup ends: the completed artifact, or why it failed. The keys the mover
/// reports must be the ones recorded before it started; anything else is not this Backup's.
pub fn completion(recorded: &Artifact, report: &MoverReport) -> Result<Artifact, (String, String)> {
    match report {
        MoverReport::Done {
            key,
            manifest_key,
            size_bytes,
            checksum,
            manifest_hash,
        } => {
            if *key != recorded.key || *manifest_key != recorded.manifest_key {
                return Err((
                    "ArtifactKeyMismatch".to_string(),
                    format!(
                        "the mover wrote {key} and {manifest_key}, but this Backup recorded {} and {}",
                        recorded.key, recorded.manifest_key
                    ),
                ));
            }
            Ok(Artifact {
                size_bytes: i64::try_from(*size_bytes).ok(),
                checksum: Some(checksum.clone()),
                manifest_hash: Some(manifest_hash.clone()),
                ..recorded.clone()
            })
        }
        MoverReport::Error { reason, message } => Err((
            if reason.is_empty() {
                "MoverFailed".to_string()
            } else {
                reason.clone()
            },
            message.clone(),
        )),
        MoverReport::Unreadable(message) => Err((
            "MoverReportUnreadable".to_string(),
            format!("the mover's report cannot be read: {message}"),
        )),
    }
}

/// The condition reason for a failure the mover (or the Job) reported. Only reasons custody
/// knows are used as they are: the report comes from a pod, and a condition's reason must be
/// a CamelCase word custody documents.
pub fn failure_reason(reported: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "UploadFailed",
        "ReadVolumeFailed",
        "CredentialsMissing",
        "InvalidRepository",
        "LocalError",
        "Interrupted",
        "ArtifactKeyMismatch",
        "MoverReportUnreadable",
        "MoverReportMissing",
        "JobFailed",
    ];
    KNOWN
        .iter()
        .find(|known| **known == reported)
        .copied()
        .unwrap_or("MoverFailed")
}

#[cfg(test)]
mod tests;

/// The other runs of a backup command's prefix, as the attribution sees them.
pub fn other_runs(
    backups: &[crate::api::Backup],
    uid: &str,
    repository: &str,
    command_prefix: &str,
) -> Vec<crate::attribution::OtherRun> {
    backups
        .iter()
        .filter(|backup| backup.metadata.uid.as_deref() != Some(uid))
        .filter(|backup| {
            backup.spec.command.as_ref().is_some_and(|command| {
                command.prefix.trim_matches('/') == command_prefix.trim_matches('/')
            })
        })
        .filter(|backup| {
            backup
                .spec
                .repository_ref
                .as_ref()
                .map(|r| r.name.as_str())
                .unwrap_or(repository)
                == repository
        })
        .filter_map(|backup| {
            let status = backup.status.as_ref()?;
            let start = status.start_time.as_ref()?.0.as_nanosecond() as i64;
            Some(crate::attribution::OtherRun {
                name: backup.metadata.name.clone().unwrap_or_default(),
                start,
                end: status
                    .completion_time
                    .as_ref()
                    .map(|time| time.0.as_nanosecond() as i64),
                key: status
                    .artifact
                    .as_ref()
                    .map(|artifact| artifact.key.clone()),
                offset: status
                    .node_clock
                    .as_ref()
                    .map(|clock| crate::attribution::Offset {
                        offset: clock.offset_nanoseconds,
                        round_trip: clock.round_trip_nanoseconds,
                    }),
            })
        })
        .collect()
}

/// This run, as the attribution sees it: from its recorded start to `end`, with the clock
/// offset measured on its node.
pub fn run_of(status: &crate::api::BackupStatus, end: i64) -> crate::attribution::Run {
    crate::attribution::Run {
        start: status
            .start_time
            .as_ref()
            .map(|time| time.0.as_nanosecond() as i64)
            .unwrap_or(end),
        end,
        offset: status
            .node_clock
            .as_ref()
            .map(|clock| crate::attribution::Offset {
                offset: clock.offset_nanoseconds,
                round_trip: clock.round_trip_nanoseconds,
            }),
    }
}
