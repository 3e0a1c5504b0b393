//! Encrypted repositories (format 2) through the real controller, API server, S3 server,
//! agent and mover: a BackupRepository opens (or creates) its repository with the passwords
//! of its key Secret, keeps its key files in step with that Secret and its master key for the
//! movers; Backups write snapshots there (only what changed), restores read them verified, and
//! deleting a Backup forgets exactly its own snapshot. restic reads what custody wrote.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use custody_kube::api::{
    Backup, BackupPhase, BackupRepository, HasConditions, Restore, RestorePhase,
};
use custody_tests::agent::ControllerProcess;
use custody_tests::pki::Pki;
use custody_tests::repository::{PASSWORD, restic_at};
use custody_tests::scenario::{
    Setup, artifact_of, create, encrypted_repository, restore_into, restore_into_from,
    setup_encrypted, setup_importing, small_database,
};
use custody_tests::volumes::{LoopVolume, tree};
use custody_tests::workloads::WorkloadRunner;
use custody_tests::{TestNamespace, await_condition, eventually, s3};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
const REPOSITORY: &str = "custody/custody_repository";

fn ready(repository: &BackupRepository) -> Option<(String, String)> {
    repository
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .map(|condition| (condition.status.clone(), condition.reason.clone()))
}

async fn repository_ready(namespace: &TestNamespace, name: &str) -> BackupRepository {
    await_condition(
        &namespace.api::<BackupRepository>(),
        name,
        "Ready with its repository open",
        TIMEOUT,
        |repository: &BackupRepository| {
            ready(repository).is_some_and(|(status, _)| status == "True")
                && repository
                    .status
                    .as_ref()
                    .is_some_and(|status| status.repository.is_some())
        },
    )
    .await
}

fn key_names(repository: &BackupRepository) -> Vec<String> {
    repository
        .status
        .as_ref()
        .and_then(|status| status.repository.as_ref())
        .map(|repository| repository.keys.iter().map(|key| key.name.clone()).collect())
        .unwrap_or_default()
}

async fn completed(namespace: &TestNamespace, name: &str) -> Backup {
    await_condition(
        &namespace.api::<Backup>(),
        name,
        "Completed",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed)
        },
    )
    .await
}

/// The snapshot files in the repository.
async fn snapshots(url: &str, bucket: &str) -> Vec<String> {
    s3::keys(url, bucket, &format!("{REPOSITORY}/snapshots/")).await
}

#[tokio::test]
async fn an_encrypted_backup_restores_verified_reads_only_changes_and_its_deletion_forgets_only_its_snapshot()
 {
    let setup = setup_encrypted("encrypted").await;
    let namespace = &setup.namespace;
    let url = s3::shared();
    let repository = repository_ready(namespace, "store").await;
    let bucket = repository.spec.bucket.clone();
    let opened = repository.status.clone().unwrap().repository.unwrap();
    assert_eq!(opened.prefix, REPOSITORY);
    assert_eq!(key_names(&repository), ["password"]);
    // The master key for the movers: custody's Secret, owned by the BackupRepository.
    let master = namespace
        .api::<Secret>()
        .get(&opened.master_key_secret)
        .await
        .unwrap();
    assert_eq!(master.owner_references()[0].kind, "BackupRepository");
    assert_eq!(
        master.owner_references()[0].uid,
        repository.metadata.uid.clone().unwrap()
    );

    // The scenario's Backup `nightly` is a snapshot, not an archive: nothing outside the
    // repository's prefix.
    let artifact = artifact_of(namespace, "nightly").await;
    let snapshot = artifact.snapshot.clone().expect("a snapshot was recorded");
    let first_id = snapshot.id.clone().expect("its ID");
    assert_eq!(snapshot.repository_id, opened.id);
    assert_eq!(artifact.key, "");
    let keys = s3::keys(url, &bucket, "").await;
    assert!(
        keys.iter()
            .all(|key| key.starts_with(&format!("{REPOSITORY}/"))),
        "{keys:?}"
    );
    assert_eq!(
        snapshots(url, &bucket).await,
        [format!("{REPOSITORY}/snapshots/{first_id}")]
    );

    // Restored into another Cluster, verified by the agent, the pod released.
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let (_workloads, restored) = restore_completed(&setup, target.path()).await;
    assert_eq!(restored, tree(setup.source.path()));

    // A second Backup of unchanged data names the first as its parent and adds little.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": "second"}, "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await;
    let second = completed(namespace, "second").await;
    let second_artifact = second.status.unwrap().artifact.unwrap();
    let second_id = second_artifact.snapshot.unwrap().id.unwrap();
    assert_ne!(second_id, first_id);
    let jobs: Api<Job> = namespace.api();
    let args = jobs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|job| job.name_any().starts_with("second-backup-"))
        .flat_map(|job| {
            job.spec.unwrap().template.spec.unwrap().containers[0]
                .args
                .clone()
                .unwrap()
        })
        .collect::<Vec<_>>();
    assert!(
        args.windows(2)
            .any(|pair| pair == ["--parent", first_id.as_str()]),
        "{args:?}"
    );
    let volume_bytes = setup_bytes(setup.source.path());
    assert!(
        second_artifact.size_bytes.unwrap_or(i64::MAX) * 100 < volume_bytes as i64 * 50,
        "uploaded {:?} of {volume_bytes}",
        second_artifact.size_bytes
    );

    // Deleting the first Backup forgets its snapshot only; the second stays whole.
    let packs_before = s3::keys(url, &bucket, &format!("{REPOSITORY}/data/")).await;
    namespace
        .api::<Backup>()
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the first snapshot forgotten", TIMEOUT, || async {
        let left = snapshots(url, &bucket).await;
        if left == [format!("{REPOSITORY}/snapshots/{second_id}")] {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    assert_eq!(
        s3::keys(url, &bucket, &format!("{REPOSITORY}/data/")).await,
        packs_before,
        "no pack is deleted by forgetting (a prune frees space)"
    );
    let check = restic_at(
        url,
        &bucket,
        REPOSITORY,
        PASSWORD,
        &["check", "--read-data"],
    );
    assert!(check.status.success(), "restic check --read-data failed");
    setup.finish().await;
}

