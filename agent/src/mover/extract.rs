//! Extracting a backup archive into a volume, checked entry by entry against the manifest
//! the Backup recorded while it writes.
//!
//! The manifest (whose hash is the trust anchor) decides what may be written: every archive
//! entry must be the next manifest entry — same path, type, size, symlink target — and a
//! file's content must hash to the manifest's BLAKE3. Anything else (`..`, absolute paths,
//! device nodes, hard links, entries beyond the manifest, a stream that decompresses to more
//! than the manifest accounts for) stops the extraction before it is written. Every path is
//! opened beneath the root without following symlinks, so even an entry that passed those
//! checks cannot reach outside the volume.

use std::fs::File;
use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use bytes::{Bytes, BytesMut};

use custody_proto::manifest::{self, Entry, Kind, ManifestReader, Totals};
use rustix::fs::{AtFlags, Mode, OFlags};

use crate::tree;

/// Why an extraction stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("the target volume is not empty ({0} and more): refusing to restore over data")]
    TargetNotEmpty(String),
    #[error("the manifest: {0}")]
    Manifest(String),
    #[error("archive entry {found:?} where the manifest lists {expected:?}")]
    UnexpectedEntry { expected: String, found: String },
    #[error("archive entry {path:?} is a {found}, the manifest says {expected}")]
    WrongType {
        path: String,
        expected: &'static str,
        found: String,
    },
    #[error("archive entry {path:?}: {what} is {found}, the manifest says {expected}")]
    Mismatch {
        path: String,
        what: &'static str,
        expected: String,
        found: String,
    },
    #[error("the archive holds more entries than the manifest ({0:?} is extra)")]
    ExtraEntry(String),
    #[error("the archive ends before the manifest's entry {0:?}")]
    MissingEntry(String),
    #[error("the archive decompresses to more than its manifest accounts for ({limit} bytes)")]
    TooLarge { limit: u64 },
    #[error("the archive is unreadable: {0}")]
    Archive(String),
    #[error("reading the snapshot: {0}")]
    Download(String),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl ExtractError {
    /// CamelCase reason for conditions and Events.
    pub fn reason(&self) -> custody_proto::reasons::MoverFailure {
        use custody_proto::reasons::MoverFailure;
        match self {
            ExtractError::TargetNotEmpty(_) => MoverFailure::TargetNotEmpty,
            ExtractError::Manifest(_) => MoverFailure::ManifestInvalid,
            ExtractError::UnexpectedEntry { .. }
            | ExtractError::WrongType { .. }
            | ExtractError::Mismatch { .. }
            | ExtractError::ExtraEntry(_)
            | ExtractError::MissingEntry(_) => MoverFailure::ArchiveDoesNotMatchManifest,
            ExtractError::TooLarge { .. } => MoverFailure::ArchiveTooLarge,
            ExtractError::Archive(_) => MoverFailure::ArchiveUnreadable,
            ExtractError::Download(_) => MoverFailure::DownloadFailed,
            ExtractError::Write { .. } => MoverFailure::WriteFailed,
        }
    }
}

/// Bytes of tar framing allowed per entry beyond its content: header, padding and long-name
/// or PAX extension records.
const FRAMING_PER_ENTRY: u64 = 8 << 10;
/// Fixed allowance for the end-of-archive blocks and the writer's final padding.
const FRAMING_FIXED: u64 = 1 << 20;

/// How many bytes a well-formed archive of a manifest with `totals` can decompress to.
pub fn size_limit(totals: Totals) -> u64 {
    totals
        .total_bytes
        .saturating_add(totals.entries.saturating_mul(FRAMING_PER_ENTRY))
        .saturating_add(FRAMING_FIXED)
}

/// Reads a whole manifest (checking it to its trailer) for its totals.
pub fn manifest_totals<M: BufRead>(
    mut manifest: ManifestReader<M>,
) -> Result<Totals, ExtractError> {
    for entry in manifest.by_ref() {
        entry.map_err(|error| ExtractError::Manifest(error.to_string()))?;
    }
    Ok(manifest.totals())
}

