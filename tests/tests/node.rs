//! custody on a real node, installed as users install it: kubelet v1.36 and Debian's
//! containerd and runc (hack/node-up.sh), custody's images built from this repository
//! (hack/build-images.sh) and `kubectl apply -k deploy/` unchanged, after the two TLS Secrets
//! the README names (hack/tls-secrets.sh). Every test here is named `on_a_real_node_…`: it is
//! a tier of its own in hack/test.sh (see custody_tests::node).

use std::path::Path;
use std::time::Duration;

use custody_kube::api::{
    Backup, BackupPhase, Capture, Cluster, NodeAgent, Restore, RestorePhase, VolumeState,
};
use custody_tests::node::{hack, real_node};
use custody_tests::s3;
use custody_tests::scenario::{
    artifact_of, create, nightly_completed, repository, restore_reaches, small_database,
    source_cluster,
};
use custody_tests::volumes::{LoopVolume, tree};
use custody_tests::{TestNamespace, await_condition, client, kubectl, repo_root};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);
const NAMESPACE: &str = "custody-system";

/// custody installed from `deploy/`; removed again (all but the CRDs, the namespace and its
/// Secrets, which other tiers share) when dropped, so that its cluster-wide webhook outlives
/// no test.
struct Installed;

/// Tests under way that use the install (they run in parallel; the last one removes it).
static USERS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

impl Installed {
    /// The first test applies `deploy/`; the others wait for it and share it.
    fn apply() -> Installed {
        let mut users = USERS.lock().expect("not poisoned");
        *users += 1;
        if *users > 1 {
            return Installed;
        }
        hack("tls-secrets.sh", &[]);
        let deploy = repo_root().join("deploy");
        let output = kubectl(&["apply", "-k", deploy.to_str().expect("utf-8 path")]);
        assert!(
            output.status.success(),
            "kubectl apply -k deploy/ failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Installed
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let mut users = USERS.lock().expect("not poisoned");
        *users -= 1;
        if *users > 0 {
            return;
        }
        let _ = kubectl(&[
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "mutatingwebhookconfiguration/custody-restore-gate",
        ]);
        let _ = kubectl(&[
            "-n",
            NAMESPACE,
            "delete",
            "--ignore-not-found",
            "deployment/custody-controller",
            "daemonset/custody-agent",
            "service/custody-controller",
        ]);
    }
}

/// Waits until the controller's Deployment has an available replica and the agent's DaemonSet
/// a ready pod.
async fn running(client: &kube::Client) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    await_condition(
        &deployments,
        "custody-controller",
        "one available replica",
        TIMEOUT,
        |deployment: &Deployment| {
            deployment
                .status
                .as_ref()
                .and_then(|status| status.available_replicas)
                == Some(1)
        },
    )
    .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    await_condition(
        &daemonsets,
        "custody-agent",
        "its pod ready on the node",
        TIMEOUT,
        |daemonset: &DaemonSet| {
            daemonset
                .status
                .as_ref()
                .is_some_and(|status| status.number_ready == 1)
        },
    )
    .await;
}

#[tokio::test]
async fn on_a_real_node_custody_installs_from_deploy_and_its_agent_reports_through_the_service() {
    let node = real_node();
    let _installed = Installed::apply();
    let client = client().await;

    // The controller's Deployment and the agent's DaemonSet run as pods on the node.
    running(&client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    for (app, image) in [
        (
            "custody-controller",
            "ghcr.io/custody/custody-controller:0.1.0",
        ),
        ("custody-agent", "ghcr.io/custody/custody-agent:0.1.0"),
    ] {
        let pod = listed
            .iter()
            .find(|pod| {
                pod.metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get("app.kubernetes.io/name"))
                    .is_some_and(|name| name == app)
                    && pod.metadata.deletion_timestamp.is_none()
            })
            .unwrap_or_else(|| panic!("no {app} pod"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(node), "{app}");
        let status = pod.status.as_ref().unwrap();
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(container.image, image, "{app}");
        assert!(
            container.image_id.starts_with("sha256:"),
            "{app} ran an image the node's containerd holds: {}",
            container.image_id
        );
        assert!(
            container
                .state
                .as_ref()
                .is_some_and(|state| state.running.is_some()),
            "{app}: {:?}",
            container.state
        );
    }

    // The agent, on the host network, reached the controller's report service by its Service
    // name (cluster DNS, kube-proxy) with the report certificate: its NodeAgent has a heartbeat
    // and a measured clock offset.
    let agents: Api<NodeAgent> = Api::all(client.clone());
    let agent = await_condition(
        &agents,
        node,
        "a heartbeat and a clock offset",
        TIMEOUT,
        |agent: &NodeAgent| {
            agent.status.as_ref().is_some_and(|status| {
                status.last_heartbeat_time.is_some() && status.clock_offset_nanoseconds.is_some()
            })
        },
    )
    .await;
    let status = agent.status.unwrap();
    assert_eq!(status.agent_version.as_deref(), Some("0.1.0"));

    // The controller issued the webhook's certificate and wrote its CA into the configuration
    // that `deploy/` created without one.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    await_condition(
        &configurations,
        "custody-restore-gate",
        "a caBundle",
        TIMEOUT,
        |configuration: &MutatingWebhookConfiguration| {
            configuration
                .webhooks
                .iter()
                .flatten()
                .all(|webhook| webhook.client_config.ca_bundle.is_some())
        },
    )
    .await;
}

