//! The restore gate on a real kubelet: a restored pod held by custody-wait until its volume is verified, and kept held through tampering, a killed mover, agent rollouts, a deleted Cluster and Pod Security `restricted`.

use super::*;
use crate::postgres::gone;

#[tokio::test]
async fn on_a_real_node_a_restored_pod_is_held_by_custody_wait_until_the_agent_verified_its_volume()
{
    let setup = backed_up("real").await;
    let (node, namespace, pods) = (setup.node, &setup.namespace, &setup.pods);
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    // Held: custody-wait runs in the pod's first init container while the volume is written
    // and verified; the application container has not started.
    await_condition(
        pods,
        "shop-0",
        "held in Init by custody-wait",
        TIMEOUT,
        |pod: &Pod| {
            pod.status.as_ref().is_some_and(|status| {
                let waiting_in_init = status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|wait| {
                        wait.state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                    });
                let application_started =
                    status.container_statuses.iter().flatten().any(|container| {
                        container
                            .state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                    });
                waiting_in_init && !application_started
            })
        },
    )
    .await;
    // Issue 25 item 2: `kubectl custody why` names what holds it (the pod is held while its
    // volume is written and verified; it may be released a moment later).
    let why = crate::monitoring::kubectl_custody(&["why", "shop-0", "-n", &namespace.name]);
    assert!(
        why.contains("held by custody-wait") || why.contains("released"),
        "{why}"
    );
    assert!(why.contains("data-shop-0"), "{why}");
    assert!(why.contains("Last lines of custody-wait:"), "{why}");
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let pod = ready(pods, "shop-0").await;
    let why = crate::monitoring::kubectl_custody(&["why", "shop-0", "-n", &namespace.name]);
    assert!(
        why.contains("released: custody-wait ended, every volume was verified"),
        "{why}"
    );
    let status = crate::monitoring::kubectl_custody(&["status", "-n", &namespace.name]);
    let orders = status
        .lines()
        .find(|line| line.contains(" orders "))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(orders.contains("nightly ("), "{status}");
    let nodes = crate::monitoring::kubectl_custody(&["nodes"]);
    assert!(
        nodes
            .lines()
            .any(|line| line.starts_with(node) && line.contains("True")),
        "{nodes}"
    );
    // custody-wait ran as the pod's first init container, in a real container, and was
    // released (exit 0); the readiness gate is set.
    let spec = pod.spec.as_ref().unwrap();
    let first = &spec.init_containers.as_ref().expect("init containers")[0];
    assert_eq!(
        first.command.as_deref(),
        Some(&["custody-wait".to_string()][..])
    );
    let status = pod.status.as_ref().unwrap();
    let waited = &status
        .init_container_statuses
        .as_ref()
        .expect("init statuses")[0];
    let terminated = waited
        .state
        .as_ref()
        .and_then(|state| state.terminated.as_ref())
        .unwrap_or_else(|| panic!("custody-wait not finished: {waited:?}"));
    assert_eq!(terminated.exit_code, 0, "{terminated:?}");
    assert!(
        waited.image_id.starts_with("sha256:"),
        "{}",
        waited.image_id
    );
    assert!(
        spec.readiness_gates
            .iter()
            .flatten()
            .any(|gate| gate.condition_type.starts_with("custody.io/")),
        "{:?}",
        spec.readiness_gates
    );
    // What the pod got is exactly what was backed up (beside custody's own .custody/: the
    // restore's identity and manifest, which the agent verified against).
    assert!(target.path().join(".custody/manifest.jsonl").is_file());
    let (original, restored) = (tree(setup.source.path()), tree(target.path()));
    let differing: Vec<&String> = original
        .keys()
        .chain(restored.keys())
        .filter(|path| original.get(*path) != restored.get(*path))
        .collect();
    assert!(differing.is_empty(), "restored differs at {differing:?}");
    assert!(original.len() > 500, "{}", original.len());
    // The agent of this node verified the volume.
    let volume = &restore.status.as_ref().expect("status").volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    assert_eq!(volume.node_name.as_deref(), Some(node), "{volume:?}");

    // Issue 25 item 1: a real Prometheus, scraping as deploy/monitoring/ says, finds the
    // backup's and the restore's series, the agent's verification, and the agent reporting.
    let prometheus = crate::monitoring::Prometheus::scraping_custody(&setup.client).await;
    let ns = namespace.name.as_str();
    let completed = restore
        .status
        .as_ref()
        .and_then(|status| status.completion_time.as_ref())
        .expect("the Restore's completion time")
        .0
        .as_second() as f64;
    let last = prometheus
        .wait_for(
            &format!(
                "custody_cluster_last_successful_backup_timestamp_seconds{{namespace=\"{ns}\"}}"
            ),
            |labels, _| labels["cluster"] == "orders",
        )
        .await;
    assert!(
        last.iter()
            .all(|(_, at)| *at > completed - 3600.0 && *at <= completed),
        "the Backup completed before the restore, within the hour: {last:?}, restore at {completed}"
    );
    prometheus
        .wait_for(
            "sum by (result) (custody_restores_finished_total)",
            |labels, count| labels["result"] == "Completed" && count >= 1.0,
        )
        .await;
    prometheus
        .wait_for("sum(custody_restore_duration_seconds_count)", |_, count| {
            count >= 1.0
        })
        .await;
    let waiting = prometheus
        .query(&format!(
            "custody_restore_waiting_since_timestamp_seconds{{namespace=\"{ns}\"}}"
        ))
        .await;
    assert!(waiting.is_empty(), "a completed Restore waits: {waiting:?}");
    prometheus
        .wait_for(
            "sum by (reason) (custody_agent_verifications_total)",
            |labels, count| labels["reason"] == "Verified" && count >= 1.0,
        )
        .await;
    prometheus
        .wait_for(
            &format!("custody_node_agent_reporting{{node=\"{node}\"}}"),
            |_, reporting| reporting == 1.0,
        )
        .await;
    prometheus
        .wait_for("up{job=\"custody-agent\"}", |_, up| up == 1.0)
        .await;
    drop(prometheus);

    setup.finish().await;
}

