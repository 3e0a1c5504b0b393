//! The reads of one reconciliation of a Backup, into [`Facts`]. A read that only matters at
//! a later step is made only when what was read before leads there: the hold, the claim and
//! the node before the Job exists; the mover's report or the command's dumps once it ended.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::BackupContext;
use super::consistency::Mounter;
use super::decide::{self, JobState};
use super::plan::{Facts, JobFact, Listing, repository_name};
use crate::attribution::Candidate;
use crate::error::{Error, Result};
use custody_kube::api::{
    Backup, BackupPhase, BackupRepository, Capture, ClockMeasurement, Cluster, NodeAgent, Restore,
};

/// Reads what [`super::plan::plan`] decides on.
pub async fn facts(backup: Backup, context: &BackupContext) -> Result<Facts> {
    let client = &context.base.client;
    let namespace = backup.namespace().unwrap_or_default();
    let mut facts = Facts {
        backup,
        now: Timestamp::now(),
        mover: context.mover.clone(),
        cluster: None,
        repository: None,
        job: JobFact::Missing,
        restores: Vec::new(),
        claim_uid: None,
        claims_missing: Vec::new(),
        mount_paths: std::collections::BTreeMap::new(),
        mounted_on: None,
        started_during: None,
        clock: None,
        report: None,
        tool_failure: None,
        scratch_check: None,
        listing: None,
        job_pod_problem: None,
        tool_clock: decide::ToolClock::Unbounded,
        others: Vec::new(),
        origin_cluster: None,
        parent_snapshot: None,
        mover_slots: std::collections::BTreeMap::new(),
        transfer_report: None,
    };
    let phase = facts.backup.status.as_ref().and_then(|status| status.phase);
    if matches!(phase, Some(BackupPhase::Completed | BackupPhase::Failed)) {
        return Ok(facts);
    }
    let cluster_name = &facts.backup.spec.cluster_ref.name;
    facts.cluster = Api::<Cluster>::namespaced(client.clone(), &namespace)
        .get_opt(cluster_name)
        .await
        .map_err(Error::read(format!("Cluster {namespace}/{cluster_name}")))?;
    let Some(cluster) = &facts.cluster else {
        return Ok(facts);
    };
    if let Some(name) = repository_name(&facts.backup, cluster) {
        facts.repository = Api::<BackupRepository>::namespaced(client.clone(), &namespace)
            .get_opt(&name)
            .await
            .map_err(Error::read(format!("BackupRepository {namespace}/{name}")))?;
    }
    let Some(template) = cluster.spec.volume_claim_templates.first() else {
        return Ok(facts);
    };
    let claim = decide::claim_name(template, &cluster.spec.stateful_set_ref.name);
    let uid = facts.backup.metadata.uid.clone().unwrap_or_default();
    let job_name = decide::job_name(&facts.backup.name_any(), &uid);
    let job = Api::<Job>::namespaced(client.clone(), &namespace)
        .get_opt(&job_name)
        .await
        .map_err(Error::read(format!("Job {namespace}/{job_name}")))?;
    let recorded = facts
        .backup
        .status
        .as_ref()
        .and_then(|status| status.job.as_ref());
    facts.job = match &job {
        None => JobFact::Missing,
        Some(job) if !decide::owned_by(job, &uid) => JobFact::Foreign,
        Some(job) => match recorded {
            // Recorded as about to be created, never as created: custody cannot tell its own
            // from one someone else made under the name.
            Some(recorded) if recorded.uid.is_empty() => JobFact::Unproven,
            // Made again under the name after custody's own was deleted: not the recorded one.
            Some(recorded) if job.metadata.uid.as_ref() != Some(&recorded.uid) => JobFact::Foreign,
            // Recorded, or started by an older custody that recorded none.
            _ => JobFact::Owned(decide::job_state(job)),
        },
    };
    match &facts.job {
        JobFact::Missing => {
            let started = facts
                .backup
                .status
                .as_ref()
                .is_some_and(|status| status.start_time.is_some());
            if !started {
                facts.restores = Api::<Restore>::namespaced(client.clone(), &namespace)
                    .list(&ListParams::default())
                    .await
                    .map_err(Error::read(format!("Restores in {namespace}")))?
                    .items;
            }
            facts.claim_uid = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace)
                .get_opt(&claim)
                .await
                .map_err(Error::read(format!(
                    "PersistentVolumeClaim {namespace}/{claim}"
                )))?
                .and_then(|claim| claim.metadata.uid);
            // Every volume of the Cluster is backed up together: the others' claims must be
            // there too, and where the application mounts each (a symlink between them).
            if cluster.spec.volume_claim_templates.len() > 1 && facts.backup.spec.command.is_none()
            {
                let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace);
                for template in &cluster.spec.volume_claim_templates[1..] {
                    let other = decide::claim_name(template, &cluster.spec.stateful_set_ref.name);
                    if claims
                        .get_opt(&other)
                        .await
                        .map_err(Error::read(format!(
                            "PersistentVolumeClaim {namespace}/{other}"
                        )))?
                        .is_none()
                    {
                        facts.claims_missing.push(other);
                    }
                }
                let set_name = &cluster.spec.stateful_set_ref.name;
                let set = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(
                    client.clone(),
                    &namespace,
                )
                .get_opt(set_name)
                .await
                .map_err(Error::read(format!("StatefulSet {namespace}/{set_name}")))?;
                facts.mount_paths = set
                    .map(|set| decide::mount_paths(&set, &cluster.spec.volume_claim_templates))
                    .unwrap_or_default();
            }
            facts.mounted_on = mounted_on(client, &namespace, &claim).await?;
            if !started && let Some(mounter) = &facts.mounted_on {
                facts.clock = clock(client, &mounter.node).await;
            }
            if !started && facts.mover.movers_per_node > 0 {
                facts.mover_slots = crate::node_slots::read(client).await?;
            }
            if facts.backup.spec.command.is_none() {
                facts.origin_cluster = origin_cluster(client).await?;
                let repository_id = facts
                    .repository
                    .as_ref()
                    .and_then(|repository| repository.status.as_ref())
                    .and_then(|status| status.repository.as_ref())
                    .map(|repository| repository.id.clone());
                if let Some(repository_id) = repository_id {
                    let backups = Api::<Backup>::namespaced(client.clone(), &namespace)
                        .list(&ListParams::default())
                        .await
                        .map_err(Error::read(format!("Backups in {namespace}")))?
                        .items;
                    facts.parent_snapshot =
                        decide::parent_snapshot(&backups, &cluster.name_any(), &repository_id);
                }
            }
        }
        JobFact::Owned(JobState::Succeeded | JobState::Failed { .. }) => {
            match (&facts.backup.spec.command, &facts.repository) {
                (None, _) => {
                    let pods =
                        crate::mover_job::pods_of(client, &namespace, &job_name, job.as_ref())
                            .await?;
                    facts.report = report(&pods);
                    facts.tool_failure = job
                        .as_ref()
                        .and_then(decide::stopped)
                        .or_else(|| decide::tool_failure(&pods));
                    facts.scratch_check = decide::scratch_check(&pods);
                    let status = facts.backup.status.as_ref();
                    if status.and_then(|status| status.consistency) == Some(Capture::Hooks) {
                        // The post hook runs in the pod that mounts the claim now.
                        facts.mounted_on = mounted_on(client, &namespace, &claim).await?;
                    }
                    if status.and_then(|status| status.consistency) == Some(Capture::Stopped) {
                        let since = status.and_then(|status| status.start_time.clone());
                        facts.started_during =
                            started_since(client, &namespace, &claim, since).await?;
                    }
                }
                (Some(command), Some(repository)) => {
                    facts.listing = Some(listing(client, repository, &command.prefix).await?);
                    // Other runs in every namespace may share the bucket and prefix.
                    facts.others = Api::<Backup>::all(client.clone())
                        .list(&ListParams::default())
                        .await
                        .map_err(Error::read("Backups".to_string()))?
                        .items;
                }
                (Some(_), None) => {}
            }
        }
        JobFact::Owned(JobState::Running) => {
            let pods =
                crate::mover_job::pods_of(client, &namespace, &job_name, job.as_ref()).await?;
            facts.job_pod_problem =
                crate::mover_job::start_problem(client, &namespace, &job_name, job.as_ref(), &pods)
                    .await?;
            let timeout = super::consistency::chosen(
                facts.backup.spec.consistency.as_ref(),
                cluster.spec.consistency.as_ref(),
            )
            .and_then(|chosen| chosen.tool.as_ref())
            .and_then(|tool| tool.timeout_seconds);
            facts.tool_clock = match decide::orphaned_tool(&pods) {
                Some(why) => decide::ToolClock::Overdue(why),
                None => decide::tool_clock(&pods, timeout, facts.now),
            };
            facts.transfer_report =
                crate::transfer::reported(client, &namespace, &job_name, &uid, &pods).await;
        }
        JobFact::Foreign | JobFact::Unproven => {}
    }
    Ok(facts)
}

