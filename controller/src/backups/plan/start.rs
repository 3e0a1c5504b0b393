//! The first stage of a Backup: before its Job exists, what it waits for (a restore of the
//! Cluster, its claims, a mover's slot on the node, the repository), then what it records
//! (keys, node, method) before the Job that copies is created.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::super::consistency::{self, CopyMethod, Decision};
use super::super::decide;
use super::super::hooks;
use super::super::job::{self, JobInputs};
use super::super::reasons;
use super::finish::conclude;
use super::{
    Facts, Plan, fail_started, movers_busy, next_status, restore_runs, run_hook, wait, waiting,
};
use crate::events::Note;
use crate::holds::{self, Hold, LeaseStep};
use custody_kube::api::{
    Artifact, BackupPhase, BackupRepository, BackupStatus, Capture, Cluster, Consistency,
    Destination, EncryptedRepository, SnapshotRef,
};
use custody_proto::mover::FreezeArgs;

/// The Backup has no Job yet: wait for a restore of the Cluster, for the claim and a pod
/// mounting it, a slot on its node, the repository; then record the keys and create the Job,
/// under the Cluster's Lease.
pub(super) fn start(
    facts: &Facts,
    cluster: &Cluster,
    repository: &BackupRepository,
    namespace: &str,
    claim: &str,
    job_name: &str,
) -> Plan {
    let backup = &facts.backup;
    let cluster_name = &backup.spec.cluster_ref.name;
    let command = &backup.spec.command;
    let templates = &cluster.spec.volume_claim_templates;
    let mut status = backup.status.clone().unwrap_or_default();
    let Placed {
        claim_uid,
        chosen,
        several,
        node,
    } = match place(facts, cluster, repository, claim, &mut status) {
        Ok(placed) => placed,
        Err(plan) => return *plan,
    };
    let on = node.as_deref().map_or_else(
        || "the node the scheduler picks".to_string(),
        |node| format!("node {node}"),
    );
    let Target {
        encrypted,
        origin_cluster,
        prefix,
        key,
        manifest_key,
    } = match target(facts, cluster, repository, namespace) {
        Ok(target) => target,
        Err(plan) => return *plan,
    };
    let mut plan = Plan {
        lease: LeaseStep::TakeFirst,
        requeue: Some(Duration::from_secs(60)),
        ..Plan::wait_for_change()
    };
    if status.start_time.is_none() {
        // The credentials must outlive the artifact's record, even in a namespace teardown.
        plan.hold_secret = repository.spec.credentials_secret().map(str::to_string);
        status.node_name = node.clone();
        status.start_time = Some(Time(facts.now));
        // The freeze's bound, decided once: the agent reads it here, not from the mover.
        status.max_freeze_seconds = (status.consistency == Some(Capture::Frozen))
            .then(|| consistency::max_freeze_seconds(chosen) as i32);
        status.node_clock = facts.clock.clone();
        status.destination = Some(Destination::in_repository(repository, prefix.clone()));
        if command.is_none() {
            status.artifact = Some(Artifact {
                prefix: prefix.clone(),
                key: key.clone(),
                manifest_key,
                snapshot: encrypted.map(|encrypted| SnapshotRef {
                    repository_id: encrypted.id.clone(),
                    id: None,
                    origin_cluster: origin_cluster.clone(),
                    volumes: if several {
                        templates.clone()
                    } else {
                        templates.first().cloned().into_iter().collect()
                    },
                    volume_manifests: Vec::new(),
                    written_by: None,
                }),
                ..Artifact::located_in(repository)
            });
        }
        let ready = waiting(
            reasons::RUNNING,
            match command {
                None => format!(
                    "backing up claim {claim} on {on} to {}",
                    destination(&prefix, &key)
                ),
                Some(_) => format!("running the backup command on {on}, writing under {prefix}/"),
            },
        );
        plan.status = next_status(
            backup,
            status.clone(),
            BackupPhase::Running,
            &ready,
            facts.now,
        );
    }
    // A frozen copy: the mover asks the agent, and checks it with the gate's CA.
    let set_name = &cluster.spec.stateful_set_ref.name;
    if let Some(recorded) = recorded_volumes(&status)
        && recorded.len() > 1
        && recorded != templates
    {
        return fail_started(
            facts,
            status.clone(),
            reasons::UNSUPPORTED_VOLUME_LAYOUT,
            format!(
                "the Backup started with volumes {} and Cluster {cluster_name} now lists volume claim templates {}: a copy under names that changed could record one volume as another; create a new Backup",
                recorded.join(", "),
                templates.join(", ")
            ),
        );
    }
    let copied: Vec<job::VolumeToCopy> = match recorded_volumes(&status) {
        Some(volumes) if volumes.len() > 1 => volumes
            .iter()
            .map(|template| job::VolumeToCopy {
                template: template.clone(),
                claim: decide::claim_name(template, set_name),
                mount_path: facts.mount_paths.get(template).cloned().unwrap_or_default(),
            })
            .collect(),
        _ => vec![job::VolumeToCopy {
            template: templates.first().cloned().unwrap_or_default(),
            claim: claim.to_string(),
            mount_path: String::new(),
        }],
    };
    let method =
        match consistency::copy_method(status.consistency, status.max_freeze_seconds, chosen) {
            Ok(method) => method,
            Err((reason, message)) => return fail_started(facts, status, reason, message),
        };
    let freeze = match method {
        CopyMethod::Frozen { max_seconds } => Some(FreezeArgs {
            claims: copied.iter().map(|volume| volume.claim.clone()).collect(),
            max_seconds,
        }),
        _ => None,
    };
    plan.publish_gate_ca = freeze.is_some();
    // Hooks: the pre hook runs first; a failure that skips the copy still runs the post hook.
    if let CopyMethod::Hooks(spec) = method {
        match hooks::before(spec, status.hooks.as_ref()) {
            hooks::Before::Copy => {}
            hooks::Before::RunPre => return run_hook(facts, plan, hooks::Phase::Pre, &spec.pre),
            hooks::Before::Skip(message) => {
                return match (hooks::after(spec, status.hooks.as_ref()), &spec.post) {
                    (hooks::After::RunPost, Some(post)) => {
                        run_hook(facts, plan, hooks::Phase::Post, post)
                    }
                    _ => fail_started(facts, status, hooks::PRE_HOOK_FAILED, message),
                };
            }
        }
    }
    // A copy by the application's tool: it runs first, reaching the running pod.
    let tool = match method {
        CopyMethod::Tool(tool) => Some(job::ToolRun {
            tool,
            pod: facts.mounted_on.as_ref(),
        }),
        _ => None,
    };
    let snapshot = encrypted.map(|encrypted| job::SnapshotInputs {
        repository: encrypted,
        origin_cluster: &origin_cluster,
        parent: facts.parent_snapshot.as_deref(),
        consistency: status.consistency,
    });
    // The Job recorded as about to be created (its UID once the API server answers): one
    // found later without a UID was not proven to be custody's. A frozen copy's bound is
    // recorded too, if an older custody started it without one.
    let mut recorded = plan.status.take().unwrap_or_else(|| status.clone());
    recorded.job = Some(custody_kube::api::JobRef {
        name: job_name.to_string(),
        uid: String::new(),
    });
    if let CopyMethod::Frozen { max_seconds } = method
        && recorded.max_freeze_seconds.is_none()
    {
        recorded.max_freeze_seconds = Some(max_seconds as i32);
    }
    plan.status = Some(recorded);
    plan.job = Some(job::spec(JobInputs {
        name: job_name,
        backup,
        cluster_uid: cluster.metadata.uid.as_deref().unwrap_or_default(),
        claim,
        volumes: &copied,
        claim_uid,
        node: node.as_deref(),
        repository,
        prefix: &prefix,
        mover: &facts.mover,
        freeze,
        tool,
        snapshot,
    }));
    let recorded = if command.is_some() {
        format!("{prefix}/")
    } else {
        destination(&prefix, &key)
    };
    let claims: Vec<&str> = copied.iter().map(|volume| volume.claim.as_str()).collect();
    plan.events.push(Note::normal(
        "BackupStarted",
        format!(
            "Job {job_name} backs up {} {} on {on} to {recorded}",
            if claims.len() > 1 { "claims" } else { "claim" },
            claims.join(", ")
        ),
    ));
    plan
}

