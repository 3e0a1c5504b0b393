//! Restore: writes a Backup into a Cluster's volumes with one prepareData Job per volume,
//! pinned to the node where the agent reports the volume mounted, takes each volume's
//! verification from that agent, releases pods whose volumes are all verified, and on
//! deletion tears down only what it created.

pub mod decide;

use custody_proto::mover::Invocation;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::annotation_reconciler::Context;
use crate::backups::decide::{LABEL_CLUSTER_UID, job_state};
use crate::conditions::{self, Desired, Status};
use crate::error::{Error, Result};
use crate::metrics::KindLabels;
use custody_kube::api::{
    Backup, BackupPhase, BackupRepository, Cluster, NodeAgent, Restore, RestorePhase,
    RestoreStatus, VolumeRestoreStatus,
};
use decide::{FINALIZER, JobFact, LABEL_RESTORE_UID, VolumeFacts};

/// Field manager of the Restore's status.
pub const FIELD_MANAGER: &str = "custody.io/restore";
/// Where the mover container sees the volume.
pub const TARGET_PATH: &str = "/data";
/// ConfigMap, in each namespace under restore, holding the gate's CA as `ca.crt`.
pub const GATE_CA_CONFIG_MAP: &str = "custody-gate-ca";

/// Condition types of a Restore.
pub mod types {
    pub use crate::conditions::types::READY;
    pub const VERIFIED: &str = "Verified";
}

/// Reasons of a Restore's conditions and Events.
pub mod reasons {
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    pub const CLUSTER_MISMATCH: &str = "ClusterMismatch";
    pub const BACKUP_NOT_FOUND: &str = "BackupNotFound";
    pub const BACKUP_NOT_COMPLETED: &str = "BackupNotCompleted";
    pub const BACKUP_BEING_DELETED: &str = "BackupBeingDeleted";
    pub const REPOSITORY_NOT_FOUND: &str = "RepositoryNotFound";
    pub const STATEFUL_SET_NOT_FOUND: &str = "StatefulSetNotFound";
    pub const WAITING_FOR_PODS: &str = "WaitingForPods";
    pub const RESTORING: &str = "Restoring";
    pub const COMPLETED: &str = "Completed";
    pub const ALL_VERIFIED: &str = "AllVolumesVerified";
    pub const VERIFYING: &str = "Verifying";
}

/// What the restore reconciler needs besides the shared context.
pub struct RestoreContext {
    pub base: Arc<Context>,
    /// Image of `custody-mover`.
    pub mover_image: String,
    /// PEM of the CA that signed the agents' gate certificates, published to namespaces
    /// under restore for `custody-wait`.
    pub gate_ca: Option<String>,
}

struct Writer<'a> {
    context: &'a RestoreContext,
    restore: &'a Restore,
    namespace: String,
    name: String,
}

