//! The Cluster decisions as plain data: what a Cluster under restore shows (phase and the
//! `Restored` and `Ready` conditions) and the order of its teardown.

use crate::conditions::{Desired, Status};
use custody_kube::api::{ClusterPhase, RestorePhase};

/// Finalizer of the cluster-restore reconciler on Clusters with `spec.restore`.
pub const FINALIZER: &str = "custody.io/restore-protection";
/// Condition type: the restore's outcome.
pub const RESTORED: &str = "Restored";
pub use crate::conditions::types::READY;

/// Reasons of a Cluster's conditions.
pub mod reasons {
    pub const RESTORE_CREATED: &str = "RestoreCreated";
    pub const RESTORE_NAME_TAKEN: &str = "RestoreNameTaken";
    pub const RESTORING: &str = "Restoring";
    pub const RESTORED: &str = "Restored";
    pub const RESTORE_FAILED: &str = "RestoreFailed";
    pub const WORKLOAD_READY: &str = "WorkloadReady";
    pub const WORKLOAD_NOT_READY: &str = "WorkloadNotReady";
    pub const STATEFUL_SET_NOT_FOUND: &str = "StatefulSetNotFound";
}

/// The Restore a Cluster created, as far as the Cluster's view needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreFacts {
    /// Created by this Cluster (controller owner reference with its UID).
    pub owned: bool,
    pub phase: Option<RestorePhase>,
    pub progress: Option<String>,
    /// The Restore's `Ready` message when it failed.
    pub failure: Option<String>,
}

/// The StatefulSet as the Cluster's view needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Missing,
    Replicas { wanted: i32, ready: i32 },
}

impl Workload {
    fn ready(self) -> bool {
        matches!(self, Workload::Replicas { wanted, ready } if wanted > 0 && ready >= wanted)
    }
}

/// What a Cluster shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub phase: ClusterPhase,
    /// Only for Clusters with `spec.restore`.
    pub restored: Option<Desired>,
    pub ready: Desired,
}

fn workload_ready(workload: Workload, stateful_set: &str) -> Desired {
    match workload {
        Workload::Missing => Desired {
            type_: READY,
            status: Status::False,
            reason: reasons::STATEFUL_SET_NOT_FOUND,
            message: format!("StatefulSet {stateful_set} does not exist"),
        },
        Workload::Replicas { wanted, ready } if workload.ready() => Desired {
            type_: READY,
            status: Status::True,
            reason: reasons::WORKLOAD_READY,
            message: format!("{ready}/{wanted} replicas ready"),
        },
        Workload::Replicas { wanted, ready } => Desired {
            type_: READY,
            status: Status::False,
            reason: reasons::WORKLOAD_NOT_READY,
            message: format!("{ready}/{wanted} replicas ready"),
        },
    }
}

/// What a Cluster shows. Under restore it is `Running` only when its own Restore is
/// `Completed` (every volume verified) **and** its workload is ready; a failed restore makes
/// it `Failed` with the Restore's reason. Without `spec.restore` it follows its workload.
pub fn view(
    restoring_from: Option<&str>,
    restore_name: &str,
    restore: Option<&RestoreFacts>,
    workload: Workload,
    stateful_set: &str,
) -> View {
    let ready_workload = workload_ready(workload, stateful_set);
    let Some(backup) = restoring_from else {
        return View {
            phase: if workload.ready() {
                ClusterPhase::Running
            } else {
                ClusterPhase::Pending
            },
            restored: None,
            ready: ready_workload,
        };
    };
    let not_ready = |reason: &'static str, message: String| Desired {
        type_: READY,
        status: Status::False,
        reason,
        message,
    };
    let restored = |status, reason: &'static str, message: String| Desired {
        type_: RESTORED,
        status,
        reason,
        message,
    };
    match restore {
        None => {
            let message = format!("creating Restore {restore_name} from Backup {backup}");
            View {
                phase: ClusterPhase::Restoring,
                restored: Some(restored(Status::False, reasons::RESTORING, message.clone())),
                ready: not_ready(reasons::RESTORING, message),
            }
        }
        Some(facts) if !facts.owned => {
            let message = format!(
                "Restore {restore_name} exists but was not created by this Cluster; it is left alone and nothing is restored"
            );
            View {
                phase: ClusterPhase::Failed,
                restored: Some(restored(
                    Status::False,
                    reasons::RESTORE_NAME_TAKEN,
                    message.clone(),
                )),
                ready: not_ready(reasons::RESTORE_NAME_TAKEN, message),
            }
        }
        Some(facts) => match facts.phase {
            Some(RestorePhase::Completed) => {
                let message = format!(
                    "Restore {restore_name} verified every volume ({})",
                    facts.progress.clone().unwrap_or_default()
                );
                let done = restored(Status::True, reasons::RESTORED, message);
                if workload.ready() {
                    View {
                        phase: ClusterPhase::Running,
                        restored: Some(done),
                        ready: ready_workload,
                    }
                } else {
                    View {
                        phase: ClusterPhase::Restoring,
                        restored: Some(done),
                        ready: ready_workload,
                    }
                }
            }
            Some(RestorePhase::Failed) => {
                let message = format!(
                    "Restore {restore_name} failed: {}",
                    facts.failure.clone().unwrap_or_default()
                );
                View {
                    phase: ClusterPhase::Failed,
                    restored: Some(restored(
                        Status::False,
                        reasons::RESTORE_FAILED,
                        message.clone(),
                    )),
                    ready: not_ready(reasons::RESTORE_FAILED, message),
                }
            }
            _ => {
                let message = format!(
                    "Restore {restore_name} from Backup {backup}: {}",
                    facts
                        .progress
                        .clone()
                        .unwrap_or_else(|| "starting".to_string())
                );
                View {
                    phase: ClusterPhase::Restoring,
                    restored: Some(restored(Status::False, reasons::RESTORING, message.clone())),
                    ready: not_ready(reasons::RESTORING, message),
                }
            }
        },
    }
}

