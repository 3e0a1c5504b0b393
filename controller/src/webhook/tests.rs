use super::*;
use custody_kube::api::{
    ClusterRestoreSpec, ClusterSpec, LocalObjectReference, VolumeRestorePolicy,
};

fn cluster(restore: bool) -> Cluster {
    Cluster::new(
        "db",
        ClusterSpec {
            stateful_set_ref: LocalObjectReference { name: "db".into() },
            volume_claim_templates: vec!["data".into()],
            repository_ref: None,
            restore: restore.then(|| ClusterRestoreSpec {
                backup_ref: LocalObjectReference {
                    name: "nightly".into(),
                },
                volume_restore_policy: VolumeRestorePolicy::Parallel,
            }),
            consistency: None,
        },
    )
}

fn restore(owned: bool, phase: Option<RestorePhase>) -> RestoreFacts<'static> {
    RestoreFacts {
        name: "db",
        uid: "r-1",
        owned,
        phase,
    }
}

#[test]
fn admission_decisions() {
    let inject = Admission::Inject {
        restore_name: "db".into(),
        restore_uid: "r-1".into(),
    };
    let plain = cluster(false);
    let restoring = cluster(true);
    type Row<'a> = (
        &'a str,
        Option<(&'a Cluster, bool)>,
        Option<RestoreFacts<'a>>,
        Option<Admission>,
    );
    let rows: Vec<Row> = vec![
        (
            "no such Cluster (a typo, or the StatefulSet applied first): refused",
            None,
            None,
            None,
        ),
        (
            "Cluster without restore",
            Some((&plain, false)),
            None,
            Some(Admission::Allow),
        ),
        (
            "restore not created yet: refused, never unguarded",
            Some((&restoring, false)),
            None,
            None,
        ),
        (
            "restore pending",
            Some((&restoring, false)),
            Some(restore(true, None)),
            Some(inject.clone()),
        ),
        (
            "restore running",
            Some((&restoring, false)),
            Some(restore(true, Some(RestorePhase::Running))),
            Some(inject.clone()),
        ),
        (
            "restore failed: still gated",
            Some((&restoring, false)),
            Some(restore(true, Some(RestorePhase::Failed))),
            Some(inject.clone()),
        ),
        (
            "restore completed: nothing to guard",
            Some((&restoring, false)),
            Some(restore(true, Some(RestorePhase::Completed))),
            Some(Admission::Allow),
        ),
        (
            "someone else's Restore of that name",
            Some((&restoring, false)),
            Some(restore(false, Some(RestorePhase::Completed))),
            None,
        ),
        (
            "Cluster being deleted",
            Some((&restoring, true)),
            Some(restore(true, Some(RestorePhase::Running))),
            None,
        ),
    ];
    for (name, cluster, restore, expected) in rows {
        let decision = admit("db", cluster, restore, false);
        match expected {
            Some(expected) => assert_eq!(decision, expected, "{name}"),
            None => assert!(
                matches!(decision, Admission::Deny(_)),
                "{name}: {decision:?}"
            ),
        }
    }
}

#[test]
fn a_pod_of_a_deleted_cluster_is_admitted_only_on_claims_known_to_hold_data() {
    assert_eq!(admit("db", None, None, true), Admission::Allow);
    let Admission::Deny(message) = admit("db", None, None, false) else {
        panic!("admitted");
    };
    assert!(message.contains("Cluster db does not exist"), "{message}");
    assert!(message.contains("custody.io/cluster=db"), "{message}");
    // Known data changes nothing for a Cluster that exists: its restore decides.
    let restoring = cluster(true);
    assert!(matches!(
        admit("db", Some((&restoring, false)), None, true),
        Admission::Deny(_)
    ));
}
