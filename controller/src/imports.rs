//! Disaster recovery: Backups imported from an encrypted repository's snapshots.
//!
//! A snapshot that opens under the repository's key carries custody's sealed record of the
//! Backup that wrote it (see `custody_repository::snapshot`): that record, not any cluster's
//! etcd, is what makes it restorable. A BackupRepository with `importSnapshots` lists the
//! snapshots and creates, in its namespace, one read-only Backup (`spec.importedSnapshot`)
//! per finished custody snapshot that no Backup there records or wrote; the Backup
//! controller then opens that one snapshot and caches its record in the Backup's status, and
//! a Restore restores it like any other Backup (the agent's verification still proves it).
//!
//! Ownership across clusters: a snapshot belongs to the Backup that wrote it, in the
//! Kubernetes cluster that wrote it (its `originCluster`). Imported Backups never delete it
//! (`deletionPolicy: Retain`, enforced by the schema, and they carry no finalizer); their
//! deletion removes only the view. Holding the repository's key is what entitles a namespace
//! to read its snapshots.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

use crate::encryption::MASTER_KEY_ENTRY;
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::{self, Context};
use custody_kube::api::{
    Artifact, Backup, BackupPhase, BackupRepository, BackupStatus, Capture, DeletionPolicy,
    EncryptedRepository, SnapshotRef, WrittenBy,
};
use custody_kube::s3::{self, Endpoint};
use custody_repository::backend::{Location, S3Backend};
use custody_repository::listing::{self, Listed, Select, Unusable};
use custody_repository::open::{self, OpenError};
use custody_repository::snapshot::SnapshotMeta;

/// The label on an imported Backup: the BackupRepository that created it.
pub const IMPORTED_FROM: &str = "custody.io/imported-from";
/// How often a repository with `importSnapshots` is listed again.
pub const LIST_EVERY: Duration = Duration::from_secs(60);

pub mod reasons {
    pub const IMPORTED: &str = "Imported";
    pub const SNAPSHOT_NOT_FOUND: &str = "SnapshotNotFound";
    pub const SNAPSHOT_INVALID: &str = "SnapshotInvalid";
    pub const REPOSITORY_NOT_ENCRYPTED: &str = "RepositoryNotEncrypted";
}

/// A snapshot to import: the Backup to create for it.
#[derive(Debug, PartialEq, Eq)]
pub struct ToImport {
    pub name: String,
    pub snapshot: String,
    /// The Cluster the snapshot's Backup backed up (the imported Backup's `clusterRef`).
    pub cluster: String,
}

/// The Backup name an imported snapshot gets: the name of the Backup that wrote it and the
/// snapshot ID's first 8 digits (a DNS subdomain of at most 63 characters).
pub fn import_name(meta: &SnapshotMeta, id: &str) -> String {
    let short = &id[..id.len().min(8)];
    let mut base: String = meta
        .backup
        .name
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.')
        .collect();
    base.truncate(63 - short.len() - 1);
    let base = base.trim_matches(|c| c == '-' || c == '.');
    if base.is_empty() {
        format!("snapshot-{short}")
    } else {
        format!("{base}-{short}")
    }
}

/// What a Backup in the importing namespace says of the snapshots.
#[derive(Debug, Default)]
pub struct Here {
    /// Snapshot IDs recorded by a Backup here (written or imported).
    pub recorded: BTreeSet<String>,
    /// UIDs of the Backups here: their snapshots are theirs, not imports (also while being
    /// written, before the ID is recorded).
    pub uids: BTreeSet<String>,
    /// Names taken.
    pub names: BTreeSet<String>,
}

impl Here {
    pub fn of(backups: &[Backup]) -> Here {
        let mut here = Here::default();
        for backup in backups {
            if let Some(uid) = &backup.metadata.uid {
                here.uids.insert(uid.clone());
            }
            here.names.insert(backup.name_any());
            if let Some(id) = &backup.spec.imported_snapshot {
                here.recorded.insert(id.clone());
            }
            if let Some(id) = backup
                .status
                .as_ref()
                .and_then(|status| status.artifact.as_ref())
                .and_then(|artifact| artifact.snapshot.as_ref())
                .and_then(|snapshot| snapshot.id.as_ref())
            {
                here.recorded.insert(id.clone());
            }
        }
        here
    }
}

