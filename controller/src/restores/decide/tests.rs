use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::ObjectMeta;

use super::*;
use k8s_openapi::jiff::Timestamp;

const UID: &str = "5e1f0a2b-0000-4000-8000-000000000001";

fn reported(claim: &str, pod: &str, state: VolumeState) -> ReportedVolume {
    ReportedVolume {
        namespace: "ns".into(),
        pod_name: pod.into(),
        pod_uid: format!("uid-{pod}"),
        claim_name: claim.into(),
        restore_uid: UID.into(),
        state,
        reason: (state == VolumeState::Failed).then(|| "ContentMismatch".to_string()),
        message: (state == VolumeState::Failed).then(|| "db/base differs".to_string()),
    }
}

fn previous(state: VolumeState, attempts: u32) -> VolumeRestoreStatus {
    VolumeRestoreStatus {
        claim_name: "data-db-0".into(),
        state,
        attempts,
        job_name: (attempts > 0).then(|| job_name("data-db-0", UID, attempts)),
        ..VolumeRestoreStatus::default()
    }
}

#[test]
fn volume_steps() {
    use JobFact::*;
    let running = || Owned(JobState::Running);
    let report = |state| reported("data-db-0", "db-0", state);
    // (name, previous, reported state, job, may_start) -> (state, reason, job attempt created)
    type Row = (
        &'static str,
        Option<VolumeRestoreStatus>,
        Option<VolumeState>,
        JobFact,
        bool,
        VolumeState,
        Option<&'static str>,
        Option<u32>,
    );
    let rows: Vec<Row> = vec![
        (
            "no pod reported yet",
            None,
            None,
            Missing,
            true,
            VolumeState::Pending,
            None,
            None,
        ),
        (
            "pod reported: first Job",
            None,
            Some(VolumeState::Pending),
            Missing,
            true,
            VolumeState::Restoring,
            None,
            Some(1),
        ),
        (
            "serial, earlier volume unfinished: wait",
            None,
            Some(VolumeState::Pending),
            Missing,
            false,
            VolumeState::Pending,
            None,
            None,
        ),
        (
            "Job running",
            Some(previous(VolumeState::Restoring, 1)),
            Some(VolumeState::Restoring),
            running(),
            true,
            VolumeState::Restoring,
            None,
            None,
        ),
        (
            "Job succeeded, agent not yet verifying",
            Some(previous(VolumeState::Restoring, 1)),
            Some(VolumeState::Restoring),
            Owned(JobState::Succeeded),
            true,
            VolumeState::Verifying,
            None,
            None,
        ),
        (
            "agent verifying",
            Some(previous(VolumeState::Restoring, 1)),
            Some(VolumeState::Verifying),
            running(),
            true,
            VolumeState::Verifying,
            None,
            None,
        ),
        (
            "agent verified",
            Some(previous(VolumeState::Verifying, 1)),
            Some(VolumeState::Verified),
            Owned(JobState::Succeeded),
            true,
            VolumeState::Verified,
            None,
            None,
        ),
        (
            "agent failed",
            Some(previous(VolumeState::Verifying, 1)),
            Some(VolumeState::Failed),
            Owned(JobState::Succeeded),
            true,
            VolumeState::Failed,
            Some("ContentMismatch"),
            None,
        ),
        (
            "Job failed",
            Some(previous(VolumeState::Restoring, 1)),
            Some(VolumeState::Restoring),
            Owned(JobState::Failed {
                message: "BackoffLimitExceeded".into(),
            }),
            true,
            VolumeState::Failed,
            Some("RestoreJobFailed"),
            None,
        ),
        (
            "Job deleted by someone: recreated",
            Some(previous(VolumeState::Restoring, 1)),
            Some(VolumeState::Pending),
            Missing,
            true,
            VolumeState::Restoring,
            None,
            Some(2),
        ),
        (
            "Job deleted again: recreated",
            Some(previous(VolumeState::Restoring, 2)),
            Some(VolumeState::Pending),
            Missing,
            false,
            VolumeState::Restoring,
            None,
            Some(3),
        ),
        (
            "Job deleted too often: fails visibly",
            Some(previous(VolumeState::Restoring, MAX_ATTEMPTS)),
            Some(VolumeState::Pending),
            Missing,
            true,
            VolumeState::Failed,
            Some("JobDeleted"),
            None,
        ),
        (
            "a foreign Job with the name",
            Some(previous(VolumeState::Restoring, 1)),
            Some(VolumeState::Pending),
            Foreign,
            true,
            VolumeState::Failed,
            Some("JobNameTaken"),
            None,
        ),
        (
            "failed stays failed",
            Some(previous(VolumeState::Failed, 1)),
            Some(VolumeState::Verified),
            running(),
            true,
            VolumeState::Failed,
            None,
            None,
        ),
        (
            "verified stays verified",
            Some(previous(VolumeState::Verified, 1)),
            Some(VolumeState::Pending),
            Missing,
            true,
            VolumeState::Verified,
            None,
            None,
        ),
    ];
    for (name, previous, state, job, may_start, expected, reason, created) in rows {
        let report = state.map(report);
        let facts = VolumeFacts {
            claim: "data-db-0",
            previous: previous.as_ref(),
            reported: report.as_ref().map(|report| (report, "node-a")),
            job,
            job_problem: None,
            job_node: None,
            job_finished: None,
            reported_at: None,
            may_start,
        };
        let step = volume(&facts, UID);
        assert_eq!(step.status.state, expected, "{name}: state");
        if let Some(reason) = reason {
            assert_eq!(
                step.status.reason.as_deref(),
                Some(reason),
                "{name}: reason"
            );
        }
        assert_eq!(
            step.create.as_ref().map(|create| create.attempt),
            created,
            "{name}: job"
        );
        if let Some(create) = &step.create {
            assert_eq!(
                create.node, "node-a",
                "{name}: pinned to the reporting node"
            );
            assert_eq!(
                step.status.attempts, create.attempt,
                "{name}: attempts recorded"
            );
            assert_eq!(
                step.status.job_name.as_deref(),
                Some(create.name.as_str()),
                "{name}"
            );
            assert_eq!(step.recreated, create.attempt > 1, "{name}: recreated");
        }
    }
}

