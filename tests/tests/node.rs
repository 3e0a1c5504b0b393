//! custody on a real node, installed as users install it: kubelet v1.36 and Debian's
//! containerd and runc (hack/node-up.sh), custody's images built from this repository
//! (hack/build-images.sh) and `kubectl apply -k deploy/` unchanged, nothing made by hand first
//! (the controller makes every certificate). Every test here is named `on_a_real_node_…`: it is
//! a tier of its own in hack/test.sh (see custody_tests::node).

use std::path::Path;
use std::time::Duration;

use custody_kube::api::{
    Backup, BackupPhase, Capture, Cluster, NodeAgent, Restore, RestorePhase, VolumeState,
};
use custody_tests::node::real_node;
use custody_tests::s3;
use custody_tests::scenario::{
    create, encrypted_repository, nightly_completed, repository, restore_reaches, small_database,
    source_cluster,
};
use custody_tests::volumes::{LoopVolume, tree};
use custody_tests::{TestNamespace, await_condition, client, kubectl, repo_root};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);
const NAMESPACE: &str = "custody-system";
/// Where the Helm release's own record lives; custody itself goes into [`NAMESPACE`], which
/// the chart makes.
const HELM_RELEASE_NAMESPACE: &str = "default";

/// custody installed from `deploy/`; removed again (all but the CRDs, the namespace and its
/// Secrets, which other tiers share) when dropped, so that its cluster-wide webhook outlives
/// no test. `helm`: installed with the Helm chart instead (by a test that holds the agents
/// exclusively, so no other test uses an install meanwhile), uninstalled when dropped.
struct Installed {
    helm: bool,
}

/// What `kubectl apply -k deploy/` makes besides the CRDs and the namespace, as `kind/name`
/// (namespaced ones in custody-system): a Helm release cannot adopt objects it did not make.
const INSTALLED: &[&str] = &[
    "serviceaccount/custody-controller",
    "serviceaccount/custody-agent",
    "role/custody-controller",
    "rolebinding/custody-controller",
    "role/custody-agent",
    "rolebinding/custody-agent",
    "service/custody-controller",
    "deployment/custody-controller",
    "poddisruptionbudget/custody-controller",
    "daemonset/custody-agent",
    "clusterrole/custody-controller",
    "clusterrole/custody-agent",
    "clusterrolebinding/custody-controller",
    "clusterrolebinding/custody-agent",
    "mutatingwebhookconfiguration/custody-restore-gate",
    "validatingwebhookconfiguration/custody-requester-check",
    "clusterrole/custody-view",
    "clusterrole/custody-edit",
    "clusterrole/custody-hooks",
    "validatingadmissionpolicy/custody-controller-namespaces",
    "validatingadmissionpolicybinding/custody-controller-namespaces",
];

/// Tests under way that use the install (they run in parallel; the last one removes it).
static USERS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

impl Installed {
    /// The first test applies `deploy/`; the others wait for it and share it.
    fn apply() -> Installed {
        let mut users = USERS.lock().expect("not poisoned");
        *users += 1;
        if *users > 1 {
            return Installed { helm: false };
        }
        // A namespace a Helm uninstall deleted may still be going away.
        let phase = kubectl(&[
            "get",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "-o",
            "jsonpath={.status.phase}",
        ]);
        if String::from_utf8_lossy(&phase.stdout).trim() == "Terminating" {
            let waited = kubectl(&[
                "wait",
                "--for=delete",
                &format!("namespace/{NAMESPACE}"),
                "--timeout=180s",
            ]);
            assert!(waited.status.success(), "{waited:?}");
        }
        let deploy = repo_root().join("deploy");
        let output = kubectl(&["apply", "-k", deploy.to_str().expect("utf-8 path")]);
        assert!(
            output.status.success(),
            "kubectl apply -k deploy/ failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Installed { helm: false }
    }

    /// Installs with the chart on a cluster without custody, as `helm install custody
    /// deploy/helm/custody` (one command: the chart makes namespace custody-system with its Pod
    /// Security label, the controller every certificate; the images are the chart's defaults,
    /// the tags `deploy/` names). What an earlier install left, its namespace included, is
    /// deleted first.
    fn helm() -> Installed {
        assert_eq!(
            *USERS.lock().expect("not poisoned"),
            0,
            "an install is in use"
        );
        let mut args = vec!["-n", NAMESPACE, "delete", "--ignore-not-found"];
        args.extend(INSTALLED);
        let output = kubectl(&args);
        assert!(output.status.success(), "{output:?}");
        let output = kubectl(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--timeout=180s",
        ]);
        assert!(output.status.success(), "{output:?}");
        let chart = repo_root().join("deploy/helm/custody");
        let output = helm(&[
            "install",
            "custody",
            chart.to_str().expect("utf-8 path"),
            "--namespace",
            HELM_RELEASE_NAMESPACE,
        ]);
        assert!(output.status.success(), "helm install failed: {output:?}");
        Installed { helm: true }
    }
}

/// Runs the helm hack/build-helm.sh builds, against the local control plane.
fn helm(args: &[&str]) -> std::process::Output {
    let built = std::process::Command::new(repo_root().join("hack/build-helm.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("running hack/build-helm.sh");
    assert!(built.status.success(), "hack/build-helm.sh failed");
    let binary = String::from_utf8(built.stdout)
        .expect("utf-8")
        .lines()
        .last()
        .expect("the helm binary")
        .trim()
        .to_string();
    std::process::Command::new(binary)
        .arg(format!(
            "--kubeconfig={}",
            custody_tests::control_plane().display()
        ))
        .args(args)
        .output()
        .expect("running helm")
}

impl Drop for Installed {
    fn drop(&mut self) {
        if self.helm {
            let _ = helm(&[
                "uninstall",
                "custody",
                "--namespace",
                HELM_RELEASE_NAMESPACE,
                "--wait",
            ]);
            return;
        }
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
            "validatingwebhookconfiguration/custody-requester-check",
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
        "every replica available",
        TIMEOUT,
        |deployment: &Deployment| {
            let wanted = deployment.spec.as_ref().and_then(|spec| spec.replicas);
            wanted.is_some()
                && deployment
                    .status
                    .as_ref()
                    .and_then(|status| status.available_replicas)
                    == wanted
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
    // Custody's own objects go through its validating webhook (failurePolicy Fail): wait
    // until the Service routes to it (a server-side dry run is sent to webhooks too).
    custody_tests::eventually(
        "custody's webhook answering through its Service",
        TIMEOUT,
        || {
            let clusters: Api<Cluster> = Api::namespaced(client.clone(), "default");
            async move {
                let probe = serde_json::from_value(json!({
                    "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
                    "metadata": {"name": "custody-webhook-probe"},
                    "spec": {"statefulSetRef": {"name": "probe"}, "volumeClaimTemplates": ["data"]},
                }))
                .expect("a Cluster");
                let dry_run = PostParams {
                    dry_run: true,
                    ..PostParams::default()
                };
                clusters
                    .create(&dry_run, &probe)
                    .await
                    .map(|_| ())
                    .map_err(|error| error.to_string())
            }
        },
    )
    .await;
}

#[tokio::test]
async fn on_a_real_node_custody_installs_from_deploy_and_its_agent_reports_through_the_service() {
    let _agents = AGENTS.read().await;
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

    // Memory of both as real pods, idle (no restore, no backup), from their processes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (app, limit_mib) in [("custody-agent", 128), ("custody-controller", 512)] {
        let pod = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|pod| pod.metadata.deletion_timestamp.is_none())
            .unwrap_or_else(|| panic!("no {app} pod"));
        let id = pod
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .container_id
            .clone()
            .expect("a container ID");
        let rss = container_rss_kib(id.trim_start_matches("containerd://"));
        eprintln!("idle {app} as a pod: RSS {:.1} MiB", rss as f64 / 1024.0);
        assert!(rss > 0 && rss < limit_mib * 1024, "{app}: {rss} KiB");
    }

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
/// volume) mounts claim template `data`, labelled for Cluster `name`. It meets Pod Security
/// `restricted`, as an application in a locked-down namespace would.
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
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65534,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "db", "image": "localhost/custody/pause:1",
                                    "imagePullPolicy": "Never",
                                    "securityContext": {"allowPrivilegeEscalation": false,
                                                        "capabilities": {"drop": ["ALL"]}},
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
    backed_up_on(prefix, agents, installed, node).await
}

/// custody installed with its Helm chart (the test runs alone), then as [`backed_up`].
async fn backed_up_by_helm(prefix: &str) -> BackedUp {
    let agents = Agents::Exclusive(AGENTS.write().await);
    let node = real_node();
    let installed = Installed::helm();
    backed_up_on(prefix, agents, installed, node).await
}

async fn backed_up_on(
    prefix: &str,
    agents: Agents,
    installed: Installed,
    node: &'static str,
) -> BackedUp {
    let client = client().await;
    running(&client).await;
    let namespace = TestNamespace::create(prefix).await;
    let ns = namespace.name.clone();

    // An encrypted repository the Jobs' pods reach on the host address.
    let bucket = s3::bucket(s3::shared(), prefix).await;
    encrypted_repository(&namespace, &s3_for_pods(), &bucket).await;

    // The source: Cluster orders, its StatefulSet's pod running on the node on a real volume.
    let source = LoopVolume::new(64);
    small_database(source.path());
    // More than the mover buffers (two 5 MiB parts) and incompressible: with the upload
    // stalled, the read waits, and the freeze lasts.
    let mut bulk = vec![0u8; 40 << 20];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bulk))
        .unwrap();
    std::fs::write(source.path().join("bulk"), bulk).unwrap();
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

    /// Moves the repository's endpoint behind a relay that answers at 2 MB/s, so that a
    /// restore of the Backup (45 MB) takes about 20 s: something can happen while it writes.
    async fn slow_repository(&self) -> s3::FaultyLink {
        let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
        let relay = s3::FaultyLink::start_on(&host, s3::shared());
        relay.set(s3::Fault::ThrottleDownloads(2_000_000));
        self.namespace
            .api::<custody_kube::api::BackupRepository>()
            .patch(
                "store",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"endpoint": relay.url}})),
            )
            .await
            .unwrap();
        relay
    }

    /// The name of a running prepareData pod and its mover's container ID, once there is one.
    async fn running_mover(&self) -> (String, String) {
        let role = format!(
            "{}={}",
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_PREPARE_DATA
        );
        custody_tests::eventually("a running mover", TIMEOUT, || {
            let pods = self.pods.clone();
            let role = role.clone();
            async move {
                pods.list(&ListParams::default().labels(&role))
                    .await
                    .map_err(|error| error.to_string())?
                    .items
                    .into_iter()
                    .find_map(|pod| {
                        let container = pod
                            .status
                            .iter()
                            .flat_map(|status| status.container_statuses.iter().flatten())
                            .find(|container| {
                                container.name == "mover"
                                    && container
                                        .state
                                        .as_ref()
                                        .is_some_and(|state| state.running.is_some())
                            })?
                            .container_id
                            .clone()?;
                        Some((pod.metadata.name.clone()?, container))
                    })
                    .ok_or_else(|| "no running mover yet".to_string())
            }
        })
        .await
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
    let pod = ready(pods, "shop-0").await;
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

/// A restore whose repository was changed after the backup (one byte of its largest pack) is
/// refused, and its pod stays in Init: custody-wait keeps the application container from
/// ever starting on the unverified volume.
#[tokio::test]
async fn on_a_real_node_a_tampered_restore_is_refused_and_its_pod_stays_held() {
    let setup = backed_up("tamper").await;
    let mut largest = (0, String::new(), Vec::new());
    for key in s3::keys(
        s3::shared(),
        &setup.bucket,
        "custody/custody_repository/data/",
    )
    .await
    {
        let bytes = s3::get(s3::shared(), &setup.bucket, &key).await;
        if bytes.len() > largest.0 {
            largest = (bytes.len(), key, bytes);
        }
    }
    let (_, pack, mut bytes) = largest;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    s3::put(s3::shared(), &setup.bucket, &pack, bytes).await;

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
    never_started(status);
    assert!(
        !status
            .conditions
            .iter()
            .flatten()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
    );
    setup.finish().await;
}

/// Pod Security (#13 item 5, #15 item 3). In a namespace enforcing `restricted`, the restored
/// application pod and the `custody-wait` the webhook injects are admitted and run; the
/// prepareData Job's pod is refused (it runs as root to write files of every owner), so the
/// Job has no pod at all, and the Restore says so, naming the Job and Pod Security's words,
/// with a Warning, rather than waiting in silence. With the documented exception (the
/// namespace enforcing `baseline`, warning at `restricted`) the same Restore completes.
#[tokio::test]
async fn on_a_real_node_pod_security_restricted_admits_the_held_pod_and_names_the_refused_mover() {
    let setup = backed_up("podsecurity").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let ns = namespace.name.clone();
    let label = |level: &str| {
        let output = kubectl(&[
            "label",
            "--overwrite",
            "namespace",
            &ns,
            &format!("pod-security.kubernetes.io/enforce={level}"),
            "pod-security.kubernetes.io/warn=restricted",
        ]);
        assert!(output.status.success(), "{output:?}");
    };
    label("restricted");
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    // Admitted under restricted: the pod exists, held in Init by custody-wait.
    await_condition(
        pods,
        "shop-0",
        "held by custody-wait",
        TIMEOUT,
        |pod: &Pod| {
            pod.status.as_ref().is_some_and(|status| {
                status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|wait| {
                        wait.state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                    })
            })
        },
    )
    .await;
    let refused =
        custody_tests::scenario::restore_says(namespace, "shop", "JobPodNotStarting", TIMEOUT)
            .await;
    let status = refused.status.clone().unwrap();
    let volume = &status.volumes[0];
    let job = volume.job_name.clone().expect("a Job");
    let message = volume.message.clone().unwrap_or_default();
    assert!(
        message.contains(&job)
            && message.contains("no pod could be created")
            && message.contains("PodSecurity")
            && message.contains("restricted"),
        "{message}"
    );
    assert_eq!(volume.state, VolumeState::Restoring, "{volume:?}");
    eprintln!("pod security: the Restore's volume says: {message}");
    custody_tests::eventually("the Warning naming Pod Security", TIMEOUT, || {
        let ns = ns.clone();
        async move {
            let events = kubectl(&[
                "-n",
                &ns,
                "get",
                "events",
                "--field-selector",
                "reason=JobPodNotStarting,type=Warning",
                "-o",
                "jsonpath={.items[*].message}",
            ]);
            let events = String::from_utf8_lossy(&events.stdout).to_string();
            events.contains("PodSecurity").then_some(()).ok_or(events)
        }
    })
    .await;
    let refused_at = std::time::Instant::now();

    // The documented exception: baseline for custody's Jobs.
    label("baseline");
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    eprintln!(
        "pod security: the restore completed {:.1} s after the namespace allowed baseline",
        refused_at.elapsed().as_secs_f64()
    );
    assert_eq!(
        restore.status.unwrap().volumes[0].state,
        VolumeState::Verified
    );
    ready(pods, "shop-0").await;
    // The mover ran with only the capabilities it asks for.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = namespace.api();
    let backup_job = jobs
        .list(&ListParams::default().labels("custody.io/role"))
        .await
        .unwrap()
        .items;
    assert!(!backup_job.is_empty(), "the Backup's Job is kept");
    for job in backup_job {
        let container = &job.spec.unwrap().template.spec.unwrap().containers[0];
        let security = container.security_context.clone().unwrap();
        assert_eq!(
            security.capabilities.unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }
    setup.finish().await;
}

/// #15 item 4, on a real node: the prepareData pod is killed while it writes the volume (the
/// download throttled so that it is caught mid-way). Its Job makes another pod, which finds
/// the first one's unfinished output (its own restore identity, no manifest yet), starts
/// clean and writes the whole volume; the agent verifies it and the Restore completes, with
/// no Job of custody's recreated.
#[tokio::test]
async fn on_a_real_node_a_restore_whose_mover_is_killed_mid_write_is_retried_by_its_job_and_verified()
 {
    let setup = backed_up("retried").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let relay = setup.slow_repository().await;
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;

    // The first prepareData pod, its mover running and part of the volume written.
    let role = format!(
        "{}={}",
        custody_proto::names::LABEL_ROLE,
        custody_proto::names::ROLE_PREPARE_DATA
    );
    let (first, container) = setup.running_mover().await;
    let written = || {
        let output = std::process::Command::new("du")
            .args(["-sb", target.path().to_str().unwrap()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .and_then(|bytes| bytes.parse::<u64>().ok())
            .unwrap_or(0)
    };
    custody_tests::eventually("part of the volume written", TIMEOUT, || {
        let bytes = written();
        async move {
            (bytes > 8 << 20)
                .then_some(())
                .ok_or(format!("{bytes} bytes"))
        }
    })
    .await;
    assert!(
        target.path().join(".custody/restore.json").is_file(),
        "the mover writes its identity first"
    );
    assert!(!target.path().join(".custody/manifest.jsonl").exists());
    let id = container.trim_start_matches("containerd://");
    ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
    eprintln!(
        "retried restore: killed the mover of {first} with {} bytes written",
        written()
    );

    // Its pod failed (a failure of the moment: 137), and the Job made another.
    let killed = await_condition(pods, &first, "failed", TIMEOUT, |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref())
            == Some("Failed")
    })
    .await;
    let code = killed
        .status
        .iter()
        .flat_map(|status| status.container_statuses.iter().flatten())
        .find_map(|container| Some(container.state.as_ref()?.terminated.as_ref()?.exit_code));
    assert_eq!(code, Some(137), "{:?}", killed.status);
    let second = custody_tests::eventually("the Job's next pod", TIMEOUT, || {
        let pods = pods.clone();
        let role = role.clone();
        let first = first.clone();
        async move {
            pods.list(&ListParams::default().labels(&role))
                .await
                .map_err(|error| error.to_string())?
                .items
                .into_iter()
                .filter_map(|pod| pod.metadata.name)
                .find(|name| *name != first)
                .ok_or_else(|| "no second pod yet".to_string())
        }
    })
    .await;
    relay.set(s3::Fault::None);
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    assert_eq!(volume.attempts, 1, "the same Job retried: {volume:?}");
    eprintln!("retried restore: {second} wrote the volume; {volume:?}");
    let (original, restored) = (tree(setup.source.path()), tree(target.path()));
    let differing: Vec<&String> = original
        .keys()
        .chain(restored.keys())
        .filter(|path| original.get(*path) != restored.get(*path))
        .collect();
    assert!(differing.is_empty(), "restored differs at {differing:?}");
    ready(pods, "shop-0").await;
    setup.finish().await;
}

/// #13, on the real node: the agent DaemonSet is rolled out while a restore writes its volume.
/// The new agent pod, with nothing in memory, takes the restore over (the prepareData pod it
/// did not see start, the volume it never saw written) and verifies it; the pod, held all
/// along, is released, and the Restore completes with the new agent's word.
#[tokio::test]
async fn on_a_real_node_an_agent_rollout_during_a_restore_is_taken_over_by_the_new_agent() {
    let setup = backed_up_with("rollout", Agents::Exclusive(AGENTS.write().await)).await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let _relay = setup.slow_repository().await;
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(setup.client.clone(), NAMESPACE);
    let before = daemonsets
        .get("custody-agent")
        .await
        .unwrap()
        .metadata
        .generation;
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "restart",
        "daemonset/custody-agent",
    ]);
    assert!(output.status.success(), "{output:?}");
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        "daemonset/custody-agent",
        "--timeout=120s",
    ]);
    assert!(output.status.success(), "{output:?}");
    let after = daemonsets.get("custody-agent").await.unwrap();
    assert!(after.metadata.generation > before, "rolled out");
    // The mover was still writing when the new agent started.
    let writing = pods.get(&mover).await.unwrap();
    assert_ne!(
        writing
            .status
            .as_ref()
            .and_then(|status| status.phase.as_deref()),
        Some("Succeeded"),
        "the restore finished before the rollout: the test proves nothing"
    );
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    ready(pods, "shop-0").await;
    let (original, restored) = (tree(setup.source.path()), tree(target.path()));
    assert_eq!(original, restored);
    setup.finish().await;
}

