//! How many movers run on one node at once (`--movers-per-node`): a Backup copying a volume
//! and a prepareData Job writing one each take a slot of their node. A Backup takes it when
//! it starts on its node (its pre hook included, before its Job exists) until it ends; a
//! Restore's Job takes it from when the Restore records it until it ends. A Backup or a
//! volume of a Restore that would pass the bound waits, saying for what, and starts when a
//! slot is free.
//!
//! Only what custody's own status records counts (a Backup's phase and node, a Restore's
//! Job names), never a Job by its labels or owner alone: anyone who may create Jobs can make
//! a look-alike, and none of them takes a slot. A Backup whose node the scheduler picks (a
//! copy of a stopped application) and maintenance Jobs (no volume) take none.
//!
//! The decision is made twice: in the plan, from what was read for it (pure, tested), and
//! again right before the Backup is recorded as started or the Restore's Jobs are created,
//! under one lock for the whole controller, from a fresh read, held until what takes the slot
//! is recorded: two reconciliations deciding at once cannot both take the last slot.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::error::{Error, Result};
use custody_kube::api::{Backup, BackupPhase, Restore};

/// The condition and status reason of a Backup or a volume waiting for a slot.
pub const MOVER_SLOTS_BUSY: &str = "MoverSlotsBusy";

/// Whether `job` has ended (a `Complete` or `Failed` condition) or is suspended (it runs no
/// pod until someone resumes it).
fn idle(job: &Job) -> bool {
    let ended = job
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|condition| {
                matches!(condition.type_.as_str(), "Complete" | "Failed")
                    && condition.status == "True"
            })
        });
    let suspended = job
        .spec
        .as_ref()
        .and_then(|spec| spec.suspend)
        .unwrap_or(false);
    ended || suspended
}

/// Slots taken per node: every Backup `Running` on a node, and every prepareData Job a
/// Restore's status names that it controls, pinned to a node and not ended.
pub fn taken(backups: &[Backup], restores: &[Restore], jobs: &[Job]) -> BTreeMap<String, u32> {
    let mut taken = BTreeMap::new();
    for backup in backups {
        let Some(status) = &backup.status else {
            continue;
        };
        if status.phase == Some(BackupPhase::Running)
            && let Some(node) = &status.node_name
        {
            *taken.entry(node.clone()).or_insert(0) += 1;
        }
    }
    for restore in restores {
        let uid = restore.metadata.uid.as_deref().unwrap_or_default();
        let namespace = restore.namespace().unwrap_or_default();
        let recorded = restore
            .status
            .iter()
            .flat_map(|status| status.volumes.iter())
            .filter_map(|volume| volume.job_name.as_deref());
        for name in recorded {
            let job = jobs.iter().find(|job| {
                job.metadata.name.as_deref() == Some(name)
                    && job.namespace().as_deref() == Some(namespace.as_str())
                    && crate::ownership::owned_by(
                        &job.metadata,
                        "Restore",
                        uid,
                        custody_proto::names::LABEL_RESTORE_UID,
                    )
            });
            let node = job
                .filter(|job| !idle(job))
                .and_then(crate::mover_job::node_of);
            if let Some(node) = node {
                *taken.entry(node.to_string()).or_insert(0) += 1;
            }
        }
    }
    taken
}

/// Whether one more mover may start on a node where `taken` run, with at most `bound` (0: no
/// bound).
pub fn free(taken: u32, bound: u32) -> bool {
    bound == 0 || taken < bound
}

/// Whether `wanted` more movers (by node) fit beside those `taken`; the first node where they
/// do not, with its count, if not.
pub fn fits<'a>(
    taken: &BTreeMap<String, u32>,
    wanted: impl IntoIterator<Item = &'a str>,
    bound: u32,
) -> Result<(), (String, u32)> {
    let mut counts = taken.clone();
    for node in wanted {
        let count = counts.entry(node.to_string()).or_insert(0);
        if !free(*count, bound) {
            return Err((node.to_string(), *count));
        }
        *count += 1;
    }
    Ok(())
}

/// What a Backup or a volume waiting for a slot says.
pub fn busy(node: &str, taken: u32, bound: u32) -> String {
    format!(
        "{taken} of custody's movers already run on node {node}, at most {bound} at once (--movers-per-node): it starts when one of them ends"
    )
}

/// The slots taken now, read from the API server: every Backup, every Restore and their
/// prepareData Jobs.
pub async fn read(client: &kube::Client) -> Result<BTreeMap<String, u32>> {
    let backups = Api::<Backup>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::read("Backups in every namespace".to_string()))?;
    let restores = Api::<Restore>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::read("Restores in every namespace".to_string()))?;
    let jobs = Api::<Job>::all(client.clone())
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_PREPARE_DATA
        )))
        .await
        .map_err(Error::read(
            "prepareData Jobs in every namespace".to_string(),
        ))?;
    Ok(taken(&backups.items, &restores.items, &jobs.items))
}

/// One creation of mover Jobs at a time, for the whole controller.
#[derive(Debug, Default)]
pub struct Admission(tokio::sync::Mutex<()>);

