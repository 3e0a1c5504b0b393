//! Freezing the filesystem of a volume while a custody backup's mover reads it (Backup
//! `spec.consistency.method: Freeze`): the copy is then the volume at one instant.
//!
//! Who may freeze what is decided by [`authorize`] (pure): only the pod of the Job custody
//! created for a Backup (the UID the Backup recorded), where that Backup runs as a frozen copy
//! on this node, only a claim the pod mounts, and no longer than the Backup's bound. [`freezable`] (pure) refuses a mount that is not a whole filesystem of its own
//! or that is the node's own disk: freezing it would stop the node's other writers.
//!
//! A freeze always ends at its bound: [`Frozen`] thaws when it is dropped (the caller went
//! away, the connection dropped, the bound passed, the agent stops), and it is noted on the
//! node's disk first, with its bound, one note per filesystem (a second freeze of a frozen
//! filesystem is refused). The watchdog, a container of its own in the agent's pod
//! (`custody-watchdog`), thaws every noted freeze whose bound passed, so that neither a
//! killed agent nor the kubelet's back-off before restarting it can hold a filesystem frozen;
//! an agent that starts thaws what a killed one left frozen ([`thaw_left_frozen`]). Whoever
//! thaws first claims the note by renaming it, so each freeze is thawed exactly once.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use custody_kube::api::{Backup, BackupPhase, Capture};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::metrics::{self, Metrics};
use crate::volumes::Mount;

/// The bound of a Backup that records none (the default of `maxFreezeSeconds`).
pub const DEFAULT_BOUND_SECONDS: u32 = 60;

/// Filesystems whose freeze custody relies on.
pub const FREEZABLE: &[&str] = &["ext4", "ext3", "xfs", "btrfs"];

/// Why a freeze is refused; each says what to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("pod {0} is not a custody backup pod (a pod of a Job a Backup controls)")]
    NotABackupPod(String),
    #[error("Job {0} of the calling pod does not exist")]
    JobMissing(String),
    #[error("Job {0} is not the calling pod's controller, or is not controlled by a Backup")]
    NotTheBackupsJob(String),
    #[error("Backup {0} does not exist")]
    BackupMissing(String),
    #[error(
        "Backup {backup} has not recorded the Job custody created for it yet (Job {job} asks); ask again shortly"
    )]
    JobNotRecorded { backup: String, job: String },
    #[error(
        "Backup {0} records no Job: it was started by an older custody, whose Jobs may not freeze; create a new Backup"
    )]
    NoJobRecorded(String),
    #[error(
        "Job {job} is not the Job custody created for Backup {backup} (that one has UID {recorded}): a Job made by someone else, even with the Backup as its owner, may not freeze"
    )]
    NotCustodysJob {
        job: String,
        backup: String,
        recorded: String,
    },
    #[error("Backup {name} is not running as a frozen copy (phase {phase}, consistency {capture})")]
    NotAFrozenCopy {
        name: String,
        phase: String,
        capture: String,
    },
    #[error("Backup {name} runs on node {found:?}, not on this agent's node {expected}")]
    OtherNode {
        name: String,
        expected: String,
        found: Option<String>,
    },
    #[error("pod {pod} does not mount claim {claim}")]
    ClaimNotMounted { pod: String, claim: String },
    #[error("a freeze of 0 seconds was asked for")]
    NoTime,
    #[error("{path} is not a mount point: there is no filesystem of the volume to freeze")]
    NotAMountPoint { path: String },
    #[error(
        "{path} is directory {root} of filesystem {device}, not a filesystem of its own: freezing it would stop every other writer of {device}"
    )]
    NotAWholeFilesystem {
        path: String,
        root: String,
        device: String,
    },
    #[error("{path} is a {fs_type} filesystem; custody freezes only {}", FREEZABLE.join(", "))]
    Unsupported { path: String, fs_type: String },
    #[error(
        "{path} is on {device}, the node's own disk (the kubelet's or the agent's): freezing it would stop the node"
    )]
    NodeFilesystem { path: String, device: String },
}

