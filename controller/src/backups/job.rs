//! The Job of one Backup: `custody-mover backup`, or the user's own command, on the node where
//! the claim is mounted, owned by the Backup and labelled with its, the Cluster's and the
//! claim's UIDs.

use custody_proto::mover::Invocation;
use k8s_openapi::api::batch::v1::Job;

use super::SOURCE_PATH;
use super::consistency::Mounter;
use super::decide::{LABEL_BACKUP_UID, LABEL_CLAIM_UID, LABEL_CLUSTER_UID};
use custody_kube::api::{Backup, BackupRepository, BackupTool, Capture, EncryptedRepository};
use custody_proto::mover::{RepositoryArgs, SnapshotBackupArgs};

/// What a backup Job is made of.
pub struct JobInputs<'a> {
    pub name: &'a str,
    pub backup: &'a Backup,
    pub cluster_uid: &'a str,
    pub claim: &'a str,
    /// Every volume the Job reads (the first is `claim`'s): more than one only into a
    /// snapshot.
    pub volumes: &'a [VolumeToCopy],
    pub claim_uid: &'a str,
    /// `None`: wherever the scheduler can mount the claim (the application is stopped).
    pub node: Option<&'a str>,
    pub repository: &'a BackupRepository,
    pub prefix: &'a str,
    pub mover: &'a crate::mover_job::MoverJob,
    /// A frozen copy: the mover asks the node's agent to freeze the claim's filesystem.
    pub freeze: Option<custody_proto::mover::FreezeArgs>,
    /// A copy by the application's own tool: it writes the tree the mover backs up.
    pub tool: Option<ToolRun<'a>>,
    /// A snapshot in the encrypted repository (format 2), else an archive (format 1).
    pub snapshot: Option<SnapshotInputs<'a>>,
}

/// What a snapshot backup's mover is told besides the volumes.
#[derive(Clone, Copy)]
pub struct SnapshotInputs<'a> {
    pub repository: &'a EncryptedRepository,
    pub origin_cluster: &'a str,
    pub parent: Option<&'a str>,
    pub consistency: Option<Capture>,
}

/// One volume of the Cluster a backup reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeToCopy {
    /// The volume claim template.
    pub template: String,
    pub claim: String,
    /// Where the application mounts it (empty: not known).
    pub mount_path: String,
}

/// Where the mover reads each volume, and the pod volume that mounts its claim: one volume
/// at [`SOURCE_PATH`] (`data`), several side by side under `/volumes/<template>` (a read-only
/// volume has no room for another's mount point).
fn source_mounts(volumes: &[VolumeToCopy]) -> Vec<(String, String)> {
    match volumes {
        [_] => vec![("data".to_string(), SOURCE_PATH.to_string())],
        _ => volumes
            .iter()
            .enumerate()
            .map(|(index, volume)| {
                let name = if index == 0 {
                    "data".to_string()
                } else {
                    format!("volume-{index}")
                };
                (name, format!("{VOLUMES_PATH}/{}", volume.template))
            })
            .collect(),
    }
}

/// Where several volumes are mounted side by side.
pub const VOLUMES_PATH: &str = "/volumes";

/// The name a capture has in a snapshot's record.
fn capture_name(capture: Option<Capture>) -> String {
    match capture {
        Some(capture) => serde_json::to_value(capture)
            .ok()
            .and_then(|value| value.as_str().map(str::to_string))
            .unwrap_or_default(),
        None => "Stopped".to_string(),
    }
}

/// The repository's master key for a mover, from the Secret custody keeps it in (never
/// copied into the Job).
pub fn master_key_env(repository: &EncryptedRepository) -> serde_json::Value {
    serde_json::json!({
        "name": custody_proto::mover::env::REPOSITORY_KEY,
        "valueFrom": {"secretKeyRef": {
            "name": repository.master_key_secret,
            "key": custody_proto::mover::env::REPOSITORY_KEY,
        }},
    })
}

/// The application's backup tool, and the running pod it reaches.
#[derive(Clone, Copy)]
pub struct ToolRun<'a> {
    pub tool: &'a BackupTool,
    pub pod: Option<&'a Mounter>,
}

