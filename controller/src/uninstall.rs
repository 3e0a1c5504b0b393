//! `custody-controller uninstall`: lets go of everything custody holds in the cluster, so that
//! removing custody afterwards leaves no finalizer nobody will remove, no webhook
//! configuration pointing at nothing and namespaces that can be deleted. In this order:
//!
//! 1. the admission webhook configurations are deleted, so that no pod or object creation
//!    depends on the controller any more (the webhooks fail closed);
//! 2. the controller's Deployment is scaled to zero and its pods awaited, so that none adds a
//!    finalizer again;
//! 3. custody's own finalizer, and no other, is removed from every Backup, Restore, Cluster
//!    and BackupPlan (a drill's), and from the credentials Secrets custody marked (found through the Backups and
//!    BackupRepositories that name them: custody never lists Secrets);
//! 4. the restore mark (`custody.io/restore-in-progress`, [`crate::restoring`]) is taken off
//!    every namespace that carries it.
//!
//! Nothing is deleted from object storage: artifacts and repositories stay, and a later install
//! imports an encrypted repository's snapshots again. Pods still held by `custody-wait` are
//! named: without the agent they never start (delete them, or their Restore first).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use custody_kube::api::{Backup, BackupRepository, Cluster, Restore};

/// Options of `custody-controller uninstall`.
#[derive(Debug, Clone, clap::Args)]
pub struct UninstallOptions {
    /// Kubeconfig to use; without it, $KUBECONFIG, ~/.kube/config or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The namespace custody is installed in (default: this pod's, else `custody-system`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "custody-system")]
    pub install_namespace: String,
    /// The controller's Deployment, scaled to zero.
    #[arg(long, default_value = "custody-controller")]
    pub deployment: String,
    /// The restore gate's MutatingWebhookConfiguration.
    #[arg(long, default_value = "custody-restore-gate")]
    pub webhook_configuration: String,
    /// The requester check's ValidatingWebhookConfiguration.
    #[arg(long, default_value = "custody-requester-check")]
    pub validating_webhook_configuration: String,
    /// Only custody objects of this namespace (default: every namespace).
    #[arg(long)]
    pub namespace: Option<String>,
    /// How long to wait for the controller's pods to stop.
    #[arg(long, default_value_t = 180)]
    pub wait_seconds: u64,
}

/// What an uninstall did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub webhook_configurations: usize,
    pub objects_released: usize,
    pub secrets_released: usize,
    pub namespaces_unmarked: usize,
    /// Pods whose `custody-wait` has not finished, `namespace/name`.
    pub held_pods: Vec<String>,
}

/// The credentials and key Secrets custody may have put its finalizer on, `(namespace, name)`:
/// each Backup's recorded ones and each BackupRepository's.
pub fn marked_secrets(
    backups: &[Backup],
    repositories: &[BackupRepository],
) -> BTreeSet<(String, String)> {
    let mut secrets = BTreeSet::new();
    for backup in backups {
        let namespace = backup.namespace().unwrap_or_default();
        for secret in crate::artifacts::held_secrets(backup, None) {
            secrets.insert((namespace.clone(), secret));
        }
    }
    for repository in repositories {
        let namespace = repository.namespace().unwrap_or_default();
        if let Some(secret) = repository.spec.credentials_secret() {
            secrets.insert((namespace.clone(), secret.to_string()));
        }
        if let Some(encryption) = &repository.spec.encryption {
            secrets.insert((namespace, encryption.key_secret_ref.name.clone()));
        }
    }
    secrets
}

/// Whether `pod` is still held by custody: its `custody-wait` init container has not
/// finished successfully.
pub fn held(pod: &Pod) -> bool {
    let injected = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.init_containers.as_ref())
        .is_some_and(|containers| {
            containers
                .iter()
                .any(|container| container.name == crate::inject::WAIT_CONTAINER)
        });
    if !injected {
        return false;
    }
    let finished = pod
        .status
        .as_ref()
        .and_then(|status| status.init_container_statuses.as_ref())
        .and_then(|statuses| {
            statuses
                .iter()
                .find(|status| status.name == crate::inject::WAIT_CONTAINER)
        })
        .and_then(|status| status.state.as_ref())
        .and_then(|state| state.terminated.as_ref())
        .is_some_and(|terminated| terminated.exit_code == 0);
    let over = matches!(
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    !finished && !over
}

