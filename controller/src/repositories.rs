//! BackupRepository: checks that the endpoint answers, the credentials work and the bucket
//! exists, and says so in `Ready` with a reason a user can act on. Re-checked periodically
//! and whenever the credentials Secret changes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};

use crate::conditions::{self, Desired, Status, types};
use crate::encryption::EncryptionError;
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::{self, Context};
use custody_kube::api::{BackupRepository, HasConditions};
use custody_kube::s3::{self, CredentialsError};

/// Field manager of the repository's `Ready` condition.
pub const FIELD_MANAGER: &str = "custody.io/backup-repository";

/// Reasons of the repository's `Ready` condition.
pub mod reasons;
pub use reasons::bucket_answered;

/// The `Ready` condition once the bucket answered: the encrypted repository new Backups go to
/// is open, or why not.
pub fn encrypted_readiness(
    outcome: Option<&Result<crate::encryption::Opened, EncryptionError>>,
    bucket: &str,
) -> Desired {
    let (status, reason, message) = match outcome {
        // Format 1 goes on for a repository without a key Secret (an upgrade breaks no
        // schedule); the Event and the message say how to move.
        None => (
            Status::True,
            reasons::AVAILABLE,
            format!(
                "bucket {bucket} is reachable with the configured credentials; Backups are written unencrypted (format 1) until spec.encryption names a Secret of passwords"
            ),
        ),
        Some(Ok(opened)) => (
            Status::True,
            reasons::AVAILABLE,
            format!(
                "bucket {bucket} is reachable and repository {} at {} opens with the key Secret ({} password{})",
                opened.status.id,
                opened.status.prefix,
                opened.status.keys.len(),
                if opened.status.keys.len() == 1 {
                    ""
                } else {
                    "s"
                }
            ),
        ),
        Some(Err(error)) => (
            Status::False,
            match error {
                EncryptionError::SecretNotFound(_) => reasons::KEY_SECRET_NOT_FOUND,
                EncryptionError::SecretEmpty(_) => reasons::KEY_SECRET_EMPTY,
                EncryptionError::KeyRejected { .. } => reasons::KEY_REJECTED,
                EncryptionError::Unreadable(_) => reasons::REPOSITORY_UNREADABLE,
                EncryptionError::MasterKeySecretTaken(_) => reasons::MASTER_KEY_SECRET_TAKEN,
            },
            error.to_string(),
        ),
    };
    Desired {
        type_: types::READY,
        status,
        reason,
        message,
    }
}

/// What checking a repository found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    SecretMissing {
        name: String,
    },
    SecretIncomplete {
        name: String,
        key: &'static str,
    },
    InvalidCaBundle(String),
    /// The bucket answered a HEAD.
    Reachable,
    /// The server answered with an HTTP error.
    Refused {
        status: u16,
        code: Option<String>,
    },
    /// No answer: connection refused, DNS, timeout.
    Unreachable(String),
    /// The TLS handshake failed (certificate, protocol).
    Tls(String),
    /// A web identity: the namespace has not let custody ask for its ServiceAccount's tokens.
    IdentityNotAllowed(String),
    /// A web identity: the STS refused the token (or answered no credentials).
    IdentityRefused(String),
    /// A web identity: its ServiceAccount does not exist.
    AccountMissing(String),
}

