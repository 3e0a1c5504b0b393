//! Verified restore end to end: the real controller (reconcilers and admission webhook over
//! TLS, called by the real API server), the real kube-controller-manager (StatefulSet, Job and
//! volume-binding controllers) and kube-scheduler, the real agent and `custody-wait` over real
//! gRPC, the real `custody-mover` against the real S3 server, real ext4 volumes. The fake
//! kubelet only mounts volumes, runs the workspace binaries a pod names, and reports status.

use std::time::Duration;

use custody_kube::api::{
    BackupRepository, Cluster, ClusterPhase, HasConditions, NodeAgent, Restore, RestorePhase,
    VolumeState,
};
use custody_proto::names;
use custody_tests::scenario::{
    Setup, artifact_of, create, lease_free, restore_into, setup, setup_as_deployed,
};
use custody_tests::volumes::{LoopVolume, inodes, tree};
use custody_tests::workloads::WorkloadRunner;
use custody_tests::{await_condition, eventually, s3};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

fn phase_of(cluster: &Cluster) -> Option<ClusterPhase> {
    cluster.status.as_ref().and_then(|status| status.phase)
}

fn restore_phase(restore: &Restore) -> Option<RestorePhase> {
    restore.status.as_ref().and_then(|status| status.phase)
}

async fn events_of(setup: &Setup, kind: &str, name: &str) -> Vec<(String, String, String)> {
    let events: Api<Event> = setup.namespace.api();
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| {
            event.involved_object.kind.as_deref() == Some(kind)
                && event.involved_object.name.as_deref() == Some(name)
        })
        .map(|event| {
            (
                event.type_.unwrap_or_default(),
                event.reason.unwrap_or_default(),
                event.message.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits for an Event on `kind`/`name` that `wanted` accepts (Events are published after the
/// status they explain).
async fn await_event(
    setup: &Setup,
    kind: &str,
    name: &str,
    wanted: impl Fn(&(String, String, String)) -> bool,
) {
    eventually(&format!("an Event on {kind} {name}"), TIMEOUT, || async {
        let events = events_of(setup, kind, name).await;
        if events.iter().any(&wanted) {
            Ok(())
        } else {
            Err(format!("{events:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn a_restored_cluster_runs_only_once_every_volume_is_verified() {
    restores_and_releases(setup("restore").await).await;
}

/// Held by the two tests below, one at a time: the first makes `deploy/`'s webhook configuration
/// `custody-restore-gate` calling its controller by URL, and the second's dry run of `deploy/`
/// (by Service) merged into it is refused ("exactly one of url or service is required").
static DEPLOY_NAMES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The same with the controller and the agent running as `deploy/`'s ServiceAccounts, with
/// only the RBAC the manifests grant: a missing rule fails this test.
#[tokio::test]
async fn the_deployed_rbac_is_enough_for_a_verified_restore() {
    let _names = DEPLOY_NAMES.lock().await;
    restores_and_releases(setup_as_deployed("rbac").await).await;
}

#[tokio::test]
async fn the_deploy_manifests_are_accepted_by_the_api_server() {
    let _names = DEPLOY_NAMES.lock().await;
    custody_tests::control_plane();
    // The manifests' namespace, so that the dry run can place its objects (it may exist).
    let _ = custody_tests::kubectl(&["create", "namespace", "custody-system"]);
    let root = custody_tests::repo_root().join("deploy");
    let output =
        custody_tests::kubectl(&["apply", "--dry-run=server", "-k", root.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for object in [
        "deployment.apps/custody-controller",
        "daemonset.apps/custody-agent",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/custody-restore-gate",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/custody-requester-check",
        "clusterrole.rbac.authorization.k8s.io/custody-controller",
        "clusterrole.rbac.authorization.k8s.io/custody-agent",
    ] {
        assert!(text.contains(object), "{object} missing:\n{text}");
    }
}

async fn restores_and_releases(setup: Setup) {
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let target = LoopVolume::new(64);
    // The pods of the restore's Jobs are not run yet: everything must wait for them.
    setup.jobs.set_running(false);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());

    // The pod was admitted with custody-wait first and the readiness gate.
    let pods: Api<Pod> = setup.namespace.api();
    let pod = await_condition(
        &pods,
        "shop-0",
        "scheduled on the node",
        TIMEOUT,
        |pod: &Pod| {
            pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
                == Some(setup.kubelet.node.as_str())
        },
    )
    .await;
    let spec = pod.spec.clone().unwrap();
    assert_eq!(
        spec.init_containers.as_ref().unwrap()[0].name,
        "custody-wait"
    );
    assert_eq!(
        spec.readiness_gates.as_ref().unwrap()[0].condition_type,
        "custody.io/restore-verified"
    );
    let restores: Api<Restore> = setup.namespace.api();
    let restore = restores.get("shop").await.unwrap();
    assert_eq!(
        pod.labels().get(names::LABEL_RESTORE_UID),
        restore.metadata.uid.as_ref()
    );

    // The agent reports the volume; the controller creates the Job pinned to that node.
    let jobs: Api<Job> = setup.namespace.api();
    let job_name = eventually("the prepareData Job", TIMEOUT, || {
        let jobs = jobs.clone();
        async move {
            let listed = jobs
                .list(&ListParams::default().labels(&format!(
                    "{}={}",
                    names::LABEL_ROLE,
                    names::ROLE_PREPARE_DATA
                )))
                .await
                .map_err(|e| e.to_string())?;
            listed
                .items
                .first()
                .and_then(|job| job.metadata.name.clone())
                .ok_or_else(|| "no Job".to_string())
        }
    })
    .await;
    let job = jobs.get(&job_name).await.unwrap();
    let template = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        template.node_name.as_deref(),
        Some(setup.kubelet.node.as_str())
    );

    // While the prepareData Job has not run: the pod is held, the Cluster is not Running.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let clusters: Api<Cluster> = setup.namespace.api();
    let cluster = clusters.get("shop").await.unwrap();
    assert_eq!(
        phase_of(&cluster),
        Some(ClusterPhase::Restoring),
        "{:?}",
        cluster.status
    );
    assert!(
        cluster
            .finalizers()
            .iter()
            .any(|f| f == "custody.io/restore-protection")
    );
    let pod = pods.get("shop-0").await.unwrap();
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert!(
        !workloads
            .runs()
            .iter()
            .any(|run| run.container == "custody-wait" && run.exit_code == 0),
        "custody-wait exited: {:?}",
        workloads.runs()
    );
    let restore = restores.get("shop").await.unwrap();
    assert_eq!(restore_phase(&restore), Some(RestorePhase::Running));
    assert_eq!(
        restore.status.as_ref().unwrap().progress.as_deref(),
        Some("0/1 verified")
    );

    // Now the kubelet runs the Job's pod: restore, verification, release.
    setup.jobs.set_running(true);
    let done = await_condition(
        &restores,
        "shop",
        "Completed",
        TIMEOUT,
        |restore: &Restore| restore_phase(restore) == Some(RestorePhase::Completed),
    )
    .await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.progress.as_deref(), Some("1/1 verified"));
    assert_eq!(status.volumes[0].state, VolumeState::Verified);
    assert_eq!(
        status.volumes[0].node_name.as_deref(),
        Some(setup.kubelet.node.as_str())
    );
    let cluster = await_condition(
        &clusters,
        "shop",
        "Running",
        TIMEOUT,
        |cluster: &Cluster| phase_of(cluster) == Some(ClusterPhase::Running),
    )
    .await;
    for kind in ["Restored", "Ready"] {
        let condition = cluster
            .conditions()
            .iter()
            .find(|c| c.type_ == kind)
            .unwrap();
        assert_eq!(condition.status, "True", "{kind}: {condition:?}");
    }
    let released = workloads
        .runs()
        .into_iter()
        .find(|run| run.container == "custody-wait" && run.exit_code == 0)
        .expect("custody-wait released");
    assert!(released.output.contains("released"), "{}", released.output);
    let pod = pods.get("shop-0").await.unwrap();
    let gate = pod
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "custody.io/restore-verified")
        .unwrap();
    assert_eq!(gate.status, "True");

    // The restored volume is the backed-up one, byte for byte.
    assert_eq!(tree(target.path()), tree(setup.source.path()));
    await_event(&setup, "Restore", "shop", |(_, reason, _)| {
        reason == "VolumeVerified"
    })
    .await;
    let agents: Api<NodeAgent> = Api::all(client.clone());
    let agent = agents.get(&setup.kubelet.node).await.unwrap();
    assert_eq!(agent.status.unwrap().volumes.unwrap().verified, 1);
    drop(workloads);
    setup.finish().await;
}

/// Waits until the Restore failed, and returns it.
async fn failed_restore(setup: &Setup) -> Restore {
    await_condition(
        &setup.namespace.api::<Restore>(),
        "shop",
        "Failed",
        TIMEOUT,
        |restore: &Restore| restore_phase(restore) == Some(RestorePhase::Failed),
    )
    .await
}

/// The pod is still held: custody-wait never exited 0, the pod is not Running, the Cluster is
/// Failed with the reason.
async fn assert_held(setup: &Setup, workloads: &WorkloadRunner, reason: &str) {
    // Give a wrong release the time it would need to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !workloads
            .runs()
            .iter()
            .any(|run| run.container == "custody-wait" && run.exit_code == 0),
        "custody-wait released: {:?}",
        workloads.runs()
    );
    let pod = setup.namespace.api::<Pod>().get("shop-0").await.unwrap();
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    let cluster = await_condition(
        &setup.namespace.api::<Cluster>(),
        "shop",
        "Failed",
        TIMEOUT,
        |cluster: &Cluster| phase_of(cluster) == Some(ClusterPhase::Failed),
    )
    .await;
    let ready = cluster
        .conditions()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains(reason), "{ready:?}");
}

#[tokio::test]
async fn a_volume_changed_between_write_and_verification_fails_and_the_pod_stays_gated() {
    let setup = setup("tamper").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    // The volume is changed after the mover wrote it, before the agent verifies it.
    setup.jobs.set_tamper(|_claim, volume| {
        let file = volume.join("base/16384/0042");
        if file.exists() {
            let mut bytes = std::fs::read(&file).unwrap();
            bytes[0] ^= 0x01;
            std::fs::write(&file, bytes).unwrap();
        }
    });
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let failed = failed_restore(&setup).await;
    let volume = &failed.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Failed);
    assert_eq!(
        volume.reason.as_deref(),
        Some("ContentMismatch"),
        "{volume:?}"
    );
    assert!(
        volume
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("base/16384/0042"),
        "{volume:?}"
    );
    let ready = failed
        .conditions()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "ContentMismatch");
    await_event(&setup, "Restore", "shop", |(kind, reason, message)| {
        kind == "Warning" && reason == "ContentMismatch" && message.contains("base/16384/0042")
    })
    .await;
    assert_held(&setup, &workloads, "ContentMismatch").await;
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn a_volume_swapped_for_an_empty_one_mid_restore_fails_and_no_empty_database_starts() {
    let setup = setup("swap").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    setup.jobs.set_running(false);
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    // The Job exists; before its pod writes, the pod's volume is swapped for an empty one
    // (the helper volume deleted and replaced under the restore).
    let jobs: Api<Job> = setup.namespace.api();
    eventually("the prepareData Job", TIMEOUT, || {
        let jobs = jobs.clone();
        async move {
            let listed = jobs
                .list(&ListParams::default().labels(&format!(
                    "{}={}",
                    names::LABEL_ROLE,
                    names::ROLE_PREPARE_DATA
                )))
                .await
                .map_err(|e| e.to_string())?;
            if listed.items.is_empty() {
                Err("no Job".to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
    let mounted = eventually("the pod's volume mounted", TIMEOUT, || {
        let found = workloads.mount_of("shop-0", "data-shop-0");
        async move { found.ok_or_else(|| "not mounted".to_string()) }
    })
    .await;
    let empty = LoopVolume::new(16);
    setup.kubelet.unbind(&mounted);
    setup.kubelet.bind(empty.path(), &mounted);
    setup.jobs.set_running(true);

    let failed = failed_restore(&setup).await;
    let volume = &failed.status.as_ref().unwrap().volumes[0];
    assert_eq!(
        volume.reason.as_deref(),
        Some("ManifestMissing"),
        "{volume:?}"
    );
    assert_held(&setup, &workloads, "ManifestMissing").await;
    setup.kubelet.unbind(&mounted);
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn a_restore_into_a_volume_that_holds_data_is_refused_and_nothing_is_lost() {
    let setup = setup("refuse").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    // The target already holds data: the mover refuses to write over it.
    let target = LoopVolume::new(64);
    std::fs::write(target.path().join("PG_VERSION"), "16").unwrap();
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let failed = failed_restore(&setup).await;
    let volume = &failed.status.as_ref().unwrap().volumes[0];
    let message = volume.message.clone().unwrap_or_default();
    assert!(
        message.contains("not empty") && message.contains("PG_VERSION"),
        "{volume:?}"
    );
    assert_held(&setup, &workloads, "not empty").await;
    assert_eq!(
        std::fs::read_to_string(target.path().join("PG_VERSION")).unwrap(),
        "16",
        "nothing lost"
    );
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn a_corrupted_artifact_fails_the_restore() {
    let setup = setup("corrupt").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    // Somebody rewrote the data object in the bucket after the backup.
    let artifact = artifact_of(&setup.namespace, "nightly").await;
    let repository = setup
        .namespace
        .api::<BackupRepository>()
        .get("store")
        .await
        .unwrap();
    let forged = {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(5);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, "base/16384/0001", &b"evil\n"[..])
            .unwrap();
        zstd::encode_all(&builder.into_inner().unwrap()[..], 3).unwrap()
    };
    s3::put(s3::shared(), &repository.spec.bucket, &artifact.key, forged).await;
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let failed = failed_restore(&setup).await;
    let volume = &failed.status.as_ref().unwrap().volumes[0];
    assert!(
        volume
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("base/16384/0001"),
        "{volume:?}"
    );
    assert_held(&setup, &workloads, "claim data-shop-0").await;
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn cancelling_a_restore_tears_down_only_what_custody_created() {
    let setup = setup("cancel").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    setup.jobs.set_running(false);
    let target = LoopVolume::new(64);
    // An unknown custody.io annotation is reported, never ignored.
    restore_into(
        &setup,
        target.path(),
        json!({"custody.io/restore-from-snapshot": "yes"}),
    )
    .await;
    let clusters: Api<Cluster> = setup.namespace.api();
    let cluster = await_condition(
        &clusters,
        "shop",
        "the annotation reported",
        TIMEOUT,
        |cluster: &Cluster| {
            cluster
                .conditions()
                .iter()
                .any(|c| c.type_ == "AnnotationsRecognized" && c.status == "False")
        },
    )
    .await;
    let condition = cluster
        .conditions()
        .iter()
        .find(|c| c.type_ == "AnnotationsRecognized")
        .unwrap();
    assert!(
        condition
            .message
            .contains("custody.io/restore-from-snapshot"),
        "{condition:?}"
    );
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());

    let restores: Api<Restore> = setup.namespace.api();
    let restore = restores.get("shop").await.unwrap();
    let restore_uid = restore.metadata.uid.clone().unwrap();
    let jobs: Api<Job> = setup.namespace.api();
    let ours = eventually("the prepareData Job", TIMEOUT, || {
        let jobs = jobs.clone();
        async move {
            let listed = jobs
                .list(&ListParams::default().labels(&format!(
                    "{}={}",
                    names::LABEL_ROLE,
                    names::ROLE_PREPARE_DATA
                )))
                .await
                .map_err(|e| e.to_string())?;
            listed
                .items
                .first()
                .and_then(|job| job.metadata.name.clone())
                .ok_or_else(|| "no Job".to_string())
        }
    })
    .await;
    // A look-alike: the same labels, but nobody's owner reference.
    create::<Job>(&jobs, json!({
        "metadata": {"name": "look-alike", "labels": {names::LABEL_ROLE: names::ROLE_PREPARE_DATA, names::LABEL_RESTORE_UID: restore_uid}},
        "spec": {"suspend": true, "template": {"metadata": {"labels": {names::LABEL_ROLE: names::ROLE_PREPARE_DATA, names::LABEL_RESTORE_UID: restore_uid}},
                 "spec": {"restartPolicy": "Never", "containers": [{"name": "x", "image": "registry.invalid/x"}]}}},
    }))
    .await;
    // The claim being deleted is not a cancellation.
    let claims: Api<PersistentVolumeClaim> = setup.namespace.api();
    claims
        .delete("data-shop-0", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        restores
            .get_opt("shop")
            .await
            .unwrap()
            .is_some_and(|r| r.metadata.deletion_timestamp.is_none())
    );
    assert!(
        jobs.get_opt(&ours)
            .await
            .unwrap()
            .is_some_and(|j| j.metadata.deletion_timestamp.is_none())
    );

    // Deleting the Cluster cancels.
    clusters
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Cluster gone", TIMEOUT, || {
        let clusters = clusters.clone();
        async move {
            match clusters.get_opt("shop").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(cluster) => Err(format!("finalizers {:?}", cluster.finalizers())),
            }
        }
    })
    .await;
    assert!(
        restores.get_opt("shop").await.unwrap().is_none(),
        "the Restore is gone"
    );
    assert!(
        jobs.get_opt(&ours).await.unwrap().is_none(),
        "its Job is gone"
    );
    let pods: Api<Pod> = setup.namespace.api();
    let left = pods
        .list(&ListParams::default().labels(&format!("job-name={ours}")))
        .await
        .unwrap()
        .items;
    assert!(left.is_empty(), "its pods are gone: {left:?}");
    assert!(
        jobs.get_opt("look-alike").await.unwrap().is_some(),
        "the look-alike Job survives"
    );
    let sets: Api<StatefulSet> = setup.namespace.api();
    assert!(
        sets.get_opt("shop").await.unwrap().is_some(),
        "the StatefulSet is the user's"
    );
    await_event(&setup, "Cluster", "shop", |(_, reason, _)| {
        reason == "RestoreCancelled"
    })
    .await;
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn a_job_deleted_by_someone_else_is_recreated_a_bounded_number_of_times_then_fails() {
    let setup = setup("recreate").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    setup.jobs.set_running(false);
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let jobs: Api<Job> = setup.namespace.api();
    let mut deleted = Vec::new();
    for attempt in 1..=3 {
        let name = eventually(&format!("Job attempt {attempt}"), TIMEOUT, || {
            let jobs = jobs.clone();
            let deleted = deleted.clone();
            async move {
                let listed = jobs
                    .list(&ListParams::default().labels(&format!(
                        "{}={}",
                        names::LABEL_ROLE,
                        names::ROLE_PREPARE_DATA
                    )))
                    .await
                    .map_err(|e| e.to_string())?;
                listed
                    .items
                    .iter()
                    .filter_map(|job| job.metadata.name.clone())
                    .find(|name| !deleted.contains(name))
                    .ok_or_else(|| format!("none new; deleted {deleted:?}"))
            }
        })
        .await;
        assert!(name.ends_with(&format!("-{attempt}")), "{name}");
        // As `kubectl delete job` does: the Job goes at once, its pods after.
        jobs.delete(&name, &DeleteParams::background())
            .await
            .unwrap();
        deleted.push(name);
    }
    let failed = failed_restore(&setup).await;
    let volume = &failed.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.reason.as_deref(), Some("JobDeleted"), "{volume:?}");
    assert_eq!(volume.attempts, 3);
    // (Repeated Events are aggregated into one series by the recorder.)
    await_event(&setup, "Restore", "shop", |(kind, reason, _)| {
        kind == "Warning" && reason == "JobRecreated"
    })
    .await;
    await_event(&setup, "Restore", "shop", |(kind, reason, _)| {
        kind == "Warning" && reason == "JobDeleted"
    })
    .await;
    assert_held(&setup, &workloads, "JobDeleted").await;
    drop(workloads);
    setup.finish().await;
}

#[tokio::test]
async fn the_webhook_certificate_is_renewed_under_the_same_ca_and_the_api_server_still_trusts_it() {
    let setup = setup("rotate").await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = setup.namespace.api();
    let data = |secret: &k8s_openapi::api::core::v1::Secret, key: &str| {
        secret.data.as_ref().unwrap()[key].0.clone()
    };
    let before = secrets.get("custody-webhook-tls").await.unwrap();
    // Due for renewal: it expires now.
    let now = k8s_openapi::jiff::Timestamp::now().as_second().to_string();
    secrets
        .patch(
            "custody-webhook-tls",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"custody.io/not-after": now}}}),
            ),
        )
        .await
        .unwrap();
    let after = eventually("a renewed certificate", TIMEOUT, || {
        let secrets = secrets.clone();
        let old = data(&before, "tls.crt");
        async move {
            let current = secrets
                .get("custody-webhook-tls")
                .await
                .map_err(|e| e.to_string())?;
            if current.data.as_ref().unwrap()["tls.crt"].0 != old {
                Ok(current)
            } else {
                Err("unchanged".to_string())
            }
        }
    })
    .await;
    assert_eq!(
        data(&after, "ca.crt"),
        data(&before, "ca.crt"),
        "the CA stays"
    );
    assert_ne!(
        data(&after, "tls.key"),
        data(&before, "tls.key"),
        "a new key"
    );
    setup
        .controller
        .logs
        .await_line("webhook certificate rotated", TIMEOUT);
    // The API server calls the webhook (failurePolicy Fail) and trusts the new certificate.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pod = custody_tests::kubelet::create_pod(
        &setup.namespace.client,
        &setup.namespace.name,
        custody_tests::kubelet::PodSpec {
            name: "orders-1",
            node: &setup.kubelet.node,
            service_account: "orders",
            labels: json!({"custody.io/cluster": "orders"}),
            ..Default::default()
        },
    )
    .await;
    assert!(pod.metadata.uid.is_some());
    setup.finish().await;
}

/// Restores the scenario's Backup into `target` with a workload runner for the pods, until
/// the Restore is Completed.
async fn restored(setup: &Setup, target: &LoopVolume) -> WorkloadRunner {
    restore_into(setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(
        &setup.namespace.client,
        &setup.namespace.name,
        setup.kubelet.clone(),
    );
    await_condition(
        &setup.namespace.api::<Restore>(),
        "shop",
        "Completed",
        TIMEOUT,
        |restore: &Restore| restore_phase(restore) == Some(RestorePhase::Completed),
    )
    .await;
    workloads
}

/// The sum of the samples of counter `name` (every label set) in a metrics page.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The agent's count of verifications it finished, of any result.
fn verifications_finished(metrics: &str) -> u64 {
    counter(metrics, "custody_agent_verifications_total")
}

/// Issue 15, item 1: once the Restore recorded a volume as verified, its pod is released on
/// every later start — after the application changed the volume, the agent restarted and
/// the prepareData Job and its pods are gone — without the volume being read again, and the
/// node never reports it as failed.
#[tokio::test]
async fn a_completed_restore_never_holds_its_pod_again() {
    let mut setup = setup("again").await;
    let client = setup.namespace.client.clone();
    let target = LoopVolume::new(64);
    let workloads = restored(&setup, &target).await;
    let restores: Api<Restore> = setup.namespace.api();
    eventually("custody-wait released the pod", TIMEOUT, || {
        let runs = workloads.runs();
        async move {
            runs.iter()
                .any(|run| run.container == "custody-wait" && run.exit_code == 0)
                .then_some(())
                .ok_or_else(|| format!("{runs:?}"))
        }
    })
    .await;

    // The completed restore cleans up its prepareData Jobs, and with them their pods.
    let jobs: Api<Job> = setup.namespace.api();
    let pods: Api<Pod> = setup.namespace.api();
    let prepare_data = format!("{}={}", names::LABEL_ROLE, names::ROLE_PREPARE_DATA);
    eventually("the prepareData Job and its pod gone", TIMEOUT, || {
        let (jobs, pods, selector) = (jobs.clone(), pods.clone(), prepare_data.clone());
        async move {
            let params = ListParams::default().labels(&selector);
            let left = jobs
                .list(&params)
                .await
                .map_err(|e| e.to_string())?
                .items
                .len()
                + pods
                    .list(&params)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len();
            (left == 0)
                .then_some(())
                .ok_or_else(|| format!("{left} left"))
        }
    })
    .await;

    // The database writes: the volume no longer matches the backup's manifest.
    std::fs::write(target.path().join("written-after-the-restore"), b"new rows").unwrap();
    std::fs::write(
        target.path().join("base/16384/0001"),
        b"changed by the application",
    )
    .unwrap();

    // A DaemonSet rollout: the agent starts again with nothing in memory.
    setup.restart_agent(&[], vec![]);
    // The pod's sandbox restarts: its init container asks the gate again, with its own token.
    let pod = pods.get("shop-0").await.unwrap();
    let token = custody_tests::kubelet::pod_token(&client, &pod, names::GATE_AUDIENCE).await;
    let mut wait = custody_tests::agent::WaitProcess::start(&setup.agent, &setup.pki, &token);
    let exit = wait.await_exit(Duration::from_secs(30));
    assert!(
        exit.success(),
        "custody-wait held a restored pod: {:?}",
        wait.output.all()
    );
    wait.output.await_line("released", Duration::from_secs(10));
    // Nothing was read again, and the node reports the volume verified, never failed.
    assert_eq!(verifications_finished(&setup.agent.metrics()), 0);
    let agents: Api<NodeAgent> = Api::all(client.clone());
    let node = setup.kubelet.node.clone();
    let agent = node_counts(&agents, &node, "the volume reported verified", |volumes| {
        volumes.verified == 1
    })
    .await;
    assert_eq!(agent.status.unwrap().volumes.unwrap().failed, 0);
    let restore = restores.get("shop").await.unwrap();
    assert_eq!(restore_phase(&restore), Some(RestorePhase::Completed));
    drop(workloads);
    setup.finish().await;
}

/// Issue 15, item 2: what a held pod waits for comes from its spec (`custody-wait`'s
/// environment, which cannot change), so removing its restore labels and annotations with a
/// patch does not release it; it is released once its volume is verified, as ever.
#[tokio::test]
async fn removing_the_restore_labels_and_annotations_does_not_release_a_held_pod() {
    let setup = setup("strip").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let target = LoopVolume::new(64);
    setup.jobs.set_running(false);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let pods: Api<Pod> = setup.namespace.api();
    await_condition(&pods, "shop-0", "scheduled", TIMEOUT, |pod: &Pod| {
        pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
            == Some(setup.kubelet.node.as_str())
    })
    .await;
    let patch = json!({"metadata": {
        "labels": {names::LABEL_RESTORE_UID: null},
        "annotations": {names::ANNOTATION_RESTORE: null, names::ANNOTATION_RESTORED_CLAIMS: null},
    }});
    let stripped = pods
        .patch(
            "shop-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    assert!(!stripped.labels().contains_key(names::LABEL_RESTORE_UID));
    assert!(
        !stripped
            .annotations()
            .contains_key(names::ANNOTATION_RESTORED_CLAIMS)
    );

    // The gate still holds the pod on its claim; custody-wait has not let it start.
    let token = custody_tests::kubelet::pod_token(&client, &stripped, names::GATE_AUDIENCE).await;
    let answer = eventually("the gate's answer for the stripped pod", TIMEOUT, || {
        let (gate, pki, token) = (setup.agent.gate, &setup.pki, token.clone());
        async move {
            custody_tests::agent::ask_gate(gate, pki, Some(&token))
                .await
                .map_err(|status| status.to_string())
        }
    })
    .await;
    assert!(!answer.released, "{answer:?}");
    assert_eq!(
        answer
            .volumes
            .iter()
            .map(|volume| volume.claim_name.as_str())
            .collect::<Vec<_>>(),
        ["data-shop-0"]
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !workloads
            .runs()
            .iter()
            .any(|run| run.container == "custody-wait" && run.exit_code == 0),
        "custody-wait released a pod whose volume was never written: {:?}",
        workloads.runs()
    );

    // The restore goes on as ever: written, verified, released, the readiness gate set.
    setup.jobs.set_running(true);
    let restores: Api<Restore> = setup.namespace.api();
    await_condition(
        &restores,
        "shop",
        "Completed",
        TIMEOUT,
        |restore: &Restore| restore_phase(restore) == Some(RestorePhase::Completed),
    )
    .await;
    await_condition(
        &pods,
        "shop-0",
        "the readiness gate set",
        TIMEOUT,
        |pod: &Pod| {
            pod.status
                .as_ref()
                .and_then(|status| status.conditions.as_ref())
                .is_some_and(|conditions| {
                    conditions.iter().any(|condition| {
                        condition.type_ == "custody.io/restore-verified"
                            && condition.status == "True"
                    })
                })
        },
    )
    .await;
    drop(workloads);
    setup.finish().await;
}

/// Issue 15, item 2: a pod labelled with a Cluster that does not exist is refused, saying so;
/// once a restore verified its claims, an application whose Cluster is deleted on purpose
/// still recreates its pods (its claims are marked as holding known data).
#[tokio::test]
async fn a_pod_of_a_cluster_that_does_not_exist_is_refused_unless_its_claims_hold_known_data() {
    let setup = setup("ghost").await;
    let pods: Api<Pod> = setup.namespace.api();

    let ghost: Pod = serde_json::from_value(json!({
        "metadata": {"name": "ghost-0", "labels": {names::LABEL_CLUSTER: "ghost"}},
        "spec": {"containers": [{"name": "db", "image": "registry.invalid/db:16"}]},
    }))
    .unwrap();
    let refused = pods
        .create(&kube::api::PostParams::default(), &ghost)
        .await
        .expect_err("a pod of a Cluster that does not exist was admitted");
    let message = refused.to_string();
    assert!(
        message.contains("Cluster ghost does not exist"),
        "{message}"
    );
    assert!(message.contains("custody.io/cluster=ghost"), "{message}");

    let target = LoopVolume::new(64);
    let workloads = restored(&setup, &target).await;
    let restores: Api<Restore> = setup.namespace.api();
    let claims: Api<PersistentVolumeClaim> = setup.namespace.api();
    let claim = await_condition(
        &claims,
        "data-shop-0",
        "marked as known data",
        TIMEOUT,
        |claim: &PersistentVolumeClaim| {
            claim
                .annotations()
                .contains_key(names::ANNOTATION_KNOWN_DATA)
        },
    )
    .await;
    let restore_uid = restores.get("shop").await.unwrap().metadata.uid.unwrap();
    assert!(claim.annotations()[names::ANNOTATION_KNOWN_DATA].contains(&restore_uid));

    // The Cluster is deleted on purpose; the StatefulSet stays and its pod is recreated.
    let clusters: Api<Cluster> = setup.namespace.api();
    clusters
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Cluster gone", TIMEOUT, || {
        let clusters = clusters.clone();
        async move {
            match clusters.get_opt("shop").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            }
        }
    })
    .await;
    let old = pods.get("shop-0").await.unwrap();
    pods.delete("shop-0", &DeleteParams::default())
        .await
        .unwrap();
    custody_tests::kubelet::finish_deletion(&pods, &old).await;
    let recreated = await_condition(&pods, "shop-0", "recreated", TIMEOUT, |pod: &Pod| {
        pod.metadata.uid != old.metadata.uid
    })
    .await;
    assert!(
        recreated
            .spec
            .unwrap()
            .init_containers
            .unwrap_or_default()
            .iter()
            .all(|container| container.name != names::WAIT_CONTAINER),
        "no restore is left to hold the pod for"
    );
    drop(workloads);
    setup.finish().await;
}