#[test]
fn a_job_that_gave_up_after_retries_says_what_its_last_pod_did() {
    let mut said = reported("data-db-0", "db-0", VolumeState::Restoring);
    said.message = Some("prepareData pod p-2 failed: exit code 137 (its Job may try again)".into());
    let previous = previous(VolumeState::Restoring, 1);
    let step = volume(
        &VolumeFacts {
            claim: "data-db-0",
            previous: Some(&previous),
            reported: Some((&said, "node-a")),
            job: JobFact::Owned(JobState::Failed {
                message: "BackoffLimitExceeded: Job has reached the specified backoff limit".into(),
            }),
            job_problem: None,
            job_node: None,
            job_finished: None,
            reported_at: None,
            may_start: true,
        },
        UID,
    );
    assert_eq!(step.status.state, VolumeState::Failed);
    assert_eq!(step.status.reason.as_deref(), Some(RESTORE_JOB_FAILED));
    let message = step.status.message.unwrap();
    assert!(
        message.contains("BackoffLimitExceeded")
            && message.contains("node-a")
            && message.contains("exit code 137"),
        "{message}"
    );
    assert!(step.create.is_none(), "a Job that gave up is not replaced");
}

#[test]
fn a_pod_moved_after_its_volume_was_written_gets_the_next_attempt_on_its_new_node() {
    let said = reported("data-db-0", "db-0", VolumeState::Pending);
    let facts = |previous: &VolumeRestoreStatus, wrote: &'static str| {
        volume(
            &VolumeFacts {
                claim: "data-db-0",
                previous: Some(previous),
                reported: Some((&said, "node-b")),
                job: JobFact::Owned(JobState::Succeeded),
                job_problem: None,
                job_node: Some(wrote),
                job_finished: None,
                reported_at: None,
                may_start: true,
            },
            UID,
        )
    };
    // Written on node-a, the pod now on node-b: attempt 2 on node-b.
    let moved = facts(&previous(VolumeState::Verifying, 1), "node-a");
    assert_eq!(moved.status.state, VolumeState::Restoring);
    let create = moved.create.expect("the next attempt");
    assert_eq!((create.node.as_str(), create.attempt), ("node-b", 2));
    assert_eq!(moved.status.job_name.as_deref(), Some(create.name.as_str()));
    assert_eq!(moved.moved_from.as_deref(), Some("node-a"));
    assert!(!moved.recreated);
    let message = moved.status.message.unwrap();
    assert!(
        message.contains("node-a") && message.contains("node-b") && message.contains("db-0"),
        "{message}"
    );
    // Written on the node the pod runs on: the agent there verifies; nothing new.
    let here = facts(&previous(VolumeState::Restoring, 1), "node-b");
    assert_eq!(here.status.state, VolumeState::Verifying);
    assert!(here.create.is_none() && here.moved_from.is_none());
    // No attempt left: failed, saying why.
    let exhausted = facts(&previous(VolumeState::Verifying, MAX_ATTEMPTS), "node-a");
    assert_eq!(exhausted.status.state, VolumeState::Failed);
    assert_eq!(exhausted.status.reason.as_deref(), Some(POD_MOVED));
    assert!(exhausted.create.is_none());
}