/// The Backups to create for `listed`: one per usable snapshot that no Backup here records or
/// wrote, under a free name; and the snapshots refused, with why.
pub fn to_import(listed: &[Listed], here: &Here) -> (Vec<ToImport>, Vec<(String, String)>) {
    let mut create = Vec::new();
    let mut refused = Vec::new();
    let mut names = here.names.clone();
    for snapshot in listed {
        if here.recorded.contains(&snapshot.id) {
            continue;
        }
        match &snapshot.meta {
            Ok(meta) => {
                if here.uids.contains(&meta.backup.uid) {
                    continue;
                }
                let mut name = import_name(meta, &snapshot.id);
                if names.contains(&name) {
                    // Another object took the name: the whole ID decides.
                    name = format!("snapshot-{}", &snapshot.id[..snapshot.id.len().min(54)]);
                }
                if names.insert(name.clone()) {
                    create.push(ToImport {
                        name,
                        snapshot: snapshot.id.clone(),
                        cluster: meta.cluster.name.clone(),
                    });
                }
            }
            // Snapshots that are not custody's, or unfinished, are someone else's business.
            Err(Unusable::Record(_)) => {}
            Err(error) => refused.push((snapshot.id.clone(), error.to_string())),
        }
    }
    (create, refused)
}

/// The status of an imported Backup, from the snapshot's record.
pub fn imported_status(
    id: &str,
    meta: &SnapshotMeta,
    repository: &BackupRepository,
    encrypted: &EncryptedRepository,
) -> std::result::Result<BackupStatus, String> {
    let volume = meta
        .volumes
        .first()
        .ok_or_else(|| "the snapshot records no volume".to_string())?;
    let manifest = volume
        .manifest
        .as_ref()
        .ok_or_else(|| format!("volume {} has no manifest", volume.name))?;
    let consistency: Capture =
        serde_json::from_value(serde_json::Value::String(meta.consistency.clone()))
            .map_err(|_| format!("unknown consistency {:?}", meta.consistency))?;
    let time = |text: &str| {
        text.parse::<Timestamp>()
            .map(Time)
            .map_err(|error| format!("time {text:?}: {error}"))
    };
    let completed = meta
        .completed_at
        .as_deref()
        .ok_or_else(|| "the snapshot was not finished".to_string())?;
    let size_bytes: u64 = meta
        .volumes
        .iter()
        .filter_map(|volume| volume.manifest.as_ref())
        .map(|manifest| manifest.total_bytes)
        .sum();
    Ok(BackupStatus {
        phase: Some(BackupPhase::Completed),
        size: Some(custody_proto::progress::human_bytes(size_bytes)),
        consistency: Some(consistency),
        start_time: Some(time(&meta.started_at)?),
        completion_time: Some(time(completed)?),
        artifact: Some(Artifact {
            prefix: encrypted.prefix.clone(),
            manifest_hash: Some(manifest.blake3.clone()),
            size_bytes: i64::try_from(size_bytes).ok(),
            snapshot: Some(SnapshotRef {
                repository_id: encrypted.id.clone(),
                id: Some(id.to_string()),
                origin_cluster: meta.origin_cluster.clone(),
                volumes: meta.volumes.iter().map(|v| v.name.clone()).collect(),
                volume_manifests: meta
                    .volumes
                    .iter()
                    .map(|volume| {
                        let manifest = volume
                            .manifest
                            .as_ref()
                            .ok_or_else(|| format!("volume {} has no manifest", volume.name))?;
                        Ok(custody_kube::api::VolumeManifest {
                            name: volume.name.clone(),
                            manifest_hash: manifest.blake3.clone(),
                            files: i64::try_from(manifest.files).ok(),
                            total_bytes: i64::try_from(manifest.total_bytes).ok(),
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, String>>()?,
                written_by: Some(WrittenBy {
                    namespace: meta.backup.namespace.clone(),
                    name: meta.backup.name.clone(),
                    uid: meta.backup.uid.clone(),
                    cluster: meta.cluster.name.clone(),
                }),
            }),
            ..Artifact::located_in(repository)
        }),
        ..BackupStatus::default()
    })
}

/// Why the snapshots of a repository could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("BackupRepository {0} is not encrypted: only an encrypted repository has snapshots")]
    NotEncrypted(String),
    #[error("BackupRepository {0} has not opened its repository yet (see its Ready condition)")]
    NotOpened(String),
    #[error("{0}")]
    Repository(String),
    /// The master key no longer opens it: a different repository at the same place.
    #[error("{0}")]
    KeyRejected(String),
}

/// Opens `repository` with its master key and reads the snapshots `select` names.
pub async fn read_snapshots(
    client: &kube::Client,
    repository: &BackupRepository,
    select: Select,
) -> std::result::Result<(EncryptedRepository, Vec<Listed>), ReadError> {
    let name = repository.name_any();
    let namespace = repository.namespace().unwrap_or_default();
    if repository.spec.encryption.is_none() {
        return Err(ReadError::NotEncrypted(name));
    }
    let encrypted = repository
        .status
        .as_ref()
        .and_then(|status| status.repository.clone())
        .ok_or_else(|| ReadError::NotOpened(name.clone()))?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let master_key = secrets
        .get_opt(&encrypted.master_key_secret)
        .await
        .map_err(|error| ReadError::Repository(error.to_string()))?
        .and_then(|secret| secret.data)
        .and_then(|data| data.get(MASTER_KEY_ENTRY).cloned())
        .map(|value| String::from_utf8_lossy(&value.0).to_string())
        .ok_or_else(|| ReadError::NotOpened(name.clone()))?;
    let credentials = s3::credentials_of(client, repository)
        .await
        .map_err(|error| ReadError::Repository(error.to_string()))?;
    let endpoint: Endpoint = custody_kube::s3::endpoint_of(repository);
    let s3_client = s3::client(&endpoint, &credentials)
        .map_err(|error| ReadError::Repository(error.to_string()))?;
    let location = Location {
        bucket: endpoint.bucket.clone(),
        prefix: encrypted.prefix.clone(),
    };
    let runtime = tokio::runtime::Handle::current();
    let limits = endpoint.limits;
    let expected_id = encrypted.id.clone();
    let listed = tokio::task::spawn_blocking(move || {
        let backend = S3Backend::new(s3_client, location, runtime).with_limits(limits);
        let backends = rustic_core::RepositoryBackends::new(backend.shared(), None);
        let (opened, id) = open::open_with_master_key(&backends, &master_key)?;
        if id != expected_id {
            return Err(OpenError::KeyRejected {
                location: backends.repository().location(),
                names: vec![format!("repository {id} (recorded: {expected_id})")],
            });
        }
        listing::snapshots(&opened, &backends, &select)
    })
    .await
    .map_err(|error| ReadError::Repository(format!("the reading thread: {error}")))?
    .map_err(|error| match error {
        OpenError::KeyRejected { .. } => ReadError::KeyRejected(error.to_string()),
        other => ReadError::Repository(other.to_string()),
    })?;
    Ok((encrypted, listed))
}

/// Lists `repository`'s snapshots and creates the Backups to import (see the module).
pub async fn sync(context: &Context, repository: &BackupRepository) -> Result<()> {
    let namespace = repository.namespace().unwrap_or_default();
    let name = repository.name_any();
    let backups: Api<Backup> = Api::namespaced(context.client.clone(), &namespace);
    let here = Here::of(
        &backups
            .list(&ListParams::default())
            .await
            .map_err(Error::read(format!("Backups in {namespace}")))?
            .items,
    );
    // Snapshots a Backup here records are not read again.
    let select = Select::AllBut(here.recorded.clone());
    let listed = match read_snapshots(&context.client, repository, select).await {
        Ok((_, listed)) => listed,
        Err(error) => {
            tracing::info!(namespace, name, %error, "snapshots not listed");
            return Ok(());
        }
    };
    let (create, refused) = to_import(&listed, &here);
    let mut created = Vec::new();
    for item in &create {
        let backup = imported_backup(repository, item);
        match backups.create(&PostParams::default(), &backup).await {
            Ok(_) => created.push(item.name.clone()),
            // Taken meanwhile: the next listing sees it.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(Error::Create {
                    object: format!("Backup {namespace}/{}", item.name),
                    source,
                });
            }
        }
    }
    if !created.is_empty() {
        let note = Note::normal(
            "SnapshotsImported",
            format!(
                "created {} imported Backup(s) for snapshots no Backup here records: {}",
                created.len(),
                created.join(", ")
            ),
        );
        reconciler::publish(context, repository, "ImportSnapshots", &note).await?;
    }
    for (id, why) in refused {
        let note = Note::warning(
            reasons::SNAPSHOT_INVALID,
            format!("snapshot {id} is not imported: {why}"),
        );
        reconciler::publish(context, repository, "ImportSnapshots", &note).await?;
    }
    Ok(())
}

fn imported_backup(repository: &BackupRepository, item: &ToImport) -> Backup {
    let mut backup = Backup::new(
        &item.name,
        custody_kube::api::BackupSpec {
            // The Cluster the snapshot was taken of (it need not exist here: a Restore names
            // the Cluster it writes).
            cluster_ref: custody_kube::api::LocalObjectReference {
                name: item.cluster.clone(),
            },
            repository_ref: Some(custody_kube::api::LocalObjectReference {
                name: repository.name_any(),
            }),
            deletion_policy: DeletionPolicy::Retain,
            command: None,
            consistency: None,
            imported_snapshot: Some(item.snapshot.clone()),
        },
    );
    backup.metadata.namespace = repository.namespace();
    backup.metadata.labels = Some(BTreeMap::from([(
        IMPORTED_FROM.to_string(),
        repository.name_any(),
    )]));
    backup
}

#[cfg(test)]
mod tests;