/// The host address pods reach MinIO at (hack/s3-up.sh listens there too).
fn s3_for_pods() -> String {
    let port = s3::shared().rsplit(':').next().expect("port").to_string();
    format!(
        "http://{}:{port}",
        std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into())
    )
}

/// A local PersistentVolume on the node for `namespace/claim`, backed by `path`.
async fn local_volume(
    client: &kube::Client,
    node: &str,
    namespace: &str,
    claim: &str,
    path: &Path,
) {
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": format!("{namespace}-{claim}")},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "custody-real-node",
                    "local": {"path": path.display().to_string()},
                    "claimRef": {"namespace": namespace, "name": claim},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]},
                    ]}]}},
                },
            }))
            .expect("PersistentVolume"),
        )
        .await
        .expect("creating the PersistentVolume");
}

/// A StatefulSet of one pod whose container (the node's pause image: it only holds the
/// volume) mounts claim template `data`, labelled for Cluster `name`.
fn statefulset(name: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "custody.io/cluster": name}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "db", "image": "localhost/custody/pause:1",
                                    "imagePullPolicy": "Never",
                                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/db"}]}],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "custody-real-node",
                         "resources": {"requests": {"storage": "64Mi"}}},
            }],
        },
    })
}

/// A namespace on the real node with custody installed, a repository the Jobs' pods reach,
/// Cluster `orders` (its pod running on a real volume holding the tests' small database) and
/// its completed Backup `nightly`.
struct BackedUp {
    node: &'static str,
    client: kube::Client,
    namespace: TestNamespace,
    bucket: String,
    source: LoopVolume,
    pods: Api<Pod>,
    _installed: Installed,
    _agents: Agents,
}

/// Held by every test: shared, or exclusive by one that replaces the agents.
#[allow(dead_code)]
enum Agents {
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    Exclusive(tokio::sync::RwLockWriteGuard<'static, ()>),
}

/// Tests that restart the agents run alone: the others' restores would see it too.
static AGENTS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

async fn backed_up(prefix: &str) -> BackedUp {
    backed_up_with(prefix, Agents::Shared(AGENTS.read().await)).await
}

async fn backed_up_with(prefix: &str, agents: Agents) -> BackedUp {
    let node = real_node();
    let installed = Installed::apply();
    let client = client().await;
    running(&client).await;
    let namespace = TestNamespace::create(prefix).await;
    let ns = namespace.name.clone();

    // A repository the Jobs' pods reach on the host address.
    let bucket = s3::bucket(s3::shared(), prefix).await;
    repository(&namespace, &s3_for_pods(), &bucket).await;

    // The source: Cluster orders, its StatefulSet's pod running on the node on a real volume.
    let source = LoopVolume::new(64);
    small_database(source.path());
    local_volume(&client, node, &ns, "data-orders-0", source.path()).await;
    source_cluster(&namespace).await;
    create::<StatefulSet>(&namespace.api(), statefulset("orders")).await;
    let pods: Api<Pod> = namespace.api();
    await_condition(&pods, "orders-0", "running", TIMEOUT, |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref())
            == Some("Running")
    })
    .await;

    // Backed up by custody-mover in a Job's pod on the node.
    nightly_completed(&namespace).await;

    BackedUp {
        node,
        client,
        namespace,
        bucket,
        source,
        pods,
        _installed: installed,
        _agents: agents,
    }
}

