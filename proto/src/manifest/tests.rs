use super::*;

const HASH: &str = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262";

fn header() -> Header {
    Header::new("backup-uid", "cluster-uid", "2026-11-30T05:00:00Z")
}

fn dir(path: &str) -> Entry {
    Entry {
        path: path.into(),
        kind: Kind::Dir,
        mode: 0o755,
        uid: 0,
        gid: 0,
    }
}

fn file(path: &str, size: u64) -> Entry {
    Entry {
        path: path.into(),
        kind: Kind::File {
            size,
            blake3: HASH.into(),
        },
        mode: 0o644,
        uid: 999,
        gid: 999,
    }
}

fn write(entries: &[Entry]) -> (Vec<u8>, ManifestSummary) {
    let mut writer = ManifestWriter::new(Vec::new(), &header()).unwrap();
    for entry in entries {
        writer.push(entry).unwrap();
    }
    writer.finish().unwrap()
}

fn read_all(bytes: &[u8]) -> Result<(Header, Vec<Entry>), ManifestError> {
    let (reader, header) = ManifestReader::new(bytes)?;
    let entries = reader.collect::<Result<Vec<_>, _>>()?;
    Ok((header, entries))
}

/// One verbatim file entry line with the test hash.
fn file_line(path: &str, size: i128) -> String {
    format!(
        r#"{{"path":"{path}","type":"file","size":{size},"blake3":"{HASH}","mode":420,"uid":0,"gid":0}}"#
    )
}

/// A manifest whose entry lines are given verbatim (for hostile input), with a matching trailer.
fn raw(lines: &[&str], totals: Totals) -> Vec<u8> {
    let mut text = serde_json::to_string(&header()).unwrap();
    text.push('\n');
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(&serde_json::to_string(&Trailer { end: totals }).unwrap());
    text.push('\n');
    text.into_bytes()
}

#[test]
fn round_trip_keeps_every_field_and_hashes_the_bytes() {
    let entries = vec![
        dir("a"),
        file("a/b", 10),
        dir("a/c"),
        file("a/c/d", 0),
        file("a.txt", 5),
        Entry {
            path: "link".into(),
            kind: Kind::Symlink {
                target: "a/b".into(),
            },
            mode: 0o777,
            uid: 1,
            gid: 2,
        },
    ];
    let (bytes, summary) = write(&entries);
    assert_eq!(summary.hash, blake3::hash(&bytes));
    assert_eq!(
        summary.totals,
        Totals {
            entries: 6,
            files: 3,
            total_bytes: 15
        }
    );
    let (header_read, entries_read) = read_all(&bytes).unwrap();
    assert_eq!(header_read, header());
    assert_eq!(entries_read, entries);
    assert_eq!(hash_reader(&bytes[..]).unwrap(), summary.hash);
}

#[test]
fn canonical_order_is_by_components() {
    let table = [
        ("a", "a/b", Ordering::Less),
        ("a/b", "a.txt", Ordering::Less), // bytewise '/' > '.', by components "a" < "a.txt"
        ("a/z", "b", Ordering::Less),
        ("b", "a/z", Ordering::Greater),
        ("a/b", "a/b", Ordering::Equal),
        ("A", "a", Ordering::Less),
    ];
    for (a, b, expected) in table {
        assert_eq!(compare_paths(a, b), expected, "{a} vs {b}");
    }
}

#[test]
fn unsafe_paths_are_refused() {
    let long_name = "x".repeat(MAX_NAME_BYTES + 1);
    let long_path = vec!["x"; MAX_PATH_BYTES / 2 + 1].join("/");
    let table: [(&str, PathError); 11] = [
        ("", PathError::Empty),
        ("/etc/passwd", PathError::Absolute),
        ("..", PathError::DotComponent),
        ("../escape", PathError::DotComponent),
        ("a/../../escape", PathError::DotComponent),
        ("a/./b", PathError::DotComponent),
        ("a//b", PathError::EmptyComponent),
        ("a/", PathError::EmptyComponent),
        ("a\0b", PathError::Nul),
        (&long_name, PathError::NameTooLong),
        (&long_path, PathError::TooLong),
    ];
    for (path, expected) in table {
        assert_eq!(validate_path(path), Err(expected), "{path:?}");
    }
    for path in ["a", "a/b", ".hidden", "..dots", "a b/ c", "ünïcode/名前"] {
        assert_eq!(validate_path(path), Ok(()), "{path:?}");
    }
}

