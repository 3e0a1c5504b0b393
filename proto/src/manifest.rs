//! The backup manifest: what a volume held when it was backed up, entry by entry.
//!
//! The format is JSON Lines so that millions of entries stream without one in-memory blob:
//!
//! ```text
//! {"custodyManifest":1,"backupUid":"…","clusterUid":"…","createdAt":"2026-11-30T05:00:00Z"}
//! {"path":"base","type":"dir","mode":448,"uid":999,"gid":999}
//! {"path":"base/1","type":"file","size":8192,"blake3":"af13…","mode":384,"uid":999,"gid":999}
//! {"path":"current","type":"symlink","target":"base/1","mode":511,"uid":999,"gid":999}
//! {"end":{"entries":3,"files":1,"totalBytes":8192}}
//! ```
//!
//! Entries come in canonical order: a pre-order walk with each directory's children sorted by
//! name bytes, which is lexicographic order of their component lists ([`compare_paths`]). The
//! order is what lets a verifier merge-join a manifest with a walk of the volume in constant
//! memory, and it makes duplicates impossible to hide. The BLAKE3 hash of the whole file
//! ([`ManifestSummary::hash`]) is recorded in the Backup's status when the backup completes:
//! it is the trust anchor, so a manifest written or altered by anything else cannot vouch for
//! a volume.

use std::cmp::Ordering;
use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};

/// The manifest format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Largest file size a manifest may claim (1 PiB); anything larger is hostile or corrupt.
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// Longest relative path a manifest may name, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest path component, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// Longest line the reader accepts; no valid entry comes near it.
pub const MAX_LINE_BYTES: usize = 3 * MAX_PATH_BYTES + 1024;

/// First line: who the manifest belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Header {
    /// Format version; [`FORMAT_VERSION`].
    pub custody_manifest: u32,
    /// UID of the Backup that wrote the manifest.
    pub backup_uid: String,
    /// UID of the Cluster the volume belongs to.
    pub cluster_uid: String,
    /// When the backup read the volume (RFC 3339).
    pub created_at: String,
    /// Where the application mounts this volume, when the backup knew it and read other
    /// volumes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    /// Where the application mounts the other volumes of the same backup: a symlink of this
    /// volume may lead into them ([`symlink_allowed`]), since they are restored, verified and
    /// released with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sibling_mounts: Vec<String>,
}

impl Header {
    /// A header of one volume read alone.
    pub fn new(backup_uid: &str, cluster_uid: &str, created_at: &str) -> Header {
        Header {
            custody_manifest: FORMAT_VERSION,
            backup_uid: backup_uid.to_string(),
            cluster_uid: cluster_uid.to_string(),
            created_at: created_at.to_string(),
            mount_path: None,
            sibling_mounts: Vec::new(),
        }
    }
}

/// A path's components after `.` and `..` are resolved lexically (`..` at the root stays
/// there).
fn normal_components(path: &str) -> Vec<&str> {
    let mut components: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                components.pop();
            }
            other => components.push(other),
        }
    }
    components
}