/// Runs the uninstall; see the module's documentation.
pub async fn run(options: &UninstallOptions) -> Result<Summary> {
    let client = custody_kube::process::client(options.kubeconfig.as_deref()).await?;
    let mut summary = Summary::default();

    // 1. Nothing waits for the controller's webhooks any more.
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    summary.webhook_configurations +=
        delete_if_there(&mutating, &options.webhook_configuration).await? as usize;
    summary.webhook_configurations +=
        delete_if_there(&validating, &options.validating_webhook_configuration).await? as usize;

    // 2. No controller adds a finalizer again.
    stop_controller(&client, options).await?;

    // 3. custody's finalizers, and nobody else's.
    let backups: Vec<Backup> = list(&client, options.namespace.as_deref()).await?;
    let repositories: Vec<BackupRepository> = list(&client, options.namespace.as_deref()).await?;
    let restores: Vec<Restore> = list(&client, options.namespace.as_deref()).await?;
    let clusters: Vec<Cluster> = list(&client, options.namespace.as_deref()).await?;
    let plans: Vec<custody_kube::api::BackupPlan> =
        list(&client, options.namespace.as_deref()).await?;
    summary.objects_released += release_all(&client, &backups, crate::artifacts::FINALIZER).await?;
    summary.objects_released +=
        release_all(&client, &plans, crate::drills::decide::FINALIZER).await?;
    summary.objects_released +=
        release_all(&client, &restores, crate::restores::decide::FINALIZER).await?;
    summary.objects_released +=
        release_all(&client, &clusters, crate::clusters::decide::FINALIZER).await?;
    for (namespace, name) in marked_secrets(&backups, &repositories) {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let Some(secret) = secrets
            .get_opt(&name)
            .await
            .map_err(Error::read(format!("Secret {namespace}/{name}")))?
        else {
            continue;
        };
        summary.secrets_released +=
            release(&secrets, &secret, crate::artifacts::SECRET_FINALIZER).await? as usize;
    }

    // 4. No namespace keeps custody's mark.
    summary.namespaces_unmarked = unmark(&client, options.namespace.as_deref()).await?;

    let pods: Api<Pod> = match &options.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    summary.held_pods = pods
        .list(&ListParams::default())
        .await
        .map_err(Error::read("pods"))?
        .items
        .iter()
        .filter(|pod| held(pod))
        .map(|pod| format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()))
        .collect();
    Ok(summary)
}

/// Takes the restore mark off every namespace (or `only`) that carries it.
async fn unmark(client: &Client, only: Option<&str>) -> Result<usize> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let marked: Vec<String> = namespaces
        .list_metadata(&ListParams::default().labels(crate::restoring::LABEL))
        .await
        .map_err(Error::read("namespaces"))?
        .items
        .iter()
        .map(|namespace| namespace.name_any())
        .filter(|name| only.is_none_or(|only| only == name))
        .collect();
    let patch = crate::restoring::unmark_patch(None);
    for name in &marked {
        namespaces
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::Patch {
                object: format!("Namespace {name}"),
                source,
            })?;
    }
    Ok(marked.len())
}

async fn delete_if_there<K>(api: &Api<K>, name: &str) -> Result<bool>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(name, "deleted webhook configuration");
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(Error::Delete {
            object: name.to_string(),
            source,
        }),
    }
}

/// Scales the controller's Deployment to zero and waits until none of its pods is left.
async fn stop_controller(client: &Client, options: &UninstallOptions) -> Result<()> {
    let namespace = &options.install_namespace;
    let name = &options.deployment;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let what = format!("Deployment {namespace}/{name}");
    let Some(deployment) = deployments
        .get_opt(name)
        .await
        .map_err(Error::read(&what))?
    else {
        tracing::info!(
            deployment = what,
            "no controller Deployment: nothing to stop"
        );
        return Ok(());
    };
    deployments
        .patch_scale(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .map_err(|source| Error::Patch {
            object: format!("scale of {what}"),
            source,
        })?;
    let selector = deployment
        .spec
        .and_then(|spec| spec.selector.match_labels)
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    if selector.is_empty() {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let started = Instant::now();
    let limit = Duration::from_secs(options.wait_seconds);
    loop {
        let left: Vec<String> = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::read(format!("pods of {what}")))?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if started.elapsed() >= limit {
            return Err(Error::Webhook(format!(
                "the controller's pods {left:?} of {what} still run {} s after it was scaled to zero; no finalizer was removed (run again once they are gone)",
                limit.as_secs()
            )));
        }
        tracing::info!(
            pods = ?left,
            "waiting for the controller's pods to stop before removing custody's finalizers"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn list<K>(client: &Client, namespace: Option<&str>) -> Result<Vec<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
{
    let api: Api<K> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("{}s", K::kind(&()))))?
        .items)
}

/// Removes `finalizer` from each of `objects` that has it; how many.
async fn release_all<K>(client: &Client, objects: &[K], finalizer: &str) -> Result<usize>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
{
    let mut released = 0;
    for object in objects {
        let api: Api<K> = Api::namespaced(client.clone(), &object.namespace().unwrap_or_default());
        released += release(&api, object, finalizer).await? as usize;
    }
    Ok(released)
}

/// Removes `finalizer` from `object` (read again while someone else changes its list).
async fn release<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned,
{
    let what = format!("{} {}", K::kind(&()), object.name_any());
    let mut current = object.clone();
    for _ in 0..5 {
        if !current.finalizers().iter().any(|name| name == finalizer) {
            return Ok(false);
        }
        if crate::finalizers::remove(api, &current, finalizer, &what).await? {
            tracing::info!(object = what, finalizer, "released");
            return Ok(true);
        }
        match api
            .get_opt(&current.name_any())
            .await
            .map_err(Error::read(&what))?
        {
            Some(fresh) => current = fresh,
            None => return Ok(false),
        }
    }
    Err(Error::Webhook(format!(
        "the finalizers of {what} kept changing; run the uninstall again"
    )))
}

#[cfg(test)]
mod tests;
