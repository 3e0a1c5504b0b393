//! What one reconciliation of a BackupPlan does, decided from what it read: [`plan`] takes
//! the [`Facts`] and returns a [`Plan`] (the finished runs to prune, the run to create, the
//! status, the Events, when to look again). No API client here.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::decide::{self, Due, LABEL_PLAN, LABEL_PLAN_UID};
use super::reasons;
use crate::conditions::{self, Desired, Status, types};
use crate::error::{Error, Result};
use crate::events::Note;
use custody_kube::api::{Backup, BackupPhase, BackupPlan, BackupPlanStatus, ConcurrencyPolicy};

/// Everything a reconciliation of a BackupPlan read.
#[derive(Clone, Debug)]
pub struct Facts {
    pub plan: BackupPlan,
    pub now: Timestamp,
    /// The plan's own Backups (labelled with its UID).
    pub runs: Vec<Backup>,
    /// The Cluster the plan backs up, if it exists.
    pub cluster: Option<custody_kube::api::Cluster>,
}

/// A finished run that retention deletes (precondition on its UID), and what to say once it
/// is deleted.
#[derive(Clone, Debug, PartialEq)]
pub struct Prune {
    pub name: String,
    pub uid: String,
    pub note: Note,
}

/// What one reconciliation does, in this order: prune, create the slot's run (its Event only
/// when this call created it), write the status, publish the Events, look again.
#[derive(Clone, Debug)]
pub struct Plan {
    pub prune: Vec<Prune>,
    pub create: Option<(Backup, Note)>,
    pub status: Option<BackupPlanStatus>,
    pub events: Vec<Note>,
    pub requeue: Option<Duration>,
}

