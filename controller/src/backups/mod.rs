//! Backup: runs `custody-mover backup` in a Job pinned to the node where the Cluster's volume
//! is mounted, after recording the exact artifact keys in the Backup's status, and records
//! the result.
//!
//! Each reconciliation is [`gather`] (reads) → [`plan::plan`] (pure, table-tested) →
//! [`apply`] (writes); deletion is [`cleanup`].

pub mod apply;
pub mod cleanup;
pub mod consistency;
pub mod decide;
pub mod gather;
pub mod hooks;
mod imported;
pub mod job;
pub mod plan;

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};

use crate::error::{Error, Result};
use crate::reconciler::{self, Context};
use custody_kube::api::Backup;

/// The action Events of this reconciler name.
pub const ACTION: &str = "Backup";
/// Field manager of the Backup's status.
pub const FIELD_MANAGER: &str = "custody.io/backup";
/// Where the mover container sees the volume.
pub const SOURCE_PATH: &str = "/data";

/// What the backup reconciler needs besides the shared context.
pub struct BackupContext {
    pub base: Arc<Context>,
    /// How its Jobs run `custody-mover`.
    pub mover: crate::mover_job::MoverJob,
    /// The agents' gate CA (PEM), for the mover of a frozen copy.
    pub gate_ca: crate::gate_ca::Trust,
}

/// Reasons of the Backup's `Ready` condition.
pub mod reasons {
    pub use super::consistency::{APPLICATION_STARTED, CONSISTENCY_METHOD_REQUIRED};
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    pub const NO_REPOSITORY: &str = "NoRepository";
    pub const REPOSITORY_NOT_FOUND: &str = "RepositoryNotFound";
    pub const REPOSITORY_NOT_READY: &str = "RepositoryNotReady";
    pub const CLAIM_NOT_FOUND: &str = "ClaimNotFound";
    /// The Cluster's volumes cannot be backed up together as it is configured.
    pub const UNSUPPORTED_VOLUME_LAYOUT: &str = "UnsupportedVolumeLayout";
    pub const VOLUME_NOT_MOUNTED: &str = "VolumeNotMounted";
    pub const JOB_NAME_TAKEN: &str = "JobNameTaken";
    /// A Job of the Backup's name exists whose creation custody never recorded.
    pub const JOB_NOT_PROVEN: &str = "JobNotProven";
    pub const RUNNING: &str = "Running";
    pub const COMPLETED: &str = "Completed";
    /// The Job's pod does not start (image pull, configuration, scheduling).
    pub const JOB_POD_NOT_STARTING: &str = "JobPodNotStarting";
    /// A command's dump whose key is not in normal form (an empty, `.` or `..` segment).
    pub const KEY_NOT_NORMAL: &str = "KeyNotNormal";
}

/// Reconciles one Backup: gather, decide, apply (deletion is [`cleanup`]).
pub async fn reconcile(backup: Arc<Backup>, context: Arc<BackupContext>) -> Result<Action> {
    let context = &context;
    reconciler::on_fresh(&*backup, &context.base, |backup| async move {
        if backup.metadata.deletion_timestamp.is_some() {
            return cleanup::run(&backup, context).await;
        }
        if backup.spec.imported_snapshot.is_some() {
            // Nothing runs: the snapshot is opened and its record cached in the status.
            return imported::complete(&backup, context).await;
        }
        let facts = gather::facts(backup, context).await?;
        apply::apply(&facts, plan::plan(&facts), context).await
    })
    .await
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(backup: Arc<Backup>, error: &Error, context: Arc<BackupContext>) -> Action {
    reconciler::error_policy(&*backup, error, &context.base)
}

/// The controller: Backups, woken by their Jobs and by their movers' progress.
pub fn controller(
    context: Arc<BackupContext>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let client = context.base.client.clone();
    let backups: Api<Backup> = reconciler::scoped(client.clone(), namespace);
    let jobs: Api<Job> = reconciler::scoped(client.clone(), namespace);
    let agents: Api<custody_kube::api::NodeAgent> = Api::all(client);
    let controller = Controller::new(backups, watcher::Config::default());
    let store = controller.store();
    let controller = controller
        .owns(
            jobs,
            watcher::Config::default().labels(&format!(
                "{}={}",
                custody_proto::names::LABEL_ROLE,
                custody_proto::names::ROLE_BACKUP
            )),
        )
        .watches(agents, watcher::Config::default(), move |agent| {
            let owners = crate::transfer::owners(&agent);
            store
                .state()
                .into_iter()
                .filter(|backup| {
                    backup
                        .metadata
                        .uid
                        .as_ref()
                        .is_some_and(|uid| owners.contains(uid))
                })
                .map(|backup| kube::runtime::reflector::ObjectRef::from_obj(&*backup))
                .collect::<Vec<_>>()
        });
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}