/// The UID of namespace `kube-system`: this Kubernetes cluster's identity in a snapshot.
async fn origin_cluster(client: &Client) -> Result<Option<String>> {
    Ok(
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .get_opt("kube-system")
            .await
            .map_err(Error::read("Namespace kube-system".to_string()))?
            .and_then(|namespace| namespace.metadata.uid),
    )
}

/// The application's pods in `namespace` that mount `claim`: every pod but custody's own
/// mover pods (a Job's pods with custody's role label).
async fn mounting(client: &Client, namespace: &str, claim: &str) -> Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("pods in {namespace}")))?
        .items
        .into_iter()
        .filter(|pod| {
            let custody_job = pod.labels().contains_key(custody_proto::names::LABEL_ROLE)
                && pod
                    .owner_references()
                    .iter()
                    .any(|owner| owner.kind == "Job" && owner.controller == Some(true));
            let mounts = pod
                .spec
                .iter()
                .flat_map(|spec| spec.volumes.iter().flatten())
                .any(|volume| {
                    volume
                        .persistent_volume_claim
                        .as_ref()
                        .is_some_and(|source| source.claim_name == claim)
                });
            mounts && !custody_job
        })
        .collect())
}

/// The running pod that mounts `claim`, and its node: a backup of it reads it there.
async fn mounted_on(client: &Client, namespace: &str, claim: &str) -> Result<Option<Mounter>> {
    Ok(mounting(client, namespace, claim)
        .await?
        .into_iter()
        .filter(|pod| {
            pod.status
                .as_ref()
                .and_then(|status| status.phase.as_deref())
                == Some("Running")
        })
        .find_map(|pod| {
            Some(Mounter {
                node: pod.spec.as_ref()?.node_name.clone()?,
                ip: pod.status.as_ref()?.pod_ip.clone(),
                stateful_set: pod
                    .owner_references()
                    .iter()
                    .find(|owner| owner.controller == Some(true) && owner.kind == "StatefulSet")
                    .map(|owner| owner.name.clone()),
                pod: pod.name_any(),
            })
        }))
}

