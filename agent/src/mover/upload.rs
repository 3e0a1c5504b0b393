//! Streaming a byte stream to S3 as a multipart upload with bounded memory, and back.

use std::io::{self, Read, Write};

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use custody_kube::s3::{Endpoint, Limits, Throttle, sdk_error};
use tokio::sync::mpsc;

/// Size of each uploaded part (S3's minimum is 5 MiB, except the last).
pub const PART_SIZE: usize = 5 << 20;
/// Parts uploaded at once. With the part being filled and the one queued, the upload holds
/// at most four parts (20 MiB) whatever the volume's size.
pub const PARTS_IN_FLIGHT: usize = 2;

/// The least time a server gets to complete a multipart upload.
const COMPLETE_AT_LEAST: std::time::Duration = std::time::Duration::from_secs(600);

/// What the writing side sends to the uploader.
pub enum Chunk {
    Part(Vec<u8>),
    /// Everything was written: complete the upload. Without it the upload is aborted.
    End,
}

/// A `Write` that cuts the stream into parts for [`multipart`], and hashes and counts it.
pub struct PartWriter {
    buffer: Vec<u8>,
    sender: mpsc::Sender<Chunk>,
    hasher: blake3::Hasher,
    written: u64,
}

impl PartWriter {
    pub fn new(sender: mpsc::Sender<Chunk>) -> PartWriter {
        PartWriter {
            buffer: Vec::with_capacity(PART_SIZE),
            sender,
            hasher: blake3::Hasher::new(),
            written: 0,
        }
    }

    fn send(&mut self, chunk: Chunk) -> io::Result<()> {
        self.sender
            .blocking_send(chunk)
            .map_err(|_| io::Error::other("the upload stopped"))
    }

    /// Sends the last part and the end marker; returns the stream's BLAKE3 and size.
    pub fn finish(mut self) -> io::Result<(blake3::Hash, u64)> {
        let last = std::mem::take(&mut self.buffer);
        self.send(Chunk::Part(last))?;
        self.send(Chunk::End)?;
        Ok((self.hasher.finalize(), self.written))
    }
}

impl Write for PartWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = PART_SIZE - self.buffer.len();
        let taken = room.min(data.len());
        self.buffer.extend_from_slice(&data[..taken]);
        self.hasher.update(&data[..taken]);
        self.written += taken as u64;
        if self.buffer.len() == PART_SIZE {
            let full = std::mem::replace(&mut self.buffer, Vec::with_capacity(PART_SIZE));
            self.send(Chunk::Part(full))?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why an upload failed. It was aborted in every case.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("starting the multipart upload of {key}: {message}")]
    Start { key: String, message: String },
    #[error("uploading part {part} of {key}: {message}")]
    Part {
        key: String,
        part: i32,
        message: String,
    },
    #[error("completing the upload of {key}: {message}")]
    Complete { key: String, message: String },
    #[error("the data stream ended before it was complete")]
    Incomplete,
    #[error("stopped by a signal: the multipart upload of {key} was aborted")]
    Interrupted { key: String },
}

/// How long a transfer's calls may take (a stall fails them), and how fast it may go (the
/// repository's bandwidth bound, waited for between calls).
#[derive(Clone, Debug, Default)]
pub struct Speed {
    pub limits: Limits,
    pub throttle: Throttle,
}

impl Speed {
    /// Sending to `endpoint`.
    pub fn up(endpoint: &Endpoint) -> Speed {
        Speed {
            limits: endpoint.limits,
            throttle: endpoint.upload.clone(),
        }
    }

    /// Receiving from `endpoint`.
    pub fn down(endpoint: &Endpoint) -> Speed {
        Speed {
            limits: endpoint.limits,
            throttle: endpoint.download.clone(),
        }
    }
}

/// Uploads what arrives on `chunks` to `bucket`/`key`. Only an explicit [`Chunk::End`]
/// completes the upload; on any error or an early end the upload is aborted, so no partial
/// object ever appears under the key.
pub async fn multipart(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    mut chunks: mpsc::Receiver<Chunk>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    speed: Speed,
) -> Result<(), UploadError> {
    let limits = speed.limits;
    let start = |message: String| UploadError::Start {
        key: key.to_string(),
        message,
    };
    let created = limits
        .bounded(
            0,
            client
                .create_multipart_upload()
                .bucket(bucket)
                .key(key)
                .send(),
        )
        .await
        .map_err(|overdue| start(overdue.to_string()))?
        .map_err(|error| start(sdk_error(&error)))?;
    let upload_id = created.upload_id().unwrap_or_default().to_string();
    // A stop (SIGTERM) ends the upload where it is; the abort below still runs.
    let result = tokio::select! {
        result = upload_parts(client, bucket, key, &upload_id, &mut chunks, &speed) => result,
        _ = stop.wait_for(|stopped| *stopped) => Err(UploadError::Interrupted { key: key.to_string() }),
    };
    if result.is_err() {
        // Dropping the receiver stops the writer; then the parts are discarded.
        drop(chunks);
        abort(client, bucket, key, &upload_id, limits).await;
    }
    result
}