/// #13, on the real node: deleting the Cluster while its restore writes the volume cancels
/// it. The Cluster deletes its Restore, the Restore its prepareData Job (the mover's pod goes),
/// and both go away; what the user made (the StatefulSet, its pod, the claim) stays, and the
/// pod, never released, has not started its application on the half-written volume.
#[tokio::test]
async fn on_a_real_node_deleting_the_cluster_cancels_its_restore_and_leaves_the_pod_held() {
    let setup = backed_up("cancel").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let _relay = setup.slow_repository().await;
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    namespace
        .api::<Cluster>()
        .delete("shop", &Default::default())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    gone(&namespace.api::<Cluster>(), "shop").await;
    gone(&namespace.api::<Restore>(), "shop").await;
    gone(pods, &mover).await;
    eprintln!(
        "cancel: Cluster, Restore and the mover's pod gone {:.1} s after the Cluster's deletion",
        started.elapsed().as_secs_f64()
    );
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = namespace.api();
    let left = jobs
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_PREPARE_DATA
        )))
        .await
        .unwrap()
        .items;
    assert!(left.is_empty(), "{left:?}");
    // The user's objects stay; the pod is still held in Init.
    namespace
        .api::<StatefulSet>()
        .get("shop")
        .await
        .expect("the StatefulSet stays");
    namespace
        .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get("data-shop-0")
        .await
        .expect("the claim stays");
    // The agent says why the pod stays held, instead of waiting for a prepareData pod that
    // will never come: its Restore was deleted before it verified the claim.
    let failed = reported_volume(
        &setup.client,
        setup.node,
        "the agent reports the held volume failed",
        |volume| volume.pod_name == "shop-0" && volume.state == VolumeState::Failed,
    )
    .await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("RestoreNotFound"),
        "{failed:?}"
    );
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("was deleted before it recorded claim data-shop-0 as verified"),
        "{message}"
    );
    eprintln!("cancel: the held pod's volume: RestoreNotFound: {message}");
    let pod = pods.get("shop-0").await.unwrap();
    let status = pod.status.as_ref().unwrap();
    never_started(status);
    assert!(
        !target.path().join(".custody/manifest.jsonl").exists(),
        "the restore was not finished"
    );
    setup.finish().await;
}

/// The first volume node `node`'s agent reports (its NodeAgent's `status.restoredVolumes`)
/// that `wanted` accepts, waited for.
async fn reported_volume(
    client: &kube::Client,
    node: &str,
    what: &str,
    wanted: impl Fn(&custody_kube::api::ReportedVolume) -> bool,
) -> custody_kube::api::ReportedVolume {
    let agents = Api::<NodeAgent>::all(client.clone());
    let wanted = &wanted;
    custody_tests::eventually(what, TIMEOUT, || {
        let agents = agents.clone();
        async move {
            let status = agents
                .get(node)
                .await
                .map_err(|error| error.to_string())?
                .status
                .unwrap_or_default();
            status
                .restored_volumes
                .iter()
                .find(|volume| wanted(volume))
                .cloned()
                .ok_or_else(|| format!("{:?}", status.restored_volumes))
        }
    })
    .await
}