/// The next step of a Cluster's teardown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teardown {
    /// Not ours to do: the finalizer is not (or no longer) on the Cluster.
    Nothing,
    /// Delete the Restore this Cluster created.
    DeleteRestore,
    /// The Restore is tearing itself down; wait.
    WaitForRestore,
    /// Everything this Cluster created is gone: remove the finalizer.
    RemoveFinalizer,
}

/// A deleted Cluster cancels its restore: its own Restore is deleted and waited for, then the
/// finalizer goes. A Restore of the same name that the Cluster did not create is not touched.
/// `restore`: `(owned, being deleted)`.
pub fn teardown(finalizer_present: bool, restore: Option<(bool, bool)>) -> Teardown {
    match (finalizer_present, restore) {
        (false, _) => Teardown::Nothing,
        (true, Some((true, false))) => Teardown::DeleteRestore,
        (true, Some((true, true))) => Teardown::WaitForRestore,
        (true, Some((false, _)) | None) => Teardown::RemoveFinalizer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(owned: bool, phase: Option<RestorePhase>) -> RestoreFacts {
        RestoreFacts {
            owned,
            phase,
            progress: Some("1/2 verified".into()),
            failure: Some("claim data-db-0: db/base differs".into()),
        }
    }

    #[test]
    fn cluster_views() {
        use ClusterPhase::*;
        let ready = Workload::Replicas {
            wanted: 2,
            ready: 2,
        };
        let half = Workload::Replicas {
            wanted: 2,
            ready: 1,
        };
        // (name, restore spec, restore, workload) -> (phase, Restored status, Ready status, Ready reason)
        type Row<'a> = (
            &'a str,
            Option<&'a str>,
            Option<RestoreFacts>,
            Workload,
            ClusterPhase,
            Option<Status>,
            Status,
            &'a str,
        );
        let rows: Vec<Row> = vec![
            (
                "plain, ready",
                None,
                None,
                ready,
                Running,
                None,
                Status::True,
                reasons::WORKLOAD_READY,
            ),
            (
                "plain, not ready",
                None,
                None,
                half,
                Pending,
                None,
                Status::False,
                reasons::WORKLOAD_NOT_READY,
            ),
            (
                "plain, no StatefulSet",
                None,
                None,
                Workload::Missing,
                Pending,
                None,
                Status::False,
                reasons::STATEFUL_SET_NOT_FOUND,
            ),
            (
                "restore not created yet",
                Some("b"),
                None,
                ready,
                Restoring,
                Some(Status::False),
                Status::False,
                reasons::RESTORING,
            ),
            (
                "restore pending, workload ready: still Restoring",
                Some("b"),
                Some(facts(true, Some(RestorePhase::Pending))),
                ready,
                Restoring,
                Some(Status::False),
                Status::False,
                reasons::RESTORING,
            ),
            (
                "restore running, workload ready: still Restoring",
                Some("b"),
                Some(facts(true, Some(RestorePhase::Running))),
                ready,
                Restoring,
                Some(Status::False),
                Status::False,
                reasons::RESTORING,
            ),
            (
                "restore completed, workload not ready",
                Some("b"),
                Some(facts(true, Some(RestorePhase::Completed))),
                half,
                Restoring,
                Some(Status::True),
                Status::False,
                reasons::WORKLOAD_NOT_READY,
            ),
            (
                "restore completed, workload ready: Running",
                Some("b"),
                Some(facts(true, Some(RestorePhase::Completed))),
                ready,
                Running,
                Some(Status::True),
                Status::True,
                reasons::WORKLOAD_READY,
            ),
            (
                "restore failed, workload ready: Failed",
                Some("b"),
                Some(facts(true, Some(RestorePhase::Failed))),
                ready,
                Failed,
                Some(Status::False),
                Status::False,
                reasons::RESTORE_FAILED,
            ),
            (
                "someone else's Restore of that name",
                Some("b"),
                Some(facts(false, Some(RestorePhase::Completed))),
                ready,
                Failed,
                Some(Status::False),
                Status::False,
                reasons::RESTORE_NAME_TAKEN,
            ),
        ];
        for (name, spec, restore, workload, phase, restored, ready_status, ready_reason) in rows {
            let view = view(spec, "db", restore.as_ref(), workload, "db");
            assert_eq!(view.phase, phase, "{name}: phase");
            assert_eq!(
                view.restored.as_ref().map(|c| c.status),
                restored,
                "{name}: Restored"
            );
            assert_eq!(view.ready.status, ready_status, "{name}: Ready");
            assert_eq!(view.ready.reason, ready_reason, "{name}: Ready reason");
        }
        let failed = view(
            Some("b"),
            "db",
            Some(&facts(true, Some(RestorePhase::Failed))),
            ready,
            "db",
        );
        assert!(
            failed.ready.message.contains("db/base differs"),
            "{}",
            failed.ready.message
        );
    }

    #[test]
    fn teardown_order() {
        use Teardown::*;
        let rows = [
            ("finalizer gone", false, Some((true, false)), Nothing),
            (
                "own Restore there",
                true,
                Some((true, false)),
                DeleteRestore,
            ),
            (
                "own Restore going",
                true,
                Some((true, true)),
                WaitForRestore,
            ),
            ("own Restore gone", true, None, RemoveFinalizer),
            (
                "someone else's Restore is not touched",
                true,
                Some((false, false)),
                RemoveFinalizer,
            ),
        ];
        for (name, finalizer, restore, expected) in rows {
            assert_eq!(teardown(finalizer, restore), expected, "{name}");
        }
    }
}
