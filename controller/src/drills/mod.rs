//! Restore drills: a BackupPlan with `spec.drill` restores its newest completed Backup, on the
//! drill's schedule, into a throwaway Cluster (`<plan>-drill`, in the drill's namespace), lets
//! the agent verify it like any restore, starts a copy of the application on it, runs the
//! user's engine check against it as a Job, records the result on the plan and the Backup
//! (condition `Drilled`, Events, `custody_drills_finished_total` and the plan's drill gauges)
//! and deletes what it made.
//!
//! One step per reconciliation, decided by [`decide::step`] from what it read; the run and the
//! UID of each object it made are in the plan's `status.drill.current` before the next step,
//! so that a restarted controller resumes it and deletes only what it recorded. A result is
//! written before anything is deleted (`status.drill.last` of the same start time as
//! `current`); `current` is forgotten once everything it made is gone, claims included.
//!
//! The plan's schedule reconciler never writes `status.drill`: this one owns it (its own field
//! manager), and the condition `Drilled`.

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::conditions::{self, Desired, Status};
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::{self, Context};
use custody_kube::api::{
    Backup, BackupPlan, Cluster, Drill, DrillRun, DrillStatus, HasConditions, Restore,
};
use decide::{CheckSeen, Found, Make, Names, PodSeen, Seen, Start, Step, Whose, reasons};

/// The action Events of this reconciler name.
pub const ACTION: &str = "Drill";
/// Field manager of a plan's `status.drill` and of the `Drilled` conditions.
pub const FIELD_MANAGER: &str = "custody.io/drill";
/// The condition a drill writes on its plan and on the Backup it restored.
pub const DRILLED: &str = "Drilled";
/// How often a running drill is looked at.
const POLL: Duration = Duration::from_secs(5);

/// Reconciles one plan's drills.
pub async fn reconcile(plan: Arc<BackupPlan>, context: Arc<Context>) -> Result<Action> {
    let ours = plan.finalizers().iter().any(|f| f == decide::FINALIZER);
    if plan.spec.drill.is_none() && drill_status(&plan).current.is_none() && !ours {
        return Ok(Action::await_change());
    }
    let _measure = reconciler::Measure::start(&context.metrics, "Drill");
    // Decided on the plan as the API server has it: a status written a moment ago is not
    // rolled back.
    let Some(plan) = crate::status::fresh(&*plan, &context.client).await? else {
        return Ok(Action::await_change());
    };
    let status = drill_status(&plan);
    let names = Names::of(&plan.name_any());
    let deleting = plan.metadata.deletion_timestamp.is_some();
    match (&status.current, &plan.spec.drill) {
        (Some(run), _) if finished(&status, run) => {
            clean_up(&context, &plan, &status, run, &names).await
        }
        (Some(run), Some(drill)) if !deleting => {
            advance(&context, &plan, drill, &status, run, &names).await
        }
        // The drill was taken off the plan, or the plan is being deleted, while one ran: it
        // ends without judging the Backup, and what it made goes.
        (Some(run), _) => {
            let message = if deleting {
                "the plan was deleted while its drill ran"
            } else {
                "the plan's drill was removed while it ran"
            };
            finish(
                &context,
                &plan,
                &status,
                run,
                false,
                reasons::CANCELLED,
                message,
            )
            .await
        }
        // No drill runs: the plan's deletion (or a drill taken off) no longer waits for one.
        (None, _) if ours && (deleting || plan.spec.drill.is_none()) => {
            let plans: Api<BackupPlan> = Api::namespaced(
                context.client.clone(),
                &plan.namespace().unwrap_or_default(),
            );
            let what = format!("BackupPlan {}", describe(&plan));
            crate::finalizers::remove(&plans, &plan, decide::FINALIZER, &what).await?;
            Ok(Action::await_change())
        }
        (None, Some(drill)) if !deleting => maybe_start(&context, &plan, drill, &status).await,
        (None, _) => Ok(Action::await_change()),
    }
}

fn describe(plan: &BackupPlan) -> String {
    format!(
        "{}/{}",
        plan.namespace().unwrap_or_default(),
        plan.name_any()
    )
}

fn drill_status(plan: &BackupPlan) -> DrillStatus {
    plan.status
        .as_ref()
        .and_then(|status| status.drill.clone())
        .unwrap_or_default()
}

