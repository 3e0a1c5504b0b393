//! PostgreSQL backed up and restored on the real node: stopped, frozen and by pg_basebackup under pgbench, with its WAL on a second volume.

use super::*;
use crate::freeze::backup_fails;

/// What the tests compare before and after: every account's balance, as a count, a sum and a
/// digest over all rows in key order.
pub(crate) const ACCOUNTS: &str = "select count(*) || ' ' || sum(abalance) || ' ' || md5(string_agg(aid || ':' || abalance, ',' order by aid)) from pgbench_accounts";

/// Cluster `orders`: PostgreSQL on a real volume of the node, with `consistency` (or none),
/// `scale` × 100,000 pgbench accounts, some transactions run, and amcheck installed. Its
/// volume.
pub(crate) async fn postgres_source(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    consistency: Option<serde_json::Value>,
    scale: u32,
) -> LoopVolume {
    let ns = namespace.name.clone();
    let source = LoopVolume::new(volume_mib(scale));
    std::os::unix::fs::chown(source.path(), Some(999), Some(999)).unwrap();
    local_volume(client, node, &ns, "data-orders-0", source.path()).await;
    let mut spec = json!({"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                          "repositoryRef": {"name": "store"}});
    if let Some(consistency) = consistency {
        spec["consistency"] = consistency;
    }
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": "orders"}, "spec": spec}),
    )
    .await;
    create::<StatefulSet>(&namespace.api(), postgres_statefulset("orders")).await;
    let scale = scale.to_string();
    custody_tests::eventually("pgbench -i", TIMEOUT, || {
        let (ns, scale) = (ns.clone(), scale.clone());
        async move { exec(&ns, "orders-0", &["pgbench", "-i", "-s", &scale, "-q"]) }
    })
    .await;
    exec(&ns, "orders-0", &["pgbench", "-c", "2", "-t", "300", "-n"]).unwrap();
    exec(&ns, "orders-0", &["psql", "-c", "create extension amcheck"]).unwrap();
    source
}

/// The size of a volume for a pgbench database of `scale` (about 16 MB each) with its WAL.
pub(crate) fn volume_mib(scale: u32) -> u64 {
    (u64::from(scale) * 48).max(1024)
}

/// Restores Backup `backup` into Cluster `shop` on a new real volume: checks that custody-wait
/// held its pod until the agent verified the volume, then waits until PostgreSQL answers.
/// The volume, and the time from the Cluster's creation to the first answer.
pub(crate) async fn restore_postgres(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    backup: &str,
    scale: u32,
) -> (LoopVolume, Duration) {
    let started = std::time::Instant::now();
    let target = restore_shop(
        client,
        node,
        namespace,
        backup,
        postgres_statefulset("shop"),
        volume_mib(scale),
    )
    .await;
    sql(&namespace.name, "shop-0", "select 1").await;
    (target, started.elapsed())
}

/// Restores Backup `backup` into Cluster `shop` (StatefulSet `stateful_set`) on a new real
/// volume, and checks that custody-wait held its pod, the application not ready, until the
/// agent verified the volume and the Restore completed. The volume.
pub(crate) async fn restore_shop(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    backup: &str,
    stateful_set: serde_json::Value,
    mib: u64,
) -> LoopVolume {
    restore_shop_volumes(
        client,
        node,
        namespace,
        backup,
        stateful_set,
        mib,
        &["data"],
    )
    .await
    .remove(0)
}

/// [`restore_shop`] of a StatefulSet with a claim of each of `templates` (all of the
/// Backup's volumes), each on a new real volume; every one is verified before the pod starts.
pub(crate) async fn restore_shop_volumes(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    backup: &str,
    stateful_set: serde_json::Value,
    mib: u64,
    templates: &[&str],
) -> Vec<LoopVolume> {
    let ns = namespace.name.clone();
    let mut targets = Vec::new();
    for template in templates {
        let target = LoopVolume::new(mib);
        std::os::unix::fs::chown(target.path(), Some(999), Some(999)).unwrap();
        local_volume(
            client,
            node,
            &ns,
            &format!("{template}-shop-0"),
            target.path(),
        )
        .await;
        targets.push(target);
    }
    create::<Cluster>(
        &namespace.api(),
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "shop"},
            "spec": {"statefulSetRef": {"name": "shop"}, "volumeClaimTemplates": templates,
                     "restore": {"backupRef": {"name": backup}}},
        }),
    )
    .await;
    await_condition(
        &namespace.api::<Restore>(),
        "shop",
        "the Restore",
        TIMEOUT,
        |_: &Restore| true,
    )
    .await;
    // Marked as under restore before the Cluster was admitted (the requester webhook).
    let namespace_labels = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get(&ns)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert!(
        namespace_labels.contains_key("custody.io/restore-in-progress"),
        "{namespace_labels:?}"
    );
    create::<StatefulSet>(&namespace.api(), stateful_set).await;
    let pods: Api<Pod> = namespace.api();
    let held = await_condition(
        &pods,
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
                    .is_some_and(|wait| wait.name == "custody-wait")
            })
        },
    )
    .await;
    assert!(
        held.status
            .unwrap()
            .container_statuses
            .iter()
            .flatten()
            .all(|container| !container.ready),
        "PostgreSQL ran before the volume was verified"
    );
    let restore = restore_reaches(namespace, "shop", RestorePhase::Completed).await;
    let volumes = restore.status.unwrap().volumes;
    assert_eq!(volumes.len(), templates.len(), "{volumes:?}");
    assert!(
        volumes
            .iter()
            .all(|volume| volume.state == VolumeState::Verified),
        "{volumes:?}"
    );
    targets
}

