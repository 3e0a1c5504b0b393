use super::*;

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn drill(schedule: &str) -> Drill {
    serde_json::from_value(json!({
        "schedule": schedule,
        "check": {"command": ["pg_amcheck", "-h", "$(CUSTODY_DRILL_HOST)", "--heapallindexed"]},
    }))
    .unwrap()
}

fn backup(name: &str, phase: &str, completed: Option<&str>, imported: bool) -> Backup {
    let mut spec = json!({"clusterRef": {"name": "orders"}});
    if imported {
        spec["importedSnapshot"] = json!("a".repeat(64));
        spec["repositoryRef"] = json!({"name": "store"});
        spec["deletionPolicy"] = json!("Retain");
    }
    let mut status = json!({"phase": phase});
    if let Some(completed) = completed {
        status["completionTime"] = json!(completed);
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec, "status": status,
    }))
    .unwrap()
}

fn run() -> DrillRun {
    DrillRun {
        id: "r-1".into(),
        backup: "nightly".into(),
        namespace: "shop".into(),
        started_at: Time(at("2026-12-06T10:00:00Z")),
        waiting_for: None,
        imported_backup_uid: None,
        cluster_uid: Some("c".into()),
        stateful_set_uid: Some("s".into()),
        job_uid: Some("j".into()),
    }
}

#[test]
fn names_stay_short_and_distinct() {
    let short = Names::of("nightly");
    assert_eq!(short.base, "nightly-drill");
    assert_eq!(short.pod, "nightly-drill-0");
    assert_eq!(short.job, "nightly-drill-check");
    let long_a = Names::of(&format!("{}a", "p".repeat(60)));
    let long_b = Names::of(&format!("{}b", "p".repeat(60)));
    assert_ne!(long_a.base, long_b.base);
    // A StatefulSet's pods carry `controller-revision-hash: <name>-<10 characters>`: 63 at most.
    assert!(long_a.base.len() <= 52, "{}", long_a.base);
    assert!(Names::of(&"q".repeat(40)).base.len() <= 52);
}