/// The plan of one reconciliation; an error when the schedule cannot be evaluated.
pub fn plan(facts: &Facts) -> Result<Plan> {
    let plan = &facts.plan;
    let mut status = plan.status.clone().unwrap_or_default();
    // `drill` is the drill reconciler's (its own field manager): never written from here.
    status.drill = None;
    let mut out = Plan {
        prune: Vec::new(),
        create: None,
        status: None,
        events: Vec::new(),
        requeue: None,
    };
    let schedule = match decide::parse(&plan.spec.schedule) {
        Ok(schedule) => schedule,
        Err(message) => {
            out.status = next_status(
                plan,
                status,
                &ready(Status::False, reasons::INVALID_SCHEDULE, message.clone()),
                facts.now,
            );
            out.events
                .push(Note::warning(reasons::INVALID_SCHEDULE, message));
            return Ok(out);
        }
    };
    let retention = plan.spec.retention.clone().unwrap_or_default();
    let max_age = match retention
        .max_age
        .as_deref()
        .map(decide::parse_age)
        .transpose()
    {
        Ok(age) => age,
        Err(message) => {
            out.status = next_status(
                plan,
                status,
                &ready(Status::False, reasons::INVALID_RETENTION, message),
                facts.now,
            );
            return Ok(out);
        }
    };

    // Retention first: it only ever removes finished runs of this plan (label with its UID),
    // each deletion preconditioned on the UID that was judged.
    let runs: Vec<decide::Run> = facts
        .runs
        .iter()
        .map(|backup| {
            let phase = backup.status.as_ref().and_then(|status| status.phase);
            decide::Run {
                name: backup.name_any(),
                uid: backup.metadata.uid.clone().unwrap_or_default(),
                created: backup
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|time| time.0)
                    .unwrap_or_default(),
                finished: matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed)),
                completed: phase == Some(BackupPhase::Completed),
            }
        })
        .collect();
    let keep_last = retention.keep_last.map(|keep| keep.max(1) as usize);
    out.prune = decide::prune(&runs, keep_last, max_age, facts.now)
        .into_iter()
        .map(|run| Prune {
            note: Note::normal(
                reasons::PRUNED,
                format!("deleted Backup {} (retention)", run.name),
            ),
            name: run.name.clone(),
            uid: run.uid.clone(),
        })
        .collect();

    if plan.spec.suspend {
        out.status = next_status(
            plan,
            status,
            &ready(
                Status::False,
                reasons::SUSPENDED,
                "the plan is suspended".into(),
            ),
            facts.now,
        );
        return Ok(out);
    }

    let since = status
        .last_schedule_time
        .as_ref()
        .map(|time| time.0)
        .or(plan.metadata.creation_timestamp.as_ref().map(|time| time.0))
        .unwrap_or_default();
    let deadline = plan
        .spec
        .starting_deadline_seconds
        .map(|seconds| Duration::from_secs(seconds.max(1) as u64));
    let due = decide::due(&schedule, since, facts.now, deadline).map_err(Error::Schedule)?;
    // A plan runs unattended: runs that would need the application stopped are not made. Its
    // slots pass meanwhile (recorded without a run or a Warning), so that naming a method later
    // does not start an old slot's run at once.
    if let Some(message) = decide::needs_a_person(&plan.spec, facts.cluster.as_ref()) {
        let next = match due {
            Due::Wait { next } => next,
            Due::Missed { slot, next } | Due::Run { slot, next } => {
                status.last_schedule_time = Some(Time(slot));
                next
            }
        };
        let new = !plan
            .status
            .iter()
            .flat_map(|status| status.conditions.iter())
            .any(|condition| condition.reason == reasons::CONSISTENCY_METHOD_REQUIRED);
        if new {
            out.events.push(Note::warning(
                reasons::CONSISTENCY_METHOD_REQUIRED,
                message.clone(),
            ));
        }
        out.status = next_status(
            plan,
            status,
            &ready(Status::False, reasons::CONSISTENCY_METHOD_REQUIRED, message),
            facts.now,
        );
        let wait = Duration::try_from(next.duration_since(facts.now)).unwrap_or(Duration::ZERO);
        out.requeue = Some(wait.clamp(Duration::from_millis(200), Duration::from_secs(60)));
        return Ok(out);
    }
    let next = match due {
        Due::Wait { next } => next,
        Due::Missed { slot, next } => {
            status.last_schedule_time = Some(Time(slot));
            out.events.push(Note::warning(
                reasons::MISSED_SCHEDULE,
                format!("the run of {slot} is past its starting deadline; skipped"),
            ));
            next
        }
        Due::Run { slot, next } => {
            let active = facts.runs.iter().find(|backup| {
                !matches!(
                    backup.status.as_ref().and_then(|status| status.phase),
                    Some(BackupPhase::Completed | BackupPhase::Failed)
                )
            });
            status.last_schedule_time = Some(Time(slot));
            match (plan.spec.concurrency_policy, active) {
                (ConcurrencyPolicy::Forbid, Some(active)) => {
                    out.events.push(Note::warning(
                        reasons::PREVIOUS_RUN_ACTIVE,
                        format!(
                            "skipped the run of {slot}: Backup {} has not finished (concurrencyPolicy Forbid)",
                            active.name_any()
                        ),
                    ));
                }
                _ => {
                    let run_name = decide::run_name(&plan.name_any(), slot, &schedule);
                    let backup = run(plan, &run_name)?;
                    out.create = Some((
                        backup,
                        Note::normal(
                            reasons::SCHEDULED,
                            format!("created Backup {run_name} for {slot}"),
                        ),
                    ));
                    status.last_backup_name = Some(run_name);
                }
            }
            next
        }
    };
    out.status = next_status(plan, status, &scheduled(next), facts.now);
    let wait = Duration::try_from(next.duration_since(facts.now)).unwrap_or(Duration::ZERO);
    out.requeue = Some(wait.max(Duration::from_millis(200)));
    Ok(out)
}

/// The Backup of one slot, labelled with the plan's name and UID.
fn run(plan: &BackupPlan, name: &str) -> Result<Backup> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Backup",
        "metadata": {
            "name": name,
            "labels": {LABEL_PLAN: plan.name_any(), LABEL_PLAN_UID: plan.metadata.uid},
        },
        "spec": {
            "clusterRef": plan.spec.cluster_ref,
            "repositoryRef": plan.spec.repository_ref,
            "consistency": plan.spec.consistency,
            "command": plan.spec.command,
        },
    }))
    .map_err(|error| Error::Schedule(error.to_string()))
}

fn ready(status: Status, reason: &'static str, message: String) -> Desired {
    Desired {
        type_: types::READY,
        status,
        reason,
        message,
    }
}

/// `Ready`: the plan is on schedule, next at `next`.
fn scheduled(next: Timestamp) -> Desired {
    ready(
        Status::True,
        reasons::SCHEDULED,
        format!("next run at {next}"),
    )
}

/// `status` with `desired` as its `Ready`; `None` when nothing changes.
fn next_status(
    plan: &BackupPlan,
    mut status: BackupPlanStatus,
    desired: &Desired,
    now: Timestamp,
) -> Option<BackupPlanStatus> {
    let mut current = plan.status.clone().unwrap_or_default();
    current.drill = None;
    let wanted = std::slice::from_ref(desired);
    status.conditions =
        conditions::wanted(&current.conditions, wanted, plan.meta().generation, now);
    current.conditions = conditions::owned(&current.conditions, wanted);
    (status != current).then_some(status)
}

#[cfg(test)]
mod tests;
