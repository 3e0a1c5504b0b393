//! A walk of a volume in the manifest's canonical order that never follows a symlink and
//! never leaves the volume's filesystem.
//!
//! Every directory is opened relative to its parent's descriptor with `O_NOFOLLOW`, so a
//! symlink swapped in for a directory is reported as a symlink, not traversed; a directory on
//! another filesystem (a mount inside the volume) is reported, not entered.

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// What kind of thing a path is on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDisk {
    File,
    Dir,
    Symlink,
    /// A device, FIFO or socket: never part of a backup.
    Special,
}

impl OnDisk {
    pub fn of(stat: &Stat) -> OnDisk {
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => OnDisk::File,
            FileType::Directory => OnDisk::Dir,
            FileType::Symlink => OnDisk::Symlink,
            _ => OnDisk::Special,
        }
    }

    /// `file`, `dir`, `symlink` or `special`, as manifests and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            OnDisk::File => "file",
            OnDisk::Dir => "dir",
            OnDisk::Symlink => "symlink",
            OnDisk::Special => "special file",
        }
    }
}

/// Permissions, owner and size of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Size in bytes (regular files; 0 otherwise).
    pub size: u64,
}

impl Metadata {
    /// The metadata in a `stat` result.
    pub fn of(stat: &Stat) -> Metadata {
        let is_file = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
        Metadata {
            mode: stat.st_mode & 0o7777,
            uid: stat.st_uid,
            gid: stat.st_gid,
            size: if is_file { stat.st_size as u64 } else { 0 },
        }
    }
}

/// One entry found by the walk.
#[derive(Clone)]
pub struct Found {
    /// Path relative to the root, `/`-separated.
    pub path: String,
    pub kind: OnDisk,
    /// `None` for regular files the directory listing already identified: whoever reads the
    /// file takes the metadata from the descriptor it opened, which saves a `stat` per file
    /// and cannot be stale.
    pub metadata: Option<Metadata>,
    /// The link's target, for symlinks whose target is UTF-8.
    pub symlink_target: Option<String>,
    /// The `stat` of the entry itself, taken by the walk (for regular files only when the walk
    /// was asked to: [`Walk::stat_files`]).
    pub stat: Option<Stat>,
    /// A directory that is a mount of another filesystem; it is not entered.
    pub other_filesystem: bool,
}

/// Why part of the tree could not be walked.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("opening {path}: {errno}")]
    Open { path: String, errno: Errno },
    #[error("reading directory {path}: {errno}")]
    ReadDir { path: String, errno: Errno },
    #[error("inspecting {path}: {errno}")]
    Stat { path: String, errno: Errno },
    #[error("{parent:?} holds a name that is not UTF-8: {name:?}")]
    NonUtf8Name { parent: String, name: Vec<u8> },
}

/// Resolution flags for every path opened beneath a volume root: no symlinks at all (not even
/// in parents), no escape above the root, no crossing into another mount.
pub fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

/// Opens the volume root itself (the root path is the operator's, so it may be a symlink the
/// kubelet made; nothing beneath it is).
pub fn open_root(root: &Path) -> Result<OwnedFd, WalkError> {
    rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| WalkError::Open {
        path: root.display().to_string(),
        errno,
    })
}

/// Opens `path` beneath `root` for reading, refusing symlinks anywhere in it.
pub fn open_beneath(root: &OwnedFd, path: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        root,
        path,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
        beneath(),
    )
}

/// The `stat` of `path` beneath `root` itself (a symlink is not followed), refusing symlinks
/// on the way to it.
pub fn stat_beneath(root: &OwnedFd, path: &str) -> Result<Stat, Errno> {
    // openat2 refuses any flag O_PATH ignores.
    let fd = rustix::fs::openat2(
        root,
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )?;
    rustix::fs::fstat(&fd)
}

struct Level {
    fd: OwnedFd,
    path: String,
    // Remaining names with their directory-entry type, sorted descending so the next one pops
    // off the end.
    names: Vec<(CString, FileType)>,
}

/// Walks a tree in canonical order (pre-order, children sorted by name bytes).
pub struct Walk {
    device: u64,
    stack: Vec<Level>,
    ignore_at_root: Vec<String>,
    stat_files: bool,
}

