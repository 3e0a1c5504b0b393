//! Every path a reconciliation of a Restore takes, as rows: the facts it read, and what the
//! plan says (phase and reason written, Events, Jobs, Lease step, pods released, requeue).
//! Long on purpose (over the ~600 lines a module should stay under): a row is a whole
//! scenario, and one table keeps every path of the plan side by side.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use std::collections::BTreeMap;

use super::*;
use crate::backups::decide::JobState;
use custody_kube::api::{RestorePhase, VolumeRestoreStatus, VolumeState};

const UID: &str = "5e1f0a2b-0000-4000-8000-000000000001";
const CLUSTER_UID: &str = "c1c1c1c1-0000-4000-8000-000000000002";
const CLAIM: &str = "data-db-0";

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

fn restore() -> Restore {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Restore",
        "metadata": {
            "name": "orders", "namespace": "ns", "uid": UID, "generation": 1,
            "finalizers": [FINALIZER],
            "ownerReferences": [{"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
                "name": "orders", "uid": CLUSTER_UID, "controller": true}],
        },
        "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "nightly"}},
    }))
    .unwrap()
}

fn cluster(uid: &str) -> Cluster {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "orders", "namespace": "ns", "uid": uid},
        "spec": {"statefulSetRef": {"name": "db"}, "volumeClaimTemplates": ["data"]},
    }))
    .unwrap()
}

fn backup(phase: &str) -> Backup {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": "nightly", "namespace": "ns", "uid": "b-uid"},
        "spec": {"clusterRef": {"name": "orders"}},
        "status": {"phase": phase, "artifact": {
            "repository": "store", "endpoint": "http://s3", "bucket": "bucket",
            "prefix": "p/b-uid", "key": "p/b-uid/data.tar.zst",
            "manifestKey": "p/b-uid/manifest.jsonl", "manifestHash": "abc",
        }},
    }))
    .unwrap()
}

fn repository() -> BackupRepository {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "BackupRepository",
        "metadata": {"name": "store", "namespace": "ns"},
        "spec": {"endpoint": "http://s3", "bucket": "bucket",
            "credentialsSecretRef": {"name": "s3"}},
    }))
    .unwrap()
}

fn pod(name: &str, gated: bool) -> Pod {
    let conditions = if gated {
        json!([{"type": crate::inject::READINESS_GATE, "status": "True"}])
    } else {
        json!([])
    };
    // db-0 is the pod `report` speaks of, on node-a.
    let uid = if name == "db-0" {
        "pod-uid".to_string()
    } else {
        format!("{name}-uid")
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"nodeName": "node-a", "containers": []},
        "status": {"conditions": conditions},
    }))
    .unwrap()
}

fn report(state: VolumeState, reason: Option<&str>) -> (String, Vec<ReportedVolume>) {
    (
        "node-a".into(),
        vec![ReportedVolume {
            namespace: "ns".into(),
            pod_name: "db-0".into(),
            pod_uid: "pod-uid".into(),
            claim_name: CLAIM.into(),
            restore_uid: UID.into(),
            state,
            reason: reason.map(str::to_string),
            message: reason.map(|_| "base/1 differs".to_string()),
        }],
    )
}

fn volume(state: VolumeState, attempts: u32) -> VolumeRestoreStatus {
    VolumeRestoreStatus {
        claim_name: CLAIM.into(),
        state,
        node_name: (attempts > 0).then(|| "node-a".to_string()),
        pod_name: (attempts > 0).then(|| "db-0".to_string()),
        job_name: (attempts > 0).then(|| decide::job_name(CLAIM, UID, attempts)),
        attempts,
        ..VolumeRestoreStatus::default()
    }
}

fn ready(reason: &str) -> Condition {
    Condition {
        type_: types::READY.into(),
        status: "False".into(),
        reason: reason.into(),
        message: "earlier".into(),
        observed_generation: Some(1),
        last_transition_time: Time(now()),
    }
}

/// A Restore that can go on: its Cluster, a completed Backup, its repository, a StatefulSet of
/// one replica, nothing running.
fn facts() -> Facts {
    Facts {
        restore: restore(),
        now: now(),
        mover: crate::mover_job::MoverJob::new("mover:1"),
        cluster: Some(cluster(CLUSTER_UID)),
        agents: Vec::new(),
        backup: Some(backup("Completed")),
        repository: Some(repository()),
        replicas: Some(1),
        backups: Vec::new(),
        jobs: Vec::new(),
        pods: vec![pod("db-0", false)],
        finished_jobs: Vec::new(),
        unmarked_claims: Vec::new(),
        nodes: [(
            "node-a".to_string(),
            AgentHealth {
                ready: true,
                last_heartbeat: Some(now()),
            },
        )]
        .into(),
        workload_pods: BTreeMap::new(),
        unheld_pods: Vec::new(),
        job_problems: BTreeMap::new(),
        job_nodes: BTreeMap::new(),
        job_finished: BTreeMap::new(),
        mover_slots: BTreeMap::new(),
        transfer_reports: BTreeMap::new(),
    }
}

fn with_status(mut facts: Facts, phase: RestorePhase, volumes: Vec<VolumeRestoreStatus>) -> Facts {
    facts.restore.status = Some(RestoreStatus {
        phase: Some(phase),
        volumes,
        ..RestoreStatus::default()
    });
    facts
}

