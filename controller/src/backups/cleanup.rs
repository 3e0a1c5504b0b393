//! Deleting a Backup: its artifact keys go only when [`crate::artifacts::contest`] proved them
//! its own against every other Backup read from the API server; never while a Restore reads
//! it; a failed delete keeps the Backup terminating and is tried again with a per-Backup
//! backoff and a Warning that names the skip annotation.
//!
//! One step is [`gather`] → [`plan`] (pure; [`crate::artifacts::step`] decides) → the writes,
//! and after the delete itself, [`after_delete`] (pure) says what follows.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;

use super::{BackupContext, FIELD_MANAGER};
use crate::artifacts::{self, Deleting, Step};
use crate::error::{Error, Result};
use crate::events::Note;
use custody_kube::api::{
    Artifact, Backup, BackupRepository, CleanupStatus, Destination, Restore, RestorePhase,
};

/// The action of this reconciler's Events.
const ACTION: &str = "DeleteArtifact";

/// Publishes an Event; best effort, as a namespace being deleted refuses new Events and the
/// cleanup must still finish there.
mod secrets;
use secrets::repository_secret;
pub use secrets::{hold_secret, release_secret};

async fn event(context: &BackupContext, backup: &Backup, note: &Note) -> Result<()> {
    if let Err(error) = crate::reconciler::publish(&context.base, backup, ACTION, note).await {
        tracing::info!(backup = backup.name_any(), reason = note.reason, note = note.text, %error, "event not published");
    }
    Ok(())
}

/// What one step of a Backup's deletion read.
#[derive(Clone, Debug)]
pub struct Facts {
    pub backup: Backup,
    pub now: Timestamp,
    /// Restores that are not over and read this Backup.
    pub readers: Vec<String>,
    /// The contest of the recorded keys (read only when no restore holds the deletion).
    pub contest: Option<artifacts::Contest>,
}

/// What one step of a Backup's deletion does.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Not this reconciler's to do (its finalizer is gone).
    Nothing,
    /// A restore reads the Backup: wait, saying so once (an Event, and the cleanup status).
    Wait { first: Option<Note> },
    /// Release the Backup without deleting anything.
    Release { note: Note },
    /// The last delete failed not long ago: try again after this backoff.
    Later(Duration),
    /// Delete these keys, then do what [`after_delete`] says.
    Delete { keys: Vec<String> },
}

/// How a delete of the artifact's keys ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Done at `endpoint`; `absent` keys were already gone.
    Deleted {
        endpoint: String,
        absent: Vec<String>,
    },
    /// The server refused or did not answer.
    Failed(String),
}

/// What follows a delete.
#[derive(Clone, Debug, PartialEq)]
pub struct AfterDelete {
    pub events: Vec<Note>,
    /// Release the Backup (and the credentials Secret, if no other Backup needs it).
    pub release: bool,
    /// The cleanup status to record: `(attempts, last error)`.
    pub record: Option<(u32, String)>,
    /// When to try again.
    pub requeue: Option<Duration>,
}

/// The step of a deletion, decided by [`artifacts::step`] and the Backup's own backoff.
pub fn plan(facts: &Facts) -> Plan {
    let backup = &facts.backup;
    let cleanup = artifacts::cleanup_of(backup);
    let artifact = backup
        .status
        .as_ref()
        .and_then(|status| status.artifact.as_ref());
    let step = artifacts::step(&Deleting {
        has_finalizer: has_finalizer(backup),
        done: cleanup.done,
        skip: backup
            .annotations()
            .get(artifacts::SKIP_ANNOTATION)
            .is_some_and(|value| value == "true"),
        policy: backup.spec.deletion_policy,
        artifact,
        readers: &facts.readers,
        contest: facts.contest.clone(),
    });
    match step {
        Step::Nothing => Plan::Nothing,
        Step::Wait { message } => Plan::Wait {
            first: (cleanup.last_error.as_deref() != Some(message.as_str()))
                .then(|| Note::normal("DeletionWaitsForRestore", message)),
        },
        Step::Release {
            reason,
            message,
            warning,
        } => Plan::Release {
            note: Note {
                warning,
                reason: reason.to_string(),
                text: message,
            },
        },
        Step::Delete { keys } => match artifacts::wait_before_retry(
            cleanup.attempts,
            cleanup
                .last_attempt_time
                .as_ref()
                .map(|time| time.0.as_second()),
            facts.now.as_second(),
        ) {
            Some(wait) => Plan::Later(wait),
            None => Plan::Delete { keys },
        },
    }
}

