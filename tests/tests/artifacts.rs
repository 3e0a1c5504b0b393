//! Backups and restores of one Cluster kept apart, and deleting a Backup's artifact only with
//! proof: the real controller, API server, S3 servers (shared MinIO, and a private one the test
//! stops and starts), real mover and agent.

use std::time::{Duration, Instant};

use custody_kube::api::{
    Backup, BackupPhase, BackupRepository, Cluster, ClusterPhase, HasConditions, Restore,
    RestorePhase,
};
use custody_tests::s3::{self, Fault, FaultyLink, PrivateS3};
use custody_tests::scenario::{Setup, artifact_of, create, restore_into, setup};
use custody_tests::volumes::LoopVolume;
use custody_tests::workloads::WorkloadRunner;
use custody_tests::{await_condition, eventually};
use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);

fn phase(backup: &Backup) -> Option<BackupPhase> {
    backup.status.as_ref().and_then(|status| status.phase)
}

/// Backup `name` of `cluster` (its pods run while it is copied: knowingly crash-unsafe, the
/// tests' data is files, not a running engine).
async fn backup(setup: &Setup, name: &str, cluster: &str, repository: Option<&str>) -> Backup {
    let mut spec =
        json!({"clusterRef": {"name": cluster}, "consistency": {"method": "CrashUnsafe"}});
    if let Some(repository) = repository {
        spec["repositoryRef"] = json!({"name": repository});
    }
    create::<Backup>(
        &setup.namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name}, "spec": spec}),
    )
    .await
}

async fn completed(setup: &Setup, name: &str) -> Backup {
    await_condition(
        &setup.namespace.api::<Backup>(),
        name,
        "Completed",
        TIMEOUT,
        |backup: &Backup| phase(backup) == Some(BackupPhase::Completed),
    )
    .await
}

async fn gone(setup: &Setup, name: &str) {
    let backups = setup.namespace.api::<Backup>();
    eventually(&format!("Backup {name} gone"), TIMEOUT, || {
        let backups = backups.clone();
        async move {
            match backups
                .get_opt(name)
                .await
                .map_err(|error| error.to_string())?
            {
                None => Ok(()),
                Some(backup) => Err(format!(
                    "{:?} {:?}",
                    backup.finalizers(),
                    backup.status.as_ref().and_then(|s| s.cleanup.as_ref())
                )),
            }
        }
    })
    .await;
}

/// The artifact a Backup recorded.
/// Deletes a Backup and waits until it is gone.
async fn delete_and_wait(setup: &Setup, name: &str) {
    setup
        .namespace
        .api::<Backup>()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    gone(setup, name).await;
}

/// The keys in `before` that are not in `after`, sorted.
fn removed_between(before: &[String], after: &[String]) -> Vec<String> {
    let mut removed: Vec<String> = before
        .iter()
        .filter(|key| !after.contains(key))
        .cloned()
        .collect();
    removed.sort();
    removed
}

async fn await_event(setup: &Setup, object: &str, reason: &str, contains: &str) -> String {
    let events: Api<Event> = setup.namespace.api();
    eventually(&format!("Event {reason} on {object}"), TIMEOUT, || {
        let events = events.clone();
        async move {
            let listed = events
                .list(&ListParams::default())
                .await
                .map_err(|error| error.to_string())?;
            listed
                .items
                .into_iter()
                .filter(|event| event.involved_object.name.as_deref() == Some(object))
                .filter(|event| event.reason.as_deref() == Some(reason))
                .filter_map(|event| event.message)
                .find(|message| message.contains(contains))
                .ok_or_else(|| "not yet".to_string())
        }
    })
    .await
}

fn bucket_of(repository: &BackupRepository) -> String {
    repository.spec.bucket.clone()
}

/// Creates a BackupRepository with the test Secret `s3` and waits until it is Ready.
async fn ready_repository(setup: &Setup, name: &str, spec: serde_json::Value) {
    let mut spec = spec;
    spec["forcePathStyle"] = json!(true);
    spec["credentialsSecretRef"] = json!({"name": "s3"});
    create::<BackupRepository>(
        &setup.namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": name}, "spec": spec,
        }),
    )
    .await;
    await_condition(
        &setup.namespace.api::<BackupRepository>(),
        name,
        "Ready",
        TIMEOUT,
        |repository: &BackupRepository| {
            repository
                .conditions()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        },
    )
    .await;
}

/// Backs up `cluster` as `name` and returns the artifact once Completed.
async fn completed_artifact(
    setup: &Setup,
    name: &str,
    repository: &str,
) -> custody_kube::api::Artifact {
    backup(setup, name, "orders", Some(repository)).await;
    completed(setup, name)
        .await
        .status
        .and_then(|status| status.artifact)
        .expect("an artifact")
}