impl Writer<'_> {
    fn what(&self) -> String {
        format!("Restore {}/{}", self.namespace, self.name)
    }

    async fn status(&self, mut status: RestoreStatus, wanted: &[Desired]) -> Result<bool> {
        let current = self.restore.status.clone().unwrap_or_default();
        let now = Timestamp::now();
        let generation = self.restore.meta().generation;
        status.conditions = wanted
            .iter()
            .map(|desired| {
                conditions::next(&current.conditions, desired, generation, now).unwrap_or_else(
                    || {
                        current
                            .conditions
                            .iter()
                            .find(|condition| condition.type_ == desired.type_)
                            .cloned()
                            .expect("next() is None only when the condition exists")
                    },
                )
            })
            .collect();
        // Conditions other writers own (AnnotationsRecognized) are theirs; compare only ours.
        let mut compare = current.clone();
        compare.conditions.retain(|condition| {
            wanted
                .iter()
                .any(|desired| desired.type_ == condition.type_)
        });
        if status == compare {
            return Ok(false);
        }
        let api: Api<Restore> = Api::namespaced(self.context.base.client.clone(), &self.namespace);
        crate::status::apply(&api, &self.name, FIELD_MANAGER, &self.what(), &status).await?;
        tracing::info!(
            namespace = self.namespace,
            name = self.name,
            phase = ?status.phase,
            progress = status.progress.as_deref().unwrap_or_default(),
            volumes = status
                .volumes
                .iter()
                .map(|volume| format!(
                    "{}={:?}#{}: {}",
                    volume.claim_name,
                    volume.state,
                    volume.attempts,
                    volume.message.as_deref().unwrap_or_default()
                ))
                .collect::<Vec<_>>()
                .join("; "),
            "restore status"
        );
        Ok(true)
    }

    async fn event(&self, warning: bool, reason: &str, note: String) -> Result<()> {
        crate::events::publish(
            &self.context.base,
            self.restore,
            "Restore",
            warning,
            reason,
            note,
            "Restore",
        )
        .await
    }

    /// Pending with a reason; a Warning Event when the reason is new.
    async fn wait(&self, reason: &'static str, message: String, retry: u64) -> Result<Action> {
        self.stop_at(RestorePhase::Pending, reason, message, true)
            .await?;
        Ok(Action::requeue(Duration::from_secs(retry)))
    }

    /// Pending for an ordinary reason (no Event).
    async fn wait_quietly(
        &self,
        reason: &'static str,
        message: String,
        retry: u64,
    ) -> Result<Action> {
        self.stop_at(RestorePhase::Pending, reason, message, false)
            .await?;
        Ok(Action::requeue(Duration::from_secs(retry)))
    }

    /// Failed (final) with a reason and a Warning Event.
    async fn fail(&self, reason: &'static str, message: String) -> Result<Action> {
        self.stop_at(RestorePhase::Failed, reason, message, true)
            .await?;
        Ok(Action::await_change())
    }

    async fn stop_at(
        &self,
        phase: RestorePhase,
        reason: &'static str,
        message: String,
        warn: bool,
    ) -> Result<()> {
        let mut status = self.restore.status.clone().unwrap_or_default();
        status.phase = Some(phase);
        if phase == RestorePhase::Failed {
            status.completion_time.get_or_insert(Time(Timestamp::now()));
        }
        let ready = Desired {
            type_: types::READY,
            status: Status::False,
            reason,
            message: message.clone(),
        };
        let verified = Desired {
            type_: types::VERIFIED,
            status: if phase == RestorePhase::Failed {
                Status::False
            } else {
                Status::Unknown
            },
            reason,
            message: message.clone(),
        };
        let new_reason = !self
            .restore
            .status
            .iter()
            .flat_map(|status| status.conditions.iter())
            .any(|condition| condition.type_ == types::READY && condition.reason == reason);
        self.status(status, &[ready, verified]).await?;
        if warn && new_reason {
            self.event(true, reason, message).await?;
        }
        Ok(())
    }
}

/// Reconciles one Restore.
pub async fn reconcile(restore: Arc<Restore>, context: Arc<RestoreContext>) -> Result<Action> {
    let labels = KindLabels { kind: "Restore" };
    context
        .base
        .metrics
        .reconciliations
        .get_or_create(&labels)
        .inc();
    let started = Instant::now();
    // Decisions are made on the object as the API server has it now, not as the watch cache
    // last saw it: a status written a moment ago (a started volume, a recorded key) must not
    // be rolled back by a write based on an older copy.
    let result = match crate::status::fresh(&*restore, &context.base.client).await {
        Ok(Some(current)) => run(&current, &context).await,
        Ok(None) => Ok(Action::await_change()),
        Err(error) => Err(error),
    };
    context
        .base
        .metrics
        .reconcile_duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    result
}

fn read_error(what: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Read {
        object: what,
        source,
    }
}