/// A pod mounting `claim` that runs now or started at or after `since` (the copy's start):
/// the application was not stopped for the whole copy.
async fn started_since(
    client: &Client,
    namespace: &str,
    claim: &str,
    since: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Result<Option<String>> {
    Ok(mounting(client, namespace, claim)
        .await?
        .into_iter()
        .find(|pod| {
            let status = pod.status.as_ref();
            let running = status.and_then(|status| status.phase.as_deref()) == Some("Running");
            let started = status.and_then(|status| status.start_time.as_ref());
            running
                || started
                    .zip(since.as_ref())
                    .is_some_and(|(started, since)| started.0 >= since.0)
        })
        .map(|pod| pod.name_any()))
}

/// The clock offset the agent on `node` measured, if it has.
async fn clock(client: &Client, node: &str) -> Option<ClockMeasurement> {
    let agent = Api::<NodeAgent>::all(client.clone())
        .get_opt(node)
        .await
        .ok()
        .flatten()?;
    let status = agent.status?;
    Some(ClockMeasurement {
        offset_nanoseconds: status.clock_offset_nanoseconds?,
        round_trip_nanoseconds: status.round_trip_nanoseconds?,
        measured_at: status.last_heartbeat_time?,
    })
}

/// The mover's report: the termination message of the Job's pod.
pub(crate) fn report(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .flat_map(|pod| pod.status.iter())
        .flat_map(|status| status.container_statuses.iter().flatten())
        // A stream tool runs beside the mover; its message is its log, not a report.
        .filter(|container| container.name != "tool")
        .filter_map(|container| {
            container
                .state
                .as_ref()?
                .terminated
                .as_ref()?
                .message
                .clone()
        })
        .next_back()
}

/// What a command left under its prefix. An API server that cannot be read is an error (the
/// reconciliation is retried); a repository that cannot be read is the Backup's failure.
async fn listing(
    client: &Client,
    repository: &BackupRepository,
    command_prefix: &str,
) -> Result<std::result::Result<Listing, (&'static str, String)>> {
    let namespace = repository.namespace().unwrap_or_default();
    let prefix = decide::command_prefix(
        repository.spec.prefix.as_deref().unwrap_or_default(),
        command_prefix,
    );
    let credentials = match custody_kube::s3::credentials_of(client, repository).await {
        Ok(credentials) => credentials,
        Err(custody_kube::s3::CredentialsError::Read { source, name }) => {
            return Err(Error::read(format!("Secret {namespace}/{name}"))(source));
        }
        Err(error) => return Ok(Err(("CredentialsMissing", error.to_string()))),
    };
    let endpoint = custody_kube::s3::endpoint_of(repository);
    let s3 = match custody_kube::s3::client(&endpoint, &credentials) {
        Ok(s3) => s3,
        Err(error) => return Ok(Err(("InvalidRepository", error.to_string()))),
    };
    let mut listing = Listing::default();
    let mut token = None;
    for _ in 0..MAX_LIST_PAGES {
        let request = s3
            .list_objects_v2()
            .bucket(&endpoint.bucket)
            .prefix(format!("{prefix}/"))
            .set_continuation_token(token.clone())
            .send();
        let page = match tokio::time::timeout(LIST_PAGE_TIMEOUT, request).await {
            Ok(Ok(page)) => page,
            Ok(Err(error)) => {
                return Ok(Err(("ListFailed", custody_kube::s3::sdk_error(&error))));
            }
            Err(_) => {
                return Ok(Err((
                    "ListFailed",
                    format!(
                        "listing {prefix}/: {} did not answer within {}s",
                        endpoint.url,
                        LIST_PAGE_TIMEOUT.as_secs()
                    ),
                )));
            }
        };
        for object in page.contents() {
            let (Some(key), Some(modified)) = (object.key(), object.last_modified()) else {
                continue;
            };
            let nanos = modified.secs() * 1_000_000_000 + i64::from(modified.subsec_nanos());
            listing
                .sizes
                .insert(key.to_string(), object.size().unwrap_or_default());
            listing.candidates.push(Candidate {
                key: key.to_string(),
                last_modified: nanos,
            });
        }
        token = page.next_continuation_token().map(str::to_string);
        if token.is_none() {
            return Ok(Ok(listing));
        }
    }
    Ok(Err((
        "ListTooLarge",
        format!(
            "more than {MAX_LIST_PAGES} pages of objects under {prefix}/ (about {} objects); prune old dumps or give the command a prefix of its own",
            listing.candidates.len()
        ),
    )))
}

/// A command's prefix is listed in at most this many pages (of up to 1000 objects)...
const MAX_LIST_PAGES: usize = 100;
/// ...each within this time.
const LIST_PAGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);
