//! Test harness: a real local control plane (etcd + kube-apiserver + kube-controller-manager
//! started by `hack/cluster-up.sh`), custody's CRDs installed from `deploy/crds/`, a fresh
//! namespace per test, and waiting helpers that say what they last saw when they time out.

pub mod agent;
pub mod databases;
pub mod kubelet;
pub mod node;
pub mod oidc;
pub mod pki;
pub mod repository;
pub mod s3;
pub mod scenario;
pub mod volumes;
pub mod workloads;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::conditions::is_crd_established;
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Starts the control plane (or finds it running) and installs the CRDs, once per test
/// process. Returns the kubeconfig path.
pub fn control_plane() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        let output = Command::new(repo_root().join("hack/cluster-up.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running hack/cluster-up.sh");
        assert!(output.status.success(), "hack/cluster-up.sh failed");
        let stdout = String::from_utf8(output.stdout).expect("utf-8 kubeconfig path");
        let kubeconfig = PathBuf::from(stdout.lines().last().expect("kubeconfig path").trim());
        // The CRDs are installed from their own runtime: a kube Client must not outlive the
        // runtime it was created on, and each #[tokio::test] has its own.
        let path = kubeconfig.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(install_crds(&path))
        })
        .join()
        .expect("installing CRDs");
        kubeconfig
    })
}

/// A client for the local control plane.
pub async fn client() -> Client {
    client_from(control_plane()).await
}

/// A client for the kubeconfig at `kubeconfig`.
pub async fn client_from(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("reading kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// A client that authenticates as ServiceAccount `account` of `namespace` (created here,
/// with a Role of `rules` bound to it): a tenant with only the rights a test gives it.
pub async fn tenant(namespace: &TestNamespace, account: &str, rules: serde_json::Value) -> Client {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let ns = &namespace.name;
    let accounts: Api<ServiceAccount> = namespace.api();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": account}}))
                .expect("ServiceAccount"),
        )
        .await
        .expect("creating the tenant's ServiceAccount");
    let roles: Api<Role> = namespace.api();
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                serde_json::json!({"metadata": {"name": account}, "rules": rules}),
            )
            .expect("Role"),
        )
        .await
        .expect("creating the tenant's Role");
    let bindings: Api<RoleBinding> = namespace.api();
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": account},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
            }))
            .expect("RoleBinding"),
        )
        .await
        .expect("binding the tenant's Role");
    let token = kubelet::request_token(
        &namespace.client,
        ns,
        account,
        "https://kubernetes.default.svc",
        None,
    )
    .await;
    let kubeconfig = Kubeconfig::read_from(control_plane()).expect("reading kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..kube::config::AuthInfo::default()
    };
    Client::try_from(config).expect("tenant client")
}

async fn install_crds(kubeconfig: &Path) {
    let api: Api<CustomResourceDefinition> = Api::all(client_from(kubeconfig).await);
    for crd in committed_crds() {
        let name = crd.metadata.name.clone().expect("CRD name");
        api.patch(
            &name,
            &PatchParams::apply("custody-installer").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|error| panic!("applying CRD {name}: {error}"));
        let established = tokio::time::timeout(
            Duration::from_secs(30),
            kube::runtime::wait::await_condition(api.clone(), &name, is_crd_established()),
        )
        .await;
        assert!(
            matches!(established, Ok(Ok(Some(_)))),
            "CRD {name} not Established: {established:?}"
        );
    }
}

/// The CRDs committed under `deploy/crds/`.
pub fn committed_crds() -> Vec<CustomResourceDefinition> {
    let dir = repo_root().join("deploy/crds");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "yaml")
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).expect("reading CRD");
            serde_yaml::from_str(&text)
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        })
        .collect()
}

/// A namespace of its own for one test, deleted when the test calls [`TestNamespace::delete`].
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

