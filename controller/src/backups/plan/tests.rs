//! Every path a reconciliation of a Backup takes, as rows: the facts it read, and what the
//! plan says (phase and reason written, Events, the Job, the Secret held, the Lease step,
//! requeue).
//! Long on purpose (over the ~600 lines a module should stay under): a row is a whole
//! scenario, and one table keeps every path of the plan side by side.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::attribution::Candidate;
use custody_kube::api::Artifact;

const UID: &str = "b0b0b0b0-0000-4000-8000-000000000001";
const NODE: &str = "node-a";

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

fn backup(command: bool) -> Backup {
    let mut spec = json!({"clusterRef": {"name": "orders"}});
    if command {
        spec["command"] = json!({"image": "pg", "command": ["dump"], "prefix": "dumps"});
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": "nightly", "namespace": "ns", "uid": UID, "generation": 1,
            "finalizers": [crate::artifacts::FINALIZER]},
        "spec": spec,
    }))
    .unwrap()
}

/// Cluster `orders` (StatefulSet `db`), whose Backups copy a running pod's volume knowingly
/// crash-unsafe.
fn cluster(repository: bool) -> Cluster {
    let mut spec = json!({"statefulSetRef": {"name": "db"}, "volumeClaimTemplates": ["data"],
        "consistency": {"method": "CrashUnsafe"}});
    if repository {
        spec["repositoryRef"] = json!({"name": "store"});
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "orders", "namespace": "ns", "uid": "cluster-uid"},
        "spec": spec,
    }))
    .unwrap()
}

fn repository(ready: &str) -> BackupRepository {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "BackupRepository",
        "metadata": {"name": "store", "namespace": "ns"},
        "spec": {"endpoint": "http://s3", "bucket": "bucket", "prefix": "custody",
            "credentialsSecretRef": {"name": "s3"}, "encryption": {"keySecretRef": {"name": "keys"}}},
        "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "Available",
            "message": "the bucket answers", "lastTransitionTime": "2026-11-30T11:00:00Z"}],
            "repository": {"id": REPOSITORY_ID, "prefix": "custody/custody_repository",
                "masterKeySecret": "store-master-key", "keySecretVersion": "1"}},
    }))
    .unwrap()
}

const REPOSITORY_ID: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";
const ORIGIN: &str = "kube-system-uid";

fn restore(phase: &str) -> Restore {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Restore",
        "metadata": {"name": "orders", "namespace": "ns"},
        "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "older"}},
        "status": {"phase": phase},
    }))
    .unwrap()
}

/// A Backup ready to start: its Cluster names a ready repository, the claim exists and a
/// running pod on `node-a` mounts it.
fn facts() -> Facts {
    Facts {
        backup: backup(false),
        now: now(),
        mover: crate::mover_job::MoverJob::new("mover:1"),
        cluster: Some(cluster(true)),
        claims_missing: Vec::new(),
        mount_paths: BTreeMap::new(),
        repository: Some(repository("True")),
        job: JobFact::Missing,
        restores: Vec::new(),
        claim_uid: Some("claim-uid".into()),
        mounted_on: Some(mounter(NODE)),
        started_during: None,
        clock: None,
        report: None,
        tool_failure: None,
        scratch_check: None,
        listing: None,
        job_pod_problem: None,
        tool_clock: super::decide::ToolClock::Unbounded,
        others: Vec::new(),
        origin_cluster: Some(ORIGIN.into()),
        parent_snapshot: None,
        mover_slots: BTreeMap::new(),
        transfer_report: None,
    }
}

/// [`facts`] with at most `bound` movers per node, `taken` of them running on the Backup's node.
fn slots(bound: u32, taken: u32) -> Facts {
    let mut facts = facts();
    facts.mover.movers_per_node = bound;
    facts.mover_slots = BTreeMap::from([(NODE.to_string(), taken), ("node-z".to_string(), 9)]);
    facts
}

fn mounter(node: &str) -> Mounter {
    Mounter {
        pod: "db-0".into(),
        node: node.into(),
        ip: Some("10.0.0.7".into()),
        stateful_set: Some("db".into()),
    }
}

/// Cluster `orders` with no consistency method.
fn cluster_without_method() -> Cluster {
    let mut cluster = cluster(true);
    cluster.spec.consistency = None;
    cluster
}

/// The Backup after its keys were recorded and its Job created on `node-a`.
fn started(mut facts: Facts, state: JobState) -> Facts {
    let keys = custody_proto::mover::object_keys(&format!("custody/ns/orders/{UID}"));
    facts.backup.status = Some(BackupStatus {
        phase: Some(BackupPhase::Running),
        node_name: Some(NODE.into()),
        start_time: Some(Time("2026-11-30T11:59:00Z".parse().unwrap())),
        artifact: (facts.backup.spec.command.is_none()).then(|| Artifact {
            prefix: format!("custody/ns/orders/{UID}"),
            key: keys.0,
            manifest_key: keys.1,
            ..Artifact::default()
        }),
        ..BackupStatus::default()
    });
    facts.job = JobFact::Owned(state);
    facts
}

/// A started Backup recorded as a copy of a stopped application (no node).
fn stopped(mut facts: Facts) -> Facts {
    let status = facts.backup.status.as_mut().unwrap();
    status.consistency = Some(custody_kube::api::Capture::Stopped);
    status.node_name = None;
    facts.mounted_on = None;
    facts
}

fn report(key_uid: &str) -> Option<String> {
    let (key, manifest_key) =
        custody_proto::mover::object_keys(&format!("custody/ns/orders/{key_uid}"));
    Some(
        json!({"key": key, "manifestKey": manifest_key, "sizeBytes": 42, "checksum": "c",
            "manifestHash": "m", "files": 1, "entries": 1, "totalBytes": 5})
        .to_string(),
    )
}

#[derive(Debug, PartialEq)]
struct Expect {
    phase: Option<BackupPhase>,
    reason: Option<String>,
    events: Vec<(String, bool)>,
    job: bool,
    hold_secret: bool,
    lease: LeaseStep,
    requeue: Option<u64>,
}

fn seen(plan: &Plan) -> Expect {
    Expect {
        phase: plan.status.as_ref().and_then(|status| status.phase),
        reason: plan
            .status
            .as_ref()
            .and_then(|status| status.conditions.first())
            .map(|ready| ready.reason.clone()),
        events: plan
            .events
            .iter()
            .map(|note| (note.reason.clone(), note.warning))
            .collect(),
        job: plan.job.is_some(),
        hold_secret: plan.hold_secret.is_some(),
        lease: plan.lease.clone(),
        requeue: plan.requeue.map(|after| after.as_secs()),
    }
}

fn expect(
    phase: Option<BackupPhase>,
    reason: Option<&str>,
    events: &[(&str, bool)],
    job: bool,
    hold_secret: bool,
    lease: LeaseStep,
    requeue: Option<u64>,
) -> Expect {
    Expect {
        phase,
        reason: reason.map(str::to_string),
        events: events
            .iter()
            .map(|(reason, warning)| (reason.to_string(), *warning))
            .collect(),
        job,
        hold_secret,
        lease,
        requeue,
    }
}