#[tokio::test]
async fn deleting_a_backup_deletes_exactly_its_own_keys_even_under_reserved_characters() {
    let setup = setup("keys").await;
    let store = setup
        .namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap();
    let bucket = bucket_of(&store);
    // A repository whose prefix needs escaping in a URL.
    ready_repository(
        &setup,
        "odd",
        json!({"endpoint": s3::shared(), "bucket": bucket, "prefix": "team a/#1?x=%2F&y"}),
    )
    .await;
    // Two runs of one Cluster in one prefix, the older first.
    let older = completed_artifact(&setup, "older", "odd").await;
    let newer = completed_artifact(&setup, "newer", "odd").await;
    assert!(older.key.starts_with("team a/#1?x=%2F&y/"), "{}", older.key);
    // Something in the same prefix no Backup recorded.
    let stray = older.prefix.rsplit_once('/').unwrap().0.to_string() + "/not-a-backup/data.tar.zst";
    s3::put(s3::shared(), &bucket, &stray, b"someone's dump".to_vec()).await;
    let before = s3::keys(s3::shared(), &bucket, "").await;
    for key in [
        &older.key,
        &older.manifest_key,
        &newer.key,
        &newer.manifest_key,
        &stray,
    ] {
        assert!(before.contains(key), "{key} missing before: {before:?}");
    }

    delete_and_wait(&setup, "older").await;
    let after = s3::keys(s3::shared(), &bucket, "").await;
    let removed = removed_between(&before, &after);
    let mut expected = vec![older.key.clone(), older.manifest_key.clone()];
    expected.sort();
    assert_eq!(removed, expected, "exactly the older run's keys");
    await_event(&setup, "older", "ArtifactDeleted", &older.key).await;
    setup.finish().await;
}

#[tokio::test]
async fn a_failed_delete_is_retried_visibly_until_s3_is_back_and_the_skip_annotation_keeps_the_artifact()
 {
    let setup = setup("retry").await;
    let mut server = PrivateS3::start();
    let bucket = s3::bucket(&server.url, "retry").await;
    ready_repository(
        &setup,
        "private",
        json!({"endpoint": server.url, "bucket": bucket, "prefix": "custody"}),
    )
    .await;
    let flaky = completed_artifact(&setup, "flaky", "private").await;
    let kept = completed_artifact(&setup, "kept", "private").await;

    server.kill();
    let backups = setup.namespace.api::<Backup>();
    backups
        .delete("flaky", &DeleteParams::default())
        .await
        .unwrap();
    let warning = await_event(
        &setup,
        "flaky",
        "ArtifactCleanupFailed",
        "custody.io/skip-artifact-cleanup=true",
    )
    .await;
    assert!(warning.contains(&flaky.key), "{warning}");
    let terminating = await_condition(
        &backups,
        "flaky",
        "a recorded failure",
        TIMEOUT,
        |backup: &Backup| {
            backup
                .status
                .as_ref()
                .and_then(|s| s.cleanup.as_ref())
                .is_some_and(|c| c.attempts >= 1 && c.last_error.is_some())
        },
    )
    .await;
    assert!(terminating.metadata.deletion_timestamp.is_some());

    // The skip annotation releases a Backup at once and keeps its artifact.
    backups
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    backups
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"custody.io/skip-artifact-cleanup": "true"}}}),
            ),
        )
        .await
        .unwrap();
    gone(&setup, "kept").await;

    server.resume();
    let back = Instant::now();
    gone(&setup, "flaky").await;
    eprintln!("flaky released {:?} after S3 came back", back.elapsed());
    let keys = s3::keys(&server.url, &bucket, "").await;
    assert!(
        !keys.contains(&flaky.key) && !keys.contains(&flaky.manifest_key),
        "{keys:?}"
    );
    assert!(
        keys.contains(&kept.key) && keys.contains(&kept.manifest_key),
        "kept: {keys:?}"
    );
    setup.finish().await;
}

