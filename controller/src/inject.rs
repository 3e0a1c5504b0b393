//! What the admission webhook does to a pod of a Cluster under restore, as a pure function:
//! `custody-wait` as the first init container (a projected token of audience `custody`, the
//! node's address from the downward API, the gate's CA), the readiness gate, and the labels and
//! annotations that tell a person which Restore holds the pod. What the node agent holds the
//! pod for is in `custody-wait`'s environment (the Restore, its UID, the claims): a pod's spec
//! cannot change after admission, its labels and annotations can. Nothing injected needs more
//! than the restricted Pod Security Standard allows. Applying it twice changes nothing; a stale
//! `custody-wait` (older image or settings) is replaced.
//!
//! (The webhook server that calls it comes with the restore reconciler.)

use k8s_openapi::api::core::v1::{Container, Pod, PodReadinessGate, Volume};

use custody_proto::names;

/// Name of the injected init container.
pub use custody_proto::names::WAIT_CONTAINER;
/// Name of the injected volume (token and CA).
pub const GATE_VOLUME: &str = "custody-gate";
/// Where `custody-wait` finds the token and the CA.
pub const GATE_MOUNT: &str = "/var/run/secrets/custody/gate";
/// The readiness gate the restore reconciler sets once the pod's volumes are verified.
pub const READINESS_GATE: &str = "custody.io/restore-verified";
/// Lifetime of the projected token (the kubelet rotates it; custody-wait rereads it).
pub const TOKEN_SECONDS: i64 = 600;

/// What to inject for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injection {
    pub image: String,
    /// ConfigMap holding the gate's CA as `ca.crt`.
    pub ca_config_map: String,
    pub restore_name: String,
    pub restore_uid: String,
    /// The Cluster's volume claim templates; the pod's claims are `<template>-<pod name>`.
    pub claim_templates: Vec<String>,
    /// The gate certificates name their node ([`gate_env`]).
    pub per_node_gate_names: bool,
}

/// With gate certificates from custody's CA, the name `custody-wait` and the mover check is
/// their own node's (`<node>.gate.custody.io`, the node read from the downward API): one
/// node's key cannot pass for another node's gate. Without, they check `custody-agent`.
pub fn gate_env(per_node_gate_names: bool) -> Vec<serde_json::Value> {
    if !per_node_gate_names {
        return Vec::new();
    }
    vec![
        serde_json::json!({"name": "CUSTODY_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        serde_json::json!({"name": names::ENV_AGENT_SERVER_NAME, "value": format!("$(CUSTODY_NODE_NAME).{}", names::GATE_NAME_SUFFIX)}),
    ]
}

fn wait_container(injection: &Injection, claims: &[String]) -> Container {
    let mut container = serde_json::json!({
        "name": WAIT_CONTAINER,
        "image": injection.image,
        "command": ["custody-wait"],
        "env": [
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": names::ENV_AGENT_ADDRESS, "value": format!("$(HOST_IP):{}", names::GATE_PORT)},
            {"name": names::ENV_TOKEN_FILE, "value": format!("{GATE_MOUNT}/token")},
            {"name": names::ENV_CA_FILE, "value": format!("{GATE_MOUNT}/ca.crt")},
            {"name": names::ENV_RESTORE, "value": injection.restore_name},
            {"name": names::ENV_RESTORE_UID, "value": injection.restore_uid},
            {"name": names::ENV_RESTORED_CLAIMS, "value": claims.join(",")},
        ],
        "volumeMounts": [{"name": GATE_VOLUME, "mountPath": GATE_MOUNT, "readOnly": true}],
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "resources": {"requests": {"cpu": "5m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}},
    });
    crate::mover_job::append(
        &mut container,
        "env",
        gate_env(injection.per_node_gate_names),
    );
    serde_json::from_value(container).expect("a valid container")
}

fn gate_volume(injection: &Injection) -> Volume {
    serde_json::from_value(serde_json::json!({
        "name": GATE_VOLUME,
        "projected": {"sources": [
            {"serviceAccountToken": {
                "audience": names::GATE_AUDIENCE,
                "expirationSeconds": TOKEN_SECONDS,
                "path": "token",
            }},
            {"configMap": {"name": injection.ca_config_map, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]},
    }))
    .expect("a valid volume")
}

/// The pod as it must be admitted.
pub fn inject(mut pod: Pod, injection: &Injection) -> Pod {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let claims: Vec<String> = injection
        .claim_templates
        .iter()
        .map(|template| format!("{template}-{name}"))
        .collect();
    pod.metadata.labels.get_or_insert_default().insert(
        names::LABEL_RESTORE_UID.into(),
        injection.restore_uid.clone(),
    );
    let annotations = pod.metadata.annotations.get_or_insert_default();
    annotations.insert(
        names::ANNOTATION_RESTORE.into(),
        injection.restore_name.clone(),
    );
    annotations.insert(names::ANNOTATION_RESTORED_CLAIMS.into(), claims.join(","));

    let spec = pod.spec.get_or_insert_default();
    let mut init = vec![wait_container(injection, &claims)];
    init.extend(
        spec.init_containers
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|container| container.name != WAIT_CONTAINER),
    );
    spec.init_containers = Some(init);

    let volumes = spec.volumes.get_or_insert_default();
    volumes.retain(|volume| volume.name != GATE_VOLUME);
    volumes.push(gate_volume(injection));

    let gates = spec.readiness_gates.get_or_insert_default();
    if !gates
        .iter()
        .any(|gate| gate.condition_type == READINESS_GATE)
    {
        gates.push(PodReadinessGate {
            condition_type: READINESS_GATE.into(),
        });
    }
    pod
}

#[cfg(test)]
mod tests;
