use super::*;

#[test]
fn every_probe_outcome_has_its_own_reason() {
    let rows = [
        (Probe::Reachable, Status::True, reasons::AVAILABLE),
        (
            Probe::SecretMissing { name: "s3".into() },
            Status::False,
            reasons::SECRET_NOT_FOUND,
        ),
        (
            Probe::SecretIncomplete {
                name: "s3".into(),
                key: s3::SECRET_ACCESS_KEY,
            },
            Status::False,
            reasons::SECRET_INVALID,
        ),
        (
            Probe::InvalidCaBundle("no certificate".into()),
            Status::False,
            reasons::INVALID_CA_BUNDLE,
        ),
        (
            Probe::Refused {
                status: 404,
                code: Some("NoSuchBucket".into()),
            },
            Status::False,
            reasons::BUCKET_NOT_FOUND,
        ),
        (
            Probe::Refused {
                status: 403,
                code: Some("InvalidAccessKeyId".into()),
            },
            Status::False,
            reasons::ACCESS_DENIED,
        ),
        (
            Probe::Refused {
                status: 401,
                code: None,
            },
            Status::False,
            reasons::ACCESS_DENIED,
        ),
        (
            Probe::Refused {
                status: 500,
                code: None,
            },
            Status::False,
            reasons::UNEXPECTED_RESPONSE,
        ),
        (
            Probe::Unreachable("connection refused".into()),
            Status::False,
            reasons::ENDPOINT_UNREACHABLE,
        ),
        (
            Probe::Tls("invalid peer certificate: UnknownIssuer".into()),
            Status::False,
            reasons::TLS_ERROR,
        ),
        (
            Probe::IdentityNotAllowed("custody may not ask".into()),
            Status::False,
            reasons::WEB_IDENTITY_NOT_ALLOWED,
        ),
        (
            Probe::IdentityRefused("the STS refused".into()),
            Status::False,
            reasons::WEB_IDENTITY_REFUSED,
        ),
        (
            Probe::AccountMissing("no such ServiceAccount".into()),
            Status::False,
            reasons::SERVICE_ACCOUNT_NOT_FOUND,
        ),
    ];
    for (probe, status, reason) in rows {
        let desired = readiness(&probe, "backups");
        assert_eq!(
            (desired.status, desired.reason),
            (status, reason),
            "{probe:?}"
        );
        assert_eq!(desired.type_, types::READY);
        assert!(!desired.message.is_empty());
    }
}

/// A repository waiting for its Secret (the controller cannot watch Secrets) looks again in
/// 5 s; anything else, broken or fine, in 30 s.
#[test]
fn a_repository_waiting_for_its_secret_is_checked_sooner() {
    use crate::encryption::EncryptionError;
    let missing = Probe::SecretMissing { name: "s3".into() };
    let incomplete = Probe::SecretIncomplete {
        name: "s3".into(),
        key: s3::ACCESS_KEY_ID,
    };
    let key_missing = EncryptionError::SecretNotFound("key".into());
    let key_empty = EncryptionError::SecretEmpty("key".into());
    let rejected = EncryptionError::KeyRejected {
        secret: "key".into(),
        location: "s3://b/p".into(),
    };
    let taken = EncryptionError::MasterKeySecretTaken("key-master".into());
    let unreadable = EncryptionError::Unreadable("config".into());
    let not_allowed = Probe::IdentityNotAllowed("no binding".into());
    let no_account = Probe::AccountMissing("no account".into());
    let refused = Probe::IdentityRefused("audience".into());
    let rows: [(&Probe, Option<&EncryptionError>, u64); 13] = [
        (&missing, None, 5),
        (&incomplete, None, 5),
        (&not_allowed, None, 5),
        (&no_account, None, 5),
        (&refused, None, 30),
        (&Probe::Reachable, Some(&key_missing), 5),
        (&Probe::Reachable, Some(&key_empty), 5),
        (&Probe::Reachable, None, 30),
        (&Probe::Reachable, Some(&rejected), 30),
        (&Probe::Reachable, Some(&taken), 30),
        (&Probe::Reachable, Some(&unreadable), 30),
        (&Probe::Unreachable("refused".into()), None, 30),
        (
            &Probe::Refused {
                status: 403,
                code: None,
            },
            None,
            30,
        ),
    ];
    for (probe, key, seconds) in rows {
        assert_eq!(
            recheck_after(probe, key).as_secs(),
            seconds,
            "{probe:?} {key:?}"
        );
    }
}

/// Once the bucket answers, `Ready` says whether the encrypted repository opens (without a
/// key Secret, format 1 goes on), and a command backup may still write its dump when only the
/// encrypted repository is unusable.
#[test]
fn the_encrypted_repository_decides_readiness() {
    use crate::encryption::{EncryptionError, Opened};
    use custody_kube::api::{EncryptedRepository, RepositoryKey};
    let opened = Opened {
        status: EncryptedRepository {
            id: "r1".into(),
            prefix: "custody/custody_repository".into(),
            keys: vec![RepositoryKey {
                name: "password".into(),
                key_id: "k1".into(),
            }],
            master_key_secret: "store-master-key".into(),
            key_secret_version: "1".into(),
        },
        created: true,
        keys_added: Vec::new(),
        keys_removed: Vec::new(),
    };
    // (what opening the repository gave, the Ready status, its reason)
    type Case = (
        Option<Result<Opened, EncryptionError>>,
        Status,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (Some(Ok(opened)), Status::True, reasons::AVAILABLE),
        (None, Status::True, reasons::AVAILABLE),
        (
            Some(Err(EncryptionError::SecretNotFound("keys".into()))),
            Status::False,
            reasons::KEY_SECRET_NOT_FOUND,
        ),
        (
            Some(Err(EncryptionError::SecretEmpty("keys".into()))),
            Status::False,
            reasons::KEY_SECRET_EMPTY,
        ),
        (
            Some(Err(EncryptionError::KeyRejected {
                secret: "keys".into(),
                location: "s3:bucket/custody_repository".into(),
            })),
            Status::False,
            reasons::KEY_REJECTED,
        ),
        (
            Some(Err(EncryptionError::Unreadable("the server".into()))),
            Status::False,
            reasons::REPOSITORY_UNREADABLE,
        ),
        (
            Some(Err(EncryptionError::MasterKeySecretTaken(
                "store-master-key".into(),
            ))),
            Status::False,
            reasons::MASTER_KEY_SECRET_TAKEN,
        ),
    ];
    for (outcome, status, reason) in cases {
        let desired = encrypted_readiness(outcome.as_ref(), "bucket");
        assert_eq!(
            (desired.status, desired.reason),
            (status, reason),
            "{outcome:?}"
        );
        assert!(bucket_answered(desired.reason), "{reason}");
    }
    for unreachable in [
        reasons::SECRET_NOT_FOUND,
        reasons::BUCKET_NOT_FOUND,
        reasons::ACCESS_DENIED,
        reasons::ENDPOINT_UNREACHABLE,
        reasons::TLS_ERROR,
    ] {
        assert!(!bucket_answered(unreachable), "{unreachable}");
    }
}
