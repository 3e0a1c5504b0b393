//! A BackupRepository's encrypted repository (format 2): opened (or created) with the
//! passwords of its key Secret, its key files kept in step with that Secret, and its master
//! key kept in a Secret of custody's own for the movers.
//!
//! A password's key derivation (restic's scrypt) takes half a second and 128 MiB: it runs
//! only when the key Secret changed since the key files were last brought in step with it,
//! one repository at a time.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use tokio::sync::Semaphore;

use custody_kube::api::{BackupRepository, EncryptedRepository, RepositoryKey};
use custody_kube::s3::{self, Endpoint};
use custody_repository::backend::{Location, S3Backend, repository_prefix};
use custody_repository::open::{self, Arrival, OpenError, Password, RecordedKey};

/// The master key's key in custody's Secret: the mover's environment variable.
pub use custody_proto::mover::env::REPOSITORY_KEY as MASTER_KEY_ENTRY;

/// Why the encrypted repository is not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncryptionError {
    #[error("the key Secret {0} does not exist in this namespace")]
    SecretNotFound(String),
    #[error("the key Secret {0} holds no password (each of its keys is one)")]
    SecretEmpty(String),
    #[error(
        "no password in Secret {secret} opens the repository at {location}: nothing was read or written. Put a password of this repository into the Secret (losing every password loses the data), or point spec.prefix at another repository"
    )]
    KeyRejected { secret: String, location: String },
    #[error("{0}")]
    Unreadable(String),
    #[error(
        "Secret {0} exists and is not this BackupRepository's: custody keeps the repository's master key there; delete or rename it"
    )]
    MasterKeySecretTaken(String),
}

/// What opening the repository did.
#[derive(Clone, Debug, PartialEq)]
pub struct Opened {
    pub status: EncryptedRepository,
    /// custody created the repository (there was none at the prefix).
    pub created: bool,
    /// Passwords that got a key file, and key files removed.
    pub keys_added: Vec<String>,
    pub keys_removed: Vec<String>,
}

/// Key derivations run one at a time (each takes 128 MiB).
fn derivations() -> &'static Semaphore {
    static SEMAPHORE: std::sync::OnceLock<Semaphore> = std::sync::OnceLock::new();
    SEMAPHORE.get_or_init(|| Semaphore::new(1))
}

/// The Secret custody keeps a repository's master key in.
pub fn master_key_secret_name(repository: &str) -> String {
    format!("{repository}-master-key")
}

/// Whether what the status records still holds for the key Secret at `version`: then the
/// passwords need not be derived again.
pub fn up_to_date(recorded: Option<&EncryptedRepository>, version: &str, prefix: &str) -> bool {
    recorded.is_some_and(|recorded| {
        !version.is_empty() && recorded.key_secret_version == version && recorded.prefix == prefix
    })
}

/// The passwords in a key Secret, by key name.
pub fn passwords(secret: &Secret) -> Vec<Password> {
    let mut passwords: Vec<Password> = secret
        .data
        .iter()
        .flatten()
        .map(|(name, value)| Password {
            name: name.clone(),
            value: String::from_utf8_lossy(&value.0)
                .trim_end_matches('\n')
                .to_string(),
        })
        .filter(|password| !password.value.is_empty())
        .collect();
    passwords.sort_by(|a, b| a.name.cmp(&b.name));
    passwords
}

