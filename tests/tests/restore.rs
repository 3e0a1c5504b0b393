//! Verified restore end to end: the real controller (reconcilers and admission webhook over
//! TLS, called by the real API server), the real kube-controller-manager (StatefulSet, Job and
//! volume-binding controllers) and kube-scheduler, the real agent and `custody-wait` over real
//! gRPC, the real `custody-mover` against the real S3 server, real ext4 volumes. The fake
//! kubelet only mounts volumes, runs the workspace binaries a pod names, and reports status.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use custody_controller::api::{
    Backup, BackupPhase, BackupRepository, Cluster, ClusterPhase, HasConditions, NodeAgent,
    Restore, RestorePhase, VolumeState,
};
use custody_proto::names;
use custody_tests::agent::{
    AgentArgs, AgentProcess, CONTROLLER_NAME, ControllerProcess, report_flags, report_token,
};
use custody_tests::kubelet::{FakeKubelet, LOCAL_STORAGE_CLASS, PodRunner, PodSpec, create_pod};
use custody_tests::pki::Pki;
use custody_tests::volumes::LoopVolume;
use custody_tests::workloads::WorkloadRunner;
use custody_tests::{TestNamespace, await_condition, eventually, free_port, s3};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

/// A namespace with a completed Backup of Cluster `orders`, a controller with its webhook, and
/// one node (fake kubelet, real agent) ready for a restore.
struct Setup {
    namespace: TestNamespace,
    kubelet: Arc<FakeKubelet>,
    source: LoopVolume,
    _pki: Pki,
    _controller: ControllerProcess,
    _agent: AgentProcess,
    jobs: PodRunner,
    _report_token: tempfile::NamedTempFile,
    webhook: String,
}

impl Setup {
    async fn finish(self) {
        let configurations: Api<MutatingWebhookConfiguration> =
            Api::all(self.namespace.client.clone());
        let _ = configurations
            .delete(&self.webhook, &DeleteParams::default())
            .await;
        self.kubelet.delete().await;
        self.namespace.delete().await;
    }
}

/// A loopback address of this test's own (the node's address; its agent's gate listens there).
fn node_address(namespace: &str) -> String {
    let hash = blake3::hash(namespace.as_bytes());
    let bytes = hash.as_bytes();
    format!(
        "127.{}.{}.{}",
        1 + bytes[0] % 250,
        bytes[1],
        1 + bytes[2] % 250
    )
}

async fn create<K>(api: &Api<K>, value: serde_json::Value) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(value).expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create")
}