#[test]
fn a_prepare_data_pod_deleted_before_verification_gets_the_next_attempt_on_the_same_node() {
    let at = |second: i64| Some(Timestamp::from_second(1_800_000_000 + second).unwrap());
    let step = |state: VolumeState, attempts: u32, finished, reported_at| {
        let said = reported("data-db-0", "db-0", state);
        volume(
            &VolumeFacts {
                claim: "data-db-0",
                previous: Some(&previous(VolumeState::Verifying, attempts)),
                reported: Some((&said, "node-a")),
                job: JobFact::Owned(JobState::Succeeded),
                job_problem: None,
                job_node: Some("node-a"),
                job_finished: finished,
                reported_at,
                may_start: true,
            },
            UID,
        )
    };
    // The agent reports no prepareData pod 15 s after the Job finished: attempt 2, same node.
    let again = step(VolumeState::Pending, 1, at(0), at(POD_GONE_AFTER_SECONDS));
    assert_eq!(again.status.state, VolumeState::Restoring);
    let create = again.create.expect("the next attempt");
    assert_eq!((create.node.as_str(), create.attempt), ("node-a", 2));
    assert_eq!(again.status.attempts, 2);
    assert_eq!(again.status.job_name.as_deref(), Some(create.name.as_str()));
    assert_eq!(again.moved_from, None);
    assert!(again.pod_gone && !again.recreated);
    assert_eq!(
        again.status.message.as_deref(),
        Some(
            format!(
                "the agent on node node-a sees no pod of Job {}, which finished 15 s before its report: the pod was deleted before the volume was verified; Job {} (attempt 2 of 3) checks it again on node node-a",
                job_name("data-db-0", UID, 1),
                create.name
            )
            .as_str()
        )
    );
    // Not yet: the report may predate the agent seeing the pod; or no time is known.
    for (name, finished, reported_at) in [
        ("a report 14 s after", at(0), at(POD_GONE_AFTER_SECONDS - 1)),
        ("a report before the Job finished", at(20), at(0)),
        ("no finish time", None, at(60)),
        ("no report time", at(0), None),
    ] {
        let wait = step(VolumeState::Pending, 1, finished, reported_at);
        assert_eq!(wait.status.state, VolumeState::Verifying, "{name}");
        assert!(wait.create.is_none(), "{name}");
    }
    // The agent sees the pod (restoring, verifying): it verifies; nothing new.
    for state in [VolumeState::Restoring, VolumeState::Verifying] {
        let seen = step(state, 1, at(0), at(60));
        assert!(seen.create.is_none(), "{state:?}");
        assert_ne!(seen.status.state, VolumeState::Failed, "{state:?}");
    }
    // No attempt left: failed, saying why.
    let exhausted = step(VolumeState::Pending, MAX_ATTEMPTS, at(0), at(60));
    assert_eq!(exhausted.status.state, VolumeState::Failed);
    assert_eq!(
        exhausted.status.reason.as_deref(),
        Some(PREPARE_DATA_POD_GONE)
    );
    assert!(exhausted.create.is_none());
    assert!(
        exhausted.status.message.as_deref().is_some_and(
            |message| message.contains("60 s") && message.contains("no attempt is left (3)")
        ),
        "{:?}",
        exhausted.status.message
    );
    assert_eq!(
        condition_reason(PREPARE_DATA_POD_GONE),
        PREPARE_DATA_POD_GONE
    );
}

#[test]
fn a_pod_that_does_not_start_is_named_on_its_volume() {
    let said = reported("data-db-0", "db-0", VolumeState::Restoring);
    let previous = previous(VolumeState::Restoring, 1);
    let facts = |problem| VolumeFacts {
        claim: "data-db-0",
        previous: Some(&previous),
        reported: Some((&said, "node-a")),
        job: JobFact::Owned(JobState::Running),
        job_problem: problem,
        job_node: None,
        job_finished: None,
        reported_at: None,
        may_start: true,
    };
    let stuck = volume(
        &facts(Some("pod p: container mover is ImagePullBackOff")),
        UID,
    );
    assert_eq!(stuck.status.state, VolumeState::Restoring);
    assert_eq!(stuck.status.reason.as_deref(), Some(JOB_POD_NOT_STARTING));
    assert!(
        stuck
            .status
            .message
            .as_deref()
            .is_some_and(|message| message.contains("ImagePullBackOff")),
        "{:?}",
        stuck.status.message
    );
    let fine = volume(&facts(None), UID);
    assert_eq!(fine.status.reason, None);
}