/// What a row expects of the plan.
#[derive(Debug, PartialEq)]
struct Expect {
    phase: Option<RestorePhase>,
    ready_reason: Option<&'static str>,
    events: Vec<(&'static str, bool)>,
    jobs: usize,
    lease: LeaseStep,
    release: Vec<&'static str>,
    requeue: Option<u64>,
}

fn seen(plan: &Plan) -> Expect {
    let status = plan.status.as_ref();
    Expect {
        phase: status.and_then(|status| status.phase),
        ready_reason: status.and_then(|status| {
            status
                .conditions
                .iter()
                .find(|condition| condition.type_ == types::READY)
                .map(|condition| {
                    // Leak-free: every reason a plan writes is one of these.
                    [
                        reasons::CLUSTER_NOT_FOUND,
                        reasons::CLUSTER_MISMATCH,
                        reasons::BACKUP_NOT_FOUND,
                        reasons::BACKUP_NOT_COMPLETED,
                        reasons::BACKUP_BEING_DELETED,
                        reasons::REPOSITORY_NOT_FOUND,
                        reasons::STATEFUL_SET_NOT_FOUND,
                        reasons::WAITING_FOR_PODS,
                        reasons::RESTORING,
                        reasons::COMPLETED,
                        holds::BACKUP_IN_PROGRESS,
                        holds::CLUSTER_BUSY,
                        "UnsupportedVolumeLayout",
                        "ContentMismatch",
                        "VerificationFailed",
                        "RestoreJobFailed",
                        "JobDeleted",
                    ]
                    .into_iter()
                    .find(|reason| *reason == condition.reason)
                    .unwrap_or("(unexpected)")
                })
        }),
        events: plan
            .events
            .iter()
            .map(|note| {
                (
                    [
                        "RestoreStarted",
                        "JobRecreated",
                        "VolumeVerified",
                        reasons::COMPLETED,
                        reasons::CLUSTER_NOT_FOUND,
                        reasons::CLUSTER_MISMATCH,
                        reasons::BACKUP_NOT_FOUND,
                        reasons::BACKUP_NOT_COMPLETED,
                        reasons::BACKUP_BEING_DELETED,
                        reasons::REPOSITORY_NOT_FOUND,
                        holds::BACKUP_IN_PROGRESS,
                        holds::CLUSTER_BUSY,
                        "UnsupportedVolumeLayout",
                        "ContentMismatch",
                        "VerificationFailed",
                        "RestoreJobFailed",
                    ]
                    .into_iter()
                    .find(|reason| *reason == note.reason)
                    .unwrap_or("(unexpected)"),
                    note.warning,
                )
            })
            .collect(),
        jobs: plan.jobs.len(),
        lease: plan.lease.clone(),
        release: {
            let mut pods: Vec<&'static str> = plan
                .release
                .iter()
                .map(|pod| if pod == "db-0" { "db-0" } else { "(other)" })
                .collect();
            pods.sort();
            pods
        },
        requeue: plan.requeue.map(|after| after.as_secs()),
    }
}

fn expect(
    phase: Option<RestorePhase>,
    ready_reason: Option<&'static str>,
    events: &[(&'static str, bool)],
    jobs: usize,
    lease: LeaseStep,
    release: &[&'static str],
    requeue: Option<u64>,
) -> Expect {
    Expect {
        phase,
        ready_reason,
        events: events.to_vec(),
        jobs,
        lease,
        release: release.to_vec(),
        requeue,
    }
}

#[test]
fn every_path_of_a_reconciliation() {
    use LeaseStep::*;
    use RestorePhase::*;
    const WARN: bool = true;
    const NORMAL: bool = false;
    let rows: Vec<(&str, Facts, Expect)> = vec![
        (
            "no pod reported yet: waiting for pods, nothing created",
            facts(),
            expect(
                Some(Pending),
                Some(reasons::WAITING_FOR_PODS),
                &[],
                0,
                Keep,
                &[],
                Some(5),
            ),
        ),
        (
            "the Cluster is gone before the restore ended: wait, warn",
            Facts {
                cluster: None,
                ..facts()
            },
            expect(
                Some(Pending),
                Some(reasons::CLUSTER_NOT_FOUND),
                &[(reasons::CLUSTER_NOT_FOUND, WARN)],
                0,
                Keep,
                &[],
                Some(15),
            ),
        ),
        (
            "the Cluster is still gone: no second Warning",
            {
                let mut facts = with_status(
                    Facts {
                        cluster: None,
                        ..facts()
                    },
                    Pending,
                    vec![],
                );
                facts.restore.status.as_mut().unwrap().conditions =
                    vec![ready(reasons::CLUSTER_NOT_FOUND)];
                facts
            },
            expect(
                Some(Pending),
                Some(reasons::CLUSTER_NOT_FOUND),
                &[],
                0,
                Keep,
                &[],
                Some(15),
            ),
        ),
        (
            "the Cluster is gone after the restore completed: nothing to do",
            with_status(
                Facts {
                    cluster: None,
                    ..facts()
                },
                Completed,
                vec![],
            ),
            expect(None, None, &[], 0, Keep, &[], None),
        ),
        (
            "the Cluster is gone after the restore failed: it stays failed",
            with_status(
                Facts {
                    cluster: None,
                    ..facts()
                },
                Failed,
                vec![],
            ),
            expect(None, None, &[], 0, Keep, &[], None),
        ),
        (
            "a later Cluster of the same name: fail, never write it",
            Facts {
                cluster: Some(cluster("another-uid")),
                ..facts()
            },
            expect(
                Some(Failed),
                Some(reasons::CLUSTER_MISMATCH),
                &[(reasons::CLUSTER_MISMATCH, WARN)],
                0,
                Keep,
                &[],
                None,
            ),
        ),
        (
            "completed: the verified pod gets its gate, the Lease goes back",
            Facts {
                agents: vec![report(VolumeState::Verified, None)],
                ..with_status(facts(), Completed, vec![volume(VolumeState::Verified, 1)])
            },
            expect(None, None, &[], 0, Release, &["db-0"], Some(60)),
        ),
        (
            "completed: a pod with other conditions true but not the gate gets the gate",
            Facts {
                agents: vec![report(VolumeState::Verified, None)],
                pods: vec![
                    serde_json::from_value(json!({
                        "metadata": {"name": "db-0", "namespace": "ns", "uid": "pod-uid"},
                        "spec": {"nodeName": "node-a", "containers": []},
                        "status": {"conditions": [
                            {"type": "PodScheduled", "status": "True"},
                            {"type": crate::inject::READINESS_GATE, "status": "False"},
                        ]},
                    }))
                    .unwrap(),
                ],
                ..with_status(facts(), Completed, vec![volume(VolumeState::Verified, 1)])
            },
            expect(None, None, &[], 0, Release, &["db-0"], Some(60)),
        ),
        (
            "completed: a pod already gated is left alone",
            Facts {
                agents: vec![report(VolumeState::Verified, None)],
                pods: vec![pod("db-0", true)],
                ..with_status(facts(), Completed, vec![volume(VolumeState::Verified, 1)])
            },
            expect(None, None, &[], 0, Release, &[], Some(60)),
        ),
        (
            "the Backup is gone: fail",
            Facts {
                backup: None,
                ..facts()
            },
            expect(
                Some(Failed),
                Some(reasons::BACKUP_NOT_FOUND),
                &[(reasons::BACKUP_NOT_FOUND, WARN)],
                0,
                Keep,
                &[],
                None,
            ),
        ),
        (
            "the Backup is being deleted and nothing started: fail",
            Facts {
                backup: Some({
                    let mut backup = backup("Completed");
                    backup.metadata.deletion_timestamp = Some(Time(now()));
                    backup
                }),
                ..facts()
            },
            expect(
                Some(Failed),
                Some(reasons::BACKUP_BEING_DELETED),
                &[(reasons::BACKUP_BEING_DELETED, WARN)],
                0,
                Keep,
                &[],
                None,
            ),
        ),
        (
            "the Backup is being deleted under a started restore: it goes on",
            Facts {
                backup: Some({
                    let mut backup = backup("Completed");
                    backup.metadata.deletion_timestamp = Some(Time(now()));
                    backup
                }),
                agents: vec![report(VolumeState::Restoring, None)],
                jobs: vec![(
                    decide::job_name(CLAIM, UID, 1),
                    JobFact::Owned(JobState::Running),
                )],
                ..with_status(facts(), Running, vec![volume(VolumeState::Restoring, 1)])
            },
            expect(
                Some(Running),
                Some(reasons::RESTORING),
                &[],
                0,
                Keep,
                &[],
                Some(5),
            ),
        ),
        (
            "the Backup is being deleted, the volumes known but none started: fail",
            Facts {
                backup: Some({
                    let mut backup = backup("Completed");
                    backup.metadata.deletion_timestamp = Some(Time(now()));
                    backup
                }),
                ..with_status(facts(), Pending, vec![volume(VolumeState::Pending, 0)])
            },
            expect(
                Some(Failed),
                Some(reasons::BACKUP_BEING_DELETED),
                &[(reasons::BACKUP_BEING_DELETED, WARN)],
                0,
                Keep,
                &[],
                None,
            ),
        ),
        (
            "an owner that is not its controlling Cluster does not count",
            {
                let mut facts = facts();
                facts.restore.metadata.owner_references = Some(
                    serde_json::from_value(json!([
                        {"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
                         "name": "orders", "uid": "not-the-controller", "controller": false},
                        {"apiVersion": "v1", "kind": "ConfigMap",
                         "name": "orders", "uid": "a-controller-of-another-kind", "controller": true},
                    ]))
                    .unwrap(),
                );
                facts
            },
            expect(
                Some(Pending),
                Some(reasons::WAITING_FOR_PODS),
                &[],
                0,
                Keep,
                &[],
                Some(5),
            ),
        ),
        (
            "the Cluster is gone and Ready said something else before: warn",
            {
                let mut facts = with_status(
                    Facts {
                        cluster: None,
                        ..facts()
                    },
                    Pending,
                    vec![],
                );
                facts.restore.status.as_mut().unwrap().conditions =
                    vec![ready(reasons::WAITING_FOR_PODS)];
                facts
            },
            expect(
                Some(Pending),
                Some(reasons::CLUSTER_NOT_FOUND),
                &[(reasons::CLUSTER_NOT_FOUND, WARN)],
                0,
                Keep,
                &[],
                Some(15),
            ),
        ),
        (
            "a completed Backup without a manifest hash (not a command's): wait",
            Facts {
                backup: Some({
                    let mut backup = backup("Completed");
                    backup
                        .status
                        .as_mut()
                        .unwrap()
                        .artifact
                        .as_mut()
                        .unwrap()
                        .manifest_hash = None;
                    backup
                }),
                ..facts()
            },
            expect(
                Some(Pending),
                Some(reasons::BACKUP_NOT_COMPLETED),
                &[(reasons::BACKUP_NOT_COMPLETED, WARN)],
                0,
                Keep,
                &[],
                Some(15),
            ),
        ),
        (
            "a running backup of the Cluster that is being deleted holds nothing",
            Facts {
                backups: vec![{
                    let mut going = backup("Running");
                    going.metadata.name = Some("hourly".into());
                    going.metadata.deletion_timestamp = Some(Time(now()));
                    going
                }],
                ..facts()
            },
            expect(
                Some(Pending),
                Some(reasons::WAITING_FOR_PODS),
                &[],
                0,
                Keep,
                &[],
                Some(5),
            ),
        ),
        (
            "the Backup still runs: wait",
            Facts {
                backup: Some(backup("Running")),
                ..facts()
            },
            expect(
                Some(Pending),
                Some(reasons::BACKUP_NOT_COMPLETED),
                &[(reasons::BACKUP_NOT_COMPLETED, WARN)],
                0,
                Keep,
                &[],
                Some(15),
            ),
        ),
        (
            "the Backup failed: fail",
            Facts {
                backup: Some(backup("Failed")),
                ..facts()
            },
            expect(
                Some(Failed),
                Some(reasons::BACKUP_NOT_COMPLETED),
                &[(reasons::BACKUP_NOT_COMPLETED, WARN)],
                0,
                Keep,
                &[],
                None,
            ),
        ),
        (
            "the Backup was taken by a command: no manifest, fail",
            Facts {
                backup: Some({
                    let mut backup = backup("Completed");
                    backup.spec.command = Some(
                        serde_json::from_value(
                            json!({"image": "pg", "command": ["dump"], "prefix": "dumps"}),
                        )
                        .unwrap(),
                    );
                    backup
                        .status
                        .as_mut()
                        .unwrap()
                        .artifact
                        .as_mut()
                        .unwrap()
                        .manifest_hash = None;
                    backup
                }),
                ..facts()
            },
            expect(
                Some(Failed),
                Some(reasons::BACKUP_NOT_COMPLETED),
                &[(reasons::BACKUP_NOT_COMPLETED, WARN)],
                0,
                Keep,
                &[],
                None,
            ),
        ),
        (
            "the repository is gone: wait",
            Facts {
                repository: None,
                ..facts()
            },
            expect(
                Some(Pending),
                Some(reasons::REPOSITORY_NOT_FOUND),
                &[(reasons::REPOSITORY_NOT_FOUND, WARN)],
                0,
                Keep,
                &[],
                Some(30),
            ),
        ),
        (
            "no StatefulSet yet: wait quietly",
            Facts {
                replicas: None,
                ..facts()
            },
            expect(
                Some(Pending),
                Some(reasons::STATEFUL_SET_NOT_FOUND),
                &[],
                0,
                Keep,
                &[],
                Some(10),
            ),
        ),
        (
            "two volume claim templates: refused",
            Facts {
                cluster: Some({
                    let mut cluster = cluster(CLUSTER_UID);
                    cluster.spec.volume_claim_templates = vec!["data".into(), "wal".into()];
                    cluster
                }),
                ..facts()
            },
            expect(
                Some(Failed),
                Some("UnsupportedVolumeLayout"),
                &[("UnsupportedVolumeLayout", WARN)],
                0,
                Keep,
                &[],
                None,
            ),
        ),
        (
            "a backup of the Cluster runs: wait for it",
            Facts {
                backups: vec![{
                    let mut running = backup("Running");
                    running.metadata.name = Some("hourly".into());
                    running
                }],
                ..facts()
            },
            expect(
                Some(Pending),
                Some(holds::BACKUP_IN_PROGRESS),
                &[(holds::BACKUP_IN_PROGRESS, WARN)],
                0,
                Keep,
                &[],
                Some(5),
            ),
        ),
        (
            "a backup of another Cluster runs: no hold",
            Facts {
                backups: vec![{
                    let mut running = backup("Running");
                    running.spec.cluster_ref.name = "other".into();
                    running
                }],
                ..facts()
            },
            expect(
                Some(Pending),
                Some(reasons::WAITING_FOR_PODS),
                &[],
                0,
                Keep,
                &[],
                Some(5),
            ),
        ),
        (
            "the pod is reported: the first Job, after the Lease",
            Facts {
                agents: vec![report(VolumeState::Pending, None)],
                ..facts()
            },
            expect(
                Some(Running),
                Some(reasons::RESTORING),
                &[("RestoreStarted", NORMAL)],
                1,
                TakeFirst,
                &[],
                Some(5),
            ),
        ),
        (
            "the Job disappeared: created again, with a Warning",
            Facts {
                agents: vec![report(VolumeState::Restoring, None)],
                ..with_status(facts(), Running, vec![volume(VolumeState::Restoring, 1)])
            },
            expect(
                Some(Running),
                Some(reasons::RESTORING),
                &[("JobRecreated", WARN)],
                1,
                TakeFirst,
                &[],
                Some(5),
            ),
        ),
        (
            "the Job failed: the restore fails, the Lease goes back",
            Facts {
                agents: vec![report(VolumeState::Restoring, None)],
                jobs: vec![(
                    decide::job_name(CLAIM, UID, 1),
                    JobFact::Owned(JobState::Failed {
                        message: "BackoffLimitExceeded".into(),
                    }),
                )],
                ..with_status(facts(), Running, vec![volume(VolumeState::Restoring, 1)])
            },
            expect(
                Some(Failed),
                Some("RestoreJobFailed"),
                &[("RestoreJobFailed", WARN)],
                0,
                Release,
                &[],
                Some(60),
            ),
        ),
        (
            "the agent verified the volume: completed, the pod released",
            Facts {
                agents: vec![report(VolumeState::Verified, None)],
                jobs: vec![(
                    decide::job_name(CLAIM, UID, 1),
                    JobFact::Owned(JobState::Succeeded),
                )],
                ..with_status(facts(), Running, vec![volume(VolumeState::Verifying, 1)])
            },
            expect(
                Some(Completed),
                Some(reasons::COMPLETED),
                &[("VolumeVerified", NORMAL), (reasons::COMPLETED, NORMAL)],
                0,
                Release,
                &["db-0"],
                Some(60),
            ),
        ),
        (
            "the agent found the content differs: failed, the pod held",
            Facts {
                agents: vec![report(VolumeState::Failed, Some("ContentMismatch"))],
                ..with_status(facts(), Running, vec![volume(VolumeState::Verifying, 1)])
            },
            expect(
                Some(Failed),
                Some("ContentMismatch"),
                &[("ContentMismatch", WARN)],
                0,
                Release,
                &[],
                Some(60),
            ),
        ),
        (
            "a reason this controller does not know: VerificationFailed",
            Facts {
                agents: vec![report(VolumeState::Failed, Some("SomethingNew"))],
                ..with_status(facts(), Running, vec![volume(VolumeState::Verifying, 1)])
            },
            expect(
                Some(Failed),
                Some("VerificationFailed"),
                &[("VerificationFailed", WARN)],
                0,
                Release,
                &[],
                Some(60),
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
    facts.restore.metadata.finalizers = None;
    facts.agents = vec![report(VolumeState::Pending, None)];
    let plan = plan(&facts);
    assert!(plan.add_finalizer);
    assert_eq!(
        (
            plan.jobs.len(),
            plan.status,
            plan.events.len(),
            plan.publish_gate_ca
        ),
        (0, None, 0, false)
    );
}

#[test]
fn the_gate_ca_is_published_once_the_target_is_known() {
    assert!(plan(&facts()).publish_gate_ca);
    // Also while a backup holds the restore, or another run holds the Cluster.
    let mut held = facts();
    held.backups = vec![{
        let mut running = backup("Running");
        running.metadata.name = Some("hourly".into());
        running
    }];
    assert!(plan(&held).publish_gate_ca);
    assert!(cluster_busy(&facts(), "Backup/b").publish_gate_ca);
    assert!(
        !plan(&Facts {
            replicas: None,
            ..facts()
        })
        .publish_gate_ca
    );
    assert!(
        !plan(&Facts {
            backup: None,
            ..facts()
        })
        .publish_gate_ca
    );
}

#[test]
fn the_first_job_writes_the_reported_claim_on_the_reporting_node() {
    let facts = Facts {
        agents: vec![report(VolumeState::Pending, None)],
        ..facts()
    };
    let plan = plan(&facts);
    let job = &plan.jobs[0];
    assert_eq!(job.metadata.name, Some(decide::job_name(CLAIM, UID, 1)));
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(
        spec.active_deadline_seconds,
        Some(crate::mover_job::DEFAULT_DEADLINE_SECONDS)
    );
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.node_name.as_deref(), Some("node-a"));
    let limits = pod.containers[0].resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["memory"].0, crate::mover_job::DEFAULT_MEMORY_LIMIT);
    assert_eq!(pod.containers[0].image.as_deref(), Some("mover:1"));
    let args = pod.containers[0].args.clone().unwrap();
    assert!(
        args.windows(2)
            .any(|pair| pair == ["--key", "p/b-uid/data.tar.zst"]),
        "{args:?}"
    );
    assert!(
        args.windows(2).any(|pair| pair == ["--restore-uid", UID]),
        "{args:?}"
    );
    let status = plan.status.unwrap();
    assert_eq!(status.volumes[0].attempts, 1);
    assert_eq!(status.start_time, Some(Time(now())));
}

#[test]
fn an_unchanged_status_is_not_written() {
    let first = plan(&facts());
    let mut again = facts();
    again.restore.status = first.status.clone();
    let second = plan(&again);
    assert_eq!(second.status, None);
    assert!(second.events.is_empty());
}

#[test]
fn a_busy_cluster_waits_naming_the_holder() {
    let facts = facts();
    let plan = cluster_busy(&facts, "Backup/b-uid");
    let status = plan.status.unwrap();
    assert_eq!(status.phase, Some(RestorePhase::Pending));
    let ready = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.reason, holds::CLUSTER_BUSY);
    assert!(ready.message.contains("Backup/b-uid"), "{}", ready.message);
    assert!(plan.jobs.is_empty());
    assert_eq!(plan.requeue, Some(Duration::from_secs(5)));
}

#[test]
fn condition_reasons_are_known_words() {
    assert_eq!(
        decide::condition_reason("ContentMismatch"),
        "ContentMismatch"
    );
    assert_eq!(decide::condition_reason("JobDeleted"), "JobDeleted");
    assert_eq!(
        decide::condition_reason("Anything Else"),
        "VerificationFailed"
    );
}

fn prepare_job(name: &str, owner_uid: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
            "labels": {decide::LABEL_RESTORE_UID: UID},
            "ownerReferences": [{"apiVersion": "custody.io/v1alpha1", "kind": "Restore",
                "name": "orders", "uid": owner_uid, "controller": true}]},
    }))
    .unwrap()
}

