//! The Restore decisions as plain data: which claims a Restore writes, where each volume
//! stands (from the agents' reports and the Restore's own Jobs), which prepareData Job to
//! create next, the Restore's phase, which pods may be released, and what teardown deletes.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::backups::decide::JobState;
use custody_kube::api::{
    ReportedVolume, RestorePhase, VolumeRestorePolicy, VolumeRestoreStatus, VolumeState,
};
use custody_proto::reasons::VolumeFailure;

/// Finalizer of the restore reconciler on Restores.
pub const FINALIZER: &str = "custody.io/restore-cleanup";
/// Label on everything the restore reconciler creates: the Restore's UID.
pub use custody_proto::names::LABEL_RESTORE_UID;
/// A volume's prepareData Job failed.
pub const RESTORE_JOB_FAILED: &str = "RestoreJobFailed";
/// A volume's prepareData Job has no pod that starts (it waits, then fails at its deadline).
pub use crate::backups::reasons::JOB_POD_NOT_STARTING;
/// A volume's prepareData Job kept disappearing.
pub const JOB_DELETED: &str = "JobDeleted";
/// The volume's pod moved to another node after its volume was written, too often.
pub const POD_MOVED: &str = "PodMoved";
/// A Job of the name this Restore would use is someone else's.
pub const JOB_NAME_TAKEN: &str = "JobNameTaken";
/// The volume's prepareData pod was deleted before its agent verified it, on every attempt.
pub const PREPARE_DATA_POD_GONE: &str = "PrepareDataPodGone";
/// The volume waited for its pod, its node's agent or its verification past the Restore's
/// `progressDeadlineSeconds`.
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
/// How long after a prepareData Job finished its node's agent may not have seen its pod yet
/// (watch lag, a report on its way): a later report that sees no such pod means it is gone.
pub const POD_GONE_AFTER_SECONDS: i64 = 15;

/// The condition reason for a volume's failure: one of the restore reconciler's own, or a
/// [`VolumeFailure`] an agent reported (one this build does not know reads as its fallback).
pub fn condition_reason(reason: &str) -> &'static str {
    [
        RESTORE_JOB_FAILED,
        JOB_DELETED,
        JOB_NAME_TAKEN,
        POD_MOVED,
        PREPARE_DATA_POD_GONE,
        PROGRESS_DEADLINE_EXCEEDED,
    ]
    .into_iter()
    .find(|own| *own == reason)
    .unwrap_or_else(|| VolumeFailure::parse(reason).as_str())
}

/// How many prepareData Jobs one volume may get: a Job deleted by someone else is recreated
/// this many times in all, then the volume fails.
pub const MAX_ATTEMPTS: u32 = 3;

/// The prepareData Job's name for attempt `attempt` of `claim`: readable, unique per Restore
/// (a piece of its UID) and within the 63 characters a Job's pods' label allows.
pub fn job_name(claim: &str, restore_uid: &str, attempt: u32) -> String {
    let suffix = format!(
        "-restore-{}-{attempt}",
        &restore_uid[..restore_uid.len().min(8)]
    );
    let room = 63 - suffix.len();
    let base: String = claim.chars().take(room).collect();
    format!("{}{suffix}", base.trim_end_matches('-'))
}

/// Whether `job` is this Restore's own.
pub fn owned_job(job: &Job, restore_uid: &str) -> bool {
    crate::ownership::owned_by(&job.metadata, "Restore", restore_uid, LABEL_RESTORE_UID)
}

/// What the restore reconciler knows about one of its Jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobFact {
    /// No Job of that name.
    Missing,
    /// This Restore's own Job.
    Owned(JobState),
    /// A Job of that name that this Restore did not create.
    Foreign,
}

/// A prepareData Job to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateJob {
    pub claim: String,
    pub node: String,
    pub name: String,
    pub attempt: u32,
}

