//! Verification of restored volumes on real ext4 filesystems on loop devices: an exact restore
//! verifies, and each kind of damage fails with its own reason.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use custody_agent::manifest_builder;
use custody_agent::verify::{Difference, Expected, Failure, Options, verify_tree, verify_volume};
use custody_proto::manifest::Header;
use custody_proto::volume::{IDENTITY_PATH, MANIFEST_PATH, RestoreIdentity};
use custody_tests::volumes::{LoopVolume, copy_tree};

const BACKUP_UID: &str = "5e0c1a2b-0000-4000-8000-00000000b001";
const RESTORE_UID: &str = "5e0c1a2b-0000-4000-8000-00000000e001";
const BIG: usize = 24 << 20;

/// A backed-up volume: a tree with nested directories, small and large files, modes and a
/// symlink; and its manifest.
struct Source {
    volume: LoopVolume,
    manifest: Vec<u8>,
    hash: blake3::Hash,
}

fn source(extra: impl Fn(&Path)) -> Source {
    let volume = LoopVolume::new(96);
    let root = volume.path();
    for directory in ["base/1", "base/2", "global", "pg_wal"] {
        fs::create_dir_all(root.join(directory)).unwrap();
    }
    for index in 0..300 {
        let content = format!("row {index} {}", "x".repeat(index % 97));
        fs::write(
            root.join(format!("base/{}/{index:05}", index % 2 + 1)),
            content,
        )
        .unwrap();
    }
    let big: Vec<u8> = (0..BIG).map(|index| (index * 31 % 251) as u8).collect();
    fs::write(root.join("pg_wal/000000010000000000000001"), &big).unwrap();
    fs::write(root.join("global/pg_control"), b"control").unwrap();
    fs::set_permissions(
        root.join("global/pg_control"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fs::write(root.join("PG_VERSION"), b"17\n").unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    symlink("base/1", root.join("current")).unwrap();
    extra(root);
    let header = Header::new(BACKUP_UID, "cluster-uid", "2026-11-30T06:00:00Z");
    let (manifest, summary) = manifest_builder::build(root, &header, Vec::new()).expect("manifest");
    Source {
        volume,
        manifest,
        hash: summary.hash,
    }
}

fn expected(source: &Source) -> Expected {
    Expected {
        manifest_hash: source.hash,
        backup_uid: BACKUP_UID.into(),
        restore_uid: RESTORE_UID.into(),
    }
}

/// What a restore leaves: the tree, the manifest and the identity, on a fresh volume.
fn restore(source: &Source) -> LoopVolume {
    let target = LoopVolume::new(96);
    copy_tree(source.volume.path(), target.path());
    fs::remove_dir_all(target.path().join("lost+found")).ok();
    fs::create_dir(target.path().join(".custody")).unwrap();
    fs::write(target.path().join(MANIFEST_PATH), &source.manifest).unwrap();
    let identity = RestoreIdentity {
        restore_uid: RESTORE_UID.into(),
        backup_uid: BACKUP_UID.into(),
    };
    fs::write(
        target.path().join(IDENTITY_PATH),
        serde_json::to_vec(&identity).unwrap(),
    )
    .unwrap();
    target
}

fn differences(result: Result<custody_agent::verify::Verified, Failure>) -> Vec<Difference> {
    match result {
        Err(Failure::ContentMismatch { differences, count }) => {
            assert_eq!(count as usize, differences.len());
            differences
        }
        other => panic!("expected a content mismatch, got {other:?}"),
    }
}

#[test]
fn an_exact_restore_verifies() {
    let source = source(|_| {});
    let target = restore(&source);
    let verified =
        verify_volume(target.path(), &expected(&source), Options::default()).expect("verified");
    assert_eq!(verified.files, 304);
    assert_eq!(verified.entries, 304 + 5 + 1);
    assert!(verified.bytes > BIG as u64);
}

#[test]
fn each_kind_of_damage_fails_with_its_own_reason() {
    let source = source(|_| {});
    let big = "pg_wal/000000010000000000000001";

    // One flipped byte in the large file.
    let target = restore(&source);
    let mut content = fs::read(target.path().join(big)).unwrap();
    content[BIG / 2] ^= 1;
    fs::write(target.path().join(big), &content).unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    assert!(
        matches!(&found[..], [Difference::ContentChanged { path, .. }] if path == big),
        "{found:?}"
    );

    // A truncated file.
    let target = restore(&source);
    fs::OpenOptions::new()
        .write(true)
        .open(target.path().join(big))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    assert!(
        matches!(&found[..], [Difference::SizeChanged { path, expected, found: 4096 }] if path == big && *expected == BIG as u64),
        "{found:?}"
    );

    // A missing file, and an extra one.
    let target = restore(&source);
    fs::remove_file(target.path().join("global/pg_control")).unwrap();
    fs::write(target.path().join("base/2/stray"), b"?").unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    assert_eq!(
        found,
        [
            Difference::Extra {
                path: "base/2/stray".into(),
                found: "file"
            },
            Difference::Missing {
                path: "global/pg_control".into(),
                expected: "file"
            },
        ]
    );

    // Two files of the same size swapped.
    let target = restore(&source);
    let (a, b) = (
        target.path().join("base/1/00100"),
        target.path().join("base/1/00294"),
    );
    assert_eq!(
        fs::metadata(&a).unwrap().len(),
        fs::metadata(&b).unwrap().len()
    );
    let (content_a, content_b) = (fs::read(&a).unwrap(), fs::read(&b).unwrap());
    assert_ne!(content_a, content_b);
    fs::write(&a, &content_b).unwrap();
    fs::write(&b, &content_a).unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    let paths: Vec<&str> = found.iter().map(Difference::path).collect();
    assert_eq!(paths, ["base/1/00100", "base/1/00294"]);
    assert!(
        found
            .iter()
            .all(|difference| matches!(difference, Difference::ContentChanged { .. }))
    );

    // A file replaced by a symlink out of the volume, whose target has the expected content:
    // the link must not be followed.
    let target = restore(&source);
    let outside = target.outside().join("PG_VERSION");
    fs::write(&outside, b"17\n").unwrap();
    fs::remove_file(target.path().join("PG_VERSION")).unwrap();
    symlink(&outside, target.path().join("PG_VERSION")).unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    assert_eq!(
        found,
        [Difference::TypeChanged {
            path: "PG_VERSION".into(),
            expected: "file",
            found: "symlink"
        }]
    );

    // A directory replaced by a symlink to a copy of it outside the volume: nothing beneath
    // it is reached through the link.
    let target = restore(&source);
    let outside = target.outside().join("global");
    copy_tree(&target.path().join("global"), &{
        fs::create_dir_all(&outside).unwrap();
        outside.clone()
    });
    fs::remove_dir_all(target.path().join("global")).unwrap();
    symlink(&outside, target.path().join("global")).unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    assert_eq!(
        found,
        [
            Difference::TypeChanged {
                path: "global".into(),
                expected: "dir",
                found: "symlink"
            },
            Difference::Missing {
                path: "global/pg_control".into(),
                expected: "file"
            },
        ]
    );

    // Changed permissions and owner.
    let target = restore(&source);
    fs::set_permissions(
        target.path().join("global/pg_control"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::os::unix::fs::chown(target.path().join("PG_VERSION"), Some(4242), Some(4242)).unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    assert!(
        matches!(&found[0], Difference::OwnerChanged { path, found: (4242, 4242), .. } if path == "PG_VERSION"),
        "{found:?}"
    );
    assert!(
        matches!(&found[1], Difference::ModeChanged { path, expected: 0o600, found: 0o644 } if path == "global/pg_control"),
        "{found:?}"
    );
}

#[test]
fn identity_and_anchor_failures_have_their_own_reasons() {
    let source = source(|_| {});

    // The manifest of another Backup.
    let target = restore(&source);
    let other = String::from_utf8(source.manifest.clone())
        .unwrap()
        .replacen(BACKUP_UID, "another-backup", 1);
    fs::write(target.path().join(MANIFEST_PATH), other).unwrap();
    let error = verify_volume(target.path(), &expected(&source), Options::default()).unwrap_err();
    assert_eq!(
        error.reason().as_str(),
        "ManifestOfAnotherBackup",
        "{error}"
    );

    // Written by another Restore.
    let target = restore(&source);
    let identity = RestoreIdentity {
        restore_uid: "another-restore".into(),
        backup_uid: BACKUP_UID.into(),
    };
    fs::write(
        target.path().join(IDENTITY_PATH),
        serde_json::to_vec(&identity).unwrap(),
    )
    .unwrap();
    let error = verify_volume(target.path(), &expected(&source), Options::default()).unwrap_err();
    assert_eq!(
        error.reason().as_str(),
        "WrittenByAnotherRestore",
        "{error}"
    );

    // A manifest rewritten to vouch for tampered content: the anchor does not match.
    let target = restore(&source);
    fs::write(target.path().join("PG_VERSION"), b"99\n").unwrap();
    let text = String::from_utf8(source.manifest.clone()).unwrap();
    let forged_hash = blake3::hash(b"99\n").to_hex().to_string();
    let original_hash = blake3::hash(b"17\n").to_hex().to_string();
    fs::write(
        target.path().join(MANIFEST_PATH),
        text.replace(&original_hash, &forged_hash),
    )
    .unwrap();
    let error = verify_volume(target.path(), &expected(&source), Options::default()).unwrap_err();
    assert_eq!(error.reason().as_str(), "ManifestTampered", "{error}");

    // No manifest, no identity.
    let target = restore(&source);
    fs::remove_file(target.path().join(IDENTITY_PATH)).unwrap();
    let error = verify_volume(target.path(), &expected(&source), Options::default()).unwrap_err();
    assert_eq!(error.reason().as_str(), "RestoreIdentityMissing", "{error}");
    fs::remove_file(target.path().join(MANIFEST_PATH)).unwrap();
    let error = verify_volume(target.path(), &expected(&source), Options::default()).unwrap_err();
    assert_eq!(error.reason().as_str(), "ManifestMissing", "{error}");

    // An empty volume: the database must not start on it.
    let empty = LoopVolume::new(16);
    let error = verify_volume(empty.path(), &expected(&source), Options::default()).unwrap_err();
    assert_eq!(error.reason().as_str(), "ManifestMissing", "{error}");

    // A directory that is not a mount point, even with perfect content.
    let target = restore(&source);
    let plain = tempfile::tempdir().unwrap();
    copy_tree(target.path(), plain.path());
    let error = verify_volume(plain.path(), &expected(&source), Options::default()).unwrap_err();
    assert_eq!(error.reason().as_str(), "NotAMountPoint", "{error}");
    verify_tree(plain.path(), &expected(&source), Options::default())
        .expect("same content verifies as a tree");
}

#[test]
fn a_symlink_pointing_out_of_the_volume_fails() {
    // A backup refuses such a link (SymlinkLeavesVolume); a manifest that names one anyway
    // (written before that check, or by hand) still never verifies.
    let (benign, escaping) = ("../1/00000_abcde", "../../etc/passwd");
    let mut source = source(|root| symlink(benign, root.join("base/escape")).unwrap());
    source.manifest = String::from_utf8(source.manifest.clone())
        .unwrap()
        .replace(&format!("\"{benign}\""), &format!("\"{escaping}\""))
        .into_bytes();
    source.hash = custody_proto::manifest::hash_reader(&source.manifest[..]).unwrap();
    let target = restore(&source);
    fs::remove_file(target.path().join("base/escape")).unwrap();
    symlink(escaping, target.path().join("base/escape")).unwrap();
    let found = differences(verify_volume(
        target.path(),
        &expected(&source),
        Options::default(),
    ));
    assert_eq!(
        found,
        [Difference::SymlinkEscapes {
            path: "base/escape".into(),
            target: "../../etc/passwd".into()
        }]
    );
}

#[test]
fn hostile_manifests_are_refused_even_when_anchored() {
    let source = source(|_| {});
    let header = format!(
        r#"{{"custodyManifest":1,"backupUid":"{BACKUP_UID}","clusterUid":"c","createdAt":"2026-11-30T06:00:00Z"}}"#
    );
    let hash = blake3::hash(b"secret").to_hex().to_string();
    let cases = [
        (
            "traversal",
            format!(
                r#"{{"path":"../outside/secret","type":"file","size":6,"blake3":"{hash}","mode":420,"uid":0,"gid":0}}"#
            ),
        ),
        (
            "absolute",
            format!(
                r#"{{"path":"/etc/passwd","type":"file","size":6,"blake3":"{hash}","mode":420,"uid":0,"gid":0}}"#
            ),
        ),
        (
            "NUL",
            format!(
                r#"{{"path":"PG_VERSION\u0000x","type":"file","size":6,"blake3":"{hash}","mode":420,"uid":0,"gid":0}}"#
            ),
        ),
        (
            "absurd size",
            format!(
                r#"{{"path":"PG_VERSION","type":"file","size":9007199254740993,"blake3":"{hash}","mode":420,"uid":0,"gid":0}}"#
            ),
        ),
    ];
    for (name, line) in cases {
        let target = restore(&source);
        let manifest = format!(
            "{header}\n{line}\n{{\"end\":{{\"entries\":1,\"files\":1,\"totalBytes\":6}}}}\n"
        );
        fs::write(target.path().join(MANIFEST_PATH), &manifest).unwrap();
        // Even a manifest that matches its anchor cannot point the verifier outside the volume.
        let anchored = Expected {
            manifest_hash: blake3::hash(manifest.as_bytes()),
            ..expected(&source)
        };
        let error = verify_volume(target.path(), &anchored, Options::default()).unwrap_err();
        assert_eq!(
            error.reason().as_str(),
            "ManifestInvalid",
            "{name}: {error}"
        );
    }

    // Duplicate paths.
    let target = restore(&source);
    let line = format!(
        r#"{{"path":"PG_VERSION","type":"file","size":3,"blake3":"{}","mode":420,"uid":0,"gid":0}}"#,
        blake3::hash(b"17\n").to_hex()
    );
    let manifest = format!(
        "{header}\n{line}\n{line}\n{{\"end\":{{\"entries\":2,\"files\":2,\"totalBytes\":6}}}}\n"
    );
    fs::write(target.path().join(MANIFEST_PATH), &manifest).unwrap();
    let anchored = Expected {
        manifest_hash: blake3::hash(manifest.as_bytes()),
        ..expected(&source)
    };
    let error = verify_volume(target.path(), &anchored, Options::default()).unwrap_err();
    assert_eq!(
        error.reason().as_str(),
        "ManifestInvalid",
        "duplicate: {error}"
    );
    assert!(
        error.to_string().contains("duplicate or out of order"),
        "{error}"
    );
}