/// Waits until PostgreSQL in `pod` answers `query`; its answer.
pub(crate) async fn sql(namespace: &str, pod: &str, query: &str) -> String {
    let (namespace, pod, query) = (namespace.to_string(), pod.to_string(), query.to_string());
    custody_tests::eventually("PostgreSQL answering", TIMEOUT, || {
        let (namespace, pod, query) = (namespace.clone(), pod.clone(), query.clone());
        async move { exec(&namespace, &pod, &["psql", "-Atc", &query]) }
    })
    .await
}

/// Deletes the namespace and the PersistentVolumes made for it.
pub(crate) async fn finish_postgres(client: &kube::Client, namespace: TestNamespace) {
    let ns = namespace.name.clone();
    namespace.delete().await;
    for claim in ["data-orders-0", "data-shop-0"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{ns}-{claim}"), &Default::default())
            .await;
    }
}

/// Where each database test on the real node starts: the node, custody installed from
/// `deploy/`, and a namespace of its own with BackupRepository `store` in a bucket of its own,
/// reached directly or, `throttled`, through a relay limited to 3 MB/s (so that reading a
/// volume spans many seconds of the application's writes).
pub(crate) struct Stage {
    // Dropped in this order: the install is given back before the agents' lock.
    pub(crate) _installed: Installed,
    pub(crate) _agents: tokio::sync::RwLockReadGuard<'static, ()>,
    pub(crate) _relay: Option<s3::FaultyLink>,
    pub(crate) node: &'static str,
    pub(crate) client: kube::Client,
    pub(crate) namespace: TestNamespace,
}

impl Stage {
    pub(crate) async fn new(name: &str, throttled: bool) -> Stage {
        let agents = AGENTS.read().await;
        let node = real_node();
        let installed = Installed::apply();
        let client = client().await;
        running(&client).await;
        let namespace = TestNamespace::create(name).await;
        let bucket = s3::bucket(s3::shared(), name).await;
        let relay = throttled.then(|| {
            let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
            let relay = s3::FaultyLink::start_on(&host, s3::shared());
            relay.set(s3::Fault::Throttle(3_000_000));
            relay
        });
        let url = relay
            .as_ref()
            .map_or_else(s3_for_pods, |relay| relay.url.clone());
        encrypted_repository(&namespace, &url, &bucket).await;
        Stage {
            _agents: agents,
            _installed: installed,
            _relay: relay,
            node,
            client,
            namespace,
        }
    }
}