#[test]
fn a_completed_restore_deletes_its_own_jobs_and_a_failed_one_keeps_them() {
    let jobs = vec![
        prepare_job("mine", UID),
        prepare_job("look-alike", "someone-else"),
    ];
    let completed = plan(&Facts {
        finished_jobs: jobs.clone(),
        ..with_status(
            facts(),
            RestorePhase::Completed,
            vec![volume(VolumeState::Verified, 1)],
        )
    });
    assert_eq!(
        completed.delete_jobs,
        vec![("mine".to_string(), "mine-uid".to_string())]
    );
    let failed = plan(&Facts {
        finished_jobs: jobs,
        ..with_status(
            facts(),
            RestorePhase::Failed,
            vec![volume(VolumeState::Failed, 1)],
        )
    });
    assert!(failed.delete_jobs.is_empty());
}

#[test]
fn only_a_volume_verified_in_this_reconciliation_is_announced() {
    let second = "data-db-1";
    let reported = |claim: &str, pod: &str| ReportedVolume {
        claim_name: claim.into(),
        pod_name: pod.into(),
        pod_uid: format!("{pod}-uid").replace("db-0-uid", "pod-uid"),
        ..report(VolumeState::Verified, None).1.remove(0)
    };
    let facts = Facts {
        replicas: Some(2),
        pods: vec![pod("db-0", false), pod("db-1", false)],
        agents: vec![(
            "node-a".into(),
            vec![reported(CLAIM, "db-0"), reported(second, "db-1")],
        )],
        jobs: vec![(
            decide::job_name(second, UID, 1),
            JobFact::Owned(JobState::Succeeded),
        )],
        ..with_status(
            facts(),
            RestorePhase::Running,
            vec![
                volume(VolumeState::Verified, 1),
                VolumeRestoreStatus {
                    claim_name: second.into(),
                    job_name: Some(decide::job_name(second, UID, 1)),
                    ..volume(VolumeState::Verifying, 1)
                },
            ],
        )
    };
    let plan = plan(&facts);
    let announced: Vec<&str> = plan
        .events
        .iter()
        .filter(|note| note.reason == "VolumeVerified")
        .map(|note| note.text.as_str())
        .collect();
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert!(announced[0].contains(second), "{announced:?}");
}