/// Cluster `shop` restored onto node `<namespace>-b`, where no agent runs: its node, target
/// volume, and the Restore once its volume waits with `AgentMissing`.
async fn restore_on_a_node_without_an_agent(
    setup: &Setup,
) -> (custody_tests::kubelet::FakeKubelet, LoopVolume, Restore) {
    let node = format!("{}-b", setup.namespace.name);
    let elsewhere = custody_tests::kubelet::FakeKubelet::new(&setup.namespace.client, &node).await;
    let target = LoopVolume::new(64);
    custody_tests::scenario::restore_into_on(setup, &elsewhere, target.path(), json!({})).await;
    let restore = await_condition(
        &setup.namespace.api::<Restore>(),
        "shop",
        "the volume waits for a missing agent",
        TIMEOUT,
        |restore: &Restore| {
            restore.status.as_ref().is_some_and(|status| {
                status
                    .volumes
                    .iter()
                    .any(|volume| volume.reason.as_deref() == Some("AgentMissing"))
            })
        },
    )
    .await;
    (elsewhere, target, restore)
}

/// Issue 15, item 3: a pod scheduled to a node where no custody agent runs stays held (good),
/// and the Restore says so, naming the pod and the node, instead of waiting in silence.
#[tokio::test]
async fn a_pod_on_a_node_without_an_agent_is_named_in_the_restore() {
    let setup = setup("noagent").await;
    let (elsewhere, _target, restore) = restore_on_a_node_without_an_agent(&setup).await;
    let node = elsewhere.node.clone();
    let status = restore.status.unwrap();
    let message = status.volumes[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("shop-0") && message.contains(&node),
        "{message}"
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "AgentMissing", "{ready:?}");
    await_event(&setup, "Restore", "shop", |(kind, reason, note)| {
        kind == "Warning" && reason == "AgentMissing" && note.contains(&node)
    })
    .await;
    // Nothing was started for it.
    let jobs: Api<Job> = setup.namespace.api();
    let prepare_data = format!("{}={}", names::LABEL_ROLE, names::ROLE_PREPARE_DATA);
    let started = jobs
        .list(&ListParams::default().labels(&prepare_data))
        .await
        .unwrap()
        .items;
    assert!(started.is_empty(), "{started:?}");
    elsewhere.delete().await;
    setup.finish().await;
}