async fn run(restore: &Restore, context: &RestoreContext) -> Result<Action> {
    let client = &context.base.client;
    let namespace = restore.namespace().unwrap_or_default();
    let name = restore.name_any();
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    let writer = Writer {
        context,
        restore,
        namespace: namespace.clone(),
        name: name.clone(),
    };
    let restores: Api<Restore> = Api::namespaced(client.clone(), &namespace);

    if restore.metadata.deletion_timestamp.is_some() {
        return tear_down(&writer, &restores, &uid).await;
    }
    if crate::finalizers::add(&restores, restore, FINALIZER, &writer.what()).await? {
        // Nothing is created before the finalizer is on; the write wakes us again.
        return Ok(Action::await_change());
    }

    let phase = restore.status.as_ref().and_then(|status| status.phase);
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &namespace);
    let cluster_name = &restore.spec.cluster_ref.name;
    let Some(cluster) = clusters
        .get_opt(cluster_name)
        .await
        .map_err(read_error(format!("Cluster {namespace}/{cluster_name}")))?
    else {
        if phase == Some(RestorePhase::Completed) {
            return Ok(Action::await_change());
        }
        return writer
            .wait(
                reasons::CLUSTER_NOT_FOUND,
                format!("Cluster {cluster_name} does not exist in this namespace"),
                15,
            )
            .await;
    };
    let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
    // A Restore created by a Cluster writes only that Cluster (not a later one of the same name).
    let owner_cluster = restore
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true) && owner.kind == "Cluster");
    if let Some(owner) = owner_cluster
        && owner.uid != cluster_uid
    {
        return writer
            .fail(
                reasons::CLUSTER_MISMATCH,
                format!(
                    "this Restore belongs to Cluster {} with UID {}, but Cluster {cluster_name} now has UID {cluster_uid}",
                    owner.name, owner.uid
                ),
            )
            .await;
    }

    let volumes_status = restore
        .status
        .as_ref()
        .map(|status| status.volumes.clone())
        .unwrap_or_default();
    let agents: Api<NodeAgent> = Api::all(client.clone());
    let agents = agents
        .list(&ListParams::default())
        .await
        .map_err(read_error("NodeAgents".to_string()))?
        .items;
    let reported_by_node: Vec<(String, Vec<custody_kube::api::ReportedVolume>)> = agents
        .into_iter()
        .map(|agent| {
            (
                agent.spec.node_name.clone(),
                agent
                    .status
                    .map(|status| status.restored_volumes)
                    .unwrap_or_default(),
            )
        })
        .collect();

    if matches!(phase, Some(RestorePhase::Completed | RestorePhase::Failed)) {
        // Final. Pods of a completed restore whose volumes the agents still report verified
        // keep (or get) their readiness gate.
        let claims: Vec<String> = volumes_status
            .iter()
            .map(|v| v.claim_name.clone())
            .collect();
        let reports = decide::reports_for(
            reported_by_node
                .iter()
                .map(|(node, volumes)| (node.as_str(), volumes.as_slice())),
            &namespace,
            &uid,
            &claims,
        );
        release(&writer, &decide::releasable_pods(&reports)).await?;
        let me = crate::holds::holder("Restore", &uid);
        crate::holds::lease::release(client, &namespace, &cluster_uid, &me).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }

    // The source.
    let backups: Api<Backup> = Api::namespaced(client.clone(), &namespace);
    let backup_name = &restore.spec.backup_ref.name;
    let Some(backup) = backups
        .get_opt(backup_name)
        .await
        .map_err(read_error(format!("Backup {namespace}/{backup_name}")))?
    else {
        // Read from the API server: a Backup that is gone is refused, never waited for.
        return writer
            .fail(
                reasons::BACKUP_NOT_FOUND,
                format!("Backup {backup_name} does not exist in this namespace (or was deleted)"),
            )
            .await;
    };
    // A restore that has started goes on: the Backup's deletion waits for it. One that has not
    // started never begins reading a Backup on its way out.
    let started = volumes_status.iter().any(|volume| volume.attempts > 0);
    if backup.metadata.deletion_timestamp.is_some() && !started {
        return writer
            .fail(
                reasons::BACKUP_BEING_DELETED,
                format!("Backup {backup_name} is being deleted; a restore never reads a Backup on its way out"),
            )
            .await;
    }
    let backup_status = backup.status.clone().unwrap_or_default();
    let artifact = match (backup_status.phase, backup_status.artifact) {
        (Some(BackupPhase::Completed), Some(artifact)) if artifact.manifest_hash.is_some() => {
            artifact
        }
        (Some(BackupPhase::Completed), _) if backup.spec.command.is_some() => {
            return writer
                .fail(
                    reasons::BACKUP_NOT_COMPLETED,
                    format!("Backup {backup_name} was taken by a command of its own: it has no manifest to restore and verify against"),
                )
                .await;
        }
        (Some(BackupPhase::Failed), _) => {
            return writer
                .fail(
                    reasons::BACKUP_NOT_COMPLETED,
                    format!("Backup {backup_name} failed; there is nothing to restore"),
                )
                .await;
        }
        _ => {
            return writer
                .wait(
                    reasons::BACKUP_NOT_COMPLETED,
                    format!("Backup {backup_name} has not completed yet"),
                    15,
                )
                .await;
        }
    };
    let repositories: Api<BackupRepository> = Api::namespaced(client.clone(), &namespace);
    let Some(repository) = repositories
        .get_opt(&artifact.repository)
        .await
        .map_err(read_error(format!(
            "BackupRepository {namespace}/{}",
            artifact.repository
        )))?
    else {
        return writer
            .wait(
                reasons::REPOSITORY_NOT_FOUND,
                format!(
                    "BackupRepository {} holding Backup {backup_name} does not exist in this namespace",
                    artifact.repository
                ),
                30,
            )
            .await;
    };

    // The target.
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let set_name = &cluster.spec.stateful_set_ref.name;
    let Some(set) = sets
        .get_opt(set_name)
        .await
        .map_err(read_error(format!("StatefulSet {namespace}/{set_name}")))?
    else {
        // Usual while the user's manifests are applied one after another.
        return writer
            .wait_quietly(
                reasons::STATEFUL_SET_NOT_FOUND,
                format!("StatefulSet {set_name} of Cluster {cluster_name} does not exist yet"),
                10,
            )
            .await;
    };
    let replicas = set
        .spec
        .as_ref()
        .and_then(|spec| spec.replicas)
        .unwrap_or(1);
    let claims = match decide::claims(&cluster.spec.volume_claim_templates, set_name, replicas) {
        Ok(claims) => claims,
        Err(refusal) => return writer.fail(refusal.reason, refusal.message).await,
    };

    publish_gate_ca(context, &namespace).await?;

    if !volumes_status.iter().any(|volume| volume.attempts > 0) {
        // Not started: a running backup of the Cluster finishes first.
        let backups = backups
            .list(&ListParams::default())
            .await
            .map_err(read_error(format!("Backups in {namespace}")))?
            .items;
        let runs: Vec<crate::holds::Run> = backups
            .iter()
            .filter(|backup| &backup.spec.cluster_ref.name == cluster_name)
            .map(|backup| {
                let phase = backup.status.as_ref().and_then(|status| status.phase);
                crate::holds::Run {
                    name: backup.metadata.name.as_deref().unwrap_or_default(),
                    started: phase == Some(BackupPhase::Running),
                    terminal: backup.metadata.deletion_timestamp.is_some()
                        || matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed)),
                }
            })
            .collect();
        if let crate::holds::Hold::Wait { reason, message } =
            crate::holds::restore_hold(cluster_name, &runs)
        {
            return writer.wait(reason, message, 5).await;
        }
    }
    let reports = decide::reports_for(
        reported_by_node
            .iter()
            .map(|(node, volumes)| (node.as_str(), volumes.as_slice())),
        &namespace,
        &uid,
        &claims,
    );
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let mut steps: Vec<decide::VolumeStep> = Vec::with_capacity(claims.len());
    for claim in &claims {
        let previous = volumes_status
            .iter()
            .find(|volume| &volume.claim_name == claim);
        let job = match previous.and_then(|volume| volume.job_name.clone()) {
            None => JobFact::Missing,
            Some(job_name) => match jobs
                .get_opt(&job_name)
                .await
                .map_err(read_error(format!("Job {namespace}/{job_name}")))?
            {
                None => JobFact::Missing,
                Some(job) if decide::owned_job(&job, &uid) => {
                    // A Job someone is deleting is as good as gone once its pods are.
                    JobFact::Owned(job_state(&job))
                }
                Some(_) => JobFact::Foreign,
            },
        };
        let facts = VolumeFacts {
            claim,
            previous,
            reported: reports.get(claim).copied(),
            job,
            may_start: decide::may_start(restore.spec.volume_restore_policy, &steps),
        };
        steps.push(decide::volume(&facts, &uid));
    }

    let me = crate::holds::holder("Restore", &uid);
    if steps.iter().any(|step| step.create.is_some())
        && let Some(holder) =
            crate::holds::lease::acquire(client, &namespace, &cluster, &me).await?
    {
        return writer
            .wait(
                crate::holds::CLUSTER_BUSY,
                format!("Cluster {cluster_name} is claimed by {holder}; the restore starts once it is free"),
                5,
            )
            .await;
    }
    for step in &steps {
        let Some(create) = &step.create else {
            continue;
        };
        let job = job_spec(&JobInputs {
            restore,
            cluster_uid: &cluster_uid,
            create,
            artifact: &artifact,
            backup_uid: backup.metadata.uid.as_deref().unwrap_or_default(),
            repository: &repository,
            image: &context.mover_image,
        });
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(Error::Create {
                    object: format!("Job {namespace}/{}", create.name),
                    source,
                });
            }
        }
        if step.recreated {
            writer
                .event(
                    true,
                    "JobRecreated",
                    format!(
                        "a prepareData Job of claim {} disappeared before its volume was verified; created {} (attempt {} of {})",
                        create.claim, create.name, create.attempt, decide::MAX_ATTEMPTS
                    ),
                )
                .await?;
        } else {
            writer
                .event(
                    false,
                    "RestoreStarted",
                    format!(
                        "Job {} writes claim {} on node {} from {}",
                        create.name, create.claim, create.node, artifact.key
                    ),
                )
                .await?;
        }
    }

    let volumes: Vec<VolumeRestoreStatus> = steps.into_iter().map(|step| step.status).collect();
    let summary = decide::summary(&volumes);
    let mut status = restore.status.clone().unwrap_or_default();
    let newly_verified: Vec<&VolumeRestoreStatus> = volumes
        .iter()
        .filter(|volume| volume.state == custody_kube::api::VolumeState::Verified)
        .filter(|volume| {
            !volumes_status.iter().any(|old| {
                old.claim_name == volume.claim_name
                    && old.state == custody_kube::api::VolumeState::Verified
            })
        })
        .collect();
    for volume in &newly_verified {
        writer
            .event(
                false,
                "VolumeVerified",
                format!(
                    "claim {} verified on node {}: {}",
                    volume.claim_name,
                    volume.node_name.clone().unwrap_or_default(),
                    volume.message.clone().unwrap_or_default()
                ),
            )
            .await?;
    }
    status.volumes = volumes.clone();
    status.phase = Some(summary.phase);
    status.progress = Some(summary.progress.clone());
    if summary.phase != RestorePhase::Pending {
        status.start_time.get_or_insert(Time(Timestamp::now()));
    }
    let (ready, verified) = match (&summary.phase, &summary.failure) {
        (RestorePhase::Failed, Some((reason, message))) => {
            status.completion_time.get_or_insert(Time(Timestamp::now()));
            let reason: &'static str = failure_reason(reason);
            (
                Desired {
                    type_: types::READY,
                    status: Status::False,
                    reason,
                    message: message.clone(),
                },
                Desired {
                    type_: types::VERIFIED,
                    status: Status::False,
                    reason,
                    message: message.clone(),
                },
            )
        }
        (RestorePhase::Completed, _) => {
            status.completion_time.get_or_insert(Time(Timestamp::now()));
            let message = format!("every volume verified ({})", summary.progress);
            (
                Desired {
                    type_: types::READY,
                    status: Status::True,
                    reason: reasons::COMPLETED,
                    message: message.clone(),
                },
                Desired {
                    type_: types::VERIFIED,
                    status: Status::True,
                    reason: reasons::ALL_VERIFIED,
                    message,
                },
            )
        }
        (RestorePhase::Pending, _) => {
            let message = format!(
                "waiting for the pods of StatefulSet {set_name} to be scheduled and their volumes reported ({})",
                summary.progress
            );
            (
                Desired {
                    type_: types::READY,
                    status: Status::False,
                    reason: reasons::WAITING_FOR_PODS,
                    message: message.clone(),
                },
                Desired {
                    type_: types::VERIFIED,
                    status: Status::Unknown,
                    reason: reasons::WAITING_FOR_PODS,
                    message,
                },
            )
        }
        _ => {
            let message = format!("restoring from Backup {backup_name}: {}", summary.progress);
            (
                Desired {
                    type_: types::READY,
                    status: Status::False,
                    reason: reasons::RESTORING,
                    message: message.clone(),
                },
                Desired {
                    type_: types::VERIFIED,
                    status: Status::Unknown,
                    reason: reasons::VERIFYING,
                    message,
                },
            )
        }
    };
    writer.status(status, &[ready, verified]).await?;
    if matches!(
        summary.phase,
        RestorePhase::Failed | RestorePhase::Completed
    ) {
        crate::holds::lease::release(client, &namespace, &cluster_uid, &me).await?;
    }
    match (&summary.phase, &summary.failure) {
        (RestorePhase::Failed, Some((reason, message))) => {
            writer
                .event(true, failure_reason(reason), message.clone())
                .await?;
        }
        (RestorePhase::Completed, _) => {
            writer
                .event(
                    false,
                    reasons::COMPLETED,
                    format!("every volume verified ({})", summary.progress),
                )
                .await?;
        }
        _ => {}
    }
    release(&writer, &decide::releasable_pods(&reports)).await?;
    Ok(match summary.phase {
        RestorePhase::Failed | RestorePhase::Completed => Action::requeue(Duration::from_secs(60)),
        _ => Action::requeue(Duration::from_secs(5)),
    })
}

