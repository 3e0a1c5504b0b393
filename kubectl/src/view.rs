//! What each command shows, computed from the objects as plain data (tested in `view/tests.rs`):
//! the commands fetch, these decide, [`crate::table`] prints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

use custody_kube::api::{
    Backup, BackupPhase, Cluster, NodeAgent, Restore, RestorePhase, Transfer, VolumeState,
};
use custody_proto::names::LABEL_PLAN;

#[cfg(test)]
mod tests;

/// `3h`, `2d`, `45s`: how long ago `then` was at `now`, as kubectl prints ages.
pub fn age(then: Timestamp, now: Timestamp) -> String {
    let seconds = now.duration_since(then).as_secs().max(0);
    match seconds {
        0..=119 => format!("{seconds}s"),
        120..=7_199 => format!("{}m", seconds / 60),
        7_200..=172_799 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

pub use custody_proto::progress::human_bytes as bytes;

/// How far a copy has come: `1.2 GiB / 3.0 GiB (40%)`, or the bytes alone without a total.
pub fn progress(transfer: Option<&Transfer>) -> String {
    let Some(transfer) = transfer else {
        return String::new();
    };
    match transfer.bytes_total {
        Some(total) if total > 0 => format!(
            "{} / {} ({}%)",
            bytes(transfer.bytes_done),
            bytes(total),
            transfer.bytes_done.saturating_mul(100) / total
        ),
        _ => bytes(transfer.bytes_done),
    }
}

/// A status's `Ready` condition.
pub(crate) fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions
        .iter()
        .find(|condition| condition.type_ == "Ready")
}

fn time(time: Option<&Time>) -> Option<Timestamp> {
    time.map(|time| time.0)
}

/// One Backup in a line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackupLine {
    pub name: String,
    pub phase: String,
    /// Why it failed (its `Ready` reason), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its completion (or creation, before it ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub progress: String,
}

fn backup_line(backup: &Backup) -> BackupLine {
    let status = backup.status.as_ref();
    let phase = status.and_then(|status| status.phase).unwrap_or_default();
    BackupLine {
        name: backup.name_any(),
        phase: format!("{phase:?}"),
        reason: (phase == BackupPhase::Failed)
            .then(|| status.and_then(|status| ready(&status.conditions)))
            .flatten()
            .map(|condition| condition.reason.clone()),
        at: status
            .and_then(|status| time(status.completion_time.as_ref()))
            .or_else(|| time(backup.metadata.creation_timestamp.as_ref())),
        progress: progress(status.and_then(|status| status.transfer.as_ref())),
    }
}

/// One Restore in a line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RestoreLine {
    pub name: String,
    pub phase: String,
    /// Its `Ready` reason while it runs or after it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `2/3 volumes verified`.
    pub volumes: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub progress: String,
}

fn restore_line(restore: &Restore) -> RestoreLine {
    let status = restore.status.as_ref();
    let phase = status.and_then(|status| status.phase).unwrap_or_default();
    let volumes = status
        .map(|status| status.volumes.as_slice())
        .unwrap_or(&[]);
    let verified = volumes
        .iter()
        .filter(|volume| volume.state == VolumeState::Verified)
        .count();
    RestoreLine {
        name: restore.name_any(),
        phase: format!("{phase:?}"),
        reason: (phase != RestorePhase::Completed)
            .then(|| status.and_then(|status| ready(&status.conditions)))
            .flatten()
            .map(|condition| condition.reason.clone()),
        volumes: format!("{verified}/{} volumes verified", volumes.len()),
        progress: progress(status.and_then(|status| status.transfer.as_ref())),
    }
}

/// What `status` says of one Cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatusView {
    pub namespace: String,
    pub cluster: String,
    pub phase: String,
    /// Its newest completed Backup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_success: Option<BackupLine>,
    /// Its newest Backup, whatever became of it, when that is not the last success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<BackupLine>,
    /// Backups running or waiting to.
    pub running: Vec<BackupLine>,
    /// Restores not finished yet (they hold the Cluster's pods).
    pub restoring: Vec<RestoreLine>,
}

