use std::time::Duration;

use clap::Parser;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;

use super::*;

/// A pod of this node held by `custody-wait` for Restore `pg-restore` (`restore-uid`).
fn held_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pg-0", "namespace": "db", "uid": "pod-uid"},
        "spec": {
            "nodeName": "node-a",
            "initContainers": [{"name": "custody-wait", "env": [
                {"name": "CUSTODY_RESTORE", "value": "pg-restore"},
                {"name": "CUSTODY_RESTORE_UID", "value": "restore-uid"},
                {"name": "CUSTODY_RESTORED_CLAIMS", "value": "data-pg-0"},
            ]}],
            "containers": [{"name": "db"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-pg-0"}}],
        },
    }))
    .expect("pod")
}

fn restore() -> Restore {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
        "metadata": {"name": "pg-restore", "namespace": "db", "uid": "restore-uid"},
        "spec": {"clusterRef": {"name": "pg"}, "backupRef": {"name": "nightly"}},
    }))
    .expect("restore")
}

async fn next(agent: &Agent) -> (Vec<Start>, Vec<WorkloadVolume>) {
    agent.wake();
    tokio::time::timeout(Duration::from_secs(5), agent.next_starts())
        .await
        .expect("a pass")
        .expect("not stopped")
}

fn state(agent: &Agent) -> &'static str {
    let view = agent.subscribe().borrow().clone();
    let pod = view.gated.get("pod-uid").expect("the held pod");
    pod.volumes[0].state.name()
}

/// The bookkeeping around a Restore the watch lacks: asked once (not again while asking),
/// the answer kept until it is withdrawn (then asked again) or the watch holds the Restore
/// (then dropped), and an answer that it is gone decides the volume.
#[tokio::test]
async fn a_restore_the_watch_lacks_is_asked_once_and_again_when_the_answer_is_withdrawn() {
    let client = kube::Client::try_from(kube::Config::new(
        "http://127.0.0.1:1".parse().expect("url"),
    ))
    .expect("client");
    let options = AgentOptions::try_parse_from([
        "custody-agent",
        "--node-name=node-a",
        "--gate-address=127.0.0.1:0",
        "--gate-tls-cert=cert.pem",
        "--gate-tls-key=key.pem",
    ])
    .expect("options");
    let (pods, mut pod_writer) = reflector::store::<Pod>();
    let (restores, mut restore_writer) = reflector::store::<Restore>();
    pod_writer.apply_watcher_event(&Event::Apply(held_pod()));
    let agent = Agent::new(client, options, pods, restores);
    agent.mark_synced(Watch::Pods);
    agent.mark_synced(Watch::Restores);
    let volume = |asks: &[WorkloadVolume]| asks.iter().map(Restores::key).collect::<Vec<_>>();
    let key = (
        "db".to_string(),
        "restore-uid".to_string(),
        "data-pg-0".to_string(),
    );

    // Not in the watch: asked, once.
    let (starts, asks) = next(&agent).await;
    assert!(starts.is_empty());
    assert_eq!(volume(&asks), vec![key.clone()]);
    assert_eq!(state(&agent), "Pending");
    let (_, asks) = next(&agent).await;
    assert!(asks.is_empty(), "asked again while asking: {asks:?}");

    // It exists (the watch lags): not asked again until that answer is withdrawn.
    let asked = crate::volume_state::tests::volume();
    agent.answer(&asked, Some(Absence::RestoreExists));
    let (_, asks) = next(&agent).await;
    assert!(asks.is_empty(), "{asks:?}");
    agent.answer(&asked, None);
    let (_, asks) = next(&agent).await;
    assert_eq!(
        volume(&asks),
        vec![key.clone()],
        "asked again once withdrawn"
    );

    // The watch now holds it: what was asked is dropped, nothing is asked.
    agent.answer(&asked, Some(Absence::RestoreExists));
    restore_writer.apply_watcher_event(&Event::Apply(restore()));
    let (_, asks) = next(&agent).await;
    assert!(asks.is_empty(), "{asks:?}");
    assert!(agent.absences.lock().unwrap().is_empty());

    // It leaves the watch: asked again; gone and not recorded on the claim, it fails.
    restore_writer.apply_watcher_event(&Event::Delete(restore()));
    let (_, asks) = next(&agent).await;
    assert_eq!(volume(&asks), vec![key.clone()]);
    agent.answer(
        &asked,
        Some(Absence::RestoreGone {
            replaced_by: None,
            verified: false,
        }),
    );
    let (_, asks) = next(&agent).await;
    assert!(asks.is_empty(), "{asks:?}");
    assert_eq!(state(&agent), "Failed");

    // The pod leaves the node: what was asked for it is forgotten.
    pod_writer.apply_watcher_event(&Event::Delete(held_pod()));
    next(&agent).await;
    assert!(agent.absences.lock().unwrap().is_empty());
}