impl Refusal {
    /// CamelCase reason for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NotABackupPod(_) => "NotABackupPod",
            Refusal::JobMissing(_) => "JobMissing",
            Refusal::NotTheBackupsJob(_) => "NotTheBackupsJob",
            Refusal::BackupMissing(_) => "BackupMissing",
            Refusal::JobNotRecorded { .. } => "JobNotRecorded",
            Refusal::NoJobRecorded(_) => "NoJobRecorded",
            Refusal::NotCustodysJob { .. } => "NotCustodysJob",
            Refusal::NotAFrozenCopy { .. } => "NotAFrozenCopy",
            Refusal::OtherNode { .. } => "OtherNode",
            Refusal::ClaimNotMounted { .. } => "ClaimNotMounted",
            Refusal::NoTime => "NoTime",
            Refusal::NotAMountPoint { .. } => "NotAMountPoint",
            Refusal::NotAWholeFilesystem { .. } => "NotAWholeFilesystem",
            Refusal::Unsupported { .. } => "UnsupportedFilesystem",
            Refusal::NodeFilesystem { .. } => "NodeFilesystem",
        }
    }
}

/// What a caller may freeze: the pod's volume that mounts the claim, for this long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub volume: String,
    pub max_seconds: u32,
}

/// The controller owner of `meta` if it is of `kind`: its name and UID.
pub fn controller_of<'a>(meta: &'a ObjectMeta, kind: &str) -> Option<(&'a str, &'a str)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true) && owner.kind == kind)
        .map(|owner| (owner.name.as_str(), owner.uid.as_str()))
}

/// Whether the calling `pod` (proven by its token to run on `node`) may freeze the filesystem
/// of `claim` for `requested` seconds (at most the Backup's recorded bound and `limit`), given
/// its controlling Job and that Job's controlling Backup as the API server has them. Only the
/// Job whose UID the Backup recorded (the one custody created) qualifies: owner references
/// and labels are written by whoever creates a Job.
pub fn authorize(
    node: &str,
    pod: &Pod,
    claim: &str,
    job: Option<&Job>,
    backup: Option<&Backup>,
    requested: u32,
    limit: u32,
) -> Result<Grant, Refusal> {
    let pod_name = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let is_backup_pod = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(custody_proto::names::LABEL_ROLE))
        .is_some_and(|role| role == custody_proto::names::ROLE_BACKUP);
    let Some((job_name, job_uid)) = controller_of(&pod.metadata, "Job").filter(|_| is_backup_pod)
    else {
        return Err(Refusal::NotABackupPod(pod_name));
    };
    let job = job.ok_or_else(|| Refusal::JobMissing(job_name.to_string()))?;
    let backup_owner = controller_of(&job.metadata, "Backup");
    let (Some((backup_name, backup_uid)), true) =
        (backup_owner, job.metadata.uid.as_deref() == Some(job_uid))
    else {
        return Err(Refusal::NotTheBackupsJob(job_name.to_string()));
    };
    let backup = backup
        .filter(|backup| backup.metadata.uid.as_deref() == Some(backup_uid))
        .ok_or_else(|| Refusal::BackupMissing(backup_name.to_string()))?;
    let status = backup.status.clone().unwrap_or_default();
    if status.phase != Some(BackupPhase::Running) || status.consistency != Some(Capture::Frozen) {
        return Err(Refusal::NotAFrozenCopy {
            name: backup_name.to_string(),
            phase: format!("{:?}", status.phase),
            capture: format!("{:?}", status.consistency),
        });
    }
    if status.node_name.as_deref() != Some(node) {
        return Err(Refusal::OtherNode {
            name: backup_name.to_string(),
            expected: node.to_string(),
            found: status.node_name,
        });
    }
    match &status.job {
        None => return Err(Refusal::NoJobRecorded(backup_name.to_string())),
        Some(recorded) if recorded.uid.is_empty() => {
            return Err(Refusal::JobNotRecorded {
                backup: backup_name.to_string(),
                job: job_name.to_string(),
            });
        }
        Some(recorded) if recorded.uid != job_uid => {
            return Err(Refusal::NotCustodysJob {
                job: job_name.to_string(),
                backup: backup_name.to_string(),
                recorded: recorded.uid.clone(),
            });
        }
        Some(_) => {}
    }
    let volume = pod
        .spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .find(|volume| {
            volume
                .persistent_volume_claim
                .as_ref()
                .is_some_and(|source| source.claim_name == claim)
        })
        .ok_or_else(|| Refusal::ClaimNotMounted {
            pod: pod_name.clone(),
            claim: claim.to_string(),
        })?;
    if requested == 0 {
        return Err(Refusal::NoTime);
    }
    // The Backup's own bound, as the controller recorded it, caps what the mover asks (a
    // Backup that records none gets the default a Backup gets).
    let recorded = status
        .max_freeze_seconds
        .and_then(|seconds| u32::try_from(seconds).ok())
        .filter(|seconds| *seconds > 0)
        .unwrap_or(DEFAULT_BOUND_SECONDS);
    Ok(Grant {
        volume: volume.name.clone(),
        max_seconds: requested.min(recorded).min(limit),
    })
}