/// #13: custody installed with its Helm chart (`helm install custody deploy/helm/custody -n
/// custody-system`, the chart written from `deploy/` by hack/gen-chart.sh) backs up and
/// restores verified on the real node, as when installed with kustomize; `helm uninstall`
/// removes what it installed.
#[tokio::test]
async fn on_a_real_node_custody_installed_with_its_helm_chart_restores_verified() {
    let setup = backed_up_by_helm("helm").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let deployment: Api<Deployment> = Api::namespaced(setup.client.clone(), NAMESPACE);
    let managed = deployment.get("custody-controller").await.unwrap();
    assert_eq!(
        managed
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("app.kubernetes.io/managed-by"))
            .map(String::as_str),
        Some("Helm"),
        "{:?}",
        managed.metadata.labels
    );
    assert_eq!(
        managed
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get("meta.helm.sh/release-name"))
            .map(String::as_str),
        Some("custody")
    );
    // One command on a cluster without custody: the chart made the namespace, with the Pod
    // Security label the agent needs, and nothing was made by hand (no TLS Secret: the
    // controller made custody's CA and the agents' gate certificates).
    let made = Api::<k8s_openapi::api::core::v1::Namespace>::all(setup.client.clone())
        .get(NAMESPACE)
        .await
        .unwrap();
    let labels = made.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged"),
        "{labels:?}"
    );
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("Helm"),
        "{labels:?}"
    );
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    assert_eq!(
        restore.status.as_ref().unwrap().volumes[0].state,
        VolumeState::Verified
    );
    ready(pods, "shop-0").await;
    let listed = helm(&["list", "--namespace", HELM_RELEASE_NAMESPACE, "--short"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("custody"),
        "{listed:?}"
    );

    // Issue 23, uninstall: `helm uninstall` first runs the chart's pre-delete hook (`custody-
    // controller uninstall` in a Job): the webhook configurations go, the controller stops,
    // and custody's finalizers come off users' objects and Secrets, so that the namespace can
    // be deleted once custody is gone (finish() waits for it).
    let custody_finalizers = |finalizers: &[String]| {
        finalizers
            .iter()
            .filter(|finalizer| finalizer.starts_with("custody.io/"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    assert_eq!(
        custody_finalizers(nightly.finalizers()),
        ["custody.io/artifact-cleanup"],
        "a finalizer the uninstall must remove"
    );
    let uninstalled = helm(&[
        "uninstall",
        "custody",
        "--namespace",
        HELM_RELEASE_NAMESPACE,
        "--wait",
        "--timeout",
        "5m",
    ]);
    assert!(
        uninstalled.status.success(),
        "helm uninstall: {uninstalled:?}"
    );
    let mut left = Vec::new();
    for backup in namespace
        .api::<Backup>()
        .list(&Default::default())
        .await
        .unwrap()
    {
        left.push((backup.name_any(), custody_finalizers(backup.finalizers())));
    }
    for restore in namespace
        .api::<Restore>()
        .list(&Default::default())
        .await
        .unwrap()
    {
        left.push((restore.name_any(), custody_finalizers(restore.finalizers())));
    }
    for cluster in namespace
        .api::<Cluster>()
        .list(&Default::default())
        .await
        .unwrap()
    {
        left.push((cluster.name_any(), custody_finalizers(cluster.finalizers())));
    }
    let secrets = namespace.api::<k8s_openapi::api::core::v1::Secret>();
    for secret in secrets.list(&Default::default()).await.unwrap() {
        left.push((secret.name_any(), custody_finalizers(secret.finalizers())));
    }
    left.retain(|(_, finalizers)| !finalizers.is_empty());
    assert!(left.is_empty(), "custody finalizers left: {left:?}");
    assert!(
        Api::<MutatingWebhookConfiguration>::all(setup.client.clone())
            .get_opt("custody-restore-gate")
            .await
            .unwrap()
            .is_none()
            && Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
                setup.client.clone()
            )
            .get_opt("custody-requester-check")
            .await
            .unwrap()
            .is_none(),
        "a webhook configuration outlived the uninstall"
    );
    // The chart's namespace went with it.
    custody_tests::eventually("custody's namespace deleted", TIMEOUT, || {
        let client = setup.client.clone();
        async move {
            match Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
                .get_opt(NAMESPACE)
                .await
            {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
    setup.finish().await;
}

/// The resident memory, in KiB, of the main process of container `id` (from `ctr tasks ls`).
fn container_rss_kib(id: &str) -> u64 {
    let tasks = ctr(&["tasks", "ls"]);
    let pid = tasks
        .lines()
        .find(|line| line.starts_with(id))
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no task {id} in {tasks}"));
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("the process status")
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Waits until pod `name` runs and is Ready (its readiness gate set, when it has one).
async fn ready(pods: &Api<Pod>, name: &str) -> Pod {
    await_condition(pods, name, "running and ready", TIMEOUT, |pod: &Pod| {
        pod.status.as_ref().is_some_and(|status| {
            status.phase.as_deref() == Some("Running")
                && status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await
}

/// Asserts that no application container of a pod has run.
fn never_started(status: &k8s_openapi::api::core::v1::PodStatus) {
    assert!(
        status
            .container_statuses
            .iter()
            .flatten()
            .all(|container| container
                .state
                .as_ref()
                .is_none_or(|state| state.running.is_none())),
        "the application started: {:?}",
        status.container_statuses
    );
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
    // Settled after `runs` runs of custody-wait: it ended released and the application runs
    // in the new sandbox (a Ready condition alone may still be the old sandbox's).
    let settled = |runs: i32| {
        move |pod: &Pod| {
            pod.status.as_ref().is_some_and(|status| {
                let released = status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|wait| {
                        wait.restart_count >= runs - 1
                            && wait.state.as_ref().is_some_and(|state| {
                                state
                                    .terminated
                                    .as_ref()
                                    .is_some_and(|ended| ended.exit_code == 0)
                            })
                    });
                let running = status.container_statuses.iter().flatten().all(|container| {
                    container.ready
                        && container
                            .state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                });
                released && running
            }) && ready(pod)
        }
    };
    let after = await_condition(pods, "shop-0", "ready again", TIMEOUT, settled(2)).await;
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
    let restore_uid = restore.metadata.uid.clone().unwrap();
    assert_eq!(restore.status.unwrap().phase, Some(RestorePhase::Completed));
    assert_eq!(
        std::fs::read(target.path().join("new-table")).unwrap(),
        b"rows"
    );

    // The Restore is deleted; its record stays on the claim. (The Cluster, whose
    // `spec.restore` still names the Backup, makes a new Restore of that name, with another
    // UID.) The pod's custody-wait still names the deleted Restore: should the kubelet run it
    // again, the agent answers from that record instead of waiting for the Restore's
    // prepareData pod for ever.
    namespace
        .api::<Restore>()
        .delete("shop", &Default::default())
        .await
        .unwrap();
    custody_tests::eventually("the Restore that verified the pod gone", TIMEOUT, || {
        let restores = namespace.api::<Restore>();
        let restore_uid = restore_uid.clone();
        async move {
            match restores.get_opt("shop").await {
                Ok(Some(restore)) if restore.metadata.uid.as_deref() == Some(&restore_uid) => {
                    Err("still there".to_string())
                }
                Ok(_) => Ok(()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
    let claim = namespace
        .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get("data-shop-0")
        .await
        .unwrap();
    let record = custody_proto::names::verified_by_restore(&restore_uid);
    assert_eq!(
        claim.annotations().get(&record).map(String::as_str),
        Some("shop"),
        "{:?}",
        claim.annotations()
    );
    // The agent, which no longer watches that Restore, asks the API server and answers the
    // pod's custody-wait from the claim's record: Verified, not "waiting for the prepareData
    // pod" (what it said before the record existed).
    let volume = reported_volume(
        &setup.client,
        node,
        "the agent reports the pod's volume verified with its Restore gone",
        |volume| {
            volume.pod_name == "shop-0"
                && volume.restore_uid == restore_uid
                && volume.state == VolumeState::Verified
                && volume
                    .message
                    .as_deref()
                    .is_some_and(|message| message.contains("before it was deleted"))
        },
    )
    .await;
    eprintln!(
        "rollout: with its Restore gone: {}",
        volume.message.unwrap_or_default()
    );
    let released = pods.get("shop-0").await.unwrap();
    assert!(ready(&released));
    assert_eq!(released.metadata.uid, before.metadata.uid);
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
                        // A new database's password, for a backup tool's connection.
                        "env": [{"name": "POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {
                            "name": format!("{name}-credentials"), "key": "PGPASSWORD",
                            "optional": true}}}],
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

/// Cluster `orders`: PostgreSQL on a real volume of the node, with `consistency` (or none),
/// `scale` × 100,000 pgbench accounts, some transactions run, and amcheck installed. Its
/// volume.
async fn postgres_source(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    consistency: Option<serde_json::Value>,
    scale: u32,
) -> LoopVolume {
    let ns = namespace.name.clone();
    let source = LoopVolume::new(volume_mib(scale));
    std::os::unix::fs::chown(source.path(), Some(999), Some(999)).unwrap();
    local_volume(client, node, &ns, "data-orders-0", source.path()).await;
    let mut spec = json!({"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                          "repositoryRef": {"name": "store"}});
    if let Some(consistency) = consistency {
        spec["consistency"] = consistency;
    }
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": "orders"}, "spec": spec}),
    )
    .await;
    create::<StatefulSet>(&namespace.api(), postgres_statefulset("orders")).await;
    let scale = scale.to_string();
    custody_tests::eventually("pgbench -i", TIMEOUT, || {
        let (ns, scale) = (ns.clone(), scale.clone());
        async move { exec(&ns, "orders-0", &["pgbench", "-i", "-s", &scale, "-q"]) }
    })
    .await;
    exec(&ns, "orders-0", &["pgbench", "-c", "2", "-t", "300", "-n"]).unwrap();
    exec(&ns, "orders-0", &["psql", "-c", "create extension amcheck"]).unwrap();
    source
}

/// The size of a volume for a pgbench database of `scale` (about 16 MB each) with its WAL.
fn volume_mib(scale: u32) -> u64 {
    (u64::from(scale) * 48).max(1024)
}

/// Restores Backup `backup` into Cluster `shop` on a new real volume: checks that custody-wait
/// held its pod until the agent verified the volume, then waits until PostgreSQL answers.
/// The volume, and the time from the Cluster's creation to the first answer.
async fn restore_postgres(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    backup: &str,
    scale: u32,
) -> (LoopVolume, Duration) {
    let started = std::time::Instant::now();
    let target = restore_shop(
        client,
        node,
        namespace,
        backup,
        postgres_statefulset("shop"),
        volume_mib(scale),
    )
    .await;
    sql(&namespace.name, "shop-0", "select 1").await;
    (target, started.elapsed())
}

/// Restores Backup `backup` into Cluster `shop` (StatefulSet `stateful_set`) on a new real
/// volume, and checks that custody-wait held its pod, the application not ready, until the
/// agent verified the volume and the Restore completed. The volume.
async fn restore_shop(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    backup: &str,
    stateful_set: serde_json::Value,
    mib: u64,
) -> LoopVolume {
    restore_shop_volumes(
        client,
        node,
        namespace,
        backup,
        stateful_set,
        mib,
        &["data"],
    )
    .await
    .remove(0)
}

/// [`restore_shop`] of a StatefulSet with a claim of each of `templates` (all of the
/// Backup's volumes), each on a new real volume; every one is verified before the pod starts.
async fn restore_shop_volumes(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    backup: &str,
    stateful_set: serde_json::Value,
    mib: u64,
    templates: &[&str],
) -> Vec<LoopVolume> {
    let ns = namespace.name.clone();
    let mut targets = Vec::new();
    for template in templates {
        let target = LoopVolume::new(mib);
        std::os::unix::fs::chown(target.path(), Some(999), Some(999)).unwrap();
        local_volume(
            client,
            node,
            &ns,
            &format!("{template}-shop-0"),
            target.path(),
        )
        .await;
        targets.push(target);
    }
    create::<Cluster>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "shop"},
            "spec": {"statefulSetRef": {"name": "shop"}, "volumeClaimTemplates": templates,
                     "restore": {"backupRef": {"name": backup}}},
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
    // Marked as under restore before the Cluster was admitted (the requester webhook).
    let namespace_labels = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get(&ns)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert!(
        namespace_labels.contains_key("custody.io/restore-in-progress"),
        "{namespace_labels:?}"
    );
    create::<StatefulSet>(&namespace.api(), stateful_set).await;
    let pods: Api<Pod> = namespace.api();
    let held = await_condition(
        &pods,
        "shop-0",
        "held by custody-wait",
        TIMEOUT,
        |pod: &Pod| {
            pod.status.as_ref().is_some_and(|status| {
                status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|wait| wait.name == "custody-wait")
            })
        },
    )
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
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let volumes = restore.status.unwrap().volumes;
    assert_eq!(volumes.len(), templates.len(), "{volumes:?}");
    assert!(
        volumes
            .iter()
            .all(|volume| volume.state == VolumeState::Verified),
        "{volumes:?}"
    );
    targets
}

/// Waits until PostgreSQL in `pod` answers `query`; its answer.
async fn sql(namespace: &str, pod: &str, query: &str) -> String {
    let (namespace, pod, query) = (namespace.to_string(), pod.to_string(), query.to_string());
    custody_tests::eventually("PostgreSQL answering", TIMEOUT, || {
        let (namespace, pod, query) = (namespace.clone(), pod.clone(), query.clone());
        async move { exec(&namespace, &pod, &["psql", "-Atc", &query]) }
    })
    .await
}

/// Deletes the namespace and the PersistentVolumes made for it.
async fn finish_postgres(client: &kube::Client, namespace: TestNamespace) {
    let ns = namespace.name.clone();
    namespace.delete().await;
    for claim in ["data-orders-0", "data-shop-0"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{ns}-{claim}"), &Default::default())
            .await;
    }
}

/// Where each database test on the real node starts: the node, custody installed from
/// `deploy/`, and a namespace of its own with BackupRepository `store` in a bucket of its own,
/// reached directly or, `throttled`, through a relay limited to 3 MB/s (so that reading a
/// volume spans many seconds of the application's writes).
struct Stage {
    // Dropped in this order: the install is given back before the agents' lock.
    _installed: Installed,
    _agents: tokio::sync::RwLockReadGuard<'static, ()>,
    _relay: Option<s3::FaultyLink>,
    node: &'static str,
    client: kube::Client,
    namespace: TestNamespace,
}

impl Stage {
    async fn new(name: &str, throttled: bool) -> Stage {
        let agents = AGENTS.read().await;
        let node = real_node();
        let installed = Installed::apply();
        let client = client().await;
        running(&client).await;
        let namespace = TestNamespace::create(name).await;
        let bucket = s3::bucket(s3::shared(), name).await;
        let relay = throttled.then(|| {
            let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
            let relay = s3::FaultyLink::start_on(&host, s3::shared());
            relay.set(s3::Fault::Throttle(3_000_000));
            relay
        });
        let url = relay
            .as_ref()
            .map_or_else(s3_for_pods, |relay| relay.url.clone());
        encrypted_repository(&namespace, &url, &bucket).await;
        Stage {
            _agents: agents,
            _installed: installed,
            _relay: relay,
            node,
            client,
            namespace,
        }
    }
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
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("postgres", false).await;
    let ns = namespace.name.clone();
    let _source = postgres_source(&client, node, &namespace, None, 3).await;
    let before = sql(&ns, "orders-0", ACCOUNTS).await;
    assert!(before.starts_with("300000 "), "{before}");

    // Running, no method: refused, naming the pod.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": "live"}, "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "live").await;
    assert_eq!(reason, "ConsistencyMethodRequired", "{message}");
    assert!(message.contains("pod orders-0"), "{message}");

    // Stopped: the StatefulSet scaled to 0, PostgreSQL shut down cleanly; then backed up.
    let output = kubectl(&["-n", &ns, "scale", "statefulset/orders", "--replicas=0"]);
    assert!(output.status.success(), "{output:?}");
    gone(&namespace.api::<Pod>(), "orders-0").await;
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

    // Restored into Cluster shop: held until verified, then PostgreSQL starts on it. Its pod
    // template lacks the label custody.io/cluster (issue 23, item 4): the pod is held by the
    // claim it mounts, in a namespace custody marked as under restore.
    let started = std::time::Instant::now();
    let mut unlabelled = postgres_statefulset("shop");
    unlabelled["spec"]["template"]["metadata"]["labels"] = json!({"app": "shop"});
    let _target = restore_shop(
        &client,
        node,
        &namespace,
        "nightly",
        unlabelled,
        volume_mib(3),
    )
    .await;
    sql(&ns, "shop-0", "select 1").await;
    let restore_to_answer = started.elapsed();
    let after = sql(&ns, "shop-0", ACCOUNTS).await;
    assert_eq!(after, before, "the restored database has other rows");
    consistent(&namespace, 3).await;
    eprintln!(
        "postgres restore (stopped copy): Cluster created to the restored database answering: {:.1} s (artifact {} bytes)",
        restore_to_answer.as_secs_f64(),
        status
            .artifact
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default()
    );
    finish_postgres(&client, namespace).await;
}

/// pgbench's own invariant: every transaction adds the same delta to one account, one teller,
/// one branch and the history. In any consistent state the four sums are equal.
const PGBENCH_SUMS: &str = "select (select sum(abalance) from pgbench_accounts) || ' ' || (select sum(tbalance) from pgbench_tellers) || ' ' || (select sum(bbalance) from pgbench_branches) || ' ' || (select coalesce(sum(delta), 0) from pgbench_history) || ' ' || (select count(*) from pgbench_accounts)";

/// Issue 14, method Freeze, the acceptance bar on a real PostgreSQL: four pgbench clients
/// write and a CHECKPOINT runs every second while the volume is backed up with the
/// filesystem frozen. The restore starts without a manual step (crash recovery from one
/// instant), every account is there, pgbench's four sums agree (no transaction torn), and
/// pg_amcheck --heapallindexed is clean; pgbench itself never failed. The write stall is the
/// Backup's `frozenMillis`.
///
/// The upload goes through a relay limited to 3 MB/s, so that reading the 2,000,000-account
/// database spans many seconds of writes and checkpoints (the mover reads only as fast as it
/// uploads, past a few parts in memory): the same run with method `CrashUnsafe` restores a
/// database that fails these checks.
#[tokio::test]
async fn on_a_real_node_postgresql_frozen_while_pgbench_writes_restores_consistent() {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("pgfreeze", true).await;
    let ns = namespace.name.clone();
    let method = std::env::var("CUSTODY_TEST_PG_METHOD").unwrap_or_else(|_| "Freeze".into());
    let _source = postgres_source(
        &client,
        node,
        &namespace,
        Some(if method == "Freeze" {
            json!({"method": method, "maxFreezeSeconds": 120})
        } else {
            json!({"method": method})
        }),
        20,
    )
    .await;

    let load = Load::start(&ns, 75);
    tokio::time::sleep(Duration::from_secs(5)).await;
    nightly_completed(&namespace).await;
    let written_during = sql(&ns, "orders-0", "select count(*) from pgbench_history").await;
    let (tps, checkpoints) = load.finish().await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    let stall = status.frozen_millis.unwrap_or_default();
    if method == "Freeze" {
        assert_eq!(status.consistency, Some(Capture::Frozen), "{status:?}");
        assert!(stall > 0, "the stall is recorded: {status:?}");
    }

    let (_target, restore_to_answer) =
        restore_postgres(&client, node, &namespace, "nightly", 20).await;
    let sums = consistent(&namespace, 20).await;
    eprintln!(
        "postgres {method} copy under pgbench -c 4 ({tps}; {checkpoints} checkpoints; {written_during} history rows when the backup ended): filesystem frozen {stall} ms; restored sums {sums}; restore to answer {:.1} s",
        restore_to_answer.as_secs_f64()
    );
    finish_postgres(&client, namespace).await;
}

/// pgbench with four clients for `seconds`, and a CHECKPOINT every second meanwhile, against
/// orders-0.
struct Load {
    pgbench: std::thread::JoinHandle<Result<String, String>>,
    checkpoints: std::thread::JoinHandle<u32>,
}

impl Load {
    fn start(namespace: &str, seconds: u64) -> Load {
        let ns = namespace.to_string();
        let pgbench = std::thread::spawn(move || {
            let seconds = seconds.to_string();
            exec(
                &ns,
                "orders-0",
                &["pgbench", "-c", "4", "-T", &seconds, "-n", "-P", "5"],
            )
        });
        let ns = namespace.to_string();
        let checkpoints = std::thread::spawn(move || {
            let until = std::time::Instant::now() + Duration::from_secs(seconds.saturating_sub(5));
            let mut done = 0;
            while std::time::Instant::now() < until {
                if exec(&ns, "orders-0", &["psql", "-c", "checkpoint"]).is_ok() {
                    done += 1;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            done
        });
        Load {
            pgbench,
            checkpoints,
        }
    }

    /// Waits for the load to end; pgbench's `tps` line (it must not have failed) and the
    /// number of checkpoints run.
    async fn finish(self) -> (String, u32) {
        let Load {
            pgbench,
            checkpoints,
        } = self;
        let report = tokio::task::spawn_blocking(move || pgbench.join().unwrap())
            .await
            .unwrap()
            .expect("pgbench kept running through the backup");
        let checkpoints = tokio::task::spawn_blocking(move || checkpoints.join().unwrap())
            .await
            .unwrap();
        let tps = report
            .lines()
            .find(|line| line.starts_with("tps"))
            .unwrap_or_default()
            .to_string();
        (tps, checkpoints)
    }
}

/// The acceptance checks of a PostgreSQL restored into shop-0 from a database of `scale`:
/// every account is there, pgbench's four sums agree (no transaction torn), pg_amcheck
/// --heapallindexed is clean; then, shut down cleanly (StatefulSet shop scaled to 0),
/// pg_checksums --check finds every page's checksum right. The sums.
async fn consistent(namespace: &TestNamespace, scale: u32) -> String {
    consistent_on(namespace, scale, false).await
}

/// [`consistent`], for a PostgreSQL whose `pg_wal` is on claim template `wal` (`with_wal`).
async fn consistent_on(namespace: &TestNamespace, scale: u32, with_wal: bool) -> String {
    let ns = namespace.name.clone();
    let sums = sql(&ns, "shop-0", PGBENCH_SUMS).await;
    let parts: Vec<&str> = sums.split(' ').collect();
    assert_eq!(parts.len(), 5, "{sums}");
    assert_eq!(
        parts[4],
        (u64::from(scale) * 100_000).to_string(),
        "accounts lost: {sums}"
    );
    assert!(
        parts[0] == parts[1] && parts[1] == parts[2] && parts[2] == parts[3],
        "a torn transaction: accounts, tellers, branches, history sum to {sums}"
    );
    let checked = exec(
        &ns,
        "shop-0",
        &["pg_amcheck", "--heapallindexed", "postgres"],
    );
    assert!(checked.is_ok(), "pg_amcheck: {checked:?}");
    let output = kubectl(&["-n", &ns, "scale", "statefulset/shop", "--replicas=0"]);
    assert!(output.status.success(), "{output:?}");
    let pods: Api<Pod> = namespace.api();
    gone(&pods, "shop-0").await;
    create::<Pod>(
        &pods,
        json!({
            "metadata": {"name": "checksums"},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "check", "image": "localhost/custody/postgres:15",
                    "imagePullPolicy": "Never",
                    "command": ["pg_checksums", "--check", "--pgdata", "/var/lib/postgresql/data/pgdata"],
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": wal_mounts(with_wal),
                }],
                "volumes": wal_volumes(with_wal, "shop"),
            },
        }),
    )
    .await;
    let done = await_condition(
        &pods,
        "checksums",
        "pg_checksums done",
        TIMEOUT,
        |pod: &Pod| {
            matches!(
                pod.status
                    .as_ref()
                    .and_then(|status| status.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        },
    )
    .await;
    let logs = kubectl(&["-n", &ns, "logs", "checksums"]);
    let logs = String::from_utf8_lossy(&logs.stdout).to_string();
    assert_eq!(
        done.status.and_then(|status| status.phase).as_deref(),
        Some("Succeeded"),
        "pg_checksums --check after a clean shutdown: {logs}"
    );
    assert!(logs.contains("Bad checksums:  0"), "{logs}");
    sums
}

/// The mounts of PostgreSQL's volumes: its data, and (`with_wal`) its WAL's volume.
fn wal_mounts(with_wal: bool) -> serde_json::Value {
    let mut mounts = vec![json!({"name": "data", "mountPath": "/var/lib/postgresql/data"})];
    if with_wal {
        mounts.push(json!({"name": "wal", "mountPath": "/var/lib/postgresql/wal"}));
    }
    json!(mounts)
}

/// The pod volumes of StatefulSet `set`'s first pod's claims: data, and (`with_wal`) wal.
fn wal_volumes(with_wal: bool, set: &str) -> serde_json::Value {
    let mut volumes = vec![
        json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{set}-0")}}),
    ];
    if with_wal {
        volumes.push(
            json!({"name": "wal", "persistentVolumeClaim": {"claimName": format!("wal-{set}-0")}}),
        );
    }
    json!(volumes)
}

/// [`postgres_statefulset`] with its WAL on a volume of its own (claim template `wal`,
/// mounted at /var/lib/postgresql/wal; `pg_wal` a symlink into it), as CloudNativePG and
/// KubeBlocks lay PostgreSQL out.
fn postgres_statefulset_with_wal(name: &str) -> serde_json::Value {
    let mut set = postgres_statefulset(name);
    let container = &mut set["spec"]["template"]["spec"]["containers"][0];
    container["volumeMounts"] = wal_mounts(true);
    container["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "POSTGRES_INITDB_WALDIR", "value": "/var/lib/postgresql/wal/pg_wal"}));
    let template = set["spec"]["volumeClaimTemplates"][0].clone();
    let mut wal = template;
    wal["metadata"]["name"] = json!("wal");
    set["spec"]["volumeClaimTemplates"]
        .as_array_mut()
        .unwrap()
        .push(wal);
    set
}

/// Issue 24 item 1 on a real node: PostgreSQL with `pg_wal` on a second volume, frozen while
/// four pgbench clients write and a CHECKPOINT runs every second. One Backup holds both
/// volumes (both filesystems frozen before either is read, thawed together); restored into a
/// Cluster of the same two templates, each claim is written and verified against its own
/// manifest, the pod stays held until both are, and PostgreSQL starts on them with the
/// symlink into the other volume intact: every account there, pgbench's sums agree,
/// pg_amcheck and (after a clean shutdown) pg_checksums clean.
#[tokio::test]
async fn on_a_real_node_postgresql_with_its_wal_on_a_second_volume_frozen_under_load_restores_consistent()
 {
    postgres_with_wal(
        "pgwal",
        json!({"method": "Freeze", "maxFreezeSeconds": 120}),
        Capture::Frozen,
    )
    .await;
}

/// The same with method Tool: one run of `pg_basebackup --waldir=/var/lib/postgresql/wal/pg_wal`
/// writes both volumes' trees (the WAL's by the application's path, where the Job mounts that
/// volume's tree), and each is backed up as its volume.
#[tokio::test]
async fn on_a_real_node_postgresql_with_its_wal_on_a_second_volume_backed_up_by_pg_basebackup_restores_consistent()
 {
    postgres_with_wal(
        "pgwaltool",
        json!({
            "method": "Tool",
            "tool": {
                "image": "localhost/custody/postgres:15",
                "command": ["pg_basebackup", "--host=$(CUSTODY_POD_IP)", "--pgdata=$(CUSTODY_OUTPUT)",
                            "--waldir=/var/lib/postgresql/wal/pg_wal",
                            "--wal-method=stream", "--checkpoint=fast", "--no-password"],
                "credentialsSecretRef": {"name": "orders-credentials"},
                "dataPath": "pgdata",
                "scratchSize": "1Gi",
            },
        }),
        Capture::Tool,
    )
    .await;
}

/// PostgreSQL with `pg_wal` on a second volume, backed up under load with `consistency` and
/// restored into a Cluster of the same two templates, checked consistent.
async fn postgres_with_wal(name: &str, consistency: serde_json::Value, capture: Capture) {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new(name, capture == Capture::Frozen).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"PGUSER": "postgres", "PGPASSWORD": "a-test-password"}}),
    )
    .await;
    let scale = 10;
    let mut sources = Vec::new();
    for claim in ["data-orders-0", "wal-orders-0"] {
        let source = LoopVolume::new(volume_mib(scale));
        std::os::unix::fs::chown(source.path(), Some(999), Some(999)).unwrap();
        local_volume(&client, node, &ns, claim, source.path()).await;
        sources.push(source);
    }
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": "orders"},
               "spec": {"statefulSetRef": {"name": "orders"},
                        "volumeClaimTemplates": ["data", "wal"],
                        "repositoryRef": {"name": "store"},
                        "consistency": consistency}}),
    )
    .await;
    create::<StatefulSet>(&namespace.api(), postgres_statefulset_with_wal("orders")).await;
    custody_tests::eventually("pgbench -i", TIMEOUT, || {
        let ns = ns.clone();
        async move { exec(&ns, "orders-0", &["pgbench", "-i", "-s", "10", "-q"]) }
    })
    .await;
    exec(&ns, "orders-0", &["pgbench", "-c", "2", "-t", "300", "-n"]).unwrap();
    exec(&ns, "orders-0", &["psql", "-c", "create extension amcheck"]).unwrap();
    // The WAL is on the second volume, by a symlink from the first.
    assert_eq!(
        std::fs::read_link(sources[0].path().join("pgdata/pg_wal")).unwrap(),
        Path::new("/var/lib/postgresql/wal/pg_wal")
    );
    let wal_files = std::fs::read_dir(sources[1].path().join("pg_wal"))
        .unwrap()
        .count();
    assert!(wal_files > 1, "WAL segments on the second volume");

    let load = Load::start(&ns, 60);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    nightly_completed(&namespace).await;
    let backup_took = started.elapsed();
    let (tps, checkpoints) = load.finish().await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(capture), "{status:?}");
    let stall = status.frozen_millis.unwrap_or_default();
    if capture == Capture::Frozen {
        assert!(stall > 0, "the stall is recorded: {status:?}");
    }
    let snapshot = status.artifact.unwrap().snapshot.unwrap();
    assert_eq!(snapshot.volumes, ["data", "wal"]);
    assert_eq!(snapshot.volume_manifests.len(), 2, "{snapshot:?}");
    let wal_bytes = snapshot.volume_manifests[1].total_bytes.unwrap_or_default();
    assert!(wal_bytes > 0, "the WAL volume holds WAL: {snapshot:?}");

    let started = std::time::Instant::now();
    let targets = restore_shop_volumes(
        &client,
        node,
        &namespace,
        "nightly",
        postgres_statefulset_with_wal("shop"),
        volume_mib(scale),
        &["data", "wal"],
    )
    .await;
    sql(&ns, "shop-0", "select 1").await;
    let restore_to_answer = started.elapsed();
    assert_eq!(
        std::fs::read_link(targets[0].path().join("pgdata/pg_wal")).unwrap(),
        Path::new("/var/lib/postgresql/wal/pg_wal")
    );
    let sums = consistent_on(&namespace, scale, true).await;
    eprintln!(
        "postgres with pg_wal on a second volume, {capture:?} under pgbench -c 4 ({tps}; {checkpoints} checkpoints): backup {:.1} s, filesystems frozen {stall} ms, WAL volume {wal_bytes} bytes; restored sums {sums}; restore to answer {:.1} s",
        backup_took.as_secs_f64(),
        restore_to_answer.as_secs_f64()
    );
    namespace.delete().await;
    for claim in ["data-orders-0", "wal-orders-0", "data-shop-0", "wal-shop-0"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{ns}-{claim}"), &Default::default())
            .await;
    }
}

/// Waits until object `name` (a pod, a Cluster, ...) is gone.
async fn gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    custody_tests::eventually(&format!("{name} gone"), TIMEOUT, || {
        let (api, name) = (api.clone(), name.to_string());
        async move {
            match api.get_opt(&name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
}

/// Issue 14, method Tool, the acceptance bar on a real PostgreSQL: while four pgbench clients
/// write and a CHECKPOINT runs every second, the Backup's Job runs PostgreSQL's own
/// `pg_basebackup -X stream` (the image and command named in the Cluster's
/// `spec.consistency.tool`, the password from the Secret it names) against the running pod,
/// and custody backs up the tree it wrote as the volume, under `pgdata`. Restored through the
/// gate like any volume backup, PostgreSQL starts on it without a manual step, every account
/// is there, pgbench's sums agree, pg_amcheck and (after a clean shutdown) pg_checksums are
/// clean. No write stall: pgbench never waited on a frozen filesystem.
#[tokio::test]
async fn on_a_real_node_postgresql_backed_up_by_pg_basebackup_while_pgbench_writes_restores_consistent()
 {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("pgtool", false).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"PGUSER": "postgres", "PGPASSWORD": "a-test-password"}}),
    )
    .await;
    let scale = 5;
    let _source = postgres_source(
        &client,
        node,
        &namespace,
        Some(json!({
            "method": "Tool",
            "tool": {
                "image": "localhost/custody/postgres:15",
                "command": ["pg_basebackup", "--host=$(CUSTODY_POD_IP)", "--pgdata=$(CUSTODY_OUTPUT)",
                            "--wal-method=stream", "--checkpoint=fast", "--no-password"],
                "credentialsSecretRef": {"name": "orders-credentials"},
                "dataPath": "pgdata",
                "scratchSize": "1Gi",
            },
        })),
        scale,
    )
    .await;

    let load = Load::start(&ns, 40);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    nightly_completed(&namespace).await;
    let backup_took = started.elapsed();
    let written_during = sql(&ns, "orders-0", "select count(*) from pgbench_history").await;
    let (tps, checkpoints) = load.finish().await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(Capture::Tool), "{status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Consistent"
                && condition.status == "True"
                && condition.reason == "ApplicationTool"),
        "{:?}",
        status.conditions
    );
    assert_eq!(status.frozen_millis, None, "no write stall");

    // A tool that fails fails the Backup, saying how it ended.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "broken"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Tool", "tool": {
                   "image": "localhost/custody/postgres:15",
                   "command": ["sh", "-c", "echo cannot reach the database >&2; exit 3"]}}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "broken").await;
    assert_eq!(reason, "ToolFailed", "{message}");
    assert!(
        message.contains("code 3") && message.contains("cannot reach the database"),
        "{message}"
    );

    // Issue 23: a tool that overfills its scratch space and exits at once (before the
    // kubelet's periodic eviction check could see it) fails the Backup: 24 MiB into 8Mi.
    let psql = |sql: &str| {
        json!([
            "psql",
            "--host=$(CUSTODY_POD_IP)",
            "--no-password",
            "--no-align",
            "--tuples-only",
            "--variable=FETCH_COUNT=2",
            "--command",
            sql,
            "--output",
            "$(CUSTODY_OUTPUT)/fill"
        ])
    };
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "overfilled"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Tool", "tool": {
                   "image": "localhost/custody/postgres:15",
                   "command": psql("select repeat('x', 1048576) from generate_series(1, 24)"),
                   "credentialsSecretRef": {"name": "orders-credentials"},
                   "scratchSize": "8Mi"}}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "overfilled").await;
    eprintln!("a tool that overfilled its scratch space: {reason}: {message}");
    match reason.as_str() {
        // The mover measured it before reading anything.
        "ToolOutputTooLarge" => assert!(
            message.contains(&(8u64 << 20).to_string()) && message.contains("scratchSize"),
            "{message}"
        ),
        // The kubelet saw it first: its eviction's reason is in the Backup.
        "ToolFailed" => assert!(message.contains("evicted"), "{message}"),
        other => panic!("an overfilled scratch space failed as {other}: {message}"),
    }

    // A tool that hangs is stopped at its timeoutSeconds, the Backup says so, and the Cluster
    // is free again (the restore below takes its Lease).
    let hung_at = std::time::Instant::now();
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "hung"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Tool", "tool": {
                   "image": "localhost/custody/postgres:15",
                   "command": ["psql", "--host=$(CUSTODY_POD_IP)", "--no-password", "--command", "select pg_sleep(3600)"],
                   "credentialsSecretRef": {"name": "orders-credentials"},
                   "timeoutSeconds": 5}}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "hung").await;
    let hung_took = hung_at.elapsed();
    eprintln!(
        "a tool that hangs, timeoutSeconds 5: Failed after {:.1} s: {reason}: {message}",
        hung_took.as_secs_f64()
    );
    assert_eq!(reason, "ToolFailed", "{message}");
    assert!(message.contains("timeoutSeconds (5 s)"), "{message}");
    assert!(
        hung_took < Duration::from_secs(45),
        "a hung tool held the Cluster {hung_took:?}, far past its 5 s bound"
    );

    let (target, restore_to_answer) =
        restore_postgres(&client, node, &namespace, "nightly", scale).await;
    // The restored tree is pg_basebackup's: it leaves its manifest in the directory it wrote.
    assert!(
        target.path().join("pgdata/backup_manifest").exists(),
        "not the tree pg_basebackup wrote"
    );
    let sums = consistent(&namespace, scale).await;
    eprintln!(
        "postgres Tool copy (pg_basebackup) under pgbench -c 4 ({tps}; {checkpoints} checkpoints; {written_during} history rows when the backup ended): Backup created to Completed {:.1} s, artifact {} bytes; restored sums {sums}; restore to answer {:.1} s",
        backup_took.as_secs_f64(),
        status
            .artifact
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default(),
        restore_to_answer.as_secs_f64()
    );
    finish_postgres(&client, namespace).await;
}