impl TestNamespace {
    /// Creates `custody-<prefix>-<random>`.
    pub async fn create(prefix: &str) -> TestNamespace {
        let client = client().await;
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .subsec_nanos();
        let unique =
            nanos ^ std::process::id().rotate_left(16) ^ COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("custody-{prefix}-{unique:08x}");
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "custody.io/test": "true" } }
        }))
        .expect("namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|error| panic!("creating namespace {name}: {error}"));
        TestNamespace { client, name }
    }

    /// An API for a namespaced kind in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes what is in the namespace and waits until custody has released it, then deletes
    /// the namespace. Call it while the controller still runs: custody's finalizers are its to
    /// remove, and one it fails to release fails the test, naming it.
    ///
    /// custody's objects, the workloads, their pods and claims are deleted first, all at once as
    /// the namespace controller would, and waited for (confirming pods' deletion as their
    /// (fake) kubelets would). The namespace itself is then left to the namespace controller,
    /// not waited for: nothing in it holds a finalizer any more, and the namespace controller
    /// starts only 5 s after the deletion. Deleted with the namespace, custody's objects were
    /// the namespace controller's too, and finding any still held by a finalizer or a pod's
    /// grace period, it looked again only 8 to 16 s later (its estimate, 15 s or the grace period, halved, plus
    /// one): a teardown took about 10 s of a restore test's 19, now 0.4-0.6 s. The tests of a
    /// namespace's deletion itself use [`TestNamespace::delete_whole`].
    pub async fn delete(self) {
        self.delete_contents().await;
        match Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::background())
            .await
        {
            // A test of a namespace's deletion deleted it already.
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => panic!("deleting namespace {}: {error}", self.name),
        }
    }

    /// Deletes the namespace with everything in it, as a user would, and waits until it is
    /// gone, confirming its pods' deletion as their (fake) kubelets would: custody's objects
    /// are then deleted by the namespace controller, in a namespace that is terminating (what
    /// a test of that wants; [`TestNamespace::delete`] is quicker). A namespace left
    /// `Terminating` is a finalizer custody failed to release (the failure names it).
    pub async fn delete_whole(self) {
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let pods: Api<k8s_openapi::api::core::v1::Pod> = self.api();
        let backups: Api<custody_kube::api::Backup> = self.api();
        let _ = namespaces
            .delete(&self.name, &DeleteParams::background())
            .await;
        eventually(
            &format!("namespace {} gone", self.name),
            Duration::from_secs(180),
            || {
                let (namespaces, pods, backups, name) = (
                    namespaces.clone(),
                    pods.clone(),
                    backups.clone(),
                    self.name.clone(),
                );
                async move {
                    finish_pod_deletions(&pods).await;
                    match namespaces
                        .get_opt(&name)
                        .await
                        .map_err(|error| error.to_string())?
                    {
                        None => Ok(()),
                        Some(namespace) => Err(format!(
                            "{:?}; {}",
                            namespace
                                .status
                                .and_then(|status| status.conditions)
                                .unwrap_or_default()
                                .into_iter()
                                .filter(|condition| condition.status == "True")
                                .map(|condition| condition.message.unwrap_or_default())
                                .collect::<Vec<_>>(),
                            remaining_backups(&backups).await
                        )),
                    }
                }
            },
        )
        .await;
    }

    /// Deletes custody's objects, the workloads, pods and claims in the namespace, all at once as
    /// the namespace controller would, and waits until they are gone and no Secret keeps a
    /// custody finalizer, confirming pods' deletion as their (fake) kubelets would.
    async fn delete_contents(&self) {
        use custody_kube::api::{Backup, BackupPlan, BackupRepository, Cluster, Restore};
        use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
        use k8s_openapi::api::batch::v1::Job;
        use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
        use kube::core::ApiResource;
        let deleted = [
            ApiResource::erase::<Restore>(&()),
            ApiResource::erase::<Backup>(&()),
            ApiResource::erase::<BackupPlan>(&()),
            ApiResource::erase::<Cluster>(&()),
            ApiResource::erase::<BackupRepository>(&()),
            ApiResource::erase::<StatefulSet>(&()),
            ApiResource::erase::<Deployment>(&()),
            ApiResource::erase::<Job>(&()),
            ApiResource::erase::<Pod>(&()),
            ApiResource::erase::<PersistentVolumeClaim>(&()),
        ];
        let secrets = ApiResource::erase::<Secret>(&());
        for resource in &deleted {
            let _ = self
                .dynamic_api(resource)
                .delete_collection(&DeleteParams::background(), &Default::default())
                .await;
        }
        let pods: Api<Pod> = self.api();
        eventually(
            &format!(
                "custody's objects, workloads, pods and claims in {} gone",
                self.name
            ),
            Duration::from_secs(180),
            || async {
                finish_pod_deletions(&pods).await;
                let mut remaining = Vec::new();
                for resource in &deleted {
                    remaining.extend(self.remaining(resource, None).await?);
                }
                remaining.extend(self.remaining(&secrets, Some("custody.io/")).await?);
                if remaining.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "{}; {}",
                        remaining.join(", "),
                        remaining_backups(&self.api()).await
                    ))
                }
            },
        )
        .await;
    }

    /// An API for the objects of `resource` in this namespace, whatever their kind.
    fn dynamic_api(&self, resource: &kube::core::ApiResource) -> Api<kube::core::DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.name, resource)
    }

    /// The objects of `resource` still here, each as `Kind/name [finalizers]`; with `held_by`,
    /// only those with a finalizer starting with it.
    async fn remaining(
        &self,
        resource: &kube::core::ApiResource,
        held_by: Option<&str>,
    ) -> Result<Vec<String>, String> {
        let listed = self
            .dynamic_api(resource)
            .list(&Default::default())
            .await
            .map_err(|error| format!("listing {}: {error}", resource.kind))?;
        Ok(listed
            .items
            .iter()
            .filter(|object| {
                held_by.is_none_or(|prefix| {
                    let finalizers = object.meta().finalizers.as_deref().unwrap_or_default();
                    finalizers
                        .iter()
                        .any(|finalizer| finalizer.starts_with(prefix))
                })
            })
            .map(|object| {
                format!(
                    "{}/{} {:?}",
                    resource.kind,
                    object.meta().name.as_deref().unwrap_or_default(),
                    object.meta().finalizers.as_deref().unwrap_or_default()
                )
            })
            .collect())
    }
}