/// What follows a delete of `keys` from `artifact`: the Backup is released once they are
/// gone (each key already absent said so, never replaced by another); a failed delete is
/// counted, backed off and warned about, naming the skip annotation.
pub fn after_delete(
    facts: &Facts,
    artifact: &Artifact,
    keys: &[String],
    outcome: &Outcome,
) -> AfterDelete {
    match outcome {
        Outcome::Deleted { endpoint, absent } => {
            let mut events: Vec<Note> = absent
                .iter()
                .map(|key| {
                    Note::normal(
                        "ArtifactAlreadyAbsent",
                        format!(
                            "{key} was already gone from bucket {} at {endpoint}",
                            artifact.bucket
                        ),
                    )
                })
                .collect();
            let deleted: Vec<&str> = keys
                .iter()
                .filter(|key| !absent.contains(key))
                .map(String::as_str)
                .collect();
            if !deleted.is_empty() {
                events.push(Note::normal(
                    "ArtifactDeleted",
                    format!(
                        "deleted {} from bucket {} at {endpoint}",
                        deleted.join(" and "),
                        artifact.bucket
                    ),
                ));
            }
            AfterDelete {
                events,
                release: true,
                record: None,
                requeue: None,
            }
        }
        Outcome::Failed(message) => {
            let attempts = artifacts::cleanup_of(&facts.backup).attempts;
            let wait = artifacts::backoff(attempts);
            AfterDelete {
                events: vec![Note::warning(
                    "ArtifactCleanupFailed",
                    format!(
                        "deleting {} failed (attempt {}, next in {}s): {message}. The Backup stays until it succeeds; annotate it {}=true to release it and keep the artifact",
                        artifact.key,
                        attempts + 1,
                        wait.as_secs(),
                        artifacts::SKIP_ANNOTATION
                    ),
                )],
                release: false,
                record: Some((attempts + 1, message.clone())),
                requeue: Some(wait),
            }
        }
    }
}

fn has_finalizer(backup: &Backup) -> bool {
    backup
        .finalizers()
        .iter()
        .any(|f| f == artifacts::FINALIZER)
}