/// The `Ready` condition for what a check found.
pub fn readiness(probe: &Probe, bucket: &str) -> Desired {
    let (status, reason, message) = match probe {
        Probe::Reachable => (
            Status::True,
            reasons::AVAILABLE,
            format!("bucket {bucket} is reachable with the configured credentials"),
        ),
        Probe::SecretMissing { name } => (
            Status::False,
            reasons::SECRET_NOT_FOUND,
            format!("credentials Secret {name} does not exist in this namespace"),
        ),
        Probe::SecretIncomplete { name, key } => (
            Status::False,
            reasons::SECRET_INVALID,
            format!("credentials Secret {name} has no key {key}"),
        ),
        Probe::InvalidCaBundle(message) => (
            Status::False,
            reasons::INVALID_CA_BUNDLE,
            format!("spec.caBundle is not a usable PEM bundle: {message}"),
        ),
        Probe::Refused { status: 404, .. } => (
            Status::False,
            reasons::BUCKET_NOT_FOUND,
            format!("bucket {bucket} does not exist; create it or fix spec.bucket"),
        ),
        Probe::Refused {
            status: 401 | 403,
            code,
        } => (
            Status::False,
            reasons::ACCESS_DENIED,
            format!(
                "the server refused the credentials for bucket {bucket} ({}); check the Secret's keys (or the web identity's role) and the bucket policy",
                code.as_deref().unwrap_or("403")
            ),
        ),
        Probe::Refused { status, code } => (
            Status::False,
            reasons::UNEXPECTED_RESPONSE,
            format!(
                "the server answered HTTP {status}{} for bucket {bucket}",
                code.as_deref()
                    .map(|code| format!(" ({code})"))
                    .unwrap_or_default()
            ),
        ),
        Probe::Unreachable(message) => (
            Status::False,
            reasons::ENDPOINT_UNREACHABLE,
            format!("the endpoint does not answer: {message}"),
        ),
        Probe::IdentityNotAllowed(message) => (
            Status::False,
            reasons::WEB_IDENTITY_NOT_ALLOWED,
            message.clone(),
        ),
        Probe::AccountMissing(message) => (
            Status::False,
            reasons::SERVICE_ACCOUNT_NOT_FOUND,
            message.clone(),
        ),
        Probe::IdentityRefused(message) => (
            Status::False,
            reasons::WEB_IDENTITY_REFUSED,
            format!(
                "{message}; check spec.webIdentity (roleArn, audience) and the STS's trust of the cluster's ServiceAccount issuer"
            ),
        ),
        Probe::Tls(message) => (
            Status::False,
            reasons::TLS_ERROR,
            format!(
                "TLS with the endpoint failed: {message}; check spec.caBundle and the URL scheme"
            ),
        ),
    };
    Desired {
        type_: types::READY,
        status,
        reason,
        message,
    }
}

/// How long until the next check. The controller neither lists nor watches Secrets (its
/// ClusterRole cannot), so a Secret is read by name at each check: every 5 s while the
/// repository waits for its credentials or key Secret to appear or be filled in (what a user
/// does next after creating the repository), every 30 s otherwise, broken or fine, so a
/// rotated password or key is taken within half a minute.
pub fn recheck_after(probe: &Probe, key: Option<&EncryptionError>) -> Duration {
    match (probe, key) {
        (
            Probe::SecretMissing { .. }
            | Probe::SecretIncomplete { .. }
            | Probe::IdentityNotAllowed(_)
            | Probe::AccountMissing(_),
            _,
        )
        | (_, Some(EncryptionError::SecretNotFound(_) | EncryptionError::SecretEmpty(_))) => {
            Duration::from_secs(5)
        }
        _ => Duration::from_secs(30),
    }
}

/// Classifies a failed HeadBucket.
pub fn classify<E: std::error::Error + 'static, R: std::fmt::Debug + 'static>(
    error: &aws_sdk_s3::error::SdkError<E, R>,
    status: Option<u16>,
    code: Option<String>,
) -> Probe {
    use aws_sdk_s3::error::SdkError;
    match error {
        SdkError::ServiceError(_) | SdkError::ResponseError(_) => Probe::Refused {
            status: status.unwrap_or(0),
            code,
        },
        SdkError::TimeoutError(_) => Probe::Unreachable("timed out".to_string()),
        _ => {
            let message = s3::error_chain(error);
            let lower = message.to_lowercase();
            if [
                "certificate",
                "tls",
                "handshake",
                "invalidcontenttype",
                "corrupt message",
            ]
            .iter()
            .any(|needle| lower.contains(needle))
            {
                Probe::Tls(message)
            } else {
                Probe::Unreachable(message)
            }
        }
    }
}

