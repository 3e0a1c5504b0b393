//! Adding and removing one finalizer, and nothing else: the patch carries the object's
//! resourceVersion, so a list changed by someone else in the meantime is never overwritten
//! (the API server answers 409 and the reconciler tries again with a fresh read).

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The finalizer list with `finalizer` added (`None` when it is already there).
pub fn with(current: &[String], finalizer: &str) -> Option<Vec<String>> {
    if current.iter().any(|existing| existing == finalizer) {
        return None;
    }
    let mut next = current.to_vec();
    next.push(finalizer.to_string());
    Some(next)
}

/// The finalizer list without `finalizer` (`None` when it is not there). Only that one entry
/// goes; every other owner's finalizer stays.
pub fn without(current: &[String], finalizer: &str) -> Option<Vec<String>> {
    if !current.iter().any(|existing| existing == finalizer) {
        return None;
    }
    Some(
        current
            .iter()
            .filter(|existing| *existing != finalizer)
            .cloned()
            .collect(),
    )
}

/// Returns whether the write happened (`false`: the object changed meanwhile).
async fn write<K>(api: &Api<K>, object: &K, finalizers: Vec<String>, what: &str) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": object.resource_version(),
            "finalizers": finalizers,
        }
    });
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        // Changed meanwhile: the change wakes the reconciler again, which reads it afresh.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::debug!(object = what, "finalizers changed meanwhile; will retry");
            Ok(false)
        }
        Err(source) => Err(Error::Patch {
            object: format!("finalizers of {what}"),
            source,
        }),
    }
}

/// Adds `finalizer` to `object` unless it is there. Returns `true` when the object was (or
/// was meanwhile) changed: the caller stops here and continues on the next event, with the
/// finalizer known to be on.
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str, what: &str) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    match with(object.finalizers(), finalizer) {
        Some(next) => write(api, object, next, what).await.map(|_| true),
        None => Ok(false),
    }
}

/// Removes `finalizer` from `object` if it is there. Returns `true` when it is gone (removed
/// now, or not there), `false` when the object changed meanwhile and nothing was written.
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str, what: &str) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    match without(object.finalizers(), finalizer) {
        Some(next) => write(api, object, next, what).await,
        None => Ok(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_finalizer_changes() {
        let list = |items: &[&str]| {
            items
                .iter()
                .map(|item| item.to_string())
                .collect::<Vec<_>>()
        };
        let ours = "custody.io/restore-cleanup";
        assert_eq!(with(&list(&[]), ours), Some(list(&[ours])));
        assert_eq!(
            with(&list(&["other/x"]), ours),
            Some(list(&["other/x", ours]))
        );
        assert_eq!(with(&list(&[ours]), ours), None);
        assert_eq!(
            without(&list(&["a/b", ours, "c/d"]), ours),
            Some(list(&["a/b", "c/d"]))
        );
        assert_eq!(without(&list(&["a/b"]), ours), None);
        assert_eq!(without(&list(&[ours]), ours), Some(list(&[])));
        // A look-alike finalizer is somebody else's.
        assert_eq!(
            without(&list(&["custody.io/restore-cleanup-x"]), ours),
            None
        );
    }
}
