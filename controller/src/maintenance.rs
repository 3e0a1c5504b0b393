//! Repository maintenance: the prune and the check of a BackupRepository's encrypted
//! repository, each a Job running `custody-mover prune` or `custody-mover check`, owned by the
//! BackupRepository, one at a time (a check beside a prune would read packs being deleted).
//! Each runs `spec.maintenance.{prune,check}IntervalHours` after the previous one (or after the
//! BackupRepository was created), and at once when its request annotation holds a value not
//! answered yet. What they did goes to `status.maintenance`, the `Checked` condition (checks)
//! and Events; the Job is deleted once recorded.
//!
//! [`decide`] and [`outcome`] are the rules, pure; [`maintain`] reads and writes.

use std::time::Duration;

use custody_kube::api::{
    BackupRepository, CheckResult, EncryptedRepository, MaintenanceRun, MaintenanceStatus,
    PruneResult, RepositoryMaintenance,
};
use custody_proto::mover::{Failure, Invocation, Report, RepositoryArgs};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;

use crate::annotations::{CHECK_REQUESTED, PRUNE_REQUESTED};
use crate::conditions::{Desired, Status};
use crate::events::Note;

/// Field manager of `status.maintenance` and the `Checked` condition.
pub const FIELD_MANAGER: &str = "custody.io/repository-maintenance";
/// The condition a check sets.
pub const CHECKED: &str = "Checked";
/// [`custody_proto::names::LABEL_ROLE`] of a maintenance Job's pod.
pub const ROLE_MAINTENANCE: &str = "maintenance";
/// The BackupRepository a maintenance Job works for.
pub const LABEL_REPOSITORY_UID: &str = "custody.io/repository-uid";

pub const DEFAULT_PRUNE_HOURS: u64 = 24;
pub const DEFAULT_CHECK_HOURS: u64 = 168;
pub const DEFAULT_READ_DATA_PERCENT: u8 = 10;
/// How often a running Job is looked at besides its own changes.
const WHILE_RUNNING: Duration = Duration::from_secs(15);

/// Reasons of the `Checked` condition and of maintenance Events.
mod run;
pub use run::maintain;

pub mod reasons {
    pub const CHECK_PASSED: &str = "CheckPassed";
    pub const CHECK_FOUND_ERRORS: &str = "CheckFoundErrors";
    pub const CHECK_FAILED: &str = "CheckFailed";
    pub const PRUNED: &str = "Pruned";
    pub const PRUNE_FAILED: &str = "PruneFailed";
    pub const STARTED: &str = "MaintenanceStarted";
}

/// The two kinds of maintenance, in the order they are considered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    Prune,
    Check,
}

pub const TASKS: [Task; 2] = [Task::Prune, Task::Check];

impl Task {
    pub fn name(self) -> &'static str {
        match self {
            Task::Prune => "prune",
            Task::Check => "check",
        }
    }

    fn requested(self) -> &'static str {
        match self {
            Task::Prune => PRUNE_REQUESTED,
            Task::Check => CHECK_REQUESTED,
        }
    }
}

/// When each runs, from `spec.maintenance` (absent: the defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `None`: only on request.
    pub prune_every: Option<Duration>,
    pub check_every: Option<Duration>,
    pub read_data_percent: u8,
}

impl Settings {
    pub fn of(spec: Option<&RepositoryMaintenance>) -> Settings {
        let hours = |value: Option<i32>, default: u64| {
            let hours = value.map_or(default, |hours| u64::try_from(hours).unwrap_or(0));
            (hours > 0).then(|| Duration::from_secs(hours * 3600))
        };
        Settings {
            prune_every: hours(
                spec.and_then(|spec| spec.prune_interval_hours),
                DEFAULT_PRUNE_HOURS,
            ),
            check_every: hours(
                spec.and_then(|spec| spec.check_interval_hours),
                DEFAULT_CHECK_HOURS,
            ),
            read_data_percent: spec
                .and_then(|spec| spec.check_read_data_percent)
                .map_or(DEFAULT_READ_DATA_PERCENT, |percent| {
                    u8::try_from(percent.clamp(0, 100)).unwrap_or(100)
                }),
        }
    }

    fn every(&self, task: Task) -> Option<Duration> {
        match task {
            Task::Prune => self.prune_every,
            Task::Check => self.check_every,
        }
    }
}

/// The run of `task` in `status`.
pub fn run_of(status: Option<&MaintenanceStatus>, task: Task) -> Option<&MaintenanceRun> {
    let status = status?;
    match task {
        Task::Prune => status.prune.as_ref(),
        Task::Check => status.check.as_ref(),
    }
}