/// Stops reading after `limit` bytes with an error (a decompression bomb ends here).
struct Limited<R> {
    inner: R,
    remaining: u64,
    limit: u64,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            // One more byte would exceed the limit: find out whether there is one.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(LimitExceeded(self.limit))),
            };
        }
        let wanted = buffer
            .len()
            .min(self.remaining.min(usize::MAX as u64) as usize);
        let read = self.inner.read(&mut buffer[..wanted])?;
        self.remaining -= read as u64;
        Ok(read)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("more than {0} bytes")]
struct LimitExceeded(u64);

fn archive_error(error: io::Error) -> ExtractError {
    if let Some(LimitExceeded(limit)) = error.get_ref().and_then(|inner| inner.downcast_ref()) {
        return ExtractError::TooLarge { limit: *limit };
    }
    ExtractError::Archive(error.to_string())
}

/// Entries of the root other than the filesystem's `lost+found`.
pub fn first_entry(root: &Path) -> io::Result<Option<String>> {
    for entry in std::fs::read_dir(root)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name != "lost+found" {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// Removes everything in `root` except `lost+found` (the Restore asked to overwrite).
pub fn clear(root: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        if entry.file_name() == "lost+found" {
            continue;
        }
        // symlink_metadata and remove_dir_all never follow symlinks out of the volume.
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn entry_type_name(kind: tar::EntryType) -> String {
    match kind {
        tar::EntryType::Regular => "file".into(),
        tar::EntryType::Continuous => "contiguous file".into(),
        tar::EntryType::Directory => "dir".into(),
        tar::EntryType::Symlink => "symlink".into(),
        tar::EntryType::Link => "hard link".into(),
        tar::EntryType::Char => "character device".into(),
        tar::EntryType::Block => "block device".into(),
        tar::EntryType::Fifo => "fifo".into(),
        other => format!("{other:?} entry"),
    }
}

/// What an archive says an entry is, before it is checked against the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Path relative to the root.
    pub path: String,
    /// `file`, `dir`, `symlink`, or what else it is (`hard link`, `fifo`, …).
    pub kind: String,
    /// Content size (files).
    pub size: u64,
    /// Target (symlinks).
    pub link: Option<String>,
}

/// A file's content as the extraction takes it: pieces in order, then `None`.
pub trait Pieces {
    fn next_piece(&mut self) -> io::Result<Option<Bytes>>;
}

/// Bytes read from a stream per piece.
const CHUNK: usize = 256 << 10;

/// A stream's content in pieces of at most [`CHUNK`] bytes, read into one buffer: a piece is
/// written before the next is read, so its allocation is taken back for the next.
struct ReadPieces<'a> {
    inner: &'a mut dyn Read,
    buffer: &'a mut BytesMut,
}

impl Pieces for ReadPieces<'_> {
    fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        // `resize` reclaims the previous piece's allocation once nothing else holds it.
        self.buffer.clear();
        self.buffer.resize(CHUNK, 0);
        let read = self.inner.read(self.buffer)?;
        Ok((read > 0).then(|| self.buffer.split_to(read).freeze()))
    }
}

/// Writes entries into an empty root, each checked against the next manifest entry, in
/// manifest order, whatever the archive's format.
pub struct Extraction<M: BufRead> {
    writer: Writer,
    manifest: ManifestReader<M>,
}

impl<M: BufRead> Extraction<M> {
    /// Starts writing into the empty directory `root`.
    pub fn start(root: &Path, manifest: ManifestReader<M>) -> Result<Extraction<M>, ExtractError> {
        let root_fd =
            tree::open_root(root).map_err(|error| ExtractError::Archive(error.to_string()))?;
        Ok(Extraction {
            writer: Writer {
                root: root_fd,
                parent: None,
                open: None,
                syncer: Syncer::start(),
            },
            manifest,
        })
    }