/// Whether `run`'s result is recorded already (it is being cleaned up).
fn finished(status: &DrillStatus, run: &DrillRun) -> bool {
    status
        .last
        .as_ref()
        .is_some_and(|last| last.started_at == run.started_at)
}

async fn maybe_start(
    context: &Context,
    plan: &BackupPlan,
    drill: &Drill,
    status: &DrillStatus,
) -> Result<Action> {
    if plan.spec.suspend {
        return Ok(Action::await_change());
    }
    let namespace = plan.namespace().unwrap_or_default();
    let uid = plan.uid().unwrap_or_default();
    let backups = Api::<Backup>::namespaced(context.client.clone(), &namespace)
        .list(
            &ListParams::default()
                .labels(&format!("{}={uid}", crate::plans::decide::LABEL_PLAN_UID)),
        )
        .await
        .map_err(Error::read(format!(
            "Backups of plan {namespace}/{}",
            plan.name_any()
        )))?
        .items;
    let created = plan
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|time| time.0)
        .unwrap_or_else(Timestamp::now);
    let now = Timestamp::now();
    match decide::start(drill, Some(status), created, now, &backups) {
        Err(message) => {
            let note = Note::warning(reasons::INVALID_SCHEDULE, format!("drill {message}"));
            write(
                context,
                plan,
                status,
                Some(drilled_false(reasons::INVALID_SCHEDULE, &note.text)),
            )
            .await?;
            reconciler::publish(context, plan, ACTION, &note).await?;
            Ok(Action::await_change())
        }
        Ok(Start::Wait { next }) => Ok(until(next, now)),
        Ok(Start::NothingToDrill { slot, next }) => {
            let mut next_status = status.clone();
            next_status.last_schedule_time = Some(Time(slot));
            write(context, plan, &next_status, None).await?;
            let note = Note::warning(
                reasons::NO_BACKUP,
                format!(
                    "the drill of {slot} found no completed Backup of this plan to restore; the next drill is at {next}"
                ),
            );
            reconciler::publish(context, plan, ACTION, &note).await?;
            Ok(until(next, now))
        }
        Ok(Start::Run { slot, backup }) => {
            // The plan's deletion waits for what the drill makes to be deleted.
            let plans: Api<BackupPlan> = Api::namespaced(context.client.clone(), &namespace);
            let what = format!("BackupPlan {}", describe(plan));
            if crate::finalizers::add(&plans, plan, decide::FINALIZER, &what).await? {
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            let run = DrillRun {
                id: nonce(),
                backup: backup.clone(),
                namespace: decide::namespace(plan, drill),
                started_at: Time(now),
                waiting_for: None,
                imported_backup_uid: None,
                cluster_uid: None,
                stateful_set_uid: None,
                job_uid: None,
            };
            let next_status = DrillStatus {
                last_schedule_time: Some(Time(slot)),
                current: Some(run.clone()),
                ..status.clone()
            };
            write(context, plan, &next_status, None).await?;
            let note = Note::normal(
                reasons::STARTED,
                format!(
                    "restore drill of Backup {backup} into {}/{} started",
                    run.namespace,
                    Names::of(&plan.name_any()).base
                ),
            );
            reconciler::publish(context, plan, ACTION, &note).await?;
            Ok(Action::requeue(Duration::from_millis(200)))
        }
    }
}

/// A random run identity (16 hex digits): the process's random hashing keys over the time.
fn nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|time| time.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:016x}", hasher.finish())
}

/// The requeue until `next` (at most an hour: a changed schedule is seen by the watch).
fn until(next: Timestamp, now: Timestamp) -> Action {
    let wait = next.duration_since(now).unsigned_abs();
    Action::requeue(wait.clamp(Duration::from_millis(200), Duration::from_secs(3600)))
}

/// Reads `name` in `namespace`; `None` when it does not exist.
async fn get<K>(context: &Context, namespace: &str, name: &str) -> Result<Option<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
{
    Api::<K>::namespaced(context.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::read(format!("{} {namespace}/{name}", K::kind(&()))))
}

