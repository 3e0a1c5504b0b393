//! Restore drills as plain data: which drill is due, which Backup it restores, the objects it
//! makes (pure builders), whose an object found under a drill's name is, and the next step of
//! a running drill from what the reconciler read. No API client here.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::plans::decide::{self as schedule, Due};
use custody_kube::api::{
    Backup, BackupPhase, BackupPlan, Drill, DrillResult, DrillRun, DrillStatus, RestorePhase,
};

/// The label on everything a drill makes: the plan's UID.
pub const LABEL_DRILL_OF: &str = "custody.io/drill-of";
/// The annotation on everything a drill makes: the run it belongs to (its start time).
pub const ANNOTATION_RUN: &str = "custody.io/drill-run";
/// The pod label the drill's StatefulSet selects (no Service of the application selects it).
pub const LABEL_DRILL: &str = "custody.io/drill";
/// The label custody's Clusters find their pods by.
pub const LABEL_CLUSTER: &str = "custody.io/cluster";

/// Default bounds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
pub const DEFAULT_CHECK_TIMEOUT: i64 = 600;
/// Restarts of the application's container after which it is judged not to start.
pub const RESTARTS_GIVEN_UP: i32 = 3;

/// Results and reasons (CamelCase): the plan's and the Backup's `Drilled` condition, Events,
/// `status.drill.last` and the metric's labels.
pub mod reasons {
    pub const PASSED: &str = "Passed";
    pub const FAILED: &str = "Failed";
    pub const STARTED: &str = "DrillStarted";
    pub const RESTORE_FAILED: &str = "RestoreFailed";
    pub const APPLICATION_NOT_READY: &str = "ApplicationNotReady";
    pub const CHECK_FAILED: &str = "CheckFailed";
    pub const TIMED_OUT: &str = "DrillTimedOut";
    pub const REFUSED: &str = "DrillRefused";
    pub const NO_BACKUP: &str = "NoCompletedBackup";
    pub const INVALID_SCHEDULE: &str = "InvalidDrillSchedule";
    pub const CANCELLED: &str = "DrillCancelled";
    /// The result of a drill that ended before it judged the Backup.
    pub const CANCELLED_RESULT: &str = "Cancelled";
}

/// The finalizer a plan carries while a drill of it runs: its deletion waits until what the
/// drill made is deleted (in another namespace nothing else would delete it).
pub const FINALIZER: &str = "custody.io/drill-cleanup";

/// The claims the drill's StatefulSet makes for the application's StatefulSet (`source`, as
/// JSON): `<template>-<base>-0`.
pub fn claim_names(names: &Names, source: &Value) -> Vec<String> {
    source["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|claim| claim["metadata"]["name"].as_str())
        .map(|template| format!("{template}-{}-0", names.base))
        .collect()
}

/// The names a plan's drill uses: Cluster and StatefulSet `<plan>-drill` (a long plan name is
/// cut and made unique by a hash: pod names and their labels stay under 63 characters), its
/// pod `<base>-0`, the check Job `<base>-check`, an imported Backup `<base>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    pub base: String,
    pub pod: String,
    pub job: String,
}

impl Names {
    pub fn of(plan: &str) -> Names {
        let base = if plan.len() <= 40 {
            format!("{plan}-drill")
        } else {
            // FNV-1a: a stable name, not a secret.
            let hash = plan.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
            let cut: String = plan.chars().take(33).collect();
            format!(
                "{}-{:06x}-drill",
                cut.trim_end_matches(['-', '.']),
                hash & 0xff_ffff
            )
        };
        Names {
            pod: format!("{base}-0"),
            job: format!("{base}-check"),
            base,
        }
    }
}

/// The namespace a drill of `plan` restores into.
pub fn namespace(plan: &BackupPlan, drill: &Drill) -> String {
    drill
        .namespace
        .clone()
        .unwrap_or_else(|| plan.namespace().unwrap_or_default())
}

/// Whether the drill restores an imported copy (another namespace than the plan's).
pub fn elsewhere(plan: &BackupPlan, drill: &Drill) -> bool {
    namespace(plan, drill) != plan.namespace().unwrap_or_default()
}