fn setup_bytes(root: &std::path::Path) -> u64 {
    tree(root)
        .values()
        .map(|content| content.len() as u64)
        .sum()
}

#[tokio::test]
async fn passwords_rotate_through_the_key_secret_and_a_wrong_one_writes_nothing() {
    let namespace = TestNamespace::create("rotate").await;
    let url = s3::shared();
    let bucket = s3::bucket(url, "rotate").await;
    let pki = Pki::new(&["custody-controller"]);
    let _controller = ControllerProcess::start(&namespace.name, &pki, &[]);
    encrypted_repository(&namespace, url, &bucket).await;
    let repository = repository_ready(&namespace, "store").await;
    let keys_of = || async { s3::keys(url, &bucket, &format!("{REPOSITORY}/keys/")).await };
    assert_eq!(keys_of().await.len(), 1);

    // The new password added: it gets a key file and opens the repository.
    let secrets: Api<Secret> = namespace.api();
    let patch = |data: serde_json::Value| Patch::Merge(json!({ "stringData": data }));
    secrets
        .patch(
            "repository-keys",
            &PatchParams::default(),
            &patch(json!({"next": "a new password"})),
        )
        .await
        .unwrap();
    let rotated = await_condition(
        &namespace.api::<BackupRepository>(),
        "store",
        "both passwords have key files",
        TIMEOUT,
        |repository: &BackupRepository| key_names(repository) == ["next", "password"],
    )
    .await;
    assert_eq!(keys_of().await.len(), 2);
    assert!(
        restic_at(url, &bucket, REPOSITORY, "a new password", &["snapshots"])
            .status
            .success()
    );
    assert_eq!(
        rotated.status.unwrap().repository.unwrap().id,
        repository.status.clone().unwrap().repository.unwrap().id,
        "the same repository"
    );

    // The old password removed: its key file goes, the new one opens, the old no longer.
    secrets
        .patch(
            "repository-keys",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"password": null}})),
        )
        .await
        .unwrap();
    await_condition(
        &namespace.api::<BackupRepository>(),
        "store",
        "only the new password",
        TIMEOUT,
        |repository: &BackupRepository| key_names(repository) == ["next"],
    )
    .await;
    assert_eq!(keys_of().await.len(), 1);
    assert!(
        restic_at(url, &bucket, REPOSITORY, "a new password", &["snapshots"])
            .status
            .success()
    );
    assert!(
        !restic_at(url, &bucket, REPOSITORY, PASSWORD, &["snapshots"])
            .status
            .success()
    );

    // Another BackupRepository at the same place with a password of nobody's: refused, named,
    // and nothing written.
    let before = s3::keys(url, &bucket, "").await;
    create::<Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "wrong-keys"}, "stringData": {"guess": "not a password of it"}}),
    )
    .await;
    create::<BackupRepository>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
               "metadata": {"name": "intruder"},
               "spec": {"endpoint": url, "bucket": bucket, "prefix": "custody", "forcePathStyle": true,
                        "credentialsSecretRef": {"name": "s3"},
                        "encryption": {"keySecretRef": {"name": "wrong-keys"}}}}),
    )
    .await;
    let refused = await_condition(
        &namespace.api::<BackupRepository>(),
        "intruder",
        "KeyRejected",
        TIMEOUT,
        |repository: &BackupRepository| {
            ready(repository) == Some(("False".into(), "KeyRejected".into()))
        },
    )
    .await;
    let message = refused
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("wrong-keys") && message.contains("nothing was read or written"),
        "{message}"
    );
    assert_eq!(
        s3::keys(url, &bucket, "").await,
        before,
        "nothing was written"
    );
    namespace.delete().await;
}

/// Once the pods of the scenario's restored Cluster `shop` run (started here, kept by the
/// caller) and its Restore completed: the restored volume at `target`, custody's own files
/// left out.
async fn restore_completed(
    setup: &Setup,
    target: &Path,
) -> (WorkloadRunner, BTreeMap<String, Vec<u8>>) {
    let namespace = &setup.namespace;
    let workloads =
        WorkloadRunner::start(&namespace.client, &namespace.name, setup.kubelet.clone());
    await_condition(
        &namespace.api::<Restore>(),
        "shop",
        "Completed",
        TIMEOUT,
        |restore: &Restore| {
            restore.status.as_ref().and_then(|status| status.phase) == Some(RestorePhase::Completed)
        },
    )
    .await;
    let mut restored = tree(target);
    restored.retain(|path, _| !path.starts_with(".custody"));
    (workloads, restored)
}