/// A restore whose repository was changed after the backup (one byte of its largest pack) is
/// refused, and its pod stays in Init: custody-wait keeps the application container from
/// ever starting on the unverified volume.
#[tokio::test]
async fn on_a_real_node_a_tampered_restore_is_refused_and_its_pod_stays_held() {
    let setup = backed_up("tamper").await;
    let mut largest = (0, String::new(), Vec::new());
    for key in s3::keys(
        s3::shared(),
        &setup.bucket,
        "custody/custody_repository/data/",
    )
    .await
    {
        let bytes = s3::get(s3::shared(), &setup.bucket, &key).await;
        if bytes.len() > largest.0 {
            largest = (bytes.len(), key, bytes);
        }
    }
    let (_, pack, mut bytes) = largest;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    s3::put(s3::shared(), &setup.bucket, &pack, bytes).await;

    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let restore = restore_reaches(&setup.namespace, "shop", RestorePhase::Failed).await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Failed, "{volume:?}");
    // Still held well after the refusal: custody-wait has not let the application start.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pod = setup.pods.get("shop-0").await.unwrap();
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"), "{status:?}");
    let wait = &status
        .init_container_statuses
        .as_ref()
        .expect("init statuses")[0];
    assert!(
        wait.state
            .as_ref()
            .is_some_and(|state| state.terminated.is_none()),
        "custody-wait ended: {wait:?}"
    );
    never_started(status);
    assert!(
        !status
            .conditions
            .iter()
            .flatten()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
    );
    setup.finish().await;
}

