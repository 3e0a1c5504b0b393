//! Where each restored volume on this node stands, decided from plain data: the workload pods
//! under restore, the prepareData pods writing their volumes, and the verifications the agent
//! has run. No API client here; the daemon feeds it what its pod watch sees.
//!
//! A volume moves `Pending → Restoring → Verifying → Verified | Failed(reason)`. Verification
//! starts only once a prepareData pod for that exact volume and Restore has succeeded, and a
//! result belongs to the prepareData pod whose output it checked: a new attempt (a new pod)
//! is verified afresh.

use custody_proto::reasons::VolumeFailure;
use std::collections::{BTreeMap, BTreeSet};

use custody_proto::names;

/// The pod phases the agent distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not yet running, or running.
    Active,
    Succeeded,
    Failed,
}

impl Phase {
    /// Maps a pod's `status.phase` (absent or unknown counts as still active).
    pub fn of(phase: Option<&str>) -> Phase {
        match phase {
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Active,
        }
    }
}

/// A volume of a workload pod that a Restore writes: the pod stays gated until it is verified.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkloadVolume {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// Name of the volume in the pod spec (its directory under the kubelet root).
    pub volume: String,
    pub claim_name: String,
    /// Name of the Restore (from the pod's annotation) and its UID (from the pod's label).
    pub restore_name: String,
    pub restore_uid: String,
}

/// A prepareData pod: `custody-mover restore` writing one claim for one Restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparePod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub claim_name: String,
    pub restore_uid: String,
    pub phase: Phase,
    /// The pod's own account of a failure (`status.message` or a container's termination
    /// message), when it has one.
    pub message: Option<String>,
    /// It failed with the mover's [`custody_proto::mover::EXIT_PERMANENT`]: trying again
    /// cannot help, and its Job gives up. Any other failure its Job may try again.
    pub permanent: bool,
}

/// What a finished verification found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Verified {
        /// When verification finished, Unix nanoseconds by the agent's clock.
        at_unix_nanos: i64,
        summary: String,
    },
    Failed {
        reason: VolumeFailure,
        message: String,
    },
}

/// A verification of one workload volume against the output of one prepareData pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Started and not finished; `note` says what it waits for, if anything.
    Running {
        note: Option<String>,
    },
    Done(Outcome),
}

/// Which verification: the workload pod's volume, checked after this prepareData pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VerificationKey {
    pub pod_uid: String,
    pub volume: String,
    pub prepare_pod_uid: String,
}

/// Where a volume stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Pending,
    Restoring,
    Verifying,
    Verified {
        at_unix_nanos: i64,
    },
    Failed {
        reason: VolumeFailure,
        message: String,
    },
}

impl State {
    /// The state's name in reports and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            State::Pending => "Pending",
            State::Restoring => "Restoring",
            State::Verifying => "Verifying",
            State::Verified { .. } => "Verified",
            State::Failed { .. } => "Failed",
        }
    }
}

/// The decision for one volume: its state, and the verification to start, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub state: State,
    pub message: String,
    pub start: Option<VerificationKey>,
}

/// What a Restore's status records of one claim (the controller writes it; both are final).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedVolume {
    /// Verified, from an agent's report: it stays verified.
    Verified,
    /// Failed for good, with the controller's reason and message.
    Failed { reason: String, message: String },
}

/// What the Restores' statuses record, by `(namespace, Restore UID, claim)`.
pub type Recorded = BTreeMap<(String, String, String), RecordedVolume>;

/// What the API server said of a gated volume whose Restore is not in the agent's watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Absence {
    /// The agent is asking.
    Asking,
    /// The Restore exists after all (the watch had not seen it yet).
    RestoreExists,
    /// No Restore of that name, or one with another UID (`replaced_by`). `verified`: the claim
    /// carries that Restore's record
    /// ([`custody_proto::names::verified_by_restore`]), so it was verified before the Restore
    /// was deleted.
    RestoreGone {
        replaced_by: Option<String>,
        verified: bool,
    },
}

/// The [`Absence`]s by `(namespace, Restore UID, claim)`.
pub type Absences = BTreeMap<(String, String, String), Absence>;