/// Per Cluster (sorted by namespace and name): its last backups and unfinished restores.
/// Imported Backups (another cluster's snapshots) are no backup of a Cluster here.
pub fn status(
    clusters: &[Cluster],
    backups: &[Backup],
    restores: &[Restore],
) -> Vec<ClusterStatusView> {
    let mut views = Vec::new();
    for cluster in clusters {
        let namespace = cluster.namespace().unwrap_or_default();
        let name = cluster.name_any();
        let mut own: Vec<&Backup> = backups
            .iter()
            .filter(|backup| {
                backup.namespace().as_deref() == Some(namespace.as_str())
                    && backup.spec.cluster_ref.name == name
                    && backup.spec.imported_snapshot.is_none()
            })
            .collect();
        own.sort_by_key(|backup| backup.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let phase_of = |backup: &Backup| {
            backup
                .status
                .as_ref()
                .and_then(|status| status.phase)
                .unwrap_or_default()
        };
        let last_success = own
            .iter()
            .filter(|backup| phase_of(backup) == BackupPhase::Completed)
            .max_by_key(|backup| {
                backup
                    .status
                    .as_ref()
                    .and_then(|status| time(status.completion_time.as_ref()))
            })
            .map(|backup| backup_line(backup));
        let newest_ended = own
            .iter()
            .rev()
            .find(|backup| {
                matches!(
                    phase_of(backup),
                    BackupPhase::Completed | BackupPhase::Failed
                )
            })
            .map(|backup| backup_line(backup));
        let running = own
            .iter()
            .filter(|backup| {
                matches!(
                    phase_of(backup),
                    BackupPhase::Pending | BackupPhase::Running
                )
            })
            .map(|backup| backup_line(backup))
            .collect();
        let mut unfinished: Vec<&Restore> = restores
            .iter()
            .filter(|restore| {
                restore.namespace().as_deref() == Some(namespace.as_str())
                    && restore.spec.cluster_ref.name == name
                    && !matches!(
                        restore.status.as_ref().and_then(|status| status.phase),
                        Some(RestorePhase::Completed)
                    )
            })
            .collect();
        unfinished.sort_by_key(|restore| restore.metadata.creation_timestamp.as_ref().map(|t| t.0));
        views.push(ClusterStatusView {
            namespace: namespace.clone(),
            cluster: name,
            phase: format!(
                "{:?}",
                cluster
                    .status
                    .as_ref()
                    .and_then(|status| status.phase)
                    .unwrap_or_default()
            ),
            last_backup: newest_ended.filter(|line| Some(line) != last_success.as_ref()),
            last_success,
            running,
            restoring: unfinished
                .iter()
                .map(|restore| restore_line(restore))
                .collect(),
        });
    }
    views.sort_by(|a, b| (&a.namespace, &a.cluster).cmp(&(&b.namespace, &b.cluster)));
    views
}

/// What `nodes` says of one node's agent.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub node: String,
    /// `True` while the agent reports within the controller's timeout.
    pub ready: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_offset: Option<String>,
    /// Restored volumes on the node by state.
    pub volumes: BTreeMap<String, i32>,
    /// Movers running on the node: `backup shop/orders-0 data 40%`.
    pub movers: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Every node agent, sorted by node.
pub fn nodes(agents: &[NodeAgent]) -> Vec<NodeView> {
    let mut views: Vec<NodeView> = agents
        .iter()
        .map(|agent| {
            let status = agent.status.clone().unwrap_or_default();
            let condition = ready(&status.conditions);
            let counts = status.volumes.clone().unwrap_or_default();
            let volumes = [
                ("pending", counts.pending),
                ("restoring", counts.restoring),
                ("verifying", counts.verifying),
                ("verified", counts.verified),
                ("failed", counts.failed),
            ]
            .into_iter()
            .filter(|(_, count)| *count > 0)
            .map(|(state, count)| (state.to_string(), count))
            .collect();
            NodeView {
                node: agent.name_any(),
                ready: condition
                    .map(|condition| condition.status.clone())
                    .unwrap_or_else(|| "Unknown".to_string()),
                reason: condition
                    .filter(|condition| condition.status != "True")
                    .map(|condition| condition.reason.clone()),
                last_heartbeat: time(status.last_heartbeat_time.as_ref()),
                clock_offset: status.clock_offset.clone(),
                volumes,
                movers: status
                    .movers
                    .iter()
                    .map(|mover| {
                        let done = match mover.bytes_total {
                            Some(total) if total > 0 => {
                                format!("{}%", mover.bytes_done.saturating_mul(100) / total)
                            }
                            _ => bytes(mover.bytes_done),
                        };
                        format!(
                            "{} {}/{} {} {done}",
                            mover.operation, mover.namespace, mover.pod_name, mover.volume
                        )
                    })
                    .collect(),
                version: status.agent_version.clone(),
            }
        })
        .collect();
    views.sort_by(|a, b| a.node.cmp(&b.node));
    views
}

/// One of a held pod's volumes, as its Restore and the node's agent say.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeWhy {
    pub claim: String,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub progress: String,
    pub attempts: u32,
    /// The prepareData Job writing it, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

/// Everything a person needs to see why a pod is held.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    pub namespace: String,
    pub pod: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// One sentence: held or not, and by what.
    pub verdict: String,
    /// The Restore that writes its volumes, when one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_message: Option<String>,
    pub volumes: Vec<VolumeWhy>,
    /// Claims of the pod no Restore writes.
    pub unrestored_claims: Vec<String>,
    /// The last lines of `custody-wait` and of each volume's mover, filled in by the command.
    pub logs: BTreeMap<String, Vec<String>>,
}

/// The name of custody's init container that holds a pod.
pub const WAIT_CONTAINER: &str = "custody-wait";

/// The claims a pod mounts.
pub fn claims(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter_map(|volume| {
            volume
                .persistent_volume_claim
                .as_ref()
                .map(|claim| claim.claim_name.clone())
        })
        .collect()
}

