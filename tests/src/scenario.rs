//! A restore scenario shared by the restore tests and the restore benchmark: a namespace with
//! a completed Backup of Cluster `orders` (its volume a real ext4 filesystem on node a), the
//! real controller with its admission webhook registered for the namespace, the real agent on
//! the node (its gate on the node's own loopback address), and the fake kubelet's Job runner.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use custody_kube::api::{Backup, BackupPhase, BackupRepository, Cluster, Restore};
use custody_proto::names;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::agent::{
    AgentArgs, AgentProcess, CONTROLLER_NAME, ControllerProcess, report_flags, report_token,
};
use crate::kubelet::{FakeKubelet, LOCAL_STORAGE_CLASS, PodRunner, PodSpec, create_pod};
use crate::pki::Pki;
use crate::volumes::LoopVolume;
use crate::{TestNamespace, await_condition, eventually, free_port, s3};

const TIMEOUT: Duration = Duration::from_secs(300);

/// A namespace with a completed Backup of Cluster `orders`, a controller with its webhook, and
/// one node (fake kubelet, real agent) ready for a restore.
pub struct Setup {
    pub namespace: TestNamespace,
    pub kubelet: Arc<FakeKubelet>,
    pub source: LoopVolume,
    pub pki: Pki,
    pub controller: ControllerProcess,
    pub agent: AgentProcess,
    pub jobs: PodRunner,
    /// The node agent's report token (bound to its pod).
    pub report_token: tempfile::NamedTempFile,
    _identities: Option<(tempfile::NamedTempFile, tempfile::NamedTempFile)>,
    agents_namespace: String,
    webhook: String,
    gate: SocketAddr,
    controller_flags: Vec<String>,
    controller_kubeconfig: PathBuf,
}

impl Setup {
    /// Stops the controller (SIGTERM, then SIGKILL after 20 s).
    pub fn stop_controller(&mut self) {
        if self
            .controller
            .child
            .terminate(Duration::from_secs(20))
            .is_none()
            && let Some(mut child) = self.controller.child.0.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the controller again with the flags it first ran with. Its report service gets a
    /// new port: the running agent keeps reporting to the old one.
    pub fn start_controller(&mut self) {
        self.controller = ControllerProcess::start_as(
            &self.namespace.name,
            &self.pki,
            &self.controller_flags,
            &self.controller_kubeconfig,
        );
    }

    /// Restarts the controller with `extra` flags besides its first ones, then the agent, so
    /// that it reports to the new controller's report service.
    pub fn restart_controller_with(&mut self, extra: &[&str]) {
        self.stop_controller();
        self.controller_flags
            .extend(extra.iter().map(|flag| flag.to_string()));
        self.start_controller();
        self.restart_agent(&[], Vec::new());
    }

    /// Stops the node's agent and starts it again under `wrapper` (such as
    /// `faketime -f +30s`) with `envs`, reporting as before.
    pub fn restart_agent(&mut self, wrapper: &[&str], envs: Vec<(&str, &str)>) {
        self.agent.stop();
        // Wait until the gate's address is free again (the old process and its wrapper gone).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpListener::bind(self.gate).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the gate address {} stays in use after the old agent stopped",
                self.gate
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.agent = AgentProcess::start(
            &self.kubelet,
            &self.pki,
            AgentArgs {
                flags: report_flags(&self.controller, &self.pki, self.report_token.path()),
                gate: Some(self.gate),
                wrapper,
                envs,
                kubeconfig: self
                    ._identities
                    .as_ref()
                    .map(|(_, agent)| agent.path().to_path_buf()),
            },
        );
    }

    /// Deletes what is in the namespace, then the namespace ([`crate::TestNamespace::delete`]), while
    /// the controller, the agent and the node still run (custody's finalizers are theirs to
    /// remove, and the node confirms its pods' deletion), then deletes what the scenario made
    /// outside it.
    pub async fn finish(self) {
        self.finish_deleting(false).await;
    }

    /// [`Setup::finish`], deleting the namespace with custody's objects still in it
    /// ([`crate::TestNamespace::delete_whole`]).
    pub async fn finish_deleting_the_namespace_whole(self) {
        self.finish_deleting(true).await;
    }

    async fn finish_deleting(self, whole: bool) {
        let agents_namespace = self.agents_namespace.clone();
        let in_own_namespace = agents_namespace == self.namespace.name;
        let client = self.namespace.client.clone();
        if whole {
            self.namespace.delete_whole().await;
        } else {
            self.namespace.delete().await;
        }
        if !in_own_namespace {
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(client.clone(), &agents_namespace);
            let _ = pods
                .delete(
                    &format!("custody-agent-{}", self.kubelet.node),
                    &DeleteParams::default(),
                )
                .await;
        }
        let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let _ = configurations
            .delete(&self.webhook, &DeleteParams::default())
            .await;
        self.kubelet.delete().await;
    }
}

/// A loopback address of this test's own (the node's address; its agent's gate listens there).
pub fn node_address(namespace: &str) -> String {
    let hash = blake3::hash(namespace.as_bytes());
    let bytes = hash.as_bytes();
    format!(
        "127.{}.{}.{}",
        1 + bytes[0] % 250,
        bytes[1],
        1 + bytes[2] % 250
    )
}

pub async fn create<K>(api: &Api<K>, value: serde_json::Value) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(value).expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create")
}

