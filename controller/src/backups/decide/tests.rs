use super::*;
use custody_proto::mover::read_report;

const UID: &str = "4f1c2d3e-aaaa-4bbb-8ccc-000000000001";

fn job(owner_kind: &str, owner_uid: &str, controller: bool, label: Option<&str>) -> Job {
    let mut labels = serde_json::Map::new();
    if let Some(label) = label {
        labels.insert(LABEL_BACKUP_UID.into(), label.into());
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "j",
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "custody.io/v1alpha1", "kind": owner_kind, "name": "b",
                "uid": owner_uid, "controller": controller,
            }],
        },
    }))
    .unwrap()
}

#[test]
fn a_job_is_the_backups_only_with_owner_and_label_both_naming_it() {
    let rows = [
        ("owner and label", job("Backup", UID, true, Some(UID)), true),
        (
            "another Backup owns it",
            job("Backup", "other", true, Some(UID)),
            false,
        ),
        (
            "the label names another Backup",
            job("Backup", UID, true, Some("other")),
            false,
        ),
        ("no label", job("Backup", UID, true, None), false),
        (
            "owner is not the controller",
            job("Backup", UID, false, Some(UID)),
            false,
        ),
        (
            "owner of another kind",
            job("Restore", UID, true, Some(UID)),
            false,
        ),
    ];
    for (name, job, owned) in rows {
        assert_eq!(owned_by(&job, UID), owned, "{name}");
    }
}

#[test]
fn keys_and_names_are_derived_from_the_uid() {
    assert_eq!(
        artifact_prefix("/custody/", "db", "orders", UID),
        format!("custody/db/orders/{UID}")
    );
    assert_eq!(
        artifact_prefix("", "db", "orders", UID),
        format!("db/orders/{UID}")
    );
    assert_eq!(claim_name("data", "orders"), "data-orders-0");
    let long = "b".repeat(80);
    let name = job_name(&long, UID);
    assert!(name.len() <= 63, "{name}");
    assert!(name.ends_with("-backup-4f1c2d3e"), "{name}");
    assert_eq!(job_name("nightly", UID), "nightly-backup-4f1c2d3e");
}

fn with_condition(kind: &str, status: &str) -> Job {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "j"},
        "status": {"conditions": [{"type": kind, "status": status, "message": "BackoffLimitExceeded"}]},
    }))
    .unwrap()
}

#[test]
fn job_states_come_from_true_conditions_only() {
    assert_eq!(
        job_state(&with_condition("Complete", "True")),
        JobState::Succeeded
    );
    assert_eq!(
        job_state(&with_condition("Complete", "False")),
        JobState::Running
    );
    assert!(matches!(
        job_state(&with_condition("Failed", "True")),
        JobState::Failed { .. }
    ));
    assert!(matches!(
        job_state(&with_condition("FailureTarget", "True")),
        JobState::Failed { .. }
    ));
    assert_eq!(
        job_state(&with_condition("Suspended", "True")),
        JobState::Running
    );
}

#[test]
fn a_failed_jobs_message_leads_with_its_reason_when_it_has_one() {
    let failed = |reason: serde_json::Value| -> JobState {
        job_state(
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "j"},
                "status": {"conditions": [{"type": "Failed", "status": "True", "reason": reason,
                    "message": "Job was active longer than specified deadline"}]},
            }))
            .unwrap(),
        )
    };
    let message = |state: JobState| match state {
        JobState::Failed { message } => message,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        message(failed("DeadlineExceeded".into())),
        "DeadlineExceeded: Job was active longer than specified deadline"
    );
    for none in [serde_json::json!(""), serde_json::Value::Null] {
        assert_eq!(
            message(failed(none.clone())),
            "Job was active longer than specified deadline",
            "{none:?}"
        );
    }
}

#[test]
fn a_command_run_writes_under_the_repositorys_prefix() {
    let repository: custody_kube::api::BackupRepository =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "repo", "namespace": "db"},
            "spec": {"endpoint": "http://s3:9000", "bucket": "backups", "prefix": "/team/",
                     "credentialsSecretRef": {"name": "s3"}},
        }))
        .unwrap();
    let destination = destination(&repository, "dumps/orders");
    assert_eq!(destination.endpoint, "http://s3:9000");
    assert_eq!(destination.bucket, "backups");
    assert_eq!(destination.prefix, "team/dumps/orders");
    assert_eq!(destination.credentials_secret.as_deref(), Some("s3"));
}

