//! How far a running mover has copied, and whether it stalled: pure rules over what the node
//! agents report ([`custody_kube::api::ReportedMover`], the mover's own counts read from its
//! scratch volume) and what the status recorded before.
//!
//! A report is taken only for a pod of the Job the Backup or Restore itself created (the pod's
//! labels are anyone's to write; the Job's pods are the Job's by their controller reference).

use std::time::Duration;

use custody_kube::api::{ReportedMover, Transfer};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::conditions::{Desired, Status, reasons, types};

/// The default of `--stalled-after-seconds`.
pub const DEFAULT_STALLED_AFTER_SECONDS: u64 = 300;

/// The report of one of `pods` (the pods of the owner's own Job `job_name`, in `namespace`)
/// among a node's movers, for owner `owner_uid`; the latest pod's when a Job retried.
pub fn find<'a>(
    movers: &'a [ReportedMover],
    namespace: &str,
    job_name: &str,
    owner_uid: &str,
    pods: &[Pod],
) -> Option<&'a ReportedMover> {
    let ours = |mover: &&ReportedMover| {
        mover.namespace == namespace && mover.job_name == job_name && mover.owner_uid == owner_uid
    };
    // Only a report of one of the Job's own pods, the latest pod's first: the current run's.
    let mut latest_first: Vec<&Pod> = pods.iter().collect();
    latest_first.sort_by_key(|pod| {
        std::cmp::Reverse(pod.metadata.creation_timestamp.as_ref().map(|time| time.0))
    });
    latest_first.into_iter().find_map(|pod| {
        movers
            .iter()
            .filter(ours)
            .find(|mover| pod.metadata.uid.as_deref() == Some(mover.pod_uid.as_str()))
    })
}

/// The transfer to record: the mover's report when there is one (its counts, and now as the
/// last progress when they moved or nothing was recorded), else what was recorded (the stall
/// clock runs on).
pub fn next(
    recorded: Option<&Transfer>,
    reported: Option<&ReportedMover>,
    node: Option<&str>,
    now: Timestamp,
) -> Option<Transfer> {
    let Some(reported) = reported else {
        return recorded.cloned();
    };
    let uploaded = Some(reported.bytes_sent).filter(|sent| *sent > 0);
    let moved = recorded.is_none_or(|recorded| {
        (
            recorded.bytes_done,
            recorded.files_done,
            recorded.bytes_uploaded,
        ) != (reported.bytes_done, reported.files_done, uploaded)
    });
    let last_progress_time = match recorded {
        Some(recorded) if !moved => recorded.last_progress_time.clone(),
        _ => Some(Time(now)),
    };
    Some(Transfer {
        summary: custody_proto::progress::with_sent(
            custody_proto::progress::summary(
                reported.bytes_done,
                reported.bytes_total,
                reported.files_done,
                reported.files_total,
            ),
            reported.bytes_sent,
        ),
        bytes_done: reported.bytes_done,
        bytes_total: reported.bytes_total,
        files_done: reported.files_done,
        files_total: reported.files_total,
        bytes_uploaded: uploaded,
        volume: Some(reported.volume.clone()).filter(|volume| !volume.is_empty()),
        node_name: node
            .map(str::to_string)
            .or_else(|| recorded.and_then(|recorded| recorded.node_name.clone())),
        last_progress_time,
    })
}

/// A transfer whose copy completed: the mover's final count `(files, bytes)` when its report
/// gave one (a copy too short for any progress report still says what it copied), else
/// everything the reports counted.
pub fn completed(recorded: Option<&Transfer>, result: Option<(u64, u64)>) -> Option<Transfer> {
    let (files, bytes) = match (result, recorded) {
        (Some(result), _) => result,
        (None, Some(recorded)) => (
            recorded.files_total.unwrap_or(0).max(recorded.files_done),
            recorded.bytes_total.unwrap_or(0).max(recorded.bytes_done),
        ),
        (None, None) => return None,
    };
    let recorded = recorded.cloned().unwrap_or_default();
    Some(Transfer {
        summary: custody_proto::progress::with_sent(
            custody_proto::progress::summary(bytes, Some(bytes), files, Some(files)),
            recorded.bytes_uploaded.unwrap_or(0),
        ),
        bytes_done: bytes,
        bytes_total: Some(bytes),
        files_done: files,
        files_total: Some(files),
        ..recorded
    })
}

