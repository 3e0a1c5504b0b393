//! Issue 25 item 2, `kubectl custody` against the real API server: `status`, `backup` (now and
//! from a plan), `restore` (into a new Cluster, into an existing one, refused with a way out),
//! `why`, `nodes`, `-o json|yaml` and completions. No controller runs in these namespaces: the
//! statuses are written here, so what the plugin prints is what was written.

use std::process::Command;

use custody_kube::api::{Backup, BackupPlan, Cluster, NodeAgent, Restore};
use custody_tests::scenario::create;
use custody_tests::{TestNamespace, binary, control_plane};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Runs `kubectl-custody ARGS` against the control plane: (exit success, stdout, stderr).
fn custody(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(binary("kubectl-custody"))
        .arg(format!("--kubeconfig={}", control_plane().display()))
        .args(args)
        .output()
        .expect("running kubectl-custody");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn set_status<K>(api: &Api<K>, name: &str, status: serde_json::Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .expect("status written");
}

fn ready(status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-12-01T10:00:00Z"})
}

async fn cluster(namespace: &TestNamespace, name: &str) {
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": name},
               "spec": {"statefulSetRef": {"name": name}, "volumeClaimTemplates": ["data", "wal"]}}),
    )
    .await;
}

async fn backup(namespace: &TestNamespace, name: &str, cluster: &str, status: serde_json::Value) {
    let api: Api<Backup> = namespace.api();
    create::<Backup>(
        &api,
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": name}, "spec": {"clusterRef": {"name": cluster}}}),
    )
    .await;
    set_status(&api, name, status).await;
}

#[tokio::test]
async fn kubectl_custody_status_shows_each_clusters_backups_restores_and_silent_agents() {
    control_plane();
    let namespace = TestNamespace::create("kc-status").await;
    let ns = namespace.name.clone();
    cluster(&namespace, "orders").await;
    backup(
        &namespace,
        "monday",
        "orders",
        json!({"phase": "Completed", "completionTime": "2026-12-01T10:00:00Z",
               "conditions": [ready("True", "Completed", "")]}),
    )
    .await;
    // Created after monday, so the newer one.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    backup(
        &namespace,
        "tuesday",
        "orders",
        json!({"phase": "Failed", "conditions": [ready("False", "ToolFailed", "pg_basebackup exited 1")]}),
    )
    .await;
    let restores: Api<Restore> = namespace.api();
    create::<Restore>(
        &restores,
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore",
               "metadata": {"name": "back"},
               "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "monday"}}}),
    )
    .await;
    set_status(
        &restores,
        "back",
        json!({"phase": "Running", "conditions": [ready("False", "Verifying", "1 of 2 verified")],
               "volumes": [{"claimName": "data-orders-0", "state": "Verified", "attempts": 1},
                           {"claimName": "wal-orders-0", "state": "Verifying", "attempts": 1}]}),
    )
    .await;
    let (ok, out, err) = custody(&["status", "-n", &ns]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|line| line.contains("orders"))
        .unwrap_or_else(|| panic!("no line for orders:\n{out}"));
    for part in [
        &ns as &str,
        "monday (",
        "tuesday",
        "ToolFailed",
        "back Running (Verifying) 1/2 volumes verified",
    ] {
        assert!(line.contains(part), "{part} not in {line:?}\n{out}");
    }
    assert!(out.starts_with("NAMESPACE"), "{out}");
    assert!(out.contains("Node agents:"), "{out}");
    // The same as JSON, for programs.
    let (ok, out, err) = custody(&["status", "-n", &ns, "-o", "json", "orders"]);
    assert!(ok, "{err}");
    let parsed: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(parsed["clusters"][0]["lastSuccess"]["name"], "monday");
    assert_eq!(parsed["clusters"][0]["lastBackup"]["reason"], "ToolFailed");
    assert_eq!(parsed["clusters"][0]["restoring"][0]["name"], "back");
    let (ok, out, _) = custody(&["status", "-n", &ns, "-o", "yaml"]);
    assert!(ok && out.contains("lastSuccess:"), "{out}");
    // A Cluster that is not there is said so.
    let (ok, _, err) = custody(&["status", "-n", &ns, "nothing"]);
    assert!(!ok && err.contains("no Cluster nothing"), "{err}");
}

