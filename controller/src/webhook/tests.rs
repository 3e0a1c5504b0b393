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
                progress_deadline_seconds: None,
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
        (
            "Cluster being deleted after its restore completed: nothing to guard",
            Some((&restoring, true)),
            Some(restore(true, Some(RestorePhase::Completed))),
            Some(Admission::Allow),
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

#[test]
fn a_pod_without_the_label_is_held_or_refused_by_the_claims_it_mounts() {
    let restoring = cluster(true);
    let claim = |restore: Option<RestoreFacts<'static>>, deleting: bool| ClaimUnderRestore {
        claim: "data-db-0",
        cluster: &restoring,
        deleting,
        restore,
    };
    let inject = Admission::Inject {
        restore_name: "db".into(),
        restore_uid: "r-1".into(),
    };
    let running = || Some(restore(true, Some(RestorePhase::Running)));
    let completed = || Some(restore(true, Some(RestorePhase::Completed)));
    // (case, pod name, its owner, claims under restore, expected; None: refused)
    type Row<'a> = (
        &'a str,
        &'a str,
        PodOwner<'a>,
        Vec<ClaimUnderRestore<'a>>,
        Option<Admission>,
    );
    let rows: Vec<Row> = vec![
        (
            "mounts no claim under restore",
            "web-0",
            PodOwner::Other,
            vec![],
            Some(Admission::Allow),
        ),
        (
            "the StatefulSet's own pod: held",
            "db-0",
            PodOwner::StatefulSet("db"),
            vec![claim(running(), false)],
            Some(inject.clone()),
        ),
        (
            "the StatefulSet's own pod, restore failed: still held",
            "db-0",
            PodOwner::StatefulSet("db"),
            vec![claim(
                Some(restore(true, Some(RestorePhase::Failed))),
                false,
            )],
            Some(inject.clone()),
        ),
        (
            "the StatefulSet's own pod, restore completed",
            "db-0",
            PodOwner::StatefulSet("db"),
            vec![claim(completed(), false)],
            Some(Admission::Allow),
        ),
        (
            "the StatefulSet's own pod before the Restore exists",
            "db-0",
            PodOwner::StatefulSet("db"),
            vec![claim(None, false)],
            None,
        ),
        (
            "the StatefulSet's own pod, Cluster being deleted",
            "db-0",
            PodOwner::StatefulSet("db"),
            vec![claim(running(), true)],
            None,
        ),
        (
            "the StatefulSet's own pod, someone else's Restore",
            "db-0",
            PodOwner::StatefulSet("db"),
            vec![claim(
                Some(restore(false, Some(RestorePhase::Running))),
                false,
            )],
            None,
        ),
        (
            "a pod of no controller mounting the claim",
            "debug",
            PodOwner::Other,
            vec![claim(running(), false)],
            None,
        ),
        (
            "a Deployment's pod mounting the claim",
            "reader-7d9f-x2",
            PodOwner::Other,
            vec![claim(running(), false)],
            None,
        ),
        (
            "another StatefulSet's pod mounting the claim",
            "db-0",
            PodOwner::StatefulSet("other"),
            vec![claim(running(), false)],
            None,
        ),
        (
            "a pod named like the StatefulSet's but not one of its ordinals",
            "db-backup",
            PodOwner::StatefulSet("db"),
            vec![claim(running(), false)],
            None,
        ),
        (
            "the restore's own prepareData pod writes the claim",
            "data-db-0-restore-r-1-1-x",
            PodOwner::RestoreJob("r-1"),
            vec![claim(running(), false)],
            Some(Admission::Allow),
        ),
        (
            "another Restore's Job pod",
            "data-db-0-restore-r-2-1-x",
            PodOwner::RestoreJob("r-2"),
            vec![claim(running(), false)],
            None,
        ),
        (
            "a Job pod of a Restore the Cluster does not control",
            "data-db-0-restore-r-1-1-x",
            PodOwner::RestoreJob("r-1"),
            vec![claim(
                Some(restore(false, Some(RestorePhase::Running))),
                false,
            )],
            None,
        ),
        (
            "a foreign pod once the restore completed",
            "debug",
            PodOwner::Other,
            vec![claim(completed(), false)],
            Some(Admission::Allow),
        ),
    ];
    for (case, pod, owner, found, expected) in rows {
        let (decision, cluster) = admit_by_claims(pod, owner, &found);
        match expected {
            Some(expected) => assert_eq!(decision, expected, "{case}"),
            None => {
                let Admission::Deny(message) = &decision else {
                    panic!("{case}: {decision:?}");
                };
                assert!(!message.is_empty(), "{case}");
            }
        }
        assert_eq!(
            cluster.is_some(),
            decision != Admission::Allow,
            "{case}: the Cluster is named exactly when the pod is held or refused"
        );
    }
    let (Admission::Deny(message), _) =
        admit_by_claims("debug", PodOwner::Other, &[claim(running(), false)])
    else {
        panic!("admitted");
    };
    for needed in [
        "pod debug",
        "claim data-db-0",
        "Cluster db",
        "Backup nightly",
        "StatefulSet db",
        "Restore db",
    ] {
        assert!(message.contains(needed), "{needed}: {message}");
    }
}

#[test]
fn the_stricter_of_the_labels_and_the_claims_decision_stands() {
    let allow = Admission::Allow;
    let inject = Admission::Inject {
        restore_name: "db".into(),
        restore_uid: "r-1".into(),
    };
    let deny = Admission::Deny("no".into());
    let rows = [
        ("nothing either way", &allow, &allow, Stricter::Label),
        ("held by its label", &inject, &allow, Stricter::Label),
        ("refused by its label", &deny, &allow, Stricter::Label),
        (
            "labelled with a Cluster without restore, mounting a claim under another's restore",
            &allow,
            &deny,
            Stricter::Claims,
        ),
        (
            "held by its label, mounting another restore's claim",
            &inject,
            &deny,
            Stricter::Claims,
        ),
        (
            "admitted by its label, held by its claims",
            &allow,
            &inject,
            Stricter::Claims,
        ),
        (
            "held both ways: its label's hold",
            &inject,
            &inject,
            Stricter::Label,
        ),
        (
            "refused both ways: its label's reason",
            &deny,
            &deny,
            Stricter::Label,
        ),
        (
            "refused by its label, held by its claims",
            &deny,
            &inject,
            Stricter::Label,
        ),
    ];
    for (case, label, claims, expected) in rows {
        assert_eq!(stricter(label, claims), expected, "{case}");
    }
}