impl BackedUp {
    /// Cluster `shop` restored from `nightly` onto an empty real volume, and its StatefulSet.
    async fn restore_shop(&self, target: &Path) {
        let (node, client, namespace) = (self.node, &self.client, &self.namespace);
        let ns = namespace.name.clone();
        // Restored into Cluster shop on an empty volume: its pod starts only once the agent
        // verified the volume.
        local_volume(client, node, &ns, "data-shop-0", target).await;
        create::<Cluster>(
            &namespace.api(),
            json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
                "metadata": {"name": "shop"},
                "spec": {"statefulSetRef": {"name": "shop"}, "volumeClaimTemplates": ["data"],
                         "restore": {"backupRef": {"name": "nightly"}}},
            }),
        )
        .await;
        await_condition(
            &namespace.api::<Restore>(),
            "shop",
            "the Restore",
            TIMEOUT,
            |_: &Restore| true,
        )
        .await;
        create::<StatefulSet>(&namespace.api(), statefulset("shop")).await;
    }

    /// Deletes the namespace and the PersistentVolumes made for it.
    async fn finish(self) {
        let ns = self.namespace.name.clone();
        self.namespace.delete().await;
        for claim in ["data-orders-0", "data-shop-0"] {
            let _ = Api::<PersistentVolume>::all(self.client.clone())
                .delete(&format!("{ns}-{claim}"), &Default::default())
                .await;
        }
    }
}

