//! How far the custody movers on this node have come: every few seconds, the progress file
//! each running mover pod writes in its scratch volume is read under the kubelet's root
//! ([`custody_proto::progress`]) and, when anything changed, reported.
//!
//! The file is the pod's own, so it is read as untrusted input: under the kubelet's own
//! directories, without following a symbolic link, only a regular file, never more than a few
//! KiB, without blocking on a FIFO. What it says is trusted only for the pod's own Job (the
//! controller matches the Job to the Backup or Restore that created it).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use custody_proto::names;
use custody_proto::progress::{self, Progress};
use custody_proto::report::MoverProgress;
use k8s_openapi::api::core::v1::Pod;
use rustix::fs::{Mode, OFlags};

use crate::state::Agent;

/// How often the progress files are read.
pub const READ_EVERY: Duration = Duration::from_secs(3);
/// At most this many movers are reported (more would be a node far past any bound).
pub const MAX_REPORTED: usize = 128;
/// At most this many of one namespace: anyone who may create Jobs can make look-alike mover
/// pods, and a namespace full of them must not push other namespaces' movers out of the report
/// (their Backups and Restores would look stalled).
pub const MAX_REPORTED_PER_NAMESPACE: usize = 16;

/// The scratch volume's directory of mover pod `uid` (custody's mover Jobs name it `scratch`).
fn scratch(kubelet_root: &Path, uid: &str) -> std::path::PathBuf {
    kubelet_root
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/scratch")
}

/// Whether `pod` is a running custody mover: a pod of a Job (its controller) labelled as a
/// Backup's or a Restore's prepareData Job.
pub fn is_mover(pod: &Pod) -> bool {
    let of_a_job = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.kind == "Job");
    let role = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(names::LABEL_ROLE))
        .map(String::as_str);
    let running = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        == Some("Running");
    matches!(role, Some(names::ROLE_BACKUP | names::ROLE_PREPARE_DATA))
        && of_a_job
        && running
        && pod.metadata.deletion_timestamp.is_none()
}

/// The report of `pod`'s progress.
pub fn report_of(pod: &Pod, progress: Progress) -> MoverProgress {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
    let owner_uid = match label(names::LABEL_ROLE).as_str() {
        names::ROLE_BACKUP => label(names::LABEL_BACKUP_UID),
        _ => label(names::LABEL_RESTORE_UID),
    };
    MoverProgress {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        job_name: label("job-name"),
        owner_uid,
        operation: progress.operation,
        volume: progress.volume,
        bytes_done: progress.bytes_done,
        files_done: progress.files_done,
        bytes_total: progress.bytes_total,
        files_total: progress.files_total,
        bytes_sent: progress.bytes_sent,
    }
}

/// Reads mover pod `uid`'s progress file; `None` when there is none (yet) or it is not one.
pub fn read(kubelet_root: &Path, uid: &str) -> Option<Progress> {
    // A pod UID is a UUID: anything else is not looked up.
    if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return None;
    }
    let directory = rustix::fs::open(
        scratch(kubelet_root, uid),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let file = crate::tree::open_beneath(
        &directory,
        progress::FILE_NAME,
        OFlags::RDONLY | OFlags::NONBLOCK,
    )
    .ok()?;
    let stat = rustix::fs::fstat(&file).ok()?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return None;
    }
    let mut content = Vec::new();
    std::fs::File::from(file)
        .take(progress::MAX_FILE_BYTES + 1)
        .read_to_end(&mut content)
        .ok()?;
    Progress::parse(&content)
}

/// Every running mover's progress on the node, in pod order: at most
/// [`MAX_REPORTED_PER_NAMESPACE`] of a namespace, [`MAX_REPORTED`] in all.
pub fn read_all(kubelet_root: &Path, pods: &[Arc<Pod>]) -> Vec<MoverProgress> {
    let mut movers: Vec<&Arc<Pod>> = pods.iter().filter(|pod| is_mover(pod)).collect();
    movers.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut per_namespace: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut reports = Vec::new();
    for pod in movers {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let seen = per_namespace.entry(namespace).or_default();
        if *seen >= MAX_REPORTED_PER_NAMESPACE || reports.len() >= MAX_REPORTED {
            continue;
        }
        let Some(uid) = pod.metadata.uid.as_deref() else {
            continue;
        };
        // Counted once found, so that files not yet written take no namespace's turn.
        if let Some(progress) = read(kubelet_root, uid) {
            *seen += 1;
            reports.push(report_of(pod, progress));
        }
    }
    reports
}

