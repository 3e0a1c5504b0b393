//! What custody seals into a snapshot: which Backup of which Cluster, from which Kubernetes
//! cluster, how it was captured, and each volume with its manifest.
//!
//! It travels in the snapshot file's `description` (JSON). The snapshot file is encrypted and
//! authenticated under the repository's master key, so whatever opens under a key the user
//! holds was written by someone who held one: this record is the trust anchor for a restore,
//! in the cluster that made it or another. The Backup's status only caches it.
//!
//! The snapshot's tree holds each volume under `data/<volume>/` and its manifest at
//! `manifests/<volume>.jsonl` (after the data, since the manifest is finished from the same
//! reads), so that restic or rustic can restore the data by hand.

use serde::{Deserialize, Serialize};

/// The version of [`SnapshotMeta`] this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The tag every custody snapshot carries (restic's `--tag custody` finds them).
pub const TAG: &str = "custody";
/// Where a volume's data lies in the snapshot tree.
pub fn data_path(volume: &str) -> String {
    format!("data/{volume}")
}
/// Where a volume's manifest lies in the snapshot tree.
pub fn manifest_path(volume: &str) -> String {
    format!("manifests/{volume}.jsonl")
}

/// A Kubernetes object named in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// custody's sealed record of one Backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotMeta {
    /// [`FORMAT_VERSION`].
    pub custody_snapshot: u32,
    /// The Kubernetes cluster that made it: the UID of its `kube-system` namespace. Only that
    /// cluster may forget the snapshot (see the ownership rule in the README).
    pub origin_cluster: String,
    pub backup: ObjectRef,
    pub cluster: ObjectRef,
    /// How the data was captured (`Stopped`, `Frozen`, `Tool`, `Hooks`, `CrashUnsafe`).
    pub consistency: String,
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// When every volume was read and its manifest finished (RFC 3339). Absent in a snapshot
    /// whose run did not finish: such a snapshot is never restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    pub volumes: Vec<VolumeMeta>,
}

/// One volume of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMeta {
    /// The Cluster's volume claim template.
    pub name: String,
    /// The claim that was read.
    pub claim: String,
    /// The manifest, once the volume was read whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<ManifestMeta>,
}

/// A volume's manifest, as sealed in the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestMeta {
    /// BLAKE3 of the manifest file, hex: what the agent verifies the restored volume against.
    pub blake3: String,
    pub entries: u64,
    pub files: u64,
    pub total_bytes: u64,
}

/// Why a snapshot's description is not a custody record a restore may use.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("the snapshot has no description: not written by custody")]
    Missing,
    #[error("the snapshot's description is not custody's record: {0}")]
    Malformed(String),
    #[error("the snapshot's record has format version {0}, this custody reads {FORMAT_VERSION}")]
    UnsupportedVersion(u32),
    #[error("the snapshot was not finished (its run stopped before every volume was read)")]
    Unfinished,
    #[error("the snapshot has no volume {0:?}")]
    NoSuchVolume(String),
}

impl SnapshotMeta {
    /// The record as it goes into the snapshot's description.
    pub fn to_description(&self) -> String {
        serde_json::to_string(self).expect("a SnapshotMeta serializes")
    }

    /// The record in a snapshot's description, whatever its state.
    pub fn from_description(description: Option<&str>) -> Result<SnapshotMeta, MetaError> {
        let text = description.ok_or(MetaError::Missing)?;
        let meta: SnapshotMeta =
            serde_json::from_str(text).map_err(|error| MetaError::Malformed(error.to_string()))?;
        if meta.custody_snapshot != FORMAT_VERSION {
            return Err(MetaError::UnsupportedVersion(meta.custody_snapshot));
        }
        Ok(meta)
    }

    /// The record of a finished snapshot: every volume has its manifest.
    pub fn finished(description: Option<&str>) -> Result<SnapshotMeta, MetaError> {
        let meta = SnapshotMeta::from_description(description)?;
        if meta.completed_at.is_none()
            || meta.volumes.iter().any(|volume| volume.manifest.is_none())
        {
            return Err(MetaError::Unfinished);
        }
        Ok(meta)
    }

    /// A volume's manifest in a finished record.
    pub fn manifest(&self, volume: &str) -> Result<&ManifestMeta, MetaError> {
        self.volumes
            .iter()
            .find(|candidate| candidate.name == volume)
            .and_then(|found| found.manifest.as_ref())
            .ok_or_else(|| MetaError::NoSuchVolume(volume.to_string()))
    }

    /// The tags a snapshot of this record carries, for people listing it with restic.
    pub fn tags(&self) -> Vec<String> {
        vec![
            TAG.to_string(),
            format!("namespace={}", self.backup.namespace),
            format!("cluster={}", self.cluster.name),
            format!("backup={}", self.backup.name),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> SnapshotMeta {
        SnapshotMeta {
            custody_snapshot: FORMAT_VERSION,
            origin_cluster: "c0ffee".into(),
            backup: ObjectRef {
                namespace: "shop".into(),
                name: "nightly".into(),
                uid: "b-1".into(),
            },
            cluster: ObjectRef {
                namespace: "shop".into(),
                name: "orders".into(),
                uid: "c-1".into(),
            },
            consistency: "Stopped".into(),
            started_at: "2026-12-01T00:00:00Z".into(),
            completed_at: Some("2026-12-01T00:01:00Z".into()),
            volumes: vec![VolumeMeta {
                name: "data".into(),
                claim: "data-orders-0".into(),
                manifest: Some(ManifestMeta {
                    blake3: "ab".repeat(32),
                    entries: 3,
                    files: 1,
                    total_bytes: 8192,
                }),
            }],
        }
    }

    #[test]
    fn a_finished_record_reads_back_as_written() {
        let written = record();
        let read = SnapshotMeta::finished(Some(&written.to_description())).unwrap();
        assert_eq!(read, written);
        assert_eq!(read.manifest("data").unwrap().files, 1);
        assert_eq!(
            read.manifest("wal"),
            Err(MetaError::NoSuchVolume("wal".into()))
        );
    }

    #[test]
    fn records_that_a_restore_may_not_use_are_named() {
        let mut unfinished = record();
        unfinished.completed_at = None;
        let mut volume_unread = record();
        volume_unread.volumes[0].manifest = None;
        let mut future = record();
        future.custody_snapshot = FORMAT_VERSION + 1;
        let cases: Vec<(Option<String>, MetaError)> = vec![
            (None, MetaError::Missing),
            (
                Some("backup of /home".into()),
                MetaError::Malformed("expected value at line 1 column 1".into()),
            ),
            (Some(unfinished.to_description()), MetaError::Unfinished),
            (Some(volume_unread.to_description()), MetaError::Unfinished),
            (
                Some(future.to_description()),
                MetaError::UnsupportedVersion(FORMAT_VERSION + 1),
            ),
        ];
        for (description, expected) in cases {
            assert_eq!(
                SnapshotMeta::finished(description.as_deref()),
                Err(expected),
                "{description:?}"
            );
        }
        // An unfinished record is still custody's (its run can be recognised and forgotten).
        assert!(SnapshotMeta::from_description(Some(&unfinished.to_description())).is_ok());
    }

    #[test]
    fn tree_paths_put_every_volume_before_every_manifest() {
        // The archiver needs entries in tree order, and the manifests are finished last.
        for (volume, other) in [("data", "wal"), ("wal", "data"), ("a", "zzzz")] {
            assert!(data_path(volume) < manifest_path(other));
        }
    }
}
