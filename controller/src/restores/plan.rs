//! What one reconciliation of a Restore does, decided from what it read: [`plan`] takes the
//! [`Facts`] and returns a [`Plan`] (the status to write, the Jobs to create, the Events, the
//! Lease step, the pods to release, when to look again). No API client here: every path the
//! reconciler can take is a row in the table tests.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::decide::{self, FINALIZER, JobFact, VolumeFacts};
use super::job::{self, JobInputs};
use super::{reasons, types};
use crate::conditions::Status;
use crate::events::Note;
use crate::holds::{self, Hold, LeaseStep, Run};
use custody_kube::api::{
    Artifact, Backup, BackupPhase, BackupRepository, Cluster, ReportedVolume, Restore,
    RestorePhase, RestoreStatus, VolumeRestoreStatus, VolumeState,
};
pub use waits::next_status;
use waits::{Stop, agent_problem, desired, stop};

/// Everything a reconciliation of a Restore read, as plain data.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The Restore as the API server has it now.
    pub restore: Restore,
    pub now: Timestamp,
    /// How Jobs run `custody-mover`.
    pub mover: crate::mover_job::MoverJob,
    /// The Cluster the Restore names, if it exists.
    pub cluster: Option<Cluster>,
    /// Each node's agent reports: `(node, volumes)`.
    pub agents: Vec<(String, Vec<ReportedVolume>)>,
    /// Each node's agent's health, by node (no entry: no agent reports from that node). The
    /// reports of an agent that is not Ready are not trusted for new decisions.
    pub nodes: BTreeMap<String, AgentHealth>,
    /// The StatefulSet's pods by name, and the node each is scheduled to (read while the
    /// restore runs: a volume whose pod is on a node without a working agent says so).
    pub workload_pods: BTreeMap<String, Option<String>>,
    /// Those of the StatefulSet's pods that were not admitted under this Restore (no
    /// `custody-wait` for it): created before the restore was asked for, or never seen by the
    /// restore gate. The restore writes no volume under them.
    pub unheld_pods: Vec<String>,
    /// The Backup the Restore names, if it exists (not read once the Restore is final).
    pub backup: Option<Backup>,
    /// The repository the Backup's artifact is in, if it exists.
    pub repository: Option<BackupRepository>,
    /// The Cluster's StatefulSet: `None` when it does not exist, `Some(replicas)` when it does.
    pub replicas: Option<i32>,
    /// Backups of the namespace (read only while no volume has started: the hold).
    pub backups: Vec<Backup>,
    /// The Jobs the Restore's status names, by name.
    pub jobs: Vec<(String, JobFact)>,
    /// Why a running Job of these has no pod that starts, by Job name (an image that cannot
    /// be pulled, a pod the scheduler cannot place, a pod Pod Security refused to create).
    pub job_problems: BTreeMap<String, String>,
    /// The node each of these Jobs' pods is pinned to, by Job name.
    pub job_nodes: BTreeMap<String, String>,
    /// When each of these Jobs that succeeded finished, by Job name.
    pub job_finished: BTreeMap<String, Timestamp>,
    /// The pods the agents report under this Restore.
    pub pods: Vec<Pod>,
    /// Jobs labelled with the Restore's UID (read once it completed: they are cleaned up).
    pub finished_jobs: Vec<Job>,
    /// Movers running per node, when `--movers-per-node` bounds them.
    pub mover_slots: BTreeMap<String, u32>,
    /// Verified claims not yet marked as holding known data (read once it completed).
    pub unmarked_claims: Vec<String>,
}

/// What a reconciliation knows of one node's agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentHealth {
    pub ready: bool,
    /// When it last reported.
    pub last_heartbeat: Option<Timestamp>,
}

/// What one reconciliation does, in this order: add the finalizer (and nothing else), publish
/// the gate's CA, take the Lease, create the Jobs, write the status, release the Lease,
/// publish the Events, set the pods' readiness gates, look again.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Add this reconciler's finalizer; nothing else happens before it is on.
    pub add_finalizer: bool,
    /// Publish the gate's CA into the namespace for `custody-wait`.
    pub publish_gate_ca: bool,
    pub lease: LeaseStep,
    /// prepareData Jobs to create.
    pub jobs: Vec<Job>,
    /// This Restore's own Jobs to delete, `(name, UID)`: a completed Restore's volumes are
    /// recorded as verified in its status, so their prepareData Jobs are no longer needed.
    pub delete_jobs: Vec<(String, String)>,
    /// Claims to mark as holding known data and as verified by this Restore, `(claim, how
    /// custody knows)`.
    pub mark_claims: Vec<(String, String)>,
    /// The status to write; `None` when it would not change.
    pub status: Option<RestoreStatus>,
    pub events: Vec<Note>,
    /// Pods whose readiness gate to set (every restored volume of theirs verified).
    pub release: BTreeSet<String>,
    /// When to reconcile again without a change; `None` waits for one.
    pub requeue: Option<Duration>,
}