/// Issue 13 item 4 and issue 14, on a real node with a real PostgreSQL: a backup of the
/// database while it runs, with no consistency method, is refused; stopped (its StatefulSet
/// scaled to 0), it is backed up as a stopped application; restored into a new Cluster, whose
/// pod custody-wait holds in Init until the agent verified the volume, PostgreSQL starts on it
/// without a manual step and answers with exactly the same rows, its indexes and heap intact
/// (pg_amcheck --heapallindexed).
#[tokio::test]
async fn on_a_real_node_postgresql_backed_up_stopped_restores_verified_and_answers_with_the_same_rows()
 {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("postgres", false).await;
    let ns = namespace.name.clone();
    let _source = postgres_source(&client, node, &namespace, None, 3).await;
    let before = sql(&ns, "orders-0", ACCOUNTS).await;
    assert!(before.starts_with("300000 "), "{before}");

    // Running, no method: refused, naming the pod.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
               "metadata": {"name": "live"}, "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "live").await;
    assert_eq!(reason, "ConsistencyMethodRequired", "{message}");
    assert!(message.contains("pod orders-0"), "{message}");

    // Stopped: the StatefulSet scaled to 0, PostgreSQL shut down cleanly; then backed up.
    let output = kubectl(&["-n", &ns, "scale", "statefulset/orders", "--replicas=0"]);
    assert!(output.status.success(), "{output:?}");
    gone(&namespace.api::<Pod>(), "orders-0").await;
    nightly_completed(&namespace).await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(Capture::Stopped));
    assert!(
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Consistent" && condition.status == "True"),
        "{:?}",
        status.conditions
    );
    // Placed by the scheduler: the node is not known at the start, and is recorded once that
    // node's agent reports the mover (a copy faster than the first report leaves it unset).
    assert!(
        status.node_name.is_none() || status.node_name.as_deref() == Some(node),
        "{:?}",
        status.node_name
    );

    // Restored into Cluster shop: held until verified, then PostgreSQL starts on it. Its pod
    // template lacks the label custody.io/cluster (issue 23, item 4): the pod is held by the
    // claim it mounts, in a namespace custody marked as under restore.
    let started = std::time::Instant::now();
    let mut unlabelled = postgres_statefulset("shop");
    unlabelled["spec"]["template"]["metadata"]["labels"] = json!({"app": "shop"});
    let _target = restore_shop(
        &client,
        node,
        &namespace,
        "nightly",
        unlabelled,
        volume_mib(3),
    )
    .await;
    sql(&ns, "shop-0", "select 1").await;
    let restore_to_answer = started.elapsed();
    let after = sql(&ns, "shop-0", ACCOUNTS).await;
    assert_eq!(after, before, "the restored database has other rows");
    consistent(&namespace, 3).await;
    eprintln!(
        "postgres restore (stopped copy): Cluster created to the restored database answering: {:.1} s (artifact {} bytes)",
        restore_to_answer.as_secs_f64(),
        status
            .artifact
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default()
    );
    finish_postgres(&client, namespace).await;
}

/// pgbench's own invariant: every transaction adds the same delta to one account, one teller,
/// one branch and the history. In any consistent state the four sums are equal.
pub(crate) const PGBENCH_SUMS: &str = "select (select sum(abalance) from pgbench_accounts) || ' ' || (select sum(tbalance) from pgbench_tellers) || ' ' || (select sum(bbalance) from pgbench_branches) || ' ' || (select coalesce(sum(delta), 0) from pgbench_history) || ' ' || (select count(*) from pgbench_accounts)";