/// Delays between attempts to abort: the server that failed a part may be back shortly, and
/// an upload left open keeps its parts (and their storage) until it is aborted.
const ABORT_RETRIES: [std::time::Duration; 6] = [
    std::time::Duration::from_millis(0),
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(4),
    std::time::Duration::from_secs(8),
];

async fn abort(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    upload_id: &str,
    limits: Limits,
) {
    for delay in ABORT_RETRIES {
        tokio::time::sleep(delay).await;
        let request = client
            .abort_multipart_upload()
            .bucket(bucket)
            .key(key)
            .upload_id(upload_id)
            .send();
        match limits.bounded(0, request).await {
            Ok(Ok(_)) => {
                eprintln!("custody-mover: aborted the multipart upload of {key}");
                return;
            }
            Ok(Err(error)) => eprintln!(
                "custody-mover: aborting the multipart upload of {key}: {}",
                sdk_error(&error)
            ),
            Err(overdue) => {
                eprintln!("custody-mover: aborting the multipart upload of {key}: {overdue}");
            }
        }
    }
}

async fn upload_parts(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    upload_id: &str,
    chunks: &mut mpsc::Receiver<Chunk>,
    speed: &Speed,
) -> Result<(), UploadError> {
    let limits = speed.limits;
    let mut in_flight = tokio::task::JoinSet::new();
    let mut completed = Vec::new();
    let mut number = 0;
    let mut ended = false;
    while let Some(chunk) = chunks.recv().await {
        let data = match chunk {
            Chunk::Part(data) => data,
            Chunk::End => {
                ended = true;
                break;
            }
        };
        number += 1;
        let bytes = data.len() as u64;
        while in_flight.len() >= PARTS_IN_FLIGHT {
            completed.push(joined(in_flight.join_next().await, key)?);
        }
        // The repository's bandwidth bound, before the part's call (never inside its limits).
        speed.throttle.take(bytes).await;
        let request = client
            .upload_part()
            .bucket(bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(data))
            // The artifact's integrity is its own BLAKE3 (recorded) and the manifest's per-file
            // hashes (checked on restore); hashing every part again for SigV4 costs a core.
            .customize()
            .disable_payload_signing();
        let key = key.to_string();
        in_flight.spawn(async move {
            let failed = |message: String| UploadError::Part {
                key: key.clone(),
                part: number,
                message,
            };
            let uploaded = limits
                .bounded(bytes, request.send())
                .await
                .map_err(|overdue| failed(overdue.to_string()))?
                .map_err(|error| failed(sdk_error(&error)))?;
            super::progress::sent(bytes);
            Ok::<_, UploadError>(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(uploaded.e_tag().map(str::to_string))
                    .build(),
            )
        });
    }
    while let Some(joined_part) = in_flight.join_next().await {
        completed.push(joined(Some(joined_part), key)?);
    }
    if !ended {
        return Err(UploadError::Incomplete);
    }
    completed.sort_by_key(|part| part.part_number());
    let complete = |message: String| UploadError::Complete {
        key: key.to_string(),
        message,
    };
    let request = client
        .complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(completed))
                .build(),
        )
        .send();
    // S3 may take minutes to assemble a large upload, sending blanks meanwhile.
    let bound = limits.stall.max(COMPLETE_AT_LEAST);
    tokio::time::timeout(bound, request)
        .await
        .map_err(|_| {
            complete(format!(
                "the S3 server did not complete the upload within {}s",
                bound.as_secs()
            ))
        })?
        .map_err(|error| complete(sdk_error(&error)))?;
    Ok(())
}

fn joined(
    result: Option<Result<Result<CompletedPart, UploadError>, tokio::task::JoinError>>,
    key: &str,
) -> Result<CompletedPart, UploadError> {
    match result {
        Some(Ok(part)) => part,
        Some(Err(error)) => Err(UploadError::Part {
            key: key.to_string(),
            part: 0,
            message: error.to_string(),
        }),
        None => Err(UploadError::Incomplete),
    }
}

/// A `Read` over chunks a download task sends (the body of a GetObject).
pub struct ChunkReader {
    receiver: mpsc::Receiver<io::Result<bytes::Bytes>>,
    current: bytes::Bytes,
}

impl ChunkReader {
    pub fn new(receiver: mpsc::Receiver<io::Result<bytes::Bytes>>) -> ChunkReader {
        ChunkReader {
            receiver,
            current: bytes::Bytes::new(),
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.receiver.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(error)) => return Err(error),
                None => return Ok(0),
            }
        }
        let taken = buffer.len().min(self.current.len());
        buffer[..taken].copy_from_slice(&self.current[..taken]);
        bytes::Buf::advance(&mut self.current, taken);
        Ok(taken)
    }
}

/// Resumes after a failure that made no progress at most this many times, waiting these
/// delays between them; any byte received starts the count again.
pub const RESUME_DELAYS: [std::time::Duration; 5] = [
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(4),
    std::time::Duration::from_secs(8),
];

/// Why a stretch of a download ended early.
struct Stopped {
    /// A reset, a stall or a server error: worth resuming.
    transient: bool,
    /// The object is not there (404): nothing will bring it back.
    missing: bool,
    message: String,
}