/// What the step of `run` needs, read and judged.
async fn see(
    context: &Context,
    plan: &BackupPlan,
    run: &DrillRun,
    names: &Names,
    elsewhere: bool,
) -> Result<Seen> {
    let plan_uid = &plan.uid().unwrap_or_default();
    let namespace = &run.namespace;
    let run_id = decide::run_id(run);
    let judge = |meta: &kube::api::ObjectMeta, recorded: Option<&String>| {
        decide::whose(
            &Found::of(meta),
            recorded.map(String::as_str),
            plan_uid,
            &run_id,
        )
    };
    let mut seen = Seen::default();
    if elsewhere && let Some(backup) = get::<Backup>(context, namespace, &names.base).await? {
        let phase = backup.status.as_ref().and_then(|status| status.phase);
        seen.imported = Some((
            judge(&backup.metadata, run.imported_backup_uid.as_ref()),
            phase,
            ready_message(&backup),
        ));
    }
    if let Some(cluster) = get::<Cluster>(context, namespace, &names.base).await? {
        let whose = judge(&cluster.metadata, run.cluster_uid.as_ref());
        if whose == Whose::Recorded
            && let Some(restore) = cluster
                .status
                .as_ref()
                .and_then(|status| status.restore_name.clone())
            && let Some(restore) = get::<Restore>(context, namespace, &restore).await?
        {
            let phase = restore
                .status
                .as_ref()
                .and_then(|status| status.phase)
                .unwrap_or_default();
            seen.restore = Some((phase, ready_message(&restore)));
        }
        seen.cluster = Some(whose);
    }
    if let Some(set) = get::<StatefulSet>(context, namespace, &names.base).await? {
        let whose = judge(&set.metadata, run.stateful_set_uid.as_ref());
        if whose == Whose::Recorded
            && let Some(pod) = get::<Pod>(context, namespace, &names.pod).await?
            && crate::ownership::created_by_stateful_set(
                &pod.metadata,
                &set.uid().unwrap_or_default(),
            )
        {
            seen.pod = Some(pod_seen(&pod));
        }
        seen.stateful_set = Some(whose);
    } else {
        // Before the drill's StatefulSet exists, no claim under its names may: it would be
        // somebody else's.
        let home = plan.namespace().unwrap_or_default();
        let source = match get::<Cluster>(context, &home, &plan.spec.cluster_ref.name).await? {
            Some(cluster) => {
                get::<StatefulSet>(context, &home, &cluster.spec.stateful_set_ref.name).await?
            }
            None => None,
        };
        if let Some(source) = source {
            let source = serde_json::to_value(&source)
                .map_err(|error| Error::Schedule(error.to_string()))?;
            for claim in decide::claim_names(names, &source) {
                if get::<PersistentVolumeClaim>(context, namespace, &claim)
                    .await?
                    .is_some()
                {
                    seen.taken.push(claim);
                }
            }
        }
    }
    if let Some(job) = get::<Job>(context, namespace, &names.job).await? {
        let whose = judge(&job.metadata, run.job_uid.as_ref());
        let check = if whose == Whose::Recorded {
            check_of(context, namespace, &job).await?
        } else {
            CheckSeen::Running
        };
        seen.job = Some((whose, check));
    }
    Ok(seen)
}

/// The `Ready` condition's message of a custody object.
fn ready_message(object: &impl HasConditions) -> String {
    object
        .conditions()
        .iter()
        .find(|condition| condition.type_ == conditions::types::READY)
        .map(|condition| condition.message.clone())
        .unwrap_or_default()
}

fn pod_seen(pod: &Pod) -> PodSeen {
    let status = pod.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|condition| condition.type_ == "Ready" && condition.status == "True");
    let containers = status.container_statuses.clone().unwrap_or_default();
    let restarts = containers
        .iter()
        .map(|container| container.restart_count)
        .max()
        .unwrap_or_default();
    let trouble = containers.iter().find_map(|container| {
        let last = container
            .last_state
            .as_ref()
            .and_then(|state| state.terminated.as_ref())
            .map(|terminated| {
                format!(
                    "container {} last exited {}{}",
                    container.name,
                    terminated.exit_code,
                    terminated
                        .message
                        .as_deref()
                        .map(|message| format!(": {}", decide::tail(message, 768)))
                        .unwrap_or_default()
                )
            });
        let waiting = container
            .state
            .as_ref()
            .and_then(|state| state.waiting.as_ref())
            .and_then(|waiting| waiting.reason.clone())
            .map(|reason| format!("container {} {reason}", container.name));
        match (last, waiting) {
            (Some(last), Some(waiting)) => Some(format!("{waiting}; {last}")),
            (last, waiting) => last.or(waiting),
        }
    });
    PodSeen {
        ready,
        ip: status.pod_ip.filter(|ip| !ip.is_empty()),
        restarts,
        trouble,
    }
}

