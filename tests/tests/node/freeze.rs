//! Freezing on the real node: a frozen volume always thawed within its bound, and only custody's Job may freeze.

use super::*;

/// The agent's metrics on the node (hostNetwork; `--http-address=$(HOST_IP):9446`, where
/// Prometheus scrapes them).
pub(crate) async fn agent_metric(name: &str) -> Option<f64> {
    let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
    let body = reqwest_get(&format!("http://{host}:9446/metrics")).await?;
    body.lines()
        .find(|line| line.starts_with(name) && !line.starts_with('#'))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// A plain HTTP GET of `url` (no client library: one request on a TCP stream).
pub(crate) async fn reqwest_get(url: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/')?;
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

/// Writes and syncs a small file on `volume` every 50 ms until stopped, noting when each
/// write started and how long it took: a write blocks for as long as the filesystem is
/// frozen. (A write to a frozen filesystem cannot be interrupted: if it never thawed, this
/// thread would hang, and the test's own timeouts would say so.)
pub(crate) struct Writer {
    pub(crate) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(crate) writes: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, Duration)>>>,
}

impl Writer {
    pub(crate) fn start(volume: &Path) -> Writer {
        use std::io::Write;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let path = volume.join("writer-probe");
        let (stopped, noted) = (stop.clone(), writes.clone());
        std::thread::spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let started = std::time::Instant::now();
                let mut file = std::fs::File::create(&path).expect("probe file");
                file.write_all(b"probe").expect("probe write");
                file.sync_all().expect("probe sync");
                noted.lock().unwrap().push((started, started.elapsed()));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Writer { stop, writes }
    }

    /// The longest write that started at or after `since`, and when the last write ended.
    pub(crate) fn longest_since(
        &self,
        since: std::time::Instant,
    ) -> (Duration, Option<std::time::Instant>) {
        let writes = self.writes.lock().unwrap();
        let longest = writes
            .iter()
            .filter(|(started, _)| *started >= since)
            .map(|(_, took)| *took)
            .max()
            .unwrap_or_default();
        (
            longest,
            writes.last().map(|(started, took)| *started + *took),
        )
    }

    /// Waits until a write that started at or after `since` has finished: the filesystem is
    /// writable. Returns when that write ended.
    pub(crate) async fn writable_after(
        &self,
        since: std::time::Instant,
        what: &str,
    ) -> std::time::Instant {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            if let Some(ended) = self
                .writes
                .lock()
                .unwrap()
                .iter()
                .find(|(started, _)| *started >= since)
                .map(|(started, took)| *started + *took)
            {
                return ended;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the filesystem stayed frozen after {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// SIGKILLs the agent container (not the pod: the kubelet restarts the container, after its
/// crash-loop back-off when it crashed recently).
pub(crate) fn kill_agents() {
    let agents = ctr(&[
        "containers",
        "ls",
        "-q",
        "labels.\"io.kubernetes.container.name\"==agent",
    ]);
    for container in agents.lines() {
        let _ = std::process::Command::new("ctr")
            .args([
                "--address",
                "/run/custody-node/containerd.sock",
                "-n",
                "k8s.io",
            ])
            .args(["tasks", "kill", "-s", "SIGKILL", container])
            .output();
    }
}

/// Waits until the agent holds a filesystem frozen; returns when it saw it.
pub(crate) async fn frozen_now() -> std::time::Instant {
    custody_tests::eventually("a filesystem frozen by the agent", TIMEOUT, || async {
        match agent_metric("custody_agent_frozen_filesystems").await {
            Some(value) if value >= 1.0 => Ok(std::time::Instant::now()),
            other => Err(format!("custody_agent_frozen_filesystems {other:?}")),
        }
    })
    .await
}

/// A Backup of Cluster orders with the Freeze method and `max_seconds`.
pub(crate) async fn frozen_backup(namespace: &TestNamespace, name: &str, max_seconds: u32) {
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": "orders"},
                        "consistency": {"method": "Freeze", "maxFreezeSeconds": max_seconds}}}),
    )
    .await;
}

/// The note of the Warning Event `reason` on Backup `name` (a thaw the agent reported).
pub(crate) async fn thaw_said(namespace: &TestNamespace, name: &str, reason: &str) -> String {
    custody_tests::event_where(namespace, &format!("{reason} on Backup {name}"), |event| {
        event.reason.as_deref() == Some(reason)
            && event.involved_object.name.as_deref() == Some(name)
    })
    .await
    .message
    .unwrap_or_default()
}

/// Waits for Backup `name` to fail; its Ready reason and message.
pub(crate) async fn backup_fails(namespace: &TestNamespace, name: &str) -> (String, String) {
    let failed = await_condition(
        &namespace.api::<Backup>(),
        name,
        "Failed",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Failed)
        },
    )
    .await;
    let ready = failed
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|condition| condition.type_ == "Ready")
        .unwrap();
    (ready.reason, ready.message)
}