#[tokio::test]
async fn on_a_real_node_a_restored_pod_is_held_by_custody_wait_until_the_agent_verified_its_volume()
{
    let setup = backed_up("real").await;
    let (node, namespace, pods) = (setup.node, &setup.namespace, &setup.pods);
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    // Held: custody-wait runs in the pod's first init container while the volume is written
    // and verified; the application container has not started.
    await_condition(
        pods,
        "shop-0",
        "held in Init by custody-wait",
        TIMEOUT,
        |pod: &Pod| {
            pod.status.as_ref().is_some_and(|status| {
                let waiting_in_init = status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|wait| {
                        wait.state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                    });
                let application_started =
                    status.container_statuses.iter().flatten().any(|container| {
                        container
                            .state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                    });
                waiting_in_init && !application_started
            })
        },
    )
    .await;
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let pod = await_condition(pods, "shop-0", "running and ready", TIMEOUT, |pod: &Pod| {
        pod.status.as_ref().is_some_and(|status| {
            status.phase.as_deref() == Some("Running")
                && status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    // custody-wait ran as the pod's first init container, in a real container, and was
    // released (exit 0); the readiness gate is set.
    let spec = pod.spec.as_ref().unwrap();
    let first = &spec.init_containers.as_ref().expect("init containers")[0];
    assert_eq!(
        first.command.as_deref(),
        Some(&["custody-wait".to_string()][..])
    );
    let status = pod.status.as_ref().unwrap();
    let waited = &status
        .init_container_statuses
        .as_ref()
        .expect("init statuses")[0];
    let terminated = waited
        .state
        .as_ref()
        .and_then(|state| state.terminated.as_ref())
        .unwrap_or_else(|| panic!("custody-wait not finished: {waited:?}"));
    assert_eq!(terminated.exit_code, 0, "{terminated:?}");
    assert!(
        waited.image_id.starts_with("sha256:"),
        "{}",
        waited.image_id
    );
    assert!(
        spec.readiness_gates
            .iter()
            .flatten()
            .any(|gate| gate.condition_type.starts_with("custody.io/")),
        "{:?}",
        spec.readiness_gates
    );
    // What the pod got is exactly what was backed up (beside custody's own .custody/: the
    // restore's identity and manifest, which the agent verified against).
    assert!(target.path().join(".custody/manifest.jsonl").is_file());
    let (original, restored) = (tree(setup.source.path()), tree(target.path()));
    let differing: Vec<&String> = original
        .keys()
        .chain(restored.keys())
        .filter(|path| original.get(*path) != restored.get(*path))
        .collect();
    assert!(differing.is_empty(), "restored differs at {differing:?}");
    assert!(original.len() > 500, "{}", original.len());
    // The agent of this node verified the volume.
    let volume = &restore.status.as_ref().expect("status").volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    assert_eq!(volume.node_name.as_deref(), Some(node), "{volume:?}");

    setup.finish().await;
}

/// A restore whose artifact was changed in the repository after the backup is refused, and
/// its pod stays in Init: custody-wait keeps the application container from ever starting
/// on the unverified volume.
#[tokio::test]
async fn on_a_real_node_a_tampered_restore_is_refused_and_its_pod_stays_held() {
    let setup = backed_up("tamper").await;
    let artifact = artifact_of(&setup.namespace, "nightly").await;
    let mut bytes = s3::get(s3::shared(), &setup.bucket, &artifact.key).await;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    s3::put(s3::shared(), &setup.bucket, &artifact.key, bytes).await;

    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let restore = restore_reaches(&setup.namespace, "shop", RestorePhase::Failed).await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Failed, "{volume:?}");
    // Still held well after the refusal: custody-wait has not let the application start.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pod = setup.pods.get("shop-0").await.unwrap();
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"), "{status:?}");
    let wait = &status
        .init_container_statuses
        .as_ref()
        .expect("init statuses")[0];
    assert!(
        wait.state
            .as_ref()
            .is_some_and(|state| state.terminated.is_none()),
        "custody-wait ended: {wait:?}"
    );
    assert!(
        status
            .container_statuses
            .iter()
            .flatten()
            .all(|container| container
                .state
                .as_ref()
                .is_none_or(|state| state.running.is_none())),
        "{:?}",
        status.container_statuses
    );
    assert!(
        !status
            .conditions
            .iter()
            .flatten()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
    );
    setup.finish().await;
}

/// The node's containerd, as the kubelet uses it.
fn ctr(args: &[&str]) -> String {
    custody_tests::run(
        std::process::Command::new("ctr")
            .args([
                "--address",
                "/run/custody-node/containerd.sock",
                "-n",
                "k8s.io",
            ])
            .args(args),
    )
}

/// Issue 15, item 1, on a real kubelet: a restore completed, the application changed its
/// volume, every agent was replaced (a DaemonSet rollout), then the pod's sandbox died, so the
/// kubelet ran custody-wait again. It is released (the Restore's record of the verification
/// counts, not the changed volume), and no agent reports the volume failed.
#[tokio::test]
async fn on_a_real_node_a_completed_restore_is_not_held_again_after_an_agent_rollout_and_a_sandbox_restart()
 {
    let setup = backed_up_with("rollout", Agents::Exclusive(AGENTS.write().await)).await;
    let (node, namespace, pods) = (setup.node, &setup.namespace, &setup.pods);
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let ready = |pod: &Pod| {
        pod.status.as_ref().is_some_and(|status| {
            status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    };
    let before = await_condition(pods, "shop-0", "ready", TIMEOUT, ready).await;

    // The application writes: the volume is no longer the backup.
    std::fs::write(
        target.path().join("base/16384/0001"),
        b"changed by the application",
    )
    .unwrap();
    std::fs::write(target.path().join("new-table"), b"rows").unwrap();

    // Every agent replaced.
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "restart",
        "daemonset/custody-agent",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        "daemonset/custody-agent",
        "--timeout=180s",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The pod's sandbox dies: the kubelet makes a new one and runs the init containers again.
    let uid = before.metadata.uid.clone().unwrap();
    let sandboxes = ctr(&[
        "containers",
        "ls",
        "-q",
        &format!("labels.\"io.kubernetes.pod.uid\"=={uid}"),
    ]);
    let sandbox = sandboxes
        .lines()
        .find(|id| {
            ctr(&["containers", "info", id]).contains("\"io.cri-containerd.kind\": \"sandbox\"")
        })
        .unwrap_or_else(|| panic!("the sandbox of shop-0 among {sandboxes:?}"));
    ctr(&["tasks", "kill", "-s", "SIGKILL", sandbox]);
    let restarted = |pod: &Pod| {
        pod.status.as_ref().is_some_and(|status| {
            status
                .init_container_statuses
                .iter()
                .flatten()
                .next()
                .is_some_and(|wait| wait.restart_count > 0)
        })
    };
    await_condition(pods, "shop-0", "custody-wait run again", TIMEOUT, restarted).await;
    let after = await_condition(pods, "shop-0", "ready again", TIMEOUT, |pod: &Pod| {
        restarted(pod) && ready(pod)
    })
    .await;
    let wait = &after
        .status
        .as_ref()
        .unwrap()
        .init_container_statuses
        .as_ref()
        .unwrap()[0];
    let terminated = wait
        .state
        .as_ref()
        .and_then(|state| state.terminated.as_ref())
        .expect("custody-wait ended");
    assert_eq!(terminated.exit_code, 0, "{wait:?}");
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "the same pod, not a new one"
    );

    // The agents never report the volume failed, and the application's change is still there.
    let agent = Api::<NodeAgent>::all(setup.client.clone())
        .get(node)
        .await
        .unwrap();
    let status = agent.status.unwrap_or_default();
    assert!(
        status
            .restored_volumes
            .iter()
            .all(|volume| volume.state != VolumeState::Failed)
            && status
                .volumes
                .as_ref()
                .is_none_or(|counts| counts.failed == 0),
        "{status:?}"
    );
    let restore = namespace.api::<Restore>().get("shop").await.unwrap();
    assert_eq!(restore.status.unwrap().phase, Some(RestorePhase::Completed));
    assert_eq!(
        std::fs::read(target.path().join("new-table")).unwrap(),
        b"rows"
    );
    setup.finish().await;
}

/// A StatefulSet of one PostgreSQL pod (hack/build-postgres-image.sh) labelled for Cluster
/// `name`, its data directory on claim template `data`, under the restricted Pod Security
/// profile's container settings.
fn postgres_statefulset(name: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "custody.io/cluster": name}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "db", "image": "localhost/custody/postgres:15",
                        "imagePullPolicy": "Never",
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}},
                        "readinessProbe": {"exec": {"command": ["pg_isready", "-q"]},
                                           "periodSeconds": 1},
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "custody-real-node",
                         "resources": {"requests": {"storage": "64Mi"}}},
            }],
        },
    })
}

