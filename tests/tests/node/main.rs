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
use custody_tests::databases::{
    exec, mariadb_statefulset, postgres_statefulset, postgres_statefulset_with_wal, wal_mounts,
    wal_volumes,
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

mod bench;
mod control;
mod drill;
mod freeze;
mod gate;
mod hooks;
mod install;
mod mariadb;
mod monitoring;
mod postgres;

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
    "clusterrole/custody-web-identity",
    "clusterrole/custody-drills",
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
        self.slow_repository_at(2_000_000).await
    }

    /// [`Self::slow_repository`] with downloads limited to `bytes_per_second`.
    async fn slow_repository_at(&self, bytes_per_second: u64) -> s3::FaultyLink {
        let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
        let relay = s3::FaultyLink::start_on(&host, s3::shared());
        relay.set(s3::Fault::ThrottleDownloads(bytes_per_second));
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