    /// Checks `found` against the next manifest entry and writes it; a file's content is taken
    /// from `content` piece by piece (one piece past the manifest's size stops it) and must
    /// hash to the manifest's BLAKE3. `read_error` names a failure to read `content`.
    pub fn entry(
        &mut self,
        found: &Found,
        content: &mut dyn Pieces,
        read_error: &dyn Fn(io::Error) -> ExtractError,
    ) -> Result<(), ExtractError> {
        let Some(expected) = self.manifest.next() else {
            return Err(ExtractError::ExtraEntry(found.path.clone()));
        };
        let expected = expected.map_err(|error| ExtractError::Manifest(error.to_string()))?;
        check(&expected, found)?;
        let Kind::File { size, blake3 } = &expected.kind else {
            return self.writer.apply(Op::Create(expected));
        };
        let (size, blake3, path) = (*size, blake3.clone(), expected.path.clone());
        self.writer.apply(Op::Create(expected))?;
        let mut hasher = blake3::Hasher::new();
        let mut written = 0u64;
        while let Some(piece) = content.next_piece().map_err(read_error)? {
            written = written.saturating_add(piece.len() as u64);
            if written > size {
                break;
            }
            hasher.update(&piece);
            let length = piece.len() as u64;
            // Written from the piece itself: the content is never copied on its way.
            self.writer.apply(Op::Write(piece))?;
            super::progress::bytes(length);
        }
        if written != size {
            return Err(ExtractError::Mismatch {
                path,
                what: "size",
                expected: size.to_string(),
                found: if written > size {
                    format!("more than {size}")
                } else {
                    written.to_string()
                },
            });
        }
        let hash = hasher.finalize().to_hex().to_string();
        if hash != blake3 {
            return Err(ExtractError::Mismatch {
                path,
                what: "BLAKE3",
                expected: blake3,
                found: hash,
            });
        }
        self.writer.apply(Op::Close)?;
        super::progress::file();
        Ok(())
    }

    /// Every entry is written: waits for the flushes and checks that the manifest has none
    /// left. Returns its totals (its trailer checked).
    pub fn finish(mut self) -> Result<Totals, ExtractError> {
        self.writer.syncer.finish()?;
        if let Some(missing) = self.manifest.next() {
            let missing = missing.map_err(|error| ExtractError::Manifest(error.to_string()))?;
            return Err(ExtractError::MissingEntry(missing.path));
        }
        // The manifest's trailer is checked when the reader is exhausted.
        Ok(self.manifest.totals())
    }
}

/// Extracts `archive` (an uncompressed tar stream) into the empty directory `root`, checking
/// it against `manifest` as it goes. Returns the manifest's totals.
pub fn extract<R: Read, M: BufRead>(
    root: &Path,
    archive: R,
    manifest: ManifestReader<M>,
    limit: u64,
) -> Result<Totals, ExtractError> {
    let mut extraction = Extraction::start(root, manifest)?;
    let mut archive = tar::Archive::new(Limited {
        inner: archive,
        remaining: limit,
        limit,
    });
    let entries = archive.entries().map_err(archive_error)?;
    let mut buffer = BytesMut::new();
    for entry in entries {
        let mut entry = entry.map_err(archive_error)?;
        let found = found_in_tar(&mut entry);
        let mut content = ReadPieces {
            inner: &mut entry,
            buffer: &mut buffer,
        };
        extraction.entry(&found, &mut content, &archive_error)?;
    }
    let totals = extraction.finish()?;
    // Whatever follows the end-of-archive blocks must be padding, within the limit.
    let mut rest = archive.into_inner();
    let mut buffer = [0u8; 8192];
    loop {
        let read = rest.read(&mut buffer).map_err(archive_error)?;
        if read == 0 {
            break;
        }
        if buffer[..read].iter().any(|byte| *byte != 0) {
            return Err(ExtractError::Archive(
                "data after the end of the archive".to_string(),
            ));
        }
    }
    Ok(totals)
}

fn found_in_tar<R: Read>(entry: &mut tar::Entry<'_, R>) -> Found {
    let path = String::from_utf8_lossy(&entry.path_bytes())
        .trim_end_matches('/')
        .to_string();
    let entry_type = entry.header().entry_type();
    let kind = match entry_type {
        // Only a plain regular file counts as one (a contiguous file is not written as such).
        tar::EntryType::Regular => "file".to_string(),
        tar::EntryType::Directory => "dir".to_string(),
        tar::EntryType::Symlink => "symlink".to_string(),
        other => entry_type_name(other),
    };
    let link = (entry_type == tar::EntryType::Symlink).then(|| {
        entry
            .link_name_bytes()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    });
    Found {
        path,
        kind,
        size: entry.size(),
        link,
    }
}

