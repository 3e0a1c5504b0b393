//! Cluster: a Cluster with `spec.restore` gets the restore-protection finalizer before
//! anything else, then a Restore it owns; its phase follows that Restore and its workload.
//! Deleting it cancels the restore: its own Restore is deleted and waited for, then the
//! finalizer goes.
//!
//! Each reconciliation reads the Restore and the StatefulSet, decides with [`plan::plan`]
//! (pure, table-tested) and applies the plan.

pub mod decide;
pub mod plan;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};

use crate::error::{Error, Result};
use crate::reconciler::{self, Context};
use custody_kube::api::{Cluster, Restore};
use decide::{FINALIZER, Workload};

/// The action Events of this reconciler name.
pub const ACTION: &str = "Restore";
/// Field manager of the Cluster's status.
pub const FIELD_MANAGER: &str = "custody.io/cluster";

pub use crate::restoring::restore_name;

/// Reconciles one Cluster: gather, decide, apply.
pub async fn reconcile(cluster: Arc<Cluster>, context: Arc<Context>) -> Result<Action> {
    let _measure = reconciler::Measure::start(&context.metrics, "Cluster");
    let facts = gather(&cluster, &context.client).await?;
    apply(&facts, plan::plan(&facts), &context).await
}

/// Reads the Cluster's Restore and its StatefulSet.
async fn gather(cluster: &Cluster, client: &kube::Client) -> Result<plan::Facts> {
    let namespace = cluster.namespace().unwrap_or_default();
    let restore_name = restore_name(cluster);
    let restore = Api::<Restore>::namespaced(client.clone(), &namespace)
        .get_opt(&restore_name)
        .await
        .map_err(Error::read(format!("Restore {namespace}/{restore_name}")))?;
    let set_name = &cluster.spec.stateful_set_ref.name;
    let set = Api::<StatefulSet>::namespaced(client.clone(), &namespace)
        .get_opt(set_name)
        .await
        .map_err(Error::read(format!("StatefulSet {namespace}/{set_name}")))?;
    let workload = match set {
        None => Workload::Missing,
        Some(set) => Workload::Replicas {
            wanted: set
                .spec
                .as_ref()
                .and_then(|spec| spec.replicas)
                .unwrap_or(1),
            ready: set
                .status
                .as_ref()
                .and_then(|status| status.ready_replicas)
                .unwrap_or(0),
        },
    };
    Ok(plan::Facts {
        cluster: cluster.clone(),
        now: Timestamp::now(),
        restore,
        workload,
    })
}

/// Carries out `plan` in the order it documents.
async fn apply(facts: &plan::Facts, plan: plan::Plan, context: &Context) -> Result<Action> {
    let cluster = &facts.cluster;
    let client = &context.client;
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let what = format!("Cluster {namespace}/{name}");
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &namespace);
    let restores: Api<Restore> = Api::namespaced(client.clone(), &namespace);
    let restore_name = restore_name(cluster);
    if plan.add_finalizer {
        crate::finalizers::add(&clusters, cluster, FINALIZER, &what).await?;
        return Ok(Action::await_change());
    }
    // Before its Restore exists, and while it runs: the restore gate sees every pod of a
    // namespace under restore (a Cluster admitted by the requester webhook is marked already).
    if cluster.metadata.deletion_timestamp.is_none()
        && crate::restoring::restoring(cluster, facts.restore.as_slice())
    {
        crate::restoring::mark(client, &namespace).await?;
    }
    if let Some((restore, note)) = &plan.create_restore {
        match restores.create(&PostParams::default(), restore).await {
            Ok(_) => reconciler::publish(context, cluster, ACTION, note).await?,
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(Error::Create {
                    object: format!("Restore {namespace}/{restore_name}"),
                    source,
                });
            }
        }
    }
    if let Some(uid) = &plan.delete_restore {
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match restores.delete(&restore_name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(source) => {
                return Err(Error::Delete {
                    object: format!("Restore {namespace}/{restore_name}"),
                    source,
                });
            }
        }
        tracing::info!(
            namespace,
            cluster = name,
            restore = restore_name,
            "cancelling restore"
        );
    }
    if plan.remove_finalizer {
        crate::finalizers::remove(&clusters, cluster, FINALIZER, &what).await?;
        tracing::info!(namespace, cluster = name, "restore protection released");
    }
    if let Some(status) = &plan.status {
        crate::status::apply(&clusters, &name, FIELD_MANAGER, &what, status).await?;
        if cluster.status.as_ref().and_then(|status| status.phase) != status.phase {
            tracing::info!(namespace, cluster = name, phase = ?status.phase, "cluster phase");
        }
    }
    for note in &plan.events {
        reconciler::publish(context, cluster, ACTION, note).await?;
    }
    Ok(reconciler::requeue(plan.requeue))
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(cluster: Arc<Cluster>, error: &Error, context: Arc<Context>) -> Action {
    reconciler::error_policy(&*cluster, error, &context)
}

/// The controller: Clusters, woken by their Restores and StatefulSets.
pub fn controller(
    context: Arc<Context>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let client = context.client.clone();
    let clusters: Api<Cluster> = reconciler::scoped(client.clone(), namespace);
    let restores: Api<Restore> = reconciler::scoped(client.clone(), namespace);
    let sets: Api<StatefulSet> = reconciler::scoped(client, namespace);
    let controller = Controller::new(clusters, watcher::Config::default());
    let store = controller.store();
    let controller = controller
        .owns(restores, watcher::Config::default())
        .watches(sets, watcher::Config::default(), move |set: StatefulSet| {
            let namespace = set.namespace();
            let name = set.name_any();
            store
                .state()
                .into_iter()
                .filter(|cluster| {
                    cluster.namespace() == namespace && cluster.spec.stateful_set_ref.name == name
                })
                .map(|cluster| kube::runtime::reflector::ObjectRef::from_obj(&*cluster))
                .collect::<Vec<_>>()
        });
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}
