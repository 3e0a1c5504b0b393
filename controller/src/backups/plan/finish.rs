//! The last stage of a Backup: once its Job finished, what it proves (the mover's report
//! against the recorded keys, a command's dump attributed by its times) and how it ends.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::decide::{self, JobState};
use super::super::reasons;
use super::{Facts, Plan, next_status, waiting};
use crate::conditions::{Desired, Status, types};
use crate::events::Note;
use custody_kube::api::{
    Artifact, AttributionEvidence, BackupPhase, BackupRepository, BackupStatus,
};

/// How long the mover's report says the filesystem stayed frozen.
pub(super) fn frozen_millis(report: &Option<String>) -> Option<i64> {
    match custody_proto::mover::read_report::<custody_proto::mover::BackupResult>(
        report.as_deref()?,
    ) {
        custody_proto::mover::Report::Done(result) => result
            .frozen_millis
            .and_then(|millis| i64::try_from(millis).ok()),
        _ => None,
    }
}

/// How a volume backup's finished Job ends: the mover's report, checked against the keys
/// recorded before it started.
pub(super) fn finished(
    recorded: Option<&Artifact>,
    job_name: &str,
    state: &JobState,
    facts: &Facts,
) -> Result<Artifact, (&'static str, String)> {
    let recorded = recorded.cloned().unwrap_or_default();
    match (state, &facts.report) {
        // A stream tool's failure, as the mover saw it, or the mover stopped with a tool past
        // its bound: the tool's own exit and output, or the bound, say more.
        (JobState::Failed { .. }, Some(report))
            if facts.tool_failure.is_some()
                && matches!(
                    custody_proto::mover::read_report::<serde_json::Value>(report),
                    custody_proto::mover::Report::Failed(ref failure)
                        if matches!(
                            failure.reason,
                            custody_proto::reasons::MoverFailure::ToolFailed
                                | custody_proto::reasons::MoverFailure::Interrupted
                        )
                ) =>
        {
            Err((
                decide::TOOL_FAILED,
                facts.tool_failure.clone().unwrap_or_default(),
            ))
        }
        (_, Some(report)) => {
            decide::completion(&recorded, &custody_proto::mover::read_report(report))
        }
        (JobState::Failed { .. }, None) if facts.scratch_check.is_some() => {
            Err(match facts.scratch_check.clone() {
                Some(decide::ScratchCheck::Refused(said)) => (decide::SCRATCH_TOO_SMALL, said),
                Some(decide::ScratchCheck::Failed(said)) => (decide::JOB_FAILED, said),
                None => unreachable!("matched on Some"),
            })
        }
        (JobState::Failed { .. }, None) if facts.tool_failure.is_some() => Err((
            decide::TOOL_FAILED,
            facts.tool_failure.clone().unwrap_or_default(),
        )),
        (JobState::Failed { message }, None) => Err((decide::JOB_FAILED, message.clone())),
        (_, None) => Err((
            decide::MOVER_REPORT_MISSING,
            format!("Job {job_name} succeeded without a report from the mover"),
        )),
    }
}

/// After a command backup's Job: which dump under the shared prefix is this run's, by two
/// clocks ([`crate::attribution`]); recorded only when exactly one fits.
pub(super) fn attributed(
    facts: &Facts,
    state: &JobState,
    repository: &BackupRepository,
    command_prefix: &str,
) -> Result<Artifact, (&'static str, String)> {
    if let JobState::Failed { message } = state {
        return Err((decide::JOB_FAILED, message.clone()));
    }
    let listing = match &facts.listing {
        Some(Ok(listing)) => listing,
        Some(Err((reason, message))) => return Err((reason, message.clone())),
        None => return Err((decide::JOB_FAILED, "the dump listing was not read".into())),
    };
    let backup = &facts.backup;
    let uid = backup.metadata.uid.clone().unwrap_or_default();
    let status = backup.status.clone().unwrap_or_default();
    let destination = status
        .destination
        .clone()
        .unwrap_or_else(|| decide::destination(repository, command_prefix));
    let others = decide::other_runs(&facts.others, &uid, &destination);
    let run = decide::run_of(&status, facts.now.as_nanosecond() as i64);
    let found = crate::attribution::attribute(&run, &listing.candidates, &others)
        .map_err(|refusal| (refusal.reason, refusal.message))?;
    if !crate::artifacts::normal_key(&found.key) {
        return Err((
            reasons::KEY_NOT_NORMAL,
            format!(
                "the dump {} is not a key in normal form (an empty, . or .. segment); custody records only keys it can delete exactly",
                found.key
            ),
        ));
    }
    Ok(Artifact {
        prefix: decide::command_prefix(
            repository.spec.prefix.as_deref().unwrap_or_default(),
            command_prefix,
        ),
        size_bytes: listing.sizes.get(&found.key).copied(),
        key: found.key.clone(),
        manifest_key: String::new(),
        attribution: Some(AttributionEvidence {
            corrected_name_time_nanos: found.corrected,
            last_modified_nanos: found.last_modified,
            window_start_nanos: found.window.0,
            window_end_nanos: found.window.1,
        }),
        ..Artifact::located_in(repository)
    })
}

/// The Backup ends: Completed with its artifact, or Failed with the reason.
pub(super) fn conclude(
    facts: &Facts,
    mut status: BackupStatus,
    outcome: Result<Artifact, (&'static str, String)>,
) -> Plan {
    status.completion_time = Some(Time(facts.now));
    let command = facts.backup.spec.command.is_some();
    let (phase, ready, note) = match outcome {
        Ok(artifact) => {
            let message = if command {
                format!(
                    "the dump {} is this run's: its name's time, corrected by the node's clock offset, and its LastModified fall within the run",
                    artifact.key
                )
            } else if let Some(snapshot) = &artifact.snapshot {
                format!(
                    "snapshot {} in repository {} ({} bytes added; manifest BLAKE3 {})",
                    snapshot.id.as_deref().unwrap_or_default(),
                    snapshot.repository_id,
                    artifact.size_bytes.unwrap_or_default(),
                    artifact.manifest_hash.clone().unwrap_or_default()
                )
            } else {
                format!(
                    "{} bytes at {} (manifest BLAKE3 {})",
                    artifact.size_bytes.unwrap_or_default(),
                    artifact.key,
                    artifact.manifest_hash.clone().unwrap_or_default()
                )
            };
            status.size = artifact
                .size_bytes
                .and_then(|bytes| u64::try_from(bytes).ok())
                .map(custody_proto::progress::human_bytes);
            status.artifact = Some(artifact);
            // Everything is copied: the mover's own count when it gave one.
            let result =
                facts.report.as_deref().and_then(
                    |report| match custody_proto::mover::read_report::<
                        custody_proto::mover::BackupResult,
                    >(report)
                    {
                        custody_proto::mover::Report::Done(result) => {
                            Some((result.files, result.total_bytes))
                        }
                        _ => None,
                    },
                );
            if !command {
                status.transfer = crate::transfer::completed(status.transfer.as_ref(), result);
            }
            let event = if command {
                "DumpAttributed"
            } else {
                "BackupCompleted"
            };
            (
                BackupPhase::Completed,
                Desired {
                    type_: types::READY,
                    status: Status::True,
                    reason: reasons::COMPLETED,
                    message: message.clone(),
                },
                Note::normal(event, message),
            )
        }
        Err((reason, message)) => (
            BackupPhase::Failed,
            waiting(reason, message.clone()),
            Note::warning(reason, message),
        ),
    };
    Plan {
        status: next_status(&facts.backup, status, phase, &ready, facts.now),
        events: vec![note],
        ..Plan::wait_for_change()
    }
}