/// What the agent knows of the Restores its gated pods name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restores {
    /// What their statuses record.
    pub recorded: Recorded,
    /// Those in the agent's watch, by `(namespace, UID)`.
    pub watched: BTreeSet<(String, String)>,
    /// What the API server said of those not in the watch.
    pub absences: Absences,
}

impl Restores {
    /// The key of `volume` in [`Recorded`] and [`Absences`].
    pub fn key(volume: &WorkloadVolume) -> (String, String, String) {
        (
            volume.namespace.clone(),
            volume.restore_uid.clone(),
            volume.claim_name.clone(),
        )
    }

    /// Whether the agent must ask the API server about `volume`'s Restore: it is not in the
    /// watch and nobody asked yet.
    pub fn to_ask(&self, volume: &WorkloadVolume) -> bool {
        !self.is_watched(volume)
            && !self.absences.contains_key(&Self::key(volume))
            && self.recorded.get(&Self::key(volume)) != Some(&RecordedVolume::Verified)
    }

    fn is_watched(&self, volume: &WorkloadVolume) -> bool {
        self.watched
            .contains(&(volume.namespace.clone(), volume.restore_uid.clone()))
    }
}

/// Decides one volume's state.
///
/// A claim the Restore's status records as verified is verified, for good: its pod is released
/// on every later start (an agent restart, init containers run again, the prepareData pod long
/// gone) without reading the volume again, which the application has changed since.
///
/// A claim the Restore's status records as failed is failed unless this agent's own reading
/// already ended (verified or failed): the node then says what the Restore says (its Job gave
/// up, its deadline passed) instead of "restoring" forever, and starts no verification.
///
/// A Restore not in the agent's watch is asked for. One that is gone (deleted, or replaced by
/// another of its name) decides from the claim alone: verified when the claim carries that
/// Restore's record, failed otherwise: nothing will ever write or verify that volume for it,
/// so the pod is neither released onto what the volume holds nor left waiting in silence.
///
/// `prepare` may hold any pods; only those for the same namespace, claim and Restore UID
/// count. A succeeded pod wins over active ones (its output is what the volume holds); among
/// several succeeded pods the one already verified (or being verified) is kept, so that a
/// result is not thrown away, and otherwise the first by name.
pub fn decide(
    volume: &WorkloadVolume,
    prepare: &[PreparePod],
    verifications: &BTreeMap<VerificationKey, Verification>,
    restores: &Restores,
) -> Decision {
    let key = Restores::key(volume);
    let record = restores.recorded.get(&key);
    if record == Some(&RecordedVolume::Verified) {
        return Decision {
            state: State::Verified { at_unix_nanos: 0 },
            message: format!(
                "verified for Restore {} (recorded in its status; not read again)",
                volume.restore_name
            ),
            start: None,
        };
    }
    if !restores.is_watched(volume) {
        match restores.absences.get(&key) {
            None | Some(Absence::Asking) => {
                return Decision {
                    state: State::Pending,
                    message: format!(
                        "Restore {} is not in the agent's watch: asking the API server whether it still exists",
                        volume.restore_name
                    ),
                    start: None,
                };
            }
            Some(Absence::RestoreExists) => {}
            Some(Absence::RestoreGone { verified: true, .. }) => {
                return Decision {
                    state: State::Verified { at_unix_nanos: 0 },
                    message: format!(
                        "verified by Restore {} before it was deleted (annotation {} on claim {}; not read again)",
                        volume.restore_name,
                        names::verified_by_restore(&volume.restore_uid),
                        volume.claim_name
                    ),
                    start: None,
                };
            }
            Some(Absence::RestoreGone {
                verified: false,
                replaced_by,
            }) => {
                let (reason, gone) = match replaced_by {
                    None => (VolumeFailure::RestoreNotFound, "was deleted".to_string()),
                    Some(uid) => (
                        VolumeFailure::RestoreReplaced,
                        format!("was replaced by another of its name (UID {uid})"),
                    ),
                };
                let message = format!(
                    "Restore {} (UID {}) {gone} before it recorded claim {} as verified: what the volume holds is unknown, so the pod is not released. Restore the Cluster again (its pods are held until that Restore verifies), or recreate the pod to run on the volume as it is",
                    volume.restore_name, volume.restore_uid, volume.claim_name
                );
                return Decision {
                    state: State::Failed {
                        reason,
                        message: message.clone(),
                    },
                    message,
                    start: None,
                };
            }
        }
    }
    let decision = from_pods(volume, prepare, verifications);
    match (record, &decision.state) {
        (
            Some(RecordedVolume::Failed { reason, message }),
            State::Pending | State::Restoring | State::Verifying,
        ) => {
            let message = format!(
                "Restore {} failed this volume: {reason}: {message}",
                volume.restore_name
            );
            Decision {
                state: State::Failed {
                    reason: VolumeFailure::RestoreFailed,
                    message: message.clone(),
                },
                message,
                start: None,
            }
        }
        _ => decision,
    }
}

