use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

const HOUR: Duration = Duration::from_secs(3600);

fn at(hours: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + hours * 3600).unwrap()
}

fn run(job: Option<&str>, request: Option<&str>, started_hours: Option<i64>) -> MaintenanceRun {
    MaintenanceRun {
        job: job.map(str::to_string),
        request: request.map(str::to_string),
        start_time: started_hours.map(|hours| Time(at(hours))),
        ..MaintenanceRun::default()
    }
}

fn status(prune: Option<MaintenanceRun>, check: Option<MaintenanceRun>) -> MaintenanceStatus {
    MaintenanceStatus { prune, check }
}

#[test]
fn settings_default_and_zero_means_on_request_only() {
    let defaults = Settings::of(None);
    assert_eq!(defaults.prune_every, Some(24 * HOUR));
    assert_eq!(defaults.check_every, Some(168 * HOUR));
    assert_eq!(defaults.read_data_percent, 10);
    let set = Settings::of(Some(&RepositoryMaintenance {
        prune_interval_hours: Some(0),
        check_interval_hours: Some(6),
        check_read_data_percent: Some(100),
    }));
    assert_eq!(set.prune_every, None);
    assert_eq!(set.check_every, Some(6 * HOUR));
    assert_eq!(set.read_data_percent, 100);
    let partial = Settings::of(Some(&RepositoryMaintenance {
        check_read_data_percent: Some(0),
        ..RepositoryMaintenance::default()
    }));
    assert_eq!(partial.prune_every, Some(24 * HOUR));
    assert_eq!(partial.read_data_percent, 0);
}

#[test]
fn what_runs_next() {
    let defaults = Settings::of(None);
    let on_request = Settings::of(Some(&RepositoryMaintenance {
        prune_interval_hours: Some(0),
        check_interval_hours: Some(0),
        check_read_data_percent: None,
    }));
    let start = |task, request: Option<&str>| Step::Start {
        task,
        request: request.map(str::to_string),
    };
    // (name, settings, status, requested, seen, ready, now (hours), step)
    type Case<'a> = (
        &'a str,
        &'a Settings,
        Option<MaintenanceStatus>,
        [Option<&'a str>; 2],
        Option<Seen>,
        bool,
        i64,
        Step,
    );
    let cases: Vec<Case> = vec![
        (
            "new repository: nothing until the first interval has passed",
            &defaults,
            None,
            [None, None],
            None,
            true,
            1,
            Step::Idle {
                after: Some(23 * HOUR),
            },
        ),
        (
            "a day after creation: the first prune",
            &defaults,
            None,
            [None, None],
            None,
            true,
            24,
            start(Task::Prune, None),
        ),
        (
            "a prune a day ago, a check a week ago: prune first",
            &defaults,
            Some(status(
                Some(run(None, None, Some(-1))),
                Some(run(None, None, Some(-145))),
            )),
            [None, None],
            None,
            true,
            23,
            start(Task::Prune, None),
        ),
        (
            "pruned recently, check due",
            &defaults,
            Some(status(
                Some(run(None, None, Some(20))),
                Some(run(None, None, Some(-145))),
            )),
            [None, None],
            None,
            true,
            23,
            start(Task::Check, None),
        ),
        (
            "both done recently: idle until the sooner",
            &defaults,
            Some(status(
                Some(run(None, None, Some(20))),
                Some(run(None, None, Some(0))),
            )),
            [None, None],
            None,
            true,
            23,
            Step::Idle {
                after: Some(21 * HOUR),
            },
        ),
        (
            "a new request starts at once",
            &defaults,
            Some(status(Some(run(None, None, Some(22))), None)),
            [None, Some("now")],
            None,
            true,
            23,
            start(Task::Check, Some("now")),
        ),
        (
            "a request already answered does not start again",
            &on_request,
            Some(status(None, Some(run(None, Some("now"), Some(22))))),
            [None, Some("now")],
            None,
            true,
            23,
            Step::Idle { after: None },
        ),
        (
            "a changed request starts again",
            &on_request,
            Some(status(None, Some(run(None, Some("now"), Some(22))))),
            [None, Some("again")],
            None,
            true,
            23,
            start(Task::Check, Some("again")),
        ),
        (
            "on request only: nothing scheduled",
            &on_request,
            None,
            [None, None],
            None,
            true,
            10_000,
            Step::Idle { after: None },
        ),
        (
            "a running prune is waited for, even with a request pending",
            &defaults,
            Some(status(Some(run(Some("j"), None, Some(0))), None)),
            [None, Some("now")],
            Some(Seen::Running),
            true,
            100,
            Step::Wait(Task::Prune),
        ),
        (
            "a finished check is recorded",
            &defaults,
            Some(status(None, Some(run(Some("j"), None, Some(0))))),
            [None, None],
            Some(Seen::Succeeded(None)),
            true,
            1,
            Step::Record(Task::Check),
        ),
        (
            "a vanished Job is recorded, even while the repository is not ready",
            &defaults,
            Some(status(Some(run(Some("j"), None, Some(0))), None)),
            [None, None],
            Some(Seen::Gone),
            false,
            1,
            Step::Record(Task::Prune),
        ),
        (
            "not ready: nothing starts, requested or due",
            &defaults,
            None,
            [Some("now"), Some("now")],
            None,
            false,
            1_000,
            Step::Idle { after: None },
        ),
    ];
    for (name, settings, status, requested, seen, ready, now, step) in cases {
        let view = View {
            now: at(now),
            created: Some(at(0)),
            settings,
            status: status.as_ref(),
            requested,
            seen: seen.as_ref(),
            ready,
        };
        assert_eq!(decide(&view), step, "{name}");
    }
}

