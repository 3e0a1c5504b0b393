use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;

const T0: &str = "2026-12-01T10:00:00Z";
const T0_SECONDS: f64 = 1_796_119_200.0;

fn at(offset: i64) -> String {
    let time: Timestamp = T0.parse().unwrap();
    (time + k8s_openapi::jiff::SignedDuration::from_secs(offset)).to_string()
}

fn ready(status: &str, reason: &str, when: i64) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": "",
           "lastTransitionTime": at(when)})
}

struct B {
    name: &'static str,
    namespace: &'static str,
    cluster: &'static str,
    plan: Option<&'static str>,
    imported: bool,
    status: Value,
    deleting: bool,
}

impl B {
    fn new(name: &'static str, status: Value) -> B {
        B {
            name,
            namespace: "shop",
            cluster: "orders",
            plan: None,
            imported: false,
            status,
            deleting: false,
        }
    }

    fn build(&self) -> Arc<Backup> {
        let mut spec = json!({"clusterRef": {"name": self.cluster}});
        if self.imported {
            spec["importedSnapshot"] = json!("abc");
        }
        let mut metadata = json!({"name": self.name, "namespace": self.namespace,
                                  "uid": format!("uid-{}", self.name)});
        if let Some(plan) = self.plan {
            metadata["labels"] = json!({LABEL_PLAN: plan});
        }
        if self.deleting {
            metadata["deletionTimestamp"] = json!(at(0));
        }
        Arc::new(
            serde_json::from_value(
                json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
                "metadata": metadata, "spec": spec, "status": self.status}),
            )
            .unwrap(),
        )
    }
}

fn completed(start: i64, end: i64) -> Value {
    json!({"phase": "Completed", "startTime": at(start), "completionTime": at(end),
           "transfer": {"summary": "", "bytesDone": 4096, "filesDone": 2},
           "conditions": [ready("True", "Completed", end)]})
}

fn failed(reason: &str, when: i64) -> Value {
    json!({"phase": "Failed", "startTime": at(when - 5),
           "conditions": [ready("False", reason, when)]})
}

fn restore(name: &str, uid: &str, status: Value) -> Arc<Restore> {
    Arc::new(
        serde_json::from_value(
            json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": name, "namespace": "shop", "uid": uid,
                         "creationTimestamp": at(-60)},
            "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "b"}},
            "status": status}),
        )
        .unwrap(),
    )
}

fn agent(node: &str, heartbeat: Option<i64>, condition: Option<&str>) -> Arc<NodeAgent> {
    let mut status = json!({});
    if let Some(heartbeat) = heartbeat {
        status["lastHeartbeatTime"] = json!(at(heartbeat));
    }
    if let Some(condition) = condition {
        status["conditions"] = json!([ready(condition, "HeartbeatReceived", 0)]);
    }
    Arc::new(
        serde_json::from_value(
            json!({"apiVersion": "custody.io/v1alpha1", "kind": "NodeAgent",
            "metadata": {"name": node}, "spec": {"nodeName": node}, "status": status}),
        )
        .unwrap(),
    )
}

fn plan(name: &str, created: i64) -> Arc<BackupPlan> {
    Arc::new(
        serde_json::from_value(
            json!({"apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan",
            "metadata": {"name": name, "namespace": "shop", "creationTimestamp": at(created)},
            "spec": {"clusterRef": {"name": "orders"}, "schedule": "0 * * * *"}}),
        )
        .unwrap(),
    )
}

fn cluster(namespace: &str, name: &str) -> Arc<Cluster> {
    Arc::new(
        serde_json::from_value(
            json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"statefulSetRef": {"name": name}, "volumeClaimTemplates": ["data"]}}),
        )
        .unwrap(),
    )
}

fn all_clusters() -> Vec<Arc<Cluster>> {
    vec![
        cluster("shop", "orders"),
        cluster("shop", "users"),
        cluster("other", "orders"),
    ]
}

fn key(name: &str) -> Key {
    Key {
        namespace: "shop".to_string(),
        name: name.to_string(),
    }
}

