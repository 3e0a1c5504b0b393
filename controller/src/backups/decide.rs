//! The Backup decisions as plain data: names and keys, whose Job it is, what a finished Job
//! means for the Backup.

use custody_proto::mover::{BackupResult, Failure, Report};
use custody_proto::reasons::MoverFailure;
use k8s_openapi::api::batch::v1::Job;

use custody_kube::api::Artifact;

/// Label on everything the backup reconciler creates: the Backup's UID.
pub use custody_proto::names::LABEL_BACKUP_UID;
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

/// Why a Cluster of several volume claim templates (`templates`) cannot be backed up as it
/// is configured, if it cannot: its volumes go into one snapshot of an encrypted repository
/// (an archive holds one volume).
pub fn several_volumes(templates: &[String], encrypted: bool) -> Option<String> {
    if templates.len() < 2 || encrypted {
        return None;
    }
    Some(format!(
        "Cluster lists {} volume claim templates ({}), which are backed up together into one snapshot of an encrypted repository; this BackupRepository writes archives of one volume (set its spec.encryption)",
        templates.len(),
        templates.join(", ")
    ))
}

/// Why a tool writing a tar stream cannot back this Cluster up, if it cannot: its stream is
/// one tree, so one volume claim template, read into a snapshot of an encrypted repository
/// (an archive of format 1 is read from a directory).
pub fn stream_layout(
    tool: Option<&custody_kube::api::BackupTool>,
    templates: &[String],
    encrypted: bool,
) -> Option<String> {
    if !tool.is_some_and(super::job::streams) {
        return None;
    }
    if templates.len() > 1 {
        return Some(format!(
            "the tool writes a tar stream (output: TarStream), which is one tree, and Cluster lists {} volume claim templates ({}): write a directory per volume instead (output: Directory, $CUSTODY_OUTPUT_<TEMPLATE>)",
            templates.len(),
            templates.join(", ")
        ));
    }
    if !encrypted {
        return Some(
            "the tool writes a tar stream (output: TarStream), which is read into a snapshot of an encrypted repository; this BackupRepository writes archives (set its spec.encryption, or use output: Directory)".into(),
        );
    }
    None
}

