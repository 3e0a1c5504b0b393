//! Backups end to end: the real controller creates the mover Job; the real Job controller
//! (kube-controller-manager) creates its pod; the fake kubelet runs the real `custody-mover`
//! against the real S3 server with the claim mapped to a real ext4 volume.

use std::collections::BTreeMap;
use std::time::Duration;

use custody_agent::verify::{Expected, Options, verify_volume};
use custody_kube::api::{Backup, BackupPhase, BackupPlan, BackupRepository, HasConditions};
use custody_tests::agent::ControllerProcess;
use custody_tests::kubelet::{FakeKubelet, PodRunner, PodSpec, create_pod};
use custody_tests::pki::Pki;
use custody_tests::volumes::LoopVolume;
use custody_tests::{TestNamespace, await_condition, eventually, kubectl, s3, scenario};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::PostParams;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

struct Setup {
    namespace: TestNamespace,
    kubelet: FakeKubelet,
    bucket: String,
    volume: LoopVolume,
    pki: Pki,
    controller: Option<ControllerProcess>,
}

impl Setup {
    /// Deletes the namespace while the controller runs, then the node.
    async fn finish(self) {
        self.namespace.delete().await;
        self.kubelet.delete().await;
    }

    fn start_controller(&mut self) {
        self.start_controller_with(&[]);
    }

    fn start_controller_with(&mut self, flags: &[&str]) {
        self.controller = None;
        let mut all = vec!["--mover-image=custody-mover:test".to_string()];
        all.extend(flags.iter().map(|flag| flag.to_string()));
        self.controller = Some(ControllerProcess::start(
            &self.namespace.name,
            &self.pki,
            &all,
        ));
    }

    /// Starts playing the kubelet: pods of the node start running from now on.
    fn run_pods(&self) -> PodRunner {
        PodRunner::start(
            &self.namespace.client,
            &self.namespace.name,
            &self.kubelet.node,
            BTreeMap::from([(
                "data-orders-0".to_string(),
                self.volume.path().to_path_buf(),
            )]),
        )
    }
}

async fn setup(prefix: &str) -> Setup {
    let namespace = TestNamespace::create(prefix).await;
    let client = namespace.client.clone();
    let ns = namespace.name.clone();
    let url = s3::shared();
    let bucket = s3::bucket(url, prefix).await;
    let kubelet = FakeKubelet::new(&client, &format!("{ns}-a")).await;

    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3::ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3::SECRET_KEY},
    }))
    .unwrap();
    namespace
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let repository: BackupRepository = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
        "metadata": {"name": "store"},
        "spec": {"endpoint": url, "bucket": bucket, "prefix": "custody", "forcePathStyle": true,
                 "credentialsSecretRef": {"name": "s3"}},
    }))
    .unwrap();
    namespace
        .api::<BackupRepository>()
        .create(&PostParams::default(), &repository)
        .await
        .unwrap();
    running_cluster(&namespace, &kubelet, "orders").await;

    let volume = LoopVolume::new(64);
    std::fs::create_dir_all(volume.path().join("base")).unwrap();
    for index in 0..1000 {
        std::fs::write(
            volume.path().join(format!("base/{index:04}")),
            format!("row {index}"),
        )
        .unwrap();
    }
    std::fs::write(volume.path().join("wal"), vec![42u8; 5 << 20]).unwrap();

    let mut setup = Setup {
        namespace,
        kubelet,
        bucket,
        volume,
        pki: Pki::new(&["custody-controller"]),
        controller: None,
    };
    setup.start_controller();
    let repositories = setup.namespace.api::<BackupRepository>();
    await_condition(&repositories, "store", "Ready", TIMEOUT, |repository| {
        repository
            .conditions()
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
    })
    .await;
    setup
}