fn recorded() -> Artifact {
    Artifact {
        repository: "repo".into(),
        endpoint: "http://s3".into(),
        bucket: "b".into(),
        prefix: format!("db/orders/{UID}"),
        key: format!("db/orders/{UID}/data.tar.zst"),
        manifest_key: format!("db/orders/{UID}/manifest.jsonl"),
        size_bytes: None,
        checksum: None,
        manifest_hash: None,
        ..Artifact::default()
    }
}

#[test]
fn a_finished_backup_is_complete_only_with_the_recorded_keys() {
    let done = format!(
        r#"{{"key":"db/orders/{UID}/data.tar.zst","manifestKey":"db/orders/{UID}/manifest.jsonl","sizeBytes":42,"checksum":"c","manifestHash":"m","files":1,"entries":1,"totalBytes":5}}"#
    );
    let artifact = completion(&recorded(), &read_report(&done)).expect("complete");
    assert_eq!(artifact.size_bytes, Some(42));
    assert_eq!(artifact.checksum.as_deref(), Some("c"));
    assert_eq!(artifact.manifest_hash.as_deref(), Some("m"));
    assert_eq!(artifact.key, recorded().key);

    // Either key other than the recorded one is not this Backup's.
    let other_manifest = done.replace("manifest.jsonl", "other.jsonl");
    let (reason, _) =
        completion(&recorded(), &read_report(&other_manifest)).expect_err("manifest mismatch");
    assert_eq!(reason, "ArtifactKeyMismatch");

    let elsewhere = done.replace(UID, "another-uid");
    let (reason, _) = completion(&recorded(), &read_report(&elsewhere)).expect_err("mismatch");
    assert_eq!(reason, "ArtifactKeyMismatch");

    let failed =
        r#"{"error":{"reason":"UploadFailed","message":"uploading part 3: connection refused"}}"#;
    let (reason, message) = completion(&recorded(), &read_report(failed)).expect_err("failed");
    assert_eq!(reason, "UploadFailed");
    assert!(message.contains("part 3"));

    for garbage in ["", "not json", r#"{"key":"only"}"#] {
        let (reason, _) = completion(&recorded(), &read_report(garbage)).expect_err(garbage);
        assert_eq!(reason, "MoverReportUnreadable", "{garbage:?}");
    }
}