impl Walk {
    /// Starts a walk of `root`; root-level names in `ignore_at_root` are skipped.
    pub fn new(root: &OwnedFd, ignore_at_root: &[&str]) -> Result<Walk, WalkError> {
        let stat = rustix::fs::fstat(root).map_err(|errno| WalkError::Stat {
            path: ".".into(),
            errno,
        })?;
        let fd = rustix::fs::openat(
            root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| WalkError::Open {
            path: ".".into(),
            errno,
        })?;
        let mut walk = Walk {
            device: stat.st_dev,
            stack: Vec::new(),
            ignore_at_root: ignore_at_root.iter().map(|name| name.to_string()).collect(),
            stat_files: false,
        };
        walk.push_level(fd, String::new())?;
        Ok(walk)
    }

    /// Also `stat` regular files (relative to their directory, not following a symlink), so
    /// that whoever needs their metadata without reading them need not open them.
    pub fn stat_files(mut self) -> Walk {
        self.stat_files = true;
        self
    }

    fn push_level(&mut self, fd: OwnedFd, path: String) -> Result<(), WalkError> {
        let mut names = Vec::new();
        let dir = rustix::fs::Dir::read_from(&fd).map_err(|errno| WalkError::ReadDir {
            path: path.clone(),
            errno,
        })?;
        for entry in dir {
            let entry = entry.map_err(|errno| WalkError::ReadDir {
                path: path.clone(),
                errno,
            })?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            if path.is_empty()
                && self
                    .ignore_at_root
                    .iter()
                    .any(|ignored| ignored.as_bytes() == name.to_bytes())
            {
                continue;
            }
            names.push((name.to_owned(), entry.file_type()));
        }
        names.sort_unstable_by(|a, b| b.0.as_bytes().cmp(a.0.as_bytes()));
        self.stack.push(Level { fd, path, names });
        Ok(())
    }

    fn visit(&mut self, name: CString, listed_type: FileType) -> Result<Found, WalkError> {
        let level = self.stack.last().expect("visit with a level");
        let name_str = name_to_str(&name, &level.path)?;
        let path = if level.path.is_empty() {
            name_str.to_string()
        } else {
            format!("{}/{name_str}", level.path)
        };
        // A regular file cannot be a mount point reached by the walk without a stat, but it can
        // be a bind mount: readers open it with RESOLVE_NO_XDEV, which refuses that.
        if listed_type == FileType::RegularFile && !self.stat_files {
            return Ok(Found {
                path,
                kind: OnDisk::File,
                metadata: None,
                symlink_target: None,
                stat: None,
                other_filesystem: false,
            });
        }
        let stat =
            rustix::fs::statat(&level.fd, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|errno| {
                WalkError::Stat {
                    path: path.clone(),
                    errno,
                }
            })?;
        let kind = OnDisk::of(&stat);
        let mut found = Found {
            path,
            kind,
            metadata: Some(Metadata::of(&stat)),
            symlink_target: None,
            stat: Some(stat),
            other_filesystem: stat.st_dev != self.device,
        };
        match kind {
            OnDisk::Symlink => {
                let target =
                    rustix::fs::readlinkat(&level.fd, &name, Vec::new()).map_err(|errno| {
                        WalkError::Stat {
                            path: found.path.clone(),
                            errno,
                        }
                    })?;
                found.symlink_target = target.into_string().ok();
            }
            OnDisk::Dir if !found.other_filesystem => {
                let fd = rustix::fs::openat(
                    &level.fd,
                    &name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|errno| WalkError::Open {
                    path: found.path.clone(),
                    errno,
                })?;
                self.push_level(fd, found.path.clone())?;
            }
            _ => {}
        }
        Ok(found)
    }
}

fn name_to_str<'a>(name: &'a CStr, parent: &str) -> Result<&'a str, WalkError> {
    name.to_str().map_err(|_| WalkError::NonUtf8Name {
        parent: parent.to_string(),
        name: name.to_bytes().to_vec(),
    })
}

impl Iterator for Walk {
    type Item = Result<Found, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let level = self.stack.last_mut()?;
            match level.names.pop() {
                Some((name, listed_type)) => return Some(self.visit(name, listed_type)),
                None => {
                    self.stack.pop();
                }
            }
        }
    }
}