/// Cluster `name` (CrashUnsafe, repository `store`) with claim `data-<name>-0` and its pod
/// `<name>-0` running on the node.
async fn running_cluster(namespace: &TestNamespace, kubelet: &FakeKubelet, name: &str) {
    let cluster: custody_kube::api::Cluster = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"statefulSetRef": {"name": name}, "volumeClaimTemplates": ["data"],
                 "repositoryRef": {"name": "store"}, "consistency": {"method": "CrashUnsafe"}},
    }))
    .unwrap();
    namespace
        .api::<custody_kube::api::Cluster>()
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let claim_name = format!("data-{name}-0");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim_name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    namespace
        .api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let pod = format!("{name}-0");
    create_pod(
        &namespace.client,
        &namespace.name,
        PodSpec {
            name: &pod,
            node: &kubelet.node,
            service_account: name,
            claims: &[("data", claim_name.as_str())],
            ..PodSpec::default()
        },
    )
    .await;
    kubelet.set_phase(&namespace.name, &pod, "Running", 0).await;
}

async fn create_backup(namespace: &TestNamespace, name: &str) -> Backup {
    create_backup_of(namespace, name, "orders").await
}

/// Backup `name` of Cluster `cluster`, created.
async fn create_backup_of(namespace: &TestNamespace, name: &str, cluster: &str) -> Backup {
    let backup: Backup = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name},
        "spec": {"clusterRef": {"name": cluster}},
    }))
    .unwrap();
    namespace
        .api::<Backup>()
        .create(&PostParams::default(), &backup)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_backup_runs_where_its_volume_is_mounted_and_records_its_key_first() {
    let setup = setup("backup").await;
    let runner = setup.run_pods();
    let namespace = &setup.namespace;
    let created = create_backup(namespace, "nightly").await;
    let uid = created.metadata.uid.clone().unwrap();
    let backups = namespace.api::<Backup>();
    let done = await_condition(&backups, "nightly", "Completed", TIMEOUT, |backup| {
        backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed)
    })
    .await;
    let status = done.status.clone().unwrap();
    let artifact = status.artifact.clone().unwrap();
    let prefix = format!("custody/{}/orders/{uid}", namespace.name);
    assert_eq!(artifact.key, format!("{prefix}/data.tar.zst"));
    assert_eq!(artifact.manifest_key, format!("{prefix}/manifest.jsonl"));
    assert!(artifact.size_bytes.unwrap() > 0);
    assert_eq!(
        status.node_name.as_deref(),
        Some(setup.kubelet.node.as_str())
    );
    assert!(status.start_time.unwrap().0 <= status.completion_time.unwrap().0);
    let ready = done
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Completed")
    );

    // The key was in the Backup's status before the mover ran.
    let started = runner.started.lock().unwrap().clone();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(
        started[0].recorded_key.as_deref(),
        Some(artifact.key.as_str())
    );

    // The Job: owned by the Backup, pinned to the node, read-only volume.
    let jobs = namespace.api::<Job>();
    let job = jobs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Backup", uid.as_str(), Some(true))
    );
    let pod_spec = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod_spec.node_name.as_deref(),
        Some(setup.kubelet.node.as_str())
    );
    assert_eq!(
        pod_spec.containers[0].volume_mounts.as_ref().unwrap()[0].read_only,
        Some(true)
    );

    // The objects are where the status says, and they restore to a verified copy.
    let mut keys = s3::keys(s3::shared(), &setup.bucket, "").await;
    keys.sort();
    assert_eq!(keys, [artifact.key.clone(), artifact.manifest_key.clone()]);
    let target = LoopVolume::new(64);
    let output = std::process::Command::new(custody_tests::binary("custody-mover"))
        .args(["restore", "--target", target.path().to_str().unwrap()])
        .args([
            "--key",
            &artifact.key,
            "--manifest-key",
            &artifact.manifest_key,
        ])
        .args([
            "--manifest-hash",
            artifact.manifest_hash.as_deref().unwrap(),
        ])
        .args(["--backup-uid", &uid, "--restore-uid", "test-restore"])
        .args([
            "--endpoint",
            s3::shared(),
            "--bucket",
            &setup.bucket,
            "--path-style",
        ])
        .env("AWS_ACCESS_KEY_ID", s3::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3::SECRET_KEY)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let verified = verify_volume(
        target.path(),
        &Expected {
            manifest_hash: blake3::Hash::from_hex(artifact.manifest_hash.unwrap()).unwrap(),
            backup_uid: uid.clone(),
            restore_uid: "test-restore".into(),
        },
        Options::default(),
    )
    .expect("verified");
    assert_eq!(verified.files, 1001);

    // Its pod ran during the copy: the Cluster chose a crash-unsafe copy, and the Backup
    // says so, in a condition and in `kubectl get`.
    let consistent = done
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Consistent")
        .unwrap();
    assert_eq!(
        (consistent.status.as_str(), consistent.reason.as_str()),
        ("False", "CrashUnsafeCopy")
    );
    let table = kubectl(&["-n", &namespace.name, "get", "backups.custody.io"]);
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(
        table.contains("Completed")
            && table.contains(&setup.kubelet.node)
            && table.contains("CONSISTENCY")
            && table.contains("CrashUnsafe"),
        "{table}"
    );
    setup.finish().await;
}