/// The Restore of a pod: one of its Cluster (`cluster`, the pod's `custody.io/cluster` label)
/// or one that writes any of its `claims`; unfinished ones first (even before they list their
/// volumes), then the newest.
pub fn restore_of<'a>(
    restores: &'a [Restore],
    cluster: Option<&str>,
    claims: &[String],
) -> Option<&'a Restore> {
    restores
        .iter()
        .filter(|restore| {
            cluster == Some(restore.spec.cluster_ref.name.as_str())
                || restore.status.as_ref().is_some_and(|status| {
                    status
                        .volumes
                        .iter()
                        .any(|volume| claims.contains(&volume.claim_name))
                })
        })
        .max_by_key(|restore| {
            let finished = matches!(
                restore.status.as_ref().and_then(|status| status.phase),
                Some(RestorePhase::Completed | RestorePhase::Failed)
            );
            (
                !finished,
                restore.metadata.creation_timestamp.as_ref().map(|t| t.0),
            )
        })
}

fn format_phase(restore: &Restore) -> String {
    format!(
        "{:?}",
        restore
            .status
            .as_ref()
            .and_then(|status| status.phase)
            .unwrap_or_default()
    )
}

/// Why `pod` is (or is not) held, from the Restore writing its claims.
pub fn why(pod: &Pod, restores: &[Restore]) -> Why {
    let claims = claims(pod);
    let cluster = pod
        .labels()
        .get(custody_proto::names::LABEL_CLUSTER)
        .cloned();
    let restore = restore_of(restores, cluster.as_deref(), &claims);
    let status = pod.status.as_ref();
    let waiting = status
        .and_then(|status| status.init_container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|s| s.name == WAIT_CONTAINER));
    let has_wait = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.init_containers.as_ref())
        .is_some_and(|containers| containers.iter().any(|c| c.name == WAIT_CONTAINER));
    let wait_state = waiting.and_then(|status| status.state.as_ref());
    let volumes: Vec<VolumeWhy> = restore
        .and_then(|restore| restore.status.as_ref())
        .map(|status| {
            status
                .volumes
                .iter()
                .filter(|volume| claims.contains(&volume.claim_name))
                .map(|volume| VolumeWhy {
                    claim: volume.claim_name.clone(),
                    state: format!("{:?}", volume.state),
                    node: volume.node_name.clone(),
                    reason: volume.reason.clone(),
                    message: volume.message.clone(),
                    progress: progress(volume.transfer.as_ref()),
                    attempts: volume.attempts,
                    job: volume.job_name.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    let pending: Vec<&VolumeWhy> = volumes
        .iter()
        .filter(|volume| volume.state != format!("{:?}", VolumeState::Verified))
        .collect();
    let verdict = if !has_wait {
        "not held: custody-wait is not among its init containers (custody did not gate it)"
            .to_string()
    } else if wait_state.is_some_and(|state| {
        state
            .terminated
            .as_ref()
            .is_some_and(|terminated| terminated.exit_code == 0)
    }) {
        "released: custody-wait ended, every volume was verified".to_string()
    } else if pending.is_empty() && !volumes.is_empty() {
        "held by custody-wait, though every volume is verified: it is being released".to_string()
    } else if let (true, Some(restore)) = (volumes.is_empty(), restore) {
        format!(
            "held by custody-wait: Restore {} ({}) has not reached its volumes yet",
            restore.name_any(),
            format_phase(restore)
        )
    } else if volumes.is_empty() {
        "held by custody-wait, and no Restore writes its claims: it waits for one to start"
            .to_string()
    } else {
        format!(
            "held by custody-wait until {} verified: {}",
            if pending.len() == 1 {
                "its volume is"
            } else {
                "its volumes are"
            },
            pending
                .iter()
                .map(|volume| match &volume.reason {
                    Some(reason) => format!("{} {} ({reason})", volume.claim, volume.state),
                    None => format!("{} {}", volume.claim, volume.state),
                })
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let restored: Vec<&String> = volumes.iter().map(|volume| &volume.claim).collect();
    Why {
        namespace: pod.namespace().unwrap_or_default(),
        pod: pod.name_any(),
        node: pod.spec.as_ref().and_then(|spec| spec.node_name.clone()),
        verdict,
        restore: restore.map(restore_line),
        restore_message: restore
            .and_then(|restore| restore.status.as_ref())
            .and_then(|status| ready(&status.conditions))
            .map(|condition| condition.message.clone())
            .filter(|message| !message.is_empty()),
        unrestored_claims: claims
            .iter()
            .filter(|claim| !restored.contains(claim))
            .cloned()
            .collect(),
        volumes,
        logs: BTreeMap::new(),
    }
}

/// The Backup a plan would create now (as the controller's scheduler does, under the name
/// given): its Cluster, repository, consistency and command, labelled with the plan.
pub fn backup_from_plan(plan: &custody_kube::api::BackupPlan, name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Backup",
        "metadata": {
            "name": name,
            "labels": {
                LABEL_PLAN: plan.name_any(),
                custody_proto::names::LABEL_PLAN_UID: plan.metadata.uid,
            },
        },
        "spec": {
            "clusterRef": plan.spec.cluster_ref,
            "repositoryRef": plan.spec.repository_ref,
            "consistency": plan.spec.consistency,
            "command": plan.spec.command,
        },
    })
}
