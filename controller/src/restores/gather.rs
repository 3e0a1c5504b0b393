//! The reads of one reconciliation of a Restore, into [`Facts`]. What is read depends only on
//! what was read before it (the repository the Backup names, the Jobs the status names), never
//! on a decision.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::RestoreContext;
use super::decide::{self, JobFact, LABEL_RESTORE_UID};
use super::plan::{AgentHealth, Facts};
use crate::backups::decide::{JobState, job_state};
use crate::error::{Error, Result};
use custody_kube::api::{
    Backup, BackupRepository, Cluster, NodeAgent, ReportedVolume, Restore, RestorePhase,
};
use custody_proto::reasons::VolumeFailure;

/// Reads what [`super::plan::plan`] decides on.
pub async fn facts(restore: Restore, context: &RestoreContext) -> Result<Facts> {
    let client = &context.base.client;
    let namespace = restore.namespace().unwrap_or_default();
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    let cluster_name = &restore.spec.cluster_ref.name;
    let cluster = Api::<Cluster>::namespaced(client.clone(), &namespace)
        .get_opt(cluster_name)
        .await
        .map_err(Error::read(format!("Cluster {namespace}/{cluster_name}")))?;
    let mut nodes = BTreeMap::new();
    let mut movers: BTreeMap<String, Vec<custody_kube::api::ReportedMover>> = BTreeMap::new();
    let agents: Vec<(String, Vec<ReportedVolume>)> = Api::<NodeAgent>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::read("NodeAgents"))?
        .items
        .into_iter()
        .map(|agent| {
            let status = agent.status.unwrap_or_default();
            nodes.insert(
                agent.spec.node_name.clone(),
                AgentHealth {
                    ready: status.conditions.iter().any(|condition| {
                        condition.type_ == crate::conditions::types::READY
                            && condition.status == "True"
                    }),
                    last_heartbeat: status.last_heartbeat_time.map(|time| time.0),
                },
            );
            movers.insert(agent.spec.node_name.clone(), status.movers);
            let volumes = status.restored_volumes;
            for volume in &volumes {
                if let Some(reason) = &volume.reason
                    && VolumeFailure::known(reason).is_none()
                {
                    tracing::warn!(
                        node = agent.spec.node_name,
                        reason,
                        "an agent reports a reason this controller does not know"
                    );
                }
            }
            (agent.spec.node_name, volumes)
        })
        .collect();
    // The pods the agents report under this Restore, read by name: their readiness gates are
    // set from the reports, whatever labels someone may have removed from them.
    let pods_api = Api::<Pod>::namespaced(client.clone(), &namespace);
    let mut pods = Vec::new();
    for name in decide::reported_pods(
        agents
            .iter()
            .map(|(node, volumes)| (node.as_str(), volumes.as_slice())),
        &namespace,
        &uid,
    ) {
        if let Some(pod) = pods_api
            .get_opt(&name)
            .await
            .map_err(Error::read(format!("Pod {namespace}/{name}")))?
        {
            pods.push(pod);
        }
    }
    let mut facts = Facts {
        restore,
        now: Timestamp::now(),
        mover: context.mover.clone(),
        cluster,
        agents,
        backup: None,
        repository: None,
        replicas: None,
        backups: Vec::new(),
        jobs: Vec::new(),
        pods,
        finished_jobs: Vec::new(),
        unmarked_claims: Vec::new(),
        nodes,
        workload_pods: BTreeMap::new(),
        unheld_pods: Vec::new(),
        job_problems: BTreeMap::new(),
        job_nodes: BTreeMap::new(),
        job_finished: BTreeMap::new(),
        mover_slots: BTreeMap::new(),
        transfer_reports: BTreeMap::new(),
    };
    let status = facts.restore.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        Some(RestorePhase::Completed | RestorePhase::Failed)
    ) {
        // A final Restore only keeps its pods' gates and cleans up its Jobs.
        facts.finished_jobs = list(
            &Api::<Job>::namespaced(client.clone(), &namespace),
            &uid,
            "Jobs",
        )
        .await?;
        if status.phase == Some(RestorePhase::Completed) {
            for claim in decide::verified_claims(&status.volumes) {
                let annotations =
                    crate::reconciler::claim_annotations(client, &namespace, &claim).await?;
                if decide::needs_record(annotations.as_ref(), &uid) {
                    facts.unmarked_claims.push(claim);
                }
            }
        }
        return Ok(facts);
    }

    if facts.mover.movers_per_node > 0 {
        facts.mover_slots = crate::node_slots::read(client).await?;
    }
    let backups: Api<Backup> = Api::namespaced(client.clone(), &namespace);
    let backup_name = &facts.restore.spec.backup_ref.name;
    facts.backup = backups
        .get_opt(backup_name)
        .await
        .map_err(Error::read(format!("Backup {namespace}/{backup_name}")))?;
    if let Some(artifact) = facts
        .backup
        .as_ref()
        .and_then(|backup| backup.status.as_ref())
        .and_then(|status| status.artifact.as_ref())
    {
        facts.repository = Api::<BackupRepository>::namespaced(client.clone(), &namespace)
            .get_opt(&artifact.repository)
            .await
            .map_err(Error::read(format!(
                "BackupRepository {namespace}/{}",
                artifact.repository
            )))?;
    }
    if let Some(cluster) = &facts.cluster {
        let set_name = &cluster.spec.stateful_set_ref.name;
        facts.replicas = Api::<StatefulSet>::namespaced(client.clone(), &namespace)
            .get_opt(set_name)
            .await
            .map_err(Error::read(format!("StatefulSet {namespace}/{set_name}")))?
            .map(|set| set.spec.and_then(|spec| spec.replicas).unwrap_or(1));
        // Where each of its pods is scheduled: a pod on a node without a working agent is
        // named in the status rather than waited for in silence.
        for ordinal in 0..facts.replicas.unwrap_or(0).max(0) {
            let name = format!("{set_name}-{ordinal}");
            // A pod the agents report was read above already.
            let pod = match facts.pods.iter().find(|pod| pod.name_any() == name) {
                Some(pod) => Some(pod.clone()),
                None => pods_api
                    .get_opt(&name)
                    .await
                    .map_err(Error::read(format!("Pod {namespace}/{name}")))?,
            };
            if let Some(pod) = pod {
                if pod.labels().get(LABEL_RESTORE_UID) != Some(&uid)
                    && pod.metadata.deletion_timestamp.is_none()
                {
                    facts.unheld_pods.push(name.clone());
                }
                let node = pod.spec.and_then(|spec| spec.node_name);
                facts.workload_pods.insert(name, node);
            }
        }
    }
    if !status.volumes.iter().any(|volume| volume.attempts > 0) {
        // Not started: the hold looks at the Cluster's running backups.
        facts.backups = backups
            .list(&ListParams::default())
            .await
            .map_err(Error::read(format!("Backups in {namespace}")))?
            .items;
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    for name in status
        .volumes
        .iter()
        .filter_map(|volume| volume.job_name.as_ref())
    {
        let job = jobs
            .get_opt(name)
            .await
            .map_err(Error::read(format!("Job {namespace}/{name}")))?;
        let fact = match &job {
            None => JobFact::Missing,
            // A Job someone is deleting is as good as gone once its pods are.
            Some(job) if decide::owned_job(job, &uid) => JobFact::Owned(job_state(job)),
            Some(_) => JobFact::Foreign,
        };
        if let Some(node) = job.as_ref().and_then(crate::mover_job::node_of) {
            facts.job_nodes.insert(name.clone(), node.to_string());
        }
        if fact == JobFact::Owned(JobState::Succeeded)
            && let Some(finished) = job.as_ref().and_then(finished_at)
        {
            facts.job_finished.insert(name.clone(), finished);
        }
        if fact == JobFact::Owned(JobState::Running) {
            let pods = crate::mover_job::pods_of(client, &namespace, name, job.as_ref()).await?;
            if let Some(problem) =
                crate::mover_job::start_problem(client, &namespace, name, job.as_ref(), &pods)
                    .await?
            {
                facts.job_problems.insert(name.clone(), problem);
            }
            // How far its mover has come, from the agent of the node the Job is pinned to.
            if let Some(node) = facts.job_nodes.get(name)
                && let Some(found) = movers
                    .get(node)
                    .and_then(|movers| crate::transfer::find(movers, &namespace, name, &uid, &pods))
            {
                facts
                    .transfer_reports
                    .insert(name.clone(), (found.clone(), node.clone()));
            }
        }
        facts.jobs.push((name.clone(), fact));
    }
    Ok(facts)
}