#[test]
fn a_completed_restore_marks_its_verified_claims_as_known_data() {
    let plan = plan(&Facts {
        unmarked_claims: vec![CLAIM.to_string()],
        ..with_status(
            facts(),
            RestorePhase::Completed,
            vec![volume(VolumeState::Verified, 1)],
        )
    });
    assert_eq!(plan.mark_claims.len(), 1);
    assert_eq!(plan.mark_claims[0].0, CLAIM);
    assert!(
        plan.mark_claims[0].1.contains(UID),
        "{:?}",
        plan.mark_claims
    );
}

#[test]
fn a_pod_on_a_node_without_a_working_agent_is_named_not_waited_for_in_silence() {
    // Scheduled to node-b, where no agent reports.
    let missing = plan(&Facts {
        workload_pods: [("db-0".to_string(), Some("node-b".to_string()))].into(),
        ..facts()
    });
    let status = missing.status.expect("a status");
    assert_eq!(
        status.volumes[0].reason.as_deref(),
        Some(reasons::AGENT_MISSING)
    );
    let message = status.volumes[0].message.clone().unwrap();
    assert!(
        message.contains("db-0") && message.contains("node-b"),
        "{message}"
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.reason, reasons::AGENT_MISSING);
    assert_eq!(missing.events[0].reason, reasons::AGENT_MISSING);
    assert!(missing.events[0].warning);
    assert!(missing.jobs.is_empty());

    // node-a's agent went silent while it verified: its report is not trusted, the volume
    // keeps its state and says why, and nothing new is decided.
    let silent = plan(&Facts {
        nodes: [(
            "node-a".to_string(),
            AgentHealth {
                ready: false,
                last_heartbeat: Some(now()),
            },
        )]
        .into(),
        workload_pods: [("db-0".to_string(), Some("node-a".to_string()))].into(),
        agents: vec![report(VolumeState::Verified, None)],
        jobs: vec![(
            decide::job_name(CLAIM, UID, 1),
            JobFact::Owned(JobState::Succeeded),
        )],
        ..with_status(
            facts(),
            RestorePhase::Running,
            vec![volume(VolumeState::Verifying, 1)],
        )
    });
    let status = silent.status.expect("a status");
    assert_eq!(
        status.phase,
        Some(RestorePhase::Running),
        "an untrusted Verified completes nothing"
    );
    assert_eq!(status.volumes[0].state, VolumeState::Verifying);
    assert_eq!(
        status.volumes[0].reason.as_deref(),
        Some(reasons::AGENT_NOT_READY)
    );
    assert!(silent.release.is_empty());
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.reason, reasons::AGENT_NOT_READY);

    // A pod not scheduled yet: the ordinary wait.
    let unscheduled = plan(&Facts {
        workload_pods: [("db-0".to_string(), None)].into(),
        ..facts()
    });
    let status = unscheduled.status.unwrap();
    assert_eq!(status.volumes[0].reason, None);
}

