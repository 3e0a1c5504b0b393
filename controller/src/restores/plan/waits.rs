//! How a Restore waits or stops, as plain data: the status and conditions it writes (only
//! when they change), the Warning the first time a reason appears, and why a volume gets no
//! trusted report from its node.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{Facts, Plan};
use crate::conditions::{self, Desired, Status};
use crate::events::Note;
use crate::restores::{reasons, types};
use custody_kube::api::{Restore, RestorePhase, RestoreStatus, VolumeRestoreStatus, VolumeState};

/// How a Restore that cannot go on stops: still `Pending` (it waits for something), or
/// `Failed` (final).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// Pending, with a Warning the first time this reason appears.
    Wait,
    /// Pending for an ordinary reason: no Event.
    WaitQuietly,
    /// Failed, with a Warning.
    Fail,
}

/// The plan of a Restore that stops at `Pending` or `Failed` with `reason`: its status says
/// why (the volumes as they were), with a Warning the first time the reason appears (none for
/// [`Stop::WaitQuietly`]); a wait looks again after `retry` seconds.
pub(super) fn stop(
    facts: &Facts,
    how: Stop,
    reason: &'static str,
    message: String,
    retry: u64,
) -> Plan {
    let restore = &facts.restore;
    let mut status = restore.status.clone().unwrap_or_default();
    let failed = how == Stop::Fail;
    status.phase = Some(if failed {
        RestorePhase::Failed
    } else {
        RestorePhase::Pending
    });
    if failed {
        status.completion_time.get_or_insert(Time(facts.now));
    }
    let ready = desired(types::READY, Status::False, reason, message.clone());
    let verified = desired(
        types::VERIFIED,
        if failed {
            Status::False
        } else {
            Status::Unknown
        },
        reason,
        message.clone(),
    );
    let new_reason = !restore
        .status
        .iter()
        .flat_map(|status| status.conditions.iter())
        .any(|condition| condition.type_ == types::READY && condition.reason == reason);
    Plan {
        status: next_status(restore, status, &[ready, verified], facts.now),
        events: if how != Stop::WaitQuietly && new_reason {
            vec![Note::warning(reason, message)]
        } else {
            Vec::new()
        },
        requeue: (!failed).then(|| Duration::from_secs(retry)),
        ..Plan::wait_for_change()
    }
}

pub(super) fn desired(
    type_: &'static str,
    status: Status,
    reason: &'static str,
    message: String,
) -> Desired {
    Desired {
        type_,
        status,
        reason,
        message,
    }
}

/// `status` with the `wanted` conditions (their transition times kept unless they flip), or
/// `None` when that is what the Restore already says. Conditions other writers own
/// (`AnnotationsRecognized`) are theirs: only ours are compared and written.
pub fn next_status(
    restore: &Restore,
    mut status: RestoreStatus,
    wanted: &[Desired],
    now: Timestamp,
) -> Option<RestoreStatus> {
    let mut current = restore.status.clone().unwrap_or_default();
    status.conditions = conditions::wanted(
        &current.conditions,
        wanted,
        restore.metadata.generation,
        now,
    );
    current.conditions = conditions::owned(&current.conditions, wanted);
    (status != current).then_some(status)
}

/// Why a volume of this Restore gets no trusted report: the pod that mounts its claim is
/// scheduled to a node whose agent does not report (`AgentMissing`) or stopped reporting
/// (`AgentNotReady`). `None` when a trusted agent reports it, or its pod is not scheduled
/// yet, or the volume is already Verified or Failed.
pub(super) fn agent_problem(
    facts: &Facts,
    set_name: &str,
    claim: &str,
    previous: Option<&VolumeRestoreStatus>,
) -> Option<(&'static str, String)> {
    if previous
        .is_some_and(|volume| matches!(volume.state, VolumeState::Verified | VolumeState::Failed))
    {
        return None;
    }
    // The claim `<template>-<set>-<ordinal>` belongs to the pod `<set>-<ordinal>`.
    let ordinal = claim.rsplit('-').next()?;
    let pod = format!("{set_name}-{ordinal}");
    let node = facts.workload_pods.get(&pod)?.as_ref()?;
    match facts.nodes.get(node) {
        None => Some((
            reasons::AGENT_MISSING,
            format!(
                "pod {pod} is on node {node}, where no custody agent reports: its volume cannot be restored or verified there, and the pod stays held (is the agent DaemonSet running on that node?)"
            ),
        )),
        Some(health) if !health.ready => Some((
            reasons::AGENT_NOT_READY,
            format!(
                "pod {pod} is on node {node}, whose custody agent is not ready (last report {}): nothing there is trusted until it reports again, and the pod stays held",
                health
                    .last_heartbeat
                    .map(|time| time.to_string())
                    .unwrap_or_else(|| "never".to_string())
            ),
        )),
        Some(_) => None,
    }
}
