//! Backup: runs `custody-mover backup` in a Job pinned to the node where the Cluster's volume
//! is mounted, after recording the exact artifact keys in the Backup's status, and records
//! the result.

pub mod cleanup;
pub mod decide;

use custody_proto::mover::Invocation;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::conditions::{self, Desired, Status, types};
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::{self, Context};
use custody_kube::api::{
    Artifact, Backup, BackupPhase, BackupRepository, BackupStatus, ClockMeasurement, Cluster,
    HasConditions, NodeAgent,
};
use decide::{JobState, LABEL_BACKUP_UID, LABEL_CLAIM_UID, LABEL_CLUSTER_UID};

/// The action Events of this reconciler name.
pub const ACTION: &str = "Backup";
/// Field manager of the Backup's status.
pub const FIELD_MANAGER: &str = "custody.io/backup";
/// Where the mover container sees the volume.
pub const SOURCE_PATH: &str = "/data";

/// What the backup reconciler needs besides the shared context.
pub struct BackupContext {
    pub base: Arc<Context>,
    /// Image of `custody-mover`.
    pub mover_image: String,
}

/// Reasons of the Backup's `Ready` condition.
pub mod reasons {
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    pub const NO_REPOSITORY: &str = "NoRepository";
    pub const REPOSITORY_NOT_FOUND: &str = "RepositoryNotFound";
    pub const REPOSITORY_NOT_READY: &str = "RepositoryNotReady";
    pub const CLAIM_NOT_FOUND: &str = "ClaimNotFound";
    pub const VOLUME_NOT_MOUNTED: &str = "VolumeNotMounted";
    pub const JOB_NAME_TAKEN: &str = "JobNameTaken";
    pub const RUNNING: &str = "Running";
    pub const COMPLETED: &str = "Completed";
}

fn waiting(reason: &'static str, message: String) -> Desired {
    Desired {
        type_: types::READY,
        status: Status::False,
        reason,
        message,
    }
}

/// The status with `phase`, `ready` and the rest of `status`; `None` when nothing changes.
fn next_status(
    backup: &Backup,
    mut status: BackupStatus,
    phase: BackupPhase,
    ready: &Desired,
) -> Option<BackupStatus> {
    let current = backup.status.clone().unwrap_or_default();
    status.phase = Some(phase);
    let condition = conditions::next(
        &current.conditions,
        ready,
        backup.meta().generation,
        Timestamp::now(),
    );
    status.conditions = match condition {
        Some(condition) => vec![condition],
        None => current
            .conditions
            .iter()
            .filter(|condition| condition.type_ == ready.type_)
            .cloned()
            .collect(),
    };
    let mut compare = current.clone();
    compare
        .conditions
        .retain(|condition| condition.type_ == ready.type_);
    (compare != status).then_some(status)
}

struct Writer<'a> {
    context: &'a BackupContext,
    backup: &'a Backup,
    namespace: String,
    name: String,
}

impl Writer<'_> {
    async fn status(
        &self,
        phase: BackupPhase,
        status: BackupStatus,
        ready: &Desired,
    ) -> Result<()> {
        let Some(status) = next_status(self.backup, status, phase, ready) else {
            return Ok(());
        };
        let api: Api<Backup> = Api::namespaced(self.context.base.client.clone(), &self.namespace);
        crate::status::apply(
            &api,
            &self.name,
            FIELD_MANAGER,
            &format!("Backup {}/{}", self.namespace, self.name),
            &status,
        )
        .await?;
        tracing::info!(
            namespace = self.namespace,
            name = self.name,
            phase = ?phase,
            reason = ready.reason,
            message = ready.message,
            "backup status"
        );
        Ok(())
    }

    async fn event(&self, warning: bool, reason: &str, text: String) -> Result<()> {
        let note = Note {
            warning,
            reason: reason.to_string(),
            text,
        };
        crate::reconciler::publish(&self.context.base, self.backup, ACTION, &note).await
    }

    /// Pending with a reason; a Warning Event when the reason is new.
    async fn wait(&self, reason: &'static str, message: String, retry: u64) -> Result<Action> {
        let status = self.backup.status.clone().unwrap_or_default();
        let new_reason = !self
            .backup
            .conditions()
            .iter()
            .any(|condition| condition.type_ == types::READY && condition.reason == reason);
        self.status(
            BackupPhase::Pending,
            status,
            &waiting(reason, message.clone()),
        )
        .await?;
        if new_reason {
            self.event(true, reason, message).await?;
        }
        Ok(Action::requeue(Duration::from_secs(retry)))
    }
}

