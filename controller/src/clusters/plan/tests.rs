//! Every path a reconciliation of a Cluster takes, as rows: the facts it read, and what the
//! plan does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;

const UID: &str = "c1c1c1c1-0000-4000-8000-000000000001";

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

fn cluster(restore: bool, finalizer: bool) -> Cluster {
    let mut spec = json!({"statefulSetRef": {"name": "db"}, "volumeClaimTemplates": ["data"]});
    if restore {
        spec["restore"] = json!({"backupRef": {"name": "nightly"}});
    }
    let finalizers: Vec<&str> = if finalizer { vec![FINALIZER] } else { vec![] };
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "orders", "namespace": "ns", "uid": UID, "generation": 1,
            "finalizers": finalizers},
        "spec": spec,
    }))
    .unwrap()
}

/// The Restore of the Cluster's name; `owner` is the UID of its controller.
fn restore(owner: &str, phase: Option<&str>) -> Restore {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Restore",
        "metadata": {"name": "orders", "namespace": "ns", "uid": "restore-uid",
            "ownerReferences": [{"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
                "name": "orders", "uid": owner, "controller": true}]},
        "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "nightly"}},
        "status": {"phase": phase},
    }))
    .unwrap()
}

fn facts(cluster: Cluster, restore: Option<Restore>, workload: Workload) -> Facts {
    Facts {
        cluster,
        now: now(),
        restore,
        workload,
    }
}

fn deleted(mut cluster: Cluster) -> Cluster {
    cluster.metadata.deletion_timestamp = Some(Time(now()));
    cluster
}

const READY: Workload = Workload::Replicas {
    wanted: 1,
    ready: 1,
};
const NOT_READY: Workload = Workload::Replicas {
    wanted: 1,
    ready: 0,
};

/// (finalizer added, Restore created, Restore deleted, finalizer removed, phase written,
/// Events, requeue seconds)
type Seen = (
    bool,
    bool,
    bool,
    bool,
    Option<ClusterPhase>,
    Vec<String>,
    Option<u64>,
);

fn seen(plan: &Plan) -> Seen {
    (
        plan.add_finalizer,
        plan.create_restore.is_some(),
        plan.delete_restore.is_some(),
        plan.remove_finalizer,
        plan.status.as_ref().and_then(|status| status.phase),
        plan.events.iter().map(|note| note.reason.clone()).collect(),
        plan.requeue.map(|after| after.as_secs()),
    )
}

#[test]
fn every_path_of_a_reconciliation() {
    use ClusterPhase::*;
    let none = Vec::<String>::new;
    let rows: Vec<(&str, Facts, Seen)> = vec![
        (
            "a Cluster without restore follows its workload",
            facts(cluster(false, false), None, READY),
            (false, false, false, false, Some(Running), none(), Some(300)),
        ),
        (
            "no StatefulSet yet",
            facts(cluster(false, false), None, Workload::Missing),
            (false, false, false, false, Some(Pending), none(), Some(10)),
        ),
        (
            "under restore: the finalizer first, nothing else",
            facts(cluster(true, false), None, NOT_READY),
            (true, false, false, false, None, none(), None),
        ),
        (
            "then its Restore",
            facts(cluster(true, true), None, NOT_READY),
            (false, true, false, false, Some(Restoring), none(), Some(10)),
        ),
        (
            "its Restore runs",
            facts(
                cluster(true, true),
                Some(restore(UID, Some("Running"))),
                NOT_READY,
            ),
            (
                false,
                false,
                false,
                false,
                Some(Restoring),
                none(),
                Some(10),
            ),
        ),
        (
            "completed but the workload is not ready: still restoring",
            facts(
                cluster(true, true),
                Some(restore(UID, Some("Completed"))),
                NOT_READY,
            ),
            (
                false,
                false,
                false,
                false,
                Some(Restoring),
                none(),
                Some(10),
            ),
        ),
        (
            "completed and ready: Running, said once",
            facts(
                cluster(true, true),
                Some(restore(UID, Some("Completed"))),
                READY,
            ),
            (
                false,
                false,
                false,
                false,
                Some(Running),
                vec!["Running".into()],
                Some(300),
            ),
        ),
        (
            "its Restore failed: Failed, with a Warning",
            facts(
                cluster(true, true),
                Some(restore(UID, Some("Failed"))),
                NOT_READY,
            ),
            (
                false,
                false,
                false,
                false,
                Some(Failed),
                vec![decide::reasons::RESTORE_FAILED.into()],
                Some(300),
            ),
        ),
        (
            "a Restore of its name that it did not create: never used",
            facts(
                cluster(true, true),
                Some(restore("someone", Some("Completed"))),
                READY,
            ),
            (
                false,
                false,
                false,
                false,
                Some(Failed),
                vec![decide::reasons::RESTORE_NAME_TAKEN.into()],
                Some(300),
            ),
        ),
        (
            "deleted: its own Restore is deleted",
            facts(
                deleted(cluster(true, true)),
                Some(restore(UID, None)),
                READY,
            ),
            (
                false,
                false,
                true,
                false,
                None,
                vec!["RestoreCancelled".into()],
                Some(2),
            ),
        ),
        (
            "deleted: its Restore is going, wait",
            facts(
                deleted(cluster(true, true)),
                Some({
                    let mut going = restore(UID, None);
                    going.metadata.deletion_timestamp = Some(Time(now()));
                    going
                }),
                READY,
            ),
            (false, false, false, false, None, none(), Some(2)),
        ),
        (
            "deleted: someone else's Restore is left alone, the finalizer goes",
            facts(
                deleted(cluster(true, true)),
                Some(restore("someone", None)),
                READY,
            ),
            (false, false, false, true, None, none(), None),
        ),
        (
            "deleted and the Restore is gone: the finalizer goes",
            facts(deleted(cluster(true, true)), None, READY),
            (false, false, false, true, None, none(), None),
        ),
        (
            "deleted without the finalizer: not ours",
            facts(
                deleted(cluster(true, false)),
                Some(restore(UID, None)),
                READY,
            ),
            (false, false, false, false, None, none(), None),
        ),
    ];
    for (name, facts, expected) in rows {
        assert_eq!(seen(&plan(&facts)), expected, "{name}");
    }
}

#[test]
fn the_restore_is_owned_and_labelled() {
    let plan = plan(&facts(cluster(true, true), None, NOT_READY));
    let (restore, note) = plan.create_restore.unwrap();
    let owner = &restore.metadata.owner_references.unwrap()[0];
    assert_eq!((owner.uid.as_str(), owner.controller), (UID, Some(true)));
    assert_eq!(owner.block_owner_deletion, Some(true));
    assert_eq!(
        restore.metadata.labels.unwrap()[crate::backups::decide::LABEL_CLUSTER_UID],
        UID
    );
    assert_eq!(restore.spec.backup_ref.name, "nightly");
    assert_eq!(note.reason, decide::reasons::RESTORE_CREATED);
}

#[test]
fn an_unchanged_view_writes_and_says_nothing() {
    let first = plan(&facts(
        cluster(true, true),
        Some(restore(UID, Some("Completed"))),
        READY,
    ));
    let mut again = cluster(true, true);
    again.status = first.status;
    let second = plan(&facts(again, Some(restore(UID, Some("Completed"))), READY));
    assert!(second.status.is_none());
    assert!(second.events.is_empty());
}

#[test]
fn the_teardown_deletes_exactly_the_restore_it_read() {
    let plan = plan(&facts(
        deleted(cluster(true, true)),
        Some(restore(UID, None)),
        READY,
    ));
    assert_eq!(plan.delete_restore.as_deref(), Some("restore-uid"));
}
