//! The controller on the real node: its CA rotating during a restore, and its leader killed mid-restore.

use super::*;
use crate::freeze::reqwest_get;
use crate::postgres::gone;

/// The certificates of custody's CA on this host's agent: the gate's, as the agent stored it.
pub(crate) const GATE_CERTIFICATE: &str = "/var/lib/custody-agent/gate-certificate/gate.crt";

/// `openssl x509 -noout FLAG` of the PEM certificate in `path` (or on stdin from `pem`).
pub(crate) fn x509(pem: &[u8], flag: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", flag])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    child.stdin.take().unwrap().write_all(pem).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// custody's pod named `name` (`app.kubernetes.io/name`): its UID and its containers'
/// restart counts.
pub(crate) async fn custody_pod(client: &kube::Client, name: &str) -> (String, Vec<(String, i32)>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("custody's pod");
    let restarts = pod
        .status
        .iter()
        .flat_map(|status| status.container_statuses.iter().flatten())
        .map(|container| (container.name.clone(), container.restart_count))
        .collect();
    (pod.metadata.uid.unwrap_or_default(), restarts)
}

/// #23 item 5: custody's CA rotates while a restore runs, and nothing fails. An operator asks
/// for a new CA (`custody.io/rotate-ca` on Secret custody-ca, here "sign in 10 s"); the new CA
/// joins every trust bundle (ConfigMap custody-ca the agents mount, custody-gate-ca in the
/// restore's namespace), then signs: the report service and the node's gate get new
/// certificates from it while the mover writes and custody-wait holds the pod. The restore
/// completes verified, the pod starts, the agent reports on, and neither the agent nor the
/// controller was restarted.
#[tokio::test]
async fn on_a_real_node_custodys_ca_rotates_during_a_restore_and_nothing_fails() {
    let setup = backed_up_with("rotate", Agents::Exclusive(AGENTS.write().await)).await;
    let (namespace, pods, client) = (&setup.namespace, &setup.pods, &setup.client);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), NAMESPACE);
    let ca_name = |secret: &k8s_openapi::api::core::v1::Secret| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get("ca.name"))
            .map(|name| String::from_utf8_lossy(&name.0).into_owned())
            .unwrap_or_default()
    };
    let old_ca = ca_name(&secrets.get("custody-ca").await.unwrap());
    assert!(old_ca.starts_with("custody-ca-"), "{old_ca}");
    // The agent keeps its gate certificate on the host across installs: one from an earlier
    // install's CA is served at once, and replaced once the controller's answer names the CA
    // that signs now (a report away).
    let issuer = format!("issuer=CN = {old_ca}");
    let gate_before = custody_tests::eventually(
        "the gate's certificate from the CA in force",
        TIMEOUT,
        || {
            let issuer = issuer.clone();
            async move {
                let pem = std::fs::read(GATE_CERTIFICATE).map_err(|error| error.to_string())?;
                let found = x509(&pem, "-issuer");
                (found == issuer).then_some(pem).ok_or(found)
            }
        },
    )
    .await;
    assert_eq!(
        x509(&gate_before, "-subject"),
        format!("subject=CN = {}.gate.custody.io", setup.node)
    );
    let agent = custody_pod(client, "custody-agent").await;
    let controller = custody_pod(client, "custody-controller").await;

    let relay = setup.slow_repository().await;
    relay.set(s3::Fault::ThrottleDownloads(150_000));
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    let asked = std::time::Instant::now();
    let output = kubectl(&[
        "-n",
        NAMESPACE,
        "annotate",
        "secret/custody-ca",
        "custody.io/rotate-ca=10",
    ]);
    assert!(output.status.success(), "{output:?}");

    // The new CA signs once its time came; the agent then replaces its gate certificate.
    let new_ca = custody_tests::eventually("the new CA signing", TIMEOUT, || {
        let secrets = secrets.clone();
        let old_ca = old_ca.clone();
        async move {
            let secret = secrets.get("custody-ca").await.map_err(|e| e.to_string())?;
            let name = ca_name(&secret);
            if name != old_ca {
                Ok(name)
            } else {
                Err(format!("still {name}"))
            }
        }
    })
    .await;
    let promoted = asked.elapsed();
    // By then the restore's namespace trusts it too (published when it joined the bundle,
    // not at the Restore's next reconciliation).
    let gate_ca =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &namespace.name)
            .get("custody-gate-ca")
            .await
            .unwrap()
            .data
            .unwrap_or_default()
            .remove("ca.crt")
            .unwrap_or_default();
    assert_eq!(gate_ca.matches("BEGIN CERTIFICATE").count(), 2, "{gate_ca}");
    let gate_after =
        custody_tests::eventually("a gate certificate from the new CA", TIMEOUT, || {
            let new_ca = new_ca.clone();
            async move {
                let pem = std::fs::read(GATE_CERTIFICATE).map_err(|e| e.to_string())?;
                let issuer = x509(&pem, "-issuer");
                if issuer == format!("issuer=CN = {new_ca}") {
                    Ok(pem)
                } else {
                    Err(issuer)
                }
            }
        })
        .await;
    let reissued = asked.elapsed();
    assert_ne!(gate_after, gate_before);
    // All of it happened while the restore ran: custody-wait still held the pod.
    let running = namespace.api::<Restore>().get("shop").await.unwrap();
    assert_ne!(
        running.status.as_ref().and_then(|status| status.phase),
        Some(RestorePhase::Completed),
        "the restore finished before the rotation: the test proves nothing"
    );
    let mover_running = pods.get_opt(&mover).await.unwrap().is_some_and(|pod| {
        pod.status.and_then(|status| status.phase).as_deref() == Some("Running")
    });
    // The old CA stays trusted beside the new one.
    let bundle =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .get("custody-ca")
            .await
            .unwrap()
            .data
            .unwrap_or_default()
            .remove("ca.crt")
            .unwrap_or_default();
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2, "{bundle}");
    relay.set(s3::Fault::None);

    let restore = await_condition(
        &namespace.api::<Restore>(),
        "shop",
        "Completed",
        Duration::from_secs(600),
        |restore: &Restore| {
            restore.status.as_ref().and_then(|status| status.phase) == Some(RestorePhase::Completed)
        },
    )
    .await;
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    ready(pods, "shop-0").await;
    assert_eq!(tree(setup.source.path()), tree(target.path()));
    let done = asked.elapsed();
    // The agent reports after the rotation (to a report service whose certificate the new
    // CA signed), and nothing was restarted.
    let since = k8s_openapi::jiff::Timestamp::now();
    let agents: Api<NodeAgent> = Api::all(client.clone());
    await_condition(
        &agents,
        setup.node,
        "a report after the rotation",
        TIMEOUT,
        |agent: &NodeAgent| {
            agent
                .status
                .as_ref()
                .and_then(|status| status.last_heartbeat_time.as_ref())
                .is_some_and(|time| time.0 > since)
        },
    )
    .await;
    assert_eq!(
        custody_pod(client, "custody-agent").await,
        agent,
        "the agent was restarted"
    );
    assert_eq!(
        custody_pod(client, "custody-controller").await,
        controller,
        "the controller was restarted"
    );
    println!(
        "CA rotation during a restore: new CA signing after {:.1} s, gate certificate from it after {:.1} s (mover still writing: {mover_running}), restore completed and pod ready after {:.1} s",
        promoted.as_secs_f64(),
        reissued.as_secs_f64(),
        done.as_secs_f64()
    );
    setup.finish().await;
}