#[tokio::test]
async fn a_restore_holds_the_deletion_of_its_backup_and_a_restore_refuses_a_backup_being_deleted() {
    let setup = setup("readers").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let nightly = artifact_of(&setup.namespace, "nightly").await;
    let store = setup
        .namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap();
    setup.jobs.set_running(false);
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let restores = setup.namespace.api::<Restore>();
    await_condition(
        &restores,
        "shop",
        "Running",
        TIMEOUT,
        |restore: &Restore| {
            restore.status.as_ref().and_then(|s| s.phase) == Some(RestorePhase::Running)
        },
    )
    .await;

    let backups = setup.namespace.api::<Backup>();
    backups
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    await_event(&setup, "nightly", "DeletionWaitsForRestore", "Restore shop").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        backups.get_opt("nightly").await.unwrap().is_some(),
        "held by the restore"
    );
    assert!(
        s3::keys(s3::shared(), &store.spec.bucket, "")
            .await
            .contains(&nightly.key)
    );

    // A new restore of the Backup on its way out is refused.
    create::<Cluster>(
        &setup.namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "late"},
               "spec": {"statefulSetRef": {"name": "late"}, "volumeClaimTemplates": ["data"],
                        "restore": {"backupRef": {"name": "nightly"}}}}),
    )
    .await;
    let late = await_condition(&restores, "late", "Failed", TIMEOUT, |restore: &Restore| {
        restore.status.as_ref().and_then(|s| s.phase) == Some(RestorePhase::Failed)
    })
    .await;
    let ready = late
        .conditions()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "BackupBeingDeleted");

    // The restore completes; then the Backup and its keys go.
    setup.jobs.set_running(true);
    await_condition(
        &restores,
        "shop",
        "Completed",
        TIMEOUT,
        |restore: &Restore| {
            restore.status.as_ref().and_then(|s| s.phase) == Some(RestorePhase::Completed)
        },
    )
    .await;
    gone(&setup, "nightly").await;
    let keys = s3::keys(s3::shared(), &store.spec.bucket, "").await;
    assert!(!keys.contains(&nightly.key), "{keys:?}");
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn backups_and_restores_of_one_cluster_never_overlap() {
    let setup = setup("holds").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    setup.jobs.set_running(false);
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let restores = setup.namespace.api::<Restore>();
    await_condition(
        &restores,
        "shop",
        "Running",
        TIMEOUT,
        |restore: &Restore| {
            restore.status.as_ref().and_then(|s| s.phase) == Some(RestorePhase::Running)
        },
    )
    .await;

    // Backups of the Cluster under restore wait, naming the Restore.
    for name in ["shop-a", "shop-b", "shop-c"] {
        backup(&setup, name, "shop", Some("store")).await;
    }
    let backups = setup.namespace.api::<Backup>();
    for name in ["shop-a", "shop-b", "shop-c"] {
        let waiting = await_condition(
            &backups,
            name,
            "RestoreInProgress",
            TIMEOUT,
            |backup: &Backup| {
                backup
                    .conditions()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "RestoreInProgress")
            },
        )
        .await;
        assert_eq!(phase(&waiting), Some(BackupPhase::Pending));
        let ready = waiting
            .conditions()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert!(ready.message.contains("Restore shop"), "{ready:?}");
    }

    // The restore runs; then every Backup, one at a time.
    setup.jobs.set_running(true);
    await_condition(
        &setup.namespace.api::<Cluster>(),
        "shop",
        "Running",
        TIMEOUT,
        |cluster: &Cluster| {
            cluster.status.as_ref().and_then(|s| s.phase) == Some(ClusterPhase::Running)
        },
    )
    .await;
    for name in ["shop-a", "shop-b", "shop-c"] {
        let done = completed(&setup, name).await;
        assert!(
            done.conditions()
                .iter()
                .all(|c| c.reason != "RestoreInProgress")
        );
    }

    // While a backup of the Cluster runs, a new Restore of it waits.
    setup.jobs.set_running(false);
    backup(&setup, "shop-d", "shop", Some("store")).await;
    await_condition(&backups, "shop-d", "Running", TIMEOUT, |backup: &Backup| {
        phase(backup) == Some(BackupPhase::Running)
    })
    .await;
    create::<Restore>(
        &setup.namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": {"name": "again"},
               "spec": {"clusterRef": {"name": "shop"}, "backupRef": {"name": "shop-a"}}}),
    )
    .await;
    let again = await_condition(
        &restores,
        "again",
        "BackupInProgress",
        TIMEOUT,
        |restore: &Restore| {
            restore
                .conditions()
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "BackupInProgress")
        },
    )
    .await;
    assert!(
        again
            .conditions()
            .iter()
            .any(|c| c.message.contains("Backup shop-d"))
    );
    setup.jobs.set_running(true);
    completed(&setup, "shop-d").await;
    restores
        .delete("again", &DeleteParams::default())
        .await
        .unwrap();

    // The pods of the restore and of the four backups ran one after another.
    let mut intervals: Vec<(String, Instant, Instant)> = setup
        .jobs
        .started()
        .into_iter()
        .filter(|started| {
            started.pod.starts_with("data-shop-0-restore-") || started.pod.starts_with("shop-")
        })
        .map(|started| {
            let ended = started.ended.lock().unwrap().expect("ended");
            (started.pod.clone(), started.at, ended)
        })
        .collect();
    intervals.sort_by_key(|(_, at, _)| *at);
    assert_eq!(intervals.len(), 5, "{intervals:?}");
    for pair in intervals.windows(2) {
        assert!(
            pair[0].2 <= pair[1].1,
            "{} overlaps {}",
            pair[0].0,
            pair[1].0
        );
    }
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_backups_artifacts_and_the_namespace_goes() {
    let setup = setup("teardown").await;
    let nightly = artifact_of(&setup.namespace, "nightly").await;
    // A second Backup of the same Secret: both are released at once.
    backup(&setup, "second", "orders", None).await;
    let second = completed(&setup, "second")
        .await
        .status
        .and_then(|status| status.artifact)
        .unwrap();
    let bucket = setup
        .namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap()
        .spec
        .bucket;
    let secret = setup
        .namespace
        .api::<k8s_openapi::api::core::v1::Secret>()
        .get("s3")
        .await
        .unwrap();
    assert!(
        secret
            .finalizers()
            .iter()
            .any(|f| f == "custody.io/artifact-credentials"),
        "{:?}",
        secret.finalizers()
    );
    delete_namespace_and_wait(&setup).await;
    let keys = s3::keys(s3::shared(), &bucket, "").await;
    for artifact in [&nightly, &second] {
        assert!(
            !keys.contains(&artifact.key) && !keys.contains(&artifact.manifest_key),
            "{keys:?}"
        );
    }
    setup.finish().await;
}