/// Issue 14: a volume backup of an application whose pod runs, with no consistency method
/// chosen, is refused (files copied while a database writes are no point in time): Failed
/// with a reason and a Warning that name the ways out; no Job runs, nothing is uploaded, the
/// Cluster is free.
#[tokio::test]
async fn a_backup_of_a_running_application_without_a_method_is_refused_naming_the_ways_out() {
    let setup = setup("backup-running").await;
    let _runner = setup.run_pods();
    let namespace = &setup.namespace;
    namespace
        .api::<custody_kube::api::Cluster>()
        .patch(
            "orders",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"consistency": null}})),
        )
        .await
        .unwrap();
    create_backup(namespace, "live").await;
    let backups = namespace.api::<Backup>();
    let refused = await_condition(&backups, "live", "Failed", TIMEOUT, |backup: &Backup| {
        backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Failed)
    })
    .await;
    let ready = refused
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready.reason, "ConsistencyMethodRequired", "{ready:?}");
    for part in [
        "pod orders-0",
        "scale StatefulSet orders to 0",
        "CrashUnsafe",
    ] {
        assert!(ready.message.contains(part), "{part}: {}", ready.message);
    }
    let status = refused.status.unwrap();
    assert_eq!(status.artifact, None, "no key recorded");
    assert_eq!(status.consistency, None);
    let events = custody_tests::event_where(namespace, "the Warning", |event| {
        event.reason.as_deref() == Some("ConsistencyMethodRequired")
            && event.type_.as_deref() == Some("Warning")
    })
    .await;
    assert!(
        events.message.unwrap_or_default().contains("orders-0"),
        "the Warning names the pod"
    );
    // Nothing ran and nothing was written.
    let jobs = namespace.api::<Job>();
    assert!(
        jobs.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(s3::keys(s3::shared(), &setup.bucket, "").await.is_empty());
    setup.finish().await;
}

#[tokio::test]
async fn a_failed_upload_fails_the_backup_with_its_reason_and_records_nothing_complete() {
    let setup = setup("backup-fail").await;
    let namespace = &setup.namespace;
    create_backup(namespace, "doomed").await;
    let backups = namespace.api::<Backup>();
    // The key is recorded and the Job created; before its pod runs, the bucket disappears.
    await_condition(&backups, "doomed", "Running", TIMEOUT, |backup| {
        backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Running)
    })
    .await;
    s3::client(s3::shared())
        .delete_bucket()
        .bucket(&setup.bucket)
        .send()
        .await
        .expect("deleting the bucket");
    let _runner = setup.run_pods();
    let failed = await_condition(&backups, "doomed", "Failed", TIMEOUT, |backup| {
        backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Failed)
    })
    .await;
    let ready = failed
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "UploadFailed"),
        "{}",
        ready.message
    );
    assert!(
        ready.message.contains("NoSuchBucket") || ready.message.contains("bucket"),
        "{}",
        ready.message
    );
    let artifact = failed
        .status
        .unwrap()
        .artifact
        .expect("the key was recorded before the upload");
    assert_eq!(artifact.manifest_hash, None, "nothing may look complete");
    assert_eq!(artifact.size_bytes, None);
    setup.finish().await;
}