/// Installs the ServiceAccounts and RBAC of `deploy/` (and nothing that would run a pod), and
/// returns kubeconfigs that authenticate as the controller's and the agent's ServiceAccounts.
pub async fn deployed_identities(
    client: &kube::Client,
) -> (tempfile::NamedTempFile, tempfile::NamedTempFile) {
    let root = crate::repo_root().join("deploy");
    let mut documents = Vec::new();
    for file in [
        "namespace.yaml",
        "controller.yaml",
        "agent.yaml",
        "roles.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).expect("deploy manifest");
        for document in text.split("\n---\n") {
            let kind = document
                .lines()
                .find_map(|line| line.strip_prefix("kind: "))
                .unwrap_or_default()
                .trim();
            if [
                "Namespace",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
            .contains(&kind)
            {
                documents.push(document.to_string());
            }
        }
    }
    let mut child = std::process::Command::new(crate::kubectl_path())
        .arg(format!("--kubeconfig={}", crate::control_plane().display()))
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=custody-tests",
            "-f",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("kubectl apply");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(documents.join("\n---\n").as_bytes())
        .expect("writing manifests");
    assert!(
        child.wait().expect("kubectl").success(),
        "applying deploy/ RBAC failed"
    );
    let kubeconfig = |account: &'static str| {
        let client = client.clone();
        async move {
            let token = crate::kubelet::request_token(
                &client,
                "custody-system",
                account,
                "https://kubernetes.default.svc",
                None,
            )
            .await;
            let mut config =
                kube::config::Kubeconfig::read_from(crate::control_plane()).expect("kubeconfig");
            for user in &mut config.auth_infos {
                if let Some(auth) = user.auth_info.as_mut() {
                    *auth = kube::config::AuthInfo {
                        token: Some(token.clone().into()),
                        ..kube::config::AuthInfo::default()
                    };
                }
            }
            let file = tempfile::NamedTempFile::new().expect("kubeconfig file");
            std::fs::write(file.path(), serde_yaml::to_string(&config).expect("yaml"))
                .expect("write");
            file
        }
    };
    (
        kubeconfig("custody-controller").await,
        kubeconfig("custody-agent").await,
    )
}

/// The scenario, with `populate` writing the source volume.
pub async fn setup_with(prefix: &str, megabytes: u64, populate: impl FnOnce(&Path)) -> Setup {
    setup_full(prefix, megabytes, false, Store::Plain, populate).await
}

/// [`setup`] with an encrypted repository: BackupRepository `store` names the key Secret
/// `repository-keys` (one password, [`crate::repository::PASSWORD`] under `password`), so
/// Backups write snapshots (format 2).
pub async fn setup_encrypted(prefix: &str) -> Setup {
    setup_full(prefix, 64, false, Store::Encrypted, small_database).await
}

