//! How many movers run on one node at once (`--movers-per-node`): a backup Job (reading a
//! volume) and a prepareData Job (writing one) each take a slot of the node they are pinned
//! to from their creation until they end. A Backup or a volume of a Restore that would pass
//! the bound waits, saying for what, and starts when a slot is free.
//!
//! The decision is made twice: in the plan, from the Jobs read for it (pure, tested), and
//! again when the Jobs are about to be created, under one lock for the whole controller,
//! from a fresh list: two reconciliations deciding at once cannot both take the last slot.
//! Jobs whose node the scheduler picks (a copy of a stopped application) and maintenance
//! Jobs (no volume) take none.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams};

use crate::error::{Error, Result};

/// The condition and status reason of a Backup or a volume waiting for a slot.
pub const MOVER_SLOTS_BUSY: &str = "MoverSlotsBusy";

/// The roles of the Jobs that take a slot.
const ROLES: &str = "custody.io/role in (backup,prepare-data)";

/// Whether `job` is a mover of custody's that still runs (or has yet to start): controlled by
/// a Backup or a Restore (a look-alike with custody's labels, which anyone who may create Jobs
/// can make, takes no slot) and without a `Complete` or `Failed` condition.
fn active(job: &Job) -> bool {
    let custodys = job.metadata.owner_references.iter().flatten().any(|owner| {
        owner.controller == Some(true)
            && owner.api_version
                == format!(
                    "{}/{}",
                    custody_kube::api::GROUP,
                    custody_kube::api::VERSION
                )
            && matches!(owner.kind.as_str(), "Backup" | "Restore")
    });
    custodys
        && !job
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions.iter().any(|condition| {
                    matches!(condition.type_.as_str(), "Complete" | "Failed")
                        && condition.status == "True"
                })
            })
}

/// Slots taken per node: every active Job among `jobs` pinned to a node.
pub fn taken(jobs: &[Job]) -> BTreeMap<String, u32> {
    let mut taken = BTreeMap::new();
    for job in jobs.iter().filter(|job| active(job)) {
        if let Some(node) = job
            .spec
            .as_ref()
            .and_then(|spec| spec.template.spec.as_ref())
            .and_then(|spec| spec.node_name.as_deref())
        {
            *taken.entry(node.to_string()).or_insert(0) += 1;
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

/// The slots taken now, read from the API server.
pub async fn read(client: &kube::Client) -> Result<BTreeMap<String, u32>> {
    let jobs = Api::<Job>::all(client.clone())
        .list(&ListParams::default().labels(ROLES))
        .await
        .map_err(Error::read("custody's Jobs on every node".to_string()))?;
    Ok(taken(&jobs.items))
}

/// One creation of mover Jobs at a time, for the whole controller.
#[derive(Debug, Default)]
pub struct Admission(tokio::sync::Mutex<()>);

impl Admission {
    /// Whether Jobs on `nodes` (one entry per Job) may be created now: under the lock, from a
    /// fresh count; the guard keeps the lock until they are created. With no bound, or no
    /// Job on a node, always.
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

    fn job(node: Option<&str>, condition: Option<(&str, &str)>) -> Job {
        owned(node, condition, "custody.io/v1alpha1", "Backup", true)
    }

    fn owned(
        node: Option<&str>,
        condition: Option<(&str, &str)>,
        api_version: &str,
        kind: &str,
        controller: bool,
    ) -> Job {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j", "ownerReferences": [
                {"apiVersion": api_version, "kind": kind, "name": "o", "uid": "u", "controller": controller},
            ]},
            "spec": {"template": {"spec": {"nodeName": node, "containers": []}}},
            "status": {"conditions": condition.map(|(kind, status)| vec![serde_json::json!({"type": kind, "status": status})])},
        }))
        .unwrap()
    }

    #[test]
    fn a_slot_is_taken_by_every_job_pinned_to_a_node_until_it_ends() {
        let jobs = [
            job(Some("a"), None),
            job(Some("a"), Some(("Complete", "False"))),
            job(Some("a"), Some(("Complete", "True"))),
            job(Some("a"), Some(("Failed", "True"))),
            job(Some("a"), Some(("Suspended", "True"))),
            job(Some("b"), None),
            owned(Some("b"), None, "custody.io/v1alpha1", "Restore", true),
            job(None, None),
            // Look-alikes: not controlled by a Backup or Restore of custody's.
            owned(Some("a"), None, "custody.io/v1alpha1", "Backup", false),
            owned(Some("a"), None, "example.com/v1", "Backup", true),
            owned(Some("a"), None, "custody.io/v1alpha1", "Cluster", true),
        ];
        assert_eq!(
            taken(&jobs),
            BTreeMap::from([("a".to_string(), 3), ("b".to_string(), 2)])
        );
        assert!(taken(&[]).is_empty());
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
