//! Every path a reconciliation of a BackupPlan takes, as rows.

use serde_json::json;

use super::*;

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

/// A plan created at 11:00 running every hour on the hour.
fn plan(spec: serde_json::Value, last_schedule: Option<&str>) -> BackupPlan {
    let mut full = json!({"clusterRef": {"name": "orders"}, "schedule": "0 * * * *"});
    for (key, value) in spec.as_object().unwrap() {
        full[key] = value.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "BackupPlan",
        "metadata": {"name": "hourly", "namespace": "ns", "uid": "plan-uid", "generation": 1,
            "creationTimestamp": "2026-11-30T10:59:00Z"},
        "spec": full,
        "status": {"lastScheduleTime": last_schedule},
    }))
    .unwrap()
}

fn run(name: &str, phase: &str, created: &str) -> Backup {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
            "creationTimestamp": created},
        "spec": {"clusterRef": {"name": "orders"}},
        "status": {"phase": phase},
    }))
    .unwrap()
}

fn facts(plan: BackupPlan, now: &str, runs: Vec<Backup>) -> Facts {
    Facts {
        plan,
        now: at(now),
        runs,
        cluster: None,
    }
}

/// Cluster `orders`, with `consistency` (or none).
fn cluster(consistency: Option<serde_json::Value>) -> custody_kube::api::Cluster {
    let mut spec = json!({"statefulSetRef": {"name": "db"}, "volumeClaimTemplates": ["data"]});
    if let Some(consistency) = consistency {
        spec["consistency"] = consistency;
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "orders", "namespace": "ns"}, "spec": spec,
    }))
    .unwrap()
}

/// A plan whose runs would need the application stopped by hand is refused, creating none,
/// until the plan or its Cluster names a method, or the plan a command; a command plan's
/// runs carry the command.
#[test]
fn a_plan_needing_a_person_is_refused_and_a_command_plan_dumps() {
    let due = |spec: serde_json::Value, cluster: Option<serde_json::Value>| {
        super::plan(&Facts {
            cluster: Some(super::tests::cluster(cluster)),
            ..facts(
                plan(spec, Some("2026-11-30T11:00:00Z")),
                "2026-11-30T12:00:01Z",
                vec![],
            )
        })
        .unwrap()
    };
    let refused = due(json!({}), None);
    assert_eq!(
        seen(&refused),
        seen_of(
            reasons::CONSISTENCY_METHOD_REQUIRED,
            None,
            &[],
            &[reasons::CONSISTENCY_METHOD_REQUIRED],
            Some(60)
        )
    );
    let refused_status = refused.status.unwrap();
    let message = &refused_status.conditions[0].message;
    assert!(
        message.contains("Cluster orders") && message.contains("unattended"),
        "{message}"
    );
    // The slot passed without a run: naming a method later starts no old slot at once.
    assert_eq!(
        refused_status.last_schedule_time,
        Some(Time(at("2026-11-30T12:00:00Z")))
    );
    for (spec, cluster) in [
        (json!({"consistency": {"method": "Freeze"}}), None),
        (json!({}), Some(json!({"method": "CrashUnsafe"}))),
        (
            json!({"command": {"image": "pg", "command": ["dump"], "prefix": "dumps"}}),
            None,
        ),
    ] {
        let runs = due(spec.clone(), cluster);
        assert!(runs.create.is_some(), "{spec}");
    }
    let dump = due(
        json!({"command": {"image": "pg", "command": ["dump"], "prefix": "dumps"}}),
        None,
    );
    let (backup, _) = dump.create.unwrap();
    assert_eq!(backup.spec.command.unwrap().prefix, "dumps");
    assert!(backup.spec.consistency.is_none());
}

/// (Ready reason written, run created, runs pruned, Events, requeue seconds)
type Seen = (
    Option<String>,
    Option<String>,
    Vec<String>,
    Vec<String>,
    Option<u64>,
);

fn seen(plan: &Plan) -> Seen {
    (
        plan.status
            .as_ref()
            .and_then(|status| status.conditions.first())
            .map(|ready| ready.reason.clone()),
        plan.create.as_ref().map(|(backup, _)| backup.name_any()),
        plan.prune.iter().map(|prune| prune.name.clone()).collect(),
        plan.events.iter().map(|note| note.reason.clone()).collect(),
        plan.requeue.map(|after| after.as_secs()),
    )
}

fn seen_of(
    reason: &str,
    create: Option<&str>,
    prune: &[&str],
    events: &[&str],
    requeue: Option<u64>,
) -> Seen {
    (
        Some(reason.to_string()),
        create.map(str::to_string),
        prune.iter().map(|name| name.to_string()).collect(),
        events.iter().map(|reason| reason.to_string()).collect(),
        requeue,
    )
}