#[test]
fn only_known_reasons_reach_the_condition() {
    for (reported, condition) in [
        ("UploadFailed", "UploadFailed"),
        ("Interrupted", "Interrupted"),
        ("made up by a pod", "MoverFailed"),
        ("", "MoverFailed"),
    ] {
        let text = format!(r#"{{"error":{{"reason":"{reported}","message":"m"}}}}"#);
        let (reason, _) = completion(&recorded(), &read_report(&text)).expect_err(reported);
        assert_eq!(reason, condition, "{reported:?}");
    }
}

#[test]
fn prefixes_overlap_when_equal_or_nested() {
    for (one, other, overlap) in [
        ("custody/pg-dumps", "custody/pg-dumps", true),
        ("custody/pg-dumps/", "/custody/pg-dumps", true),
        ("custody", "custody/pg-dumps", true),
        ("custody/pg-dumps", "custody", true),
        ("", "custody/pg-dumps", true),
        ("custody/pg-dumps", "custody/pg-dumps-2", false),
        ("custody/pg", "custody/pg-dumps", false),
        ("a/pg-dumps", "b/pg-dumps", false),
    ] {
        assert_eq!(prefixes_overlap(one, other), overlap, "{one} / {other}");
    }
}

#[test]
fn other_runs_come_from_every_namespace_by_bucket_and_prefix() {
    use custody_kube::api::{BackupStatus, CommandBackup, Destination};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let run = |namespace: &str,
               name: &str,
               uid: &str,
               command: bool,
               place: Option<(&str, &str)>,
               artifact: Option<(&str, &str)>| {
        let mut backup = custody_kube::api::Backup::new(
            name,
            custody_kube::api::BackupSpec {
                imported_snapshot: None,
                cluster_ref: custody_kube::api::LocalObjectReference { name: "db".into() },
                repository_ref: None,
                deletion_policy: Default::default(),
                consistency: None,
                command: command.then(|| CommandBackup {
                    image: "i".into(),
                    command: vec!["c".into()],
                    prefix: "whatever".into(),
                }),
            },
        );
        backup.metadata.namespace = Some(namespace.into());
        backup.metadata.uid = Some(uid.into());
        backup.status = Some(BackupStatus {
            start_time: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(1_796_000_000).unwrap(),
            )),
            destination: place.map(|(bucket, prefix)| Destination {
                endpoint: "http://another-name-for-the-server".into(),
                bucket: bucket.into(),
                prefix: prefix.into(),
                credentials_secret: None,
                service_account: None,
            }),
            artifact: artifact.map(|(bucket, prefix)| Artifact {
                bucket: bucket.into(),
                prefix: prefix.into(),
                key: format!("{prefix}/db-20261130T101500Z.dump"),
                ..Artifact::default()
            }),
            ..BackupStatus::default()
        });
        backup
    };
    let backups = vec![
        run(
            "a",
            "mine",
            "u0",
            true,
            Some(("b", "custody/pg-dumps")),
            None,
        ),
        run(
            "b",
            "same-place",
            "u1",
            true,
            Some(("b", "custody/pg-dumps")),
            None,
        ),
        run("c", "parent", "u2", true, Some(("b", "custody")), None),
        run(
            "d",
            "other-bucket",
            "u3",
            true,
            Some(("x", "custody/pg-dumps")),
            None,
        ),
        run(
            "e",
            "other-prefix",
            "u4",
            true,
            Some(("b", "custody/my-dumps")),
            None,
        ),
        run(
            "f",
            "recorded-only",
            "u5",
            true,
            None,
            Some(("b", "custody/pg-dumps")),
        ),
        run("g", "unknown", "u6", true, None, None),
        run(
            "h",
            "volume",
            "u7",
            false,
            Some(("b", "custody/pg-dumps")),
            None,
        ),
    ];
    let destination = Destination {
        endpoint: "http://s3".into(),
        bucket: "b".into(),
        prefix: "custody/pg-dumps".into(),
        credentials_secret: None,
        service_account: None,
    };
    let names: Vec<String> = other_runs(&backups, "u0", &destination)
        .into_iter()
        .map(|run| run.name)
        .collect();
    assert_eq!(
        names,
        ["b/same-place", "c/parent", "f/recorded-only", "g/unknown"]
    );
}

#[test]
fn a_pod_that_will_not_start_is_named_with_its_reason() {
    let pod = |status: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
            .unwrap()
    };
    let waiting = |reason: &str| {
        pod(
            serde_json::json!({"containerStatuses": [{"name": "mover", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": "Back-off pulling image \"i\""}}}]}),
        )
    };
    let rows: Vec<(&str, Vec<k8s_openapi::api::core::v1::Pod>, Option<&str>)> = vec![
        ("no pod yet", vec![], None),
        ("creating", vec![waiting("ContainerCreating")], None),
        (
            "image pull back-off",
            vec![waiting("ImagePullBackOff")],
            Some("pod p: container mover is ImagePullBackOff: Back-off pulling image \"i\""),
        ),
        (
            "missing Secret key",
            vec![waiting("CreateContainerConfigError")],
            Some("CreateContainerConfigError"),
        ),
        (
            "crash loop",
            vec![waiting("CrashLoopBackOff")],
            Some("CrashLoopBackOff"),
        ),
        (
            "unschedulable",
            vec![pod(
                serde_json::json!({"conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available"}]}),
            )],
            Some("pod p cannot be scheduled: 0/3 nodes are available"),
        ),
        (
            "another condition says Unschedulable",
            vec![pod(
                serde_json::json!({"conditions": [{"type": "Ready", "status": "False",
                "reason": "Unschedulable"}]}),
            )],
            None,
        ),
        (
            "scheduled",
            vec![pod(
                serde_json::json!({"conditions": [{"type": "PodScheduled", "status": "True"}]}),
            )],
            None,
        ),
    ];
    for (name, pods, expected) in rows {
        let found = pod_not_starting(&pods, None);
        match expected {
            None => assert_eq!(found, None, "{name}"),
            Some(text) => assert!(
                found.as_deref().is_some_and(|found| found.contains(text)),
                "{name}: {found:?}"
            ),
        }
    }
}