/// Where and how the copy runs, decided before it starts.
struct Placed<'a> {
    claim_uid: &'a str,
    /// The consistency method the Backup (or else its Cluster) names.
    chosen: Option<&'a Consistency>,
    /// Every volume of the Cluster, as one unit.
    several: bool,
    /// The node the copy runs on (`None`: the scheduler picks).
    node: Option<String>,
}

/// Whether the copy may start and where: not under a restore of the Cluster, with its claims
/// there, by a method the application allows (recorded in `status`), with a mover's slot on
/// its node. A started Backup keeps what it recorded. The plan of one that waits or ends, if
/// not.
fn place<'a>(
    facts: &'a Facts,
    cluster: &'a Cluster,
    repository: &BackupRepository,
    claim: &str,
    status: &mut BackupStatus,
) -> Result<Placed<'a>, Box<Plan>> {
    let backup = &facts.backup;
    let cluster_name = &backup.spec.cluster_ref.name;
    if status.start_time.is_none()
        && let Hold::Wait { reason, message } =
            holds::backup_hold(cluster_name, &restore_runs(&facts.restores, cluster_name))
    {
        // Not started: a restore of the Cluster goes first.
        return Err(Box::new(wait(facts, reason, message, 5)));
    }
    let Some(claim_uid) = &facts.claim_uid else {
        return Err(Box::new(wait(
            facts,
            reasons::CLAIM_NOT_FOUND,
            format!("PersistentVolumeClaim {claim} does not exist"),
            15,
        )));
    };
    let command = &backup.spec.command;
    let chosen = consistency::chosen(
        backup.spec.consistency.as_ref(),
        cluster.spec.consistency.as_ref(),
    );
    // Every volume of the Cluster, as one unit: each claim there, in a repository that holds
    // several volumes in one snapshot.
    let templates = &cluster.spec.volume_claim_templates;
    let several = command.is_none() && templates.len() > 1;
    if several && status.start_time.is_none() {
        if let Some(refusal) =
            decide::several_volumes(templates, repository.spec.encryption.is_some())
        {
            return Err(Box::new(conclude(
                facts,
                status.clone(),
                Err((reasons::UNSUPPORTED_VOLUME_LAYOUT, refusal)),
            )));
        }
        if let Some(missing) = facts.claims_missing.first() {
            return Err(Box::new(wait(
                facts,
                reasons::CLAIM_NOT_FOUND,
                format!(
                    "PersistentVolumeClaim {missing} does not exist; every volume of Cluster {cluster_name} ({}) is backed up together",
                    templates.join(", ")
                ),
                15,
            )));
        }
    }
    let tool = chosen
        .filter(|chosen| chosen.method == custody_kube::api::ConsistencyMethod::Tool)
        .and_then(|chosen| chosen.tool.as_ref());
    if command.is_none()
        && status.start_time.is_none()
        && let Some(refusal) =
            decide::stream_layout(tool, templates, repository.spec.encryption.is_some())
    {
        return Err(Box::new(conclude(
            facts,
            status.clone(),
            Err((reasons::UNSUPPORTED_VOLUME_LAYOUT, refusal)),
        )));
    }
    // Where the copy runs, and what it will be: decided once, when it starts.
    let node = if status.start_time.is_some() {
        status.node_name.clone()
    } else if command.is_some() {
        // The user's command reads the volume where the application runs.
        let Some(mounter) = &facts.mounted_on else {
            return Err(Box::new(wait(
                facts,
                reasons::VOLUME_NOT_MOUNTED,
                format!(
                    "no running pod mounts claim {claim}; the backup command runs where it is mounted"
                ),
                10,
            )));
        };
        Some(mounter.node.clone())
    } else {
        match consistency::decide(
            consistency::method(chosen),
            facts.mounted_on.as_ref(),
            claim,
            cluster_name,
            &cluster.spec.stateful_set_ref.name,
        ) {
            Decision::Refuse(message) => {
                return Err(Box::new(conclude(
                    facts,
                    status.clone(),
                    Err((reasons::CONSISTENCY_METHOD_REQUIRED, message)),
                )));
            }
            Decision::Copy { capture, node } => {
                status.consistency = Some(capture);
                node
            }
        }
    };
    // A slot on that node, before anything starts (a pre hook included).
    if status.start_time.is_none()
        && let Some(node) = &node
        && let taken = facts.mover_slots.get(node).copied().unwrap_or(0)
        && !crate::node_slots::free(taken, facts.mover.movers_per_node)
    {
        return Err(Box::new(movers_busy(facts, node, taken)));
    }

    Ok(Placed {
        claim_uid,
        chosen,
        several,
        node,
    })
}