/// The device of the filesystem mounted at `path` (canonical), if freezing it is safe: a
/// mount of a whole filesystem of a type custody freezes, none of `node_devices` (the
/// filesystems of the kubelet's root and the agent's state).
pub fn freezable(
    path: &Path,
    mounts: &[Mount],
    node_devices: &[String],
) -> Result<String, Refusal> {
    let shown = path.display().to_string();
    let mount = mounts
        .iter()
        .rev()
        .find(|mount| mount.mount_point == path)
        .ok_or_else(|| Refusal::NotAMountPoint {
            path: shown.clone(),
        })?;
    if mount.root != "/" {
        return Err(Refusal::NotAWholeFilesystem {
            path: shown,
            root: mount.root.clone(),
            device: mount.device.clone(),
        });
    }
    if !FREEZABLE.contains(&mount.fs_type.as_str()) {
        return Err(Refusal::Unsupported {
            path: shown,
            fs_type: mount.fs_type.clone(),
        });
    }
    if node_devices.contains(&mount.device) {
        return Err(Refusal::NodeFilesystem {
            path: shown,
            device: mount.device.clone(),
        });
    }
    Ok(mount.device.clone())
}

/// The device of the filesystem `path` lives on: the mount with the longest mount point
/// that contains it.
pub fn device_of(path: &Path, mounts: &[Mount]) -> Option<String> {
    mounts
        .iter()
        .filter(|mount| path.starts_with(&mount.mount_point))
        .max_by_key(|mount| mount.mount_point.as_os_str().len())
        .map(|mount| mount.device.clone())
}

const FIFREEZE: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::read_write::<std::ffi::c_int>(b'X', 119);
const FITHAW: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::read_write::<std::ffi::c_int>(b'X', 120);

#[allow(unsafe_code)]
fn fifreeze(directory: &File) -> std::io::Result<()> {
    // SAFETY: FIFREEZE takes no argument the kernel reads (its int operand is ignored), so
    // NoArg passes nothing that could be misread; it acts on the filesystem of the open
    // directory only.
    unsafe { rustix::ioctl::ioctl(directory, rustix::ioctl::NoArg::<FIFREEZE>::new()) }
        .map_err(std::io::Error::from)
}

#[allow(unsafe_code)]
fn fithaw(directory: &File) -> std::io::Result<()> {
    // SAFETY: as for FIFREEZE: no operand is read.
    unsafe { rustix::ioctl::ioctl(directory, rustix::ioctl::NoArg::<FITHAW>::new()) }
        .map_err(std::io::Error::from)
}

const NOTE_PREFIX: &str = "frozen-";
const CLAIMED_PREFIX: &str = "thawing-";
const WRITING_PREFIX: &str = "writing-";

/// How much sooner than the watchdog the agent itself thaws at the bound, so that with a live
/// agent the mover always learns that its freeze ended (the watchdog reads the notes every
/// 100 ms).
pub const AGENT_MARGIN_MILLIS: i64 = 500;

/// How long a claim by the other party may stay unfinished before it is taken over (that
/// party died between claiming and thawing).
pub const STALE_CLAIM_MILLIS: i64 = 2_000;

/// Milliseconds on the node's boot clock (CLOCK_BOOTTIME): shared by the agent's and the
/// watchdog's containers, and neither set nor stepped like the wall clock.
pub fn boot_millis() -> i64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    now.tv_sec * 1000 + now.tv_nsec / 1_000_000
}

/// Who claims a note to thaw its filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thawer {
    /// The agent: its freeze ended, or it starts after a killed agent.
    Agent,
    /// The watchdog container, at the freeze's bound, whatever became of the agent.
    Watchdog,
}

impl Thawer {
    fn suffix(self) -> &'static str {
        match self {
            Thawer::Agent => "agent",
            Thawer::Watchdog => "watchdog",
        }
    }
}

/// A freeze as noted before FIFREEZE: the mount to thaw and when at the latest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Unique per freeze, and part of the note's file name: a claim renames exactly the note
    /// of one freeze.
    pub id: String,
    /// The mount frozen (the mover pod's); the device is thawed through any mount of it.
    pub path: PathBuf,
    /// The bound on the node's boot clock ([`boot_millis`]).
    pub deadline_boot_millis: i64,
    /// When it was noted, just before FIFREEZE (wall clock, Unix nanoseconds), and its bound
    /// in seconds: what a thaw record reports.
    pub frozen_at_unix_nanos: i64,
    pub max_seconds: u32,
    /// The Backup the freeze is for, when the agent knew it.
    pub owner: Option<Owner>,
}

