//! One verification: read the trust anchor (the Restore and its Backup) from the API server,
//! find the workload pod's volume under the kubelet root, check it is a mount point, and
//! verify its content against the manifest.

use std::sync::Arc;
use std::time::{Duration, Instant};

use custody_kube::api::{Backup, Restore};
use custody_proto::clock::now_unix_nanos;
use custody_proto::reasons::VolumeFailure;
use kube::api::Api;

use crate::metrics;
use crate::node::Start;
use crate::state::Agent;
use crate::verify::{self, Expected};
use crate::volume_state::{Outcome, Verification, WorkloadVolume};
use crate::volumes;

/// Runs the verification of `start` and records its outcome.
pub async fn run(agent: Arc<Agent>, start: Start) {
    agent.verify(start).await
}

impl Agent {
    async fn verify(self: Arc<Self>, start: Start) {
        let started = Instant::now();
        let outcome = self.verification(&start).await;
        let (reason, level_failed) = match &outcome {
            Outcome::Verified { .. } => ("Verified", false),
            Outcome::Failed { reason, .. } => (reason.as_str(), true),
        };
        metrics::count(&self.metrics.verifications, reason);
        self.metrics
            .verification_duration
            .observe(started.elapsed().as_secs_f64());
        let volume = &start.volume;
        match &outcome {
            Outcome::Failed { message, .. } if level_failed => tracing::warn!(
                namespace = volume.namespace,
                pod = volume.pod_name,
                volume = volume.volume,
                claim = volume.claim_name,
                reason,
                message,
                "verification failed"
            ),
            _ => tracing::info!(
                namespace = volume.namespace,
                pod = volume.pod_name,
                volume = volume.volume,
                claim = volume.claim_name,
                seconds = started.elapsed().as_secs_f64(),
                "volume verified"
            ),
        }
        self.record(&start.key, Verification::Done(outcome));
    }