impl Plan {
    fn wait_for_change() -> Plan {
        Plan {
            add_finalizer: false,
            publish_gate_ca: false,
            lease: LeaseStep::Keep,
            jobs: Vec::new(),
            delete_jobs: Vec::new(),
            mark_claims: Vec::new(),
            status: None,
            events: Vec::new(),
            release: BTreeSet::new(),
            requeue: None,
        }
    }

    fn after(seconds: u64) -> Plan {
        Plan {
            requeue: Some(Duration::from_secs(seconds)),
            ..Plan::wait_for_change()
        }
    }
}

/// The plan of one reconciliation (the Restore is not being deleted: see
/// [`decide::teardown`]).
pub fn plan(facts: &Facts) -> Plan {
    let restore = &facts.restore;
    if !restore.finalizers().iter().any(|name| name == FINALIZER) {
        return Plan {
            add_finalizer: true,
            ..Plan::wait_for_change()
        };
    }
    let namespace = restore.namespace().unwrap_or_default();
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    let phase = restore.status.as_ref().and_then(|status| status.phase);
    let cluster_name = &restore.spec.cluster_ref.name;

    let Some(cluster) = &facts.cluster else {
        // A final Restore stays final: its Cluster going away changes nothing.
        if matches!(phase, Some(RestorePhase::Completed | RestorePhase::Failed)) {
            return Plan::wait_for_change();
        }
        return stop(
            facts,
            Stop::Wait,
            reasons::CLUSTER_NOT_FOUND,
            format!("Cluster {cluster_name} does not exist in this namespace"),
            15,
        );
    };
    let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
    // A Restore created by a Cluster writes only that Cluster (not a later one of the same name).
    let owner = restore
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true) && owner.kind == "Cluster");
    if let Some(owner) = owner
        && owner.uid != cluster_uid
    {
        return stop(
            facts,
            Stop::Fail,
            reasons::CLUSTER_MISMATCH,
            format!(
                "this Restore belongs to Cluster {} with UID {}, but Cluster {cluster_name} now has UID {cluster_uid}",
                owner.name, owner.uid
            ),
            0,
        );
    }

    let volumes_status = restore
        .status
        .as_ref()
        .map(|status| status.volumes.as_slice())
        .unwrap_or_default();
    // A report counts when its agent is Ready and speaks of a pod bound to its own node.
    let trusted = |node: &str| facts.nodes.get(node).is_none_or(|health| health.ready);
    let accepted: Vec<(&str, Vec<ReportedVolume>)> = facts
        .agents
        .iter()
        .filter(|(node, _)| trusted(node))
        .map(|(node, volumes)| {
            let vouched = volumes
                .iter()
                .filter(|volume| decide::speaks_for(node, volume, &facts.pods))
                .cloned()
                .collect();
            (node.as_str(), vouched)
        })
        .collect();
    let agents = || {
        accepted
            .iter()
            .map(|(node, volumes)| (*node, volumes.as_slice()))
    };
    if matches!(phase, Some(RestorePhase::Completed | RestorePhase::Failed)) {
        // Final. Pods of a completed restore whose volumes the agents still report verified
        // keep (or get) their readiness gate.
        let claims: Vec<String> = volumes_status
            .iter()
            .map(|volume| volume.claim_name.clone())
            .collect();
        let reports = decide::reports_for(agents(), &namespace, &uid, &claims);
        let delete_jobs = if phase == Some(RestorePhase::Completed) {
            decide::teardown(&facts.finished_jobs, &[], &uid)
                .delete
                .into_iter()
                .filter_map(|name| {
                    let job = facts
                        .finished_jobs
                        .iter()
                        .find(|job| job.name_any() == name)?;
                    Some((name, job.metadata.uid.clone()?))
                })
                .collect()
        } else {
            // A failed Restore keeps its Jobs (and their pods' logs) until it is deleted.
            Vec::new()
        };
        let how = verified_by(restore);
        return Plan {
            lease: LeaseStep::Release,
            delete_jobs,
            mark_claims: facts
                .unmarked_claims
                .iter()
                .map(|claim| (claim.clone(), how.clone()))
                .collect(),
            release: ungated(&facts.pods, &decide::releasable_pods(&reports, &claims)),
            ..Plan::after(60)
        };
    }

    // The source.
    let backup_name = &restore.spec.backup_ref.name;
    let Some(backup) = &facts.backup else {
        // Read from the API server: a Backup that is gone is refused, never waited for.
        return stop(
            facts,
            Stop::Fail,
            reasons::BACKUP_NOT_FOUND,
            format!("Backup {backup_name} does not exist in this namespace (or was deleted)"),
            0,
        );
    };
    // A restore that has started goes on: the Backup's deletion waits for it. One that has not
    // started never begins reading a Backup on its way out.
    let started = volumes_status.iter().any(|volume| volume.attempts > 0);
    if backup.metadata.deletion_timestamp.is_some() && !started {
        return stop(
            facts,
            Stop::Fail,
            reasons::BACKUP_BEING_DELETED,
            format!(
                "Backup {backup_name} is being deleted; a restore never reads a Backup on its way out"
            ),
            0,
        );
    }
    let artifact = match source_artifact(backup) {
        Ok(artifact) => artifact,
        Err((how, message)) => {
            return stop(facts, how, reasons::BACKUP_NOT_COMPLETED, message, 15);
        }
    };
    let Some(repository) = &facts.repository else {
        return stop(
            facts,
            Stop::Wait,
            reasons::REPOSITORY_NOT_FOUND,
            format!(
                "BackupRepository {} holding Backup {backup_name} does not exist in this namespace",
                artifact.repository
            ),
            30,
        );
    };

    // The target.
    let set_name = &cluster.spec.stateful_set_ref.name;
    let Some(replicas) = facts.replicas else {
        // Usual while the user's manifests are applied one after another.
        return stop(
            facts,
            Stop::WaitQuietly,
            reasons::STATEFUL_SET_NOT_FOUND,
            format!("StatefulSet {set_name} of Cluster {cluster_name} does not exist yet"),
            10,
        );
    };
    let templates = &cluster.spec.volume_claim_templates;
    let hashes = artifact.volume_hashes(templates.first().map(String::as_str).unwrap_or_default());
    let backup_volumes: Vec<String> = hashes.iter().map(|(name, _)| name.clone()).collect();
    // Pod by pod, each pod's volumes in the Cluster's order.
    let claimed = match decide::layout(templates, &backup_volumes)
        .and_then(|layout| decide::claims(&layout, set_name, replicas))
    {
        Ok(claimed) => claimed,
        Err(refusal) => return stop(facts, Stop::Fail, refusal.reason, refusal.message, 0),
    };
    if let Some((volume, _)) = hashes.iter().find(|(_, hash)| hash.is_none()) {
        return stop(
            facts,
            Stop::Fail,
            reasons::BACKUP_NOT_COMPLETED,
            format!(
                "Backup {backup_name} records no manifest for its volume {volume} (completed by a controller whose CRDs drop status.artifact.snapshot.volumeManifests: apply deploy/crds and back up again)"
            ),
            0,
        );
    }
    let claims: Vec<String> = claimed.iter().map(|(claim, _)| claim.clone()).collect();
    let volume_of_claim: BTreeMap<String, String> = claimed.into_iter().collect();

    if !started
        && let Hold::Wait { reason, message } =
            holds::restore_hold(cluster_name, &backup_runs(&facts.backups, cluster_name))
    {
        // Not started: a running backup of the Cluster finishes first.
        return Plan {
            publish_gate_ca: true,
            ..stop(facts, Stop::Wait, reason, message, 5)
        };
    }

    let reports = decide::reports_for(agents(), &namespace, &uid, &claims);
    // After a wait before the volumes (for the Repository, the StatefulSet, a backup), their
    // recorded times are as old as that wait: the progress deadline counts from now again.
    let resumed = !restore
        .status
        .iter()
        .flat_map(|status| status.conditions.iter())
        .any(|condition| {
            condition.type_ == types::READY
                && [
                    reasons::WAITING_FOR_PODS,
                    reasons::RESTORING,
                    reasons::AGENT_MISSING,
                    reasons::AGENT_NOT_READY,
                    reasons::JOB_POD_NOT_STARTING,
                    reasons::POD_NOT_HELD,
                    crate::node_slots::MOVER_SLOTS_BUSY,
                ]
                .contains(&condition.reason.as_str())
        });
    let mut steps: Vec<decide::VolumeStep> = Vec::with_capacity(claims.len());
    let mut slots = facts.mover_slots.clone();
    for claim in &claims {
        let previous = volumes_status
            .iter()
            .find(|volume| &volume.claim_name == claim);
        let job = previous
            .and_then(|volume| volume.job_name.as_ref())
            .and_then(|name| facts.jobs.iter().find(|(job, _)| job == name))
            .map(|(_, fact)| fact.clone())
            .unwrap_or(JobFact::Missing);
        let reported = reports.get(claim).copied();
        let volume = VolumeFacts {
            claim,
            previous,
            reported,
            job,
            job_problem: previous
                .and_then(|volume| volume.job_name.as_ref())
                .and_then(|name| facts.job_problems.get(name))
                .map(String::as_str),
            job_node: previous
                .and_then(|volume| volume.job_name.as_ref())
                .and_then(|name| facts.job_nodes.get(name))
                .map(String::as_str),
            job_finished: previous
                .and_then(|volume| volume.job_name.as_ref())
                .and_then(|name| facts.job_finished.get(name))
                .copied(),
            reported_at: reported
                .and_then(|(_, node)| facts.nodes.get(node))
                .and_then(|health| health.last_heartbeat),
            may_start: decide::may_start(restore.spec.volume_restore_policy, &steps),
        };
        let mut step = decide::volume(&volume, &uid);
        if let Some((reason, message)) = agent_problem(facts, set_name, claim, previous) {
            // No trusted report: nothing new is decided, and the volume says why it waits.
            step = decide::VolumeStep {
                status: VolumeRestoreStatus {
                    reason: Some(reason.to_string()),
                    message: Some(message),
                    ..previous.cloned().unwrap_or(step.status)
                },
                create: None,
                recreated: false,
                moved_from: None,
                pod_gone: false,
            };
        }
        // A Job takes a slot on its node: past the bound, the volume waits for one.
        if let Some(create) = &step.create {
            let taken = slots.entry(create.node.clone()).or_insert(0);
            if crate::node_slots::free(*taken, facts.mover.movers_per_node) {
                *taken += 1;
            } else {
                step = decide::wait_for_slot(
                    previous,
                    claim,
                    &create.node,
                    *taken,
                    facts.mover.movers_per_node,
                );
            }
        }
        steps.push(decide::since(
            step,
            previous.filter(|_| !resumed),
            facts.now,
        ));
    }
    decide::past_deadline(
        &mut steps,
        facts.now,
        i64::from(
            restore
                .spec
                .progress_deadline_seconds
                .unwrap_or(custody_kube::api::DEFAULT_PROGRESS_DEADLINE_SECONDS),
        ),
    );

    let mut events = Vec::new();
    let mut jobs = Vec::new();
    let writer_uid = backup.writer_uid();
    for step in &steps {
        let Some(create) = &step.create else {
            continue;
        };
        let volume = volume_of_claim
            .get(&create.claim)
            .cloned()
            .unwrap_or_default();
        let manifest_hash = hashes
            .iter()
            .find(|(name, _)| name == &volume)
            .and_then(|(_, hash)| hash.clone())
            .unwrap_or_default();
        jobs.push(job::spec(&JobInputs {
            restore,
            cluster_uid: &cluster_uid,
            create,
            artifact: &artifact,
            volume: &volume,
            manifest_hash: &manifest_hash,
            backup_uid: &writer_uid,
            repository,
            mover: &facts.mover,
        }));
        events.push(if let Some(wrote) = &step.moved_from {
            Note::normal(
                decide::POD_MOVED,
                format!(
                    "the pod of claim {} moved from node {wrote}, where its volume was written, to node {}; Job {} checks it there (attempt {} of {})",
                    create.claim,
                    create.node,
                    create.name,
                    create.attempt,
                    decide::MAX_ATTEMPTS
                ),
            )
        } else if step.pod_gone {
            Note::warning(
                decide::PREPARE_DATA_POD_GONE,
                format!(
                    "the prepareData pod of claim {} was deleted before the agent on node {} verified its output; Job {} checks it again (attempt {} of {})",
                    create.claim,
                    create.node,
                    create.name,
                    create.attempt,
                    decide::MAX_ATTEMPTS
                ),
            )
        } else if step.recreated {
            Note::warning(
                "JobRecreated",
                format!(
                    "a prepareData Job of claim {} disappeared before its volume was verified; created {} (attempt {} of {})",
                    create.claim,
                    create.name,
                    create.attempt,
                    decide::MAX_ATTEMPTS
                ),
            )
        } else {
            Note::normal(
                "RestoreStarted",
                format!(
                    "Job {} writes claim {} on node {} from {}",
                    create.name,
                    create.claim,
                    create.node,
                    if artifact.key.is_empty() {
                        format!(
                            "volume {} of Backup {backup_name}",
                            volume_of_claim
                                .get(&create.claim)
                                .map(String::as_str)
                                .unwrap_or_default()
                        )
                    } else {
                        artifact.key.clone()
                    }
                ),
            )
        });
    }

    let volumes: Vec<VolumeRestoreStatus> = steps.into_iter().map(|step| step.status).collect();
    for volume in volumes.iter().filter(|volume| {
        volume.state == VolumeState::Verified
            && !volumes_status.iter().any(|old| {
                old.claim_name == volume.claim_name && old.state == VolumeState::Verified
            })
    }) {
        events.push(Note::normal(
            "VolumeVerified",
            format!(
                "claim {} verified on node {}: {}",
                volume.claim_name,
                volume.node_name.clone().unwrap_or_default(),
                volume.message.clone().unwrap_or_default()
            ),
        ));
    }

    let summary = decide::summary(&volumes);
    let mut status = restore.status.clone().unwrap_or_default();
    status.volumes = volumes;
    status.phase = Some(summary.phase);
    status.progress = Some(summary.progress.clone());
    if summary.phase != RestorePhase::Pending {
        status.start_time.get_or_insert(Time(facts.now));
    }
    // The first volume that waits for a node's agent, or for a Job's pod that does not start,
    // decides what the Restore says.
    let unheld = (!facts.unheld_pods.is_empty()).then(|| {
        (
            reasons::POD_NOT_HELD,
            format!(
                "pod {} of the StatefulSet runs without custody-wait for this Restore (created before the restore was asked for, or not seen by the restore gate): the restore writes no volume under a running application; delete the pod and the StatefulSet creates it again, held until its volumes are verified",
                facts.unheld_pods.join(", ")
            ),
        )
    });
    let agent_wait: Option<(&'static str, String)> = unheld.or_else(|| {
        status.volumes.iter().find_map(|volume| {
            let reason = [
                reasons::AGENT_MISSING,
                reasons::AGENT_NOT_READY,
                reasons::JOB_POD_NOT_STARTING,
                crate::node_slots::MOVER_SLOTS_BUSY,
            ]
            .into_iter()
            .find(|reason| volume.reason.as_deref() == Some(reason))?;
            Some((reason, volume.message.clone().unwrap_or_default()))
        })
    });
    let (ready, verified) = match (&summary.phase, &summary.failure) {
        (RestorePhase::Failed, Some((reason, message))) => {
            status.completion_time.get_or_insert(Time(facts.now));
            let reason = decide::condition_reason(reason);
            events.push(Note::warning(reason, message.clone()));
            (
                desired(types::READY, Status::False, reason, message.clone()),
                desired(types::VERIFIED, Status::False, reason, message.clone()),
            )
        }
        (RestorePhase::Completed, _) => {
            status.completion_time.get_or_insert(Time(facts.now));
            let message = format!("every volume verified ({})", summary.progress);
            events.push(Note::normal(reasons::COMPLETED, message.clone()));
            (
                desired(
                    types::READY,
                    Status::True,
                    reasons::COMPLETED,
                    message.clone(),
                ),
                desired(
                    types::VERIFIED,
                    Status::True,
                    reasons::ALL_VERIFIED,
                    message,
                ),
            )
        }
        _ if agent_wait.is_some() => {
            let (reason, message) = agent_wait.clone().expect("checked");
            if !restore
                .status
                .iter()
                .flat_map(|status| status.conditions.iter())
                .any(|condition| condition.type_ == types::READY && condition.reason == reason)
            {
                // Waiting for a mover's slot is the bound doing its work, not a problem.
                events.push(if reason == crate::node_slots::MOVER_SLOTS_BUSY {
                    Note::normal(reason, message.clone())
                } else {
                    Note::warning(reason, message.clone())
                });
            }
            (
                desired(types::READY, Status::False, reason, message.clone()),
                desired(types::VERIFIED, Status::Unknown, reason, message),
            )
        }
        (RestorePhase::Pending, _) => {
            let message = format!(
                "waiting for the pods of StatefulSet {set_name} to be scheduled and their volumes reported ({})",
                summary.progress
            );
            (
                desired(
                    types::READY,
                    Status::False,
                    reasons::WAITING_FOR_PODS,
                    message.clone(),
                ),
                desired(
                    types::VERIFIED,
                    Status::Unknown,
                    reasons::WAITING_FOR_PODS,
                    message,
                ),
            )
        }
        _ => {
            let message = format!("restoring from Backup {backup_name}: {}", summary.progress);
            (
                desired(
                    types::READY,
                    Status::False,
                    reasons::RESTORING,
                    message.clone(),
                ),
                desired(
                    types::VERIFIED,
                    Status::Unknown,
                    reasons::VERIFYING,
                    message,
                ),
            )
        }
    };
    let over = matches!(
        summary.phase,
        RestorePhase::Failed | RestorePhase::Completed
    );
    Plan {
        add_finalizer: false,
        publish_gate_ca: true,
        delete_jobs: Vec::new(),
        mark_claims: Vec::new(),
        lease: if !jobs.is_empty() {
            LeaseStep::TakeFirst
        } else if over {
            LeaseStep::Release
        } else {
            LeaseStep::Keep
        },
        jobs,
        status: next_status(restore, status, &[ready, verified], facts.now),
        events,
        release: ungated(&facts.pods, &decide::releasable_pods(&reports, &claims)),
        requeue: Some(Duration::from_secs(if over { 60 } else { 5 })),
    }
}

