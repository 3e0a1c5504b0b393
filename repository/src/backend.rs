//! restic's repository layout in an S3 bucket, on custody's own S3 client: rustic_core reads
//! and writes the format, this module only moves its files.
//!
//! The layout is restic's (so that `restic -r s3:…/bucket/prefix` opens it): `config`,
//! `keys/<id>`, `snapshots/<id>`, `index/<id>` and `data/<first two hex digits>/<id>` under
//! the repository's prefix.
//!
//! rustic_core calls a backend from its own threads and expects blocking calls; every call
//! here runs on the given Tokio runtime and blocks the calling thread until it ends. Never
//! call into a repository from a Tokio worker thread (use `spawn_blocking`).

use std::sync::{Arc, Mutex};

use aws_sdk_s3::primitives::ByteStream;
use bytes::{Bytes, BytesMut};
use rustic_core::{
    BytesList, ErrorKind, FileType, Id, ReadBackend, RusticError, RusticResult, WriteBackend,
};
use tokio::runtime::Handle;

/// The directory of a BackupRepository's prefix that holds its encrypted repository (format
/// 2). A Kubernetes namespace (the first segment of a format 1 artifact's key) cannot have
/// this name, so the two never share a key.
pub const REPOSITORY_DIRECTORY: &str = "custody_repository";

/// The prefix of the encrypted repository under a BackupRepository's `prefix`.
pub fn repository_prefix(base: &str) -> String {
    let base = base.trim_matches('/');
    if base.is_empty() {
        REPOSITORY_DIRECTORY.to_string()
    } else {
        format!("{base}/{REPOSITORY_DIRECTORY}")
    }
}

/// Where a repository is: a bucket and the prefix of its root inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub bucket: String,
    /// Without a trailing slash; empty for the bucket's root.
    pub prefix: String,
}

impl Location {
    /// The object key of a repository file.
    pub fn key(&self, file_type: FileType, id: &Id) -> String {
        let hex = id.to_hex();
        let relative = match file_type {
            FileType::Config => "config".to_string(),
            FileType::Pack => format!("data/{}/{}", &hex[..2], &hex[..]),
            other => format!("{}/{}", other.dirname(), &hex[..]),
        };
        self.join(&relative)
    }

    /// The prefix under which every file of `file_type` is listed.
    pub fn directory(&self, file_type: FileType) -> String {
        self.join(&format!("{}/", file_type.dirname()))
    }

    fn join(&self, relative: &str) -> String {
        if self.prefix.is_empty() {
            relative.to_string()
        } else {
            format!("{}/{relative}", self.prefix)
        }
    }
}

/// A restic repository in an S3 bucket.
#[derive(Clone, Debug)]
pub struct S3Backend {
    client: aws_sdk_s3::Client,
    location: Location,
    runtime: Handle,
    /// How long each call may take.
    limits: custody_proto::s3_limits::Limits,
    /// How fast this mover may send and receive (the repository's `spec.bandwidth`), waited
    /// for before a call (sending) or before the next (receiving), outside its limits.
    upload: custody_proto::s3_limits::Throttle,
    download: custody_proto::s3_limits::Throttle,
    /// Snapshot files written through this backend (and its clones), in order: rustic_core
    /// does not say under which ID it saved one.
    snapshots_written: Arc<Mutex<Vec<Id>>>,
    /// The index files the last listing of them found (through this backend or its clones).
    index_listed: Arc<Mutex<Option<Vec<Id>>>>,
    /// S3 calls that failed (the server, the network), so that a caller can tell a damaged
    /// repository from an unreachable one whatever rustic_core makes of the error.
    failures: Arc<std::sync::atomic::AtomicU64>,
    /// Bytes written through this backend (and its clones) so far: how far an upload came.
    written: Arc<std::sync::atomic::AtomicU64>,
}

impl S3Backend {
    pub fn new(client: aws_sdk_s3::Client, location: Location, runtime: Handle) -> Self {
        Self {
            client,
            location,
            runtime,
            limits: custody_proto::s3_limits::Limits::default(),
            upload: custody_proto::s3_limits::Throttle::default(),
            download: custody_proto::s3_limits::Throttle::default(),
            snapshots_written: Arc::default(),
            index_listed: Arc::default(),
            failures: Arc::default(),
            written: Arc::default(),
        }
    }

    /// The same backend, adding the bytes of every successful write to `written` (a mover's
    /// progress counts its uploads there).
    pub fn counting_writes(mut self, written: Arc<std::sync::atomic::AtomicU64>) -> Self {
        self.written = written;
        self
    }

    /// The same backend, its calls bounded by `limits` (the repository's `spec.timeouts`).
    pub fn with_limits(mut self, limits: custody_proto::s3_limits::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The same backend, sending and receiving at most as fast as these bounds allow.
    pub fn with_throttles(
        mut self,
        upload: custody_proto::s3_limits::Throttle,
        download: custody_proto::s3_limits::Throttle,
    ) -> Self {
        self.upload = upload;
        self.download = download;
        self
    }

    /// `call`, moving `bytes`, within the limits; a call past them fails naming them.
    async fn bounded<T, E>(
        &self,
        what: &'static str,
        key: &str,
        bytes: u64,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> RusticResult<T>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        match self.limits.bounded(bytes, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.failed(what, key, error)),
            Err(overdue) => Err(self.failed(what, key, overdue)),
        }
    }

