//! The mover's progress: counted where content is stored (a backup) or written (a restore),
//! written every few seconds to the file the node agent reads
//! ([`custody_proto::progress`]), and logged as a line when it changed.
//!
//! One mover process runs one backup or one restore, so the counters are the process's own.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use custody_proto::progress::{self, Progress};

/// Totals not yet known.
const UNKNOWN: u64 = u64::MAX;

/// One run's counts.
pub struct Counters {
    bytes_done: AtomicU64,
    files_done: AtomicU64,
    bytes_total: AtomicU64,
    files_total: AtomicU64,
    /// Bytes uploaded (after deduplication, compression and encryption): a backup's reading
    /// runs ahead of its uploads by what the writer buffers, and an upload that still moves
    /// is progress. Shared with the repository's backend.
    sent: OnceLock<Arc<AtomicU64>>,
    volume: Mutex<String>,
}

impl Counters {
    pub const fn new() -> Counters {
        Counters {
            bytes_done: AtomicU64::new(0),
            files_done: AtomicU64::new(0),
            bytes_total: AtomicU64::new(UNKNOWN),
            files_total: AtomicU64::new(UNKNOWN),
            sent: OnceLock::new(),
            volume: Mutex::new(String::new()),
        }
    }

    fn sent(&self) -> &Arc<AtomicU64> {
        self.sent.get_or_init(Arc::default)
    }

    fn add_bytes(&self, bytes: u64) {
        self.bytes_done.fetch_add(bytes, Ordering::Relaxed);
    }

    fn add_file(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
    }

    fn set_totals(&self, files: u64, bytes: u64) {
        self.files_total.store(files, Ordering::Relaxed);
        self.bytes_total.store(bytes, Ordering::Relaxed);
    }

    fn set_volume(&self, name: &str) {
        *self
            .volume
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = name.to_string();
    }

    /// Where the run stands now.
    pub fn now(&self, operation: &str) -> Progress {
        Progress {
            operation: operation.to_string(),
            volume: self
                .volume
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            files_done: self.files_done.load(Ordering::Relaxed),
            bytes_total: known(self.bytes_total.load(Ordering::Relaxed)),
            files_total: known(self.files_total.load(Ordering::Relaxed)),
            bytes_sent: self.sent().load(Ordering::Relaxed),
        }
    }
}

impl Default for Counters {
    fn default() -> Self {
        Counters::new()
    }
}

/// The mover process's counts (one process runs one backup or one restore).
static COUNTERS: Counters = Counters::new();

/// The counter of bytes uploaded, for the repository's backend to add to.
pub fn sent_counter() -> Arc<AtomicU64> {
    COUNTERS.sent().clone()
}

/// `bytes` more are uploaded.
pub fn sent(bytes: u64) {
    COUNTERS.sent().fetch_add(bytes, Ordering::Relaxed);
}

/// `bytes` more of a file's content are stored or written.
pub fn bytes(bytes: u64) {
    COUNTERS.add_bytes(bytes);
}

/// One more file is done.
pub fn file() {
    COUNTERS.add_file();
}

/// A whole file done at once (unchanged since the parent snapshot: it is not read again).
pub fn whole_file(size: u64) {
    bytes(size);
    file();
}

/// The totals, once known.
pub fn totals(files: u64, bytes: u64) {
    COUNTERS.set_totals(files, bytes);
}

/// The volume being read or written now.
pub fn volume(name: &str) {
    COUNTERS.set_volume(name);
}

fn known(value: u64) -> Option<u64> {
    (value != UNKNOWN).then_some(value)
}