#[test]
fn every_template_of_every_replica_gets_the_backups_volume_of_its_name() {
    let names = |list: &[&str]| list.iter().map(|name| name.to_string()).collect::<Vec<_>>();
    let pairs = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    };
    // (templates, backup volumes, layout or refusal)
    type Row<'a> = (
        &'a [&'a str],
        &'a [&'a str],
        Option<&'a [(&'a str, &'a str)]>,
    );
    let rows: &[Row] = &[
        (&["data"], &["data"], Some(&[("data", "data")])),
        // One volume restores into one template whatever their names.
        (&["pgdata"], &["data"], Some(&[("pgdata", "data")])),
        (
            &["data", "wal"],
            &["wal", "data"],
            Some(&[("data", "data"), ("wal", "wal")]),
        ),
        // Leaving a volume out, or a template empty, is refused.
        (&["data", "wal"], &["data"], None),
        (&["data"], &["data", "wal"], None),
        (&["data", "logs"], &["data", "wal"], None),
        (&["data", "data"], &["data", "data"], None),
        (&[], &["data"], None),
    ];
    for (templates, volumes, expected) in rows {
        let found = layout(&names(templates), &names(volumes));
        match expected {
            Some(expected) => {
                assert_eq!(found.unwrap(), pairs(expected), "{templates:?} {volumes:?}")
            }
            None => assert_eq!(
                found.unwrap_err().reason,
                UNSUPPORTED_VOLUME_LAYOUT,
                "{templates:?} {volumes:?}"
            ),
        }
    }
    let two = pairs(&[("data", "data"), ("wal", "wal")]);
    assert_eq!(
        claims(&two, "db", 2).unwrap(),
        pairs(&[
            ("data-db-0", "data"),
            ("wal-db-0", "wal"),
            ("data-db-1", "data"),
            ("wal-db-1", "wal")
        ])
    );
    assert_eq!(claims(&two, "db", 0).unwrap_err().reason, "NoReplicas");
}

#[test]
fn job_names_fit_and_differ() {
    let long = "x".repeat(80);
    let name = job_name(&long, UID, 2);
    assert!(name.len() <= 63, "{name}");
    assert!(name.ends_with("-restore-5e1f0a2b-2"), "{name}");
    assert_ne!(job_name("data-db-0", UID, 1), job_name("data-db-0", UID, 2));
    assert_ne!(
        job_name("data-db-0", UID, 1),
        job_name("data-db-0", "aaaaaaaa-1", 1)
    );
}

fn step(state: VolumeState) -> VolumeStep {
    VolumeStep {
        status: VolumeRestoreStatus {
            state,
            ..VolumeRestoreStatus::default()
        },
        create: None,
        recreated: false,
        moved_from: None,
        pod_gone: false,
    }
}

#[test]
fn serial_starts_after_every_earlier_volume_is_verified() {
    use VolumeRestorePolicy::*;
    assert!(may_start(Serial, &[]));
    assert!(may_start(Serial, &[step(VolumeState::Verified)]));
    assert!(!may_start(
        Serial,
        &[step(VolumeState::Verified), step(VolumeState::Restoring)]
    ));
    assert!(!may_start(Serial, &[step(VolumeState::Pending)]));
    assert!(!may_start(Serial, &[step(VolumeState::Failed)]));
    assert!(may_start(Parallel, &[step(VolumeState::Pending)]));
}