/// Issue 14, method Freeze, the acceptance bar on a real PostgreSQL: four pgbench clients
/// write and a CHECKPOINT runs every second while the volume is backed up with the
/// filesystem frozen. The restore starts without a manual step (crash recovery from one
/// instant), every account is there, pgbench's four sums agree (no transaction torn), and
/// pg_amcheck --heapallindexed is clean; pgbench itself never failed. The write stall is the
/// Backup's `frozenMillis`.
///
/// The upload goes through a relay limited to 3 MB/s, so that reading the 2,000,000-account
/// database spans many seconds of writes and checkpoints (the mover reads only as fast as it
/// uploads, past a few parts in memory): the same run with method `CrashUnsafe` restores a
/// database that fails these checks.
#[tokio::test]
async fn on_a_real_node_postgresql_frozen_while_pgbench_writes_restores_consistent() {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("pgfreeze", true).await;
    let ns = namespace.name.clone();
    let method = std::env::var("CUSTODY_TEST_PG_METHOD").unwrap_or_else(|_| "Freeze".into());
    let _source = postgres_source(
        &client,
        node,
        &namespace,
        Some(if method == "Freeze" {
            json!({"method": method, "maxFreezeSeconds": 120})
        } else {
            json!({"method": method})
        }),
        20,
    )
    .await;

    let load = Load::start(&ns, 75);
    tokio::time::sleep(Duration::from_secs(5)).await;
    nightly_completed(&namespace).await;
    let written_during = sql(&ns, "orders-0", "select count(*) from pgbench_history").await;
    let (tps, checkpoints) = load.finish().await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    let stall = status.frozen_millis.unwrap_or_default();
    if method == "Freeze" {
        assert_eq!(status.consistency, Some(Capture::Frozen), "{status:?}");
        assert!(stall > 0, "the stall is recorded: {status:?}");
    }

    let (_target, restore_to_answer) =
        restore_postgres(&client, node, &namespace, "nightly", 20).await;
    let sums = consistent(&namespace, 20).await;
    eprintln!(
        "postgres {method} copy under pgbench -c 4 ({tps}; {checkpoints} checkpoints; {written_during} history rows when the backup ended): filesystem frozen {stall} ms; restored sums {sums}; restore to answer {:.1} s",
        restore_to_answer.as_secs_f64()
    );
    finish_postgres(&client, namespace).await;
}

/// pgbench with four clients for `seconds`, and a CHECKPOINT every second meanwhile, against
/// orders-0.
pub(crate) struct Load {
    pub(crate) pgbench: std::thread::JoinHandle<Result<String, String>>,
    pub(crate) checkpoints: std::thread::JoinHandle<u32>,
}

impl Load {
    pub(crate) fn start(namespace: &str, seconds: u64) -> Load {
        Load::with(namespace, seconds, &[], Duration::from_secs(1))
    }

    /// [`Load::start`] with more pgbench arguments (`-R 250`: a paced rate) and a CHECKPOINT
    /// every `every`.
    pub(crate) fn with(namespace: &str, seconds: u64, extra: &[&str], every: Duration) -> Load {
        let ns = namespace.to_string();
        let extra: Vec<String> = extra.iter().map(|arg| arg.to_string()).collect();
        let pgbench = std::thread::spawn(move || {
            let seconds = seconds.to_string();
            let mut args = vec!["pgbench", "-c", "4", "-T", &seconds, "-n", "-P", "5"];
            args.extend(extra.iter().map(String::as_str));
            exec(&ns, "orders-0", &args)
        });
        let ns = namespace.to_string();
        let checkpoints = std::thread::spawn(move || {
            let until = std::time::Instant::now() + Duration::from_secs(seconds.saturating_sub(5));
            let mut done = 0;
            while std::time::Instant::now() < until {
                if exec(&ns, "orders-0", &["psql", "-c", "checkpoint"]).is_ok() {
                    done += 1;
                }
                std::thread::sleep(every);
            }
            done
        });
        Load {
            pgbench,
            checkpoints,
        }
    }

    /// Waits for the load to end; pgbench's `tps` line (it must not have failed) and the
    /// number of checkpoints run.
    pub(crate) async fn finish(self) -> (String, u32) {
        let Load {
            pgbench,
            checkpoints,
        } = self;
        let report = tokio::task::spawn_blocking(move || pgbench.join().unwrap())
            .await
            .unwrap()
            .expect("pgbench kept running through the backup");
        let checkpoints = tokio::task::spawn_blocking(move || checkpoints.join().unwrap())
            .await
            .unwrap();
        let tps = report
            .lines()
            .find(|line| line.starts_with("tps"))
            .unwrap_or_default()
            .to_string();
        (tps, checkpoints)
    }
}

