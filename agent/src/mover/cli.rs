//! `custody-mover`'s commands: flags and environment in, JSON out.

use custody_kube::s3::Endpoint;
use custody_proto::mover::VerifyResult;
use custody_proto::reasons::MoverFailure;

use custody_repository::snapshot::{ObjectRef, SnapshotMeta, VolumeMeta};

use super::{MoverError, RestoreRequest, backup, credentials_from_env, header, restore};
use crate::cli::{MoverCommand, MoverOptions, SnapshotFlags};

fn endpoint(options: &MoverOptions) -> Result<Endpoint, MoverError> {
    if options.endpoint.is_empty() || options.bucket.is_empty() {
        return Err(MoverError::Local(
            "--endpoint and --bucket are required".to_string(),
        ));
    }
    let ca_bundle = match &options.ca_file {
        Some(path) => Some(std::fs::read(path).map_err(|error| {
            MoverError::Local(format!("reading CA bundle {}: {error}", path.display()))
        })?),
        None => options
            .ca_bundle
            .as_ref()
            .map(|pem| pem.as_bytes().to_vec()),
    };
    Ok(Endpoint {
        url: options.endpoint.clone(),
        region: options.region.clone(),
        bucket: options.bucket.clone(),
        path_style: options.path_style,
        ca_bundle,
        limits: custody_kube::s3::Limits {
            stall: std::time::Duration::from_secs(options.s3_stall_seconds),
            min_bytes_per_second: options.s3_min_kib_per_second * 1024,
            ..custody_kube::s3::Limits::default()
        },
        upload: custody_kube::s3::Throttle::new(
            options.upload_kib_per_second.map(|rate| rate * 1024),
        ),
        download: custody_kube::s3::Throttle::new(
            options.download_kib_per_second.map(|rate| rate * 1024),
        ),
    })
}

/// The upload bound of a copy: the repository's, except while the filesystem is frozen. A
/// frozen copy is read as fast as it can be sent: slowed to the bound, the filesystem would
/// stay frozen as long (past `maxFreezeSeconds`, failing the copy), and the application's
/// writes with it.
fn upload_bound(frozen: bool, bound: &custody_kube::s3::Throttle) -> custody_kube::s3::Throttle {
    match bound.bytes_per_second() {
        Some(rate) if frozen => {
            eprintln!(
                "custody-mover: the filesystem is frozen while it is read: this copy is not slowed to the repository's upload bound ({} KiB/s)",
                rate / 1024
            );
            custody_kube::s3::Throttle::default()
        }
        _ => bound.clone(),
    }
}

