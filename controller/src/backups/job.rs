//! The Job of one Backup: `custody-mover backup`, or the user's own command, on the node where
//! the claim is mounted, owned by the Backup and labelled with its, the Cluster's and the
//! claim's UIDs.

use custody_proto::mover::Invocation;
use k8s_openapi::api::batch::v1::Job;

use super::SOURCE_PATH;
use super::decide::{LABEL_BACKUP_UID, LABEL_CLAIM_UID, LABEL_CLUSTER_UID};
use custody_kube::api::{Backup, BackupRepository};

/// What a backup Job is made of.
pub struct JobInputs<'a> {
    pub name: &'a str,
    pub backup: &'a Backup,
    pub cluster_uid: &'a str,
    pub claim: &'a str,
    pub claim_uid: &'a str,
    /// `None`: wherever the scheduler can mount the claim (the application is stopped).
    pub node: Option<&'a str>,
    pub repository: &'a BackupRepository,
    pub prefix: &'a str,
    pub mover: &'a crate::mover_job::MoverJob,
    /// A frozen copy: the mover asks the node's agent to freeze the claim's filesystem.
    pub freeze: Option<custody_proto::mover::FreezeArgs>,
}

/// The mover's way to its node's agent: the agent's address (the node's, from the downward
/// API), a token bound to the mover's pod (audience `custody`) and the gate's CA, as
/// `custody-wait` has them.
fn agent_access(mut container: serde_json::Value) -> (serde_json::Value, serde_json::Value) {
    use crate::inject::{GATE_MOUNT as mount, GATE_VOLUME, TOKEN_SECONDS};
    use custody_proto::names;
    crate::mover_job::append(
        &mut container,
        "env",
        [
            serde_json::json!({"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}),
            serde_json::json!({"name": names::ENV_AGENT_ADDRESS, "value": format!("$(HOST_IP):{}", names::GATE_PORT)}),
            serde_json::json!({"name": names::ENV_TOKEN_FILE, "value": format!("{mount}/token")}),
            serde_json::json!({"name": names::ENV_CA_FILE, "value": format!("{mount}/ca.crt")}),
        ],
    );
    crate::mover_job::append(
        &mut container,
        "volumeMounts",
        [serde_json::json!({"name": GATE_VOLUME, "mountPath": mount, "readOnly": true})],
    );
    let volume = serde_json::json!({
        "name": GATE_VOLUME,
        "projected": {"sources": [
            {"serviceAccountToken": {"audience": names::GATE_AUDIENCE, "expirationSeconds": TOKEN_SECONDS, "path": "token"}},
            {"configMap": {"name": crate::gate_ca::CONFIG_MAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]},
    });
    (container, volume)
}

/// The Job, as plain data: `custody-mover backup` (or the user's command) pinned to the node
/// that mounts the claim (else placed by the scheduler), reading it read-only.
pub fn spec(inputs: JobInputs<'_>) -> Job {
    let uid = inputs.backup.metadata.uid.clone().unwrap_or_default();
    let labels = crate::ownership::labels(&[
        (
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_BACKUP,
        ),
        (LABEL_BACKUP_UID, uid.as_str()),
        (LABEL_CLUSTER_UID, inputs.cluster_uid),
        (LABEL_CLAIM_UID, inputs.claim_uid),
    ]);
    let env = custody_kube::s3::mover_env(&inputs.repository.spec);
    let container = match &inputs.backup.spec.command {
        None => serde_json::json!({
            "name": "mover",
            "image": inputs.mover.image,
            "command": ["custody-mover"],
            "args": Invocation::Backup {
                source: SOURCE_PATH.to_string(),
                prefix: inputs.prefix.to_string(),
                backup_uid: uid.clone(),
                cluster_uid: inputs.cluster_uid.to_string(),
                freeze: inputs.freeze.clone(),
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
    let (container, extra_volume) = match &inputs.freeze {
        Some(_) => {
            let (container, volume) = agent_access(container);
            (container, Some(volume))
        }
        None => (container, None),
    };
    let mut job = inputs.mover.job(
        inputs.name,
        inputs.backup,
        &labels,
        crate::mover_job::Placement {
            node: inputs.node,
            claim: inputs.claim,
            read_only: true,
        },
        container,
    );
    if let Some(volume) = extra_volume
        && let Some(pod) = job
            .spec
            .as_mut()
            .and_then(|spec| spec.template.spec.as_mut())
    {
        pod.volumes
            .get_or_insert_default()
            .push(serde_json::from_value(volume).expect("a valid volume"));
    }
    job
}
