//! The prepareData Job of one volume: `custody-mover restore` pinned to the node where the
//! volume is mounted, owned by the Restore and labelled with its UID.

use custody_proto::mover::Invocation;
use k8s_openapi::api::batch::v1::Job;

use super::TARGET_PATH;
use super::decide::{self, LABEL_RESTORE_UID};
use crate::backups::decide::LABEL_CLUSTER_UID;
use custody_kube::api::{Artifact, BackupRepository, Restore};

/// What a prepareData Job is made of.
pub struct JobInputs<'a> {
    pub restore: &'a Restore,
    pub cluster_uid: &'a str,
    pub create: &'a decide::CreateJob,
    pub artifact: &'a Artifact,
    pub backup_uid: &'a str,
    pub repository: &'a BackupRepository,
    pub mover: &'a crate::mover_job::MoverJob,
}

/// The Job, as plain data.
pub fn spec(inputs: &JobInputs<'_>) -> Job {
    let uid = inputs.restore.metadata.uid.clone().unwrap_or_default();
    let labels = crate::ownership::labels(&[
        (
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_PREPARE_DATA,
        ),
        (LABEL_RESTORE_UID, uid.as_str()),
        (LABEL_CLUSTER_UID, inputs.cluster_uid),
    ]);
    let container = serde_json::json!({
        "name": "mover",
        "image": inputs.mover.image,
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
    });
    inputs.mover.job(
        &inputs.create.name,
        inputs.restore,
        &labels,
        crate::mover_job::Placement {
            node: &inputs.create.node,
            claim: &inputs.create.claim,
            read_only: false,
        },
        container,
    )
}