/// Issue 24, item 4: a volume that waits with no progress (here its pod is on a node where no
/// agent reports, so it can never be verified) fails the Restore at its
/// `progressDeadlineSeconds`, naming the volume and what it waited for, and frees the Cluster's
/// Lease, instead of holding the Cluster's Backups back for good. The pod stays held.
#[tokio::test]
async fn a_restore_that_makes_no_progress_fails_at_its_progress_deadline_naming_the_wait() {
    let setup = setup("rprogress").await;
    let (elsewhere, _target, _) = restore_on_a_node_without_an_agent(&setup).await;
    let restores = setup.namespace.api::<Restore>();
    let started = std::time::Instant::now();
    restores
        .patch(
            "shop",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"progressDeadlineSeconds": 10}})),
        )
        .await
        .unwrap();
    let failed =
        custody_tests::scenario::restore_reaches(&setup.namespace, "shop", RestorePhase::Failed)
            .await;
    let took = started.elapsed();
    let volume = &failed.status.as_ref().unwrap().volumes[0];
    assert_eq!(
        volume.reason.as_deref(),
        Some("ProgressDeadlineExceeded"),
        "{volume:?}"
    );
    let message = volume.message.clone().unwrap_or_default();
    assert!(
        message.contains("data-shop-0")
            && message.contains("(10s)")
            && message.contains(&elsewhere.node)
            && message.contains("no custody agent reports"),
        "{message}"
    );
    assert!(took < Duration::from_secs(40), "failed after {took:?}");
    let ready = failed
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready.reason, "ProgressDeadlineExceeded", "{ready:?}");
    await_event(&setup, "Restore", "shop", |(kind, reason, note)| {
        kind == "Warning" && reason == "ProgressDeadlineExceeded" && note.contains("data-shop-0")
    })
    .await;
    eprintln!("no progress, deadline 10 s: the Restore failed {took:?} after the deadline was set");
    elsewhere.delete().await;
    setup.finish().await;
}