/// Whether the copy has counted anything yet: the stall clock starts with the first byte or
/// file (before it the mover opens the repository, reads its index and the parent's trees, or
/// downloads and checks the manifest: bounded by the repository's `timeouts`, not counted).
fn started(transfer: &Transfer) -> bool {
    transfer.bytes_done > 0 || transfer.files_done > 0 || transfer.bytes_uploaded.is_some()
}

/// The `Stalled` condition of a running copy: True once its counts have not grown for longer
/// than `bound` (naming the volume, the node and since when), False while they grow. `None`
/// before the mover counted anything (see [`started`]).
pub fn stalled(transfer: Option<&Transfer>, bound: Duration, now: Timestamp) -> Option<Desired> {
    let transfer = transfer.filter(|transfer| started(transfer))?;
    let last = transfer.last_progress_time.as_ref()?.0;
    let still = Duration::try_from(now.duration_since(last)).unwrap_or(Duration::ZERO);
    let volume = transfer
        .volume
        .as_deref()
        .map_or_else(String::new, |volume| format!(" of volume {volume}"));
    let node = transfer
        .node_name
        .as_deref()
        .map_or_else(String::new, |node| format!(" on node {node}"));
    Some(if still > bound {
        Desired {
            type_: types::STALLED,
            status: Status::True,
            reason: reasons::NO_PROGRESS,
            // Names the last progress rather than the time since, so that later checks find
            // nothing to change.
            message: format!(
                "the copy{volume}{node} has made no progress since {last} (longer than {}s): {} copied",
                bound.as_secs(),
                transfer.summary
            ),
        }
    } else {
        Desired {
            type_: types::STALLED,
            status: Status::False,
            reason: reasons::PROGRESSING,
            message: format!("the copy{volume}{node} is progressing"),
        }
    })
}

/// Several volumes' transfers added up (a Restore's): totals only when every one is known,
/// the latest progress of any.
pub fn total<'a>(transfers: impl IntoIterator<Item = &'a Transfer>) -> Option<Transfer> {
    let transfers: Vec<&Transfer> = transfers.into_iter().collect();
    if transfers.is_empty() {
        return None;
    }
    let sum = |of: fn(&Transfer) -> Option<u64>| {
        transfers
            .iter()
            .map(|transfer| of(transfer))
            .try_fold(0u64, |sum, value| Some(sum.saturating_add(value?)))
    };
    let bytes_done = sum(|transfer| Some(transfer.bytes_done)).unwrap_or(0);
    let files_done = sum(|transfer| Some(transfer.files_done)).unwrap_or(0);
    let bytes_total = sum(|transfer| transfer.bytes_total);
    let files_total = sum(|transfer| transfer.files_total);
    let bytes_uploaded =
        sum(|transfer| Some(transfer.bytes_uploaded.unwrap_or(0))).filter(|sent| *sent > 0);
    Some(Transfer {
        summary: custody_proto::progress::with_sent(
            custody_proto::progress::summary(bytes_done, bytes_total, files_done, files_total),
            bytes_uploaded.unwrap_or(0),
        ),
        bytes_done,
        bytes_total,
        files_done,
        files_total,
        bytes_uploaded,
        volume: None,
        node_name: None,
        last_progress_time: transfers
            .iter()
            .filter_map(|transfer| transfer.last_progress_time.clone())
            .max_by_key(|time| time.0),
    })
}

/// The `Stalled` condition of several running copies: the first stalled one's, else False
/// while any reported; `None` when none has.
pub fn stalled_of<'a>(
    running: impl IntoIterator<Item = &'a Transfer>,
    bound: Duration,
    now: Timestamp,
) -> Option<Desired> {
    let each: Vec<Desired> = running
        .into_iter()
        .filter_map(|transfer| stalled(Some(transfer), bound, now))
        .collect();
    let first = each.first()?.clone();
    Some(
        each.into_iter()
            .find(|desired| desired.status == Status::True)
            .unwrap_or(first),
    )
}