/// [`setup_encrypted`] with the source volume (of `megabytes`) written by `populate`.
pub async fn setup_encrypted_with(
    prefix: &str,
    megabytes: u64,
    populate: impl FnOnce(&Path),
) -> Setup {
    setup_full(prefix, megabytes, false, Store::Encrypted, populate).await
}

/// The scenario with the controller and the agent running as the ServiceAccounts of
/// `deploy/`, with exactly the RBAC the manifests grant them (and the webhook configuration
/// and Secret names the manifests use).
pub async fn setup_as_deployed(prefix: &str) -> Setup {
    setup_full(prefix, 64, true, Store::Plain, small_database).await
}

/// [`setup_encrypted`] with the source volume written by `populate` and BackupRepository
/// `store` in `bucket` (an encrypted repository other scenarios may share), importing the
/// snapshots it finds there that no Backup of this namespace wrote.
pub async fn setup_importing(prefix: &str, bucket: &str, populate: impl FnOnce(&Path)) -> Setup {
    setup_full(
        prefix,
        64,
        false,
        Store::Importing(bucket.to_string()),
        populate,
    )
    .await
}

/// The BackupRepository `store` of a scenario.
enum Store {
    /// Format 1, in a bucket of its own.
    Plain,
    /// Encrypted, in a bucket of its own.
    Encrypted,
    /// Encrypted, in this bucket, with `importSnapshots`.
    Importing(String),
}

async fn setup_full(
    prefix: &str,
    megabytes: u64,
    deployed: bool,
    store: Store,
    populate: impl FnOnce(&Path),
) -> Setup {
    let namespace = TestNamespace::create(prefix).await;
    let client = namespace.client.clone();
    let ns = namespace.name.clone();
    let url = s3::shared();
    let bucket = match &store {
        Store::Importing(bucket) => bucket.clone(),
        _ => s3::bucket(url, prefix).await,
    };
    let ip = node_address(&ns);
    let kubelet = Arc::new(FakeKubelet::with_address(&client, &format!("{ns}-a"), &ip).await);

    match store {
        Store::Plain => repository(&namespace, url, &bucket).await,
        Store::Encrypted => encrypted_repository(&namespace, url, &bucket).await,
        Store::Importing(_) => importing_repository(&namespace, url, &bucket).await,
    }

    // The source: Cluster orders, its claim mounted by a running pod on the node.
    source_cluster(&namespace).await;
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
    let source = LoopVolume::new(megabytes);
    populate(source.path());

    // The controller, its webhook registered for this namespace only.
    let pki = Pki::new(&[CONTROLLER_NAME, names::AGENT_SERVER_NAME]);
    let webhook_port = free_port();
    let identities = if deployed {
        Some(deployed_identities(&client).await)
    } else {
        None
    };
    let (webhook, webhook_secret, agents_namespace) = if deployed {
        (
            "custody-restore-gate".to_string(),
            "custody-system/custody-webhook-tls".to_string(),
            "custody-system".to_string(),
        )
    } else {
        (
            format!("custody-{ns}"),
            format!("{ns}/custody-webhook-tls"),
            ns.clone(),
        )
    };
    // One left behind by an interrupted run of the same name.
    let _ = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete(&webhook, &DeleteParams::default())
        .await;
    create::<MutatingWebhookConfiguration>(
        &Api::all(client.clone()),
        restore_gate(&webhook, &ns, webhook_port),
    )
    .await;
    let mut controller_flags = vec![
        "--mover-image=custody-mover:test".to_string(),
        "--wait-image=custody-wait:test".to_string(),
        format!("--agent-service-account={agents_namespace}:custody-agent"),
        format!("--gate-ca-file={}", pki.ca().display()),
        format!("--webhook-address=127.0.0.1:{webhook_port}"),
        format!("--webhook-configuration={webhook}"),
        format!("--webhook-secret={webhook_secret}"),
        "--webhook-names=127.0.0.1".to_string(),
        "--webhook-check-seconds=1".to_string(),
        // A namespace's restore mark comes off 3 s after its last restore completed.
        "--restore-mark-grace-seconds=3".to_string(),
    ];
    if deployed {
        // Its Leases where deploy/ lets it write them: its own namespace only.
        controller_flags.push("--lease-namespace=custody-system".to_string());
    }
    let controller_kubeconfig = identities
        .as_ref()
        .map(|(controller, _)| controller.path().to_path_buf())
        .unwrap_or_else(|| crate::control_plane().to_path_buf());
    let controller =
        ControllerProcess::start_as(&ns, &pki, &controller_flags, &controller_kubeconfig);
    let token = report_token(&client, &agents_namespace, &kubelet.node).await;
    let gate: SocketAddr = format!("{ip}:{}", names::GATE_PORT).parse().unwrap();
    let agent = AgentProcess::start(
        &kubelet,
        &pki,
        AgentArgs {
            flags: report_flags(&controller, &pki, token.path()),
            gate: Some(gate),
            kubeconfig: identities
                .as_ref()
                .map(|(_, agent)| agent.path().to_path_buf()),
            ..AgentArgs::default()
        },
    );
    let jobs = PodRunner::start(
        &client,
        &ns,
        &kubelet.node,
        BTreeMap::from([("data-orders-0".to_string(), source.path().to_path_buf())]),
    );
    // The movers' scratch where a kubelet has it: the agent reads their progress there.
    jobs.lay_out_scratch_under(kubelet.root());

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

    nightly_completed(&namespace).await;

    Setup {
        namespace,
        kubelet,
        source,
        pki,
        controller,
        agent,
        jobs,
        report_token: token,
        _identities: identities,
        agents_namespace,
        webhook,
        gate,
        controller_flags,
        controller_kubeconfig,
    }
}