/// The process that leads, from Lease custody-system/custody-controller: `<pod>_<start>`.
pub(crate) async fn leader(client: &kube::Client) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NAMESPACE);
    let holder = leases
        .get_opt("custody-controller")
        .await
        .ok()??
        .spec?
        .holder_identity?;
    Some(holder).filter(|holder| holder.contains('_'))
}

/// `custody_controller_leader` of every controller pod that answers: (pod, value).
pub(crate) async fn leaders_by_metric(client: &kube::Client) -> Vec<(String, f64)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut values = Vec::new();
    for pod in pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=custody-controller"))
        .await
        .unwrap()
    {
        let Some(ip) = pod.status.as_ref().and_then(|status| status.pod_ip.clone()) else {
            continue;
        };
        let Some(body) = reqwest_get(&format!("http://{ip}:8080/metrics")).await else {
            continue;
        };
        if let Some(value) = body
            .lines()
            .find(|line| line.starts_with("custody_controller_leader "))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
        {
            values.push((pod.metadata.name.unwrap_or_default(), value));
        }
    }
    values
}

/// Whether the API server got an answer from custody's webhook for a pod in `namespace`
/// mounting `claim` (a server-side dry run): `Ok(true)` refused naming the claim (under
/// restore), `Ok(false)` admitted (the restore is over); `Err` says why there was no answer.
pub(crate) async fn webhook_answers(
    client: &kube::Client,
    namespace: &str,
    claim: &str,
) -> Result<bool, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "intruder"},
        "spec": {
            "containers": [{"name": "app", "image": "localhost/custody/postgres:15"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match pods.create(&params, &pod).await {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => {
            Err(status.message)
        }
        Err(kube::Error::Api(status)) if status.message.contains(claim) => Ok(true),
        Err(other) => Err(format!("not custody's refusal: {other}")),
    }
}

/// #23 item 6: custody runs two controller replicas; killing the one that leads (SIGKILL, no
/// Lease given up) while a restore writes its volume and while that restore holds the
/// deletion of its Backup loses nothing and does nothing twice. The other replica leads once
/// the Lease aged 15 s, the restore completes verified with one prepareData Job, the Backup's
/// artifact is deleted once after it, and the admission webhook answers throughout (the
/// other replica serves it) but in the first 2 s, while the dead replica may still be an
/// endpoint of the Service.
#[tokio::test]
async fn on_a_real_node_killing_the_leader_during_a_restore_and_a_backup_deletion_loses_and_repeats_nothing()
 {
    let setup = backed_up_with("leader", Agents::Exclusive(AGENTS.write().await)).await;
    let (namespace, pods, client) = (&setup.namespace, &setup.pods, &setup.client);
    let ns = namespace.name.clone();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    await_condition(
        &deployments,
        "custody-controller",
        "two ready replicas",
        TIMEOUT,
        |deployment: &Deployment| {
            deployment
                .status
                .as_ref()
                .and_then(|status| status.ready_replicas)
                == Some(2)
        },
    )
    .await;
    let first = custody_tests::eventually("a leader", TIMEOUT, || async {
        leader(client).await.ok_or_else(|| "none".to_string())
    })
    .await;

    let relay = setup.slow_repository().await;
    relay.set(s3::Fault::ThrottleDownloads(150_000));
    let target = LoopVolume::new(64);
    setup.restore_shop(target.path()).await;
    let (mover, _) = setup.running_mover().await;
    // The Backup is deleted while its restore runs: its artifact stays until the restore is
    // over.
    namespace
        .api::<Backup>()
        .delete("nightly", &Default::default())
        .await
        .unwrap();

    // Its pod: the process's name up to its start time.
    let first_pod = first.rsplit_once('_').unwrap().0.to_string();
    let killed = std::time::Instant::now();
    let containers = ctr(&[
        "containers",
        "ls",
        "-q",
        &format!(
            "labels.\"io.kubernetes.pod.name\"=={first_pod},labels.\"io.kubernetes.container.name\"==controller"
        ),
    ]);
    assert!(!containers.trim().is_empty(), "the leader's container");
    for container in containers.lines() {
        ctr(&["tasks", "kill", "-s", "SIGKILL", container]);
    }
    // The webhook answers throughout, and the other replica comes to lead.
    let (mut refused, mut admitted, mut unanswered) = (0, 0, Vec::new());
    let mut second = None;
    while killed.elapsed() < Duration::from_secs(30) {
        match webhook_answers(client, &ns, "data-shop-0").await {
            Ok(true) => refused += 1,
            Ok(false) => admitted += 1,
            Err(why) => unanswered.push((killed.elapsed(), why)),
        }
        if second.is_none()
            && let Some(now) = leader(client).await.filter(|now| *now != first)
        {
            second = Some((now, killed.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (second, took_over) = second.expect("another replica leads");
    let writing = pods.get_opt(&mover).await.unwrap().is_some_and(|pod| {
        pod.status.and_then(|status| status.phase).as_deref() == Some("Running")
    });
    println!(
        "leader {first} killed: {second} leads after {:.1} s (mover still writing: {writing}); webhook answered {} calls in 30 s ({refused} refused naming the claim under restore, {admitted} admitted), {} unanswered {unanswered:?}",
        took_over.as_secs_f64(),
        refused + admitted,
        unanswered.len(),
    );
    // The other replica took over once the Lease had aged its 15 s, not before.
    assert!(
        (Duration::from_secs(14)..Duration::from_secs(25)).contains(&took_over),
        "took over after {took_over:?}"
    );
    // Never two leaders: of the replicas that answer, one says it leads (the killed one,
    // restarted, waits its turn).
    for _ in 0..3 {
        let leaders = leaders_by_metric(client).await;
        let leading: f64 = leaders.iter().map(|(_, value)| value).sum();
        assert_eq!(leading, 1.0, "{leaders:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The first second after the kill, a call may still be sent to the dead replica
    // (connection refused) until its endpoint is taken out of the Service; after that every
    // call is answered.
    let late: Vec<_> = unanswered
        .iter()
        .filter(|(at, _)| *at >= Duration::from_secs(2))
        .collect();
    assert!(late.is_empty(), "the webhook did not answer: {late:?}");
    let running = namespace.api::<Restore>().get("shop").await.unwrap();
    assert_ne!(
        running.status.as_ref().and_then(|status| status.phase),
        Some(RestorePhase::Completed),
        "the restore finished before the other replica led: the test proves nothing"
    );
    assert_eq!(
        admitted, 0,
        "a pod mounting the claim under restore was admitted"
    );
    relay.set(s3::Fault::None);

    // Until the restore completes, every prepareData Job there ever is: one.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = namespace.api();
    let prepare = ListParams::default().labels(&format!(
        "{}={}",
        custody_proto::names::LABEL_ROLE,
        custody_proto::names::ROLE_PREPARE_DATA
    ));
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let restore = loop {
        for job in jobs.list(&prepare).await.unwrap() {
            seen.insert(job.metadata.uid.unwrap_or_default());
        }
        let restore = namespace.api::<Restore>().get("shop").await.unwrap();
        if restore.status.as_ref().and_then(|status| status.phase) == Some(RestorePhase::Completed)
        {
            break restore;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restore did not complete: {:?}",
            restore.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(seen.len(), 1, "prepareData Jobs: {seen:?}");
    let volume = &restore.status.as_ref().unwrap().volumes[0];
    assert_eq!(volume.state, VolumeState::Verified, "{volume:?}");
    ready(pods, "shop-0").await;
    assert_eq!(tree(setup.source.path()), tree(target.path()));
    // The Backup goes after the restore, its artifact deleted once.
    gone(&namespace.api::<Backup>(), "nightly").await;
    let events: Api<k8s_openapi::api::core::v1::Event> = namespace.api();
    let deletions: Vec<(Option<String>, Option<i32>, Option<String>)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| {
            event.involved_object.name.as_deref() == Some("nightly")
                && matches!(
                    event.reason.as_deref(),
                    Some("ArtifactDeleted" | "ArtifactAlreadyAbsent")
                )
        })
        .map(|event| (event.reason, event.count, event.message))
        .collect();
    assert_eq!(deletions.len(), 1, "{deletions:?}");
    assert_eq!(
        deletions[0].0.as_deref(),
        Some("ArtifactDeleted"),
        "{deletions:?}"
    );
    assert!(
        deletions[0].1.unwrap_or(1) == 1,
        "deleted more than once: {deletions:?}"
    );
    setup.finish().await;
}
