//! BackupPlan: creates a Backup for each schedule slot (one name per slot, so never twice),
//! skips a slot while the previous run is active (`Forbid`) or past its starting deadline,
//! and prunes the plan's finished Backups by count and age through normal deletion.

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::conditions::{self, Desired, Status, types};
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::{self, Context};
use custody_kube::api::{Backup, BackupPhase, BackupPlan, BackupPlanStatus, ConcurrencyPolicy};
use decide::{Due, LABEL_PLAN, LABEL_PLAN_UID};

/// Field manager of the plan's status.
pub const FIELD_MANAGER: &str = "custody.io/backup-plan";

/// Reasons of the plan's `Ready` condition and its Events.
pub mod reasons {
    pub const SCHEDULED: &str = "Scheduled";
    pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
    pub const INVALID_RETENTION: &str = "InvalidRetention";
    pub const SUSPENDED: &str = "Suspended";
    pub const PREVIOUS_RUN_ACTIVE: &str = "PreviousRunActive";
    pub const MISSED_SCHEDULE: &str = "MissedSchedule";
    pub const PRUNED: &str = "Pruned";
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

struct Plan<'a> {
    context: &'a Context,
    plan: &'a BackupPlan,
    namespace: String,
    name: String,
}

impl Plan<'_> {
    async fn write(&self, mut status: BackupPlanStatus, desired: &Desired) -> Result<()> {
        let current = self.plan.status.clone().unwrap_or_default();
        let condition = conditions::next(
            &current.conditions,
            desired,
            self.plan.meta().generation,
            Timestamp::now(),
        );
        let unchanged_condition = condition.is_none();
        status.conditions = match condition {
            Some(condition) => vec![condition],
            None => current
                .conditions
                .iter()
                .filter(|condition| condition.type_ == types::READY)
                .cloned()
                .collect(),
        };
        if unchanged_condition
            && status.last_schedule_time == current.last_schedule_time
            && status.last_backup_name == current.last_backup_name
        {
            return Ok(());
        }
        let api: Api<BackupPlan> = Api::namespaced(self.context.client.clone(), &self.namespace);
        crate::status::apply(
            &api,
            &self.name,
            FIELD_MANAGER,
            &format!("BackupPlan {}/{}", self.namespace, self.name),
            &status,
        )
        .await
    }

    async fn event(&self, warning: bool, reason: &str, text: String) -> Result<()> {
        let note = Note {
            warning,
            reason: reason.to_string(),
            text,
        };
        crate::reconciler::publish(self.context, self.plan, "Schedule", &note).await
    }
}

/// Reconciles one plan.
pub async fn reconcile(plan: Arc<BackupPlan>, context: Arc<Context>) -> Result<Action> {
    let _measure = reconciler::Measure::start(&context.metrics, "BackupPlan");
    run(&plan, &context).await
}