fn check(expected: &Entry, found: &Found) -> Result<(), ExtractError> {
    if found.path != expected.path {
        return Err(ExtractError::UnexpectedEntry {
            expected: expected.path.clone(),
            found: found.path.clone(),
        });
    }
    if found.kind != expected.kind.name() {
        return Err(ExtractError::WrongType {
            path: expected.path.clone(),
            expected: expected.kind.name(),
            found: found.kind.clone(),
        });
    }
    let mismatch = |what, expected_value: String, found_value: String| ExtractError::Mismatch {
        path: expected.path.clone(),
        what,
        expected: expected_value,
        found: found_value,
    };
    match &expected.kind {
        Kind::File { size, .. } => {
            if found.size != *size {
                return Err(mismatch("size", size.to_string(), found.size.to_string()));
            }
        }
        Kind::Symlink { target } => {
            let link = found.link.clone().unwrap_or_default();
            if link != *target {
                return Err(mismatch("symlink target", target.clone(), link));
            }
        }
        Kind::Dir => {}
    }
    Ok(())
}

/// Files at least this large start their way to the disk as soon as they are written (see
/// [`Syncer`]).
const SYNC_EARLY: u64 = 8 << 20;

/// Flushes large files to the disk on a thread of its own while the extraction goes on, so
/// that the disk writes while the CPU decompresses and the final `syncfs` has little left to
/// do. A flush that fails fails the restore.
struct Syncer {
    sender: Option<std::sync::mpsc::Sender<(String, File)>>,
    thread: Option<std::thread::JoinHandle<Result<(), ExtractError>>>,
}

impl Syncer {
    fn start() -> Syncer {
        let (sender, receiver) = std::sync::mpsc::channel::<(String, File)>();
        let thread = std::thread::Builder::new()
            .name("sync".into())
            .spawn(move || {
                for (path, file) in receiver {
                    file.sync_data()
                        .map_err(|source| ExtractError::Write { path, source })?;
                }
                Ok(())
            })
            .ok();
        Syncer {
            sender: thread.is_some().then_some(sender),
            thread,
        }
    }

    /// Hands `file` over to be flushed; without the thread, the final `syncfs` does it.
    fn flush(&self, path: &str, file: File) {
        if let Some(sender) = &self.sender {
            // A send fails only once the thread stopped on an error, which `finish` reports.
            let _ = sender.send((path.to_string(), file));
        }
    }

    /// Waits for every flush; the first failure, if any.
    fn finish(&mut self) -> Result<(), ExtractError> {
        self.sender = None;
        match self.thread.take().map(std::thread::JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(error))) => Err(error),
            Some(Err(_)) => Err(ExtractError::Archive("the sync thread panicked".into())),
        }
    }
}

/// Most bytes one `write` call hands the kernel. A longer write makes the page cache take
/// its memory as folios of up to 2 MiB, and on a VM whose host takes back free memory (this
/// project's test machine: free page reporting at 2 MiB) every such folio is a fresh page
/// fault in the host: writing 1,936 MiB from one 8 MiB buffer took 1.80 and 6.29 s, from one
/// 1 MiB buffer 0.42 and 0.48 s (`hack/bench-write-size.sh`). A block of content is up to
/// 8 MiB.
const WRITE_BYTES: usize = 1 << 20;

/// Writes `bytes` to `file` in calls of at most [`WRITE_BYTES`].
fn write_in_parts(file: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    bytes
        .chunks(WRITE_BYTES)
        .try_for_each(|part| file.write_all(part))
}

/// What extracting an entry asks of the [`Writer`], in archive order. (Writing on a thread
/// of its own was measured: on two cores shared with the S3 server it only added work.)
enum Op {
    /// Create the entry; for a file, open it for the writes that follow.
    Create(Entry),
    /// Append the piece to the open file.
    Write(Bytes),
    /// The open file is complete: set its owner and mode.
    Close,
}

