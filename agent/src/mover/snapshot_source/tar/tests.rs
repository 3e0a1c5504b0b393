use std::collections::BTreeMap;

use custody_proto::manifest::Kind;

use super::{Record, Tracked, canonical, ignored_at_root, inside, volume_path};

/// An expected path in the volume, or a refusal.
type Expected = Result<Option<&'static str>, ()>;

#[test]
fn a_stream_entry_lies_beneath_data_path_and_never_climbs_out() {
    let rows: [(&str, &str, Expected); 12] = [
        ("PG_VERSION", "pgdata", Ok(Some("pgdata/PG_VERSION"))),
        ("./base/1/112", "pgdata", Ok(Some("pgdata/base/1/112"))),
        ("base/", "pgdata/", Ok(Some("pgdata/base"))),
        ("base//1/./x", "", Ok(Some("base/1/x"))),
        ("global", "", Ok(Some("global"))),
        ("./", "pgdata", Ok(None)),
        (".", "", Ok(None)),
        ("", "", Ok(None)),
        ("/etc/passwd", "pgdata", Err(())),
        ("../escape", "pgdata", Err(())),
        ("base/../../escape", "", Err(())),
        ("a/..", "", Err(())),
    ];
    for (name, data_path, expected) in rows {
        let found = volume_path(name, data_path);
        match expected {
            Ok(path) => assert_eq!(found.unwrap().as_deref(), path, "{name:?} in {data_path:?}"),
            Err(()) => assert!(found.is_err(), "{name:?} in {data_path:?}: {found:?}"),
        }
    }
}

fn record(kind: Kind, mode: u32, uid: u32) -> Record {
    Record {
        kind,
        mode,
        uid,
        gid: uid,
        mtime: 1,
        file: None,
    }
}

fn file(size: u64) -> Kind {
    Kind::File {
        size,
        blake3: String::new(),
    }
}

#[test]
fn entries_go_in_canonical_order_with_the_directories_the_stream_skipped_made_0700() {
    let mut records = BTreeMap::new();
    // As pg_basebackup lists them: no root entry, files before some directories.
    records.insert(
        "pgdata/base/1/112".to_string(),
        record(file(8192), 0o600, 999),
    );
    records.insert("pgdata/PG_VERSION".to_string(), record(file(3), 0o600, 999));
    records.insert("pgdata/base-x".to_string(), record(file(1), 0o600, 999));
    records.insert("pgdata/base/1".to_string(), record(Kind::Dir, 0o700, 999));
    records.insert(
        "pgdata/pg_wal/000000010000000000000001".to_string(),
        record(file(16 << 20), 0o600, 999),
    );
    let sorted = canonical(records, "pgdata", None, (999, 999)).unwrap();
    let paths: Vec<&str> = sorted.iter().map(|(path, _)| path.as_str()).collect();
    // Pre-order, children by name bytes: `base` (a directory) before `base-x`, though
    // "base-x" < "base/1/112" as whole strings.
    assert_eq!(
        paths,
        [
            "pgdata",
            "pgdata/PG_VERSION",
            "pgdata/base",
            "pgdata/base/1",
            "pgdata/base/1/112",
            "pgdata/base-x",
            "pgdata/pg_wal",
            "pgdata/pg_wal/000000010000000000000001",
        ]
    );
    let made = |path: &str| {
        sorted
            .iter()
            .find(|(found, _)| found == path)
            .unwrap()
            .1
            .clone()
    };
    for path in ["pgdata", "pgdata/base", "pgdata/pg_wal"] {
        assert_eq!(
            made(path),
            record(Kind::Dir, 0o700, 999).with_mtime(0),
            "{path}"
        );
    }
    // Listed: kept as listed.
    assert_eq!(made("pgdata/base/1"), record(Kind::Dir, 0o700, 999));
}

impl Record {
    fn with_mtime(self, mtime: i64) -> Record {
        Record { mtime, ..self }
    }
}

#[test]
fn the_streams_own_root_stands_for_data_path_and_an_entry_under_a_file_is_refused() {
    let mut records = BTreeMap::new();
    records.insert("pgdata/PG_VERSION".to_string(), record(file(3), 0o600, 999));
    let root = record(Kind::Dir, 0o750, 70);
    let sorted = canonical(records.clone(), "pgdata", Some(root.clone()), (999, 999)).unwrap();
    assert_eq!(sorted[0], ("pgdata".to_string(), root.clone()));
    // Without dataPath the root is the volume's own: not an entry.
    let mut at_root = BTreeMap::new();
    at_root.insert("PG_VERSION".to_string(), record(file(3), 0o600, 999));
    let sorted = canonical(at_root, "", Some(root), (999, 999)).unwrap();
    assert_eq!(sorted.len(), 1);

    records.insert(
        "pgdata/PG_VERSION/inside".to_string(),
        record(file(1), 0o600, 999),
    );
    assert!(canonical(records, "pgdata", None, (999, 999)).is_err());
}

