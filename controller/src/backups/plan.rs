//! What one reconciliation of a Backup does, decided from what it read: [`plan`] takes the
//! [`Facts`] and returns a [`Plan`] (the status to write, the Job to create, the credentials
//! Secret to hold, the Lease step, the Events, when to look again). No API client here.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::consistency::{self, Mounter};
use super::decide::{self, JobState};
use super::hooks;
use super::reasons;
use crate::attribution::Candidate;
use crate::conditions::{self, Desired, Status, types};
use crate::events::Note;
use crate::holds::{self, LeaseStep, Run};
use crate::transfer;
use custody_kube::api::{
    Backup, BackupPhase, BackupRepository, BackupStatus, Capture, ClockMeasurement, Cluster,
    HasConditions, Restore, RestorePhase,
};
use finish::{attributed, conclude, finished, frozen_millis};
use start::start;

/// What a reconciliation knows about the Backup's Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobFact {
    /// No Job of the Backup's name.
    Missing,
    /// A Job of that name this Backup did not create.
    Foreign,
    /// A Job of that name whose creation this Backup recorded as coming and never as done: the
    /// controller stopped between the two, or someone else made it first.
    Unproven,
    /// The Backup's own Job.
    Owned(JobState),
}

/// What a user's command left under its prefix, for attribution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub candidates: Vec<Candidate>,
    /// Object sizes by key.
    pub sizes: BTreeMap<String, i64>,
}

/// Everything a reconciliation of a Backup read, as plain data. Facts that only matter at a
/// later step (the claim, the node, the mover's report, the dump listing) are read only when
/// the facts before them lead there.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The Backup as the API server has it now.
    pub backup: Backup,
    pub now: Timestamp,
    /// How Jobs run `custody-mover`.
    pub mover: crate::mover_job::MoverJob,
    pub cluster: Option<Cluster>,
    /// The repository the Backup (or else its Cluster) names, if it exists.
    pub repository: Option<BackupRepository>,
    pub job: JobFact,
    /// Restores of the namespace (read before the Backup starts: the hold).
    pub restores: Vec<Restore>,
    /// The UID of the claim to back up, if it exists (read before the Backup starts).
    pub claim_uid: Option<String>,
    /// The claims of the Cluster's other volume claim templates that do not exist (read
    /// before the Backup starts).
    pub claims_missing: Vec<String>,
    /// Where the application mounts each volume claim template, when the Cluster has several
    /// (read before the Backup starts): a symlink may lead from one into another.
    pub mount_paths: BTreeMap<String, String>,
    /// The running pod that mounts the claim, and its node (read before the Backup starts).
    pub mounted_on: Option<Mounter>,
    /// A pod mounting the claim that ran during a `Stopped` copy (read once its Job ended).
    pub started_during: Option<String>,
    /// The clock offset that node's agent measured.
    pub clock: Option<ClockMeasurement>,
    /// The mover's termination message, once its Job finished.
    pub report: Option<String>,
    /// Why the application's backup tool failed, once its Job finished without a report.
    pub tool_failure: Option<String>,
    /// How the scratch check before the tool failed, if it did.
    pub scratch_check: Option<super::decide::ScratchCheck>,
    /// What a command left under its prefix, once its Job finished: the listing, or why it
    /// could not be read (`reason`, `message`).
    pub listing: Option<Result<Listing, (&'static str, String)>>,
    /// Why the running Job's pod does not start, if something is known to keep it.
    pub job_pod_problem: Option<String>,
    /// The running tool against its `timeoutSeconds`.
    pub tool_clock: decide::ToolClock,
    /// Every Backup, in every namespace, when a command's dump is attributed.
    pub others: Vec<Backup>,
    /// The UID of this Kubernetes cluster's `kube-system` namespace, sealed in a snapshot as
    /// the cluster that made it (read before the Backup starts).
    pub origin_cluster: Option<String>,
    /// The snapshot of the Cluster's last completed Backup in the same repository: files
    /// unchanged since it are not read again (read before the Backup starts).
    pub parent_snapshot: Option<String>,
    /// Movers running per node, when `--movers-per-node` bounds them (read before the Backup
    /// starts).
    pub mover_slots: BTreeMap<String, u32>,
    /// While the Job runs: its mover's progress as the agent on its node last reported it,
    /// and that node ([`crate::transfer::reported`]).
    pub transfer_report: Option<(custody_kube::api::ReportedMover, String)>,
}

