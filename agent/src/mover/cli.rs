//! `custody-mover`'s commands: flags and environment in, JSON out.

use custody_kube::s3::Endpoint;
use custody_proto::mover::VerifyResult;
use custody_proto::reasons::MoverFailure;

use super::{MoverError, RestoreRequest, backup, header, restore, secret_from_env};
use crate::cli::{MoverCommand, MoverOptions};

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
    })
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
        let secret = secret_from_env()?;
        match &options.command {
            MoverCommand::Backup {
                source,
                prefix,
                backup_uid,
                cluster_uid,
                freeze_claim,
                max_freeze_seconds,
            } => {
                let created_at = k8s_openapi::jiff::Timestamp::now().to_string();
                // Frozen last, just before the first read: the freeze lasts only the copy.
                let held = match (freeze_claim, max_freeze_seconds) {
                    (Some(claim), Some(max_seconds)) => {
                        Some(super::freeze::hold(claim, *max_seconds).await?)
                    }
                    _ => None,
                };
                let result = backup(
                    &endpoint,
                    &secret,
                    source,
                    prefix,
                    header(backup_uid, cluster_uid, &created_at),
                    stop.clone(),
                    held,
                )
                .await?;
                Ok(serde_json::to_string(&result).unwrap_or_default())
            }
            MoverCommand::Restore {
                target,
                key,
                manifest_key,
                manifest_hash,
                backup_uid,
                restore_uid,
                overwrite,
            } => {
                let result = restore(
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
                .await?;
                Ok(serde_json::to_string(&result).unwrap_or_default())
            }
            MoverCommand::Verify { .. } => unreachable!("handled above"),
        }
    }
    .await;
    outcome.map_err(|error: MoverError| (error.reason(), error.to_string()))
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