/// What both freeze tests start from: custody installed on the real node, Cluster `orders`
/// whose pod runs on a loop-device volume holding the small database (and what `fill` adds),
/// backed up through an S3 relay the test can stall.
pub(crate) struct FreezeSetup {
    pub(crate) _agents: tokio::sync::RwLockWriteGuard<'static, ()>,
    pub(crate) _installed: Installed,
    pub(crate) node: &'static str,
    pub(crate) client: kube::Client,
    pub(crate) namespace: TestNamespace,
    pub(crate) relay: s3::FaultyLink,
    pub(crate) source: LoopVolume,
    pub(crate) pods: Api<Pod>,
}

impl FreezeSetup {
    pub(crate) async fn start(name: &str, fill: impl FnOnce(&Path)) -> FreezeSetup {
        let agents = AGENTS.write().await;
        let node = real_node();
        let installed = Installed::apply();
        let client = client().await;
        running(&client).await;
        let namespace = TestNamespace::create(name).await;
        let bucket = s3::bucket(s3::shared(), name).await;
        let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
        let relay = s3::FaultyLink::start_on(&host, s3::shared());
        repository(&namespace, &relay.url, &bucket).await;
        // The tests stall uploads on purpose, longer than the default 60 s stall bound would
        // allow on a slow run.
        namespace
            .api::<custody_kube::api::BackupRepository>()
            .patch(
                "store",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"timeouts": {"stallSeconds": 600}}})),
            )
            .await
            .unwrap();
        let source = LoopVolume::new(64);
        small_database(source.path());
        fill(source.path());
        local_volume(
            &client,
            node,
            &namespace.name,
            "data-orders-0",
            source.path(),
        )
        .await;
        source_cluster(&namespace).await;
        create::<StatefulSet>(&namespace.api(), statefulset("orders")).await;
        let pods: Api<Pod> = namespace.api();
        await_condition(&pods, "orders-0", "running", TIMEOUT, |pod: &Pod| {
            pod.status
                .as_ref()
                .and_then(|status| status.phase.as_deref())
                == Some("Running")
        })
        .await;
        FreezeSetup {
            _agents: agents,
            _installed: installed,
            node,
            client,
            namespace,
            relay,
            source,
            pods,
        }
    }

    /// Deletes the namespace and the volume's PersistentVolume.
    pub(crate) async fn finish(self) {
        let ns = self.namespace.name.clone();
        self.namespace.delete().await;
        let _ = Api::<PersistentVolume>::all(self.client.clone())
            .delete(&format!("{ns}-data-orders-0"), &Default::default())
            .await;
    }
}

