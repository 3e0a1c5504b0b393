//! Finding a pod's volumes under the kubelet root, and making sure a path really is a mounted
//! filesystem before anything is verified or written there.
//!
//! An unmounted directory under `pods/<uid>/volumes/` is the node's own disk: data written
//! there vanishes when the real volume is mounted over it, and data verified there says
//! nothing about the volume. So a path must be a mount point of a real filesystem.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Default kubelet root directory.
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Filesystem types that never hold a persistent volume's data.
const PSEUDO_FILESYSTEMS: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "overlay",
    "tmpfs",
    "ramfs",
    "mqueue",
    "bpf",
    "pstore",
    "autofs",
    "nsfs",
    "fusectl",
    "configfs",
];

/// Why a volume could not be found or used.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum VolumeError {
    #[error("{what} {value:?} is not a single path component")]
    InvalidName { what: &'static str, value: String },
    #[error("no volume {volume:?} for pod {pod_uid} under {root}")]
    NotFound {
        root: String,
        pod_uid: String,
        volume: String,
    },
    #[error("volume {volume:?} of pod {pod_uid} matches more than one plugin directory: {}", candidates.join(", "))]
    Ambiguous {
        pod_uid: String,
        volume: String,
        candidates: Vec<String>,
    },
    #[error("{path} is not a mount point: it is the node's own disk, not the volume")]
    NotAMountPoint { path: String },
    #[error("{path} is a {fs_type} mount, not a persistent filesystem")]
    PseudoFilesystem { path: String, fs_type: String },
    #[error("reading {path}: {error}")]
    Io { path: String, error: String },
}

impl VolumeError {
    /// CamelCase reason for conditions and Events.
    pub fn reason(&self) -> custody_proto::reasons::VolumeFailure {
        use custody_proto::reasons::VolumeFailure;
        match self {
            VolumeError::InvalidName { .. } => VolumeFailure::InvalidVolumeName,
            VolumeError::NotFound { .. } => VolumeFailure::VolumeNotFound,
            VolumeError::Ambiguous { .. } => VolumeFailure::VolumeAmbiguous,
            VolumeError::NotAMountPoint { .. } => VolumeFailure::NotAMountPoint,
            VolumeError::PseudoFilesystem { .. } => VolumeFailure::NotAPersistentFilesystem,
            VolumeError::Io { .. } => VolumeFailure::VolumeUnreadable,
        }
    }
}

fn io_error(path: &Path, error: io::Error) -> VolumeError {
    VolumeError::Io {
        path: path.display().to_string(),
        error: error.to_string(),
    }
}

fn single_component(what: &'static str, value: &str) -> Result<(), VolumeError> {
    if value.is_empty()
        || value == "."
        || value == ".."
        || value.contains('/')
        || value.contains('\0')
    {
        return Err(VolumeError::InvalidName {
            what,
            value: value.to_string(),
        });
    }
    Ok(())
}

