//! How much disk a tree takes, as `du` counts it: the allocated blocks of every file,
//! directory and symlink, a file with several links once. A tool's output is measured so before
//! it is read: the kubelet evicts a pod whose `emptyDir` exceeds its size limit only when its
//! periodic check sees it, and a tool that overfills its scratch space and exits at once is
//! gone before that.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes on disk under `root` (itself included), without following symlinks. Memory grows
/// with the tree's depth (one open directory per level) and its files with several links, not
/// with its size.
pub fn disk_usage(root: &Path) -> std::io::Result<u64> {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut count = |metadata: &std::fs::Metadata| {
        if metadata.nlink() > 1
            && !metadata.is_dir()
            && !seen.insert((metadata.dev(), metadata.ino()))
        {
            return;
        }
        total = total.saturating_add(metadata.blocks().saturating_mul(512));
    };
    let metadata = std::fs::symlink_metadata(root)?;
    count(&metadata);
    if !metadata.is_dir() {
        return Ok(total);
    }
    let mut open = vec![std::fs::read_dir(root)?];
    while let Some(entries) = open.last_mut() {
        match entries.next() {
            None => {
                open.pop();
            }
            Some(entry) => {
                let entry = entry?;
                let metadata = entry.metadata()?;
                count(&metadata);
                if metadata.is_dir() {
                    open.push(std::fs::read_dir(entry.path())?);
                }
            }
        }
    }
    Ok(total)
}

/// Refuses a source that takes more than `limit` bytes on disk.
pub fn within(root: &Path, limit: u64) -> Result<u64, super::MoverError> {
    let used = disk_usage(root).map_err(|error| {
        super::MoverError::Local(format!("measuring {}: {error}", root.display()))
    })?;
    if used > limit {
        return Err(super::MoverError::SourceTooLarge { used, limit });
    }
    Ok(used)
}

/// What a filesystem has free for the restore mover (which may not use the blocks reserved for
/// root: it runs without `CAP_SYS_RESOURCE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub bytes: u64,
    /// Free inodes; `None` where the filesystem has no fixed count.
    pub inodes: Option<u64>,
}

/// Filesystems that may compress what they store: a backup's bytes of content are no bound
/// on the room they take there (btrfs, ZFS).
const COMPRESSING: [i64; 2] = [0x9123_683E, 0x2FC1_2FC1];

/// The room on the filesystem of `path`, once what was just deleted there (a cleared
/// unfinished attempt) is counted free (`syncfs`). `bytes` is `u64::MAX` on a filesystem that
/// may compress.
pub fn room(path: &Path) -> std::io::Result<Room> {
    let directory = std::fs::File::open(path)?;
    rustix::fs::syncfs(&directory)?;
    let stat = rustix::fs::fstatvfs(&directory)?;
    let kind = rustix::fs::fstatfs(&directory)?.f_type as i64;
    Ok(Room {
        bytes: if COMPRESSING.contains(&kind) {
            u64::MAX
        } else {
            stat.f_bavail.saturating_mul(stat.f_frsize)
        },
        inodes: (stat.f_files > 0).then_some(stat.f_favail),
    })
}

/// Why a volume with `room` cannot hold a backup whose `files` regular files take
/// `needed_bytes` in `entries` entries, if it cannot: the content alone is more than the free
/// space (or the entries more than the free inodes), so the restore would surely fail part way.
pub fn too_small(room: Room, needed_bytes: u64, files: u64, entries: u64) -> Option<String> {
    let mib = |bytes: u64| bytes as f64 / f64::from(1u32 << 20);
    if needed_bytes > room.bytes {
        return Some(format!(
            "the volume has {} bytes free ({:.1} MiB) and the backup's {files} files take {needed_bytes} bytes ({:.1} MiB): the restore wrote nothing; restore into a claim of at least that size",
            room.bytes,
            mib(room.bytes),
            mib(needed_bytes)
        ));
    }
    match room.inodes {
        Some(inodes) if entries > inodes => Some(format!(
            "the volume has {inodes} free inodes and the backup has {entries} entries: the restore wrote nothing; restore into a filesystem with more inodes"
        )),
        _ => None,
    }
}