/// Issue 14, method Freeze: a frozen filesystem is always thawed, within its bound, whichever
/// party fails. The S3 server stalls (a relay that accepts and never answers), so the mover
/// holds the freeze while its upload hangs; a writer on the volume measures the stall.
/// - the bound passes: the agent thaws at `maxFreezeSeconds`, the Backup fails `FreezeLost`;
/// - the mover's pod is killed mid-freeze: the call drops and the agent thaws at once;
/// - the agent is killed (SIGKILL) mid-freeze: its restarted container thaws what it noted,
///   and the mover, its call broken, fails the Backup with `FreezeLost`.
#[tokio::test]
async fn on_a_real_node_a_frozen_volume_is_always_thawed_within_its_bound() {
    let bulk = |root: &Path| {
        // More than the mover buffers (two 5 MiB parts) and incompressible: with the upload
        // stalled, the read waits, and the freeze lasts.
        let mut bulk = vec![0u8; 40 << 20];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bulk))
            .unwrap();
        std::fs::write(root.join("bulk"), bulk).unwrap();
    };
    let setup = FreezeSetup::start("freeze", bulk).await;
    let (namespace, relay, source, pods, client) = (
        &setup.namespace,
        &setup.relay,
        &setup.source,
        &setup.pods,
        &setup.client,
    );
    let ns = namespace.name.clone();
    await_condition(
        &namespace.api::<custody_kube::api::BackupRepository>(),
        "store",
        "Ready",
        TIMEOUT,
        |repository: &custody_kube::api::BackupRepository| {
            repository.status.as_ref().is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|condition| condition.type_ == "Ready" && condition.status == "True")
            })
        },
    )
    .await;
    let writer = Writer::start(source.path());
    // Each phase: the S3 server stalls while the volume is frozen; once the volume is
    // writable again it answers, so that the mover can abort its upload and report.
    relay.set(s3::Fault::StallWrites);

    // The bound passes.
    let created = std::time::Instant::now();
    frozen_backup(namespace, "bounded", 5).await;
    let frozen = frozen_now().await;
    let thawed = writer.writable_after(frozen, "the bound").await;
    relay.set(s3::Fault::None);
    let (reason, message) = backup_fails(namespace, "bounded").await;
    assert_eq!(reason, "FreezeLost", "{message}");
    let (stall, _) = writer.longest_since(created);
    eprintln!(
        "freeze bound 5 s: writes stalled {:.2} s; writable {:.2} s after the agent reported frozen",
        stall.as_secs_f64(),
        (thawed - frozen).as_secs_f64()
    );
    assert!(stall <= Duration::from_secs(8), "stalled {stall:?}");
    assert!(
        stall >= Duration::from_secs(3),
        "the volume was not frozen: {stall:?}"
    );

    // The mover's pod killed mid-freeze.
    relay.set(s3::Fault::StallWrites);
    frozen_backup(namespace, "mover-killed", 120).await;
    frozen_now().await;
    let jobs = kubectl(&[
        "-n",
        &ns,
        "get",
        "pods",
        "-l",
        "custody.io/role=backup",
        "--field-selector=status.phase=Running",
        "-o",
        "name",
    ]);
    let mover = String::from_utf8_lossy(&jobs.stdout).trim().to_string();
    assert!(!mover.is_empty(), "no running mover pod");
    let killed = std::time::Instant::now();
    let output = kubectl(&[
        "-n",
        &ns,
        "delete",
        &mover,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    assert!(output.status.success(), "{output:?}");
    let thawed = writer.writable_after(killed, "the mover was killed").await;
    eprintln!(
        "mover killed mid-freeze: writable {:.2} s later",
        thawed.saturating_duration_since(killed).as_secs_f64()
    );
    assert!(thawed.saturating_duration_since(killed) < Duration::from_secs(30));
    relay.set(s3::Fault::None);
    backup_fails(namespace, "mover-killed").await;

    // The agent killed mid-freeze.
    relay.set(s3::Fault::StallWrites);
    frozen_backup(namespace, "agent-killed", 120).await;
    frozen_now().await;
    let killed = std::time::Instant::now();
    kill_agents();
    let thawed = writer.writable_after(killed, "the agent was killed").await;
    eprintln!(
        "agent killed mid-freeze: writable {:.2} s later (its restarted container thawed it)",
        thawed.saturating_duration_since(killed).as_secs_f64()
    );
    relay.set(s3::Fault::None);
    let (reason, message) = backup_fails(namespace, "agent-killed").await;
    assert_eq!(reason, "FreezeLost", "{message}");
    let thawed_at_start =
        agent_metric("custody_agent_freezes_total{reason=\"ThawedAtStart\"}").await;
    assert_eq!(
        thawed_at_start,
        Some(1.0),
        "the restarted agent thawed the noted filesystem"
    );
    // The Backup says when the filesystem thawed (the mover only knew when its call broke).
    let said = thaw_said(namespace, "agent-killed", "ThawedByRestartedAgent").await;
    eprintln!("agent-killed: {said}");
    assert!(
        said.contains("the agent, restarted, thawed") && said.contains("(bound 120 s)"),
        "{said}"
    );

    // The agent killed again, twice in a row (issue 23, item 3): the kubelet's crash-loop
    // back-off delays its restart by 10 s, then 20 s, but the watchdog container thaws at
    // the Backup's bound, 5 s, then 15 s: by then the mover, its call broken, has exited and
    // its pod's mount of the volume is gone, so the watchdog thaws through the
    // application's mount of the device.
    for (round, bound) in [("again", 5u32), ("a third time", 15)] {
        // The agent back from its last kill (a mover that finds no agent fails at once).
        custody_tests::eventually("the agent serving again", TIMEOUT, || async {
            match agent_metric("custody_agent_frozen_filesystems").await {
                Some(0.0) => Ok(()),
                other => Err(format!("custody_agent_frozen_filesystems {other:?}")),
            }
        })
        .await;
        relay.set(s3::Fault::StallWrites);
        let name = format!("agent-killed-{}", round.replace(' ', "-"));
        frozen_backup(namespace, &name, bound).await;
        let frozen = frozen_now().await;
        if bound == 15 {
            // A second freeze of the frozen filesystem (here the mover's own pod asking again)
            // is refused before FIFREEZE and leaves the first freeze's note alone: the
            // watchdog still thaws at the first freeze's bound once the agent is killed.
            let mover = pods
                .list(&ListParams::default().labels("custody.io/role=backup"))
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|pod| {
                    pod.status
                        .as_ref()
                        .and_then(|status| status.phase.as_deref())
                        == Some("Running")
                })
                .expect("the running mover");
            let refused = freeze_as(client, &ns, &mover, "data-orders-0", 30, None)
                .await
                .expect_err("a second freeze of a frozen filesystem");
            eprintln!("second freeze: {}", refused.message());
            assert_eq!(
                refused.code(),
                tonic::Code::FailedPrecondition,
                "{refused:?}"
            );
            assert!(refused.message().contains("frozen already"), "{refused:?}");
        }
        kill_agents();
        let thawed = writer.writable_after(frozen, "the agent was killed").await;
        relay.set(s3::Fault::None);
        let (stall, _) = writer.longest_since(frozen - Duration::from_secs(1));
        eprintln!(
            "agent killed {round} mid-freeze, bound {bound} s: writes stalled {:.2} s; writable {:.2} s after the agent reported frozen",
            stall.as_secs_f64(),
            (thawed - frozen).as_secs_f64()
        );
        assert!(
            stall <= Duration::from_secs(bound.into()) + Duration::from_millis(1500),
            "the freeze outlived its bound of {bound} s: {stall:?}"
        );
        let (reason, message) = backup_fails(namespace, &name).await;
        assert_eq!(reason, "FreezeLost", "{message}");
        // Once the agent is back, the Backup says when the watchdog thawed: at the bound.
        let said = thaw_said(namespace, &name, "ThawedByWatchdog").await;
        eprintln!("{name}: {said}");
        let held: f64 = said
            .split(" s after it was frozen")
            .next()
            .and_then(|before| before.rsplit(", ").next())
            .and_then(|seconds| seconds.parse().ok())
            .unwrap_or_else(|| panic!("no time held in {said:?}"));
        assert!(
            held >= f64::from(bound) - 0.5 && held <= f64::from(bound) + 1.5,
            "the watchdog thawed {held} s after the freeze, bound {bound} s: {said}"
        );
        assert!(said.contains(&format!("(bound {bound} s)")), "{said}");
    }

    relay.set(s3::Fault::None);
    drop(writer);
    setup.finish().await;
}