/// The check Job's end, with its pod's termination message (the end of its output).
async fn check_of(context: &Context, namespace: &str, job: &Job) -> Result<CheckSeen> {
    let conditions: Vec<(String, String, String, String)> = job
        .status
        .iter()
        .flat_map(|status| status.conditions.iter().flatten())
        .map(|condition| {
            (
                condition.type_.clone(),
                condition.status.clone(),
                condition.reason.clone().unwrap_or_default(),
                condition.message.clone().unwrap_or_default(),
            )
        })
        .collect();
    let job_uid = job.uid().unwrap_or_default();
    let pods = Api::<Pod>::namespaced(context.client.clone(), namespace)
        .list(
            &ListParams::default().labels(&format!("batch.kubernetes.io/controller-uid={job_uid}")),
        )
        .await
        .map_err(Error::read(format!(
            "the pods of Job {namespace}/{}",
            job.name_any()
        )))?;
    let output = pods
        .items
        .iter()
        .filter(|pod| crate::ownership::created_by_job(&pod.metadata, &job_uid))
        .flat_map(|pod| {
            pod.status
                .iter()
                .flat_map(|status| status.container_statuses.iter().flatten())
        })
        .find_map(|container| {
            let terminated = container.state.as_ref()?.terminated.as_ref()?;
            Some(format!(
                "exit {}{}",
                terminated.exit_code,
                terminated
                    .message
                    .as_deref()
                    .map(|message| format!(", {message}"))
                    .unwrap_or_default()
            ))
        });
    Ok(decide::check_seen(&conditions, output.as_deref()))
}

async fn advance(
    context: &Context,
    plan: &BackupPlan,
    drill: &Drill,
    status: &DrillStatus,
    run: &DrillRun,
    names: &Names,
) -> Result<Action> {
    let elsewhere = run.namespace != plan.namespace().unwrap_or_default();
    let seen = see(context, plan, run, names, elsewhere).await?;
    let timeout = drill
        .timeout_seconds
        .map(|seconds| Duration::from_secs(seconds.unsigned_abs()))
        .unwrap_or(decide::DEFAULT_TIMEOUT);
    let step = decide::step(run, elsewhere, &seen, Timestamp::now(), timeout, names);
    tracing::debug!(plan = plan.name_any(), ?step, "drill step");
    match step {
        Step::Finish {
            passed,
            reason,
            message,
        } => finish(context, plan, status, run, passed, reason, &message).await,
        Step::Wait(what) => {
            if run.waiting_for.as_deref() != Some(what.as_str()) {
                let mut next = status.clone();
                next.current = Some(DrillRun {
                    waiting_for: Some(what),
                    ..run.clone()
                });
                write(context, plan, &next, None).await?;
            }
            Ok(Action::requeue(POLL))
        }
        Step::Adopt(what, uid) => record(context, plan, status, run, what, uid).await,
        Step::Make(what) => match make(context, plan, drill, run, names, what, timeout).await? {
            Made::Created(uid) => record(context, plan, status, run, what, uid).await,
            Made::Refused(message) => {
                finish(
                    context,
                    plan,
                    status,
                    run,
                    false,
                    reasons::REFUSED,
                    &message,
                )
                .await
            }
        },
    }
}

/// Records `uid` as the object `what` of `run`.
async fn record(
    context: &Context,
    plan: &BackupPlan,
    status: &DrillStatus,
    run: &DrillRun,
    what: Make,
    uid: String,
) -> Result<Action> {
    if uid.is_empty() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let mut run = run.clone();
    let slot = match what {
        Make::ImportedBackup => &mut run.imported_backup_uid,
        Make::Cluster => &mut run.cluster_uid,
        Make::StatefulSet => &mut run.stateful_set_uid,
        Make::Job => &mut run.job_uid,
    };
    *slot = Some(uid);
    let mut next = status.clone();
    next.current = Some(run);
    write(context, plan, &next, None).await?;
    Ok(Action::requeue(Duration::from_millis(200)))
}

enum Made {
    Created(String),
    /// The drill cannot go on (a source gone, a Backup without a snapshot elsewhere).
    Refused(String),
}