/// The acceptance checks of a PostgreSQL restored into shop-0 from a database of `scale`:
/// every account is there, pgbench's four sums agree (no transaction torn), pg_amcheck
/// --heapallindexed is clean; then, shut down cleanly (StatefulSet shop scaled to 0),
/// pg_checksums --check finds every page's checksum right. The sums.
pub(crate) async fn consistent(namespace: &TestNamespace, scale: u32) -> String {
    consistent_on(namespace, scale, false).await
}

/// [`consistent`], for a PostgreSQL whose `pg_wal` is on claim template `wal` (`with_wal`).
pub(crate) async fn consistent_on(namespace: &TestNamespace, scale: u32, with_wal: bool) -> String {
    let ns = namespace.name.clone();
    let sums = sql(&ns, "shop-0", PGBENCH_SUMS).await;
    let parts: Vec<&str> = sums.split(' ').collect();
    assert_eq!(parts.len(), 5, "{sums}");
    assert_eq!(
        parts[4],
        (u64::from(scale) * 100_000).to_string(),
        "accounts lost: {sums}"
    );
    assert!(
        parts[0] == parts[1] && parts[1] == parts[2] && parts[2] == parts[3],
        "a torn transaction: accounts, tellers, branches, history sum to {sums}"
    );
    let checked = exec(
        &ns,
        "shop-0",
        &["pg_amcheck", "--heapallindexed", "postgres"],
    );
    assert!(checked.is_ok(), "pg_amcheck: {checked:?}");
    let output = kubectl(&["-n", &ns, "scale", "statefulset/shop", "--replicas=0"]);
    assert!(output.status.success(), "{output:?}");
    let pods: Api<Pod> = namespace.api();
    gone(&pods, "shop-0").await;
    create::<Pod>(
        &pods,
        json!({
            "metadata": {"name": "checksums"},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "check", "image": "localhost/custody/postgres:15",
                    "imagePullPolicy": "Never",
                    "command": ["pg_checksums", "--check", "--pgdata", "/var/lib/postgresql/data/pgdata"],
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": wal_mounts(with_wal),
                }],
                "volumes": wal_volumes(with_wal, "shop"),
            },
        }),
    )
    .await;
    let done = await_condition(
        &pods,
        "checksums",
        "pg_checksums done",
        TIMEOUT,
        |pod: &Pod| {
            matches!(
                pod.status
                    .as_ref()
                    .and_then(|status| status.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        },
    )
    .await;
    let logs = kubectl(&["-n", &ns, "logs", "checksums"]);
    let logs = String::from_utf8_lossy(&logs.stdout).to_string();
    assert_eq!(
        done.status.and_then(|status| status.phase).as_deref(),
        Some("Succeeded"),
        "pg_checksums --check after a clean shutdown: {logs}"
    );
    assert!(logs.contains("Bad checksums:  0"), "{logs}");
    sums
}

/// Issue 24 item 1 on a real node: PostgreSQL with `pg_wal` on a second volume, frozen while
/// four pgbench clients write and a CHECKPOINT runs every second. One Backup holds both
/// volumes (both filesystems frozen before either is read, thawed together); restored into a
/// Cluster of the same two templates, each claim is written and verified against its own
/// manifest, the pod stays held until both are, and PostgreSQL starts on them with the
/// symlink into the other volume intact: every account there, pgbench's sums agree,
/// pg_amcheck and (after a clean shutdown) pg_checksums clean.
#[tokio::test]
async fn on_a_real_node_postgresql_with_its_wal_on_a_second_volume_frozen_under_load_restores_consistent()
 {
    postgres_with_wal(
        "pgwal",
        json!({"method": "Freeze", "maxFreezeSeconds": 120}),
        Capture::Frozen,
    )
    .await;
}

/// The same with method Tool: one run of `pg_basebackup --waldir=/var/lib/postgresql/wal/pg_wal`
/// writes both volumes' trees (the WAL's by the application's path, where the Job mounts that
/// volume's tree), and each is backed up as its volume.
#[tokio::test]
async fn on_a_real_node_postgresql_with_its_wal_on_a_second_volume_backed_up_by_pg_basebackup_restores_consistent()
 {
    postgres_with_wal(
        "pgwaltool",
        json!({
            "method": "Tool",
            "tool": {
                "image": "localhost/custody/postgres:15",
                "command": ["pg_basebackup", "--host=$(CUSTODY_POD_IP)", "--pgdata=$(CUSTODY_OUTPUT)",
                            "--waldir=/var/lib/postgresql/wal/pg_wal",
                            "--wal-method=stream", "--checkpoint=fast", "--no-password"],
                "credentialsSecretRef": {"name": "orders-credentials"},
                "dataPath": "pgdata",
                "scratchSize": "1Gi",
            },
        }),
        Capture::Tool,
    )
    .await;
}

/// PostgreSQL with `pg_wal` on a second volume, backed up under load with `consistency` and
/// restored into a Cluster of the same two templates, checked consistent.
pub(crate) async fn postgres_with_wal(
    name: &str,
    consistency: serde_json::Value,
    capture: Capture,
) {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new(name, capture == Capture::Frozen).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"PGUSER": "postgres", "PGPASSWORD": "a-test-password"}}),
    )
    .await;
    let scale = 10;
    let mut sources = Vec::new();
    for claim in ["data-orders-0", "wal-orders-0"] {
        let source = LoopVolume::new(volume_mib(scale));
        std::os::unix::fs::chown(source.path(), Some(999), Some(999)).unwrap();
        local_volume(&client, node, &ns, claim, source.path()).await;
        sources.push(source);
    }
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": "orders"},
               "spec": {"statefulSetRef": {"name": "orders"},
                        "volumeClaimTemplates": ["data", "wal"],
                        "repositoryRef": {"name": "store"},
                        "consistency": consistency}}),
    )
    .await;
    create::<StatefulSet>(&namespace.api(), postgres_statefulset_with_wal("orders")).await;
    custody_tests::eventually("pgbench -i", TIMEOUT, || {
        let ns = ns.clone();
        async move { exec(&ns, "orders-0", &["pgbench", "-i", "-s", "10", "-q"]) }
    })
    .await;
    exec(&ns, "orders-0", &["pgbench", "-c", "2", "-t", "300", "-n"]).unwrap();
    exec(&ns, "orders-0", &["psql", "-c", "create extension amcheck"]).unwrap();
    // The WAL is on the second volume, by a symlink from the first.
    assert_eq!(
        std::fs::read_link(sources[0].path().join("pgdata/pg_wal")).unwrap(),
        Path::new("/var/lib/postgresql/wal/pg_wal")
    );
    let wal_files = std::fs::read_dir(sources[1].path().join("pg_wal"))
        .unwrap()
        .count();
    assert!(wal_files > 1, "WAL segments on the second volume");

    let load = Load::start(&ns, 60);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    nightly_completed(&namespace).await;
    let backup_took = started.elapsed();
    let (tps, checkpoints) = load.finish().await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(capture), "{status:?}");
    let stall = status.frozen_millis.unwrap_or_default();
    if capture == Capture::Frozen {
        assert!(stall > 0, "the stall is recorded: {status:?}");
    }
    let snapshot = status.artifact.unwrap().snapshot.unwrap();
    assert_eq!(snapshot.volumes, ["data", "wal"]);
    assert_eq!(snapshot.volume_manifests.len(), 2, "{snapshot:?}");
    let wal_bytes = snapshot.volume_manifests[1].total_bytes.unwrap_or_default();
    assert!(wal_bytes > 0, "the WAL volume holds WAL: {snapshot:?}");

    let started = std::time::Instant::now();
    let targets = restore_shop_volumes(
        &client,
        node,
        &namespace,
        "nightly",
        postgres_statefulset_with_wal("shop"),
        volume_mib(scale),
        &["data", "wal"],
    )
    .await;
    sql(&ns, "shop-0", "select 1").await;
    let restore_to_answer = started.elapsed();
    assert_eq!(
        std::fs::read_link(targets[0].path().join("pgdata/pg_wal")).unwrap(),
        Path::new("/var/lib/postgresql/wal/pg_wal")
    );
    let sums = consistent_on(&namespace, scale, true).await;
    eprintln!(
        "postgres with pg_wal on a second volume, {capture:?} under pgbench -c 4 ({tps}; {checkpoints} checkpoints): backup {:.1} s, filesystems frozen {stall} ms, WAL volume {wal_bytes} bytes; restored sums {sums}; restore to answer {:.1} s",
        backup_took.as_secs_f64(),
        restore_to_answer.as_secs_f64()
    );
    namespace.delete().await;
    for claim in ["data-orders-0", "wal-orders-0", "data-shop-0", "wal-shop-0"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{ns}-{claim}"), &Default::default())
            .await;
    }
}

