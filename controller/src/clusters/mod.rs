//! Cluster: a Cluster with `spec.restore` gets the restore-protection finalizer before
//! anything else, then a Restore it owns; its phase follows that Restore and its workload.
//! Deleting it cancels the restore: its own Restore is deleted and waited for, then the
//! finalizer goes.

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::conditions;
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::{self, Context};
use custody_kube::api::{Cluster, ClusterStatus, HasConditions, Restore, RestoreSpec};
use decide::{FINALIZER, RestoreFacts, Teardown, Workload};

/// Field manager of the Cluster's status.
pub const FIELD_MANAGER: &str = "custody.io/cluster";

/// The Restore a Cluster creates has the Cluster's name.
pub fn restore_name(cluster: &Cluster) -> String {
    cluster.name_any()
}

/// Reconciles one Cluster.
pub async fn reconcile(cluster: Arc<Cluster>, context: Arc<Context>) -> Result<Action> {
    let _measure = reconciler::Measure::start(&context.metrics, "Cluster");
    run(&cluster, &context).await
}

async fn event(
    context: &Context,
    cluster: &Cluster,
    warning: bool,
    reason: &str,
    text: String,
) -> Result<()> {
    let note = Note {
        warning,
        reason: reason.to_string(),
        text,
    };
    crate::reconciler::publish(context, cluster, "Restore", &note).await
}

async fn run(cluster: &Cluster, context: &Context) -> Result<Action> {
    let client = &context.client;
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let what = format!("Cluster {namespace}/{name}");
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &namespace);
    let restores: Api<Restore> = Api::namespaced(client.clone(), &namespace);
    let restore_name = restore_name(cluster);
    let read = |object: String| move |source| Error::Read { object, source };
    let restore = restores
        .get_opt(&restore_name)
        .await
        .map_err(read(format!("Restore {namespace}/{restore_name}")))?;
    let owned =
        |restore: &Restore| crate::ownership::controlled_by(&restore.metadata, "Cluster", &uid);

    if cluster.metadata.deletion_timestamp.is_some() {
        let has_finalizer = cluster.finalizers().iter().any(|f| f == FINALIZER);
        let facts = restore.as_ref().map(|restore| {
            (
                owned(restore),
                restore.metadata.deletion_timestamp.is_some(),
            )
        });
        return match decide::teardown(has_finalizer, facts) {
            Teardown::Nothing => Ok(Action::await_change()),
            Teardown::DeleteRestore => {
                let restore = restore.expect("teardown decided on an existing Restore");
                let params = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: restore.metadata.uid.clone(),
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
                event(
                    context,
                    cluster,
                    false,
                    "RestoreCancelled",
                    format!("Cluster deleted: Restore {restore_name} is cancelled and torn down"),
                )
                .await?;
                Ok(Action::requeue(Duration::from_secs(2)))
            }
            Teardown::WaitForRestore => Ok(Action::requeue(Duration::from_secs(2))),
            Teardown::RemoveFinalizer => {
                crate::finalizers::remove(&clusters, cluster, FINALIZER, &what).await?;
                tracing::info!(namespace, cluster = name, "restore protection released");
                Ok(Action::await_change())
            }
        };
    }

    if let Some(spec) = &cluster.spec.restore {
        if crate::finalizers::add(&clusters, cluster, FINALIZER, &what).await? {
            return Ok(Action::await_change());
        }
        if restore.is_none() {
            let owner = cluster.controller_owner_ref(&()).map(|mut owner| {
                owner.block_owner_deletion = Some(true);
                owner
            });
            let mut object = Restore::new(
                &restore_name,
                RestoreSpec {
                    cluster_ref: custody_kube::api::LocalObjectReference { name: name.clone() },
                    backup_ref: spec.backup_ref.clone(),
                    volume_restore_policy: spec.volume_restore_policy,
                },
            );
            object.metadata.owner_references = owner.map(|owner| vec![owner]);
            object.metadata.labels = Some(
                [(
                    crate::backups::decide::LABEL_CLUSTER_UID.to_string(),
                    uid.clone(),
                )]
                .into(),
            );
            match restores.create(&PostParams::default(), &object).await {
                Ok(_) => {
                    event(
                        context,
                        cluster,
                        false,
                        decide::reasons::RESTORE_CREATED,
                        format!(
                            "Restore {restore_name} restores Backup {} into this Cluster",
                            spec.backup_ref.name
                        ),
                    )
                    .await?;
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(source) => {
                    return Err(Error::Create {
                        object: format!("Restore {namespace}/{restore_name}"),
                        source,
                    });
                }
            }
        }
    }

    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let set_name = &cluster.spec.stateful_set_ref.name;
    let workload = match sets
        .get_opt(set_name)
        .await
        .map_err(read(format!("StatefulSet {namespace}/{set_name}")))?
    {
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
    let facts = restore.as_ref().map(|restore| RestoreFacts {
        owned: owned(restore),
        phase: restore.status.as_ref().and_then(|status| status.phase),
        progress: restore
            .status
            .as_ref()
            .and_then(|status| status.progress.clone()),
        failure: restore
            .conditions()
            .iter()
            .find(|condition| condition.type_ == decide::READY)
            .map(|condition| format!("{}: {}", condition.reason, condition.message)),
    });
    let view = decide::view(
        cluster
            .spec
            .restore
            .as_ref()
            .map(|spec| spec.backup_ref.name.as_str()),
        &restore_name,
        facts.as_ref(),
        workload,
        set_name,
    );

    let current = cluster.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    let generation = cluster.meta().generation;
    let mut wanted = vec![view.ready.clone()];
    wanted.extend(view.restored.clone());
    let conditions = wanted
        .iter()
        .map(|desired| {
            conditions::next(&current.conditions, desired, generation, now).unwrap_or_else(|| {
                current
                    .conditions
                    .iter()
                    .find(|condition| condition.type_ == desired.type_)
                    .cloned()
                    .expect("next() is None only when the condition exists")
            })
        })
        .collect::<Vec<_>>();
    let status = ClusterStatus {
        phase: Some(view.phase),
        restore_name: cluster.spec.restore.as_ref().map(|_| restore_name.clone()),
        conditions,
    };
    let mut compare = current.clone();
    compare.conditions.retain(|condition| {
        wanted
            .iter()
            .any(|desired| desired.type_ == condition.type_)
    });
    if compare != status {
        crate::status::apply(&clusters, &name, FIELD_MANAGER, &what, &status).await?;
        let previous = current.phase;
        if previous != Some(view.phase) {
            tracing::info!(namespace, cluster = name, phase = ?view.phase, "cluster phase");
            match view.phase {
                custody_kube::api::ClusterPhase::Failed => {
                    event(
                        context,
                        cluster,
                        true,
                        view.ready.reason,
                        view.ready.message.clone(),
                    )
                    .await?;
                }
                custody_kube::api::ClusterPhase::Running if cluster.spec.restore.is_some() => {
                    event(
                        context,
                        cluster,
                        false,
                        "Running",
                        format!("restored, verified and ready: {}", view.ready.message),
                    )
                    .await?;
                }
                _ => {}
            }
        }
    }
    Ok(match view.phase {
        custody_kube::api::ClusterPhase::Running | custody_kube::api::ClusterPhase::Failed => {
            Action::requeue(Duration::from_secs(300))
        }
        _ => Action::requeue(Duration::from_secs(10)),
    })
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