/// The restore gate's MutatingWebhookConfiguration of `deploy/webhook.yaml` (its selectors,
/// match conditions and failure policies), named `name`, calling the controller at
/// 127.0.0.1:`port` and limited to namespace `namespace`.
pub fn restore_gate(name: &str, namespace: &str, port: u16) -> serde_json::Value {
    let text = std::fs::read_to_string(crate::repo_root().join("deploy/webhook.yaml"))
        .expect("deploy/webhook.yaml");
    let mut gate: serde_json::Value = text
        .split("\n---\n")
        .map(|document| serde_yaml::from_str::<serde_json::Value>(document).expect("YAML"))
        .find(|document| document["kind"] == "MutatingWebhookConfiguration")
        .expect("the restore gate in deploy/webhook.yaml");
    gate["metadata"] = json!({"name": name});
    for hook in gate["webhooks"].as_array_mut().expect("webhooks") {
        hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}/mutate-pods")});
        hook["namespaceSelector"]["matchExpressions"]
            .as_array_mut()
            .expect("a namespaceSelector")
            .push(json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}));
    }
    gate
}

/// Cluster `shop` restored from Backup `nightly`, and (once its Restore exists) its
/// StatefulSet; the claim's PersistentVolume is `target`.
pub async fn restore_into(setup: &Setup, target: &Path, annotations: serde_json::Value) {
    restore_into_on(setup, &setup.kubelet, target, annotations).await
}

/// [`restore_into`] with the volume (and so the pod) on `kubelet`'s node.
pub async fn restore_into_on(
    setup: &Setup,
    kubelet: &FakeKubelet,
    target: &Path,
    annotations: serde_json::Value,
) {
    let ns = &setup.namespace.name;
    kubelet
        .local_persistent_volume(ns, "data-shop-0", target)
        .await;
    shop_restored_from_nightly(setup, annotations).await;
}

/// Cluster `shop` restored from Backup `nightly`, and (once its Restore exists) its
/// StatefulSet, whose claim `data-shop-0` binds to a PersistentVolume made beforehand.
pub async fn shop_restored_from_nightly(setup: &Setup, annotations: serde_json::Value) {
    shop_of_replicas_restored_from_nightly(setup, annotations, 1).await
}

