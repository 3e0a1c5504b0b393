use super::*;

fn injection() -> Injection {
    Injection {
        image: "custody-wait:1".into(),
        ca_config_map: "custody-gate-ca".into(),
        restore_name: "orders-restore".into(),
        restore_uid: "restore-uid".into(),
        claim_templates: vec!["data".into(), "wal".into()],
        per_node_gate_names: false,
    }
}

fn pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orders-1", "labels": {"app": "orders"}},
        "spec": {
            "initContainers": [{"name": "migrate", "image": "migrate:1"}],
            "containers": [{"name": "db", "image": "postgres:17"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-orders-1"}}],
        },
    }))
    .unwrap()
}

#[test]
fn the_wait_container_runs_first_with_the_gate_volume_and_readiness_gate() {
    let injected = inject(pod(), &injection());
    let spec = injected.spec.as_ref().unwrap();
    let init: Vec<&str> = spec
        .init_containers
        .as_ref()
        .unwrap()
        .iter()
        .map(|container| container.name.as_str())
        .collect();
    assert_eq!(init, [WAIT_CONTAINER, "migrate"]);
    let volumes: Vec<&str> = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|volume| volume.name.as_str())
        .collect();
    assert_eq!(volumes, ["data", GATE_VOLUME]);
    let token = spec.volumes.as_ref().unwrap()[1]
        .projected
        .as_ref()
        .unwrap()
        .sources
        .as_ref()
        .unwrap()[0]
        .service_account_token
        .clone()
        .unwrap();
    assert_eq!(token.audience.as_deref(), Some(names::GATE_AUDIENCE));
    assert_eq!(
        spec.readiness_gates.as_ref().unwrap()[0].condition_type,
        READINESS_GATE
    );
    let labels = injected.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[names::LABEL_RESTORE_UID], "restore-uid");
    assert_eq!(labels["app"], "orders");
    let annotations = injected.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[names::ANNOTATION_RESTORE], "orders-restore");
    assert_eq!(
        annotations[names::ANNOTATION_RESTORED_CLAIMS],
        "data-orders-1,wal-orders-1"
    );
    // The agent's address comes from the downward API.
    let wait = &spec.init_containers.as_ref().unwrap()[0];
    let env = wait.env.as_ref().unwrap();
    assert_eq!(
        env[0]
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "status.hostIP"
    );
    assert_eq!(env[1].value.as_deref(), Some("$(HOST_IP):9443"));
}

#[test]
fn injecting_twice_changes_nothing_and_a_stale_wait_is_replaced() {
    let once = inject(pod(), &injection());
    assert_eq!(inject(once.clone(), &injection()), once);
    let newer = Injection {
        image: "custody-wait:2".into(),
        ..injection()
    };
    let updated = inject(once, &newer);
    let spec = updated.spec.unwrap();
    let waits: Vec<_> = spec
        .init_containers
        .unwrap()
        .into_iter()
        .filter(|container| container.name == WAIT_CONTAINER)
        .collect();
    assert_eq!(waits.len(), 1);
    assert_eq!(waits[0].image.as_deref(), Some("custody-wait:2"));
    assert_eq!(
        spec.volumes
            .unwrap()
            .iter()
            .filter(|volume| volume.name == GATE_VOLUME)
            .count(),
        1
    );
    assert_eq!(spec.readiness_gates.unwrap().len(), 1);
}

#[test]
fn nothing_injected_needs_more_than_the_restricted_standard() {
    let injected = inject(pod(), &injection());
    let spec = injected.spec.unwrap();
    for volume in spec.volumes.unwrap() {
        assert!(volume.host_path.is_none(), "{} is a hostPath", volume.name);
    }
    let wait = &spec.init_containers.unwrap()[0];
    let security = wait.security_context.as_ref().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, None);
    assert_eq!(
        security.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    assert_eq!(
        security.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    assert!(wait.ports.is_none());
}

/// With gate certificates from custody's CA, `custody-wait` checks its own node's gate name.
#[test]
fn with_per_node_gate_names_the_wait_container_checks_its_nodes_name() {
    let env_of = |injection: &Injection| {
        let pod = inject(pod(), injection);
        let container = pod.spec.unwrap().init_containers.unwrap()[0].clone();
        container
            .env
            .unwrap()
            .into_iter()
            .map(|var| {
                (
                    var.name,
                    var.value,
                    var.value_from
                        .and_then(|from| from.field_ref)
                        .map(|field| field.field_path),
                )
            })
            .collect::<Vec<_>>()
    };
    let plain = env_of(&injection());
    assert!(
        plain
            .iter()
            .all(|(name, _, _)| name != names::ENV_AGENT_SERVER_NAME)
    );
    let per_node = env_of(&Injection {
        per_node_gate_names: true,
        ..injection()
    });
    let node = per_node
        .iter()
        .position(|(name, _, _)| name == "CUSTODY_NODE_NAME")
        .expect("node name");
    assert_eq!(per_node[node].2.as_deref(), Some("spec.nodeName"));
    let server = per_node
        .iter()
        .position(|(name, _, _)| name == names::ENV_AGENT_SERVER_NAME)
        .expect("server name");
    assert!(node < server, "defined before it is referred to");
    assert_eq!(
        per_node[server].1.as_deref(),
        Some("$(CUSTODY_NODE_NAME).gate.custody.io")
    );
}