/// Everything known about one volume.
#[derive(Clone, Debug)]
pub struct VolumeFacts<'a> {
    pub claim: &'a str,
    /// What the Restore's status said last time.
    pub previous: Option<&'a VolumeRestoreStatus>,
    /// What an agent reports about it, and from which node.
    pub reported: Option<(&'a ReportedVolume, &'a str)>,
    /// The Job of the current attempt.
    pub job: JobFact,
    /// Why that Job's pod does not start, while it runs.
    pub job_problem: Option<&'a str>,
    /// The node that Job's pod is pinned to.
    pub job_node: Option<&'a str>,
    /// When that Job finished, if it succeeded.
    pub job_finished: Option<Timestamp>,
    /// When the reporting node's agent last reported, by the controller's clock.
    pub reported_at: Option<Timestamp>,
    /// Whether the volume may get its first Job now (see [`may_start`]).
    pub may_start: bool,
}

/// Where one volume stands next, and whether it wants a Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeStep {
    pub status: VolumeRestoreStatus,
    /// A Job to create.
    pub create: Option<CreateJob>,
    /// A Job of this Restore disappeared and is being recreated.
    pub recreated: bool,
    /// The volume was written on this node, and its pod now runs on another: the next
    /// attempt's Job runs there.
    pub moved_from: Option<String>,
    /// The prepareData pod was deleted before its output was verified: the next attempt's Job
    /// checks it again.
    pub pod_gone: bool,
}

fn failed(mut status: VolumeRestoreStatus, reason: &str, message: String) -> VolumeStep {
    status.state = VolumeState::Failed;
    status.reason = Some(reason.to_string());
    status.message = Some(message);
    VolumeStep {
        status,
        create: None,
        recreated: false,
        moved_from: None,
        pod_gone: false,
    }
}

fn at(mut status: VolumeRestoreStatus, state: VolumeState, message: Option<String>) -> VolumeStep {
    status.state = state;
    status.reason = None;
    status.message = message;
    VolumeStep {
        status,
        create: None,
        recreated: false,
        moved_from: None,
        pod_gone: false,
    }
}

/// The step that gives the volume Job attempt `attempt` on `node`, saying why with `message`
/// (given the new Job's name).
fn next_attempt(
    mut status: VolumeRestoreStatus,
    claim: &str,
    node: &str,
    restore_uid: &str,
    attempt: u32,
    message: impl FnOnce(&str) -> String,
) -> VolumeStep {
    let name = job_name(claim, restore_uid, attempt);
    status.attempts = attempt;
    status.job_name = Some(name.clone());
    let mut step = at(status, VolumeState::Restoring, Some(message(&name)));
    step.create = Some(CreateJob {
        claim: claim.to_string(),
        node: node.to_string(),
        name,
        attempt,
    });
    step
}