/// The Backup a freeze is for, and the claim frozen.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub namespace: String,
    pub backup: String,
    pub backup_uid: String,
    pub claim: String,
}

impl Note {
    fn render(&self) -> String {
        let owner = self.owner.clone().unwrap_or_default();
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
            self.path.display(),
            self.deadline_boot_millis,
            self.id,
            self.frozen_at_unix_nanos,
            self.max_seconds,
            owner.namespace,
            owner.backup,
            owner.backup_uid,
            owner.claim,
        )
    }

    /// Reads a note; a note of an older agent (the path only) is due at once.
    pub fn parse(text: &str) -> Option<Note> {
        let mut lines = text.lines();
        let path = PathBuf::from(lines.next().filter(|line| !line.is_empty())?);
        let deadline_boot_millis = lines.next().and_then(|line| line.parse().ok()).unwrap_or(0);
        let id = lines.next().unwrap_or_default().to_string();
        let frozen_at_unix_nanos = lines.next().and_then(|line| line.parse().ok()).unwrap_or(0);
        let max_seconds = lines.next().and_then(|line| line.parse().ok()).unwrap_or(0);
        let mut owner = || lines.next().unwrap_or_default().to_string();
        let owner = Owner {
            namespace: owner(),
            backup: owner(),
            backup_uid: owner(),
            claim: owner(),
        };
        Some(Note {
            id,
            path,
            deadline_boot_millis,
            frozen_at_unix_nanos,
            max_seconds,
            owner: (!owner.backup_uid.is_empty()).then_some(owner),
        })
    }
}

const THAWED_PREFIX: &str = "thawed-";

/// A freeze that the watchdog, or an agent starting after a killed one, thawed: the mover was
/// not told when (its call had broken), so the agent reports it to the controller, which says
/// it on the Backup. Kept in the state directory until a report carried it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Thawed {
    pub id: String,
    pub device: String,
    /// `watchdog` or `agent`.
    pub thawer: String,
    pub frozen_at_unix_nanos: i64,
    pub thawed_at_unix_nanos: i64,
    pub max_seconds: u32,
    pub owner: Option<Owner>,
}

/// Records that `note`'s freeze of `device` was thawed now by `thawer` (written whole, then
/// renamed into place).
fn record_thaw(state_dir: &Path, device: &str, note: &Note, thawer: Thawer) -> std::io::Result<()> {
    use std::io::Write;
    if note.frozen_at_unix_nanos == 0 {
        // An older agent's note: when it froze is not known, there is nothing to report.
        return Ok(());
    }
    let record = Thawed {
        id: note.id.clone(),
        device: device.to_string(),
        thawer: thawer.suffix().to_string(),
        frozen_at_unix_nanos: note.frozen_at_unix_nanos,
        thawed_at_unix_nanos: k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64,
        max_seconds: note.max_seconds,
        owner: note.owner.clone(),
    };
    let name = format!("{THAWED_PREFIX}{}", note.id);
    let writing = state_dir.join(format!("{RECORDING_PREFIX}{}", note.id));
    let mut file = std::fs::File::create(&writing)?;
    file.write_all(&serde_json::to_vec(&record).unwrap_or_default())?;
    file.sync_all()?;
    std::fs::rename(&writing, state_dir.join(name))
}

/// A thaw record being written (by the agent or the watchdog: an agent that starts removes
/// only those a stopped party left an hour ago or more).
const RECORDING_PREFIX: &str = "recording-";

/// Records older than this are dropped unsent (a controller that never accepts them).
pub const RECORD_DAYS: i64 = 1;

/// The thaw records in `state_dir` not yet reported, with their files. A record that does not
/// parse is removed.
pub fn thaw_records(state_dir: &Path) -> Vec<(PathBuf, Thawed)> {
    let Ok(listed) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    let mut records: Vec<(PathBuf, Thawed)> = listed
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(THAWED_PREFIX)
        })
        .filter_map(|entry| {
            let path = entry.path();
            match std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            {
                Some(record) => Some((path, record)),
                None => {
                    let _ = std::fs::remove_file(&path);
                    None
                }
            }
        })
        .collect();
    let oldest = k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64
        - RECORD_DAYS * 86_400 * 1_000_000_000;
    records.retain(|(path, record)| {
        let keep = record.thawed_at_unix_nanos >= oldest;
        if !keep {
            tracing::warn!(
                id = record.id,
                "dropping a thaw record no controller accepted for a day"
            );
            let _ = std::fs::remove_file(path);
        }
        keep
    });
    records.sort_by_key(|(_, record)| record.thawed_at_unix_nanos);
    records
}