/// The host path of volume `volume` of pod `pod_uid`:
/// `<kubelet_root>/pods/<uid>/volumes/<plugin>/<volume>`, plus `mount/` for CSI volumes.
pub fn find_volume(
    kubelet_root: &Path,
    pod_uid: &str,
    volume: &str,
) -> Result<PathBuf, VolumeError> {
    single_component("pod UID", pod_uid)?;
    single_component("volume name", volume)?;
    let plugins_dir = kubelet_root.join("pods").join(pod_uid).join("volumes");
    let not_found = || VolumeError::NotFound {
        root: kubelet_root.display().to_string(),
        pod_uid: pod_uid.to_string(),
        volume: volume.to_string(),
    };
    let plugins = match fs::read_dir(&plugins_dir) {
        Ok(plugins) => plugins,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(not_found()),
        Err(error) => return Err(io_error(&plugins_dir, error)),
    };
    let mut candidates = Vec::new();
    for plugin in plugins {
        let plugin = plugin.map_err(|error| io_error(&plugins_dir, error))?;
        let candidate = plugin.path().join(volume);
        // symlink_metadata: a symlink planted here is not a volume.
        if fs::symlink_metadata(&candidate).is_ok_and(|metadata| metadata.is_dir()) {
            let is_csi = plugin.file_name().to_string_lossy().ends_with("~csi");
            candidates.push(if is_csi {
                candidate.join("mount")
            } else {
                candidate
            });
        }
    }
    match candidates.len() {
        0 => Err(not_found()),
        1 => Ok(candidates.remove(0)),
        _ => Err(VolumeError::Ambiguous {
            pod_uid: pod_uid.to_string(),
            volume: volume.to_string(),
            candidates: candidates
                .iter()
                .map(|path| path.display().to_string())
                .collect(),
        }),
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The filesystem's device, `major:minor`.
    pub device: String,
    /// Which directory of the filesystem is mounted here (`/`: all of it).
    pub root: String,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// Parses `/proc/<pid>/mountinfo` text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mount-point options [optional...] - fstype source super
            let (before, after) = line.split_once(" - ")?;
            let mut fields = before.split(' ').skip(2);
            let device = fields.next()?;
            let root = fields.next()?;
            let mount_point = fields.next()?;
            let mut after = after.split(' ');
            let fs_type = after.next()?;
            let source = after.next().unwrap_or_default();
            Some(Mount {
                device: device.to_string(),
                root: unescape(root),
                mount_point: PathBuf::from(unescape(mount_point)),
                fs_type: fs_type.to_string(),
                source: unescape(source),
            })
        })
        .collect()
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\'
            && index + 3 < bytes.len()
            && bytes[index + 1..=index + 3]
                .iter()
                .all(|digit| (b'0'..=b'7').contains(digit))
        {
            let value = (bytes[index + 1] - b'0') * 64
                + (bytes[index + 2] - b'0') * 8
                + (bytes[index + 3] - b'0');
            out.push(value);
            index += 4;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decides whether `path` (canonical) is a mount point of a persistent filesystem, given the
/// mount table. The last mount on a path is the one in effect.
pub fn check_mount(path: &Path, mounts: &[Mount]) -> Result<(), VolumeError> {
    let mount = mounts
        .iter()
        .rev()
        .find(|mount| mount.mount_point == path)
        .ok_or_else(|| VolumeError::NotAMountPoint {
            path: path.display().to_string(),
        })?;
    if PSEUDO_FILESYSTEMS.contains(&mount.fs_type.as_str()) {
        return Err(VolumeError::PseudoFilesystem {
            path: path.display().to_string(),
            fs_type: mount.fs_type.clone(),
        });
    }
    Ok(())
}

/// Checks `path` against this process's mount table.
pub fn ensure_mounted(path: &Path) -> Result<PathBuf, VolumeError> {
    let canonical = fs::canonicalize(path).map_err(|error| io_error(path, error))?;
    let mountinfo_path = Path::new("/proc/self/mountinfo");
    let text =
        fs::read_to_string(mountinfo_path).map_err(|error| io_error(mountinfo_path, error))?;
    check_mount(&canonical, &parse_mountinfo(&text))?;
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
42 27 7:0 / /var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-a/mount rw,relatime shared:5 - ext4 /dev/loop0 rw
43 27 7:1 / /mnt/with\\040space rw,relatime - xfs /dev/loop1 rw
44 27 0:50 / /var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/cache rw - tmpfs tmpfs rw
45 27 0:51 / /stacked rw - tmpfs tmpfs rw
46 27 7:2 / /stacked rw - ext4 /dev/loop2 rw
47 27 7:3 / /unstacked rw - ext4 /dev/loop3 rw
48 27 0:52 / /unstacked rw - tmpfs tmpfs rw
garbage line without separator
";

    #[test]
    fn mount_decisions() {
        let mounts = parse_mountinfo(MOUNTINFO);
        let table: [(&str, Option<&str>); 8] = [
            (
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-a/mount",
                None,
            ),
            ("/mnt/with space", None),
            (
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-a",
                Some("NotAMountPoint"),
            ),
            (
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-a/mount/sub",
                Some("NotAMountPoint"),
            ),
            (
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/cache",
                Some("NotAPersistentFilesystem"),
            ),
            ("/stacked", None),
            ("/unstacked", Some("NotAPersistentFilesystem")),
            ("/nowhere", Some("NotAMountPoint")),
        ];
        for (path, expected) in table {
            let result = check_mount(Path::new(path), &mounts);
            assert_eq!(
                result.err().map(|error| error.reason().as_str()),
                expected,
                "{path}"
            );
        }
    }

    #[test]
    fn mountinfo_fields() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(mounts.len(), 8, "the garbage line is skipped");
        assert_eq!(mounts[2].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(mounts[2].fs_type, "xfs");
        assert_eq!(mounts[1].source, "/dev/loop0");
        assert_eq!(unescape("a\\134b\\011c"), "a\\b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }

    #[test]
    fn discovery() {
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        let make = |path: &str| fs::create_dir_all(pods.join(path)).unwrap();
        make("uid-1/volumes/kubernetes.io~csi/data/mount");
        make("uid-1/volumes/kubernetes.io~local-volume/logs");
        make("uid-2/volumes/kubernetes.io~csi/data/mount");
        make("uid-2/volumes/kubernetes.io~local-volume/data");
        std::os::unix::fs::symlink(
            "/etc",
            pods.join("uid-1/volumes/kubernetes.io~local-volume/planted"),
        )
        .unwrap();

        let found = find_volume(root.path(), "uid-1", "data").unwrap();
        assert_eq!(
            found,
            pods.join("uid-1/volumes/kubernetes.io~csi/data/mount")
        );
        let found = find_volume(root.path(), "uid-1", "logs").unwrap();
        assert_eq!(
            found,
            pods.join("uid-1/volumes/kubernetes.io~local-volume/logs")
        );

        let table: [(&str, &str, &str); 7] = [
            ("uid-1", "missing", "VolumeNotFound"),
            ("uid-9", "data", "VolumeNotFound"),
            ("uid-2", "data", "VolumeAmbiguous"),
            ("uid-1", "planted", "VolumeNotFound"),
            ("..", "data", "InvalidVolumeName"),
            ("uid-1", "../uid-2", "InvalidVolumeName"),
            ("uid-1", "", "InvalidVolumeName"),
        ];
        for (uid, volume, reason) in table {
            let error = find_volume(root.path(), uid, volume).unwrap_err();
            assert_eq!(error.reason().as_str(), reason, "{uid}/{volume}: {error}");
        }
    }

    #[test]
    fn an_unmounted_directory_is_refused() {
        let directory = tempfile::tempdir().unwrap();
        let error = ensure_mounted(directory.path()).unwrap_err();
        assert_eq!(error.reason().as_str(), "NotAMountPoint", "{error}");
    }
}