#[test]
fn every_path_of_a_reconciliation() {
    use BackupPhase::*;
    use LeaseStep::*;
    const WARN: bool = true;
    const NORMAL: bool = false;
    let pending = |reason: &str, retry: u64| {
        expect(
            Some(Pending),
            Some(reason),
            &[(reason, WARN)],
            false,
            false,
            Keep,
            Some(retry),
        )
    };
    let rows: Vec<(&str, Facts, Expect)> = vec![
        (
            "ready: record the keys, hold the Secret, create the Job under the Lease",
            facts(),
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[("BackupStarted", NORMAL)],
                true,
                true,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "every slot of its node taken: waits, nothing started, told as a Normal Event",
            slots(2, 2),
            expect(
                Some(Pending),
                Some(crate::node_slots::MOVER_SLOTS_BUSY),
                &[(crate::node_slots::MOVER_SLOTS_BUSY, NORMAL)],
                false,
                false,
                Keep,
                Some(10),
            ),
        ),
        (
            "a slot free on its node (another node full): starts",
            slots(2, 1),
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[("BackupStarted", NORMAL)],
                true,
                true,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "no bound: starts whatever runs there",
            slots(0, 50),
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[("BackupStarted", NORMAL)],
                true,
                true,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "started, its Job not yet created, its node full since: the slot was its own when it started",
            Facts {
                job: JobFact::Missing,
                ..started(slots(1, 5), JobState::Running)
            },
            expect(
                Some(Running),
                None,
                &[("BackupStarted", NORMAL)],
                true,
                false,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "completed: nothing to do",
            {
                let mut facts = started(facts(), JobState::Succeeded);
                facts.backup.status.as_mut().unwrap().phase = Some(Completed);
                facts
            },
            expect(None, None, &[], false, false, Keep, None),
        ),
        (
            "failed: nothing to do",
            {
                let mut facts = facts();
                facts.backup.status = Some(BackupStatus {
                    phase: Some(Failed),
                    ..BackupStatus::default()
                });
                facts
            },
            expect(None, None, &[], false, false, Keep, None),
        ),
        (
            "no Cluster",
            Facts {
                cluster: None,
                ..facts()
            },
            pending(reasons::CLUSTER_NOT_FOUND, 30),
        ),
        (
            "no repository named",
            Facts {
                cluster: Some(cluster(false)),
                ..facts()
            },
            pending(reasons::NO_REPOSITORY, 60),
        ),
        (
            "the repository does not exist",
            Facts {
                repository: None,
                ..facts()
            },
            pending(reasons::REPOSITORY_NOT_FOUND, 30),
        ),
        (
            "the repository is not ready",
            Facts {
                repository: Some(repository("False")),
                ..facts()
            },
            pending(reasons::REPOSITORY_NOT_READY, 15),
        ),
        (
            "a run under way concludes even when a later check of the repository failed",
            Facts {
                repository: Some(repository("False")),
                report: report(UID),
                ..started(facts(), JobState::Succeeded)
            },
            expect(
                Some(Completed),
                Some(reasons::COMPLETED),
                &[("BackupCompleted", NORMAL)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "no volume claim template",
            Facts {
                cluster: Some({
                    let mut cluster = cluster(true);
                    cluster.spec.volume_claim_templates.clear();
                    cluster
                }),
                ..facts()
            },
            pending(reasons::CLAIM_NOT_FOUND, 60),
        ),
        (
            "a restore of the Cluster is not over: wait for it",
            Facts {
                restores: vec![restore("Running")],
                ..facts()
            },
            pending(holds::RESTORE_IN_PROGRESS, 5),
        ),
        (
            "a finished restore holds nothing",
            Facts {
                restores: vec![restore("Completed")],
                ..facts()
            },
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[("BackupStarted", NORMAL)],
                true,
                true,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "the claim does not exist",
            Facts {
                claim_uid: None,
                ..facts()
            },
            pending(reasons::CLAIM_NOT_FOUND, 15),
        ),
        (
            "no running pod mounts the claim: copied as a stopped application",
            Facts {
                mounted_on: None,
                cluster: Some(cluster_without_method()),
                ..facts()
            },
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[("BackupStarted", NORMAL)],
                true,
                true,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "a running pod mounts the claim and no method is chosen: refused",
            Facts {
                cluster: Some(cluster_without_method()),
                ..facts()
            },
            expect(
                Some(Failed),
                Some(reasons::CONSISTENCY_METHOD_REQUIRED),
                &[(reasons::CONSISTENCY_METHOD_REQUIRED, WARN)],
                false,
                false,
                Keep,
                None,
            ),
        ),
        (
            "the Backup's own method counts when its Cluster has none",
            Facts {
                backup: {
                    let mut backup = backup(false);
                    backup.spec.consistency = Some(custody_kube::api::Consistency {
                        method: custody_kube::api::ConsistencyMethod::CrashUnsafe,
                        max_freeze_seconds: None,
                        tool: None,
                        hooks: None,
                    });
                    backup
                },
                cluster: Some(cluster_without_method()),
                ..facts()
            },
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[("BackupStarted", NORMAL)],
                true,
                true,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "a command needs its volume mounted by a running pod",
            Facts {
                backup: backup(true),
                mounted_on: None,
                ..facts()
            },
            pending(reasons::VOLUME_NOT_MOUNTED, 10),
        ),
        (
            "a command of a running application needs no method: it is the user's own",
            Facts {
                backup: backup(true),
                cluster: Some(cluster_without_method()),
                ..facts()
            },
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[("BackupStarted", NORMAL)],
                true,
                true,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "a stopped copy during which the application started fails",
            Facts {
                report: report(UID),
                started_during: Some("db-0".into()),
                ..stopped(started(facts(), JobState::Succeeded))
            },
            expect(
                Some(Failed),
                Some(reasons::APPLICATION_STARTED),
                &[(reasons::APPLICATION_STARTED, WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "a stopped copy the application left alone completes",
            Facts {
                report: report(UID),
                ..stopped(started(facts(), JobState::Succeeded))
            },
            expect(
                Some(Completed),
                Some(reasons::COMPLETED),
                &[("BackupCompleted", NORMAL)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "started, the Job not yet created: created on the recorded node, keys not rewritten",
            Facts {
                job: JobFact::Missing,
                mounted_on: Some(mounter("node-b")),
                ..started(facts(), JobState::Running)
            },
            expect(
                Some(Running),
                None,
                &[("BackupStarted", NORMAL)],
                true,
                false,
                TakeFirst,
                Some(60),
            ),
        ),
        (
            "a Job of that name is someone else's",
            Facts {
                job: JobFact::Foreign,
                ..facts()
            },
            pending(reasons::JOB_NAME_TAKEN, 60),
        ),
        (
            "a Job of that name whose creation was never recorded: stopped, and the Backup fails",
            Facts {
                job: JobFact::Unproven,
                ..started(facts(), JobState::Running)
            },
            expect(
                Some(Failed),
                Some(reasons::JOB_NOT_PROVEN),
                &[(reasons::JOB_NOT_PROVEN, WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "the Job runs",
            {
                let mut facts = started(facts(), JobState::Running);
                facts.backup.status.as_mut().unwrap().phase = Some(Pending);
                facts
            },
            expect(
                Some(Running),
                Some(reasons::RUNNING),
                &[],
                false,
                false,
                Keep,
                Some(60),
            ),
        ),
        (
            "the mover reports the recorded keys: completed, the Lease goes back",
            Facts {
                report: report(UID),
                ..started(facts(), JobState::Succeeded)
            },
            expect(
                Some(Completed),
                Some(reasons::COMPLETED),
                &[("BackupCompleted", NORMAL)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "the mover reports other keys: failed",
            Facts {
                report: report("another-uid"),
                ..started(facts(), JobState::Succeeded)
            },
            expect(
                Some(Failed),
                Some(decide::ARTIFACT_KEY_MISMATCH),
                &[(decide::ARTIFACT_KEY_MISMATCH, WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "the mover failed with a reason",
            Facts {
                report: Some(custody_proto::mover::failure_text(
                    custody_proto::reasons::MoverFailure::UploadFailed,
                    "the bucket is gone".into(),
                )),
                ..started(
                    facts(),
                    JobState::Failed {
                        message: "BackoffLimitExceeded".into(),
                    },
                )
            },
            expect(
                Some(Failed),
                Some("UploadFailed"),
                &[("UploadFailed", WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "the Job failed without a report",
            started(
                facts(),
                JobState::Failed {
                    message: "DeadlineExceeded".into(),
                },
            ),
            expect(
                Some(Failed),
                Some(decide::JOB_FAILED),
                &[(decide::JOB_FAILED, WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "the Job succeeded without a report",
            started(facts(), JobState::Succeeded),
            expect(
                Some(Failed),
                Some(decide::MOVER_REPORT_MISSING),
                &[(decide::MOVER_REPORT_MISSING, WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "a command's dumps could not be listed",
            Facts {
                backup: backup(true),
                listing: Some(Err(("ListFailed", "the server answered HTTP 503".into()))),
                ..started(
                    Facts {
                        backup: backup(true),
                        ..facts()
                    },
                    JobState::Succeeded,
                )
            },
            expect(
                Some(Failed),
                Some("ListFailed"),
                &[("ListFailed", WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "a command wrote nothing in its run",
            Facts {
                listing: Some(Ok(Listing::default())),
                ..started(
                    Facts {
                        backup: backup(true),
                        ..facts()
                    },
                    JobState::Succeeded,
                )
            },
            expect(
                Some(Failed),
                Some("NoClockOffset"),
                &[("NoClockOffset", WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
        (
            "a command's Job failed",
            started(
                Facts {
                    backup: backup(true),
                    ..facts()
                },
                JobState::Failed {
                    message: "exit 1".into(),
                },
            ),
            expect(
                Some(Failed),
                Some(decide::JOB_FAILED),
                &[(decide::JOB_FAILED, WARN)],
                false,
                false,
                Release,
                None,
            ),
        ),
    ];
    for (name, facts, expected) in rows {
        assert_eq!(seen(&plan(&facts)), expected, "{name}");
    }
}

#[test]
fn the_finalizer_comes_before_anything_else() {
    let mut facts = facts();
    facts.backup.metadata.finalizers = None;
    let plan = plan(&facts);
    assert!(plan.add_finalizer);
    assert_eq!(
        (plan.job, plan.status, plan.hold_secret),
        (None, None, None)
    );
}

#[test]
fn the_snapshot_is_recorded_with_the_node_and_its_clock() {
    let clock = ClockMeasurement {
        offset_nanoseconds: 5,
        round_trip_nanoseconds: 7,
        measured_at: Time(now()),
    };
    let plan = plan(&Facts {
        clock: Some(clock.clone()),
        parent_snapshot: Some("a1".repeat(32)),
        ..facts()
    });
    let status = plan.status.unwrap();
    let artifact = status.artifact.unwrap();
    // No key of its own: the encrypted repository, its ID and this cluster, recorded before
    // the Job exists; the snapshot's ID once written.
    assert_eq!(
        (artifact.key.as_str(), artifact.manifest_key.as_str()),
        ("", "")
    );
    assert_eq!(artifact.prefix, "custody/custody_repository");
    let snapshot = artifact.snapshot.clone().unwrap();
    assert_eq!(
        (
            snapshot.repository_id.as_str(),
            snapshot.id,
            snapshot.origin_cluster.as_str()
        ),
        (REPOSITORY_ID, None, ORIGIN)
    );
    assert_eq!(snapshot.volumes, ["data"]);
    assert_eq!(artifact.repository, "store");
    assert_eq!(status.node_name.as_deref(), Some(NODE));
    assert_eq!(status.node_clock, Some(clock));
    assert_eq!(plan.hold_secret.as_deref(), Some("s3"));
    let job = plan.job.unwrap();
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.node_name.as_deref(), Some(NODE));
    let mover = &pod.containers[0];
    let args = mover.args.clone().unwrap();
    for pair in [
        ["--repository-prefix", "custody/custody_repository"],
        ["--repository-id", REPOSITORY_ID],
        ["--origin-cluster", ORIGIN],
        ["--volume", "data"],
        ["--claim", "data-db-0"],
        ["--parent", &"a1".repeat(32)],
        ["--consistency", "CrashUnsafe"],
    ] {
        assert!(
            args.windows(2).any(|window| window == pair),
            "{pair:?} in {args:?}"
        );
    }
    assert!(!args.iter().any(|arg| arg == "--prefix"), "{args:?}");
    // The master key comes from custody's Secret, never into the Job itself.
    let env = mover.env.clone().unwrap();
    let key = env
        .iter()
        .find(|variable| variable.name == "CUSTODY_REPOSITORY_KEY")
        .unwrap();
    assert_eq!(key.value, None);
    let reference = key.value_from.clone().unwrap().secret_key_ref.unwrap();
    assert_eq!(reference.name, "store-master-key");
}

/// A volume Backup to a repository with a key Secret waits for its encrypted repository (it
/// is never written unencrypted there), and for this cluster's identity; one without a key
/// Secret writes format 1.
#[test]
fn a_volume_backup_needs_the_encrypted_repository() {
    let mut format_one = repository("True");
    format_one.spec.encryption = None;
    format_one.status.as_mut().unwrap().repository = None;
    let archive = plan(&Facts {
        repository: Some(format_one),
        ..facts()
    });
    let artifact = archive.status.unwrap().artifact.unwrap();
    assert_eq!(
        artifact.key,
        format!("custody/ns/orders/{UID}/data.tar.zst")
    );
    assert_eq!(artifact.snapshot, None);
    let mut unencrypted = repository("True");
    unencrypted.status.as_mut().unwrap().repository = None;
    let waiting = plan(&Facts {
        repository: Some(unencrypted),
        ..facts()
    });
    assert_eq!(waiting.job, None);
    let ready = waiting.status.unwrap().conditions;
    assert!(
        ready
            .iter()
            .any(|condition| condition.reason == reasons::REPOSITORY_NOT_READY),
        "{ready:?}"
    );
    let waiting = plan(&Facts {
        origin_cluster: None,
        ..facts()
    });
    assert_eq!(waiting.job, None);
}

/// A snapshot Backup completes with the snapshot its mover reports, in the repository it
/// recorded; another repository's snapshot is not this Backup's.
#[test]
fn a_snapshot_backup_completes_with_its_snapshot() {
    let started_v2 = |report_repository: &str| {
        let mut finished = started(facts(), JobState::Succeeded);
        let artifact = finished
            .backup
            .status
            .as_mut()
            .unwrap()
            .artifact
            .as_mut()
            .unwrap();
        artifact.key = String::new();
        artifact.manifest_key = String::new();
        artifact.prefix = "custody/custody_repository".into();
        artifact.snapshot = Some(custody_kube::api::SnapshotRef {
            repository_id: REPOSITORY_ID.into(),
            id: None,
            origin_cluster: ORIGIN.into(),
            volumes: vec!["data".into()],
            volume_manifests: Vec::new(),
            written_by: None,
        });
        finished.report = Some(
            json!({"sizeBytes": 42, "manifestHash": "m", "files": 1, "entries": 1, "totalBytes": 5,
                "snapshot": {"id": "b2".repeat(32), "repositoryId": report_repository,
                    "bytesNew": 5, "filesRead": 1}})
            .to_string(),
        );
        plan(&finished).status.unwrap()
    };
    let completed = started_v2(REPOSITORY_ID);
    assert_eq!(completed.phase, Some(BackupPhase::Completed));
    let artifact = completed.artifact.unwrap();
    assert_eq!(
        artifact.snapshot.unwrap().id.as_deref(),
        Some("b2".repeat(32).as_str())
    );
    assert_eq!(artifact.manifest_hash.as_deref(), Some("m"));
    assert_eq!(artifact.size_bytes, Some(42));
    let elsewhere = started_v2(&"0".repeat(64));
    assert_eq!(elsewhere.phase, Some(BackupPhase::Failed));
    assert!(
        elsewhere
            .conditions
            .iter()
            .any(|condition| condition.reason == "ArtifactKeyMismatch"),
        "{:?}",
        elsewhere.conditions
    );
}

/// How the copy was made is recorded when it starts and shown as `Consistent`; a stopped
/// application's claim is copied wherever the scheduler mounts it.
#[test]
fn the_capture_is_recorded_and_said_in_a_condition() {
    let consistent = |status: &BackupStatus| {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == "Consistent")
            .map(|condition| (condition.status.clone(), condition.reason.clone()))
    };
    // Decided when it starts; said once there is a copy.
    let running = plan(&facts());
    let status = running.status.unwrap();
    assert_eq!(
        status.consistency,
        Some(custody_kube::api::Capture::CrashUnsafe)
    );
    assert_eq!(consistent(&status), None, "no copy yet");
    let completed = |capture| {
        let mut finished = started(facts(), JobState::Succeeded);
        finished.backup.status.as_mut().unwrap().consistency = Some(capture);
        finished.report = report(UID);
        plan(&finished).status.unwrap()
    };
    assert_eq!(
        consistent(&completed(custody_kube::api::Capture::CrashUnsafe)),
        Some(("False".to_string(), "CrashUnsafeCopy".to_string()))
    );
    assert_eq!(
        consistent(&completed(custody_kube::api::Capture::Stopped)),
        Some(("True".to_string(), "ApplicationStopped".to_string()))
    );
    assert_eq!(
        consistent(&completed(custody_kube::api::Capture::Frozen)),
        Some(("True".to_string(), "FilesystemFrozen".to_string()))
    );
    // A failed copy says nothing about consistency.
    let mut failed = started(
        facts(),
        JobState::Failed {
            message: "BackoffLimitExceeded".into(),
        },
    );
    failed.backup.status.as_mut().unwrap().consistency = Some(custody_kube::api::Capture::Frozen);
    assert_eq!(consistent(&plan(&failed).status.unwrap()), None);

    let stopped = plan(&Facts {
        mounted_on: None,
        cluster: Some(cluster_without_method()),
        ..facts()
    });
    let status = stopped.status.unwrap();
    assert_eq!(
        status.consistency,
        Some(custody_kube::api::Capture::Stopped)
    );
    assert_eq!(status.node_name, None);
    let pod = stopped.job.unwrap().spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.node_name, None, "placed by the scheduler");

    // Refused: nothing recorded, nothing created, the message says what to do.
    let refused = plan(&Facts {
        cluster: Some(cluster_without_method()),
        ..facts()
    });
    let status = refused.status.unwrap();
    assert_eq!(status.consistency, None);
    assert_eq!(status.artifact, None);
    assert!(refused.job.is_none());
    assert!(
        status.conditions[0]
            .message
            .contains("scale StatefulSet db to 0"),
        "{}",
        status.conditions[0].message
    );
}

/// A frozen copy: the mover gets the claim and the bound, its way to the agent (node address,
/// a token bound to its pod, the gate's CA, which is published in the namespace), and the
/// Backup records how long the filesystem stayed frozen.
#[test]
fn a_frozen_copy_reaches_its_agent_and_records_the_stall() {
    let frozen = |seconds: Option<i32>| {
        let mut cluster = cluster(true);
        cluster.spec.consistency = Some(custody_kube::api::Consistency {
            method: custody_kube::api::ConsistencyMethod::Freeze,
            max_freeze_seconds: seconds,
            tool: None,
            hooks: None,
        });
        cluster
    };
    let start = plan(&Facts {
        cluster: Some(frozen(Some(20))),
        ..facts()
    });
    assert!(start.publish_gate_ca);
    let status = start.status.unwrap();
    assert_eq!(status.consistency, Some(custody_kube::api::Capture::Frozen));
    assert_eq!(status.node_name.as_deref(), Some(NODE));
    // The bound is recorded where the agent reads it (the mover's request is capped by it).
    assert_eq!(status.max_freeze_seconds, Some(20));
    // The Job is recorded as coming before it is created (its UID once the API server answers).
    let coming = status.job.clone().expect("the Job recorded as coming");
    assert_eq!(coming.uid, "");
    assert_eq!(
        coming.name,
        start.job.as_ref().unwrap().metadata.name.clone().unwrap()
    );
    // One found without its UID recorded is stopped, and the Backup fails saying why.
    let unproven = plan(&Facts {
        job: JobFact::Unproven,
        ..started(facts(), JobState::Running)
    });
    assert!(
        unproven
            .stop_job
            .as_deref()
            .is_some_and(|why| why.contains("never recorded creating it")),
        "{:?}",
        unproven.stop_job
    );
    let pod = start.job.unwrap().spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.node_name.as_deref(), Some(NODE));
    let mover = &pod.containers[0];
    let args = mover.args.clone().unwrap();
    for pair in [
        ["--freeze-claim", "data-db-0"],
        ["--max-freeze-seconds", "20"],
    ] {
        assert!(
            args.windows(2).any(|window| window == pair),
            "{pair:?} in {args:?}"
        );
    }
    let env: Vec<String> = mover
        .env
        .iter()
        .flatten()
        .map(|env| env.name.clone())
        .collect();
    for name in [
        "HOST_IP",
        "CUSTODY_AGENT_ADDRESS",
        "CUSTODY_TOKEN_FILE",
        "CUSTODY_CA_FILE",
    ] {
        assert!(env.contains(&name.to_string()), "{name} in {env:?}");
    }
    let gate = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == crate::inject::GATE_VOLUME)
        .expect("the gate volume");
    let sources = gate.projected.as_ref().unwrap().sources.as_ref().unwrap();
    assert_eq!(
        sources[0]
            .service_account_token
            .as_ref()
            .unwrap()
            .audience
            .as_deref(),
        Some(custody_proto::names::GATE_AUDIENCE)
    );

    // The default bound is a minute; a copy without freeze gets none of it.
    let defaulted = plan(&Facts {
        cluster: Some(frozen(None)),
        ..facts()
    });
    let args = defaulted
        .job
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.windows(2)
            .any(|window| window == ["--max-freeze-seconds", "60"])
    );
    // Started: the recorded bound stays, whatever the Cluster says later.
    let mut later = Facts {
        cluster: Some(frozen(Some(300))),
        ..facts()
    };
    later.backup.status = Some(status.clone());
    let args = plan(&later)
        .job
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.windows(2)
            .any(|window| window == ["--max-freeze-seconds", "20"]),
        "{args:?}"
    );
    let unsafe_copy = plan(&facts());
    assert!(!unsafe_copy.publish_gate_ca);
    assert_eq!(unsafe_copy.status.unwrap().max_freeze_seconds, None);
    let args = unsafe_copy
        .job
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap();
    assert!(!args.contains(&"--freeze-claim".to_string()), "{args:?}");

    // Done: the stall is recorded.
    let mut finished = started(facts(), JobState::Succeeded);
    finished.backup.status.as_mut().unwrap().consistency = Some(custody_kube::api::Capture::Frozen);
    let (key, manifest_key) =
        custody_proto::mover::object_keys(&format!("custody/ns/orders/{UID}"));
    finished.report = Some(
        json!({"key": key, "manifestKey": manifest_key, "sizeBytes": 42, "checksum": "c",
            "manifestHash": "m", "files": 1, "entries": 1, "totalBytes": 5, "frozenMillis": 1234})
        .to_string(),
    );
    let done = plan(&finished).status.unwrap();
    assert_eq!(done.phase, Some(BackupPhase::Completed));
    assert_eq!(done.frozen_millis, Some(1234));
}

/// A copy by the application's tool: the tool runs first in the Job (its image, command,
/// the running pod's name and IP, its credentials, a bounded scratch volume), the mover backs
/// up the tree it wrote; a failed tool fails the Backup naming its exit and output; a copy
/// whose tool is no longer named does not start.
#[test]
fn a_tool_copy_runs_the_tool_first_and_backs_up_its_tree() {
    let with_tool = |data_path: Option<&str>| {
        let mut cluster = cluster(true);
        cluster.spec.consistency = Some(custody_kube::api::Consistency {
            method: custody_kube::api::ConsistencyMethod::Tool,
            max_freeze_seconds: None,
            tool: Some(custody_kube::api::BackupTool {
                image: "postgres:15".into(),
                command: vec![
                    "pg_basebackup".into(),
                    "-D".into(),
                    "$(CUSTODY_OUTPUT)".into(),
                ],
                credentials_secret_ref: Some(custody_kube::api::LocalObjectReference {
                    name: "orders-credentials".into(),
                }),
                data_path: data_path.map(str::to_string),
                mount_path: Some("/var/lib/postgresql/data".into()),
                scratch_size: Some("2Gi".into()),
                run_as_user: None,
                timeout_seconds: None,
                output: None,
            }),
            hooks: None,
        });
        cluster
    };
    let start = plan(&Facts {
        cluster: Some(with_tool(Some("pgdata"))),
        ..facts()
    });
    assert!(!start.publish_gate_ca);
    let status = start.status.unwrap();
    assert_eq!(status.consistency, Some(custody_kube::api::Capture::Tool));
    assert_eq!(status.node_name.as_deref(), Some(NODE));
    let pod = start.job.unwrap().spec.unwrap().template.spec.unwrap();
    let tool = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "tool")
        .expect("the tool runs first");
    assert_eq!(tool.image.as_deref(), Some("postgres:15"));
    let mounts: Vec<(&str, &str, Option<bool>)> = tool
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| {
            (
                mount.name.as_str(),
                mount.mount_path.as_str(),
                mount.read_only,
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            ("data", "/var/lib/postgresql/data", Some(true)),
            (crate::backups::job::TOOL_VOLUME, "/output", None),
        ]
    );
    assert_eq!(tool.command.as_ref().unwrap()[0], "pg_basebackup");
    let env: Vec<(String, String)> = tool
        .env
        .iter()
        .flatten()
        .map(|env| (env.name.clone(), env.value.clone().unwrap_or_default()))
        .collect();
    for pair in [
        ("CUSTODY_OUTPUT", "/output/pgdata"),
        ("CUSTODY_POD_NAME", "db-0"),
        ("CUSTODY_POD_IP", "10.0.0.7"),
    ] {
        assert!(
            env.contains(&(pair.0.to_string(), pair.1.to_string())),
            "{pair:?} in {env:?}"
        );
    }
    assert_eq!(
        tool.env_from.as_ref().unwrap()[0]
            .secret_ref
            .as_ref()
            .unwrap()
            .name,
        "orders-credentials"
    );
    let scratch = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == crate::backups::job::TOOL_VOLUME)
        .and_then(|volume| volume.empty_dir.clone())
        .expect("the tool's scratch volume");
    assert_eq!(scratch.size_limit.unwrap().0, "2Gi");
    // Issue 23: the user's image runs unprivileged, without a token, its scratch counted.
    assert_eq!(pod.automount_service_account_token, Some(false));
    let security = tool.security_context.clone().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        security.capabilities.unwrap().drop.unwrap(),
        ["ALL".to_string()]
    );
    assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let resources = tool.resources.clone().unwrap();
    for quantities in [resources.requests.unwrap(), resources.limits.unwrap()] {
        assert_eq!(quantities["ephemeral-storage"].0, "2Gi");
    }
    let mover = &pod.containers[0];
    let args = mover.args.clone().unwrap();
    assert!(
        args.windows(2)
            .any(|window| window == ["--source", "/output"]),
        "{args:?}"
    );
    // The mover refuses a tree larger than the scratch size, whether the kubelet saw it or not.
    assert!(
        args.windows(2)
            .any(|window| window == ["--source-limit-bytes", "2147483648"]),
        "{args:?}"
    );
    assert!(
        mover
            .volume_mounts
            .iter()
            .flatten()
            .any(|mount| mount.name == crate::backups::job::TOOL_VOLUME
                && mount.read_only == Some(true)),
        "the mover reads the tree"
    );
    // Without a dataPath the tree is the volume's root.
    let root = plan(&Facts {
        cluster: Some(with_tool(None)),
        ..facts()
    });
    let pod = root.job.unwrap().spec.unwrap().template.spec.unwrap();
    let env = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "tool")
        .unwrap()
        .env
        .clone()
        .unwrap();
    assert_eq!(env[0].value.as_deref(), Some("/output"));

    // Issue 24 item 2: before the tool, the scratch check (the mover's image and rights)
    // measures the claim against the scratch size.
    let pod = plan(&Facts {
        cluster: Some(with_tool(Some("pgdata"))),
        ..facts()
    })
    .job
    .unwrap()
    .spec
    .unwrap()
    .template
    .spec
    .unwrap();
    let init: Vec<&str> = pod
        .init_containers
        .iter()
        .flatten()
        .map(|container| container.name.as_str())
        .collect();
    assert_eq!(init, ["scratch-check", "tool"]);
    let check = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(check.image, pod.containers[0].image);
    let command = check.command.clone().unwrap();
    for pair in [
        ["--limit-bytes", "2147483648"],
        ["--scratch", "/output"],
        ["--claim", "data-db-0"],
        ["--source", "/data"],
    ] {
        assert!(
            command.windows(2).any(|window| window == pair),
            "{pair:?} in {command:?}"
        );
    }
    // Refused: the Backup fails ScratchTooSmall with both sizes, the tool never ran.
    let mut refused = started(
        Facts {
            cluster: Some(with_tool(Some("pgdata"))),
            ..facts()
        },
        JobState::Failed {
            message: "BackoffLimitExceeded".into(),
        },
    );
    refused.backup.status.as_mut().unwrap().consistency = Some(custody_kube::api::Capture::Tool);
    refused.scratch_check = Some(crate::backups::decide::ScratchCheck::Refused("claim data-orders-0 holds 3000000000 bytes (2.79 GiB) on disk and the tool's scratch space takes at most 2147483648 bytes".into()));
    let status = plan(&refused).status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    assert_eq!(status.conditions[0].reason, "ScratchTooSmall");
    assert!(status.conditions[0].message.contains("3000000000 bytes"));
    // The check itself failed: said as the Job's failure, not as a size.
    refused.scratch_check = Some(crate::backups::decide::ScratchCheck::Failed(
        "the scratch check before the tool exited with code 137".into(),
    ));
    let status = plan(&refused).status.unwrap();
    assert_eq!(status.conditions[0].reason, "JobFailed");
    assert!(status.conditions[0].message.contains("code 137"));

    // The tool failed: the Backup fails with its exit and output.
    let mut failed = started(
        Facts {
            cluster: Some(with_tool(Some("pgdata"))),
            ..facts()
        },
        JobState::Failed {
            message: "BackoffLimitExceeded".into(),
        },
    );
    failed.backup.status.as_mut().unwrap().consistency = Some(custody_kube::api::Capture::Tool);
    failed.tool_failure = Some("the backup tool exited with code 1: could not connect".into());
    let status = plan(&failed).status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    assert_eq!(status.conditions[0].reason, "ToolFailed");
    assert!(status.conditions[0].message.contains("could not connect"));

    // Started as a tool copy, the method since changed: not run without its tool.
    let mut changed = facts();
    changed.backup.status = Some(custody_kube::api::BackupStatus {
        phase: Some(BackupPhase::Running),
        start_time: Some(Time(now())),
        node_name: Some(NODE.into()),
        consistency: Some(custody_kube::api::Capture::Tool),
        ..Default::default()
    });
    let refused = plan(&changed);
    assert!(refused.job.is_none());
    assert_eq!(refused.lease, LeaseStep::Release);
    let status = refused.status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    assert_eq!(status.conditions[0].reason, "ToolMissing");
}

/// A copy between hooks: the pre hook runs in the running pod before any Job, the copy only
/// after it succeeded; a failed pre hook skips the copy but not the post hook; the post hook
/// runs once the Job ended, and its failure fails the Backup (onError Fail).
#[test]
fn a_copy_between_hooks_runs_pre_then_copy_then_post_whatever_happens() {
    use custody_kube::api::{Capture, Hook, HookOnError, HookResult, Hooks, HooksStatus};
    let hook = |command: &str| Hook {
        container: Some("db".into()),
        command: vec![command.into()],
        timeout_seconds: Some(5),
        on_error: HookOnError::Fail,
    };
    let mut hooked = cluster(true);
    hooked.spec.consistency = Some(custody_kube::api::Consistency {
        method: custody_kube::api::ConsistencyMethod::Hooks,
        max_freeze_seconds: None,
        tool: None,
        hooks: Some(Hooks {
            pre: hook("pause"),
            post: Some(hook("resume")),
        }),
    });
    let result = |succeeded| HookResult {
        pod: "db-0".into(),
        succeeded,
        message: "exited with code 2".into(),
        started_at: Time(now()),
        finished_at: Time(now()),
    };
    let with = |facts: Facts, pre: Option<bool>, post: Option<bool>| {
        let mut facts = facts;
        let status = facts.backup.status.as_mut().unwrap();
        status.consistency = Some(Capture::Hooks);
        status.hooks = Some(HooksStatus {
            pre: pre.map(result),
            post: post.map(result),
        });
        facts
    };
    let hooked_facts = || Facts {
        cluster: Some(hooked.clone()),
        ..facts()
    };
    let missing = || {
        let mut facts = started(hooked_facts(), JobState::Running);
        facts.job = JobFact::Missing;
        facts
    };

    // Start: the pre hook, in the running pod, before any Job; the decision is recorded.
    let start = plan(&hooked_facts());
    let run = start.hook.clone().expect("the pre hook runs");
    assert_eq!(run.phase, hooks::Phase::Pre);
    assert_eq!(run.hook.command, ["pause"]);
    assert_eq!(run.pod.as_deref(), Ok("db-0"));
    assert!(start.job.is_none());
    assert_eq!(start.lease, LeaseStep::TakeFirst);
    assert_eq!(start.status.unwrap().consistency, Some(Capture::Hooks));

    // The pre hook succeeded: the copy.
    let copy = plan(&with(missing(), Some(true), None));
    assert!(copy.hook.is_none());
    assert!(copy.job.is_some());

    // The pre hook failed: no copy, the post hook; then the Backup fails.
    let skipped = plan(&with(missing(), Some(false), None));
    assert!(skipped.job.is_none());
    assert_eq!(skipped.hook.unwrap().phase, hooks::Phase::Post);
    let failed = plan(&with(missing(), Some(false), Some(true)));
    assert!(failed.job.is_none() && failed.hook.is_none());
    assert_eq!(failed.lease, LeaseStep::Release);
    let status = failed.status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    assert_eq!(status.conditions[0].reason, "PreHookFailed");
    assert!(status.conditions[0].message.contains("exited with code 2"));

    // The Job ended, failed or not: the post hook before the Backup concludes.
    for state in [
        JobState::Succeeded,
        JobState::Failed {
            message: "DeadlineExceeded".into(),
        },
    ] {
        let mut ended = with(started(hooked_facts(), state), Some(true), None);
        ended.report = report(UID);
        let post = plan(&ended);
        assert_eq!(post.hook.unwrap().phase, hooks::Phase::Post);
        assert!(post.status.is_none(), "not concluded before the post hook");
    }
    let mut ended = with(
        started(hooked_facts(), JobState::Succeeded),
        Some(true),
        Some(true),
    );
    ended.report = report(UID);
    assert_eq!(
        plan(&ended).status.unwrap().phase,
        Some(BackupPhase::Completed)
    );
    let mut post_failed = with(
        started(hooked_facts(), JobState::Succeeded),
        Some(true),
        Some(false),
    );
    post_failed.report = report(UID);
    let status = plan(&post_failed).status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    assert_eq!(status.conditions[0].reason, "PostHookFailed");
}

#[test]
fn a_command_records_no_keys_before_its_run() {
    let plan = plan(&Facts {
        backup: backup(true),
        ..facts()
    });
    let status = plan.status.unwrap();
    assert_eq!(status.artifact, None);
    assert!(
        plan.events[0].text.contains("custody/dumps/"),
        "{:?}",
        plan.events
    );
}

#[test]
fn a_dump_in_the_run_is_attributed() {
    let mut facts = started(
        Facts {
            backup: backup(true),
            ..facts()
        },
        JobState::Succeeded,
    );
    let status = facts.backup.status.as_mut().unwrap();
    status.node_clock = Some(ClockMeasurement {
        offset_nanoseconds: 0,
        round_trip_nanoseconds: 1_000_000,
        measured_at: Time(now()),
    });
    let key = "custody/dumps/db-20261130T115930Z.dump".to_string();
    let modified: Timestamp = "2026-11-30T11:59:40Z".parse().unwrap();
    facts.listing = Some(Ok(Listing {
        candidates: vec![Candidate {
            key: key.clone(),
            last_modified: modified.as_nanosecond() as i64,
        }],
        sizes: [(key.clone(), 9)].into_iter().collect(),
    }));
    let plan = plan(&facts);
    let status = plan.status.expect("a status");
    assert_eq!(
        status.phase,
        Some(BackupPhase::Completed),
        "{:?}",
        plan.events
    );
    let artifact = status.artifact.unwrap();
    assert_eq!(
        (artifact.key.as_str(), artifact.size_bytes),
        (key.as_str(), Some(9))
    );
    assert!(artifact.attribution.is_some());
    assert_eq!(plan.events[0].reason, "DumpAttributed");
}

#[test]
fn a_busy_cluster_waits_naming_the_holder() {
    let plan = cluster_busy(&facts(), "Restore/r-uid");
    let status = plan.status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Pending));
    assert_eq!(status.conditions[0].reason, holds::CLUSTER_BUSY);
    assert!(status.conditions[0].message.contains("Restore/r-uid"));
    assert_eq!(plan.job, None);
}

#[test]
fn a_repeated_wait_neither_rewrites_nor_warns_again() {
    let first = plan(&Facts {
        cluster: None,
        ..facts()
    });
    let mut again = Facts {
        cluster: None,
        ..facts()
    };
    again.backup.status = first.status;
    let second = plan(&again);
    assert_eq!(second.status, None);
    assert!(second.events.is_empty());
}

#[test]
fn a_completed_backup_marks_its_claim_as_known_data_and_a_failed_one_does_not() {
    let completed = plan(&Facts {
        report: report(UID),
        ..started(facts(), JobState::Succeeded)
    });
    let [(claim, how)] = completed.mark_claims.as_slice() else {
        panic!("one claim marked: {:?}", completed.mark_claims);
    };
    assert_eq!(claim, "data-db-0");
    assert!(how.contains(UID), "{how}");
    let failed = plan(&started(facts(), JobState::Succeeded));
    assert!(failed.mark_claims.is_empty());
}

#[test]
fn a_job_whose_pod_does_not_start_says_why_once() {
    let mut facts = started(facts(), JobState::Running);
    facts.job_pod_problem = Some("pod p: container mover is ImagePullBackOff".into());
    let planned = plan(&facts);
    let status = planned.status.clone().expect("a status");
    assert_eq!(status.phase, Some(BackupPhase::Running));
    let ready = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.reason, reasons::JOB_POD_NOT_STARTING);
    assert!(ready.message.contains("ImagePullBackOff") && ready.message.contains("deadline"));
    assert_eq!(planned.events.len(), 1);
    assert!(planned.events[0].warning);
    assert_eq!(planned.requeue, Some(Duration::from_secs(15)));
    // Said once: the same reason again publishes nothing.
    facts.backup.status = Some(status);
    assert!(plan_events(&facts).is_empty());
    // The pod starts: Running again.
    facts.job_pod_problem = None;
    let ready = plan(&facts)
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.reason, reasons::RUNNING);
}

fn plan_events(facts: &Facts) -> Vec<Note> {
    plan(facts).events
}

/// A tool past its `timeoutSeconds` has its Job stopped (nothing else), and the Backup, once
/// the Job failed, says why; a tool within its bound is looked at again when the bound passes.
#[test]
fn a_tool_past_its_timeout_has_its_job_stopped_and_the_backup_fails_naming_it() {
    let mut running = started(facts(), JobState::Running);
    running.tool_clock = super::decide::ToolClock::Left(5);
    let within = plan(&running);
    assert_eq!(within.stop_job, None);
    assert_eq!(within.requeue, Some(Duration::from_secs(6)));
    running.tool_clock = super::decide::ToolClock::Left(600);
    assert_eq!(plan(&running).requeue, Some(Duration::from_secs(60)));
    // Not started yet: nothing announces its start, so it is looked for.
    running.tool_clock = super::decide::ToolClock::Starting;
    assert_eq!(plan(&running).requeue, Some(Duration::from_secs(5)));

    let why = "the backup tool ran 31 s in pod p, past its timeoutSeconds (30 s): custody stopped its Job";
    running.tool_clock = super::decide::ToolClock::Overdue(why.into());
    let stopping = plan(&running);
    assert_eq!(stopping.stop_job.as_deref(), Some(why));
    assert_eq!(
        stopping.lease,
        LeaseStep::Keep,
        "the Lease is held until the Job ended"
    );
    assert_eq!(stopping.job, None);
    let status = stopping.status.expect("a status");
    assert_eq!(status.phase, Some(BackupPhase::Running));
    assert!(
        status.conditions[0].message.contains(why),
        "{:?}",
        status.conditions
    );

    let mut ended = started(
        facts(),
        JobState::Failed {
            message: "DeadlineExceeded: Job was active longer than specified deadline".into(),
        },
    );
    ended.tool_failure = Some(why.into());
    let failed = plan(&ended);
    let status = failed.status.expect("a status");
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    assert_eq!(status.conditions[0].reason, "ToolFailed");
    assert!(
        status.conditions[0]
            .message
            .contains("timeoutSeconds (30 s)")
    );
    assert_eq!(failed.lease, LeaseStep::Release);
}

/// Cluster `orders` with `pg_wal` on a volume of its own, frozen.
fn two_volume_facts() -> Facts {
    let mut cluster = cluster(true);
    cluster.spec.volume_claim_templates = vec!["data".into(), "wal".into()];
    cluster.spec.consistency = Some(custody_kube::api::Consistency {
        method: custody_kube::api::ConsistencyMethod::Freeze,
        max_freeze_seconds: Some(20),
        tool: None,
        hooks: None,
    });
    Facts {
        cluster: Some(cluster),
        mount_paths: [
            ("data".to_string(), "/var/lib/postgresql/data".to_string()),
            ("wal".to_string(), "/var/lib/postgresql/wal".to_string()),
        ]
        .into(),
        ..facts()
    }
}

/// A Cluster whose tool writes a tar stream of PostgreSQL's data under `pgdata`.
fn stream_cluster() -> Cluster {
    let mut cluster = cluster(true);
    cluster.spec.consistency = Some(custody_kube::api::Consistency {
        method: custody_kube::api::ConsistencyMethod::Tool,
        max_freeze_seconds: None,
        tool: Some(custody_kube::api::BackupTool {
            image: "postgres:15".into(),
            command: ["pg_basebackup", "-D", "-", "-F", "tar", "-X", "fetch"]
                .map(str::to_string)
                .to_vec(),
            credentials_secret_ref: None,
            data_path: Some("pgdata".into()),
            mount_path: None,
            scratch_size: None,
            run_as_user: Some(999),
            timeout_seconds: Some(600),
            output: Some(custody_kube::api::ToolOutput::TarStream),
        }),
        hooks: None,
    });
    cluster
}

/// Issue 24 item 2: a tool that writes a tar stream runs beside the mover (not before it),
/// its standard output on the FIFO an init container of the mover's image prepared, with no
/// scratch space; the mover reads the stream into the volume beneath `dataPath`. A stream
/// tool that failed fails the Backup naming its exit and output; a Cluster of two templates,
/// or a repository of archives, is refused before anything runs.
#[test]
fn a_stream_tool_runs_beside_the_mover_which_reads_its_stream() {
    let start = plan(&Facts {
        cluster: Some(stream_cluster()),
        ..facts()
    });
    let status = start.status.unwrap();
    assert_eq!(status.consistency, Some(custody_kube::api::Capture::Tool));
    let pod = start.job.unwrap().spec.unwrap().template.spec.unwrap();
    let init: Vec<&str> = pod
        .init_containers
        .iter()
        .flatten()
        .map(|container| container.name.as_str())
        .collect();
    assert_eq!(init, ["stream-setup"]);
    let setup = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(setup.image, pod.containers[0].image);
    assert_eq!(
        setup.command.as_ref().unwrap()[..2],
        ["custody-mover".to_string(), "stream-setup".to_string()]
    );
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["mover", "tool"]);
    let tool = &pod.containers[1];
    assert_eq!(
        tool.command.clone().unwrap()[..6],
        [
            "/custody-stream/custody-mover",
            "stream-tool",
            "--dir",
            "/custody-stream",
            "--",
            "pg_basebackup"
        ]
        .map(str::to_string)
    );
    assert_eq!(
        tool.security_context.as_ref().unwrap().run_as_user,
        Some(999)
    );
    let env: Vec<&str> = tool
        .env
        .iter()
        .flatten()
        .map(|env| env.name.as_str())
        .collect();
    assert_eq!(env, ["CUSTODY_POD_NAME", "CUSTODY_POD_IP"]);
    // No scratch space: nothing of the data lands on the node.
    let resources = tool.resources.clone().unwrap();
    assert!(
        !resources
            .requests
            .unwrap_or_default()
            .contains_key("ephemeral-storage")
    );
    assert!(
        !pod.volumes
            .iter()
            .flatten()
            .any(|volume| volume.name.starts_with(crate::backups::job::TOOL_VOLUME))
    );
    let stream = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == crate::backups::job::STREAM_VOLUME)
        .expect("the shared directory");
    assert!(stream.empty_dir.is_some());
    let args = pod.containers[0].args.clone().unwrap();
    for pair in [
        ["--source", "/custody-stream"],
        ["--tar-stream", "/custody-stream"],
        ["--tar-data-path", "pgdata"],
    ] {
        assert!(
            args.windows(2).any(|window| window == pair),
            "{pair:?} in {args:?}"
        );
    }
    assert!(
        !args.contains(&"--source-limit-bytes".to_string()),
        "{args:?}"
    );

    // The tool failed: the mover said so, the tool's exit and output are the reason's message.
    let mut failed = started(
        Facts {
            cluster: Some(stream_cluster()),
            ..facts()
        },
        JobState::Failed {
            message: "BackoffLimitExceeded".into(),
        },
    );
    failed.backup.status.as_mut().unwrap().consistency = Some(custody_kube::api::Capture::Tool);
    failed.tool_failure = Some("the backup tool exited with code 1: could not connect".into());
    failed.report = Some(custody_proto::mover::failure_text(
        custody_proto::reasons::MoverFailure::ToolFailed,
        "the tool exited with code 1 while it wrote its stream".into(),
    ));
    let status = plan(&failed).status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Failed));
    assert_eq!(status.conditions[0].reason, "ToolFailed");
    assert!(status.conditions[0].message.contains("could not connect"));
    // The mover failed first (the tool's end of the FIFO then broke): the mover's reason.
    failed.report = Some(custody_proto::mover::failure_text(
        custody_proto::reasons::MoverFailure::UploadFailed,
        "the server went away".into(),
    ));
    let status = plan(&failed).status.unwrap();
    assert_eq!(status.conditions[0].reason, "UploadFailed");
    // Stopped past its timeoutSeconds: the mover was interrupted, the bound is the reason.
    failed.tool_failure = Some(
        "the backup tool ran 600 s in pod p, past its timeoutSeconds (600 s): custody stopped its Job"
            .into(),
    );
    failed.report = Some(custody_proto::mover::failure_text(
        custody_proto::reasons::MoverFailure::Interrupted,
        "stopped by a signal".into(),
    ));
    let status = plan(&failed).status.unwrap();
    assert_eq!(status.conditions[0].reason, "ToolFailed");
    assert!(
        status.conditions[0]
            .message
            .contains("timeoutSeconds (600 s)")
    );

    // Refused before anything runs: two templates, or archives.
    let mut two = stream_cluster();
    two.spec.volume_claim_templates = vec!["data".into(), "wal".into()];
    let mut archives = facts();
    let repository = archives.repository.as_mut().unwrap();
    repository.spec.encryption = None;
    repository.status.as_mut().unwrap().repository = None;
    for (facts, said) in [
        (
            Facts {
                cluster: Some(two),
                ..two_volume_facts()
            },
            "2 volume claim templates",
        ),
        (
            Facts {
                cluster: Some(stream_cluster()),
                ..archives
            },
            "spec.encryption",
        ),
    ] {
        let refused = plan(&facts);
        assert!(refused.job.is_none());
        let status = refused.status.unwrap();
        assert_eq!(status.phase, Some(BackupPhase::Failed));
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason, reasons::UNSUPPORTED_VOLUME_LAYOUT);
        assert!(ready.message.contains(said), "{}", ready.message);
    }
}

/// Every volume of the Cluster goes into one snapshot, read by one Job that mounts every
/// claim, frozen together; the snapshot records each volume's manifest and the Backup marks
/// every claim it copied.
#[test]
fn every_volume_of_the_cluster_is_backed_up_together() {
    let start = plan(&two_volume_facts());
    let status = start.status.clone().unwrap();
    let snapshot = status.artifact.clone().unwrap().snapshot.unwrap();
    assert_eq!(snapshot.volumes, ["data", "wal"]);
    let job = start.job.clone().expect("a Job");
    let pod = job.spec.unwrap().template.spec.unwrap();
    let claims: Vec<(String, String)> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|volume| {
            let claim = volume.persistent_volume_claim.as_ref()?;
            assert_eq!(claim.read_only, Some(true), "{volume:?}");
            Some((volume.name.clone(), claim.claim_name.clone()))
        })
        .collect();
    assert_eq!(
        claims,
        [
            ("data".to_string(), "data-db-0".to_string()),
            ("volume-1".to_string(), "wal-db-0".to_string())
        ]
    );
    let mover = &pod.containers[0];
    let mounts: Vec<(&str, &str)> = mover
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| (mount.name.as_str(), mount.mount_path.as_str()))
        .collect();
    assert!(mounts.contains(&("data", "/volumes/data")), "{mounts:?}");
    assert!(mounts.contains(&("volume-1", "/volumes/wal")), "{mounts:?}");
    let args = mover.args.clone().unwrap();
    for pair in [
        ["--source", "/volumes/data"],
        ["--volume", "data"],
        ["--claim", "data-db-0"],
        ["--mount-path", "/var/lib/postgresql/data"],
        ["--source", "/volumes/wal"],
        ["--volume", "wal"],
        ["--claim", "wal-db-0"],
        ["--mount-path", "/var/lib/postgresql/wal"],
        ["--freeze-claim", "data-db-0"],
        ["--freeze-claim", "wal-db-0"],
    ] {
        assert!(
            args.windows(2).any(|window| window == pair),
            "{pair:?} in {args:?}"
        );
    }
    assert!(
        start
            .events
            .iter()
            .any(|note| note.text.contains("claims data-db-0, wal-db-0")),
        "{:?}",
        start.events
    );

    // The Cluster's templates changed between the start and the Job: not copied under names
    // that could record one volume as another.
    let mut reordered = two_volume_facts();
    reordered.backup.status = Some(status.clone());
    reordered
        .cluster
        .as_mut()
        .unwrap()
        .spec
        .volume_claim_templates = vec!["wal".into(), "data".into()];
    let refused = plan(&reordered);
    assert_eq!(refused.job, None);
    let refused = refused.status.unwrap();
    assert_eq!(refused.phase, Some(BackupPhase::Failed));
    assert!(
        refused
            .conditions
            .iter()
            .any(|condition| condition.reason == reasons::UNSUPPORTED_VOLUME_LAYOUT),
        "{:?}",
        refused.conditions
    );
    // Unchanged, the same start goes on to its Job.
    let mut again = two_volume_facts();
    again.backup.status = Some(status.clone());
    assert!(plan(&again).job.is_some());

    // Completed: each volume's manifest recorded, each claim marked.
    let mut finished = two_volume_facts();
    let mut recorded = status.clone();
    recorded.phase = Some(BackupPhase::Running);
    finished.backup.status = Some(recorded);
    finished.job = JobFact::Owned(JobState::Succeeded);
    let report = |names: [&str; 2]| {
        json!({"sizeBytes": 42, "manifestHash": "m1", "files": 3, "entries": 5, "totalBytes": 9,
            "snapshot": {"id": "b2".repeat(32), "repositoryId": REPOSITORY_ID, "bytesNew": 9, "filesRead": 3},
            "volumes": [
                {"name": names[0], "manifestHash": "m1", "files": 2, "totalBytes": 6},
                {"name": names[1], "manifestHash": "m2", "files": 1, "totalBytes": 3}]})
        .to_string()
    };
    let completed = plan(&Facts {
        report: Some(report(["data", "wal"])),
        ..finished.clone()
    });
    let done = completed.status.unwrap();
    assert_eq!(done.phase, Some(BackupPhase::Completed));
    let artifact = done.artifact.unwrap();
    assert_eq!(
        artifact.volume_hashes("data"),
        [
            ("data".to_string(), Some("m1".to_string())),
            ("wal".to_string(), Some("m2".to_string()))
        ]
    );
    let marked: Vec<&str> = completed
        .mark_claims
        .iter()
        .map(|(claim, _)| claim.as_str())
        .collect();
    assert_eq!(marked, ["data-db-0", "wal-db-0"]);
    // A report of other volumes is not this Backup's.
    let other = plan(&Facts {
        report: Some(report(["data", "logs"])),
        ..finished
    });
    let failed = other.status.unwrap();
    assert_eq!(failed.phase, Some(BackupPhase::Failed));
    assert!(
        failed
            .conditions
            .iter()
            .any(|condition| condition.reason == "ArtifactKeyMismatch"),
        "{:?}",
        failed.conditions
    );
}

/// Several volumes need an encrypted repository and every claim: else the Backup says what
/// to change.
#[test]
fn several_volumes_are_refused_or_awaited_with_the_reason() {
    let refused = |facts: Facts| {
        let plan = plan(&facts);
        assert_eq!(plan.job, None);
        let status = plan.status.unwrap();
        let ready = status
            .conditions
            .iter()
            .find(|condition| condition.type_ == "Ready")
            .unwrap()
            .clone();
        (status.phase, ready.reason, ready.message)
    };
    let mut archive = two_volume_facts();
    let repository = archive.repository.as_mut().unwrap();
    repository.spec.encryption = None;
    repository.status.as_mut().unwrap().repository = None;
    let (phase, reason, message) = refused(archive);
    assert_eq!(phase, Some(BackupPhase::Failed));
    assert_eq!(reason, reasons::UNSUPPORTED_VOLUME_LAYOUT);
    assert!(message.contains("spec.encryption"), "{message}");

    let (phase, reason, message) = refused(Facts {
        claims_missing: vec!["wal-db-0".into()],
        ..two_volume_facts()
    });
    assert_eq!(phase, Some(BackupPhase::Pending));
    assert_eq!(reason, reasons::CLAIM_NOT_FOUND);
    assert!(message.contains("wal-db-0"), "{message}");
}

/// One tool run writes every volume's tree: each a scratch volume of its own at
/// /output/<template>, also where the application mounts that template (pg_basebackup
/// --waldir writes the WAL's tree by the application's path); the mover backs each tree up as
/// its volume.
#[test]
fn a_tool_writes_one_tree_per_volume_and_each_is_backed_up_as_it() {
    let mut facts = two_volume_facts();
    facts.cluster.as_mut().unwrap().spec.consistency = Some(
        serde_json::from_value(json!({"method": "Tool", "tool": {"image": "pg",
            "command": ["pg_basebackup", "--pgdata=$(CUSTODY_OUTPUT)", "--waldir=/var/lib/postgresql/wal/pg_wal"],
            "dataPath": "pgdata"}}))
        .unwrap(),
    );
    let start = plan(&facts);
    let pod = start
        .job
        .expect("a Job")
        .spec
        .unwrap()
        .template
        .spec
        .unwrap();
    let tool = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "tool")
        .unwrap();
    let env: Vec<(String, String)> = tool
        .env
        .iter()
        .flatten()
        .map(|variable| {
            (
                variable.name.clone(),
                variable.value.clone().unwrap_or_default(),
            )
        })
        .collect();
    for pair in [
        ("CUSTODY_OUTPUT", "/output/data/pgdata"),
        ("CUSTODY_OUTPUT_DATA", "/output/data"),
        ("CUSTODY_OUTPUT_WAL", "/output/wal"),
    ] {
        assert!(
            env.contains(&(pair.0.to_string(), pair.1.to_string())),
            "{pair:?} in {env:?}"
        );
    }
    let mounts = |container: &k8s_openapi::api::core::v1::Container| {
        container
            .volume_mounts
            .iter()
            .flatten()
            .map(|mount| {
                (
                    mount.name.clone(),
                    mount.mount_path.clone(),
                    mount.read_only.unwrap_or(false),
                )
            })
            .collect::<Vec<_>>()
    };
    let tool_mounts = mounts(tool);
    for expected in [
        ("tool-output-0", "/output/data", false),
        ("tool-output-0", "/var/lib/postgresql/data", false),
        ("tool-output-1", "/output/wal", false),
        ("tool-output-1", "/var/lib/postgresql/wal", false),
        ("data", "/data", true),
        ("volume-1", "/volumes/wal", true),
    ] {
        let expected = (expected.0.to_string(), expected.1.to_string(), expected.2);
        assert!(
            tool_mounts.contains(&expected),
            "{expected:?} in {tool_mounts:?}"
        );
    }
    let mover = &pod.containers[0];
    let mover_mounts = mounts(mover);
    for expected in [
        ("tool-output-0", "/output/data"),
        ("tool-output-1", "/output/wal"),
    ] {
        let expected = (expected.0.to_string(), expected.1.to_string(), true);
        assert!(
            mover_mounts.contains(&expected),
            "{expected:?} in {mover_mounts:?}"
        );
    }
    let args = mover.args.clone().unwrap();
    for pair in [["--source", "/output/data"], ["--source", "/output/wal"]] {
        assert!(
            args.windows(2).any(|window| window == pair),
            "{pair:?} in {args:?}"
        );
    }
    let scratch: Vec<String> = pod
        .volumes
        .iter()
        .flatten()
        .filter(|volume| volume.empty_dir.is_some())
        .map(|volume| volume.name.clone())
        .collect();
    assert!(
        scratch.contains(&"tool-output-0".to_string())
            && scratch.contains(&"tool-output-1".to_string()),
        "{scratch:?}"
    );
}

#[test]
fn a_running_backup_shows_how_far_it_came_and_says_when_it_stalls() {
    let mover = |bytes: u64| custody_kube::api::ReportedMover {
        namespace: "ns".into(),
        pod_name: "backup-pod".into(),
        pod_uid: "pod-uid".into(),
        job_name: "job".into(),
        owner_uid: UID.into(),
        operation: "backup".into(),
        volume: "data".into(),
        bytes_done: bytes,
        files_done: 1,
        bytes_total: Some(4096),
        files_total: Some(4),
        bytes_sent: 0,
    };
    let stalled = |status: &BackupStatus| {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == "Stalled")
            .map(|condition| (condition.status.clone(), condition.reason.clone()))
    };
    let mut facts = started(facts(), JobState::Running);
    facts.transfer_report = Some((mover(1024), NODE.into()));
    let first = plan(&facts);
    let status = first.status.clone().expect("the progress is written");
    let transfer = status.transfer.clone().unwrap();
    assert_eq!(transfer.summary, "1.0 KiB of 4.0 KiB (25%), 1 of 4 files");
    assert_eq!(transfer.node_name.as_deref(), Some(NODE));
    assert_eq!(
        stalled(&status),
        Some(("False".into(), "Progressing".into()))
    );
    // Looked at again when the bound would pass without a report.
    assert_eq!(first.requeue, Some(Duration::from_secs(60)));
    // A copy of a stopped application learns its node from the report; a recorded node is
    // never replaced by a report's.
    let mut placed = stopped(facts.clone());
    placed.transfer_report = Some((mover(1024), "elsewhere".into()));
    assert_eq!(
        plan(&placed).status.unwrap().node_name.as_deref(),
        Some("elsewhere")
    );
    let mut recorded = facts.clone();
    recorded.transfer_report = Some((mover(1024), "elsewhere".into()));
    assert_eq!(
        plan(&recorded)
            .status
            .map(|status| status.node_name)
            .unwrap_or(Some(NODE.into()))
            .as_deref(),
        Some(NODE)
    );
    facts.mover.stalled_after = Duration::from_secs(30);
    assert_eq!(plan(&facts).requeue, Some(Duration::from_secs(31)));

    // The same counts past the bound: Stalled, said once with a Warning.
    facts.backup.status = Some(status);
    facts.now += Duration::from_secs(31);
    let stall = plan(&facts);
    let status = stall.status.clone().unwrap();
    assert_eq!(stalled(&status), Some(("True".into(), "NoProgress".into())));
    assert_eq!(status.transfer, Some(transfer.clone()));
    assert!(
        stall
            .events
            .iter()
            .any(|event| event.reason == "Stalled" && event.warning),
        "{:?}",
        stall.events
    );
    facts.backup.status = Some(status);
    facts.now += Duration::from_secs(60);
    let again = plan(&facts);
    assert!(again.events.is_empty(), "{:?}", again.events);

    // Moving again: no longer stalled.
    facts.transfer_report = Some((mover(2048), NODE.into()));
    let moved = plan(&facts).status.unwrap();
    assert_eq!(
        stalled(&moved),
        Some(("False".into(), "Progressing".into()))
    );
    assert_eq!(moved.transfer.as_ref().unwrap().bytes_done, 2048);

    // Completed: everything the mover counted, and no Stalled condition.
    facts.backup.status = Some(moved);
    facts.job = JobFact::Owned(JobState::Succeeded);
    facts.report = report(UID);
    let done = plan(&facts).status.unwrap();
    assert_eq!(done.phase, Some(BackupPhase::Completed));
    assert_eq!(stalled(&done), None);
    assert_eq!(
        done.transfer.unwrap().summary,
        "5 B of 5 B (100%), 1 of 1 files"
    );
}