/// Pod Security (#13 item 5, #15 item 3). In a namespace enforcing `restricted`, the restored
/// application pod and the `custody-wait` the webhook injects are admitted and run; the
/// prepareData Job's pod is refused (it runs as root to write files of every owner), so the
/// Job has no pod at all, and the Restore says so, naming the Job and Pod Security's words,
/// with a Warning, rather than waiting in silence. With the documented exception (the
/// namespace enforcing `baseline`, warning at `restricted`) the same Restore completes.
#[tokio::test]
async fn on_a_real_node_pod_security_restricted_admits_the_held_pod_and_names_the_refused_mover() {
    let setup = backed_up("podsecurity").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let ns = namespace.name.clone();
    let label = |level: &str| {
        let output = kubectl(&[
            "label",
            "--overwrite",
            "namespace",
            &ns,
            &format!("pod-security.kubernetes.io/enforce={level}"),
            "pod-security.kubernetes.io/warn=restricted",
        ]);
        assert!(output.status.success(), "{output:?}");
    };
    label("restricted");
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    // Admitted under restricted: the pod exists, held in Init by custody-wait.
    await_condition(
        pods,
        "shop-0",
        "held by custody-wait",
        TIMEOUT,
        |pod: &Pod| {
            pod.status.as_ref().is_some_and(|status| {
                status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|wait| {
                        wait.state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                    })
            })
        },
    )
    .await;
    let refused =
        custody_tests::scenario::restore_says(namespace, "shop", "JobPodNotStarting", TIMEOUT)
            .await;
    let status = refused.status.clone().unwrap();
    let volume = &status.volumes[0];
    let job = volume.job_name.clone().expect("a Job");
    let message = volume.message.clone().unwrap_or_default();
    assert!(
        message.contains(&job)
            && message.contains("no pod could be created")
            && message.contains("PodSecurity")
            && message.contains("restricted"),
        "{message}"
    );
    assert_eq!(volume.state, VolumeState::Restoring, "{volume:?}");
    eprintln!("pod security: the Restore's volume says: {message}");
    custody_tests::eventually("the Warning naming Pod Security", TIMEOUT, || {
        let ns = ns.clone();
        async move {
            let events = kubectl(&[
                "-n",
                &ns,
                "get",
                "events",
                "--field-selector",
                "reason=JobPodNotStarting,type=Warning",
                "-o",
                "jsonpath={.items[*].message}",
            ]);
            let events = String::from_utf8_lossy(&events.stdout).to_string();
            events.contains("PodSecurity").then_some(()).ok_or(events)
        }
    })
    .await;
    let refused_at = std::time::Instant::now();

    // The documented exception: baseline for custody's Jobs.
    label("baseline");
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    eprintln!(
        "pod security: the restore completed {:.1} s after the namespace allowed baseline",
        refused_at.elapsed().as_secs_f64()
    );
    assert_eq!(
        restore.status.unwrap().volumes[0].state,
        VolumeState::Verified
    );
    ready(pods, "shop-0").await;
    // The mover ran with only the capabilities it asks for.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = namespace.api();
    let backup_job = jobs
        .list(&ListParams::default().labels("custody.io/role"))
        .await
        .unwrap()
        .items;
    assert!(!backup_job.is_empty(), "the Backup's Job is kept");
    for job in backup_job {
        let container = &job.spec.unwrap().template.spec.unwrap().containers[0];
        let security = container.security_context.clone().unwrap();
        assert_eq!(
            security.capabilities.unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }
    setup.finish().await;
}

