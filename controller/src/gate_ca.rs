//! The agents' gate CA, copied into each namespace whose pods call an agent: `custody-wait`
//! in pods under restore, and the mover of a frozen backup. Pods mount it from ConfigMap
//! `custody-gate-ca` (key `ca.crt`) to check the agent's certificate.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::error::{Error, Result};

/// The gate's CA (PEM bundle) as it stands: read from `--gate-ca-file` once, or kept current
/// from custody's own CA ([`crate::pki`]) as it rotates.
#[derive(Clone, Debug, Default)]
pub struct Trust(std::sync::Arc<std::sync::RwLock<Option<String>>>);

impl Trust {
    pub fn fixed(ca: Option<String>) -> Self {
        Trust(std::sync::Arc::new(std::sync::RwLock::new(ca)))
    }

    pub fn current(&self) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub fn set(&self, ca: String) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(ca);
    }
}

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
    apply(client, namespace, CONFIG_MAP, ca, field_manager).await
}

/// Creates ConfigMap `name` in `namespace` holding `ca` as `ca.crt`, or keeps it so
/// (server-side apply as `field_manager`).
pub async fn apply(
    client: &Client,
    namespace: &str,
    name: &str,
    ca: &str,
    field_manager: &str,
) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let config_map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "custody"},
        },
        "data": {"ca.crt": ca},
    });
    api.patch(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(config_map),
    )
    .await
    .map_err(|source| Error::Patch {
        object: format!("ConfigMap {namespace}/{name}"),
        source,
    })?;
    Ok(())
}