/// Reasons are CamelCase words from a fixed set; anything else reads as `VerificationFailed`.
fn failure_reason(reason: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        // The agent's verification.
        "ContentMismatch",
        "ManifestMissing",
        "ManifestOfAnotherBackup",
        "ManifestTampered",
        "ManifestInvalid",
        "RestoreIdentityMissing",
        "WrittenByAnotherRestore",
        "RestoreIdentityOfAnotherBackup",
        "VolumeUnreadable",
        "InvalidVolumeName",
        "VolumeNotFound",
        "VolumeAmbiguous",
        "NotAMountPoint",
        "NotAPersistentFilesystem",
        "VerificationAborted",
        "RestoreNotFound",
        "RestoreReplaced",
        "BackupNotFound",
        "BackupIncomplete",
        "PrepareDataFailed",
        // The restore reconciler.
        "RestoreJobFailed",
        "JobDeleted",
        "JobNameTaken",
    ];
    KNOWN
        .iter()
        .find(|known| **known == reason)
        .copied()
        .unwrap_or("VerificationFailed")
}

/// Sets the readiness gate condition on the released pods that do not carry it yet.
async fn release(writer: &Writer<'_>, pods: &std::collections::BTreeSet<String>) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(writer.context.base.client.clone(), &writer.namespace);
    for name in pods {
        let Some(pod) = api
            .get_opt(name)
            .await
            .map_err(read_error(format!("Pod {}/{name}", writer.namespace)))?
        else {
            continue;
        };
        let set = pod
            .status
            .iter()
            .flat_map(|status| status.conditions.iter().flatten())
            .any(|condition| {
                condition.type_ == crate::inject::READINESS_GATE && condition.status == "True"
            });
        if set {
            continue;
        }
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "status": {"conditions": [{
                "type": crate::inject::READINESS_GATE,
                "status": "True",
                "reason": "RestoreVerified",
                "message": format!("every restored volume verified (Restore {})", writer.name),
                "lastTransitionTime": Time(Timestamp::now()),
            }]},
        });
        api.patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
        .map_err(|source| Error::PatchStatus {
            object: format!("Pod {}/{name}", writer.namespace),
            source,
        })?;
        tracing::info!(
            namespace = writer.namespace,
            pod = name,
            "readiness gate set"
        );
    }
    Ok(())
}

