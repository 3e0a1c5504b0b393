//! What the agent's tasks share: the pods of this node and the Restores as the watches see
//! them, the verifications run so far, and the node's view that the gate and the reports read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use custody_kube::api::{Restore, VolumeState};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio::sync::{Notify, watch};

use crate::cli::AgentOptions;
use crate::metrics::{Metrics, StateLabels};
use crate::node::{self, NodeView, Start};
use crate::volume_state::{
    Absence, Absences, Recorded, RecordedVolume, Restores, Verification, VerificationKey,
    WorkloadVolume,
};

/// What the controller last said of the gate certificate (its latest answer, not the highest
/// ever: a value it took back is not kept).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Told {
    /// Certificates issued before this (Unix seconds) are to be replaced.
    pub reissue_after: i64,
    /// The CA that signs now; empty when not said.
    pub signing_ca: String,
}

/// Everything the agent's tasks share.
pub struct Agent {
    pub client: Client,
    pub options: AgentOptions,
    pub pods: Store<Pod>,
    /// Every Restore: the verifications their statuses record.
    pub restores: Store<Restore>,
    pub metrics: Arc<Metrics>,
    pub(crate) verifications: Mutex<BTreeMap<VerificationKey, Verification>>,
    /// What the API server said of Restores that gated pods name and the watch does not hold.
    pub(crate) absences: Mutex<Absences>,
    pub(crate) changed: Notify,
    pub(crate) view: watch::Sender<Arc<NodeView>>,
    /// Which watches have listed everything: the node's pods, the Restores. (The reflector's
    /// own readiness wakes only one waiter, and several tasks wait here.)
    pub(crate) synced: watch::Sender<Synced>,
    /// The gate's certificate in force (renewed in place).
    pub gate_certificate: Arc<custody_kube::tls::Swap>,
    /// What the controller last said about gate certificates to replace.
    pub renewal: Mutex<Told>,
    /// The report service's CA bundle (PEM) as last read ([`crate::report::follow_trust`]).
    pub report_trust: watch::Sender<Option<Vec<u8>>>,
    /// How far the movers on the node have come ([`crate::movers::follow`]).
    pub movers: watch::Sender<Vec<custody_proto::report::MoverProgress>>,
}

/// Which of the agent's watches have listed everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub pods: bool,
    pub restores: bool,
}

/// One of the agent's watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    Pods,
    Restores,
}

/// The claims the Restores' statuses record as verified or failed.
pub fn recorded<'a>(restores: impl IntoIterator<Item = &'a Restore>) -> Recorded {
    restores
        .into_iter()
        .flat_map(|restore| {
            let namespace = restore.metadata.namespace.clone().unwrap_or_default();
            let uid = restore.metadata.uid.clone().unwrap_or_default();
            restore
                .status
                .iter()
                .flat_map(|status| status.volumes.iter())
                .filter_map(move |volume| {
                    let record = match volume.state {
                        VolumeState::Verified => RecordedVolume::Verified,
                        VolumeState::Failed => RecordedVolume::Failed {
                            reason: volume.reason.clone().unwrap_or_default(),
                            message: volume.message.clone().unwrap_or_default(),
                        },
                        _ => return None,
                    };
                    let key = (namespace.clone(), uid.clone(), volume.claim_name.clone());
                    Some((key, record))
                })
        })
        .collect()
}

impl Agent {
    /// The agent's state before the pod watch has listed anything.
    pub fn new(
        client: Client,
        options: AgentOptions,
        pods: Store<Pod>,
        restores: Store<Restore>,
    ) -> Agent {
        Agent {
            client,
            options,
            pods,
            restores,
            metrics: Arc::new(Metrics::default()),
            verifications: Mutex::new(BTreeMap::new()),
            absences: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
            view: watch::channel(Arc::new(NodeView::default())).0,
            synced: watch::channel(Synced::default()).0,
            gate_certificate: Default::default(),
            renewal: Default::default(),
            report_trust: watch::channel(None).0,
            movers: watch::channel(Vec::new()).0,
        }
    }

    /// The latest view of the node.
    pub fn subscribe(&self) -> watch::Receiver<Arc<NodeView>> {
        self.view.subscribe()
    }

    /// Waits until the watches have listed the node's pods and the Restores (before that, a
    /// volume whose verification a Restore records could be verified again); false when the
    /// agent stops.
    pub async fn wait_until_synced(&self) -> bool {
        self.synced
            .subscribe()
            .wait_for(|synced| synced.pods && synced.restores)
            .await
            .is_ok()
    }