/// A StatefulSet of one MariaDB on claim `data` (data directory `db` on it), its root
/// password for other hosts (a backup tool's connection) from Secret `<name>-credentials` if
/// it exists.
fn mariadb_statefulset(name: &str) -> serde_json::Value {
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
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "db", "image": "localhost/custody/mariadb:10.11",
                        "imagePullPolicy": "Never",
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}},
                        "readinessProbe": {"exec": {"command": ["mariadb-admin", "-uroot", "ping"]},
                                           "periodSeconds": 1},
                        "env": [{"name": "MARIADB_ROOT_PASSWORD", "valueFrom": {"secretKeyRef": {
                            "name": format!("{name}-credentials"), "key": "MARIADB_ROOT_PASSWORD",
                            "optional": true}}}],
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql"}],
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

/// Runs `query` as root in MariaDB in `pod`, waiting until it answers; the rows, tab-separated.
async fn mariadb(namespace: &str, pod: &str, query: &str) -> String {
    let (namespace, pod, query) = (namespace.to_string(), pod.to_string(), query.to_string());
    custody_tests::eventually("MariaDB answering", TIMEOUT, || {
        let (namespace, pod, query) = (namespace.clone(), pod.clone(), query.clone());
        async move {
            exec(
                &namespace,
                &pod,
                &["mariadb", "-uroot", "-N", "-B", "-e", &query],
            )
        }
    })
    .await
}

