//! The credentials Secret a Backup's artifact needs: held (a finalizer of custody's) while a
//! Backup may still delete with it, released when none needs it any more.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use crate::artifacts;
use crate::error::{Error, Result};
use custody_kube::api::{Backup, BackupRepository};

pub(super) async fn repository_secret(
    client: &kube::Client,
    backup: &Backup,
) -> Result<Option<String>> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = match &backup.spec.repository_ref {
        Some(reference) => Some(reference.name.clone()),
        None => {
            let cluster = &backup.spec.cluster_ref.name;
            Api::<custody_kube::api::Cluster>::namespaced(client.clone(), &namespace)
                .get_opt(cluster)
                .await
                .map_err(Error::read(format!("Cluster {namespace}/{cluster}")))?
                .and_then(|cluster| cluster.spec.repository_ref)
                .map(|reference| reference.name)
        }
    };
    let Some(name) = name else {
        return Ok(None);
    };
    Ok(
        Api::<BackupRepository>::namespaced(client.clone(), &namespace)
            .get_opt(&name)
            .await
            .map_err(Error::read(format!("BackupRepository {namespace}/{name}")))?
            .and_then(|repository| repository.spec.credentials_secret().map(str::to_string)),
    )
}

/// Drops the Secret's finalizer when no Backup other than `leaving` still needs it. `false`:
/// the Secret changed meanwhile and nothing was written.
pub async fn release_secret(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
    leaving: Option<&str>,
) -> Result<bool> {
    let backups: Api<Backup> = Api::namespaced(client.clone(), namespace);
    let needed = backups
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("Backups in {namespace}")))?
        .items
        .into_iter()
        .filter(|other| other.metadata.uid.as_deref() != leaving)
        .any(|other| artifacts::needs_secret(&other, secret));
    if needed {
        return Ok(true);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("Secret {namespace}/{secret}");
    // A write that lost a race (the namespace being deleted marks the Secret) is tried again
    // on a fresh read.
    for _ in 0..5 {
        let Some(found) = secrets
            .get_opt(secret)
            .await
            .map_err(Error::read(what.clone()))?
        else {
            return Ok(true);
        };
        if crate::finalizers::remove(&secrets, &found, artifacts::SECRET_FINALIZER, &what).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Puts the Secret's finalizer on before a Backup records an artifact that needs it.
pub async fn hold_secret(client: &kube::Client, namespace: &str, secret: &str) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("Secret {namespace}/{secret}");
    let Some(found) = secrets
        .get_opt(secret)
        .await
        .map_err(Error::read(what.clone()))?
    else {
        return Ok(());
    };
    if found.meta().deletion_timestamp.is_some() {
        return Ok(());
    }
    if crate::finalizers::add(&secrets, &found, artifacts::SECRET_FINALIZER, &what).await? {
        // Confirm it is on (a concurrent change may have won the write).
        let again = secrets
            .get_opt(secret)
            .await
            .map_err(Error::read(what.clone()))?;
        if !again.is_some_and(|again| {
            again
                .finalizers()
                .iter()
                .any(|f| f == artifacts::SECRET_FINALIZER)
        }) {
            return Err(Error::Webhook(format!(
                "{what} changed while its finalizer was added; trying again"
            )));
        }
    }
    Ok(())
}
