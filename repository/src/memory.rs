//! A repository's files in memory: for tests that run thousands of repositories (the prune
//! properties), where an S3 server would make each one take seconds. Everything else tests
//! against MinIO through [`crate::backend::S3Backend`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rustic_core::{
    BytesList, ErrorKind, FileType, Id, ReadBackend, RusticError, RusticResult, WriteBackend,
};

/// Files by directory (their type) and ID.
type Files = BTreeMap<(&'static str, Id), Bytes>;

/// Where a file is kept: the config is one file whatever ID it is given (as in a bucket,
/// where it is the object `config`).
fn at(file_type: FileType, id: &Id) -> (&'static str, Id) {
    match file_type {
        FileType::Config => (file_type.dirname(), Id::default()),
        _ => (file_type.dirname(), *id),
    }
}

/// A repository's files, shared by clones.
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    files: Arc<Mutex<Files>>,
    /// How long storing a pack takes (a slow bucket, for tests of what waits for uploads).
    pack_delay: std::time::Duration,
    /// Storing a pack fails (after `pack_delay`).
    packs_fail: bool,
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    /// A backend that takes `delay` to store each pack.
    pub fn with_pack_delay(delay: std::time::Duration) -> MemoryBackend {
        MemoryBackend {
            pack_delay: delay,
            ..MemoryBackend::default()
        }
    }

    /// A backend that refuses every pack, after taking `delay`.
    pub fn refusing_packs_after(delay: std::time::Duration) -> MemoryBackend {
        MemoryBackend {
            pack_delay: delay,
            packs_fail: true,
            ..MemoryBackend::default()
        }
    }

    /// An independent copy of every file.
    pub fn copy(&self) -> MemoryBackend {
        MemoryBackend {
            files: Arc::new(Mutex::new(self.files().clone())),
            pack_delay: self.pack_delay,
            packs_fail: self.packs_fail,
        }
    }

    /// The IDs of the files of one type.
    pub fn ids(&self, file_type: FileType) -> Vec<Id> {
        self.files()
            .keys()
            .filter(|(kind, _)| *kind == file_type.dirname())
            .map(|(_, id)| *id)
            .collect()
    }

    fn files(&self) -> std::sync::MutexGuard<'_, Files> {
        self.files.lock().expect("memory backend")
    }

    fn file(&self, file_type: FileType, id: &Id) -> RusticResult<Bytes> {
        self.files()
            .get(&at(file_type, id))
            .cloned()
            .ok_or_else(|| {
                RusticError::new(ErrorKind::Backend, "memory: no file `{id}`")
                    .attach_context("id", id.to_string())
            })
    }
}

impl ReadBackend for MemoryBackend {
    fn location(&self) -> String {
        "memory".into()
    }

    fn list_with_size(&self, file_type: FileType) -> RusticResult<Vec<(Id, u32)>> {
        Ok(self
            .files()
            .iter()
            .filter(|((kind, _), _)| *kind == file_type.dirname())
            .map(|((_, id), bytes)| (*id, u32::try_from(bytes.len()).unwrap_or(u32::MAX)))
            .collect())
    }

    fn read_full(&self, file_type: FileType, id: &Id) -> RusticResult<Bytes> {
        self.file(file_type, id)
    }

    fn read_partial(
        &self,
        file_type: FileType,
        id: &Id,
        _cacheable: bool,
        offset: u32,
        length: u32,
    ) -> RusticResult<Bytes> {
        let bytes = self.file(file_type, id)?;
        let (start, end) = (offset as usize, offset as usize + length as usize);
        if end > bytes.len() {
            return Err(RusticError::new(
                ErrorKind::Backend,
                "memory: `{id}` is shorter than the range read",
            )
            .attach_context("id", id.to_string()));
        }
        Ok(bytes.slice(start..end))
    }

    fn warmup_path(&self, file_type: FileType, id: &Id) -> String {
        format!("{file_type:?}/{id}")
    }
}

impl WriteBackend for MemoryBackend {
    fn create(&self) -> RusticResult<()> {
        Ok(())
    }

    fn write_bytes(
        &self,
        file_type: FileType,
        id: &Id,
        _cacheable: bool,
        content: BytesList,
    ) -> RusticResult<()> {
        if file_type == FileType::Pack {
            std::thread::sleep(self.pack_delay);
            if self.packs_fail {
                return Err(RusticError::new(
                    ErrorKind::Backend,
                    "memory: packs are refused",
                ));
            }
        }
        let mut joined = Vec::new();
        for part in content.into_vec() {
            joined.extend_from_slice(&part);
        }
        self.files().insert(at(file_type, id), Bytes::from(joined));
        Ok(())
    }

    fn remove(&self, file_type: FileType, id: &Id, _cacheable: bool) -> RusticResult<()> {
        self.files().remove(&at(file_type, id));
        Ok(())
    }
}
