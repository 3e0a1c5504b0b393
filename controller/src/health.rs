//! Backup health as users alert on it: each Cluster's and plan's last successful and failed
//! backup, restores still waiting and why, agents that stopped reporting, artifact deletions
//! that keep failing; and, once per finished Backup or Restore, its result, duration, size and
//! freeze.
//!
//! Everything is derived from the objects themselves ([`summarize`], [`newly_finished`], pure):
//! a restarted or newly elected controller exports the same gauges at once, and no reconciler
//! has to remember to count. Only the leader watches and exports them (a follower's scrape has
//! none of these series), so that two replicas never disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::conditions::types;
use custody_kube::api::{
    Backup, BackupPhase, BackupPlan, Cluster, NodeAgent, Restore, RestorePhase,
};

#[cfg(test)]
mod tests;

use custody_proto::names::LABEL_PLAN;

/// A namespaced object's name and namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

/// When a Cluster's (or a plan's) backups last succeeded and last failed, in Unix seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Last {
    pub success: Option<f64>,
    pub failure: Option<f64>,
}

/// An agent as its NodeAgent says.
#[derive(Clone, Debug, PartialEq)]
pub struct Agent {
    /// When the controller last heard from it (Unix seconds).
    pub last_heartbeat: Option<f64>,
    /// Its `Ready` condition is True: it reported within the timeout.
    pub reporting: bool,
}

/// A Restore not finished yet, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    /// Its `Ready` condition's reason, or its phase while it has none.
    pub reason: String,
    /// Since when it exists (Unix seconds).
    pub since: f64,
}

/// What the gauges say at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Health {
    pub clusters: BTreeMap<Key, Last>,
    pub plans: BTreeMap<Key, Last>,
    /// Each plan's creation (Unix seconds), so that a plan with no run yet is not "overdue"
    /// since 1970.
    pub plans_created: BTreeMap<Key, f64>,
    pub restores_waiting: BTreeMap<Key, Waiting>,
    pub agents: BTreeMap<String, Agent>,
    /// Backups being deleted whose artifact's delete failed at least once, by namespace.
    pub deletions_retrying: BTreeMap<String, u64>,
    /// Each plan's last restore drill (plans with a drill that finished at least once).
    pub drills: BTreeMap<Key, Drilled>,
}

/// A plan's restore drills as its status says.
#[derive(Clone, Debug, PartialEq)]
pub struct Drilled {
    /// When the last drill ended (Unix seconds), and whether it passed.
    pub last: f64,
    pub passed: bool,
    /// When a drill last passed.
    pub last_success: Option<f64>,
}

fn seconds(time: &Time) -> f64 {
    time.0.as_millisecond() as f64 / 1000.0
}

fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions
        .iter()
        .find(|condition| condition.type_ == types::READY)
}

/// How a Backup or Restore ended, and when (Unix seconds): Completed at its completion time;
/// Failed at its completion time, else when its `Ready` condition turned False.
fn ended(
    completed: bool,
    failed: bool,
    completion: Option<&Time>,
    conditions: &[Condition],
) -> Option<(bool, f64)> {
    if !(completed || failed) {
        return None;
    }
    let at = completion.map(seconds).or_else(|| {
        ready(conditions)
            .filter(|condition| condition.status == "False")
            .map(|condition| seconds(&condition.last_transition_time))
    })?;
    Some((completed, at))
}

fn backup_end(backup: &Backup) -> Option<(bool, f64)> {
    let status = backup.status.as_ref()?;
    ended(
        status.phase == Some(BackupPhase::Completed),
        status.phase == Some(BackupPhase::Failed),
        status.completion_time.as_ref(),
        &status.conditions,
    )
}

fn restore_end(restore: &Restore) -> Option<(bool, f64)> {
    let status = restore.status.as_ref()?;
    ended(
        status.phase == Some(RestorePhase::Completed),
        status.phase == Some(RestorePhase::Failed),
        status.completion_time.as_ref(),
        &status.conditions,
    )
}

fn note(last: &mut Last, success: bool, at: f64) {
    let slot = if success {
        &mut last.success
    } else {
        &mut last.failure
    };
    if slot.is_none_or(|before| at > before) {
        *slot = Some(at);
    }
}