/// The Backup a drill restores: the plan's newest completed one (by completion time, then
/// name), never an imported view.
pub fn newest_completed(backups: &[Backup]) -> Option<&Backup> {
    backups
        .iter()
        .filter(|backup| backup.spec.imported_snapshot.is_none())
        .filter(|backup| backup.metadata.deletion_timestamp.is_none())
        .filter_map(|backup| {
            let status = backup.status.as_ref()?;
            (status.phase == Some(BackupPhase::Completed))
                .then(|| (status.completion_time.as_ref().map(|time| time.0), backup))
        })
        .max_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.name_any().cmp(&y.name_any())))
        .map(|(_, backup)| backup)
}

/// What starting a drill now is: none due, a due slot whose drill starts, or a due slot
/// without a Backup to restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    Wait { next: Timestamp },
    Run { slot: Timestamp, backup: String },
    NothingToDrill { slot: Timestamp, next: Timestamp },
}

/// Whether a drill starts: the latest slot of `drill.schedule` after the last drill's slot
/// (or the plan's creation), and the Backup it restores.
pub fn start(
    drill: &Drill,
    status: Option<&DrillStatus>,
    created: Timestamp,
    now: Timestamp,
    backups: &[Backup],
) -> Result<Start, String> {
    let parsed = schedule::parse(&drill.schedule)?;
    let since = status
        .and_then(|status| status.last_schedule_time.as_ref())
        .map(|time| time.0)
        .unwrap_or(created);
    match schedule::due(&parsed, since, now, None)? {
        Due::Wait { next } => Ok(Start::Wait { next }),
        Due::Run { slot, next } | Due::Missed { slot, next } => {
            Ok(match newest_completed(backups) {
                Some(backup) => Start::Run {
                    slot,
                    backup: backup.name_any(),
                },
                None => Start::NothingToDrill { slot, next },
            })
        }
    }
}

/// An object found under one of a drill's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub uid: String,
    /// Its `custody.io/drill-of` label.
    pub drill_of: Option<String>,
    /// Its `custody.io/drill-run` annotation.
    pub run: Option<String>,
}

impl Found {
    pub fn of(meta: &kube::api::ObjectMeta) -> Found {
        Found {
            uid: meta.uid.clone().unwrap_or_default(),
            drill_of: meta
                .labels
                .as_ref()
                .and_then(|labels| labels.get(LABEL_DRILL_OF))
                .cloned(),
            run: meta
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(ANNOTATION_RUN))
                .cloned(),
        }
    }
}

/// Whose an object under a drill's name is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Whose {
    /// The one this run recorded (by UID).
    Recorded,
    /// Made by this run but not yet recorded (the controller stopped between the create and
    /// the status): this plan's label and this run's random identity. Record this UID.
    Adopt(String),
    /// Somebody else's (another plan's, an older run's, a user's): never touched.
    Foreign,
}

/// Whose `found` is, for the run `run_id` of the plan with `plan_uid` that recorded `recorded`.
pub fn whose(found: &Found, recorded: Option<&str>, plan_uid: &str, run_id: &str) -> Whose {
    match recorded {
        Some(uid) if !uid.is_empty() && uid == found.uid => Whose::Recorded,
        Some(_) => Whose::Foreign,
        None if !plan_uid.is_empty()
            && !run_id.is_empty()
            && !found.uid.is_empty()
            && found.drill_of.as_deref() == Some(plan_uid)
            && found.run.as_deref() == Some(run_id) =>
        {
            Whose::Adopt(found.uid.clone())
        }
        None => Whose::Foreign,
    }
}

/// The run's identity, as written on what it makes: its random `id` (its start time for a run
/// recorded before runs had one).
pub fn run_id(run: &DrillRun) -> String {
    if run.id.is_empty() {
        run.started_at.0.to_string()
    } else {
        run.id.clone()
    }
}