/// Waits until Backup `name` no longer exists.
async fn gone(backups: &Api<Backup>, name: &str) {
    eventually(&format!("Backup {name} gone"), TIMEOUT, || {
        let backups = backups.clone();
        async move {
            match backups.get_opt(name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
}

fn reason_of(backup: &Backup) -> Option<String> {
    backup
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .map(|condition| condition.reason.clone())
}

/// An imported Backup the test creates by hand, naming `snapshot`.
fn imported_backup(name: &str, snapshot: &str, policy: &str) -> serde_json::Value {
    json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name},
        "spec": {"clusterRef": {"name": "orders"}, "repositoryRef": {"name": "store"},
                 "deletionPolicy": policy, "importedSnapshot": snapshot},
    })
}

async fn reason_becomes(namespace: &TestNamespace, name: &str, reason: &str) -> Backup {
    await_condition(
        &namespace.api::<Backup>(),
        name,
        reason,
        TIMEOUT,
        |backup: &Backup| reason_of(backup).as_deref() == Some(reason),
    )
    .await
}

#[tokio::test]
async fn a_snapshot_restores_verified_in_a_namespace_that_never_saw_its_backup_and_a_changed_or_unknown_snapshot_is_refused()
 {
    let url = s3::shared();
    let bucket = s3::bucket(url, "disaster").await;
    // The source namespace backs up into the shared repository, then loses its Backup and
    // its BackupRepository (the snapshot kept): only the bucket and the password remain.
    let source = setup_importing("dr-source", &bucket, |root| {
        small_database(root);
        std::fs::write(root.join("written-in"), "the source namespace").unwrap();
    })
    .await;
    let original = completed(&source.namespace, "nightly").await;
    let original_uid = original.metadata.uid.clone().unwrap();
    let snapshot_id = original
        .status
        .clone()
        .unwrap()
        .artifact
        .unwrap()
        .snapshot
        .unwrap()
        .id
        .unwrap();
    let source_tree = tree(source.source.path());
    let backups = source.namespace.api::<Backup>();
    backups
        .patch(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"custody.io/skip-artifact-cleanup": "true"}}}),
            ),
        )
        .await
        .unwrap();
    backups
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    source
        .namespace
        .api::<BackupRepository>()
        .delete("store", &DeleteParams::default())
        .await
        .unwrap();
    gone(&backups, "nightly").await;
    let snapshot_key = format!("{REPOSITORY}/snapshots/{snapshot_id}");
    assert!(snapshots(url, &bucket).await.contains(&snapshot_key));

    // Another namespace attaches the bucket with the password: the snapshot is imported as
    // a read-only Backup that records who wrote it, and restores verified.
    let recovery = setup_importing("dr-target", &bucket, small_database).await;
    let namespace = &recovery.namespace;
    let name = format!("nightly-{}", &snapshot_id[..8]);
    let imported = completed(namespace, &name).await;
    assert_eq!(reason_of(&imported).as_deref(), Some("Imported"));
    assert_eq!(
        imported.spec.imported_snapshot.as_deref(),
        Some(snapshot_id.as_str())
    );
    assert_eq!(imported.labels()["custody.io/imported-from"], "store");
    let written_by = imported
        .status
        .clone()
        .unwrap()
        .artifact
        .unwrap()
        .snapshot
        .unwrap()
        .written_by
        .unwrap();
    assert_eq!(
        (
            written_by.uid.as_str(),
            written_by.namespace.as_str(),
            written_by.name.as_str()
        ),
        (
            original_uid.as_str(),
            source.namespace.name.as_str(),
            "nightly"
        )
    );
    let target = LoopVolume::new(64);
    restore_into_from(&recovery, target.path(), &name).await;
    let (_workloads, restored) = restore_completed(&recovery, target.path()).await;
    assert_eq!(
        restored, source_tree,
        "the source namespace's data, not this one's"
    );

    // The import is a view: the schema refuses one that could delete, and deleting it
    // leaves the snapshot.
    let refused = namespace
        .api::<Backup>()
        .create(
            &Default::default(),
            &serde_json::from_value(imported_backup("deleting", &snapshot_id, "Delete")).unwrap(),
        )
        .await
        .expect_err("an imported Backup that would delete its snapshot");
    assert!(
        refused.to_string().contains("deletionPolicy: Retain"),
        "{refused}"
    );
    namespace
        .api::<Backup>()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    gone(&namespace.api(), &name).await;
    assert!(snapshots(url, &bucket).await.contains(&snapshot_key));

    // One byte changed in a snapshot file, or a snapshot that is not there: refused, named.
    let own = completed(namespace, "nightly").await;
    let own_id = own
        .status
        .clone()
        .unwrap()
        .artifact
        .unwrap()
        .snapshot
        .unwrap()
        .id
        .unwrap();
    let own_key = format!("{REPOSITORY}/snapshots/{own_id}");
    let mut sealed = s3::get(url, &bucket, &own_key).await;
    let middle = sealed.len() / 2;
    sealed[middle] ^= 0x01;
    s3::put(url, &bucket, &own_key, sealed).await;
    create::<Backup>(
        &namespace.api(),
        imported_backup("changed", &own_id, "Retain"),
    )
    .await;
    let changed = reason_becomes(namespace, "changed", "SnapshotInvalid").await;
    assert_eq!(changed.status.unwrap().phase, Some(BackupPhase::Failed));
    create::<Backup>(
        &namespace.api(),
        imported_backup("unknown", &"0".repeat(64), "Retain"),
    )
    .await;
    reason_becomes(namespace, "unknown", "SnapshotNotFound").await;

    // A wrong password opens nothing and imports nothing.
    create::<Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "other-keys"}, "stringData": {"password": "not the password"}}),
    )
    .await;
    create::<BackupRepository>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "guess"},
            "spec": {"endpoint": url, "bucket": bucket, "prefix": "custody", "forcePathStyle": true,
                     "credentialsSecretRef": {"name": "s3"}, "importSnapshots": true,
                     "encryption": {"keySecretRef": {"name": "other-keys"}}},
        }),
    )
    .await;
    await_condition(
        &namespace.api::<BackupRepository>(),
        "guess",
        "KeyRejected",
        TIMEOUT,
        |repository: &BackupRepository| {
            ready(repository) == Some(("False".into(), "KeyRejected".into()))
        },
    )
    .await;
    let guessed = namespace
        .api::<Backup>()
        .list(&ListParams::default().labels("custody.io/imported-from=guess"))
        .await
        .unwrap();
    assert!(guessed.items.is_empty());
    recovery.finish().await;
    source.finish().await;
}