/// Where the StatefulSet's pods mount each of `templates`, as every container (init
/// containers too) that mounts the template's volume whole agrees: a template mounted at two
/// paths, at a path with `.` or `..`, or by no container is left out (a link into it then
/// stays refused).
pub fn mount_paths(
    set: &k8s_openapi::api::apps::v1::StatefulSet,
    templates: &[String],
) -> std::collections::BTreeMap<String, String> {
    let Some(pod) = set
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
    else {
        return Default::default();
    };
    let mounts: Vec<&k8s_openapi::api::core::v1::VolumeMount> = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .flat_map(|container| container.volume_mounts.iter().flatten())
        .filter(|mount| mount.sub_path.is_none() && mount.sub_path_expr.is_none())
        .collect();
    templates
        .iter()
        .filter_map(|template| {
            let mut paths = mounts
                .iter()
                .filter(|mount| &mount.name == template)
                .map(|mount| mount.mount_path.trim_end_matches('/').to_string());
            let path = paths.next()?;
            // ("/" is trimmed to nothing: not a mount path a link may lead into.)
            let plain = path.starts_with('/')
                && !path
                    .split('/')
                    .any(|component| component == "." || component == "..");
            (plain && paths.all(|other| other == path)).then(|| (template.clone(), path))
        })
        .collect()
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

/// Waiting reasons of a container that will not start by itself.
const STUCK: [&str; 7] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// Why a running Job's pod does not start, from the pods its Job created: a container waiting
/// for a reason that does not pass by itself (an image that cannot be pulled, a missing
/// Secret key), or a pod the scheduler cannot place; with no pod at all, why the Job could not
/// create one (`refused`: its latest `FailedCreate` Event, such as a Pod Security or quota
/// refusal). `None` while nothing is known to be wrong.
pub fn pod_not_starting(
    pods: &[k8s_openapi::api::core::v1::Pod],
    refused: Option<&str>,
) -> Option<String> {
    if pods.is_empty() {
        return refused.map(|message| format!("no pod could be created: {message}"));
    }
    pods.iter().find_map(|pod| {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let status = pod.status.as_ref()?;
        let waiting = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .find_map(|container| {
                let waiting = container.state.as_ref()?.waiting.as_ref()?;
                let reason = waiting.reason.as_deref()?;
                STUCK.contains(&reason).then(|| {
                    format!(
                        "pod {name}: container {} is {reason}{}",
                        container.name,
                        waiting
                            .message
                            .as_deref()
                            .map(|message| format!(": {message}"))
                            .unwrap_or_default()
                    )
                })
            });
        waiting.or_else(|| {
            let unscheduled = status.conditions.iter().flatten().find(|condition| {
                condition.type_ == "PodScheduled"
                    && condition.status == "False"
                    && condition.reason.as_deref() == Some("Unschedulable")
            })?;
            Some(format!(
                "pod {name} cannot be scheduled: {}",
                unscheduled.message.as_deref().unwrap_or("Unschedulable")
            ))
        })
    })
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
        let message = failed
            .message
            .clone()
            .unwrap_or_else(|| "the Job failed".to_string());
        return JobState::Failed {
            // The reason (`DeadlineExceeded`, `BackoffLimitExceeded`) says what to fix.
            message: match failed.reason.as_deref() {
                Some(reason) if !reason.is_empty() => format!("{reason}: {message}"),
                _ => message,
            },
        };
    }
    JobState::Running
}

/// How a finished backup ends: the completed artifact, or why it failed. The keys the mover
/// reports must be the ones recorded before it started; anything else is not this Backup's.
/// A reason this build does not know arrives as [`MoverFailure::MoverFailed`] (logged here).
pub fn completion(
    recorded: &Artifact,
    report: &Report<BackupResult>,
) -> Result<Artifact, (&'static str, String)> {
    match report {
        Report::Done(result) if recorded.snapshot.is_some() => {
            let expected = recorded.snapshot.as_ref().expect("checked above");
            let Some(written) = &result.snapshot else {
                return Err((
                    ARTIFACT_KEY_MISMATCH,
                    "the mover reported no snapshot, and this Backup writes one".to_string(),
                ));
            };
            if written.repository_id != expected.repository_id {
                return Err((
                    ARTIFACT_KEY_MISMATCH,
                    format!(
                        "the mover wrote into repository {}, but this Backup recorded repository {}",
                        written.repository_id, expected.repository_id
                    ),
                ));
            }
            let names: Vec<&str> = result
                .volumes
                .iter()
                .map(|volume| volume.name.as_str())
                .collect();
            if expected.volumes.len() > 1 && names != expected.volumes {
                return Err((
                    ARTIFACT_KEY_MISMATCH,
                    format!(
                        "the mover wrote volumes [{}], but this Backup recorded volumes [{}]",
                        names.join(", "),
                        expected.volumes.join(", ")
                    ),
                ));
            }
            Ok(Artifact {
                size_bytes: i64::try_from(result.size_bytes).ok(),
                manifest_hash: Some(result.manifest_hash.clone()),
                snapshot: Some(custody_kube::api::SnapshotRef {
                    id: Some(written.id.clone()),
                    volume_manifests: result
                        .volumes
                        .iter()
                        .map(|volume| custody_kube::api::VolumeManifest {
                            name: volume.name.clone(),
                            manifest_hash: volume.manifest_hash.clone(),
                            files: i64::try_from(volume.files).ok(),
                            total_bytes: i64::try_from(volume.total_bytes).ok(),
                        })
                        .collect(),
                    ..expected.clone()
                }),
                ..recorded.clone()
            })
        }
        Report::Done(result) => {
            if result.key != recorded.key || result.manifest_key != recorded.manifest_key {
                return Err((
                    ARTIFACT_KEY_MISMATCH,
                    format!(
                        "the mover wrote {} and {}, but this Backup recorded {} and {}",
                        result.key, result.manifest_key, recorded.key, recorded.manifest_key
                    ),
                ));
            }
            Ok(Artifact {
                size_bytes: i64::try_from(result.size_bytes).ok(),
                checksum: Some(result.checksum.clone()),
                manifest_hash: Some(result.manifest_hash.clone()),
                ..recorded.clone()
            })
        }
        Report::Failed(Failure { reason, message }) => {
            if *reason == MoverFailure::MoverFailed {
                tracing::warn!(
                    message,
                    "the mover reported a reason this controller does not know"
                );
            }
            Err((reason.as_str(), message.clone()))
        }
        Report::Unreadable(message) => Err((
            MOVER_REPORT_UNREADABLE,
            format!("the mover's report cannot be read: {message}"),
        )),
    }
}