/// What one reconciliation does, in this order: add the finalizer (and nothing else), take
/// the Lease, hold the credentials Secret, write the status (the artifact's keys before the
/// Job exists), create the Job, release the Lease, publish the Events, look again.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub add_finalizer: bool,
    pub lease: LeaseStep,
    /// The credentials Secret to mark as needed by Backups before the artifact is recorded.
    pub hold_secret: Option<String>,
    pub status: Option<BackupStatus>,
    pub job: Option<Job>,
    /// Stop the running Job (its deadline set to now), recording why on it.
    pub stop_job: Option<String>,
    /// The claims to mark as holding known data, `(claim, how custody knows)`: a completed
    /// Backup copied them.
    pub mark_claims: Vec<(String, String)>,
    /// Copy the agents' gate CA into the namespace (a frozen copy's mover calls its agent).
    pub publish_gate_ca: bool,
    /// Run this hook in the application's pod, then record how it went in `status.hooks`
    /// (after the status above is written).
    pub hook: Option<hooks::Run>,
    pub events: Vec<Note>,
    /// When to reconcile again without a change; `None` waits for one.
    pub requeue: Option<Duration>,
}

impl Plan {
    fn wait_for_change() -> Plan {
        Plan {
            add_finalizer: false,
            lease: LeaseStep::Keep,
            hold_secret: None,
            status: None,
            job: None,
            stop_job: None,
            mark_claims: Vec::new(),
            publish_gate_ca: false,
            hook: None,
            events: Vec::new(),
            requeue: None,
        }
    }
}

