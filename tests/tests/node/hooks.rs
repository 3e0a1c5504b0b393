//! The Hooks method on a real PostgreSQL: pre and post hooks in the application pod around the copy.

use super::*;
use crate::freeze::backup_fails;
use crate::postgres::{Stage, finish_postgres, postgres_source};

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
pub(crate) const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// pgbench from the host against `ip`, four clients, in runs of ten seconds until `stop`, each
/// transaction's latency logged under `dir`.
pub(crate) struct Latencies {
    pub(crate) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(crate) runs: std::thread::JoinHandle<()>,
    pub(crate) dir: std::path::PathBuf,
}

impl Latencies {
    pub(crate) fn start(ip: &str, dir: &Path, seconds: Option<u32>) -> Latencies {
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
    pub(crate) async fn finish(self) -> (usize, Duration) {
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
