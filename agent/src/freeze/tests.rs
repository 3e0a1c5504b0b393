//! Who may freeze which filesystem, as rows.

use serde_json::json;

use super::*;

const NODE: &str = "node-a";

fn pod(role: Option<&str>, job_owner: bool) -> Pod {
    pod_of(role, job_owner, "job-uid")
}

/// A pod whose controlling Job (if `job_owner`) has UID `job_uid`.
fn pod_of(role: Option<&str>, job_owner: bool, job_uid: &str) -> Pod {
    let mut labels = serde_json::Map::new();
    if let Some(role) = role {
        labels.insert(custody_proto::names::LABEL_ROLE.into(), json!(role));
    }
    let owners = if job_owner {
        json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "nightly-backup-1", "uid": job_uid, "controller": true}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "nightly-backup-1-x", "namespace": "ns", "uid": "pod-uid",
                     "labels": labels, "ownerReferences": owners},
        "spec": {"nodeName": NODE, "containers": [{"name": "mover"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0", "readOnly": true}},
                             {"name": "scratch", "emptyDir": {}}]},
    }))
    .unwrap()
}

fn job(uid: &str, backup_owner: bool) -> Job {
    let owners = if backup_owner {
        json!([{"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "name": "nightly", "uid": "backup-uid", "controller": true}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "nightly-backup-1", "namespace": "ns", "uid": uid, "ownerReferences": owners},
    }))
    .unwrap()
}

fn backup(uid: &str, phase: &str, capture: &str, node: &str) -> Backup {
    recorded(uid, phase, capture, node, Some("job-uid"), None)
}

/// A Backup whose status records the Job of UID `job_uid` and the freeze bound `bound`.
fn recorded(
    uid: &str,
    phase: &str,
    capture: &str,
    node: &str,
    job_uid: Option<&str>,
    bound: Option<i32>,
) -> Backup {
    let mut status = json!({"phase": phase, "consistency": capture, "nodeName": node});
    if let Some(job_uid) = job_uid {
        status["job"] = json!({"name": "nightly-backup-1", "uid": job_uid});
    }
    if let Some(bound) = bound {
        status["maxFreezeSeconds"] = json!(bound);
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "nightly", "namespace": "ns", "uid": uid},
        "spec": {"clusterRef": {"name": "db"}},
        "status": status,
    }))
    .unwrap()
}

