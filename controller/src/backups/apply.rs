//! Carrying out a Backup's [`Plan`]: every write of the backup reconciler outside deletion,
//! in the order the plan documents.

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::plan::{self, Facts, Plan};
use super::{ACTION, BackupContext, FIELD_MANAGER, cleanup};
use crate::error::Result;
use crate::holds::{self, LeaseStep};
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
    // The plan that starts the Backup on a node takes a slot there: checked again under the
    // controller's one lock, from a fresh read, held until the Backup is recorded Running on
    // that node (from then on every read counts it, its pre hook and its Job included).
    let starts = facts
        .backup
        .status
        .as_ref()
        .is_none_or(|status| status.start_time.is_none());
    let node = plan
        .status
        .as_ref()
        .filter(|status| starts && status.start_time.is_some())
        .and_then(|status| status.node_name.clone());
    let slot = match node {
        Some(node) => match context
            .base
            .admission
            .admit(client, &[node.as_str()], facts.mover.movers_per_node)
            .await?
        {
            Ok(guard) => guard,
            Err((node, taken)) => {
                plan = plan::movers_busy(facts, &node, taken);
                None
            }
        },
        None => None,
    };
    let me = holds::holder("Backup", &uid);
    if plan.lease == LeaseStep::TakeFirst
        && let Some(cluster) = &facts.cluster
        && let Some(holder) =
            holds::lease::acquire(client, &context.base.leases, &namespace, cluster, &me).await?
    {
        plan = plan::cluster_busy(facts, &holder);
    }
    if let Some(secret) = &plan.hold_secret {
        cleanup::hold_secret(client, &namespace, secret).await?;
    }
    if let Some(status) = &plan.status {
        let written =
            crate::status::apply(&backups, &backup.name_any(), FIELD_MANAGER, &what, status)
                .await?;
        // A Job is recorded before it is created; a CRD that drops the record would make every
        // frozen copy's mover refused: stop here, saying what to do.
        let manifests = |status: Option<&custody_kube::api::BackupStatus>| {
            status
                .and_then(|status| status.artifact.as_ref())
                .and_then(|artifact| artifact.snapshot.as_ref())
                .map_or(0, |snapshot| snapshot.volume_manifests.len())
        };
        let written = written.status;
        if status.job.is_some()
            && written
                .as_ref()
                .and_then(|status| status.job.as_ref())
                .is_none()
        {
            return Err(crate::error::Error::OutdatedSchema {
                object: what,
                field: "status.job".into(),
            });
        }
        // Each volume's manifest is what its restored claims are verified against: a CRD that
        // drops them leaves a Backup of several volumes that no Restore can use.
        if manifests(Some(status)) > 0 && manifests(written.as_ref()) == 0 {
            return Err(crate::error::Error::OutdatedSchema {
                object: what,
                field: "status.artifact.snapshot.volumeManifests".into(),
            });
        }
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
    drop(slot);
    if plan.publish_gate_ca {
        crate::gate_ca::publish(
            client,
            &namespace,
            context.gate_ca.current().as_deref(),
            FIELD_MANAGER,
        )
        .await?;
    }
    if let Some(run) = &plan.hook {
        let result = super::hooks::exec(client, &namespace, run).await;
        tracing::info!(
            namespace,
            name = backup.name_any(),
            hook = ?run.phase,
            succeeded = result.succeeded,
            message = result.message,
            "backup hook"
        );
        if !result.succeeded {
            let note = crate::events::Note::warning(
                "HookFailed",
                format!(
                    "the {} hook failed: {}",
                    match run.phase {
                        super::hooks::Phase::Pre => "pre",
                        super::hooks::Phase::Post => "post",
                    },
                    result.message
                ),
            );
            crate::reconciler::publish(&context.base, backup, ACTION, &note).await?;
        }
        let mut status = plan
            .status
            .clone()
            .or_else(|| backup.status.clone())
            .unwrap_or_default();
        let hooks = status.hooks.get_or_insert_default();
        match run.phase {
            super::hooks::Phase::Pre => hooks.pre = Some(result),
            super::hooks::Phase::Post => hooks.post = Some(result),
        }
        crate::status::apply(&backups, &backup.name_any(), FIELD_MANAGER, &what, &status).await?;
    }
    if let Some(job) = &plan.job
        && let Some(created) = crate::reconciler::create_job(client, &namespace, job).await?
    {
        // Its UID recorded as the API server answered: only this Job's pod may freeze the
        // volume, and only a Job of that UID is read as this Backup's. (Taken already, 409: the
        // next reconciliation finds it unproven, and the Backup fails saying so.) A failed
        // write is tried again at once: the next reconciliation could not prove the Job.
        let mut status = plan
            .status
            .clone()
            .or_else(|| backup.status.clone())
            .unwrap_or_default();
        status.job = Some(custody_kube::api::JobRef {
            name: created.name_any(),
            uid: created.metadata.uid.clone().unwrap_or_default(),
        });
        let mut attempt = 0;
        while let Err(error) =
            crate::status::apply(&backups, &backup.name_any(), FIELD_MANAGER, &what, &status).await
        {
            attempt += 1;
            if attempt == 3 {
                return Err(error);
            }
            tracing::warn!(namespace, name = backup.name_any(), %error, "recording the created Job; trying again");
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
    if let Some(why) = &plan.stop_job {
        let name = super::decide::job_name(&backup.name_any(), &uid);
        stop_job(client, &namespace, &name, why).await?;
    }
    for (claim, how) in &plan.mark_claims {
        crate::reconciler::mark_known_data(client, &namespace, claim, how).await?;
    }
    holds::lease::settle(
        client,
        &context.base.leases,
        facts.cluster.as_ref(),
        &me,
        &plan.lease,
    )
    .await?;
    for note in &plan.events {
        crate::reconciler::publish(&context.base, backup, ACTION, note).await?;
    }
    Ok(crate::reconciler::requeue(plan.requeue))
}

/// Stops Job `name` now: its deadline set to one second (past already), which makes the Job
/// controller fail it (`DeadlineExceeded`) and stop its pod; `why` goes on the Job first, and
/// the Backup's failure names it.
async fn stop_job(client: &kube::Client, namespace: &str, name: &str, why: &str) -> Result<()> {
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({
        "metadata": {"annotations": {super::decide::ANNOTATION_STOPPED: why}},
        "spec": {"activeDeadlineSeconds": 1},
    });
    jobs.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map_err(|source| crate::error::Error::Patch {
        object: format!("Job {namespace}/{name}"),
        source,
    })?;
    tracing::warn!(namespace, job = name, why, "stopped a backup Job");
    Ok(())
}