#[test]
fn a_job_that_could_not_create_its_pod_is_named_with_the_refusal() {
    let refusal = "Error creating: pods \"j-abc\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true";
    assert_eq!(
        pod_not_starting(&[], Some(refusal)).as_deref(),
        Some(format!("no pod could be created: {refusal}").as_str())
    );
    // No pod and no refusal: the Job has not tried yet.
    assert_eq!(pod_not_starting(&[], None), None);
    // A pod exists: an old refusal says nothing about it.
    let running: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }))
    .unwrap();
    assert_eq!(pod_not_starting(&[running], Some(refusal)), None);
}

#[test]
fn a_failed_tool_is_named_with_its_exit_and_output() {
    let pod = |name: &str, exit: i32, message: Option<&str>| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job-pod"},
            "status": {"initContainerStatuses": [{
                "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "message": message}},
            }]},
        }))
        .unwrap()
    };
    let rows: [(k8s_openapi::api::core::v1::Pod, Option<&str>); 4] = [
        (
            pod(
                "tool",
                1,
                Some("pg_basebackup: error: connection refused\n"),
            ),
            Some("the backup tool exited with code 1: pg_basebackup: error: connection refused"),
        ),
        (
            pod("tool", 137, None),
            Some("the backup tool exited with code 137"),
        ),
        // It succeeded: the mover's report decides.
        (pod("tool", 0, Some("done")), None),
        // Another init container is not the tool.
        (pod("custody-wait", 1, Some("x")), None),
    ];
    for (pod, want) in rows {
        assert_eq!(tool_failure(&[pod]).as_deref(), want);
    }
    assert_eq!(tool_failure(&[]), None);
    // A stream tool runs beside the mover: the same, from the pod's containers; the mover's
    // own exit is not the tool's.
    let beside = |name: &str, exit: i32| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job-pod"},
            "status": {"containerStatuses": [{
                "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "message": "broken pipe"}},
            }]},
        }))
        .unwrap()
    };
    assert_eq!(
        tool_failure(&[beside("tool", 1)]).as_deref(),
        Some("the backup tool exited with code 1: broken pipe")
    );
    assert_eq!(tool_failure(&[beside("mover", 1)]), None);
    // The scratch check before the tool: its refusal is its output; it passing, or another
    // container failing, is no refusal.
    let check = |name: &str, exit: i32, message: &str| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job-pod"},
            "status": {"initContainerStatuses": [{
                "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "message": message}},
            }]},
        }))
        .unwrap()
    };
    use super::ScratchCheck::{Failed, Refused};
    let rows = [
        (check("scratch-check", 3, "claim c holds 9 bytes\n"), Some(Refused("claim c holds 9 bytes".into()))),
        (check("scratch-check", 3, ""), Some(Failed("the scratch check before the tool exited with code 3".into()))),
        (check("scratch-check", 1, "custody-mover: measuring claim c: EIO"), Some(Failed("the scratch check before the tool exited with code 1: custody-mover: measuring claim c: EIO".into()))),
        (check("scratch-check", 137, ""), Some(Failed("the scratch check before the tool exited with code 137".into()))),
        (check("scratch-check", 0, "fits"), None),
        (check("tool", 3, "x"), None),
    ];
    for (pod, want) in rows {
        assert_eq!(super::scratch_check(&[pod]), want);
    }
    let running = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "job-pod"},
        "status": {"containerStatuses": [{
            "name": "tool", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-12-03T10:00:00Z"}},
        }]},
    }))
    .unwrap();
    assert_eq!(
        tool_clock(
            &[running],
            Some(60),
            "2026-12-03T10:00:20Z".parse().unwrap()
        ),
        ToolClock::Left(40)
    );
    // Evicted: the kubelet's reason first, then the exit it caused.
    let mut evicted = pod("tool", 137, None);
    let status = evicted.status.as_mut().unwrap();
    status.reason = Some("Evicted".into());
    status.message =
        Some("Usage of EmptyDir volume \"tool-output\" exceeds the limit \"32Mi\". ".into());
    assert_eq!(
        tool_failure(&[evicted.clone()]).as_deref(),
        Some(
            "the kubelet evicted the Job's pod job-pod: Usage of EmptyDir volume \"tool-output\" exceeds the limit \"32Mi\".  (the backup tool exited with code 137)"
        )
    );
    evicted.status.as_mut().unwrap().init_container_statuses = None;
    assert!(tool_failure(&[evicted]).is_some_and(|failure| {
        failure.starts_with("the kubelet evicted the Job's pod job-pod: Usage")
    }));
}