/// Reconciles one Backup.
pub async fn reconcile(backup: Arc<Backup>, context: Arc<BackupContext>) -> Result<Action> {
    let context = &context;
    reconciler::on_fresh(&*backup, &context.base, |backup| async move {
        run(&backup, context).await
    })
    .await
}

async fn run(backup: &Backup, context: &BackupContext) -> Result<Action> {
    if backup.metadata.deletion_timestamp.is_some() {
        return cleanup::run(backup, context).await;
    }
    {
        let namespace = backup.namespace().unwrap_or_default();
        let api: Api<Backup> = Api::namespaced(context.base.client.clone(), &namespace);
        let what = format!("Backup {namespace}/{}", backup.name_any());
        // Before anything is written anywhere: the artifact is always dealt with on deletion.
        if crate::finalizers::add(&api, backup, crate::artifacts::FINALIZER, &what).await? {
            return Ok(Action::await_change());
        }
    }
    let phase = backup.status.as_ref().and_then(|status| status.phase);
    if matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed)) {
        return Ok(Action::await_change());
    }
    let client = &context.base.client;
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let uid = backup.metadata.uid.clone().unwrap_or_default();
    let writer = Writer {
        context,
        backup,
        namespace: namespace.clone(),
        name: name.clone(),
    };

    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &namespace);
    let cluster_name = &backup.spec.cluster_ref.name;
    let Some(cluster) = clusters
        .get_opt(cluster_name)
        .await
        .map_err(Error::read(format!("Cluster {namespace}/{cluster_name}")))?
    else {
        return writer
            .wait(
                reasons::CLUSTER_NOT_FOUND,
                format!("Cluster {cluster_name} does not exist in this namespace"),
                30,
            )
            .await;
    };
    let Some(repository_name) = backup
        .spec
        .repository_ref
        .as_ref()
        .or(cluster.spec.repository_ref.as_ref())
        .map(|reference| reference.name.clone())
    else {
        return writer
            .wait(
                reasons::NO_REPOSITORY,
                format!("neither the Backup nor Cluster {cluster_name} names a BackupRepository"),
                60,
            )
            .await;
    };
    let repositories: Api<BackupRepository> = Api::namespaced(client.clone(), &namespace);
    let Some(repository) = repositories
        .get_opt(&repository_name)
        .await
        .map_err(Error::read(format!(
            "BackupRepository {namespace}/{repository_name}"
        )))?
    else {
        return writer
            .wait(
                reasons::REPOSITORY_NOT_FOUND,
                format!("BackupRepository {repository_name} does not exist in this namespace"),
                30,
            )
            .await;
    };
    let repository_ready = repository
        .conditions()
        .iter()
        .find(|condition| condition.type_ == types::READY);
    if repository_ready.is_none_or(|condition| condition.status != "True") {
        return writer
            .wait(
                reasons::REPOSITORY_NOT_READY,
                format!(
                    "BackupRepository {repository_name} is not ready: {}",
                    repository_ready
                        .map(|condition| condition.message.clone())
                        .unwrap_or_else(|| "not checked yet".to_string())
                ),
                15,
            )
            .await;
    }

    let Some(template) = cluster.spec.volume_claim_templates.first() else {
        return writer
            .wait(
                reasons::CLAIM_NOT_FOUND,
                format!("Cluster {cluster_name} lists no volume claim template"),
                60,
            )
            .await;
    };
    let claim = decide::claim_name(template, &cluster.spec.stateful_set_ref.name);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let job_name = decide::job_name(&name, &uid);
    let job = jobs
        .get_opt(&job_name)
        .await
        .map_err(Error::read(format!("Job {namespace}/{job_name}")))?;
    let status = backup.status.clone().unwrap_or_default();

    match job {
        Some(job) if !decide::owned_by(&job, &uid) => {
            writer
                .wait(
                    reasons::JOB_NAME_TAKEN,
                    format!(
                        "Job {job_name} exists but was not created by this Backup; it is left alone"
                    ),
                    60,
                )
                .await
        }
        Some(job) => match decide::job_state(&job) {
            JobState::Running => {
                let ready = waiting(
                    reasons::RUNNING,
                    format!(
                        "backing up claim {claim} on node {}",
                        status.node_name.clone().unwrap_or_default()
                    ),
                );
                writer.status(BackupPhase::Running, status, &ready).await?;
                Ok(Action::requeue(Duration::from_secs(60)))
            }
            state => {
                let action = match &backup.spec.command {
                    None => finish(&writer, status, &job_name, state).await?,
                    Some(command) => {
                        finish_command(&writer, status, state, &repository, &command.prefix).await?
                    }
                };
                let me = crate::holds::holder("Backup", &uid);
                let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
                crate::holds::lease::release(client, &namespace, &cluster_uid, &me).await?;
                Ok(action)
            }
        },
        None => {
            if status.start_time.is_none() {
                // Not started: a restore of the Cluster goes first.
                let restores: Api<custody_kube::api::Restore> =
                    Api::namespaced(client.clone(), &namespace);
                let restores = restores
                    .list(&ListParams::default())
                    .await
                    .map_err(Error::read(format!("Restores in {namespace}")))?
                    .items;
                let runs: Vec<crate::holds::Run> = restores
                    .iter()
                    .filter(|restore| &restore.spec.cluster_ref.name == cluster_name)
                    .map(|restore| crate::holds::Run {
                        name: restore.metadata.name.as_deref().unwrap_or_default(),
                        started: true,
                        terminal: restore.metadata.deletion_timestamp.is_some()
                            || matches!(
                                restore.status.as_ref().and_then(|status| status.phase),
                                Some(
                                    custody_kube::api::RestorePhase::Completed
                                        | custody_kube::api::RestorePhase::Failed
                                )
                            ),
                    })
                    .collect();
                if let crate::holds::Hold::Wait { reason, message } =
                    crate::holds::backup_hold(cluster_name, &runs)
                {
                    return writer.wait(reason, message, 5).await;
                }
            }
            let me = crate::holds::holder("Backup", &uid);
            if let Some(holder) =
                crate::holds::lease::acquire(client, &namespace, &cluster, &me).await?
            {
                return writer
                    .wait(
                        crate::holds::CLUSTER_BUSY,
                        format!("Cluster {cluster_name} is claimed by {holder}; the backup starts once it is free"),
                        5,
                    )
                    .await;
            }
            start(
                &writer,
                status,
                &cluster,
                &repository,
                &claim,
                &job_name,
                &uid,
            )
            .await
        }
    }
}

