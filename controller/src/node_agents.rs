//! NodeAgent status from agent reports, as pure data: what a heartbeat writes, and when a
//! silent agent's node turns not Ready.

use std::time::Duration;

use custody_proto::gate::VolumeState;
use custody_proto::report::NodeReport;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::conditions::{self, Desired, Status, reasons, types};
use custody_kube::api::{self, NodeAgentStatus, ReportedMover, ReportedVolume, VolumeCounts};

/// `+12.3ms`, `-1.250s`: an offset as people read it.
pub fn format_offset(nanos: i64) -> String {
    let sign = if nanos < 0 { '-' } else { '+' };
    let magnitude = nanos.unsigned_abs();
    let text = if magnitude >= 1_000_000_000 {
        format!("{:.3}s", magnitude as f64 / 1e9)
    } else if magnitude >= 1_000_000 {
        format!("{:.1}ms", magnitude as f64 / 1e6)
    } else {
        format!("{:.1}µs", magnitude as f64 / 1e3)
    };
    format!("{sign}{text}")
}

/// Whether a node whose agent was last heard at `last_heartbeat` is Ready at `now`.
pub fn readiness(last_heartbeat: Option<Timestamp>, now: Timestamp, timeout: Duration) -> Desired {
    let Some(last) = last_heartbeat else {
        return Desired {
            type_: types::READY,
            status: Status::Unknown,
            reason: reasons::NO_HEARTBEAT,
            message: "the agent has not reported yet".to_string(),
        };
    };
    let silent = now.duration_since(last);
    let silent = Duration::try_from(silent).unwrap_or(Duration::ZERO);
    if silent > timeout {
        Desired {
            type_: types::READY,
            status: Status::False,
            reason: reasons::HEARTBEAT_MISSED,
            // Names the last heartbeat rather than the time since, so that later checks
            // find nothing to change.
            message: format!(
                "no report from the agent since {last} (timeout {}s)",
                timeout.as_secs()
            ),
        }
    } else {
        Desired {
            type_: types::READY,
            status: Status::True,
            reason: reasons::HEARTBEAT_RECEIVED,
            message: "the agent reports".to_string(),
        }
    }
}

fn ready_condition(current: &[Condition], desired: &Desired, now: Timestamp) -> Condition {
    conditions::next(current, desired, None, now).unwrap_or_else(|| {
        current
            .iter()
            .find(|condition| condition.type_ == desired.type_)
            .cloned()
            .expect("next() returns None only when the condition exists")
    })
}

/// At most this many volumes are listed in a NodeAgent's `restoredVolumes` (the counts
/// include every one), so the object stays far below etcd's 1.5 MiB whatever a node reports:
/// 512 volumes with messages at their bound take about 400 KiB.
pub const MAX_LISTED_VOLUMES: usize = 512;
/// A listed volume's message is cut to this many bytes.
pub const MAX_VOLUME_MESSAGE: usize = 512;

/// At most this many movers are listed in a NodeAgent's `movers` (the agent sends no more).
pub const MAX_LISTED_MOVERS: usize = 128;

/// A mover as a NodeAgent lists it; its names are cut to what Kubernetes allows.
fn reported_mover(mover: &custody_proto::report::MoverProgress) -> ReportedMover {
    let cut = |text: &str, at: usize| crate::events::cut(text, at);
    ReportedMover {
        namespace: cut(&mover.namespace, 63),
        pod_name: cut(&mover.pod_name, 253),
        pod_uid: cut(&mover.pod_uid, 64),
        job_name: cut(&mover.job_name, 63),
        owner_uid: cut(&mover.owner_uid, 64),
        operation: cut(&mover.operation, 16),
        volume: cut(&mover.volume, 253),
        bytes_done: mover.bytes_done,
        files_done: mover.files_done,
        bytes_total: mover.bytes_total,
        files_total: mover.files_total,
        bytes_sent: mover.bytes_sent,
    }
}