/// A controller stopped after its cleanup deleted the keys, recorded `cleanup.done` and released
/// the credentials Secret, but before it removed the Backup's finalizer (the Secret then goes
/// with its namespace). Started again, it only removes the finalizer: it never needs the gone
/// Secret for a delete that already happened.
#[tokio::test]
async fn a_cleanup_interrupted_after_the_secret_was_released_finishes_without_it() {
    let mut setup = setup("resume").await;
    let artifact = artifact_of(&setup.namespace, "nightly").await;
    setup.stop_controller();
    // The state the stopped controller left behind.
    let backups = setup.namespace.api::<Backup>();
    backups
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    s3::delete(
        s3::shared(),
        &artifact.bucket,
        &[&artifact.key, &artifact.manifest_key],
    )
    .await;
    backups
        .patch_status(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"cleanup": {"done": true, "attempts": 0}}})),
        )
        .await
        .unwrap();
    let secrets = setup.namespace.api::<k8s_openapi::api::core::v1::Secret>();
    secrets
        .patch(
            "s3",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    secrets
        .delete("s3", &DeleteParams::default())
        .await
        .unwrap();
    assert!(secrets.get_opt("s3").await.unwrap().is_none());

    setup.start_controller();
    gone(&setup, "nightly").await;
    let events: Api<Event> = setup.namespace.api();
    let failures: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some("ArtifactCleanupFailed"))
        .filter_map(|event| event.message)
        .collect();
    assert!(failures.is_empty(), "{failures:?}");
    setup.finish().await;
}

/// Deletes the scenario's namespace (the kubelet confirming its pods' deletion) and waits
/// until it is gone, naming what still holds it.
async fn delete_namespace_and_wait(setup: &Setup) {
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let _workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    let backups = setup.namespace.api::<Backup>();
    eventually("the namespace gone", Duration::from_secs(180), || {
        let namespaces = namespaces.clone();
        let ns = ns.clone();
        let backups = backups.clone();
        async move {
            match namespaces
                .get_opt(&ns)
                .await
                .map_err(|error| error.to_string())?
            {
                None => Ok(()),
                Some(namespace) => Err(format!(
                    "{:?}; {}",
                    namespace.status,
                    custody_tests::remaining_backups(&backups).await
                )),
            }
        }
    })
    .await;
}

/// The `cleanup` status of a Backup once `ready` holds for it.
async fn cleanup_when(
    setup: &Setup,
    name: &str,
    what: &str,
    ready: impl Fn(&custody_kube::api::CleanupStatus) -> bool,
) -> custody_kube::api::CleanupStatus {
    await_condition(
        &setup.namespace.api::<Backup>(),
        name,
        what,
        TIMEOUT,
        |backup: &Backup| {
            backup
                .status
                .as_ref()
                .and_then(|status| status.cleanup.as_ref())
                .is_some_and(&ready)
        },
    )
    .await
    .status
    .and_then(|status| status.cleanup)
    .expect("cleanup status")
}