#[tokio::test]
async fn kubectl_custody_backup_makes_a_backup_now_or_as_a_plans_run() {
    control_plane();
    let namespace = TestNamespace::create("kc-backup").await;
    let ns = namespace.name.clone();
    cluster(&namespace, "orders").await;
    let (ok, out, err) = custody(&["backup", "orders", "-n", &ns, "--name", "now"]);
    assert!(ok, "{err}");
    assert!(out.contains("backup.custody.io/now created"), "{out}");
    let backups: Api<Backup> = namespace.api();
    let now = backups.get("now").await.expect("the Backup");
    assert_eq!(now.spec.cluster_ref.name, "orders");
    // From a plan: its repository and consistency, its labels (its retention counts it).
    let plan = create::<BackupPlan>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan",
               "metadata": {"name": "nightly"},
               "spec": {"clusterRef": {"name": "orders"}, "schedule": "0 1 * * *",
                        "repositoryRef": {"name": "vault"}, "consistency": {"method": "Freeze"}}}),
    )
    .await;
    let (ok, out, err) = custody(&["backup", "--plan", "nightly", "-n", &ns]);
    assert!(ok, "{err}");
    let name = out
        .split_whitespace()
        .next()
        .and_then(|word| word.strip_prefix("backup.custody.io/"))
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    assert!(name.starts_with("orders-"), "{name}");
    let made = backups.get(&name).await.unwrap();
    let labels = made.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get(custody_proto::names::LABEL_PLAN)
            .map(String::as_str),
        Some("nightly")
    );
    assert_eq!(
        labels.get(custody_proto::names::LABEL_PLAN_UID),
        plan.metadata.uid.as_ref()
    );
    assert_eq!(made.spec.repository_ref.unwrap().name, "vault");
    assert!(made.spec.consistency.is_some());
    // Refused, saying why.
    let (ok, _, err) = custody(&["backup", "missing", "-n", &ns]);
    assert!(!ok && err.contains("no Cluster missing"), "{err}");
    let (ok, _, err) = custody(&["backup", "users", "--plan", "nightly", "-n", &ns]);
    assert!(
        !ok && err.contains("backs up Cluster orders, not users"),
        "{err}"
    );
}

#[tokio::test]
async fn kubectl_custody_restore_makes_a_cluster_or_a_restore_and_says_how_to_cross_namespaces() {
    control_plane();
    let namespace = TestNamespace::create("kc-restore").await;
    let other = TestNamespace::create("kc-restore-other").await;
    let ns = namespace.name.clone();
    cluster(&namespace, "orders").await;
    backup(
        &namespace,
        "monday",
        "orders",
        json!({"phase": "Completed", "completionTime": "2026-12-01T10:00:00Z"}),
    )
    .await;
    backup(&namespace, "running", "orders", json!({"phase": "Running"})).await;
    // A new Cluster: the source's templates, its own StatefulSet, spec.restore.
    let (ok, out, err) = custody(&["restore", "monday", "--to", "copy", "-n", &ns]);
    assert!(ok, "{err}");
    assert!(out.contains("cluster.custody.io/copy created"), "{out}");
    let copy = namespace.api::<Cluster>().get("copy").await.unwrap();
    let spec = serde_json::to_value(&copy.spec).unwrap();
    assert_eq!(spec["statefulSetRef"]["name"], "copy");
    assert_eq!(spec["volumeClaimTemplates"], json!(["data", "wal"]));
    assert_eq!(spec["restore"]["backupRef"]["name"], "monday");
    // An existing Cluster: a Restore.
    let (ok, out, err) = custody(&["restore", "monday", "--to", "orders", "-n", &ns]);
    assert!(ok, "{err}");
    assert!(
        out.contains("restore.custody.io/orders-from-monday created"),
        "{out}"
    );
    let restore = namespace
        .api::<Restore>()
        .get("orders-from-monday")
        .await
        .unwrap();
    assert_eq!(restore.spec.backup_ref.name, "monday");
    // Refused: not completed; in another namespace (with the way across); unknown.
    let (ok, _, err) = custody(&["restore", "running", "--to", "x", "-n", &ns]);
    assert!(!ok && err.contains("is Running, not Completed"), "{err}");
    let (ok, _, err) = custody(&["restore", "monday", "--to", "x", "-n", &other.name]);
    assert!(!ok, "{err}");
    // (Other runs' namespaces may hold a Backup monday too: each is named.)
    assert!(
        err.contains("Backup monday is in namespace")
            && err.contains(&ns)
            && err.contains(&format!("not {}", other.name))
            && err.contains("importSnapshots"),
        "{err}"
    );
    let (ok, _, err) = custody(&["restore", "nothing", "--to", "x", "-n", &ns]);
    assert!(!ok && err.contains("no Backup nothing"), "{err}");
}

