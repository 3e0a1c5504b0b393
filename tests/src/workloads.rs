//! The kubelet's part for workload pods (the StatefulSet's pods the real scheduler placed on a
//! fake node): mount each claim's local PersistentVolume under the kubelet root, run the init
//! containers that are workspace binaries (`custody-wait`) for real — with the projected
//! ServiceAccount token and ConfigMap files written the way the kubelet writes them, the
//! downward-API environment resolved and `$(VAR)` references expanded — restart a failed init
//! container, then report the pod Running and Ready as the kubelet computes it (containers
//! ready and every readiness gate True). Application containers are not run: no image can be
//! pulled here. Deleted pods are stopped, unmounted and their deletion confirmed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::BoundObjectReference;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::kubelet::{FakeKubelet, bound_volume, claim_path, finish_deletion, request_token};

/// What happened to a pod's init container, for tests to assert on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitRun {
    pub pod: String,
    /// When the container exited.
    pub ended: std::time::Instant,
    pub container: String,
    pub exit_code: i32,
    pub output: String,
}

/// Runs the workload pods of `namespace` on one fake node until dropped.
pub struct WorkloadRunner {
    stop: Arc<AtomicBool>,
    /// Every init container run that ended.
    pub runs: Arc<Mutex<Vec<InitRun>>>,
    /// Where each pod's claims are mounted: `(pod, claim) -> path under the kubelet root`.
    pub mounts: Arc<Mutex<BTreeMap<(String, String), PathBuf>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl WorkloadRunner {
    pub fn start(client: &Client, namespace: &str, kubelet: Arc<FakeKubelet>) -> WorkloadRunner {
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(Mutex::new(Vec::new()));
        let mounts = Arc::new(Mutex::new(BTreeMap::new()));
        let task = tokio::spawn(run(
            client.clone(),
            namespace.to_string(),
            kubelet,
            stop.clone(),
            runs.clone(),
            mounts.clone(),
        ));
        WorkloadRunner {
            stop,
            runs,
            mounts,
            task: Some(task),
        }
    }

    /// The init container runs that ended so far.
    pub fn runs(&self) -> Vec<InitRun> {
        self.runs.lock().expect("not poisoned").clone()
    }

    /// Where `pod`'s `claim` is mounted, once it is.
    pub fn mount_of(&self, pod: &str, claim: &str) -> Option<PathBuf> {
        self.mounts
            .lock()
            .expect("not poisoned")
            .get(&(pod.to_string(), claim.to_string()))
            .cloned()
    }
}

impl Drop for WorkloadRunner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn run(
    client: Client,
    namespace: String,
    kubelet: Arc<FakeKubelet>,
    stop: Arc<AtomicBool>,
    runs: Arc<Mutex<Vec<InitRun>>>,
    mounts: Arc<Mutex<BTreeMap<(String, String), PathBuf>>>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let mut seen = BTreeSet::new();
    let mut running: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let listed = pods
            .list(&ListParams::default().labels(&format!("!{}", custody_proto::names::LABEL_ROLE)))
            .await
            .map(|list| list.items)
            .unwrap_or_default();
        for pod in listed {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let on_node = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
                == Some(kubelet.node.as_str());
            if !on_node {
                continue;
            }
            if pod.metadata.deletion_timestamp.is_some() {
                if let Some(task) = running.remove(&uid) {
                    task.abort();
                }
                let name = pod.name_any();
                let targets: Vec<PathBuf> = {
                    let mut mounts = mounts.lock().expect("not poisoned");
                    let targets = mounts
                        .iter()
                        .filter(|((pod, _), _)| *pod == name)
                        .map(|(_, path)| path.clone())
                        .collect();
                    mounts.retain(|(pod, _), _| *pod != name);
                    targets
                };
                for target in targets {
                    kubelet.unbind(&target);
                }
                finish_deletion(&pods, &pod).await;
                seen.insert(uid);
                continue;
            }
            if !seen.insert(uid.clone()) {
                continue;
            }
            let task = tokio::spawn(run_pod(
                client.clone(),
                pods.clone(),
                kubelet.clone(),
                pod,
                runs.clone(),
                mounts.clone(),
            ));
            running.insert(uid, task);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn patch_status(pods: &Api<Pod>, name: &str, status: serde_json::Value) {
    // Strategic merge: conditions merge by type, so the readiness gate condition the
    // controller sets is kept.
    if let Err(error) = pods
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"status": status})),
        )
        .await
    {
        eprintln!("[kubelet] status of {name}: {error}");
    }
}