/// The snapshot of `cluster`'s last completed Backup in the repository `repository_id`: a new
/// backup reads only the files changed since it. Imported Backups (made elsewhere) count too:
/// their snapshots are in the same repository.
pub fn parent_snapshot(
    backups: &[custody_kube::api::Backup],
    cluster: &str,
    repository_id: &str,
) -> Option<String> {
    backups
        .iter()
        .filter(|backup| backup.spec.cluster_ref.name == cluster)
        .filter_map(|backup| {
            let status = backup.status.as_ref()?;
            if status.phase != Some(custody_kube::api::BackupPhase::Completed) {
                return None;
            }
            let snapshot = status.artifact.as_ref()?.snapshot.as_ref()?;
            if snapshot.repository_id != repository_id {
                return None;
            }
            Some((status.completion_time.clone()?.0, snapshot.id.clone()?))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, id)| id)
}

/// The mover wrote keys other than the recorded ones.
pub const ARTIFACT_KEY_MISMATCH: &str = "ArtifactKeyMismatch";
/// The mover's termination message is not a result.
pub const MOVER_REPORT_UNREADABLE: &str = "MoverReportUnreadable";
/// The Job succeeded without a result from the mover.
pub const MOVER_REPORT_MISSING: &str = "MoverReportMissing";
/// The Job failed without a result from the mover.
pub const JOB_FAILED: &str = "JobFailed";
/// The application's backup tool exited with an error (the mover never ran).
pub const TOOL_FAILED: &str = "ToolFailed";
pub use super::consistency::HOOKS_MISSING;
pub use super::consistency::TOOL_MISSING;

/// Why the application's backup tool (the Job pod's container `tool`: an init container, or
/// beside the mover when it streams) failed: its exit
/// code and the end of its output, and the kubelet's reason when it evicted the pod. `None`
/// while it did not fail.
pub fn tool_failure(pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<String> {
    pods.iter().find_map(|pod| {
        let status = pod.status.as_ref()?;
        let exited = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .filter(|container| container.name == "tool")
            .find_map(|container| {
                let terminated = container.state.as_ref()?.terminated.as_ref()?;
                (terminated.exit_code != 0).then(|| {
                    let output = terminated.message.as_deref().unwrap_or_default().trim();
                    format!(
                        "the backup tool exited with code {}{}",
                        terminated.exit_code,
                        if output.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", crate::events::cut(output, 1024))
                        }
                    )
                })
            });
        // An eviction (its scratch space overfilled, the node short of disk) kills the tool
        // with 137: its reason is only on the pod.
        let evicted = (status.reason.as_deref() == Some("Evicted")).then(|| {
            format!(
                "the kubelet evicted the Job's pod {}: {}",
                pod.metadata.name.as_deref().unwrap_or_default(),
                status.message.as_deref().unwrap_or("no reason given")
            )
        });
        match (evicted, exited) {
            (Some(evicted), Some(exited)) => Some(format!("{evicted} ({exited})")),
            (evicted, exited) => evicted.or(exited),
        }
    })
}