/// What a running maintenance Job is doing, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Deleted before it was recorded.
    Gone,
    Running,
    /// Finished; the mover's termination message.
    Succeeded(Option<String>),
    /// Failed (the Job's reason), and the mover's termination message if it left one.
    Failed {
        message: String,
        report: Option<String>,
    },
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The task's Job runs: look again later.
    Wait(Task),
    /// The task's Job ended (or vanished): record how.
    Record(Task),
    /// Start the task, answering `request` if it was asked for.
    Start { task: Task, request: Option<String> },
    /// Nothing to do; the next scheduled run is due after this long (`None`: none scheduled).
    Idle { after: Option<Duration> },
}

/// What [`decide`] looks at.
pub struct View<'a> {
    pub now: Timestamp,
    /// When the BackupRepository was created: the first scheduled runs count from there.
    pub created: Option<Timestamp>,
    pub settings: &'a Settings,
    pub status: Option<&'a MaintenanceStatus>,
    /// The request annotations' values: prune, check.
    pub requested: [Option<&'a str>; 2],
    /// The recorded running Job, as read (`None` when none is recorded).
    pub seen: Option<&'a Seen>,
    /// Whether a new run may start (the repository is Ready and encrypted).
    pub ready: bool,
}

/// The next step: a recorded Job first (waited for, then recorded), then a request not yet
/// answered, then a run that is due; prune before check.
pub fn decide(view: &View<'_>) -> Step {
    for task in TASKS {
        if run_of(view.status, task).is_some_and(|run| run.job.is_some()) {
            return match view.seen {
                Some(Seen::Running) => Step::Wait(task),
                _ => Step::Record(task),
            };
        }
    }
    if !view.ready {
        return Step::Idle { after: None };
    }
    for (task, requested) in TASKS.into_iter().zip(view.requested) {
        let answered = run_of(view.status, task).and_then(|run| run.request.as_deref());
        if let Some(requested) = requested
            && Some(requested) != answered
        {
            return Step::Start {
                task,
                request: Some(requested.to_string()),
            };
        }
    }
    let mut after: Option<Duration> = None;
    for task in TASKS {
        let Some(every) = view.settings.every(task) else {
            continue;
        };
        let since = run_of(view.status, task)
            .and_then(|run| run.start_time.as_ref())
            .map(|time| time.0)
            .or(view.created)
            .unwrap_or(view.now);
        let elapsed = view.now.duration_since(since);
        let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
        if elapsed >= every {
            return Step::Start {
                task,
                request: None,
            };
        }
        let left = every - elapsed;
        after = Some(after.map_or(left, |after| after.min(left)));
    }
    Step::Idle { after }
}

/// How a finished run is recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub succeeded: bool,
    pub message: String,
    pub prune: Option<PruneResult>,
    pub check: Option<CheckResult>,
    /// The `Checked` condition after a check.
    pub checked: Option<Desired>,
    pub note: Note,
}

fn bytes(count: u64) -> String {
    bytesize::ByteSize::b(count).to_string()
}

/// The mover's result in `text`, if the run succeeded and left one; else why not.
fn result<T: for<'de> serde::Deserialize<'de>>(
    text: &str,
    job_failure: Option<&str>,
) -> std::result::Result<T, String> {
    match custody_proto::mover::read_report::<T>(text) {
        Report::Done(result) if job_failure.is_none() => Ok(result),
        Report::Done(_) => Err(job_failure.unwrap_or_default().to_string()),
        Report::Failed(Failure { reason, message }) => {
            Err(format!("{}: {message}", reason.as_str()))
        }
        Report::Unreadable(message) => Err(format!("the mover's report cannot be read: {message}")),
    }
}