/// The next state of one volume. Verified and Failed are final: a volume that failed is
/// never quietly retried into Completed, and a verified one is not taken back.
pub fn volume(facts: &VolumeFacts<'_>, restore_uid: &str) -> VolumeStep {
    let mut status = facts
        .previous
        .cloned()
        .unwrap_or_else(|| VolumeRestoreStatus {
            claim_name: facts.claim.to_string(),
            ..VolumeRestoreStatus::default()
        });
    if matches!(status.state, VolumeState::Verified | VolumeState::Failed) {
        return VolumeStep {
            status,
            create: None,
            recreated: false,
            moved_from: None,
            pod_gone: false,
        };
    }
    let Some((reported, node)) = facts.reported else {
        return at(
            status,
            VolumeState::Pending,
            Some(format!(
                "waiting for a pod that mounts claim {} to be scheduled and reported by its node's agent",
                facts.claim
            )),
        );
    };
    status.node_name = Some(node.to_string());
    status.pod_name = Some(reported.pod_name.clone());
    match reported.state {
        VolumeState::Failed => {
            return failed(
                status,
                VolumeFailure::parse(reported.reason.as_deref().unwrap_or_default()).as_str(),
                reported
                    .message
                    .clone()
                    .unwrap_or_else(|| "the node agent reports the volume failed".to_string()),
            );
        }
        VolumeState::Verified => {
            return at(status, VolumeState::Verified, reported.message.clone());
        }
        VolumeState::Verifying => {
            return at(
                status,
                VolumeState::Verifying,
                Some(format!("the agent on node {node} is checking the content")),
            );
        }
        VolumeState::Pending | VolumeState::Restoring => {}
    }
    let job = status.job_name.clone().unwrap_or_default();
    match &facts.job {
        JobFact::Foreign => failed(
            status,
            JOB_NAME_TAKEN,
            format!("Job {job} exists but was not created by this Restore; it is left alone"),
        ),
        JobFact::Owned(JobState::Running) => match facts.job_problem {
            None => at(
                status,
                VolumeState::Restoring,
                Some(format!("Job {job} writes the volume on node {node}")),
            ),
            Some(problem) => {
                let mut step = at(
                    status,
                    VolumeState::Restoring,
                    Some(format!(
                        "Job {job} does not start: {problem}; it fails at its deadline unless that is fixed"
                    )),
                );
                step.status.reason = Some(JOB_POD_NOT_STARTING.to_string());
                step
            }
        },
        // The volume was written on another node, and the pod now runs here (a network volume
        // follows its pod): only this node's agent can verify it for this pod, and it sees no
        // prepareData pod of its own. The next attempt runs here; the mover finds this
        // restore's finished output and writes nothing, and this node's agent verifies it.
        JobFact::Owned(JobState::Succeeded)
            if facts.job_node.is_some_and(|wrote| wrote != node) =>
        {
            let wrote = facts.job_node.unwrap_or_default().to_string();
            let pod = reported.pod_name.clone();
            if status.attempts >= MAX_ATTEMPTS {
                return failed(
                    status,
                    POD_MOVED,
                    format!(
                        "pod {pod} now runs on node {node}, but Job {job} wrote its volume on node {wrote} and no attempt is left ({MAX_ATTEMPTS}) to check it on node {node}"
                    ),
                );
            }
            let attempt = status.attempts + 1;
            let mut step = next_attempt(status, facts.claim, node, restore_uid, attempt, |name| {
                format!(
                    "pod {pod} moved to node {node} after Job {job} wrote its volume on node {wrote}; Job {name} (attempt {attempt} of {MAX_ATTEMPTS}) checks it on node {node}, where the agent verifies it"
                )
            });
            step.moved_from = Some(wrote);
            step
        }
        // The agent sees no prepareData pod of this Restore for the volume, in a report made
        // well after the Job finished: the pod was deleted (by hand, by a pod garbage
        // collector) before the agent verified its output, and nothing would ever verify it.
        // The next attempt's Job runs here; its mover finds this restore's finished output and
        // writes nothing, and the agent verifies it.
        JobFact::Owned(JobState::Succeeded)
            if reported.state == VolumeState::Pending
                && pod_gone(facts.job_finished, facts.reported_at) =>
        {
            let gone = format!(
                "the agent on node {node} sees no pod of Job {job}, which finished {} s before its report: the pod was deleted before the volume was verified",
                seconds_between(facts.job_finished, facts.reported_at)
            );
            if status.attempts >= MAX_ATTEMPTS {
                return failed(
                    status,
                    PREPARE_DATA_POD_GONE,
                    format!("{gone}, and no attempt is left ({MAX_ATTEMPTS}) to check it again"),
                );
            }
            let attempt = status.attempts + 1;
            let mut step = next_attempt(status, facts.claim, node, restore_uid, attempt, |name| {
                format!(
                    "{gone}; Job {name} (attempt {attempt} of {MAX_ATTEMPTS}) checks it again on node {node}"
                )
            });
            step.pod_gone = true;
            step
        }
        JobFact::Owned(JobState::Succeeded) => at(
            status,
            VolumeState::Verifying,
            Some(format!(
                "Job {job} finished; waiting for the agent on node {node} to verify"
            )),
        ),
        JobFact::Owned(JobState::Failed { message }) => {
            // What the node's agent last saw of its pods (a retried Job's last failure).
            let last = reported
                .message
                .as_deref()
                .map(|said| format!("; the agent on node {node} last said: {said}"))
                .unwrap_or_default();
            failed(
                status,
                RESTORE_JOB_FAILED,
                format!("Job {job} failed: {message}{last}"),
            )
        }
        JobFact::Missing if status.attempts == 0 && !facts.may_start => at(
            status,
            VolumeState::Pending,
            Some("waiting for the volumes before it (Serial restore)".to_string()),
        ),
        JobFact::Missing if status.attempts == 0 => {
            next_attempt(status, facts.claim, node, restore_uid, 1, |name| {
                format!("Job {name} writes the volume on node {node}")
            })
        }
        JobFact::Missing if status.attempts < MAX_ATTEMPTS => {
            let attempt = status.attempts + 1;
            let mut step = next_attempt(status, facts.claim, node, restore_uid, attempt, |name| {
                format!(
                    "Job {job} disappeared before the volume was verified; Job {name} (attempt {attempt} of {MAX_ATTEMPTS}) writes it again"
                )
            });
            step.recreated = true;
            step
        }
        JobFact::Missing => failed(
            status,
            JOB_DELETED,
            format!(
                "Job {job} disappeared before the volume was verified, {MAX_ATTEMPTS} times; something deletes the restore's Jobs"
            ),
        ),
    }
}