/// The tool's scratch space cannot hold a copy of the claims' data: the tool was not run.
pub const SCRATCH_TOO_SMALL: &str = "ScratchTooSmall";

/// How the scratch check before the tool ended, when it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScratchCheck {
    /// It refused the copy: its output names the claim's size and the scratch space's.
    Refused(String),
    /// It failed otherwise (it could not measure, it was killed): its exit and output.
    Failed(String),
}

/// How the scratch check before the tool failed, if it did.
pub fn scratch_check(pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<ScratchCheck> {
    pods.iter()
        .filter_map(|pod| pod.status.as_ref())
        .flat_map(|status| status.init_container_statuses.iter().flatten())
        .filter(|container| container.name == super::job::SCRATCH_CHECK)
        .find_map(|container| {
            let terminated = container.state.as_ref()?.terminated.as_ref()?;
            let said = crate::events::cut(
                terminated.message.as_deref().unwrap_or_default().trim(),
                1024,
            );
            match terminated.exit_code {
                0 => None,
                custody_proto::mover::SCRATCH_REFUSED_EXIT if !said.is_empty() => {
                    Some(ScratchCheck::Refused(said))
                }
                code => Some(ScratchCheck::Failed(format!(
                    "the scratch check before the tool exited with code {code}{}",
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {said}")
                    }
                ))),
            }
        })
}

/// Annotation on a Job custody stopped before its end: why (a tool past its time bound).
pub const ANNOTATION_STOPPED: &str = "custody.io/stopped";

/// Why custody stopped `job`, if it did.
pub fn stopped(job: &Job) -> Option<String> {
    job.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_STOPPED)
        .cloned()
}

/// Why a stream tool's Job must be stopped, if it must: its mover ended while the tool (beside
/// it, writing into the mover's FIFO) still runs or has yet to start. Nothing reads the stream any more; a tool
/// whose end of the FIFO never opened would wait for a reader until the Job's deadline.
pub fn orphaned_tool(pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<String> {
    pods.iter().find_map(|pod| {
        let containers = pod.status.as_ref()?.container_statuses.as_ref()?;
        let state = |name: &str| {
            containers
                .iter()
                .find(|container| container.name == name)
                .and_then(|container| container.state.as_ref())
        };
        let mover = state("mover")?.terminated.as_ref()?;
        // Running, or yet to start (it would then wait for a reader): either way, stopped.
        state("tool")?.terminated.is_none().then_some(())?;
        Some(format!(
            "the mover in pod {} ended (exit code {}) while the backup tool beside it still ran: custody stopped its Job",
            pod.metadata.name.as_deref().unwrap_or_default(),
            mover.exit_code
        ))
    })
}

/// Where the tool of a running Job stands against its `timeoutSeconds`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolClock {
    /// No bound, or the tool exited.
    Unbounded,
    /// Bounded, and the tool has not started yet (its pod pending, its image pulling): its
    /// start is looked for every few seconds, as nothing else announces it.
    Starting,
    /// Running; its bound passes in this many seconds.
    Left(u64),
    /// Running past its bound: why its Job is stopped.
    Overdue(String),
}