async fn make(
    context: &Context,
    plan: &BackupPlan,
    drill: &Drill,
    run: &DrillRun,
    names: &Names,
    what: Make,
    timeout: Duration,
) -> Result<Made> {
    let home = plan.namespace().unwrap_or_default();
    let plan_uid = plan.uid().unwrap_or_default();
    let namespace = &run.namespace;
    let Some(backup) = get::<Backup>(context, &home, &run.backup).await? else {
        return Ok(Made::Refused(format!(
            "Backup {home}/{} is gone",
            run.backup
        )));
    };
    let cluster_name = &plan.spec.cluster_ref.name;
    let Some(source) = get::<Cluster>(context, &home, cluster_name).await? else {
        return Ok(Made::Refused(format!(
            "Cluster {home}/{cluster_name} is gone: the drill copies its StatefulSet"
        )));
    };
    let set_name = &source.spec.stateful_set_ref.name;
    let Some(set) = get::<StatefulSet>(context, &home, set_name).await? else {
        return Ok(Made::Refused(format!(
            "StatefulSet {home}/{set_name} of Cluster {cluster_name} is gone: the drill copies it"
        )));
    };
    let set = serde_json::to_value(&set).map_err(|error| Error::Schedule(error.to_string()))?;
    let elsewhere = namespace != &home;
    let mut object = match what {
        Make::ImportedBackup => {
            let Some(snapshot) = backup
                .status
                .as_ref()
                .and_then(|status| status.artifact.as_ref())
                .and_then(|artifact| artifact.snapshot.as_ref())
                .and_then(|snapshot| snapshot.id.clone())
            else {
                return Ok(Made::Refused(format!(
                    "Backup {home}/{} is not a snapshot of an encrypted repository: a drill in another namespace restores one imported there",
                    run.backup
                )));
            };
            decide::imported_backup(
                names,
                run,
                drill,
                &snapshot,
                &backup.spec.cluster_ref.name,
                &plan_uid,
            )
        }
        Make::Cluster => {
            let (from, repository) = if elsewhere {
                (
                    names.base.clone(),
                    drill.repository_ref.as_ref().map(|r| r.name.as_str()),
                )
            } else {
                (run.backup.clone(), None)
            };
            decide::cluster(
                names,
                run,
                &from,
                &source.spec.volume_claim_templates,
                repository,
                &plan_uid,
                timeout,
            )
        }
        Make::StatefulSet => match decide::stateful_set(names, run, &set, &plan_uid) {
            Ok(object) => object,
            Err(message) => return Ok(Made::Refused(message)),
        },
        Make::Job => {
            let Some(pod) = get::<Pod>(context, namespace, &names.pod).await? else {
                return Ok(Made::Created(String::new()));
            };
            let ip = pod
                .status
                .and_then(|status| status.pod_ip)
                .unwrap_or_default();
            decide::check_job(names, run, drill, &set["spec"]["template"], &ip, &plan_uid)
        }
    };
    // In the plan's own namespace what the drill makes is also the plan's (deleted with it).
    if !elsewhere && let Some(owner) = crate::ownership::controller_reference(plan) {
        object["metadata"]["ownerReferences"] = json!([owner]);
    }
    match what {
        Make::ImportedBackup => create::<Backup>(context, namespace, object).await,
        Make::Cluster => create::<Cluster>(context, namespace, object).await,
        Make::StatefulSet => create::<StatefulSet>(context, namespace, object).await,
        Make::Job => create::<Job>(context, namespace, object).await,
    }
}