/// Reads the repository's Secret (or exchanges its web identity's token at the STS) and asks
/// the bucket; the credentials that worked.
pub async fn probe(
    client: &kube::Client,
    repository: &BackupRepository,
) -> (Probe, Option<s3::Credentials>) {
    let credentials = match s3::credentials_of(client, repository).await {
        Ok(s3::Credentials::WebIdentity(identity)) => {
            match identity.assume(&s3::endpoint_of(repository)).await {
                Ok(session) => s3::Credentials::Session(session),
                Err(error @ custody_kube::sts::StsError::TokenForbidden { .. }) => {
                    return (Probe::IdentityNotAllowed(error.to_string()), None);
                }
                Err(error @ custody_kube::sts::StsError::AccountMissing { .. }) => {
                    return (Probe::AccountMissing(error.to_string()), None);
                }
                Err(
                    error @ (custody_kube::sts::StsError::Refused { .. }
                    | custody_kube::sts::StsError::Unreadable { .. }),
                ) => return (Probe::IdentityRefused(error.to_string()), None),
                Err(error) => return (Probe::Unreachable(error.to_string()), None),
            }
        }
        Ok(credentials) => credentials,
        Err(CredentialsError::SecretMissing { name }) => {
            return (Probe::SecretMissing { name }, None);
        }
        Err(CredentialsError::KeyMissing { name, key }) => {
            return (Probe::SecretIncomplete { name, key }, None);
        }
        Err(error @ CredentialsError::Read { .. }) => {
            return (Probe::Unreachable(error.to_string()), None);
        }
    };
    let probe = head(repository, &credentials).await;
    (probe, Some(credentials))
}

async fn head(repository: &BackupRepository, credentials: &s3::Credentials) -> Probe {
    let endpoint = s3::endpoint_of(repository);
    let s3_client = match s3::client(&endpoint, credentials) {
        Ok(client) => client,
        Err(error) => return Probe::InvalidCaBundle(error.to_string()),
    };
    let head = tokio::time::timeout(
        Duration::from_secs(15),
        s3_client.head_bucket().bucket(&endpoint.bucket).send(),
    )
    .await;
    match head {
        Err(_) => Probe::Unreachable("no answer within 15s".to_string()),
        Ok(Ok(_)) => Probe::Reachable,
        Ok(Err(error)) => {
            let status = error.raw_response().map(|raw| raw.status().as_u16());
            let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&error).map(str::to_string);
            classify(&error, status, code)
        }
    }
}

/// What the repository reconciler needs besides the shared context.
pub struct RepositoryContext {
    pub base: Arc<Context>,
    /// How maintenance Jobs run `custody-mover`.
    pub mover: crate::mover_job::MoverJob,
}

