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

#[cfg(test)]
mod tests {
    use super::*;

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
}