async fn start(
    writer: &Writer<'_>,
    mut status: BackupStatus,
    cluster: &Cluster,
    repository: &BackupRepository,
    claim: &str,
    job_name: &str,
    uid: &str,
) -> Result<Action> {
    let client = &writer.context.base.client;
    let namespace = &writer.namespace;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let Some(pvc) = claims.get_opt(claim).await.map_err(Error::read(format!(
        "PersistentVolumeClaim {namespace}/{claim}"
    )))?
    else {
        return writer
            .wait(
                reasons::CLAIM_NOT_FOUND,
                format!("PersistentVolumeClaim {claim} does not exist"),
                15,
            )
            .await;
    };
    // The node where a running pod mounts the claim: the backup reads it there.
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mounted_on = pods
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("pods in {namespace}")))?
        .items
        .into_iter()
        .filter(|pod| {
            pod.status
                .as_ref()
                .and_then(|status| status.phase.as_deref())
                == Some("Running")
        })
        .find_map(|pod| {
            let spec = pod.spec?;
            let mounts = spec.volumes.iter().flatten().any(|volume| {
                volume
                    .persistent_volume_claim
                    .as_ref()
                    .is_some_and(|source| source.claim_name == claim)
            });
            mounts.then_some(spec.node_name).flatten()
        });
    let Some(node) = mounted_on else {
        return writer
            .wait(
                reasons::VOLUME_NOT_MOUNTED,
                format!("no running pod mounts claim {claim}; the backup runs where it is mounted"),
                10,
            )
            .await;
    };

    // The keys first: recorded before anything is uploaded, so that the key is provably this
    // Backup's even if the controller stops right after. (A command's dump has a name only
    // the command knows: it is attributed after the run.)
    let repository_prefix = repository.spec.prefix.as_deref().unwrap_or_default();
    let command = writer.backup.spec.command.clone();
    let prefix = match &command {
        None => decide::artifact_prefix(repository_prefix, namespace, &cluster.name_any(), uid),
        Some(command) => decide::command_prefix(repository_prefix, &command.prefix),
    };
    let (key, manifest_key) = custody_proto::mover::object_keys(&prefix);
    if status.start_time.is_none() {
        // The credentials must outlive the artifact's record, even in a namespace teardown.
        cleanup::hold_secret(
            client,
            namespace,
            &repository.spec.credentials_secret_ref.name,
        )
        .await?;
        let agents: Api<NodeAgent> = Api::all(client.clone());
        let clock = agents
            .get_opt(&node)
            .await
            .ok()
            .flatten()
            .and_then(|agent| agent.status)
            .and_then(|agent| {
                Some(ClockMeasurement {
                    offset_nanoseconds: agent.clock_offset_nanoseconds?,
                    round_trip_nanoseconds: agent.round_trip_nanoseconds?,
                    measured_at: agent.last_heartbeat_time?,
                })
            });
        status.node_name = Some(node.clone());
        status.start_time = Some(Time(Timestamp::now()));
        status.node_clock = clock;
        if command.is_none() {
            status.artifact = Some(Artifact {
                prefix: prefix.clone(),
                key: key.clone(),
                manifest_key: manifest_key.clone(),
                ..Artifact::located_in(repository)
            });
        }
        let ready = waiting(
            reasons::RUNNING,
            match &command {
                None => format!("backing up claim {claim} on node {node} to {key}"),
                Some(_) => {
                    format!("running the backup command on node {node}, writing under {prefix}/")
                }
            },
        );
        writer
            .status(BackupPhase::Running, status.clone(), &ready)
            .await?;
    }
    let node = status.node_name.clone().unwrap_or(node);

    let job = job_spec(JobInputs {
        name: job_name,
        backup: writer.backup,
        cluster_uid: cluster.metadata.uid.as_deref().unwrap_or_default(),
        claim,
        claim_uid: pvc.metadata.uid.as_deref().unwrap_or_default(),
        node: &node,
        repository,
        prefix: &prefix,
        image: &writer.context.mover_image,
    });
    let recorded_key = if command.is_some() {
        format!("{prefix}/")
    } else {
        key.clone()
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(source) => {
            return Err(Error::Create {
                object: format!("Job {namespace}/{job_name}"),
                source,
            });
        }
    }
    writer
        .event(
            false,
            "BackupStarted",
            format!("Job {job_name} backs up claim {claim} on node {node} to {recorded_key}"),
        )
        .await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