#[tokio::test]
async fn server_errors_and_stalls_back_off_visibly_and_a_moved_endpoint_is_used() {
    let setup = setup("faults").await;
    let server = PrivateS3::start();
    let link = FaultyLink::start(&server.url);
    let bucket = s3::bucket(&server.url, "faults").await;
    ready_repository(
        &setup,
        "relayed",
        json!({"endpoint": link.url, "bucket": bucket, "prefix": "custody"}),
    )
    .await;
    let stalled = completed_artifact(&setup, "stalled", "relayed").await;
    let moved = completed_artifact(&setup, "moved", "relayed").await;
    let backups = setup.namespace.api::<Backup>();

    // A server that accepts and never answers: the delete gives up, the Backup stays.
    link.set(Fault::Stall);
    backups
        .delete("stalled", &DeleteParams::default())
        .await
        .unwrap();
    let warning = await_event(
        &setup,
        "stalled",
        "ArtifactCleanupFailed",
        "did not answer within",
    )
    .await;
    assert!(
        warning.contains(&stalled.key) && warning.contains("custody.io/skip-artifact-cleanup=true"),
        "{warning}"
    );

    // A server answering 503: each attempt fails, and they come further apart.
    link.set(Fault::Unavailable);
    let second = cleanup_when(&setup, "stalled", "the second attempt", |c| c.attempts == 2).await;
    assert!(
        second
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("503") || error.contains("ServiceUnavailable")),
        "{second:?}"
    );
    await_event(
        &setup,
        "stalled",
        "ArtifactCleanupFailed",
        "attempt 2, next in 10s",
    )
    .await;
    let third = cleanup_when(&setup, "stalled", "the third attempt", |c| c.attempts == 3).await;
    let gap = third.last_attempt_time.unwrap().0.as_second()
        - second.last_attempt_time.unwrap().0.as_second();
    assert!(
        (9..=14).contains(&gap),
        "attempts 2 and 3 {gap}s apart, expected 10s"
    );
    let kept = s3::keys(&server.url, &bucket, "").await;
    assert!(
        kept.contains(&stalled.key),
        "nothing deleted while failing: {kept:?}"
    );
    assert!(
        backups
            .get("stalled")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // The server is back: the next attempt deletes and releases.
    link.set(Fault::None);
    gone(&setup, "stalled").await;
    let keys = s3::keys(&server.url, &bucket, "").await;
    assert!(
        !keys.contains(&stalled.key) && !keys.contains(&stalled.manifest_key),
        "{keys:?}"
    );

    // The repository moves to the server's own address and the old one hangs: the delete uses
    // the current endpoint with the recorded bucket and keys. A key someone already removed
    // is reported, not failed on.
    link.set(Fault::Stall);
    setup
        .namespace
        .api::<BackupRepository>()
        .patch(
            "relayed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"endpoint": server.url}})),
        )
        .await
        .unwrap();
    s3::client(&server.url)
        .delete_object()
        .bucket(&bucket)
        .key(&moved.manifest_key)
        .send()
        .await
        .unwrap();
    let started = Instant::now();
    backups
        .delete("moved", &DeleteParams::default())
        .await
        .unwrap();
    gone(&setup, "moved").await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "released in {:?}, so the hanging old endpoint was not used",
        started.elapsed()
    );
    let absent = await_event(
        &setup,
        "moved",
        "ArtifactAlreadyAbsent",
        &moved.manifest_key,
    )
    .await;
    assert!(absent.contains(&server.url), "{absent}");
    let deleted = await_event(&setup, "moved", "ArtifactDeleted", &moved.key).await;
    assert!(
        deleted.contains(&server.url) && !deleted.contains(&moved.manifest_key),
        "{deleted}"
    );
    let keys = s3::keys(&server.url, &bucket, "").await;
    assert!(!keys.contains(&moved.key), "{keys:?}");
    link.set(Fault::None);
    setup.finish().await;
}

#[tokio::test]
async fn a_repository_behind_a_private_ca_backs_up_and_its_artifact_is_deleted_after_the_repository_is_gone()
 {
    let setup = setup("private-ca").await;
    let pki = custody_tests::pki::Pki::new(&["localhost"]);
    let server = PrivateS3::start_tls(&pki);
    let bucket = s3::bucket(&server.url, "tls").await;
    let ca = std::fs::read_to_string(pki.ca()).unwrap();
    // Without the CA the server is not trusted, and the repository says so.
    create::<BackupRepository>(
        &setup.namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "untrusted"},
            "spec": {"endpoint": server.url, "bucket": bucket, "forcePathStyle": true,
                     "credentialsSecretRef": {"name": "s3"}},
        }),
    )
    .await;
    await_condition(
        &setup.namespace.api::<BackupRepository>(),
        "untrusted",
        "TLSError",
        TIMEOUT,
        |repository: &BackupRepository| {
            repository
                .conditions()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "TLSError")
        },
    )
    .await;
    ready_repository(
        &setup,
        "trusted",
        json!({"endpoint": server.url, "bucket": bucket, "prefix": "custody", "caBundle": ca}),
    )
    .await;
    let artifact = completed_artifact(&setup, "secure", "trusted").await;
    assert_eq!(artifact.ca_bundle.as_deref(), Some(ca.as_str()));
    let keys = s3::keys(&server.url, &bucket, "").await;
    assert!(keys.contains(&artifact.key), "{keys:?}");

    // The repository goes first; the Backup's own record still reaches the server.
    setup
        .namespace
        .api::<BackupRepository>()
        .delete("trusted", &DeleteParams::default())
        .await
        .unwrap();
    delete_and_wait(&setup, "secure").await;
    let keys = s3::keys(&server.url, &bucket, "").await;
    assert!(
        !keys.contains(&artifact.key) && !keys.contains(&artifact.manifest_key),
        "{keys:?}"
    );
    setup.finish().await;
}