#[test]
fn summaries() {
    let volume = |claim: &str, state| VolumeRestoreStatus {
        claim_name: claim.into(),
        state,
        reason: (state == VolumeState::Failed).then(|| "ContentMismatch".to_string()),
        message: Some("why".into()),
        ..VolumeRestoreStatus::default()
    };
    use VolumeState::*;
    let rows: Vec<(&str, Vec<VolumeRestoreStatus>, RestorePhase, &str)> = vec![
        (
            "nothing yet",
            vec![volume("a", Pending), volume("b", Pending)],
            RestorePhase::Pending,
            "0/2 verified",
        ),
        (
            "one writing",
            vec![volume("a", Restoring), volume("b", Pending)],
            RestorePhase::Running,
            "0/2 verified",
        ),
        (
            "two of three",
            vec![
                volume("a", Verified),
                volume("b", Verified),
                volume("c", Verifying),
            ],
            RestorePhase::Running,
            "2/3 verified",
        ),
        (
            "all verified",
            vec![volume("a", Verified), volume("b", Verified)],
            RestorePhase::Completed,
            "2/2 verified",
        ),
        (
            "one failed",
            vec![volume("a", Verified), volume("b", Failed)],
            RestorePhase::Failed,
            "1/2 verified",
        ),
        (
            "no volumes is never completed",
            vec![],
            RestorePhase::Pending,
            "0/0 verified",
        ),
    ];
    for (name, volumes, phase, progress) in rows {
        let summary = summary(&volumes);
        assert_eq!(summary.phase, phase, "{name}");
        assert_eq!(summary.progress, progress, "{name}");
        assert_eq!(
            summary.failure.is_some(),
            phase == RestorePhase::Failed,
            "{name}"
        );
    }
    let failed = summary(&[volume("b", Failed)]);
    assert_eq!(
        failed.failure.unwrap(),
        ("ContentMismatch".to_string(), "claim b: why".to_string())
    );
}

#[test]
fn reports_are_filtered_and_the_most_advanced_wins() {
    let mut other_restore = reported("data-db-0", "db-0", VolumeState::Verified);
    other_restore.restore_uid = "another".into();
    let mut other_namespace = reported("data-db-0", "db-0", VolumeState::Verified);
    other_namespace.namespace = "elsewhere".into();
    let node_a = vec![
        reported("data-db-0", "db-0", VolumeState::Pending),
        other_restore,
        other_namespace,
        reported("not-ours", "db-9", VolumeState::Verified),
    ];
    let node_b = vec![reported("data-db-0", "db-0", VolumeState::Verifying)];
    let claims = vec!["data-db-0".to_string(), "data-db-1".to_string()];
    let found = reports_for(
        [("node-a", node_a.as_slice()), ("node-b", node_b.as_slice())],
        "ns",
        UID,
        &claims,
    );
    assert_eq!(found.len(), 1);
    let (volume, node) = found["data-db-0"];
    assert_eq!((volume.state, node), (VolumeState::Verifying, "node-b"));
}

#[test]
fn pods_are_released_only_when_all_their_volumes_are_verified() {
    let volumes = [
        reported("data-db-0", "db-0", VolumeState::Verified),
        reported("logs-db-0", "db-0", VolumeState::Verifying),
        reported("data-db-1", "db-1", VolumeState::Verified),
        reported("data-db-2", "db-2", VolumeState::Failed),
    ];
    let claims: Vec<String> = volumes
        .iter()
        .map(|volume| volume.claim_name.clone())
        .collect();
    let found = reports_for([("n", volumes.as_slice())], "ns", UID, &claims);
    let released = releasable_pods(&found, &claims);
    assert_eq!(released.into_iter().collect::<Vec<_>>(), ["db-1"]);
    // A pod of two volumes, one verified and the other not reported yet, stays held.
    let mut two = claims.clone();
    two.push("wal-db-1".into());
    let found = reports_for([("n", volumes.as_slice())], "ns", UID, &two);
    assert!(releasable_pods(&found, &two).is_empty());
}

fn job(name: &str, owner_uid: &str, label_uid: &str, deleting: bool) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(LABEL_RESTORE_UID.to_string(), label_uid.to_string())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "custody.io/v1alpha1".into(),
                kind: "Restore".into(),
                name: "r".into(),
                uid: owner_uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            deletion_timestamp: deleting.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..ObjectMeta::default()
        },
        ..Job::default()
    }
}

