//! Plays the kubelet's part where no kubelet runs: registers a Node, lays out pod volume
//! directories under a kubelet root (bind-mounting real loop-mounted filesystems there), and
//! moves pods through their phases by writing their status. Everything else — pods, tokens,
//! TokenReviews — is the real API server's.
//!
//! Why it stays beside the real node (tests/tests/node/, the main end-to-end tier): it does
//! what one real kubelet here cannot. Many nodes at once, cheaply (a pod on a node without an
//! agent, a report from another node, a pod rescheduled with its volume to a second node);
//! precise faults between two steps (a volume changed between its write and its
//! verification, swapped for an empty one, a Job's pods held so that its deadline passes, a
//! pod status naming an image pull failure); and the agent and controller run as processes
//! under faketime or restarted at an exact point.

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
    /// The node's address (`status.hostIP` of its pods; where its agent's gate listens).
    pub ip: String,
    client: Client,
    root: PathBuf,
    _temporary: Option<tempfile::TempDir>,
    binds: Mutex<Vec<PathBuf>>,
}

impl FakeKubelet {
    /// Registers Node `node` and makes an empty kubelet root.
    pub async fn new(client: &Client, node: &str) -> FakeKubelet {
        FakeKubelet::with_address(client, node, "127.0.0.1").await
    }

    /// Registers Node `node` with address `ip`, Ready and with room for pods (what a kubelet
    /// reports, so that the real scheduler places pods on it), and makes an empty kubelet root.
    pub async fn with_address(client: &Client, node: &str, ip: &str) -> FakeKubelet {
        let temporary = tempfile::tempdir().expect("kubelet root");
        let mut kubelet = FakeKubelet::at(client, node, ip, temporary.path()).await;
        kubelet._temporary = Some(temporary);
        kubelet
    }

    /// Like [`FakeKubelet::with_address`], with the kubelet root at `root`.
    pub async fn at(client: &Client, node: &str, ip: &str, root: &Path) -> FakeKubelet {
        let object: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": node, "labels": {"custody.io/test": "true", "kubernetes.io/hostname": node}},
        }))
        .expect("node");
        let nodes = Api::<Node>::all(client.clone());
        nodes
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|error| panic!("creating Node {node}: {error}"));
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = serde_json::json!({"status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": node}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "fake kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        }});
        nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap_or_else(|error| panic!("status of Node {node}: {error}"));
        // Admission taints a new Node not-ready until its kubelet reports Ready; the node
        // lifecycle controller, which lifts it, is off here (it would evict pods of nodes
        // without a kubelet heartbeat), so the harness lifts it for the Ready node.
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"taints": null}})),
            )
            .await
            .unwrap_or_else(|error| panic!("taints of Node {node}: {error}"));
        FakeKubelet {
            node: node.to_string(),
            ip: ip.to_string(),
            client: client.clone(),
            root: root.to_path_buf(),
            _temporary: None,
            binds: Mutex::new(Vec::new()),
        }
    }

    /// The kubelet root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the kubelet puts CSI volume `volume` of pod `uid`.
    pub fn volume_path(&self, uid: &str, volume: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi")
            .join(volume)
            .join("mount")
    }

    /// Mounts `source` (a mounted filesystem) as CSI volume `volume` of pod `uid`.
    pub fn mount(&self, uid: &str, volume: &str, source: &Path) -> PathBuf {
        let target = self.volume_path(uid, volume);
        self.bind(source, &target)
    }

    /// Where the kubelet puts local PersistentVolume `volume` of pod `uid`.
    pub fn local_volume_path(&self, uid: &str, volume: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~local-volume")
            .join(volume)
    }

    /// Bind-mounts `source` at `target`.
    pub fn bind(&self, source: &Path, target: &Path) -> PathBuf {
        let target = target.to_path_buf();
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

    /// Unmounts `target` (mounted by [`FakeKubelet::bind`]).
    pub fn unbind(&self, target: &Path) {
        let _ = Command::new("umount").arg(target).status();
        self.binds
            .lock()
            .expect("not poisoned")
            .retain(|bound| bound != target);
    }

    /// A local PersistentVolume on this node backed by `path`, bound in advance to claim
    /// `namespace/claim` (what an administrator does for static provisioning).
    pub async fn local_persistent_volume(
        &self,
        namespace: &str,
        claim: &str,
        path: &Path,
    ) -> String {
        let name = format!("{namespace}-{claim}");
        let volume: k8s_openapi::api::core::v1::PersistentVolume =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"custody.io/test": "true"}},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": LOCAL_STORAGE_CLASS,
                    "local": {"path": path.display().to_string()},
                    "claimRef": {"namespace": namespace, "name": claim},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [self.node]},
                    ]}]}},
                },
            }))
            .expect("persistent volume");
        Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(self.client.clone())
            .create(&PostParams::default(), &volume)
            .await
            .unwrap_or_else(|error| panic!("creating PersistentVolume {name}: {error}"));
        name
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