/// What the API server's answers say of `volume`'s Restore: `restore_uid` is the UID of the
/// Restore of its name (`None`: there is none), `claim` the annotations of its claim (`None`:
/// no such claim).
pub fn absence(
    volume: &WorkloadVolume,
    restore_uid: Option<&str>,
    claim: Option<&BTreeMap<String, String>>,
) -> Absence {
    if restore_uid == Some(volume.restore_uid.as_str()) {
        return Absence::RestoreExists;
    }
    Absence::RestoreGone {
        replaced_by: restore_uid.map(str::to_string),
        verified: claim.is_some_and(|annotations| {
            annotations.contains_key(&names::verified_by_restore(&volume.restore_uid))
        }),
    }
}

/// The decision from the prepareData pods and this agent's verifications alone.
fn from_pods(
    volume: &WorkloadVolume,
    prepare: &[PreparePod],
    verifications: &BTreeMap<VerificationKey, Verification>,
) -> Decision {
    let mine: Vec<&PreparePod> = prepare
        .iter()
        .filter(|pod| {
            pod.namespace == volume.namespace
                && pod.claim_name == volume.claim_name
                && pod.restore_uid == volume.restore_uid
        })
        .collect();
    let key_for = |pod: &PreparePod| VerificationKey {
        pod_uid: volume.pod_uid.clone(),
        volume: volume.volume.clone(),
        prepare_pod_uid: pod.uid.clone(),
    };

    let mut succeeded: Vec<&PreparePod> = mine
        .iter()
        .copied()
        .filter(|pod| pod.phase == Phase::Succeeded)
        .collect();
    succeeded.sort_by(|a, b| a.name.cmp(&b.name));
    let chosen = succeeded
        .iter()
        .find(|pod| verifications.contains_key(&key_for(pod)))
        .or(succeeded.first());
    if let Some(pod) = chosen {
        let key = key_for(pod);
        return match verifications.get(&key) {
            None => Decision {
                state: State::Verifying,
                message: format!("prepareData pod {} succeeded; verifying", pod.name),
                start: Some(key),
            },
            Some(Verification::Running { note }) => Decision {
                state: State::Verifying,
                message: note
                    .clone()
                    .unwrap_or_else(|| format!("verifying the output of {}", pod.name)),
                start: None,
            },
            Some(Verification::Done(Outcome::Verified {
                at_unix_nanos,
                summary,
            })) => Decision {
                state: State::Verified {
                    at_unix_nanos: *at_unix_nanos,
                },
                message: summary.clone(),
                start: None,
            },
            Some(Verification::Done(Outcome::Failed { reason, message })) => Decision {
                state: State::Failed {
                    reason: *reason,
                    message: message.clone(),
                },
                message: message.clone(),
                start: None,
            },
        };
    }

    if let Some(pod) = mine.iter().find(|pod| pod.phase == Phase::Active) {
        return Decision {
            state: State::Restoring,
            message: format!("prepareData pod {} is writing the volume", pod.name),
            start: None,
        };
    }
    let failed = |pod: &PreparePod| {
        format!(
            "prepareData pod {} failed: {}",
            pod.name,
            pod.message.as_deref().unwrap_or("no message")
        )
    };
    if let Some(pod) = mine
        .iter()
        .find(|pod| pod.phase == Phase::Failed && pod.permanent)
    {
        let message = failed(pod);
        return Decision {
            state: State::Failed {
                reason: VolumeFailure::PrepareDataFailed,
                message: message.clone(),
            },
            message,
            start: None,
        };
    }
    if let Some(pod) = mine.iter().find(|pod| pod.phase == Phase::Failed) {
        // A failure of the moment: its Job makes another pod, or gives up and the Restore says
        // so. The pod stays held either way.
        return Decision {
            state: State::Restoring,
            message: format!("{} (its Job may try again)", failed(pod)),
            start: None,
        };
    }
    Decision {
        state: State::Pending,
        message: "waiting for the prepareData pod".to_string(),
        start: None,
    }
}