#[test]
fn a_prepare_data_job_whose_pod_does_not_start_is_named_with_a_warning_once() {
    let job = decide::job_name(CLAIM, UID, 1);
    let refused = "no pod could be created: pods \"x\" is forbidden: violates PodSecurity \"restricted:latest\"";
    let stuck = Facts {
        agents: vec![report(VolumeState::Restoring, None)],
        jobs: vec![(job.clone(), JobFact::Owned(JobState::Running))],
        job_problems: [(job.clone(), refused.to_string())].into(),
        ..with_status(
            facts(),
            RestorePhase::Running,
            vec![volume(VolumeState::Restoring, 1)],
        )
    };
    let first = plan(&stuck);
    let status = first.status.clone().expect("a status");
    assert_eq!(status.phase, Some(RestorePhase::Running));
    assert_eq!(status.volumes[0].state, VolumeState::Restoring);
    assert_eq!(
        status.volumes[0].reason.as_deref(),
        Some(reasons::JOB_POD_NOT_STARTING)
    );
    let message = status.volumes[0].message.clone().unwrap();
    assert!(
        message.contains(&job) && message.contains("PodSecurity"),
        "{message}"
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.reason, reasons::JOB_POD_NOT_STARTING);
    assert!(ready.message.contains("PodSecurity"), "{}", ready.message);
    assert!(
        first
            .events
            .iter()
            .any(|note| note.warning && note.reason == reasons::JOB_POD_NOT_STARTING),
        "{:?}",
        first.events
    );
    assert!(first.jobs.is_empty(), "the Job exists: nothing is created");

    // Written, the same reason warns no more.
    let mut again = stuck.clone();
    again.restore.status = Some(status);
    let second = plan(&again);
    assert!(
        !second
            .events
            .iter()
            .any(|note| note.reason == reasons::JOB_POD_NOT_STARTING),
        "{:?}",
        second.events
    );

    // The pod started: the volume and the Restore say it is written again.
    let mut fixed = again.clone();
    fixed.job_problems.clear();
    let status = plan(&fixed).status.expect("a status");
    assert_eq!(status.volumes[0].reason, None);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.reason, reasons::RESTORING);
}