/// Waits until object `name` (a pod, a Cluster, ...) is gone.
pub(crate) async fn gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    custody_tests::eventually(&format!("{name} gone"), TIMEOUT, || {
        let (api, name) = (api.clone(), name.to_string());
        async move {
            match api.get_opt(&name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
}

/// Issue 14, method Tool, the acceptance bar on a real PostgreSQL: while four pgbench clients
/// write and a CHECKPOINT runs every second, the Backup's Job runs PostgreSQL's own
/// `pg_basebackup -F tar -D - -X fetch` (the image and command named in the Cluster's
/// `spec.consistency.tool`, the password from the Secret it names) against the running pod,
/// and custody reads the tar stream it writes (issue 24 item 2: no scratch copy) as the
/// volume, under `pgdata`. Restored through the
/// gate like any volume backup, PostgreSQL starts on it without a manual step, every account
/// is there, pgbench's sums agree, pg_amcheck and (after a clean shutdown) pg_checksums are
/// clean. No write stall: pgbench never waited on a frozen filesystem.
#[tokio::test]
async fn on_a_real_node_postgresql_backed_up_by_pg_basebackup_while_pgbench_writes_restores_consistent()
 {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("pgtool", false).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"PGUSER": "postgres", "PGPASSWORD": "a-test-password"}}),
    )
    .await;
    let scale = 5;
    let _source = postgres_source(
        &client,
        node,
        &namespace,
        Some(json!({
            "method": "Tool",
            "tool": {
                "image": "localhost/custody/postgres:15",
                "command": ["pg_basebackup", "--host=$(CUSTODY_POD_IP)", "--pgdata=-", "--format=tar",
                            "--wal-method=fetch", "--checkpoint=fast", "--no-password"],
                "output": "TarStream",
                "credentialsSecretRef": {"name": "orders-credentials"},
                "dataPath": "pgdata",
            },
        })),
        scale,
    )
    .await;
    // `--wal-method=fetch` (a tar on standard output cannot take streamed WAL) needs the
    // server to keep the WAL written during the copy, through the checkpoints below.
    sql(&ns, "orders-0", "alter system set wal_keep_size = '512MB'").await;
    sql(&ns, "orders-0", "select pg_reload_conf()").await;

    let load = Load::start(&ns, 40);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    nightly_completed(&namespace).await;
    let backup_took = started.elapsed();
    let written_during = sql(&ns, "orders-0", "select count(*) from pgbench_history").await;
    let (tps, checkpoints) = load.finish().await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(Capture::Tool), "{status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Consistent"
                && condition.status == "True"
                && condition.reason == "ApplicationTool"),
        "{:?}",
        status.conditions
    );
    assert_eq!(status.frozen_millis, None, "no write stall");
    // Streamed: the Job had no scratch volume for the data.
    let jobs = kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    let job = jobs
        .items
        .iter()
        .find(|job| {
            job.metadata
                .name
                .as_deref()
                .is_some_and(|name| name.contains("nightly"))
        })
        .expect("the nightly Backup's Job");
    let volumes: Vec<String> = job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .map(|volume| volume.name.clone())
        .collect();
    assert!(volumes.contains(&"tool-stream".to_string()), "{volumes:?}");
    assert!(
        !volumes.iter().any(|name| name.starts_with("tool-output")),
        "{volumes:?}"
    );

    // A stream tool that fails fails the Backup, saying how it ended, and seals nothing.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "broken-stream"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Tool", "tool": {
                   "image": "localhost/custody/postgres:15", "output": "TarStream",
                   "command": ["sh", "-c", "echo cannot reach the database >&2; exit 3"]}}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "broken-stream").await;
    assert_eq!(reason, "ToolFailed", "{message}");
    assert!(
        message.contains("code 3") && message.contains("cannot reach the database"),
        "{message}"
    );

    // A tool that fails fails the Backup, saying how it ended.
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "broken"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Tool", "tool": {
                   "image": "localhost/custody/postgres:15",
                   "command": ["sh", "-c", "echo cannot reach the database >&2; exit 3"]}}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "broken").await;
    assert_eq!(reason, "ToolFailed", "{message}");
    assert!(
        message.contains("code 3") && message.contains("cannot reach the database"),
        "{message}"
    );

    // Issue 24 item 2: a tool writing a tree into scratch space smaller than the claim's data
    // is refused before it runs, naming both sizes (issue 23's tool, which overfilled 8Mi with
    // 24 MiB and was caught after it ran, never starts now: the claim alone takes more).
    let psql = |sql: &str| {
        json!([
            "psql",
            "--host=$(CUSTODY_POD_IP)",
            "--no-password",
            "--no-align",
            "--tuples-only",
            "--variable=FETCH_COUNT=2",
            "--command",
            sql,
            "--output",
            "$(CUSTODY_OUTPUT)/fill"
        ])
    };
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "overfilled"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Tool", "tool": {
                   "image": "localhost/custody/postgres:15",
                   "command": psql("select repeat('x', 1048576) from generate_series(1, 24)"),
                   "credentialsSecretRef": {"name": "orders-credentials"},
                   "scratchSize": "8Mi"}}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "overfilled").await;
    eprintln!("a tool whose scratch space is smaller than the claim's data: {reason}: {message}");
    assert_eq!(reason, "ScratchTooSmall", "{message}");
    assert!(
        message.contains("claim data-orders-0 holds")
            && message.contains(&format!("at most {} bytes", 8u64 << 20))
            && message.contains("the tool was not run"),
        "{message}"
    );

    // A tool that hangs is stopped at its timeoutSeconds, the Backup says so, and the Cluster
    // is free again (the restore below takes its Lease).
    let hung_at = std::time::Instant::now();
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "hung"},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": {"method": "Tool", "tool": {
                   "image": "localhost/custody/postgres:15",
                   "command": ["psql", "--host=$(CUSTODY_POD_IP)", "--no-password", "--command", "select pg_sleep(3600)"],
                   "credentialsSecretRef": {"name": "orders-credentials"},
                   "timeoutSeconds": 5}}}}),
    )
    .await;
    let (reason, message) = backup_fails(&namespace, "hung").await;
    let hung_took = hung_at.elapsed();
    eprintln!(
        "a tool that hangs, timeoutSeconds 5: Failed after {:.1} s: {reason}: {message}",
        hung_took.as_secs_f64()
    );
    assert_eq!(reason, "ToolFailed", "{message}");
    assert!(message.contains("timeoutSeconds (5 s)"), "{message}");
    assert!(
        hung_took < Duration::from_secs(45),
        "a hung tool held the Cluster {hung_took:?}, far past its 5 s bound"
    );

    let (target, restore_to_answer) =
        restore_postgres(&client, node, &namespace, "nightly", scale).await;
    // The restored tree is pg_basebackup's: it leaves its manifest in the directory it wrote.
    assert!(
        target.path().join("pgdata/backup_manifest").exists(),
        "not the tree pg_basebackup wrote"
    );
    let sums = consistent(&namespace, scale).await;
    eprintln!(
        "postgres Tool copy (pg_basebackup) under pgbench -c 4 ({tps}; {checkpoints} checkpoints; {written_during} history rows when the backup ended): Backup created to Completed {:.1} s, artifact {} bytes; restored sums {sums}; restore to answer {:.1} s",
        backup_took.as_secs_f64(),
        status
            .artifact
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default(),
        restore_to_answer.as_secs_f64()
    );
    finish_postgres(&client, namespace).await;
}
