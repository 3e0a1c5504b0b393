//! custody installed as users install it: from `deploy/` with kustomize, and with its Helm chart.

use super::*;

#[tokio::test]
async fn on_a_real_node_custody_installs_from_deploy_and_its_agent_reports_through_the_service() {
    let _agents = AGENTS.read().await;
    let node = real_node();
    let _installed = Installed::apply();
    let client = client().await;

    // The controller's Deployment and the agent's DaemonSet run as pods on the node.
    running(&client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let listed = pods.list(&ListParams::default()).await.unwrap().items;
    for (app, image) in [
        (
            "custody-controller",
            "ghcr.io/custody/custody-controller:0.1.0",
        ),
        ("custody-agent", "ghcr.io/custody/custody-agent:0.1.0"),
    ] {
        let pod = listed
            .iter()
            .find(|pod| {
                pod.metadata
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get("app.kubernetes.io/name"))
                    .is_some_and(|name| name == app)
                    && pod.metadata.deletion_timestamp.is_none()
            })
            .unwrap_or_else(|| panic!("no {app} pod"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(node), "{app}");
        let status = pod.status.as_ref().unwrap();
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(container.image, image, "{app}");
        assert!(
            container.image_id.starts_with("sha256:"),
            "{app} ran an image the node's containerd holds: {}",
            container.image_id
        );
        assert!(
            container
                .state
                .as_ref()
                .is_some_and(|state| state.running.is_some()),
            "{app}: {:?}",
            container.state
        );
    }

    // The agent, on the host network, reached the controller's report service by its Service
    // name (cluster DNS, kube-proxy) with the report certificate: its NodeAgent has a heartbeat
    // and a measured clock offset.
    let agents: Api<NodeAgent> = Api::all(client.clone());
    let agent = await_condition(
        &agents,
        node,
        "a heartbeat and a clock offset",
        TIMEOUT,
        |agent: &NodeAgent| {
            agent.status.as_ref().is_some_and(|status| {
                status.last_heartbeat_time.is_some() && status.clock_offset_nanoseconds.is_some()
            })
        },
    )
    .await;
    let status = agent.status.unwrap();
    assert_eq!(status.agent_version.as_deref(), Some("0.1.0"));

    // Memory of both as real pods, idle (no restore, no backup), from their processes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (app, limit_mib) in [("custody-agent", 128), ("custody-controller", 512)] {
        let pod = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|pod| pod.metadata.deletion_timestamp.is_none())
            .unwrap_or_else(|| panic!("no {app} pod"));
        let id = pod
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .container_id
            .clone()
            .expect("a container ID");
        let rss = container_rss_kib(id.trim_start_matches("containerd://"));
        eprintln!("idle {app} as a pod: RSS {:.1} MiB", rss as f64 / 1024.0);
        assert!(rss > 0 && rss < limit_mib * 1024, "{app}: {rss} KiB");
    }

    // The controller issued the webhook's certificate and wrote its CA into the configuration
    // that `deploy/` created without one.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    await_condition(
        &configurations,
        "custody-restore-gate",
        "a caBundle",
        TIMEOUT,
        |configuration: &MutatingWebhookConfiguration| {
            configuration
                .webhooks
                .iter()
                .flatten()
                .all(|webhook| webhook.client_config.ca_bundle.is_some())
        },
    )
    .await;
}