/// What a run that ended as `seen` did.
pub fn outcome(task: Task, seen: &Seen) -> Outcome {
    let (report, job_failure) = match seen {
        Seen::Succeeded(report) => (report.as_deref(), None),
        Seen::Failed { message, report } => (report.as_deref(), Some(message.as_str())),
        Seen::Gone => (None, Some("its Job was deleted before it was recorded")),
        Seen::Running => (None, Some("it is still running")),
    };
    let failed = |message: String| {
        let (reason, checked) = match task {
            Task::Prune => (reasons::PRUNE_FAILED, None),
            Task::Check => (
                reasons::CHECK_FAILED,
                Some(Desired {
                    type_: CHECKED,
                    status: Status::Unknown,
                    reason: reasons::CHECK_FAILED,
                    message: format!("the check could not run: {message}"),
                }),
            ),
        };
        Outcome {
            succeeded: false,
            message: message.clone(),
            prune: None,
            check: None,
            checked,
            note: Note {
                warning: true,
                reason: reason.into(),
                text: format!("the {} failed: {message}", task.name()),
            },
        }
    };
    let Some(text) = report else {
        return failed(
            job_failure
                .unwrap_or("the mover left no report")
                .to_string(),
        );
    };
    match task {
        Task::Prune => match result::<PruneResult>(text, job_failure) {
            Ok(result) => {
                let message = format!(
                    "deleted {} pack(s) ({}) marked at least 23 h ago; marked {} pack(s) ({}) to \
                     delete after 23 h; recovered {}, repacked {}; the snapshots use {}",
                    result.packs_deleted,
                    bytes(result.bytes_deleted),
                    result.packs_marked,
                    bytes(result.bytes_marked),
                    result.packs_recovered,
                    result.packs_repacked,
                    bytes(result.bytes_used),
                );
                Outcome {
                    succeeded: true,
                    message: message.clone(),
                    prune: Some(result),
                    check: None,
                    checked: None,
                    note: Note {
                        warning: false,
                        reason: reasons::PRUNED.into(),
                        text: message,
                    },
                }
            }
            Err(message) => failed(message),
        },
        Task::Check => match result::<CheckResult>(text, job_failure) {
            Ok(result) => {
                let read = match result.read_data_percent {
                    0 => "structure only".to_string(),
                    percent => format!("{percent}% of the packs read whole"),
                };
                let (status, reason, warning, message) = if result.passed {
                    (
                        Status::True,
                        reasons::CHECK_PASSED,
                        false,
                        format!(
                            "no errors in the index, packs and snapshots ({read}; {} warning(s))",
                            result.warnings
                        ),
                    )
                } else {
                    (
                        Status::False,
                        reasons::CHECK_FOUND_ERRORS,
                        true,
                        format!(
                            "{} error(s) ({read}): {}",
                            result.errors,
                            result.findings.join("; ")
                        ),
                    )
                };
                Outcome {
                    succeeded: true,
                    message: message.clone(),
                    prune: None,
                    check: Some(result),
                    checked: Some(Desired {
                        type_: CHECKED,
                        status,
                        reason,
                        message: message.clone(),
                    }),
                    note: Note {
                        warning,
                        reason: reason.into(),
                        text: message,
                    },
                }
            }
            Err(message) => failed(message),
        },
    }
}

/// The name of a maintenance Job: the repository's name (shortened), the task and the start.
pub fn job_name(repository: &str, task: Task, now: Timestamp) -> String {
    let stem: String = repository.chars().take(40).collect();
    format!(
        "{}-{}-{}",
        stem.trim_end_matches('-'),
        task.name(),
        now.as_second()
    )
}

/// The Job of a maintenance run.
pub fn job(
    name: &str,
    repository: &BackupRepository,
    encrypted: &EncryptedRepository,
    task: Task,
    settings: &Settings,
    mover: &crate::mover_job::MoverJob,
) -> Job {
    let uid = repository.metadata.uid.clone().unwrap_or_default();
    let labels = crate::ownership::labels(&[
        (custody_proto::names::LABEL_ROLE, ROLE_MAINTENANCE),
        (LABEL_REPOSITORY_UID, uid.as_str()),
    ]);
    let arguments = RepositoryArgs {
        prefix: encrypted.prefix.clone(),
        id: Some(encrypted.id.clone()),
    };
    let invocation = match task {
        Task::Prune => Invocation::Prune {
            repository: arguments,
        },
        Task::Check => Invocation::Check {
            repository: arguments,
            read_data_percent: settings.read_data_percent,
        },
    };
    let mut env = custody_kube::s3::mover_env(&repository.spec);
    env.push(crate::backups::job::master_key_env(encrypted));
    let container = serde_json::json!({
        "name": "mover",
        "image": mover.image,
        "command": ["custody-mover"],
        "args": invocation.args(),
        "env": env,
        // Reads and writes the bucket only: no capability.
        "securityContext": crate::mover_job::security_context(&[]),
    });
    let job = mover.job(name, repository, &labels, None, 0, container);
    crate::mover_job::with_web_identity(job, &repository.spec)
}

/// What a maintenance Job is doing.
#[cfg(test)]
mod tests;