/// Asks this node's gate to freeze `claim` for `seconds` as pod `pod` of `namespace` (a
/// token bound to it, as the kubelet projects into the mover), over a connection whose
/// stream window is `window` bytes (`Some(0)`: a client that reads nothing). The response
/// once the agent answered; its messages are not read.
pub(crate) async fn freeze_as(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    claim: &str,
    seconds: u32,
    window: Option<u32>,
) -> Result<tonic::Response<tonic::Streaming<custody_proto::gate::FreezeProgress>>, tonic::Status> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let node = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone())
        .expect("the pod's node");
    let address = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&node)
        .await
        .unwrap()
        .status
        .and_then(|status| status.addresses)
        .into_iter()
        .flatten()
        .find(|address| address.type_ == "InternalIP")
        .expect("the node's address")
        .address;
    let bundle =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .get("custody-ca")
            .await
            .unwrap()
            .data
            .and_then(|data| data.get("ca.crt").cloned())
            .expect("custody's CA bundle");
    let token = custody_tests::kubelet::request_token(
        client,
        namespace,
        "default",
        custody_proto::names::GATE_AUDIENCE,
        Some(k8s_openapi::api::authentication::v1::BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name_any()),
            uid: pod.metadata.uid.clone(),
        }),
    )
    .await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(bundle))
        .domain_name(format!("{node}.{}", custody_proto::names::GATE_NAME_SUFFIX));
    let channel = Endpoint::from_shared(format!(
        "https://{address}:{}",
        custody_proto::names::GATE_PORT
    ))
    .unwrap()
    .tls_config(tls)
    .unwrap()
    .initial_stream_window_size(window)
    .connect()
    .await
    .expect("connecting to the gate");
    let mut request = tonic::Request::new(custody_proto::gate::FreezeRequest {
        claim_name: claim.to_string(),
        max_seconds: seconds,
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    custody_proto::gate::gate_client::GateClient::new(channel)
        .freeze(request)
        .await
}

/// #23 item 3: only the Job custody created for a Backup may freeze, and never longer than
/// the Backup's bound, whatever the caller does. A Backup with `maxFreezeSeconds: 8` runs
/// (its upload stalled once the small volume is read and its freeze released). Then:
/// - a tenant's forged Job (the Backup as its controlling owner, custody's labels, a pod
///   that mounts the claim on this node) asks the agent for a freeze: refused, naming the
///   Job the Backup recorded;
/// - the real mover's pod asks for 120 s over a connection that reads nothing (a zero HTTP/2
///   stream window: not even the first message can be sent): the filesystem is frozen and
///   thawed at the Backup's 8 s, not the 120 s asked nor the agent's 600 s, and a writer on
///   the volume stalls no longer.
#[tokio::test]
async fn on_a_real_node_only_custodys_job_freezes_and_never_past_the_backups_bound() {
    let setup = FreezeSetup::start("freezecall", |_| {}).await;
    let (namespace, relay, source, pods, client, node) = (
        &setup.namespace,
        &setup.relay,
        &setup.source,
        &setup.pods,
        &setup.client,
        setup.node,
    );
    let ns = namespace.name.clone();
    let writer = Writer::start(source.path());

    // The Backup runs: its mover froze, read the few MiB and let go; its upload hangs.
    let released = "custody_agent_freezes_total{reason=\"Released\"}";
    let before = agent_metric(released).await.unwrap_or(0.0);
    relay.set(s3::Fault::StallWrites);
    frozen_backup(namespace, "held", 8).await;
    // Frozen and thawed again within milliseconds: the counter, not the gauge, shows it.
    custody_tests::eventually("the mover's freeze released", TIMEOUT, || async {
        match agent_metric(released).await {
            Some(count) if count > before => Ok(()),
            other => Err(format!("{released} {other:?}")),
        }
    })
    .await;
    let backup = namespace.api::<Backup>().get("held").await.unwrap();
    let status = backup.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(BackupPhase::Running));
    assert_eq!(status.max_freeze_seconds, Some(8));
    let recorded = status
        .job
        .clone()
        .expect("the Job custody created, recorded");
    let mover = pods
        .list(&ListParams::default().labels(&format!("job-name={}", recorded.name)))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the mover's pod");

    // A forged Job: everything a tenant can write says it is the Backup's.
    let backup_uid = backup.metadata.uid.clone().unwrap();
    create::<k8s_openapi::api::batch::v1::Job>(
        &namespace.api(),
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {
                "name": "forged",
                "labels": {"custody.io/role": "backup", "custody.io/backup-uid": backup_uid},
                "ownerReferences": [{"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
                                     "name": "held", "uid": backup_uid, "controller": true}],
            },
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": {"custody.io/role": "backup"}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeName": node,
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "forger", "image": "ghcr.io/custody/custody-agent:0.1.0",
                                    "command": ["custody-watchdog", "--state-dir=/tmp"],
                                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-orders-0", "readOnly": true}}],
                },
            }},
        }),
    )
    .await;
    let forger = custody_tests::eventually("the forged Job's pod running", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let listed = pods
                .list(&ListParams::default().labels("job-name=forged"))
                .await
                .map_err(|error| error.to_string())?;
            listed
                .items
                .into_iter()
                .find(|pod| {
                    pod.status
                        .as_ref()
                        .and_then(|status| status.phase.as_deref())
                        == Some("Running")
                })
                .ok_or_else(|| "not running yet".to_string())
        }
    })
    .await;
    let refused = freeze_as(client, &ns, &forger, "data-orders-0", 30, None)
        .await
        .expect_err("a forged Job's pod was allowed to freeze");
    eprintln!("forged Job: {}", refused.message());
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("not the Job custody created")
            && refused.message().contains(&recorded.uid),
        "{}",
        refused.message()
    );
    assert_eq!(
        agent_metric("custody_agent_frozen_filesystems").await,
        Some(0.0),
        "nothing frozen for the forger"
    );

    // The real mover's pod, asking for 120 s and reading nothing.
    let asked = std::time::Instant::now();
    let response = freeze_as(client, &ns, &mover, "data-orders-0", 120, Some(0))
        .await
        .expect("the mover's pod may freeze");
    let frozen = frozen_now().await;
    let thawed = writer.writable_after(frozen, "the Backup's bound").await;
    let (stall, _) = writer.longest_since(asked);
    eprintln!(
        "zero-window client asking 120 s, Backup bound 8 s: writes stalled {:.2} s; writable {:.2} s after the agent reported frozen",
        stall.as_secs_f64(),
        (thawed - frozen).as_secs_f64()
    );
    assert!(
        stall >= Duration::from_secs(5),
        "the volume was not frozen: {stall:?}"
    );
    assert!(
        stall <= Duration::from_millis(9_500),
        "the freeze outlived the Backup's bound of 8 s: {stall:?}"
    );
    drop(response);

    // The Backup itself was not disturbed: its copy completes.
    relay.set(s3::Fault::None);
    await_condition(
        &namespace.api::<Backup>(),
        "held",
        "Completed",
        TIMEOUT,
        |backup: &Backup| {
            backup.status.as_ref().and_then(|status| status.phase) == Some(BackupPhase::Completed)
        },
    )
    .await;
    drop(writer);
    setup.finish().await;
}
