//! The middle stage of a Restore's plan: where each volume stands next (from the agents'
//! reports, the Restore's own Jobs and the node's mover slots), and the prepareData Jobs to
//! create with the Events that announce them.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;

use super::super::decide::{self, JobFact, VolumeFacts};
use super::super::job::{self, JobInputs};
use super::Facts;
use super::source::Source;
use super::waits::agent_problem;
use crate::events::Note;
use custody_kube::api::{ReportedVolume, VolumeRestoreStatus};

/// Each claim's next step, in order; `resumed` when the Restore comes back from a wait
/// before its volumes (their recorded times start again from now).
pub(super) fn steps(
    facts: &Facts,
    set_name: &str,
    claims: &[String],
    reports: &BTreeMap<String, (&ReportedVolume, &str)>,
    resumed: bool,
) -> Vec<decide::VolumeStep> {
    let restore = &facts.restore;
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    let volumes_status = restore
        .status
        .as_ref()
        .map(|status| status.volumes.as_slice())
        .unwrap_or_default();
    let mut steps: Vec<decide::VolumeStep> = Vec::with_capacity(claims.len());
    let mut slots = facts.mover_slots.clone();
    for claim in claims {
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
                    (&create.node, step.status.pod_name.as_deref()),
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
    steps
}

/// The prepareData Jobs the steps ask for, and the Event that says each.
pub(super) fn jobs(
    facts: &Facts,
    steps: &[decide::VolumeStep],
    source: &Source<'_>,
    cluster_uid: &str,
) -> (Vec<Job>, Vec<Note>) {
    let restore = &facts.restore;
    let backup_name = &restore.spec.backup_ref.name;
    let Source {
        backup,
        artifact,
        repository,
        hashes,
        volume_of_claim,
        ..
    } = source;
    let mut events = Vec::new();
    let mut jobs = Vec::new();
    let writer_uid = backup.writer_uid();
    for step in steps {
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
            cluster_uid,
            create,
            artifact,
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
    (jobs, events)
}