fn condition(type_: &str, status: bool) -> serde_json::Value {
    serde_json::json!({
        "type": type_,
        "status": if status { "True" } else { "False" },
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    })
}

async fn run_pod(
    client: Client,
    pods: Api<Pod>,
    kubelet: Arc<FakeKubelet>,
    pod: Pod,
    runs: Arc<Mutex<Vec<InitRun>>>,
    mounts: Arc<Mutex<BTreeMap<(String, String), PathBuf>>>,
) {
    let name = pod.name_any();
    let namespace = pod.namespace().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();

    // Volumes first: a claim's PersistentVolume under pods/<uid>/volumes/<plugin>/<pv-name>.
    for volume in spec.volumes.iter().flatten() {
        let Some(source) = &volume.persistent_volume_claim else {
            continue;
        };
        let claim = source.claim_name.clone();
        let (persistent_volume, path) = loop {
            let bound = bound_volume(&client, &namespace, &claim).await;
            let path = claim_path(&client, &namespace, &claim).await;
            if let (Some(bound), Some(path)) = (bound, path) {
                break (bound, path);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let target = kubelet.local_volume_path(&uid, &persistent_volume);
        kubelet.bind(&path, &target);
        mounts
            .lock()
            .expect("not poisoned")
            .insert((name.clone(), claim), target);
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    patch_status(
        &pods,
        &name,
        serde_json::json!({
            "phase": "Pending",
            "hostIP": kubelet.ip,
            "hostIPs": [{"ip": kubelet.ip}],
            "podIP": kubelet.ip,
            "startTime": now,
            "conditions": [condition("Initialized", false), condition("ContainersReady", false), condition("Ready", false)],
            "initContainerStatuses": spec.init_containers.iter().flatten().map(|container| serde_json::json!({
                "name": container.name, "image": container.image.clone().unwrap_or_default(),
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })).collect::<Vec<_>>(),
        }),
    )
    .await;

    // Projected volumes, written as the kubelet writes them.
    let files = tempfile::tempdir().expect("projected volumes");
    let mut volume_dirs: BTreeMap<String, PathBuf> = BTreeMap::new();
    for volume in spec.volumes.iter().flatten() {
        let Some(projected) = &volume.projected else {
            continue;
        };
        let dir = files.path().join(&volume.name);
        std::fs::create_dir_all(&dir).expect("projected volume dir");
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let account = spec
                    .service_account_name
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let token_text = request_token(
                    &client,
                    &namespace,
                    &account,
                    token.audience.as_deref().unwrap_or_default(),
                    Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(name.clone()),
                        uid: Some(uid.clone()),
                    }),
                )
                .await;
                std::fs::write(dir.join(&token.path), token_text).expect("token file");
            }
            if let Some(config_map) = &source.config_map {
                let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                let data = loop {
                    match config_maps.get_opt(&config_map.name).await {
                        Ok(Some(found)) => break found.data.unwrap_or_default(),
                        _ => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                };
                for item in config_map.items.iter().flatten() {
                    if let Some(value) = data.get(&item.key) {
                        std::fs::write(dir.join(&item.path), value).expect("configMap file");
                    }
                }
            }
        }
        volume_dirs.insert(volume.name.clone(), dir);
    }

    for container in spec.init_containers.iter().flatten() {
        loop {
            let (code, output) = run_init(container, &kubelet, &volume_dirs).await;
            runs.lock().expect("not poisoned").push(InitRun {
                pod: name.clone(),
                ended: std::time::Instant::now(),
                container: container.name.clone(),
                exit_code: code,
                output,
            });
            if code == 0 {
                break;
            }
            // restartPolicy Always: the kubelet runs a failed init container again.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    // Running; Ready follows the readiness gates.
    let gates: Vec<String> = spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|gate| gate.condition_type.clone())
        .collect();
    let containers: Vec<serde_json::Value> = spec
        .containers
        .iter()
        .map(|container| {
            serde_json::json!({
                "name": container.name, "image": container.image.clone().unwrap_or_default(),
                "imageID": "", "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": k8s_openapi::jiff::Timestamp::now().to_string()}},
            })
        })
        .collect();
    patch_status(
        &pods,
        &name,
        serde_json::json!({
            "phase": "Running",
            "containerStatuses": containers,
            "conditions": [condition("Initialized", true), condition("ContainersReady", true)],
            "initContainerStatuses": spec.init_containers.iter().flatten().map(|container| serde_json::json!({
                "name": container.name, "image": container.image.clone().unwrap_or_default(),
                "imageID": "", "ready": true, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            })).collect::<Vec<_>>(),
        }),
    )
    .await;
    let mut ready = None;
    loop {
        let Ok(Some(current)) = pods.get_opt(&name).await else {
            return;
        };
        let conditions = current
            .status
            .as_ref()
            .and_then(|status| status.conditions.clone())
            .unwrap_or_default();
        let all_gates = gates.iter().all(|gate| {
            conditions
                .iter()
                .any(|condition| &condition.type_ == gate && condition.status == "True")
        });
        if ready != Some(all_gates) {
            patch_status(
                &pods,
                &name,
                serde_json::json!({"conditions": [condition("Ready", all_gates)]}),
            )
            .await;
            ready = Some(all_gates);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Runs one init container: the workspace binary its command names, with its environment
/// resolved and its volume mounts mapped to the directories written for them. A container
/// whose program is not a workspace binary succeeds at once (its image cannot run here).
async fn run_init(
    container: &Container,
    kubelet: &FakeKubelet,
    volume_dirs: &BTreeMap<String, PathBuf>,
) -> (i32, String) {
    let program = container.command.clone().unwrap_or_default();
    let Some(first) = program.first() else {
        return (0, String::new());
    };
    let binary = crate::binary(first);
    if !binary.exists() {
        return (
            0,
            format!("{first}: not a workspace binary; treated as done"),
        );
    }
    let mut env: Vec<(String, String)> = Vec::new();
    for variable in container.env.iter().flatten() {
        let value = match (&variable.value, &variable.value_from) {
            (Some(value), _) => {
                // $(VAR) references to variables defined before, as the kubelet expands them.
                let mut value = value.clone();
                for (name, resolved) in &env {
                    value = value.replace(&format!("$({name})"), resolved);
                }
                value
            }
            (None, Some(from)) => match from
                .field_ref
                .as_ref()
                .map(|field| field.field_path.as_str())
            {
                Some("status.hostIP") | Some("status.podIP") => kubelet.ip.clone(),
                Some("spec.nodeName") => kubelet.node.clone(),
                _ => String::new(),
            },
            _ => String::new(),
        };
        env.push((variable.name.clone(), value));
    }
    // Paths under a mount point point into the directory written for that volume.
    let map = |value: &str| -> String {
        for mount in container.volume_mounts.iter().flatten() {
            if let Some(rest) = value.strip_prefix(&mount.mount_path)
                && let Some(dir) = volume_dirs.get(&mount.name)
            {
                return format!("{}{rest}", dir.display());
            }
        }
        value.to_string()
    };
    let env: Vec<(String, String)> = env
        .into_iter()
        .map(|(name, value)| (name, map(&value)))
        .collect();
    let args: Vec<String> = program
        .iter()
        .skip(1)
        .chain(container.args.iter().flatten())
        .map(|argument| map(argument))
        .collect();
    let output = tokio::process::Command::new(&binary)
        .kill_on_drop(true)
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .output()
        .await;
    match output {
        Ok(output) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            (output.status.code().unwrap_or(128), text)
        }
        Err(error) => (127, error.to_string()),
    }
}