/// Whether a symlink at `link_path` (relative to the volume's root) with `target` resolves
/// outside the volume, lexically.
pub fn symlink_escapes(link_path: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return true;
    }
    let mut depth = link_path.split('/').count() as i64 - 1;
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// Whether a backup may hold, and a restore write and verify, a symlink at `link_path` with
/// `target` in a volume with `header`: it stays in the volume, or (the volume's mount path
/// known) it leads, resolved from where the application sees it, into another volume of the
/// same backup (`pg_wal -> /var/lib/postgresql/wal/pg_wal`). Anything else would dangle
/// after a restore, or point at something no restore wrote or verified.
pub fn symlink_allowed(link_path: &str, target: &str, header: &Header) -> bool {
    if !symlink_escapes(link_path, target) {
        return true;
    }
    let Some(mount) = header
        .mount_path
        .as_deref()
        .filter(|mount| mount.starts_with('/'))
    else {
        return false;
    };
    // A `..` after a name steps back out of whatever that name is, a symlink included (a
    // link in the other volume leading elsewhere): read lexically, it could seem to stay in
    // a volume it leaves. Only leading `..` (through the link's own real directories) count.
    let mut named = false;
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." if named => return false,
            ".." => {}
            _ => named = true,
        }
    }
    let absolute = if target.starts_with('/') {
        target.to_string()
    } else {
        let parent = link_path.rsplit_once('/').map_or("", |(parent, _)| parent);
        format!("{mount}/{parent}/{target}")
    };
    let resolved = normal_components(&absolute);
    header
        .sibling_mounts
        .iter()
        .filter(|sibling| sibling.starts_with('/'))
        .map(|sibling| normal_components(sibling))
        .filter(|sibling| !sibling.is_empty())
        .any(|sibling| resolved.starts_with(&sibling))
}

/// What an entry is, with the facts that are checked for its kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Kind {
    /// A regular file: its size and the BLAKE3 hash of its content (64 lowercase hex digits).
    File { size: u64, blake3: String },
    /// A directory.
    Dir,
    /// A symbolic link and the target it holds (never followed).
    Symlink { target: String },
}

impl Kind {
    /// `file`, `dir` or `symlink`.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::File { .. } => "file",
            Kind::Dir => "dir",
            Kind::Symlink { .. } => "symlink",
        }
    }
}

/// One entry of the volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the volume root, components separated by `/`.
    pub path: String,
    /// Its kind, whose fields sit beside the others in its line (`type` names it).
    pub kind: Kind,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner user ID.
    pub uid: u32,
    /// Owner group ID.
    pub gid: u32,
}

/// An entry's line, written as `#[derive(Serialize)]` would write it with `kind` flattened
/// (the same fields in the same order), as a struct: serde writes a flattened field through a
/// map, entry by entry (about a fifth of an unchanged backup's walk).
impl Serialize for Entry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let fields = match &self.kind {
            Kind::File { .. } => 7,
            Kind::Dir => 5,
            Kind::Symlink { .. } => 6,
        };
        let mut line = serializer.serialize_struct("Entry", fields)?;
        line.serialize_field("path", &self.path)?;
        line.serialize_field("type", self.kind.name())?;
        match &self.kind {
            Kind::File { size, blake3 } => {
                line.serialize_field("size", size)?;
                line.serialize_field("blake3", blake3)?;
            }
            Kind::Dir => {}
            Kind::Symlink { target } => line.serialize_field("target", target)?,
        }
        line.serialize_field("mode", &self.mode)?;
        line.serialize_field("uid", &self.uid)?;
        line.serialize_field("gid", &self.gid)?;
        line.end()
    }
}

/// An entry's line read in one pass. What `#[derive(Deserialize)]` would read with `kind`
/// flattened (the same fields, unknown ones ignored), without serde's buffering of every
/// line's fields into a map that it then reads again: manifests are read whole by every
/// verification, restore and backup with a parent.
impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(rename_all = "lowercase")]
        enum Type {
            File,
            Dir,
            Symlink,
        }
        #[derive(Deserialize)]
        struct Line {
            path: String,
            #[serde(rename = "type")]
            kind: Type,
            size: Option<u64>,
            blake3: Option<String>,
            target: Option<String>,
            mode: u32,
            uid: u32,
            gid: u32,
        }
        let line = Line::deserialize(deserializer)?;
        let kind = match line.kind {
            Type::File => Kind::File {
                size: line.size.ok_or_else(|| D::Error::missing_field("size"))?,
                blake3: line
                    .blake3
                    .ok_or_else(|| D::Error::missing_field("blake3"))?,
            },
            Type::Dir => Kind::Dir,
            Type::Symlink => Kind::Symlink {
                target: line
                    .target
                    .ok_or_else(|| D::Error::missing_field("target"))?,
            },
        };
        Ok(Entry {
            path: line.path,
            kind,
            mode: line.mode,
            uid: line.uid,
            gid: line.gid,
        })
    }
}