#[test]
fn a_clusters_last_success_and_failure_are_its_newest_of_each() {
    // (backups, the Cluster's last success, its last failure: offsets from T0)
    let cases: Vec<(Vec<B>, Option<i64>, Option<i64>)> = vec![
        (vec![B::new("a", completed(0, 10))], Some(10), None),
        (
            vec![
                B::new("a", completed(0, 10)),
                B::new("b", completed(100, 130)),
                B::new("c", completed(50, 60)),
            ],
            Some(130),
            None,
        ),
        // A failure without a completion time: when Ready turned False.
        (vec![B::new("a", failed("ToolFailed", 40))], None, Some(40)),
        (
            vec![
                B::new("a", completed(0, 10)),
                B::new("b", failed("UploadFailed", 70)),
                B::new("c", failed("UploadFailed", 20)),
            ],
            Some(10),
            Some(70),
        ),
        // Running and pending Backups say nothing yet.
        (
            vec![B::new("a", json!({"phase": "Running", "startTime": at(0)}))],
            None,
            None,
        ),
        // A failed Backup whose Ready condition is not False has no failure time.
        (
            vec![B::new(
                "a",
                json!({"phase": "Failed", "conditions": [ready("Unknown", "X", 5)]}),
            )],
            None,
            None,
        ),
        // Another cluster's snapshot, imported here, is no backup of this Cluster.
        (
            vec![B {
                imported: true,
                ..B::new("a", completed(0, 10))
            }],
            None,
            None,
        ),
    ];
    for (index, (backups, success, failure)) in cases.into_iter().enumerate() {
        let backups: Vec<Arc<Backup>> = backups.iter().map(B::build).collect();
        let health = summarize(&all_clusters(), &backups, &[], &[], &[]);
        let last = health.clusters.get(&key("orders")).cloned();
        let expected = (success.is_some() || failure.is_some()).then(|| Last {
            success: success.map(|offset| T0_SECONDS + offset as f64),
            failure: failure.map(|offset| T0_SECONDS + offset as f64),
        });
        assert_eq!(last, expected, "case {index}");
    }
}

#[test]
fn clusters_and_plans_are_told_apart_by_namespace_and_label() {
    let backups: Vec<Arc<Backup>> = [
        B {
            plan: Some("nightly"),
            ..B::new("a", completed(0, 10))
        },
        B {
            plan: Some("nightly"),
            ..B::new("b", failed("ToolFailed", 30))
        },
        B {
            namespace: "other",
            ..B::new("c", completed(0, 99))
        },
        B {
            cluster: "users",
            ..B::new("d", completed(0, 5))
        },
    ]
    .iter()
    .map(B::build)
    .collect();
    let health = summarize(
        &all_clusters(),
        &backups,
        &[],
        &[plan("nightly", -500)],
        &[],
    );
    assert_eq!(
        health.clusters[&key("orders")].success,
        Some(T0_SECONDS + 10.0)
    );
    assert_eq!(
        health.clusters[&key("users")].success,
        Some(T0_SECONDS + 5.0)
    );
    let other = Key {
        namespace: "other".to_string(),
        name: "orders".to_string(),
    };
    assert_eq!(health.clusters[&other].success, Some(T0_SECONDS + 99.0));
    assert_eq!(
        health.plans[&key("nightly")],
        Last {
            success: Some(T0_SECONDS + 10.0),
            failure: Some(T0_SECONDS + 30.0)
        }
    );
    assert_eq!(health.plans.len(), 1);
    assert_eq!(health.plans_created[&key("nightly")], T0_SECONDS - 500.0);
}