/// The parent of a new snapshot: the Cluster's most recently completed Backup in the same
/// repository, whatever else there is.
#[test]
fn the_parent_is_the_clusters_last_completed_snapshot_in_the_repository() {
    let backup = |cluster: &str,
                  phase: &str,
                  completed: Option<&str>,
                  repository: &str,
                  id: Option<&str>| {
        serde_json::from_value::<custody_kube::api::Backup>(serde_json::json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"clusterRef": {"name": cluster}},
            "status": {"phase": phase, "completionTime": completed,
                "artifact": {"repository": "store", "endpoint": "e", "bucket": "b", "prefix": "p",
                    "key": "", "manifestKey": "",
                    "snapshot": {"repositoryId": repository, "id": id, "originCluster": "o"}}},
        }))
        .unwrap()
    };
    let backups = vec![
        backup(
            "orders",
            "Completed",
            Some("2026-12-01T01:00:00Z"),
            "r",
            Some("older"),
        ),
        backup(
            "orders",
            "Completed",
            Some("2026-12-01T03:00:00Z"),
            "r",
            Some("latest"),
        ),
        backup(
            "orders",
            "Completed",
            Some("2026-12-01T04:00:00Z"),
            "other",
            Some("other-repository"),
        ),
        backup("orders", "Failed", Some("2026-12-01T05:00:00Z"), "r", None),
        backup("orders", "Running", None, "r", None),
        backup(
            "payments",
            "Completed",
            Some("2026-12-01T06:00:00Z"),
            "r",
            Some("other-cluster"),
        ),
    ];
    assert_eq!(
        parent_snapshot(&backups, "orders", "r").as_deref(),
        Some("latest")
    );
    assert_eq!(
        parent_snapshot(&backups, "orders", "other").as_deref(),
        Some("other-repository")
    );
    assert_eq!(parent_snapshot(&backups, "orders", "new"), None);
    assert_eq!(parent_snapshot(&backups[3..5], "orders", "r"), None);
}

/// A tool's time bound counts from its container's start; past it the Job is stopped, and a
/// Job custody stopped says why.
#[test]
fn a_tool_past_its_timeout_is_overdue() {
    let pod = |name: &str, state: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job-pod"},
            "status": {"initContainerStatuses": [{
                "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": state,
            }]},
        }))
        .unwrap()
    };
    let started = serde_json::json!({"running": {"startedAt": "2026-12-03T10:00:00Z"}});
    let now = |time: &str| time.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
    let rows: [(Option<i64>, k8s_openapi::api::core::v1::Pod, &str, ToolClock); 8] = [
        (None, pod("tool", started.clone()), "2026-12-03T11:00:00Z", ToolClock::Unbounded),
        (Some(0), pod("tool", started.clone()), "2026-12-03T11:00:00Z", ToolClock::Unbounded),
        (Some(60), pod("tool", started.clone()), "2026-12-03T10:00:20Z", ToolClock::Left(40)),
        (Some(60), pod("tool", started.clone()), "2026-12-03T10:00:59Z", ToolClock::Left(1)),
        (
            Some(60),
            pod("tool", started.clone()),
            "2026-12-03T10:01:00Z",
            ToolClock::Overdue(
                "the backup tool ran 60 s in pod job-pod, past its timeoutSeconds (60 s): custody stopped its Job".into(),
            ),
        ),
        // Waiting for its image: not started yet; exited: done.
        (
            Some(60),
            pod("tool", serde_json::json!({"waiting": {"reason": "ImagePullBackOff"}})),
            "2026-12-03T11:00:00Z",
            ToolClock::Starting,
        ),
        (
            Some(60),
            pod("tool", serde_json::json!({"terminated": {"exitCode": 0}})),
            "2026-12-03T11:00:00Z",
            ToolClock::Unbounded,
        ),
        // Another init container is not the tool.
        (Some(60), pod("custody-wait", started.clone()), "2026-12-03T11:00:00Z", ToolClock::Starting),
    ];
    for (timeout, pod, at, want) in rows {
        assert_eq!(
            tool_clock(&[pod], timeout, now(at)),
            want,
            "{timeout:?} at {at}"
        );
    }
    // No pod yet: the tool has not started.
    assert_eq!(
        tool_clock(&[], Some(1), now("2026-12-03T11:00:00Z")),
        ToolClock::Starting
    );
    assert_eq!(
        tool_clock(&[], None, now("2026-12-03T11:00:00Z")),
        ToolClock::Unbounded
    );

    let mut job = job("Backup", UID, true, Some(UID));
    assert_eq!(stopped(&job), None);
    job.metadata.annotations = Some(
        [(
            ANNOTATION_STOPPED.to_string(),
            "past its timeoutSeconds".to_string(),
        )]
        .into(),
    );
    assert_eq!(stopped(&job).as_deref(), Some("past its timeoutSeconds"));
}

