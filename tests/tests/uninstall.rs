//! Issue 23, uninstall, against the real API server: `custody-controller uninstall` deletes
//! custody's webhook configurations, scales its Deployment to zero, removes custody's
//! finalizers (and only custody's) from Backups, Restores, Clusters and the credentials
//! Secrets it marked, names the pods still held by `custody-wait`, and the namespace can then
//! be deleted. The Helm chart runs the same command as a pre-delete hook (the real-node tier
//! checks `helm uninstall`).

use std::process::Command;

use custody_kube::api::{Backup, BackupRepository, Cluster, Restore};
use custody_tests::scenario::create;
use custody_tests::{TestNamespace, binary, control_plane};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Sets `metadata.finalizers` of `name` as if custody (and another owner) had.
async fn finalize<K>(api: &Api<K>, name: &str, finalizers: &[&str])
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
    )
    .await
    .unwrap_or_else(|error| panic!("finalizers of {name}: {error}"));
}

#[tokio::test]
async fn uninstall_removes_custodys_finalizers_and_webhooks_and_nothing_else() {
    let namespace = TestNamespace::create("uninstall").await;
    let ns = namespace.name.clone();
    let client = namespace.client.clone();

    // What an install and its use leave: a controller Deployment, a credentials Secret a
    // Backup holds, a Restore and a Cluster under protection, a pod held in Init.
    create::<Deployment>(
        &namespace.api(),
        json!({"metadata": {"name": "custody-controller"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "custody-under-test"}},
                        "template": {"metadata": {"labels": {"app": "custody-under-test"}},
                                     "spec": {"nodeSelector": {"custody.io/no-such-node": "true"},
                                              "containers": [{"name": "c", "image": "custody-controller:test"}]}}}}),
    )
    .await;
    create::<Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "s3", "finalizers": ["custody.io/artifact-credentials"]},
               "stringData": {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}}),
    )
    .await;
    create::<Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "unrelated", "finalizers": ["example.com/keep"]}}),
    )
    .await;
    create::<BackupRepository>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
               "metadata": {"name": "store"},
               "spec": {"endpoint": "http://127.0.0.1:1", "bucket": "bkt",
                        "credentialsSecretRef": {"name": "s3"}}}),
    )
    .await;
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "orders"},
               "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                        "consistency": {"method": "CrashUnsafe"}}}),
    )
    .await;
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "nightly"},
               "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await;
    create::<Restore>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": {"name": "back"},
               "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "nightly"}}}),
    )
    .await;
    finalize(
        &namespace.api::<Backup>(),
        "nightly",
        &["custody.io/artifact-cleanup", "example.com/keep"],
    )
    .await;
    finalize(
        &namespace.api::<Restore>(),
        "back",
        &["custody.io/restore-cleanup"],
    )
    .await;
    finalize(
        &namespace.api::<Cluster>(),
        "orders",
        &["custody.io/restore-protection"],
    )
    .await;
    create::<Pod>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-0"},
               "spec": {"nodeSelector": {"custody.io/no-such-node": "true"},
                        "initContainers": [{"name": "custody-wait", "image": "custody-wait:test"}],
                        "containers": [{"name": "db", "image": "db:test"}]}}),
    )
    .await;
    // Marked as under restore, as custody marks a namespace.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            &ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {
                "labels": {"custody.io/restore-in-progress": "true"},
                "annotations": {"custody.io/restore-marked-at": "2026-12-04T00:00:00Z"},
            }})),
        )
        .await
        .unwrap();
    // Registered last (they fail closed and nothing answers them), for this namespace only.
    let (gate, check) = (format!("custody-gate-{ns}"), format!("custody-check-{ns}"));
    let webhook = |name: &str| {
        json!({"metadata": {"name": name}, "webhooks": [{
            "name": "x.custody.io",
            "clientConfig": {"url": "https://127.0.0.1:1/nothing"},
            "rules": [{"operations": ["CREATE"], "apiGroups": ["custody.io"], "apiVersions": ["v1alpha1"], "resources": ["backups"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"]}]})
    };
    create::<MutatingWebhookConfiguration>(&Api::all(client.clone()), webhook(&gate)).await;
    create::<ValidatingWebhookConfiguration>(&Api::all(client.clone()), webhook(&check)).await;

    let output = Command::new(binary("custody-controller"))
        .args(["uninstall", "--namespace", &ns, "--install-namespace", &ns])
        .arg(format!("--kubeconfig={}", control_plane().display()))
        .args(["--webhook-configuration", &gate])
        .args(["--validating-webhook-configuration", &check])
        .args(["--wait-seconds", "60"])
        .output()
        .expect("running custody-controller uninstall");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "uninstall failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{stdout}");
    assert!(
        stdout.contains(
            "2 webhook configurations deleted, 3 finalizers removed from custody objects, 1 from Secrets, 1 namespaces unmarked"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("still held by custody-wait") && stdout.contains(&format!("{ns}/orders-0")),
        "the held pod is named: {stdout}"
    );

    // custody's finalizers are off; another owner's stay.
    let backup = namespace.api::<Backup>().get("nightly").await.unwrap();
    assert_eq!(backup.finalizers(), ["example.com/keep"]);
    assert!(
        namespace
            .api::<Restore>()
            .get("back")
            .await
            .unwrap()
            .finalizers()
            .is_empty()
    );
    assert!(
        namespace
            .api::<Cluster>()
            .get("orders")
            .await
            .unwrap()
            .finalizers()
            .is_empty()
    );
    let secrets = namespace.api::<Secret>();
    assert!(secrets.get("s3").await.unwrap().finalizers().is_empty());
    assert_eq!(
        secrets.get("unrelated").await.unwrap().finalizers(),
        ["example.com/keep"]
    );
    let labels = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get(&ns)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert!(
        !labels.contains_key("custody.io/restore-in-progress"),
        "{labels:?}"
    );
    // The webhooks are gone and the controller scaled to zero.
    assert!(
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .get_opt(&gate)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .get_opt(&check)
            .await
            .unwrap()
            .is_none()
    );
    let deployment = namespace
        .api::<Deployment>()
        .get("custody-controller")
        .await
        .unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(0));

    // Run again: nothing left to do, not an error.
    let again = Command::new(binary("custody-controller"))
        .args(["uninstall", "--namespace", &ns, "--install-namespace", &ns])
        .arg(format!("--kubeconfig={}", control_plane().display()))
        .args(["--webhook-configuration", &gate])
        .args(["--validating-webhook-configuration", &check])
        .output()
        .expect("running custody-controller uninstall");
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(
            "0 webhook configurations deleted, 0 finalizers removed from custody objects, 0 from Secrets, 0 namespaces unmarked"
        ),
        "{again:?}"
    );

    // Once the other owner lets go, the namespace deletes (delete() waits until it is gone).
    finalize(&namespace.api::<Backup>(), "nightly", &[]).await;
    finalize(&secrets, "unrelated", &[]).await;
    namespace.delete().await;
}