#[test]
fn a_report_from_another_node_is_not_taken() {
    let (_, volumes) = report(VolumeState::Verified, None);
    for (name, phase) in [
        ("running", RestorePhase::Running),
        ("completed", RestorePhase::Completed),
    ] {
        let facts = Facts {
            agents: vec![("node-b".into(), volumes.clone())],
            pods: vec![pod("db-0", false)],
            ..with_status(facts(), phase, vec![volume(VolumeState::Verifying, 1)])
        };
        let plan = plan(&facts);
        assert!(plan.release.is_empty(), "{name}: {:?}", plan.release);
        assert!(
            !plan
                .events
                .iter()
                .any(|note| note.reason == "VolumeVerified"),
            "{name}: {:?}",
            plan.events
        );
    }
    // The same report from the pod's own node is taken.
    let facts = Facts {
        agents: vec![("node-a".into(), volumes)],
        pods: vec![pod("db-0", false)],
        ..with_status(
            facts(),
            RestorePhase::Completed,
            vec![volume(VolumeState::Verified, 1)],
        )
    };
    assert_eq!(plan(&facts).release, BTreeSet::from(["db-0".to_string()]));
}

#[test]
fn a_pod_running_without_custody_wait_is_named_not_waited_for_in_silence() {
    let plan = plan(&Facts {
        workload_pods: [("db-0".to_string(), Some("node-a".to_string()))].into(),
        unheld_pods: vec!["db-0".to_string()],
        ..facts()
    });
    let status = plan.status.expect("a status");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == types::READY)
        .unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, reasons::POD_NOT_HELD);
    assert!(
        ready.message.contains("pod db-0") && ready.message.contains("delete the pod"),
        "{}",
        ready.message
    );
    assert_eq!(plan.events[0].reason, reasons::POD_NOT_HELD);
    assert!(plan.events[0].warning);
}