#[test]
fn mount_paths_are_where_every_container_mounting_a_template_agrees() {
    let set: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(serde_json::json!({
        "spec": {"selector": {}, "serviceName": "db", "template": {"spec": {
            "initContainers": [{"name": "init", "volumeMounts": [
                {"name": "logs", "mountPath": "/logs/"},
                {"name": "data", "mountPath": "/var/lib/postgresql/data"}]}],
            "containers": [
                {"name": "sidecar", "volumeMounts": [
                    {"name": "data", "mountPath": "/x", "subPath": "part"},
                    {"name": "tmp", "mountPath": "/srv/tmp"},
                    {"name": "odd", "mountPath": "/srv/../etc"}]},
                {"name": "db", "volumeMounts": [
                    {"name": "data", "mountPath": "/var/lib/postgresql/data"},
                    {"name": "wal", "mountPath": "/var/lib/postgresql/wal"},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "root", "mountPath": "/"}]}]}}},
    }))
    .unwrap();
    let templates = ["data", "wal", "logs", "tmp", "odd", "root", "unused"].map(String::from);
    let found = mount_paths(&set, &templates);
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        [
            ("data".to_string(), "/var/lib/postgresql/data".to_string()),
            ("logs".to_string(), "/logs".to_string()),
            ("wal".to_string(), "/var/lib/postgresql/wal".to_string()),
        ],
        "tmp is mounted at two paths, odd at a path with .., root at /, unused nowhere"
    );
}

#[test]
fn several_volumes_need_a_snapshot() {
    let one = ["data".to_string()];
    let two = ["data".to_string(), "wal".to_string()];
    assert_eq!(several_volumes(&one, false), None);
    assert_eq!(several_volumes(&two, true), None);
    let refused = several_volumes(&two, false).expect("refused");
    assert!(
        refused.contains("data, wal") && refused.contains("spec.encryption"),
        "{refused}"
    );
}

#[test]
fn a_tools_tree_of_each_volume_is_named_by_its_template() {
    assert_eq!(
        super::super::job::tool_env::output_of("wal"),
        "CUSTODY_OUTPUT_WAL"
    );
    assert_eq!(
        super::super::job::tool_env::output_of("pg-wal.1"),
        "CUSTODY_OUTPUT_PG_WAL_1"
    );
}

/// A stream tool whose mover ended is stopped with its Job; while both run, or once both
/// ended, nothing is.
#[test]
fn a_stream_tool_whose_mover_ended_is_stopped() {
    let pod = |mover: serde_json::Value,
               tool: serde_json::Value|
     -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "job-pod"},
            "status": {"containerStatuses": [
                {"name": "mover", "image": "m", "imageID": "", "ready": false, "restartCount": 0, "state": mover},
                {"name": "tool", "image": "t", "imageID": "", "ready": false, "restartCount": 0, "state": tool},
            ]},
        }))
        .unwrap()
    };
    let running = serde_json::json!({"running": {"startedAt": "2026-12-03T10:00:00Z"}});
    let ended = |code: i32| serde_json::json!({"terminated": {"exitCode": code}});
    let waiting = serde_json::json!({"waiting": {"reason": "ContainerCreating"}});
    let rows = [
        (pod(ended(1), running.clone()), true),
        (pod(ended(0), running.clone()), true),
        (pod(running.clone(), running.clone()), false),
        (pod(running.clone(), ended(0)), false),
        (pod(ended(1), ended(141)), false),
        (pod(ended(1), waiting.clone()), true),
    ];
    for (pod, stopped) in rows {
        let why = super::orphaned_tool(std::slice::from_ref(&pod));
        assert_eq!(why.is_some(), stopped, "{:?}", pod.status);
        if let Some(why) = why {
            assert!(
                why.contains("job-pod") && why.contains("custody stopped its Job"),
                "{why}"
            );
        }
    }
    assert_eq!(super::orphaned_tool(&[]), None);
}
