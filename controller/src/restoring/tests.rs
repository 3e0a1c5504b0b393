use super::*;
use custody_kube::api::{
    ClusterRestoreSpec, ClusterSpec, LocalObjectReference, RestoreSpec, RestoreStatus,
    VolumeRestorePolicy,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

#[test]
fn a_mark_comes_off_only_with_no_restore_left_and_after_the_grace_period() {
    let grace = Duration::from_secs(60);
    let rows: Vec<(&str, bool, Option<Timestamp>, Timestamp, Settle)> = vec![
        (
            "a restore in progress keeps it",
            true,
            Some(at(0)),
            at(1000),
            Settle::Keep,
        ),
        (
            "a restore in progress keeps it, without a time",
            true,
            None,
            at(1000),
            Settle::Keep,
        ),
        (
            "marked 10 s ago: a Cluster may be being admitted under it",
            false,
            Some(at(990)),
            at(1000),
            Settle::LookAgain(Duration::from_secs(50)),
        ),
        (
            "marked just now",
            false,
            Some(at(1000)),
            at(1000),
            Settle::LookAgain(grace),
        ),
        (
            "marked exactly the grace period ago",
            false,
            Some(at(940)),
            at(1000),
            Settle::Unmark,
        ),
        (
            "marked long ago",
            false,
            Some(at(0)),
            at(1000),
            Settle::Unmark,
        ),
        (
            "a mark from the future (a skewed clock) waits for the grace period",
            false,
            Some(at(2000)),
            at(1000),
            Settle::LookAgain(grace),
        ),
        (
            "no readable time: nothing relies on it",
            false,
            None,
            at(1000),
            Settle::Unmark,
        ),
    ];
    for (case, in_progress, marked, now, expected) in rows {
        assert_eq!(settle(in_progress, marked, now, grace), expected, "{case}");
    }
}

fn cluster(restore: bool) -> Cluster {
    let mut cluster = Cluster::new(
        "shop",
        ClusterSpec {
            stateful_set_ref: LocalObjectReference { name: "db".into() },
            volume_claim_templates: vec!["data".into()],
            repository_ref: None,
            restore: restore.then(|| ClusterRestoreSpec {
                backup_ref: LocalObjectReference {
                    name: "nightly".into(),
                },
                volume_restore_policy: VolumeRestorePolicy::Parallel,
                progress_deadline_seconds: None,
            }),
            consistency: None,
        },
    );
    cluster.metadata.uid = Some("c-1".into());
    cluster
}

fn restore(name: &str, owner_uid: Option<&str>, phase: Option<RestorePhase>) -> Restore {
    let mut restore = Restore::new(
        name,
        RestoreSpec {
            cluster_ref: LocalObjectReference {
                name: "shop".into(),
            },
            backup_ref: LocalObjectReference {
                name: "nightly".into(),
            },
            volume_restore_policy: VolumeRestorePolicy::Parallel,
            progress_deadline_seconds: None,
        },
    );
    restore.metadata.owner_references = owner_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "custody.io/v1alpha1".into(),
            kind: "Cluster".into(),
            name: "shop".into(),
            uid: uid.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]
    });
    restore.status = Some(RestoreStatus {
        phase,
        ..RestoreStatus::default()
    });
    restore
}

#[test]
fn a_cluster_is_restoring_until_its_own_restore_completed() {
    let done = Some(RestorePhase::Completed);
    let rows: Vec<(&str, Cluster, Vec<Restore>, bool)> = vec![
        ("no restore asked", cluster(false), vec![], false),
        ("its Restore not created yet", cluster(true), vec![], true),
        (
            "its Restore running",
            cluster(true),
            vec![restore("shop", Some("c-1"), Some(RestorePhase::Running))],
            true,
        ),
        (
            "its Restore failed: its pods stay held",
            cluster(true),
            vec![restore("shop", Some("c-1"), Some(RestorePhase::Failed))],
            true,
        ),
        (
            "its Restore completed",
            cluster(true),
            vec![restore("shop", Some("c-1"), done)],
            false,
        ),
        (
            "a completed Restore of its name it does not control",
            cluster(true),
            vec![restore("shop", Some("other"), done)],
            true,
        ),
        (
            "a completed Restore without an owner",
            cluster(true),
            vec![restore("shop", None, done)],
            true,
        ),
        (
            "a completed Restore of another name",
            cluster(true),
            vec![restore("shop-2", Some("c-1"), done)],
            true,
        ),
    ];
    for (case, cluster, restores, expected) in rows {
        assert_eq!(restoring(&cluster, &restores), expected, "{case}");
    }
}

#[test]
fn the_claims_a_restore_writes_are_its_templates_for_its_statefulsets_ordinals() {
    let templates = vec!["data".to_string(), "wal".to_string()];
    let rows = [
        ("data-db-0", true),
        ("data-db-12", true),
        ("wal-db-3", true),
        ("data-db-", false),
        ("data-db-01", false),
        ("data-db-x", false),
        ("data-db-0-1", false),
        ("data-dbx-0", false),
        ("datadb-0", false),
        ("logs-db-0", false),
        ("data-other-0", false),
        ("data-db", false),
    ];
    for (claim, expected) in rows {
        assert_eq!(restores_claim(&templates, "db", claim), expected, "{claim}");
    }
    assert!(restores_claim(&["data".into()], "db-a", "data-db-a-0"));
    assert!(!restores_claim(&[], "db", "data-db-0"));
}
