//! The agent's view of its node: which pods are gated, and where each of their restored
//! volumes stands. Computed from the pods the watch sees and the verifications run so far;
//! the gate and the reporter read the latest view.

use custody_proto::reasons::VolumeFailure;
use std::collections::{BTreeMap, BTreeSet};

use custody_proto::gate::{VolumeProgress, VolumeState, WaitProgress};
use custody_proto::names;
use k8s_openapi::api::core::v1::Pod;

use crate::volume_state::{
    self, Decision, Phase, PreparePod, Restores, State, Verification, VerificationKey,
};

/// One restored volume of a gated pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeView {
    pub volume: volume_state::WorkloadVolume,
    pub state: State,
    pub message: String,
}

/// A pod under restore on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatedPod {
    pub namespace: String,
    pub name: String,
    pub volumes: Vec<VolumeView>,
    /// Set when what the pod waits for cannot be read; the pod stays gated.
    pub problem: Option<String>,
}

impl GatedPod {
    /// True when every restored volume is verified.
    pub fn released(&self) -> bool {
        self.problem.is_none()
            && self
                .volumes
                .iter()
                .all(|volume| matches!(volume.state, State::Verified { .. }))
    }

    /// When the last volume was verified, once released.
    pub fn verified_at(&self) -> Option<i64> {
        if !self.released() {
            return None;
        }
        self.volumes
            .iter()
            .filter_map(|volume| match volume.state {
                State::Verified { at_unix_nanos } => Some(at_unix_nanos),
                _ => None,
            })
            .max()
    }

    /// The gate's answer for this pod.
    pub fn progress(&self) -> WaitProgress {
        let mut volumes: Vec<VolumeProgress> = self.volumes.iter().map(volume_progress).collect();
        if let Some(problem) = &self.problem {
            volumes.push(VolumeProgress {
                volume: String::new(),
                claim_name: String::new(),
                state: VolumeState::Failed as i32,
                reason: VolumeFailure::InvalidRestoreAnnotations.to_string(),
                message: problem.clone(),
            });
        }
        WaitProgress {
            pod: format!("{}/{}", self.namespace, self.name),
            volumes,
            released: self.released(),
            verified_at_unix_nanos: self.verified_at().unwrap_or(0),
        }
    }
}

/// The wire form of a state.
pub fn wire_state(state: &State) -> VolumeState {
    match state {
        State::Pending => VolumeState::Pending,
        State::Restoring => VolumeState::Restoring,
        State::Verifying => VolumeState::Verifying,
        State::Verified { .. } => VolumeState::Verified,
        State::Failed { .. } => VolumeState::Failed,
    }
}

fn volume_progress(view: &VolumeView) -> VolumeProgress {
    VolumeProgress {
        volume: view.volume.volume.clone(),
        claim_name: view.volume.claim_name.clone(),
        state: wire_state(&view.state) as i32,
        reason: match &view.state {
            State::Failed { reason, .. } => reason.to_string(),
            _ => String::new(),
        },
        message: view.message.clone(),
    }
}

/// Everything the agent knows about its node at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Every pod on the node, by UID, gated or not.
    pub pods: BTreeSet<String>,
    /// Pods under restore, by UID.
    pub gated: BTreeMap<String, GatedPod>,
}

impl NodeView {
    /// The gate's answer for pod `uid`: `None` when the pod is not on this node (any more).
    pub fn progress(&self, uid: &str, namespace: &str, name: &str) -> Option<WaitProgress> {
        if let Some(gated) = self.gated.get(uid) {
            return Some(gated.progress());
        }
        self.pods.contains(uid).then(|| WaitProgress {
            pod: format!("{namespace}/{name}"),
            volumes: Vec::new(),
            released: true,
            verified_at_unix_nanos: 0,
        })
    }

    /// Volumes on the node counted by state name.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for volume in self.gated.values().flat_map(|pod| &pod.volumes) {
            *counts.entry(volume.state.name()).or_default() += 1;
        }
        counts
    }
}