/// Issue 15, item 5: a node's agent may only speak for pods on its own node. Node a's agent
/// token reports Verified for a pod on node b (where no agent runs, so nothing was restored):
/// the controller records what node a said, but the Restore and the pod take nothing from it.
#[tokio::test]
async fn a_nodes_report_about_a_pod_on_another_node_changes_nothing() {
    let mut setup = setup("otherreport").await;
    let client = setup.namespace.client.clone();
    let (elsewhere, _target, restore) = restore_on_a_node_without_an_agent(&setup).await;
    let node_b = elsewhere.node.clone();
    let restores: Api<Restore> = setup.namespace.api();
    let restore_uid = restore.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = setup.namespace.api();
    let pod = pods.get("shop-0").await.unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(node_b.as_str())
    );

    // Node a's own agent stops; its token speaks for it.
    setup.agent.stop();
    let token = std::fs::read_to_string(setup.report_token.path()).unwrap();
    let mut reports = custody_tests::agent::report_client(&setup.controller, &setup.pki.ca()).await;
    let forged = custody_proto::report::NodeReport {
        node_name: setup.kubelet.node.clone(),
        agent_version: "forged".into(),
        volumes: vec![custody_proto::report::VolumeReport {
            namespace: setup.namespace.name.clone(),
            pod_name: "shop-0".into(),
            pod_uid: pod.metadata.uid.clone().unwrap(),
            volume: "data".into(),
            claim_name: "data-shop-0".into(),
            restore_uid,
            state: custody_proto::gate::VolumeState::Verified as i32,
            ..Default::default()
        }],
        ..Default::default()
    };
    let agents: Api<custody_kube::api::NodeAgent> = Api::all(client.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < deadline {
        reports
            .report(custody_tests::agent::report_request(&token, forged.clone()))
            .await
            .expect("node a's agent may report about its own node");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The report was taken as node a's word.
    let recorded = agents.get(&setup.kubelet.node).await.unwrap();
    assert!(
        recorded
            .status
            .as_ref()
            .is_some_and(|status| status.restored_volumes.iter().any(|volume| {
                volume.pod_name == "shop-0"
                    && volume.state == custody_kube::api::VolumeState::Verified
            })),
        "{:?}",
        recorded.status
    );
    // Nothing of it reached the Restore or the pod.
    let restore = restores.get("shop").await.unwrap();
    assert_ne!(
        restore_phase(&restore),
        Some(RestorePhase::Completed),
        "{:?}",
        restore.status
    );
    let status = restore.status.unwrap();
    assert!(
        status
            .volumes
            .iter()
            .all(|volume| volume.state != custody_kube::api::VolumeState::Verified),
        "{:?}",
        status.volumes
    );
    let pod = pods.get("shop-0").await.unwrap();
    let gated = pod
        .status
        .and_then(|status| status.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|condition| {
            condition.type_ == "custody.io/restore-verified" && condition.status == "True"
        });
    assert!(
        !gated,
        "the readiness gate was set from another node's word"
    );
    elsewhere.delete().await;
    setup.finish().await;
}

/// Issue 15, item 5: a restore reads the bucket the Backup recorded, as deleting it does —
/// not wherever the repository points now.
#[tokio::test]
async fn a_restore_reads_the_recorded_bucket_after_the_repository_moved_to_another() {
    let setup = setup("movedbucket").await;
    let recorded = artifact_of(&setup.namespace, "nightly").await;
    let fresh = s3::bucket(s3::shared(), "moved-to").await;
    assert_ne!(fresh, recorded.bucket);
    let repositories: Api<BackupRepository> = setup.namespace.api();
    repositories
        .patch(
            "store",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"bucket": fresh}})),
        )
        .await
        .unwrap();
    await_condition(
        &repositories,
        "store",
        "Ready on the new bucket",
        TIMEOUT,
        |repository: &BackupRepository| {
            repository.conditions().iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "True"
                    && c.observed_generation == repository.metadata.generation
            })
        },
    )
    .await;
    let target = LoopVolume::new(64);
    restore_into(&setup, target.path(), json!({})).await;
    let _workloads = WorkloadRunner::start(
        &setup.namespace.client,
        &setup.namespace.name,
        setup.kubelet.clone(),
    );
    let done = await_condition(
        &setup.namespace.api::<Restore>(),
        "shop",
        "finished",
        TIMEOUT,
        |restore: &Restore| {
            matches!(
                restore_phase(restore),
                Some(RestorePhase::Completed | RestorePhase::Failed)
            )
        },
    )
    .await;
    assert_eq!(
        restore_phase(&done),
        Some(RestorePhase::Completed),
        "{:?}",
        done.status
    );
    setup.finish().await;
}