/// The progress the agent on the node of the Job's latest pod last reported for it (see
/// [`find`]), with that node.
pub async fn reported(
    client: &kube::Client,
    namespace: &str,
    job_name: &str,
    owner_uid: &str,
    pods: &[Pod],
) -> Option<(ReportedMover, String)> {
    let node = pods
        .iter()
        .max_by_key(|pod| pod.metadata.creation_timestamp.as_ref().map(|time| time.0))
        .and_then(|pod| pod.spec.as_ref()?.node_name.clone())?;
    let agent = kube::Api::<custody_kube::api::NodeAgent>::all(client.clone())
        .get_opt(&node)
        .await
        .ok()
        .flatten()?;
    let movers = agent.status?.movers;
    find(&movers, namespace, job_name, owner_uid, pods)
        .cloned()
        .map(|mover| (mover, node))
}

/// The owners (Backup or Restore UIDs) of the movers a NodeAgent lists: what its change wakes.
pub fn owners(agent: &custody_kube::api::NodeAgent) -> std::collections::BTreeSet<String> {
    agent
        .status
        .iter()
        .flat_map(|status| status.movers.iter())
        .map(|mover| mover.owner_uid.clone())
        .collect()
}

/// When to look again so that a stall is said on time: just past the bound from the last
/// progress; `None` once past it (said already; a report that the copy moved wakes the
/// reconciler) or before the copy counted anything.
pub fn look_again(
    transfer: Option<&Transfer>,
    bound: Duration,
    now: Timestamp,
) -> Option<Duration> {
    let transfer = transfer.filter(|transfer| started(transfer))?;
    let last = transfer.last_progress_time.as_ref()?.0;
    let since = Duration::try_from(now.duration_since(last)).unwrap_or(Duration::ZERO);
    bound
        .checked_sub(since)
        .map(|left| left + Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn mover(pod_uid: &str, bytes: u64, files: u64) -> ReportedMover {
        ReportedMover {
            namespace: "shop".into(),
            pod_name: format!("pod-{pod_uid}"),
            pod_uid: pod_uid.into(),
            job_name: "backup-job".into(),
            owner_uid: "backup-uid".into(),
            operation: "backup".into(),
            volume: "data".into(),
            bytes_done: bytes,
            files_done: files,
            bytes_total: Some(1024 * 1024),
            files_total: Some(10),
            bytes_sent: 0,
        }
    }

    fn pod(uid: &str, created: i64) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": uid, "uid": uid,
            "creationTimestamp": at(created).to_string()}}))
        .unwrap()
    }

    #[test]
    fn only_a_pod_of_the_owners_own_job_is_believed() {
        // Listed by name, not by age: the retry's name sorts first.
        let pods = [pod("retry", 10), pod("first", 0)];
        let ours = mover("retry", 5, 1);
        let cases: [(&str, ReportedMover, bool); 6] = [
            ("its own pod", ours.clone(), true),
            (
                "another namespace",
                ReportedMover {
                    namespace: "other".into(),
                    ..ours.clone()
                },
                false,
            ),
            (
                "another Job",
                ReportedMover {
                    job_name: "other".into(),
                    ..ours.clone()
                },
                false,
            ),
            (
                "another owner",
                ReportedMover {
                    owner_uid: "other".into(),
                    ..ours.clone()
                },
                false,
            ),
            // A look-alike pod with the Job's labels is not one of the Job's pods.
            ("a look-alike pod", mover("look-alike", 5, 1), false),
            ("the first pod of a retried Job", mover("first", 5, 1), true),
        ];
        for (what, reported, found) in cases {
            let movers = [reported];
            assert_eq!(
                find(&movers, "shop", "backup-job", "backup-uid", &pods).is_some(),
                found,
                "{what}"
            );
        }
        // Both pods reported: the latest one's.
        let movers = [mover("first", 1, 1), mover("retry", 2, 1)];
        assert_eq!(
            find(&movers, "shop", "backup-job", "backup-uid", &pods).map(|m| m.bytes_done),
            Some(2)
        );
    }

    #[test]
    fn the_last_progress_is_when_the_counts_last_moved() {
        let first = next(None, Some(&mover("p", 10, 1)), Some("node-a"), at(0)).unwrap();
        assert_eq!(first.last_progress_time, Some(Time(at(0))));
        assert_eq!(first.summary, "10 B of 1.0 MiB (0%), 1 of 10 files");
        assert_eq!(
            (first.volume.as_deref(), first.node_name.as_deref()),
            (Some("data"), Some("node-a"))
        );
        // The same counts later: the last progress stays.
        let same = next(
            Some(&first),
            Some(&mover("p", 10, 1)),
            Some("node-a"),
            at(30),
        )
        .unwrap();
        assert_eq!(same.last_progress_time, Some(Time(at(0))));
        // Only a file more (an empty one): progress.
        let file = next(
            Some(&first),
            Some(&mover("p", 10, 2)),
            Some("node-a"),
            at(40),
        )
        .unwrap();
        assert_eq!(file.last_progress_time, Some(Time(at(40))));
        // Bytes more: progress.
        let bytes = next(
            Some(&first),
            Some(&mover("p", 11, 1)),
            Some("node-a"),
            at(50),
        )
        .unwrap();
        assert_eq!(bytes.last_progress_time, Some(Time(at(50))));
        // Only uploads moving (reading is ahead): progress, and said.
        let uploading = ReportedMover {
            bytes_sent: 4096,
            ..mover("p", 10, 1)
        };
        let uploading = next(Some(&first), Some(&uploading), None, at(55)).unwrap();
        assert_eq!(uploading.last_progress_time, Some(Time(at(55))));
        assert_eq!(uploading.bytes_uploaded, Some(4096));
        assert_eq!(
            uploading.summary,
            "10 B of 1.0 MiB (0%), 1 of 10 files, 4.0 KiB uploaded"
        );
        // The totals found (a backup finished counting) are not progress.
        let counted = ReportedMover {
            bytes_total: Some(7),
            ..mover("p", 10, 1)
        };
        let counted = next(Some(&first), Some(&counted), None, at(60)).unwrap();
        assert_eq!(counted.last_progress_time, Some(Time(at(0))));
        assert_eq!(counted.node_name.as_deref(), Some("node-a"));
        // No report now (the agent silent, the pod between retries): what was recorded.
        assert_eq!(next(Some(&first), None, None, at(90)), Some(first.clone()));
        assert_eq!(next(None, None, None, at(90)), None);
    }

    #[test]
    fn the_stall_clock_starts_with_the_first_count() {
        let bound = Duration::from_secs(300);
        // Opening the repository, reading the manifest: nothing counted, nothing stalls.
        let opening = next(None, Some(&mover("p", 0, 0)), Some("node-a"), at(0));
        assert_eq!(stalled(opening.as_ref(), bound, at(1000)), None);
        assert_eq!(look_again(opening.as_ref(), bound, at(10)), None);
        // Only bytes (a file not finished), only a file (an empty one), or only uploads:
        // started.
        let bytes = next(opening.as_ref(), Some(&mover("p", 5, 0)), None, at(1000));
        assert_eq!(
            stalled(bytes.as_ref(), bound, at(1301)).map(|desired| desired.status),
            Some(Status::True)
        );
        let file = next(opening.as_ref(), Some(&mover("p", 0, 1)), None, at(1000));
        assert_eq!(
            stalled(file.as_ref(), bound, at(1301)).map(|desired| desired.status),
            Some(Status::True)
        );
        let uploads = ReportedMover {
            bytes_sent: 1,
            ..mover("p", 0, 0)
        };
        let uploads = next(opening.as_ref(), Some(&uploads), None, at(1000));
        assert_eq!(
            stalled(uploads.as_ref(), bound, at(1001)).map(|desired| desired.status),
            Some(Status::False)
        );
    }

    #[test]
    fn a_copy_stalls_once_its_counts_stood_still_past_the_bound() {
        let bound = Duration::from_secs(300);
        let transfer = next(None, Some(&mover("p", 10, 1)), Some("node-a"), at(0));
        assert_eq!(stalled(None, bound, at(1000)), None, "never reported");
        for (now, status) in [
            (0, Status::False),
            (300, Status::False),
            (301, Status::True),
            (5000, Status::True),
        ] {
            let desired = stalled(transfer.as_ref(), bound, at(now)).unwrap();
            assert_eq!(desired.status, status, "at {now}");
            assert_eq!(desired.type_, types::STALLED);
        }
        let stall = stalled(transfer.as_ref(), bound, at(301)).unwrap();
        assert_eq!(stall.reason, reasons::NO_PROGRESS);
        assert!(
            stall.message.contains("volume data")
                && stall.message.contains("node node-a")
                && stall.message.contains("10 B of 1.0 MiB"),
            "{}",
            stall.message
        );
        // The message does not change while it stays stalled.
        assert_eq!(
            stalled(transfer.as_ref(), bound, at(5000)).unwrap().message,
            stall.message
        );
        // Moving again: not stalled.
        let moved = next(transfer.as_ref(), Some(&mover("p", 11, 1)), None, at(5000));
        assert_eq!(
            stalled(moved.as_ref(), bound, at(5001)).unwrap().status,
            Status::False
        );
    }

    #[test]
    fn volumes_add_up_and_one_stalled_volume_stalls_them_all() {
        let bound = Duration::from_secs(300);
        let a = next(None, Some(&mover("a", 100, 1)), Some("node-a"), at(0)).unwrap();
        let b = next(None, Some(&mover("b", 200, 2)), Some("node-b"), at(250)).unwrap();
        let sum = total([&a, &b]).unwrap();
        assert_eq!(
            (
                sum.bytes_done,
                sum.bytes_total,
                sum.files_done,
                sum.files_total
            ),
            (300, Some(2 * 1024 * 1024), 3, Some(20))
        );
        assert_eq!(sum.last_progress_time, Some(Time(at(250))));
        // One total unknown: the sum's is unknown.
        let counting = Transfer {
            bytes_total: None,
            ..b.clone()
        };
        assert_eq!(total([&a, &counting]).unwrap().bytes_total, None);
        // Uploads add up; none uploaded is none said.
        assert_eq!(sum.bytes_uploaded, None);
        let uploading = Transfer {
            bytes_uploaded: Some(100),
            ..a.clone()
        };
        let with_uploads = total([&uploading, &b]).unwrap();
        assert_eq!(with_uploads.bytes_uploaded, Some(100));
        assert!(
            with_uploads.summary.ends_with(", 100 B uploaded"),
            "{}",
            with_uploads.summary
        );
        assert_eq!(total([]), None);

        assert_eq!(stalled_of([], bound, at(0)), None);
        let both = stalled_of([&a, &b], bound, at(301)).unwrap();
        assert_eq!(both.status, Status::True);
        assert!(both.message.contains("node node-a"), "{}", both.message);
        assert_eq!(
            stalled_of([&a, &b], bound, at(200)).unwrap().status,
            Status::False
        );
        assert_eq!(
            stalled_of([&b], bound, at(301)).unwrap().status,
            Status::False
        );
    }

    #[test]
    fn the_next_look_is_just_past_the_bound() {
        let bound = Duration::from_secs(300);
        let transfer = next(None, Some(&mover("p", 10, 1)), None, at(0));
        assert_eq!(look_again(None, bound, at(0)), None);
        assert_eq!(
            look_again(transfer.as_ref(), bound, at(100)),
            Some(Duration::from_secs(201))
        );
        assert_eq!(
            look_again(transfer.as_ref(), bound, at(300)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(look_again(transfer.as_ref(), bound, at(400)), None);
    }

    #[test]
    fn a_completed_copy_says_everything_was_copied() {
        let transfer = next(None, Some(&mover("p", 900, 9)), Some("node-a"), at(0)).unwrap();
        let done = completed(Some(&transfer), None).unwrap();
        assert_eq!(
            (
                done.bytes_done,
                done.bytes_total,
                done.files_done,
                done.files_total
            ),
            (1024 * 1024, Some(1024 * 1024), 10, Some(10))
        );
        assert_eq!(done.summary, "1.0 MiB of 1.0 MiB (100%), 10 of 10 files");
        assert_eq!(done.node_name.as_deref(), Some("node-a"));
        // The mover's own final count wins; a copy never reported still says what it copied.
        let exact = completed(Some(&transfer), Some((11, 2048))).unwrap();
        assert_eq!((exact.files_done, exact.bytes_done), (11, 2048));
        let unreported = completed(None, Some((3, 4096))).unwrap();
        assert_eq!(
            unreported.summary,
            "4.0 KiB of 4.0 KiB (100%), 3 of 3 files"
        );
        assert_eq!(unreported.last_progress_time, None);
        // Totals never counted: what was copied is the total.
        let uncounted = Transfer {
            bytes_total: None,
            files_total: None,
            ..transfer
        };
        let done = completed(Some(&uncounted), None).unwrap();
        assert_eq!((done.bytes_total, done.files_total), (Some(900), Some(9)));
        assert_eq!(completed(None, None), None);
    }
}