async fn finish(
    writer: &Writer<'_>,
    mut status: BackupStatus,
    job_name: &str,
    state: JobState,
) -> Result<Action> {
    let client = &writer.context.base.client;
    let namespace = &writer.namespace;
    // The mover's report is its termination message.
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let report = pods
        .list(&ListParams::default().labels(&format!("job-name={job_name}")))
        .await
        .map_err(|source| Error::Read {
            object: format!("pods of Job {namespace}/{job_name}"),
            source,
        })?
        .items
        .iter()
        .flat_map(|pod| pod.status.iter())
        .flat_map(|status| status.container_statuses.iter().flatten())
        .filter_map(|container| {
            container
                .state
                .as_ref()?
                .terminated
                .as_ref()?
                .message
                .clone()
        })
        .next_back();
    let recorded = status.artifact.clone().unwrap_or_default();
    let outcome = match (&state, report) {
        (_, Some(report)) => {
            decide::completion(&recorded, &custody_proto::mover::read_report(&report))
        }
        (JobState::Failed { message }, None) => Err((decide::JOB_FAILED, message.clone())),
        (_, None) => Err((
            decide::MOVER_REPORT_MISSING,
            format!("Job {job_name} succeeded without a report from the mover"),
        )),
    };
    status.completion_time = Some(Time(Timestamp::now()));
    match outcome {
        Ok(artifact) => {
            let message = format!(
                "{} bytes at {} (manifest BLAKE3 {})",
                artifact.size_bytes.unwrap_or_default(),
                artifact.key,
                artifact.manifest_hash.clone().unwrap_or_default()
            );
            status.artifact = Some(artifact);
            let ready = Desired {
                type_: types::READY,
                status: Status::True,
                reason: reasons::COMPLETED,
                message: message.clone(),
            };
            writer
                .status(BackupPhase::Completed, status, &ready)
                .await?;
            writer.event(false, "BackupCompleted", message).await?;
        }
        Err((reason, message)) => {
            let ready = waiting(reason, message.clone());
            writer.status(BackupPhase::Failed, status, &ready).await?;
            writer.event(true, reason, message).await?;
        }
    }
    Ok(Action::await_change())
}