#[test]
fn only_a_deletion_that_failed_and_is_not_done_counts_as_retrying() {
    // (being deleted, cleanup status, counted)
    let cases = [
        (true, json!({"attempts": 2, "done": false}), true),
        (true, json!({"attempts": 0, "done": false}), false),
        (true, json!({"attempts": 3, "done": true}), false),
        (false, json!({"attempts": 3, "done": false}), false),
    ];
    for (index, (deleting, cleanup, counted)) in cases.into_iter().enumerate() {
        let mut status = completed(0, 10);
        status["cleanup"] = cleanup;
        let backup = B {
            deleting,
            ..B::new("a", status)
        }
        .build();
        let health = summarize(&all_clusters(), &[backup], &[], &[], &[]);
        assert_eq!(
            health.deletions_retrying.get("shop").copied(),
            counted.then_some(1),
            "case {index}"
        );
    }
}

#[test]
fn an_unfinished_restore_waits_for_its_ready_reason_and_a_finished_one_does_not() {
    let restores = [
        restore(
            "held",
            "r1",
            json!({"phase": "Running", "conditions": [ready("False", "Verifying", 0)]}),
        ),
        restore("new", "r2", json!({})),
        restore("queued", "r3", json!({"phase": "Pending"})),
        restore(
            "done",
            "r4",
            json!({"phase": "Completed", "completionTime": at(5),
                   "conditions": [ready("True", "Completed", 5)]}),
        ),
        restore(
            "broken",
            "r5",
            json!({"phase": "Failed", "conditions": [ready("False", "RestoreJobFailed", 5)]}),
        ),
        // Ended, though it says not when: not waiting either.
        restore("odd", "r6", json!({"phase": "Failed"})),
    ];
    let health = summarize(&[], &[], &restores, &[], &[]);
    let waiting: Vec<(&str, &str)> = health
        .restores_waiting
        .iter()
        .map(|(key, waiting)| (key.name.as_str(), waiting.reason.as_str()))
        .collect();
    assert_eq!(
        waiting,
        [
            ("held", "Verifying"),
            ("new", "Pending"),
            ("queued", "Pending")
        ]
    );
    assert_eq!(
        health.restores_waiting[&key("held")].since,
        T0_SECONDS - 60.0
    );
}

#[test]
fn an_agent_reports_only_while_its_node_agent_is_ready() {
    let agents = [
        agent("a", Some(-5), Some("True")),
        agent("b", Some(-500), Some("False")),
        agent("c", None, Some("Unknown")),
        agent("d", None, None),
    ];
    let health = summarize(&[], &[], &[], &[], &agents);
    let seen: Vec<(&str, bool, Option<f64>)> = health
        .agents
        .iter()
        .map(|(node, agent)| (node.as_str(), agent.reporting, agent.last_heartbeat))
        .collect();
    assert_eq!(
        seen,
        [
            ("a", true, Some(T0_SECONDS - 5.0)),
            ("b", false, Some(T0_SECONDS - 500.0)),
            ("c", false, None),
            ("d", false, None),
        ]
    );
}

#[test]
fn each_ending_is_counted_once_and_endings_before_the_leader_started_never() {
    let mut counted = BTreeSet::new();
    let since = T0_SECONDS + 50.0;
    let old = B::new("old", completed(0, 10)).build();
    let new = B {
        plan: Some("nightly"),
        ..B::new("new", completed(60, 100))
    }
    .build();
    let broke = B::new("broke", failed("ToolFailed", 80)).build();
    let running = B::new("running", json!({"phase": "Running"})).build();
    let imported = B {
        imported: true,
        ..B::new("imported", completed(60, 90))
    }
    .build();
    let backups = vec![old, new, broke, running.clone(), imported];
    let restores = vec![restore(
        "r",
        "r1",
        json!({"phase": "Completed", "startTime": at(100), "completionTime": at(160),
               "transfer": {"summary": "", "bytesDone": 7, "filesDone": 1},
               "conditions": [ready("True", "Completed", 160)]}),
    )];
    let first = newly_finished(&backups, &restores, since, &mut counted);
    assert_eq!(
        first,
        vec![
            Finished {
                kind: FinishedKind::Backup,
                completed: true,
                reason: "Completed".to_string(),
                duration: Some(40.0),
                bytes: Some(4096),
                frozen: None,
            },
            Finished {
                kind: FinishedKind::Backup,
                completed: false,
                reason: "ToolFailed".to_string(),
                duration: Some(5.0),
                bytes: None,
                frozen: None,
            },
            Finished {
                kind: FinishedKind::Restore,
                completed: true,
                reason: "Completed".to_string(),
                duration: Some(60.0),
                bytes: Some(7),
                frozen: None,
            },
        ]
    );
    assert!(newly_finished(&backups, &restores, since, &mut counted).is_empty());
    // The running one ends (frozen for 1.5 s): counted now, once.
    let mut status = completed(70, 120);
    status["frozenMillis"] = json!(1500);
    let ended = B::new("running", status).build();
    let backups = vec![ended];
    let third = newly_finished(&backups, &[], since, &mut counted);
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].frozen, Some(1.5));
    // Objects gone are forgotten: the set does not grow forever.
    assert_eq!(counted, BTreeSet::from(["uid-running".to_string()]));
    let _ = running;
}