#[tokio::test]
async fn a_plan_runs_on_schedule_never_twice_per_slot_and_prunes_the_oldest() {
    let mut setup = setup("plan").await;
    let _runner = setup.run_pods();
    let plans = setup.namespace.api::<BackupPlan>();
    let plan: BackupPlan = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan",
        "metadata": {"name": "fast"},
        "spec": {"clusterRef": {"name": "orders"}, "schedule": "*/3 * * * * *",
                 "retention": {"keepLast": 2}},
    }))
    .unwrap();
    plans.create(&PostParams::default(), &plan).await.unwrap();
    let backups = setup.namespace.api::<Backup>();

    // Every run ever seen, with the UID it had.
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let observe = async |seen: &mut BTreeMap<String, String>| {
        for backup in backups.list(&Default::default()).await.unwrap().items {
            let name = backup.metadata.name.clone().unwrap();
            let uid = backup.metadata.uid.clone().unwrap();
            let previous = seen.insert(name.clone(), uid.clone());
            assert!(
                previous.is_none_or(|previous| previous == uid),
                "{name} was created twice"
            );
        }
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    while seen.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "runs so far: {seen:?}"
        );
        observe(&mut seen).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A controller restart in the middle of the schedule.
    setup.start_controller();
    let before = seen.len();
    while seen.len() < before + 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "runs so far: {seen:?}"
        );
        observe(&mut seen).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for name in seen.keys() {
        let second: i64 = name.strip_prefix("fast-").unwrap().parse().unwrap();
        assert_eq!(second % 3, 0, "{name} is not a slot of */3");
    }
    // Retention keeps the two newest finished runs; the older ones are gone.
    custody_tests::eventually("retention to prune", TIMEOUT, || async {
        let left = backups.list(&Default::default()).await.unwrap().items;
        let finished = left
            .iter()
            .filter(|backup| {
                matches!(
                    backup.status.as_ref().and_then(|status| status.phase),
                    Some(BackupPhase::Completed | BackupPhase::Failed)
                )
            })
            .count();
        if finished <= 2 && left.len() < seen.len() {
            Ok(())
        } else {
            Err(format!(
                "{finished} finished of {} left, {} ever",
                left.len(),
                seen.len()
            ))
        }
    })
    .await;
    let status = plans.get("fast").await.unwrap().status.unwrap();
    assert!(status.last_schedule_time.is_some());
    assert!(seen.contains_key(status.last_backup_name.as_deref().unwrap()));
    setup.finish().await;
}

/// Issue 15, item 3: a backup Job whose pod never starts (no kubelet runs it here) does not
/// hold the Backup and the Cluster forever: past the Job's deadline the Backup fails with the
/// Job's reason, and the Cluster's Lease is free again. Jobs carry their resources.
#[tokio::test]
async fn a_backup_whose_pod_never_starts_fails_at_the_deadline_and_frees_the_cluster() {
    let mut setup = setup("deadline").await;
    setup.start_controller_with(&["--job-deadline-seconds=3", "--mover-memory-limit=768Mi"]);
    // No pod runner: the Job's pod stays Pending, as with an image that cannot be pulled.
    create_backup(&setup.namespace, "stuck").await;
    let backups = setup.namespace.api::<Backup>();
    let failed = await_condition(&backups, "stuck", "Failed", TIMEOUT, |backup: &Backup| {
        backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Failed)
    })
    .await;
    let ready = failed
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready.reason, "JobFailed", "{ready:?}");
    assert!(
        ready.message.contains("DeadlineExceeded"),
        "{}",
        ready.message
    );

    // The Job had the deadline and the resources it was given.
    let jobs = setup.namespace.api::<k8s_openapi::api::batch::v1::Job>();
    let job = jobs
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .pop()
        .expect("the backup Job");
    let spec = job.spec.unwrap();
    assert_eq!(spec.active_deadline_seconds, Some(3));
    let resources = spec.template.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap();
    assert_eq!(resources.limits.unwrap()["memory"].0, "768Mi");

    // The Cluster is free: its Lease names no running Backup.
    scenario::lease_free(&setup.namespace, "orders", TIMEOUT).await;
    setup.finish().await;
}