/// After a command backup's Job: which dump under the shared prefix is this run's, by two
/// clocks ([`crate::attribution`]); recorded only when exactly one fits.
async fn finish_command(
    writer: &Writer<'_>,
    mut status: BackupStatus,
    state: JobState,
    repository: &BackupRepository,
    command_prefix: &str,
) -> Result<Action> {
    let client = &writer.context.base.client;
    let namespace = &writer.namespace;
    let now = Timestamp::now();
    status.completion_time = Some(Time(now));
    let fail = |reason: &'static str, message: String| (reason, message);
    let outcome: Result<Artifact, (&'static str, String)> = async {
        if let JobState::Failed { message } = &state {
            return Err(fail(decide::JOB_FAILED, message.clone()));
        }
        let prefix = decide::command_prefix(
            repository.spec.prefix.as_deref().unwrap_or_default(),
            command_prefix,
        );
        let secret_name = &repository.spec.credentials_secret_ref.name;
        let credentials = match custody_kube::s3::credentials(client, namespace, secret_name).await
        {
            Ok(credentials) => credentials,
            Err(error @ custody_kube::s3::CredentialsError::Read { .. }) => {
                tracing::warn!(%error, "reading credentials");
                return Err(fail("Retry", String::new()));
            }
            Err(error) => return Err(fail("CredentialsMissing", error.to_string())),
        };
        let endpoint = crate::repositories::endpoint_of(repository);
        let s3 = custody_kube::s3::client(&endpoint, &credentials)
            .map_err(|error| fail("InvalidRepository", error.to_string()))?;
        let mut candidates = Vec::new();
        let mut sizes = BTreeMap::new();
        let mut token = None;
        loop {
            let page = s3
                .list_objects_v2()
                .bucket(&endpoint.bucket)
                .prefix(format!("{prefix}/"))
                .set_continuation_token(token.clone())
                .send()
                .await
                .map_err(|error| fail("ListFailed", custody_kube::s3::sdk_error(&error)))?;
            for object in page.contents() {
                let (Some(key), Some(modified)) = (object.key(), object.last_modified()) else {
                    continue;
                };
                let nanos = modified.secs() * 1_000_000_000 + i64::from(modified.subsec_nanos());
                sizes.insert(key.to_string(), object.size().unwrap_or_default());
                candidates.push(crate::attribution::Candidate {
                    key: key.to_string(),
                    last_modified: nanos,
                });
            }
            token = page.next_continuation_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        // Every other run of this command prefix, finished or not, from the API server.
        let backups: Api<Backup> = Api::namespaced(client.clone(), namespace);
        let others = backups
            .list(&ListParams::default())
            .await
            .map_err(|_| fail("Retry", String::new()))?
            .items;
        let uid = writer.backup.metadata.uid.clone().unwrap_or_default();
        let others = decide::other_runs(&others, &uid, &repository.name_any(), command_prefix);
        let run = decide::run_of(&status, now.as_nanosecond() as i64);
        let found = crate::attribution::attribute(&run, &candidates, &others)
            .map_err(|refusal| fail(refusal.reason, refusal.message))?;
        Ok(Artifact {
            prefix,
            size_bytes: sizes.get(&found.key).copied(),
            key: found.key.clone(),
            manifest_key: String::new(),
            attribution: Some(custody_kube::api::AttributionEvidence {
                corrected_name_time_nanos: found.corrected,
                last_modified_nanos: found.last_modified,
                window_start_nanos: found.window.0,
                window_end_nanos: found.window.1,
            }),
            ..Artifact::located_in(repository)
        })
    }
    .await;
    match outcome {
        Err(("Retry", _)) => Ok(Action::requeue(Duration::from_secs(5))),
        Ok(artifact) => {
            let message = format!(
                "the dump {} is this run's: its name's time, corrected by the node's clock offset, and its LastModified fall within the run",
                artifact.key
            );
            status.artifact = Some(artifact);
            let ready = Desired {
                type_: types::READY,
                status: Status::True,
                reason: reasons::COMPLETED,
                message: message.clone(),
            };
            writer
                .status(BackupPhase::Completed, status, &ready)
                .await?;
            writer.event(false, "DumpAttributed", message).await?;
            Ok(Action::await_change())
        }
        Err((reason, message)) => {
            let ready = waiting(reason, message.clone());
            writer.status(BackupPhase::Failed, status, &ready).await?;
            writer.event(true, reason, message).await?;
            Ok(Action::await_change())
        }
    }
}

struct JobInputs<'a> {
    name: &'a str,
    backup: &'a Backup,
    cluster_uid: &'a str,
    claim: &'a str,
    claim_uid: &'a str,
    node: &'a str,
    repository: &'a BackupRepository,
    prefix: &'a str,
    image: &'a str,
}