#[test]
fn hostile_manifests_are_refused() {
    let one_file = Totals {
        entries: 1,
        files: 1,
        total_bytes: 1,
    };
    type Case = (&'static str, Vec<u8>, fn(&ManifestError) -> bool);
    let cases: Vec<Case> = vec![
        (
            "traversal",
            raw(&[&file_line("../etc/shadow", 1)], one_file),
            |error| {
                matches!(
                    error,
                    ManifestError::UnsafePath {
                        reason: PathError::DotComponent,
                        ..
                    }
                )
            },
        ),
        (
            "absolute",
            raw(&[&file_line("/etc/shadow", 1)], one_file),
            |error| {
                matches!(
                    error,
                    ManifestError::UnsafePath {
                        reason: PathError::Absolute,
                        ..
                    }
                )
            },
        ),
        (
            "NUL",
            raw(&[&file_line(r"a\u0000b", 1)], one_file),
            |error| {
                matches!(
                    error,
                    ManifestError::UnsafePath {
                        reason: PathError::Nul,
                        ..
                    }
                )
            },
        ),
        (
            "duplicate",
            raw(
                &[&file_line("a", 1), &file_line("a", 1)],
                Totals {
                    entries: 2,
                    files: 2,
                    total_bytes: 2,
                },
            ),
            |error| matches!(error, ManifestError::OutOfOrder { .. }),
        ),
        (
            "out of order",
            raw(
                &[&file_line("b", 1), &file_line("a", 1)],
                Totals {
                    entries: 2,
                    files: 2,
                    total_bytes: 2,
                },
            ),
            |error| matches!(error, ManifestError::OutOfOrder { .. }),
        ),
        (
            "absurd size",
            raw(
                &[&file_line("big", 18446744073709551615)],
                Totals {
                    entries: 1,
                    files: 1,
                    total_bytes: u64::MAX,
                },
            ),
            |error| matches!(error, ManifestError::AbsurdSize { .. }),
        ),
        (
            "negative size",
            raw(&[&file_line("a", -1)], one_file),
            |error| matches!(error, ManifestError::Malformed { .. }),
        ),
        (
            "entry under a file",
            raw(
                &[&file_line("a", 1), &file_line("a/b", 1)],
                Totals {
                    entries: 2,
                    files: 2,
                    total_bytes: 2,
                },
            ),
            |error| matches!(error, ManifestError::Orphan { .. }),
        ),
        (
            "entry without its directory",
            raw(&[&file_line("x/y", 1)], one_file),
            |error| matches!(error, ManifestError::Orphan { .. }),
        ),
        (
            "bad hash",
            raw(
                &[
                    r#"{"path":"a","type":"file","size":1,"blake3":"zz","mode":420,"uid":0,"gid":0}"#,
                ],
                one_file,
            ),
            |error| matches!(error, ManifestError::InvalidEntry { .. }),
        ),
        (
            "unknown type",
            raw(
                &[r#"{"path":"a","type":"device","mode":420,"uid":0,"gid":0}"#],
                one_file,
            ),
            |error| matches!(error, ManifestError::Malformed { .. }),
        ),
        (
            "symlink target with NUL",
            raw(
                &[r#"{"path":"a","type":"symlink","target":"x\u0000","mode":511,"uid":0,"gid":0}"#],
                Totals {
                    entries: 1,
                    files: 0,
                    total_bytes: 0,
                },
            ),
            |error| matches!(error, ManifestError::InvalidEntry { .. }),
        ),
        (
            "totals that do not add up",
            raw(
                &[&file_line("a", 1)],
                Totals {
                    entries: 2,
                    files: 2,
                    total_bytes: 2,
                },
            ),
            |error| matches!(error, ManifestError::TotalsMismatch { .. }),
        ),
    ];
    for (name, bytes, expected) in cases {
        match read_all(&bytes) {
            Ok(read) => panic!("{name}: accepted {read:?}"),
            Err(error) => assert!(expected(&error), "{name}: wrong error {error:?}"),
        }
    }
}

#[test]
fn truncation_padding_and_versions_are_refused() {
    let (bytes, _) = write(&[dir("a"), file("a/b", 3)]);
    let text = String::from_utf8(bytes.clone()).unwrap();
    let without_trailer: String = text
        .lines()
        .take(3)
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(matches!(
        read_all(without_trailer.as_bytes()),
        Err(ManifestError::Truncated)
    ));
    let cut_mid_line = &bytes[..bytes.len() - 5];
    assert!(matches!(
        read_all(cut_mid_line),
        Err(ManifestError::Malformed { .. })
    ));
    let mut padded = bytes.clone();
    padded.extend_from_slice(b"{\"path\":\"extra\"}\n");
    assert!(matches!(
        read_all(&padded),
        Err(ManifestError::TrailingData)
    ));
    let future = text.replacen("\"custodyManifest\":1", "\"custodyManifest\":2", 1);
    assert!(matches!(
        read_all(future.as_bytes()),
        Err(ManifestError::UnsupportedVersion(2))
    ));
    assert!(matches!(read_all(b""), Err(ManifestError::Truncated)));
    let mut endless = serde_json::to_vec(&header()).unwrap();
    endless.push(b'\n');
    endless.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
    assert!(matches!(
        read_all(&endless),
        Err(ManifestError::Malformed { .. })
    ));
}

#[test]
fn the_writer_refuses_what_the_reader_would() {
    let mut writer = ManifestWriter::new(Vec::new(), &header()).unwrap();
    writer.push(&file("b", 1)).unwrap();
    assert!(writer.push(&file("a", 1)).is_err(), "out of order");
    assert!(writer.push(&file("b", 1)).is_err(), "duplicate");
    assert!(writer.push(&file("../x", 1)).is_err(), "traversal");
}

#[test]
fn a_symlink_may_lead_only_into_its_volume_or_another_volume_of_the_same_backup() {
    let alone = Header::new("b", "c", "t");
    let with_wal = Header {
        mount_path: Some("/var/lib/postgresql/data".into()),
        sibling_mounts: vec!["/var/lib/postgresql/wal".into(), "/".into()],
        ..Header::new("b", "c", "t")
    };
    let unknown_mount = Header {
        mount_path: None,
        ..with_wal.clone()
    };
    // (link, target, header, allowed)
    let rows: &[(&str, &str, &Header, bool)] = &[
        ("current", "base/1", &alone, true),
        ("a/b", "../c", &alone, true),
        ("a/b", "../../c", &alone, false),
        ("pg_wal", "/var/lib/postgresql/wal/pg_wal", &alone, false),
        ("pg_wal", "/var/lib/postgresql/wal/pg_wal", &with_wal, true),
        ("pg_wal", "/var/lib/postgresql/wal", &with_wal, true),
        ("pg_wal", "../wal/pg_wal", &with_wal, true),
        ("deep/pg_wal", "../../wal/x", &with_wal, true),
        ("deep/pg_wal", "../wal/x", &with_wal, true),
        ("deep/pg_wal", "../../../wal/x", &with_wal, false),
        ("pg_wal", "/var/lib/postgresql/walx", &with_wal, false),
        (
            "pg_wal",
            "/var/lib/postgresql/wal/../data2",
            &with_wal,
            false,
        ),
        ("pg_wal", "/etc/passwd", &with_wal, false),
        // Through a link of the other volume (`back -> /var/lib/postgresql/data` there), the
        // kernel would step out of both volumes: a `..` after a name is refused.
        (
            "esc",
            "/var/lib/postgresql/wal/back/../../etc/shadow",
            &with_wal,
            false,
        ),
        (
            "esc",
            "/var/lib/postgresql/wal/back/../pg_wal",
            &with_wal,
            false,
        ),
        ("pg_wal", "../wal/x/../pg_wal", &with_wal, false),
        ("pg_wal", "./../wal/pg_wal", &with_wal, true),
        // Within one volume, lexically.
        ("a/b", "./../../c", &alone, false),
        ("a", "b/../c", &alone, true),
        ("a/b", ".//./c", &alone, true),
        // A sibling mounted at the root would admit every path: it is not one.
        ("pg_wal", "/anything", &with_wal, false),
        (
            "pg_wal",
            "/var/lib/postgresql/wal/pg_wal",
            &unknown_mount,
            false,
        ),
        ("pg_wal", "../wal/pg_wal", &unknown_mount, false),
    ];
    for (link, target, header, allowed) in rows {
        assert_eq!(
            symlink_allowed(link, target, header),
            *allowed,
            "{link} -> {target} with {header:?}"
        );
    }
}

#[test]
fn a_header_of_one_volume_serialises_as_before() {
    let text = serde_json::to_string(&Header::new("b", "c", "t")).unwrap();
    assert_eq!(
        text,
        r#"{"custodyManifest":1,"backupUid":"b","clusterUid":"c","createdAt":"t"}"#
    );
}

/// `Entry` as `#[derive(Serialize, Deserialize)]` writes and reads it, `kind` flattened: the
/// one-pass reader must read every line alike, and lines must be written byte for byte alike.
#[derive(Serialize, Deserialize)]
struct DerivedEntry {
    path: String,
    #[serde(flatten)]
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
}

#[test]
fn entries_read_in_one_pass_as_the_derived_form_reads_them() {
    let lines = [
        r#"{"path":"a","type":"file","size":1,"blake3":"ab","mode":420,"uid":1,"gid":2}"#,
        r#"{"mode":420,"uid":1,"gid":2,"blake3":"ab","size":0,"type":"file","path":"z"}"#,
        r#"{"path":"d","type":"dir","mode":493,"uid":0,"gid":0}"#,
        r#"{"path":"l","type":"symlink","target":"../x","mode":511,"uid":0,"gid":0}"#,
        r#"{"path":"a","type":"file","size":1,"blake3":"ab","mode":420,"uid":1,"gid":2,"more":[1]}"#,
        r#"{"path":"d","type":"dir","target":"t","mode":493,"uid":0,"gid":0}"#,
        r#"{"path":"a\tb\"c\u00e9","type":"dir","mode":493,"uid":0,"gid":0}"#,
        // Refused by both.
        r#"{"path":"a","type":"file","blake3":"ab","mode":420,"uid":1,"gid":2}"#,
        r#"{"path":"a","type":"file","size":1,"mode":420,"uid":1,"gid":2}"#,
        r#"{"path":"l","type":"symlink","mode":511,"uid":0,"gid":0}"#,
        r#"{"path":"a","type":"device","mode":420,"uid":0,"gid":0}"#,
        r#"{"path":"a","mode":420,"uid":0,"gid":0}"#,
        r#"{"path":"a","type":"dir","uid":0,"gid":0}"#,
        r#"{"path":"a","type":"file","size":-1,"blake3":"ab","mode":420,"uid":1,"gid":2}"#,
        r#"{"path":"a","type":"file","size":1,"blake3":null,"mode":420,"uid":1,"gid":2}"#,
        r#"{"path":"a","type":"dir","mode":420,"uid":0,"gid":0"#,
    ];
    let mut refused = 0;
    for line in lines {
        let one_pass = serde_json::from_str::<Entry>(line).ok();
        let derived = serde_json::from_str::<DerivedEntry>(line)
            .ok()
            .map(|entry| Entry {
                path: entry.path,
                kind: entry.kind,
                mode: entry.mode,
                uid: entry.uid,
                gid: entry.gid,
            });
        assert_eq!(one_pass, derived, "{line}");
        refused += usize::from(one_pass.is_none());
    }
    assert_eq!(refused, 9);
}

#[test]
fn entries_are_written_as_the_derived_form_writes_them() {
    let entries = [
        Entry {
            path: "a/b \"c\"\té".into(),
            kind: Kind::File {
                size: u64::MAX,
                blake3: "ab".repeat(32),
            },
            mode: 0o644,
            uid: 0,
            gid: u32::MAX,
        },
        Entry {
            path: "d".into(),
            kind: Kind::Dir,
            mode: 0o755,
            uid: 1,
            gid: 2,
        },
        Entry {
            path: "l".into(),
            kind: Kind::Symlink {
                target: "../x\\y".into(),
            },
            mode: 0o777,
            uid: 3,
            gid: 4,
        },
    ];
    for entry in entries {
        let derived = DerivedEntry {
            path: entry.path.clone(),
            kind: entry.kind.clone(),
            mode: entry.mode,
            uid: entry.uid,
            gid: entry.gid,
        };
        assert_eq!(
            serde_json::to_string(&entry).unwrap(),
            serde_json::to_string(&derived).unwrap()
        );
    }
}