/// The gauges' values from the objects. Imported Backups (another cluster's snapshots) are
/// not this cluster's backups and count for no Cluster.
pub fn summarize(
    clusters: &[Arc<Cluster>],
    backups: &[Arc<Backup>],
    restores: &[Arc<Restore>],
    plans: &[Arc<BackupPlan>],
    agents: &[Arc<NodeAgent>],
) -> Health {
    let mut health = Health::default();
    let key = |namespace: Option<String>, name: String| Key {
        namespace: namespace.unwrap_or_default(),
        name,
    };
    // Only Clusters that exist and plans that exist and run: the Backups of a deleted Cluster
    // or plan (they outlive both) must not keep an alert about it firing forever.
    let existing: BTreeSet<Key> = clusters
        .iter()
        .map(|cluster| key(cluster.namespace(), cluster.name_any()))
        .collect();
    let running: BTreeSet<Key> = plans
        .iter()
        .filter(|plan| !plan.spec.suspend)
        .map(|plan| key(plan.namespace(), plan.name_any()))
        .collect();
    for backup in backups {
        let namespace = backup.namespace().unwrap_or_default();
        if backup.metadata.deletion_timestamp.is_some()
            && backup
                .status
                .as_ref()
                .and_then(|status| status.cleanup.as_ref())
                .is_some_and(|cleanup| cleanup.attempts > 0 && !cleanup.done)
        {
            *health
                .deletions_retrying
                .entry(namespace.clone())
                .or_default() += 1;
        }
        if backup.spec.imported_snapshot.is_some() {
            continue;
        }
        let Some((success, at)) = backup_end(backup) else {
            continue;
        };
        let cluster = Key {
            namespace: namespace.clone(),
            name: backup.spec.cluster_ref.name.clone(),
        };
        if existing.contains(&cluster) {
            note(health.clusters.entry(cluster).or_default(), success, at);
        }
        if let Some(plan) = backup.labels().get(LABEL_PLAN) {
            let plan = Key {
                namespace,
                name: plan.clone(),
            };
            if running.contains(&plan) {
                note(health.plans.entry(plan).or_default(), success, at);
            }
        }
    }
    for plan in plans.iter().filter(|plan| !plan.spec.suspend) {
        if let Some(created) = &plan.metadata.creation_timestamp {
            health
                .plans_created
                .insert(key(plan.namespace(), plan.name_any()), seconds(created));
        }
        // A plan whose drill was taken off keeps no drill series (its alert would never clear).
        let drill = plan
            .status
            .as_ref()
            .and_then(|status| status.drill.as_ref());
        if plan.spec.drill.is_some()
            && let Some(last) = drill.and_then(|drill| drill.last.as_ref())
        {
            health.drills.insert(
                key(plan.namespace(), plan.name_any()),
                Drilled {
                    last: seconds(&last.finished_at),
                    passed: last.result == crate::drills::decide::reasons::PASSED,
                    last_success: drill
                        .and_then(|drill| drill.last_success_time.as_ref())
                        .map(seconds),
                },
            );
        }
    }
    for restore in restores {
        let status = restore.status.as_ref();
        if status.is_some_and(|status| {
            matches!(
                status.phase,
                Some(RestorePhase::Completed | RestorePhase::Failed)
            )
        }) {
            continue;
        }
        let reason = status
            .and_then(|status| ready(&status.conditions))
            .map(|condition| condition.reason.clone())
            .or_else(|| {
                status
                    .and_then(|status| status.phase)
                    .map(|phase| format!("{phase:?}"))
            })
            .unwrap_or_else(|| "Pending".to_string());
        let since = restore
            .metadata
            .creation_timestamp
            .as_ref()
            .map(seconds)
            .unwrap_or_default();
        health.restores_waiting.insert(
            Key {
                namespace: restore.namespace().unwrap_or_default(),
                name: restore.name_any(),
            },
            Waiting { reason, since },
        );
    }
    for agent in agents {
        let status = agent.status.as_ref();
        health.agents.insert(
            agent.name_any(),
            Agent {
                last_heartbeat: status
                    .and_then(|status| status.last_heartbeat_time.as_ref())
                    .map(seconds),
                reporting: status
                    .and_then(|status| ready(&status.conditions))
                    .is_some_and(|condition| condition.status == "True"),
            },
        );
    }
    health
}

/// A Backup or Restore that ended, counted once.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub kind: FinishedKind,
    pub completed: bool,
    /// Its `Ready` condition's reason (`Completed`, or why it failed).
    pub reason: String,
    /// From its start to its end, when both are known.
    pub duration: Option<f64>,
    /// Bytes it read (a backup) or wrote (a restore).
    pub bytes: Option<u64>,
    /// How long a `Frozen` backup held its filesystem frozen.
    pub frozen: Option<f64>,
}