/// [`restore_into`] from Backup `backup` instead of `nightly`.
pub async fn restore_into_from(setup: &Setup, target: &Path, backup: &str) {
    let ns = &setup.namespace.name;
    setup
        .kubelet
        .local_persistent_volume(ns, "data-shop-0", target)
        .await;
    shop_restored_from(setup, json!({}), 1, backup).await;
}

/// [`shop_restored_from_nightly`] with `replicas` pods, started in parallel (claims
/// `data-shop-<ordinal>`).
pub async fn shop_of_replicas_restored_from_nightly(
    setup: &Setup,
    annotations: serde_json::Value,
    replicas: i32,
) {
    shop_restored_from(setup, annotations, replicas, "nightly").await
}

/// [`shop_restored_from_nightly`] with a pod template that does not carry the label
/// `custody.io/cluster`: its pods reach the restore gate only by the claim they mount.
pub async fn shop_restored_unlabelled(setup: &Setup) {
    shop_restored(setup, json!({}), 1, "nightly", json!({"app": "shop"})).await
}

async fn shop_restored_from(
    setup: &Setup,
    annotations: serde_json::Value,
    replicas: i32,
    backup: &str,
) {
    shop_restored(
        setup,
        annotations,
        replicas,
        backup,
        json!({"app": "shop", "custody.io/cluster": "shop"}),
    )
    .await
}

async fn shop_restored(
    setup: &Setup,
    annotations: serde_json::Value,
    replicas: i32,
    backup: &str,
    template_labels: serde_json::Value,
) {
    create::<Cluster>(
        &setup.namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "shop", "annotations": annotations},
            "spec": {"statefulSetRef": {"name": "shop"}, "volumeClaimTemplates": ["data"],
                     "restore": {"backupRef": {"name": backup}}},
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
    create::<StatefulSet>(
        &setup.namespace.api(),
        shop_statefulset(replicas, template_labels),
    )
    .await;
}

/// StatefulSet `shop` of `replicas` pods (started in parallel) with these pod template labels,
/// its claims `data-shop-<ordinal>` of the local storage class.
pub fn shop_statefulset(replicas: i32, template_labels: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {"name": "shop"},
        "spec": {
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "serviceName": "shop",
            "selector": {"matchLabels": {"app": "shop"}},
            "template": {
                "metadata": {"labels": template_labels},
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
    })
}

/// Secret `s3` with the test S3 server's credentials, and BackupRepository `store` at
/// `endpoint`, bucket `bucket`, prefix `custody` (repository format 1: unencrypted).
pub async fn repository(namespace: &TestNamespace, endpoint: &str, bucket: &str) {
    store(namespace, endpoint, bucket, None, false).await;
}

/// [`repository`] with encryption (format 2): the key Secret `repository-keys` holds one
/// password, [`crate::repository::PASSWORD`], under `password`.
pub async fn encrypted_repository(namespace: &TestNamespace, endpoint: &str, bucket: &str) {
    encrypted_store(namespace, endpoint, bucket, false).await;
}

/// [`encrypted_repository`] with `importSnapshots`.
pub async fn importing_repository(namespace: &TestNamespace, endpoint: &str, bucket: &str) {
    encrypted_store(namespace, endpoint, bucket, true).await;
}

async fn encrypted_store(namespace: &TestNamespace, endpoint: &str, bucket: &str, import: bool) {
    create::<Secret>(
        &namespace.api(),
        json!({
            "metadata": {"name": "repository-keys"},
            "stringData": {"password": crate::repository::PASSWORD},
        }),
    )
    .await;
    let encryption = json!({"keySecretRef": {"name": "repository-keys"}});
    store(namespace, endpoint, bucket, Some(encryption), import).await;
}