fn pod_of(job_uid: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-of-{job_uid}")),
            labels: Some([(LABEL_RESTORE_UID.to_string(), UID.to_string())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                name: "j".into(),
                uid: job_uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

#[test]
fn teardown_deletes_only_own_jobs_and_waits_for_their_pods() {
    let mut jobs = vec![
        job("ours", UID, UID, false),
        job("ours-going", UID, UID, true),
        job("look-alike", "someone-else", UID, false),
        job("mislabelled", UID, "someone-else", false),
    ];
    for (index, job) in jobs.iter_mut().enumerate() {
        job.metadata.uid = Some(format!("job-{index}"));
    }
    let plan = teardown(&jobs, &[], UID);
    assert_eq!(plan.delete, ["ours"]);
    assert!(plan.waiting);
    let foreign = &jobs[2..];
    let plan = teardown(foreign, &[pod_of("job-2")], UID);
    assert!(plan.delete.is_empty());
    assert!(
        !plan.waiting,
        "foreign Jobs and their pods do not hold the teardown"
    );
    assert!(
        teardown(&jobs[..1], &[pod_of("job-0")], UID).waiting,
        "own pods hold it"
    );
    assert!(
        !teardown(&[], &[pod_of("job-0")], UID).waiting,
        "pods of no known Job do not"
    );
    assert!(!teardown(&[], &[], UID).waiting);
}

#[test]
fn an_agent_speaks_only_for_pods_bound_to_its_node() {
    let pod = |name: &str, uid: &str, node: Option<&str>| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"nodeName": node, "containers": []},
        }))
        .unwrap()
    };
    let volume = |pod_name: &str, pod_uid: &str| ReportedVolume {
        pod_uid: pod_uid.into(),
        ..reported("data-db-0", pod_name, VolumeState::Verified)
    };
    let on_a = pod("db-0", "u0", Some("node-a"));
    let rows: Vec<(&str, &str, ReportedVolume, Vec<Pod>, bool)> = vec![
        (
            "its own pod",
            "node-a",
            volume("db-0", "u0"),
            vec![on_a.clone()],
            true,
        ),
        (
            "a pod on another node",
            "node-b",
            volume("db-0", "u0"),
            vec![on_a.clone()],
            false,
        ),
        (
            "a pod not scheduled",
            "node-a",
            volume("db-0", "u0"),
            vec![pod("db-0", "u0", None)],
            false,
        ),
        (
            "a replaced pod (old UID)",
            "node-a",
            volume("db-0", "u-old"),
            vec![on_a.clone()],
            false,
        ),
        (
            "a pod that is gone",
            "node-a",
            volume("db-0", "u0"),
            vec![],
            false,
        ),
        (
            "another pod's name",
            "node-a",
            volume("db-1", "u0"),
            vec![on_a.clone()],
            false,
        ),
        (
            "no UID reported",
            "node-a",
            volume("db-0", ""),
            vec![pod("db-0", "", Some("node-a"))],
            false,
        ),
        (
            "another namespace",
            "node-a",
            ReportedVolume {
                namespace: "other".into(),
                ..volume("db-0", "u0")
            },
            vec![on_a.clone()],
            false,
        ),
    ];
    for (name, node, volume, pods, expected) in rows {
        assert_eq!(speaks_for(node, &volume, &pods), expected, "{name}");
    }
}

#[test]
fn a_long_claim_gives_a_job_name_within_63_characters_that_keeps_its_start() {
    let claim = format!("data-{}", "x".repeat(80));
    let name = job_name(&claim, UID, 2);
    assert!(name.len() <= 63, "{} characters: {name}", name.len());
    assert!(name.ends_with("-restore-5e1f0a2b-2"), "{name}");
    assert_eq!(name.len(), 63, "as much of the claim as fits: {name}");
    assert!(name.starts_with("data-xxxx"), "{name}");
}

#[test]
fn a_volume_seen_for_the_first_time_is_named_by_its_claim() {
    let step = volume(
        &VolumeFacts {
            claim: "data-db-0",
            previous: None,
            reported: None,
            job: JobFact::Missing,
            job_problem: None,
            job_node: None,
            job_finished: None,
            reported_at: None,
            may_start: true,
        },
        UID,
    );
    assert_eq!(step.status.claim_name, "data-db-0");
}

#[test]
fn of_two_reports_of_one_claim_the_more_advanced_is_kept_whatever_the_order() {
    let behind = reported("data-db-0", "db-0", VolumeState::Restoring);
    let ahead = reported("data-db-0", "db-0", VolumeState::Verified);
    let claims = ["data-db-0".to_string()];
    for volumes in [
        vec![behind.clone(), ahead.clone()],
        vec![ahead.clone(), behind.clone()],
    ] {
        let found = reports_for([("node-a", volumes.as_slice())], "ns", UID, &claims);
        assert_eq!(found["data-db-0"].0.state, VolumeState::Verified);
    }
}

#[test]
fn reported_pods_are_those_of_this_restore_in_this_namespace() {
    let mine = reported("data-db-0", "db-0", VolumeState::Pending);
    let other_namespace = ReportedVolume {
        namespace: "elsewhere".into(),
        ..reported("data-db-1", "db-1", VolumeState::Pending)
    };
    let other_restore = ReportedVolume {
        restore_uid: "another-uid".into(),
        ..reported("data-db-2", "db-2", VolumeState::Pending)
    };
    let volumes = [mine, other_namespace, other_restore];
    assert_eq!(
        reported_pods([("node-a", volumes.as_slice())], "ns", UID),
        BTreeSet::from(["db-0".to_string()])
    );
}