/// The plan of one reconciliation (the Backup is not being deleted: see [`super::cleanup`]).
pub fn plan(facts: &Facts) -> Plan {
    let backup = &facts.backup;
    if !backup
        .finalizers()
        .iter()
        .any(|name| name == crate::artifacts::FINALIZER)
    {
        // Before anything is written anywhere: the artifact is always dealt with on deletion.
        return Plan {
            add_finalizer: true,
            ..Plan::wait_for_change()
        };
    }
    let phase = backup.status.as_ref().and_then(|status| status.phase);
    if matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed)) {
        return Plan::wait_for_change();
    }
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let uid = backup.metadata.uid.clone().unwrap_or_default();
    let cluster_name = &backup.spec.cluster_ref.name;
    let Some(cluster) = &facts.cluster else {
        return wait(
            facts,
            reasons::CLUSTER_NOT_FOUND,
            format!("Cluster {cluster_name} does not exist in this namespace"),
            30,
        );
    };
    let Some(repository_name) = repository_name(backup, cluster) else {
        return wait(
            facts,
            reasons::NO_REPOSITORY,
            format!("neither the Backup nor Cluster {cluster_name} names a BackupRepository"),
            60,
        );
    };
    let Some(repository) = &facts.repository else {
        return wait(
            facts,
            reasons::REPOSITORY_NOT_FOUND,
            format!("BackupRepository {repository_name} does not exist in this namespace"),
            30,
        );
    };
    let repository_ready = repository
        .conditions()
        .iter()
        .find(|condition| condition.type_ == types::READY);
    // Checked before a Job exists: a run under way reads its Job's outcome whatever a later
    // check of the repository says. A command writes its own dump: a bucket that answers is
    // enough for it.
    let usable = repository_ready.is_some_and(|condition| {
        condition.status == "True"
            || (backup.spec.command.is_some()
                && crate::repositories::reasons::bucket_answered(&condition.reason))
    });
    if facts.job == JobFact::Missing && !usable {
        return wait(
            facts,
            reasons::REPOSITORY_NOT_READY,
            format!(
                "BackupRepository {repository_name} is not ready: {}",
                repository_ready
                    .map(|condition| condition.message.clone())
                    .unwrap_or_else(|| "not checked yet".to_string())
            ),
            15,
        );
    }
    let Some(template) = cluster.spec.volume_claim_templates.first() else {
        return wait(
            facts,
            reasons::CLAIM_NOT_FOUND,
            format!("Cluster {cluster_name} lists no volume claim template"),
            60,
        );
    };
    let claim = decide::claim_name(template, &cluster.spec.stateful_set_ref.name);
    let job_name = decide::job_name(&name, &uid);
    let status = backup.status.clone().unwrap_or_default();

    match &facts.job {
        JobFact::Foreign => wait(
            facts,
            reasons::JOB_NAME_TAKEN,
            format!("Job {job_name} exists but was not created by this Backup; it is left alone"),
            60,
        ),
        JobFact::Unproven => {
            let why = format!(
                "Job {job_name} exists, but custody never recorded creating it (the controller stopped between creating and recording it, or someone else created it under this name): it may not freeze the volume and its outcome is not read"
            );
            Plan {
                stop_job: Some(why.clone()),
                ..fail_started(
                    facts,
                    status,
                    reasons::JOB_NOT_PROVEN,
                    format!("{why}; it is stopped; create a new Backup"),
                )
            }
        }
        JobFact::Owned(JobState::Running) => {
            let on = status.node_name.as_deref().map_or_else(
                || "the node the scheduler picked".to_string(),
                |node| format!("node {node}"),
            );
            let (ready, events) = match &facts.job_pod_problem {
                None => (
                    waiting(
                        reasons::RUNNING,
                        format!("backing up claim {claim} on {on}"),
                    ),
                    Vec::new(),
                ),
                Some(problem) => {
                    let message = format!(
                        "Job {job_name} does not start: {problem}; it fails at its deadline ({} s after it started) unless that is fixed",
                        facts.mover.deadline_seconds
                    );
                    let events = if new_reason(backup, reasons::JOB_POD_NOT_STARTING) {
                        vec![Note::warning(
                            reasons::JOB_POD_NOT_STARTING,
                            message.clone(),
                        )]
                    } else {
                        Vec::new()
                    };
                    (waiting(reasons::JOB_POD_NOT_STARTING, message), events)
                }
            };
            // A tool past its bound: its Job is stopped, and the Backup fails once it ended.
            if let decide::ToolClock::Overdue(why) = &facts.tool_clock {
                return Plan {
                    status: next_status(
                        backup,
                        status,
                        BackupPhase::Running,
                        &waiting(reasons::RUNNING, format!("stopping Job {job_name}: {why}")),
                        facts.now,
                    ),
                    stop_job: Some(why.clone()),
                    requeue: Some(Duration::from_secs(2)),
                    ..Plan::wait_for_change()
                };
            }
            let mut requeue = if facts.job_pod_problem.is_some() {
                15
            } else {
                60
            };
            match facts.tool_clock {
                decide::ToolClock::Left(seconds) => requeue = requeue.min(seconds + 1),
                decide::ToolClock::Starting => requeue = requeue.min(5),
                decide::ToolClock::Unbounded | decide::ToolClock::Overdue(_) => {}
            }
            let mut status = status;
            let mut events = events;
            let (transfer_report, node) = match &facts.transfer_report {
                Some((mover, node)) => (Some(mover), Some(node.as_str())),
                None => (None, None),
            };
            status.transfer =
                transfer::next(status.transfer.as_ref(), transfer_report, node, facts.now);
            // A copy of a stopped application is placed by the scheduler: its node is known
            // once that node's agent reports its mover (`kubectl get backups` shows it).
            if status.node_name.is_none() {
                status.node_name = node.map(str::to_string);
            }
            let bound = facts.mover.stalled_after;
            let stalled = transfer::stalled(status.transfer.as_ref(), bound, facts.now);
            if let Some(stalled) = &stalled
                && stalled.status == Status::True
                && !is_stalled(backup)
            {
                events.push(Note::warning(types::STALLED, stalled.message.clone()));
            }
            if let Some(wait) = transfer::look_again(status.transfer.as_ref(), bound, facts.now) {
                requeue = requeue.min(wait.as_secs().max(1));
            }
            let wanted: Vec<Desired> = std::iter::once(ready).chain(stalled).collect();
            Plan {
                status: next_status_with(backup, status, BackupPhase::Running, &wanted, facts.now),
                events,
                requeue: Some(Duration::from_secs(requeue)),
                ..Plan::wait_for_change()
            }
        }
        JobFact::Owned(state) => {
            // Hooks: the post hook runs once the copy ended, before the Backup concludes.
            let mut post_failure = None;
            if status.consistency == Some(Capture::Hooks)
                && let Some(spec) = consistency::chosen(
                    backup.spec.consistency.as_ref(),
                    cluster.spec.consistency.as_ref(),
                )
                .and_then(|chosen| chosen.hooks.as_ref())
            {
                match (hooks::after(spec, status.hooks.as_ref()), &spec.post) {
                    (hooks::After::RunPost, Some(post)) => {
                        return run_hook(facts, Plan::wait_for_change(), hooks::Phase::Post, post);
                    }
                    (hooks::After::Done(failure), _) => post_failure = failure,
                    (hooks::After::RunPost, None) => {}
                }
            }
            let outcome = match &backup.spec.command {
                None => finished(status.artifact.as_ref(), &job_name, state, facts).and_then(
                    |artifact| match consistency::started_during(
                        status.consistency,
                        facts.started_during.as_deref(),
                    ) {
                        Some(message) => Err((reasons::APPLICATION_STARTED, message)),
                        None => Ok(artifact),
                    },
                ),
                Some(command) => attributed(facts, state, repository, &command.prefix),
            }
            .and_then(|artifact| match post_failure {
                Some(message) => Err((hooks::POST_HOOK_FAILED, message)),
                None => Ok(artifact),
            });
            let completed = outcome.is_ok();
            let mut status = status;
            if completed {
                status.frozen_millis = frozen_millis(&facts.report);
            }
            let mut plan = conclude(facts, status, outcome);
            plan.lease = LeaseStep::Release;
            if completed {
                let how = format!("copied by Backup {namespace}/{name} ({uid})");
                plan.mark_claims = copied_claims(backup, cluster, &claim)
                    .into_iter()
                    .map(|claim| (claim, how.clone()))
                    .collect();
            }
            plan
        }
        JobFact::Missing => start(facts, cluster, repository, &namespace, &claim, &job_name),
    }
}