/// Reads what a deletion step decides on: the Restores reading the Backup and, when none
/// does, the contest of its keys against every other Backup, from the API server.
pub async fn gather(backup: &Backup, context: &BackupContext) -> Result<Facts> {
    let client = &context.base.client;
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let uid = backup.metadata.uid.clone().unwrap_or_default();
    let mut facts = Facts {
        backup: backup.clone(),
        now: Timestamp::now(),
        readers: Vec::new(),
        contest: None,
    };
    if !has_finalizer(backup) || artifacts::cleanup_of(backup).done {
        return Ok(facts);
    }
    let artifact = backup
        .status
        .as_ref()
        .and_then(|status| status.artifact.clone());

    // Restores that are not over and read this Backup, from the API server.
    let restores: Api<Restore> = Api::namespaced(client.clone(), &namespace);
    facts.readers = restores
        .list(&ListParams::default())
        .await
        .map_err(Error::read(format!("Restores in {namespace}")))?
        .items
        .into_iter()
        .filter(|restore| restore.spec.backup_ref.name == name)
        .filter(|restore| {
            !matches!(
                restore.status.as_ref().and_then(|status| status.phase),
                Some(RestorePhase::Completed | RestorePhase::Failed)
            )
        })
        .filter_map(|restore| restore.metadata.name)
        .collect();

    // Every other Backup, in every namespace, finished or not, from the API server.
    let (Some(artifact), true) = (&artifact, facts.readers.is_empty()) else {
        return Ok(facts);
    };
    let all: Api<Backup> = Api::all(client.clone());
    let backups = all
        .list(&ListParams::default())
        .await
        .map_err(Error::read("Backups".to_string()))?
        .items;
    let others: Vec<artifacts::Other> = backups
        .iter()
        .map(|other| artifacts::Other {
            namespace: other.metadata.namespace.as_deref().unwrap_or_default(),
            name: other.metadata.name.as_deref().unwrap_or_default(),
            uid: other.metadata.uid.as_deref().unwrap_or_default(),
            artifact: other
                .status
                .as_ref()
                .and_then(|status| status.artifact.as_ref()),
        })
        .collect();
    facts.contest = Some(if artifact.snapshot.is_some() {
        let here = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .get_opt("kube-system")
            .await
            .map_err(Error::read("Namespace kube-system".to_string()))?
            .and_then(|namespace| namespace.metadata.uid);
        artifacts::contest_snapshot(artifact, here.as_deref(), &uid, &others)
    } else if artifact.attribution.is_some() {
        // A command's dump: attributed again against the runs, in every namespace, as they
        // are now.
        let status = backup.status.clone().unwrap_or_default();
        let end = status
            .completion_time
            .as_ref()
            .map(|time| time.0.as_nanosecond() as i64)
            .unwrap_or_else(|| facts.now.as_nanosecond() as i64);
        let destination = status.destination.clone().unwrap_or_else(|| Destination {
            endpoint: artifact.endpoint.clone(),
            bucket: artifact.bucket.clone(),
            prefix: artifact.prefix.clone(),
            credentials_secret: artifact.credentials_secret.clone(),
            service_account: artifact
                .web_identity
                .as_ref()
                .map(|identity| identity.service_account_name.clone()),
        });
        let runs = super::decide::other_runs(&backups, &uid, &destination);
        artifacts::contest_attributed(artifact, &super::decide::run_of(&status, end), &runs)
    } else {
        artifacts::contest(artifact, &uid, &others)
    });
    Ok(facts)
}

/// Runs one step of a Backup's deletion: gather, plan, apply (the delete itself, then what
/// [`after_delete`] says).
pub async fn run(backup: &Backup, context: &BackupContext) -> Result<Action> {
    let facts = gather(backup, context).await?;
    let namespace = backup.namespace().unwrap_or_default();
    let artifact = backup
        .status
        .as_ref()
        .and_then(|status| status.artifact.clone());
    match plan(&facts) {
        Plan::Nothing => Ok(Action::await_change()),
        Plan::Wait { first } => {
            if let Some(note) = first {
                event(context, backup, &note).await?;
                record(context, backup, |cleanup| {
                    cleanup.last_error = Some(note.text)
                })
                .await?;
            }
            Ok(Action::requeue(Duration::from_secs(5)))
        }
        Plan::Release { note } => {
            event(context, backup, &note).await?;
            release(context, backup).await?;
            context.base.metrics.artifact_deletion("Released");
            Ok(Action::await_change())
        }
        Plan::Later(wait) => Ok(Action::requeue(wait)),
        Plan::Delete { keys } => {
            let artifact = artifact.expect("a Delete step has an artifact");
            let outcome = match delete(context, &namespace, &artifact, &keys).await {
                Ok(Deleted { endpoint, absent }) => Outcome::Deleted { endpoint, absent },
                Err(Failure::Retry(error)) => return Err(error),
                Err(Failure::Failed(message)) => Outcome::Failed(message),
                Err(Failure::IdentityGone(message)) => {
                    if namespace_terminating(&context.base.client, &namespace).await? {
                        // The namespace's deletion took the ServiceAccount or the binding
                        // first (nothing holds them as a finalizer holds a Secret): the
                        // artifact is kept, which loses nothing, rather than the namespace
                        // held forever.
                        let note = Note {
                            warning: true,
                            reason: "ArtifactKept".to_string(),
                            text: format!(
                                "the artifact under {} in bucket {} is kept: {message}, and namespace {namespace} is being deleted",
                                artifact.prefix, artifact.bucket
                            ),
                        };
                        event(context, backup, &note).await?;
                        release(context, backup).await?;
                        context.base.metrics.artifact_deletion("Kept");
                        return Ok(Action::await_change());
                    }
                    Outcome::Failed(message)
                }
            };
            let after = after_delete(&facts, &artifact, &keys, &outcome);
            context.base.metrics.artifact_deletion(match &outcome {
                Outcome::Deleted { .. } => "Deleted",
                Outcome::Failed(_) => "Failed",
            });
            match &outcome {
                Outcome::Deleted { .. } => tracing::info!(
                    namespace,
                    backup = backup.name_any(),
                    keys = keys.join(","),
                    "artifact deleted"
                ),
                Outcome::Failed(message) => tracing::warn!(
                    namespace,
                    backup = backup.name_any(),
                    attempts = after.record.as_ref().map(|(attempts, _)| *attempts),
                    retry_seconds = after.requeue.map(|wait| wait.as_secs()),
                    message,
                    "artifact delete failed"
                ),
            }
            for note in &after.events {
                event(context, backup, note).await?;
            }
            if after.release {
                release(context, backup).await?;
            }
            if let Some((attempts, error)) = after.record {
                record(context, backup, |cleanup| {
                    cleanup.attempts = attempts;
                    cleanup.last_error = Some(error);
                })
                .await?;
            }
            Ok(crate::reconciler::requeue(after.requeue))
        }
    }
}

