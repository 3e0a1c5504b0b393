//! custody on a real node, installed as users install it: kubelet v1.36 and Debian's
//! containerd and runc (hack/node-up.sh), custody's images built from this repository
//! (hack/build-images.sh) and `kubectl apply -k deploy/` unchanged, after the two TLS Secrets
//! the README names (hack/tls-secrets.sh). Every test here is named `on_a_real_node_…`: it is
//! a tier of its own in hack/test.sh (see custody_tests::node).

use std::time::Duration;

use custody_kube::api::NodeAgent;
use custody_tests::node::{hack, real_node};
use custody_tests::{await_condition, client, kubectl, repo_root};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

const TIMEOUT: Duration = Duration::from_secs(180);
const NAMESPACE: &str = "custody-system";

/// custody installed from `deploy/`; removed again (all but the CRDs, the namespace and its
/// Secrets, which other tiers share) when dropped, so that its cluster-wide webhook outlives
/// no test.
struct Installed;

impl Installed {
    fn apply() -> Installed {
        hack("tls-secrets.sh", &[]);
        let deploy = repo_root().join("deploy");
        let output = kubectl(&["apply", "-k", deploy.to_str().expect("utf-8 path")]);
        assert!(
            output.status.success(),
            "kubectl apply -k deploy/ failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Installed
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = kubectl(&[
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "mutatingwebhookconfiguration/custody-restore-gate",
        ]);
        let _ = kubectl(&[
            "-n",
            NAMESPACE,
            "delete",
            "--ignore-not-found",
            "deployment/custody-controller",
            "daemonset/custody-agent",
            "service/custody-controller",
        ]);
    }
}

#[tokio::test]
async fn on_a_real_node_custody_installs_from_deploy_and_its_agent_reports_through_the_service() {
    let node = real_node();
    let _installed = Installed::apply();
    let client = client().await;

    // The controller's Deployment and the agent's DaemonSet run as pods on the node.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    await_condition(
        &deployments,
        "custody-controller",
        "one available replica",
        TIMEOUT,
        |deployment: &Deployment| {
            deployment
                .status
                .as_ref()
                .and_then(|status| status.available_replicas)
                == Some(1)
        },
    )
    .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    await_condition(
        &daemonsets,
        "custody-agent",
        "its pod ready on the node",
        TIMEOUT,
        |daemonset: &DaemonSet| {
            daemonset
                .status
                .as_ref()
                .is_some_and(|status| status.number_ready == 1)
        },
    )
    .await;
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
