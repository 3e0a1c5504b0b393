//! Builds a manifest of a directory tree in one pass.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use custody_proto::manifest::{Entry, Header, Kind, ManifestSummary, ManifestWriter};
use rustix::fs::{FileType, OFlags};

use crate::hashing::hash_file;
use crate::tree::{self, Metadata, OnDisk, Walk, WalkError};

use custody_proto::volume::IGNORED_AT_ROOT;

/// Why a manifest could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Walk(#[from] WalkError),
    #[error("{path}: a {kind} cannot be backed up")]
    Unsupported { path: String, kind: &'static str },
    #[error(
        "{path}: symlink to {target:?} leads out of the volume; a restore could never write or verify it (keep what it points to on this volume, or back up that volume too)"
    )]
    SymlinkLeavesVolume { path: String, target: String },
    #[error("{path}: symlink target is not UTF-8")]
    NonUtf8Target { path: String },
    #[error("{path}: is a mount of another filesystem inside the volume")]
    OtherFilesystem { path: String },
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} changed while it was read ({expected} bytes expected, {found} read)")]
    Changed {
        path: String,
        expected: u64,
        found: u64,
    },
    #[error("writing the manifest: {0}")]
    Write(#[source] io::Error),
    #[error("archiving {path}: {source}")]
    Archive {
        path: String,
        #[source]
        source: io::Error,
    },
    /// The tool writing the stream failed: what it wrote is not a backup.
    #[error("{0}")]
    ToolFailed(String),
}

/// Receives every entry of a walk, in manifest order, as the manifest is built: the backup
/// mover writes them into its archive, so that the volume is read once for both.
pub trait Archive {
    /// Adds a directory or a symlink.
    fn entry(&mut self, entry: &Entry) -> io::Result<()>;
    /// Adds a regular file at `path` with `metadata`; its content is read from `content`,
    /// which yields at most `metadata.size` bytes.
    fn file(&mut self, path: &str, metadata: &Metadata, content: &mut dyn Read) -> io::Result<()>;
}

/// A symlink's target, if a backup can hold it: UTF-8, and leading nowhere out of the volume
/// or into another volume of the same backup (`header`'s mounts); anything else a restore
/// could never write or verify.
pub fn symlink_target(found: &tree::Found, header: &Header) -> Result<String, BuildError> {
    let target = found
        .symlink_target
        .clone()
        .ok_or_else(|| BuildError::NonUtf8Target {
            path: found.path.clone(),
        })?;
    if !custody_proto::manifest::symlink_allowed(&found.path, &target, header) {
        return Err(BuildError::SymlinkLeavesVolume {
            path: found.path.clone(),
            target,
        });
    }
    Ok(target)
}

/// Walks `root` and writes its manifest to `out`.
pub fn build<W: Write>(
    root: &Path,
    header: &Header,
    out: W,
) -> Result<(W, ManifestSummary), BuildError> {
    build_into(root, header, out, None)
}

/// Reads a file once for the archive and the manifest: counts and hashes what passes.
struct Tee<R> {
    inner: R,
    hasher: blake3::Hasher,
    read: u64,
}

impl<R: Read> Read for Tee<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.hasher.update(&buffer[..read]);
        self.read += read as u64;
        Ok(read)
    }
}

/// Walks `root`, writes its manifest to `out` and, with an archive, hands it every entry.
pub fn build_into<W: Write>(
    root: &Path,
    header: &Header,
    out: W,
    mut archive: Option<&mut dyn Archive>,
) -> Result<(W, ManifestSummary), BuildError> {
    let root_fd = tree::open_root(root)?;
    let mut writer = ManifestWriter::new(out, header).map_err(BuildError::Write)?;
    for found in Walk::new(&root_fd, IGNORED_AT_ROOT)? {
        let found = found?;
        if found.other_filesystem {
            return Err(BuildError::OtherFilesystem { path: found.path });
        }
        // Directories and symlinks carry the walk's metadata; regular files the metadata of
        // the descriptor that is read, not of an earlier look.
        let walked = || {
            found.metadata.ok_or_else(|| BuildError::Unsupported {
                path: found.path.clone(),
                kind: "entry without metadata",
            })
        };
        let (kind, metadata) = match found.kind {
            OnDisk::Dir => (Kind::Dir, walked()?),
            OnDisk::Symlink => {
                let target = symlink_target(&found, header)?;
                (Kind::Symlink { target }, walked()?)
            }
            OnDisk::File => {
                let read_error = |source| BuildError::Read {
                    path: found.path.clone(),
                    source,
                };
                let fd = tree::open_beneath(&root_fd, &found.path, OFlags::RDONLY)
                    .map_err(|errno| read_error(errno.into()))?;
                let stat = rustix::fs::fstat(&fd).map_err(|errno| read_error(errno.into()))?;
                if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
                    return Err(BuildError::Unsupported {
                        path: found.path,
                        kind: "special file",
                    });
                }
                let opened = Metadata::of(&stat);
                let file = File::from(fd);
                let (hash, read) = match archive.as_deref_mut() {
                    None => hash_file(&mut { file }, opened.size).map_err(read_error)?,
                    Some(archive) => {
                        // At most the size the descriptor reported: a file that grows while
                        // it is read must not overrun its archive entry.
                        let mut tee = Tee {
                            inner: file.take(opened.size),
                            hasher: blake3::Hasher::new(),
                            read: 0,
                        };
                        archive
                            .file(&found.path, &opened, &mut tee)
                            .map_err(|source| BuildError::Archive {
                                path: found.path.clone(),
                                source,
                            })?;
                        (tee.hasher.finalize(), tee.read)
                    }
                };
                if read != opened.size {
                    return Err(BuildError::Changed {
                        path: found.path,
                        expected: opened.size,
                        found: read,
                    });
                }
                let kind = Kind::File {
                    size: opened.size,
                    blake3: hash.to_hex().to_string(),
                };
                (kind, opened)
            }
            OnDisk::Special => {
                return Err(BuildError::Unsupported {
                    path: found.path,
                    kind: found.kind.name(),
                });
            }
        };
        let entry = Entry {
            path: found.path,
            kind,
            mode: metadata.mode,
            uid: metadata.uid,
            gid: metadata.gid,
        };
        if let Some(archive) = archive.as_deref_mut()
            && !matches!(entry.kind, Kind::File { .. })
        {
            archive
                .entry(&entry)
                .map_err(|source| BuildError::Archive {
                    path: entry.path.clone(),
                    source,
                })?;
        }
        writer.push(&entry).map_err(BuildError::Write)?;
    }
    writer.finish().map_err(BuildError::Write)
}