fn job_spec(inputs: JobInputs<'_>) -> Job {
    let uid = inputs.backup.metadata.uid.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = [
        (
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_BACKUP,
        ),
        (LABEL_BACKUP_UID, uid.as_str()),
        (LABEL_CLUSTER_UID, inputs.cluster_uid),
        (LABEL_CLAIM_UID, inputs.claim_uid),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .collect();
    let env = custody_kube::s3::mover_env(&inputs.repository.spec);
    let owner = inputs.backup.controller_owner_ref(&()).map(|mut owner| {
        owner.block_owner_deletion = Some(true);
        owner
    });
    let container = match &inputs.backup.spec.command {
        None => serde_json::json!({
            "name": "mover",
            "image": inputs.image,
            "command": ["custody-mover"],
            "args": Invocation::Backup {
                source: SOURCE_PATH.to_string(),
                prefix: inputs.prefix.to_string(),
                backup_uid: uid.clone(),
                cluster_uid: inputs.cluster_uid.to_string(),
            }
            .args(),
            "env": env,
            "volumeMounts": [{"name": "data", "mountPath": SOURCE_PATH, "readOnly": true}],
            // Reads every file whatever its owner; never writes the volume.
            "securityContext": {"runAsUser": 0, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false},
        }),
        Some(command) => {
            let mut env = env;
            env.push(serde_json::json!({"name": custody_proto::mover::env::PREFIX, "value": inputs.prefix}));
            serde_json::json!({
                "name": "backup",
                "image": command.image,
                "command": command.command,
                "env": env,
                "volumeMounts": [{"name": "data", "mountPath": SOURCE_PATH, "readOnly": true}],
                "securityContext": {"allowPrivilegeEscalation": false},
            })
        }
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": inputs.name,
            "labels": labels,
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": inputs.node,
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": inputs.claim, "readOnly": true}}],
                },
            },
        },
    }))
    .expect("a valid Job")
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(backup: Arc<Backup>, error: &Error, context: Arc<BackupContext>) -> Action {
    reconciler::error_policy(&*backup, error, &context.base)
}

/// The controller: Backups, woken by their Jobs.
pub fn controller(
    context: Arc<BackupContext>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let client = context.base.client.clone();
    let backups: Api<Backup> = reconciler::scoped(client.clone(), namespace);
    let jobs: Api<Job> = reconciler::scoped(client, namespace);
    let controller = Controller::new(backups, watcher::Config::default()).owns(
        jobs,
        watcher::Config::default().labels(&format!(
            "{}={}",
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_BACKUP
        )),
    );
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}