/// When a succeeded Job finished: its completion time, or when it was marked complete.
fn finished_at(job: &Job) -> Option<Timestamp> {
    let status = job.status.as_ref()?;
    status
        .completion_time
        .as_ref()
        .map(|time| time.0)
        .or_else(|| {
            status
                .conditions
                .iter()
                .flatten()
                .filter(|condition| {
                    matches!(condition.type_.as_str(), "Complete" | "SuccessCriteriaMet")
                        && condition.status == "True"
                })
                .filter_map(|condition| condition.last_transition_time.as_ref())
                .map(|time| time.0)
                .min()
        })
}

/// What cancelling a Restore reads.
pub struct TeardownFacts {
    /// Jobs labelled with the Restore's UID (owned or not: [`decide::teardown`] checks).
    pub jobs: Vec<Job>,
    /// Pods labelled with the Restore's UID.
    pub pods: Vec<Pod>,
    /// The Cluster's UID, when it still exists (its Lease is given back).
    pub cluster_uid: Option<String>,
}

/// Reads what a teardown decides on.
pub async fn teardown(restore: &Restore, client: &Client) -> Result<TeardownFacts> {
    let namespace = restore.namespace().unwrap_or_default();
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    let jobs = list(
        &Api::<Job>::namespaced(client.clone(), &namespace),
        &uid,
        "Jobs",
    )
    .await?;
    let pods = list(
        &Api::<Pod>::namespaced(client.clone(), &namespace),
        &uid,
        "pods",
    )
    .await?;
    // Best effort: a claim left behind names a run that is gone, and is taken over.
    let cluster_uid = Api::<Cluster>::namespaced(client.clone(), &namespace)
        .get_opt(&restore.spec.cluster_ref.name)
        .await
        .ok()
        .flatten()
        .and_then(|cluster| cluster.metadata.uid);
    Ok(TeardownFacts {
        jobs,
        pods,
        cluster_uid,
    })
}

/// The objects labelled with the Restore's UID.
async fn list<K>(api: &Api<K>, uid: &str, what: &str) -> Result<Vec<K>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    Ok(api
        .list(&ListParams::default().labels(&format!("{LABEL_RESTORE_UID}={uid}")))
        .await
        .map_err(Error::read(format!("{what} of Restore {uid}")))?
        .items)
}