/// Creates `object` in `namespace`; its UID (empty when the name was taken meanwhile: the next
/// step judges whose it is).
async fn create<K>(context: &Context, namespace: &str, object: serde_json::Value) -> Result<Made>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + serde::Serialize,
{
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let what = format!("{} {namespace}/{name}", K::kind(&()));
    let object: K = serde_json::from_value(object)
        .map_err(|error| Error::Schedule(format!("{what}: {error}")))?;
    match Api::<K>::namespaced(context.client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
    {
        Ok(created) => {
            tracing::info!(object = what, "drill made");
            Ok(Made::Created(created.uid().unwrap_or_default()))
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Made::Created(String::new())),
        // Refused for good (forbidden, invalid, over quota, a webhook's no): the drill ends
        // saying why rather than trying forever.
        Err(kube::Error::Api(status))
            if (400..500).contains(&status.code) && status.code != 429 =>
        {
            Ok(Made::Refused(format!(
                "creating {what} was refused ({}): {}",
                status.code, status.message
            )))
        }
        Err(source) => Err(Error::Create {
            object: what,
            source,
        }),
    }
}

/// Records the end of `run` (before anything it made is deleted): `status.drill.last`, the
/// `Drilled` conditions of the plan and of the Backup, Events, the counter.
async fn finish(
    context: &Context,
    plan: &BackupPlan,
    status: &DrillStatus,
    run: &DrillRun,
    passed: bool,
    reason: &'static str,
    message: &str,
) -> Result<Action> {
    let now = Timestamp::now();
    let next = decide::finished(status, run, passed, reason, message, now);
    let condition = if passed {
        Desired {
            type_: DRILLED,
            status: Status::True,
            reason,
            message: message.to_string(),
        }
    } else {
        drilled_false(reason, message)
    };
    let note = if passed {
        Note::normal(reason, message.to_string())
    } else {
        Note::warning(reason, message.to_string())
    };
    // A cancelled drill judged nothing: no condition on the Backup nor a new one on the plan.
    let cancelled = reason == reasons::CANCELLED;
    // The Backup first: once the plan records the result, this run is only cleaned up.
    let home = plan.namespace().unwrap_or_default();
    let backup = match cancelled {
        true => None,
        false => get::<Backup>(context, &home, &run.backup).await?,
    };
    if let Some(backup) = &backup {
        let backups: Api<Backup> = Api::namespaced(context.client.clone(), &home);
        let conditions = conditions::wanted(
            backup.conditions(),
            std::slice::from_ref(&condition),
            backup.meta().generation,
            now,
        );
        crate::status::apply(
            &backups,
            &run.backup,
            FIELD_MANAGER,
            &format!("Backup {home}/{}", run.backup),
            &json!({"conditions": conditions}),
        )
        .await?;
    }
    write(context, plan, &next, (!cancelled).then_some(condition)).await?;
    let result = next
        .last
        .as_ref()
        .map(|last| last.result.clone())
        .unwrap_or_default();
    context.metrics.drill_finished(&result, reason);
    reconciler::publish(context, plan, ACTION, &note).await?;
    if let Some(backup) = &backup {
        reconciler::publish(context, backup, ACTION, &note).await?;
    }
    tracing::info!(
        plan = plan.name_any(),
        backup = run.backup,
        passed,
        reason,
        "drill finished"
    );
    Ok(Action::requeue(Duration::from_millis(200)))
}

/// Deletes what `run` made (each by its recorded UID, or, not yet recorded, by this plan's
/// label and this run's identity), waits until it and the claims its StatefulSet made are
/// gone, then forgets the run. A deletion refused is said in `waitingFor` and tried again.
async fn clean_up(
    context: &Context,
    plan: &BackupPlan,
    status: &DrillStatus,
    run: &DrillRun,
    names: &Names,
) -> Result<Action> {
    let namespace = &run.namespace;
    let mine = Mine {
        plan_uid: plan.uid().unwrap_or_default(),
        run_id: decide::run_id(run),
    };
    let mut left = Vec::new();
    left.extend(
        remove::<Job>(
            context,
            namespace,
            &names.job,
            run.job_uid.as_deref(),
            &mine,
        )
        .await?,
    );
    let set = &names.base;
    let set_uid = run.stateful_set_uid.as_deref();
    left.extend(remove::<StatefulSet>(context, namespace, set, set_uid, &mine).await?);
    left.extend(
        remove::<Cluster>(context, namespace, set, run.cluster_uid.as_deref(), &mine).await?,
    );
    let imported = run.imported_backup_uid.as_deref();
    left.extend(remove::<Backup>(context, namespace, set, imported, &mine).await?);
    if let Some(set_uid) = set_uid {
        // The claims the StatefulSet made (its retention policy deletes them with it): those
        // its controller made it the owner of.
        let claims = Api::<PersistentVolumeClaim>::namespaced(context.client.clone(), namespace)
            .list(&ListParams::default().labels(&format!("{}={set}", decide::LABEL_DRILL)))
            .await
            .map_err(Error::read(format!(
                "the claims of StatefulSet {namespace}/{set}"
            )))?;
        left.extend(
            claims
                .items
                .iter()
                .filter(|claim| {
                    claim
                        .owner_references()
                        .iter()
                        .any(|owner| owner.uid == set_uid)
                })
                .map(|claim| format!("claim {}", claim.name_any())),
        );
    }
    if !left.is_empty() {
        let what = format!("clean-up: {}", left.join(", "));
        if run.waiting_for.as_deref() != Some(what.as_str()) {
            let mut next = status.clone();
            next.current = Some(DrillRun {
                waiting_for: Some(what),
                ..run.clone()
            });
            write(context, plan, &next, None).await?;
        }
        return Ok(Action::requeue(POLL));
    }
    let next = DrillStatus {
        current: None,
        ..status.clone()
    };
    write(context, plan, &next, None).await?;
    tracing::info!(
        plan = plan.name_any(),
        backup = run.backup,
        "drill cleaned up"
    );
    Ok(Action::requeue(Duration::from_millis(200)))
}

/// Whose a run's objects are: the plan's UID and the run's identity.
struct Mine {
    plan_uid: String,
    run_id: String,
}

/// Deletes `name` if it is the run's: the object with the recorded `uid`, or, none recorded,
/// one this run made ([`decide::whose`] says `Adopt`), by its UID (a precondition). What is
/// left of it (`None`: gone, or never the run's); an object under the name that is not the
/// run's is left alone.
async fn remove<K>(
    context: &Context,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    mine: &Mine,
) -> Result<Option<String>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
{
    let Some(object) = get::<K>(context, namespace, name).await? else {
        return Ok(None);
    };
    let found = Found::of(object.meta());
    let uid = match decide::whose(
        &found,
        uid.filter(|uid| !uid.is_empty()),
        &mine.plan_uid,
        &mine.run_id,
    ) {
        Whose::Recorded => found.uid.clone(),
        Whose::Adopt(uid) => uid,
        Whose::Foreign => return Ok(None),
    };
    let kind = K::kind(&());
    if object.meta().deletion_timestamp.is_some() {
        return Ok(Some(format!("{kind} {name} to be deleted")));
    }
    let parameters = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match Api::<K>::namespaced(context.client.clone(), namespace)
        .delete(name, &parameters)
        .await
    {
        Ok(_) => {
            tracing::info!(
                namespace,
                name,
                kind = kind.as_ref(),
                "drill object deleted"
            );
            Ok(Some(format!("{kind} {name} to be deleted")))
        }
        Err(kube::Error::Api(error)) if error.code == 404 || error.code == 409 => Ok(None),
        // Refused (RBAC taken away, a webhook): said, and tried again.
        Err(kube::Error::Api(error)) if (400..500).contains(&error.code) => Ok(Some(format!(
            "{kind} {name}, whose deletion was refused ({}): {}",
            error.code, error.message
        ))),
        Err(source) => Err(Error::Delete {
            object: format!("{kind} {namespace}/{name}"),
            source,
        }),
    }
}

fn drilled_false(reason: &'static str, message: &str) -> Desired {
    Desired {
        type_: DRILLED,
        status: Status::False,
        reason,
        message: message.to_string(),
    }
}

/// Applies `status.drill` (and `condition`, when given) under this reconciler's field manager.
async fn write(
    context: &Context,
    plan: &BackupPlan,
    drill: &DrillStatus,
    condition: Option<Desired>,
) -> Result<()> {
    let namespace = plan.namespace().unwrap_or_default();
    let name = plan.name_any();
    let current = plan
        .status
        .as_ref()
        .map(|status| status.conditions.clone())
        .unwrap_or_default();
    // Every apply carries the `Drilled` condition this manager owns: one it left out would be
    // removed.
    let conditions = match condition {
        Some(condition) => conditions::wanted(
            &current,
            std::slice::from_ref(&condition),
            plan.meta().generation,
            Timestamp::now(),
        ),
        None => current
            .into_iter()
            .filter(|condition| condition.type_ == DRILLED)
            .collect(),
    };
    let patch = json!({"drill": drill, "conditions": conditions});
    let plans: Api<BackupPlan> = Api::namespaced(context.client.clone(), &namespace);
    crate::status::apply(
        &plans,
        &name,
        FIELD_MANAGER,
        &format!("BackupPlan {namespace}/{name}"),
        &patch,
    )
    .await?;
    Ok(())
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(plan: Arc<BackupPlan>, error: &Error, context: Arc<Context>) -> Action {
    reconciler::error_policy(&*plan, error, &context)
}

/// The controller: plans with drills (a running drill is looked at every few seconds).
pub fn controller(
    context: Arc<Context>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let plans: Api<BackupPlan> = reconciler::scoped(context.client.clone(), namespace);
    let controller = Controller::new(plans, watcher::Config::default());
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}