async fn run(plan: &BackupPlan, context: &Context) -> Result<Action> {
    let namespace = plan.namespace().unwrap_or_default();
    let name = plan.name_any();
    let uid = plan.metadata.uid.clone().unwrap_or_default();
    let writer = Plan {
        context,
        plan,
        namespace: namespace.clone(),
        name: name.clone(),
    };
    let mut status = plan.status.clone().unwrap_or_default();
    status.conditions.clear();

    let schedule = match decide::parse(&plan.spec.schedule) {
        Ok(schedule) => schedule,
        Err(message) => {
            writer
                .write(
                    status,
                    &ready(Status::False, reasons::INVALID_SCHEDULE, message.clone()),
                )
                .await?;
            writer
                .event(true, reasons::INVALID_SCHEDULE, message)
                .await?;
            return Ok(Action::await_change());
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
            writer
                .write(
                    status,
                    &ready(Status::False, reasons::INVALID_RETENTION, message.clone()),
                )
                .await?;
            return Ok(Action::await_change());
        }
    };

    let backups: Api<Backup> = Api::namespaced(context.client.clone(), &namespace);
    let mine: Vec<Backup> = backups
        .list(&ListParams::default().labels(&format!("{LABEL_PLAN_UID}={uid}")))
        .await
        .map_err(|source| Error::Read {
            object: format!("Backups of plan {namespace}/{name}"),
            source,
        })?
        .items;

    // Retention first: it only ever removes finished runs of this plan (label with its UID),
    // each deletion preconditioned on the UID that was judged.
    let runs: Vec<decide::Run> = mine
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
    for run in decide::prune(&runs, keep_last, max_age, Timestamp::now()) {
        let parameters = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(run.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match backups.delete(&run.name, &parameters).await {
            Ok(_) => {
                tracing::info!(namespace, plan = name, backup = run.name, "pruned");
                writer
                    .event(
                        false,
                        reasons::PRUNED,
                        format!("deleted Backup {} (retention)", run.name),
                    )
                    .await?;
            }
            Err(kube::Error::Api(error)) if error.code == 404 || error.code == 409 => {}
            Err(source) => {
                return Err(Error::Delete {
                    object: format!("Backup {namespace}/{}", run.name),
                    source,
                });
            }
        }
    }

    if plan.spec.suspend {
        writer
            .write(
                status,
                &ready(
                    Status::False,
                    reasons::SUSPENDED,
                    "the plan is suspended".into(),
                ),
            )
            .await?;
        return Ok(Action::await_change());
    }

    let since = status
        .last_schedule_time
        .as_ref()
        .map(|time| time.0)
        .or(plan.metadata.creation_timestamp.as_ref().map(|time| time.0))
        .unwrap_or_default();
    let now = Timestamp::now();
    let deadline = plan
        .spec
        .starting_deadline_seconds
        .map(|seconds| Duration::from_secs(seconds.max(1) as u64));
    let due = decide::due(&schedule, since, now, deadline).map_err(Error::Schedule)?;
    let next = match due {
        Due::Wait { next } => {
            let desired = scheduled(next);
            writer.write(status, &desired).await?;
            next
        }
        Due::Missed { slot, next } => {
            status.last_schedule_time = Some(Time(slot));
            let message = format!("the run of {slot} is past its starting deadline; skipped");
            writer.write(status, &scheduled(next)).await?;
            writer
                .event(true, reasons::MISSED_SCHEDULE, message)
                .await?;
            next
        }
        Due::Run { slot, next } => {
            let active = mine.iter().find(|backup| {
                !matches!(
                    backup.status.as_ref().and_then(|status| status.phase),
                    Some(BackupPhase::Completed | BackupPhase::Failed)
                )
            });
            status.last_schedule_time = Some(Time(slot));
            match (plan.spec.concurrency_policy, active) {
                (ConcurrencyPolicy::Forbid, Some(active)) => {
                    let message = format!(
                        "skipped the run of {slot}: Backup {} has not finished (concurrencyPolicy Forbid)",
                        active.name_any()
                    );
                    writer.write(status, &scheduled(next)).await?;
                    writer
                        .event(true, reasons::PREVIOUS_RUN_ACTIVE, message)
                        .await?;
                }
                _ => {
                    let run_name = decide::run_name(&name, slot, &schedule);
                    let backup: Backup = serde_json::from_value(serde_json::json!({
                        "apiVersion": "custody.io/v1alpha1",
                        "kind": "Backup",
                        "metadata": {
                            "name": run_name,
                            "labels": {LABEL_PLAN: name, LABEL_PLAN_UID: uid},
                        },
                        "spec": {
                            "clusterRef": plan.spec.cluster_ref,
                            "repositoryRef": plan.spec.repository_ref,
                        },
                    }))
                    .map_err(|error| Error::Schedule(error.to_string()))?;
                    match backups.create(&PostParams::default(), &backup).await {
                        Ok(_) => {
                            writer
                                .event(
                                    false,
                                    reasons::SCHEDULED,
                                    format!("created Backup {run_name} for {slot}"),
                                )
                                .await?;
                        }
                        // The slot's run exists already: created before a restart.
                        Err(kube::Error::Api(error)) if error.code == 409 => {}
                        Err(source) => {
                            return Err(Error::Create {
                                object: format!("Backup {namespace}/{run_name}"),
                                source,
                            });
                        }
                    }
                    status.last_backup_name = Some(run_name);
                    writer.write(status, &scheduled(next)).await?;
                }
            }
            next
        }
    };
    let wait = Duration::try_from(next.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO);
    Ok(Action::requeue(wait.max(Duration::from_millis(200))))
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(plan: Arc<BackupPlan>, error: &Error, context: Arc<Context>) -> Action {
    reconciler::error_policy(&*plan, error, &context)
}

/// The controller: plans, woken by their Backups' changes.
pub fn controller(
    context: Arc<Context>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let client = context.client.clone();
    let plans: Api<BackupPlan> = reconciler::scoped(client.clone(), namespace);
    let backups: Api<Backup> = reconciler::scoped(client, namespace);
    let controller = Controller::new(plans, watcher::Config::default()).watches(
        backups,
        watcher::Config::default().labels(LABEL_PLAN),
        |backup| {
            let plan = backup.labels().get(LABEL_PLAN).cloned();
            let namespace = backup.namespace();
            plan.map(|plan| {
                let reference = ObjectRef::<BackupPlan>::new(&plan);
                match namespace {
                    Some(namespace) => reference.within(&namespace),
                    None => reference,
                }
            })
        },
    );
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}