/// Runs `command` in the `db` container of `pod`; its standard output, or the failure.
fn exec(namespace: &str, pod: &str, command: &[&str]) -> Result<String, String> {
    let mut args = vec!["-n", namespace, "exec", pod, "-c", "db", "--"];
    args.extend_from_slice(command);
    let output = kubectl(&args);
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(format!(
            "{command:?} in {pod}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// What the tests compare before and after: every account's balance, as a count, a sum and a
/// digest over all rows in key order.
const ACCOUNTS: &str = "select count(*) || ' ' || sum(abalance) || ' ' || md5(string_agg(aid || ':' || abalance, ',' order by aid)) from pgbench_accounts";

/// Waits until PostgreSQL in `pod` answers, then returns the accounts' fingerprint.
async fn accounts(namespace: &str, pod: &str) -> String {
    let (namespace, pod) = (namespace.to_string(), pod.to_string());
    custody_tests::eventually("PostgreSQL answering", TIMEOUT, || {
        let (namespace, pod) = (namespace.clone(), pod.clone());
        async move { exec(&namespace, &pod, &["psql", "-Atc", ACCOUNTS]) }
    })
    .await
}

/// Issue 13 item 4 and issue 14, on a real node with a real PostgreSQL: a backup of the
/// database while it runs, with no consistency method, is refused; stopped (its StatefulSet
/// scaled to 0), it is backed up as a stopped application; restored into a new Cluster, whose
/// pod custody-wait holds in Init until the agent verified the volume, PostgreSQL starts on it
/// without a manual step and answers with exactly the same rows, its indexes and heap intact
/// (pg_amcheck --heapallindexed).
#[tokio::test]
async fn on_a_real_node_postgresql_backed_up_stopped_restores_verified_and_answers_with_the_same_rows()
 {
    let _agents = AGENTS.read().await;
    let node = real_node();
    let _installed = Installed::apply();
    let client = client().await;
    running(&client).await;
    let namespace = TestNamespace::create("postgres").await;
    let ns = namespace.name.clone();
    let bucket = s3::bucket(s3::shared(), "postgres").await;
    repository(&namespace, &s3_for_pods(), &bucket).await;

    // Cluster orders: PostgreSQL on a real volume, no consistency method chosen.
    let source = LoopVolume::new(384);
    std::os::unix::fs::chown(source.path(), Some(999), Some(999)).unwrap();
    local_volume(&client, node, &ns, "data-orders-0", source.path()).await;
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
    create::<StatefulSet>(&namespace.api(), postgres_statefulset("orders")).await;
    // 300,000 accounts, then transactions so that balances differ from the initial zeros.
    custody_tests::eventually("pgbench -i", TIMEOUT, || {
        let ns = ns.clone();
        async move { exec(&ns, "orders-0", &["pgbench", "-i", "-s", "3", "-q"]) }
    })
    .await;
    exec(&ns, "orders-0", &["pgbench", "-c", "2", "-t", "300", "-n"]).unwrap();
    exec(&ns, "orders-0", &["psql", "-c", "create extension amcheck"]).unwrap();
    let before = accounts(&ns, "orders-0").await;
    assert!(before.starts_with("300000 "), "{before}");

    // Running, no method: refused, naming the pod.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": "live"}, "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await;
    let refused = await_condition(
        &namespace.api::<Backup>(),
        "live",
        "refused",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Failed)
        },
    )
    .await;
    let reason = refused
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|condition| condition.type_ == "Ready")
        .unwrap();
    assert_eq!(reason.reason, "ConsistencyMethodRequired", "{reason:?}");
    assert!(reason.message.contains("pod orders-0"), "{}", reason.message);

    // Stopped: the StatefulSet scaled to 0, PostgreSQL shut down cleanly; then backed up.
    let output = kubectl(&["-n", &ns, "scale", "statefulset/orders", "--replicas=0"]);
    assert!(output.status.success(), "{output:?}");
    let pods: Api<Pod> = namespace.api();
    custody_tests::eventually("orders-0 gone", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            match pods.get_opt("orders-0").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
    nightly_completed(&namespace).await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(Capture::Stopped));
    assert!(
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Consistent" && condition.status == "True"),
        "{:?}",
        status.conditions
    );
    assert_eq!(status.node_name, None, "placed by the scheduler");

    // Restored into Cluster shop: held until verified, then PostgreSQL starts on it.
    let target = LoopVolume::new(384);
    local_volume(&client, node, &ns, "data-shop-0", target.path()).await;
    let started = std::time::Instant::now();
    create::<Cluster>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "shop"},
            "spec": {"statefulSetRef": {"name": "shop"}, "volumeClaimTemplates": ["data"],
                     "restore": {"backupRef": {"name": "nightly"}}},
        }),
    )
    .await;
    await_condition(
        &namespace.api::<Restore>(),
        "shop",
        "the Restore",
        TIMEOUT,
        |_: &Restore| true,
    )
    .await;
    create::<StatefulSet>(&namespace.api(), postgres_statefulset("shop")).await;
    let held = await_condition(&pods, "shop-0", "held by custody-wait", TIMEOUT, |pod: &Pod| {
        pod.status.as_ref().is_some_and(|status| {
            status
                .init_container_statuses
                .iter()
                .flatten()
                .next()
                .is_some_and(|wait| wait.name == "custody-wait")
        })
    })
    .await;
    assert!(
        held.status
            .unwrap()
            .container_statuses
            .iter()
            .flatten()
            .all(|container| !container.ready),
        "PostgreSQL ran before the volume was verified"
    );
    let restore = restore_reaches(&namespace, "shop", RestorePhase::Completed).await;
    assert_eq!(
        restore.status.unwrap().volumes[0].state,
        VolumeState::Verified
    );
    let after = accounts(&ns, "shop-0").await;
    let restore_to_answer = started.elapsed();
    assert_eq!(after, before, "the restored database has other rows");
    let checked = exec(
        &ns,
        "shop-0",
        &["pg_amcheck", "--heapallindexed", "--install-missing", "postgres"],
    );
    assert!(checked.is_ok(), "pg_amcheck: {checked:?}");
    let size = status.artifact.and_then(|artifact| artifact.size_bytes);
    eprintln!(
        "postgres restore: Cluster created to the restored database answering: {:.1} s (artifact {} bytes)",
        restore_to_answer.as_secs_f64(),
        size.unwrap_or_default()
    );

    namespace.delete().await;
    for claim in ["data-orders-0", "data-shop-0"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{ns}-{claim}"), &Default::default())
            .await;
    }
}