#[tokio::test]
async fn a_pod_custody_did_not_create_cannot_forge_the_movers_result() {
    let setup = setup("forged").await;
    let namespace = &setup.namespace;
    let created = create_backup(namespace, "genuine").await;
    let uid = created.metadata.uid.clone().unwrap();
    let job = custody_controller::backups::decide::job_name("genuine", &uid);
    // A pod anyone with pod create rights can make: the Job's name label, a name sorting after
    // the Job's own pod, and a termination message claiming the upload failed.
    let pods = namespace.api::<k8s_openapi::api::core::v1::Pod>();
    let forged: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{job}-zzzzzz"),
                     "labels": {"job-name": job, "batch.kubernetes.io/job-name": job}},
        "spec": {"containers": [{"name": "mover", "image": "registry.invalid/forged"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &forged).await.unwrap();
    let message = custody_proto::mover::failure_text(
        custody_proto::reasons::MoverFailure::UploadFailed,
        "forged by a pod custody did not create".to_string(),
    );
    pods.patch_status(
        &format!("{job}-zzzzzz"),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "mover", "image": "registry.invalid/forged", "imageID": "",
                                    "ready": false, "restartCount": 0,
                                    "state": {"terminated": {"exitCode": 1, "message": message}}}],
        }})),
    )
    .await
    .unwrap();

    let _runner = setup.run_pods();
    let backups = namespace.api::<Backup>();
    let done = await_condition(&backups, "genuine", "finished", TIMEOUT, |backup| {
        matches!(
            backup.status.as_ref().and_then(|status| status.phase),
            Some(BackupPhase::Completed | BackupPhase::Failed)
        )
    })
    .await;
    let ready = done
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(
        done.status.as_ref().and_then(|status| status.phase),
        Some(BackupPhase::Completed),
        "{ready:?}"
    );
    assert!(!ready.message.contains("did not create"), "{ready:?}");
    let artifact = done.status.unwrap().artifact.unwrap();
    assert!(artifact.manifest_hash.is_some(), "{artifact:?}");
    setup.finish().await;
}

/// Issue 15, item 3: a Job whose pod cannot start says why before its deadline, naming the
/// pod's own reason.
#[tokio::test]
async fn a_backup_whose_image_cannot_be_pulled_says_so_before_its_deadline() {
    let setup = setup("pullfail").await;
    // No pod runner: the node never starts the pod; its kubelet reports the pull failing.
    create_backup(&setup.namespace, "unpullable").await;
    let pods = setup.namespace.api::<k8s_openapi::api::core::v1::Pod>();
    let pod = eventually("the Job's pod", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            pods.list(&kube::api::ListParams::default().labels("custody.io/role"))
                .await
                .map_err(|error| error.to_string())?
                .items
                .into_iter()
                .find(|pod| {
                    pod.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|labels| labels.contains_key("job-name"))
                })
                .ok_or_else(|| "not yet".to_string())
        }
    })
    .await;
    let name = pod.metadata.name.clone().unwrap();
    pods.patch_status(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {
            "phase": "Pending",
            "containerStatuses": [{"name": "mover", "image": "custody-mover:test", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                                      "message": "Back-off pulling image \"custody-mover:test\""}}}],
        }})),
    )
    .await
    .unwrap();
    let backups = setup.namespace.api::<Backup>();
    let stuck = await_condition(
        &backups,
        "unpullable",
        "JobPodNotStarting",
        TIMEOUT,
        |backup: &Backup| {
            backup.conditions().iter().any(|condition| {
                condition.type_ == "Ready" && condition.reason == "JobPodNotStarting"
            })
        },
    )
    .await;
    let ready = stuck
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .cloned()
        .unwrap();
    assert!(
        ready.message.contains(&name) && ready.message.contains("ImagePullBackOff"),
        "{}",
        ready.message
    );
    assert_eq!(
        stuck.status.as_ref().and_then(|status| status.phase),
        Some(BackupPhase::Running)
    );
    let events = setup.namespace.api::<k8s_openapi::api::events::v1::Event>();
    eventually("the Warning", TIMEOUT, || {
        let events = events.clone();
        async move {
            events
                .list(&Default::default())
                .await
                .map_err(|error| error.to_string())?
                .items
                .into_iter()
                .find(|event| {
                    event.type_.as_deref() == Some("Warning")
                        && event.reason.as_deref() == Some("JobPodNotStarting")
                        && event
                            .note
                            .as_deref()
                            .is_some_and(|note| note.contains("ImagePullBackOff"))
                })
                .map(|_| ())
                .ok_or_else(|| "not yet".to_string())
        }
    })
    .await;
    setup.finish().await;
}