/// The known-data mark's value on a claim `restore` verified.
pub fn verified_by(restore: &Restore) -> String {
    format!(
        "verified by Restore {}/{} ({})",
        restore.namespace().unwrap_or_default(),
        restore.name_any(),
        restore.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// The plan when another run holds the Cluster's Lease: wait, naming it.
pub fn cluster_busy(facts: &Facts, holder: &str) -> Plan {
    Plan {
        publish_gate_ca: true,
        ..stop(
            facts,
            Stop::Wait,
            holds::CLUSTER_BUSY,
            format!(
                "Cluster {} is claimed by {holder}; the restore starts once it is free",
                facts.restore.spec.cluster_ref.name
            ),
            5,
        )
    }
}

/// The Backup's artifact, if the Backup can be restored: `Err` says whether to wait (not
/// complete yet) or fail (failed, or made by a command, which leaves no manifest).
fn source_artifact(backup: &Backup) -> Result<Artifact, (Stop, String)> {
    let name = backup.name_any();
    let status = backup.status.clone().unwrap_or_default();
    match (status.phase, status.artifact) {
        (Some(BackupPhase::Completed), Some(artifact)) if artifact.manifest_hash.is_some() => {
            Ok(artifact)
        }
        (Some(BackupPhase::Completed), _) if backup.spec.command.is_some() => Err((
            Stop::Fail,
            format!(
                "Backup {name} was taken by a command of its own: it has no manifest to restore and verify against"
            ),
        )),
        (Some(BackupPhase::Failed), _) => Err((
            Stop::Fail,
            format!("Backup {name} failed; there is nothing to restore"),
        )),
        _ => Err((Stop::Wait, format!("Backup {name} has not completed yet"))),
    }
}

/// The Backups of `cluster` as the hold sees them.
fn backup_runs<'a>(backups: &'a [Backup], cluster: &str) -> Vec<Run<'a>> {
    backups
        .iter()
        .filter(|backup| backup.spec.cluster_ref.name == cluster)
        .map(|backup| {
            let phase = backup.status.as_ref().and_then(|status| status.phase);
            Run {
                name: backup.metadata.name.as_deref().unwrap_or_default(),
                started: phase == Some(BackupPhase::Running),
                terminal: backup.metadata.deletion_timestamp.is_some()
                    || matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed)),
            }
        })
        .collect()
}

/// Of the `releasable` pods, those that exist and whose readiness gate is not set yet.
fn ungated(pods: &[Pod], releasable: &BTreeSet<String>) -> BTreeSet<String> {
    pods.iter()
        .filter(|pod| releasable.contains(&pod.name_any()))
        .filter(|pod| {
            !pod.status
                .iter()
                .flat_map(|status| status.conditions.iter().flatten())
                .any(|condition| {
                    condition.type_ == crate::inject::READINESS_GATE && condition.status == "True"
                })
        })
        .map(|pod| pod.name_any())
        .collect()
}

mod waits;

#[cfg(test)]
mod tests;