/// #13: custody installed with its Helm chart (`helm install custody deploy/helm/custody -n
/// custody-system`, the chart written from `deploy/` by hack/gen-chart.sh) backs up and
/// restores verified on the real node, as when installed with kustomize; `helm uninstall`
/// removes what it installed.
#[tokio::test]
async fn on_a_real_node_custody_installed_with_its_helm_chart_restores_verified() {
    let setup = backed_up_by_helm("helm").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let deployment: Api<Deployment> = Api::namespaced(setup.client.clone(), NAMESPACE);
    let managed = deployment.get("custody-controller").await.unwrap();
    assert_eq!(
        managed
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("app.kubernetes.io/managed-by"))
            .map(String::as_str),
        Some("Helm"),
        "{:?}",
        managed.metadata.labels
    );
    assert_eq!(
        managed
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get("meta.helm.sh/release-name"))
            .map(String::as_str),
        Some("custody")
    );
    // One command on a cluster without custody: the chart made the namespace, with the Pod
    // Security label the agent needs, and nothing was made by hand (no TLS Secret: the
    // controller made custody's CA and the agents' gate certificates).
    let made = Api::<k8s_openapi::api::core::v1::Namespace>::all(setup.client.clone())
        .get(NAMESPACE)
        .await
        .unwrap();
    let labels = made.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged"),
        "{labels:?}"
    );
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("Helm"),
        "{labels:?}"
    );
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    assert_eq!(
        restore.status.as_ref().unwrap().volumes[0].state,
        VolumeState::Verified
    );
    ready(pods, "shop-0").await;
    let listed = helm(&["list", "--namespace", HELM_RELEASE_NAMESPACE, "--short"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("custody"),
        "{listed:?}"
    );

    // Issue 23, uninstall: `helm uninstall` first runs the chart's pre-delete hook (`custody-
    // controller uninstall` in a Job): the webhook configurations go, the controller stops,
    // and custody's finalizers come off users' objects and Secrets, so that the namespace can
    // be deleted once custody is gone (finish() waits for it).
    let custody_finalizers = |finalizers: &[String]| {
        finalizers
            .iter()
            .filter(|finalizer| finalizer.starts_with("custody.io/"))
            .cloned()
            .collect::<Vec<_>>()
    };
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    assert_eq!(
        custody_finalizers(nightly.finalizers()),
        ["custody.io/artifact-cleanup"],
        "a finalizer the uninstall must remove"
    );
    let uninstalled = helm(&[
        "uninstall",
        "custody",
        "--namespace",
        HELM_RELEASE_NAMESPACE,
        "--wait",
        "--timeout",
        "5m",
    ]);
    assert!(
        uninstalled.status.success(),
        "helm uninstall: {uninstalled:?}"
    );
    let mut left = Vec::new();
    for backup in namespace
        .api::<Backup>()
        .list(&Default::default())
        .await
        .unwrap()
    {
        left.push((backup.name_any(), custody_finalizers(backup.finalizers())));
    }
    for restore in namespace
        .api::<Restore>()
        .list(&Default::default())
        .await
        .unwrap()
    {
        left.push((restore.name_any(), custody_finalizers(restore.finalizers())));
    }
    for cluster in namespace
        .api::<Cluster>()
        .list(&Default::default())
        .await
        .unwrap()
    {
        left.push((cluster.name_any(), custody_finalizers(cluster.finalizers())));
    }
    let secrets = namespace.api::<k8s_openapi::api::core::v1::Secret>();
    for secret in secrets.list(&Default::default()).await.unwrap() {
        left.push((secret.name_any(), custody_finalizers(secret.finalizers())));
    }
    left.retain(|(_, finalizers)| !finalizers.is_empty());
    assert!(left.is_empty(), "custody finalizers left: {left:?}");
    assert!(
        Api::<MutatingWebhookConfiguration>::all(setup.client.clone())
            .get_opt("custody-restore-gate")
            .await
            .unwrap()
            .is_none()
            && Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
                setup.client.clone()
            )
            .get_opt("custody-requester-check")
            .await
            .unwrap()
            .is_none(),
        "a webhook configuration outlived the uninstall"
    );
    // The chart's namespace went with it.
    custody_tests::eventually("custody's namespace deleted", TIMEOUT, || {
        let client = setup.client.clone();
        async move {
            match Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
                .get_opt(NAMESPACE)
                .await
            {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
    setup.finish().await;
}
