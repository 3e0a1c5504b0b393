//! Extraction against real directories: an honest archive reproduces its tree; hostile ones
//! stop before anything lands outside the target.

use std::io::{BufReader, Cursor};
use std::os::unix::fs::symlink;
use std::path::Path;

use custody_proto::manifest::Header;

use super::*;
use crate::manifest_builder;
use crate::mover::archive::TarArchive;

fn header() -> Header {
    Header::new("backup-uid", "cluster-uid", "2026-11-30T00:00:00Z")
}

/// A small tree, its manifest and its honest archive.
fn source() -> (tempfile::TempDir, Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("s/deep")).unwrap();
    std::fs::write(root.join("a"), b"alpha").unwrap();
    std::fs::write(root.join("s/x"), b"x content").unwrap();
    std::fs::write(root.join("s/deep/big"), vec![7u8; 300_000]).unwrap();
    symlink("s/x", root.join("link")).unwrap();
    let mut archive = TarArchive::new(Vec::new());
    let (manifest, _) =
        manifest_builder::build_into(root, &header(), Vec::new(), Some(&mut archive)).unwrap();
    let tar = archive.finish().unwrap();
    (dir, manifest, tar)
}

fn reader(manifest: &[u8]) -> ManifestReader<BufReader<Cursor<Vec<u8>>>> {
    ManifestReader::new(BufReader::new(Cursor::new(manifest.to_vec())))
        .unwrap()
        .0
}

/// A target directory with a sibling that must stay empty.
struct Target {
    dir: tempfile::TempDir,
}

impl Target {
    fn new() -> Target {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("volume")).unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        Target { dir }
    }
    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("volume")
    }
    fn outside(&self) -> std::path::PathBuf {
        self.dir.path().join("outside")
    }
    fn outside_untouched(&self) {
        let left: Vec<_> = std::fs::read_dir(self.outside()).unwrap().collect();
        assert!(left.is_empty(), "written outside the volume: {left:?}");
        assert!(
            !self.dir.path().join("evil").exists(),
            "written next to the volume"
        );
    }
}

fn extract_into(target: &Target, tar: &[u8], manifest: &[u8]) -> Result<Totals, ExtractError> {
    let totals = manifest_totals(reader(manifest)).unwrap();
    extract(
        &target.root(),
        Cursor::new(tar.to_vec()),
        reader(manifest),
        size_limit(totals),
    )
}

#[test]
fn an_honest_archive_reproduces_the_tree() {
    let (source, manifest, tar) = source();
    let target = Target::new();
    let totals = extract_into(&target, &tar, &manifest).expect("extracted");
    assert_eq!(totals.files, 3);
    // The extracted tree has the same manifest as the source.
    let (again, _) = manifest_builder::build(&target.root(), &header(), Vec::new()).unwrap();
    assert_eq!(again, manifest);
    assert_eq!(
        std::fs::read_link(target.root().join("link")).unwrap(),
        Path::new("s/x")
    );
    drop(source);
}

/// Raw tar entry with any name, type, size and link name, bypassing the tar crate's checks.
fn raw_entry(
    out: &mut Vec<u8>,
    name: &[u8],
    kind: tar::EntryType,
    data: &[u8],
    link: Option<&[u8]>,
) {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    if let Some(link) = link {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    }
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn end(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0u8; 1024]);
}

