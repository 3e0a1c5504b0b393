//! Carrying out a Backup's [`Plan`]: every write of the backup reconciler outside deletion,
//! in the order the plan documents.

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;

use super::plan::{self, Facts, LeaseStep, Plan};
use super::{ACTION, BackupContext, FIELD_MANAGER, cleanup};
use crate::error::{Error, Result};
use crate::holds;
use custody_kube::api::Backup;

/// Carries out `plan`, decided on `facts`.
pub async fn apply(facts: &Facts, mut plan: Plan, context: &BackupContext) -> Result<Action> {
    let backup = &facts.backup;
    let client = &context.base.client;
    let namespace = backup.namespace().unwrap_or_default();
    let uid = backup.metadata.uid.clone().unwrap_or_default();
    let what = format!("Backup {namespace}/{}", backup.name_any());
    let backups: Api<Backup> = Api::namespaced(client.clone(), &namespace);
    if plan.add_finalizer {
        crate::finalizers::add(&backups, backup, crate::artifacts::FINALIZER, &what).await?;
        return Ok(Action::await_change());
    }
    let me = holds::holder("Backup", &uid);
    if plan.lease == LeaseStep::TakeFirst
        && let Some(cluster) = &facts.cluster
        && let Some(holder) = holds::lease::acquire(client, &namespace, cluster, &me).await?
    {
        plan = plan::cluster_busy(facts, &holder);
    }
    if let Some(secret) = &plan.hold_secret {
        cleanup::hold_secret(client, &namespace, secret).await?;
    }
    if let Some(status) = &plan.status {
        crate::status::apply(&backups, &backup.name_any(), FIELD_MANAGER, &what, status).await?;
        let ready = status.conditions.first();
        tracing::info!(
            namespace,
            name = backup.name_any(),
            phase = ?status.phase,
            reason = ready.map(|ready| ready.reason.as_str()).unwrap_or_default(),
            message = ready.map(|ready| ready.message.as_str()).unwrap_or_default(),
            "backup status"
        );
    }
    if let Some(job) = &plan.job {
        let jobs = Api::namespaced(client.clone(), &namespace);
        match jobs.create(&PostParams::default(), job).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(Error::Create {
                    object: format!("Job {namespace}/{}", job.name_any()),
                    source,
                });
            }
        }
    }
    if plan.lease == LeaseStep::Release
        && let Some(cluster_uid) = facts
            .cluster
            .as_ref()
            .and_then(|cluster| cluster.metadata.uid.as_deref())
    {
        holds::lease::release(client, &namespace, cluster_uid, &me).await?;
    }
    for note in &plan.events {
        crate::reconciler::publish(&context.base, backup, ACTION, note).await?;
    }
    Ok(match plan.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}