/// The application pod of a drill, as its step needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSeen {
    pub ready: bool,
    pub ip: Option<String>,
    /// The most restarts of one of its containers.
    pub restarts: i32,
    /// The last termination of a restarting container, or why one waits (CrashLoopBackOff,
    /// ImagePullBackOff, …).
    pub trouble: Option<String>,
}

/// The end of `text`, at most `limit` bytes at a character boundary, starting with `…` when
/// cut: the end of a log is where it says why.
pub fn tail(text: &str, limit: usize) -> String {
    let text = text.trim();
    if text.len() <= limit {
        return text.to_string();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// The check Job's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckSeen {
    Running,
    Passed,
    /// Failed: the Job's reason and message and the end of the check's output.
    Failed(String),
}

/// Everything a step of a running drill read, each object already judged by [`whose`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The imported Backup (a drill elsewhere): whose, and whether it is Completed (opened)
    /// or Failed, with its message.
    pub imported: Option<(Whose, Option<BackupPhase>, String)>,
    pub cluster: Option<Whose>,
    /// The drill Cluster's Restore (`status.restoreName`): its phase and message.
    pub restore: Option<(RestorePhase, String)>,
    pub stateful_set: Option<Whose>,
    /// Claims under the names the drill's StatefulSet would make (`<template>-<base>-0`) that
    /// exist while that StatefulSet does not: somebody else's, which the drill's pod would
    /// mount.
    pub taken: Vec<String>,
    pub pod: Option<PodSeen>,
    pub job: Option<(Whose, CheckSeen)>,
}

/// What a drill makes, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Make {
    ImportedBackup,
    Cluster,
    StatefulSet,
    Job,
}

/// The next step of a running drill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create this object (its UID is recorded once created).
    Make(Make),
    /// Record the UID of an object this run made but did not record yet.
    Adopt(Make, String),
    /// Nothing to do but wait for `what` (recorded as `waitingFor`).
    Wait(String),
    /// The drill is over.
    Finish {
        passed: bool,
        reason: &'static str,
        message: String,
    },
}

/// The step of `run` (of the plan with `plan_uid`, drilling elsewhere or not) from `seen` at
/// `now`, bounded by `timeout`.
pub fn step(
    run: &DrillRun,
    elsewhere: bool,
    seen: &Seen,
    now: Timestamp,
    timeout: Duration,
    names: &Names,
) -> Step {
    let waited = now.duration_since(run.started_at.0).unsigned_abs();
    let next = next_step(run, elsewhere, seen, names);
    let doing = match &next {
        Step::Finish { .. } => return next,
        Step::Wait(what) => format!("waiting for {what}"),
        // A step that keeps failing (its create or record refused) is bounded too.
        Step::Make(what) | Step::Adopt(what, _) => format!("making its {what:?}"),
    };
    if waited >= timeout {
        return Step::Finish {
            passed: false,
            reason: reasons::TIMED_OUT,
            message: format!(
                "the drill of Backup {} ran past its {} s bound while {doing}",
                run.backup,
                timeout.as_secs()
            ),
        };
    }
    next
}

fn refused(what: &str, name: &str, namespace: &str) -> Step {
    Step::Finish {
        passed: false,
        reason: reasons::REFUSED,
        message: format!(
            "{what} {namespace}/{name} exists and is not this drill's: custody touches nothing it did not make. Rename or delete it, or rename the plan"
        ),
    }
}