#[test]
fn only_a_frozen_backups_own_pod_on_this_node_freezes_a_claim_it_mounts() {
    let good = || {
        (
            pod(Some("backup"), true),
            Some(job("job-uid", true)),
            Some(backup("backup-uid", "Running", "Frozen", NODE)),
        )
    };
    type Row = (
        &'static str,
        (Pod, Option<Job>, Option<Backup>),
        &'static str,
        u32,
        Result<u32, &'static str>,
    );
    let rows: Vec<Row> = vec![
        (
            "the backup's pod, bounded by the request",
            good(),
            "data-db-0",
            30,
            Ok(30),
        ),
        (
            "a Backup that records no bound gets the default bound",
            good(),
            "data-db-0",
            9000,
            Ok(60),
        ),
        (
            "the Backup's recorded bound wins over a larger request",
            {
                let (pod, job, _) = good();
                let backup = recorded(
                    "backup-uid",
                    "Running",
                    "Frozen",
                    NODE,
                    Some("job-uid"),
                    Some(20),
                );
                (pod, job, Some(backup))
            },
            "data-db-0",
            120,
            Ok(20),
        ),
        (
            "a smaller request wins over the Backup's bound",
            {
                let (pod, job, _) = good();
                let backup = recorded(
                    "backup-uid",
                    "Running",
                    "Frozen",
                    NODE,
                    Some("job-uid"),
                    Some(20),
                );
                (pod, job, Some(backup))
            },
            "data-db-0",
            5,
            Ok(5),
        ),
        (
            "the agent's limit wins over the Backup's bound",
            {
                let (pod, job, _) = good();
                let backup = recorded(
                    "backup-uid",
                    "Running",
                    "Frozen",
                    NODE,
                    Some("job-uid"),
                    Some(900),
                );
                (pod, job, Some(backup))
            },
            "data-db-0",
            9000,
            Ok(600),
        ),
        (
            "a forged Job: the Backup as its controller, the role label, not the recorded UID",
            {
                let (_, _, backup) = good();
                (
                    pod_of(Some("backup"), true, "forged-uid"),
                    Some(job("forged-uid", true)),
                    backup,
                )
            },
            "data-db-0",
            30,
            Err("NotCustodysJob"),
        ),
        (
            "the Backup has recorded its Job as coming, not its UID yet",
            {
                let (pod, job, _) = good();
                let backup = recorded("backup-uid", "Running", "Frozen", NODE, Some(""), None);
                (pod, job, Some(backup))
            },
            "data-db-0",
            30,
            Err("JobNotRecorded"),
        ),
        (
            "a Backup an older custody started records no Job",
            {
                let (pod, job, _) = good();
                let backup = recorded("backup-uid", "Running", "Frozen", NODE, None, None);
                (pod, job, Some(backup))
            },
            "data-db-0",
            30,
            Err("NoJobRecorded"),
        ),
        (
            "a Backup that is over is refused as such, recorded Job or not",
            {
                let (pod, job, _) = good();
                let backup = recorded("backup-uid", "Failed", "Frozen", NODE, Some(""), None);
                (pod, job, Some(backup))
            },
            "data-db-0",
            30,
            Err("NotAFrozenCopy"),
        ),
        (
            "no role label",
            {
                let (_, job, backup) = good();
                (pod(None, true), job, backup)
            },
            "data-db-0",
            30,
            Err("NotABackupPod"),
        ),
        (
            "another role",
            {
                let (_, job, backup) = good();
                (pod(Some("prepare-data"), true), job, backup)
            },
            "data-db-0",
            30,
            Err("NotABackupPod"),
        ),
        (
            "no controlling Job",
            {
                let (_, job, backup) = good();
                (pod(Some("backup"), false), job, backup)
            },
            "data-db-0",
            30,
            Err("NotABackupPod"),
        ),
        (
            "the Job is gone",
            {
                let (pod, _, backup) = good();
                (pod, None, backup)
            },
            "data-db-0",
            30,
            Err("JobMissing"),
        ),
        (
            "a Job of that name with another UID",
            {
                let (pod, _, backup) = good();
                (pod, Some(job("other-uid", true)), backup)
            },
            "data-db-0",
            30,
            Err("NotTheBackupsJob"),
        ),
        (
            "a Job no Backup controls",
            {
                let (pod, _, backup) = good();
                (pod, Some(job("job-uid", false)), backup)
            },
            "data-db-0",
            30,
            Err("NotTheBackupsJob"),
        ),
        (
            "the Backup is gone",
            {
                let (pod, job, _) = good();
                (pod, job, None)
            },
            "data-db-0",
            30,
            Err("BackupMissing"),
        ),
        (
            "a Backup of that name with another UID",
            {
                let (pod, job, _) = good();
                (pod, job, Some(backup("other", "Running", "Frozen", NODE)))
            },
            "data-db-0",
            30,
            Err("BackupMissing"),
        ),
        (
            "the Backup is a crash-unsafe copy",
            {
                let (pod, job, _) = good();
                (
                    pod,
                    job,
                    Some(backup("backup-uid", "Running", "CrashUnsafe", NODE)),
                )
            },
            "data-db-0",
            30,
            Err("NotAFrozenCopy"),
        ),
        (
            "the Backup is over",
            {
                let (pod, job, _) = good();
                (
                    pod,
                    job,
                    Some(backup("backup-uid", "Completed", "Frozen", NODE)),
                )
            },
            "data-db-0",
            30,
            Err("NotAFrozenCopy"),
        ),
        (
            "the Backup runs on another node",
            {
                let (pod, job, _) = good();
                (
                    pod,
                    job,
                    Some(backup("backup-uid", "Running", "Frozen", "node-b")),
                )
            },
            "data-db-0",
            30,
            Err("OtherNode"),
        ),
        (
            "a claim the pod does not mount",
            good(),
            "data-other-0",
            30,
            Err("ClaimNotMounted"),
        ),
        ("no time", good(), "data-db-0", 0, Err("NoTime")),
    ];
    for (name, (pod, job, backup), claim, requested, want) in rows {
        let got = authorize(
            NODE,
            &pod,
            claim,
            job.as_ref(),
            backup.as_ref(),
            requested,
            600,
        );
        match (got, want) {
            (Ok(grant), Ok(seconds)) => {
                assert_eq!(grant.max_seconds, seconds, "{name}");
                assert_eq!(grant.volume, "data", "{name}");
            }
            (Err(refusal), Err(reason)) => {
                assert_eq!(refusal.reason(), reason, "{name}: {refusal}")
            }
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

fn mount(device: &str, root: &str, point: &str, fs_type: &str) -> Mount {
    Mount {
        device: device.into(),
        root: root.into(),
        mount_point: point.into(),
        fs_type: fs_type.into(),
        source: "/dev/x".into(),
    }
}

#[test]
fn only_a_whole_filesystem_of_its_own_is_frozen() {
    let path = Path::new("/var/lib/kubelet/pods/p/volumes/kubernetes.io~local-volume/pv");
    let point = path.to_str().unwrap();
    let node = vec!["253:1".to_string()];
    let rows: Vec<(&str, Vec<Mount>, Result<&str, &str>)> = vec![
        (
            "an ext4 volume of its own",
            vec![mount("7:3", "/", point, "ext4")],
            Ok("7:3"),
        ),
        ("xfs", vec![mount("7:4", "/", point, "xfs")], Ok("7:4")),
        (
            "not mounted",
            vec![mount("7:3", "/", "/elsewhere", "ext4")],
            Err("NotAMountPoint"),
        ),
        (
            "a directory of a larger filesystem (a hostPath-like local volume)",
            vec![mount("7:3", "/volumes/pv", point, "ext4")],
            Err("NotAWholeFilesystem"),
        ),
        (
            "tmpfs",
            vec![mount("0:52", "/", point, "tmpfs")],
            Err("UnsupportedFilesystem"),
        ),
        (
            "the node's disk",
            vec![mount("253:1", "/", point, "ext4")],
            Err("NodeFilesystem"),
        ),
        (
            "the last mount on the path counts",
            vec![
                mount("7:3", "/", point, "ext4"),
                mount("7:9", "/sub", point, "ext4"),
            ],
            Err("NotAWholeFilesystem"),
        ),
    ];
    for (name, mounts, want) in rows {
        match (freezable(path, &mounts, &node), want) {
            (Ok(device), Ok(expected)) => assert_eq!(device, expected, "{name}"),
            (Err(refusal), Err(reason)) => {
                assert_eq!(refusal.reason(), reason, "{name}: {refusal}")
            }
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn the_device_of_a_path_is_its_deepest_mount() {
    let mounts = vec![
        mount("253:1", "/", "/", "ext4"),
        mount("253:1", "/var/lib/kubelet", "/var/lib/kubelet", "ext4"),
        mount("7:3", "/", "/var/lib/kubelet/pods/p/volumes/x/pv", "ext4"),
    ];
    assert_eq!(
        device_of(Path::new("/var/lib/kubelet"), &mounts).as_deref(),
        Some("253:1")
    );
    assert_eq!(
        device_of(Path::new("/var/lib/kubelet/pods/p/volumes/x/pv/a"), &mounts).as_deref(),
        Some("7:3")
    );
    assert_eq!(
        device_of(Path::new("/srv"), &mounts).as_deref(),
        Some("253:1")
    );
}

/// The notes of freezes, as the agent and the watchdog share them.
mod notes {
    use super::super::*;

    fn note(id: &str, path: &Path, deadline: i64) -> Note {
        Note {
            id: id.into(),
            path: path.to_path_buf(),
            deadline_boot_millis: deadline,
            frozen_at_unix_nanos: 1_700_000_000_000_000_000,
            max_seconds: 5,
            owner: Some(Owner {
                namespace: "ns".into(),
                backup: "nightly".into(),
                backup_uid: "backup-uid".into(),
                claim: "data-db-0".into(),
            }),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_note_reads_back_and_an_older_agents_note_is_due_at_once() {
        let written = note("f1", Path::new("/var/lib/kubelet/pods/x/volumes/v"), 1234);
        assert_eq!(Note::parse(&written.render()), Some(written));
        let old = Note::parse("/var/lib/kubelet/pods/x/volumes/v").unwrap();
        assert_eq!(old.deadline_boot_millis, 0);
        assert_eq!(old.id, "");
        assert_eq!(Note::parse(""), None);
    }

    #[test]
    fn a_thaw_is_recorded_for_the_report_and_a_broken_record_is_dropped() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path();
        let frozen = note("f1", Path::new("/gone"), 10);
        record_thaw(dir, "7:3", &frozen, Thawer::Watchdog).unwrap();
        std::fs::write(dir.join("thawed-broken"), b"{not json").unwrap();
        let records = thaw_records(dir);
        assert_eq!(records.len(), 1, "{records:?}");
        let (file, record) = &records[0];
        assert_eq!(file, &dir.join("thawed-f1"));
        assert_eq!(record.thawer, "watchdog");
        assert_eq!(record.device, "7:3");
        assert_eq!(record.max_seconds, 5);
        assert_eq!(record.frozen_at_unix_nanos, frozen.frozen_at_unix_nanos);
        assert!(record.thawed_at_unix_nanos > frozen.frozen_at_unix_nanos);
        assert_eq!(record.owner, frozen.owner);
        // The broken one is gone; nothing is half written; notes are not records.
        assert_eq!(names(dir), ["thawed-f1"]);
        create_note(dir, "7:4", &note("f2", dir, 10)).unwrap();
        assert_eq!(thaw_records(dir).len(), 1);
        // An older agent's note says nothing of when it froze: nothing to report.
        let legacy = Note::parse("/gone").unwrap();
        record_thaw(dir, "7:5", &legacy, Thawer::Agent).unwrap();
        assert_eq!(thaw_records(dir).len(), 1);
        // A record no controller accepted for a day is dropped.
        let mut old = record.clone();
        old.id = "old".into();
        old.thawed_at_unix_nanos = 1;
        std::fs::write(dir.join("thawed-old"), serde_json::to_vec(&old).unwrap()).unwrap();
        assert_eq!(thaw_records(dir).len(), 1);
        assert!(!dir.join("thawed-old").exists());
    }

    #[test]
    fn one_note_per_filesystem_and_each_freeze_is_claimed_exactly_once() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path();
        assert!(create_note(dir, "7:3", &note("first", dir, 10)).unwrap());
        // A second freeze of the same filesystem is refused and leaves the first note as it was.
        assert!(!create_note(dir, "7:3", &note("second", dir, 20)).unwrap());
        assert_eq!(names(dir), ["frozen-7_3.first"]);
        // Another filesystem is noted beside it.
        assert!(create_note(dir, "7:4", &note("other", dir, 10)).unwrap());
        // A claim renames exactly one freeze's note.
        assert!(claim(dir, "7_3", "second", Thawer::Agent).is_none());
        let (claimed, found) = claim(dir, "7_3", "first", Thawer::Watchdog).unwrap();
        assert_eq!(found, note("first", dir, 10));
        assert!(claimed.exists());
        // Claimed once: neither party claims it again.
        assert!(claim(dir, "7_3", "first", Thawer::Agent).is_none());
        assert!(claim(dir, "7_3", "first", Thawer::Watchdog).is_none());
        // While the claim is unfinished (its FITHAW may still come), no new freeze of that
        // filesystem is noted: a late thaw can never end the next freeze.
        assert!(!create_note(dir, "7:3", &note("third", dir, 30)).unwrap());
        std::fs::remove_file(claimed).unwrap();
        assert!(create_note(dir, "7:3", &note("third", dir, 30)).unwrap());
    }

    #[test]
    fn the_watchdog_thaws_only_what_is_past_its_bound() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path();
        // Noted mounts that are gone, on devices mounted nowhere: nothing is left frozen.
        let gone = dir.join("gone");
        create_note(dir, "7:3", &note("due", &gone, 1_000)).unwrap();
        create_note(dir, "7:4", &note("later", &gone, 5_000)).unwrap();
        let thawed = thaw_due(dir, 2_000, Thawer::Watchdog, STALE_CLAIM_MILLIS, &[]);
        assert_eq!(thawed.len(), 1);
        assert_eq!(thawed[0].0, "7:3");
        assert!(matches!(thawed[0].1, Ok(false)), "{:?}", thawed[0].1);
        assert_eq!(names(dir), ["frozen-7_4.later"]);
        // At its bound, the other one.
        assert_eq!(
            thaw_due(dir, 5_000, Thawer::Watchdog, STALE_CLAIM_MILLIS, &[]).len(),
            1
        );
        assert!(names(dir).is_empty());
    }

    #[test]
    fn a_failed_thaw_stays_claimed_and_is_tried_again() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path();
        // The noted mount is gone, but the device is still mounted (elsewhere than this test
        // can reach): the thaw fails, and the claim is kept for the next sweep.
        let mounts = [crate::volumes::Mount {
            device: "7:3".into(),
            root: "/".into(),
            mount_point: dir.join("elsewhere"),
            fs_type: "ext4".into(),
            source: "/dev/loop3".into(),
        }];
        create_note(dir, "7:3", &note("f", &dir.join("gone"), 0)).unwrap();
        let thawed = thaw_due(dir, 1, Thawer::Watchdog, STALE_CLAIM_MILLIS, &mounts);
        assert!(thawed[0].1.is_err(), "{:?}", thawed[0].1);
        let left = names(dir);
        assert_eq!(left.len(), 1);
        assert!(left[0].starts_with("thawing-7_3.f.watchdog."), "{left:?}");
        // The same thawer tries it again at once; the other only once it is stale.
        assert!(thaw_due(dir, 1, Thawer::Agent, STALE_CLAIM_MILLIS, &mounts).is_empty());
        assert_eq!(
            thaw_due(dir, 1, Thawer::Watchdog, STALE_CLAIM_MILLIS, &mounts).len(),
            1
        );
        assert_eq!(thaw_due(dir, 1, Thawer::Agent, 0, &mounts).len(), 1);
        // Once the device is mounted nowhere, the claim is finished.
        assert_eq!(thaw_due(dir, 1, Thawer::Watchdog, 0, &[]).len(), 1);
        assert!(names(dir).is_empty());
    }

    #[test]
    fn a_claim_left_by_a_stopped_agent_is_taken_over_once_stale() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path();
        create_note(dir, "7:3", &note("f", &dir.join("gone"), i64::MAX)).unwrap();
        // The agent claimed it and stopped before FITHAW.
        let (claimed, _) = claim(dir, "7_3", "f", Thawer::Agent).unwrap();
        // The watchdog leaves a fresh claim alone (the agent may be thawing it now) ...
        assert!(thaw_due(dir, 0, Thawer::Watchdog, 60_000, &[]).is_empty());
        assert!(claimed.exists());
        // ... and finishes a stale one.
        assert_eq!(thaw_due(dir, 0, Thawer::Watchdog, 0, &[]).len(), 1);
        assert!(!claimed.exists());
    }

    #[test]
    fn an_older_agents_note_is_thawed_at_once() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path();
        std::fs::write(
            dir.join("frozen-7_3"),
            dir.join("gone").display().to_string(),
        )
        .unwrap();
        assert_eq!(entries(dir).len(), 1);
        let thawed = thaw_due(dir, 0, Thawer::Watchdog, STALE_CLAIM_MILLIS, &[]);
        assert_eq!(thawed.len(), 1);
        assert!(names(dir).is_empty());
    }
}
