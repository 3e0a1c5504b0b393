//! The contract between the controller's pod injection and the node agent: a pod as the
//! webhook will admit it is read by the agent as gated on exactly the Cluster's claims.

use std::collections::BTreeMap;

use custody_agent::node;
use custody_controller::inject::{Injection, inject};
use k8s_openapi::api::core::v1::Pod;

#[test]
fn the_agent_gates_an_injected_pod_on_the_clusters_claims() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orders-0", "namespace": "db", "uid": "pod-uid"},
        "spec": {
            "containers": [{"name": "db", "image": "postgres:17"}],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-orders-0"}},
                {"name": "wal", "persistentVolumeClaim": {"claimName": "wal-orders-0"}},
            ],
        },
    }))
    .unwrap();
    let injected = inject(
        pod,
        &Injection {
            image: "custody-wait:1".into(),
            ca_config_map: "custody-gate-ca".into(),
            restore_name: "orders-restore".into(),
            restore_uid: "restore-uid".into(),
            claim_templates: vec!["data".into(), "wal".into()],
            per_node_gate_names: false,
        },
    );
    let (view, starts) = node::compute([&injected], &BTreeMap::new(), &Default::default());
    assert!(starts.is_empty());
    let gated = &view.gated["pod-uid"];
    assert_eq!(gated.problem, None);
    let volumes: Vec<(&str, &str, &str)> = gated
        .volumes
        .iter()
        .map(|volume| {
            (
                volume.volume.volume.as_str(),
                volume.volume.claim_name.as_str(),
                volume.volume.restore_uid.as_str(),
            )
        })
        .collect();
    assert_eq!(
        volumes,
        [
            ("data", "data-orders-0", "restore-uid"),
            ("wal", "wal-orders-0", "restore-uid")
        ]
    );
    assert!(!gated.released(), "a freshly injected pod is held");

    // What the agent holds the pod for is in its spec: removing the labels and annotations
    // (anyone who may patch the pod can) changes nothing.
    let mut stripped = injected.clone();
    stripped.metadata.labels = None;
    stripped.metadata.annotations = None;
    let (view, _) = node::compute([&stripped], &BTreeMap::new(), &Default::default());
    assert_eq!(view.gated["pod-uid"], *gated);
}
