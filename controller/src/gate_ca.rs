//! The agents' gate CA, copied into each namespace whose pods call an agent: `custody-wait`
//! in pods under restore, and the mover of a frozen backup. Pods mount it from ConfigMap
//! `custody-gate-ca` (key `ca.crt`) to check the agent's certificate.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::error::{Error, Result};

/// The ConfigMap, in each namespace, holding the gate's CA as `ca.crt`.
pub const CONFIG_MAP: &str = "custody-gate-ca";

/// Creates the ConfigMap in `namespace`, or keeps it equal to `ca` (server-side apply as
/// `field_manager`). Without a CA (the controller was given none) nothing is written.
pub async fn publish(
    client: &Client,
    namespace: &str,
    ca: Option<&str>,
    field_manager: &str,
) -> Result<()> {
    let Some(ca) = ca else {
        return Ok(());
    };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let config_map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CONFIG_MAP,
            "labels": {"app.kubernetes.io/managed-by": "custody"},
        },
        "data": {"ca.crt": ca},
    });
    api.patch(
        CONFIG_MAP,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(config_map),
    )
    .await
    .map_err(|source| Error::Patch {
        object: format!("ConfigMap {namespace}/{CONFIG_MAP}"),
        source,
    })?;
    Ok(())
}