/// A file of the state directory that is about a freeze.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The file.
    pub file: PathBuf,
    /// The device as the file name carries it (`major_minor`).
    pub device_file: String,
    pub id: String,
    /// `None`: noted, frozen or about to be. `Some`: claimed by this thawer at this time.
    pub claimed: Option<(String, i64)>,
}

/// The freezes noted or claimed in `state_dir` (old notes without an id in their name too).
pub fn entries(state_dir: &Path) -> Vec<Entry> {
    let Ok(listed) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    listed
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(rest) = name.strip_prefix(NOTE_PREFIX) {
                let (device_file, id) = rest.split_once('.').unwrap_or((rest, ""));
                return Some(Entry {
                    file: entry.path(),
                    device_file: device_file.to_string(),
                    id: id.to_string(),
                    claimed: None,
                });
            }
            let rest = name.strip_prefix(CLAIMED_PREFIX)?;
            let mut parts = rest.split('.');
            let (device_file, id, who, at) =
                (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            Some(Entry {
                file: entry.path(),
                device_file: device_file.to_string(),
                id: id.to_string(),
                claimed: Some((who.to_string(), at.parse().ok()?)),
            })
        })
        .collect()
}

/// Serializes the agent's creation of notes with its own claims: a filesystem gets a new note
/// only while no note and no unfinished claim of it exist, so that a late FITHAW of one freeze
/// can never end the next. The watchdog only renames, which needs no lock.
static NOTES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Tells one freeze from every other on the node.
fn freeze_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{:x}-{}",
        k8s_openapi::jiff::Timestamp::now().as_nanosecond(),
        COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn device_file(device: &str) -> String {
    device.replace(':', "_")
}

/// Notes the freeze of `device` (written whole, then renamed into place, so no party ever
/// reads half a note); `Ok(false)` when the filesystem is noted already, or its last freeze's
/// thaw is not finished. The caller holds [`NOTES`].
fn create_note(state_dir: &Path, device: &str, note: &Note) -> std::io::Result<bool> {
    use std::io::Write;
    std::fs::create_dir_all(state_dir)?;
    let device_file = device_file(device);
    if entries(state_dir)
        .iter()
        .any(|entry| entry.device_file == device_file)
    {
        return Ok(false);
    }
    let writing = state_dir.join(format!("{WRITING_PREFIX}{}", note.id));
    let mut file = std::fs::File::create(&writing)?;
    file.write_all(note.render().as_bytes())?;
    file.sync_all()?;
    std::fs::rename(
        &writing,
        state_dir.join(format!("{NOTE_PREFIX}{device_file}.{}", note.id)),
    )?;
    Ok(true)
}

/// Claims the note of freeze `id` of `device_file` for `thawer`: an atomic rename of exactly
/// that note, so one party thaws each freeze. The claimed file and its note, or `None` when it
/// is not there (claimed already).
pub fn claim(
    state_dir: &Path,
    device_file: &str,
    id: &str,
    thawer: Thawer,
) -> Option<(PathBuf, Note)> {
    let noted = state_dir.join(format!("{NOTE_PREFIX}{device_file}.{id}"));
    let claimed = state_dir.join(format!(
        "{CLAIMED_PREFIX}{device_file}.{id}.{}.{}",
        thawer.suffix(),
        boot_millis()
    ));
    std::fs::rename(&noted, &claimed).ok()?;
    let note = Note::parse(&std::fs::read_to_string(&claimed).ok()?)?;
    Some((claimed, note))
}

/// Thaws the filesystem of `device` (`major:minor`) mounted at `path`, after checking that
/// `path` is on that device; `Ok(false)` when it was not frozen (EINVAL).
fn thaw_at(path: &Path, device: &str) -> std::io::Result<bool> {
    let directory = File::open(path)?;
    let stat = rustix::fs::fstat(&directory)?;
    let found = format!(
        "{}:{}",
        rustix::fs::major(stat.st_dev),
        rustix::fs::minor(stat.st_dev)
    );
    if found != device {
        return Err(std::io::Error::other(format!(
            "{} is on device {found}, not {device} (unmounted?)",
            path.display()
        )));
    }
    thaw(&directory)
}

