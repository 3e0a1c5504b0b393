//! What one reconciliation of a Restore does, decided from what it read: [`plan`] takes the
//! [`Facts`] and returns a [`Plan`] (the status to write, the Jobs to create, the Events, the
//! Lease step, the pods to release, when to look again). No API client here: every path the
//! reconciler can take is a row in the table tests.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::decide::{self, FINALIZER, JobFact};
use super::{reasons, types};
use crate::events::Note;
use crate::holds::{self, LeaseStep};
use custody_kube::api::{
    Backup, BackupRepository, Cluster, ReportedVolume, Restore, RestorePhase, RestoreStatus,
};
pub use waits::next_status;
use waits::{Stop, stop};

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
    /// The progress of each running Job's mover as the agent on its node last reported it,
    /// with that node, by Job name ([`crate::transfer::find`]).
    pub transfer_reports: BTreeMap<String, (custody_kube::api::ReportedMover, String)>,
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

    let started = volumes_status.iter().any(|volume| volume.attempts > 0);
    let source = match source::source(facts, cluster, started) {
        Ok(source) => source,
        Err(plan) => return *plan,
    };
    let set_name = &cluster.spec.stateful_set_ref.name;

    let claims = &source.claims;
    let reports = decide::reports_for(agents(), &namespace, &uid, claims);
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
    let steps = volumes::steps(facts, set_name, claims, &reports, resumed);
    let (jobs, events) = volumes::jobs(facts, &steps, &source, &cluster_uid);

    summary::plan(
        facts,
        steps,
        jobs,
        events,
        &decide::releasable_pods(&reports, claims),
    )
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

mod source;
mod summary;
mod volumes;
mod waits;

#[cfg(test)]
mod tests;