/// Writes the progress file and the log lines until dropped (then once more, the last word).
pub struct Reporter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    /// Starts reporting `operation` every `every`, to `file` when given (the variable
    /// [`progress::ENV_FILE`] names it in a mover Job).
    pub fn start(
        counters: &'static Counters,
        operation: &'static str,
        file: Option<PathBuf>,
        every: Duration,
    ) -> Reporter {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn({
                let stop = stop.clone();
                move || report(counters, operation, file.as_deref(), every, &stop)
            })
            .ok();
        Reporter { stop, thread }
    }

    /// As [`Reporter::start`], to the file the environment names, every
    /// [`progress::WRITE_EVERY_SECONDS`].
    pub fn from_env(operation: &'static str) -> Reporter {
        let file = std::env::var_os(progress::ENV_FILE)
            .filter(|value| !value.is_empty())
            .map(PathBuf::from);
        Reporter::start(
            &COUNTERS,
            operation,
            file,
            Duration::from_secs(progress::WRITE_EVERY_SECONDS),
        )
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

fn report(
    counters: &Counters,
    operation: &str,
    file: Option<&Path>,
    every: Duration,
    stop: &AtomicBool,
) {
    let mut last_logged: Option<Progress> = None;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        let current = counters.now(operation);
        if let Some(file) = file
            && let Err(error) = write(file, &current)
        {
            eprintln!(
                "custody-mover: writing progress to {}: {error}",
                file.display()
            );
        }
        if last_logged.as_ref() != Some(&current) {
            // Not `custody-mover: `: that prefix says why a mover failed (`reason: message`).
            eprintln!(
                "custody-mover progress: {operation}{}: {}",
                if current.volume.is_empty() {
                    String::new()
                } else {
                    format!(" (volume {})", current.volume)
                },
                current.summary()
            );
            last_logged = Some(current);
        }
        if stopping {
            return;
        }
        std::thread::park_timeout(every);
    }
}

/// Replaces the file at once (a reader never sees half of it).
fn write(file: &Path, progress: &Progress) -> std::io::Result<()> {
    let partial = file.with_extension("partial");
    let mut out = std::fs::File::create(&partial)?;
    out.write_all(&serde_json::to_vec(progress).map_err(std::io::Error::other)?)?;
    drop(out);
    std::fs::rename(&partial, file)
}

/// The volumes to count once reading starts ([`count_when_reading`]).
static TO_COUNT: Mutex<Option<Vec<PathBuf>>> = Mutex::new(None);

/// Counts `roots` ([`count_in_background`]) once the reading starts ([`reading_starts`]), not
/// before: opening the repository and loading its index come first, undisturbed.
pub fn count_when_reading(roots: Vec<PathBuf>) {
    *TO_COUNT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(roots);
}

/// The volumes are about to be read: the count asked for starts beside the reading.
pub fn reading_starts() {
    let roots = TO_COUNT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take();
    if let Some(roots) = roots {
        count_in_background(roots);
    }
}

/// The volumes' listings (the backup's stat stages) give the totals instead of a count of
/// their own: a backup with a parent snapshot, where the count would double the `stat` work of
/// a backup that reads little (about a sixth of an unchanged backup's CPU). Until every one of
/// `volumes` is listed, the totals are `estimate` (the parent's), when given. Does nothing
/// unless a count was asked for ([`count_when_reading`]).
pub fn totals_from_listing(volumes: usize, estimate: Option<(u64, u64)>) {
    let asked = TO_COUNT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take()
        .is_some();
    if !asked {
        return;
    }
    if let Some((files, bytes)) = estimate {
        totals(files, bytes);
    }
    *LISTING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Listing {
        volumes_left: volumes,
        files: 0,
        bytes: 0,
    });
}

/// A volume's listing ended: its regular files and their bytes. The totals are set once every
/// volume is listed ([`totals_from_listing`]).
pub fn listed(files: u64, bytes: u64) {
    listed_into(&COUNTERS, &LISTING, files, bytes);
}

fn listed_into(counters: &Counters, listing: &Mutex<Option<Listing>>, files: u64, bytes: u64) {
    let mut listing = listing
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(current) = listing.as_mut() else {
        return;
    };
    current.files += files;
    current.bytes += bytes;
    current.volumes_left = current.volumes_left.saturating_sub(1);
    if current.volumes_left == 0 {
        counters.set_totals(current.files, current.bytes);
        *listing = None;
    }
}

/// The listings that give the totals ([`totals_from_listing`]).
struct Listing {
    volumes_left: usize,
    files: u64,
    bytes: u64,
}