/// Reads the movers' progress every [`READ_EVERY`] and publishes it when it changed.
pub async fn follow(agent: Arc<Agent>) {
    let mut every = tokio::time::interval(READ_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let pods = agent.pods.state();
        let root = agent.options.kubelet_root.clone();
        let Ok(now) = tokio::task::spawn_blocking(move || read_all(&root, &pods)).await else {
            continue;
        };
        agent.movers.send_if_modified(|last| {
            let changed = *last != now;
            *last = now;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, role: &str, phase: &str) -> Pod {
        pod_in("shop", uid, role, phase)
    }

    fn pod_in(namespace: &str, uid: &str, role: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": namespace, "uid": uid,
                "labels": {"custody.io/role": role, "job-name": "job-1",
                    "custody.io/backup-uid": "backup-uid", "custody.io/restore-uid": "restore-uid"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "job-1",
                    "uid": "job-uid", "controller": true}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn written(root: &Path, uid: &str, content: &[u8]) {
        let directory = scratch(root, uid);
        std::fs::create_dir_all(&directory).unwrap();
        std::fs::write(directory.join(progress::FILE_NAME), content).unwrap();
    }

    fn progress_json(bytes: u64) -> Vec<u8> {
        serde_json::to_vec(&Progress {
            operation: "backup".into(),
            volume: "data".into(),
            bytes_done: bytes,
            files_done: 1,
            bytes_total: Some(100),
            files_total: Some(2),
            bytes_sent: 0,
        })
        .unwrap()
    }

    #[test]
    fn only_running_custody_movers_count() {
        for (role, phase, deleting, mover) in [
            ("backup", "Running", false, true),
            ("prepare-data", "Running", false, true),
            ("backup", "Pending", false, false),
            ("backup", "Succeeded", false, false),
            ("backup", "Running", true, false),
            ("maintenance", "Running", false, false),
            ("workload", "Running", false, false),
        ] {
            let mut pod = pod("0a-1", role, phase);
            if deleting {
                pod.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ));
            }
            assert_eq!(is_mover(&pod), mover, "{role} {phase} deleting={deleting}");
        }
        // A bare pod with the labels, or one a Job does not control, is not a mover.
        let mut bare = pod("0a-1", "backup", "Running");
        bare.metadata.owner_references = None;
        assert!(!is_mover(&bare));
        let mut owned = pod("0a-1", "backup", "Running");
        owned.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert!(!is_mover(&owned));
    }

    #[test]
    fn a_namespace_of_look_alikes_does_not_push_others_out_of_the_report() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let mut pods = Vec::new();
        for index in 0..100 {
            let uid = format!("aa-{index:03}");
            written(root, &uid, &progress_json(1));
            pods.push(Arc::new(pod_in("aaa", &uid, "backup", "Running")));
        }
        written(root, "bb-1", &progress_json(2));
        pods.push(Arc::new(pod_in("zzz", "bb-1", "prepare-data", "Running")));
        let reported = read_all(root, &pods);
        assert_eq!(
            reported
                .iter()
                .filter(|mover| mover.namespace == "aaa")
                .count(),
            MAX_REPORTED_PER_NAMESPACE
        );
        assert!(
            reported
                .iter()
                .any(|mover| mover.namespace == "zzz" && mover.bytes_done == 2)
        );
    }

    #[test]
    fn a_backup_reports_for_its_backup_and_a_restore_for_its_restore() {
        let backup = report_of(&pod("a-1", "backup", "Running"), Progress::default());
        assert_eq!(
            (backup.owner_uid.as_str(), backup.job_name.as_str()),
            ("backup-uid", "job-1")
        );
        let restore = report_of(&pod("a-1", "prepare-data", "Running"), Progress::default());
        assert_eq!(restore.owner_uid, "restore-uid");
    }

    #[test]
    fn a_progress_file_is_read_only_when_it_is_a_small_regular_file_of_its_own() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        written(root, "0a-1", &progress_json(7));
        assert_eq!(read(root, "0a-1").map(|read| read.bytes_done), Some(7));
        // No file yet, or garbage: nothing.
        assert_eq!(read(root, "0a-2"), None);
        written(root, "0a-3", b"{\"operation\": 1}");
        assert_eq!(read(root, "0a-3"), None);
        // Too large: not read.
        let mut large = progress_json(7);
        large.resize(progress::MAX_FILE_BYTES as usize + 10, b' ');
        written(root, "0a-4", &large);
        assert_eq!(read(root, "0a-4"), None);
        // A symbolic link to another pod's file (or anything of the node's) is not followed.
        let directory = scratch(root, "0a-5");
        std::fs::create_dir_all(&directory).unwrap();
        std::os::unix::fs::symlink(
            scratch(root, "0a-1").join(progress::FILE_NAME),
            directory.join(progress::FILE_NAME),
        )
        .unwrap();
        assert_eq!(read(root, "0a-5"), None);
        // A FIFO does not block the reader.
        let directory = scratch(root, "0a-6");
        std::fs::create_dir_all(&directory).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            directory.join(progress::FILE_NAME),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(read(root, "0a-6"), None);
        // A UID that is not one is not looked up (no path of the node is reached through it).
        assert_eq!(read(root, "../../etc"), None);
    }

    #[test]
    fn every_running_mover_with_a_file_is_reported_in_pod_order() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        written(root, "b-2", &progress_json(2));
        written(root, "a-1", &progress_json(1));
        written(root, "c-3", &progress_json(3));
        let pods: Vec<Arc<Pod>> = [
            pod("c-3", "backup", "Succeeded"),
            pod("b-2", "prepare-data", "Running"),
            pod("a-1", "backup", "Running"),
            pod("d-4", "backup", "Running"),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let reported: Vec<(String, u64)> = read_all(root, &pods)
            .into_iter()
            .map(|report| (report.pod_name, report.bytes_done))
            .collect();
        assert_eq!(
            reported,
            [("pod-a-1".to_string(), 1), ("pod-b-2".to_string(), 2)]
        );
    }
}