#[test]
fn a_path_is_inside_a_directory_only_beneath_it() {
    let rows = [
        ("a/b", "a", true),
        ("a/b/c", "a", true),
        ("a", "", true),
        ("ab", "a", false),
        ("a", "a", false),
        ("a-b/c", "a", false),
        ("b/a", "a", false),
    ];
    for (path, dir, expected) in rows {
        assert_eq!(inside(path, dir), expected, "{path:?} in {dir:?}");
    }
}

/// A tar archive of one small file, as a tool writes it.
fn archive() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(3);
    header.set_mode(0o600);
    header.set_cksum();
    builder
        .append_data(&mut header, "PG_VERSION", &b"15\n"[..])
        .unwrap();
    builder.into_inner().unwrap()
}

/// Only a stream whose reader stopped at an end-of-archive block right after the last entry
/// ended as an archive: one cut at an entry's end did not, even when that entry's data ends in
/// a block of zeros (a WAL segment's tail), though a tar reader sees no entry missing.
#[test]
fn a_stream_ended_as_an_archive_only_with_its_end_block() {
    let whole = archive();
    assert_eq!(whole.len(), 512 * 4, "header, content, two end blocks");
    // (stream, where its entries end, read size, ended)
    let rows: [(&[u8], u64, usize, bool); 6] = [
        (&whole[..1536], 1024, 64 << 10, true),
        (&whole[..1536], 1024, 100, true),
        // Cut after the file: a tar reader finds its one entry and an end.
        (&whole[..1024], 1024, 512, false),
        // Read past the end block.
        (&whole, 1024, 512, false),
        (&[], 0, 512, false),
        (&[0u8; 512], 0, 512, true),
    ];
    for (stream, entries_end, read_size, ended) in rows {
        let mut inner: &[u8] = stream;
        let mut tracked = Tracked::new(&mut inner);
        let mut buffer = vec![0u8; read_size];
        while std::io::Read::read(&mut tracked, &mut buffer).unwrap() > 0 {}
        assert_eq!(tracked.read, stream.len() as u64);
        assert_eq!(
            tracked.ended_as_an_archive(entries_end),
            ended,
            "{} bytes read {read_size} at a time, entries ending at {entries_end}",
            stream.len()
        );
    }
    // A file whose data ends in a block of zeros, the stream cut right after it.
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(1024);
    header.set_mode(0o600);
    header.set_cksum();
    let mut data = vec![1u8; 512];
    data.extend([0u8; 512]);
    builder
        .append_data(&mut header, "000000010000000000000001", &data[..])
        .unwrap();
    let zero_tail = builder.into_inner().unwrap();
    let cut = &zero_tail[..512 + 1024];
    let mut inner: &[u8] = cut;
    let mut tracked = Tracked::new(&mut inner);
    let mut reader = tar::Archive::new(&mut tracked);
    let mut end = 0;
    for entry in reader.entries().unwrap() {
        let entry = entry.unwrap();
        end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
    }
    assert_eq!(end, 1536);
    assert!(
        !tracked.ended_as_an_archive(end),
        "a cut stream ending in zeros"
    );
    // A tar reader stops at the first end block, and the tracker has seen it.
    let mut inner: &[u8] = &whole;
    let mut tracked = Tracked::new(&mut inner);
    let mut reader = tar::Archive::new(&mut tracked);
    assert_eq!(reader.entries().unwrap().count(), 1);
    assert!(tracked.ended_as_an_archive(1024));
}

/// What a volume's root keeps for itself is never taken from a stream, nor anything beneath.
#[test]
fn a_roots_own_directories_and_what_is_beneath_them_are_ignored() {
    let rows = [
        (".custody", true),
        (".custody/manifest.jsonl", true),
        ("lost+found/#123", true),
        ("pgdata/.custody", false),
        ("custody", false),
        ("base/lost+found", false),
    ];
    for (path, ignored) in rows {
        assert_eq!(ignored_at_root(path), ignored, "{path}");
    }
}