/// The node's measured offset, once the agent's reports carry one near `expected` seconds.
async fn measured_offset(setup: &Setup, expected: i64) -> i64 {
    let agents: Api<custody_kube::api::NodeAgent> = Api::all(setup.namespace.client.clone());
    let agent = await_condition(
        &agents,
        &setup.kubelet.node,
        "the skewed offset",
        TIMEOUT,
        |agent: &custody_kube::api::NodeAgent| {
            agent
                .status
                .as_ref()
                .and_then(|status| status.clock_offset_nanoseconds)
                .is_some_and(|offset| (offset / 1_000_000_000 - expected).abs() <= 1)
        },
    )
    .await;
    agent.status.unwrap().clock_offset_nanoseconds.unwrap()
}

async fn command_backup(setup: &Setup, name: &str, skew: &str) -> Backup {
    let dump = custody_tests::binary("dump-to-s3");
    let command = ["faketime", "-f", skew, dump.to_str().unwrap(), "/data"];
    start_command_backup(setup, name, "store", command.map(str::to_string).to_vec()).await;
    finished(setup, name).await
}

#[tokio::test]
async fn a_command_dump_is_attributed_by_two_clocks_only_with_the_nodes_offset_measured() {
    let mut setup = setup("attribute").await;
    let store = setup
        .namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap();
    let bucket = store.spec.bucket.clone();
    // Yesterday's dump of another run, in the same shared prefix.
    s3::put(
        s3::shared(),
        &bucket,
        "custody/pg-dumps/db-20261129T101500Z.dump",
        b"old".to_vec(),
    )
    .await;

    for (skew, seconds) in [("+30s", 30), ("-30s", -30)] {
        setup.restart_agent(
            &["faketime", "-f", skew],
            vec![("FAKETIME_DONT_FAKE_MONOTONIC", "1")],
        );
        let offset = measured_offset(&setup, seconds).await;
        let name = format!("dump{seconds}");
        let done = command_backup(&setup, &name, skew).await;
        assert_eq!(
            phase(&done),
            Some(BackupPhase::Completed),
            "{:?}",
            done.status
        );
        let status = done.status.unwrap();
        // The node's measured offset, as the agent reported it: it measures again every
        // second, and each measurement moves by up to half a round trip (29.99634 s, then
        // 29.99947 s, seen on a loaded CI machine), so the Backup may record a later one.
        let recorded = status.node_clock.as_ref().unwrap().offset_nanoseconds;
        assert!(
            (recorded - offset).abs() <= 250_000_000,
            "recorded {recorded} ns, measured {offset} ns"
        );
        let artifact = status.artifact.unwrap();
        assert!(
            artifact.key.starts_with("custody/pg-dumps/db-"),
            "{}",
            artifact.key
        );
        assert_ne!(artifact.key, "custody/pg-dumps/db-20261129T101500Z.dump");
        let evidence = artifact.attribution.unwrap();
        assert!(evidence.window_start_nanos <= evidence.corrected_name_time_nanos);
        assert!(evidence.corrected_name_time_nanos <= evidence.window_end_nanos);
        // The name carries the skewed node time; corrected, it lies within the run.
        let named = custody_controller::attribution::name_time(&artifact.key).unwrap();
        assert!(
            ((named - evidence.corrected_name_time_nanos) / 1_000_000_000 - seconds).abs() <= 1
        );
    }

    // Deleting an attributed Backup deletes its dump only.
    let keys_before = s3::keys(s3::shared(), &bucket, "custody/pg-dumps/").await;
    let first = artifact_of(&setup.namespace, "dump30").await;
    // The user's own retention prunes the older run's dump first: deleting the older Backup
    // then reports it gone and never takes the newer run's dump in its place.
    s3::client(s3::shared())
        .delete_object()
        .bucket(&bucket)
        .key(&first.key)
        .send()
        .await
        .unwrap();
    delete_and_wait(&setup, "dump30").await;
    await_event(&setup, "dump30", "ArtifactAlreadyAbsent", &first.key).await;
    let keys_after = s3::keys(s3::shared(), &bucket, "custody/pg-dumps/").await;
    let removed = removed_between(&keys_before, &keys_after);
    assert_eq!(
        removed,
        vec![first.key.clone()],
        "{keys_before:?} -> {keys_after:?}"
    );

    // Deleting the newer one deletes its dump only.
    let second = artifact_of(&setup.namespace, "dump-30").await;
    delete_and_wait(&setup, "dump-30").await;
    let keys_last = s3::keys(s3::shared(), &bucket, "custody/pg-dumps/").await;
    let removed = removed_between(&keys_after, &keys_last);
    assert_eq!(
        removed,
        vec![second.key.clone()],
        "{keys_after:?} -> {keys_last:?}"
    );
    assert!(keys_last.contains(&"custody/pg-dumps/db-20261129T101500Z.dump".to_string()));

    // Without a measured offset nothing is recorded, and the Warning says why.
    setup.agent.stop();
    let agents: Api<custody_kube::api::NodeAgent> = Api::all(setup.namespace.client.clone());
    agents
        .delete(&setup.kubelet.node, &DeleteParams::default())
        .await
        .unwrap();
    let refused = command_backup(&setup, "unmeasured", "+30s").await;
    assert_eq!(phase(&refused), Some(BackupPhase::Failed));
    let ready = refused
        .conditions()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "NoClockOffset", "{ready:?}");
    assert!(refused.status.as_ref().unwrap().artifact.is_none());
    await_event(&setup, "unmeasured", "NoClockOffset", "clock offset").await;
    setup.finish().await;
}