/// Copies the gate's CA into the namespace for `custody-wait` (created once, then kept equal).
async fn publish_gate_ca(context: &RestoreContext, namespace: &str) -> Result<()> {
    let Some(ca) = &context.gate_ca else {
        return Ok(());
    };
    let api: Api<ConfigMap> = Api::namespaced(context.base.client.clone(), namespace);
    let config_map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": GATE_CA_CONFIG_MAP,
            "labels": {"app.kubernetes.io/managed-by": "custody"},
        },
        "data": {"ca.crt": ca},
    });
    api.patch(
        GATE_CA_CONFIG_MAP,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(config_map),
    )
    .await
    .map_err(|source| Error::Patch {
        object: format!("ConfigMap {namespace}/{GATE_CA_CONFIG_MAP}"),
        source,
    })?;
    Ok(())
}

/// Cancellation: delete this Restore's own Jobs (owner reference, label and UID checked by
/// [`decide::teardown`]), wait until they and their pods are gone, then remove only this
/// reconciler's finalizer.
async fn tear_down(writer: &Writer<'_>, restores: &Api<Restore>, uid: &str) -> Result<Action> {
    let namespace = &writer.namespace;
    let client = &writer.context.base.client;
    if !writer.restore.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let selector = format!("{LABEL_RESTORE_UID}={uid}");
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let listed = jobs
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(read_error(format!("Jobs of {}", writer.what())))?
        .items;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pods_listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(read_error(format!("pods of {}", writer.what())))?
        .items;
    let plan = decide::teardown(&listed, &pods_listed, uid);
    for name in &plan.delete {
        // Re-checked against the object just read; the precondition makes the API server
        // refuse if the Job was replaced by another of the same name since.
        let Some(job) = listed
            .iter()
            .find(|job| job.metadata.name.as_ref() == Some(name))
        else {
            continue;
        };
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: Some(kube::api::Preconditions {
                uid: job.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match jobs.delete(name, &params).await {
            Ok(_) => tracing::info!(namespace, job = name, "deleted prepareData Job"),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(source) => {
                return Err(Error::Delete {
                    object: format!("Job {namespace}/{name}"),
                    source,
                });
            }
        }
    }
    if plan.waiting {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // Best effort: a claim left behind names a run that is gone, and is taken over.
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    if let Ok(Some(cluster)) = clusters
        .get_opt(&writer.restore.spec.cluster_ref.name)
        .await
    {
        let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
        let me = crate::holds::holder("Restore", uid);
        crate::holds::lease::release(client, namespace, &cluster_uid, &me).await?;
    }
    crate::finalizers::remove(restores, writer.restore, FINALIZER, &writer.what()).await?;
    tracing::info!(namespace, name = writer.name, "restore torn down");
    Ok(Action::await_change())
}

struct JobInputs<'a> {
    restore: &'a Restore,
    cluster_uid: &'a str,
    create: &'a decide::CreateJob,
    artifact: &'a custody_kube::api::Artifact,
    backup_uid: &'a str,
    repository: &'a BackupRepository,
    image: &'a str,
}

fn job_spec(inputs: &JobInputs<'_>) -> Job {
    let uid = inputs.restore.metadata.uid.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = [
        (
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_PREPARE_DATA,
        ),
        (LABEL_RESTORE_UID, uid.as_str()),
        (LABEL_CLUSTER_UID, inputs.cluster_uid),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .collect();
    let owner = inputs.restore.controller_owner_ref(&()).map(|mut owner| {
        owner.block_owner_deletion = Some(true);
        owner
    });
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": inputs.create.name,
            "labels": labels,
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": inputs.create.node,
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "mover",
                        "image": inputs.image,
                        "command": ["custody-mover"],
                        "args": Invocation::Restore {
                            target: TARGET_PATH.to_string(),
                            key: inputs.artifact.key.clone(),
                            manifest_key: inputs.artifact.manifest_key.clone(),
                            manifest_hash: inputs.artifact.manifest_hash.clone().unwrap_or_default(),
                            backup_uid: inputs.backup_uid.to_string(),
                            restore_uid: uid.clone(),
                        }
                        .args(),
                        "env": custody_kube::s3::mover_env(&inputs.repository.spec),
                        "volumeMounts": [{"name": "data", "mountPath": TARGET_PATH}],
                        // Writes files of every owner, with their owners and modes.
                        "securityContext": {"runAsUser": 0, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false},
                    }],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": inputs.create.claim}}],
                },
            },
        },
    }))
    .expect("a valid Job")
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(restore: Arc<Restore>, error: &Error, context: Arc<RestoreContext>) -> Action {
    crate::annotation_reconciler::error_policy(restore, error, context.base.clone())
}