/// Asks for a prune or check (`task`) of `store` by setting its request annotation to
/// `value`, then waits until the run answering it is recorded.
async fn maintained(
    namespace: &TestNamespace,
    task: &str,
    value: &str,
) -> custody_kube::api::MaintenanceRun {
    let repositories = namespace.api::<BackupRepository>();
    repositories
        .patch(
            "store",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                format!("custody.io/{task}-requested"): value}}})),
        )
        .await
        .unwrap();
    let repository = await_condition(
        &repositories,
        "store",
        &format!("the {task} asked for as {value:?} recorded"),
        TIMEOUT,
        |repository: &BackupRepository| {
            let run = repository
                .status
                .as_ref()
                .and_then(|status| status.maintenance.as_ref())
                .and_then(|maintenance| match task {
                    "prune" => maintenance.prune.as_ref(),
                    _ => maintenance.check.as_ref(),
                });
            run.is_some_and(|run| {
                run.request.as_deref() == Some(value)
                    && run.job.is_none()
                    && run.completion_time.is_some()
            })
        },
    )
    .await;
    let maintenance = repository.status.unwrap().maintenance.unwrap();
    let run = match task {
        "prune" => maintenance.prune,
        _ => maintenance.check,
    }
    .unwrap();
    eprintln!("{task} {value}: {run:?}");
    run
}

fn checked(repository: &BackupRepository) -> Option<(String, String, String)> {
    repository
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Checked")
        .map(|condition| {
            (
                condition.status.clone(),
                condition.reason.clone(),
                condition.message.clone(),
            )
        })
}

async fn event_with(namespace: &TestNamespace, reason: &str, kind: &str) -> String {
    custody_tests::event_where(namespace, &format!("a {kind} Event {reason}"), |event| {
        event.reason.as_deref() == Some(reason) && event.type_.as_deref() == Some(kind)
    })
    .await
    .message
    .unwrap_or_default()
}