#[test]
fn the_newest_completed_backup_is_drilled_never_an_imported_view() {
    let rows: Vec<(Vec<Backup>, Option<&str>)> = vec![
        (vec![], None),
        (vec![backup("a", "Failed", None, false)], None),
        (vec![backup("a", "Running", None, false)], None),
        (
            vec![
                backup("old", "Completed", Some("2026-12-01T00:00:00Z"), false),
                backup("new", "Completed", Some("2026-12-02T00:00:00Z"), false),
                backup("failed", "Failed", None, false),
            ],
            Some("new"),
        ),
        (
            vec![
                backup("mine", "Completed", Some("2026-12-01T00:00:00Z"), false),
                backup("view", "Completed", Some("2026-12-05T00:00:00Z"), true),
            ],
            Some("mine"),
        ),
    ];
    for (backups, expected) in rows {
        assert_eq!(
            newest_completed(&backups).map(|backup| backup.name_any()),
            expected.map(str::to_string),
            "{:?}",
            backups.iter().map(|b| b.name_any()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_drill_starts_at_its_slot_with_a_backup_and_not_before() {
    let hourly = drill("0 * * * *");
    let done = [backup(
        "nightly",
        "Completed",
        Some("2026-12-06T01:00:00Z"),
        false,
    )];
    let status = |last: &str| DrillStatus {
        last_schedule_time: Some(Time(at(last))),
        ..DrillStatus::default()
    };
    let created = at("2026-12-01T00:00:00Z");
    let rows = [
        (
            Some(status("2026-12-06T10:00:00Z")),
            "2026-12-06T10:30:00Z",
            &done[..],
            Start::Wait {
                next: at("2026-12-06T11:00:00Z"),
            },
        ),
        (
            Some(status("2026-12-06T10:00:00Z")),
            "2026-12-06T11:00:01Z",
            &done[..],
            Start::Run {
                slot: at("2026-12-06T11:00:00Z"),
                backup: "nightly".into(),
            },
        ),
        // Never drilled: the first slot after the plan's creation.
        (
            None,
            "2026-12-06T11:00:01Z",
            &done[..],
            Start::Run {
                slot: at("2026-12-06T11:00:00Z"),
                backup: "nightly".into(),
            },
        ),
        (
            Some(status("2026-12-06T10:00:00Z")),
            "2026-12-06T11:00:01Z",
            &[][..],
            Start::NothingToDrill {
                slot: at("2026-12-06T11:00:00Z"),
                next: at("2026-12-06T12:00:00Z"),
            },
        ),
    ];
    for (status, now, backups, expected) in rows {
        assert_eq!(
            start(&hourly, status.as_ref(), created, at(now), backups).unwrap(),
            expected,
            "{now}"
        );
    }
    assert!(
        start(
            &drill("every day"),
            None,
            created,
            at("2026-12-06T11:00:00Z"),
            &done
        )
        .is_err()
    );
}

#[test]
fn only_what_this_run_recorded_or_made_is_its_own() {
    let found = |uid: &str, of: Option<&str>, run: Option<&str>| Found {
        uid: uid.into(),
        drill_of: of.map(str::to_string),
        run: run.map(str::to_string),
    };
    let rows = [
        // (found, recorded, expected)
        (found("u1", None, None), Some("u1"), Whose::Recorded),
        (
            found("u2", Some("plan"), Some("r1")),
            Some("u1"),
            Whose::Foreign,
        ),
        (
            found("u1", Some("plan"), Some("r1")),
            None,
            Whose::Adopt("u1".into()),
        ),
        // Another plan's, an older run's, a user's look-alike without the run.
        (found("u1", Some("other"), Some("r1")), None, Whose::Foreign),
        (found("u1", Some("plan"), Some("r0")), None, Whose::Foreign),
        (found("u1", Some("plan"), None), None, Whose::Foreign),
        (found("u1", None, None), None, Whose::Foreign),
        // An empty recorded UID proves nothing.
        (found("", None, None), Some(""), Whose::Foreign),
    ];
    for (found, recorded, expected) in rows {
        assert_eq!(
            whose(&found, recorded, "plan", "r1"),
            expected,
            "{found:?} {recorded:?}"
        );
    }
    assert_eq!(
        whose(&found("u1", Some(""), Some("r1")), None, "", "r1"),
        Whose::Foreign
    );
    // No run identity proves nothing either.
    assert_eq!(
        whose(&found("u1", Some("plan"), Some("")), None, "plan", ""),
        Whose::Foreign
    );
}

/// A case of the step table: its name, what was seen, what the step must be.
type Row = (&'static str, Seen, fn(&Step) -> bool);

fn ready_pod() -> PodSeen {
    PodSeen {
        ready: true,
        ip: Some("10.0.0.7".into()),
        restarts: 0,
        trouble: None,
    }
}

fn seen_restored(phase: RestorePhase) -> Seen {
    Seen {
        cluster: Some(Whose::Recorded),
        restore: Some((phase, "m".into())),
        stateful_set: Some(Whose::Recorded),
        ..Seen::default()
    }
}

#[test]
fn a_drill_goes_cluster_restore_statefulset_pod_check_in_order() {
    let names = Names::of("nightly");
    let now = at("2026-12-06T10:01:00Z");
    let hour = Duration::from_secs(3600);
    let failed_check = || CheckSeen::Failed("exit 2".into());
    let rows: Vec<Row> = vec![
        ("nothing yet", Seen::default(), |s| {
            *s == Step::Make(Make::Cluster)
        }),
        (
            "cluster unrecorded but made by this run",
            Seen {
                cluster: Some(Whose::Adopt("c1".into())),
                ..Seen::default()
            },
            |s| *s == Step::Adopt(Make::Cluster, "c1".into()),
        ),
        // Somebody else's StatefulSet or claims under the drill's names: refused before
        // anything is made.
        (
            "a foreign statefulset before the cluster",
            Seen {
                stateful_set: Some(Whose::Foreign),
                ..Seen::default()
            },
            |s| {
                matches!(
                    s,
                    Step::Finish {
                        passed: false,
                        reason: reasons::REFUSED,
                        ..
                    }
                )
            },
        ),
        (
            "a claim under the drill's names",
            Seen {
                taken: vec!["data-nightly-drill-0".into()],
                ..Seen::default()
            },
            |s| {
                matches!(s, Step::Finish { passed: false, reason: reasons::REFUSED, message }
                    if message.contains("data-nightly-drill-0"))
            },
        ),
        (
            "claims its own statefulset made",
            Seen {
                taken: vec!["data-nightly-drill-0".into()],
                ..seen_restored(RestorePhase::Running)
            },
            |s| matches!(s, Step::Wait(_)),
        ),
        (
            "a foreign cluster",
            Seen {
                cluster: Some(Whose::Foreign),
                ..Seen::default()
            },
            |s| {
                matches!(
                    s,
                    Step::Finish {
                        passed: false,
                        reason: reasons::REFUSED,
                        ..
                    }
                )
            },
        ),
        (
            "restore not created yet",
            Seen {
                cluster: Some(Whose::Recorded),
                ..Seen::default()
            },
            |s| matches!(s, Step::Wait(w) if w.contains("to start its Restore")),
        ),
        // The StatefulSet only once the Restore exists (the namespace is marked by then).
        (
            "restore pending: make the StatefulSet",
            Seen {
                cluster: Some(Whose::Recorded),
                restore: Some((RestorePhase::Pending, String::new())),
                ..Seen::default()
            },
            |s| *s == Step::Make(Make::StatefulSet),
        ),
        (
            "restore failed",
            Seen {
                cluster: Some(Whose::Recorded),
                restore: Some((RestorePhase::Failed, "VerificationFailed".into())),
                ..Seen::default()
            },
            |s| matches!(s, Step::Finish { passed: false, reason: reasons::RESTORE_FAILED, message } if message.contains("VerificationFailed")),
        ),
        (
            "a foreign statefulset",
            Seen {
                stateful_set: Some(Whose::Foreign),
                ..seen_restored(RestorePhase::Running)
            },
            |s| {
                matches!(
                    s,
                    Step::Finish {
                        reason: reasons::REFUSED,
                        ..
                    }
                )
            },
        ),
        (
            "restore running",
            seen_restored(RestorePhase::Running),
            |s| matches!(s, Step::Wait(w) if w.contains("write and verify")),
        ),
        (
            "restored, pod not ready",
            seen_restored(RestorePhase::Completed),
            |s| matches!(s, Step::Wait(w) if w.contains("to be ready")),
        ),
        (
            "restored, pod crash-looping",
            Seen {
                pod: Some(PodSeen {
                    ready: false,
                    ip: Some("x".into()),
                    restarts: 3,
                    trouble: Some("PANIC: could not locate a valid checkpoint record".into()),
                }),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| matches!(s, Step::Finish { passed: false, reason: reasons::APPLICATION_NOT_READY, message } if message.contains("checkpoint")),
        ),
        (
            "restored, pod restarted twice",
            Seen {
                pod: Some(PodSeen {
                    ready: false,
                    ip: None,
                    restarts: 2,
                    trouble: None,
                }),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| matches!(s, Step::Wait(_)),
        ),
        (
            "pod ready without an address",
            Seen {
                pod: Some(PodSeen {
                    ip: None,
                    ..ready_pod()
                }),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| matches!(s, Step::Wait(_)),
        ),
        (
            "pod ready: the check",
            Seen {
                pod: Some(ready_pod()),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| *s == Step::Make(Make::Job),
        ),
        (
            "a foreign job",
            Seen {
                pod: Some(ready_pod()),
                job: Some((Whose::Foreign, CheckSeen::Passed)),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| {
                matches!(
                    s,
                    Step::Finish {
                        passed: false,
                        reason: reasons::REFUSED,
                        ..
                    }
                )
            },
        ),
        (
            "check running",
            Seen {
                pod: Some(ready_pod()),
                job: Some((Whose::Recorded, CheckSeen::Running)),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| matches!(s, Step::Wait(w) if w.contains("engine check")),
        ),
        (
            "check passed",
            Seen {
                pod: Some(ready_pod()),
                job: Some((Whose::Recorded, CheckSeen::Passed)),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| {
                matches!(
                    s,
                    Step::Finish {
                        passed: true,
                        reason: reasons::PASSED,
                        ..
                    }
                )
            },
        ),
        (
            "check failed",
            Seen {
                pod: Some(ready_pod()),
                job: Some((Whose::Recorded, failed_check())),
                ..seen_restored(RestorePhase::Completed)
            },
            |s| matches!(s, Step::Finish { passed: false, reason: reasons::CHECK_FAILED, message } if message.contains("exit 2")),
        ),
        // A finished check counts even if the pod stopped meanwhile? No: the pod is looked at
        // first, and a check that passed while the pod was ready is read only with it ready.
    ];
    for (case, seen, expected) in rows {
        let step = step(&run(), false, &seen, now, hour, &names);
        assert!(expected(&step), "{case}: {step:?}");
    }
}

#[test]
fn a_drill_elsewhere_first_opens_the_snapshot_imported_there() {
    let names = Names::of("nightly");
    let now = at("2026-12-06T10:01:00Z");
    let hour = Duration::from_secs(3600);
    let rows: Vec<Row> = vec![
        ("nothing", Seen::default(), |s| {
            *s == Step::Make(Make::ImportedBackup)
        }),
        (
            "adopt",
            Seen {
                imported: Some((Whose::Adopt("b1".into()), None, String::new())),
                ..Seen::default()
            },
            |s| *s == Step::Adopt(Make::ImportedBackup, "b1".into()),
        ),
        (
            "foreign",
            Seen {
                imported: Some((Whose::Foreign, Some(BackupPhase::Completed), String::new())),
                ..Seen::default()
            },
            |s| {
                matches!(
                    s,
                    Step::Finish {
                        reason: reasons::REFUSED,
                        ..
                    }
                )
            },
        ),
        (
            "opening",
            Seen {
                imported: Some((Whose::Recorded, None, String::new())),
                ..Seen::default()
            },
            |s| matches!(s, Step::Wait(w) if w.contains("opened")),
        ),
        (
            "refused snapshot",
            Seen {
                imported: Some((
                    Whose::Recorded,
                    Some(BackupPhase::Failed),
                    "KeyRejected".into(),
                )),
                ..Seen::default()
            },
            |s| matches!(s, Step::Finish { passed: false, reason: reasons::RESTORE_FAILED, message } if message.contains("KeyRejected")),
        ),
        (
            "opened: the Cluster",
            Seen {
                imported: Some((Whose::Recorded, Some(BackupPhase::Completed), String::new())),
                ..Seen::default()
            },
            |s| *s == Step::Make(Make::Cluster),
        ),
    ];
    for (case, seen, expected) in rows {
        let step = step(&run(), true, &seen, now, hour, &names);
        assert!(expected(&step), "{case}: {step:?}");
    }
    // In the plan's own namespace nothing is imported.
    assert_eq!(
        step(&run(), false, &Seen::default(), now, hour, &names),
        Step::Make(Make::Cluster)
    );
}

#[test]
fn a_drill_that_waits_past_its_bound_fails_naming_what_it_waited_for() {
    let names = Names::of("nightly");
    let hour = Duration::from_secs(3600);
    let waiting = seen_restored(RestorePhase::Running);
    let rows = [
        ("2026-12-06T10:59:59Z", false),
        ("2026-12-06T11:00:00Z", true),
    ];
    for (now, timed_out) in rows {
        let step = step(&run(), false, &waiting, at(now), hour, &names);
        match step {
            Step::Finish {
                passed: false,
                reason: reasons::TIMED_OUT,
                message,
            } => {
                assert!(timed_out, "{now}: {message}");
                assert!(message.contains("write and verify"), "{message}");
            }
            other => assert!(!timed_out, "{now}: {other:?}"),
        }
    }
    // A step that keeps failing is bounded too.
    match step(
        &run(),
        false,
        &Seen::default(),
        at("2026-12-06T11:00:00Z"),
        hour,
        &names,
    ) {
        Step::Finish {
            reason: reasons::TIMED_OUT,
            message,
            ..
        } => assert!(message.contains("making its Cluster"), "{message}"),
        other => panic!("{other:?}"),
    }
    // A result is never overtaken by the bound: it is not a wait.
    let passed = Seen {
        pod: Some(ready_pod()),
        job: Some((Whose::Recorded, CheckSeen::Passed)),
        ..seen_restored(RestorePhase::Completed)
    };
    assert!(matches!(
        step(
            &run(),
            false,
            &passed,
            at("2026-12-07T00:00:00Z"),
            hour,
            &names
        ),
        Step::Finish { passed: true, .. }
    ));
}

#[test]
fn the_drill_statefulset_is_the_application_relabelled_with_one_pod_and_its_claims_deleted() {
    let source = json!({
        "metadata": {"name": "orders", "namespace": "shop", "uid": "x"},
        "spec": {
            "replicas": 3,
            "serviceName": "orders",
            "selector": {"matchLabels": {"app": "orders"}},
            "template": {
                "metadata": {"labels": {"app": "orders", "custody.io/cluster": "orders"},
                             "annotations": {"custody.io/restore-verified": "x", "keep": "y"}},
                "spec": {"containers": [{"name": "db", "image": "postgres:15", "imagePullPolicy": "Never"}],
                         "securityContext": {"runAsUser": 999}},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data", "namespace": "shop", "labels": {"app": "orders"}},
                "spec": {"resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Pending"},
            }],
        },
    });
    let names = Names::of("nightly");
    let set = stateful_set(&names, &run(), &source, "plan-uid").unwrap();
    assert_eq!(set["metadata"]["name"], "nightly-drill");
    assert_eq!(set["metadata"]["namespace"], "shop");
    assert_eq!(set["metadata"]["labels"][LABEL_DRILL_OF], "plan-uid");
    assert_eq!(
        set["metadata"]["annotations"][ANNOTATION_RUN],
        run_id(&run())
    );
    assert_eq!(set["spec"]["replicas"], 1);
    assert_eq!(
        set["spec"]["selector"],
        json!({"matchLabels": {LABEL_DRILL: "nightly-drill"}})
    );
    // No label of the application's: its Services and budgets never select the drill.
    assert_eq!(
        set["spec"]["template"]["metadata"]["labels"],
        json!({LABEL_DRILL: "nightly-drill", LABEL_CLUSTER: "nightly-drill"})
    );
    assert_eq!(
        set["spec"]["template"]["metadata"]["annotations"],
        json!({"keep": "y"})
    );
    assert_eq!(
        set["spec"]["template"]["spec"]["containers"][0]["image"],
        "postgres:15"
    );
    assert_eq!(
        set["spec"]["template"]["spec"]["containers"][0]["terminationMessagePolicy"],
        "FallbackToLogsOnError"
    );
    assert_eq!(
        set["spec"]["volumeClaimTemplates"],
        json!([{"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}])
    );
    assert_eq!(
        set["spec"]["persistentVolumeClaimRetentionPolicy"],
        json!({"whenDeleted": "Delete", "whenScaled": "Delete"})
    );
    let typed: Result<k8s_openapi::api::apps::v1::StatefulSet, _> = serde_json::from_value(set);
    assert!(typed.is_ok(), "{typed:?}");
    assert!(stateful_set(&names, &run(), &json!({"metadata": {}}), "p").is_err());
    assert_eq!(claim_names(&names, &source), ["data-nightly-drill-0"]);
    // A claim of the pod template's own is the live application's: no drill of it.
    let mut sharing = source.clone();
    sharing["spec"]["template"]["spec"]["volumes"] = json!([{"name": "uploads", "persistentVolumeClaim": {"claimName": "shop-uploads"}},
               {"name": "tmp", "emptyDir": {}}]);
    let refused = stateful_set(&names, &run(), &sharing, "p").unwrap_err();
    assert!(refused.contains("shop-uploads"), "{refused}");
}

#[test]
fn the_check_job_runs_once_bounded_as_the_applications_user_with_the_drill_host() {
    let template = json!({
        "spec": {"containers": [{"name": "db", "image": "postgres:15", "imagePullPolicy": "Never"}],
                 "securityContext": {"runAsUser": 999, "runAsNonRoot": true}},
    });
    let names = Names::of("nightly");
    let mut with_secret = drill("0 3 * * *");
    with_secret.check.credentials_secret_ref =
        Some(custody_kube::api::LocalObjectReference { name: "pg".into() });
    with_secret.check.timeout_seconds = Some(30);
    let job = check_job(
        &names,
        &run(),
        &with_secret,
        &template,
        "10.0.0.7",
        "plan-uid",
    );
    let spec = &job["spec"];
    assert_eq!(spec["backoffLimit"], 0);
    assert_eq!(spec["activeDeadlineSeconds"], 30);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsUser"], 999);
    let container = &pod["containers"][0];
    assert_eq!(container["image"], "postgres:15");
    assert_eq!(container["imagePullPolicy"], "Never");
    assert_eq!(
        container["env"][0],
        json!({"name": "CUSTODY_DRILL_HOST", "value": "10.0.0.7"})
    );
    assert_eq!(container["envFrom"], json!([{"secretRef": {"name": "pg"}}]));
    assert_eq!(
        container["terminationMessagePolicy"],
        "FallbackToLogsOnError"
    );
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(job["metadata"]["labels"][LABEL_DRILL_OF], "plan-uid");
    // A check image of its own is pulled as its registry says.
    let mut own = drill("0 3 * * *");
    own.check.image = Some("checker:1".into());
    let job = check_job(&names, &run(), &own, &template, "10.0.0.7", "p");
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["image"],
        "checker:1"
    );
    assert!(
        job["spec"]["template"]["spec"]["containers"][0]
            .get("imagePullPolicy")
            .is_none()
    );
    assert_eq!(job["spec"]["activeDeadlineSeconds"], DEFAULT_CHECK_TIMEOUT);
    let typed: Result<k8s_openapi::api::batch::v1::Job, _> = serde_json::from_value(job);
    assert!(typed.is_ok(), "{typed:?}");
}

#[test]
fn the_throwaway_cluster_restores_the_backup_and_nothing_backs_it_up() {
    let names = Names::of("nightly");
    let cluster = cluster(
        &names,
        &run(),
        "nightly",
        &["data".into(), "wal".into()],
        Some("store"),
        "plan-uid",
        Duration::from_secs(1800),
    );
    assert_eq!(
        cluster["spec"],
        json!({
            "statefulSetRef": {"name": "nightly-drill"},
            "volumeClaimTemplates": ["data", "wal"],
            "repositoryRef": {"name": "store"},
            "restore": {"backupRef": {"name": "nightly"}, "progressDeadlineSeconds": 1800},
        })
    );
    let typed: Result<custody_kube::api::Cluster, _> = serde_json::from_value(cluster);
    assert!(typed.is_ok(), "{typed:?}");
    let mut elsewhere = drill("0 3 * * *");
    elsewhere.repository_ref = Some(custody_kube::api::LocalObjectReference {
        name: "store".into(),
    });
    let imported = imported_backup(&names, &run(), &elsewhere, &"b".repeat(64), "orders", "p");
    assert_eq!(imported["spec"]["deletionPolicy"], "Retain");
    assert_eq!(imported["spec"]["importedSnapshot"], "b".repeat(64));
    assert_eq!(imported["spec"]["repositoryRef"], json!({"name": "store"}));
}

#[test]
fn a_check_passes_only_on_complete_and_a_failure_says_why_with_its_output() {
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        (
            type_.to_string(),
            status.to_string(),
            reason.to_string(),
            message.to_string(),
        )
    };
    assert_eq!(check_seen(&[], None), CheckSeen::Running);
    assert_eq!(
        check_seen(&[condition("Complete", "False", "", "")], None),
        CheckSeen::Running
    );
    assert_eq!(
        check_seen(&[condition("Complete", "True", "", "")], Some("ok")),
        CheckSeen::Passed
    );
    assert_eq!(
        check_seen(
            &[condition("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")],
            Some("exit 2, pg_amcheck: error: btree index \"pgbench_accounts_pkey\": ...")
        ),
        CheckSeen::Failed("BackoffLimitExceeded: Job has reached the specified backoff limit; its output ends: exit 2, pg_amcheck: error: btree index \"pgbench_accounts_pkey\": ...".into())
    );
    assert_eq!(
        check_seen(
            &[condition("Failed", "True", "DeadlineExceeded", "x")],
            None
        ),
        CheckSeen::Failed("it ran past its timeoutSeconds; its output ends: no output".into())
    );
}

#[test]
fn a_finished_drill_is_the_last_and_only_a_pass_moves_the_success_time() {
    let before = DrillStatus {
        last_schedule_time: Some(Time(at("2026-12-06T10:00:00Z"))),
        current: Some(run()),
        last: None,
        last_success_time: Some(Time(at("2026-12-05T10:00:00Z"))),
    };
    let now = at("2026-12-06T10:05:00Z");
    let failed = finished(&before, &run(), false, reasons::CHECK_FAILED, "m", now);
    // Kept until what the run made is deleted (a result of its start time marks it over).
    assert_eq!(failed.current, Some(run()));
    assert_eq!(failed.last_success_time, before.last_success_time);
    assert_eq!(failed.last_schedule_time, before.last_schedule_time);
    let last = failed.last.unwrap();
    assert_eq!(
        (last.result.as_str(), last.reason.as_str()),
        ("Failed", reasons::CHECK_FAILED)
    );
    assert_eq!(last.started_at, run().started_at);
    let passed = finished(&before, &run(), true, reasons::PASSED, "m", now);
    assert_eq!(passed.last_success_time, Some(Time(now)));
    assert_eq!(passed.last.unwrap().result, "Passed");
    let cancelled = finished(&before, &run(), false, reasons::CANCELLED, "m", now);
    assert_eq!(cancelled.last.unwrap().result, "Cancelled");
    assert_eq!(cancelled.last_success_time, before.last_success_time);
}

#[test]
fn the_end_of_a_log_is_kept_where_it_says_why() {
    assert_eq!(tail("  short\n", 10), "short");
    assert_eq!(
        tail("starting\nPANIC: no checkpoint", 20),
        "…PANIC: no checkpoint"
    );
    // Never inside a character.
    assert_eq!(tail("ééé", 3), "…é");
}