/// Why a download gave up.
#[derive(Debug)]
pub struct DownloadStopped {
    /// The object is not there (404 NoSuchKey): someone deleted it, and trying again cannot
    /// help.
    pub missing: bool,
    pub message: String,
}

/// Whether a failed request is worth trying again: no answer at all, or a 5xx or 429 answer.
/// A 4xx (the object is gone, or changed: 412 on `If-Match`) is final.
fn transient<E>(
    error: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> bool {
    match error.raw_response() {
        Some(response) => {
            let status = response.status().as_u16();
            status >= 500 || status == 429
        }
        None => !matches!(error, aws_sdk_s3::error::SdkError::ConstructionFailure(_)),
    }
}

/// Streams the body of `bucket`/`key` into `sender`, chunk by chunk. A connection reset, a
/// timeout or a 5xx in the middle resumes with a ranged GET from the first byte not yet
/// received, on the condition (`If-Match`) that the object is still the one begun with.
///
/// A stretch must move its bytes within `limits` (a trickle is not resumed: it fails).
///
/// Returns why it gave up, if it did (the reader also gets it as an error).
pub async fn download(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    sender: mpsc::Sender<io::Result<bytes::Bytes>>,
    speed: Speed,
) -> Result<(), DownloadStopped> {
    let mut offset: u64 = 0;
    let mut etag: Option<String> = None;
    let mut failures = 0usize;
    loop {
        let before = offset;
        let stopped =
            match stretch(client, bucket, key, &sender, &mut offset, &mut etag, &speed).await {
                Ok(()) => return Ok(()),
                Err(stopped) => stopped,
            };
        if offset > before {
            failures = 0;
        }
        match RESUME_DELAYS.get(failures) {
            Some(delay) if stopped.transient => {
                eprintln!(
                    "custody-mover: downloading {key} stopped at byte {offset} ({}); resuming in {delay:?}",
                    stopped.message
                );
                tokio::time::sleep(*delay).await;
                failures += 1;
            }
            _ => {
                let message = format!("stopped at byte {offset}: {}", stopped.message);
                let _ = sender.try_send(Err(io::Error::other(format!(
                    "downloading {key} ({message})"
                ))));
                return Err(DownloadStopped {
                    missing: stopped.missing,
                    message,
                });
            }
        }
    }
}

/// One GET of `key` from `offset` on, sent on as it arrives. `Ok` at the end of the object or
/// when the reader is gone.
async fn stretch(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    sender: &mpsc::Sender<io::Result<bytes::Bytes>>,
    offset: &mut u64,
    etag: &mut Option<String>,
    speed: &Speed,
) -> Result<(), Stopped> {
    let limits = speed.limits;
    let mut request = client.get_object().bucket(bucket).key(key);
    if *offset > 0 {
        request = request
            .range(format!("bytes={offset}-"))
            .set_if_match(etag.clone());
    }
    let object = limits
        .bounded(0, request.send())
        .await
        .map_err(|overdue| Stopped {
            transient: true,
            missing: false,
            message: overdue.to_string(),
        })?
        .map_err(|error| Stopped {
            transient: transient(&error),
            // Not a missing bucket (`NoSuchBucket`: a wrong setting, or an outage of it).
            missing: aws_sdk_s3::error::ProvideErrorMetadata::code(&error) == Some("NoSuchKey"),
            message: sdk_error(&error),
        })?;
    if *offset > 0 {
        let range = object.content_range().unwrap_or_default();
        if !range.starts_with(&format!("bytes {offset}-")) {
            return Err(Stopped {
                transient: false,
                missing: false,
                message: format!(
                    "asked for the bytes from {offset} on, the server answered the range {range:?}"
                ),
            });
        }
    } else {
        *etag = object.e_tag().map(str::to_string);
    }
    let length = u64::try_from(object.content_length().unwrap_or_default()).unwrap_or(0);
    let mut body = object.body;
    // The server's share of the time only: waiting for the reader (the extractor writing the
    // volume) moves the deadline on.
    let mut budget = limits.bound(length);
    loop {
        let asked = tokio::time::Instant::now();
        let next = match tokio::time::timeout(budget, body.try_next()).await {
            Ok(next) => next,
            // Too slow for its bound: a resume would be as slow.
            Err(_) => {
                return Err(Stopped {
                    transient: false,
                    missing: false,
                    message: limits.overdue(length).to_string(),
                });
            }
        };
        budget = budget.saturating_sub(asked.elapsed());
        match next {
            Ok(Some(chunk)) => {
                *offset += chunk.len() as u64;
                // The repository's bandwidth bound: waiting here is the reader's time, not
                // the server's.
                speed.throttle.take(chunk.len() as u64).await;
                if sender.send(Ok(chunk)).await.is_err() {
                    return Ok(());
                }
            }
            Ok(None) => return Ok(()),
            Err(error) => {
                return Err(Stopped {
                    transient: true,
                    missing: false,
                    message: error.to_string(),
                });
            }
        }
    }
}