    /// Something changed: the node's view is computed again.
    pub fn wake(&self) {
        self.changed.notify_one();
    }

    /// A watch has listed everything.
    pub fn mark_synced(&self, watch: Watch) {
        self.synced.send_modify(|synced| match watch {
            Watch::Pods => synced.pods = true,
            Watch::Restores => synced.restores = true,
        });
    }

    /// Waits for a change, then computes the node's view again and publishes it; the
    /// verifications to start now come back (already recorded as running), with the volumes
    /// whose Restore the API server must be asked about (already recorded as asking). `None`
    /// when the agent stops.
    pub async fn next_starts(&self) -> Option<(Vec<Start>, Vec<WorkloadVolume>)> {
        self.changed.notified().await;
        if !self.wait_until_synced().await {
            return None;
        }
        let pods = self.pods.state();
        let known = self.restores.state();
        let watched: BTreeSet<(String, String)> = known
            .iter()
            .map(|restore| {
                (
                    restore.metadata.namespace.clone().unwrap_or_default(),
                    restore.metadata.uid.clone().unwrap_or_default(),
                )
            })
            .collect();
        let mut absences = self.absences.lock().expect("not poisoned");
        // What was asked of a Restore the watch now holds is out of date.
        absences
            .retain(|(namespace, uid, _), _| !watched.contains(&(namespace.clone(), uid.clone())));
        let mut restores = Restores {
            recorded: recorded(known.iter().map(AsRef::as_ref)),
            watched,
            absences: std::mem::take(&mut *absences),
        };
        let mut verifications = self.verifications.lock().expect("not poisoned");
        let (mut view, starts) =
            node::compute(pods.iter().map(AsRef::as_ref), &verifications, &restores);
        // Forget verifications of pods that left the node, and what was asked for them.
        verifications.retain(|key, _| view.pods.contains(&key.pod_uid));
        let gated: Vec<&WorkloadVolume> = view
            .gated
            .values()
            .flat_map(|pod| &pod.volumes)
            .map(|volume| &volume.volume)
            .collect();
        let asked: BTreeSet<_> = gated.iter().map(|volume| Restores::key(volume)).collect();
        restores.absences.retain(|key, _| asked.contains(key));
        let asks: Vec<WorkloadVolume> = gated
            .into_iter()
            .filter(|volume| restores.to_ask(volume))
            .cloned()
            .collect();
        for volume in &asks {
            restores
                .absences
                .insert(Restores::key(volume), Absence::Asking);
        }
        if !starts.is_empty() {
            for start in &starts {
                verifications.insert(start.key.clone(), Verification::Running { note: None });
            }
            view = node::compute(pods.iter().map(AsRef::as_ref), &verifications, &restores).0;
        }
        *absences = restores.absences;
        drop(absences);
        self.publish(view);
        Some((starts, asks))
    }

    /// Records what the API server said of a gated volume's Restore (`None`: asking failed,
    /// ask again), and wakes the view.
    pub fn answer(&self, volume: &WorkloadVolume, absence: Option<Absence>) {
        let mut absences = self.absences.lock().expect("not poisoned");
        let key = Restores::key(volume);
        match absence {
            Some(absence) => {
                absences.insert(key, absence);
            }
            None => {
                absences.remove(&key);
            }
        }
        drop(absences);
        self.changed.notify_one();
    }

    fn publish(&self, view: NodeView) {
        let counts = view.counts();
        for state in ["Pending", "Restoring", "Verifying", "Verified", "Failed"] {
            self.metrics
                .volumes
                .get_or_create(&StateLabels { state })
                .set(counts.get(state).copied().unwrap_or(0) as i64);
        }
        self.view.send_if_modified(|current| {
            if **current == view {
                return false;
            }
            *current = Arc::new(view);
            true
        });
    }

    /// Records how a verification stands, and wakes the view.
    pub fn record(&self, key: &VerificationKey, verification: Verification) {
        let mut verifications = self.verifications.lock().expect("not poisoned");
        // A pod that left the node while its volume was verified has no entry any more.
        if let Some(entry) = verifications.get_mut(key) {
            *entry = verification;
        }
        drop(verifications);
        self.changed.notify_one();
    }

    /// Records what a running verification waits for.
    pub fn note(&self, key: &VerificationKey, note: String) {
        self.record(key, Verification::Running { note: Some(note) });
    }
}

#[cfg(test)]
mod tests;
