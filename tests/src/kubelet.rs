//! Plays the kubelet's part where no kubelet runs: registers a Node, lays out pod volume
//! directories under a kubelet root (bind-mounting real loop-mounted filesystems there), and
//! moves pods through their phases by writing their status. Everything else — pods, tokens,
//! TokenReviews — is the real API server's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

/// One fake node: a Node object and a kubelet root directory.
pub struct FakeKubelet {
    pub node: String,
    client: Client,
    root: tempfile::TempDir,
    binds: Mutex<Vec<PathBuf>>,
}

impl FakeKubelet {
    /// Registers Node `node` and makes an empty kubelet root.
    pub async fn new(client: &Client, node: &str) -> FakeKubelet {
        let object: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": node, "labels": {"custody.io/test": "true"}},
        }))
        .expect("node");
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|error| panic!("creating Node {node}: {error}"));
        FakeKubelet {
            node: node.to_string(),
            client: client.clone(),
            root: tempfile::tempdir().expect("kubelet root"),
            binds: Mutex::new(Vec::new()),
        }
    }

    /// The kubelet root directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Where the kubelet puts CSI volume `volume` of pod `uid`.
    pub fn volume_path(&self, uid: &str, volume: &str) -> PathBuf {
        self.root
            .path()
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi")
            .join(volume)
            .join("mount")
    }

    /// Mounts `source` (a mounted filesystem) as CSI volume `volume` of pod `uid`.
    pub fn mount(&self, uid: &str, volume: &str, source: &Path) -> PathBuf {
        let target = self.volume_path(uid, volume);
        std::fs::create_dir_all(&target).expect("volume directory");
        let status = Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(&target)
            .status()
            .expect("mount --bind");
        assert!(status.success(), "mount --bind {}", target.display());
        self.binds
            .lock()
            .expect("not poisoned")
            .push(target.clone());
        target
    }

    /// Lays out the volume directory without mounting anything: the node's own disk.
    pub fn unmounted(&self, uid: &str, volume: &str) -> PathBuf {
        let target = self.volume_path(uid, volume);
        std::fs::create_dir_all(&target).expect("volume directory");
        target
    }

    /// Writes `phase` into the pod's status, with a terminated container of `exit_code` for
    /// finished pods.
    pub async fn set_phase(&self, namespace: &str, pod: &str, phase: &str, exit_code: i32) {
        let mut status = serde_json::json!({"phase": phase});
        if phase == "Succeeded" || phase == "Failed" {
            status["containerStatuses"] = serde_json::json!([{
                "name": "main", "image": "mover", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": exit_code, "message": format!("exit {exit_code}")}},
            }]);
        }
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": status})),
            )
            .await
            .unwrap_or_else(|error| panic!("setting phase of {namespace}/{pod}: {error}"));
    }

    /// Deletes the Node object.
    pub async fn delete(&self) {
        let _ = Api::<Node>::all(self.client.clone())
            .delete(&self.node, &DeleteParams::default())
            .await;
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        for target in self.binds.lock().expect("not poisoned").iter().rev() {
            let _ = Command::new("umount").arg(target).status();
        }
    }
}

/// What a test pod looks like.
#[derive(Default)]
pub struct PodSpec<'a> {
    pub name: &'a str,
    pub node: &'a str,
    pub service_account: &'a str,
    pub labels: serde_json::Value,
    pub annotations: serde_json::Value,
    /// `(volume name, claim name)`.
    pub claims: &'a [(&'a str, &'a str)],
}

/// Creates the ServiceAccount if it does not exist.
pub async fn service_account(client: &Client, namespace: &str, name: &str) {
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("sa");
    match Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &account)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("creating ServiceAccount {namespace}/{name}: {error}"),
    }
}

/// Creates a pod bound to its node (as if scheduled).
pub async fn create_pod(client: &Client, namespace: &str, spec: PodSpec<'_>) -> Pod {
    service_account(client, namespace, spec.service_account).await;
    let volumes: Vec<serde_json::Value> = spec
        .claims
        .iter()
        .map(|(volume, claim)| {
            serde_json::json!({"name": volume, "persistentVolumeClaim": {"claimName": claim}})
        })
        .collect();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": spec.name,
            "labels": if spec.labels.is_null() { serde_json::json!({}) } else { spec.labels },
            "annotations": if spec.annotations.is_null() { serde_json::json!({}) } else { spec.annotations },
        },
        "spec": {
            "nodeName": spec.node,
            "serviceAccountName": spec.service_account,
            "automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": "registry.invalid/main:1"}],
            "volumes": volumes,
            "tolerations": [{"operator": "Exists"}],
        },
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|error| panic!("creating pod {namespace}/{}: {error}", spec.name))
}

/// A token of the pod's ServiceAccount bound to the pod, for `audience`.
pub async fn pod_token(client: &Client, pod: &Pod, audience: &str) -> String {
    let namespace = pod.namespace().expect("namespaced");
    let account = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.service_account_name.clone())
        .expect("service account");
    request_token(
        client,
        &namespace,
        &account,
        audience,
        Some(BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name_any()),
            uid: pod.metadata.uid.clone(),
        }),
    )
    .await
}

/// A token of a ServiceAccount, bound to `bound` if given.
pub async fn request_token(
    client: &Client,
    namespace: &str,
    account: &str,
    audience: &str,
    bound: Option<BoundObjectReference>,
) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(3600),
            bound_object_ref: bound,
        },
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|error| panic!("token for {namespace}/{account}: {error}"))
        .status
        .expect("token status")
        .token
}

