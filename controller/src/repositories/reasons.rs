//! Reasons of a BackupRepository's `Ready` condition.

pub const AVAILABLE: &str = "Available";
pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
pub const SECRET_INVALID: &str = "SecretInvalid";
pub const INVALID_CA_BUNDLE: &str = "InvalidCABundle";
pub const BUCKET_NOT_FOUND: &str = "BucketNotFound";
pub const ACCESS_DENIED: &str = "AccessDenied";
pub const ENDPOINT_UNREACHABLE: &str = "EndpointUnreachable";
pub const TLS_ERROR: &str = "TLSError";
pub const UNEXPECTED_RESPONSE: &str = "UnexpectedResponse";
pub const KEY_SECRET_NOT_FOUND: &str = "KeySecretNotFound";
pub const KEY_SECRET_EMPTY: &str = "KeySecretEmpty";
pub const KEY_REJECTED: &str = "KeyRejected";
pub const REPOSITORY_UNREADABLE: &str = "RepositoryUnreadable";
pub const MASTER_KEY_SECRET_TAKEN: &str = "MasterKeySecretTaken";
pub const WEB_IDENTITY_NOT_ALLOWED: &str = "WebIdentityNotAllowed";
pub const WEB_IDENTITY_REFUSED: &str = "WebIdentityRefused";
pub const SERVICE_ACCOUNT_NOT_FOUND: &str = "ServiceAccountNotFound";

/// Whether a `Ready` reason says the bucket answered (only the encrypted repository is not
/// usable): a command backup, which writes its own dump, may go on.
pub fn bucket_answered(reason: &str) -> bool {
    [
        AVAILABLE,
        KEY_SECRET_NOT_FOUND,
        KEY_SECRET_EMPTY,
        KEY_REJECTED,
        REPOSITORY_UNREADABLE,
        MASTER_KEY_SECRET_TAKEN,
    ]
    .contains(&reason)
}