#[tokio::test]
async fn a_check_finds_a_damaged_pack_and_prunes_give_a_deleted_backups_space_back() {
    let setup = setup_encrypted("maintained").await;
    setup.jobs.run_maintenance_anywhere();
    let namespace = &setup.namespace;
    let url = s3::shared();
    let repository = repository_ready(namespace, "store").await;
    let bucket = repository.spec.bucket.clone();
    let repositories = namespace.api::<BackupRepository>();

    // On request, a check of the whole data: it passes, in status, condition and Event.
    repositories
        .patch(
            "store",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maintenance": {"checkReadDataPercent": 100}}})),
        )
        .await
        .unwrap();
    let run = maintained(namespace, "check", "first").await;
    assert_eq!(run.succeeded, Some(true), "{run:?}");
    let result = run.check.unwrap();
    assert!(result.passed, "{result:?}");
    assert_eq!(result.read_data_percent, 100);
    let repository = repositories.get("store").await.unwrap();
    let (status, reason, _) = checked(&repository).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "CheckPassed"));
    event_with(namespace, "CheckPassed", "Normal").await;
    // Its Job is gone once recorded; the Ready condition is untouched.
    assert_eq!(ready(&repository).unwrap().0, "True");
    let jobs: Api<Job> = namespace.api();
    eventually("the check's Job deleted", TIMEOUT, || async {
        let left: Vec<String> = jobs
            .list(&ListParams::default().labels("custody.io/role=maintenance"))
            .await
            .map_err(|error| error.to_string())?
            .items
            .iter()
            .filter(|job| job.metadata.deletion_timestamp.is_none())
            .map(|job| job.name_any())
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;

    // One byte of a data pack changed: the next check names it and the condition turns False
    // with a Warning.
    let packs = s3::keys(url, &bucket, &format!("{REPOSITORY}/data/")).await;
    let pack = packs.last().expect("a pack").clone();
    let original = s3::get(url, &bucket, &pack).await;
    let mut damaged = original.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x01;
    s3::put(url, &bucket, &pack, damaged).await;
    let run = maintained(namespace, "check", "second").await;
    let result = run.check.unwrap();
    assert!(!result.passed && result.errors > 0, "{result:?}");
    let id = pack.rsplit('/').next().unwrap();
    let repository = repositories.get("store").await.unwrap();
    let (status, reason, message) = checked(&repository).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "CheckFoundErrors")
    );
    assert!(message.contains(&id[..8]), "the pack is named: {message}");
    let warning = event_with(namespace, "CheckFoundErrors", "Warning").await;
    assert!(warning.contains(&id[..8]), "{warning}");
    s3::put(url, &bucket, &pack, original).await;

    // The Backup deleted (its snapshot forgotten): a prune marks its packs, deletes nothing;
    // a day later (the index backdated past the 23 h grace) a prune deletes them all.
    namespace
        .api::<Backup>()
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    gone(&namespace.api::<Backup>(), "nightly").await;
    let run = maintained(namespace, "prune", "first").await;
    assert_eq!(run.succeeded, Some(true), "{run:?}");
    let marking = run.prune.unwrap();
    assert!(marking.packs_marked > 0, "{marking:?}");
    assert_eq!(marking.packs_deleted, 0, "{marking:?}");
    assert_eq!(
        s3::keys(url, &bucket, &format!("{REPOSITORY}/data/"))
            .await
            .len(),
        packs.len(),
        "nothing deleted within the grace"
    );
    event_with(namespace, "Pruned", "Normal").await;
    custody_tests::repository::backdate_at(
        url,
        &bucket,
        REPOSITORY,
        &master_key(namespace).await,
        24,
    )
    .await;
    let run = maintained(namespace, "prune", "second").await;
    let deleting = run.prune.unwrap();
    assert_eq!(deleting.packs_deleted as usize, packs.len(), "{deleting:?}");
    assert!(
        s3::keys(url, &bucket, &format!("{REPOSITORY}/data/"))
            .await
            .is_empty(),
        "space came back"
    );
    setup.finish().await;
}

/// The master key custody keeps for the movers of `store`.
async fn master_key(namespace: &TestNamespace) -> String {
    let repository = namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap();
    let secret = repository
        .status
        .unwrap()
        .repository
        .unwrap()
        .master_key_secret;
    let secret = namespace.api::<Secret>().get(&secret).await.unwrap();
    let bytes = secret
        .data
        .unwrap()
        .get(custody_proto::mover::env::REPOSITORY_KEY)
        .unwrap()
        .0
        .clone();
    String::from_utf8(bytes).unwrap()
}

