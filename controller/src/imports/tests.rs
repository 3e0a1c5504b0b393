use super::*;
use custody_repository::snapshot::{ManifestMeta, ObjectRef, VolumeMeta};

const A: &str = "aaaaaaaa11111111111111111111111111111111111111111111111111111111";
const B: &str = "bbbbbbbb22222222222222222222222222222222222222222222222222222222";

fn meta(backup: &str, uid: &str) -> SnapshotMeta {
    SnapshotMeta {
        custody_snapshot: custody_repository::snapshot::FORMAT_VERSION,
        origin_cluster: "origin".into(),
        backup: ObjectRef {
            namespace: "shop".into(),
            name: backup.into(),
            uid: uid.into(),
        },
        cluster: ObjectRef {
            namespace: "shop".into(),
            name: "orders".into(),
            uid: "cluster-uid".into(),
        },
        consistency: "Frozen".into(),
        started_at: "2026-12-01T10:00:00Z".into(),
        completed_at: Some("2026-12-01T10:01:00Z".into()),
        volumes: vec![VolumeMeta {
            name: "data".into(),
            claim: "data-orders-0".into(),
            manifest: Some(ManifestMeta {
                blake3: "f".repeat(64),
                entries: 3,
                files: 2,
                total_bytes: 4096,
            }),
        }],
    }
}

fn listed(id: &str, meta: Result<SnapshotMeta, Unusable>) -> Listed {
    Listed {
        id: id.into(),
        meta,
    }
}

fn backup(name: &str, uid: &str, snapshot: Option<&str>, imported: Option<&str>) -> Backup {
    let mut backup: Backup = serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name, "namespace": "dr", "uid": uid},
        "spec": {"clusterRef": {"name": "orders"}},
    }))
    .unwrap();
    backup.spec.imported_snapshot = imported.map(str::to_string);
    if let Some(id) = snapshot {
        backup.status = Some(BackupStatus {
            artifact: Some(Artifact {
                snapshot: Some(SnapshotRef {
                    id: Some(id.into()),
                    ..SnapshotRef::default()
                }),
                ..Artifact::default()
            }),
            ..BackupStatus::default()
        });
    }
    backup
}

fn names(create: &[ToImport]) -> Vec<(&str, &str)> {
    create
        .iter()
        .map(|item| (item.name.as_str(), item.snapshot.as_str()))
        .collect()
}

#[test]
fn snapshots_are_imported_once_and_never_over_a_backup_here() {
    let orders = meta("orders-nightly", "uid-1");
    // (case, the snapshots listed, the Backups here, the imports wanted, how many refused)
    type Case<'a> = (
        &'a str,
        Vec<Listed>,
        Vec<Backup>,
        Vec<(&'a str, &'a str)>,
        usize,
    );
    let cases: Vec<Case> = vec![
        (
            "a fresh namespace imports every finished custody snapshot",
            vec![
                listed(A, Ok(orders.clone())),
                listed(B, Ok(meta("other", "uid-2"))),
            ],
            vec![],
            vec![("orders-nightly-aaaaaaaa", A), ("other-bbbbbbbb", B)],
            0,
        ),
        (
            "a snapshot a Backup here records (written or imported) is not imported again",
            vec![
                listed(A, Ok(orders.clone())),
                listed(B, Ok(meta("other", "uid-2"))),
            ],
            vec![
                backup("x", "u-x", Some(A), None),
                backup("y", "u-y", None, Some(B)),
            ],
            vec![],
            0,
        ),
        (
            "a snapshot written by a Backup here (its ID not yet recorded) is that Backup's",
            vec![listed(A, Ok(orders.clone()))],
            vec![backup("orders-nightly", "uid-1", None, None)],
            vec![],
            0,
        ),
        (
            "a name already taken: the whole snapshot ID names it",
            vec![listed(A, Ok(orders.clone()))],
            vec![backup("orders-nightly-aaaaaaaa", "u-z", None, None)],
            vec![(
                "snapshot-aaaaaaaa1111111111111111111111111111111111111111111111",
                A,
            )],
            0,
        ),
        (
            "a snapshot that does not open is refused and said so; one not custody's is skipped",
            vec![
                listed(A, Err(Unusable::Sealed("MAC mismatch".into()))),
                listed(
                    B,
                    Err(Unusable::Record(
                        custody_repository::snapshot::MetaError::Missing,
                    )),
                ),
            ],
            vec![],
            vec![],
            1,
        ),
    ];
    for (what, listed, backups, wanted, refusals) in cases {
        let (create, refused) = to_import(&listed, &Here::of(&backups));
        assert_eq!(names(&create), wanted, "{what}");
        assert_eq!(refused.len(), refusals, "{what}");
        for item in &create {
            assert_eq!(item.cluster, "orders", "{what}");
        }
    }
}

