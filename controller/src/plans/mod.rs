//! BackupPlan: creates a Backup for each schedule slot (one name per slot, so never twice),
//! skips a slot while the previous run is active (`Forbid`) or past its starting deadline,
//! and prunes the plan's finished Backups by count and age through normal deletion.
//!
//! Each reconciliation lists the plan's Backups, decides with [`plan::plan`] (pure,
//! table-tested) and applies the plan.

pub mod decide;
pub mod plan;

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};

use crate::error::{Error, Result};
use crate::reconciler::{self, Context};
use custody_kube::api::{Backup, BackupPlan};
use decide::{LABEL_PLAN, LABEL_PLAN_UID};

/// The action Events of this reconciler name.
pub const ACTION: &str = "Schedule";
/// Field manager of the plan's status.
pub const FIELD_MANAGER: &str = "custody.io/backup-plan";

/// Reasons of the plan's `Ready` condition and its Events.
pub mod reasons {
    pub const SCHEDULED: &str = "Scheduled";
    pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
    pub const INVALID_RETENTION: &str = "InvalidRetention";
    pub const SUSPENDED: &str = "Suspended";
    pub const PREVIOUS_RUN_ACTIVE: &str = "PreviousRunActive";
    pub const MISSED_SCHEDULE: &str = "MissedSchedule";
    pub const PRUNED: &str = "Pruned";
    /// Neither the plan nor its Cluster names how to copy a running application, and no
    /// command: the runs would need a person to stop it.
    pub const CONSISTENCY_METHOD_REQUIRED: &str = "ConsistencyMethodRequired";
}

/// Reconciles one plan: gather, decide, apply.
pub async fn reconcile(plan: Arc<BackupPlan>, context: Arc<Context>) -> Result<Action> {
    let _measure = reconciler::Measure::start(&context.metrics, "BackupPlan");
    let namespace = plan.namespace().unwrap_or_default();
    let name = plan.name_any();
    let uid = plan.metadata.uid.clone().unwrap_or_default();
    let backups: Api<Backup> = Api::namespaced(context.client.clone(), &namespace);
    let runs = backups
        .list(&ListParams::default().labels(&format!("{LABEL_PLAN_UID}={uid}")))
        .await
        .map_err(Error::read(format!("Backups of plan {namespace}/{name}")))?
        .items;
    let cluster_name = &plan.spec.cluster_ref.name;
    let cluster = Api::<custody_kube::api::Cluster>::namespaced(context.client.clone(), &namespace)
        .get_opt(cluster_name)
        .await
        .map_err(Error::read(format!("Cluster {namespace}/{cluster_name}")))?;
    let facts = plan::Facts {
        plan: (*plan).clone(),
        now: Timestamp::now(),
        runs,
        cluster,
    };
    let decided = plan::plan(&facts)?;

    for prune in &decided.prune {
        let parameters = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(prune.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match backups.delete(&prune.name, &parameters).await {
            Ok(_) => {
                tracing::info!(namespace, plan = name, backup = prune.name, "pruned");
                reconciler::publish(&context, &*plan, ACTION, &prune.note).await?;
            }
            Err(kube::Error::Api(error)) if error.code == 404 || error.code == 409 => {}
            Err(source) => {
                return Err(Error::Delete {
                    object: format!("Backup {namespace}/{}", prune.name),
                    source,
                });
            }
        }
    }
    if let Some((backup, note)) = &decided.create {
        match backups.create(&PostParams::default(), backup).await {
            Ok(_) => reconciler::publish(&context, &*plan, ACTION, note).await?,
            // The slot's run exists already: created before a restart.
            Err(kube::Error::Api(error)) if error.code == 409 => {}
            Err(source) => {
                return Err(Error::Create {
                    object: format!("Backup {namespace}/{}", backup.name_any()),
                    source,
                });
            }
        }
    }
    if let Some(status) = &decided.status {
        let plans: Api<BackupPlan> = Api::namespaced(context.client.clone(), &namespace);
        let what = format!("BackupPlan {namespace}/{name}");
        crate::status::apply(&plans, &name, FIELD_MANAGER, &what, status).await?;
    }
    for note in &decided.events {
        reconciler::publish(&context, &*plan, ACTION, note).await?;
    }
    Ok(reconciler::requeue(decided.requeue))
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(plan: Arc<BackupPlan>, error: &Error, context: Arc<Context>) -> Action {
    reconciler::error_policy(&*plan, error, &context)
}

/// The controller: plans, woken by their Backups' changes.
pub fn controller(
    context: Arc<Context>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let client = context.client.clone();
    let plans: Api<BackupPlan> = reconciler::scoped(client.clone(), namespace);
    let backups: Api<Backup> = reconciler::scoped(client, namespace);
    let controller = Controller::new(plans, watcher::Config::default()).watches(
        backups,
        watcher::Config::default().labels(LABEL_PLAN),
        |backup| {
            let plan = backup.labels().get(LABEL_PLAN).cloned();
            let namespace = backup.namespace();
            plan.map(|plan| {
                let reference = ObjectRef::<BackupPlan>::new(&plan);
                match namespace {
                    Some(namespace) => reference.within(&namespace),
                    None => reference,
                }
            })
        },
    );
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}
