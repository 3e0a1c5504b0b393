//! The agent process: watch this node's pods, start verifications when the node's view calls
//! for them, serve the gate and `/metrics`, and report to the controller.

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};

use crate::cli::AgentOptions;
use crate::error::Error;
use crate::state::{Agent, Watch};
use crate::volume_state::{self, WorkloadVolume};
use custody_kube::api::Restore;

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(options: AgentOptions) -> Result<(), Error> {
    let client = custody_kube::process::client(options.kubeconfig.as_deref()).await?;
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let (restore_reader, restore_writer) = reflector::store::<Restore>();
    let agent = Arc::new(Agent::new(
        client.clone(),
        options.clone(),
        pod_reader,
        restore_reader,
    ));
    tracing::info!(node = options.node_name, kubelet_root = %options.kubelet_root.display(), "starting");
    // A killed agent may have left a filesystem frozen for a backup: thaw it first.
    match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => {
            let mounts = crate::volumes::parse_mountinfo(&text);
            crate::freeze::thaw_left_frozen(&options.state_dir, &mounts, &agent.metrics);
        }
        Err(error) => {
            tracing::error!(%error, "reading /proc/self/mountinfo to thaw what a stopped agent left frozen")
        }
    }

    let stop = custody_kube::process::wait_for_signal().boxed().shared();

    // Only this node's pods: the field selector keeps the watch (and the agent's memory)
    // proportional to one node.
    let pods: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={}", options.node_name);
    let pod_watch = watch(
        agent.clone(),
        Watch::Pods,
        watcher(pods, watcher::Config::default().fields(&selector)),
        pod_writer,
    );
    // Every Restore: what their statuses record as verified releases pods for good.
    let restores: Api<Restore> = Api::all(client.clone());
    let restore_watch = watch(
        agent.clone(),
        Watch::Restores,
        watcher(restores, watcher::Config::default()),
        restore_writer,
    );

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
                tracing::info!("pods and Restores listed");
            }
        }
    });

    let result = tokio::select! {
        _ = stop.clone() => Ok(()),
        _ = pod_watch => Ok(()),
        _ = restore_watch => Ok(()),
        _ = maintain(agent.clone()) => Ok(()),
        served = custody_kube::http::serve(options.http_address, health, stop.clone()) => served.map_err(Error::from),
        served = crate::gate::serve(agent.clone(), stop.clone()) => served,
        _ = crate::report::run(agent.clone()) => Ok(()),
        _ = crate::movers::follow(agent.clone()) => Ok(()),
        _ = crate::report::follow_trust(agent.clone()) => Ok(()),
    };
    tracing::info!("stopped");
    result
}

/// Keeps `writer`'s store current from `events`, waking the node's view on every change.
async fn watch<K>(
    agent: Arc<Agent>,
    which: Watch,
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    writer: reflector::store::Writer<K>,
) where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    events
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|event| {
            match event {
                Ok(event) => {
                    if matches!(event, watcher::Event::InitDone) {
                        agent.mark_synced(which);
                    }
                    agent.wake()
                }
                Err(error) => tracing::warn!(watch = ?which, %error, "watch"),
            }
            futures::future::ready(())
        })
        .await
}

/// Starts the verifications the node's view calls for, and asks the API server about Restores
/// its watch does not hold, until the agent stops.
async fn maintain(agent: Arc<Agent>) {
    while let Some((starts, asks)) = agent.next_starts().await {
        for start in starts {
            tracing::info!(
                namespace = start.volume.namespace,
                pod = start.volume.pod_name,
                volume = start.volume.volume,
                claim = start.volume.claim_name,
                prepare_pod = start.key.prepare_pod_uid,
                "verification started"
            );
            tokio::spawn(crate::verification::run(agent.clone(), start));
        }
        for volume in asks {
            tokio::spawn(ask(agent.clone(), volume));
        }
    }
}

/// How long an answer that a Restore the watch lacks exists is trusted.
const REASK_EXISTING: std::time::Duration = std::time::Duration::from_secs(10);
/// How long after a failed question it is asked again.
const REASK_FAILED: std::time::Duration = std::time::Duration::from_secs(5);

/// Asks the API server whether `volume`'s Restore still exists and, when it does not, whether
/// the claim records that it verified it; asks again 5 s after a failure.
async fn ask(agent: Arc<Agent>, volume: WorkloadVolume) {
    let answer = async {
        let restores: Api<Restore> = Api::namespaced(agent.client.clone(), &volume.namespace);
        let restore = restores.get_opt(&volume.restore_name).await?;
        let restore_uid = restore.and_then(|restore| restore.metadata.uid);
        if restore_uid.as_deref() == Some(volume.restore_uid.as_str()) {
            return Ok(volume_state::absence(&volume, restore_uid.as_deref(), None));
        }
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(agent.client.clone(), &volume.namespace);
        let claim = claims.get_opt(&volume.claim_name).await?;
        Ok::<_, kube::Error>(volume_state::absence(
            &volume,
            restore_uid.as_deref(),
            claim.and_then(|claim| claim.metadata.annotations).as_ref(),
        ))
    }
    .await;
    match answer {
        Ok(absence) => {
            tracing::info!(
                namespace = volume.namespace,
                pod = volume.pod_name,
                restore = volume.restore_name,
                claim = volume.claim_name,
                ?absence,
                "asked about a Restore the watch does not hold"
            );
            let exists = absence == volume_state::Absence::RestoreExists;
            agent.answer(&volume, Some(absence));
            if exists {
                // Good until the watch holds that Restore (then the answer is dropped); should
                // the Restore go before the watch ever saw it, the answer would stay true for
                // ever: asked again in 10 s while the watch still lacks it.
                tokio::time::sleep(REASK_EXISTING).await;
                agent.answer(&volume, None);
            }
        }
        Err(error) => {
            tracing::warn!(
                namespace = volume.namespace,
                restore = volume.restore_name,
                claim = volume.claim_name,
                %error,
                "asking whether the Restore still exists; again in 5 s"
            );
            tokio::time::sleep(REASK_FAILED).await;
            agent.answer(&volume, None);
        }
    }
}