#[test]
fn every_path_of_a_reconciliation() {
    let slot = "2026-11-30T11:00:00Z";
    let run_name = decide::run_name("hourly", at(slot), &decide::parse("0 * * * *").unwrap());
    let rows: Vec<(&str, Facts, Seen)> = vec![
        (
            "before the first slot: wait for it",
            facts(plan(json!({}), None), "2026-11-30T10:59:30Z", vec![]),
            seen_of(reasons::SCHEDULED, None, &[], &[], Some(30)),
        ),
        (
            "the slot is due: its run is created",
            facts(plan(json!({}), None), "2026-11-30T11:00:05Z", vec![]),
            seen_of(reasons::SCHEDULED, Some(&run_name), &[], &[], Some(3595)),
        ),
        (
            "the previous run is still active: skipped (Forbid)",
            facts(
                plan(json!({}), Some("2026-11-30T10:00:00Z")),
                "2026-11-30T11:00:05Z",
                vec![run("earlier", "Running", "2026-11-30T10:00:01Z")],
            ),
            seen_of(
                reasons::SCHEDULED,
                None,
                &[],
                &[reasons::PREVIOUS_RUN_ACTIVE],
                Some(3595),
            ),
        ),
        (
            "Allow runs beside an active one",
            facts(
                plan(
                    json!({"concurrencyPolicy": "Allow"}),
                    Some("2026-11-30T10:00:00Z"),
                ),
                "2026-11-30T11:00:05Z",
                vec![run("earlier", "Running", "2026-11-30T10:00:01Z")],
            ),
            seen_of(reasons::SCHEDULED, Some(&run_name), &[], &[], Some(3595)),
        ),
        (
            "past its starting deadline: skipped, with a Warning",
            facts(
                plan(json!({"startingDeadlineSeconds": 10}), None),
                "2026-11-30T11:00:30Z",
                vec![],
            ),
            seen_of(
                reasons::SCHEDULED,
                None,
                &[],
                &[reasons::MISSED_SCHEDULE],
                Some(3570),
            ),
        ),
        (
            "suspended: nothing is created",
            facts(
                plan(json!({"suspend": true}), None),
                "2026-11-30T11:00:05Z",
                vec![],
            ),
            seen_of(reasons::SUSPENDED, None, &[], &[], None),
        ),
        (
            "a schedule that cannot be read",
            facts(
                plan(json!({"schedule": "every hour"}), None),
                "2026-11-30T11:00:05Z",
                vec![],
            ),
            seen_of(
                reasons::INVALID_SCHEDULE,
                None,
                &[],
                &[reasons::INVALID_SCHEDULE],
                None,
            ),
        ),
        (
            "a retention age that cannot be read",
            facts(
                plan(json!({"retention": {"maxAge": "a while"}}), None),
                "2026-11-30T11:00:05Z",
                vec![],
            ),
            seen_of(reasons::INVALID_RETENTION, None, &[], &[], None),
        ),
        (
            "retention prunes the older finished run, never the newest completed one",
            facts(
                plan(
                    json!({"retention": {"keepLast": 1}}),
                    Some("2026-11-30T11:00:00Z"),
                ),
                "2026-11-30T11:30:00Z",
                vec![
                    run("older", "Completed", "2026-11-30T09:00:00Z"),
                    run("newer", "Completed", "2026-11-30T10:00:00Z"),
                ],
            ),
            seen_of(reasons::SCHEDULED, None, &["older"], &[], Some(1800)),
        ),
    ];
    for (name, facts, expected) in rows {
        let plan = super::plan(&facts).expect(name);
        assert_eq!(seen(&plan), expected, "{name}");
    }
}

#[test]
fn the_slot_records_its_time_and_run() {
    let plan = super::plan(&facts(
        plan(json!({}), None),
        "2026-11-30T11:00:05Z",
        vec![],
    ))
    .unwrap();
    let status = plan.status.unwrap();
    assert_eq!(
        status.last_schedule_time,
        Some(Time(at("2026-11-30T11:00:00Z")))
    );
    let (backup, note) = plan.create.unwrap();
    assert_eq!(status.last_backup_name, Some(backup.name_any()));
    assert_eq!(backup.labels()[LABEL_PLAN_UID], "plan-uid");
    assert_eq!(backup.spec.cluster_ref.name, "orders");
    assert_eq!(
        backup.spec.consistency, None,
        "the Cluster's, when the plan names none"
    );
    assert_eq!(note.reason, reasons::SCHEDULED);
}

#[test]
fn a_run_copies_the_way_the_plan_says() {
    let plan = super::plan(&facts(
        plan(
            json!({"consistency": {"method": "Freeze", "maxFreezeSeconds": 20}}),
            None,
        ),
        "2026-11-30T11:00:05Z",
        vec![],
    ))
    .unwrap();
    let (backup, _) = plan.create.unwrap();
    let consistency = backup.spec.consistency.unwrap();
    assert_eq!(
        consistency.method,
        custody_kube::api::ConsistencyMethod::Freeze
    );
    assert_eq!(consistency.max_freeze_seconds, Some(20));
}

#[test]
fn an_unchanged_wait_writes_nothing() {
    let first = super::plan(&facts(
        plan(json!({}), None),
        "2026-11-30T10:59:30Z",
        vec![],
    ))
    .unwrap();
    let mut again = plan(json!({}), None);
    again.status = first.status;
    let second = super::plan(&facts(again, "2026-11-30T10:59:40Z", vec![])).unwrap();
    assert!(second.status.is_none());
}
