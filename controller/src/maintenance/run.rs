//! Carrying out a repository's maintenance: what its Job left read, the next step taken
//! (a Job created, a run recorded), the status written.

use std::time::Duration;

use custody_kube::api::{BackupRepository, EncryptedRepository, MaintenanceRun, MaintenanceStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::{Resource, ResourceExt};

use super::{
    CHECKED, FIELD_MANAGER, Seen, Settings, Step, TASKS, Task, View, WHILE_RUNNING, decide, job,
    job_name, outcome, reasons, run_of,
};
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::Context;

async fn seen(client: &kube::Client, namespace: &str, name: &str) -> Result<Seen> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let Some(job) = jobs
        .get_opt(name)
        .await
        .map_err(Error::read(format!("Job {namespace}/{name}")))?
    else {
        return Ok(Seen::Gone);
    };
    let state = crate::backups::decide::job_state(&job);
    if state == crate::backups::decide::JobState::Running {
        return Ok(Seen::Running);
    }
    let pods = crate::mover_job::pods_of(client, namespace, name, Some(&job)).await?;
    let report = crate::backups::gather::report(&pods);
    Ok(match state {
        crate::backups::decide::JobState::Failed { message } => Seen::Failed { message, report },
        _ => Seen::Succeeded(report),
    })
}

/// Starts, waits for and records the repository's maintenance; when to look again.
pub async fn maintain(
    context: &Context,
    mover: &crate::mover_job::MoverJob,
    repository: &BackupRepository,
    encrypted: &EncryptedRepository,
    ready: bool,
) -> Result<Option<Duration>> {
    // Decided on the object as the API server has it now: a Job started a moment ago is
    // not started twice.
    let Some(repository) = crate::status::fresh(repository, &context.client).await? else {
        return Ok(None);
    };
    let namespace = repository.namespace().unwrap_or_default();
    let name = repository.name_any();
    let status = repository
        .status
        .as_ref()
        .and_then(|status| status.maintenance.clone());
    let running = TASKS.into_iter().find_map(|task| {
        run_of(status.as_ref(), task)
            .and_then(|run| run.job.clone())
            .map(|job| (task, job))
    });
    let seen = match &running {
        Some((_, job)) => Some(seen(&context.client, &namespace, job).await?),
        None => None,
    };
    let settings = Settings::of(repository.spec.maintenance.as_ref());
    let annotations = repository.annotations();
    let now = Timestamp::now();
    let step = decide(&View {
        now,
        created: repository
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|time| time.0),
        settings: &settings,
        status: status.as_ref(),
        requested: TASKS.map(|task| annotations.get(task.requested()).map(String::as_str)),
        seen: seen.as_ref(),
        ready,
    });
    let mut status = status.unwrap_or_default();
    let checked = repository
        .status
        .as_ref()
        .and_then(|status| {
            status
                .conditions
                .iter()
                .find(|condition| condition.type_ == CHECKED)
        })
        .cloned();
    match step {
        Step::Wait(_) => Ok(Some(WHILE_RUNNING)),
        Step::Idle { after } => Ok(after),
        Step::Start { task, request } => {
            let job_name = job_name(&name, task, now);
            let spec = job(&job_name, &repository, encrypted, task, &settings, mover);
            Api::<Job>::namespaced(context.client.clone(), &namespace)
                .create(&PostParams::default(), &spec)
                .await
                .map_err(|source| Error::Create {
                    object: format!("Job {namespace}/{job_name}"),
                    source,
                })?;
            let previous = run_of(Some(&status), task).cloned().unwrap_or_default();
            let run = MaintenanceRun {
                job: Some(job_name.clone()),
                request: request.or(previous.request.clone()),
                start_time: Some(Time(now)),
                ..previous
            };
            set_run(&mut status, task, run);
            write(context, &repository, &status, checked).await?;
            let note = Note {
                warning: false,
                reason: reasons::STARTED.into(),
                text: format!("{} started (Job {job_name})", task.name()),
            };
            crate::reconciler::publish(context, &repository, "Maintain", &note).await?;
            Ok(Some(WHILE_RUNNING))
        }
        Step::Record(task) => {
            let seen = seen.unwrap_or(Seen::Gone);
            let ended = outcome(task, &seen);
            let previous = run_of(Some(&status), task).cloned().unwrap_or_default();
            let job_name = previous.job.clone().unwrap_or_default();
            let run = MaintenanceRun {
                job: None,
                completion_time: Some(Time(Timestamp::now())),
                succeeded: Some(ended.succeeded),
                message: Some(ended.message.clone()),
                prune: ended.prune.clone().or(previous.prune.clone()),
                check: ended.check.clone().or(previous.check.clone()),
                ..previous
            };
            set_run(&mut status, task, run);
            let checked = match &ended.checked {
                Some(desired) => {
                    let current: Vec<_> = checked.iter().cloned().collect();
                    crate::conditions::next(
                        &current,
                        desired,
                        repository.meta().generation,
                        Timestamp::now(),
                    )
                    .or(checked)
                }
                None => checked,
            };
            write(context, &repository, &status, checked).await?;
            tracing::info!(
                namespace,
                name,
                task = task.name(),
                succeeded = ended.succeeded,
                message = ended.message,
                "maintenance recorded"
            );
            crate::reconciler::publish(context, &repository, "Maintain", &ended.note).await?;
            if seen != Seen::Gone {
                let _ = Api::<Job>::namespaced(context.client.clone(), &namespace)
                    .delete(
                        &job_name,
                        &DeleteParams {
                            propagation_policy: Some(PropagationPolicy::Background),
                            ..DeleteParams::default()
                        },
                    )
                    .await;
            }
            Ok(Some(Duration::from_secs(1)))
        }
    }
}

fn set_run(status: &mut MaintenanceStatus, task: Task, run: MaintenanceRun) {
    match task {
        Task::Prune => status.prune = Some(run),
        Task::Check => status.check = Some(run),
    }
}

/// Writes `status.maintenance` and this manager's `Checked` condition (kept, or it would be
/// dropped: the manager owns what it last applied).
async fn write(
    context: &Context,
    repository: &BackupRepository,
    status: &MaintenanceStatus,
    checked: Option<custody_kube::api::Condition>,
) -> Result<()> {
    let namespace = repository.namespace().unwrap_or_default();
    let name = repository.name_any();
    let api: Api<BackupRepository> = Api::namespaced(context.client.clone(), &namespace);
    crate::status::apply(
        &api,
        &name,
        FIELD_MANAGER,
        &format!("BackupRepository {namespace}/{name}"),
        &serde_json::json!({
            "maintenance": status,
            "conditions": checked.into_iter().collect::<Vec<_>>(),
        }),
    )
    .await
    .map(|_| ())
}