/// Which kind finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishedKind {
    Backup,
    Restore,
}

/// What ended since `since` (Unix seconds) and is not in `counted` (UIDs), which it updates:
/// each Backup and Restore is counted once by the leader that saw it end, never again after a
/// restart (it ended before the new leader's `since`). UIDs of objects gone are forgotten.
pub fn newly_finished(
    backups: &[Arc<Backup>],
    restores: &[Arc<Restore>],
    since: f64,
    counted: &mut BTreeSet<String>,
) -> Vec<Finished> {
    let endings = backups
        .iter()
        .map(|backup| {
            let status = backup.status.as_ref();
            Ending {
                kind: FinishedKind::Backup,
                uid: backup.metadata.uid.as_ref(),
                imported: backup.spec.imported_snapshot.is_some(),
                end: backup_end(backup),
                start: status.and_then(|status| status.start_time.as_ref()),
                conditions: status.map(|status| status.conditions.as_slice()),
                transfer: status.and_then(|status| status.transfer.as_ref()),
                frozen_millis: status.and_then(|status| status.frozen_millis),
            }
        })
        .chain(restores.iter().map(|restore| {
            let status = restore.status.as_ref();
            Ending {
                kind: FinishedKind::Restore,
                uid: restore.metadata.uid.as_ref(),
                imported: false,
                end: restore_end(restore),
                start: status.and_then(|status| status.start_time.as_ref()),
                conditions: status.map(|status| status.conditions.as_slice()),
                transfer: status.and_then(|status| status.transfer.as_ref()),
                frozen_millis: None,
            }
        }));
    let mut present = BTreeSet::new();
    let mut finished = Vec::new();
    for ending in endings {
        let Some(uid) = ending.uid else {
            continue;
        };
        present.insert(uid.clone());
        if ending.imported || counted.contains(uid) {
            continue;
        }
        let Some((completed, at)) = ending.end else {
            continue;
        };
        counted.insert(uid.clone());
        if at < since {
            continue;
        }
        finished.push(Finished {
            kind: ending.kind,
            completed,
            reason: reason(ending.conditions, completed),
            duration: ending
                .start
                .map(|start| at - seconds(start))
                .filter(|duration| *duration >= 0.0),
            bytes: ending
                .transfer
                .filter(|_| completed)
                .map(|transfer| transfer.bytes_done),
            frozen: ending.frozen_millis.map(|millis| millis as f64 / 1000.0),
        });
    }
    counted.retain(|uid| present.contains(uid));
    finished
}

/// What [`newly_finished`] reads of a Backup or a Restore.
struct Ending<'a> {
    kind: FinishedKind,
    uid: Option<&'a String>,
    imported: bool,
    end: Option<(bool, f64)>,
    start: Option<&'a Time>,
    conditions: Option<&'a [Condition]>,
    transfer: Option<&'a custody_kube::api::Transfer>,
    frozen_millis: Option<i64>,
}

fn reason(conditions: Option<&[Condition]>, completed: bool) -> String {
    conditions
        .and_then(ready)
        .map(|condition| condition.reason.clone())
        .filter(|reason| !reason.is_empty())
        .unwrap_or_else(|| if completed { "Completed" } else { "Failed" }.to_string())
}

/// The gauges as the last refresh left them; `None` while this replica does not lead (or has
/// not listed everything yet): no series then.
#[derive(Clone, Debug, Default)]
pub struct Shared(Arc<Mutex<Option<Health>>>);