/// FITHAW; `Ok(false)` when the filesystem was not frozen (EINVAL).
fn thaw(directory: &File) -> std::io::Result<bool> {
    match fithaw(directory) {
        Ok(()) => Ok(true),
        Err(error) if error.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// Thaws the device of a claimed note: through the noted mount, else through any mount of
/// the device in `mounts` (the mover's pod may be gone and its mount with it, the
/// application's remains). The claim is removed only once the device is thawed (or was not
/// frozen): a failed thaw stays claimed and is tried again.
fn finish(
    claimed: &Path,
    device_file: &str,
    note: &Note,
    mounts: &[Mount],
    thawer: Thawer,
) -> std::io::Result<bool> {
    let device = device_file.replace('_', ":");
    let mut result = thaw_at(&note.path, &device);
    if result.is_err() {
        for mount in mounts.iter().filter(|mount| mount.device == device) {
            result = thaw_at(&mount.mount_point, &device);
            if result.is_ok() {
                break;
            }
        }
    }
    if result.is_err() && !mounts.iter().any(|mount| mount.device == device) {
        // Mounted nowhere (the noted mount gone, no other): nothing is left frozen to thaw.
        result = Ok(false);
    }
    if let Ok(true) = result
        && let Some(state_dir) = claimed.parent()
        && let Err(error) = record_thaw(state_dir, &device, note, thawer)
    {
        // Recorded before the claim goes: a thawer stopped in between thaws again (EINVAL,
        // not frozen) and records nothing, so at worst the record is missing, never doubled.
        tracing::warn!(device, %error, "cannot record the thaw for the controller");
    }
    if result.is_ok() {
        let _ = std::fs::remove_file(claimed);
    }
    result
}

/// Thaws what `thawer` finds due in `state_dir` at `now` (boot clock, milliseconds): every
/// noted freeze whose bound passed, every claim of its own left unfinished, and every claim of
/// the other party older than `stale_millis`. For each, the device and the thaw's result.
pub fn thaw_due(
    state_dir: &Path,
    now: i64,
    thawer: Thawer,
    stale_millis: i64,
    mounts: &[Mount],
) -> Vec<(String, std::io::Result<bool>)> {
    let mut results = Vec::new();
    for entry in entries(state_dir) {
        let claimed = match &entry.claimed {
            None => {
                let Some(text) = std::fs::read_to_string(&entry.file).ok() else {
                    continue;
                };
                let Some(note) = Note::parse(&text) else {
                    continue;
                };
                if note.deadline_boot_millis > now {
                    continue;
                }
                // An older agent's note has no id in its name: claim the name it has.
                let id = if entry.id.is_empty() {
                    let legacy =
                        state_dir.join(format!("{NOTE_PREFIX}{}.legacy", entry.device_file));
                    if std::fs::rename(&entry.file, &legacy).is_err() {
                        continue;
                    }
                    "legacy".to_string()
                } else {
                    entry.id.clone()
                };
                claim(state_dir, &entry.device_file, &id, thawer)
            }
            Some((who, at)) if who == thawer.suffix() || boot_millis() - at >= stale_millis => {
                let Some(note) = std::fs::read_to_string(&entry.file)
                    .ok()
                    .and_then(|text| Note::parse(&text))
                else {
                    continue;
                };
                Some((entry.file.clone(), note))
            }
            Some(_) => None,
        };
        if let Some((file, note)) = claimed {
            let result = finish(&file, &entry.device_file, &note, mounts, thawer);
            results.push((entry.device_file.replace('_', ":"), result));
        }
    }
    results
}

/// Why a freeze could not start.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error(
        "the filesystem {0} is frozen already for another backup (or its last freeze is being thawed); two freezes of one filesystem are refused, not nested"
    )]
    AlreadyFrozen(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A frozen filesystem; thawed when dropped, unless the watchdog thawed it at its bound.
pub struct Frozen {
    directory: File,
    device: String,
    state_dir: PathBuf,
    id: String,
    /// The note's bound (boot clock, milliseconds).
    deadline: i64,
    since: Instant,
    metrics: Arc<Metrics>,
    /// How the freeze ends, for the metrics; `Released` unless said otherwise.
    outcome: &'static str,
}

impl Frozen {
    /// Notes (with its bound of `max_seconds` and the Backup it is for), then freezes, the
    /// filesystem of `device` mounted at `path`. Blocks until the kernel has flushed it (run it off the async
    /// threads). A filesystem noted as frozen already is refused before anything is written.
    pub fn freeze(
        path: &Path,
        device: &str,
        state_dir: &Path,
        max_seconds: u32,
        owner: Option<Owner>,
        metrics: Arc<Metrics>,
    ) -> Result<Frozen, FreezeError> {
        let id = freeze_id();
        let deadline = boot_millis() + i64::from(max_seconds) * 1000;
        let note = Note {
            id: id.clone(),
            path: path.to_path_buf(),
            deadline_boot_millis: deadline,
            frozen_at_unix_nanos: k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64,
            max_seconds,
            owner,
        };
        {
            let _notes = NOTES
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if !create_note(state_dir, device, &note)? {
                return Err(FreezeError::AlreadyFrozen(device.to_string()));
            }
        }
        let unnote = || {
            if let Some((claimed, _)) = claim(state_dir, &device_file(device), &id, Thawer::Agent) {
                let _ = std::fs::remove_file(claimed);
            }
        };
        let directory = match File::open(path) {
            Ok(directory) => directory,
            Err(error) => {
                unnote();
                return Err(error.into());
            }
        };
        if let Err(error) = fifreeze(&directory) {
            unnote();
            return Err(error.into());
        }
        metrics.frozen.inc();
        tracing::info!(path = %path.display(), device, max_seconds, "filesystem frozen");
        Ok(Frozen {
            directory,
            device: device.to_string(),
            state_dir: state_dir.to_path_buf(),
            id,
            deadline,
            since: Instant::now(),
            metrics,
            outcome: "Released",
        })
    }

    /// How long until the agent itself must thaw: the note's bound less
    /// [`AGENT_MARGIN_MILLIS`], so that it, not the watchdog, ends a freeze while it lives.
    pub fn time_left(&self) -> std::time::Duration {
        let left = self.deadline - AGENT_MARGIN_MILLIS - boot_millis();
        std::time::Duration::from_millis(left.max(0) as u64)
    }

    /// Thaws now, counting the freeze under `outcome`.
    pub fn end(mut self, outcome: &'static str) {
        self.outcome = outcome;
    }

    /// The frozen filesystem's device.
    pub fn device(&self) -> &str {
        &self.device
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let seconds = self.since.elapsed().as_secs_f64();
        match claim(
            &self.state_dir,
            &device_file(&self.device),
            &self.id,
            Thawer::Agent,
        ) {
            Some((claimed, _)) => match thaw(&self.directory) {
                Ok(frozen) => {
                    if frozen {
                        tracing::info!(
                            device = self.device,
                            seconds,
                            outcome = self.outcome,
                            "filesystem thawed"
                        );
                    }
                    let _ = std::fs::remove_file(claimed);
                }
                Err(error) => {
                    // Left claimed: the watchdog takes it over and tries again.
                    tracing::error!(device = self.device, %error, "thawing the filesystem failed")
                }
            },
            None => {
                // The watchdog claimed it at the bound (or a restarted agent did).
                self.outcome = "ThawedByWatchdog";
                tracing::warn!(
                    device = self.device,
                    seconds,
                    "the watchdog thawed the filesystem at its bound"
                );
            }
        }
        self.metrics.frozen.dec();
        self.metrics.frozen_duration.observe(seconds);
        metrics::count(&self.metrics.freezes, self.outcome);
    }
}

/// Thaws every filesystem an earlier agent noted as frozen and did not thaw (it was killed),
/// whatever its bound: no freeze of this agent holds it any more. Returns the devices thawed.
pub fn thaw_left_frozen(state_dir: &Path, mounts: &[Mount], metrics: &Metrics) -> Vec<String> {
    if let Ok(listed) = std::fs::read_dir(state_dir) {
        for entry in listed.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let stale = || {
                entry
                    .metadata()
                    .and_then(|metadata| metadata.modified())
                    .ok()
                    .and_then(|modified| modified.elapsed().ok())
                    .is_some_and(|age| age >= std::time::Duration::from_secs(3600))
            };
            if name.starts_with(WRITING_PREFIX) || (name.starts_with(RECORDING_PREFIX) && stale()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let mut thawed = Vec::new();
    // A fresh claim of the watchdog is the watchdog's to finish: it may be thawing it now.
    for (device, result) in thaw_due(
        state_dir,
        i64::MAX,
        Thawer::Agent,
        STALE_CLAIM_MILLIS,
        mounts,
    ) {
        match result {
            Ok(true) => {
                tracing::warn!(device, "thawed a filesystem a stopped agent left frozen");
                metrics::count(&metrics.freezes, "ThawedAtStart");
                thawed.push(device);
            }
            Ok(false) => tracing::debug!(device, "not frozen (any more)"),
            Err(error) => {
                tracing::error!(device, %error, "cannot thaw a filesystem a stopped agent left frozen")
            }
        }
    }
    thawed
}

/// Reads what [`authorize`] decides on, then freezes: the frozen filesystem and its bound, or
/// the refusal's reason and status.
pub async fn serve(
    agent: &crate::state::Agent,
    caller: &custody_proto::authn::GateCaller,
    request: &custody_proto::gate::FreezeRequest,
) -> Result<(Frozen, u32), (&'static str, tonic::Status)> {
    use kube::api::Api;
    let refused = |refusal: Refusal| {
        let status = match refusal {
            // The controller records the Job right after creating it: asked again, it is there.
            Refusal::JobNotRecorded { .. } => tonic::Status::unavailable(refusal.to_string()),
            _ => tonic::Status::permission_denied(refusal.to_string()),
        };
        (refusal.reason(), status)
    };
    let unavailable = |what: String| ("ReadFailed", tonic::Status::unavailable(what));
    let pod = agent
        .pods
        .state()
        .into_iter()
        .find(|pod| pod.metadata.uid.as_deref() == Some(caller.pod_uid.as_str()))
        .ok_or_else(|| refused(Refusal::NotABackupPod(caller.name.clone())))?;
    let namespace = caller.namespace.as_str();
    let job = match controller_of(&pod.metadata, "Job") {
        Some((name, _)) => Api::<Job>::namespaced(agent.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|error| unavailable(format!("reading Job {namespace}/{name}: {error}")))?,
        None => None,
    };
    let backup = match job
        .as_ref()
        .and_then(|job| controller_of(&job.metadata, "Backup"))
    {
        Some((name, _)) => Api::<Backup>::namespaced(agent.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|error| unavailable(format!("reading Backup {namespace}/{name}: {error}")))?,
        None => None,
    };
    let options = &agent.options;
    let grant = authorize(
        &options.node_name,
        &pod,
        &request.claim_name,
        job.as_ref(),
        backup.as_ref(),
        request.max_seconds,
        options.max_freeze_seconds,
    )
    .map_err(refused)?;
    let volume_error = |error: crate::volumes::VolumeError| {
        (
            "VolumeNotFound",
            tonic::Status::failed_precondition(error.to_string()),
        )
    };
    // Under the kubelet root, a claim's volume is named after its PersistentVolume.
    let claim = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        agent.client.clone(),
        namespace,
    )
    .get_opt(&request.claim_name)
    .await
    .map_err(|error| {
        unavailable(format!(
            "reading claim {namespace}/{}: {error}",
            request.claim_name
        ))
    })?;
    let directory = crate::verification::directory_name(claim.as_ref(), &grant.volume);
    let path = crate::volumes::find_volume(&options.kubelet_root, &caller.pod_uid, &directory)
        .map_err(volume_error)?;
    let path = crate::volumes::ensure_mounted(&path).map_err(volume_error)?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|error| unavailable(format!("reading /proc/self/mountinfo: {error}")))?;
    let mounts = crate::volumes::parse_mountinfo(&mountinfo);
    let node_devices: Vec<String> = [options.kubelet_root.as_path(), options.state_dir.as_path()]
        .into_iter()
        .filter_map(|path| {
            let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
            device_of(&path, &mounts)
        })
        .collect();
    let device = freezable(&path, &mounts, &node_devices).map_err(refused)?;
    let (state_dir, metrics) = (options.state_dir.clone(), agent.metrics.clone());
    let max_seconds = grant.max_seconds;
    let owner = backup.as_ref().map(|backup| Owner {
        namespace: namespace.to_string(),
        backup: backup.metadata.name.clone().unwrap_or_default(),
        backup_uid: backup.metadata.uid.clone().unwrap_or_default(),
        claim: request.claim_name.clone(),
    });
    let frozen = tokio::task::spawn_blocking(move || {
        Frozen::freeze(&path, &device, &state_dir, max_seconds, owner, metrics)
    })
    .await
    .map_err(|error| unavailable(format!("the freezing thread: {error}")))?
    .map_err(|error| match error {
        FreezeError::AlreadyFrozen(_) => (
            "AlreadyFrozen",
            tonic::Status::failed_precondition(error.to_string()),
        ),
        FreezeError::Io(error) => (
            "FreezeFailed",
            tonic::Status::failed_precondition(format!("FIFREEZE failed: {error}")),
        ),
    })?;
    tracing::info!(
        namespace,
        pod = caller.name,
        claim = request.claim_name,
        max_seconds = grant.max_seconds,
        "frozen for a backup"
    );
    Ok((frozen, grant.max_seconds))
}

#[cfg(test)]
mod tests;