impl Admission {
    /// Whether movers on `nodes` (one entry each) may start now: under the lock, from a fresh
    /// read; the guard keeps the lock until what takes the slots is recorded (drop it then).
    /// With no bound, or nothing on a node, always.
    pub async fn admit<'a>(
        &'a self,
        client: &kube::Client,
        nodes: &[&str],
        bound: u32,
    ) -> Result<Result<Option<tokio::sync::MutexGuard<'a, ()>>, (String, u32)>> {
        if bound == 0 || nodes.is_empty() {
            return Ok(Ok(None));
        }
        let guard = self.0.lock().await;
        let taken = read(client).await?;
        Ok(fits(&taken, nodes.iter().copied(), bound).map(|()| Some(guard)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(phase: &str, node: Option<&str>) -> Backup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "c"}},
            "status": {"phase": phase, "nodeName": node},
        }))
        .unwrap()
    }

    fn restore(uid: &str, jobs: &[&str]) -> Restore {
        let volumes: Vec<serde_json::Value> = jobs
            .iter()
            .map(|job| serde_json::json!({"claimName": "c", "state": "Restoring", "jobName": job}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": "r", "namespace": "ns", "uid": uid},
            "spec": {"clusterRef": {"name": "c"}, "backupRef": {"name": "b"}},
            "status": {"volumes": volumes},
        }))
        .unwrap()
    }

    /// A prepareData Job `name` in `namespace`, controlled by the Restore `owner` (and
    /// labelled with `label`), on `node`, with `condition`, suspended or not.
    fn job(
        name: &str,
        namespace: &str,
        (owner, label): (&str, &str),
        node: Option<&str>,
        condition: Option<(&str, &str)>,
        suspend: bool,
    ) -> Job {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace,
                "labels": {"custody.io/restore-uid": label},
                "ownerReferences": [{"apiVersion": "custody.io/v1alpha1", "kind": "Restore",
                    "name": "r", "uid": owner, "controller": true}]},
            "spec": {"suspend": suspend, "template": {"spec": {"nodeName": node, "containers": []}}},
            "status": {"conditions": condition.map(|(kind, status)| vec![serde_json::json!({"type": kind, "status": status})])},
        }))
        .unwrap()
    }

    #[test]
    fn a_slot_is_taken_by_a_running_backup_and_a_recorded_restore_job_until_they_end() {
        let backups = [
            backup("Running", Some("a")),
            backup("Running", Some("b")),
            // Not started, ended, or placed by the scheduler: no slot.
            backup("Pending", Some("a")),
            backup("Completed", Some("a")),
            backup("Failed", Some("a")),
            backup("Running", None),
        ];
        let mine = ("r-uid", "r-uid");
        let jobs = [
            job("j1", "ns", mine, Some("a"), None, false),
            job(
                "j2",
                "ns",
                mine,
                Some("a"),
                Some(("Complete", "False")),
                false,
            ),
            job(
                "j3",
                "ns",
                mine,
                Some("a"),
                Some(("Complete", "True")),
                false,
            ),
            job("j4", "ns", mine, Some("a"), Some(("Failed", "True")), false),
            job("j5", "ns", mine, Some("a"), None, true),
            job("j6", "other", mine, Some("a"), None, false),
            job("j7", "ns", ("someone", "r-uid"), Some("a"), None, false),
            job("j8", "ns", ("r-uid", "someone"), Some("a"), None, false),
            job("j9", "ns", mine, None, None, false),
            job("unrecorded", "ns", mine, Some("a"), None, false),
            job("j10", "ns", mine, Some("b"), None, false),
        ];
        let restores = [restore(
            "r-uid",
            &[
                "j1", "j2", "j3", "j4", "j5", "j6", "j7", "j8", "j9", "j10", "missing",
            ],
        )];
        // a: the Running Backup, j1 and j2 (not ended). Not: j3/j4 ended, j5 suspended, j6 in
        // another namespace, j7 controlled by another Restore, j8 labelled for another, j9 on
        // no node, "unrecorded" not in the status. b: the Backup and j10.
        assert_eq!(
            taken(&backups, &restores, &jobs),
            BTreeMap::from([("a".to_string(), 3), ("b".to_string(), 2)])
        );
        assert!(
            taken(&[], &[], &jobs).is_empty(),
            "a Job alone takes nothing"
        );
    }

    #[test]
    fn a_mover_starts_only_below_the_bound_and_zero_is_no_bound() {
        for (taken, bound, free_now) in [
            (0, 0, true),
            (100, 0, true),
            (0, 1, true),
            (1, 1, false),
            (2, 1, false),
            (2, 3, true),
            (3, 3, false),
        ] {
            assert_eq!(free(taken, bound), free_now, "{taken} taken of {bound}");
        }
    }

    #[test]
    fn several_jobs_fit_only_if_each_node_keeps_to_the_bound() {
        let taken = BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 2)]);
        // (wanted, bound, result)
        type Row<'a> = (&'a [&'a str], u32, Result<(), (String, u32)>);
        let cases: [Row<'_>; 7] = [
            (&[], 2, Ok(())),
            (&["a"], 2, Ok(())),
            (&["a", "a"], 2, Err(("a".into(), 2))),
            (&["b"], 2, Err(("b".into(), 2))),
            (&["c", "c"], 2, Ok(())),
            (&["c", "c", "c"], 2, Err(("c".into(), 2))),
            (&["a", "b", "c"], 0, Ok(())),
        ];
        for (wanted, bound, expected) in cases {
            assert_eq!(
                fits(&taken, wanted.iter().copied(), bound),
                expected,
                "{wanted:?} at most {bound}"
            );
        }
        assert!(busy("n1", 2, 2).contains("node n1") && busy("n1", 2, 2).contains("at most 2"));
    }
}