/// The scratch volume the tool writes its tree into, and where it is mounted: its root is the
/// tree the mover backs up as the volume (so the directory a tool is to create, at
/// `dataPath`, has a parent it may write in).
pub const TOOL_VOLUME: &str = "tool-output";
pub const TOOL_MOUNT: &str = "/output";
pub const TOOL_TREE: &str = TOOL_MOUNT;
/// A stream tool's Job: the directory its tool's and mover's containers share (the FIFO, a
/// copy of `custody-mover`, the tool's exit code), its volume, and that volume's bound (it
/// holds the program, a few MiB).
pub const STREAM_MOUNT: &str = "/custody-stream";
pub const STREAM_VOLUME: &str = "tool-stream";
const STREAM_VOLUME_SIZE: &str = "256Mi";

/// Whether the tool writes a tar stream (read as it is produced) rather than a tree.
pub fn streams(tool: &BackupTool) -> bool {
    tool.output == Some(custody_kube::api::ToolOutput::TarStream)
}

/// A stream tool's containers: the init container that prepares the shared directory (the
/// mover's image) and the tool's, running beside the mover with its standard output on the
/// FIFO; the shared volume.
fn stream_containers(
    run: ToolRun<'_>,
    mover: &crate::mover_job::MoverJob,
) -> (serde_json::Value, serde_json::Value, serde_json::Value) {
    use custody_proto::mover::{flags, stream};
    let tool = run.tool;
    let mount = serde_json::json!({"name": STREAM_VOLUME, "mountPath": STREAM_MOUNT});
    let setup = serde_json::json!({
        "name": "stream-setup",
        "image": mover.image,
        "command": ["custody-mover", flags::STREAM_SETUP, format!("--{}", flags::DIR), STREAM_MOUNT],
        "volumeMounts": [mount],
        "resources": mover.resources(),
        // Root only to make the directory its own (the tool's user writes its exit code
        // there); no capability.
        "securityContext": unprivileged(Some(0)),
    });
    let claim_path = tool.mount_path.as_deref().unwrap_or(SOURCE_PATH);
    let command: Vec<String> = [
        format!("{STREAM_MOUNT}/{}", stream::PROGRAM),
        flags::STREAM_TOOL.to_string(),
        format!("--{}", flags::DIR),
        STREAM_MOUNT.to_string(),
        "--".to_string(),
    ]
    .into_iter()
    .chain(tool.command.iter().cloned())
    .collect();
    let container = tool_container_of(
        run,
        command,
        Vec::new(),
        serde_json::json!([
            {"name": "data", "mountPath": claim_path, "readOnly": true},
            mount,
        ]),
        mover.resources(),
    );
    let volume =
        serde_json::json!({"name": STREAM_VOLUME, "emptyDir": {"sizeLimit": STREAM_VOLUME_SIZE}});
    (setup, container, volume)
}

/// The tool's scratch space when the Backup does not say.
pub const DEFAULT_TOOL_SCRATCH: &str = "10Gi";

/// The environment the tool finds its output directory and the application in.
pub mod tool_env {
    pub const OUTPUT: &str = "CUSTODY_OUTPUT";
    pub const POD_NAME: &str = "CUSTODY_POD_NAME";
    pub const POD_IP: &str = "CUSTODY_POD_IP";

    /// The variable naming the tree of volume claim template `template`, when a tool writes
    /// several: `CUSTODY_OUTPUT_` and the template's name in capitals, `-` and `.` as `_`.
    pub fn output_of(template: &str) -> String {
        format!(
            "{OUTPUT}_{}",
            template
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                })
                .collect::<String>()
        )
    }
}

/// Where the tool writes: the tree's root, or its `dataPath` beneath it.
pub fn tool_output(tool: &BackupTool) -> String {
    tool_output_of(tool, TOOL_TREE)
}