/// The tool's time against `timeout_seconds`, counted from the start of its container (an
/// image pull or a pending pod does not count: the Job deadline bounds those).
pub fn tool_clock(
    pods: &[k8s_openapi::api::core::v1::Pod],
    timeout_seconds: Option<i64>,
    now: k8s_openapi::jiff::Timestamp,
) -> ToolClock {
    let Some(timeout) = timeout_seconds.filter(|timeout| *timeout > 0) else {
        return ToolClock::Unbounded;
    };
    let tools = || {
        pods.iter().flat_map(|pod| {
            pod.status
                .iter()
                .flat_map(|status| {
                    status
                        .init_container_statuses
                        .iter()
                        .flatten()
                        .chain(status.container_statuses.iter().flatten())
                })
                .filter(|container| container.name == "tool")
                .filter_map(|container| container.state.as_ref())
                .map(move |state| (pod, state))
        })
    };
    if tools().any(|(_, state)| state.terminated.is_some()) {
        return ToolClock::Unbounded;
    }
    let running = tools().find_map(|(pod, state)| {
        let started = state.running.as_ref()?.started_at.clone()?;
        Some((pod.metadata.name.clone().unwrap_or_default(), started.0))
    });
    let Some((pod, started)) = running else {
        return ToolClock::Starting;
    };
    let ran = now.duration_since(started).as_secs().max(0);
    if ran >= timeout {
        ToolClock::Overdue(format!(
            "the backup tool ran {ran} s in pod {pod}, past its timeoutSeconds ({timeout} s): custody stopped its Job"
        ))
    } else {
        ToolClock::Left((timeout - ran) as u64)
    }
}

#[cfg(test)]
mod tests;

/// Where a command run of `repository` writes.
pub fn destination(
    repository: &custody_kube::api::BackupRepository,
    command_prefix_of_backup: &str,
) -> custody_kube::api::Destination {
    custody_kube::api::Destination::in_repository(
        repository,
        command_prefix(
            repository.spec.prefix.as_deref().unwrap_or_default(),
            command_prefix_of_backup,
        ),
    )
}

/// Whether two runs' prefixes could hold the same keys: equal, or one under the other.
pub fn prefixes_overlap(one: &str, other: &str) -> bool {
    let (one, other) = (one.trim_matches('/'), other.trim_matches('/'));
    let nested = |outer: &str, inner: &str| {
        outer.is_empty() || inner == outer || inner.starts_with(&format!("{outer}/"))
    };
    nested(one, other) || nested(other, one)
}

/// Where another Backup writes: recorded when it started, or its artifact's place for a
/// Backup that started before destinations were recorded; `None` when neither is known.
fn destination_of(backup: &custody_kube::api::Backup) -> Option<(String, String)> {
    let status = backup.status.as_ref()?;
    if let Some(destination) = &status.destination {
        return Some((destination.bucket.clone(), destination.prefix.clone()));
    }
    let artifact = status.artifact.as_ref()?;
    Some((artifact.bucket.clone(), artifact.prefix.clone()))
}

/// The other runs of a backup command that could have written under `destination`, in
/// every namespace: other command Backups whose bucket is the same and whose prefix is the
/// same, above or below it. Endpoints are not compared (a Service name, its FQDN and its IP
/// are one server); a run whose destination is unknown counts.
pub fn other_runs(
    backups: &[custody_kube::api::Backup],
    uid: &str,
    destination: &custody_kube::api::Destination,
) -> Vec<crate::attribution::OtherRun> {
    backups
        .iter()
        .filter(|backup| backup.metadata.uid.as_deref() != Some(uid))
        .filter(|backup| backup.spec.command.is_some())
        .filter(|backup| {
            destination_of(backup).is_none_or(|(bucket, prefix)| {
                bucket == destination.bucket && prefixes_overlap(&prefix, &destination.prefix)
            })
        })
        .filter_map(|backup| {
            let status = backup.status.as_ref()?;
            let start = status.start_time.as_ref()?.0.as_nanosecond() as i64;
            Some(crate::attribution::OtherRun {
                name: format!(
                    "{}/{}",
                    backup.metadata.namespace.as_deref().unwrap_or_default(),
                    backup.metadata.name.as_deref().unwrap_or_default()
                ),
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
pub fn run_of(status: &custody_kube::api::BackupStatus, end: i64) -> crate::attribution::Run {
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