static LISTING: Mutex<Option<Listing>> = Mutex::new(None);

/// Counts the regular files of `roots` and their bytes (on their own filesystems, symbolic
/// links not followed) on a thread of its own, and sets the totals once done: a backup's
/// totals, known some time after its reading began.
pub fn count_in_background(roots: Vec<PathBuf>) {
    count_into(&COUNTERS, roots);
}

fn count_into(counters: &'static Counters, roots: Vec<PathBuf>) {
    let _ = std::thread::Builder::new()
        .name("count".into())
        .spawn(move || {
            let mut files = 0u64;
            let mut bytes = 0u64;
            for root in &roots {
                let Ok(metadata) = std::fs::symlink_metadata(root) else {
                    continue;
                };
                count(root, metadata.dev(), &mut files, &mut bytes);
            }
            counters.set_totals(files, bytes);
        });
}

fn count(directory: &Path, device: u64, files: &mut u64, bytes: &mut u64) {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        if metadata.dev() != device {
            continue;
        }
        if metadata.is_dir() {
            count(&entry.path(), device, files, bytes);
        } else if metadata.is_file() {
            *files += 1;
            *bytes += metadata.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_reach_the_file_and_the_totals_are_counted() {
        // Counters of the test's own: the crate's other tests run movers in this process.
        let counters: &'static Counters = Box::leak(Box::new(Counters::new()));
        let directory = tempfile::tempdir().unwrap();
        let source = directory.path().join("source");
        std::fs::create_dir_all(source.join("a/b")).unwrap();
        std::fs::write(source.join("one"), vec![0u8; 1000]).unwrap();
        std::fs::write(source.join("a/b/two"), vec![0u8; 24]).unwrap();
        std::os::unix::fs::symlink("/etc", source.join("link")).unwrap();
        count_into(counters, vec![source.clone()]);
        let file = directory.path().join(progress::FILE_NAME);
        let reporter = Reporter::start(
            counters,
            "backup",
            Some(file.clone()),
            Duration::from_millis(20),
        );
        counters.set_volume("data");
        counters.add_bytes(1000);
        counters.add_file();
        counters.add_bytes(20);
        counters.sent().fetch_add(300, Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let read = loop {
            let read = std::fs::read(&file)
                .ok()
                .and_then(|content| Progress::parse(&content));
            if let Some(read) = &read
                && read.bytes_total.is_some()
                && read.bytes_done == 1020
                && read.bytes_sent == 300
            {
                break read.clone();
            }
            assert!(std::time::Instant::now() < deadline, "{read:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            read,
            Progress {
                operation: "backup".into(),
                volume: "data".into(),
                bytes_done: 1020,
                files_done: 1,
                bytes_total: Some(1024),
                files_total: Some(2),
                bytes_sent: 300,
            }
        );
        // The last word is written when the reporter stops.
        counters.add_bytes(4);
        counters.add_file();
        drop(reporter);
        let last = Progress::parse(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!((last.bytes_done, last.files_done), (1024, 2));
    }

    #[test]
    fn listed_volumes_set_the_totals_once_every_one_is_listed() {
        let counters: &'static Counters = Box::leak(Box::new(Counters::new()));
        let listing = Mutex::new(Some(Listing {
            volumes_left: 2,
            files: 0,
            bytes: 0,
        }));
        // The parent's estimate stands until the last volume is listed.
        counters.set_totals(10, 1000);
        listed_into(counters, &listing, 3, 300);
        let now = counters.now("backup");
        assert_eq!((now.files_total, now.bytes_total), (Some(10), Some(1000)));
        listed_into(counters, &listing, 4, 50);
        let now = counters.now("backup");
        assert_eq!((now.files_total, now.bytes_total), (Some(7), Some(350)));
        assert!(listing.lock().unwrap().is_none());
        // Not armed: a listing changes nothing.
        listed_into(counters, &listing, 100, 100);
        assert_eq!(counters.now("backup").files_total, Some(7));
    }
}