/// The claims a Restore verified get its record, once, and only while they exist: a claim
/// with the known-data mark of another run (a Backup's) still gets this Restore's own record.
#[test]
fn verified_claims_get_the_restores_record_once() {
    let volume = |claim: &str, state| VolumeRestoreStatus {
        claim_name: claim.into(),
        state,
        ..VolumeRestoreStatus::default()
    };
    let volumes = [
        volume("data-db-0", VolumeState::Verified),
        volume("wal-db-0", VolumeState::Failed),
        volume("logs-db-0", VolumeState::Restoring),
        volume("data-db-1", VolumeState::Verified),
    ];
    assert_eq!(verified_claims(&volumes), ["data-db-0", "data-db-1"]);

    let own = custody_proto::names::verified_by_restore(UID);
    let other = custody_proto::names::verified_by_restore("another-restore");
    let known = custody_proto::names::ANNOTATION_KNOWN_DATA;
    let annotations = |keys: &[&str]| -> BTreeMap<String, String> {
        keys.iter()
            .map(|key| (key.to_string(), "db".to_string()))
            .collect()
    };
    let rows = [
        ("the claim is gone", None, false),
        ("no mark", Some(annotations(&[])), true),
        ("a Backup's mark only", Some(annotations(&[known])), true),
        (
            "another Restore's record",
            Some(annotations(&[known, &other])),
            true,
        ),
        (
            "this Restore's record only",
            Some(annotations(&[&own])),
            true,
        ),
        ("both", Some(annotations(&[known, &own])), false),
    ];
    for (name, annotations, needed) in rows {
        assert_eq!(needs_record(annotations.as_ref(), UID), needed, "{name}");
    }
}

#[test]
fn a_volume_keeps_the_time_it_entered_its_state() {
    use VolumeState::*;
    let now = Timestamp::from_second(1_000_000).unwrap();
    let earlier = Time(Timestamp::from_second(999_000).unwrap());
    let entered = |state, since: Option<Time>| VolumeRestoreStatus {
        last_transition_time: since,
        ..previous(state, 0)
    };
    // (previous, state now) -> when it entered it
    let rows = [
        (None, Pending, now),
        (
            Some(entered(Pending, Some(earlier.clone()))),
            Pending,
            earlier.0,
        ),
        (
            Some(entered(Pending, Some(earlier.clone()))),
            Verifying,
            now,
        ),
        (Some(entered(Verifying, None)), Verifying, now),
    ];
    for (before, state, expected) in rows {
        let after = since(step(state), before.as_ref(), now);
        assert_eq!(
            after.status.last_transition_time,
            Some(Time(expected)),
            "{before:?} -> {state:?}"
        );
    }
}