/// #15 item 4, on a real node: the prepareData pod is killed while it writes the volume (the
/// download throttled so that it is caught mid-way). Its Job makes another pod, which finds
/// the first one's unfinished output (its own restore identity, no manifest yet), starts
/// clean and writes the whole volume; the agent verifies it and the Restore completes, with
/// no Job of custody's recreated.
#[tokio::test]
async fn on_a_real_node_a_restore_whose_mover_is_killed_mid_write_is_retried_by_its_job_and_verified()
 {
    let setup = backed_up("retried").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let relay = setup.slow_repository().await;
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;

    // The first prepareData pod, its mover running and part of the volume written.
    let role = format!(
        "{}={}",
        custody_proto::names::LABEL_ROLE,
        custody_proto::names::ROLE_PREPARE_DATA
    );
    let (first, container) = setup.running_mover().await;
    let written = || {
        let output = std::process::Command::new("du")
            .args(["-sb", target.path().to_str().unwrap()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .and_then(|bytes| bytes.parse::<u64>().ok())
            .unwrap_or(0)
    };
    custody_tests::eventually("part of the volume written", TIMEOUT, || {
        let bytes = written();
        async move {
            (bytes > 8 << 20)
                .then_some(())
                .ok_or(format!("{bytes} bytes"))
        }
    })
    .await;
    assert!(
        target.path().join(".custody/restore.json").is_file(),
        "the mover writes its identity first"
    );
    assert!(!target.path().join(".custody/manifest.jsonl").exists());
    // How far it came, in the Restore's status: the mover's count in its pod's scratch
    // volume, read by the node's agent under the real kubelet's root, reported and written.
    let restores = namespace.api::<Restore>();
    let midway = custody_tests::eventually("the volume's progress midway", TIMEOUT, || {
        let restores = restores.clone();
        async move {
            let restore = restores
                .get("shop")
                .await
                .map_err(|error| error.to_string())?;
            let status = restore.status.unwrap_or_default();
            let transfer = status
                .volumes
                .first()
                .and_then(|volume| volume.transfer.clone())
                .ok_or("no transfer yet")?;
            let midway = transfer.bytes_done > 0
                && transfer
                    .bytes_total
                    .is_some_and(|total| transfer.bytes_done < total);
            midway
                .then_some(transfer.clone())
                .ok_or(format!("{transfer:?}"))
        }
    })
    .await;
    assert_eq!(midway.node_name.as_deref(), Some(setup.node), "{midway:?}");
    eprintln!("retried restore: progress seen midway: {}", midway.summary);
    let id = container.trim_start_matches("containerd://");
    ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
    eprintln!(
        "retried restore: killed the mover of {first} with {} bytes written",
        written()
    );

    // Its pod failed (a failure of the moment: 137), and the Job made another.
    let killed = await_condition(pods, &first, "failed", TIMEOUT, |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref())
            == Some("Failed")
    })
    .await;
    let code = killed
        .status
        .iter()
        .flat_map(|status| status.container_statuses.iter().flatten())
        .find_map(|container| Some(container.state.as_ref()?.terminated.as_ref()?.exit_code));
    assert_eq!(code, Some(137), "{:?}", killed.status);
    let second = custody_tests::eventually("the Job's next pod", TIMEOUT, || {
        let pods = pods.clone();
        let role = role.clone();
        let first = first.clone();
        async move {
            pods.list(&ListParams::default().labels(&role))
                .await
                .map_err(|error| error.to_string())?
                .items
                .into_iter()
                .filter_map(|pod| pod.metadata.name)
                .find(|name| *name != first)
                .ok_or_else(|| "no second pod yet".to_string())
        }
    })
    .await;
    relay.set(s3::Fault::None);
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    assert_eq!(volume.attempts, 1, "the same Job retried: {volume:?}");
    // Written whole (the 40 MiB bulk file and the small database), said so.
    let transfer = volume.transfer.as_ref().expect("the volume's transfer");
    assert!(transfer.bytes_done > 40 << 20, "{transfer:?}");
    eprintln!("retried restore: {second} wrote the volume; {volume:?}");
    let (original, restored) = (tree(setup.source.path()), tree(target.path()));
    let differing: Vec<&String> = original
        .keys()
        .chain(restored.keys())
        .filter(|path| original.get(*path) != restored.get(*path))
        .collect();
    assert!(differing.is_empty(), "restored differs at {differing:?}");
    ready(pods, "shop-0").await;
    setup.finish().await;
}