/// A command Backup of `cluster` with `command`, under prefix `pg-dumps` of `repository`.
async fn start_command_backup(setup: &Setup, name: &str, repository: &str, command: Vec<String>) {
    create::<Backup>(
        &setup.namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": "orders"}, "repositoryRef": {"name": repository},
                        "command": {"image": "registry.invalid/pg-dump:17", "prefix": "pg-dumps",
                                    "command": command}}}),
    )
    .await;
}

async fn finished(setup: &Setup, name: &str) -> Backup {
    await_condition(
        &setup.namespace.api::<Backup>(),
        name,
        "finished",
        TIMEOUT,
        |backup: &Backup| {
            matches!(
                phase(backup),
                Some(BackupPhase::Completed | BackupPhase::Failed)
            )
        },
    )
    .await
}

#[tokio::test]
async fn a_dump_in_a_prefix_shared_across_namespaces_is_never_attributed_to_a_run_that_wrote_nothing()
 {
    // Namespace a writes dumps; namespace b's repository names the same bucket and prefix, and
    // its command writes nothing while a's run writes a dump.
    let a = setup("share-a").await;
    let b = setup("share-b").await;
    let bucket = a
        .namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap()
        .spec
        .bucket;
    ready_repository(
        &b,
        "shared",
        json!({"endpoint": s3::shared(), "bucket": bucket, "prefix": "custody"}),
    )
    .await;
    measured_offset(&a, 0).await;
    measured_offset(&b, 0).await;
    start_command_backup(&b, "idle", "shared", vec!["sleep".into(), "8".into()]).await;
    await_condition(
        &b.namespace.api::<Backup>(),
        "idle",
        "Running",
        TIMEOUT,
        |backup: &Backup| phase(backup) == Some(BackupPhase::Running),
    )
    .await;
    let dump = custody_tests::binary("dump-to-s3");
    start_command_backup(
        &a,
        "writer",
        "store",
        vec![dump.to_str().unwrap().to_string(), "/data".to_string()],
    )
    .await;
    let idle = finished(&b, "idle").await;
    let writer = finished(&a, "writer").await;
    let written = s3::keys(s3::shared(), &bucket, "custody/pg-dumps/").await;
    assert_eq!(written.len(), 1, "exactly a's dump: {written:?}");

    // b's run wrote nothing: it never records a's dump.
    assert_eq!(phase(&idle), Some(BackupPhase::Failed), "{:?}", idle.status);
    assert!(
        idle.status.as_ref().unwrap().artifact.is_none(),
        "{:?}",
        idle.status
    );
    let reason = idle
        .conditions()
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap();
    assert_eq!(reason.0, "OverlappingRun", "{reason:?}");
    assert!(
        reason.1.contains(&a.namespace.name) && reason.1.contains("writer"),
        "names the other run: {reason:?}"
    );
    // Nor does a's run claim a dump another namespace's run could have written.
    assert_eq!(
        phase(&writer),
        Some(BackupPhase::Failed),
        "{:?}",
        writer.status
    );

    // Deleting b's Backup deletes nothing of a's.
    delete_and_wait(&b, "idle").await;
    assert_eq!(
        s3::keys(s3::shared(), &bucket, "custody/pg-dumps/").await,
        written
    );
    b.finish().await;
    a.finish().await;
}

/// Issue 15, item 5: the credentials Secret's finalizer goes with the last Backup that needs
/// it, even when that Backup never recorded an artifact (a failed command backup).
#[tokio::test]
async fn a_namespace_whose_only_backup_is_a_failed_command_backup_goes() {
    let setup = setup("failedcommand").await;
    delete_and_wait(&setup, "nightly").await;
    let secrets = setup.namespace.api::<k8s_openapi::api::core::v1::Secret>();
    let held = |secret: &k8s_openapi::api::core::v1::Secret| {
        secret
            .finalizers()
            .iter()
            .any(|f| f == "custody.io/artifact-credentials")
    };
    assert!(!held(&secrets.get("s3").await.unwrap()));
    start_command_backup(&setup, "broken", "store", vec!["false".into()]).await;
    let broken = finished(&setup, "broken").await;
    assert_eq!(
        phase(&broken),
        Some(BackupPhase::Failed),
        "{:?}",
        broken.status
    );
    assert!(broken.status.unwrap().artifact.is_none());
    assert!(
        held(&secrets.get("s3").await.unwrap()),
        "the run held the Secret"
    );
    delete_namespace_and_wait(&setup).await;
    setup.finish().await;
}