async fn store(
    namespace: &TestNamespace,
    endpoint: &str,
    bucket: &str,
    encryption: Option<serde_json::Value>,
    import: bool,
) {
    create::<Secret>(&namespace.api(), json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3::ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3::SECRET_KEY},
    }))
    .await;
    let mut spec = json!({"endpoint": endpoint, "bucket": bucket, "prefix": "custody",
                          "forcePathStyle": true, "credentialsSecretRef": {"name": "s3"}});
    if let Some(encryption) = encryption {
        spec["encryption"] = encryption;
    }
    if import {
        spec["importSnapshots"] = json!(true);
    }
    create::<BackupRepository>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "store"},
            "spec": spec,
        }),
    )
    .await;
}

/// Cluster `orders` of StatefulSet `orders` (claim template `data`), backed up to `store`.
pub async fn source_cluster(namespace: &TestNamespace) {
    create::<Cluster>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "orders"},
            // Its pod runs while it is backed up: the copy is knowingly not a point in time
            // (the tests' small database is files, not a running engine).
            "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                     "repositoryRef": {"name": "store"}, "consistency": {"method": "CrashUnsafe"}},
        }),
    )
    .await;
}

/// Backup `nightly` of Cluster `orders`, once it is Completed.
pub async fn nightly_completed(namespace: &TestNamespace) {
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
}

/// The artifact Backup `name` recorded.
pub async fn artifact_of(namespace: &TestNamespace, name: &str) -> custody_kube::api::Artifact {
    namespace
        .api::<Backup>()
        .get(name)
        .await
        .unwrap()
        .status
        .and_then(|status| status.artifact)
        .unwrap_or_else(|| panic!("Backup {name} has no artifact"))
}

/// Restore `name` once it is in `phase`.
pub async fn restore_reaches(
    namespace: &TestNamespace,
    name: &str,
    phase: custody_kube::api::RestorePhase,
) -> Restore {
    await_condition(
        &namespace.api::<Restore>(),
        name,
        &format!("{phase:?}"),
        TIMEOUT,
        |restore: &Restore| restore.status.as_ref().and_then(|status| status.phase) == Some(phase),
    )
    .await
}

/// Waits until Restore `name`'s `Ready` condition has reason `reason`; the Restore then.
pub async fn restore_says(
    namespace: &TestNamespace,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> Restore {
    await_condition(
        &namespace.api::<Restore>(),
        name,
        reason,
        timeout,
        |restore: &Restore| {
            restore.status.as_ref().is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == reason)
            })
        },
    )
    .await
}

/// Waits until Cluster `cluster`'s coordination Lease names no holder (no Backup or Restore
/// runs into it).
pub async fn lease_free(namespace: &TestNamespace, cluster: &str, timeout: Duration) {
    let uid = namespace
        .api::<Cluster>()
        .get(cluster)
        .await
        .unwrap_or_else(|error| panic!("reading Cluster {cluster}: {error}"))
        .metadata
        .uid
        .expect("a Cluster's uid");
    let leases = namespace.api::<k8s_openapi::api::coordination::v1::Lease>();
    let name = format!("custody-run-{uid}");
    eventually("the Cluster's Lease given back", timeout, || {
        let (leases, name) = (leases.clone(), name.clone());
        async move {
            let holder = leases
                .get_opt(&name)
                .await
                .map_err(|error| error.to_string())?
                .and_then(|lease| lease.spec)
                .and_then(|spec| spec.holder_identity);
            match holder {
                None => Ok(()),
                Some(holder) => Err(format!("held by {holder}")),
            }
        }
    })
    .await;
}

/// The scenario with the tests' small database.
pub async fn setup(prefix: &str) -> Setup {
    setup_with(prefix, 64, small_database).await
}

/// The tests' small database: 500 small files, a 3 MiB log, a symlink.
pub fn small_database(root: &Path) {
    {
        std::fs::create_dir_all(root.join("base/16384")).unwrap();
        for index in 0..500 {
            std::fs::write(
                root.join(format!("base/16384/{index:04}")),
                format!("row {index}\n").repeat(index % 7 + 1),
            )
            .unwrap();
        }
        std::fs::write(root.join("pg_wal"), vec![7u8; 3 << 20]).unwrap();
        std::os::unix::fs::symlink("base/16384/0001", root.join("latest")).unwrap();
    }
}
