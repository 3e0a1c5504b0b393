//! Labels, annotations and audiences both sides of custody agree on. The controller (and its
//! webhook) writes them; the agent reads them.

/// On a workload pod under restore: the name of the Restore writing its volumes.
pub const ANNOTATION_RESTORE: &str = "custody.io/restore";
/// On a workload pod under restore: comma-separated PersistentVolumeClaim names whose data
/// the Restore writes. The pod is released only when each of them is verified.
pub const ANNOTATION_RESTORED_CLAIMS: &str = "custody.io/restored-claims";
/// On workload pods under restore and on prepareData pods: UID of the Restore.
pub const LABEL_RESTORE_UID: &str = "custody.io/restore-uid";
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

/// TokenReview `extra` key naming the pod a token is bound to.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// TokenReview `extra` key naming the pod's name.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// TokenReview `extra` key naming the node the bound pod was scheduled to.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