fn next_step(run: &DrillRun, elsewhere: bool, seen: &Seen, names: &Names) -> Step {
    let namespace = &run.namespace;
    // Somebody else's StatefulSet or claims under the drill's names: refused before anything
    // is made (the drill's Restore would write those claims, its pod mount them).
    if seen.stateful_set == Some(Whose::Foreign) {
        return refused("StatefulSet", &names.base, namespace);
    }
    if seen.stateful_set.is_none() && !seen.taken.is_empty() {
        return Step::Finish {
            passed: false,
            reason: reasons::REFUSED,
            message: format!(
                "claims {} in namespace {namespace} exist and are not this drill's: its StatefulSet {} would mount them. custody touches nothing it did not make: delete or rename them, or rename the plan",
                seen.taken.join(", "),
                names.base
            ),
        };
    }
    if elsewhere {
        match &seen.imported {
            None => return Step::Make(Make::ImportedBackup),
            Some((Whose::Foreign, ..)) => return refused("Backup", &names.base, namespace),
            Some((Whose::Adopt(uid), ..)) => {
                return Step::Adopt(Make::ImportedBackup, uid.clone());
            }
            Some((Whose::Recorded, Some(BackupPhase::Failed), message)) => {
                return Step::Finish {
                    passed: false,
                    reason: reasons::RESTORE_FAILED,
                    message: format!(
                        "the snapshot of Backup {} could not be opened in namespace {namespace}: {message}",
                        run.backup
                    ),
                };
            }
            Some((Whose::Recorded, Some(BackupPhase::Completed), _)) => {}
            Some((Whose::Recorded, ..)) => {
                return Step::Wait(format!(
                    "the snapshot of Backup {} to be opened in namespace {namespace} (imported Backup {})",
                    run.backup, names.base
                ));
            }
        }
    }
    match &seen.cluster {
        None => return Step::Make(Make::Cluster),
        Some(Whose::Foreign) => return refused("Cluster", &names.base, namespace),
        Some(Whose::Adopt(uid)) => return Step::Adopt(Make::Cluster, uid.clone()),
        Some(Whose::Recorded) => {}
    }
    let Some((phase, message)) = &seen.restore else {
        return Step::Wait(format!(
            "Cluster {namespace}/{} to start its Restore",
            names.base
        ));
    };
    if *phase == RestorePhase::Failed {
        return Step::Finish {
            passed: false,
            reason: reasons::RESTORE_FAILED,
            message: format!("the restore of Backup {} failed: {message}", run.backup),
        };
    }
    match &seen.stateful_set {
        None => return Step::Make(Make::StatefulSet),
        Some(Whose::Foreign) => return refused("StatefulSet", &names.base, namespace),
        Some(Whose::Adopt(uid)) => return Step::Adopt(Make::StatefulSet, uid.clone()),
        Some(Whose::Recorded) => {}
    }
    if *phase != RestorePhase::Completed {
        return Step::Wait(format!(
            "Restore {namespace}/{} to write and verify the volumes ({phase:?}: {message})",
            names.base
        ));
    }
    let pod = seen.pod.clone().unwrap_or_default();
    if !pod.ready || pod.ip.is_none() {
        if pod.restarts >= RESTARTS_GIVEN_UP {
            return Step::Finish {
                passed: false,
                reason: reasons::APPLICATION_NOT_READY,
                message: format!(
                    "the application did not start on the data of Backup {} (verified on its volumes): pod {namespace}/{} restarted {} times; {}",
                    run.backup,
                    names.pod,
                    pod.restarts,
                    pod.trouble.as_deref().unwrap_or("no reason given")
                ),
            };
        }
        return Step::Wait(format!(
            "pod {namespace}/{} to be ready on the restored data{}",
            names.pod,
            pod.trouble
                .map(|trouble| format!(" ({trouble})"))
                .unwrap_or_default()
        ));
    }
    match &seen.job {
        None => Step::Make(Make::Job),
        Some((Whose::Foreign, _)) => refused("Job", &names.job, namespace),
        Some((Whose::Adopt(uid), _)) => Step::Adopt(Make::Job, uid.clone()),
        Some((Whose::Recorded, CheckSeen::Running)) => Step::Wait(format!(
            "the engine check (Job {namespace}/{}) to end",
            names.job
        )),
        Some((Whose::Recorded, CheckSeen::Passed)) => Step::Finish {
            passed: true,
            reason: reasons::PASSED,
            message: format!(
                "Backup {} restored into {namespace}/{}, verified on its volumes, and the engine check passed",
                run.backup, names.base
            ),
        },
        Some((Whose::Recorded, CheckSeen::Failed(output))) => Step::Finish {
            passed: false,
            reason: reasons::CHECK_FAILED,
            message: format!(
                "Backup {} restored and verified on its volumes, but the engine check failed: {output}",
                run.backup
            ),
        },
    }
}