/// Writes the cleanup status (attempts, last error, when).
async fn record(
    context: &BackupContext,
    backup: &Backup,
    change: impl FnOnce(&mut CleanupStatus),
) -> Result<()> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let mut cleanup = artifacts::cleanup_of(backup);
    change(&mut cleanup);
    cleanup.last_attempt_time = Some(Time(Timestamp::now()));
    let api: Api<Backup> = Api::namespaced(context.base.client.clone(), &namespace);
    crate::status::apply(
        &api,
        &name,
        &format!("{FIELD_MANAGER}-cleanup"),
        &format!("Backup {namespace}/{name}"),
        &serde_json::json!({"cleanup": cleanup}),
    )
    .await
    .map(|_| ())
}

enum Failure {
    /// Reading the credentials failed for a reason that may pass (the API server): the
    /// reconcile is retried; nothing falls back to another endpoint.
    Retry(Error),
    /// The delete itself failed: counted, backed off, warned about.
    Failed(String),
    /// The web identity that signs it is gone (its ServiceAccount, or custody's leave to ask
    /// for its tokens): in a namespace being deleted, nothing will bring it back.
    IdentityGone(String),
}

/// Whether `namespace` is being deleted (custody lists namespaces; it may not get them).
async fn namespace_terminating(client: &kube::Client, namespace: &str) -> Result<bool> {
    let found = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .list(&kube::api::ListParams::default().fields(&format!("metadata.name={namespace}")))
        .await
        .map_err(Error::read(format!("Namespace {namespace}")))?;
    Ok(found
        .items
        .iter()
        .any(|found| found.metadata.deletion_timestamp.is_some()))
}

/// What a delete did.
struct Deleted {
    /// The endpoint URL it used.
    endpoint: String,
    /// The keys that were already gone.
    absent: Vec<String>,
}

