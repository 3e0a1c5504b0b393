//! Loop-mounted ext4 images that stand in for persistent volumes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh ext4 filesystem on a loop device, mounted on a temporary directory; unmounted and
/// removed when dropped.
pub struct LoopVolume {
    dir: tempfile::TempDir,
    mount_point: PathBuf,
}

fn run(program: &str, args: &[&str]) {
    crate::run(Command::new(program).args(args));
}

impl LoopVolume {
    /// Creates and mounts a volume of `megabytes`.
    pub fn new(megabytes: u64) -> LoopVolume {
        let dir = tempfile::tempdir().expect("temporary directory");
        let image = dir.path().join("volume.img");
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point).expect("mount point");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(megabytes << 20))
            .expect("image file");
        run(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", image.to_str().expect("utf-8 path")],
        );
        run(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().expect("utf-8"),
                mount_point.to_str().expect("utf-8"),
            ],
        );
        LoopVolume { dir, mount_point }
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    /// A directory next to the mount, on the host's disk (not the volume).
    pub fn outside(&self) -> PathBuf {
        let outside = self.dir.path().join("outside");
        std::fs::create_dir_all(&outside).expect("outside directory");
        outside
    }
}

impl Drop for LoopVolume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount_point).status();
    }
}

/// Copies a tree preserving modes, owners and symlinks (`cp -a`).
pub fn copy_tree(from: &Path, to: &Path) {
    run(
        "cp",
        &[
            "-a",
            &format!("{}/.", from.display()),
            to.to_str().expect("utf-8"),
        ],
    );
}

/// The inode of every entry [`tree`] lists, by path (in path order): the same list after a
/// step shows that nothing was written again.
pub fn inodes(root: &Path) -> Vec<(String, u64)> {
    tree(root)
        .into_keys()
        .map(|path| {
            let meta = std::fs::symlink_metadata(root.join(&path)).expect("an entry tree listed");
            (path, std::os::unix::fs::MetadataExt::ino(&meta))
        })
        .collect()
}

/// Every directory, regular file and symlink under `root` (but custody's `.custody/` and
/// `lost+found`), with its content (a symlink's target; a directory, ending in `/`, none).
pub fn tree(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = path.strip_prefix(root).unwrap().display().to_string();
            if relative == ".custody" || relative == "lost+found" {
                continue;
            }
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                out.insert(
                    relative,
                    std::fs::read_link(&path)
                        .unwrap()
                        .display()
                        .to_string()
                        .into_bytes(),
                );
            } else if kind.is_dir() {
                out.insert(format!("{relative}/"), Vec::new());
                walk(root, &path, out);
            } else {
                out.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// ~10k small files in nested directories, a few large ones, modes, owners and a symlink.
pub fn fill(root: &Path) {
    for index in 0..10_000 {
        let directory = root.join(format!("base/{:03}", index / 100));
        if index % 100 == 0 {
            std::fs::create_dir_all(&directory).unwrap();
        }
        std::fs::write(
            directory.join(format!("{index:05}")),
            format!("row {index} {}", "v".repeat(index % 700)),
        )
        .unwrap();
    }
    std::fs::create_dir_all(root.join("pg_wal")).unwrap();
    for index in 0..3 {
        let content: Vec<u8> = (0..(24 << 20) + index * 4097)
            .map(|byte| ((byte * 2654435761usize) >> 13) as u8)
            .collect();
        std::fs::write(root.join(format!("pg_wal/segment-{index}")), content).unwrap();
    }
    std::os::unix::fs::symlink("pg_wal/segment-0", root.join("current")).unwrap();
    std::os::unix::fs::chown(root.join("base/000/00001"), Some(999), Some(999)).unwrap();
    std::fs::set_permissions(
        root.join("pg_wal"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
}

/// Verifies the restored volume at `target` against the manifest hash a backup recorded and
/// the Backup and Restore UIDs its identity file must carry; the number of files verified.
pub fn verified(target: &Path, manifest_hash: &str, backup_uid: &str, restore_uid: &str) -> u64 {
    use custody_agent::verify::{Expected, Options, verify_volume};
    verify_volume(
        target,
        &Expected {
            manifest_hash: blake3::Hash::from_hex(manifest_hash).expect("a manifest hash"),
            backup_uid: backup_uid.into(),
            restore_uid: restore_uid.into(),
        },
        Options::default(),
    )
    .expect("the restored volume verifies")
    .files
}

/// `size` bytes no compressor can shrink (xorshift from `seed`), so an upload takes many parts.
pub fn incompressible(size: usize, seed: u64) -> Vec<u8> {
    let mut content = vec![0u8; size];
    let mut state = seed;
    for chunk in content.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    content
}