/// The status after a drill ends: `last` is its result (of the same start time as `current`,
/// which stays until everything the run made is deleted), and a pass moves `lastSuccessTime`.
pub fn finished(
    status: &DrillStatus,
    run: &DrillRun,
    passed: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> DrillStatus {
    DrillStatus {
        current: Some(run.clone()),
        last: Some(DrillResult {
            backup: run.backup.clone(),
            result: if passed {
                reasons::PASSED
            } else if reason == reasons::CANCELLED {
                reasons::CANCELLED_RESULT
            } else {
                reasons::FAILED
            }
            .to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            started_at: run.started_at.clone(),
            finished_at: Time(now),
        }),
        last_success_time: if passed {
            Some(Time(now))
        } else {
            status.last_success_time.clone()
        },
        last_schedule_time: status.last_schedule_time.clone(),
    }
}

/// Labels and annotations of what a run makes.
fn marks(plan_uid: &str, run_id: &str) -> (Value, Value) {
    (
        json!({LABEL_DRILL_OF: plan_uid}),
        json!({ANNOTATION_RUN: run_id}),
    )
}

/// The imported view of the Backup's snapshot in the drill's namespace (a drill elsewhere):
/// read-only, never deletes the snapshot.
pub fn imported_backup(
    names: &Names,
    run: &DrillRun,
    drill: &Drill,
    snapshot: &str,
    cluster: &str,
    plan_uid: &str,
) -> Value {
    let (labels, annotations) = marks(plan_uid, &run_id(run));
    json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": names.base, "namespace": run.namespace,
                     "labels": labels, "annotations": annotations},
        "spec": {
            "clusterRef": {"name": cluster},
            "repositoryRef": drill.repository_ref,
            "deletionPolicy": "Retain",
            "importedSnapshot": snapshot,
        },
    })
}

/// The throwaway Cluster: restored from `backup` (in the drill's namespace), the source
/// Cluster's templates, no consistency method (nothing backs it up).
pub fn cluster(
    names: &Names,
    run: &DrillRun,
    backup: &str,
    templates: &[String],
    repository: Option<&str>,
    plan_uid: &str,
    timeout: Duration,
) -> Value {
    let (labels, annotations) = marks(plan_uid, &run_id(run));
    let mut spec = json!({
        "statefulSetRef": {"name": names.base},
        "volumeClaimTemplates": templates,
        "restore": {"backupRef": {"name": backup},
                    "progressDeadlineSeconds": timeout.as_secs().clamp(10, 2_592_000)},
    });
    if let Some(repository) = repository {
        spec["repositoryRef"] = json!({"name": repository});
    }
    json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": names.base, "namespace": run.namespace,
                     "labels": labels, "annotations": annotations},
        "spec": spec,
    })
}

/// The drill's StatefulSet, copied from the application's (`source`, as JSON): one pod, its
/// pod labels replaced by the drill's own (no Service, PodDisruptionBudget or NetworkPolicy of
/// the application selects it) and custody's annotations dropped, the end of a failed
/// container's log kept as its termination message, its claims deleted with it.
pub fn stateful_set(
    names: &Names,
    run: &DrillRun,
    source: &Value,
    plan_uid: &str,
) -> Result<Value, String> {
    let spec = source
        .get("spec")
        .ok_or("the application's StatefulSet has no spec")?;
    let mut template = spec
        .get("template")
        .cloned()
        .ok_or("the application's StatefulSet has no pod template")?;
    // A claim the pod template names itself (not one of its claim templates) is the live
    // application's: the drill's copy would mount and write it.
    let shared: Vec<&str> = template["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|volume| volume["persistentVolumeClaim"]["claimName"].as_str())
        .collect();
    if !shared.is_empty() {
        return Err(format!(
            "the application's pod template mounts claim(s) {} of its own, which a drill's copy would share with the running application: custody drills only applications whose data is in their StatefulSet's claim templates",
            shared.join(", ")
        ));
    }
    let pod_labels = json!({LABEL_DRILL: names.base, LABEL_CLUSTER: names.base});
    template["metadata"]["labels"] = pod_labels.clone();
    // A container that exits leaves the end of its log in its status (custody reads no logs):
    // the drill's verdict says why the application did not start on the restored data.
    for container in template["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        container["terminationMessagePolicy"] = json!("FallbackToLogsOnError");
    }
    if let Some(annotations) = template["metadata"]
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.retain(|key, _| !key.starts_with("custody.io/"));
    }
    let claims: Vec<Value> = spec
        .get("volumeClaimTemplates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut claim| {
            let name = claim["metadata"]["name"].clone();
            claim["metadata"] = json!({"name": name});
            if let Some(status) = claim.as_object_mut() {
                status.remove("status");
            }
            claim
        })
        .collect();
    let (labels, annotations) = marks(plan_uid, &run_id(run));
    Ok(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": names.base, "namespace": run.namespace,
                     "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "serviceName": names.base,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {LABEL_DRILL: names.base}},
            "template": template,
            "volumeClaimTemplates": claims,
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
        },
    }))
}

