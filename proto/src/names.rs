//! Labels, annotations and audiences both sides of custody agree on. The controller (and its
//! webhook) writes them; the agent reads them.

/// On a workload pod under restore: the name of the Restore writing its volumes.
pub const ANNOTATION_RESTORE: &str = "custody.io/restore";
/// On a workload pod under restore: comma-separated PersistentVolumeClaim names whose data
/// the Restore writes. The pod is released only when each of them is verified.
pub const ANNOTATION_RESTORED_CLAIMS: &str = "custody.io/restored-claims";
/// On workload pods under restore and on prepareData pods: UID of the Restore.
pub const LABEL_RESTORE_UID: &str = "custody.io/restore-uid";
/// On everything the backup reconciler creates (its Jobs and their pods): UID of the Backup.
pub const LABEL_BACKUP_UID: &str = "custody.io/backup-uid";
/// On pods custody runs: what the pod does.
pub const LABEL_ROLE: &str = "custody.io/role";
/// [`LABEL_ROLE`] of a pod that writes a restored volume (`custody-mover restore`).
pub const ROLE_PREPARE_DATA: &str = "prepare-data";
/// [`LABEL_ROLE`] of a pod that reads a volume into a backup.
pub const ROLE_BACKUP: &str = "backup";

/// Audience of the pod-bound token `custody-wait` presents to the agent.
pub const GATE_AUDIENCE: &str = "custody";
/// Audience of the token an agent presents to the controller's report service.
pub const REPORT_AUDIENCE: &str = "custody-report";
/// Name the agents' serving certificate carries and `custody-wait` checks.
pub const AGENT_SERVER_NAME: &str = "custody-agent";
/// Port the agent's gate listens on, on the node's address.
pub const GATE_PORT: u16 = 9443;
/// A gate certificate issued by custody's CA names its node: `<node>.gate.custody.io`.
pub const GATE_NAME_SUFFIX: &str = "gate.custody.io";
/// The environment variable with the gate's name that `custody-wait` and the mover check.
pub const ENV_AGENT_SERVER_NAME: &str = "CUSTODY_AGENT_SERVER_NAME";

/// TokenReview `extra` key naming the pod a token is bound to.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// TokenReview `extra` key naming the pod's name.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// TokenReview `extra` key naming the node the bound pod was scheduled to.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// Name of the init container the admission webhook injects into pods under restore.
pub const WAIT_CONTAINER: &str = "custody-wait";
/// In the injected `custody-wait` container's environment: the name of the Restore the pod
/// waits for. A pod's spec cannot change after it is created, so the agent holds the pod for
/// what this environment says, not for labels and annotations anyone who may patch the pod
/// can remove.
pub const ENV_RESTORE: &str = "CUSTODY_RESTORE";
/// In the injected `custody-wait` container's environment: the UID of that Restore.
pub const ENV_RESTORE_UID: &str = "CUSTODY_RESTORE_UID";
/// In the injected `custody-wait` container's environment: the comma-separated claims of the
/// pod that the Restore writes.
pub const ENV_RESTORED_CLAIMS: &str = "CUSTODY_RESTORED_CLAIMS";

/// On a PersistentVolumeClaim: custody knows the claim holds real data (an earlier Restore
/// verified it, or a Backup copied it), with which run. A pod labelled with a Cluster that no
/// longer exists is admitted only when every claim it mounts carries this.
pub const ANNOTATION_KNOWN_DATA: &str = "custody.io/known-data";
/// On a PersistentVolumeClaim, one annotation per Restore that verified it: this prefix, the
/// Restore's UID, and its name as the value (see [`verified_by_restore`]). The record lives
/// on the claim, so it outlives the Restore and goes with the claim: a claim deleted and made
/// again under its name has none. A pod still carrying `custody-wait` for a Restore that is
/// gone is released only when its claim carries that Restore's record.
pub const ANNOTATION_VERIFIED_BY_RESTORE_PREFIX: &str = "verified.custody.io/";

/// The annotation key recording, on a claim, that the Restore with UID `restore_uid` verified it.
pub fn verified_by_restore(restore_uid: &str) -> String {
    format!("{ANNOTATION_VERIFIED_BY_RESTORE_PREFIX}{restore_uid}")
}
/// The label that names a pod's Cluster: pods carrying it go through the admission webhook.
pub const LABEL_CLUSTER: &str = "custody.io/cluster";

/// Label naming the BackupPlan that created a Backup (the controller sets it; metrics and
/// `kubectl custody` read it).
pub const LABEL_PLAN: &str = "custody.io/backup-plan";
/// Label carrying that plan's UID: the proof a Backup is the plan's to prune.
pub const LABEL_PLAN_UID: &str = "custody.io/backup-plan-uid";

/// In `custody-wait`'s and a frozen backup's mover's environment: the agent's gate address
/// (`$(HOST_IP):9443`).
pub const ENV_AGENT_ADDRESS: &str = "CUSTODY_AGENT_ADDRESS";
/// In the same environments: the pod-bound token (audience [`GATE_AUDIENCE`]).
pub const ENV_TOKEN_FILE: &str = "CUSTODY_TOKEN_FILE";
/// In the same environments: the CA of the agents' gate certificate.
pub const ENV_CA_FILE: &str = "CUSTODY_CA_FILE";
