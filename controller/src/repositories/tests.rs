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
        let expected_recheck = if status == Status::True { 300 } else { 30 };
        assert_eq!(
            recheck_after(&probe).as_secs(),
            expected_recheck,
            "{probe:?}"
        );
    }
}