/// The claims a completed Backup copied: every template's of the snapshot it recorded, else
/// `claim` alone.
fn copied_claims(backup: &Backup, cluster: &Cluster, claim: &str) -> Vec<String> {
    let recorded = backup
        .status
        .as_ref()
        .and_then(|status| status.artifact.as_ref())
        .and_then(|artifact| artifact.snapshot.as_ref())
        .map(|snapshot| snapshot.volumes.as_slice())
        .unwrap_or_default();
    if recorded.len() > 1 {
        recorded
            .iter()
            .map(|template| decide::claim_name(template, &cluster.spec.stateful_set_ref.name))
            .collect()
    } else {
        vec![claim.to_string()]
    }
}

/// `plan`, then `hook` run as `phase` in the running pod that mounts the claim, and back at
/// once to go on.
fn run_hook(
    facts: &Facts,
    plan: Plan,
    phase: hooks::Phase,
    hook: &custody_kube::api::Hook,
) -> Plan {
    Plan {
        hook: Some(hooks::Run {
            phase,
            hook: hook.clone(),
            pod: hooks::target(
                facts.mounted_on.as_ref(),
                facts
                    .cluster
                    .as_ref()
                    .map(|cluster| cluster.spec.stateful_set_ref.name.as_str()),
            ),
        }),
        requeue: Some(Duration::from_secs(1)),
        ..plan
    }
}

/// A started run that ends here without a copy's outcome: failed with `reason`, the Lease
/// given back.
fn fail_started(
    facts: &Facts,
    status: BackupStatus,
    reason: &'static str,
    message: String,
) -> Plan {
    Plan {
        lease: LeaseStep::Release,
        ..conclude(facts, status, Err((reason, message)))
    }
}

/// The plan when another run holds the Cluster's Lease: wait, naming it.
pub fn cluster_busy(facts: &Facts, holder: &str) -> Plan {
    wait(
        facts,
        holds::CLUSTER_BUSY,
        format!(
            "Cluster {} is claimed by {holder}; the backup starts once it is free",
            facts.backup.spec.cluster_ref.name
        ),
        5,
    )
}