/// Last line: counts that let a reader notice a truncated or padded manifest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Totals {
    /// Number of entries.
    pub entries: u64,
    /// Number of regular files.
    pub files: u64,
    /// Sum of the regular files' sizes.
    pub total_bytes: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Trailer {
    end: Totals,
}

/// The finished manifest: its hash (the trust anchor) and totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestSummary {
    /// BLAKE3 of every byte of the manifest file.
    pub hash: blake3::Hash,
    /// Counts written in the trailer.
    pub totals: Totals,
}

/// Why a manifest cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading the manifest: {0}")]
    Read(#[from] io::Error),
    #[error("manifest line {line}: {reason}")]
    Malformed { line: u64, reason: String },
    #[error("manifest format version {0} is not supported (expected {FORMAT_VERSION})")]
    UnsupportedVersion(u32),
    #[error("manifest line {line}: unsafe path {path:?}: {reason}")]
    UnsafePath {
        line: u64,
        path: String,
        reason: PathError,
    },
    #[error("manifest line {line}: {path:?} is not after {previous:?}: duplicate or out of order")]
    OutOfOrder {
        line: u64,
        path: String,
        previous: String,
    },
    #[error("manifest line {line}: {path:?} has no directory entry for its parent")]
    Orphan { line: u64, path: String },
    #[error(
        "manifest line {line}: {path:?} claims {size} bytes, more than the {MAX_FILE_SIZE} allowed"
    )]
    AbsurdSize { line: u64, path: String, size: u64 },
    #[error("manifest line {line}: {path:?}: {reason}")]
    InvalidEntry {
        line: u64,
        path: String,
        reason: String,
    },
    #[error("manifest ends without its trailer: truncated")]
    Truncated,
    #[error("manifest trailer says {claimed:?} but the entries add up to {counted:?}")]
    TotalsMismatch { claimed: Totals, counted: Totals },
    #[error("manifest has data after its trailer")]
    TrailingData,
}

/// Why a path may not appear in a manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("empty")]
    Empty,
    #[error("absolute")]
    Absolute,
    #[error("contains NUL")]
    Nul,
    #[error("contains an empty component")]
    EmptyComponent,
    #[error("contains a '.' or '..' component")]
    DotComponent,
    #[error("longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("has a component longer than {MAX_NAME_BYTES} bytes")]
    NameTooLong,
}

/// Checks that `path` is relative, normalized and cannot leave the directory it is resolved in.
pub fn validate_path(path: &str) -> Result<(), PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong);
    }
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute);
    }
    for component in path.split('/') {
        match component {
            "" => return Err(PathError::EmptyComponent),
            "." | ".." => return Err(PathError::DotComponent),
            name if name.len() > MAX_NAME_BYTES => return Err(PathError::NameTooLong),
            _ => {}
        }
    }
    Ok(())
}

/// Canonical order: lexicographic over path components, each compared by bytes. A directory
/// sorts directly before its contents.
pub fn compare_paths(a: &str, b: &str) -> Ordering {
    a.split('/').cmp(b.split('/'))
}

/// The parent directory of a relative path, `None` at the root.
pub fn parent(path: &str) -> Option<&str> {
    path.rfind('/').map(|index| &path[..index])
}