/// A volume whose Job would pass `--movers-per-node` on `node`, where `taken` movers run:
/// nothing is created, its status stays as it was (a first attempt waits `Pending`), saying
/// what it waits for.
pub fn wait_for_slot(
    previous: Option<&VolumeRestoreStatus>,
    claim: &str,
    (node, pod): (&str, Option<&str>),
    taken: u32,
    bound: u32,
) -> VolumeStep {
    let mut status = previous.cloned().unwrap_or_else(|| VolumeRestoreStatus {
        claim_name: claim.to_string(),
        ..VolumeRestoreStatus::default()
    });
    status.node_name = Some(node.to_string());
    status.pod_name = pod.map(str::to_string).or(status.pod_name);
    status.reason = Some(crate::node_slots::MOVER_SLOTS_BUSY.to_string());
    status.message = Some(format!(
        "claim {claim} waits for a slot: {}",
        crate::node_slots::busy(node, taken, bound)
    ));
    VolumeStep {
        status,
        create: None,
        recreated: false,
        moved_from: None,
        pod_gone: false,
    }
}

/// Whether a report came at least [`POD_GONE_AFTER_SECONDS`] after the Job finished.
fn pod_gone(finished: Option<Timestamp>, reported: Option<Timestamp>) -> bool {
    finished.is_some()
        && reported.is_some()
        && seconds_between(finished, reported) >= POD_GONE_AFTER_SECONDS
}

/// `step` with the time its volume entered its state: kept while the state stays, `now` when
/// it changed.
pub fn since(
    mut step: VolumeStep,
    previous: Option<&VolumeRestoreStatus>,
    now: Timestamp,
) -> VolumeStep {
    let since = previous
        .filter(|previous| previous.state == step.status.state)
        .and_then(|previous| previous.last_transition_time.clone())
        .unwrap_or(Time(now));
    step.status.last_transition_time = Some(since);
    step
}

