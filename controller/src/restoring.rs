//! Namespaces under restore: the restore gate's webhook sees only pods of namespaces that carry
//! [`LABEL`], so that a controller outage refuses pods only where a restore is in progress.
//! There it sees every pod that mounts a claim (or carries `custody.io/cluster`), whatever its
//! labels: a pod that mounts a claim a restore writes is held or refused ([`crate::webhook`]).
//!
//! The label is set before a Cluster with `spec.restore` exists (the requester webhook marks the
//! namespace before it admits the Cluster) and again before its Restore is created (the Cluster
//! reconciler, for a Cluster admitted another way). It is taken off only when no Cluster of the
//! namespace has a restore left to complete, no sooner than a grace period after the last mark
//! ([`ANNOTATION_MARKED`]) and only if nobody wrote the namespace since it was read: a Cluster
//! being admitted at that moment marks again, so its pods are never created in an unmarked
//! namespace.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::error::{Error, Result};
use custody_kube::api::{Cluster, Restore, RestorePhase};

/// The label of a namespace with a restore in progress.
pub const LABEL: &str = "custody.io/restore-in-progress";
/// When custody last marked the namespace (RFC 3339).
pub const ANNOTATION_MARKED: &str = "custody.io/restore-marked-at";

/// What to do with a marked namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    /// A restore is in progress: the mark stays.
    Keep,
    /// No restore left, and the last mark is older than the grace period: take it off.
    Unmark,
    /// No restore left, but a Cluster may be being admitted under the last mark: look again
    /// after this long.
    LookAgain(Duration),
}

/// The Restore a Cluster creates has the Cluster's name.
pub fn restore_name(cluster: &Cluster) -> String {
    cluster.name_any()
}

/// The decision for a marked namespace. `marked_at` is the last mark's time (`None`: no
/// readable time, so no admission is known to rely on it).
pub fn settle(
    restoring: bool,
    marked_at: Option<Timestamp>,
    now: Timestamp,
    grace: Duration,
) -> Settle {
    if restoring {
        return Settle::Keep;
    }
    let Some(marked_at) = marked_at else {
        return Settle::Unmark;
    };
    let age = now
        .duration_since(marked_at)
        .try_into()
        .unwrap_or(Duration::ZERO);
    match grace.checked_sub(age) {
        Some(left) if !left.is_zero() => Settle::LookAgain(left),
        _ => Settle::Unmark,
    }
}

/// Whether `cluster` has a restore left to complete: it names a Backup to restore from and its
/// own Restore (controlled by it) has not completed. A Cluster being deleted counts until it
/// is gone (its pods are refused meanwhile).
pub fn restoring(cluster: &Cluster, restores: &[Restore]) -> bool {
    if cluster.spec.restore.is_none() {
        return false;
    }
    let name = restore_name(cluster);
    let uid = cluster.metadata.uid.as_deref().unwrap_or_default();
    !restores.iter().any(|restore| {
        restore.metadata.name.as_deref() == Some(name.as_str())
            && crate::ownership::controlled_by(&restore.metadata, "Cluster", uid)
            && restore.status.as_ref().and_then(|status| status.phase)
                == Some(RestorePhase::Completed)
    })
}

/// Whether `claim` is a claim a restore of a Cluster with these templates and StatefulSet
/// writes: `<template>-<statefulset>-<ordinal>`.
pub fn restores_claim(templates: &[String], stateful_set: &str, claim: &str) -> bool {
    templates.iter().any(|template| {
        claim
            .strip_prefix(template.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.strip_prefix(stateful_set))
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(ordinal)
    })
}

/// Whether `text` is a StatefulSet ordinal (digits, no leading zero).
pub fn ordinal(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|byte| byte.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
}

/// The time of the namespace's last mark.
fn marked_at(namespace: &Namespace) -> Option<Timestamp> {
    namespace.annotations().get(ANNOTATION_MARKED)?.parse().ok()
}

fn marked(namespace: &Namespace) -> bool {
    namespace.labels().contains_key(LABEL)
}

/// The merge patch that takes the mark off a namespace (only at `resource_version`, when
/// given).
pub fn unmark_patch(resource_version: Option<&str>) -> serde_json::Value {
    let mut patch = serde_json::json!({"metadata": {
        "labels": {LABEL: null},
        "annotations": {ANNOTATION_MARKED: null},
    }});
    if let Some(version) = resource_version {
        patch["metadata"]["resourceVersion"] = version.into();
    }
    patch
}

/// Marks `namespace` as under restore, now (a write even when it is marked already, so that a
/// concurrent [`settle_namespace`] sees it changed).
pub async fn mark(client: &Client, namespace: &str) -> Result<()> {
    let patch = serde_json::json!({"metadata": {
        "labels": {LABEL: "true"},
        "annotations": {ANNOTATION_MARKED: Timestamp::now().to_string()},
    }});
    Api::<Namespace>::all(client.clone())
        .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Patch {
            object: format!("Namespace {namespace}"),
            source,
        })?;
    tracing::debug!(namespace, "namespace marked as under restore");
    Ok(())
}

/// Takes the mark off `namespace` when [`settle`] says so; returns when to look again (`None`:
/// not marked any more, or kept until a Cluster changes).
pub async fn settle_namespace(
    client: &Client,
    namespace: &str,
    grace: Duration,
) -> Result<Option<Duration>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let Some(current) = namespaces
        .get_opt(namespace)
        .await
        .map_err(Error::read(format!("Namespace {namespace}")))?
    else {
        return Ok(None);
    };
    if !marked(&current) || current.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    // Read after the namespace: a Cluster admitted since then marked it again, which the
    // precondition below sees.
    let clusters = Api::<Cluster>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("Clusters in {namespace}")))?;
    let restores = Api::<Restore>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("Restores in {namespace}")))?;
    let in_progress = clusters
        .items
        .iter()
        .any(|cluster| restoring(cluster, &restores.items));
    match settle(in_progress, marked_at(&current), Timestamp::now(), grace) {
        Settle::Keep => Ok(None),
        Settle::LookAgain(after) => Ok(Some(after)),
        Settle::Unmark => {
            let patch = unmark_patch(current.metadata.resource_version.as_deref());
            match namespaces
                .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(namespace, "no restore in progress: namespace unmarked");
                    Ok(None)
                }
                // Written meanwhile (marked again?): decided afresh next time.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    Ok(Some(Duration::from_secs(1)))
                }
                Err(source) => Err(Error::Patch {
                    object: format!("Namespace {namespace}"),
                    source,
                }),
            }
        }
    }
}

/// Settles every marked namespace (or only `scoped`) every `every`, until `stopped`.
pub async fn run(
    client: Client,
    scoped: Option<String>,
    grace: Duration,
    every: Duration,
    stopped: impl Future<Output = ()> + Send + 'static,
) {
    let work = async {
        loop {
            let namespaces = match &scoped {
                Some(namespace) => Ok(vec![namespace.clone()]),
                None => Api::<Namespace>::all(client.clone())
                    .list_metadata(&ListParams::default().labels(LABEL))
                    .await
                    .map(|list| list.items.iter().map(|item| item.name_any()).collect()),
            };
            match namespaces {
                Ok(namespaces) => {
                    for namespace in namespaces {
                        if let Err(error) = settle_namespace(&client, &namespace, grace).await {
                            tracing::warn!(namespace, %error, "cannot settle the namespace's restore mark");
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot list the namespaces marked as under restore")
                }
            }
            tokio::time::sleep(every).await;
        }
    };
    tokio::select! {
        _ = work => {}
        _ = stopped => {}
    }
}

#[cfg(test)]
mod tests;
