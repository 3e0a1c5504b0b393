//! Writing a custody object's status by server-side apply under one field manager.

use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Applies `status` to `name` under `field_manager` (forcing ownership of what it sets).
/// `object` names the object in the error.
pub async fn apply<K>(
    api: &Api<K>,
    name: &str,
    field_manager: &str,
    object: &str,
    status: &impl Serialize,
) -> Result<()>
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
    })?;
    Ok(())
}
