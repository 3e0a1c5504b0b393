//! Carrying out a Restore's [`Plan`] (and its teardown): every write of the restore
//! reconciler is here, in the order the plan documents.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::controller::Action;

use super::gather::TeardownFacts;
use super::plan::{Facts, Plan};
use super::{ACTION, FIELD_MANAGER, RestoreContext, decide, plan};
use crate::error::{Error, Result};
use crate::holds::{self, LeaseStep};
use custody_kube::api::Restore;

/// Carries out `plan`, decided on `facts`.
pub async fn apply(facts: &Facts, mut plan: Plan, context: &RestoreContext) -> Result<Action> {
    let restore = &facts.restore;
    let client = &context.base.client;
    let namespace = restore.namespace().unwrap_or_default();
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    let what = format!("Restore {namespace}/{}", restore.name_any());
    let restores: Api<Restore> = Api::namespaced(client.clone(), &namespace);
    if plan.add_finalizer {
        // Nothing is created before the finalizer is on; the write wakes us again.
        crate::finalizers::add(&restores, restore, decide::FINALIZER, &what).await?;
        return Ok(Action::await_change());
    }
    if plan.publish_gate_ca {
        crate::gate_ca::publish(
            &context.base.client,
            &namespace,
            context.gate_ca.current().as_deref(),
            FIELD_MANAGER,
        )
        .await?;
    }
    // Its Jobs take slots on their nodes: checked again under the controller's one lock, from
    // a fresh count, and held until they exist. Another reconciliation took a slot since the
    // plan was made: nothing is written, and the next plan sees it.
    let nodes: Vec<&str> = plan
        .jobs
        .iter()
        .filter_map(crate::mover_job::node_of)
        .collect();
    let _slots = match context
        .base
        .admission
        .admit(client, &nodes, facts.mover.movers_per_node)
        .await?
    {
        Ok(guard) => guard,
        Err((node, taken)) => {
            tracing::info!(
                namespace,
                name = restore.name_any(),
                node,
                taken,
                "a mover slot was taken meanwhile; deciding again"
            );
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    };
    let me = holds::holder("Restore", &uid);
    if plan.lease == LeaseStep::TakeFirst
        && let Some(cluster) = &facts.cluster
        && let Some(holder) =
            holds::lease::acquire(client, &context.base.leases, &namespace, cluster, &me).await?
    {
        plan = plan::cluster_busy(facts, &holder);
    }
    for job in &plan.jobs {
        crate::reconciler::create_job(client, &namespace, job).await?;
    }
    for (claim, how) in &plan.mark_claims {
        crate::reconciler::mark_verified_by_restore(
            client,
            &namespace,
            claim,
            how,
            &restore.name_any(),
            &uid,
        )
        .await?;
    }
    for (name, job_uid) in &plan.delete_jobs {
        delete_job(
            client,
            &namespace,
            name,
            job_uid,
            PropagationPolicy::Background,
        )
        .await?;
        tracing::info!(
            namespace,
            job = name,
            "deleted the prepareData Job of a completed restore"
        );
    }
    if let Some(status) = &plan.status {
        crate::status::apply(&restores, &restore.name_any(), FIELD_MANAGER, &what, status).await?;
        tracing::info!(
            namespace,
            name = restore.name_any(),
            phase = ?status.phase,
            progress = status.progress.as_deref().unwrap_or_default(),
            volumes = status
                .volumes
                .iter()
                .map(|volume| format!(
                    "{}={:?}#{}: {}",
                    volume.claim_name,
                    volume.state,
                    volume.attempts,
                    volume.message.as_deref().unwrap_or_default()
                ))
                .collect::<Vec<_>>()
                .join("; "),
            "restore status"
        );
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
        crate::reconciler::publish(&context.base, restore, ACTION, note).await?;
    }
    for pod in &plan.release {
        set_readiness_gate(context, &namespace, pod, &restore.name_any()).await?;
    }
    Ok(crate::reconciler::requeue(plan.requeue))
}

/// Sets the readiness gate condition of a pod whose restored volumes are all verified.
async fn set_readiness_gate(
    context: &RestoreContext,
    namespace: &str,
    pod: &str,
    restore: &str,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(context.base.client.clone(), namespace);
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "status": {"conditions": [{
            "type": crate::inject::READINESS_GATE,
            "status": "True",
            "reason": "RestoreVerified",
            "message": format!("every restored volume verified (Restore {restore})"),
            "lastTransitionTime": Time(Timestamp::now()),
        }]},
    });
    match api
        .patch_status(
            pod,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
    {
        Ok(_) => {}
        // Gone since it was listed: nothing to release.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(source) => {
            return Err(Error::PatchStatus {
                object: format!("Pod {namespace}/{pod}"),
                source,
            });
        }
    }
    tracing::info!(namespace, pod, "readiness gate set");
    Ok(())
}

/// Cancellation: delete this Restore's own Jobs (owner reference, label and UID checked by
/// [`decide::teardown`]), wait until they and their pods are gone, then remove only this
/// reconciler's finalizer.
pub async fn teardown(
    restore: &Restore,
    facts: &TeardownFacts,
    context: &RestoreContext,
) -> Result<Action> {
    let client = &context.base.client;
    let namespace = restore.namespace().unwrap_or_default();
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    if !restore.finalizers().iter().any(|f| f == decide::FINALIZER) {
        return Ok(Action::await_change());
    }
    let plan = decide::teardown(&facts.jobs, &facts.pods, &uid);
    for name in &plan.delete {
        // The precondition makes the API server refuse if the Job was replaced by another of
        // the same name since it was read.
        let Some(job) = facts
            .jobs
            .iter()
            .find(|job| job.metadata.name.as_ref() == Some(name))
        else {
            continue;
        };
        let Some(job_uid) = &job.metadata.uid else {
            continue;
        };
        delete_job(
            client,
            &namespace,
            name,
            job_uid,
            PropagationPolicy::Foreground,
        )
        .await?;
        tracing::info!(namespace, job = name, "deleted prepareData Job");
    }
    if plan.waiting {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // What this Restore verified keeps its record on the claims once the Restore is gone.
    let verified = restore
        .status
        .as_ref()
        .map(|status| decide::verified_claims(&status.volumes))
        .unwrap_or_default();
    let how = plan::verified_by(restore);
    let name = restore.name_any();
    for claim in &verified {
        crate::reconciler::mark_verified_by_restore(client, &namespace, claim, &how, &name, &uid)
            .await?;
    }
    let me = holds::holder("Restore", &uid);
    let leases = &context.base.leases;
    match &facts.cluster_uid {
        Some(cluster_uid) => holds::lease::release(client, leases, cluster_uid, &me).await?,
        None => holds::lease::release_any(client, leases, &me).await?,
    }
    let restores: Api<Restore> = Api::namespaced(client.clone(), &namespace);
    let what = format!("Restore {namespace}/{}", restore.name_any());
    crate::finalizers::remove(&restores, restore, decide::FINALIZER, &what).await?;
    tracing::info!(namespace, name = restore.name_any(), "restore torn down");
    Ok(Action::await_change())
}

/// Deletes this Restore's Job `name`, only if it still has `uid` (the API server refuses a
/// Job replaced by another of the same name since it was read); one already gone is fine.
async fn delete_job(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
    propagation: PropagationPolicy,
) -> Result<()> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        propagation_policy: Some(propagation),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match jobs.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(source) => Err(Error::Delete {
            object: format!("Job {namespace}/{name}"),
            source,
        }),
    }
}
