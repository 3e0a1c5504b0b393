//! The snapshots in a repository, as custody records them: what a cluster that never saw
//! the Backups lists to make them restorable (disaster recovery).

use std::collections::BTreeSet;

use rustic_core::repofile::SnapshotFile;
use rustic_core::{FileType, OpenStatus, ReadBackend, Repository, RepositoryBackends};

use crate::open::OpenError;
use crate::snapshot::{MetaError, SnapshotMeta};

/// One snapshot file of the repository.
#[derive(Debug)]
pub struct Listed {
    /// The snapshot's ID (64 hex digits).
    pub id: String,
    /// custody's record in it, or why the snapshot cannot be used.
    pub meta: Result<SnapshotMeta, Unusable>,
}

/// Why a snapshot cannot be restored.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("there is no such snapshot in the repository")]
    Missing,
    /// It does not open under the repository's key: changed since it was written.
    #[error("it does not open under the repository's key (changed since it was written?): {0}")]
    Sealed(String),
    /// It opens, but is not a finished custody record.
    #[error("{0}")]
    Record(MetaError),
}

/// Which snapshots to open.
#[derive(Clone, Debug)]
pub enum Select {
    /// This one (`Unusable::Missing` when the repository lacks it).
    One(String),
    /// Every one but these (known already: not read again).
    AllBut(BTreeSet<String>),
}

/// The snapshots of the repository `select` names, each opened and checked.
pub fn snapshots(
    repository: &Repository<OpenStatus>,
    backends: &RepositoryBackends,
    select: &Select,
) -> Result<Vec<Listed>, OpenError> {
    let backend = backends.repository();
    let mut ids: Vec<String> = backend
        .list(FileType::Snapshot)
        .map_err(|error| OpenError::unreadable(&backend.location(), &error))?
        .iter()
        .map(|id| id.to_hex().to_string())
        .collect();
    ids.sort();
    match select {
        Select::One(only) => {
            if !ids.contains(only) {
                return Ok(vec![Listed {
                    id: only.clone(),
                    meta: Err(Unusable::Missing),
                }]);
            }
            ids = vec![only.clone()];
        }
        Select::AllBut(known) => ids.retain(|id| !known.contains(id)),
    }
    let mut listed = Vec::with_capacity(ids.len());
    for id in ids {
        // Read first on its own: a read that fails is the storage's trouble (try again), not
        // the snapshot's; what fails after it is in the snapshot.
        let parsed: rustic_core::Id =
            id.parse().map_err(|error: Box<rustic_core::RusticError>| {
                OpenError::unreadable(&backend.location(), &error)
            })?;
        backend
            .read_full(FileType::Snapshot, &parsed)
            .map_err(|error| OpenError::unreadable(&backend.location(), &error))?;
        let meta = read(repository, &id);
        listed.push(Listed { id, meta });
    }
    Ok(listed)
}

fn read(repository: &Repository<OpenStatus>, id: &str) -> Result<SnapshotMeta, Unusable> {
    let file: SnapshotFile = repository
        .get_snapshots(&[id])
        .map_err(|error| Unusable::Sealed(error.display_log()))?
        .pop()
        .ok_or(Unusable::Missing)?;
    SnapshotMeta::finished(file.description.as_deref()).map_err(Unusable::Record)
}