/// The status a heartbeat writes: everything the report service owns, with `Ready` True.
pub fn status_from_report(
    report: &NodeReport,
    current: Option<&NodeAgentStatus>,
    now: Timestamp,
) -> NodeAgentStatus {
    let mut counts = VolumeCounts::default();
    let mut restored_volumes = Vec::with_capacity(report.volumes.len());
    for volume in &report.volumes {
        let (slot, state) = match VolumeState::try_from(volume.state) {
            Ok(VolumeState::Pending) | Ok(VolumeState::Unspecified) | Err(_) => {
                (&mut counts.pending, api::VolumeState::Pending)
            }
            Ok(VolumeState::Restoring) => (&mut counts.restoring, api::VolumeState::Restoring),
            Ok(VolumeState::Verifying) => (&mut counts.verifying, api::VolumeState::Verifying),
            Ok(VolumeState::Verified) => (&mut counts.verified, api::VolumeState::Verified),
            Ok(VolumeState::Failed) => (&mut counts.failed, api::VolumeState::Failed),
        };
        *slot += 1;
        let text = |value: &str| Some(value.to_string()).filter(|value| !value.is_empty());
        restored_volumes.push(ReportedVolume {
            namespace: volume.namespace.clone(),
            pod_name: volume.pod_name.clone(),
            pod_uid: volume.pod_uid.clone(),
            claim_name: volume.claim_name.clone(),
            restore_uid: volume.restore_uid.clone(),
            state,
            reason: text(&volume.reason),
            message: text(&volume.message)
                .map(|message| crate::events::cut(&message, MAX_VOLUME_MESSAGE)),
        });
    }
    // Volumes whose restore still needs the report first; Verified ones are left out first.
    restored_volumes.sort_by(|a, b| {
        let key = |volume: &ReportedVolume| {
            (
                volume.state == api::VolumeState::Verified,
                volume.namespace.clone(),
                volume.pod_name.clone(),
                volume.claim_name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let omitted = restored_volumes.len().saturating_sub(MAX_LISTED_VOLUMES);
    restored_volumes.truncate(MAX_LISTED_VOLUMES);
    let current_conditions = current
        .map(|status| status.conditions.as_slice())
        .unwrap_or(&[]);
    let ready = Desired {
        type_: types::READY,
        status: Status::True,
        reason: reasons::HEARTBEAT_RECEIVED,
        message: "the agent reports".to_string(),
    };
    NodeAgentStatus {
        agent_version: Some(report.agent_version.clone()).filter(|version| !version.is_empty()),
        last_heartbeat_time: Some(Time(now)),
        clock_offset: report.clock.map(|clock| format_offset(clock.offset_nanos)),
        clock_offset_nanoseconds: report.clock.map(|clock| clock.offset_nanos),
        round_trip_nanoseconds: report.clock.map(|clock| clock.round_trip_nanos),
        volumes: Some(counts),
        restored_volumes,
        omitted_volumes: u32::try_from(omitted).ok().filter(|omitted| *omitted > 0),
        movers: report
            .movers
            .iter()
            .take(MAX_LISTED_MOVERS)
            .map(reported_mover)
            .collect(),
        conditions: vec![ready_condition(current_conditions, &ready, now)],
    }
}

/// The status to write when the agent fell silent: everything the report service owns,
/// unchanged, with `Ready` as [`readiness`] says. `None` when nothing changes.
pub fn status_after_silence(
    current: &NodeAgentStatus,
    now: Timestamp,
    timeout: Duration,
) -> Option<NodeAgentStatus> {
    let last = current.last_heartbeat_time.as_ref().map(|time| time.0);
    let desired = readiness(last, now, timeout);
    let next = conditions::next(&current.conditions, &desired, None, now)?;
    Some(NodeAgentStatus {
        conditions: vec![next],
        ..current.clone()
    })
}

#[cfg(test)]
mod tests;