/// The check's Job: the user's command once, bounded by its timeout, as the application's pod
/// user (its pod `securityContext`), no privilege escalation, no capabilities, no token. The
/// end of its output becomes the pod's termination message.
pub fn check_job(
    names: &Names,
    run: &DrillRun,
    drill: &Drill,
    source_template: &Value,
    host: &str,
    plan_uid: &str,
) -> Value {
    let (labels, annotations) = marks(plan_uid, &run_id(run));
    let first = &source_template["spec"]["containers"][0];
    let image = drill
        .check
        .image
        .clone()
        .unwrap_or_else(|| first["image"].as_str().unwrap_or_default().to_string());
    let mut container = json!({
        "name": "check",
        "image": image,
        "command": drill.check.command,
        "env": [
            {"name": "CUSTODY_DRILL_HOST", "value": host},
            {"name": "CUSTODY_DRILL_POD", "value": names.pod},
            {"name": "CUSTODY_DRILL_NAMESPACE", "value": run.namespace},
            {"name": "CUSTODY_DRILL_BACKUP", "value": run.backup},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
    });
    if drill.check.image.is_none()
        && let Some(policy) = first.get("imagePullPolicy")
    {
        container["imagePullPolicy"] = policy.clone();
    }
    if let Some(secret) = &drill.check.credentials_secret_ref {
        container["envFrom"] = json!([{"secretRef": {"name": secret.name}}]);
    }
    let mut pod = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "containers": [container],
    });
    if let Some(context) = source_template["spec"].get("securityContext") {
        pod["securityContext"] = context.clone();
    }
    let mut job_labels = labels.clone();
    job_labels[LABEL_DRILL] = json!(names.job);
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": names.job, "namespace": run.namespace,
                     "labels": job_labels, "annotations": annotations},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": drill.check.timeout_seconds.unwrap_or(DEFAULT_CHECK_TIMEOUT),
            "template": {"metadata": {"labels": {LABEL_DRILL: names.job}}, "spec": pod},
        },
    })
}

/// A Job's end from its conditions, with the check's output (`output`: its pod's termination
/// message, when one was read).
pub fn check_seen(
    conditions: &[(String, String, String, String)],
    output: Option<&str>,
) -> CheckSeen {
    let is = |kind: &str| {
        conditions
            .iter()
            .find(|(type_, status, ..)| type_ == kind && status == "True")
    };
    if is("Complete").is_some() {
        return CheckSeen::Passed;
    }
    match is("Failed") {
        Some((_, _, reason, message)) => {
            let output = output
                .map(str::trim)
                .filter(|output| !output.is_empty())
                .map(|output| tail(output, 1024))
                .unwrap_or_else(|| "no output".into());
            let why = if reason == "DeadlineExceeded" {
                "it ran past its timeoutSeconds".to_string()
            } else if message.is_empty() {
                reason.clone()
            } else {
                format!("{reason}: {message}")
            };
            CheckSeen::Failed(format!("{why}; its output ends: {output}"))
        }
        None => CheckSeen::Running,
    }
}

#[cfg(test)]
mod tests;