#[test]
fn the_gauges_are_exported_under_the_names_the_rules_use() {
    let metrics = crate::metrics::Metrics::default();
    let text = custody_kube::http::Exposition::encode(&metrics);
    // No series while the replica does not lead.
    assert!(!text.contains(names::CLUSTER_LAST_SUCCESS), "{text}");
    let backups: Vec<Arc<Backup>> = [
        B {
            plan: Some("nightly"),
            ..B::new("a", completed(0, 10))
        },
        B::new("b", failed("ToolFailed", 30)),
    ]
    .iter()
    .map(B::build)
    .collect();
    let restores = [restore("held", "r1", json!({"phase": "Running"}))];
    metrics.health.set(Some(summarize(
        &all_clusters(),
        &backups,
        &restores,
        &[plan("nightly", -10)],
        &[agent("n1", Some(0), Some("True"))],
    )));
    metrics.finished(&Finished {
        kind: FinishedKind::Backup,
        completed: false,
        reason: "ToolFailed".to_string(),
        duration: Some(3.0),
        bytes: None,
        frozen: Some(0.5),
    });
    metrics.artifact_deletion("Deleted");
    let text = custody_kube::http::Exposition::encode(&metrics);
    for line in [
        "custody_cluster_last_successful_backup_timestamp_seconds{namespace=\"shop\",cluster=\"orders\"} 1796119210",
        "custody_cluster_last_failed_backup_timestamp_seconds{namespace=\"shop\",cluster=\"orders\"} 1796119230",
        "custody_plan_last_successful_backup_timestamp_seconds{namespace=\"shop\",plan=\"nightly\"} 1796119210",
        "custody_plan_created_timestamp_seconds{namespace=\"shop\",plan=\"nightly\"} 1796119190",
        "custody_restore_waiting_since_timestamp_seconds{namespace=\"shop\",restore=\"held\",reason=\"Running\"} 1796119140",
        "custody_restores_waiting{namespace=\"shop\",reason=\"Running\"} 1",
        "custody_node_agent_last_heartbeat_timestamp_seconds{node=\"n1\"} 1796119200",
        "custody_node_agent_reporting{node=\"n1\"} 1",
        "custody_backups_finished_total{result=\"Failed\",reason=\"ToolFailed\"} 1",
        "custody_artifact_deletions_total{result=\"Deleted\"} 1",
        "custody_backup_duration_seconds_count 1",
        "custody_backup_freeze_duration_seconds_count 1",
        "custody_backup_size_bytes_count 0",
        "custody_controller_leader 0",
    ] {
        assert!(
            text.lines().any(|candidate| candidate.starts_with(line)),
            "{line} not in:\n{text}"
        );
    }
    // No plan failed: no failure series for it.
    assert!(!text.contains("custody_plan_last_failed_backup_timestamp_seconds{"));
    metrics.health.set(None);
    let text = custody_kube::http::Exposition::encode(&metrics);
    assert!(!text.contains(names::AGENT_REPORTING), "{text}");
}