/// Opens (or creates) the repository of `repository` with its key Secret, brings its key
/// files in step with the Secret and keeps its master key in custody's Secret.
pub async fn open_repository(
    client: &kube::Client,
    repository: &BackupRepository,
    endpoint: &Endpoint,
    credentials: &s3::Credentials,
) -> Result<Opened, EncryptionError> {
    let namespace = repository.namespace().unwrap_or_default();
    let name = repository.name_any();
    let encryption = repository
        .spec
        .encryption
        .as_ref()
        .expect("called for an encrypted repository");
    let secret_name = encryption.key_secret_ref.name.clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|error| {
            EncryptionError::Unreadable(format!("reading Secret {secret_name}: {error}"))
        })?
        .ok_or_else(|| EncryptionError::SecretNotFound(secret_name.clone()))?;
    let passwords = passwords(&secret);
    if passwords.is_empty() {
        return Err(EncryptionError::SecretEmpty(secret_name));
    }
    let version = secret.resource_version().unwrap_or_default();
    let prefix = repository_prefix(repository.spec.prefix.as_deref().unwrap_or_default());
    let recorded = repository
        .status
        .as_ref()
        .and_then(|status| status.repository.as_ref());
    let master_key_secret = master_key_secret_name(&name);
    let existing_master = secrets.get_opt(&master_key_secret).await.map_err(|error| {
        EncryptionError::Unreadable(format!("reading Secret {master_key_secret}: {error}"))
    })?;
    if let Some(existing) = &existing_master
        && !owned_by(existing, repository)
    {
        return Err(EncryptionError::MasterKeySecretTaken(master_key_secret));
    }
    if up_to_date(recorded, &version, &prefix) && existing_master.is_some() {
        return Ok(Opened {
            status: recorded.cloned().expect("up to date"),
            created: false,
            keys_added: Vec::new(),
            keys_removed: Vec::new(),
        });
    }

    let _derivation = derivations()
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let client_s3 = s3::client(endpoint, credentials)
        .map_err(|error| EncryptionError::Unreadable(error.to_string()))?;
    let location = Location {
        bucket: endpoint.bucket.clone(),
        prefix: prefix.clone(),
    };
    let recorded_keys: Vec<RecordedKey> = recorded
        .map(|recorded| {
            recorded
                .keys
                .iter()
                .map(|key| RecordedKey {
                    name: key.name.clone(),
                    key_id: key.key_id.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    let runtime = tokio::runtime::Handle::current();
    let limits = endpoint.limits;
    let secret_for_errors = secret_name.clone();
    let opened = tokio::task::spawn_blocking(move || {
        let backend = S3Backend::new(client_s3, location, runtime).with_limits(limits);
        let backends = rustic_core::RepositoryBackends::new(backend.clone().shared(), None);
        let (opened, arrival) = open::open_or_init(&backends, &passwords)?;
        let opens: BTreeMap<String, Option<String>> =
            open::key_files_opened(&backends, &passwords)?;
        let plan = open::plan_keys(&opens, &recorded_keys, &opened.key_id.to_hex());
        let keys = open::apply_keys(&opened, &passwords, &plan)?;
        let master_key = serde_json::to_string(&opened.repository.key()).map_err(|error| {
            OpenError::Unreadable {
                location: rustic_core::ReadBackend::location(&backend),
                message: error.to_string(),
            }
        })?;
        Ok::<_, OpenError>((opened.repository_id, arrival, plan, keys, master_key))
    })
    .await
    .map_err(|error| EncryptionError::Unreadable(format!("the key thread: {error}")))?
    .map_err(|error| match error {
        OpenError::KeyRejected { location, .. } => EncryptionError::KeyRejected {
            secret: secret_for_errors,
            location,
        },
        other => EncryptionError::Unreadable(other.to_string()),
    })?;
    let (repository_id, arrival, plan, keys, master_key) = opened;
    keep_master_key(
        &secrets,
        repository,
        &master_key_secret,
        existing_master,
        &master_key,
    )
    .await?;
    Ok(Opened {
        status: EncryptedRepository {
            id: repository_id,
            prefix,
            keys: keys
                .into_iter()
                .map(|key| RepositoryKey {
                    name: key.name,
                    key_id: key.key_id,
                })
                .collect(),
            master_key_secret,
            key_secret_version: version,
        },
        created: arrival == Arrival::Created,
        keys_added: plan.add,
        keys_removed: plan.remove.into_iter().map(|key| key.name).collect(),
    })
}

fn owned_by(secret: &Secret, repository: &BackupRepository) -> bool {
    let uid = repository.metadata.uid.as_deref().unwrap_or_default();
    secret
        .owner_references()
        .iter()
        .any(|owner| owner.kind == "BackupRepository" && owner.uid == uid)
}

/// Writes the master key into custody's Secret (created owned by the BackupRepository, so
/// that it goes with it).
async fn keep_master_key(
    secrets: &Api<Secret>,
    repository: &BackupRepository,
    name: &str,
    existing: Option<Secret>,
    master_key: &str,
) -> Result<(), EncryptionError> {
    let data = BTreeMap::from([(
        MASTER_KEY_ENTRY.to_string(),
        k8s_openapi::ByteString(master_key.as_bytes().to_vec()),
    )]);
    let failed =
        |error: kube::Error| EncryptionError::Unreadable(format!("writing Secret {name}: {error}"));
    match existing {
        Some(mut secret) => {
            if secret.data.as_ref() == Some(&data) {
                return Ok(());
            }
            secret.data = Some(data);
            secrets
                .replace(name, &PostParams::default(), &secret)
                .await
                .map_err(failed)?;
        }
        None => {
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_string()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: BackupRepository::api_version(&()).to_string(),
                        kind: BackupRepository::kind(&()).to_string(),
                        name: repository.name_any(),
                        uid: repository.metadata.uid.clone().unwrap_or_default(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/managed-by".to_string(),
                        "custody".to_string(),
                    )])),
                    ..Default::default()
                },
                data: Some(data),
                type_: Some("Opaque".into()),
                ..Default::default()
            };
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .map_err(failed)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_every_non_empty_key_in_name_order() {
        let secret = Secret {
            data: Some(BTreeMap::from([
                (
                    "new".to_string(),
                    k8s_openapi::ByteString(b"second\n".to_vec()),
                ),
                ("empty".to_string(), k8s_openapi::ByteString(Vec::new())),
                (
                    "old".to_string(),
                    k8s_openapi::ByteString(b"first".to_vec()),
                ),
            ])),
            ..Default::default()
        };
        let found: Vec<(String, String)> = passwords(&secret)
            .into_iter()
            .map(|password| (password.name, password.value))
            .collect();
        assert_eq!(
            found,
            [
                ("new".to_string(), "second".to_string()),
                ("old".to_string(), "first".to_string())
            ]
        );
        assert!(passwords(&Secret::default()).is_empty());
    }

    #[test]
    fn passwords_are_derived_again_only_when_the_secret_or_the_place_changed() {
        let recorded = EncryptedRepository {
            id: "r".into(),
            prefix: "p/custody_repository".into(),
            keys: Vec::new(),
            master_key_secret: "store-master-key".into(),
            key_secret_version: "41".into(),
        };
        assert!(up_to_date(Some(&recorded), "41", "p/custody_repository"));
        assert!(!up_to_date(Some(&recorded), "42", "p/custody_repository"));
        assert!(!up_to_date(Some(&recorded), "41", "q/custody_repository"));
        assert!(!up_to_date(Some(&recorded), "", "p/custody_repository"));
        assert!(!up_to_date(None, "41", "p/custody_repository"));
    }
}