    async fn verification(&self, start: &Start) -> Outcome {
        let expected = loop {
            match self.expected(&start.volume).await {
                Ok(expected) => break expected,
                Err(Lookup::Refused { reason, message }) => {
                    return Outcome::Failed { reason, message };
                }
                Err(Lookup::Unavailable(error)) => {
                    self.note(
                        &start.key,
                        format!("reading the Restore and Backup: {error}"),
                    );
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        };

        // The kubelet names a claim's directory after the PersistentVolume bound to it; only
        // a volume without one (inline, ephemeral) goes by the pod's volume name. An API
        // server that cannot answer is asked again: guessing the name would fail a volume
        // that is there as "not found".
        let directory = loop {
            match self.volume_directory(&start.volume).await {
                Ok(directory) => break directory,
                Err(error) => {
                    self.note(&start.key, format!("reading the claim: {error}"));
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        };
        // The kubelet may still be mounting the workload pod's volume.
        let deadline = Instant::now() + self.options.mount_wait;
        let path = loop {
            let found = volumes::find_volume(
                &self.options.kubelet_root,
                &start.volume.pod_uid,
                &directory,
            )
            .and_then(|path| volumes::ensure_mounted(&path));
            match found {
                Ok(path) => break path,
                Err(error) if Instant::now() < deadline => {
                    self.note(&start.key, format!("waiting for the volume: {error}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => {
                    return Outcome::Failed {
                        reason: error.reason(),
                        message: error.to_string(),
                    };
                }
            }
        };
        self.note(&start.key, format!("verifying {}", path.display()));

        let checked = tokio::task::spawn_blocking(move || {
            verify::verify_tree(&path, &expected, verify::Options::default())
        })
        .await;
        match checked {
            Ok(Ok(verified)) => {
                self.metrics.verified_bytes.inc_by(verified.bytes);
                Outcome::Verified {
                    at_unix_nanos: now_unix_nanos(),
                    summary: format!(
                        "verified {} entries, {} files, {} bytes",
                        verified.entries, verified.files, verified.bytes
                    ),
                }
            }
            Ok(Err(failure)) => Outcome::Failed {
                reason: failure.reason(),
                message: failure.to_string(),
            },
            Err(error) => Outcome::Failed {
                reason: VolumeFailure::VerificationAborted,
                message: error.to_string(),
            },
        }
    }

    /// The directory name of a workload volume under the kubelet root: the bound
    /// PersistentVolume's name, or the pod's volume name when the claim is not bound (or
    /// cannot be read).
    async fn volume_directory(&self, volume: &WorkloadVolume) -> Result<String, kube::Error> {
        let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &volume.namespace);
        let claim = claims.get_opt(&volume.claim_name).await.inspect_err(|error| {
            tracing::warn!(claim = volume.claim_name, %error, "reading the claim; asking again");
        })?;
        Ok(directory_name(claim.as_ref(), &volume.volume))
    }

    /// The trust anchor and identities a volume must match, read from the API server: the
    /// Restore named on the pod (its UID must be the one on the pod) and the Backup it reads.
    async fn expected(&self, volume: &WorkloadVolume) -> Result<Expected, Lookup> {
        let restores: Api<Restore> = Api::namespaced(self.client.clone(), &volume.namespace);
        let restore = restores
            .get_opt(&volume.restore_name)
            .await
            .map_err(Lookup::Unavailable)?
            .ok_or_else(|| Lookup::Refused {
                reason: VolumeFailure::RestoreNotFound,
                message: format!(
                    "Restore {}/{} does not exist",
                    volume.namespace, volume.restore_name
                ),
            })?;
        if restore.metadata.uid.as_deref() != Some(volume.restore_uid.as_str()) {
            return Err(Lookup::Refused {
                reason: VolumeFailure::RestoreReplaced,
                message: format!(
                    "Restore {}/{} has UID {}, the pod was gated for {}",
                    volume.namespace,
                    volume.restore_name,
                    restore.metadata.uid.as_deref().unwrap_or("(none)"),
                    volume.restore_uid
                ),
            });
        }
        let backup_name = restore.spec.backup_ref.name.clone();
        let backups: Api<Backup> = Api::namespaced(self.client.clone(), &volume.namespace);
        let backup = backups
            .get_opt(&backup_name)
            .await
            .map_err(Lookup::Unavailable)?
            .ok_or_else(|| Lookup::Refused {
                reason: VolumeFailure::BackupNotFound,
                message: format!("Backup {}/{backup_name} does not exist", volume.namespace),
            })?;
        // The claim is `<template>-<pod>`: its template names the Backup's volume (a Backup
        // of one volume restores into a Cluster of one template whatever its name).
        let template = volume
            .claim_name
            .strip_suffix(&format!("-{}", volume.pod_name))
            .unwrap_or_default();
        let hashes = backup
            .status
            .as_ref()
            .and_then(|status| status.artifact.as_ref())
            .map(|artifact| artifact.volume_hashes(template))
            .unwrap_or_default();
        let hash = match hashes.as_slice() {
            [(_, hash)] => hash.clone(),
            several => several
                .iter()
                .find(|(name, _)| name == template)
                .and_then(|(_, hash)| hash.clone()),
        };
        let hash = hash.ok_or_else(|| Lookup::Refused {
            reason: VolumeFailure::BackupIncomplete,
            message: format!(
                "Backup {}/{backup_name} records no manifest hash for volume {template} (claim {})",
                volume.namespace, volume.claim_name
            ),
        })?;
        let hash = hash.as_str();
        let manifest_hash = blake3::Hash::from_hex(hash).map_err(|error| Lookup::Refused {
            reason: VolumeFailure::BackupIncomplete,
            message: format!(
                "Backup {}/{backup_name} records an invalid manifest hash {hash:?}: {error}",
                volume.namespace
            ),
        })?;
        Ok(Expected {
            manifest_hash,
            backup_uid: backup.writer_uid(),
            restore_uid: volume.restore_uid.clone(),
        })
    }
}

/// The directory the kubelet mounts a pod's volume at: the bound PersistentVolume's name, or
/// the pod's volume name when the claim does not exist or is not bound.
pub fn directory_name(
    claim: Option<&k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    pod_volume: &str,
) -> String {
    claim
        .and_then(|claim| claim.spec.as_ref())
        .and_then(|spec| spec.volume_name.clone())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| pod_volume.to_string())
}

enum Lookup {
    /// The API server could not be asked; try again.
    Unavailable(kube::Error),
    /// The answer rules verification out.
    Refused {
        reason: VolumeFailure,
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_directory_is_its_volumes_name() {
        let claim = |volume: Option<&str>| -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "data-db-0"},
                "spec": {"volumeName": volume},
            }))
            .unwrap()
        };
        assert_eq!(directory_name(Some(&claim(Some("pv-1"))), "data"), "pv-1");
        assert_eq!(directory_name(Some(&claim(Some(""))), "data"), "data");
        assert_eq!(directory_name(Some(&claim(None)), "data"), "data");
        assert_eq!(directory_name(None, "data"), "data");
    }
}