/// Issue 15, item 3: the agent of the node that wrote a volume goes silent before it verified
/// it, and the workload pod is rescheduled to another node (as with a network volume). The
/// Restore first says `AgentNotReady`, naming the node and its last report, with a Warning;
/// then, the pod on node b, custody runs the next prepareData attempt there: the mover finds
/// this restore's finished output and writes nothing (the files keep their inodes), node b's
/// agent verifies the volume, and the pod is released there. Before, the volume stayed in
/// `Verifying` for good: the Job had succeeded, and no agent could verify it.
///
/// Fake kubelets: a real node cannot move a pod with its volume to a second node here.
#[tokio::test]
async fn a_pod_rescheduled_after_its_volume_was_written_is_verified_on_its_new_node() {
    use custody_tests::agent::{AgentArgs, AgentProcess, report_flags, report_token};
    use custody_tests::kubelet::{FakeKubelet, LOCAL_STORAGE_CLASS, PodRunner};
    use k8s_openapi::api::core::v1::{Node, PersistentVolume};

    let mut setup = setup("moved").await;
    setup.restart_controller_with(&["--agent-timeout-seconds=4"]);
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    let cordon = |node: String, unschedulable: bool| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    &node,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
                )
                .await
                .unwrap();
        }
    };
    let node_a = setup.kubelet.node.clone();
    let node_b = format!("{ns}-b");
    let ip_b = custody_tests::scenario::node_address(&node_b);
    let kubelet_b = std::sync::Arc::new(FakeKubelet::with_address(&client, &node_b, &ip_b).await);
    cordon(node_b.clone(), true).await;

    // One volume both nodes can mount (a network volume's part, played by one directory).
    let target = LoopVolume::new(64);
    create::<PersistentVolume>(
        &Api::all(client.clone()),
        json!({
            "metadata": {"name": format!("{ns}-data-shop-0"), "labels": {"custody.io/test": "true"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": LOCAL_STORAGE_CLASS,
                "local": {"path": target.path().display().to_string()},
                "claimRef": {"namespace": ns, "name": "data-shop-0"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_a, node_b]},
                ]}]}},
            },
        }),
    )
    .await;
    setup.jobs.set_running(false);
    let workloads_a = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    custody_tests::scenario::shop_restored_from_nightly(&setup, json!({})).await;

    // The prepareData Job exists on node a; its agent stops before the Job's pod runs.
    first_job_succeeds_unseen(&mut setup).await;

    // Node a's agent is silent: the Restore says so, naming node and last report.
    let silent =
        custody_tests::scenario::restore_says(&setup.namespace, "shop", "AgentNotReady", TIMEOUT)
            .await;
    let volume = silent.status.as_ref().unwrap().volumes[0].clone();
    let message = volume.message.clone().unwrap_or_default();
    assert!(
        message.contains("shop-0") && message.contains(&node_a) && message.contains("last report"),
        "{message}"
    );
    assert_ne!(volume.state, VolumeState::Verified, "{volume:?}");
    await_event(&setup, "Restore", "shop", |(kind, reason, note)| {
        kind == "Warning" && reason == "AgentNotReady" && note.contains(&node_a)
    })
    .await;
    let written = inodes(target.path());
    assert!(written.len() > 100, "{}", written.len());

    // The pod moves to node b, where an agent runs.
    let token_b = report_token(&client, &ns, &node_b).await;
    let _agent_b = AgentProcess::start(
        &kubelet_b,
        &setup.pki,
        AgentArgs {
            flags: report_flags(&setup.controller, &setup.pki, token_b.path()),
            gate: Some(
                format!("{ip_b}:{}", names::GATE_PORT)
                    .parse()
                    .expect("address"),
            ),
            ..AgentArgs::default()
        },
    );
    let _jobs_b = PodRunner::start(&client, &ns, &node_b, Default::default());
    let workloads_b = WorkloadRunner::start(&client, &ns, kubelet_b.clone());
    cordon(node_a.clone(), true).await;
    cordon(node_b.clone(), false).await;
    let pods: Api<Pod> = setup.namespace.api();
    pods.delete("shop-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let moved = await_condition(&pods, "shop-0", "on node b", TIMEOUT, |pod: &Pod| {
        pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(node_b.as_str())
    })
    .await;
    assert!(
        moved
            .spec
            .as_ref()
            .unwrap()
            .init_containers
            .iter()
            .flatten()
            .any(|container| container.name == names::WAIT_CONTAINER),
        "the moved pod is held too"
    );

    let restore =
        custody_tests::scenario::restore_reaches(&setup.namespace, "shop", RestorePhase::Completed)
            .await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    assert_eq!(
        volume.node_name.as_deref(),
        Some(node_b.as_str()),
        "{volume:?}"
    );
    assert_eq!(volume.attempts, 2, "{volume:?}");
    await_event(&setup, "Restore", "shop", |(_, reason, note)| {
        reason == "PodMoved" && note.contains(&node_a) && note.contains(&node_b)
    })
    .await;
    // Nothing was written again: the files are the ones node a's Job wrote.
    assert_eq!(inodes(target.path()), written);
    // custody-wait on node b was released.
    released(&workloads_b, "shop-0").await;
    drop(workloads_a);
    drop(workloads_b);
    setup.finish().await;
    kubelet_b.delete().await;
}