#[test]
fn what_a_finished_run_records() {
    let prune_report = r#"{"packsDeleted":3,"packsMarked":2,"packsRecovered":0,"packsRepacked":1,"packsUnreferenced":0,"packsRelisted":0,"bytesDeleted":3000000,"bytesMarked":2000,"bytesUsed":5000000}"#;
    let pruned = outcome(Task::Prune, &Seen::Succeeded(Some(prune_report.into())));
    assert!(pruned.succeeded);
    assert_eq!(pruned.prune.as_ref().unwrap().packs_deleted, 3);
    assert!(
        pruned.message.starts_with("deleted 3 pack(s)"),
        "{}",
        pruned.message
    );
    assert_eq!(
        (pruned.note.warning, pruned.note.reason.as_str()),
        (false, "Pruned")
    );
    assert!(pruned.checked.is_none());

    let passed = outcome(
        Task::Check,
        &Seen::Succeeded(Some(
            r#"{"passed":true,"errors":0,"warnings":1,"findings":["warning: x"],"readDataPercent":10}"#.into(),
        )),
    );
    let checked = passed.checked.unwrap();
    assert_eq!(
        (checked.status, checked.reason),
        (Status::True, "CheckPassed")
    );
    assert!(
        checked.message.contains("10% of the packs"),
        "{}",
        checked.message
    );
    assert!(!passed.note.warning);

    let found = outcome(
        Task::Check,
        &Seen::Succeeded(Some(
            r#"{"passed":false,"errors":2,"warnings":0,"findings":["error: pack 1f hash mismatch","error: blob 2a not in index"],"readDataPercent":100}"#.into(),
        )),
    );
    assert!(found.succeeded, "the check ran: its finding is the result");
    let checked = found.checked.unwrap();
    assert_eq!(
        (checked.status, checked.reason),
        (Status::False, "CheckFoundErrors")
    );
    assert!(
        checked.message.contains("pack 1f hash mismatch"),
        "{}",
        checked.message
    );
    assert!(found.note.warning);

    // A mover that failed: its reason and message; a check's condition becomes Unknown.
    let failed = outcome(
        Task::Check,
        &Seen::Failed {
            message: "BackoffLimitExceeded: Job has reached the specified backoff limit".into(),
            report: Some(custody_proto::mover::failure_text(
                custody_proto::reasons::MoverFailure::RepositoryKeyRejected,
                "the master key does not open it".into(),
            )),
        },
    );
    assert!(!failed.succeeded);
    assert!(
        failed.message.starts_with("RepositoryKeyRejected: "),
        "{}",
        failed.message
    );
    let checked = failed.checked.unwrap();
    assert_eq!(
        (checked.status, checked.reason),
        (Status::Unknown, "CheckFailed")
    );
    assert_eq!(failed.note.reason, "CheckFailed");

    // No report at all: the Job's own reason.
    let deadline = outcome(
        Task::Prune,
        &Seen::Failed {
            message: "DeadlineExceeded: Job was active longer than specified deadline".into(),
            report: None,
        },
    );
    assert!(
        deadline.message.starts_with("DeadlineExceeded"),
        "{}",
        deadline.message
    );
    assert_eq!(deadline.note.reason, "PruneFailed");
    let gone = outcome(Task::Prune, &Seen::Gone);
    assert!(!gone.succeeded);
    assert!(gone.message.contains("deleted"), "{}", gone.message);
    // A report that is not one.
    let garbled = outcome(Task::Prune, &Seen::Succeeded(Some("{\"packsDel".into())));
    assert!(!garbled.succeeded);
}

#[test]
fn job_names_fit_and_carry_the_task() {
    let name = job_name(&"r".repeat(63), Task::Check, at(0));
    assert!(name.len() <= 63, "{name}");
    assert!(name.contains("-check-"));
    assert_eq!(
        job_name("store", Task::Prune, at(0)),
        format!("store-prune-{}", at(0).as_second())
    );
}

#[test]
fn the_job_runs_the_mover_on_the_repository_with_its_master_key_and_no_claim() {
    let repository: BackupRepository = serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
        "metadata": {"name": "store", "namespace": "ns", "uid": "repo-uid"},
        "spec": {"endpoint": "http://s3", "bucket": "b", "credentialsSecretRef": {"name": "s3"}},
    }))
    .unwrap();
    let encrypted = EncryptedRepository {
        id: "r1".into(),
        prefix: "custody/custody_repository".into(),
        master_key_secret: "store-master-key".into(),
        ..EncryptedRepository::default()
    };
    let job = job(
        "store-check-1",
        &repository,
        &encrypted,
        Task::Check,
        &Settings::of(None),
        &crate::mover_job::MoverJob::new("mover:1"),
    );
    let value = serde_json::to_value(&job).unwrap();
    let container = &value["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|arg| arg.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "check");
    assert!(
        args.windows(2)
            .any(|pair| pair == ["--read-data-percent", "10"])
    );
    assert!(
        args.windows(2)
            .any(|pair| pair == ["--repository-id", "r1"])
    );
    let env = container["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|variable| variable["name"] == "CUSTODY_REPOSITORY_KEY"
                && variable["valueFrom"]["secretKeyRef"]["name"] == "store-master-key")
    );
    let volumes = value["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    assert!(
        volumes
            .iter()
            .all(|volume| volume.get("persistentVolumeClaim").is_none())
    );
    assert!(
        value["spec"]["template"]["spec"]
            .get("nodeName")
            .is_none_or(|node| node.is_null())
    );
    assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "repo-uid");
    assert_eq!(
        value["metadata"]["labels"]["custody.io/role"],
        "maintenance"
    );
}