/// Issue 24 item 7: a BackupPlan dumps with a command of its own on schedule (each run's dump
/// attributed to it), and retention deletes old runs with their dumps through the normal
/// deletion, which deletes only a dump proven the run's: what is left in the prefix is exactly
/// the dumps of the runs left. A plan whose runs could copy only a stopped application (no
/// method on it or its Cluster, no command) is refused and creates nothing.
#[tokio::test]
async fn a_plan_dumps_with_a_command_and_one_that_needs_a_person_runs_nothing() {
    let setup = setup("cmdplan").await;
    let bucket = setup
        .namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap()
        .spec
        .bucket;
    measured_offset(&setup, 0).await;
    let plans = setup.namespace.api::<custody_kube::api::BackupPlan>();
    let backups = setup.namespace.api::<Backup>();

    create::<custody_kube::api::Cluster>(
        &setup.namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "bare"},
               "spec": {"statefulSetRef": {"name": "bare"}, "volumeClaimTemplates": ["data"],
                        "repositoryRef": {"name": "store"}}}),
    )
    .await;
    create::<custody_kube::api::BackupPlan>(
        &plans,
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": {"name": "by-hand"},
               "spec": {"clusterRef": {"name": "bare"}, "schedule": "*/2 * * * * *"}}),
    )
    .await;
    let refused = await_condition(
        &plans,
        "by-hand",
        "ConsistencyMethodRequired",
        TIMEOUT,
        |plan: &custody_kube::api::BackupPlan| {
            plan.status.as_ref().is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|condition| condition.reason == "ConsistencyMethodRequired")
            })
        },
    )
    .await;
    let message = refused
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|condition| condition.reason == "ConsistencyMethodRequired")
        .unwrap()
        .message;
    assert!(message.contains("Cluster bare"), "{message}");

    let dump = custody_tests::binary("dump-to-s3");
    create::<custody_kube::api::BackupPlan>(
        &plans,
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": {"name": "dumps"},
               "spec": {"clusterRef": {"name": "orders"}, "schedule": "*/15 * * * * *",
                        "retention": {"keepLast": 1},
                        "command": {"image": "registry.invalid/pg-dump:17", "prefix": "pg-dumps",
                                    "command": [dump.to_str().unwrap(), "/data"]}}}),
    )
    .await;
    let completed = |list: &[Backup]| {
        list.iter()
            .filter(|backup| phase(backup) == Some(BackupPhase::Completed))
            .count()
    };
    let mut ever = std::collections::BTreeSet::new();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let list = backups
            .list(&ListParams::default().labels("custody.io/backup-plan=dumps"))
            .await
            .unwrap()
            .items;
        ever.extend(list.iter().map(|backup| backup.name_any()));
        if ever.len() >= 3 && completed(&list) >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "runs so far: {ever:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Every run left that completed holds a dump attributed to it, and the prefix holds
    // exactly those: the pruned runs' dumps were deleted with them.
    eventually(
        "the prefix to hold the dumps of the runs left",
        TIMEOUT,
        || {
            let backups = backups.clone();
            let bucket = bucket.clone();
            async move {
                let list = backups
                    .list(&ListParams::default().labels("custody.io/backup-plan=dumps"))
                    .await
                    .map_err(|error| error.to_string())?
                    .items;
                let kept: std::collections::BTreeSet<String> = list
                    .iter()
                    .filter(|backup| phase(backup) == Some(BackupPhase::Completed))
                    .filter_map(|backup| backup.status.as_ref()?.artifact.as_ref())
                    .map(|artifact| artifact.key.clone())
                    .collect();
                let running = list
                    .iter()
                    .any(|backup| phase(backup) != Some(BackupPhase::Completed));
                let keys: std::collections::BTreeSet<String> =
                    s3::keys(s3::shared(), &bucket, "custody/pg-dumps/")
                        .await
                        .into_iter()
                        .collect();
                if !running && !kept.is_empty() && keys == kept && list.len() <= 2 {
                    Ok(())
                } else {
                    Err(format!(
                        "dumps {keys:?}, runs left {kept:?} ({} runs)",
                        list.len()
                    ))
                }
            }
        },
    )
    .await;
    assert!(ever.len() >= 3, "{ever:?}");
    let left = backups
        .list(&ListParams::default().labels("custody.io/backup-plan=by-hand"))
        .await
        .unwrap()
        .items;
    assert!(left.is_empty(), "the refused plan made runs: {left:?}");
    setup.finish().await;
}