/// Waits until the NodeAgent of `node` counts its volumes as `wanted` says; the NodeAgent then.
async fn node_counts(
    agents: &Api<NodeAgent>,
    node: &str,
    what: &str,
    wanted: impl Fn(&custody_kube::api::VolumeCounts) -> bool,
) -> NodeAgent {
    await_condition(agents, node, what, TIMEOUT, |agent: &NodeAgent| {
        agent
            .status
            .as_ref()
            .and_then(|status| status.volumes.as_ref())
            .is_some_and(&wanted)
    })
    .await
}

/// Waits for the Restore's first prepareData Job, stops the node's agent, lets the Job run and
/// succeed unseen by it (the fake Job runner was paused); the Job's name.
async fn first_job_succeeds_unseen(setup: &mut Setup) -> String {
    let restores: Api<Restore> = setup.namespace.api();
    let first = await_condition(&restores, "shop", "a Job", TIMEOUT, |restore: &Restore| {
        restore
            .status
            .as_ref()
            .is_some_and(|status| status.volumes.iter().any(|v| v.job_name.is_some()))
    })
    .await;
    let job = first.status.unwrap().volumes[0].job_name.clone().unwrap();
    setup.agent.stop();
    setup.jobs.set_running(true);
    let jobs: Api<Job> = setup.namespace.api();
    await_condition(&jobs, &job, "succeeded", TIMEOUT, |job: &Job| {
        job.status.as_ref().and_then(|status| status.succeeded) == Some(1)
    })
    .await;
    job
}

/// Waits until `pod`'s `custody-wait` exited 0 under `workloads`.
async fn released(workloads: &WorkloadRunner, pod: &str) {
    eventually(&format!("custody-wait released {pod}"), TIMEOUT, || {
        let runs = workloads.runs();
        async move {
            runs.iter()
                .find(|run| {
                    run.pod == pod && run.container == names::WAIT_CONTAINER && run.exit_code == 0
                })
                .map(|_| ())
                .ok_or_else(|| format!("{} runs", runs.len()))
        }
    })
    .await;
}

/// The agent's count of bytes its verifications read and hashed.
fn verified_bytes(metrics: &str) -> u64 {
    counter(metrics, "custody_agent_verified_bytes_total")
}