fn is_hex_hash(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

fn count(totals: &mut Totals, entry: &Entry) {
    totals.entries += 1;
    if let Kind::File { size, .. } = entry.kind {
        totals.files += 1;
        totals.total_bytes = totals.total_bytes.saturating_add(size);
    }
}

/// Writes a manifest line by line, hashing every byte.
pub struct ManifestWriter<W: Write> {
    out: W,
    hasher: blake3::Hasher,
    /// The line being written: serialized whole, then hashed and written at once (serde_json
    /// writes token by token; hashing and writing each token took a fifth of an unchanged
    /// backup's walk).
    line: Vec<u8>,
    previous: Option<String>,
    totals: Totals,
}

impl<W: Write> ManifestWriter<W> {
    /// Starts a manifest with its header.
    pub fn new(out: W, header: &Header) -> io::Result<Self> {
        let mut writer = ManifestWriter {
            out,
            hasher: blake3::Hasher::new(),
            line: Vec::with_capacity(1 << 10),
            previous: None,
            totals: Totals::default(),
        };
        writer.line(header)?;
        Ok(writer)
    }

    /// Appends an entry. Entries must come in canonical order with safe paths.
    pub fn push(&mut self, entry: &Entry) -> io::Result<()> {
        validate_path(&entry.path).map_err(|reason| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{:?}: {reason}", entry.path),
            )
        })?;
        if let Some(previous) = &self.previous
            && compare_paths(previous, &entry.path) != Ordering::Less
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{:?} pushed after {previous:?}", entry.path),
            ));
        }
        self.line(entry)?;
        count(&mut self.totals, entry);
        // Reuses the previous path's allocation.
        self.previous
            .get_or_insert_with(String::new)
            .clone_from(&entry.path);
        Ok(())
    }

    /// Writes the trailer and returns the output and the manifest's hash.
    pub fn finish(mut self) -> io::Result<(W, ManifestSummary)> {
        let totals = self.totals;
        self.line(&Trailer { end: totals })?;
        self.out.flush()?;
        Ok((
            self.out,
            ManifestSummary {
                hash: self.hasher.finalize(),
                totals,
            },
        ))
    }

    fn line(&mut self, value: &impl Serialize) -> io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, value)?;
        self.line.push(b'\n');
        self.hasher.update(&self.line);
        self.out.write_all(&self.line)
    }
}

/// Reads a manifest entry by entry, refusing anything unsafe or inconsistent: unsafe paths,
/// duplicates or disorder, entries without a parent directory, absurd sizes, malformed hashes,
/// a missing trailer or totals that do not add up.
pub struct ManifestReader<R: BufRead> {
    input: R,
    line_number: u64,
    buffer: Vec<u8>,
    previous: Option<String>,
    // Directories on the path to the previous entry; a new entry's parent must be one of them.
    open_directories: Vec<String>,
    totals: Totals,
    finished: bool,
}

impl<R: BufRead> ManifestReader<R> {
    /// Reads the header.
    pub fn new(input: R) -> Result<(Self, Header), ManifestError> {
        let mut reader = ManifestReader {
            input,
            line_number: 0,
            buffer: Vec::new(),
            previous: None,
            open_directories: Vec::new(),
            totals: Totals::default(),
            finished: false,
        };
        if !reader.next_line()? {
            return Err(ManifestError::Truncated);
        }
        let header: Header =
            serde_json::from_slice(&reader.buffer).map_err(|error| ManifestError::Malformed {
                line: 1,
                reason: format!("header: {error}"),
            })?;
        if header.custody_manifest != FORMAT_VERSION {
            return Err(ManifestError::UnsupportedVersion(header.custody_manifest));
        }
        Ok((reader, header))
    }