/// Checks one repository and writes `Ready`; runs its maintenance.
pub async fn reconcile(
    repository: Arc<BackupRepository>,
    context: Arc<RepositoryContext>,
) -> Result<Action> {
    let mover = &context.mover;
    let context = &context.base;
    let _measure = reconciler::Measure::start(&context.metrics, "BackupRepository");
    let (probe, credentials) = probe(&context.client, &repository).await;
    let name = repository.name_any();
    let namespace = repository.namespace().unwrap_or_default();
    // Once the bucket answers: the encrypted repository, opened with the key Secret.
    let opened = match (&probe, &repository.spec.encryption, &credentials) {
        (Probe::Reachable, Some(_), Some(credentials)) => Some(
            crate::encryption::open_repository(
                &context.client,
                &repository,
                &s3::endpoint_of(&repository),
                credentials,
            )
            .await,
        ),
        _ => None,
    };
    let desired = match &probe {
        Probe::Reachable => encrypted_readiness(opened.as_ref(), &repository.spec.bucket),
        _ => readiness(&probe, &repository.spec.bucket),
    };
    let recorded = repository
        .status
        .as_ref()
        .and_then(|status| status.repository.clone());
    let encrypted = match &opened {
        Some(Ok(opened)) => Some(opened.status.clone()),
        // Kept while it cannot be checked: what the Backups recorded stays true.
        _ => recorded.clone(),
    };
    if let Some(Ok(opened)) = &opened {
        let mut changes = Vec::new();
        if opened.created {
            changes.push(format!(
                "created repository {} at {} with the key Secret's first password",
                opened.status.id, opened.status.prefix
            ));
        }
        if !opened.keys_added.is_empty() {
            changes.push(format!("added key files for {:?}", opened.keys_added));
        }
        if !opened.keys_removed.is_empty() {
            changes.push(format!(
                "removed the key files of {:?} (no longer in the key Secret)",
                opened.keys_removed
            ));
        }
        if !changes.is_empty() {
            let note = Note {
                warning: false,
                reason: "RepositoryKeys".to_string(),
                text: changes.join("; "),
            };
            crate::reconciler::publish(context, repository.as_ref(), "OpenRepository", &note)
                .await?;
        }
    }
    let current = repository.conditions();
    let next = conditions::next(
        current,
        &desired,
        repository.meta().generation,
        Timestamp::now(),
    );
    if next.is_some() || encrypted != recorded {
        let next = next.unwrap_or_else(|| {
            current
                .iter()
                .find(|condition| condition.type_ == desired.type_)
                .cloned()
                .expect("an unchanged condition is there")
        });
        let flipped = conditions::flips(current, &next)
            || current
                .iter()
                .any(|condition| condition.type_ == next.type_ && condition.reason != next.reason);
        let api: Api<BackupRepository> = Api::namespaced(context.client.clone(), &namespace);
        crate::status::apply(
            &api,
            &name,
            FIELD_MANAGER,
            &format!("BackupRepository {namespace}/{name}"),
            &serde_json::json!({ "conditions": [next], "repository": encrypted }),
        )
        .await?;
        tracing::info!(
            namespace,
            name,
            reason = desired.reason,
            message = desired.message,
            "repository checked"
        );
        if flipped {
            let note = Note {
                warning: desired.status != Status::True,
                reason: desired.reason.to_string(),
                text: desired.message.clone(),
            };
            crate::reconciler::publish(context, repository.as_ref(), "CheckRepository", &note)
                .await?;
        }
    }
    let mut after = recheck_after(
        &probe,
        opened.as_ref().and_then(|opened| opened.as_ref().err()),
    );
    // Prune and check: a run recorded as going is followed even while the repository cannot
    // be opened; a new one starts only when it can.
    if let Some(encrypted) = &encrypted {
        let ready = matches!(&opened, Some(Ok(_)));
        if let Some(next) =
            crate::maintenance::maintain(context, mover, &repository, encrypted, ready).await?
        {
            after = after.min(next);
        }
    }
    if repository.spec.import_snapshots
        && let Some(Ok(opened)) = &opened
    {
        let mut current = (*repository).clone();
        current.status.get_or_insert_default().repository = Some(opened.status.clone());
        crate::imports::sync(context, &current).await?;
        after = after.min(crate::imports::LIST_EVERY);
    }
    Ok(Action::requeue(after))
}

/// Retries a failed reconciliation after a few seconds.
pub fn error_policy(
    repository: Arc<BackupRepository>,
    error: &Error,
    context: Arc<RepositoryContext>,
) -> Action {
    reconciler::error_policy(&*repository, error, &context.base)
}

/// The controller: repositories, each re-checked after [`recheck_after`] and when its
/// maintenance Job ends.
pub fn controller(
    context: Arc<RepositoryContext>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let client = context.base.client.clone();
    let repositories: Api<BackupRepository> = reconciler::scoped(client.clone(), namespace);
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = reconciler::scoped(client, namespace);
    // A maintenance Job's end reaches its repository at once. Secrets are not watched: see
    // [`recheck_after`].
    let controller = Controller::new(repositories, watcher::Config::default()).owns(
        jobs,
        watcher::Config::default().labels(&format!(
            "{}={}",
            custody_proto::names::LABEL_ROLE,
            crate::maintenance::ROLE_MAINTENANCE
        )),
    );
    reconciler::run(controller, reconcile, error_policy, context, stopped)
}

#[cfg(test)]
mod tests;