/// Storage class of the test's local PersistentVolumes.
pub const LOCAL_STORAGE_CLASS: &str = "custody-local";

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
    /// When the runner started the pod's program, and when it exited (once it has).
    pub at: std::time::Instant,
    pub ended: std::sync::Arc<Mutex<Option<std::time::Instant>>>,
    /// The Backup's `status.artifact.key` at that moment, if the pod belongs to a Backup.
    pub recorded_key: Option<String>,
}

/// Runs the pods custody's Jobs create on a fake node: the real command line (the workspace
/// binary named by the container's command) with the pod's args and env (Secret references
/// resolved), each PersistentVolumeClaim mapped to a host directory, and writes the pod's
/// status from the real exit code and termination message. It plays only the kubelet.
pub struct PodRunner {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// While false, new pods wait (deletions are still confirmed).
    run: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Called with each claim's host directory after a pod's program exited 0 and before its
    /// success is reported: a test's way to change a volume between write and verification.
    tamper: Tamper,
    /// The pods started so far.
    pub started: std::sync::Arc<Mutex<Vec<Started>>>,
    /// Whether it also runs its namespace's maintenance pods bound to other nodes.
    unpinned: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The kubelet root under which a pod's `emptyDir` volumes are laid out, when set.
    scratch: Scratch,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Where [`PodRunner`] lays out `emptyDir` volumes ([`PodRunner::lay_out_scratch_under`]).
type Scratch = std::sync::Arc<Mutex<Option<PathBuf>>>;

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
        let run = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let tamper: Tamper = std::sync::Arc::new(Mutex::new(None));
        let started = std::sync::Arc::new(Mutex::new(Vec::new()));
        let unpinned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let scratch: Scratch = std::sync::Arc::new(Mutex::new(None));
        let task = tokio::spawn(run_pods(
            client.clone(),
            namespace.to_string(),
            node.to_string(),
            claims,
            Shared {
                stop: stop.clone(),
                run: run.clone(),
                tamper: tamper.clone(),
                started: started.clone(),
                unpinned: unpinned.clone(),
                scratch: scratch.clone(),
            },
        ));
        PodRunner {
            stop,
            run,
            tamper,
            started,
            unpinned,
            scratch,
            task: Some(task),
        }
    }

    /// Lays out the `emptyDir` volumes of the pods started from now on where a kubelet with
    /// root `root` does (`pods/<uid>/volumes/kubernetes.io~empty-dir/<name>`), so that the
    /// node's agent finds what a mover writes there (its progress); arguments and environment
    /// values under their mount paths are mapped there.
    pub fn lay_out_scratch_under(&self, root: &Path) {
        *self.scratch.lock().expect("not poisoned") = Some(root.to_path_buf());
    }

    /// Also runs this namespace's maintenance pods (a BackupRepository's prune and check: no
    /// node of their own) wherever the scheduler bound them: with the fake nodes of tests
    /// running in parallel, it may pick another test's node, whose runner ignores them.
    pub fn run_maintenance_anywhere(&self) {
        self.unpinned
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Holds new pods (`false`) or runs them (`true`).
    pub fn set_running(&self, running: bool) {
        self.run
            .store(running, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the hook called with each claim and its directory after a pod succeeded.
    pub fn set_tamper(&self, hook: impl Fn(&str, &Path) + Send + Sync + 'static) {
        *self.tamper.lock().expect("not poisoned") = Some(Box::new(hook));
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

/// What the runner's task shares with its [`PodRunner`].
struct Shared {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    run: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tamper: Tamper,
    started: std::sync::Arc<Mutex<Vec<Started>>>,
    unpinned: std::sync::Arc<std::sync::atomic::AtomicBool>,
    scratch: Scratch,
}

async fn run_pods(
    client: Client,
    namespace: String,
    node: String,
    claims: std::collections::BTreeMap<String, PathBuf>,
    shared: Shared,
) {
    let Shared {
        stop,
        run,
        tamper,
        started,
        unpinned,
        scratch,
    } = shared;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let mut seen = std::collections::BTreeSet::new();
    let mut running: std::collections::BTreeMap<String, tokio::task::JoinHandle<()>> =
        std::collections::BTreeMap::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let listed = pods
            .list(&kube::api::ListParams::default().labels(custody_proto::names::LABEL_ROLE))
            .await;
        for pod in listed.map(|list| list.items).unwrap_or_default() {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let node_name = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref());
            let on_node = node_name == Some(&node);
            let maintenance = pod
                .labels()
                .get(custody_proto::names::LABEL_ROLE)
                .map(String::as_str)
                == Some("maintenance");
            let anywhere = maintenance
                && node_name.is_some()
                && unpinned.load(std::sync::atomic::Ordering::Relaxed);
            if !on_node && !anywhere {
                continue;
            }
            if pod.metadata.deletion_timestamp.is_some() {
                // The kubelet stops the containers and confirms the deletion.
                if let Some(task) = running.remove(&uid) {
                    task.abort();
                }
                seen.insert(uid.clone());
                finish_deletion(&pods, &pod).await;
                continue;
            }
            let finished = matches!(
                pod.status
                    .as_ref()
                    .and_then(|status| status.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            if finished || seen.contains(&uid) || !run.load(std::sync::atomic::Ordering::Relaxed) {
                continue;
            }
            seen.insert(uid.clone());
            let recorded_key = backup_key(&client, &namespace, &pod).await;
            let ended = std::sync::Arc::new(Mutex::new(None));
            started.lock().expect("not poisoned").push(Started {
                pod: pod.name_any(),
                at: std::time::Instant::now(),
                ended: ended.clone(),
                recorded_key,
            });
            let client = client.clone();
            let claims = claims.clone();
            let namespace = namespace.clone();
            let tamper = tamper.clone();
            let scratch = scratch.lock().expect("not poisoned").clone();
            running.insert(
                uid,
                tokio::spawn(async move {
                    run_pod(client, namespace, pod, claims, tamper, scratch).await;
                    *ended.lock().expect("not poisoned") = Some(std::time::Instant::now());
                }),
            );
        }
        running.retain(|_, task| !task.is_finished());
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
    let backups: Api<custody_kube::api::Backup> = Api::namespaced(client.clone(), namespace);
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

/// The hook of [`PodRunner::set_tamper`].
type Tamper = std::sync::Arc<Mutex<Option<Box<dyn Fn(&str, &Path) + Send + Sync>>>>;

async fn run_pod(
    client: Client,
    namespace: String,
    pod: Pod,
    claims: std::collections::BTreeMap<String, PathBuf>,
    tamper: Tamper,
    scratch: Option<PathBuf>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let name = pod.name_any();
    let spec = pod.spec.clone().expect("spec");
    let container = spec.containers[0].clone();
    // Volumes: claim -> host directory; mount path -> host directory.
    let mut mounts = Vec::new();
    let mut claims_mounted: Vec<(String, PathBuf)> = Vec::new();
    // emptyDir mount path -> its directory under the kubelet root (or a directory of its
    // own without one); likewise a projected ServiceAccount token's.
    let mut empty_dirs: Vec<(String, PathBuf)> = Vec::new();
    let projected_root = tempfile::tempdir().expect("projected volumes");
    for mount in container.volume_mounts.iter().flatten() {
        // A projected token, as a kubelet makes it: asked for the pod's ServiceAccount, for
        // the audience the volume names, bound to the pod.
        let tokens: Vec<(String, String)> = spec
            .volumes
            .iter()
            .flatten()
            .filter(|volume| volume.name == mount.name)
            .filter_map(|volume| volume.projected.as_ref())
            .flat_map(|projected| projected.sources.iter().flatten())
            .filter_map(|source| source.service_account_token.as_ref())
            .map(|token| {
                (
                    token.path.clone(),
                    token.audience.clone().unwrap_or_default(),
                )
            })
            .collect();
        if !tokens.is_empty() {
            let directory = projected_root.path().join(&mount.name);
            std::fs::create_dir_all(&directory).expect("a projected volume");
            for (path, audience) in tokens {
                let token = pod_token(&client, &pod, &audience).await;
                std::fs::write(directory.join(path), token).expect("the projected token");
            }
            empty_dirs.push((mount.mount_path.clone(), directory));
            continue;
        }
        let empty_dir = spec
            .volumes
            .iter()
            .flatten()
            .any(|volume| volume.name == mount.name && volume.empty_dir.is_some());
        if let (true, Some(root)) = (empty_dir, &scratch) {
            let directory = root
                .join("pods")
                .join(pod.metadata.uid.as_deref().unwrap_or_default())
                .join("volumes/kubernetes.io~empty-dir")
                .join(&mount.name);
            std::fs::create_dir_all(&directory).expect("an emptyDir");
            empty_dirs.push((mount.mount_path.clone(), directory));
            continue;
        }
        let claim = spec
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == mount.name)
            .and_then(|volume| volume.persistent_volume_claim.as_ref())
            .map(|source| source.claim_name.clone());
        let Some(claim) = claim else { continue };
        let path = match claims.get(&claim) {
            Some(path) => Some(path.clone()),
            None => claim_path(&client, &namespace, &claim).await,
        };
        if let Some(path) = path {
            claims_mounted.push((claim, path.clone()));
            mounts.push((mount.mount_path.clone(), path));
        }
    }
    let result_file = tempfile::NamedTempFile::new().expect("termination message file");
    let under_empty_dir = |value: &str| -> String {
        for (mount_path, directory) in &empty_dirs {
            if let Some(rest) = value.strip_prefix(mount_path.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", directory.display());
            }
        }
        value.to_string()
    };
    let map = |argument: &str| -> String {
        if argument == "/dev/termination-log" {
            return result_file.path().display().to_string();
        }
        for (mount_path, host) in &mounts {
            if argument == mount_path {
                return host.display().to_string();
            }
        }
        under_empty_dir(argument)
    };
    let program = container.command.clone().unwrap_or_default();
    let binary = crate::program(program.first().map(String::as_str).unwrap_or("missing"));
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
        env.push((variable.name.clone(), under_empty_dir(&value)));
    }
    set_status(&pods, &name, serde_json::json!({"phase": "Running"})).await;
    let output = tokio::process::Command::new(&binary)
        .kill_on_drop(true)
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
    if code == 0
        && let Some(hook) = tamper.lock().expect("not poisoned").as_ref()
    {
        for (claim, host) in &claims_mounted {
            hook(claim, host);
        }
    }
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

/// The host directory behind a claim: the local path of the PersistentVolume bound to it.
pub async fn claim_path(client: &Client, namespace: &str, claim: &str) -> Option<PathBuf> {
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), namespace);
    let volume = claims.get_opt(claim).await.ok()??.spec?.volume_name?;
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let path = volumes.get_opt(&volume).await.ok()??.spec?.local?.path;
    Some(PathBuf::from(path))
}

/// The name of the PersistentVolume bound to a claim.
pub async fn bound_volume(client: &Client, namespace: &str, claim: &str) -> Option<String> {
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), namespace);
    claims
        .get_opt(claim)
        .await
        .ok()??
        .spec?
        .volume_name
        .filter(|name| !name.is_empty())
}

/// Confirms a pod's deletion once its containers are stopped, as the kubelet does.
pub async fn finish_deletion(pods: &Api<Pod>, pod: &Pod) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let _ = pods.delete(&pod.name_any(), &params).await;
}
