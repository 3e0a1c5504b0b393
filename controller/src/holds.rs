//! Backups and restores of one Cluster never overlap. Two checks and one claim, as pure
//! functions:
//!
//! - a Backup that has not started waits while a Restore that is not terminal targets its
//!   Cluster (`RestoreInProgress`); a Restore that has not started waits while a Backup of its
//!   Cluster runs (`BackupInProgress`); a run already going is never interrupted;
//! - whichever starts first takes the Cluster's claim, a coordination Lease named after the
//!   Cluster's UID, read and written without a cache: two runs that both passed their check at
//!   the same moment cannot both take it. The Leases live in custody's own namespace (the
//!   controller's), not the Cluster's: custody may write Leases there only, never in users'
//!   namespaces nor in `kube-system` or `kube-node-lease`.

/// Lease name prefix; the Cluster's UID follows.
pub const LEASE_PREFIX: &str = "custody-run-";
/// Reasons of the waiting runs' `Ready=False`.
pub const RESTORE_IN_PROGRESS: &str = "RestoreInProgress";
pub const BACKUP_IN_PROGRESS: &str = "BackupInProgress";
pub const CLUSTER_BUSY: &str = "ClusterBusy";

/// The Lease that claims a Cluster for one run at a time.
pub fn lease_name(cluster_uid: &str) -> String {
    format!("{LEASE_PREFIX}{cluster_uid}")
}

/// The holder identity of a run in the Lease: `Backup/<uid>` or `Restore/<uid>`.
pub fn holder(kind: &str, uid: &str) -> String {
    format!("{kind}/{uid}")
}

/// What a run does with its Cluster's coordination Lease in one reconciliation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseStep {
    /// Nothing.
    Keep,
    /// Take it before anything starts; when another run holds it, wait instead.
    TakeFirst,
    /// The run is over: give it back.
    Release,
}

/// Another run of the same Cluster, as the checks see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run<'a> {
    pub name: &'a str,
    /// Started: its Job exists or its status says it runs.
    pub started: bool,
    /// Completed or Failed (or being deleted).
    pub terminal: bool,
}

/// Whether a run must wait, and for whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    Free,
    Wait {
        reason: &'static str,
        message: String,
    },
}

/// A Backup that has not started waits for every Restore of its Cluster that is not terminal,
/// started or not (a restore in progress owns the volumes: its pods are gated and the data is
/// incomplete).
pub fn backup_hold(cluster: &str, restores: &[Run<'_>]) -> Hold {
    match restores.iter().find(|restore| !restore.terminal) {
        Some(restore) => Hold::Wait {
            reason: RESTORE_IN_PROGRESS,
            message: format!(
                "Restore {} of Cluster {cluster} is in progress; the backup starts once it ends (a restore that cannot end is cleared by deleting it: kubectl delete restore {})",
                restore.name, restore.name
            ),
        },
        None => Hold::Free,
    }
}

/// A Restore that has not started waits for every started Backup of its Cluster that is not
/// terminal (a Backup that has not started yields to the restore instead).
pub fn restore_hold(cluster: &str, backups: &[Run<'_>]) -> Hold {
    match backups
        .iter()
        .find(|backup| backup.started && !backup.terminal)
    {
        Some(backup) => Hold::Wait {
            reason: BACKUP_IN_PROGRESS,
            message: format!(
                "Backup {} of Cluster {cluster} is running; the restore starts once it ends",
                backup.name
            ),
        },
        None => Hold::Free,
    }
}

/// What to do with the Cluster's Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// No Lease: create it with this run as holder.
    Create,
    /// This run holds it.
    Held,
    /// The holder's run is over (terminal or gone): take it over (an update guarded by the
    /// Lease's resourceVersion).
    TakeOver,
    /// Another live run holds it.
    Wait { holder: String },
}

/// `current`: the Lease's holder, if the Lease exists; `holder_live`: whether the run it names
/// still exists and is not terminal.
pub fn claim(current: Option<&str>, me: &str, holder_live: bool) -> Claim {
    match current {
        None => Claim::Create,
        Some(holder) if holder == me => Claim::Held,
        Some(_) if !holder_live => Claim::TakeOver,
        Some(holder) => Claim::Wait {
            holder: holder.to_string(),
        },
    }
}

pub mod lease;

#[cfg(test)]
mod tests;