/// Confirms the deletion of every pod of `pods` being deleted, as its (fake) kubelet would.
async fn finish_pod_deletions(pods: &Api<k8s_openapi::api::core::v1::Pod>) {
    for pod in pods
        .list(&Default::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default()
    {
        if pod.metadata.deletion_timestamp.is_some() {
            kubelet::finish_deletion(pods, &pod).await;
        }
    }
}

/// The Backups still in a namespace being deleted, with what holds them: their finalizers,
/// cleanup status and conditions (what a timed-out teardown reports).
pub async fn remaining_backups(backups: &Api<custody_kube::api::Backup>) -> String {
    match backups.list(&Default::default()).await {
        Ok(list) => list
            .items
            .iter()
            .map(|backup| {
                let status = backup.status.as_ref();
                format!(
                    "Backup {} finalizers {:?} cleanup {:?} conditions {:?}",
                    backup.metadata.name.as_deref().unwrap_or_default(),
                    backup.metadata.finalizers,
                    status.and_then(|status| status.cleanup.as_ref()),
                    status.map(|status| status
                        .conditions
                        .iter()
                        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>())
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(error) => format!("Backups not listed: {error}"),
    }
}

/// Polls `get` until `done` holds, or fails after `timeout` with what it last saw.
pub async fn await_condition<K, F>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    done: F,
) -> K
where
    K: Clone + Debug + DeserializeOwned + Resource,
    F: Fn(&K) -> bool,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last_seen = match api.get_opt(name).await {
            Ok(Some(object)) => {
                if done(&object) {
                    return object;
                }
                format!("{object:#?}")
            }
            Ok(None) => format!("{name} does not exist"),
            Err(error) => format!("error: {error}"),
        };
        if Instant::now() > deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what} on {name}; last saw:\n{last_seen}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first Event in `namespace` that `wanted` accepts, waited for.
pub async fn event_where(
    namespace: &TestNamespace,
    what: &str,
    wanted: impl Fn(&k8s_openapi::api::core::v1::Event) -> bool,
) -> k8s_openapi::api::core::v1::Event {
    let events = namespace.api::<k8s_openapi::api::core::v1::Event>();
    let wanted = &wanted;
    eventually(what, Duration::from_secs(90), || {
        let events = events.clone();
        async move {
            events
                .list(&Default::default())
                .await
                .map_err(|error| error.to_string())?
                .items
                .into_iter()
                .find(|event| wanted(event))
                .ok_or_else(|| "none yet".to_string())
        }
    })
    .await
}

/// Polls an async check until it returns `Some`, or fails after `timeout` with the last
/// description it gave.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last_seen) if Instant::now() > deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last saw: {last_seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The kubectl built with the control plane.
pub fn kubectl_path() -> PathBuf {
    let version = std::env::var("CUSTODY_KUBE_VERSION").unwrap_or_else(|_| "v1.36.3".into());
    let cache = std::env::var("CUSTODY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/custody")
        });
    cache.join(format!("bin/kubectl-{version}"))
}

/// Runs `command` to its end and returns its standard output; panics naming the command and
/// what it printed when it fails.
pub fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("running {command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs the kubectl built with the control plane against it.
pub fn kubectl(args: &[&str]) -> Output {
    let kubectl = kubectl_path();
    Command::new(&kubectl)
        .arg(format!("--kubeconfig={}", control_plane().display()))
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {}: {error}", kubectl.display()))
}

/// A workspace binary built by `cargo build` (the README's test command builds them first):
/// next to the running executable (a binary) or one level up (a test in `deps/`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable directory");
    let candidates = [dir.join(name), dir.parent().expect("target dir").join(name)];
    candidates
        .iter()
        .find(|path| path.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{} not built: run `cargo build --workspace --bins` first",
                candidates[1].display()
            )
        })
}

/// The program a pod's command names, as the kubelet would run it: an absolute path as it is,
/// a workspace binary when there is one of that name, otherwise the name (found on `PATH`).
pub fn program(name: &str) -> PathBuf {
    let path = Path::new(name);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable directory");
    [dir.join(name), dir.parent().expect("target dir").join(name)]
        .into_iter()
        .find(|candidate| candidate.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A child process killed when dropped, so a failing test leaves nothing running.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    /// Sends SIGTERM and waits up to `timeout` for the process to exit; returns its status.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.0.as_mut()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.0 = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free TCP port on loopback, never one this process was handed before: a port a stopped
/// process listened on is free again, and a test that restarts a process with its old ports
/// and one new port must not get an old one as the new (a restarted controller once got its
/// own webhook's port for its metrics, and never became ready).
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().expect("not poisoned");
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("binding a free port")
            .port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// The peak resident memory of process `pid` (`VmHWM`), in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("/proc status")
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}