impl Shared {
    /// Replaces what the gauges say (`None`: no series).
    pub fn set(&self, health: Option<Health>) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = health;
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    namespace: String,
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanLabels {
    namespace: String,
    plan: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestoreLabels {
    namespace: String,
    restore: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitingLabels {
    namespace: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

/// Names of the gauges, without the registry's `custody_` prefix.
pub mod names {
    pub const CLUSTER_LAST_SUCCESS: &str = "cluster_last_successful_backup_timestamp_seconds";
    pub const CLUSTER_LAST_FAILURE: &str = "cluster_last_failed_backup_timestamp_seconds";
    pub const PLAN_LAST_SUCCESS: &str = "plan_last_successful_backup_timestamp_seconds";
    pub const PLAN_LAST_FAILURE: &str = "plan_last_failed_backup_timestamp_seconds";
    pub const PLAN_CREATED: &str = "plan_created_timestamp_seconds";
    pub const RESTORE_WAITING_SINCE: &str = "restore_waiting_since_timestamp_seconds";
    pub const RESTORES_WAITING: &str = "restores_waiting";
    pub const AGENT_LAST_HEARTBEAT: &str = "node_agent_last_heartbeat_timestamp_seconds";
    pub const AGENT_REPORTING: &str = "node_agent_reporting";
    pub const DELETIONS_RETRYING: &str = "artifact_deletions_retrying";
    pub const PLAN_LAST_DRILL: &str = "plan_last_drill_timestamp_seconds";
    pub const PLAN_LAST_DRILL_PASSED: &str = "plan_last_drill_passed";
    pub const PLAN_LAST_SUCCESSFUL_DRILL: &str = "plan_last_successful_drill_timestamp_seconds";
}

fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, f64)>,
) -> Result<(), std::fmt::Error> {
    let rows: Vec<(L, f64)> = rows.into_iter().collect();
    if rows.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Gauge,
    )?;
    for (labels, value) in &rows {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Shared {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let guard = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(health) = guard.as_ref() else {
            return Ok(());
        };
        gauges(
            &mut encoder,
            names::CLUSTER_LAST_SUCCESS,
            "When the Cluster's newest successful Backup completed (Unix seconds)",
            health.clusters.iter().filter_map(|(key, last)| {
                Some((
                    ClusterLabels {
                        namespace: key.namespace.clone(),
                        cluster: key.name.clone(),
                    },
                    last.success?,
                ))
            }),
        )?;
        gauges(
            &mut encoder,
            names::CLUSTER_LAST_FAILURE,
            "When the Cluster's newest failed Backup failed (Unix seconds)",
            health.clusters.iter().filter_map(|(key, last)| {
                Some((
                    ClusterLabels {
                        namespace: key.namespace.clone(),
                        cluster: key.name.clone(),
                    },
                    last.failure?,
                ))
            }),
        )?;
        gauges(
            &mut encoder,
            names::PLAN_LAST_SUCCESS,
            "When the plan's newest successful Backup completed (Unix seconds)",
            health.plans.iter().filter_map(|(key, last)| {
                Some((
                    PlanLabels {
                        namespace: key.namespace.clone(),
                        plan: key.name.clone(),
                    },
                    last.success?,
                ))
            }),
        )?;
        gauges(
            &mut encoder,
            names::PLAN_LAST_FAILURE,
            "When the plan's newest failed Backup failed (Unix seconds)",
            health.plans.iter().filter_map(|(key, last)| {
                Some((
                    PlanLabels {
                        namespace: key.namespace.clone(),
                        plan: key.name.clone(),
                    },
                    last.failure?,
                ))
            }),
        )?;
        let plan_labels = |key: &Key| PlanLabels {
            namespace: key.namespace.clone(),
            plan: key.name.clone(),
        };
        gauges(
            &mut encoder,
            names::PLAN_LAST_DRILL,
            "When the plan's last restore drill ended (Unix seconds)",
            health
                .drills
                .iter()
                .map(|(key, drilled)| (plan_labels(key), drilled.last)),
        )?;
        gauges(
            &mut encoder,
            names::PLAN_LAST_DRILL_PASSED,
            "1 when the plan's last restore drill passed (restored, verified, engine check clean), 0 when it failed",
            health
                .drills
                .iter()
                .map(|(key, drilled)| (plan_labels(key), f64::from(u8::from(drilled.passed)))),
        )?;
        gauges(
            &mut encoder,
            names::PLAN_LAST_SUCCESSFUL_DRILL,
            "When a restore drill of the plan last passed (Unix seconds)",
            health
                .drills
                .iter()
                .filter_map(|(key, drilled)| Some((plan_labels(key), drilled.last_success?))),
        )?;
        gauges(
            &mut encoder,
            names::PLAN_CREATED,
            "When the BackupPlan was created (Unix seconds)",
            health.plans_created.iter().map(|(key, created)| {
                (
                    PlanLabels {
                        namespace: key.namespace.clone(),
                        plan: key.name.clone(),
                    },
                    *created,
                )
            }),
        )?;
        gauges(
            &mut encoder,
            names::RESTORE_WAITING_SINCE,
            "Each unfinished Restore, by the reason it waits: since when it exists (Unix seconds)",
            health.restores_waiting.iter().map(|(key, waiting)| {
                (
                    RestoreLabels {
                        namespace: key.namespace.clone(),
                        restore: key.name.clone(),
                        reason: waiting.reason.clone(),
                    },
                    waiting.since,
                )
            }),
        )?;
        let mut waiting: BTreeMap<(&str, &str), f64> = BTreeMap::new();
        for (key, restore) in &health.restores_waiting {
            *waiting
                .entry((key.namespace.as_str(), restore.reason.as_str()))
                .or_default() += 1.0;
        }
        gauges(
            &mut encoder,
            names::RESTORES_WAITING,
            "Unfinished Restores, by namespace and the reason they wait",
            waiting.into_iter().map(|((namespace, reason), count)| {
                (
                    WaitingLabels {
                        namespace: namespace.to_string(),
                        reason: reason.to_string(),
                    },
                    count,
                )
            }),
        )?;
        gauges(
            &mut encoder,
            names::AGENT_LAST_HEARTBEAT,
            "When the controller last heard from the node's agent (Unix seconds)",
            health.agents.iter().filter_map(|(node, agent)| {
                Some((NodeLabels { node: node.clone() }, agent.last_heartbeat?))
            }),
        )?;
        gauges(
            &mut encoder,
            names::AGENT_REPORTING,
            "1 while the node's agent reports within the timeout (its NodeAgent is Ready), else 0",
            health.agents.iter().map(|(node, agent)| {
                (
                    NodeLabels { node: node.clone() },
                    if agent.reporting { 1.0 } else { 0.0 },
                )
            }),
        )?;
        gauges(
            &mut encoder,
            names::DELETIONS_RETRYING,
            "Backups being deleted whose artifact's delete failed at least once and is retried",
            health.deletions_retrying.iter().map(|(namespace, count)| {
                (
                    NamespaceLabels {
                        namespace: namespace.clone(),
                    },
                    *count as f64,
                )
            }),
        )?;
        Ok(())
    }
}

/// How often the gauges are recomputed.
pub const REFRESH: Duration = Duration::from_secs(5);

/// Watches Clusters, Backups, Restores, BackupPlans and NodeAgents and keeps `shared` (and the finished
/// counters of `metrics`) current, until `stopped`. Run by the leader only.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    shared: Shared,
    metrics: Arc<crate::metrics::Metrics>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (backups, backup_watch) = reflect(crate::reconciler::scoped::<Backup>(
        client.clone(),
        namespace.as_deref(),
    ));
    let (restores, restore_watch) = reflect(crate::reconciler::scoped::<Restore>(
        client.clone(),
        namespace.as_deref(),
    ));
    let (plans, plan_watch) = reflect(crate::reconciler::scoped::<BackupPlan>(
        client.clone(),
        namespace.as_deref(),
    ));
    let (agents, agent_watch) = reflect(Api::<NodeAgent>::all(client.clone()));
    let (clusters, cluster_watch) = reflect(crate::reconciler::scoped::<Cluster>(
        client,
        namespace.as_deref(),
    ));
    let since = Timestamp::now().as_millisecond() as f64 / 1000.0;
    let refresh = async {
        for store in [
            backups.wait_until_ready().boxed(),
            restores.wait_until_ready().boxed(),
            plans.wait_until_ready().boxed(),
            agents.wait_until_ready().boxed(),
            clusters.wait_until_ready().boxed(),
        ] {
            if store.await.is_err() {
                return;
            }
        }
        let mut counted = BTreeSet::new();
        loop {
            let (backups, restores) = (backups.state(), restores.state());
            shared.set(Some(summarize(
                &clusters.state(),
                &backups,
                &restores,
                &plans.state(),
                &agents.state(),
            )));
            for finished in newly_finished(&backups, &restores, since, &mut counted) {
                metrics.finished(&finished);
            }
            tokio::time::sleep(REFRESH).await;
        }
    };
    tokio::select! {
        () = refresh => {}
        () = backup_watch => {}
        () = restore_watch => {}
        () = plan_watch => {}
        () = agent_watch => {}
        () = cluster_watch => {}
        () = stopped => {}
    }
    shared.set(None);
}

fn reflect<K>(api: Api<K>) -> (Store<K>, futures::future::BoxFuture<'static, ()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let watch = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|event| {
            if let Err(error) = event {
                tracing::warn!(%error, "backup health watch");
            }
            futures::future::ready(())
        })
        .boxed();
    (reader, watch)
}
