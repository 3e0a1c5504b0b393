//! The last stage of a Restore's plan: the Events of the volumes verified now, the phase and
//! conditions the volumes add up to (with what the Restore waits for, if anything), the Lease
//! step, the pods to release, and when to look again.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::super::decide;
use super::super::{reasons, types};
use super::waits::{desired, next_status};
use super::{Facts, Plan, ungated};
use crate::conditions::Status;
use crate::events::Note;
use crate::holds::LeaseStep;
use crate::transfer;
use custody_kube::api::{RestorePhase, Transfer, VolumeRestoreStatus, VolumeState};

/// The plan from the volumes' `steps`, the `jobs` to create and the `events` so far; the pods
/// whose volumes are all verified are `releasable`.
pub(super) fn plan(
    facts: &Facts,
    steps: Vec<decide::VolumeStep>,
    jobs: Vec<Job>,
    mut events: Vec<Note>,
    releasable: &BTreeSet<String>,
) -> Plan {
    let restore = &facts.restore;
    let backup_name = &restore.spec.backup_ref.name;
    let set_name = facts
        .cluster
        .as_ref()
        .map(|cluster| cluster.spec.stateful_set_ref.name.clone())
        .unwrap_or_default();
    let volumes_status = restore
        .status
        .as_ref()
        .map(|status| status.volumes.as_slice())
        .unwrap_or_default();
    let mut volumes: Vec<VolumeRestoreStatus> = steps.into_iter().map(|step| step.status).collect();
    for volume in &mut volumes {
        let previous = volumes_status
            .iter()
            .find(|old| old.claim_name == volume.claim_name)
            .and_then(|old| old.transfer.as_ref());
        volume.transfer = volume_transfer(facts, volume, previous);
    }
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
    let bound = facts.mover.stalled_after;
    let stalled = transfer::stalled_of(
        volumes
            .iter()
            .filter(|volume| volume.state == VolumeState::Restoring)
            .filter_map(|volume| volume.transfer.as_ref()),
        bound,
        facts.now,
    );
    if let Some(stalled) = &stalled
        && stalled.status == Status::True
        && !restore
            .status
            .iter()
            .flat_map(|status| status.conditions.iter())
            .any(|condition| condition.type_ == types::STALLED && condition.status == "True")
    {
        events.push(Note::warning(types::STALLED, stalled.message.clone()));
    }
    let mut status = restore.status.clone().unwrap_or_default();
    status.transfer = transfer::total(volumes.iter().filter_map(|volume| volume.transfer.as_ref()));
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
        status: next_status(
            restore,
            status,
            &[ready, verified]
                .into_iter()
                .chain(stalled)
                .collect::<Vec<_>>(),
            facts.now,
        ),
        events,
        release: ungated(&facts.pods, releasable),
        requeue: Some(Duration::from_secs(if over { 60 } else { 5 })),
    }
}

/// How far a volume's prepareData Job has written it: the mover's reports while it writes,
/// everything once written (Verifying or Verified), the last word once Failed.
fn volume_transfer(
    facts: &Facts,
    volume: &VolumeRestoreStatus,
    previous: Option<&Transfer>,
) -> Option<Transfer> {
    match volume.state {
        VolumeState::Pending => None,
        VolumeState::Restoring => {
            let report = volume
                .job_name
                .as_ref()
                .and_then(|job| facts.transfer_reports.get(job));
            transfer::next(
                previous,
                report.map(|(mover, _)| mover),
                report.map(|(_, node)| node.as_str()),
                facts.now,
            )
        }
        VolumeState::Verifying | VolumeState::Verified => transfer::completed(previous, None),
        VolumeState::Failed => previous.cloned(),
    }
}