/// The bank: 1,000 InnoDB accounts of 1,000 each, a history of transfers and a counter of
/// them, 30 MB of random rows, and a procedure that moves money between two accounts in one
/// transaction (history row and counter with it) for as long as it is told. In any
/// consistent state the balances sum to 1,000,000 and the counter equals the history's rows.
const BANK: &str = "
create database bank;
use bank;
create table bank.accounts (id int primary key, balance bigint not null) engine=InnoDB;
insert into bank.accounts select seq, 1000 from seq_1_to_1000;
create table bank.history (id bigint auto_increment primary key, a int not null, b int not null, amount int not null) engine=InnoDB;
create table bank.counter (id int primary key, n bigint not null) engine=InnoDB;
insert into bank.counter values (1, 0);
create table bank.filler (id int primary key, data varbinary(1024)) engine=InnoDB;
insert into bank.filler select seq, random_bytes(1024) from seq_1_to_30000;
delimiter //
create procedure bank.transfers(seconds int)
begin
  declare deadline datetime default now() + interval seconds second;
  declare a, b, x int;
  while now() < deadline do
    set a = 1 + floor(rand() * 1000), x = 1 + floor(rand() * 100);
    set b = a % 1000 + 1;
    start transaction;
    update bank.accounts set balance = balance + if(id = a, -x, x) where id in (a, b);
    insert into bank.history (a, b, amount) values (a, b, x);
    update bank.counter set n = n + 1 where id = 1;
    commit;
  end while;
end //
delimiter ;
";

/// The bank's invariants, as `sum(balance) count(accounts) counter count(history)`.
const BANK_SUMS: &str = "select concat((select sum(balance) from bank.accounts), ' ', (select count(*) from bank.accounts), ' ', (select n from bank.counter), ' ', (select count(*) from bank.history))";

/// Cluster `orders`: MariaDB on a real volume of the node with `consistency`, and the bank.
async fn mariadb_source(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    consistency: serde_json::Value,
) -> LoopVolume {
    let ns = namespace.name.clone();
    let source = LoopVolume::new(1024);
    std::os::unix::fs::chown(source.path(), Some(999), Some(999)).unwrap();
    local_volume(client, node, &ns, "data-orders-0", source.path()).await;
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": "orders"},
               "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                        "repositoryRef": {"name": "store"}, "consistency": consistency}}),
    )
    .await;
    create::<StatefulSet>(&namespace.api(), mariadb_statefulset("orders")).await;
    mariadb(&ns, "orders-0", "select 1").await;
    exec(&ns, "orders-0", &["mariadb", "-uroot", "-e", BANK]).unwrap();
    source
}

/// Four clients moving money for `seconds`, each in its own `kubectl exec`.
fn transfers(
    namespace: &str,
    seconds: u32,
) -> Vec<std::thread::JoinHandle<Result<String, String>>> {
    (0..4)
        .map(|_| {
            let ns = namespace.to_string();
            std::thread::spawn(move || {
                exec(
                    &ns,
                    "orders-0",
                    &[
                        "mariadb",
                        "-uroot",
                        "-e",
                        &format!("call bank.transfers({seconds})"),
                    ],
                )
            })
        })
        .collect()
}

/// The acceptance checks of a MariaDB restored into shop-0: it started, the bank's invariants
/// hold, and `mariadb-check --all-databases --extended` finds every table OK. The sums.
async fn mariadb_consistent(namespace: &TestNamespace) -> String {
    let ns = namespace.name.clone();
    let sums = mariadb(&ns, "shop-0", BANK_SUMS).await;
    let parts: Vec<&str> = sums.split(' ').collect();
    assert_eq!(parts.len(), 4, "{sums}");
    assert_eq!(
        (parts[0], parts[1]),
        ("1000000", "1000"),
        "money or accounts lost: {sums}"
    );
    assert_eq!(
        parts[2], parts[3],
        "a torn transfer: counter vs history in {sums}"
    );
    let checked = exec(
        &ns,
        "shop-0",
        &["mariadb-check", "-uroot", "--all-databases", "--extended"],
    )
    .expect("mariadb-check ran");
    let bad: Vec<&str> = checked
        .lines()
        .filter(|line| !line.trim_end().ends_with("OK"))
        .collect();
    assert!(bad.is_empty(), "mariadb-check: {bad:?} in\n{checked}");
    assert!(checked.contains("bank.accounts"), "{checked}");
    sums
}

/// Issue 14 on a real MariaDB, both methods: four clients move money between InnoDB accounts
/// while a Backup copies the volume with its filesystem frozen (the upload throttled so the
/// copy spans many seconds of writes), and another while `mariadb-backup --backup` then
/// `--prepare` (method Tool) copies it. Each restores through the gate into a MariaDB that
/// starts without a manual step (crash recovery from one instant; a prepared backup), with the
/// money all there, every transfer whole, and `mariadb-check --all-databases --extended`
/// clean.
#[tokio::test]
async fn on_a_real_node_mariadb_frozen_while_transfers_run_restores_consistent() {
    mariadb_under_load(
        "mdbfreeze",
        json!({"method": "Freeze", "maxFreezeSeconds": 120}),
        Capture::Frozen,
    )
    .await;
}

/// See [`on_a_real_node_mariadb_frozen_while_transfers_run_restores_consistent`].
#[tokio::test]
async fn on_a_real_node_mariadb_backed_up_by_mariadb_backup_while_transfers_run_restores_consistent()
 {
    mariadb_under_load(
        "mdbtool",
        json!({
            "method": "Tool",
            "tool": {
                "image": "localhost/custody/mariadb:10.11",
                "command": ["sh", "-c", "mariadb-backup --backup --target-dir=\"$CUSTODY_OUTPUT\" --host=\"$CUSTODY_POD_IP\" --user=root --password=\"$MARIADB_ROOT_PASSWORD\" && mariadb-backup --prepare --target-dir=\"$CUSTODY_OUTPUT\""],
                "mountPath": "/var/lib/mysql",
                "credentialsSecretRef": {"name": "orders-credentials"},
                "dataPath": "db",
                "scratchSize": "1Gi",
            },
        }),
        Capture::Tool,
    )
    .await;
}

async fn mariadb_under_load(name: &str, consistency: serde_json::Value, capture: Capture) {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new(name, true).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"MARIADB_ROOT_PASSWORD": "a-test-password"}}),
    )
    .await;
    let _source = mariadb_source(&client, node, &namespace, consistency).await;

    let load = transfers(&ns, 60);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    nightly_completed(&namespace).await;
    let backup_took = started.elapsed();
    let during = mariadb(&ns, "orders-0", "select n from bank.counter").await;
    for client in load {
        let done = tokio::task::spawn_blocking(move || client.join().unwrap())
            .await
            .unwrap();
        done.expect("the transfers kept running through the backup");
    }
    let total = mariadb(&ns, "orders-0", "select n from bank.counter").await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(capture), "{status:?}");

    let started = std::time::Instant::now();
    let target = restore_shop(
        &client,
        node,
        &namespace,
        "nightly",
        mariadb_statefulset("shop"),
        1024,
    )
    .await;
    let sums = mariadb_consistent(&namespace).await;
    let restore_to_answer = started.elapsed();
    if capture == Capture::Tool {
        assert!(
            target.path().join("db/xtrabackup_info").exists(),
            "not the tree mariadb-backup prepared"
        );
    }
    eprintln!(
        "mariadb {capture:?} copy under 4 transfer clients ({during} transfers when the backup ended, {total} in all): Backup created to Completed {:.1} s, frozen {} ms, artifact {} bytes; restored sums {sums}; restore to checked {:.1} s",
        backup_took.as_secs_f64(),
        status.frozen_millis.unwrap_or_default(),
        status
            .artifact
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default(),
        restore_to_answer.as_secs_f64()
    );
    finish_postgres(&client, namespace).await;
}

/// Issue 14, method Hooks, on a real PostgreSQL: the pre hook (a CHECKPOINT, then a marker
/// file) runs in the `db` container of the running pod through the API server before the
/// Backup's Job exists, the post hook after the Job ended; both are recorded. A pre hook that
/// outlives its timeout fails the Backup (`PreHookFailed`) without any copy, and the post hook
/// still runs.
#[tokio::test]
async fn on_a_real_node_hooks_run_in_the_application_pod_around_the_copy() {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("pghooks", false).await;
    let source = postgres_source(&client, node, &namespace, None, 1).await;

    // Issue 23: a tenant who may write Backups but may not exec into pods asks custody to run
    // `cat` of the pod's ServiceAccount token as a pre hook (or, where the pod has none, `env`:
    // the database's password, from a Secret the tenant may not read). custody would run it
    // with its own rights and show the output in status.hooks: the writer's rights are
    // checked first.
    let tenant = custody_tests::tenant(
        &namespace,
        "backup-writer",
        json!([{"apiGroups": ["custody.io"], "resources": ["backups"],
                "verbs": ["get", "list", "watch", "create"]}]),
    )
    .await;
    let exfiltrate: Backup = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "exfiltrate"},
        "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Hooks", "hooks": {
            "pre": {"container": "db", "command": ["sh", "-c",
                "cat /var/run/secrets/kubernetes.io/serviceaccount/token 2>/dev/null || env"]}}}}}))
    .unwrap();
    match Api::<Backup>::namespaced(tenant, &namespace.name)
        .create(&PostParams::default(), &exfiltrate)
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 400, "{status:?}");
            assert!(
                status.message.contains("create pods/exec")
                    && status.message.contains("system:serviceaccount:")
                    && status.message.contains("backup-writer"),
                "the refusal names the missing permission and the writer: {}",
                status.message
            );
        }
        Ok(_) => {
            let ran = await_condition(
                &namespace.api::<Backup>(),
                "exfiltrate",
                "its pre hook ran",
                TIMEOUT,
                |backup: &Backup| {
                    backup
                        .status
                        .as_ref()
                        .and_then(|status| status.hooks.as_ref())
                        .is_some_and(|hooks| hooks.pre.is_some())
                },
            )
            .await;
            let output = ran.status.unwrap().hooks.unwrap().pre.unwrap().message;
            panic!(
                "custody ran the hook of a user without pods/exec; its status shows: {}",
                output.chars().take(120).collect::<String>()
            );
        }
        Err(error) => panic!("creating the Backup: {error}"),
    }

    let hooks = |pre: serde_json::Value, post: &str| {
        json!({"method": "Hooks", "hooks": {
            "pre": pre,
            "post": {"container": "db", "command": ["sh", "-c", format!(": > /var/lib/postgresql/data/{post}")]},
        }})
    };

    // Issue 23: custody itself has no pods/exec until the namespace's admin grants it. Even
    // the admin's own Backup with hooks is refused, naming the RoleBinding that grants it.
    let early: Backup = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "too-early"},
        "spec": {"clusterRef": {"name": "orders"}, "consistency": hooks(
            json!({"container": "db", "command": ["true"]}), "never")}}))
    .unwrap();
    let ns = &namespace.name;
    match namespace.api::<Backup>().create(&PostParams::default(), &early).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains(&format!(
                "namespace {ns} has not let custody run hooks"
            )) && status.message.contains(&format!(
                "kubectl create rolebinding custody-hooks --namespace {ns} --clusterrole custody-hooks --serviceaccount custody-system:custody-controller"
            )),
            "the refusal names the RoleBinding: {}",
            status.message
        ),
        other => panic!("a Backup with hooks in a namespace that did not opt in: {other:?}"),
    }
    create::<k8s_openapi::api::rbac::v1::RoleBinding>(
        &namespace.api(),
        json!({"metadata": {"name": "custody-hooks"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "custody-hooks"},
               "subjects": [{"kind": "ServiceAccount", "name": "custody-controller", "namespace": "custody-system"}]}),
    )
    .await;
    // Granted: admitted (the authorizer sees a new binding within moments).
    let hooked: Backup = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "hooked"},
        "spec": {"clusterRef": {"name": "orders"}, "consistency": hooks(
            json!({"container": "db", "timeoutSeconds": 20, "command": ["sh", "-c",
                   "psql -c checkpoint && : > /var/lib/postgresql/data/hook-pre"]}),
            "hook-post")}}))
    .unwrap();
    custody_tests::eventually("the Backup with hooks admitted", TIMEOUT, || {
        let (backups, hooked) = (namespace.api::<Backup>(), hooked.clone());
        async move {
            backups
                .create(&PostParams::default(), &hooked)
                .await
                .map(|_| ())
                .map_err(|error| error.to_string())
        }
    })
    .await;
    let hooked = await_condition(
        &namespace.api::<Backup>(),
        "hooked",
        "Completed",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed)
        },
    )
    .await;
    let status = hooked.status.unwrap();
    assert_eq!(status.consistency, Some(Capture::Hooks));
    let ran = status.hooks.expect("the hooks are recorded");
    let (pre, post) = (ran.pre.unwrap(), ran.post.unwrap());
    assert!(pre.succeeded && post.succeeded, "{pre:?} {post:?}");
    assert_eq!(pre.pod, "orders-0");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = namespace.api();
    let job = jobs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(job.len(), 1, "one copy");
    let job = job[0].status.clone().unwrap();
    assert!(
        pre.finished_at.0 <= job.start_time.unwrap().0,
        "the pre hook ended before the copy's Job started"
    );
    assert!(
        post.started_at.0 >= job.completion_time.unwrap().0,
        "the post hook ran after the copy"
    );
    for marker in ["hook-pre", "hook-post"] {
        assert!(
            source.path().join(marker).exists(),
            "{marker} on the volume"
        );
    }

    // A pre hook past its timeout: no copy, the post hook all the same.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "stuck"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": hooks(
                   json!({"container": "db", "timeoutSeconds": 2,
                          "command": ["psql", "-c", "select pg_sleep(30)"]}),
                   "after-stuck")}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "stuck").await;
    assert_eq!(reason, "PreHookFailed", "{message}");
    assert!(message.contains("did not finish within 2 s"), "{message}");
    let stuck = namespace.api::<Backup>().get("stuck").await.unwrap();
    let ran = stuck.status.unwrap().hooks.unwrap();
    assert!(ran.post.unwrap().succeeded);
    assert!(
        source.path().join("after-stuck").exists(),
        "the post hook ran"
    );
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1,
        "no copy after a failed pre hook"
    );
    finish_postgres(&client, namespace).await;
}

