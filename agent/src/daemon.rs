//! The agent process: watch this node's pods, keep each restored volume's state, verify
//! volumes once their prepareData pod has succeeded, serve the gate and report to the
//! controller.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use custody_kube::api::{Backup, Restore};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};

use crate::cli::AgentOptions;
use crate::metrics::{self, Metrics, StateLabels};
use crate::node::{self, NodeView, Start};
use crate::restores::{Outcome, Verification, VerificationKey};
use crate::verify::{self, Expected};
use crate::volumes;

/// Everything the agent's tasks share.
pub struct Agent {
    pub client: Client,
    pub options: AgentOptions,
    pub pods: Store<Pod>,
    pub metrics: Arc<Metrics>,
    verifications: Mutex<BTreeMap<VerificationKey, Verification>>,
    changed: Notify,
    view: watch::Sender<Arc<NodeView>>,
    /// Set once the pod watch has listed the node's pods. (The reflector's own readiness
    /// wakes only one waiter, and several tasks wait here.)
    synced: watch::Sender<bool>,
}

/// The agent's errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Setup(#[from] custody_kube::Error),
    #[error("reading {path}: {source}")]
    ReadTls {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the gate on {address}: {source}")]
    ServeGate {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
}

pub use custody_proto::clock::now_unix_nanos;
use custody_proto::reasons::VolumeFailure;

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(options: AgentOptions) -> Result<(), Error> {
    let client = custody_kube::process::client(options.kubeconfig.as_deref()).await?;
    let (reader, writer) = reflector::store::<Pod>();
    let (view, _) = watch::channel(Arc::new(NodeView::default()));
    let agent = Arc::new(Agent {
        client: client.clone(),
        options: options.clone(),
        pods: reader,
        metrics: Arc::new(Metrics::default()),
        verifications: Mutex::new(BTreeMap::new()),
        changed: Notify::new(),
        view,
        synced: watch::channel(false).0,
    });
    tracing::info!(node = options.node_name, kubelet_root = %options.kubelet_root.display(), "starting");

    let stop = custody_kube::process::wait_for_signal().boxed().shared();

    // Only this node's pods: the field selector keeps the watch (and the agent's memory)
    // proportional to one node.
    let pods: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={}", options.node_name);
    let watch = {
        let agent = agent.clone();
        watcher(pods, watcher::Config::default().fields(&selector))
            .default_backoff()
            .modify(|pod| {
                pod.managed_fields_mut().clear();
            })
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    Ok(event) => {
                        if matches!(event, watcher::Event::InitDone) {
                            agent.synced.send_replace(true);
                        }
                        agent.changed.notify_one()
                    }
                    Err(error) => tracing::warn!(%error, "pod watch"),
                }
                futures::future::ready(())
            })
    };

    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let health = custody_kube::http::Health {
        metrics: agent.metrics.clone(),
        ready: ready.clone(),
    };
    tokio::spawn({
        let agent = agent.clone();
        async move {
            if agent.wait_until_synced().await {
                ready.store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::info!("pod watch synced");
            }
        }
    });

    let result = tokio::select! {
        _ = stop.clone() => Ok(()),
        _ = watch => Ok(()),
        _ = agent.clone().maintain() => Ok(()),
        served = custody_kube::http::serve(options.http_address, health, stop.clone()) => served.map_err(Error::from),
        served = crate::gate::serve(agent.clone(), stop.clone()) => served,
        _ = crate::report::run(agent.clone()) => Ok(()),
    };
    tracing::info!("stopped");
    result
}

impl Agent {
    /// The latest view of the node.
    pub fn subscribe(&self) -> watch::Receiver<Arc<NodeView>> {
        self.view.subscribe()
    }

    /// Waits until the pod watch has listed the node's pods; false when the agent stops.
    pub async fn wait_until_synced(&self) -> bool {
        self.synced
            .subscribe()
            .wait_for(|synced| *synced)
            .await
            .is_ok()
    }

