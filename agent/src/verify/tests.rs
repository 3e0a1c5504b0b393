use super::*;

#[test]
fn symlink_escape_is_decided_lexically() {
    let table = [
        ("current", "base/1", false),
        ("a/b/link", "../c", false),
        ("a/b/link", "../../c", false),
        ("a/b/link", "../../../c", true),
        ("link", "../x", true),
        ("link", "/etc/passwd", true),
        ("a/link", "./../b", false),
        ("a/link", "x/../../..", true),
        ("a/link", "b//c/./d", false),
    ];
    for (link, target, escapes) in table {
        assert_eq!(symlink_escapes(link, target), escapes, "{link} -> {target}");
    }
}

#[test]
fn every_failure_has_its_own_reason() {
    let failures = [
        Failure::ManifestMissing(String::new()),
        Failure::WrongBackup {
            expected: String::new(),
            found: String::new(),
        },
        Failure::ManifestTampered {
            expected: String::new(),
            found: String::new(),
        },
        Failure::ManifestInvalid(String::new()),
        Failure::IdentityMissing(String::new()),
        Failure::WrongRestore {
            expected: String::new(),
            found: String::new(),
        },
        Failure::IdentityWrongBackup {
            expected: String::new(),
            found: String::new(),
        },
        Failure::ContentMismatch {
            count: 0,
            differences: vec![],
        },
        Failure::VolumeUnreadable(String::new()),
        Failure::Volume(VolumeError::NotAMountPoint {
            path: String::new(),
        }),
    ];
    let mut reasons: Vec<&str> = failures
        .iter()
        .map(|failure| failure.reason().as_str())
        .collect();
    reasons.sort_unstable();
    reasons.dedup();
    assert_eq!(reasons.len(), failures.len());
}