/// The repository a Backup uses: its own reference, else its Cluster's.
pub fn repository_name(backup: &Backup, cluster: &Cluster) -> Option<String> {
    backup
        .spec
        .repository_ref
        .as_ref()
        .or(cluster.spec.repository_ref.as_ref())
        .map(|reference| reference.name.clone())
}

/// The Restores of `cluster` as the hold sees them.
fn restore_runs<'a>(restores: &'a [Restore], cluster: &str) -> Vec<Run<'a>> {
    restores
        .iter()
        .filter(|restore| restore.spec.cluster_ref.name == cluster)
        .map(|restore| Run {
            name: restore.metadata.name.as_deref().unwrap_or_default(),
            started: true,
            terminal: restore.metadata.deletion_timestamp.is_some()
                || matches!(
                    restore.status.as_ref().and_then(|status| status.phase),
                    Some(RestorePhase::Completed | RestorePhase::Failed)
                ),
        })
        .collect()
}

fn waiting(reason: &'static str, message: String) -> Desired {
    Desired {
        type_: types::READY,
        status: Status::False,
        reason,
        message,
    }
}

/// Whether `Ready` does not carry `reason` yet: its Warning is published once.
fn new_reason(backup: &Backup, reason: &str) -> bool {
    !backup
        .conditions()
        .iter()
        .any(|condition| condition.type_ == types::READY && condition.reason == reason)
}

/// Pending with a reason; a Warning Event when the reason is new; look again after `retry`
/// seconds.
fn wait(facts: &Facts, reason: &'static str, message: String, retry: u64) -> Plan {
    let backup = &facts.backup;
    let status = backup.status.clone().unwrap_or_default();
    Plan {
        status: next_status(
            backup,
            status,
            BackupPhase::Pending,
            &waiting(reason, message.clone()),
            facts.now,
        ),
        events: if new_reason(backup, reason) {
            vec![Note::warning(reason, message)]
        } else {
            Vec::new()
        },
        requeue: Some(Duration::from_secs(retry)),
        ..Plan::wait_for_change()
    }
}

/// Waiting for a slot on `node`, where `taken` movers run (`--movers-per-node`): nothing
/// started, looked at again shortly. An ordinary wait, told once as a Normal Event.
pub fn movers_busy(facts: &Facts, node: &str, taken: u32) -> Plan {
    let mut plan = wait(
        facts,
        crate::node_slots::MOVER_SLOTS_BUSY,
        crate::node_slots::busy(node, taken, facts.mover.movers_per_node),
        10,
    );
    for note in &mut plan.events {
        note.warning = false;
    }
    plan
}

/// The status with `phase`, `ready` and the rest of `status`; `None` when nothing changes.
/// Conditions other writers own are theirs: only `Ready` is compared and written.
pub fn next_status(
    backup: &Backup,
    status: BackupStatus,
    phase: BackupPhase,
    ready: &Desired,
    now: Timestamp,
) -> Option<BackupStatus> {
    next_status_with(backup, status, phase, std::slice::from_ref(ready), now)
}

/// Whether the Backup says its copy stalled now.
fn is_stalled(backup: &Backup) -> bool {
    backup
        .conditions()
        .iter()
        .any(|condition| condition.type_ == types::STALLED && condition.status == "True")
}

/// As [`next_status`], with the conditions `also` (`Ready` first) beside `Ready`.
pub fn next_status_with(
    backup: &Backup,
    mut status: BackupStatus,
    phase: BackupPhase,
    also: &[Desired],
    now: Timestamp,
) -> Option<BackupStatus> {
    let mut current = backup.status.clone().unwrap_or_default();
    // How consistent the copy is, once there is one.
    let wanted: Vec<Desired> = also
        .iter()
        .cloned()
        .chain(
            status
                .consistency
                .filter(|_| phase == BackupPhase::Completed)
                .map(consistency::condition),
        )
        .collect();
    status.phase = Some(phase);
    status.conditions =
        conditions::wanted(&current.conditions, &wanted, backup.meta().generation, now);
    current.conditions = conditions::owned(&current.conditions, &wanted);
    (current != status).then_some(status)
}

mod finish;
mod start;

#[cfg(test)]
mod tests;