#[tokio::test]
async fn kubectl_custody_why_and_nodes_say_what_holds_a_pod_and_which_agents_report() {
    control_plane();
    let namespace = TestNamespace::create("kc-why").await;
    let ns = namespace.name.clone();
    cluster(&namespace, "shop").await;
    // A pod as the gate leaves it: custody-wait first (no node runs it here).
    let node = format!("kc-node-{}", &ns[ns.len() - 8..]);
    create::<Pod>(
        &namespace.api(),
        json!({"metadata": {"name": "shop-0"},
               "spec": {"nodeName": node,
                        "initContainers": [{"name": "custody-wait", "image": "custody-agent"}],
                        "containers": [{"name": "db", "image": "postgres"}],
                        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-shop-0"}},
                                    {"name": "wal", "persistentVolumeClaim": {"claimName": "wal-shop-0"}}]}}),
    )
    .await;
    let restores: Api<Restore> = namespace.api();
    create::<Restore>(
        &restores,
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore",
               "metadata": {"name": "shop"},
               "spec": {"clusterRef": {"name": "shop"}, "backupRef": {"name": "monday"}}}),
    )
    .await;
    set_status(
        &restores,
        "shop",
        json!({"phase": "Running",
               "conditions": [ready("False", "Verifying", "waiting for the agent on node x")],
               "volumes": [
                   {"claimName": "data-shop-0", "state": "Failed", "attempts": 2, "nodeName": node,
                    "reason": "ContentMismatch", "message": "base/1/1259 differs from the manifest"},
                   {"claimName": "wal-shop-0", "state": "Verified", "attempts": 1, "nodeName": node}]}),
    )
    .await;
    let (ok, out, err) = custody(&["why", "shop-0", "-n", &ns]);
    assert!(ok, "{err}");
    for part in [
        &format!(
            "Pod {ns}/shop-0 on node {node}: held by custody-wait until its volume is verified: data-shop-0 Failed (ContentMismatch)"
        ) as &str,
        "Restore shop: Running (Verifying), 1/2 volumes verified",
        "waiting for the agent on node x",
        "data-shop-0: base/1/1259 differs from the manifest",
        "Last lines of custody-wait:",
    ] {
        assert!(out.contains(part), "{part:?} not in:\n{out}");
    }
    let (ok, out, _) = custody(&["why", "shop-0", "-n", &ns, "-o", "json"]);
    assert!(ok);
    let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed["volumes"][0]["reason"], "ContentMismatch");
    let (ok, _, err) = custody(&["why", "nobody", "-n", &ns]);
    assert!(!ok && err.contains("no pod nobody"), "{err}");

    // Nodes: a silent agent says so, with its reason.
    let agents: Api<NodeAgent> = Api::all(custody_tests::client().await);
    let _ = agents.delete(&node, &Default::default()).await;
    create::<NodeAgent>(
        &agents,
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "NodeAgent",
               "metadata": {"name": node}, "spec": {"nodeName": node}}),
    )
    .await;
    set_status(
        &agents,
        &node,
        json!({"conditions": [ready("False", "HeartbeatMissed", "no report")],
               "lastHeartbeatTime": "2026-12-01T10:00:00Z", "agentVersion": "0.1.0",
               "clockOffset": "+2.0ms"}),
    )
    .await;
    let (ok, out, err) = custody(&["nodes"]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|line| line.starts_with(&node))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("False (HeartbeatMissed)")
            && line.contains("+2.0ms")
            && line.contains("0.1.0"),
        "{line}"
    );
    let (ok, out, _) = custody(&["status", "-n", &ns]);
    assert!(
        ok && out.contains(&format!("{node} (HeartbeatMissed)")),
        "{out}"
    );
    agents.delete(&node, &Default::default()).await.unwrap();

    // Completions for the shells.
    for shell in ["bash", "zsh", "fish"] {
        let (ok, out, _) = custody(&["completion", shell]);
        assert!(
            ok && out.contains("kubectl-custody") && out.contains("restore"),
            "{shell}"
        );
    }
}