/// #13, on the real node: the agent DaemonSet is rolled out while a restore writes its volume.
/// The new agent pod, with nothing in memory, takes the restore over (the prepareData pod it
/// did not see start, the volume it never saw written) and verifies it; the pod, held all
/// along, is released, and the Restore completes with the new agent's word.
#[tokio::test]
async fn on_a_real_node_an_agent_rollout_during_a_restore_is_taken_over_by_the_new_agent() {
    let setup = backed_up_with("rollout", Agents::Exclusive(AGENTS.write().await)).await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    // Slow enough that the restore outlasts a rollout on a loaded machine (CI59 saw the mover
    // done, and its pod deleted, before the new agent was ready at 2 MB/s).
    let _relay = setup.slow_repository_at(1_000_000).await;
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(setup.client.clone(), NAMESPACE);
    let before = daemonsets
        .get("custody-agent")
        .await
        .unwrap()
        .metadata
        .generation;
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "restart",
        "daemonset/custody-agent",
    ]);
    assert!(output.status.success(), "{output:?}");
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        "daemonset/custody-agent",
        "--timeout=120s",
    ]);
    assert!(output.status.success(), "{output:?}");
    let after = daemonsets.get("custody-agent").await.unwrap();
    assert!(after.metadata.generation > before, "rolled out");
    // The mover was still writing when the new agent started.
    let writing = pods.get(&mover).await.unwrap();
    assert_ne!(
        writing
            .status
            .as_ref()
            .and_then(|status| status.phase.as_deref()),
        Some("Succeeded"),
        "the restore finished before the rollout: the test proves nothing"
    );
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    ready(pods, "shop-0").await;
    let (original, restored) = (tree(setup.source.path()), tree(target.path()));
    assert_eq!(original, restored);
    setup.finish().await;
}

/// #13, on the real node: deleting the Cluster while its restore writes the volume cancels
/// it. The Cluster deletes its Restore, the Restore its prepareData Job (the mover's pod goes),
/// and both go away; what the user made (the StatefulSet, its pod, the claim) stays, and the
/// pod, never released, has not started its application on the half-written volume.
#[tokio::test]
async fn on_a_real_node_deleting_the_cluster_cancels_its_restore_and_leaves_the_pod_held() {
    let setup = backed_up("cancel").await;
    let (namespace, pods) = (&setup.namespace, &setup.pods);
    let _relay = setup.slow_repository().await;
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    namespace
        .api::<Cluster>()
        .delete("shop", &Default::default())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    gone(&namespace.api::<Cluster>(), "shop").await;
    gone(&namespace.api::<Restore>(), "shop").await;
    gone(pods, &mover).await;
    eprintln!(
        "cancel: Cluster, Restore and the mover's pod gone {:.1} s after the Cluster's deletion",
        started.elapsed().as_secs_f64()
    );
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = namespace.api();
    let left = jobs
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_PREPARE_DATA
        )))
        .await
        .unwrap()
        .items;
    assert!(left.is_empty(), "{left:?}");
    // The user's objects stay; the pod is still held in Init.
    namespace
        .api::<StatefulSet>()
        .get("shop")
        .await
        .expect("the StatefulSet stays");
    namespace
        .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get("data-shop-0")
        .await
        .expect("the claim stays");
    // The agent says why the pod stays held, instead of waiting for a prepareData pod that
    // will never come: its Restore was deleted before it verified the claim.
    let failed = reported_volume(
        &setup.client,
        setup.node,
        "the agent reports the held volume failed",
        |volume| volume.pod_name == "shop-0" && volume.state == VolumeState::Failed,
    )
    .await;
    assert_eq!(
        failed.reason.as_deref(),
        Some("RestoreNotFound"),
        "{failed:?}"
    );
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("was deleted before it recorded claim data-shop-0 as verified"),
        "{message}"
    );
    eprintln!("cancel: the held pod's volume: RestoreNotFound: {message}");
    let pod = pods.get("shop-0").await.unwrap();
    let status = pod.status.as_ref().unwrap();
    never_started(status);
    assert!(
        !target.path().join(".custody/manifest.jsonl").exists(),
        "the restore was not finished"
    );
    setup.finish().await;
}