#[test]
fn a_deleted_cluster_and_a_deleted_or_suspended_plan_have_no_series() {
    let backups: Vec<Arc<Backup>> = [
        B {
            plan: Some("nightly"),
            ..B::new("a", completed(0, 10))
        },
        B {
            plan: Some("paused"),
            ..B::new("b", completed(0, 20))
        },
        B {
            plan: Some("gone"),
            cluster: "users",
            ..B::new("c", failed("ToolFailed", 30))
        },
    ]
    .iter()
    .map(B::build)
    .collect();
    let mut paused = (*plan("paused", -100)).clone();
    paused.spec.suspend = true;
    let plans = [plan("nightly", -100), Arc::new(paused)];
    // Cluster users was deleted; its Backup stays (Backups outlive their Cluster).
    let health = summarize(&[cluster("shop", "orders")], &backups, &[], &plans, &[]);
    assert_eq!(health.clusters.keys().collect::<Vec<_>>(), [&key("orders")]);
    assert_eq!(health.plans.keys().collect::<Vec<_>>(), [&key("nightly")]);
    assert_eq!(
        health.plans_created.keys().collect::<Vec<_>>(),
        [&key("nightly")]
    );
}

/// A plan's drill series come from its `status.drill.last`: when it ended, whether it passed,
/// when one last passed; none for a plan without a drill (taken off), never drilled, or
/// suspended.
#[test]
fn a_plans_drill_gauges_are_its_last_drill_and_its_last_pass() {
    let drilled = |name: &str, drill: bool, result: Option<(&str, i64)>, success: Option<i64>| {
        let mut value = serde_json::to_value(&*plan(name, -100)).unwrap();
        if drill {
            value["spec"]["drill"] = json!({"schedule": "0 4 * * *", "check": {"command": ["c"]}});
        }
        let mut status = json!({});
        if let Some((result, when)) = result {
            status["last"] = json!({"backup": "b", "result": result, "reason": result,
                "message": "", "startedAt": at(when - 5), "finishedAt": at(when)});
        }
        if let Some(success) = success {
            status["lastSuccessTime"] = json!(at(success));
        }
        value["status"] = json!({"drill": status});
        Arc::new(serde_json::from_value::<BackupPlan>(value).unwrap())
    };
    let plans = [
        drilled("failing", true, Some(("Failed", 50)), Some(10)),
        drilled("passing", true, Some(("Passed", 40)), Some(40)),
        drilled("never", true, None, None),
        drilled("removed", false, Some(("Failed", 50)), None),
    ];
    let health = summarize(&all_clusters(), &[], &[], &plans, &[]);
    let base = 1_796_119_200.0;
    assert_eq!(
        health.drills,
        BTreeMap::from([
            (
                key("failing"),
                Drilled {
                    last: base + 50.0,
                    passed: false,
                    last_success: Some(base + 10.0)
                }
            ),
            (
                key("passing"),
                Drilled {
                    last: base + 40.0,
                    passed: true,
                    last_success: Some(base + 40.0)
                }
            ),
        ])
    );
    let metrics = crate::metrics::Metrics::default();
    metrics.health.set(Some(health));
    metrics.drill_finished("Failed", "CheckFailed");
    let text = custody_kube::http::Exposition::encode(&metrics);
    for line in [
        "custody_plan_last_drill_passed{namespace=\"shop\",plan=\"failing\"} 0",
        "custody_plan_last_drill_passed{namespace=\"shop\",plan=\"passing\"} 1",
        "custody_plan_last_drill_timestamp_seconds{namespace=\"shop\",plan=\"failing\"} 1796119250",
        "custody_plan_last_successful_drill_timestamp_seconds{namespace=\"shop\",plan=\"failing\"} 1796119210",
        "custody_drills_finished_total{result=\"Failed\",reason=\"CheckFailed\"} 1",
    ] {
        assert!(
            text.lines().any(|candidate| candidate.starts_with(line)),
            "{line} not in:\n{text}"
        );
    }
}