/// The controller: Restores, woken by their Jobs and by agent reports.
pub fn controller(
    context: Arc<RestoreContext>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    use futures::{FutureExt, StreamExt};
    let client = context.base.client.clone();
    let (restores, jobs): (Api<Restore>, Api<Job>) = match namespace {
        Some(namespace) => (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client.clone(), namespace),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let agents: Api<NodeAgent> = Api::all(client);
    let controller = Controller::new(restores, watcher::Config::default());
    let store = controller.store();
    controller
        .owns(
            jobs,
            watcher::Config::default().labels(&format!(
                "{}={}",
                custody_proto::names::LABEL_ROLE,
                custody_proto::names::ROLE_PREPARE_DATA
            )),
        )
        .watches(
            agents,
            watcher::Config::default(),
            move |agent: NodeAgent| {
                // Every Restore a report on this node mentions.
                let uids: std::collections::BTreeSet<String> = agent
                    .status
                    .iter()
                    .flat_map(|status| status.restored_volumes.iter())
                    .map(|volume| volume.restore_uid.clone())
                    .collect();
                store
                    .state()
                    .into_iter()
                    .filter(|restore| {
                        restore
                            .metadata
                            .uid
                            .as_ref()
                            .is_some_and(|uid| uids.contains(uid))
                    })
                    .map(|restore| kube::runtime::reflector::ObjectRef::from_obj(&*restore))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(stopped)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(kind = "Restore", %error, "controller event");
            }
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_reasons_are_not_passed_through() {
        assert_eq!(super::failure_reason("ContentMismatch"), "ContentMismatch");
        assert_eq!(super::failure_reason("Anything Else"), "VerificationFailed");
    }
}