    /// How many S3 calls through this backend (and its clones) failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The last snapshot file written through this backend.
    pub fn last_snapshot_written(&self) -> Option<Id> {
        self.snapshots_written
            .lock()
            .expect("snapshot record")
            .last()
            .copied()
    }

    /// The index files the last listing of them found, taken (none since the last take).
    /// rustic_core's `to_indexed` lists the index files once and reads every one it found
    /// (failing if one cannot be read): taken just before and just after it, this is exactly
    /// the files its index holds.
    pub fn take_index_listing(&self) -> Option<Vec<Id>> {
        self.index_listed.lock().expect("index listing").take()
    }

    pub fn location_of(&self) -> &Location {
        &self.location
    }

    /// As rustic_core takes its backends.
    pub fn shared(self) -> Arc<dyn WriteBackend> {
        Arc::new(self)
    }

    fn failed<E>(&self, what: &'static str, key: &str, error: E) -> Box<RusticError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        self.failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RusticError::with_source(
            ErrorKind::Backend,
            "S3: {what} `{key}` failed in bucket `{bucket}`",
            error,
        )
        .attach_context("what", what)
        .attach_context("key", key.to_string())
        .attach_context("bucket", self.location.bucket.clone())
    }

    fn get(&self, key: &str) -> RusticResult<Bytes> {
        self.runtime.block_on(async {
            let request = self
                .client
                .get_object()
                .bucket(&self.location.bucket)
                .key(key)
                .send();
            let object = self
                .bounded("reading", key, 0, async {
                    request.await.map_err(|error| S3Error::of(&error))
                })
                .await?;
            let length = u64::try_from(object.content_length().unwrap_or_default()).unwrap_or(0);
            // Counted once its length is known, before the body is read (reads at once do
            // not all go at the link's speed first).
            self.download.take(length).await;
            let body = self
                .bounded("reading", key, length, object.body.collect())
                .await?;
            Ok(body.into_bytes())
        })
    }

    /// Reads `length` bytes of a file from `offset`, appended to `buffer` as they arrive (a
    /// caller that reuses its buffers saves allocating and faulting in one per read). More
    /// or fewer bytes than asked for is an error.
    pub fn read_range_into(
        &self,
        file_type: FileType,
        id: &Id,
        offset: u32,
        length: u32,
        buffer: &mut BytesMut,
    ) -> RusticResult<()> {
        if length == 0 {
            return Ok(());
        }
        let key = self.location.key(file_type, id);
        let end = u64::from(offset) + u64::from(length) - 1;
        let start = buffer.len();
        buffer.reserve(length as usize);
        self.runtime.block_on(self.download.take(u64::from(length)));
        let more = self
            .runtime
            .block_on(self.bounded("reading", &key, u64::from(length), async {
                let mut object = self
                    .client
                    .get_object()
                    .bucket(&self.location.bucket)
                    .key(&key)
                    .range(format!("bytes={offset}-{end}"))
                    .send()
                    .await
                    .map_err(|error| ReadFailure::S3(S3Error::of(&error)))?;
                while let Some(piece) = object.body.try_next().await.map_err(ReadFailure::Body)? {
                    if buffer.len() - start + piece.len() > length as usize {
                        return Ok(true);
                    }
                    buffer.extend_from_slice(&piece);
                }
                Ok::<_, ReadFailure>(false)
            }));
        let more = more.inspect_err(|_| buffer.truncate(start))?;
        let found = buffer.len() - start;
        if more || found != length as usize {
            buffer.truncate(start);
            return Err(RusticError::new(
                ErrorKind::Backend,
                "S3: `{key}` answered {found} bytes for a range of {length}",
            )
            .attach_context("key", key)
            .attach_context(
                "found",
                if more {
                    format!("more than {length}")
                } else {
                    found.to_string()
                },
            )
            .attach_context("length", length.to_string()));
        }
        Ok(())
    }
}

/// Why a ranged read failed: the call, or its body.
#[derive(Debug, thiserror::Error)]
enum ReadFailure {
    #[error(transparent)]
    S3(S3Error),
    #[error(transparent)]
    Body(aws_sdk_s3::primitives::ByteStreamError),
}

/// An S3 error as one line: the server's status and code, or the cause of a failed call.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct S3Error(String);

impl S3Error {
    fn of<E>(error: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Self
    where
        E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        use aws_sdk_s3::error::ProvideErrorMetadata;
        Self(match error.raw_response() {
            Some(response) => {
                let mut message =
                    format!("the server answered HTTP {}", response.status().as_u16());
                if let Some(code) = error.code() {
                    message.push_str(&format!(" {code}"));
                }
                if let Some(text) = error.message().filter(|text| !text.is_empty()) {
                    message.push_str(&format!(": {text}"));
                }
                message
            }
            None => {
                let mut message = error.to_string();
                let mut source = std::error::Error::source(error);
                while let Some(cause) = source {
                    message.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                message
            }
        })
    }
}

impl ReadBackend for S3Backend {
    fn location(&self) -> String {
        format!("s3:{}/{}", self.location.bucket, self.location.prefix)
    }