/// PostgreSQL's client programs on this machine (Debian's postgresql-15), which the benchmark
/// runs from the host against the pod's address.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// pgbench from the host against `ip`, four clients, in runs of ten seconds until `stop`, each
/// transaction's latency logged under `dir`.
struct Latencies {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    runs: std::thread::JoinHandle<()>,
    dir: std::path::PathBuf,
}

impl Latencies {
    fn start(ip: &str, dir: &Path, seconds: Option<u32>) -> Latencies {
        std::fs::create_dir_all(dir).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ip, logs, stopped) = (ip.to_string(), dir.to_path_buf(), stop.clone());
        let runs = std::thread::spawn(move || {
            let mut run = 0;
            loop {
                let length = seconds.unwrap_or(10).to_string();
                let prefix = logs.join(format!("run{run}"));
                let output = std::process::Command::new(format!("{PG_BIN}/pgbench"))
                    .args([
                        "-h", &ip, "-U", "postgres", "-n", "-c", "4", "-T", &length, "-l",
                    ])
                    .arg(format!("--log-prefix={}", prefix.display()))
                    .arg("postgres")
                    .env("PGPASSWORD", "a-test-password")
                    .output()
                    .expect("pgbench");
                assert!(output.status.success(), "pgbench: {output:?}");
                run += 1;
                if seconds.is_some() || stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
            }
        });
        Latencies {
            stop,
            runs,
            dir: dir.to_path_buf(),
        }
    }

    /// Waits for the current run to end; the number of transactions and the longest latency.
    async fn finish(self) -> (usize, Duration) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let runs = self.runs;
        tokio::task::spawn_blocking(move || runs.join().unwrap())
            .await
            .unwrap();
        let mut count = 0;
        let mut longest = 0u64;
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for line in text.lines() {
                // client transaction latency-in-microseconds script epoch microseconds
                if let Some(micros) = line.split(' ').nth(2).and_then(|field| field.parse().ok()) {
                    count += 1;
                    longest = longest.max(micros);
                }
            }
        }
        (count, Duration::from_micros(longest))
    }
}

/// Creates Backup `name` of Cluster orders (with `consistency`, else the Cluster's) and waits
/// until it completed: the Backup, and the time from its creation.
async fn timed_backup(
    namespace: &TestNamespace,
    name: &str,
    consistency: Option<serde_json::Value>,
) -> (Backup, Duration) {
    let mut spec = json!({"clusterRef": {"name": "orders"}});
    if let Some(consistency) = consistency {
        spec["consistency"] = consistency;
    }
    let started = std::time::Instant::now();
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name},
               "spec": spec}),
    )
    .await;
    let backup = await_condition(
        &namespace.api::<Backup>(),
        name,
        "Completed",
        Duration::from_secs(3600),
        |backup: &Backup| {
            let phase = backup.status.as_ref().and_then(|status| status.phase);
            assert_ne!(phase, Some(BackupPhase::Failed), "{backup:?}");
            phase == Some(BackupPhase::Completed)
        },
    )
    .await;
    (backup, started.elapsed())
}

/// Issue 14's benchmark, at ≥ 1 GiB (`CUSTODY_BENCH_SCALE`, default 70 pgbench scale units,
/// about 1.1 GB): PostgreSQL on the real node, each figure against a baseline measured in
/// the same run. Backup by the Tool method (pg_basebackup in the Job, then compressed and
/// uploaded) vs pg_basebackup to local disk alone; restore to a running database vs `cp -a` +
/// `sync` of the same tree onto a fresh volume; the write stall, as pgbench's longest
/// transaction, during a Tool and a Freeze backup vs with no backup. Run by
/// hack/bench-consistency.sh; it asserts only that each step worked.
#[tokio::test]
#[ignore = "a benchmark at 1 GiB: hack/bench-consistency.sh"]
async fn on_a_real_node_bench_postgresql_consistency() {
    let scale: u32 = std::env::var("CUSTODY_BENCH_SCALE")
        .ok()
        .and_then(|scale| scale.parse().ok())
        .unwrap_or(70);
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("pgbench", false).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"PGUSER": "postgres", "PGPASSWORD": "a-test-password"}}),
    )
    .await;
    let tool = json!({"method": "Tool", "tool": {
        "image": "localhost/custody/postgres:15",
        "command": ["pg_basebackup", "--host=$(CUSTODY_POD_IP)", "--pgdata=$(CUSTODY_OUTPUT)",
                    "--wal-method=stream", "--checkpoint=fast", "--no-password"],
        "credentialsSecretRef": {"name": "orders-credentials"},
        "dataPath": "pgdata",
        "scratchSize": format!("{}Mi", volume_mib(scale)),
    }});
    let loading = std::time::Instant::now();
    let _source = postgres_source(&client, node, &namespace, Some(tool), scale).await;
    let loaded = loading.elapsed();
    let bytes: u64 = sql(&ns, "orders-0", "select pg_database_size('postgres')")
        .await
        .parse()
        .unwrap();
    let pods: Api<Pod> = namespace.api();
    let ip = pods
        .get("orders-0")
        .await
        .unwrap()
        .status
        .and_then(|status| status.pod_ip)
        .expect("the pod's address");
    let work = tempfile::tempdir().unwrap();

    // Baseline: pg_basebackup alone, to this machine's disk.
    let started = std::time::Instant::now();
    let tree = work.path().join("basebackup");
    let output = std::process::Command::new(format!("{PG_BIN}/pg_basebackup"))
        .args([
            "-h", &ip, "-U", "postgres", "-X", "stream", "-c", "fast", "-D",
        ])
        .arg(&tree)
        .env("PGPASSWORD", "a-test-password")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let local = started.elapsed();

    // Baseline: pgbench's longest transaction with no backup.
    let (quiet_count, quiet) = Latencies::start(&ip, &work.path().join("quiet"), Some(20))
        .finish()
        .await;

    let load = Latencies::start(&ip, &work.path().join("tool"), None);
    let (tool_backup, tool_took) = timed_backup(&namespace, "tool", None).await;
    let (tool_count, tool_latency) = load.finish().await;

    let load = Latencies::start(&ip, &work.path().join("frozen"), None);
    let (frozen_backup, frozen_took) = timed_backup(
        &namespace,
        "frozen",
        Some(json!({"method": "Freeze", "maxFreezeSeconds": 600})),
    )
    .await;
    let (frozen_count, frozen_latency) = load.finish().await;
    let frozen = frozen_backup.status.unwrap();

    // Restore to a running database vs copying the same tree.
    let (_target, restore_took) = restore_postgres(&client, node, &namespace, "tool", scale).await;
    let copy = LoopVolume::new(volume_mib(scale));
    let started = std::time::Instant::now();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&tree)
        .arg(copy.path().join("pgdata"))
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        std::process::Command::new("sync")
            .status()
            .unwrap()
            .success()
    );
    let copied = started.elapsed();

    let size = |status: Option<&custody_kube::api::BackupStatus>| {
        status
            .and_then(|status| status.artifact.as_ref())
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default() as f64
            / 1e6
    };
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-3);
    println!(
        "consistent capture of PostgreSQL, pgbench scale {scale}: database {:.2} GB (loaded in {:.0} s)",
        bytes as f64 / 1e9,
        loaded.as_secs_f64()
    );
    println!(
        "  backup, method Tool (pg_basebackup in the Job, compressed, uploaded, {:.0} MB): {:.1} s; baseline pg_basebackup to local disk alone: {:.1} s (x{:.1})",
        size(tool_backup.status.as_ref()),
        tool_took.as_secs_f64(),
        local.as_secs_f64(),
        ratio(tool_took, local)
    );
    println!(
        "  backup, method Freeze ({:.0} MB): {:.1} s, filesystem frozen {} ms",
        size(Some(&frozen)),
        frozen_took.as_secs_f64(),
        frozen.frozen_millis.unwrap_or_default()
    );
    println!(
        "  restore to running (Tool backup, Cluster created to PostgreSQL answering): {:.1} s; baseline cp -a + sync of the same tree: {:.1} s (x{:.1})",
        restore_took.as_secs_f64(),
        copied.as_secs_f64(),
        ratio(restore_took, copied)
    );
    println!(
        "  write stall, pgbench -c 4's longest transaction: no backup {} ms ({quiet_count} transactions); during the Tool backup {} ms ({tool_count}); during the Freeze backup {} ms ({frozen_count})",
        quiet.as_millis(),
        tool_latency.as_millis(),
        frozen_latency.as_millis()
    );
    finish_postgres(&client, namespace).await;
}

/// The agent's metrics on the node (hostNetwork; `--http-address=127.0.0.1:9446`).
async fn agent_metric(name: &str) -> Option<f64> {
    let body = reqwest_get("http://127.0.0.1:9446/metrics").await?;
    body.lines()
        .find(|line| line.starts_with(name) && !line.starts_with('#'))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// A plain HTTP GET of `url` (no client library: one request on a TCP stream).
async fn reqwest_get(url: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/')?;
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

/// Writes and syncs a small file on `volume` every 50 ms until stopped, noting when each
/// write started and how long it took: a write blocks for as long as the filesystem is
/// frozen. (A write to a frozen filesystem cannot be interrupted: if it never thawed, this
/// thread would hang, and the test's own timeouts would say so.)
struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writes: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, Duration)>>>,
}

impl Writer {
    fn start(volume: &Path) -> Writer {
        use std::io::Write;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let path = volume.join("writer-probe");
        let (stopped, noted) = (stop.clone(), writes.clone());
        std::thread::spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let started = std::time::Instant::now();
                let mut file = std::fs::File::create(&path).expect("probe file");
                file.write_all(b"probe").expect("probe write");
                file.sync_all().expect("probe sync");
                noted.lock().unwrap().push((started, started.elapsed()));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Writer { stop, writes }
    }

    /// The longest write that started at or after `since`, and when the last write ended.
    fn longest_since(&self, since: std::time::Instant) -> (Duration, Option<std::time::Instant>) {
        let writes = self.writes.lock().unwrap();
        let longest = writes
            .iter()
            .filter(|(started, _)| *started >= since)
            .map(|(_, took)| *took)
            .max()
            .unwrap_or_default();
        (
            longest,
            writes.last().map(|(started, took)| *started + *took),
        )
    }

    /// Waits until a write that started at or after `since` has finished: the filesystem is
    /// writable. Returns when that write ended.
    async fn writable_after(&self, since: std::time::Instant, what: &str) -> std::time::Instant {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(ended) = self
                .writes
                .lock()
                .unwrap()
                .iter()
                .find(|(started, _)| *started >= since)
                .map(|(started, took)| *started + *took)
            {
                return ended;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the filesystem stayed frozen after {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// SIGKILLs the agent container (not the pod: the kubelet restarts the container, after its
/// crash-loop back-off when it crashed recently).
fn kill_agents() {
    let agents = ctr(&[
        "containers",
        "ls",
        "-q",
        "labels.\"io.kubernetes.container.name\"==agent",
    ]);
    for container in agents.lines() {
        let _ = std::process::Command::new("ctr")
            .args([
                "--address",
                "/run/custody-node/containerd.sock",
                "-n",
                "k8s.io",
            ])
            .args(["tasks", "kill", "-s", "SIGKILL", container])
            .output();
    }
}

/// Waits until the agent holds a filesystem frozen; returns when it saw it.
async fn frozen_now() -> std::time::Instant {
    custody_tests::eventually("a filesystem frozen by the agent", TIMEOUT, || async {
        match agent_metric("custody_agent_frozen_filesystems").await {
            Some(value) if value >= 1.0 => Ok(std::time::Instant::now()),
            other => Err(format!("custody_agent_frozen_filesystems {other:?}")),
        }
    })
    .await
}

/// A Backup of Cluster orders with the Freeze method and `max_seconds`.
async fn frozen_backup(namespace: &TestNamespace, name: &str, max_seconds: u32) {
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": "orders"},
                        "consistency": {"method": "Freeze", "maxFreezeSeconds": max_seconds}}}),
    )
    .await;
}

/// The note of the Warning Event `reason` on Backup `name` (a thaw the agent reported).
async fn thaw_said(namespace: &TestNamespace, name: &str, reason: &str) -> String {
    custody_tests::event_where(namespace, &format!("{reason} on Backup {name}"), |event| {
        event.reason.as_deref() == Some(reason)
            && event.involved_object.name.as_deref() == Some(name)
    })
    .await
    .message
    .unwrap_or_default()
}

/// Waits for Backup `name` to fail; its Ready reason and message.
async fn backup_fails(namespace: &TestNamespace, name: &str) -> (String, String) {
    let failed = await_condition(
        &namespace.api::<Backup>(),
        name,
        "Failed",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Failed)
        },
    )
    .await;
    let ready = failed
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|condition| condition.type_ == "Ready")
        .unwrap();
    (ready.reason, ready.message)
}

/// What both freeze tests start from: custody installed on the real node, Cluster `orders`
/// whose pod runs on a loop-device volume holding the small database (and what `fill` adds),
/// backed up through an S3 relay the test can stall.
struct FreezeSetup {
    _agents: tokio::sync::RwLockWriteGuard<'static, ()>,
    _installed: Installed,
    node: &'static str,
    client: kube::Client,
    namespace: TestNamespace,
    relay: s3::FaultyLink,
    source: LoopVolume,
    pods: Api<Pod>,
}

impl FreezeSetup {
    async fn start(name: &str, fill: impl FnOnce(&Path)) -> FreezeSetup {
        let agents = AGENTS.write().await;
        let node = real_node();
        let installed = Installed::apply();
        let client = client().await;
        running(&client).await;
        let namespace = TestNamespace::create(name).await;
        let bucket = s3::bucket(s3::shared(), name).await;
        let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
        let relay = s3::FaultyLink::start_on(&host, s3::shared());
        repository(&namespace, &relay.url, &bucket).await;
        // The tests stall uploads on purpose, longer than the default 60 s stall bound would
        // allow on a slow run.
        namespace
            .api::<custody_kube::api::BackupRepository>()
            .patch(
                "store",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"timeouts": {"stallSeconds": 600}}})),
            )
            .await
            .unwrap();
        let source = LoopVolume::new(64);
        small_database(source.path());
        fill(source.path());
        local_volume(
            &client,
            node,
            &namespace.name,
            "data-orders-0",
            source.path(),
        )
        .await;
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
        FreezeSetup {
            _agents: agents,
            _installed: installed,
            node,
            client,
            namespace,
            relay,
            source,
            pods,
        }
    }

    /// Deletes the namespace and the volume's PersistentVolume.
    async fn finish(self) {
        let ns = self.namespace.name.clone();
        self.namespace.delete().await;
        let _ = Api::<PersistentVolume>::all(self.client.clone())
            .delete(&format!("{ns}-data-orders-0"), &Default::default())
            .await;
    }
}