    /// Recomputes the view whenever something changed, and starts verifications.
    async fn maintain(self: Arc<Self>) {
        loop {
            self.changed.notified().await;
            if !self.wait_until_synced().await {
                return;
            }
            let pods = self.pods.state();
            let starts = {
                let mut verifications = self.verifications.lock().expect("not poisoned");
                let (mut view, starts) =
                    node::compute(pods.iter().map(AsRef::as_ref), &verifications);
                // Forget verifications of pods that left the node.
                verifications.retain(|key, _| view.pods.contains(&key.pod_uid));
                if !starts.is_empty() {
                    for start in &starts {
                        verifications
                            .insert(start.key.clone(), Verification::Running { note: None });
                    }
                    view = node::compute(pods.iter().map(AsRef::as_ref), &verifications).0;
                }
                self.publish(view);
                starts
            };
            for start in starts {
                tracing::info!(
                    namespace = start.volume.namespace,
                    pod = start.volume.pod_name,
                    volume = start.volume.volume,
                    claim = start.volume.claim_name,
                    prepare_pod = start.key.prepare_pod_uid,
                    "verification started"
                );
                tokio::spawn(self.clone().verify(start));
            }
        }
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

    fn record(&self, key: &VerificationKey, verification: Verification) {
        let mut verifications = self.verifications.lock().expect("not poisoned");
        // A pod that left the node while its volume was verified has no entry any more.
        if let Some(entry) = verifications.get_mut(key) {
            *entry = verification;
        }
        drop(verifications);
        self.changed.notify_one();
    }

    async fn verify(self: Arc<Self>, start: Start) {
        let started = Instant::now();
        let outcome = self.verification(&start).await;
        let (reason, level_failed) = match &outcome {
            Outcome::Verified { .. } => ("Verified", false),
            Outcome::Failed { reason, .. } => (reason.as_str(), true),
        };
        metrics::count(&self.metrics.verifications, reason);
        self.metrics
            .verification_duration
            .observe(started.elapsed().as_secs_f64());
        let volume = &start.volume;
        match &outcome {
            Outcome::Failed { message, .. } if level_failed => tracing::warn!(
                namespace = volume.namespace,
                pod = volume.pod_name,
                volume = volume.volume,
                claim = volume.claim_name,
                reason,
                message,
                "verification failed"
            ),
            _ => tracing::info!(
                namespace = volume.namespace,
                pod = volume.pod_name,
                volume = volume.volume,
                claim = volume.claim_name,
                seconds = started.elapsed().as_secs_f64(),
                "volume verified"
            ),
        }
        self.record(&start.key, Verification::Done(outcome));
    }

    fn note(&self, key: &VerificationKey, note: String) {
        self.record(key, Verification::Running { note: Some(note) });
    }

    async fn verification(&self, start: &Start) -> Outcome {
        let expected = loop {
            match self.expected(&start.volume).await {
                Ok(expected) => break expected,
                Err(Lookup::Refused { reason, message }) => {
                    return Outcome::Failed { reason, message };
                }
                Err(Lookup::Unavailable(error)) => {
                    self.note(
                        &start.key,
                        format!("reading the Restore and Backup: {error}"),
                    );
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        };

        // The kubelet names a claim's directory after the PersistentVolume bound to it; only
        // a volume without one (inline, ephemeral) goes by the pod's volume name.
        let directory = self.volume_directory(&start.volume).await;
        // The kubelet may still be mounting the workload pod's volume.
        let deadline = Instant::now() + self.options.mount_wait;
        let path = loop {
            let found = volumes::find_volume(
                &self.options.kubelet_root,
                &start.volume.pod_uid,
                &directory,
            )
            .and_then(|path| volumes::ensure_mounted(&path));
            match found {
                Ok(path) => break path,
                Err(error) if Instant::now() < deadline => {
                    self.note(&start.key, format!("waiting for the volume: {error}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => {
                    return Outcome::Failed {
                        reason: error.reason(),
                        message: error.to_string(),
                    };
                }
            }
        };
        self.note(&start.key, format!("verifying {}", path.display()));

        let checked = tokio::task::spawn_blocking(move || {
            verify::verify_tree(&path, &expected, verify::Options::default())
        })
        .await;
        match checked {
            Ok(Ok(verified)) => {
                self.metrics.verified_bytes.inc_by(verified.bytes);
                Outcome::Verified {
                    at_unix_nanos: now_unix_nanos(),
                    summary: format!(
                        "verified {} entries, {} files, {} bytes",
                        verified.entries, verified.files, verified.bytes
                    ),
                }
            }
            Ok(Err(failure)) => Outcome::Failed {
                reason: failure.reason(),
                message: failure.to_string(),
            },
            Err(error) => Outcome::Failed {
                reason: VolumeFailure::VerificationAborted,
                message: error.to_string(),
            },
        }
    }

    /// The directory name of a workload volume under the kubelet root: the bound
    /// PersistentVolume's name, or the pod's volume name when the claim is not bound (or
    /// cannot be read).
    async fn volume_directory(&self, volume: &crate::restores::WorkloadVolume) -> String {
        let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &volume.namespace);
        match claims.get_opt(&volume.claim_name).await {
            Ok(Some(claim)) => claim
                .spec
                .and_then(|spec| spec.volume_name)
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| volume.volume.clone()),
            Ok(None) => volume.volume.clone(),
            Err(error) => {
                tracing::warn!(claim = volume.claim_name, %error, "reading the claim; using the pod's volume name");
                volume.volume.clone()
            }
        }
    }

    /// The trust anchor and identities a volume must match, read from the API server: the
    /// Restore named on the pod (its UID must be the one on the pod) and the Backup it reads.
    async fn expected(&self, volume: &crate::restores::WorkloadVolume) -> Result<Expected, Lookup> {
        let restores: Api<Restore> = Api::namespaced(self.client.clone(), &volume.namespace);
        let restore = restores
            .get_opt(&volume.restore_name)
            .await
            .map_err(Lookup::Unavailable)?
            .ok_or_else(|| Lookup::Refused {
                reason: VolumeFailure::RestoreNotFound,
                message: format!(
                    "Restore {}/{} does not exist",
                    volume.namespace, volume.restore_name
                ),
            })?;
        if restore.metadata.uid.as_deref() != Some(volume.restore_uid.as_str()) {
            return Err(Lookup::Refused {
                reason: VolumeFailure::RestoreReplaced,
                message: format!(
                    "Restore {}/{} has UID {}, the pod was gated for {}",
                    volume.namespace,
                    volume.restore_name,
                    restore.metadata.uid.as_deref().unwrap_or("(none)"),
                    volume.restore_uid
                ),
            });
        }
        let backup_name = restore.spec.backup_ref.name.clone();
        let backups: Api<Backup> = Api::namespaced(self.client.clone(), &volume.namespace);
        let backup = backups
            .get_opt(&backup_name)
            .await
            .map_err(Lookup::Unavailable)?
            .ok_or_else(|| Lookup::Refused {
                reason: VolumeFailure::BackupNotFound,
                message: format!("Backup {}/{backup_name} does not exist", volume.namespace),
            })?;
        let hash = backup
            .status
            .as_ref()
            .and_then(|status| status.artifact.as_ref())
            .and_then(|artifact| artifact.manifest_hash.as_deref())
            .ok_or_else(|| Lookup::Refused {
                reason: VolumeFailure::BackupIncomplete,
                message: format!(
                    "Backup {}/{backup_name} records no manifest hash",
                    volume.namespace
                ),
            })?;
        let manifest_hash = blake3::Hash::from_hex(hash).map_err(|error| Lookup::Refused {
            reason: VolumeFailure::BackupIncomplete,
            message: format!(
                "Backup {}/{backup_name} records an invalid manifest hash {hash:?}: {error}",
                volume.namespace
            ),
        })?;
        Ok(Expected {
            manifest_hash,
            backup_uid: backup.metadata.uid.clone().unwrap_or_default(),
            restore_uid: volume.restore_uid.clone(),
        })
    }
}

enum Lookup {
    /// The API server could not be asked; try again.
    Unavailable(kube::Error),
    /// The answer rules verification out.
    Refused {
        reason: VolumeFailure,
        message: String,
    },
}
