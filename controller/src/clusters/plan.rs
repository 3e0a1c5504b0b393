//! What one reconciliation of a Cluster does, decided from what it read: [`plan`] takes the
//! [`Facts`] and returns a [`Plan`] (the finalizer, the Restore to create or delete, the
//! status, the Events, when to look again). No API client here.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::decide::{self, FINALIZER, RestoreFacts, Teardown, Workload};
use super::restore_name;
use crate::conditions;
use crate::events::Note;
use custody_kube::api::{
    Cluster, ClusterPhase, ClusterStatus, HasConditions, LocalObjectReference, Restore, RestoreSpec,
};

/// Everything a reconciliation of a Cluster read.
#[derive(Clone, Debug)]
pub struct Facts {
    pub cluster: Cluster,
    pub now: Timestamp,
    /// The Restore of the Cluster's name, if there is one.
    pub restore: Option<Restore>,
    pub workload: Workload,
}

/// What one reconciliation does, in this order: add the finalizer (and nothing else), create
/// the Restore (its Event only when this call created it), delete the Restore (UID
/// precondition), remove the finalizer, write the status, publish the Events, look again.
#[derive(Clone, Debug)]
pub struct Plan {
    pub add_finalizer: bool,
    /// The Restore to create, and the Event that says so.
    pub create_restore: Option<(Restore, Note)>,
    /// The UID of the Restore to delete.
    pub delete_restore: Option<String>,
    pub remove_finalizer: bool,
    pub status: Option<ClusterStatus>,
    pub events: Vec<Note>,
    pub requeue: Option<Duration>,
}

impl Plan {
    fn after(requeue: Option<Duration>) -> Plan {
        Plan {
            add_finalizer: false,
            create_restore: None,
            delete_restore: None,
            remove_finalizer: false,
            status: None,
            events: Vec::new(),
            requeue,
        }
    }
}

/// The plan of one reconciliation.
pub fn plan(facts: &Facts) -> Plan {
    let cluster = &facts.cluster;
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let restore_name = restore_name(cluster);
    let owned =
        |restore: &Restore| crate::ownership::controlled_by(&restore.metadata, "Cluster", &uid);
    if cluster.metadata.deletion_timestamp.is_some() {
        return teardown(facts, &restore_name, owned);
    }
    if let Some(spec) = &cluster.spec.restore {
        if !cluster.finalizers().iter().any(|name| name == FINALIZER) {
            // Before anything else: the restore is always cancelled on deletion.
            return Plan {
                add_finalizer: true,
                ..Plan::after(None)
            };
        }
        if facts.restore.is_none() {
            let mut restore = Restore::new(
                &restore_name,
                RestoreSpec {
                    cluster_ref: LocalObjectReference {
                        name: cluster.name_any(),
                    },
                    backup_ref: spec.backup_ref.clone(),
                    volume_restore_policy: spec.volume_restore_policy,
                    progress_deadline_seconds: spec.progress_deadline_seconds,
                },
            );
            restore.metadata.owner_references =
                crate::ownership::controller_reference(cluster).map(|owner| vec![owner]);
            restore.metadata.labels = Some(crate::ownership::labels(&[(
                crate::backups::decide::LABEL_CLUSTER_UID,
                &uid,
            )]));
            let note = Note::normal(
                decide::reasons::RESTORE_CREATED,
                format!(
                    "Restore {restore_name} restores Backup {} into this Cluster",
                    spec.backup_ref.name
                ),
            );
            return Plan {
                create_restore: Some((restore, note)),
                ..view(facts, &restore_name, owned)
            };
        }
    }
    view(facts, &restore_name, owned)
}

/// A deleted Cluster cancels its restore (see [`decide::teardown`]).
fn teardown(facts: &Facts, restore_name: &str, owned: impl Fn(&Restore) -> bool) -> Plan {
    let cluster = &facts.cluster;
    let has_finalizer = cluster.finalizers().iter().any(|name| name == FINALIZER);
    let restore = facts.restore.as_ref();
    let step = decide::teardown(
        has_finalizer,
        restore.map(|restore| {
            (
                owned(restore),
                restore.metadata.deletion_timestamp.is_some(),
            )
        }),
    );
    let again = Some(Duration::from_secs(2));
    match step {
        Teardown::Nothing => Plan::after(None),
        Teardown::DeleteRestore => Plan {
            delete_restore: restore.and_then(|restore| restore.metadata.uid.clone()),
            events: vec![Note::normal(
                "RestoreCancelled",
                format!("Cluster deleted: Restore {restore_name} is cancelled and torn down"),
            )],
            ..Plan::after(again)
        },
        Teardown::WaitForRestore => Plan::after(again),
        Teardown::RemoveFinalizer => Plan {
            remove_finalizer: true,
            ..Plan::after(None)
        },
    }
}

/// What the Cluster shows: its phase and conditions from its Restore and its workload, with
/// an Event when the phase becomes Failed or (under restore) Running.
fn view(facts: &Facts, restore_name: &str, owned: impl Fn(&Restore) -> bool) -> Plan {
    let cluster = &facts.cluster;
    let restore = facts.restore.as_ref().map(|restore| RestoreFacts {
        owned: owned(restore),
        phase: restore.status.as_ref().and_then(|status| status.phase),
        progress: restore
            .status
            .as_ref()
            .and_then(|status| status.progress.clone()),
        failure: restore
            .conditions()
            .iter()
            .find(|condition| condition.type_ == decide::READY)
            .map(|condition| format!("{}: {}", condition.reason, condition.message)),
    });
    let view = decide::view(
        cluster
            .spec
            .restore
            .as_ref()
            .map(|spec| spec.backup_ref.name.as_str()),
        restore_name,
        restore.as_ref(),
        facts.workload,
        &cluster.spec.stateful_set_ref.name,
    );
    let current = cluster.status.clone().unwrap_or_default();
    let mut wanted = vec![view.ready.clone()];
    wanted.extend(view.restored.clone());
    let status = ClusterStatus {
        phase: Some(view.phase),
        restore_name: cluster
            .spec
            .restore
            .as_ref()
            .map(|_| restore_name.to_string()),
        conditions: conditions::wanted(
            &current.conditions,
            &wanted,
            cluster.meta().generation,
            facts.now,
        ),
    };
    let mut compare = current.clone();
    compare.conditions = conditions::owned(&current.conditions, &wanted);
    let changed = compare != status;
    let mut events = Vec::new();
    if changed && current.phase != Some(view.phase) {
        match view.phase {
            ClusterPhase::Failed => {
                events.push(Note::warning(view.ready.reason, view.ready.message.clone()));
            }
            ClusterPhase::Running if cluster.spec.restore.is_some() => {
                events.push(Note::normal(
                    "Running",
                    format!("restored, verified and ready: {}", view.ready.message),
                ));
            }
            _ => {}
        }
    }
    Plan {
        status: changed.then_some(status),
        events,
        ..Plan::after(Some(Duration::from_secs(match view.phase {
            ClusterPhase::Running | ClusterPhase::Failed => 300,
            _ => 10,
        })))
    }
}

#[cfg(test)]
mod tests;