#[test]
fn waiting_volumes_fail_only_after_the_whole_restore_made_no_progress_past_the_deadline() {
    use VolumeState::*;
    let now = Timestamp::from_second(1_000_000).unwrap();
    let at = |state, seconds_ago: i64, message: &str| {
        let mut step = step(state);
        step.status.claim_name = format!("data-db-{seconds_ago}");
        step.status.message = Some(message.to_string());
        step.status.last_transition_time = Some(Time(
            Timestamp::from_second(now.as_second() - seconds_ago).unwrap(),
        ));
        step
    };
    // (volumes as (state, seconds in it)) -> the states after, deadline 600 s
    type Row = (&'static str, Vec<(VolumeState, i64)>, Vec<VolumeState>);
    let rows: Vec<Row> = vec![
        (
            "a pod never scheduled, past the deadline",
            vec![(Pending, 601)],
            vec![Failed],
        ),
        (
            "a pod not scheduled, at the deadline",
            vec![(Pending, 600)],
            vec![Pending],
        ),
        (
            "an agent that never finishes",
            vec![(Verifying, 700)],
            vec![Failed],
        ),
        (
            "waits behind a volume being written (Serial, or pods started one by one)",
            vec![(Restoring, 5_000), (Pending, 5_000)],
            vec![Restoring, Pending],
        ),
        (
            "another volume verified recently: progress",
            vec![(Verified, 30), (Pending, 5_000)],
            vec![Verified, Pending],
        ),
        (
            "no progress anywhere: every waiting volume fails, the verified one stays",
            vec![(Verified, 900), (Pending, 5_000), (Verifying, 800)],
            vec![Verified, Failed, Failed],
        ),
        (
            "a failed volume is left as it is",
            vec![(Failed, 9_000)],
            vec![Failed],
        ),
    ];
    for (name, volumes, expected) in rows {
        let mut steps: Vec<VolumeStep> = volumes
            .iter()
            .map(|(state, ago)| at(*state, *ago, "waiting for a pod that mounts claim x"))
            .collect();
        let before = steps.clone();
        past_deadline(&mut steps, now, 600);
        let states: Vec<VolumeState> = steps.iter().map(|step| step.status.state).collect();
        assert_eq!(states, expected, "{name}");
        for (old, new) in before.iter().zip(&steps) {
            if old.status.state != Failed && new.status.state == Failed {
                assert_eq!(
                    new.status.reason.as_deref(),
                    Some(PROGRESS_DEADLINE_EXCEEDED),
                    "{name}"
                );
                let message = new.status.message.clone().unwrap();
                assert!(
                    message.contains(&old.status.claim_name)
                        && message.contains("(600s)")
                        && message.contains("waiting for a pod that mounts claim x"),
                    "{name}: {message}"
                );
                assert_eq!(new.status.last_transition_time, Some(Time(now)), "{name}");
            } else {
                assert_eq!(old, new, "{name}: untouched");
            }
        }
    }
    assert_eq!(
        condition_reason(PROGRESS_DEADLINE_EXCEEDED),
        PROGRESS_DEADLINE_EXCEEDED
    );

    // A volume left Restoring while its node's agent is away waits for that agent: it counts
    // down, and does not exempt the others.
    for reason in [
        super::super::reasons::AGENT_MISSING,
        super::super::reasons::AGENT_NOT_READY,
    ] {
        let mut away = at(Restoring, 700, "its node's agent is not ready");
        away.status.reason = Some(reason.to_string());
        let mut steps = vec![away.clone(), at(Pending, 5_000, "waiting for a pod")];
        past_deadline(&mut steps, now, 600);
        let states: Vec<VolumeState> = steps.iter().map(|step| step.status.state).collect();
        assert_eq!(states, vec![Failed, Failed], "{reason}");
        assert!(
            steps[0]
                .status
                .message
                .as_deref()
                .is_some_and(|message| message.contains("stayed Restoring")
                    && message.contains("its node's agent is not ready")),
            "{:?}",
            steps[0].status
        );
        let mut steps = vec![away, at(Pending, 5_000, "waiting for a pod")];
        past_deadline(&mut steps, now, 800);
        assert_eq!(
            steps[0].status.state, Restoring,
            "{reason}: within the deadline"
        );
    }

    // A volume waiting for a mover's slot on its node waits behind running movers (each
    // bounded by its Job's deadline): nothing counts down, however long ago anything moved.
    let slot = wait_for_slot(None, "x", ("node-a", None), 2, 2);
    assert_eq!(slot.status.state, Pending);
    assert_eq!(slot.create, None);
    let mut waiting = at(Pending, 5_000, "waiting for a slot");
    waiting.status.reason = slot.status.reason.clone();
    let mut steps = vec![
        waiting,
        at(Pending, 5_000, "waiting for a pod"),
        at(Verifying, 5_000, "verifying"),
    ];
    let before = steps.clone();
    past_deadline(&mut steps, now, 600);
    assert_eq!(
        steps, before,
        "a volume waiting for a slot stops the countdown"
    );
    // What it was before is kept: a retry waiting for a slot keeps its attempts and state.
    let earlier = VolumeRestoreStatus {
        claim_name: "x".into(),
        state: Restoring,
        attempts: 2,
        job_name: Some("x-restore-1".into()),
        ..VolumeRestoreStatus::default()
    };
    let slot = wait_for_slot(Some(&earlier), "x", ("node-b", Some("db-1")), 4, 4);
    assert_eq!(
        (
            slot.status.state,
            slot.status.attempts,
            slot.status.job_name.as_deref()
        ),
        (Restoring, 2, Some("x-restore-1"))
    );
    assert_eq!(slot.status.node_name.as_deref(), Some("node-b"));
    assert_eq!(
        slot.status.pod_name.as_deref(),
        Some("db-1"),
        "the pod reported now"
    );
    assert!(
        slot.status
            .message
            .unwrap()
            .contains("4 of custody's movers already run on node node-b")
    );
}