/// Where the tool writes into the tree at `tree`: its root, or `dataPath` beneath it.
fn tool_output_of(tool: &BackupTool, tree: &str) -> String {
    match tool.data_path.as_deref().map(|path| path.trim_matches('/')) {
        Some(path) if !path.is_empty() => format!("{tree}/{path}"),
        _ => tree.to_string(),
    }
}

/// The `securityContext` of a container that runs the user's image (a tool, a command): never
/// root, no capabilities, no privilege escalation, the runtime's default seccomp profile, as
/// Pod Security `restricted` asks. The image's own user runs it; an image whose user is root
/// is refused by the kubelet (`runAsNonRoot`: CreateContainerConfigError), which the Backup
/// names as the reason its Job does not start; a tool's `runAsUser` sets the user (0: root,
/// asked for knowingly).
fn unprivileged(run_as_user: Option<i64>) -> serde_json::Value {
    let mut context = serde_json::json!({
        "runAsNonRoot": run_as_user != Some(0),
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    if let Some(user) = run_as_user {
        context["runAsUser"] = user.into();
    }
    context
}

/// The tool's `resources`: the mover's, and its scratch space as an ephemeral-storage request
/// and limit, so that the scheduler and the kubelet count it.
fn tool_resources(mover: &crate::mover_job::MoverJob, scratch: &str) -> serde_json::Value {
    let mut resources = mover.resources();
    resources["requests"]["ephemeral-storage"] = scratch.into();
    resources["limits"]["ephemeral-storage"] = scratch.into();
    resources
}

/// The tool's container (the Job's init container: the mover starts once it exited 0) and
/// its scratch volumes. One volume: the tool writes the tree at `$CUSTODY_OUTPUT`
/// (`/output[/dataPath]`). Several: one tree per volume claim template, each a scratch volume
/// of its own at `/output/<template>` (`$CUSTODY_OUTPUT_<TEMPLATE>`; `$CUSTODY_OUTPUT` is the
/// first's, with `dataPath`), each also mounted where the application mounts that template,
/// so that a tool writing a volume by the application's path (`pg_basebackup
/// --waldir=/var/lib/postgresql/wal/pg_wal`) writes it into that volume's tree and a link
/// between them is the one the application will follow.
fn tool_container(
    run: ToolRun<'_>,
    mover: &crate::mover_job::MoverJob,
    volumes: &[VolumeToCopy],
) -> (serde_json::Value, Vec<serde_json::Value>) {
    let tool = run.tool;
    let scratch = tool.scratch_size.as_deref().unwrap_or(DEFAULT_TOOL_SCRATCH);
    let several = volumes.len() > 1;
    let output = if several {
        tool_output_of(tool, &tool_tree(&volumes[0].template))
    } else {
        tool_output(tool)
    };
    let mut env = vec![serde_json::json!({"name": tool_env::OUTPUT, "value": output})];
    let claim_path = tool.mount_path.as_deref().unwrap_or(SOURCE_PATH);
    let mut mounts =
        vec![serde_json::json!({"name": "data", "mountPath": claim_path, "readOnly": true})];
    let mut scratch_volumes = Vec::new();
    if several {
        let mut taken: Vec<String> = vec![claim_path.to_string()];
        for (index, (volume, (claim_volume, _))) in
            volumes.iter().zip(source_mounts(volumes)).enumerate()
        {
            if index > 0 {
                let path = format!("{VOLUMES_PATH}/{}", volume.template);
                mounts.push(
                    serde_json::json!({"name": claim_volume, "mountPath": path, "readOnly": true}),
                );
                taken.push(path);
            }
            let name = tool_volume(index);
            let tree = tool_tree(&volume.template);
            env.push(
                serde_json::json!({"name": tool_env::output_of(&volume.template), "value": tree}),
            );
            mounts.push(serde_json::json!({"name": name, "mountPath": tree}));
            if volume.mount_path.starts_with('/') && !taken.contains(&volume.mount_path) {
                mounts.push(serde_json::json!({"name": name, "mountPath": volume.mount_path}));
                taken.push(volume.mount_path.clone());
            }
            scratch_volumes
                .push(serde_json::json!({"name": name, "emptyDir": {"sizeLimit": scratch}}));
        }
    } else {
        mounts.push(serde_json::json!({"name": TOOL_VOLUME, "mountPath": TOOL_MOUNT}));
        scratch_volumes
            .push(serde_json::json!({"name": TOOL_VOLUME, "emptyDir": {"sizeLimit": scratch}}));
    }
    let container = tool_container_of(
        run,
        tool.command.clone(),
        env,
        serde_json::json!(mounts),
        tool_resources(mover, scratch),
    );
    (container, scratch_volumes)
}

/// The container `tool`, writing a tree or a stream: the user's image and user, `command`,
/// `env` then where the running application is, the credentials Secret's keys, `mounts`.
fn tool_container_of(
    run: ToolRun<'_>,
    command: Vec<String>,
    mut env: Vec<serde_json::Value>,
    mounts: serde_json::Value,
    resources: serde_json::Value,
) -> serde_json::Value {
    let tool = run.tool;
    env.extend(
        [
            (tool_env::POD_NAME, run.pod.map(|pod| pod.pod.clone())),
            (tool_env::POD_IP, run.pod.and_then(|pod| pod.ip.clone())),
        ]
        .into_iter()
        .map(|(name, value)| serde_json::json!({"name": name, "value": value.unwrap_or_default()})),
    );
    let mut container = serde_json::json!({
        "name": "tool",
        "image": tool.image,
        "command": command,
        "env": env,
        "volumeMounts": mounts,
        "resources": resources,
        // The end of its output explains a failure in the Backup's condition.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": unprivileged(tool.run_as_user),
    });
    if let Some(secret) = &tool.credentials_secret_ref {
        container["envFrom"] = serde_json::json!([{"secretRef": {"name": secret.name}}]);
    }
    container
}

/// The init container that runs before a tool writing trees: `custody-mover scratch-check`
/// (the mover's image and rights, which read every file's size), which refuses the copy when
/// a claim's data takes more on disk than the tool's scratchSize, or all of them more than
/// the node's free disk, naming both sizes: before the tool runs for minutes and fails.
fn scratch_check_container(
    mover: &crate::mover_job::MoverJob,
    volumes: &[VolumeToCopy],
    mounts: &[(String, String)],
    tool: &BackupTool,
) -> serde_json::Value {
    use custody_proto::mover::flags;
    let scratch = tool.scratch_size.as_deref().unwrap_or(DEFAULT_TOOL_SCRATCH);
    let limit = crate::quantity::bytes(scratch).unwrap_or(u64::MAX);
    let (scratch_volume, scratch_path) = if volumes.len() > 1 {
        (tool_volume(0), tool_tree(&volumes[0].template))
    } else {
        (TOOL_VOLUME.to_string(), TOOL_MOUNT.to_string())
    };
    let mut command = vec![
        "custody-mover".to_string(),
        flags::SCRATCH_CHECK.to_string(),
        format!("--{}", flags::SCRATCH),
        scratch_path.clone(),
        format!("--{}", flags::LIMIT_BYTES),
        limit.to_string(),
    ];
    let mut volume_mounts = vec![
        serde_json::json!({"name": scratch_volume, "mountPath": scratch_path, "readOnly": true}),
    ];
    for (volume, (name, path)) in volumes.iter().zip(mounts) {
        command.extend([
            format!("--{}", flags::CLAIM),
            volume.claim.clone(),
            format!("--{}", flags::SOURCE),
            path.clone(),
        ]);
        volume_mounts.push(serde_json::json!({"name": name, "mountPath": path, "readOnly": true}));
    }
    serde_json::json!({
        "name": SCRATCH_CHECK,
        "image": mover.image,
        "command": command,
        "volumeMounts": volume_mounts,
        "resources": mover.resources(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": crate::mover_job::security_context(crate::mover_job::BACKUP_CAPABILITIES),
    })
}

/// The init container that checks a tool's scratch space before it runs.
pub const SCRATCH_CHECK: &str = "scratch-check";

/// The scratch volume of the tree of the `index`th volume, when a tool writes several.
fn tool_volume(index: usize) -> String {
    format!("{TOOL_VOLUME}-{index}")
}

/// Where a tool writes the tree of volume claim template `template`, when it writes several.
pub fn tool_tree(template: &str) -> String {
    format!("{TOOL_MOUNT}/{template}")
}

/// The mover's way to its node's agent: the agent's address (the node's, from the downward
/// API), a token bound to the mover's pod (audience `custody`) and the gate's CA, as
/// `custody-wait` has them.
fn agent_access(
    mut container: serde_json::Value,
    per_node_gate_names: bool,
) -> (serde_json::Value, serde_json::Value) {
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
        ]
        .into_iter()
        .chain(crate::inject::gate_env(per_node_gate_names)),
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
    let mut env = custody_kube::s3::mover_env(&inputs.repository.spec);
    // A tool's tree is backed up as the volume, and refused if it overfilled its scratch
    // space; else the volumes themselves.
    let mounts = source_mounts(inputs.volumes);
    let stream = inputs.tool.filter(|run| streams(run.tool));
    let source = match (&inputs.tool, stream) {
        (_, Some(_)) => STREAM_MOUNT,
        (Some(_), None) => TOOL_TREE,
        (None, None) => SOURCE_PATH,
    };
    let volume_mounts: Vec<serde_json::Value> = mounts
        .iter()
        .map(|(name, path)| serde_json::json!({"name": name, "mountPath": path, "readOnly": true}))
        .collect();
    let source_limit_bytes = inputs.tool.filter(|_| stream.is_none()).and_then(|run| {
        crate::quantity::bytes(
            run.tool
                .scratch_size
                .as_deref()
                .unwrap_or(DEFAULT_TOOL_SCRATCH),
        )
    });
    let invocation = match &inputs.snapshot {
        Some(snapshot) => {
            env.push(master_key_env(snapshot.repository));
            Invocation::SnapshotBackup(SnapshotBackupArgs {
                repository: RepositoryArgs {
                    prefix: snapshot.repository.prefix.clone(),
                    id: Some(snapshot.repository.id.clone()),
                },
                volumes: inputs
                    .volumes
                    .iter()
                    .zip(&mounts)
                    .map(|(volume, (_, path))| custody_proto::mover::SourceVolume {
                        name: volume.template.clone(),
                        claim: volume.claim.clone(),
                        source: match (&inputs.tool, inputs.volumes.len()) {
                            (Some(_), 1) => source.to_string(),
                            (Some(_), _) => tool_tree(&volume.template),
                            (None, _) => path.clone(),
                        },
                        mount_path: volume.mount_path.clone(),
                    })
                    .collect(),
                backup_name: inputs.backup.metadata.name.clone().unwrap_or_default(),
                backup_uid: uid.clone(),
                namespace: inputs.backup.metadata.namespace.clone().unwrap_or_default(),
                cluster: inputs.backup.spec.cluster_ref.name.clone(),
                cluster_uid: inputs.cluster_uid.to_string(),
                origin_cluster: snapshot.origin_cluster.to_string(),
                consistency: capture_name(snapshot.consistency),
                parent: snapshot.parent.map(str::to_string),
                freeze: inputs.freeze.clone(),
                source_limit_bytes,
                tar_stream: stream.map(|run| custody_proto::mover::TarStreamArgs {
                    dir: STREAM_MOUNT.to_string(),
                    data_path: run
                        .tool
                        .data_path
                        .as_deref()
                        .unwrap_or_default()
                        .trim_matches('/')
                        .to_string(),
                }),
            })
        }
        None => Invocation::Backup {
            source: source.to_string(),
            prefix: inputs.prefix.to_string(),
            backup_uid: uid.clone(),
            cluster_uid: inputs.cluster_uid.to_string(),
            freeze: inputs.freeze.clone(),
            source_limit_bytes,
        },
    };
    let container = match &inputs.backup.spec.command {
        None => serde_json::json!({
            "name": "mover",
            "image": inputs.mover.image,
            "command": ["custody-mover"],
            "args": invocation.args(),
            "env": env,
            "volumeMounts": volume_mounts,
            // Reads every file whatever its owner; never writes the volume.
            "securityContext": crate::mover_job::security_context(crate::mover_job::BACKUP_CAPABILITIES),
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
                "securityContext": unprivileged(None),
            })
        }
    };
    let (mut container, mut extra_volumes) = match &inputs.freeze {
        Some(_) => {
            let (container, volume) = agent_access(container, inputs.mover.per_node_gate_names);
            (container, vec![volume])
        }
        None => (container, Vec::new()),
    };
    let mut beside = None;
    let mut scratch_check = None;
    let init = inputs.tool.map(|run| {
        if stream.is_some() {
            let (setup, tool, volume) = stream_containers(run, inputs.mover);
            crate::mover_job::append(
                &mut container,
                "volumeMounts",
                [serde_json::json!({"name": STREAM_VOLUME, "mountPath": STREAM_MOUNT, "readOnly": true})],
            );
            extra_volumes.push(volume);
            beside = Some(tool);
            return setup;
        }
        let (tool, volumes) = tool_container(run, inputs.mover, inputs.volumes);
        scratch_check = Some(scratch_check_container(
            inputs.mover,
            inputs.volumes,
            &mounts,
            run.tool,
        ));
        let trees: Vec<serde_json::Value> = if inputs.volumes.len() > 1 {
            inputs
                .volumes
                .iter()
                .enumerate()
                .map(|(index, volume)| {
                    serde_json::json!({"name": tool_volume(index), "mountPath": tool_tree(&volume.template), "readOnly": true})
                })
                .collect()
        } else {
            vec![serde_json::json!({"name": TOOL_VOLUME, "mountPath": TOOL_MOUNT, "readOnly": true})]
        };
        crate::mover_job::append(&mut container, "volumeMounts", trees);
        extra_volumes.extend(volumes);
        tool
    });
    let mut job = inputs.mover.job(
        inputs.name,
        inputs.backup,
        &labels,
        Some(crate::mover_job::Placement {
            node: inputs.node,
            claim: inputs.claim,
            read_only: true,
        }),
        0,
        container,
    );
    if let Some(pod) = job
        .spec
        .as_mut()
        .and_then(|spec| spec.template.spec.as_mut())
    {
        // The other volumes' claims, read-only like the first.
        pod.volumes
            .get_or_insert_default()
            .extend(
                mounts
                    .iter()
                    .zip(inputs.volumes)
                    .skip(1)
                    .map(|((name, _), volume)| {
                        serde_json::from_value(serde_json::json!({
                            "name": name,
                            "persistentVolumeClaim": {"claimName": volume.claim, "readOnly": true},
                        }))
                        .expect("a valid volume")
                    }),
            );
        pod.volumes.get_or_insert_default().extend(
            extra_volumes
                .into_iter()
                .map(|volume| serde_json::from_value(volume).expect("a valid volume")),
        );
        if let Some(init) = init {
            pod.init_containers = Some(
                scratch_check
                    .into_iter()
                    .chain([init])
                    .map(|container| serde_json::from_value(container).expect("a valid container"))
                    .collect(),
            );
        }
        if let Some(tool) = beside {
            pod.containers
                .push(serde_json::from_value(tool).expect("a valid container"));
        }
    }
    crate::mover_job::with_web_identity(job, &inputs.repository.spec)
}

#[cfg(test)]
mod tests {
    use super::unprivileged;

    /// The user's image never runs as root unless the Backup says `runAsUser: 0`.
    #[test]
    fn the_users_image_runs_as_root_only_when_asked() {
        let rows = [
            (None, true, None),
            (Some(999), true, Some(999)),
            (Some(0), false, Some(0)),
        ];
        for (asked, non_root, user) in rows {
            let context = unprivileged(asked);
            assert_eq!(context["runAsNonRoot"], non_root, "{asked:?}");
            assert_eq!(context["runAsUser"].as_i64(), user, "{asked:?}");
            assert_eq!(context["capabilities"]["drop"][0], "ALL");
            assert_eq!(context["allowPrivilegeEscalation"], false);
        }
    }
}