/// The Restore a gated pod waits for, and the claims of the pod it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreTarget {
    pub name: String,
    pub uid: String,
    pub claims: Vec<String>,
}

/// What a pod is held for. A pod with the injected `custody-wait` is under restore for good
/// (its spec cannot change): the Restore and claims come from that container's environment,
/// never from labels or annotations anyone who may patch the pod can remove. A pod admitted
/// by an older webhook (no such environment) falls back to its labels and annotations.
/// `None`: the pod is not under restore. `Err`: it is, and what it waits for cannot be read
/// (it stays held).
pub fn restore_target(
    wait_env: Option<&BTreeMap<String, String>>,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Option<Result<RestoreTarget, String>> {
    let (source, name, uid, claims) = match wait_env {
        Some(env) if env.contains_key(names::ENV_RESTORE_UID) => (
            "custody-wait's environment",
            env.get(names::ENV_RESTORE),
            env.get(names::ENV_RESTORE_UID),
            env.get(names::ENV_RESTORED_CLAIMS),
        ),
        Some(_) | None if annotations.contains_key(names::ANNOTATION_RESTORED_CLAIMS) => (
            "the pod's labels and annotations",
            annotations.get(names::ANNOTATION_RESTORE),
            labels.get(names::LABEL_RESTORE_UID),
            annotations.get(names::ANNOTATION_RESTORED_CLAIMS),
        ),
        Some(_) => {
            return Some(Err(format!(
                "{} names no Restore: the pod stays held",
                names::WAIT_CONTAINER
            )));
        }
        None => return None,
    };
    let read = |value: Option<&String>, what: &str| {
        value
            .filter(|value| !value.trim().is_empty())
            .cloned()
            .ok_or_else(|| format!("{source} names no {what}"))
    };
    let target = (|| {
        let name = read(name, "Restore")?;
        let uid = read(uid, "Restore UID")?;
        let claims: Vec<String> = read(claims, "restored claim")?
            .split(',')
            .map(str::trim)
            .filter(|claim| !claim.is_empty())
            .map(str::to_string)
            .collect();
        if claims.is_empty() {
            return Err(format!("{source} names no restored claim"));
        }
        Ok(RestoreTarget { name, uid, claims })
    })();
    Some(target)
}

/// The restored volumes of a workload pod: each claim of `target` must be mounted by exactly
/// one of the pod's volumes (`claims`: `(volume name, claim name)`), or the pod would be
/// released without that data.
pub fn workload_volumes(
    namespace: &str,
    pod_name: &str,
    pod_uid: &str,
    target: &RestoreTarget,
    claims: &[(String, String)],
) -> Result<Vec<WorkloadVolume>, String> {
    let mut volumes = Vec::new();
    for claim in &target.claims {
        let mounted: Vec<&(String, String)> = claims
            .iter()
            .filter(|(_, claim_name)| claim_name == claim)
            .collect();
        let [(volume, _)] = mounted.as_slice() else {
            return Err(format!(
                "restored claim {claim:?} is mounted by {} volumes of the pod, expected exactly one",
                mounted.len()
            ));
        };
        volumes.push(WorkloadVolume {
            namespace: namespace.to_string(),
            pod_name: pod_name.to_string(),
            pod_uid: pod_uid.to_string(),
            volume: volume.clone(),
            claim_name: claim.clone(),
            restore_name: target.name.clone(),
            restore_uid: target.uid.clone(),
        });
    }
    Ok(volumes)
}

#[cfg(test)]
pub(crate) mod tests;