/// Issue 24, item 6: `--movers-per-node` bounds custody's movers on a node. With one slot and
/// two Clusters whose pods run on the same node (no Lease between them), the first Backup
/// takes the slot from its start (its Job's pod not running yet), and the second waits
/// `MoverSlotsBusy` naming the node, with no Job, then runs once the first ended.
#[tokio::test]
async fn a_node_runs_no_more_movers_than_its_bound() {
    let mut setup = setup("slots").await;
    setup.start_controller_with(&["--movers-per-node=1"]);
    let namespace = &setup.namespace;
    let node = setup.kubelet.node.clone();
    // A second Cluster, its pod on the same node.
    running_cluster(namespace, &setup.kubelet, "items").await;
    let items = LoopVolume::new(64);
    std::fs::write(items.path().join("rows"), "items").unwrap();

    let backups = namespace.api::<Backup>();
    create_backup_of(namespace, "first", "orders").await;
    await_condition(&backups, "first", "Running", TIMEOUT, |backup| {
        backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Running)
    })
    .await;
    create_backup_of(namespace, "second", "items").await;
    let waiting = await_condition(&backups, "second", "MoverSlotsBusy", TIMEOUT, |backup| {
        backup
            .conditions()
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.reason == "MoverSlotsBusy")
    })
    .await;
    let ready = waiting
        .conditions()
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .unwrap()
        .clone();
    assert!(
        ready.message.contains(&format!("node {node}")) && ready.message.contains("at most 1"),
        "{}",
        ready.message
    );
    assert_eq!(
        waiting.status.as_ref().and_then(|status| status.phase),
        Some(BackupPhase::Pending)
    );
    // It keeps waiting past its next look while the first's pod has not run: one Job only.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let jobs = namespace.api::<Job>();
    let names: Vec<String> = jobs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|job| job.metadata.name)
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("first-backup-"), "{names:?}");

    // The node runs pods: the first ends, the second gets its slot and ends too.
    let runner = PodRunner::start(
        &namespace.client,
        &namespace.name,
        &node,
        BTreeMap::from([
            (
                "data-orders-0".to_string(),
                setup.volume.path().to_path_buf(),
            ),
            ("data-items-0".to_string(), items.path().to_path_buf()),
        ]),
    );
    for name in ["first", "second"] {
        await_condition(&backups, name, "Completed", TIMEOUT, |backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed)
        })
        .await;
    }
    let first = backups.get("first").await.unwrap().status.unwrap();
    let second = backups.get("second").await.unwrap().status.unwrap();
    assert!(
        first.completion_time.unwrap().0 <= second.start_time.unwrap().0,
        "the second started only once the first had ended"
    );
    assert_eq!(runner.started.lock().unwrap().len(), 2);
    drop(runner);
    setup.finish().await;
}