/// A verification the daemon must start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub key: VerificationKey,
    pub volume: volume_state::WorkloadVolume,
}

fn claims_of(pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter_map(|volume| {
            let claim = volume.persistent_volume_claim.as_ref()?;
            Some((volume.name.clone(), claim.claim_name.clone()))
        })
        .collect()
}

fn failure_message(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|container| container.state.as_ref()?.terminated.as_ref())
        .find(|terminated| terminated.exit_code != 0)
        .map(|terminated| {
            format!(
                "exit code {}{}",
                terminated.exit_code,
                terminated
                    .message
                    .as_deref()
                    .map(|message| format!(": {}", message.trim()))
                    .unwrap_or_default()
            )
        });
    terminated.or_else(|| status.message.clone())
}

/// Whether a container of `pod` ended with exit code `code`.
fn exited(pod: &Pod, code: u8) -> bool {
    pod.status
        .iter()
        .flat_map(|status| status.container_statuses.iter().flatten())
        .filter_map(|container| container.state.as_ref()?.terminated.as_ref())
        .any(|terminated| terminated.exit_code == i32::from(code))
}

/// The prepareData pods among `pods`, one entry per claim they mount.
pub fn prepare_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<PreparePod> {
    let mut found = Vec::new();
    for pod in pods {
        let labels = pod.metadata.labels.as_ref();
        let label = |key: &str| labels.and_then(|labels| labels.get(key)).cloned();
        if label(names::LABEL_ROLE).as_deref() != Some(names::ROLE_PREPARE_DATA) {
            continue;
        }
        let Some(restore_uid) = label(names::LABEL_RESTORE_UID) else {
            continue;
        };
        for (_, claim_name) in claims_of(pod) {
            found.push(PreparePod {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                claim_name,
                restore_uid: restore_uid.clone(),
                phase: Phase::of(pod.status.as_ref().and_then(|s| s.phase.as_deref())),
                message: failure_message(pod),
                permanent: exited(pod, custody_proto::mover::EXIT_PERMANENT),
            });
        }
    }
    found
}

/// The plain environment values of the pod's injected `custody-wait` container, if it has one.
fn wait_env(pod: &Pod) -> Option<BTreeMap<String, String>> {
    let container = pod
        .spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|container| container.name == names::WAIT_CONTAINER)?;
    Some(
        container
            .env
            .iter()
            .flatten()
            .filter_map(|variable| Some((variable.name.clone(), variable.value.clone()?)))
            .collect(),
    )
}

/// Computes the view of the node from its pods, the verifications so far and what is known of
/// the Restores, and the verifications to start.
pub fn compute<'a>(
    pods: impl IntoIterator<Item = &'a Pod> + Clone,
    verifications: &BTreeMap<VerificationKey, Verification>,
    restores: &Restores,
) -> (NodeView, Vec<Start>) {
    let prepare = prepare_pods(pods.clone());
    let mut view = NodeView::default();
    let mut starts = Vec::new();
    for pod in pods {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        view.pods.insert(uid.clone());
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
        let Some(target) =
            volume_state::restore_target(wait_env(pod).as_ref(), labels, annotations)
        else {
            continue;
        };
        let mut gated = GatedPod {
            namespace: namespace.clone(),
            name: name.clone(),
            volumes: Vec::new(),
            problem: None,
        };
        match target.and_then(|target| {
            volume_state::workload_volumes(&namespace, &name, &uid, &target, &claims_of(pod))
        }) {
            Err(problem) => gated.problem = Some(problem),
            Ok(volumes) => {
                for volume in volumes {
                    let Decision {
                        state,
                        message,
                        start,
                    } = volume_state::decide(&volume, &prepare, verifications, restores);
                    if let Some(key) = start {
                        starts.push(Start {
                            key,
                            volume: volume.clone(),
                        });
                    }
                    gated.volumes.push(VolumeView {
                        volume,
                        state,
                        message,
                    });
                }
            }
        }
        view.gated.insert(uid, gated);
    }
    (view, starts)
}

#[cfg(test)]
mod tests;