/// Issue 15, item 1 (c): an agent rollout over 20 restored volumes reads none of them. Twenty
/// pods of one StatefulSet are restored and verified (the figures of that first agent are
/// printed), the agent starts again with nothing in memory (what a DaemonSet rollout does),
/// and every pod's `custody-wait` runs again (a node reboot): all 20 are released, the new
/// agent finished no verification and hashed no byte, and its NodeAgent counts 20 verified
/// volumes and none failed.
#[tokio::test]
async fn an_agent_rollout_over_twenty_restored_volumes_reads_none_of_them() {
    const PODS: i32 = 20;
    let mut setup = setup("rollout").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let mut targets = Vec::new();
    for ordinal in 0..PODS {
        let target = LoopVolume::new(16);
        setup
            .kubelet
            .local_persistent_volume(&ns, &format!("data-shop-{ordinal}"), target.path())
            .await;
        targets.push(target);
    }
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    let started = std::time::Instant::now();
    custody_tests::scenario::shop_of_replicas_restored_from_nightly(&setup, json!({}), PODS).await;
    let restore =
        custody_tests::scenario::restore_reaches(&setup.namespace, "shop", RestorePhase::Completed)
            .await;
    let restored_in = started.elapsed();
    assert_eq!(
        restore.status.as_ref().unwrap().progress.as_deref(),
        Some("20/20 verified")
    );
    let first = setup.agent.metrics();
    let (first_verifications, first_bytes) =
        (verifications_finished(&first), verified_bytes(&first));
    assert_eq!(first_verifications, 20, "{first}");
    assert!(first_bytes > 20 * (3 << 20), "{first_bytes}");

    // The rollout: a new agent, nothing in memory.
    setup.restart_agent(&[], vec![]);
    let pods: Api<Pod> = setup.namespace.api();
    let mut waits = Vec::new();
    let asked = std::time::Instant::now();
    for ordinal in 0..PODS {
        let pod = pods.get(&format!("shop-{ordinal}")).await.unwrap();
        let token = custody_tests::kubelet::pod_token(&client, &pod, names::GATE_AUDIENCE).await;
        waits.push(custody_tests::agent::WaitProcess::start(
            &setup.agent,
            &setup.pki,
            &token,
        ));
    }
    for wait in &mut waits {
        let exit = wait.await_exit(Duration::from_secs(30));
        assert!(exit.success(), "held again: {:?}", wait.output.all());
    }
    let released_in = asked.elapsed();
    let after = setup.agent.metrics();
    assert_eq!(verifications_finished(&after), 0, "{after}");
    assert_eq!(verified_bytes(&after), 0, "{after}");
    let agents: Api<NodeAgent> = Api::all(client.clone());
    let agent = node_counts(
        &agents,
        &setup.kubelet.node,
        "20 volumes reported verified",
        |volumes| volumes.verified == 20,
    )
    .await;
    assert_eq!(agent.status.unwrap().volumes.unwrap().failed, 0);
    eprintln!(
        "agent rollout over {PODS} restored volumes: first agent {first_verifications} verifications, {first_bytes} bytes hashed (restore of all {PODS}: {:.1} s); after the rollout 0 verifications, 0 bytes, all {PODS} custody-waits released in {} ms",
        restored_in.as_secs_f64(),
        released_in.as_millis()
    );
    drop(workloads);
    setup.finish().await;
    drop(targets);
}

/// Issue 15, item 3, the restore side: a prepareData Job whose pod never runs (held here, as
/// an image that cannot be pulled would hold it) fails its volume at the Job's deadline with
/// the Job's reason, the Restore fails, and the Cluster's Lease is free again; the node's
/// agent reports the volume failed with the Restore's reason.
#[tokio::test]
async fn a_restore_whose_job_pod_never_runs_fails_at_the_deadline_and_frees_the_cluster() {
    let mut setup = setup("rdeadline").await;
    setup.restart_controller_with(&["--job-deadline-seconds=3"]);
    setup.jobs.set_running(false);
    let target = LoopVolume::new(16);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(
        &setup.namespace.client,
        &setup.namespace.name,
        setup.kubelet.clone(),
    );
    let failed =
        custody_tests::scenario::restore_reaches(&setup.namespace, "shop", RestorePhase::Failed)
            .await;
    let volume = &failed.status.as_ref().unwrap().volumes[0];
    assert_eq!(
        volume.reason.as_deref(),
        Some("RestoreJobFailed"),
        "{volume:?}"
    );
    assert!(
        volume
            .message
            .as_deref()
            .is_some_and(|message| message.contains("DeadlineExceeded")),
        "{volume:?}"
    );
    lease_free(&setup.namespace, "shop", TIMEOUT).await;
    // The node says what the Restore says, not "pending" for a restore that is over.
    let agents: Api<NodeAgent> = Api::all(setup.namespace.client.clone());
    let agent = node_counts(
        &agents,
        &setup.kubelet.node,
        "the volume reported failed by its node",
        |volumes| volumes.failed == 1,
    )
    .await;
    let reported = &agent.status.unwrap().restored_volumes[0];
    assert_eq!(
        reported.reason.as_deref(),
        Some("RestoreFailed"),
        "{reported:?}"
    );
    assert!(
        reported.message.as_deref().is_some_and(|message| message
            .starts_with("Restore shop failed this volume: RestoreJobFailed: ")
            && message.contains("DeadlineExceeded")),
        "{reported:?}"
    );
    drop(workloads);
    setup.finish().await;
}

/// A prepareData pod deleted (by hand, by a pod garbage collector) after its Job succeeded and
/// before the agent verified its output: the agent sees no prepareData pod, so nothing would
/// ever verify the volume and its pod would stay held. Once a report made 15 s after the Job
/// finished still sees none, the volume gets its next attempt on the same node, with a
/// Warning; the mover finds this restore's finished output and writes nothing (the files keep
/// their inodes); the agent verifies it and the pod is released.
#[tokio::test]
async fn a_prepare_data_pod_deleted_before_its_output_was_verified_gets_another_attempt() {
    let mut setup = setup("podgone").await;
    let client = setup.namespace.client.clone();
    let target = LoopVolume::new(64);
    setup.jobs.set_running(false);
    restore_into(&setup, target.path(), json!({})).await;
    let workloads = WorkloadRunner::start(&client, &setup.namespace.name, setup.kubelet.clone());

    // The agent is away while the Job writes the volume and succeeds; its pod is then deleted.
    let job = first_job_succeeds_unseen(&mut setup).await;
    let written = inodes(target.path());
    assert!(written.len() > 100, "{}", written.len());
    let pods: Api<Pod> = setup.namespace.api();
    let of_job = ListParams::default().labels(&format!("job-name={job}"));
    pods.delete_collection(&DeleteParams::default().grace_period(0), &of_job)
        .await
        .unwrap();
    eventually("the Job's pods gone", TIMEOUT, || {
        let (pods, of_job) = (pods.clone(), of_job.clone());
        async move {
            let left = pods
                .list(&of_job)
                .await
                .map_err(|error| error.to_string())?;
            match left.items.len() {
                0 => Ok(()),
                n => Err(format!("{n} left")),
            }
        }
    })
    .await;
    setup.restart_agent(&[], vec![]);

    let restore =
        custody_tests::scenario::restore_reaches(&setup.namespace, "shop", RestorePhase::Completed)
            .await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    assert_eq!(volume.attempts, 2, "{volume:?}");
    assert_eq!(
        volume.node_name.as_deref(),
        Some(setup.kubelet.node.as_str()),
        "{volume:?}"
    );
    await_event(&setup, "Restore", "shop", |(kind, reason, note)| {
        kind == "Warning" && reason == "PrepareDataPodGone" && note.contains("was deleted before")
    })
    .await;
    // Nothing was written again.
    assert_eq!(inodes(target.path()), written);
    released(&workloads, "shop-0").await;
    drop(workloads);
    setup.finish().await;
}

/// Issue 15, item 2: a Cluster under restore whose StatefulSet's pod template lacks the
/// `custody.io/cluster` label (so its pods would never be held) says so, naming the label,
/// with a Warning.
/// A pod that mounts `claim` (no controller, no custody label).
fn reader(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "reader", "image": "registry.invalid/reader:1",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap()
}

/// Whether namespace `name` carries the mark that scopes the restore gate.
async fn marked(client: &kube::Client, name: &str) -> bool {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get(name)
        .await
        .unwrap()
        .labels()
        .contains_key("custody.io/restore-in-progress")
}

/// Waits until namespace `name` no longer carries the restore mark.
async fn unmarked(client: &kube::Client, name: &str) {
    eventually(
        &format!("namespace {name} unmarked"),
        TIMEOUT,
        || async move {
            if marked(client, name).await {
                Err("still marked".to_string())
            } else {
                Ok(())
            }
        },
    )
    .await;
}