/// Writes entries beneath the root, reusing the last directory it opened.
struct Writer {
    root: OwnedFd,
    /// The parent directory of the previous entry, by path.
    parent: Option<(String, OwnedFd)>,
    /// The file being written.
    open: Option<(Entry, File)>,
    syncer: Syncer,
}

impl Writer {
    /// Splits `path` into its parent (opened beneath the root, no symlinks, or the one opened for
    /// the previous entry) and its last name.
    fn parent_of<'a>(&mut self, path: &'a str) -> Result<(&OwnedFd, &'a str), io::Error> {
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (Some(parent), name),
            None => (None, path),
        };
        let parent = parent.unwrap_or(".");
        let cached = self.parent.as_ref().is_some_and(|(path, _)| path == parent);
        if !cached {
            let flags = OFlags::DIRECTORY | OFlags::RDONLY;
            let fd = tree::open_beneath(&self.root, parent, flags)?;
            self.parent = Some((parent.to_string(), fd));
        }
        let (_, fd) = self.parent.as_ref().expect("set above");
        Ok((fd, name))
    }

    /// Carries out one operation.
    fn apply(&mut self, op: Op) -> Result<(), ExtractError> {
        match op {
            Op::Create(expected) => self.create(expected),
            Op::Write(piece) => {
                if let Some((entry, file)) = &mut self.open {
                    write_in_parts(file, &piece).map_err(|source| ExtractError::Write {
                        path: entry.path.clone(),
                        source,
                    })?;
                }
                Ok(())
            }
            Op::Close => {
                if let Some((entry, file)) = self.open.take() {
                    let failed = |source: io::Error| ExtractError::Write {
                        path: entry.path.clone(),
                        source,
                    };
                    own(&file, &entry).map_err(failed)?;
                    rustix::fs::fchmod(&file, Mode::from_raw_mode(entry.mode & 0o7777))
                        .map_err(|errno| failed(errno.into()))?;
                    if let Kind::File { size, .. } = entry.kind
                        && size >= SYNC_EARLY
                    {
                        self.syncer.flush(&entry.path, file);
                    }
                }
                Ok(())
            }
        }
    }

    fn create(&mut self, expected: Entry) -> Result<(), ExtractError> {
        let path = expected.path.clone();
        // The manifest reader validated the path already; this is the last line of defence.
        manifest::validate_path(&path)
            .map_err(|error| ExtractError::Manifest(error.to_string()))?;
        let failed = |source: io::Error| ExtractError::Write {
            path: path.clone(),
            source,
        };
        let (parent, name) = self.parent_of(&path).map_err(failed)?;
        let mode = Mode::from_raw_mode(expected.mode & 0o7777);
        match &expected.kind {
            Kind::Dir => {
                rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
                    .map_err(|errno| failed(errno.into()))?;
                let fd = rustix::fs::openat(
                    parent,
                    name,
                    OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|errno| failed(errno.into()))?;
                own(&fd, &expected).map_err(failed)?;
                rustix::fs::fchmod(&fd, mode).map_err(|errno| failed(errno.into()))?;
            }
            Kind::Symlink { target } => {
                rustix::fs::symlinkat(target.as_str(), parent, name)
                    .map_err(|errno| failed(errno.into()))?;
                rustix::fs::chownat(
                    parent,
                    name,
                    Some(rustix::fs::Uid::from_raw(expected.uid)),
                    Some(rustix::fs::Gid::from_raw(expected.gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|errno| failed(errno.into()))?;
            }
            Kind::File { .. } => {
                let fd = rustix::fs::openat(
                    parent,
                    name,
                    OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::WRONLY
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|errno| failed(errno.into()))?;
                self.open = Some((expected, File::from(fd)));
            }
        }
        Ok(())
    }
}

fn own(fd: impl AsFd, entry: &Entry) -> io::Result<()> {
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(entry.uid)),
        Some(rustix::fs::Gid::from_raw(entry.gid)),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;
