//! An imported Backup (a snapshot another cluster or namespace wrote, listed by its
//! repository): the Backup reconciler opens its snapshot and records it, or says why not.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::{ACTION, BackupContext, FIELD_MANAGER, reasons as backup_reasons};
use crate::conditions::{Desired, Status, types};
use crate::error::{Error, Result};
use crate::events::Note;
use crate::imports::{ReadError, imported_status, read_snapshots, reasons};
use crate::reconciler;
use custody_kube::api::{Backup, BackupPhase, BackupRepository, BackupStatus};
use custody_repository::listing::{Select, Unusable};

/// The Backup controller's step for an imported Backup: open its snapshot and record it.
pub async fn complete(backup: &Backup, context: &BackupContext) -> Result<Action> {
    let phase = backup.status.as_ref().and_then(|status| status.phase);
    if phase == Some(BackupPhase::Completed) {
        return Ok(Action::await_change());
    }
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let client = &context.base.client;
    let id = backup.spec.imported_snapshot.clone().unwrap_or_default();
    let repository_name = backup
        .spec
        .repository_ref
        .as_ref()
        .map(|reference| reference.name.clone())
        .unwrap_or_default();
    let repositories: Api<BackupRepository> = Api::namespaced(client.clone(), &namespace);
    let repository = repositories
        .get_opt(&repository_name)
        .await
        .map_err(Error::read(format!(
            "BackupRepository {namespace}/{repository_name}"
        )))?;
    let (status, ready, retry) = match repository {
        None => pending(
            backup_reasons::REPOSITORY_NOT_FOUND,
            format!("BackupRepository {repository_name} does not exist in this namespace"),
        ),
        Some(repository) => {
            match read_snapshots(client, &repository, Select::One(id.clone())).await {
                Err(ReadError::NotEncrypted(_)) => failed(
                    reasons::REPOSITORY_NOT_ENCRYPTED,
                    format!(
                        "BackupRepository {repository_name} is not encrypted: it holds no snapshots; name the encrypted repository that holds snapshot {id}"
                    ),
                ),
                Err(error @ ReadError::NotOpened(_)) => {
                    pending(backup_reasons::REPOSITORY_NOT_READY, error.to_string())
                }
                Err(ReadError::KeyRejected(message)) => failed(
                    crate::repositories::reasons::KEY_REJECTED,
                    format!("the repository's master key does not open it: {message}"),
                ),
                Err(ReadError::Repository(message)) => pending(
                    backup_reasons::REPOSITORY_NOT_READY,
                    format!("the repository cannot be read now: {message}"),
                ),
                Ok((encrypted, listed)) => {
                    let found = listed.into_iter().next().map(|listed| listed.meta);
                    match found {
                        None | Some(Err(Unusable::Missing)) => failed(
                            reasons::SNAPSHOT_NOT_FOUND,
                            format!(
                                "there is no snapshot {id} in repository {} ({})",
                                encrypted.id, encrypted.prefix
                            ),
                        ),
                        Some(Err(error)) => failed(
                            reasons::SNAPSHOT_INVALID,
                            format!("snapshot {id} cannot be restored: {error}"),
                        ),
                        Some(Ok(meta)) => {
                            match imported_status(&id, &meta, &repository, &encrypted) {
                                Err(message) => failed(
                                    reasons::SNAPSHOT_INVALID,
                                    format!("snapshot {id} cannot be restored: {message}"),
                                ),
                                Ok(status) => (
                                    status,
                                    Desired {
                                        type_: types::READY,
                                        status: Status::True,
                                        reason: reasons::IMPORTED,
                                        message: format!(
                                            "imported snapshot {id}, written by Backup {}/{} of Cluster {} in Kubernetes cluster {} at {}",
                                            meta.backup.namespace,
                                            meta.backup.name,
                                            meta.cluster.name,
                                            meta.origin_cluster,
                                            meta.completed_at.as_deref().unwrap_or_default()
                                        ),
                                    },
                                    None,
                                ),
                            }
                        }
                    }
                }
            }
        }
    };
    let phase = status.phase.unwrap_or_default();
    if let Some(next) = super::plan::next_status(backup, status, phase, &ready, Timestamp::now()) {
        let api: Api<Backup> = Api::namespaced(client.clone(), &namespace);
        crate::status::apply(
            &api,
            &name,
            FIELD_MANAGER,
            &format!("Backup {namespace}/{name}"),
            &next,
        )
        .await?;
        let note = if ready.status == Status::True {
            Note::normal(ready.reason, ready.message.clone())
        } else {
            Note::warning(ready.reason, ready.message.clone())
        };
        reconciler::publish(&context.base, backup, ACTION, &note).await?;
        tracing::info!(
            namespace,
            name,
            reason = ready.reason,
            message = ready.message,
            "imported backup"
        );
    }
    Ok(match retry {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// Not yet: the repository is missing or cannot be read now; looked at again in 10 s.
fn pending(reason: &'static str, message: String) -> (BackupStatus, Desired, Option<Duration>) {
    not_ready(
        BackupPhase::Pending,
        reason,
        message,
        Duration::from_secs(10),
    )
}

/// The snapshot cannot be restored. Looked for again each minute: it may appear later
/// (another cluster still writing).
fn failed(reason: &'static str, message: String) -> (BackupStatus, Desired, Option<Duration>) {
    not_ready(
        BackupPhase::Failed,
        reason,
        message,
        Duration::from_secs(60),
    )
}

fn not_ready(
    phase: BackupPhase,
    reason: &'static str,
    message: String,
    retry: Duration,
) -> (BackupStatus, Desired, Option<Duration>) {
    (
        BackupStatus {
            phase: Some(phase),
            ..BackupStatus::default()
        },
        Desired {
            type_: types::READY,
            status: Status::False,
            reason,
            message,
        },
        Some(retry),
    )
}
