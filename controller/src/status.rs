//! Writing a custody object's status by server-side apply under one field manager.

use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Applies `status` to `name` under `field_manager` (forcing ownership of what it sets); the
/// object as the API server answered. `object` names the object in the error.
pub async fn apply<K>(
    api: &Api<K>,
    name: &str,
    field_manager: &str,
    object: &str,
    status: &impl Serialize,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(patch),
    )
    .await
    .map_err(|source| Error::PatchStatus {
        object: object.to_string(),
        source,
    })
}

/// `object` as the API server has it now (`None` when it is gone), read past the watch cache:
/// a reconciler decides on this, so that a status written a moment ago is not rolled back by a
/// write based on an older copy.
pub async fn fresh<K>(object: &K, client: &kube::Client) -> Result<Option<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    let name = object.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    api.get_opt(&name).await.map_err(|source| Error::Read {
        object: format!("{} {namespace}/{name}", K::kind(&())),
        source,
    })
}