    fn list_with_size(&self, file_type: FileType) -> RusticResult<Vec<(Id, u32)>> {
        if file_type == FileType::Config {
            let key = self.location.key(FileType::Config, &Id::default());
            return self.runtime.block_on(async {
                let head = self
                    .client
                    .head_object()
                    .bucket(&self.location.bucket)
                    .key(&key)
                    .send();
                let head = self
                    .limits
                    .bounded(0, head)
                    .await
                    .map_err(|overdue| self.failed("reading", &key, overdue))?;
                match head {
                    Ok(head) => Ok(vec![(
                        Id::default(),
                        u32::try_from(head.content_length().unwrap_or_default())
                            .unwrap_or_default(),
                    )]),
                    Err(error)
                        if error
                            .raw_response()
                            .is_some_and(|response| response.status().as_u16() == 404) =>
                    {
                        Ok(Vec::new())
                    }
                    Err(error) => Err(self.failed("reading", &key, S3Error::of(&error))),
                }
            });
        }
        let directory = self.location.directory(file_type);
        self.runtime.block_on(async {
            let mut found = Vec::new();
            let mut pages = self
                .client
                .list_objects_v2()
                .bucket(&self.location.bucket)
                .prefix(&directory)
                .into_paginator()
                .send();
            while let Some(page) = self
                .limits
                .bounded(0, pages.next())
                .await
                .map_err(|overdue| self.failed("listing", &directory, overdue))?
            {
                let page =
                    page.map_err(|error| self.failed("listing", &directory, S3Error::of(&error)))?;
                for object in page.contents() {
                    let Some(key) = object.key() else { continue };
                    let name = key.rsplit('/').next().unwrap_or_default();
                    // Anything else under the directory (a restic lock, a stray upload) is not
                    // a repository file of this type.
                    let Ok(id) = name.parse::<Id>() else { continue };
                    let size = u32::try_from(object.size().unwrap_or_default()).map_err(|_| {
                        RusticError::new(
                            ErrorKind::Backend,
                            "S3: `{key}` is larger than a repository file can be",
                        )
                        .attach_context("key", key.to_string())
                    })?;
                    found.push((id, size));
                }
            }
            if file_type == FileType::Index {
                *self.index_listed.lock().expect("index listing") =
                    Some(found.iter().map(|(id, _)| *id).collect());
            }
            Ok(found)
        })
    }

    fn read_full(&self, file_type: FileType, id: &Id) -> RusticResult<Bytes> {
        self.get(&self.location.key(file_type, id))
    }

    fn read_partial(
        &self,
        file_type: FileType,
        id: &Id,
        _cacheable: bool,
        offset: u32,
        length: u32,
    ) -> RusticResult<Bytes> {
        let mut buffer = BytesMut::new();
        self.read_range_into(file_type, id, offset, length, &mut buffer)?;
        Ok(buffer.freeze())
    }

    fn warmup_path(&self, file_type: FileType, id: &Id) -> String {
        self.location.key(file_type, id)
    }
}

impl WriteBackend for S3Backend {
    fn write_bytes(
        &self,
        file_type: FileType,
        id: &Id,
        _cacheable: bool,
        content: BytesList,
    ) -> RusticResult<()> {
        let key = self.location.key(file_type, id);
        let parts = content.into_vec();
        let body = if parts.len() == 1 {
            parts.into_iter().next().unwrap_or_default()
        } else {
            let mut joined = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for part in parts {
                joined.extend_from_slice(&part);
            }
            joined.freeze()
        };
        let bytes = body.len() as u64;
        self.runtime.block_on(async {
            self.upload.take(bytes).await;
            let request = self
                .client
                .put_object()
                .bucket(&self.location.bucket)
                .key(&key)
                .body(ByteStream::from(body))
                // Packs and files are sealed (AES-256-CTR + Poly1305) and named by their
                // SHA-256: signing their payload again would cost a core for nothing.
                .customize()
                .disable_payload_signing()
                .send();
            self.bounded("writing", &key, bytes, async {
                request.await.map_err(|error| S3Error::of(&error))
            })
            .await?;
            self.written
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, Box<RusticError>>(())
        })?;
        if file_type == FileType::Snapshot {
            self.snapshots_written
                .lock()
                .expect("snapshot record")
                .push(*id);
        }
        Ok(())
    }

    fn remove(&self, file_type: FileType, id: &Id, _cacheable: bool) -> RusticResult<()> {
        let key = self.location.key(file_type, id);
        self.runtime.block_on(async {
            let request = self
                .client
                .delete_object()
                .bucket(&self.location.bucket)
                .key(&key)
                .send();
            self.bounded("deleting", &key, 0, async {
                request.await.map_err(|error| S3Error::of(&error))
            })
            .await?;
            Ok(())
        })
    }
}