/// Issue 14, method Freeze: a frozen filesystem is always thawed, within its bound, whichever
/// party fails. The S3 server stalls (a relay that accepts and never answers), so the mover
/// holds the freeze while its upload hangs; a writer on the volume measures the stall.
/// - the bound passes: the agent thaws at `maxFreezeSeconds`, the Backup fails `FreezeLost`;
/// - the mover's pod is killed mid-freeze: the call drops and the agent thaws at once;
/// - the agent is killed (SIGKILL) mid-freeze: its restarted container thaws what it noted,
///   and the mover, its call broken, fails the Backup with `FreezeLost`.
#[tokio::test]
async fn on_a_real_node_a_frozen_volume_is_always_thawed_within_its_bound() {
    let bulk = |root: &Path| {
        // More than the mover buffers (two 5 MiB parts) and incompressible: with the upload
        // stalled, the read waits, and the freeze lasts.
        let mut bulk = vec![0u8; 40 << 20];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bulk))
            .unwrap();
        std::fs::write(root.join("bulk"), bulk).unwrap();
    };
    let setup = FreezeSetup::start("freeze", bulk).await;
    let (namespace, relay, source, pods, client) = (
        &setup.namespace,
        &setup.relay,
        &setup.source,
        &setup.pods,
        &setup.client,
    );
    let ns = namespace.name.clone();
    await_condition(
        &namespace.api::<custody_kube::api::BackupRepository>(),
        "store",
        "Ready",
        TIMEOUT,
        |repository: &custody_kube::api::BackupRepository| {
            repository.status.as_ref().is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|condition| condition.type_ == "Ready" && condition.status == "True")
            })
        },
    )
    .await;
    let writer = Writer::start(source.path());
    // Each phase: the S3 server stalls while the volume is frozen; once the volume is
    // writable again it answers, so that the mover can abort its upload and report.
    relay.set(s3::Fault::StallWrites);

    // The bound passes.
    let created = std::time::Instant::now();
    frozen_backup(namespace, "bounded", 5).await;
    let frozen = frozen_now().await;
    let thawed = writer.writable_after(frozen, "the bound").await;
    relay.set(s3::Fault::None);
    let (reason, message) = backup_fails(namespace, "bounded").await;
    assert_eq!(reason, "FreezeLost", "{message}");
    let (stall, _) = writer.longest_since(created);
    eprintln!(
        "freeze bound 5 s: writes stalled {:.2} s; writable {:.2} s after the agent reported frozen",
        stall.as_secs_f64(),
        (thawed - frozen).as_secs_f64()
    );
    assert!(stall <= Duration::from_secs(8), "stalled {stall:?}");
    assert!(
        stall >= Duration::from_secs(3),
        "the volume was not frozen: {stall:?}"
    );

    // The mover's pod killed mid-freeze.
    relay.set(s3::Fault::StallWrites);
    frozen_backup(namespace, "mover-killed", 120).await;
    frozen_now().await;
    let jobs = kubectl(&[
        "-n",
        &ns,
        "get",
        "pods",
        "-l",
        "custody.io/role=backup",
        "--field-selector=status.phase=Running",
        "-o",
        "name",
    ]);
    let mover = String::from_utf8_lossy(&jobs.stdout).trim().to_string();
    assert!(!mover.is_empty(), "no running mover pod");
    let killed = std::time::Instant::now();
    let output = kubectl(&[
        "-n",
        &ns,
        "delete",
        &mover,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    assert!(output.status.success(), "{output:?}");
    let thawed = writer.writable_after(killed, "the mover was killed").await;
    eprintln!(
        "mover killed mid-freeze: writable {:.2} s later",
        thawed.saturating_duration_since(killed).as_secs_f64()
    );
    assert!(thawed.saturating_duration_since(killed) < Duration::from_secs(30));
    relay.set(s3::Fault::None);
    backup_fails(namespace, "mover-killed").await;

    // The agent killed mid-freeze.
    relay.set(s3::Fault::StallWrites);
    frozen_backup(namespace, "agent-killed", 120).await;
    frozen_now().await;
    let killed = std::time::Instant::now();
    kill_agents();
    let thawed = writer.writable_after(killed, "the agent was killed").await;
    eprintln!(
        "agent killed mid-freeze: writable {:.2} s later (its restarted container thawed it)",
        thawed.saturating_duration_since(killed).as_secs_f64()
    );
    relay.set(s3::Fault::None);
    let (reason, message) = backup_fails(namespace, "agent-killed").await;
    assert_eq!(reason, "FreezeLost", "{message}");
    let thawed_at_start =
        agent_metric("custody_agent_freezes_total{reason=\"ThawedAtStart\"}").await;
    assert_eq!(
        thawed_at_start,
        Some(1.0),
        "the restarted agent thawed the noted filesystem"
    );
    // The Backup says when the filesystem thawed (the mover only knew when its call broke).
    let said = thaw_said(namespace, "agent-killed", "ThawedByRestartedAgent").await;
    eprintln!("agent-killed: {said}");
    assert!(
        said.contains("the agent, restarted, thawed") && said.contains("(bound 120 s)"),
        "{said}"
    );

    // The agent killed again, twice in a row (issue 23, item 3): the kubelet's crash-loop
    // back-off delays its restart by 10 s, then 20 s, but the watchdog container thaws at
    // the Backup's bound, 5 s, then 15 s: by then the mover, its call broken, has exited and
    // its pod's mount of the volume is gone, so the watchdog thaws through the
    // application's mount of the device.
    for (round, bound) in [("again", 5u32), ("a third time", 15)] {
        // The agent back from its last kill (a mover that finds no agent fails at once).
        custody_tests::eventually("the agent serving again", TIMEOUT, || async {
            match agent_metric("custody_agent_frozen_filesystems").await {
                Some(0.0) => Ok(()),
                other => Err(format!("custody_agent_frozen_filesystems {other:?}")),
            }
        })
        .await;
        relay.set(s3::Fault::StallWrites);
        let name = format!("agent-killed-{}", round.replace(' ', "-"));
        frozen_backup(namespace, &name, bound).await;
        let frozen = frozen_now().await;
        if bound == 15 {
            // A second freeze of the frozen filesystem (here the mover's own pod asking again)
            // is refused before FIFREEZE and leaves the first freeze's note alone: the
            // watchdog still thaws at the first freeze's bound once the agent is killed.
            let mover = pods
                .list(&ListParams::default().labels("custody.io/role=backup"))
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|pod| {
                    pod.status
                        .as_ref()
                        .and_then(|status| status.phase.as_deref())
                        == Some("Running")
                })
                .expect("the running mover");
            let refused = freeze_as(client, &ns, &mover, "data-orders-0", 30, None)
                .await
                .expect_err("a second freeze of a frozen filesystem");
            eprintln!("second freeze: {}", refused.message());
            assert_eq!(
                refused.code(),
                tonic::Code::FailedPrecondition,
                "{refused:?}"
            );
            assert!(refused.message().contains("frozen already"), "{refused:?}");
        }
        kill_agents();
        let thawed = writer.writable_after(frozen, "the agent was killed").await;
        relay.set(s3::Fault::None);
        let (stall, _) = writer.longest_since(frozen - Duration::from_secs(1));
        eprintln!(
            "agent killed {round} mid-freeze, bound {bound} s: writes stalled {:.2} s; writable {:.2} s after the agent reported frozen",
            stall.as_secs_f64(),
            (thawed - frozen).as_secs_f64()
        );
        assert!(
            stall <= Duration::from_secs(bound.into()) + Duration::from_millis(1500),
            "the freeze outlived its bound of {bound} s: {stall:?}"
        );
        let (reason, message) = backup_fails(namespace, &name).await;
        assert_eq!(reason, "FreezeLost", "{message}");
        // Once the agent is back, the Backup says when the watchdog thawed: at the bound.
        let said = thaw_said(namespace, &name, "ThawedByWatchdog").await;
        eprintln!("{name}: {said}");
        let held: f64 = said
            .split(" s after it was frozen")
            .next()
            .and_then(|before| before.rsplit(", ").next())
            .and_then(|seconds| seconds.parse().ok())
            .unwrap_or_else(|| panic!("no time held in {said:?}"));
        assert!(
            held >= f64::from(bound) - 0.5 && held <= f64::from(bound) + 1.5,
            "the watchdog thawed {held} s after the freeze, bound {bound} s: {said}"
        );
        assert!(said.contains(&format!("(bound {bound} s)")), "{said}");
    }

    relay.set(s3::Fault::None);
    drop(writer);
    setup.finish().await;
}

/// Asks this node's gate to freeze `claim` for `seconds` as pod `pod` of `namespace` (a
/// token bound to it, as the kubelet projects into the mover), over a connection whose
/// stream window is `window` bytes (`Some(0)`: a client that reads nothing). The response
/// once the agent answered; its messages are not read.
async fn freeze_as(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    claim: &str,
    seconds: u32,
    window: Option<u32>,
) -> Result<tonic::Response<tonic::Streaming<custody_proto::gate::FreezeProgress>>, tonic::Status> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let node = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone())
        .expect("the pod's node");
    let address = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&node)
        .await
        .unwrap()
        .status
        .and_then(|status| status.addresses)
        .into_iter()
        .flatten()
        .find(|address| address.type_ == "InternalIP")
        .expect("the node's address")
        .address;
    let bundle =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .get("custody-ca")
            .await
            .unwrap()
            .data
            .and_then(|data| data.get("ca.crt").cloned())
            .expect("custody's CA bundle");
    let token = custody_tests::kubelet::request_token(
        client,
        namespace,
        "default",
        custody_proto::names::GATE_AUDIENCE,
        Some(k8s_openapi::api::authentication::v1::BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name_any()),
            uid: pod.metadata.uid.clone(),
        }),
    )
    .await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(bundle))
        .domain_name(format!("{node}.{}", custody_proto::names::GATE_NAME_SUFFIX));
    let channel = Endpoint::from_shared(format!(
        "https://{address}:{}",
        custody_proto::names::GATE_PORT
    ))
    .unwrap()
    .tls_config(tls)
    .unwrap()
    .initial_stream_window_size(window)
    .connect()
    .await
    .expect("connecting to the gate");
    let mut request = tonic::Request::new(custody_proto::gate::FreezeRequest {
        claim_name: claim.to_string(),
        max_seconds: seconds,
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    custody_proto::gate::gate_client::GateClient::new(channel)
        .freeze(request)
        .await
}

/// #23 item 3: only the Job custody created for a Backup may freeze, and never longer than
/// the Backup's bound, whatever the caller does. A Backup with `maxFreezeSeconds: 8` runs
/// (its upload stalled once the small volume is read and its freeze released). Then:
/// - a tenant's forged Job (the Backup as its controlling owner, custody's labels, a pod
///   that mounts the claim on this node) asks the agent for a freeze: refused, naming the
///   Job the Backup recorded;
/// - the real mover's pod asks for 120 s over a connection that reads nothing (a zero HTTP/2
///   stream window: not even the first message can be sent): the filesystem is frozen and
///   thawed at the Backup's 8 s, not the 120 s asked nor the agent's 600 s, and a writer on
///   the volume stalls no longer.
#[tokio::test]
async fn on_a_real_node_only_custodys_job_freezes_and_never_past_the_backups_bound() {
    let setup = FreezeSetup::start("freezecall", |_| {}).await;
    let (namespace, relay, source, pods, client, node) = (
        &setup.namespace,
        &setup.relay,
        &setup.source,
        &setup.pods,
        &setup.client,
        setup.node,
    );
    let ns = namespace.name.clone();
    let writer = Writer::start(source.path());

    // The Backup runs: its mover froze, read the few MiB and let go; its upload hangs.
    let released = "custody_agent_freezes_total{reason=\"Released\"}";
    let before = agent_metric(released).await.unwrap_or(0.0);
    relay.set(s3::Fault::StallWrites);
    frozen_backup(namespace, "held", 8).await;
    // Frozen and thawed again within milliseconds: the counter, not the gauge, shows it.
    custody_tests::eventually("the mover's freeze released", TIMEOUT, || async {
        match agent_metric(released).await {
            Some(count) if count > before => Ok(()),
            other => Err(format!("{released} {other:?}")),
        }
    })
    .await;
    let backup = namespace.api::<Backup>().get("held").await.unwrap();
    let status = backup.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(BackupPhase::Running));
    assert_eq!(status.max_freeze_seconds, Some(8));
    let recorded = status
        .job
        .clone()
        .expect("the Job custody created, recorded");
    let mover = pods
        .list(&ListParams::default().labels(&format!("job-name={}", recorded.name)))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the mover's pod");

    // A forged Job: everything a tenant can write says it is the Backup's.
    let backup_uid = backup.metadata.uid.clone().unwrap();
    create::<k8s_openapi::api::batch::v1::Job>(
        &namespace.api(),
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {
                "name": "forged",
                "labels": {"custody.io/role": "backup", "custody.io/backup-uid": backup_uid},
                "ownerReferences": [{"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
                                     "name": "held", "uid": backup_uid, "controller": true}],
            },
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": {"custody.io/role": "backup"}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeName": node,
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "forger", "image": "ghcr.io/custody/custody-agent:0.1.0",
                                    "command": ["custody-watchdog", "--state-dir=/tmp"],
                                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-orders-0", "readOnly": true}}],
                },
            }},
        }),
    )
    .await;
    let forger = custody_tests::eventually("the forged Job's pod running", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let listed = pods
                .list(&ListParams::default().labels("job-name=forged"))
                .await
                .map_err(|error| error.to_string())?;
            listed
                .items
                .into_iter()
                .find(|pod| {
                    pod.status
                        .as_ref()
                        .and_then(|status| status.phase.as_deref())
                        == Some("Running")
                })
                .ok_or_else(|| "not running yet".to_string())
        }
    })
    .await;
    let refused = freeze_as(client, &ns, &forger, "data-orders-0", 30, None)
        .await
        .expect_err("a forged Job's pod was allowed to freeze");
    eprintln!("forged Job: {}", refused.message());
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("not the Job custody created")
            && refused.message().contains(&recorded.uid),
        "{}",
        refused.message()
    );
    assert_eq!(
        agent_metric("custody_agent_frozen_filesystems").await,
        Some(0.0),
        "nothing frozen for the forger"
    );

    // The real mover's pod, asking for 120 s and reading nothing.
    let asked = std::time::Instant::now();
    let response = freeze_as(client, &ns, &mover, "data-orders-0", 120, Some(0))
        .await
        .expect("the mover's pod may freeze");
    let frozen = frozen_now().await;
    let thawed = writer.writable_after(frozen, "the Backup's bound").await;
    let (stall, _) = writer.longest_since(asked);
    eprintln!(
        "zero-window client asking 120 s, Backup bound 8 s: writes stalled {:.2} s; writable {:.2} s after the agent reported frozen",
        stall.as_secs_f64(),
        (thawed - frozen).as_secs_f64()
    );
    assert!(
        stall >= Duration::from_secs(5),
        "the volume was not frozen: {stall:?}"
    );
    assert!(
        stall <= Duration::from_millis(9_500),
        "the freeze outlived the Backup's bound of 8 s: {stall:?}"
    );
    drop(response);

    // The Backup itself was not disturbed: its copy completes.
    relay.set(s3::Fault::None);
    await_condition(
        &namespace.api::<Backup>(),
        "held",
        "Completed",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed)
        },
    )
    .await;
    drop(writer);
    setup.finish().await;
}