/// What the pod runner saw when it started a pod, for tests to assert on.
#[derive(Clone, Debug)]
pub struct Started {
    pub pod: String,
    /// The Backup's `status.artifact.key` at that moment, if the pod belongs to a Backup.
    pub recorded_key: Option<String>,
}

/// Runs the pods custody's Jobs create on a fake node: the real command line (the workspace
/// binary named by the container's command) with the pod's args and env (Secret references
/// resolved), each PersistentVolumeClaim mapped to a host directory, and writes the pod's
/// status from the real exit code and termination message. It plays only the kubelet.
pub struct PodRunner {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The pods started so far.
    pub started: std::sync::Arc<Mutex<Vec<Started>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl PodRunner {
    /// Starts running pods of `namespace` bound to `node`, with `claims` mapping claim names
    /// to host directories.
    pub fn start(
        client: &Client,
        namespace: &str,
        node: &str,
        claims: std::collections::BTreeMap<String, PathBuf>,
    ) -> PodRunner {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = std::sync::Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(run_pods(
            client.clone(),
            namespace.to_string(),
            node.to_string(),
            claims,
            stop.clone(),
            started.clone(),
        ));
        PodRunner {
            stop,
            started,
            task: Some(task),
        }
    }

    /// The pods started so far.
    pub fn started(&self) -> Vec<Started> {
        self.started.lock().expect("not poisoned").clone()
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn run_pods(
    client: Client,
    namespace: String,
    node: String,
    claims: std::collections::BTreeMap<String, PathBuf>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    started: std::sync::Arc<Mutex<Vec<Started>>>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let mut seen = std::collections::BTreeSet::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let listed = pods
            .list(&kube::api::ListParams::default().labels(custody_proto::names::LABEL_ROLE))
            .await;
        for pod in listed.map(|list| list.items).unwrap_or_default() {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let on_node =
                pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(&node);
            if !on_node || !seen.insert(uid) {
                continue;
            }
            let recorded_key = backup_key(&client, &namespace, &pod).await;
            started.lock().expect("not poisoned").push(Started {
                pod: pod.name_any(),
                recorded_key,
            });
            let client = client.clone();
            let claims = claims.clone();
            let namespace = namespace.clone();
            tokio::spawn(async move { run_pod(client, namespace, pod, claims).await });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The artifact key the pod's Backup has recorded, read from the API server now.
async fn backup_key(client: &Client, namespace: &str, pod: &Pod) -> Option<String> {
    let owner = pod
        .metadata
        .labels
        .as_ref()?
        .get("custody.io/backup-uid")?
        .clone();
    let backups: Api<custody_controller::api::Backup> = Api::namespaced(client.clone(), namespace);
    backups
        .list(&Default::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|backup| backup.metadata.uid.as_deref() == Some(owner.as_str()))?
        .status?
        .artifact
        .map(|artifact| artifact.key)
}

async fn set_status(pods: &Api<Pod>, name: &str, status: serde_json::Value) {
    if let Err(error) = pods
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": status})),
        )
        .await
    {
        eprintln!("[kubelet] status of {name}: {error}");
    }
}

async fn run_pod(
    client: Client,
    namespace: String,
    pod: Pod,
    claims: std::collections::BTreeMap<String, PathBuf>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let name = pod.name_any();
    let spec = pod.spec.clone().expect("spec");
    let container = spec.containers[0].clone();
    // Volumes: claim -> host directory; mount path -> host directory.
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let claim = spec
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == mount.name)
            .and_then(|volume| volume.persistent_volume_claim.as_ref())
            .map(|source| source.claim_name.clone());
        if let Some(path) = claim.and_then(|claim| claims.get(&claim).cloned()) {
            mounts.push((mount.mount_path.clone(), path));
        }
    }
    let result_file = tempfile::NamedTempFile::new().expect("termination message file");
    let map = |argument: &str| -> String {
        if argument == "/dev/termination-log" {
            return result_file.path().display().to_string();
        }
        for (mount_path, host) in &mounts {
            if argument == mount_path {
                return host.display().to_string();
            }
        }
        argument.to_string()
    };
    let program = container.command.clone().unwrap_or_default();
    let binary = crate::binary(program.first().map(String::as_str).unwrap_or("missing"));
    let args: Vec<String> = program
        .iter()
        .skip(1)
        .chain(container.args.iter().flatten())
        .map(|argument| map(argument))
        .collect();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &namespace);
    let mut env = Vec::new();
    for variable in container.env.iter().flatten() {
        let value = match (&variable.value, &variable.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => match &from.secret_key_ref {
                Some(reference) => secrets
                    .get(&reference.name)
                    .await
                    .ok()
                    .and_then(|secret| secret.data)
                    .and_then(|data| data.get(&reference.key).cloned())
                    .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
                    .unwrap_or_default(),
                None => String::new(),
            },
            _ => String::new(),
        };
        env.push((variable.name.clone(), value));
    }
    set_status(&pods, &name, serde_json::json!({"phase": "Running"})).await;
    let output = tokio::process::Command::new(&binary)
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .output()
        .await;
    let (code, stderr) = match output {
        Ok(output) => (
            output.status.code().unwrap_or(128),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ),
        Err(error) => (127, error.to_string()),
    };
    eprintln!("[kubelet] {name} exited {code}: {}", stderr.trim());
    let message = std::fs::read_to_string(result_file.path()).unwrap_or_default();
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    set_status(
        &pods,
        &name,
        serde_json::json!({
            "phase": phase,
            "containerStatuses": [{
                "name": container.name, "image": container.image.clone().unwrap_or_default(),
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "message": message, "reason": if code == 0 { "Completed" } else { "Error" }}},
            }],
        }),
    )
    .await;
}