/// Where the copy writes, known before it starts.
struct Target<'a> {
    /// The encrypted repository (format 2), if the copy goes there.
    encrypted: Option<&'a EncryptedRepository>,
    /// This Kubernetes cluster's identity, sealed in a snapshot.
    origin_cluster: String,
    prefix: String,
    /// The archive's key and its manifest's (format 1; empty for a snapshot).
    key: String,
    manifest_key: String,
}

/// The keys first: recorded before anything is uploaded, so that the key is provably this
/// Backup's even if the controller stops right after. (A command's dump has a name only the
/// command knows: it is attributed after the run.) A volume backup goes into the encrypted
/// repository: its snapshot is recorded once written, the repository's ID now. The plan of a
/// Backup that waits for the repository, if not known yet.
fn target<'a>(
    facts: &Facts,
    cluster: &Cluster,
    repository: &'a BackupRepository,
    namespace: &str,
) -> Result<Target<'a>, Box<Plan>> {
    let command = &facts.backup.spec.command;
    let uid = facts.backup.metadata.uid.clone().unwrap_or_default();
    let repository_prefix = repository.spec.prefix.as_deref().unwrap_or_default();
    let wants_encryption = command.is_none() && repository.spec.encryption.is_some();
    let encrypted = repository
        .status
        .as_ref()
        .and_then(|status| status.repository.as_ref())
        .filter(|_| wants_encryption);
    if wants_encryption && encrypted.is_none() {
        return Err(Box::new(wait(
            facts,
            reasons::REPOSITORY_NOT_READY,
            format!(
                "BackupRepository {} has not opened its encrypted repository yet",
                repository.name_any()
            ),
            15,
        )));
    }
    let origin_cluster = facts.origin_cluster.clone().unwrap_or_default();
    if encrypted.is_some() && origin_cluster.is_empty() {
        return Err(Box::new(wait(
            facts,
            reasons::REPOSITORY_NOT_READY,
            "the UID of namespace kube-system (this cluster's identity in a snapshot) could not be read".into(),
            15,
        )));
    }
    let prefix = match (command, encrypted) {
        (None, Some(encrypted)) => encrypted.prefix.clone(),
        (None, None) => {
            decide::artifact_prefix(repository_prefix, namespace, &cluster.name_any(), &uid)
        }
        (Some(command), _) => decide::command_prefix(repository_prefix, &command.prefix),
    };
    let (key, manifest_key) = match encrypted {
        Some(_) => (String::new(), String::new()),
        None => custody_proto::mover::object_keys(&prefix),
    };
    Ok(Target {
        encrypted,
        origin_cluster,
        prefix,
        key,
        manifest_key,
    })
}

/// The volumes a started snapshot backup recorded (the Cluster's templates when it started).
pub(super) fn recorded_volumes(status: &BackupStatus) -> Option<&Vec<String>> {
    status
        .artifact
        .as_ref()
        .and_then(|artifact| artifact.snapshot.as_ref())
        .map(|snapshot| &snapshot.volumes)
}

/// Where a volume backup writes, for people: its archive's key (format 1), or the encrypted
/// repository (format 2).
pub(super) fn destination(prefix: &str, key: &str) -> String {
    if key.is_empty() {
        format!("the encrypted repository at {prefix}")
    } else {
        key.to_string()
    }
}