/// The certificates of custody's CA on this host's agent: the gate's, as the agent stored it.
const GATE_CERTIFICATE: &str = "/var/lib/custody-agent/gate-certificate/gate.crt";

/// `openssl x509 -noout FLAG` of the PEM certificate in `path` (or on stdin from `pem`).
fn x509(pem: &[u8], flag: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", flag])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    child.stdin.take().unwrap().write_all(pem).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// custody's pod named `name` (`app.kubernetes.io/name`): its UID and its containers'
/// restart counts.
async fn custody_pod(client: &kube::Client, name: &str) -> (String, Vec<(String, i32)>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("custody's pod");
    let restarts = pod
        .status
        .iter()
        .flat_map(|status| status.container_statuses.iter().flatten())
        .map(|container| (container.name.clone(), container.restart_count))
        .collect();
    (pod.metadata.uid.unwrap_or_default(), restarts)
}

/// #23 item 5: custody's CA rotates while a restore runs, and nothing fails. An operator asks
/// for a new CA (`custody.io/rotate-ca` on Secret custody-ca, here "sign in 10 s"); the new CA
/// joins every trust bundle (ConfigMap custody-ca the agents mount, custody-gate-ca in the
/// restore's namespace), then signs: the report service and the node's gate get new
/// certificates from it while the mover writes and custody-wait holds the pod. The restore
/// completes verified, the pod starts, the agent reports on, and neither the agent nor the
/// controller was restarted.
#[tokio::test]
async fn on_a_real_node_custodys_ca_rotates_during_a_restore_and_nothing_fails() {
    let setup = backed_up_with("rotate", Agents::Exclusive(AGENTS.write().await)).await;
    let (namespace, pods, client) = (&setup.namespace, &setup.pods, &setup.client);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), NAMESPACE);
    let ca_name = |secret: &k8s_openapi::api::core::v1::Secret| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get("ca.name"))
            .map(|name| String::from_utf8_lossy(&name.0).into_owned())
            .unwrap_or_default()
    };
    let old_ca = ca_name(&secrets.get("custody-ca").await.unwrap());
    assert!(old_ca.starts_with("custody-ca-"), "{old_ca}");
    let gate_before = std::fs::read(GATE_CERTIFICATE).expect("the gate's certificate");
    assert_eq!(
        x509(&gate_before, "-issuer"),
        format!("issuer=CN = {old_ca}")
    );
    assert_eq!(
        x509(&gate_before, "-subject"),
        format!("subject=CN = {}.gate.custody.io", setup.node)
    );
    let agent = custody_pod(client, "custody-agent").await;
    let controller = custody_pod(client, "custody-controller").await;

    let relay = setup.slow_repository().await;
    relay.set(s3::Fault::ThrottleDownloads(150_000));
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    let asked = std::time::Instant::now();
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "annotate",
        "secret/custody-ca",
        "custody.io/rotate-ca=10",
    ]);
    assert!(output.status.success(), "{output:?}");

    // The new CA signs once its time came; the agent then replaces its gate certificate.
    let new_ca = custody_tests::eventually("the new CA signing", TIMEOUT, || {
        let secrets = secrets.clone();
        let old_ca = old_ca.clone();
        async move {
            let secret = secrets.get("custody-ca").await.map_err(|e| e.to_string())?;
            let name = ca_name(&secret);
            if name != old_ca {
                Ok(name)
            } else {
                Err(format!("still {name}"))
            }
        }
    })
    .await;
    let promoted = asked.elapsed();
    // By then the restore's namespace trusts it too (published when it joined the bundle,
    // not at the Restore's next reconciliation).
    let gate_ca =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &namespace.name)
            .get("custody-gate-ca")
            .await
            .unwrap()
            .data
            .unwrap_or_default()
            .remove("ca.crt")
            .unwrap_or_default();
    assert_eq!(gate_ca.matches("BEGIN CERTIFICATE").count(), 2, "{gate_ca}");
    let gate_after =
        custody_tests::eventually("a gate certificate from the new CA", TIMEOUT, || {
            let new_ca = new_ca.clone();
            async move {
                let pem = std::fs::read(GATE_CERTIFICATE).map_err(|e| e.to_string())?;
                let issuer = x509(&pem, "-issuer");
                if issuer == format!("issuer=CN = {new_ca}") {
                    Ok(pem)
                } else {
                    Err(issuer)
                }
            }
        })
        .await;
    let reissued = asked.elapsed();
    assert_ne!(gate_after, gate_before);
    // All of it happened while the restore ran: custody-wait still held the pod.
    let running = namespace.api::<Restore>().get("shop").await.unwrap();
    assert_ne!(
        running.status.as_ref().and_then(|status| status.phase),
        Some(RestorePhase::Completed),
        "the restore finished before the rotation: the test proves nothing"
    );
    let mover_running = pods.get_opt(&mover).await.unwrap().is_some_and(|pod| {
        pod.status.and_then(|status| status.phase).as_deref() == Some("Running")
    });
    // The old CA stays trusted beside the new one.
    let bundle =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .get("custody-ca")
            .await
            .unwrap()
            .data
            .unwrap_or_default()
            .remove("ca.crt")
            .unwrap_or_default();
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2, "{bundle}");
    relay.set(s3::Fault::None);

    let restore = await_condition(
        &namespace.api::<Restore>(),
        "shop",
        "Completed",
        Duration::from_secs(600),
        |restore: &Restore| {
            restore.status.as_ref().and_then(|status| status.phase) == Some(RestorePhase::Completed)
        },
    )
    .await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    ready(pods, "shop-0").await;
    assert_eq!(tree(setup.source.path()), tree(target.path()));
    let done = asked.elapsed();
    // The agent reports after the rotation (to a report service whose certificate the new
    // CA signed), and nothing was restarted.
    let since = k8s_openapi::jiff::Timestamp::now();
    let agents: Api<NodeAgent> = Api::all(client.clone());
    await_condition(
        &agents,
        setup.node,
        "a report after the rotation",
        TIMEOUT,
        |agent: &NodeAgent| {
            agent
                .status
                .as_ref()
                .and_then(|status| status.last_heartbeat_time.as_ref())
                .is_some_and(|time| time.0 > since)
        },
    )
    .await;
    assert_eq!(
        custody_pod(client, "custody-agent").await,
        agent,
        "the agent was restarted"
    );
    assert_eq!(
        custody_pod(client, "custody-controller").await,
        controller,
        "the controller was restarted"
    );
    println!(
        "CA rotation during a restore: new CA signing after {:.1} s, gate certificate from it after {:.1} s (mover still writing: {mover_running}), restore completed and pod ready after {:.1} s",
        promoted.as_secs_f64(),
        reissued.as_secs_f64(),
        done.as_secs_f64()
    );
    setup.finish().await;
}

/// The process that leads, from Lease custody-system/custody-controller: `<pod>_<start>`.
async fn leader(client: &kube::Client) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NAMESPACE);
    let holder = leases
        .get_opt("custody-controller")
        .await
        .ok()??
        .spec?
        .holder_identity?;
    Some(holder).filter(|holder| holder.contains('_'))
}

/// `custody_controller_leader` of every controller pod that answers: (pod, value).
async fn leaders_by_metric(client: &kube::Client) -> Vec<(String, f64)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut values = Vec::new();
    for pod in pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=custody-controller"))
        .await
        .unwrap()
    {
        let Some(ip) = pod.status.as_ref().and_then(|status| status.pod_ip.clone()) else {
            continue;
        };
        let Some(body) = reqwest_get(&format!("http://{ip}:8080/metrics")).await else {
            continue;
        };
        if let Some(value) = body
            .lines()
            .find(|line| line.starts_with("custody_controller_leader "))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
        {
            values.push((pod.metadata.name.unwrap_or_default(), value));
        }
    }
    values
}

/// Whether the API server got an answer from custody's webhook for a pod in `namespace`
/// mounting `claim` (a server-side dry run): `Ok(true)` refused naming the claim (under
/// restore), `Ok(false)` admitted (the restore is over); `Err` says why there was no answer.
async fn webhook_answers(
    client: &kube::Client,
    namespace: &str,
    claim: &str,
) -> Result<bool, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "intruder"},
        "spec": {
            "containers": [{"name": "app", "image": "localhost/custody/postgres:15"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match pods.create(&params, &pod).await {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => {
            Err(status.message)
        }
        Err(kube::Error::Api(status)) if status.message.contains(claim) => Ok(true),
        Err(other) => Err(format!("not custody's refusal: {other}")),
    }
}

/// #23 item 6: custody runs two controller replicas; killing the one that leads (SIGKILL, no
/// Lease given up) while a restore writes its volume and while that restore holds the
/// deletion of its Backup loses nothing and does nothing twice. The other replica leads once
/// the Lease aged 15 s, the restore completes verified with one prepareData Job, the Backup's
/// artifact is deleted once after it, and the admission webhook answers throughout (the
/// other replica serves it) but in the first 2 s, while the dead replica may still be an
/// endpoint of the Service.
#[tokio::test]
async fn on_a_real_node_killing_the_leader_during_a_restore_and_a_backup_deletion_loses_and_repeats_nothing()
 {
    let setup = backed_up_with("leader", Agents::Exclusive(AGENTS.write().await)).await;
    let (namespace, pods, client) = (&setup.namespace, &setup.pods, &setup.client);
    let ns = namespace.name.clone();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    await_condition(
        &deployments,
        "custody-controller",
        "two ready replicas",
        TIMEOUT,
        |deployment: &Deployment| {
            deployment
                .status
                .as_ref()
                .and_then(|status| status.ready_replicas)
                == Some(2)
        },
    )
    .await;
    let first = custody_tests::eventually("a leader", TIMEOUT, || async {
        leader(client).await.ok_or_else(|| "none".to_string())
    })
    .await;

    let relay = setup.slow_repository().await;
    relay.set(s3::Fault::ThrottleDownloads(150_000));
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    // The Backup is deleted while its restore runs: its artifact stays until the restore is
    // over.
    namespace
        .api::<Backup>()
        .delete("nightly", &Default::default())
        .await
        .unwrap();

    // Its pod: the process's name up to its start time.
    let first_pod = first.rsplit_once('_').unwrap().0.to_string();
    let killed = std::time::Instant::now();
    let containers = ctr(&[
        "containers",
        "ls",
        "-q",
        &format!(
            "labels.\"io.kubernetes.pod.name\"=={first_pod},labels.\"io.kubernetes.container.name\"==controller"
        ),
    ]);
    assert!(!containers.trim().is_empty(), "the leader's container");
    for container in containers.lines() {
        ctr(&["tasks", "kill", "-s", "SIGKILL", container]);
    }
    // The webhook answers throughout, and the other replica comes to lead.
    let (mut refused, mut admitted, mut unanswered) = (0, 0, Vec::new());
    let mut second = None;
    while killed.elapsed() < Duration::from_secs(30) {
        match webhook_answers(client, &ns, "data-shop-0").await {
            Ok(true) => refused += 1,
            Ok(false) => admitted += 1,
            Err(why) => unanswered.push((killed.elapsed(), why)),
        }
        if second.is_none()
            && let Some(now) = leader(client).await.filter(|now| *now != first)
        {
            second = Some((now, killed.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (second, took_over) = second.expect("another replica leads");
    let writing = pods.get_opt(&mover).await.unwrap().is_some_and(|pod| {
        pod.status.and_then(|status| status.phase).as_deref() == Some("Running")
    });
    println!(
        "leader {first} killed: {second} leads after {:.1} s (mover still writing: {writing}); webhook answered {} calls in 30 s ({refused} refused naming the claim under restore, {admitted} admitted), {} unanswered {unanswered:?}",
        took_over.as_secs_f64(),
        refused + admitted,
        unanswered.len(),
    );
    // The other replica took over once the Lease had aged its 15 s, not before.
    assert!(
        (Duration::from_secs(14)..Duration::from_secs(25)).contains(&took_over),
        "took over after {took_over:?}"
    );
    // Never two leaders: of the replicas that answer, one says it leads (the killed one,
    // restarted, waits its turn).
    for _ in 0..3 {
        let leaders = leaders_by_metric(client).await;
        let leading: f64 = leaders.iter().map(|(_, value)| value).sum();
        assert_eq!(leading, 1.0, "{leaders:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The first second after the kill, a call may still be sent to the dead replica
    // (connection refused) until its endpoint is taken out of the Service; after that every
    // call is answered.
    let late: Vec<_> = unanswered
        .iter()
        .filter(|(at, _)| *at >= Duration::from_secs(2))
        .collect();
    assert!(late.is_empty(), "the webhook did not answer: {late:?}");
    let running = namespace.api::<Restore>().get("shop").await.unwrap();
    assert_ne!(
        running.status.as_ref().and_then(|status| status.phase),
        Some(RestorePhase::Completed),
        "the restore finished before the other replica led: the test proves nothing"
    );
    assert_eq!(
        admitted, 0,
        "a pod mounting the claim under restore was admitted"
    );
    relay.set(s3::Fault::None);

    // Until the restore completes, every prepareData Job there ever is: one.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = namespace.api();
    let prepare = ListParams::default().labels(&format!(
        "{}={}",
        custody_proto::names::LABEL_ROLE,
        custody_proto::names::ROLE_PREPARE_DATA
    ));
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let restore = loop {
        for job in jobs.list(&prepare).await.unwrap() {
            seen.insert(job.metadata.uid.unwrap_or_default());
        }
        let restore = namespace.api::<Restore>().get("shop").await.unwrap();
        if restore.status.as_ref().and_then(|status| status.phase) == Some(RestorePhase::Completed)
        {
            break restore;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restore did not complete: {:?}",
            restore.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(seen.len(), 1, "prepareData Jobs: {seen:?}");
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    ready(pods, "shop-0").await;
    assert_eq!(tree(setup.source.path()), tree(target.path()));
    // The Backup goes after the restore, its artifact deleted once.
    gone(&namespace.api::<Backup>(), "nightly").await;
    let events: Api<k8s_openapi::api::core::v1::Event> = namespace.api();
    let deletions: Vec<(Option<String>, Option<i32>, Option<String>)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| {
            event.involved_object.name.as_deref() == Some("nightly")
                && matches!(
                    event.reason.as_deref(),
                    Some("ArtifactDeleted" | "ArtifactAlreadyAbsent")
                )
        })
        .map(|event| (event.reason, event.count, event.message))
        .collect();
    assert_eq!(deletions.len(), 1, "{deletions:?}");
    assert_eq!(
        deletions[0].0.as_deref(),
        Some("ArtifactDeleted"),
        "{deletions:?}"
    );
    assert!(
        deletions[0].1.unwrap_or(1) == 1,
        "deleted more than once: {deletions:?}"
    );
    setup.finish().await;
}
