//! Restore: writes a Backup into a Cluster's volumes with one prepareData Job per volume,
//! pinned to the node where the agent reports the volume mounted, takes each volume's
//! verification from that agent, releases pods whose volumes are all verified, and on
//! deletion tears down only what it created.
//!
//! Each reconciliation is [`gather`] (reads) → [`plan::plan`] (pure, table-tested) →
//! [`apply`] (writes); cancellation is the same with [`decide::teardown`].

pub mod apply;
pub mod decide;
pub mod gather;
pub mod job;
pub mod plan;

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};

use crate::error::{Error, Result};
use crate::reconciler::{self, Context};
use custody_kube::api::{NodeAgent, Restore};

/// Field manager of the Restore's status.
pub const FIELD_MANAGER: &str = "custody.io/restore";
/// Where the mover container sees the volume.
pub const TARGET_PATH: &str = "/data";
/// ConfigMap, in each namespace under restore, holding the gate's CA as `ca.crt`.
pub use crate::gate_ca::CONFIG_MAP as GATE_CA_CONFIG_MAP;
/// The action Events of this reconciler name.
pub const ACTION: &str = "Restore";

/// Condition types of a Restore.
pub mod types {
    pub use crate::conditions::types::{READY, STALLED};
    pub const VERIFIED: &str = "Verified";
}

/// Reasons of a Restore's conditions and Events.
pub mod reasons {
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    pub const CLUSTER_MISMATCH: &str = "ClusterMismatch";
    pub const BACKUP_NOT_FOUND: &str = "BackupNotFound";
    pub const BACKUP_NOT_COMPLETED: &str = "BackupNotCompleted";
    pub const BACKUP_BEING_DELETED: &str = "BackupBeingDeleted";
    pub const REPOSITORY_NOT_FOUND: &str = "RepositoryNotFound";
    pub const STATEFUL_SET_NOT_FOUND: &str = "StatefulSetNotFound";
    pub const WAITING_FOR_PODS: &str = "WaitingForPods";
    pub const RESTORING: &str = "Restoring";
    pub const COMPLETED: &str = "Completed";
    pub const ALL_VERIFIED: &str = "AllVolumesVerified";
    pub const VERIFYING: &str = "Verifying";
    pub const AGENT_MISSING: &str = "AgentMissing";
    pub const AGENT_NOT_READY: &str = "AgentNotReady";
    pub const POD_NOT_HELD: &str = "PodNotHeld";
    pub use super::decide::JOB_POD_NOT_STARTING;
}

/// What the restore reconciler needs besides the shared context.
pub struct RestoreContext {
    pub base: Arc<Context>,
    /// How its Jobs run `custody-mover`.
    pub mover: crate::mover_job::MoverJob,
    /// PEM of the CA that signed the agents' gate certificates, published to namespaces
    /// under restore for `custody-wait`.
    pub gate_ca: crate::gate_ca::Trust,
}

/// Reconciles one Restore: gather, decide, apply.
pub async fn reconcile(restore: Arc<Restore>, context: Arc<RestoreContext>) -> Result<Action> {
    let context = &context;
    reconciler::on_fresh(&*restore, &context.base, |restore| async move {
        if restore.metadata.deletion_timestamp.is_some() {
            let facts = gather::teardown(&restore, &context.base.client).await?;
            return apply::teardown(&restore, &facts, context).await;
        }
        let facts = gather::facts(restore, context).await?;
        apply::apply(&facts, plan::plan(&facts), context).await
    })
    .await
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(restore: Arc<Restore>, error: &Error, context: Arc<RestoreContext>) -> Action {
    reconciler::error_policy(&*restore, error, &context.base)
}

/// The controller: Restores, woken by their Jobs and by agent reports.
pub fn controller(
    context: Arc<RestoreContext>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let client = context.base.client.clone();
    let restores: Api<Restore> = reconciler::scoped(client.clone(), namespace);
    let jobs: Api<Job> = reconciler::scoped(client.clone(), namespace);
    let agents: Api<NodeAgent> = Api::all(client);
    let controller = Controller::new(restores, watcher::Config::default());
    let store = controller.store();
    let controller = controller
        .owns(
            jobs,
            watcher::Config::default().labels(&format!(
                "{}={}",
                custody_proto::names::LABEL_ROLE,
                custody_proto::names::ROLE_PREPARE_DATA
            )),
        )
        .watches(
            agents,
            watcher::Config::default(),
            move |agent: NodeAgent| {
                // Every Restore a report on this node mentions, or whose mover it lists.
                let mut uids: std::collections::BTreeSet<String> = agent
                    .status
                    .iter()
                    .flat_map(|status| status.restored_volumes.iter())
                    .map(|volume| volume.restore_uid.clone())
                    .collect();
                uids.extend(crate::transfer::owners(&agent));
                store
                    .state()
                    .into_iter()
                    .filter(|restore| {
                        restore
                            .metadata
                            .uid
                            .as_ref()
                            .is_some_and(|uid| uids.contains(uid))
                    })
                    .map(|restore| kube::runtime::reflector::ObjectRef::from_obj(&*restore))
                    .collect::<Vec<_>>()
            },
        );
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}