/// Deletes `keys`.
async fn delete(
    context: &BackupContext,
    namespace: &str,
    artifact: &custody_kube::api::Artifact,
    keys: &[String],
) -> Result<Deleted, Failure> {
    let client = &context.base.client;
    let repositories: Api<BackupRepository> = Api::namespaced(client.clone(), namespace);
    let repository = repositories
        .get_opt(&artifact.repository)
        .await
        .map_err(|source| {
            Failure::Retry(Error::read(format!(
                "BackupRepository {namespace}/{}",
                artifact.repository
            ))(source))
        })?;
    let (endpoint, signer) = artifacts::delete_endpoint(artifact, repository.as_ref());
    let who = format!("custody-{namespace}-{}", artifact.repository);
    let credentials =
        match custody_kube::s3::credentials_for(client, namespace, &signer, &endpoint.region, &who)
            .await
        {
            // A web identity is exchanged first, so that its being gone is told apart.
            Ok(custody_kube::s3::Credentials::WebIdentity(identity)) => {
                use custody_kube::sts::StsError;
                match identity.assume(&endpoint).await {
                    Ok(session) => custody_kube::s3::Credentials::Session(session),
                    Err(
                        error @ (StsError::TokenForbidden { .. } | StsError::AccountMissing { .. }),
                    ) => return Err(Failure::IdentityGone(error.to_string())),
                    Err(error) => return Err(Failure::Failed(error.to_string())),
                }
            }
            Ok(credentials) => credentials,
            Err(custody_kube::s3::CredentialsError::Read { source, name }) => {
                return Err(Failure::Retry(Error::read(format!(
                    "Secret {namespace}/{name}"
                ))(source)));
            }
            Err(error) => return Err(Failure::Failed(error.to_string())),
        };
    let s3 = custody_kube::s3::client(&endpoint, &credentials)
        .map_err(|error| Failure::Failed(error.to_string()))?;
    let mut absent = Vec::new();
    for key in keys {
        let head = tokio::time::timeout(
            Duration::from_secs(20),
            s3.head_object().bucket(&endpoint.bucket).key(key).send(),
        )
        .await
        .map_err(|_| Failure::Failed(format!("{} did not answer within 20s", endpoint.url)))?;
        match head {
            Ok(_) => {}
            Err(error)
                if error
                    .raw_response()
                    .is_some_and(|raw| raw.status().as_u16() == 404) =>
            {
                absent.push(key.clone());
                continue;
            }
            Err(error) => return Err(Failure::Failed(custody_kube::s3::sdk_error(&error))),
        }
        tokio::time::timeout(
            Duration::from_secs(20),
            s3.delete_object().bucket(&endpoint.bucket).key(key).send(),
        )
        .await
        .map_err(|_| Failure::Failed(format!("{} did not answer within 20s", endpoint.url)))?
        .map_err(|error| Failure::Failed(custody_kube::s3::sdk_error(&error)))?;
    }
    Ok(Deleted {
        endpoint: endpoint.url,
        absent,
    })
}

/// Releases the credentials Secret if no other Backup still needs it, then removes this
/// reconciler's finalizer. The Secret goes first: once the Backup is gone nothing would
/// reconcile it again, so a Secret release that lost a race (the namespace being deleted marks
/// the Secret meanwhile) must be retried while the Backup still holds its finalizer.
async fn release(context: &BackupContext, backup: &Backup) -> Result<()> {
    let client = &context.base.client;
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    // Done first, then the Secrets: of two Backups released at once, at least one sees the
    // other done and releases the Secret.
    if !artifacts::cleanup_of(backup).done {
        record(context, backup, |cleanup| cleanup.done = true).await?;
    }
    let mut secrets = artifacts::held_secrets(backup, None);
    if secrets.is_empty() {
        secrets =
            artifacts::held_secrets(backup, repository_secret(client, backup).await?.as_deref());
    }
    for secret in secrets {
        let done =
            release_secret(client, &namespace, &secret, backup.metadata.uid.as_deref()).await?;
        if !done {
            return Err(Error::Webhook(format!(
                "Secret {namespace}/{secret} changed while its finalizer was removed; trying again"
            )));
        }
    }
    // A Backup deleted while it ran gives its Cluster's claim back: the Lease is in custody's
    // namespace, where nothing else would ever delete it.
    crate::holds::lease::release_any(
        client,
        &context.base.leases,
        &crate::holds::holder("Backup", backup.metadata.uid.as_deref().unwrap_or_default()),
    )
    .await?;
    // The artifact is dealt with: a write that lost a race is tried again on a fresh read
    // here, not left to a reconcile that would start the cleanup over.
    let api: Api<Backup> = Api::namespaced(client.clone(), &namespace);
    let what = format!("Backup {namespace}/{name}");
    let mut current = backup.clone();
    for _ in 0..5 {
        if crate::finalizers::remove(&api, &current, artifacts::FINALIZER, &what).await? {
            return Ok(());
        }
        match api
            .get_opt(&name)
            .await
            .map_err(Error::read(what.clone()))?
        {
            Some(fresh) if fresh.metadata.uid == backup.metadata.uid => current = fresh,
            _ => return Ok(()),
        }
    }
    Err(Error::Webhook(format!(
        "{what} kept changing while its finalizer was removed; trying again"
    )))
}

/// The credentials Secret of the repository a Backup names (or its Cluster does), if both
/// still exist: what a Backup stopped between holding the Secret and recording it holds.
#[cfg(test)]
mod tests;