/// Runs the command; the JSON result, or the error's reason and message.
/// `stop` turning true (SIGTERM) makes a backup abort its multipart upload and end.
pub async fn run(
    options: &MoverOptions,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<String, (MoverFailure, String)> {
    if let MoverCommand::Verify {
        target,
        manifest_hash,
        backup_uid,
        restore_uid,
    } = &options.command
    {
        return verify(target, manifest_hash, backup_uid, restore_uid).await;
    }
    let outcome = async {
        let endpoint = endpoint(options)?;
        let secret = credentials_from_env(&endpoint.region)?;
        match &options.command {
            MoverCommand::Backup {
                source,
                prefix,
                backup_uid,
                cluster_uid,
                snapshot,
                freeze_claim,
                max_freeze_seconds,
                source_limit_bytes,
                tar_stream,
                tar_data_path,
            } => {
                // A tool's output larger than its scratch space is refused before it is read.
                if let Some(limit) = source_limit_bytes {
                    for source in source.clone() {
                        let limit = *limit;
                        tokio::task::spawn_blocking(move || super::usage::within(&source, limit))
                            .await
                            .map_err(|error| {
                                MoverError::Local(format!("measuring the source: {error}"))
                            })??;
                    }
                }
                let _progress = super::progress::Reporter::from_env("backup");
                // Not beside a frozen read: the walk would compete with it for the disk while
                // the application waits (its totals stay unknown).
                if tar_stream.is_none() && (max_freeze_seconds.is_none() || freeze_claim.is_empty()) {
                    super::progress::count_when_reading(source.clone());
                }
                let created_at = k8s_openapi::jiff::Timestamp::now().to_string();
                let header = header(backup_uid, cluster_uid, &created_at);
                let request = match &options.repository_prefix {
                    Some(_) => Some(snapshot_backup(
                        source,
                        snapshot,
                        header.clone(),
                        &created_at,
                        tar_stream
                            .as_ref()
                            .map(|dir| {
                                super::stream::TarInput::connect(
                                    dir.clone(),
                                    tar_data_path.clone().unwrap_or_default(),
                                )
                            })
                            .transpose()?,
                    )?),
                    None => None,
                };
                if request.is_none() && source.len() != 1 {
                    return Err(MoverError::Local(format!(
                        "an archive (--prefix) holds one volume, and {} were given: back several volumes up into a repository (--repository-prefix)",
                        source.len()
                    )));
                }
                // Frozen last, just before the first read: the freeze lasts only the copy.
                let held = match max_freeze_seconds {
                    Some(max_seconds) if !freeze_claim.is_empty() => {
                        Some(super::freeze::hold_all(freeze_claim, *max_seconds).await?)
                    }
                    _ => None,
                };
                let endpoint = Endpoint {
                    upload: upload_bound(held.is_some(), &endpoint.upload),
                    ..endpoint
                };
                let result = match (&options.repository_prefix, prefix, request) {
                    (Some(repository_prefix), _, Some(request)) => {
                        let repo = repository(options, &endpoint, &secret, repository_prefix)?;
                        snapshot_backup_run(repo, request, stop.clone(), held).await?
                    }
                    (None, Some(prefix), _) => {
                        let [source] = source.as_slice() else {
                            return Err(MoverError::Local(format!(
                                "an archive (--prefix) holds one volume, and {} were given: back several volumes up into a repository (--repository-prefix)",
                                source.len()
                            )));
                        };
                        backup(
                            &endpoint,
                            &secret,
                            source,
                            prefix,
                            header,
                            stop.clone(),
                            held,
                        )
                        .await?
                    }
                    _ => {
                        return Err(MoverError::Local(
                            "--repository-prefix or --prefix is required".into(),
                        ));
                    }
                };
                Ok(serde_json::to_string(&result).unwrap_or_default())
            }
            MoverCommand::Restore {
                target,
                snapshot,
                volume,
                key,
                manifest_key,
                manifest_hash,
                backup_uid,
                restore_uid,
                overwrite,
            } => {
                let _progress = super::progress::Reporter::from_env("restore");
                if let Some(volume) = volume {
                    super::progress::volume(volume);
                }
                let result = match (snapshot, volume, key, manifest_key) {
                    (Some(snapshot), Some(volume), _, _) => {
                        let Some(repository_prefix) = &options.repository_prefix else {
                            return Err(MoverError::Local(
                                "--snapshot needs --repository-prefix".into(),
                            ));
                        };
                        let repo = repository(options, &endpoint, &secret, repository_prefix)?;
                        let (target, snapshot, volume) =
                            (target.clone(), snapshot.clone(), volume.clone());
                        let (manifest_hash, backup_uid, restore_uid, overwrite) = (
                            manifest_hash.clone(),
                            backup_uid.clone(),
                            restore_uid.clone(),
                            *overwrite,
                        );
                        tokio::task::spawn_blocking(move || {
                            super::snapshot::restore(
                                &repo,
                                super::snapshot::SnapshotRestore {
                                    target: &target,
                                    snapshot: &snapshot,
                                    volume: &volume,
                                    manifest_hash: &manifest_hash,
                                    backup_uid: &backup_uid,
                                    restore_uid: &restore_uid,
                                    overwrite,
                                },
                            )
                        })
                        .await
                        .map_err(|error| {
                            MoverError::Local(format!("the restore thread: {error}"))
                        })??
                    }
                    (_, _, Some(key), Some(manifest_key)) => {
                        restore(
                            &endpoint,
                            &secret,
                            RestoreRequest {
                                target,
                                key,
                                manifest_key,
                                manifest_hash,
                                backup_uid,
                                restore_uid,
                                overwrite: *overwrite,
                            },
                        )
                        .await?
                    }
                    _ => {
                        return Err(MoverError::Local(
                            "--snapshot and --volume, or --key and --manifest-key, are required"
                                .into(),
                        ));
                    }
                };
                Ok(serde_json::to_string(&result).unwrap_or_default())
            }
            MoverCommand::Prune => {
                let repo = maintained(options, &endpoint, &secret)?;
                let report = tokio::task::spawn_blocking(move || super::snapshot::prune(&repo))
                    .await
                    .map_err(|error| MoverError::Local(format!("the prune thread: {error}")))??;
                Ok(serde_json::to_string(&report).unwrap_or_default())
            }
            MoverCommand::Check { read_data_percent } => {
                let repo = maintained(options, &endpoint, &secret)?;
                let percent = *read_data_percent;
                let report =
                    tokio::task::spawn_blocking(move || super::snapshot::check(&repo, percent))
                        .await
                        .map_err(|error| {
                            MoverError::Local(format!("the check thread: {error}"))
                        })??;
                Ok(serde_json::to_string(&report).unwrap_or_default())
            }
            MoverCommand::Verify { .. } => unreachable!("handled above"),
            MoverCommand::StreamSetup { .. }
            | MoverCommand::StreamTool { .. }
            | MoverCommand::ScratchCheck { .. } => {
                Err(MoverError::Local(
                    "stream-setup and stream-tool run before the mover's runtime".into(),
                ))
            }
        }
    }
    .await;
    outcome.map_err(|error: MoverError| (error.reason(), error.to_string()))
}

/// The repository a prune or check works on.
fn maintained(
    options: &MoverOptions,
    endpoint: &Endpoint,
    secret: &custody_kube::s3::Credentials,
) -> Result<super::snapshot::Repo, MoverError> {
    let Some(prefix) = &options.repository_prefix else {
        return Err(MoverError::Local(
            "--repository-prefix is required: only a repository (format 2) is pruned or checked"
                .into(),
        ));
    };
    repository(options, endpoint, secret, prefix)
}

/// The repository a format 2 command works on, its password from the environment.
fn repository(
    options: &MoverOptions,
    endpoint: &Endpoint,
    secret: &custody_kube::s3::Credentials,
    prefix: &str,
) -> Result<super::snapshot::Repo, MoverError> {
    let read = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    let key = match (
        read(super::snapshot::REPOSITORY_KEY),
        read(super::snapshot::REPOSITORY_PASSWORD),
    ) {
        (Some(master), _) => super::snapshot::Key::Master(master),
        (None, Some(password)) => super::snapshot::Key::Password(password),
        (None, None) => {
            return Err(MoverError::Credentials(format!(
                "${} or ${} is required",
                super::snapshot::REPOSITORY_KEY,
                super::snapshot::REPOSITORY_PASSWORD
            )));
        }
    };
    super::snapshot::Repo::new(endpoint, secret, prefix, key, options.repository_id.clone())
}

/// A snapshot backup of the `sources` as the flags describe them.
fn snapshot_backup(
    sources: &[std::path::PathBuf],
    flags: &SnapshotFlags,
    header: custody_proto::manifest::Header,
    started_at: &str,
    tar: Option<super::stream::TarInput>,
) -> Result<super::snapshot::SnapshotBackup, MoverError> {
    if tar.is_some() && sources.len() != 1 {
        return Err(MoverError::Local(format!(
            "a tool's stream is one volume, and {} were given",
            sources.len()
        )));
    }
    let required = |value: &Option<String>, name: &str| {
        value
            .clone()
            .filter(|value| !value.is_empty())
            .ok_or_else(|| {
                MoverError::Local(format!("--{name} is required with --repository-prefix"))
            })
    };
    use custody_proto::mover::flags;
    if flags.volume.len() != sources.len()
        || flags.claim.len() != sources.len()
        || !(flags.mount_path.is_empty() || flags.mount_path.len() == sources.len())
    {
        return Err(MoverError::Local(format!(
            "--{}, --{} and --{} are given once per --{} ({} sources, {} volumes, {} claims, {} mount paths)",
            flags::VOLUME,
            flags::CLAIM,
            flags::MOUNT_PATH,
            flags::SOURCE,
            sources.len(),
            flags.volume.len(),
            flags.claim.len(),
            flags.mount_path.len()
        )));
    }
    let mut names = std::collections::BTreeSet::new();
    let volumes: Vec<super::snapshot::Volume> = sources
        .iter()
        .enumerate()
        .map(|(index, source)| super::snapshot::Volume {
            name: flags.volume[index].clone(),
            claim: flags.claim[index].clone(),
            root: source.clone(),
            mount_path: flags
                .mount_path
                .get(index)
                .filter(|path| !path.is_empty())
                .cloned(),
            tar: tar.clone(),
        })
        .collect();
    if let Some(bad) = volumes.iter().find(|volume| {
        volume.name.is_empty()
            || volume.claim.is_empty()
            || volume.name.contains('/')
            || !names.insert(volume.name.clone())
    }) {
        return Err(MoverError::Local(format!(
            "volume {:?} (claim {:?}): every volume needs a name of its own without '/', and a claim",
            bad.name, bad.claim
        )));
    }
    let namespace = required(&flags.namespace, flags::NAMESPACE)?;
    let meta = SnapshotMeta {
        custody_snapshot: custody_repository::snapshot::FORMAT_VERSION,
        origin_cluster: required(&flags.origin_cluster, flags::ORIGIN_CLUSTER)?,
        backup: ObjectRef {
            namespace: namespace.clone(),
            name: required(&flags.backup_name, flags::BACKUP_NAME)?,
            uid: header.backup_uid.clone(),
        },
        cluster: ObjectRef {
            namespace,
            name: required(&flags.cluster, flags::CLUSTER)?,
            uid: header.cluster_uid.clone(),
        },
        consistency: required(&flags.consistency, flags::CONSISTENCY)?,
        started_at: started_at.to_string(),
        completed_at: None,
        volumes: volumes
            .iter()
            .map(|volume| VolumeMeta {
                name: volume.name.clone(),
                claim: volume.claim.clone(),
                manifest: None,
            })
            .collect(),
    };
    Ok(super::snapshot::SnapshotBackup {
        volumes,
        meta,
        header,
        parent: flags.parent.clone().filter(|parent| !parent.is_empty()),
    })
}

/// Runs a snapshot backup on a blocking thread; SIGTERM and a lost freeze stop it, and a
/// frozen filesystem thaws once every file is read.
async fn snapshot_backup_run(
    repo: super::snapshot::Repo,
    request: super::snapshot::SnapshotBackup,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut held: Option<super::freeze::Held>,
) -> Result<custody_proto::mover::BackupResult, MoverError> {
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let stopping = stopping.clone();
        let mut lost = held.as_ref().map(|held| held.lost.clone());
        tokio::spawn(async move {
            let lost_freeze = async {
                // Released (the sender dropped without a reason, once every file was read):
                // nothing is lost, and only a signal stops the rest of the backup.
                let lost = match lost.as_mut() {
                    Some(lost) => lost.wait_for(Option::is_some).await.is_ok(),
                    None => false,
                };
                if !lost {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => {}
                _ = lost_freeze => {}
            }
            stopping.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };
    let frozen_at = held.as_ref().map(super::freeze::Held::since);
    let read_at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let on_read: Option<Box<dyn FnOnce() + Send>> = held.as_mut().map(|held| {
        let release = held.releaser();
        let read_at = read_at.clone();
        Box::new(move || {
            *read_at.lock().expect("read time") = Some(std::time::Instant::now());
            release();
        }) as Box<dyn FnOnce() + Send>
    });
    let outcome = tokio::task::spawn_blocking(move || {
        super::snapshot::backup(&repo, request, stopping, on_read)
    })
    .await
    .map_err(|error| MoverError::Local(format!("the backup thread: {error}")));
    watcher.abort();
    // A freeze lost while the volume was read is the cause of whatever failed after it.
    if let (Some(held), Some(frozen_at)) = (&held, frozen_at)
        && let Some(reason) = held.lost_reason()
    {
        return Err(MoverError::FreezeLost {
            seconds: frozen_at.elapsed().as_secs_f64(),
            reason,
        });
    }
    let mut result = outcome??;
    if let (Some(frozen_at), Some(read_at)) = (frozen_at, *read_at.lock().expect("read time")) {
        result.frozen_millis =
            Some(read_at.saturating_duration_since(frozen_at).as_millis() as u64);
    }
    Ok(result)
}

async fn verify(
    target: &std::path::Path,
    manifest_hash: &str,
    backup_uid: &str,
    restore_uid: &str,
) -> Result<String, (MoverFailure, String)> {
    let manifest_hash = blake3::Hash::from_hex(manifest_hash)
        .map_err(|error| (MoverFailure::InvalidManifestHash, error.to_string()))?;
    let expected = crate::verify::Expected {
        manifest_hash,
        backup_uid: backup_uid.to_string(),
        restore_uid: restore_uid.to_string(),
    };
    let target = target.to_path_buf();
    let verified = tokio::task::spawn_blocking(move || {
        crate::verify::verify_tree(&target, &expected, crate::verify::Options::default())
    })
    .await
    .map_err(|error| {
        (
            MoverFailure::VerificationFailed,
            format!("VerificationAborted: {error}"),
        )
    })?
    .map_err(|failure| {
        (
            MoverFailure::VerificationFailed,
            format!("{}: {failure}", failure.reason()),
        )
    })?;
    let result = VerifyResult {
        entries: verified.entries,
        files: verified.files,
        bytes: verified.bytes,
    };
    Ok(serde_json::to_string(&result).expect("plain data serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use custody_kube::s3::Throttle;

    #[test]
    fn only_a_frozen_copy_goes_past_the_upload_bound() {
        let bound = Throttle::new(Some(1 << 20));
        assert_eq!(
            upload_bound(false, &bound).bytes_per_second(),
            Some(1 << 20)
        );
        assert_eq!(upload_bound(true, &bound).bytes_per_second(), None);
        assert_eq!(
            upload_bound(true, &Throttle::default()).bytes_per_second(),
            None
        );
        assert_eq!(
            upload_bound(false, &Throttle::default()).bytes_per_second(),
            None
        );
    }
}