/// Observations of `what` every half second until `done` says it is over (or [`TIMEOUT`]).
async fn watch_until<K, T>(
    api: &Api<K>,
    name: &str,
    mut seen: impl FnMut(&K) -> Option<T>,
    done: impl Fn(&K) -> bool,
) -> Vec<T>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut observed = Vec::new();
    loop {
        let object = api.get(name).await.unwrap();
        observed.extend(seen(&object));
        if done(&object) {
            return observed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} not done within {TIMEOUT:?}: {object:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `kubectl get KIND NAME` in the namespace, as a person reads it.
fn kubectl_get(namespace: &TestNamespace, kind: &str, name: &str) -> String {
    let output = std::process::Command::new(custody_tests::kubectl_path())
        .arg(format!(
            "--kubeconfig={}",
            custody_tests::control_plane().display()
        ))
        .args(["get", kind, name, "-n", &namespace.name])
        .output()
        .expect("kubectl");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A copy's progress as it was seen in a status: `(bytes done, bytes total)`.
fn counts(transfer: &custody_kube::api::Transfer) -> (u64, Option<u64>) {
    (transfer.bytes_done, transfer.bytes_total)
}

#[tokio::test]
async fn backups_and_restores_show_how_far_they_came_and_a_copy_that_stands_still_is_stalled() {
    let mut setup = setup_encrypted("progress").await;
    // Above the time one 16 MiB pack takes at 2 MiB/s: a copy that moves never stalls.
    setup.restart_controller_with(&["--stalled-after-seconds=20"]);
    let namespace = &setup.namespace;
    let node = setup.kubelet.node.clone();
    repository_ready(namespace, "store").await;
    // 2 MiB/s each way: 40 MiB of new data take some twenty seconds to copy (a backup's
    // count runs up to some 18 MiB ahead of its uploads: what the repository writer buffers).
    let repositories = namespace.api::<BackupRepository>();
    let bound = |upload: u32, download: u32| {
        Patch::Merge(json!({"spec": {"bandwidth":
            {"uploadKiBPerSecond": upload, "downloadKiBPerSecond": download}}}))
    };
    repositories
        .patch("store", &PatchParams::default(), &bound(2048, 2048))
        .await
        .unwrap();
    let new_data = custody_tests::volumes::incompressible(40 << 20, 7);
    std::fs::write(setup.source.path().join("new-data"), &new_data).unwrap();

    // A running Backup says how far it came, every few seconds.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": "slow"}, "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await;
    let backups = namespace.api::<Backup>();
    let mut stalled_while_moving = Vec::new();
    let running = watch_until(
        &backups,
        "slow",
        |backup: &Backup| {
            stalled_while_moving.extend(
                backup
                    .conditions()
                    .iter()
                    .filter(|condition| condition.type_ == "Stalled" && condition.status == "True")
                    .map(|condition| condition.message.clone()),
            );
            let status = backup.status.as_ref()?;
            (status.phase == Some(BackupPhase::Running))
                .then(|| status.transfer.clone())
                .flatten()
        },
        |backup| {
            matches!(
                backup.status.as_ref().and_then(|status| status.phase),
                Some(BackupPhase::Completed | BackupPhase::Failed)
            )
        },
    )
    .await;
    assert!(
        stalled_while_moving.is_empty(),
        "a moving copy was said stalled: {stalled_while_moving:?}"
    );
    let slow = completed(namespace, "slow").await;
    let done = slow
        .status
        .clone()
        .unwrap()
        .transfer
        .expect("a final transfer");
    // Midway: read less than all, or uploaded less than the new data (reading runs ahead of
    // uploading by what the repository writer buffers, some 20-40 MiB here).
    let midway: Vec<(u64, Option<u64>)> = running
        .iter()
        .filter(|transfer| {
            let read_all = transfer
                .bytes_total
                .is_some_and(|total| transfer.bytes_done >= total);
            let uploaded = transfer.bytes_uploaded.unwrap_or(0);
            transfer.bytes_done > 0 && (!read_all || uploaded < new_data.len() as u64)
        })
        .map(|transfer| (transfer.bytes_done, transfer.bytes_uploaded))
        .collect();
    let mut distinct = midway.clone();
    distinct.dedup();
    assert!(
        distinct.len() >= 2,
        "no two different counts seen midway while it ran: {running:?}"
    );
    let last = running.last().unwrap();
    assert_eq!(last.node_name.as_deref(), Some(node.as_str()));
    // What reached the repository is said beside what was read.
    assert!(
        running.iter().any(
            |transfer| transfer.bytes_uploaded.is_some_and(|sent| sent > 0)
                && transfer.summary.contains("uploaded")
        ),
        "{running:?}"
    );
    assert_eq!(last.volume.as_deref(), Some("data"));
    assert!(
        last.summary.contains(" of ") && last.summary.contains("files"),
        "{last:?}"
    );
    // Everything counted, once Completed; no Stalled condition left behind.
    assert_eq!(done.bytes_total, Some(done.bytes_done), "{done:?}");
    assert!(done.bytes_done >= new_data.len() as u64, "{done:?}");
    assert!(done.summary.contains("(100%)"), "{done:?}");
    assert!(
        !slow
            .conditions()
            .iter()
            .any(|condition| condition.type_ == "Stalled"),
        "{:?}",
        slow.conditions()
    );
    let table = kubectl_get(namespace, "backups", "slow");
    assert!(
        table.lines().next().unwrap().contains("PROGRESS") && table.contains(&done.summary),
        "{table}"
    );

    // A restoring volume says how far it was written, the Restore the sum.
    let target = LoopVolume::new(64);
    restore_into_from(&setup, target.path(), "slow").await;
    let workloads =
        WorkloadRunner::start(&namespace.client, &namespace.name, setup.kubelet.clone());
    let restores = namespace.api::<Restore>();
    let writing = watch_until(
        &restores,
        "shop",
        |restore: &Restore| {
            let status = restore.status.as_ref()?;
            let volume = status.volumes.first()?;
            (volume.state == custody_kube::api::VolumeState::Restoring)
                .then(|| Some((volume.transfer.clone()?, status.transfer.clone()?)))
                .flatten()
        },
        |restore| {
            matches!(
                restore.status.as_ref().and_then(|status| status.phase),
                Some(RestorePhase::Completed | RestorePhase::Failed)
            )
        },
    )
    .await;
    let restore = restores.get("shop").await.unwrap();
    assert_eq!(
        restore.status.as_ref().and_then(|status| status.phase),
        Some(RestorePhase::Completed),
        "{:?}",
        restore.status
    );
    let midway: Vec<(u64, Option<u64>)> = writing
        .iter()
        .map(|(volume, _)| counts(volume))
        .filter(|(bytes, total)| *bytes > 0 && total.is_some_and(|total| *bytes < total))
        .collect();
    let mut distinct = midway.clone();
    distinct.dedup();
    assert!(
        distinct.len() >= 2,
        "no two different counts seen midway while the volume was written: {writing:?}"
    );
    // One volume: the Restore's sum is that volume's.
    for (volume, sum) in &writing {
        assert_eq!(counts(volume), counts(sum));
        assert_eq!(volume.node_name.as_deref(), Some(node.as_str()));
    }
    let status = restore.status.clone().unwrap();
    let written = status.volumes[0]
        .transfer
        .clone()
        .expect("a final transfer");
    assert!(written.bytes_done >= new_data.len() as u64, "{written:?}");
    assert!(written.summary.contains("(100%)"), "{written:?}");
    assert_eq!(status.transfer.as_ref().map(counts), Some(counts(&written)));
    let table = kubectl_get(namespace, "restores", "shop");
    assert!(
        table.lines().next().unwrap().contains("TRANSFERRED") && table.contains(&written.summary),
        "{table}"
    );
    drop(workloads);

    // A copy that stands still past the bound (1 KiB/s: one pack takes hours): Stalled,
    // naming the node, with a Warning; the Backup keeps running.
    repositories
        .patch("store", &PatchParams::default(), &bound(1, 2048))
        .await
        .unwrap();
    std::fs::write(
        setup.source.path().join("more-data"),
        custody_tests::volumes::incompressible(4 << 20, 8),
    )
    .unwrap();
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": "stuck"}, "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await;
    let stuck = await_condition(&backups, "stuck", "Stalled", TIMEOUT, |backup: &Backup| {
        backup
            .conditions()
            .iter()
            .any(|condition| condition.type_ == "Stalled" && condition.status == "True")
    })
    .await;
    let stalled = stuck
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Stalled")
        .unwrap()
        .clone();
    assert_eq!(stalled.reason, "NoProgress");
    assert!(
        stalled.message.contains(&format!("node {node}"))
            && stalled.message.contains("volume data"),
        "{}",
        stalled.message
    );
    assert_eq!(
        stuck.status.as_ref().and_then(|status| status.phase),
        Some(BackupPhase::Running)
    );
    let warning =
        custody_tests::event_where(namespace, "a Warning Stalled of Backup stuck", |event| {
            event.reason.as_deref() == Some("Stalled")
                && event.type_.as_deref() == Some("Warning")
                && event.involved_object.name.as_deref() == Some("stuck")
        })
        .await;
    assert!(
        warning
            .message
            .unwrap_or_default()
            .contains("no progress since"),
        "the Warning says what stalled"
    );
    setup.finish().await;
}

/// The Ready condition's (status, reason, message) of `repository`.
fn ready_said(repository: &BackupRepository) -> Option<(String, String, String)> {
    repository
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .map(|condition| {
            (
                condition.status.clone(),
                condition.reason.clone(),
                condition.message.clone(),
            )
        })
}

/// Issue 24 item 5: a repository that signs with a web identity. The S3 server (MinIO) trusts
/// the cluster's ServiceAccount issuer; the BackupRepository names a ServiceAccount and a
/// role, and no Secret of keys exists anywhere. The controller (as deployed, with exactly the
/// RBAC of `deploy/`) may not ask for the ServiceAccount's tokens until the namespace binds
/// `custody-web-identity` (Ready=False WebIdentityNotAllowed naming the command), then opens
/// the repository with a token exchanged at the STS; the backup and restore movers run as the
/// ServiceAccount with only a token for the STS's audience (projected as a kubelet does) and
/// sign with the role's temporary credentials; the restore is verified; deleting the Backup
/// forgets its snapshot through the controller's own exchange; a token of another audience is
/// refused by the STS, and the condition says so.
#[tokio::test]
async fn a_repository_with_a_web_identity_backs_up_and_restores_with_no_keys_anywhere() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::RoleBinding;
    const AUDIENCE: &str = "custody-test";
    let setup = custody_tests::scenario::setup_as_deployed("web-identity").await;
    let namespace = &setup.namespace;
    let ns = namespace.name.clone();
    let issuer = custody_tests::oidc::PublishedIssuer::start(&namespace.client).await;
    let (federated, role_arn) = s3::PrivateS3::start_federated(&issuer.config_url, AUDIENCE);
    let url = federated.url.clone();
    let bucket = s3::bucket(&url, "federated").await;
    create::<ServiceAccount>(&namespace.api(), json!({"metadata": {"name": "backups"}})).await;
    create::<Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "federated-keys"}, "stringData": {"password": PASSWORD}}),
    )
    .await;
    create::<BackupRepository>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "federated"},
            "spec": {"endpoint": url, "bucket": bucket, "prefix": "custody", "forcePathStyle": true,
                     "webIdentity": {"serviceAccountName": "backups", "roleArn": role_arn,
                                     "audience": AUDIENCE, "stsEndpoint": url},
                     "encryption": {"keySecretRef": {"name": "federated-keys"}}},
        }),
    )
    .await;

    // Not yet: the namespace has not let custody ask for the ServiceAccount's tokens.
    let refused = await_condition(
        &namespace.api::<BackupRepository>(),
        "federated",
        "Ready=False WebIdentityNotAllowed",
        TIMEOUT,
        |repository: &BackupRepository| {
            ready_said(repository).is_some_and(|(status, reason, _)| {
                status == "False" && reason == "WebIdentityNotAllowed"
            })
        },
    )
    .await;
    let (_, _, message) = ready_said(&refused).unwrap();
    assert!(
        message.contains(&format!("ServiceAccount {ns}/backups"))
            && message.contains(&format!(
                "kubectl create rolebinding custody-web-identity --namespace {ns} --clusterrole custody-web-identity"
            )),
        "{message}"
    );
    assert!(
        refused
            .status
            .as_ref()
            .and_then(|status| status.repository.as_ref())
            .is_none(),
        "nothing was opened"
    );

    // The namespace's admin lets it: the repository opens with the role's credentials.
    create::<RoleBinding>(
        &namespace.api(),
        json!({
            "metadata": {"name": "custody-web-identity"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "custody-web-identity"},
            "subjects": [{"kind": "ServiceAccount", "name": "custody-controller", "namespace": "custody-system"}],
        }),
    )
    .await;
    let opened = repository_ready(namespace, "federated").await;
    let (_, reason, _) = ready_said(&opened).unwrap();
    assert_eq!(reason, "Available");
    assert_eq!(
        s3::keys(&url, &bucket, &format!("{REPOSITORY}/config")).await,
        [format!("{REPOSITORY}/config")],
        "the repository was created in the federated bucket"
    );

    // A Backup into it, by a mover that runs as the ServiceAccount with only the STS's token.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "federated-1"},
               "spec": {"clusterRef": {"name": "orders"}, "repositoryRef": {"name": "federated"}}}),
    )
    .await;
    let backup = completed(namespace, "federated-1").await;
    let artifact = backup.status.unwrap().artifact.unwrap();
    assert_eq!(artifact.credentials_secret, None);
    assert_eq!(
        artifact
            .web_identity
            .as_ref()
            .map(|identity| identity.service_account_name.as_str()),
        Some("backups"),
        "recorded, to delete it once the repository is gone"
    );
    let snapshot = artifact.snapshot.unwrap().id.unwrap();
    assert_eq!(
        snapshots(&url, &bucket).await,
        [format!("{REPOSITORY}/snapshots/{snapshot}")]
    );
    let jobs: Api<Job> = namespace.api();
    let job = jobs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|job| job.name_any().starts_with("federated-1-backup-"))
        .expect("the backup's Job");
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("backups"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let env: Vec<String> = pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|variable| variable.name.clone())
        .collect();
    assert!(
        env.contains(&"AWS_ROLE_ARN".to_string())
            && !env.contains(&"AWS_ACCESS_KEY_ID".to_string()),
        "{env:?}"
    );

    // Restored from it (the prepareData mover signs the same way), verified.
    let target = LoopVolume::new(64);
    restore_into_from(&setup, target.path(), "federated-1").await;
    let (_workloads, restored) = restore_completed(&setup, target.path()).await;
    assert_eq!(restored, tree(setup.source.path()));

    // Deleting the Backup forgets its snapshot: the controller's own exchange.
    namespace
        .api::<Backup>()
        .delete("federated-1", &DeleteParams::default())
        .await
        .unwrap();
    gone(&namespace.api::<Backup>(), "federated-1").await;
    assert_eq!(snapshots(&url, &bucket).await, Vec::<String>::new());

    // A token of another audience: the STS refuses it, and the condition says why.
    namespace
        .api::<BackupRepository>()
        .patch(
            "federated",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"webIdentity": {"audience": "another"}}})),
        )
        .await
        .unwrap();
    let refused = await_condition(
        &namespace.api::<BackupRepository>(),
        "federated",
        "Ready=False WebIdentityRefused",
        TIMEOUT,
        |repository: &BackupRepository| {
            ready_said(repository).is_some_and(|(status, reason, _)| {
                status == "False" && reason == "WebIdentityRefused"
            })
        },
    )
    .await;
    let (_, _, message) = ready_said(&refused).unwrap();
    assert!(
        message.contains(&format!("the STS at {url} refused the token"))
            && message.contains("InvalidParameterValue"),
        "{message}"
    );

    // The namespace deleted after its ServiceAccount went first: nothing holds a
    // ServiceAccount as a finalizer holds a Secret, so the Backup's artifact is kept (a
    // Warning says so) instead of the namespace held forever.
    namespace
        .api::<BackupRepository>()
        .patch(
            "federated",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"webIdentity": {"audience": AUDIENCE}}})),
        )
        .await
        .unwrap();
    await_condition(
        &namespace.api::<BackupRepository>(),
        "federated",
        "Ready again",
        TIMEOUT,
        |repository: &BackupRepository| {
            ready_said(repository).is_some_and(|(status, _, _)| status == "True")
        },
    )
    .await;
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "federated-2"},
               "spec": {"clusterRef": {"name": "orders"}, "repositoryRef": {"name": "federated"}}}),
    )
    .await;
    completed(namespace, "federated-2").await;
    assert_eq!(snapshots(&url, &bucket).await.len(), 1);
    namespace
        .api::<ServiceAccount>()
        .delete("backups", &DeleteParams::default())
        .await
        .unwrap();
    setup.finish_deleting_the_namespace_whole().await;
    assert_eq!(
        snapshots(&url, &bucket).await.len(),
        1,
        "the snapshot is kept, the namespace gone"
    );
    drop(federated);
    drop(issuer);
}
