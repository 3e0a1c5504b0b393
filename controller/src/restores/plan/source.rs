//! The first stage of a Restore's plan: the source (the Backup, its artifact and repository)
//! and the target (the StatefulSet's claims, each with the Backup's volume it is written
//! from), or why the Restore waits or fails before any volume.

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::super::decide;
use super::super::reasons;
use super::waits::{Stop, stop};
use super::{Facts, Plan};
use crate::holds::{self, Hold, Run};
use custody_kube::api::{Artifact, Backup, BackupPhase, BackupRepository, Cluster};

/// What a Restore reads and writes.
pub(super) struct Source<'a> {
    pub backup: &'a Backup,
    pub artifact: Artifact,
    pub repository: &'a BackupRepository,
    /// The Backup's volumes and each one's manifest hash.
    pub hashes: Vec<(String, Option<String>)>,
    /// Every claim written, pod by pod, each pod's volumes in the Cluster's order.
    pub claims: Vec<String>,
    /// The Backup's volume each claim is written from.
    pub volume_of_claim: BTreeMap<String, String>,
}

/// The source and the target of the Restore, or the plan of one that waits or fails before
/// any volume; `started` when a volume got a Job already (a started restore goes on).
pub(super) fn source<'a>(
    facts: &'a Facts,
    cluster: &Cluster,
    started: bool,
) -> Result<Source<'a>, Box<Plan>> {
    let restore = &facts.restore;
    let cluster_name = &restore.spec.cluster_ref.name;
    // The source.
    let backup_name = &restore.spec.backup_ref.name;
    let Some(backup) = &facts.backup else {
        // Read from the API server: a Backup that is gone is refused, never waited for.
        return Err(Box::new(stop(
            facts,
            Stop::Fail,
            reasons::BACKUP_NOT_FOUND,
            format!("Backup {backup_name} does not exist in this namespace (or was deleted)"),
            0,
        )));
    };
    // A restore that has started goes on: the Backup's deletion waits for it. One that has not
    // started never begins reading a Backup on its way out.
    if backup.metadata.deletion_timestamp.is_some() && !started {
        return Err(Box::new(stop(
            facts,
            Stop::Fail,
            reasons::BACKUP_BEING_DELETED,
            format!(
                "Backup {backup_name} is being deleted; a restore never reads a Backup on its way out"
            ),
            0,
        )));
    }
    let artifact = match source_artifact(backup) {
        Ok(artifact) => artifact,
        Err((how, message)) => {
            return Err(Box::new(stop(
                facts,
                how,
                reasons::BACKUP_NOT_COMPLETED,
                message,
                15,
            )));
        }
    };
    let Some(repository) = &facts.repository else {
        return Err(Box::new(stop(
            facts,
            Stop::Wait,
            reasons::REPOSITORY_NOT_FOUND,
            format!(
                "BackupRepository {} holding Backup {backup_name} does not exist in this namespace",
                artifact.repository
            ),
            30,
        )));
    };

    // The target.
    let set_name = &cluster.spec.stateful_set_ref.name;
    let Some(replicas) = facts.replicas else {
        // Usual while the user's manifests are applied one after another.
        return Err(Box::new(stop(
            facts,
            Stop::WaitQuietly,
            reasons::STATEFUL_SET_NOT_FOUND,
            format!("StatefulSet {set_name} of Cluster {cluster_name} does not exist yet"),
            10,
        )));
    };
    let templates = &cluster.spec.volume_claim_templates;
    let hashes = artifact.volume_hashes(templates.first().map(String::as_str).unwrap_or_default());
    let backup_volumes: Vec<String> = hashes.iter().map(|(name, _)| name.clone()).collect();
    // Pod by pod, each pod's volumes in the Cluster's order.
    let claimed = match decide::layout(templates, &backup_volumes)
        .and_then(|layout| decide::claims(&layout, set_name, replicas))
    {
        Ok(claimed) => claimed,
        Err(refusal) => {
            return Err(Box::new(stop(
                facts,
                Stop::Fail,
                refusal.reason,
                refusal.message,
                0,
            )));
        }
    };
    if let Some((volume, _)) = hashes.iter().find(|(_, hash)| hash.is_none()) {
        return Err(Box::new(stop(
            facts,
            Stop::Fail,
            reasons::BACKUP_NOT_COMPLETED,
            format!(
                "Backup {backup_name} records no manifest for its volume {volume} (completed by a controller whose CRDs drop status.artifact.snapshot.volumeManifests: apply deploy/crds and back up again)"
            ),
            0,
        )));
    }
    let claims: Vec<String> = claimed.iter().map(|(claim, _)| claim.clone()).collect();
    let volume_of_claim: BTreeMap<String, String> = claimed.into_iter().collect();

    if !started
        && let Hold::Wait { reason, message } =
            holds::restore_hold(cluster_name, &backup_runs(&facts.backups, cluster_name))
    {
        // Not started: a running backup of the Cluster finishes first.
        return Err(Box::new(Plan {
            publish_gate_ca: true,
            ..stop(facts, Stop::Wait, reason, message, 5)
        }));
    }
    Ok(Source {
        backup,
        artifact,
        repository,
        hashes,
        claims,
        volume_of_claim,
    })
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