/// The first volume node `node`'s agent reports (its NodeAgent's `status.restoredVolumes`)
/// that `wanted` accepts, waited for.
pub(crate) async fn reported_volume(
    client: &kube::Client,
    node: &str,
    what: &str,
    wanted: impl Fn(&custody_kube::api::ReportedVolume) -> bool,
) -> custody_kube::api::ReportedVolume {
    let agents = Api::<NodeAgent>::all(client.clone());
    let wanted = &wanted;
    custody_tests::eventually(what, TIMEOUT, || {
        let agents = agents.clone();
        async move {
            let status = agents
                .get(node)
                .await
                .map_err(|error| error.to_string())?
                .status
                .unwrap_or_default();
            status
                .restored_volumes
                .iter()
                .find(|volume| wanted(volume))
                .cloned()
                .ok_or_else(|| format!("{:?}", status.restored_volumes))
        }
    })
    .await
}

/// Issue 15, item 1, on a real kubelet: a restore completed, the application changed its
/// volume, every agent was replaced (a DaemonSet rollout), then the pod's sandbox died, so the
/// kubelet ran custody-wait again. It is released (the Restore's record of the verification
/// counts, not the changed volume), and no agent reports the volume failed.
#[tokio::test]
async fn on_a_real_node_a_completed_restore_is_not_held_again_after_an_agent_rollout_and_a_sandbox_restart()
 {
    let setup = backed_up_with("rollout", Agents::Exclusive(AGENTS.write().await)).await;
    let (node, namespace, pods) = (setup.node, &setup.namespace, &setup.pods);
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let ready = |pod: &Pod| {
        pod.status.as_ref().is_some_and(|status| {
            status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    };
    let before = await_condition(pods, "shop-0", "ready", TIMEOUT, ready).await;

    // The application writes: the volume is no longer the backup.
    std::fs::write(
        target.path().join("base/16384/0001"),
        b"changed by the application",
    )
    .unwrap();
    std::fs::write(target.path().join("new-table"), b"rows").unwrap();

    // Every agent replaced.
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "restart",
        "daemonset/custody-agent",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        "daemonset/custody-agent",
        "--timeout=180s",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The pod's sandbox dies: the kubelet makes a new one and runs the init containers again.
    let uid = before.metadata.uid.clone().unwrap();
    let sandboxes = ctr(&[
        "containers",
        "ls",
        "-q",
        &format!("labels.\"io.kubernetes.pod.uid\"=={uid}"),
    ]);
    let sandbox = sandboxes
        .lines()
        .find(|id| {
            ctr(&["containers", "info", id]).contains("\"io.cri-containerd.kind\": \"sandbox\"")
        })
        .unwrap_or_else(|| panic!("the sandbox of shop-0 among {sandboxes:?}"));
    ctr(&["tasks", "kill", "-s", "SIGKILL", sandbox]);
    let restarted = |pod: &Pod| {
        pod.status.as_ref().is_some_and(|status| {
            status
                .init_container_statuses
                .iter()
                .flatten()
                .next()
                .is_some_and(|wait| wait.restart_count > 0)
        })
    };
    await_condition(pods, "shop-0", "custody-wait run again", TIMEOUT, restarted).await;
    // Settled after `runs` runs of custody-wait: it ended released and the application runs
    // in the new sandbox (a Ready condition alone may still be the old sandbox's).
    let settled = |runs: i32| {
        move |pod: &Pod| {
            pod.status.as_ref().is_some_and(|status| {
                let released = status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .next()
                    .is_some_and(|wait| {
                        wait.restart_count >= runs - 1
                            && wait.state.as_ref().is_some_and(|state| {
                                state
                                    .terminated
                                    .as_ref()
                                    .is_some_and(|ended| ended.exit_code == 0)
                            })
                    });
                let running = status.container_statuses.iter().flatten().all(|container| {
                    container.ready
                        && container
                            .state
                            .as_ref()
                            .is_some_and(|state| state.running.is_some())
                });
                released && running
            }) && ready(pod)
        }
    };
    let after = await_condition(pods, "shop-0", "ready again", TIMEOUT, settled(2)).await;
    let wait = &after
        .status
        .as_ref()
        .unwrap()
        .init_container_statuses
        .as_ref()
        .unwrap()[0];
    let terminated = wait
        .state
        .as_ref()
        .and_then(|state| state.terminated.as_ref())
        .expect("custody-wait ended");
    assert_eq!(terminated.exit_code, 0, "{wait:?}");
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "the same pod, not a new one"
    );

    // The agents never report the volume failed, and the application's change is still there.
    let agent = Api::<NodeAgent>::all(setup.client.clone())
        .get(node)
        .await
        .unwrap();
    let status = agent.status.unwrap_or_default();
    assert!(
        status
            .restored_volumes
            .iter()
            .all(|volume| volume.state != VolumeState::Failed)
            && status
                .volumes
                .as_ref()
                .is_none_or(|counts| counts.failed == 0),
        "{status:?}"
    );
    let restore = namespace.api::<Restore>().get("shop").await.unwrap();
    let restore_uid = restore.metadata.uid.clone().unwrap();
    assert_eq!(restore.status.unwrap().phase, Some(RestorePhase::Completed));
    assert_eq!(
        std::fs::read(target.path().join("new-table")).unwrap(),
        b"rows"
    );

    // The Restore is deleted; its record stays on the claim. (The Cluster, whose
    // `spec.restore` still names the Backup, makes a new Restore of that name, with another
    // UID.) The pod's custody-wait still names the deleted Restore: should the kubelet run it
    // again, the agent answers from that record instead of waiting for the Restore's
    // prepareData pod for ever.
    namespace
        .api::<Restore>()
        .delete("shop", &Default::default())
        .await
        .unwrap();
    custody_tests::eventually("the Restore that verified the pod gone", TIMEOUT, || {
        let restores = namespace.api::<Restore>();
        let restore_uid = restore_uid.clone();
        async move {
            match restores.get_opt("shop").await {
                Ok(Some(restore)) if restore.metadata.uid.as_deref() == Some(&restore_uid) => {
                    Err("still there".to_string())
                }
                Ok(_) => Ok(()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
    let claim = namespace
        .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get("data-shop-0")
        .await
        .unwrap();
    let record = custody_proto::names::verified_by_restore(&restore_uid);
    assert_eq!(
        claim.annotations().get(&record).map(String::as_str),
        Some("shop"),
        "{:?}",
        claim.annotations()
    );
    // The agent, which no longer watches that Restore, asks the API server and answers the
    // pod's custody-wait from the claim's record: Verified, not "waiting for the prepareData
    // pod" (what it said before the record existed).
    let volume = reported_volume(
        &setup.client,
        node,
        "the agent reports the pod's volume verified with its Restore gone",
        |volume| {
            volume.pod_name == "shop-0"
                && volume.restore_uid == restore_uid
                && volume.state == VolumeState::Verified
                && volume
                    .message
                    .as_deref()
                    .is_some_and(|message| message.contains("before it was deleted"))
        },
    )
    .await;
    eprintln!(
        "rollout: with its Restore gone: {}",
        volume.message.unwrap_or_default()
    );
    let released = pods.get("shop-0").await.unwrap();
    assert!(ready(&released));
    assert_eq!(released.metadata.uid, before.metadata.uid);
    setup.finish().await;
}