/// Issue 23, item 4: the gate does not depend on a label. A StatefulSet whose pod template
/// lacks `custody.io/cluster` has its pod held until the volume is verified; any other pod
/// that mounts the claim under restore is refused, naming it; the namespace is marked before
/// the Restore exists and unmarked once no restore is left.
#[tokio::test]
async fn a_pod_that_mounts_a_claim_under_restore_is_held_whatever_its_labels() {
    let setup = setup("unlabelled").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let pods: Api<Pod> = setup.namespace.api();
    assert!(!marked(&client, &ns).await, "no restore yet");
    let target = LoopVolume::new(64);
    setup
        .kubelet
        .local_persistent_volume(&ns, "data-shop-0", target.path())
        .await;
    setup.jobs.set_running(false);
    custody_tests::scenario::shop_restored_unlabelled(&setup).await;
    // Marked before the Restore existed (the helper waited for the Restore).
    assert!(marked(&client, &ns).await, "the namespace is marked");
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());

    let pod = await_condition(&pods, "shop-0", "admitted", TIMEOUT, |_: &Pod| true).await;
    assert!(!pod.labels().contains_key(names::LABEL_CLUSTER));
    let spec = pod.spec.clone().unwrap();
    assert_eq!(
        spec.init_containers.as_ref().unwrap()[0].name,
        names::WAIT_CONTAINER,
        "held without the label"
    );
    let restore_uid = setup
        .namespace
        .api::<Restore>()
        .get("shop")
        .await
        .unwrap()
        .metadata
        .uid;
    assert_eq!(
        pod.labels().get(names::LABEL_RESTORE_UID),
        restore_uid.as_ref()
    );

    // Another pod mounting the claim is refused, saying why.
    let refused = pods
        .create(&Default::default(), &reader("reader", "data-shop-0"))
        .await
        .expect_err("a pod mounting a claim under restore is refused");
    let text = refused.to_string();
    for needed in ["claim data-shop-0", "Restore shop", "StatefulSet shop"] {
        assert!(text.contains(needed), "{needed}: {text}");
    }
    // A pod mounting another claim is not custody's, even here.
    create::<PersistentVolumeClaim>(&setup.namespace.api(), json!({
        "metadata": {"name": "scratch"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .await;
    let other = pods
        .create(&Default::default(), &reader("scratch-reader", "scratch"))
        .await
        .expect("a pod of another claim is admitted");
    assert!(other.spec.unwrap().init_containers.is_none());

    // The restore runs (its own Job pods mount the claim), verifies and releases the pod.
    setup.jobs.set_running(true);
    await_condition(
        &setup.namespace.api::<Restore>(),
        "shop",
        "Completed",
        TIMEOUT,
        |restore: &Restore| restore_phase(restore) == Some(RestorePhase::Completed),
    )
    .await;
    released(&workloads, "shop-0").await;

    // No restore left: the mark comes off after its grace period, and the claim is anyone's.
    unmarked(&client, &ns).await;
    pods.create(&Default::default(), &reader("reader", "data-shop-0"))
        .await
        .expect("after the restore, the claim is the application's");
    setup.finish().await;
}

/// Issue 23, item 4 (review): a StatefulSet applied before its Cluster has its pod running on
/// the empty claim, unseen by the gate (no restore yet). The Restore then writes nothing
/// under it and says so, naming the pod (`PodNotHeld`); once the pod is deleted, the
/// StatefulSet's new pod is held, and the restore completes.
#[tokio::test]
async fn a_pod_started_before_its_restore_is_named_and_held_once_created_again() {
    let setup = setup("early").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let pods: Api<Pod> = setup.namespace.api();
    let target = LoopVolume::new(64);
    setup
        .kubelet
        .local_persistent_volume(&ns, "data-shop-0", target.path())
        .await;
    create::<StatefulSet>(
        &setup.namespace.api(),
        custody_tests::scenario::shop_statefulset(1, json!({"app": "shop"})),
    )
    .await;
    let early = await_condition(&pods, "shop-0", "created", TIMEOUT, |_: &Pod| true).await;
    assert!(
        early.spec.unwrap().init_containers.is_none(),
        "no restore yet"
    );
    let workloads = WorkloadRunner::start(&client, &ns, setup.kubelet.clone());
    create::<Cluster>(
        &setup.namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "shop"},
            "spec": {"statefulSetRef": {"name": "shop"}, "volumeClaimTemplates": ["data"],
                     "restore": {"backupRef": {"name": "nightly"}}},
        }),
    )
    .await;
    let restores: Api<Restore> = setup.namespace.api();
    let named =
        custody_tests::scenario::restore_says(&setup.namespace, "shop", "PodNotHeld", TIMEOUT)
            .await;
    let ready = named
        .conditions()
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
        .unwrap();
    assert!(ready.message.contains("pod shop-0"), "{}", ready.message);
    await_event(&setup, "Restore", "shop", |(kind, reason, _)| {
        kind == "Warning" && reason == "PodNotHeld"
    })
    .await;
    assert!(
        setup
            .namespace
            .api::<Job>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|job| !job.name_any().starts_with("data-shop-0-restore")),
        "nothing is written under the running pod"
    );

    // As the condition says: delete it; its replacement is held and the restore completes.
    pods.delete("shop-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let held = await_condition(&pods, "shop-0", "held", TIMEOUT, |pod: &Pod| {
        pod.spec
            .as_ref()
            .and_then(|spec| spec.init_containers.as_ref())
            .is_some_and(|init| init[0].name == names::WAIT_CONTAINER)
    })
    .await;
    assert!(!held.labels().contains_key(names::LABEL_CLUSTER));
    await_condition(
        &restores,
        "shop",
        "Completed",
        TIMEOUT,
        |restore: &Restore| restore_phase(restore) == Some(RestorePhase::Completed),
    )
    .await;
    released(&workloads, "shop-0").await;
    setup.finish().await;
}

/// Issue 23, item 4: the blast radius. While no controller answers, pods that mount a claim
/// are refused only in a namespace under restore; pods without claims are admitted there, and
/// every pod of a namespace without a restore, labelled or not, is admitted.
#[tokio::test]
async fn a_controller_outage_refuses_pods_only_where_a_restore_is_in_progress() {
    let mut setup = setup("outage").await;
    let client = setup.namespace.client.clone();
    let ns = setup.namespace.name.clone();
    let pods: Api<Pod> = setup.namespace.api();
    setup.stop_controller();
    let labelled = |name: &str| {
        let mut pod = reader(name, "data-orders-0");
        pod.metadata.labels =
            Some([(names::LABEL_CLUSTER.to_string(), "nowhere".to_string())].into());
        pod
    };
    // No restore in this namespace: nothing waits for custody.
    pods.create(&Default::default(), &reader("a", "data-orders-0"))
        .await
        .expect("a pod with a claim, no restore in progress");
    pods.create(&Default::default(), &labelled("b"))
        .await
        .expect("a labelled pod, no restore in progress (failurePolicy Ignore)");

    // Marked as under restore (as custody marks it): pods with claims wait for custody.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            &ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"custody.io/restore-in-progress": "true"}}}),
            ),
        )
        .await
        .unwrap();
    for pod in [reader("c", "data-orders-0"), labelled("d")] {
        let name = pod.name_any();
        eventually(&format!("pod {name} refused"), TIMEOUT, || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move {
                match pods.create(&Default::default(), &pod).await {
                    Err(error) if error.to_string().contains("restore-gate.custody.io") => Ok(()),
                    Ok(_) => {
                        let _ = pods.delete(&pod.name_any(), &DeleteParams::default()).await;
                        Err("admitted".to_string())
                    }
                    Err(error) => Err(error.to_string()),
                }
            }
        })
        .await;
    }
    let mut plain = reader("e", "unused");
    plain.spec.as_mut().unwrap().volumes = None;
    plain.spec.as_mut().unwrap().containers[0].volume_mounts = None;
    pods.create(&Default::default(), &plain)
        .await
        .expect("a pod without claims is never sent to custody");

    // Back: the mark of a namespace without a restore comes off.
    setup.start_controller();
    unmarked(&client, &ns).await;
    setup.finish().await;
}