async fn setup(prefix: &str) -> Setup {
    let namespace = TestNamespace::create(prefix).await;
    let client = namespace.client.clone();
    let ns = namespace.name.clone();
    let url = s3::shared();
    let bucket = s3::bucket(url, prefix).await;
    let ip = node_address(&ns);
    let kubelet = Arc::new(FakeKubelet::with_address(&client, &format!("{ns}-a"), &ip).await);

    create::<Secret>(&namespace.api(), json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3::ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3::SECRET_KEY},
    }))
    .await;
    create::<BackupRepository>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "store"},
            "spec": {"endpoint": url, "bucket": bucket, "prefix": "custody", "forcePathStyle": true,
                     "credentialsSecretRef": {"name": "s3"}},
        }),
    )
    .await;

    // The source: Cluster orders, its claim mounted by a running pod on the node.
    create::<Cluster>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "orders"},
            "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                     "repositoryRef": {"name": "store"}},
        }),
    )
    .await;
    create::<PersistentVolumeClaim>(&namespace.api(), json!({
        "metadata": {"name": "data-orders-0"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .await;
    create_pod(
        &client,
        &ns,
        PodSpec {
            name: "orders-0",
            node: &kubelet.node,
            service_account: "orders",
            claims: &[("data", "data-orders-0")],
            ..PodSpec::default()
        },
    )
    .await;
    kubelet.set_phase(&ns, "orders-0", "Running", 0).await;
    let source = LoopVolume::new(64);
    std::fs::create_dir_all(source.path().join("base/16384")).unwrap();
    for index in 0..500 {
        std::fs::write(
            source.path().join(format!("base/16384/{index:04}")),
            format!("row {index}\n").repeat(index % 7 + 1),
        )
        .unwrap();
    }
    std::fs::write(source.path().join("pg_wal"), vec![7u8; 3 << 20]).unwrap();
    std::os::unix::fs::symlink("base/16384/0001", source.path().join("latest")).unwrap();

    // The controller, its webhook registered for this namespace only.
    let pki = Pki::new(&[CONTROLLER_NAME, names::AGENT_SERVER_NAME]);
    let webhook_port = free_port();
    let webhook = format!("custody-{ns}");
    create::<MutatingWebhookConfiguration>(&Api::all(client.clone()), json!({
        "metadata": {"name": webhook},
        "webhooks": [{
            "name": "pods.custody.io",
            "clientConfig": {"url": format!("https://127.0.0.1:{webhook_port}/mutate-pods")},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "objectSelector": {"matchExpressions": [{"key": "custody.io/cluster", "operator": "Exists"}]},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))
    .await;
    let controller = ControllerProcess::start(
        &ns,
        &pki,
        &[
            "--mover-image=custody-mover:test".to_string(),
            "--wait-image=custody-wait:test".to_string(),
            format!("--agent-service-account={ns}:custody-agent"),
            format!("--gate-ca-file={}", pki.ca().display()),
            format!("--webhook-address=127.0.0.1:{webhook_port}"),
            format!("--webhook-configuration={webhook}"),
            format!("--webhook-secret={ns}/custody-webhook-tls"),
            "--webhook-names=127.0.0.1".to_string(),
        ],
    );
    let token = report_token(&client, &ns, &kubelet.node).await;
    let gate: SocketAddr = format!("{ip}:{}", names::GATE_PORT).parse().unwrap();
    let agent = AgentProcess::start(
        &kubelet,
        &pki,
        AgentArgs {
            flags: report_flags(&controller, &pki, token.path()),
            gate: Some(gate),
            ..AgentArgs::default()
        },
    );
    let jobs = PodRunner::start(
        &client,
        &ns,
        &kubelet.node,
        BTreeMap::from([("data-orders-0".to_string(), source.path().to_path_buf())]),
    );

    // The caBundle is the controller's to publish.
    eventually("the webhook's caBundle", TIMEOUT, || {
        let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let webhook = webhook.clone();
        async move {
            let found = configurations
                .get(&webhook)
                .await
                .map_err(|error| error.to_string())?;
            let bundle = found
                .webhooks
                .unwrap_or_default()
                .first()
                .and_then(|hook| hook.client_config.ca_bundle.clone());
            match bundle {
                Some(bundle)
                    if String::from_utf8_lossy(&bundle.0).contains("BEGIN CERTIFICATE") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    create::<Backup>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "nightly"},
            "spec": {"clusterRef": {"name": "orders"}},
        }),
    )
    .await;
    await_condition(
        &namespace.api::<Backup>(),
        "nightly",
        "Completed",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed)
        },
    )
    .await;

    Setup {
        namespace,
        kubelet,
        source,
        _pki: pki,
        _controller: controller,
        _agent: agent,
        jobs,
        _report_token: token,
        webhook,
    }
}

/// Cluster `shop` restored from Backup `nightly`, and (once its Restore exists) its
/// StatefulSet; the claim's PersistentVolume is `target`.
async fn restore_into(setup: &Setup, target: &Path, annotations: serde_json::Value) {
    let ns = &setup.namespace.name;
    setup
        .kubelet
        .local_persistent_volume(ns, "data-shop-0", target)
        .await;
    create::<Cluster>(
        &setup.namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "shop", "annotations": annotations},
            "spec": {"statefulSetRef": {"name": "shop"}, "volumeClaimTemplates": ["data"],
                     "restore": {"backupRef": {"name": "nightly"}}},
        }),
    )
    .await;
    await_condition(
        &setup.namespace.api::<Restore>(),
        "shop",
        "the Restore",
        TIMEOUT,
        |_: &Restore| true,
    )
    .await;
    create::<StatefulSet>(&setup.namespace.api(), json!({
        "metadata": {"name": "shop"},
        "spec": {
            "replicas": 1,
            "serviceName": "shop",
            "selector": {"matchLabels": {"app": "shop"}},
            "template": {
                "metadata": {"labels": {"app": "shop", "custody.io/cluster": "shop"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "db", "image": "registry.invalid/db:16",
                                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/db"}]}],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": LOCAL_STORAGE_CLASS,
                         "resources": {"requests": {"storage": "64Mi"}}},
            }],
        },
    }))
    .await;
}

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

/// Every regular file and symlink under `root` (but `.custody/` and `lost+found`), with content.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            if relative == ".custody" || relative == "lost+found" {
                continue;
            }
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                out.insert(
                    relative,
                    std::fs::read_link(&path)
                        .unwrap()
                        .display()
                        .to_string()
                        .into_bytes(),
                );
            } else if kind.is_dir() {
                out.insert(format!("{relative}/"), Vec::new());
                walk(root, &path, out);
            } else {
                out.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[tokio::test]
async fn a_restored_cluster_runs_only_once_every_volume_is_verified() {
    let setup = setup("restore").await;
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
    let backup = setup
        .namespace
        .api::<Backup>()
        .get("nightly")
        .await
        .unwrap();
    let artifact = backup.status.unwrap().artifact.unwrap();
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
        jobs.delete(&name, &DeleteParams::foreground())
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