/// Refuses a restore target that cannot hold what the backup's manifest counts, before
/// anything is written.
pub fn has_room(
    target: &Path,
    needed_bytes: u64,
    files: u64,
    entries: u64,
) -> Result<(), super::MoverError> {
    let room = room(target).map_err(|error| {
        super::MoverError::Local(format!("the free space of {}: {error}", target.display()))
    })?;
    match too_small(room, needed_bytes, files, entries) {
        Some(why) => Err(super::MoverError::TargetTooSmall(why)),
        None => Ok(()),
    }
}

/// Why a tool's copy of the claims cannot fit its scratch space, if it cannot: the copy of a
/// volume takes what its data takes on disk (`needed`: each claim's name and bytes), each into
/// a scratch volume of at most `limit` bytes (`scratchSize`), all of them on the node's disk
/// with `free` bytes free. A tool that must write the whole copy before it is read
/// (`mariadb-backup --backup` then `--prepare`) would otherwise fail, or fill the node's disk,
/// after minutes.
pub fn scratch_refusal(needed: &[(String, u64)], limit: u64, free: u64) -> Option<String> {
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    if let Some((claim, bytes)) = needed.iter().find(|(_, bytes)| *bytes > limit) {
        return Some(format!(
            "claim {claim} holds {bytes} bytes ({:.2} GiB) on disk and the tool's scratch space takes at most {limit} bytes ({:.2} GiB, its scratchSize): a copy would not fit, the tool was not run. Raise scratchSize to at least the data's size, or have the tool stream (output: TarStream)",
            gib(*bytes),
            gib(limit)
        ));
    }
    let total = needed.iter().map(|(_, bytes)| *bytes).sum::<u64>();
    // Several trees count against the tool's one ephemeral-storage limit together.
    if total > limit {
        return Some(format!(
            "claims {} hold {total} bytes ({:.2} GiB) on disk together and the tool's scratch space takes at most {limit} bytes ({:.2} GiB, its scratchSize): a copy would not fit, the tool was not run. Raise scratchSize to at least the data's size, or have the tool stream (output: TarStream)",
            needed
                .iter()
                .map(|(claim, _)| claim.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            gib(total),
            gib(limit)
        ));
    }
    (total > free).then(|| {
        format!(
            "the copy needs {total} bytes ({:.2} GiB) of scratch space and the node's disk has {free} bytes ({:.2} GiB) free: a copy would not fit, the tool was not run. Free the node's disk, or have the tool stream (output: TarStream)",
            gib(total),
            gib(free)
        )
    })
}

/// Why the scratch check did not pass.
#[derive(Debug)]
pub enum ScratchError {
    /// The copy would not fit: both sizes.
    Refused(String),
    /// The check itself failed (a claim it could not measure).
    Failed(String),
}

/// The scratch check of a tool's Job, before the tool runs: `claims` (name, where mounted)
/// measured as `du` does, against `limit` and the free space where `scratch` is.
pub fn check_scratch(
    claims: &[(String, std::path::PathBuf)],
    scratch: &Path,
    limit: u64,
) -> Result<(), ScratchError> {
    let mut needed = Vec::new();
    for (claim, path) in claims {
        let bytes = disk_usage(path).map_err(|error| {
            ScratchError::Failed(format!(
                "measuring claim {claim} at {}: {error}",
                path.display()
            ))
        })?;
        needed.push((claim.clone(), bytes));
    }
    let free = room(scratch)
        .map_err(|error| {
            ScratchError::Failed(format!("the free space of {}: {error}", scratch.display()))
        })?
        .bytes;
    match scratch_refusal(&needed, limit, free) {
        Some(refusal) => Err(ScratchError::Refused(refusal)),
        None => {
            eprintln!(
                "custody-mover: the tool's copy needs about {} bytes of scratch space: at most {limit} per volume, {free} free on the node",
                needed.iter().map(|(_, bytes)| *bytes).sum::<u64>()
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_refused_only_when_a_claim_exceeds_the_scratch_size_or_all_exceed_the_free_disk() {
        let claims = |sizes: &[u64]| -> Vec<(String, u64)> {
            sizes
                .iter()
                .enumerate()
                .map(|(index, size)| (format!("claim-{index}"), *size))
                .collect()
        };
        // (claims' sizes, limit, free, refused, said)
        let rows: [(&[u64], u64, u64, bool, &str); 8] = [
            (&[100], 100, 100, false, ""),
            (&[101], 100, 1000, true, "claim claim-0 holds 101 bytes"),
            (&[100], 100, 99, true, "needs 100 bytes"),
            (&[60, 60], 120, 120, false, ""),
            (
                &[60, 60],
                100,
                1000,
                true,
                "claims claim-0, claim-1 hold 120 bytes",
            ),
            (&[60, 60], 120, 119, true, "has 119 bytes (0.00 GiB) free"),
            (&[10, 101], 100, 1000, true, "claim claim-1"),
            (&[], 0, 0, false, ""),
        ];
        for (sizes, limit, free, refused, said) in rows {
            let refusal = scratch_refusal(&claims(sizes), limit, free);
            assert_eq!(
                refusal.is_some(),
                refused,
                "{sizes:?} {limit} {free}: {refusal:?}"
            );
            if let Some(refusal) = refusal {
                assert!(refusal.contains(said), "{refusal}");
                assert!(refusal.contains("the tool was not run"), "{refusal}");
            }
        }
    }

    /// Files count by their allocated blocks, a hard-linked file once, a sparse file by what
    /// it allocates; over the limit is refused, at the limit is not.
    #[test]
    fn usage_counts_blocks_once_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let empty = disk_usage(root).unwrap();
        // Data no filesystem compresses away.
        let noise = |seed: u64| -> Vec<u8> {
            let mut state = seed;
            (0..1 << 20)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 56) as u8
                })
                .collect()
        };
        std::fs::write(root.join("a"), noise(1)).unwrap();
        let one = disk_usage(root).unwrap();
        assert!(one >= empty + (1 << 20), "{empty} then {one}");
        std::fs::hard_link(root.join("a"), root.join("b")).unwrap();
        assert_eq!(
            disk_usage(root).unwrap(),
            one,
            "a second link is not a second file"
        );
        std::fs::create_dir(root.join("sub")).unwrap();
        let sparse = std::fs::File::create(root.join("sub/sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        let with_sparse = disk_usage(root).unwrap();
        assert!(
            with_sparse < one + (1 << 20),
            "a sparse file counts its blocks: {with_sparse}"
        );
        std::fs::write(root.join("sub/c"), noise(2)).unwrap();
        let used = disk_usage(root).unwrap();
        assert!(used >= one + (1 << 20));
        assert_eq!(within(root, used).unwrap(), used);
        match within(root, used - 1) {
            Err(super::super::MoverError::SourceTooLarge { used: seen, limit }) => {
                assert_eq!((seen, limit), (used, used - 1));
            }
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_target_is_too_small_only_when_the_content_or_the_entries_cannot_fit() {
        let room = |bytes, inodes| Room { bytes, inodes };
        // (room, needed bytes, entries, refused)
        let rows = [
            (room(100, Some(10)), 100, 10, false),
            (room(100, Some(10)), 101, 1, true),
            (room(100, Some(10)), 0, 11, true),
            (room(100, None), 50, 1_000_000, false),
            (room(0, Some(0)), 0, 0, false),
        ];
        for (room, bytes, entries, refused) in rows {
            assert_eq!(
                too_small(room, bytes, 1, entries).is_some(),
                refused,
                "{room:?} {bytes} {entries}"
            );
        }
        let said = too_small(room(1 << 20, None), 3 << 20, 7, 9).unwrap();
        assert!(
            said.contains("1048576 bytes free") && said.contains("7 files take 3145728 bytes"),
            "{said}"
        );
        assert!(room_of_tmp().bytes > 0);
    }

    fn room_of_tmp() -> Room {
        room(&std::env::temp_dir()).unwrap()
    }
}