/// Fails `ProgressDeadlineExceeded` every volume that waits (`Pending`: for its pod or its
/// node's agent; `Verifying`: for the agent's verdict) when the Restore made no progress for
/// longer than `deadline_seconds`: no volume changed state since, and none is being written
/// (a Job's own deadline bounds that, and volumes may wait their turn behind it: `Serial`, or
/// a StatefulSet that starts its pods one by one).
pub fn past_deadline(steps: &mut [VolumeStep], now: Timestamp, deadline_seconds: i64) {
    // A volume whose node's agent is missing or silent waits, whatever its state says.
    let agent_away = |step: &VolumeStep| {
        matches!(
            step.status.reason.as_deref(),
            Some(super::reasons::AGENT_MISSING | super::reasons::AGENT_NOT_READY)
        )
    };
    // Nor does one that waits for a mover's slot on its node: the movers there run, each
    // within its Job's deadline.
    let slot_busy = |step: &VolumeStep| {
        step.status.reason.as_deref() == Some(crate::node_slots::MOVER_SLOTS_BUSY)
    };
    if steps.iter().any(|step| {
        (step.status.state == VolumeState::Restoring && !agent_away(step)) || slot_busy(step)
    }) {
        return;
    }
    let Some(progress) = steps
        .iter()
        .filter_map(|step| step.status.last_transition_time.as_ref())
        .map(|time| time.0)
        .max()
    else {
        return;
    };
    let waited = now.as_second() - progress.as_second();
    if waited <= deadline_seconds {
        return;
    }
    for step in steps.iter_mut() {
        let waiting = match step.status.state {
            VolumeState::Pending => "Pending",
            VolumeState::Verifying => "Verifying",
            // Only one whose agent is away is left Restoring here (see above).
            VolumeState::Restoring => "Restoring",
            VolumeState::Verified | VolumeState::Failed => continue,
        };
        let what = step
            .status
            .message
            .clone()
            .unwrap_or_else(|| "nothing reported".to_string());
        let claim = step.status.claim_name.clone();
        *step = failed(
            step.status.clone(),
            PROGRESS_DEADLINE_EXCEEDED,
            format!(
                "claim {claim} stayed {waiting} and the Restore made no progress for {waited}s, past its progressDeadlineSeconds ({deadline_seconds}s); it waited for: {what}"
            ),
        );
        step.status.last_transition_time = Some(Time(now));
    }
}

/// Whole seconds from `from` to `to` (0 when either is unknown).
fn seconds_between(from: Option<Timestamp>, to: Option<Timestamp>) -> i64 {
    match (from, to) {
        (Some(from), Some(to)) => to.as_second() - from.as_second(),
        _ => 0,
    }
}

/// Whether the next volume may get its first Job: always under `Parallel`; under `Serial`
/// only when every volume before it is Verified.
pub fn may_start(policy: VolumeRestorePolicy, earlier: &[VolumeStep]) -> bool {
    policy == VolumeRestorePolicy::Parallel
        || earlier
            .iter()
            .all(|step| step.status.state == VolumeState::Verified)
}

/// The Restore's phase, its progress text, and the failure that decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub phase: RestorePhase,
    pub progress: String,
    /// The first failed volume: `(reason, message)`.
    pub failure: Option<(String, String)>,
}

/// Completed only when every expected volume is Verified; Failed when any volume failed.
pub fn summary(volumes: &[VolumeRestoreStatus]) -> Summary {
    let verified = volumes
        .iter()
        .filter(|volume| volume.state == VolumeState::Verified)
        .count();
    let progress = format!("{verified}/{} verified", volumes.len());
    let failure = volumes
        .iter()
        .find(|volume| volume.state == VolumeState::Failed)
        .map(|volume| {
            (
                volume
                    .reason
                    .clone()
                    .unwrap_or_else(|| "Failed".to_string()),
                format!(
                    "claim {}: {}",
                    volume.claim_name,
                    volume.message.clone().unwrap_or_default()
                ),
            )
        });
    let phase = if failure.is_some() {
        RestorePhase::Failed
    } else if !volumes.is_empty() && verified == volumes.len() {
        RestorePhase::Completed
    } else if volumes
        .iter()
        .all(|volume| volume.state == VolumeState::Pending)
    {
        RestorePhase::Pending
    } else {
        RestorePhase::Running
    };
    Summary {
        phase,
        progress,
        failure,
    }
}

mod layout;
mod pods;
pub use layout::{Refusal, UNSUPPORTED_VOLUME_LAYOUT, claims, layout};
pub use pods::{
    Teardown, needs_record, releasable_pods, reported_pods, reports_for, speaks_for, teardown,
    verified_claims,
};

#[cfg(test)]
mod tests;