#[test]
fn import_names_are_valid_object_names() {
    let cases = [
        ("orders-nightly", "orders-nightly-aaaaaaaa"),
        ("UPPER", "snapshot-aaaaaaaa"),
        (
            "a-very-long-backup-name-that-goes-on-and-on-and-on-and-on-and-on",
            "a-very-long-backup-name-that-goes-on-and-on-and-on-and-aaaaaaaa",
        ),
        ("trailing-", "trailing-aaaaaaaa"),
    ];
    for (backup, wanted) in cases {
        let name = import_name(&meta(backup, "u"), A);
        assert_eq!(name, wanted, "{backup}");
        assert!(name.len() <= 63, "{name}");
    }
}

#[test]
fn an_imported_status_caches_the_snapshot_record() {
    let repository: BackupRepository = serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
        "metadata": {"name": "store", "namespace": "dr"},
        "spec": {"endpoint": "http://s3", "bucket": "b", "credentialsSecretRef": {"name": "s3"}},
    }))
    .unwrap();
    let encrypted = EncryptedRepository {
        id: "r".repeat(64),
        prefix: "p/custody_repository".into(),
        keys: Vec::new(),
        master_key_secret: "store-master-key".into(),
        key_secret_version: "1".into(),
    };
    let status = imported_status(A, &meta("orders-nightly", "uid-1"), &repository, &encrypted)
        .expect("a finished record");
    assert_eq!(status.phase, Some(BackupPhase::Completed));
    assert_eq!(status.consistency, Some(Capture::Frozen));
    let artifact = status.artifact.unwrap();
    assert_eq!(
        artifact.manifest_hash.as_deref(),
        Some("f".repeat(64).as_str())
    );
    assert_eq!(artifact.prefix, "p/custody_repository");
    assert_eq!(artifact.bucket, "b");
    assert!(artifact.key.is_empty() && artifact.manifest_key.is_empty());
    let snapshot = artifact.snapshot.unwrap();
    assert_eq!(snapshot.id.as_deref(), Some(A));
    assert_eq!(snapshot.repository_id, "r".repeat(64));
    assert_eq!(snapshot.origin_cluster, "origin");
    assert_eq!(snapshot.volumes, ["data"]);
    assert_eq!(snapshot.written_by.unwrap().uid, "uid-1");

    let mut unfinished = meta("orders-nightly", "uid-1");
    unfinished.completed_at = None;
    assert!(imported_status(A, &unfinished, &repository, &encrypted).is_err());
    let mut odd = meta("orders-nightly", "uid-1");
    odd.consistency = "Sideways".into();
    assert!(imported_status(A, &odd, &repository, &encrypted).is_err());
    let mut empty = meta("orders-nightly", "uid-1");
    empty.volumes.clear();
    assert!(imported_status(A, &empty, &repository, &encrypted).is_err());
}

#[test]
fn a_restore_of_an_imported_backup_expects_the_writer_uid() {
    let mut imported = backup("view", "view-uid", None, Some(A));
    assert_eq!(imported.writer_uid(), "view-uid");
    imported.status = Some(BackupStatus {
        artifact: Some(Artifact {
            snapshot: Some(SnapshotRef {
                written_by: Some(WrittenBy {
                    uid: "original-uid".into(),
                    ..WrittenBy::default()
                }),
                ..SnapshotRef::default()
            }),
            ..Artifact::default()
        }),
        ..BackupStatus::default()
    });
    assert_eq!(imported.writer_uid(), "original-uid");
}