#[test]
fn hostile_archives_stop_before_anything_lands_outside() {
    let (_source, manifest, honest) = source();
    // The honest archive's first entry is "a" (5 bytes of "alpha").
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "parent traversal",
            {
                let mut tar = Vec::new();
                raw_entry(
                    &mut tar,
                    b"../evil",
                    tar::EntryType::Regular,
                    b"pwned",
                    None,
                );
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "absolute path",
            {
                let mut tar = Vec::new();
                let absolute = Target::new().outside().join("evil");
                raw_entry(
                    &mut tar,
                    absolute.to_str().unwrap().as_bytes(),
                    tar::EntryType::Regular,
                    b"pwned",
                    None,
                );
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "a device node where a file belongs",
            {
                let mut tar = Vec::new();
                raw_entry(&mut tar, b"a", tar::EntryType::Char, b"", None);
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "a hard link where a file belongs",
            {
                let mut tar = Vec::new();
                raw_entry(
                    &mut tar,
                    b"a",
                    tar::EntryType::Link,
                    b"",
                    Some(b"/etc/passwd"),
                );
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "a file larger than the manifest says",
            {
                let mut tar = Vec::new();
                raw_entry(
                    &mut tar,
                    b"a",
                    tar::EntryType::Regular,
                    b"alpha and more",
                    None,
                );
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "same size, other content",
            {
                let mut tar = Vec::new();
                raw_entry(&mut tar, b"a", tar::EntryType::Regular, b"ALPHA", None);
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "the archive stops early",
            {
                let mut tar = Vec::new();
                raw_entry(&mut tar, b"a", tar::EntryType::Regular, b"alpha", None);
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "an entry beyond the manifest",
            {
                let mut tar = honest[..honest.len() - 1024].to_vec();
                raw_entry(&mut tar, b"zzz", tar::EntryType::Regular, b"extra", None);
                end(&mut tar);
                tar
            },
            "ArchiveDoesNotMatchManifest",
        ),
        (
            "a decompression bomb: gigabytes of padding after the end",
            {
                // Exercised through the limit; the zeros are produced lazily below.
                Vec::new()
            },
            "ArchiveTooLarge",
        ),
        (
            "data after the end of the archive",
            {
                let mut tar = honest.clone();
                tar.extend_from_slice(b"trailing garbage");
                tar
            },
            "ArchiveUnreadable",
        ),
    ];
    for (name, tar, reason) in cases {
        let target = Target::new();
        let result = if name.starts_with("a decompression bomb") {
            let totals = manifest_totals(reader(&manifest)).unwrap();
            let endless = Cursor::new(honest.clone()).chain(std::io::repeat(0).take(4 << 30));
            extract(
                &target.root(),
                endless,
                reader(&manifest),
                size_limit(totals),
            )
        } else {
            extract_into(&target, &tar, &manifest)
        };
        let error = result.expect_err(name);
        assert_eq!(error.reason().as_str(), reason, "{name}: {error}");
        target.outside_untouched();
    }
}

#[test]
fn a_symlink_planted_in_the_target_is_never_followed() {
    // Manifest: directory s with file s/x. The target already holds s -> ../outside (as if
    // written by something else); extraction must not write through it.
    let (_source, manifest, tar) = source();
    let target = Target::new();
    symlink(target.outside(), target.root().join("s")).unwrap();
    let error = extract_into(&target, &tar, &manifest).expect_err("refused");
    assert_eq!(error.reason().as_str(), "WriteFailed", "{error}");
    target.outside_untouched();
}

#[test]
fn a_symlink_entry_then_a_write_through_it_is_refused() {
    // The archive turns directory s into a symlink pointing outside, then writes s/x.
    let (_source, manifest, _) = source();
    let target = Target::new();
    let mut tar = Vec::new();
    raw_entry(&mut tar, b"a", tar::EntryType::Regular, b"alpha", None);
    let outside = target.outside();
    raw_entry(
        &mut tar,
        b"link",
        tar::EntryType::Symlink,
        b"",
        Some(b"s/x"),
    );
    raw_entry(
        &mut tar,
        b"s",
        tar::EntryType::Symlink,
        b"",
        Some(outside.to_str().unwrap().as_bytes()),
    );
    raw_entry(
        &mut tar,
        b"s/x",
        tar::EntryType::Regular,
        b"x content",
        None,
    );
    end(&mut tar);
    let error = extract_into(&target, &tar, &manifest).expect_err("refused");
    assert_eq!(
        error.reason().as_str(),
        "ArchiveDoesNotMatchManifest",
        "{error}"
    );
    target.outside_untouched();
}

/// A file's content in given pieces, as the snapshot reader hands over blocks.
struct Given(std::collections::VecDeque<Bytes>);

impl Pieces for Given {
    fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        Ok(self.0.pop_front())
    }
}

#[test]
fn a_files_pieces_are_written_as_given_and_one_past_its_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"alpha beta").unwrap();
    let (manifest, _) = manifest_builder::build(dir.path(), &header(), Vec::new()).unwrap();
    let found = Found {
        path: "a".into(),
        kind: "file".into(),
        size: 10,
        link: None,
    };
    let pieces = |parts: &[&'static str]| {
        Given(
            parts
                .iter()
                .map(|part| Bytes::from_static(part.as_bytes()))
                .collect(),
        )
    };
    // (name, pieces, written or the failure's reason)
    let cases: &[(&str, &[&str], Result<&str, &str>)] = &[
        ("one piece", &["alpha beta"], Ok("alpha beta")),
        (
            "pieces of any size, empty ones among them",
            &["", "al", "", "pha beta", ""],
            Ok("alpha beta"),
        ),
        ("a piece past the size", &["alpha beta", "!"], Err("size")),
        (
            "a piece that crosses the size",
            &["alpha", " beta!"],
            Err("size"),
        ),
        ("too few bytes", &["alpha"], Err("size")),
        (
            "the right size, another content",
            &["alpha BETA"],
            Err("BLAKE3"),
        ),
    ];
    for (name, parts, wanted) in cases {
        let target = Target::new();
        let mut extraction = Extraction::start(&target.root(), reader(&manifest)).unwrap();
        let outcome = extraction
            .entry(&found, &mut pieces(parts), &|error: io::Error| {
                ExtractError::Archive(error.to_string())
            })
            .and_then(|()| extraction.finish().map(|_| ()));
        match (outcome, wanted) {
            (Ok(()), Ok(content)) => assert_eq!(
                std::fs::read(target.root().join("a")).unwrap(),
                content.as_bytes(),
                "{name}"
            ),
            (Err(ExtractError::Mismatch { what, .. }), Err(reason)) => {
                assert_eq!(what, *reason, "{name}")
            }
            (outcome, wanted) => panic!("{name}: {outcome:?}, wanted {wanted:?}"),
        }
    }
}

/// Records the length of every `write` call, taking at most `most` bytes of each.
struct Calls {
    lengths: Vec<usize>,
    written: Vec<u8>,
    most: usize,
}

impl Write for Calls {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.lengths.push(bytes.len());
        let taken = bytes.len().min(self.most);
        self.written.extend_from_slice(&bytes[..taken]);
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_block_is_written_in_calls_of_at_most_a_mebibyte() {
    let block: Vec<u8> = (0..(8 << 20) + 3)
        .map(|index| (index % 251) as u8)
        .collect();
    // (name, bytes taken per call, calls wanted)
    let cases: &[(&str, usize, Vec<usize>)] = &[
        (
            "an 8 MiB block: eight calls of 1 MiB and its tail",
            usize::MAX,
            [vec![WRITE_BYTES; 8], vec![3]].concat(),
        ),
        (
            "short writes: the rest of a part in the next call, never more than a part",
            700 << 10,
            (0..8)
                .flat_map(|_| [WRITE_BYTES, WRITE_BYTES - (700 << 10)])
                .chain([3])
                .collect(),
        ),
    ];
    for (name, most, wanted) in cases {
        let mut calls = Calls {
            lengths: Vec::new(),
            written: Vec::new(),
            most: *most,
        };
        write_in_parts(&mut calls, &block).unwrap();
        assert_eq!(&calls.lengths, wanted, "{name}");
        assert!(calls.written == block, "{name}: the bytes written differ");
    }
    let mut calls = Calls {
        lengths: Vec::new(),
        written: Vec::new(),
        most: usize::MAX,
    };
    write_in_parts(&mut calls, &block[..100]).unwrap();
    assert_eq!(calls.lengths, [100], "a small block: one call");
}