    /// Counts of the entries read so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    fn next_line(&mut self) -> Result<bool, ManifestError> {
        self.buffer.clear();
        let mut limited = io::Read::take(&mut self.input, MAX_LINE_BYTES as u64 + 1);
        let read = limited.read_until(b'\n', &mut self.buffer)?;
        if read == 0 {
            return Ok(false);
        }
        self.line_number += 1;
        if self.buffer.last() != Some(&b'\n') {
            let reason = if self.buffer.len() > MAX_LINE_BYTES {
                format!("line longer than {MAX_LINE_BYTES} bytes")
            } else {
                "last line is not terminated".to_string()
            };
            return Err(ManifestError::Malformed {
                line: self.line_number,
                reason,
            });
        }
        self.buffer.pop();
        Ok(true)
    }

    fn read_entry(&mut self) -> Result<Option<Entry>, ManifestError> {
        if self.finished {
            return Ok(None);
        }
        if !self.next_line()? {
            return Err(ManifestError::Truncated);
        }
        let line = self.line_number;
        if self.buffer.starts_with(b"{\"end\"") {
            let trailer: Trailer =
                serde_json::from_slice(&self.buffer).map_err(|error| ManifestError::Malformed {
                    line,
                    reason: format!("trailer: {error}"),
                })?;
            if trailer.end != self.totals {
                return Err(ManifestError::TotalsMismatch {
                    claimed: trailer.end,
                    counted: self.totals,
                });
            }
            if self.next_line()? {
                return Err(ManifestError::TrailingData);
            }
            self.finished = true;
            return Ok(None);
        }
        let entry: Entry =
            serde_json::from_slice(&self.buffer).map_err(|error| ManifestError::Malformed {
                line,
                reason: error.to_string(),
            })?;
        self.check(line, &entry)?;
        count(&mut self.totals, &entry);
        self.previous = Some(entry.path.clone());
        Ok(Some(entry))
    }

    fn check(&mut self, line: u64, entry: &Entry) -> Result<(), ManifestError> {
        let path = &entry.path;
        validate_path(path).map_err(|reason| ManifestError::UnsafePath {
            line,
            path: path.clone(),
            reason,
        })?;
        if let Some(previous) = &self.previous
            && compare_paths(previous, path) != Ordering::Less
        {
            return Err(ManifestError::OutOfOrder {
                line,
                path: path.clone(),
                previous: previous.clone(),
            });
        }
        // Keep only the directories that are ancestors of this entry; its parent must be the
        // innermost of them (or the root).
        let parent = parent(path);
        while let Some(open) = self.open_directories.last() {
            if parent
                .is_some_and(|parent| parent == open || parent.starts_with(&format!("{open}/")))
            {
                break;
            }
            self.open_directories.pop();
        }
        if parent != self.open_directories.last().map(String::as_str) {
            return Err(ManifestError::Orphan {
                line,
                path: path.clone(),
            });
        }
        let invalid = |reason: &str| ManifestError::InvalidEntry {
            line,
            path: path.clone(),
            reason: reason.to_string(),
        };
        if entry.mode > 0o7777 {
            return Err(invalid("mode has bits beyond 0o7777"));
        }
        match &entry.kind {
            Kind::File { size, blake3 } => {
                if *size > MAX_FILE_SIZE {
                    return Err(ManifestError::AbsurdSize {
                        line,
                        path: path.clone(),
                        size: *size,
                    });
                }
                if !is_hex_hash(blake3) {
                    return Err(invalid("blake3 is not 64 lowercase hex digits"));
                }
            }
            Kind::Dir => self.open_directories.push(path.clone()),
            Kind::Symlink { target } => {
                if target.is_empty() || target.len() > MAX_PATH_BYTES || target.contains('\0') {
                    return Err(invalid("symlink target is empty, too long or contains NUL"));
                }
            }
        }
        Ok(())
    }
}

impl<R: BufRead> Iterator for ManifestReader<R> {
    type Item = Result<Entry, ManifestError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.read_entry() {
            Ok(Some(entry)) => Some(Ok(entry)),
            Ok(None) => None,
            Err(error) => {
                // One error ends the stream: nothing after a bad line is trusted.
                self.finished = true;
                Some(Err(error))
            }
        }
    }
}

/// BLAKE3 of everything `input` yields.
pub fn hash_reader(mut input: impl io::Read) -> io::Result<blake3::Hash> {
    let mut hasher = blake3::Hasher::new();
    io::copy(&mut input, &mut hasher)?;
    Ok(hasher.finalize())
}

#[cfg(test)]
mod tests;