/// A Backup of two volumes restores each into the claim of the template of its name, with
/// that volume's manifest hash; the pod is released only once both are verified.
#[test]
fn every_volume_of_a_snapshot_restores_into_its_templates_claims() {
    let mut backup = backup("Completed");
    let artifact = backup.status.as_mut().unwrap().artifact.as_mut().unwrap();
    artifact.key = String::new();
    artifact.manifest_key = String::new();
    artifact.manifest_hash = Some("h-data".into());
    artifact.snapshot = Some(
        serde_json::from_value(
            json!({"repositoryId": "r", "id": "s1", "originCluster": "o",
            "volumes": ["data", "wal"],
            "volumeManifests": [{"name": "data", "manifestHash": "h-data"},
                {"name": "wal", "manifestHash": "h-wal"}]}),
        )
        .unwrap(),
    );
    let mut cluster = cluster(CLUSTER_UID);
    cluster.spec.volume_claim_templates = vec!["data".into(), "wal".into()];
    let reported = |claim: &str, state: VolumeState| ReportedVolume {
        namespace: "ns".into(),
        pod_name: "db-0".into(),
        pod_uid: "pod-uid".into(),
        claim_name: claim.into(),
        restore_uid: UID.into(),
        state,
        reason: None,
        message: None,
    };
    let facts = Facts {
        backup: Some(backup),
        cluster: Some(cluster),
        agents: vec![(
            "node-a".into(),
            vec![
                reported("data-db-0", VolumeState::Pending),
                reported("wal-db-0", VolumeState::Pending),
            ],
        )],
        ..facts()
    };
    let plan = plan(&facts);
    let status = plan.status.clone().unwrap();
    let claims: Vec<&str> = status
        .volumes
        .iter()
        .map(|volume| volume.claim_name.as_str())
        .collect();
    assert_eq!(claims, ["data-db-0", "wal-db-0"]);
    let written: Vec<(String, String, String)> = plan
        .jobs
        .iter()
        .map(|job| {
            let args = job
                .spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .args
                .clone()
                .unwrap();
            let value = |flag: &str| {
                args.windows(2)
                    .find(|pair| pair[0] == flag)
                    .map(|pair| pair[1].clone())
                    .unwrap_or_default()
            };
            (
                value("--volume"),
                value("--manifest-hash"),
                value("--snapshot"),
            )
        })
        .collect();
    assert_eq!(
        written,
        [
            ("data".into(), "h-data".into(), "s1".into()),
            ("wal".into(), "h-wal".into(), "s1".into())
        ]
    );
    // One volume verified, the other not: the pod stays held.
    let half = Facts {
        agents: vec![(
            "node-a".into(),
            vec![
                reported("data-db-0", VolumeState::Verified),
                reported("wal-db-0", VolumeState::Verifying),
            ],
        )],
        ..facts.clone()
    };
    assert!(super::plan(&half).release.is_empty());
    let only_one_reported = Facts {
        agents: vec![(
            "node-a".into(),
            vec![reported("data-db-0", VolumeState::Verified)],
        )],
        ..facts.clone()
    };
    assert!(super::plan(&only_one_reported).release.is_empty());
    let both = Facts {
        agents: vec![(
            "node-a".into(),
            vec![
                reported("data-db-0", VolumeState::Verified),
                reported("wal-db-0", VolumeState::Verified),
            ],
        )],
        ..facts
    };
    assert_eq!(
        super::plan(&both).release.into_iter().collect::<Vec<_>>(),
        ["db-0"]
    );
}

