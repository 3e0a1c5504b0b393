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