#[test]
fn volumes_past_the_movers_per_node_wait_for_a_slot_and_say_so() {
    let claims = ["data-db-0", "data-db-1", "data-db-2"];
    let reported = |claim: &str, pod: &str| ReportedVolume {
        claim_name: claim.into(),
        pod_name: pod.into(),
        pod_uid: format!("{pod}-uid").replace("db-0-uid", "pod-uid"),
        ..report(VolumeState::Pending, None).1.remove(0)
    };
    let three = |bound: u32, taken: u32| {
        let mut facts = Facts {
            replicas: Some(3),
            pods: vec![pod("db-0", false), pod("db-1", false), pod("db-2", false)],
            agents: vec![(
                "node-a".into(),
                vec![
                    reported(claims[0], "db-0"),
                    reported(claims[1], "db-1"),
                    reported(claims[2], "db-2"),
                ],
            )],
            ..facts()
        };
        facts.mover.movers_per_node = bound;
        facts.mover_slots = BTreeMap::from([("node-a".to_string(), taken)]);
        facts
    };
    // (bound, taken on node-a, Jobs created)
    for (bound, taken, created) in [(0, 7, 3), (2, 1, 1), (2, 2, 0), (3, 0, 3), (4, 2, 2)] {
        let plan = plan(&three(bound, taken));
        assert_eq!(plan.jobs.len(), created, "{taken} taken of {bound}");
        let status = plan.status.unwrap();
        let waiting: Vec<&VolumeRestoreStatus> = status
            .volumes
            .iter()
            .filter(|volume| volume.reason.as_deref() == Some(crate::node_slots::MOVER_SLOTS_BUSY))
            .collect();
        assert_eq!(waiting.len(), 3 - created, "{taken} taken of {bound}");
        for volume in &waiting {
            assert_eq!(volume.state, VolumeState::Pending);
            assert_eq!(volume.attempts, 0, "no attempt used");
            assert_eq!(volume.job_name, None);
            let said = volume.message.clone().unwrap();
            assert!(
                said.contains("node node-a") && said.contains(&format!("at most {bound}")),
                "{said}"
            );
        }
        // Waiting on: the next reconciliation keeps when the volumes began to wait (no status
        // churn, and the wait is not taken for a pause before the volumes).
        if created == 0 {
            let mut later = three(bound, taken);
            later.restore.status = Some(status.clone());
            later.now = now() + std::time::Duration::from_secs(30);
            let again = super::plan(&later);
            assert!(
                again.status.is_none(),
                "nothing changed: {:?}",
                again.status
            );
        }
        // The Jobs go to the first volumes, in order.
        for (index, job) in plan.jobs.iter().enumerate() {
            assert_eq!(
                job.metadata.name,
                Some(decide::job_name(claims[index], UID, 1))
            );
        }
        if created < 3 {
            let ready = status
                .conditions
                .iter()
                .find(|condition| condition.type_ == "Ready")
                .unwrap();
            assert_eq!(ready.reason, crate::node_slots::MOVER_SLOTS_BUSY);
            assert!(
                plan.events
                    .iter()
                    .any(|note| note.reason == crate::node_slots::MOVER_SLOTS_BUSY && !note.warning),
                "told once, as a Normal Event: {:?}",
                plan.events
            );
        }
    }
}

#[test]
fn a_restoring_volume_shows_how_far_it_came_and_the_restore_says_when_it_stalls() {
    let job = decide::job_name(CLAIM, UID, 1);
    let mover = |bytes: u64| custody_kube::api::ReportedMover {
        namespace: "ns".into(),
        pod_name: "prepare-pod".into(),
        pod_uid: "prepare-uid".into(),
        job_name: job.clone(),
        owner_uid: UID.into(),
        operation: "restore".into(),
        volume: String::new(),
        bytes_done: bytes,
        files_done: 2,
        bytes_total: Some(2 << 20),
        files_total: Some(8),
        bytes_sent: 0,
    };
    let stalled = |status: &custody_kube::api::RestoreStatus| {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == types::STALLED)
            .map(|condition| (condition.status.clone(), condition.reason.clone()))
    };
    let mut facts = Facts {
        agents: vec![report(VolumeState::Restoring, None)],
        jobs: vec![(job.clone(), JobFact::Owned(JobState::Running))],
        ..with_status(
            facts(),
            RestorePhase::Running,
            vec![volume(VolumeState::Restoring, 1)],
        )
    };
    facts.mover.stalled_after = Duration::from_secs(60);
    facts
        .transfer_reports
        .insert(job.clone(), (mover(1 << 20), "node-a".into()));
    let status = plan(&facts).status.expect("the progress is written");
    let transfer = status.volumes[0].transfer.clone().unwrap();
    assert_eq!(transfer.summary, "1.0 MiB of 2.0 MiB (50%), 2 of 8 files");
    assert_eq!(transfer.node_name.as_deref(), Some("node-a"));
    assert_eq!(status.transfer.as_ref().unwrap().summary, transfer.summary);
    assert_eq!(
        stalled(&status),
        Some(("False".into(), "Progressing".into()))
    );

    // No report and no change past the bound: Stalled, once, naming the node.
    facts.restore.status = Some(status);
    facts.transfer_reports.clear();
    facts.now += Duration::from_secs(61);
    let stall = plan(&facts);
    let status = stall.status.clone().unwrap();
    assert_eq!(stalled(&status), Some(("True".into(), "NoProgress".into())));
    let warning = stall
        .events
        .iter()
        .find(|event| event.reason == types::STALLED)
        .expect("a Warning");
    assert!(
        warning.warning && warning.text.contains("node node-a"),
        "{}",
        warning.text
    );
    facts.restore.status = Some(status);
    facts.now += Duration::from_secs(10);
    assert!(
        !plan(&facts)
            .events
            .iter()
            .any(|event| event.reason == types::STALLED)
    );

    // Written and being verified: everything, and nothing stalls.
    let mut written = facts.restore.status.clone().unwrap();
    written.volumes[0].state = VolumeState::Verifying;
    facts.restore.status = Some(written);
    facts.agents = vec![report(VolumeState::Verifying, None)];
    facts.jobs = vec![(job.clone(), JobFact::Owned(JobState::Succeeded))];
    let status = plan(&facts).status.unwrap();
    assert_eq!(
        status.volumes[0].transfer.as_ref().unwrap().summary,
        "2.0 MiB of 2.0 MiB (100%), 8 of 8 files"
    );
    assert_eq!(stalled(&status), None);
}
